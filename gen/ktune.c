/* ktune.c: the kernel tuning cache (see ktune.h): its file, its entries as JSON, and choosing a plan's kernel variants
 * from it or from a bundle's module names. */
#include "ktune.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "jit.h"
#include "util.h"

void cp_ktune_path(const char *cache_dir, char *out, size_t n) {
    cp_jit_opts o;
    memset(&o, 0, sizeof o);
    if (cache_dir) snprintf(o.cache_dir, sizeof o.cache_dir, "%s", cache_dir);
    char dir[sizeof o.cache_dir];
    cp_jit_cache_dir(&o, dir, sizeof dir);
    snprintf(out, n, "%s/tuning.json", dir);
}

/* ---------------------------------------------------------------- entries as JSON */

void cp_ktune_entry_json(cp_str *o, const cp_ktune_entry *e) {
    const char *keys[] = {"arch", "driver", "kernel", "shape", "param"};
    const char *vals[] = {e->arch, e->driver, e->kernel, e->shape, e->param};
    cp_str_printf(o, "{");
    for (size_t i = 0; i < CP_ARRAY_LEN(keys); i++) {
        cp_str_printf(o, "\"%s\": ", keys[i]);
        cp_json_put_string(o, vals[i]);
        cp_str_printf(o, ", ");
    }
    cp_str_printf(o, "\"default\": %d, \"winner\": %d, \"ms\": {", e->def, e->winner);
    for (int i = 0; i < e->n; i++) {
        cp_str_printf(o, "%s\"%d\": ", i ? ", " : "", e->values[i]);
        cp_json_put_number(o, e->ms[i]);
    }
    cp_str_printf(o, "}, \"flops\": ");
    cp_json_put_number(o, e->flops);
    cp_str_printf(o, ", \"cpgen\": ");
    cp_json_put_string(o, e->cpgen);
    cp_str_printf(o, "}");
}

/* String member key of j into out (n bytes): 0, or -1 with why. */
static int get_str(const cp_json *j, const char *key, char *out, size_t n, char *why, int whylen) {
    const cp_json *v = cp_json_get(j, key);
    if (!v || v->type != CP_JSON_STRING || v->len == 0 || v->len >= n)
        return cp_errf(why, whylen, "\"%s\" is not a string of 1 to %zu characters", key, n - 1);
    memcpy(out, v->string, v->len + 1);
    return 0;
}

static int get_int(const cp_json *j, const char *key, int *out, char *why, int whylen) {
    const cp_json *v = cp_json_get(j, key);
    if (!v || v->type != CP_JSON_NUMBER || !v->is_int || v->integer < 0 || v->integer > 1 << 20)
        return cp_errf(why, whylen, "\"%s\" is not a small whole number", key);
    *out = (int)v->integer;
    return 0;
}

int cp_ktune_entry_parse(const cp_json *j, cp_ktune_entry *e, char *why, int whylen) {
    memset(e, 0, sizeof *e);
    if (j->type != CP_JSON_OBJECT)
        return cp_errf(why, whylen, "an entry is a %s, not an object", cp_json_type_name(j->type));
    if (get_str(j, "arch", e->arch, sizeof e->arch, why, whylen) ||
        get_str(j, "driver", e->driver, sizeof e->driver, why, whylen) ||
        get_str(j, "kernel", e->kernel, sizeof e->kernel, why, whylen) ||
        get_str(j, "shape", e->shape, sizeof e->shape, why, whylen) ||
        get_str(j, "param", e->param, sizeof e->param, why, whylen) ||
        get_str(j, "cpgen", e->cpgen, sizeof e->cpgen, why, whylen) || get_int(j, "default", &e->def, why, whylen) ||
        get_int(j, "winner", &e->winner, why, whylen))
        return -1;
    const cp_json *ms = cp_json_get(j, "ms");
    if (!ms || ms->type != CP_JSON_OBJECT || ms->n < 1 || ms->n > CP_KVAR_MAX)
        return cp_errf(why, whylen, "\"ms\" is not an object of 1 to %d times", CP_KVAR_MAX);
    bool has_winner = false;
    for (int i = 0; i < ms->n; i++) {
        char *end;
        long v = strtol(ms->keys[i], &end, 10);
        if (*end || end == ms->keys[i] || v < 0 || v > 1 << 20 || ms->items[i].type != CP_JSON_NUMBER ||
            !(ms->items[i].number > 0))
            return cp_errf(why, whylen, "\"ms\": \"%s\" is not a variant with a positive time", ms->keys[i]);
        e->values[e->n] = (int)v;
        e->ms[e->n++] = ms->items[i].number;
        has_winner |= v == e->winner;
    }
    if (!has_winner) return cp_errf(why, whylen, "the winner %d has no time in \"ms\"", e->winner);
    const cp_json *fl = cp_json_get(j, "flops");
    if (fl && (fl->type != CP_JSON_NUMBER || fl->number < 0)) return cp_errf(why, whylen, "\"flops\" is not a number");
    e->flops = fl ? fl->number : 0;
    return 0;
}

