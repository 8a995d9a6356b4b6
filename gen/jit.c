/* jit.c: compile emitted modules to CUBIN with NVRTC on a pool of threads, through an on-disk cache keyed by
 * everything that decides the output (source, options, arch, NVRTC version, cpgen version).
 *
 * Cache entry <dir>/<module>-<key>.cubin, all integers little-endian:
 *   header (64 bytes): magic "CPGNCUBN", u32 format version, u32 header length (64), u64 key[2],
 *                      u64 payload length, u64 payload hash[2], u64 reserved (0)
 *   payload:           u64 cubin length, cubin bytes, u32 entry count,
 *                      per entry: u32 name length, name bytes, i32 registers, shared, stack, spill stores, spill loads,
 *                      u32 warnings length, warnings text
 * The emitted source is kept beside it as <module>-<key>.cu, and on a failed compile the NVRTC log as .log.
 * Anything that does not verify (magic, version, key, length, payload hash, payload structure) is rebuilt.
 *
 * NVRTC is loaded with dlopen the first time something must be compiled, not linked: a machine that runs only AOT
 * bundles (cpgen aot) needs no libnvrtc. */
#include "jit.h"

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <nvrtc.h>
#include <pthread.h>
#include <pwd.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

#define CACHE_MAGIC "CPGNCUBN"
#define CACHE_FORMAT 1u
#define CACHE_HEADER 64u
#define JIT_MAX_OPTS 8
#define JIT_ERR 8192

/* ---- hashing: two independent 64-bit hashes make a 128-bit key ---- */

static uint64_t mix64(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/* A word-at-a-time multiply-rotate hash; unrelated in structure to FNV-1a (cp_hash64), so a collision in one is
 * not a collision in the other. */
static uint64_t hash_words(const void *data, size_t n) {
    const unsigned char *p = data;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0xc2b2ae3d27d4eb4fULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h ^= mix64(w);
        h = ((h << 27) | (h >> 37)) * 0x9e3779b97f4a7c15ULL + 0x52dce729ULL;
        p += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h ^= mix64(w ^ ((uint64_t)n << 56));
    return mix64(h);
}

static void hash128(const void *data, size_t n, uint64_t out[2]) {
    out[0] = cp_hash64(data, n, CP_HASH_SEED);
    out[1] = hash_words(data, n);
}

/* ---- little-endian serialisation ---- */

static void put_u32(cp_str *s, uint32_t v) {
    unsigned char b[4];
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
    cp_str_append(s, (const char *)b, 4);
}

static void put_u64(cp_str *s, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    cp_str_append(s, (const char *)b, 8);
}

static uint32_t get_u32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint64_t get_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* A bounds-checked reader over a payload. */
typedef struct {
    const unsigned char *p;
    size_t len, pos;
    bool bad;
} reader;

static const unsigned char *take(reader *r, size_t n) {
    if (r->bad || n > r->len - r->pos) {
        r->bad = true;
        return NULL;
    }
    const unsigned char *q = r->p + r->pos;
    r->pos += n;
    return q;
}

static uint32_t take_u32(reader *r) {
    const unsigned char *q = take(r, 4);
    return q ? get_u32(q) : 0;
}

static uint64_t take_u64(reader *r) {
    const unsigned char *q = take(r, 8);
    return q ? get_u64(q) : 0;
}

/* ---- NVRTC through dlopen ---- */

/* The NVRTC functions cpgen calls, resolved from the library once it loads. */
static struct {
    const char *(*GetErrorString)(nvrtcResult);
    nvrtcResult (*Version)(int *, int *);
    nvrtcResult (*GetNumSupportedArchs)(int *);
    nvrtcResult (*GetSupportedArchs)(int *);
    nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                                 const char *const *);
    nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*DestroyProgram)(nvrtcProgram *);
} nv;
static pthread_mutex_t nv_lock = PTHREAD_MUTEX_INITIALIZER;
static void *nv_handle;
static atomic_int nv_requests;

int cp_nvrtc_requests(void) { return atomic_load(&nv_requests); }

/* Resolve one symbol into *slot; false with the name in err when the library lacks it. */
static bool nv_sym(void *h, const char *name, void *slot, char *err, int errlen) {
    void *f = dlsym(h, name);
    if (!f) {
        snprintf(err, errlen, "the NVRTC library has no %s: it is older than cpgen needs (CUDA 12 or later)", name);
        return false;
    }
    memcpy(slot, &f, sizeof f);
    return true;
}

