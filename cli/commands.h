/* commands.h: the cpgen subcommands, each called by cli/main.c after it has parsed flags and loaded the spec.
 * Each returns 0, or -1 with a message in err. */
#ifndef CP_COMMANDS_H
#define CP_COMMANDS_H

#include <stdio.h>

#include "jit.h"
#include "plan.h"

/* `cpgen gen`: emit every module of the plan into <outdir>/<module>.cu (creating outdir), one line per file. */
int cp_cmd_gen(const cp_plan *plan, const char *outdir, char *err, int errlen);

/* `cpgen build`: emit and compile every module of the plan, then print a table of each entry's registers, shared
 * memory, stack and spills, compile times and cache use, and time a second, cached load. With opts->fail_on_spill
 * it fails when any entry spills. */
int cp_cmd_build(const cp_plan *plan, const cp_jit_opts *opts, FILE *out, char *err, int errlen);

#endif
