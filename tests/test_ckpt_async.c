/* test_ckpt_async.c: checkpoints written by the saver's thread while training goes on (runtime/ckpt_async.c), on a
 * small model state without a GPU (a stand-in for the executor's snapshot):
 *   - an asynchronous save is byte for byte the save that waits, and a direct cp_ckpt_write, although the "training"
 *     changes the state as soon as the snapshot is taken;
 *   - the writer killed (SIGKILL to a forked child doing an asynchronous save) before any file, in the middle of the
 *     weights, in the middle of the optimizer file, before the folder's rename and before `latest`: resuming from the
 *     out_dir finds the checkpoint before, which loads with its own bits, never the partial one; the next save in
 *     that out_dir succeeds and removes the dead writer's leftovers;
 *   - with one slot, a second save while the first is still being written waits for it and says so; with two (the
 *     plan's ckpt_slots), two saves in a row do not wait, each snapshot goes into its own slot and is finished at
 *     once, a third waits for the first, the folders are byte for byte synchronous saves and `latest` follows the
 *     saves' order; a kill during either slot's write resumes from the newest complete checkpoint;
 *   - a write that fails fails the run at the next step boundary (or the next save) with the reason;
 *   - train.keep_checkpoints removes the oldest complete checkpoints past N, never the one resumed from, nor folders
 *     that are not cpgen's, nor one being written;
 *   - the snapshot's arrays: pageable ones made without a GPU call; pinned ones where nothing can pin them fail
 *     with a message, not a crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "ckpt_async.h"
#include "ckpt_keep.h"
#include "plan.h"
#include "safetensors.h"
#include "snapshot.h"
#include "spec.h"
#include "tmpdir.h"
#include "util.h"
#include "weights.h"

static char err[CP_ERR_MAX];
static char root[128];

#define path_in(...) tmpdir_path(root, __VA_ARGS__)


/* tiny with a vocabulary large enough that its weights file is 3 of the writer's blocks and its optimizer file 6
 * (written by several threads): there is a middle of each to be killed in */
static cp_plan plan;

