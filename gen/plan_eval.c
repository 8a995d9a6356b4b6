/* plan_eval.c: which steps of a micro-batch an evaluation runs (the loss sum and what it depends on), the check that
 * they leave the training state alone, their predicted time, and the plan's lines about it (plan_eval.h). */
#include "plan_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

void cp_plan_eval_free(cp_plan_eval *e) {
    if (!e) return;
    free(e->run);
    e->run = NULL;
}

static const char *desc(const cp_plan *P, int i, char *buf, size_t n) {
    const cp_step *s = &P->steps[i];
    snprintf(buf, n, "step %lld (%s %s, layer %d)", (long long)cp_plan_flat_index(P, i), cp_phase_name(s->phase),
             s->what, s->layer);
    return buf;
}

/* The training state a step must leave alone: every buffer that lives across steps (parameters, master weights,
 * moments, gradients, the host optimizer's rings) but the step's scalars, which every step zeroes first, and the GEMM
 * workspace, which holds nothing between GEMMs. */
static bool state(const cp_buffer *b) { return b->persistent && b->cat != CP_CAT_WORKSPACE; }

int cp_plan_eval_of(const cp_plan *P, cp_plan_eval *e, char *err, int errlen) {
    memset(e, 0, sizeof *e);
    e->end = -1;
    for (int i = 0; i < P->micro_steps && e->end < 0; i++)
        if (P->steps[i].task == CP_TASK_LOSS_SUM) e->end = i;
    if (e->end < 0)
        return cp_errf(err, errlen, "plan bug: a micro-batch has no loss sum (%s), so nothing computes an evaluation's "
                       "loss", cp_task_name(CP_TASK_LOSS_SUM));
    /* Backwards from the loss sum: a step runs when it writes a buffer that a step running after it reads. A buffer
     * stays wanted once a read wants it, so every earlier writer of it runs too (a tile written in pieces, an
     * accumulator cleared and then added into). */
    e->run = cp_xcalloc((size_t)e->end + 1, sizeof *e->run);
    bool *want = cp_xcalloc((size_t)P->nbufs + 1, sizeof *want);
    for (int i = e->end; i >= 0; i--) {
        const cp_step *s = &P->steps[i];
        bool run = i == e->end;
        for (int j = 0; j < s->nops && !run; j++) run = (s->ops[j].access & CP_WRITE) && want[s->ops[j].buf];
        if (!run || s->last_micro) continue;
        e->run[i] = true;
        e->nrun++;
        for (int j = 0; j < s->nops; j++)
            if (s->ops[j].access & CP_READ) want[s->ops[j].buf] = true;
    }
    free(want);
    /* Forwards: what runs is the forward alone, writes nothing of the training state, and reads only what it wrote
     * itself (or that state). */
    bool *wrote = cp_xcalloc((size_t)P->nbufs + 1, sizeof *wrote);
    int rc = 0;
    char d[160];
    for (int i = 0; i <= e->end && !rc; i++) {
        if (!e->run[i]) continue;
        const cp_step *s = &P->steps[i];
        if (s->phase != CP_PHASE_FWD) {
            rc = cp_errf(err, errlen, "plan bug: an evaluation's loss depends on %s, which is not of the forward",
                         desc(P, i, d, sizeof d));
            break;
        }
        for (int j = 0; j < s->nops && !rc; j++) {
            const cp_operand *o = &s->ops[j];
            const cp_buffer *b = &P->bufs[o->buf];
            if ((o->access & CP_READ) && !b->persistent && !wrote[o->buf])
                rc = cp_errf(err, errlen, "plan bug: in an evaluation %s reads %s, which no step it runs wrote before",
                             desc(P, i, d, sizeof d), b->name);
            else if ((o->access & CP_WRITE) && state(b))
                rc = cp_errf(err, errlen, "plan bug: an evaluation would change the training state: %s writes %s",
                             desc(P, i, d, sizeof d), b->name);
        }
        for (int j = 0; j < s->nops; j++)
            if (s->ops[j].access & CP_WRITE) wrote[s->ops[j].buf] = true;
    }
    free(wrote);
    if (rc) {
        cp_plan_eval_free(e);
        return -1;
    }
    /* Its time by the step's cost model: the compute stream's steps, all-to-alls on the critical path, and per layer
     * what gathers and copies take beyond that layer's compute (a folded loop's body once per tile it stands for). */
    double t = 0, compute = 0, hidden = 0;
    int key = -2;
    for (int i = 0; i <= e->end; i++) {
        if (!e->run[i]) continue;
        const cp_step *s = &P->steps[i];
        double st = s->seconds * (double)cp_plan_step_repeats(P, i);
        if (s->layer != key) {
            t += fmax(0.0, hidden - compute);
            compute = hidden = 0;
            key = s->layer;
        }
        if (s->stream == CP_STREAM_COMPUTE) {
            t += st;
            compute += st;
        } else if (s->kind == CP_OP_ALLTOALL || s->kind == CP_OP_ALLREDUCE) {
            t += st;
        } else {
            hidden += st;
        }
    }
    e->seconds = t + fmax(0.0, hidden - compute);
    return 0;
}

