/* snapshot.c: the host arrays of a checkpoint's snapshot (snapshot.h), one set per slot: reserved at once, made
 * resident and pinned by background threads while training starts, the first slot's first. */
#include "snapshot.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "util.h"
#include "weights.h"

struct cp_snapbuf {
    int device;
    size_t n;        /* bytes of each array */
    size_t span;     /* bytes reserved for each (n rounded up to the page) */
    int slots;       /* plan->ckpt_slots */
    int narrays;     /* 3 per slot */
    char *base[6];   /* w, m, v of slot 0, then of slot 1 */
    bool pin_asked;  /* the plan asked for pinned arrays (what the background threads read) */
    bool pin[2];     /* the slot's arrays are pinned: asked, and not given up on by cp_snapbuf_get */
    int npieces;     /* pieces per array */
    bool *pinned;    /* [narrays * npieces]: cudaHostRegister succeeded */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int left[2];     /* pieces of the slot not done yet */
    cudaError_t pin_error;
    void *staging;   /* pinned, for pageable arrays filled from the GPU */
    int64_t staging_bytes;
    bool staged;     /* pageable arrays are filled from the GPU: a staging buffer is needed */
    atomic_int next;  /* the next piece a background thread takes */
    pthread_t bg;
    bool bg_running;
    double bg_seconds;
    bool noted;
};

/* Make one piece resident (and pinned when asked). */
static void make_piece(cp_snapbuf *b, int p) {
    long pg = sysconf(_SC_PAGESIZE);
    int k = p / b->npieces, q = p % b->npieces;
    size_t at = (size_t)q * (size_t)CP_SNAP_PIECE, len = CP_MIN((size_t)CP_SNAP_PIECE, b->span - at);
    char *ptr = b->base[k] + at;
    if (b->pin_asked) {
        cudaError_t e = cudaHostRegister(ptr, len, cudaHostRegisterPortable);
        b->pinned[p] = e == cudaSuccess;
        if (e == cudaSuccess) return;
        b->pin_error = e;
        (void)cudaGetLastError();
    }
    /* pageable: every page touched now, so that the first snapshot does not take the page faults */
#ifdef MADV_POPULATE_WRITE
    if (madvise(ptr, len, MADV_POPULATE_WRITE) == 0) return;
#endif
    for (size_t o = 0; o < len; o += (size_t)(pg > 0 ? pg : 4096)) ptr[o] = 0;
}

/* Piece by piece as the threads take them: piece p is piece p % npieces of array p / npieces, so the first slot's
 * are taken first (the first save needs only those). */
static void *worker_thread(void *arg) {
    cp_snapbuf *b = arg;
    if (b->pin_asked) (void)cudaSetDevice(b->device);
    for (int p; (p = atomic_fetch_add(&b->next, 1)) < b->narrays * b->npieces;) {
        make_piece(b, p);
        pthread_mutex_lock(&b->lock);
        if (--b->left[p / b->npieces / 3] == 0) pthread_cond_broadcast(&b->cond);
        pthread_mutex_unlock(&b->lock);
    }
    return NULL;
}

static void *bg_thread(void *arg) {
    cp_snapbuf *b = arg;
    double t0 = cp_now();
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    /* a few threads: the kernel's page clearing and the driver's pinning scale with them; training keeps the rest */
    enum { MOST = 8 };
    int nt = (int)CP_MAX(1, CP_MIN(MOST, cores / 2)), started = 0;
    pthread_t th[MOST];
    for (int t = 1; t < nt; t++)
        if (pthread_create(&th[started], NULL, worker_thread, b) == 0) started++;
    worker_thread(b);
    for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
    b->bg_seconds = cp_now() - t0;
    return NULL;
}

