/* exec_order.c: the order between streams. The plan puts every step on compute, comm or copy; a step waits for the
 * last step of another stream that wrote bytes it touches, or read bytes it writes. Hazards are found on arena bytes,
 * not buffer names, because the memory plan lets buffers with disjoint lifetimes share bytes and the copy stream may
 * run ahead of compute. The streams are joined at each micro-batch and before the optimizer, so the analysis covers
 * one program at a time. Also here: the check that the backward uses the weight rows the forward used, the progress
 * markers, and cp_exec_check, all of it without a GPU. */
#include "exec_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "plan_eval.h"
#include "util.h"

/* ---------------------------------------------------------------- weights read by the backward */

typedef struct {
    int64_t off, len; /* elements */
} erange;

static int cmp_erange(const void *a, const void *b) {
    const erange *x = a, *y = b;
    return x->off != y->off ? (x->off < y->off ? -1 : 1) : (x->len > y->len) - (x->len < y->len);
}

static bool is_weights(cp_cat c) { return c == CP_CAT_PARAMS || c == CP_CAT_GATHERED; }
static bool is_grads(cp_cat c) { return c == CP_CAT_GRADS || c == CP_CAT_UNIT_GRADS; }
/* A GEMM, or the cast that makes an FP8 GEMM's copy of an input (train.precision = "fp8": the GEMM reads the copy) */
static bool gemm_input(const cp_step *s) {
    return s->kind == CP_OP_GEMM || s->task == CP_TASK_FP8_CAST || s->task == CP_TASK_FP8_CAST_BLOCK;
}

/* Every weight slice a backward GEMM reads (or its FP8 cast), and every gradient slice it accumulates into, must be
 * a slice some forward GEMM (or its FP8 cast) read as weights: otherwise the backward trains rows the forward never
 * used, silently. */
int exec_check_weight_ranges(const cp_exec *ex, char *err, int errlen) {
    const cp_plan *P = ex->P;
    int n = 0, cap = 64;
    erange *fw = cp_xmalloc(sizeof *fw * (size_t)cap);
    for (int i = 0; i < P->micro_steps; i++) {
        const cp_step *s = &P->steps[i];
        if (!gemm_input(s) || s->phase != CP_PHASE_FWD) continue;
        for (int j = 0; j < s->nops; j++) {
            if (!is_weights(P->bufs[s->ops[j].buf].cat)) continue;
            /* a cast of one weight of every layer at once (cp_fp8_copy.layers) reads each layer's */
            const int layers = s->fp8.layers > 1 ? s->fp8.layers : 1;
            const int64_t len = layers > 1 ? s->count * s->heads : s->ops[j].bytes / 2;
            for (int z = 0; z < layers; z++) {
                if (n == cap) fw = cp_xrealloc(fw, sizeof *fw * (size_t)(cap *= 2));
                fw[n++] = (erange){s->ops[j].offset / 2 + z * s->fp8.src_stride, len};
            }
        }
    }
    qsort(fw, (size_t)n, sizeof *fw, cmp_erange);
    int rc = 0;
    for (int i = 0; i < P->micro_steps && !rc; i++) {
        const cp_step *s = &P->steps[i];
        if (!gemm_input(s) || s->phase == CP_PHASE_FWD) continue;
        for (int j = 0; j < s->nops && !rc; j++) {
            const cp_operand *o = &s->ops[j];
            cp_cat c = P->bufs[o->buf].cat;
            if (!is_weights(c) && !is_grads(c)) continue;
            int64_t es = is_weights(c) ? 2 : 4;
            erange key = {o->offset / es, o->bytes / es};
            if (bsearch(&key, fw, (size_t)n, sizeof *fw, cmp_erange)) continue;
            char d[160];
            rc = cp_errf(err, errlen,
                       "plan bug: %s %s elements [%lld, %lld) of %s, which no forward GEMM read as weights: the "
                       "backward would use and train the wrong rows (in gen/plan.c, proj_backward's row0 counts "
                       "heads; its offsets need row0 * head_dim * hidden)",
                       exec_step_desc(P, i, d, sizeof d), is_weights(c) ? "reads" : "accumulates into",
                       (long long)key.off, (long long)(key.off + key.len), P->bufs[o->buf].name);
        }
    }
    free(fw);
    return rc;
}

