/* emit.c: fill a kernel template's {{KEY}} placeholders and check the result names its module and entries
 * by the conventions in emit.h; emit every module of a plan once. */
#include "emit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embedded.h"
#include "plan.h"
#include "util.h"

void cp_kspec_init(cp_kernel_spec *k, const char *family) {
    memset(k, 0, sizeof *k);
    snprintf(k->family, sizeof k->family, "%s", family);
}

void cp_kspec_set_str(cp_kernel_spec *k, const char *key, const char *v) {
    for (int i = 0; i < k->nparams; i++)
        if (strcmp(k->params[i].key, key) == 0) {
            free(k->params[i].value);
            k->params[i].value = cp_xstrdup(v);
            return;
        }
    if (k->nparams == CP_MAX_PARAMS) cp_fatal(CP_EXIT_FAIL, "kernel %s: more than %d parameters", k->family, CP_MAX_PARAMS);
    cp_param *p = &k->params[k->nparams++];
    snprintf(p->key, sizeof p->key, "%s", key);
    p->value = cp_xstrdup(v);
}

void cp_kspec_set_int(cp_kernel_spec *k, const char *key, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", (long long)v);
    cp_kspec_set_str(k, key, buf);
}

void cp_kspec_set_double(cp_kernel_spec *k, const char *key, double v) {
    char buf[40];
    snprintf(buf, sizeof buf, "%.17g", v);
    cp_kspec_set_str(k, key, buf);
}

void cp_kspec_copy(cp_kernel_spec *dst, const cp_kernel_spec *src) {
    cp_kspec_init(dst, src->family);
    memcpy(dst->tag, src->tag, sizeof dst->tag);
    for (int i = 0; i < src->nparams; i++) cp_kspec_set_str(dst, src->params[i].key, src->params[i].value);
}

void cp_kspec_free(cp_kernel_spec *k) {
    for (int i = 0; i < k->nparams; i++) free(k->params[i].value);
    k->nparams = 0;
}

void cp_module_src_free(cp_module_src *m) {
    free(m->source);
    m->source = NULL;
}

void cp_entry_name(const char *family, const char *module_name, const char *role, char *out) {
    size_t fl = strlen(family);
    const char *suffix = strncmp(module_name, family, fl) == 0 ? module_name + fl : "";
    snprintf(out, CP_KNAME_MAX, "%s_%s%s", family, role, suffix);
}

static int emit_expanded(const char *family, const char *tmpl, const cp_kernel_spec *k, cp_module_src *out, char *err,
                         int errlen);

static bool is_key_char(char c) { return (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'; }

/* A variant's name tag: "_<tag>" inserted into the emitted text at each of the n offsets cuts (the end of the module
 * line's name and of every entry's name), and appended to out's names. Returns 0, or -1 with a message. */
static int apply_tag(const char *family, const char *tag, cp_str *s, size_t *cuts, int n, cp_module_src *out,
                     char *err, int errlen) {
    size_t tl = strlen(tag);
    bool ok = tl > 0 && tl < CP_KTAG_MAX;
    for (size_t i = 0; i < tl && ok; i++) ok = (tag[i] >= 'a' && tag[i] <= 'z') || (tag[i] >= '0' && tag[i] <= '9');
    if (!ok) return cp_errf(err, errlen, "kernel %s: variant tag \"%s\" must be lowercase letters and digits", family, tag);
    size_t longest = strlen(out->name);
    for (int e = 0; e < out->nentries; e++) longest = CP_MAX(longest, strlen(out->entries[e]));
    if (longest + 1 + tl >= CP_KNAME_MAX)
        return cp_errf(err, errlen, "kernel %s: names with the variant tag %s pass %d characters", family, tag,
                       CP_KNAME_MAX - 1);
    for (int i = 1; i < n; i++) /* in text order: the module line need not come first */
        for (int j = i; j > 0 && cuts[j] < cuts[j - 1]; j--) {
            size_t x = cuts[j];
            cuts[j] = cuts[j - 1];
            cuts[j - 1] = x;
        }
    cp_str t = {0};
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        cp_str_append(&t, s->data + at, cuts[i] - at);
        cp_str_printf(&t, "_%s", tag);
        at = cuts[i];
    }
    cp_str_append(&t, s->data + at, s->len - at);
    cp_str_free(s);
    *s = t;
    char *names[1 + CP_MAX_ENTRIES] = {out->name}; /* each has room: checked above */
    for (int e = 0; e < out->nentries; e++) names[1 + e] = out->entries[e];
    for (int i = 0; i <= out->nentries; i++) {
        size_t l = strlen(names[i]);
        names[i][l] = '_';
        memcpy(names[i] + l + 1, tag, tl + 1);
    }
    return 0;
}

/* A line `#include "NAME.cuh"` of a template is replaced by the embedded templates/NAME.cuh (one level deep), so an
 * emitted module stays one self-contained source: the JIT cache key and the kept .cu cover everything compiled.
 * Other includes (<cuda_bf16.h>) stay for NVRTC. Returns the expanded text (owned), or NULL with a message. */
static char *expand_includes(const char *family, const char *tmpl, char *err, int errlen) {
    cp_str s = {0};
    const char *p = tmpl;
    int line = 1;
    for (; *p; line++) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p + 1) : strlen(p);
        const char *q = p + strspn(p, " "), *e = NULL;
        if (strncmp(q, "#include \"", 10) == 0) e = strchr(q + 10, '"');
        size_t n = e ? (size_t)(e - (q + 10)) : 0;
        if (e && n > 4 && n < 64 && strncmp(e - 4, ".cuh", 4) == 0) {
            char name[96];
            snprintf(name, sizeof name, "templates/%.*s", (int)n, q + 10);
            const cp_embedded_file *f = cp_embedded_find(name);
            if (!f) {
                snprintf(err, errlen, "templates/%s.cu:%d: includes %s, which is not in this build; add it to "
                         "templates/ and rebuild cpgen", family, line, name);
                cp_str_free(&s);
                return NULL;
            }
            cp_str_append(&s, f->text, f->len);
            if (f->len && f->text[f->len - 1] != '\n') cp_str_append(&s, "\n", 1);
        } else {
            cp_str_append(&s, p, len);
        }
        p += len;
    }
    if (!s.data) cp_str_append(&s, "", 0);
    return s.data;
}

