/* safetensors.c: open and validate safetensors files and sharded indexes, read tensors as fp32 on demand,
 * write single or sharded checkpoints atomically (see safetensors.h). */
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"
#include "util.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

#define TRUNCATED_FIX "re-download or re-save it" /* what to do about a file that ends early */
#define CHUNK_ELEMS ((int64_t)1 << 20)

/* ------------------------------------------------------------------------------------------------------------
 * dtypes and conversions */

static const char *const DTYPE_NAMES[CP_ST_DTYPE_COUNT] = {
    "F32", "BF16", "F16", "F64", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL", "F8_E4M3", "F8_E5M2"};
static const int DTYPE_SIZES[CP_ST_DTYPE_COUNT] = {4, 2, 2, 8, 8, 4, 2, 1, 8, 4, 2, 1, 1, 1, 1};

const char *cp_st_dtype_name(cp_st_dtype d) { return (unsigned)d < CP_ST_DTYPE_COUNT ? DTYPE_NAMES[d] : "?"; }
int cp_st_dtype_size(cp_st_dtype d) { return (unsigned)d < CP_ST_DTYPE_COUNT ? DTYPE_SIZES[d] : 0; }

static bool convertible(cp_st_dtype d) { return d == CP_ST_F32 || d == CP_ST_BF16 || d == CP_ST_F16; }

uint16_t cp_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float cp_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

uint16_t cp_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN, quiet */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);                       /* rounds to >= 65520: inf */
    if (a >= 0x38800000u) {                                                        /* normal in f16 */
        a += 0xfffu + ((a >> 13) & 1u);
        a -= 0x38000000u; /* exponent bias 127 -> 15 */
        return (uint16_t)(sign | (a >> 13));
    }
    float m;
    memcpy(&m, &a, sizeof m);
    return (uint16_t)(sign | (uint16_t)lrintf(m * 16777216.0f)); /* subnormal: units of 2^-24, ties to even */
}

float cp_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    if (e == 31)
        u = sign | 0x7f800000u | (m << 13);
    else
        u = sign | ((e + 112) << 23) | (m << 13);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ------------------------------------------------------------------------------------------------------------
 * reading */


static int parse_dtype(const char *s, cp_st_dtype *out) {
    for (int d = 0; d < CP_ST_DTYPE_COUNT; d++)
        if (!strcmp(s, DTYPE_NAMES[d])) {
            *out = (cp_st_dtype)d;
            return 0;
        }
    return -1;
}

typedef struct {
    cp_st_tensor *t;
    int n, cap;
} tlist;

