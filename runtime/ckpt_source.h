/* ckpt_source.h: the executor as the source of a checkpoint's snapshot (ckpt_async.h), with the arrays the plan gives
 * it (snapshot.h) on the rank that writes. */
#ifndef CP_CKPT_SOURCE_H
#define CP_CKPT_SOURCE_H

#include <stdbool.h>

#include "ckpt_async.h"
#include "exec.h"
#include "snapshot.h"

typedef struct cp_ckpt_source cp_ckpt_source;

/* For a plan with checkpoints (plan->ckpt_snap not CP_SNAP_NONE): on the writer, the snapshot's arrays are reserved
 * and start being pinned in the background now; *src is what a cp_saver takes. The executor must outlive it.
 * Returns 0, or -1 with a message. */
int cp_ckpt_source_open(cp_ckpt_source **out, cp_exec *ex, const cp_plan *plan, bool writer, int device,
                        cp_snap_source *src, char *err, int errlen);
/* A note to print once (pinning failed, the arrays are pageable) into buf: true when there was one. */
bool cp_ckpt_source_note(cp_ckpt_source *s, char *buf, int len);
void cp_ckpt_source_close(cp_ckpt_source *s);

#endif
