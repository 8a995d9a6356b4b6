/* train.c: the training loop of `cpgen run` (see train.h). The executor (exec.c) does the work of a step; this file
 * feeds it weights and data, computes the schedule, and reports: one line per logged step on stdout, every step in
 * <out_dir>/metrics.jsonl. */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "exec.h"
#include "util.h"
#include "weights.h"

double cp_lr_at(const cp_train *t, int step) {
    if (step < t->warmup) return t->lr * (double)step / (double)CP_MAX(1, t->warmup);
    double progress = (double)(step - t->warmup) / (double)CP_MAX(1, t->steps - t->warmup);
    double floor = t->lr > 0 ? t->min_lr / t->lr : 0;
    double f = 0.5 * (1.0 + cos(M_PI * CP_MIN(1.0, progress)));
    return t->lr * (f * (1.0 - floor) + floor);
}

void cp_train_result_free(cp_train_result *r) {
    if (!r) return;
    free(r->losses);
    r->losses = NULL;
}

static const char *fmt_time(double s, char *buf, size_t n) {
    if (s < 1.0) snprintf(buf, n, "%.1f ms", s * 1e3);
    else if (s < 600) snprintf(buf, n, "%.2f s", s);
    else snprintf(buf, n, "%.1f min", s / 60);
    return buf;
}