/* ---------------------------------------------------------------- cross-stream dependencies */

typedef struct {
    int space;
    int64_t lo, hi;
    bool w;
} prange;

static int step_ranges(const cp_exec *ex, int i, prange *r) {
    const cp_step *s = &ex->P->steps[i];
    int n = 0;
    for (int j = 0; j < s->nops; j++) {
        const cp_operand *o = &s->ops[j];
        const cp_buffer *b = &ex->P->bufs[o->buf];
        if (o->bytes <= 0) continue;
        r[n++] = (prange){.space = b->space, .lo = b->offset + o->offset, .hi = b->offset + o->offset + o->bytes,
                          .w = (o->access & CP_WRITE) != 0};
        /* a layout kernel's token-layout operand is a stage's columns of every row: strided over the buffer */
        if (s->module >= 0 && !strcmp(ex->P->modules[s->module].family, "ulysses")) {
            r[n - 1].lo = b->offset;
            r[n - 1].hi = b->offset + b->bytes;
        }
    }
    return n;
}

static bool conflict(const prange *a, int na, const prange *b, int nb) {
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++)
            if (a[i].space == b[j].space && a[i].lo < b[j].hi && b[j].lo < a[i].hi && (a[i].w || b[j].w)) return true;
    return false;
}

/* For the steps [from, to): each step waits for the latest conflicting step of every other stream, unless it (or
 * an earlier step of its stream) already waited for that one or a later one. */
void exec_build_deps(cp_exec *ex, int from, int to) {
    int synced[CP_STREAM_COUNT][CP_STREAM_COUNT];
    for (int a = 0; a < CP_STREAM_COUNT; a++)
        for (int b = 0; b < CP_STREAM_COUNT; b++) synced[a][b] = from - 1;
    int *bystream[CP_STREAM_COUNT], nby[CP_STREAM_COUNT] = {0};
    /* sv[i - from]: how far step i's stream had waited for each stream once step i was issued */
    int (*sv)[CP_STREAM_COUNT] = cp_xmalloc(sizeof *sv * (size_t)(to - from + 1));
    for (int s = 0; s < CP_STREAM_COUNT; s++) bystream[s] = cp_xmalloc(sizeof(int) * (size_t)(to - from + 1));
    prange ri[CP_MAX_OPERANDS + 2], rj[CP_MAX_OPERANDS + 2];
    for (int i = from; i < to; i++) {
        xstep *x = &ex->x[i];
        int X = x->stream;
        ex->stream_used[X] = true;
        int ni = step_ranges(ex, i, ri);
        x->wait0 = ex->nwaits;
        for (int Y = 0; Y < CP_STREAM_COUNT; Y++) {
            if (Y == X) continue;
            for (int q = nby[Y] - 1; q >= 0 && bystream[Y][q] > synced[X][Y]; q--) {
                int j = bystream[Y][q];
                int nj = step_ranges(ex, j, rj);
                if (!conflict(ri, ni, rj, nj)) continue;
                if (ex->x[j].event < 0) {
                    ex->event_step = cp_xrealloc(ex->event_step, sizeof(int) * (size_t)(ex->nevents + 1));
                    ex->event_step[ex->nevents] = j;
                    ex->x[j].event = ex->nevents++;
                }
                ex->waits = cp_xrealloc(ex->waits, sizeof(int) * (size_t)(ex->nwaits + 1));
                ex->waits[ex->nwaits++] = ex->x[j].event;
                synced[X][Y] = j;
                /* what step j had waited for (on its stream, when it was issued), X now follows too */
                for (int Z = 0; Z < CP_STREAM_COUNT; Z++)
                    if (Z != X && sv[j - from][Z] > synced[X][Z]) synced[X][Z] = sv[j - from][Z];
                break;
            }
        }
        x->nwait = ex->nwaits - x->wait0;
        bystream[X][nby[X]++] = i;
        for (int Z = 0; Z < CP_STREAM_COUNT; Z++) sv[i - from][Z] = Z == X ? i : synced[X][Z];
    }
    for (int s = 0; s < CP_STREAM_COUNT; s++) free(bystream[s]);
    free(sv);
}

/* ---------------------------------------------------------------- progress markers */

