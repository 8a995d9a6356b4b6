/* tune.c: the candidates of `cpgen tune` (see tune.h): axes, enumeration and planning, ranking, and the table,
 * tune.jsonl, tune.svg and tuned.lua written from them. */
#include "tune.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "json.h"
#include "spec_write.h"
#include "svg.h"
#include "util.h"

#define MAX_CANDIDATES 4096

static cp_tune_axis *add_axis(cp_tune_axes *ax, const char *key) {
    for (int a = 0; a < ax->naxes; a++)
        if (!strcmp(ax->axes[a].key, key)) {
            ax->axes[a].nvalues = 0;
            return &ax->axes[a];
        }
    if (ax->naxes == CP_TUNE_MAX_AXES) return NULL;
    cp_tune_axis *x = &ax->axes[ax->naxes++];
    memset(x, 0, sizeof *x);
    snprintf(x->key, sizeof x->key, "%s", key);
    return x;
}

static void add_value(cp_tune_axis *x, const char *v) {
    if (x->nvalues < CP_TUNE_MAX_VALUES) snprintf(x->values[x->nvalues++], CP_TUNE_VALUE_MAX, "%s", v);
}

/* "auto" and the tiles of `sizes` that divide the tokens per GPU and are not the automatic choice already. */
static void tile_axis(cp_tune_axes *ax, const char *key, int64_t T, int64_t auto_tile, const int64_t *sizes, int n) {
    cp_tune_axis *x = add_axis(ax, key);
    add_value(x, "auto");
    for (int i = 0; i < n; i++) {
        char v[32];
        if (sizes[i] <= T && T % sizes[i] == 0 && sizes[i] != auto_tile) add_value(x, cp_fmt_length(sizes[i], v, sizeof v));
    }
}

void cp_tune_default_axes(const cp_spec *spec, cp_tune_axes *ax) {
    memset(ax, 0, sizeof *ax);
    int64_t us[CP_MAX_STAGE_HEADS];
    int nu = cp_spec_upipe_values(spec, us, CP_MAX_STAGE_HEADS);
    cp_tune_axis *x = add_axis(ax, "parallel.upipe_heads");
    for (int i = 0; i < nu; i++) {
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)us[i]);
        add_value(x, v);
    }
    int64_t T = spec->train.seq_len / CP_MAX(1, spec->parallel.gpus);
    /* the planner's first automatic tiles (plan.c): up to 4K tokens, the loss's logits up to 512 MiB; "auto" then
     * grows the MLP's into the memory left, and a size that resolves to the same plan is measured once (same_plan) */
    int64_t mlp_auto = 1, loss_auto = 1, loss_cap = CP_MAX((int64_t)1, ((int64_t)512 << 20) / (spec->model.vocab * 2));
    for (int64_t d = 1; d <= CP_MIN(T, 4096); d++)
        if (T % d == 0) mlp_auto = d;
    for (int64_t d = 1; d <= CP_MIN(T, CP_MIN(loss_cap, 4096)); d++)
        if (T % d == 0) loss_auto = d;
    const int64_t mlp[] = {8192, 16384}, loss[] = {4096};
    tile_axis(ax, "parallel.mlp_tile", T, mlp_auto, mlp, 2);
    tile_axis(ax, "parallel.loss_tile", T, loss_auto, loss, 1);
    x = add_axis(ax, "parallel.checkpoint_every");
    add_value(x, "auto");
    add_value(x, "1");
    x = add_axis(ax, "parallel.optimizer");
    add_value(x, "auto");
    add_value(x, "host");
    x = add_axis(ax, "parallel.attention_output");
    add_value(x, "auto");
    add_value(x, "recompute");
}