/* A JSON number, or null for NaN and infinities (which JSON lacks). */
static void json_num(FILE *f, const char *key, double v, bool last) {
    if (isfinite(v)) fprintf(f, "\"%s\":%.9g%s", key, v, last ? "" : ",");
    else fprintf(f, "\"%s\":null%s", key, last ? "" : ",");
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Save the model as a Hugging Face checkpoint in <out_dir>/step_<n>. */
static int save(cp_exec *ex, const cp_plan *P, float *flat, int step, FILE *out, char *err, int errlen) {
    char dir[CP_PATH_MAX + 32];
    snprintf(dir, sizeof dir, "%s/step_%d", P->spec.train.out_dir, step);
    if (cp_exec_read_weights(ex, flat, err, errlen)) return -1;
    double t0 = cp_now();
    if (cp_weights_save_hf(P, flat, dir, true, 0, err, errlen)) return -1;
    if (out) fprintf(out, "saved %s (Hugging Face safetensors, bf16) in %.1f s\n", dir, cp_now() - t0);
    return 0;
}

static int train(const cp_plan *P, const cp_train_opts *o, cp_exec *ex, cp_train_result *res, char *err, int errlen) {
    const cp_spec *sp = &P->spec;
    const cp_train *tr = &sp->train;
    FILE *out = o->out;
    int mb = tr->micro_batches;
    int64_t T = P->T;

    /* weights */
    int64_t n = cp_weights_elems(P);
    if (n != P->params_shard)
        return cp_errf(err, errlen, "the flat model has %lld elements, the plan's shard %lld: weights.c and the plan "
                     "disagree on the layout", (long long)n, (long long)P->params_shard);
    float *flat = cp_xmalloc(sizeof(float) * (size_t)n);
    double t0 = cp_now();
    int rc = 0;
    if (sp->init.from == CP_INIT_HF) {
        rc = cp_weights_load_hf(P, sp->init.path, flat, err, errlen);
        if (!rc && out) fprintf(out, "weights: %s (Hugging Face) in %.1f s\n", sp->init.path, cp_now() - t0);
    } else {
        cp_weights_init_random(P, sp->init.seed, sp->init.std, flat);
        if (out) fprintf(out, "weights: random, seed %llu, std %g (%.2f s)\n", (unsigned long long)sp->init.seed,
                         sp->init.std, cp_now() - t0);
    }
    if (!rc) rc = cp_exec_load_weights(ex, flat, err, errlen);

    /* data and the metrics file */
    cp_dataset data;
    bool data_open = false;
    if (!rc) {
        rc = cp_dataset_open(&data, sp, err, errlen);
        data_open = rc == 0;
    }
    double chance = log((double)sp->model.vocab);
    if (data_open && data.synthetic) chance = cp_recall_chance_loss(&data.recall);
    FILE *metrics = NULL;
    char mpath[CP_PATH_MAX + 32];
    if (!rc) {
        snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", tr->out_dir);
        if (cp_mkdir_p(tr->out_dir) || !(metrics = fopen(mpath, "w")))
            rc = cp_errf(err, errlen, "%s: %s; set train.out_dir to a folder you can write", mpath, strerror(errno));
    }
    int32_t *tok = cp_xmalloc(sizeof(int32_t) * (size_t)(T * mb)), *tgt = cp_xmalloc(sizeof(int32_t) * (size_t)(T * mb));
    double *times = cp_xcalloc((size_t)CP_MAX(tr->steps, 1), sizeof(double));
    memset(res, 0, sizeof *res);
    res->losses = cp_xcalloc((size_t)CP_MAX(tr->steps, 1), sizeof(double));
    res->chance_loss = chance;
    res->mem_planned = P->gpu_peak;
    res->mem_arena_planned = P->gpu_arena;
    res->mem_arena_measured = cp_exec_startup_info(ex)->mem_arena;
    res->min_loss = INFINITY;
    double flops = P->flops_attn + P->flops_other, peak = sp->machine.gemm_tflops;
    if (!rc && out)
        fprintf(out, "training: %d steps of %d x %s tokens | data %s (chance loss %.3f) | metrics %s\n\n", tr->steps,
                mb, cp_fmt_count((double)P->S, (char[32]){0}, 32), sp->data.source, chance, mpath);
    for (int step = 0; step < tr->steps && !rc; step++) {
        for (int b = 0; b < mb && !rc; b++)
            rc = cp_dataset_next(&data, 0, 1, tok + (size_t)b * T, tgt + (size_t)b * T, err, errlen);
        if (rc) break;
        cp_optim_hp hp = {.lr = cp_lr_at(tr, step), .beta1 = tr->beta1, .beta2 = tr->beta2, .eps = tr->eps,
                          .weight_decay = tr->weight_decay, .clip = tr->clip};
        char label[64];
        snprintf(label, sizeof label, "step %d/%d", step + 1, tr->steps);
        cp_step_result r;
        rc = cp_exec_step(ex, tok, tgt, &hp, label, &r, err, errlen);
        if (rc) break;
        res->losses[step] = r.loss;
        res->steps = step + 1;
        res->skipped += r.skipped;
        if (step == 0) res->first_loss = r.loss;
        res->last_loss = r.loss;
        if (r.loss < res->min_loss) res->min_loss = r.loss;
        res->mem_measured = CP_MAX(res->mem_measured, r.mem_used);
        times[step] = r.seconds;
        double tps = (double)P->T * mb / r.seconds, tf = flops / r.seconds / 1e12;
        if (out && (step % tr->log_every == 0 || step + 1 == tr->steps || r.skipped)) {
            char a[32], b[32], skip[64] = "";
            if (r.skipped) snprintf(skip, sizeof skip, " | update skipped (%s, %d so far)",
                                    isfinite(r.loss) ? "non-finite norm" : "non-finite loss", res->skipped);
            fprintf(out, "step %d/%d | loss %.4f | norm %.2f | lr %.1e | %s | %s tok/s/GPU | %.*f TF/s | %.*f%% MFU | "
                         "mem %.2f/%.2f GiB (measured/planned)%s\n",
                    step + 1, tr->steps, r.loss, r.norm, hp.lr, fmt_time(r.seconds, a, sizeof a),
                    cp_fmt_count(tps, b, sizeof b), tf < 100 ? 1 : 0, tf, 100 * tf / peak < 10 ? 1 : 0,
                    100 * tf / peak, (double)r.mem_used / (1 << 30), (double)P->gpu_peak / (1 << 30), skip);
            fflush(out);
        }
        fprintf(metrics, "{\"step\":%d,", step + 1);
        json_num(metrics, "loss", r.loss, false);
        json_num(metrics, "norm", r.norm, false);
        json_num(metrics, "clip_scale", r.clip_scale, false);
        json_num(metrics, "lr", hp.lr, false);
        json_num(metrics, "seconds", r.seconds, false);
        json_num(metrics, "tokens_per_s", tps, false);
        json_num(metrics, "tflops", tf, false);
        json_num(metrics, "mfu", tf / peak, false);
        fprintf(metrics, "\"targets\":%lld,\"mem_measured\":%lld,\"mem_planned\":%lld,\"skipped\":%s}\n",
                (long long)r.targets, (long long)r.mem_used, (long long)P->gpu_peak, r.skipped ? "true" : "false");
        fflush(metrics);
        if (tr->save_every > 0 && (step + 1) % tr->save_every == 0) rc = save(ex, P, flat, step + 1, out, err, errlen);
    }
    if (res->steps > 0) {
        int k = CP_MIN(10, res->steps);
        double s = 0;
        for (int i = res->steps - k; i < res->steps; i++) s += res->losses[i];
        res->mean_last10 = s / k;
        int from = res->steps > 1 ? 1 : 0, m = res->steps - from;
        qsort(times + from, (size_t)m, sizeof(double), cmp_double);
        res->step_seconds = times[from + m / 2];
        res->tokens_per_s = (double)P->T * mb / res->step_seconds;
        res->tflops = flops / res->step_seconds / 1e12;
        res->mfu = res->tflops / peak;
    }
    if (!rc && out && res->steps > 0) {
        char a[32], b[32], c[32], d[32];
        fprintf(out, "\ndone: %d steps | loss %.4f -> %.4f (mean of the last %d %.4f; chance %.3f) | %d skipped | "
                     "median step %s, %s tok/s/GPU, %.1f TF/s, %.1f%% MFU | peak memory %s measured, %s planned\n",
                res->steps, res->first_loss, res->last_loss, CP_MIN(10, res->steps), res->mean_last10, chance,
                res->skipped, fmt_time(res->step_seconds, a, sizeof a), cp_fmt_count(res->tokens_per_s, b, sizeof b),
                res->tflops, 100 * res->mfu, cp_fmt_bytes(res->mem_measured, c, sizeof c),
                cp_fmt_bytes(res->mem_planned, d, sizeof d));
    }
    if (!rc && tr->save_every > 0 && res->steps % tr->save_every != 0) rc = save(ex, P, flat, res->steps, out, err, errlen);
    if (metrics) fclose(metrics);
    if (data_open) cp_dataset_close(&data);
    free(tok);
    free(tgt);
    free(times);
    free(flat);
    return rc;
}

int cp_train_run(const cp_plan *P, const cp_train_opts *o, cp_train_result *res, char *err, int errlen) {
    cp_train_opts dflt = {.out = stdout};
    if (!o) o = &dflt;
    cp_train_result local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    cp_exec_opts eo;
    memset(&eo, 0, sizeof eo);
    snprintf(eo.arch, sizeof eo.arch, "%s", o->arch);
    eo.no_cache = o->no_cache;
    eo.out = o->out;
    cp_exec *ex;
    if (cp_exec_create(&ex, P, &eo, err, errlen)) return -1;
    int rc = train(P, o, ex, res, err, errlen);
    cp_exec_destroy(ex);
    if (res == &local) cp_train_result_free(&local);
    return rc;
}
