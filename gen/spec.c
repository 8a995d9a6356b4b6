/* spec.c: runs a Lua spec (a file, a shipped spec embedded in the binary, or text in memory), applies --set
 * overrides, and validates the result into a cp_spec. Every mistake becomes one message that names the file,
 * the key path, what is wrong and how to fix it. */
#include "spec.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "embedded.h"
#include "util.h"

#define MIB (1024LL * 1024)
#define GIB (1024LL * MIB)
#define EMBEDDED_PREFIX "<embedded>/"
/* The machine's sizes are added and multiplied by ranks per node in the plan: 1 PiB keeps that far from overflow. */
#define MACHINE_BYTES_MAX (1LL << 50)

/* ------------------------------------------------------------------------------------------------------------
 * The schema: every section and key a spec may hold. It drives the unknown-key check (with did-you-mean) for the
 * file and for --set paths; the values themselves are read field by field below. */

/* clang-format off */
typedef struct node {
    const char *name;
    const struct node *kids; /* NULL for a value */
} node;

#define LEAF(n) {n, NULL}
#define END {NULL, NULL}
static const node SCALING_KEYS[] = {LEAF("factor"), LEAF("low_freq"), LEAF("high_freq"), LEAF("original_max"), END};
static const node ROPE_KEYS[] = {LEAF("theta"), {"scaling", SCALING_KEYS}, END};
static const node MODEL_KEYS[] = {
    LEAF("family"), LEAF("vocab"), LEAF("hidden"), LEAF("layers"), LEAF("heads"), LEAF("kv_heads"),
    LEAF("head_dim"), LEAF("ffn"), LEAF("norm_eps"), LEAF("tie_embeddings"), LEAF("qk_norm"), {"rope", ROPE_KEYS},
    END};
static const node PARALLEL_KEYS[] = {
    LEAF("gpus"), LEAF("replicas"), LEAF("ring"), LEAF("upipe_heads"), LEAF("checkpoint"), LEAF("checkpoint_every"),
    LEAF("offload"), LEAF("optimizer"), LEAF("attention_output"), LEAF("mlp_tile"), LEAF("loss_tile"), END};
static const node TRAIN_KEYS[] = {
    LEAF("seq_len"), LEAF("micro_batches"), LEAF("steps"), LEAF("lr"), LEAF("min_lr"), LEAF("warmup"),
    LEAF("weight_decay"), LEAF("clip"), LEAF("beta1"), LEAF("beta2"), LEAF("eps"), LEAF("log_every"),
    LEAF("save_every"), LEAF("keep_checkpoints"), LEAF("async_save"), LEAF("eval_every"), LEAF("eval_sequences"),
    LEAF("out_dir"), LEAF("deterministic"), LEAF("precision"), LEAF("fp8_format"), LEAF("fp8_fast_accum"),
    LEAF("fp8_scaling"), LEAF("fp8_weight_grads"), LEAF("fp8_input_grads"), LEAF("fp8_gemm"),
    END};
static const node DATA_KEYS[] = {LEAF("source"), LEAF("val"), LEAF("documents"), LEAF("positions"), LEAF("eod"), LEAF("doc_len"),
                                  END};
static const node INIT_KEYS[] = {LEAF("from"), LEAF("path"), LEAF("seed"), LEAF("std"), END};
static const node MACHINE_KEYS[] = {
    LEAF("gpu_mem"),     LEAF("host_mem"),    LEAF("reserve"),  LEAF("comm_reserve"), LEAF("host_reserve"),
    LEAF("host_runtime"), LEAF("peak_tflops"), LEAF("gemm_tflops"), LEAF("fp8_gemm_tflops"),
    LEAF("fp8_gemm_fast_tflops"),
    LEAF("fp8_block_gemm_tflops"), LEAF("fp8_block_wgrad_tflops"), LEAF("fp8_cpgen_gemm_tflops"),
    LEAF("fp8_cpgen_wgrad_tflops"), LEAF("attn_fwd_tflops"), LEAF("attn_bwd_tflops"),
    LEAF("attn_fwd_tflops_d64"), LEAF("attn_bwd_tflops_d64"), LEAF("hbm_gbps"), LEAF("fp8_cast_gbps"),
    LEAF("fp8_cast_t_gbps"), LEAF("fp8_cast_row_gbps"), LEAF("fp8_copy_gbps"), LEAF("fp8_copy_row_gbps"),
    LEAF("host_gbps"), LEAF("a2a_gbps"),
    LEAF("allgather_gbps"), LEAF("net_gbps"),
    LEAF("ranks_per_gpu"),
    LEAF("comm_reserve_shared"), LEAF("comm_reserve_p2p"), LEAF("comm_reserve_split"), LEAF("kernel_us"),
    LEAF("gemm_us"), LEAF("coll_us"), LEAF("net_us"), LEAF("host_adamw_gbps"), END};
static const node TOP_KEYS[] = {
    {"model", MODEL_KEYS}, {"parallel", PARALLEL_KEYS}, {"train", TRAIN_KEYS}, {"data", DATA_KEYS},
    {"init", INIT_KEYS}, {"machine", MACHINE_KEYS}, END};
#undef LEAF
#undef END
/* clang-format on */

static const char *const FAMILY_NAMES[] = {"llama", "qwen3", NULL};
static const char *const CKPT_NAMES[] = {"layer", "none", NULL};
static const char *const OFFLOAD_NAMES[] = {"auto", "none", "all", NULL};
static const char *const OPT_NAMES[] = {"auto", "gpu", "host", NULL};
static const char *const ATTN_KEEP_NAMES[] = {"auto", "gpu", "host", "recompute", NULL};
static const char *const INIT_NAMES[] = {"random", "hf", NULL};
/* Generators behind "synthetic:<kind>"; a new generator in the runtime is added here too. */
static const char *const SYNTHETIC_KINDS[] = {"copy", "recall", "packed", NULL};
/* in the order of cp_doc_mode and cp_pos_mode after AUTO (a key not given) */
static const char *const DOCUMENTS_NAMES[] = {"stream", "mask", NULL};
static const char *const PRECISION_NAMES[] = {"bf16", "fp8", NULL};
static const char *const FP8_FORMAT_NAMES[] = {"hybrid", "e4m3", NULL};
static const char *const FP8_SCALING_NAMES[] = {"tensor", "block", "row", NULL};
static const char *const FP8_FAST_NAMES[] = {"none", "forward", "dx", NULL};
static const char *const FP8_GRADS_NAMES[] = {"fp8", "bf16", NULL};
static const char *const FP8_GEMM_NAMES[] = {"auto", "cublaslt", "cpgen", NULL}; /* cp_fp8_gemm's order */
static const char *const POSITIONS_NAMES[] = {"sequence", "document", NULL};

/* ------------------------------------------------------------------------------------------------------------
 * Messages. */

typedef struct {
    lua_State *L;
    const char *file;        /* shown at the start of every message */
    const char *const *sets; /* --set overrides, to say when a bad value came from one */
    int nsets;
    char *err;
    int errlen;
    bool failed;
    const char *gpus_found; /* parallel.gpus = "auto": what was counted, said beside the rules it breaks */
} ctx;

/* Copies msg into err as one line of plain text: messages from Lua may hold newlines or tabs, and a spec's own
 * error() may hold any byte, terminal escape sequences included. */
static void put_err(char *err, int errlen, const char *msg) {
    if (!err || errlen <= 0) return;
    snprintf(err, (size_t)errlen, "%s", msg);
    for (char *p = err; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = ' ';
}

/* The --set override that produced (or created the table holding) the value at path, or NULL. */
static const char *set_origin(const ctx *c, const char *path) {
    if (!path) return NULL;
    size_t pl = strlen(path);
    for (int i = 0; i < c->nsets; i++) {
        const char *s = c->sets[i];
        const char *eq = strchr(s, '=');
        if (!eq) continue;
        size_t kl = (size_t)(eq - s);
        size_t n = CP_MIN(kl, pl);
        if (strncmp(s, path, n) != 0) continue;
        if (kl == pl || (kl < pl && path[kl] == '.') || (pl < kl && s[pl] == '.')) return s;
    }
    return NULL;
}

/* Writes "<file>: <path><formatted text>[ (from --set k=v)]" into the error buffer. Returns -1. */
static int __attribute__((format(printf, 3, 4))) fail(ctx *c, const char *path, const char *fmt, ...) {
    cp_str s = {0};
    cp_str_printf(&s, "%s: %s", c->file, path ? path : "");
    char body[CP_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(body, sizeof body, fmt, ap);
    va_end(ap);
    cp_str_append(&s, body, strlen(body));
    const char *set = set_origin(c, path);
    if (set) cp_str_printf(&s, " (from --set %s)", set);
    static const char *const by_count[] = {"parallel.gpus", "parallel.upipe_heads", "train.seq_len",
                                           "parallel.mlp_tile", "parallel.loss_tile"};
    for (size_t i = 0; c->gpus_found && path && i < CP_ARRAY_LEN(by_count); i++)
        if (!strcmp(path, by_count[i]))
            cp_str_printf(&s, " (parallel.gpus = \"auto\" found %s; --gpus N or CUDA_VISIBLE_DEVICES sets the count)",
                          c->gpus_found);
    put_err(c->err, c->errlen, s.data);
    cp_str_free(&s);
    c->failed = true;
    return -1;
}

/* "1, 2, 4 or 8" from a list of values. */
static void join_values(const int64_t *v, int n, char *buf, size_t len) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < n && o < len; i++) {
        const char *sep = i == 0 ? "" : (i == n - 1 ? " or " : ", ");
        int w = snprintf(buf + o, len - o, "%s%lld", sep, (long long)v[i]);
        if (w < 0) break;
        o += (size_t)w;
    }
}

/* "\"a\", \"b\" or \"c\"" from a NULL-terminated list of names. */
static void join_names(const char *const *names, char *buf, size_t len) {
    int n = 0;
    while (names[n]) n++;
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < n && o < len; i++) {
        const char *sep = i == 0 ? "" : (i == n - 1 ? " or " : ", ");
        int w = snprintf(buf + o, len - o, "%s\"%s\"", sep, names[i]);
        if (w < 0) break;
        o += (size_t)w;
    }
}

/* Close enough to be a typo: at most 2 edits (and fewer edits than letters), or one name a prefix of the other. */
static bool looks_like(const char *typed, const char *name) {
    int d = cp_edit_distance(typed, name);
    int lt = (int)strlen(typed), ln = (int)strlen(name);
    if (d <= 2 && d < lt && d < ln) return true;
    if (lt >= 2 && (strncmp(typed, name, (size_t)lt) == 0 || strncmp(typed, name, (size_t)ln) == 0)) return true;
    return false;
}

static const char *suggest_node(const char *typed, const node *list) {
    const char *best = NULL;
    int bestd = INT_MAX;
    for (const node *n = list; n->name; n++) {
        if (!looks_like(typed, n->name)) continue;
        int d = cp_edit_distance(typed, n->name);
        if (d < bestd) {
            bestd = d;
            best = n->name;
        }
    }
    return best;
}

static const char *suggest_name(const char *typed, const char *const *names) {
    const char *best = NULL;
    int bestd = INT_MAX;
    for (int i = 0; names[i]; i++) {
        if (!looks_like(typed, names[i])) continue;
        int d = cp_edit_distance(typed, names[i]);
        if (d < bestd) {
            bestd = d;
            best = names[i];
        }
    }
    return best;
}

/* Where a key of this exact name lives elsewhere in the schema ("train.seq_len"), for keys put in the wrong
 * section. Returns false if nowhere. */
static bool find_elsewhere(const char *key, const node *list, const char *prefix, char *out, size_t len) {
    for (const node *n = list; n->name; n++) {
        char path[128];
        snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", n->name);
        if (!n->kids && strcmp(n->name, key) == 0) {
            snprintf(out, len, "%s", path);
            return true;
        }
        if (n->kids && find_elsewhere(key, n->kids, path, out, len)) return true;
    }
    return false;
}

static void list_keys(const node *list, char *buf, size_t len) {
    size_t o = 0;
    buf[0] = 0;
    for (const node *n = list; n->name && o < len; n++) {
        int w = snprintf(buf + o, len - o, "%s%s", n == list ? "" : ", ", n->name);
        if (w < 0) break;
        o += (size_t)w;
    }
}

/* Describes the Lua value at idx for messages: `string "abc"`, `number 2.5`, `a table`. */
static void describe(lua_State *L, int idx, char *buf, size_t len) {
    switch (lua_type(L, idx)) {
    case LUA_TNIL: snprintf(buf, len, "nil"); break;
    case LUA_TBOOLEAN: snprintf(buf, len, "boolean %s", lua_toboolean(L, idx) ? "true" : "false"); break;
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx))
            snprintf(buf, len, "integer %lld", (long long)lua_tointeger(L, idx));
        else
            snprintf(buf, len, "number %.14g", (double)lua_tonumber(L, idx));
        break;
    case LUA_TSTRING: {
        size_t n;
        const char *s = lua_tolstring(L, idx, &n);
        if (n > 60)
            snprintf(buf, len, "string \"%.57s...\"", s);
        else
            snprintf(buf, len, "string \"%s\"", s);
        break;
    }
    default: snprintf(buf, len, "a %s", lua_typename(L, lua_type(L, idx))); break;
    }
}

/* The value alone, as it would be written in the spec: 5, 2.5, "abc". */
static void value_text(lua_State *L, int idx, char *buf, size_t len) {
    switch (lua_type(L, idx)) {
    case LUA_TNUMBER:
        if (lua_isinteger(L, idx))
            snprintf(buf, len, "%lld", (long long)lua_tointeger(L, idx));
        else
            snprintf(buf, len, "%.14g", (double)lua_tonumber(L, idx));
        break;
    case LUA_TSTRING: snprintf(buf, len, "\"%.60s\"", lua_tostring(L, idx)); break;
    case LUA_TBOOLEAN: snprintf(buf, len, "%s", lua_toboolean(L, idx) ? "true" : "false"); break;
    default: snprintf(buf, len, "(%s)", lua_typename(L, lua_type(L, idx))); break;
    }
}

/* ------------------------------------------------------------------------------------------------------------
 * Finding spec source text: files, files next to the including spec, and the copies embedded in the binary. */

typedef struct {
    char *owned; /* text read from a file (freed by the caller), or NULL */
    const char *text;
    size_t len;
    char shown[CP_PATH_MAX]; /* path for messages and chunk names: "examples/a.lua", "<embedded>/llama8b.lua" */
} source;

static bool embedded_source(const char *name, source *out) {
    const cp_embedded_file *f = cp_embedded_find(name);
    if (!f) return false;
    out->owned = NULL;
    out->text = f->text;
    out->len = f->len;
    const char *base = strncmp(name, "specs/", 6) == 0 ? name + 6 : name;
    snprintf(out->shown, sizeof out->shown, EMBEDDED_PREFIX "%s", base);
    return true;
}

/* why: what is wrong when it cannot be read (a folder, a FIFO, larger than a spec can be, missing). */
static bool file_source(const char *path, source *out, int *err, char *why, size_t whylen) {
    size_t len;
    char *text = cp_read_file_as(path, CP_FILE_SPEC, &len, why, whylen);
    if (!text) {
        *err = errno;
        return false;
    }
    out->owned = text;
    out->text = text;
    out->len = len;
    snprintf(out->shown, sizeof out->shown, "%s", path);
    return true;
}

/* A shipped spec by name ("llama8b"), from the embedded copy. */
static bool shipped_source(const char *name, source *out) {
    char full[CP_PATH_MAX];
    snprintf(full, sizeof full, "specs/%s.lua", name);
    return embedded_source(full, out);
}

/* "tiny, llama1b, ..." and the shipped spec name closest to `typed`, for messages. */
static void shipped_names(char *buf, size_t len, const char *typed, char *near, size_t nearlen) {
    size_t o = 0;
    int bestd = INT_MAX;
    buf[0] = 0;
    if (near) near[0] = 0;
    for (int i = 0; i < cp_embedded_count; i++) {
        const char *n = cp_embedded_files[i].name;
        size_t nl = strlen(n);
        if (strncmp(n, "specs/", 6) != 0 || nl < 10 || strcmp(n + nl - 4, ".lua") != 0) continue;
        char base[CP_NAME_MAX];
        snprintf(base, sizeof base, "%.*s", (int)(nl - 10), n + 6);
        int w = snprintf(buf + o, o < len ? len - o : 0, "%s%s", o ? ", " : "", base);
        if (w > 0) o = CP_MIN(o + (size_t)w, len);
        if (typed && near && looks_like(typed, base)) {
            int d = cp_edit_distance(typed, base);
            if (d < bestd) {
                bestd = d;
                snprintf(near, nearlen, "%s", base);
            }
        }
    }
}