/* Load the spec with sets and then extra (may be NULL); 0, or -1 with the loader's message. */
static int load_with(const char *path, const char *const *sets, int nsets, const char *const *extra, int nextra,
                     cp_spec *out, char *err, int errlen) {
    const char **all = cp_xcalloc((size_t)(nsets + nextra + 1), sizeof *all);
    for (int i = 0; i < nsets; i++) all[i] = sets[i];
    for (int i = 0; i < nextra; i++) all[nsets + i] = extra[i];
    int rc = cp_spec_load(path, all, nsets + nextra, out, err, errlen);
    if (!rc) rc = cp_data_resolve_documents(out, err, errlen); /* as the command line resolves the input */
    free(all);
    return rc;
}

int cp_tune_sweep(cp_tune_axes *ax, const char *arg, const char *path, const char *const *sets, int nsets, char *err,
                  int errlen) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg || !eq[1])
        return cp_errf(err, errlen, "--sweep %s: expected KEY=V1,V2,..., e.g. --sweep parallel.upipe_heads=4,8,24", arg);
    char key[64];
    if ((size_t)(eq - arg) >= sizeof key) return cp_errf(err, errlen, "--sweep %s: key path too long", arg);
    snprintf(key, sizeof key, "%.*s", (int)(eq - arg), arg);
    cp_tune_axes saved = *ax;
    cp_tune_axis *x = add_axis(ax, key);
    if (!x) return cp_errf(err, errlen, "--sweep %s: at most %d axes", arg, CP_TUNE_MAX_AXES);
    for (const char *p = eq + 1; *p;) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= CP_TUNE_VALUE_MAX) {
            *ax = saved;
            return cp_errf(err, errlen, "--sweep %s: empty or overlong value (values are separated by commas)", arg);
        }
        if (x->nvalues == CP_TUNE_MAX_VALUES) {
            *ax = saved;
            return cp_errf(err, errlen, "--sweep %s: at most %d values per axis", arg, CP_TUNE_MAX_VALUES);
        }
        snprintf(x->values[x->nvalues], CP_TUNE_VALUE_MAX, "%.*s", (int)len, p);
        char set[160];
        snprintf(set, sizeof set, "%s=%s", key, x->values[x->nvalues]);
        const char *one[] = {set};
        cp_spec s;
        char why[CP_ERR_MAX];
        if (load_with(path, sets, nsets, one, 1, &s, why, sizeof why)) {
            *ax = saved;
            return cp_errf(err, errlen, "--sweep %s: %s", arg, why);
        }
        x->nvalues++;
        p += len + (p[len] == ',');
    }
    return 0;
}

void cp_tune_set_text(const cp_tune *t, int i, int a, char *out, size_t n) {
    snprintf(out, n, "%s=%s", t->axes.axes[a].key, t->c[i].values[a]);
}

char **cp_tune_candidate_sets(const cp_tune *t, int i, const char *const *sets, int nsets, const char *const *extra,
                              int nextra, int *n) {
    char **all = cp_xcalloc((size_t)(nsets + t->axes.naxes + nextra + 1), sizeof *all);
    int k = 0;
    for (int s = 0; s < nsets; s++) all[k++] = cp_xstrdup(sets[s]);
    for (int a = 0; a < t->axes.naxes; a++) {
        char set[160];
        cp_tune_set_text(t, i, a, set, sizeof set);
        all[k++] = cp_xstrdup(set);
    }
    for (int e = 0; e < nextra; e++) all[k++] = cp_xstrdup(extra[e]);
    *n = k;
    return all;
}

void cp_tune_sets_free(char **sets, int n) {
    for (int i = 0; i < n; i++) free(sets[i]);
    free(sets);
}

static bool same_plan(const cp_tune_cand *a, const cp_tune_cand *b) {
    return a->U == b->U && a->mlp_tile == b->mlp_tile && a->loss_tile == b->loss_tile && a->ckpt_every == b->ckpt_every &&
           a->ckpt_host_layers == b->ckpt_host_layers && a->attn_host_layers == b->attn_host_layers &&
           a->attn_gpu_layers == b->attn_gpu_layers && a->opt_on_host == b->opt_on_host && a->C == b->C &&
           a->S == b->S && a->layers == b->layers && a->gpu_peak == b->gpu_peak && a->t_plan == b->t_plan;
}

