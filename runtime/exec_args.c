/* exec_args.c: every plan step turned into a prepared action: a kernel launch whose argument list is built by one
 * small function per step `what` (so each list is explicit and checked against the kernel's contract), a prepared
 * GEMM, a collective, a memset or a copy. Argument values that change from step to step (the loss scale, the
 * learning rate, AdamW's step count) are passed as pointers to fields of the executor, which cudaLaunchKernel reads
 * at each launch. */
#include "exec_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "gemm_fp8.h"
#include "kernels.h"
#include "kernels_attn.h"
#include "ring.h"
#include "util.h"

/* ---------------------------------------------------------------- messages */

const char *exec_step_desc(const cp_plan *P, int i, char *buf, size_t n) {
    const cp_step *s = &P->steps[i];
    int k = snprintf(buf, n, "step %d (%s %s", i, cp_phase_name(s->phase), s->what);
    if (s->layer >= 0) k += snprintf(buf + k, n - (size_t)k, ", layer %d", s->layer);
    if (s->stage >= 0) k += snprintf(buf + k, n - (size_t)k, ", stage %d", s->stage);
    if (s->tile >= 0) k += snprintf(buf + k, n - (size_t)k, ", tile %d", s->tile);
    snprintf(buf + k, n - (size_t)k, ")");
    return buf;
}

/* ---------------------------------------------------------------- operands and argument lists */

typedef struct {
    cp_exec *ex;
    int i;
    const cp_step *s;
    xstep *x;
    char *err;
    int errlen;
    /* each operand as this rank's launch sees it: its address and the bytes from there to the operand's end (the
     * plan's, unless moved to this rank's rows: shift) */
    char *p[CP_MAX_OPERANDS];
    int64_t n[CP_MAX_OPERANDS];
    /* a document-masked attention launch: the global positions of its first query row and first key row (a ring's
     * half launches; 0 elsewhere) */
    int64_t q_pos, k_pos;
    unsigned fp8_taken; /* the step's own FP8 outputs (cp_step.fp8_out) its kernel's arguments carry: bit j for j */
    unsigned fp8_alone; /* those of them whose output the kernel was given no pointer for (copy_only): bit j for j */
} pctx;

