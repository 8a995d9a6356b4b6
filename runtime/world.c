/* world.c: the ranks of a run meet and make their communicator (see world.h). */
#include "world.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "exec.h"
#include "rendezvous.h"
#include "spec.h"
#include "util.h"

enum { PLAN_KEYS = 3, MAX_RANKS = 512 };

int cp_world_join(cp_world *w, const cp_launch_env *env, const int64_t plan_key[3], char *err, int errlen) {
    memset(w, 0, sizeof *w);
    w->env = *env;
    w->rank = env->rank;
    w->size = env->size;
    w->device = env->local_rank;
    if (w->size > MAX_RANKS) return cp_errf(err, errlen, "%d ranks: at most %d are supported", w->size, MAX_RANKS);
    char m[CP_ERR_MAX];
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess) return cp_cuda_errmsg(e, "counting the GPUs", err, errlen);
    if (w->device >= ndev)
        return cp_errf(err, errlen, "rank %d: local rank %d, but this node has %d GPU%s: start at most one process per "
                       "GPU on each node", w->rank, w->device, ndev, ndev == 1 ? "" : "s");
    w->base_free = cp_exec_device_free(w->device); /* before the context and NCCL's buffers exist */
    e = cudaSetDevice(w->device);
    if (e != cudaSuccess) {
        snprintf(m, sizeof m, "rank %d: selecting GPU %d", w->rank, w->device);
        return cp_cuda_errmsg(e, m, err, errlen);
    }
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (w->rank == 0 && cp_nccl_unique_id(&id, err, errlen)) return -1;
    int64_t all[PLAN_KEYS * MAX_RANKS];
    if (env->rendezvous_file[0]) {
        /* the file carries rank 0's id and plan: each rank compares its own plan with it */
        struct {
            ncclUniqueId id;
            int64_t key[PLAN_KEYS];
        } blob;
        memset(&blob, 0, sizeof blob);
        blob.id = id;
        memcpy(blob.key, plan_key, sizeof blob.key);
        if (cp_rdv_file_exchange(env->rendezvous_file, env->job_id, w->rank, w->size, &blob, sizeof blob, 0, err,
                                 errlen))
            return -1;
        if (memcmp(blob.key, plan_key, sizeof blob.key))
            return cp_errf(err, errlen, "rank %d planned differently from rank 0 (spec hash or arena sizes): every rank "
                           "must run the same cpgen with the same spec and --set options", w->rank);
        id = blob.id;
    } else {
        cp_rdv *r;
        cp_rdv_opts o = {.rank = w->rank, .size = w->size, .addr = env->master_addr, .port = env->master_port};
        if (cp_rdv_open(&r, &o, err, errlen)) return -1;
        int rc = cp_rdv_bcast(r, &id, sizeof id, err, errlen);
        if (!rc) rc = cp_rdv_allgather(r, plan_key, PLAN_KEYS, all, err, errlen);
        cp_rdv_close(r);
        if (rc) return -1;
        for (int k = 0; k < w->size; k++)
            if (memcmp(all + k * PLAN_KEYS, plan_key, sizeof(int64_t) * PLAN_KEYS))
                return cp_errf(err, errlen, "rank %d planned differently from rank %d (spec hash or arena sizes): "
                               "every rank must run the same cpgen with the same spec and --set options", k, w->rank);
    }
    /* CPGEN_NCCL_TIMEOUT: seconds a rank waits for the others (joining, a collective's call) before it gives up */
    const char *ts = getenv("CPGEN_NCCL_TIMEOUT");
    double timeout = ts && *ts ? strtod(ts, NULL) : 0;
    if (cp_nccl_init(&w->comm, w->rank, w->size, &id, timeout, err, errlen)) {
        snprintf(m, sizeof m, "%s", err);
        return cp_errf(err, errlen, "rank %d: %s", w->rank, m);
    }
    return 0;
}

void cp_world_leave(cp_world *w) {
    if (!w->comm.comm) return;
    char err[CP_ERR_MAX];
    if (cp_nccl_destroy(&w->comm, err, sizeof err)) fprintf(stderr, "cpgen: rank %d: %s\n", w->rank, err);
}
