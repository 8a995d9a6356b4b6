/* ring.h: ring attention's schedule over a zigzag split of the sequence. With a ring of P groups the sequence is cut
 * into 2P chunks and ring position p holds chunks p and 2P-1-p, in that order (its "halves" 0 and 1), so that causal
 * work is the same at every position. At ring step k (0..P-1) position p attends with its queries to the K/V block
 * of position (p - k) mod P: its own at step 0, then the ones received from the previous rank. A pure function of
 * (P, p, k), shared by the planner and its tests. */
#ifndef CP_RING_H
#define CP_RING_H

#include <stdint.h>

#include "spec.h"

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
/* A run of a rank's token rows at consecutive positions, for RoPE: rows [row0, row0 + rows) at pos0, pos0 + 1, ... */
typedef struct {
    int64_t row0, rows, pos0;
} cp_ring_rope_run;
/* Where rank r of C in ring position p's group (of P, sequence of seq_len tokens) holds its tokens: the group holds
 * chunks p and 2P-1-p of c = seq_len / 2P tokens, in that order, and rank r its rows [r T, (r + 1) T), T = 2c / C.
 * Fills run[] and returns 1 run, or 2 when the rank's rows straddle the two chunks (only an odd C makes that);
 * seq_len must be a multiple of 2 P C. With P = 1 (no ring) one run at r T, T = seq_len / C, seq_len a multiple
 * of C. The data's slices and the executor's RoPE positions both come from here. */
int cp_ring_rope_runs(int P, int p, int64_t seq_len, int C, int r, cp_ring_rope_run run[2]);
/* Bytes of one rank's K and V block of a stage as it travels the ring: 2 (K and V) x tokens of the group x KV heads
 * per rank x head_dim x 2 (bf16). */
int64_t cp_ring_kv_bytes(int64_t group_tokens, int kv_heads_per_rank, int64_t head_dim);

/* What a ring adds to one UPipe stage's attention on one GPU, for a group of L = S/P tokens in head layout, u query
 * and kvr KV heads per rank, head_dim D: the buffers (bytes) and what the stage sends to the ring's next rank. */
typedef struct {
    int64_t kv_block;  /* one K/V block as it travels: cp_ring_kv_bytes(L, kvr, D) */
    int64_t kv_recv;   /* two receive buffers: the block in hand and the one arriving (the own block stays in the
                        * stage's K and V); one with P = 2, whose one received block arrives under the own */
    int64_t o_acc;     /* the merged output, fp32 [L][u][D]; each launch's partial output is the stage's bf16 O */
    int64_t lse_blk;   /* a launch's partial LSE, fp32 [u][L]; the merged one is the stage's slice of the layer's LSE,
                        * which the backward reads */
    int64_t dkv_block; /* a block's dK, dV accumulator, fp32 [2][L][kvr][D], travelling with the block in the
                        * backward */
    int64_t dkv_recv;  /* two of them: the one in hand and the one arriving. The own block's comes home into one and,
                        * over the stages of a GQA group, goes round again from there, so it sums the whole group */
    int64_t dkv_step;  /* a ring step's own dK, dV (fp32, as dkv_block), added to the arriving accumulator once it is
                        * there: so the accumulator's hop overlaps the next step's attention */
    int64_t dq_half;   /* the fp32 dQ of a half-block launch, [L/2][u][D] (without the kernel's progress counters),
                        * added into the stage's dQ */
    int64_t fwd_sent;  /* bytes sent per stage in the forward: P - 1 K/V blocks */
    int64_t bwd_sent;  /* in the backward: P - 1 K/V blocks, and P accumulators (P - 1 hops with the blocks, the last
                        * one home to the block's owner) */
} cp_ring_terms;

void cp_ring_terms_of(int P, int64_t group_tokens, int u, int kvr, int64_t head_dim, cp_ring_terms *t);
/* A ring step k >= 1 as two launches over half blocks with no mask, the same two at every position, so that one plan
 * serves every ring position: part 0 is query half 1 against key half 0, which every such step computes; part 1 is
 * query half h against key half h, h = 0 for a block from an earlier position (both query halves see its half 0)
 * and 1 for one from a later position (query half 1 sees its half 1 too). Each is a c x c block of chunks, so a step
 * is exactly the pairs of cp_ring_step_of. */
typedef struct {
    int q_half, k_half;
} cp_ring_half;
cp_ring_half cp_ring_half_of(int P, int p, int k, int part);
/* With packed documents (cp_plan.docs) step 0 too runs in half launches: the document mask needs each launch's rows
 * at consecutive global positions (a query row r at q_pos + r), which the own block's two halves, chunks p and
 * 2P-1-p, are not. cp_ring_half_of(P, p, 0, part) gives them: parts 0 and 1 are query half h against key half h,
 * causal (the diagonal chunks), part 2 query half 1 against key half 0 with no mask (chunk 2P-1-p after chunk p).
 * The same three at every position. */
#define CP_RING_STEP0_PARTS 3
/* Whether half launch `part` of step k is causal: step 0's diagonal halves alone. */
int cp_ring_half_causal(int k, int part);
/* The global positions of the first query row and the first key row of half launch `part` of step k at position p
 * (the document mask's q_pos and k_pos), halves of c = seq_len / 2P tokens: the query half's chunk of p and the key
 * half's chunk of the step's source position, times c. */
typedef struct {
    int64_t q_pos, k_pos;
} cp_ring_pos;
cp_ring_pos cp_ring_half_pos(int P, int p, int k, int part, int64_t c);
/* The halves half launch `part` of step k takes at any position of the ring: query halves [q0, q1) and key halves
 * [k0, k1). The plan's operands of such a launch cover these, and a rank's launch starts (cp_ring_half_of's half -
 * q0 or k0) halves into them. */
typedef struct {
    int q0, q1, k0, k1;
} cp_ring_span;
cp_ring_span cp_ring_half_span(int P, int k, int part);
/* The most RoPE runs (cp_ring_rope_runs) any rank of a ring of P groups of C GPUs has: 2 where an odd C makes a rank
 * straddle its group's two chunks (P > 1), else 1. */
int cp_ring_rope_nruns(int P, int C);
/* Forward FLOPs of one ring step for u query heads: every step is the same work, 2 L^2 u D (a causal L x L block,
 * or a full L x L/2 one), so the P steps sum to the causal forward 2 S^2 D per head over the ring. */
double cp_ring_step_fwd_flops(int64_t group_tokens, int u, int64_t head_dim);
/* Seconds a send/recv of `bytes` each way takes between nodes: bytes at machine.net_gbps plus machine.net_us of
 * latency, as the plan's other cross-node collectives. */
double cp_ring_sendrecv_seconds(int64_t bytes, const cp_machine *mc);
/* Seconds such a send/recv leaves exposed beyond t_block, the attention on the block in hand it overlaps. */
double cp_ring_exposed(int64_t bytes, const cp_machine *mc, double t_block);

#endif
