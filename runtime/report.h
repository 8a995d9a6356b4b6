/* report.h: `cpgen report OUT_DIR`: a run's metrics.jsonl drawn as report.svg (loss, with the validation loss of the
 * steps that have one beside it, gradient norm, tokens/s, and measured against planned GPU memory over the steps).
 * `cpgen run` writes it at the end of a run. */
#ifndef CP_REPORT_H
#define CP_REPORT_H

/* Reads <out_dir>/metrics.jsonl and writes <out_dir>/report.svg; returns the number of steps drawn, with err empty
 * or a note of what was skipped (lines that are not a step's metrics, such as the cut last line of a crashed run;
 * values out of range), or -1 with a message naming the file (and line) that was wrong. */
int cp_report_write(const char *out_dir, char *err, int errlen);

#endif
