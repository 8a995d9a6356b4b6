/* eval.h: the validation loss of `cpgen run`: after every train.eval_every-th step and after the last, the forward of
 * train.eval_sequences sequences of data.val (the same ones each time, from the start of the held-out stream), on
 * every rank of the run, as the step line's "val loss", metrics.jsonl's "val_loss" and "val_tokens", and the
 * end-of-run line. The executor runs it (cp_exec_eval, runtime/exec_eval.c); this file decides when, reads the data
 * and reports. With replica groups each group evaluates its share of the sequences (group g sequences g, g + R, ...
 * of the stream, as in training) and the loss is summed across the run, weighted by target tokens. */
#ifndef CP_EVAL_H
#define CP_EVAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "data.h"
#include "doc_inputs.h"
#include "exec.h"
#include "plan.h"

typedef struct {
    bool on;                   /* train.eval_every > 0 */
    int every, steps;          /* train.eval_every, train.steps */
    int rounds;                /* sequences per group: train.eval_sequences / parallel.replicas */
    int mb;                    /* the most sequences one cp_exec_eval takes: train.micro_batches */
    int64_t T;                 /* tokens per rank of a sequence */
    cp_dataset data;           /* data.val, rewound before each evaluation */
    cp_data_slice slice;       /* this rank's part of each sequence */
    int32_t *tok, *tgt;        /* [mb][T] */
    cp_doc_inputs docs;        /* packed documents' inputs of the sequences read (plan->docs, doc_positions) */
    const cp_plan *P;
    int last_step;             /* the step after which the last evaluation ran (0: none yet) */
    double last_loss;
} cp_eval;

/* One evaluation's outcome, for the step it followed. */
typedef struct {
    bool done;       /* an evaluation ran after this step */
    double loss;     /* mean cross-entropy over its target tokens (NaN where there were none) */
    int64_t tokens;  /* its target tokens, every group's */
    double seconds;  /* its wall time */
} cp_eval_result;

/* Ready the evaluations of the plan's run for the rank `slice` places (nothing to do when train.eval_every is 0):
 * data.val opened (cp_dataset_open_val). out (the run's lead rank; NULL elsewhere) gets one line saying what will be
 * evaluated. Returns 0, or -1 with a message. */
int cp_eval_open(cp_eval *ev, const cp_plan *P, const cp_data_slice *slice, FILE *out, char *err, int errlen);
void cp_eval_close(cp_eval *ev);

/* Whether an evaluation follows step `step` (counted from 1): every `every`-th and the last. */
bool cp_eval_due(const cp_eval *ev, int step);
/* After step `step`: evaluate if it is due (every rank of the run calls it after every step), else r->done = false.
 * Returns 0, or -1 with a message. */
int cp_eval_after(cp_eval *ev, cp_exec *ex, int step, cp_eval_result *r, char *err, int errlen);

/* What the run prints and logs of it: " | val loss X" for the step line,
 * "\"val_loss\":X,\"val_tokens\":N,\"val_seconds\":S," for the step's metrics line (nothing where r->done is false),
 * and " | val loss X (after step K)" for the end-of-run line (nothing before the first evaluation). */
const char *cp_eval_step_text(const cp_eval_result *r, char *buf, size_t n);
void cp_eval_metrics(FILE *f, const cp_eval_result *r);
const char *cp_eval_done_text(const cp_eval *ev, char *buf, size_t n);

#endif