static int pfail(pctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int pfail(pctx *c, const char *fmt, ...) {
    char d[160], m[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(c->err, (size_t)c->errlen, "%s: %s (the plan's operands and the runtime's reading of them disagree)",
             exec_step_desc(c->ex->P, c->i, d, sizeof d), m);
    return -1;
}

static char *opp(const pctx *c, int j) { return c->p[j]; }
static int64_t opbytes(const pctx *c, int j) { return c->n[j]; }
static const cp_buffer *opbuf(const pctx *c, int j) { return &c->ex->P->bufs[c->s->ops[j].buf]; }
/* where operand j's view starts in its buffer */
static int64_t opoff(const pctx *c, int j) { return c->p[j] - (char *)c->ex->bufptr[c->s->ops[j].buf]; }

/* n operands, and after them those of the step's own FP8 outputs (cp_step.fp8_out: an amax's slot; a copy and its
 * scales, and maybe the transposed copy's column maxima; those maxima alone) */
static int need_ops(pctx *c, int n) {
    int fp8 = 0;
    for (int j = 0; j < c->s->nfp8_out; j++) {
        const cp_step_fp8_out *a = &c->s->fp8_out[j];
        fp8 += a->kind == CP_FP8_OUT_COPY ? 2 + (a->col_max >= 0) : 1;
    }
    if (c->s->nops != n + fp8)
        return pfail(c, "%d operands, expected %d%s", c->s->nops, n + fp8, fp8 ? " with its FP8 outputs" : "");
    for (int j = 0; j < c->s->nops; j++)
        if (!c->ex->bufptr[c->s->ops[j].buf])
            return pfail(c, "operand %d (%s) has no memory", j, opbuf(c, j)->name);
    return 0;
}

static int need_bytes(pctx *c, int j, int64_t bytes) {
    if (opbytes(c, j) < bytes)
        return pfail(c, "operand %d (%s) has %lld bytes, the kernel touches %lld", j, opbuf(c, j)->name,
                     (long long)opbytes(c, j), (long long)bytes);
    return 0;
}

static int need_align(pctx *c, int j, int a) {
    if ((uintptr_t)opp(c, j) % (uintptr_t)a)
        return pfail(c, "operand %d (%s + %lld) is not %d-byte aligned", j, opbuf(c, j)->name, (long long)opoff(c, j),
                     a);
    return 0;
}

/* Operand j's view moved `bytes` in: where a plan's operand covers the rows of every rank, this rank's start there. */
static int shift(pctx *c, int j, int64_t bytes) {
    if (bytes < 0 || bytes > opbytes(c, j))
        return pfail(c, "operand %d (%s + %lld, %lld bytes) has no byte %lld for this rank's rows", j,
                     opbuf(c, j)->name, (long long)opoff(c, j), (long long)opbytes(c, j), (long long)bytes);
    c->p[j] += bytes;
    c->n[j] -= bytes;
    return 0;
}

/* A ring's half-block launch, or the merge or dQ sum of one (cp_step.ring_part >= 0 at ring step k >= 1, or at step 0
 * with documents: gen/ring.h): one plan serves every ring position, so each operand of such a step covers the halves
 * any position takes (cp_ring_half_span) and this rank's launch starts at its own (cp_ring_half_of at its ring
 * position). */
static int ring_halves(pctx *c, cp_ring_half *mine, cp_ring_span *span) {
    const cp_plan *P = c->ex->P;
    int k = c->s->ring_step, part = c->s->ring_part;
    int parts = k == 0 && P->docs ? CP_RING_STEP0_PARTS : k >= 1 ? 2 : 0;
    if (P->ring < 2 || k >= P->ring || part < 0 || part >= parts)
        return pfail(c, "a half-block step at ring step %d, part %d, of a ring of %d%s", k, part, P->ring,
                     P->docs ? " with documents" : "");
    *mine = cp_ring_half_of(P->ring, c->ex->ring_pos, k, part);
    *span = cp_ring_half_span(P->ring, k, part);
    return 0;
}

/* Operand j at this rank's half `half` of an operand whose first half is `first`, `bytes` per half. */
static int at_half(pctx *c, int j, int half, int first, int64_t bytes) { return shift(c, j, (half - first) * bytes); }

static const cp_kernel_spec *kspec(const pctx *c) { return &c->ex->P->modules[c->s->module]; }

static int64_t kint(pctx *c, const char *key) {
    const char *v = cp_kspec_get(kspec(c), key);
    return v ? strtoll(v, NULL, 10) : -1;
}

static void a_ptr(xlaunch *l, const void *p) {
    l->val[l->nargs] = (uint64_t)(uintptr_t)p;
    l->args[l->nargs] = &l->val[l->nargs];
    l->nargs++;
}
static void a_i64(xlaunch *l, int64_t v) {
    memcpy(&l->val[l->nargs], &v, sizeof v);
    l->args[l->nargs] = &l->val[l->nargs];
    l->nargs++;
}
static void a_i32(xlaunch *l, int v) {
    memcpy(&l->val[l->nargs], &v, sizeof v);
    l->args[l->nargs] = &l->val[l->nargs];
    l->nargs++;
}
static void a_f32(xlaunch *l, float v) {
    memcpy(&l->val[l->nargs], &v, sizeof v);
    l->args[l->nargs] = &l->val[l->nargs];
    l->nargs++;
}
/* The FP8 copy of output operand out the step's kernel writes beside it (cp_step.fp8_out), or NULL */
static const cp_step_fp8_out *fp8_copy_of(const pctx *c, int out) {
    for (int j = 0; j < c->s->nfp8_out; j++)
        if (c->s->fp8_out[j].out == out && c->s->fp8_out[j].kind != CP_FP8_OUT_AMAX) return &c->s->fp8_out[j];
    return NULL;
}

/* Output operand out's pointer, or NULL where the step's kernel writes its FP8 copy alone (cp_step_fp8_out.copy_only:
 * no later step reads it); only for the entries that take a NULL output (rmsnorm's and SwiGLU's forward with a copy)
 * or say so otherwise (SwiGLU's bwd_row, which writes in place: which outputs it stores) */
static char *out_or_copy_alone(pctx *c, int out) {
    const cp_step_fp8_out *a = fp8_copy_of(c, out);
    if (!a || !a->copy_only || a->kind != CP_FP8_OUT_COPY) return opp(c, out);
    c->fp8_alone |= 1u << (a - c->s->fp8_out);
    return NULL;
}

/* The FP8 type's largest value of an FP8 output (cp_step.fp8_out), which also names a copy's format; 0 if neither */
static float fp8_out_max(const cp_step_fp8_out *a) {
    return a->fmt == CP_GEMM_E4M3 ? 448.0f : a->fmt == CP_GEMM_E5M2 ? 57344.0f : 0.0f;
}

/* The kernel's own amax of output operand out (cp_step.fp8_out): the arguments (amax_slot, fmax), or (NULL, 0) where
 * the step has none. */
static int a_amax(pctx *c, xlaunch *l, int out) {
    for (int j = 0; j < c->s->nfp8_out; j++) {
        const cp_step_fp8_out *a = &c->s->fp8_out[j];
        if (a->out != out) continue;
        if (a->kind != CP_FP8_OUT_AMAX)
            return pfail(c, "an FP8 copy or maxima of operand %d given to a kernel entry that takes amaxes", out);
        if (a->slot < 0 || a->slot >= c->s->nops)
            return pfail(c, "amax %d of operand %d: no scale slot at operand %d", j, out, a->slot);
        if (need_bytes(c, a->slot, CP_FP8_SLOT_BYTES) || need_align(c, a->slot, 16)) return -1;
        if (!fp8_out_max(a)) return pfail(c, "amax %d of operand %d for an FP8 type %d", j, out, a->fmt);
        a_ptr(l, opp(c, a->slot));
        a_f32(l, fp8_out_max(a));
        c->fp8_taken |= 1u << j;
        return 0;
    }
    a_ptr(l, NULL);
    a_f32(l, 0.0f);
    return 0;
}

/* The FP8 copy [rows][cols] of output operand out that the kernel writes beside it: for an entry that writes 1 x 128
 * scales (the *_copy entries) the arguments (fmax, copy, scales), or (0, NULL, NULL) where the step has none; for one
 * with a scale per row (the *_row entries: row) (fmax, copy, scales f32[rows], col_max f32[col_max_rows][cols] |
 * NULL, col_max_rows), with copy and scales NULL where the step asks for the column maxima alone, or (0, NULL, NULL,
 * NULL, 1). */
static int a_copy(pctx *c, xlaunch *l, int out, int64_t rows, int64_t cols, bool row) {
    const cp_step_fp8_out *a = fp8_copy_of(c, out);
    if (!a) {
        a_f32(l, 0.0f);
        a_ptr(l, NULL);
        a_ptr(l, NULL);
        if (row) {
            a_ptr(l, NULL);
            a_i32(l, 1);
        }
        return 0;
    }
    if (row != (a->scale == CP_GEMM_SCALE_ROW))
        return pfail(c, "an FP8 copy of operand %d with scales of kind %d for a kernel entry that writes %s", out,
                     a->scale, row ? "a scale per row" : "1 x 128 blocks");
    const bool copy = a->kind == CP_FP8_OUT_COPY;
    if ((copy && (a->slot < 0 || a->scales < 0)) || a->slot >= c->s->nops || a->scales >= c->s->nops ||
        a->col_max >= c->s->nops || (a->col_max >= 0 && !row) || (!copy && a->col_max < 0))
        return pfail(c, "the FP8 %s of operand %d: operands %d, %d and %d", copy ? "copy" : "column maxima", out,
                     a->slot, a->scales, a->col_max);
    if (!fp8_out_max(a)) return pfail(c, "the FP8 copy of operand %d in an FP8 type %d", out, a->fmt);
    if (!row && (a->scale != CP_GEMM_SCALE_1D || cols % 128))
        return pfail(c, "an FP8 copy of operand %d with %lld columns and scales of kind %d, not whole blocks of 128 "
                     "or rows", out, (long long)cols, a->scale);
    if (copy && (need_bytes(c, a->slot, rows * cols) || need_align(c, a->slot, 16) ||
                 need_bytes(c, a->scales, (row ? rows : rows * (cols / 128)) * 4) || need_align(c, a->scales, 16)))
        return -1;
    a_f32(l, fp8_out_max(a));
    a_ptr(l, copy ? opp(c, a->slot) : NULL);
    a_ptr(l, copy ? opp(c, a->scales) : NULL);
    if (row) { /* the transposed copy's column maxima: whole rows of cols */
        int64_t maxima = a->col_max >= 0 ? opbytes(c, a->col_max) / (cols * 4) : 0;
        if (a->col_max >= 0 && (maxima < 1 || maxima > INT32_MAX || need_align(c, a->col_max, 4)))
            return pfail(c, "the column maxima of operand %d's FP8 copy: %lld bytes, not rows of %lld columns", out,
                         (long long)opbytes(c, a->col_max), (long long)cols);
        a_ptr(l, maxima ? opp(c, a->col_max) : NULL);
        a_i32(l, maxima ? (int)maxima : 1);
    }
    c->fp8_taken |= 1u << (a - c->s->fp8_out);
    return 0;
}

/* Whether the step's kernel writes an FP8 copy with a scale per row (cp_step_fp8_out.scale) beside an output */
static bool row_copies(const pctx *c) {
    for (int j = 0; j < c->s->nfp8_out; j++)
        if (c->s->fp8_out[j].kind != CP_FP8_OUT_AMAX && c->s->fp8_out[j].scale == CP_GEMM_SCALE_ROW) return true;
    return false;
}

/* The entry of a kernel that writes output operand out, `role` or its twin that also writes out's FP8 copy: role_copy
 * with 1 x 128 scales, role_row with a scale per row */
static const char *copy_role(const pctx *c, int out, const char *role, char *buf, size_t len) {
    if (!fp8_copy_of(c, out)) return role;
    snprintf(buf, len, "%s_%s", role, row_copies(c) ? "row" : "copy");
    return buf;
}

/* An argument read from the executor's scalars at each launch. */
static void a_dyn(xlaunch *l, void *p) { l->args[l->nargs++] = p; }

/* The kernel for `role` of the step's module, with the geometry for (n, heads). */
static int launch_of(pctx *c, const char *role, int64_t n, int64_t heads, xlaunch *l) {
    const cp_exec *ex = c->ex;
    const cp_kernel_spec *k = kspec(c);
    char e[1024];
    if (!ex->dry && cp_module_role(&ex->mods[c->s->module], k->family, role, &l->k, e, sizeof e))
        return pfail(c, "%s", e);
    int rc = strcmp(k->family, "attention") == 0 ? cp_k_attention_dims(k, role, &l->d)
                                                 : cp_k_dims(k, role, n, heads, ex->info.sms, &l->d);
    if (rc) return pfail(c, "no launch geometry for %s role %s", k->family, role);
    if (!l->d.grid[0] || !l->d.grid[1] || !l->d.grid[2] || !l->d.block)
        return pfail(c, "%s role %s gets an empty launch (%u x %u x %u blocks of %u)", k->family, role, l->d.grid[0],
                     l->d.grid[1], l->d.grid[2], l->d.block);
    /* any dynamic shared memory asked for: beside the entry's static memory even 48 KB can pass the default limit */
    if (!ex->dry && l->d.smem && cp_kernel_set_max_smem(l->k, l->d.smem, e, sizeof e)) return pfail(c, "%s", e);
    c->x->nl++;
    return 0;
}

/* ---- one function per step `what` ---- */

/* embed: fwd(tokens i32[n], table[V][H], out[n][H], n) */
static int k_embed(pctx *c) {
    if (need_ops(c, 3)) return -1;
    int64_t n = c->s->count, H = kint(c, "HIDDEN"), V = kint(c, "VOCAB");
    if (need_bytes(c, 0, n * 4) || need_bytes(c, 1, V * H * 2) || need_bytes(c, 2, n * H * 2)) return -1;
    if (need_align(c, 1, 16) || need_align(c, 2, 16)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "fwd", n, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_ptr(l, opp(c, 1));
    a_ptr(l, opp(c, 2));
    a_i64(l, n);
    return 0;
}

/* embed_bwd: operands tokens, token_order, dout, dtable; bwd_sorted(tokens, order i32[n], dout[n][H],
 * dtable f32[V][H] +=, n) */
static int k_embed_bwd(pctx *c) {
    if (need_ops(c, 4)) return -1;
    int64_t n = c->s->count, H = kint(c, "HIDDEN"), V = kint(c, "VOCAB");
    if (need_bytes(c, 0, n * 4) || need_bytes(c, 1, n * 4) || need_bytes(c, 2, n * H * 2) ||
        need_bytes(c, 3, V * H * 4))
        return -1;
    if (need_align(c, 2, 16) || need_align(c, 3, 16)) return -1;
    if (n > INT32_MAX) return pfail(c, "%lld rows: the sorted order holds 32-bit positions", (long long)n);
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "bwd_sorted", n, 0, l)) return -1;
    for (int j = 0; j < 4; j++) a_ptr(l, opp(c, j));
    a_i64(l, n);
    return 0;
}

/* norm1, norm2, final_norm, q_norm, k_norm: operands x, weight, out, rstd;
 * fwd(x, resid NULL, sum_out NULL, weight, out, rstd f32[n], n) */
static int k_norm_fwd(pctx *c) {
    if (need_ops(c, 4)) return -1;
    int64_t n = c->s->count, H = kint(c, "HIDDEN");
    if (need_bytes(c, 0, n * H * 2) || need_bytes(c, 1, H * 2) || need_bytes(c, 2, n * H * 2) ||
        need_bytes(c, 3, n * 4))
        return -1;
    for (int j = 0; j < 3; j++)
        if (need_align(c, j, 16)) return -1;
    xlaunch *l = &c->x->L[0];
    const bool copy = fp8_copy_of(c, 2); /* out's FP8 copy beside it: the entry fwd_copy or fwd_row */
    char role[16];
    if (launch_of(c, copy_role(c, 2, "fwd", role, sizeof role), n, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_ptr(l, NULL);
    a_ptr(l, NULL);
    a_ptr(l, opp(c, 1));
    a_ptr(l, out_or_copy_alone(c, 2));
    a_ptr(l, opp(c, 3));
    a_i64(l, n);
    return copy ? a_copy(c, l, 2, n, H, row_copies(c)) : a_amax(c, l, 2);
}

/* The norm backward, two launches: bwd(dout, x, weight, rstd, dresid|NULL, dx, dw_part f32[grid][H], n) (or
 * bwd_copy or bwd_row, which write dx's FP8 copy beside it), then
 * bwd_dw(dw_part, parts = bwd's grid, dweight f32 +=): the weight gradient summed in a fixed order. */
static int norm_bwd(pctx *c, int dout, int x, int w, int rstd, int dresid, int dx, int dw, int part) {
    int64_t n = c->s->count, H = kint(c, "HIDDEN");
    if (need_bytes(c, dout, n * H * 2) || need_bytes(c, x, n * H * 2) || need_bytes(c, w, H * 2) ||
        need_bytes(c, rstd, n * 4) || need_bytes(c, dx, n * H * 2) || need_bytes(c, dw, H * 4) ||
        (dresid >= 0 && need_bytes(c, dresid, n * H * 2)))
        return -1;
    if (need_align(c, dout, 16) || need_align(c, x, 16) || need_align(c, w, 16) || need_align(c, dx, 16) ||
        need_align(c, dw, 16) || need_align(c, part, 16) || (dresid >= 0 && need_align(c, dresid, 16)))
        return -1;
    xlaunch *l = &c->x->L[0], *r = &c->x->L[1];
    const bool copy = fp8_copy_of(c, dx); /* dx's FP8 copy beside it: the entry bwd_copy or bwd_row */
    char role[16];
    if (launch_of(c, copy_role(c, dx, "bwd", role, sizeof role), n, 0, l)) return -1;
    int64_t parts = l->d.grid[0];
    if (need_bytes(c, part, parts * H * 4)) return -1;
    a_ptr(l, opp(c, dout));
    a_ptr(l, opp(c, x));
    a_ptr(l, opp(c, w));
    a_ptr(l, opp(c, rstd));
    a_ptr(l, dresid >= 0 ? opp(c, dresid) : NULL);
    a_ptr(l, opp(c, dx));
    a_ptr(l, opp(c, part));
    a_i64(l, n);
    if ((copy ? a_copy(c, l, dx, n, H, row_copies(c)) : a_amax(c, l, dx)) || launch_of(c, "bwd_dw", n, 0, r)) return -1;
    a_ptr(r, opp(c, part));
    a_i32(r, (int)parts);
    a_ptr(r, opp(c, dw));
    return 0;
}

/* norm1_bwd, norm2_bwd: operands dxn, x, weight, rstd, d_resid-in (dresid), dx out, dweight, norm partials */
static int k_norm_bwd_resid(pctx *c) { return need_ops(c, 8) ? -1 : norm_bwd(c, 0, 1, 2, 3, 4, 5, 6, 7); }
/* final_norm_bwd: operands dout, x, weight, rstd, dx, dweight, norm partials */
static int k_norm_bwd(pctx *c) { return need_ops(c, 7) ? -1 : norm_bwd(c, 0, 1, 2, 3, -1, 4, 5, 6); }
/* qk_norm_bwd: operands d (in place: dout and dx), x (before the norm), weight, rstd, dweight, norm partials */
static int k_qk_norm_bwd(pctx *c) { return need_ops(c, 6) ? -1 : norm_bwd(c, 0, 1, 2, 3, -1, 0, 4, 5); }

/* rope_q, rope_k (fwd), rope_dq, rope_dk (bwd): in place on [n][heads][D], row r at position pos0 + r:
 * fwd/bwd(x, n, heads, pos0); or where the step writes the FP8 copy of what it writes, bwd_copy(x, n, heads, pos0,
 * fmax, copy, scales, row0, T) (the run's rows from row0 of the copy of all T). This rank's T rows lie at the
 * positions of its runs (cp_ring_rope_runs: one at rank x T without a ring, one or two under a ring's zigzag); a ring
 * plan has a launch per run a rank may have, this one run ring_part of the rank's, which launches nothing where the
 * rank has fewer. */
static int k_rope(pctx *c) {
    bool per_row = kint(c, "POS_ARRAY") == 1; /* packed documents: each row's position from operand 1 */
    if (need_ops(c, per_row ? 2 : 1)) return -1;
    const cp_plan *P = c->ex->P;
    int64_t T = c->s->count, heads = c->s->heads, D = kint(c, "D");
    if (T < 1 || heads < 1) return pfail(c, "%lld rows of %lld heads", (long long)T, (long long)heads);
    if (opbytes(c, 0) != T * heads * D * 2)
        return pfail(c, "%lld bytes are not %lld rows of %lld heads of %lld", (long long)opbytes(c, 0), (long long)T,
                     (long long)heads, (long long)D);
    cp_ring_rope_run run[2];
    int runs = cp_ring_rope_runs(P->ring, c->ex->ring_pos, P->S, P->C, c->ex->o.rank, run);
    int64_t rows = 0;
    for (int k = 0; k < runs; k++) rows += run[k].rows;
    if (rows != T) return pfail(c, "%lld rows, the rank's runs of positions hold %lld", (long long)T, (long long)rows);
    int part = CP_MAX(c->s->ring_part, 0);
    if (part >= runs) return 0; /* one run here: the launch for a second has nothing to do */
    if (shift(c, 0, run[part].row0 * heads * D * 2) || need_align(c, 0, 16)) return -1;
    const bool copy = fp8_copy_of(c, 0);
    if (copy && strcmp(c->s->role, "bwd")) return pfail(c, "an FP8 copy of what rope's %s writes", c->s->role);
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, copy ? "bwd_copy" : c->s->role, run[part].rows, heads, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_i64(l, run[part].rows);
    a_i32(l, (int)heads);
    if (!per_row) {
        a_i64(l, run[part].pos0);
    } else {
        if (need_bytes(c, 1, T * 4) || shift(c, 1, run[part].row0 * 4)) return -1;
        a_ptr(l, opp(c, 1));
    }
    if (!copy) return 0;
    if (a_copy(c, l, 0, T, heads * D, false)) return -1;
    a_i64(l, run[part].row0);
    a_i64(l, T);
    return 0;
}

/* The Hopper attention kernels (fwd_sm90, bwd_sm90) on sm_90a, unless CPGEN_ATTN_PATH=mma asks for the mma.sync
 * ones of sm_80 and sm_89 there (to compare the two paths on one GPU). */
static bool attn_hopper(const pctx *c) {
    const char *p = getenv("CPGEN_ATTN_PATH");
    return cp_k_attention_hopper(c->ex->o.arch) && !(p && strcmp(p, "mma") == 0);
}

/* One tensor map argument: operand op, head-layout [S][heads][D] of elem_bytes elements, read or written in boxes
 * of rows rows. */
typedef struct {
    int op;
    int64_t heads;
    int rows, elem_bytes;
} tmap_arg;

/* The n tensor map arguments, encoded once for these addresses and owned by the launch. */
static int a_tmaps(pctx *c, xlaunch *l, int n, const tmap_arg *t) {
    const int64_t S = kint(c, "SEQ"), D = kint(c, "HEAD_DIM");
    l->tmaps = aligned_alloc(_Alignof(cp_tmap), (size_t)n * sizeof(cp_tmap));
    if (!l->tmaps) return pfail(c, "out of host memory for tensor maps");
    for (int j = 0; j < n; j++) {
        char e[512];
        if (c->ex->dry) memset(&l->tmaps[j], 0, sizeof l->tmaps[j]); /* no driver to encode with, nothing launched */
        else if (cp_tmap_heads(&l->tmaps[j], opp(c, t[j].op), t[j].elem_bytes, S, t[j].heads, D, t[j].rows, e,
                               sizeof e))
            return pfail(c, "%s", e);
        l->args[l->nargs++] = &l->tmaps[j];
    }
    return 0;
}

/* The LSE operand (j) of an attention launch: its rows LSE_STRIDE apart as the module was compiled, and as the plan
 * laid them out (a ring's launches say where they take their rows from: cp_step.lse_stride). */
static int need_lse(pctx *c, int j) {
    const int64_t stride = kint(c, "LSE_STRIDE");
    if (c->s->lse_stride && c->s->lse_stride != stride)
        return pfail(c, "LSE rows %lld apart in the plan, %lld in the module", (long long)c->s->lse_stride,
                     (long long)stride);
    return need_bytes(c, j, cp_k_attention_lse_bytes(kspec(c)));
}

/* attn_fwd: operands q, k, v, o, lse (the stage's slice): fwd(q, k, v, o, lse), or on Hopper
 * fwd_sm90(tensor maps of q, k, v; o, lse) */
/* With document masks (DOCS) an attention launch has two operands more, last: the sequence's doc_start and doc_end
 * (int32 [S] each: cp_exec_set_documents), passed with the global positions of its first query and key rows (0 and 0
 * but for a ring's half launches: attn_half sets them). */
static int attn_docs_ops(pctx *c) { return kint(c, "DOCS") == 1 ? 2 : 0; }
static int a_docs(pctx *c, xlaunch *l) {
    if (!attn_docs_ops(c)) return 0;
    const int j = c->s->nops - 2;
    const int64_t S = c->ex->P->S;
    if (need_bytes(c, j, S * 4) || need_bytes(c, j + 1, S * 4) || need_align(c, j, 4) || need_align(c, j + 1, 4))
        return -1;
    a_ptr(l, opp(c, j));
    a_ptr(l, opp(c, j + 1));
    a_i32(l, (int)c->q_pos);
    a_i32(l, (int)c->k_pos);
    return 0;
}

static int k_attn_fwd(pctx *c) {
    if (need_ops(c, 5 + attn_docs_ops(c))) return -1;
    int64_t S = kint(c, "SEQ"), D = kint(c, "HEAD_DIM"), QH = kint(c, "Q_HEADS"), KH = kint(c, "KV_HEADS");
    if (need_bytes(c, 0, S * QH * D * 2) || need_bytes(c, 1, S * KH * D * 2) || need_bytes(c, 2, S * KH * D * 2) ||
        need_bytes(c, 3, S * QH * D * 2) || need_lse(c, 4))
        return -1;
    for (int j = 0; j < 5; j++)
        if (need_align(c, j, 16)) return -1;
    xlaunch *l = &c->x->L[0];
    if (!attn_hopper(c)) {
        if (launch_of(c, "fwd", 0, 0, l)) return -1;
        for (int j = 0; j < 5; j++) a_ptr(l, opp(c, j));
        return a_docs(c, l);
    }
    const tmap_arg t[3] = {{0, QH, CP_ATTN_SM90_BOX_ROWS, 2}, {1, KH, CP_ATTN_SM90_BOX_ROWS, 2},
                           {2, KH, CP_ATTN_SM90_BOX_ROWS, 2}};
    if (launch_of(c, "fwd_sm90", 0, 0, l) || a_tmaps(c, l, 3, t)) return -1;
    a_ptr(l, opp(c, 3));
    a_ptr(l, opp(c, 4));
    return a_docs(c, l);
}

/* attn_bwd: operands q, k, v, dout, lse (the stage's slice), delta, the dQ workspace (fp32 dQ, written, or added to
 * when DQ_ATOMIC; then the progress counters; the plan zeroes what must start at zero), then dK and dV: fp32 added to
 * (DKV_ACCUM), in one operand of dK then dV (dkv_accum, a ring's accumulator) or in two (a ring's half launch), else
 * bf16 written, two operands: bwd(q, k, v, dout, lse, delta, dq_ws, dq_prog, dk, dv), or on Hopper
 * bwd_sm90(tensor maps of q, k, v, dout, dq_ws; lse, delta, dq_prog, dk, dv) */
static int k_attn_bwd(pctx *c) {
    const int nd = attn_docs_ops(c);
    bool acc = kint(c, "DKV_ACCUM") == 1, apart = !acc || c->s->nops - nd == 9;
    if (need_ops(c, (apart ? 9 : 8) + nd)) return -1;
    int64_t S = kint(c, "SEQ"), D = kint(c, "HEAD_DIM"), QH = kint(c, "Q_HEADS"), KH = kint(c, "KV_HEADS");
    int64_t dkv = S * KH * D * (acc ? 4 : 2); /* dK or dV */
    if (need_bytes(c, 0, S * QH * D * 2) || need_bytes(c, 1, S * KH * D * 2) || need_bytes(c, 2, S * KH * D * 2) ||
        need_bytes(c, 3, S * QH * D * 2) || need_lse(c, 4) || need_bytes(c, 5, S * QH * 4) ||
        need_bytes(c, 6, cp_k_attention_workspace_bytes(kspec(c))))
        return -1;
    if (apart ? need_bytes(c, 7, dkv) || need_bytes(c, 8, dkv) : need_bytes(c, 7, 2 * dkv)) return -1;
    for (int j = 0; j < c->s->nops - nd; j++)
        if (need_align(c, j, 16)) return -1;
    xlaunch *l = &c->x->L[0];
    if (attn_hopper(c)) {
        const tmap_arg t[5] = {{0, QH, CP_ATTN_SM90_BWD_Q_ROWS, 2}, {1, KH, CP_ATTN_SM90_BOX_ROWS, 2},
                               {2, KH, CP_ATTN_SM90_BOX_ROWS, 2}, {3, QH, CP_ATTN_SM90_BWD_Q_ROWS, 2},
                               {6, QH, CP_ATTN_SM90_BWD_Q_ROWS, 4}};
        if (launch_of(c, "bwd_sm90", 0, 0, l) || a_tmaps(c, l, 5, t)) return -1;
        for (int j = 4; j < 6; j++) a_ptr(l, opp(c, j));
    } else {
        if (launch_of(c, "bwd", 0, 0, l)) return -1;
        for (int j = 0; j < 7; j++) a_ptr(l, opp(c, j));
    }
    a_ptr(l, opp(c, 6) + cp_k_attention_prog_offset(kspec(c)));
    a_ptr(l, opp(c, 7));
    a_ptr(l, apart ? opp(c, 8) : opp(c, 7) + dkv);
    return a_docs(c, l);
}

/* attn_fwd_half, attn_bwd_half: a ring's half-block launches, attn_fwd's and attn_bwd's operands and launches over
 * this rank's query half and key half of a received block (the module's SEQ is a half, c rows; no mask), or with
 * documents of step 0's own block too (its diagonal halves causal): q, o, dout, delta at the query half's rows, k, v
 * and the fp32 dK, dV at the key half's, the LSE at the query half's columns; the half launch's dQ workspace
 * (attn_bwd_half's operand 6) is its own. With documents the mask's positions are the halves' global ones
 * (cp_ring_half_pos): the query half's chunk at this rank's ring position, the key half's at the block's source. */
static int attn_half(pctx *c, int nops) {
    cp_ring_half h;
    cp_ring_span sp;
    const cp_plan *P = c->ex->P;
    if (need_ops(c, nops + attn_docs_ops(c)) || ring_halves(c, &h, &sp)) return -1;
    int64_t S = kint(c, "SEQ"), D = kint(c, "HEAD_DIM"), QH = kint(c, "Q_HEADS"), KH = kint(c, "KV_HEADS");
    const int k = c->s->ring_step, part = c->s->ring_part;
    if (kint(c, "CAUSAL") != cp_ring_half_causal(k, part))
        return pfail(c, "a %s module for half launch %d of ring step %d",
                     kint(c, "CAUSAL") == 1 ? "causal" : "maskless", part, k);
    if (S * 2 * P->ring != P->S)
        return pfail(c, "a half launch of %lld rows in a ring of %d over %lld tokens", (long long)S, P->ring,
                     (long long)P->S);
    if (attn_docs_ops(c)) {
        cp_ring_pos pos = cp_ring_half_pos(P->ring, c->ex->ring_pos, k, part, S);
        /* the kernel compares a causal launch's rows and keys locally, which is the global order only where both
         * halves are the same chunk */
        if (pos.q_pos < 0 || pos.k_pos < 0 || pos.q_pos + S > P->S || pos.k_pos + S > P->S ||
            (cp_ring_half_causal(k, part) && pos.q_pos != pos.k_pos))
            return pfail(c, "half launch %d of ring step %d at positions %lld (queries) and %lld (keys) of %lld", part,
                         k, (long long)pos.q_pos, (long long)pos.k_pos, (long long)P->S);
        c->q_pos = pos.q_pos, c->k_pos = pos.k_pos;
    }
    const int64_t q = S * QH * D * 2, kv = S * KH * D * 2, lse = S * 4;
    if (at_half(c, 0, h.q_half, sp.q0, q) || at_half(c, 1, h.k_half, sp.k0, kv) || at_half(c, 2, h.k_half, sp.k0, kv))
        return -1;
    if (nops == 5) /* q, k, v, o, lse */
        return at_half(c, 3, h.q_half, sp.q0, q) || at_half(c, 4, h.q_half, sp.q0, lse) ? -1 : k_attn_fwd(c);
    /* q, k, v, dout, lse, delta, dq_ws, dK, dV */
    if (at_half(c, 3, h.q_half, sp.q0, q) || at_half(c, 4, h.q_half, sp.q0, lse) ||
        at_half(c, 5, h.q_half, sp.q0, S * QH * 4) || at_half(c, 7, h.k_half, sp.k0, 2 * kv) ||
        at_half(c, 8, h.k_half, sp.k0, 2 * kv))
        return -1;
    return k_attn_bwd(c);
}
static int k_attn_fwd_half(pctx *c) { return attn_half(c, 5); }
static int k_attn_bwd_half(pctx *c) { return attn_half(c, 9); }

/* attn_merge_init, attn_merge: operands o_blk (bf16 [n][heads][D]), lse_blk, o_acc (fp32 [n][heads][D]), lse_acc
 * (the LSE operands rows of lse_stride): init or fwd(o_blk, lse_blk, o_acc, lse_acc, n, heads, lse_stride). The
 * merge of a half launch's output takes the rows of this rank's query half, and the columns of its LSE rows. */
static int k_attn_merge(pctx *c) {
    if (need_ops(c, 4)) return -1;
    int64_t n = c->s->count, heads = c->s->heads, D = kint(c, "D"), stride = c->s->lse_stride;
    if (n < 1 || heads < 1 || stride < n)
        return pfail(c, "%lld rows of %lld heads, LSE rows %lld apart", (long long)n, (long long)heads,
                     (long long)stride);
    const int64_t o16 = n * heads * D * 2, o32 = n * heads * D * 4, lse = ((heads - 1) * stride + n) * 4;
    if (c->s->ring_part >= 0) {
        cp_ring_half h;
        cp_ring_span sp;
        if (ring_halves(c, &h, &sp) || at_half(c, 0, h.q_half, sp.q0, o16) || at_half(c, 1, h.q_half, sp.q0, n * 4) ||
            at_half(c, 2, h.q_half, sp.q0, o32) || at_half(c, 3, h.q_half, sp.q0, n * 4))
            return -1;
    }
    if (need_bytes(c, 0, o16) || need_bytes(c, 1, lse) || need_bytes(c, 2, o32) || need_bytes(c, 3, lse) ||
        need_align(c, 0, 16) || need_align(c, 1, 4) || need_align(c, 2, 16) || need_align(c, 3, 4))
        return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, c->s->role, n, heads, l)) return -1;
    for (int j = 0; j < 4; j++) a_ptr(l, opp(c, j));
    a_i64(l, n);
    a_i32(l, (int)heads);
    a_i64(l, stride);
    return 0;
}

/* attn_bwd_dq: operands dq_ws (fp32), dq (bf16): bwd_dq(dq_ws, dq), dq = bf16(scale * dq_ws) */
static int k_attn_bwd_dq(pctx *c) {
    if (need_ops(c, 2)) return -1;
    int64_t S = kint(c, "SEQ"), D = kint(c, "HEAD_DIM"), QH = kint(c, "Q_HEADS");
    if (need_bytes(c, 0, S * QH * D * 4) || need_bytes(c, 1, S * QH * D * 2) || need_align(c, 0, 16) ||
        need_align(c, 1, 16))
        return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "bwd_dq", 0, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_ptr(l, opp(c, 1));
    return 0;
}

/* Ulysses layout kernels: between a stage's columns of a token-layout buffer (T rows of the whole buffer's width)
 * and C contiguous blocks of [T][NOUT][ROW_BYTES] heads, one per rank (with one GPU, a strided copy). */
static int layout_check(pctx *c, int tokbuf_op, int64_t *stride) {
    const cp_plan *P = c->ex->P;
    int64_t T = kint(c, "T"), nout = kint(c, "NOUT"), rb = kint(c, "ROW_BYTES"), unit = kint(c, "UNIT");
    int64_t C = kint(c, "C"), R = kint(c, "R");
    if (C != P->C) return pfail(c, "a layout kernel for %lld GPUs in a plan of %d", (long long)C, P->C);
    /* a token row holds C/R * NOUT heads of the stage; the all-to-all side C blocks of T x NOUT heads */
    int64_t row = C / R * nout * rb;
    const cp_buffer *b = opbuf(c, tokbuf_op);
    if (T != P->T || b->bytes % T) return pfail(c, "%s is not %lld token rows", b->name, (long long)T);
    *stride = b->bytes / T;
    if (*stride % unit || *stride < row) return pfail(c, "row stride %lld of %s", (long long)*stride, b->name);
    int other = 1 - tokbuf_op;
    /* the stage's columns of every row: from the operand's offset to near the buffer's end, whatever the
     * operand's byte count says (step_ranges widens it to the whole buffer for the stream analysis) */
    if (need_bytes(c, other, C * T * nout * rb)) return -1;
    if (c->s->ops[tokbuf_op].offset + (T - 1) * *stride + row > b->bytes)
        return pfail(c, "the stage's columns run past the end of %s", b->name);
    if (need_align(c, 0, (int)unit) || need_align(c, 1, (int)unit)) return -1;
    return 0;
}

/* pack_do, pack_delta: operands src (the stage's columns), dst (head layout): pack(src, src_stride, dst) */
static int k_pack(pctx *c) {
    int64_t stride;
    if (need_ops(c, 2) || layout_check(c, 0, &stride)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "pack", 0, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_i64(l, stride);
    a_ptr(l, opp(c, 1));
    return 0;
}

/* unpack_o, unpack_dq, unpack_dk, unpack_dv: operands src (head layout: the all-to-all's C blocks), dst (the stage's
 * columns of the token rows): unpack or unpack_add (the step's role) (src, dst, dst_stride); or, where the step
 * takes dst's amax, unpack_amax(src, dst, dst_stride, amax_slot, fmax); or where it writes dst's FP8 copy,
 * unpack_copy(src, dst, dst_stride, fmax, copy, scales) on whole rows */
static int k_unpack(pctx *c) {
    int64_t stride;
    if (need_ops(c, 2) || layout_check(c, 1, &stride)) return -1;
    const bool copy = fp8_copy_of(c, 1), amax = !copy && c->s->nfp8_out > 0;
    const int64_t T = kint(c, "T"), row = kint(c, "C") * kint(c, "NOUT") * kint(c, "ROW_BYTES");
    if ((copy || amax) && strcmp(c->s->role, "unpack"))
        return pfail(c, "FP8 work on what the layout kernel's %s writes", c->s->role);
    if (copy && (stride != row || c->s->ops[1].offset % row))
        return pfail(c, "an FP8 copy of %s's rows where the unpack does not write them whole", opbuf(c, 1)->name);
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, copy ? "unpack_copy" : amax ? "unpack_amax" : c->s->role, 0, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_ptr(l, opp(c, 1));
    a_i64(l, stride);
    return copy ? a_copy(c, l, 1, T, row / 2, false) : amax ? a_amax(c, l, 1) : 0;
}

/* swiglu: operands gate, up, out: fwd(gate, up, out, n); swiglu_bwd: operands dout (d act), gate, up (overwritten
 * with their gradients): bwd(dout, gate, up, n). Both: three [n][FFN] bf16 operands, then n, then each output's amax
 * slot; or where the step writes FP8 copies of its outputs, the entries fwd_copy, bwd_copy (both gradients'),
 * bwd_copy_gate or bwd_copy_up with each output's copy; with a scale per row fwd_row or bwd_row (both outputs'
 * arguments, NULL for one without a copy). */
static int swiglu(pctx *c, bool bwd) {
    if (need_ops(c, 3)) return -1;
    int64_t n = c->s->count, F = kint(c, "FFN");
    for (int j = 0; j < 3; j++)
        if (need_bytes(c, j, n * F * 2) || need_align(c, j, 16)) return -1;
    const bool c1 = bwd && fp8_copy_of(c, 1), c2 = fp8_copy_of(c, 2); /* dgate's, and out's or dup's */
    const bool row = row_copies(c);
    const char *role = row    ? (bwd ? "bwd_row" : "fwd_row")
                       : !bwd ? (c2 ? "fwd_copy" : "fwd")
                              : c1 && c2 ? "bwd_copy" : c1 ? "bwd_copy_gate" : c2 ? "bwd_copy_up" : "bwd";
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, role, n, 0, l)) return -1;
    for (int j = 0; j < 3; j++) a_ptr(l, bwd ? opp(c, j) : out_or_copy_alone(c, j));
    a_i64(l, n);
    if (!bwd) return c2 ? a_copy(c, l, 2, n, F, row) : a_amax(c, l, 2); /* out */
    if (c1 || c2) { /* dgate, dup; with row copies which of them to store (not those only their copies are read of) */
        if (a_copy(c, l, 1, n, F, row) || a_copy(c, l, 2, n, F, row)) return -1;
        if (row) a_i32(l, (out_or_copy_alone(c, 1) ? 1 : 0) | (out_or_copy_alone(c, 2) ? 2 : 0));
        return 0;
    }
    return a_amax(c, l, 1) || a_amax(c, l, 2) ? -1 : 0;
}
static int k_swiglu(pctx *c) { return swiglu(c, false); }
static int k_swiglu_bwd(pctx *c) { return swiglu(c, true); }

