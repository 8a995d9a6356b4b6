/* plan_fp8.c: train.precision = "fp8". Each GEMM of a layer (the projections and the MLP, forward, recompute and
 * backward) becomes an FP8 GEMM: before it, for each input, one kernel takes the tensor's amax into a scale slot and
 * one writes its FP8 copy (transposed where the GEMM reads it transposed: Hopper's FP8 tensor cores take only the
 * x W^T form). Activations and weights go to E4M3; a backward GEMM's first input, the gradient, to E5M2 for its range.
 * The embedding, the LM head and loss, norms and attention stay as they are; so do a GEMM whose sizes are not
 * multiples of 16 (FP8's alignment), which the plan's output counts.
 * The program stays the planner's: this pass runs on the built steps before lifetimes and offsets, so the copies and
 * casts are in the plan's memory and time like any other buffer and step. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "plan_internal.h"
#include "util.h"

/* fp8_state: two 16-byte scale slots (the GEMM's A and B), two amax counters on 16 bytes each, then each input's
 * per-block amax parts */
#define SLOT(x) ((int64_t)(x) * 16)
#define COUNTER(x) (32 + (int64_t)(x) * 16)
#define PARTS(x) (64 + (int64_t)(x) * CP_FP8_AMAX_PARTS * 4)
#define STATE_BYTES PARTS(2)

bool cp_plan_fp8_eligible(const cp_step *s) {
    const cp_gemm *g = &s->gemm;
    return s->kind == CP_OP_GEMM && s->layer >= 0 && !(g->trans_a && g->trans_b) && g->m % 16 == 0 &&
           g->n % 16 == 0 && g->k % 16 == 0;
}

cp_gemm cp_plan_fp8_gemm(const cp_step *s) {
    bool grad = s->gemm.a_grad; /* not the backward's recomputed projections: their inputs are activations */
    cp_gemm f = s->gemm;
    f.trans_a = false;
    f.trans_b = true;
    f.lda = f.ldb = s->gemm.k;
    f.a_type = grad ? CP_GEMM_E5M2 : CP_GEMM_E4M3;
    f.b_type = CP_GEMM_E4M3;
    f.fast_accum = !grad; /* the gradients' sums (dW's over every token) with fp32 promotion, the rest without */
    return f;
}

typedef struct {
    cp_step *steps;
    int n, cap;
} program;

static cp_step *append(program *q, const cp_step *like) {
    if (q->n == q->cap) {
        q->cap = q->cap ? 2 * q->cap : 1024;
        q->steps = cp_xrealloc(q->steps, sizeof *q->steps * (size_t)q->cap);
    }
    cp_step *s = &q->steps[q->n++];
    *s = *like;
    return s;
}

static void operand(cp_step *s, int buf, int64_t off, int64_t bytes, int access) {
    s->ops[s->nops++] = (cp_operand){.buf = buf, .offset = off, .bytes = bytes, .access = access};
}

/* A kernel step of the fp8 module beside GEMM g: its place in the program, no operands yet. */
static cp_step *cast_step(program *q, const cp_step *g, int module, const char *role, cp_task task) {
    cp_step k;
    memset(&k, 0, sizeof k);
    k.kind = CP_OP_KERNEL;
    k.task = task;
    k.phase = g->phase;
    k.stream = CP_STREAM_COMPUTE;
    k.layer = g->layer;
    k.stage = g->stage;
    k.tile = g->tile;
    k.ring_step = g->ring_step;
    k.ring_part = g->ring_part;
    k.module = module;
    snprintf(k.role, sizeof k.role, "%s", role);
    snprintf(k.what, sizeof k.what, "%s", cp_task_name(task));
    return append(q, &k);
}

/* The amax and the FP8 copy of input x (0: A, 1: B) of GEMM g, read from its operand src as [rows][cols] with row
 * stride ld, into copy (transposed when `transpose`). */
static void cast_input(program *q, const cp_step *g, int module, int state, int copy, int x, cp_operand src,
                       int64_t rows, int64_t cols, int64_t ld, bool transpose, bool e5m2) {
    src.access = CP_READ;
    cp_step *s = cast_step(q, g, module, e5m2 ? "amax_e5m2" : "amax_e4m3", CP_TASK_FP8_AMAX);
    s->ops[s->nops++] = src;
    operand(s, state, PARTS(x), CP_FP8_AMAX_PARTS * 4, CP_RW);
    operand(s, state, COUNTER(x), 4, CP_RW);
    operand(s, state, SLOT(x), 16, CP_RW);
    s->count = rows;
    s->heads = cols;
    s->ld = ld;
    s->bytes = (double)rows * (double)cols * 2;
    const char *role = transpose ? (e5m2 ? "cast_t_e5m2" : "cast_t_e4m3") : (e5m2 ? "cast_e5m2" : "cast_e4m3");
    s = cast_step(q, g, module, role, CP_TASK_FP8_CAST);
    s->ops[s->nops++] = src;
    operand(s, state, SLOT(x), 16, CP_READ);
    operand(s, copy, 0, rows * cols, CP_WRITE);
    s->count = rows;
    s->heads = cols;
    s->ld = ld;
    s->bytes = (double)rows * (double)cols * 3;
}