static int setup(void **state) {
    (void)state;
    if (tmpdir_make(root, sizeof root, "ckpt-async")) return -1;
    const char *sets[] = {"model.vocab=8192", "train.save_every=10"};
    cp_spec s;
    if (cp_spec_load("tiny", sets, 2, &s, err, sizeof err) || cp_plan_build(&s, &plan, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    cp_plan_free(&plan);
    tmpdir_remove(root);
    return 0;
}

/* ---- the training state, and a stand-in for the executor's snapshot */

typedef struct {
    int64_t n;
    float *w, *m, *v;
} state3;

static void state_alloc(state3 *a) {
    a->n = cp_weights_elems(&plan);
    a->w = calloc((size_t)a->n, sizeof(float));
    a->m = calloc((size_t)a->n, sizeof(float));
    a->v = calloc((size_t)a->n, sizeof(float));
}

static void state_free(state3 *a) { free(a->w), free(a->m), free(a->v); }

/* What training leaves after step `step`: a function of the step, so that any checkpoint's bits are known. */
static void state_at(state3 *a, int step) {
    cp_weights_init_random(&plan, (uint64_t)step, 0.02, a->w);
    for (int64_t i = 0; i < a->n; i++) {
        a->m[i] = a->w[i] * 0.125f + (float)step;
        a->v[i] = fabsf(a->w[i]) * 3.f + (float)step;
    }
}

typedef struct {
    state3 live, snap[2];    /* the snapshot's arrays: one per slot */
    int step;                /* the step the live state is at */
    int slots[64];           /* the slot of each start, in order */
    int starts, finishes;
    bool copy_in_finish;     /* the copy is made on the writer's thread (as the host optimizer's memcpy) */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool hold;               /* finish waits until the test lets it go */
    bool holding;            /* finish is waiting */
} fake;

static void copy_state(state3 *dst, const state3 *src) {
    size_t b = sizeof(float) * (size_t)src->n;
    memcpy(dst->w, src->w, b);
    memcpy(dst->m, src->m, b);
    memcpy(dst->v, src->v, b);
}

static int fake_start(void *ctx, int slot, const float **w, const float **m, const float **v, int *updates,
                      double *waited, char *e, int elen) {
    fake *f = ctx;
    if (slot < 0 || slot > 1) return cp_errf(e, elen, "slot %d", slot);
    pthread_mutex_lock(&f->lock);
    f->slots[f->starts++ % 64] = slot;
    pthread_mutex_unlock(&f->lock);
    state3 *s = &f->snap[slot];
    if (!f->copy_in_finish) copy_state(s, &f->live);
    *w = s->w, *m = s->m, *v = s->v;
    *updates = f->step - 1;
    *waited = 0;
    return 0;
}

static int fake_finish(void *ctx, char *e, int elen) {
    (void)e, (void)elen;
    fake *f = ctx;
    pthread_mutex_lock(&f->lock);
    f->holding = true;
    pthread_cond_broadcast(&f->cond);
    while (f->hold) pthread_cond_wait(&f->cond, &f->lock);
    f->holding = false;
    int slot = f->slots[f->finishes % 64];
    pthread_mutex_unlock(&f->lock);
    if (f->copy_in_finish) copy_state(&f->snap[slot], &f->live);
    pthread_mutex_lock(&f->lock);
    f->finishes++;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
    return 0;
}

static void fake_init(fake *f) {
    memset(f, 0, sizeof *f);
    state_alloc(&f->live);
    state_alloc(&f->snap[0]);
    state_alloc(&f->snap[1]);
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->cond, NULL);
}

static void fake_free(fake *f) {
    state_free(&f->live);
    state_free(&f->snap[0]);
    state_free(&f->snap[1]);
    pthread_mutex_destroy(&f->lock);
    pthread_cond_destroy(&f->cond);
}

static void fake_hold(fake *f, bool hold) {
    pthread_mutex_lock(&f->lock);
    f->hold = hold;
    pthread_cond_broadcast(&f->cond);
    pthread_mutex_unlock(&f->lock);
}

static void fake_wait_holding(fake *f) {
    pthread_mutex_lock(&f->lock);
    while (!f->holding) pthread_cond_wait(&f->cond, &f->lock);
    pthread_mutex_unlock(&f->lock);
}

static void state_of(cp_ckpt_state *st, int step) {
    cp_ckpt_state_init(&plan, st);
    st->step = step;
    st->updates = step - 1; /* the source's count replaces it */
    st->skipped = 1;
    st->last_loss = 2.5 + step;
    st->data.sequence = step;
}

/* The plan of the saver (two slots: tiny has room for them), and the same with one. */
static const cp_plan *saver_plan = &plan;

static cp_saver *saver(fake *f, const char *out_dir, bool async, int keep, const char *resumed) {
    cp_saver_opts o = {.plan = saver_plan, .out_dir = out_dir, .writer = true, .async = async, .keep = keep,
                       .resumed = resumed, .src = {.ctx = f, .start = fake_start, .finish = fake_finish}};
    cp_saver *s;
    if (cp_saver_create(&s, &o, err, sizeof err)) fail_msg("%s", err);
    return s;
}

/* Train to `step` and save it; returns the save's info. */
static cp_save_info save_at(cp_saver *s, fake *f, int step) {
    f->step = step;
    state_at(&f->live, step);
    cp_ckpt_state st;
    state_of(&st, step);
    cp_save_info info;
    if (cp_saver_save(s, &st, &info, err, sizeof err)) fail_msg("%s", err);
    return info;
}

static void wait_written(cp_saver *s, int step) {
    char line[1024];
    cp_saver_wait(s);
    int rc = cp_saver_poll(s, line, sizeof line, err, sizeof err);
    if (rc < 0) fail_msg("%s", err);
    assert_int_equal(rc, 1);
    char want[32];
    snprintf(want, sizeof want, "ckpt_%d written: ", step);
    if (!strstr(line, want)) fail_msg("line \"%s\" lacks \"%s\"", line, want);
    printf("    %s\n", line);
}

static char *slurp(const char *path, size_t *n) {
    char *t = cp_read_file(path, n);
    if (!t) fail_msg("%s: %s", path, strerror(errno));
    return t;
}

/* Every file of checkpoint folder a is in b with the same bytes, and b has no other. */
static void same_folder(const char *a, const char *b) {
    DIR *d = opendir(a);
    assert_non_null(d);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char pa[1200], pb[1200];
        snprintf(pa, sizeof pa, "%s/%s", a, e->d_name);
        snprintf(pb, sizeof pb, "%s/%s", b, e->d_name);
        size_t na, nb;
        char *x = slurp(pa, &na), *y = slurp(pb, &nb);
        if (na != nb || memcmp(x, y, na)) fail_msg("%s and %s differ", pa, pb);
        free(x), free(y);
        files++;
    }
    closedir(d);
    d = opendir(b);
    int other = 0;
    while ((e = readdir(d))) other += e->d_name[0] != '.';
    closedir(d);
    assert_int_equal(files, other);
    assert_true(files >= 4); /* weights, config.json, optimizer, trainer state */
}

