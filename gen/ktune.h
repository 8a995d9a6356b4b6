/* ktune.h: the kernel tuning cache. For each kernel with variants (kernels.h cp_kvariants) and shape, the variant
 * `cpgen tune` timed fastest on this machine, with the time of every variant, keyed by the GPU architecture, the
 * driver's version and the kernel's shape key. One JSON file per machine beside the JIT cache
 * ($XDG_CACHE_HOME/cpgen/tuning.json, else ~/.cache/cpgen/tuning.json), replaced atomically:
 *
 *   {"format": "cpgen-tuning-1", "entries": [
 *     {"arch": "sm_90a", "driver": "580.82.07", "kernel": "attention.fwd_sm90", "shape": "d128 q24 kv8 s32768 causal",
 *      "param": "FWD_STAGES", "default": 2, "winner": 3, "ms": {"2": 12.345, "3": 11.9}, "flops": 4.6e12,
 *      "cpgen": "0.1.0"}]}
 *
 * A plan takes the cached winner whose key matches (cp_ktune_apply), else the generator's default. A file that is not
 * a tuning cache of this format is ignored whole with one warning line: the cache only ever makes kernels faster, so
 * it never stops a run. */
#ifndef CP_KTUNE_H
#define CP_KTUNE_H

#include <stdio.h>

#include "json.h"
#include "kernels.h"
#include "plan.h"

#define CP_KTUNE_FORMAT "cpgen-tuning-1"

/* One kernel shape timed on one machine. */
typedef struct {
    char arch[16], driver[32];               /* the machine: "sm_90a", cp_driver_version's "580.82.07" */
    char kernel[32], shape[96], param[24];   /* the kernel, as cp_kvariants names them */
    int def, winner;                         /* the generator's default; the fastest variant */
    int n, values[CP_KVAR_MAX];              /* the variants timed */
    double ms[CP_KVAR_MAX];                  /* the median time of each, milliseconds */
    double flops;                            /* the work of one launch, for rates; 0 when not known */
    char cpgen[16];                          /* the version that timed them */
} cp_ktune_entry;

typedef struct {
    int n, cap;
    cp_ktune_entry *e;
} cp_ktune_cache;

/* The cache file in cache_dir (NULL or "": the JIT cache's folder, cp_jit_cache_dir). */
void cp_ktune_path(const char *cache_dir, char *out, size_t n);
/* Read path into c. A missing file is an empty cache; so is one that cannot be read, is not JSON, has another format
 * or an entry that is not one, with a line on warn (may be NULL) saying which file was ignored and why. Returns the
 * number of entries. */
int cp_ktune_load(const char *path, cp_ktune_cache *c, FILE *warn);
/* The entry of (arch, driver, kernel, shape), or NULL. */
const cp_ktune_entry *cp_ktune_find(const cp_ktune_cache *c, const char *arch, const char *driver, const char *kernel,
                                    const char *shape);
/* Add e, replacing an entry of the same key. */
void cp_ktune_put(cp_ktune_cache *c, const cp_ktune_entry *e);
/* Write c to path atomically, creating its folder. 0, or -1 with a message. */
int cp_ktune_save(const cp_ktune_cache *c, const char *path, char *err, int errlen);
void cp_ktune_free(cp_ktune_cache *c);

/* e as one JSON object on one line (no newline): the cache's entries, kernels.jsonl, tune.jsonl's kernel rows. */
void cp_ktune_entry_json(cp_str *out, const cp_ktune_entry *e);
/* e from such an object. 0, or -1 with what is wrong in why. */
int cp_ktune_entry_parse(const cp_json *j, cp_ktune_entry *e, char *why, int whylen);
/* e as lines of a table: each variant's time (and rate where flops is known), the default and the winner marked. */
void cp_ktune_entry_print(FILE *out, const cp_ktune_entry *e);

/* Choose the variant of every module of P that has variants: the winner cached for (arch, driver, the module's
 * shape) where one is, else the generator's default; recorded in P->kchoices with a note for the plan's output.
 * archs: the architectures the modules are built for ("sm_90a", or aot's "sm_90a,sm_80"); a variant is looked up
 * only where they include the one that runs it. driver: cp_driver_version's, "" without a driver. */
void cp_ktune_apply(cp_plan *P, const cp_ktune_cache *c, const char *archs, const char *driver);
/* The same for a run from a bundle: every module's variant is the one whose module name the bundle holds (names, n),
 * so the plan is the one the bundle was built from, whatever this machine's cache says. */
void cp_ktune_apply_bundle(cp_plan *P, const char *const *names, int n);

#endif
