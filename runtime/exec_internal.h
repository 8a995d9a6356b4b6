/* exec_internal.h: what the executor's files share (runtime/exec*.c): the prepared step, the executor's state, and
 * the functions one file gives another. Not for use outside the executor; its interface is exec.h. */
#ifndef CP_EXEC_INTERNAL_H
#define CP_EXEC_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "exec.h"
#include "gemm.h"
#include "module.h"
#include "profile.h"
#include "tma.h"
#include "trace.h"


#define MAXARGS CP_EXEC_MAXARGS
#define PIN_PIECE ((int64_t)8 << 30) /* pinned host allocations are at most 8 GiB each, made in parallel */
#define PROGRESS_AFTER 3.0           /* seconds: steps expected to run longer report progress */

enum { X_NONE, X_KERNEL, X_GEMM, X_MEMSET, X_COPY, X_LOAD_TOKENS, X_HOST_ADAMW, X_COLL };
enum { S_PLAIN, S_ADAMW };

typedef struct {
    cudaKernel_t k;
    cp_kdims d;
    int nargs;
    void *args[MAXARGS];
    uint64_t val[MAXARGS]; /* storage of the arguments that do not change */
    cp_tmap *tmaps;        /* the tensor maps among the arguments (Hopper kernels), owned; else NULL */
} xlaunch;

typedef struct {
    int kind, special, stream;
    int nl;
    xlaunch L[2];
    int gemm;
    const void *ga, *gb, *gc;
    void *gd;
    const float *gsa, *gsb; /* an FP8 GEMM's input scales, else NULL */
    void *dst;
    const void *src;
    size_t bytes;
    size_t count;         /* X_COLL: elements per rank (all-to-all: to each peer) */
    ncclDataType_t dtype; /* X_COLL */
    int to, from;         /* a ring's send/recv: the ring communicator's ranks it sends to and receives from */
    int wait0, nwait; /* into ex->waits: events of other streams to wait for */
    int event;        /* recorded after the step when another stream waits for it, else -1 */
    int marker;       /* progress marker recorded before the step, or -1 */
} xstep;

typedef struct {
    int64_t start, end; /* arena bytes */
    void *p;
    double seconds;
    cudaError_t e;
    int dev;
} hpiece;

typedef struct {
    int step;        /* step index of the marker */
    double before;   /* predicted seconds of the program before it */
    char label[48];
} marker;

/* Scalars the kernels read by pointer at each launch. */
typedef struct {
    float loss_scale, lr, beta1, beta2, eps, wd, grad_scale;
    int adam_step;
} scalars;

struct cp_exec {
    const cp_plan *P;
    cp_exec_opts o;
    cp_exec_startup info;
    int dev;
    char *gpu;      /* the arena */
    int npieces;
    hpiece *pieces; /* the host arena */
    void **bufptr;  /* per buffer: its address (NULL for a buffer of 0 bytes) */
    cp_module *mods;
    int nmods;
    cudaStream_t streams[CP_STREAM_COUNT];
    cudaEvent_t *events;
    int nevents;
    int *waits;
    int nwaits;
    cudaEvent_t join_ev[CP_STREAM_COUNT];
    cudaEvent_t ring_ev[2][2]; /* host optimizer: [slot] gradients down, [slot] parameters up */
    bool stream_used[CP_STREAM_COUNT];
    cp_gemm_lib *gemm;
    xstep *x;
    scalars sc;
    int32_t *staging;   /* pinned: [micro_batches][cp_plan_input_ints] tokens, targets, rows sorted by token, then the
                         * packed documents' positions and bounds */
    bool docs_staged;   /* cp_exec_set_documents ran since the last step took the staging's documents */
    int32_t *sort_count; /* [vocab + 1]: the counting sort of the tokens */
    float *host_scalars; /* pinned: loss_sum[0..1] read back once per step; from byte 32 the CP_SCALARS_RANK_INTS
                          * integers compared across the ranks (spread_memory) */
    float *loss_sum;    /* device */
    /* memory measurement */
    char bus[64];     /* the GPU's PCI bus id, NVML's name for it */
    bool per_process; /* this process's own bytes from NVML, not the GPU's free memory */
    bool nvml;
    int64_t base_free_nvml, ctx_free_nvml, ctx_free_cuda;
    int64_t rss_base; /* resident host bytes before the host arena was pinned */
    bool skip_comm;   /* CPGEN_BENCH_SKIP_COMM=1: collectives replaced by local copies, to time the step without them */
    cp_profile *prof; /* CPGEN_PROFILE=N: step N (counted from 1 in this executor) timed step by step */
    int prof_step, steps_run;
    bool profiling;   /* the step running now is the one profiled */
    cp_trace_rec *trace; /* --trace: step o.trace_step (counted in steps_run) recorded */
    bool tracing;        /* the step running now is the one traced */
    /* progress */
    int nmarkers;
    marker *markers;
    cudaEvent_t *marker_ev; /* [micro_batches][nmarkers] */
    int nmarker_ev;
    double t_micro, t_optim; /* predicted seconds of one micro-batch and of the optimizer */
    double last_seconds;
    int updates;
    bool dry; /* cp_exec_check: no GPU; addresses are made up, nothing is launched */
    /* this rank's place in a ring (exec_place_rank): its position, and the ring communicator's ranks of the next
     * rank (sent to) and the previous one (received from); 0, -1, -1 without a ring */
    int ring_pos, ring_to, ring_from;
    int *event_step; /* the step recording each event */
    /* evaluation (exec_eval.c): the steps [0, eval_end] of a micro-batch it walks and which of them it runs
     * (gen/plan_eval.h), made at its first call */
    bool *eval_run;
    int eval_end;
    /* a checkpoint's snapshot (exec_snap.c) */
    bool snap_ready;            /* the lock below exists, and the gate and buffers are known */
    bool snap_cuda;             /* the stream and events exist */
    int snap_gate;              /* cp_exec_snapshot_gate of the plan */
    int snap_buf[3];            /* master.f32, adam_m.f32, adam_v.f32 */
    cudaStream_t snap_stream;   /* the copies of a snapshot from the GPU */
    cudaEvent_t snap_done, snap_half[2];
    bool snap_gpu;              /* copies on snap_stream that the next update must wait for (on the GPU) */
    pthread_mutex_t snap_lock;
    pthread_cond_t snap_cond;
    bool snap_host;             /* a snapshot cp_exec_snapshot_finish has still to make: the next update waits */
    cp_exec_snap snap_dst;
    double snap_waited;         /* seconds the running step's update waited on the host */
};