static double ms_of(const cp_ktune_entry *e, int value) {
    for (int i = 0; i < e->n; i++)
        if (e->values[i] == value) return e->ms[i];
    return -1;
}

void cp_ktune_entry_print(FILE *out, const cp_ktune_entry *e) {
    fprintf(out, "  %s %s (%s, driver %s)\n", e->kernel, e->shape, e->arch, e->driver);
    const double def = ms_of(e, e->def);
    for (int i = 0; i < e->n; i++) {
        fprintf(out, "    %s %2d %10.3f ms", e->param, e->values[i], e->ms[i]);
        if (e->flops > 0) fprintf(out, " %6.0f TF/s", e->flops / (e->ms[i] * 1e-3) / 1e12);
        if (e->values[i] == e->def) fprintf(out, "  default");
        if (e->values[i] == e->winner) {
            fprintf(out, "%s winner", e->values[i] == e->def ? "," : " ");
            if (e->winner != e->def && def > 0)
                fprintf(out, ", %.1f%% faster than the default", 100 * (1 - e->ms[i] / def));
        }
        fputc('\n', out);
    }
}

/* ---------------------------------------------------------------- the file */

/* Parse the file's text into c (left empty on failure). 0, or -1 with why. */
static int parse_cache(const char *text, size_t len, cp_ktune_cache *c, char *why, int whylen) {
    cp_json j;
    char e[256];
    if (cp_json_parse(text, len, &j, e, sizeof e)) return cp_errf(why, whylen, "not JSON (%s)", e);
    int rc = 0;
    const cp_json *f = cp_json_get(&j, "format"), *list = cp_json_get(&j, "entries");
    if (!f || f->type != CP_JSON_STRING || strcmp(f->string, CP_KTUNE_FORMAT))
        rc = cp_errf(why, whylen, "its \"format\" is not \"%s\"", CP_KTUNE_FORMAT);
    else if (!list || list->type != CP_JSON_ARRAY)
        rc = cp_errf(why, whylen, "no \"entries\" array");
    for (int i = 0; !rc && i < list->n; i++) {
        cp_ktune_entry x;
        if (cp_ktune_entry_parse(&list->items[i], &x, e, sizeof e)) rc = cp_errf(why, whylen, "entry %d: %s", i, e);
        else cp_ktune_put(c, &x);
    }
    cp_json_free(&j);
    if (rc) cp_ktune_free(c);
    return rc;
}

int cp_ktune_load(const char *path, cp_ktune_cache *c, FILE *warn) {
    memset(c, 0, sizeof *c);
    size_t len;
    char why[512], e[256];
    char *text = cp_read_file_as(path, CP_FILE_CACHE, &len, e, sizeof e);
    if (!text) {
        if (errno == ENOENT) return 0;
        snprintf(why, sizeof why, "cannot be read (%s)", e);
    } else if (!parse_cache(text, len, c, why, sizeof why)) {
        free(text);
        return c->n;
    }
    free(text);
    if (warn)
        fprintf(warn, "cpgen: warning: kernel tuning cache %s ignored: %s; the generator's default kernels are used, and "
                      "the next cpgen tune on this machine writes a new one\n", path, why);
    return 0;
}

static bool same_key(const cp_ktune_entry *a, const char *arch, const char *driver, const char *kernel,
                     const char *shape) {
    return !strcmp(a->arch, arch) && !strcmp(a->driver, driver) && !strcmp(a->kernel, kernel) &&
           !strcmp(a->shape, shape);
}

const cp_ktune_entry *cp_ktune_find(const cp_ktune_cache *c, const char *arch, const char *driver, const char *kernel,
                                    const char *shape) {
    for (int i = 0; i < c->n; i++)
        if (same_key(&c->e[i], arch, driver, kernel, shape)) return &c->e[i];
    return NULL;
}

void cp_ktune_put(cp_ktune_cache *c, const cp_ktune_entry *e) {
    for (int i = 0; i < c->n; i++)
        if (same_key(&c->e[i], e->arch, e->driver, e->kernel, e->shape)) {
            c->e[i] = *e;
            return;
        }
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 16;
        c->e = cp_xrealloc(c->e, sizeof *c->e * (size_t)c->cap);
    }
    c->e[c->n++] = *e;
}