static int cmp_by_begin(const void *a, const void *b) {
    const cp_st_tensor *x = *(cp_st_tensor *const *)a, *y = *(cp_st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* One tensor entry of a header: {"dtype", "shape", "data_offsets"}, nothing else. */
static int parse_entry(const char *path, const char *name, const cp_json *v, int64_t data_size, cp_st_tensor *t,
                       char *err, int errlen) {
    if (v->type != CP_JSON_OBJECT)
        return cp_errf(err, errlen,
                    "%s: header entry \"%.200s\" is %s; a tensor entry is an object with dtype, shape "
                    "and data_offsets: the file is corrupt",
                    path, name, cp_json_type_name(v->type));
    for (int k = 0; k < v->n; k++)
        if (strcmp(v->keys[k], "dtype") && strcmp(v->keys[k], "shape") && strcmp(v->keys[k], "data_offsets"))
            return cp_errf(err, errlen,
                        "%s: tensor \"%.200s\" has the unknown field \"%.80s\" (expected dtype, shape, "
                        "data_offsets): the file is corrupt or not safetensors",
                        path, name, v->keys[k]);
    const cp_json *dt = cp_json_get(v, "dtype"), *sh = cp_json_get(v, "shape"), *off = cp_json_get(v, "data_offsets");
    if (!dt || !sh || !off)
        return cp_errf(err, errlen, "%s: tensor \"%.200s\" lacks \"%s\": the file is corrupt", path, name,
                    !dt   ? "dtype"
                    : !sh ? "shape"
                          : "data_offsets");
    if (dt->type != CP_JSON_STRING)
        return cp_errf(err, errlen, "%s: tensor \"%.200s\": dtype is %s, not a string", path, name,
                    cp_json_type_name(dt->type));
    if (parse_dtype(dt->string, &t->dtype))
        return cp_errf(err, errlen,
                    "%s: tensor \"%.200s\" has the unknown dtype \"%.40s\"; safetensors dtypes are F32, "
                    "BF16, F16, F64, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, F8_E5M2",
                    path, name, dt->string);
    if (sh->type != CP_JSON_ARRAY)
        return cp_errf(err, errlen, "%s: tensor \"%.200s\": shape is %s, not an array of sizes", path, name,
                    cp_json_type_name(sh->type));
    if (sh->n > CP_ST_MAX_DIMS)
        return cp_errf(err, errlen, "%s: tensor \"%.200s\" has %d dimensions; at most %d are supported", path, name, sh->n,
                    CP_ST_MAX_DIMS);
    t->ndim = sh->n;
    int64_t elems = 1;
    bool overflow = false;
    for (int k = 0; k < sh->n; k++) {
        const cp_json *d = &sh->items[k];
        if (d->type != CP_JSON_NUMBER || !d->is_int || d->integer < 0)
            return cp_errf(err, errlen, "%s: tensor \"%.200s\": shape[%d] is not a non-negative integer", path, name, k);
        t->shape[k] = d->integer;
        if (d->integer && elems > INT64_MAX / d->integer)
            overflow = true;
        else
            elems *= d->integer;
    }
    int es = DTYPE_SIZES[t->dtype];
    if (overflow || elems > INT64_MAX / es)
        return cp_errf(err, errlen,
                    "%s: tensor \"%.200s\": its shape has more elements than any file can hold: the file "
                    "is corrupt",
                    path, name);
    t->elems = elems;
    if (off->type != CP_JSON_ARRAY || off->n != 2)
        return cp_errf(err, errlen, "%s: tensor \"%.200s\": data_offsets must be an array [begin, end]", path, name);
    for (int k = 0; k < 2; k++)
        if (off->items[k].type != CP_JSON_NUMBER || !off->items[k].is_int || off->items[k].integer < 0)
            return cp_errf(err, errlen, "%s: tensor \"%.200s\": data_offsets[%d] is not a non-negative integer", path,
                        name, k);
    t->begin = off->items[0].integer;
    t->end = off->items[1].integer;
    if (t->end < t->begin)
        return cp_errf(err, errlen,
                    "%s: tensor \"%.200s\": data_offsets [%lld, %lld] end before they begin: the file is "
                    "corrupt",
                    path, name, (long long)t->begin, (long long)t->end);
    if (t->end > data_size)
        return cp_errf(err, errlen,
                    "%s: tensor \"%.200s\": data_offsets [%lld, %lld] reach past the data area (%lld "
                    "bytes after the header): the file is truncated or corrupt; re-download or re-save it",
                    path, name, (long long)t->begin, (long long)t->end, (long long)data_size);
    if (t->end - t->begin != elems * es) {
        char shp[160] = "";
        size_t at = 0;
        for (int k = 0; k < t->ndim && at < sizeof shp - 24; k++)
            at += (size_t)snprintf(shp + at, sizeof shp - at, "%s%lld", k ? ", " : "", (long long)t->shape[k]);
        return cp_errf(err, errlen,
                    "%s: tensor \"%.200s\": data_offsets [%lld, %lld] hold %lld bytes but shape [%s] "
                    "in %s needs %lld: the file is corrupt",
                    path, name, (long long)t->begin, (long long)t->end, (long long)(t->end - t->begin), shp,
                    DTYPE_NAMES[t->dtype], (long long)(elems * es));
    }
    t->name = cp_xstrdup(name);
    return 0;
}

/* Open one safetensors file and append its tensors (with file index fi) to list. */
static int open_one(const char *path, int fi, cp_st_file *f, tlist *list, char *err, int errlen) {
    f->path = cp_xstrdup(path);
    char why[256];
    f->fd = cp_open_file(path, CP_FILE_DATA, &f->size, why, sizeof why); /* a FIFO or device is refused, never read */
    if (f->fd < 0)
        return cp_errf(err, errlen, "%s: cannot open: %s%s", path, why,
                    errno == ENOENT ? " (check the path, or the index that names this shard)"
                                    : "; give a safetensors file, the index of one, or their folder");
    if (f->size < 8)
        return cp_errf(err, errlen,
                    "%s: the file is %lld bytes, shorter than the 8-byte header length that starts a "
                    "safetensors file: it is truncated or not safetensors",
                    path, (long long)f->size);
    unsigned char lenb[8];
    if (cp_pread_all(f->fd, lenb, 8, 0, path, TRUNCATED_FIX, err, errlen)) return -1;
    uint64_t hl = 0;
    for (int k = 7; k >= 0; k--) hl = hl << 8 | lenb[k];
    if (hl == 0 || hl > (uint64_t)CP_ST_MAX_HEADER)
        return cp_errf(err, errlen,
                    "%s: header length %llu is not in [1, %lld] bytes: not a safetensors file, or the "
                    "first 8 bytes are corrupt",
                    path, (unsigned long long)hl, (long long)CP_ST_MAX_HEADER);
    if ((int64_t)hl > f->size - 8)
        return cp_errf(err, errlen,
                    "%s: header length %llu runs past the end of the file (%lld bytes): the file is "
                    "truncated or not safetensors",
                    path, (unsigned long long)hl, (long long)f->size);
    f->data_off = 8 + (int64_t)hl;
    char *hdr = cp_xmalloc((size_t)hl);
    if (cp_pread_all(f->fd, hdr, (int64_t)hl, 8, path, TRUNCATED_FIX, err, errlen)) {
        free(hdr);
        return -1;
    }
    cp_json root;
    char jerr[512];
    if (cp_json_parse(hdr, (size_t)hl, &root, jerr, sizeof jerr)) {
        free(hdr);
        return cp_errf(err, errlen,
                    "%s: the JSON header is malformed %s (header bytes count from 0 after the 8-byte "
                    "length): the file is corrupt or not safetensors",
                    path, jerr);
    }
    free(hdr);
    int rc = 0;
    int first = list->n;
    if (root.type != CP_JSON_OBJECT) {
        rc = cp_errf(err, errlen, "%s: the header is %s, not a JSON object: the file is corrupt", path,
                  cp_json_type_name(root.type));
        goto out;
    }
    int64_t data_size = f->size - f->data_off;
    for (int k = 0; k < root.n && !rc; k++) {
        const char *name = root.keys[k];
        const cp_json *v = &root.items[k];
        if (!strcmp(name, "__metadata__")) {
            if (v->type != CP_JSON_OBJECT && v->type != CP_JSON_NULL) {
                rc = cp_errf(err, errlen, "%s: __metadata__ is %s; it must be an object of strings", path,
                          cp_json_type_name(v->type));
                break;
            }
            for (int j = 0; j < v->n; j++)
                if (v->items[j].type != CP_JSON_STRING) {
                    rc = cp_errf(err, errlen, "%s: __metadata__ \"%.80s\" is %s; metadata values must be strings", path,
                              v->keys[j], cp_json_type_name(v->items[j].type));
                    break;
                }
            continue;
        }
        if (!name[0]) {
            rc = cp_errf(err, errlen, "%s: a tensor has an empty name: the file is corrupt", path);
            break;
        }
        if (list->n == list->cap) {
            list->cap = list->cap ? list->cap * 2 : 64;
            list->t = cp_xrealloc(list->t, (size_t)list->cap * sizeof *list->t);
        }
        cp_st_tensor *t = &list->t[list->n];
        memset(t, 0, sizeof *t);
        t->file = fi;
        rc = parse_entry(path, name, v, data_size, t, err, errlen);
        if (!rc) list->n++;
    }
    if (!rc && list->n - first > 1) {
        int n = list->n - first;
        cp_st_tensor **by = cp_xmalloc((size_t)n * sizeof *by);
        for (int k = 0; k < n; k++) by[k] = &list->t[first + k];
        qsort(by, (size_t)n, sizeof *by, cmp_by_begin);
        const cp_st_tensor *prev = NULL;
        for (int k = 0; k < n && !rc; k++) {
            if (by[k]->begin == by[k]->end) continue; /* empty tensors take no bytes */
            if (prev && by[k]->begin < prev->end)
                rc = cp_errf(err, errlen,
                          "%s: tensors \"%.200s\" [%lld, %lld] and \"%.200s\" [%lld, %lld] overlap in "
                          "the data area: the file is corrupt",
                          path, prev->name, (long long)prev->begin, (long long)prev->end, by[k]->name,
                          (long long)by[k]->begin, (long long)by[k]->end);
            prev = by[k];
        }
        free(by);
    }
out:
    cp_json_free(&root);
    return rc;
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp(((const cp_st_tensor *)a)->name, ((const cp_st_tensor *)b)->name);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = cp_xmalloc(n);
    snprintf(p, n, "%s%s%s", dir, dir[0] && dir[strlen(dir) - 1] != '/' ? "/" : "", name);
    return p;
}

static char *dir_of(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return cp_xstrdup(".");
    size_t n = (size_t)(slash - path);
    if (n == 0) return cp_xstrdup("/");
    char *d = cp_xmalloc(n + 1);
    memcpy(d, path, n);
    d[n] = 0;
    return d;
}

static cp_st_file *add_file(cp_st_set *st) {
    st->files = cp_xrealloc(st->files, (size_t)(st->nfiles + 1) * sizeof *st->files);
    cp_st_file *f = &st->files[st->nfiles++];
    memset(f, 0, sizeof *f);
    f->fd = -1;
    return f;
}

static int open_index(const char *path, cp_st_set *st, tlist *list, char *err, int errlen) {
    size_t len;
    char why[256];
    char *text = cp_read_file_as(path, CP_FILE_INDEX, &len, why, sizeof why);
    if (!text) return cp_errf(err, errlen, "%s: cannot read the index: %s", path, why);
    cp_json root;
    char jerr[512];
    if (cp_json_parse(text, len, &root, jerr, sizeof jerr)) {
        free(text);
        return cp_errf(err, errlen, "%s: the index is not valid JSON: %s", path, jerr);
    }
    free(text);
    int rc = 0;
    char *dir = dir_of(path);
    char **names = NULL; /* distinct shard names, parallel to st->files */
    const cp_json *wm = cp_json_get(&root, "weight_map");
    if (!wm || wm->type != CP_JSON_OBJECT) {
        rc = cp_errf(err, errlen, "%s: the index has no \"weight_map\" object mapping tensor names to shard files", path);
        goto out;
    }
    if (wm->n == 0) {
        rc = cp_errf(err, errlen, "%s: the index's weight_map is empty", path);
        goto out;
    }
    int *file_of = cp_xmalloc((size_t)wm->n * sizeof *file_of);
    for (int k = 0; k < wm->n && !rc; k++) {
        const cp_json *v = &wm->items[k];
        if (v->type != CP_JSON_STRING || !v->string[0]) {
            rc = cp_errf(err, errlen, "%s: weight_map[\"%.200s\"] is not a file name", path, wm->keys[k]);
            break;
        }
        if (v->string[0] == '/' || strstr(v->string, "..")) {
            rc = cp_errf(err, errlen,
                      "%s: weight_map[\"%.200s\"] = \"%.200s\": shard names must be relative to the "
                      "index's folder, without \"..\"",
                      path, wm->keys[k], v->string);
            break;
        }
        int fi = -1;
        for (int j = 0; j < st->nfiles; j++)
            if (!strcmp(names[j], v->string)) fi = j;
        if (fi < 0) {
            names = cp_xrealloc(names, (size_t)(st->nfiles + 1) * sizeof *names);
            names[st->nfiles] = v->string;
            cp_st_file *f = add_file(st);
            fi = st->nfiles - 1;
            char *full = join(dir, v->string);
            rc = open_one(full, fi, f, list, err, errlen);
            free(full);
        }
        file_of[k] = fi;
    }
    /* every tensor the index names is in the shard it names, and every tensor of a shard is in the index there */
    for (int k = 0; k < wm->n && !rc; k++) {
        bool found = false;
        for (int j = 0; j < list->n && !found; j++)
            found = list->t[j].file == file_of[k] && !strcmp(list->t[j].name, wm->keys[k]);
        if (!found)
            rc = cp_errf(err, errlen,
                      "%s: the index maps \"%.200s\" to %s, but that shard has no such tensor: the "
                      "shards do not belong to this index (re-download or re-save the checkpoint)",
                      path, wm->keys[k], names[file_of[k]]);
    }
    for (int j = 0; j < list->n && !rc; j++) {
        const cp_json *v = cp_json_get(wm, list->t[j].name);
        if (!v)
            rc = cp_errf(err, errlen,
                      "%s: shard %s holds \"%.200s\", which the index does not list: the shards do not "
                      "belong to this index",
                      path, names[list->t[j].file], list->t[j].name);
        else if (strcmp(v->string, names[list->t[j].file]))
            rc = cp_errf(err, errlen,
                      "%s: shard %s holds \"%.200s\", which the index maps to %s: the shards do not "
                      "belong to this index",
                      path, names[list->t[j].file], list->t[j].name, v->string);
    }
    free(file_of);
out:
    free(names);
    free(dir);
    cp_json_free(&root);
    return rc;
}

/* A folder: its index, else model.safetensors (as transformers looks for it: a cpgen training checkpoint keeps
 * optimizer.safetensors beside it), else its only *.safetensors file. */
static int resolve_dir(const char *path, char **out, bool *is_index, char *err, int errlen) {
    char *idx = join(path, CP_ST_INDEX_NAME);
    struct stat sb;
    if (stat(idx, &sb) == 0) {
        *out = idx;
        *is_index = true;
        return 0;
    }
    free(idx);
    char *single = join(path, CP_ST_SINGLE_NAME);
    if (stat(single, &sb) == 0) {
        *out = single;
        *is_index = false;
        return 0;
    }
    free(single);
    DIR *d = opendir(path);
    if (!d) return cp_errf(err, errlen, "%s: cannot list the folder: %s", path, strerror(errno));
    char *found = NULL;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!ends_with(e->d_name, ".safetensors")) continue;
        count++;
        if (!found) found = cp_xstrdup(e->d_name);
    }
    closedir(d);
    if (count == 1) {
        *out = join(path, found);
        *is_index = false;
        free(found);
        return 0;
    }
    free(found);
    if (count == 0)
        return cp_errf(err, errlen,
                    "%s: the folder has neither %s nor a *.safetensors file: give the folder of a Hugging "
                    "Face checkpoint saved with safetensors",
                    path, CP_ST_INDEX_NAME);
    return cp_errf(err, errlen,
                "%s: the folder has %d *.safetensors files but no %s to say which tensors are where: "
                "restore the index, or give one file",
                path, count, CP_ST_INDEX_NAME);
}