int cp_nvrtc_load(char *err, int errlen) {
    atomic_fetch_add(&nv_requests, 1);
    pthread_mutex_lock(&nv_lock);
    if (nv_handle) {
        pthread_mutex_unlock(&nv_lock);
        return 0;
    }
    const char *forced = getenv("CPGEN_NVRTC_LIB");
    const char *names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    cp_str tried = {0};
    void *h = NULL;
    if (forced && forced[0]) {
        h = dlopen(forced, RTLD_NOW | RTLD_LOCAL);
        if (!h) cp_str_printf(&tried, "$CPGEN_NVRTC_LIB: %s", dlerror());
    } else {
        for (size_t i = 0; i < CP_ARRAY_LEN(names) && !h; i++) {
            h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
            if (!h) cp_str_printf(&tried, "%s%s", i ? ", " : "", names[i]);
        }
    }
    bool ok = h != NULL;
    if (!ok)
        snprintf(err, errlen, "NVRTC, the CUDA runtime compiler, is not installed here (tried %s), so this machine "
                 "cannot compile cpgen's kernels. Install the CUDA toolkit's NVRTC (libnvrtc) or add its folder to "
                 "LD_LIBRARY_PATH; or compile ahead of time on a machine that has it, `cpgen aot SPEC -o BUNDLE --arch "
                 "sm_90a`, copy BUNDLE here and `cpgen run BUNDLE`, which never compiles",
                 tried.data ? tried.data : "?");
    cp_str_free(&tried);
    ok = ok && nv_sym(h, "nvrtcGetErrorString", &nv.GetErrorString, err, errlen) &&
         nv_sym(h, "nvrtcVersion", &nv.Version, err, errlen) &&
         nv_sym(h, "nvrtcGetNumSupportedArchs", &nv.GetNumSupportedArchs, err, errlen) &&
         nv_sym(h, "nvrtcGetSupportedArchs", &nv.GetSupportedArchs, err, errlen) &&
         nv_sym(h, "nvrtcCreateProgram", &nv.CreateProgram, err, errlen) &&
         nv_sym(h, "nvrtcCompileProgram", &nv.CompileProgram, err, errlen) &&
         nv_sym(h, "nvrtcGetProgramLogSize", &nv.GetProgramLogSize, err, errlen) &&
         nv_sym(h, "nvrtcGetProgramLog", &nv.GetProgramLog, err, errlen) &&
         nv_sym(h, "nvrtcGetCUBINSize", &nv.GetCUBINSize, err, errlen) &&
         nv_sym(h, "nvrtcGetCUBIN", &nv.GetCUBIN, err, errlen) &&
         nv_sym(h, "nvrtcDestroyProgram", &nv.DestroyProgram, err, errlen);
    if (ok) nv_handle = h;
    else if (h) dlclose(h);
    pthread_mutex_unlock(&nv_lock);
    return ok ? 0 : -1;
}

int cp_nvrtc_version(int *major, int *minor, char *err, int errlen) {
    if (cp_nvrtc_load(err, errlen)) return -1;
    nvrtcResult r = nv.Version(major, minor);
    if (r != NVRTC_SUCCESS)
        return cp_errf(err, errlen, "nvrtcVersion failed (%s); the NVRTC library may be broken: reinstall the CUDA "
                       "toolkit's NVRTC", nv.GetErrorString(r));
    return 0;
}

/* ---- the environment: NVRTC version, CUDA headers, cache folder ---- */

void cp_jit_cache_dir(const cp_jit_opts *opts, char *out, size_t n) {
    if (opts && opts->cache_dir[0]) {
        snprintf(out, n, "%s", opts->cache_dir);
        return;
    }
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') { /* the XDG spec ignores relative values */
        snprintf(out, n, "%s/cpgen", xdg);
        return;
    }
    const char *home = getenv("HOME");
    if (!home || !home[0]) {
        struct passwd *pw = getpwuid(getuid());
        home = pw ? pw->pw_dir : NULL;
    }
    if (home && home[0]) snprintf(out, n, "%s/.cache/cpgen", home);
    else snprintf(out, n, "/tmp/cpgen-cache-%ld", (long)getuid());
}

static bool has_bf16_header(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/cuda_bf16.h", dir);
    return access(path, R_OK) == 0;
}

/* The CUDA include folder holding cuda_bf16.h: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, then beside the libnvrtc
 * this process loaded (toolkit layout lib64/../include, or a pip wheel's nvidia/cuda_runtime/include). */
static int find_cuda_include(char *out, size_t n, char *err, int errlen) {
    cp_str tried = {0};
    const char *envs[] = {"CUDA_HOME", "CUDA_PATH"};
    for (size_t i = 0; i < CP_ARRAY_LEN(envs); i++) {
        const char *v = getenv(envs[i]);
        if (!v || !v[0]) continue;
        snprintf(out, n, "%s/include", v);
        if (has_bf16_header(out)) goto found;
        cp_str_printf(&tried, " %s (from $%s)", out, envs[i]);
    }
    snprintf(out, n, "/usr/local/cuda/include");
    if (has_bf16_header(out)) goto found;
    cp_str_printf(&tried, " %s", out);
    Dl_info info;
    void *nv_fn;
    memcpy(&nv_fn, &nv.Version, sizeof nv_fn);
    if (dladdr(nv_fn, &info) && info.dli_fname) {
        char lib[1024];
        snprintf(lib, sizeof lib, "%s", info.dli_fname);
        char *slash = strrchr(lib, '/');
        if (slash) {
            *slash = 0;
            const char *rel[] = {"/../include", "/../../include", "/../../cuda_runtime/include"};
            for (size_t i = 0; i < CP_ARRAY_LEN(rel); i++) {
                snprintf(out, n, "%s%s", lib, rel[i]);
                if (has_bf16_header(out)) goto found;
                cp_str_printf(&tried, " %s", out);
            }
        }
    }
    snprintf(err, errlen, "cannot find the CUDA header cuda_bf16.h that the kernels include; looked in:%s. Set "
             "CUDA_HOME to the CUDA toolkit folder (the one holding include/cuda_bf16.h)", tried.data ? tried.data : "");
    cp_str_free(&tried);
    return -1;
found:
    cp_str_free(&tried);
    return 0;
}

/* "sm_90a" -> 90; -1 when it is not sm_<digits>[a|f]. */
static int arch_number(const char *arch) {
    if (strncmp(arch, "sm_", 3) != 0 || !isdigit((unsigned char)arch[3])) return -1;
    const char *p = arch + 3;
    int v = 0;
    while (isdigit((unsigned char)*p)) v = v * 10 + (*p++ - '0');
    if (*p == 'a' || *p == 'f') p++;
    return *p ? -1 : v;
}

