/* plan.c: turn a validated spec into the program of one training step for one rank: the UPipe stage table,
 * the ordered steps over named buffers (forward, recompute, backward, optimizer; with a ring, each stage's attention
 * goes round it), and from them each buffer's lifetime and arena offset, the FLOPs and the predicted time. The runtime
 * allocates exactly these arenas. */
#include "plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "doc_work.h"
#include "kernels.h"
#include "kernels_attn.h"
#include "plan_internal.h"
#include "ring.h"
#include "util.h"

/* ---------------------------------------------------------------- builder state */

typedef struct {
    cp_plan *P;
    cp_phase phase;
    int layer, stage, tile;
    int ring_step, ring_part; /* copied into each step (cp_step says what they mean), -1 outside a ring */
} builder;

static int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

/* src into a zeroed field of n bytes, cut as snprintf cuts (a plan names thousands of steps: this is their cost) */
static void set_name(char *dst, size_t n, const char *src) {
    size_t len = strnlen(src, n - 1);
    memcpy(dst, src, len);
}

int cp_plan_add_buf(cp_plan *P, const char *name, cp_space space, cp_cat cat, int64_t bytes, bool persistent) {
    if (P->nbufs == P->capbufs) {
        P->capbufs = P->capbufs ? P->capbufs * 2 : 64;
        P->bufs = cp_xrealloc(P->bufs, sizeof *P->bufs * (size_t)P->capbufs);
    }
    cp_buffer *b = &P->bufs[P->nbufs];
    memset(b, 0, sizeof *b);
    snprintf(b->name, sizeof b->name, "%s", name);
    b->space = space;
    b->cat = cat;
    b->bytes = bytes;
    b->persistent = persistent;
    b->offset = -1;
    return P->nbufs++;
}
#define add_buf cp_plan_add_buf /* the planner's own short name for it */