int cp_st_open(const char *path, cp_st_set *st, char *err, int errlen) {
    memset(st, 0, sizeof *st);
    if (!path || !path[0]) return cp_errf(err, errlen, "no safetensors path given");
    st->where = cp_xstrdup(path);
    struct stat sb;
    if (stat(path, &sb) != 0) {
        int e = errno;
        cp_st_close(st);
        return cp_errf(err, errlen, "%s: cannot open: %s%s", path, strerror(e),
                    e == ENOENT ? " (give a .safetensors file, an index .json, or a checkpoint folder)" : "");
    }
    char *file = NULL;
    bool is_index = false;
    if (S_ISDIR(sb.st_mode)) {
        if (resolve_dir(path, &file, &is_index, err, errlen)) {
            cp_st_close(st);
            return -1;
        }
    } else {
        file = cp_xstrdup(path);
        is_index = ends_with(path, ".json");
    }
    tlist list = {0};
    int rc = is_index ? open_index(file, st, &list, err, errlen) : open_one(file, 0, add_file(st), &list, err, errlen);
    free(file);
    st->tensors = list.t;
    st->ntensors = list.n;
    if (!rc && list.n > 1) {
        qsort(list.t, (size_t)list.n, sizeof *list.t, cmp_by_name);
        for (int k = 1; k < list.n && !rc; k++)
            if (!strcmp(list.t[k - 1].name, list.t[k].name))
                rc = cp_errf(err, errlen, "%s: tensor \"%.200s\" appears in two shards (%s and %s)", path, list.t[k].name,
                          st->files[list.t[k - 1].file].path, st->files[list.t[k].file].path);
    }
    if (rc) cp_st_close(st);
    return rc;
}