static bool is_embedded_path(const char *p) { return strncmp(p, EMBEDDED_PREFIX, strlen(EMBEDDED_PREFIX)) == 0; }

/* dir/name with leading "./" and "../" of name folded into dir, so messages show "tests/base.lua", not
 * "tests/sub/../base.lua". */
static void join_dir(const char *dir, const char *name, char *out, size_t len) {
    char d[CP_PATH_MAX];
    snprintf(d, sizeof d, "%s", dir);
    for (;;) {
        if (strncmp(name, "./", 2) == 0) {
            name += 2;
            continue;
        }
        char *slash = strrchr(d, '/');
        const char *last = slash ? slash + 1 : d;
        if (strncmp(name, "../", 3) != 0 || !*d || strcmp(last, "..") == 0 || strcmp(last, ".") == 0) break;
        if (slash)
            *slash = 0;
        else
            d[0] = 0;
        name += 3;
    }
    if (*d)
        snprintf(out, len, "%s/%s", d, name);
    else
        snprintf(out, len, "%s", name);
}

/* Finds what dofile(name) or cpgen.load(path) means when called from a chunk in folder `dir` (NULL if unknown):
 * the name as given (relative to the working folder), then next to the including spec, then the embedded copy.
 * On failure writes what was tried into why. */
static bool find_source(const char *name, const char *dir, source *out, char *why, size_t whylen) {
    int e = ENOENT;
    bool relative = name[0] != '/';
    if (dir && is_embedded_path(dir) && relative) {
        /* A shipped spec including another: both live in the binary. */
        char full[CP_PATH_MAX];
        snprintf(full, sizeof full, "specs/%s", name);
        if (embedded_source(full, out) || embedded_source(name, out)) return true;
    }
    char why1[256], why2[256];
    if (file_source(name, out, &e, why1, sizeof why1)) return true;
    char joined[CP_PATH_MAX] = "";
    if (relative && dir && *dir && !is_embedded_path(dir)) {
        join_dir(dir, name, joined, sizeof joined);
        if (file_source(joined, out, &e, why2, sizeof why2)) return true;
    }
    if (relative) {
        char full[CP_PATH_MAX];
        snprintf(full, sizeof full, "specs/%s", name);
        if (embedded_source(name, out) || embedded_source(full, out)) return true;
    }
    if (*joined)
        snprintf(why, whylen, "cannot read '%s' (%s) nor '%s' (%s)", name, why1, joined, why2);
    else
        snprintf(why, whylen, "cannot read '%s' (%s)", name, why1);
    return false;
}

/* ------------------------------------------------------------------------------------------------------------
 * The Lua side: dofile, cpgen.load, cpgen.extend, print, and the message handler for runtime errors. */

/* Folder of the Lua function that called the running C function, for relative includes. */
static void caller_dir(lua_State *L, char *dir, size_t len) {
    lua_Debug ar;
    dir[0] = 0;
    if (!lua_getstack(L, 1, &ar) || !lua_getinfo(L, "S", &ar) || ar.source[0] != '@') return;
    const char *src = ar.source + 1;
    const char *slash = strrchr(src, '/');
    if (slash) snprintf(dir, len, "%.*s", (int)(slash - src), src);
}

/* Loads the chunk of src onto the stack (text only); raises the Lua error on a syntax error. Frees src. */
static void load_source(lua_State *L, source *src) {
    char chunk[CP_PATH_MAX + 1];
    snprintf(chunk, sizeof chunk, "@%s", src->shown);
    if (src->len > 0 && src->text[0] == LUA_SIGNATURE[0]) { /* Lua's own message would not name the file */
        free(src->owned);
        src->owned = NULL;
        luaL_error(L, "%s is a binary chunk (bytecode), refused: a spec loads Lua text only", chunk + 1);
    }
    int st = luaL_loadbufferx(L, src->text, src->len, chunk, "t");
    free(src->owned);
    src->owned = NULL;
    if (st != LUA_OK) lua_error(L);
}

static int l_dofile(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    char dir[CP_PATH_MAX], why[3 * CP_PATH_MAX];
    caller_dir(L, dir, sizeof dir);
    source src;
    if (!find_source(name, dir, &src, why, sizeof why)) return luaL_error(L, "dofile: %s", why);
    load_source(L, &src);
    lua_call(L, 0, LUA_MULTRET);
    return lua_gettop(L) - 1;
}

static int l_load(lua_State *L) {
    const char *name = luaL_checkstring(L, 1);
    source src;
    size_t nl = strlen(name);
    bool is_name = !strchr(name, '/') && !(nl > 4 && strcmp(name + nl - 4, ".lua") == 0);
    if (is_name) {
        if (!shipped_source(name, &src)) {
            char names[512], near[CP_NAME_MAX];
            shipped_names(names, sizeof names, name, near, sizeof near);
            if (*near)
                return luaL_error(L, "cpgen.load: no shipped spec named '%s'; did you mean '%s'? (shipped: %s)", name,
                                  near, names);
            return luaL_error(L, "cpgen.load: no shipped spec named '%s' (shipped: %s; or give a path ending in .lua)",
                              name, names);
        }
    } else {
        char dir[CP_PATH_MAX], why[3 * CP_PATH_MAX];
        caller_dir(L, dir, sizeof dir);
        if (!find_source(name, dir, &src, why, sizeof why)) return luaL_error(L, "cpgen.load: %s", why);
    }
    load_source(L, &src);
    lua_call(L, 0, 1);
    if (!lua_istable(L, -1))
        return luaL_error(L, "cpgen.load('%s'): the spec returned %s, not a table", name, luaL_typename(L, -1));
    return 1;
}

#define MAX_DEPTH 64

/* Pushes a deep copy of the table at idx (keys are shared, table values are copied). */
static void deep_copy(lua_State *L, int idx, int depth) {
    if (depth > MAX_DEPTH)
        luaL_error(L, "cpgen.extend: tables nested more than %d deep (does a table contain itself?)", MAX_DEPTH);
    luaL_checkstack(L, 6, "cpgen.extend");
    idx = lua_absindex(L, idx);
    lua_newtable(L);
    int dst = lua_gettop(L);
    lua_pushnil(L);
    while (lua_next(L, idx)) {
        if (lua_type(L, -1) == LUA_TTABLE) {
            deep_copy(L, -1, depth + 1);
            lua_replace(L, -2);
        }
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_rawset(L, dst);
    }
}

/* Merges the table at src into the table at dst (a private copy): tables merge key by key, anything else replaces. */
static void merge_into(lua_State *L, int dst, int src, int depth) {
    if (depth > MAX_DEPTH)
        luaL_error(L, "cpgen.extend: tables nested more than %d deep (does a table contain itself?)", MAX_DEPTH);
    luaL_checkstack(L, 6, "cpgen.extend");
    dst = lua_absindex(L, dst);
    src = lua_absindex(L, src);
    lua_pushnil(L);
    while (lua_next(L, src)) {
        if (lua_type(L, -1) == LUA_TTABLE) {
            lua_pushvalue(L, -2);
            if (lua_rawget(L, dst) == LUA_TTABLE) {
                merge_into(L, -1, -2, depth + 1);
                lua_pop(L, 2);
                continue;
            }
            lua_pop(L, 1);
            deep_copy(L, -1, depth + 1);
            lua_replace(L, -2);
        }
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_rawset(L, dst);
    }
}

/* cpgen.extend(base, overrides, ...): a new table, base deep-merged with each override in turn. Inputs are not
 * changed, so one base can feed many variants. */
static int l_extend(lua_State *L) {
    int n = lua_gettop(L);
    if (n < 1) return luaL_error(L, "cpgen.extend: expected cpgen.extend(base, overrides)");
    for (int i = 1; i <= n; i++) {
        if (!lua_istable(L, i))
            return luaL_error(L, "cpgen.extend: argument %d is %s, expected a table%s", i, luaL_typename(L, i),
                              i == 1 ? " (the base spec, e.g. cpgen.load(\"llama8b\"))" : " of overrides");
    }
    deep_copy(L, 1, 0);
    int out = lua_gettop(L);
    for (int i = 2; i <= n; i++) merge_into(L, out, i, 0);
    lua_settop(L, out);
    return 1;
}

/* print goes to stderr so that a spec's debugging output never mixes with a command's output (plan --json). */
static int l_print(lua_State *L) {
    int n = lua_gettop(L);
    for (int i = 1; i <= n; i++) {
        size_t len;
        const char *s = luaL_tolstring(L, i, &len);
        if (i > 1) fputc('\t', stderr);
        fwrite(s, 1, len, stderr);
        lua_pop(L, 1);
    }
    fputc('\n', stderr);
    return 0;
}

/* Length of a leading "file:line:" in msg, or 0. */
static size_t location_len(const char *msg) {
    const char *colon = strchr(msg, ':');
    while (colon) {
        const char *p = colon + 1;
        if (isdigit((unsigned char)*p)) {
            while (isdigit((unsigned char)*p)) p++;
            if (*p == ':') return (size_t)(p + 1 - msg);
        }
        colon = strchr(colon + 1, ':');
    }
    return 0;
}

/* Number of active frames. lua_getstack costs O(level), so after a stack overflow (hundreds of thousands of
 * frames) a level-by-level walk would be quadratic; this search is O(depth log depth). */
static int stack_depth(lua_State *L) {
    lua_Debug ar;
    if (!lua_getstack(L, 1, &ar)) return 0;
    int lo = 1, hi = 2;
    while (lua_getstack(L, hi, &ar)) {
        lo = hi;
        hi = hi > INT_MAX / 2 ? INT_MAX : hi * 2;
    }
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (lua_getstack(L, mid, &ar))
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* The file and line of a frame running a chunk loaded from a file (or embedded spec). */
static bool spec_frame(lua_State *L, int level, char *src, size_t len, int *line) {
    lua_Debug ar;
    if (!lua_getstack(L, level, &ar) || !lua_getinfo(L, "Sl", &ar)) return false;
    if (ar.currentline <= 0 || ar.source[0] != '@') return false;
    snprintf(src, len, "%s", ar.short_src);
    *line = ar.currentline;
    return true;
}

/* Message handler for runtime errors: makes sure the message starts with the file and line of the innermost spec
 * frame (errors raised from C carry none), and when that is an included file, names the top spec that loaded it. */
static int msgh(lua_State *L) {
    const char *msg = lua_tostring(L, 1);
    if (!msg) msg = lua_pushfstring(L, "error object is a %s value, not a message", luaL_typename(L, 1));
    char first[LUA_IDSIZE] = "", outer[LUA_IDSIZE] = "";
    int first_line = -1, outer_line = -1;
    int depth = stack_depth(L);
    for (int level = 1; level <= depth; level++)
        if (spec_frame(L, level, first, sizeof first, &first_line)) break;
    for (int level = depth; level >= 1; level--)
        if (spec_frame(L, level, outer, sizeof outer, &outer_line)) break;
    size_t loc = location_len(msg);
    if (!loc && first_line > 0) {
        msg = lua_pushfstring(L, "%s:%d: %s", first, first_line, msg);
        loc = location_len(msg);
    }
    if (loc && outer_line > 0) {
        size_t flen = strlen(outer);
        const char *digits = msg + loc - 2;
        while (digits > msg && isdigit((unsigned char)digits[-1])) digits--;
        size_t mlen = (size_t)(digits - 1 - msg);
        if (mlen != flen || strncmp(msg, outer, flen) != 0)
            msg = lua_pushfstring(L, "%s (loaded from %s:%d)", msg, outer, outer_line);
    }
    lua_pushstring(L, msg);
    return 1;
}

/* A spec is a program and may loop forever; a load that runs this long is stopped with a message instead. */
static double spec_time_limit_s = 10.0;
static cp_gpu_counter gpu_counter;

void cp_spec_set_gpu_counter(cp_gpu_counter counter) { gpu_counter = counter; }

void cp_spec_set_time_limit(double seconds) { spec_time_limit_s = seconds; }
_Static_assert(LUA_EXTRASPACE >= sizeof(double), "the load deadline lives in the Lua state's extra space");

/* Seconds the loader process (below) spent waiting for cpgen to count GPUs: not the spec's time. */
static double waited_for_parent_s;

static void time_hook(lua_State *L, lua_Debug *ar) {
    (void)ar;
    double deadline;
    memcpy(&deadline, lua_getextraspace(L), sizeof deadline);
    if (cp_now() - waited_for_parent_s > deadline) {
        char limit[32]; /* Lua's own %f would write 10 as 10.0 */
        snprintf(limit, sizeof limit, "%g", spec_time_limit_s);
        luaL_error(L, "the spec ran for more than %s s; does it loop forever?", limit);
    }
}

/* Lua runs finalizers with hooks off, so a __gc that loops would never meet the time limit; a spec has no use for
 * finalizers, so setmetatable refuses a metatable that has one. */
static int l_setmetatable(lua_State *L) {
    if (lua_istable(L, 2) && lua_getfield(L, 2, "__gc") != LUA_TNIL)
        return luaL_error(L, "setmetatable: a spec may not use __gc finalizers");
    lua_settop(L, 2);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, 2, 1);
    return 1;
}

/* load(chunk [, name [, mode [, env]]]) with the mode always "t"; a string that starts as bytecode gets a message
 * that says why, in load's own way (nil and the message). */
static int l_load_text(lua_State *L) {
    size_t n;
    const char *s = lua_type(L, 1) == LUA_TSTRING ? lua_tolstring(L, 1, &n) : NULL;
    if (s && n > 0 && s[0] == LUA_SIGNATURE[0]) {
        luaL_pushfail(L);
        lua_pushliteral(L, "load: a binary chunk (bytecode) is refused: a spec loads Lua text only");
        return 2;
    }
    if (lua_gettop(L) < 3) lua_settop(L, 3); /* not 4: an env given as nil differs from none */
    lua_pushliteral(L, "t");
    lua_replace(L, 3);
    lua_pushvalue(L, lua_upvalueindex(1));
    lua_insert(L, 1);
    lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
    return lua_gettop(L);
}

static int l_no_dump(lua_State *L) {
    return luaL_error(L, "string.dump: a spec may not make bytecode (cpgen loads Lua text only); keep the function "
                         "itself, or its source text for load");
}

static void open_libs(lua_State *L) {
    /* No io, os or package: a spec computes a table; it has no business touching files except through dofile. */
    static const luaL_Reg libs[] = {{LUA_GNAME, luaopen_base},       {LUA_STRLIBNAME, luaopen_string},
                                    {LUA_TABLIBNAME, luaopen_table}, {LUA_MATHLIBNAME, luaopen_math},
                                    {LUA_UTF8LIBNAME, luaopen_utf8}, {NULL, NULL}};
    for (const luaL_Reg *l = libs; l->name; l++) {
        luaL_requiref(L, l->name, l->func, 1);
        lua_pop(L, 1);
    }
    lua_pushnil(L);
    lua_setglobal(L, "loadfile");
    /* Bytecode skips the checks Lua's compiler makes, so a tampered binary chunk corrupts memory: every way a
     * spec runs code (the file itself, dofile, cpgen.load, load) takes text only, and string.dump, which makes
     * bytecode, is replaced by a function that says so. */
    lua_getglobal(L, "load");
    lua_pushcclosure(L, l_load_text, 1);
    lua_setglobal(L, "load");
    lua_getglobal(L, LUA_STRLIBNAME);
    lua_pushcfunction(L, l_no_dump);
    lua_setfield(L, -2, "dump");
    lua_pop(L, 1);
    lua_getglobal(L, "setmetatable");
    lua_pushcclosure(L, l_setmetatable, 1);
    lua_setglobal(L, "setmetatable");
    lua_pushcfunction(L, l_dofile);
    lua_setglobal(L, "dofile");
    lua_pushcfunction(L, l_print);
    lua_setglobal(L, "print");
    lua_newtable(L);
    lua_pushcfunction(L, l_extend);
    lua_setfield(L, -2, "extend");
    lua_pushcfunction(L, l_load);
    lua_setfield(L, -2, "load");
    lua_pushstring(L, CP_VERSION);
    lua_setfield(L, -2, "version");
    lua_setglobal(L, "cpgen");
}

