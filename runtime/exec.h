/* exec.h: the one-GPU step executor. It allocates exactly the plan's arenas (one cudaMalloc of the GPU arena, the
 * pinned host arena in parallel pieces), compiles and loads every kernel module, turns each step of the plan into a
 * prepared launch (kernel arguments, GEMM entry, copy, memset) with the cross-stream waits it needs, and then runs
 * training steps: the micro-batches, one sync to read the loss and gradient norm, and the optimizer. Nothing is
 * allocated while a step runs. A plan of C > 1 GPUs runs as one executor per GPU, in one process each, over an
 * NCCL communicator of the C ranks: the plan's collectives (all-to-all, all-gather, reduce-scatter, all-reduce) run
 * on its communication stream; every rank holds its shard of the parameters, gradients and optimizer state. */
#ifndef CP_EXEC_H
#define CP_EXEC_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "nccl_rt.h"
#include "plan.h"
#include "trace.h"

typedef struct cp_bundle cp_bundle; /* bundle.h */

typedef struct {
    char arch[16];  /* NVRTC target; empty: the device's */
    bool no_cache;  /* compile kernels even when the JIT cache has them */
    const cp_bundle *bundle; /* load the kernels from this AOT bundle (checked against the plan), never compile */
    FILE *out;      /* start-up report, NULL for none */
    int device;     /* the CUDA device of this rank */
    int rank;       /* this process's rank among the plan's C GPUs (0 with one) */
    cp_nccl_comm *comm; /* the C ranks' communicator; NULL with one GPU */
    /* Several groups (parallel.replicas, parallel.ring): the communicator of the ranks holding the same shard in
     * every group (the plan's shard_allreduce and loss_allreduce), and the run's (the loss of cp_exec_gradients, the
     * watchdog); NULL with one group. ring_comm: with a ring, the ring's (its K/V blocks and dK, dV passed on), its
     * ranks in ring order. world_rank: this process's rank in the run (rank with one group): rank 0 alone speaks;
     * with several groups it also gives the ring position (gen/ranks.c). */
    cp_nccl_comm *shard_comm, *world_comm, *ring_comm;
    int world_rank;
    int64_t base_free;  /* the device's free memory before this process used it (cp_exec_device_free), when the
                         * CUDA context exists before the executor; 0: measured at its creation */
    const char *trace_path; /* --trace: the step trace's file (trace.h); NULL for none */
    int trace_step;         /* the step traced, counted from 1 in this executor */
    /* Preemption (runtime/stop.h): nonzero (the signal's number) once this rank was asked to stop. Read at the end
     * of every step and carried in the step's all-reduce of the ranks' memory figures (max), so that every rank sees
     * the same cp_step_result.stop after the same step; NULL: never. */
    const volatile sig_atomic_t *stop_request;
} cp_exec_opts;

/* The optimizer's numbers for one step (the learning rate comes from the schedule, see train.h). */
typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    double clip;    /* global gradient-norm clip; <= 0: none */
    int64_t targets_all; /* target tokens of the step on all ranks (the loss's divisor); 0: this rank's, which is
                          * all of them with one GPU */
} cp_optim_hp;

typedef struct {
    double loss;        /* mean cross-entropy over the target tokens of all micro-batches (loss_sum x scale) */
    double norm;        /* global gradient norm before clipping */
    double clip_scale;  /* min(1, clip / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_ */
    int64_t targets;    /* target tokens (not ignored) in the step */
    bool skipped;       /* NaN or Inf loss or norm: the update was skipped */
    double seconds;     /* wall time of the step */
    int64_t mem_used;   /* measured GPU memory of this process at the step's end (cp_exec_mem_used); with several
                         * ranks the most any rank measured, and mem_least the least */
    int64_t mem_least;
    int64_t host_used;  /* measured host memory the run added since the executor's start (cp_exec_host_used) */
    int stop;           /* some rank was asked to stop (opts.stop_request): the largest of their signal numbers, the
                         * same on every rank after the same step; 0 when none was */
    double snap_wait;   /* seconds this step's update waited on the host for a checkpoint's snapshot to be copied */
} cp_step_result;

