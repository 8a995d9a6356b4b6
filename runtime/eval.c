/* eval.c: the validation loss during `cpgen run` (eval.h): when it runs, the held-out sequences it reads, the sum
 * over the run's ranks and groups, and what the step line, metrics.jsonl and the end of the run say of it. */
#include "eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

int cp_eval_open(cp_eval *ev, const cp_plan *P, const cp_data_slice *slice, FILE *out, char *err, int errlen) {
    memset(ev, 0, sizeof *ev);
    const cp_spec *sp = &P->spec;
    ev->every = sp->train.eval_every;
    ev->steps = sp->train.steps;
    if (ev->every <= 0) return 0;
    /* spec.c makes eval_sequences a multiple of the replicas; the groups then evaluate equal shares */
    if (sp->train.eval_sequences % P->replicas)
        return cp_errf(err, errlen, "train.eval_sequences = %d is not a multiple of parallel.replicas = %d (a cpgen "
                       "bug: the spec check refuses it)", sp->train.eval_sequences, P->replicas);
    if (cp_dataset_open_val(&ev->data, sp, err, errlen)) return -1;
    ev->on = true;
    ev->rounds = sp->train.eval_sequences / P->replicas;
    ev->mb = sp->train.micro_batches;
    ev->T = P->T;
    ev->slice = *slice;
    ev->tok = cp_xmalloc(sizeof(int32_t) * (size_t)(ev->T * ev->mb));
    ev->tgt = cp_xmalloc(sizeof(int32_t) * (size_t)(ev->T * ev->mb));
    ev->P = P;
    cp_doc_inputs_init(&ev->docs, P);
    if (out) {
        char held[64] = "";
        if (ev->data.count >= 0) snprintf(held, sizeof held, " of %lld held out", (long long)ev->data.count);
        fprintf(out, "evaluation: %d sequence%s%s of data.val = \"%s\" after every %d step%s%s\n",
                sp->train.eval_sequences, sp->train.eval_sequences == 1 ? "" : "s", held, sp->data.val, ev->every,
                ev->every == 1 ? "" : "s", ev->steps % ev->every ? " and after the last" : "");
    }
    return 0;
}

void cp_eval_close(cp_eval *ev) {
    if (!ev) return;
    if (ev->on) cp_dataset_close(&ev->data);
    free(ev->tok);
    free(ev->tgt);
    cp_doc_inputs_free(&ev->docs);
    memset(ev, 0, sizeof *ev);
}

bool cp_eval_due(const cp_eval *ev, int step) {
    return ev->on && step >= 1 && (step % ev->every == 0 || step == ev->steps);
}

int cp_eval_after(cp_eval *ev, cp_exec *ex, int step, cp_eval_result *r, char *err, int errlen) {
    memset(r, 0, sizeof *r);
    r->loss = NAN;
    if (!cp_eval_due(ev, step)) return 0;
    double t0 = cp_now(), sum = 0;
    int64_t targets = 0;
    /* the same sequences every time: comparable from one evaluation to the next */
    cp_dataset_rewind(&ev->data);
    for (int done = 0; done < ev->rounds;) {
        /* as many at once as a step's micro-batches: the executor's staging holds that many */
        int n = CP_MIN(ev->mb, ev->rounds - done);
        int64_t all = 0;
        for (int b = 0; b < n; b++) {
            if (cp_dataset_next_slice(&ev->data, &ev->slice, ev->tok + (size_t)b * ev->T, ev->tgt + (size_t)b * ev->T,
                                      err, errlen)) {
                char m[CP_ERR_MAX];
                snprintf(m, sizeof m, "%s", err);
                return cp_errf(err, errlen, "evaluation after step %d: reading data.val: %s", step, m);
            }
            all += ev->data.targets_round; /* every group's sequence of this round */
            if (cp_doc_inputs_add(&ev->docs, ev->P, &ev->slice, &ev->data, err, errlen)) return -1;
        }
        if (cp_doc_inputs_stage(&ev->docs, ex, err, errlen)) return -1;
        double s;
        if (cp_exec_eval(ex, ev->tok, ev->tgt, n, all, &s, err, errlen)) {
            char m[CP_ERR_MAX];
            snprintf(m, sizeof m, "%s", err);
            return cp_errf(err, errlen, "evaluation after step %d: %s", step, m);
        }
        sum += s;
        targets += all;
        done += n;
    }
    r->done = true;
    r->loss = targets ? sum / (double)targets : NAN;
    r->tokens = targets;
    r->seconds = cp_now() - t0;
    ev->last_step = step;
    ev->last_loss = r->loss;
    return 0;
}

const char *cp_eval_step_text(const cp_eval_result *r, char *buf, size_t n) {
    if (r->done) snprintf(buf, n, " | val loss %.4f", r->loss);
    else if (n) buf[0] = 0;
    return buf;
}

void cp_eval_metrics(FILE *f, const cp_eval_result *r) {
    if (!r->done) return;
    if (isfinite(r->loss)) fprintf(f, "\"val_loss\":%.9g,", r->loss);
    else fprintf(f, "\"val_loss\":null,");
    fprintf(f, "\"val_tokens\":%lld,\"val_seconds\":%.9g,", (long long)r->tokens, r->seconds);
}

const char *cp_eval_done_text(const cp_eval *ev, char *buf, size_t n) {
    if (ev->last_step > 0) snprintf(buf, n, " | val loss %.4f (after step %d)", ev->last_loss, ev->last_step);
    else if (n) buf[0] = 0;
    return buf;
}