/* ------------------------------------------------------------------------------------------------------------
 * Structure check: unknown sections and keys, list entries, sections that are not tables. Runs before any value
 * is read so that a typo is reported as a typo, not as the missing key it hides. */

static int walk(ctx *c, int t, const node *schema, const char *path) {
    lua_State *L = c->L;
    luaL_checkstack(L, 8, "spec check");
    t = lua_absindex(L, t);
    char unknown[128] = "";
    lua_pushnil(L);
    while (lua_next(L, t)) {
        if (lua_type(L, -2) != LUA_TSTRING) {
            char v[96], k[64];
            describe(L, -1, v, sizeof v);
            value_text(L, -2, k, sizeof k);
            if (!*path)
                return fail(c, NULL,
                            "the spec table has an entry [%s] = %s; write named sections such as "
                            "model = { ... }",
                            k, v);
            return fail(c, path, "[%s] = %s: unexpected list entry; write name = value pairs such as %s = ...", k, v,
                        schema[0].name);
        }
        const char *key = lua_tostring(L, -2);
        bool known = false;
        for (const node *n = schema; n->name; n++)
            if (strcmp(n->name, key) == 0) known = true;
        if (!known && (!*unknown || strcmp(key, unknown) < 0)) snprintf(unknown, sizeof unknown, "%s", key);
        lua_pop(L, 1);
    }
    if (*unknown) {
        char full[256], keys[512], where[128];
        snprintf(full, sizeof full, "%s%s%s", path, *path ? "." : "", unknown);
        const char *near = suggest_node(unknown, schema);
        list_keys(schema, keys, sizeof keys);
        const char *what = *path ? "unknown key" : "unknown section";
        if (near) return fail(c, full, ": %s; did you mean '%s'?", what, near);
        if (*path && find_elsewhere(unknown, TOP_KEYS, "", where, sizeof where))
            return fail(c, full, ": %s in %s; %s belongs elsewhere: write it as %s", what, path, unknown, where);
        return fail(c, full, ": %s; %s are: %s", what, *path ? "the keys here" : "the sections", keys);
    }
    for (const node *n = schema; n->name; n++) {
        if (!n->kids) continue;
        char full[256];
        snprintf(full, sizeof full, "%s%s%s", path, *path ? "." : "", n->name);
        lua_pushstring(L, n->name);
        int ty = lua_rawget(L, t);
        bool optional_off = strcmp(n->name, "scaling") == 0 && ty == LUA_TBOOLEAN && !lua_toboolean(L, -1);
        if (ty == LUA_TTABLE) {
            if (walk(c, -1, n->kids, full) < 0) return -1;
        } else if (ty != LUA_TNIL && !optional_off) {
            char v[96];
            describe(L, -1, v, sizeof v);
            return fail(c, full, ": expected a table { ... }%s, got %s",
                        strcmp(n->name, "scaling") == 0 ? " or false" : "", v);
        }
        lua_pop(L, 1);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------
 * --set overrides. */

static int apply_set(ctx *c, int top, const char *set) {
    lua_State *L = c->L;
    const char *eq = strchr(set, '=');
    if (!eq || eq == set) return fail(c, NULL, "--set %s: expected key.path=value, e.g. --set train.seq_len=1M", set);
    char key[256];
    if ((size_t)(eq - set) >= sizeof key) return fail(c, NULL, "--set %s: key path too long", set);
    snprintf(key, sizeof key, "%.*s", (int)(eq - set), set);
    const char *value = eq + 1;

    const node *schema = TOP_KEYS;
    char done[sizeof key + 8] = ""; /* at most the key path itself */
    lua_pushvalue(L, top);
    char *seg = key;
    while (seg) {
        char *next = strchr(seg, '.');
        if (next) *next++ = 0;
        if (!*seg) return fail(c, NULL, "--set %s: empty name in the key path; write it as section.key=value", set);
        const node *n = NULL;
        for (const node *k = schema; k->name; k++)
            if (strcmp(k->name, seg) == 0) n = k;
        if (!n) {
            const char *near = suggest_node(seg, schema);
            char keys[512];
            list_keys(schema, keys, sizeof keys);
            const char *what = *done ? "unknown key" : "unknown section";
            if (near)
                return fail(c, NULL, "--set %s: %s '%s'%s%s; did you mean '%s'?", set, what, seg, *done ? " in " : "",
                            done, near);
            return fail(c, NULL, "--set %s: %s '%s'%s%s; valid names there: %s", set, what, seg, *done ? " in " : "",
                        done, keys);
        }
        size_t dl = strlen(done);
        snprintf(done + dl, sizeof done - dl, "%s%s", dl ? "." : "", seg);
        if (!next) {
            /* Raw sets, like the raw reads below: a metatable in the spec must not change what --set means. */
            lua_pushstring(L, seg);
            if (!strcmp(value, "true"))
                lua_pushboolean(L, 1);
            else if (!strcmp(value, "false"))
                lua_pushboolean(L, 0);
            else if (lua_stringtonumber(L, value) == 0)
                lua_pushstring(L, value);
            lua_rawset(L, -3);
            lua_pop(L, 1);
            return 0;
        }
        if (!n->kids) return fail(c, NULL, "--set %s: %s is a value, not a section; use --set %s=...", set, done, done);
        lua_pushstring(L, seg);
        int ty = lua_rawget(L, -2);
        if (ty == LUA_TNIL || (ty == LUA_TBOOLEAN && !lua_toboolean(L, -1))) {
            lua_pop(L, 1);
            lua_newtable(L);
            lua_pushstring(L, seg);
            lua_pushvalue(L, -2);
            lua_rawset(L, -4);
        } else if (ty != LUA_TTABLE) {
            char v[96];
            describe(L, -1, v, sizeof v);
            return fail(c, NULL, "--set %s: %s is %s in the spec, not a table", set, done, v);
        }
        lua_remove(L, -2);
        schema = n->kids;
        seg = next;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------
 * Reading values. Each getter returns 0 when the key was read, 1 when it is absent (nil), -1 on error. */

enum { INT_PLAIN, INT_LEN, INT_BYTES };

static int push_field(lua_State *L, int t, const char *key) {
    lua_pushstring(L, key);
    return lua_rawget(L, t);
}

static void join_path(char *buf, size_t len, const char *sec, const char *key) {
    snprintf(buf, len, "%s.%s", sec, key);
}

/* Integers: Lua integers, floats with integral values (1e6), and for lengths/sizes strings like "128K"/"141G".
 * With allow_auto, "auto" gives *is_auto = true. */
static int get_int_ex(ctx *c, int t, const char *sec, const char *key, int kind, bool allow_auto, int64_t lo,
                      int64_t hi, int64_t *out, bool *is_auto) {
    lua_State *L = c->L;
    char path[128], v[96];
    join_path(path, sizeof path, sec, key);
    if (is_auto) *is_auto = false;
    int ty = push_field(L, t, key);
    const char *want = kind == INT_LEN     ? (allow_auto ? "\"auto\" or a length such as 4096, \"128K\" or \"1M\""
                                                         : "a length such as 4096, \"128K\" or \"1M\"")
                       : kind == INT_BYTES ? "a size such as \"141G\" or \"80GiB\""
                                           : (allow_auto ? "\"auto\" or an integer" : "an integer");
    int64_t r = 0;
    if (ty == LUA_TNIL) {
        lua_pop(L, 1);
        return 1;
    } else if (ty == LUA_TNUMBER) {
        if (lua_isinteger(L, -1))
            r = (int64_t)lua_tointeger(L, -1);
        else {
            double d = (double)lua_tonumber(L, -1);
            if (!isfinite(d) || d != floor(d) || fabs(d) >= 9.2e18) {
                describe(L, -1, v, sizeof v);
                return fail(c, path, ": expected %s, got %s", want, v);
            }
            r = (int64_t)d;
        }
    } else if (ty == LUA_TSTRING) {
        const char *s = lua_tostring(L, -1);
        if (allow_auto && strcmp(s, "auto") == 0) {
            if (is_auto) *is_auto = true;
            lua_pop(L, 1);
            *out = 0;
            return 0;
        }
        bool ok = kind == INT_LEN ? cp_parse_length(s, &r) : kind == INT_BYTES ? cp_parse_bytes(s, &r) : false;
        if (!ok) {
            describe(L, -1, v, sizeof v);
            return fail(c, path, ": expected %s%s, got %s", want,
                        kind == INT_LEN     ? " (K = 1024, M = 1024K)"
                        : kind == INT_BYTES ? " (powers of 1024)"
                                            : "",
                        v);
        }
    } else {
        describe(L, -1, v, sizeof v);
        return fail(c, path, ": expected %s, got %s", want, v);
    }
    lua_pop(L, 1);
    if (r < lo) return fail(c, path, " = %lld: must be at least %lld", (long long)r, (long long)lo);
    if (r > hi) return fail(c, path, " = %lld: too large (at most %lld)", (long long)r, (long long)hi);
    *out = r;
    return 0;
}

static int get_int(ctx *c, int t, const char *sec, const char *key, int kind, int64_t lo, int64_t hi, int64_t *out) {
    return get_int_ex(c, t, sec, key, kind, false, lo, hi, out, NULL);
}

/* An int field of the struct: the range of int (semantic ranges are checked in validate). */
static int get_cint(ctx *c, int t, const char *sec, const char *key, int *out) {
    int64_t v;
    int r = get_int(c, t, sec, key, INT_PLAIN, INT_MIN, INT_MAX, &v);
    if (r == 0) *out = (int)v;
    return r;
}

static int get_num(ctx *c, int t, const char *sec, const char *key, double *out) {
    lua_State *L = c->L;
    char path[128], v[96];
    join_path(path, sizeof path, sec, key);
    int ty = push_field(L, t, key);
    if (ty == LUA_TNIL) {
        lua_pop(L, 1);
        return 1;
    }
    if (ty != LUA_TNUMBER) {
        describe(L, -1, v, sizeof v);
        return fail(c, path, ": expected a number, got %s", v);
    }
    double d = (double)lua_tonumber(L, -1);
    lua_pop(L, 1);
    if (!isfinite(d)) return fail(c, path, " = %g: must be a finite number", d);
    *out = d;
    return 0;
}

static int get_bool(ctx *c, int t, const char *sec, const char *key, bool *out) {
    lua_State *L = c->L;
    char path[128], v[96];
    join_path(path, sizeof path, sec, key);
    int ty = push_field(L, t, key);
    if (ty == LUA_TNIL) {
        lua_pop(L, 1);
        return 1;
    }
    if (ty != LUA_TBOOLEAN) {
        describe(L, -1, v, sizeof v);
        return fail(c, path, ": expected true or false, got %s", v);
    }
    *out = lua_toboolean(L, -1);
    lua_pop(L, 1);
    return 0;
}

static int get_str(ctx *c, int t, const char *sec, const char *key, char *out, size_t len) {
    lua_State *L = c->L;
    char path[128], v[96];
    join_path(path, sizeof path, sec, key);
    int ty = push_field(L, t, key);
    if (ty == LUA_TNIL) {
        lua_pop(L, 1);
        return 1;
    }
    if (ty != LUA_TSTRING) {
        describe(L, -1, v, sizeof v);
        return fail(c, path, ": expected a string, got %s", v);
    }
    size_t n;
    const char *s = lua_tolstring(L, -1, &n);
    if (n >= len) return fail(c, path, ": too long (%zu bytes; at most %zu)", n, len - 1);
    if (strlen(s) != n) return fail(c, path, ": contains a zero byte");
    /* a path or source with a newline or an escape sequence is a slip, and would garble every message naming it */
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return fail(c, path, ": contains a control character (byte %#04x at offset %zu); remove it",
                        (unsigned char)s[i], i);
    memcpy(out, s, n + 1);
    lua_pop(L, 1);
    return 0;
}

static int get_enum(ctx *c, int t, const char *sec, const char *key, const char *const *names, int *out) {
    lua_State *L = c->L;
    char path[128], v[96], list[256];
    join_path(path, sizeof path, sec, key);
    join_names(names, list, sizeof list);
    int ty = push_field(L, t, key);
    if (ty == LUA_TNIL) {
        lua_pop(L, 1);
        return 1;
    }
    if (ty != LUA_TSTRING) {
        describe(L, -1, v, sizeof v);
        return fail(c, path, ": expected one of %s, got %s", list, v);
    }
    const char *s = lua_tostring(L, -1);
    for (int i = 0; names[i]; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            lua_pop(L, 1);
            return 0;
        }
    }
    const char *near = suggest_name(s, names);
    if (near) return fail(c, path, " = \"%.60s\": not a valid choice; did you mean \"%s\"? (one of %s)", s, near, list);
    return fail(c, path, " = \"%.60s\": not a valid choice; use one of %s", s, list);
}

/* get_enum, or a boolean read as the choice if_false or if_true */
static int get_enum_or_bool(ctx *c, int t, const char *sec, const char *key, const char *const *names, int if_false,
                            int if_true, int *out) {
    if (push_field(c->L, t, key) == LUA_TBOOLEAN) {
        *out = lua_toboolean(c->L, -1) ? if_true : if_false;
        lua_pop(c->L, 1);
        return 0;
    }
    lua_pop(c->L, 1);
    return get_enum(c, t, sec, key, names, out);
}

static int missing(ctx *c, const char *sec, const char *key, const char *hint) {
    char path[128];
    join_path(path, sizeof path, sec, key);
    return fail(c, path, " is missing; it is required (%s)", hint);
}

/* Pushes section `name` of the spec (a table, or nil when absent and optional) and returns its stack index. */
static int section(ctx *c, int top, const char *name, bool required, const char *hint, int *idx) {
    lua_State *L = c->L;
    int ty = push_field(L, top, name);
    if (ty == LUA_TNIL && required) return fail(c, name, " section is missing; every spec needs %s", hint);
    if (ty == LUA_TNIL) {
        lua_pop(L, 1);
        lua_newtable(L);
    }
    *idx = lua_gettop(L);
    return 0;
}

#define TRY(x)                                                                                                         \
    do {                                                                                                               \
        if ((x) < 0) return -1;                                                                                        \
    } while (0)

static int read_model(ctx *c, int top, cp_model *m) {
    lua_State *L = c->L;
    int t, r, fam = CP_FAMILY_LLAMA;
    TRY(section(c, top, "model", true,
                "model = { family = \"llama\", vocab = ..., hidden = ..., layers = ..., heads = ..., ffn = ... }", &t));
    TRY(get_enum(c, t, "model", "family", FAMILY_NAMES, &fam));
    m->family = (cp_family)fam;
    /* Upper bounds keep parameter counts far from int64 overflow; no real model comes near them. */
    TRY(r = get_int(c, t, "model", "vocab", INT_PLAIN, INT64_MIN, 1LL << 24, &m->vocab));
    if (r) return missing(c, "model", "vocab", "the vocabulary size, e.g. vocab = 128256");
    TRY(r = get_int(c, t, "model", "hidden", INT_PLAIN, INT64_MIN, 1LL << 20, &m->hidden));
    if (r) return missing(c, "model", "hidden", "the model width, e.g. hidden = 4096");
    TRY(r = get_int(c, t, "model", "layers", INT_PLAIN, INT64_MIN, 1LL << 16, &m->layers));
    if (r) return missing(c, "model", "layers", "the number of transformer layers, e.g. layers = 32");
    TRY(r = get_int(c, t, "model", "heads", INT_PLAIN, INT64_MIN, 1LL << 12, &m->heads));
    if (r) return missing(c, "model", "heads", "the number of query heads, e.g. heads = 32");
    m->kv_heads = m->heads;
    TRY(get_int(c, t, "model", "kv_heads", INT_PLAIN, INT64_MIN, 1LL << 12, &m->kv_heads));
    TRY(r = get_int(c, t, "model", "head_dim", INT_PLAIN, INT64_MIN, 1LL << 12, &m->head_dim));
    if (r) {
        /* Without head_dim the width is split evenly over the heads. */
        if (m->heads >= 1 && m->hidden >= 1 && m->hidden % m->heads != 0)
            return fail(c, "model.hidden",
                        " = %lld: must be divisible by heads (%lld) when model.head_dim is not given (head_dim "
                        "defaults to hidden/heads); set head_dim = 64 or 128, or change hidden or heads",
                        (long long)m->hidden, (long long)m->heads);
        m->head_dim = m->heads >= 1 ? m->hidden / m->heads : 0;
    }
    TRY(r = get_int(c, t, "model", "ffn", INT_PLAIN, INT64_MIN, 1LL << 22, &m->ffn));
    if (r) return missing(c, "model", "ffn", "the MLP inner size, e.g. ffn = 14336");
    bool qwen = m->family == CP_FAMILY_QWEN3;
    m->norm_eps = qwen ? 1e-6 : 1e-5;
    TRY(get_num(c, t, "model", "norm_eps", &m->norm_eps));
    m->tie_embeddings = false;
    TRY(get_bool(c, t, "model", "tie_embeddings", &m->tie_embeddings));
    m->qk_norm = qwen;
    TRY(get_bool(c, t, "model", "qk_norm", &m->qk_norm));

    m->rope_theta = qwen ? 1e6 : 500000;
    memset(&m->rope_scaling, 0, sizeof m->rope_scaling);
    if (push_field(L, t, "rope") == LUA_TTABLE) {
        int rt = lua_gettop(L);
        TRY(get_num(c, rt, "model.rope", "theta", &m->rope_theta));
        if (push_field(L, rt, "scaling") == LUA_TTABLE) {
            int st = lua_gettop(L);
            cp_rope_scaling *sc = &m->rope_scaling;
            sc->enabled = true;
            sc->low_freq = 1;
            sc->high_freq = 4;
            sc->original_max = 8192;
            TRY(r = get_num(c, st, "model.rope.scaling", "factor", &sc->factor));
            if (r)
                return missing(c, "model.rope.scaling", "factor",
                               "the Llama-3 frequency scaling factor, e.g. factor = 8; or remove scaling");
            TRY(get_num(c, st, "model.rope.scaling", "low_freq", &sc->low_freq));
            TRY(get_num(c, st, "model.rope.scaling", "high_freq", &sc->high_freq));
            TRY(get_int(c, st, "model.rope.scaling", "original_max", INT_LEN, INT64_MIN, INT64_MAX, &sc->original_max));
        }
        lua_pop(L, 1);
    }
    lua_pop(L, 1);
    lua_pop(L, 1);
    return 0;
}

static int read_parallel(ctx *c, int top, cp_parallel *p) {
    int t;
    int64_t v;
    bool is_auto;
    TRY(section(c, top, "parallel", false, "", &t));
    /* replicas and ring first: "auto" GPUs are counted for the whole run and shared out among its groups */
    const char *groups[] = {"replicas", "ring"};
    int *gdst[] = {&p->replicas, &p->ring};
    for (int i = 0; i < 2; i++) {
        *gdst[i] = 1;
        int r = get_int(c, t, "parallel", groups[i], INT_PLAIN, INT_MIN, INT_MAX, &v);
        TRY(r);
        if (r == 0) {
            if (v < 1 || v > 4096) {
                char path[64];
                join_path(path, sizeof path, "parallel", groups[i]);
                return fail(c, path, " = %lld: must be between 1 and 4096 (1: %s)", (long long)v,
                            i ? "no ring, the sequence stays within one group" : "one group trains alone");
            }
            *gdst[i] = (int)v;
        }
    }
    p->gpus = 1;
    p->gpus_auto = false;
    p->gpus_found[0] = 0;
    int r = get_int_ex(c, t, "parallel", "gpus", INT_PLAIN, true, INT_MIN, INT_MAX, &v, &is_auto);
    TRY(r);
    if (r == 0 && is_auto) {
        p->gpus_auto = true;
        int counted = 1;
        if (gpu_counter) counted = gpu_counter(p->gpus_found, sizeof p->gpus_found);
        else snprintf(p->gpus_found, sizeof p->gpus_found, "1 GPU (nothing counted them)");
        int groups_n = p->replicas * p->ring;
        if (counted % groups_n != 0)
            return fail(c, "parallel.gpus", " = \"auto\" found %s, which replicas (%d) x ring (%d) = %d groups cannot "
                        "share equally; start a multiple of %d processes, or give replicas, ring and gpus explicitly",
                        p->gpus_found, p->replicas, p->ring, groups_n, groups_n);
        p->gpus = counted / groups_n; /* "auto" is the GPUs of one group */
    } else if (r == 0) {
        p->gpus = (int)v;
    }
    p->upipe_heads = 0;
    r = get_int_ex(c, t, "parallel", "upipe_heads", INT_PLAIN, true, INT64_MIN, INT_MAX, &v, &is_auto);
    TRY(r);
    if (r == 0 && !is_auto) {
        /* 0 means "auto" inside the struct, so an explicit value must be a real head count. */
        if (v < 1) return fail(c, "parallel.upipe_heads", " = %lld: must be at least 1, or \"auto\"", (long long)v);
        p->upipe_heads = (int)v;
    }
    int e = CP_CKPT_LAYER;
    TRY(get_enum(c, t, "parallel", "checkpoint", CKPT_NAMES, &e));
    p->checkpoint = (cp_checkpoint)e;
    p->checkpoint_every = 0;
    r = get_int_ex(c, t, "parallel", "checkpoint_every", INT_PLAIN, true, INT64_MIN, INT_MAX, &v, &is_auto);
    TRY(r);
    if (r == 0 && !is_auto) {
        if (v < 1)
            return fail(c, "parallel.checkpoint_every", " = %lld: must be at least 1 (1: every layer), or \"auto\"",
                        (long long)v);
        p->checkpoint_every = (int)v;
    }
    e = CP_OFFLOAD_AUTO;
    TRY(get_enum(c, t, "parallel", "offload", OFFLOAD_NAMES, &e));
    p->offload = (cp_offload)e;
    e = CP_OPT_AUTO;
    TRY(get_enum(c, t, "parallel", "optimizer", OPT_NAMES, &e));
    p->optimizer = (cp_opt_place)e;
    e = CP_ATTN_AUTO;
    TRY(get_enum(c, t, "parallel", "attention_output", ATTN_KEEP_NAMES, &e));
    p->attention_output = (cp_attn_keep)e;
    const char *tiles[] = {"mlp_tile", "loss_tile"};
    int64_t *dst[] = {&p->mlp_tile, &p->loss_tile};
    for (int i = 0; i < 2; i++) {
        *dst[i] = 0;
        r = get_int_ex(c, t, "parallel", tiles[i], INT_LEN, true, INT64_MIN, INT64_MAX, &v, &is_auto);
        TRY(r);
        if (r == 0 && !is_auto) {
            if (v < 1) {
                char path[64];
                join_path(path, sizeof path, "parallel", tiles[i]);
                return fail(c, path, " = %lld: must be at least 1 token, or \"auto\"", (long long)v);
            }
            *dst[i] = v;
        }
    }
    lua_pop(c->L, 1);
    return 0;
}

static int bad_eval_every(ctx *c, int64_t v) {
    return fail(c, "train.eval_every", " = %lld: must be at least 0 (steps between evaluations on data.val; 0 never "
                "evaluates)", (long long)v);
}

static int bad_eval_sequences(ctx *c, int64_t v) {
    return fail(c, "train.eval_sequences", " = %lld: must be at least 1 (the sequences of data.val that each "
                "evaluation reads)", (long long)v);
}

static int read_train(ctx *c, int top, const char *name, cp_train *tr) {
    int t, r;
    TRY(section(c, top, "train", true, "train = { seq_len = ..., steps = ..., lr = ... }", &t));
    TRY(r = get_int(c, t, "train", "seq_len", INT_LEN, INT64_MIN, 1LL << 40, &tr->seq_len));
    if (r) return missing(c, "train", "seq_len", "tokens per sequence, e.g. seq_len = \"128K\"");
    tr->micro_batches = 1;
    TRY(get_cint(c, t, "train", "micro_batches", &tr->micro_batches));
    tr->steps = 10;
    TRY(get_cint(c, t, "train", "steps", &tr->steps));
    tr->lr = 3e-4;
    TRY(get_num(c, t, "train", "lr", &tr->lr));
    tr->min_lr = tr->lr / 10;
    TRY(get_num(c, t, "train", "min_lr", &tr->min_lr));
    tr->warmup = 0;
    TRY(get_cint(c, t, "train", "warmup", &tr->warmup));
    tr->weight_decay = 0.1;
    TRY(get_num(c, t, "train", "weight_decay", &tr->weight_decay));
    tr->clip = 1.0;
    TRY(get_num(c, t, "train", "clip", &tr->clip));
    tr->beta1 = 0.9;
    TRY(get_num(c, t, "train", "beta1", &tr->beta1));
    tr->beta2 = 0.95;
    TRY(get_num(c, t, "train", "beta2", &tr->beta2));
    tr->eps = 1e-8;
    TRY(get_num(c, t, "train", "eps", &tr->eps));
    tr->log_every = 1;
    TRY(get_cint(c, t, "train", "log_every", &tr->log_every));
    tr->save_every = 0;
    TRY(get_cint(c, t, "train", "save_every", &tr->save_every));
    /* -1: not given, so that the defaults, which depend on data.val and parallel.replicas, are set in read_rest */
    tr->eval_every = tr->eval_sequences = -1;
    int64_t v;
    TRY(r = get_int(c, t, "train", "eval_every", INT_PLAIN, INT_MIN, INT_MAX, &v));
    if (!r && v < 0) return bad_eval_every(c, v);
    if (!r) tr->eval_every = (int)v;
    TRY(r = get_int(c, t, "train", "eval_sequences", INT_PLAIN, INT_MIN, INT_MAX, &v));
    if (!r && v < 1) return bad_eval_sequences(c, v);
    if (!r) tr->eval_sequences = (int)v;
    tr->keep_checkpoints = 0;
    TRY(get_cint(c, t, "train", "keep_checkpoints", &tr->keep_checkpoints));
    tr->async_save = true;
    TRY(get_bool(c, t, "train", "async_save", &tr->async_save));
    snprintf(tr->out_dir, sizeof tr->out_dir, "runs/%s", name);
    TRY(get_str(c, t, "train", "out_dir", tr->out_dir, sizeof tr->out_dir));
    tr->deterministic = true;
    TRY(get_bool(c, t, "train", "deterministic", &tr->deterministic));
    int prec = 0;
    TRY(get_enum(c, t, "train", "precision", PRECISION_NAMES, &prec));
    tr->fp8 = prec == 1;
    tr->fp8_scaling = CP_FP8_SCALING_BLOCK;
    TRY(get_enum(c, t, "train", "fp8_scaling", FP8_SCALING_NAMES, &tr->fp8_scaling));
    /* by default E4M3 throughout with block or row scales (a block's or row's scale gives the range), E5M2 gradients
     * with one scale per tensor, as Transformer Engine's recipes do */
    int format = tr->fp8_scaling != CP_FP8_SCALING_TENSOR ? 1 : 0;
    TRY(get_enum(c, t, "train", "fp8_format", FP8_FORMAT_NAMES, &format));
    tr->fp8_e4m3_grads = format == 1;
    /* true and false, this key's values before "dx", still read as "forward" and "none" */
    tr->fp8_fast_accum = CP_FP8_FAST_FORWARD;
    TRY(get_enum_or_bool(c, t, "train", "fp8_fast_accum", FP8_FAST_NAMES, CP_FP8_FAST_NONE, CP_FP8_FAST_FORWARD,
                         &tr->fp8_fast_accum));
    /* the weights' gradients in bf16 by default: with them in FP8 the 1B model on real text trailed bf16 by 1.4% in
     * training loss beyond the noise floor and 3.1% at one evaluation; in bf16 by 0.7% at most, and ended level
     * (docs/PERF.md, 2026-12-03) */
    int wgrad = 1;
    TRY(get_enum(c, t, "train", "fp8_weight_grads", FP8_GRADS_NAMES, &wgrad));
    tr->fp8_bf16_wgrad = wgrad == 1;
    int dgrad = 0;
    TRY(get_enum(c, t, "train", "fp8_input_grads", FP8_GRADS_NAMES, &dgrad));
    tr->fp8_bf16_dgrad = dgrad == 1;
    /* the generator's kernel where it ran faster inside the step (cp_plan_fp8_kernel_wins), cuBLASLt elsewhere */
    tr->fp8_gemm = CP_FP8_GEMM_AUTO;
    TRY(get_enum(c, t, "train", "fp8_gemm", FP8_GEMM_NAMES, &tr->fp8_gemm));
    lua_pop(c->L, 1);
    return 0;
}

/* The machine the plan is made for, by default: one H200 on a host with 128 GiB, every figure with where it was
 * measured. This is the cost model's one table: its rates, its fixed costs and its memory reserves. */
void cp_machine_defaults(cp_machine *m) {
    memset(m, 0, sizeof *m);
    /* The GPU's memory is the runtime's total, 143,155.9
     * MiB (nvidia-smi's 143,771 MiB counts memory the driver keeps); a plan made for 140 GiB would not get it. */
    m->gpu_mem = 143150 * MIB;
    m->host_mem = 128 * GIB;
    m->reserve = 560 * MIB; /* measured on an H200: CUDA context 524 MiB, modules and cuBLASLt 8 MiB */
    m->comm_reserve = 1280 * MIB; /* measured on 2 H200s: 388 MiB at NCCL's init, 0.87 GiB more at first use */
    m->host_reserve = 4 * GIB;    /* measured on an H200 host: 1.5-3.3 GiB resident beyond the arena and weights */
    m->host_runtime = 320 * MIB;  /* measured on H200 hosts: 180-340 MiB added beside the arena once steps run */
    m->peak_tflops = 790; /* an 8192^3 bf16 GEMM on random data on an H200 */
    /* inside the 3B step at 32K on an H200, an accumulating GEMM's epilogue priced apart (its D read and written at
     * hbm_gbps): the bf16 GEMMs' sum in the trace 1084.5 ms with one MLP tile and 1122.6 with 4K tiles, predicted
     * 1082.9 and 1118.3 (docs/PERF.md, 2026-12-03, MLP tiles grown); before, 693 (32K) and 670 (128K) with the
     * epilogue inside the rate */
    m->gemm_tflops = 730;
    /* with one scale per tensor or per row (cuBLASLt applies them after the sums), inside the 3B step at 32K on an
     * H200 with row scales and FP8 weights' gradients, by this model's FLOPs and epilogues (docs/PERF.md, 2026-12-04):
     * the sums promoted to fp32, dX's 145.9 ms and dW's 143.7 (predicted 145.5 and 142.9); without promotion the
     * forward's 231.5-233.1 ms (1400 TF/s alone) and, with train.fp8_fast_accum = "dx", dX's 127.2 (1560 alone):
     * 1450 for both, 3% fast on the forward and 7% slow on dX. bench_gemm alone (2026-12-03, row scales): row 1228
     * TF/s, 1348 with fast accumulation, per tensor 1270. The casts to FP8 are kernels of their own, priced by their
     * bytes. */
    m->fp8_gemm_tflops = 1350;
    m->fp8_gemm_fast_tflops = 1450;
    /* with block scales, inside the 3B step at 32K on an H200 (its trace, docs/PERF.md, 2026-12-02, the noise
     * floor): 1082-1202 TF/s where a weight's 128 x 128 tiles meet 1 x 128 scales (forward, dX; bench_gemm alone
     * 1160-1300); the weights' gradients, whose two inputs are both 1 x 128, 224.2 ms in the all-FP8 step's trace
     * with 4K-token MLP tiles (2026-12-03), 980 once their fp32 epilogue is priced apart (bench_gemm 772-967) */
    m->fp8_block_gemm_tflops = 1130;
    m->fp8_block_wgrad_tflops = 980;
    /* the generator's kernel (train.fp8_gemm): bench_gemm on an H200, the 3B step's GEMMs at 32K (docs/PERF.md,
     * 2026-12-03, three consumer warpgroups): 1257-1310 TF/s where k is 8192, 907-1116 on the weights' gradients of
     * 3072 rows or more; inside the step (2026-12-03, afternoon) those gradients at 967-996 with their epilogue */
    m->fp8_cpgen_gemm_tflops = 1200;
    m->fp8_cpgen_wgrad_tflops = 1000;
    /* the Hopper kernels on an H200: at head_dim 128 bench_attention's causal 32/8 heads at 32K and 128K with the
     * head-major launch order (docs/PERF.md, 2026-12-01, evening); at 64 inside the 1B step (CPGEN_PROFILE), the
     * forward then moved by the three-consumer kernel's measured gain (2026-12-01, three consumers) */
    m->attn_fwd_tflops = 650;
    m->attn_bwd_tflops = 535;
    m->attn_fwd_tflops_d64 = 518;
    m->attn_bwd_tflops_d64 = 405;
    m->hbm_gbps = 4300;
    /* the 3B step at 32K in fp8 traced on an H200 (docs/PERF.md, 2026-12-02, FP8 casts made once): its 3410 casts
     * (per tensor, plain and transposed) at 3220 GB/s and 2176 amaxes at 2650, beside the launch cost; small MLP-tile
     * tensors (25 MB) reach less than the projections' inputs (200 MB); block-scaled plain casts 2800-3250 GB/s */
    m->fp8_cast_gbps = 3000;
    /* the 1 x 128 casts that write a transposed copy (cast_t_1d, cast_rt_1d: through shared memory): the 3B step at
     * 32K with FP8 weights' gradients traced on an H200 (docs/PERF.md, 2026-12-03, afternoon), their 59 ms a step
     * beside the other casts as priced: 2,900 GB/s (bench_kernels alone: 3,860-4,000 one copy, 2,970-3,070 both) */
    m->fp8_cast_t_gbps = 2900;
    /* the row-scaled casts (cast_row, cast_t_row and its column maxima, cast_rt_row), by the bytes they count (a
     * transposed copy's source read twice, both copies' read twice): the 3B step at 32K with row scales and FP8
     * weights' gradients traced on an H200 (docs/PERF.md, 2026-12-03, row casts of both ways): 94.5-96.2 ms a step,
     * 3,400 GB/s beside the launch cost (bench_kernels alone: cast_row 3,500-4,260, cast_t_row 3,290-3,470,
     * cast_rt_row 2,990-3,820); the transposed copies cast from row copies (cast_t_row8, a byte read an element) in
     * the same step 3,030-3,240 (docs/PERF.md, 2026-12-04, last; bench_kernels alone 2,790-3,240) */
    m->fp8_cast_row_gbps = 3400;
    /* the copies with 1 x 128 scales that the producers' twin entries write beside their outputs, their bytes over
     * what the kernels take longer than their plain entries: the 3B step at 32K traced on an H200 (docs/PERF.md,
     * 2026-12-03): 2.9 TB/s in rmsnorm, 1.4-1.7 in SwiGLU's forward, 1.3 in its backward (two copies; 1.8 since it
     * takes one vector a thread per pass, 2026-12-03, afternoon); 1.9 in the norm's forward, rope's backward and the
     * attention output's unpack, 1.4 in the norm's backward (2026-12-03, late afternoon) */
    m->fp8_copy_gbps = 1500;
    /* the row-scaled copies rmsnorm and SwiGLU write beside their outputs (and the transposed copy's column maxima
     * they gather), their bytes over what the kernels take longer than their plain entries: the 3B step at 32K with
     * row scales traced on an H200 (docs/PERF.md, 2026-12-04, rows through a pipe): 1,700 GB/s in rmsnorm's forward
     * (1,220 with the maxima), 1,500 in its backward, 2,000 in SwiGLU's forward, 2,270 in its backward, 1,820 in all;
     * the maxima alone cost nothing measurable (SwiGLU's forward took 10 us less than its plain entry) */
    m->fp8_copy_row_gbps = 1850;
    m->host_gbps = 55;
    m->a2a_gbps = 328;
    m->allgather_gbps = 278;
    m->net_gbps = 40; /* between nodes: one 400 Gb/s NIC per GPU, at the bus bandwidth NCCL reaches over it */
    m->ranks_per_gpu = 1;
    /* ranks sharing one H200, each its own NCCL host over sockets (no NVLink buffers), each rank's own bytes from
     * NVML beyond its arena and machine.reserve (docs/PERF.md, 2026-12-02): 355.4 MiB with all-reduces alone (2
     * replicas of tiny), 417.8 MiB with all-to-alls or a ring's send/recvs (Ulysses 2 and 4, ring 2), and 15.9 to
     * 16.8 MiB more for each communicator split off the run's (replicas x Ulysses, ring x Ulysses, replicas x ring) */
    m->comm_reserve_shared = 356 * MIB;
    m->comm_reserve_p2p = 62 * MIB;
    m->comm_reserve_split = 33 * MIB / 2;
    /* fixed costs per step, beside its bytes or FLOPs; not measured one by one: a kernel launch and a cuBLASLt
     * GEMM's setup as the step profiles (CPGEN_PROFILE) of the tiny spec show them, of the order of microseconds;
     * NCCL's latency inside a node and between nodes as NCCL documents it for small messages */
    m->kernel_us = 2;
    m->gemm_us = 4;
    m->coll_us = 10;
    m->net_us = 20;
    /* AdamW on the host: the state it streams (fp32 gradients, weights, two moments, bf16 weights out) per second
     * on all cores; not measured (the host optimizer's step is bound by the host link on the H200 machines) */
    m->host_adamw_gbps = 40;
}

#define MACHINE_NUM(field, ...) {#field, offsetof(cp_machine, field), __VA_ARGS__}
const cp_machine_num cp_machine_nums[] = {
    MACHINE_NUM(peak_tflops, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(gemm_tflops, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(fp8_gemm_tflops, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(fp8_gemm_fast_tflops, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(fp8_block_gemm_tflops, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(fp8_block_wgrad_tflops, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(fp8_cpgen_gemm_tflops, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(fp8_cpgen_wgrad_tflops, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(fp8_cast_gbps, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(fp8_cast_t_gbps, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(fp8_cast_row_gbps, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(fp8_copy_gbps, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(fp8_copy_row_gbps, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(attn_fwd_tflops, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(attn_bwd_tflops, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(attn_fwd_tflops_d64, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(attn_bwd_tflops_d64, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(hbm_gbps, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(host_gbps, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(a2a_gbps, false, CP_MACHINE_WRITE_ALWAYS),
    MACHINE_NUM(allgather_gbps, false, CP_MACHINE_WRITE_ALWAYS),
    /* only runs of several groups use it: a one-group spec writes what it wrote before */
    MACHINE_NUM(net_gbps, false, CP_MACHINE_WRITE_GROUPS),
    /* the host optimizer's rate and the fixed costs where they are not the defaults, likewise */
    MACHINE_NUM(host_adamw_gbps, false, CP_MACHINE_WRITE_NOT_DEFAULT),
    MACHINE_NUM(kernel_us, true, CP_MACHINE_WRITE_NOT_DEFAULT),
    MACHINE_NUM(gemm_us, true, CP_MACHINE_WRITE_NOT_DEFAULT),
    MACHINE_NUM(coll_us, true, CP_MACHINE_WRITE_NOT_DEFAULT),
    MACHINE_NUM(net_us, true, CP_MACHINE_WRITE_NOT_DEFAULT),
};
const size_t cp_machine_nnums = CP_ARRAY_LEN(cp_machine_nums);
#undef MACHINE_NUM

static int read_rest(ctx *c, int top, cp_spec *s) {
    int t, e;
    TRY(section(c, top, "data", false, "", &t));
    snprintf(s->data.source, sizeof s->data.source, "synthetic:recall");
    TRY(get_str(c, t, "data", "source", s->data.source, sizeof s->data.source));
    s->data.val[0] = 0;
    TRY(get_str(c, t, "data", "val", s->data.val, sizeof s->data.val));
    if (!strcmp(s->data.val, "none")) s->data.val[0] = 0;
    e = -1; /* not given: AUTO, resolved from the source (cp_data_resolve_documents) */
    TRY(get_enum(c, t, "data", "documents", DOCUMENTS_NAMES, &e));
    s->data.documents = e + 1;
    e = -1;
    TRY(get_enum(c, t, "data", "positions", POSITIONS_NAMES, &e));
    s->data.positions = e + 1;
    s->data.eod = -1;
    int64_t eod;
    int r = get_int(c, t, "data", "eod", INT_PLAIN, INT64_MIN, INT64_MAX, &eod);
    TRY(r);
    if (r == 0) {
        if (eod < 0)
            return fail(c, "data.eod", " = %lld: must be a token id, at least 0 (the id that ends each document in "
                        "the shards)", (long long)eod);
        s->data.eod = eod;
    }
    s->data.doc_len = 0;
    int64_t dl;
    r = get_int(c, t, "data", "doc_len", INT_LEN, 1, INT32_MAX, &dl);
    TRY(r);
    if (r == 0) s->data.doc_len = dl;
    lua_pop(c->L, 1);
    /* evaluation's defaults: about ten evaluations a run where there is held-out data, each of one step's sequences */
    cp_train *tr = &s->train;
    if (tr->eval_every == -1) tr->eval_every = s->data.val[0] ? CP_MAX(1, tr->steps / 10) : 0;
    if (tr->eval_sequences == -1) tr->eval_sequences = tr->micro_batches * s->parallel.replicas;

    TRY(section(c, top, "init", false, "", &t));
    e = CP_INIT_RANDOM;
    TRY(get_enum(c, t, "init", "from", INIT_NAMES, &e));
    s->init.from = (cp_init_from)e;
    s->init.path[0] = 0;
    TRY(get_str(c, t, "init", "path", s->init.path, sizeof s->init.path));
    int64_t seed = 0;
    TRY(get_int(c, t, "init", "seed", INT_PLAIN, 0, INT64_MAX, &seed));
    s->init.seed = (uint64_t)seed;
    s->init.std = 0.02;
    TRY(get_num(c, t, "init", "std", &s->init.std));
    lua_pop(c->L, 1);

    cp_machine *m = &s->machine;
    TRY(section(c, top, "machine", false, "", &t));
    cp_machine_defaults(m);
    TRY(get_int(c, t, "machine", "gpu_mem", INT_BYTES, INT64_MIN, MACHINE_BYTES_MAX, &m->gpu_mem));
    TRY(get_int(c, t, "machine", "host_mem", INT_BYTES, INT64_MIN, MACHINE_BYTES_MAX, &m->host_mem));
    TRY(get_int(c, t, "machine", "reserve", INT_BYTES, INT64_MIN, MACHINE_BYTES_MAX, &m->reserve));
    TRY(get_int(c, t, "machine", "comm_reserve", INT_BYTES, INT64_MIN, MACHINE_BYTES_MAX, &m->comm_reserve));
    TRY(get_int(c, t, "machine", "host_reserve", INT_BYTES, INT64_MIN, MACHINE_BYTES_MAX, &m->host_reserve));
    TRY(get_int(c, t, "machine", "host_runtime", INT_BYTES, INT64_MIN, MACHINE_BYTES_MAX, &m->host_runtime));
    for (size_t i = 0; i < cp_machine_nnums; i++)
        TRY(get_num(c, t, "machine", cp_machine_nums[i].key, cp_machine_num_at(m, &cp_machine_nums[i])));
    TRY(get_cint(c, t, "machine", "ranks_per_gpu", &m->ranks_per_gpu));
    TRY(get_int(c, t, "machine", "comm_reserve_shared", INT_BYTES, INT64_MIN, MACHINE_BYTES_MAX,
                &m->comm_reserve_shared));
    TRY(get_int(c, t, "machine", "comm_reserve_p2p", INT_BYTES, INT64_MIN, MACHINE_BYTES_MAX, &m->comm_reserve_p2p));
    TRY(get_int(c, t, "machine", "comm_reserve_split", INT_BYTES, INT64_MIN, MACHINE_BYTES_MAX,
                &m->comm_reserve_split));
    lua_pop(c->L, 1);
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------
 * Validation on the struct: single-field ranges first (so a cross-field message never rests on a nonsense value),
 * then the rules that tie fields together. */

static bool kv_fits_gpus(int64_t kv, int64_t C) { return kv >= C ? kv % C == 0 : C % kv == 0; }

/* Why U heads per stage cannot work for H query heads, KV heads and C GPUs; NULL when it can. */
static const char *upipe_problem(int64_t H, int64_t KV, int64_t C, int64_t U, char *buf, size_t len) {
    if (U % C != 0) {
        snprintf(buf, len, "must be a multiple of gpus (%lld) so every GPU gets the same number of heads in a stage",
                 (long long)C);
        return buf;
    }
    if (U > H || H % U != 0) {
        snprintf(buf, len, "must divide heads (%lld) so every stage has the same number of heads", (long long)H);
        return buf;
    }
    int64_t u = U / C, g = H / KV;
    if (u % g != 0 && g % u != 0) {
        snprintf(buf, len,
                 "gives u = upipe_heads/gpus = %lld query heads per GPU per stage, and the GQA group is g = "
                 "heads/kv_heads = %lld: one must divide the other so stages hold whole KV heads",
                 (long long)u, (long long)g);
        return buf;
    }
    if (KV < C && g % (u * C / KV) != 0) {
        snprintf(buf, len,
                 "with kv_heads (%lld) < gpus (%lld) each KV head is replicated on %lld GPUs, whose %lld query heads "
                 "per stage must divide the GQA group g = %lld",
                 (long long)KV, (long long)C, (long long)(C / KV), (long long)(u * C / KV), (long long)g);
        return buf;
    }
    return NULL;
}

static int valid_upipes(int64_t H, int64_t KV, int64_t C, int64_t *out, int max) {
    int n = 0;
    char why[256];
    for (int64_t U = C; U <= H && n < max; U += C)
        if (!upipe_problem(H, KV, C, U, why, sizeof why)) out[n++] = U;
    return n;
}

int cp_spec_upipe_values(const cp_spec *spec, int64_t *out, int max) {
    return valid_upipes(spec->model.heads, spec->model.kv_heads, spec->parallel.gpus, out, max);
}

static bool gpus_ok(const cp_spec *s, int64_t C) {
    const cp_model *m = &s->model;
    return m->heads % C == 0 && kv_fits_gpus(m->kv_heads, C) && s->train.seq_len % C == 0 && s->train.seq_len >= 2 * C;
}

/* The GPU counts this spec would work with, as text. */
static void valid_gpus_text(const cp_spec *s, char *buf, size_t len) {
    int64_t v[64];
    int n = 0;
    for (int64_t C = 1; C <= s->model.heads && C <= 4096 && n < 64; C++)
        if (gpus_ok(s, C)) v[n++] = C;
    join_values(v, n, buf, len);
}

/* Divisors of n near x: the largest not above x and the smallest above it. */
static void near_divisors(int64_t n, int64_t x, int64_t *below, int64_t *above) {
    *below = 1;
    *above = n;
    for (int64_t d = CP_MIN(x, n); d >= 1; d--)
        if (n % d == 0) {
            *below = d;
            break;
        }
    for (int64_t d = x + 1; d <= n; d++)
        if (n % d == 0) {
            *above = d;
            break;
        }
}

static bool bad_pos(double v) { return !isfinite(v) || !(v > 0); }
static bool bad_nonneg(double v) { return !isfinite(v) || v < 0; }

static int validate(ctx *c, cp_spec *s) {
    cp_model *m = &s->model;
    cp_parallel *p = &s->parallel;
    cp_train *tr = &s->train;
    cp_machine *mc = &s->machine;
    char buf[512], b1[64], b2[64];
    c->gpus_found = p->gpus_auto ? p->gpus_found : NULL;

    /* model */
    if (m->vocab < 2) return fail(c, "model.vocab", " = %lld: must be at least 2", (long long)m->vocab);
    if (m->vocab % 8)
        return fail(c, "model.vocab",
                    " = %lld: must be a multiple of 8 so that bf16 rows are whole 16-byte vector loads; pad it to %lld "
                    "(the extra rows are never targets)",
                    (long long)m->vocab, (long long)((m->vocab + 7) / 8 * 8));
    if (m->hidden < 8 || m->hidden % 8)
        return fail(c, "model.hidden",
                    " = %lld: must be a positive multiple of 8 so that bf16 rows are whole 16-byte vector loads",
                    (long long)m->hidden);
    if (m->layers < 1) return fail(c, "model.layers", " = %lld: must be at least 1", (long long)m->layers);
    if (m->heads < 1) return fail(c, "model.heads", " = %lld: must be at least 1", (long long)m->heads);
    if (m->kv_heads < 1) return fail(c, "model.kv_heads", " = %lld: must be at least 1", (long long)m->kv_heads);
    if (m->ffn < 8 || m->ffn % 8)
        return fail(c, "model.ffn",
                    " = %lld: must be a positive multiple of 8 so that bf16 rows are whole 16-byte vector loads",
                    (long long)m->ffn);
    if (bad_pos(m->norm_eps))
        return fail(c, "model.norm_eps", " = %g: must be a positive number such as 1e-5", m->norm_eps);
    if (bad_pos(m->rope_theta))
        return fail(c, "model.rope.theta", " = %g: must be a positive number such as 500000", m->rope_theta);
    if (m->rope_scaling.enabled) {
        const cp_rope_scaling *sc = &m->rope_scaling;
        if (bad_pos(sc->factor))
            return fail(c, "model.rope.scaling.factor", " = %g: must be a positive number such as 8", sc->factor);
        if (bad_pos(sc->low_freq))
            return fail(c, "model.rope.scaling.low_freq", " = %g: must be a positive number such as 1", sc->low_freq);
        if (bad_pos(sc->high_freq))
            return fail(c, "model.rope.scaling.high_freq", " = %g: must be a positive number such as 4", sc->high_freq);
        if (sc->high_freq <= sc->low_freq)
            return fail(c, "model.rope.scaling.high_freq",
                        " = %g: must be greater than low_freq (%g); Llama-3 uses low_freq = 1, high_freq = 4",
                        sc->high_freq, sc->low_freq);
        if (sc->original_max < 1)
            return fail(c, "model.rope.scaling.original_max", " = %lld: must be a positive length such as 8192",
                        (long long)sc->original_max);
    }

    /* parallel */
    if (p->gpus < 1 || p->gpus > 4096) return fail(c, "parallel.gpus", " = %d: must be between 1 and 4096", p->gpus);
    if (p->replicas < 1 || p->replicas > 4096)
        return fail(c, "parallel.replicas", " = %d: must be between 1 and 4096", p->replicas);
    if (p->ring < 1 || p->ring > 4096) return fail(c, "parallel.ring", " = %d: must be between 1 and 4096", p->ring);
    if ((int64_t)p->replicas * p->ring * p->gpus > CP_MAX_RANKS)
        return fail(c, "parallel.replicas", " = %d: replicas x ring x gpus = %d x %d x %d = %lld ranks, more than the %d "
                    "a run can have; use fewer replicas", p->replicas, p->replicas, p->ring, p->gpus,
                    (long long)p->replicas * p->ring * p->gpus, CP_MAX_RANKS);
    if (p->upipe_heads < 0)
        return fail(c, "parallel.upipe_heads", " = %d: must be at least 1, or \"auto\"", p->upipe_heads);
    if (p->checkpoint_every < 0)
        return fail(c, "parallel.checkpoint_every", " = %d: must be at least 1, or \"auto\"", p->checkpoint_every);
    if (p->checkpoint_every > m->layers)
        return fail(c, "parallel.checkpoint_every", " = %d: more than model.layers (%lld); at most %lld, one checkpoint "
                    "for the whole model", p->checkpoint_every, (long long)m->layers, (long long)m->layers);
    if (p->checkpoint_every > 1 && p->checkpoint == CP_CKPT_NONE)
        return fail(c, "parallel.checkpoint_every", " = %d: with checkpoint = \"none\" every layer keeps its activations; "
                    "use checkpoint = \"layer\", or checkpoint_every = 1", p->checkpoint_every);
    if (p->checkpoint == CP_CKPT_NONE &&
        (p->attention_output == CP_ATTN_HOST || p->attention_output == CP_ATTN_RECOMPUTE))
        return fail(c, "parallel.attention_output", " = \"%s\": with checkpoint = \"none\" every layer keeps its attention "
                    "output on the GPU; use attention_output = \"auto\" or \"gpu\", or checkpoint = \"layer\"",
                    ATTN_KEEP_NAMES[p->attention_output]);
    if (p->checkpoint_every > 1 && p->offload == CP_OFFLOAD_ALL)
        return fail(c, "parallel.checkpoint_every", " = %d: the checkpoints of every k-th layer stay on the GPU; "
                    "offload = \"all\" needs checkpoint_every = 1 (or \"auto\")", p->checkpoint_every);
    if (p->mlp_tile < 0)
        return fail(c, "parallel.mlp_tile", " = %lld: must be at least 1, or \"auto\"", (long long)p->mlp_tile);
    if (p->loss_tile < 0)
        return fail(c, "parallel.loss_tile", " = %lld: must be at least 1, or \"auto\"", (long long)p->loss_tile);

    /* train */
    if (tr->seq_len < 2) return fail(c, "train.seq_len", " = %lld: must be at least 2 tokens", (long long)tr->seq_len);
    if (tr->seq_len > (1LL << 30)) /* the attention kernels index rows of a stage's whole sequence in 32 bits */
        return fail(c, "train.seq_len", " = %lld: at most 1024M (1,073,741,824) tokens, the longest sequence the "
                    "attention kernels take; use a shorter length", (long long)tr->seq_len);
    if (tr->micro_batches < 1)
        return fail(c, "train.micro_batches", " = %d: must be at least 1 (sequences per optimizer step)",
                    tr->micro_batches);
    if (tr->steps < 1) return fail(c, "train.steps", " = %d: must be at least 1", tr->steps);
    if (bad_nonneg(tr->lr)) return fail(c, "train.lr", " = %g: must be a number >= 0, such as 3e-4", tr->lr);
    if (bad_nonneg(tr->min_lr)) return fail(c, "train.min_lr", " = %g: must be a number >= 0", tr->min_lr);
    if (tr->warmup < 0) return fail(c, "train.warmup", " = %d: must be at least 0 steps", tr->warmup);
    if (bad_nonneg(tr->weight_decay))
        return fail(c, "train.weight_decay", " = %g: must be a number >= 0, such as 0.1", tr->weight_decay);
    if (bad_nonneg(tr->clip))
        return fail(c, "train.clip", " = %g: must be a number >= 0 (0 turns gradient clipping off)", tr->clip);
    if (!isfinite(tr->beta1) || tr->beta1 < 0 || tr->beta1 >= 1)
        return fail(c, "train.beta1", " = %g: must be in [0, 1), such as 0.9", tr->beta1);
    if (!isfinite(tr->beta2) || tr->beta2 < 0 || tr->beta2 >= 1)
        return fail(c, "train.beta2", " = %g: must be in [0, 1), such as 0.95", tr->beta2);
    if (bad_pos(tr->eps)) return fail(c, "train.eps", " = %g: must be a positive number such as 1e-8", tr->eps);
    if (tr->log_every < 1) return fail(c, "train.log_every", " = %d: must be at least 1", tr->log_every);
    if (tr->save_every < 0)
        return fail(c, "train.save_every", " = %d: must be at least 0 (0 saves no periodic checkpoints)",
                    tr->save_every);
    if (tr->keep_checkpoints < 0)
        return fail(c, "train.keep_checkpoints", " = %d: must be at least 0 (the newest checkpoints kept; 0 keeps all)",
                    tr->keep_checkpoints);
    if (!tr->out_dir[0]) return fail(c, "train.out_dir", " is empty: give a folder such as \"runs/%s\"", s->name);
    /* the default "forward" stands for every recipe (block-scaled GEMMs just promote); "dx" asks for a change that
     * block scales cannot make */
    if (tr->fp8 && tr->fp8_scaling == CP_FP8_SCALING_BLOCK && tr->fp8_fast_accum == CP_FP8_FAST_DX)
        return fail(c, "train.fp8_fast_accum",
                    " = \"dx\": block-scaled GEMMs always promote their sums to fp32 (cuBLASLt applies the block "
                    "scales where it promotes); use it with train.fp8_scaling = \"row\" or \"tensor\", or leave it "
                    "\"forward\"");

    /* data */
    const char *src = s->data.source;
    if (strncmp(src, "synthetic:", 10) == 0) {
        bool known = false;
        for (int i = 0; SYNTHETIC_KINDS[i]; i++)
            if (strcmp(src + 10, SYNTHETIC_KINDS[i]) == 0) known = true;
        if (!known) {
            const char *near = suggest_name(src + 10, SYNTHETIC_KINDS);
            return fail(c, "data.source", " = \"%.200s\": unknown synthetic data; %s\"synthetic:%s\"%s", src,
                        near ? "did you mean " : "use ", near ? near : SYNTHETIC_KINDS[0], near ? "?" : "");
        }
    } else if (strncmp(src, "tokens:", 7) == 0) {
        if (!src[7])
            return fail(c, "data.source",
                        " = \"%s\": give the token shards after the prefix, e.g. "
                        "\"tokens:data/shards/*.bin\"",
                        src);
    } else {
        return fail(c, "data.source",
                    " = \"%.200s\": must start with \"synthetic:\" (\"synthetic:copy\", \"synthetic:recall\", "
                    "\"synthetic:packed\") or \"tokens:\" (\"tokens:path/to/shards/*.bin\")",
                    src);
    }

    /* held-out data (data.val); its rules with other keys come with the cross-field rules */
    const char *val = s->data.val;
    double frac;
    if (!strncmp(val, "split:", 6)) {
        if (!cp_val_split(val, &frac))
            return fail(c, "data.val", " = \"%.200s\": the fraction held out must be a number between 0 and 1 (both "
                        "excluded), such as \"split:0.01\" for the last 1%% of the sequences", val);
    } else if (!strncmp(val, "tokens:", 7)) {
        if (!val[7])
            return fail(c, "data.val", " = \"%s\": give the held-out shards after the prefix, e.g. "
                        "\"tokens:data/val/*.bin\"", val);
    } else if (!strncmp(val, "synthetic:", 10)) {
        bool known = false;
        for (int i = 0; SYNTHETIC_KINDS[i]; i++)
            if (strcmp(val + 10, SYNTHETIC_KINDS[i]) == 0) known = true;
        if (!known) {
            const char *near = suggest_name(val + 10, SYNTHETIC_KINDS);
            return fail(c, "data.val", " = \"%.200s\": unknown synthetic data; %s\"synthetic:%s\"%s", val,
                        near ? "did you mean " : "use ", near ? near : SYNTHETIC_KINDS[0], near ? "?" : "");
        }
    } else if (val[0]) {
        return fail(c, "data.val", " = \"%.200s\": must be \"tokens:<glob>\" (held-out shards), \"split:<fraction>\" "
                    "(the last fraction of a tokens: source), \"synthetic:copy\", \"synthetic:recall\" or "
                    "\"synthetic:packed\" (that task's held-out sequences), or \"none\"", val);
    }
    if (tr->eval_every < 0) return bad_eval_every(c, tr->eval_every);
    if (tr->eval_sequences < 1) return bad_eval_sequences(c, tr->eval_sequences);

    /* documents: the rules that need no file; cp_data_resolve_documents (runtime/data.c) checks the shards */
    cp_data *dt = &s->data;
    if (dt->documents < CP_DOCS_AUTO || dt->documents > CP_DOCS_MASK)
        return fail(c, "data.documents", " = %d: not a mode (a cpgen bug)", dt->documents);
    if (dt->positions < CP_POS_AUTO || dt->positions > CP_POS_DOCUMENT)
        return fail(c, "data.positions", " = %d: not a mode (a cpgen bug)", dt->positions);
    bool tok_src = !strncmp(src, "tokens:", 7), tok_val = !strncmp(val, "tokens:", 7) || (tok_src && !strncmp(val, "split:", 6));
    if (dt->eod < -1)
        return fail(c, "data.eod", " = %lld: must be a token id, at least 0", (long long)dt->eod);
    if (dt->eod >= 0 && !tok_src && !tok_val)
        return fail(c, "data.eod", " = %lld: the end-of-document id of tokens: shards, and neither data.source "
                    "(\"%.200s\") nor data.val reads any; remove it", (long long)dt->eod, src);
    if (dt->eod >= m->vocab)
        return fail(c, "data.eod", " = %lld: not below model.vocab (%lld), so no token can hold it; give the id "
                    "that ends documents in the shards (tools/make_tokens.py writes it to <out>.json as eod_id)",
                    (long long)dt->eod, (long long)m->vocab);
    bool one_task = !tok_src && strcmp(src, "synthetic:packed") != 0; /* copy, recall: one task per sequence */
    if (dt->documents == CP_DOCS_MASK && one_task)
        return fail(c, "data.documents", " = \"mask\": data.source = \"%.200s\" has no document boundaries (one "
                    "task per sequence); use data.source = \"synthetic:packed\" (documents of random lengths) or "
                    "tokens: shards that carry an end-of-document id, or data.documents = \"stream\"", src);
    if (dt->positions == CP_POS_DOCUMENT &&
        (dt->documents == CP_DOCS_STREAM || (dt->documents == CP_DOCS_AUTO && one_task)))
        return fail(c, "data.positions", " = \"document\": positions restart at each document only where "
                    "attention stays inside documents, and data.documents is \"stream\"%s; set data.documents = "
                    "\"mask\", or data.positions = \"sequence\"",
                    dt->documents == CP_DOCS_AUTO ? " (data.source has no document boundaries)" : "");

    /* init */
    if (bad_pos(s->init.std)) return fail(c, "init.std", " = %g: must be a positive number such as 0.02", s->init.std);

    /* machine */
    if (mc->gpu_mem < GIB)
        return fail(c, "machine.gpu_mem", " = %lld bytes: too small; write a size such as \"141G\" or \"80GiB\"",
                    (long long)mc->gpu_mem);
    if (mc->host_mem < 0) return fail(c, "machine.host_mem", " = %lld: must not be negative", (long long)mc->host_mem);
    if (mc->reserve < 0) return fail(c, "machine.reserve", " = %lld: must not be negative", (long long)mc->reserve);
    if (mc->comm_reserve < 0)
        return fail(c, "machine.comm_reserve", " = %lld: must not be negative", (long long)mc->comm_reserve);
    const struct {
        const char *key;
        int64_t v;
    } shared[] = {{"machine.comm_reserve_shared", mc->comm_reserve_shared},
                  {"machine.comm_reserve_p2p", mc->comm_reserve_p2p},
                  {"machine.comm_reserve_split", mc->comm_reserve_split}};
    for (size_t k = 0; k < sizeof shared / sizeof shared[0]; k++)
        if (shared[k].v < 0) return fail(c, shared[k].key, " = %lld: must not be negative", (long long)shared[k].v);
    if (mc->ranks_per_gpu < 1 || mc->ranks_per_gpu > 64)
        return fail(c, "machine.ranks_per_gpu", " = %d: must be between 1 and 64 (ranks that share one GPU)",
                    mc->ranks_per_gpu);
    if (mc->host_reserve < 0)
        return fail(c, "machine.host_reserve", " = %lld: must not be negative", (long long)mc->host_reserve);
    if (mc->host_runtime < 0 || mc->host_runtime > mc->host_reserve)
        return fail(c, "machine.host_runtime", " = %lld: must be between 0 and machine.host_reserve (%lld), of which it "
                    "is a part", (long long)mc->host_runtime, (long long)mc->host_reserve);
    for (size_t i = 0; i < cp_machine_nnums; i++) {
        const cp_machine_num *k = &cp_machine_nums[i];
        const double v = cp_machine_num_of(mc, k);
        char path[64];
        snprintf(path, sizeof path, "machine.%s", k->key);
        /* the cost model divides work by a rate: 1e-300 TF/s made a step of 1e299 s, and 1e308 GB/s is infinite once
         * in bytes per second */
        if (!k->fixed_cost && (bad_pos(v) || v < 1e-3 || v > 1e6))
            return fail(c, path, " = %g: must be a rate between 0.001 and 1e6 (%s per GPU; it divides work in the cost "
                        "model)", v, strstr(k->key, "tflops") ? "TF/s" : "GB/s");
        if (k->fixed_cost && !(v >= 0 && v <= 1e6))
            return fail(c, path, " = %g: must be between 0 and 1e6 microseconds (a fixed cost per step of the cost "
                        "model)", v);
    }

    /* Cross-field rules. */
    int64_t H = m->heads, KV = m->kv_heads, C = p->gpus, S = tr->seq_len;
    if (H % KV != 0) {
        int64_t d[64];
        int n = 0;
        for (int64_t i = 1; i <= H && n < 64; i++)
            if (H % i == 0) d[n++] = i;
        join_values(d, n, buf, sizeof buf);
        return fail(c, "model.kv_heads",
                    " = %lld: heads (%lld) must be divisible by kv_heads; use a divisor of %lld: %s", (long long)KV,
                    (long long)H, (long long)H, buf);
    }
    if (m->head_dim != 64 && m->head_dim != 128)
        return fail(c, "model.head_dim",
                    " = %lld: the attention kernels support head_dim 64 or 128; set head_dim to one of them (hidden "
                    "need not equal heads * head_dim when head_dim is given)",
                    (long long)m->head_dim);
    if (H % C != 0) {
        valid_gpus_text(s, buf, sizeof buf);
        return fail(c, "parallel.gpus",
                    " = %lld: heads (%lld) must be divisible by gpus, since Ulysses gives each GPU heads/gpus heads; "
                    "use gpus = %s",
                    (long long)C, (long long)H, buf);
    }
    if (!kv_fits_gpus(KV, C)) {
        valid_gpus_text(s, buf, sizeof buf);
        if (KV >= C)
            return fail(c, "parallel.gpus",
                        " = %lld: kv_heads (%lld) must be divisible by gpus so every GPU holds whole KV heads "
                        "(or, with fewer KV heads than GPUs, gpus a multiple of kv_heads); use gpus = %s",
                        (long long)C, (long long)KV, buf);
        return fail(c, "parallel.gpus",
                    " = %lld: with fewer KV heads (%lld) than GPUs, gpus must be a multiple of kv_heads so every KV "
                    "head is replicated on the same number of GPUs; use gpus = %s",
                    (long long)C, (long long)KV, buf);
    }
    int64_t ring = p->ring;
    if (ring > 1 && S % (2 * ring * C) != 0) {
        int64_t z = 2 * ring * C, lo = S / z * z;
        return fail(c, "train.seq_len",
                    " = %lld: with ring = %lld the sequence is cut into 2 x ring = %lld zigzag chunks (group g holds "
                    "chunks g and %lld - g, so causal work is even), each split over the group's gpus (%lld): it must "
                    "be a multiple of 2 x ring x gpus = %lld; use %lld or %lld",
                    (long long)S, (long long)ring, (long long)(2 * ring), (long long)(2 * ring - 1), (long long)C,
                    (long long)z, (long long)(lo ? lo : z), (long long)(lo + z));
    }
    if (S < 2 * C)
        return fail(c, "train.seq_len", " = %lld: must be at least 2 * gpus (%lld) tokens", (long long)S,
                    (long long)(2 * C));
    if (S % C != 0)
        return fail(c, "train.seq_len",
                    " = %lld: must be a multiple of gpus (%lld) since each GPU holds seq_len/gpus tokens; use %lld or "
                    "%lld",
                    (long long)S, (long long)C, (long long)(S / C * C), (long long)((S / C + 1) * C));
    int64_t U[256];
    int nU = valid_upipes(H, KV, C, U, 256);
    if (p->upipe_heads == 0) {
        if (nU == 0) /* unreachable once the GPU rules hold (U = heads always works), kept as a guard */
            return fail(c, "parallel.upipe_heads",
                        " = \"auto\": no stage size works with heads %lld, kv_heads %lld "
                        "and gpus %lld",
                        (long long)H, (long long)KV, (long long)C);
        p->upipe_heads = (int)U[0]; /* the smallest valid stage, the least attention memory; see upipe_auto */
        p->upipe_auto = true;
    } else {
        const char *why = upipe_problem(H, KV, C, p->upipe_heads, buf, sizeof buf);
        if (why) {
            char list[256];
            join_values(U, nU, list, sizeof list);
            return fail(c, "parallel.upipe_heads", " = %d: %s; valid values with gpus = %lld: %s, or \"auto\"",
                        p->upipe_heads, why, (long long)C, list);
        }
    }
    int64_t T = S / C / ring;
    const char *tper = ring > 1 ? "seq_len/(ring x gpus)" : "seq_len/gpus";
    const char *tname[] = {"parallel.mlp_tile", "parallel.loss_tile"};
    int64_t tval[] = {p->mlp_tile, p->loss_tile};
    for (int i = 0; i < 2; i++) {
        int64_t tile = tval[i];
        if (tile == 0) continue;
        if (tile > T)
            return fail(
                c, tname[i],
                " = %lld: more than the tokens per GPU (T = %s = %lld); use at most %lld, or \"auto\"",
                (long long)tile, tper, (long long)T, (long long)T);
        if (T % tile != 0) {
            int64_t lo, hi;
            near_divisors(T, tile, &lo, &hi);
            return fail(c, tname[i],
                        " = %lld: the tokens per GPU (T = %s = %lld) must be a multiple of it; use a divisor "
                        "of %lld such as %s or %s, or \"auto\"",
                        (long long)tile, tper, (long long)T, (long long)T, cp_fmt_length(lo, b1, sizeof b1),
                        cp_fmt_length(hi, b2, sizeof b2));
        }
    }
    if (tr->min_lr > tr->lr)
        return fail(c, "train.min_lr",
                    " = %g: must not exceed train.lr (%g); the schedule decays from lr down to min_lr", tr->min_lr,
                    tr->lr);
    if (tr->warmup > tr->steps)
        return fail(c, "train.warmup", " = %d: must not exceed train.steps (%d); lower warmup or raise steps",
                    tr->warmup, tr->steps);
    if (mc->reserve >= mc->gpu_mem)
        return fail(c, "machine.reserve", " = %s: must be less than machine.gpu_mem (%s)",
                    cp_fmt_bytes(mc->reserve, b1, sizeof b1), cp_fmt_bytes(mc->gpu_mem, b2, sizeof b2));
    if (!strncmp(val, "split:", 6) && strncmp(s->data.source, "tokens:", 7))
        return fail(c, "data.val", " = \"%.200s\": a split holds out the end of a tokens: source, and data.source is "
                    "\"%.200s\", whose own held-out sequences are data.val = \"%.200s\"", val, s->data.source,
                    s->data.source);
    if (tr->eval_every > 0 && !val[0])
        return fail(c, "train.eval_every", " = %d: evaluates on data.val, which is not set; set data.val (\"split:0.01\" "
                    "for tokens: data, \"synthetic:copy\" or \"synthetic:recall\" for a synthetic task, or "
                    "\"tokens:<glob>\"), or eval_every = 0", tr->eval_every);
    if (val[0] && tr->eval_sequences % p->replicas) {
        int64_t R = p->replicas, lo = tr->eval_sequences / R * R;
        return fail(c, "train.eval_sequences", " = %d: the %lld replica groups evaluate equal shares of the "
                    "sequences, so it must be a multiple of parallel.replicas; use %lld or %lld", tr->eval_sequences,
                    (long long)R, (long long)(lo ? lo : R), (long long)(lo + R));
    }
    if (s->init.from == CP_INIT_HF && !s->init.path[0])
        return fail(c, "init.path",
                    " is missing; init.from = \"hf\" needs path = the folder of a Hugging Face model (config.json "
                    "and *.safetensors)");
    if (s->init.from == CP_INIT_RANDOM && s->init.path[0])
        return fail(c, "init.path",
                    " = \"%.200s\": only used with init.from = \"hf\"; add from = \"hf\" to load those weights, or "
                    "remove path",
                    s->init.path);
    return 0;
}

/* ------------------------------------------------------------------------------------------------------------
 * Loading. The whole Lua part runs inside one protected call, so any Lua error (even out of memory) is caught. */

typedef struct {
    ctx *c;
    const source *src;
    cp_spec *spec;
    int rc;
    bool out_of_memory; /* the spec failed on Lua's out-of-memory error (not on one it caught and went past) */
} job;

static int job_main(lua_State *L) {
    job *j = lua_touserdata(L, 1);
    ctx *c = j->c;
    open_libs(L);
    double deadline = cp_now() + spec_time_limit_s;
    memcpy(lua_getextraspace(L), &deadline, sizeof deadline);
    lua_sethook(L, time_hook, LUA_MASKCOUNT, 1 << 20);
    char chunk[CP_PATH_MAX + 1];
    snprintf(chunk, sizeof chunk, "@%s", j->src->shown);
    lua_pushcfunction(L, msgh);
    int h = lua_gettop(L);
    int st = luaL_loadbufferx(L, j->src->text, j->src->len, chunk, "t");
    if (st == LUA_OK) st = lua_pcall(L, 0, LUA_MULTRET, h);
    if (st != LUA_OK) {
        const char *msg = lua_tostring(L, -1);
        if (!msg) msg = "error object is not a message";
        j->out_of_memory = st == LUA_ERRMEM || strstr(msg, "not enough memory") != NULL;
        if (location_len(msg))
            put_err(c->err, c->errlen, msg);
        else
            fail(c, NULL, "cannot run the spec: %s", msg);
        c->failed = true;
        return 0;
    }
    int nret = lua_gettop(L) - h;
    if (nret == 0) {
        fail(c, NULL, "the spec does not return a table; end it with return { model = { ... }, train = { ... } }");
        return 0;
    }
    if (!lua_istable(L, h + 1)) {
        char v[96];
        describe(L, h + 1, v, sizeof v);
        fail(c, NULL, "the spec returned %s, expected a table: return { model = { ... }, train = { ... } }", v);
        return 0;
    }
    lua_settop(L, h + 1);
    int top = h + 1;
    for (int i = 0; i < c->nsets; i++)
        if (apply_set(c, top, c->sets[i]) < 0) return 0;
    if (walk(c, top, TOP_KEYS, "") < 0) return 0;
    cp_spec *s = j->spec;
    if (read_model(c, top, &s->model) < 0 || read_parallel(c, top, &s->parallel) < 0 ||
        read_train(c, top, s->name, &s->train) < 0 || read_rest(c, top, s) < 0)
        return 0;
    if (validate(c, s) < 0) return 0;
    j->rc = 0;
    return 0;
}

/* A spec computes a small table; one that keeps allocating would take the host's memory long before the time
 * limit stops it, so its Lua state has a budget, and an allocation past it fails as Lua's out-of-memory error. */
#define SPEC_MEMORY_LIMIT (1024 * MIB)

typedef struct {
    size_t used, peak;
    bool over;
} lua_budget;

static void *budget_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
    lua_budget *b = ud;
    size_t old = ptr ? osize : 0;
    if (nsize == 0) {
        free(ptr);
        b->used -= old;
        return NULL;
    }
    if (nsize > old && b->used - old + nsize > (size_t)SPEC_MEMORY_LIMIT) {
        b->over = true;
        return NULL;
    }
    void *p = realloc(ptr, nsize);
    if (p) b->used = b->used - old + nsize;
    if (b->used > b->peak) b->peak = b->used;
    return p;
}

/* The spec's name: its file's, less ".lua", with control characters as '_' (a file name may hold any byte, and the
 * name goes into train.out_dir's default, where they are refused). */
static void name_from_path(const char *path, char *name, size_t len) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 4 && strcmp(base + n - 4, ".lua") == 0) n -= 4;
    snprintf(name, len, "%.*s", (int)n, base);
    for (char *p = name; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) *p = '_';
}

/* A Lua state that grew past this is not closed but left to the exit of the loader process, which then retires:
 * its memory goes back at once, and closing a heap that large (slowly, under a sanitizer) would delay the answer. */
#define LOADER_RETIRE_BYTES (64 * MIB)

/* Runs the spec and checks the result into out, inside the loader process (below). *retire: the state grew past
 * LOADER_RETIRE_BYTES and was left open. */
static int run_spec(const source *src, const char *const *sets, int nsets, cp_spec *out, char *err, int errlen,
                    bool *retire) {
    ctx c = {.file = src->shown, .sets = sets, .nsets = nsets, .err = err, .errlen = errlen};
    if (err && errlen > 0) err[0] = 0;
    *retire = false;
    cp_spec *s = cp_xcalloc(1, sizeof *s);
    snprintf(s->path, sizeof s->path, "%s", src->shown);
    name_from_path(src->shown, s->name, sizeof s->name);
    lua_budget budget = {0};
    lua_State *L = lua_newstate(budget_alloc, &budget);
    if (!L) {
        free(s);
        return fail(&c, NULL, "out of memory starting Lua");
    }
    c.L = L;
    job j = {.c = &c, .src = src, .spec = s, .rc = -1};
    lua_pushcfunction(L, job_main);
    lua_pushlightuserdata(L, &j);
    int st = lua_pcall(L, 1, 0, 0);
    if (st != LUA_OK && !c.failed) {
        const char *msg = lua_tostring(L, -1);
        fail(&c, NULL, "Lua error: %s", msg ? msg : "(no message)");
    }
    if (budget.peak > LOADER_RETIRE_BYTES)
        *retire = true;
    else
        lua_close(L);
    int rc = st == LUA_OK && !c.failed ? j.rc : -1;
    if (rc && budget.over && (st == LUA_ERRMEM || j.out_of_memory))
        fail(&c, NULL, "the spec used more than %lld MiB of memory; does it build a table or string without end?",
             SPEC_MEMORY_LIMIT / MIB);
    if (rc == 0) *out = *s;
    free(s);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------------
 * The loader process. The count hook stops Lua code at the time limit, but it never fires inside one call of a
 * C function, and some library functions run as long as their arguments ask: a pattern that backtracks
 * (string.rep("a", 300000):find(".-.-.-b")), a plain find of a long needle, string.rep of an empty string 1e18
 * times, table.move over 1e15 empty slots, table.sort of millions of values. Wrapping each with deadline checks
 * would leave open the next one nobody listed, and a thread cannot be stopped safely inside one; a process can.
 * So specs run in a loader process, forked (no exec) at the first load and kept while loads keep coming (a fork
 * per load costs milliseconds, far more than a load, and `cpgen tune` loads hundreds). Each load sends it the
 * source text, the sets, the time limit and, as file descriptors, this process's working folder (for dofile) and
 * stderr (for print); it runs the Lua and the checks and sends back the cp_spec or the message. cpgen kills it
 * with SIGKILL when a load outlives the limit, and the next load starts another. A crash inside the Lua state
 * ends the loader, not cpgen, and is reported as one. The hook stays, so a loop in Lua code is still stopped by
 * the loader itself with its file and line. Memory stays bounded by the Lua allocator's budget, which every
 * allocation of a state goes through, and a load that used much of it retires the loader (LOADER_RETIRE_BYTES).
 * parallel.gpus = "auto" is counted by cpgen on the loader's request: counting may start CUDA, which a forked
 * process must not use, and the count's time is not the spec's. */

/* Time the loader has, past the limit its hook enforces, to report a Lua loop itself with its location. */
#define LOADER_GRACE_S 1.0

typedef struct {
    double limit;         /* seconds */
    int32_t counter;      /* the parent has a GPU counter to ask */
    int32_t nsets;
    int32_t fds; /* the descriptors sent with it: 1 the working folder, 2 stderr */
    uint64_t shown_len, text_len, sets_len; /* the body: the shown name, the text, the sets each ending in NUL */
} loader_request;

typedef struct {
    int32_t rc;
    int32_t retire; /* the loader exits after this answer */
    char err[CP_ERR_MAX];
    cp_spec spec;
} loader_answer;

typedef struct {
    int32_t count;
    char found[sizeof(((cp_parallel *)0)->gpus_found)];
} gpu_answer;

enum { ASK_GPUS = 'G', ANSWER = 'R', LEAVING = 'Q' };

static int loader_fd = -1; /* in the loader: its end of the socket */

static bool send_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL); /* a peer gone is an error here, never SIGPIPE */
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Reads n bytes, waiting at most until deadline (the cp_now() clock; 0: no deadline). 1 when read, 0 at end of
 * file or on an error, -1 when the deadline passed. */
static int recv_all(int fd, void *data, size_t n, double deadline) {
    char *p = data;
    while (n > 0) {
        if (deadline > 0) {
            double left = deadline - cp_now();
            if (left <= 0) return -1;
            struct pollfd pf = {.fd = fd, .events = POLLIN};
            int pr = poll(&pf, 1, (int)(left * 1000) + 1);
            if (pr < 0 && errno != EINTR) return 0;
            if (pr <= 0) continue;
        }
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return 0;
        p += r;
        n -= (size_t)r;
    }
    return 1;
}

/* Sends the request's head with two descriptors, the working folder and stderr, each where it is open (-1: not;
 * q->fds says which came, so that the loader never takes one for the other). */
static bool send_head(int fd, loader_request *q, int cwd, int errfd) {
    int fds[2], n = 0;
    q->fds = 0;
    if (cwd >= 0) fds[n++] = cwd, q->fds |= 1;
    if (errfd >= 0 && fcntl(errfd, F_GETFD) >= 0) fds[n++] = errfd, q->fds |= 2; /* 2>&- closes it */
    union {
        char buf[CMSG_SPACE(sizeof fds)];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof u);
    struct iovec iov = {.iov_base = (void *)q, .iov_len = sizeof *q};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (n) {
        m.msg_control = u.buf;
        m.msg_controllen = CMSG_SPACE(n * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(n * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
    }
    ssize_t w;
    while ((w = sendmsg(fd, &m, MSG_NOSIGNAL)) < 0 && errno == EINTR) {
    }
    return w == (ssize_t)sizeof *q;
}

/* The loader's side of send_head; false at end of file. fds[0] (the folder) and fds[1] (stderr) are -1 where none
 * came. */
static bool recv_head(int fd, loader_request *q, int fds[2]) {
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = q, .iov_len = sizeof *q};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
    ssize_t r;
    while ((r = recvmsg(fd, &m, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR) {
    }
    fds[0] = fds[1] = -1;
    if (r <= 0) return false;
    int got[2] = {-1, -1}, n = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm))
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            n = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            memcpy(got, CMSG_DATA(cm), (size_t)CP_MIN(n, 2) * sizeof(int));
        }
    if ((size_t)r != sizeof *q && recv_all(fd, (char *)q + r, sizeof *q - (size_t)r, 0) != 1) return false;
    int k = 0;
    if (q->fds & 1) fds[0] = k < n ? got[k++] : -1;
    if (q->fds & 2) fds[1] = k < n ? got[k++] : -1;
    return true;
}

/* The loader's gpu_counter: asks the parent. */
static int ask_parent_for_gpus(char *found, int len) {
    double t0 = cp_now();
    char ask = ASK_GPUS;
    gpu_answer a;
    if (!send_all(loader_fd, &ask, 1) || recv_all(loader_fd, &a, sizeof a, 0) != 1) {
        snprintf(found, (size_t)len, "1 GPU (the GPUs could not be counted)");
        return 1;
    }
    double waited = cp_now() - t0;
    waited_for_parent_s += waited;
    alarm(alarm(0) + (unsigned)waited + 1);
    a.found[sizeof a.found - 1] = 0;
    snprintf(found, (size_t)len, "%s", a.found);
    return a.count;
}

/* One load in the loader. False when the loader should exit: the parent is gone, or the state was left large. */
static bool serve_one(int fd) {
    loader_request q;
    int fds[2];
    if (!recv_head(fd, &q, fds)) return false;
    if (fds[0] >= 0 && fchdir(fds[0]) != 0) { /* the load then reads files from where the loader was */
    }
    if (fds[1] >= 0) dup2(fds[1], 2);
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0) close(fds[i]);
    uint64_t body_len = q.shown_len + q.text_len + q.sets_len;
    if (q.shown_len >= CP_PATH_MAX || q.nsets < 0 || body_len < q.text_len) return false;
    char *body = malloc(body_len + 1);
    const char **sets = calloc((size_t)q.nsets + 1, sizeof *sets);
    loader_answer *a = calloc(1, sizeof *a);
    if (!body || !sets || !a || recv_all(fd, body, body_len, 0) != 1) return false;
    body[body_len] = 0;
    source src = {.owned = NULL, .text = body + q.shown_len, .len = q.text_len};
    snprintf(src.shown, sizeof src.shown, "%.*s", (int)q.shown_len, body);
    const char *p = body + q.shown_len + q.text_len, *end = body + body_len;
    for (int i = 0; i < q.nsets; i++) {
        if (p >= end) return false;
        sets[i] = p;
        p += strlen(p) + 1;
    }
    spec_time_limit_s = q.limit;
    waited_for_parent_s = 0;
    gpu_counter = q.counter ? ask_parent_for_gpus : NULL;
    /* a backstop should the parent die while this load is stuck in a C function: nobody else would stop it */
    alarm((unsigned)(q.limit + LOADER_GRACE_S) + 2);
    bool retire;
    a->rc = run_spec(&src, sets, q.nsets, &a->spec, a->err, sizeof a->err, &retire);
    alarm(0);
    a->retire = retire;
    char kind = ANSWER;
    bool sent = send_all(fd, &kind, 1) && send_all(fd, a, sizeof *a);
    free(body);
    free(sets);
    free(a);
    return sent && !retire;
}

/* A loader that has had no load for this long leaves (saying so first): a process that loaded its spec and went on
 * to train for hours keeps no second process, nor the copies of pages it writes that the loader still shares. */
#define LOADER_IDLE_MS 2000

static void loader_main(int fd) {
    /* The parent's handlers are not the loader's business: a Ctrl-C handler that forwards to ranks, a test
     * framework's crash handler that would carry on with the tests in here. Under AddressSanitizer its own
     * handler stays, so a crash in the loader is reported with its stack. */
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGALRM, SIGCHLD, SIGPIPE,
#ifndef __SANITIZE_ADDRESS__
                               SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT,
#endif
    };
    for (size_t i = 0; i < CP_ARRAY_LEN(sigs); i++) signal(sigs[i], SIG_DFL);
    /* It never writes to stdout: holding the parent's would keep a pipe's reader waiting after the parent ends. */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 1);
        close(null);
    }
    loader_fd = fd;
    int32_t pid = (int32_t)getpid(); /* the parent's to kill, should a load outlive the limit */
    if (!send_all(fd, &pid, sizeof pid)) _exit(0);
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int pr = poll(&pf, 1, LOADER_IDLE_MS);
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) {
            char kind = LEAVING;
            (void)send_all(fd, &kind, 1);
            break;
        }
        if (pr < 0 || !serve_one(fd)) break;
    }
    _exit(0); /* not exit(): the parent's stdio buffers and atexit handlers are the parent's */
}

/* This process's loader: its socket and pid. Owned by one process: a fork of it that loads a spec starts its own.
 * The loader is a grandchild (its parent exits at once), so that a loader that leaves is nobody's zombie. */
static struct {
    pid_t owner, pid;
    int fd;
} loader = {0, 0, -1};
static pthread_mutex_t loader_lock = PTHREAD_MUTEX_INITIALIZER;

/* Forgets the loader, killing it first where it may be running a load. */
static void loader_drop(bool kill_it) {
    if (kill_it && loader.pid > 0) kill(loader.pid, SIGKILL);
    if (loader.fd >= 0) close(loader.fd);
    loader.pid = 0;
    loader.fd = -1;
}

static int loader_start(char *why, size_t len) {
    if (loader.owner != getpid()) { /* inherited from the process that forked this one: not ours to use */
        if (loader.fd >= 0) close(loader.fd);
        loader.pid = 0;
        loader.fd = -1;
        loader.owner = getpid();
    }
    if (loader.fd >= 0) return 0;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(why, len, "socketpair: %s", strerror(errno));
        return -1;
    }
    fflush(NULL); /* what this process has buffered must not be written twice, should the loader flush it */
    pid_t mid = fork();
    if (mid < 0) {
        snprintf(why, len, "fork: %s", strerror(errno));
        close(sv[0]);
        close(sv[1]);
        return -1;
    }
    if (mid == 0) {
        close(sv[0]);
        pid_t pid = fork();
        if (pid == 0) loader_main(sv[1]);
        _exit(pid < 0 ? 1 : 0);
    }
    close(sv[1]);
    int st = 0;
    while (waitpid(mid, &st, 0) < 0 && errno == EINTR) {
    }
    int32_t pid = 0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || recv_all(sv[0], &pid, sizeof pid, cp_now() + 30) != 1 || pid <= 0) {
        snprintf(why, len, "the process did not start");
        close(sv[0]);
        return -1;
    }
    loader.pid = pid;
    loader.fd = sv[0];
    return 0;
}

/* One load through the loader process; the answer into a, or -1 with the message already in c. */
static int loader_call(ctx *c, const source *src, const char *const *sets, int nsets, loader_answer *a) {
    cp_str body = {0};
    loader_request q = {.limit = spec_time_limit_s, .counter = gpu_counter != NULL, .nsets = nsets};
    q.shown_len = strlen(src->shown);
    q.text_len = src->len;
    cp_str_append(&body, src->shown, q.shown_len);
    cp_str_append(&body, src->text, src->len);
    for (int i = 0; i < nsets; i++) cp_str_append(&body, sets[i], strlen(sets[i]) + 1);
    q.sets_len = body.len - q.shown_len - q.text_len;
    int cwd = open(".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    char why[128];
    int rc = -1;
    /* A loader that left or retired since the last load shows as a failed send or as its LEAVING word in place of
     * an answer: then the load goes to a new one. A third time is not a race but a fault. */
    for (int attempt = 0; attempt < 3; attempt++) {
        if (loader_start(why, sizeof why) < 0) {
            fail(c, NULL, "cannot start the process that runs specs: %s", why);
            goto out;
        }
        if (!send_head(loader.fd, &q, cwd, 2) || !send_all(loader.fd, body.data, body.len)) {
            loader_drop(false);
            continue;
        }
        double deadline = cp_now() + q.limit + LOADER_GRACE_S;
        bool timed_out = false, left = false;
        for (;;) {
            char kind;
            int r = recv_all(loader.fd, &kind, 1, deadline);
            if (r < 0) timed_out = true;
            if (r != 1) break;
            if (kind == LEAVING) {
                left = true;
                break;
            }
            if (kind == ASK_GPUS) {
                double t0 = cp_now();
                gpu_answer g = {.count = 1};
                g.count = gpu_counter ? gpu_counter(g.found, sizeof g.found) : 1;
                deadline += cp_now() - t0;
                if (!send_all(loader.fd, &g, sizeof g)) break;
                continue;
            }
            if (kind != ANSWER) break;
            r = recv_all(loader.fd, a, sizeof *a, deadline);
            if (r < 0) timed_out = true;
            if (r != 1) break;
            if (a->retire) loader_drop(false);
            a->err[sizeof a->err - 1] = 0;
            rc = 0;
            goto out;
        }
        loader_drop(!left); /* stuck or dead: either way this one is done */
        if (left) continue;
        if (timed_out)
            fail(c, NULL, "the spec ran for more than %g s and was stopped inside one call of a library function "
                 "(a pattern that backtracks over a long string, string.rep, table.sort, ...); does it loop "
                 "forever?", q.limit);
        else
            fail(c, NULL, "cpgen's spec loader crashed running the spec (it ended without an answer); this is a bug "
                 "in cpgen");
        goto out;
    }
    fail(c, NULL, "cannot hand the spec to the process that runs specs: it keeps leaving");
out:
    if (cwd >= 0) close(cwd);
    cp_str_free(&body);
    return rc;
}

static int load_source_spec(const source *src, const char *const *sets, int nsets, cp_spec *out, char *err,
                            int errlen) {
    ctx c = {.file = src->shown, .sets = sets, .nsets = nsets, .err = err, .errlen = errlen};
    if (err && errlen > 0) err[0] = 0;
    loader_answer *a = cp_xcalloc(1, sizeof *a);
    pthread_mutex_lock(&loader_lock); /* one load at a time talks to the loader */
    int rc = loader_call(&c, src, sets, nsets, a);
    pthread_mutex_unlock(&loader_lock);
    if (rc == 0) {
        rc = a->rc;
        put_err(err, errlen, a->err);
        if (rc == 0) *out = a->spec;
    }
    free(a);
    return rc;
}

int cp_spec_load_string(const char *chunkname, const char *text, const char *const *sets, int nsets, cp_spec *out,
                        char *err, int errlen) {
    source src = {.owned = NULL, .text = text, .len = strlen(text)};
    snprintf(src.shown, sizeof src.shown, "%s", chunkname);
    return load_source_spec(&src, sets, nsets, out, err, errlen);
}

int cp_spec_load(const char *path, const char *const *sets, int nsets, cp_spec *out, char *err, int errlen) {
    source src;
    int e = ENOENT;
    char why[256];
    bool found = file_source(path, &src, &e, why, sizeof why);
    if (!found && e == ENOENT) {
        /* Not a file here: a shipped spec, by its source path ("specs/tiny.lua") or name ("tiny", "tiny.lua"). */
        char full[CP_PATH_MAX];
        size_t n = strlen(path);
        snprintf(full, sizeof full, "specs/%s%s", path, n > 4 && strcmp(path + n - 4, ".lua") == 0 ? "" : ".lua");
        found = embedded_source(path, &src) || (!strchr(path, '/') && embedded_source(full, &src));
    }
    if (!found) {
        char names[512], near[CP_NAME_MAX], typed[CP_NAME_MAX];
        name_from_path(path, typed, sizeof typed);
        shipped_names(names, sizeof names, typed, near, sizeof near);
        ctx c = {.file = path, .err = err, .errlen = errlen};
        if (*near && e == ENOENT)
            return fail(&c, NULL, "cannot read spec: %s; did you mean the shipped spec '%s'? (shipped: %s)",
                        why, near, names);
        return fail(&c, NULL, "cannot read spec: %s; give a spec file or a shipped spec name (%s)", why, names);
    }
    int rc = load_source_spec(&src, sets, nsets, out, err, errlen);
    free(src.owned);
    return rc;
}

int cp_spec_check(const cp_spec *spec, char *err, int errlen) {
    ctx c = {.file = spec->path, .err = err, .errlen = errlen};
    if (err && errlen > 0) err[0] = 0;
    cp_spec *copy = cp_xmalloc(sizeof *copy);
    *copy = *spec;
    int rc = validate(&c, copy);
    free(copy);
    return rc;
}

/* ------------------------------------------------------------------------------------------------------------
 * Names and parameter counts. */

const char *cp_family_name(cp_family f) { return (unsigned)f < CP_ARRAY_LEN(FAMILY_NAMES) - 1 ? FAMILY_NAMES[f] : "?"; }

const char *cp_offload_name(cp_offload o) {
    return (unsigned)o < CP_ARRAY_LEN(OFFLOAD_NAMES) - 1 ? OFFLOAD_NAMES[o] : "?";
}

const char *cp_opt_place_name(cp_opt_place o) { return (unsigned)o < CP_ARRAY_LEN(OPT_NAMES) - 1 ? OPT_NAMES[o] : "?"; }

const char *cp_fp8_gemm_name(cp_fp8_gemm g) {
    return (unsigned)g < CP_ARRAY_LEN(FP8_GEMM_NAMES) - 1 ? FP8_GEMM_NAMES[g] : "?";
}

const char *cp_fp8_scaling_name(cp_fp8_scaling s) {
    return (unsigned)s < CP_ARRAY_LEN(FP8_SCALING_NAMES) - 1 ? FP8_SCALING_NAMES[s] : "?";
}

const char *cp_fp8_fast_name(cp_fp8_fast f) {
    return (unsigned)f < CP_ARRAY_LEN(FP8_FAST_NAMES) - 1 ? FP8_FAST_NAMES[f] : "?";
}

const char *cp_attn_keep_name(cp_attn_keep a) {
    return (unsigned)a < CP_ARRAY_LEN(ATTN_KEEP_NAMES) - 1 ? ATTN_KEEP_NAMES[a] : "?";
}

int64_t cp_model_layer_params(const cp_model *m) {
    int64_t q = m->hidden * m->heads * m->head_dim;
    int64_t kv = 2 * m->hidden * m->kv_heads * m->head_dim;
    int64_t o = m->heads * m->head_dim * m->hidden;
    int64_t mlp = 3 * m->hidden * m->ffn;
    int64_t norms = 2 * m->hidden + (m->qk_norm ? 2 * m->head_dim : 0);
    return q + kv + o + mlp + norms;
}

int64_t cp_model_params(const cp_model *m) {
    int64_t emb = m->vocab * m->hidden;
    return m->layers * cp_model_layer_params(m) + emb + (m->tie_embeddings ? 0 : emb) + m->hidden;
}

bool cp_val_split(const char *val, double *fraction) {
    *fraction = NAN;
    if (strncmp(val, "split:", 6) != 0) return false;
    const char *num = val + 6;
    char *end;
    errno = 0;
    double f = strtod(num, &end);
    /* a plain decimal number: strtod also reads "nan", "inf" and hex floats, which no one means here */
    if (end == num || *end || errno || strspn(num, "0123456789.eE+-") != strlen(num) || !(f > 0 && f < 1))
        return false;
    *fraction = f;
    return true;
}

double cp_machine_attn_tflops(const cp_machine *mc, bool backward, int64_t head_dim) {
    if (head_dim <= 64) return backward ? mc->attn_bwd_tflops_d64 : mc->attn_fwd_tflops_d64;
    return backward ? mc->attn_bwd_tflops : mc->attn_fwd_tflops;
}
