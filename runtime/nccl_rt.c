/* nccl_rt.c: NCCL through dlopen, checked wrappers, and the watchdog that keeps a rank from waiting forever on a
 * dead peer (see nccl_rt.h). */
#include "nccl_rt.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_check.h"
#include "util.h"

#define DEFAULT_LIB "libnccl.so.2"
#define INSTALL_HINT                                                                                                \
    "install NCCL 2.14 or newer: the libnccl2 package from NVIDIA's CUDA repository (apt install libnccl2), or "     \
    "`pip install nvidia-nccl-cu13` with its nvidia/nccl/lib folder added to LD_LIBRARY_PATH"

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static cp_nccl_api loaded;
static const cp_nccl_api *api; /* what the wrappers call: the loaded library, or a test's table */
static int api_version;

static void sleep_s(double s) {
    struct timespec t = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&t, NULL);
}

void cp_nccl_version_str(int code, char *buf, int n) {
    /* NCCL_VERSION: X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z from 2.9 on. */
    if (code >= 10000) snprintf(buf, (size_t)n, "%d.%d.%d", code / 10000, code % 10000 / 100, code % 100);
    else snprintf(buf, (size_t)n, "%d.%d.%d", code / 1000, code % 1000 / 100, code % 100);
}

int cp_nccl_load(const char *lib, char *err, int errlen) {
    pthread_mutex_lock(&load_lock);
    if (api) {
        pthread_mutex_unlock(&load_lock);
        return 0;
    }
    const char *name = lib && *lib ? lib : DEFAULT_LIB;
    int rc = 0;
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        rc = cp_errf(err, errlen, "cannot load %s (%s): NCCL is needed only when parallel.gpus > 1; %s", name,
                  why ? why : "not found", INSTALL_HINT);
        goto out;
    }
    cp_nccl_api t = {0};
    struct {
        const char *sym;
        void **slot;
        bool required;
    } syms[] = {
        {"ncclGetVersion", (void **)&t.GetVersion, true},
        {"ncclGetUniqueId", (void **)&t.GetUniqueId, true},
        {"ncclCommInitRank", (void **)&t.CommInitRank, true},
        {"ncclCommInitRankConfig", (void **)&t.CommInitRankConfig, false},
        {"ncclCommFinalize", (void **)&t.CommFinalize, false},
        {"ncclCommSplit", (void **)&t.CommSplit, false},
        {"ncclCommDestroy", (void **)&t.CommDestroy, true},
        {"ncclCommAbort", (void **)&t.CommAbort, true},
        {"ncclCommGetAsyncError", (void **)&t.CommGetAsyncError, true},
        {"ncclAllGather", (void **)&t.AllGather, true},
        {"ncclReduceScatter", (void **)&t.ReduceScatter, true},
        {"ncclAllReduce", (void **)&t.AllReduce, true},
        {"ncclSend", (void **)&t.Send, true},
        {"ncclRecv", (void **)&t.Recv, true},
        {"ncclGroupStart", (void **)&t.GroupStart, true},
        {"ncclGroupEnd", (void **)&t.GroupEnd, true},
        {"ncclGetErrorString", (void **)&t.GetErrorString, true},
        {"ncclGetLastError", (void **)&t.GetLastError, false},
    };
    for (size_t k = 0; k < sizeof syms / sizeof syms[0]; k++) {
        *syms[k].slot = dlsym(h, syms[k].sym);
        if (!*syms[k].slot && syms[k].required) {
            rc = cp_errf(err, errlen, "%s has no %s: it is not NCCL, or a version too old for cpgen; %s", name,
                      syms[k].sym, INSTALL_HINT);
            dlclose(h);
            goto out;
        }
    }
    int v = 0;
    ncclResult_t r = t.GetVersion(&v);
    char vs[32];
    cp_nccl_version_str(v, vs, sizeof vs);
    if (r != ncclSuccess || v < 2000 || v >= 30000) {
        rc = cp_errf(err, errlen, "%s reports version %s (code %d): cpgen is built against the NCCL 2 interface; %s",
                  name, vs, v, INSTALL_HINT);
        dlclose(h);
        goto out;
    }
    /* The library stays open for the life of the process: NCCL starts threads that outlive any communicator. */
    /* NVLink SHARP stays off unless the user chose otherwise, as for the ranks cp_launch_spawn starts (launch.c);
     * set here, before NCCL reads its environment, it also covers mpirun and srun launches. */
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    loaded = t;
    api = &loaded;
    api_version = v;