static cp_step *add_step(builder *B, cp_opkind kind, const char *what) {
    cp_plan *P = B->P;
    if (P->nsteps == P->capsteps) {
        P->capsteps = P->capsteps ? P->capsteps * 2 : 1024;
        P->steps = cp_xrealloc(P->steps, sizeof *P->steps * (size_t)P->capsteps);
    }
    cp_step *s = &P->steps[P->nsteps++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->phase = B->phase;
    s->layer = B->layer;
    s->stage = B->stage;
    s->tile = B->tile;
    s->ring_step = B->ring_step;
    s->ring_part = B->ring_part;
    s->module = -1;
    s->stream = kind == CP_OP_COPY_D2H || kind == CP_OP_COPY_H2D ? CP_STREAM_COPY
                : (kind >= CP_OP_ALLTOALL && kind <= CP_OP_ALLREDUCE) || kind == CP_OP_SENDRECV ? CP_STREAM_COMM
                                                                       : CP_STREAM_COMPUTE;
    set_name(s->what, sizeof s->what, what);
    return s;
}

/* Operand on bytes [off, off+bytes) of buffer buf; bytes < 0 means to the end of the buffer. */
static void use(cp_step *s, const cp_plan *P, int buf, int64_t off, int64_t bytes, int access) {
    if (s->nops == CP_MAX_OPERANDS) cp_fatal(CP_EXIT_FAIL, "plan: step %s has too many operands", s->what);
    if (bytes < 0) bytes = P->bufs[buf].bytes - off;
    s->ops[s->nops++] = (cp_operand){.buf = buf, .offset = off, .bytes = bytes, .access = access};
}
/* Operand on tile i's rows of buffer buf, `rows` bytes a tile: the stride a folded run of tiles moves it by. */
static void use_tile(cp_step *s, const cp_plan *P, int buf, int64_t i, int64_t rows, int access) {
    use(s, P, buf, i * rows, rows, access);
    s->ops[s->nops - 1].stride = rows;
}
static void rd(cp_step *s, const cp_plan *P, int buf) { use(s, P, buf, 0, -1, CP_READ); }
static void wr(cp_step *s, const cp_plan *P, int buf) { use(s, P, buf, 0, -1, CP_WRITE); }
static void rw(cp_step *s, const cp_plan *P, int buf) { use(s, P, buf, 0, -1, CP_RW); }
/* A document-masked attention kernel's last operands: the sequence's doc_start and doc_end (cp_plan.docs). */
static void rd_docs(cp_step *s, const cp_plan *P, int doc_start, int doc_end) {
    if (!P->docs) return;
    rd(s, P, doc_start);
    rd(s, P, doc_end);
}
/* An attention kernel's q, k and v. */
static void rd_qkv(cp_step *s, const cp_plan *P, int q, int k, int v) {
    rd(s, P, q);
    rd(s, P, k);
    rd(s, P, v);
}

static bool kspec_equal(const cp_kernel_spec *a, const cp_kernel_spec *b) {
    if (strcmp(a->family, b->family) != 0 || a->nparams != b->nparams) return false;
    for (int i = 0; i < a->nparams; i++)
        if (strcmp(a->params[i].key, b->params[i].key) != 0 || strcmp(a->params[i].value, b->params[i].value) != 0)
            return false;
    return true;
}

int cp_plan_module_of(cp_plan *P, cp_kernel_spec *k) {
    for (int i = 0; i < P->nmodules; i++)
        if (kspec_equal(&P->modules[i], k)) {
            cp_kspec_free(k);
            return i;
        }
    if (P->nmodules == P->capmodules) {
        P->capmodules = P->capmodules ? P->capmodules * 2 : 16;
        P->modules = cp_xrealloc(P->modules, sizeof *P->modules * (size_t)P->capmodules);
    }
    P->modules[P->nmodules] = *k;
    return P->nmodules++;
}

const char *cp_task_name(cp_task t) {
#define CP_TASK_NAME(task, label) [CP_TASK_##task] = label,
    static const char *const names[CP_TASK_COUNT] = {[CP_TASK_NONE] = "", CP_TASKS(CP_TASK_NAME)};
#undef CP_TASK_NAME
    return t >= 0 && t < CP_TASK_COUNT ? names[t] : "?";
}

static cp_step *kernel(builder *B, int module, const char *role, cp_task task, double bytes) {
    cp_step *s = add_step(B, CP_OP_KERNEL, cp_task_name(task));
    s->task = task;
    s->module = module;
    set_name(s->role, sizeof s->role, role);
    s->bytes = bytes;
    return s;
}

/* D[m][n] = op(A) op(B): operands are added by the caller in the order A, B, (C), D. */
static cp_step *gemm(builder *B, const char *what, int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
    cp_step *s = add_step(B, CP_OP_GEMM, what);
    s->gemm = (cp_gemm){.m = m, .n = n, .k = k, .trans_a = ta, .trans_b = tb,
                        .lda = ta ? m : k, .ldb = tb ? k : n, .ldd = n};
    s->flops = 2.0 * (double)m * (double)n * (double)k;
    return s;
}

/* An FP8 amax or cast (gen/plan_fp8.c), priced and counted apart */
static bool is_fp8_cast(const cp_step *s) {
    return s->task == CP_TASK_FP8_AMAX || s->task == CP_TASK_FP8_CAST || s->task == CP_TASK_FP8_CAST_BLOCK;
}

/* The rate of FP8 amax or cast step s, GB/s of the bytes it counts: the row-scaled casts at theirs, the 1 x 128 casts
 * that transpose slower than the rest (per tensor they did not) */
static double fp8_cast_gbps(const cp_machine *mc, const cp_step *s) {
    if (s->task != CP_TASK_FP8_CAST_BLOCK) return mc->fp8_cast_gbps;
    if (s->fp8.scale == CP_GEMM_SCALE_ROW) return mc->fp8_cast_row_gbps;
    if (s->fp8.scale == CP_GEMM_SCALE_1D && (s->fp8.transposed || s->fp8.both)) return mc->fp8_cast_t_gbps;
    return mc->fp8_cast_gbps;
}

/* A backward GEMM: its A is the gradient dY (dX = dY W, dW = dY^T X), which FP8 keeps in E5M2. */
static cp_step *grad_gemm(builder *B, const char *what, int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
    cp_step *s = gemm(B, what, m, n, k, ta, tb);
    s->gemm.a_grad = true;
    return s;
}

/* dW[m][n] = dY^T X over k tokens: a backward GEMM whose output is a weight's gradient */
static cp_step *weight_grad_gemm(builder *B, const char *what, int64_t m, int64_t n, int64_t k) {
    cp_step *s = grad_gemm(B, what, m, n, k, true, false);
    s->gemm.w_grad = true;
    return s;
}

/* A run of n identical tiles (the MLP's, the loss's: n grows with the sequence) is added tile by tile, but the
 * steps of tile 1, [body, nsteps), stand for tiles 1 .. n - 2 (cp_loop): called after them, this records the loop
 * and returns the tile to continue from, less one (the caller's i++), so that the last tile is added next. Tiles 0
 * and n - 1 stay steps of their own: the first starts lifetimes (CP_DEF) and the last ends them. */
static int64_t fold_tiles(builder *B, int body, int64_t n) {
    cp_plan *P = B->P;
    if (n - 2 < 2) return 1; /* nothing to fold: tile 1 is the only one between */
    if (P->nloops == P->caploops) {
        P->caploops = P->caploops ? P->caploops * 2 : 64;
        P->loops = cp_xrealloc(P->loops, sizeof *P->loops * (size_t)P->caploops);
    }
    P->loops[P->nloops++] = (cp_loop){.first = body, .nsteps = P->nsteps - body, .count = n - 2};
    return n - 2;
}

/* A collective or a host copy of `bytes` (per rank). */
static cp_step *collective(builder *B, cp_opkind kind, const char *what, int64_t bytes) {
    cp_step *s = add_step(B, kind, what);
    s->count = bytes;
    s->bytes = (double)bytes;
    return s;
}

/* ---------------------------------------------------------------- shapes */

void cp_layer_layout_of(const cp_model *m, int C, cp_layer_layout *L) {
    memset(L, 0, sizeof *L);
    int64_t hid = m->hidden, qd = m->heads * m->head_dim, kvd = m->kv_heads * m->head_dim;
    L->size[CP_W_Q] = qd * hid;
    L->size[CP_W_K] = kvd * hid;
    L->size[CP_W_V] = kvd * hid;
    L->size[CP_W_O] = hid * qd;
    L->size[CP_W_GATE] = m->ffn * hid;
    L->size[CP_W_UP] = m->ffn * hid;
    L->size[CP_W_DOWN] = hid * m->ffn;
    L->size[CP_W_NORM1] = hid;
    L->size[CP_W_NORM2] = hid;
    L->size[CP_W_QNORM] = m->qk_norm ? m->head_dim : 0;
    L->size[CP_W_KNORM] = m->qk_norm ? m->head_dim : 0;
    int64_t off = 0;
    for (int w = 0; w < CP_W_COUNT; w++) {
        L->off[w] = off;
        off += align_up(L->size[w], 64); /* every matrix starts on a 128-byte line in bf16 */
    }
    L->total = off;
    L->padded = align_up(off, 64 * (int64_t)C);
}

/* Fills the UPipe stage table; see the brief's "UPipe GQA order". */
static int stage_table(cp_plan *P, char *err, int errlen) {
    const cp_model *m = &P->spec.model;
    int C = P->C, H = (int)m->heads, KV = (int)m->kv_heads, g = H / KV;
    P->U = P->spec.parallel.upipe_heads;
    P->nstages = H / P->U;
    P->u = P->U / C;
    P->repl = KV < C ? C / KV : 1;
    int u = P->u;
    if (P->repl > 1) {
        P->kvr = 1;
        P->group_len = P->nstages;
    } else if (u <= g) {
        P->kvr = 1;
        P->group_len = g / u;
    } else {
        P->kvr = u / g;
        P->group_len = 1;
    }
    if (u > CP_MAX_STAGE_HEADS) {
        snprintf(err, errlen, "%s: parallel.upipe_heads = %d gives %d query heads per GPU per stage; at most %d are "
                 "supported: use a smaller upipe_heads", P->spec.path, P->U, u, CP_MAX_STAGE_HEADS);
        return -1;
    }
    P->stages = cp_xcalloc((size_t)P->nstages * (size_t)C, sizeof *P->stages);
    for (int s = 0; s < P->nstages; s++)
        for (int r = 0; r < C; r++) {
            cp_stage_rank *e = &P->stages[s * C + r];
            int grp = s / P->group_len, in = s % P->group_len;
            e->kv_fresh = in == 0;
            e->kv_last = in == P->group_len - 1;
            if (P->repl > 1) {
                int kv = r / P->repl;
                e->nkv = 1;
                e->kv_heads[0] = kv;
                for (int j = 0; j < u; j++) e->q_heads[j] = kv * g + s * P->repl * u + (r % P->repl) * u + j;
            } else if (u <= g) {
                int kv = grp * C + r;
                e->nkv = 1;
                e->kv_heads[0] = kv;
                for (int j = 0; j < u; j++) e->q_heads[j] = kv * g + in * u + j;
            } else {
                e->nkv = P->kvr;
                for (int j = 0; j < P->kvr; j++) {
                    int kv = s * C * P->kvr + r * P->kvr + j;
                    e->kv_heads[j] = kv;
                    for (int q = 0; q < g; q++) e->q_heads[j * g + q] = kv * g + q;
                }
            }
            e->nq = u;
            e->q_first = e->q_heads[0];
        }
    return 0;
}

static int64_t gcd(int64_t a, int64_t b) { return b ? gcd(b, a % b) : a; }
static int64_t lcm(int64_t a, int64_t b) { return a / gcd(a, b) * b; }

static int64_t largest_divisor_at_most(int64_t n, int64_t cap) {
    if (cap >= n) return n;
    for (int64_t d = cap; d > 1; d--)
        if (n % d == 0) return d;
    return 1;
}

/* ---------------------------------------------------------------- the program */

typedef struct {
    /* weights and gradients of the unit in use: buffer and element base */
    int wbuf, gbuf;
    int64_t wbase, gbase;
} unit_ref;

typedef struct {
    int params, master, adam_m, adam_v, grads;  /* shards */
    int host_grads, host_params;                 /* optimizer on the host: gradients in, bf16 parameters out */
    int w_layer[2], g_layer, w_embed, g_embed, w_head, g_head; /* C > 1 */
    int *ckpt;                                   /* [L] layer inputs (GPU or host); -1 between checkpoints */
    int xs[2];                                   /* GPU staging for host checkpoints */
    int *seg;                                    /* [k] inputs of a segment's layers 1..k-1 (checkpoint_every k) */
    int h_final, xf, rstdf, dxf, logits, token_loss, loss_sum, tokens, targets, token_order;
    int positions, doc_start, doc_end;           /* packed documents' inputs (cp_plan.docs); -1 without */
    int xn, rstd1, attn_out, h2, xn2, rstd2, dres, dh2, dxn, dattn, delta_tok;
    int *attn_keep, *lse_keep;                   /* [L] kept attention output and LSE (GPU or host); -1: recomputed */
    int attn_stage[2], lse_stage[2];             /* GPU staging for those kept on the host */
    int lse_all;
    int q_tok, k_tok, v_tok, q_raw, k_raw, q_rstd, k_rstd;
    int a2a_send, a2a_recv, q_head, k_head, v_head, o_head;
    int do_head, delta_head, dq_head, dk_head, dv_head, dkv_acc, dq_acc;
    int mlp_gate, mlp_up, mlp_act;
    int gemm_ws, norm_part, sumsq_part;          /* scratch of the deterministic reductions */
    /* ring attention (cp_ring_terms says what each holds); -1 without a ring */
    int ring_k[2], ring_v[2], ring_o, ring_lse, ring_dkv[2], ring_dkv_step, dq_half;
} bufset;

#define BF16 2
#define F32 4

/* Where unit `u`'s weights and gradients are during its use (gathered buffer, or the shard itself when C = 1). */
static unit_ref unit_at(const cp_plan *P, const bufset *b, int unit, int slot) {
    unit_ref r;
    if (P->C == 1) {
        r.wbuf = b->params;
        r.gbuf = b->grads;
        r.wbase = r.gbase = P->unit_shard_off[unit];
    } else {
        r.wbuf = unit == 0 ? b->w_embed : unit == P->nunits - 1 ? b->w_head : b->w_layer[slot];
        r.gbuf = unit == 0 ? b->g_embed : unit == P->nunits - 1 ? b->g_head : b->g_layer;
        r.wbase = r.gbase = 0;
    }
    return r;
}

static void op_weight(cp_step *s, const cp_plan *P, const unit_ref *u, cp_weight w, int access) {
    use(s, P, u->wbuf, (u->wbase + P->layout.off[w]) * BF16, P->layout.size[w] * BF16, access);
}
static void op_wgrad(cp_step *s, const cp_plan *P, const unit_ref *u, cp_weight w) {
    use(s, P, u->gbuf, (u->gbase + P->layout.off[w]) * F32, P->layout.size[w] * F32, CP_RW);
}

/* Gather unit `unit` into its buffer before use (C > 1). */
static void gather(builder *B, const bufset *b, int unit, int slot) {
    cp_plan *P = B->P;
    if (P->C == 1) return;
    unit_ref r = unit_at(P, b, unit, slot);
    int64_t shard = P->unit_padded[unit] / P->C;
    cp_step *s = collective(B, CP_OP_ALLGATHER, "gather", P->unit_padded[unit] * BF16);
    use(s, P, b->params, P->unit_shard_off[unit] * BF16, shard * BF16, CP_READ);
    wr(s, P, r.wbuf);
}

/* Does the shard of `unit` hold gradients before its reduce-scatter? With several micro-batches the earlier
 * ones' sum; with a tied LM head the embedding's shard gets the head's part first, then the embedding's own. */
static bool shard_accumulates(const cp_plan *P, int unit) {
    return P->spec.train.micro_batches > 1 || (unit == 0 && P->spec.model.tie_embeddings);
}

/* Several groups (replicas, ring): every group holds the model sharded alike, so the R * P ranks of one shard sum
 * unit `unit`'s slice of it in place. Once, in the last micro-batch, over the gradients accumulated by all of them;
 * on the comm stream, behind the backward of the layers below. */
static void shard_allreduce(builder *B, const bufset *b, int unit) {
    cp_plan *P = B->P;
    if (P->replicas * P->ring == 1) return;
    int64_t shard = P->C == 1 ? P->unit_padded[unit] : P->unit_padded[unit] / P->C;
    cp_step *s = collective(B, CP_OP_ALLREDUCE, "shard_allreduce", shard * F32);
    use(s, P, b->grads, P->unit_shard_off[unit] * F32, shard * F32, CP_RW);
    s->comm = CP_COMM_SHARD;
    s->last_micro = true;
}

/* Reduce-scatter unit `unit`'s full gradients into this rank's shard (C > 1). Where the shard already holds
 * gradients, the cast module's add_f32 (`add_module`) first adds it into this rank's slice of the full gradients
 * (the executor picks the slice by rank), so the collective can overwrite the shard. */
static void reduce_scatter_in_group(builder *B, const bufset *b, int unit, int add_module) {
    cp_plan *P = B->P;
    if (P->C == 1) return;
    unit_ref r = unit_at(P, b, unit, 0);
    int64_t shard = P->unit_padded[unit] / P->C;
    if (shard_accumulates(P, unit)) {
        cp_step *k = kernel(B, add_module, "add_f32", CP_TASK_GRAD_ACCUM, 3.0 * (double)shard * F32);
        use(k, P, b->grads, P->unit_shard_off[unit] * F32, shard * F32, CP_READ);
        use(k, P, r.gbuf, r.gbase * F32, P->unit_padded[unit] * F32, CP_RW);
        k->count = shard;
    }
    cp_step *s = collective(B, CP_OP_REDUCE_SCATTER, "reduce_scatter", P->unit_padded[unit] * F32);
    rd(s, P, r.gbuf);
    use(s, P, b->grads, P->unit_shard_off[unit] * F32, shard * F32, CP_RW);
}

/* The same, then, with several groups, the shard's all-reduce across them. */
static void reduce_scatter(builder *B, const bufset *b, int unit, int add_module) {
    reduce_scatter_in_group(B, b, unit, add_module);
    shard_allreduce(B, b, unit);
}

/* The buffer that holds layer l's input: its checkpoint at the start of a segment of checkpoint_every layers,
 * else the segment's input buffer (forward, and the backward's recompute). */
static int layer_input(const bufset *b, const cp_plan *P, int l) {
    return l % P->ckpt_every ? b->seg[l % P->ckpt_every] : b->ckpt[l];
}

/* Where a layer's attention output and LSE are written and read, and whether the backward's recompute skips the
 * attention that makes them (kept). */
typedef struct {
    int out, lse;
    bool kept;
} attn_bufs;

/* Layer l's attention buffers: its own on the GPU; the GPU staging pair of its parity for one kept on the host
 * (written there by the forward and copied out, copied back one layer ahead of its backward); the scratch shared by
 * every layer that recomputes. `segment`: the forward again of a segment's lower layers (checkpoint_every > 1),
 * which runs before the host-kept copies come back, so those layers recompute attention into the scratch there. */
static attn_bufs attn_of(const cp_plan *P, const bufset *b, int l, bool segment) {
    cp_attn_keep where = cp_plan_attn_where(P, l);
    if (where == CP_ATTN_GPU) return (attn_bufs){b->attn_keep[l], b->lse_keep[l], true};
    if (where == CP_ATTN_HOST && !segment) return (attn_bufs){b->attn_stage[l % 2], b->lse_stage[l % 2], true};
    return (attn_bufs){b->attn_out, b->lse_all, false};
}

/* Zero a gradient buffer before a unit's backward accumulates into it. */
static void zero(builder *B, int buf, int64_t bytes) {
    cp_step *s = add_step(B, CP_OP_MEMSET, "zero");
    use(s, B->P, buf, 0, bytes, CP_WRITE);
    s->count = bytes;
    s->bytes = (double)bytes;
}

/* Zero bytes [off, off + bytes) of a buffer that holds nothing live before: the step starts its lifetime. */
static void zero_def(builder *B, int buf, int64_t off, int64_t bytes) {
    cp_step *s = add_step(B, CP_OP_MEMSET, "zero");
    use(s, B->P, buf, off, bytes, CP_DEF);
    s->count = bytes;
    s->bytes = (double)bytes;
}

/* Before an attention backward into the dQ workspace `buf` of module k: ordered, the kernel writes the fp32 dQ whole
 * and only its progress counters start at zero; atomic (train.deterministic = false), it adds into all of it. */
static void zero_dq_workspace(builder *B, int buf, const cp_kernel_spec *k) {
    if (B->P->spec.train.deterministic) zero_def(B, buf, cp_k_attention_prog_offset(k), cp_k_attention_prog_bytes(k));
    else zero_def(B, buf, 0, cp_k_attention_workspace_bytes(k));
}

typedef struct {
    int norm_h, norm_d, rope, swiglu, loss, embed, adamw, cast, delta, attn;
    int lay_q, lay_kv, lay_delta; /* ulysses layout modules */
    int attn_half, merge;         /* ring: attention over half blocks with no mask, the LSE merge; -1 without */
    int attn_diag;                /* ring with documents: causal attention over a half block (step 0's diagonal
                                   * chunks, gen/ring.h); -1 without */
} modset;

/* RoPE in place on the first T rows of `heads` heads of `buf`. With a ring, a rank's rows sit at one or two runs of
 * consecutive positions (cp_ring_rope_runs): one launch per run any rank may have, each the rank's run `ring_part`
 * (found by the executor from its ring position), so each covers the whole buffer here. */
static void rope(builder *B, const bufset *b, int module, const char *role, cp_task task, int buf, int64_t heads) {
    cp_plan *P = B->P;
    int64_t T = P->T, D = P->spec.model.head_dim;
    int runs = cp_ring_rope_nruns(P->ring, P->C);
    for (int r = 0; r < runs; r++) {
        B->ring_part = P->ring > 1 ? r : -1;
        cp_step *k = kernel(B, module, role, task, (double)T * heads * D * 2 * BF16 / runs);
        use(k, P, buf, 0, T * heads * D * BF16, CP_RW);
        if (P->doc_positions) rd(k, P, b->positions);
        k->count = T;
        k->heads = heads;
    }
    B->ring_part = -1;
}

/* A stage's Q (and, at a group's first stage, K and V): projection, optional qk-norm, RoPE, all-to-all into head
 * layout. Used by the forward, the recompute and the backward alike. */
static void stage_qkv(builder *B, const bufset *b, const modset *M, const unit_ref *w, int s, bool fresh_kv) {
    cp_plan *P = B->P;
    const cp_model *m = &P->spec.model;
    int64_t T = P->T, D = m->head_dim, hid = m->hidden, U = P->U;
    int64_t nkv = P->repl > 1 ? m->kv_heads : (int64_t)P->C * P->kvr; /* KV heads projected per group */
    bool qk = m->qk_norm;
    /* Q for the U heads of stage s: rows [s*U*D, (s+1)*U*D) of Wq in stage order */
    cp_step *g = gemm(B, "q_proj", T, U * D, hid, false, true);
    rd(g, P, b->xn);
    use(g, P, w->wbuf, (w->wbase + P->layout.off[CP_W_Q] + (int64_t)s * U * D * hid) * BF16, U * D * hid * BF16, CP_READ);
    wr(g, P, qk ? b->q_raw : b->q_tok);
    if (qk) {
        cp_step *k = kernel(B, M->norm_d, "fwd", CP_TASK_Q_NORM, (double)T * U * D * 2 * BF16);
        rd(k, P, b->q_raw);
        op_weight(k, P, w, CP_W_QNORM, CP_READ);
        wr(k, P, b->q_tok);
        wr(k, P, b->q_rstd);
        k->count = T * U; /* qk-norm: one row per head */
    }
    rope(B, b, M->rope, "fwd", CP_TASK_ROPE_Q, b->q_tok, U);
    if (P->C > 1) {
        cp_step *pk = kernel(B, M->lay_q, "pack", CP_TASK_PACK_Q, (double)T * U * D * 2 * BF16);
        rd(pk, P, b->q_tok);
        use(pk, P, b->a2a_send, 0, T * U * D * BF16, CP_DEF);
        cp_step *a = collective(B, CP_OP_ALLTOALL, "a2a_q", T * U * D * BF16);
        use(a, P, b->a2a_send, 0, T * U * D * BF16, CP_READ);
        wr(a, P, b->q_head);
    }
    if (!fresh_kv) return;
    const cp_weight kvw[2] = {CP_W_K, CP_W_V};
    const int tok[2] = {b->k_tok, b->v_tok}, head[2] = {b->k_head, b->v_head};
    int64_t grp = s / P->group_len;
    int64_t row0 = P->repl > 1 ? 0 : grp * nkv * D; /* first row of Wk/Wv for this group */
    for (int i = 0; i < 2; i++) {
        bool key = i == 0;
        cp_step *kg = gemm(B, key ? "k_proj" : "v_proj", T, nkv * D, hid, false, true);
        rd(kg, P, b->xn);
        use(kg, P, w->wbuf, (w->wbase + P->layout.off[kvw[i]] + row0 * hid) * BF16, nkv * D * hid * BF16, CP_READ);
        wr(kg, P, key && qk ? b->k_raw : tok[i]);
        if (key) {
            if (qk) {
                cp_step *k = kernel(B, M->norm_d, "fwd", CP_TASK_K_NORM, (double)T * nkv * D * 2 * BF16);
                rd(k, P, b->k_raw);
                op_weight(k, P, w, CP_W_KNORM, CP_READ);
                wr(k, P, b->k_tok);
                wr(k, P, b->k_rstd);
                k->count = T * nkv;
            }
            rope(B, b, M->rope, "fwd", CP_TASK_ROPE_K, b->k_tok, nkv);
        }
        if (P->C > 1) {
            int64_t sent = T * (int64_t)P->C * P->kvr * D * BF16; /* each rank receives kvr heads of T tokens */
            cp_step *pk = kernel(B, M->lay_kv, "pack", key ? CP_TASK_PACK_K : CP_TASK_PACK_V, 2.0 * (double)sent);
            rd(pk, P, tok[i]);
            use(pk, P, b->a2a_send, 0, sent, CP_DEF);
            cp_step *a = collective(B, CP_OP_ALLTOALL, key ? "a2a_k" : "a2a_v", sent);
            use(a, P, b->a2a_send, 0, sent, CP_READ);
            wr(a, P, head[i]);
        }
    }
}

/* The causal attention forward of a stage's u heads per rank, 2 S^2 u D: with a ring, its P steps over the group's
 * blocks (the same work each: gen/ring.h). */
static double attn_fwd_flops(const cp_plan *P) {
    return P->attn_work * P->ring * cp_ring_step_fwd_flops(P->group_tokens, P->u, P->spec.model.head_dim);
}

/* ---------------------------------------------------------------- ring attention (parallel.ring = P > 1) */

/* Rows [h0 c, h1 c) of a head-layout buffer of the group's L = 2c tokens (halves h0 .. h1 - 1), rows of `row` bytes
 * from byte `base`. */
static void halves(cp_step *s, const cp_plan *P, int buf, int64_t base, int h0, int h1, int64_t row, int access) {
    int64_t c = P->group_tokens / 2;
    use(s, P, buf, base + h0 * c * row, (h1 - h0) * c * row, access);
}

/* Columns [h0 c, h1 c) of a stage's u LSE rows (fp32, stride L) from byte `base`: from the first row's first column
 * to the last row's last. */
static void lse_halves(cp_step *s, const cp_plan *P, int buf, int64_t base, int h0, int h1, int access) {
    int64_t L = P->group_tokens, c = L / 2;
    use(s, P, buf, base + h0 * c * F32, ((P->u - 1) * L + (h1 - h0) * c) * F32, access);
}

/* The K/V block in hand at ring step k (kv[0] K, kv[1] V): the stage's own at step 0, else receive slot (k - 1) % 2,
 * which it arrived in. Before the last step it goes on to the ring's next rank while the previous rank's arrives in
 * slot k % 2: a send/recv each, on the comm stream over the ring communicator, under the attention on the block in
 * hand (that slot was the one in hand a step ago, so they wait for that step's attention). */
static void ring_block(builder *B, const bufset *b, int k, int kv[2]) {
    cp_plan *P = B->P;
    kv[0] = k ? b->ring_k[(k - 1) % 2] : b->k_head;
    kv[1] = k ? b->ring_v[(k - 1) % 2] : b->v_head;
    if (k + 1 == P->ring) return;
    const int to[2] = {b->ring_k[k % 2], b->ring_v[k % 2]};
    for (int i = 0; i < 2; i++) {
        cp_step *s = collective(B, CP_OP_SENDRECV, i ? "ring_send_v" : "ring_send_k", P->bufs[to[i]].bytes);
        rd(s, P, kv[i]);
        wr(s, P, to[i]);
        s->comm = CP_COMM_RING;
    }
}

/* Half launch `part` of ring step k forward with `module` (cp_ring_half_of; cp_ring_half_span the halves its
 * operands cover): the query half's partial output in o_head and LSE in ring_lse, the stage's own rows and columns
 * of them; with documents the sequence's bounds last (the executor passes the halves' global positions). */
static void half_fwd(builder *B, const bufset *b, int module, int k, int part, const int kv[2]) {
    cp_plan *P = B->P;
    const int64_t L = P->group_tokens, D = P->spec.model.head_dim, u = P->u;
    const int64_t qrow = u * D * BF16, kvrow = P->kvr * D * BF16;
    cp_ring_span h = cp_ring_half_span(P->ring, k, part);
    cp_step *a = kernel(B, module, "fwd", CP_TASK_ATTN_FWD_HALF, 0);
    halves(a, P, b->q_head, 0, h.q0, h.q1, qrow, CP_READ);
    halves(a, P, kv[0], 0, h.k0, h.k1, kvrow, CP_READ);
    halves(a, P, kv[1], 0, h.k0, h.k1, kvrow, CP_READ);
    halves(a, P, b->o_head, 0, h.q0, h.q1, qrow, CP_WRITE);
    lse_halves(a, P, b->ring_lse, 0, h.q0, h.q1, CP_WRITE);
    rd_docs(a, P, b->doc_start, b->doc_end);
    /* a c x c block is half a step's work, a causal one a quarter */
    a->flops = cp_ring_step_fwd_flops(L, P->u, D) / (cp_ring_half_causal(k, part) ? 4 : 2);
    a->lse_stride = L;
}

/* The merge of half launch `part` of step k's partial output into ring_o and the stage's LSE, over its query half. */
static void half_merge(builder *B, const bufset *b, const modset *M, int k, int part, int lse_buf, int64_t lse0) {
    cp_plan *P = B->P;
    const int64_t L = P->group_tokens, c = L / 2, D = P->spec.model.head_dim, u = P->u;
    const int64_t qrow = u * D * BF16, orow = u * D * F32;
    cp_ring_span h = cp_ring_half_span(P->ring, k, part);
    cp_step *m = kernel(B, M->merge, "fwd", CP_TASK_ATTN_MERGE, (double)c * u * (D * (BF16 + 2 * F32) + 3 * F32));
    halves(m, P, b->o_head, 0, h.q0, h.q1, qrow, CP_READ);
    lse_halves(m, P, b->ring_lse, 0, h.q0, h.q1, CP_READ);
    halves(m, P, b->ring_o, 0, h.q0, h.q1, orow, CP_RW);
    lse_halves(m, P, lse_buf, lse0, h.q0, h.q1, CP_RW);
    m->count = c;
    m->heads = u;
    m->lse_stride = L;
}

/* The merge's start from a full block's output (o_head, ring_lse: every query row of the group) into ring_o and the
 * stage's slice of the layer's LSE (written with `lse_access`: the layer's first stage starts its lifetime). */
static void merge_init(builder *B, const bufset *b, const modset *M, int lse_buf, int64_t lse0, int lse_access) {
    cp_plan *P = B->P;
    const int64_t L = P->group_tokens, D = P->spec.model.head_dim, u = P->u;
    cp_step *m = kernel(B, M->merge, "init", CP_TASK_ATTN_MERGE_INIT, (double)L * u * (D * (BF16 + F32) + 2 * F32));
    rd(m, P, b->o_head);
    rd(m, P, b->ring_lse);
    wr(m, P, b->ring_o);
    use(m, P, lse_buf, lse0, u * L * F32, lse_access);
    m->count = L;
    m->heads = u;
    m->lse_stride = L;
}

/* Step 0 with documents (gen/ring.h, CP_RING_STEP0_PARTS): the own block's two diagonal halves causal (parts 0 and
 * 1), each writing its query half of o_head and ring_lse, so that together they are the whole block the merge starts
 * from; then query half 1 against key half 0 (part 2), merged into half 1. A row of a half launch whose document
 * starts after its keys has lse = -inf and o = 0, which the merge weighs 0 (a diagonal half's rows always keep their
 * own key, so the start is finite). */
static void ring_step0_docs(builder *B, const bufset *b, const modset *M, const int kv[2], int64_t lse0,
                            int lse_access, int lse_buf) {
    for (int part = 0; part < CP_RING_STEP0_PARTS; part++) {
        B->ring_part = part;
        half_fwd(B, b, cp_ring_half_causal(0, part) ? M->attn_diag : M->attn_half, 0, part, kv);
        if (part == 1) {
            B->ring_part = -1; /* the whole block's rows */
            merge_init(B, b, M, lse_buf, lse0, lse_access);
        } else if (part == 2) {
            half_merge(B, b, M, 0, part, lse_buf, lse0);
        }
    }
    B->ring_part = -1;
}

/* Stage s's attention over the ring: at ring step k the K/V block of position (p - k) mod P (gen/ring.h), the own
 * block causal in one launch (in three half launches with documents: ring_step0_docs), a received one in two
 * half-block launches; each launch's partial output (o_heads) and LSE (ring_lse) merged into ring_o and the stage's
 * slice of the layer's LSE; then the merged output in bf16 back in o_heads, for the all-to-all back. */
static void ring_attention(builder *B, const bufset *b, const modset *M, int s, int lse_buf) {
    cp_plan *P = B->P;
    const int R = P->ring;
    const int64_t L = P->group_tokens, D = P->spec.model.head_dim, u = P->u;
    const int64_t lse0 = s * u * L * F32;
    const double step = cp_ring_step_fwd_flops(L, P->u, D);
    for (int k = 0; k < R; k++) {
        B->ring_step = k;
        int kv[2];
        ring_block(B, b, k, kv);
        if (k == 0 && P->docs) {
            ring_step0_docs(B, b, M, kv, lse0, s == 0 ? CP_DEF : CP_WRITE, lse_buf);
            continue;
        }
        if (k == 0) { /* every query row: the merge starts from it */
            cp_step *a = kernel(B, M->attn, "fwd", CP_TASK_ATTN_FWD, 0);
            rd_qkv(a, P, b->q_head, kv[0], kv[1]);
            wr(a, P, b->o_head);
            wr(a, P, b->ring_lse);
            a->flops = step;
            a->lse_stride = L;
            merge_init(B, b, M, lse_buf, lse0, s == 0 ? CP_DEF : CP_WRITE);
            continue;
        }
        for (int part = 0; part < 2; part++) {
            B->ring_part = part;
            half_fwd(B, b, M->attn_half, k, part, kv);
            half_merge(B, b, M, k, part, lse_buf, lse0);
        }
        B->ring_part = -1;
    }
    B->ring_step = -1;
    cp_step *cv = kernel(B, M->cast, "f32_to_bf16", CP_TASK_CAST_O, (double)L * u * D * (F32 + BF16));
    rd(cv, P, b->ring_o);
    wr(cv, P, b->o_head);
    cv->count = L * u * D;
}

/* Half launch `part` of ring step k backward with `module`: its dQ in the half launch's own workspace, then added to
 * the stage's dQ at the query half's rows; its dK, dV added (fp32) into `dkv` ([2][L][kvr][D]) at the key half's
 * rows; with documents the sequence's bounds last. */
static void half_bwd(builder *B, const bufset *b, const modset *M, int module, int k, int part, const int kv[2],
                     int dkv, int lse_buf, int64_t lse0) {
    cp_plan *P = B->P;
    const int64_t L = P->group_tokens, c = L / 2, D = P->spec.model.head_dim, u = P->u, kvr = P->kvr;
    const int64_t qrow = u * D * BF16, kvrow = kvr * D * BF16, q32 = u * D * F32, kv32 = kvr * D * F32;
    cp_ring_span h = cp_ring_half_span(P->ring, k, part);
    zero_dq_workspace(B, b->dq_half, &P->modules[module]);
    cp_step *a = kernel(B, module, "bwd", CP_TASK_ATTN_BWD_HALF, 0);
    halves(a, P, b->q_head, 0, h.q0, h.q1, qrow, CP_READ);
    halves(a, P, kv[0], 0, h.k0, h.k1, kvrow, CP_READ);
    halves(a, P, kv[1], 0, h.k0, h.k1, kvrow, CP_READ);
    halves(a, P, b->do_head, 0, h.q0, h.q1, qrow, CP_READ);
    lse_halves(a, P, lse_buf, lse0, h.q0, h.q1, CP_READ);
    halves(a, P, b->delta_head, 0, h.q0, h.q1, u * F32, CP_READ);
    rw(a, P, b->dq_half);
    halves(a, P, dkv, 0, h.k0, h.k1, kv32, CP_RW);     /* dK */
    halves(a, P, dkv, L * kv32, h.k0, h.k1, kv32, CP_RW); /* dV */
    rd_docs(a, P, b->doc_start, b->doc_end);
    a->flops = 2.5 * cp_ring_step_fwd_flops(L, P->u, D) / (cp_ring_half_causal(k, part) ? 4 : 2);
    a->lse_stride = L;
    cp_step *d = kernel(B, M->cast, "add_f32", CP_TASK_RING_ADD_DQ, 3.0 * (double)c * q32);
    use(d, P, b->dq_half, 0, c * q32, CP_READ);
    halves(d, P, b->dq_acc, 0, h.q0, h.q1, q32, CP_RW);
    d->count = c * u * D;
}

/* Stage s's attention backward over the ring, with the merged LSE and the stage's delta (no merge: each block's
 * backward is exact with them). The K/V blocks go round again; each block's dK, dV travel with it in ring_dkv, come
 * home after P hops into ring_dkv[*home], and stay there for the next stage of a GQA group to add to (the caller
 * clears it at the group's first). At a received block the step's own dK, dV collect in ring_dkv_step and are added
 * once the accumulator has arrived, so its hop runs under the step's attention. dQ: the own block's launch writes
 * the stage's dQ workspace, each half launch's is added to its rows. */
static void ring_attention_bwd(builder *B, const bufset *b, const modset *M, int s, int lse_buf, int *home) {
    cp_plan *P = B->P;
    const int R = P->ring;
    const int64_t L = P->group_tokens, D = P->spec.model.head_dim, u = P->u, kvr = P->kvr;
    const int64_t lse0 = s * u * L * F32;
    const double step = 2.5 * cp_ring_step_fwd_flops(L, P->u, D);
    for (int k = 0; k < R; k++) {
        B->ring_step = k;
        int kv[2], acc = b->ring_dkv[(*home + k) % 2];
        ring_block(B, b, k, kv);
        if (k == 0 && P->docs) {
            /* the forward's three half launches (ring_step0_docs), their dK, dV added into the travelling
             * accumulator directly as the own block's launch adds them */
            for (int part = 0; part < CP_RING_STEP0_PARTS; part++) {
                B->ring_part = part;
                half_bwd(B, b, M, cp_ring_half_causal(0, part) ? M->attn_diag : M->attn_half, k, part, kv, acc,
                         lse_buf, lse0);
            }
            B->ring_part = -1;
        } else if (k == 0) {
            cp_step *a = kernel(B, M->attn, "bwd", CP_TASK_ATTN_BWD, 0);
            rd_qkv(a, P, b->q_head, kv[0], kv[1]);
            rd(a, P, b->do_head);
            use(a, P, lse_buf, lse0, u * L * F32, CP_READ);
            rd(a, P, b->delta_head);
            rw(a, P, b->dq_acc);
            rw(a, P, acc);
            a->flops = step;
            a->lse_stride = L;
        } else {
            zero(B, b->ring_dkv_step, P->bufs[b->ring_dkv_step].bytes);
            for (int part = 0; part < 2; part++) {
                B->ring_part = part;
                half_bwd(B, b, M, M->attn_half, k, part, kv, b->ring_dkv_step, lse_buf, lse0);
            }
            B->ring_part = -1;
            cp_step *d = kernel(B, M->cast, "add_f32", CP_TASK_RING_ADD_DKV, 3.0 * (double)P->bufs[acc].bytes);
            rd(d, P, b->ring_dkv_step);
            rw(d, P, acc);
            d->count = 2 * L * kvr * D;
        }
        cp_step *hop = collective(B, CP_OP_SENDRECV, "ring_send_dkv", P->bufs[acc].bytes);
        rd(hop, P, acc);
        wr(hop, P, b->ring_dkv[(*home + k + 1) % 2]);
        hop->comm = CP_COMM_RING;
    }
    B->ring_step = -1;
    *home = (*home + R) % 2;
}

/* Attention of stage s, then (all-to-all back and) unpack into attn_out's columns of the stage. */
static void stage_attention(builder *B, const bufset *b, const modset *M, int s, int lse_buf, int attn_buf) {
    cp_plan *P = B->P;
    const cp_model *m = &P->spec.model;
    int64_t T = P->T, S = P->group_tokens, D = m->head_dim, U = P->U, u = P->u;
    if (P->ring > 1) {
        ring_attention(B, b, M, s, lse_buf);
    } else {
        cp_step *a = kernel(B, M->attn, "fwd", CP_TASK_ATTN_FWD, 0);
        rd_qkv(a, P, b->q_head, b->k_head, b->v_head);
        wr(a, P, b->o_head);
        use(a, P, lse_buf, (int64_t)s * u * S * F32, u * S * F32, s == 0 ? CP_DEF : CP_WRITE);
        rd_docs(a, P, b->doc_start, b->doc_end);
        a->flops = attn_fwd_flops(P);
    }
    int from = b->o_head;
    if (P->C > 1) {
        cp_step *c = collective(B, CP_OP_ALLTOALL, "a2a_o", T * U * D * BF16);
        rd(c, P, b->o_head);
        use(c, P, b->a2a_recv, 0, T * U * D * BF16, CP_DEF);
        from = b->a2a_recv;
    }
    cp_step *k = kernel(B, M->lay_q, "unpack", CP_TASK_UNPACK_O, 2.0 * (double)T * U * D * BF16);
    use(k, P, from, 0, T * U * D * BF16, CP_READ);
    use(k, P, attn_buf, (int64_t)s * U * D * BF16, T * U * D * BF16, s == 0 ? CP_DEF : CP_WRITE);
}

/* One layer's forward (also the recompute): from its input x to the attention output, h2, xn2; with `mlp`, also the
 * tiled MLP writing the layer output into `out`. Without `attention`, o_proj reads the output kept from the forward,
 * and neither the attention nor the all-to-all of its output back runs again. */
static void layer_forward(builder *B, const bufset *b, const modset *M, const unit_ref *w, int x, int out, bool mlp,
                          const attn_bufs *a, bool attention) {
    cp_plan *P = B->P;
    const cp_model *m = &P->spec.model;
    int64_t T = P->T, hid = m->hidden, D = m->head_dim, H = m->heads, F = m->ffn;
    int attn_buf = a->out, lse_buf = a->lse;
    cp_step *k = kernel(B, M->norm_h, "fwd", CP_TASK_NORM1, (double)T * hid * 2 * BF16);
    rd(k, P, x);
    op_weight(k, P, w, CP_W_NORM1, CP_READ);
    wr(k, P, b->xn);
    wr(k, P, b->rstd1);
    k->count = T;
    if (attention) {
        for (int s = 0; s < P->nstages; s++) {
            B->stage = s;
            stage_qkv(B, b, M, w, s, P->stages[s * P->C].kv_fresh);
            stage_attention(B, b, M, s, lse_buf, attn_buf);
        }
        B->stage = -1;
    } else {
        P->flops_attn_saved += P->nstages * attn_fwd_flops(P) * P->spec.train.micro_batches;
    }
    cp_step *g = gemm(B, "o_proj", T, hid, H * D, false, true);
    rd(g, P, attn_buf);
    op_weight(g, P, w, CP_W_O, CP_READ);
    rd(g, P, x);
    wr(g, P, b->h2);
    g->gemm.has_c = true;
    k = kernel(B, M->norm_h, "fwd", CP_TASK_NORM2, (double)T * hid * 2 * BF16);
    rd(k, P, b->h2);
    op_weight(k, P, w, CP_W_NORM2, CP_READ);
    wr(k, P, b->xn2);
    wr(k, P, b->rstd2);
    k->count = T;
    if (!mlp) return;
    int64_t t = P->mlp_tile, ntiles = T / t;
    int body = 0;
    for (int64_t i = 0; i < ntiles; i++) {
        B->tile = (int)i;
        if (i == 1) body = P->nsteps;
        const cp_weight gu[2] = {CP_W_GATE, CP_W_UP};
        const int gub[2] = {b->mlp_gate, b->mlp_up};
        for (int j = 0; j < 2; j++) {
            g = gemm(B, j ? "up_proj" : "gate_proj", t, F, hid, false, true);
            use_tile(g, P, b->xn2, i, t * hid * BF16, CP_READ);
            op_weight(g, P, w, gu[j], CP_READ);
            wr(g, P, gub[j]);
        }
        k = kernel(B, M->swiglu, "fwd", CP_TASK_SWIGLU, 3.0 * (double)t * F * BF16);
        rd(k, P, b->mlp_gate);
        rd(k, P, b->mlp_up);
        wr(k, P, b->mlp_act);
        k->count = t;
        g = gemm(B, "down_proj", t, hid, F, false, true);
        rd(g, P, b->mlp_act);
        op_weight(g, P, w, CP_W_DOWN, CP_READ);
        use_tile(g, P, b->h2, i, t * hid * BF16, CP_READ);
        use_tile(g, P, out, i, t * hid * BF16, i == 0 ? CP_DEF : CP_WRITE);
        g->gemm.has_c = true;
        if (i == 1) i = fold_tiles(B, body, ntiles);
    }
    B->tile = -1;
}

/* The MLP backward over tiles: recompute gate/up/act per tile, then the gradients; dres is d(layer output). */
static void mlp_backward(builder *B, const bufset *b, const modset *M, const unit_ref *w) {
    cp_plan *P = B->P;
    const cp_model *m = &P->spec.model;
    int64_t T = P->T, hid = m->hidden, F = m->ffn, t = P->mlp_tile, ntiles = T / t;
    int body = 0;
    for (int64_t i = 0; i < ntiles; i++) {
        B->tile = (int)i;
        if (i == 1) body = P->nsteps;
        int64_t rbytes = t * hid * BF16;
        const cp_weight gu[2] = {CP_W_GATE, CP_W_UP};
        const int gub[2] = {b->mlp_gate, b->mlp_up};
        for (int j = 0; j < 2; j++) {
            cp_step *g = gemm(B, j ? "up_proj" : "gate_proj", t, F, hid, false, true);
            use_tile(g, P, b->xn2, i, rbytes, CP_READ);
            op_weight(g, P, w, gu[j], CP_READ);
            wr(g, P, gub[j]);
        }
        cp_step *k = kernel(B, M->swiglu, "fwd", CP_TASK_SWIGLU, 3.0 * (double)t * F * BF16);
        rd(k, P, b->mlp_gate);
        rd(k, P, b->mlp_up);
        wr(k, P, b->mlp_act);
        k->count = t;
        /* dWdown += dres^T act */
        cp_step *g = weight_grad_gemm(B, "d_wdown", hid, F, t);
        use_tile(g, P, b->dres, i, rbytes, CP_READ);
        rd(g, P, b->mlp_act);
        op_wgrad(g, P, w, CP_W_DOWN);
        g->gemm.accumulate = g->gemm.out_f32 = true;
        /* dact = dres Wdown, into act's buffer */
        g = grad_gemm(B, "d_act", t, F, hid, false, false);
        use_tile(g, P, b->dres, i, rbytes, CP_READ);
        op_weight(g, P, w, CP_W_DOWN, CP_READ);
        wr(g, P, b->mlp_act);
        k = kernel(B, M->swiglu, "bwd", CP_TASK_SWIGLU_BWD, 5.0 * (double)t * F * BF16);
        rd(k, P, b->mlp_act);
        rw(k, P, b->mlp_gate);
        rw(k, P, b->mlp_up);
        k->count = t;
        for (int j = 0; j < 2; j++) {
            g = weight_grad_gemm(B, j ? "d_wup" : "d_wgate", F, hid, t);
            rd(g, P, gub[j]);
            use_tile(g, P, b->xn2, i, rbytes, CP_READ);
            op_wgrad(g, P, w, gu[j]);
            g->gemm.accumulate = g->gemm.out_f32 = true;
            g = grad_gemm(B, j ? "d_xn2_up" : "d_xn2_gate", t, hid, F, false, false);
            rd(g, P, gub[j]);
            op_weight(g, P, w, gu[j], CP_READ);
            use_tile(g, P, b->dxn, i, rbytes, j ? CP_RW : (i == 0 ? CP_DEF : CP_WRITE));
            g->gemm.accumulate = j == 1;
        }
        if (i == 1) i = fold_tiles(B, body, ntiles);
    }
    B->tile = -1;
}

/* d(projection) of `nh` heads (the first is head row0 of the weight) in token layout -> dxn += d W, dW += d^T xn. */
static void proj_backward(builder *B, const bufset *b, const unit_ref *w, cp_weight wt, int64_t row0, int64_t nh,
                          int dbuf, bool first, const char *what_dw, const char *what_dx) {
    cp_plan *P = B->P;
    const cp_model *m = &P->spec.model;
    int64_t T = P->T, hid = m->hidden, D = m->head_dim;
    cp_step *g = weight_grad_gemm(B, what_dw, nh * D, hid, T);
    use(g, P, dbuf, 0, T * nh * D * BF16, CP_READ);
    rd(g, P, b->xn);
    use(g, P, w->gbuf, (w->gbase + P->layout.off[wt] + row0 * D * hid) * F32, nh * D * hid * F32, CP_RW);
    g->gemm.accumulate = g->gemm.out_f32 = true;
    g = grad_gemm(B, what_dx, T, hid, nh * D, false, false);
    use(g, P, dbuf, 0, T * nh * D * BF16, CP_READ);
    use(g, P, w->wbuf, (w->wbase + P->layout.off[wt] + row0 * D * hid) * BF16, nh * D * hid * BF16, CP_READ);
    use(g, P, b->dxn, 0, -1, first ? CP_WRITE : CP_RW);
    g->gemm.accumulate = !first;
}

/* RoPE backward and (qk-norm) backward of a projection's gradient in token layout. */
static void rope_norm_backward(builder *B, const bufset *b, const modset *M, const unit_ref *w, int dbuf, int raw,
                               int rstd, cp_weight nw, int64_t nh, cp_task task) {
    cp_plan *P = B->P;
    const cp_model *m = &P->spec.model;
    int64_t T = P->T, D = m->head_dim;
    rope(B, b, M->rope, "bwd", task, dbuf, nh);
    if (!m->qk_norm) return;
    cp_step *k = kernel(B, M->norm_d, "bwd", CP_TASK_QK_NORM_BWD, (double)T * nh * D * 3 * BF16);
    use(k, P, dbuf, 0, T * nh * D * BF16, CP_RW);
    rd(k, P, raw);
    op_weight(k, P, w, nw, CP_READ);
    rd(k, P, rstd);
    op_wgrad(k, P, w, nw);
    wr(k, P, b->norm_part); /* the blocks' weight-gradient partials, summed in order by the step's second launch */
    k->count = T * nh;
}

/* The attention backward of one layer, stage by stage (recomputing Q, K, V per stage). */
static void attention_backward(builder *B, const bufset *b, const modset *M, const unit_ref *w, int lse_buf) {
    cp_plan *P = B->P;
    const cp_model *m = &P->spec.model;
    int64_t T = P->T, S = P->group_tokens, D = m->head_dim, U = P->U, u = P->u, C = P->C;
    int64_t nkv = P->repl > 1 ? m->kv_heads : C * P->kvr;
    bool first_dx = true;
    int home = 0; /* ring: the receive slot the own block's dK, dV come home to */
    for (int s = 0; s < P->nstages; s++) {
        B->stage = s;
        const cp_stage_rank *e = &P->stages[s * C];
        stage_qkv(B, b, M, w, s, e->kv_fresh);
        /* dO and delta of the stage's heads, from token layout columns to head layout */
        int64_t sz[2] = {T * U * D * BF16, T * U * F32};
        const int src[2] = {b->dattn, b->delta_tok}, dst[2] = {b->do_head, b->delta_head};
        for (int i = 0; i < 2; i++) {
            cp_step *k = kernel(B, i ? M->lay_delta : M->lay_q, "pack", i ? CP_TASK_PACK_DELTA : CP_TASK_PACK_DO,
                                2.0 * (double)sz[i]);
            use(k, P, src[i], (int64_t)s * U * (i ? F32 : D * BF16), sz[i], CP_READ);
            if (C == 1) {
                wr(k, P, dst[i]);
                continue;
            }
            use(k, P, b->a2a_send, 0, sz[i], CP_DEF);
            cp_step *a = collective(B, CP_OP_ALLTOALL, i ? "a2a_delta" : "a2a_do", sz[i]);
            use(a, P, b->a2a_send, 0, sz[i], CP_READ);
            wr(a, P, dst[i]);
        }
        /* the group's dK, dV in fp32, summed over its stages (and with a ring over the ring's positions), or -1 where
         * the kernel writes them in bf16 */
        int dkv = P->ring > 1 ? b->ring_dkv[home] : P->group_len > 1 ? b->dkv_acc : -1;
        if (dkv >= 0 && e->kv_fresh) zero(B, dkv, P->bufs[dkv].bytes);
        /* with documents a ring's step 0 runs in half launches too, each adding its dQ to the stage's rows */
        if (P->ring > 1 && P->docs) zero_def(B, b->dq_acc, 0, S * u * D * F32);
        else zero_dq_workspace(B, b->dq_acc, &P->modules[M->attn]);
        if (P->ring > 1) {
            ring_attention_bwd(B, b, M, s, lse_buf, &home);
            dkv = b->ring_dkv[home];
        } else {
            cp_step *a = kernel(B, M->attn, "bwd", CP_TASK_ATTN_BWD, 0);
            rd_qkv(a, P, b->q_head, b->k_head, b->v_head);
            rd(a, P, b->do_head);
            use(a, P, lse_buf, (int64_t)s * u * S * F32, u * S * F32, CP_READ);
            rd(a, P, b->delta_head);
            rw(a, P, b->dq_acc);
            if (dkv >= 0) rw(a, P, dkv);
            else {
                wr(a, P, b->dk_head);
                wr(a, P, b->dv_head);
            }
            rd_docs(a, P, b->doc_start, b->doc_end);
            a->flops = 2.5 * attn_fwd_flops(P);
        }
        cp_step *cv = kernel(B, M->attn, "bwd_dq", CP_TASK_ATTN_BWD_DQ, (double)S * u * D * (F32 + BF16));
        rd(cv, P, b->dq_acc);
        wr(cv, P, b->dq_head);
        /* dq back to token layout, then RoPE/norm backward and the projection gradients */
        int dq_tok = b->dq_head;
        if (C > 1) {
            cp_step *c = collective(B, CP_OP_ALLTOALL, "a2a_dq", T * U * D * BF16);
            rd(c, P, b->dq_head);
            use(c, P, b->a2a_recv, 0, T * U * D * BF16, CP_DEF);
            cp_step *k = kernel(B, M->lay_q, "unpack", CP_TASK_UNPACK_DQ, 2.0 * (double)T * U * D * BF16);
            use(k, P, b->a2a_recv, 0, T * U * D * BF16, CP_READ);
            use(k, P, b->q_tok, 0, T * U * D * BF16, CP_WRITE); /* q_tok is free again: reuse for dq */
            dq_tok = b->q_tok;
        }
        rope_norm_backward(B, b, M, w, dq_tok, b->q_raw, b->q_rstd, CP_W_QNORM, U, CP_TASK_ROPE_DQ);
        proj_backward(B, b, w, CP_W_Q, (int64_t)s * U, U, dq_tok, first_dx, "d_wq", "d_xn_q");
        first_dx = false;
        if (!e->kv_last) continue;
        /* dK, dV of the group: back to token layout once */
        const int dtok[2] = {b->k_tok, b->v_tok};
        for (int i = 0; i < 2; i++) {
            int64_t head_bytes = S * P->kvr * D * BF16;
            int src = dkv >= 0 ? b->dk_head : (i ? b->dv_head : b->dk_head);
            if (dkv >= 0) {
                cp_step *k = kernel(B, M->cast, "f32_to_bf16", i ? CP_TASK_CAST_DV : CP_TASK_CAST_DK,
                                    3.0 * (double)head_bytes);
                use(k, P, dkv, (int64_t)i * S * P->kvr * D * F32, S * P->kvr * D * F32, CP_READ);
                use(k, P, b->dk_head, 0, head_bytes, CP_WRITE);
                k->count = S * P->kvr * D;
                src = b->dk_head;
            }
            if (C > 1) {
                int64_t sent = T * C * P->kvr * D * BF16;
                cp_step *c = collective(B, CP_OP_ALLTOALL, i ? "a2a_dv" : "a2a_dk", sent);
                use(c, P, src, 0, head_bytes, CP_READ);
                use(c, P, b->a2a_recv, 0, sent, CP_DEF);
                /* replicated KV heads: the replicas' gradients are summed into a cleared buffer */
                if (P->repl > 1) zero(B, dtok[i], T * nkv * D * BF16);
                cp_step *k = kernel(B, M->lay_kv, P->repl > 1 ? "unpack_add" : "unpack",
                                    i ? CP_TASK_UNPACK_DV : CP_TASK_UNPACK_DK, 2.0 * (double)sent);
                use(k, P, b->a2a_recv, 0, sent, CP_READ);
                use(k, P, dtok[i], 0, T * nkv * D * BF16, P->repl > 1 ? CP_RW : CP_WRITE);
                src = dtok[i];
            } /* one rank: head layout is token layout, so src is already where the projections read */
            int64_t grp = s / P->group_len;
            int64_t row0 = P->repl > 1 ? 0 : grp * nkv;
            if (i == 0) rope_norm_backward(B, b, M, w, src, b->k_raw, b->k_rstd, CP_W_KNORM, nkv, CP_TASK_ROPE_DK);
            proj_backward(B, b, w, i ? CP_W_V : CP_W_K, row0, nkv, src, false, i ? "d_wv" : "d_wk",
                          i ? "d_xn_v" : "d_xn_k");
        }
    }
    B->stage = -1;
}

/* The backward of layer l: recompute, MLP backward, norms, output projection, attention stages. */
static void layer_backward(builder *B, const bufset *b, const modset *M, const unit_ref *w, int x) {
    cp_plan *P = B->P;
    const cp_model *m = &P->spec.model;
    int64_t T = P->T, hid = m->hidden, D = m->head_dim, H = m->heads;
    attn_bufs a = attn_of(P, b, B->layer, false);
    int attn_buf = a.out, lse_buf = a.lse;
    B->phase = CP_PHASE_RECOMPUTE;
    layer_forward(B, b, M, w, x, -1, false, &a, !a.kept);
    B->phase = CP_PHASE_BWD;
    mlp_backward(B, b, M, w);
    /* dh2 = dres + norm2_bwd(dxn2) */
    cp_step *k = kernel(B, M->norm_h, "bwd", CP_TASK_NORM2_BWD, (double)T * hid * 4 * BF16);
    rd(k, P, b->dxn);
    rd(k, P, b->h2);
    op_weight(k, P, w, CP_W_NORM2, CP_READ);
    rd(k, P, b->rstd2);
    rd(k, P, b->dres);
    wr(k, P, b->dh2);
    op_wgrad(k, P, w, CP_W_NORM2);
    wr(k, P, b->norm_part);
    k->count = T;
    /* output projection */
    cp_step *g = weight_grad_gemm(B, "d_wo", hid, H * D, T);
    rd(g, P, b->dh2);
    rd(g, P, attn_buf);
    op_wgrad(g, P, w, CP_W_O);
    g->gemm.accumulate = g->gemm.out_f32 = true;
    g = grad_gemm(B, "d_attn", T, H * D, hid, false, false);
    rd(g, P, b->dh2);
    op_weight(g, P, w, CP_W_O, CP_READ);
    wr(g, P, b->dattn);
    k = kernel(B, M->delta, "fwd", CP_TASK_ATTN_DELTA, (double)T * H * D * 2 * BF16);
    rd(k, P, b->dattn);
    rd(k, P, attn_buf);
    wr(k, P, b->delta_tok);
    k->count = T;
    k->heads = H;
    attention_backward(B, b, M, w, lse_buf);
    /* dres = dh2 + norm1_bwd(dxn) */
    k = kernel(B, M->norm_h, "bwd", CP_TASK_NORM1_BWD, (double)T * hid * 4 * BF16);
    rd(k, P, b->dxn);
    rd(k, P, x);
    op_weight(k, P, w, CP_W_NORM1, CP_READ);
    rd(k, P, b->rstd1);
    rd(k, P, b->dh2);
    wr(k, P, b->dres);
    op_wgrad(k, P, w, CP_W_NORM1);
    wr(k, P, b->norm_part);
    k->count = T;
}

static void make_modules(cp_plan *P, modset *M) {
    const cp_model *m = &P->spec.model;
    cp_kernel_spec k;
    int64_t T = P->T, D = m->head_dim;
    cp_k_rmsnorm(&k, m->hidden, m->norm_eps);
    M->norm_h = cp_plan_module_of(P, &k);
    M->norm_d = -1;
    if (m->qk_norm) {
        cp_k_rmsnorm(&k, D, m->norm_eps);
        M->norm_d = cp_plan_module_of(P, &k);
    }
    cp_k_rope(&k, m);
    cp_k_rope_positions(&k, P->doc_positions);
    M->rope = cp_plan_module_of(P, &k);
    cp_k_swiglu(&k, m->ffn);
    M->swiglu = cp_plan_module_of(P, &k);
    cp_k_loss(&k, m->vocab);
    M->loss = cp_plan_module_of(P, &k);
    cp_k_embedding(&k, m->vocab, m->hidden);
    M->embed = cp_plan_module_of(P, &k);
    cp_k_adamw(&k);
    M->adamw = cp_plan_module_of(P, &k);
    cp_k_attn_delta(&k, D);
    M->delta = cp_plan_module_of(P, &k);
    /* with a ring, the own block's launch adds its dK, dV to the travelling fp32 accumulator */
    bool ring = P->ring > 1;
    cp_k_attention(&k, D, P->u, P->kvr, P->group_tokens, true, ring || P->group_len > 1,
                   !P->spec.train.deterministic);
    cp_k_attention_docs(&k, P->docs);
    M->attn = cp_plan_module_of(P, &k);
    M->attn_half = M->merge = M->attn_diag = -1;
    if (ring) {
        cp_k_attention(&k, D, P->u, P->kvr, P->group_tokens / 2, false, true, !P->spec.train.deterministic);
        cp_k_attention_lse_stride(&k, P->group_tokens); /* columns of the stage's LSE rows: lse_halves */
        cp_k_attention_docs(&k, P->docs);
        M->attn_half = cp_plan_module_of(P, &k);
        if (P->docs) { /* step 0's diagonal halves (gen/ring.h) */
            cp_k_attention(&k, D, P->u, P->kvr, P->group_tokens / 2, true, true, !P->spec.train.deterministic);
            cp_k_attention_lse_stride(&k, P->group_tokens);
            cp_k_attention_docs(&k, true);
            M->attn_diag = cp_plan_module_of(P, &k);
        }
        cp_k_attn_merge(&k, D);
        M->merge = cp_plan_module_of(P, &k);
    }
    M->cast = -1;
    if (ring || P->group_len > 1 || (P->C > 1 && shard_accumulates(P, 0))) {
        cp_k_cast(&k);
        M->cast = cp_plan_module_of(P, &k);
    }
    /* layout kernels: all-to-all packing, and with one rank the strided copies between a stage's columns and
     * the attention kernels' contiguous head layout */
    cp_k_ulysses(&k, P->C, 1, T, P->u, D * BF16);
    M->lay_q = cp_plan_module_of(P, &k);
    cp_k_ulysses(&k, P->C, 1, T, P->u, F32);
    M->lay_delta = cp_plan_module_of(P, &k);
    M->lay_kv = -1;
    if (P->C > 1) {
        cp_k_ulysses(&k, P->C, P->repl, T, P->kvr, D * BF16);
        M->lay_kv = cp_plan_module_of(P, &k);
    }
}

/* What a ring adds to a stage (cp_ring_terms_of, term by term): the K and V blocks arriving, the merge's output and
 * a launch's partial LSE, the travelling dK, dV accumulators and a step's own part, a half launch's dQ workspace. */
static void ring_buffers(cp_plan *P, const modset *M, bufset *b) {
    for (int j = 0; j < 2; j++) b->ring_k[j] = b->ring_v[j] = b->ring_dkv[j] = -1;
    b->ring_o = b->ring_lse = b->ring_dkv_step = b->dq_half = -1;
    if (P->ring == 1) return;
    cp_ring_terms t;
    cp_ring_terms_of(P->ring, P->group_tokens, P->u, P->kvr, P->spec.model.head_dim, &t);
    char name[48];
    for (int j = 0; j < 2; j++) {
        if (j * t.kv_block < t.kv_recv) { /* the K/V slots a ring uses: two, or one with P = 2 */
            snprintf(name, sizeof name, "ring_k.%d", j);
            b->ring_k[j] = add_buf(P, name, CP_SPACE_GPU, CP_CAT_RING, t.kv_block / 2, false);
            snprintf(name, sizeof name, "ring_v.%d", j);
            b->ring_v[j] = add_buf(P, name, CP_SPACE_GPU, CP_CAT_RING, t.kv_block / 2, false);
        }
        snprintf(name, sizeof name, "ring_dkv.%d.f32", j);
        b->ring_dkv[j] = add_buf(P, name, CP_SPACE_GPU, CP_CAT_RING, t.dkv_recv / 2, false);
    }
    b->ring_o = add_buf(P, "ring_o.f32", CP_SPACE_GPU, CP_CAT_RING, t.o_acc, false);
    b->ring_lse = add_buf(P, "ring_lse", CP_SPACE_GPU, CP_CAT_RING, t.lse_blk, false);
    b->ring_dkv_step = add_buf(P, "ring_dkv_step.f32", CP_SPACE_GPU, CP_CAT_RING, t.dkv_step, false);
    /* the fp32 dQ of a half launch, then its progress counters (kernels_attn.h) */
    int64_t dq_half = cp_k_attention_workspace_bytes(&P->modules[M->attn_half]);
    if (M->attn_diag >= 0) dq_half = CP_MAX(dq_half, cp_k_attention_workspace_bytes(&P->modules[M->attn_diag]));
    b->dq_half = add_buf(P, "dq_half.f32", CP_SPACE_GPU, CP_CAT_RING, dq_half, false);
}

static void make_buffers(cp_plan *P, const modset *M, bufset *b) {
    const cp_model *m = &P->spec.model;
    /* S: the head layout's length, the group's tokens */
    int64_t T = P->T, S = P->group_tokens, hid = m->hidden, D = m->head_dim, H = m->heads, F = m->ffn, V = m->vocab;
    int64_t U = P->U, u = P->u, C = P->C, L = m->layers, shard = P->params_shard;
    int64_t nkv = P->repl > 1 ? m->kv_heads : C * P->kvr;
    cp_space opt = P->opt_on_host ? CP_SPACE_HOST : CP_SPACE_GPU;
    char name[48];

    b->params = add_buf(P, "params.bf16", CP_SPACE_GPU, CP_CAT_PARAMS, shard * BF16, true);
    b->grads = add_buf(P, "grads.f32", CP_SPACE_GPU, CP_CAT_GRADS, shard * F32, true);
    b->master = add_buf(P, "master.f32", opt, CP_CAT_MASTER, shard * F32, true);
    b->adam_m = add_buf(P, "adam_m.f32", opt, CP_CAT_OPTIM, shard * F32, true);
    b->adam_v = add_buf(P, "adam_v.f32", opt, CP_CAT_OPTIM, shard * F32, true);
    b->host_grads = b->host_params = -1;
    P->host_chunk = 0;
    if (P->opt_on_host) {
        /* two pinned chunks each way: gradients come down and parameters go up while the CPU updates a chunk */
        P->host_chunk = CP_MIN(shard, (int64_t)CP_HOST_CHUNK);
        b->host_grads = add_buf(P, "grads_host_ring.f32", CP_SPACE_HOST, CP_CAT_GRADS, 2 * P->host_chunk * F32, true);
        b->host_params = add_buf(P, "params_host_ring.bf16", CP_SPACE_HOST, CP_CAT_PARAMS, 2 * P->host_chunk * BF16,
                                 true);
    }
    b->w_layer[0] = b->w_layer[1] = b->g_layer = b->w_embed = b->g_embed = b->w_head = b->g_head = -1;
    if (C > 1) {
        /* gathered weights and full gradients of the unit in use; the memory planner overlaps those whose
         * lifetimes do not (the embedding's and the LM head's) */
        int64_t lp = P->layout.padded, e = P->unit_padded[0], h = P->unit_padded[P->nunits - 1];
        b->w_layer[0] = add_buf(P, "layer_weights.0", CP_SPACE_GPU, CP_CAT_GATHERED, lp * BF16, false);
        b->w_layer[1] = add_buf(P, "layer_weights.1", CP_SPACE_GPU, CP_CAT_GATHERED, lp * BF16, false);
        b->w_embed = add_buf(P, "embed_weights", CP_SPACE_GPU, CP_CAT_GATHERED, e * BF16, false);
        b->w_head = add_buf(P, "head_weights", CP_SPACE_GPU, CP_CAT_GATHERED, h * BF16, false);
        b->g_layer = add_buf(P, "layer_grads.f32", CP_SPACE_GPU, CP_CAT_UNIT_GRADS, lp * F32, false);
        b->g_embed = add_buf(P, "embed_grads.f32", CP_SPACE_GPU, CP_CAT_UNIT_GRADS, e * F32, false);
        b->g_head = add_buf(P, "head_grads.f32", CP_SPACE_GPU, CP_CAT_UNIT_GRADS, h * F32, false);
    }
    int k = P->ckpt_every;
    b->ckpt = cp_xcalloc((size_t)L, sizeof *b->ckpt);
    for (int l = 0; l < L; l++) {
        b->ckpt[l] = -1;
        if (l % k) continue;
        bool host = l < P->ckpt_host_layers;
        snprintf(name, sizeof name, "ckpt.%d", l);
        b->ckpt[l] = add_buf(P, name, host ? CP_SPACE_HOST : CP_SPACE_GPU, CP_CAT_CKPT, T * hid * BF16, false);
    }
    /* between checkpoints: the inputs of a segment's later layers, written by the forward and again by the
     * backward's recompute of the segment */
    b->seg = cp_xcalloc((size_t)k, sizeof *b->seg);
    for (int j = 1; j < k; j++) {
        snprintf(name, sizeof name, "segment_input.%d", j);
        b->seg[j] = add_buf(P, name, CP_SPACE_GPU, CP_CAT_CKPT, T * hid * BF16, false);
    }
    b->xs[0] = b->xs[1] = -1;
    if (P->ckpt_host_layers > 0) {
        b->xs[0] = add_buf(P, "ckpt_stage.0", CP_SPACE_GPU, CP_CAT_CKPT, T * hid * BF16, false);
        b->xs[1] = add_buf(P, "ckpt_stage.1", CP_SPACE_GPU, CP_CAT_CKPT, T * hid * BF16, false);
    }
    /* kept attention: each layer's output in token layout and its heads' LSE, from its forward to its backward */
    b->attn_keep = cp_xcalloc((size_t)L, sizeof *b->attn_keep);
    b->lse_keep = cp_xcalloc((size_t)L, sizeof *b->lse_keep);
    for (int l = 0; l < L; l++) {
        cp_attn_keep where = cp_plan_attn_where(P, l);
        b->attn_keep[l] = b->lse_keep[l] = -1;
        if (where == CP_ATTN_RECOMPUTE) continue;
        cp_space sp = where == CP_ATTN_HOST ? CP_SPACE_HOST : CP_SPACE_GPU;
        snprintf(name, sizeof name, "attn_out.%d", l);
        b->attn_keep[l] = add_buf(P, name, sp, CP_CAT_ATTN_SAVED, T * H * D * BF16, false);
        snprintf(name, sizeof name, "lse.%d", l);
        b->lse_keep[l] = add_buf(P, name, sp, CP_CAT_ATTN_SAVED, (H / C) * S * F32, false);
    }
    b->attn_stage[0] = b->attn_stage[1] = b->lse_stage[0] = b->lse_stage[1] = -1;
    for (int j = 0; j < 2 && P->attn_host_layers > 0; j++) {
        snprintf(name, sizeof name, "attn_stage.%d", j);
        b->attn_stage[j] = add_buf(P, name, CP_SPACE_GPU, CP_CAT_ATTN_SAVED, T * H * D * BF16, false);
        snprintf(name, sizeof name, "lse_stage.%d", j);
        b->lse_stage[j] = add_buf(P, name, CP_SPACE_GPU, CP_CAT_ATTN_SAVED, (H / C) * S * F32, false);
    }
    b->h_final = add_buf(P, "h_final", CP_SPACE_GPU, CP_CAT_ACT, T * hid * BF16, false);
    b->xn = add_buf(P, "xn", CP_SPACE_GPU, CP_CAT_ACT, T * hid * BF16, false);
    b->rstd1 = add_buf(P, "rstd1", CP_SPACE_GPU, CP_CAT_ACT, T * F32, false);
    b->h2 = add_buf(P, "h2", CP_SPACE_GPU, CP_CAT_ACT, T * hid * BF16, false);
    b->xn2 = add_buf(P, "xn2", CP_SPACE_GPU, CP_CAT_ACT, T * hid * BF16, false);
    b->rstd2 = add_buf(P, "rstd2", CP_SPACE_GPU, CP_CAT_ACT, T * F32, false);
    b->dres = add_buf(P, "d_resid", CP_SPACE_GPU, CP_CAT_ACT, T * hid * BF16, false);
    b->dh2 = add_buf(P, "d_h2", CP_SPACE_GPU, CP_CAT_ACT, T * hid * BF16, false);
    b->dxn = add_buf(P, "d_xn", CP_SPACE_GPU, CP_CAT_ACT, T * hid * BF16, false);
    b->xf = add_buf(P, "x_final_norm", CP_SPACE_GPU, CP_CAT_ACT, T * hid * BF16, false);
    b->rstdf = add_buf(P, "rstd_final", CP_SPACE_GPU, CP_CAT_ACT, T * F32, false);
    b->dxf = add_buf(P, "d_x_final_norm", CP_SPACE_GPU, CP_CAT_ACT, T * hid * BF16, false);
    b->attn_out = add_buf(P, "attn_out", CP_SPACE_GPU, CP_CAT_ATTN_KEPT, T * H * D * BF16, false);
    b->lse_all = add_buf(P, "lse", CP_SPACE_GPU, CP_CAT_ATTN_KEPT, (H / C) * S * F32, false);
    b->dattn = add_buf(P, "d_attn_out", CP_SPACE_GPU, CP_CAT_ATTN_KEPT, T * H * D * BF16, false);
    b->delta_tok = add_buf(P, "delta", CP_SPACE_GPU, CP_CAT_ATTN_KEPT, T * H * F32, false);
    /* one stage */
    b->q_tok = add_buf(P, "q_stage", CP_SPACE_GPU, CP_CAT_ATTN, T * U * D * BF16, false);
    b->k_tok = add_buf(P, "k_stage", CP_SPACE_GPU, CP_CAT_ATTN, T * nkv * D * BF16, false);
    b->v_tok = add_buf(P, "v_stage", CP_SPACE_GPU, CP_CAT_ATTN, T * nkv * D * BF16, false);
    b->q_raw = b->k_raw = b->q_rstd = b->k_rstd = -1;
    if (m->qk_norm) {
        b->q_raw = add_buf(P, "q_prenorm", CP_SPACE_GPU, CP_CAT_ATTN, T * U * D * BF16, false);
        b->k_raw = add_buf(P, "k_prenorm", CP_SPACE_GPU, CP_CAT_ATTN, T * nkv * D * BF16, false);
        b->q_rstd = add_buf(P, "q_rstd", CP_SPACE_GPU, CP_CAT_ATTN, T * U * F32, false);
        b->k_rstd = add_buf(P, "k_rstd", CP_SPACE_GPU, CP_CAT_ATTN, T * nkv * F32, false);
    }
    b->a2a_send = b->a2a_recv = -1;
    b->q_head = b->q_tok; /* one rank: token layout is head layout */
    b->k_head = b->k_tok;
    b->v_head = b->v_tok;
    if (C > 1) {
        int64_t most = CP_MAX(T * U * D * BF16, T * C * P->kvr * D * BF16);
        b->a2a_send = add_buf(P, "a2a_send", CP_SPACE_GPU, CP_CAT_COMM, most, false);
        b->a2a_recv = add_buf(P, "a2a_recv", CP_SPACE_GPU, CP_CAT_COMM, most, false);
        b->q_head = add_buf(P, "q_heads", CP_SPACE_GPU, CP_CAT_ATTN, S * u * D * BF16, false);
        b->k_head = add_buf(P, "k_heads", CP_SPACE_GPU, CP_CAT_ATTN, S * P->kvr * D * BF16, false);
        b->v_head = add_buf(P, "v_heads", CP_SPACE_GPU, CP_CAT_ATTN, S * P->kvr * D * BF16, false);
    }
    b->o_head = add_buf(P, "o_heads", CP_SPACE_GPU, CP_CAT_ATTN, S * u * D * BF16, false);
    b->do_head = add_buf(P, "do_heads", CP_SPACE_GPU, CP_CAT_ATTN, S * u * D * BF16, false);
    b->delta_head = add_buf(P, "delta_heads", CP_SPACE_GPU, CP_CAT_ATTN, S * u * F32, false);
    b->dq_head = add_buf(P, "dq_heads", CP_SPACE_GPU, CP_CAT_ATTN, S * u * D * BF16, false);
    b->dk_head = add_buf(P, "dk_heads", CP_SPACE_GPU, CP_CAT_ATTN, S * P->kvr * D * BF16, false);
    b->dv_head = add_buf(P, "dv_heads", CP_SPACE_GPU, CP_CAT_ATTN, S * P->kvr * D * BF16, false);
    /* the fp32 dQ, S * u * D * 4 bytes, then the progress counters that order its sums (kernels_attn.h) */
    b->dq_acc = add_buf(P, "dq_accum.f32", CP_SPACE_GPU, CP_CAT_ATTN,
                        cp_k_attention_workspace_bytes(&P->modules[M->attn]), false);
    b->dkv_acc = -1;
    if (P->group_len > 1 && P->ring == 1) /* a ring sums a group's dK, dV in its home accumulator */
        b->dkv_acc = add_buf(P, "dkv_accum.f32", CP_SPACE_GPU, CP_CAT_ATTN, 2 * S * P->kvr * D * F32, false);
    ring_buffers(P, M, b);
    b->mlp_gate = add_buf(P, "mlp_gate", CP_SPACE_GPU, CP_CAT_MLP, P->mlp_tile * F * BF16, false);
    b->mlp_up = add_buf(P, "mlp_up", CP_SPACE_GPU, CP_CAT_MLP, P->mlp_tile * F * BF16, false);
    b->mlp_act = add_buf(P, "mlp_act", CP_SPACE_GPU, CP_CAT_MLP, P->mlp_tile * F * BF16, false);
    b->logits = add_buf(P, "logits", CP_SPACE_GPU, CP_CAT_LOSS, P->loss_tile * V * BF16, false);
    /* each token's loss, written tile by tile and summed in order once per micro-batch */
    b->token_loss = add_buf(P, "token_loss", CP_SPACE_GPU, CP_CAT_LOSS, T * F32, false);
    b->loss_sum = add_buf(P, "loss_sum", CP_SPACE_GPU, CP_CAT_WORKSPACE, CP_SCALARS_BYTES, true);
    /* the norm backwards' per-block weight-gradient rows (the largest of the norms' needs) and sumsq's per-block
     * partials: scratch of one step each, summed in a fixed order so the results are the same bits run to run */
    int64_t np = cp_k_scratch_bytes(&P->modules[M->norm_h], "bwd", T);
    if (M->norm_d >= 0) {
        np = CP_MAX(np, cp_k_scratch_bytes(&P->modules[M->norm_d], "bwd", T * U));
        np = CP_MAX(np, cp_k_scratch_bytes(&P->modules[M->norm_d], "bwd", T * nkv));
    }
    b->norm_part = add_buf(P, "norm_partials.f32", CP_SPACE_GPU, CP_CAT_WORKSPACE, np, false);
    b->sumsq_part = add_buf(P, "sumsq_partials", CP_SPACE_GPU, CP_CAT_WORKSPACE,
                            cp_k_scratch_bytes(&P->modules[M->adamw], "sumsq", shard), false);
    b->tokens = add_buf(P, "tokens", CP_SPACE_GPU, CP_CAT_WORKSPACE, T * 4, false);
    b->targets = add_buf(P, "targets", CP_SPACE_GPU, CP_CAT_WORKSPACE, T * 4, false);
    /* the rows sorted by token (stable, from the host): the embedding backward sums each token's rows without atomics */
    b->token_order = add_buf(P, "token_order", CP_SPACE_GPU, CP_CAT_WORKSPACE, T * 4, false);
    /* packed documents: the rows' RoPE positions, and each position's document bounds over the whole sequence (after
     * the all-to-all a rank's attention sees all of it) */
    b->positions = P->doc_positions ? add_buf(P, "positions", CP_SPACE_GPU, CP_CAT_WORKSPACE, T * 4, false) : -1;
    b->doc_start = P->docs ? add_buf(P, "doc_start", CP_SPACE_GPU, CP_CAT_WORKSPACE, P->S * 4, false) : -1;
    b->doc_end = P->docs ? add_buf(P, "doc_end", CP_SPACE_GPU, CP_CAT_WORKSPACE, P->S * 4, false) : -1;
    b->gemm_ws = add_buf(P, "gemm_workspace", CP_SPACE_GPU, CP_CAT_WORKSPACE, CP_GEMM_WORKSPACE, true);
}

/* Layer l's attention output and LSE kept on the host: out to it from the GPU staging pair of the layer's parity
 * after the layer's forward, or back into that pair one layer ahead of its backward (as the checkpoints). */
static void copy_attention(builder *B, const bufset *b, int l, cp_opkind dir) {
    cp_plan *P = B->P;
    bool out = dir == CP_OP_COPY_D2H;
    const int gpu[2] = {b->attn_stage[l % 2], b->lse_stage[l % 2]}, host[2] = {b->attn_keep[l], b->lse_keep[l]};
    for (int i = 0; i < 2; i++) {
        const char *what = out ? (i ? "offload_lse" : "offload_attn") : (i ? "prefetch_lse" : "prefetch_attn");
        cp_step *s = collective(B, dir, what, P->bufs[host[i]].bytes);
        rd(s, P, out ? gpu[i] : host[i]);
        wr(s, P, out ? host[i] : gpu[i]);
    }
}

int64_t cp_plan_input_ints(const cp_plan *P) {
    return 3 * P->T + (P->doc_positions ? P->T : 0) + (P->docs ? 2 * P->S : 0);
}

/* The program of one micro-batch (forward, loss, backward), then the optimizer step. */
static void make_program(cp_plan *P, const bufset *b, const modset *M) {
    const cp_model *m = &P->spec.model;
    int64_t T = P->T, hid = m->hidden, V = m->vocab, L = m->layers, C = P->C;
    builder B = {.P = P, .phase = CP_PHASE_FWD, .layer = -1, .stage = -1, .tile = -1,
                 .ring_step = -1, .ring_part = -1};
    int head_unit = P->nunits - 1;
    bool tied = m->tie_embeddings;
    cp_step *s;

    /* inputs arrive from the host (data loader) */
    s = collective(&B, CP_OP_COPY_H2D, cp_task_name(CP_TASK_LOAD_TOKENS), cp_plan_input_ints(P) * 4);
    s->task = CP_TASK_LOAD_TOKENS;
    s->stream = CP_STREAM_COMPUTE; /* the inputs of this micro-batch: nothing can start before them */
    wr(s, P, b->tokens);
    wr(s, P, b->targets);
    wr(s, P, b->token_order);
    if (P->doc_positions) wr(s, P, b->positions);
    if (P->docs) {
        wr(s, P, b->doc_start);
        wr(s, P, b->doc_end);
    }

    /* embedding */
    gather(&B, b, 0, 0);
    unit_ref emb = unit_at(P, b, 0, 0);
    int x0 = P->ckpt_host_layers > 0 ? b->xs[0] : b->ckpt[0];
    s = kernel(&B, M->embed, "fwd", CP_TASK_EMBED, 2.0 * (double)T * hid * BF16);
    rd(s, P, b->tokens);
    use(s, P, emb.wbuf, emb.wbase * BF16, V * hid * BF16, CP_READ);
    wr(s, P, x0);
    s->count = T;

    /* layers: forward, keeping each layer's input */
    for (int l = 0; l < L; l++) {
        B.layer = l;
        if (l + 1 < L) gather(&B, b, l + 2, (l + 1) % 2); /* prefetch next layer's weights */
        if (l == 0) gather(&B, b, 1, 0);
        bool host = l < P->ckpt_host_layers, next_host = l + 1 < P->ckpt_host_layers;
        int x = host ? b->xs[l % 2] : layer_input(b, P, l);
        if (host) {
            s = collective(&B, CP_OP_COPY_D2H, "offload", T * hid * BF16);
            rd(s, P, x);
            wr(s, P, b->ckpt[l]);
        }
        int out = l + 1 == L ? b->h_final : next_host ? b->xs[(l + 1) % 2] : layer_input(b, P, l + 1);
        unit_ref w = unit_at(P, b, l + 1, l % 2);
        attn_bufs a = attn_of(P, b, l, false);
        layer_forward(&B, b, M, &w, x, out, true, &a, true);
        if (cp_plan_attn_where(P, l) == CP_ATTN_HOST) copy_attention(&B, b, l, CP_OP_COPY_D2H);
    }
    B.layer = -1;

    /* final norm, LM head and loss over tiles; the backward of each tile follows at once */
    gather(&B, b, head_unit, 0);
    unit_ref hd = unit_at(P, b, head_unit, 0);
    int64_t norm_off = hd.wbase; /* the head unit holds the final norm, then the untied LM head */
    unit_ref lm = tied ? emb : hd;
    int64_t lm_off = tied ? emb.wbase : hd.wbase + align_up(hid, 64);
    if (tied) gather(&B, b, 0, 0); /* the tied LM head is the embedding */
    s = kernel(&B, M->norm_h, "fwd", CP_TASK_FINAL_NORM, (double)T * hid * 2 * BF16);
    rd(s, P, b->h_final);
    use(s, P, hd.wbuf, norm_off * BF16, hid * BF16, CP_READ);
    wr(s, P, b->xf);
    wr(s, P, b->rstdf);
    s->count = T;
    if (C > 1) {
        zero(&B, b->g_head, P->bufs[b->g_head].bytes);
        if (tied) zero(&B, b->g_embed, P->bufs[b->g_embed].bytes);
    }
    int64_t t = P->loss_tile, ntiles = T / t;
    int body = 0;
    for (int64_t i = 0; i < ntiles; i++) {
        B.tile = (int)i;
        if (i == 1) body = P->nsteps;
        int64_t rbytes = t * hid * BF16;
        cp_step *g = gemm(&B, "lm_head", t, V, hid, false, true);
        use_tile(g, P, b->xf, i, rbytes, CP_READ);
        use(g, P, lm.wbuf, lm_off * BF16, V * hid * BF16, CP_READ);
        wr(g, P, b->logits);
        s = kernel(&B, M->loss, "fwdbwd", CP_TASK_LOSS, 2.0 * (double)t * V * BF16);
        rw(s, P, b->logits);
        use_tile(s, P, b->targets, i, t * 4, CP_READ);
        use_tile(s, P, b->token_loss, i, t * F32, i == 0 ? CP_DEF : CP_WRITE);
        s->count = t;
        B.phase = CP_PHASE_BWD;
        g = weight_grad_gemm(&B, "d_lm_head", V, hid, t);
        rd(g, P, b->logits);
        use_tile(g, P, b->xf, i, rbytes, CP_READ);
        use(g, P, lm.gbuf, lm_off * F32, V * hid * F32, CP_RW);
        g->gemm.accumulate = g->gemm.out_f32 = true;
        g = grad_gemm(&B, "d_x_final", t, hid, V, false, false);
        rd(g, P, b->logits);
        use(g, P, lm.wbuf, lm_off * BF16, V * hid * BF16, CP_READ);
        use_tile(g, P, b->dxf, i, rbytes, i == 0 ? CP_DEF : CP_WRITE);
        B.phase = CP_PHASE_FWD;
        if (i == 1) i = fold_tiles(&B, body, ntiles);
    }
    B.tile = -1;
    B.phase = CP_PHASE_FWD;
    s = kernel(&B, M->loss, "sum", CP_TASK_LOSS_SUM, (double)T * F32);
    rd(s, P, b->token_loss);
    use(s, P, b->loss_sum, 0, F32, CP_RW); /* float 0: the loss */
    s->count = T;
    B.phase = CP_PHASE_BWD;
    s = kernel(&B, M->norm_h, "bwd", CP_TASK_FINAL_NORM_BWD, (double)T * hid * 3 * BF16);
    rd(s, P, b->dxf);
    rd(s, P, b->h_final);
    use(s, P, hd.wbuf, norm_off * BF16, hid * BF16, CP_READ);
    rd(s, P, b->rstdf);
    wr(s, P, b->dres);
    use(s, P, hd.gbuf, norm_off * F32, hid * F32, CP_RW);
    wr(s, P, b->norm_part);
    s->count = T;
    reduce_scatter(&B, b, head_unit, M->cast);
    /* free the tied gradient now; the embedding's backward sends its own, and sums the shard across groups once:
     * twice would count the head's part once per group again */
    if (tied) reduce_scatter_in_group(&B, b, 0, M->cast);

    /* layers backward, last first */
    if (L > 0) gather(&B, b, L, (L - 1) % 2);
    for (int l = (int)L - 1; l >= 0; l--) {
        B.layer = l;
        B.phase = CP_PHASE_BWD;
        bool host = l < P->ckpt_host_layers;
        int x = host ? b->xs[l % 2] : layer_input(b, P, l);
        int k = P->ckpt_every, a = l / k * k;
        if (l > a && (l == (int)L - 1 || l % k == k - 1)) {
            /* the top layer of a segment: its inputs from the segment's checkpoint, forward again */
            B.phase = CP_PHASE_RECOMPUTE;
            for (int j = a; j < l; j++) {
                B.layer = j;
                gather(&B, b, j + 1, j % 2);
                unit_ref wj = unit_at(P, b, j + 1, j % 2);
                attn_bufs aj = attn_of(P, b, j, true);
                layer_forward(&B, b, M, &wj, layer_input(b, P, j), layer_input(b, P, j + 1), true, &aj, !aj.kept);
            }
            B.layer = l;
            B.phase = CP_PHASE_BWD;
            gather(&B, b, l + 1, l % 2); /* the segment's gathers used this layer's slot */
        }
        if (l > 0) {
            gather(&B, b, l, (l - 1) % 2); /* prefetch the layer below */
            if (l - 1 < P->ckpt_host_layers) {
                s = collective(&B, CP_OP_COPY_H2D, "prefetch", T * hid * BF16);
                rd(s, P, b->ckpt[l - 1]);
                wr(s, P, b->xs[(l - 1) % 2]);
            }
            if (cp_plan_attn_where(P, l - 1) == CP_ATTN_HOST) copy_attention(&B, b, l - 1, CP_OP_COPY_H2D);
        }
        if (host && l == (int)L - 1) {
            s = collective(&B, CP_OP_COPY_H2D, "prefetch", T * hid * BF16);
            rd(s, P, b->ckpt[l]);
            wr(s, P, x);
        }
        if (l == (int)L - 1 && cp_plan_attn_where(P, l) == CP_ATTN_HOST) copy_attention(&B, b, l, CP_OP_COPY_H2D);
        unit_ref w = unit_at(P, b, l + 1, l % 2);
        if (C > 1) zero(&B, b->g_layer, P->bufs[b->g_layer].bytes);
        layer_backward(&B, b, M, &w, x);
        reduce_scatter(&B, b, l + 1, M->cast);
    }
    B.layer = -1;

    /* embedding backward: each token's rows summed in sorted order (deterministic, no atomics) */
    if (C > 1) zero(&B, b->g_embed, P->bufs[b->g_embed].bytes);
    s = kernel(&B, M->embed, "bwd_sorted", CP_TASK_EMBED_BWD, (double)T * hid * (BF16 + 2 * F32));
    rd(s, P, b->tokens);
    rd(s, P, b->token_order);
    rd(s, P, b->dres);
    use(s, P, emb.gbuf, emb.gbase * F32, V * hid * F32, CP_RW);
    s->count = T;
    reduce_scatter(&B, b, 0, M->cast);

    P->micro_steps = P->nsteps;

    /* optimizer: the global norm on the GPU (summed across ranks with the loss), then AdamW on the shard: on the
     * GPU, or on the host (the step streams the gradients down and the bf16 parameters up in chunks) */
    B.phase = CP_PHASE_OPTIM;
    int64_t shard = P->params_shard;
    s = kernel(&B, M->adamw, "sumsq", CP_TASK_GRAD_NORM, (double)shard * F32);
    rd(s, P, b->grads);
    wr(s, P, b->sumsq_part);
    use(s, P, b->loss_sum, F32, F32, CP_RW); /* float 1: the gradient's sum of squares */
    use(s, P, b->loss_sum, CP_SCALARS_SUMSQ_COUNTER, 4, CP_RW);
    s->count = shard;
    if (C > 1) {
        s = collective(&B, CP_OP_ALLREDUCE, "norm_allreduce", 2 * F32);
        use(s, P, b->loss_sum, 0, 2 * F32, CP_RW);
    }
    if (P->replicas * P->ring > 1) {
        /* the loss over every group (each group's sum already over its ranks); the gradients were all-reduced
         * across groups, so the group's sum of squares is already the norm's */
        s = collective(&B, CP_OP_ALLREDUCE, "loss_allreduce", F32);
        use(s, P, b->loss_sum, 0, F32, CP_RW);
        s->comm = CP_COMM_SHARD;
    }
    if (P->opt_on_host) {
        s = add_step(&B, CP_OP_KERNEL, cp_task_name(CP_TASK_ADAMW_HOST));
        s->task = CP_TASK_ADAMW_HOST;
        s->stream = CP_STREAM_COMPUTE;
        rd(s, P, b->grads);
        rw(s, P, b->host_grads);
        rw(s, P, b->master);
        rw(s, P, b->adam_m);
        rw(s, P, b->adam_v);
        rw(s, P, b->host_params);
        wr(s, P, b->params);
        s->count = shard;
        s->bytes = (double)shard * 16 * 2;
    } else {
        s = kernel(&B, M->adamw, "update", CP_TASK_ADAMW, (double)shard * (4 * F32 + 3 * F32 + BF16));
        rw(s, P, b->master);
        rw(s, P, b->adam_m);
        rw(s, P, b->adam_v);
        rd(s, P, b->grads);
        wr(s, P, b->params);
        s->count = shard;
    }
    zero(&B, b->grads, shard * F32);
}

/* ---------------------------------------------------------------- cost model */

/* What the ring's send/recvs in hand (`send` seconds) leave exposed beyond the attention under them (`attn`);
 * both start over. */
static double ring_exposed(double *send, double *attn) {
    double e = CP_MAX(0.0, *send - *attn);
    *send = *attn = 0;
    return e;
}

static void cost_model(cp_plan *P) {
    const cp_machine *mc = &P->spec.machine;
    const int mb = P->spec.train.micro_batches;
    double C = P->C, frac = (C - 1) / C;
    P->flops_attn = P->flops_other = 0;
    P->t_compute = P->t_attn = P->t_comm = P->t_copy = P->t_ring = P->t_ring_exposed = P->t_fp8_casts = 0;
    double layer_compute = 0, layer_hidden = 0, exposed = 0;
    int cur_layer = -2;
    /* attention kernels: the forward's and the backward's own rates at this head_dim, FLOP/s */
    const double attn_rate[2] = {cp_machine_attn_tflops(mc, false, P->spec.model.head_dim) * 1e12,
                                 cp_machine_attn_tflops(mc, true, P->spec.model.head_dim) * 1e12};
    /* A ring's send/recvs overlap the attention on the block in hand: the attention launches after them in the same
     * stage, up to the next send/recv after one of those; only what they take beyond them is exposed (as
     * cp_ring_exposed prices one block). Send/recvs with no attention between them (K then V) run one after the
     * other. */
    double ring_send = 0, ring_attn = 0;
    int ring_key = -1, lp = 0;
    for (int i = 0; i < P->nsteps; i++) {
        cp_step *s = &P->steps[i];
        int stage_key = ((s->layer + 1) * CP_PHASE_COUNT + (int)s->phase) * (P->nstages + 1) + s->stage + 1;
        if (ring_send > 0 && ((s->kind == CP_OP_SENDRECV && ring_attn > 0) || stage_key != ring_key))
            P->t_ring_exposed += ring_exposed(&ring_send, &ring_attn);
        /* a folded loop's body runs once per tile it stands for (no ring step is in one) */
        while (lp < P->nloops && i >= P->loops[lp].first + P->loops[lp].nsteps) lp++;
        double tiles = lp < P->nloops && i >= P->loops[lp].first ? (double)P->loops[lp].count : 1;
        double reps = (i < P->micro_steps && !s->last_micro ? mb : 1) * tiles;
        double t = 0;
        switch (s->kind) {
        case CP_OP_KERNEL:
            if (s->flops > 0) t = s->flops / attn_rate[strcmp(s->role, "bwd") == 0];
            else if (is_fp8_cast(s)) t = s->bytes / (fp8_cast_gbps(mc, s) * 1e9);
            else t = s->bytes / (mc->hbm_gbps * 1e9);
            t += mc->kernel_us * 1e-6;
            for (int j = 0; j < s->nfp8_out; j++) /* FP8 copies the kernel writes beside its outputs */
                if (s->fp8_out[j].kind == CP_FP8_OUT_COPY) {
                    const cp_step_fp8_out *a = &s->fp8_out[j];
                    double tc = (double)(s->ops[a->slot].bytes + s->ops[a->scales].bytes) /
                                ((a->scale == CP_GEMM_SCALE_ROW ? mc->fp8_copy_row_gbps : mc->fp8_copy_gbps) * 1e9);
                    t += tc;
                    P->t_fp8_casts += tc * reps;
                }
            break;
        case CP_OP_GEMM: {
            const cp_gemm *g = &s->gemm;
            bool fp8 = g->a_type != CP_GEMM_BF16;
            double bytes = (fp8 ? 1.0 : 2.0) * ((double)g->m * g->k + (double)g->k * g->n) +
                           (g->out_f32 ? 8.0 : 2.0) * (double)g->m * g->n;
            /* with block scales a weight's gradient reads two inputs scaled by 128 tokens: cuBLASLt's slow pair; on the
             * generator's kernel (a module on the step: train.fp8_gemm) their own two. Row scales, applied after the
             * sums, run at the per-tensor rate, or faster where their sums go unpromoted (fast accumulation). */
            const bool cpgen = s->module >= 0;
            const bool after_sums = g->a_scale == CP_GEMM_SCALE_TENSOR || g->a_scale == CP_GEMM_SCALE_ROW;
            double rate = !fp8          ? mc->gemm_tflops
                          : after_sums  ? (g->fast_accum ? mc->fp8_gemm_fast_tflops : mc->fp8_gemm_tflops)
                          : g->w_grad   ? (cpgen ? mc->fp8_cpgen_wgrad_tflops : mc->fp8_block_wgrad_tflops)
                                        : (cpgen ? mc->fp8_cpgen_gemm_tflops : mc->fp8_block_gemm_tflops);
            /* an accumulating epilogue reads and writes D after the main loop, not under it: measured on an H200,
             * the 3B step's weights' gradients into fp32 took 26 ms more in 4K-token MLP tiles than in one of 32K,
             * 44 us for each of the 588 more GEMMs, D's 201 MB read and written at HBM's rate */
            double epilogue = g->accumulate ? (g->out_f32 ? 8.0 : 4.0) * (double)g->m * g->n : 0;
            t = CP_MAX(s->flops / (rate * 1e12), bytes / (mc->hbm_gbps * 1e9)) + epilogue / (mc->hbm_gbps * 1e9) +
                mc->gemm_us * 1e-6;
            s->bytes = bytes;
            break;
        }
        /* a memset writes its bytes once; hbm_gbps counts a copy's reads and writes: half of it */
        case CP_OP_MEMSET: t = s->bytes / (mc->hbm_gbps * 1e9 / 2) + mc->kernel_us * 1e-6; break;
        case CP_OP_ALLTOALL: t = s->bytes * frac / (mc->a2a_gbps * 1e9) + mc->coll_us * 1e-6; break;
        case CP_OP_ALLGATHER:
        case CP_OP_REDUCE_SCATTER: t = s->bytes * frac / (mc->allgather_gbps * 1e9) + mc->coll_us * 1e-6; break;
        case CP_OP_ALLREDUCE:
            if (s->comm == CP_COMM_SHARD) { /* a ring all-reduce across nodes: 2 (n - 1) / n of the bytes each way */
                double n = (double)P->replicas * P->ring;
                t = 2.0 * (n - 1) / n * s->bytes / (mc->net_gbps * 1e9) + mc->net_us * 1e-6;
            } else {
                t = mc->net_us * 1e-6;
            }
            break;
        case CP_OP_COPY_D2H:
        case CP_OP_COPY_H2D: t = s->bytes / (mc->host_gbps * 1e9); break;
        case CP_OP_SENDRECV: t = cp_ring_sendrecv_seconds(s->count, mc); break;
        default: break;
        }
        if (s->task == CP_TASK_ADAMW_HOST) /* CPU memory bandwidth (all cores), or the host link if slower */
            t = CP_MAX(s->bytes / (mc->host_adamw_gbps * 1e9), (double)s->count * (F32 + BF16) / (mc->host_gbps * 1e9));
        s->seconds = t;
        t *= reps;
        if (is_fp8_cast(s)) P->t_fp8_casts += t;
        if (s->kind == CP_OP_KERNEL && s->module >= 0 && strcmp(P->modules[s->module].family, "attention") == 0) {
            P->flops_attn += s->flops * reps;
            P->t_attn += t;
            if (ring_send > 0) ring_attn += t;
        } else {
            P->flops_other += s->flops * reps;
        }
        /* Per layer (phase block), prefetched gathers, reduce-scatters, the shard all-reduces across groups and host
         * copies hide behind compute;
         * all-to-alls sit on the critical path between projection and attention. A layer's recompute is part of its
         * backward: what is prefetched before it runs beside both. */
        cp_phase ph = s->phase == CP_PHASE_RECOMPUTE ? CP_PHASE_BWD : s->phase;
        int key = s->layer * 4 + (int)ph;
        if (key != cur_layer) {
            exposed += CP_MAX(0.0, layer_hidden - layer_compute);
            layer_compute = layer_hidden = 0;
            cur_layer = key;
        }
        if (s->stream == CP_STREAM_COMPUTE) {
            P->t_compute += t;
            layer_compute += t;
        } else if (s->kind == CP_OP_SENDRECV) {
            P->t_comm += t;
            P->t_ring += t;
            ring_send += t;
            ring_key = stage_key;
        } else if (s->kind == CP_OP_ALLTOALL || (s->kind == CP_OP_ALLREDUCE && !s->last_micro)) {
            P->t_comm += t;
            exposed += t;
        } else if (s->stream == CP_STREAM_COMM) {
            P->t_comm += t;
            layer_hidden += t;
        } else {
            P->t_copy += t;
            layer_hidden += t;
        }
    }
    P->t_ring_exposed += ring_exposed(&ring_send, &ring_attn);
    exposed += CP_MAX(0.0, layer_hidden - layer_compute) + P->t_ring_exposed;
    P->t_comm_exposed = exposed;
    P->t_step = P->t_compute + exposed;
}

/* ---------------------------------------------------------------- driver */

/* How many layers keep their attention output and LSE, and where: the first `host` layers in host memory, the next
 * `gpu` on the GPU; the rest recompute attention in the backward. */
typedef struct {
    int host, gpu;
} attn_split;

/* The split a spec asks for; "auto" starts from recomputing everywhere (keep_attention fills in the rest). */
static attn_split attn_split_of(const cp_spec *s) {
    int L = (int)s->model.layers;
    if (s->parallel.checkpoint == CP_CKPT_NONE || s->parallel.attention_output == CP_ATTN_GPU)
        return (attn_split){0, L};
    if (s->parallel.attention_output == CP_ATTN_HOST) return (attn_split){L, 0};
    return (attn_split){0, 0};
}

cp_attn_keep cp_plan_attn_where(const cp_plan *P, int l) {
    if (l < P->attn_host_layers) return CP_ATTN_HOST;
    if (l < P->attn_host_layers + P->attn_gpu_layers) return CP_ATTN_GPU;
    return CP_ATTN_RECOMPUTE;
}

static void judge(cp_plan *P);

/* The least a plan can hold, from its buffers alone: every layer's checkpoint and kept attention output is written
 * by the forward and read by the backward, so all of them are live at the loss together with what lives for the
 * whole step; no packing puts any two of them on the same bytes. Each arena is at least their sum, rounded as the
 * packing rounds (gen/plan_mem.c). */
static void floor_arenas(const cp_plan *P, const bufset *b, int64_t *gpu, int64_t *host) {
    *gpu = *host = 0;
    const int L = (int)P->spec.model.layers;
    bool *across = cp_xcalloc((size_t)P->nbufs, sizeof *across);
    for (int l = 0; l < L; l++) {
        const int kept[3] = {b->ckpt[l], b->attn_keep[l], b->lse_keep[l]};
        for (int j = 0; j < 3; j++)
            if (kept[j] >= 0) across[kept[j]] = true;
    }
    for (int i = 0; i < P->nbufs; i++) {
        const cp_buffer *x = &P->bufs[i];
        if (!x->persistent && !across[i]) continue;
        *(x->space == CP_SPACE_GPU ? gpu : host) += align_up(x->bytes, CP_ARENA_ALIGN);
    }
    free(across);
}

/* One plan of the search with these choices. `quick` (a search that asks only whether some plan fits): where the
 * floor of its arenas already does not fit the machine, the plan stops there, without steps, its arenas the floor
 * and fits false, as judge() then finds again; one that may fit is built whole. */
static int build_once(const cp_spec *spec, cp_plan *P, int host_layers, int ckpt_every, attn_split attn,
                      bool fp8_once, bool quick, char *err, int errlen) {
    memset(P, 0, sizeof *P);
    P->spec = *spec;
    P->fp8_weights_once = fp8_once && spec->train.fp8 && spec->train.fp8_scaling != CP_FP8_SCALING_TENSOR;
    const cp_model *m = &spec->model;
    const cp_parallel *par = &spec->parallel;
    P->C = par->gpus;
    P->replicas = par->replicas;
    P->ring = par->ring;
    P->S = spec->train.seq_len;
    P->group_tokens = P->S / P->ring;
    P->T = P->group_tokens / P->C;
    P->docs = spec->data.documents == CP_DOCS_MASK;
    P->doc_positions = spec->data.positions == CP_POS_DOCUMENT;
    /* the kernels' tiles: fwd_sm90's 128 query rows by 128 keys (memory is planned for one document all the same) */
    P->attn_work = P->docs && spec->data.doc_len > 0 ? cp_doc_tile_work_uniform(P->S, spec->data.doc_len, 128, 128, NULL)
                                                      : 1.0;
    if (stage_table(P, err, errlen)) return -1;
    P->mlp_tile = par->mlp_tile ? par->mlp_tile : largest_divisor_at_most(P->T, 4096);
    int64_t loss_cap = CP_MAX((int64_t)1, ((int64_t)512 << 20) / (m->vocab * BF16));
    P->loss_tile = par->loss_tile ? par->loss_tile : largest_divisor_at_most(P->T, CP_MIN(loss_cap, (int64_t)4096));
    P->ckpt_host_layers = host_layers;
    P->ckpt_every = ckpt_every;
    P->attn_host_layers = attn.host;
    P->attn_gpu_layers = attn.gpu;

    /* FSDP units: embedding, layers, final norm (+ untied LM head) */
    cp_layer_layout_of(m, P->C, &P->layout);
    P->nunits = (int)m->layers + 2;
    P->unit_elems = cp_xcalloc((size_t)P->nunits, sizeof(int64_t));
    P->unit_padded = cp_xcalloc((size_t)P->nunits, sizeof(int64_t));
    P->unit_shard_off = cp_xcalloc((size_t)P->nunits, sizeof(int64_t));
    int64_t lines = 64 * (int64_t)P->C;
    P->unit_elems[0] = m->vocab * m->hidden;
    for (int l = 1; l <= m->layers; l++) P->unit_elems[l] = P->layout.total;
    P->unit_elems[P->nunits - 1] = align_up(m->hidden, 64) + (m->tie_embeddings ? 0 : m->vocab * m->hidden);
    int64_t off = 0;
    for (int u = 0; u < P->nunits; u++) {
        P->unit_padded[u] = u >= 1 && u <= m->layers ? P->layout.padded : align_up(P->unit_elems[u], lines);
        P->unit_shard_off[u] = off;
        off += P->C == 1 ? P->unit_padded[u] : P->unit_padded[u] / P->C;
    }
    P->params_shard = off;
    P->params_layer = cp_model_layer_params(m);
    P->params_total = cp_model_params(m);
    P->opt_on_host = par->optimizer == CP_OPT_HOST;

    bufset b;
    modset M;
    make_modules(P, &M);
    make_buffers(P, &M, &b);
    if (quick) {
        floor_arenas(P, &b, &P->gpu_arena, &P->host_arena);
        judge(P);
        if (!P->fits) {
            free(b.ckpt);
            free(b.seg);
            free(b.attn_keep);
            free(b.lse_keep);
            return 0;
        }
        P->gpu_arena = P->host_arena = 0; /* the packing's, below */
    }
    /* room for the program at once: growing it by doubling copied each step twice on average, a fifth of the
     * planner's time. The shipped specs have up to 47 steps per layer and stage, 25 more per further ring step
     * (attention recomputed), a third more where segments run their forward again (checkpoint_every > 1), and up to
     * 96 per layer besides (MLP tiles folded), and with documents in a ring 12 for step 0's half launches; a program
     * that outgrows this doubles it as before */
    int64_t per_stage = (48 + 26 * (int64_t)(P->ring - 1) + (P->docs && P->ring > 1 ? 12 : 0)) *
                        (P->ckpt_every > 1 ? 4 : 3) / 3;
    P->capsteps = (int)CP_MIN((int64_t)1 << 24, 256 + m->layers * (P->nstages * per_stage + 96));
    P->steps = cp_xmalloc(sizeof *P->steps * (size_t)P->capsteps);
    make_program(P, &b, &M);
    free(b.ckpt);
    free(b.seg);
    free(b.attn_keep);
    free(b.lse_keep);
    cp_plan_lower_fp8(P);
    if (cp_plan_liveness(P, err, errlen)) return -1;
    cp_plan_assign_offsets(P);
    cost_model(P);
    return 0;
}

/* NCCL's bytes per rank: on GPUs of their own, its NVLink buffers; where ranks share GPUs (NCCL over sockets), its
 * kernels and host-side buffers need less of the GPU, and ranks that send and receive (all-to-all, a ring) more
 * than ranks that only reduce. */
int64_t cp_plan_comm_reserve(const cp_plan *P) {
    const cp_machine *mc = &P->spec.machine;
    if (P->C * P->replicas * P->ring == 1) return 0;
    if (cp_plan_ranks_per_gpu(P) == 1) return mc->comm_reserve;
    bool p2p = false;
    for (int i = 0; i < P->nsteps && !p2p; i++) p2p = P->steps[i].kind == CP_OP_ALLTOALL || P->steps[i].kind == CP_OP_SENDRECV;
    cp_rank_layout L = {P->replicas, P->ring, P->C};
    return mc->comm_reserve_shared + (p2p ? mc->comm_reserve_p2p : 0) + cp_rank_splits(&L) * mc->comm_reserve_split;
}

/* GPU memory per GPU outside the arena: the context and libraries, and NCCL's buffers when there are ranks. */
int64_t cp_plan_reserve(const cp_plan *P) { return P->spec.machine.reserve + cp_plan_comm_reserve(P); }

/* The ranks that share one GPU: machine.ranks_per_gpu, at most the run's. */
int cp_plan_ranks_per_gpu(const cp_plan *P) {
    return CP_MIN(P->spec.machine.ranks_per_gpu, P->C * P->replicas * P->ring);
}

/* The ranks that share one node's host memory: the run's ranks, up to those of the 8 GPUs of a node. */
int cp_plan_node_ranks(const cp_plan *P) {
    return CP_MIN(P->C * P->replicas * P->ring, 8 * cp_plan_ranks_per_gpu(P));
}

const char *cp_snap_kind_name(cp_snap_kind k) {
    static const char *const names[] = {"none", "pinned", "pageable", "in place"};
    return (unsigned)k < CP_ARRAY_LEN(names) ? names[k] : "?";
}

/* A checkpoint's snapshot: three fp32 copies of the whole model on the writing rank (host_peak already holds the
 * rest of every rank). Pinned where the node has room for it: the plan fits with it, and a quarter of host_mem is
 * left unpinned (the page cache a checkpoint's files are written through, and whatever the system needs); else
 * pageable. One GPU with the optimizer on the host copies its state with a memcpy, for which pinning buys nothing;
 * with no room for the copy at all it is written in place instead, the loop waiting for the write. Two of them
 * (ckpt_slots) where the node holds both by the same rule. */
static void plan_snapshot(cp_plan *P, int64_t model, int ranks) {
    const cp_machine *mc = &P->spec.machine;
    const cp_train *tr = &P->spec.train;
    P->ckpt_snap = CP_SNAP_NONE;
    P->ckpt_snap_bytes = 0;
    P->ckpt_slots = 0;
    if (tr->save_every <= 0) return;
    /* two slots where the node holds two snapshots with the margins of one (a save then never waits for the write
     * before it, which may take longer than the steps between saves), else one */
    int64_t copy = 3 * (int64_t)sizeof(float) * model, rest = P->host_peak * ranks;
    if (P->C == 1 && P->opt_on_host) {
        int slots = !tr->async_save ? 0 : rest + 2 * copy <= mc->host_mem ? 2 : rest + copy <= mc->host_mem ? 1 : 0;
        P->ckpt_snap = slots ? CP_SNAP_PAGEABLE : CP_SNAP_IN_PLACE;
        P->ckpt_slots = slots;
        P->ckpt_snap_bytes = slots * copy;
        return;
    }
    for (int slots = 2; slots >= 1; slots--)
        if (rest + slots * copy <= mc->host_mem && P->host_arena * ranks + slots * copy <= mc->host_mem / 4 * 3) {
            P->ckpt_snap = CP_SNAP_PINNED;
            P->ckpt_slots = slots;
            P->ckpt_snap_bytes = slots * copy;
            return;
        }
    int64_t staging = P->C == 1 ? CP_SNAP_STAGING : 0; /* several GPUs: the gathers copy into it */
    P->ckpt_snap = CP_SNAP_PAGEABLE;
    P->ckpt_slots = rest + 2 * copy + staging <= mc->host_mem ? 2 : 1;
    P->ckpt_snap_bytes = P->ckpt_slots * copy + staging;
}

/* Fill fits/why from the arenas against the machine. */
static void judge(cp_plan *P) {
    const cp_machine *mc = &P->spec.machine;
    char a[32], b[32], c[32], d[32], e[32];
    P->gpu_peak = P->gpu_arena + cp_plan_reserve(P);
    /* the weights pass through host memory once, in fp32: the whole model on one GPU, else one unit at a time
     * beside the rank's shard (so do a checkpoint's weights and moments, one array at a time: runtime/resume.c) */
    int64_t unit_max = 0, model = 0;
    for (int u = 0; u < P->nunits; u++) unit_max = CP_MAX(unit_max, P->unit_padded[u]), model += P->unit_padded[u];
    P->host_load = (int64_t)sizeof(float) * (P->C == 1 ? model : unit_max + P->params_shard);
    P->host_peak = P->host_arena + P->host_load + mc->host_reserve;
    P->host_run = P->host_arena + mc->host_runtime;
    int ranks = cp_plan_node_ranks(P), share = cp_plan_ranks_per_gpu(P); /* every rank holds its own */
    plan_snapshot(P, model, ranks);
    P->host_node = P->host_peak * ranks + P->ckpt_snap_bytes;
    P->fits = true;
    P->why[0] = 0;
    if (P->gpu_peak * share > mc->gpu_mem) {
        P->fits = false;
        if (share > 1)
            snprintf(P->why, sizeof P->why, "GPU memory: needs %s per rank, x %d ranks sharing each GPU = %s, the "
                     "machine has %s", cp_fmt_bytes(P->gpu_peak, a, sizeof a), share,
                     cp_fmt_bytes(P->gpu_peak * share, c, sizeof c), cp_fmt_bytes(mc->gpu_mem, b, sizeof b));
        else
            snprintf(P->why, sizeof P->why, "GPU memory: needs %s per GPU, the machine has %s",
                     cp_fmt_bytes(P->gpu_peak, a, sizeof a), cp_fmt_bytes(mc->gpu_mem, b, sizeof b));
    } else if (P->host_peak * ranks > mc->host_mem) {
        P->fits = false;
        snprintf(P->why, sizeof P->why, "host memory: needs %s (%d rank%s on the node, each %s pinned, %s while the "
                 "weights load, %s reserve), the machine has %s", cp_fmt_bytes(P->host_peak * ranks, a, sizeof a),
                 ranks, ranks > 1 ? "s" : "", cp_fmt_bytes(P->host_arena, c, sizeof c),
                 cp_fmt_bytes(P->host_load, d, sizeof d), cp_fmt_bytes(mc->host_reserve, e, sizeof e),
                 cp_fmt_bytes(mc->host_mem, b, sizeof b));
    } else if (P->host_node > mc->host_mem) {
        P->fits = false;
        snprintf(P->why, sizeof P->why, "host memory: needs %s: %s for %d rank%s and %s for a checkpoint's snapshot "
                 "(3 fp32 copies of the model on the rank that writes, train.save_every = %d), the machine has %s: "
                 "save no checkpoints (train.save_every = 0), or plan for the machine's real host memory "
                 "(--host-mem)", cp_fmt_bytes(P->host_node, a, sizeof a),
                 cp_fmt_bytes(P->host_peak * ranks, c, sizeof c), ranks, ranks > 1 ? "s" : "",
                 cp_fmt_bytes(P->ckpt_snap_bytes, d, sizeof d), P->spec.train.save_every,
                 cp_fmt_bytes(mc->host_mem, b, sizeof b));
    }
}

/* The plan of choice x of a search (offloaded layers, checkpoint spacing, stage size), judged. */
typedef int (*plan_at)(const void *ctx, int x, cp_plan *out, char *err, int errlen);

/* What a search builds from: the spec, and whether it asks only if some plan fits (`quick`, --max-seq's lengths):
 * then it stops at the first plan that fits, and a plan whose floor does not fit is not built (build_once). Every
 * choice up to there is made as in a whole search, so the answer is the whole search's fits. */
typedef struct {
    const cp_spec *spec;
    bool quick;
} search;

/* Bisection over the choices [lo, hi], whose plans fit on one side only: the smallest x that fits (`smallest`), or
 * the largest. The plan found replaces *best. Returns 1 when one fits, 0 when none does, -1 on an error. With
 * `miss` (and `smallest`), when none fits, *miss is the plan of hi, the last one tried, so that the caller that
 * falls back to it does not build it again; else it is left empty. */
static int bisect_fit(plan_at at, const void *ctx, int lo, int hi, bool smallest, cp_plan *best, cp_plan *miss,
                      bool quick, char *err, int errlen) {
    int found = 0, top = hi;
    if (miss) memset(miss, 0, sizeof *miss);
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        cp_plan t;
        if (at(ctx, mid, &t, err, errlen)) {
            if (miss) cp_plan_free(miss);
            return -1;
        }
        bool fits = t.fits;
        if (fits) {
            cp_plan_free(best);
            *best = t;
            found = 1;
            if (quick) break; /* one fits: all a quick search asks */
        } else if (miss && smallest && mid == top) {
            *miss = t;
        } else {
            cp_plan_free(&t);
        }
        if (fits == smallest) hi = mid - 1;
        else lo = mid + 1;
    }
    if (found && miss) cp_plan_free(miss);
    return found;
}

