/* step_grads.h: one training step's gradients at given weights, as the executor computes them, for the GPU tests
 * that compare gradients (test_train_tiny's export for transformers, test_fp8_grads's recipes against bf16). */
#ifndef STEP_GRADS_H
#define STEP_GRADS_H

#include "plan.h"

/* The fp32 gradients of the mean loss over step `step`'s sequences of the plan's data stream (every micro-batch;
 * the stream's first `step` steps skipped), at the weights `flat` (cp_weights_elems floats, cp_exec_load_weights's
 * layout), into grads (the same layout; it may be flat), and that step's mean loss into *loss. Packed documents are
 * staged as a training step stages them. One GPU; failures fail the test (gu_fail). */
void step_grads(const cp_plan *p, const float *flat, int step, float *grads, double *loss);

#endif
