/* exec_snap.c: a checkpoint's snapshot of the training state (exec.h, cp_exec_snapshot_*): the fp32 master weights
 * and both AdamW moments copied into host arrays right after a step, so that the checkpoint's files are written from
 * them while training goes on; and the wait of the next update for a snapshot still reading what it writes. */
#include "exec_internal.h"

#include <stdlib.h>
#include <unistd.h>

#include "util.h"

static const char *const STATE[3] = {"master.f32", "adam_m.f32", "adam_v.f32"};

static int buf_of(const cp_plan *P, const char *name) {
    for (int i = 0; i < P->nbufs; i++)
        if (!strcmp(P->bufs[i].name, name)) return i;
    return -1;
}

/* Whether step i writes the master weights or a moment. */
static bool writes_state(const cp_plan *P, const int *bufs, int i) {
    const cp_step *s = &P->steps[i];
    for (int j = 0; j < s->nops; j++)
        for (int k = 0; k < 3; k++)
            if (s->ops[j].buf == bufs[k] && (s->ops[j].access & CP_WRITE)) return true;
    return false;
}

int cp_exec_snapshot_gate(const cp_plan *P) {
    int bufs[3];
    for (int k = 0; k < 3; k++) bufs[k] = buf_of(P, STATE[k]);
    int gate = -1;
    for (int i = 0; i < P->nsteps; i++) {
        if (!writes_state(P, bufs, i)) continue;
        if (i < P->micro_steps) return -1; /* the micro-batches write it: nothing may run beside the copies */
        if (gate < 0) gate = i;
    }
    return gate;
}

static int prepare(cp_exec *ex, char *err, int errlen) {
    if (ex->snap_ready) return 0;
    for (int k = 0; k < 3; k++)
        if ((ex->snap_buf[k] = buf_of(ex->P, STATE[k])) < 0)
            return cp_errf(err, errlen, "a checkpoint's snapshot: the plan has no buffer %s", STATE[k]);
    ex->snap_gate = cp_exec_snapshot_gate(ex->P);
    pthread_mutex_init(&ex->snap_lock, NULL);
    pthread_cond_init(&ex->snap_cond, NULL);
    ex->snap_ready = true;
    return 0;
}

/* The stream and events of copies from the GPU, made at the first (the host optimizer's memcpy needs none). */
static int prepare_gpu(cp_exec *ex, char *err, int errlen) {
    if (ex->snap_cuda) return 0;
    CK(cudaStreamCreateWithFlags(&ex->snap_stream, cudaStreamNonBlocking), "creating the snapshot's stream");
    CK(cudaEventCreateWithFlags(&ex->snap_done, cudaEventDisableTiming), "creating an event");
    for (int h = 0; h < 2; h++)
        CK(cudaEventCreateWithFlags(&ex->snap_half[h], cudaEventDisableTiming), "creating an event");
    ex->snap_cuda = true;
    return 0;
}

void exec_snap_free(cp_exec *ex) {
    if (ex->snap_cuda) {
        (void)cudaStreamDestroy(ex->snap_stream);
        (void)cudaEventDestroy(ex->snap_done);
        for (int h = 0; h < 2; h++) (void)cudaEventDestroy(ex->snap_half[h]);
        ex->snap_cuda = false;
    }
    if (!ex->snap_ready) return;
    pthread_mutex_destroy(&ex->snap_lock);
    pthread_cond_destroy(&ex->snap_cond);
    ex->snap_ready = false;
}

/* The three arrays of the state in order, n bytes each: the executor's (src) and the snapshot's (dst). */
static void arrays(const cp_exec *ex, const cp_exec_snap *d, char *src[3], char *dst[3], size_t *n) {
    for (int k = 0; k < 3; k++) src[k] = ex->bufptr[ex->snap_buf[k]];
    dst[0] = (char *)d->w, dst[1] = (char *)d->m, dst[2] = (char *)d->v;
    *n = sizeof(float) * (size_t)ex->P->params_shard;
}

/* Pinned arrays: copies on the snapshot's stream, none crossing a registered piece, then the event the next update
 * waits for. */