/* loss: operands logits (in place -> dlogits * scale), targets (the tile's), token_loss (the tile's):
 * fwdbwd(logits, targets, row_loss f32[n] out, scale, n); scale = 1 / target tokens of the whole step */
static int k_loss(pctx *c) {
    if (need_ops(c, 3)) return -1;
    int64_t n = c->s->count, V = kint(c, "VOCAB");
    if (need_bytes(c, 0, n * V * 2) || need_bytes(c, 1, n * 4) || need_bytes(c, 2, n * 4) || need_align(c, 0, 16))
        return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "fwdbwd", n, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_ptr(l, opp(c, 1));
    a_ptr(l, opp(c, 2));
    a_dyn(l, &c->ex->sc.loss_scale);
    a_i64(l, n);
    return 0;
}

/* loss_sum: operands token_loss, loss_sum float 0: sum(row_loss f32[n], n, loss_sum f32[1] +=) */
static int k_loss_sum(pctx *c) {
    if (need_ops(c, 2)) return -1;
    int64_t n = c->s->count;
    if (need_bytes(c, 0, n * 4) || need_bytes(c, 1, 4)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "sum", n, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_i64(l, n);
    a_ptr(l, opp(c, 1));
    return 0;
}

/* attn_delta: operands dout, out (token layout [n][heads][D]), delta f32[n][heads]: fwd(dout, out, delta, n, heads) */
static int k_attn_delta(pctx *c) {
    if (need_ops(c, 3)) return -1;
    int64_t n = c->s->count, heads = c->s->heads, D = kint(c, "D");
    if (heads < 1) return pfail(c, "no heads given");
    if (need_bytes(c, 0, n * heads * D * 2) || need_bytes(c, 1, n * heads * D * 2) || need_bytes(c, 2, n * heads * 4))
        return -1;
    for (int j = 0; j < 3; j++)
        if (need_align(c, j, 16)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "fwd", n, heads, l)) return -1;
    for (int j = 0; j < 3; j++) a_ptr(l, opp(c, j));
    a_i64(l, n);
    a_i32(l, (int)heads);
    return 0;
}

