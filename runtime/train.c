/* train.c: the training loop of `cpgen run` (see train.h). The executor (exec.c) does the work of a step; this file
 * feeds it weights and data (or a checkpoint's state, checkpoint.c), computes the schedule, saves checkpoints, and
 * reports: one line per logged step on stdout, every step in <out_dir>/metrics.jsonl. */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "ckpt_source.h"
#include "data.h"
#include "doc_inputs.h"
#include "eval.h"
#include "exec.h"
#include "json.h"
#include "outputs.h"
#include "report.h"
#include "resume.h"
#include "stop.h"
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

/* Save the checkpoint of step `step` (ckpt_async.h): the snapshot now, the files by the writer's thread while
 * training goes on (with several GPUs every rank takes part in the snapshot's gathers; the run's rank 0 writes). */
static int save(cp_saver *sv, const cp_plan *P, const cp_dataset *data, int step, int skipped, double last_loss,
                cp_save_info *info, char *err, int errlen) {
    cp_ckpt_state st;
    cp_ckpt_state_init(P, &st);
    st.step = step;
    st.skipped = skipped;
    st.last_loss = last_loss;
    cp_dataset_tell(data, &st.data);
    return cp_saver_save(sv, &st, info, err, errlen);
}

/* Writes that finished: their lines; one that failed: the run stops with its reason. */
static int saved(cp_saver *sv, FILE *out, cp_train_result *res, char *err, int errlen) {
    char line[1024];
    int rc = 0;
    while (sv && (rc = cp_saver_poll(sv, line, sizeof line, err, errlen)) > 0) {
        res->saves++;
        if (out) fprintf(out, "%s\n", line), fflush(out);
    }
    return sv && rc < 0 ? -1 : 0;
}

/* On resume: keep the metrics lines of steps up to `upto` (a crashed run may have logged steps after its last
 * checkpoint, which the resumed run logs again), so the file has each step once. */
static int metrics_keep(const char *path, int upto, char *err, int errlen) {
    size_t len;
    char why[256];
    char *text = cp_read_file_as(path, CP_FILE_METRICS, &len, why, sizeof why);
    if (!text)
        return errno == ENOENT ? 0 : cp_errf(err, errlen, "%s: cannot read: %s; move it away to resume", path, why);
    cp_str keep = {0};
    char e2[256];
    char *p = text, *line;
    size_t n;
    while (cp_next_line(&p, text + len, &line, &n)) {
        cp_json j;
        /* a line that does not parse is the torn last line of a crash: dropped */
        if (!cp_json_parse(line, n, &j, e2, sizeof e2)) {
            const cp_json *st = cp_json_get(&j, "step");
            if (st && st->type == CP_JSON_NUMBER && st->is_int && st->integer <= upto) {
                cp_str_append(&keep, line, n);
                cp_str_append(&keep, "\n", 1);
            }
        }
        cp_json_free(&j);
    }
    int rc = 0;
    if (cp_write_file_atomic(path, keep.data ? keep.data : "", keep.len) != 0)
        rc = cp_errf(err, errlen, "%s: rewriting failed: %s", path, strerror(errno));
    cp_str_free(&keep);
    free(text);
    return rc;
}

