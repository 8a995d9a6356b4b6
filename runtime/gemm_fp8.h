/* gemm_fp8.h: block-scaled FP8 GEMMs of the plan's form (cp_gemm) on the generator's own Hopper kernel
 * (templates/gemm_fp8.cu; which GEMMs it takes and the module for one: cp_gemm_fp8_kspec, gen/plan.h): the launch's
 * arguments, tensor maps encoded once, and the launch. */
#ifndef CP_GEMM_FP8_H
#define CP_GEMM_FP8_H

#include <stdbool.h>

#include <cuda_runtime_api.h>

#include "kernels.h"
#include "plan.h"
#include "tma.h"

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