/* An elementwise launch of the cast module, role(src f32[n], dst[n], n), on operands 0 (src) and 1 (dst, dst_elem
 * bytes an element) as the step's builder placed them. */
static int cast_launch(pctx *c, const char *role, int64_t dst_elem) {
    int64_t n = c->s->count;
    if (need_bytes(c, 0, n * 4) || need_bytes(c, 1, n * dst_elem)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, role, n, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_ptr(l, opp(c, 1));
    a_i64(l, n);
    return 0;
}

/* add_f32(src f32[n], dst f32[n] +=, n) */
static int add_f32(pctx *c) { return cast_launch(c, "add_f32", 4); }

/* grad_accum (C > 1, micro-batches > 1): operands this rank's gradient shard of a unit, the unit's full gradients:
 * add_f32(shard, full + rank * shard, n) before the reduce-scatter overwrites the shard with the sum */
static int k_grad_accum(pctx *c) {
    return need_ops(c, 2) || shift(c, 1, (int64_t)c->ex->o.rank * c->s->count * 4) ? -1 : add_f32(c);
}

/* ring_add_dkv: operands a ring step's own dK, dV and the accumulator that arrived; ring_add_dq: a half launch's dQ
 * and the stage's dQ workspace, at the rows of this rank's query half: add_f32(src, dst, n) */
static int k_ring_add(pctx *c) {
    if (need_ops(c, 2)) return -1;
    if (c->s->ring_part >= 0) {
        cp_ring_half h;
        cp_ring_span sp;
        if (ring_halves(c, &h, &sp) || at_half(c, 1, h.q_half, sp.q0, c->s->count * 4)) return -1;
    }
    return add_f32(c);
}

/* cast_dk, cast_dv, cast_o (a ring's merged output): operands src f32, dst bf16: f32_to_bf16(src, dst, n) */
static int k_cast(pctx *c) { return need_ops(c, 2) ? -1 : cast_launch(c, "f32_to_bf16", 2); }

/* An FP8 cast's source, operand 0: bf16 [rows = count][cols = heads] with row stride ld (gen/plan_fp8.c) */
static int fp8_source(pctx *c, xlaunch *l, const char *role) {
    int64_t rows = c->s->count, cols = c->s->heads, ld = c->s->ld;
    if (rows < 1 || cols < 1 || rows % 16 || cols % 16 || ld < cols || ld % 8)
        return pfail(c, "an FP8 cast of %lld x %lld (row stride %lld): rows and columns must be multiples of 16, the "
                     "stride of 8", (long long)rows, (long long)cols, (long long)ld);
    if (need_bytes(c, 0, ((rows - 1) * ld + cols) * 2) || need_align(c, 0, 16)) return -1;
    if (launch_of(c, role, rows, cols, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_i64(l, rows);
    a_i64(l, cols);
    a_i64(l, ld);
    return 0;
}

/* fp8_amax: operands src, its parts f32[CP_FP8_AMAX_PARTS], its counter u32, its scale slot f32[4]:
 * role(src, rows, cols, ld, parts, counter, slot), the role amax_e4m3 or amax_e5m2 */
static int k_fp8_amax(pctx *c) {
    if (need_ops(c, 4)) return -1;
    xlaunch *l = &c->x->L[0];
    if (need_bytes(c, 1, CP_FP8_AMAX_PARTS * 4) || need_bytes(c, 2, 4) || need_bytes(c, 3, 16) ||
        need_align(c, 2, 4) || need_align(c, 3, 16) || fp8_source(c, l, c->s->role))
        return -1;
    if (l->d.grid[0] > CP_FP8_AMAX_PARTS)
        return pfail(c, "%u blocks for %d amax parts", l->d.grid[0], CP_FP8_AMAX_PARTS);
    a_ptr(l, opp(c, 1));
    a_ptr(l, opp(c, 2));
    a_ptr(l, opp(c, 3));
    return 0;
}

/* fp8_cast: operands src, its scale slot, the FP8 copy: role(src, rows, cols, ld, slot, dst) */
static int k_fp8_cast(pctx *c) {
    if (need_ops(c, 3)) return -1;
    xlaunch *l = &c->x->L[0];
    if (need_bytes(c, 1, 16) || need_align(c, 1, 16) || need_bytes(c, 2, c->s->count * c->s->heads) ||
        need_align(c, 2, 16) || fp8_source(c, l, c->s->role))
        return -1;
    a_ptr(l, opp(c, 1));
    a_ptr(l, opp(c, 2));
    return 0;
}

/* cast_t_row8's arguments: (row copy, rows, cols, cols, dst, scales, row copy's scales), from those operands */
static void row8_args(pctx *c, xlaunch *l, int rows8, int dst, int scales, int row_scales) {
    a_ptr(l, opp(c, rows8));
    a_i64(l, c->s->count);
    a_i64(l, c->s->heads);
    a_i64(l, c->s->heads);
    a_ptr(l, opp(c, dst));
    a_ptr(l, opp(c, scales));
    a_ptr(l, opp(c, row_scales));
}

/* fp8_cast_block's transposed row-scaled copy cast from the row copy (cp_fp8_copy.from_rows), below */
static int fp8_cast_from_rows(pctx *c) {
    const cp_fp8_copy *f = &c->s->fp8;
    const int64_t rows = c->s->count, cols = c->s->heads;
    if (need_ops(c, 4)) return -1;
    if (f->scale != CP_GEMM_SCALE_ROW || !f->transposed || !f->maxima || f->both)
        return pfail(c, "an FP8 cast (%s) from a row copy, not of a transposed row-scaled copy from column maxima made "
                     "before", c->s->role);
    if (rows < 1 || cols < 1 || rows % 16 || cols % CP_FP8_ROW8_COLS || c->s->ld != cols)
        return pfail(c, "an FP8 cast (%s) of a row copy of %lld x %lld (row stride %lld): rows a multiple of 16, "
                     "columns of %d, the stride the columns", c->s->role, (long long)rows, (long long)cols,
                     (long long)c->s->ld, CP_FP8_ROW8_COLS);
    xlaunch *l = &c->x->L[0];
    if (need_bytes(c, 0, rows * cols) || need_align(c, 0, 16) || need_bytes(c, 1, rows * cols) ||
        need_align(c, 1, 16) || need_bytes(c, 2, (cols + cp_fp8_row_parts(rows, cols)) * 4) || need_align(c, 2, 16) ||
        need_bytes(c, 3, rows * 4) || need_align(c, 3, 4) || launch_of(c, c->s->role, rows, cols, l))
        return -1;
    row8_args(c, l, 0, 1, 2, 3);
    return 0;
}

/* fp8_cast_block of one weight of every layer at once (cp_fp8_copy.layers): operands the first layer's weight on
 * (the next layers' src_stride elements apart), every layer's row copies, their scales, the transposed copies, their
 * scales (and with row scales the maxima, zeroed before), as gen/plan.h lays them out, a layer a grid z. Row scales:
 * cast_rt_row_layers_e4m3(src, rows, cols, cols, copies, scales, copies_t, scales_t, src_stride, pitch, pitch_t) then
 * cast_t_row8_layers_e4m3(copies, rows, cols, cols, copies_t, scales_t, scales, pitch_t, pitch); 128 x 128 tiles:
 * cast_2d_layers_e4m3(src, rows, cols, cols, copies, scales, src_stride, pitch) and cast_t_2d_layers_e4m3(src, rows,
 * cols, cols, copies_t, scales_t, src_stride, pitch_t). */
static int fp8_cast_layers(pctx *c) {
    const cp_fp8_copy *f = &c->s->fp8;
    const int64_t rows = c->s->count, cols = c->s->heads, layers = f->layers, n = rows * cols;
    const bool row = f->scale == CP_GEMM_SCALE_ROW;
    if (need_ops(c, 5)) return -1;
    if ((!row && f->scale != CP_GEMM_SCALE_2D) || !f->both || f->from_rows != row || f->transposed || f->maxima ||
        f->fmt != CP_GEMM_E4M3 || strcmp(c->s->role, row ? "cast_rt_row_layers_e4m3" : "cast_rt_2d_layers_e4m3"))
        return pfail(c, "a cast of %lld layers' weights at once (%s) not both ways in E4M3, row-scaled from the row "
                     "copy or in 128 x 128 tiles", (long long)layers, c->s->role);
    if (rows < 16 || rows % 16 || cols < 16 || cols % (row ? CP_FP8_ROW8_COLS : 16) ||
        (row && !cp_fp8_row_held(cols)) || c->s->ld != cols || f->src_stride < n || f->src_stride % 8 ||
        layers > 65535)
        return pfail(c, "a cast of %lld layers' %lld x %lld weights %lld elements apart (row stride %lld): rows a "
                     "multiple of 16, columns of %d (row scales: up to %lld), the stride the columns, the weights "
                     "apart by at least their size and a multiple of 8, at most 65535 layers", (long long)layers,
                     (long long)rows, (long long)cols, (long long)f->src_stride, (long long)c->s->ld,
                     row ? CP_FP8_ROW8_COLS : 16, (long long)(8 * CP_FP8_BLOCK * CP_FP8_ROW_VECS));
    const int64_t pitch = cp_fp8_layers_pitch(f->scale, rows, cols, false);
    const int64_t pitch_t = cp_fp8_layers_pitch(f->scale, rows, cols, true);
    if (need_bytes(c, 0, ((layers - 1) * f->src_stride + n) * 2) || need_align(c, 0, 16) ||
        need_bytes(c, 1, layers * n) || need_align(c, 1, 16) || need_bytes(c, 2, layers * pitch * 4) ||
        need_align(c, 2, 16) || need_bytes(c, 3, layers * n) || need_align(c, 3, 16) ||
        need_bytes(c, 4, layers * pitch_t * 4) || need_align(c, 4, 16))
        return -1;
    for (int k = 0; k < 2; k++) {
        static const char *const roles[2][2] = {{"cast_2d_layers_e4m3", "cast_t_2d_layers_e4m3"},
                                                {"cast_rt_row_layers_e4m3", "cast_t_row8_layers_e4m3"}};
        xlaunch *l = &c->x->L[k];
        if (launch_of(c, roles[row][k], rows, cols, l)) return -1;
        l->d.grid[2] = (unsigned)layers;
        if (row && k == 1) { /* the transposed copies from the row copies */
            row8_args(c, l, 1, 3, 4, 2);
            a_i64(l, pitch_t);
            a_i64(l, pitch);
            continue;
        }
        a_ptr(l, opp(c, 0));
        a_i64(l, rows);
        a_i64(l, cols);
        a_i64(l, cols);
        if (row) { /* the row copies and the transposed copies' column maxima */
            for (int j = 1; j < 5; j++) a_ptr(l, opp(c, j));
            a_i64(l, f->src_stride);
            a_i64(l, pitch);
            a_i64(l, pitch_t);
        } else { /* the tiles' copies as rows (k 0) or transposed (k 1) */
            a_ptr(l, opp(c, 1 + 2 * k));
            a_ptr(l, opp(c, 2 + 2 * k));
            a_i64(l, f->src_stride);
            a_i64(l, k ? pitch_t : pitch);
        }
    }
    return 0;
}

/* fp8_cast_block: operands src, the FP8 copy, its block (or row) scales: role(src, rows, cols, ld, dst, scales); the
 * step's copy (cp_step.fp8) says the layout, whose blocks of 128 must fit the source (k's side a multiple of 128). A
 * cast of both ways (cast_rt_*) has the transposed copy and its scales behind: role(..., dst, scales, dst_t,
 * scales_t); with 1 x 128 blocks rows and columns multiples of 128. A transposed copy with row scales is two launches
 * over strips of 32 columns, cast_t_row_max then the role, with the same arguments; both copies with row scales are
 * the role (the row copy and the transposed copy's column maxima, into its parts that a memset step zeroed) then
 * cast_t_row_* on the transposed copy's two operands; a transposed copy whose maxima the source's producer left
 * (cp_fp8_copy.maxima) is the role alone; one cast from the row copy that producer wrote (cp_fp8_copy.from_rows) has
 * operands row copy u8 [rows][cols], the copy, its scales, the row copy's scales f32[rows]: role(row copy, rows,
 * cols, cols, dst, scales, row scales), the role cast_t_row8_*; a cast of both ways with from_rows launches that
 * entry second, on the row copy it wrote first. */
static int k_fp8_cast_block(pctx *c) {
    const cp_fp8_copy *f = &c->s->fp8;
    if (f->layers > 1) return fp8_cast_layers(c);
    if (f->from_rows && !f->both) return fp8_cast_from_rows(c);
    if (need_ops(c, f->both ? 5 : 3)) return -1;
    xlaunch *l = &c->x->L[0];
    const char *role = c->s->role, *fmt = f->fmt == CP_GEMM_E5M2 ? "e5m2" : "e4m3";
    int64_t rows = c->s->count, cols = c->s->heads;
    bool t = f->transposed, tiles = f->scale == CP_GEMM_SCALE_2D, row = f->scale == CP_GEMM_SCALE_ROW;
    if (f->scale == CP_GEMM_SCALE_TENSOR) return pfail(c, "a block-scaled FP8 cast (%s) without blocks", role);
    if (f->maxima && (!row || !t || f->both))
        return pfail(c, "an FP8 cast (%s) from column maxima made before, not of a transposed row-scaled copy", role);
    if (f->both && (tiles || t || (!row && (rows % 128 || cols % 128))))
        return pfail(c, "an FP8 cast of both ways (%s) of %lld x %lld: 1 x 128 blocks with rows and columns multiples "
                     "of 128, or row scales", role, (long long)rows, (long long)cols);
    if (f->both && row && !cp_fp8_row_held(cols))
        return pfail(c, "an FP8 cast of both ways with row scales (%s) of rows of %lld columns (at most %lld)", role,
                     (long long)cols, (long long)(8 * CP_FP8_BLOCK * CP_FP8_ROW_VECS));
    if (f->from_rows && (!row || cols % CP_FP8_ROW8_COLS))
        return pfail(c, "an FP8 cast of both ways (%s) of %lld columns with its transposed copy from the row copy: row "
                     "scales and columns a multiple of %d", role, (long long)cols, CP_FP8_ROW8_COLS);
    int64_t crow = t ? cols : rows, ccol = t ? rows : cols; /* the copy's */
    if (!tiles && !row && ccol % 128)
        return pfail(c, "a 1 x 128 block-scaled FP8 cast (%s) of a copy with %lld columns (not a multiple of 128)",
                     role, (long long)ccol);
    if (row && (t || f->both) && cols % 32)
        return pfail(c, "a transposed row-scaled FP8 cast (%s) of %lld columns (not a multiple of 32)", role,
                     (long long)cols);
    /* a transposed row-scaled copy: its columns' maxima by chunks of rows behind the scales */
    int64_t parts = row ? cp_fp8_row_parts(rows, cols) : 0;
    int64_t scales = cp_fp8_scales(f->scale, crow, ccol) + (t ? parts : 0);
    int64_t scales_t = f->both ? cp_fp8_scales(f->scale, cols, rows) + parts : 0;
    if (need_bytes(c, 1, rows * cols) || need_align(c, 1, 16) || need_bytes(c, 2, scales * 4) ||
        need_align(c, 2, 16) || (f->both && (need_bytes(c, 3, rows * cols) || need_align(c, 3, 16) ||
                                             need_bytes(c, 4, scales_t * 4) || need_align(c, 4, 16))) ||
        fp8_source(c, l, row && t && !f->maxima ? "cast_t_row_max" : role))
        return -1;
    for (int j = 1; j < (f->both ? 5 : 3); j++) a_ptr(l, opp(c, j));
    if (row && (t || f->both) && !f->maxima) { /* then the transposed cast, on the transposed copy's operands */
        char cast_t[32];
        snprintf(cast_t, sizeof cast_t, "cast_t_row%s_%s", f->from_rows ? "8" : "", fmt);
        xlaunch *cast = &c->x->L[1];
        if (f->from_rows) { /* from the row copy just written */
            if (launch_of(c, cast_t, rows, cols, cast)) return -1;
            row8_args(c, cast, 1, 3, 4, 2);
        } else {
            if (fp8_source(c, cast, t ? role : cast_t)) return -1;
            for (int j = f->both ? 3 : 1; j < (f->both ? 5 : 3); j++) a_ptr(cast, opp(c, j));
        }
    }
    return 0;
}

/* grad_norm: operands grads, sumsq_partials, loss_sum float 1, sumsq's counter in loss_sum:
 * sumsq(grad f32[n], n, partial f64[grid], counter u32, out f32[1] +=) */
static int k_grad_norm(pctx *c) {
    if (need_ops(c, 4)) return -1;
    int64_t n = c->s->count;
    if (need_bytes(c, 0, n * 4) || need_bytes(c, 2, 4) || need_bytes(c, 3, 4) || need_align(c, 1, 8) ||
        need_align(c, 3, 4))
        return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "sumsq", n, 0, l)) return -1;
    if (need_bytes(c, 1, (int64_t)l->d.grid[0] * 8)) return -1;
    a_ptr(l, opp(c, 0));
    a_i64(l, n);
    a_ptr(l, opp(c, 1));
    a_ptr(l, opp(c, 3));
    a_ptr(l, opp(c, 2));
    return 0;
}

/* adamw: operands master, m, v, grads, params:
 * update(master, m, v, grad, param, n, lr, beta1, beta2, eps, wd, grad_scale, step) */
static int k_adamw(pctx *c) {
    if (need_ops(c, 5)) return -1;
    int64_t n = c->s->count;
    for (int j = 0; j < 4; j++)
        if (need_bytes(c, j, n * 4)) return -1;
    if (need_bytes(c, 4, n * 2)) return -1;
    scalars *sc = &c->ex->sc;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "update", n, 0, l)) return -1;
    for (int j = 0; j < 5; j++) a_ptr(l, opp(c, j));
    a_i64(l, n);
    a_dyn(l, &sc->lr);
    a_dyn(l, &sc->beta1);
    a_dyn(l, &sc->beta2);
    a_dyn(l, &sc->eps);
    a_dyn(l, &sc->wd);
    a_dyn(l, &sc->grad_scale);
    a_dyn(l, &sc->adam_step);
    c->x->special = S_ADAMW;
    return 0;
}