void exec_build_markers(cp_exec *ex) {
    const cp_plan *P = ex->P;
    ex->markers = cp_xcalloc((size_t)P->micro_steps + 1, sizeof *ex->markers);
    double t = 0;
    int prev_layer = -3, prev_phase = -1;
    for (int i = 0; i < P->micro_steps; i++) {
        const cp_step *s = &P->steps[i];
        if (s->layer != prev_layer || (int)s->phase != prev_phase) {
            marker *m = &ex->markers[ex->nmarkers++];
            m->step = i;
            m->before = t;
            const char *ph = s->phase == CP_PHASE_RECOMPUTE ? "bwd" : cp_phase_name(s->phase);
            if (s->layer >= 0)
                snprintf(m->label, sizeof m->label, "%s layer %d of %lld", ph, s->layer + 1, (long long)P->spec.model.layers);
            else
                snprintf(m->label, sizeof m->label, "%s", i == 0 ? "embedding" : s->phase == CP_PHASE_FWD ? "LM head and loss" : "embedding bwd");
            ex->x[i].marker = ex->nmarkers - 1;
            prev_layer = s->layer;
            prev_phase = (int)s->phase;
        }
        t += s->seconds;
    }
    ex->t_micro = t;
    ex->t_optim = 0;
    for (int i = P->micro_steps; i < P->nsteps; i++) ex->t_optim += P->steps[i].seconds;
}

/* ---------------------------------------------------------------- checking a plan without a GPU */

/* Every pair of steps on different streams that touch the same bytes (one of them writing) must be ordered by the
 * waits: a vector clock per step says the latest step of each stream it follows. */
static int verify_order(const cp_exec *ex, int from, int to, int64_t *pairs, char *err, int errlen) {
    int n = to - from;
    int (*hb)[CP_STREAM_COUNT] = cp_xmalloc(sizeof *hb * (size_t)(n + 1));
    int last[CP_STREAM_COUNT];
    for (int s = 0; s < CP_STREAM_COUNT; s++) last[s] = -1;
    prange ri[CP_MAX_OPERANDS + 2], rj[CP_MAX_OPERANDS + 2];
    int rc = 0;
    for (int i = from; i < to && !rc; i++) {
        const xstep *x = &ex->x[i];
        int X = x->stream;
        for (int s = 0; s < CP_STREAM_COUNT; s++) hb[i - from][s] = last[X] >= 0 ? hb[last[X] - from][s] : from - 1;
        for (int w = 0; w < x->nwait; w++) {
            int j = ex->event_step[ex->waits[x->wait0 + w]];
            for (int s = 0; s < CP_STREAM_COUNT; s++)
                if (hb[j - from][s] > hb[i - from][s]) hb[i - from][s] = hb[j - from][s];
        }
        hb[i - from][X] = i;
        last[X] = i;
        int ni = step_ranges(ex, i, ri);
        for (int j = from; j < i; j++) {
            int Y = ex->x[j].stream;
            if (Y == X) continue;
            int nj = step_ranges(ex, j, rj);
            if (!conflict(ri, ni, rj, nj)) continue;
            (*pairs)++;
            if (hb[i - from][Y] < j) {
                char a[160], b[160];
                rc = cp_errf(err, errlen, "%s may run before %s on another stream, and they touch the same bytes",
                           exec_step_desc(ex->P, i, a, sizeof a), exec_step_desc(ex->P, j, b, sizeof b));
            }
        }
    }
    free(hb);
    return rc;
}

/* An executor without a GPU for the rank o names (NULL: rank 0): made-up addresses with the arenas' alignment (1 TiB
 * for the GPU arena, 2 TiB for the host arena), every step prepared, the waits between streams and the markers
 * built. *rc: 0, or -1 with a message. */
