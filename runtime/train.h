/* train.h: the training loop of `cpgen run`, on one GPU or as one rank of several: weights from the spec's init (random or Hugging Face),
 * sequences from the spec's data source, the learning-rate schedule, one step line per logged step, metrics.jsonl in
 * train.out_dir, and training checkpoints (checkpoint.h) every train.save_every steps and at the end; a run can
 * resume from one and continue with the same losses. */
#ifndef CP_TRAIN_H
#define CP_TRAIN_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "nccl_rt.h"
#include "plan.h"

typedef struct cp_bundle cp_bundle; /* bundle.h */

typedef struct {
    char arch[16];  /* NVRTC target; empty: the device's */
    bool no_cache;
    const cp_bundle *bundle; /* kernels from this AOT bundle instead of compiling them (exec.h) */
    FILE *out;      /* start-up report and step lines (stdout); NULL for none */
    const char *resume; /* a checkpoint folder, or an out_dir whose `latest` names one; NULL: start from init */
    bool resume_new_data; /* --resume-new-data: resume even where the data that comes next changes (resume.h) */
    /* several GPUs: this process's rank, its CUDA device and the communicator of all ranks (NULL with one GPU).
     * Every rank trains its slice of each sequence; rank 0 alone prints, writes metrics.jsonl and checkpoints. */
    int rank, device;
    cp_nccl_comm *comm;
    /* several groups (parallel.replicas, parallel.ring): this process's rank in the run (rank 0 alone prints and
     * writes), the communicators of its shard across the groups, of the run and of its ring (exec.h); with one group
     * world_rank = rank */
    int world_rank;
    cp_nccl_comm *shard_comm, *world_comm, *ring_comm;
    int64_t base_free; /* cp_world's: the device's free memory before this process's context */
    const char *trace_path; /* --trace: write step trace_step (from 1, in this run) as a step trace (trace.h) */
    int trace_step;
    /* preemption (stop.h): set to a signal's number when this process is asked to stop; NULL: never */
    const volatile sig_atomic_t *stop_request;
} cp_train_opts;

typedef struct {
    int first_step;                  /* steps done before this run: the resumed checkpoint's step, else 0 */
    int steps, skipped;              /* the last step reached; skipped updates, the checkpoint's included */
    double first_loss, last_loss, min_loss; /* of the steps this run did */
    double mean_last10;              /* mean loss of the last 10 steps run (fewer if fewer ran) */
    double chance_loss;              /* cp_dataset_chance_loss: the synthetic task's chance, else ln(vocab) */
    double step_seconds;             /* median step time, first step excluded when there are more */
    double tokens_per_s, tflops, mfu; /* per GPU, at the median step time */
    int64_t mem_measured, mem_planned; /* largest measured at a step's end; the plan's peak (arena + reserve) */
    int64_t mem_arena_measured, mem_arena_planned;
    int64_t host_measured, host_planned; /* host: largest cp_exec_host_used at a step's end; the plan's host_run */
    double *losses;                  /* [train.steps] by step index (step n is losses[n - 1]); NaN before
                                        first_step; owned: cp_train_result_free */
    int stopped;                     /* asked to stop (stop.h): the signal's number; the run stopped in order after
                                        step `steps` (saved when train.save_every > 0); 0 when it ran to the end */
    int saves;                       /* checkpoints written by this run */
    double save_held_max;            /* the longest a save held the training thread, seconds */
} cp_train_result;

/* The learning rate of optimizer step `step` (0-based), as transformers' cosine schedule with warmup and a
 * minimum (get_cosine_with_min_lr_schedule_with_warmup): lr * step / warmup during warmup, then a cosine from lr to
 * min_lr over the remaining steps. */
double cp_lr_at(const cp_train *t, int step);

/* Train the plan's model for plan->spec.train.steps steps on GPU 0, or, with o->resume, from the checkpoint's step
 * to train.steps: weights, AdamW moments and update count, step (so the schedule), skipped count and data position
 * come from the checkpoint, which is checked against the plan before the GPU is touched. Checkpoints are written
 * while training goes on (ckpt_async.h); the run waits for the last write before it returns. Asked to stop
 * (o->stop_request), every rank stops after the same step, saves and returns 0 with res->stopped set. Returns 0, or
 * -1 with a message. res may be NULL. */
int cp_train_run(const cp_plan *plan, const cp_train_opts *o, cp_train_result *res, char *err, int errlen);
void cp_train_result_free(cp_train_result *r);

#endif
