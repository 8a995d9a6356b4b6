/* ckpt_async.c: checkpoints written by a thread of their own while training goes on (ckpt_async.h). */
#include "ckpt_async.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "ckpt_keep.h"
#include "util.h"

enum { DONE_MAX = 4 };

typedef struct {
    int rc, step;
    double seconds;
    int64_t bytes;
    char path[CP_PATH_MAX + 64], removed[512], err[CP_ERR_MAX];
} result;

/* A snapshot handed over: save k goes into slot k % nslots, is finished by the snapshot thread, then written. */
typedef struct {
    cp_ckpt_state st;
    const float *w, *m, *v;
    int rc;                   /* the source's finish */
    char err[CP_ERR_MAX];
} job;

struct cp_saver {
    cp_saver_opts o;
    pthread_t th, snap_th;
    bool th_started, snap_started;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool quit;
    /* saves handed over, finished and written so far: the jobs in flight are written..handed-1, the oldest first;
     * each job's fields belong to the thread whose turn it is (the counters, under the lock, say whose) */
    int nslots;
    job jobs[2];
    long handed, snapped, written;
    int writing_step;         /* the job being written, for the test hook */
    /* finished jobs not yet reported, oldest first: a save that waited for the write before it leaves that one's
     * report beside its own */
    result done[DONE_MAX];
    int ndone;
    /* CPGEN_CKPT_PAUSE */
    int pause_step;
    double pause_s;
};

static void sleep_s(double s) {
    struct timespec t = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {}
}

/* The test hook: after the weights of the checkpoint it names, the writer pauses as a slow disk would. */
static int pause_hook(void *ctx, const char *tmp, const char *piece) {
    cp_saver *s = ctx;
    int rc = s->o.hook ? s->o.hook(s->o.hook_ctx, tmp, piece) : 0;
    int step = s->writing_step;
    if (!rc && s->pause_s > 0 && !strcmp(piece, CP_ST_SINGLE_NAME) && (!s->pause_step || s->pause_step == step)) {
        fprintf(stderr, "cpgen: CPGEN_CKPT_PAUSE: the writer pauses %.3g s after the weights of ckpt_%d (in %s)\n",
                s->pause_s, step, tmp);
        sleep_s(s->pause_s);
    }
    return rc;
}

/* Bytes of the files in a folder. */
static int64_t folder_bytes(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int64_t n = 0;
    struct dirent *e;
    char p[CP_PATH_MAX + 300];
    while ((e = readdir(d))) {
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.' && stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) n += (int64_t)sb.st_size;
    }
    closedir(d);
    return n;
}