static int check_arch(const char *arch, char *err, int errlen) {
    int want = arch_number(arch);
    if (want < 0) {
        snprintf(err, errlen, "GPU architecture \"%s\" is not of the form sm_<number>[a] (e.g. sm_90a for H100/H200, "
                 "sm_80 for A100); cpgen compiles to CUBIN, which needs a real architecture, not compute_*", arch);
        return -1;
    }
    int num = 0;
    nvrtcResult r = nv.GetNumSupportedArchs(&num);
    if (r != NVRTC_SUCCESS || num <= 0 || num > 256) {
        snprintf(err, errlen, "nvrtcGetNumSupportedArchs failed (%s) while checking arch %s; the NVRTC library may be "
                 "broken: reinstall the CUDA toolkit's NVRTC", nv.GetErrorString(r), arch);
        return -1;
    }
    int archs[256];
    r = nv.GetSupportedArchs(archs);
    if (r != NVRTC_SUCCESS) {
        snprintf(err, errlen, "nvrtcGetSupportedArchs failed (%s) while checking arch %s; the NVRTC library may be "
                 "broken: reinstall the CUDA toolkit's NVRTC", nv.GetErrorString(r), arch);
        return -1;
    }
    cp_str list = {0};
    for (int i = 0; i < num; i++) {
        if (archs[i] == want) {
            cp_str_free(&list);
            return 0;
        }
        cp_str_printf(&list, "%ssm_%d", i ? " " : "", archs[i]);
    }
    int maj = 0, min = 0;
    nv.Version(&maj, &min);
    snprintf(err, errlen, "GPU architecture %s is not supported by NVRTC %d.%d, which compiles for: %s; pick one of "
             "those with --arch or use a CUDA toolkit that supports it", arch, maj, min, list.data ? list.data : "");
    cp_str_free(&list);
    return -1;
}

/* ---- ptxas -v log ---- */

static int entry_index(const cp_module_src *m, const char *name, size_t len) {
    for (int i = 0; i < m->nentries; i++)
        if (strlen(m->entries[i]) == len && strncmp(m->entries[i], name, len) == 0) return i;
    return -1;
}

static int int_before(const char *line, const char *what) {
    const char *at = strstr(line, what);
    if (!at) return -1;
    const char *p = at;
    while (p > line && p[-1] == ' ') p--;
    const char *digits = p;
    while (digits > line && isdigit((unsigned char)digits[-1])) digits--;
    return digits < p ? atoi(digits) : -1;
}

/* ptxas -v (CUDA 13.0) prints, per entry:
 *   ptxas info    : Compiling entry function 'NAME' for 'sm_90a'
 *   ptxas info    : Function properties for NAME
 *   ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
 *   ptxas info    : Used 10 registers, used 1 barriers, 256 bytes smem, 360 bytes cmem[0]
 * "smem", "cmem" and "cumulative stack size" items appear only when non-zero or relevant for the arch; a non-entry
 * __noinline__ function gets its own "Function properties" block, which is not attributed to any entry. */
int cp_jit_parse_ptxas_log(const char *log, const cp_module_src *m, cp_entry_info *out) {
    for (int i = 0; i < m->nentries; i++) {
        memset(&out[i], 0, sizeof out[i]);
        snprintf(out[i].name, sizeof out[i].name, "%s", m->entries[i]);
        out[i].registers = -1;
    }
    bool seen[CP_MAX_ENTRIES] = {0};
    int cur = -1, props = -1;
    for (const char *p = log ? log : ""; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char line[1024];
        size_t cl = CP_MIN(len, sizeof line - 1);
        memcpy(line, p, cl);
        line[cl] = 0;
        p += len + (nl ? 1 : 0);

        const char *k;
        if ((k = strstr(line, "Compiling entry function '"))) {
            k += strlen("Compiling entry function '");
            const char *q = strchr(k, '\'');
            cur = q ? entry_index(m, k, (size_t)(q - k)) : -1;
            if (cur >= 0) seen[cur] = true;
        } else if ((k = strstr(line, "Function properties for "))) {
            k += strlen("Function properties for ");
            size_t kl = strlen(k);
            while (kl && isspace((unsigned char)k[kl - 1])) kl--;
            props = entry_index(m, k, kl);
        } else if (strstr(line, "bytes stack frame")) {
            if (props >= 0) {
                int frame = int_before(line, "bytes stack frame");
                out[props].stack_bytes = CP_MAX(out[props].stack_bytes, frame);
                out[props].spill_stores = CP_MAX(0, int_before(line, "bytes spill stores"));
                out[props].spill_loads = CP_MAX(0, int_before(line, "bytes spill loads"));
            }
            props = -1;
        } else if ((k = strstr(line, "Used ")) && strstr(k, "registers")) {
            if (cur >= 0) {
                out[cur].registers = atoi(k + strlen("Used "));
                int smem = int_before(line, "bytes smem");
                if (smem > 0) out[cur].shared_bytes = smem;
                int cum = int_before(line, "bytes cumulative stack size");
                out[cur].stack_bytes = CP_MAX(out[cur].stack_bytes, cum);
            }
        }
    }
    int found = 0;
    for (int i = 0; i < m->nentries; i++) found += seen[i];
    return found;
}

/* When ptxas printed no report for some entries (seen on the GPU machine for modules it had compiled before in
 * another process), read what the CUBIN itself says. An entry was compiled iff its .text.<name> section exists;
 * the global .nv.info section holds, per function symbol, attribute records (format byte 4: u16 size + data)
 * of which 0x2f is the register count and 0x11 the stack frame (spilling needs one); .nv.shared.<name> is the
 * static shared memory. Returns the number of entries found. */
