/* test_ring.c: ring attention over a zigzag split (gen/ring.c) and the LSE merge (tests/ref's ref_attn_merge, the
 * math of templates/attn_merge.cu). The schedule: at every ring step each (query chunk, key chunk) pair it computes
 * is computed with the mask the global causal order gives it, every pair at or below the diagonal is computed once
 * over all positions and steps, and every step is the same work; the plan's two half-block launches of a step are
 * its pairs. The math: ring attention of a causal sequence, block by block with the schedule (or half block by half
 * block, as the plan launches it) and merged by LSE, equals the float64 reference of the whole sequence. With packed
 * documents: step 0's three half launches are the own block's pairs, each launch's mask positions are its chunks'
 * global ones, and the ring's half launches, merged forward and summed backward, are exactly (float64) the whole
 * sequence's masked attention. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ref/ref.h"
#include "ring.h"
#include "util.h"

#define MAXP 8

/* The mask a step applies to its pair of halves (qh, kh): outside its ranges skipped, else causal on the local order
 * or none. */
static cp_ring_mask step_mask(const cp_ring_step *s, int qh, int kh) {
    if (qh < s->q_half0 || qh >= s->q_half1 || kh < s->k_half0 || kh >= s->k_half1) return CP_RING_SKIP;
    if (!s->causal) return CP_RING_FULL;
    return kh < qh ? CP_RING_FULL : kh == qh ? CP_RING_DIAG : CP_RING_SKIP;
}

static void test_zigzag_classification(void **state) {
    (void)state;
    for (int P = 1; P <= MAXP; P++) {
        int covered[2 * MAXP][2 * MAXP] = {{0}};
        for (int p = 0; p < P; p++) {
            int seen_source[MAXP] = {0};
            for (int k = 0; k < P; k++) {
                cp_ring_step s = cp_ring_step_of(P, p, k);
                assert_int_equal(s.source, (p - k + P) % P); /* received from the previous rank, one more each step */
                seen_source[s.source]++;
                int work = 0; /* in halves of a c x c chunk pair: full 2, diagonal 1 */
                for (int qh = 0; qh < 2; qh++)
                    for (int kh = 0; kh < 2; kh++) {
                        int qc = cp_ring_chunk(P, p, qh), kc = cp_ring_chunk(P, s.source, kh);
                        cp_ring_mask want = cp_ring_pair(qc, kc), got = step_mask(&s, qh, kh);
                        if (want != got)
                            fail_msg("P=%d p=%d step %d: chunks (%d, %d) masked %d, causal order says %d", P, p, k, qc,
                                     kc, got, want);
                        if (got != CP_RING_SKIP) covered[qc][kc]++;
                        work += got == CP_RING_FULL ? 2 : got == CP_RING_DIAG ? 1 : 0;
                    }
                assert_int_equal(work, 4); /* every step the same: load balanced */
            }
            for (int j = 0; j < P; j++) assert_int_equal(seen_source[j], 1);
        }
        for (int qc = 0; qc < 2 * P; qc++)
            for (int kc = 0; kc < 2 * P; kc++) assert_int_equal(covered[qc][kc], kc <= qc ? 1 : 0);
    }
    /* P = 4, position 1 (chunks 1 and 6): its own block causal, then from 0 (chunks 0, 7) only key half 0 for both
     * query halves, from 3 (chunks 3, 4) and 2 (chunks 2, 5) everything for query half 1 only */
    cp_ring_step s0 = cp_ring_step_of(4, 1, 0), s1 = cp_ring_step_of(4, 1, 1), s2 = cp_ring_step_of(4, 1, 2);
    assert_int_equal(cp_ring_chunk(4, 1, 1), 6);
    assert_true(s0.source == 1 && s0.causal && s0.q_half0 == 0 && s0.q_half1 == 2 && s0.k_half1 == 2);
    assert_true(s1.source == 0 && !s1.causal && s1.q_half0 == 0 && s1.q_half1 == 2 && s1.k_half0 == 0 &&
                s1.k_half1 == 1);
    assert_true(s2.source == 3 && !s2.causal && s2.q_half0 == 1 && s2.q_half1 == 2 && s2.k_half0 == 0 &&
                s2.k_half1 == 2);
    assert_int_equal(cp_ring_pair(6, 3), CP_RING_FULL);
    assert_int_equal(cp_ring_pair(1, 3), CP_RING_SKIP);
    assert_int_equal(cp_ring_pair(2, 2), CP_RING_DIAG);
    /* the 8B shape at 8M tokens, ring 4: a stage's block of S/P = 2M tokens, 1 KV head per rank, head_dim 128 */
    assert_int_equal(cp_ring_kv_bytes(2097152, 1, 128), 1073741824LL);
}