/* The checkpoint resuming from out_dir takes: its step, and its bits against the state of that step. */
static int resumed_step(const char *out_dir, bool check_bits) {
    cp_ckpt ck;
    if (cp_ckpt_open(&plan, out_dir, &ck, err, sizeof err)) fail_msg("resuming from %s: %s", out_dir, err);
    int step = ck.state.step;
    if (check_bits) {
        state3 want, got;
        state_alloc(&want);
        state_alloc(&got);
        state_at(&want, step);
        if (cp_ckpt_load_weights(&plan, &ck, got.w, err, sizeof err) ||
            cp_ckpt_load_moment(&plan, &ck, false, got.m, err, sizeof err) ||
            cp_ckpt_load_moment(&plan, &ck, true, got.v, err, sizeof err))
            fail_msg("%s", err);
        assert_memory_equal(got.w, want.w, sizeof(float) * (size_t)want.n);
        assert_memory_equal(got.m, want.m, sizeof(float) * (size_t)want.n);
        assert_memory_equal(got.v, want.v, sizeof(float) * (size_t)want.n);
        assert_int_equal(ck.state.updates, step - 1);
        state_free(&want);
        state_free(&got);
    }
    cp_ckpt_close(&ck);
    return step;
}

/* ------------------------------------------------------------------------------------------------------------ */

static void test_async_is_sync(void **state) {
    (void)state;
    for (int copy_in_finish = 0; copy_in_finish <= 1; copy_in_finish++) {
        fake f;
        fake_init(&f);
        f.copy_in_finish = copy_in_finish;
        /* the save that waits */
        cp_saver *s = saver(&f, path_in("sync%d", copy_in_finish), false, 0, NULL);
        save_at(s, &f, 7);
        assert_int_equal(cp_saver_busy(s), 0); /* written when save returned */
        wait_written(s, 7);
        cp_saver_destroy(s);
        /* the asynchronous one: the writer held before it reads the snapshot while "training" moves on: what it
         * writes must be the state of step 7 all the same */
        s = saver(&f, path_in("async%d", copy_in_finish), true, 0, NULL);
        fake_hold(&f, true);
        save_at(s, &f, 7);
        fake_wait_holding(&f);
        assert_int_equal(cp_saver_busy(s), 7);
        if (!copy_in_finish) state_at(&f.live, 8); /* the next step's update, which the snapshot must not see */
        fake_hold(&f, false);
        wait_written(s, 7);
        cp_saver_destroy(s);
        same_folder(path_in("sync%d/ckpt_7", copy_in_finish), path_in("async%d/ckpt_7", copy_in_finish));
        /* and the save before this work, a direct cp_ckpt_write of the same state */
        state3 a;
        state_alloc(&a);
        state_at(&a, 7);
        cp_ckpt_state st;
        state_of(&st, 7);
        st.updates = 6;
        if (cp_ckpt_write(&plan, path_in("direct%d", copy_in_finish), &st, a.w, a.m, a.v, NULL, NULL, NULL, 0, err,
                          sizeof err))
            fail_msg("%s", err);
        same_folder(path_in("direct%d/ckpt_7", copy_in_finish), path_in("async%d/ckpt_7", copy_in_finish));
        assert_int_equal(resumed_step(path_in("async%d", copy_in_finish), true), 7);
        state_free(&a);
        fake_free(&f);
    }
}

/* ---- the writer killed at points of its write */

typedef enum { K_BEFORE_FILES, K_MID_WEIGHTS, K_MID_OPTIMIZER, K_BEFORE_RENAME, K_BEFORE_LATEST, K_COUNT } kill_point;
static const char *const KILL_NAMES[K_COUNT] = {"before any file", "mid weights", "mid optimizer",
                                                "before the folder rename", "before latest"};
static kill_point child_point;
static int child_pipe = -1;

/* In the child: tell the parent it is at the point, then wait to be killed. */
static void at_point(void) {
    char c = 'k';
    ssize_t w = write(child_pipe, &c, 1);
    (void)w;
    for (;;) pause();
}

static void child_block(const char *tmp, int64_t block, int64_t nblocks) {
    const char *want = child_point == K_MID_WEIGHTS ? "/" CP_ST_SINGLE_NAME ".tmp." : "/" CP_CKPT_OPTIM_NAME ".tmp.";
    if ((child_point == K_MID_WEIGHTS || child_point == K_MID_OPTIMIZER) && strstr(tmp, want) && strstr(tmp, "ckpt_20.") &&
        block == 0 && nblocks > 1)
        at_point();
}

