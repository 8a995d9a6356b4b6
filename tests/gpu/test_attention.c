/* test_attention.c: the attention kernels (templates/attention.cu) against the float64 reference
 * (tests/ref/ref_attention.c) on fresh random inputs, over sequence lengths that are and are not multiples of the
 * tiles, GQA ratios 1, 3 and 4, head_dim 64 and 128, causal and full, dK/dV written and accumulated. On Hopper both
 * forwards and both backwards are checked: the wgmma ones the runtime uses (fwd_sm90, whose lse the backwards then
 * take; bwd_sm90, which the determinism test runs) and the mma.sync ones of sm_80 and sm_89. Outputs are
 * poisoned with NaN first (the fp32 dQ workspace too: the backward must write all of it); relative error in norm
 * must be at most 1e-2 for the bf16 outputs.
 * Determinism: the backward runs several times on the same inputs, its outputs (and the whole workspace) poisoned
 * before each run, and dq, dk, dv must be the same bits every time: at causal GQA shapes with several key blocks
 * (S = 1000 and 4097), and at longer ones whose key blocks do not all fit on the GPU at once (so blocks wait for
 * key blocks dispatched in an earlier wave), causal and full.
 *
 * Document masks (DOCS, templates/attention.cu): packed layouts (1-token documents, documents ending on the tiles'
 * edges, crossing many tiles, random, one document), a ring's off-diagonal block whose rows that keep no key must
 * give o = 0, dq = 0 and lse = -inf exactly, and a ring's step-0 diagonal chunk (causal, queries and keys at the
 * sequence's second half, LSE rows 2S apart, dK and dV accumulated in fp32); the mma.sync kernels are checked first, on Hopper then the wgmma ones;
 * with one document the mma.sync kernels must give the bits of the module without documents; the backward repeats
 * with documents give the same bits. `test_attention --docs` runs only these.
 *
 * `test_attention --dump DIR S QH KVH D CAUSAL` instead runs one shape once and writes its inputs and outputs as raw
 * files into DIR, for tests/gpu/attention_sdpa.py to compare with PyTorch. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "attn_util.h"
#include "gpu_util.h"
#include "ref/bf16.h"
#include "ref/ref_attention.h"
#include "util.h"

static const attn_shape SHAPES[] = {
    {1, 64, 1, 1, true, false, false, false},       {1, 128, 4, 1, false, false, false, false},
    {100, 128, 3, 1, true, false, false, false},    {100, 64, 2, 2, false, true, false, false},
    {1000, 64, 4, 1, true, false, false, false},    {1000, 128, 3, 1, false, false, false, false},
    {1000, 128, 4, 4, true, true, false, false},    {256, 128, 8, 2, true, false, false, false},
    {4097, 128, 4, 1, true, false, false, false},   {4097, 64, 3, 1, false, false, false, false},
    {4097, 128, 2, 2, true, true, false, false},    {2048, 64, 4, 4, true, false, false, false},
    {256, 64, 3, 3, false, false, false, false},    {2048, 128, 3, 1, false, false, false, false},
    {32768, 128, 1, 1, true, false, false, false},
    /* dQ summed by atomic adds (train.deterministic = false) */
    {4097, 128, 4, 1, true, false, true, false},  {1000, 128, 3, 1, false, true, true, false},
    {2048, 64, 4, 4, true, false, true, false},
};
#define NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))
/* LSE rows further apart than the module's tokens: twice, as a ring's half-block launches take them, and one causal
 * module at 1.5 times */
static const struct {
    attn_shape sh;
    int64_t lse_stride;
} SSHAPES[] = {
    {{1000, 128, 3, 1, false, true, false, false}, 2000},
    {{2049, 64, 4, 2, false, true, false, false}, 4098},
    {{1000, 128, 2, 2, true, false, false, false}, 1500},
};
#define NSSHAPES ((int)(sizeof SSHAPES / sizeof SSHAPES[0]))
#define BOUND 1e-2

/* determinism only (no reference: too long for the CPU) */
static const attn_shape DSHAPES[] = {
    {32768, 128, 4, 1, true, false, false, false}, /* 256 key blocks of one KV head, causal */
    {20000, 128, 2, 1, false, true, false, false}, /* 157 key blocks, every one adding to every query block */
    {16384, 64, 8, 2, true, true, false, false},   /* 2 KV heads of 128 key blocks */
};
#define NDSHAPES ((int)(sizeof DSHAPES / sizeof DSHAPES[0]))
/* the shapes the determinism test runs: indices into SHAPES, then every DSHAPES */
static const int REPEAT[] = {4, 5, 8, 10, 6};
#define NREPEAT ((int)(sizeof REPEAT / sizeof REPEAT[0]))
#define REPEAT_RUNS 3

static attn_mod mods[NSHAPES + NDSHAPES + NSSHAPES];
static uint64_t seed = 1;

/* ---- the reference on all cores: rows in chunks, round robin; private dk, dv summed afterwards ---- */

typedef struct {
    const ref_attn_shape *sh;
    const double *q, *k, *v, *dout;
    double *o, *lse, *dq, *dk, *dv; /* dk, dv: this worker's own */
    int id, nthreads;
} ref_job;

#define REF_CHUNK 32

static void *ref_worker(void *arg) {
    ref_job *j = arg;
    for (int64_t r = (int64_t)j->id * REF_CHUNK; r < j->sh->seq; r += (int64_t)j->nthreads * REF_CHUNK) {
        int64_t r1 = CP_MIN(r + REF_CHUNK, j->sh->seq);
        ref_attention_fwd(j->sh, j->q, j->k, j->v, j->o, j->lse, 0, j->sh->q_heads, r, r1);
        ref_attention_bwd(j->sh, j->q, j->k, j->v, j->dout, j->dq, j->dk, j->dv, 0, j->sh->q_heads, r, r1);
    }
    return NULL;
}

