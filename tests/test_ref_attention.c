/* test_ref_attention.c: checks the float64 attention reference that the GPU kernels are compared with: its backward
 * against central finite differences of its forward, its log-sum-exp against a direct sum, GQA against plain
 * attention on repeated K and V, and that splitting the rows over calls changes nothing. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ref/ref_attention.h"

static uint64_t rng_state = 12345;
static double urand(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(rng_state >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}

typedef struct {
    ref_attn_shape sh;
    int64_t nq, nkv, nlse;
    double *q, *k, *v, *dout, *o, *lse, *dq, *dk, *dv;
} problem;

static problem make(int64_t S, int QH, int KVH, int64_t D, bool causal) {
    problem p = {.sh = {S, QH, KVH, D, causal, 1.0 / sqrt((double)D)}};
    p.nq = S * QH * D;
    p.nkv = S * KVH * D;
    p.nlse = S * QH;
    p.q = malloc(sizeof(double) * p.nq);
    p.k = malloc(sizeof(double) * p.nkv);
    p.v = malloc(sizeof(double) * p.nkv);
    p.dout = malloc(sizeof(double) * p.nq);
    p.o = malloc(sizeof(double) * p.nq);
    p.lse = malloc(sizeof(double) * p.nlse);
    p.dq = malloc(sizeof(double) * p.nq);
    p.dk = calloc(p.nkv, sizeof(double));
    p.dv = calloc(p.nkv, sizeof(double));
    /* scores of a few units so the softmax is far from uniform */
    for (int64_t i = 0; i < p.nq; i++) p.q[i] = 2.0 * urand();
    for (int64_t i = 0; i < p.nkv; i++) p.k[i] = 2.0 * urand();
    for (int64_t i = 0; i < p.nkv; i++) p.v[i] = urand();
    for (int64_t i = 0; i < p.nq; i++) p.dout[i] = urand();
    return p;
}

static void release(problem *p) {
    free(p->q), free(p->k), free(p->v), free(p->dout), free(p->o), free(p->lse), free(p->dq), free(p->dk),
        free(p->dv);
}

static void run_all(problem *p) {
    ref_attention_fwd(&p->sh, p->q, p->k, p->v, p->o, p->lse, 0, p->sh.q_heads, 0, p->sh.seq);
    memset(p->dk, 0, sizeof(double) * p->nkv);
    memset(p->dv, 0, sizeof(double) * p->nkv);
    ref_attention_bwd(&p->sh, p->q, p->k, p->v, p->dout, p->dq, p->dk, p->dv, 0, p->sh.q_heads, 0, p->sh.seq);
}

/* L = sum(dout * o), whose gradient the backward returns. */
static double loss(problem *p) {
    ref_attention_fwd(&p->sh, p->q, p->k, p->v, p->o, p->lse, 0, p->sh.q_heads, 0, p->sh.seq);
    double l = 0;
    for (int64_t i = 0; i < p->nq; i++) l += p->dout[i] * p->o[i];
    return l;
}

static void check_fd(double *x, const double *grad, int64_t n, problem *p) {
    const double h = 1e-5;
    for (int64_t i = 0; i < n; i++) {
        double keep = x[i];
        x[i] = keep + h;
        double lp = loss(p);
        x[i] = keep - h;
        double lm = loss(p);
        x[i] = keep;
        double fd = (lp - lm) / (2 * h);
        if (fabs(fd - grad[i]) > 1e-7 * (1 + fabs(fd))) fail_msg("element %lld: backward %.12g, finite difference %.12g",
                                                                  (long long)i, grad[i], fd);
    }
}

static void fd_case(bool causal) {
    problem p = make(6, 4, 2, 3, causal);
    run_all(&p);
    double *dq = malloc(sizeof(double) * p.nq), *dk = malloc(sizeof(double) * p.nkv),
           *dv = malloc(sizeof(double) * p.nkv);
    memcpy(dq, p.dq, sizeof(double) * p.nq);
    memcpy(dk, p.dk, sizeof(double) * p.nkv);
    memcpy(dv, p.dv, sizeof(double) * p.nkv);
    check_fd(p.q, dq, p.nq, &p);
    check_fd(p.k, dk, p.nkv, &p);
    check_fd(p.v, dv, p.nkv, &p);
    free(dq), free(dk), free(dv);
    release(&p);
}

static void test_backward_matches_finite_differences_causal(void **state) {
    (void)state;
    fd_case(true);
}

static void test_backward_matches_finite_differences_full(void **state) {
    (void)state;
    fd_case(false);
}