int cp_tune_plan(cp_tune *t, const cp_tune_axes *ax, const char *path, const char *const *sets, int nsets, char *err,
                 int errlen) {
    memset(t, 0, sizeof *t);
    t->axes = *ax;
    long total = 1;
    for (int a = 0; a < ax->naxes; a++) {
        total *= CP_MAX(1, ax->axes[a].nvalues);
        if (total > MAX_CANDIDATES)
            return cp_errf(err, errlen, "the axes make more than %d candidates: sweep fewer values (--sweep KEY=V1,V2 "
                           "replaces an axis's values)", MAX_CANDIDATES);
    }
    t->n = (int)total;
    t->c = cp_xcalloc((size_t)t->n, sizeof *t->c);
    t->order = cp_xcalloc((size_t)t->n, sizeof *t->order);
    for (int i = 0; i < t->n; i++) {
        cp_tune_cand *c = &t->c[i];
        c->same_as = -1;
        int rest = i;
        for (int a = ax->naxes - 1; a >= 0; a--) { /* the first axis varies slowest */
            int nv = CP_MAX(1, ax->axes[a].nvalues);
            snprintf(c->values[a], CP_TUNE_VALUE_MAX, "%s", ax->axes[a].values[rest % nv]);
            rest /= nv;
        }
        int ncand;
        char **cand = cp_tune_candidate_sets(t, i, sets, nsets, NULL, 0, &ncand);
        cp_spec spec;
        char why[CP_ERR_MAX];
        int rc = cp_spec_load(path, (const char *const *)cand, ncand, &spec, why, sizeof why);
        if (!rc) rc = cp_data_resolve_documents(&spec, why, sizeof why);
        cp_tune_sets_free(cand, ncand);
        if (rc) {
            snprintf(c->why, sizeof c->why, "%s", why);
            continue;
        }
        cp_plan P;
        if (cp_plan_build_folded(&spec, &P, why, sizeof why)) { /* figures only: no step is walked */
            snprintf(c->why, sizeof c->why, "%s", why);
            continue;
        }
        c->fits = P.fits;
        if (!P.fits) snprintf(c->why, sizeof c->why, "does not fit: %s", P.why);
        c->U = P.U;
        c->C = P.C;
        c->S = P.S;
        c->layers = (int)spec.model.layers;
        c->tokens = P.group_tokens * spec.train.micro_batches;
        c->mlp_tile = P.mlp_tile;
        c->loss_tile = P.loss_tile;
        c->ckpt_every = P.ckpt_every;
        c->ckpt_host_layers = P.ckpt_host_layers;
        c->attn_host_layers = P.attn_host_layers;
        c->attn_gpu_layers = P.attn_gpu_layers;
        c->opt_on_host = P.opt_on_host;
        c->t_plan = c->t_full = P.t_step;
        c->gpu_peak = P.gpu_peak;
        c->host_peak = P.host_peak;
        c->layer_fraction = cp_tune_layer_fraction(&P);
        cp_plan_free(&P);
        for (int k = 0; k < i && c->fits; k++)
            if (t->c[k].fits && t->c[k].same_as < 0 && same_plan(&t->c[k], c)) {
                c->same_as = k;
                break;
            }
    }
    cp_tune_rank(t);
    return 0;
}

void cp_tune_add_kernel(cp_tune *t, const cp_ktune_entry *e) {
    int at = t->nkern;
    for (int k = 0; k < t->nkern; k++)
        if (!strcmp(t->kern[k].kernel, e->kernel) && !strcmp(t->kern[k].shape, e->shape)) at = k;
    if (at == CP_TUNE_MAX_KERNELS) return;
    t->kern[at] = *e;
    if (at == t->nkern) t->nkern++;
}

