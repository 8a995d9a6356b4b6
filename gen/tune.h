/* tune.h: `cpgen tune`'s candidates: the axes swept (spec keys and their values), every combination loaded as a spec
 * and planned, ranked by predicted (or measured) step time, and written out as a table, tune.jsonl, tune.svg and
 * tuned.lua (gen/tune.c). The measurement on a GPU is the command's (cli/cmd_tune.c). */
#ifndef CP_TUNE_H
#define CP_TUNE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "ktune.h"
#include "plan.h"
#include "spec.h"

#define CP_TUNE_MAX_AXES 12
#define CP_TUNE_MAX_VALUES 32
#define CP_TUNE_VALUE_MAX 48
#define CP_TUNE_MAX_KERNELS 16

typedef struct {
    char key[64]; /* a spec key path, e.g. "parallel.upipe_heads" */
    int nvalues;
    char values[CP_TUNE_MAX_VALUES][CP_TUNE_VALUE_MAX]; /* as --set takes them: "8", "auto", "16K" */
} cp_tune_axis;

typedef struct {
    int naxes;
    cp_tune_axis axes[CP_TUNE_MAX_AXES];
} cp_tune_axes;

typedef struct {
    char values[CP_TUNE_MAX_AXES][CP_TUNE_VALUE_MAX]; /* this candidate's value on each axis */
    bool fits;           /* planned and fits the machine */
    char why[CP_ERR_MAX]; /* when it does not: the spec's or the planner's reason */
    int same_as;         /* index of an earlier candidate with the same resolved plan, or -1 */
    /* the resolved plan */
    int U, ckpt_every, ckpt_host_layers, attn_host_layers, attn_gpu_layers, C, layers;
    int64_t mlp_tile, loss_tile, S, tokens; /* tokens per optimizer step of one group (its C ranks) */
    bool opt_on_host;
    double t_plan;              /* predicted step, seconds */
    double layer_fraction;      /* the share of the plan's step time spent in layers (the rest: embedding, loss, optimizer) */
    int64_t gpu_peak, host_peak;
    /* the measurement (cli/cmd_tune.c); measured false: ranked by the plan */
    bool measured;
    int measured_layers;        /* layers of the truncated model that ran */
    double measured_step;       /* its median step, seconds */
    double per_layer;           /* measured seconds per layer */
    double t_full;              /* the full-depth step: measured and extrapolated, else t_plan */
    int64_t measured_peak;      /* GPU bytes, largest at a step's end, of the truncated model */
    int64_t measured_plan_peak; /* the truncated model's planned GPU peak, to set the measured one against */
    char note[1600];            /* why it was not measured, or what went wrong */
    int rank;                   /* 1 = the winner; 0 for skipped and duplicate candidates */
} cp_tune_cand;

typedef struct {
    cp_tune_axes axes;
    int n;
    cp_tune_cand *c;     /* in order of enumeration */
    int *order;          /* indices of c by rank: the unique fitting ones first, by t_full */
    int nranked;
    /* the kernel variants timed on the GPU (cli/cmd_tune.c, through cpgen tune-kernels), one entry per kernel and
     * shape, and why none were or what went wrong */
    int nkern;
    cp_ktune_entry kern[CP_TUNE_MAX_KERNELS];
    char kern_note[CP_ERR_MAX];
} cp_tune;

/* The default axes for spec: every valid parallel.upipe_heads, parallel.mlp_tile and parallel.loss_tile ("auto" and
 * larger tiles that divide the tokens per GPU), parallel.checkpoint_every ("auto", 1), parallel.optimizer ("auto",
 * "host") and parallel.attention_output ("auto", "recompute"). */
void cp_tune_default_axes(const cp_spec *spec, cp_tune_axes *ax);
/* Apply one --sweep KEY=V1,V2,...: replaces the axis KEY or adds it. Each value is checked as --set KEY=V would be on
 * the spec (path, sets): a bad key or value returns -1 with the spec loader's message. */
int cp_tune_sweep(cp_tune_axes *ax, const char *arg, const char *path, const char *const *sets, int nsets, char *err,
                  int errlen);
/* Every combination of the axes loaded (path, sets, then the axes' values) and planned; candidates with the same
 * resolved plan as an earlier one are marked same_as; the ranking is by the plan. Returns 0, or -1 with a message
 * (too many combinations). */
int cp_tune_plan(cp_tune *t, const cp_tune_axes *ax, const char *path, const char *const *sets, int nsets, char *err,
                 int errlen);
/* Add a kernel timing to t, replacing one of the same kernel and shape (at most CP_TUNE_MAX_KERNELS are kept). */
void cp_tune_add_kernel(cp_tune *t, const cp_ktune_entry *e);
/* Rank again after measurements: measured candidates first by t_full, then the rest by the plan. */
void cp_tune_rank(cp_tune *t);
void cp_tune_free(cp_tune *t);

/* "KEY=VALUE" of candidate i on axis a into out. */
void cp_tune_set_text(const cp_tune *t, int i, int a, char *out, size_t n);
/* The --set texts that load candidate i: sets, then "KEY=VALUE" on every axis, then extra (may be NULL), as owned
 * strings; *n gets their number. Free them with cp_tune_sets_free. */
char **cp_tune_candidate_sets(const cp_tune *t, int i, const char *const *sets, int nsets, const char *const *extra,
                              int nextra, int *n);
void cp_tune_sets_free(char **sets, int n);

/* The table on out: one row per unique candidate in rank order (at most max rows, then a count), the skipped ones
 * with their reason; then the kernel variants timed, each variant's time with the winner marked. */
void cp_tune_print(const cp_tune *t, FILE *out, int max);
/* dir/tune.jsonl: one JSON object per candidate ("candidate": its index), every figure; then one per kernel shape
 * timed (a kernel tuning cache entry, gen/ktune.h: "kernel", "shape", "ms" of every variant, "winner"). 0, or -1 with
 * a message. */
int cp_tune_write_jsonl(const cp_tune *t, const char *path, char *err, int errlen);
/* dir/tune.svg: step time and peak GPU memory against the UPipe chunk size U, one line per combination of the other
 * axes' values (the best 8), the winner marked (id "winner"). 0, or -1 with a message. */
int cp_tune_svg(const cp_tune *t, const char *path, char *err, int errlen);
/* tuned.lua: the input spec (spec_path: a file, or a shipped name) extended with sets and the winner's values, as
 * cpgen.extend(cpgen.load(...), ...). 0, or -1 with a message (no winner). */
int cp_tune_write_lua(const cp_tune *t, const char *path, const cp_spec *input, const char *const *sets, int nsets,
                      char *err, int errlen);

/* "10m", "90s", "1h", "600": seconds; -1 when malformed, not above 0 or above 30 days. */
double cp_tune_parse_budget(const char *s);
/* The share of a plan's predicted step spent in its layers (the rest: embedding, loss, optimizer). */
double cp_tune_layer_fraction(const cp_plan *P);

#endif
