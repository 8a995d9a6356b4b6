/* ranks.h: where each of a run's replicas x ring x gpus ranks sits, and which ranks each communicator joins. A pure
 * function of the three counts, so every rank computes the same layout without talking to the others. */
#ifndef CP_RANKS_H
#define CP_RANKS_H

#include <stdbool.h>

/* The run's shape: R replica groups, each a ring of P groups of C GPUs (the Ulysses/FSDP group). */
typedef struct {
    int replicas, ring, gpus;
} cp_rank_layout;

/* One rank's place. */
typedef struct {
    int replica;  /* which replica set of the sequence stream, 0..R-1 */
    int ring_pos; /* position in its ring, 0..P-1: holds zigzag chunks ring_pos and 2P-1-ring_pos */
    int local;    /* rank within its Ulysses group, 0..C-1 */
} cp_rank_place;

/* The communicators of a run. ULYSSES: the C ranks of one group (all-to-all, FSDP gather and reduce-scatter);
 * RING: the P ranks of one replica with the same local rank (K, V blocks passed around); SHARD: the R x P ranks with
 * the same local rank, across replicas and ring positions: every group holds the whole model sharded the same way,
 * so these hold the same parameter shard (the gradient all-reduce, the loss summed over groups); WORLD: all. */
typedef enum { CP_COMM_ULYSSES, CP_COMM_RING, CP_COMM_SHARD, CP_COMM_WORLD, CP_COMM_COUNT } cp_comm_kind;

int cp_rank_world(const cp_rank_layout *L);
/* Ranks are numbered (replica * P + ring_pos) * C + local: a Ulysses group is C consecutive ranks, so a launcher
 * that fills nodes in rank order puts it on one node (NVLink) whenever C divides the GPUs per node; ring neighbours
 * are C ranks apart and replicas P * C apart, on other nodes once C fills a node. */
cp_rank_place cp_rank_of(const cp_rank_layout *L, int rank);
int cp_rank_at(const cp_rank_layout *L, cp_rank_place p);
/* The ring's neighbours: the rank K and V blocks are sent to (next) and received from (prev). */
int cp_rank_ring_next(const cp_rank_layout *L, int rank);
int cp_rank_ring_prev(const cp_rank_layout *L, int rank);
/* The communicator of `kind` that `rank` joins: its number among those of that kind (the colour of a communicator
 * split), and its members in ascending order into out (room for cp_rank_world). Returns the member count. */
int cp_rank_comm(const cp_rank_layout *L, int rank, cp_comm_kind kind, int *color, int *out);
/* The members of a communicator of `kind` (every one of that kind has as many). */
int cp_rank_comm_size(const cp_rank_layout *L, cp_comm_kind kind);
/* How many communicators each rank splits off the run's: a kind is split where it holds more than the rank and
 * fewer than all (one group's Ulysses group is the run's own; a kind of one rank is none). */
int cp_rank_splits(const cp_rank_layout *L);
/* The node of a rank when a launcher fills nodes of `per_node` GPUs in rank order. */
int cp_rank_node(int rank, int per_node);
const char *cp_comm_kind_name(cp_comm_kind k);

#endif
