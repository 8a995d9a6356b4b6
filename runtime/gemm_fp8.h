/* gemm_fp8.h: block-scaled FP8 GEMMs of the plan's form (cp_gemm) on the generator's own Hopper kernel
 * (templates/gemm_fp8.cu) instead of cuBLASLt: which GEMMs it takes, the module for one, and its launch with tensor
 * maps encoded once. The tests and bench_gemm use it; no plan chooses it yet (slower than cuBLASLt: docs/PERF.md). */
#ifndef CP_GEMM_FP8_H
#define CP_GEMM_FP8_H

#include <stdbool.h>

#include <cuda_runtime_api.h>

#include "kernels.h"
#include "plan.h"
#include "tma.h"

/* The module of templates/gemm_fp8.cu for GEMM p: true with k filled when the kernel takes p (the x W^T form on FP8
 * inputs with block scales, A's per 1 x 128, B's per 1 x 128 or 128 x 128; A and B dense; m a multiple of 4, so that
 * a row of A's scales is 16-byte aligned; n and k multiples of 128; no fast accumulation; D written (bf16, or with
 * C) or added to (bf16 or fp32)), else false. cfg as cp_k_gemm_fp8 takes it; consumers 0 outside clusters of 2:
 * cp_gemm_fp8_consumers for p's rows on an H200's CP_GEMM_FP8_SMS. Needs no GPU. */
bool cp_gemm_fp8_kspec(const cp_gemm *p, cp_gemm_fp8_cfg cfg, cp_kernel_spec *k);
/* The consumer warpgroups (2 or 3) the kernel runs fastest with for m x n outputs on sms SMs. */
#define CP_GEMM_FP8_SMS 132
int cp_gemm_fp8_consumers(int64_t m, int64_t n, int sms);

/* One launch's arguments, in the entry's order: the tensor maps of A, B and their scales, B's tile scales, C, D, m
 * and D's row stride. */
typedef struct {
    cp_tmap a, b, sa, sb;
    const float *b_tiles;
    const void *c;
    void *d;
    long long m, ldd;
} cp_gemm_fp8_args;

/* The arguments of GEMM p for module k (cp_gemm_fp8_kspec's) on these device pointers; the tensor maps hold the addresses, so
 * they are made once per set of buffers. sa, sb as cp_gemm_launch_scaled takes them. Returns 0, or -1 with a
 * message. */
int cp_gemm_fp8_args_make(cp_gemm_fp8_args *a, const cp_gemm *p, const cp_kernel_spec *k, const void *A, const void *B,
                          const void *C, void *D, const float *sa, const float *sb, char *err, int errlen);

/* Launch entry `k` (the module's "sm90", its dynamic shared memory allowed: cp_kernel_set_max_smem) with geometry
 * d (cp_k_dims for n = p->m) on stream s. Returns 0, or -1 with a message, as cp_gemm_launch. */
int cp_gemm_fp8_launch(cudaKernel_t k, const cp_kdims *d, cp_gemm_fp8_args *a, cudaStream_t s, char *err,
                       int errlen);

#endif
