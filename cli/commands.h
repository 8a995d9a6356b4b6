/* commands.h: the cpgen subcommands, each called by cli/main.c after it has parsed flags and loaded the spec.
 * Each returns 0, or -1 with a message in err. */
#ifndef CP_COMMANDS_H
#define CP_COMMANDS_H

#include <stdbool.h>
#include <stdio.h>

#include "jit.h"
#include "plan.h"

/* `cpgen gen`: emit every module of the plan into <outdir>/<module>.cu (creating outdir), one line per file. */
int cp_cmd_gen(const cp_plan *plan, const char *outdir, char *err, int errlen);

/* `cpgen build`: emit and compile every module of the plan, then print a table of each entry's registers, shared
 * memory, stack and spills, compile times and cache use, and time a second, cached load. With opts->fail_on_spill
 * it fails when any entry spills. */
int cp_cmd_build(const cp_plan *plan, const cp_jit_opts *opts, FILE *out, char *err, int errlen);

/* `cpgen aot`: compile every module of the plan for each architecture of archs_csv ("sm_90a,sm_80") into the bundle
 * folder outdir (runtime/bundle.h) and print a table of its modules and cubins. command is recorded in the manifest. */
int cp_cmd_aot(const cp_plan *plan, const char *outdir, const char *archs_csv, const cp_jit_opts *opts,
               const char *command, FILE *out, char *err, int errlen);

/* Open the bundle dir and check it against plan on architecture arch (NULL: not known, every cubin is checked), with
 * a line on out saying so. On success *b is open (cp_bundle_close); on a refusal -1 with what differs and the
 * command that makes a fitting bundle: `rebuild` (the aot command without --arch) with arch, or the bundle's own. */
typedef struct cp_bundle cp_bundle;
int cp_cmd_bundle_check(const cp_plan *plan, const char *dir, const char *arch, const char *rebuild, cp_bundle *b,
                        FILE *out, char *err, int errlen);

/* `cpgen tune-kernels` (cli/cmd_tune_kernels.c): time every variant of the plan's kernels that have variants
 * (kernels.h cp_kvariants) on this GPU, record the fastest in the kernel tuning cache (gen/ktune.h), print a table
 * and, with outdir, write outdir/kernels.jsonl (one cache entry per line, every variant's time). Without a GPU it
 * says so and writes nothing. 0, or -1 with a message. */
int cp_cmd_tune_kernels(const cp_plan *plan, const char *outdir, FILE *out, char *err, int errlen);

/* `cpgen tune` (cli/cmd_tune.c). */
typedef struct {
    const char *spec_arg;        /* the spec as given: a file or a shipped name */
    const char *const *sets;     /* the command's --set overrides */
    int nsets;
    const char *const *sweeps;   /* --sweep KEY=V1,V2,... */
    int nsweeps;
    double budget;               /* seconds for the whole command */
    bool plan_only;              /* rank by the plan, measure nothing */
    const char *outdir;          /* tune.jsonl, tune.svg, tuned.lua, measure/ */
} cp_tune_opts;
/* Plan every candidate, measure the fitting ones on the GPU (when there is one and not plan_only) within the budget,
 * print the table and write the files. Returns an exit code (0, CP_EXIT_USAGE for bad axes, CP_EXIT_FAIL) with a
 * message in err when not 0. */
int cp_cmd_tune(const cp_spec *spec, const cp_tune_opts *o, FILE *out, char *err, int errlen);

#endif
