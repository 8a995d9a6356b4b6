/* jit.h: compile emitted modules to CUBIN with NVRTC, on several threads, through an on-disk cache. */
#ifndef CP_JIT_H
#define CP_JIT_H

#include <stdbool.h>
#include <stddef.h>

#include "emit.h"

typedef struct {
    char name[CP_KNAME_MAX];
    int registers;
    int shared_bytes;      /* static shared memory */
    int stack_bytes;
    int spill_stores, spill_loads; /* bytes */
} cp_entry_info;

typedef struct {
    char name[CP_KNAME_MAX];   /* module name */
    void *cubin;               /* owned */
    size_t cubin_len;
    bool from_cache;
    double seconds;            /* compile (or cache load) time */
    char source_path[1024];    /* the .cu kept beside the cubin in the cache */
    int nentries;
    cp_entry_info entries[CP_MAX_ENTRIES];
    char *warnings;            /* owned; compiler warnings and ptxas performance notes, one per line; NULL if none */
} cp_jit_module;

typedef struct {
    char arch[16];        /* "sm_90a", "sm_80"; from the device or --arch */
    int threads;          /* parallel compiles; 0 = number of cores */
    bool no_cache;        /* compile even when cached (still writes the cache) */
    char cache_dir[1024]; /* empty: $XDG_CACHE_HOME/cpgen or ~/.cache/cpgen */
    bool line_info;       /* -lineinfo */
    bool fail_on_spill;   /* `cpgen build`: fail when any entry spills registers to local memory */
} cp_jit_opts;

/* Compile n modules. out[i] matches mods[i]. Returns 0, or -1 with the first failure in err: the NVRTC log
 * and the path where the emitted source was written. On failure every out[i] is already freed. */
int cp_jit_compile(const cp_module_src *mods, int n, const cp_jit_opts *opts, cp_jit_module *out, char *err,
                   int errlen);
void cp_jit_module_free(cp_jit_module *m);

/* Load NVRTC (libnvrtc.so.13, .12 or .so; $CPGEN_NVRTC_LIB names another file) if it is not loaded yet. Called by
 * every compile; nothing else in cpgen needs NVRTC. Returns 0, or -1 with a message saying that NVRTC is missing
 * and how to run without it (an AOT bundle). A failed load is tried again at the next call. */
int cp_nvrtc_load(char *err, int errlen);
/* NVRTC's version, loading it first. Returns 0, or -1 with a message. */
int cp_nvrtc_version(int *major, int *minor, char *err, int errlen);
/* How many times this process asked for NVRTC (cp_nvrtc_load calls): a run from a bundle asks 0 times. */
int cp_nvrtc_requests(void);

/* The cache folder in use for these options (creating nothing). */
void cp_jit_cache_dir(const cp_jit_opts *opts, char *out, size_t n);

/* Per-entry resource use from a `--ptxas-options=-v` log, for the entries of m, into out[0..m->nentries).
 * Fields of an entry the log does not mention stay -1 (registers) or 0. Returns how many entries were found. */
int cp_jit_parse_ptxas_log(const char *log, const cp_module_src *m, cp_entry_info *out);
/* The same facts read from a CUBIN's ELF sections where ptxas printed none: which entries exist (the count is
 * returned), registers and static shared memory. Entries keep what out already held for the rest. */
int cp_jit_entries_from_cubin(const void *cubin, size_t len, const cp_module_src *m, cp_entry_info *out);

#endif