typedef struct {
    const unsigned char *b;
    size_t len;
    uint64_t shoff, stroff, strsize;
    uint16_t shentsize, shnum;
} elf_view;

static bool elf_section(const elf_view *v, uint16_t i, uint32_t *type, uint64_t *off, uint64_t *size,
                        uint32_t *link, const char **name) {
    const unsigned char *h = v->b + v->shoff + (size_t)i * v->shentsize;
    uint32_t nm;
    memcpy(&nm, h, 4);
    memcpy(type, h + 4, 4);
    memcpy(off, h + 0x18, 8);
    memcpy(size, h + 0x20, 8);
    memcpy(link, h + 0x28, 4);
    if (nm >= v->strsize || strnlen((const char *)v->b + v->stroff + nm, v->strsize - nm) == v->strsize - nm)
        return false;
    *name = (const char *)v->b + v->stroff + nm;
    return *type == 8 /* NOBITS */ || (*off <= v->len && *size <= v->len - *off);
}

int cp_jit_entries_from_cubin(const void *cubin, size_t len, const cp_module_src *m, cp_entry_info *out) {
    elf_view v = {.b = cubin, .len = len};
    if (!cubin || len < 64 || memcmp(v.b, "\177ELF", 4) != 0 || v.b[4] != 2 /* 64-bit */) return 0;
    uint16_t shstrndx;
    memcpy(&v.shoff, v.b + 0x28, 8);
    memcpy(&v.shentsize, v.b + 0x3a, 2);
    memcpy(&v.shnum, v.b + 0x3c, 2);
    memcpy(&shstrndx, v.b + 0x3e, 2);
    if (v.shentsize < 64 || shstrndx >= v.shnum || v.shoff > len || (uint64_t)v.shnum * v.shentsize > len - v.shoff)
        return 0;
    const unsigned char *sh = v.b + v.shoff + (size_t)shstrndx * v.shentsize;
    memcpy(&v.stroff, sh + 0x18, 8);
    memcpy(&v.strsize, sh + 0x20, 8);
    if (v.stroff > len || v.strsize > len - v.stroff) return 0;
    int sym[CP_MAX_ENTRIES], found = 0;
    const unsigned char *info = NULL;
    uint64_t info_size = 0;
    for (int e = 0; e < m->nentries; e++) sym[e] = -1;
    for (uint16_t i = 0; i < v.shnum; i++) {
        uint32_t type, link;
        uint64_t off, size;
        const char *name;
        if (!elf_section(&v, i, &type, &off, &size, &link, &name)) continue;
        if (!strcmp(name, ".nv.info")) {
            info = v.b + off;
            info_size = size;
        }
        for (int e = 0; e < m->nentries; e++) {
            if (!strncmp(name, ".text.", 6) && !strcmp(name + 6, m->entries[e])) sym[e] = -2; /* compiled */
            if (!strncmp(name, ".nv.shared.", 11) && !strcmp(name + 11, m->entries[e]) && out[e].shared_bytes == 0)
                out[e].shared_bytes = (int)size;
        }
    }
    for (uint16_t i = 0; i < v.shnum; i++) { /* after the pass above: symbols name the compiled entries */
        uint32_t type, link;
        uint64_t off, size;
        const char *name;
        if (!elf_section(&v, i, &type, &off, &size, &link, &name)) continue;
        if (type != 2 /* SYMTAB */ || link >= v.shnum) continue;
        uint32_t st, sl;
        uint64_t soff, ssize;
        const char *sname;
        if (!elf_section(&v, (uint16_t)link, &st, &soff, &ssize, &sl, &sname)) continue;
        for (uint64_t k = 0; k + 24 <= size; k += 24) { /* Elf64_Sym */
            uint32_t nm;
            memcpy(&nm, v.b + off + k, 4);
            if (nm >= ssize) continue;
            const char *symname = (const char *)v.b + soff + nm;
            for (int e = 0; e < m->nentries; e++)
                if (strnlen(symname, ssize - nm) < ssize - nm && !strcmp(symname, m->entries[e]) && sym[e] == -2)
                    sym[e] = (int)(k / 24);
        }
    }
    for (int e = 0; e < m->nentries; e++) {
        if (sym[e] == -1) continue;
        found++;
        for (uint64_t p = 0; info && p + 4 <= info_size;) {
            uint8_t fmt = info[p], attr = info[p + 1];
            if (fmt != 4) { /* values without a size field: 2 bytes (none), 4 bytes (byte or half value) */
                p += fmt == 1 ? 2 : 4;
                continue;
            }
            uint16_t sz;
            memcpy(&sz, info + p + 2, 2);
            if (p + 4 + sz > info_size) break;
            uint32_t s, val;
            if (sz >= 8) {
                memcpy(&s, info + p + 4, 4);
                memcpy(&val, info + p + 8, 4);
                if ((int)s == sym[e] && attr == 0x2f && out[e].registers < 0) out[e].registers = (int)val;
                if ((int)s == sym[e] && attr == 0x11) out[e].stack_bytes = CP_MAX(out[e].stack_bytes, (int)val);
            }
            p += 4 + (uint64_t)sz;
        }
    }
    return found;
}

/* Lines of an NVRTC log worth showing after a successful compile: front-end warnings and ptxas warnings or
 * performance notes (e.g. wgmma serialisation on sm_90a). NULL when there are none. */