static const cp_tune *sort_ctx;
static int by_time(const void *x, const void *y) {
    const cp_tune_cand *a = &sort_ctx->c[*(const int *)x], *b = &sort_ctx->c[*(const int *)y];
    if (a->measured != b->measured) return a->measured ? -1 : 1;
    if (a->t_full != b->t_full) return a->t_full < b->t_full ? -1 : 1;
    return *(const int *)x - *(const int *)y;
}

void cp_tune_rank(cp_tune *t) {
    t->nranked = 0;
    for (int i = 0; i < t->n; i++) {
        t->c[i].rank = 0;
        if (t->c[i].fits && t->c[i].same_as < 0) t->order[t->nranked++] = i;
    }
    sort_ctx = t;
    qsort(t->order, (size_t)t->nranked, sizeof *t->order, by_time);
    for (int r = 0; r < t->nranked; r++) t->c[t->order[r]].rank = r + 1;
}

void cp_tune_free(cp_tune *t) {
    free(t->c);
    free(t->order);
    memset(t, 0, sizeof *t);
}

/* ---------------------------------------------------------------- the table */

static const char *short_key(const char *key) {
    const char *dot = strrchr(key, '.');
    return dot ? dot + 1 : key;
}

static double gib(int64_t b) { return (double)b / (1024.0 * 1024 * 1024); }

void cp_tune_print(const cp_tune *t, FILE *out, int max) {
    const cp_tune_axes *ax = &t->axes;
    int w[CP_TUNE_MAX_AXES];
    fprintf(out, "%4s", "rank");
    for (int a = 0; a < ax->naxes; a++) {
        w[a] = (int)strlen(short_key(ax->axes[a].key));
        for (int v = 0; v < ax->axes[a].nvalues; v++) w[a] = CP_MAX(w[a], (int)strlen(ax->axes[a].values[v]));
        fprintf(out, "  %*s", w[a], short_key(ax->axes[a].key));
    }
    fprintf(out, "  %10s  %10s  %15s  %9s  %9s  %9s\n", "GPU plan", "host plan", "L-layer GiB", "s/layer", "step (s)",
            "tok/s/GPU");
    int shown = 0;
    for (int r = 0; r < t->nranked && shown < max; r++, shown++) {
        const cp_tune_cand *c = &t->c[t->order[r]];
        fprintf(out, "%4d", c->rank);
        for (int a = 0; a < ax->naxes; a++) fprintf(out, "  %*s", w[a], c->values[a]);
        char meas[48] = "-", layer[32] = "-", tps[32];
        if (c->measured) { /* the truncated model's peak, measured/planned */
            snprintf(meas, sizeof meas, "%.2f/%.2f", gib(c->measured_peak), gib(c->measured_plan_peak));
            snprintf(layer, sizeof layer, "%.3f", c->per_layer);
        }
        cp_fmt_count((double)c->tokens / c->C / c->t_full, tps, sizeof tps);
        fprintf(out, "  %6.2f GiB  %6.2f GiB  %15s  %9s  %9.3f  %9s  %s\n", gib(c->gpu_peak), gib(c->host_peak), meas,
                layer, c->t_full, tps, c->measured ? "measured" : "planned");
        if (c->note[0]) fprintf(out, "      %s\n", c->note);
    }
    if (t->nranked > shown) fprintf(out, "... %d more candidates in tune.jsonl\n", t->nranked - shown);
    int dup = 0, skipped = 0;
    for (int i = 0; i < t->n; i++) {
        dup += t->c[i].fits && t->c[i].same_as >= 0;
        skipped += !t->c[i].fits;
    }
    if (dup) fprintf(out, "%d candidates plan the same as a ranked one (an \"auto\" resolving to a value also swept)\n", dup);
    if (skipped) fprintf(out, "%d skipped, not run:\n", skipped);
    for (int i = 0, k = 0; i < t->n; i++) {
        if (t->c[i].fits) continue;
        if (++k > max) {
            fprintf(out, "  ... %d more skipped in tune.jsonl\n", skipped - max);
            break;
        }
        fprintf(out, "  ");
        for (int a = 0; a < ax->naxes; a++) fprintf(out, "%s=%s ", short_key(ax->axes[a].key), t->c[i].values[a]);
        fprintf(out, "\n      %s\n", t->c[i].why);
    }
    if (t->nkern || t->kern_note[0])
        fprintf(out, "\nkernel variants, timed on this GPU (the winners go to the kernel tuning cache):\n");
    for (int k = 0; k < t->nkern; k++) cp_ktune_entry_print(out, &t->kern[k]);
    if (t->kern_note[0]) fprintf(out, "  %s\n", t->kern_note);
}

