/* bundle.c: writing, reading and checking AOT bundles (see bundle.h). */
#include "bundle.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json.h"
#include "spec_write.h"

bool cp_bundle_is(const char *path) {
    char m[CP_PATH_MAX + 32];
    snprintf(m, sizeof m, "%s/manifest.json", path);
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode) && access(m, R_OK) == 0;
}

/* ---------------------------------------------------------------- the plan's digest */

static void plan_digest(const cp_module_src *mods, int n, char hex[CP_SHA256_HEX]) {
    cp_sha256_ctx c;
    cp_sha256_init(&c);
    for (int i = 0; i < n; i++) {
        char src[CP_SHA256_HEX];
        cp_sha256_hex(mods[i].source, strlen(mods[i].source), src);
        cp_sha256_update(&c, mods[i].name, strlen(mods[i].name));
        cp_sha256_update(&c, "\n", 1);
        cp_sha256_update(&c, src, 64);
        cp_sha256_update(&c, "\n", 1);
    }
    cp_sha256_final_hex(&c, hex);
}

int cp_bundle_plan_hash(const cp_plan *plan, char hex[CP_SHA256_HEX], char *err, int errlen) {
    cp_module_src *mods;
    int n = cp_plan_emit(plan, &mods, err, errlen);
    if (n < 0) return -1;
    plan_digest(mods, n, hex);
    cp_module_srcs_free(mods, n);
    return 0;
}

/* ---------------------------------------------------------------- writing */

static int write_in(const char *dir, const char *rel, const void *data, size_t len, char *err, int errlen) {
    char path[CP_PATH_MAX + CP_KNAME_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    if (cp_write_file_atomic(path, data, len) != 0)
        return cp_errf(err, errlen, "cannot write %s (%s)", path, strerror(errno));
    return 0;
}

static bool dir_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *e;
    bool empty = true;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = false;
    closedir(d);
    return empty;
}

/* Whether dir holds a bundle cpgen wrote and nothing else: a manifest of this format and only the files it names
 * (manifest.json, spec.lua, src/<module>.cu, <arch>/<module>.cubin), none of them a link. Replacing dir deletes
 * everything in it, so anything else there (a file of the user's, a manifest.json of another program) is reason to
 * refuse. 0, or -1 with what is wrong in why. */
static int only_a_bundle(const char *dir, char *why, size_t whylen) {
    cp_bundle b;
    char e[CP_ERR_MAX], m[CP_PATH_MAX + 32];
    struct stat st;
    snprintf(m, sizeof m, "%s/manifest.json", dir);
    if (lstat(m, &st) != 0) {
        snprintf(why, whylen, "it holds no bundle (no manifest.json)");
        return -1;
    }
    if (cp_bundle_open(dir, &b, e, sizeof e)) {
        snprintf(why, whylen, "its manifest.json is not one cpgen aot writes (%.400s)", e);
        return -1;
    }
    int rc = 0;
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(why, whylen, "it cannot be listed (%s)", strerror(errno));
        cp_bundle_close(&b);
        return -1;
    }
    struct dirent *ent;
    while (!rc && (ent = readdir(d))) {
        const char *n = ent->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..")) continue;
        char p[CP_PATH_MAX + 300];
        snprintf(p, sizeof p, "%s/%s", dir, n);
        bool file = lstat(p, &st) == 0 && S_ISREG(st.st_mode), folder = !file && S_ISDIR(st.st_mode);
        if (file && (!strcmp(n, "manifest.json") || !strcmp(n, "spec.lua"))) continue;
        int arch = -1;
        for (int a = 0; a < b.narchs; a++)
            if (!strcmp(n, b.archs[a])) arch = a;
        if (!folder || (strcmp(n, "src") && arch < 0)) {
            snprintf(why, whylen, "it holds %s, which a bundle does not", n);
            rc = -1;
            break;
        }
        DIR *sd = opendir(p);
        struct dirent *se;
        if (!sd) {
            snprintf(why, whylen, "%s cannot be listed (%s)", p, strerror(errno));
            rc = -1;
            break;
        }
        while (!rc && (se = readdir(sd))) {
            const char *f = se->d_name;
            if (!strcmp(f, ".") || !strcmp(f, "..")) continue;
            char rel[2 * 256 + 8], q[CP_PATH_MAX + 2 * 256 + 16];
            snprintf(rel, sizeof rel, "%s/%s", n, f);
            snprintf(q, sizeof q, "%s/%s", dir, rel);
            bool named = false;
            for (int i = 0; i < b.nmodules && !named; i++) {
                char src[CP_KNAME_MAX + 16];
                snprintf(src, sizeof src, "src/%s.cu", b.modules[i].name);
                named = arch < 0 ? !strcmp(rel, src) : !strcmp(rel, b.modules[i].cubins[arch].file);
            }
            if (!named || lstat(q, &st) != 0 || !S_ISREG(st.st_mode)) {
                snprintf(why, whylen, "it holds %s, which its manifest does not name", rel);
                rc = -1;
            }
        }
        closedir(sd);
    }
    closedir(d);
    cp_bundle_close(&b);
    return rc;
}