static void reference(const ref_attn_shape *sh, const double *q, const double *k, const double *v,
                      const double *dout, double *o, double *lse, double *dq, double *dk, double *dv) {
    int nt = 16;
    int64_t nkv = sh->seq * sh->kv_heads * sh->head_dim;
    pthread_t th[16];
    ref_job jobs[16];
    for (int i = 0; i < nt; i++) {
        jobs[i] = (ref_job){sh, q, k, v, dout, o, lse, dq, calloc((size_t)nkv, sizeof(double)),
                            calloc((size_t)nkv, sizeof(double)), i, nt};
        pthread_create(&th[i], NULL, ref_worker, &jobs[i]);
    }
    memset(dk, 0, sizeof(double) * (size_t)nkv);
    memset(dv, 0, sizeof(double) * (size_t)nkv);
    for (int i = 0; i < nt; i++) {
        pthread_join(th[i], NULL);
        for (int64_t x = 0; x < nkv; x++) dk[x] += jobs[i].dk[x], dv[x] += jobs[i].dv[x];
        free(jobs[i].dk);
        free(jobs[i].dv);
    }
}

/* ||out - ref|| / ||ref||, NaN if out has a NaN */
static double rel_bf16(const uint16_t *out, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double o = bf16_to_f32(out[i]);
        if (isnan(o)) return NAN;
        num += (o - ref[i]) * (o - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}
static double rel_f32(const float *out, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(out[i])) return NAN;
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* rel_f32 of an LSE over the rows whose reference is finite; a row whose reference is -inf (it keeps no key: document
 * masks) must be -inf exactly, else the error is infinite */
static double rel_lse(const float *out, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(out[i])) return NAN;
        if (isinf(ref[i])) {
            if (!(isinf(out[i]) && out[i] < 0)) return INFINITY;
            continue;
        }
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static double *to_f64(const uint16_t *x, int64_t n) {
    double *d = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) d[i] = bf16_to_f32(x[i]);
    return d;
}

/* delta = rowsum(dout * o) over D, [S][QH], from the kernel's own o as the runtime does */
static float *row_delta(const uint16_t *dout, const uint16_t *o, int64_t rows, int64_t D) {
    float *d = malloc(sizeof(float) * (size_t)rows);
    for (int64_t r = 0; r < rows; r++) {
        double s = 0;
        for (int64_t x = 0; x < D; x++) s += (double)bf16_to_f32(dout[r * D + x]) * bf16_to_f32(o[r * D + x]);
        d[r] = (float)s;
    }
    return d;
}

typedef struct {
    int64_t nq, nkv, nlse;
    uint16_t *q, *k, *v, *dout, *o, *dq, *dk16, *dv16;
    float *lse, *delta, *dk32, *dv32, *dk32_init, *dv32_init;
    uint16_t *o_mma; /* on Hopper: the mma.sync forward's o and lse too (the backward uses the Hopper one's) */
    float *lse_mma;
    uint16_t *dq_mma; /* on Hopper: the mma.sync backward's dq, dk, dv too (bf16, or f32 when dkv_accum) */
    void *dk_mma, *dv_mma;
} host_io;

/* The forward's LSE from the device: the S columns of each of the QH rows, which lie LSE_STRIDE apart (span: the
 * host copy of the device's bytes). Between the rows of a strided module the bytes must still hold the poison: no
 * kernel writes there. */
static float *lse_rows(const attn_mod *m, const float *dev, float *span) {
    const attn_shape *s = &m->sh;
    const int64_t ls = attn_lse_stride(m);
    gu_download(span, dev, attn_lse_bytes(m));
    float *rows = malloc(sizeof(float) * (size_t)(s->seq * s->q_heads));
    for (int h = 0; h < s->q_heads; h++) {
        memcpy(rows + h * s->seq, span + h * ls, sizeof(float) * (size_t)s->seq);
        for (int64_t i = s->seq; h + 1 < s->q_heads && i < ls; i++) {
            uint32_t b;
            memcpy(&b, span + h * ls + i, 4);
            if (b != 0xFFFFFFFFu) gu_fail("the forward wrote between LSE rows: head %d, column %lld", h, (long long)i);
        }
    }
    return rows;
}

/* Run fwd then bwd of module m on random inputs from rng_seed; results in io (host). On Hopper both backwards take
 * the Hopper forward's LSE and delta, unless own_lse: then the mma.sync backward takes the mma.sync forward's, so
 * that each path is checked whole (document cases: a fault of one forward is not blamed on the other's backward). */
