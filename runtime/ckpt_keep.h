/* ckpt_keep.h: train.keep_checkpoints: once a checkpoint is complete, the oldest complete ones past the newest N are
 * deleted, but only folders cpgen saved (cp_ckpt_dir_is_ours: nothing but a save's files and a trainer_state.json
 * that parses), never the one just written nor the one the run resumed from. */
#ifndef CP_CKPT_KEEP_H
#define CP_CKPT_KEEP_H

#include <stddef.h>

/* In out_dir, the complete checkpoint folders ckpt_<step> ordered by step; all but the newest `keep` are removed,
 * except `newest` (the folder just written) and `resumed` (either may be NULL; compared as files, not as names).
 * keep <= 0 keeps all. `removed` (may be NULL) gets the names removed, comma-separated, and any that could not be
 * ("ckpt_5 (not removed: ...)"). Returns how many were removed. */
int cp_ckpt_keep(const char *out_dir, int keep, const char *newest, const char *resumed, char *removed,
                 size_t removed_len);

#endif
