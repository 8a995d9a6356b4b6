/* test_nccl.c: the NCCL layer without a GPU. Loading: a missing library and a library that is not NCCL give
 * messages saying what to install; the real libnccl.so.2 is loaded when the machine has one. The rest runs on a
 * fake function table (cp_nccl_use_api): non-blocking initialisation settled by polling, its timeout and
 * asynchronous errors (the communicator aborted), the blocking fallback, argument checks, error messages naming
 * the rank, the call and the fix, the all-to-all's and the ring send/recv's grouped sends and receives (group
 * closed even after a failed send), the watchdog's completion, timeout and error paths, destroy, and the split into
 * a run's group communicators. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_rt.h"
#include "util.h"

static char err[2048];

static bool contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }
#define assert_contains(hay, needle)                                                                                \
    do {                                                                                                           \
        if (!contains(hay, needle)) fail_msg("expected \"%s\" in: %s", needle, hay);                              \
    } while (0)

/* ------------------------------------------------------------------------------------------------------------
 * the fake library */

typedef struct {
    char op; /* 's' send, 'r' recv */
    int peer;
    ptrdiff_t off;
    size_t count;
} p2p_call;

static struct {
    int async_polls;          /* how many more times ncclCommGetAsyncError says ncclInProgress */
    ncclResult_t async_final; /* and what it says after that */
    ncclResult_t init_rc, coll_rc;
    int fail_send_peer;
    int blocking_seen, config_inits, plain_inits;
    int splits, split_color, split_key, split_blocking; /* the last ncclCommSplit's arguments */
    ncclResult_t split_rc;
    /* A non-blocking split in progress, as NCCL 2.28 runs it: ncclCommSplit returns split_rc (ncclSuccess, as the
     * real one does, or ncclInProgress) at once, the new handle stays NULL and the parent reports ncclInProgress
     * for split_polls more polls; then the handle is written through split_out (NCCL's own thread does this after
     * ncclCommSplit has returned). Meanwhile NCCL refuses any call on the parent (busy_calls). */
    ncclComm_t *split_out;
    int split_polls, busy_calls;
    int aborts, finalizes, destroys, group_depth, group_starts, group_ends;
    const void *send_base;
    const void *recv_base;
    p2p_call calls[64];
    int ncalls;
} F;

#define FAKE_COMM ((ncclComm_t)(uintptr_t)0x1000)

