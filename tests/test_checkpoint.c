/* test_checkpoint.c: training checkpoints (runtime/checkpoint.c) without a GPU: trainer_state.json round trips
 * exactly and refuses damaged text; the folder write is atomic (while it runs only the .tmp folder exists, a crash
 * leaves no final-named folder and `latest` unchanged, a failed rename cleans up); weights and AdamW moments round
 * trip bit-exactly through safetensors with the weights' Hugging Face name mapping (tiny, permuted query heads on 2
 * GPUs, hidden 200 padded on 2 GPUs); and incomplete, corrupt or mismatched checkpoints are refused with messages
 * that say what is wrong and what to do. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "checkpoint.h"
#include "json.h"
#include "plan.h"
#include "safetensors.h"
#include "spec.h"
#include "tmpdir.h"
#include "util.h"
#include "weights.h"

static char err[CP_ERR_MAX];
static char root[256]; /* a fresh temporary folder per run */

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}
static void rm_rf(const char *p) { nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

#define path_in(...) tmpdir_path(root, __VA_ARGS__)


static void expect_contains(const char *msg, const char *frag) {
    if (!strstr(msg, frag)) fail_msg("message lacks \"%s\": %s", frag, msg);
}

static void plan_of(cp_plan *p, int nsets, ...) {
    const char *sets[16];
    va_list ap;
    va_start(ap, nsets);
    for (int k = 0; k < nsets; k++) sets[k] = va_arg(ap, const char *);
    va_end(ap);
    cp_spec s;
    if (cp_spec_load("tiny", sets, nsets, &s, err, sizeof err)) fail_msg("spec: %s", err);
    if (cp_plan_build(&s, p, err, sizeof err)) fail_msg("plan: %s", err);
}

static uint64_t rng = 99;
static double urand(void) { /* [-1, 1) */
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}

/* Weights and moments as training leaves them: values in every tensor element (some large, some tiny), padding 0,
 * the second moment non-negative. */
typedef struct {
    int64_t n;
    float *w, *m, *v;
} arrays;

static void make_arrays(const cp_plan *p, arrays *a) {
    a->n = cp_weights_elems(p);
    a->w = calloc((size_t)a->n, sizeof(float));
    a->m = calloc((size_t)a->n, sizeof(float));
    a->v = calloc((size_t)a->n, sizeof(float));
    cp_weights_init_random(p, 7, 0.5, a->w);
    cp_hf_tensor t[128];
    int nt = cp_weights_hf_tensors(p, t, 128);
    assert_true(nt <= 128);
    for (int k = 0; k < nt; k++) {
        int64_t e = t[k].ndim == 2 ? t[k].shape[0] * t[k].shape[1] : t[k].shape[0];
        for (int64_t i = 0; i < e; i++) {
            double u = urand();
            a->m[t[k].off + i] = (float)(i % 89 == 5 ? u * 1e30 : i % 97 == 3 ? u * 1e-40 : u * 1e-3);
            a->v[t[k].off + i] = (float)(fabs(urand()) * (i % 83 == 1 ? 1e20 : 1e-6));
            if (i % 101 == 7) a->w[t[k].off + i] = (float)(u * 1e30);
        }
    }
}

static void free_arrays(arrays *a) { free(a->w), free(a->m), free(a->v); }

static void state_of(const cp_plan *p, cp_ckpt_state *st, int step) {
    cp_ckpt_state_init(p, st);
    st->step = step;
    st->skipped = step > 2 ? 1 : 0;
    st->updates = step - st->skipped;
    st->last_loss = 4.123456789012345;
    st->data.sequence = step;
}

static void write_ckpt(const cp_plan *p, const char *out_dir, int step, const arrays *a) {
    cp_ckpt_state st;
    state_of(p, &st, step);
    if (cp_ckpt_write(p, out_dir, &st, a->w, a->m, a->v, NULL, NULL, NULL, 0, err, sizeof err)) fail_msg("%s", err);
}

static char *read_text(const char *path) {
    size_t n;
    char *t = cp_read_file(path, &n);
    if (!t) fail_msg("%s: %s", path, strerror(errno));
    return t;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* cp_ckpt_open must fail, and the message hold every fragment given. */
static void expect_open_fails(const cp_plan *p, const char *dir, int nfrag, ...) {
    cp_ckpt ck;
    if (cp_ckpt_open(p, dir, &ck, err, sizeof err) == 0) {
        cp_ckpt_close(&ck);
        fail_msg("%s opened but should not have", dir);
    }
    va_list ap;
    va_start(ap, nfrag);
    for (int k = 0; k < nfrag; k++) expect_contains(err, va_arg(ap, const char *));
    va_end(ap);
    printf("    refused: %s\n", err);
}

/* ------------------------------------------------------------------------------------------------------------ */

static bool same_bits(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

static void expect_state_equal(const cp_ckpt_state *a, const cp_ckpt_state *b) {
    assert_int_equal(a->format, b->format);
    assert_string_equal(a->version, b->version);
    assert_string_equal(a->spec, b->spec);
    assert_true(a->shape_hash == b->shape_hash);
    assert_memory_equal(&a->model, &b->model, sizeof a->model);
    assert_int_equal(a->step, b->step);
    assert_int_equal(a->updates, b->updates);
    assert_int_equal(a->skipped, b->skipped);
    assert_true(same_bits(a->last_loss, b->last_loss) || (isnan(a->last_loss) && isnan(b->last_loss)));
    assert_string_equal(a->data_source, b->data_source);
    assert_memory_equal(&a->data, &b->data, sizeof a->data);
    assert_true(a->data_seed == b->data_seed);
    assert_int_equal(a->seqs_per_step, b->seqs_per_step);
    assert_memory_equal(&a->layout, &b->layout, sizeof a->layout);
    const cp_train *x = &a->train, *y = &b->train;
    assert_int_equal(x->steps, y->steps);
    assert_int_equal(x->micro_batches, y->micro_batches);
    assert_int_equal(x->seq_len, y->seq_len);
    assert_int_equal(x->warmup, y->warmup);
    assert_true(same_bits(x->lr, y->lr) && same_bits(x->min_lr, y->min_lr) && same_bits(x->beta1, y->beta1) &&
                same_bits(x->beta2, y->beta2) && same_bits(x->eps, y->eps) &&
                same_bits(x->weight_decay, y->weight_decay) && same_bits(x->clip, y->clip));
}

static void test_state_roundtrip(void **state) {
    (void)state;
    cp_plan p, q, r;
    plan_of(&p, 0);
    plan_of(&q, 4, "model.family=qwen3", "model.qk_norm=true", "model.tie_embeddings=true", "train.lr=1.2345678901e-4");
    /* a layout with every field away from one GPU's: what a resume on another layout compares with */
    plan_of(&r, 9, "parallel.gpus=2", "parallel.ring=2", "parallel.replicas=3", "machine.ranks_per_gpu=4",
            "parallel.upipe_heads=2", "parallel.optimizer=host", "parallel.offload=all",
            "parallel.attention_output=host", "train.micro_batches=5");
    cp_ckpt_state rs;
    state_of(&r, &rs, 1);
    const cp_ckpt_layout *l = &rs.layout;
    assert_true(l->known);
    assert_int_equal(l->gpus, 2), assert_int_equal(l->ring, 2), assert_int_equal(l->replicas, 3);
    assert_int_equal(l->ranks_per_gpu, 4), assert_int_equal(l->upipe_heads, 2), assert_true(l->optimizer_host);
    assert_int_equal(l->offload_layers, 2), assert_int_equal(l->attn_host_layers, 2);
    assert_int_equal(rs.seqs_per_step, 15);
    const cp_plan *plans[3] = {&p, &q, &r};
    const double losses[] = {4.123456789012345, 0.1 + 0.2, 5e-324, 1e300, -0.0, NAN, INFINITY};
    for (int k = 0; k < 3; k++)
        for (size_t l = 0; l < CP_ARRAY_LEN(losses); l++) {
            cp_ckpt_state a, b;
            state_of(plans[k], &a, 1234567);
            a.last_loss = losses[l];
            a.data = (cp_data_pos){.sequence = INT64_MAX, .epoch = 3, .shard = 17, .offset = 123456789012LL};
            a.data_seed = UINT64_MAX; /* above 2^63: stored as a string */
            snprintf(a.data_source, sizeof a.data_source, "tokens:data/\"quoted\" \\ shards/*.bin");
            char *json = cp_ckpt_state_json(&a);
            if (cp_ckpt_state_parse(json, strlen(json), "t.json", &b, err, sizeof err)) fail_msg("%s\n%s", err, json);
            if (!isfinite(losses[l])) {
                assert_true(isnan(b.last_loss)); /* JSON has no NaN or infinity: null */
                b.last_loss = a.last_loss = NAN;
            }
            expect_state_equal(&a, &b);
            free(json);
        }
    assert_true(cp_ckpt_shape_hash(&p.spec.model) != cp_ckpt_shape_hash(&q.spec.model));
    /* a state of a cpgen that recorded neither the layout nor sequences per step still reads: unknown, 0 */
    cp_ckpt_state a, b;
    state_of(&r, &a, 7);
    char *json = cp_ckpt_state_json(&a);
    char *lay = strstr(json, ",\n  \"layout\"");
    assert_non_null(lay);
    strcpy(lay, "\n}\n");
    char *sps = strstr(json, ", \"sequences_per_step\": 15");
    assert_non_null(sps);
    memmove(sps, sps + strlen(", \"sequences_per_step\": 15"), strlen(sps + strlen(", \"sequences_per_step\": 15")) + 1);
    if (cp_ckpt_state_parse(json, strlen(json), "old.json", &b, err, sizeof err)) fail_msg("%s\n%s", err, json);
    assert_false(b.layout.known);
    assert_int_equal(b.seqs_per_step, 0);
    free(json);
    cp_plan_free(&p);
    cp_plan_free(&q);
    cp_plan_free(&r);
}

/* Every damaged text is refused with a message naming what is wrong; random damage never crashes. */
static void test_state_refused(void **state) {
    (void)state;
    cp_plan p;
    plan_of(&p, 0);
    cp_ckpt_state a, b;
    state_of(&p, &a, 10);
    char *json = cp_ckpt_state_json(&a);
    const struct {
        const char *from, *to, *frag;
    } edits[] = {
        {"\"step\"", "\"stop\"", "\"step\" is missing"},
        {"\"optimizer_updates\": 9", "\"optimizer_updates\": \"9\"", "\"optimizer_updates\" is a string"},
        {"\"format\": 1", "\"format\": 2", "format 2"},
        {"\"offset\": 0", "\"offset\": -5", "data.offset"},
        {"\"offset\": 0", "\"offset\": 0.5", "data.offset"},
        {"\"family\": \"llama\"", "\"family\": \"gpt\"", "model.family"},
        {"\"data_seed\": \"0\"", "\"data_seed\": \"zero\"", "rng.data_seed"},
        {"\"sequences_per_step\": 8", "\"sequences_per_step\": 0", "data.sequences_per_step"},
        {"\"optimizer\": \"gpu\"", "\"optimizer\": \"cpu\"", "layout.optimizer"},
        {"\"gpus\": 1", "\"gpus\": 0", "a count below 1"},
        {"\"upipe_heads\": 4", "\"upipe_heads\": \"4\"", "\"layout.upipe_heads\" is a string"},
        {"\"layout\": {", "\"layout\": [{", "not valid JSON"},
        {"\"layout\": {\"gpus\": 1, ", "\"layout\": {", "\"layout.gpus\" is missing"},
        {"\"hidden\": 256", "\"hidden\": 256,", "not valid JSON"},
        {"{\n", "[\n", "not valid JSON"},
    };
    for (size_t k = 0; k < CP_ARRAY_LEN(edits); k++) {
        const char *at = strstr(json, edits[k].from);
        if (!at) fail_msg("\"%s\" not in %s", edits[k].from, json);
        cp_str s = {0};
        cp_str_append(&s, json, (size_t)(at - json));
        cp_str_printf(&s, "%s%s", edits[k].to, at + strlen(edits[k].from));
        if (cp_ckpt_state_parse(s.data, s.len, "t.json", &b, err, sizeof err) == 0)
            fail_msg("edit %zu parsed: %s", k, s.data);
        expect_contains(err, "t.json");
        expect_contains(err, edits[k].frag);
        cp_str_free(&s);
    }
    /* every truncation, and random byte damage */
    size_t len = strlen(json);
    for (size_t n = 0; n + 1 < len; n++) /* all but the final newline */
        assert_int_equal(cp_ckpt_state_parse(json, n, "t.json", &b, err, sizeof err), -1);
    char *m = malloc(len);
    for (int iter = 0; iter < 2000; iter++) {
        memcpy(m, json, len);
        for (int k = 0; k < 1 + iter % 3; k++) m[(size_t)((urand() * 0.5 + 0.5) * (double)len)] ^= (char)(1 << (iter % 8));
        if (cp_ckpt_state_parse(m, len, "t.json", &b, err, sizeof err)) assert_true(err[0]);
    }
    free(m);
    free(json);
    cp_plan_free(&p);
}

/* ---- the atomic write */

typedef struct {
    const char *final, *latest;
    int stop_after; /* stop as a crash would once this many pieces are done (-1: never) */
    int seen;
} watch;

static int watch_hook(void *ctx, const char *tmp, const char *piece) {
    watch *w = ctx;
    printf("    piece %s done in %s\n", piece, tmp);
    if (!strcmp(piece, CP_CKPT_LATEST_NAME)) { /* the folder has its final name, `latest` not yet */
        assert_string_equal(tmp, w->final);
        assert_true(path_exists(w->final));
        char *latest = path_exists(w->latest) ? read_text(w->latest) : NULL;
        assert_true(!latest || !strstr(latest, strrchr(w->final, '/') + 1));
        free(latest);
        w->seen++;
        return w->stop_after >= 0 && w->seen >= w->stop_after;
    }
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", tmp, piece);
    assert_true(path_exists(tmp) && path_exists(p));
    assert_false(path_exists(w->final)); /* nothing has the final name until everything is written */
    char *latest = path_exists(w->latest) ? read_text(w->latest) : NULL;
    assert_true(!latest || !strstr(latest, strrchr(w->final, '/') + 1));
    free(latest);
    w->seen++;
    return w->stop_after >= 0 && w->seen >= w->stop_after;
}

static void test_write_atomic(void **state) {
    (void)state;
    cp_plan p;
    plan_of(&p, 0);
    arrays a;
    make_arrays(&p, &a);
    char *out = path_in("atomic");
    char *latest = path_in("atomic/latest");
    cp_ckpt_state st;
    long pid = (long)getpid();

    /* a whole write: three pieces, each seen only under the temporary name, then the folder before `latest` */
    watch w = {.final = path_in("atomic/ckpt_5"), .latest = latest, .stop_after = -1};
    state_of(&p, &st, 5);
    char got[1200];
    if (cp_ckpt_write(&p, out, &st, a.w, a.m, a.v, watch_hook, &w, got, sizeof got, err, sizeof err))
        fail_msg("%s", err);
    assert_int_equal(w.seen, 4);
    assert_string_equal(got, w.final);
    assert_true(path_exists(path_in("atomic/ckpt_5/model.safetensors")) && path_exists(path_in("atomic/ckpt_5/config.json")) &&
                path_exists(path_in("atomic/ckpt_5/optimizer.safetensors")) &&
                path_exists(path_in("atomic/ckpt_5/trainer_state.json")));
    assert_false(path_exists(path_in("atomic/ckpt_5.tmp.%ld", pid)));
    char *t = read_text(latest);
    assert_string_equal(t, "ckpt_5\n");
    free(t);

    /* a crash after the optimizer file: no ckpt_7, the .tmp folder stays, latest still names ckpt_5 */
    w = (watch){.final = path_in("atomic/ckpt_7"), .latest = latest, .stop_after = 2};
    state_of(&p, &st, 7);
    assert_int_equal(cp_ckpt_write(&p, out, &st, a.w, a.m, a.v, watch_hook, &w, NULL, 0, err, sizeof err), -1);
    assert_false(path_exists(path_in("atomic/ckpt_7")));
    assert_true(path_exists(path_in("atomic/ckpt_7.tmp.%ld/optimizer.safetensors", pid)));
    assert_false(path_exists(path_in("atomic/ckpt_7.tmp.%ld/trainer_state.json", pid)));
    t = read_text(latest);
    assert_string_equal(t, "ckpt_5\n");
    free(t);
    /* resuming from the out_dir takes the last complete one; the .tmp folder is refused */
    cp_ckpt ck;
    if (cp_ckpt_open(&p, out, &ck, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(ck.state.step, 5);
    assert_string_equal(ck.dir, path_in("atomic/ckpt_5"));
    cp_ckpt_close(&ck);
    expect_open_fails(&p, path_in("atomic/ckpt_7.tmp.%ld", pid), 2, "incomplete", "earlier");

    /* a leftover of a process that is gone is removed by the next save; this process's own is replaced */
    pid_t child = fork();
    if (child == 0) _exit(0);
    waitpid(child, NULL, 0);
    assert_int_equal(cp_mkdir_p(path_in("atomic/ckpt_3.tmp.%ld", (long)child)), 0);
    write_ckpt(&p, out, 7, &a);
    assert_false(path_exists(path_in("atomic/ckpt_3.tmp.%ld", (long)child)));
    assert_false(path_exists(path_in("atomic/ckpt_7.tmp.%ld", pid)));
    assert_true(path_exists(path_in("atomic/ckpt_7/trainer_state.json")));
    t = read_text(latest);
    assert_string_equal(t, "ckpt_7\n");
    free(t);

    /* the same step saved again (after a resume) replaces the folder in one step, leaving nothing beside it */
    a.w[0] = 12345.f;
    write_ckpt(&p, out, 7, &a);
    if (cp_ckpt_open(&p, out, &ck, err, sizeof err)) fail_msg("%s", err);
    float *back = malloc(sizeof(float) * (size_t)a.n);
    if (cp_ckpt_load_weights(&p, &ck, back, err, sizeof err)) fail_msg("%s", err);
    assert_true(back[0] == 12345.f);
    cp_ckpt_close(&ck);
    free(back);
    assert_false(path_exists(path_in("atomic/ckpt_7.tmp.%ld", pid)));
    assert_false(path_exists(path_in("atomic/ckpt_7.old.%ld", pid)));

    /* the final rename fails (a file has the name): an error naming it, no folder of that name, no .tmp left,
     * latest unchanged */
    write_text(path_in("atomic/ckpt_9"), "not a checkpoint");
    state_of(&p, &st, 9);
    assert_int_equal(cp_ckpt_write(&p, out, &st, a.w, a.m, a.v, NULL, NULL, NULL, 0, err, sizeof err), -1);
    printf("    refused: %s\n", err);
    expect_contains(err, "ckpt_9 exists and is not a checkpoint cpgen saved");
    struct stat sb;
    assert_int_equal(stat(path_in("atomic/ckpt_9"), &sb), 0);
    assert_false(S_ISDIR(sb.st_mode));
    assert_false(path_exists(path_in("atomic/ckpt_9.tmp.%ld", pid)));
    t = read_text(latest);
    assert_string_equal(t, "ckpt_7\n");
    free(t);

    /* a folder of that name that cpgen did not save (a file of the user's in it) is refused, not swapped out and
     * removed; nor is a leftover-looking folder holding such a file, or a `latest` that cpgen did not write */
    assert_int_equal(cp_mkdir_p(path_in("atomic/ckpt_11")), 0);
    write_text(path_in("atomic/ckpt_11/notes.txt"), "mine");
    state_of(&p, &st, 11);
    assert_int_equal(cp_ckpt_write(&p, out, &st, a.w, a.m, a.v, NULL, NULL, NULL, 0, err, sizeof err), -1);
    printf("    refused: %s\n", err);
    expect_contains(err, "it holds notes.txt, which a checkpoint does not");
    t = read_text(path_in("atomic/ckpt_11/notes.txt"));
    assert_string_equal(t, "mine");
    free(t);
    assert_false(path_exists(path_in("atomic/ckpt_11/trainer_state.json")));
    assert_int_equal(cp_mkdir_p(path_in("atomic/ckpt_2.tmp.%ld", (long)child)), 0);
    write_text(path_in("atomic/ckpt_2.tmp.%ld/notes.txt", (long)child), "mine");
    write_text(latest, "my own notes\n");
    state_of(&p, &st, 13);
    assert_int_equal(cp_ckpt_write(&p, out, &st, a.w, a.m, a.v, NULL, NULL, NULL, 0, err, sizeof err), -1);
    printf("    refused: %s\n", err);
    expect_contains(err, "latest exists and is not a `latest` file cpgen wrote");
    assert_true(path_exists(path_in("atomic/ckpt_2.tmp.%ld/notes.txt", (long)child)));
    t = read_text(latest);
    assert_string_equal(t, "my own notes\n");
    free(t);
    write_text(latest, "ckpt_7\n");

    /* an out_dir that cannot be created */
    write_text(path_in("afile"), "x");
    assert_int_equal(cp_ckpt_write(&p, path_in("afile/sub"), &st, a.w, a.m, a.v, NULL, NULL, NULL, 0, err, sizeof err),
                     -1);
    expect_contains(err, "train.out_dir");
    free_arrays(&a);
    cp_plan_free(&p);
}

/* ---- weights and moments through safetensors */

static void test_tensors_roundtrip(void **state) {
    (void)state;
    static const char *const cfgs[][3] = {
        {"parallel.gpus=1", "parallel.upipe_heads=auto", "model.family=llama"},
        {"parallel.gpus=2", "parallel.upipe_heads=2", "model.family=llama"}, /* query heads stored permuted */
        {"parallel.gpus=2", "model.hidden=200", "model.family=qwen3"},      /* padded units, q/k norms */
    };
    for (size_t c = 0; c < CP_ARRAY_LEN(cfgs); c++) {
        cp_plan p;
        plan_of(&p, 3, cfgs[c][0], cfgs[c][1], cfgs[c][2]);
        arrays a;
        make_arrays(&p, &a);
        bool padded = false;
        for (int u = 0; u < p.nunits; u++) padded |= p.unit_padded[u] != p.unit_elems[u];
        printf("    %s %s %s: %lld elements, %d units%s\n", cfgs[c][0], cfgs[c][1], cfgs[c][2], (long long)a.n,
               p.nunits, padded ? ", padded" : "");
        char *out = path_in("rt%zu", c);
        write_ckpt(&p, out, 4, &a);
        cp_ckpt ck;
        if (cp_ckpt_open(&p, out, &ck, err, sizeof err)) fail_msg("%s", err);
        float *back = malloc(sizeof(float) * (size_t)a.n);
        memset(back, 0xff, sizeof(float) * (size_t)a.n);
        if (cp_ckpt_load_weights(&p, &ck, back, err, sizeof err)) fail_msg("%s", err);
        assert_memory_equal(back, a.w, sizeof(float) * (size_t)a.n); /* padding included */
        memset(back, 0xff, sizeof(float) * (size_t)a.n);
        if (cp_ckpt_load_moment(&p, &ck, false, back, err, sizeof err)) fail_msg("%s", err);
        assert_memory_equal(back, a.m, sizeof(float) * (size_t)a.n);
        memset(back, 0xff, sizeof(float) * (size_t)a.n);
        if (cp_ckpt_load_moment(&p, &ck, true, back, err, sizeof err)) fail_msg("%s", err);
        assert_memory_equal(back, a.v, sizeof(float) * (size_t)a.n);
        free(back);

        /* the moments use the weights' mapping: exp_avg.X holds what a weights save of m writes as X */
        char *ref = path_in("rt%zu_ref", c);
        if (cp_weights_save_hf(&p, a.m, ref, false, 0, err, sizeof err)) fail_msg("%s", err);
        cp_st_set w;
        if (cp_st_open(ref, &w, err, sizeof err)) fail_msg("%s", err);
        assert_int_equal(ck.optim.ntensors, 2 * w.ntensors);
        for (int k = 0; k < w.ntensors; k++) {
            char name[200];
            snprintf(name, sizeof name, "exp_avg.%s", w.tensors[k].name);
            const cp_st_tensor *o = cp_st_find(&ck.optim, name);
            assert_non_null(o);
            assert_int_equal(o->dtype, CP_ST_F32);
            assert_int_equal(o->ndim, w.tensors[k].ndim);
            assert_memory_equal(o->shape, w.tensors[k].shape, sizeof o->shape);
            size_t bytes = (size_t)(o->end - o->begin);
            char *x = malloc(bytes), *y = malloc(bytes);
            if (cp_st_read_raw(&ck.optim, o, x, err, sizeof err) || cp_st_read_raw(&w, &w.tensors[k], y, err, sizeof err))
                fail_msg("%s", err);
            assert_memory_equal(x, y, bytes);
            free(x), free(y);
            snprintf(name, sizeof name, "exp_avg_sq.%s", w.tensors[k].name);
            assert_non_null(cp_st_find(&ck.optim, name));
        }
        cp_st_close(&w);
        cp_ckpt_close(&ck);
        free_arrays(&a);
        cp_plan_free(&p);
    }
}

/* ---- refusals */

/* Rewrite a checkpoint's trainer_state.json with one edit. */
static void edit_state(const char *dir, const char *from, const char *to) {
    char p[1200];
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    char *t = read_text(p);
    char *at = strstr(t, from);
    if (!at) fail_msg("\"%s\" not in %s", from, t);
    cp_str s = {0};
    cp_str_append(&s, t, (size_t)(at - t));
    cp_str_printf(&s, "%s%s", to, at + strlen(from));
    write_text(p, s.data);
    cp_str_free(&s);
    free(t);
}

/* A fresh copy of a checkpoint folder (flat: files only) to damage. */
static void copy_ckpt(const char *from, const char *to) {
    rm_rf(to);
    assert_int_equal(cp_mkdir_p(to), 0);
    DIR *d = opendir(from);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char a[1400], b[1400];
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        size_t n;
        char *data = cp_read_file(a, &n);
        assert_non_null(data);
        FILE *f = fopen(b, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(data, 1, n, f), n);
        fclose(f);
        free(data);
    }
    closedir(d);
}

static void test_refused(void **state) {
    (void)state;
    cp_plan p;
    plan_of(&p, 0);
    arrays a;
    make_arrays(&p, &a);
    char *out = path_in("ref");
    write_ckpt(&p, out, 5, &a);
    char good[1024], bad[1024];
    snprintf(good, sizeof good, "%s", path_in("ref/ckpt_5"));
    snprintf(bad, sizeof bad, "%s", path_in("ref/bad"));

    /* where */
    expect_open_fails(&p, path_in("nothing-here"), 2, "nothing-here", "No such file");
    assert_int_equal(cp_mkdir_p(path_in("empty")), 0);
    expect_open_fails(&p, path_in("empty"), 2, "neither a checkpoint", "train.save_every");
    write_text(path_in("empty/latest"), "ckpt_99\n");
    expect_open_fails(&p, path_in("empty"), 2, "names ckpt_99, which is missing", "another ckpt_<step>");
    write_text(path_in("empty/latest"), "../ref/ckpt_5\n");
    expect_open_fails(&p, path_in("empty"), 1, "damaged");

    /* the model and the run it belongs to */
    cp_plan q;
    plan_of(&q, 1, "model.hidden=200");
    expect_open_fails(&q, good, 3, "model.hidden = 256 in the checkpoint, 200 in the spec", "resume with the spec",
                      "tiny");
    cp_plan_free(&q);
    plan_of(&q, 2, "model.layers=3", "model.tie_embeddings=true");
    expect_open_fails(&q, good, 2, "model.layers = 2 in the checkpoint, 3 in the spec",
                      "model.tie_embeddings = false in the checkpoint, true in the spec");
    cp_plan_free(&q);
    plan_of(&q, 2, "train.steps=5", "train.warmup=0");
    expect_open_fails(&q, good, 2, "at step 5 and train.steps is 5", "--set train.steps=N");
    cp_plan_free(&q);
    /* another data source or seed opens (whether the run may take it is cp_resume_check's: test_resume.c) */
    cp_ckpt ck;
    plan_of(&q, 2, "init.seed=3", "data.source=tokens:/nonexistent/*.bin");
    if (cp_ckpt_open(&q, good, &ck, err, sizeof err)) fail_msg("%s", err);
    cp_ckpt_close(&ck);
    cp_plan_free(&q);
    /* a different learning rate resumes, with a note */
    plan_of(&q, 2, "train.lr=1e-3", "train.min_lr=0.00030000000000000003"); /* tiny's lr / 10 */
    if (cp_ckpt_open(&q, good, &ck, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(cp_ckpt_notes(&q, &ck.state, stdout), 1);
    assert_int_equal(cp_ckpt_notes(&p, &ck.state, stdout), 0);
    cp_ckpt_close(&ck);
    cp_plan_free(&q);

    /* the trainer state */
    copy_ckpt(good, bad);
    edit_state(bad, "\"hidden\": 256", "\"hidden\": 200");
    expect_open_fails(&p, bad, 1, "model_shape_hash does not match");
    copy_ckpt(good, bad);
    edit_state(bad, "\"skipped_steps\": 1", "\"skipped_steps\": 2");
    expect_open_fails(&p, bad, 1, "is not optimizer_updates 4 + skipped_steps 2");
    copy_ckpt(good, bad);
    edit_state(bad, "\"step\": 5", "\"step\": 5,,");
    expect_open_fails(&p, bad, 2, "trainer_state.json", "not valid JSON");
    copy_ckpt(good, bad);
    edit_state(bad, "\"format\": 1", "\"format\": 7");
    expect_open_fails(&p, bad, 2, "checkpoint format 7", "reads format 1");

    /* the files */
    char f[1200];
    copy_ckpt(good, bad);
    snprintf(f, sizeof f, "%s/optimizer.safetensors", bad);
    unlink(f);
    expect_open_fails(&p, bad, 2, "optimizer state", "optimizer.safetensors");
    copy_ckpt(good, bad);
    assert_int_equal(truncate(f, 4000), 0);
    expect_open_fails(&p, bad, 2, "optimizer state", "optimizer.safetensors");
    copy_ckpt(good, bad);
    snprintf(f, sizeof f, "%s/model.safetensors", bad);
    unlink(f);
    expect_open_fails(&p, bad, 1, "the checkpoint's weights");
    copy_ckpt(good, bad);
    assert_int_equal(truncate(f, 1000), 0);
    expect_open_fails(&p, bad, 1, "the checkpoint's weights");
    copy_ckpt(good, bad);
    snprintf(f, sizeof f, "%s/trainer_state.json", bad);
    unlink(f);
    expect_open_fails(&p, bad, 1, "neither a checkpoint");

    /* weights in BF16: a Hugging Face export, not a training checkpoint */
    copy_ckpt(good, bad);
    if (cp_weights_save_hf(&p, a.w, bad, true, 0, err, sizeof err)) fail_msg("%s", err);
    expect_open_fails(&p, bad, 2, "is BF16, not F32", "init = { from = \"hf\" }");

    /* an optimizer file with a tensor missing, one in BF16, one too many */
    cp_hf_tensor t[64];
    int nt = cp_weights_hf_tensors(&p, t, 64);
    snprintf(f, sizeof f, "%s/optimizer.safetensors", bad);
    for (int variant = 0; variant < 3; variant++) {
        copy_ckpt(good, bad);
        cp_st_out o[130];
        char names[130][160];
        int n = 0;
        for (int pre = 0; pre < 2; pre++)
            for (int k = 0; k < nt; k++) {
                if (variant == 0 && pre == 1 && k == nt - 1) continue;
                snprintf(names[n], sizeof names[n], "%s%.96s", pre ? "exp_avg_sq." : "exp_avg.", t[k].name);
                o[n] = (cp_st_out){.name = names[n], .dtype = variant == 1 && k == 1 ? CP_ST_BF16 : CP_ST_F32,
                                   .ndim = t[k].ndim, .shape = {t[k].shape[0], t[k].shape[1]},
                                   .f32 = (pre ? a.v : a.m) + t[k].off};
                n++;
            }
        if (variant == 2) o[n++] = (cp_st_out){.name = "exp_avg.model.layers.2.mlp.up_proj.weight", .dtype = CP_ST_F32,
                                               .ndim = 1, .shape = {4}, .f32 = a.m};
        if (cp_st_write_file(f, o, n, err, sizeof err)) fail_msg("%s", err);
        if (variant == 0) expect_open_fails(&p, bad, 2, "no tensor \"exp_avg_sq.lm_head.weight\"", "incomplete");
        if (variant == 1) expect_open_fails(&p, bad, 2, "is BF16, not F32", "not written by cpgen");
        if (variant == 2) expect_open_fails(&p, bad, 2, "unexpected tensor", "model.layers.2");
    }

    /* values: a negative second moment or a NaN weight passes the header checks and is refused when loaded */
    float keep = a.v[t[3].off + 1];
    a.v[t[3].off + 1] = -1.f;
    write_ckpt(&p, path_in("ref_neg"), 5, &a);
    a.v[t[3].off + 1] = keep;
    if (cp_ckpt_open(&p, path_in("ref_neg"), &ck, err, sizeof err)) fail_msg("%s", err);
    float *back = malloc(sizeof(float) * (size_t)a.n);
    assert_int_equal(cp_ckpt_load_moment(&p, &ck, true, back, err, sizeof err), -1);
    printf("    refused: %s\n", err);
    expect_contains(err, "exp_avg_sq.");
    expect_contains(err, "must be >= 0");
    cp_ckpt_close(&ck);
    a.w[t[2].off] = NAN;
    write_ckpt(&p, path_in("ref_nan"), 5, &a);
    if (cp_ckpt_open(&p, path_in("ref_nan"), &ck, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(cp_ckpt_load_weights(&p, &ck, back, err, sizeof err), -1);
    printf("    refused: %s\n", err);
    expect_contains(err, "NaN");
    cp_ckpt_close(&ck);
    free(back);
    free_arrays(&a);
    cp_plan_free(&p);
}

/* A checkpoint folder is also a Hugging Face checkpoint: init.from = "hf" reads its weights. */
static void test_loadable_as_hf(void **state) {
    (void)state;
    cp_plan p;
    plan_of(&p, 0);
    arrays a;
    make_arrays(&p, &a);
    write_ckpt(&p, path_in("hf"), 3, &a);
    float *back = malloc(sizeof(float) * (size_t)a.n);
    if (cp_weights_load_hf(&p, path_in("hf/ckpt_3"), back, err, sizeof err)) fail_msg("%s", err);
    assert_memory_equal(back, a.w, sizeof(float) * (size_t)a.n);
    char *cfg = read_text(path_in("hf/ckpt_3/config.json"));
    expect_contains(cfg, "\"torch_dtype\": \"float32\"");
    free(cfg);
    free(back);
    free_arrays(&a);
    cp_plan_free(&p);
}

static int setup(void **state) {
    (void)state;
    const char *tmp = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/cpgen_ckpt_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    return mkdtemp(root) ? 0 : -1;
}
static int teardown(void **state) {
    (void)state;
    rm_rf(root);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_state_roundtrip), cmocka_unit_test(test_state_refused),
        cmocka_unit_test(test_write_atomic),    cmocka_unit_test(test_tensors_roundtrip),
        cmocka_unit_test(test_refused),         cmocka_unit_test(test_loadable_as_hf),
    };
    return cmocka_run_group_tests_name("checkpoint", tests, setup, teardown) ? 1 : 0;
}
