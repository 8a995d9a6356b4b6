/* test_gemm.c: every GEMM variant the plan uses (runtime/gemm.c on cuBLASLt) against a float64 CPU reference on
 * seeded random bf16 inputs: x W^T projections (N,T), gradients through a weight (N,N), weight gradients accumulated
 * in fp32 (T,N, accumulate), bf16 accumulation (d_xn), the residual in the epilogue (has_c, C apart from D), and
 * strided leading dimensions (lda, ldb, ldd wider than a row) with pointers at 128- and 16-byte offsets. Outputs
 * that are overwritten start as NaN, so an element left unwritten, or a beta = 0 GEMM that reads D, fails; the
 * padding columns of a strided D must be left alone. Bounds: 1e-2 for bf16 outputs, 1e-3 for fp32 outputs. FP8 inputs
 * (test_fp8) against float64 on the values their bytes stand for, scales applied; 5e-3 for fp32 outputs with fast
 * accumulation. Block-scaled FP8 (test_fp8_block) the same way, each element times its own block's scale, and the
 * block-scaled recipe end to end from bf16 through the fp8 module's casts. Row-scaled FP8 (test_fp8_row) the same
 * way, each row of A and of B times its own scale, with fast accumulation too, and its recipe end to end through the
 * fp8 module's row casts. The generator's own block-scaled FP8 GEMM kernel (test_fp8_kernel, templates/gemm_fp8.cu)
 * on the same cases as test_fp8_block, with clusters of one and two CTAs and two and three consumer warpgroups. */
#include <fnmatch.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gemm.h"
#include "gemm_fp8.h"
#include "gpu_util.h"
#include "ref/ref.h"
#include "util.h"

#define TOL_BF16 1e-2
#define TOL_F32 1e-3
/* fp32 outputs with cuBLASLt's fast accumulation (FP8 sums not promoted to fp32 as often) */
#define TOL_F32_FAST 5e-3
/* the block-scaled recipe's results against float64 on its bf16 sources, through E4M3 only or an E5M2 input (FP8's
 * rounding alone gives about 0.038 and 0.059 on the test's data) */
#define RECIPE_E4M3 6e-2
#define RECIPE_E5M2 1e-1
/* the generator's FP8 GEMM (templates/gemm_fp8.cu) promotes its sums to fp32 every 128 of k and rounds once: against
 * float64, bf16's rounding of the output, or for fp32 outputs the tensor cores' own sums over each 128 of k (2.1e-4
 * measured on an H200, where fp32 sums alone would give about 1e-6) */
#define OWN_BF16 4e-3
#define OWN_F32 1e-3

static gu_rng rng;
static cp_gemm_lib *lib;
static void *ws;

typedef struct {
    const char *what;
    int64_t m, n, k;
    bool ta, tb, has_c, acc, f32;
    int64_t pad_a, pad_b, pad_d; /* extra elements per row */
    size_t off;                  /* byte offset of every operand from its allocation (alignment) */
} gcase;

static void sync_or_fail(const char *what) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        char m[1024];
        cp_cuda_errmsg(e, what, m, sizeof m);
        gu_fail("%s", m);
    }
}

/* One case: random A, B (and C, or D's old value), GPU GEMM, float64 reference, relative error. */
static void run_case(const gcase *c) {
    cp_gemm p = {.m = c->m, .n = c->n, .k = c->k, .trans_a = c->ta, .trans_b = c->tb, .has_c = c->has_c,
                 .accumulate = c->acc, .out_f32 = c->f32};
    p.lda = (c->ta ? c->m : c->k) + c->pad_a;
    p.ldb = (c->tb ? c->k : c->n) + c->pad_b;
    p.ldd = c->n + c->pad_d;
    int64_t arows = c->ta ? c->k : c->m, brows = c->tb ? c->n : c->k;
    int64_t na = arows * p.lda, nb = brows * p.ldb, nd = c->m * p.ldd;
    size_t esz = c->f32 ? 4 : 2;
    uint16_t *A = gu_rand_bf16(&rng, na, 1.0), *B = gu_rand_bf16(&rng, nb, 1.0 / sqrt((double)c->k));
    uint16_t *C = c->has_c ? gu_rand_bf16(&rng, nd, 1.0) : NULL;
    /* D's old contents: random for accumulate, else NaN; the padding columns get a sentinel in both cases */
    void *Dold = malloc((size_t)nd * esz);
    const uint16_t SENT16 = 0x3f80; /* 1.0 */
    const float SENT32 = 1234.5f;
    for (int64_t i = 0; i < c->m; i++)
        for (int64_t j = 0; j < p.ldd; j++) {
            bool pad = j >= c->n;
            double v = gu_normal(&rng);
            if (c->f32) ((float *)Dold)[i * p.ldd + j] = pad ? SENT32 : c->acc ? (float)v : NAN;
            else ((uint16_t *)Dold)[i * p.ldd + j] = pad ? SENT16 : c->acc ? f64_to_bf16(v) : 0xffff;
        }
    char *dA = gu_malloc((size_t)na * 2 + c->off), *dB = gu_malloc((size_t)nb * 2 + c->off);
    char *dC = c->has_c ? gu_malloc((size_t)nd * 2 + c->off) : NULL, *dD = gu_malloc((size_t)nd * esz + c->off);
    gu_upload(dA + c->off, A, (size_t)na * 2);
    gu_upload(dB + c->off, B, (size_t)nb * 2);
    if (C) gu_upload(dC + c->off, C, (size_t)nd * 2);
    gu_upload(dD + c->off, Dold, (size_t)nd * esz);
    char err[2048];
    if (cp_gemm_run(lib, &p, c->what, dA + c->off, dB + c->off, C ? dC + c->off : NULL, dD + c->off, 0, err,
                    sizeof err))
        gu_fail("%s", err);
    sync_or_fail(c->what);
    void *Dout = malloc((size_t)nd * esz);
    gu_download(Dout, dD + c->off, (size_t)nd * esz);

    /* reference over the n columns of each row; the padding must still hold the sentinel */
    /* op(A) as [m][k] and op(B)^T as [n][k] in double, so the inner loop runs along rows */
    double *Ad = malloc(sizeof(double) * (size_t)(c->m * c->k)), *Bd = malloc(sizeof(double) * (size_t)(c->n * c->k));
    for (int64_t i = 0; i < c->m; i++)
        for (int64_t l = 0; l < c->k; l++) Ad[i * c->k + l] = bf16_to_f32(c->ta ? A[l * p.lda + i] : A[i * p.lda + l]);
    for (int64_t j = 0; j < c->n; j++)
        for (int64_t l = 0; l < c->k; l++) Bd[j * c->k + l] = bf16_to_f32(c->tb ? B[j * p.ldb + l] : B[l * p.ldb + j]);
    double num = 0, den = 0;
    int64_t pad_changed = 0, nan_out = 0;
    for (int64_t i = 0; i < c->m; i++) {
        for (int64_t j = 0; j < c->n; j++) {
            double s = 0;
            const double *ar = Ad + i * c->k, *br = Bd + j * c->k;
            for (int64_t l = 0; l < c->k; l++) s += ar[l] * br[l];
            int64_t at = i * p.ldd + j;
            if (C) s += bf16_to_f32(C[at]);
            if (c->acc) s += c->f32 ? ((float *)Dold)[at] : bf16_to_f32(((uint16_t *)Dold)[at]);
            double o = c->f32 ? ((float *)Dout)[at] : bf16_to_f32(((uint16_t *)Dout)[at]);
            if (isnan(o)) nan_out++;
            num += (o - s) * (o - s);
            den += s * s;
        }
        for (int64_t j = c->n; j < p.ldd; j++) {
            int64_t at = i * p.ldd + j;
            if (c->f32 ? ((float *)Dout)[at] != SENT32 : ((uint16_t *)Dout)[at] != SENT16) pad_changed++;
        }
    }
    char shape[96];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld %s%s ld+%lld/%lld/%lld @%zu", (long long)c->m, (long long)c->n,
             (long long)c->k, c->ta ? "T" : "N", c->tb ? "T" : "N", (long long)c->pad_a, (long long)c->pad_b,
             (long long)c->pad_d, c->off);
    if (nan_out) gu_fail("%s %s: %lld outputs are NaN (not written, or D read with beta = 0)", c->what, shape,
                         (long long)nan_out);
    if (pad_changed) gu_fail("%s %s: %lld padding elements of D changed", c->what, shape, (long long)pad_changed);
    gu_check(c->what, shape, den > 0 ? sqrt(num / den) : sqrt(num), c->f32 ? TOL_F32 : TOL_BF16);
    free(Ad);
    free(Bd);
    free(A);
    free(B);
    free(C);
    free(Dold);
    free(Dout);
    gu_free_dev(dA);
    gu_free_dev(dB);
    if (dC) gu_free_dev(dC);
    gu_free_dev(dD);
}