void cp_st_close(cp_st_set *st) {
    if (!st) return;
    for (int k = 0; k < st->nfiles; k++) {
        if (st->files[k].fd >= 0) close(st->files[k].fd);
        free(st->files[k].path);
    }
    for (int k = 0; k < st->ntensors; k++) free(st->tensors[k].name);
    free(st->files);
    free(st->tensors);
    free(st->where);
    memset(st, 0, sizeof *st);
}

const cp_st_tensor *cp_st_find(const cp_st_set *st, const char *name) {
    int lo = 0, hi = st->ntensors - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(st->tensors[mid].name, name);
        if (!c) return &st->tensors[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

int cp_st_read_f32(const cp_st_set *st, const cp_st_tensor *t, int64_t first, int64_t count, float *out, char *err,
                   int errlen) {
    const cp_st_file *f = &st->files[t->file];
    if (!convertible(t->dtype))
        return cp_errf(err, errlen,
                    "%s: tensor \"%.200s\" is %s; cpgen reads only F32, BF16 and F16 weights: convert "
                    "the checkpoint",
                    f->path, t->name, DTYPE_NAMES[t->dtype]);
    if (first < 0 || count < 0 || first > t->elems - count)
        return cp_errf(err, errlen, "%s: tensor \"%.200s\": elements [%lld, %lld) asked of %lld (a cpgen bug)", f->path,
                    t->name, (long long)first, (long long)(first + count), (long long)t->elems);
    int es = DTYPE_SIZES[t->dtype];
    int64_t off = f->data_off + t->begin + first * es;
    if (t->dtype == CP_ST_F32)
        return cp_pread_all(f->fd, out, count * 4, off, f->path, TRUNCATED_FIX, err, errlen);
    uint16_t *buf = cp_xmalloc((size_t)CP_MIN(count, CHUNK_ELEMS) * sizeof *buf);
    for (int64_t done = 0; done < count;) {
        int64_t n = CP_MIN(count - done, CHUNK_ELEMS);
        if (cp_pread_all(f->fd, buf, n * 2, off + done * 2, f->path, TRUNCATED_FIX, err, errlen)) {
            free(buf);
            return -1;
        }
        if (t->dtype == CP_ST_BF16)
            for (int64_t k = 0; k < n; k++) out[done + k] = cp_bf16_to_f32(buf[k]);
        else
            for (int64_t k = 0; k < n; k++) out[done + k] = cp_f16_to_f32(buf[k]);
        done += n;
    }
    free(buf);
    return 0;
}

int cp_st_read_raw(const cp_st_set *st, const cp_st_tensor *t, void *out, char *err, int errlen) {
    const cp_st_file *f = &st->files[t->file];
    return cp_pread_all(f->fd, out, t->end - t->begin, f->data_off + t->begin, f->path, TRUNCATED_FIX, err,
                        errlen);
}

/* ------------------------------------------------------------------------------------------------------------
 * writing */

typedef struct {
    int fd;
    char *tmp, *path;
    const char *what; /* for messages */
} out_file;

/* What the writer's time went to, summed over every thread (cp_st_stats). */
static pthread_mutex_t stats_lock = PTHREAD_MUTEX_INITIALIZER;
static cp_st_write_stats stats;

static void stats_add(double fill, double wr, double sync, int64_t bytes) {
    pthread_mutex_lock(&stats_lock);
    stats.fill_s += fill;
    stats.write_s += wr;
    stats.sync_s += sync;
    stats.bytes += bytes;
    pthread_mutex_unlock(&stats_lock);
}

void cp_st_stats(cp_st_write_stats *out, bool reset) {
    pthread_mutex_lock(&stats_lock);
    if (out) *out = stats;
    if (reset) memset(&stats, 0, sizeof stats);
    pthread_mutex_unlock(&stats_lock);
}

static int64_t tensor_elems(const cp_st_out *t) {
    int64_t e = 1;
    for (int k = 0; k < t->ndim; k++) e *= t->shape[k];
    return e;
}

/* A file is made in blocks: each block's bytes are put together in an aligned buffer and written at its offset with
 * pwrite, by up to WRITERS threads taking blocks in turn. A model-sized file goes around the page cache (O_DIRECT
 * where the filesystem has it: whole aligned blocks, the last one padded and the file cut back to its size), which
 * on the machines measured wrote 2-3 times faster than one buffered stream (docs/CHECKPOINTS.md). */
#define BLOCK ((int64_t)8 << 20)
#define ALIGN 4096
#define WRITERS 8

typedef struct {
    const cp_st_out *t; /* the file's tensors, in file order */
    int n;
    const int64_t *begin; /* file offset of each tensor's first byte, [n + 1]: begin[n] is the file's size */
    const unsigned char *head;
    int64_t head_len; /* the 8-byte header length and the header */
    int64_t size, nblocks;
    out_file *o;
    atomic_bool direct; /* written around the page cache; cleared by the first thread the filesystem refuses */
    atomic_llong next; /* the next block to take */
    atomic_int failed;
    pthread_mutex_t lock;
    char *err; /* the first failure */
    int errlen;
} wfile;

/* Bytes [s, e) of tensor t's data into dst; scratch holds 2 * BLOCK + 8 bytes. */
static void tensor_bytes(const cp_st_out *t, int64_t s, int64_t e, unsigned char *dst, float *scratch) {
    int es = DTYPE_SIZES[t->dtype];
    if (t->raw) {
        memcpy(dst, (const unsigned char *)t->raw + s, (size_t)(e - s));
        return;
    }
    if (t->f32 && t->dtype == CP_ST_F32) {
        memcpy(dst, (const unsigned char *)t->f32 + s, (size_t)(e - s));
        return;
    }
    int64_t el0 = s / es, n = (e + es - 1) / es - el0;
    const float *v = t->f32 ? t->f32 + el0 : scratch;
    if (t->fill) t->fill(t->ctx, el0, n, scratch);
    if (t->dtype == CP_ST_F32) {
        memcpy(dst, (const unsigned char *)v + (s - el0 * 4), (size_t)(e - s));
        return;
    }
    /* into scratch from its start: element k's two bytes land below element k's four, which were read already */
    uint16_t *h = (uint16_t *)scratch;
    if (t->dtype == CP_ST_BF16)
        for (int64_t k = 0; k < n; k++) h[k] = cp_f32_to_bf16(v[k]);
    else
        for (int64_t k = 0; k < n; k++) h[k] = cp_f32_to_f16(v[k]);
    memcpy(dst, (const unsigned char *)h + (s - el0 * 2), (size_t)(e - s));
}

/* The file's bytes [off, end) into dst. */
static void block_bytes(const wfile *w, int64_t off, int64_t end, unsigned char *dst, float **scratch) {
    if (off < w->head_len) memcpy(dst, w->head + off, (size_t)(CP_MIN(end, w->head_len) - off));
    int lo = 0, hi = w->n; /* the first tensor ending after off */
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (w->begin[mid + 1] <= off) lo = mid + 1;
        else hi = mid;
    }
    for (int k = lo; k < w->n && w->begin[k] < end; k++) {
        int64_t s = CP_MAX(off, w->begin[k]), e = CP_MIN(end, w->begin[k + 1]);
        if (s >= e) continue;
        const cp_st_out *t = &w->t[k];
        if (!*scratch && !t->raw && !(t->f32 && t->dtype == CP_ST_F32))
            *scratch = cp_xmalloc((size_t)(2 * BLOCK + 8));
        tensor_bytes(t, s - w->begin[k], e - w->begin[k], dst + (s - off), *scratch);
    }
}

void (*cp_st_block_hook)(const char *tmp_path, int64_t block, int64_t nblocks);

static void wfile_fail(wfile *w, const char *msg) {
    pthread_mutex_lock(&w->lock);
    if (!atomic_exchange(&w->failed, 1)) snprintf(w->err, (size_t)w->errlen, "%s", msg);
    pthread_mutex_unlock(&w->lock);
}

/* len bytes of buf at off; a direct write the filesystem refuses after all is made again through the page cache. */
static int pwrite_all(wfile *w, const unsigned char *buf, size_t len, int64_t off, size_t padded, char *msg,
                      int msglen) {
    bool direct = atomic_load(&w->direct);
    size_t want = direct ? padded : len, done = 0;
    while (done < want) {
        ssize_t k = pwrite(w->o->fd, buf + done, want - done, (off_t)(off + (int64_t)done));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EINVAL && direct) {
            int fl = fcntl(w->o->fd, F_GETFL);
            if (fl >= 0) (void)fcntl(w->o->fd, F_SETFL, fl & ~O_DIRECT);
            atomic_store(&w->direct, false);
            direct = false;
            want = len;
            continue;
        }
        if (k <= 0)
            return cp_errf(msg, msglen, "%s: writing failed: %s%s", w->o->tmp, k < 0 ? strerror(errno) : "no progress",
                           k < 0 && errno == ENOSPC ? " (the disk is full: free space or save elsewhere)" : "");
        done += (size_t)k;
    }
    return 0;
}