/* Every layer checkpointed, x of them offloaded (the first ones). */
static int plan_offloaded(const void *ctx, int x, cp_plan *out, char *err, int errlen) {
    const search *q = ctx;
    if (build_once(q->spec, out, x, 1, attn_split_of(q->spec), false, q->quick, err, errlen)) return -1;
    judge(out);
    return 0;
}

/* One stage size and checkpoint spacing k: the plan, with the fewest offloaded checkpoints that fit when offload
 * is auto. */
static int build_k(const search *q, cp_plan *P, int k, char *err, int errlen) {
    const cp_spec *spec = q->spec;
    int L = (int)spec->model.layers;
    int host = spec->parallel.offload == CP_OFFLOAD_ALL ? L : 0;
    if (build_once(spec, P, host, k, attn_split_of(spec), false, q->quick, err, errlen)) return -1;
    judge(P);
    if (spec->parallel.offload != CP_OFFLOAD_AUTO || P->fits || k > 1) return 0;
    /* auto: offload the fewest checkpoints that make it fit (each moved layer saves one GPU checkpoint;
     * moving any costs two staging buffers), searched by bisection since memory falls as more move; if none
     * does, all offloaded, whose refusal says what would fit */
    cp_plan all;
    int r = bisect_fit(plan_offloaded, q, 1, L, true, P, &all, q->quick, err, errlen);
    if (r != 0) return r < 0 ? -1 : 0;
    cp_plan_free(P);
    if (all.unit_padded) { /* none fits: the bisection tried L last */
        *P = all;
        return 0;
    }
    return plan_offloaded(q, L, P, err, errlen);
}

