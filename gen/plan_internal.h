/* plan_internal.h: the passes over a built program that plan.c and plan_fold.c run (gen/plan_mem.c), and the fit
 * test --max-seq searches with (gen/plan.c), open to the tests. */
#ifndef CP_PLAN_INTERNAL_H
#define CP_PLAN_INTERNAL_H

#include "plan.h"

/* Index of the plan's module for k, adding it if new; takes ownership of k's values. */
int cp_plan_module_of(cp_plan *P, cp_kernel_spec *k);
/* A new buffer of the plan (no lifetime yet, offset unassigned); its index. */
int cp_plan_add_buf(cp_plan *P, const char *name, cp_space space, cp_cat cat, int64_t bytes, bool persistent);

/* train.precision = "fp8" (gen/plan_fp8.c): whether step s is a GEMM that runs on FP8 inputs (a layer's, its sizes
 * multiples of 16, and k of 128 with block scales; not a weight's gradient with train.fp8_weight_grads = "bf16", nor
 * an input's with train.fp8_input_grads = "bf16"),
 * and the pass that puts each such GEMM on FP8 copies of its inputs, with the casts before it, their buffers and a
 * module for them. Runs on the built program before its lifetimes (nothing without fp8). */
bool cp_plan_fp8_eligible(const cp_train *t, const cp_step *s);
/* The FP8 GEMM an eligible step of plan P runs: the x W^T form on its inputs' copies, E4M3 (E5M2 for a backward
 * GEMM's gradient, its first input: cp_gemm.a_grad, unless train.fp8_format = "e4m3"); with train.fp8_scaling =
 * "block" a weight's scales per 128 x 128 tile and any other input's per 128 elements of k, else one per tensor and
 * fast accumulation where train.fp8_fast_accum asks (the forward's by default, dX's where asked, dW's never). */
cp_gemm cp_plan_fp8_gemm(const cp_plan *P, const cp_step *s);
/* Where the generator's FP8 GEMM kernel measured faster than cuBLASLt's block-scaled GEMMs inside the training step
 * (the 3B at 32K traced on an H200, docs/PERF.md, 2026-12-03, afternoon): the weights' gradients of 3072 rows or more
 * with k (the tokens) from 8192 to 32768, 6-14% (d_wdown, d_wgate, d_wup 46.2-46.5 ms a step against 48.6-48.7; d_wq,
 * d_wo 17.8-18.0 against 20.5-20.8); not those of 1024 rows (723 TF/s against 868-906 alone). Alone (bench_gemm) it
 * also outran cuBLASLt on down and the MLP's dX GEMMs (k = 8192), but not inside the step (38.0-40.0 ms against
 * 36.0-39.8), and on the 8B's weights' gradients at 128K (k = 131072) it is slower on some (d_wo 779 TF/s against
 * 928): cuBLASLt runs those. */
bool cp_plan_fp8_kernel_wins(const cp_gemm *g);
/* Whether kernel step s of plan P can do the FP8 work on its output operand op as it writes it (cp_step.fp8_out):
 * with copy = CP_GEMM_SCALE_TENSOR take its amax (rmsnorm's out and dx, SwiGLU's out, dgate and dup, the attention
 * output's unpacked rows); with CP_GEMM_SCALE_1D write its copy with 1 x 128 scales (the same and rope's backward dq
 * and dk, where the kernel's geometry allows: cp_k_fp8_copies); with CP_GEMM_SCALE_ROW its copy with a scale per row
 * and the transposed copy's column maxima (rmsnorm's: cp_k_fp8_row_copies). */
bool cp_plan_fp8_producer(const cp_plan *P, const cp_step *s, int op, uint8_t copy);
void cp_plan_lower_fp8(cp_plan *P);

/* Each buffer's live intervals from the steps' operands. -1 with a message if a step reads a buffer that
 * nothing live was written to (a planner bug, reported rather than hidden). */
int cp_plan_liveness(cp_plan *P, char *err, int errlen);

/* Offsets in the GPU and host arenas: buffers whose lifetimes overlap never overlap in memory. Sets
 * gpu_arena, host_arena, cat_bytes, cat_host_bytes. */
void cp_plan_assign_offsets(cp_plan *P);

/* True if two buffers' lifetimes share a step. */
bool cp_plan_lifetimes_overlap(const cp_buffer *a, const cp_buffer *b);

/* The most GPU bytes live at one step, that step and what is live there (gpu_live_peak, peak_step, cat_at_peak),
 * from the lifetimes; part of cp_plan_assign_offsets. */
void cp_plan_live_peak(cp_plan *P);

/* -1 with a message if two buffers of one arena share bytes while both are live: the offsets against the lifetimes
 * as they are now (cp_plan_unfold checks a folded plan's offsets against the flat program's lifetimes). */
int cp_plan_check_packing(const cp_plan *P, char *err, int errlen);

/* Whether the search of cp_plan_build (without the kept attention outputs, which never change whether a length fits:
 * they take only memory left over) finds a plan of spec that fits the machine: the whole search, or (`quick`, as
 * --max-seq probes lengths) the same choices up to the first plan that fits, building no plan whose floor (what
 * lives across the loss) already does not fit. Both give the same answer. 0, or -1 with a message. */
int cp_plan_fits(const cp_spec *spec, bool quick, bool *fits, char *err, int errlen);

#endif
