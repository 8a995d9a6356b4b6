/* ring.c: the zigzag ring attention schedule of ring.h. */
#include "ring.h"

#include "util.h"

int cp_ring_chunk(int P, int p, int half) { return half == 0 ? p : 2 * P - 1 - p; }

cp_ring_mask cp_ring_pair(int qc, int kc) {
    if (kc < qc) return CP_RING_FULL;
    return kc == qc ? CP_RING_DIAG : CP_RING_SKIP;
}

cp_ring_step cp_ring_step_of(int P, int p, int k) {
    cp_ring_step s = {.source = ((p - k) % P + P) % P, .q_half0 = 0, .q_half1 = 2, .k_half0 = 0, .k_half1 = 2};
    if (s.source == p) {
        s.causal = 1; /* (0,0) and (1,1) diagonal, (1,0) full, (0,1) skipped: the causal mask of the local order */
    } else if (s.source < p) {
        /* key chunk j < p < 2P-1-p: both query chunks see it whole; key chunk 2P-1-j > 2P-1-p > p: neither */
        s.k_half1 = 1;
    } else {
        /* key chunks j and 2P-1-j both lie between p and 2P-1-p: only query chunk 2P-1-p sees them, whole */
        s.q_half0 = 1;
    }
    return s;
}

cp_ring_half cp_ring_half_of(int P, int p, int k, int part) {
    if (k == 0) return part < 2 ? (cp_ring_half){part, part} : (cp_ring_half){1, 0}; /* documents: ring.h */
    if (part == 0) return (cp_ring_half){1, 0};
    int h = cp_ring_step_of(P, p, k).source < p ? 0 : 1;
    return (cp_ring_half){h, h};
}

int cp_ring_half_causal(int k, int part) { return k == 0 && part < 2; }

cp_ring_pos cp_ring_half_pos(int P, int p, int k, int part, int64_t c) {
    cp_ring_half h = cp_ring_half_of(P, p, k, part);
    int source = cp_ring_step_of(P, p, k).source;
    return (cp_ring_pos){.q_pos = cp_ring_chunk(P, p, h.q_half) * c, .k_pos = cp_ring_chunk(P, source, h.k_half) * c};
}

cp_ring_span cp_ring_half_span(int P, int k, int part) {
    cp_ring_span s = {2, 0, 2, 0};
    for (int p = 0; p < P; p++) {
        cp_ring_half x = cp_ring_half_of(P, p, k, part);
        s.q0 = CP_MIN(s.q0, x.q_half);
        s.q1 = CP_MAX(s.q1, x.q_half + 1);
        s.k0 = CP_MIN(s.k0, x.k_half);
        s.k1 = CP_MAX(s.k1, x.k_half + 1);
    }
    return s;
}

int cp_ring_rope_nruns(int P, int C) { return P > 1 && C % 2 ? 2 : 1; }

int cp_ring_rope_runs(int P, int p, int64_t seq_len, int C, int r, cp_ring_rope_run run[2]) {
    if (P == 1) { /* no zigzag: seq_len need only split into C slices */
        run[0] = (cp_ring_rope_run){.row0 = 0, .rows = seq_len / C, .pos0 = (int64_t)r * (seq_len / C)};
        return 1;
    }
    int64_t c = seq_len / (2 * P), T = 2 * c / C, first = (int64_t)r * T, end = first + T;
    int n = 0;
    for (int half = 0; half < 2; half++) {
        int64_t lo = CP_MAX(first, half * c), hi = CP_MIN(end, (half + 1) * c);
        if (lo >= hi) continue;
        int64_t pos0 = (int64_t)cp_ring_chunk(P, p, half) * c + (lo - half * c);
        if (n == 1 && run[0].pos0 + run[0].rows == pos0) { /* adjacent chunks (p = P - 1): one run */
            run[0].rows += hi - lo;
            continue;
        }
        run[n++] = (cp_ring_rope_run){.row0 = lo - first, .rows = hi - lo, .pos0 = pos0};
    }
    return n;
}

int64_t cp_ring_kv_bytes(int64_t group_tokens, int kv_heads_per_rank, int64_t head_dim) {
    return 2 * group_tokens * kv_heads_per_rank * head_dim * 2;
}

void cp_ring_terms_of(int P, int64_t group_tokens, int u, int kvr, int64_t head_dim, cp_ring_terms *t) {
    const int64_t L = group_tokens, F32 = 4;
    t->kv_block = cp_ring_kv_bytes(L, kvr, head_dim);
    t->kv_recv = (P > 2 ? 2 : P - 1) * t->kv_block;
    t->o_acc = P > 1 ? L * u * head_dim * F32 : 0;
    t->lse_blk = P > 1 ? (int64_t)u * L * F32 : 0;
    t->dkv_block = 2 * L * kvr * head_dim * F32;
    t->dkv_recv = P > 1 ? 2 * t->dkv_block : 0;
    t->dkv_step = P > 1 ? t->dkv_block : 0;
    t->dq_half = P > 1 ? L / 2 * u * head_dim * F32 : 0;
    t->fwd_sent = (int64_t)(P - 1) * t->kv_block;
    t->bwd_sent = (int64_t)(P - 1) * t->kv_block + (P > 1 ? (int64_t)P * t->dkv_block : 0);
}

double cp_ring_step_fwd_flops(int64_t group_tokens, int u, int64_t head_dim) {
    return 2.0 * (double)group_tokens * (double)group_tokens * u * (double)head_dim;
}

double cp_ring_sendrecv_seconds(int64_t bytes, const cp_machine *mc) {
    return (double)bytes / (mc->net_gbps * 1e9) + mc->net_us * 1e-6;
}

double cp_ring_exposed(int64_t bytes, const cp_machine *mc, double t_block) {
    double t = cp_ring_sendrecv_seconds(bytes, mc);
    return t > t_block ? t - t_block : 0;
}