typedef int (*kprep)(pctx *c);
/* The builder of each kernel task, by the task the planner gave the step (gen/plan.h's CP_TASKS). */
static const kprep KERNEL_PREP[CP_TASK_COUNT] = {
    [CP_TASK_EMBED] = k_embed,           [CP_TASK_EMBED_BWD] = k_embed_bwd,     [CP_TASK_NORM1] = k_norm_fwd,
    [CP_TASK_NORM2] = k_norm_fwd,        [CP_TASK_FINAL_NORM] = k_norm_fwd,     [CP_TASK_Q_NORM] = k_norm_fwd,
    [CP_TASK_K_NORM] = k_norm_fwd,       [CP_TASK_NORM1_BWD] = k_norm_bwd_resid, [CP_TASK_NORM2_BWD] = k_norm_bwd_resid,
    [CP_TASK_FINAL_NORM_BWD] = k_norm_bwd, [CP_TASK_QK_NORM_BWD] = k_qk_norm_bwd, [CP_TASK_ROPE_Q] = k_rope,
    [CP_TASK_ROPE_K] = k_rope,           [CP_TASK_ROPE_DQ] = k_rope,            [CP_TASK_ROPE_DK] = k_rope,
    [CP_TASK_ATTN_FWD] = k_attn_fwd,     [CP_TASK_ATTN_BWD] = k_attn_bwd,       [CP_TASK_ATTN_BWD_DQ] = k_attn_bwd_dq,
    [CP_TASK_ATTN_FWD_HALF] = k_attn_fwd_half, [CP_TASK_ATTN_BWD_HALF] = k_attn_bwd_half,
    [CP_TASK_ATTN_MERGE_INIT] = k_attn_merge, [CP_TASK_ATTN_MERGE] = k_attn_merge, [CP_TASK_CAST_O] = k_cast,
    [CP_TASK_RING_ADD_DQ] = k_ring_add,  [CP_TASK_RING_ADD_DKV] = k_ring_add,   [CP_TASK_UNPACK_O] = k_unpack,
    [CP_TASK_PACK_DO] = k_pack,          [CP_TASK_PACK_DELTA] = k_pack,         [CP_TASK_PACK_Q] = k_pack,
    [CP_TASK_PACK_K] = k_pack,           [CP_TASK_PACK_V] = k_pack,             [CP_TASK_UNPACK_DQ] = k_unpack,
    [CP_TASK_UNPACK_DK] = k_unpack,      [CP_TASK_UNPACK_DV] = k_unpack,        [CP_TASK_GRAD_ACCUM] = k_grad_accum,
    [CP_TASK_SWIGLU] = k_swiglu,         [CP_TASK_SWIGLU_BWD] = k_swiglu_bwd,   [CP_TASK_LOSS] = k_loss,
    [CP_TASK_LOSS_SUM] = k_loss_sum,     [CP_TASK_ATTN_DELTA] = k_attn_delta,   [CP_TASK_CAST_DK] = k_cast,
    [CP_TASK_CAST_DV] = k_cast,          [CP_TASK_GRAD_NORM] = k_grad_norm,     [CP_TASK_ADAMW] = k_adamw,
    [CP_TASK_FP8_AMAX] = k_fp8_amax,     [CP_TASK_FP8_CAST] = k_fp8_cast,
    [CP_TASK_FP8_CAST_BLOCK] = k_fp8_cast_block,
};