/* One job, its snapshot finished: the folder written, older checkpoints removed. */
static void write_job(cp_saver *s, job *j) {
    double t0 = cp_now();
    char err[CP_ERR_MAX] = "", path[CP_PATH_MAX + 64] = "", removed[512] = "";
    int rc = j->rc;
    if (rc) cp_errf(err, sizeof err, "the snapshot of ckpt_%d: %s", j->st.step, j->err);
    if (!rc) {
        bool hooked = s->o.hook || s->pause_s > 0;
        s->writing_step = j->st.step;
        rc = cp_ckpt_write(s->o.plan, s->o.out_dir, &j->st, j->w, j->m, j->v, hooked ? pause_hook : NULL, s, path,
                           sizeof path, err, sizeof err);
    }
    if (!rc) cp_ckpt_keep(s->o.out_dir, s->o.keep, path, s->o.resumed, removed, sizeof removed);
    result *d = cp_xcalloc(1, sizeof *d);
    *d = (result){.rc = rc, .step = j->st.step, .seconds = cp_now() - t0, .bytes = rc ? 0 : folder_bytes(path)};
    snprintf(d->path, sizeof d->path, "%s", path);
    snprintf(d->removed, sizeof d->removed, "%s", removed);
    snprintf(d->err, sizeof d->err, "%s", err);
    pthread_mutex_lock(&s->lock);
    if (s->ndone == DONE_MAX) { /* never looked at: the oldest success makes room (a failure stays) */
        int k = 0;
        while (k < DONE_MAX - 1 && s->done[k].rc) k++;
        memmove(&s->done[k], &s->done[k + 1], sizeof *s->done * (size_t)(DONE_MAX - 1 - k));
        s->ndone--;
    }
    s->done[s->ndone++] = *d;
    free(d);
    s->written++;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

/* The snapshot thread: each snapshot finished as soon as it is handed over, so that a copy the next update waits
 * for (the host optimizer's memcpy, a staged copy) never waits behind the write of the one before. */
static void *snap_thread(void *arg) {
    cp_saver *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (s->snapped == s->handed && !s->quit) pthread_cond_wait(&s->cond, &s->lock);
        if (s->snapped == s->handed) break;
        job *j = &s->jobs[s->snapped % s->nslots];
        pthread_mutex_unlock(&s->lock);
        j->err[0] = 0;
        j->rc = s->o.src.finish ? s->o.src.finish(s->o.src.ctx, j->err, sizeof j->err) : 0;
        pthread_mutex_lock(&s->lock);
        s->snapped++;
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* The writer thread: the finished snapshots' folders, in the order of the saves (so `latest` moves forward only). */
static void *writer_thread(void *arg) {
    cp_saver *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (s->written == s->snapped && !(s->quit && s->written == s->handed))
            pthread_cond_wait(&s->cond, &s->lock);
        if (s->written == s->handed) break;
        job *j = &s->jobs[s->written % s->nslots];
        pthread_mutex_unlock(&s->lock);
        write_job(s, j);
        pthread_mutex_lock(&s->lock);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

int cp_saver_create(cp_saver **out, const cp_saver_opts *o, char *err, int errlen) {
    *out = NULL;
    if (!o->src.start) return cp_errf(err, errlen, "a checkpoint saver needs a snapshot source (a cpgen bug)");
    cp_saver *s = cp_xcalloc(1, sizeof *s);
    s->o = *o;
    s->nslots = o->plan && o->plan->ckpt_slots == 2 ? 2 : 1;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    const char *pause = getenv("CPGEN_CKPT_PAUSE");
    if (pause && *pause) {
        char *end;
        double v = strtod(pause, &end);
        if (*end == ':') {
            s->pause_step = (int)v;
            v = strtod(end + 1, &end);
        }
        if (*end || !(v >= 0) || v > 86400 || s->pause_step < 0) {
            cp_saver_destroy(s);
            return cp_errf(err, errlen, "CPGEN_CKPT_PAUSE=%s: give SECONDS or STEP:SECONDS (a test hook: the "
                           "checkpoint writer pauses that long after the weights)", pause);
        }
        s->pause_s = v;
    }
    if (o->writer) {
        int e = pthread_create(&s->snap_th, NULL, snap_thread, s);
        s->snap_started = !e;
        if (!e) e = pthread_create(&s->th, NULL, writer_thread, s);
        s->th_started = s->snap_started && !e;
        if (e) {
            cp_saver_destroy(s);
            return cp_errf(err, errlen, "cannot start the checkpoint writer's threads: %s", strerror(e));
        }
    }
    *out = s;
    return 0;
}

/* The oldest finished job's report, taken off the list; a failure first, wherever it is. The caller holds the
 * lock. */
static int report(cp_saver *s, char *line, int linelen, char *err, int errlen) {
    if (line && linelen > 0) line[0] = 0;
    if (!s->ndone) return 0;
    int k = 0;
    while (k < s->ndone && !s->done[k].rc) k++;
    if (k == s->ndone) k = 0;
    result *d = &s->done[k];
    int rc = 1;
    if (d->rc) {
        rc = cp_errf(err, errlen, "writing ckpt_%d failed: %s; the newest complete checkpoint is the one before it",
                     d->step, d->err);
    } else if (line) {
        char a[32];
        double gbs = d->seconds > 0 ? (double)d->bytes / d->seconds / 1e9 : 0;
        int n = snprintf(line, (size_t)linelen, "ckpt_%d written: %s in %.1f s, %.2f GB/s (%s)", d->step,
                         cp_fmt_bytes(d->bytes, a, sizeof a), d->seconds, gbs, d->path);
        if (d->removed[0] && n > 0 && n < linelen)
            snprintf(line + n, (size_t)(linelen - n), "; removed %s (train.keep_checkpoints = %d)", d->removed,
                     s->o.keep);
    }
    memmove(&s->done[k], &s->done[k + 1], sizeof *s->done * (size_t)(s->ndone - 1 - k));
    s->ndone--;
    return rc;
}

static bool failed_unreported(const cp_saver *s) {
    for (int k = 0; k < s->ndone; k++)
        if (s->done[k].rc) return true;
    return false;
}

int cp_saver_save(cp_saver *s, const cp_ckpt_state *st, cp_save_info *info, char *err, int errlen) {
    double t0 = cp_now();
    memset(info, 0, sizeof *info);
    info->step = st->step;
    int rc = 0;
    if (s->o.writer) {
        pthread_mutex_lock(&s->lock);
        if (s->handed - s->written == s->nslots) { /* every slot still being written: wait for the oldest */
            info->waited_for = s->jobs[s->written % s->nslots].st.step;
            while (s->handed - s->written == s->nslots) pthread_cond_wait(&s->cond, &s->lock);
            info->waited = cp_now() - t0;
        }
        /* one before failed: stop now, not with another snapshot */
        if (failed_unreported(s)) rc = report(s, NULL, 0, err, errlen);
        pthread_mutex_unlock(&s->lock);
        if (rc) return -1;
    }
    const float *w = NULL, *m = NULL, *v = NULL;
    int updates = 0, slot = (int)(s->handed % s->nslots); /* free: its write is done (only this thread hands over) */
    if (s->o.src.start(s->o.src.ctx, slot, &w, &m, &v, &updates, &info->made, err, errlen)) {
        char msg[CP_ERR_MAX];
        snprintf(msg, sizeof msg, "%s", err);
        return cp_errf(err, errlen, "the snapshot of ckpt_%d: %s", st->step, msg);
    }
    if (s->o.writer) {
        if (!w || !m || !v)
            return cp_errf(err, errlen, "the snapshot of ckpt_%d gave no arrays to write (a cpgen bug)", st->step);
        job *j = &s->jobs[slot];
        j->st = *st;
        j->st.updates = updates;
        j->w = w, j->m = m, j->v = v;
        pthread_mutex_lock(&s->lock);
        s->handed++;
        pthread_cond_broadcast(&s->cond);
        if (!s->o.async)
            while (s->written < s->handed) pthread_cond_wait(&s->cond, &s->lock);
        pthread_mutex_unlock(&s->lock);
    }
    info->held = cp_now() - t0;
    return 0;
}

int cp_saver_poll(cp_saver *s, char *line, int linelen, char *err, int errlen) {
    pthread_mutex_lock(&s->lock);
    int rc = report(s, line, linelen, err, errlen);
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int cp_saver_busy(cp_saver *s) {
    pthread_mutex_lock(&s->lock);
    int step = s->written < s->handed ? s->jobs[(s->handed - 1) % s->nslots].st.step : 0;
    pthread_mutex_unlock(&s->lock);
    return step;
}

double cp_saver_wait(cp_saver *s) {
    double t0 = cp_now();
    pthread_mutex_lock(&s->lock);
    bool busy = s->written < s->handed;
    while (s->written < s->handed) pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
    return busy ? cp_now() - t0 : 0;
}

void cp_saver_destroy(cp_saver *s) {
    if (!s) return;
    if (s->snap_started) {
        pthread_mutex_lock(&s->lock);
        s->quit = true; /* after the jobs still going, which the threads finish first */
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->snap_th, NULL);
        if (s->th_started) pthread_join(s->th, NULL);
    }
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
    free(s);
}

void cp_save_info_note(const cp_save_info *i, double step_seconds, char *buf, int len) {
    char held[32];
    if (i->held < 1) snprintf(held, sizeof held, "%.1f ms", i->held * 1e3);
    else snprintf(held, sizeof held, "%.2f s", i->held);
    int k = snprintf(buf, (size_t)len, "ckpt_%d: training held %s", i->step, held);
    if (step_seconds > 0 && k > 0 && k < len)
        k += snprintf(buf + k, (size_t)(len - k), " (%.1f%% of the step)", 100 * i->held / step_seconds);
    if (i->waited_for && k > 0 && k < len)
        k += snprintf(buf + k, (size_t)(len - k), ", waited %.1f s for ckpt_%d to be written", i->waited,
                      i->waited_for);
    if (i->made > 0.05 && k > 0 && k < len)
        snprintf(buf + k, (size_t)(len - k), ", %.1f s for the snapshot's memory to be pinned", i->made);
}