/* Every k-th layer checkpointed, for the spacing search. */
static int plan_spaced(const void *ctx, int k, cp_plan *out, char *err, int errlen) {
    return build_k(ctx, out, k, err, errlen);
}

/* One stage size U (the optimizer's place decided): the checkpoint spacing. checkpoint_every = "auto": every
 * layer with the fewest checkpoints offloaded; where that needs the host or does not fit, and `sparse` allows it,
 * also the smallest spacing k > 1 that fits with every checkpoint on the GPU (k up to about sqrt(L): beyond, the
 * k - 1 segment inputs outweigh the checkpoints saved), and of the two the one the cost model predicts faster. */
static int sparser(const search *q, cp_plan *P, char *err, int errlen);
static int build_u(const search *q, cp_plan *P, bool sparse, char *err, int errlen) {
    if (q->spec->parallel.checkpoint_every > 0) return build_k(q, P, q->spec->parallel.checkpoint_every, err, errlen);
    if (build_k(q, P, 1, err, errlen)) return -1;
    return sparse ? sparser(q, P, err, errlen) : 0;
}

/* build_u's second half: P is its plan with every layer checkpointed; where that needs the host or does not fit,
 * the smallest spacing that fits instead, if the cost model predicts it faster. */
static int sparser(const search *q, cp_plan *P, char *err, int errlen) {
    const cp_spec s = *q->spec;
    if (s.parallel.checkpoint_every > 0 || (P->fits && (P->ckpt_host_layers == 0 || q->quick)) ||
        s.parallel.checkpoint == CP_CKPT_NONE || s.parallel.offload == CP_OFFLOAD_ALL)
        return 0;
    /* memory falls with k up to about sqrt(L) (fewer checkpoints, more segment inputs): if the sparsest spacing
     * there does not fit, none does; else the smallest that fits, by bisection */
    int L = (int)s.model.layers, kmax = 2;
    while (kmax * kmax < L) kmax++;
    kmax = CP_MIN(kmax, L);
    if (kmax < 2) return 0;
    cp_plan t;
    if (build_k(q, &t, kmax, err, errlen)) return -1;
    if (!t.fits || q->quick) { /* quick: P is the plan that fits */
        if (t.fits) {
            cp_plan_free(P);
            *P = t;
        } else {
            cp_plan_free(&t);
        }
        return 0;
    }
    if (bisect_fit(plan_spaced, q, 2, kmax - 1, true, &t, NULL, false, err, errlen) < 0) {
        cp_plan_free(&t);
        return -1;
    }
    if (!P->fits || t.t_step < P->t_step) { /* against offloading checkpoints with every layer kept */
        cp_plan_free(P);
        *P = t;
    } else {
        cp_plan_free(&t);
    }
    return 0;
}