static void run_shape(attn_mod *m, host_io *io, uint64_t rng_seed, bool own_lse) {
    const attn_shape *s = &m->sh;
    gu_rng rng;
    gu_seed(&rng, rng_seed);
    io->nq = s->seq * s->q_heads * s->head_dim;
    io->nkv = s->seq * s->kv_heads * s->head_dim;
    io->nlse = s->seq * s->q_heads;
    io->q = gu_rand_bf16(&rng, io->nq, 1.0);
    io->k = gu_rand_bf16(&rng, io->nkv, 1.0);
    io->v = gu_rand_bf16(&rng, io->nkv, 1.0);
    io->dout = gu_rand_bf16(&rng, io->nq, 1.0);
    size_t bq = (size_t)io->nq * 2, bkv = (size_t)io->nkv * 2, blse = (size_t)io->nlse * 4;
    size_t bspan = attn_lse_bytes(m); /* the LSE's rows, LSE_STRIDE apart */
    size_t bdkv = s->dkv_accum ? (size_t)io->nkv * 4 : bkv;
    float *mma_span = NULL, *mma_delta = NULL; /* own_lse on Hopper: the mma.sync forward's LSE bytes, and its delta */
    void *q = gu_malloc(bq), *k = gu_malloc(bkv), *v = gu_malloc(bkv), *dout = gu_malloc(bq), *o = gu_malloc(bq),
         *dq = gu_malloc(bq), *dk = gu_malloc(bdkv), *dv = gu_malloc(bdkv);
    float *lse = gu_malloc(bspan), *delta = gu_malloc(blse),
          *ws = gu_malloc((size_t)cp_k_attention_workspace_bytes(&m->spec)), *span = malloc(bspan);
    gu_upload(q, io->q, bq);
    gu_upload(k, io->k, bkv);
    gu_upload(v, io->v, bkv);
    gu_upload(dout, io->dout, bq);
    gu_poison(o, bq);
    gu_poison(lse, bspan);
    attn_fwd(m, q, k, v, o, lse, 0);
    if (cudaDeviceSynchronize() != cudaSuccess) gu_fail("attention fwd failed: %s", cudaGetErrorString(cudaGetLastError()));
    io->o = malloc(bq);
    gu_download(io->o, o, bq);
    io->lse = lse_rows(m, lse, span);
    if (m->hopper) {
        float *hopper_span = malloc(bspan); /* the backward reads the Hopper forward's LSE */
        memcpy(hopper_span, span, bspan);
        gu_poison(o, bq);
        gu_poison(lse, bspan);
        m->use_mma = true;
        attn_fwd(m, q, k, v, o, lse, 0);
        m->use_mma = false;
        if (cudaDeviceSynchronize() != cudaSuccess)
            gu_fail("attention fwd (mma.sync) failed: %s", cudaGetErrorString(cudaGetLastError()));
        io->o_mma = malloc(bq);
        gu_download(io->o_mma, o, bq);
        io->lse_mma = lse_rows(m, lse, span);
        if (own_lse) {
            mma_span = malloc(bspan);
            memcpy(mma_span, span, bspan);
            mma_delta = row_delta(io->dout, io->o_mma, io->nlse, s->head_dim);
        }
        gu_upload(lse, hopper_span, bspan);
        free(hopper_span);
    }

    io->delta = row_delta(io->dout, io->o, io->nlse, s->head_dim);
    gu_upload(delta, io->delta, blse);
    if (s->dkv_accum) {
        io->dk32_init = gu_rand_f32(&rng, io->nkv, 0.5);
        io->dv32_init = gu_rand_f32(&rng, io->nkv, 0.5);
    }
    /* pass 0: the path attn_bwd takes by default; pass 1 (Hopper): the mma.sync backward as well */
    for (int pass = 0; pass < (m->hopper ? 2 : 1); pass++) {
        gu_poison(dq, bq);
        gu_poison(ws, (size_t)cp_k_attention_workspace_bytes(&m->spec));
        if (s->dkv_accum) {
            gu_upload(dk, io->dk32_init, bdkv);
            gu_upload(dv, io->dv32_init, bdkv);
        } else {
            gu_poison(dk, bdkv);
            gu_poison(dv, bdkv);
        }
        m->use_mma = pass == 1;
        if (pass == 1 && mma_span) {
            gu_upload(lse, mma_span, bspan);
            gu_upload(delta, mma_delta, blse);
        }
        attn_bwd(m, q, k, v, dout, lse, delta, ws, dq, dk, dv, 0);
        m->use_mma = false;
        if (cudaDeviceSynchronize() != cudaSuccess)
            gu_fail("attention bwd%s failed: %s", pass ? " (mma.sync)" : "", cudaGetErrorString(cudaGetLastError()));
        uint16_t *hdq = malloc(bq);
        void *hdk = malloc(bdkv), *hdv = malloc(bdkv);
        gu_download(hdq, dq, bq);
        gu_download(hdk, dk, bdkv);
        gu_download(hdv, dv, bdkv);
        if (pass) {
            io->dq_mma = hdq, io->dk_mma = hdk, io->dv_mma = hdv;
        } else {
            io->dq = hdq;
            if (s->dkv_accum)
                io->dk32 = hdk, io->dv32 = hdv;
            else
                io->dk16 = hdk, io->dv16 = hdv;
        }
    }
    free(span), free(mma_span), free(mma_delta);
    void *bufs[] = {q, k, v, dout, o, dq, dk, dv, lse, delta, ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gu_free_dev(bufs[i]);
}

static void free_io(host_io *io) {
    void *p[] = {io->q, io->k, io->v, io->dout, io->o, io->dq, io->dk16, io->dv16, io->lse, io->delta,
                 io->dk32, io->dv32, io->dk32_init, io->dv32_init, io->o_mma, io->lse_mma, io->dq_mma, io->dk_mma,
                 io->dv_mma};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    memset(io, 0, sizeof *io);
}

/* One forward's o (bf16) and lse against the reference. */
static void check_fwd(const char *path, const char *name, const host_io *io, const uint16_t *go, const float *glse,
                      const double *o, const double *lse) {
    char what[96];
    snprintf(what, sizeof what, "%s o", path);
    gu_check(what, name, rel_bf16(go, o, io->nq), BOUND);
    snprintf(what, sizeof what, "%s lse", path);
    gu_check(what, name, rel_lse(glse, lse, io->nlse), 1e-4);
}

/* One backward's dq (bf16) and dk, dv (bf16, or f32 added to the initial values when dkv_accum) against the
 * reference. */
static void check_bwd(const char *path, const char *name, const attn_shape *s, const host_io *io, const uint16_t *gdq,
                      const void *gdk, const void *gdv, const double *dq, const double *dk, const double *dv) {
    char what[96];
    snprintf(what, sizeof what, "%s dq", path);
    gu_check(what, name, rel_bf16(gdq, dq, io->nq), BOUND);
    if (s->dkv_accum) {
        /* the kernel added its gradient to the initial values: compare the difference */
        const float *k32 = gdk, *v32 = gdv;
        float *gk = malloc(sizeof(float) * io->nkv), *gv = malloc(sizeof(float) * io->nkv);
        for (int64_t i = 0; i < io->nkv; i++) gk[i] = k32[i] - io->dk32_init[i], gv[i] = v32[i] - io->dv32_init[i];
        snprintf(what, sizeof what, "%s dk f32+=", path);
        gu_check(what, name, rel_f32(gk, dk, io->nkv), BOUND);
        snprintf(what, sizeof what, "%s dv f32+=", path);
        gu_check(what, name, rel_f32(gv, dv, io->nkv), BOUND);
        free(gk);
        free(gv);
    } else {
        snprintf(what, sizeof what, "%s dk", path);
        gu_check(what, name, rel_bf16(gdk, dk, io->nkv), BOUND);
        snprintf(what, sizeof what, "%s dv", path);
        gu_check(what, name, rel_bf16(gdv, dv, io->nkv), BOUND);
    }
}

static void check_shape(void **state) {
    attn_mod *m = *state;
    const attn_shape *s = &m->sh;
    char name[96];
    attn_shape_str(s, name, sizeof name);
    if (m->lse_stride) snprintf(name + strlen(name), sizeof name - strlen(name), " lse %lld", (long long)m->lse_stride);
    host_io io;
    memset(&io, 0, sizeof io);
    double t0 = cp_now();
    run_shape(m, &io, seed++, false);
    double t1 = cp_now();
    ref_attn_shape rs = {s->seq, s->q_heads, s->kv_heads, s->head_dim, s->causal, 1.0 / sqrt((double)s->head_dim),
                         NULL, NULL, 0, 0};
    double *q = to_f64(io.q, io.nq), *k = to_f64(io.k, io.nkv), *v = to_f64(io.v, io.nkv),
           *dout = to_f64(io.dout, io.nq);
    double *o = malloc(sizeof(double) * io.nq), *lse = malloc(sizeof(double) * io.nlse),
           *dq = malloc(sizeof(double) * io.nq), *dk = malloc(sizeof(double) * io.nkv),
           *dv = malloc(sizeof(double) * io.nkv);
    reference(&rs, q, k, v, dout, o, lse, dq, dk, dv);
    printf("  %s: GPU %.2f s, reference %.2f s\n", name, t1 - t0, cp_now() - t1);
    check_fwd(m->hopper ? "attention fwd_sm90" : "attention fwd", name, &io, io.o, io.lse, o, lse);
    if (io.o_mma) check_fwd("attention fwd (mma.sync)", name, &io, io.o_mma, io.lse_mma, o, lse);
    const char *bpath = m->hopper ? "attention bwd_sm90" : "attention bwd";
    check_bwd(bpath, name, s, &io, io.dq, s->dkv_accum ? (void *)io.dk32 : io.dk16,
              s->dkv_accum ? (void *)io.dv32 : io.dv16, dq, dk, dv);
    if (io.dq_mma) check_bwd("attention bwd (mma.sync)", name, s, &io, io.dq_mma, io.dk_mma, io.dv_mma, dq, dk, dv);
    free(q), free(k), free(v), free(dout), free(o), free(lse), free(dq), free(dk), free(dv);
    free_io(&io);
}

/* The backward REPEAT_RUNS times on the same inputs and the same device buffers, every output and the whole dQ
 * workspace poisoned (dk, dv reset to their initial values when accumulated) before each run: dq, dk and dv must be
 * the same bits every time (the dQ sums are ordered, nothing else is summed across blocks). The forward twice must
 * agree as well. */
static void repeatable(attn_mod *m, bool use_mma) {
    const attn_shape *s = &m->sh;
    char name[128];
    attn_shape_str(s, name, sizeof name);
    if (use_mma) snprintf(name + strlen(name), sizeof name - strlen(name), " (mma.sync)");
    m->use_mma = use_mma;
    gu_rng rng;
    gu_seed(&rng, seed++);
    const int64_t nq = s->seq * s->q_heads * s->head_dim, nkv = s->seq * s->kv_heads * s->head_dim,
                  nlse = s->seq * s->q_heads;
    uint16_t *hq = gu_rand_bf16(&rng, nq, 1.0), *hk = gu_rand_bf16(&rng, nkv, 1.0), *hv = gu_rand_bf16(&rng, nkv, 1.0),
             *hdo = gu_rand_bf16(&rng, nq, 1.0);
    const size_t bq = (size_t)nq * 2, bkv = (size_t)nkv * 2, blse = (size_t)nlse * 4,
                 bdkv = s->dkv_accum ? (size_t)nkv * 4 : bkv, bws = (size_t)cp_k_attention_workspace_bytes(&m->spec);
    float *dk0 = s->dkv_accum ? gu_rand_f32(&rng, nkv, 0.5) : NULL, *dv0 = s->dkv_accum ? gu_rand_f32(&rng, nkv, 0.5) : NULL;
    void *q = gu_malloc(bq), *k = gu_malloc(bkv), *v = gu_malloc(bkv), *dout = gu_malloc(bq), *o = gu_malloc(bq),
         *dq = gu_malloc(bq), *dk = gu_malloc(bdkv), *dv = gu_malloc(bdkv);
    float *lse = gu_malloc(blse), *delta = gu_malloc(blse), *ws = gu_malloc(bws);
    gu_upload(q, hq, bq);
    gu_upload(k, hk, bkv);
    gu_upload(v, hv, bkv);
    gu_upload(dout, hdo, bq);
    uint16_t *o_run[2] = {malloc(bq), malloc(bq)};
    for (int r = 0; r < 2; r++) {
        gu_poison(o, bq);
        gu_poison(lse, blse);
        attn_fwd(m, q, k, v, o, lse, 0);
        if (cudaDeviceSynchronize() != cudaSuccess) gu_fail("attention fwd failed: %s", cudaGetErrorString(cudaGetLastError()));
        gu_download(o_run[r], o, bq);
    }
    assert_memory_equal(o_run[0], o_run[1], bq);
    float *hdelta = row_delta(hdo, o_run[0], nlse, s->head_dim);
    gu_upload(delta, hdelta, blse);
    void *first[3] = {malloc(bq), malloc(bdkv), malloc(bdkv)}, *again[3] = {malloc(bq), malloc(bdkv), malloc(bdkv)};
    const size_t sizes[3] = {bq, bdkv, bdkv};
    const char *what[3] = {"dq", "dk", "dv"};
    double t0 = cp_now();
    for (int r = 0; r < REPEAT_RUNS; r++) {
        gu_poison(dq, bq);
        gu_poison(ws, bws);
        if (s->dkv_accum) {
            gu_upload(dk, dk0, bdkv);
            gu_upload(dv, dv0, bdkv);
        } else {
            gu_poison(dk, bdkv);
            gu_poison(dv, bdkv);
        }
        attn_bwd(m, q, k, v, dout, lse, delta, ws, dq, dk, dv, 0);
        if (cudaDeviceSynchronize() != cudaSuccess) gu_fail("attention bwd failed: %s", cudaGetErrorString(cudaGetLastError()));
        void **out = r ? again : first;
        gu_download(out[0], dq, bq);
        gu_download(out[1], dk, bdkv);
        gu_download(out[2], dv, bdkv);
        if (r == 0) {
            /* every value written (no NaN from the poison), so that "equal" means something */
            int64_t nan = gu_nan_bf16(first[0], nq) +
                          (s->dkv_accum ? gu_nan_f32(first[1], nkv) + gu_nan_f32(first[2], nkv)
                                        : gu_nan_bf16(first[1], nkv) + gu_nan_bf16(first[2], nkv));
            if (nan) gu_fail("%s: %lld NaN in dq, dk, dv", name, (long long)nan);
            continue;
        }
        for (int j = 0; j < 3; j++)
            if (memcmp(first[j], again[j], sizes[j])) {
                int64_t differ = 0;
                for (size_t b = 0; b < sizes[j] / 2; b++)
                    differ += ((const uint16_t *)first[j])[b] != ((const uint16_t *)again[j])[b];
                gu_fail("%s: run %d's %s differs from run 1's in %lld of %zu 16-bit words: not deterministic", name,
                        r + 1, what[j], (long long)differ, sizes[j] / 2);
            }
    }
    m->use_mma = false;
    printf("  %s: dq, dk, dv the same bits in %d runs (%.2f s)\n", name, REPEAT_RUNS, cp_now() - t0);
    gu_check("attention bwd repeat", name, 0.0, 0.0);
    for (int j = 0; j < 3; j++) free(first[j]), free(again[j]);
    free(o_run[0]), free(o_run[1]), free(hq), free(hk), free(hv), free(hdo), free(hdelta), free(dk0), free(dv0);
    void *bufs[] = {q, k, v, dout, o, dq, dk, dv, lse, delta, ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gu_free_dev(bufs[i]);
}

static void check_repeatable(void **state) { repeatable(*state, false); }

/* ---- document masks (templates/attention.cu, "Document masks") ---- */

/* How the documents lie over the T positions of the sequence */
typedef enum {
    DL_ONE,    /* one document: the mma.sync kernels must give the bits of the module without documents */
    DL_SHORT,  /* 1-token documents among short ones (up to 90 tokens) */
    DL_SINGLE, /* every document of 1 token: each query keeps only its own key */
    DL_EDGES,  /* documents ending exactly on multiples of 64 and 128, the edges of the tiles */
    DL_LONG,   /* documents crossing many tiles, with one of 1 and one of 3 tokens among them */
    DL_MIXED,  /* random lengths from 1 to 400, one in eight of 1 token */
    DL_RING,   /* over 2S: 0.3 S, 0.8 S (crossing S), 5, the rest; of the queries at S.. only the first 0.1 S keep a key */
} doc_layout;
static const char *const DL_NAMES[] = {"one document", "short documents",  "1-token documents",
                                       "documents ending on tile edges", "long documents", "random documents",
                                       "documents crossing the halves"};

typedef struct {
    attn_shape sh; /* with docs */
    doc_layout layout;
    bool ring; /* queries at positions S.. and keys at 0.. of 2S tokens, not causal: a ring's off-diagonal block */
    bool diag; /* queries and keys both at positions S.. of 2S tokens, causal, LSE rows 2S apart: with documents a
                * ring's step 0 on its second chunk (gen/ring.h), a causal launch at positions other than 0 */
} doc_case;

static const doc_case DOC_CASES[] = {
    {{1000, 64, 4, 1, true, false, false, true}, DL_SHORT, false, false},
    {{1000, 128, 2, 2, true, true, false, true}, DL_EDGES, false, false},
    {{4097, 128, 4, 1, true, false, false, true}, DL_LONG, false, false},
    {{2048, 64, 4, 4, true, false, false, true}, DL_MIXED, false, false},
    {{300, 64, 4, 1, true, false, false, true}, DL_SINGLE, false, false},
    {{1000, 128, 4, 1, true, false, false, true}, DL_ONE, false, false},
    {{2048, 128, 4, 1, true, false, true, true}, DL_MIXED, false, false}, /* dQ summed by atomic adds on Hopper */
    {{1000, 128, 4, 1, false, false, false, true}, DL_RING, true, false},
    {{1000, 64, 2, 2, false, true, false, true}, DL_SHORT, true, false},
    {{4097, 128, 4, 4, false, false, false, true}, DL_MIXED, true, false},
    {{1000, 128, 4, 1, true, true, false, true}, DL_RING, false, true},
    {{1024, 64, 2, 1, true, true, false, true}, DL_SHORT, false, true},
};
#define NDOC ((int)(sizeof DOC_CASES / sizeof DOC_CASES[0]))
/* determinism with documents: indices into DOC_CASES, then every DOC_DCASES (no reference: too long for the CPU) */
static const int DOC_REPEAT[] = {2, 7};
#define NDOC_REPEAT ((int)(sizeof DOC_REPEAT / sizeof DOC_REPEAT[0]))
static const doc_case DOC_DCASES[] = {
    {{16384, 128, 8, 2, true, false, false, true}, DL_MIXED, false, false}, /* 2 KV heads of 128 key blocks */
};
#define NDOC_D ((int)(sizeof DOC_DCASES / sizeof DOC_DCASES[0]))

typedef struct {
    attn_mod *m;
    const doc_case *c;
    attn_mod *plain; /* DL_ONE: the same shape without documents, for the bit comparison */
} doc_state;

static const char *doc_case_str(const doc_case *c, char *buf, int n) {
    char sh[96];
    attn_shape_str(&c->sh, sh, sizeof sh);
    snprintf(buf, (size_t)n, "%s, %s%s", sh, DL_NAMES[c->layout],
             c->ring   ? ", queries at S.., keys at 0.."
             : c->diag ? ", queries and keys at S.., LSE rows 2S apart"
                       : "");
    return buf;
}

/* doc_start, doc_end over T positions in the layout l (S: the module's tokens, for DL_RING's proportions) */
static void make_docs(doc_layout l, int64_t T, int64_t S, uint64_t rseed, int *start, int *end) {
    static const int short_len[] = {1, 1, 3, 1, 17, 1, 40, 2, 90, 1}, edge_len[] = {64, 64, 128, 192, 64, 256, 128},
                     long_len[] = {1, 700, 1500, 3, 1100};
    gu_rng r;
    gu_seed(&r, rseed);
    int64_t a = 0;
    for (int d = 0; a < T; d++) {
        int64_t n;
        switch (l) {
        case DL_ONE: n = T; break;
        case DL_SHORT: n = short_len[d % 10]; break;
        case DL_SINGLE: n = 1; break;
        case DL_EDGES: n = edge_len[d % 7]; break;
        case DL_LONG: n = d < 5 ? long_len[d] : 2000; break;
        case DL_MIXED: n = gu_next(&r) % 8 == 0 ? 1 : 1 + (int64_t)(gu_next(&r) % 400); break;
        default: n = d == 0 ? 3 * S / 10 : d == 1 ? 8 * S / 10 : d == 2 ? 5 : T; break;
        }
        n = CP_MIN(n, T - a);
        for (int64_t i = a; i < a + n; i++) start[i] = (int)a, end[i] = (int)(a + n);
        a += n;
    }
}

/* The case's documents on the device, and the module's launch arguments for them; returns the host copy (doc_start
 * then doc_end, T each), *dev the device one. */
static int *docs_setup(attn_mod *m, const doc_case *c, void **dev) {
    const int64_t S = m->sh.seq, T = c->ring || c->diag ? 2 * S : S;
    int *h = malloc(sizeof(int) * (size_t)(2 * T));
    make_docs(c->layout, T, S, seed++, h, h + T);
    *dev = gu_malloc(sizeof(int) * (size_t)(2 * T));
    gu_upload(*dev, h, sizeof(int) * (size_t)(2 * T));
    m->doc_start = *dev, m->doc_end = (const int *)*dev + T;
    m->q_pos = c->ring || c->diag ? (int)S : 0, m->k_pos = c->diag ? (int)S : 0;
    return h;
}

static void docs_release(attn_mod *m, int *h, void *dev) {
    free(h);
    gu_free_dev(dev);
    m->doc_start = m->doc_end = NULL;
    m->q_pos = m->k_pos = 0;
}

/* Rows that keep no key (the reference's lse is -inf, which rel_lse holds the kernel's to): o and dq exactly 0
 * there. Returns how many such rows there are. */
static int64_t check_empty_rows(const char *path, const char *name, const attn_shape *s, const uint16_t *go,
                                const uint16_t *gdq, const double *lse) {
    int64_t rows = 0, bad = 0;
    for (int h = 0; h < s->q_heads; h++)
        for (int64_t i = 0; i < s->seq; i++) {
            if (!isinf(lse[h * s->seq + i])) continue;
            rows++;
            for (int64_t d = 0; d < s->head_dim; d++) {
                const int64_t x = (i * s->q_heads + h) * s->head_dim + d;
                bad += bf16_to_f32(go[x]) != 0.0f || bf16_to_f32(gdq[x]) != 0.0f;
            }
        }
    if (rows) {
        char what[96];
        snprintf(what, sizeof what, "%s o, dq = 0", path);
        if (bad) gu_fail("%s %s: %lld values of o or dq are not 0 in the %lld rows that keep no key", what, name,
                         (long long)bad, (long long)rows);
        gu_check(what, name, 0.0, 0.0);
    }
    return rows;
}

/* Bytes of the two results that differ, as 16-bit words; prints the first. */
static int64_t words_differ(const char *what, const void *a, const void *b, size_t bytes) {
    int64_t n = 0;
    for (size_t i = 0; i < bytes / 2; i++)
        if (((const uint16_t *)a)[i] != ((const uint16_t *)b)[i] && n++ == 0)
            printf("    %s: first difference at 16-bit word %zu\n", what, i);
    return n;
}

/* A document case against the reference: the mma.sync kernels first (on Hopper each backward takes its own
 * forward's LSE), then on Hopper the wgmma ones. With one document the mma.sync results must be the bits of the
 * module without documents on the same inputs. */
static void check_docs(void **state) {
    doc_state *ds = *state;
    attn_mod *m = ds->m;
    const attn_shape *s = &m->sh;
    char name[160];
    doc_case_str(ds->c, name, sizeof name);
    void *ddocs;
    int *hd = docs_setup(m, ds->c, &ddocs);
    const int64_t T = ds->c->ring || ds->c->diag ? 2 * s->seq : s->seq;
    const uint64_t in_seed = seed++;
    host_io io;
    memset(&io, 0, sizeof io);
    double t0 = cp_now();
    run_shape(m, &io, in_seed, true);
    double t1 = cp_now();
    ref_attn_shape rs = {s->seq, s->q_heads, s->kv_heads, s->head_dim, s->causal, 1.0 / sqrt((double)s->head_dim),
                         hd, hd + T, m->q_pos, m->k_pos};
    double *q = to_f64(io.q, io.nq), *k = to_f64(io.k, io.nkv), *v = to_f64(io.v, io.nkv),
           *dout = to_f64(io.dout, io.nq);
    double *o = malloc(sizeof(double) * io.nq), *lse = malloc(sizeof(double) * io.nlse),
           *dq = malloc(sizeof(double) * io.nq), *dk = malloc(sizeof(double) * io.nkv),
           *dv = malloc(sizeof(double) * io.nkv);
    reference(&rs, q, k, v, dout, o, lse, dq, dk, dv);
    printf("  %s: GPU %.2f s, reference %.2f s\n", name, t1 - t0, cp_now() - t1);
    const bool hop = m->hopper;
    const uint16_t *mo = hop ? io.o_mma : io.o, *mdq = hop ? io.dq_mma : io.dq;
    const float *mlse = hop ? io.lse_mma : io.lse;
    const void *mdk = hop ? io.dk_mma : s->dkv_accum ? (void *)io.dk32 : io.dk16,
               *mdv = hop ? io.dv_mma : s->dkv_accum ? (void *)io.dv32 : io.dv16;
    const char *fp = hop ? "attention fwd (mma.sync)" : "attention fwd",
               *bp = hop ? "attention bwd (mma.sync)" : "attention bwd";
    check_fwd(fp, name, &io, mo, mlse, o, lse);
    check_bwd(bp, name, s, &io, mdq, mdk, mdv, dq, dk, dv);
    const int64_t empty = check_empty_rows(bp, name, s, mo, mdq, lse);
    if (hop) {
        check_fwd("attention fwd_sm90", name, &io, io.o, io.lse, o, lse);
        check_bwd("attention bwd_sm90", name, s, &io, io.dq, s->dkv_accum ? (void *)io.dk32 : io.dk16,
                  s->dkv_accum ? (void *)io.dv32 : io.dv16, dq, dk, dv);
        check_empty_rows("attention bwd_sm90", name, s, io.o, io.dq, lse);
    }
    if (empty) printf("  %s: %lld rows (of all heads) keep no key\n", name, (long long)empty);
    if (ds->plain) {
        /* one document: every tile is computed and none masked but at the diagonal, as without documents */
        host_io pio;
        memset(&pio, 0, sizeof pio);
        run_shape(ds->plain, &pio, in_seed, true);
        const size_t bq = (size_t)io.nq * 2, bdkv = (size_t)io.nkv * (s->dkv_accum ? 4 : 2);
        const uint16_t *po = hop ? pio.o_mma : pio.o, *pdq = hop ? pio.dq_mma : pio.dq;
        const float *plse = hop ? pio.lse_mma : pio.lse;
        const void *pdk = hop ? pio.dk_mma : s->dkv_accum ? (void *)pio.dk32 : pio.dk16,
                   *pdv = hop ? pio.dv_mma : s->dkv_accum ? (void *)pio.dv32 : pio.dv16;
        const int64_t differ = words_differ("o", mo, po, bq) + words_differ("lse", mlse, plse, (size_t)io.nlse * 4) +
                               words_differ("dq", mdq, pdq, bq) + words_differ("dk", mdk, pdk, bdkv) +
                               words_differ("dv", mdv, pdv, bdkv);
        printf("  %s: mma.sync o, lse, dq, dk, dv against the module without documents: %lld 16-bit words differ\n",
               name, (long long)differ);
        if (differ) gu_fail("%s: one document does not give the bits of the module without documents", name);
        gu_check("attention mma.sync = without docs", name, 0.0, 0.0);
        if (hop) /* the wgmma kernels' own business: reported, not required */
            printf("  %s: wgmma o, dq against the module without documents: %lld 16-bit words differ\n", name,
                   (long long)(words_differ("o", io.o, pio.o, bq) + words_differ("dq", io.dq, pio.dq, bq)));
        free_io(&pio);
    }
    free(q), free(k), free(v), free(dout), free(o), free(lse), free(dq), free(dk), free(dv);
    free_io(&io);
    docs_release(m, hd, ddocs);
}

/* The backward's determinism with documents (check_repeatable), on Hopper for the mma.sync backward as well. */
static void check_repeatable_docs(void **state) {
    doc_state *ds = *state;
    void *ddocs;
    int *hd = docs_setup(ds->m, ds->c, &ddocs);
    char name[160];
    printf("  %s\n", doc_case_str(ds->c, name, sizeof name));
    repeatable(ds->m, false);
    if (ds->m->hopper) repeatable(ds->m, true);
    docs_release(ds->m, hd, ddocs);
}

static int write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n) {
        fprintf(stderr, "cannot write %s\n", path);
        if (f) fclose(f);
        return -1;
    }
    return fclose(f);
}