static void *wfile_thread(void *arg) {
    wfile *w = arg;
    unsigned char *buf = NULL;
    float *scratch = NULL;
    char msg[1024];
    if (posix_memalign((void **)&buf, ALIGN, (size_t)BLOCK) != 0) cp_fatal(CP_EXIT_FAIL, "out of memory");
    for (;;) {
        int64_t b = atomic_fetch_add(&w->next, 1);
        if (b >= w->nblocks || atomic_load(&w->failed)) break;
        int64_t off = b * BLOCK, end = CP_MIN(w->size, off + BLOCK);
        size_t len = (size_t)(end - off), padded = (len + ALIGN - 1) / ALIGN * ALIGN;
        double t0 = cp_now();
        block_bytes(w, off, end, buf, &scratch);
        if (padded > len) memset(buf + len, 0, padded - len);
        double t1 = cp_now();
        int rc = pwrite_all(w, buf, len, off, padded, msg, sizeof msg);
        stats_add(t1 - t0, cp_now() - t1, 0, (int64_t)len);
        if (rc) {
            wfile_fail(w, msg);
            break;
        }
        if (cp_st_block_hook) cp_st_block_hook(w->o->tmp, b, w->nblocks);
    }
    free(buf);
    free(scratch);
    return NULL;
}

/* Write the file's bytes into o (open, empty): the blocks by up to WRITERS threads, the file cut to its size. */
static int write_blocks(wfile *w, char *err, int errlen) {
    w->nblocks = (w->size + BLOCK - 1) / BLOCK;
    /* a file of a few blocks is written by this thread through the page cache, as any small file */
    atomic_init(&w->direct, false);
    int nt = (int)CP_MIN(WRITERS, w->nblocks);
    if (w->nblocks >= 2 * WRITERS) {
        int fl = fcntl(w->o->fd, F_GETFL);
        atomic_store(&w->direct, fl >= 0 && fcntl(w->o->fd, F_SETFL, fl | O_DIRECT) == 0);
    } else {
        nt = 1;
    }
    atomic_init(&w->next, 0);
    atomic_init(&w->failed, 0);
    pthread_mutex_init(&w->lock, NULL);
    w->err = err;
    w->errlen = errlen;
    pthread_t th[WRITERS];
    int started = 0;
    for (int k = 1; k < nt; k++, started++)
        if (pthread_create(&th[k - 1], NULL, wfile_thread, w)) break;
    wfile_thread(w);
    for (int k = 0; k < started; k++) pthread_join(th[k], NULL);
    pthread_mutex_destroy(&w->lock);
    if (atomic_load(&w->failed)) return -1;
    if (ftruncate(w->o->fd, (off_t)w->size) != 0) /* the padding of a direct last block */
        return cp_errf(err, errlen, "%s: setting its size failed: %s", w->o->tmp, strerror(errno));
    return 0;
}