static ncclResult_t f_version(int *v) { return *v = 22809, ncclSuccess; }
static ncclResult_t f_unique_id(ncclUniqueId *id) { return memset(id, 7, sizeof *id), ncclSuccess; }
static ncclResult_t f_init_config(ncclComm_t *c, int n, ncclUniqueId id, int rank, ncclConfig_t *cfg) {
    (void)n, (void)id, (void)rank;
    F.config_inits++;
    F.blocking_seen = cfg->blocking;
    *c = FAKE_COMM;
    return F.init_rc;
}
static ncclResult_t f_init(ncclComm_t *c, int n, ncclUniqueId id, int rank) {
    (void)n, (void)id, (void)rank;
    F.plain_inits++;
    *c = FAKE_COMM;
    return F.init_rc;
}
#define FAKE_SPLIT_COMM ((ncclComm_t)(uintptr_t)0x2000)
/* NCCL's ncclCommEnsureReady: a call on a parent whose split is still running is refused. */
static bool busy(ncclComm_t c) {
    if (c != FAKE_COMM || !F.split_out) return false;
    F.busy_calls++;
    return true;
}
static ncclResult_t f_split(ncclComm_t c, int color, int key, ncclComm_t *out, ncclConfig_t *cfg) {
    if (!c) return ncclInvalidArgument;
    if (busy(c)) return ncclInvalidArgument;
    F.splits++;
    F.split_color = color;
    F.split_key = key;
    F.split_blocking = cfg ? cfg->blocking : 1;
    *out = NULL; /* NCCL_COMM_NULL until the split is done */
    if (F.split_rc != ncclSuccess && F.split_rc != ncclInProgress) return F.split_rc; /* refused at the call */
    if (cfg && !cfg->blocking) F.split_out = out; /* finished later, whatever the call returned */
    else *out = FAKE_SPLIT_COMM;
    return F.split_rc;
}
static ncclResult_t f_finalize(ncclComm_t c) { return (void)c, F.finalizes++, ncclSuccess; }
static ncclResult_t f_destroy(ncclComm_t c) { return (void)c, F.destroys++, ncclSuccess; }
static ncclResult_t f_abort(ncclComm_t c) {
    if (c == FAKE_COMM) F.split_out = NULL; /* the split is abandoned */
    return F.aborts++, ncclSuccess;
}
static ncclResult_t f_async(ncclComm_t c, ncclResult_t *st) {
    if (!c) return ncclInvalidArgument; /* NCCL's CommCheck */
    if (c == FAKE_COMM && F.split_out) {
        if (F.split_polls > 0) {
            F.split_polls--;
            *st = ncclInProgress;
        } else {
            *F.split_out = FAKE_SPLIT_COMM;
            F.split_out = NULL;
            *st = ncclSuccess;
        }
        return ncclSuccess;
    }
    if (F.async_polls > 0) {
        F.async_polls--;
        *st = ncclInProgress;
    } else {
        *st = F.async_final;
    }
    return ncclSuccess;
}
static ncclResult_t f_all_gather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t c, cudaStream_t st) {
    return (void)s, (void)r, (void)n, (void)t, (void)st, busy(c) ? ncclInvalidArgument : F.coll_rc;
}
static ncclResult_t f_reduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op, ncclComm_t c,
                             cudaStream_t st) {
    return (void)s, (void)r, (void)n, (void)t, (void)op, (void)st, busy(c) ? ncclInvalidArgument : F.coll_rc;
}
static ncclResult_t f_send(const void *b, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    (void)t, (void)c, (void)st;
    if (F.ncalls < 64) F.calls[F.ncalls++] = (p2p_call){'s', peer, (const char *)b - (const char *)F.send_base, n};
    return peer == F.fail_send_peer ? ncclInternalError : F.coll_rc;
}
static ncclResult_t f_recv(void *b, size_t n, ncclDataType_t t, int peer, ncclComm_t c, cudaStream_t st) {
    (void)t, (void)c, (void)st;
    if (F.ncalls < 64) F.calls[F.ncalls++] = (p2p_call){'r', peer, (const char *)b - (const char *)F.recv_base, n};
    return F.coll_rc;
}
static ncclResult_t f_group_start(void) { return F.group_depth++, F.group_starts++, ncclSuccess; }
static ncclResult_t f_group_end(void) { return F.group_depth--, F.group_ends++, ncclSuccess; }
static const char *f_error_string(ncclResult_t r) {
    static char buf[64];
    snprintf(buf, sizeof buf, "fake text for %d", (int)r);
    return buf;
}
static const char *f_last_error(ncclComm_t c) { return (void)c, "fake last error"; }

static cp_nccl_api fake = {
    .GetVersion = f_version, .GetUniqueId = f_unique_id, .CommInitRank = f_init, .CommInitRankConfig = f_init_config,
    .CommFinalize = f_finalize, .CommSplit = f_split, .CommDestroy = f_destroy, .CommAbort = f_abort, .CommGetAsyncError = f_async,
    .AllGather = f_all_gather, .ReduceScatter = f_reduce, .AllReduce = f_reduce, .Send = f_send, .Recv = f_recv,
    .GroupStart = f_group_start, .GroupEnd = f_group_end, .GetErrorString = f_error_string,
    .GetLastError = f_last_error,
};

static int use_fake(void **state) {
    (void)state;
    memset(&F, 0, sizeof F);
    F.fail_send_peer = -1;
    cp_nccl_use_api(&fake, 22809);
    return 0;
}

static int forget(void **state) {
    (void)state;
    cp_nccl_use_api(NULL, 0);
    return 0;
}

/* A communicator of rank 1 of `size`, initialised on the fake. */
static cp_nccl_comm comm_of(int size) {
    cp_nccl_comm c;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (cp_nccl_init(&c, 1, size, &id, 5.0, err, sizeof err)) fail_msg("init: %s", err);
    return c;
}

/* ------------------------------------------------------------------------------------------------------------
 * loading */

static void test_load_missing(void **state) {
    (void)state;
    assert_int_equal(cp_nccl_load("libnccl-missing-for-test.so.2", err, sizeof err), -1);
    assert_contains(err, "cannot load libnccl-missing-for-test.so.2 (");
    assert_contains(err, "NCCL is needed only when parallel.gpus > 1");
    assert_contains(err, "apt install libnccl2");
    assert_contains(err, "pip install nvidia-nccl-cu13");
    assert_null(cp_nccl_api_get());
    assert_int_equal(cp_nccl_version(), 0);
}