/* The two half-block launches of a step k >= 1 (what one plan runs at every position) are exactly the (query half,
 * key half) pairs cp_ring_step_of gives the position, each once; part 0 is the same pair at every position. And the
 * most RoPE runs a rank has is what cp_ring_rope_runs gives the ranks. */
static void test_half_launches(void **state) {
    (void)state;
    for (int P = 2; P <= MAXP; P++)
        for (int p = 0; p < P; p++)
            for (int k = 1; k < P; k++) {
                cp_ring_step s = cp_ring_step_of(P, p, k);
                int want[2][2] = {{0}}, got[2][2] = {{0}};
                for (int qh = s.q_half0; qh < s.q_half1; qh++)
                    for (int kh = s.k_half0; kh < s.k_half1; kh++) want[qh][kh] = 1;
                for (int part = 0; part < 2; part++) {
                    cp_ring_half h = cp_ring_half_of(P, p, k, part);
                    got[h.q_half][h.k_half]++;
                    if (part == 0) assert_true(h.q_half == 1 && h.k_half == 0);
                }
                for (int qh = 0; qh < 2; qh++)
                    for (int kh = 0; kh < 2; kh++)
                        if (got[qh][kh] != want[qh][kh])
                            fail_msg("P=%d p=%d step %d: halves (%d, %d) launched %d times, the step has %d", P, p, k,
                                     qh, kh, got[qh][kh], want[qh][kh]);
            }
    /* the span of a launch over the positions: part 0 is one pair everywhere; part 1 takes both halves at every step
     * k >= 1, since positions p >= k hold a block from an earlier position (halves 0) and p < k from a later one
     * (halves 1) */
    for (int P = 2; P <= MAXP; P++)
        for (int k = 1; k < P; k++) {
            cp_ring_span a = cp_ring_half_span(P, k, 0), b = cp_ring_half_span(P, k, 1);
            assert_true(a.q0 == 1 && a.q1 == 2 && a.k0 == 0 && a.k1 == 1);
            assert_true(b.q0 == 0 && b.q1 == 2 && b.k0 == 0 && b.k1 == 2);
        }
    /* with documents, step 0's three half launches: each of the own block's pairs the causal step computes, the
     * diagonal ones (and they alone) causal, at the positions of this position's chunks, the same span everywhere */
    for (int P = 2; P <= MAXP; P++)
        for (int p = 0; p < P; p++) {
            const int64_t c = 5;
            cp_ring_step s = cp_ring_step_of(P, p, 0);
            int got[2][2] = {{0}};
            for (int part = 0; part < CP_RING_STEP0_PARTS; part++) {
                cp_ring_half h = cp_ring_half_of(P, p, 0, part);
                cp_ring_span sp = cp_ring_half_span(P, 0, part);
                cp_ring_pos pos = cp_ring_half_pos(P, p, 0, part, c);
                got[h.q_half][h.k_half]++;
                assert_true(sp.q0 == h.q_half && sp.q1 == h.q_half + 1 && sp.k0 == h.k_half && sp.k1 == h.k_half + 1);
                cp_ring_mask m = step_mask(&s, h.q_half, h.k_half);
                assert_int_equal(cp_ring_half_causal(0, part), m == CP_RING_DIAG);
                assert_int_equal(m == CP_RING_DIAG ? 1 : 0, h.q_half == h.k_half);
                assert_true(m != CP_RING_SKIP);
                assert_int_equal(pos.q_pos, (h.q_half ? 2 * P - 1 - p : p) * c);
                assert_int_equal(pos.k_pos, (h.k_half ? 2 * P - 1 - p : p) * c);
            }
            assert_true(got[0][0] == 1 && got[1][1] == 1 && got[1][0] == 1 && got[0][1] == 0);
            /* a received block's launches: maskless, keys at the source's chunks, all before the queries */
            for (int k = 1; k < P; k++)
                for (int part = 0; part < 2; part++) {
                    cp_ring_half h = cp_ring_half_of(P, p, k, part);
                    cp_ring_pos pos = cp_ring_half_pos(P, p, k, part, c);
                    int src = ((p - k) % P + P) % P;
                    assert_false(cp_ring_half_causal(k, part));
                    assert_int_equal(pos.q_pos, (h.q_half ? 2 * P - 1 - p : p) * c);
                    assert_int_equal(pos.k_pos, (h.k_half ? 2 * P - 1 - src : src) * c);
                    assert_true(pos.k_pos + c <= pos.q_pos);
                }
        }
    /* P = 4, position 1: from 0 (an earlier position) q0k0, from 3 and 2 q1k1 */
    assert_int_equal(cp_ring_half_of(4, 1, 1, 1).q_half, 0);
    assert_int_equal(cp_ring_half_of(4, 1, 2, 1).k_half, 1);
    for (int P = 1; P <= MAXP; P++)
        for (int C = 1; C <= 8; C++) {
            int most = 0;
            for (int p = 0; p < P; p++)
                for (int r = 0; r < C; r++) {
                    cp_ring_rope_run run[2];
                    most = CP_MAX(most, cp_ring_rope_runs(P, p, 2LL * P * C * 4, C, r, run));
                }
            assert_int_equal(cp_ring_rope_nruns(P, C), most);
        }
}