static int open_out(out_file *o, const char *dir, const char *name, char *err, int errlen) {
    o->path = join(dir, name);
    size_t n = strlen(o->path) + 32;
    o->tmp = cp_xmalloc(n);
    snprintf(o->tmp, n, "%s.tmp.%ld", o->path, (long)getpid());
    /* O_EXCL: a new file, never one that is there already (nor what a link there points to) */
    o->fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (o->fd < 0) {
        int e = errno;
        free(o->tmp);
        o->tmp = NULL; /* not ours to remove */
        return cp_errf(err, errlen, "%s: cannot create: %s", o->path, strerror(e));
    }
    return 0;
}

static int finish_out(out_file *o, bool ok, char *err, int errlen) {
    int rc = ok ? 0 : -1;
    if (o->fd >= 0) {
        double t0 = cp_now();
        if (ok && fsync(o->fd) != 0) rc = cp_errf(err, errlen, "%s: fsync failed: %s", o->tmp, strerror(errno));
        stats_add(0, 0, cp_now() - t0, 0);
        if (close(o->fd) != 0 && !rc) rc = cp_errf(err, errlen, "%s: close failed: %s", o->tmp, strerror(errno));
        o->fd = -1;
    }
    if (!rc && rename(o->tmp, o->path) != 0)
        rc = cp_errf(err, errlen, "renaming %s to %s failed: %s", o->tmp, o->path, strerror(errno));
    if (rc && o->tmp) unlink(o->tmp);
    free(o->tmp);
    free(o->path);
    o->tmp = o->path = NULL;
    return rc;
}