bool cp_exec_prepares(cp_task t) {
    return t == CP_TASK_ADAMW_HOST || t == CP_TASK_LOAD_TOKENS || (t > CP_TASK_NONE && t < CP_TASK_COUNT && KERNEL_PREP[t]);
}

/* A block-scaled FP8 GEMM on the generator's kernel (the step's module: train.fp8_gemm), a kernel launch like any
 * other: sm90(tensor maps of A, B and their scales, B's tile scales, C, D, m, ldd), the maps encoded once for these
 * addresses and owned by the launch. The kernel is Hopper's alone. */
static int prep_gemm_kernel(pctx *c) {
    const cp_gemm *g = &c->s->gemm;
    xstep *x = c->x;
    if (!c->ex->dry && !cp_k_sm90a(c->ex->o.arch))
        return pfail(c, "the generator's FP8 GEMM kernel runs on Hopper (sm_90a) only, and this is %s: set "
                        "train.fp8_gemm = \"cublaslt\"", c->ex->o.arch);
    x->kind = X_KERNEL;
    xlaunch *l = &x->L[0];
    if (launch_of(c, "sm90", g->m, 0, l)) return -1;
    cp_gemm_fp8_args a;
    char e[1024];
    if (c->ex->dry) { /* no driver to encode with, nothing launched */
        memset(&a, 0, sizeof a);
    } else if (cp_gemm_fp8_args_make(&a, g, kspec(c), x->ga, x->gb, x->gc, x->gd, x->gsa, x->gsb, e, sizeof e)) {
        return pfail(c, "%s", e);
    }
    l->tmaps = aligned_alloc(_Alignof(cp_tmap), 4 * sizeof(cp_tmap));
    if (!l->tmaps) return pfail(c, "out of host memory for tensor maps");
    const cp_tmap *maps[4] = {&a.a, &a.b, &a.sa, &a.sb};
    for (int j = 0; j < 4; j++) {
        l->tmaps[j] = *maps[j];
        l->args[l->nargs++] = &l->tmaps[j];
    }
    a_ptr(l, g->b_scale == CP_GEMM_SCALE_2D ? x->gsb : NULL);
    a_ptr(l, x->gc);
    a_ptr(l, x->gd);
    a_i64(l, g->m);
    a_i64(l, g->ldd);
    return 0;
}

