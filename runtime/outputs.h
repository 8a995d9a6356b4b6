/* outputs.h: what `cpgen run` writes besides its checkpoints' contents (train.out_dir's metrics.jsonl, report.svg,
 * `latest` and ckpt_<step> folders, and the --trace file), and the check, made before anything is set up, that each
 * is absent or a file cpgen wrote there: a run replaces only its own files, and a long run does not learn at its
 * end that it cannot write. */
#ifndef CP_OUTPUTS_H
#define CP_OUTPUTS_H

#include <stdbool.h>
#include <stddef.h>

#include "spec.h"

/* Whether a file starting with these n bytes is a metrics.jsonl cpgen wrote (lines {"step":N,...}). */
bool cp_metrics_is_ours(const char *head, size_t n, const void *ctx);

/* A run of spec may write its outputs: train.out_dir absent or a folder, and in it metrics.jsonl, report.svg,
 * `latest` and every ckpt_<step> folder the run would save absent or cpgen's; trace_path (may be NULL) as
 * cp_trace_check_path wants it. 0, or -1 with a message naming the file, what is there and what to do. */
int cp_run_outputs_check(const cp_spec *spec, const char *trace_path, char *err, int errlen);

#endif