/* The 8B shape (32 heads, 8 KV heads, head_dim 128) at 8M tokens on 32 GPUs, ring 4 x 8 GPUs, UPipe U = 8: a group
 * holds S/P = 2M tokens; u = 1 query head and kvr = 1 KV head per rank per stage. With 2 replicas (64 GPUs) every
 * GPU's terms are the same: replicas add sequences, not buffers. */
static void test_ring_terms_8b_8m(void **state) {
    (void)state;
    const int64_t S = 8388608, L = S / 4;
    cp_ring_terms t;
    cp_ring_terms_of(4, L, 1, 1, 128, &t);
    assert_int_equal(t.kv_block, 2 * 2097152LL * 1 * 128 * 2); /* K and V, bf16: 1 GiB */
    assert_int_equal(t.kv_block, 1LL << 30);
    assert_int_equal(t.kv_recv, 2LL << 30);
    assert_int_equal(t.o_acc, 2097152LL * 128 * 4);            /* 1 GiB */
    assert_int_equal(t.lse_blk, 8LL << 20);                    /* 8 MiB */
    assert_int_equal(t.dkv_block, 2LL << 30);                  /* dK, dV fp32 */
    assert_int_equal(t.dkv_recv, 4LL << 30);
    assert_int_equal(t.dkv_step, 2LL << 30);                   /* a step's own dK, dV */
    assert_int_equal(t.dq_half, 1048576LL * 128 * 4);          /* a half block's fp32 dQ: 512 MiB */
    assert_int_equal(t.fwd_sent, 3LL << 30);                   /* 3 blocks of 1 GiB */
    assert_int_equal(t.bwd_sent, (3LL << 30) + 4 * (2LL << 30)); /* 3 blocks, 4 accumulator hops: 11 GiB */
    /* a ring of 1 adds nothing and sends nothing */
    cp_ring_terms one;
    cp_ring_terms_of(1, S, 1, 1, 128, &one);
    /* a ring of 2 receives one block per stage, under the own block's attention: one slot */
    cp_ring_terms two;
    cp_ring_terms_of(2, L, 1, 1, 128, &two);
    assert_int_equal(two.kv_recv, two.kv_block);
    assert_int_equal(two.dkv_recv, 2 * two.dkv_block); /* an accumulator still arrives while one is in hand */
    assert_true(one.kv_recv == 0 && one.o_acc == 0 && one.lse_blk == 0 && one.dkv_recv == 0 && one.dkv_step == 0 &&
                one.dq_half == 0 && one.fwd_sent == 0 && one.bwd_sent == 0);
    /* a rank's 4 stages (H / U) of u = 1 query head, P = 4 ring steps each, over the 32 ranks: the causal forward
     * 2 S^2 H D of the whole sequence */
    double per_rank = 4 * 4 * cp_ring_step_fwd_flops(L, 1, 128);
    assert_float_equal(per_rank * 32, 2.0 * (double)S * S * 32 * 128, 1e3);
    assert_float_equal(cp_ring_step_fwd_flops(L, 1, 128), 1125899906842624.0, 0.5); /* 2 * 2^42 * 128 */
    /* a 1 GiB block at 40 GB/s takes 26.86 ms: hidden behind a block's attention of seconds, exposed by 16.86 ms
     * beyond 10 ms of it */
    /* a send_recv step of the block: 2^30 / 4e10 + 2e-5 s on the default machine (40 GB/s, 20 us) */
    cp_machine mc;
    cp_machine_defaults(&mc);
    assert_float_equal(cp_ring_sendrecv_seconds(1LL << 30, &mc), 0.0268635456, 1e-12);
    assert_float_equal(cp_ring_exposed(1LL << 30, &mc, 2.0), 0, 0);
    assert_float_equal(cp_ring_exposed(1LL << 30, &mc, 0.010), (1LL << 30) / 40e9 + 20e-6 - 0.010, 1e-12);
}

/* RoPE positions under the zigzag: over every ring position and rank, each position of the sequence is given to
 * exactly one row, runs are consecutive within a chunk, two runs only where an odd C straddles the chunks, and P = 1
 * is the plain layout (rank r at r T). Then one case by hand: P = 4, C = 3, 48 tokens in chunks of 6, groups of 12
 * rows, T = 4: ring position 1 holds chunks 1 and 6, and its rank 1 rows 4..7, at positions 10, 11 (chunk 1) and
 * 36, 37 (chunk 6). */