/* Stage size U[x], every layer checkpointed, for the stage search. */
typedef struct {
    const search *q;
    const int64_t *U;
} stage_search;

static int plan_staged(const void *ctx, int x, cp_plan *out, char *err, int errlen) {
    const stage_search *c = ctx;
    cp_spec s = *c->q->spec;
    s.parallel.upipe_heads = (int)c->U[x];
    search q = {&s, c->q->quick};
    return build_u(&q, out, false, err, errlen);
}

/* The optimizer's place decided: the stage size, then the checkpoints. */
static int build_stages(const search *sq, cp_plan *P, char *err, int errlen) {
    const cp_spec *spec = sq->spec;
    if (!spec->parallel.upipe_auto) return build_u(sq, P, true, err, errlen);
    /* upipe_heads = "auto": the largest stage that fits, since fewer, larger stages run larger projection GEMMs
     * and give the attention kernels more blocks at once (docs/PERF.md has the 3B step with 1 and 24 heads per
     * stage); failing that, the smallest, whose refusal says what would fit */
    int64_t U[256];
    int n = cp_spec_upipe_values(spec, U, 256);
    cp_spec s = *spec;
    s.parallel.upipe_heads = (int)(n > 0 ? U[0] : spec->parallel.upipe_heads);
    search q = {&s, sq->quick};
    if (build_u(&q, P, false, err, errlen)) return -1;
    /* the stage of least memory does not fit with every layer checkpointed: no larger one does, and a sparser
     * spacing of checkpoints is the way left (larger stages come before sparser checkpoints, which recompute) */
    if (!P->fits) return sparser(&q, P, err, errlen); /* build_u(&q, P, true), whose first half P is */
    if (sq->quick) return 0;
    /* memory grows with U: the largest that fits, by bisection over the valid values */
    stage_search c = {sq, U};
    return bisect_fit(plan_staged, &c, 1, n - 1, false, P, NULL, false, err, errlen) < 0 ? -1 : 0;
}