static char *log_warnings(const char *log) {
    cp_str s = {0};
    for (const char *p = log ? log : ""; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        char line[2048];
        size_t cl = CP_MIN(len, sizeof line - 1);
        memcpy(line, p, cl);
        line[cl] = 0;
        p += len + (nl ? 1 : 0);
        if (strstr(line, "warning") || strstr(line, "Performance Loss") || strstr(line, "Warning")) {
            cp_str_append(&s, line, cl);
            cp_str_append(&s, "\n", 1);
        }
    }
    return s.data;
}

/* ---- cache entries ---- */

static void serialize_entry(const cp_jit_module *m, const uint64_t key[2], cp_str *file) {
    cp_str pay = {0};
    put_u64(&pay, m->cubin_len);
    cp_str_append(&pay, m->cubin, m->cubin_len);
    put_u32(&pay, (uint32_t)m->nentries);
    for (int i = 0; i < m->nentries; i++) {
        const cp_entry_info *e = &m->entries[i];
        uint32_t nl = (uint32_t)strlen(e->name);
        put_u32(&pay, nl);
        cp_str_append(&pay, e->name, nl);
        put_u32(&pay, (uint32_t)e->registers);
        put_u32(&pay, (uint32_t)e->shared_bytes);
        put_u32(&pay, (uint32_t)e->stack_bytes);
        put_u32(&pay, (uint32_t)e->spill_stores);
        put_u32(&pay, (uint32_t)e->spill_loads);
    }
    uint32_t wl = m->warnings ? (uint32_t)strlen(m->warnings) : 0;
    put_u32(&pay, wl);
    if (wl) cp_str_append(&pay, m->warnings, wl);

    uint64_t ph[2];
    hash128(pay.data, pay.len, ph);
    cp_str_append(file, CACHE_MAGIC, 8);
    put_u32(file, CACHE_FORMAT);
    put_u32(file, CACHE_HEADER);
    put_u64(file, key[0]);
    put_u64(file, key[1]);
    put_u64(file, pay.len);
    put_u64(file, ph[0]);
    put_u64(file, ph[1]);
    put_u64(file, 0);
    cp_str_append(file, pay.data, pay.len);
    cp_str_free(&pay);
}

/* Fill m from a cache file's bytes. Returns 0, or -1 with why in `why`. */
static int parse_entry(const unsigned char *d, size_t len, const uint64_t key[2], const cp_module_src *src,
                       cp_jit_module *m, char *why, size_t whylen) {
    if (len < CACHE_HEADER) {
        snprintf(why, whylen, "%zu bytes, shorter than its header", len);
        return -1;
    }
    if (memcmp(d, CACHE_MAGIC, 8) != 0) {
        snprintf(why, whylen, "bad magic");
        return -1;
    }
    if (get_u32(d + 8) != CACHE_FORMAT || get_u32(d + 12) != CACHE_HEADER) {
        snprintf(why, whylen, "format version %u, expected %u", get_u32(d + 8), CACHE_FORMAT);
        return -1;
    }
    if (get_u64(d + 16) != key[0] || get_u64(d + 24) != key[1]) {
        snprintf(why, whylen, "key does not match its file name");
        return -1;
    }
    uint64_t plen = get_u64(d + 32);
    if (plen != len - CACHE_HEADER) {
        snprintf(why, whylen, "payload is %zu bytes, header says %llu (truncated?)", len - CACHE_HEADER,
                 (unsigned long long)plen);
        return -1;
    }
    uint64_t ph[2];
    hash128(d + CACHE_HEADER, (size_t)plen, ph);
    if (ph[0] != get_u64(d + 40) || ph[1] != get_u64(d + 48)) {
        snprintf(why, whylen, "payload hash mismatch");
        return -1;
    }
    reader r = {d + CACHE_HEADER, (size_t)plen, 0, false};
    uint64_t clen = take_u64(&r);
    const unsigned char *cubin = clen <= plen ? take(&r, (size_t)clen) : NULL;
    uint32_t ne = take_u32(&r);
    if (!cubin || clen < 4 || ne != (uint32_t)src->nentries) {
        snprintf(why, whylen, "payload does not describe this module's %d entries", src->nentries);
        return -1;
    }
    cp_entry_info ents[CP_MAX_ENTRIES];
    for (uint32_t i = 0; i < ne; i++) {
        uint32_t nl = take_u32(&r);
        const unsigned char *name = nl < CP_KNAME_MAX ? take(&r, nl) : NULL;
        if (!name || strlen(src->entries[i]) != nl || memcmp(name, src->entries[i], nl) != 0) {
            snprintf(why, whylen, "entry %u is not %s", i, src->entries[i]);
            return -1;
        }
        memset(&ents[i], 0, sizeof ents[i]);
        memcpy(ents[i].name, name, nl);
        ents[i].registers = (int32_t)take_u32(&r);
        ents[i].shared_bytes = (int32_t)take_u32(&r);
        ents[i].stack_bytes = (int32_t)take_u32(&r);
        ents[i].spill_stores = (int32_t)take_u32(&r);
        ents[i].spill_loads = (int32_t)take_u32(&r);
    }
    uint32_t wl = take_u32(&r);
    const unsigned char *w = take(&r, wl);
    if (r.bad || r.pos != r.len) {
        snprintf(why, whylen, "payload structure is inconsistent");
        return -1;
    }
    m->cubin = cp_xmalloc((size_t)clen);
    memcpy(m->cubin, cubin, (size_t)clen);
    m->cubin_len = (size_t)clen;
    m->nentries = (int)ne;
    memcpy(m->entries, ents, sizeof(cp_entry_info) * ne);
    if (wl) {
        m->warnings = cp_xmalloc(wl + 1);
        memcpy(m->warnings, w, wl);
        m->warnings[wl] = 0;
    }
    return 0;
}