static int child_hook(void *ctx, const char *dir, const char *piece) {
    (void)ctx;
    if (!strstr(dir, "ckpt_20")) return 0;
    if (child_point == K_BEFORE_RENAME && !strcmp(piece, CP_CKPT_STATE_NAME)) at_point();
    if (child_point == K_BEFORE_LATEST && !strcmp(piece, CP_CKPT_LATEST_NAME)) at_point();
    return 0;
}

static int child_finish(void *ctx, char *e, int elen) {
    fake *f = ctx;
    if (child_point == K_BEFORE_FILES && f->step == 20) at_point();
    return fake_finish(ctx, e, elen);
}

/* The child: ckpt_10 written, then an asynchronous save of ckpt_20 that stops at the point, where it is killed. */
static void child_run(const char *out_dir, kill_point point, int fd) {
    child_point = point;
    child_pipe = fd;
    fake f;
    fake_init(&f);
    cp_saver_opts o = {.plan = &plan, .out_dir = out_dir, .writer = true, .async = true,
                       .src = {.ctx = &f, .start = fake_start, .finish = child_finish}, .hook = child_hook};
    cp_saver *s;
    if (cp_saver_create(&s, &o, err, sizeof err)) _exit(3);
    save_at(s, &f, 10);
    char line[512];
    cp_saver_wait(s);
    if (cp_saver_poll(s, line, sizeof line, err, sizeof err) != 1) _exit(4);
    cp_st_block_hook = child_block;
    save_at(s, &f, 20);
    /* "training" goes on while the writer works, until the kill */
    for (int k = 21;; k++) state_at(&f.live, k);
}

static void test_writer_killed(void **state) {
    (void)state;
    for (int p = 0; p < K_COUNT; p++) {
        char *out = path_in("killed%d", p);
        int pfd[2];
        assert_int_equal(pipe(pfd), 0);
        fflush(stdout);
        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0) {
            close(pfd[0]);
            child_run(out, (kill_point)p, pfd[1]);
            _exit(5);
        }
        close(pfd[1]);
        char c = 0;
        ssize_t got = read(pfd[0], &c, 1);
        close(pfd[0]);
        kill(child, SIGKILL);
        int st;
        waitpid(child, &st, 0);
        if (got != 1) fail_msg("%s: the child did not reach the point (status 0x%x)", KILL_NAMES[p], st);
        assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
        char *tmp = path_in("killed%d/ckpt_20.tmp.%ld", p, (long)child);
        printf("    killed %s: ckpt_20 %s, %s %s\n", KILL_NAMES[p], path_exists(path_in("killed%d/ckpt_20", p)) ?
               "complete" : "absent", tmp, path_exists(tmp) ? "left" : "absent");
        /* what is on disk is what the point says */
        assert_int_equal(path_exists(tmp), p == K_MID_WEIGHTS || p == K_MID_OPTIMIZER || p == K_BEFORE_RENAME);
        assert_int_equal(path_exists(path_in("killed%d/ckpt_20", p)), p == K_BEFORE_LATEST);
        /* resuming from the out_dir: ckpt_10 with its own bits; a partial folder is refused */
        assert_int_equal(resumed_step(out, true), 10);
        if (path_exists(tmp)) {
            cp_ckpt ck;
            assert_int_equal(cp_ckpt_open(&plan, tmp, &ck, err, sizeof err), -1);
            printf("    refused: %s\n", err);
        }
        /* the run resumed from there saves ckpt_20 again: it takes the dead writer's place */
        fake f;
        fake_init(&f);
        cp_saver *s = saver(&f, out, true, 0, NULL);
        save_at(s, &f, 20);
        wait_written(s, 20);
        cp_saver_destroy(s);
        fake_free(&f);
        assert_false(path_exists(tmp));
        assert_int_equal(resumed_step(out, true), 20);
    }
    cp_st_block_hook = NULL;
}

/* ---- a second save while the first is written, and a write that fails */

static void *release_later(void *arg) {
    fake *f = arg;
    struct timespec t = {0, 300 * 1000 * 1000};
    nanosleep(&t, NULL);
    fake_hold(f, false);
    return NULL;
}

