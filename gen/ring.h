/* ring.h: ring attention's schedule over a zigzag split of the sequence. With a ring of P groups the sequence is cut
 * into 2P chunks and ring position p holds chunks p and 2P-1-p, in that order (its "halves" 0 and 1), so that causal
 * work is the same at every position. At ring step k (0..P-1) position p attends with its queries to the K/V block
 * of position (p - k) mod P: its own at step 0, then the ones received from the previous rank. A pure function of
 * (P, p, k), shared by the planner and its tests. */
#ifndef CP_RING_H
#define CP_RING_H

#include <stdint.h>

/* How a query chunk sees a key chunk under the causal mask. */
typedef enum {
    CP_RING_SKIP, /* every key after every query: no work */
    CP_RING_DIAG, /* the same chunk: causal within it */
    CP_RING_FULL  /* every key before every query: no mask */
} cp_ring_mask;

/* The one attention launch of a ring step, over the group's 2 halves of queries and of the block's keys: query
 * halves [q_half0, q_half1) against key halves [k_half0, k_half1), causal on the local order of the two halves
 * (their chunks are in increasing order, so local causality is global causality) or with no mask. */
typedef struct {
    int source;          /* ring position whose K/V block this step uses */
    int q_half0, q_half1;
    int k_half0, k_half1;
    int causal;          /* 1: causal over the local order (step 0); 0: every query sees every key */
} cp_ring_step;

/* The chunk held in half h (0 or 1) of ring position p: p or 2P-1-p. */
int cp_ring_chunk(int P, int p, int half);
/* The causal relation of query chunk qc to key chunk kc. */
cp_ring_mask cp_ring_pair(int qc, int kc);
/* What position p computes at ring step k of P. With a zigzag split every step is a quarter of the (2c)^2 query-key
 * pairs of a full block of 2c tokens, up to the diagonal: step 0 is causal over the own block (halves 0 and 1 both
 * ways); a block from an earlier position (source < p) is seen whole by both query halves through its half 0 only
 * (its half 1 comes after both), and a block from a later position only by query half 1, but whole. */
cp_ring_step cp_ring_step_of(int P, int p, int k);
/* Bytes of one rank's K and V block of a stage as it travels the ring: 2 (K and V) x tokens of the group x KV heads
 * per rank x head_dim x 2 (bf16). */
int64_t cp_ring_kv_bytes(int64_t group_tokens, int kv_heads_per_rank, int64_t head_dim);

#endif