/* ---- one compile job ---- */

typedef struct {
    const cp_module_src *src;
    cp_jit_module *out;
    uint64_t key[2];
    char base[1200];        /* <dir>/<module>-<key>, without extension */
    int dup_of;             /* index of an identical earlier module, or -1 */
    int rc;
    char *err;              /* JIT_ERR bytes */
} job;

typedef struct {
    job *jobs;
    int njobs;
    atomic_int next;
    const char *const *opts;
    int nopts;
    bool no_cache;
} pool;

/* base + ext; the caller has checked that base leaves room (cp_jit_compile limits the cache folder's length). */
static void with_ext(char *out, size_t n, const char *base, const char *ext) {
    int w = snprintf(out, n, "%s%s", base, ext);
    if (w < 0 || (size_t)w >= n) cp_fatal(CP_EXIT_FAIL, "internal: cache path %s%s too long", base, ext);
}

static void warn_write(const char *path) {
    fprintf(stderr, "cpgen: warning: cannot write %s (%s); the JIT cache will not keep it\n", path, strerror(errno));
}

static void write_text(const char *path, const char *text) {
    if (cp_write_file_atomic(path, text, strlen(text)) != 0) warn_write(path);
}

static bool try_load(job *j, const char *path) {
    size_t len = 0;
    char why[256];
    char *d = cp_read_file_as(path, CP_FILE_CUBIN, &len, why, sizeof why);
    if (!d) {
        if (errno != ENOENT) fprintf(stderr, "cpgen: cache entry %s unreadable (%s), rebuilding\n", path, why);
        return false;
    }
    int rc = parse_entry((const unsigned char *)d, len, j->key, j->src, j->out, why, sizeof why);
    free(d);
    if (rc != 0) {
        fprintf(stderr, "cpgen: cache entry %s corrupt (%s), rebuilding\n", path, why);
        return false;
    }
    return true;
}

static void options_text(const pool *pl, char *buf, size_t n) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < pl->nopts && o + 1 < n; i++) {
        int w = snprintf(buf + o, n - o, "%s%s", i ? " " : "", pl->opts[i]);
        if (w < 0) break;
        o += (size_t)w;
    }
}

/* A failed compile: keep the log beside the source and say where both are, then the log text. */
static void compile_failed(job *j, const pool *pl, const char *what, const char *log) {
    char logpath[1300], opts[1024];
    with_ext(logpath, sizeof logpath, j->base, ".log");
    options_text(pl, opts, sizeof opts);
    cp_str lf = {0};
    cp_str_printf(&lf, "module %s\noptions: %s\n\n%s", j->src->name, opts, log ? log : "");
    bool log_ok = cp_write_file_atomic(logpath, lf.data, lf.len) == 0;
    if (!log_ok) warn_write(logpath);
    cp_str_free(&lf);
    int w = snprintf(j->err, JIT_ERR, "module %s: %s\n  source: %s\n  log:    %s\n  options: %s\n", j->src->name, what,
                     j->out->source_path[0] ? j->out->source_path : "(not written)", log_ok ? logpath : "(not written)",
                     opts);
    if (w > 0 && w < JIT_ERR && log && log[0]) {
        size_t room = (size_t)(JIT_ERR - w);
        size_t ll = strlen(log);
        if (ll < room) memcpy(j->err + w, log, ll + 1);
        else {
            memcpy(j->err + w, log, room - 5);
            memcpy(j->err + JIT_ERR - 5, "...\n", 5);
        }
    }
    j->rc = -1;
}