#define CK(call, what)                                                              \
    do {                                                                            \
        cudaError_t e_ = (call);                                                    \
        if (e_ != cudaSuccess) return cp_cuda_errmsg(e_, what, err, errlen);        \
    } while (0)

static inline uint16_t exec_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* exec.c: this rank's place in the run from o.world_rank (gen/ranks.c): ring_pos, ring_to, ring_from. Returns 0, or
 * -1 when o.rank is not the place of o.world_rank in its group. */
int exec_place_rank(cp_exec *ex, char *err, int errlen);

/* exec_args.c: the prepared steps */
const char *exec_step_desc(const cp_plan *P, int i, char *buf, size_t n);
int exec_prep_step(cp_exec *ex, int i, char *err, int errlen);

/* exec_order.c: what the steps wait for, and the plan's weight ranges */
int exec_check_weight_ranges(const cp_exec *ex, char *err, int errlen);
void exec_build_deps(cp_exec *ex, int from, int to);
void exec_build_markers(cp_exec *ex);
/* every wait of every step, as (step, the step it waits for); *out owned by the caller; returns the count */
int exec_wait_pairs(const cp_exec *ex, cp_trace_wait **out);

/* exec_mem.c: memory measurement and the arenas */
/* The bytes of the next copy into host memory registered with CUDA in pieces of `piece` bytes from its start (a
 * checkpoint's snapshot), from byte `at` toward `end`: it stops at the next multiple of piece, since a copy that
 * crosses two registrations fails (cudaErrorInvalidValue). piece 0: unregistered, to the end. */
static inline size_t exec_piece_span(size_t at, size_t end, size_t piece) {
    size_t n = end - at;
    return piece && piece - at % piece < n ? piece - at % piece : n;
}
/* The full flat fp32 buffer `name` gathered to group 0's rank 0 into flat (NULL elsewhere), copied out of the GPU in
 * pieces of at most `piece` bytes that never cross a multiple of it from flat's start (0: whole units); exec.c. */
int exec_gather_full(cp_exec *ex, const char *name, float *flat, size_t piece, char *err, int errlen);
/* What gathers the full model from the ranks' shards of buffer `name` (checkpoints): the buffer (on the GPU or, with
 * the optimizer on the host, in host memory) and the unit-gradient GPU buffer the units pass through. */
int exec_gather_through(const cp_exec *ex, const char *name, int *src, int *stage, char *err, int errlen);
int64_t exec_nvml_free(const char *bus_id);
int64_t exec_nvml_process_used(const char *bus_id); /* -1 when NVML cannot say */
int64_t exec_cuda_free_now(void);
void *exec_pin_thread(void *arg);
void exec_host_pieces(cp_exec *ex);
void exec_place_buffers(cp_exec *ex);

/* exec_hostopt.c: the optimizer step on the host */
int exec_host_update(cp_exec *ex, int i, char *err, int errlen);

/* exec_trace.c: the traced step's trace file, after the step */
int exec_trace_write(cp_exec *ex, double step_seconds, char *err, int errlen);

/* exec_snap.c: before step i of the optimizer runs, wait for a snapshot still reading what it writes; and the
 * snapshot's stream, events and lock freed */
int exec_snap_gate(cp_exec *ex, int i, char *err, int errlen);
void exec_snap_free(cp_exec *ex);

/* exec_run.c: waiting for a stream through the communicator's watchdog */
int exec_sync_stream(cp_exec *ex, cudaStream_t st, const char *what, char *err, int errlen);
/* exec_run.c, for the evaluation's walk (exec_eval.c) as for the step's: step i of micro-batch mb on its stream after
 * its waits (skip: only the waits and the event it records, as a last_micro step in an earlier micro-batch);
 * progress_state NULL for no progress lines */
int exec_run_step(cp_exec *ex, int i, int mb, void *progress_state, bool skip, char *err, int errlen);
/* every stream waits for the others (the start of a micro-batch, the end of its program) */
int exec_join_streams(cp_exec *ex, char *err, int errlen);
/* the loss sum and the gradient's sum of squares into host_scalars, one sync */
int exec_read_scalars(cp_exec *ex, char *err, int errlen);
/* mb micro-batches' tokens and targets ([mb][T] each) into the pinned staging, checked against the vocabulary, and
 * the loss scale from the targets (targets_all with several ranks); returns this rank's target count, or -1 */
int64_t exec_stage_inputs(cp_exec *ex, int mb, const int32_t *tokens, const int32_t *targets, int64_t targets_all,
                          char *err, int errlen);
/* the communicator of the whole run (the loss sum across it), NULL with one rank */
cp_nccl_comm *exec_run_comm(const cp_exec *ex);

#endif
