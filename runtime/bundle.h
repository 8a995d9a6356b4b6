/* bundle.h: ahead-of-time bundles (`cpgen aot`): a folder holding every kernel module of one plan compiled for one
 * or more GPU architectures, so that `cpgen run BUNDLE` loads cubins and never compiles (no NVRTC needed).
 *
 * BUNDLE/manifest.json   format, cpgen version, NVRTC version, SHA-256 of the resolved spec and of the plan's
 *                        modules, architectures, and per module: its source's SHA-256 and, per architecture, the
 *                        cubin's file, size, SHA-256 and entries (registers, shared memory, stack, spills)
 * BUNDLE/spec.lua        the resolved spec (gen/spec_write.h): the bundle runs without the file it came from
 * BUNDLE/src/<module>.cu the emitted CUDA C, to read or recompile by hand
 * BUNDLE/<arch>/<module>.cubin
 *
 * A bundle is checked against the run before any GPU memory is taken: same cpgen version, the GPU's architecture
 * among its own, the same plan (the SHA-256 over every module's name and source), every cubin present and whole. */
#ifndef CP_BUNDLE_H
#define CP_BUNDLE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "jit.h"
#include "plan.h"
#include "sha256.h"
#include "util.h"

#define CP_BUNDLE_FORMAT "cpgen-bundle-1"
#define CP_BUNDLE_MAX_ARCHS 8

typedef struct {
    char file[CP_KNAME_MAX + 32]; /* relative to the bundle: <arch>/<module>.cubin */
    char sha256[CP_SHA256_HEX];
    int64_t bytes;
    int nentries;
    cp_entry_info entries[CP_MAX_ENTRIES];
} cp_bundle_cubin;

typedef struct {
    char name[CP_KNAME_MAX];
    char source_sha256[CP_SHA256_HEX];
    cp_bundle_cubin cubins[CP_BUNDLE_MAX_ARCHS]; /* index of archs[] */
} cp_bundle_module;

typedef struct cp_bundle {
    char dir[CP_PATH_MAX];
    char version[32], nvrtc[16];
    char spec_sha256[CP_SHA256_HEX], plan_sha256[CP_SHA256_HEX];
    char command[2048]; /* the command that made it */
    int narchs;
    char archs[CP_BUNDLE_MAX_ARCHS][16];
    int nmodules;
    cp_bundle_module *modules;
    char *spec_text; /* spec.lua */
} cp_bundle;

/* Whether path is a folder holding a manifest.json. */
bool cp_bundle_is(const char *path);

/* The SHA-256 over the plan's modules (name and source of each, in order of first use): equal for two plans iff
 * they need the same kernels. 0, or -1 with a message (a module that does not emit). */
int cp_bundle_plan_hash(const cp_plan *plan, char hex[CP_SHA256_HEX], char *err, int errlen);

/* Compile every module of plan for each of archs (through the JIT cache of jo, NVRTC needed) and write the bundle
 * into dir atomically: a new temporary folder beside it, renamed into place. An earlier bundle there is replaced if
 * the folder holds only what its manifest names; any other folder that is not empty (a manifest.json of another
 * program, a file of the user's beside a bundle) is refused, as is a file. command is recorded in the manifest. 0,
 * or -1 with a message. */
int cp_bundle_write(const char *dir, const cp_plan *plan, const char *const *archs, int narchs, const cp_jit_opts *jo,
                    const char *command, char *err, int errlen);

/* The bundle's architectures joined by sep ("sm_90a, sm_80") into out. */
void cp_bundle_arch_list(const cp_bundle *b, const char *sep, char *out, size_t n);

/* Read dir/manifest.json and dir/spec.lua. 0, or -1 with a message naming the file and what is wrong. */
int cp_bundle_open(const char *dir, cp_bundle *b, char *err, int errlen);
void cp_bundle_close(cp_bundle *b);

/* Whether the bundle fits a run of plan on architecture arch (NULL: the GPU is not known; every architecture's cubins
 * are checked). On a refusal returns -1 with what differs and `rebuild`, the command that makes a fitting bundle.
 * note (may be NULL) gets the spec's keys that differ without changing any kernel (train.lr, train.steps, ...). */
int cp_bundle_check(const cp_bundle *b, const cp_plan *plan, const char *arch, const char *rebuild, cp_str *note,
                    char *err, int errlen);

/* The cubins of the n emitted modules src for arch, read from the bundle and checked against the manifest's
 * SHA-256, into out[i] (as cp_jit_compile fills it, from_cache set). Never compiles. 0, or -1 with a message; on
 * failure every out[i] is freed. */
int cp_bundle_modules(const cp_bundle *b, const cp_module_src *src, int n, const char *arch, cp_jit_module *out,
                      char *err, int errlen);

#endif