static void test_rope_runs(void **state) {
    (void)state;
    for (int P = 1; P <= 8; P++)
        for (int C = 1; C <= 8; C++) {
            int64_t S = 2LL * P * C * 3, T = S / P / C;
            int seen[2 * 8 * 8 * 3] = {0};
            for (int p = 0; p < P; p++)
                for (int r = 0; r < C; r++) {
                    cp_ring_rope_run run[2];
                    int n = cp_ring_rope_runs(P, p, S, C, r, run);
                    assert_true(n == 1 || (n == 2 && C % 2 == 1 && P > 1));
                    int64_t rows = 0;
                    for (int i = 0; i < n; i++) {
                        assert_int_equal(run[i].row0, rows);
                        rows += run[i].rows;
                        for (int64_t j = 0; j < run[i].rows; j++) seen[run[i].pos0 + j]++;
                    }
                    assert_int_equal(rows, T);
                    if (P == 1) assert_int_equal(run[0].pos0, (int64_t)r * T);
                }
            for (int64_t x = 0; x < S; x++) assert_int_equal(seen[x], 1);
        }
    cp_ring_rope_run run[2];
    /* no ring: seq_len need only split into C slices (15 = 3 x 5, not a multiple of 2 x 3) */
    assert_int_equal(cp_ring_rope_runs(1, 0, 15, 3, 2, run), 1);
    assert_true(run[0].row0 == 0 && run[0].rows == 5 && run[0].pos0 == 10);
    assert_int_equal(cp_ring_rope_runs(4, 1, 48, 3, 1, run), 2);
    assert_int_equal(run[0].row0, 0);
    assert_int_equal(run[0].rows, 2);
    assert_int_equal(run[0].pos0, 10);
    assert_int_equal(run[1].row0, 2);
    assert_int_equal(run[1].rows, 2);
    assert_int_equal(run[1].pos0, 36);
}

/* The LSE merge by hand: lse log 2 with o 1, lse log 6 with o 3 give lse log 8 and o (2 + 18) / 8 = 2.5; a row no
 * key reached on either side (-inf, -inf) stays as it is; one reached on one side takes that side. */
static void test_merge_by_hand(void **state) {
    (void)state;
    uint16_t ob[3 * 2] = {f32_to_bf16(3), f32_to_bf16(3), f32_to_bf16(7), f32_to_bf16(7), f32_to_bf16(5),
                          f32_to_bf16(5)};
    float oa[3 * 2] = {1, 1, 9, 9, 0, 0};
    float la[3] = {(float)log(2.0), -INFINITY, -INFINITY}, lb[3] = {(float)log(6.0), -INFINITY, 0.5f};
    ref_attn_merge(ob, lb, oa, la, 3, 1, 2, 3);
    assert_float_equal(la[0], log(8.0), 1e-6);
    assert_float_equal(oa[0], 2.5, 1e-6);
    assert_float_equal(oa[1], 2.5, 1e-6);
    assert_true(isinf(la[1]) && la[1] < 0 && oa[2] == 9 && oa[3] == 9);
    assert_float_equal(la[2], 0.5, 1e-7);
    assert_true(oa[4] == 5 && oa[5] == 5);
}

static double lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) / (double)(1ULL << 53) * 2 - 1;
}

/* Attention of nq query rows against nk key rows (one head pair per query head, GQA by h / (QH / KVH)), causal on
 * the local order when asked (query i sees keys 0..i, nq == nk), as the attention forward writes a block: bf16 o
 * [nq][QH][D], lse f32 [QH][lse_stride] from column 0. */
static void block_attention(const double *q, const double *k, const double *v, int64_t nq, int64_t nk, int QH, int KVH,
                            int64_t D, int causal, uint16_t *o, float *lse, int64_t lse_stride) {
    double scale = 1 / sqrt((double)D);
    for (int64_t i = 0; i < nq; i++)
        for (int h = 0; h < QH; h++) {
            int kvh = h / (QH / KVH);
            int64_t last = causal ? i + 1 : nk;
            double m = -INFINITY, s[64];
            assert_true(last <= 64);
            for (int64_t j = 0; j < last; j++) {
                double x = 0;
                for (int64_t d = 0; d < D; d++) x += q[(i * QH + h) * D + d] * k[(j * KVH + kvh) * D + d];
                s[j] = x * scale;
                if (s[j] > m) m = s[j];
            }
            double z = 0;
            for (int64_t j = 0; j < last; j++) z += exp(s[j] - m);
            for (int64_t d = 0; d < D; d++) {
                double acc = 0;
                for (int64_t j = 0; j < last; j++) acc += exp(s[j] - m) / z * v[(j * KVH + kvh) * D + d];
                o[(i * QH + h) * D + d] = f64_to_bf16(acc);
            }
            lse[h * lse_stride + i] = (float)(m + log(z));
        }
}

