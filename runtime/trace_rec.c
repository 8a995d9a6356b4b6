/* trace_rec.c: the step trace's measurements (trace.h): a timing event recorded on each plan step's stream before
 * and after its work, for every micro-batch and the optimizer, read against one event recorded at the step's start,
 * so the slices of all streams lie on one time axis. Slices on one stream cannot overlap: a stream runs its work in
 * order, and the events are taken in that order. */
#include "trace.h"

#include <stdlib.h>

#include "cuda_check.h"
#include "profile.h"
#include "util.h"

struct cp_trace_rec {
    cudaEvent_t origin; /* the step's start */
    cp_event_pairs ev;  /* one pair per instance */
};

cp_trace_rec *cp_trace_rec_create(const cp_plan *P, char *err, int errlen) {
    static const char what[] = "creating the step trace's events (--trace)";
    cp_trace_rec *tr = cp_xcalloc(1, sizeof *tr);
    cudaError_t e = cudaEventCreate(&tr->origin);
    if (e != cudaSuccess) cp_cuda_errmsg(e, what, err, errlen);
    if (e != cudaSuccess || cp_event_pairs_create(&tr->ev, cp_trace_instances(P), what, err, errlen)) {
        cp_trace_rec_free(tr);
        return NULL;
    }
    return tr;
}

void cp_trace_rec_free(cp_trace_rec *tr) {
    if (!tr) return;
    if (tr->origin) (void)cudaEventDestroy(tr->origin);
    cp_event_pairs_free(&tr->ev);
    free(tr);
}

cudaError_t cp_trace_rec_start(cp_trace_rec *tr, cudaStream_t st) {
    cp_event_pairs_clear(&tr->ev);
    return cudaEventRecord(tr->origin, st);
}

cudaError_t cp_trace_rec_begin(cp_trace_rec *tr, int k, cudaStream_t st) {
    return cp_event_pairs_begin(&tr->ev, k, st);
}

cudaError_t cp_trace_rec_end(cp_trace_rec *tr, int k, cudaStream_t st) { return cp_event_pairs_end(&tr->ev, k, st); }

int cp_trace_rec_read(cp_trace_rec *tr, double *start, double *end, char *err, int errlen) {
    for (int k = 0; k < tr->ev.n; k++) {
        start[k] = end[k] = -1;
        if (!tr->ev.recorded[k]) continue;
        float a, b;
        cudaError_t e = cudaEventElapsedTime(&a, tr->origin, tr->ev.ev[2 * k]);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&b, tr->origin, tr->ev.ev[2 * k + 1]);
        if (e != cudaSuccess) return cp_cuda_errmsg(e, "reading the step trace's events", err, errlen);
        start[k] = a / 1e3;
        end[k] = b / 1e3;
    }
    return 0;
}
