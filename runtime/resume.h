/* resume.h: what a resumed run may change from the run that saved its checkpoint, and the checkpoint's state into
 * the executor (docs/CHECKPOINTS.md, "Resuming on another layout").
 *
 * A checkpoint's weights and AdamW moments are per Hugging Face tensor, and its data position is a position in the
 * one stream of sequences that all groups of a run read together (each round, group g of R reads sequence g of the
 * round: cp_dataset_next_slice). So a run resumes on any layout (GPUs, ring, replicas, UPipe stage size, offloaded
 * checkpoints, optimizer placement) and takes the steps the saving run would have taken, its sums in another order.
 * What must stay is what decides which tokens come next: the data source (for synthetic data also its seed),
 * train.seq_len, and the sequences one step reads, parallel.replicas x train.micro_batches. A change of those is
 * refused unless the run is told to take the new data (`cpgen run --resume DIR --resume-new-data`); a change of
 * layout alone is accepted and noted. */
#ifndef CP_RESUME_H
#define CP_RESUME_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "checkpoint.h"
#include "data.h"
#include "exec.h"
#include "plan.h"

/* The sequences one step of the checkpoint's run read: as recorded, else (a checkpoint of an older cpgen) the data
 * position's sequence count over the step when it divides, else its micro-batches. */
int64_t cp_resume_ckpt_seqs_per_step(const cp_ckpt_state *st);

/* 0 when the plan's data continues the checkpoint's (same source and seed, sequence length and sequences per step),
 * or new_data. Else -1 with a message naming dir's trainer_state.json, every setting that changed with the spec's
 * value and the checkpoint's, the --set that restores each, and --resume-new-data. */
int cp_resume_check(const cp_plan *plan, const cp_ckpt_state *st, const char *dir, bool new_data, char *err,
                    int errlen);

/* "note:" lines on out (may be NULL): the layout settings that differ from the checkpoint's run; with new_data, the
 * data settings that differ (or that none does); then the schedule's (cp_ckpt_notes). Returns how many lines. */
int cp_resume_notes(const cp_plan *plan, const cp_ckpt_state *st, bool new_data, FILE *out);

/* The data at the checkpoint's position (cp_dataset_seek). With new_data and another source or sequence length,
 * the nearest position the new data has: synthetic data at the same sequence index; the same token shards at the
 * first sequence start of the new length at or after the saved token; other shards at the saved shard and token
 * when the new list has them, else at its start; said in a note on out. 0, or -1 with a message. */
int cp_resume_seek(cp_dataset *d, const cp_plan *plan, const cp_ckpt *ck, bool new_data, FILE *out, char *err,
                   int errlen);

/* The checkpoint's master weights (and the bf16 parameters from them), both moments and the update count into the
 * executor, one array at a time through one host buffer: with one GPU the whole model, else group rank `rank`'s
 * shards read unit by unit, so that resuming holds no more host memory than starting does (the plan's host_load) on
 * every layout. Then the "resumed from" line and cp_resume_notes on out. 0, or -1 with a message. */
int cp_resume_load(cp_exec *ex, const cp_plan *plan, const cp_ckpt *ck, int rank, bool new_data, FILE *out, char *err,
                   int errlen);

#endif