int cp_plan_eval_count(const cp_spec *s) {
    int k = s->train.eval_every, n = s->train.steps;
    return k > 0 ? n / k + (n % k != 0) : 0;
}

double cp_plan_eval_seconds(const cp_plan *P, const cp_plan_eval *e) {
    const cp_spec *sp = &P->spec;
    int per_group = sp->train.eval_sequences / CP_MAX(1, P->replicas);
    /* the loss summed across the run: one small all-reduce, across nodes where there are several groups */
    double sum = P->replicas * P->ring * P->C > 1
                     ? (P->replicas * P->ring > 1 ? sp->machine.net_us : sp->machine.coll_us) * 1e-6
                     : 0;
    return per_group * e->seconds + sum;
}

static const char *secs(double t, char *buf, size_t n) {
    if (t >= 1) snprintf(buf, n, "%.2f s", t);
    else snprintf(buf, n, "%.2f ms", t * 1e3);
    return buf;
}

void cp_plan_eval_print(const cp_plan *P, FILE *out) {
    const cp_train *tr = &P->spec.train;
    if (tr->eval_every <= 0) return;
    cp_plan_eval e;
    char why[CP_ERR_MAX];
    if (cp_plan_eval_of(P, &e, why, sizeof why)) {
        fprintf(out, "evaluation: cannot run on this plan: %s\n", why);
        return;
    }
    int n = cp_plan_eval_count(&P->spec);
    double one = cp_plan_eval_seconds(P, &e), train = tr->steps * P->t_step, all = train + n * one;
    char a[32], b[32], c[32];
    fprintf(out, "evaluation: forward of %d sequence%s every %d step%s%s, within the step's memory, predicted %s (it "
                 "runs %d of a micro-batch's %d steps; data.val = \"%s\")\n",
            tr->eval_sequences, tr->eval_sequences == 1 ? "" : "s", tr->eval_every, tr->eval_every == 1 ? "" : "s",
            tr->steps % tr->eval_every ? " and after the last" : "", secs(one, a, sizeof a), e.nrun, P->micro_steps,
            P->spec.data.val);
    fprintf(out, "predicted run: %s = %d steps of %s + %d evaluation%s of %s\n", secs(all, a, sizeof a), tr->steps,
            secs(P->t_step, b, sizeof b), n, n == 1 ? "" : "s", secs(one, c, sizeof c));
    cp_plan_eval_free(&e);
}

void cp_plan_eval_print_json(const cp_plan *P, FILE *out) {
    const cp_train *tr = &P->spec.train;
    cp_plan_eval e;
    char why[CP_ERR_MAX];
    if (tr->eval_every <= 0 || cp_plan_eval_of(P, &e, why, sizeof why)) {
        fprintf(out, "  \"evaluation\": null,\n");
        return;
    }
    int n = cp_plan_eval_count(&P->spec);
    double one = cp_plan_eval_seconds(P, &e);
    fprintf(out, "  \"evaluation\": {\"every\": %d, \"sequences\": %d, \"steps_run\": %d, \"seconds\": %.6g, "
                 "\"evaluations\": %d, \"run_seconds\": %.6g},\n",
            tr->eval_every, tr->eval_sequences, e.nrun, one, n, tr->steps * P->t_step + n * one);
    cp_plan_eval_free(&e);
}