static int copy_pinned(cp_exec *ex, char *err, int errlen) {
    char *src[3], *dst[3];
    size_t n;
    arrays(ex, &ex->snap_dst, src, dst, &n);
    size_t piece = ex->snap_dst.piece > 0 ? (size_t)ex->snap_dst.piece : 0;
    for (int k = 0; k < 3; k++)
        for (size_t at = 0, len; at < n; at += len) {
            len = exec_piece_span(at, n, piece);
            CK(cudaMemcpyAsync(dst[k] + at, src[k] + at, len, cudaMemcpyDeviceToHost, ex->snap_stream),
               "copying the state to the checkpoint's snapshot");
        }
    CK(cudaEventRecord(ex->snap_done, ex->snap_stream), "recording the snapshot's copies");
    return 0;
}

/* Pageable arrays from the GPU: piece k goes to half k % 2 of the staging buffer, and from there to its place while
 * piece k + 1 comes down into the other half. */
static int copy_staged(cp_exec *ex, char *err, int errlen) {
    char *src[3], *dst[3];
    size_t n;
    arrays(ex, &ex->snap_dst, src, dst, &n);
    size_t half = (size_t)(ex->snap_dst.staging_bytes / 2);
    if (!ex->snap_dst.staging || half < 4096)
        return cp_errf(err, errlen, "a checkpoint's snapshot into pageable memory needs a pinned staging buffer (a "
                       "cpgen bug: none was given)");
    size_t per = (n + half - 1) / half, total = 3 * per;
    char *stage[2] = {ex->snap_dst.staging, (char *)ex->snap_dst.staging + half};
#define PIECE(q, k_, at_, len_) \
    int k_ = (int)((q) / per); \
    size_t at_ = ((q) % per) * half, len_ = CP_MIN(half, n - at_)
    for (size_t q = 0; q < total + 1; q++) {
        if (q < total) { /* down into its half, whose last piece was placed at q - 1 */
            PIECE(q, k, at, len);
            CK(cudaMemcpyAsync(stage[q % 2], src[k] + at, len, cudaMemcpyDeviceToHost, ex->snap_stream),
               "copying the state to the checkpoint's snapshot");
            CK(cudaEventRecord(ex->snap_half[q % 2], ex->snap_stream), "recording the snapshot's copies");
        }
        if (q > 0) { /* the one before: wait for it, then into its place */
            PIECE(q - 1, k, at, len);
            CK(cudaEventSynchronize(ex->snap_half[(q - 1) % 2]), "copying the state to the checkpoint's snapshot");
            memcpy(dst[k] + at, stage[(q - 1) % 2], len);
        }
    }
#undef PIECE
    return 0;
}

typedef struct {
    const char *src;
    char *dst;
    size_t n;
} mcpy;

static void *mcpy_thread(void *arg) {
    mcpy *c = arg;
    memcpy(c->dst, c->src, c->n);
    return NULL;
}

/* The host optimizer's state: a memcpy on a few threads (one thread copies at a fraction of the memory's speed). */
static void copy_host(cp_exec *ex) {
    enum { PARTS = 4 };
    char *src[3], *dst[3];
    size_t n;
    arrays(ex, &ex->snap_dst, src, dst, &n);
    mcpy c[3 * PARTS];
    pthread_t th[3 * PARTS];
    int nt = 0;
    for (int k = 0; k < 3; k++)
        for (int p = 0; p < PARTS; p++) {
            size_t a = n * (size_t)p / PARTS, b = n * (size_t)(p + 1) / PARTS;
            c[nt] = (mcpy){src[k] + a, dst[k] + a, b - a};
            if (pthread_create(&th[nt], NULL, mcpy_thread, &c[nt])) {
                mcpy_thread(&c[nt]); /* no thread: this one copies it */
                th[nt] = 0;
            }
            nt++;
        }
    for (int t = 0; t < nt; t++)
        if (th[t]) pthread_join(th[t], NULL);
}

static bool on_host(const cp_exec *ex) { return ex->P->bufs[ex->snap_buf[0]].space == CP_SPACE_HOST; }

