/* plan_fp8.c: train.precision = "fp8". Each GEMM of a layer (the projections and the MLP, forward, recompute and
 * backward) becomes an FP8 GEMM on FP8 copies of its inputs, each written by a cast kernel (transposed where the GEMM
 * reads it transposed: Hopper's FP8 tensor cores take only the x W^T form). With block scales (train.fp8_scaling =
 * "block") the cast writes the copy's scales behind it, one per 128 elements of k, or per 128 x 128 tile of a
 * weight; with one scale per tensor a kernel first takes the tensor's amax into a scale slot. Activations and
 * weights go to E4M3; a backward GEMM's first input, the gradient, to E5M2 for its range under "hybrid".
 * The embedding, the LM head and loss, norms and attention stay as they are; so do a GEMM whose sizes are not
 * multiples of 16 (FP8's alignment), or whose k is not one of 128 with block scales, which the plan's output counts.
 * A copy or an amax is made once and read while it holds: a GEMM whose input was cast (or measured) before, with
 * nothing written to it since, reads that copy (or scale) again. So q, k and v read one copy of the normed input, a
 * tensor read plain and transposed is measured once, and a weight is cast once per layer and pass rather than once
 * per MLP tile: each weight role (the GEMM that reads it) has a copy buffer and a scale slot of its own, which the
 * tiles between do not touch. A folded run of tiles (cp_loop) keeps what its body never overwrites. With block scales
 * a tensor one GEMM reads as rows and a later one transposed (or the reverse), nothing written to it between, is cast
 * both ways from one read: the second copy goes into the buffer kept for copies made ahead for that GEMM's input.
 * An amax, or a copy with 1 x 128 or row scales read as rows, is made by the kernel that wrote the tensor where that
 * kernel can (rmsnorm, SwiGLU: cp_plan_fp8_producer) and wrote exactly the GEMM's input, in the same stretch of the
 * program, with nothing between touching the slot or the copy's buffer (the input's scratch copy, else the one kept
 * for copies made ahead for it; with row scales any buffer free then); elsewhere by a pass of its own. With row scales
 * a tensor read both ways is cast both ways by its producer where it can (rmsnorm, SwiGLU): the row copy and the
 * transposed copy's column maxima (zeroed by a memset put before it), then a cast of the transposed copy alone reads
 * the row copy (the tensor again where its columns do not come in strips of 64), and where no kernel can, a cast of
 * both ways does the same in its two launches; a tensor read only transposed gets those maxima alone from its
 * producer, so that its cast reads it once instead of twice. A producer's output that no later step reads, only its
 * copy (the forward's normed inputs and SwiGLU output, which the backward recomputes), is left unwritten: the kernel
 * writes the copy alone. Where the plan keeps them (cp_plan.fp8_weights_once), each weight of every layer is cast
 * both ways once, at the program's start, and every GEMM reads its layer's slice (cast_weights_once).
 * The program stays the planner's: this pass runs on the built steps before lifetimes and offsets, so the copies and
 * casts are in the plan's memory and time like any other buffer and step. Last, train.fp8_gemm puts block-scaled GEMMs
 * on the generator's kernel (templates/gemm_fp8.cu) where it takes and, under "auto", outruns cuBLASLt: the step keeps
 * its cp_gemm and gains that module and entry (choose_kernels). */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "plan_internal.h"
#include "util.h"

/* fp8_state: scale slots (ACT_SLOTS shared by activations and gradients, least recently used first, then one per
 * weight role), two amax counters on 16 bytes each, then the two inputs' per-block amax parts */
#define ACT_SLOTS 8
#define MAX_SLOTS 64
#define MAX_ROLES (MAX_SLOTS - ACT_SLOTS)
#define SLOT(x) ((int64_t)(x) * CP_FP8_SLOT_BYTES)
#define COUNTER(x) (SLOT(MAX_SLOTS) + (int64_t)(x) * 16)
#define PARTS(x) (SLOT(MAX_SLOTS) + 32 + (int64_t)(x) * CP_FP8_AMAX_PARTS * 4)
#define STATE_BYTES PARTS(2)
#define AHEAD 2 /* the copies made ahead for a later GEMM's input y (cast_both): AHEAD + 2 j + y, j < AHEAD_SETS */
#define AHEAD_SETS 5
#define ROLE0 (AHEAD + 2 * AHEAD_SETS) /* the first weight role's copy */
#define MAX_COPIES (ROLE0 + MAX_ROLES) /* the two inputs' scratch copies, those made ahead, then the roles' */

bool cp_plan_fp8_eligible(const cp_train *t, const cp_step *s) {
    const cp_gemm *g = &s->gemm;
    const bool bf16_grad = g->w_grad ? t->fp8_bf16_wgrad : g->a_grad && t->fp8_bf16_dgrad;
    return s->kind == CP_OP_GEMM && s->layer >= 0 && !(g->trans_a && g->trans_b) && !bf16_grad && g->m % 16 == 0 &&
           g->n % 16 == 0 && g->k % (t->fp8_scaling == CP_FP8_SCALING_BLOCK ? 128 : 16) == 0;
}

/* Whether input x (0: A, 1: B) of GEMM s reads a layer's weights */
static bool reads_weight(const cp_plan *P, const cp_step *s, int x) {
    cp_cat cat = P->bufs[s->ops[x].buf].cat;
    return cat == CP_CAT_PARAMS || cat == CP_CAT_GATHERED;
}

cp_gemm cp_plan_fp8_gemm(const cp_plan *P, const cp_step *s) {
    const cp_train *t = &P->spec.train;
    bool grad = s->gemm.a_grad; /* not the backward's recomputed projections: their inputs are activations */
    cp_gemm f = s->gemm;
    f.trans_a = false;
    f.trans_b = true;
    f.lda = f.ldb = s->gemm.k;
    f.a_type = grad && !t->fp8_e4m3_grads ? CP_GEMM_E5M2 : CP_GEMM_E4M3;
    f.b_type = CP_GEMM_E4M3;
    if (t->fp8_scaling == CP_FP8_SCALING_BLOCK) { /* a weight's tiles read the same in its transposed copy; never two
                                                   * tiled inputs */
        f.a_scale = reads_weight(P, s, 0) && !reads_weight(P, s, 1) ? CP_GEMM_SCALE_2D : CP_GEMM_SCALE_1D;
        f.b_scale = reads_weight(P, s, 1) ? CP_GEMM_SCALE_2D : CP_GEMM_SCALE_1D;
        f.fast_accum = false;
    } else {
        if (t->fp8_scaling == CP_FP8_SCALING_ROW) f.a_scale = f.b_scale = CP_GEMM_SCALE_ROW;
        /* the weights' gradients' sums (over every token) always with fp32 promotion, dX's where asked */
        f.fast_accum = !grad ? t->fp8_fast_accum >= CP_FP8_FAST_FORWARD
                             : !s->gemm.w_grad && t->fp8_fast_accum == CP_FP8_FAST_DX;
    }
    return f;
}