/* The plan's GEMMs at the tiny spec's shapes and at odd ones (rows not a multiple of the tile sizes). */
static void test_forward(void **state) {
    (void)state;
    const gcase cases[] = {
        {"q_proj", 2048, 64, 256, false, true, false, false, false, 0, 0, 0, 0},
        {"lm_head", 2048, 512, 256, false, true, false, false, false, 0, 0, 0, 0},
        {"gate_proj", 1000, 768, 256, false, true, false, false, false, 0, 0, 0, 128},
        {"o_proj+res", 2048, 256, 256, false, true, true, false, false, 0, 0, 0, 0},
        {"down_proj+res", 1000, 256, 768, false, true, true, false, false, 0, 0, 0, 0},
        {"q_proj strided", 333, 128, 256, false, true, false, false, false, 64, 8, 24, 16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

static void test_backward(void **state) {
    (void)state;
    const gcase cases[] = {
        {"d_act", 2048, 768, 256, false, false, false, false, false, 0, 0, 0, 0},
        {"d_x_final", 2048, 256, 512, false, false, false, false, false, 0, 0, 0, 0},
        {"d_xn_q (write)", 2048, 256, 64, false, false, false, false, false, 0, 0, 0, 0},
        {"d_xn_k (bf16 +=)", 2048, 256, 64, false, false, false, true, false, 0, 0, 0, 0},
        {"d_xn2_up (bf16 +=)", 999, 256, 768, false, false, false, true, false, 8, 0, 8, 128},
        {"d_wq (f32 +=)", 64, 256, 2048, true, false, false, true, true, 0, 0, 0, 0},
        {"d_wdown (f32 +=)", 256, 768, 2048, true, false, false, true, true, 0, 0, 0, 0},
        {"d_lm_head (f32 +=)", 512, 256, 1000, true, false, false, true, true, 0, 0, 0, 0},
        {"d_w strided (f32 +=)", 72, 40, 520, true, false, false, true, true, 16, 8, 8, 16},
        {"f32 out (write)", 256, 128, 512, true, false, false, false, true, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

/* n random finite FP8 elements of `type`, most of magnitude near 1 (exponents within 4 of the bias) */
static uint8_t *rand_fp8(int64_t n, int type) {
    uint8_t *p = malloc((size_t)n);
    int m_bits = type == CP_GEMM_E4M3 ? 3 : 2, bias = type == CP_GEMM_E4M3 ? 7 : 15;
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = gu_next(&rng);
        int e = bias - 4 + (int)(r % 8), m = (int)((r >> 8) & ((1u << m_bits) - 1));
        p[i] = (uint8_t)((r >> 16 & 1) << 7 | e << m_bits | m);
    }
    return p;
}

/* What an FP8 GEMM of the plan does with D: writes it (q_proj, d_act), adds the residual C (o_proj, down_proj), adds
 * into bf16 D (the backward's d_xn from Q, K and V) or into fp32 D (the weight gradients) */
typedef enum { FP8_WRITE, FP8_RESIDUAL, FP8_ACC_BF16, FP8_ACC_F32 } fp8_out;

/* D[m][n] (bf16, fp32 when mode is FP8_ACC_F32) against float64 on Ad [m][k] and Bd [n][k], the values the FP8
 * inputs stand for (scales applied), plus C or D's old value as mode says; any NaN output fails. */
static void check_fp8_out(const char *what, const char *shape, const double *Ad, const double *Bd, int64_t m,
                          int64_t n, int64_t k, fp8_out mode, const uint16_t *C, const void *Dold, const void *Dout,
                          double bound) {
    bool f32 = mode == FP8_ACC_F32, acc = mode == FP8_ACC_F32 || mode == FP8_ACC_BF16;
    double num = 0, den = 0;
    int64_t nan_out = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double r = 0;
            for (int64_t l = 0; l < k; l++) r += Ad[i * k + l] * Bd[j * k + l];
            int64_t at_ = i * n + j;
            if (mode == FP8_RESIDUAL) r += bf16_to_f32(C[at_]);
            else if (acc) r += f32 ? ((const float *)Dold)[at_] : bf16_to_f32(((const uint16_t *)Dold)[at_]);
            double o = f32 ? ((const float *)Dout)[at_] : bf16_to_f32(((const uint16_t *)Dout)[at_]);
            if (isnan(o)) nan_out++;
            num += (o - r) * (o - r);
            den += r * r;
        }
    if (nan_out) gu_fail("%s %s: %lld outputs are NaN", what, shape, (long long)nan_out);
    gu_check(what, shape, sqrt(num / den), bound);
}

/* What D holds before an FP8 GEMM of output mode `mode` (count elements): random where the GEMM adds to it (bf16, or
 * fp32 for FP8_ACC_F32), NaN where it writes it */
static void *old_d(int64_t count, fp8_out mode) {
    bool f32 = mode == FP8_ACC_F32, acc = mode == FP8_ACC_F32 || mode == FP8_ACC_BF16;
    void *d = malloc((size_t)count * (f32 ? 4 : 2));
    for (int64_t i = 0; i < count; i++) {
        if (f32) ((float *)d)[i] = (float)gu_normal(&rng);
        else ((uint16_t *)d)[i] = acc ? f32_to_bf16((float)gu_normal(&rng)) : 0xffff;
    }
    return d;
}

/* An FP8 GEMM in the x W^T form: A [m][k] and B [n][k] of FP8 with per-tensor scales (not 1, so a scale left out
 * shows), D bf16 (with the residual C, as o_proj and down_proj add it) or fp32 accumulated (a weight gradient);
 * against float64 on the values the bytes stand for. D starts as NaN where it is written. */
static void run_fp8_case(const char *what, int64_t m, int64_t n, int64_t k, int at, int bt, fp8_out mode, bool fast,
                         double bound) {
    bool f32 = mode == FP8_ACC_F32, acc = mode == FP8_ACC_F32 || mode == FP8_ACC_BF16;
    cp_gemm p = {.m = m, .n = n, .k = k, .lda = k, .ldb = k, .ldd = n, .trans_b = true,
                 .has_c = mode == FP8_RESIDUAL, .accumulate = acc, .out_f32 = f32, .a_type = (uint8_t)at,
                 .b_type = (uint8_t)bt, .fast_accum = fast};
    const float scales[8] = {0.37f, 0, 0, 0, 1.0f / 24}; /* each on its own 16 bytes, as cuBLASLt takes them */
    uint8_t *A = rand_fp8(m * k, at), *B = rand_fp8(n * k, bt);
    uint16_t *C = mode == FP8_RESIDUAL ? gu_rand_bf16(&rng, m * n, 1.0) : NULL;
    size_t esz = f32 ? 4 : 2;
    void *Dold = old_d(m * n, mode);
    char *dA = gu_malloc((size_t)(m * k)), *dB = gu_malloc((size_t)(n * k)), *dD = gu_malloc((size_t)(m * n) * esz);
    char *dC = C ? gu_malloc((size_t)(m * n) * 2) : NULL;
    float *dS = gu_malloc(sizeof scales);
    gu_upload(dA, A, (size_t)(m * k));
    gu_upload(dB, B, (size_t)(n * k));
    if (C) gu_upload(dC, C, (size_t)(m * n) * 2);
    gu_upload(dD, Dold, (size_t)(m * n) * esz);
    gu_upload(dS, scales, sizeof scales);
    char err[2048];
    int id = cp_gemm_prepare(lib, &p, what, dA, dB, dC, dD, err, sizeof err);
    if (id < 0) gu_fail("%s", err);
    /* an FP8 entry launched without its scales is refused */
    if (cp_gemm_launch(lib, id, dA, dB, dC, dD, 0, err, sizeof err) != -1 || !strstr(err, "without the scales"))
        gu_fail("%s: launched without scales: %s", what, err);
    /* and one whose scale is off a 16-byte boundary, which cuBLASLt would refuse with NOT_SUPPORTED */
    if (cp_gemm_launch_scaled(lib, id, dA, dB, dC, dD, dS, dS + 1, 0, err, sizeof err) != -1 ||
        !strstr(err, "16-byte boundary"))
        gu_fail("%s: launched with a scale off a 16-byte boundary: %s", what, err);
    if (cp_gemm_launch_scaled(lib, id, dA, dB, dC, dD, dS, dS + 4, 0, err, sizeof err)) gu_fail("%s", err);
    sync_or_fail(what);
    void *Dout = malloc((size_t)(m * n) * esz);
    gu_download(Dout, dD, (size_t)(m * n) * esz);
    double *Ad = malloc(sizeof(double) * (size_t)(m * k)), *Bd = malloc(sizeof(double) * (size_t)(n * k));
    for (int64_t i = 0; i < m * k; i++) Ad[i] = scales[0] * ref_fp8_value(A[i], at == CP_GEMM_E5M2);
    for (int64_t i = 0; i < n * k; i++) Bd[i] = scales[4] * ref_fp8_value(B[i], bt == CP_GEMM_E5M2);
    char shape[96];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld %s x %s%s", (long long)m, (long long)n, (long long)k,
             at == CP_GEMM_E4M3 ? "e4m3" : "e5m2", bt == CP_GEMM_E4M3 ? "e4m3" : "e5m2", fast ? " fast" : "");
    check_fp8_out(what, shape, Ad, Bd, m, n, k, mode, C, Dold, Dout, bound);
    free(Ad), free(Bd), free(A), free(B), free(C), free(Dold), free(Dout);
    gu_free_dev(dA), gu_free_dev(dB), gu_free_dev(dD), gu_free_dev(dS);
    if (dC) gu_free_dev(dC);
}

/* FP8 tensor cores need compute capability 9.0: the test says so and is skipped elsewhere */
static void skip_without_fp8(void) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess || major < 9) {
        printf("  FP8 GEMMs: skipped (compute capability %d: FP8 tensor cores need 9.0)\n", major);
        skip();
    }
}

/* FP8 inputs (Hopper and newer): the forward's E4M3 x E4M3 written and with the residual, a gradient's E5M2 x E4M3
 * written and added into bf16, a weight gradient's fp32 accumulation, with cuBLASLt's promotion to fp32 and with
 * fast accumulation. (What FP8 cannot take is refused before cuBLASLt: tests/test_gemm_check.c.) */
static void test_fp8(void **state) {
    (void)state;
    skip_without_fp8();
    run_fp8_case("fp8 q_proj", 2048, 256, 256, CP_GEMM_E4M3, CP_GEMM_E4M3, FP8_WRITE, true, TOL_BF16);
    run_fp8_case("fp8 o_proj+res", 1024, 256, 512, CP_GEMM_E4M3, CP_GEMM_E4M3, FP8_RESIDUAL, false, TOL_BF16);
    run_fp8_case("fp8 o_proj+res", 1024, 256, 512, CP_GEMM_E4M3, CP_GEMM_E4M3, FP8_RESIDUAL, true, TOL_BF16);
    run_fp8_case("fp8 d_x (e5m2 grad)", 512, 384, 1024, CP_GEMM_E5M2, CP_GEMM_E4M3, FP8_WRITE, false, TOL_BF16);
    run_fp8_case("fp8 d_xn_k (bf16 +=)", 2048, 256, 128, CP_GEMM_E5M2, CP_GEMM_E4M3, FP8_ACC_BF16, false, TOL_BF16);
    run_fp8_case("fp8 d_w (f32 +=)", 256, 256, 4096, CP_GEMM_E5M2, CP_GEMM_E4M3, FP8_ACC_F32, false, TOL_F32);
    run_fp8_case("fp8 d_w (f32 +=)", 256, 256, 4096, CP_GEMM_E5M2, CP_GEMM_E4M3, FP8_ACC_F32, true, TOL_F32_FAST);
}

/* ---- FP8 with block scales (train.fp8_scaling = "block") ---- */

static int64_t ld4(int64_t x) { return ((x + 127) / 128 + 3) / 4 * 4; }

/* Which of an FP8 input [rows][k]'s scales element (i, l) takes, laid out as cp_gemm_scale `mode` (1 x 128 blocks:
 * [k / 128][rows], rows contiguous; 128 x 128 tiles: [ceil(rows / 128)][ld4(k)]; rows: [rows]); cp_fp8_scales
 * counts them */
static int64_t scale_of(int mode, int64_t rows, int64_t k, int64_t i, int64_t l) {
    switch (mode) {
    case CP_GEMM_SCALE_2D: return i / 128 * ld4(k) + l / 128;
    case CP_GEMM_SCALE_ROW: return i;
    default: return l / 128 * rows + i;
    }
}

/* Scales of an input [rows][k] as `mode` lays them out: each block's a power of two 2^-6 .. 2^6 drawn for it (so
 * that a scale read for another block shows; exact in every product), the entries that pad a tiled layout's rows NaN
 * (the casts leave them unwritten: the GEMM must not read them). Row scales, which cuBLASLt applies to the finished
 * sums: each row's a power of two 2^-2 .. 2^2, every fifth times a factor between 1 and 1.5 (a scale applied as its
 * exponent alone, or to the wrong row, shows; a range this narrow keeps every row's part of the error's norm, so
 * that one row scaled wrongly moves it past the bound). */
static float *rand_block_scales(int mode, int64_t rows, int64_t k) {
    const int64_t ns = cp_fp8_scales(mode, rows, k);
    float *s = malloc(4 * (size_t)ns);
    if (mode == CP_GEMM_SCALE_ROW) {
        for (int64_t i = 0; i < rows; i++)
            s[i] = ldexpf(i % 5 == 4 ? 1.25f + 0.25f * (float)gu_uniform(&rng) : 1.0f, (int)(gu_next(&rng) % 5) - 2);
        return s;
    }
    for (int64_t i = 0; i < ns; i++) s[i] = NAN;
    for (int64_t i = 0; i < rows; i += mode == CP_GEMM_SCALE_2D ? 128 : 1)
        for (int64_t l = 0; l < k; l += 128)
            s[scale_of(mode, rows, k, i, l)] = ldexpf(1.0f, (int)(gu_next(&rng) % 13) - 6);
    return s;
}

/* The values an FP8 input [rows][k] stands for: each byte times its block's scale, in double */
static double *block_values(const uint8_t *bytes, const float *scales, int mode, int64_t rows, int64_t k, bool e5m2) {
    double *v = malloc(sizeof(double) * (size_t)(rows * k));
    for (int64_t i = 0; i < rows; i++)
        for (int64_t l = 0; l < k; l++)
            v[i * k + l] = (double)scales[scale_of(mode, rows, k, i, l)] * ref_fp8_value(bytes[i * k + l], e5m2);
    return v;
}

static void *dev_of(const void *host, size_t bytes) {
    void *d = gu_malloc(bytes);
    gu_upload(d, host, bytes);
    return d;
}

/* Block-scaled GEMM p on device inputs and scales, with the host's C (or NULL) and D's old value: what D holds
 * after it, on the host. On cuBLASLt (own NULL), or on the generator's FP8 GEMM kernel built as *own says
 * (cp_gemm_fp8_kspec must take p): its module built and launched with its tensor maps. */
static void *run_on_device(const cp_gemm *p, const char *what, const void *dA, const void *dB, const float *dsa,
                           const float *dsb, const uint16_t *C, const void *Dold, const cp_gemm_fp8_cfg *own) {
    const size_t dbytes = (size_t)(p->m * p->n) * (p->out_f32 ? 4 : 2);
    void *dC = C ? dev_of(C, (size_t)(p->m * p->n) * 2) : NULL, *dD = dev_of(Dold, dbytes);
    char err[2048];
    gu_module *m = NULL; /* the kernel's module, unloaded once the launch is done */
    if (!own) {
        int id = cp_gemm_prepare(lib, p, what, dA, dB, dC, dD, err, sizeof err);
        if (id < 0) gu_fail("%s", err);
        if (cp_gemm_launch_scaled(lib, id, dA, dB, dC, dD, dsa, dsb, 0, err, sizeof err)) gu_fail("%s", err);
    } else {
        cp_kernel_spec k;
        if (!cp_gemm_fp8_kspec(p, *own, &k)) gu_fail("%s: the FP8 GEMM kernel does not take it", what);
        m = gu_build(&k);
        cp_kspec_free(&k);
        cp_gemm_fp8_args a;
        cudaKernel_t kern = gu_kernel(m, "sm90");
        cp_kdims d = gu_dims(m, "sm90", p->m, 0);
        if (cp_gemm_fp8_args_make(&a, p, &m->spec, dA, dB, dC, dD, dsa, dsb, err, sizeof err) ||
            cp_kernel_set_max_smem(kern, d.smem, err, sizeof err) ||
            cp_gemm_fp8_launch(kern, &d, &a, 0, err, sizeof err))
            gu_fail("%s: %s", what, err);
    }
    sync_or_fail(what);
    if (m) gu_free(m);
    void *D = malloc(dbytes);
    gu_download(D, dD, dbytes);
    gu_free_dev(dD);
    if (dC) gu_free_dev(dC);
    return D;
}

static const char *scale_name(int mode) {
    return mode == CP_GEMM_SCALE_2D ? "128x128" : mode == CP_GEMM_SCALE_ROW ? "row" : "1x128";
}
static const char *type_name(int t) { return t == CP_GEMM_E5M2 ? "e5m2" : "e4m3"; }

/* A block- or row-scaled FP8 GEMM in the x W^T form (as cp_plan_fp8_gemm gives it with block or row scaling):
 * random FP8 bytes A [m][k] (type at, scales as) and B [n][k] (bt, bs), random scales per block or row, D as `mode`
 * says, with cuBLASLt's fast accumulation or not; against float64 on every element times its block's or row's scale.
 * D starts as NaN where it is written. On cuBLASLt (own NULL), or on the generator's kernel built as *own says
 * (run_on_device). */
static void run_fp8_block_case(const char *what, int64_t m, int64_t n, int64_t k, int at, int bt, int as, int bs,
                               fp8_out mode, bool fast, double bound, const cp_gemm_fp8_cfg *own) {
    cp_gemm p = {.m = m, .n = n, .k = k, .lda = k, .ldb = k, .ldd = n, .trans_b = true,
                 .has_c = mode == FP8_RESIDUAL, .accumulate = mode == FP8_ACC_F32 || mode == FP8_ACC_BF16,
                 .out_f32 = mode == FP8_ACC_F32, .a_type = (uint8_t)at, .b_type = (uint8_t)bt,
                 .a_scale = (uint8_t)as, .b_scale = (uint8_t)bs, .fast_accum = fast};
    uint8_t *A = rand_fp8(m * k, at), *B = rand_fp8(n * k, bt);
    float *sa = rand_block_scales(as, m, k), *sb = rand_block_scales(bs, n, k);
    uint16_t *C = mode == FP8_RESIDUAL ? gu_rand_bf16(&rng, m * n, 1.0) : NULL;
    void *Dold = old_d(m * n, mode);
    void *dA = dev_of(A, (size_t)(m * k)), *dB = dev_of(B, (size_t)(n * k));
    float *dsa = dev_of(sa, 4 * (size_t)cp_fp8_scales(as, m, k));
    float *dsb = dev_of(sb, 4 * (size_t)cp_fp8_scales(bs, n, k));
    void *Dout = run_on_device(&p, what, dA, dB, dsa, dsb, C, Dold, own);
    double *Ad = block_values(A, sa, as, m, k, at == CP_GEMM_E5M2);
    double *Bd = block_values(B, sb, bs, n, k, bt == CP_GEMM_E5M2);
    char shape[96];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld %s %s x %s %s%s", (long long)m, (long long)n, (long long)k,
             type_name(at), scale_name(as), type_name(bt), scale_name(bs), fast ? " fast" : "");
    check_fp8_out(what, shape, Ad, Bd, m, n, k, mode, C, Dold, Dout, bound);
    free(A), free(B), free(sa), free(sb), free(C), free(Dold), free(Dout), free(Ad), free(Bd);
    gu_free_dev(dA), gu_free_dev(dB), gu_free_dev(dsa), gu_free_dev(dsb);
}

