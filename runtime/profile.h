/* profile.h: one training step timed step by step (CUDA events around every plan step of the first micro-batch and
 * of the optimizer), summed by what the step does and set beside the cost model's prediction. */
#ifndef CP_PROFILE_H
#define CP_PROFILE_H

#include <cuda_runtime.h>
#include <stdio.h>

#include "plan.h"

/* Two timing events around each of n pieces of work on their streams (begin at 2k, end at 2k + 1), and which of
 * them were recorded since the last clear: what the profile and the step trace (trace_rec.c) measure with. */
typedef struct {
    int n;
    cudaEvent_t *ev;
    unsigned char *recorded;
} cp_event_pairs;

/* 0, or -1 with "<what>: <the CUDA error>" in err (ep is then freed). */
int cp_event_pairs_create(cp_event_pairs *ep, int n, const char *what, char *err, int errlen);
void cp_event_pairs_free(cp_event_pairs *ep);
cudaError_t cp_event_pairs_begin(cp_event_pairs *ep, int k, cudaStream_t st);
cudaError_t cp_event_pairs_end(cp_event_pairs *ep, int k, cudaStream_t st);
/* Forgets what was recorded, before the next step measured. */
void cp_event_pairs_clear(cp_event_pairs *ep);

typedef struct cp_profile cp_profile;

/* The steps of one kind ("gemm q_proj", "all_to_all a2a_q") on one stream, summed. */
typedef struct {
    char key[64];
    int stream, count;
    double measured, predicted; /* seconds */
} cp_profile_row;

/* Events for the plan's steps; NULL with a message in err. */
cp_profile *cp_profile_create(const cp_plan *P, char *err, int errlen);
void cp_profile_free(cp_profile *pf);
/* Around plan step i on stream st: begin after the step's waits were enqueued, end after its work. */
cudaError_t cp_profile_begin(cp_profile *pf, int i, cudaStream_t st);
cudaError_t cp_profile_end(cp_profile *pf, int i, cudaStream_t st);
/* After the step finished: measured and predicted time per kind of step and per stream, the largest first. */
int cp_profile_report(cp_profile *pf, double step_seconds, int micro_batches, FILE *out, char *err, int errlen);

/* The sums behind the report, from measured seconds per plan step (< 0: not timed): rows by kind of step, the
 * largest measured first (*rows owned by the caller), and per stream the measured and predicted seconds. Returns the
 * number of rows. */
int cp_profile_sum(const cp_plan *P, const double *measured, cp_profile_row **rows, double busy[CP_STREAM_COUNT],
                   double busy_predicted[CP_STREAM_COUNT]);

#endif