static void test_load_not_nccl(void **state) {
    (void)state;
    assert_int_equal(cp_nccl_load("libm.so.6", err, sizeof err), -1);
    assert_contains(err, "libm.so.6 has no ncclGetVersion: it is not NCCL");
    assert_null(cp_nccl_api_get());
}

static void test_load_real(void **state) {
    (void)state;
    unsetenv("NCCL_NVLS_ENABLE");
    if (cp_nccl_load(NULL, err, sizeof err)) {
        /* No NCCL on this machine: the message is the one a user would see. */
        assert_contains(err, "cannot load libnccl.so.2");
        skip();
    }
    const cp_nccl_api *a = cp_nccl_api_get();
    assert_non_null(a);
    assert_non_null(a->AllGather);
    assert_non_null(a->GroupEnd);
    char v[32];
    cp_nccl_version_str(cp_nccl_version(), v, sizeof v);
    assert_true(cp_nccl_version() >= 20700);
    assert_string_equal(getenv("NCCL_NVLS_ENABLE"), "0");
    assert_int_equal(cp_nccl_load(NULL, err, sizeof err), 0); /* once is enough */
    print_message("loaded NCCL %s\n", v);
}

static void test_versions_and_types(void **state) {
    (void)state;
    char v[32];
    cp_nccl_version_str(22809, v, sizeof v);
    assert_string_equal(v, "2.28.9");
    cp_nccl_version_str(2804, v, sizeof v);
    assert_string_equal(v, "2.8.4");
    assert_int_equal(cp_nccl_type_size(ncclBfloat16), 2);
    assert_int_equal(cp_nccl_type_size(ncclFloat32), 4);
    assert_int_equal(cp_nccl_type_size(ncclInt64), 8);
    assert_int_equal(cp_nccl_type_size(ncclFloat8e4m3), 1);
    assert_int_equal(cp_nccl_type_size(ncclNumTypes), 0);
}

/* ------------------------------------------------------------------------------------------------------------
 * communicators */

static void test_init_nonblocking(void **state) {
    (void)state;
    F.init_rc = ncclInProgress;
    F.async_polls = 3;
    cp_nccl_comm c = comm_of(2);
    assert_true(c.nonblocking);
    assert_int_equal(F.blocking_seen, 0);
    assert_int_equal(F.config_inits, 1);
    assert_int_equal(F.async_polls, 0);
    assert_ptr_equal(c.comm, FAKE_COMM);
    ncclUniqueId id;
    assert_int_equal(cp_nccl_unique_id(&id, err, sizeof err), 0);
    assert_int_equal(id.internal[5], 7);
}

static void test_init_timeout(void **state) {
    (void)state;
    F.init_rc = ncclInProgress;
    F.async_polls = INT_MAX; /* a rank that never arrives */
    cp_nccl_comm c;
    ncclUniqueId id = {{0}};
    double t0 = cp_now();
    assert_int_equal(cp_nccl_init(&c, 1, 2, &id, 0.2, err, sizeof err), -1);
    assert_true(cp_now() - t0 < 2.0);
    assert_contains(err, "rank 1: NCCL initialisation of 2 ranks did not finish within 0.2 s: a rank did not reach it");
    assert_contains(err, "the communicator was aborted");
    assert_int_equal(F.aborts, 1);
    assert_true(c.aborted);
    assert_null(c.comm);
    /* What is left is destroy, which has nothing to free. */
    assert_int_equal(cp_nccl_all_reduce(&c, err, err, 1, ncclInt8, ncclSum, NULL, err, sizeof err), -1);
    assert_contains(err, "the communicator was aborted after an earlier error");
    assert_int_equal(cp_nccl_destroy(&c, err, sizeof err), 0);
    assert_int_equal(F.destroys, 0);
}

static void test_init_async_error(void **state) {
    (void)state;
    F.init_rc = ncclInProgress;
    F.async_polls = 1;
    F.async_final = ncclSystemError;
    cp_nccl_comm c;
    ncclUniqueId id = {{0}};
    assert_int_equal(cp_nccl_init(&c, 1, 4, &id, 5, err, sizeof err), -1);
    assert_contains(err, "rank 1: NCCL initialisation of 4 ranks: ncclSystemError (fake text for 2); NCCL says: fake "
                         "last error; a system call failed");
    assert_contains(err, "/dev/shm");
    assert_int_equal(F.aborts, 1);
}