/* Whether a bundle may be written at dir: nothing there, an empty folder, or an earlier bundle and nothing else. */
static int may_write(const char *dir, char *err, int errlen) {
    struct stat st;
    if (lstat(dir, &st) != 0) {
        if (errno == ENOENT) return 0;
        return cp_errf(err, errlen, "%s: cannot look at what is there (%s); pick another -o", dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return cp_errf(err, errlen, "%s exists and is not a folder: cpgen replaces only a bundle it wrote; pick "
                       "another -o", dir);
    char why[CP_ERR_MAX];
    if (!dir_empty(dir) && only_a_bundle(dir, why, sizeof why))
        return cp_errf(err, errlen, "%s is a folder that is not empty and not a bundle written by cpgen aot: %s; cpgen "
                       "replaces only a bundle, since replacing deletes what the folder holds: pick another -o, or "
                       "move the folder away", dir, why);
    return 0;
}

/* rename(from, to) with renameat2's flags, falling back to a plain rename where the filesystem has no flags (then
 * with RENAME_NOREPLACE only after checking that nothing is at to). */
static int rename_flags(const char *from, const char *to, unsigned flags) {
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, flags) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return -1;
    struct stat st;
    if (flags & RENAME_EXCHANGE) return -1; /* the caller moves the old one aside itself */
    if (lstat(to, &st) == 0) {
        errno = EEXIST;
        return -1;
    }
    return rename(from, to);
}

/* Move the finished folder tmp to dir: an earlier bundle there is swapped out in one step (RENAME_EXCHANGE) and
 * then removed; it is checked again first, in case something was put there while the kernels compiled. */
static int put_in_place(const char *tmp, const char *dir, char *err, int errlen) {
    struct stat st;
    if (may_write(dir, err, errlen)) return -1;
    if (lstat(dir, &st) != 0) {
        if (rename_flags(tmp, dir, RENAME_NOREPLACE) == 0) return 0;
        return cp_errf(err, errlen, "cannot rename %s to %s (%s)", tmp, dir, strerror(errno));
    }
    if (dir_empty(dir)) {
        if (rmdir(dir) != 0 || rename_flags(tmp, dir, RENAME_NOREPLACE) != 0)
            return cp_errf(err, errlen, "cannot put the bundle at %s (%s)", dir, strerror(errno));
        return 0;
    }
    if (rename_flags(tmp, dir, RENAME_EXCHANGE) == 0) {
        cp_remove_tree(tmp); /* now the old bundle */
        return 0;
    }
    if (errno != EINVAL && errno != ENOSYS)
        return cp_errf(err, errlen, "cannot replace the old bundle %s (%s)", dir, strerror(errno));
    char old[CP_PATH_MAX + 32];
    snprintf(old, sizeof old, "%s.old.%ld", dir, (long)getpid());
    if (rename_flags(dir, old, RENAME_NOREPLACE) != 0)
        return cp_errf(err, errlen, "cannot move the old bundle %s aside to %s (%s)", dir, old, strerror(errno));
    if (rename(tmp, dir) != 0) {
        int e = errno;
        (void)rename(old, dir);
        return cp_errf(err, errlen, "cannot rename %s to %s (%s); the old bundle is back", tmp, dir, strerror(e));
    }
    cp_remove_tree(old);
    return 0;
}

static void put_key(cp_str *o, const char *key) {
    cp_json_put_string(o, key);
    cp_str_append(o, ": ", 2);
}

static void put_kv(cp_str *o, const char *indent, const char *key, const char *value, bool comma) {
    cp_str_printf(o, "%s", indent);
    put_key(o, key);
    cp_json_put_string(o, value);
    cp_str_printf(o, "%s\n", comma ? "," : "");
}

int cp_bundle_write(const char *dir_arg, const cp_plan *plan, const char *const *archs, int narchs,
                    const cp_jit_opts *jo, const char *command, char *err, int errlen) {
    /* "b/" is the folder b: the temporary folder goes beside it, not into it */
    char dir[CP_PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s", dir_arg) >= (int)sizeof dir)
        return cp_errf(err, errlen, "-o %.100s...: the path is too long", dir_arg);
    for (size_t l = strlen(dir); l > 1 && dir[l - 1] == '/'; l--) dir[l - 1] = 0;
    if (!*dir || !strcmp(dir, "/") || !strcmp(dir, ".") || !strcmp(dir, ".."))
        return cp_errf(err, errlen, "-o '%s': give the bundle a folder of its own, e.g. -o tiny.bundle", dir_arg);
    if (narchs < 1 || narchs > CP_BUNDLE_MAX_ARCHS)
        return cp_errf(err, errlen, "a bundle holds 1 to %d architectures, not %d", CP_BUNDLE_MAX_ARCHS, narchs);
    for (int a = 0; a < narchs; a++)
        for (int k = 0; k < a; k++)
            if (!strcmp(archs[a], archs[k])) return cp_errf(err, errlen, "--arch names %s twice", archs[a]);
    if (may_write(dir, err, errlen)) return -1; /* before minutes of compiling, not after */
    cp_module_src *mods;
    int n = cp_plan_emit(plan, &mods, err, errlen);
    if (n < 0) return -1;
    cp_jit_module *jm = cp_xcalloc((size_t)n * (size_t)narchs + 1, sizeof *jm);
    int rc = 0, compiled = 0;
    for (int a = 0; a < narchs && !rc; a++) {
        cp_jit_opts o = *jo;
        snprintf(o.arch, sizeof o.arch, "%s", archs[a]);
        rc = cp_jit_compile(mods, n, &o, jm + (size_t)a * n, err, errlen);
        if (!rc) compiled = a + 1;
    }
    int nv_major = 0, nv_minor = 0;
    if (!rc) rc = cp_nvrtc_version(&nv_major, &nv_minor, err, errlen);
    char tmp[CP_PATH_MAX + 48];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.XXXXXX", dir, (long)getpid());
    bool made = false;
    if (!rc) { /* a new folder: nothing of the user's is ever emptied or removed */
        made = mkdtemp(tmp) != NULL;
        if (!made || chmod(tmp, 0755) != 0)
            rc = cp_errf(err, errlen, "cannot create a folder beside %s (%s): -o must be in a folder you can write",
                         dir, strerror(errno));
    }
    if (!rc) {
        char sub[CP_PATH_MAX + 64];
        snprintf(sub, sizeof sub, "%s/src", tmp);
        rc = cp_mkdir_p(sub);
        for (int a = 0; a < narchs && !rc; a++) {
            snprintf(sub, sizeof sub, "%s/%s", tmp, archs[a]);
            rc = cp_mkdir_p(sub);
        }
        if (rc) cp_errf(err, errlen, "cannot create %s (%s)", sub, strerror(errno));
    }
    cp_str spec = {0}, man = {0};
    if (!rc) {
        cp_spec_write_lua(&plan->spec, &spec);
        rc = write_in(tmp, "spec.lua", spec.data, spec.len, err, errlen);
    }
    char spec_sha[CP_SHA256_HEX], plan_sha[CP_SHA256_HEX], nv[16];
    if (!rc) {
        cp_sha256_hex(spec.data, spec.len, spec_sha);
        plan_digest(mods, n, plan_sha);
        snprintf(nv, sizeof nv, "%d.%d", nv_major, nv_minor);
        cp_str_printf(&man, "{\n");
        put_kv(&man, "  ", "format", CP_BUNDLE_FORMAT, true);
        put_kv(&man, "  ", "cpgen_version", CP_VERSION, true);
        put_kv(&man, "  ", "nvrtc_version", nv, true);
        put_kv(&man, "  ", "command", command ? command : "", true);
        put_kv(&man, "  ", "spec", "spec.lua", true);
        put_kv(&man, "  ", "spec_sha256", spec_sha, true);
        put_kv(&man, "  ", "plan_sha256", plan_sha, true);
        cp_str_printf(&man, "  ");
        put_key(&man, "archs");
        cp_str_printf(&man, "[");
        for (int a = 0; a < narchs; a++) {
            if (a) cp_str_printf(&man, ", ");
            cp_json_put_string(&man, archs[a]);
        }
        cp_str_printf(&man, "],\n  \"modules\": [\n");
    }
    for (int i = 0; i < n && !rc; i++) {
        char rel[CP_KNAME_MAX + 32], sha[CP_SHA256_HEX];
        snprintf(rel, sizeof rel, "src/%s.cu", mods[i].name);
        rc = write_in(tmp, rel, mods[i].source, strlen(mods[i].source), err, errlen);
        cp_str_printf(&man, "    {\n");
        put_kv(&man, "      ", "name", mods[i].name, true);
        put_kv(&man, "      ", "source", rel, true);
        put_kv(&man, "      ", "source_sha256", cp_sha256_hex(mods[i].source, strlen(mods[i].source), sha), true);
        cp_str_printf(&man, "      \"cubins\": {\n");
        for (int a = 0; a < narchs && !rc; a++) {
            const cp_jit_module *m = &jm[(size_t)a * n + i];
            snprintf(rel, sizeof rel, "%s/%s.cubin", archs[a], mods[i].name);
            rc = write_in(tmp, rel, m->cubin, m->cubin_len, err, errlen);
            cp_str_printf(&man, "        ");
            put_key(&man, archs[a]);
            cp_str_printf(&man, "{\n");
            put_kv(&man, "          ", "file", rel, true);
            cp_str_printf(&man, "          \"bytes\": %zu,\n", m->cubin_len);
            put_kv(&man, "          ", "sha256", cp_sha256_hex(m->cubin, m->cubin_len, sha), true);
            cp_str_printf(&man, "          \"entries\": [\n");
            for (int e = 0; e < m->nentries; e++) {
                const cp_entry_info *x = &m->entries[e];
                cp_str_printf(&man, "            {\"name\": ");
                cp_json_put_string(&man, x->name);
                cp_str_printf(&man, ", \"registers\": %d, \"shared_bytes\": %d, \"stack_bytes\": %d, "
                              "\"spill_stores\": %d, \"spill_loads\": %d}%s\n", x->registers, x->shared_bytes,
                              x->stack_bytes, x->spill_stores, x->spill_loads, e + 1 < m->nentries ? "," : "");
            }
            cp_str_printf(&man, "          ]\n        }%s\n", a + 1 < narchs ? "," : "");
        }
        cp_str_printf(&man, "      }\n    }%s\n", i + 1 < n ? "," : "");
    }
    if (!rc) {
        cp_str_printf(&man, "  ]\n}\n");
        /* the manifest last: a folder without one is never taken for a bundle */
        rc = write_in(tmp, "manifest.json", man.data, man.len, err, errlen);
    }
    if (!rc) rc = put_in_place(tmp, dir, err, errlen);
    if (rc && made) cp_remove_tree(tmp);
    cp_str_free(&spec);
    cp_str_free(&man);
    for (int i = 0; i < compiled * n; i++) cp_jit_module_free(&jm[i]);
    free(jm);
    cp_module_srcs_free(mods, n);
    return rc;
}

/* ---------------------------------------------------------------- reading */

static int get_text(const cp_json *o, const char *key, char *out, size_t n, const char *path, char *err, int errlen) {
    const cp_json *v = cp_json_get(o, key);
    if (!v || v->type != CP_JSON_STRING || v->len >= n)
        return cp_errf(err, errlen, "%s: \"%s\" is missing or not a string of at most %zu characters at byte %zu; the "
                       "manifest is damaged: rebuild the bundle with cpgen aot", path, key, n - 1, o->at);
    memcpy(out, v->string, v->len + 1);
    return 0;
}

static int get_number(const cp_json *o, const char *key, int64_t *out, const char *path, char *err, int errlen) {
    const cp_json *v = cp_json_get(o, key);
    if (!v || v->type != CP_JSON_NUMBER || !v->is_int)
        return cp_errf(err, errlen, "%s: \"%s\" is missing or not an integer at byte %zu; the manifest is damaged: "
                       "rebuild the bundle with cpgen aot", path, key, o->at);
    *out = v->integer;
    return 0;
}

/* A relative file name inside the bundle: no "..", not absolute. */
static bool safe_rel(const char *rel) { return rel[0] && rel[0] != '/' && !strstr(rel, ".."); }

static int read_cubin_info(const cp_json *c, cp_bundle_cubin *out, const char *path, char *err, int errlen) {
    int64_t v = 0;
    if (get_text(c, "file", out->file, sizeof out->file, path, err, errlen) ||
        get_text(c, "sha256", out->sha256, sizeof out->sha256, path, err, errlen) ||
        get_number(c, "bytes", &out->bytes, path, err, errlen))
        return -1;
    if (!safe_rel(out->file))
        return cp_errf(err, errlen, "%s: cubin file \"%s\" is not a path inside the bundle", path, out->file);
    const cp_json *ents = cp_json_get(c, "entries");
    if (!ents || ents->type != CP_JSON_ARRAY || ents->n > CP_MAX_ENTRIES)
        return cp_errf(err, errlen, "%s: the entries of %s are missing or more than %d", path, out->file, CP_MAX_ENTRIES);
    out->nentries = ents->n;
    for (int e = 0; e < ents->n; e++) {
        cp_entry_info *x = &out->entries[e];
        const char *keys[] = {"registers", "shared_bytes", "stack_bytes", "spill_stores", "spill_loads"};
        int *dst[] = {&x->registers, &x->shared_bytes, &x->stack_bytes, &x->spill_stores, &x->spill_loads};
        if (get_text(&ents->items[e], "name", x->name, sizeof x->name, path, err, errlen)) return -1;
        for (size_t k = 0; k < CP_ARRAY_LEN(keys); k++) {
            if (get_number(&ents->items[e], keys[k], &v, path, err, errlen)) return -1;
            *dst[k] = (int)v;
        }
    }
    return 0;
}

static int parse_manifest(const cp_json *root, cp_bundle *b, const char *path, char *err, int errlen) {
    char format[32];
    if (root->type != CP_JSON_OBJECT) return cp_errf(err, errlen, "%s is not a JSON object", path);
    if (get_text(root, "format", format, sizeof format, path, err, errlen)) return -1;
    if (strcmp(format, CP_BUNDLE_FORMAT))
        return cp_errf(err, errlen, "%s: format \"%s\", this cpgen reads \"%s\": rebuild the bundle with this cpgen "
                       "(cpgen aot)", path, format, CP_BUNDLE_FORMAT);
    if (get_text(root, "cpgen_version", b->version, sizeof b->version, path, err, errlen) ||
        get_text(root, "nvrtc_version", b->nvrtc, sizeof b->nvrtc, path, err, errlen) ||
        get_text(root, "command", b->command, sizeof b->command, path, err, errlen) ||
        get_text(root, "spec_sha256", b->spec_sha256, sizeof b->spec_sha256, path, err, errlen) ||
        get_text(root, "plan_sha256", b->plan_sha256, sizeof b->plan_sha256, path, err, errlen))
        return -1;
    const cp_json *archs = cp_json_get(root, "archs"), *mods = cp_json_get(root, "modules");
    if (!archs || archs->type != CP_JSON_ARRAY || archs->n < 1 || archs->n > CP_BUNDLE_MAX_ARCHS)
        return cp_errf(err, errlen, "%s: \"archs\" must list 1 to %d architectures", path, CP_BUNDLE_MAX_ARCHS);
    b->narchs = archs->n;
    for (int a = 0; a < archs->n; a++) {
        const cp_json *x = &archs->items[a];
        if (x->type != CP_JSON_STRING || x->len >= sizeof b->archs[a] || !safe_rel(x->string))
            return cp_errf(err, errlen, "%s: architecture %d is not a name like sm_90a", path, a);
        memcpy(b->archs[a], x->string, x->len + 1);
    }
    if (!mods || mods->type != CP_JSON_ARRAY)
        return cp_errf(err, errlen, "%s: \"modules\" is missing or not an array", path);
    b->nmodules = mods->n;
    b->modules = cp_xcalloc((size_t)CP_MAX(mods->n, 1), sizeof *b->modules);
    for (int i = 0; i < mods->n; i++) {
        const cp_json *m = &mods->items[i];
        cp_bundle_module *bm = &b->modules[i];
        if (get_text(m, "name", bm->name, sizeof bm->name, path, err, errlen) ||
            get_text(m, "source_sha256", bm->source_sha256, sizeof bm->source_sha256, path, err, errlen))
            return -1;
        const cp_json *cubins = cp_json_get(m, "cubins");
        for (int a = 0; a < b->narchs; a++) {
            const cp_json *c = cp_json_get(cubins, b->archs[a]);
            if (!c || c->type != CP_JSON_OBJECT)
                return cp_errf(err, errlen, "%s: module %s has no cubin for %s", path, bm->name, b->archs[a]);
            if (read_cubin_info(c, &bm->cubins[a], path, err, errlen)) return -1;
        }
    }
    return 0;
}

int cp_bundle_open(const char *dir, cp_bundle *b, char *err, int errlen) {
    memset(b, 0, sizeof *b);
    snprintf(b->dir, sizeof b->dir, "%s", dir);
    char path[CP_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    size_t len;
    char why[256];
    char *text = cp_read_file_as(path, CP_FILE_MANIFEST, &len, why, sizeof why);
    if (!text)
        return cp_errf(err, errlen, "cannot read %s (%s): is %s a bundle made by cpgen aot?", path, why, dir);
    cp_json root;
    int rc = cp_json_parse(text, len, &root, why, sizeof why);
    free(text);
    if (rc) return cp_errf(err, errlen, "%s is not valid JSON (%s): rebuild the bundle with cpgen aot", path, why);
    rc = parse_manifest(&root, b, path, err, errlen);
    cp_json_free(&root);
    if (!rc) {
        snprintf(path, sizeof path, "%s/spec.lua", dir);
        b->spec_text = cp_read_file_as(path, CP_FILE_SPEC, &len, why, sizeof why);
        if (!b->spec_text)
            rc = cp_errf(err, errlen, "cannot read %s (%s): the bundle is incomplete or damaged; rebuild it with cpgen "
                         "aot", path, why);
    }
    if (rc) cp_bundle_close(b);
    return rc;
}

void cp_bundle_close(cp_bundle *b) {
    free(b->modules);
    free(b->spec_text);
    b->modules = NULL;
    b->spec_text = NULL;
}

/* ---------------------------------------------------------------- checking and loading */

static int arch_index(const cp_bundle *b, const char *arch) {
    for (int a = 0; a < b->narchs; a++)
        if (!strcmp(b->archs[a], arch)) return a;
    return -1;
}

static const cp_bundle_module *find_module(const cp_bundle *b, const char *name) {
    for (int i = 0; i < b->nmodules; i++)
        if (!strcmp(b->modules[i].name, name)) return &b->modules[i];
    return NULL;
}

/* Read one cubin and check its size and SHA-256; the bytes (owned) or NULL with a message. */
static void *read_cubin(const cp_bundle *b, const cp_bundle_cubin *c, size_t *len, const char *rebuild, char *err,
                        int errlen) {
    char path[CP_PATH_MAX + CP_KNAME_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", b->dir, c->file);
    char why[256];
    void *d = cp_read_file_as(path, CP_FILE_CUBIN, len, why, sizeof why);
    if (!d) {
        cp_errf(err, errlen, "bundle %s: cubin %s is %s (%s): copy the whole bundle folder again, or rebuild it: %s",
                b->dir, c->file, errno == ENOENT ? "missing" : "unreadable", why, rebuild);
        return NULL;
    }
    char sha[CP_SHA256_HEX];
    cp_sha256_hex(d, *len, sha);
    if ((int64_t)*len != c->bytes || strcmp(sha, c->sha256)) {
        cp_errf(err, errlen, "bundle %s: cubin %s is damaged: %zu bytes with SHA-256 %.16s..., the manifest says %lld "
                "bytes with %.16s...: copy the whole bundle folder again, or rebuild it: %s", b->dir, c->file, *len,
                sha, (long long)c->bytes, c->sha256, rebuild);
        free(d);
        return NULL;
    }
    return d;
}

void cp_bundle_arch_list(const cp_bundle *b, const char *sep, char *out, size_t n) {
    out[0] = 0;
    for (int a = 0; a < b->narchs; a++) {
        size_t l = strlen(out);
        snprintf(out + l, n - l, "%s%s", a ? sep : "", b->archs[a]);
    }
}

int cp_bundle_check(const cp_bundle *b, const cp_plan *plan, const char *arch, const char *rebuild, cp_str *note,
                    char *err, int errlen) {
    if (strcmp(b->version, CP_VERSION))
        return cp_errf(err, errlen, "bundle %s was made by cpgen %s; this is cpgen %s, whose kernels and plans can "
                       "differ: rebuild it with this cpgen: %s", b->dir, b->version, CP_VERSION, rebuild);
    char archs[128];
    cp_bundle_arch_list(b, ", ", archs, sizeof archs);
    if (arch && arch_index(b, arch) < 0)
        return cp_errf(err, errlen, "bundle %s holds cubins for %s; this GPU is %s, and a cubin runs only on the "
                       "architecture it was compiled for: rebuild it: %s", b->dir, archs, arch, rebuild);
    cp_module_src *mods;
    int n = cp_plan_emit(plan, &mods, err, errlen);
    if (n < 0) return -1;
    char plan_sha[CP_SHA256_HEX];
    plan_digest(mods, n, plan_sha);
    cp_str spec = {0}, diff = {0};
    cp_spec_write_lua(&plan->spec, &spec);
    int ndiff = cp_spec_diff(b->spec_text, spec.data, &diff, 6);
    int rc = 0;
    if (strcmp(plan_sha, b->plan_sha256)) {
        cp_str missing = {0};
        int nmiss = 0;
        for (int i = 0; i < n; i++) {
            const cp_bundle_module *m = find_module(b, mods[i].name);
            char sha[CP_SHA256_HEX];
            if (m && !strcmp(m->source_sha256, cp_sha256_hex(mods[i].source, strlen(mods[i].source), sha))) continue;
            if (++nmiss <= 3) cp_str_printf(&missing, "%s%s", nmiss > 1 ? ", " : "", mods[i].name);
        }
        rc = cp_errf(err, errlen, "bundle %s was made for another plan: %s%s%d of this run's %d kernel modules are not "
                     "in it%s%s%s: rebuild it for this run: %s", b->dir, ndiff ? diff.data : "", ndiff ? "; " : "",
                     nmiss, n, nmiss ? " (" : "", nmiss ? missing.data : "", nmiss > 3 ? ", ...)" : nmiss ? ")" : "",
                     rebuild);
        cp_str_free(&missing);
    } else if (ndiff && note) {
        cp_str_printf(note, "the spec differs from the bundle's in keys no kernel depends on: %s", diff.data);
    }
    /* every module of the plan, on every architecture that can run here, present and whole */
    for (int i = 0; i < n && !rc; i++) {
        const cp_bundle_module *m = find_module(b, mods[i].name);
        if (!m) {
            rc = cp_errf(err, errlen, "bundle %s: the manifest lists no module %s: rebuild it: %s", b->dir,
                         mods[i].name, rebuild);
            break;
        }
        for (int a = 0; a < b->narchs && !rc; a++) {
            if (arch && strcmp(arch, b->archs[a])) continue;
            size_t len;
            void *d = read_cubin(b, &m->cubins[a], &len, rebuild, err, errlen);
            if (!d) rc = -1;
            free(d);
        }
    }
    cp_str_free(&spec);
    cp_str_free(&diff);
    cp_module_srcs_free(mods, n);
    return rc;
}

int cp_bundle_modules(const cp_bundle *b, const cp_module_src *src, int n, const char *arch, cp_jit_module *out,
                      char *err, int errlen) {
    for (int i = 0; i < n; i++) memset(&out[i], 0, sizeof out[i]);
    int a = arch_index(b, arch), rc = 0;
    char archs[128], rebuild[2200];
    cp_bundle_arch_list(b, ", ", archs, sizeof archs);
    snprintf(rebuild, sizeof rebuild, "it was made by `%s`; make one for this run with --arch %s", b->command, arch);
    if (a < 0)
        return cp_errf(err, errlen, "bundle %s holds cubins for %s, not for %s: rebuild it: %s", b->dir, archs, arch,
                       rebuild);
    for (int i = 0; i < n && !rc; i++) {
        double t0 = cp_now();
        const cp_bundle_module *m = find_module(b, src[i].name);
        char sha[CP_SHA256_HEX];
        if (!m || strcmp(m->source_sha256, cp_sha256_hex(src[i].source, strlen(src[i].source), sha))) {
            rc = cp_errf(err, errlen, "bundle %s has no module %s of this plan (or another source under that name): "
                         "rebuild it: %s", b->dir, src[i].name, rebuild);
            break;
        }
        const cp_bundle_cubin *c = &m->cubins[a];
        cp_jit_module *o = &out[i];
        o->cubin = read_cubin(b, c, &o->cubin_len, rebuild, err, errlen);
        if (!o->cubin) {
            rc = -1;
            break;
        }
        snprintf(o->name, sizeof o->name, "%s", m->name);
        int w = snprintf(o->source_path, sizeof o->source_path, "%.900s/src/%s.cu", b->dir, m->name);
        if (w < 0 || (size_t)w >= sizeof o->source_path) o->source_path[0] = 0;
        o->nentries = c->nentries;
        memcpy(o->entries, c->entries, sizeof c->entries);
        o->from_cache = true;
        o->seconds = cp_now() - t0;
    }
    if (rc)
        for (int i = 0; i < n; i++) cp_jit_module_free(&out[i]);
    return rc;
}