/* What cp_exec_snapshot_finish does for the last two ways (on the host); then the update may go on. */
static int finish_host(cp_exec *ex, char *err, int errlen) {
    int rc = 0;
    if (on_host(ex)) copy_host(ex);
    else rc = copy_staged(ex, err, errlen);
    pthread_mutex_lock(&ex->snap_lock);
    ex->snap_host = false; /* also after a failure: the state is untouched, the writer reports it */
    pthread_cond_broadcast(&ex->snap_cond);
    pthread_mutex_unlock(&ex->snap_lock);
    return rc;
}

int cp_exec_snapshot_start(cp_exec *ex, const cp_exec_snap *dst, int *updates, char *err, int errlen) {
    const cp_plan *P = ex->P;
    if (P->C > 1) { /* the gathers: collectives, done now; only the writing rank keeps what they gather */
        size_t piece = dst->pinned && dst->piece > 0 ? (size_t)dst->piece : 0;
        int rc = exec_gather_full(ex, "master.f32", dst->w, piece, err, errlen);
        if (!rc) rc = exec_gather_full(ex, "adam_m.f32", dst->m, piece, err, errlen);
        if (!rc) rc = exec_gather_full(ex, "adam_v.f32", dst->v, piece, err, errlen);
        if (!rc && updates) *updates = ex->updates;
        return rc;
    }
    if (updates) *updates = ex->updates;
    if (!dst->w) return 0; /* a group of one GPU that does not write: nothing to copy */
    if (!dst->m || !dst->v) return cp_errf(err, errlen, "a checkpoint's snapshot needs all three arrays");
    if (prepare(ex, err, errlen)) return -1;
    /* a snapshot made on the host that cp_exec_snapshot_finish has not made yet (no update ran since: it would have
     * waited for it) is made first: snap_dst is about to name the next slot (the saver finishes snapshots in order) */
    pthread_mutex_lock(&ex->snap_lock);
    while (ex->snap_host) pthread_cond_wait(&ex->snap_cond, &ex->snap_lock);
    pthread_mutex_unlock(&ex->snap_lock);
    /* the step is over (cp_exec_step synchronised its streams): its update has written the state */
    ex->snap_dst = *dst;
    bool overlap = ex->snap_gate >= P->micro_steps;
    if (!on_host(ex) && prepare_gpu(ex, err, errlen)) return -1;
    if (!on_host(ex) && dst->pinned) {
        if (copy_pinned(ex, err, errlen)) return -1;
        ex->snap_gpu = true;
        if (!overlap) CK(cudaStreamSynchronize(ex->snap_stream), "copying the state to the checkpoint's snapshot");
        return 0;
    }
    pthread_mutex_lock(&ex->snap_lock);
    ex->snap_host = true;
    pthread_mutex_unlock(&ex->snap_lock);
    return overlap ? 0 : finish_host(ex, err, errlen);
}

int cp_exec_snapshot_finish(cp_exec *ex, char *err, int errlen) {
    if (ex->P->C > 1 || !ex->snap_ready) return 0;
    if (ex->snap_cuda) CK(cudaSetDevice(ex->dev), "selecting the GPU for the checkpoint's snapshot");
    pthread_mutex_lock(&ex->snap_lock);
    bool host = ex->snap_host;
    pthread_mutex_unlock(&ex->snap_lock);
    if (host) return finish_host(ex, err, errlen);
    if (ex->snap_cuda) CK(cudaEventSynchronize(ex->snap_done), "copying the state to the checkpoint's snapshot");
    return 0;
}

int exec_snap_gate(cp_exec *ex, int i, char *err, int errlen) {
    if (!ex->snap_ready || !writes_state(ex->P, ex->snap_buf, i)) return 0;
    if (ex->snap_gpu) { /* every stream, once: what follows the update may wait as well */
        for (int s = 0; s < CP_STREAM_COUNT; s++)
            CK(cudaStreamWaitEvent(ex->streams[s], ex->snap_done, 0), "waiting for the checkpoint's snapshot");
        ex->snap_gpu = false;
    }
    pthread_mutex_lock(&ex->snap_lock);
    if (ex->snap_host) {
        double t0 = cp_now();
        while (ex->snap_host) pthread_cond_wait(&ex->snap_cond, &ex->snap_lock);
        ex->snap_waited += cp_now() - t0;
    }
    pthread_mutex_unlock(&ex->snap_lock);
    return 0;
}
