/* plan_eval.h: the validation loss as the plan sees it. An evaluation runs the forward of a micro-batch up to and
 * including its loss sum on the training step's own layout, buffers and offsets: which of those steps it runs, the
 * proof that they leave the training state as it was, and what it costs. The runtime's side is runtime/exec_eval.c
 * (the steps run) and runtime/eval.c (when, on which data, and what is reported). */
#ifndef CP_PLAN_EVAL_H
#define CP_PLAN_EVAL_H

#include <stdbool.h>
#include <stdio.h>

#include "plan.h"

typedef struct {
    int end;        /* the micro-batch's loss sum (CP_TASK_LOSS_SUM): an evaluation walks steps [0, end] */
    bool *run;      /* [end + 1]: the steps it runs: those the loss sum depends on. The others (the loss tiles' weight
                     * and input gradients, the gradient buffers' clearing, the copies of checkpoints and kept
                     * attention outputs to the host) only take their waits and record their events, so the order
                     * between streams that cp_exec_check proves for the step holds for the evaluation too */
    int nrun;       /* steps run, as the plan holds them (a folded loop's body once) */
    double seconds; /* predicted time of one micro-batch's evaluation on a rank, by the step's cost model */
} cp_plan_eval;

/* The evaluation of a plan (flat or folded). Returns 0, or -1 with a message when the plan has no loss sum or when
 * what the loss depends on would touch the training state: a step of the backward or the optimizer, a write to a
 * persistent buffer other than the step's scalars and the GEMM workspace (parameters, master weights, moments,
 * gradients), or a read of a buffer that no step it runs wrote first. Each is a planner bug, so every plan that
 * cp_exec_check passes is checked too. Free with cp_plan_eval_free. */
int cp_plan_eval_of(const cp_plan *P, cp_plan_eval *e, char *err, int errlen);
void cp_plan_eval_free(cp_plan_eval *e);

/* Evaluations in a run of the spec: after every train.eval_every-th step and after the last (0 when it never
 * evaluates). */
int cp_plan_eval_count(const cp_spec *s);
/* Predicted seconds of one evaluation: each group's share of train.eval_sequences (replicas split them), micro-batch
 * by micro-batch, and the sum of the loss across the ranks. */
double cp_plan_eval_seconds(const cp_plan *P, const cp_plan_eval *e);

/* The plan's lines on evaluation (nothing when train.eval_every is 0): "evaluation: forward of N sequences every K
 * steps, within the step's memory, predicted X s" and the run's predicted time with the evaluations counted; as
 * text, or as the members of the JSON object "evaluation". */
void cp_plan_eval_print(const cp_plan *P, FILE *out);
void cp_plan_eval_print_json(const cp_plan *P, FILE *out);

#endif