/* optimizer = "auto": in host memory when the model states alone (18 bytes per parameter per rank) would take over
 * 60% of the GPU. Else on the GPU, unless that plan gives something up (it does not fit, offloads checkpoints, or
 * recomputes segments) and the plan with the optimizer on the host fits and is faster by the cost model: its
 * update streams over the host link, but it frees 12 bytes per parameter of GPU memory for activations. */
static int build_optimizer(const cp_spec *spec, cp_plan *P, bool quick, char *err, int errlen) {
    cp_spec s = *spec;
    search q = {&s, quick};
    if (s.parallel.optimizer != CP_OPT_AUTO) return build_stages(&q, P, err, errlen);
    int64_t states = cp_model_params(&s.model) * 18 / s.parallel.gpus;
    s.parallel.optimizer = states > s.machine.gpu_mem * 6 / 10 ? CP_OPT_HOST : CP_OPT_GPU;
    if (build_stages(&q, P, err, errlen)) return -1;
    if (s.parallel.optimizer == CP_OPT_HOST || (P->fits && ((P->ckpt_host_layers == 0 && P->ckpt_every <= 1) || quick)))
        return 0;
    s.parallel.optimizer = CP_OPT_HOST;
    cp_plan t;
    if (build_stages(&q, &t, err, errlen)) return -1;
    if (t.fits && (!P->fits || t.t_step < P->t_step)) {
        cp_plan_free(P);
        *P = t;
    } else {
        cp_plan_free(&t);
    }
    return 0;
}