/* What start-up did and measured (bytes from the driver, seconds of wall time). */
typedef struct {
    double compile_seconds, pin_seconds, total_seconds;
    int64_t host_pinned;          /* bytes pinned (the host arena's pieces) */
    int pin_pieces;
    int64_t mem_total;            /* the GPU's memory (cudaDeviceProp.totalGlobalMem) */
    int64_t mem_context;          /* CUDA context (from NVML; 0 when NVML is not available) */
    int64_t mem_modules;          /* kernel modules and the cuBLASLt handle */
    int64_t mem_arena;            /* the arena's cudaMalloc as the driver saw it */
    bool nvml;                    /* the context's memory was measured (NVML found) */
    bool per_process;             /* NVML counts this process's own bytes: memory figures are this rank's; false
                                   * where it cannot (then they count the whole GPU, other processes' included) */
    int gemm_entries;             /* distinct GEMM shapes prepared */
    int events, cross_waits;      /* events recorded per micro-batch for cross-stream waits, and the waits */
    int sms;
    char device[256];
} cp_exec_startup;

typedef struct cp_exec cp_exec;

/* The device's free memory as NVML sees it (no CUDA context needed), or -1 without NVML. */
int64_t cp_exec_device_free(int dev);

/* Set up the executor for plan on GPU o->device. The plan must outlive the executor. Returns 0, or -1 with a message
 * (no GPU, a parallel plan, a compile error, out of memory, a step whose operands do not fit its kernel). Call it
 * before anything else in the process creates a CUDA context, so that the context's memory is measured too. */
int cp_exec_create(cp_exec **out, const cp_plan *plan, const cp_exec_opts *o, char *err, int errlen);

void cp_exec_destroy(cp_exec *ex);
const cp_exec_startup *cp_exec_startup_info(const cp_exec *ex);

/* Model weights as a flat fp32 array of cp_weights_elems(plan) elements in the plan's unit layout (embedding,
 * layers, final norm and LM head; cp_layer_layout_of; weights.h): this rank's shard of it is uploaded into the fp32
 * master weights and the bf16 parameters (with one GPU the shard is all of it); the AdamW moments, gradients and
 * step count are zeroed. Returns 0, or -1 with a message. */
int cp_exec_load_weights(cp_exec *ex, const float *flat, char *err, int errlen);
/* The same from this rank's shard alone (plan->params_shard elements, cp_weights_shard's layout). */
int cp_exec_load_shard(cp_exec *ex, const float *shard, char *err, int errlen);
/* With one GPU and the optimizer in host memory: the master weights and AdamW moments where they are (the full
 * model's layout, pinned host memory), valid until the next step; false otherwise (read them with the functions
 * below). For checkpoints without copies of the model. */
bool cp_exec_host_state(cp_exec *ex, const float **master, const float **m, const float **v);
/* The fp32 master weights back into flat (the full model; with several GPUs gathered from every rank: every rank
 * calls it, and flat may be NULL on all but the one that needs them). With one GPU a NULL flat does nothing: in a
 * run of groups of one GPU (replicas, a ring) only the writing rank reads. */
int cp_exec_read_weights(cp_exec *ex, float *flat, char *err, int errlen);

/* A checkpoint's snapshot (runtime/exec_snap.c): the fp32 master weights and both AdamW moments of the whole model
 * (cp_weights_elems floats each, cp_exec_load_weights's layout) copied into host arrays right after a step, so that
 * the files are written from them while training goes on. By where the state lives:
 *   several GPUs: the gathers of cp_exec_read_weights and cp_exec_read_optimizer (collectives every rank of the group
 *     takes part in), done when cp_exec_snapshot_start returns;
 *   one GPU, optimizer on the GPU, pinned arrays: device-to-host copies on a stream of the snapshot's own, started by
 *     cp_exec_snapshot_start; the next step's forward and backward (which read only the bf16 parameters) run
 *     meanwhile, and only its update waits for the copies, on the GPU (an event);
 *   the same with pageable arrays: through two halves of a pinned staging buffer, by cp_exec_snapshot_finish;
 *   one GPU, optimizer on the host: a memcpy of the host state, by cp_exec_snapshot_finish.
 * In the last two the next update waits on the host until cp_exec_snapshot_finish is done (cp_step_result.snap_wait).
 */
typedef struct {
    float *w, *m, *v;      /* the arrays; NULL on a rank that does not write (it still takes part in the gathers) */
    bool pinned;           /* registered with CUDA (cudaHostRegister), so the GPU copies into them directly */
    int64_t piece;         /* pinned arrays are registered in pieces of this many bytes from their start: a copy
                            * never crosses a piece; <= 0: one piece each */
    void *staging;         /* pageable arrays filled from the GPU: pinned bytes the copies pass through */
    int64_t staging_bytes;
} cp_exec_snap;

