/* world.h: the ranks of one run of several GPUs meet: from the launcher's environment (launch.h) each process
 * learns its rank and GPU, rank 0's NCCL unique id reaches every rank through the rendezvous (TCP, or a shared file;
 * rendezvous.h), every rank checks that all planned the same arena and spec, and the NCCL communicator of all ranks
 * is made (nccl_rt.h). */
#ifndef CP_WORLD_H
#define CP_WORLD_H

#include <stdint.h>

#include "launch.h"
#include "nccl_rt.h"

typedef struct {
    cp_launch_env env;
    int rank, size, device; /* device: the CUDA device of this rank (its local rank) */
    int64_t base_free;      /* the device's free memory before this process made its context (-1: no NVML) */
    cp_nccl_comm comm;
} cp_world;

/* Join the run of env (already detected, env->size > 1). plan_key is what every rank must agree on (the spec's hash
 * and the arena sizes): a rank that planned otherwise stops every rank with a message naming it. Sets the CUDA
 * device before NCCL is initialised. Returns 0, or -1 with a message naming this rank. */
int cp_world_join(cp_world *w, const cp_launch_env *env, const int64_t plan_key[3], char *err, int errlen);
void cp_world_leave(cp_world *w);

#endif