static void test_init_blocking_fallback(void **state) {
    (void)state;
    cp_nccl_api old = fake;
    fake.CommInitRankConfig = NULL; /* NCCL before 2.14 */
    fake.CommFinalize = NULL;
    cp_nccl_comm c = comm_of(2);
    assert_false(c.nonblocking);
    assert_int_equal(F.plain_inits, 1);
    assert_int_equal(cp_nccl_destroy(&c, err, sizeof err), 0);
    assert_int_equal(F.destroys, 1);
    assert_int_equal(F.finalizes, 0);
    fake = old;
}

/* A run of several groups splits the run's communicator: the colour and rank within it reach ncclCommSplit as
 * given, non-blocking like the parent and settled by polling; the new communicator has the group's size. */
static void test_split(void **state) {
    (void)state;
    cp_nccl_comm world = comm_of(8);
    F.split_rc = ncclInProgress;
    F.async_polls = 2;
    cp_nccl_comm shard;
    assert_int_equal(cp_nccl_split(&world, 3, 1, 2, "shard", &shard, err, sizeof err), 0);
    assert_int_equal(F.splits, 1);
    assert_int_equal(F.split_color, 3);
    assert_int_equal(F.split_key, 1);
    assert_int_equal(F.split_blocking, 0);
    assert_int_equal(F.async_polls, 0);
    assert_ptr_equal(shard.comm, FAKE_SPLIT_COMM);
    assert_int_equal(shard.rank, 1);
    assert_int_equal(shard.size, 2);
    assert_true(shard.nonblocking);
    assert_true(shard.timeout_s == world.timeout_s);
    /* collectives go to the new communicator's handle */
    assert_int_equal(cp_nccl_all_reduce(&shard, err, err, 1, ncclInt8, ncclSum, NULL, err, sizeof err), 0);
    assert_int_equal(cp_nccl_destroy(&shard, err, sizeof err), 0);
    assert_int_equal(F.destroys, 1);
    assert_ptr_equal(world.comm, FAKE_COMM); /* the parent stays */
}

/* NCCL's non-blocking split returns ncclSuccess at once with no handle (2.28's ncclCommSplit passes on the group's
 * ncclInProgress as success), writes the handle from its own thread when the split is done, and refuses the parent
 * until then. The splits a layout makes one after another (Ulysses group, then ring, then shard) each wait for that,
 * so the next finds the parent free and every handle is there. */
static void test_split_late(void **state) {
    (void)state;
    cp_nccl_comm world = comm_of(8), group, ring;
    F.split_rc = ncclSuccess;
    F.split_polls = 3;
    assert_int_equal(cp_nccl_split(&world, 0, 1, 4, "ulysses", &group, err, sizeof err), 0);
    assert_ptr_equal(group.comm, FAKE_SPLIT_COMM);
    assert_int_equal(F.split_polls, 0);
    F.split_polls = 2;
    assert_int_equal(cp_nccl_split(&world, 1, 0, 2, "ring", &ring, err, sizeof err), 0);
    assert_ptr_equal(ring.comm, FAKE_SPLIT_COMM);
    assert_int_equal(F.splits, 2);
    assert_int_equal(F.busy_calls, 0);
    assert_int_equal(cp_nccl_all_reduce(&world, err, err, 1, ncclInt8, ncclSum, NULL, err, sizeof err), 0);
    assert_int_equal(F.busy_calls, 0);
    assert_false(world.aborted);
    /* a split that never finishes ends at the parent's deadline, the parent aborted, with the split named */
    world.timeout_s = 0.05;
    F.split_polls = 1 << 30;
    cp_nccl_comm shard;
    assert_int_equal(cp_nccl_split(&world, 2, 0, 2, "shard", &shard, err, sizeof err), -1);
    assert_contains(err, "ncclCommSplit into the shard communicator (colour 2, 2 ranks) did not finish within");
    assert_true(world.aborted);
    assert_null(shard.comm);
}

/* A library before 2.18 has no ncclCommSplit: the message names the version to install; a place outside the group
 * is a bug caught before NCCL; a failed split aborts the parent, so the other ranks do not wait in it. */