/* Ring attention of a causal sequence of 2P chunks of c tokens, every position's blocks merged by LSE, against the
 * float64 reference of the whole sequence: the output within bf16 rounding of each block's partial output, the lse
 * within fp32 rounding. Each step k > 0 as one launch over the step's halves (cp_ring_step_of) or, with `halves`, as
 * the plan runs it: two c x c launches (cp_ring_half_of), each merged over its query half at once. */
static void ring_attention_matches_reference(bool halves) {
    enum { P = 4, c = 3, QH = 4, KVH = 2, D = 8, S = 2 * P * c, L = 2 * c };
    static double q[S * QH * D], k[S * KVH * D], v[S * KVH * D], o_ref[S * QH * D], lse_ref[QH * S];
    uint64_t seed = 42;
    for (int i = 0; i < S * QH * D; i++) q[i] = 2 * lcg(&seed);
    for (int i = 0; i < S * KVH * D; i++) k[i] = 2 * lcg(&seed), v[i] = lcg(&seed);
    ref_attn_shape sh = {.seq = S, .q_heads = QH, .kv_heads = KVH, .head_dim = D, .causal = true,
                         .scale = 1 / sqrt((double)D)};
    ref_attention_fwd(&sh, q, k, v, o_ref, lse_ref, 0, QH, 0, S);
    double max_o = 0, max_lse = 0;
    for (int p = 0; p < P; p++) {
        /* the position's tokens in local order: its chunk p, then chunk 2P-1-p */
        static double lq[L * QH * D], lk[P][L * KVH * D], lv[P][L * KVH * D];
        for (int src = 0; src < P; src++)
            for (int h = 0; h < 2; h++) {
                int64_t g = (int64_t)cp_ring_chunk(P, src, h) * c;
                memcpy(lk[src] + h * c * KVH * D, k + g * KVH * D, sizeof(double) * c * KVH * D);
                memcpy(lv[src] + h * c * KVH * D, v + g * KVH * D, sizeof(double) * c * KVH * D);
                if (src == p) memcpy(lq + h * c * QH * D, q + g * QH * D, sizeof(double) * c * QH * D);
            }
        float o_acc[L * QH * D], lse_acc[QH * L], lse_blk[QH * L];
        uint16_t o_blk[L * QH * D];
        for (int st = 0; st < P; st++) {
            cp_ring_step s = cp_ring_step_of(P, p, st);
            for (int part = 0; part < (halves && st ? 2 : 1); part++) {
                if (halves && st) { /* the plan's launch: one half of queries against one half of keys */
                    cp_ring_half h = cp_ring_half_of(P, p, st, part);
                    s.q_half0 = h.q_half, s.q_half1 = h.q_half + 1, s.k_half0 = h.k_half, s.k_half1 = h.k_half + 1;
                }
                int64_t q0 = (int64_t)s.q_half0 * c, nq = (int64_t)(s.q_half1 - s.q_half0) * c;
                int64_t k0 = (int64_t)s.k_half0 * c, nk = (int64_t)(s.k_half1 - s.k_half0) * c;
                block_attention(lq + q0 * QH * D, lk[s.source] + k0 * KVH * D, lv[s.source] + k0 * KVH * D, nq, nk,
                                QH, KVH, D, s.causal, o_blk + q0 * QH * D, lse_blk + q0, L);
                if (st == 0) { /* the own block covers every query row: the merge's starting point */
                    assert_true(nq == L);
                    for (int i = 0; i < L * QH * D; i++) o_acc[i] = bf16_to_f32(o_blk[i]);
                    memcpy(lse_acc, lse_blk, sizeof lse_acc);
                } else { /* a range of query rows: offset rows and lse columns, lse rows keep their stride */
                    ref_attn_merge(o_blk + q0 * QH * D, lse_blk + q0, o_acc + q0 * QH * D, lse_acc + q0, nq, QH, D,
                                   L);
                }
            }
        }
        for (int h = 0; h < 2; h++) {
            int64_t g = (int64_t)cp_ring_chunk(P, p, h) * c;
            for (int64_t i = 0; i < c; i++)
                for (int hd = 0; hd < QH; hd++) {
                    double e = fabs(lse_acc[hd * L + h * c + i] - lse_ref[hd * S + g + i]);
                    if (e > max_lse) max_lse = e;
                    for (int d = 0; d < D; d++) {
                        double x = o_acc[((h * c + i) * QH + hd) * D + d], r = o_ref[((g + i) * QH + hd) * D + d];
                        if (fabs(x - r) > max_o) max_o = fabs(x - r);
                    }
                }
        }
    }
    print_message("ring of %d, %d tokens%s: max |o - ref| %.2e, max |lse - ref| %.2e\n", P, S,
                  halves ? " in half-block launches" : "", max_o, max_lse);
    assert_true(max_o < 8e-3);  /* the partial outputs are bf16: half a unit of 2^-8 on values below 1 */
    assert_true(max_lse < 2e-6);
    assert_true(max_o > 0);     /* bf16 partials do round: the comparison measures something */
}