void cp_plan_lower_fp8(cp_plan *P) {
    if (!P->spec.train.fp8) return;
    int64_t a_bytes = 0, b_bytes = 0;
    for (int i = 0; i < P->nsteps; i++)
        if (cp_plan_fp8_eligible(&P->steps[i])) {
            a_bytes = CP_MAX(a_bytes, P->steps[i].gemm.m * P->steps[i].gemm.k);
            b_bytes = CP_MAX(b_bytes, P->steps[i].gemm.n * P->steps[i].gemm.k);
        }
    if (!a_bytes) return;
    if (P->nmodules == P->capmodules) {
        P->capmodules = P->capmodules ? P->capmodules * 2 : 16;
        P->modules = cp_xrealloc(P->modules, sizeof *P->modules * (size_t)P->capmodules);
    }
    int module = P->nmodules++;
    cp_k_fp8(&P->modules[module]);
    int state = cp_plan_add_buf(P, "fp8_state", CP_SPACE_GPU, CP_CAT_FP8, STATE_BYTES, false);
    int copy[2] = {cp_plan_add_buf(P, "fp8_a", CP_SPACE_GPU, CP_CAT_FP8, a_bytes, false),
                   cp_plan_add_buf(P, "fp8_b", CP_SPACE_GPU, CP_CAT_FP8, b_bytes, false)};

    program q = {0};
    /* the amax counters start at 0 in every micro-batch (each amax leaves its counter 0 again) */
    cp_step z;
    memset(&z, 0, sizeof z);
    z.kind = CP_OP_MEMSET;
    z.phase = CP_PHASE_FWD;
    z.stream = CP_STREAM_COMPUTE;
    z.layer = z.stage = z.tile = z.ring_step = z.ring_part = z.module = -1;
    snprintf(z.what, sizeof z.what, "zero");
    z.count = STATE_BYTES;
    z.bytes = (double)STATE_BYTES;
    operand(&z, state, 0, STATE_BYTES, CP_WRITE);
    append(&q, &z);
    int *moved = cp_xmalloc(sizeof *moved * (size_t)(P->nsteps + 1)); /* new index of each old step, and the end */
    for (int i = 0; i < P->nsteps; i++) {
        const cp_step *g = &P->steps[i];
        moved[i] = q.n; /* a GEMM's casts come first: a loop's body that starts with it starts with them */
        if (!cp_plan_fp8_eligible(g)) {
            append(&q, g);
            continue;
        }
        const cp_gemm *m = &g->gemm, fg = cp_plan_fp8_gemm(g);
        cast_input(&q, g, module, state, copy[0], 0, g->ops[0], m->trans_a ? m->k : m->m, m->trans_a ? m->m : m->k,
                   m->lda, m->trans_a, fg.a_type == CP_GEMM_E5M2);
        cast_input(&q, g, module, state, copy[1], 1, g->ops[1], m->trans_b ? m->n : m->k, m->trans_b ? m->k : m->n,
                   m->ldb, !m->trans_b, fg.b_type == CP_GEMM_E5M2);
        cp_step *f = append(&q, g);
        f->gemm = fg;
        f->ops[0] = (cp_operand){.buf = copy[0], .offset = 0, .bytes = m->m * m->k, .access = CP_READ};
        f->ops[1] = (cp_operand){.buf = copy[1], .offset = 0, .bytes = m->n * m->k, .access = CP_READ};
        operand(f, state, SLOT(0), 16, CP_READ); /* A, B, (C), D: room for two more */
        operand(f, state, SLOT(1), 16, CP_READ);
    }
    moved[P->nsteps] = q.n;
    for (int l = 0; l < P->nloops; l++) {
        cp_loop *L = &P->loops[l];
        int first = moved[L->first], end = moved[L->first + L->nsteps];
        L->first = first;
        L->nsteps = end - first;
    }
    P->micro_steps = moved[P->micro_steps];
    free(moved);
    free(P->steps);
    P->steps = q.steps;
    P->nsteps = q.n;
    P->capsteps = q.cap;
}