/* GEMM: operands A, B, (C), D with the plan's cp_gemm, then with FP8 inputs their scales (one f32 each, or their
 * blocks'); every operand must hold the rows its leading dimension implies. On cuBLASLt, or where the step has a
 * module on the generator's kernel (prep_gemm_kernel). */
static int prep_gemm(pctx *c) {
    const cp_gemm *g = &c->s->gemm;
    bool fp8 = g->a_type != CP_GEMM_BF16;
    int n = 3 + (g->has_c ? 1 : 0), nd = n - 1; /* A, B, (C), D, then with FP8 inputs A's and B's scales */
    if (need_ops(c, n + (fp8 ? 2 : 0))) return -1;
    int64_t ar = g->trans_a ? g->k : g->m, ac = g->trans_a ? g->m : g->k;
    int64_t br = g->trans_b ? g->n : g->k, bc = g->trans_b ? g->k : g->n;
    int64_t esz = g->out_f32 ? 4 : 2, isz = fp8 ? 1 : 2;
    if (need_bytes(c, 0, ((ar - 1) * g->lda + ac) * isz) || need_bytes(c, 1, ((br - 1) * g->ldb + bc) * isz) ||
        need_bytes(c, nd, ((g->m - 1) * g->ldd + g->n) * esz) ||
        (g->has_c && need_bytes(c, 2, ((g->m - 1) * g->ldd + g->n) * 2)))
        return -1;
    int64_t sa = cp_fp8_scales(g->a_scale, g->m, g->k), sb = cp_fp8_scales(g->b_scale, g->n, g->k);
    if (fp8 && (need_bytes(c, n, sa * 4) || need_bytes(c, n + 1, sb * 4) || need_align(c, n, 16) ||
                need_align(c, n + 1, 16)))
        return -1;
    xstep *x = c->x;
    x->ga = opp(c, 0);
    x->gb = opp(c, 1);
    x->gc = g->has_c ? opp(c, 2) : NULL;
    x->gd = opp(c, nd);
    x->gsa = fp8 ? (const float *)opp(c, n) : NULL;
    x->gsb = fp8 ? (const float *)opp(c, n + 1) : NULL;
    if (c->s->module >= 0) return prep_gemm_kernel(c);
    if (c->ex->dry) return 0;
    x->gemm = cp_gemm_prepare(c->ex->gemm, g, c->s->what, x->ga, x->gb, x->gc, x->gd, c->err, c->errlen);
    return x->gemm < 0 ? -1 : 0;
}

