/* test_gemm.c: every GEMM variant the plan uses (runtime/gemm.c on cuBLASLt) against a float64 CPU reference on
 * seeded random bf16 inputs: x W^T projections (N,T), gradients through a weight (N,N), weight gradients accumulated
 * in fp32 (T,N, accumulate), bf16 accumulation (d_xn), the residual in the epilogue (has_c, C apart from D), and
 * strided leading dimensions (lda, ldb, ldd wider than a row) with pointers at 128- and 16-byte offsets. Outputs
 * that are overwritten start as NaN, so an element left unwritten, or a beta = 0 GEMM that reads D, fails; the
 * padding columns of a strided D must be left alone. Bounds: 1e-2 for bf16 outputs, 1e-3 for fp32 outputs. FP8 inputs
 * (test_fp8) against float64 on the values their bytes stand for, scales applied; 5e-3 for fp32 outputs with fast
 * accumulation. */
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
#include "gpu_util.h"
#include "ref/ref.h"

#define TOL_BF16 1e-2
#define TOL_F32 1e-3

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

/* An FP8 GEMM in the x W^T form: A [m][k] and B [n][k] of FP8 with per-tensor scales (not 1, so a scale left out
 * shows), D bf16 (with the residual C, as o_proj and down_proj add it) or fp32 accumulated (a weight gradient);
 * against float64 on the values the bytes stand for. D starts as NaN where it is written. */
/* What an FP8 GEMM of the plan does with D: writes it (q_proj, d_act), adds the residual C (o_proj, down_proj), adds
 * into bf16 D (the backward's d_xn from Q, K and V) or into fp32 D (the weight gradients) */
typedef enum { FP8_WRITE, FP8_RESIDUAL, FP8_ACC_BF16, FP8_ACC_F32 } fp8_out;

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
    void *Dold = malloc((size_t)(m * n) * esz); /* what D holds before: added to, or NaN where it is written */
    for (int64_t i = 0; i < m * n; i++) {
        if (f32) ((float *)Dold)[i] = (float)gu_normal(&rng);
        else ((uint16_t *)Dold)[i] = acc ? f32_to_bf16((float)gu_normal(&rng)) : 0xffff;
    }
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
    double num = 0, den = 0;
    int64_t nan_out = 0;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double r = 0;
            for (int64_t l = 0; l < k; l++) r += Ad[i * k + l] * Bd[j * k + l];
            int64_t at_ = i * n + j;
            if (mode == FP8_RESIDUAL) r += bf16_to_f32(C[at_]);
            else if (acc) r += f32 ? ((float *)Dold)[at_] : bf16_to_f32(((uint16_t *)Dold)[at_]);
            double o = f32 ? ((float *)Dout)[at_] : bf16_to_f32(((uint16_t *)Dout)[at_]);
            if (isnan(o)) nan_out++;
            num += (o - r) * (o - r);
            den += r * r;
        }
    char shape[96];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld %s x %s%s", (long long)m, (long long)n, (long long)k,
             at == CP_GEMM_E4M3 ? "e4m3" : "e5m2", bt == CP_GEMM_E4M3 ? "e4m3" : "e5m2", fast ? " fast" : "");
    if (nan_out) gu_fail("%s %s: %lld outputs are NaN", what, shape, (long long)nan_out);
    gu_check(what, shape, sqrt(num / den), bound);
    free(Ad), free(Bd), free(A), free(B), free(C), free(Dold), free(Dout);
    gu_free_dev(dA), gu_free_dev(dB), gu_free_dev(dD), gu_free_dev(dS);
    if (dC) gu_free_dev(dC);
}

/* FP8 inputs (Hopper and newer): the forward's E4M3 x E4M3 written and with the residual, a gradient's E5M2 x E4M3
 * written and added into bf16, a weight gradient's fp32 accumulation, with cuBLASLt's promotion to fp32 and with
 * fast accumulation. (What FP8 cannot take is refused before cuBLASLt: tests/test_gemm_check.c.) */
static void test_fp8(void **state) {
    (void)state;
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess || major < 9) {
        printf("  FP8 GEMMs: skipped (compute capability %d: FP8 tensor cores need 9.0)\n", major);
        skip();
    }
    run_fp8_case("fp8 q_proj", 2048, 256, 256, CP_GEMM_E4M3, CP_GEMM_E4M3, FP8_WRITE, true, TOL_BF16);
    run_fp8_case("fp8 o_proj+res", 1024, 256, 512, CP_GEMM_E4M3, CP_GEMM_E4M3, FP8_RESIDUAL, false, TOL_BF16);
    run_fp8_case("fp8 o_proj+res", 1024, 256, 512, CP_GEMM_E4M3, CP_GEMM_E4M3, FP8_RESIDUAL, true, TOL_BF16);
    run_fp8_case("fp8 d_x (e5m2 grad)", 512, 384, 1024, CP_GEMM_E5M2, CP_GEMM_E4M3, FP8_WRITE, false, TOL_BF16);
    run_fp8_case("fp8 d_xn_k (bf16 +=)", 2048, 256, 128, CP_GEMM_E5M2, CP_GEMM_E4M3, FP8_ACC_BF16, false, TOL_BF16);
    run_fp8_case("fp8 d_w (f32 +=)", 256, 256, 4096, CP_GEMM_E5M2, CP_GEMM_E4M3, FP8_ACC_F32, false, TOL_F32);
    run_fp8_case("fp8 d_w (f32 +=)", 256, 256, 4096, CP_GEMM_E5M2, CP_GEMM_E4M3, FP8_ACC_F32, true, 5e-3);
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

int main(void) {
    gu_init_or_skip("test_gemm");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward),
        cmocka_unit_test(test_backward),
        cmocka_unit_test(test_cache),
        cmocka_unit_test(test_fp8),
    };
    return gu_status(cmocka_run_group_tests(tests, group_setup, group_teardown));
}
