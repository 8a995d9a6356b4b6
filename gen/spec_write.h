/* spec_write.h: a cp_spec written back as Lua with every key spelled out (gen/spec_write.c). */
#ifndef CP_SPEC_WRITE_H
#define CP_SPEC_WRITE_H

#include <stdbool.h>

#include "spec.h"
#include "util.h"

/* Append the resolved spec to out: one key per line, every default filled in, "auto" kept where the spec said
 * "auto" (the planner resolves those the same way again); parallel.gpus = "auto" is written as the count found.
 * Loading the text gives a spec equal to s (cp_spec_same). */
void cp_spec_write_lua(const cp_spec *s, cp_str *out);
/* Append s to out as a Lua string literal: quotes, backslashes and control bytes escaped. */
void cp_lua_put_string(cp_str *out, const char *s);
/* Append s to out as the text of a -- comment: control bytes (a newline would end the comment, and the rest of the
 * line become code) written as \ddd. */
void cp_lua_put_comment(cp_str *out, const char *s);
/* Whether two specs have the same values (their file names aside). */
bool cp_spec_same(const cp_spec *a, const cp_spec *b);
/* The keys whose values differ between two texts of cp_spec_write_lua, `a` the bundle's and `b` this run's, as
 * "train.seq_len = 4096 here, 2048 in the bundle; ..." appended to out (at most max keys named). Returns how many
 * keys differ. */
int cp_spec_diff(const char *a, const char *b, cp_str *out, int max);

#endif
