/* world.c: the ranks of a run meet and make their communicator (see world.h). */
#include "world.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "exec.h"
#include "rendezvous.h"
#include "spec.h"
#include "util.h"

enum { PLAN_KEYS = 3, MAX_RANKS = 512 };

/* Ranks that share a GPU: NCCL's check against two ranks of one host on one GPU compares host ids, so each rank
 * becomes a host of its own, and NCCL joins them through its network transport as it would ranks on several nodes.
 * On one node the loopback device carries it, and InfiniBand stays out (it would loop through the NIC). Variables
 * the user set are kept, but the host id, which must differ per rank. Before NCCL reads its environment. */
static void share_gpus(const cp_launch_env *env) {
    char id[64];
    snprintf(id, sizeof id, "cpgen-rank-%d", env->rank);
    setenv("NCCL_HOSTID", id, 1);
    if (env->local_size == env->size) {
        setenv("NCCL_SOCKET_IFNAME", "lo", 0);
        setenv("NCCL_IB_DISABLE", "1", 0);
    }
}

int cp_world_join(cp_world *w, const cp_launch_env *env, const int64_t plan_key[3], int ranks_per_gpu, char *err,
                  int errlen) {
    memset(w, 0, sizeof *w);
    w->env = *env;
    w->rank = env->rank;
    w->size = env->size;
    if (ranks_per_gpu < 1) ranks_per_gpu = 1;
    w->device = env->local_rank / ranks_per_gpu;
    if (w->size > MAX_RANKS) return cp_errf(err, errlen, "%d ranks: at most %d are supported", w->size, MAX_RANKS);
    char m[CP_ERR_MAX];
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess) return cp_cuda_errmsg(e, "counting the GPUs", err, errlen);
    if (w->device >= ndev) {
        if (ranks_per_gpu > 1)
            return cp_errf(err, errlen, "rank %d: local rank %d with %d ranks to a GPU needs GPU %d, but this node has "
                           "%d: start at most %d processes on each node, or put more on each GPU (--ranks-per-gpu)",
                           w->rank, env->local_rank, ranks_per_gpu, w->device, ndev, ndev * ranks_per_gpu);
        return cp_errf(err, errlen, "rank %d: local rank %d, but this node has %d GPU%s: start at most one process per "
                       "GPU on each node, or share the GPUs (--ranks-per-gpu)", w->rank, w->device, ndev,
                       ndev == 1 ? "" : "s");
    }
    if (ranks_per_gpu > 1) share_gpus(env);
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
        for (int k = 0; k < w->size && !rc; k++)
            if (memcmp(all + k * PLAN_KEYS, plan_key, sizeof(int64_t) * PLAN_KEYS))
                rc = cp_errf(err, errlen, "rank %d planned differently from rank %d (spec hash or arena sizes): "
                             "every rank must run the same cpgen with the same spec and --set options", k, w->rank);
        /* the star stays as the run's news line: from here on a rank that dies is known to all at once */
        if (!rc) rc = cp_world_watch(w, r, err, errlen);
        else cp_rdv_close(r);
        if (rc) return -1;
    }
    /* CPGEN_NCCL_TIMEOUT: seconds a rank waits for the others (joining, a collective's call) before it gives up */
    const char *ts = getenv("CPGEN_NCCL_TIMEOUT");
    double timeout = ts && *ts ? strtod(ts, NULL) : 0;
    if (cp_nccl_init(&w->comm, w->rank, w->size, &id, timeout, err, errlen)) { /* its message names the rank */
        cp_world_fail(w, err);
        return -1;
    }
    return 0;
}

int cp_world_comm_place(const cp_rank_layout *L, int rank, cp_comm_kind kind, int *color, int *key) {
    int members[MAX_RANKS];
    if (cp_rank_world(L) > MAX_RANKS) return *color = *key = -1, 0;
    int n = cp_rank_comm(L, rank, kind, color, members);
    *key = -1;
    for (int k = 0; k < n; k++)
        if (members[k] == rank) *key = k;
    return n;
}