static int dump(char **argv) {
    attn_mod m;
    memset(&m, 0, sizeof m);
    m.sh = (attn_shape){atoll(argv[3]), atoll(argv[6]), atoi(argv[4]), atoi(argv[5]), atoi(argv[7]) != 0, false, false,
                        false};
    attn_build(&m, 1);
    host_io io;
    memset(&io, 0, sizeof io);
    run_shape(&m, &io, seed++, false);
    const char *dir = argv[2];
    char meta[256];
    int ml = snprintf(meta, sizeof meta, "S=%lld QH=%d KVH=%d D=%lld causal=%d\n", (long long)m.sh.seq, m.sh.q_heads,
                      m.sh.kv_heads, (long long)m.sh.head_dim, m.sh.causal);
    size_t bq = (size_t)io.nq * 2, bkv = (size_t)io.nkv * 2;
    int rc = write_file(dir, "meta.txt", meta, (size_t)ml) | write_file(dir, "q.bin", io.q, bq) |
             write_file(dir, "k.bin", io.k, bkv) | write_file(dir, "v.bin", io.v, bkv) |
             write_file(dir, "dout.bin", io.dout, bq) | write_file(dir, "o.bin", io.o, bq) |
             write_file(dir, "lse.bin", io.lse, (size_t)io.nlse * 4) | write_file(dir, "dq.bin", io.dq, bq) |
             write_file(dir, "dk.bin", io.dk16, bkv) | write_file(dir, "dv.bin", io.dv16, bkv);
    free_io(&io);
    attn_free(&m);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    gu_init_or_skip("test_attention"); /* also for --dump: attention_sdpa.py passes the skip on */
    if (argc == 8 && strcmp(argv[1], "--dump") == 0) return dump(argv);
    const bool docs_only = argc == 2 && strcmp(argv[1], "--docs") == 0;
    if (argc != 1 && !docs_only) {
        fprintf(stderr, "usage: test_attention [--docs | --dump DIR S QH KVH D CAUSAL]\n"
                        "  --docs: only the document-mask cases\n");
        return 2;
    }
    gu_cmocka = true;
    for (int i = 0; i < NSHAPES; i++) mods[i].sh = SHAPES[i];
    for (int i = 0; i < NDSHAPES; i++) mods[NSHAPES + i].sh = DSHAPES[i];
    attn_mod *strided = &mods[NSHAPES + NDSHAPES];
    for (int i = 0; i < NSSHAPES; i++) strided[i].sh = SSHAPES[i].sh, strided[i].lse_stride = SSHAPES[i].lse_stride;
    /* the document cases' modules, then the one without documents that DL_ONE is compared with */
    enum { NDMODS = NDOC + NDOC_D + 1 };
    static attn_mod dmods[NDMODS];
    static doc_state dstate[NDOC + NDOC_D];
    for (int i = 0; i < NDOC + NDOC_D; i++) {
        const doc_case *c = i < NDOC ? &DOC_CASES[i] : &DOC_DCASES[i - NDOC];
        dmods[i].sh = c->sh;
        dmods[i].lse_stride = c->diag ? 2 * c->sh.seq : 0;
        dstate[i] = (doc_state){&dmods[i], c, NULL};
        if (c->layout == DL_ONE) {
            dmods[NDMODS - 1].sh = c->sh;
            dmods[NDMODS - 1].sh.docs = false;
            dstate[i].plain = &dmods[NDMODS - 1];
        }
    }
    if (!docs_only) attn_build(mods, NSHAPES + NDSHAPES + NSSHAPES);
    attn_build(dmods, NDMODS);
    enum { NBASE = NSHAPES + NREPEAT + NDSHAPES + NSSHAPES, NTESTS = NBASE + NDOC + NDOC_REPEAT + NDOC_D };
    static struct CMUnitTest tests[NTESTS];
    static char names[NTESTS][192];
    for (int i = 0; i < NSHAPES; i++) {
        attn_shape_str(&SHAPES[i], names[i], sizeof names[i]);
        tests[i] = (struct CMUnitTest){names[i], check_shape, NULL, NULL, &mods[i]};
    }
    for (int i = 0; i < NREPEAT + NDSHAPES; i++) {
        attn_mod *m = i < NREPEAT ? &mods[REPEAT[i]] : &mods[NSHAPES + i - NREPEAT];
        char sh[96];
        attn_shape_str(&m->sh, sh, sizeof sh);
        snprintf(names[NSHAPES + i], sizeof names[NSHAPES + i], "repeatable %s", sh);
        tests[NSHAPES + i] = (struct CMUnitTest){names[NSHAPES + i], check_repeatable, NULL, NULL, m};
    }
    for (int i = 0; i < NSSHAPES; i++) {
        const int t = NSHAPES + NREPEAT + NDSHAPES + i;
        char sh[64];
        attn_shape_str(&SSHAPES[i].sh, sh, sizeof sh);
        snprintf(names[t], sizeof names[t], "%s, LSE rows %lld apart", sh, (long long)SSHAPES[i].lse_stride);
        tests[t] = (struct CMUnitTest){names[t], check_shape, NULL, NULL, &strided[i]};
    }
    for (int i = 0; i < NDOC; i++) {
        doc_case_str(&DOC_CASES[i], names[NBASE + i], sizeof names[NBASE + i]);
        tests[NBASE + i] = (struct CMUnitTest){names[NBASE + i], check_docs, NULL, NULL, &dstate[i]};
    }
    for (int i = 0; i < NDOC_REPEAT + NDOC_D; i++) {
        const int t = NBASE + NDOC + i, d = i < NDOC_REPEAT ? DOC_REPEAT[i] : NDOC + i - NDOC_REPEAT;
        char c[160];
        snprintf(names[t], sizeof names[t], "repeatable %s", doc_case_str(dstate[d].c, c, sizeof c));
        tests[t] = (struct CMUnitTest){names[t], check_repeatable_docs, NULL, NULL, &dstate[d]};
    }
    const int first = docs_only ? NBASE : 0;
    int fails = _cmocka_run_group_tests("attention", tests + first, (size_t)(NTESTS - first), NULL, NULL);
    gu_print_table();
    if (!docs_only)
        for (int i = 0; i < NSHAPES + NDSHAPES + NSSHAPES; i++) attn_free(&mods[i]);
    for (int i = 0; i < NDMODS; i++) attn_free(&dmods[i]);
    return gu_status(fails);
}