/* ---------------------------------------------------------------- tune.jsonl */

int cp_tune_write_jsonl(const cp_tune *t, const char *path, char *err, int errlen) {
    cp_str s = {0};
    for (int i = 0; i < t->n; i++) {
        const cp_tune_cand *c = &t->c[i];
        cp_str_printf(&s, "{\"candidate\":%d,\"rank\":%d,\"values\":{", i, c->rank);
        for (int a = 0; a < t->axes.naxes; a++) {
            if (a) cp_str_append(&s, ",", 1);
            cp_json_put_string(&s, t->axes.axes[a].key);
            cp_str_append(&s, ":", 1);
            cp_json_put_string(&s, c->values[a]);
        }
        cp_str_printf(&s, "},\"fits\":%s", c->fits ? "true" : "false");
        if (!c->fits) {
            cp_str_printf(&s, ",\"skipped\":");
            cp_json_put_string(&s, c->why);
        } else {
            if (c->same_as >= 0) cp_str_printf(&s, ",\"same_plan_as\":%d", c->same_as);
            cp_str_printf(&s, ",\"plan\":{\"upipe_heads\":%d,\"mlp_tile\":%lld,\"loss_tile\":%lld,\"checkpoint_every\":%d,"
                          "\"checkpoints_on_host\":%d,\"attention_kept_host\":%d,\"attention_kept_gpu\":%d,"
                          "\"optimizer\":\"%s\",\"gpus\":%d,\"seq_len\":%lld,\"layers\":%d,\"gpu_peak\":%lld,"
                          "\"host_peak\":%lld,\"step_seconds\":", c->U, (long long)c->mlp_tile, (long long)c->loss_tile,
                          c->ckpt_every, c->ckpt_host_layers, c->attn_host_layers, c->attn_gpu_layers,
                          c->opt_on_host ? "host" : "gpu", c->C, (long long)c->S, c->layers, (long long)c->gpu_peak,
                          (long long)c->host_peak);
            cp_json_put_number(&s, c->t_plan);
            cp_str_printf(&s, ",\"layer_fraction\":");
            cp_json_put_number(&s, c->layer_fraction);
            cp_str_printf(&s, "},\"measured\":%s", c->measured ? "true" : "false");
            if (c->measured) {
                cp_str_printf(&s, ",\"measured_layers\":%d,\"measured_step_seconds\":", c->measured_layers);
                cp_json_put_number(&s, c->measured_step);
                cp_str_printf(&s, ",\"seconds_per_layer\":");
                cp_json_put_number(&s, c->per_layer);
                cp_str_printf(&s, ",\"measured_gpu_peak\":%lld,\"measured_plan_gpu_peak\":%lld", (long long)c->measured_peak,
                              (long long)c->measured_plan_peak);
            }
            cp_str_printf(&s, ",\"step_seconds\":");
            cp_json_put_number(&s, c->t_full);
            cp_str_printf(&s, ",\"tokens_per_s_per_gpu\":");
            cp_json_put_number(&s, (double)c->tokens / c->C / c->t_full);
            if (c->note[0]) {
                cp_str_printf(&s, ",\"note\":");
                cp_json_put_string(&s, c->note);
            }
        }
        cp_str_printf(&s, "}\n");
    }
    for (int k = 0; k < t->nkern; k++) {
        cp_ktune_entry_json(&s, &t->kern[k]);
        cp_str_printf(&s, "\n");
    }
    int rc = cp_write_file_atomic(path, s.data ? s.data : "", s.len);
    cp_str_free(&s);
    if (rc) return cp_errf(err, errlen, "cannot write %s (%s)", path, strerror(errno));
    return 0;
}