int cp_snapbuf_create(cp_snapbuf **out, const cp_plan *P, int device, char *err, int errlen) {
    *out = NULL;
    if (P->ckpt_snap != CP_SNAP_PINNED && P->ckpt_snap != CP_SNAP_PAGEABLE)
        return cp_errf(err, errlen, "the plan has no snapshot arrays (%s)", cp_snap_kind_name(P->ckpt_snap));
    cp_snapbuf *b = cp_xcalloc(1, sizeof *b);
    long pg = sysconf(_SC_PAGESIZE);
    size_t page = (size_t)(pg > 0 ? pg : 4096);
    b->device = device;
    b->n = sizeof(float) * (size_t)cp_weights_elems(P);
    b->span = (b->n + page - 1) / page * page;
    b->slots = P->ckpt_slots == 2 ? 2 : 1;
    b->narrays = 3 * b->slots;
    b->pin_asked = b->pin[0] = b->pin[1] = P->ckpt_snap == CP_SNAP_PINNED;
    b->staged = P->C == 1 && !P->opt_on_host; /* pageable arrays filled from one GPU pass through staging */
    b->npieces = (int)((b->span + (size_t)CP_SNAP_PIECE - 1) / (size_t)CP_SNAP_PIECE);
    b->pinned = cp_xcalloc((size_t)(b->narrays * b->npieces), sizeof *b->pinned);
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
    for (int q = 0; q < b->slots; q++) b->left[q] = 3 * b->npieces;
    atomic_init(&b->next, 0);
    for (int k = 0; k < b->narrays; k++) {
        void *p = mmap(NULL, b->span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            char a[32];
            int e = errno;
            cp_snapbuf_destroy(b);
            return cp_errf(err, errlen, "reserving %s of host memory for a checkpoint's snapshot failed: %s",
                           cp_fmt_bytes((int64_t)b->span, a, sizeof a), strerror(e));
        }
        b->base[k] = p;
    }
    b->bg_running = pthread_create(&b->bg, NULL, bg_thread, b) == 0;
    if (!b->bg_running) bg_thread(b);
    *out = b;
    return 0;
}

int cp_snapbuf_get(cp_snapbuf *b, int slot, cp_exec_snap *dst, double *waited, char *note, int notelen, char *err,
                   int errlen) {
    if (slot < 0 || slot >= b->slots)
        return cp_errf(err, errlen, "a checkpoint's snapshot asked for slot %d of %d (a cpgen bug)", slot, b->slots);
    double t0 = cp_now();
    pthread_mutex_lock(&b->lock);
    bool waiting = b->left[slot] > 0;
    while (b->left[slot] > 0) pthread_cond_wait(&b->cond, &b->lock);
    pthread_mutex_unlock(&b->lock);
    if (waited) *waited = waiting ? cp_now() - t0 : 0;
    if (note && notelen > 0) note[0] = 0;
    int first = 3 * slot * b->npieces, end = first + 3 * b->npieces;
    bool pinned = b->pin[slot];
    for (int p = first; p < end && pinned; p++) pinned = b->pinned[p];
    if (b->pin[slot] && !pinned) { /* pageable after all: unpin what was pinned, staged from now on */
        for (int p = first; p < end; p++)
            if (b->pinned[p]) {
                (void)cudaHostUnregister(b->base[p / b->npieces] + (size_t)(p % b->npieces) * (size_t)CP_SNAP_PIECE);
                b->pinned[p] = false;
            }
        b->pin[slot] = false;
        b->staged = true;
        if (note && !b->noted)
            snprintf(note, (size_t)notelen, "pinning the checkpoint's snapshot failed (%s): it is pageable and "
                     "copied through a staging buffer, more slowly", cudaGetErrorString(b->pin_error));
        b->noted = true;
    }
    if (!b->pin[slot] && b->staged && !b->staging) {
        cudaError_t e = cudaHostAlloc(&b->staging, (size_t)CP_SNAP_STAGING, cudaHostAllocPortable);
        if (e != cudaSuccess) {
            b->staging = NULL;
            return cp_cuda_errmsg(e, "pinning the staging buffer of a checkpoint's snapshot", err, errlen);
        }
        b->staging_bytes = CP_SNAP_STAGING;
    }
    char **a = &b->base[3 * slot];
    *dst = (cp_exec_snap){.w = (float *)a[0], .m = (float *)a[1], .v = (float *)a[2], .pinned = b->pin[slot],
                          .piece = CP_SNAP_PIECE, .staging = b->staging, .staging_bytes = b->staging_bytes};
    return 0;
}

void cp_snapbuf_destroy(cp_snapbuf *b) {
    if (!b) return;
    if (b->bg_running) pthread_join(b->bg, NULL);
    for (int p = 0; p < b->narrays * b->npieces; p++)
        if (b->pinned && b->pinned[p])
            (void)cudaHostUnregister(b->base[p / b->npieces] + (size_t)(p % b->npieces) * (size_t)CP_SNAP_PIECE);
    if (b->staging) (void)cudaFreeHost(b->staging);
    for (int k = 0; k < b->narrays; k++)
        if (b->base[k]) munmap(b->base[k], b->span);
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->cond);
    free(b->pinned);
    free(b);
}