bool cp_plan_fp8_producer(const cp_plan *P, const cp_step *s, int op, uint8_t copy) {
    bool out, amax = true; /* op is an output the kernel writes whole; it can take that output's amax */
    switch (s->task) {
    case CP_TASK_NORM1:
    case CP_TASK_NORM2: out = op == 2; break;          /* x, weight, out, rstd */
    case CP_TASK_NORM1_BWD:
    case CP_TASK_NORM2_BWD: out = op == 5; break;      /* dout, x, weight, rstd, dresid, dx, dweight, parts */
    case CP_TASK_SWIGLU: out = op == 2; break;         /* gate, up, out */
    case CP_TASK_SWIGLU_BWD: out = op == 1 || op == 2; break; /* dout, gate <- dgate, up <- dup */
    case CP_TASK_UNPACK_O: out = op == 1; break;       /* the attention output's heads, its rows */
    case CP_TASK_ROPE_DQ:
    case CP_TASK_ROPE_DK: out = op == 0, amax = false; break; /* dq, dk in place */
    default: return false;
    }
    if (!out) return false;
    if (copy == CP_GEMM_SCALE_TENSOR) return amax;
    if (s->module < 0 || s->module >= P->nmodules) return false;
    const cp_kernel_spec *k = &P->modules[s->module];
    /* the kernel's rows split into blocks of 128; or held whole, for one scale each */
    return copy == CP_GEMM_SCALE_1D ? cp_k_fp8_copies(k, s->role)
                                    : copy == CP_GEMM_SCALE_ROW && cp_k_fp8_row_copies(k, s->role);
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

/* A kernel step of the fp8 module beside GEMM g that measures for or writes copy c: its place in the program and its
 * kernel (the role its task and copy name: amax_e4m3, cast_t_e5m2, cast_1d_e4m3, cast_t_2d_e4m3, ...), no operands
 * yet. */
static cp_step *cast_step(program *q, const cp_step *g, int module, cp_task task, cp_fp8_copy c) {
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
    k.fp8 = c;
    const char *fmt = c.fmt == CP_GEMM_E5M2 ? "e5m2" : "e4m3", *t = c.both ? "_rt" : c.transposed ? "_t" : "";
    const char *all = c.layers > 1 ? "_layers" : ""; /* every layer's weight at once */
    if (task == CP_TASK_FP8_AMAX) snprintf(k.role, sizeof k.role, "amax_%s", fmt);
    else if (task == CP_TASK_FP8_CAST) snprintf(k.role, sizeof k.role, "cast%s_%s", t, fmt);
    else
        snprintf(k.role, sizeof k.role, "cast%s_%s%s%s_%s", t,
                 c.scale == CP_GEMM_SCALE_2D ? "2d" : c.scale == CP_GEMM_SCALE_ROW ? "row" : "1d",
                 c.from_rows && !c.both ? "8" : "", all, fmt);
    snprintf(k.what, sizeof k.what, "%s", cp_task_name(task));
    return append(q, &k);
}

/* A step that stands at the program's start, in no layer (the place cast_step and zero_of copy from it) */
static cp_step at_start(void) {
    cp_step z;
    memset(&z, 0, sizeof z);
    z.phase = CP_PHASE_FWD;
    z.layer = z.stage = z.tile = z.ring_step = z.ring_part = -1;
    return z;
}

/* A memset of bytes [off, off + bytes) of buffer buf, which holds nothing live before, beside step g (NULL: at the
 * start of the program) */
static cp_step zero_of(const cp_step *g, int buf, int64_t off, int64_t bytes) {
    const cp_step start = at_start();
    if (!g) g = &start;
    cp_step z;
    memset(&z, 0, sizeof z);
    z.kind = CP_OP_MEMSET;
    z.phase = g->phase;
    z.stream = CP_STREAM_COMPUTE;
    z.layer = g->layer;
    z.stage = g->stage;
    z.tile = g->tile;
    z.ring_step = g->ring_step;
    z.ring_part = g->ring_part;
    z.module = -1;
    snprintf(z.what, sizeof z.what, "zero");
    operand(&z, buf, off, bytes, CP_DEF);
    z.count = bytes;
    z.bytes = (double)bytes;
    return z;
}
static cp_step *zero_step(program *q, const cp_step *g, int buf, int64_t off, int64_t bytes) {
    cp_step z = zero_of(g, buf, off, bytes);
    return append(q, &z);
}

/* A tensor measured or cast: the operand it is read from (with its stride in a loop's body), its shape, format */
typedef struct {
    int buf;
    int64_t offset, bytes, stride, rows, cols, ld;
    uint8_t fmt; /* cp_gemm_type */
} source;

/* The copy an input of a GEMM reads: of what, transposed or not, with which scales (cp_gemm_scale) */
typedef struct {
    source src;
    bool transposed;
    uint8_t scale;
} copy_need;

/* What a scale slot or a copy buffer holds now; in_body: made in the loop body being lowered */
typedef struct {
    bool valid, in_body;
    source src;
    int64_t used; /* slots: when last read, for the least recently used */
} slot_state;
typedef struct {
    bool valid, in_body, transposed;
    source src;
    int slot; /* the scale it was cast with, which the GEMM reads beside it */
} copy_state;
typedef struct {
    slot_state slot[MAX_SLOTS];
    copy_state copy[MAX_COPIES];
    int64_t clock;
    bool body;       /* lowering a loop's body */
    int64_t repeats; /* its repeats (1 outside): a strided write covers every tile's rows */
} cache;

typedef struct {
    char what[40]; /* the GEMM */
    int input;
} weight_role;

/* A weight cast for every layer at once (cp_plan.fp8_weights_once): where it lies in a layer's parameters, its shape,
 * and the buffers of every layer's copies as rows [0] and transposed [1] (cp_fp8_layers_scales_off's layout) */
#define MAX_LAYERED 16
typedef struct {
    int64_t rel, rows, cols;
    uint8_t scale; /* CP_GEMM_SCALE_ROW or CP_GEMM_SCALE_2D */
    int buf[2];
    int64_t scales_off, pitch[2]; /* bytes: where the scales start in each buffer; floats: a layer's scales apart */
} layered_weight;

typedef struct {
    cp_plan *P;
    program q;
    int region; /* where the stretch of q being lowered starts: a loop body's first step, or the step after one */
    bool in_body; /* that stretch is a loop's body, where an operand's stride moves it from tile to tile */
    int end;    /* and where it ends in the planner's steps: its loop's end, or the next loop's first step */
    int module, state;
    int copy_buf[MAX_COPIES]; /* the plan's buffer of each copy */
    weight_role role[MAX_ROLES];
    int nroles;
    int *moved; /* where each of the planner's steps lowered so far starts in q (-1: not yet) */
    int nmoved;
    layered_weight lw[MAX_LAYERED];
    int nlw;
    int params;                   /* the buffer of those weights */
    int64_t layer0, layer_stride; /* bytes: layer 0's parameters in it, and from a layer's to the next */
} lowering;

/* Step z put before step i of q: the steps from i on, and where the planner's steps lowered from them start, move
 * one on */
static void insert_step(lowering *L, int i, const cp_step *z) {
    append(&L->q, z);
    memmove(&L->q.steps[i + 1], &L->q.steps[i], sizeof *L->q.steps * (size_t)(L->q.n - 1 - i));
    L->q.steps[i] = *z;
    for (int j = 0; j < L->nmoved; j++)
        if (L->moved[j] > i) L->moved[j]++;
}

static bool same_source(const source *a, const source *b) {
    return a->buf == b->buf && a->offset == b->offset && a->bytes == b->bytes && a->stride == b->stride &&
           a->rows == b->rows && a->cols == b->cols && a->ld == b->ld && a->fmt == b->fmt;
}

static bool overlaps(const source *s, int buf, int64_t lo, int64_t hi) {
    return s->buf == buf && s->offset < hi && lo < s->offset + s->bytes;
}

/* What step s writes no longer holds a copy or a scale made from it. */
static void forget_writes(cache *c, const cp_step *s) {
    for (int j = 0; j < s->nops; j++) {
        const cp_operand *o = &s->ops[j];
        if (!(o->access & CP_WRITE)) continue;
        int64_t lo = o->offset, hi = o->offset + o->bytes + (c->repeats - 1) * o->stride;
        for (int k = 0; k < MAX_SLOTS; k++)
            if (c->slot[k].valid && overlaps(&c->slot[k].src, o->buf, lo, hi)) c->slot[k].valid = false;
        for (int k = 0; k < MAX_COPIES; k++)
            if (c->copy[k].valid && overlaps(&c->copy[k].src, o->buf, lo, hi)) c->copy[k].valid = false;
    }
}

/* The role of input x of GEMM g when it reads weights, else -1 (an activation or gradient: the input's scratch
 * copy and a shared slot). */
static int weight_role_of(lowering *L, const cp_step *g, int x) {
    if (!reads_weight(L->P, g, x)) return -1;
    for (int r = 0; r < L->nroles; r++)
        if (L->role[r].input == x && !strcmp(L->role[r].what, g->what)) return r;
    if (L->nroles == MAX_ROLES) return -1;
    weight_role *w = &L->role[L->nroles];
    snprintf(w->what, sizeof w->what, "%s", g->what);
    w->input = x;
    char name[48];
    snprintf(name, sizeof name, "fp8_w.%s", g->what);
    L->copy_buf[ROLE0 + L->nroles] = cp_plan_add_buf(L->P, name, CP_SPACE_GPU, CP_CAT_FP8, 16, false);
    return L->nroles++;
}

/* The step of this stretch of the program that last wrote src, where it wrote exactly src, a whole contiguous matrix,
 * and is a kernel that can do src's FP8 work as it writes it (an amax, or a copy with `copy`'s scales:
 * cp_plan_fp8_producer) with room for `ops` more operands; its index and src's operand there (*out), else -1.
 * Outside a loop's body a stride moves nothing: the one tile of an MLP of one tile reads its rows with the tile's
 * stride from the norm that wrote them without. */
static int producer_of(const lowering *L, const source *src, uint8_t copy, int ops, int *out) {
    if (src->ld != src->cols || src->rows * src->cols * 2 != src->bytes) return -1;
    for (int i = L->q.n - 1; i >= L->region; i--) {
        const cp_step *p = &L->q.steps[i];
        int o = -1;
        for (int j = 0; j < p->nops; j++) {
            const cp_operand *w = &p->ops[j];
            if ((w->access & CP_WRITE) && overlaps(src, w->buf, w->offset, w->offset + w->bytes))
                o = w->offset == src->offset && w->bytes == src->bytes && (w->stride == src->stride || !L->in_body)
                        ? j : -2;
        }
        if (o == -1) continue;
        bool done = false; /* a kernel entry does one FP8 work on an output: a later reader must make its own */
        for (int j = 0; j < p->nfp8_out; j++) done |= p->fp8_out[j].out == o;
        /* a launch of a ring's run of rows (ring_part: rope's, one a run) names the whole output, may write a part */
        if (o < 0 || p->kind != CP_OP_KERNEL || p->ring_part >= 0 || !cp_plan_fp8_producer(L->P, p, o, copy) || done ||
            p->nfp8_out == 2 || p->nops + ops > CP_MAX_OPERANDS)
            return -1;
        *out = o;
        return i;
    }
    return -1;
}

/* Whether a step of the program from step i on touches bytes [lo, hi) of buffer buf */
static bool touched_from(const lowering *L, int i, int buf, int64_t lo, int64_t hi) {
    for (; i < L->q.n; i++)
        for (int j = 0; j < L->q.steps[i].nops; j++) {
            const cp_operand *o = &L->q.steps[i].ops[j];
            if (o->buf == buf && o->offset < hi && lo < o->offset + o->bytes) return true;
        }
    return false;
}

/* Slot k filled with src's amax by the kernel that wrote src (producer_of), where no step since touches the slot.
 * Whether it was so attached (for src's format). */
static bool fuse_amax(lowering *L, const source *src, int k) {
    int out, i = producer_of(L, src, CP_GEMM_SCALE_TENSOR, 1, &out);
    if (i < 0 || touched_from(L, i, L->state, SLOT(k), SLOT(k + 1))) return false;
    cp_step *p = &L->q.steps[i];
    p->fp8_out[p->nfp8_out++] =
        (cp_step_fp8_out){.kind = CP_FP8_OUT_AMAX, .out = (int8_t)out, .slot = (int8_t)p->nops, .scales = -1,
                          .col_max = -1, .fmt = src->fmt};
    operand(p, L->state, SLOT(k), CP_FP8_SLOT_BYTES, CP_RW);
    return true;
}

/* The scale slot holding src's amax: one that holds it already, else a fresh amax (into the role's slot, or the
 * least recently used shared one), by the kernel that wrote src where it can, else by a pass of its own. */
static int measure(lowering *L, cache *c, const cp_step *g, int x, int role, const source *src, cp_operand op) {
    for (int k = 0; k < MAX_SLOTS; k++)
        if (c->slot[k].valid && same_source(&c->slot[k].src, src)) {
            c->slot[k].used = ++c->clock;
            return k;
        }
    int k = ACT_SLOTS + role;
    if (role < 0) /* an empty slot, else the least recently used */
        for (int j = k = 0; j < ACT_SLOTS && c->slot[k].valid; j++)
            if (!c->slot[j].valid || c->slot[j].used < c->slot[k].used) k = j;
    for (int j = 0; j < MAX_COPIES; j++)
        if (c->copy[j].valid && c->copy[j].slot == k) c->copy[j].valid = false;
    c->slot[k] = (slot_state){.valid = true, .in_body = c->body, .src = *src, .used = ++c->clock};
    if (!fuse_amax(L, src, k)) {
        cp_step *s = cast_step(&L->q, g, L->module, CP_TASK_FP8_AMAX, (cp_fp8_copy){.fmt = src->fmt});
        op.access = CP_READ;
        s->ops[s->nops++] = op;
        operand(s, L->state, PARTS(x), CP_FP8_AMAX_PARTS * 4, CP_RW);
        operand(s, L->state, COUNTER(x), 4, CP_RW);
        operand(s, L->state, SLOT(k), 16, CP_RW);
        s->count = src->rows;
        s->heads = src->cols;
        s->ld = src->ld;
        s->bytes = (double)src->rows * (double)src->cols * 2;
    }
    return k;
}

/* The block scales (cp_gemm_scale scale) of a copy [rows][cols] in copy buffer buf: behind the copy's bytes, on a
 * 256-byte boundary */
static cp_operand block_scales(int buf, int64_t rows, int64_t cols, uint8_t scale, int access) {
    return (cp_operand){.buf = buf, .offset = cp_fp8_layers_scales_off(1, rows, cols),
                        .bytes = 4 * cp_fp8_scales(scale, rows, cols), .access = access};
}

/* The cast that writes copy k of src with its scales (the operand `scales`), the copy [cols][rows] when
 * transposed; source operand op. */
static void cast_block(lowering *L, const cp_step *g, cp_operand op, const source *src, int k, bool transposed,
                       uint8_t scale, cp_operand scales) {
    cp_step *s = cast_step(&L->q, g, L->module, CP_TASK_FP8_CAST_BLOCK,
                           (cp_fp8_copy){.fmt = src->fmt, .scale = scale, .transposed = transposed});
    op.access = CP_READ;
    s->ops[s->nops++] = op;
    operand(s, L->copy_buf[k], 0, src->rows * src->cols, CP_DEF); /* what the buffer held before is not read */
    s->ops[s->nops++] = scales;
    s->count = src->rows;
    s->heads = src->cols;
    s->ld = src->ld;
    /* a transposed copy with row scales reads its source twice: once for the columns' maxima, once to cast */
    const double reads = scale == CP_GEMM_SCALE_ROW && transposed ? 2 : 1;
    s->bytes = (double)src->rows * (double)src->cols * (2 * reads + 1) + (double)scales.bytes;
}

/* Input x of GEMM g as the copy it reads, as the GEMM on FP8 inputs takes it (x W^T) */
static copy_need need_of(const cp_plan *P, const cp_step *g, int x) {
    const cp_gemm *m = &g->gemm, f = cp_plan_fp8_gemm(P, g);
    const cp_operand *op = &g->ops[x];
    copy_need n = {.src = {.buf = op->buf, .offset = op->offset, .bytes = op->bytes, .stride = op->stride}};
    if (x == 0) {
        n.src.rows = m->trans_a ? m->k : m->m, n.src.cols = m->trans_a ? m->m : m->k, n.src.ld = m->lda;
        n.src.fmt = f.a_type, n.transposed = m->trans_a, n.scale = f.a_scale;
    } else {
        n.src.rows = m->trans_b ? m->n : m->k, n.src.cols = m->trans_b ? m->k : m->n, n.src.ld = m->ldb;
        n.src.fmt = f.b_type, n.transposed = !m->trans_b, n.scale = f.b_scale;
    }
    return n;
}

/* The input (0 or 1) of the next GEMM in this stretch of the program after g that reads src transposed or not, as
 * `transposed` says, with scales of kind `scale` (ANY_SCALE: any), before anything writes src; else -1. */
#define ANY_SCALE 0xff
static int later_read(const lowering *L, const cp_step *g, const source *src, bool transposed, uint8_t scale) {
    const cp_plan *P = L->P;
    for (const cp_step *h = g + 1; h < P->steps + L->end; h++) {
        if (cp_plan_fp8_eligible(&P->spec.train, h))
            for (int y = 0; y < 2; y++) {
                copy_need o = need_of(P, h, y);
                if ((scale == ANY_SCALE || o.scale == scale) && o.transposed == transposed && same_source(&o.src, src))
                    return y;
            }
        for (int j = 0; j < h->nops; j++)
            if ((h->ops[j].access & CP_WRITE) &&
                overlaps(src, h->ops[j].buf, h->ops[j].offset, h->ops[j].offset + h->ops[j].bytes))
                return -1;
    }
    return -1;
}

/* Whether copy e is still wanted from GEMM g on: g reads it (as either input) or a later GEMM of this stretch does */
static bool wanted(const lowering *L, const cp_step *g, const copy_state *e) {
    if (!e->valid) return false;
    for (int y = 0; y < 2; y++) {
        copy_need o = need_of(L->P, g, y);
        if (o.transposed == e->transposed && same_source(&o.src, &e->src)) return true;
    }
    return later_read(L, g, &e->src, e->transposed, ANY_SCALE) >= 0;
}

/* The block scales (cp_gemm_scale scale) of copy k of src, [cols][rows] when transposed, its buffer grown to hold
 * the copy and them; a transposed copy with row scales has its cast's column maxima behind them */
static cp_operand copy_scales(lowering *L, int k, const source *src, bool transposed, uint8_t scale) {
    cp_operand sc = block_scales(L->copy_buf[k], transposed ? src->cols : src->rows,
                                 transposed ? src->rows : src->cols, scale, CP_DEF);
    if (scale == CP_GEMM_SCALE_ROW && transposed) sc.bytes += 4 * cp_fp8_row_parts(src->rows, src->cols);
    cp_buffer *b = &L->P->bufs[L->copy_buf[k]];
    b->bytes = CP_MAX(b->bytes, sc.offset + sc.bytes);
    return sc;
}

/* Copy k of src as rows with `scale`'s scales (1 x 128 or row), written by producer p beside its output operand out;
 * with a col_max operand (access CP_RW, or .buf -1 for none) also the transposed copy's column maxima; with k < 0 those
 * maxima alone */
static void producer_copy(lowering *L, cp_step *p, int out, const source *src, int k, uint8_t scale,
                          cp_operand col_max) {
    const bool maxima = col_max.buf >= 0;
    cp_step_fp8_out a = {.kind = CP_FP8_OUT_MAXIMA, .out = (int8_t)out, .slot = -1, .scales = -1, .col_max = -1,
                         .fmt = src->fmt, .scale = scale};
    if (k >= 0) {
        a.kind = CP_FP8_OUT_COPY;
        a.slot = (int8_t)p->nops;
        a.scales = (int8_t)(p->nops + 1);
        operand(p, L->copy_buf[k], 0, src->rows * src->cols, CP_DEF);
        p->ops[p->nops++] = copy_scales(L, k, src, false, scale);
    }
    if (maxima) {
        a.col_max = (int8_t)p->nops;
        p->ops[p->nops++] = col_max;
    }
    p->fp8_out[p->nfp8_out++] = a;
}

/* A copy buffer for a copy a producer makes at step i for GEMM g: input x's scratch copy (x >= 0; the next cast for
 * that input overwrites it, so not for a copy only later GEMMs read), else one kept for copies made ahead; one that no
 * step since touches, that holds nothing still wanted, and not `other`. -1 if none. */
static int free_copy(const lowering *L, const cache *c, const cp_step *g, int i, int x, int other) {
    for (int k = x >= 0 ? x : AHEAD; k < ROLE0; k = k < AHEAD ? AHEAD : k + 1) {
        if (k == other || wanted(L, g, &c->copy[k]) || touched_from(L, i, L->copy_buf[k], 0, INT64_MAX))
            continue;
        return k;
    }
    return -1;
}

/* Input x's copy of src for GEMM g, as rows with `scale`'s scales, written by the kernel that wrote src (producer_of):
 * with 1 x 128 blocks into the input's scratch copy, else into the one kept for copies made ahead for it, the first
 * that no step since touches (the choice the default recipe was measured with); with row scales into any buffer
 * free_copy finds (the recompute's normed input, read by q, k and v after the MLP's backward, keeps its copy). The
 * copy it went to, or -1. */
static int fuse_copy(lowering *L, const cache *c, const cp_step *g, const source *src, int x, uint8_t scale) {
    int out, i = producer_of(L, src, scale, 2, &out), k = -1;
    if (i < 0) return -1;
    if (scale == CP_GEMM_SCALE_ROW) k = free_copy(L, c, g, i, x, -1);
    for (int j = x; scale == CP_GEMM_SCALE_1D && j <= AHEAD + x && k < 0; j += AHEAD)
        if (!touched_from(L, i, L->copy_buf[j], 0, INT64_MAX)) k = j;
    if (k >= 0) producer_copy(L, &L->q.steps[i], out, src, k, scale, (cp_operand){.buf = -1});
    return k;
}

/* Whether src can be cast both ways by one step with scales of kind `scale`: 1 x 128 blocks on both sides (one
 * read), or row scales on rows held whole (cast_rt_row: the source read once more for the transposed copy, or the row
 * copy just written, instead of twice) */
static bool casts_both(const source *src, uint8_t scale) {
    if (scale == CP_GEMM_SCALE_1D) return src->rows % 128 == 0 && src->cols % 128 == 0;
    return scale == CP_GEMM_SCALE_ROW && src->rows % 16 == 0 && src->cols % 32 == 0 && cp_fp8_row_held(src->cols);
}

/* The cast of src into copy kr [rows][cols] and copy kt [cols][rows], their scales sr and st (casts_both). With row
 * scales the transposed copy's column maxima gather in the parts behind st, which a memset step zeroes first; its
 * second launch then casts the transposed copy from the row copy the first wrote where the columns come in strips of
 * CP_FP8_ROW8_COLS (cp_fp8_copy.from_rows: one byte read an element instead of two), else from src again. */
static void cast_both(lowering *L, const cp_step *g, cp_operand op, const source *src, uint8_t scale, int kr,
                      cp_operand sr, int kt, cp_operand st) {
    const bool row = scale == CP_GEMM_SCALE_ROW;
    const int64_t n = src->rows * src->cols, parts = row ? 4 * cp_fp8_row_parts(src->rows, src->cols) : 0;
    if (row) zero_step(&L->q, g, st.buf, st.offset + st.bytes - parts, parts);
    const bool from_rows = row && src->cols % CP_FP8_ROW8_COLS == 0;
    cp_step *s = cast_step(&L->q, g, L->module, CP_TASK_FP8_CAST_BLOCK,
                           (cp_fp8_copy){.fmt = src->fmt, .scale = scale, .both = true, .from_rows = from_rows});
    op.access = CP_READ;
    s->ops[s->nops++] = op;
    operand(s, L->copy_buf[kr], 0, n, CP_DEF);
    s->ops[s->nops++] = sr;
    operand(s, L->copy_buf[kt], 0, n, row ? CP_WRITE : CP_DEF); /* with row scales the memset began its lifetime */
    if (row) st.access = CP_RW;
    s->ops[s->nops++] = st;
    s->count = src->rows;
    s->heads = src->cols;
    s->ld = src->ld;
    /* 1 x 128 blocks: one read, two copies; row scales: a second read for the transposed copy, of the source's two
     * bytes an element or the row copy's one and its scales */
    s->bytes = (double)n * (!row ? 4 : from_rows ? 5 : 6) + (double)(sr.bytes + st.bytes) +
               (from_rows ? 4.0 * (double)src->rows : 0.0);
}

/* Both row-scaled copies of src (both), for GEMM g's input x (transposed or not) and a later GEMM the other way round,
 * or (!both) the transposed copy alone for g, by src's producer (producer_of) and one cast: the producer writes the
 * copy as rows (both) and gathers the transposed copy's column maxima in the parts behind its scales, zeroed by a
 * memset put just before it; then a cast of the transposed copy alone (cp_fp8_copy.maxima) reads src once, where
 * cast_both's two launches (or a transposed cast's) read it twice; with both it reads the row copy and its scales
 * instead (cp_fp8_copy.from_rows: half the bytes, and src itself may then go unread: drop_unread_outputs). The copies
 * go to buffers no step since the producer touches (free_copy): *now g's, *later the other. Whether it was so made. */
static bool fuse_row(lowering *L, const cache *c, const cp_step *g, int x, const source *src, bool transposed,
                     bool both, int *now, int *later) {
    int out, i = producer_of(L, src, CP_GEMM_SCALE_ROW, both ? 3 : 1, &out), a = -1, b = -1;
    if (i < 0 || (a = free_copy(L, c, g, i, x, -1)) < 0 || (both && (b = free_copy(L, c, g, i, -1, a)) < 0))
        return false;
    *now = a;
    *later = b;
    const int kr = transposed ? b : a, kt = transposed ? a : b;
    const cp_operand st = copy_scales(L, kt, src, true, CP_GEMM_SCALE_ROW);
    const int64_t n = src->rows * src->cols, parts = 4 * cp_fp8_row_parts(src->rows, src->cols);
    const cp_operand col_max = {.buf = st.buf, .offset = st.offset + st.bytes - parts, .bytes = parts, .access = CP_RW};
    const cp_step z = zero_of(&L->q.steps[i], col_max.buf, col_max.offset, parts);
    insert_step(L, i, &z);
    producer_copy(L, &L->q.steps[i + 1], out, src, kr, CP_GEMM_SCALE_ROW, col_max);
    const bool from_rows = both && src->cols % CP_FP8_ROW8_COLS == 0;
    const cp_fp8_copy t = {
        .fmt = src->fmt, .scale = CP_GEMM_SCALE_ROW, .transposed = true, .maxima = true, .from_rows = from_rows};
    cp_step *s = cast_step(&L->q, g, L->module, CP_TASK_FP8_CAST_BLOCK, t);
    if (from_rows) operand(s, L->copy_buf[kr], 0, n, CP_READ); /* the row copy, its scales last */
    else s->ops[s->nops] = g->ops[x], s->ops[s->nops++].access = CP_READ;
    operand(s, L->copy_buf[kt], 0, n, CP_WRITE); /* the memset began its lifetime */
    s->ops[s->nops] = st;
    s->ops[s->nops++].access = CP_RW; /* the scales written, the maxima read */
    if (from_rows) {
        s->ops[s->nops] = copy_scales(L, kr, src, false, CP_GEMM_SCALE_ROW);
        s->ops[s->nops++].access = CP_READ;
    }
    s->count = src->rows;
    s->heads = src->cols;
    s->ld = from_rows ? src->cols : src->ld;
    s->bytes = (double)n * (from_rows ? 2 : 3) + (double)st.bytes + (from_rows ? 4.0 * (double)src->rows : 0.0);
    return true;
}

/* The copy GEMM g reads as input x (0: A, 1: B), as n says: one that holds it already, else a fresh one: with
 * 1 x 128 blocks or row scales, written by the kernel that wrote its source where it can (fuse_copy; a transposed
 * row-scaled copy by a cast on the maxima its producer gathered: fuse_row), or by a cast that also writes the copy the
 * other way round when a later GEMM reads it so (into the copy made ahead for that GEMM's input; with row scales both
 * by the source's producer and a cast where it can: fuse_row). Its per-tensor scale slot into *slot (-1 with block
 * and row scales, which the copy's buffer holds). */
static int copy_of(lowering *L, cache *c, const cp_step *g, int x, const copy_need *n, int *slot) {
    const cp_operand *op = &g->ops[x];
    const source src = n->src;
    const bool transposed = n->transposed;
    const int64_t rows = src.rows, cols = src.cols;
    bool other = false; /* a copy of it held the other way round */
    for (int k = 0; k < MAX_COPIES; k++)
        if (c->copy[k].valid && same_source(&c->copy[k].src, &src)) {
            if (c->copy[k].transposed != transposed) {
                other = true;
                continue;
            }
            *slot = c->copy[k].slot;
            if (*slot >= 0) c->slot[*slot].used = ++c->clock;
            return k;
        }
    int role = weight_role_of(L, g, x), k = role < 0 ? x : ROLE0 + role;
    copy_state made = {.valid = true, .in_body = c->body, .transposed = transposed, .src = src, .slot = -1};
    if (n->scale) {
        *slot = -1;
        /* a later GEMM's input y reads it the other way round: both copies at once, the second into a copy made
         * ahead for that input that holds nothing a GEMM still reads */
        int y = !other && casts_both(&src, n->scale) ? later_read(L, g, &src, !transposed, n->scale) : -1, k2 = -1;
        for (int j = 0; y >= 0 && j < AHEAD_SETS && k2 < 0; j++)
            if (!wanted(L, g, &c->copy[AHEAD + 2 * j + y])) k2 = AHEAD + 2 * j + y;
        if (k2 < 0) {
            int f = n->scale != CP_GEMM_SCALE_2D && !transposed && role < 0 ? fuse_copy(L, c, g, &src, x, n->scale)
                                                                            : -1;
            if (f >= 0) k = f;
            else if (n->scale == CP_GEMM_SCALE_ROW && transposed && role < 0 &&
                     fuse_row(L, c, g, x, &src, true, false, &f, &k2))
                k = f;
            else cast_block(L, g, *op, &src, k, transposed, n->scale, copy_scales(L, k, &src, transposed, n->scale));
            c->copy[k] = made;
            return k;
        }
        if (n->scale != CP_GEMM_SCALE_ROW || role >= 0 || !fuse_row(L, c, g, x, &src, transposed, true, &k, &k2)) {
            cp_operand s1 = copy_scales(L, k, &src, transposed, n->scale);
            cp_operand s2 = copy_scales(L, k2, &src, !transposed, n->scale);
            if (transposed) cast_both(L, g, *op, &src, n->scale, k2, s2, k, s1);
            else cast_both(L, g, *op, &src, n->scale, k, s1, k2, s2);
        }
        c->copy[k] = made;
        c->copy[k2] = made;
        c->copy[k2].transposed = !transposed;
        return k;
    }
    *slot = measure(L, c, g, x, role, &src, *op);
    made.slot = *slot;
    c->copy[k] = made;
    cp_buffer *b = &L->P->bufs[L->copy_buf[k]];
    b->bytes = CP_MAX(b->bytes, rows * cols);
    cp_step *s = cast_step(&L->q, g, L->module, CP_TASK_FP8_CAST, (cp_fp8_copy){.fmt = src.fmt, .transposed = transposed});
    s->ops[s->nops] = *op;
    s->ops[s->nops++].access = CP_READ;
    operand(s, L->state, SLOT(*slot), 16, CP_READ);
    operand(s, L->copy_buf[k], 0, rows * cols, CP_DEF); /* what the buffer held before is no longer read */
    s->count = rows;
    s->heads = cols;
    s->ld = src.ld;
    s->bytes = (double)rows * (double)cols * 3;
    return k;
}

/* Whether input x of GEMM g (as n says) is a weight the plan casts for every layer at once (cp_plan.fp8_weights_once):
 * E4M3 in its layer's parameters (not gathered), in 128 x 128 tiles or row-scaled as cast_rt_row and cast_t_row8 take
 * it; its offset in a layer's parameters into *rel. */
static bool weight_once(const lowering *L, const cp_step *g, int x, const copy_need *n, int64_t *rel) {
    const cp_plan *P = L->P;
    const cp_operand *op = &g->ops[x];
    const int64_t rows = n->src.rows, cols = n->src.cols, layers = P->spec.model.layers;
    const bool row = n->scale == CP_GEMM_SCALE_ROW;
    if (!P->fp8_weights_once || g->layer < 0 || P->bufs[op->buf].cat != CP_CAT_PARAMS ||
        (!row && n->scale != CP_GEMM_SCALE_2D) || n->src.fmt != CP_GEMM_E4M3 || n->src.ld != cols ||
        op->bytes != rows * cols * 2 || (row && (!casts_both(&n->src, CP_GEMM_SCALE_ROW) || cols % CP_FP8_ROW8_COLS)))
        return false;
    *rel = op->offset - (L->layer0 + g->layer * L->layer_stride);
    return *rel >= 0 && *rel + op->bytes <= L->layer_stride && *rel % 16 == 0 &&
           L->layer0 + (layers - 1) * L->layer_stride + *rel + op->bytes <= P->bufs[op->buf].bytes;
}

/* The entry of L->lw for the weight at rel in a layer's parameters, as n reads it, else -1 */
static int find_layered(const lowering *L, int64_t rel, const copy_need *n) {
    for (int w = 0; w < L->nlw; w++)
        if (L->lw[w].rel == rel && L->lw[w].rows == n->src.rows && L->lw[w].cols == n->src.cols &&
            L->lw[w].scale == n->scale)
            return w;
    return -1;
}

/* The entry of L->lw that input x of GEMM g reads, else -1 */
static int layered_of(const lowering *L, const cp_step *g, int x, const copy_need *n) {
    int64_t rel;
    return weight_once(L, g, x, n, &rel) ? find_layered(L, rel, n) : -1;
}

/* cp_plan.fp8_weights_once: each weight a GEMM reads, of every layer, cast both ways once at the program's start
 * into buffers of its own (row scales: cast_rt_row_layers, then the transposed copies from the row copies; tiles:
 * cast_2d_layers and cast_t_2d_layers), which every layer's GEMMs read in the forward, the recompute and the backward
 * alike. A micro-batch so makes 7 casts instead of 14 a layer, each over every layer's weight at once where one
 * layer's k_proj was too small to fill the GPU, and reads each weight once or twice where the per-layer casts read it
 * in the forward and again in the backward: the 3B step at 32K keeps 5.7 GB of copies for 7-8 ms of its casts
 * (docs/PERF.md). The flag is cleared where no weight qualifies (weight_once). */
static void cast_weights_once(lowering *L) {
    cp_plan *P = L->P;
    const int64_t layers = P->spec.model.layers;
    const cp_step start = at_start();
    L->layer0 = P->unit_shard_off[1] * 2;
    L->layer_stride = P->unit_padded[1] * 2;
    for (int i = 0; i < P->nsteps; i++) {
        const cp_step *g = &P->steps[i];
        if (!cp_plan_fp8_eligible(&P->spec.train, g)) continue;
        for (int x = 0; x < 2; x++) {
            copy_need n = need_of(P, g, x);
            int64_t rel;
            if (!weight_once(L, g, x, &n, &rel) || find_layered(L, rel, &n) >= 0 || L->nlw == MAX_LAYERED) continue;
            L->params = g->ops[x].buf;
            layered_weight *w = &L->lw[L->nlw++];
            *w = (layered_weight){.rel = rel, .rows = n.src.rows, .cols = n.src.cols, .scale = n.scale,
                                  .scales_off = cp_fp8_layers_scales_off(layers, n.src.rows, n.src.cols)};
            for (int t = 0; t < 2; t++) {
                char name[48];
                snprintf(name, sizeof name, "fp8_w.%s%s", g->what, t ? ".t" : "");
                w->pitch[t] = cp_fp8_layers_pitch(w->scale, w->rows, w->cols, t);
                w->buf[t] = cp_plan_add_buf(P, name, CP_SPACE_GPU, CP_CAT_FP8, w->scales_off + layers * w->pitch[t] * 4,
                                            false);
            }
        }
    }
    P->fp8_weights_once = L->nlw > 0;
    P->fp8_weights_bytes = 0;
    for (int k = 0; k < L->nlw; k++) {
        const layered_weight *w = &L->lw[k];
        const int64_t n = w->rows * w->cols, so = w->scales_off, pr = w->pitch[0], pt = w->pitch[1];
        const bool row = w->scale == CP_GEMM_SCALE_ROW;
        /* row scales: the transposed copies' maxima gather by atomics into zeroed parts */
        if (row) zero_step(&L->q, NULL, w->buf[1], so, layers * pt * 4);
        cp_step *s = cast_step(&L->q, &start, L->module, CP_TASK_FP8_CAST_BLOCK,
                               (cp_fp8_copy){.fmt = CP_GEMM_E4M3, .scale = w->scale, .both = true, .from_rows = row,
                                             .layers = (uint16_t)layers, .src_stride = L->layer_stride / 2});
        operand(s, L->params, L->layer0 + w->rel, (layers - 1) * L->layer_stride + 2 * n, CP_READ);
        operand(s, w->buf[0], 0, layers * n, CP_DEF);
        operand(s, w->buf[0], so, layers * pr * 4, CP_DEF);
        operand(s, w->buf[1], 0, layers * n, row ? CP_WRITE : CP_DEF); /* with row scales the memset began it */
        operand(s, w->buf[1], so, layers * pt * 4, row ? CP_RW : CP_DEF);
        s->count = w->rows;
        s->heads = w->cols;
        s->ld = w->cols;
        /* each layer: the weight read, its row copy written (and read again with row scales), the transposed copy
         * written (with tiles from the weight read again), the scales */
        s->bytes = (double)layers * ((row ? 5.0 : 6.0) * (double)n + 4.0 * (double)((row ? 2 : 1) * pr + pt));
        P->fp8_weights_bytes += P->bufs[w->buf[0]].bytes + P->bufs[w->buf[1]].bytes;
    }
}

/* Where a GEMM reads an input's copy: a copy buffer from its start, the scales behind (copy_of's), or a layer's slice
 * of a weight cast for every layer (layered_ref) */
typedef struct {
    int buf;
    int64_t off, scales; /* the copy's offset, its scales' (-1: behind the copy, as block_scales puts them) */
} copy_ref;
/* Layer `layer`'s copy of L->lw[w], transposed or not */
static copy_ref layered_ref(const lowering *L, int w, int layer, bool transposed) {
    const layered_weight *e = &L->lw[w];
    return (copy_ref){.buf = e->buf[transposed], .off = layer * e->rows * e->cols,
                      .scales = e->scales_off + layer * e->pitch[transposed] * 4};
}

/* Step g of the program: an eligible GEMM on its inputs' copies (made here unless held), anything else as it is. */
static void lower_step(lowering *L, cache *c, const cp_step *g) {
    if (!cp_plan_fp8_eligible(&L->P->spec.train, g)) {
        append(&L->q, g);
        forget_writes(c, g);
        return;
    }
    const cp_gemm *m = &g->gemm, fg = cp_plan_fp8_gemm(L->P, g);
    int slot[2] = {-1, -1};
    copy_ref ref[2];
    for (int x = 0; x < 2; x++) {
        copy_need n = need_of(L->P, g, x);
        const int w = layered_of(L, g, x, &n);
        if (w >= 0) ref[x] = layered_ref(L, w, g->layer, n.transposed);
        else ref[x] = (copy_ref){.buf = L->copy_buf[copy_of(L, c, g, x, &n, &slot[x])], .scales = -1};
    }
    cp_step *f = append(&L->q, g);
    f->gemm = fg;
    f->ops[0] = (cp_operand){.buf = ref[0].buf, .offset = ref[0].off, .bytes = m->m * m->k, .access = CP_READ};
    f->ops[1] = (cp_operand){.buf = ref[1].buf, .offset = ref[1].off, .bytes = m->n * m->k, .access = CP_READ};
    /* A, B, (C), D, then the scales: room for two more */
    if (fg.a_scale) {
        const int64_t rows[2] = {m->m, m->n};
        const uint8_t scale[2] = {fg.a_scale, fg.b_scale};
        for (int x = 0; x < 2; x++) {
            cp_operand sc = block_scales(ref[x].buf, rows[x], m->k, scale[x], CP_READ);
            if (ref[x].scales >= 0) sc.offset = ref[x].scales;
            f->ops[f->nops++] = sc;
        }
    } else {
        operand(f, L->state, SLOT(slot[0]), 16, CP_READ);
        operand(f, L->state, SLOT(slot[1]), 16, CP_READ);
    }
    forget_writes(c, g);
}

/* A folded run's body stands for every tile between its first and last: what it reads from before it must hold
 * in every repeat. So it starts from what the cache held that a trial run over the body leaves untouched, found
 * again until nothing more drops; and leaves behind nothing it made from a tile's rows (whose repeats move on). A
 * trial lowers the body as the real run does (its steps then dropped), so that both choose alike where a copy or an
 * amax goes. */
static void lower_body(lowering *L, cache *c, const cp_loop *loop) {
    cache start = *c;
    start.body = true;
    start.repeats = loop->count;
    for (int k = 0; k < MAX_SLOTS; k++) start.slot[k].in_body = false;
    for (int k = 0; k < MAX_COPIES; k++) start.copy[k].in_body = false;
    const int region = L->region = L->q.n;
    L->in_body = true;
    L->end = loop->first + loop->nsteps;
    for (bool dropped = true; dropped;) {
        cache t = start;
        for (int j = 0; j < loop->nsteps; j++) lower_step(L, &t, &L->P->steps[loop->first + j]);
        L->q.n = region;
        dropped = false;
        for (int k = 0; k < MAX_SLOTS; k++)
            if (start.slot[k].valid && !(t.slot[k].valid && !t.slot[k].in_body))
                start.slot[k].valid = false, dropped = true;
        for (int k = 0; k < MAX_COPIES; k++) {
            const copy_state *e = &start.copy[k];
            if (e->valid && (!(t.copy[k].valid && !t.copy[k].in_body) || (e->slot >= 0 && !start.slot[e->slot].valid)))
                start.copy[k].valid = false, dropped = true;
        }
    }
    *c = start;
    for (int j = 0; j < loop->nsteps; j++) {
        L->moved[loop->first + j] = L->q.n;
        lower_step(L, c, &L->P->steps[loop->first + j]);
    }
    for (int k = 0; k < MAX_SLOTS; k++)
        if (c->slot[k].in_body && c->slot[k].src.stride) c->slot[k].valid = false;
    for (int k = 0; k < MAX_COPIES; k++)
        if (c->copy[k].in_body && c->copy[k].src.stride) c->copy[k].valid = false;
    c->body = false;
    c->repeats = 1;
    L->region = L->q.n;
    L->in_body = false;
}

bool cp_plan_fp8_kernel_wins(const cp_gemm *g) { return g->w_grad && g->m >= 3072 && g->k >= 8192 && g->k <= 32768; }

/* train.fp8_gemm: each block-scaled FP8 GEMM the generator's kernel takes, and under "auto" where it wins, gets that
 * kernel's module (one per shape) and its entry as the step's module and role; cuBLASLt runs the rest. */
static void choose_kernels(cp_plan *P) {
    const int mode = P->spec.train.fp8_gemm;
    if (mode == CP_FP8_GEMM_CUBLASLT || P->spec.train.fp8_scaling != CP_FP8_SCALING_BLOCK) return;
    for (int i = 0; i < P->nsteps; i++) {
        cp_step *s = &P->steps[i];
        cp_kernel_spec k;
        if (s->kind != CP_OP_GEMM || s->gemm.a_type == CP_GEMM_BF16 ||
            (mode == CP_FP8_GEMM_AUTO && !cp_plan_fp8_kernel_wins(&s->gemm)) ||
            !cp_gemm_fp8_kspec(&s->gemm, (cp_gemm_fp8_cfg){0}, &k))
            continue;
        s->module = cp_plan_module_of(P, &k);
        snprintf(s->role, sizeof s->role, "sm90");
    }
}

/* Whether a step after step i reads bytes of its operand o before a step writes them all anew, taking the steps in
 * the order they run: the rest of a folded loop's body, its next tile's steps up to step i (where a strided operand
 * has moved on: a read of its buffer counts, a write does not), on from the body's end, then the next micro-batch's
 * or step's from the program's start up to step i; yes if none writes them. */
static bool read_later(const cp_plan *P, int i, const cp_operand *o) {
    int first = -1, end = P->nsteps;
    for (int l = 0; l < P->nloops; l++)
        if (i >= P->loops[l].first && i < P->loops[l].first + P->loops[l].nsteps)
            first = P->loops[l].first, end = first + P->loops[l].nsteps;
    const int runs[4][2] = {
        {i + 1, end}, {first, first < 0 ? first : i + 1}, {end, first < 0 ? end : P->nsteps}, {0, i + 1}};
    for (int r = 0; r < 4; r++)
        for (int j = runs[r][0]; j < runs[r][1]; j++) {
            bool anew = false;
            for (int k = 0; k < P->steps[j].nops; k++) {
                const cp_operand *w = &P->steps[j].ops[k];
                if (w->buf != o->buf) continue;
                const bool moved = w->stride || o->stride;
                if ((w->access & CP_READ) &&
                    (moved || (w->offset < o->offset + o->bytes && o->offset < w->offset + w->bytes)))
                    return true;
                anew |= !(w->access & CP_READ) && !moved && w->offset <= o->offset &&
                        o->offset + o->bytes <= w->offset + w->bytes;
            }
            if (anew) return false;
        }
    return true;
}

/* A producer whose output no later step reads, only its FP8 copy (the forward's normed inputs and SwiGLU output:
 * the GEMMs read the copies and the backward recomputes the outputs; with the transposed copies cast from row copies
 * the recompute's normed inputs, dgate and dup too), writes the copy alone (cp_step_fp8_out.copy_only): 0.94 GB of
 * HBM writes a layer of the 3B step at 32K, 2.4 GB with FP8 weights' gradients and row scales. The rmsnorm and
 * SwiGLU forward entries that write copies take a NULL output; SwiGLU's bwd_row, which works in place, is told
 * which of dgate and dup to store. */
static void drop_unread_outputs(cp_plan *P) {
    for (int i = 0; i < P->nsteps; i++) {
        cp_step *s = &P->steps[i];
        const bool fwd = s->task == CP_TASK_NORM1 || s->task == CP_TASK_NORM2 || s->task == CP_TASK_SWIGLU;
        if (s->kind != CP_OP_KERNEL || !(fwd || s->task == CP_TASK_SWIGLU_BWD)) continue;
        for (int j = 0; j < s->nfp8_out; j++) {
            cp_step_fp8_out *a = &s->fp8_out[j];
            if (a->kind != CP_FP8_OUT_COPY || (!fwd && a->scale != CP_GEMM_SCALE_ROW) ||
                read_later(P, i, &s->ops[a->out]))
                continue;
            a->copy_only = true;
            /* the block copies' entries are bound by their bytes; the row entries by their latency, which leaving
             * the output unwritten shortened 3-6% (docs/PERF.md, 2026-12-04, last): priced as before */
            if (a->scale != CP_GEMM_SCALE_ROW) s->bytes -= (double)s->ops[a->out].bytes;
        }
    }
}

void cp_plan_lower_fp8(cp_plan *P) {
    if (!P->spec.train.fp8) return;
    bool any = false;
    for (int i = 0; i < P->nsteps && !any; i++) any = cp_plan_fp8_eligible(&P->spec.train, &P->steps[i]);
    if (!any) return;
    cp_kernel_spec casts;
    cp_k_fp8(&casts);
    lowering L = {.P = P, .module = cp_plan_module_of(P, &casts), .state = -1};
    L.copy_buf[0] = cp_plan_add_buf(P, "fp8_a", CP_SPACE_GPU, CP_CAT_FP8, 16, false);
    L.copy_buf[1] = cp_plan_add_buf(P, "fp8_b", CP_SPACE_GPU, CP_CAT_FP8, 16, false);
    for (int j = 0; j < AHEAD_SETS; j++)
        for (int y = 0; y < 2; y++) {
            char name[32];
            snprintf(name, sizeof name, j ? "fp8_%s_ahead%d" : "fp8_%s_ahead", y ? "b" : "a", j + 1);
            L.copy_buf[AHEAD + 2 * j + y] = cp_plan_add_buf(P, name, CP_SPACE_GPU, CP_CAT_FP8, 16, false);
        }
    if (P->spec.train.fp8_scaling == CP_FP8_SCALING_TENSOR) { /* their slots, the amaxes' counters and parts */
        L.state = cp_plan_add_buf(P, "fp8_state", CP_SPACE_GPU, CP_CAT_FP8, STATE_BYTES, false);
        /* the amax counters start at 0 in every micro-batch (each amax leaves its counter 0 again) */
        zero_step(&L.q, NULL, L.state, 0, STATE_BYTES)->ops[0].access = CP_WRITE;
    }
    cast_weights_once(&L);
    cache c;
    memset(&c, 0, sizeof c);
    c.repeats = 1;
    int *moved = L.moved = cp_xmalloc(sizeof *moved * (size_t)(P->nsteps + 1)); /* each old step's new index, the end */
    L.nmoved = P->nsteps + 1;
    for (int i = 0; i <= P->nsteps; i++) moved[i] = -1;
    for (int i = 0, lp = 0; i < P->nsteps;) {
        if (lp < P->nloops && i == P->loops[lp].first) {
            lower_body(&L, &c, &P->loops[lp]); /* a body's first step starts with its casts */
            i += P->loops[lp++].nsteps;
            continue;
        }
        moved[i] = L.q.n;
        L.end = lp < P->nloops ? P->loops[lp].first : P->nsteps;
        lower_step(&L, &c, &P->steps[i++]);
    }
    moved[P->nsteps] = L.q.n;
    for (int l = 0; l < P->nloops; l++) {
        cp_loop *loop = &P->loops[l];
        int first = moved[loop->first], end = moved[loop->first + loop->nsteps];
        loop->first = first;
        loop->nsteps = end - first;
    }
    P->micro_steps = moved[P->micro_steps];
    free(moved);
    free(P->steps);
    P->steps = L.q.steps;
    P->nsteps = L.q.n;
    P->capsteps = L.q.cap;
    drop_unread_outputs(P);
    choose_kernels(P);
}

/* The consumer warpgroups for m rows by n columns on `sms` SMs: tiles of 192 rows run 12% faster than of 128 on the
 * 3B step's large GEMMs (bench_gemm on an H200: 0.643 s against 0.735 s where the kernel runs, docs/PERF.md,
 * 2026-12-03), but fewer of them may fill the SMs worse: whole waves of tiles times a tile's time, the larger the
 * shorter (a 1024-row weight's gradient: 144 tiles of 192 rows are 2 waves on 132 SMs, as 192 of 128 are). */
int cp_gemm_fp8_consumers(int64_t m, int64_t n, int sms) {
    double best = 0;
    int pick = 2;
    for (int c = 2; c <= 3; c++) {
        const int64_t bm = 64 * c, tiles = (m + bm - 1) / bm * ((n + 127) / 128);
        const double t = (double)((tiles + sms - 1) / sms) * (double)bm / (c == 3 ? 1.12 : 1.0);
        if (c == 2 || t < best) best = t, pick = c;
    }
    return pick;
}

bool cp_gemm_fp8_kspec(const cp_gemm *p, cp_gemm_fp8_cfg cfg, cp_kernel_spec *k) {
    const bool fp8 = p->a_type != CP_GEMM_BF16 && p->b_type != CP_GEMM_BF16;
    if (!fp8 || p->trans_a || !p->trans_b || p->fast_accum || p->a_scale != CP_GEMM_SCALE_1D ||
        p->b_scale == CP_GEMM_SCALE_TENSOR || p->lda != p->k || p->ldb != p->k || p->ldd % 2 || p->m < 1 || p->m % 4 ||
        p->ldd < p->n || (p->out_f32 && !p->accumulate) || (p->has_c && p->accumulate))
        return false;
    cp_gemm_fp8_out out = p->has_c        ? CP_GEMM_FP8_RESIDUAL
                          : !p->accumulate ? CP_GEMM_FP8_WRITE
                          : p->out_f32     ? CP_GEMM_FP8_ADD_F32
                                           : CP_GEMM_FP8_ADD_BF16;
    if (!cfg.consumers && cfg.cluster != 2) cfg.consumers = cp_gemm_fp8_consumers(p->m, p->n, CP_GEMM_FP8_SMS);
    return cp_k_gemm_fp8(k, p->n, p->k, p->a_type == CP_GEMM_E5M2, p->b_type == CP_GEMM_E5M2,
                         p->b_scale == CP_GEMM_SCALE_2D, out, cfg);
}
