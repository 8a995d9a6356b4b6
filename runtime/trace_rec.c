/* trace_rec.c: the step trace's measurements (trace.h): a timing event recorded on each plan step's stream before
 * and after its work, for every micro-batch and the optimizer, read against one event recorded at the step's start,
 * so the slices of all streams lie on one time axis. Slices on one stream cannot overlap: a stream runs its work in
 * order, and the events are taken in that order. */
#include "trace.h"

#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "util.h"

struct cp_trace_rec {
    int n;              /* instances */
    cudaEvent_t origin; /* the step's start */
    cudaEvent_t *ev;    /* begin, end of instance k at 2k, 2k + 1 */
    unsigned char *recorded;
};

cp_trace_rec *cp_trace_rec_create(const cp_plan *P, char *err, int errlen) {
    cp_trace_rec *tr = cp_xcalloc(1, sizeof *tr);
    tr->n = cp_trace_instances(P);
    tr->ev = cp_xcalloc(2 * (size_t)tr->n, sizeof *tr->ev);
    tr->recorded = cp_xcalloc((size_t)tr->n, 1);
    cudaError_t e = cudaEventCreate(&tr->origin);
    for (int k = 0; k < 2 * tr->n && e == cudaSuccess; k++) e = cudaEventCreate(&tr->ev[k]);
    if (e != cudaSuccess) {
        cp_cuda_errmsg(e, "creating the step trace's events (--trace)", err, errlen);
        cp_trace_rec_free(tr);
        return NULL;
    }
    return tr;
}

void cp_trace_rec_free(cp_trace_rec *tr) {
    if (!tr) return;
    if (tr->origin) (void)cudaEventDestroy(tr->origin);
    for (int k = 0; k < 2 * tr->n; k++)
        if (tr->ev[k]) (void)cudaEventDestroy(tr->ev[k]);
    free(tr->ev);
    free(tr->recorded);
    free(tr);
}

cudaError_t cp_trace_rec_start(cp_trace_rec *tr, cudaStream_t st) {
    memset(tr->recorded, 0, (size_t)tr->n);
    return cudaEventRecord(tr->origin, st);
}

cudaError_t cp_trace_rec_begin(cp_trace_rec *tr, int k, cudaStream_t st) {
    tr->recorded[k] = 1;
    return cudaEventRecord(tr->ev[2 * k], st);
}

cudaError_t cp_trace_rec_end(cp_trace_rec *tr, int k, cudaStream_t st) { return cudaEventRecord(tr->ev[2 * k + 1], st); }

int cp_trace_rec_read(cp_trace_rec *tr, double *start, double *end, char *err, int errlen) {
    for (int k = 0; k < tr->n; k++) {
        start[k] = end[k] = -1;
        if (!tr->recorded[k]) continue;
        float a, b;
        cudaError_t e = cudaEventElapsedTime(&a, tr->origin, tr->ev[2 * k]);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&b, tr->origin, tr->ev[2 * k + 1]);
        if (e != cudaSuccess) return cp_cuda_errmsg(e, "reading the step trace's events", err, errlen);
        start[k] = a / 1e3;
        end[k] = b / 1e3;
    }
    return 0;
}
