/* ckpt_async.h: checkpoints that do not stop training. A save takes a snapshot of the training state from a source
 * (the executor: ckpt_source.c, runtime/exec_snap.c) into one of the plan's slots (ckpt_slots: 1 or 2) and hands it
 * over: a snapshot thread finishes it (the source's finish) at once, and a writer thread writes the folders in the
 * order of the saves with cp_ckpt_write (the code a save that waits uses too, so the bytes are the same), then removes
 * checkpoints past train.keep_checkpoints (ckpt_keep.h). Training stops only for the snapshot; a save waits only
 * when every slot holds a snapshot still being written (for the oldest); a write that failed fails the run at the
 * next step boundary (cp_saver_poll), the next save, or at the end (cp_saver_wait). The folder is as atomic as ever: a kill at any moment leaves the newest complete
 * checkpoint where `latest` names it (docs/CHECKPOINTS.md).
 *
 * Test hook: CPGEN_CKPT_PAUSE=SECONDS (or STEP:SECONDS, for the checkpoint of that step only) makes the writer pause
 * that long after a checkpoint's weights file, as a slow disk would, and say so on stderr; for checks that kill a
 * run while a write is in progress (tools/gpu-ckpt-check.sh). */
#ifndef CP_CKPT_ASYNC_H
#define CP_CKPT_ASYNC_H

#include <stdbool.h>
#include <stdint.h>

#include "checkpoint.h"
#include "plan.h"

/* Where a snapshot comes from. start runs on the training thread right after a step, on every rank (it may be a
 * collective): it sets the arrays of slot `slot` (0 or 1, free: no write reads them) the state goes into (NULL on a
 * rank that does not write), the AdamW update count and *waited (seconds spent waiting for the arrays to be made, 0
 * usually). finish runs on the snapshot thread, once per start and in the same order, and returns once the arrays
 * hold the state; the writer reads them only after. Each returns 0, or -1 with a message. */
typedef struct {
    void *ctx;
    int (*start)(void *ctx, int slot, const float **w, const float **m, const float **v, int *updates, double *waited,
                 char *err, int errlen);
    int (*finish)(void *ctx, char *err, int errlen);
} cp_snap_source;

typedef struct {
    const cp_plan *plan;
    const char *out_dir;
    bool writer;         /* this rank writes (the run's rank 0); the others only take part in the snapshot */
    bool async;          /* false: cp_saver_save returns once the folder is written */
    int keep;            /* train.keep_checkpoints: the newest kept after each save (0: all) */
    const char *resumed; /* the checkpoint folder the run resumed from: never removed; NULL for none */
    cp_snap_source src;
    cp_ckpt_hook hook;   /* tests: passed to cp_ckpt_write (a hook that stops the write makes it fail) */
    void *hook_ctx;
} cp_saver_opts;

/* What one save cost the training thread. */
typedef struct {
    int step;           /* the checkpoint's step */
    double held;        /* seconds the training thread spent in cp_saver_save: all of the below and the snapshot */
    double waited;      /* of which waiting for a slot: an older checkpoint's write to finish (a slow disk) */
    int waited_for;     /* that checkpoint's step (0: a slot was free) */
    double made;        /* of which waiting for the snapshot's arrays to be made (pinned at start-up) */
} cp_save_info;

typedef struct cp_saver cp_saver;

/* The writer's thread starts on the writing rank. Returns 0, or -1 with a message. */
int cp_saver_create(cp_saver **out, const cp_saver_opts *o, char *err, int errlen);

/* Save the checkpoint of st (its step, skipped count, last loss and data position; the update count comes from the
 * snapshot) after a step: wait for a slot if every one is still being written (and fail here if a write failed), take
 * the snapshot, hand it to the writer (with async false, wait for the write). Every rank calls it at the same steps.
 * Returns 0, or -1 with a message. */
int cp_saver_save(cp_saver *s, const cp_ckpt_state *st, cp_save_info *info, char *err, int errlen);

/* A write that finished and was not reported yet, on the writing rank (call until 0: there may be several): 1 with its
 * line in `line` ("ckpt_10 written: 13.81 GiB in 6.1 s, 2.43 GB/s (DIR); removed ckpt_5 ..."), 0 when there is none,
 * -1 with the reason when one failed (reported before any other: the run stops, its newest checkpoint is the one
 * before). */
int cp_saver_poll(cp_saver *s, char *line, int linelen, char *err, int errlen);

/* The step of the newest checkpoint still being written (0: none). */
int cp_saver_busy(cp_saver *s);

/* Wait for the writes still going, if any; the seconds waited (0 when none was). Then cp_saver_poll reports them. */
double cp_saver_wait(cp_saver *s);

/* Stop the saver's threads, after the writes still going. s may be NULL. */
void cp_saver_destroy(cp_saver *s);

/* The save's note for the step line: "ckpt_10: training held 12 ms (1.2% of the step)", with "waited 3.2 s for
 * ckpt_5 to be written" when it did. */
void cp_save_info_note(const cp_save_info *i, double step_seconds, char *buf, int len);

#endif
