/* test_ref.c: sanity of the CPU references (tests/ref) that the GPU kernels are compared with: each against a
 * property or a hand computation that does not share its code. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels.h"
#include "ref/ref.h"

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static double urand(void) { /* uniform in [-1, 1) */
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}
static uint16_t *rand_bf16(int64_t n, double scale) {
    uint16_t *p = malloc(sizeof(uint16_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++) p[i] = f64_to_bf16(urand() * scale);
    return p;
}
static double bf(uint16_t h) { return bf16_to_f32(h); }

static void test_bf16_rounding(void **state) {
    (void)state;
    assert_int_equal(f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(f32_to_bf16(-2.0f), 0xc000);
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1); 1 + 3*2^-8 ties up to 1 + 2^-6 */
    assert_int_equal(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
    assert_int_equal(f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81); /* just above the tie: up */
    assert_true(isnan(bf16_to_f32(f32_to_bf16(NAN))));
    assert_true(isinf(bf16_to_f32(f32_to_bf16(3.4e38f))));
    assert_true(bf16_to_f32(0x3f81) == 1.0078125f);
    /* double -> bf16 directly: 1 + 2^-8 + 2^-40 is above the tie, though rounding to float first lands on it */
    assert_int_equal(f64_to_bf16(1.0 + 0x1p-8 + 0x1p-40), 0x3f81);
    assert_int_equal(f64_to_bf16(1.0 + 0x1p-8), 0x3f80);
    assert_int_equal(f64_to_bf16(-1.0 - 0x1p-8 - 0x1p-40), 0xbf81);
    for (int i = 0; i < 1000; i++) { /* every bf16 value survives the round trip */
        uint16_t h = (uint16_t)(i * 61);
        if (isnan(bf16_to_f32(h))) continue;
        assert_int_equal(f64_to_bf16(bf16_to_f32(h)), h);
    }
}

static void test_rmsnorm_unit_rms(void **state) {
    (void)state;
    const int64_t n = 5, H = 256;
    uint16_t *x = rand_bf16(n * H, 3.0), *w = malloc(2 * H), *out = malloc(2 * n * H);
    float rstd[5];
    for (int64_t j = 0; j < H; j++) w[j] = f32_to_bf16(1.0f);
    ref_rmsnorm_fwd(x, NULL, NULL, w, out, rstd, n, H, 1e-6);
    for (int64_t r = 0; r < n; r++) {
        double ss = 0, xs = 0;
        for (int64_t j = 0; j < H; j++) {
            ss += bf(out[r * H + j]) * bf(out[r * H + j]);
            xs += bf(x[r * H + j]) * bf(x[r * H + j]);
        }
        assert_true(fabs(sqrt(ss / H) - 1.0) < 4e-3); /* bf16 rounding of each value: ~2^-9 */
        assert_true(fabs(rstd[r] * sqrt(xs / H) - 1.0) < 1e-6);
    }
    /* weight multiplies; with resid the sum is rounded to bf16, written and normalised */
    uint16_t *res = rand_bf16(n * H, 1.0), *sum = malloc(2 * n * H), *out2 = malloc(2 * n * H);
    for (int64_t j = 0; j < H; j++) w[j] = f32_to_bf16(j % 2 ? 2.0f : -0.5f);
    ref_rmsnorm_fwd(x, res, sum, w, out2, rstd, n, H, 1e-6);
    for (int64_t i = 0; i < n * H; i++) assert_int_equal(sum[i], f64_to_bf16(bf(x[i]) + bf(res[i])));
    ref_rmsnorm_fwd(sum, NULL, NULL, w, out, rstd, n, H, 1e-6);
    assert_memory_equal(out, out2, 2 * n * H);
    free(x), free(w), free(out), free(res), free(sum), free(out2);
}

/* L(x) = sum(dout * weight * x / rms(x)) in double, no rounding: the function the backward differentiates. */
static double rms_loss(const double *x, const uint16_t *w, const uint16_t *dout, int64_t H, double eps) {
    double ss = 0, l = 0;
    for (int64_t j = 0; j < H; j++) ss += x[j] * x[j];
    double rs = 1 / sqrt(ss / H + eps);
    for (int64_t j = 0; j < H; j++) l += bf(dout[j]) * bf(w[j]) * x[j] * rs;
    return l;
}

static void test_rmsnorm_bwd_gradient(void **state) {
    (void)state;
    const int64_t H = 64;
    const double eps = 1e-5;
    uint16_t *x = rand_bf16(H, 2.0), *w = rand_bf16(H, 1.5), *dout = rand_bf16(H, 1.0), *dres = rand_bf16(H, 1.0);
    uint16_t out[64], dx[64], dx2[64];
    float rstd, dw[64] = {0}, dw2[64];
    ref_rmsnorm_fwd(x, NULL, NULL, w, out, &rstd, 1, H, eps);
    ref_rmsnorm_bwd(dout, x, w, &rstd, NULL, dx, dw, 1, H);
    double xd[64], num = 0, den = 0, dot = 0, xn = 0, dn = 0;
    for (int64_t j = 0; j < H; j++) xd[j] = bf(x[j]);
    for (int64_t j = 0; j < H; j++) { /* central differences */
        double h = 1e-5, s = xd[j];
        xd[j] = s + h;
        double lp = rms_loss(xd, w, dout, H, eps);
        xd[j] = s - h;
        double lm = rms_loss(xd, w, dout, H, eps);
        xd[j] = s;
        double fd = (lp - lm) / (2 * h);
        num += (bf(dx[j]) - fd) * (bf(dx[j]) - fd);
        den += fd * fd;
        dot += bf(dx[j]) * xd[j];
        xn += xd[j] * xd[j];
        dn += bf(dx[j]) * bf(dx[j]);
    }
    assert_true(sqrt(num / den) < 5e-3);
    /* the output does not change with the scale of x, so dx is orthogonal to x (up to eps and rounding) */
    assert_true(fabs(dot) / sqrt(xn * dn) < 5e-3);
    /* dweight = dout * bf16(x * rstd), accumulated onto what was there; dresid is added to dx */
    for (int64_t j = 0; j < H; j++) {
        double want = bf(dout[j]) * bf16_round(bf(x[j]) * rstd);
        assert_true(fabs(dw[j] - want) <= 1e-6 * fabs(want) + 1e-12);
        dw2[j] = 1.0f;
    }
    ref_rmsnorm_bwd(dout, x, w, &rstd, dres, dx2, dw2, 1, H);
    for (int64_t j = 0; j < H; j++) {
        assert_true(fabs(dw2[j] - 1.0 - dw[j]) < 1e-6);
        assert_true(fabs(bf(dx2[j]) - (bf(dx[j]) + bf(dres[j]))) <= 0.01 * (fabs(bf(dx[j])) + fabs(bf(dres[j]))) + 1e-6);
    }
    free(x), free(w), free(dout), free(dres);
}

static void test_rope_rotation(void **state) {
    (void)state;
    const int64_t n = 9, heads = 3, D = 64;
    double inv[32];
    ref_rope_scaling sc = {true, 32, 1, 4, 8192};
    ref_rope_inv_freq(D, 500000, &sc, inv);
    uint16_t *x = rand_bf16(n * heads * D, 1.0), *y = malloc(2 * n * heads * D), *z = malloc(2 * n * heads * D);
    memcpy(y, x, 2 * n * heads * D);
    ref_rope(y, n, heads, D, 1000003, inv, false);
    double xn = 0, yn = 0, err = 0;
    for (int64_t i = 0; i < n * heads * D; i++) {
        xn += bf(x[i]) * bf(x[i]);
        yn += bf(y[i]) * bf(y[i]);
    }
    assert_true(fabs(sqrt(yn / xn) - 1) < 3e-3); /* a rotation keeps the norm */
    memcpy(z, y, 2 * n * heads * D);
    ref_rope(z, n, heads, D, 1000003, inv, true); /* the backward (transpose) undoes it */
    for (int64_t i = 0; i < n * heads * D; i++) err += (bf(z[i]) - bf(x[i])) * (bf(z[i]) - bf(x[i]));
    assert_true(sqrt(err / xn) < 8e-3);
    /* transpose: <R a, b> = <a, R^T b> */
    uint16_t *b = rand_bf16(n * heads * D, 1.0), *bt = malloc(2 * n * heads * D);
    memcpy(bt, b, 2 * n * heads * D);
    ref_rope(bt, n, heads, D, 1000003, inv, true);
    double l = 0, r = 0, bn = 0;
    for (int64_t i = 0; i < n * heads * D; i++) {
        l += bf(y[i]) * bf(b[i]);
        r += bf(x[i]) * bf(bt[i]);
        bn += bf(b[i]) * bf(b[i]);
    }
    assert_true(fabs(l - r) < 1e-2 * sqrt(xn * bn));
    /* position 0 is the identity; pair (i, i + D/2) at position p is rotated by p * inv[i] */
    memcpy(y, x, 2 * heads * D);
    ref_rope(y, 1, heads, D, 0, inv, false);
    assert_memory_equal(x, y, 2 * heads * D);
    uint16_t v[64] = {0};
    v[5] = f32_to_bf16(1.0f);
    ref_rope(v, 1, 1, D, 7, inv, false);
    assert_true(fabs(bf(v[5]) - cos(7 * inv[5])) < 4e-3);
    assert_true(fabs(bf(v[5 + 32]) - sin(7 * inv[5])) < 4e-3);
    free(x), free(y), free(z), free(b), free(bt);
}

static void test_rope_frequencies(void **state) {
    (void)state;
    /* Llama-3.1-8B: theta 500000, factor 8, low 1, high 4, original 8192 */
    double inv[64], gen[64];
    ref_rope_scaling sc = {true, 8, 1, 4, 8192};
    ref_rope_inv_freq(128, 500000, &sc, inv);
    assert_true(inv[0] == 1.0);
    for (int i = 0; i < 64; i++) {
        double base = pow(500000, -2.0 * i / 128), wl = 2 * M_PI / base;
        if (wl < 2048) assert_true(fabs(inv[i] / base - 1) < 1e-15);        /* high frequencies kept */
        if (wl > 8192) assert_true(fabs(inv[i] * 8 / base - 1) < 1e-15);    /* low ones divided by 8 */
        if (wl >= 2048 && wl <= 8192) assert_true(inv[i] <= base && inv[i] >= base / 8); /* in between */
        if (i) assert_true(inv[i] < inv[i - 1]);
    }
    /* the generator bakes in the same table */
    cp_model m;
    memset(&m, 0, sizeof m);
    m.head_dim = 128;
    m.rope_theta = 500000;
    m.rope_scaling = (cp_rope_scaling){true, 8, 1, 4, 8192};
    cp_rope_inv_freq(&m, gen);
    for (int i = 0; i < 64; i++) assert_true(fabs(gen[i] / inv[i] - 1) < 1e-15);
    m.rope_theta = 1e6;
    m.rope_scaling.enabled = false;
    cp_rope_inv_freq(&m, gen);
    ref_rope_inv_freq(128, 1e6, NULL, inv);
    for (int i = 0; i < 64; i++) assert_true(fabs(gen[i] / inv[i] - 1) < 1e-15);
}

static void test_swiglu(void **state) {
    (void)state;
    /* silu(1) * 2 = 2 / (1 + e^-1) = 1.46211715...; silu(-3) * 0.5 = -0.5 * 3 / (1 + e^3) = -0.0711...*/
    uint16_t g[3] = {f32_to_bf16(1.0f), f32_to_bf16(-3.0f), f32_to_bf16(0.0f)};
    uint16_t u[3] = {f32_to_bf16(2.0f), f32_to_bf16(0.5f), f32_to_bf16(7.0f)}, o[3];
    ref_swiglu_fwd(g, u, o, 3);
    assert_true(fabs(bf(o[0]) - 1.4621171572600098) < 1.46 * 4e-3);
    assert_true(fabs(bf(o[1]) - (-0.5 * 3 / (1 + exp(3.0)))) < 0.072 * 8e-3);
    assert_true(bf(o[2]) == 0.0);
    /* backward against central differences of out = silu(g) u in double */
    const int64_t n = 200;
    uint16_t *G = rand_bf16(n, 4.0), *U = rand_bf16(n, 2.0), *dO = rand_bf16(n, 1.0);
    uint16_t *dG = malloc(2 * n), *dU = malloc(2 * n);
    memcpy(dG, G, 2 * n);
    memcpy(dU, U, 2 * n);
    ref_swiglu_bwd(dO, dG, dU, n);
    for (int64_t i = 0; i < n; i++) {
        double x = bf(G[i]), y = bf(U[i]), h = 1e-6;
        double fd = ((x + h) / (1 + exp(-(x + h))) - (x - h) / (1 + exp(-(x - h)))) / (2 * h) * y * bf(dO[i]);
        assert_true(fabs(bf(dG[i]) - fd) <= 8e-3 * fabs(fd) + 1e-7);
        double su = x / (1 + exp(-x)) * bf(dO[i]);
        assert_true(fabs(bf(dU[i]) - su) <= 8e-3 * fabs(su) + 1e-7);
    }
    free(G), free(U), free(dO), free(dG), free(dU);
}

static void test_loss_by_hand(void **state) {
    (void)state;
    /* row 0: logits 0, 1, 2, target 2: loss = log(1 + e + e^2) - 2; row 1 ignored; row 2: all equal, target 0:
     * loss = log(3) */
    uint16_t l[9];
    const float vals[9] = {0, 1, 2, 5, -5, 0.5f, 3, 3, 3};
    for (int i = 0; i < 9; i++) l[i] = f32_to_bf16(vals[i]);
    int32_t t[3] = {2, -1, 0};
    double loss = ref_loss(l, t, 3, 3, 0.5);
    double want = log(1 + exp(1.0) + exp(2.0)) - 2 + log(3.0);
    assert_true(fabs(loss - want) < 1e-12);
    double z = 1 + exp(1.0) + exp(2.0);
    const double g[9] = {0.5 / z, 0.5 * exp(1.0) / z, 0.5 * (exp(2.0) / z - 1), 0, 0, 0, 0.5 * (1.0 / 3 - 1),
                         0.5 / 3, 0.5 / 3};
    for (int i = 0; i < 9; i++) assert_true(fabs(bf(l[i]) - g[i]) <= 4e-3 * fabs(g[i]));
    for (int i = 3; i < 6; i++) assert_int_equal(l[i], 0);
    /* gradient rows sum to zero (softmax sums to one) */
    const int64_t V = 1000;
    uint16_t *big = rand_bf16(V, 8.0);
    int32_t tb = 17;
    double lb = ref_loss(big, &tb, 1, V, 1.0), s = 0;
    assert_true(lb > 0);
    for (int64_t j = 0; j < V; j++) s += bf(big[j]);
    assert_true(fabs(s) < 1e-2);
    int32_t bad = (int32_t)V;
    assert_true(isnan(ref_loss(big, &bad, 1, V, 1.0)));
    free(big);
}

static void test_adamw_by_hand(void **state) {
    (void)state;
    /* p=1, m=v=0, g=0.5 (grad 1 * grad_scale 0.5), lr 0.1, betas 0.9/0.999, eps 1e-8, wd 0.01, step 1:
     * p = 0.999; m = 0.05; v = 0.00025; mhat = 0.5, sqrt(vhat) = 0.5; p = 0.999 - 0.1 * 0.5 / (0.5 + 1e-8) */
    float p = 1, m = 0, v = 0, g = 1;
    uint16_t pb;
    ref_adamw(&p, &m, &v, &g, &pb, 1, 0.1, 0.9, 0.999, 1e-8, 0.01, 0.5, 1);
    assert_true(fabs(p - (0.999 - 0.1 * 0.5 / (0.5 + 1e-8))) < 1e-7);
    assert_true(fabs(m - 0.05) < 1e-9 && fabs(v - 0.00025) < 1e-10);
    assert_int_equal(pb, f32_to_bf16(p));
    /* a second step with g = -0.5 (grad -2 * 0.25): m = 0.045 - 0.05 = -0.005, v = 0.00024975 + 0.00025 */
    g = -2;
    float p1 = p;
    ref_adamw(&p, &m, &v, &g, &pb, 1, 0.1, 0.9, 0.999, 1e-8, 0.0, 0.25, 2);
    double mh = -0.005 / (1 - 0.81), vh = (0.999 * 0.00025 + 0.001 * 0.25) / (1 - 0.998001);
    assert_true(fabs(m - -0.005) < 1e-9);
    assert_true(fabs(p - (p1 - 0.1 * mh / (sqrt(vh) + 1e-8))) < 1e-7);
    float gs[3] = {1, -2, 3};
    assert_true(ref_sumsq(gs, 3) == 14.0);
}

static void test_ulysses_roundtrip(void **state) {
    (void)state;
    const int C = 4, nout = 3;
    const int64_t T = 5, rb = 8, NIN = C * nout, stride = NIN * rb + 24; /* padded source rows */
    uint8_t *src = malloc((size_t)(T * stride)), *packed = malloc((size_t)(C * T * nout * rb));
    uint8_t *back = calloc(1, (size_t)(T * stride));
    for (int64_t i = 0; i < T * stride; i++) src[i] = (uint8_t)(i * 7 + 3);
    ref_ulysses_pack(src, stride, packed, C, 1, T, nout, rb);
    /* rank 2's block, token 1, head 0 is source token 1, head 2 * nout */
    assert_memory_equal(packed + ((2 * T + 1) * nout) * rb, src + 1 * stride + 2 * nout * rb, rb);
    ref_ulysses_unpack(packed, back, stride, C, T, nout, rb);
    for (int64_t t = 0; t < T; t++) assert_memory_equal(back + t * stride, src + t * stride, NIN * rb);
    /* replicated heads (R = 2): each of the C/R head groups goes to 2 ranks; unpack_add sums both copies */
    const int R = 2;
    const int64_t nin2 = C / R * nout, rb2 = 4, e = T * nin2 * rb2 / 2;
    uint16_t *s2 = malloc((size_t)(e * 2)), *p2 = malloc((size_t)(C * T * nout * rb2)), *acc = malloc((size_t)(e * 2));
    for (int64_t i = 0; i < e; i++) {
        s2[i] = f32_to_bf16((float)(i % 17) - 8.0f);
        acc[i] = f32_to_bf16(1.0f);
    }
    ref_ulysses_pack(s2, nin2 * rb2, p2, C, R, T, nout, rb2);
    assert_memory_equal((uint8_t *)p2 + ((1 * T + 2) * nout) * rb2, (uint8_t *)p2 + ((0 * T + 2) * nout) * rb2,
                        nout * rb2); /* ranks 0 and 1 hold the same heads */
    ref_ulysses_unpack_add(p2, acc, nin2 * rb2, C, R, T, nout, rb2);
    for (int64_t i = 0; i < e; i++) assert_true(bf(acc[i]) == 1.0 + 2.0 * bf(s2[i]));
    free(src), free(packed), free(back), free(s2), free(p2), free(acc);
}

static void test_embedding_scatter_add(void **state) {
    (void)state;
    const int64_t V = 6, H = 4;
    uint16_t table[24], out[12], dout[12];
    for (int i = 0; i < 24; i++) table[i] = f32_to_bf16((float)i);
    for (int i = 0; i < 12; i++) dout[i] = f32_to_bf16((float)(i + 1));
    int32_t tok[3] = {3, 1, 3};
    ref_embedding_fwd(tok, 3, table, V, H, out);
    assert_memory_equal(out, table + 12, 8);
    assert_memory_equal(out + 4, table + 4, 8);
    float dt[24];
    for (int i = 0; i < 24; i++) dt[i] = 0.5f;
    ref_embedding_bwd(tok, 3, dout, V, H, dt);
    for (int j = 0; j < 4; j++) {
        assert_true(dt[3 * 4 + j] == 0.5f + (float)(j + 1) + (float)(j + 9)); /* rows 0 and 2 both add */
        assert_true(dt[1 * 4 + j] == 0.5f + (float)(j + 5));
        assert_true(dt[0 * 4 + j] == 0.5f);
    }
    int32_t bad[1] = {(int32_t)V};
    ref_embedding_fwd(bad, 1, table, V, H, out);
    assert_true(isnan(bf(out[0])));
}

/* FP8 bytes by hand: exact values, ties to even, saturation, subnormals; every finite byte round trips; amax and a
 * transposed cast of a strided 2 x 2 */
static void test_fp8(void **state) {
    (void)state;
    assert_int_equal(ref_fp8_of(1.0f, false), 0x38);
    assert_int_equal(ref_fp8_of(-2.0f, false), 0xc0);
    assert_int_equal(ref_fp8_of(448.0f, false), 0x7e);
    assert_int_equal(ref_fp8_of(500.0f, false), 0x7e);
    assert_int_equal(ref_fp8_of(-1e9f, false), 0xfe);
    assert_int_equal(ref_fp8_of(0x1p-9f, false), 0x01);  /* the smallest subnormal */
    assert_int_equal(ref_fp8_of(0x1p-11f, false), 0x00); /* a quarter of it: to zero */
    assert_int_equal(ref_fp8_of(1.0625f, false), 0x38);  /* halfway between 1 and 1.125: the even byte */
    assert_int_equal(ref_fp8_of(1.1875f, false), 0x3a);  /* halfway between 1.125 and 1.25 */
    assert_int_equal(ref_fp8_of(1.0f, true), 0x3c);
    assert_int_equal(ref_fp8_of(1.125f, true), 0x3c);
    assert_int_equal(ref_fp8_of(57344.0f, true), 0x7b);
    assert_int_equal(ref_fp8_of(1e6f, true), 0x7b);
    assert_true(isnan(ref_fp8_value(0x7f, false)) && isinf(ref_fp8_value(0x7c, true)));
    for (int e5 = 0; e5 < 2; e5++)
        for (int b = 0; b < 256; b++) {
            double v = ref_fp8_value((uint8_t)b, e5);
            if (isfinite(v)) assert_int_equal(ref_fp8_of((float)v, e5), b);
        }
    /* [2][2] with row stride 3: 1, -3 / 0.5, 2 (the third column is not the matrix's) */
    uint16_t src[6] = {0x3f80, 0xc040, 0x7f80, 0x3f00, 0x4000, 0x7f80};
    float slot[3];
    ref_fp8_amax(src, 2, 2, 3, false, slot);
    assert_true(slot[2] == 3.0f && slot[0] == 3.0f / 448 && slot[1] == 448.0f / 3);
    uint8_t dst[4];
    ref_fp8_cast(src, 2, 2, 3, false, true, 2.0f, dst); /* transposed: 2, 1 / -6, 4 */
    assert_int_equal(dst[0], 0x40);
    assert_int_equal(dst[1], 0x38);
    assert_int_equal(dst[2], 0xcc);
    assert_int_equal(dst[3], 0x48);
    uint16_t zero[4] = {0, 0x8000, 0, 0};
    ref_fp8_amax(zero, 2, 2, 2, true, slot);
    assert_true(slot[0] == 1.0f && slot[1] == 1.0f && slot[2] == 0.0f);
}

static void test_cast_and_delta(void **state) {
    (void)state;
    float f[4] = {1.0f, 1.0f + 0x1p-8f, -3.5f, 1e-30f};
    uint16_t b[4];
    ref_cast_f32_to_bf16(f, b, 4);
    assert_int_equal(b[0], 0x3f80);
    assert_int_equal(b[1], 0x3f80);
    assert_true(bf(b[2]) == -3.5);
    assert_true(fabs(bf(b[3]) - 1e-30) < 1e-32);
    uint16_t d[8], o[8];
    for (int i = 0; i < 8; i++) {
        d[i] = f32_to_bf16((float)i);
        o[i] = f32_to_bf16(0.5f);
    }
    float delta[2];
    ref_attn_delta(d, o, delta, 1, 2, 4); /* heads of 4: 0.5*(0+1+2+3), 0.5*(4+5+6+7) */
    assert_true(delta[0] == 3.0f && delta[1] == 11.0f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rounding),       cmocka_unit_test(test_rmsnorm_unit_rms),
        cmocka_unit_test(test_rmsnorm_bwd_gradient), cmocka_unit_test(test_rope_rotation),
        cmocka_unit_test(test_rope_frequencies),    cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_loss_by_hand),        cmocka_unit_test(test_adamw_by_hand),
        cmocka_unit_test(test_ulysses_roundtrip),   cmocka_unit_test(test_embedding_scatter_add),
        cmocka_unit_test(test_cast_and_delta),      cmocka_unit_test(test_fp8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