/* bf16 [rows][cols]: normal values times a power of two 2^-6 .. 2^6 drawn per 128 x 128 tile, and times 1 or 2 drawn
 * per row and per column, so that the blocks of every layout (1 x 128, 128 x 1, tiles) get different scales */
static uint16_t *rand_tiled_bf16(int64_t rows, int64_t cols) {
    uint16_t *x = gu_rand_bf16(&rng, rows * cols, 1.0);
    const int64_t tc = (cols + 127) / 128;
    int *te = malloc(sizeof(int) * (size_t)((rows + 127) / 128 * tc)), *re = malloc(sizeof(int) * (size_t)rows);
    int *ce = malloc(sizeof(int) * (size_t)cols);
    for (int64_t i = 0; i < (rows + 127) / 128 * tc; i++) te[i] = (int)(gu_next(&rng) % 13) - 6;
    for (int64_t r = 0; r < rows; r++) re[r] = (int)(gu_next(&rng) % 2);
    for (int64_t c = 0; c < cols; c++) ce[c] = (int)(gu_next(&rng) % 2);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            x[r * cols + c] =
                f32_to_bf16(ldexpf(bf16_to_f32(x[r * cols + c]), te[r / 128 * tc + c / 128] + re[r] + ce[c]));
    free(te), free(re), free(ce);
    return x;
}