static void test_second_save_waits(void **state) {
    (void)state;
    fake f;
    fake_init(&f);
    cp_plan one = plan; /* the plan of a host with room for one snapshot */
    one.ckpt_slots = 1;
    saver_plan = &one;
    cp_saver *s = saver(&f, path_in("twice"), true, 0, NULL);
    saver_plan = &plan;
    fake_hold(&f, true);
    cp_save_info a = save_at(s, &f, 1);
    assert_int_equal(a.waited_for, 0);
    assert_true(a.held < 0.25); /* the snapshot only: the write goes on */
    fake_wait_holding(&f);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, release_later, &f), 0);
    cp_save_info b = save_at(s, &f, 2); /* waits for ckpt_1's write, held 0.3 s */
    pthread_join(th, NULL);
    assert_int_equal(b.waited_for, 1);
    assert_true(b.waited >= 0.25 && b.held >= b.waited);
    char note[256];
    cp_save_info_note(&b, 1.0, note, sizeof note);
    printf("    %s\n", note);
    assert_non_null(strstr(note, "ckpt_2: training held "));
    assert_non_null(strstr(note, "s for ckpt_1 to be written"));
    /* both writes done before anyone looks: ckpt_1's line is still there, then ckpt_2's, in that order */
    char line[1024];
    cp_saver_wait(s);
    assert_int_equal(cp_saver_poll(s, line, sizeof line, err, sizeof err), 1);
    assert_non_null(strstr(line, "ckpt_1 written: "));
    assert_non_null(strstr(line, "GB/s"));
    assert_int_equal(cp_saver_poll(s, line, sizeof line, err, sizeof err), 1);
    assert_non_null(strstr(line, "ckpt_2 written: "));
    assert_int_equal(cp_saver_poll(s, line, sizeof line, err, sizeof err), 0); /* nothing more */
    cp_saver_destroy(s);
    assert_int_equal(resumed_step(path_in("twice"), true), 2);
    fake_free(&f);
}

static void test_write_fails(void **state) {
    (void)state;
    fake f;
    fake_init(&f);
    assert_int_equal(cp_mkdir_p(path_in("fails")), 0);
    FILE *x = fopen(path_in("fails/ckpt_2"), "w"); /* a file of the user's where ckpt_2 goes */
    assert_non_null(x);
    fclose(x);
    cp_saver *s = saver(&f, path_in("fails"), true, 0, NULL);
    save_at(s, &f, 1);
    wait_written(s, 1);
    save_at(s, &f, 2); /* handed over: the failure comes later */
    char line[512];
    cp_saver_wait(s);
    assert_int_equal(cp_saver_poll(s, line, sizeof line, err, sizeof err), -1);
    printf("    failed: %s\n", err);
    assert_non_null(strstr(err, "writing ckpt_2 failed: "));
    assert_non_null(strstr(err, "ckpt_2 exists and is not a checkpoint cpgen saved"));
    assert_non_null(strstr(err, "the newest complete checkpoint is the one before it"));
    /* not looked at before the next save: that save fails with it, before another snapshot */
    save_at(s, &f, 3);
    cp_saver_wait(s);
    assert_int_equal(cp_saver_poll(s, line, sizeof line, err, sizeof err), 1); /* ckpt_3 is fine */
    unlink(path_in("fails/ckpt_2"));
    x = fopen(path_in("fails/ckpt_4"), "w");
    fclose(x);
    save_at(s, &f, 4);
    while (cp_saver_busy(s)) {
        struct timespec t = {0, 10 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    f.step = 5;
    cp_ckpt_state st;
    state_of(&st, 5);
    cp_save_info info;
    assert_int_equal(cp_saver_save(s, &st, &info, err, sizeof err), -1);
    assert_non_null(strstr(err, "writing ckpt_4 failed: "));
    assert_int_equal(resumed_step(path_in("fails"), true), 3);
    cp_saver_destroy(s);
    fake_free(&f);
}

/* ---- two slots: a slow writer, two saves in a row, a third */

/* The writer held after the weights of ckpt_<gate_step> (the optimizer file still to come from the slot's arrays),
 * until released; and the order in which `latest` names the folders. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int gate_step;
    bool holding;
    char latest[256];
} gate;

static gate G = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, false, ""};

static void gate_set(int step) {
    pthread_mutex_lock(&G.lock);
    G.gate_step = step;
    pthread_cond_broadcast(&G.cond);
    pthread_mutex_unlock(&G.lock);
}

static int gate_hook(void *ctx, const char *dir, const char *piece) {
    (void)ctx;
    char name[32];
    pthread_mutex_lock(&G.lock);
    if (!strcmp(piece, CP_CKPT_LATEST_NAME)) { /* dir is the final folder: its name goes on the list */
        const char *slash = strrchr(dir, '/');
        size_t at = strlen(G.latest);
        snprintf(G.latest + at, sizeof G.latest - at, "%s%s", at ? " " : "", slash ? slash + 1 : dir);
    }
    snprintf(name, sizeof name, "/ckpt_%d.tmp.", G.gate_step);
    if (!strcmp(piece, CP_ST_SINGLE_NAME) && G.gate_step && strstr(dir, name)) {
        G.holding = true;
        pthread_cond_broadcast(&G.cond);
        while (G.gate_step && strstr(dir, name)) pthread_cond_wait(&G.cond, &G.lock);
        G.holding = false;
    }
    pthread_mutex_unlock(&G.lock);
    return 0;
}

