/* gemm_fp8.c: see gemm_fp8.h. */
#include "gemm_fp8.h"

#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "module.h"
#include "util.h"

/* The consumer warpgroups for m rows by n columns on `sms` SMs: tiles of 192 rows run 12% faster than of 128 on the
 * 3B step's large GEMMs (bench_gemm on an H200: 0.643 s against 0.735 s where the kernel runs, docs/PERF.md,
 * 2026-12-03), but fewer of them may fill the SMs worse: whole waves of tiles times a tile's time, the larger the
 * shorter (a 1024-row weight's gradient: 144 tiles of 192 rows are 2 waves on 132 SMs, as 192 of 128 are). */
int cp_gemm_fp8_consumers(int64_t m, int64_t n, int sms) {
    double best = 0;
    int pick = 2;
    for (int c = 2; c <= 3; c++) {
        const int64_t bm = 64 * c, tiles = (m + bm - 1) / bm * ((n + 127) / 128);
        const double t = (double)((tiles + sms - 1) / sms) * (double)bm / (c == 3 ? 1.12 : 1.0);
        if (c == 2 || t < best) best = t, pick = c;
    }
    return pick;
}

bool cp_gemm_fp8_kspec(const cp_gemm *p, cp_gemm_fp8_cfg cfg, cp_kernel_spec *k) {
    const bool fp8 = p->a_type != CP_GEMM_BF16 && p->b_type != CP_GEMM_BF16;
    if (!fp8 || p->trans_a || !p->trans_b || p->fast_accum || p->a_scale != CP_GEMM_SCALE_1D ||
        p->b_scale == CP_GEMM_SCALE_TENSOR || p->lda != p->k || p->ldb != p->k || p->ldd % 2 || p->m < 1 || p->m % 4 ||
        p->ldd < p->n || (p->out_f32 && !p->accumulate) || (p->has_c && p->accumulate))
        return false;
    cp_gemm_fp8_out out = p->has_c        ? CP_GEMM_FP8_RESIDUAL
                          : !p->accumulate ? CP_GEMM_FP8_WRITE
                          : p->out_f32     ? CP_GEMM_FP8_ADD_F32
                                           : CP_GEMM_FP8_ADD_BF16;
    if (!cfg.consumers && cfg.cluster != 2) cfg.consumers = cp_gemm_fp8_consumers(p->m, p->n, CP_GEMM_FP8_SMS);
    return cp_k_gemm_fp8(k, p->n, p->k, p->a_type == CP_GEMM_E5M2, p->b_type == CP_GEMM_E5M2,
                         p->b_scale == CP_GEMM_SCALE_2D, out, cfg);
}

int cp_gemm_fp8_args_make(cp_gemm_fp8_args *a, const cp_gemm *p, const cp_kernel_spec *k, const void *A, const void *B,
                          const void *C, void *D, const float *sa, const float *sb, char *err, int errlen) {
    memset(a, 0, sizeof *a);
    const char *cl = cp_kspec_get(k, "CLUSTER"), *cw = cp_kspec_get(k, "CONSUMERS");
    /* a tile's rows: 64 a consumer warpgroup; a cluster's CTAs load a share of B each */
    const int bm = 64 * (cw ? atoi(cw) : 2), b_rows = 128 / (cl ? atoi(cl) : 1);
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