/* One operand of a recipe GEMM: the fp8 module's block or row cast `role` of bf16 src [rows][cols] run on the GPU
 * into a fresh copy and scales (both NaN before), and in double what the reference cast makes of it (the copy's
 * values, [rows][cols] or [cols][rows] when transposed) and the bf16 source itself in the same layout. */
typedef struct {
    uint8_t *bytes; /* device */
    float *scales;  /* device */
    double *ref, *src;
} recipe_input;

static recipe_input recipe_cast(gu_module *m, const char *role, const uint16_t *src, int64_t rows, int64_t cols) {
    const bool e5m2 = strstr(role, "e5m2") != NULL, transpose = strncmp(role, "cast_t_", 7) == 0;
    const int mode = strstr(role, "_row_") ? CP_GEMM_SCALE_ROW
                     : strstr(role, "_2d_") ? CP_GEMM_SCALE_2D
                                            : CP_GEMM_SCALE_1D;
    const int64_t crows = transpose ? cols : rows, ccols = transpose ? rows : cols;
    const int64_t ns = cp_fp8_scales(mode, crows, ccols);
    const int64_t room = ns + (mode == CP_GEMM_SCALE_ROW && transpose ? cp_fp8_row_parts(rows, cols) : 0);
    recipe_input in;
    void *dsrc = dev_of(src, 2 * (size_t)(rows * cols));
    in.bytes = gu_malloc((size_t)(rows * cols));
    in.scales = gu_malloc(4 * (size_t)room);
    gu_poison(in.bytes, (size_t)(rows * cols));
    gu_poison(in.scales, 4 * (size_t)room);
    int64_t ld = cols;
    void *a[] = {&dsrc, &rows, &cols, &ld, &in.bytes, &in.scales};
    gu_run_fp8_cast(m, role, rows, cols, a);
    gu_free_dev(dsrc);
    uint8_t *bytes = malloc((size_t)(rows * cols));
    float *scales = malloc(4 * (size_t)ns);
    if (mode == CP_GEMM_SCALE_ROW) ref_fp8_cast_row(src, rows, cols, cols, e5m2, transpose, bytes, scales);
    else ref_fp8_cast_block(src, rows, cols, cols, e5m2, transpose, mode == CP_GEMM_SCALE_2D, bytes, scales);
    in.ref = block_values(bytes, scales, mode, crows, ccols, e5m2);
    in.src = malloc(sizeof(double) * (size_t)(rows * cols));
    for (int64_t i = 0; i < crows; i++)
        for (int64_t l = 0; l < ccols; l++)
            in.src[i * ccols + l] = bf16_to_f32(src[transpose ? l * cols + i : i * cols + l]);
    free(bytes), free(scales);
    return in;
}