int cp_world_split(cp_world *w, const cp_rank_layout *L, char *err, int errlen) {
    memset(w->of_kind, 0, sizeof w->of_kind);
    if (cp_rank_world(L) != w->size)
        return cp_errf(err, errlen, "rank %d: the run has %d ranks, its plan %d x %d x %d = %d: start one process per "
                       "GPU of the plan (replicas x ring x gpus)", w->rank, w->size, L->replicas, L->ring, L->gpus,
                       cp_rank_world(L));
    w->group_rank = cp_rank_of(L, w->rank).local;
    /* Each kind's communicator: none where it would be this rank alone, the run's own where it holds every rank (one
     * group's Ulysses group, the shard of groups of one GPU, a ring of single GPUs), else split off the run's. The
     * layout alone decides, so every rank makes the same splits in the same order. */
    cp_nccl_comm *own[CP_COMM_COUNT] = {[CP_COMM_ULYSSES] = &w->group, [CP_COMM_RING] = &w->ring,
                                        [CP_COMM_SHARD] = &w->shard}; /* the run's holds every rank: never split */
    for (int k = 0; k < CP_COMM_COUNT; k++) {
        int color, key, n = cp_world_comm_place(L, w->rank, (cp_comm_kind)k, &color, &key);
        if (n == 1) continue; /* the rule cp_rank_splits counts */
        if (n == w->size) {
            w->of_kind[k] = &w->comm;
            continue;
        }
        if (cp_nccl_split(&w->comm, color, key, n, cp_comm_kind_name((cp_comm_kind)k), own[k], err, errlen)) return -1;
        w->of_kind[k] = own[k];
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------
 * the watch: news of a rank gone */

typedef struct {
    int rank;
    double grace_s;
} stopper;

static atomic_bool stopping;

/* Started with the first news: the main thread normally stops within a poll of its next wait (cp_nccl_stop_all);
 * where it is stuck in a call no deadline reaches (a GPU wait on a collective whose peer is dead, an abort that
 * does not return), this ends the process. */
static void *stop_after_grace(void *arg) {
    stopper s = *(stopper *)arg;
    free(arg);
    for (double until = cp_now() + s.grace_s; cp_now() < until;) usleep(20000);
    fprintf(stderr, "cpgen: rank %d: stopping: %s; this rank did not stop by itself within %.3g s of hearing it (a "
            "wait that no deadline reaches), so it exits now\n", s.rank, cp_nccl_stop_reason(), s.grace_s);
    fflush(stderr);
    _exit(CP_EXIT_FAIL);
}

static void on_peer_gone(void *ctx, int rank, const char *why) {
    const cp_world *w = ctx;
    char m[CP_ERR_MAX];
    snprintf(m, sizeof m, "rank %d %s", rank, why);
    cp_nccl_stop_all(m);
    if (atomic_exchange(&stopping, true)) return;
    stopper *s = malloc(sizeof *s);
    pthread_t t;
    if (!s) _exit(CP_EXIT_FAIL);
    *s = (stopper){w->rank, w->stop_grace_s > 0 ? w->stop_grace_s : 10.0};
    if (pthread_create(&t, NULL, stop_after_grace, s) != 0) {
        fprintf(stderr, "cpgen: rank %d: stopping: %s\n", w->rank, m);
        _exit(CP_EXIT_FAIL);
    }
    pthread_detach(t);
}

int cp_world_watch(cp_world *w, cp_rdv *r, char *err, int errlen) {
    w->rdv = r;
    if (cp_rdv_watch(r, on_peer_gone, w, err, errlen)) {
        cp_rdv_close(r);
        w->rdv = NULL;
        return -1;
    }
    cp_nccl_expect_news(true);
    return 0;
}

static void close_news(cp_world *w) {
    cp_nccl_expect_news(false);
    cp_rdv_close(w->rdv);
    w->rdv = NULL;
}

void cp_world_leave(cp_world *w) {
    char err[CP_ERR_MAX];
    /* the split ones before the run's they came from */
    cp_nccl_comm *own[] = {&w->group, &w->ring, &w->shard, &w->comm};
    for (size_t k = 0; k < sizeof own / sizeof own[0]; k++)
        if (own[k]->comm && cp_nccl_destroy(own[k], err, sizeof err))
            fprintf(stderr, "cpgen: rank %d: %s\n", w->rank, err);
    cp_rdv_say_bye(w->rdv);
    close_news(w);
}

void cp_world_fail(cp_world *w, const char *why) {
    cp_rdv_say_fail(w->rdv, why);
    cp_world_abort(w);
    close_news(w);
}

void cp_world_abort(cp_world *w) {
    cp_nccl_abort(&w->group);
    cp_nccl_abort(&w->ring);
    cp_nccl_abort(&w->shard);
    cp_nccl_abort(&w->comm);
}
