/* test_ref_attention.c: checks the float64 attention reference that the GPU kernels are compared with: its backward
 * against central finite differences of its forward, its log-sum-exp against a direct sum, GQA against plain
 * attention on repeated K and V, and that splitting the rows over calls changes nothing. With document masks: each
 * document alone through the unmasked reference gives the same, a ring's blocks (a launch whose queries and keys lie
 * at different positions) merge into the whole sequence's forward, rows that keep no key give o = 0 and lse = -inf,
 * and the masked backward matches finite differences. */
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

/* doc_start, doc_end over T positions from the documents' lengths (summing to T) */
static void docs_from_lengths(const int *len, int n, int T, int *start, int *end) {
    int a = 0;
    for (int d = 0; d < n; d++) {
        for (int i = a; i < a + len[d]; i++) start[i] = a, end[i] = a + len[d];
        a += len[d];
    }
    assert_int_equal(a, T);
}

static void fd_run(problem *pp) {
    problem p = *pp;
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
}

static void test_backward_matches_finite_differences_causal(void **state) {
    (void)state;
    problem p = make(6, 4, 2, 3, true);
    fd_run(&p);
    release(&p);
}

static void test_backward_matches_finite_differences_full(void **state) {
    (void)state;
    problem p = make(6, 4, 2, 3, false);
    fd_run(&p);
    release(&p);
}

/* Document masks: causal over 7 tokens in documents of 1, 3 and 3; and a ring's off-diagonal block, queries at
 * positions 8..15 and keys at 0..7, not causal, whose rows at 12.. keep no key (their documents start at 12 and 13). */
static void test_backward_matches_finite_differences_documents(void **state) {
    (void)state;
    int start[16], end[16];
    docs_from_lengths((const int[]){1, 3, 3}, 3, 7, start, end);
    problem p = make(7, 2, 1, 3, true);
    p.sh.doc_start = start, p.sh.doc_end = end;
    fd_run(&p);
    release(&p);
    docs_from_lengths((const int[]){3, 9, 1, 3}, 4, 16, start, end);
    p = make(8, 2, 2, 3, false);
    p.sh.doc_start = start, p.sh.doc_end = end, p.sh.q_pos = 8, p.sh.k_pos = 0;
    fd_run(&p);
    for (int h = 0; h < 2; h++)
        for (int64_t i = 0; i < 8; i++) {
            const bool none = 8 + i >= 12;
            assert_true(none ? isinf(p.lse[h * 8 + i]) && p.lse[h * 8 + i] < 0 : isfinite(p.lse[h * 8 + i]));
            for (int64_t d = 0; d < 3; d++)
                if (none) assert_true(p.o[(i * 2 + h) * 3 + d] == 0 && p.dq[(i * 2 + h) * 3 + d] == 0);
        }
    /* keys 0..2 are in a document that ends before every query: no gradient */
    for (int64_t x = 0; x < 3 * 2 * 3; x++) assert_true(p.dk[x] == 0 && p.dv[x] == 0);
    release(&p);
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

/* Rows [a, a + n) of x (row width w) into a new array. */
static double *rows_of(const double *x, int64_t a, int64_t n, int64_t w) {
    double *r = malloc(sizeof(double) * (size_t)(n * w));
    memcpy(r, x + a * w, sizeof(double) * (size_t)(n * w));
    return r;
}

static void assert_close(const double *x, const double *y, int64_t n, const char *what) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(x[i] - y[i]) <= 1e-13 * (1 + fabs(y[i]))))
            fail_msg("%s[%lld]: %.17g, expected %.17g", what, (long long)i, x[i], y[i]);
}

/* Causal attention over packed documents equals each document alone through the unmasked reference, forward and
 * backward: a 1-token document first, one ending exactly on 128, another of 1 token, a long one. */