static void recipe_free(recipe_input *in) {
    gu_free_dev(in->bytes), gu_free_dev(in->scales);
    free(in->ref), free(in->src);
}

/* GEMM D = A B^T (+ D) of two recipe inputs, as p says: against float64 on the reference casts' values (bound: the
 * GEMM's own; the GEMM reads the copies and scales as the casts write them) and on the bf16 sources (bound src_bound:
 * FP8's rounding). */
static void recipe_gemm(const char *what, const cp_gemm *p, fp8_out mode, const recipe_input *a,
                        const recipe_input *b, double bound, double src_bound) {
    void *Dold = old_d(p->m * p->n, mode);
    void *Dout = run_on_device(p, what, a->bytes, b->bytes, a->scales, b->scales, NULL, Dold, 0);
    char shape[96], label[64];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld %s %s x %s %s", (long long)p->m, (long long)p->n,
             (long long)p->k, type_name(p->a_type), scale_name(p->a_scale), type_name(p->b_type),
             scale_name(p->b_scale));
    check_fp8_out(what, shape, a->ref, b->ref, p->m, p->n, p->k, mode, NULL, Dold, Dout, bound);
    snprintf(label, sizeof label, "%s vs bf16", what);
    check_fp8_out(label, shape, a->src, b->src, p->m, p->n, p->k, mode, NULL, Dold, Dout, src_bound);
    free(Dold), free(Dout);
}