static void *gate_open_later(void *arg) {
    double s = *(double *)arg;
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&t, NULL);
    gate_set(0);
    return NULL;
}

static void test_two_slots(void **state) {
    (void)state;
    assert_int_equal(plan.ckpt_slots, 2); /* tiny on the default host: room for two */
    fake f;
    fake_init(&f);
    G.latest[0] = 0;
    gate_set(1);
    cp_saver_opts o = {.plan = &plan, .out_dir = path_in("slots"), .writer = true, .async = true,
                       .src = {.ctx = &f, .start = fake_start, .finish = fake_finish}, .hook = gate_hook};
    cp_saver *s;
    if (cp_saver_create(&s, &o, err, sizeof err)) fail_msg("%s", err);
    /* the safety: without a second slot, the second save would wait for ckpt_1 forever; opened after 1.5 s */
    double later = 1.5;
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, gate_open_later, &later), 0);
    cp_save_info a = save_at(s, &f, 1);
    pthread_mutex_lock(&G.lock);
    while (!G.holding && G.gate_step) pthread_cond_wait(&G.cond, &G.lock);
    pthread_mutex_unlock(&G.lock);
    /* ckpt_1 is being written (held after its weights): the second save takes the other slot, no wait */
    cp_save_info b = save_at(s, &f, 2);
    printf("    ckpt_1 held %.1f ms, ckpt_2 held %.1f ms (waited %.3f s for ckpt_%d)\n", a.held * 1e3, b.held * 1e3,
           b.waited, b.waited_for);
    assert_int_equal(a.waited_for, 0);
    assert_int_equal(b.waited_for, 0);
    assert_true(b.held < 0.5 && b.waited == 0);
    assert_int_equal(cp_saver_busy(s), 2); /* the newest still to be written */
    /* ckpt_2's snapshot is finished at once, not behind ckpt_1's write */
    pthread_mutex_lock(&f.lock);
    while (f.finishes < 2) pthread_cond_wait(&f.cond, &f.lock);
    pthread_mutex_unlock(&f.lock);
    pthread_mutex_lock(&G.lock);
    assert_true(G.holding); /* ckpt_1 still held */
    pthread_mutex_unlock(&G.lock);
    assert_int_equal(f.slots[0], 0);
    assert_int_equal(f.slots[1], 1);
    /* a third save while both are being written waits for the first, and takes its slot */
    cp_save_info c = save_at(s, &f, 3);
    pthread_join(th, NULL);
    char note[256];
    cp_save_info_note(&c, 1.0, note, sizeof note);
    printf("    %s\n", note);
    assert_int_equal(c.waited_for, 1);
    assert_true(c.waited >= 0.5 && c.held >= c.waited);
    assert_non_null(strstr(note, "s for ckpt_1 to be written"));
    assert_int_equal(f.slots[2], 0);
    /* written in order, reported in order, `latest` moved forward one by one */
    char line[1024];
    cp_saver_wait(s);
    for (int step = 1; step <= 3; step++) {
        assert_int_equal(cp_saver_poll(s, line, sizeof line, err, sizeof err), 1);
        char want[32];
        snprintf(want, sizeof want, "ckpt_%d written: ", step);
        if (!strstr(line, want)) fail_msg("line \"%s\" lacks \"%s\"", line, want);
    }
    assert_int_equal(cp_saver_poll(s, line, sizeof line, err, sizeof err), 0);
    cp_saver_destroy(s);
    printf("    latest named: %s\n", G.latest);
    assert_string_equal(G.latest, "ckpt_1 ckpt_2 ckpt_3");
    assert_int_equal(resumed_step(path_in("slots"), true), 3);
    /* each folder byte for byte the synchronous save of its step: ckpt_1's optimizer file, written after ckpt_2's
     * snapshot was taken, is still step 1's */
    state3 x;
    state_alloc(&x);
    for (int step = 1; step <= 3; step++) {
        state_at(&x, step);
        cp_ckpt_state st;
        state_of(&st, step);
        st.updates = step - 1;
        if (cp_ckpt_write(&plan, path_in("slots_sync"), &st, x.w, x.m, x.v, NULL, NULL, NULL, 0, err, sizeof err))
            fail_msg("%s", err);
        same_folder(path_in("slots_sync/ckpt_%d", step), path_in("slots/ckpt_%d", step));
    }
    state_free(&x);
    fake_free(&f);
}

/* Killed while both slots are in flight: in the middle of the first's weights (the second queued), or of the
 * second's (the first complete). Resuming takes the newest complete checkpoint. */