double cp_tune_layer_fraction(const cp_plan *P) {
    double in_layers = 0, all = 0;
    for (int s = 0; s < P->nsteps; s++) { /* a folded plan's loop body once per tile */
        double t = P->steps[s].seconds * (double)cp_plan_step_repeats(P, s);
        all += t;
        if (P->steps[s].layer >= 0) in_layers += t;
    }
    return all > 0 ? in_layers / all : 1;
}

/* ---------------------------------------------------------------- tune.svg */

#define SVG_SERIES 8

int cp_tune_svg(const cp_tune *t, const char *path, char *err, int errlen) {
    if (t->nranked == 0) return cp_errf(err, errlen, "no candidate fits, so there is nothing to draw in %s", path);
    int ua = -1; /* the U axis is the x axis; the others name the lines */
    for (int a = 0; a < t->axes.naxes; a++)
        if (!strcmp(t->axes.axes[a].key, "parallel.upipe_heads")) ua = a;
    /* lines: the distinct combinations of the other axes, best first (the order is by time) */
    int group[SVG_SERIES], ng = 0, more = 0;
    for (int r = 0; r < t->nranked; r++) {
        const cp_tune_cand *c = &t->c[t->order[r]];
        bool seen = false;
        for (int g = 0; g < ng && !seen; g++) {
            const cp_tune_cand *d = &t->c[group[g]];
            seen = true;
            for (int a = 0; a < t->axes.naxes; a++)
                if (a != ua && strcmp(c->values[a], d->values[a])) seen = false;
        }
        if (seen) continue;
        if (ng < SVG_SERIES) group[ng++] = t->order[r];
        else more++;
    }
    double x0 = 1e300, x1 = -1e300, tmax = 0, mmax = 0;
    for (int r = 0; r < t->nranked; r++) {
        const cp_tune_cand *c = &t->c[t->order[r]];
        x0 = fmin(x0, c->U);
        x1 = fmax(x1, c->U);
        tmax = fmax(tmax, c->t_full);
        mmax = fmax(mmax, gib(c->gpu_peak));
    }
    if (x1 <= x0) x0 -= 1, x1 += 1;
    const cp_tune_cand *win = &t->c[t->order[0]];
    cp_svg s;
    char title[256];
    snprintf(title, sizeof title, "cpgen tune: %d candidates, %d fit; winner U=%d, %.3f s per step (%s)", t->n,
             t->nranked, win->U, win->t_full, win->measured ? "measured" : "planned");
    if (cp_svg_begin(&s, path, 1100, 500 + 13 * SVG_SERIES + 30, title, err, errlen)) return -1;
    cp_svg_panel pt = {70, 60, 400, 360, x0, x1, 0, tmax * 1.1};
    cp_svg_panel pm = {560, 60, 400, 360, x0, x1, 0, mmax * 1.1};
    const char *colors[SVG_SERIES] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
    for (int p = 0; p < 2; p++) {
        const cp_svg_panel *pp = p ? &pm : &pt;
        /* memory as planned at full depth: a measurement ran a truncated model, whose peak the table and tune.jsonl
         * set against its own plan */
        cp_svg_panel_begin(&s, pp, p ? "memory" : "time", p ? "peak GPU memory per GPU (plan, full depth)" : "step time, full depth",
                           "UPipe chunk size U (heads per stage)", p ? "GiB" : "seconds");
        for (int g = 0; g < ng; g++) {
            const cp_tune_cand *head = &t->c[group[g]];
            double xs[CP_TUNE_MAX_VALUES * 4], ys[CP_TUNE_MAX_VALUES * 4];
            int n = 0;
            for (int u = (int)x0; u <= (int)x1 && n < (int)CP_ARRAY_LEN(xs); u++)
                for (int r = 0; r < t->nranked; r++) { /* the best of the group at this U */
                    const cp_tune_cand *c = &t->c[t->order[r]];
                    bool same = c->U == u;
                    for (int a = 0; a < t->axes.naxes && same; a++)
                        if (a != ua && strcmp(c->values[a], head->values[a])) same = false;
                    if (!same) continue;
                    xs[n] = u;
                    ys[n++] = p ? gib(c->gpu_peak) : c->t_full;
                    break;
                }
            cp_str name = {0};
            for (int a = 0; a < t->axes.naxes; a++)
                if (a != ua) cp_str_printf(&name, "%s%s=%s", name.len ? " " : "", short_key(t->axes.axes[a].key),
                                           head->values[a]);
            cp_svg_series(&s, pp, xs, ys, n, colors[g], name.data ? name.data : "all");
            if (p == 0) cp_svg_legend(&s, 70, 490 + 13 * g, colors[g], name.data ? name.data : "all");
            cp_str_free(&name);
        }
        double wy = p ? gib(win->gpu_peak) : win->t_full;
        fprintf(s.f, "<circle %s cx=\"%.1f\" cy=\"%.1f\" r=\"7\" fill=\"none\" stroke=\"black\" stroke-width=\"2\"/>\n",
                p ? "class=\"winner\"" : "id=\"winner\" class=\"winner\"", cp_svg_px(pp, win->U), cp_svg_py(pp, wy));
        cp_svg_text(&s, cp_svg_px(pp, win->U) + 10, cp_svg_py(pp, wy) - 10, "start", 11, "black", "winner");
        cp_svg_panel_end(&s);
    }
    if (more)
        cp_svg_text(&s, 70, 490 + 13 * ng + 6, "start", 11, "#555", "%d more combinations of the other axes in tune.jsonl",
                    more);
    return cp_svg_end(&s, err, errlen);
}