/* The block-scaled recipe (row: the row-scaled one) end to end, as the plan runs the three GEMMs of a projection
 * W [O][I] on T tokens: the forward Y = X W^T (X cast 1 x 128 in E4M3, W in tiles; row: a scale per token and per
 * row of W), the gradient dX += dY W (dY 1 x 128 in E5M2, W's transposed copy in the same tiles; row: per token, and
 * per column of W) and the weight's dW += dY^T X in fp32 (the transposed copies of dY and X, each block 128 tokens
 * of one column; row: all the tokens of one column). The casts run on the GPU and their copies and scales go to the
 * GEMMs as they are. */
static void run_fp8_recipe(gu_module *m, int64_t T, int64_t I, int64_t O, bool row) {
    /* the casts of X, W, W^T, dY, dY^T and X^T, and the scale modes of the forward's A and B and of the weight
     * gradient's B (the others follow them) */
    static const char *const roles[2][6] = {
        {"cast_1d_e4m3", "cast_2d_e4m3", "cast_t_2d_e4m3", "cast_1d_e5m2", "cast_t_1d_e5m2", "cast_t_1d_e4m3"},
        {"cast_row_e4m3", "cast_row_e4m3", "cast_t_row_e4m3", "cast_row_e5m2", "cast_t_row_e5m2", "cast_t_row_e4m3"},
    };
    const char *const *role = roles[row];
    const int a_scale = row ? CP_GEMM_SCALE_ROW : CP_GEMM_SCALE_1D;
    const int w_scale = row ? CP_GEMM_SCALE_ROW : CP_GEMM_SCALE_2D;
    uint16_t *X = rand_tiled_bf16(T, I), *W = rand_tiled_bf16(O, I), *dY = rand_tiled_bf16(T, O);
    recipe_input x = recipe_cast(m, role[0], X, T, I), w = recipe_cast(m, role[1], W, O, I);
    recipe_input wt = recipe_cast(m, role[2], W, O, I), dy = recipe_cast(m, role[3], dY, T, O);
    recipe_input dyt = recipe_cast(m, role[4], dY, T, O), xt = recipe_cast(m, role[5], X, T, I);
    const cp_gemm base = {.trans_b = true, .a_type = CP_GEMM_E4M3, .b_type = CP_GEMM_E4M3,
                          .a_scale = (uint8_t)a_scale, .b_scale = (uint8_t)w_scale};
    cp_gemm fwd = base, dgrad = base, wgrad = base;
    fwd.m = T, fwd.n = O, fwd.k = fwd.lda = fwd.ldb = I, fwd.ldd = O;
    dgrad.m = T, dgrad.n = I, dgrad.k = dgrad.lda = dgrad.ldb = O, dgrad.ldd = I;
    dgrad.a_type = CP_GEMM_E5M2, dgrad.accumulate = true;
    wgrad.m = O, wgrad.n = I, wgrad.k = wgrad.lda = wgrad.ldb = T, wgrad.ldd = I;
    wgrad.a_type = CP_GEMM_E5M2, wgrad.b_scale = (uint8_t)a_scale, wgrad.accumulate = wgrad.out_f32 = true;
    /* FP8's rounding against the bf16 sources: an element's relative error is at most 2^-4 (E4M3) or 2^-3 (E5M2),
     * less on average; the sums' relative errors are their RMS */
    const char *tag = row ? "fp8r" : "fp8b";
    char what[3][32];
    snprintf(what[0], sizeof what[0], "%s recipe fwd", tag);
    snprintf(what[1], sizeof what[1], "%s recipe dgrad", tag);
    snprintf(what[2], sizeof what[2], "%s recipe wgrad", tag);
    recipe_gemm(what[0], &fwd, FP8_WRITE, &x, &w, TOL_BF16, RECIPE_E4M3);
    recipe_gemm(what[1], &dgrad, FP8_ACC_BF16, &dy, &wt, TOL_BF16, RECIPE_E5M2);
    recipe_gemm(what[2], &wgrad, FP8_ACC_F32, &dyt, &xt, TOL_F32, RECIPE_E5M2);
    recipe_free(&x), recipe_free(&w), recipe_free(&wt), recipe_free(&dy), recipe_free(&dyt), recipe_free(&xt);
    free(X), free(W), free(dY);
}