static void run_job(job *j, const pool *pl) {
    double t0 = cp_now();
    cp_jit_module *m = j->out;
    char cubin_path[1300], lock_path[1300];
    with_ext(cubin_path, sizeof cubin_path, j->base, ".cubin");
    with_ext(m->source_path, sizeof m->source_path, j->base, ".cu");

    struct stat before;
    bool existed = stat(cubin_path, &before) == 0;
    if (!pl->no_cache && existed && try_load(j, cubin_path)) goto loaded;

    /* Ranks on one node share the cache: the first to take the lock compiles, the others wait and load. */
    with_ext(lock_path, sizeof lock_path, j->base, ".lock");
    /* O_NONBLOCK and O_NOFOLLOW: a FIFO or a link put there must not block nor point the lock elsewhere; a lock
     * that cannot be taken only costs a compile that another process may be doing too */
    int lock = open(lock_path, O_RDWR | O_CREAT | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0644);
    struct stat lst;
    if (lock >= 0 && (fstat(lock, &lst) != 0 || !S_ISREG(lst.st_mode))) {
        close(lock);
        lock = -1;
    }
    if (lock >= 0 && flock(lock, LOCK_EX) != 0) {
        close(lock);
        lock = -1;
    }
    if (lock >= 0 && !pl->no_cache) {
        /* Look again only if another process replaced the entry while this one waited for the lock. */
        struct stat now;
        bool changed = stat(cubin_path, &now) == 0 &&
                       (!existed || now.st_ino != before.st_ino || now.st_size != before.st_size ||
                        now.st_mtim.tv_sec != before.st_mtim.tv_sec || now.st_mtim.tv_nsec != before.st_mtim.tv_nsec);
        if (changed && try_load(j, cubin_path)) {
            close(lock);
            goto loaded;
        }
    }

    /* The source goes to disk before compiling, so a failure can be read and reproduced. */
    if (cp_write_file_atomic(m->source_path, j->src->source, strlen(j->src->source)) != 0) {
        warn_write(m->source_path);
        m->source_path[0] = 0;
    }
    nvrtcProgram prog;
    char cu_name[CP_KNAME_MAX + 8];
    snprintf(cu_name, sizeof cu_name, "%s.cu", j->src->name);
    nvrtcResult r = nv.CreateProgram(&prog, j->src->source, cu_name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) {
        char what[256];
        snprintf(what, sizeof what, "nvrtcCreateProgram failed (%s); out of host memory? free some and try again",
                 nv.GetErrorString(r));
        compile_failed(j, pl, what, NULL);
        goto done;
    }
    nvrtcResult cr = nv.CompileProgram(prog, pl->nopts, pl->opts);
    char *log = NULL;
    size_t loglen = 0;
    r = nv.GetProgramLogSize(prog, &loglen);
    if (r == NVRTC_SUCCESS) {
        log = cp_xmalloc(loglen + 1);
        log[0] = 0;
        r = nv.GetProgramLog(prog, log);
        log[loglen] = 0;
    }
    if (r != NVRTC_SUCCESS) {
        char what[256];
        snprintf(what, sizeof what, "nvrtcGetProgramLog failed (%s) after compiling; the NVRTC library may be broken",
                 nv.GetErrorString(r));
        compile_failed(j, pl, what, NULL);
        goto destroy;
    }
    if (cr != NVRTC_SUCCESS) {
        char what[512];
        snprintf(what, sizeof what, "NVRTC could not compile it (%s); the log below and the kept source show where. "
                 "If the error is in a template, fix templates/%s.cu and rebuild cpgen",
                 nv.GetErrorString(cr), j->src->family);
        compile_failed(j, pl, what, log);
        goto destroy;
    }
    size_t clen = 0;
    r = nv.GetCUBINSize(prog, &clen);
    if (r == NVRTC_SUCCESS && clen > 0) {
        m->cubin = cp_xmalloc(clen);
        r = nv.GetCUBIN(prog, m->cubin);
        m->cubin_len = clen;
    }
    if (r != NVRTC_SUCCESS || clen == 0) {
        char what[256];
        snprintf(what, sizeof what, "nvrtcGetCUBIN failed (%s, %zu bytes); the arch must be a real sm_XX for NVRTC "
                 "to produce a CUBIN", nv.GetErrorString(r), clen);
        compile_failed(j, pl, what, log);
        goto destroy;
    }
    int found = cp_jit_parse_ptxas_log(log, j->src, m->entries);
    m->nentries = j->src->nentries;
    bool from_elf = found != j->src->nentries;
    if (from_elf) found = cp_jit_entries_from_cubin(m->cubin, m->cubin_len, j->src, m->entries);
    if (found != j->src->nentries) {
        char what[512];
        int miss = 0;
        while (miss < m->nentries && m->entries[miss].registers >= 0) miss++;
        snprintf(what, sizeof what, "entry %s is declared in the source but ptxas did not compile it (inside #if, or a "
                 "declaration without a body?); every extern \"C\" __global__ kernel of a module must be defined",
                 miss < m->nentries ? m->entries[miss].name : "?");
        compile_failed(j, pl, what, log);
        goto destroy;
    }
    m->warnings = log_warnings(log);
    if (from_elf) {
        const char *note = "ptxas printed no resource report for some entries; registers and stack read from the CUBIN\n";
        size_t have = m->warnings ? strlen(m->warnings) : 0;
        m->warnings = cp_xrealloc(m->warnings, have + strlen(note) + 1);
        memcpy(m->warnings + have, note, strlen(note) + 1);
    }
    cp_str file = {0};
    serialize_entry(m, j->key, &file);
    if (cp_write_file_atomic(cubin_path, file.data, file.len) != 0) warn_write(cubin_path);
    cp_str_free(&file);
destroy:
    free(log);
    r = nv.DestroyProgram(&prog);
    if (r != NVRTC_SUCCESS)
        fprintf(stderr, "cpgen: warning: nvrtcDestroyProgram failed for module %s (%s); its memory leaks\n",
                j->src->name, nv.GetErrorString(r));
done:
    if (lock >= 0) close(lock);
    m->seconds = cp_now() - t0;
    return;
loaded:
    m->from_cache = true;
    /* Keep the source beside the cubin even if someone removed it. */
    if (access(m->source_path, F_OK) != 0) write_text(m->source_path, j->src->source);
    m->seconds = cp_now() - t0;
}

static void *worker(void *arg) {
    pool *pl = arg;
    for (;;) {
        int i = atomic_fetch_add(&pl->next, 1);
        if (i >= pl->njobs) break;
        if (pl->jobs[i].dup_of < 0) run_job(&pl->jobs[i], pl);
    }
    return NULL;
}

/* The key material: every input that decides the cubin, each field length-prefixed so fields cannot run together. */
static void compute_key(const cp_module_src *src, const char *const *opts, int nopts, const char *arch, int nv_major,
                        int nv_minor, uint64_t key[2]) {
    cp_str k = {0};
    cp_str_printf(&k, "cpgen %s|nvrtc %d.%d|arch %zu:%s|", CP_VERSION, nv_major, nv_minor, strlen(arch), arch);
    for (int i = 0; i < nopts; i++) cp_str_printf(&k, "opt %zu:%s|", strlen(opts[i]), opts[i]);
    cp_str_printf(&k, "name %zu:%s|source %zu:", strlen(src->name), src->name, strlen(src->source));
    cp_str_append(&k, src->source, strlen(src->source));
    hash128(k.data, k.len, key);
    cp_str_free(&k);
}