static void test_split_errors(void **state) {
    (void)state;
    cp_nccl_comm world = comm_of(4), c;
    assert_int_equal(cp_nccl_split(&world, 0, 2, 2, "shard", &c, err, sizeof err), -1);
    assert_contains(err, "rank 1: splitting the shard communicator: colour 0, rank 2 of 2 is not a valid place");
    assert_int_equal(F.splits, 0);
    cp_nccl_api old = fake;
    fake.CommSplit = NULL;
    assert_int_equal(cp_nccl_split(&world, 0, 0, 2, "shard", &c, err, sizeof err), -1);
    assert_contains(err, "rank 1: the shard communicator needs ncclCommSplit, which NCCL 2.28.9 lacks: runs of several "
                         "groups (parallel.replicas, parallel.ring) need NCCL 2.18 or newer");
    fake = old;
    F.split_rc = ncclInvalidUsage;
    assert_int_equal(cp_nccl_split(&world, 1, 0, 2, "ulysses", &c, err, sizeof err), -1);
    assert_contains(err, "ncclCommSplit into the ulysses communicator (colour 1, 2 ranks): ncclInvalidUsage");
    assert_true(world.aborted);
    assert_int_equal(F.aborts, 1);
    assert_null(c.comm);
}

static void test_destroy(void **state) {
    (void)state;
    cp_nccl_comm c = comm_of(2);
    assert_int_equal(cp_nccl_destroy(&c, err, sizeof err), 0);
    assert_int_equal(F.finalizes, 1);
    assert_int_equal(F.destroys, 1);
    assert_null(c.comm);
    assert_int_equal(cp_nccl_destroy(&c, err, sizeof err), 0); /* twice is harmless */
    assert_int_equal(F.destroys, 1);
}

/* ------------------------------------------------------------------------------------------------------------
 * collectives */

static void test_bad_arguments(void **state) {
    (void)state;
    cp_nccl_comm c;
    ncclUniqueId id = {{0}};
    float a[64], b[64];
    assert_int_equal(cp_nccl_init(&c, 2, 2, &id, 1, err, sizeof err), -1);
    assert_contains(err, "rank 2 of 2 is not a valid rank");
    memset(&c, 0, sizeof c);
    c.rank = 3;
    assert_int_equal(cp_nccl_all_gather(&c, a, b, 4, ncclFloat32, NULL, err, sizeof err), -1);
    assert_contains(err, "rank 3: ncclAllGather: the communicator is not initialised");
    assert_int_equal(cp_nccl_all_gather(NULL, a, b, 4, ncclFloat32, NULL, err, sizeof err), -1);
    assert_contains(err, "ncclAllGather: no communicator");
    c = comm_of(4);
    assert_int_equal(cp_nccl_all_gather(&c, NULL, b, 16, ncclFloat32, NULL, err, sizeof err), -1);
    assert_contains(err, "rank 1: ncclAllGather: send is NULL for 16 elements");
    assert_int_equal(cp_nccl_reduce_scatter(&c, a, b, 4, ncclNumTypes, ncclSum, NULL, err, sizeof err), -1);
    assert_contains(err, "rank 1: ncclReduceScatter: data type 12 is not one cpgen knows");
    assert_int_equal(cp_nccl_all_reduce(&c, a, b, SIZE_MAX / 2, ncclFloat32, ncclSum, NULL, err, sizeof err), -1);
    assert_contains(err, "overflow the address space");
    assert_int_equal(cp_nccl_send(&c, a, 4, ncclFloat32, 5, NULL, err, sizeof err), -1);
    assert_contains(err, "rank 1: ncclSend: peer 5 is not a rank of this communicator (0 to 3)");
    assert_int_equal(cp_nccl_recv(&c, b, 4, ncclFloat32, -1, NULL, err, sizeof err), -1);
    assert_contains(err, "peer -1 is not a rank");
    /* 4 ranks x 8 floats from a, into a + 4: the blocks overlap. */
    assert_int_equal(cp_nccl_all_to_all(&c, a, a + 4, 8, ncclFloat32, NULL, err, sizeof err), -1);
    assert_contains(err, "rank 1: all-to-all: send and recv overlap (128 bytes each)");
    assert_int_equal(F.ncalls, 0);
    assert_int_equal(F.aborts, 0); /* caught before NCCL saw anything */
    cp_nccl_use_api(NULL, 0);
    assert_int_equal(cp_nccl_all_gather(&c, a, b, 4, ncclFloat32, NULL, err, sizeof err), -1);
    assert_contains(err, "ncclAllGather: NCCL is not loaded");
}