/* Write tensors [a, b) as one safetensors file named `name` in dir. */
static int write_file(const char *dir, const char *name, const cp_st_out *t, int a, int b, char *err, int errlen) {
    cp_str h = {0};
    static const char meta[] = "{\"__metadata__\":{\"format\":\"pt\"}";
    cp_str_append(&h, meta, sizeof meta - 1);
    int64_t off = 0;
    int64_t *begin = cp_xmalloc(sizeof(int64_t) * (size_t)(b - a + 1));
    for (int k = a; k < b; k++) {
        int64_t bytes = tensor_elems(&t[k]) * DTYPE_SIZES[t[k].dtype];
        cp_str_append(&h, ",", 1);
        cp_json_put_string(&h, t[k].name);
        cp_str_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", DTYPE_NAMES[t[k].dtype]);
        for (int d = 0; d < t[k].ndim; d++) cp_str_printf(&h, "%s%lld", d ? "," : "", (long long)t[k].shape[d]);
        cp_str_printf(&h, "],\"data_offsets\":[%lld,%lld]}", (long long)off, (long long)(off + bytes));
        begin[k - a] = off;
        off += bytes;
    }
    cp_str_append(&h, "}", 1);
    while (h.len % 8) cp_str_append(&h, " ", 1); /* data starts 8-byte aligned, as the reference writer does */
    /* the 8-byte length, then the header: the file's first bytes */
    unsigned char *head = cp_xmalloc(8 + h.len);
    for (int k = 0; k < 8; k++) head[k] = (unsigned char)((uint64_t)h.len >> (8 * k));
    memcpy(head + 8, h.data, h.len);
    int64_t head_len = 8 + (int64_t)h.len;
    for (int k = 0; k <= b - a; k++) begin[k] = k < b - a ? begin[k] + head_len : off + head_len;
    out_file o = {.fd = -1};
    int rc = open_out(&o, dir, name, err, errlen);
    if (!rc) {
        wfile w = {.t = t + a, .n = b - a, .begin = begin, .head = head, .head_len = head_len, .size = off + head_len,
                   .o = &o};
        rc = write_blocks(&w, err, errlen);
    }
    cp_str_free(&h);
    free(head);
    free(begin);
    return finish_out(&o, rc == 0, err, errlen);
}

static int check_out(const cp_st_out *t, int n, char *err, int errlen) {
    for (int k = 0; k < n; k++) {
        const cp_st_out *x = &t[k];
        if (!x->name || !x->name[0] || !strcmp(x->name, "__metadata__"))
            return cp_errf(err, errlen, "safetensors writer: tensor %d has no usable name (a cpgen bug)", k);
        if ((unsigned)x->dtype >= CP_ST_DTYPE_COUNT)
            return cp_errf(err, errlen, "safetensors writer: tensor \"%s\" has an unknown dtype (a cpgen bug)", x->name);
        if (x->ndim < 0 || x->ndim > CP_ST_MAX_DIMS)
            return cp_errf(err, errlen, "safetensors writer: tensor \"%s\" has %d dimensions (a cpgen bug)", x->name,
                        x->ndim);
        for (int d = 0; d < x->ndim; d++)
            if (x->shape[d] < 0)
                return cp_errf(err, errlen, "safetensors writer: tensor \"%s\" has a negative size (a cpgen bug)",
                            x->name);
        int sources = (x->raw != NULL) + (x->f32 != NULL) + (x->fill != NULL);
        if (sources != 1)
            return cp_errf(err, errlen,
                        "safetensors writer: tensor \"%s\" needs exactly one of raw, f32, fill (a cpgen "
                        "bug)",
                        x->name);
        if (!x->raw && !convertible(x->dtype))
            return cp_errf(err, errlen, "safetensors writer: tensor \"%s\": fp32 converts only to F32, BF16 or F16",
                        x->name);
        for (int j = 0; j < k; j++)
            if (!strcmp(t[j].name, x->name))
                return cp_errf(err, errlen, "safetensors writer: tensor \"%s\" given twice (a cpgen bug)", x->name);
    }
    return 0;
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* Remove shard files "model-*-of-*.safetensors" of an earlier save that are not among the new ones (nshards
 * of them; 0 removes all), so the folder holds one checkpoint. */
static void remove_stale_shards(const char *dir, int nshards) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char keep[64];
    while ((e = readdir(d))) {
        int i, n;
        char tail[32];
        if (sscanf(e->d_name, "model-%5d-of-%5d.%31s", &i, &n, tail) != 3 || strcmp(tail, "safetensors")) continue;
        snprintf(keep, sizeof keep, "model-%05d-of-%05d.safetensors", i, nshards);
        if (nshards && n == nshards && i >= 1 && i <= nshards && !strcmp(keep, e->d_name)) continue;
        char *p = join(dir, e->d_name);
        unlink(p);
        free(p);
    }
    closedir(d);
}