int cp_emit_text(const char *family, const char *tmpl_text, const cp_kernel_spec *k, cp_module_src *out, char *err,
                 int errlen) {
    memset(out, 0, sizeof *out);
    char *expanded = expand_includes(family, tmpl_text, err, errlen);
    if (!expanded) return -1;
    int rc = emit_expanded(family, expanded, k, out, err, errlen);
    free(expanded);
    return rc;
}

static int emit_expanded(const char *family, const char *tmpl, const cp_kernel_spec *k, cp_module_src *out, char *err,
                         int errlen) {
    snprintf(out->family, sizeof out->family, "%s", family);
    bool used[CP_MAX_PARAMS] = {0};
    cp_str s = {0};
    const char *p = tmpl;
    int line = 1;
    while (*p) {
        const char *open = strstr(p, "{{");
        const char *upto = open ? open : p + strlen(p);
        for (const char *q = p; q < upto; q++) line += *q == '\n';
        cp_str_append(&s, p, (size_t)(upto - p));
        if (!open) break;
        const char *close = strstr(open + 2, "}}");
        char key[64];
        size_t kl = close ? (size_t)(close - open - 2) : 0;
        if (!close || kl == 0 || kl >= sizeof key) {
            snprintf(err, errlen, "templates/%s.cu:%d: unterminated or malformed placeholder", family, line);
            goto fail;
        }
        memcpy(key, open + 2, kl);
        key[kl] = 0;
        for (size_t i = 0; i < kl; i++)
            if (!is_key_char(key[i])) {
                snprintf(err, errlen, "templates/%s.cu:%d: placeholder {{%s}} is not UPPER_CASE", family, line, key);
                goto fail;
            }
        int found = -1;
        for (int i = 0; i < k->nparams; i++)
            if (strcmp(k->params[i].key, key) == 0) found = i;
        if (found < 0) {
            snprintf(err, errlen, "templates/%s.cu:%d: placeholder {{%s}} has no value; the kernel constructor in "
                     "gen/kernels.c must set it", family, line, key);
            goto fail;
        }
        used[found] = true;
        cp_str_append(&s, k->params[found].value, strlen(k->params[found].value));
        p = close + 2;
    }
    for (int i = 0; i < k->nparams; i++)
        if (!used[i]) {
            snprintf(err, errlen, "templates/%s.cu: value %s=%s is never used; remove it from the constructor or "
                     "use {{%s}} in the template", family, k->params[i].key, k->params[i].value, k->params[i].key);
            goto fail;
        }
    /* module name: first "module:" line */
    const char *mod = s.data ? strstr(s.data, "module:") : NULL;
    if (!mod) {
        snprintf(err, errlen, "templates/%s.cu: no \"// module: %s_...\" line naming the module", family, family);
        goto fail;
    }
    mod += strlen("module:");
    while (*mod == ' ') mod++;
    size_t ml = 0;
    while (mod[ml] && (is_key_char(mod[ml]) || (mod[ml] >= 'a' && mod[ml] <= 'z'))) ml++;
    if (ml == 0 || ml >= CP_KNAME_MAX || strncmp(mod, family, strlen(family)) != 0) {
        snprintf(err, errlen, "templates/%s.cu: module name must start with \"%s\"", family, family);
        goto fail;
    }
    memcpy(out->name, mod, ml);
    out->name[ml] = 0;
    size_t cuts[1 + CP_MAX_ENTRIES]; /* where a variant tag goes: after the module line's name and each entry's */
    cuts[0] = (size_t)(mod + ml - s.data);
    /* entries */
    const char *suffix = out->name + strlen(family);
    const char *decl = "extern \"C\" __global__";
    for (const char *q = strstr(s.data, decl); q; q = strstr(q + 1, decl)) {
        const char *e = strchr(q, '(');
        if (!e) break;
        /* `__launch_bounds__(...)` may stand between the qualifiers and the name: skip its parentheses */
        const char *lb = strstr(q, "__launch_bounds__");
        if (lb && lb < e) {
            const char *close = strchr(lb, ')');
            if (!close) break;
            e = strchr(close + 1, '(');
            if (!e) break;
        }
        const char *b = e;
        while (b > q && b[-1] == ' ') b--;
        const char *a = b;
        while (a > q && (is_key_char(a[-1]) || (a[-1] >= 'a' && a[-1] <= 'z'))) a--;
        char name[CP_KNAME_MAX];
        size_t nl = (size_t)(b - a);
        if (nl == 0 || nl >= sizeof name) continue;
        memcpy(name, a, nl);
        name[nl] = 0;
        size_t fl = strlen(family), sl = strlen(suffix);
        if (strncmp(name, family, fl) != 0 || name[fl] != '_' || nl <= fl + 1 + sl || strcmp(name + nl - sl, suffix) != 0) {
            snprintf(err, errlen, "templates/%s.cu: kernel %s does not follow the naming rule %s_<role>%s", family,
                     name, family, suffix);
            goto fail;
        }
        if (out->nentries == CP_MAX_ENTRIES) {
            snprintf(err, errlen, "templates/%s.cu: more than %d kernels in one module", family, CP_MAX_ENTRIES);
            goto fail;
        }
        cuts[1 + out->nentries] = (size_t)(b - s.data);
        snprintf(out->entries[out->nentries++], CP_KNAME_MAX, "%s", name);
    }
    if (out->nentries == 0) {
        snprintf(err, errlen, "templates/%s.cu: no extern \"C\" __global__ kernel", family);
        goto fail;
    }
    if (k->tag[0] && apply_tag(family, k->tag, &s, cuts, 1 + out->nentries, out, err, errlen)) goto fail;
    out->source = s.data;
    return 0;
fail:
    cp_str_free(&s);
    return -1;
}