void cp_jit_module_free(cp_jit_module *m) {
    free(m->cubin);
    free(m->warnings);
    memset(m, 0, sizeof *m);
}

int cp_jit_compile(const cp_module_src *mods, int n, const cp_jit_opts *opts, cp_jit_module *out, char *err,
                   int errlen) {
    for (int i = 0; i < n; i++) memset(&out[i], 0, sizeof out[i]);
    if (n <= 0) return 0;
    const char *arch = opts && opts->arch[0] ? opts->arch : "sm_90a";
    int nv_major = 0, nv_minor = 0;
    if (cp_nvrtc_version(&nv_major, &nv_minor, err, errlen) != 0) return -1;
    if (check_arch(arch, err, errlen) != 0) return -1;
    char inc[1024];
    if (find_cuda_include(inc, sizeof inc, err, errlen) != 0) return -1;
    char dir[1024];
    cp_jit_cache_dir(opts, dir, sizeof dir);
    /* Room for "/<module>-<32 hex digits>.cubin" within a cp_jit_module's source_path. */
    if (strlen(dir) + CP_KNAME_MAX + 48 > sizeof out[0].source_path) {
        snprintf(err, errlen, "the JIT cache folder path %s is too long (%zu characters, at most %zu); set "
                 "XDG_CACHE_HOME to a shorter absolute path", dir, strlen(dir),
                 sizeof out[0].source_path - CP_KNAME_MAX - 48);
        return -1;
    }
    if (cp_mkdir_p(dir) != 0) {
        snprintf(err, errlen, "cannot create the JIT cache folder %s (%s); set XDG_CACHE_HOME to an absolute path "
                 "of a folder you can write (the cache goes to $XDG_CACHE_HOME/cpgen)", dir, strerror(errno));
        return -1;
    }

    /* Options kept minimal: each one is part of every cache key, and headers beyond cuda_bf16.h cost seconds. */
    char o_arch[48], o_inc[1100];
    snprintf(o_arch, sizeof o_arch, "--gpu-architecture=%s", arch);
    snprintf(o_inc, sizeof o_inc, "-I%s", inc);
    const char *copts[JIT_MAX_OPTS];
    int nopts = 0;
    copts[nopts++] = o_arch;
    copts[nopts++] = "-std=c++17";
    copts[nopts++] = "-default-device";
    copts[nopts++] = o_inc;
    copts[nopts++] = "--ptxas-options=-v";
    if (opts && opts->line_info) copts[nopts++] = "-lineinfo";

    job *jobs = cp_xcalloc((size_t)n, sizeof *jobs);
    for (int i = 0; i < n; i++) {
        job *j = &jobs[i];
        j->src = &mods[i];
        j->out = &out[i];
        j->dup_of = -1;
        j->err = cp_xmalloc(JIT_ERR);
        j->err[0] = 0;
        snprintf(out[i].name, sizeof out[i].name, "%s", mods[i].name);
        compute_key(&mods[i], copts, nopts, arch, nv_major, nv_minor, j->key);
        int w = snprintf(j->base, sizeof j->base, "%s/%s-%016llx%016llx", dir, mods[i].name,
                         (unsigned long long)j->key[0], (unsigned long long)j->key[1]);
        if (w < 0 || (size_t)w >= sizeof j->base) cp_fatal(CP_EXIT_FAIL, "internal: cache path for %s too long", mods[i].name);
        /* The same module twice compiles once: two threads must never write the same cache file. */
        for (int k = 0; k < i; k++)
            if (jobs[k].dup_of < 0 && jobs[k].key[0] == j->key[0] && jobs[k].key[1] == j->key[1]) {
                j->dup_of = k;
                break;
            }
    }

    pool pl = {.jobs = jobs, .njobs = n, .opts = copts, .nopts = nopts, .no_cache = opts && opts->no_cache};
    atomic_init(&pl.next, 0);
    int nthreads = opts && opts->threads > 0 ? opts->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    nthreads = CP_MAX(1, CP_MIN(nthreads, n));
    pthread_t *tids = cp_xcalloc((size_t)nthreads, sizeof *tids);
    int started = 0;
    for (int t = 1; t < nthreads; t++) {
        if (pthread_create(&tids[t], NULL, worker, &pl) != 0) break; /* fewer threads still finish the work */
        started = t;
    }
    worker(&pl);
    for (int t = 1; t <= started; t++) pthread_join(tids[t], NULL);
    free(tids);

    int rc = 0;
    for (int i = 0; i < n; i++) {
        job *j = &jobs[i];
        if (j->dup_of >= 0) {
            const cp_jit_module *src = &out[j->dup_of];
            *j->out = *src;
            j->out->cubin = NULL;
            j->out->warnings = NULL;
            j->out->seconds = 0;
            if (src->cubin) {
                j->out->cubin = cp_xmalloc(src->cubin_len);
                memcpy(j->out->cubin, src->cubin, src->cubin_len);
            }
            if (src->warnings) j->out->warnings = cp_xstrdup(src->warnings);
            j->rc = jobs[j->dup_of].rc;
        }
        if (j->rc != 0 && rc == 0) {
            snprintf(err, errlen, "%s", j->err);
            rc = -1;
        }
    }
    for (int i = 0; i < n; i++) free(jobs[i].err);
    free(jobs);
    if (rc != 0)
        for (int i = 0; i < n; i++) cp_jit_module_free(&out[i]);
    return rc;
}
