/* world.h: the ranks of one run of several GPUs meet: from the launcher's environment (launch.h) each process
 * learns its rank and GPU, rank 0's NCCL unique id reaches every rank through the rendezvous (TCP, or a shared file;
 * rendezvous.h), every rank checks that all planned the same arena and spec, and the NCCL communicator of all ranks
 * is made (nccl_rt.h). */
#ifndef CP_WORLD_H
#define CP_WORLD_H

#include <stdint.h>

#include "launch.h"
#include "nccl_rt.h"
#include "ranks.h"

typedef struct {
    cp_launch_env env;
    int rank, size, device; /* device: the CUDA device of this rank (its local rank) */
    int64_t base_free;      /* the device's free memory before this process made its context (-1: no NVML) */
    cp_nccl_comm comm;      /* every rank of the run */
    /* A run of several groups (replicas, a ring): the communicators split off the run's (cp_world_split). group:
     * this rank's Ulysses group; ring: the ranks of its replica and local rank, in ring order; shard: the ranks of
     * its local rank in every group. Unused (comm NULL) where the run's own serves, or none is needed. */
    cp_nccl_comm group, ring, shard;
    cp_nccl_comm *of_kind[CP_COMM_COUNT]; /* the communicator of each kind; NULL where it would be this rank alone */
    int group_rank;                       /* this rank within its Ulysses group (its local rank) */
    /* The TCP rendezvous, kept open for the run as its news line (cp_world_watch); NULL with the file rendezvous. */
    struct cp_rdv *rdv;
    double stop_grace_s; /* after news of a gone rank, how long this rank may take to stop by itself (<= 0: 10 s) */
} cp_world;

/* Join the run of env (already detected, env->size > 1). plan_key is what every rank must agree on (the spec's hash
 * and the arena sizes): a rank that planned otherwise stops every rank with a message naming it. Sets the CUDA
 * device before NCCL is initialised: local rank / ranks_per_gpu. With ranks_per_gpu > 1 each rank is made its own
 * NCCL host (NCCL_HOSTID), since NCCL refuses two ranks of one host on one GPU; it then connects them through its
 * network path, over the loopback device when all ranks are on this node. Returns 0, or -1 with a message naming
 * this rank. */
int cp_world_join(cp_world *w, const cp_launch_env *env, const int64_t plan_key[3], int ranks_per_gpu, char *err,
                  int errlen);
/* Where a rank sits in the communicator of `kind` a split makes: its colour and its rank within it (the order of
 * cp_rank_comm's members). Returns the communicator's size. A pure function, so every rank splits alike. */
int cp_world_comm_place(const cp_rank_layout *L, int rank, cp_comm_kind kind, int *color, int *key);

/* The communicators of each kind for layout L (whose ranks must be the run's): the run's own for a kind whose
 * communicator holds every rank (so one group splits nothing, no extra initialisation), none for one that would
 * hold this rank alone, and the others (the Ulysses group's, the ring's, the shard's of several groups) split off
 * the run's. Every rank calls it. Returns 0, or -1 with a message naming this rank (the run's communicator is
 * aborted then). */
int cp_world_split(cp_world *w, const cp_rank_layout *L, char *err, int errlen);
/* Watch the other ranks through the rendezvous r (which w keeps and closes): when one is killed, crashes or fails,
 * this rank hears of it at once (rendezvous.h), every wait on NCCL ends with a message naming that rank
 * (cp_nccl_stop_all), and if this process has not stopped by itself stop_grace_s later (stuck in a call that no
 * deadline reaches), it says so and exits with code 1. cp_world_join calls it; tests call it directly. */
int cp_world_watch(cp_world *w, struct cp_rdv *r, char *err, int errlen);
/* Leave normally: the communicators finalized and destroyed, then a goodbye to the others. */
void cp_world_leave(cp_world *w);
/* After an error (why): the others told why, through the watch, and every communicator of this rank aborted, so
 * that they stop now instead of at their next collective's deadline. */
void cp_world_fail(cp_world *w, const char *why);
/* Every communicator of this rank aborted. */
void cp_world_abort(cp_world *w);

#endif
