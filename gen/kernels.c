/* kernels.c: the kernel family constructors of kernels.h (all but attention, in kernels_attn.c): the compile-time
 * values each template needs, chosen from the shapes, and the launch geometry of each entry. */
#include "kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_attn.h"
#include "util.h"

/* Threads per block of the element-wise kernels, and how many units (16-byte vectors) each thread moves per loop
 * iteration: all loads of an iteration are issued before any store, so this is the bytes in flight per thread. */
#define EW_BLOCK 256
#define EW_UNROLL 4
#define SWIGLU_ROW_THREADS 512 /* a block of SwiGLU's row entries: one row at a time */
/* embedding bwd_sorted: vectors per thread of a column chunk, rows loaded at once, waves of blocks in the grid */
#define EMB_SCOLS 2
#define EMB_SROWS 2
#define EMB_WAVES 4

const char *cp_kspec_get(const cp_kernel_spec *k, const char *key) {
    for (int i = 0; i < k->nparams; i++)
        if (strcmp(k->params[i].key, key) == 0) return k->params[i].value;
    return NULL;
}

bool cp_k_variants(const cp_kernel_spec *k, cp_kvariants *v) {
    memset(v, 0, sizeof *v);
    return strcmp(k->family, "attention") == 0 && cp_k_attention_variants(k, v);
}

void cp_k_set_variant(cp_kernel_spec *k, const cp_kvariants *v, int value) {
    cp_kspec_set_int(k, v->param, value);
    if (value == v->def) k->tag[0] = 0;
    else snprintf(k->tag, sizeof k->tag, "%s%d", v->tag, value);
}

int cp_k_variant(const cp_kernel_spec *k, const cp_kvariants *v) {
    const char *s = cp_kspec_get(k, v->param);
    return s ? atoi(s) : v->def;
}

static int64_t get_int(const cp_kernel_spec *k, const char *key) {
    const char *v = cp_kspec_get(k, key);
    if (!v) cp_fatal(CP_EXIT_FAIL, "kernel %s: no parameter %s (a spec not made by gen/kernels.c?)", k->family, key);
    return strtoll(v, NULL, 10);
}