/* lse is log(sum_j exp(scale * q_i . k_j)) over visible keys, and o_i = sum_j exp(s_ij - lse_i) v_j. */
static void test_lse_consistent(void **state) {
    (void)state;
    for (int c = 0; c < 2; c++) {
        problem p = make(9, 3, 1, 4, c == 1);
        run_all(&p);
        const int64_t S = p.sh.seq, D = p.sh.head_dim;
        for (int h = 0; h < 3; h++)
            for (int64_t i = 0; i < S; i++) {
                int64_t n = c ? i + 1 : S;
                double sum = 0, o[4] = {0};
                for (int64_t j = 0; j < n; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) s += p.q[(i * 3 + h) * D + d] * p.k[j * D + d];
                    sum += exp(s * p.sh.scale);
                }
                double lse = p.lse[h * S + i];
                assert_true(fabs(lse - log(sum)) < 1e-12 * (1 + fabs(lse)));
                for (int64_t j = 0; j < n; j++) {
                    double s = 0;
                    for (int64_t d = 0; d < D; d++) s += p.q[(i * 3 + h) * D + d] * p.k[j * D + d];
                    for (int64_t d = 0; d < D; d++) o[d] += exp(s * p.sh.scale - lse) * p.v[j * D + d];
                }
                for (int64_t d = 0; d < D; d++) assert_true(fabs(o[d] - p.o[(i * 3 + h) * D + d]) < 1e-12);
            }
        release(&p);
    }
}

/* GQA with 4 query heads on 2 KV heads equals plain attention on K, V with each KV head repeated twice;
 * dk, dv of a KV head are the sums over its query heads. */
static void test_gqa_equals_repeated_kv(void **state) {
    (void)state;
    problem g = make(7, 4, 2, 5, true);
    problem m = make(7, 4, 4, 5, true);
    const int64_t S = 7, D = 5;
    memcpy(m.q, g.q, sizeof(double) * g.nq);
    memcpy(m.dout, g.dout, sizeof(double) * g.nq);
    for (int64_t s = 0; s < S; s++)
        for (int h = 0; h < 4; h++)
            for (int64_t d = 0; d < D; d++) {
                m.k[(s * 4 + h) * D + d] = g.k[(s * 2 + h / 2) * D + d];
                m.v[(s * 4 + h) * D + d] = g.v[(s * 2 + h / 2) * D + d];
            }
    run_all(&g);
    run_all(&m);
    for (int64_t i = 0; i < g.nq; i++) {
        assert_true(fabs(g.o[i] - m.o[i]) < 1e-13);
        assert_true(fabs(g.dq[i] - m.dq[i]) < 1e-13);
    }
    for (int64_t s = 0; s < S; s++)
        for (int kh = 0; kh < 2; kh++)
            for (int64_t d = 0; d < D; d++) {
                int64_t gi = (s * 2 + kh) * D + d, m0 = (s * 4 + 2 * kh) * D + d, m1 = m0 + D;
                assert_true(fabs(g.dk[gi] - (m.dk[m0] + m.dk[m1])) < 1e-13);
                assert_true(fabs(g.dv[gi] - (m.dv[m0] + m.dv[m1])) < 1e-13);
            }
    release(&g);
    release(&m);
}

/* Splitting rows and heads over calls (as the GPU test does over threads) gives the same result. */
static void test_split_ranges(void **state) {
    (void)state;
    problem a = make(10, 2, 1, 4, true);
    run_all(&a);
    double *dq = malloc(sizeof(double) * a.nq), *dk = calloc(a.nkv, sizeof(double)),
           *dv = calloc(a.nkv, sizeof(double)), *o = malloc(sizeof(double) * a.nq),
           *lse = malloc(sizeof(double) * a.nlse);
    for (int h = 0; h < 2; h++)
        for (int64_t r = 0; r < 10; r += 3) {
            int64_t r1 = r + 3 < 10 ? r + 3 : 10;
            ref_attention_fwd(&a.sh, a.q, a.k, a.v, o, lse, h, h + 1, r, r1);
            ref_attention_bwd(&a.sh, a.q, a.k, a.v, a.dout, dq, dk, dv, h, h + 1, r, r1);
        }
    for (int64_t i = 0; i < a.nq; i++) assert_true(fabs(o[i] - a.o[i]) < 1e-14 && fabs(dq[i] - a.dq[i]) < 1e-14);
    for (int64_t i = 0; i < a.nlse; i++) assert_true(fabs(lse[i] - a.lse[i]) < 1e-14);
    for (int64_t i = 0; i < a.nkv; i++) assert_true(fabs(dk[i] - a.dk[i]) < 1e-13 && fabs(dv[i] - a.dv[i]) < 1e-13);
    free(dq), free(dk), free(dv), free(o), free(lse);
    release(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backward_matches_finite_differences_causal),
        cmocka_unit_test(test_backward_matches_finite_differences_full),
        cmocka_unit_test(test_lse_consistent),
        cmocka_unit_test(test_gqa_equals_repeated_kv),
        cmocka_unit_test(test_split_ranges),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