/* ---------------------------------------------------------------- tuned.lua */

/* Whether v is a Lua numeral that reads the same as code and through tonumber (what --set does with it): digits
 * with an optional minus, point and exponent, or a hexadecimal integer. */
static bool plain_numeral(const char *v) {
    const char *p = v + (*v == '-');
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        p += 2;
        if (!isxdigit((unsigned char)*p)) return false;
        while (isxdigit((unsigned char)*p)) p++;
        return !*p;
    }
    int digits = 0;
    while (isdigit((unsigned char)*p)) p++, digits++;
    if (*p == '.') p++;
    while (isdigit((unsigned char)*p)) p++, digits++;
    if (!digits) return false;
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!isdigit((unsigned char)*p)) return false;
        while (isdigit((unsigned char)*p)) p++;
    }
    return !*p;
}

/* A --set value as Lua, meaning what --set makes of it: a boolean or a plain number as it is, a string quoted, and
 * anything else that Lua might read as a number (" 8", "0x1p3") through tonumber, which is the conversion --set
 * uses. Never the text itself as code: a value is data. */
static void lua_value(cp_str *o, const char *v) {
    if (!strcmp(v, "true") || !strcmp(v, "false") || plain_numeral(v)) {
        cp_str_printf(o, "%s", v);
        return;
    }
    bool numberish = *v && strspn(v, "0123456789abcdefABCDEFxXpP.+- \t\n\v\f\r") == strlen(v);
    if (numberish) {
        cp_str_printf(o, "tonumber(");
        cp_lua_put_string(o, v);
        cp_str_printf(o, ") or ");
    }
    cp_lua_put_string(o, v);
}