static void test_collective_error(void **state) {
    (void)state;
    cp_nccl_comm c = comm_of(2);
    float a[8], b[8];
    assert_int_equal(cp_nccl_all_gather(&c, a, b, 4, ncclFloat32, NULL, err, sizeof err), 0);
    F.coll_rc = ncclRemoteError;
    assert_int_equal(cp_nccl_all_reduce(&c, a, b, 8, ncclFloat32, ncclSum, NULL, err, sizeof err), -1);
    assert_contains(err, "rank 1: ncclAllReduce: ncclRemoteError (fake text for 6); NCCL says: fake last error; "
                         "another rank failed or exited");
    assert_contains(err, "the communicator was aborted");
    assert_int_equal(F.aborts, 1);
    assert_true(c.aborted);
}

static void test_collective_in_progress(void **state) {
    (void)state;
    cp_nccl_comm c = comm_of(2);
    float a[8], b[8];
    /* A non-blocking communicator may return before the call is enqueued; the wrapper waits for it. */
    F.coll_rc = ncclInProgress;
    F.async_polls = 2;
    assert_int_equal(cp_nccl_reduce_scatter(&c, a, b, 4, ncclFloat32, ncclSum, NULL, err, sizeof err), 0);
    assert_int_equal(F.async_polls, 0);
}

static void test_all_to_all(void **state) {
    (void)state;
    cp_nccl_comm c = comm_of(4);
    uint16_t send[4 * 3], recv[4 * 3];
    F.send_base = send;
    F.recv_base = recv;
    assert_int_equal(cp_nccl_all_to_all(&c, send, recv, 3, ncclBfloat16, NULL, err, sizeof err), 0);
    assert_int_equal(F.group_starts, 1);
    assert_int_equal(F.group_ends, 1);
    assert_int_equal(F.group_depth, 0);
    assert_int_equal(F.ncalls, 8);
    int sends[4] = {0}, recvs[4] = {0};
    for (int k = 0; k < F.ncalls; k++) {
        p2p_call *q = &F.calls[k];
        assert_int_equal(q->count, 3);
        assert_int_equal(q->off, (ptrdiff_t)(q->peer * 3 * 2)); /* block p at p * count elements */
        (q->op == 's' ? sends : recvs)[q->peer]++;
    }
    for (int p = 0; p < 4; p++) {
        assert_int_equal(sends[p], 1);
        assert_int_equal(recvs[p], 1);
    }
    F.ncalls = 0;
    assert_int_equal(cp_nccl_all_to_all(&c, send, recv, 0, ncclBfloat16, NULL, err, sizeof err), 0);
    assert_int_equal(F.ncalls, 0);
}

static void test_all_to_all_send_fails(void **state) {
    (void)state;
    cp_nccl_comm c = comm_of(4);
    float send[16], recv[16];
    F.send_base = send;
    F.recv_base = recv;
    F.fail_send_peer = 2;
    assert_int_equal(cp_nccl_all_to_all(&c, send, recv, 4, ncclFloat32, NULL, err, sizeof err), -1);
    assert_contains(err, "rank 1: all-to-all: ncclSend with peer 2: ncclInternalError");
    assert_int_equal(F.group_depth, 0); /* the group was closed all the same */
    assert_int_equal(F.aborts, 1);
}

/* A ring's send/recv: one group of a send to the next rank and a receive from the previous one (here rank 1 of 4:
 * to 2, from 0), whole buffers; in a ring of 2 both are the same peer. Bad peers and overlapping buffers are caught
 * before NCCL sees anything; a failed send still closes the group and aborts the communicator. */
