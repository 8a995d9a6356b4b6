/* profile.c: one training step timed step by step (CPGEN_PROFILE=N times step N). Each plan step of the first
 * micro-batch and of the optimizer is bracketed by two events on its own stream, so a collective's time includes its
 * wait for the peers and a copy's its transfer; the sums by kind of step and by stream are printed beside the cost
 * model's, which is what the model is calibrated against. */
#include "profile.h"

#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "util.h"

int cp_event_pairs_create(cp_event_pairs *ep, int n, const char *what, char *err, int errlen) {
    ep->n = n;
    ep->ev = cp_xcalloc(2 * (size_t)n, sizeof *ep->ev);
    ep->recorded = cp_xcalloc((size_t)n, 1);
    cudaError_t e = cudaSuccess;
    for (int k = 0; k < 2 * n && e == cudaSuccess; k++) e = cudaEventCreate(&ep->ev[k]);
    if (e == cudaSuccess) return 0;
    cp_cuda_errmsg(e, what, err, errlen);
    cp_event_pairs_free(ep);
    return -1;
}

void cp_event_pairs_free(cp_event_pairs *ep) {
    for (int k = 0; ep->ev && k < 2 * ep->n; k++)
        if (ep->ev[k]) (void)cudaEventDestroy(ep->ev[k]);
    free(ep->ev);
    free(ep->recorded);
    *ep = (cp_event_pairs){0};
}

cudaError_t cp_event_pairs_begin(cp_event_pairs *ep, int k, cudaStream_t st) {
    ep->recorded[k] = 1;
    return cudaEventRecord(ep->ev[2 * k], st);
}

cudaError_t cp_event_pairs_end(cp_event_pairs *ep, int k, cudaStream_t st) {
    return cudaEventRecord(ep->ev[2 * k + 1], st);
}

void cp_event_pairs_clear(cp_event_pairs *ep) { memset(ep->recorded, 0, (size_t)ep->n); }

struct cp_profile {
    const cp_plan *P;
    cp_event_pairs ev; /* one pair per plan step */
};

cp_profile *cp_profile_create(const cp_plan *P, char *err, int errlen) {
    cp_profile *pf = cp_xcalloc(1, sizeof *pf);
    pf->P = P;
    if (cp_event_pairs_create(&pf->ev, P->nsteps, "creating the profile's events (CPGEN_PROFILE)", err, errlen)) {
        free(pf);
        return NULL;
    }
    return pf;
}

void cp_profile_free(cp_profile *pf) {
    if (!pf) return;
    cp_event_pairs_free(&pf->ev);
    free(pf);
}

cudaError_t cp_profile_begin(cp_profile *pf, int i, cudaStream_t st) { return cp_event_pairs_begin(&pf->ev, i, st); }

cudaError_t cp_profile_end(cp_profile *pf, int i, cudaStream_t st) { return cp_event_pairs_end(&pf->ev, i, st); }

static int by_measured(const void *a, const void *b) {
    double x = ((const cp_profile_row *)a)->measured, y = ((const cp_profile_row *)b)->measured;
    return (x < y) - (x > y);
}

int cp_profile_sum(const cp_plan *P, const double *measured, cp_profile_row **rows_out, double busy[CP_STREAM_COUNT],
                   double busy_predicted[CP_STREAM_COUNT]) {
    int n = 0, cap = 64;
    cp_profile_row *rows = cp_xmalloc((size_t)cap * sizeof *rows);
    for (int k = 0; k < CP_STREAM_COUNT; k++) busy[k] = busy_predicted[k] = 0;
    for (int i = 0; i < P->nsteps; i++) {
        if (measured[i] < 0) continue;
        const cp_step *s = &P->steps[i];
        char key[64];
        snprintf(key, sizeof key, "%s %s", cp_opkind_name(s->kind), s->what);
        int r = 0;
        while (r < n && (rows[r].stream != (int)s->stream || strcmp(rows[r].key, key))) r++;
        if (r == n) {
            if (n == cap) rows = cp_xrealloc(rows, (size_t)(cap *= 2) * sizeof *rows);
            memset(&rows[n], 0, sizeof rows[n]);
            snprintf(rows[n].key, sizeof rows[n].key, "%s", key);
            rows[n++].stream = (int)s->stream;
        }
        rows[r].count++;
        rows[r].measured += measured[i];
        rows[r].predicted += s->seconds;
        busy[s->stream] += measured[i];
        busy_predicted[s->stream] += s->seconds;
    }
    qsort(rows, (size_t)n, sizeof *rows, by_measured);
    *rows_out = rows;
    return n;
}

int cp_profile_report(cp_profile *pf, double step_seconds, int micro_batches, FILE *out, char *err, int errlen) {
    static const char *streams[CP_STREAM_COUNT] = {"compute", "comm", "copy"};
    enum { SHOWN = 24 };
    const cp_plan *P = pf->P;
    double *measured = cp_xmalloc((size_t)P->nsteps * sizeof *measured);
    for (int i = 0; i < P->nsteps; i++) {
        float ms = 0;
        bool timed = pf->ev.recorded[i];
        cudaError_t e = timed ? cudaEventElapsedTime(&ms, pf->ev.ev[2 * i], pf->ev.ev[2 * i + 1]) : cudaSuccess;
        if (e != cudaSuccess) {
            free(measured);
            return cp_cuda_errmsg(e, "reading the profile's events", err, errlen);
        }
        measured[i] = timed ? ms / 1e3 : -1;
    }
    cp_event_pairs_clear(&pf->ev);
    cp_profile_row *rows;
    double busy[CP_STREAM_COUNT], busy_pred[CP_STREAM_COUNT];
    int n = cp_profile_sum(P, measured, &rows, busy, busy_pred);
    free(measured);
    fprintf(out, "\nprofile of the step (%.2f s): every plan step of %s the optimizer, between events on its stream\n",
            step_seconds, micro_batches > 1 ? "micro-batch 1 and of" : "the micro-batch and of");
    fprintf(out, "  %-8s %12s %12s   (time with work queued on the stream, overlap included)\n", "stream", "measured",
            "predicted");
    for (int k = 0; k < CP_STREAM_COUNT; k++)
        if (busy[k] > 0 || busy_pred[k] > 0)
            fprintf(out, "  %-8s %11.3f s %11.3f s\n", streams[k], busy[k], busy_pred[k]);
    fprintf(out, "  %-34s %-8s %7s %12s %12s %7s\n", "kind of step", "stream", "count", "measured", "predicted",
            "ratio");
    double rest = 0, rest_pred = 0;
    for (int r = 0; r < n; r++) {
        if (r >= SHOWN) {
            rest += rows[r].measured, rest_pred += rows[r].predicted;
            continue;
        }
        fprintf(out, "  %-34s %-8s %7d %11.3f s %11.3f s %7.2f\n", rows[r].key, streams[rows[r].stream], rows[r].count,
                rows[r].measured, rows[r].predicted, rows[r].predicted > 0 ? rows[r].measured / rows[r].predicted : 0);
    }
    if (n > SHOWN) fprintf(out, "  %-34s %-8s %7s %11.3f s %11.3f s\n", "(the other kinds)", "", "", rest, rest_pred);
    fflush(out);
    free(rows);
    return 0;
}