/* { a = { b = VALUE } } for the key path "a.b"; a segment that is not a plain name is written as ["..."] */
static void lua_override(cp_str *o, const char *set) {
    const char *eq = strchr(set, '=');
    int depth = 0;
    cp_str_printf(o, "  ");
    for (const char *p = set; p < eq;) {
        size_t len = strcspn(p, ".=");
        bool name = len > 0 && (isalpha((unsigned char)p[0]) || p[0] == '_');
        for (size_t k = 0; k < len; k++) name &= isalnum((unsigned char)p[k]) || p[k] == '_';
        if (name) {
            cp_str_printf(o, "{ %.*s = ", (int)len, p);
        } else {
            char *seg = cp_xstrdup(p);
            seg[len] = 0;
            cp_str_printf(o, "{ [");
            cp_lua_put_string(o, seg);
            cp_str_printf(o, "] = ");
            free(seg);
        }
        depth++;
        p += len + (p[len] == '.');
    }
    lua_value(o, eq + 1);
    for (int d = 0; d < depth; d++) cp_str_printf(o, " }");
}

int cp_tune_write_lua(const cp_tune *t, const char *path, const cp_spec *input, const char *const *sets, int nsets,
                      char *err, int errlen) {
    if (t->nranked == 0) return cp_errf(err, errlen, "no candidate fits: %s is not written", path);
    const cp_tune_cand *w = &t->c[t->order[0]];
    cp_str o = {0};
    char base[PATH_MAX + 8];
    bool shipped = !strncmp(input->path, "<embedded>/", 11);
    if (shipped) snprintf(base, sizeof base, "%s", input->name);
    else if (!realpath(input->path, base)) snprintf(base, sizeof base, "%s", input->path);
    /* file names and --set values are the user's: written through the Lua writers, never as they are */
    cp_str_printf(&o, "-- tuned.lua: ");
    cp_lua_put_comment(&o, input->path);
    cp_str_printf(&o, " with the winner of cpgen tune (%d candidates, %d distinct plans that fit): %.3f s per step, "
                  "%s.\n-- Run it with: cpgen run ", t->n, t->nranked, w->t_full,
                  w->measured ? "measured and extrapolated to full depth" : "predicted by the plan");
    cp_lua_put_comment(&o, path);
    cp_str_printf(&o, "\nreturn cpgen.extend(cpgen.load(");
    cp_lua_put_string(&o, base);
    cp_str_printf(&o, "),\n");
    /* a spec's runs go to runs/<its file name> unless it says otherwise: keep the input's */
    cp_str_printf(&o, "  { train = { out_dir = ");
    cp_lua_put_string(&o, input->train.out_dir);
    cp_str_printf(&o, " } }, -- the input's train.out_dir\n");
    for (int i = 0; i < nsets; i++) {
        lua_override(&o, sets[i]);
        cp_str_printf(&o, ", -- --set ");
        cp_lua_put_comment(&o, sets[i]);
        cp_str_printf(&o, "\n");
    }
    for (int a = 0; a < t->axes.naxes; a++) {
        char set[160];
        cp_tune_set_text(t, t->order[0], a, set, sizeof set);
        lua_override(&o, set);
        cp_str_printf(&o, "%s -- tuned\n", a + 1 < t->axes.naxes ? "," : "");
    }
    cp_str_printf(&o, ")\n");
    int rc = cp_write_file_atomic(path, o.data, o.len);
    cp_str_free(&o);
    if (rc) return cp_errf(err, errlen, "cannot write %s (%s)", path, strerror(errno));
    return 0;
}

double cp_tune_parse_budget(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v > 0) || !isfinite(v)) return -1;
    double unit = !strcmp(end, "") || !strcmp(end, "s") ? 1 : !strcmp(end, "m") || !strcmp(end, "min") ? 60
                  : !strcmp(end, "h") ? 3600 : -1;
    /* past 30 days is a slip (1e308h is infinite, and a deadline of infinity never comes) */
    return unit > 0 && v * unit <= 30 * 86400.0 ? v * unit : -1;
}