/* Largest of 8, 4, 2, 1 bf16 values (16 bytes down to 2) dividing n: the vector width rows of n values allow. */
static int bf16_vec(int64_t n) {
    int v = 8;
    while (v > 1 && n % v) v /= 2;
    return v;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static unsigned grid_of(int64_t blocks) {
    if (blocks < 0) blocks = 0;
    return (unsigned)CP_MIN(blocks, (int64_t)0x7fffffff);
}

/* "1e-05" -> "1em05", "1.5e-06" -> "1p5em06": a number as it may appear in a kernel name. */
static void num_tag(double v, char *out, size_t n) {
    char buf[40];
    snprintf(buf, sizeof buf, "%.3g", v);
    size_t j = 0;
    for (const char *p = buf; *p && j + 1 < n; p++) {
        if (*p == '-') out[j++] = 'm';
        else if (*p == '.') out[j++] = 'p';
        else if (*p != '+') out[j++] = *p;
    }
    out[j] = 0;
}

void cp_k_embedding(cp_kernel_spec *k, int64_t vocab, int64_t hidden) {
    cp_kspec_init(k, "embedding");
    cp_kspec_set_int(k, "VOCAB", vocab);
    cp_kspec_set_int(k, "HIDDEN", hidden);
    int vec = bf16_vec(hidden);
    cp_kspec_set_int(k, "VEC", vec);
    cp_kspec_set_int(k, "BLOCK", EW_BLOCK);
    cp_kspec_set_int(k, "UNROLL", EW_UNROLL);
    /* bwd_sorted: a group of threads per (run, chunk of columns), EMB_SCOLS vectors each; groups of at most a warp,
     * narrower for short rows. Narrow chunks spread a long run (a frequent token) over many groups; EMB_SROWS rows in
     * flight per group keep such a run from being latency-bound. */
    int64_t nvec = hidden / vec;
    int g = 2;
    while (g < 32 && g * EMB_SCOLS < nvec) g *= 2;
    cp_kspec_set_int(k, "SGROUP", g);
    cp_kspec_set_int(k, "SCOLS", EMB_SCOLS);
    cp_kspec_set_int(k, "SROWS", EMB_SROWS);
}

/* Threads per row for rows of nvec vectors, about `target` vectors per thread: short rows go to a power-of-two group
 * of at most a warp (several rows per block); longer rows to whole warps, preferring a thread count that divides
 * the row (target 4: 4096 -> 128 threads, 5120 -> 160, 3072 -> 96). */
static void rows_split(int64_t nvec, int target, int *tpr, int *nv) {
    if (nvec <= 32 * target) {
        int t = 1;
        while (t < 32 && t * target < nvec) t *= 2;
        *tpr = t;
        *nv = (int)ceil_div(nvec, t);
        return;
    }
    int best = 0, bestnv = 0;
    for (int t = 32; t <= 1024; t += 32) {
        if (nvec % t || nvec / t > 2 * target) continue;
        int nvt = (int)(nvec / t);
        if (!best || abs(nvt - target) < abs(bestnv - target) ||
            (abs(nvt - target) == abs(bestnv - target) && nvt > bestnv)) {
            best = t;
            bestnv = nvt;
        }
    }
    if (!best) {
        best = (int)CP_MIN(1024, ceil_div(ceil_div(nvec, target), 32) * 32);
        bestnv = (int)ceil_div(nvec, best);
    }
    *tpr = best;
    *nv = bestnv;
}

/* The row-scaled FP8 producers' pipes (templates/row_pipe.cuh): `stages` rows of `words` 16-byte vectors a thread of
 * `threads` in dynamic shared memory */
static int64_t row_pipe_bytes(int64_t stages, int64_t words, int64_t threads) { return stages * words * threads * 16; }

/* Rows in flight for a pipe beside `static_bytes` of the kernel's own shared memory: up to `most` (2 or 3) where they
 * fit in a block's shared memory on Hopper (227 KB; the FP8 copies are Hopper's), two where only those fit, else 0
 * (no such entry) */
static int64_t row_pipe_stages(int64_t most, int64_t words, int64_t threads, int64_t static_bytes) {
    for (int64_t s = most; s >= 2; s--)
        if (row_pipe_bytes(s, words, threads) + static_bytes <= 227 * 1024) return s;
    return 0;
}

void cp_k_rmsnorm(cp_kernel_spec *k, int64_t hidden, double eps) {
    cp_kspec_init(k, "rmsnorm");
    int vec = bf16_vec(hidden), tpr, nv, tprb, nvb;
    rows_split(hidden / vec, 4, &tpr, &nv);
    rows_split(hidden / vec, 2, &tprb, &nvb);
    if (nv > 16 || nvb > 8)
        cp_fatal(CP_EXIT_USAGE, "rmsnorm: hidden size %lld is too large for one block per row", (long long)hidden);
    int rpb = tpr < 32 ? 128 / tpr : 1, rpbb = tprb < 32 ? 128 / tprb : 1;
    char tag[40];
    num_tag(eps, tag, sizeof tag);
    cp_kspec_set_int(k, "HIDDEN", hidden);
    cp_kspec_set_double(k, "EPS", eps);
    cp_kspec_set_str(k, "EPS_TAG", tag);
    cp_kspec_set_int(k, "VEC", vec);
    cp_kspec_set_int(k, "TPR", tpr);
    cp_kspec_set_int(k, "NV", nv);
    cp_kspec_set_int(k, "RPB", rpb);
    cp_kspec_set_int(k, "MIN_BLOCKS", CP_MAX(1, 512 / (tpr * rpb)));
    cp_kspec_set_int(k, "TPR_B", tprb);
    cp_kspec_set_int(k, "NV_B", nvb);
    cp_kspec_set_int(k, "RPB_B", rpbb);
    cp_kspec_set_int(k, "MIN_BLOCKS_B", CP_MAX(1, 512 / (tprb * rpbb)));
    /* fwd_row's pipe holds x's and resid's vectors, bwd_row's dout's, x's and dresid's (static: the reductions' and
     * bwd's few-column sums). fwd_row holds little across a row's reductions: 768 threads an SM, each block two rows
     * in flight (the 3B's norm: 155.7 us with two, 160.7 with three at 480 threads, bench_kernels row) */
    const int64_t rmsnorm_static = 16 * 1024;
    cp_kspec_set_int(k, "MIN_BLOCKS_R", CP_MAX(1, 768 / (tpr * rpb)));
    cp_kspec_set_int(k, "ROW_STAGES", vec == 8 ? row_pipe_stages(2, 2 * nv, tpr * rpb, rmsnorm_static) : 0);
    cp_kspec_set_int(k, "ROW_STAGES_B", vec == 8 ? row_pipe_stages(3, 3 * nvb, tprb * rpbb, rmsnorm_static) : 0);
    /* bwd_dw: a float4 of columns per thread when the row allows, 8 threads across and 32 down a block */
    cp_kspec_set_int(k, "DW_V", hidden % 4 == 0 ? 4 : 1);
    cp_kspec_set_int(k, "DW_TPC", 8);
    cp_kspec_set_int(k, "DW_GROUPS", 32);
}

/* Hugging Face's rope initialisation, in double: default frequencies theta^(-2i/D), then Llama-3 scaling
 * (transformers' _compute_llama3_parameters). */
void cp_rope_inv_freq(const cp_model *m, double *inv) {
    int64_t D = m->head_dim;
    for (int64_t i = 0; i < D / 2; i++) inv[i] = 1.0 / pow(m->rope_theta, (double)(2 * i) / (double)D);
    const cp_rope_scaling *s = &m->rope_scaling;
    if (!s->enabled) return;
    double low_wavelen = (double)s->original_max / s->low_freq;
    double high_wavelen = (double)s->original_max / s->high_freq;
    for (int64_t i = 0; i < D / 2; i++) {
        double wavelen = 2.0 * M_PI / inv[i];
        if (wavelen < high_wavelen) continue;
        if (wavelen > low_wavelen) {
            inv[i] /= s->factor;
            continue;
        }
        double smooth = ((double)s->original_max / wavelen - s->low_freq) / (s->high_freq - s->low_freq);
        inv[i] = (1.0 - smooth) * inv[i] / s->factor + smooth * inv[i];
    }
}

void cp_k_rope(cp_kernel_spec *k, const cp_model *m) {
    cp_kspec_init(k, "rope");
    int64_t D = m->head_dim;
    if (D < 2 || D % 2) cp_fatal(CP_EXIT_USAGE, "rope: head_dim %lld must be even", (long long)D);
    double *inv = cp_xmalloc((size_t)(D / 2) * sizeof *inv);
    cp_rope_inv_freq(m, inv);
    cp_str s = {0};
    for (int64_t i = 0; i < D / 2; i++) cp_str_printf(&s, "%s%.17g", i ? (i % 4 ? ", " : ",\n    ") : "", inv[i]);
    char tag[16];
    snprintf(tag, sizeof tag, "%08x", (unsigned)(cp_hash64(inv, (size_t)(D / 2) * sizeof *inv, CP_HASH_SEED) & 0xffffffffu));
    free(inv);
    int vec = bf16_vec(D / 2);
    cp_kspec_set_int(k, "D", D);
    cp_kspec_set_str(k, "FREQ_TAG", tag);
    cp_kspec_set_str(k, "INV_FREQ", s.data);
    cp_kspec_set_int(k, "VEC", vec);
    cp_kspec_set_int(k, "BLOCK", EW_BLOCK);
    cp_k_rope_positions(k, false);
    cp_str_free(&s);
}

void cp_k_rope_positions(cp_kernel_spec *k, bool per_row) {
    cp_kspec_set_int(k, "POS_ARRAY", per_row);
    cp_kspec_set_str(k, "POS_TAG", per_row ? "_pa" : ""); /* names without it unchanged */
}

void cp_k_swiglu(cp_kernel_spec *k, int64_t ffn) {
    cp_kspec_init(k, "swiglu");
    cp_kspec_set_int(k, "FFN", ffn);
    cp_kspec_set_int(k, "VEC", bf16_vec(ffn));
    cp_kspec_set_int(k, "BLOCK", EW_BLOCK);
    cp_kspec_set_int(k, "UNROLL", 2);
    cp_kspec_set_int(k, "ROW_THREADS", SWIGLU_ROW_THREADS);
    /* the row entries (templates/swiglu.cu): a row a block of SWIGLU_ROW_THREADS at a time, at most 4 vectors of 8 a
     * thread; fwd_row's pipe holds gate's and up's vectors, bwd_row's dout's too, beside dup's column maxima */
    const int64_t row_vecs = ceil_div(ffn / bf16_vec(ffn), SWIGLU_ROW_THREADS);
    const bool row = bf16_vec(ffn) == 8 && row_vecs <= 4;
    cp_kspec_set_int(k, "ROW_VECS", row_vecs);
    cp_kspec_set_int(k, "ROW_FWD_BLOCKS", row_vecs <= 2 ? 2 : 1); /* fwd_row's blocks an SM: its registers allow two */
    const int64_t maxima = row_vecs * SWIGLU_ROW_THREADS * 16 + 1024;
    cp_kspec_set_int(k, "ROW_STAGES_F", row ? row_pipe_stages(3, 2 * row_vecs, SWIGLU_ROW_THREADS, 1024) : 0);
    cp_kspec_set_int(k, "ROW_STAGES_B", row ? row_pipe_stages(3, 3 * row_vecs, SWIGLU_ROW_THREADS, maxima) : 0);
}

bool cp_k_fp8_copies(const cp_kernel_spec *k, const char *role) {
    /* as COPY_OK in templates/rmsnorm.cu, swiglu.cu, rope.cu and ulysses.cu */
    if (!strcmp(k->family, "rmsnorm"))
        return get_int(k, "VEC") == 8 && get_int(k, "HIDDEN") % 128 == 0 &&
               ((!strcmp(role, "fwd") && get_int(k, "TPR") % 16 == 0) ||
                (!strcmp(role, "bwd") && get_int(k, "TPR_B") % 16 == 0));
    if (!strcmp(k->family, "swiglu"))
        return (!strcmp(role, "fwd") || !strcmp(role, "bwd")) && get_int(k, "VEC") == 8 &&
               get_int(k, "FFN") % 128 == 0;
    if (!strcmp(k->family, "rope"))
        return !strcmp(role, "bwd") && get_int(k, "D") == 128 && get_int(k, "VEC") == 8;
    if (!strcmp(k->family, "ulysses"))
        return !strcmp(role, "unpack") && get_int(k, "UNIT") == 16 && get_int(k, "R") == 1 &&
               get_int(k, "NOUT") * get_int(k, "ROW_BYTES") / 16 % 16 == 0;
    return false;
}

bool cp_k_fp8_row_copies(const cp_kernel_spec *k, const char *role) {
    /* the entries fwd_row and bwd_row where they have pipes (ROW_OK in templates/rmsnorm.cu and swiglu.cu) */
    const bool swiglu = !strcmp(k->family, "swiglu");
    if (!swiglu && strcmp(k->family, "rmsnorm")) return false;
    if (!strcmp(role, "fwd")) return get_int(k, swiglu ? "ROW_STAGES_F" : "ROW_STAGES") > 0;
    return !strcmp(role, "bwd") && get_int(k, "ROW_STAGES_B") > 0;
}

void cp_k_loss(cp_kernel_spec *k, int64_t vocab) {
    cp_kspec_init(k, "loss");
    int vec = bf16_vec(vocab);
    /* one block per row, up to 1024 threads with about 8 or more vectors each */
    int64_t nvec = vocab / vec;
    int block = 32;
    while (block < 1024 && block * 8 < nvec) block *= 2;
    cp_kspec_set_int(k, "VOCAB", vocab);
    cp_kspec_set_int(k, "VEC", vec);
    cp_kspec_set_int(k, "BLOCK", block);
    cp_kspec_set_int(k, "UNROLL", 4);
    cp_kspec_set_int(k, "SUM_BLOCK", 1024); /* sum: one block */
}

void cp_k_adamw(cp_kernel_spec *k) {
    cp_kspec_init(k, "adamw");
    cp_kspec_set_int(k, "BLOCK", EW_BLOCK);
    cp_kspec_set_int(k, "UNROLL", 2);        /* update: 4 float4 loads per unit, 8 per thread in flight */
    cp_kspec_set_int(k, "SUMSQ_UNROLL", 8);  /* sumsq: a persistent grid (few partials), so more loads per thread */
}

void cp_k_ulysses(cp_kernel_spec *k, int gpus, int repl, int64_t tokens, int nout, int64_t row_bytes) {
    cp_kspec_init(k, "ulysses");
    if (gpus < 1 || repl < 1 || gpus % repl || nout < 1 || tokens < 1)
        cp_fatal(CP_EXIT_FAIL, "ulysses: bad layout C=%d R=%d T=%lld NOUT=%d", gpus, repl, (long long)tokens, nout);
    if (row_bytes < 4 || row_bytes % 4)
        cp_fatal(CP_EXIT_FAIL, "ulysses: rows of %lld bytes; the layout kernels move rows of a multiple of 4 bytes",
                 (long long)row_bytes);
    int unit = row_bytes % 16 == 0 ? 16 : 4;
    int64_t total = (int64_t)gpus * tokens * nout * (row_bytes / unit);
    cp_kspec_set_int(k, "C", gpus);
    cp_kspec_set_int(k, "R", repl);
    cp_kspec_set_int(k, "T", tokens);
    cp_kspec_set_int(k, "NOUT", nout);
    cp_kspec_set_int(k, "ROW_BYTES", row_bytes);
    cp_kspec_set_int(k, "UNIT", unit);
    /* 32-bit unit indices when the grid-stride loop cannot overflow them */
    cp_kspec_set_str(k, "IDX", total < (1LL << 30) ? "unsigned" : "unsigned long long");
    cp_kspec_set_int(k, "BLOCK", EW_BLOCK);
    cp_kspec_set_int(k, "UNROLL", EW_UNROLL);
}

void cp_k_cast(cp_kernel_spec *k) {
    cp_kspec_init(k, "cast");
    cp_kspec_set_int(k, "BLOCK", EW_BLOCK);
    cp_kspec_set_int(k, "UNROLL", EW_UNROLL);
}

void cp_k_fp8(cp_kernel_spec *k) {
    cp_kspec_init(k, "fp8");
    cp_kspec_set_int(k, "BLOCK", CP_FP8_BLOCK);
    cp_kspec_set_int(k, "UNROLL", 4);
    cp_kspec_set_int(k, "AMAX_PARTS", CP_FP8_AMAX_PARTS);
    cp_kspec_set_int(k, "ROW_CHUNK", CP_FP8_ROW_CHUNK);
    cp_kspec_set_int(k, "ROW_VECS", CP_FP8_ROW_VECS);
}

/* templates/gemm_fp8.cu's tile and ring: outputs of (64 x consumers) x 128, k blocks of 128, stages of A's and B's
 * tiles and their scale rows, 16 bytes of mbarriers each, and the slack that aligns the ring to 1024 bytes; as many
 * stages as fit 227 KiB, at most 6 (two consumers: 6 stages of 33 KiB; three: 5 of 41 KiB) */
#define GEMM_FP8_MAX_STAGES 6
#define GEMM_FP8_GROUP_M 8
/* one CTA a cluster: pairs sharing B's tiles measured no faster on the 3B step's GEMMs (docs/PERF.md, 2026-12-03) */
#define GEMM_FP8_CLUSTER 1
/* three consumers (tiles of 192 rows) where the call's rows are unknown: on the 3B step's GEMMs at 32K 0.643 s
 * against two's 0.735 s (docs/PERF.md, 2026-12-03, three consumer warpgroups); cp_gemm_fp8_kspec chooses by m */
#define GEMM_FP8_CONSUMERS 3
static int64_t gemm_fp8_stage(bool b_tiles, int consumers) {
    return 64 * consumers * 128 + 128 * 128 + 64 * consumers * 4 + (b_tiles ? 0 : 512) + 16;
}
static int gemm_fp8_stages(bool b_tiles, int consumers) {
    int64_t n = (227 * 1024 - 1024) / gemm_fp8_stage(b_tiles, consumers);
    return (int)CP_MIN(n, GEMM_FP8_MAX_STAGES);
}

bool cp_k_sm90a(const char *arch) { return arch && strcmp(arch, "sm_90a") == 0; }

bool cp_k_gemm_fp8(cp_kernel_spec *k, int64_t n, int64_t kdim, bool a_e5m2, bool b_e5m2, bool b_tiles,
                   cp_gemm_fp8_out out, cp_gemm_fp8_cfg cfg) {
    const int cluster = cfg.cluster ? cfg.cluster : GEMM_FP8_CLUSTER;
    const int consumers = cfg.consumers ? cfg.consumers : cluster == 2 ? 2 : GEMM_FP8_CONSUMERS;
    /* three consumers in clusters of two spill at their 160 registers on some shapes (k = 1024, B's 1 x 128 scales),
     * and measured no faster where they did not (docs/PERF.md, 2026-12-03, three consumer warpgroups) */
    if (n < 128 || n % 128 || kdim < 128 || kdim % 128 || (a_e5m2 && b_e5m2) || cluster < 1 || cluster > 2 ||
        consumers < 2 || consumers > 3 || (cluster == 2 && consumers == 3))
        return false;
    const int stages = gemm_fp8_stages(b_tiles, consumers);
    static const char *outs[] = {"w", "c", "f", "a"};
    char shape[96];
    snprintf(shape, sizeof shape, "n%lld_k%lld_%s%s_%s_%s_c%d_w%d", (long long)n, (long long)kdim,
             a_e5m2 ? "e5" : "e4", b_e5m2 ? "e5" : "e4", b_tiles ? "bt" : "bv", outs[out], cluster, consumers);
    cp_kspec_init(k, "gemm_fp8");
    cp_kspec_set_str(k, "SHAPE", shape);
    cp_kspec_set_int(k, "N", n);
    cp_kspec_set_int(k, "K", kdim);
    cp_kspec_set_str(k, "A_TYPE", a_e5m2 ? "e5m2" : "e4m3");
    cp_kspec_set_str(k, "B_TYPE", b_e5m2 ? "e5m2" : "e4m3");
    cp_kspec_set_int(k, "B_TILES", b_tiles);
    cp_kspec_set_int(k, "EPILOGUE", out);
    cp_kspec_set_int(k, "STAGES", stages);
    cp_kspec_set_int(k, "GROUP_M", GEMM_FP8_GROUP_M);
    cp_kspec_set_int(k, "CLUSTER", cluster);
    cp_kspec_set_int(k, "CONSUMERS", consumers);
    cp_kspec_set_int(k, "SMEM_BYTES", stages * gemm_fp8_stage(b_tiles, consumers) + 1024);
    return true;
}

/* Kernels over (token, head) rows of head_dim bf16 values (attn_delta, attn_merge): a power-of-two group of TPR
 * threads per row, 2 vectors of each input per thread. */
static void head_row_params(cp_kernel_spec *k, int64_t head_dim) {
    int vec = bf16_vec(head_dim);
    int64_t nvec = head_dim / vec;
    int tpr = 1;
    while (tpr < 32 && tpr * 2 < nvec) tpr *= 2;
    cp_kspec_set_int(k, "D", head_dim);
    cp_kspec_set_int(k, "VEC", vec);
    cp_kspec_set_int(k, "TPR", tpr);
    cp_kspec_set_int(k, "NV", ceil_div(nvec, tpr));
    cp_kspec_set_int(k, "BLOCK", EW_BLOCK);
}

void cp_k_attn_delta(cp_kernel_spec *k, int64_t head_dim) {
    cp_kspec_init(k, "attn_delta");
    head_row_params(k, head_dim);
}

void cp_k_attn_merge(cp_kernel_spec *k, int64_t head_dim) {
    cp_kspec_init(k, "attn_merge");
    head_row_params(k, head_dim);
}

/* Blocks for `units` work items of `per_block` each, capped at `cap` (0: no cap) for grid-stride kernels. */
static unsigned blocks_for(int64_t units, int64_t per_block, int64_t cap) {
    int64_t b = ceil_div(units, per_block);
    if (cap > 0) b = CP_MIN(b, cap);
    return grid_of(b);
}

int cp_k_dims(const cp_kernel_spec *k, const char *role, int64_t n, int64_t heads, int sms, cp_kdims *d) {
    memset(d, 0, sizeof *d);
    d->grid[1] = d->grid[2] = 1;
    if (sms < 1) sms = 1;
    if (sms > CP_KDIMS_MAX_SMS) sms = CP_KDIMS_MAX_SMS;
    const char *f = k->family;
    if (n < 0) n = 0;
    if (strcmp(f, "rmsnorm") == 0) {
        if (strcmp(role, "fwd") == 0 || strcmp(role, "fwd_copy") == 0) {
            int64_t rpb = get_int(k, "RPB");
            d->block = (unsigned)(get_int(k, "TPR") * rpb);
            d->grid[0] = blocks_for(n, rpb, 0);
        } else if (strcmp(role, "fwd_row") == 0) {
            /* persistent, one round of the blocks that fit at once: each block's columns cost an atomic each */
            int64_t rpb = get_int(k, "RPB");
            d->block = (unsigned)(get_int(k, "TPR") * rpb);
            d->grid[0] = blocks_for(n, rpb, (int64_t)sms * get_int(k, "MIN_BLOCKS_R"));
            d->smem = (unsigned)row_pipe_bytes(get_int(k, "ROW_STAGES"), 2 * get_int(k, "NV"), d->block);
        } else if (strcmp(role, "bwd") == 0 || strcmp(role, "bwd_copy") == 0 || strcmp(role, "bwd_row") == 0) {
            /* persistent: about two rounds of the blocks that fit at once (the same for all three, so that dweight's
             * parts are summed alike) */
            int64_t rpb = get_int(k, "RPB_B");
            d->block = (unsigned)(get_int(k, "TPR_B") * rpb);
            d->grid[0] = blocks_for(n, rpb, (int64_t)sms * 2 * get_int(k, "MIN_BLOCKS_B"));
            if (strcmp(role, "bwd_row") == 0)
                d->smem = (unsigned)row_pipe_bytes(get_int(k, "ROW_STAGES_B"), 3 * get_int(k, "NV_B"), d->block);
        } else if (strcmp(role, "bwd_dw") == 0) {
            /* a block per DW_COLS columns; n is the bwd's rows (none: nothing to add) */
            int64_t cols = get_int(k, "DW_TPC") * get_int(k, "DW_V");
            d->block = (unsigned)(get_int(k, "DW_TPC") * get_int(k, "DW_GROUPS"));
            d->grid[0] = n > 0 ? blocks_for(get_int(k, "HIDDEN"), cols, 0) : 0;
        } else {
            return -1;
        }
        return 0;
    }
    if (strcmp(f, "embedding") == 0) {
        if (strcmp(role, "bwd_sorted") == 0) {
            /* one group per (position, chunk), grid-stride over a few waves of full SMs */
            int64_t g = get_int(k, "SGROUP"), chunk = g * get_int(k, "SCOLS");
            int64_t nchunk = ceil_div(get_int(k, "HIDDEN") / get_int(k, "VEC"), chunk);
            d->block = (unsigned)get_int(k, "BLOCK");
            d->grid[0] = blocks_for(n * nchunk, d->block / g, (int64_t)sms * (2048 / d->block) * EMB_WAVES);
            return 0;
        }
        if (strcmp(role, "fwd") && strcmp(role, "bwd")) return -1;
        int64_t units = n * (get_int(k, "HIDDEN") / get_int(k, "VEC"));
        d->block = (unsigned)get_int(k, "BLOCK");
        d->grid[0] = blocks_for(units, d->block * get_int(k, "UNROLL"), 0);
        return 0;
    }
    if (strcmp(f, "rope") == 0) {
        if (strcmp(role, "fwd") && strcmp(role, "bwd") && strcmp(role, "bwd_copy")) return -1;
        int64_t threads = n * (get_int(k, "D") / 2 / get_int(k, "VEC"));
        d->block = (unsigned)get_int(k, "BLOCK");
        d->grid[0] = heads > 0 ? blocks_for(threads, d->block, 0) : 0;
        return 0;
    }
    if (strcmp(f, "swiglu") == 0) {
        if (strcmp(role, "fwd_row") == 0 || strcmp(role, "bwd_row") == 0) {
            /* a row a block at a time, persistent: the blocks that fit at once (ROW_FWD_BLOCKS of fwd_row an SM, one
             * of bwd_row), each block's columns an atomic each at its end */
            const bool fwd = role[0] == 'f';
            d->block = SWIGLU_ROW_THREADS;
            d->grid[0] = blocks_for(n, 1, (int64_t)sms * (fwd ? get_int(k, "ROW_FWD_BLOCKS") : 1));
            const int64_t stages = get_int(k, fwd ? "ROW_STAGES_F" : "ROW_STAGES_B");
            d->smem = (unsigned)row_pipe_bytes(stages, (fwd ? 2 : 3) * get_int(k, "ROW_VECS"), SWIGLU_ROW_THREADS);
            return 0;
        }
        /* fwd, bwd and their twins that write FP8 copies: fwd_copy, bwd_copy, bwd_copy_gate, bwd_copy_up */
        if (strncmp(role, "fwd", 3) && strncmp(role, "bwd", 3)) return -1;
        int64_t units = n * (get_int(k, "FFN") / get_int(k, "VEC"));
        d->block = (unsigned)get_int(k, "BLOCK");
        d->grid[0] = blocks_for(units, d->block * get_int(k, "UNROLL"), 0);
        return 0;
    }
    if (strcmp(f, "loss") == 0) {
        if (strcmp(role, "fwdbwd") == 0) {
            d->block = (unsigned)get_int(k, "BLOCK");
            d->grid[0] = grid_of(n);
        } else if (strcmp(role, "sum") == 0) {
            d->block = (unsigned)get_int(k, "SUM_BLOCK");
            d->grid[0] = n > 0 ? 1 : 0;
        } else {
            return -1;
        }
        return 0;
    }
    if (strcmp(f, "adamw") == 0) {
        d->block = (unsigned)get_int(k, "BLOCK");
        if (strcmp(role, "update") == 0)
            d->grid[0] = blocks_for(n, d->block * get_int(k, "UNROLL") * 4, 0); /* float4 units */
        else if (strcmp(role, "sumsq") == 0) /* persistent: one full SM of threads, one partial per block */
            d->grid[0] = blocks_for(n, d->block * get_int(k, "SUMSQ_UNROLL") * 4, (int64_t)sms * (1024 / d->block));
        else
            return -1;
        return 0;
    }
    if (strcmp(f, "cast") == 0) {
        if (strcmp(role, "f32_to_bf16") && strcmp(role, "add_f32")) return -1;
        d->block = (unsigned)get_int(k, "BLOCK");
        d->grid[0] = blocks_for(n, d->block * get_int(k, "UNROLL") * 4, 0);
        return 0;
    }
    if (strcmp(f, "gemm_fp8") == 0) { /* n = m, the rows of A and D: a persistent grid of at most one block an SM */
        if (strcmp(role, "sm90") != 0) return -1;
        /* clusters of CLUSTER blocks, each taking CLUSTER tile rows (of 64 x CONSUMERS) of a tile column at a time */
        int64_t cl = get_int(k, "CLUSTER"), cw = get_int(k, "CONSUMERS"), bm = 64 * cw;
        int64_t units = ((n + bm - 1) / bm + cl - 1) / cl * (get_int(k, "N") / 128);
        d->block = (unsigned)(128 * (1 + cw));
        d->grid[0] = (unsigned)((units < sms / cl ? units : sms / cl) * cl);
        d->smem = (unsigned)get_int(k, "SMEM_BYTES");
        return 0;
    }
    if (strcmp(f, "fp8") == 0) { /* n rows, heads columns */
        int64_t units = n * (heads / 8);
        if (strcmp(role, "amax_e4m3") == 0 || strcmp(role, "amax_e5m2") == 0) {
            d->block = (unsigned)get_int(k, "BLOCK");
            d->grid[0] = blocks_for(units, d->block * get_int(k, "UNROLL"), get_int(k, "AMAX_PARTS"));
        } else if (strcmp(role, "cast_e4m3") == 0 || strcmp(role, "cast_e5m2") == 0 ||
                   strcmp(role, "cast_1d_e4m3") == 0 || strcmp(role, "cast_1d_e5m2") == 0) {
            d->block = (unsigned)get_int(k, "BLOCK");
            d->grid[0] = blocks_for(units, d->block * get_int(k, "UNROLL"), 0);
        } else if (strcmp(role, "cast_t_e4m3") == 0 || strcmp(role, "cast_t_e5m2") == 0) {
            d->block = 128; /* the template's: one tile of 128 rows and 64 columns a block */
            d->grid[0] = units > 0 ? (unsigned)((heads + 63) / 64) : 0;
            d->grid[1] = (unsigned)((n + 127) / 128);
        } else if (strcmp(role, "cast_t_1d_e4m3") == 0 || strcmp(role, "cast_t_1d_e5m2") == 0 ||
                   strcmp(role, "cast_rt_1d_e4m3") == 0 || strcmp(role, "cast_rt_1d_e5m2") == 0) {
            d->block = 256; /* one tile of 128 rows (their count a multiple of 128) and 128 columns a block */
            d->grid[0] = units > 0 ? (unsigned)((heads + 127) / 128) : 0;
            d->grid[1] = (unsigned)((n + 127) / 128);
        } else if (strcmp(role, "cast_row_e4m3") == 0 || strcmp(role, "cast_row_e5m2") == 0) {
            int64_t block = get_int(k, "BLOCK"), per_block = block / cp_fp8_row_group(heads);
            d->block = (unsigned)block; /* block / group rows a block at a time */
            d->grid[0] = units > 0 ? (unsigned)CP_MIN((n + per_block - 1) / per_block, 1 << 20) : 0;
        } else if (strcmp(role, "cast_rt_row_e4m3") == 0 || strcmp(role, "cast_rt_row_e5m2") == 0 ||
                   strcmp(role, "cast_rt_row_layers_e4m3") == 0) { /* _layers: a layer a z, which its caller sets */
            /* n / 256 rows a block, 16 to CP_FP8_RT_ROWS: enough blocks for two an SM on a weight's few rows, few
             * enough on many rows that the atomic maxima stay one per column and block */
            int64_t per = CP_MAX(16, CP_MIN(n / 256, CP_FP8_RT_ROWS));
            d->block = (unsigned)get_int(k, "BLOCK");
            d->grid[0] = units > 0 ? (unsigned)((n + per - 1) / per) : 0;
        } else if (strcmp(role, "cast_t_row_max") == 0 || strcmp(role, "cast_t_row_e4m3") == 0 ||
                   strcmp(role, "cast_t_row_e5m2") == 0 || strcmp(role, "cast_t_row8_e4m3") == 0 ||
                   strcmp(role, "cast_t_row8_e5m2") == 0 || strcmp(role, "cast_t_row8_layers_e4m3") == 0) {
            /* a strip of source columns (32; from a row copy CP_FP8_ROW8_COLS) by a chunk of rows a block */
            const int64_t strip = strncmp(role, "cast_t_row8_", 12) == 0 ? CP_FP8_ROW8_COLS : 32;
            d->block = 256;
            d->grid[0] = units > 0 ? (unsigned)((heads + strip - 1) / strip) : 0;
            d->grid[1] = (unsigned)((n + CP_FP8_ROW_CHUNK - 1) / CP_FP8_ROW_CHUNK);
        } else if (strcmp(role, "cast_2d_e4m3") == 0 || strcmp(role, "cast_t_2d_e4m3") == 0 ||
                   strcmp(role, "cast_2d_layers_e4m3") == 0 || strcmp(role, "cast_t_2d_layers_e4m3") == 0) {
            d->block = strncmp(role, "cast_2d_", 8) == 0 ? 256 : 128; /* one 128 x 128 tile a block (and layer) */
            d->grid[0] = units > 0 ? (unsigned)((heads + 127) / 128) : 0;
            d->grid[1] = (unsigned)((n + 127) / 128);
        } else {
            return -1;
        }
        return 0;
    }
    if (strcmp(f, "ulysses") == 0) {
        int64_t C = get_int(k, "C"), R = get_int(k, "R"), T = get_int(k, "T"), nout = get_int(k, "NOUT");
        int64_t per_row = get_int(k, "ROW_BYTES") / get_int(k, "UNIT");
        int64_t units;
        if (strcmp(role, "pack") == 0 || strcmp(role, "unpack") == 0 || strcmp(role, "unpack_amax") == 0 ||
            strcmp(role, "unpack_copy") == 0)
            units = C * T * nout * per_row;
        else if (strcmp(role, "unpack_add") == 0) units = C / R * T * nout * per_row;
        else return -1;
        d->block = (unsigned)get_int(k, "BLOCK");
        d->grid[0] = blocks_for(units, d->block * get_int(k, "UNROLL"), 0);
        return 0;
    }
    if (strcmp(f, "attn_delta") == 0 || strcmp(f, "attn_merge") == 0) {
        if (strcmp(role, "fwd") && (strcmp(f, "attn_merge") || strcmp(role, "init"))) return -1;
        int64_t tpr = get_int(k, "TPR");
        d->block = (unsigned)get_int(k, "BLOCK");
        d->grid[0] = heads > 0 ? blocks_for(n * heads, d->block / tpr, 0) : 0;
        return 0;
    }
    return -1;
}

int64_t cp_k_scratch_bytes(const cp_kernel_spec *k, const char *role, int64_t n) {
    cp_kdims d;
    if (strcmp(k->family, "rmsnorm") == 0 && strcmp(role, "bwd") == 0) {
        if (cp_k_dims(k, role, n, 0, CP_KDIMS_MAX_SMS, &d)) return 0;
        return (int64_t)d.grid[0] * get_int(k, "HIDDEN") * 4;
    }
    if (strcmp(k->family, "adamw") == 0 && strcmp(role, "sumsq") == 0) {
        if (cp_k_dims(k, role, n, 0, CP_KDIMS_MAX_SMS, &d)) return 0;
        return (int64_t)d.grid[0] * 8;
    }
    return 0;
}
