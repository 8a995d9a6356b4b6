/* gemm.h: the plan's GEMMs (cp_gemm in gen/plan.h) on cuBLASLt. Row-major D[m][n] = op(A) op(B) (+ C), bf16 or
 * FP8 inputs (per-tensor, per-row or block scales), fp32 compute, bf16 or fp32 output, optionally accumulating into D
 * (D += AB) or adding a separate bf16 residual C (D = AB + C, C laid out as D). The algorithm of each shape (and
 * pointer alignment) is chosen once with cuBLASLt's heuristic and kept, so a training step only looks up a prepared
 * entry and launches. */
#ifndef CP_GEMM_H
#define CP_GEMM_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "plan.h"

typedef struct cp_gemm_lib cp_gemm_lib;

/* A cuBLASLt handle with a workspace of ws_bytes at ws (the plan's gemm_workspace buffer, CP_GEMM_WORKSPACE bytes).
 * GEMMs launched through one library share the workspace, so they must run on one stream. Returns 0, or -1 with a
 * message. */
int cp_gemm_lib_create(cp_gemm_lib **out, void *ws, size_t ws_bytes, char *err, int errlen);
void cp_gemm_lib_destroy(cp_gemm_lib *g);

/* The plan's conventions and what the tensor cores take (FP8: the x W^T form, both inputs FP8, not two E5M2, k and
 * the leading dimensions multiples of 16; block scales on both inputs or neither, not both tiled, k a multiple of
 * 128, no fast accumulation; row scales on both inputs or neither), checked before cuBLASLt sees the GEMM, so that
 * a wrong cp_gemm is named as such. Needs no GPU. Returns 0, or -1 with a message naming the GEMM and what is
 * wrong. */
int cp_gemm_check(const cp_gemm *p, const char *what, const void *A, const void *B, const void *C, const void *D,
                  char *err, int errlen);

/* Find or make the prepared entry for this GEMM (cp_gemm_check first): its descriptors and the heuristic's
 * algorithm for these shapes and the alignment of these pointers (C may be NULL unless p->has_c). `what` names the
 * GEMM in messages. Returns the entry's id (>= 0), or -1 with a message naming the GEMM, its shape and what to do.
 * Allocates on first use of a shape; call it before the training loop for every GEMM of the plan. */
int cp_gemm_prepare(cp_gemm_lib *g, const cp_gemm *p, const char *what, const void *A, const void *B, const void *C,
                    const void *D, char *err, int errlen);

/* Launch prepared entry id on stream s. The pointers must be at least as aligned as those it was prepared with.
 * C is the residual (has_c) and ignored otherwise; with accumulate, D is read and written. No allocation. Returns 0,
 * or -1 with a message. */
int cp_gemm_launch(cp_gemm_lib *g, int id, const void *A, const void *B, const void *C, void *D, cudaStream_t s,
                   char *err, int errlen);

/* The same for a GEMM of FP8 inputs (cp_gemm.a_type, b_type): a_scale and b_scale point to each input's fp32 scales
 * on the GPU (the value an element stands for is its scale x element: one scale, or a block's as cp_gemm.a_scale and
 * b_scale lay them out), read when the GEMM runs, each on a 16-byte boundary (cuBLASLt refuses a scale less
 * aligned). cp_gemm_launch is this with no scales, which an FP8 entry
 * refuses. */
int cp_gemm_launch_scaled(cp_gemm_lib *g, int id, const void *A, const void *B, const void *C, void *D,
                          const float *a_scale, const float *b_scale, cudaStream_t s, char *err, int errlen);

/* The algorithms cuBLASLt's heuristic offers for prepared entry id, best first, at most max: how many (the first is
 * the one prepare chose), or -1 with a message. cp_gemm_pick then makes entry id launch candidate `pick` (< that
 * count). For measuring the heuristic's choice (bench_gemm --algos). */
int cp_gemm_candidates(cp_gemm_lib *g, int id, int max, char *err, int errlen);
int cp_gemm_pick(cp_gemm_lib *g, int id, int pick, char *err, int errlen);

/* prepare + launch, for tests and one-off GEMMs. */
int cp_gemm_run(cp_gemm_lib *g, const cp_gemm *p, const char *what, const void *A, const void *B, const void *C,
                void *D, cudaStream_t s, char *err, int errlen);

/* Number of prepared entries (distinct shapes and alignments). */
int cp_gemm_entries(const cp_gemm_lib *g);

#endif
