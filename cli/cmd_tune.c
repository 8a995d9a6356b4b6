/* cmd_tune.c: `cpgen tune`: plan every candidate (gen/tune.c), measure the fitting ones on the GPU in order of
 * predicted time until the budget is spent, rank, and write the table, tune.jsonl, tune.svg and tuned.lua.
 *
 * Kernel variants (kernels.h cp_kvariants) are timed first, for the plan's likeliest winner, by a child `cpgen
 * tune-kernels` of its spec, which records the fastest in the kernel tuning cache; every later child run takes them
 * from there, so the measurements already run the tuned kernels. Where the measured winner's attention has other
 * shapes (another U), its kernels are timed as well at the end, within the budget.
 *
 * A measurement is a child `cpgen run` of the candidate's spec truncated to L layers at the full sequence length, for
 * a few steps: the child starts as many ranks as the plan has GPUs, exactly as a run would, and gives back its GPU
 * memory when it exits. Its median step is set against the L-layer plan's prediction, and that ratio scales the
 * full-depth plan's step: the extrapolation uses the plan's own per-layer costs. */
#include "commands.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "data.h"
#include "json.h"
#include "module.h"
#include "svg.h"
#include "tune.h"
#include "util.h"

#define STEPS 3            /* the first warms up; the median of the others is the step */
#define STEPS_SET "train.steps=3"
#define STARTUP_GUESS 20.0 /* seconds a child spends before its first step (cached kernels, pinning, weights) */
#define KERNELS_MIN 60.0   /* seconds kernel timing may take at least (compiling each variant, cold), budget allowing */

/* The next line of [*p, end) that is a JSON value, parsed into j (free it); false at the end. */
static bool next_json_line(char **p, char *end, cp_json *j) {
    char *line, e[128];
    size_t n;
    while (cp_next_line(p, end, &line, &n))
        if (n && !cp_json_parse(line, n, j, e, sizeof e)) return true;
    return false;
}

/* The median step time and the largest measured GPU memory in a run's metrics.jsonl; -1 with why. */
static int read_metrics(const char *path, double *step, int64_t *peak, char *why, int whylen) {
    size_t len;
    char e[256];
    char *text = cp_read_file_as(path, CP_FILE_METRICS, &len, e, sizeof e);
    if (!text) return cp_errf(why, whylen, "no %s (%s)", path, e);
    double secs[64];
    int n = 0;
    *peak = 0;
    cp_json o;
    for (char *p = text; next_json_line(&p, text + len, &o);) {
        const cp_json *s = cp_json_get(&o, "seconds"), *m = cp_json_get(&o, "mem_measured");
        if (s && s->type == CP_JSON_NUMBER && n < 64) secs[n++] = s->number;
        if (m && m->type == CP_JSON_NUMBER) *peak = CP_MAX(*peak, (int64_t)m->number);
        cp_json_free(&o);
    }
    free(text);
    if (n == 0) return cp_errf(why, whylen, "%s holds no step", path);
    int first = n > 1 ? 1 : 0; /* the first step warms up */
    for (int i = first; i < n; i++) /* insertion sort of the few steps */
        for (int k = i; k > first && secs[k] < secs[k - 1]; k--) {
            double x = secs[k];
            secs[k] = secs[k - 1];
            secs[k - 1] = x;
        }
    *step = secs[first + (n - first) / 2];
    return 0;
}

#define LOG_HEAD "cpgen tune: the output of one measurement\n"
static bool log_ours(const char *head, size_t n, const void *ctx) {
    (void)ctx;
    return n >= strlen(LOG_HEAD) && !memcmp(head, LOG_HEAD, strlen(LOG_HEAD));
}

/* Run argv as a child in its own process group with output to log, which starts with LOG_HEAD so that a later tune
 * knows it for its own; the child's exit status, -1 when it ran past deadline (then the whole group is stopped), -2
 * when it could not start, -3 (why says it) when log is a file cpgen did not write. */