static void test_ring_attention_matches_reference(void **state) {
    (void)state;
    ring_attention_matches_reference(false);
    ring_attention_matches_reference(true);
}

/* ---- packed documents: the ring's decomposition in float64 ---- */

enum { DQH = 4, DKVH = 2, DD = 4 }; /* query heads, KV heads (GQA 2:1), head dim of the documents' rings */

/* The backward of one half launch as the ring runs it: with the merged (whole-sequence) LSE and delta of its query
 * rows, not its own softmax, so that the launches' gradients sum to the whole sequence's. n query rows at global
 * positions qp.., n keys at kp..; kept as the kernel's contract says (templates/attention.cu, "Document masks"):
 * the causal rule on local rows and keys, and the key in the query's document. dq ([n][QH][D]) and dk, dv
 * ([n][KVH][D]) are added to; lse [QH][lse_stride] and delta [n][QH] are the query rows'. */
static void half_bwd(const double *q, const double *k, const double *v, const double *dout, const double *lse,
                     int64_t lse_stride, const double *delta, int64_t n, bool causal, int64_t qp, int64_t kp,
                     const int *doc_start, double *dq, double *dk, double *dv) {
    const double scale = 1 / sqrt((double)DD);
    for (int64_t i = 0; i < n; i++)
        for (int h = 0; h < DQH; h++) {
            const int g = h / (DQH / DKVH);
            const double *qi = q + (i * DQH + h) * DD, *di = dout + (i * DQH + h) * DD;
            for (int64_t j = 0; j < n; j++) {
                if ((causal && j > i) || kp + j < doc_start[qp + i]) continue;
                const double *kj = k + (j * DKVH + g) * DD, *vj = v + (j * DKVH + g) * DD;
                double sc = 0, dp = 0;
                for (int d = 0; d < DD; d++) sc += qi[d] * kj[d], dp += di[d] * vj[d];
                const double pr = exp(sc * scale - lse[h * lse_stride + i]), ds = pr * (dp - delta[i * DQH + h]);
                for (int d = 0; d < DD; d++) {
                    dq[(i * DQH + h) * DD + d] += scale * ds * kj[d];
                    dk[(j * DKVH + g) * DD + d] += scale * ds * qi[d];
                    dv[(j * DKVH + g) * DD + d] += pr * di[d];
                }
            }
        }
}

/* The merge of templates/attn_merge.cu in float64: n rows of a block (o [n][QH][D], lse [QH][stride]) into the
 * accumulator; a row neither side reached stays as it is. Returns how many rows the block did not reach while the
 * accumulator had (lse -inf against a finite one). */
static int merge64(const double *o_blk, const double *lse_blk, double *o_acc, double *lse_acc, int64_t n,
                   int64_t stride) {
    int missed = 0;
    for (int64_t i = 0; i < n; i++)
        for (int h = 0; h < DQH; h++) {
            double *la = &lse_acc[h * stride + i];
            const double lb = lse_blk[h * stride + i], m = fmax(*la, lb);
            if (m == -INFINITY) continue;
            missed += lb == -INFINITY;
            const double l = m + log1p(exp(fmin(*la, lb) - m)), wa = exp(*la - l), wb = exp(lb - l);
            for (int d = 0; d < DD; d++) {
                double *x = &o_acc[(i * DQH + h) * DD + d];
                *x = wa * *x + wb * o_blk[(i * DQH + h) * DD + d];
            }
            *la = l;
        }
    return missed;
}

static void assert_near(const double *x, const double *ref, int64_t n, const char *what, int P, int layout) {
    for (int64_t i = 0; i < n; i++)
        if (!(fabs(x[i] - ref[i]) <= 1e-12 * (1 + fabs(ref[i]))))
            fail_msg("ring of %d, documents %d: %s[%lld] = %.17g, the whole sequence's %.17g", P, layout, what,
                     (long long)i, x[i], ref[i]);
}

/* A ring of P over packed documents of the given lengths, run exactly as the plan launches it: at every position p,
 * step 0 as its three half launches (cp_ring_half_of(P, p, 0, part): the diagonal chunks causal, their outputs the
 * merge's start, the third merged), each step k >= 1 as its two maskless half launches on the block of position
 * (p - k) mod P, merged by LSE; every launch masked at the global positions cp_ring_half_pos gives, its rows and keys
 * taken from the position's local order (chunk p, then chunk 2P-1-p). The backward: every launch again with the
 * merged LSE and delta, dQ summed at the query rows, dK and dV at the block's owner (as they travel home). Both
 * against the float64 reference of the whole sequence under the same documents, forward (o, lse) and backward (dq,
 * dk, dv). Returns how many (row, head) pairs of launches after the first kept no key (lse -inf into the merge). */
