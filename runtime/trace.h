/* trace.h: the step trace (`cpgen run SPEC --trace FILE`): one training step as a Chrome trace-event JSON file that
 * Perfetto and chrome://tracing open. Per rank one process with a track per stream (compute, communication, host
 * copies), every plan step of the step as a slice, the waits between streams as flows, and a counter of the GPU
 * memory the plan has in use; beside it a process "predicted" with the cost model's timeline of the same steps.
 * The writer works from step times (measured on the GPU by the recorder below, or made up by a test); with several
 * GPUs every rank writes FILE.rank<N> and rank 0 merges them into FILE. tools/trace_check.py checks a file. */
#ifndef CP_TRACE_H
#define CP_TRACE_H

#include <cuda_runtime_api.h>

#include "plan.h"

/* Plan step `step` waits, on its stream, for plan step `after` of another stream, in the same micro-batch (or both
 * in the optimizer). */
typedef struct {
    int step, after;
} cp_trace_wait;

/* The step's plan steps as they run: every micro-batch's steps, then the optimizer's once. Instance of plan step i
 * in micro-batch mb (mb is 0 for the optimizer's steps, i >= micro_steps): */
int cp_trace_instances(const cp_plan *P);
int cp_trace_instance(const cp_plan *P, int mb, int i);

/* One rank's step. start and end are seconds from the step's start, per instance; start < 0: the instance did not
 * run (the optimizer's update skipped on a non-finite loss). */
typedef struct {
    int rank;
    int step;                  /* the training step traced, counted from 1 */
    double step_seconds;       /* the step line's time: the measured total must come within 2% of it */
    const double *start, *end; /* [cp_trace_instances(P)] */
    const cp_trace_wait *waits;
    int nwaits;
} cp_trace_rank;

/* A timeline of the instances from a time per plan step (seconds[i]): each starts when its stream is free and the
 * steps it waits for have ended; all streams join at each micro-batch and before the optimizer, as the executor
 * joins them. With the cost model's times this is the predicted timeline. */
void cp_trace_schedule(const cp_plan *P, const cp_trace_wait *waits, int nwaits, const double *seconds, double *start,
                       double *end);

/* One rank's trace, a complete trace file on its own, written atomically (temporary file, then rename); with
 * rank 0 it holds the predicted process too. Returns 0, or -1 with a message. */
int cp_trace_write(const cp_plan *P, const cp_trace_rank *r, const char *path, char *err, int errlen);

/* Where rank `rank` writes its part of a trace of several GPUs: "<path>.rank<rank>". */
void cp_trace_part_path(const char *path, int rank, char *out, size_t n);

/* Rank 0's merge: waits up to timeout_s for every rank's part, writes one file with one process per rank to path
 * (atomically) and removes the parts. Returns 0, or -1 with a message (the parts are left where they are). */
int cp_trace_merge(const char *path, int ranks, double timeout_s, char *err, int errlen);

/* Whether a file starting with these n bytes is a trace cpgen wrote (a whole trace or a rank's part). */
bool cp_trace_is_ours(const char *head, size_t n, const void *ctx);

/* Before a run: that the trace's folder exists and can be written, and that a file already at path is a trace cpgen
 * wrote (nothing else is replaced), so that a long run does not fail at its end. */
int cp_trace_check_path(const char *path, char *err, int errlen);

/* ---------------------------------------------------------------- recording on the GPU */

typedef struct cp_trace_rec cp_trace_rec;

/* Two timing events per instance and one at the step's start. NULL with a message in err. */
cp_trace_rec *cp_trace_rec_create(const cp_plan *P, char *err, int errlen);
void cp_trace_rec_free(cp_trace_rec *tr);
/* At the start of the step traced, on the compute stream while it is idle: time 0 of the trace. */
cudaError_t cp_trace_rec_start(cp_trace_rec *tr, cudaStream_t st);
/* Around instance k on its stream: begin after the step's waits were enqueued, end after its work. */
cudaError_t cp_trace_rec_begin(cp_trace_rec *tr, int k, cudaStream_t st);
cudaError_t cp_trace_rec_end(cp_trace_rec *tr, int k, cudaStream_t st);
/* After the step finished: start and end of every instance in seconds from the start (start < 0: not recorded). */
int cp_trace_rec_read(cp_trace_rec *tr, double *start, double *end, char *err, int errlen);

#endif