out:
    pthread_mutex_unlock(&load_lock);
    return rc;
}

const cp_nccl_api *cp_nccl_api_get(void) { return api; }

void cp_nccl_use_api(const cp_nccl_api *a, int version) {
    pthread_mutex_lock(&load_lock);
    api = a;
    api_version = a ? version : 0;
    pthread_mutex_unlock(&load_lock);
}

int cp_nccl_version(void) { return api ? api_version : 0; }

size_t cp_nccl_type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * messages */

static const char *result_name(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "unknown NCCL result";
    }
}

static const char *result_hint(ncclResult_t r) {
    switch (r) {
    case ncclUnhandledCudaError:
        return "a CUDA call inside NCCL failed: check the GPU with nvidia-smi; NCCL_DEBUG=WARN names the call";
    case ncclSystemError:
        return "a system call failed (network, shared memory or file descriptors): rerun with NCCL_DEBUG=WARN; in a "
               "container, give /dev/shm more room (--shm-size) and raise the open-file limit";
    case ncclInternalError:
        return "NCCL failed internally: rerun with NCCL_DEBUG=INFO and report it with the NCCL version";
    case ncclInvalidArgument:
        return "cpgen passed NCCL a bad argument, a cpgen bug: NCCL_DEBUG=WARN says which";
    case ncclInvalidUsage:
        return "the ranks called NCCL out of step (a different collective, size or order): every rank must run the "
               "same plan";
    case ncclRemoteError:
        return "another rank failed or exited, or the network between them broke: the first error is in another "
               "rank's output";
    default: return "rerun with NCCL_DEBUG=WARN for NCCL's own message";
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * news of a peer gone */

static char stop_why[1024];
static atomic_int stop_state; /* 0: none, 1: being written, 2: stop_why holds the reason */
static atomic_bool news_expected;

void cp_nccl_stop_all(const char *why) {
    if (!why) { /* tests start afresh */
        atomic_store(&stop_state, 0);
        return;
    }
    int none = 0;
    if (!atomic_compare_exchange_strong(&stop_state, &none, 1)) return; /* the first reason stays */
    snprintf(stop_why, sizeof stop_why, "%s", why);
    atomic_store(&stop_state, 2);
}

const char *cp_nccl_stop_reason(void) { return atomic_load(&stop_state) == 2 ? stop_why : NULL; }

void cp_nccl_expect_news(bool on) { atomic_store(&news_expected, on); }

/* "; rank K is gone: ..." for a message about an error, where the run's watch knows why: the news of a dead peer
 * and NCCL's own error (a closed connection) race, so with a watch running an error waits a moment for it. */
static void peer_note(char *buf, size_t n) {
    buf[0] = 0;
    const char *why = cp_nccl_stop_reason();
    for (double until = cp_now() + 2.0; !why && atomic_load(&news_expected) && cp_now() < until;) {
        sleep_s(0.01);
        why = cp_nccl_stop_reason();
    }
    if (why) snprintf(buf, n, "; meanwhile: %s", why);
}

/* A wait's poll: the news of a gone peer ends it, the communicator aborted. */
static int stopped(cp_nccl_comm *c, const char *what, char *err, int errlen);

/* "rank R: call: ncclX (text); NCCL says: last; hint". */
static int nccl_fail(const cp_nccl_comm *c, ncclResult_t r, const char *call, const char *extra, char *err,
                     int errlen) {
    const char *text = api && api->GetErrorString ? api->GetErrorString(r) : NULL;
    const char *last = api && api->GetLastError ? api->GetLastError(c ? c->comm : NULL) : NULL;
    char rank[32] = "", note[1100];
    if (c) snprintf(rank, sizeof rank, "rank %d: ", c->rank);
    peer_note(note, sizeof note);
    return cp_errf(err, errlen, "%s%s: %s (%s)%s%s; %s%s%s", rank, call, result_name(r), text ? text : "",
                last && *last ? "; NCCL says: " : "", last && *last ? last : "", result_hint(r), note,
                extra ? extra : "");
}

void cp_nccl_abort(cp_nccl_comm *c) {
    if (!c || !c->comm || !api) return;
    (void)api->CommAbort(c->comm); /* nothing more can be done if the abort itself fails */
    c->comm = NULL;
    c->aborted = true;
}

static const char *const ABORTED = "; the communicator was aborted, so that no rank waits on it forever";

static int stopped(cp_nccl_comm *c, const char *what, char *err, int errlen) {
    const char *why = cp_nccl_stop_reason();
    if (!why) return 0;
    cp_errf(err, errlen, "rank %d: stopped waiting for %s: %s%s", c->rank, what, why, ABORTED);
    cp_nccl_abort(c);
    return -1;
}

static int check_comm(const cp_nccl_comm *c, const char *call, char *err, int errlen) {
    if (!api) return cp_errf(err, errlen, "%s: NCCL is not loaded (cp_nccl_load)", call);
    if (!c) return cp_errf(err, errlen, "%s: no communicator", call);
    if (c->aborted)
        return cp_errf(err, errlen, "rank %d: %s: the communicator was aborted after an earlier error; that error is "
                    "the one to fix", c->rank, call);
    if (!c->comm) return cp_errf(err, errlen, "rank %d: %s: the communicator is not initialised (cp_nccl_init)", c->rank, call);
    return 0;
}

static int check_buf(const cp_nccl_comm *c, const char *call, const char *name, const void *p, size_t count,
                     ncclDataType_t t, size_t ranks, char *err, int errlen) {
    size_t es = cp_nccl_type_size(t);
    if (!es) return cp_errf(err, errlen, "rank %d: %s: data type %d is not one cpgen knows", c->rank, call, (int)t);
    if (count && count > SIZE_MAX / es / ranks)
        return cp_errf(err, errlen, "rank %d: %s: %zu elements per rank overflow the address space", c->rank, call, count);
    if (count && !p) return cp_errf(err, errlen, "rank %d: %s: %s is NULL for %zu elements", c->rank, call, name, count);
    return 0;
}

/* After a call: an error aborts the communicator (its peers then see a remote error instead of waiting for this
 * rank), and on a non-blocking communicator a call still in progress is polled until it is done or timeout_s
 * passes. `what` names the work in a timeout message. */
static int settle(cp_nccl_comm *c, ncclResult_t r, const char *call, const char *what, double timeout_s, char *err,
                  int errlen) {
    if (r == ncclSuccess) return 0;
    if (r != ncclInProgress || !c->nonblocking) {
        int rc = nccl_fail(c, r, call, ABORTED, err, errlen);
        cp_nccl_abort(c);
        return rc;
    }
    double deadline = cp_now() + timeout_s, nap = 20e-6;
    for (;;) {
        ncclResult_t st = ncclSuccess, q = api->CommGetAsyncError(c->comm, &st);
        if (q != ncclSuccess) {
            int rc = nccl_fail(c, q, "ncclCommGetAsyncError", ABORTED, err, errlen);
            cp_nccl_abort(c);
            return rc;
        }
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress) {
            int rc = nccl_fail(c, st, call, ABORTED, err, errlen);
            cp_nccl_abort(c);
            return rc;
        }
        if (stopped(c, call, err, errlen)) return -1;
        if (cp_now() >= deadline) {
            char note[1100];
            peer_note(note, sizeof note);
            cp_errf(err, errlen, "rank %d: %s did not finish within %.3g s: %s%s%s", c->rank, call, timeout_s, what,
                    note, ABORTED);
            cp_nccl_abort(c);
            return -1;
        }
        sleep_s(nap);
        nap = nap * 2 < 1e-3 ? nap * 2 : 1e-3;
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * communicators */

int cp_nccl_unique_id(ncclUniqueId *id, char *err, int errlen) {
    if (!id) return cp_errf(err, errlen, "cp_nccl_unique_id: no id to fill");
    if (cp_nccl_load(NULL, err, errlen)) return -1;
    ncclResult_t r = api->GetUniqueId(id);
    if (r != ncclSuccess) return nccl_fail(NULL, r, "ncclGetUniqueId", NULL, err, errlen);
    return 0;
}

int cp_nccl_init(cp_nccl_comm *c, int rank, int size, const ncclUniqueId *id, double timeout_s, char *err,
                 int errlen) {
    if (!c || !id) return cp_errf(err, errlen, "cp_nccl_init: no communicator or id");
    memset(c, 0, sizeof *c);
    c->rank = rank;
    c->size = size;
    c->timeout_s = timeout_s > 0 ? timeout_s : 300;
    if (size < 1 || rank < 0 || rank >= size)
        return cp_errf(err, errlen, "cp_nccl_init: rank %d of %d is not a valid rank", rank, size);
    if (!api && cp_nccl_load(NULL, err, errlen)) return -1;
    char call[96];
    snprintf(call, sizeof call, "NCCL initialisation of %d ranks", size);
    const char *why = "a rank did not reach it (check that every rank started and got the same unique id), or the "
                      "network between the nodes is blocked; NCCL_DEBUG=INFO shows where it waits";
    ncclComm_t comm = NULL;
    ncclResult_t r;
    if (api->CommInitRankConfig) {
        /* Non-blocking: the call returns at once, and settle() polls it with a deadline, which the blocking call
         * cannot have. */
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        r = api->CommInitRankConfig(&comm, size, *id, rank, &cfg);
        c->nonblocking = true;
    } else {
        r = api->CommInitRank(&comm, size, *id, rank);
    }
    c->comm = comm;
    if (r != ncclSuccess && r != ncclInProgress && !comm) return nccl_fail(c, r, call, NULL, err, errlen);
    if (settle(c, r, call, why, c->timeout_s, err, errlen)) return -1;
    return 0;
}

int cp_nccl_split(cp_nccl_comm *parent, int color, int key, int size, const char *what, cp_nccl_comm *c, char *err,
                  int errlen) {
    if (!c) return cp_errf(err, errlen, "cp_nccl_split: no communicator to fill");
    memset(c, 0, sizeof *c);
    if (check_comm(parent, "ncclCommSplit", err, errlen)) return -1;
    if (color < 0 || size < 1 || key < 0 || key >= size)
        return cp_errf(err, errlen, "rank %d: splitting the %s communicator: colour %d, rank %d of %d is not a valid "
                       "place (a cpgen bug)", parent->rank, what, color, key, size);
    if (!api->CommSplit) {
        char v[32];
        cp_nccl_version_str(api_version, v, sizeof v);
        return cp_errf(err, errlen, "rank %d: the %s communicator needs ncclCommSplit, which NCCL %s lacks: runs of "
                       "several groups (parallel.replicas, parallel.ring) need NCCL 2.18 or newer; %s", parent->rank,
                       what, v, INSTALL_HINT);
    }
    c->rank = key;
    c->size = size;
    c->timeout_s = parent->timeout_s;
    c->nonblocking = parent->nonblocking;
    char call[128];
    snprintf(call, sizeof call, "ncclCommSplit into the %s communicator (colour %d, %d ranks)", what, color, size);
    const char *why = "a rank of the run did not reach it (every rank splits the run's communicator alike)";
    /* NCCL writes the new handle through the pointer it is given when the split has finished: on a non-blocking
     * parent that is later, from NCCL's own thread, after this call has returned. So the pointer is c->comm itself,
     * which lives as long as c (the world's communicators live in cp_world), never a local. */
    ncclResult_t r;
    if (parent->nonblocking) {
        ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
        cfg.blocking = 0;
        r = api->CommSplit(parent->comm, color, key, &c->comm, &cfg);
    } else {
        r = api->CommSplit(parent->comm, color, key, &c->comm, NULL);
    }
    if (r != ncclSuccess && r != ncclInProgress) {
        /* the parent's other ranks wait in the split for this one: stop them */
        int rc = nccl_fail(parent, r, call, ABORTED, err, errlen);
        cp_nccl_abort(parent);
        memset(c, 0, sizeof *c);
        return rc;
    }
    /* Until the split is done the parent is busy (NCCL refuses a second split or a collective on it, "Attempt to
     * use communicator before the previous operation returned ncclSuccess"), and the new handle is not there yet.
     * The call's result does not say so: NCCL 2.28 returns ncclSuccess with the split still running on its thread.
     * So a non-blocking parent is always polled until it is free (settle aborts it on an error or at the
     * deadline). */
    if (settle(parent, parent->nonblocking ? ncclInProgress : r, call, why, c->timeout_s, err, errlen)) {
        memset(c, 0, sizeof *c);
        return -1;
    }
    if (!__atomic_load_n(&c->comm, __ATOMIC_ACQUIRE)) {
        int rc = cp_errf(err, errlen, "rank %d: %s finished without giving a communicator (NCCL %d): rerun with "
                         "NCCL_DEBUG=INFO and report it with the NCCL version", parent->rank, call, api_version);
        cp_nccl_abort(parent);
        return rc;
    }
    /* then the new communicator itself, which reports its own state from now on */
    if (settle(c, c->nonblocking ? ncclInProgress : ncclSuccess, call, why, c->timeout_s, err, errlen)) {
        cp_nccl_abort(parent);
        return -1;
    }
    return 0;
}

int cp_nccl_destroy(cp_nccl_comm *c, char *err, int errlen) {
    if (!c) return 0;
    int rc = 0;
    if (c->comm && api) {
        if (api->CommFinalize) {
            /* Finalize flushes this rank's outstanding work with a deadline (on a non-blocking communicator);
             * destroy then only frees. On failure the communicator is aborted instead. */
            ncclResult_t r = api->CommFinalize(c->comm);
            rc = settle(c, r, "ncclCommFinalize", "a peer is stuck or gone", c->timeout_s, err, errlen);
        }
        if (c->comm) {
            ncclResult_t r = api->CommDestroy(c->comm);
            if (r != ncclSuccess && r != ncclInProgress) {
                rc = nccl_fail(c, r, "ncclCommDestroy", ABORTED, err, errlen);
                cp_nccl_abort(c);
            }
        }
    }
    memset(c, 0, sizeof *c);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------------
 * collectives */

int cp_nccl_all_gather(cp_nccl_comm *c, const void *send, void *recv, size_t count, ncclDataType_t t,
                       cudaStream_t stream, char *err, int errlen) {
    const char *call = "ncclAllGather";
    if (check_comm(c, call, err, errlen) || check_buf(c, call, "send", send, count, t, 1, err, errlen) ||
        check_buf(c, call, "recv", recv, count, t, (size_t)c->size, err, errlen))
        return -1;
    return settle(c, api->AllGather(send, recv, count, t, c->comm, stream), call, "a peer is stuck or gone",
                  c->timeout_s, err, errlen);
}

int cp_nccl_reduce_scatter(cp_nccl_comm *c, const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, cudaStream_t stream, char *err, int errlen) {
    const char *call = "ncclReduceScatter";
    if (check_comm(c, call, err, errlen) || check_buf(c, call, "send", send, count, t, (size_t)c->size, err, errlen) ||
        check_buf(c, call, "recv", recv, count, t, 1, err, errlen))
        return -1;
    return settle(c, api->ReduceScatter(send, recv, count, t, op, c->comm, stream), call, "a peer is stuck or gone",
                  c->timeout_s, err, errlen);
}

int cp_nccl_all_reduce(cp_nccl_comm *c, const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                       cudaStream_t stream, char *err, int errlen) {
    const char *call = "ncclAllReduce";
    if (check_comm(c, call, err, errlen) || check_buf(c, call, "send", send, count, t, 1, err, errlen) ||
        check_buf(c, call, "recv", recv, count, t, 1, err, errlen))
        return -1;
    return settle(c, api->AllReduce(send, recv, count, t, op, c->comm, stream), call, "a peer is stuck or gone",
                  c->timeout_s, err, errlen);
}

static int check_peer(const cp_nccl_comm *c, const char *call, int peer, char *err, int errlen) {
    if (peer < 0 || peer >= c->size)
        return cp_errf(err, errlen, "rank %d: %s: peer %d is not a rank of this communicator (0 to %d)", c->rank, call,
                    peer, c->size - 1);
    return 0;
}

int cp_nccl_send(cp_nccl_comm *c, const void *buf, size_t count, ncclDataType_t t, int peer, cudaStream_t stream,
                 char *err, int errlen) {
    const char *call = "ncclSend";
    if (check_comm(c, call, err, errlen) || check_peer(c, call, peer, err, errlen) ||
        check_buf(c, call, "buffer", buf, count, t, 1, err, errlen))
        return -1;
    return settle(c, api->Send(buf, count, t, peer, c->comm, stream), call, "a peer is stuck or gone", c->timeout_s,
                  err, errlen);
}

int cp_nccl_recv(cp_nccl_comm *c, void *buf, size_t count, ncclDataType_t t, int peer, cudaStream_t stream,
                 char *err, int errlen) {
    const char *call = "ncclRecv";
    if (check_comm(c, call, err, errlen) || check_peer(c, call, peer, err, errlen) ||
        check_buf(c, call, "buffer", buf, count, t, 1, err, errlen))
        return -1;
    return settle(c, api->Recv(buf, count, t, peer, c->comm, stream), call, "a peer is stuck or gone", c->timeout_s,
                  err, errlen);
}

int cp_nccl_group_start(cp_nccl_comm *c, char *err, int errlen) {
    if (check_comm(c, "ncclGroupStart", err, errlen)) return -1;
    return settle(c, api->GroupStart(), "ncclGroupStart", "", c->timeout_s, err, errlen);
}

int cp_nccl_group_end(cp_nccl_comm *c, char *err, int errlen) {
    if (check_comm(c, "ncclGroupEnd", err, errlen)) return -1;
    return settle(c, api->GroupEnd(), "ncclGroupEnd", "a peer is stuck or gone", c->timeout_s, err, errlen);
}

/* send and recv, `bytes` each, must not overlap: a block would be overwritten before it is sent. */
static int check_apart(const cp_nccl_comm *c, const char *call, const void *send, const void *recv, size_t bytes,
                       char *err, int errlen) {
    uintptr_t s = (uintptr_t)send, r = (uintptr_t)recv;
    if (bytes && s < r + bytes && r < s + bytes)
        return cp_errf(err, errlen, "rank %d: %s: send and recv overlap (%zu bytes each): a block would be "
                    "overwritten before it is sent; give them separate buffers", c->rank, call, bytes);
    return 0;
}

/* The end of a group of sends and receives that cp_nccl_group_start opened: the group is closed even after a failed
 * call (q, the first that failed: `which` with `peer`), since NCCL's group depth is per thread and would stay open;
 * a failed call aborts the communicator. */
static int group_finish(cp_nccl_comm *c, const char *call, ncclResult_t q, const char *which, int peer, char *err,
                        int errlen) {
    ncclResult_t end = api->GroupEnd();
    char what[96];
    if (q != ncclSuccess && q != ncclInProgress) {
        snprintf(what, sizeof what, "%s: %s with peer %d", call, which, peer);
        int rc = nccl_fail(c, q, what, ABORTED, err, errlen);
        cp_nccl_abort(c);
        return rc;
    }
    snprintf(what, sizeof what, "%s: ncclGroupEnd", call);
    return settle(c, end, what, "a peer is stuck or gone", c->timeout_s, err, errlen);
}

/* Pairs i = 0..n-1 of a send and a receive in one NCCL group: count elements at send + i x stride bytes go to rank
 * to + i while count elements from rank from + i land at recv + i x stride. Every call is queued before any of them
 * can block; within the group NCCL runs them together, so their order does not matter and no two ranks sending to
 * each other wait in a cycle. `call` names the work in messages. */
static int grouped_pairs(cp_nccl_comm *c, const char *call, const void *send, void *recv, size_t count,
                         ncclDataType_t t, size_t stride, int n, int to, int from, cudaStream_t stream, char *err,
                         int errlen) {
    if (cp_nccl_group_start(c, err, errlen)) return -1;
    ncclResult_t first = ncclSuccess;
    const char *first_call = NULL;
    int first_peer = -1;
    for (int i = 0; i < n; i++) {
        const char *which = "ncclSend";
        int peer = to + i;
        ncclResult_t q = api->Send((const char *)send + stride * (size_t)i, count, t, peer, c->comm, stream);
        if (q == ncclSuccess || q == ncclInProgress) {
            which = "ncclRecv";
            peer = from + i;
            q = api->Recv((char *)recv + stride * (size_t)i, count, t, peer, c->comm, stream);
        }
        if (q != ncclSuccess && q != ncclInProgress) {
            first = q;
            first_call = which;
            first_peer = peer;
            break;
        }
    }
    return group_finish(c, call, first, first_call, first_peer, err, errlen);
}

int cp_nccl_all_to_all(cp_nccl_comm *c, const void *send, void *recv, size_t count, ncclDataType_t t,
                       cudaStream_t stream, char *err, int errlen) {
    const char *call = "all-to-all";
    if (check_comm(c, call, err, errlen) || check_buf(c, call, "send", send, count, t, (size_t)c->size, err, errlen) ||
        check_buf(c, call, "recv", recv, count, t, (size_t)c->size, err, errlen))
        return -1;
    if (count == 0) return 0;
    size_t block = count * cp_nccl_type_size(t);
    if (check_apart(c, call, send, recv, block * (size_t)c->size, err, errlen)) return -1;
    /* block p to and from rank p, the own block a send to self */
    return grouped_pairs(c, call, send, recv, count, t, block, c->size, 0, 0, stream, err, errlen);
}

int cp_nccl_send_recv(cp_nccl_comm *c, const void *send, int to, void *recv, int from, size_t count,
                      ncclDataType_t t, cudaStream_t stream, char *err, int errlen) {
    const char *call = "send/recv";
    if (check_comm(c, call, err, errlen) || check_peer(c, call, to, err, errlen) ||
        check_peer(c, call, from, err, errlen) || check_buf(c, call, "send", send, count, t, 1, err, errlen) ||
        check_buf(c, call, "recv", recv, count, t, 1, err, errlen))
        return -1;
    if (count == 0) return 0;
    if (check_apart(c, call, send, recv, count * cp_nccl_type_size(t), err, errlen)) return -1;
    return grouped_pairs(c, call, send, recv, count, t, 0, 1, to, from, stream, err, errlen);
}

int cp_nccl_gather(cp_nccl_comm *c, const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                   cudaStream_t stream, char *err, int errlen) {
    const char *call = "gather";
    bool at_root = c && c->rank == root;
    if (check_comm(c, call, err, errlen) || check_peer(c, call, root, err, errlen) ||
        check_buf(c, call, "send", send, count, t, 1, err, errlen) ||
        (at_root && check_buf(c, call, "recv", recv, count, t, (size_t)c->size, err, errlen)))
        return -1;
    if (count == 0) return 0;
    size_t block = count * cp_nccl_type_size(t);
    const char *own = at_root ? (const char *)recv + block * (size_t)root : NULL;
    bool in_place = own == send;
    if (at_root && !in_place && check_apart(c, call, send, own, block, err, errlen)) return -1;
    if (cp_nccl_group_start(c, err, errlen)) return -1;
    /* every rank's block to the root, the root's own a send to itself unless it is in place already; all queued
     * before any can block */
    ncclResult_t q = ncclSuccess;
    const char *which = "ncclSend";
    int peer = root;
    if (!in_place) q = api->Send(send, count, t, root, c->comm, stream);
    for (int r = 0; at_root && r < c->size && (q == ncclSuccess || q == ncclInProgress); r++) {
        if (r == root && in_place) continue;
        which = "ncclRecv", peer = r;
        q = api->Recv((char *)recv + block * (size_t)r, count, t, r, c->comm, stream);
    }
    return group_finish(c, call, q, which, peer, err, errlen);
}

/* ------------------------------------------------------------------------------------------------------------
 * the watchdog */

int cp_nccl_wait_for(cp_nccl_comm *c, int (*done)(void *ctx, char *err, int errlen), void *ctx, const char *what,
                     double timeout_s, char *err, int errlen) {
    if (!what) what = "the collective";
    if (check_comm(c, what, err, errlen)) return -1;
    if (!done) return cp_errf(err, errlen, "rank %d: waiting for %s: no completion test", c->rank, what);
    if (timeout_s <= 0) timeout_s = c->timeout_s;
    double deadline = cp_now() + timeout_s, nap = 20e-6;
    char why[1024];
    for (;;) {
        int d = done(ctx, why, sizeof why);
        if (d > 0) return 0;
        if (d < 0) {
            cp_errf(err, errlen, "rank %d: while waiting for %s: %s%s", c->rank, what, why, ABORTED);
            cp_nccl_abort(c);
            return -1;
        }
        ncclResult_t st = ncclSuccess, q = api->CommGetAsyncError(c->comm, &st);
        if (q != ncclSuccess || (st != ncclSuccess && st != ncclInProgress)) {
            char call[160];
            snprintf(call, sizeof call, "%s while waiting for %s", q != ncclSuccess ? "ncclCommGetAsyncError" :
                     "NCCL reported an error", what);
            int rc = nccl_fail(c, q != ncclSuccess ? q : st, call, ABORTED, err, errlen);
            cp_nccl_abort(c);
            return rc;
        }
        if (stopped(c, what, err, errlen)) return -1;
        if (cp_now() >= deadline) {
            char note[1100];
            peer_note(note, sizeof note);
            cp_errf(err, errlen, "rank %d: %s did not finish within %.3g s: a peer is stuck or gone (its output may say "
                 "why); NCCL_DEBUG=INFO shows what NCCL waits for%s%s", c->rank, what, timeout_s, note, ABORTED);
            cp_nccl_abort(c);
            return -1;
        }
        sleep_s(nap);
        nap = nap * 2 < 1e-3 ? nap * 2 : 1e-3;
    }
}

typedef struct {
    cudaStream_t stream;
    cudaEvent_t event;
} cuda_work;

static int cuda_done(void *ctx, char *err, int errlen) {
    const cuda_work *w = ctx;
    cudaError_t e = w->event ? cudaEventQuery(w->event) : cudaStreamQuery(w->stream);
    if (e == cudaSuccess) return 1;
    if (e == cudaErrorNotReady) return 0;
    return cp_cuda_errmsg(e, w->event ? "cudaEventQuery" : "cudaStreamQuery", err, errlen);
}

int cp_nccl_wait(cp_nccl_comm *c, cudaStream_t stream, cudaEvent_t event, const char *what, double timeout_s,
                 char *err, int errlen) {
    cuda_work w = {stream, event};
    return cp_nccl_wait_for(c, cuda_done, &w, what, timeout_s, err, errlen);
}
