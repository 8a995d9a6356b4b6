/* test_ranks.c: the rank layout of replicas x ring x gpus (gen/ranks.c) for every combination up to 64 ranks: the
 * numbering is a bijection, each kind of communicator partitions the ranks into groups of the right size whose
 * members agree on their colour, the ring's neighbours are inverse, and with 8 GPUs per node a Ulysses group that
 * fits a node shares one while ring and shard peers of full-node groups sit on other nodes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ranks.h"

#define MAXR 64

/* Each kind: every rank in exactly one group, groups of the expected size, the same members and colour seen from
 * every member, colours numbered 0..groups-1. */
static void check_comm(const cp_rank_layout *L, cp_comm_kind kind, int want_size) {
    int W = cp_rank_world(L), groups = W / want_size;
    int seen[MAXR] = {0}, color_of[MAXR], members[MAXR], other[MAXR];
    for (int i = 0; i < MAXR; i++) color_of[i] = -1;
    for (int r = 0; r < W; r++) {
        int color;
        int n = cp_rank_comm(L, r, kind, &color, members);
        if (n != want_size) fail_msg("%s of rank %d: %d members, want %d", cp_comm_kind_name(kind), r, n, want_size);
        assert_true(color >= 0 && color < groups);
        bool in = false;
        for (int i = 0; i < n; i++) {
            if (i) assert_true(members[i] > members[i - 1]);
            in |= members[i] == r;
            int c2;
            assert_int_equal(cp_rank_comm(L, members[i], kind, &c2, other), n);
            assert_int_equal(c2, color);
            assert_memory_equal(other, members, sizeof(int) * (size_t)n);
        }
        assert_true(in);
        if (color_of[color] < 0) color_of[color] = members[0];
        assert_int_equal(color_of[color], members[0]); /* one colour, one group */
        if (members[0] == r)
            for (int i = 0; i < n; i++) seen[members[i]]++;
    }
    for (int r = 0; r < W; r++) assert_int_equal(seen[r], 1);
}

static void test_every_layout(void **state) {
    (void)state;
    int layouts = 0;
    for (int R = 1; R <= MAXR; R++)
        for (int P = 1; R * P <= MAXR; P++)
            for (int C = 1; R * P * C <= MAXR; C++) {
                cp_rank_layout L = {R, P, C};
                int W = cp_rank_world(&L);
                assert_int_equal(W, R * P * C);
                bool hit[MAXR] = {false};
                for (int r = 0; r < W; r++) {
                    cp_rank_place p = cp_rank_of(&L, r);
                    assert_true(p.replica >= 0 && p.replica < R && p.ring_pos >= 0 && p.ring_pos < P && p.local >= 0 &&
                                p.local < C);
                    assert_int_equal(cp_rank_at(&L, p), r);
                    assert_false(hit[r]);
                    hit[r] = true;
                    /* ring neighbours: same replica and local rank, positions one apart, inverse of each other */
                    int nx = cp_rank_ring_next(&L, r), pv = cp_rank_ring_prev(&L, r);
                    cp_rank_place pn = cp_rank_of(&L, nx);
                    assert_int_equal(pn.replica, p.replica);
                    assert_int_equal(pn.local, p.local);
                    assert_int_equal(pn.ring_pos, (p.ring_pos + 1) % P);
                    assert_int_equal(cp_rank_ring_prev(&L, nx), r);
                    assert_int_equal(cp_rank_ring_next(&L, pv), r);
                    /* with 8 GPUs per node: a group that divides a node is on one; full-node groups put ring and
                     * shard peers on other nodes */
                    int members[MAXR], color;
                    int n = cp_rank_comm(&L, r, CP_COMM_ULYSSES, &color, members);
                    if (8 % C == 0)
                        for (int i = 0; i < n; i++)
                            assert_int_equal(cp_rank_node(members[i], 8), cp_rank_node(r, 8));
                    if (C % 8 == 0 && P > 1) assert_int_not_equal(cp_rank_node(nx, 8), cp_rank_node(r, 8));
                    if (C % 8 == 0 && R * P > 1) {
                        n = cp_rank_comm(&L, r, CP_COMM_SHARD, &color, members);
                        for (int i = 0; i < n; i++)
                            if (members[i] != r) assert_int_not_equal(cp_rank_node(members[i], 8), cp_rank_node(r, 8));
                    }
                }
                check_comm(&L, CP_COMM_ULYSSES, C);
                check_comm(&L, CP_COMM_RING, P);
                check_comm(&L, CP_COMM_SHARD, R * P);
                check_comm(&L, CP_COMM_WORLD, W);
                layouts++;
            }
    /* the number of (R, P, C) with R * P * C <= 64 */
    assert_int_equal(layouts, 796);
}

/* A worked example: 2 replicas x ring 4 x 8 GPUs = 64 ranks on 8 nodes. */
static void test_example_64(void **state) {
    (void)state;
    cp_rank_layout L = {2, 4, 8};
    cp_rank_place p = cp_rank_of(&L, 45);
    assert_int_equal(p.replica, 1);
    assert_int_equal(p.ring_pos, 1);
    assert_int_equal(p.local, 5);
    assert_int_equal(cp_rank_ring_next(&L, 45), 53);
    assert_int_equal(cp_rank_ring_prev(&L, 45), 37);
    assert_int_equal(cp_rank_ring_next(&L, 61), 37); /* the ring closes within replica 1 */
    int m[64], color;
    assert_int_equal(cp_rank_comm(&L, 45, CP_COMM_ULYSSES, &color, m), 8);
    assert_int_equal(color, 5);
    assert_int_equal(m[0], 40);
    assert_int_equal(m[7], 47);
    assert_int_equal(cp_rank_comm(&L, 45, CP_COMM_RING, &color, m), 4);
    assert_int_equal(color, 13);
    int ring[] = {37, 45, 53, 61};
    assert_memory_equal(m, ring, sizeof ring);
    assert_int_equal(cp_rank_comm(&L, 45, CP_COMM_SHARD, &color, m), 8);
    assert_int_equal(color, 5);
    int shard[] = {5, 13, 21, 29, 37, 45, 53, 61};
    assert_memory_equal(m, shard, sizeof shard);
    assert_int_equal(cp_rank_node(45, 8), 5);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_layout),
        cmocka_unit_test(test_example_64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