/* attention_output = "auto", the other choices made (so a length that fits recomputing everywhere still fits): the
 * plan of split x of a search. host_cap < 0: x layers kept on the host, none on the GPU; else x on the GPU and as
 * many of the rest as host_cap allows on the host. */
typedef struct {
    const cp_spec *spec;
    int ckpt_host, ckpt_every, host_cap;
} kept_search;

static int plan_kept(const void *ctx, int x, cp_plan *out, char *err, int errlen) {
    const kept_search *c = ctx;
    int L = (int)c->spec->model.layers;
    attn_split a = c->host_cap < 0 ? (attn_split){x, 0} : (attn_split){CP_MIN(c->host_cap, L - x), x};
    if (build_once(c->spec, out, c->ckpt_host, c->ckpt_every, a, false, false, err, errlen)) return -1;
    judge(out);
    return 0;
}

/* Replace *P by t when t fits and the cost model predicts it faster; else free t. */
static void take_if_faster(cp_plan *P, cp_plan *t) {
    if (t->fits && t->t_step < P->t_step) {
        cp_plan_free(P);
        *P = *t;
    } else {
        cp_plan_free(t);
    }
}

/* Keep each layer's attention output and LSE where memory is left. First on the GPU: every layer, else the most
 * that fit (memory grows with each). Where some layers are left, also the plan that keeps as many as the host allows
 * in pinned memory (two GPU staging buffers carry them) and the most that then fit on the GPU. Of the plan as it
 * was, the GPU one and the mixed one, the fastest by the cost model; a kept layer's backward skips its attention
 * forward, host copies hide behind the layer's compute, and on equal time fewer host layers win (less to pin). */