static const char *kill_in;

static void slots_block(const char *tmp, int64_t block, int64_t nblocks) {
    if (strstr(tmp, kill_in) && strstr(tmp, "/" CP_ST_SINGLE_NAME ".tmp.") && block == 0 && nblocks > 1) at_point();
}

static void test_two_slots_killed(void **state) {
    (void)state;
    const char *where[2] = {"/ckpt_20.tmp.", "/ckpt_30.tmp."};
    const int newest[2] = {10, 20};
    for (int p = 0; p < 2; p++) {
        char *out = path_in("slots_killed%d", p);
        int pfd[2];
        assert_int_equal(pipe(pfd), 0);
        fflush(stdout);
        pid_t child = fork();
        assert_true(child >= 0);
        if (child == 0) {
            close(pfd[0]);
            child_pipe = pfd[1];
            kill_in = where[p];
            fake f;
            fake_init(&f);
            cp_saver *s = saver(&f, out, true, 0, NULL);
            save_at(s, &f, 10);
            cp_saver_wait(s);
            cp_st_block_hook = slots_block;
            save_at(s, &f, 20);
            if (save_at(s, &f, 30).waited_for) _exit(6); /* a free slot: no wait */
            for (int k = 31;; k++) state_at(&f.live, k);
        }
        close(pfd[1]);
        char c = 0;
        ssize_t got = read(pfd[0], &c, 1);
        close(pfd[0]);
        kill(child, SIGKILL);
        int st;
        waitpid(child, &st, 0);
        if (got != 1) fail_msg("%s: the child did not reach the point (status 0x%x)", where[p], st);
        printf("    killed in %s: ckpt_20 %s, ckpt_30 %s\n", where[p],
               path_exists(path_in("slots_killed%d/ckpt_20", p)) ? "complete" : "absent",
               path_exists(path_in("slots_killed%d/ckpt_30", p)) ? "complete" : "absent");
        assert_int_equal(path_exists(path_in("slots_killed%d/ckpt_20", p)), p == 1);
        assert_false(path_exists(path_in("slots_killed%d/ckpt_30", p)));
        assert_int_equal(resumed_step(out, true), newest[p]);
    }
}

/* ---- keep_checkpoints */

static int count_ckpts(const char *dir, char *names, size_t n) {
    DIR *d = opendir(dir);
    int k = 0;
    struct dirent *e;
    int steps[64], ns = 0;
    while ((e = readdir(d))) {
        int step, used = 0;
        if (sscanf(e->d_name, "ckpt_%d%n", &step, &used) == 1 && !e->d_name[used] && ns < 64) steps[ns++] = step;
    }
    closedir(d);
    for (int a = 1; a < ns; a++)
        for (int b = a; b > 0 && steps[b - 1] > steps[b]; b--) {
            int t = steps[b];
            steps[b] = steps[b - 1];
            steps[b - 1] = t;
        }
    names[0] = 0;
    for (int a = 0; a < ns; a++) {
        size_t at = strlen(names);
        snprintf(names + at, n - at, "%s%d", a ? " " : "", steps[a]);
        k++;
    }
    return k;
}

static void test_keep(void **state) {
    (void)state;
    fake f;
    fake_init(&f);
    char *out = path_in("keep");
    cp_saver *s = saver(&f, out, true, 0, NULL);
    for (int step = 5; step <= 15; step += 5) {
        save_at(s, &f, step);
        wait_written(s, step);
    }
    cp_saver_destroy(s);
    /* beside them: a folder of the user's that looks like a checkpoint, a file, a save in progress of a live
     * process (this one) */
    assert_int_equal(cp_mkdir_p(path_in("keep/ckpt_1")), 0);
    FILE *x = fopen(path_in("keep/ckpt_1/notes.txt"), "w");
    fclose(x);
    x = fopen(path_in("keep/ckpt_2"), "w");
    fclose(x);
    assert_int_equal(cp_mkdir_p(path_in("keep/ckpt_3.tmp.%ld", (long)getpid())), 0);
    /* resumed from ckpt_5, keeping 2: each save leaves the newest two and ckpt_5 */
    s = saver(&f, out, true, 2, path_in("keep/ckpt_5"));
    char names[256];
    save_at(s, &f, 20);
    wait_written(s, 20);
    count_ckpts(out, names, sizeof names);
    assert_string_equal(names, "1 2 5 15 20");
    save_at(s, &f, 25);
    wait_written(s, 25);
    count_ckpts(out, names, sizeof names);
    assert_string_equal(names, "1 2 5 20 25");
    cp_saver_destroy(s);
    assert_true(path_exists(path_in("keep/ckpt_1/notes.txt")));
    assert_true(path_exists(path_in("keep/ckpt_3.tmp.%ld", (long)getpid())));
    assert_int_equal(resumed_step(path_in("keep/ckpt_5"), true), 5);
    assert_int_equal(resumed_step(out, true), 25);
    /* keep 1 straight away: the newest by step stays, and so does the one just written (ckpt_20 here) */
    char removed[256];
    assert_int_equal(cp_ckpt_keep(out, 1, path_in("keep/ckpt_20"), NULL, removed, sizeof removed), 1);
    printf("    removed %s\n", removed);
    assert_string_equal(removed, "ckpt_5");
    count_ckpts(out, names, sizeof names);
    assert_string_equal(names, "1 2 20 25");
    /* keep 0 keeps everything */
    assert_int_equal(cp_ckpt_keep(out, 0, NULL, NULL, removed, sizeof removed), 0);
    fake_free(&f);
}