static int run_child(char **argv, const char *log, double deadline, char *why, int whylen) {
    if (cp_may_replace(log, log_ours, NULL, "a log of cpgen tune", "move it away, or give tune another -o", why,
                       whylen))
        return -3;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -2;
    if (pid == 0) {
        setpgid(0, 0);
        FILE *f = freopen(log, "w", stdout);
        if (!f || dup2(fileno(stdout), 2) < 0 || fputs(LOG_HEAD, f) < 0 || fflush(f)) _exit(127);
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    setpgid(pid, pid);
    for (;;) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        if (r < 0 && errno != EINTR) return -2;
        if (cp_now() > deadline) {
            kill(-pid, SIGTERM);
            struct timespec ts = {2, 0};
            nanosleep(&ts, NULL);
            kill(-pid, SIGKILL);
            (void)waitpid(pid, &st, 0);
            return -1;
        }
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* The argv of a child `cpgen COMMAND SPEC --set S...` then tail: NULL-terminated, its strings borrowed (free the
 * array alone). */
static char **child_argv(const char *command, const char *spec, char **sets, int nsets, const char *const *tail,
                         int ntail) {
    char **argv = cp_xcalloc((size_t)(2 * nsets + ntail + 4), sizeof *argv);
    int k = 0;
    argv[k++] = "cpgen";
    argv[k++] = (char *)command;
    argv[k++] = (char *)spec;
    for (int s = 0; s < nsets; s++) {
        argv[k++] = "--set";
        argv[k++] = sets[s];
    }
    for (int s = 0; s < ntail; s++) argv[k++] = (char *)tail[s];
    return argv;
}

/* Time the kernel variants of candidate i's plan in a child `cpgen tune-kernels` with at most `seconds` of wall time:
 * the child keeps the winners in the kernel tuning cache, and its DIR/kernels.jsonl comes into t. */
static void time_kernels(cp_tune *t, int i, const cp_tune_opts *o, double seconds, FILE *out) {
    char dir[CP_PATH_MAX + 64], log[CP_PATH_MAX + 80], path[CP_PATH_MAX + 96];
    snprintf(dir, sizeof dir, "%s/kernels/c%04d", o->outdir, i);
    snprintf(log, sizeof log, "%s/kernels/c%04d.log", o->outdir, i);
    snprintf(path, sizeof path, "%s/kernels.jsonl", dir);
    int nsets;
    char **sets = cp_tune_candidate_sets(t, i, o->sets, o->nsets, NULL, 0, &nsets);
    const char *tail[] = {"-o", dir};
    char **argv = child_argv("tune-kernels", o->spec_arg, sets, nsets, tail, 2);
    (void)cp_mkdir_p(dir);
    fprintf(out, "timing the kernel variants of candidate %d (U=%d): ", i, t->c[i].U);
    fflush(out);
    double t0 = cp_now();
    char why[CP_ERR_MAX];
    int rc = run_child(argv, log, t0 + seconds, why, sizeof why);
    free(argv);
    cp_tune_sets_free(sets, nsets);
    size_t len = 0;
    char *text = rc ? NULL : cp_read_file_as(path, CP_FILE_CACHE, &len, NULL, 0);
    const size_t nn = sizeof t->kern_note;
    if (rc == -3) snprintf(t->kern_note, nn, "kernel variants not timed: %.200s", why);
    else if (rc == -1) snprintf(t->kern_note, nn, "kernel variants not timed: ran past %.0f s; log %s", seconds, log);
    else if (rc) snprintf(t->kern_note, nn, "kernel variants not timed: cpgen tune-kernels failed (exit %d); log %s", rc, log);
    else if (!text) snprintf(t->kern_note, nn, "kernel variants not timed: no kernels.jsonl came back; log %s", log);
    if (!text) {
        fprintf(out, "%s\n", t->kern_note);
        return;
    }
    int shapes = 0;
    cp_json j;
    for (char *p = text; next_json_line(&p, text + len, &j);) {
        cp_ktune_entry e;
        char why[256];
        if (!cp_ktune_entry_parse(&j, &e, why, sizeof why)) {
            cp_tune_add_kernel(t, &e);
            fprintf(out, "%s%s %s -> %s %d", shapes++ ? "; " : "", e.kernel, e.shape, e.param, e.winner);
        }
        cp_json_free(&j);
    }
    free(text);
    fprintf(out, "%s in %.0f s\n", shapes ? "" : "no kernel with variants runs on this GPU", cp_now() - t0);
}

/* Measure candidate i with at most `seconds` of wall time. */
static void measure(cp_tune *t, int i, const cp_tune_opts *o, double seconds, FILE *out) {
    cp_tune_cand *c = &t->c[i];
    /* as many layers as the time allows at the plan's per-layer cost, at least one */
    double per_layer_plan = c->t_plan * c->layer_fraction / c->layers;
    int L = (int)floor((seconds - STARTUP_GUESS - c->t_plan * (1 - c->layer_fraction) * STEPS) / (STEPS * per_layer_plan));
    L = CP_MAX(1, CP_MIN(L, c->layers));
    char dir[CP_PATH_MAX + 64], log[CP_PATH_MAX + 80], lset[48], dset[CP_PATH_MAX + 96], metrics[CP_PATH_MAX + 96];
    snprintf(dir, sizeof dir, "%s/measure/c%04d", o->outdir, i);
    snprintf(log, sizeof log, "%s/measure/c%04d.log", o->outdir, i);
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", dir);
    snprintf(lset, sizeof lset, "model.layers=%d", L);
    snprintf(dset, sizeof dset, "train.out_dir=%s", dir);
    /* a measurement times steps: no checkpoints, and no evaluations to spend the budget on */
    const char *extra[] = {lset, STEPS_SET, "train.warmup=0", "train.log_every=1",
                           "train.save_every=0", "train.eval_every=0", dset};
    int nsets;
    char **sets = cp_tune_candidate_sets(t, i, o->sets, o->nsets, extra, (int)CP_ARRAY_LEN(extra), &nsets);
    /* the L-layer plan's prediction, to set the measurement against */
    cp_spec spec;
    cp_plan P;
    char why[CP_ERR_MAX];
    if (cp_spec_load(o->spec_arg, (const char *const *)sets, nsets, &spec, why, sizeof why) ||
        cp_data_resolve_documents(&spec, why, sizeof why) || cp_plan_build_folded(&spec, &P, why, sizeof why)) { /* figures only */
        snprintf(c->note, sizeof c->note, "not measured: the %d-layer spec does not plan (%.150s)", L, why);
        cp_tune_sets_free(sets, nsets);
        return;
    }
    double t_trunc = P.t_step, trunc_layer_fraction = cp_tune_layer_fraction(&P);
    c->measured_plan_peak = P.gpu_peak;
    cp_plan_free(&P);
    char **argv = child_argv("run", o->spec_arg, sets, nsets, NULL, 0);
    (void)cp_mkdir_p(dir);
    fprintf(out, "measuring %d/%d (candidate %d, %d of %d layers, %d steps): ", c->rank, t->nranked, i, L, c->layers,
            STEPS);
    fflush(out);
    double t0 = cp_now();
    int rc = run_child(argv, log, t0 + seconds, why, sizeof why);
    double took = cp_now() - t0;
    if (rc == -3) snprintf(c->note, sizeof c->note, "not measured: %.200s", why);
    else if (rc == -1) snprintf(c->note, sizeof c->note, "not measured: ran past its %.0f s; log %s", seconds, log);
    else if (rc != 0) snprintf(c->note, sizeof c->note, "not measured: cpgen run failed (exit %d); log %s", rc, log);
    else if (read_metrics(metrics, &c->measured_step, &c->measured_peak, why, sizeof why))
        snprintf(c->note, sizeof c->note, "not measured: %.150s; log %s", why, log);
    else {
        c->measured = true;
        c->measured_layers = L;
        c->t_full = c->measured_step / t_trunc * c->t_plan;
        c->per_layer = c->measured_step * trunc_layer_fraction / L;
    }
    if (c->measured)
        fprintf(out, "%.3f s per %d-layer step (plan %.3f s) -> %.3f s at full depth; peak %.2f GiB (plan %.2f); %.0f s\n",
                c->measured_step, L, t_trunc, c->t_full, (double)c->measured_peak / (1 << 30),
                (double)c->measured_plan_peak / (1 << 30), took);
    else fprintf(out, "%s\n", c->note);
    free(argv);
    cp_tune_sets_free(sets, nsets);
}

static bool starts(const char *head, size_t n, const char *prefix) {
    size_t l = strlen(prefix);
    return n >= l && !memcmp(head, prefix, l);
}
static bool jsonl_ours(const char *head, size_t n, const void *ctx) {
    (void)ctx;
    return starts(head, n, "{\"candidate\":");
}
static bool lua_ours(const char *head, size_t n, const void *ctx) {
    (void)ctx;
    return starts(head, n, "-- tuned.lua: ");
}

/* Whether tune.jsonl, tune.svg and tuned.lua may be written into outdir: each absent or one an earlier cpgen tune
 * wrote, and tuned.lua not the spec being tuned (a tuned.lua tuned again would be replaced by a spec that loads
 * itself). Checked before minutes of measuring, not after. */
static int check_outputs(const cp_spec *spec, const char *outdir, char *err, int errlen) {
    struct stat st;
    if (stat(outdir, &st) == 0 && !S_ISDIR(st.st_mode))
        return cp_errf(err, errlen, "-o %s: not a folder; give -o a folder for tune.jsonl, tune.svg and tuned.lua",
                       outdir);
    char path[CP_PATH_MAX + 32];
    const char *fix = "give another -o, or move it away";
    snprintf(path, sizeof path, "%s/tuned.lua", outdir);
    if (cp_same_file(path, spec->path))
        return cp_errf(err, errlen, "%s is the spec being tuned: the result would replace it; give another -o", path);
    if (cp_may_replace(path, lua_ours, NULL, "a tuned.lua of cpgen tune", fix, err, errlen)) return -1;
    snprintf(path, sizeof path, "%s/tune.jsonl", outdir);
    if (cp_may_replace(path, jsonl_ours, NULL, "a tune.jsonl of cpgen tune", fix, err, errlen)) return -1;
    snprintf(path, sizeof path, "%s/tune.svg", outdir);
    return cp_may_replace(path, cp_svg_is_ours, NULL, "a picture cpgen drew", fix, err, errlen);
}

int cp_cmd_tune(const cp_spec *spec, const cp_tune_opts *o, FILE *out, char *err, int errlen) {
    /* the output folder first: a path that cannot be written must not cost the measurements' minutes, nor be cut
     * short in the paths below (a cut path names another file), nor hold files cpgen did not write */
    if (strlen(o->outdir) >= CP_PATH_MAX) {
        cp_errf(err, errlen, "-o %.80s...: the folder's path is longer than %d bytes", o->outdir, CP_PATH_MAX - 1);
        return CP_EXIT_USAGE;
    }
    if (check_outputs(spec, o->outdir, err, errlen)) return CP_EXIT_USAGE;
    if (cp_mkdir_p(o->outdir)) {
        cp_errf(err, errlen, "cannot create %s (%s); give another -o DIR", o->outdir, strerror(errno));
        return CP_EXIT_USAGE;
    }
    cp_tune_axes ax;
    cp_tune_default_axes(spec, &ax);
    for (int i = 0; i < o->nsweeps; i++)
        if (cp_tune_sweep(&ax, o->sweeps[i], o->spec_arg, o->sets, o->nsets, err, errlen)) return CP_EXIT_USAGE;
    double t0 = cp_now();
    cp_tune t;
    if (cp_tune_plan(&t, &ax, o->spec_arg, o->sets, o->nsets, err, errlen)) return CP_EXIT_USAGE;
    int dup = 0;
    for (int i = 0; i < t.n; i++) dup += t.c[i].fits && t.c[i].same_as >= 0;
    fprintf(out, "cpgen tune %s: %d candidates over", spec->path, t.n);
    for (int a = 0; a < ax.naxes; a++) fprintf(out, "%s %s (%d)", a ? "," : "", ax.axes[a].key, ax.axes[a].nvalues);
    fprintf(out, "\nplanned in %.1f s: %d fit (%d distinct plans), %d skipped\n\n", cp_now() - t0, t.nranked + dup,
            t.nranked, t.n - t.nranked - dup);
    if (t.nranked == 0) {
        cp_tune_print(&t, out, 40);
        cp_tune_free(&t);
        cp_errf(err, errlen, "no candidate fits the machine: more GPUs (--gpus), a shorter --seq, or other --sweep values");
        return CP_EXIT_USAGE;
    }
    char why[256];
    int gpus = o->plan_only ? 0 : cp_gpu_count(why, sizeof why);
    if (o->plan_only) {
        fprintf(out, "--plan-only: candidates ranked by the plan's predicted step; nothing was measured and no kernel "
                "variant timed\n\n");
    } else if (gpus <= 0) {
        fprintf(out, "no GPU found (%s): candidates ranked by the plan's predicted step; nothing was measured, and kernel "
                "timing was skipped: the kernel tuning cache is unchanged (run cpgen tune on the GPU machine to "
                "measure)\n\n", why);
    } else {
        double deadline = t0 + o->budget;
        /* the likeliest winner's kernels first, so that every measurement of its shapes runs the tuned ones */
        const int first = t.order[0];
        time_kernels(&t, first, o, CP_MIN(deadline - cp_now(), CP_MAX(KERNELS_MIN, o->budget / 4)), out);
        int done = 0;
        for (int r = 0; r < t.nranked; r++) {
            cp_tune_cand *c = &t.c[t.order[r]];
            double left = deadline - cp_now();
            int to_go = t.nranked - r;
            /* an equal share of what is left, but the first ones (the likeliest winners) may take more */
            double share = CP_MAX(left / CP_MIN(to_go, 4), left / to_go);
            if (left < STARTUP_GUESS + 5) {
                for (int k = r; k < t.nranked; k++)
                    snprintf(t.c[t.order[k]].note, sizeof t.c[0].note, "not measured: the --budget of %.0f s was spent",
                             o->budget);
                fprintf(out, "budget spent: %d of %d candidates not measured (ranked by the plan below them)\n",
                        t.nranked - r, t.nranked);
                break;
            }
            measure(&t, t.order[r], o, CP_MIN(share, left), out);
            done += c->measured;
        }
        cp_tune_rank(&t);
        /* the winner's kernels as well where its attention has other shapes than those timed */
        const cp_tune_cand *w = &t.c[t.order[0]], *f = &t.c[first];
        if (w->U != f->U || w->C != f->C || w->S != f->S) {
            if (deadline - cp_now() > STARTUP_GUESS) time_kernels(&t, t.order[0], o, deadline - cp_now(), out);
            else snprintf(t.kern_note, sizeof t.kern_note, "the winner's kernel variants (U=%d) were not timed: the "
                          "--budget was spent; cpgen tune-kernels with the winner's values (tuned.lua) times them", w->U);
        }
        fprintf(out, "measured %d candidates in %.0f s of a %.0f s budget\n\n", done, cp_now() - t0, o->budget);
    }
    cp_tune_print(&t, out, 40);
    int rc = 0;
    char path[CP_PATH_MAX + 32];
    if (cp_mkdir_p(o->outdir))
        rc = cp_errf(err, errlen, "cannot create %s (%s); give -o a folder you can write", o->outdir, strerror(errno));
    else rc = check_outputs(spec, o->outdir, err, errlen); /* again: the measurements took minutes */
    snprintf(path, sizeof path, "%s/tune.jsonl", o->outdir);
    if (!rc) rc = cp_tune_write_jsonl(&t, path, err, errlen);
    snprintf(path, sizeof path, "%s/tune.svg", o->outdir);
    if (!rc) rc = cp_tune_svg(&t, path, err, errlen);
    snprintf(path, sizeof path, "%s/tuned.lua", o->outdir);
    if (!rc) rc = cp_tune_write_lua(&t, path, spec, o->sets, o->nsets, err, errlen);
    if (!rc) {
        const cp_tune_cand *w = &t.c[t.order[0]];
        fprintf(out, "\nwinner:");
        for (int a = 0; a < ax.naxes; a++) fprintf(out, " %s=%s", ax.axes[a].key, w->values[a]);
        fprintf(out, "\n  %.3f s per step (%s), U=%d, peak %.2f GiB per GPU planned\nwrote %s/tune.jsonl, %s/tune.svg, "
                "%s/tuned.lua; train with it: cpgen run %s/tuned.lua\n", w->t_full,
                w->measured ? "measured" : "planned", w->U, (double)w->gpu_peak / (1 << 30), o->outdir, o->outdir,
                o->outdir, o->outdir);
        if (t.nkern) {
            cp_ktune_path(NULL, path, sizeof path);
            fprintf(out, "the fastest kernel variants are in the kernel tuning cache %s, where run and aot take them "
                    "on this machine\n", path);
        }
    }
    cp_tune_free(&t);
    return rc ? CP_EXIT_FAIL : 0;
}