static void test_send_recv(void **state) {
    (void)state;
    cp_nccl_comm c = comm_of(4);
    float send[8], recv[8];
    F.send_base = send;
    F.recv_base = recv;
    assert_int_equal(cp_nccl_send_recv(&c, send, 2, recv, 0, 8, ncclFloat32, NULL, err, sizeof err), 0);
    assert_int_equal(F.group_starts, 1);
    assert_int_equal(F.group_ends, 1);
    assert_int_equal(F.group_depth, 0);
    assert_int_equal(F.ncalls, 2);
    assert_true(F.calls[0].op == 's' && F.calls[0].peer == 2 && F.calls[0].off == 0 && F.calls[0].count == 8);
    assert_true(F.calls[1].op == 'r' && F.calls[1].peer == 0 && F.calls[1].off == 0 && F.calls[1].count == 8);
    F.ncalls = 0;
    assert_int_equal(cp_nccl_send_recv(&c, send, 0, recv, 0, 8, ncclFloat32, NULL, err, sizeof err), 0);
    assert_true(F.ncalls == 2 && F.calls[0].peer == 0 && F.calls[1].peer == 0);
    F.ncalls = 0;
    assert_int_equal(cp_nccl_send_recv(&c, send, 2, recv, 0, 0, ncclFloat32, NULL, err, sizeof err), 0);
    assert_int_equal(F.ncalls, 0);
    assert_int_equal(cp_nccl_send_recv(&c, send, 4, recv, 0, 8, ncclFloat32, NULL, err, sizeof err), -1);
    assert_contains(err, "rank 1: send/recv: peer 4 is not a rank of this communicator (0 to 3)");
    assert_int_equal(cp_nccl_send_recv(&c, send, 2, send + 4, 0, 8, ncclFloat32, NULL, err, sizeof err), -1);
    assert_contains(err, "rank 1: send/recv: send and recv overlap (32 bytes each)");
    assert_int_equal(F.ncalls, 0);
    assert_int_equal(F.aborts, 0);
    F.fail_send_peer = 2;
    assert_int_equal(cp_nccl_send_recv(&c, send, 2, recv, 0, 8, ncclFloat32, NULL, err, sizeof err), -1);
    assert_contains(err, "rank 1: send/recv: ncclSend with peer 2: ncclInternalError");
    assert_contains(err, "the communicator was aborted");
    assert_int_equal(F.group_depth, 0);
    assert_int_equal(F.aborts, 1);
}

/* A gather to a root (a checkpoint's model to the rank that writes it), seen from rank 1 of 4. As the root: a send
 * to itself and a receive from every rank at rank x count, in one group; in place (its send is its own block) no
 * message to itself. Not the root: one send, nothing received (recv may be NULL). A failed call closes the group. */
static void test_gather(void **state) {
    (void)state;
    cp_nccl_comm c = comm_of(4);
    float send[3], recv[4 * 3];
    F.send_base = send;
    F.recv_base = recv;
    assert_int_equal(cp_nccl_gather(&c, send, recv, 3, ncclFloat32, 1, NULL, err, sizeof err), 0);
    assert_int_equal(F.ncalls, 5);
    assert_true(F.calls[0].op == 's' && F.calls[0].peer == 1 && F.calls[0].off == 0 && F.calls[0].count == 3);
    for (int r = 0; r < 4; r++)
        assert_true(F.calls[1 + r].op == 'r' && F.calls[1 + r].peer == r &&
                    F.calls[1 + r].off == (ptrdiff_t)(r * 3 * sizeof(float)) && F.calls[1 + r].count == 3);
    assert_true(F.group_starts == 1 && F.group_ends == 1 && F.group_depth == 0);
    F.ncalls = 0;
    F.send_base = recv;
    assert_int_equal(cp_nccl_gather(&c, recv + 3, recv, 3, ncclFloat32, 1, NULL, err, sizeof err), 0);
    assert_int_equal(F.ncalls, 3);
    for (int k = 0; k < 3; k++) assert_true(F.calls[k].op == 'r' && F.calls[k].peer != 1);
    F.ncalls = 0;
    F.send_base = send;
    assert_int_equal(cp_nccl_gather(&c, send, NULL, 3, ncclFloat32, 0, NULL, err, sizeof err), 0);
    assert_int_equal(F.ncalls, 1);
    assert_true(F.calls[0].op == 's' && F.calls[0].peer == 0 && F.calls[0].count == 3);
    F.ncalls = 0;
    assert_int_equal(cp_nccl_gather(&c, recv + 4, recv, 3, ncclFloat32, 1, NULL, err, sizeof err), -1);
    assert_contains(err, "rank 1: gather: send and recv overlap");
    assert_int_equal(cp_nccl_gather(&c, send, NULL, 3, ncclFloat32, 1, NULL, err, sizeof err), -1);
    assert_contains(err, "rank 1: gather:");
    assert_int_equal(cp_nccl_gather(&c, send, recv, 3, ncclFloat32, 4, NULL, err, sizeof err), -1);
    assert_contains(err, "peer 4 is not a rank of this communicator");
    assert_int_equal(F.ncalls, 0);
    F.fail_send_peer = 0;
    assert_int_equal(cp_nccl_gather(&c, send, NULL, 3, ncclFloat32, 0, NULL, err, sizeof err), -1);
    assert_contains(err, "rank 1: gather: ncclSend with peer 0: ncclInternalError");
    assert_int_equal(F.group_depth, 0);
    assert_int_equal(F.aborts, 1);
}