/* The recipe of run_fp8_recipe (row: with row scales) on the fp8 module's casts, built for it */
static void run_fp8_recipe_casts(bool row) {
    cp_kernel_spec k;
    cp_k_fp8(&k);
    gu_module *m = gu_build(&k);
    cp_kspec_free(&k);
    run_fp8_recipe(m, 1152, 384, 640, row);
    gu_free(m);
}

/* The block- and row-scaled cases, each with its scales as cp_plan_fp8_gemm gives them (V: per 1 x 128 block, T: per
 * 128 x 128 tile, R: per row over all of k) and what it does with D; `own`: the generator's kernel takes it too
 * (test_fp8_kernel); `fast`: cuBLASLt's fast accumulation (row scales only: they apply after the sums). */
typedef struct {
    const char *what;
    int64_t m, n, k;
    int at, bt, as, bs;
    fp8_out mode;
    bool own, fast;
} block_case;
enum { E4 = CP_GEMM_E4M3, E5 = CP_GEMM_E5M2, V = CP_GEMM_SCALE_1D, T = CP_GEMM_SCALE_2D, R = CP_GEMM_SCALE_ROW };
static const block_case BLOCK_CASES[] = {
    {"q_proj", 2048, 384, 256, E4, E4, V, T, FP8_WRITE, true, false},
    {"o_proj+res", 1008, 256, 512, E4, E4, V, T, FP8_RESIDUAL, true, false},
    {"d_x (e5m2 grad)", 512, 384, 1024, E5, E4, V, T, FP8_WRITE, true, false},
    {"d_xn_k (bf16 +=)", 2048, 256, 128, E5, E4, V, T, FP8_ACC_BF16, true, false},
    {"d_xn_up (e4m3 grad +=)", 1008, 400, 768, E4, E4, V, T, FP8_ACC_BF16, false, false},
    {"d_w (f32 +=)", 256, 400, 4096, E5, E4, V, V, FP8_ACC_F32, false, false},
    {"d_w (f32 +=)", 256, 384, 4096, E5, E4, V, V, FP8_ACC_F32, true, false},
    {"d_w (e4m3 grad f32 +=)", 144, 256, 2048, E4, E4, V, V, FP8_ACC_F32, true, false},
    {"d_w (e5m2 B, f32 +=)", 128, 256, 1024, E4, E5, V, V, FP8_ACC_F32, true, false},
    {"160 tiles", 2048, 1280, 256, E4, E4, V, T, FP8_WRITE, true, false},
    {"160 tiles (f32 +=)", 1284, 2048, 384, E4, E4, V, V, FP8_ACC_F32, true, false},
    {"160 tiles of 192 rows", 3072, 1280, 256, E4, E4, V, T, FP8_WRITE, true, false},
    {"A tiled", 400, 256, 512, E4, E4, T, V, FP8_WRITE, false, false},
};

/* The row-scaled cases (train.fp8_scaling = "row"), on cuBLASLt only: k a multiple of 128 and one of 16 only (1040),
 * with and without fast accumulation, and a larger m and n */
static const block_case ROW_CASES[] = {
    {"q_proj", 256, 384, 3072, E4, E4, R, R, FP8_WRITE, false, false},
    {"q_proj", 256, 384, 3072, E4, E4, R, R, FP8_WRITE, false, true},
    {"o_proj+res", 256, 384, 1040, E4, E4, R, R, FP8_RESIDUAL, false, false},
    {"o_proj+res", 256, 384, 1040, E4, E4, R, R, FP8_RESIDUAL, false, true},
    {"d_x (e5m2 grad)", 256, 384, 1040, E5, E4, R, R, FP8_WRITE, false, false},
    {"d_x (e5m2 grad)", 256, 384, 3072, E5, E4, R, R, FP8_WRITE, false, true},
    {"d_xn (bf16 +=)", 256, 384, 1040, E5, E4, R, R, FP8_ACC_BF16, false, false},
    {"d_w (f32 +=)", 256, 384, 3072, E5, E4, R, R, FP8_ACC_F32, false, false},
    {"d_w (f32 +=)", 256, 384, 3072, E5, E4, R, R, FP8_ACC_F32, false, true},
    {"d_w (e4m3 grad f32 +=)", 384, 256, 1040, E4, E4, R, R, FP8_ACC_F32, false, false},
    {"d_x (e5m2 grad)", 2048, 1024, 1040, E5, E4, R, R, FP8_WRITE, false, false},
    {"o_proj+res", 2048, 1024, 1040, E4, E4, R, R, FP8_RESIDUAL, false, true},
};

/* Case c on cuBLASLt (own NULL), or on the generator's kernel built as *own says, with that one's bound for its
 * output. */
static void run_block_case(const block_case *c, const cp_gemm_fp8_cfg *own) {
    char what[64];
    if (own) snprintf(what, sizeof what, "own c%d w%d %s", own->cluster, own->consumers, c->what);
    else snprintf(what, sizeof what, "%s %s", c->as == R ? "fp8r" : "fp8b", c->what);
    double bound = c->mode == FP8_ACC_F32 ? (own ? OWN_F32 : c->fast ? TOL_F32_FAST : TOL_F32)
                                          : (own ? OWN_BF16 : TOL_BF16);
    run_fp8_block_case(what, c->m, c->n, c->k, c->at, c->bt, c->as, c->bs, c->mode, c->fast, bound, own);
}