int cp_ktune_save(const cp_ktune_cache *c, const char *path, char *err, int errlen) {
    cp_str o = {0};
    cp_str_printf(&o, "{\"format\": \"%s\", \"entries\": [", CP_KTUNE_FORMAT);
    for (int i = 0; i < c->n; i++) {
        cp_str_printf(&o, "%s\n  ", i ? "," : "");
        cp_ktune_entry_json(&o, &c->e[i]);
    }
    cp_str_printf(&o, "\n]}\n");
    char dir[CP_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    int rc = 0;
    if (slash && cp_mkdir_p(dir)) rc = cp_errf(err, errlen, "cannot create %s (%s)", dir, strerror(errno));
    else if (cp_write_file_atomic(path, o.data, o.len))
        rc = cp_errf(err, errlen, "cannot write the kernel tuning cache %s (%s)", path, strerror(errno));
    cp_str_free(&o);
    return rc;
}

void cp_ktune_free(cp_ktune_cache *c) {
    free(c->e);
    memset(c, 0, sizeof *c);
}

/* ---------------------------------------------------------------- choosing a plan's variants */

static bool has_value(const cp_kvariants *v, int value) {
    for (int i = 0; i < v->n; i++)
        if (v->values[i] == value) return true;
    return false;
}

/* Whether the comma-separated archs name arch. */
static bool arch_listed(const char *archs, const char *arch) {
    size_t n = strlen(arch);
    for (const char *p = archs; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && !strncmp(p, arch, n)) return true;
        p += len + (p[len] == ',');
    }
    return false;
}

/* Record module m's variant (given to it) as choice number P->nkchoices. */
static cp_kchoice *choose(cp_plan *P, int m, const cp_kvariants *v, int value, cp_kvar_source source) {
    cp_k_set_variant(&P->modules[m], v, value);
    cp_kchoice *k = &P->kchoices[P->nkchoices++];
    memset(k, 0, sizeof *k);
    k->module = m;
    k->value = value;
    k->source = source;
    return k;
}

static void reset_choices(cp_plan *P) {
    free(P->kchoices);
    P->kchoices = cp_xcalloc((size_t)CP_MAX(P->nmodules, 1), sizeof *P->kchoices);
    P->nkchoices = 0;
}

void cp_ktune_apply(cp_plan *P, const cp_ktune_cache *c, const char *archs, const char *driver) {
    reset_choices(P);
    for (int m = 0; m < P->nmodules; m++) {
        cp_kvariants v;
        if (!cp_k_variants(&P->modules[m], &v)) continue;
        const cp_ktune_entry *e = cp_ktune_find(c, v.arch, driver, v.kernel, v.shape);
        if (arch_listed(archs, v.arch) && driver[0] && e && has_value(&v, e->winner)) {
            cp_kchoice *k = choose(P, m, &v, e->winner, CP_KVAR_CACHE);
            char def[48] = "";
            if (e->winner != v.def && ms_of(e, v.def) > 0)
                snprintf(def, sizeof def, "; the default %d: %.3f ms", v.def, ms_of(e, v.def));
            snprintf(k->note, sizeof k->note, "from the tuning cache (%s, driver %s: %.3f ms%s)", v.arch, driver,
                     ms_of(e, e->winner), def);
            continue;
        }
        cp_kchoice *k = choose(P, m, &v, v.def, CP_KVAR_DEFAULT);
        if (!arch_listed(archs, v.arch))
            snprintf(k->note, sizeof k->note, "the default (only %s runs it; kernels are built for %s)", v.arch, archs);
        else if (!driver[0])
            snprintf(k->note, sizeof k->note, "the default (no GPU driver here to key the tuning cache by)");
        else if (e)
            snprintf(k->note, sizeof k->note, "the default (the cached winner %d is not a variant of this build: "
                     "cpgen tune times them again)", e->winner);
        else
            snprintf(k->note, sizeof k->note, "the default (the tuning cache has no entry for %s, driver %s: cpgen "
                     "tune times the variants)", v.arch, driver);
    }
}

void cp_ktune_apply_bundle(cp_plan *P, const char *const *names, int n) {
    reset_choices(P);
    for (int m = 0; m < P->nmodules; m++) {
        cp_kvariants v;
        if (!cp_k_variants(&P->modules[m], &v)) continue;
        int found = v.def;
        for (int i = 0; i < v.n && found == v.def; i++) {
            cp_kernel_spec k;
            cp_kspec_copy(&k, &P->modules[m]);
            cp_k_set_variant(&k, &v, v.values[i]);
            cp_module_src src;
            char err[1024];
            if (!cp_emit(&k, &src, err, sizeof err)) {
                for (int b = 0; b < n; b++)
                    if (!strcmp(names[b], src.name)) found = v.values[i];
                cp_module_src_free(&src);
            }
            cp_kspec_free(&k);
        }
        cp_kchoice *k = choose(P, m, &v, found, CP_KVAR_BUNDLE);
        snprintf(k->note, sizeof k->note, "as the bundle was built%s", found == v.def ? " (the default)" : "");
    }
}