static void test_documents_equal_each_alone(void **state) {
    (void)state;
    enum { S = 300, QH = 4, KVH = 2, D = 8 };
    const int len[] = {1, 127, 1, 171};
    int start[S], end[S];
    docs_from_lengths(len, 4, S, start, end);
    assert_int_equal(end[127], 128);
    problem p = make(S, QH, KVH, D, true);
    p.sh.doc_start = start, p.sh.doc_end = end;
    run_all(&p);
    for (int d = 0, a = 0; d < 4; a += len[d++]) {
        const int64_t L = len[d];
        problem s = make(L, QH, KVH, D, true);
        free(s.q), free(s.k), free(s.v), free(s.dout);
        s.q = rows_of(p.q, a, L, QH * D), s.dout = rows_of(p.dout, a, L, QH * D);
        s.k = rows_of(p.k, a, L, KVH * D), s.v = rows_of(p.v, a, L, KVH * D);
        run_all(&s);
        assert_close(p.o + a * QH * D, s.o, L * QH * D, "o");
        assert_close(p.dq + a * QH * D, s.dq, L * QH * D, "dq");
        assert_close(p.dk + a * KVH * D, s.dk, L * KVH * D, "dk");
        assert_close(p.dv + a * KVH * D, s.dv, L * KVH * D, "dv");
        for (int h = 0; h < QH; h++) assert_close(p.lse + h * S + a, s.lse + h * L, L, "lse");
        release(&s);
    }
    release(&p);
}

/* A ring's blocks over 2n tokens in documents that cross the halves: the first half's causal block, the second
 * half's causal block (positions n..) and the off-diagonal block (queries at n.., keys at 0.., not causal) merged by
 * their log-sum-exps give the whole sequence's causal forward. The off-diagonal block's rows whose documents start
 * at n or later keep no key: o = 0 and lse = -inf there, exactly. */
static void test_documents_ring_blocks_merge(void **state) {
    (void)state;
    enum { N = 100, T = 2 * N, QH = 2, KVH = 1, D = 8 };
    int start[T], end[T];
    docs_from_lengths((const int[]){30, 100, 1, 69}, 4, T, start, end);
    problem w = make(T, QH, KVH, D, true);
    w.sh.doc_start = start, w.sh.doc_end = end;
    run_all(&w);
    /* blocks: a = rows and keys 0..n; b = rows and keys n..; c = rows n.., keys 0.. */
    problem b[3];
    const int64_t qa[3] = {0, N, N}, ka[3] = {0, N, 0};
    for (int x = 0; x < 3; x++) {
        b[x] = make(N, QH, KVH, D, x < 2);
        free(b[x].q), free(b[x].k), free(b[x].v), free(b[x].dout);
        b[x].q = rows_of(w.q, qa[x], N, QH * D), b[x].dout = rows_of(w.dout, qa[x], N, QH * D);
        b[x].k = rows_of(w.k, ka[x], N, KVH * D), b[x].v = rows_of(w.v, ka[x], N, KVH * D);
        b[x].sh.doc_start = start, b[x].sh.doc_end = end, b[x].sh.q_pos = qa[x], b[x].sh.k_pos = ka[x];
        run_all(&b[x]);
    }
    assert_close(b[0].o, w.o, N * QH * D, "o (first half)");
    int none = 0;
    for (int h = 0; h < QH; h++)
        for (int64_t i = 0; i < N; i++) {
            assert_close(&b[0].lse[h * N + i], &w.lse[h * T + i], 1, "lse (first half)");
            const double l1 = b[1].lse[h * N + i], l2 = b[2].lse[h * N + i];
            if (start[N + i] >= N) {
                none++;
                assert_true(isinf(l2) && l2 < 0);
                for (int64_t d = 0; d < D; d++) assert_true(b[2].o[(i * QH + h) * D + d] == 0);
            }
            const double l = l2 == -INFINITY ? l1 : l1 + log1p(exp(l2 - l1));
            assert_close(&l, &w.lse[h * T + N + i], 1, "lse (merged)");
            for (int64_t d = 0; d < D; d++) {
                const int64_t x = (i * QH + h) * D + d;
                const double o = b[1].o[x] * exp(l1 - l) + b[2].o[x] * exp(l2 - l);
                assert_close(&o, &w.o[(N * QH) * D + x], 1, "o (merged)");
            }
        }
    assert_int_equal(none, QH * 70); /* positions 130..199 */
    for (int x = 0; x < 3; x++) release(&b[x]);
    release(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backward_matches_finite_differences_causal),
        cmocka_unit_test(test_backward_matches_finite_differences_full),
        cmocka_unit_test(test_lse_consistent),
        cmocka_unit_test(test_gqa_equals_repeated_kv),
        cmocka_unit_test(test_split_ranges),
        cmocka_unit_test(test_backward_matches_finite_differences_documents),
        cmocka_unit_test(test_documents_equal_each_alone),
        cmocka_unit_test(test_documents_ring_blocks_merge),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