static int train(const cp_plan *P, const cp_train_opts *o, cp_exec *ex, const cp_ckpt *ck, cp_train_result *res,
                 char *err, int errlen) {
    const cp_spec *sp = &P->spec;
    const cp_train *tr = &sp->train;
    /* rank: within the group (its shard, its slice); lead: rank 0 of the run, the one that prints and writes */
    const int rank = o->rank, lead = o->world_rank == 0;
    cp_rank_layout layout = {P->replicas, P->ring, P->C};
    cp_rank_place place = cp_rank_of(&layout, o->world_rank);
    cp_data_slice slice = {.replica = place.replica, .replicas = P->replicas, .ring_pos = place.ring_pos,
                           .ring = P->ring, .rank = rank, .gpus = P->C};
    FILE *out = lead ? o->out : NULL;
    int mb = tr->micro_batches;
    int64_t T = P->T;

    int64_t n = cp_weights_elems(P);
    if (P->C == 1 && n != P->params_shard)
        return cp_errf(err, errlen, "the flat model has %lld elements, the plan's shard %lld: weights.c and the plan "
                     "disagree on the layout", (long long)n, (long long)P->params_shard);

    /* checkpoints: the snapshot's arrays start being made resident and pinned now, in the background, while the
     * weights load and the first steps run (the plan counts them beside the loading weights) */
    cp_ckpt_source *source = NULL;
    cp_saver *sv = NULL;
    int rc = 0;
    if (P->ckpt_snap != CP_SNAP_NONE) {
        cp_saver_opts so = {.plan = P, .out_dir = tr->out_dir, .writer = lead, .keep = tr->keep_checkpoints,
                            .resumed = ck ? ck->dir : NULL,
                            .async = tr->async_save && P->ckpt_snap != CP_SNAP_IN_PLACE};
        rc = cp_ckpt_source_open(&source, ex, P, lead, o->device, &so.src, err, errlen);
        if (!rc) rc = cp_saver_create(&sv, &so, err, errlen);
    }

    /* weights: the spec's init, through a full-model array that is freed once the executor has them (a rank of
     * several draws or reads its init shard by shard instead), or the checkpoint's, which cp_resume_load reads */
    bool full = P->C == 1 && !ck;
    float *flat = full ? cp_xmalloc(sizeof(float) * (size_t)n) : NULL;
    double t0 = cp_now();
    int start = ck ? ck->state.step : 0;
    if (!rc && ck) {
        rc = cp_resume_load(ex, P, ck, rank, o->resume_new_data, out, err, errlen);
    } else if (!rc && sp->init.from == CP_INIT_HF) {
        float *shard = flat ? NULL : cp_xmalloc(sizeof(float) * (size_t)P->params_shard);
        rc = flat ? cp_weights_load_hf(P, sp->init.path, flat, err, errlen)
                  : cp_weights_load_hf_shard(P, sp->init.path, rank, shard, err, errlen);
        if (!rc && out) fprintf(out, "weights: %s (Hugging Face) in %.1f s\n", sp->init.path, cp_now() - t0);
        if (!rc) rc = flat ? cp_exec_load_weights(ex, flat, err, errlen) : cp_exec_load_shard(ex, shard, err, errlen);
        free(shard);
    } else if (!rc) {
        if (flat) {
            cp_weights_init_random(P, sp->init.seed, sp->init.std, flat);
            rc = cp_exec_load_weights(ex, flat, err, errlen);
        } else {
            float *shard = cp_xmalloc(sizeof(float) * (size_t)P->params_shard);
            cp_weights_init_random_shard(P, rank, sp->init.seed, sp->init.std, shard);
            rc = cp_exec_load_shard(ex, shard, err, errlen);
            free(shard);
        }
        if (out) fprintf(out, "weights: random, seed %llu, std %g (%.2f s)\n", (unsigned long long)sp->init.seed,
                         sp->init.std, cp_now() - t0);
    }
    free(flat); /* the executor holds the model now; a checkpoint reads it back */
    flat = NULL;

    /* data (at the checkpoint's position) and the metrics file */
    cp_dataset data;
    bool data_open = false;
    if (!rc) {
        rc = cp_dataset_open(&data, sp, err, errlen);
        data_open = rc == 0;
    }
    if (!rc && ck) rc = cp_resume_seek(&data, P, ck, o->resume_new_data, out, err, errlen);
    cp_eval ev = {0}; /* the validation loss (eval.h) */
    if (!rc) rc = cp_eval_open(&ev, P, &slice, out, err, errlen);
    double chance = data_open ? cp_dataset_chance_loss(&data, sp->model.vocab) : log((double)sp->model.vocab);
    FILE *metrics = NULL;
    char mpath[CP_PATH_MAX + 32];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", tr->out_dir);
    if (!rc && lead) {
        if (cp_mkdir_p(tr->out_dir))
            rc = cp_errf(err, errlen, "%s: %s; set train.out_dir to a folder you can write", tr->out_dir, strerror(errno));
        else if (ck)
            rc = metrics_keep(mpath, start, err, errlen);
        if (!rc && !(metrics = fopen(mpath, ck ? "a" : "w")))
            rc = cp_errf(err, errlen, "%s: %s; set train.out_dir to a folder you can write", mpath, strerror(errno));
    }
    int32_t *tok = cp_xmalloc(sizeof(int32_t) * (size_t)(T * mb)), *tgt = cp_xmalloc(sizeof(int32_t) * (size_t)(T * mb));
    cp_doc_inputs docs;
    cp_doc_inputs_init(&docs, P);
    double *times = cp_xcalloc((size_t)CP_MAX(tr->steps, 1), sizeof(double));
    memset(res, 0, sizeof *res);
    res->losses = cp_xcalloc((size_t)CP_MAX(tr->steps, 1), sizeof(double));
    for (int i = 0; i < start && i < tr->steps; i++) res->losses[i] = NAN;
    res->first_step = res->steps = start;
    res->skipped = ck ? ck->state.skipped : 0;
    res->chance_loss = chance;
    res->mem_planned = P->gpu_peak;
    /* the host memory the largest rank adds: the writer's, with the checkpoint's snapshot */
    const int64_t host_planned = P->host_run + P->ckpt_snap_bytes;
    res->host_planned = host_planned;
    res->mem_arena_planned = P->gpu_arena;
    res->mem_arena_measured = cp_exec_startup_info(ex)->mem_arena;
    res->min_loss = INFINITY;
    double flops = P->flops_attn + P->flops_other, peak = sp->machine.peak_tflops;
    const int ranks = P->replicas * P->ring * P->C;
    const bool own = cp_plan_ranks_per_gpu(P) == 1 || cp_exec_startup_info(ex)->per_process;
    if (!rc && out) {
        char from[48] = "";
        if (start) snprintf(from, sizeof from, " (from step %d)", start + 1);
        fprintf(out, "training: %d steps%s of %d x %s tokens | data %s (chance loss %.3f) | metrics %s\n\n", tr->steps,
                from, mb, cp_fmt_count((double)P->S, (char[32]){0}, 32), sp->data.source, chance, mpath);
    }
    for (int step = start; step < tr->steps && !rc; step++) {
        int64_t targets_all = 0;
        for (int b = 0; b < mb && !rc; b++) {
            /* group g reads sequences g, g + R, ... of the stream; the loss is divided by every group's targets */
            rc = cp_dataset_next_slice(&data, &slice, tok + (size_t)b * T, tgt + (size_t)b * T, err, errlen);
            targets_all += data.targets_round;
            if (!rc) rc = cp_doc_inputs_add(&docs, P, &slice, &data, err, errlen);
        }
        if (!rc) rc = cp_doc_inputs_stage(&docs, ex, err, errlen);
        if (rc) break;
        cp_optim_hp hp = {.lr = cp_lr_at(tr, step), .beta1 = tr->beta1, .beta2 = tr->beta2, .eps = tr->eps,
                          .weight_decay = tr->weight_decay, .clip = tr->clip, .targets_all = targets_all};
        char label[64];
        snprintf(label, sizeof label, "step %d/%d", step + 1, tr->steps);
        cp_step_result r;
        rc = cp_exec_step(ex, tok, tgt, &hp, label, &r, err, errlen);
        cp_eval_result vr;
        if (!rc) rc = cp_eval_after(&ev, ex, step + 1, &vr, err, errlen);
        if (rc) break;
        res->losses[step] = r.loss;
        res->steps = step + 1;
        res->skipped += r.skipped;
        if (step == start) res->first_loss = r.loss;
        res->last_loss = r.loss;
        if (r.loss < res->min_loss) res->min_loss = r.loss;
        res->mem_measured = CP_MAX(res->mem_measured, r.mem_used);
        res->host_measured = CP_MAX(res->host_measured, r.host_used);
        if (out && step == start && r.mem_used > P->gpu_peak + P->gpu_peak / 33) {
            /* the arena is exact; what is outside it is the reserve's estimate */
            char a[32], b[32];
            fprintf(out, "warning: GPU memory measured %s, %.1f%% above the planned %s: the CUDA context, libraries%s "
                         "take more than machine.reserve%s; raise it so that the plan's limits hold\n",
                    cp_fmt_bytes(r.mem_used, a, sizeof a),
                    100.0 * (double)(r.mem_used - P->gpu_peak) / (double)P->gpu_peak,
                    cp_fmt_bytes(P->gpu_peak, b, sizeof b), ranks > 1 ? " and NCCL" : "",
                    ranks == 1 ? "" : cp_plan_ranks_per_gpu(P) > 1 ? " + machine.comm_reserve_shared"
                                                                   : " + machine.comm_reserve");
        }
        times[step] = r.seconds;
        if (r.stop) res->stopped = r.stop;
        /* a checkpoint every save_every steps, and of the step a stop comes after */
        cp_save_info si = {0};
        bool save_now = sv && ((step + 1) % tr->save_every == 0 || r.stop);
        if (save_now) {
            rc = save(sv, P, &data, step + 1, res->skipped, r.loss, &si, err, errlen);
            res->save_held_max = CP_MAX(res->save_held_max, si.held);
            if (rc) break;
        }
        double tps = (double)P->T * mb / r.seconds, tf = flops / r.seconds / 1e12;
        if (out && (step % tr->log_every == 0 || step + 1 == tr->steps || r.skipped || vr.done || save_now)) {
            char a[32], b[32], skip[64] = "", host[64] = "", val[64], note[256] = "", attn[64] = "";
            if (P->docs) /* the tiles the document-masked kernels computed, and the scores they kept */
                snprintf(attn, sizeof attn, " | attention %.1f%% of causal (%.1f%% kept)", 100 * docs.work,
                         100 * docs.kept);
            if (save_now) {
                note[0] = ' ', note[1] = '|', note[2] = ' ';
                cp_save_info_note(&si, r.seconds, note + 3, (int)sizeof note - 3);
            }
            if (P->host_arena)
                snprintf(host, sizeof host, " | host %.2f/%.2f GiB", (double)r.host_used / (1 << 30),
                         (double)host_planned / (1 << 30));
            if (r.skipped) snprintf(skip, sizeof skip, " | update skipped (%s, %d so far)",
                                    isfinite(r.loss) ? "non-finite norm" : "non-finite loss", res->skipped);
            fprintf(out, "step %d/%d | loss %.4f%s | norm %.2f | lr %.1e | %s | %s tok/s/GPU | %.*f TF/s | %.*f%% MFU%s | "
                         "mem %.2f/%.2f GiB%s (%s/planned)%s%s\n",
                    step + 1, tr->steps, r.loss, cp_eval_step_text(&vr, val, sizeof val), r.norm, hp.lr,
                    fmt_time(r.seconds, a, sizeof a),
                    cp_fmt_count(tps, b, sizeof b), tf < 100 ? 1 : 0, tf, 100 * tf / peak < 10 ? 1 : 0,
                    100 * tf / peak, attn, (double)r.mem_used / (1 << 30), (double)P->gpu_peak / (1 << 30), host,
                    ranks == 1 ? "measured" : own ? "largest rank measured" : "GPU measured, ranks sharing it", skip,
                    note);
            fflush(out);
        }
        if (metrics) {
            fprintf(metrics, "{\"step\":%d,", step + 1);
            json_num(metrics, "loss", r.loss, false);
            json_num(metrics, "norm", r.norm, false);
            json_num(metrics, "clip_scale", r.clip_scale, false);
            json_num(metrics, "lr", hp.lr, false);
            json_num(metrics, "seconds", r.seconds, false);
            json_num(metrics, "tokens_per_s", tps, false);
            json_num(metrics, "tflops", tf, false);
            json_num(metrics, "mfu", tf / peak, false);
            if (P->docs) {
                json_num(metrics, "attn_work", docs.work, false);
                json_num(metrics, "attn_kept", docs.kept, false);
            }
            fprintf(metrics, "\"targets\":%lld,\"mem_measured\":%lld,\"mem_planned\":%lld,\"host_measured\":%lld,"
                    "\"host_planned\":%lld,", (long long)r.targets, (long long)r.mem_used, (long long)P->gpu_peak,
                    (long long)r.host_used, (long long)host_planned);
            /* several ranks: mem_measured is the largest rank's, this the smallest's; where ranks share a GPU,
             * mem_own says whether the figures are each rank's own (else the whole GPU's) */
            if (ranks > 1) fprintf(metrics, "\"mem_measured_min\":%lld,", (long long)r.mem_least);
            if (cp_plan_ranks_per_gpu(P) > 1) fprintf(metrics, "\"mem_own\":%s,", own ? "true" : "false");
            cp_eval_metrics(metrics, &vr);
            /* a save: how long it held the loop, of which waiting for the previous write; a step whose update
             * waited for a snapshot still being copied: how long */
            if (save_now)
                fprintf(metrics, "\"ckpt\":%d,\"ckpt_held\":%.6f,\"ckpt_waited\":%.6f,", step + 1, si.held,
                        si.waited);
            if (r.snap_wait > 0) fprintf(metrics, "\"snapshot_wait\":%.6f,", r.snap_wait);
            fprintf(metrics, "\"skipped\":%s}\n", r.skipped ? "true" : "false");
            fflush(metrics);
        }
        if (!rc) rc = saved(sv, out, res, err, errlen);
        if (res->stopped) break;
    }
    int ran = res->steps - start;
    if (ran > 0) {
        int k = CP_MIN(10, ran);
        double s = 0;
        for (int i = res->steps - k; i < res->steps; i++) s += res->losses[i];
        res->mean_last10 = s / k;
        int from = ran > 1 ? start + 1 : start, m = res->steps - from;
        qsort(times + from, (size_t)m, sizeof(double), cmp_double);
        res->step_seconds = times[from + m / 2];
        res->tokens_per_s = (double)P->T * mb / res->step_seconds;
        res->tflops = flops / res->step_seconds / 1e12;
        res->mfu = res->tflops / peak;
    }
    if (!rc && out && ran > 0) {
        char a[32], b[32], c[32], d[32], from[48] = "", val[64];
        if (start) snprintf(from, sizeof from, " (resumed after step %d)", start);
        fprintf(out, "\ndone: %d steps%s | loss %.4f -> %.4f (mean of the last %d %.4f; chance %.3f)%s | %d skipped | "
                     "median step %s, %s tok/s/GPU, %.1f TF/s, %.1f%% MFU | peak memory %s measured, %s planned\n",
                ran, from, res->first_loss, res->last_loss, CP_MIN(10, ran), res->mean_last10, chance,
                cp_eval_done_text(&ev, val, sizeof val),
                res->skipped, fmt_time(res->step_seconds, a, sizeof a), cp_fmt_count(res->tokens_per_s, b, sizeof b),
                res->tflops, 100 * res->mfu, cp_fmt_bytes(res->mem_measured, c, sizeof c),
                cp_fmt_bytes(res->mem_planned, d, sizeof d));
        fprintf(out, "host memory: %s measured (resident growth since the executor started), %s planned (arena + "
                     "runtime); process peak %s measured, %s planned\n", cp_fmt_bytes(res->host_measured, a, sizeof a),
                cp_fmt_bytes(res->host_planned, b, sizeof b), cp_fmt_bytes(cp_proc_status_bytes("VmHWM"), c, sizeof c),
                cp_fmt_bytes(P->host_peak, d, sizeof d));
    }
    if (!rc && sv && ran > 0 && res->steps % tr->save_every != 0 && !res->stopped) {
        cp_save_info si;
        rc = save(sv, P, &data, res->steps, res->skipped, res->last_loss, &si, err, errlen);
        if (!rc && out) {
            char note[256];
            cp_save_info_note(&si, res->step_seconds, note, sizeof note);
            fprintf(out, "%s\n", note);
        }
    }
    /* the last write: the run ends once it is on disk */
    if (sv && lead) {
        int busy = cp_saver_busy(sv);
        if (busy && out) fprintf(out, "waiting for ckpt_%d to be written\n", busy), fflush(out);
        double waited = cp_saver_wait(sv);
        char e2[CP_ERR_MAX];
        if (saved(sv, out, res, e2, sizeof e2)) {
            if (!rc) rc = cp_errf(err, errlen, "%s", e2);
            else if (out) fprintf(out, "also: %s\n", e2);
        }
        if (busy && out) fprintf(out, "the run waited %.1f s for ckpt_%d\n", waited, busy);
    }
    if (!rc && res->stopped && out) {
        char sig[32];
        cp_stop_signame(res->stopped, sig, sizeof sig);
        if (sv)
            fprintf(out, "stopped by %s after step %d: saved ckpt_%d; continue with --resume %s\n", sig, res->steps,
                    res->steps, tr->out_dir);
        else
            fprintf(out, "stopped by %s after step %d: no checkpoint (train.save_every = 0), so a new run starts "
                         "from step 1\n", sig, res->steps);
        fflush(out);
    }
    cp_saver_destroy(sv);
    cp_ckpt_source_close(source);
    /* a metrics line that could not be written (a full disk) fails the run: its record is incomplete */
    if (metrics && (ferror(metrics) | (fclose(metrics) != 0)) && !rc)
        rc = cp_errf(err, errlen, "writing %s failed (a full disk?): every step ran and was saved as the spec says, "
                     "but this record of them is incomplete; free space before the next run", mpath);
    if (!rc && metrics && lead) { /* the run's picture; a failure to draw it does not fail the run */
        char why[CP_ERR_MAX];
        if (cp_report_write(tr->out_dir, why, sizeof why) < 0) fprintf(out, "report: %s\n", why);
        else fprintf(out, "report: %s/report.svg%s%s\n", tr->out_dir, *why ? "; " : "", why);
    }
    if (data_open) cp_dataset_close(&data);
    cp_eval_close(&ev);
    free(tok);
    cp_doc_inputs_free(&docs);
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
    eo.bundle = o->bundle;
    eo.no_cache = o->no_cache;
    eo.out = o->world_rank == 0 ? o->out : NULL;
    eo.rank = o->rank;
    eo.world_rank = o->world_rank;
    eo.device = o->device;
    eo.comm = o->comm;
    eo.shard_comm = o->shard_comm;
    eo.world_comm = o->world_comm;
    eo.ring_comm = o->ring_comm;
    eo.base_free = o->base_free;
    /* the trace is of the first group: the others run the same steps, and their part files would share its names */
    eo.trace_path = o->world_rank < P->C ? o->trace_path : NULL;
    eo.trace_step = o->trace_step;
    eo.stop_request = o->stop_request;
    /* a checkpoint is checked before the GPU is set up, so a wrong one costs no compile time */
    cp_ckpt ck;
    if (o->resume && cp_ckpt_open(P, o->resume, &ck, err, errlen)) return -1;
    /* and the data it would go on with: the same stream on any layout, else only when asked for */
    if (o->resume && cp_resume_check(P, &ck.state, ck.dir, o->resume_new_data, err, errlen)) {
        cp_ckpt_close(&ck);
        return -1;
    }
    /* and what the run writes: only over cpgen's own files, found now rather than at the first save */
    if (o->world_rank == 0 && cp_run_outputs_check(&P->spec, o->trace_path, err, errlen)) {
        if (o->resume) cp_ckpt_close(&ck);
        return -1;
    }
    cp_exec *ex;
    if (cp_exec_create(&ex, P, &eo, err, errlen)) {
        if (o->resume) cp_ckpt_close(&ck);
        return -1;
    }
    int rc = train(P, o, ex, o->resume ? &ck : NULL, res, err, errlen);
    cp_exec_destroy(ex);
    if (o->resume) cp_ckpt_close(&ck);
    if (res == &local) cp_train_result_free(&local);
    return rc;
}