/* Block-scaled FP8 (Hopper): the plan's GEMMs with train.fp8_scaling = "block" on random bytes and scales (the
 * forward 1 x 128 by 128 x 128, written and with the residual; a gradient's in E5M2 and in E4M3 (fp8_format =
 * "e4m3"), written and added into bf16; the weight gradients' 1 x 128 by 1 x 128 added into fp32; A tiled, which
 * cp_gemm_check allows though the plan never asks for it), with n and m not multiples of 128 (partial tiles, padded
 * rows of tile scales), then the recipe end to end from bf16 through the fp8 module's casts. Fast accumulation with
 * block scales is refused before cuBLASLt (the other refusals: tests/test_gemm_check.c). */
static void test_fp8_block(void **state) {
    (void)state;
    skip_without_fp8();
    for (size_t i = 0; i < CP_ARRAY_LEN(BLOCK_CASES); i++) run_block_case(&BLOCK_CASES[i], NULL);

    cp_gemm fast = {.m = 256, .n = 256, .k = 256, .lda = 256, .ldb = 256, .ldd = 256, .trans_b = true,
                    .a_type = CP_GEMM_E4M3, .b_type = CP_GEMM_E4M3, .a_scale = V, .b_scale = T, .fast_accum = true};
    char *buf = gu_malloc(1 << 20), err[2048];
    assert_int_equal(cp_gemm_prepare(lib, &fast, "fast_blk", buf, buf, NULL, buf, err, sizeof err), -1);
    printf("  refused as expected: %s\n", err);
    assert_non_null(strstr(err, "fast accumulation"));
    gu_free_dev(buf);
    run_fp8_recipe_casts(false);
}

/* Row-scaled FP8 (train.fp8_scaling = "row", cuBLASLt's OUTER_VEC_32F: D[i][j] = sa[i] sb[j] sum_k A[i][k] B[j][k]):
 * the plan's GEMMs on random bytes and random per-row scales (ROW_CASES: written, with the residual, added into bf16
 * and into fp32; E4M3 and E5M2 A; fast accumulation, which row scales allow; k = 1040, a multiple of 16 and not of
 * 128), then the row-scaled recipe end to end from bf16 through the fp8 module's row casts. */
static void test_fp8_row(void **state) {
    (void)state;
    skip_without_fp8();
    for (size_t i = 0; i < CP_ARRAY_LEN(ROW_CASES); i++) run_block_case(&ROW_CASES[i], NULL);
    run_fp8_recipe_casts(true);
}

/* The generator's FP8 GEMM kernel (Hopper): each output mode, B's scales per tile (a weight) and per 1 x 128 (the
 * weights' gradients), E5M2 gradients on either side, m past a whole tile (rows read as zeros and not stored), and
 * more tiles than SMs (the persistent walk, the stage ring wrapping between tiles), with tiles of 128 and of 192 rows
 * in clusters of one, and of 128 in clusters of two. Tighter bounds than cuBLASLt's: one rounding of sums promoted every 128 of k. */
static void test_fp8_kernel(void **state) {
    (void)state;
    skip_without_fp8();
    for (int cluster = 1; cluster <= 2; cluster++)
        for (int consumers = 2; consumers <= 3; consumers++)
            for (size_t i = 0; i < CP_ARRAY_LEN(BLOCK_CASES); i++)
                if (BLOCK_CASES[i].own && !(cluster == 2 && consumers == 3)) /* a pair the kernel refuses */
                    run_block_case(&BLOCK_CASES[i], &(cp_gemm_fp8_cfg){cluster, consumers});
}

/* One shape prepared once: the same shape and alignment give the same entry; less alignment a new one. */
static void test_cache(void **state) {
    (void)state;
    cp_gemm p = {.m = 256, .n = 128, .k = 64, .lda = 64, .ldb = 64, .ldd = 128, .trans_b = true};
    char *buf = gu_malloc(1 << 20), err[2048];
    int a = cp_gemm_prepare(lib, &p, "cache", buf, buf + 65536, NULL, buf + 131072, err, sizeof err);
    int b = cp_gemm_prepare(lib, &p, "cache", buf + 4096, buf + 65536 + 256, NULL, buf + 262144, err, sizeof err);
    int c = cp_gemm_prepare(lib, &p, "cache", buf + 16, buf + 65536, NULL, buf + 131072, err, sizeof err);
    assert_true(a >= 0 && b >= 0 && c >= 0);
    assert_int_equal(a, b);
    assert_int_not_equal(a, c);
    /* an inconsistent description is refused with a message naming it */
    cp_gemm bad = p;
    bad.ldb = 32;
    assert_int_equal(cp_gemm_prepare(lib, &bad, "bad_ld", buf, buf, NULL, buf, err, sizeof err), -1);
    printf("  refused as expected: %s\n", err);
    assert_non_null(strstr(err, "bad_ld"));
    gu_free_dev(buf);
    printf("  %d prepared GEMM entries\n", cp_gemm_entries(lib));
}

static int group_setup(void **state) {
    (void)state;
    gu_cmocka = true;
    gu_seed(&rng, 20261201);
    ws = gu_malloc(CP_GEMM_WORKSPACE);
    char err[1024];
    if (cp_gemm_lib_create(&lib, ws, CP_GEMM_WORKSPACE, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    gu_print_table();
    cp_gemm_lib_destroy(lib);
    gu_free_dev(ws);
    return 0;
}

/* usage: test_gemm [PATTERN]: only the tests whose names match PATTERN (* and ? wildcards); a pattern that matches
 * none fails rather than passing on nothing run */
int main(int argc, char **argv) {
    gu_init_or_skip("test_gemm");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward),
        cmocka_unit_test(test_backward),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_fp8),
        cmocka_unit_test(test_fp8_block),
        cmocka_unit_test(test_fp8_row),
        cmocka_unit_test(test_fp8_kernel),
    };
    if (argc > 1) {
        bool any = false;
        for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
            any = any || fnmatch(argv[1], tests[i].name, 0) == 0;
        if (!any) {
            fprintf(stderr, "test_gemm: no test matches %s (test_fp8, test_fp8_block, ...)\n", argv[1]);
            return 1;
        }
        cmocka_set_test_filter(argv[1]);
    }
    return gu_status(cmocka_run_group_tests(tests, group_setup, group_teardown));
}