/* Start a snapshot into dst right after a step, on the training thread; *updates gets AdamW's update count (the
 * state's). Every rank calls it (with several GPUs it is the gathers). Then, on any thread (the checkpoint saver's),
 * cp_exec_snapshot_finish returns once the arrays hold the state: once per start, in the order of the starts. The
 * next snapshot may start, into other arrays (the saver's other slot), before the finish of this one: where this one
 * is made on the host it waits for that finish first; copies from the GPU keep their order on the snapshot's stream.
 * Returns 0, or -1 with a message. */
int cp_exec_snapshot_start(cp_exec *ex, const cp_exec_snap *dst, int *updates, char *err, int errlen);
int cp_exec_snapshot_finish(cp_exec *ex, char *err, int errlen);
/* The first step of the plan that writes the master weights or a moment (the update, where the next step waits for
 * a snapshot), or -1 when a micro-batch step writes them too (a snapshot then completes before
 * cp_exec_snapshot_start returns). A function of the plan alone. */
int cp_exec_snapshot_gate(const cp_plan *plan);

/* AdamW's state, for checkpoints: the moments m and v (adam_m.f32, adam_v.f32, on the GPU or the host as the plan
 * placed them) as flat fp32 arrays of the full model in the layout of cp_exec_load_weights (with several GPUs
 * gathered from every rank: every rank calls it, both moments are gathered, and NULL arrays only skip the copy;
 * only rank 0 needs them), and the
 * update count (AdamW's step, which sets the bias corrections of the next update). m or v may be NULL to skip that
 * moment (a caller short of host memory reads one at a time). Returns 0, or -1 with a message. */
int cp_exec_read_optimizer(cp_exec *ex, float *m, float *v, int *updates, char *err, int errlen);
/* Put back what cp_exec_read_optimizer read: call it after cp_exec_load_weights (which zeroes the moments and the
 * count). m or v NULL: leave that moment as it is. updates must be >= 0. */
int cp_exec_load_optimizer(cp_exec *ex, const float *m, const float *v, int updates, char *err, int errlen);
/* The same from this rank's shards alone (plan->params_shard elements each, cp_weights_shard's layout): a rank of
 * several GPUs resuming reads its shards unit by unit and never holds the whole model (cp_ckpt_load_moment_shard). */
int cp_exec_load_optimizer_shard(cp_exec *ex, const float *m, const float *v, int updates, char *err, int errlen);

/* Packed documents (plan->docs, plan->doc_positions): the next step's or evaluation's documents, for mb micro-batches
 * in their order: positions [mb][T] (each of the rank's rows' RoPE position; with doc_positions), doc_start and
 * doc_end [mb][S] (each position's document over the whole sequence, data.h cp_docs_bounds; with docs). Checked (a
 * document of each position, in order) and staged; every step and evaluation of such a plan needs it first, and
 * fails without. Returns 0, or -1 with a message. */
int cp_exec_set_documents(cp_exec *ex, int mb, const int32_t *positions, const int32_t *doc_start,
                          const int32_t *doc_end, char *err, int errlen);
/* One optimizer step: tokens and targets are [micro_batches][T] int32 (targets < 0 are ignored). Runs every
 * micro-batch's program, reads the loss and the gradient norm (one sync), then clips and applies AdamW unless the
 * loss or the norm is NaN or Inf. `label` (e.g. "step 3/10") prefixes progress lines, printed to stderr when a step
 * runs longer than a few seconds. Returns 0, or -1 with a message naming the failing step. */
int cp_exec_step(cp_exec *ex, const int32_t *tokens, const int32_t *targets, const cp_optim_hp *hp, const char *label,
                 cp_step_result *r, char *err, int errlen);

/* Forward and backward of every micro-batch, without the optimizer: the fp32 gradients (of the mean loss over the
 * target tokens; targets_all as in cp_optim_hp) are added to grads.f32 and stay there; loss gets the mean loss. For
 * gradient checks. */
int cp_exec_gradients(cp_exec *ex, const int32_t *tokens, const int32_t *targets, int64_t targets_all, double *loss,
                      char *err, int errlen);
/* Evaluation (runtime/exec_eval.c): the forward of n sequences (1 <= n <= train.micro_batches; tokens and targets
 * [n][T], this rank's slices), each walked as a micro-batch up to and including its loss sum, running only the steps
 * the loss depends on (gen/plan_eval.h): no gradient, no backward, no optimizer, on the training step's buffers, and
 * nothing the next step reads before writing it. *loss_sum gets the sum of the sequences' token losses over every
 * rank of the run (each rank's, summed across the world); targets_all is the target count of the n sequences
 * over all ranks (the caller's count, as cp_optim_hp's). Every rank of the run calls it with the same n. Returns 0, or
 * -1 with a message. */
