/* gemm_fp8.c: see gemm_fp8.h. */
#include "gemm_fp8.h"

#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "module.h"
#include "util.h"

int cp_gemm_fp8_args_make(cp_gemm_fp8_args *a, const cp_gemm *p, const cp_kernel_spec *k, const void *A, const void *B,
                          const void *C, void *D, const float *sa, const float *sb, char *err, int errlen) {
    memset(a, 0, sizeof *a);
    const char *cl = cp_kspec_get(k, "CLUSTER"), *cw = cp_kspec_get(k, "CONSUMERS");
    if (!cl || !cw || atoi(cl) < 1 || atoi(cw) < 1)
        return cp_errf(err, errlen, "the FP8 GEMM kernel's spec (family %s) lacks CLUSTER or CONSUMERS, which "
                       "cp_k_gemm_fp8 always sets: an internal error of cpgen, to report", k->family);
    /* a tile's rows: 64 a consumer warpgroup; a cluster's CTAs load a share of B each */
    const int bm = 64 * atoi(cw), b_rows = 128 / atoi(cl);
    const int64_t kb = p->k / 128;
    const bool tiles = p->b_scale == CP_GEMM_SCALE_2D;
    if (cp_tmap_2d(&a->a, A, 1, p->m, p->k, p->k, 128, bm, 1, err, errlen) ||
        cp_tmap_2d(&a->b, B, 1, p->n, p->k, p->k, 128, b_rows, 1, err, errlen) ||
        cp_tmap_2d(&a->sa, sa, 4, kb, p->m, 4 * p->m, bm, 1, 0, err, errlen))
        return -1;
    if (tiles) a->sb = a->sa; /* the entry reads no map of B's scales then: A's stands in, never loaded */
    else if (cp_tmap_2d(&a->sb, sb, 4, kb, p->n, 4 * p->n, 128, 1, 0, err, errlen)) return -1;
    a->b_tiles = tiles ? sb : NULL;
    a->c = C;
    a->d = D;
    a->m = p->m;
    a->ldd = p->ldd;
    return 0;
}

int cp_gemm_fp8_launch(cudaKernel_t k, const cp_kdims *d, cp_gemm_fp8_args *a, cudaStream_t s, char *err,
                       int errlen) {
    void *args[] = {&a->a, &a->b, &a->sa, &a->sb, &a->b_tiles, &a->c, &a->d, &a->m, &a->ldd};
    cudaError_t e = cp_launch(k, d, args, s);
    return e == cudaSuccess ? 0 : cp_cuda_errmsg(e, "launching the FP8 GEMM kernel", err, errlen);
}