static int ring_documents(int P, const int *len, int ndocs, int layout) {
    const int64_t c = 5, S = 2 * P * c, L = 2 * c;
    int start[64], end[64];
    assert_true(S <= 64);
    for (int d = 0, a = 0; d < ndocs; a += len[d++]) {
        assert_true(a + len[d] <= S);
        for (int i = a; i < a + len[d]; i++) start[i] = a, end[i] = a + len[d];
        if (d == ndocs - 1) assert_int_equal(a + len[d], S);
    }
    const int64_t nq = S * DQH * DD, nkv = S * DKVH * DD;
    static double q[64 * DQH * DD], k[64 * DKVH * DD], v[64 * DKVH * DD], dout[64 * DQH * DD];
    static double o[64 * DQH * DD], lse[DQH * 64], dq[64 * DQH * DD], dk[64 * DKVH * DD], dv[64 * DKVH * DD];
    uint64_t seed = 7 + (uint64_t)P * 10 + (uint64_t)layout;
    for (int64_t i = 0; i < nq; i++) q[i] = 2 * lcg(&seed), dout[i] = lcg(&seed);
    for (int64_t i = 0; i < nkv; i++) k[i] = 2 * lcg(&seed), v[i] = lcg(&seed);
    ref_attn_shape whole = {.seq = S, .q_heads = DQH, .kv_heads = DKVH, .head_dim = DD, .causal = true,
                            .scale = 1 / sqrt((double)DD), .doc_start = start, .doc_end = end};
    ref_attention_fwd(&whole, q, k, v, o, lse, 0, DQH, 0, S);
    memset(dk, 0, sizeof dk), memset(dv, 0, sizeof dv);
    ref_attention_bwd(&whole, q, k, v, dout, dq, dk, dv, 0, DQH, 0, S);

    /* every position's local Q, K, V, dO (its chunks in local order), and what the ring computes */
    static double lq[MAXP][20 * DQH * DD], lk[MAXP][20 * DKVH * DD], lv[MAXP][20 * DKVH * DD], ldo[MAXP][20 * DQH * DD];
    static double o_acc[MAXP][20 * DQH * DD], lse_acc[MAXP][DQH * 20], delta[MAXP][20 * DQH];
    static double rdq[MAXP][20 * DQH * DD], rdk[MAXP][20 * DKVH * DD], rdv[MAXP][20 * DKVH * DD];
    assert_true(P <= MAXP && L <= 20);
    for (int p = 0; p < P; p++)
        for (int h = 0; h < 2; h++) {
            const int64_t g = (int64_t)cp_ring_chunk(P, p, h) * c;
            memcpy(lq[p] + h * c * DQH * DD, q + g * DQH * DD, sizeof(double) * c * DQH * DD);
            memcpy(ldo[p] + h * c * DQH * DD, dout + g * DQH * DD, sizeof(double) * c * DQH * DD);
            memcpy(lk[p] + h * c * DKVH * DD, k + g * DKVH * DD, sizeof(double) * c * DKVH * DD);
            memcpy(lv[p] + h * c * DKVH * DD, v + g * DKVH * DD, sizeof(double) * c * DKVH * DD);
        }
    int missed = 0;
    for (int p = 0; p < P; p++)
        for (int st = 0; st < P; st++) {
            const int src = cp_ring_step_of(P, p, st).source, parts = st ? 2 : CP_RING_STEP0_PARTS;
            for (int part = 0; part < parts; part++) {
                cp_ring_half h = cp_ring_half_of(P, p, st, part);
                cp_ring_pos pos = cp_ring_half_pos(P, p, st, part, c);
                ref_attn_shape sh = {.seq = c, .q_heads = DQH, .kv_heads = DKVH, .head_dim = DD,
                                     .causal = cp_ring_half_causal(st, part), .scale = 1 / sqrt((double)DD),
                                     .doc_start = start, .doc_end = end, .q_pos = pos.q_pos, .k_pos = pos.k_pos};
                double ob[5 * DQH * DD], lb[DQH * 5];
                ref_attention_fwd(&sh, lq[p] + h.q_half * c * DQH * DD, lk[src] + h.k_half * c * DKVH * DD,
                                  lv[src] + h.k_half * c * DKVH * DD, ob, lb, 0, DQH, 0, c);
                double *oa = o_acc[p] + h.q_half * c * DQH * DD, *la = lse_acc[p] + h.q_half * c;
                if (st == 0 && part < 2) { /* the diagonal halves: together the whole block the merge starts from */
                    memcpy(oa, ob, sizeof ob);
                    for (int hd = 0; hd < DQH; hd++) {
                        memcpy(la + hd * L, lb + hd * c, sizeof(double) * c);
                        for (int64_t i = 0; i < c; i++) assert_true(isfinite(lb[hd * c + i])); /* its own key */
                    }
                    continue;
                }
                double lbs[DQH * 20]; /* the block's LSE at the stride of the accumulator's rows, as the plan's */
                for (int hd = 0; hd < DQH; hd++) memcpy(lbs + hd * L, lb + hd * c, sizeof(double) * c);
                missed += merge64(ob, lbs, oa, la, c, L);
            }
        }
    for (int p = 0; p < P; p++) { /* forward: each position's rows against the whole sequence's */
        for (int h = 0; h < 2; h++) {
            const int64_t g = (int64_t)cp_ring_chunk(P, p, h) * c;
            assert_near(o_acc[p] + h * c * DQH * DD, o + g * DQH * DD, c * DQH * DD, "o", P, layout);
            for (int hd = 0; hd < DQH; hd++)
                assert_near(lse_acc[p] + hd * L + h * c, lse + hd * S + g, c, "lse", P, layout);
        }
        for (int64_t i = 0; i < L; i++) /* delta = rowsum(dO * O) of the merged output */
            for (int hd = 0; hd < DQH; hd++) {
                double x = 0;
                for (int d = 0; d < DD; d++) x += ldo[p][(i * DQH + hd) * DD + d] * o_acc[p][(i * DQH + hd) * DD + d];
                delta[p][i * DQH + hd] = x;
            }
        memset(rdq[p], 0, sizeof rdq[p]), memset(rdk[p], 0, sizeof rdk[p]), memset(rdv[p], 0, sizeof rdv[p]);
    }
    for (int p = 0; p < P; p++)
        for (int st = 0; st < P; st++) {
            const int src = cp_ring_step_of(P, p, st).source, parts = st ? 2 : CP_RING_STEP0_PARTS;
            for (int part = 0; part < parts; part++) {
                cp_ring_half h = cp_ring_half_of(P, p, st, part);
                cp_ring_pos pos = cp_ring_half_pos(P, p, st, part, c);
                const int64_t qo = h.q_half * c, ko = h.k_half * c;
                half_bwd(lq[p] + qo * DQH * DD, lk[src] + ko * DKVH * DD, lv[src] + ko * DKVH * DD,
                         ldo[p] + qo * DQH * DD, lse_acc[p] + qo, L, delta[p] + qo * DQH, c,
                         cp_ring_half_causal(st, part), pos.q_pos, pos.k_pos, start, rdq[p] + qo * DQH * DD,
                         rdk[src] + ko * DKVH * DD, rdv[src] + ko * DKVH * DD);
            }
        }
    for (int p = 0; p < P; p++)
        for (int h = 0; h < 2; h++) {
            const int64_t g = (int64_t)cp_ring_chunk(P, p, h) * c;
            assert_near(rdq[p] + h * c * DQH * DD, dq + g * DQH * DD, c * DQH * DD, "dq", P, layout);
            assert_near(rdk[p] + h * c * DKVH * DD, dk + g * DKVH * DD, c * DKVH * DD, "dk", P, layout);
            assert_near(rdv[p] + h * c * DKVH * DD, dv + g * DKVH * DD, c * DKVH * DD, "dv", P, layout);
        }
    return missed;
}