static cp_exec *dry_exec(const cp_plan *P, const cp_exec_opts *o, int *rc, char *err, int errlen) {
    cp_exec *ex = cp_xcalloc(1, sizeof *ex);
    ex->P = P;
    if (o) ex->o = *o;
    ex->dry = true;
    ex->info.sms = 132;
    ex->bufptr = cp_xcalloc((size_t)(P->nbufs ? P->nbufs : 1), sizeof *ex->bufptr);
    ex->x = cp_xcalloc((size_t)(P->nsteps ? P->nsteps : 1), sizeof *ex->x);
    ex->gpu = (char *)((uintptr_t)1 << 40);
    exec_host_pieces(ex);
    for (int i = 0; i < ex->npieces; i++) ex->pieces[i].p = (char *)((uintptr_t)1 << 41) + ex->pieces[i].start;
    exec_place_buffers(ex);
    *rc = exec_place_rank(ex, err, errlen);
    for (int i = 0; i < P->nsteps && !*rc; i++) *rc = exec_prep_step(ex, i, err, errlen);
    if (!*rc) *rc = exec_check_weight_ranges(ex, err, errlen);
    if (!*rc) {
        exec_build_deps(ex, 0, P->micro_steps);
        exec_build_deps(ex, P->micro_steps, P->nsteps);
        exec_build_markers(ex);
    }
    return ex;
}

int cp_exec_check(const cp_plan *P, cp_exec_check_report *rep, char *err, int errlen) {
    memset(rep, 0, sizeof *rep);
    int rc;
    cp_exec *ex = dry_exec(P, NULL, &rc, err, errlen);
    if (!rc) {
        rc = verify_order(ex, 0, P->micro_steps, &rep->ordered_pairs, err, errlen);
        if (!rc) rc = verify_order(ex, P->micro_steps, P->nsteps, &rep->ordered_pairs, err, errlen);
    }
    /* an evaluation walks the micro-batch's steps as they are ordered here, running a part of them */
    cp_plan_eval e;
    if (!rc && !(rc = cp_plan_eval_of(P, &e, err, errlen))) {
        rep->eval_steps = e.nrun;
        cp_plan_eval_free(&e);
    }
    for (int i = 0; i < P->nsteps; i++) {
        const xstep *x = &ex->x[i];
        rep->kernels += x->kind == X_KERNEL || x->kind == X_HOST_ADAMW;
        rep->launches += x->nl;
        rep->gemms += x->kind == X_GEMM;
        rep->copies += x->kind == X_COPY || x->kind == X_LOAD_TOKENS;
        rep->memsets += x->kind == X_MEMSET;
    }
    rep->steps = P->nsteps;
    rep->waits = ex->nwaits;
    rep->events = ex->nevents;
    rep->markers = ex->nmarkers;
    rep->pin_pieces = ex->npieces;
    cp_exec_destroy(ex);
    return rc;
}

int cp_exec_dry(cp_exec **out, const cp_plan *P, const cp_exec_opts *o, char *err, int errlen) {
    *out = NULL;
    int rc;
    cp_exec *ex = dry_exec(P, o, &rc, err, errlen);
    if (rc) {
        cp_exec_destroy(ex);
        return -1;
    }
    *out = ex;
    return 0;
}

void cp_exec_prepared_step(const cp_exec *ex, int i, cp_exec_prepared *out) {
    memset(out, 0, sizeof *out);
    const xstep *x = &ex->x[i];
    out->launches = x->nl;
    for (int k = 0; k < x->nl; k++) {
        const xlaunch *l = &x->L[k];
        out->nargs[k] = l->nargs;
        for (int a = 0; a < l->nargs; a++) /* a value fixed at preparation is stored in the launch itself */
            out->args[k][a] = l->args[a] == &l->val[a] ? l->val[a] : 0;
    }
    out->src = x->src;
    out->dst = x->dst;
    out->count = x->count;
    out->to = x->to;
    out->from = x->from;
}

/* ---------------------------------------------------------------- the waits, for the step trace */

int exec_wait_pairs(const cp_exec *ex, cp_trace_wait **out) {
    cp_trace_wait *w = cp_xmalloc(sizeof *w * (size_t)(ex->nwaits + 1));
    int n = 0;
    for (int i = 0; i < ex->P->nsteps; i++)
        for (int k = 0; k < ex->x[i].nwait; k++)
            w[n++] = (cp_trace_wait){i, ex->event_step[ex->waits[ex->x[i].wait0 + k]]};
    *out = w;
    return n;
}

int cp_exec_plan_waits(const cp_plan *P, cp_trace_wait **waits, int *n, char *err, int errlen) {
    *waits = NULL;
    *n = 0;
    int rc;
    cp_exec *ex = dry_exec(P, NULL, &rc, err, errlen);
    if (!rc) *n = exec_wait_pairs(ex, waits);
    cp_exec_destroy(ex);
    return rc;
}