/* The plan's collectives (gen/plan.c says what each moves), over the C ranks of the Ulysses group unless said:
 *   all-to-all      operands send (C equal blocks, one per rank), recv: bytes, moved as bytes
 *   all-gather      operands this rank's shard of a unit (bf16), the gathered unit: the shards in rank order
 *   reduce-scatter  operands the unit's full fp32 gradients, this rank's shard: summed over the ranks
 *   all-reduce      operand the loss sum and the gradient's sum of squares (fp32), or a gradient shard summed across
 *                   the groups (the shard's communicator), in place
 *   send/recv       operands what goes to the ring's next rank, what arrives from its previous one: bytes, each way
 *                   (the ring's communicator) */
static int prep_collective(pctx *c) {
    const cp_plan *P = c->ex->P;
    const cp_step *s = c->s;
    xstep *x = c->x;
    int64_t C = P->C;
    x->kind = X_COLL;
    /* the ranks of the step's communicator, and what may run over it: the Ulysses group's carries everything but a
     * ring's send/recvs, the ring's those alone, and the shard's and the run's all-reduces */
    int64_t groups = (int64_t)P->replicas * P->ring, ranks = s->comm == CP_COMM_SHARD ? groups
                                                          : s->comm == CP_COMM_WORLD ? groups * C
                                                          : s->comm == CP_COMM_RING ? P->ring
                                                          : s->comm == CP_COMM_ULYSSES ? C : 0;
    if (!ranks) return pfail(c, "a collective over the %s communicator, which this runtime does not make",
                             cp_comm_kind_name(s->comm));
    if (ranks < 2) return pfail(c, "a collective over a %s communicator of one rank", cp_comm_kind_name(s->comm));
    bool sendrecv = s->kind == CP_OP_SENDRECV;
    if (s->comm == CP_COMM_ULYSSES ? sendrecv : s->comm == CP_COMM_RING ? !sendrecv : s->kind != CP_OP_ALLREDUCE)
        return pfail(c, "a %s over the %s communicator: send/recvs go over the ring's, and only all-reduces over the "
                     "shard's or the run's", cp_opkind_name(s->kind), cp_comm_kind_name(s->comm));
    switch (s->kind) {
    case CP_OP_ALLTOALL:
        if (need_ops(c, 2) || need_bytes(c, 0, s->count) || need_bytes(c, 1, s->count)) return -1;
        if (s->count % C) return pfail(c, "an all-to-all of %lld bytes does not split into %lld blocks",
                                       (long long)s->count, (long long)C);
        x->src = opp(c, 0), x->dst = opp(c, 1);
        x->count = (size_t)(s->count / C);
        x->dtype = ncclUint8;
        return 0;
    case CP_OP_ALLGATHER:
        if (need_ops(c, 2)) return -1;
        if (opbytes(c, 0) * C != s->count || opbytes(c, 1) < s->count || opbytes(c, 0) % 2)
            return pfail(c, "gathering %lld-byte shards into %lld of %lld bytes", (long long)opbytes(c, 0),
                         (long long)s->count, (long long)opbytes(c, 1));
        x->src = opp(c, 0), x->dst = opp(c, 1);
        x->count = (size_t)(opbytes(c, 0) / 2);
        x->dtype = ncclBfloat16;
        return 0;
    case CP_OP_REDUCE_SCATTER:
        if (need_ops(c, 2)) return -1;
        if (opbytes(c, 1) * C != s->count || opbytes(c, 0) < s->count || opbytes(c, 1) % 4)
            return pfail(c, "reduce-scattering %lld of %lld bytes into %lld-byte shards", (long long)s->count,
                         (long long)opbytes(c, 0), (long long)opbytes(c, 1));
        x->src = opp(c, 0), x->dst = opp(c, 1);
        x->count = (size_t)(opbytes(c, 1) / 4);
        x->dtype = ncclFloat32;
        return 0;
    case CP_OP_ALLREDUCE:
        if (need_ops(c, 1) || need_bytes(c, 0, s->count) || s->count % 4) return -1;
        x->src = x->dst = opp(c, 0);
        x->count = (size_t)(s->count / 4);
        x->dtype = ncclFloat32;
        return 0;
    case CP_OP_SENDRECV:
        if (need_ops(c, 2) || need_bytes(c, 0, s->count) || need_bytes(c, 1, s->count)) return -1;
        if (c->ex->ring_to < 0 || c->ex->ring_from < 0)
            return pfail(c, "a send/recv, but this rank has no ring neighbours (ring position %d of %d)",
                         c->ex->ring_pos, P->ring);
        x->src = opp(c, 0), x->dst = opp(c, 1);
        x->count = (size_t)s->count;
        x->dtype = ncclUint8;
        x->to = c->ex->ring_to;
        x->from = c->ex->ring_from;
        return 0;
    default:
        return pfail(c, "not a collective");
    }
}

int exec_prep_step(cp_exec *ex, int i, char *err, int errlen) {
    const cp_plan *P = ex->P;
    const cp_step *s = &P->steps[i];
    xstep *x = &ex->x[i];
    memset(x, 0, sizeof *x);
    x->event = x->marker = -1;
    x->to = x->from = -1;
    x->gemm = -1;
    x->stream = s->stream;
    pctx c = {.ex = ex, .i = i, .s = s, .x = x, .err = err, .errlen = errlen};
    for (int j = 0; j < s->nops; j++) {
        char *b = ex->bufptr[s->ops[j].buf];
        c.p[j] = b ? b + s->ops[j].offset : NULL;
        c.n[j] = s->ops[j].bytes;
    }
    switch (s->kind) {
    case CP_OP_KERNEL:
        if (s->module < 0) {
            if (s->task != CP_TASK_ADAMW_HOST) return pfail(&c, "a host step this runtime does not know");
            /* grads (GPU), gradient ring (host), master, m, v, parameter ring (host), params (GPU) */
            int64_t n = P->params_shard, ch = P->host_chunk;
            if (need_ops(&c, 7) || need_bytes(&c, 0, n * 4) || need_bytes(&c, 1, 2 * ch * 4) ||
                need_bytes(&c, 2, n * 4) || need_bytes(&c, 3, n * 4) || need_bytes(&c, 4, n * 4) ||
                need_bytes(&c, 5, 2 * ch * 2) || need_bytes(&c, 6, n * 2))
                return -1;
            if (ch < 1) return pfail(&c, "the plan has no host chunk size");
            x->kind = X_HOST_ADAMW;
            return 0;
        }
        x->kind = X_KERNEL;
        if (s->task > CP_TASK_NONE && s->task < CP_TASK_COUNT && KERNEL_PREP[s->task]) {
            if (KERNEL_PREP[s->task](&c)) return -1;
            if (c.fp8_taken != (1u << s->nfp8_out) - 1)
                return pfail(&c, "%d FP8 output%s (amax or copy), which this kernel does not take", s->nfp8_out,
                             s->nfp8_out == 1 ? "" : "s");
            for (int j = 0; j < s->nfp8_out; j++)
                if (s->fp8_out[j].copy_only != ((c.fp8_alone >> j) & 1))
                    return pfail(&c, "FP8 copy %d: its output %s, which this kernel %s", j,
                                 s->fp8_out[j].copy_only ? "left unwritten" : "written",
                                 s->fp8_out[j].copy_only ? "always writes" : "was not given");
            return 0;
        }
        return pfail(&c, "a kernel step this runtime does not know (task %d, module %s, role %s)", (int)s->task,
                     P->modules[s->module].family, s->role);
    case CP_OP_GEMM:
        x->kind = X_GEMM;
        return prep_gemm(&c);
    case CP_OP_MEMSET:
        if (need_ops(&c, 1)) return -1;
        x->kind = X_MEMSET;
        x->dst = opp(&c, 0);
        x->bytes = (size_t)opbytes(&c, 0);
        if (s->count != opbytes(&c, 0)) return pfail(&c, "memset of %lld bytes on an operand of %lld",
                                                     (long long)s->count, (long long)opbytes(&c, 0));
        return 0;
    case CP_OP_COPY_H2D:
    case CP_OP_COPY_D2H:
        if (s->task == CP_TASK_LOAD_TOKENS) {
            /* tokens, targets, token_order; packed documents' positions, doc_start, doc_end: each whole, from the
             * staging's parts in this order (cp_plan_input_ints) */
            int64_t want[6] = {P->T, P->T, P->T}, total = 0;
            int n = 3;
            if (P->doc_positions) want[n++] = P->T;
            if (P->docs) want[n++] = P->S, want[n++] = P->S;
            if (need_ops(&c, n)) return -1;
            for (int j = 0; j < n; j++) {
                if (opbytes(&c, j) != want[j] * 4 || opbytes(&c, j) != opbuf(&c, j)->bytes)
                    return pfail(&c, "operand %d (%s) has %lld bytes, the inputs' part %lld", j, opbuf(&c, j)->name,
                                 (long long)opbytes(&c, j), (long long)want[j] * 4);
                total += want[j];
            }
            if (total != cp_plan_input_ints(P))
                return pfail(&c, "the inputs hold %lld ints, the staging %lld", (long long)total,
                             (long long)cp_plan_input_ints(P));
            x->kind = X_LOAD_TOKENS;
            return 0;
        }
        if (need_ops(&c, 2)) return -1;
        x->kind = X_COPY;
        x->src = opp(&c, 0);
        x->dst = opp(&c, 1);
        x->bytes = (size_t)opbytes(&c, 1);
        if (opbytes(&c, 0) != opbytes(&c, 1))
            return pfail(&c, "a copy of %lld bytes into %lld", (long long)opbytes(&c, 0), (long long)opbytes(&c, 1));
        return 0;
    case CP_OP_ALLTOALL:
    case CP_OP_ALLGATHER:
    case CP_OP_REDUCE_SCATTER:
    case CP_OP_ALLREDUCE:
    case CP_OP_SENDRECV:
        return prep_collective(&c);
    default:
        return pfail(&c, "a step kind this runtime does not know");
    }
}