/* Ring attention over packed documents is exact in float64 for rings of 2 and 4 (chunks of 5 tokens): documents of
 * 1 token (also at a chunk's first position), one crossing chunk boundaries (and the two halves of a position's
 * block), one spanning the whole sequence; launches with rows that keep no key (lse -inf) merge as the rest. */
static void test_ring_documents_exact(void **state) {
    (void)state;
    const int P2a[] = {1, 13, 1, 5}, P2b[] = {20}, P2c[] = {5, 1, 4, 1, 1, 8};
    const int P4a[] = {1, 13, 1, 5, 1, 19}, P4b[] = {40}, P4c[] = {2, 3, 1, 9, 1, 1, 22, 1};
    const struct {
        int P, n;
        const int *len;
    } cases[] = {{2, 4, P2a}, {2, 1, P2b}, {2, 6, P2c}, {4, 6, P4a}, {4, 1, P4b}, {4, 8, P4c}};
    int missed[6];
    for (int i = 0; i < 6; i++) {
        missed[i] = ring_documents(cases[i].P, cases[i].len, cases[i].n, i);
        print_message("ring of %d, %d documents: forward and backward exact; %d (row, head) pairs of later launches "
                      "kept no key\n", cases[i].P, cases[i].n, missed[i]);
    }
    assert_int_equal(missed[1] + missed[4], 0); /* one document: every key before a query is kept */
    assert_true(missed[0] > 0 && missed[2] > 0 && missed[3] > 0 && missed[5] > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zigzag_classification),
        cmocka_unit_test(test_half_launches),
        cmocka_unit_test(test_ring_terms_8b_8m),
        cmocka_unit_test(test_rope_runs),
        cmocka_unit_test(test_merge_by_hand),
        cmocka_unit_test(test_ring_attention_matches_reference),
        cmocka_unit_test(test_ring_documents_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