int cp_st_write(const char *dir, const cp_st_out *t, int n, int64_t shard_bytes, char *err, int errlen) {
    if (n <= 0) return cp_errf(err, errlen, "safetensors writer: no tensors to write to %s", dir);
    if (check_out(t, n, err, errlen)) return -1;
    if (shard_bytes <= 0) shard_bytes = CP_ST_DEFAULT_SHARD;
    if (cp_mkdir_p(dir) != 0) return cp_errf(err, errlen, "%s: cannot create the folder: %s", dir, strerror(errno));
    /* shard boundaries: a new shard starts before a tensor that would overflow a non-empty one */
    int *start = cp_xmalloc((size_t)(n + 1) * sizeof *start);
    int nshards = 0;
    int64_t cur = 0, total = 0;
    for (int k = 0; k < n; k++) {
        int64_t bytes = tensor_elems(&t[k]) * DTYPE_SIZES[t[k].dtype];
        if (k == 0 || (cur > 0 && cur + bytes > shard_bytes)) {
            start[nshards++] = k;
            cur = 0;
        }
        cur += bytes;
        total += bytes;
    }
    start[nshards] = n;
    int rc = 0;
    if (nshards == 1) {
        rc = write_file(dir, CP_ST_SINGLE_NAME, t, 0, n, err, errlen);
        if (!rc) {
            char *idx = join(dir, CP_ST_INDEX_NAME);
            unlink(idx); /* readers prefer an index: an old one would shadow this file */
            free(idx);
            remove_stale_shards(dir, 0);
        }
    } else {
        char name[64];
        cp_str idx = {0};
        cp_str_printf(&idx, "{\n  \"metadata\": {\n    \"total_size\": %lld\n  },\n  \"weight_map\": {",
                      (long long)total);
        /* weight_map in name order, as transformers writes it */
        int *order = cp_xmalloc((size_t)n * sizeof *order), *shard_of = cp_xmalloc((size_t)n * sizeof *shard_of);
        for (int s = 0; s < nshards; s++)
            for (int k = start[s]; k < start[s + 1]; k++) shard_of[k] = s;
        for (int k = 0; k < n; k++) order[k] = k;
        for (int a = 1; a < n; a++) /* insertion sort: a few thousand names at most */
            for (int b = a; b > 0 && strcmp(t[order[b - 1]].name, t[order[b]].name) > 0; b--) {
                int x = order[b];
                order[b] = order[b - 1];
                order[b - 1] = x;
            }
        for (int k = 0; k < n; k++) {
            cp_str_printf(&idx, "%s\n    ", k ? "," : "");
            cp_json_put_string(&idx, t[order[k]].name);
            cp_str_printf(&idx, ": \"model-%05d-of-%05d.safetensors\"", shard_of[order[k]] + 1, nshards);
        }
        cp_str_append(&idx, "\n  }\n}\n", 7);
        for (int s = 0; s < nshards && !rc; s++) {
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, nshards);
            rc = write_file(dir, name, t, start[s], start[s + 1], err, errlen);
        }
        if (!rc) {
            char *p = join(dir, CP_ST_INDEX_NAME);
            if (cp_write_file_atomic(p, idx.data, idx.len) != 0)
                rc = cp_errf(err, errlen, "%s: writing the index failed: %s", p, strerror(errno));
            free(p);
        }
        if (!rc) {
            char *single = join(dir, CP_ST_SINGLE_NAME);
            unlink(single); /* transformers prefers model.safetensors over an index: an old one would shadow this */
            free(single);
            remove_stale_shards(dir, nshards);
        }
        free(order);
        free(shard_of);
        cp_str_free(&idx);
    }
    free(start);
    if (!rc) fsync_dir(dir);
    return rc;
}

int cp_st_write_file(const char *path, const cp_st_out *t, int n, char *err, int errlen) {
    if (n <= 0) return cp_errf(err, errlen, "safetensors writer: no tensors to write to %s", path);
    if (check_out(t, n, err, errlen)) return -1;
    char *dir = dir_of(path);
    const char *slash = strrchr(path, '/');
    int rc = write_file(dir, slash ? slash + 1 : path, t, 0, n, err, errlen);
    if (!rc) fsync_dir(dir);
    free(dir);
    return rc;
}