int cp_emit(const cp_kernel_spec *k, cp_module_src *out, char *err, int errlen) {
    char name[96];
    snprintf(name, sizeof name, "templates/%s.cu", k->family);
    const cp_embedded_file *f = cp_embedded_find(name);
    if (!f) {
        snprintf(err, errlen, "no kernel template %s in this build; rebuild cpgen after adding it", name);
        return -1;
    }
    return cp_emit_text(k->family, f->text, k, out, err, errlen);
}

/* Two requests that emit the same name with different sources mean a template's module line leaves out a value that
 * changes the code: the runtime looks modules up by name, so that is an error. */
int cp_plan_emit(const cp_plan *plan, cp_module_src **out, char *err, int errlen) {
    cp_module_src *mods = cp_xcalloc((size_t)CP_MAX(plan->nmodules, 1), sizeof *mods);
    int n = 0;
    for (int i = 0; i < plan->nmodules; i++) {
        cp_module_src m;
        char e[2048];
        if (cp_emit(&plan->modules[i], &m, e, sizeof e) != 0) {
            snprintf(err, errlen, "emitting module %d of the plan (family %s): %s", i, plan->modules[i].family, e);
            goto fail;
        }
        int same = -1;
        for (int k = 0; k < n; k++)
            if (strcmp(mods[k].name, m.name) == 0) same = k;
        if (same >= 0) {
            bool identical = strcmp(mods[same].source, m.source) == 0;
            cp_module_src_free(&m);
            if (identical) continue;
            snprintf(err, errlen, "two different modules are named %s: the \"// module:\" line of templates/%s.cu "
                     "must include every placeholder that changes the code", mods[same].name, mods[same].family);
            goto fail;
        }
        mods[n++] = m;
    }
    *out = mods;
    return n;
fail:
    for (int k = 0; k < n; k++) cp_module_src_free(&mods[k]);
    free(mods);
    return -1;
}

void cp_module_srcs_free(cp_module_src *mods, int n) {
    for (int k = 0; k < n; k++) cp_module_src_free(&mods[k]);
    free(mods);
}