/* ------------------------------------------------------------------------------------------------------------
 * the watchdog */

static int done_after(void *ctx, char *e, int n) {
    (void)e, (void)n;
    int *left = ctx;
    return --*left <= 0;
}

static int cuda_failed(void *ctx, char *e, int n) {
    (void)ctx;
    snprintf(e, (size_t)n, "cudaEventQuery: cudaErrorIllegalAddress (an illegal memory access)");
    return -1;
}

static void test_wait_completes(void **state) {
    (void)state;
    cp_nccl_comm c = comm_of(2);
    int left = 3;
    assert_int_equal(cp_nccl_wait_for(&c, done_after, &left, "the all-to-all", 5, err, sizeof err), 0);
    assert_int_equal(left, 0);
    assert_int_equal(F.aborts, 0);
}

static void test_wait_timeout(void **state) {
    (void)state;
    cp_nccl_comm c = comm_of(2);
    int left = INT_MAX;
    double t0 = cp_now();
    assert_int_equal(cp_nccl_wait_for(&c, done_after, &left, "the step's all-to-all", 0.1, err, sizeof err), -1);
    assert_true(cp_now() - t0 < 2.0);
    assert_contains(err, "rank 1: the step's all-to-all did not finish within 0.1 s: a peer is stuck or gone");
    assert_contains(err, "the communicator was aborted");
    assert_int_equal(F.aborts, 1);
    assert_true(c.aborted);
}

static void test_wait_async_error(void **state) {
    (void)state;
    cp_nccl_comm c = comm_of(2);
    int left = INT_MAX;
    F.async_polls = 5;
    F.async_final = ncclRemoteError; /* a peer died while this rank waits */
    assert_int_equal(cp_nccl_wait_for(&c, done_after, &left, "the all-gather of layer 3", 5, err, sizeof err), -1);
    assert_contains(err, "rank 1: NCCL reported an error while waiting for the all-gather of layer 3: ncclRemoteError");
    assert_contains(err, "another rank failed or exited");
    assert_int_equal(F.aborts, 1);
}

static void test_wait_cuda_error(void **state) {
    (void)state;
    cp_nccl_comm c = comm_of(2);
    assert_int_equal(cp_nccl_wait_for(&c, cuda_failed, NULL, "the step", 5, err, sizeof err), -1);
    assert_contains(err, "rank 1: while waiting for the step: cudaEventQuery: cudaErrorIllegalAddress");
    assert_int_equal(F.aborts, 1);
}

static void test_wait_stream(void **state) {
    (void)state;
    /* The real CUDA query: without a GPU it fails at once and the message names the call; with one, the idle
     * default stream is done. Either way nothing hangs. */
    cp_nccl_comm c = comm_of(2);
    int rc = cp_nccl_wait(&c, NULL, NULL, "the step", 2, err, sizeof err);
    if (rc) assert_contains(err, "rank 1: while waiting for the step: cudaStreamQuery: ");
    print_message("cp_nccl_wait on the default stream: %s\n", rc ? err : "done");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_load_missing, forget),
        cmocka_unit_test_setup(test_load_not_nccl, forget),
        cmocka_unit_test_setup_teardown(test_load_real, forget, forget),
        cmocka_unit_test(test_versions_and_types),
        cmocka_unit_test_setup_teardown(test_init_nonblocking, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_init_timeout, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_init_async_error, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_init_blocking_fallback, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_split, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_split_late, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_split_errors, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_destroy, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_bad_arguments, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_collective_error, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_collective_in_progress, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_all_to_all, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_all_to_all_send_fails, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_send_recv, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_gather, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_wait_completes, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_wait_timeout, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_wait_async_error, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_wait_cuda_error, use_fake, forget),
        cmocka_unit_test_setup_teardown(test_wait_stream, use_fake, forget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
