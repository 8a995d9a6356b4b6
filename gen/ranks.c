/* ranks.c: the rank layout of replicas x ring x Ulysses groups (ranks.h): places, ring neighbours, communicators. */
#include "ranks.h"

int cp_rank_world(const cp_rank_layout *L) { return L->replicas * L->ring * L->gpus; }

cp_rank_place cp_rank_of(const cp_rank_layout *L, int rank) {
    int group = rank / L->gpus;
    return (cp_rank_place){.replica = group / L->ring, .ring_pos = group % L->ring, .local = rank % L->gpus};
}

int cp_rank_at(const cp_rank_layout *L, cp_rank_place p) {
    return (p.replica * L->ring + p.ring_pos) * L->gpus + p.local;
}

int cp_rank_ring_next(const cp_rank_layout *L, int rank) {
    cp_rank_place p = cp_rank_of(L, rank);
    p.ring_pos = (p.ring_pos + 1) % L->ring;
    return cp_rank_at(L, p);
}

int cp_rank_ring_prev(const cp_rank_layout *L, int rank) {
    cp_rank_place p = cp_rank_of(L, rank);
    p.ring_pos = (p.ring_pos + L->ring - 1) % L->ring;
    return cp_rank_at(L, p);
}

int cp_rank_comm(const cp_rank_layout *L, int rank, cp_comm_kind kind, int *color, int *out) {
    cp_rank_place me = cp_rank_of(L, rank), q = me;
    int n = 0;
    switch (kind) {
    case CP_COMM_ULYSSES:
        *color = me.replica * L->ring + me.ring_pos;
        for (q.local = 0; q.local < L->gpus; q.local++) out[n++] = cp_rank_at(L, q);
        break;
    case CP_COMM_RING:
        *color = me.replica * L->gpus + me.local;
        for (q.ring_pos = 0; q.ring_pos < L->ring; q.ring_pos++) out[n++] = cp_rank_at(L, q);
        break;
    case CP_COMM_SHARD:
        *color = me.local;
        for (q.replica = 0; q.replica < L->replicas; q.replica++)
            for (q.ring_pos = 0; q.ring_pos < L->ring; q.ring_pos++) out[n++] = cp_rank_at(L, q);
        break;
    default:
        *color = 0;
        for (int r = 0; r < cp_rank_world(L); r++) out[n++] = r;
        break;
    }
    return n;
}

int cp_rank_comm_size(const cp_rank_layout *L, cp_comm_kind kind) {
    switch (kind) {
    case CP_COMM_ULYSSES: return L->gpus;
    case CP_COMM_RING: return L->ring;
    case CP_COMM_SHARD: return L->replicas * L->ring;
    default: return cp_rank_world(L);
    }
}

int cp_rank_splits(const cp_rank_layout *L) {
    int n = 0;
    for (int k = 0; k < CP_COMM_COUNT; k++) {
        int size = cp_rank_comm_size(L, (cp_comm_kind)k);
        n += size > 1 && size < cp_rank_world(L);
    }
    return n;
}

int cp_rank_node(int rank, int per_node) { return rank / per_node; }

const char *cp_comm_kind_name(cp_comm_kind k) {
    static const char *const names[] = {"ulysses", "ring", "shard", "world"};
    return k >= 0 && k < CP_COMM_COUNT ? names[k] : "?";
}