static int keep_attention(cp_plan *P, char *err, int errlen) {
    const cp_parallel *par = &P->spec.parallel;
    int L = (int)P->spec.model.layers;
    if (par->attention_output != CP_ATTN_AUTO || par->checkpoint == CP_CKPT_NONE || !P->fits || L < 1) return 0;
    cp_spec spec = P->spec;
    kept_search c = {&spec, P->ckpt_host_layers, P->ckpt_every, 0};
    cp_plan gpu, mixed;
    memset(&mixed, 0, sizeof mixed);
    if (plan_kept(&c, L, &gpu, err, errlen)) return -1;
    if (!gpu.fits) {
        cp_plan_free(&gpu);
        if (bisect_fit(plan_kept, &c, 1, L - 1, false, &gpu, NULL, false, err, errlen) < 0) return -1;
    }
    int on_gpu = gpu.fits ? gpu.attn_gpu_layers : 0;
    if (on_gpu < L) {
        c.host_cap = -1;
        cp_plan host;
        memset(&host, 0, sizeof host);
        int r = bisect_fit(plan_kept, &c, 1, L, false, &host, NULL, false, err, errlen);
        if (r > 0) {
            c.host_cap = host.attn_host_layers;
            mixed = host;
            r = bisect_fit(plan_kept, &c, 1, on_gpu, false, &mixed, NULL, false, err, errlen);
        }
        if (r < 0) {
            cp_plan_free(&gpu);
            cp_plan_free(&mixed);
            return -1;
        }
    }
    take_if_faster(P, &gpu);
    take_if_faster(P, &mixed);
    return 0;
}

/* mlp_tile = "auto": the MLP's token tile grown into the memory the kept attention outputs left, to the largest
 * divisor of T that still fits and that the cost model finds no slower. Each tile runs its GEMMs and FP8 casts on
 * tile-sized operands and adds its weights' gradients into fp32, so fewer tiles are faster: measured on an H200 in
 * one call, the 3B step at 32K with 8 tiles and with one took 2.463 and 2.441 s in bf16, 2.232 and 2.198 s in fp8
 * (docs/PERF.md, 2026-12-03, MLP tiles grown). Memory grows with the tile, so the first that does not fit ends the
 * search. The plan's spec keeps "auto": the choice is the plan's, made again the same way wherever it is planned. */
static int grow_mlp_tile(cp_plan *P, char *err, int errlen) {
    if (P->spec.parallel.mlp_tile || !P->fits) return 0;
    cp_spec spec = P->spec;
    const attn_split kept = {P->attn_host_layers, P->attn_gpu_layers};
    for (int64_t n = P->T / P->mlp_tile - 1; n >= 1; n--) {
        if (P->T % n) continue;
        spec.parallel.mlp_tile = P->T / n;
        cp_plan t;
        if (build_once(&spec, &t, P->ckpt_host_layers, P->ckpt_every, kept, false, false, err, errlen)) return -1;
        judge(&t);
        if (!t.fits || t.t_step > P->t_step) {
            cp_plan_free(&t);
            break;
        }
        t.spec.parallel.mlp_tile = 0;
        cp_plan_free(P);
        *P = t;
    }
    return 0;
}

/* FP8 with row or block scales: every layer's weights cast once a micro-batch and their copies kept
 * (cp_plan.fp8_weights_once, gen/plan_fp8.c), where that plan fits and the cost model finds it faster by at least
 * 0.1% of the step: the copies hold every layer's weights twice over, and where they save less (the 8B step at 128K,
 * whose weights' casts are a sliver of a 43 s step, and which they would leave half a GiB short of full) the memory
 * stays free. */
static int keep_fp8_weights(cp_plan *P, char *err, int errlen) {
    const cp_train *t = &P->spec.train;
    if (!P->fits || !t->fp8 || t->fp8_scaling == CP_FP8_SCALING_TENSOR) return 0;
    const attn_split kept = {P->attn_host_layers, P->attn_gpu_layers};
    cp_spec spec = P->spec;
    spec.parallel.mlp_tile = P->mlp_tile; /* the tile grow_mlp_tile chose, which the spec may leave to the plan */
    cp_plan w;
    if (build_once(&spec, &w, P->ckpt_host_layers, P->ckpt_every, kept, true, false, err, errlen)) return -1;
    judge(&w);
    if (w.fits && w.fp8_weights_once && w.t_step < P->t_step * (1.0 - 1e-3)) {
        w.spec.parallel.mlp_tile = P->spec.parallel.mlp_tile;
        cp_plan_free(P);
        *P = w;
    } else {
        cp_plan_free(&w);
    }
    return 0;
}

/* What the memory left over buys, once a plan fits: kept attention outputs first (each spares a layer's attention
 * forward), then a larger MLP tile in what they leave, then FP8 weights' copies kept for the micro-batch. */
static int fill_memory(cp_plan *P, char *err, int errlen) {
    if (keep_attention(P, err, errlen) || grow_mlp_tile(P, err, errlen)) return -1;
    return keep_fp8_weights(P, err, errlen);
}

/* The plan: the optimizer's place and what follows from it; with `fill`, the memory left filled (fill_memory). */
static int plan_build(const cp_spec *spec, cp_plan *P, bool fill, char *err, int errlen) {
    if (build_optimizer(spec, P, false, err, errlen)) return -1;
    return fill ? fill_memory(P, err, errlen) : 0;
}

int cp_plan_build_folded(const cp_spec *spec, cp_plan *P, char *err, int errlen) {
    memset(P, 0, sizeof *P);
    return plan_build(spec, P, true, err, errlen);
}

int cp_plan_build(const cp_spec *spec, cp_plan *P, char *err, int errlen) {
    if (cp_plan_build_folded(spec, P, err, errlen)) return -1;
    if (cp_plan_unfold(P, err, errlen)) {
        cp_plan_free(P);
        return -1;
    }
    return 0;
}


void cp_plan_free(cp_plan *P) {
    for (int i = 0; i < P->nbufs; i++) free(P->bufs[i].live);
    for (int i = 0; i < P->nmodules; i++) cp_kspec_free(&P->modules[i]);
    free(P->bufs);
    free(P->steps);
    free(P->loops);
    free(P->modules);
    free(P->kchoices);
    free(P->stages);
    free(P->unit_elems);
    free(P->unit_padded);
    free(P->unit_shard_off);
    memset(P, 0, sizeof *P);
}

int cp_plan_fits(const cp_spec *spec, bool quick, bool *fits, char *err, int errlen) {
    cp_plan p;
    memset(&p, 0, sizeof p);
    int rc = build_optimizer(spec, &p, quick, err, errlen);
    *fits = rc == 0 && p.fits;
    cp_plan_free(&p);
    return rc;
}

int64_t cp_plan_max_seq(const cp_spec *spec, cp_plan *best, char *err, int errlen) {
    memset(best, 0, sizeof *best);
    cp_spec s = *spec;
    /* answers are multiples of 1K tokens per GPU (and of the explicit tile sizes), over the GPUs of a sequence: a
     * ring's groups, each holding 2 zigzag chunks split over its GPUs */
    int64_t gran = 1024;
    if (s.parallel.mlp_tile) gran = lcm(gran, s.parallel.mlp_tile);
    if (s.parallel.loss_tile) gran = lcm(gran, s.parallel.loss_tile);
    gran *= (int64_t)s.parallel.gpus * s.parallel.ring;
    int64_t lo = 1, hi = ((int64_t)1 << 40) / gran, found = 0;
    char e2[CP_ERR_MAX];
    /* each length is asked only whether it fits (cp_plan_fits, quick); the answer's plan is built whole at the end.
     * Find a failing upper bound first, doubling */
    int64_t probe = CP_MAX((int64_t)1, s.train.seq_len / gran);
    bool fits;
    for (;;) {
        s.train.seq_len = probe * gran;
        if (cp_spec_check(&s, e2, sizeof e2) || cp_plan_fits(&s, true, &fits, e2, sizeof e2) || !fits) break;
        lo = probe;
        if (probe >= hi) break;
        probe *= 2;
    }
    hi = CP_MIN(hi, probe);
    /* bisection on multiples of gran in [lo, hi] */
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        s.train.seq_len = mid * gran;
        if (cp_spec_check(&s, e2, sizeof e2) || cp_plan_fits(&s, true, &fits, e2, sizeof e2) || !fits) {
            hi = mid - 1;
            continue;
        }
        found = mid * gran;
        lo = mid + 1;
    }
    if (found) {
        s.train.seq_len = found;
        if (plan_build(&s, best, false, err, errlen)) {
            cp_plan_free(best);
            return 0;
        }
        if (!best->fits) { /* the quick search and the whole one disagree: a planner bug */
            snprintf(err, errlen, "%s: plan: %lld tokens fit by the quick search but not by the whole one (%s)",
                     spec->path, (long long)found, best->why);
            cp_plan_free(best);
            return 0;
        }
    }
    if (!found) {
        /* say why even the shortest length does not fit */
        s.train.seq_len = gran;
        cp_plan p;
        if (cp_spec_check(&s, e2, sizeof e2) == 0 && cp_plan_build_folded(&s, &p, e2, sizeof e2) == 0) {
            snprintf(e2, sizeof e2, "%s", p.fits ? "" : p.why);
            cp_plan_free(&p);
        }
        snprintf(err, errlen, "%s: no sequence length fits, not even %lld tokens: %s", spec->path, (long long)gran, e2);
    }
    /* the kept attention outputs and a larger MLP tile never change whether a length fits (they take only memory
     * left over), so the search ran without them; the answer's plan gets them */
    if (found && fill_memory(best, err, errlen)) {
        cp_plan_free(best);
        return 0;
    }
    return found;
}