/* ---- the snapshot's arrays (runtime/snapshot.c) */

static void test_snapshot_arrays(void **state) {
    (void)state;
    /* one GPU with the optimizer on the host: pageable arrays, made resident in the background, no staging and no
     * GPU call at all */
    cp_spec s;
    const char *sets[] = {"train.save_every=10", "parallel.optimizer=host"};
    if (cp_spec_load("tiny", sets, 2, &s, err, sizeof err)) fail_msg("%s", err);
    cp_plan p;
    if (cp_plan_build(&s, &p, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(p.ckpt_snap, CP_SNAP_PAGEABLE);
    cp_snapbuf *b;
    if (cp_snapbuf_create(&b, &p, 0, err, sizeof err)) fail_msg("%s", err);
    cp_exec_snap d;
    double waited = -1;
    char note[512];
    if (cp_snapbuf_get(b, 0, &d, &waited, note, sizeof note, err, sizeof err)) fail_msg("%s", err);
    assert_true(waited >= 0);
    assert_false(d.pinned);
    assert_null(d.staging);
    assert_string_equal(note, "");
    int64_t n = cp_weights_elems(&p);
    assert_true(d.w && d.m && d.v && d.w != d.m && d.m != d.v);
    d.w[0] = d.m[n - 1] = d.v[n / 2] = 1.5f; /* every array writable end to end, and zero where untouched */
    assert_true(d.w[n - 1] == 0 && d.m[0] == 0 && d.v[n / 2] == 1.5f);
    /* the plan's second slot: three arrays of its own; no third */
    assert_int_equal(p.ckpt_slots, 2);
    cp_exec_snap d1;
    if (cp_snapbuf_get(b, 1, &d1, &waited, note, sizeof note, err, sizeof err)) fail_msg("%s", err);
    float *six[6] = {d.w, d.m, d.v, d1.w, d1.m, d1.v};
    for (int i = 0; i < 6; i++)
        for (int j = i + 1; j < 6; j++) assert_true(six[i] + n <= six[j] || six[j] + n <= six[i]);
    d1.w[n - 1] = d1.v[0] = 2.5f;
    assert_true(d.w[n - 1] == 0 && d.v[0] == 0 && d1.m[0] == 0);
    assert_int_equal(cp_snapbuf_get(b, 2, &d1, &waited, note, sizeof note, err, sizeof err), -1);
    cp_snapbuf_destroy(b);
    cp_plan_free(&p);
    /* pinned arrays where no GPU can pin them: a message naming what failed, no crash */
    const char *sets2[] = {"train.save_every=10"};
    if (cp_spec_load("tiny", sets2, 1, &s, err, sizeof err)) fail_msg("%s", err);
    if (cp_plan_build(&s, &p, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(p.ckpt_snap, CP_SNAP_PINNED);
    if (cp_snapbuf_create(&b, &p, 0, err, sizeof err)) fail_msg("%s", err);
    int rc = cp_snapbuf_get(b, 0, &d, &waited, note, sizeof note, err, sizeof err);
    printf("    without a GPU: %s | %s\n", note, rc ? err : "(pinned)");
    if (rc) {
        assert_non_null(strstr(note, "pinning the checkpoint's snapshot failed"));
        assert_non_null(strstr(err, "pinning the staging buffer of a checkpoint's snapshot"));
    }
    cp_snapbuf_destroy(b);
    cp_plan_free(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_is_sync),   cmocka_unit_test(test_writer_killed),
        cmocka_unit_test(test_second_save_waits), cmocka_unit_test(test_two_slots),
        cmocka_unit_test(test_two_slots_killed), cmocka_unit_test(test_write_fails),
        cmocka_unit_test(test_keep),             cmocka_unit_test(test_snapshot_arrays),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
