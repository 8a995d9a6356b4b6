/* snapshot.h: the host arrays a checkpoint's snapshot is copied into (plan.h cp_snap_kind), made once per run on the
 * rank that writes: for each of the plan's slots (ckpt_slots), three model-sized fp32 arrays of anonymous memory, pinned in pieces by background threads
 * (cudaHostRegister; pinning took about 0.7 s per GiB on the H200 hosts, so never on the training thread), or
 * pageable, made resident in the background, with a small pinned staging buffer where the GPU fills them. */
#ifndef CP_SNAPSHOT_H
#define CP_SNAPSHOT_H

#include <stdbool.h>
#include <stdio.h>

#include "exec.h"
#include "plan.h"

#define CP_SNAP_PIECE ((int64_t)1 << 30) /* bytes pinned by one call, several at once */

typedef struct cp_snapbuf cp_snapbuf;

/* Reserve the arrays for the plan's snapshot (plan->ckpt_snap: pinned or pageable; nothing else is made) and start
 * making them resident (and pinned) on background threads; device: the CUDA device of this rank. Returns 0, or -1
 * with a message (no address space for them). */
int cp_snapbuf_create(cp_snapbuf **out, const cp_plan *plan, int device, char *err, int errlen);

/* The arrays of slot `slot` (0 or 1, below the plan's ckpt_slots), once the background work on them is done (waited
 * for here: *waited gets the seconds, 0 when it was done already; the first slot's are made first). Pinning that
 * failed leaves them pageable with a staging buffer (one, shared by the slots), and *note (may be NULL) says so once.
 * Returns 0, or -1 with a message. */
int cp_snapbuf_get(cp_snapbuf *b, int slot, cp_exec_snap *dst, double *waited, char *note, int notelen, char *err,
                   int errlen);

/* Unpin and free. b may be NULL. */
void cp_snapbuf_destroy(cp_snapbuf *b);

#endif