int cp_exec_eval(cp_exec *ex, const int32_t *tokens, const int32_t *targets, int n, int64_t targets_all,
                 double *loss_sum, char *err, int errlen);

/* grads.f32 into flat (the full model, as cp_exec_load_weights; gathered from every rank with several GPUs), then
 * zero this rank's shard if asked. */
int cp_exec_read_grads(cp_exec *ex, float *flat, bool zero, char *err, int errlen);

/* Updates done so far (steps not skipped). */
int cp_exec_updates(const cp_exec *ex);

/* GPU memory this process uses now, as the driver reports it: total - free, minus what other processes used before
 * cp_exec_create (the CUDA context included when NVML could measure it). */
int64_t cp_exec_mem_used(const cp_exec *ex);
/* Resident host memory (VmRSS) now, less what was resident before the host arena was pinned: the arena as the
 * kernel counts it, plus whatever else the run keeps; -1 without /proc. */
int64_t cp_exec_host_used(const cp_exec *ex);
/* A byte field of /proc/self/status ("VmRSS", "VmHWM"), or -1. */
int64_t cp_proc_status_bytes(const char *field);

/* Address of a buffer of the plan by name (device or pinned host), or NULL. For tests. */
void *cp_exec_buffer(const cp_exec *ex, const char *name);

/* What cp_exec_check found. */
typedef struct {
    int steps, kernels, launches, gemms, copies, memsets;
    int waits, events, markers, pin_pieces;
    int64_t ordered_pairs; /* pairs of steps on different streams touching the same bytes, each found ordered */
    int eval_steps;        /* steps an evaluation runs of a micro-batch (gen/plan_eval.h), checked to leave the
                            * training state alone */
} cp_exec_check_report;

/* Everything cp_exec_create derives from the plan, without a GPU: each step's argument list and launch geometry
 * (operand counts, sizes and alignment against the kernels' contracts), the GEMM extents, that every weight or
 * gradient slice of a backward GEMM is a slice the forward read as weights, the cross-stream waits,
 * a proof that every pair of steps on different streams touching the same bytes is ordered by them, and the steps an
 * evaluation runs (cp_plan_eval_of). Returns 0, or -1 with a message naming the step. */
int cp_exec_check(const cp_plan *plan, cp_exec_check_report *rep, char *err, int errlen);
/* Whether the executor prepares steps of this task (gen/plan.h's CP_TASKS): every task the planner can give. */
bool cp_exec_prepares(cp_task task);

/* For tests: the executor cp_exec_check makes, without a GPU, as rank o->rank (and o->world_rank, which places it in
 * a ring) would make it; o may be NULL for rank 0. Every step is prepared against made-up addresses (cp_exec_buffer
 * gives them), nothing is launched, no communicator is used. Returns 0, or -1 with a message naming the step;
 * cp_exec_destroy frees it. */
int cp_exec_dry(cp_exec **out, const cp_plan *plan, const cp_exec_opts *o, char *err, int errlen);

/* For tests: what the executor prepared for step i. */
#define CP_EXEC_MAXARGS 16 /* arguments of one kernel launch */
typedef struct {
    int launches;           /* kernel launches: 0 for a step that is not a kernel, or one with nothing to do here */
    int nargs[2];
    /* each launch's arguments fixed at preparation, pointers and integers widened to 64 bits; 0 for one read at each
     * launch (the loss scale, AdamW's numbers) or a tensor map */
    uint64_t args[2][CP_EXEC_MAXARGS];
    const void *src;        /* collectives: what is sent, and where it is received */
    const void *dst;
    size_t count;           /* elements per peer */
    int to, from;           /* a ring's send/recv: the ring communicator's ranks sent to and received from; else -1 */
} cp_exec_prepared;
void cp_exec_prepared_step(const cp_exec *ex, int i, cp_exec_prepared *out);

/* The waits between streams the executor enqueues for the plan, without a GPU, as the step trace draws them:
 * *waits (owned by the caller) gets *n pairs. Returns 0, or -1 with a message as cp_exec_check. */
int cp_exec_plan_waits(const cp_plan *plan, cp_trace_wait **waits, int *n, char *err, int errlen);

#endif
