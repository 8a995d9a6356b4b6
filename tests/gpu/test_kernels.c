/* test_kernels.c: every kernel family of gen/kernels.h (attention aside) emitted, JIT-compiled for this GPU and run
 * against the CPU references of tests/ref at several shapes: row counts that are not powers of two (1, 7, 1000,
 * 4097) and the shipped specs' sizes. Outputs are poisoned with NaN before each launch (so an element left unwritten
 * fails), inputs are fresh seeded random values. Each comparison prints what it compared and its relative error
 * ||gpu - ref|| / ||ref||; the table at the end lists the worst per kernel and shape with its bound.
 * The kernels that sum across blocks (rmsnorm's dweight, the loss sum, sumsq, embedding bwd_sorted) also run twice on
 * the same inputs, outputs and scratch poisoned in between, and must give the same bits both times ("repeat" rows:
 * 0 when equal). */
#include <fnmatch.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gpu_util.h"
#include "plan.h"
#include "ref/ref.h"
#include "util.h"

/* Bounds: fp32 results against float64 references, and bf16 outputs (one rounding is 2^-9 relative). */
#define TOL_F32 1e-5
#define TOL_F32_SUM 1e-4 /* fp32 sums of many terms in another order: dweight, dtable */
#define TOL_BF16 1e-2
#define TOL_ADAMW_STEP 1e-3

static const int64_t ROWS[] = {1, 7, 1000, 4097};
#define NROWS (int)(sizeof ROWS / sizeof ROWS[0])

static gu_rng rng;

static void *dev_copy(const void *host, size_t bytes) {
    void *d = gu_malloc(bytes);
    gu_upload(d, host, bytes);
    return d;
}

static void *host_copy(const void *p, size_t bytes) {
    void *h = malloc(bytes ? bytes : 1);
    memcpy(h, p, bytes);
    return h;
}

/* ---- embedding ---- */

typedef struct {
    int32_t tok, row;
} tok_row;

static int cmp_tok_row(const void *a, const void *b) {
    const tok_row *x = a, *y = b;
    return x->tok != y->tok ? (x->tok < y->tok ? -1 : 1) : (x->row > y->row) - (x->row < y->row);
}

/* The rows sorted by token, stably (ties by row), as bwd_sorted wants them; out-of-range tokens included. */
static int32_t *sorted_order(const int32_t *tok, int64_t n) {
    tok_row *p = malloc(sizeof *p * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) p[i] = (tok_row){tok[i], (int32_t)i};
    qsort(p, (size_t)n, sizeof *p, cmp_tok_row);
    int32_t *order = malloc(4 * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) order[i] = p[i].row;
    free(p);
    return order;
}

/* Error of a dtable after the backward: relative to the added gradient over the rows the in-range tokens touch; the
 * other rows must be left as they were (infinite error otherwise), and with exact, every value must equal the
 * reference's bit for bit. */
static double dtable_err(const float *gpu, const float *ref, const float *dt0, const int32_t *tok, int64_t n,
                         int64_t V, int64_t H, bool exact) {
    char *touched = calloc((size_t)V, 1);
    for (int64_t i = 0; i < n; i++)
        if (tok[i] >= 0 && tok[i] < V) touched[tok[i]] = 1;
    double num = 0, den = 0;
    int64_t changed = 0, differ = 0;
    for (int64_t v = 0; v < V; v++) {
        if (!touched[v]) {
            changed += memcmp(gpu + v * H, dt0 + v * H, 4 * (size_t)H) != 0;
            continue;
        }
        for (int64_t j = 0; j < H; j++) {
            double o = gpu[v * H + j], r = ref[v * H + j], i0 = dt0[v * H + j];
            num += (o - r) * (o - r);
            den += (r - i0) * (r - i0); /* relative to the added gradient, not to the initial values */
        }
        if (exact) differ += memcmp(gpu + v * H, ref + v * H, 4 * (size_t)H) != 0;
    }
    free(touched);
    double err = isnan(num) ? NAN : sqrt(num / den);
    if (changed) {
        printf("  %lld rows that no token names were changed\n", (long long)changed);
        err = INFINITY;
    }
    if (differ) {
        printf("  %lld rows differ from the sequential fp32 sum\n", (long long)differ);
        err = INFINITY;
    }
    return err;
}

/* One (vocab, hidden) module and table, several row counts. */
static void embedding_shape(int64_t V, int64_t H, const int64_t *rows, int nrows) {
    cp_kernel_spec k;
    cp_k_embedding(&k, V, H);
    gu_module *m = gu_build(&k);
    cp_kspec_free(&k);
    uint16_t *table = gu_rand_bf16(&rng, V * H, 1.0);
    float *dt0 = malloc(4 * (size_t)(V * H)), *dtgpu = malloc(4 * (size_t)(V * H)), *dtgpu2 = malloc(4 * (size_t)(V * H));
    for (int64_t i = 0; i < V * H; i++) dt0[i] = (float)(0.1 * gu_uniform(&rng));
    uint16_t *dtable = dev_copy(table, 2 * (size_t)(V * H));
    float *ddt = gu_malloc(4 * (size_t)(V * H));
    for (int c = 0; c < nrows; c++) {
        int64_t n = rows[c];
        char shape[96];
        snprintf(shape, sizeof shape, "v%lld h%lld n%lld", (long long)V, (long long)H, (long long)n);
        int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
        for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)(gu_next(&rng) % (uint64_t)V);
        if (n > 2) tok[n - 1] = tok[0]; /* a repeated token: bwd must add both rows */
        if (n > 3) tok[1] = (int32_t)(V - 1);
        uint16_t *out = malloc(2 * (size_t)(n * H)), *ref = malloc(2 * (size_t)(n * H));
        ref_embedding_fwd(tok, n, table, V, H, ref);
        int32_t *dtok = dev_copy(tok, 4 * (size_t)n);
        uint16_t *dout = gu_malloc(2 * (size_t)(n * H));
        gu_poison(dout, 2 * (size_t)(n * H));
        void *a[] = {&dtok, &dtable, &dout, &n};
        gu_run(m, "fwd", n, 0, a);
        gu_download(out, dout, 2 * (size_t)(n * H));
        gu_check("embedding_fwd", shape, gu_rel_err_bf16(out, ref, n * H), 0);

        /* bwd: dtable += dout rows, with tokens that repeat (a run longer than a warp's window from 1000 rows on)
         * and tokens outside [0, V), which are skipped */
        int32_t *tb = host_copy(tok, 4 * (size_t)n);
        for (int64_t i = 5; i < n; i += 5) tb[i] = tb[0];
        if (n > 4) tb[2] = -1, tb[3] = (int32_t)V;
        int32_t *order = sorted_order(tb, n);
        uint16_t *g = gu_rand_bf16(&rng, n * H, 1.0);
        float *dtref = host_copy(dt0, 4 * (size_t)(V * H));
        ref_embedding_bwd(tb, n, g, V, H, dtref);
        int32_t *dtb = dev_copy(tb, 4 * (size_t)n), *dord = dev_copy(order, 4 * (size_t)n);
        uint16_t *dg = dev_copy(g, 2 * (size_t)(n * H));
        gu_upload(ddt, dt0, 4 * (size_t)(V * H));
        void *b[] = {&dtb, &dg, &ddt, &n};
        gu_run(m, "bwd", n, 0, b);
        gu_download(dtgpu, ddt, 4 * (size_t)(V * H));
        gu_check("embedding_bwd.dtable", shape, dtable_err(dtgpu, dtref, dt0, tb, n, V, H, false), TOL_F32_SUM);

        /* bwd_sorted: the sequential sum in sorted (= row) order, so bit-identical to the reference, and to itself */
        void *bs[] = {&dtb, &dord, &dg, &ddt, &n};
        for (int rep = 0; rep < 2; rep++) {
            gu_upload(ddt, dt0, 4 * (size_t)(V * H));
            gu_run(m, "bwd_sorted", n, 0, bs);
            gu_download(rep ? dtgpu2 : dtgpu, ddt, 4 * (size_t)(V * H));
        }
        double err = dtable_err(dtgpu, dtref, dt0, tb, n, V, H, true);
        if (memcmp(dtgpu, dtgpu2, 4 * (size_t)(V * H))) {
            printf("  two runs of bwd_sorted differ\n");
            err = INFINITY;
        }
        gu_check("embedding_bwd_sorted.dtable", shape, err, TOL_F32_SUM);
        free(tb), free(order);
        gu_free_dev(dtb), gu_free_dev(dord);
        free(tok), free(out), free(ref), free(g), free(dtref);
        gu_free_dev(dtok), gu_free_dev(dout), gu_free_dev(dg);
    }
    free(table), free(dt0), free(dtgpu), free(dtgpu2);
    gu_free_dev(dtable), gu_free_dev(ddt);
    gu_free(m);
}

static void test_embedding(void **state) {
    (void)state;
    embedding_shape(512, 256, ROWS, NROWS);
    embedding_shape(128256, 2048, ROWS, NROWS);
    embedding_shape(1000, 3072, ROWS + 2, 1);
    embedding_shape(1000, 4096, ROWS + 3, 1);
    embedding_shape(1000, 5120, ROWS + 1, 1);
}

/* ---- a producer's own amax (fp8_amax.cuh) ---- */

/* A scale slot as the planner leaves it before a producer fills it: the scales poisoned, the running maximum and the
 * count of blocks 0. */
static float *amax_slot_new(void) {
    float *d = gu_malloc(CP_FP8_SLOT_BYTES);
    uint32_t init[CP_FP8_SLOT_BYTES / 4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    gu_upload(d, init, sizeof init);
    return d;
}

/* The slot a producer filled from the n values it wrote: exactly ref_fp8_amax's of them, with its counts and running
 * maxima left 0 (so that the next producer of the slot starts clean). */
static void amax_check(const char *name, const char *shape, const float *dslot, const uint16_t *wrote, int64_t n,
                       bool e5m2) {
    float slot[CP_FP8_SLOT_BYTES / 4], ref[3];
    gu_download(slot, dslot, sizeof slot);
    ref_fp8_amax(wrote, 1, n, n, e5m2, ref);
    uint32_t left[CP_FP8_SLOT_BYTES / 4 - 4];
    memcpy(left, slot + 4, sizeof left);
    int bad = !(ref[2] > 0);
    for (size_t j = 0; j < CP_ARRAY_LEN(left); j++) bad += left[j] != 0;
    for (int j = 0; j < 3; j++) bad += memcmp(&slot[j], &ref[j], 4) != 0;
    gu_check(name, shape, bad, 0);
}

/* ---- a producer's own FP8 copy (fp8_block.cuh) ---- */

/* A copy [rows][cols] and its 1 x 128 scales on the GPU, poisoned (NaN scales) */
typedef struct {
    uint8_t *copy;
    float *scales;
} copy_dev;

static copy_dev copy_dev_new(int64_t rows, int64_t cols) {
    copy_dev d = {gu_malloc((size_t)(rows * cols)), gu_malloc(4 * (size_t)(rows * (cols / 128)))};
    gu_poison(d.copy, (size_t)(rows * cols));
    gu_poison(d.scales, 4 * (size_t)(rows * (cols / 128)));
    return d;
}

/* The copy a producer wrote beside the values it stored (wrote, rows x cols): every byte and scale exactly the cast's
 * (ref_fp8_cast_block, 1 x 128 blocks as rows), the rows at row0 .. of a copy of `total` rows. Frees d. */
static void copy_check_at(const char *name, const char *shape, copy_dev d, const uint16_t *wrote, int64_t rows,
                          int64_t cols, bool e5m2, int64_t row0, int64_t total) {
    const int64_t nb = cols / 128, n = rows * cols;
    uint8_t *out = malloc((size_t)(total * cols)), *ref = malloc((size_t)n);
    float *sout = malloc(4 * (size_t)(total * nb)), *sref = malloc(4 * (size_t)(rows * nb));
    ref_fp8_cast_block(wrote, rows, cols, cols, e5m2, false, false, ref, sref);
    gu_download(out, d.copy, (size_t)(total * cols));
    gu_download(sout, d.scales, 4 * (size_t)(total * nb));
    int64_t diff = 0, sdiff = 0;
    for (int64_t i = 0; i < n; i++) diff += out[row0 * cols + i] != ref[i];
    for (int64_t b = 0; b < nb; b++)
        for (int64_t r = 0; r < rows; r++) sdiff += !(sout[b * total + row0 + r] == sref[b * rows + r]);
    char label[96];
    snprintf(label, sizeof label, "%s (bytes differing)", name);
    gu_check(label, shape, (double)diff, 0);
    snprintf(label, sizeof label, "%s (scales differing)", name);
    gu_check(label, shape, (double)sdiff, 0);
    free(out), free(ref), free(sout), free(sref);
    gu_free_dev(d.copy), gu_free_dev(d.scales);
}

/* The same of a copy of exactly the rows written */
static void copy_check(const char *name, const char *shape, copy_dev d, const uint16_t *wrote, int64_t rows,
                       int64_t cols, bool e5m2) {
    copy_check_at(name, shape, d, wrote, rows, cols, e5m2, 0, rows);
}

/* A producer's row-scaled copy on the GPU (train.fp8_scaling = "row"): the copy [rows][cols] and its scales f32[rows],
 * poisoned, and where maxima > 0 the transposed copy's column maxima f32[maxima][cols], zeroed as the plan's memset
 * leaves them */
typedef struct {
    uint8_t *copy;
    float *scales, *col_max;
    int maxima;
} row_dev;

/* The column maxima alone (a producer given no copy) */
static row_dev row_dev_maxima(int64_t cols, int maxima) {
    row_dev d = {NULL, NULL, NULL, maxima};
    if (maxima) {
        float *zero = calloc((size_t)(maxima * cols), 4);
        d.col_max = dev_copy(zero, 4 * (size_t)(maxima * cols));
        free(zero);
    }
    return d;
}

/* The copy, its scales and the column maxima */
static row_dev row_dev_new(int64_t rows, int64_t cols, int maxima) {
    row_dev d = row_dev_maxima(cols, maxima);
    d.copy = gu_malloc((size_t)(rows * cols));
    d.scales = gu_malloc(4 * (size_t)rows);
    gu_poison(d.copy, (size_t)(rows * cols));
    gu_poison(d.scales, 4 * (size_t)rows);
    return d;
}

/* The row-scaled copy a producer wrote beside the values it stored (wrote, rows x cols): every byte and scale exactly
 * cast_row's (ref_fp8_cast_row; none to compare where d has no copy), and the largest of the column maxima's rows each
 * column's largest |x| exactly, as cast_t_row reads them. Frees d. */
static void row_copy_check(const char *name, const char *shape, row_dev d, const uint16_t *wrote, int64_t rows,
                           int64_t cols, bool e5m2) {
    const int64_t n = rows * cols;
    uint8_t *out = malloc((size_t)n), *ref = malloc((size_t)n);
    float *sout = malloc(4 * (size_t)rows), *sref = malloc(4 * (size_t)rows);
    int64_t diff = 0, sdiff = 0, mdiff = 0;
    if (d.copy) {
        ref_fp8_cast_row(wrote, rows, cols, cols, e5m2, false, ref, sref);
        gu_download(out, d.copy, (size_t)n);
        gu_download(sout, d.scales, 4 * (size_t)rows);
        for (int64_t i = 0; i < n; i++) diff += out[i] != ref[i];
        for (int64_t r = 0; r < rows; r++) sdiff += !(sout[r] == sref[r]);
    }
    if (d.maxima) {
        float *m = malloc(4 * (size_t)(d.maxima * cols));
        gu_download(m, d.col_max, 4 * (size_t)(d.maxima * cols));
        for (int64_t c = 0; c < cols; c++) {
            float got = 0.0f, want = 0.0f;
            for (int k = 0; k < d.maxima; k++) got = fmaxf(got, m[k * cols + c]);
            for (int64_t r = 0; r < rows; r++) want = fmaxf(want, fabsf(bf16_to_f32(wrote[r * cols + c])));
            mdiff += !(got == want);
        }
        free(m);
        gu_free_dev(d.col_max);
    }
    char label[96];
    if (d.copy) {
        snprintf(label, sizeof label, "%s (bytes differing)", name);
        gu_check(label, shape, (double)diff, 0);
        snprintf(label, sizeof label, "%s (scales differing)", name);
        gu_check(label, shape, (double)sdiff, 0);
    }
    if (d.maxima) {
        snprintf(label, sizeof label, "%s (column maxima differing)", name);
        gu_check(label, shape, (double)mdiff, 0);
    }
    free(out), free(ref), free(sout), free(sref);
    gu_free_dev(d.copy), gu_free_dev(d.scales);
}

/* ---- rmsnorm ---- */

static void rmsnorm_case(gu_module *m, int64_t H, double eps, int64_t n, bool resid) {
    char shape[96];
    snprintf(shape, sizeof shape, "h%lld n%lld%s", (long long)H, (long long)n, resid ? " resid" : "");
    const size_t nb = 2 * (size_t)(n * H);
    uint16_t *x = gu_rand_bf16(&rng, n * H, 1.0), *res = resid ? gu_rand_bf16(&rng, n * H, 1.0) : NULL;
    uint16_t *w = gu_rand_bf16(&rng, H, 1.0);
    uint16_t *out = malloc(nb), *sum = malloc(nb), *rout = malloc(nb), *rsum = malloc(nb);
    float *rstd = malloc(4 * (size_t)n), *rrstd = malloc(4 * (size_t)n);
    ref_rmsnorm_fwd(x, res, rsum, w, rout, rrstd, n, H, eps);
    uint16_t *dx = dev_copy(x, nb), *dres = resid ? dev_copy(res, nb) : NULL, *dw = dev_copy(w, 2 * (size_t)H);
    uint16_t *dsum = resid ? gu_malloc(nb) : NULL, *dout = gu_malloc(nb);
    float *drstd = gu_malloc(4 * (size_t)n);
    gu_poison(dout, nb);
    gu_poison(drstd, 4 * (size_t)n);
    if (resid) gu_poison(dsum, nb);
    /* the cases with resid also take out's amax for E4M3 and dx's for E5M2; the others run fwd_copy where the kernel
     * can, writing out's FP8 copy (E5M2 for odd n, else E4M3) */
    const bool copies = !resid && cp_k_fp8_copies(&m->spec, "fwd"), copy_e5 = n % 2;
    float *dslot = resid ? amax_slot_new() : NULL, e4 = resid ? 448.0f : 0.0f, e5 = resid ? 57344.0f : 0.0f;
    float fmax_copy = copy_e5 ? 57344.0f : 448.0f;
    copy_dev cp = copies ? copy_dev_new(n, H) : (copy_dev){NULL, NULL};
    void *a[] = {&dx, &dres, &dsum, &dw, &dout, &drstd, &n, &dslot, &e4};
    void *ac[] = {&dx, &dres, &dsum, &dw, &dout, &drstd, &n, &fmax_copy, &cp.copy, &cp.scales};
    gu_run(m, copies ? "fwd_copy" : "fwd", n, 0, copies ? ac : a);
    gu_download(out, dout, nb);
    if (resid) amax_check("rmsnorm_fwd.amax", shape, dslot, out, n * H, false);
    if (copies) copy_check(copy_e5 ? "rmsnorm_fwd.copy e5m2" : "rmsnorm_fwd.copy e4m3", shape, cp, out, n, H, copy_e5);
    if (copies) { /* no out (cp_step_fp8_out.copy_only): the same copy alone */
        copy_dev alone = copy_dev_new(n, H);
        void *no_out = NULL;
        void *an[] = {&dx, &dres, &dsum, &dw, &no_out, &drstd, &n, &fmax_copy, &alone.copy, &alone.scales};
        gu_run(m, "fwd_copy", n, 0, an);
        copy_check("rmsnorm_fwd.copy alone", shape, alone, out, n, H, copy_e5);
    }
    gu_download(rstd, drstd, 4 * (size_t)n);
    gu_check("rmsnorm_fwd.out", shape, gu_rel_err_bf16(out, rout, n * H), TOL_BF16);
    gu_check("rmsnorm_fwd.rstd", shape, gu_rel_err_f32(rstd, rrstd, n), TOL_F32);
    if (resid) {
        gu_download(sum, dsum, nb);
        gu_check("rmsnorm_fwd.sum", shape, gu_rel_err_bf16(sum, rsum, n * H), 1e-6);
    }
    /* fwd_row where the kernel can: fwd's outputs to the bit, and out's row-scaled copy beside them (E5M2 for odd n,
     * else E4M3), with the column maxima over 3 rows of them but for n = 7; for n = 4097 those maxima alone */
    if (cp_k_fp8_row_copies(&m->spec, "fwd")) {
        uint16_t *out2 = malloc(nb), *sum2 = malloc(nb);
        float *rstd2 = malloc(4 * (size_t)n);
        gu_poison(dout, nb);
        gu_poison(drstd, 4 * (size_t)n);
        if (resid) gu_poison(dsum, nb);
        row_dev rd = n == 4097 ? row_dev_maxima(H, 3) : row_dev_new(n, H, n == 7 ? 0 : 3);
        void *ar[] = {&dx, &dres, &dsum, &dw, &dout, &drstd, &n, &fmax_copy, &rd.copy, &rd.scales, &rd.col_max,
                      &rd.maxima};
        gu_run(m, "fwd_row", n, 0, ar);
        gu_download(out2, dout, nb);
        gu_download(rstd2, drstd, 4 * (size_t)n);
        if (resid) gu_download(sum2, dsum, nb);
        gu_check("rmsnorm_fwd_row.out, rstd and sum as fwd's", shape,
                 memcmp(out2, out, nb) || memcmp(rstd2, rstd, 4 * (size_t)n) || (resid && memcmp(sum2, sum, nb)) ? 1.0
                                                                                                               : 0.0,
                 0);
        const char *what = !rd.copy ? "rmsnorm_fwd_row maxima alone"
                           : copy_e5 ? "rmsnorm_fwd_row e5m2" : "rmsnorm_fwd_row e4m3";
        row_copy_check(what, shape, rd, out2, n, H, copy_e5);
        if (n != 4097) { /* no out (cp_step_fp8_out.copy_only): the same copy and maxima alone */
            row_dev alone = row_dev_new(n, H, n == 7 ? 0 : 3);
            void *no_out = NULL;
            void *an[] = {&dx, &dres, &dsum, &dw, &no_out, &drstd, &n, &fmax_copy, &alone.copy, &alone.scales,
                          &alone.col_max, &alone.maxima};
            gu_run(m, "fwd_row", n, 0, an);
            row_copy_check("rmsnorm_fwd_row copy alone", shape, alone, out2, n, H, copy_e5);
        }
        free(out2), free(sum2), free(rstd2);
    }

    /* bwd on the normalised input (the sum with resid), with the reference rstd; with resid, dresid is added and
     * is passed as the same buffer as dx (in place), as the planner may */
    const uint16_t *xin = resid ? rsum : x;
    uint16_t *go = gu_rand_bf16(&rng, n * H, 1.0), *gres = resid ? gu_rand_bf16(&rng, n * H, 1.0) : NULL;
    float *dw0 = gu_rand_f32(&rng, H, 1.0), *dwref = host_copy(dw0, 4 * (size_t)H), *dwgpu = malloc(4 * (size_t)H);
    uint16_t *rdx = malloc(nb), *gdx = malloc(nb);
    ref_rmsnorm_bwd(go, xin, w, rrstd, gres, rdx, dwref, n, H);
    uint16_t *dgo = dev_copy(go, nb), *dxin = dev_copy(xin, nb), *ddx = resid ? dev_copy(gres, nb) : gu_malloc(nb);
    uint16_t *ddres = resid ? ddx : NULL;
    float *ddw = dev_copy(dw0, 4 * (size_t)H), *drs = dev_copy(rrstd, 4 * (size_t)n);
    /* the blocks' dweight rows: as many bytes as the planner gives the step, at least a row per block of the grid */
    const size_t pb = (size_t)cp_k_scratch_bytes(&m->spec, "bwd", n);
    int parts = (int)gu_dims(m, "bwd", n, 0).grid[0];
    if (pb < (size_t)parts * (size_t)H * 4) gu_fail("rmsnorm h%lld n%lld: scratch of %zu bytes for %d parts", (long long)H,
                                                    (long long)n, pb, parts);
    float *dpart = gu_malloc(pb);
    void *b[] = {&dgo, &dxin, &dw, &drs, &ddres, &ddx, &dpart, &n, &dslot, &e5};
    void *c[] = {&dpart, &parts, &ddw};
    /* calls: bwd then bwd_dw, three times into the same dweight (as the loss tiles, micro-batches and stages do), dx
     * and the parts poisoned (dx reset to dresid when in place) before each */
    float *dwrun[2] = {malloc(4 * (size_t)H), malloc(4 * (size_t)H)};
    uint16_t *dxrun[2] = {malloc(nb), malloc(nb)};
    for (int rep = 0; rep < 2; rep++) {
        gu_upload(ddw, dw0, 4 * (size_t)H);
        for (int call = 0; call < 3; call++) {
            if (resid) gu_upload(ddx, gres, nb);
            else gu_poison(ddx, nb);
            gu_poison(dpart, pb);
            gu_run(m, "bwd", n, 0, b);
            gu_run(m, "bwd_dw", n, 0, c);
            if (rep == 0 && call == 0) {
                gu_download(gdx, ddx, nb);
                gu_download(dwgpu, ddw, 4 * (size_t)H);
                gu_check("rmsnorm_bwd.dx", shape, gu_rel_err_bf16(gdx, rdx, n * H), TOL_BF16);
                if (resid) amax_check("rmsnorm_bwd.amax", shape, dslot, gdx, n * H, true);
                for (int64_t j = 0; j < H; j++) { /* compare what was added */
                    dwgpu[j] = (float)((double)dwgpu[j] - dw0[j]);
                    dwref[j] = (float)((double)dwref[j] - dw0[j]);
                }
                gu_check("rmsnorm_bwd.dweight", shape, gu_rel_err_f32(dwgpu, dwref, H), TOL_F32_SUM);
            }
        }
        gu_download(dwrun[rep], ddw, 4 * (size_t)H);
        gu_download(dxrun[rep], ddx, nb);
    }
    /* three calls added three times the first call's gradient (up to the sums' roundings) */
    for (int64_t j = 0; j < H; j++) {
        dwgpu[j] = (float)(((double)dwrun[0][j] - dw0[j]) / 3.0);
    }
    gu_check("rmsnorm_bwd.dweight x3", shape, gu_rel_err_f32(dwgpu, dwref, H), TOL_F32_SUM);
    gu_check("rmsnorm_bwd.repeat", shape,
             memcmp(dwrun[0], dwrun[1], 4 * (size_t)H) || memcmp(dxrun[0], dxrun[1], nb) ? 1.0 : 0.0, 0);
    /* bwd_copy and bwd_row where the kernel has them: bwd's dx and dweight rows to the bit, and dx's FP8 copy beside
     * them (E5M2 for odd n, else E4M3), with 1 x 128 scales or a scale per row and the column maxima over 2 rows (for
     * n = 1000 those maxima alone) */
    const size_t pw = (size_t)parts * (size_t)H * 4; /* the rows the grid writes */
    float *pbwd = malloc(pw), *ptwin = malloc(pw);
    gu_download(pbwd, dpart, pw); /* the last bwd call's */
    for (int row = 0; row < 2; row++) {
        if (!(row ? cp_k_fp8_row_copies(&m->spec, "bwd") : cp_k_fp8_copies(&m->spec, "bwd"))) continue;
        if (resid) gu_upload(ddx, gres, nb);
        else gu_poison(ddx, nb);
        gu_poison(dpart, pb);
        copy_dev bc = row ? (copy_dev){NULL, NULL} : copy_dev_new(n, H);
        row_dev rd = !row ? (row_dev){NULL, NULL, NULL, 0} : n == 1000 ? row_dev_maxima(H, 2) : row_dev_new(n, H, 2);
        void *bcopy[] = {&dgo, &dxin, &dw, &drs, &ddres, &ddx, &dpart, &n, &fmax_copy, &bc.copy, &bc.scales};
        void *brow[] = {&dgo, &dxin, &dw, &drs, &ddres, &ddx, &dpart, &n, &fmax_copy, &rd.copy, &rd.scales,
                        &rd.col_max, &rd.maxima};
        gu_run(m, row ? "bwd_row" : "bwd_copy", n, 0, row ? brow : bcopy);
        gu_download(gdx, ddx, nb);
        gu_download(ptwin, dpart, pw);
        gu_check(row ? "rmsnorm_bwd_row.dx and dweight rows as bwd's" : "rmsnorm_bwd_copy.dx and dweight rows as bwd's",
                 shape, memcmp(gdx, dxrun[1], nb) || memcmp(ptwin, pbwd, pw) ? 1.0 : 0.0, 0);
        if (row)
            row_copy_check(!rd.copy  ? "rmsnorm_bwd_row maxima alone"
                           : copy_e5 ? "rmsnorm_bwd_row e5m2" : "rmsnorm_bwd_row e4m3",
                           shape, rd, gdx, n, H, copy_e5);
        else
            copy_check(copy_e5 ? "rmsnorm_bwd.copy e5m2" : "rmsnorm_bwd.copy e4m3", shape, bc, gdx, n, H, copy_e5);
    }
    free(pbwd), free(ptwin);
    free(dwrun[0]), free(dwrun[1]), free(dxrun[0]), free(dxrun[1]);
    gu_free_dev(dpart);
    if (dslot) gu_free_dev(dslot);

    free(x), free(res), free(w), free(out), free(sum), free(rout), free(rsum), free(rstd), free(rrstd);
    free(go), free(gres), free(dw0), free(dwref), free(dwgpu), free(rdx), free(gdx);
    gu_free_dev(dx), gu_free_dev(dw), gu_free_dev(dout), gu_free_dev(drstd), gu_free_dev(dgo), gu_free_dev(dxin);
    gu_free_dev(ddx), gu_free_dev(ddw), gu_free_dev(drs);
    if (resid) gu_free_dev(dres), gu_free_dev(dsum);
}

static void test_rmsnorm(void **state) {
    (void)state;
    const int64_t H[] = {128, 256, 2048, 3072, 4096, 5120};
    for (size_t h = 0; h < sizeof H / sizeof H[0]; h++) {
        double eps = H[h] == 5120 || H[h] == 128 ? 1e-6 : 1e-5;
        cp_kernel_spec k;
        cp_k_rmsnorm(&k, H[h], eps);
        gu_module *m = gu_build(&k);
        cp_kspec_free(&k);
        for (int i = 0; i < NROWS; i++) {
            rmsnorm_case(m, H[h], eps, ROWS[i], false);
            rmsnorm_case(m, H[h], eps, ROWS[i], true);
        }
        gu_free(m);
    }
}

/* ---- rope ---- */

/* bwd_copy on x (n rows of nh heads) as one run at rows 3 .. of a copy of n + 3 rows (a ring's second run): bwd's
 * values (wrote) to the bit, and their FP8 copy and 1 x 128 scales in those rows exactly the cast's (E5M2 for odd
 * n, else E4M3) */
static void rope_copy_case(gu_module *m, const char *shape, const uint16_t *x, const uint16_t *wrote, int64_t n,
                           int64_t nh, int64_t D, void *pos_arg) {
    const int64_t row0 = 3, total = n + row0, cols = nh * D, cnt = n * cols;
    uint16_t *dx = dev_copy(x, 2 * (size_t)cnt), *out = malloc(2 * (size_t)cnt);
    copy_dev cp = copy_dev_new(total, cols);
    float fmax = n % 2 ? 57344.0f : 448.0f;
    int heads_arg = (int)nh;
    void *a[] = {&dx, &n, &heads_arg, pos_arg, &fmax, &cp.copy, &cp.scales, (void *)&row0, (void *)&total};
    gu_run(m, "bwd_copy", n, nh, a);
    gu_download(out, dx, 2 * (size_t)cnt);
    gu_check("rope_bwd_copy.dx as bwd's", shape, memcmp(out, wrote, 2 * (size_t)cnt) ? 1.0 : 0.0, 0);
    copy_check_at("rope_bwd_copy.copy", shape, cp, out, n, cols, n % 2, row0, total);
    free(out);
    gu_free_dev(dx);
}

/* rope with a position per row (cp_k_rope_positions): rows of documents of 1, 5, 300 and the rest tokens, the third
 * starting at 999,000 (a document position far from 0 still exact), fwd and bwd against the reference applied row by
 * row at each row's position. */
static void rope_positions(const cp_model *md, const double *inv) {
    cp_kernel_spec k;
    cp_k_rope(&k, md);
    cp_k_rope_positions(&k, true);
    gu_module *m = gu_build(&k);
    const bool copies = cp_k_fp8_copies(&k, "bwd");
    cp_kspec_free(&k);
    const int64_t D = md->head_dim, n = 1000, nh = 8, cnt = n * nh * D;
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t r = 0; r < n; r++)
        pos[r] = r < 1 ? 0 : r < 6 ? (int32_t)(r - 1) : r < 306 ? (int32_t)(999000 + r - 6) : (int32_t)(r - 306);
    int32_t *dpos = dev_copy(pos, sizeof(int32_t) * (size_t)n);
    for (int dir = 0; dir < 2; dir++) {
        uint16_t *x = gu_rand_bf16(&rng, cnt, 1.0), *ref = host_copy(x, 2 * (size_t)cnt), *out = malloc(2 * (size_t)cnt);
        for (int64_t r = 0; r < n; r++) ref_rope(ref + r * nh * D, 1, nh, D, pos[r], inv, dir == 1);
        uint16_t *dx = dev_copy(x, 2 * (size_t)cnt);
        int heads_arg = (int)nh;
        int64_t rows = n;
        void *a[] = {&dx, &rows, &heads_arg, &dpos};
        gu_run(m, dir ? "bwd" : "fwd", n, nh, a);
        gu_download(out, dx, 2 * (size_t)cnt);
        char shape[64];
        snprintf(shape, sizeof shape, "d%lld n%lld h%lld positions per row", (long long)D, (long long)n, (long long)nh);
        gu_check(dir ? "rope_bwd" : "rope_fwd", shape, gu_rel_err_bf16(out, ref, cnt), TOL_BF16);
        if (dir && copies) rope_copy_case(m, shape, x, out, n, nh, D, &dpos);
        free(x), free(ref), free(out);
        gu_free_dev(dx);
    }
    gu_free_dev(dpos);
    free(pos);
    gu_free(m);
}

static void rope_model(const char *name, int64_t D, double theta, bool scaled, double factor) {
    cp_model md;
    memset(&md, 0, sizeof md);
    md.head_dim = D;
    md.rope_theta = theta;
    md.rope_scaling = (cp_rope_scaling){scaled, factor, 1, 4, 8192};
    cp_kernel_spec k;
    cp_k_rope(&k, &md);
    gu_module *m = gu_build(&k);
    const bool copies = cp_k_fp8_copies(&k, "bwd");
    cp_kspec_free(&k);
    double *inv = malloc(sizeof(double) * (size_t)(D / 2));
    ref_rope_scaling sc = {scaled, factor, 1, 4, 8192};
    ref_rope_inv_freq(D, theta, &sc, inv); /* the reference's own table, not the generator's */
    const int64_t heads[] = {8, 32, 3};
    const int64_t pos0s[] = {0, 1000000};
    for (int i = 0; i < NROWS; i++)
        for (int h = 0; h < 3; h++)
            for (int p = 0; p < 2; p++) {
                int64_t n = ROWS[i], nh = heads[h], pos0 = pos0s[p] ? pos0s[p] - n / 2 : 0;
                if (n == 4097 && nh != 32) continue;
                char shape[96];
                snprintf(shape, sizeof shape, "%s d%lld n%lld h%lld pos%lld", name, (long long)D, (long long)n,
                         (long long)nh, (long long)pos0);
                const int64_t cnt = n * nh * D;
                for (int dir = 0; dir < 2; dir++) {
                    uint16_t *x = gu_rand_bf16(&rng, cnt, 1.0), *ref = host_copy(x, 2 * (size_t)cnt), *out = malloc(2 * (size_t)cnt);
                    ref_rope(ref, n, nh, D, pos0, inv, dir == 1);
                    uint16_t *dx = dev_copy(x, 2 * (size_t)cnt);
                    int heads_arg = (int)nh;
                    void *a[] = {&dx, &n, &heads_arg, &pos0};
                    gu_run(m, dir ? "bwd" : "fwd", n, nh, a);
                    gu_download(out, dx, 2 * (size_t)cnt);
                    gu_check(dir ? "rope_bwd" : "rope_fwd", shape, gu_rel_err_bf16(out, ref, cnt), TOL_BF16);
                    if (dir && copies) rope_copy_case(m, shape, x, out, n, nh, D, &pos0);
                    free(x), free(ref), free(out);
                    gu_free_dev(dx);
                }
            }
    /* positions from an array (packed documents): restarting at document starts, one of them 1 token long, and
     * far from 0 in the middle, against the reference row by row at each row's position */
    rope_positions(&md, inv);
    free(inv);
    gu_free(m);
}

static void test_rope(void **state) {
    (void)state;
    rope_model("llama8b", 128, 500000, true, 8);
    rope_model("llama1b", 64, 500000, true, 32);
    rope_model("qwen32b", 128, 1e6, false, 1);
}

/* ---- swiglu ---- */

/* swiglu's fwd and bwd with their outputs' amaxes; or with copies = "bwd_copy", "bwd_copy_gate" or "bwd_copy_up"
 * fwd_copy and that entry, writing the outputs' FP8 copies (out's and dup's E4M3, dgate's E5M2) */
static void swiglu_case(gu_module *m, int64_t F, int64_t n, const char *copies) {
    char shape[96];
    snprintf(shape, sizeof shape, "f%lld n%lld%s%s", (long long)F, (long long)n, copies ? " " : "", copies ? copies : "");
    const bool gate_copy = copies && strcmp(copies, "bwd_copy_up"), up_copy = copies && strcmp(copies, "bwd_copy_gate");
    const int64_t cnt = n * F;
    const size_t nb = 2 * (size_t)cnt;
    uint16_t *g = gu_rand_bf16(&rng, cnt, 2.0), *u = gu_rand_bf16(&rng, cnt, 1.0), *ref = malloc(nb), *out = malloc(nb);
    ref_swiglu_fwd(g, u, ref, cnt);
    uint16_t *dg = dev_copy(g, nb), *du = dev_copy(u, nb), *dout = gu_malloc(nb);
    gu_poison(dout, nb);
    /* out's amax for E4M3, dgate's and dup's for E5M2; or their copies */
    float *dslot[3] = {NULL, NULL, NULL}, e4 = 448.0f, e5 = 57344.0f, none = 0.0f;
    copy_dev cp[3] = {{NULL, NULL}, {NULL, NULL}, {NULL, NULL}};
    for (int j = 0; j < 3; j++)
        if (!copies) dslot[j] = amax_slot_new();
        else if (j == 0 || (j == 1 && gate_copy) || (j == 2 && up_copy)) cp[j] = copy_dev_new(n, F);
    void *a[] = {&dg, &du, &dout, &n, &dslot[0], &e4};
    void *ac[] = {&dg, &du, &dout, &n, &e4, &cp[0].copy, &cp[0].scales};
    gu_run(m, copies ? "fwd_copy" : "fwd", n, 0, copies ? ac : a);
    gu_download(out, dout, nb);
    gu_check("swiglu_fwd", shape, gu_rel_err_bf16(out, ref, cnt), TOL_BF16);
    if (copies) copy_check("swiglu_fwd.copy e4m3", shape, cp[0], out, n, F, false);
    else amax_check("swiglu_fwd.amax", shape, dslot[0], out, cnt, false);
    if (copies) { /* no out (cp_step_fp8_out.copy_only): the same copy alone */
        copy_dev alone = copy_dev_new(n, F);
        void *no_out = NULL;
        void *an[] = {&dg, &du, &no_out, &n, &e4, &alone.copy, &alone.scales};
        gu_run(m, "fwd_copy", n, 0, an);
        copy_check("swiglu_fwd.copy alone", shape, alone, out, n, F, false);
    }
    uint16_t *dy = gu_rand_bf16(&rng, cnt, 1.0), *rg = host_copy(g, nb), *ru = host_copy(u, nb);
    ref_swiglu_bwd(dy, rg, ru, cnt);
    uint16_t *ddy = dev_copy(dy, nb);
    void *b[] = {&ddy, &dg, &du, &n, &dslot[1], &e5, &dslot[2], &e5};
    void *bc[] = {&ddy, &dg, &du, &n, gate_copy ? &e5 : &none, &cp[1].copy, &cp[1].scales, up_copy ? &e4 : &none,
                  &cp[2].copy, &cp[2].scales};
    gu_run(m, copies ? copies : "bwd", n, 0, copies ? bc : b);
    gu_download(out, dg, nb);
    gu_check("swiglu_bwd.dgate", shape, gu_rel_err_bf16(out, rg, cnt), TOL_BF16);
    if (gate_copy) copy_check("swiglu_bwd.dgate copy e5m2", shape, cp[1], out, n, F, true);
    else if (!copies) amax_check("swiglu_bwd.dgate amax", shape, dslot[1], out, cnt, true);
    gu_download(out, du, nb);
    gu_check("swiglu_bwd.dup", shape, gu_rel_err_bf16(out, ru, cnt), TOL_BF16);
    if (up_copy) copy_check("swiglu_bwd.dup copy e4m3", shape, cp[2], out, n, F, false);
    else if (!copies) amax_check("swiglu_bwd.dup amax", shape, dslot[2], out, cnt, true);
    for (int j = 0; j < 3; j++)
        if (dslot[j]) gu_free_dev(dslot[j]);
    free(g), free(u), free(ref), free(out), free(dy), free(rg), free(ru);
    gu_free_dev(dg), gu_free_dev(du), gu_free_dev(dout), gu_free_dev(ddy);
}

/* fwd_row and bwd_row: the outputs of fwd and bwd to the bit, and their row-scaled copies with the column maxima (out's
 * and dup's E4M3, dgate's E5M2; over 1 row of maxima for odd n, else 5); `which` of the gradients copied: 3 both (and
 * out's maxima alone), 1 dgate's (and dup's maxima alone), 2 dup's */
static void swiglu_row_case(gu_module *m, int64_t F, int64_t n, int which) {
    char shape[96];
    snprintf(shape, sizeof shape, "f%lld n%lld row copies %d", (long long)F, (long long)n, which);
    const int64_t cnt = n * F;
    const size_t nb = 2 * (size_t)cnt;
    uint16_t *g = gu_rand_bf16(&rng, cnt, 2.0), *u = gu_rand_bf16(&rng, cnt, 1.0), *dy = gu_rand_bf16(&rng, cnt, 1.0);
    uint16_t *want = malloc(nb), *got = malloc(nb), *want_u = malloc(nb);
    uint16_t *dg = dev_copy(g, nb), *du = dev_copy(u, nb), *dout = gu_malloc(nb), *ddy = dev_copy(dy, nb);
    float *none = NULL, e4 = 448.0f, e5 = 57344.0f, zero = 0.0f;
    const int maxima = n % 2 ? 1 : 5;
    void *a[] = {&dg, &du, &dout, &n, &none, &zero};
    gu_run(m, "fwd", n, 0, a);
    gu_download(want, dout, nb);
    gu_poison(dout, nb);
    row_dev ro = which == 3 ? row_dev_maxima(F, maxima) : row_dev_new(n, F, maxima);
    void *ar[] = {&dg, &du, &dout, &n, &e4, &ro.copy, &ro.scales, &ro.col_max, &ro.maxima};
    gu_run(m, "fwd_row", n, 0, ar);
    gu_download(got, dout, nb);
    gu_check("swiglu_fwd_row.out as fwd's", shape, memcmp(got, want, nb) ? 1.0 : 0.0, 0);
    row_copy_check(which == 3 ? "swiglu_fwd_row maxima alone" : "swiglu_fwd_row e4m3", shape, ro, got, n, F, false);
    if (which != 3) { /* no out (cp_step_fp8_out.copy_only): the same copy and maxima alone */
        row_dev alone = row_dev_new(n, F, maxima);
        void *no_out = NULL;
        void *an[] = {&dg, &du, &no_out, &n, &e4, &alone.copy, &alone.scales, &alone.col_max, &alone.maxima};
        gu_run(m, "fwd_row", n, 0, an);
        row_copy_check("swiglu_fwd_row copy alone", shape, alone, got, n, F, false);
    }
    /* bwd in place on gate and up: bwd's outputs first, then bwd_row's from the same inputs */
    void *b[] = {&ddy, &dg, &du, &n, &none, &zero, &none, &zero};
    gu_run(m, "bwd", n, 0, b);
    gu_download(want, dg, nb);
    gu_download(want_u, du, nb);
    gu_upload(dg, g, nb);
    gu_upload(du, u, nb);
    row_dev rg = (which & 1) ? row_dev_new(n, F, maxima) : (row_dev){NULL, NULL, NULL, 1};
    row_dev ru = (which & 2) ? row_dev_new(n, F, maxima) : row_dev_maxima(F, maxima);
    float *fg = (which & 1) ? &e5 : &zero, *fu = (which & 2) ? &e4 : &zero;
    int store = 3; /* dgate and dup */
    void *br[] = {&ddy, &dg, &du, &n, fg, &rg.copy, &rg.scales, &rg.col_max, &rg.maxima, fu, &ru.copy, &ru.scales,
                  &ru.col_max, &ru.maxima, &store};
    if (which == 3) { /* first storing neither (cp_step_fp8_out.copy_only): gate and up as they were, the same copies */
        row_dev ag = row_dev_new(n, F, maxima), au = row_dev_new(n, F, maxima);
        int none_stored = 0;
        void *bn[] = {&ddy, &dg, &du, &n, fg, &ag.copy, &ag.scales, &ag.col_max, &ag.maxima, fu, &au.copy, &au.scales,
                      &au.col_max, &au.maxima, &none_stored};
        gu_run(m, "bwd_row", n, 0, bn);
        gu_download(got, dg, nb);
        bool kept = !memcmp(got, g, nb);
        gu_download(got, du, nb);
        kept = kept && !memcmp(got, u, nb);
        gu_check("swiglu_bwd_row storing neither: gate and up as they were", shape, kept ? 0.0 : 1.0, 0);
        row_copy_check("swiglu_bwd_row dgate copy alone", shape, ag, want, n, F, true);
        row_copy_check("swiglu_bwd_row dup copy alone", shape, au, want_u, n, F, false);
    }
    gu_run(m, "bwd_row", n, 0, br);
    gu_download(got, dg, nb);
    bool same = !memcmp(got, want, nb);
    if (which & 1) row_copy_check("swiglu_bwd_row dgate e5m2", shape, rg, got, n, F, true);
    gu_download(got, du, nb);
    same = same && !memcmp(got, want_u, nb);
    row_copy_check(which & 2 ? "swiglu_bwd_row dup e4m3" : "swiglu_bwd_row dup maxima alone", shape, ru, got, n, F,
                   false);
    gu_check("swiglu_bwd_row.dgate and dup as bwd's", shape, same ? 0.0 : 1.0, 0);
    free(g), free(u), free(dy), free(want), free(got), free(want_u);
    gu_free_dev(dg), gu_free_dev(du), gu_free_dev(dout), gu_free_dev(ddy);
}

static void test_swiglu(void **state) {
    (void)state;
    const int64_t F[] = {8192, 14336, 25600};
    for (int f = 0; f < 3; f++) {
        cp_kernel_spec k;
        cp_k_swiglu(&k, F[f]);
        gu_module *m = gu_build(&k);
        cp_kspec_free(&k);
        for (int i = 0; i < NROWS; i++)
            if (ROWS[i] < 4097 || F[f] == 8192) {
                /* every other case with copies, through the three entries in turn */
                static const char *const entries[] = {"bwd_copy", "bwd_copy_gate", "bwd_copy_up"};
                static int turn;
                bool copies = i % 2 && cp_k_fp8_copies(&m->spec, "fwd");
                swiglu_case(m, F[f], ROWS[i], copies ? entries[turn++ % 3] : NULL);
                if (cp_k_fp8_row_copies(&m->spec, "bwd")) swiglu_row_case(m, F[f], ROWS[i], 1 + turn++ % 3);
            }
        gu_free(m);
    }
}

/* ---- loss ---- */

static void loss_case(gu_module *m, int64_t V, int64_t n) {
    char shape[96];
    snprintf(shape, sizeof shape, "v%lld n%lld", (long long)V, (long long)n);
    const int64_t cnt = n * V;
    const size_t nb = 2 * (size_t)cnt;
    uint16_t *x = gu_rand_bf16(&rng, cnt, 3.0), *ref = host_copy(x, nb), *out = malloc(nb);
    int32_t *t = malloc(4 * (size_t)n);
    int64_t counted = 0;
    for (int64_t i = 0; i < n; i++) {
        t[i] = (int32_t)(gu_next(&rng) % (uint64_t)V);
        if (i == 1) t[i] = -1;   /* ignored */
        if (i == 3) t[i] = -100; /* ignored, HF's ignore_index */
        if (i == 2) t[i] = (int32_t)(V - 1);
        if (i == 4) t[i] = 0;
        counted += t[i] >= 0;
    }
    float scale = 1.0f / (float)(counted ? counted : 1);
    double lref = ref_loss(ref, t, n, V, scale);
    const float l0 = 1.25f;
    uint16_t *dx = dev_copy(x, nb);
    int32_t *dt = dev_copy(t, 4 * (size_t)n);
    float *dl = dev_copy(&l0, 4), *drow = gu_malloc(4 * (size_t)n), lg;
    gu_poison(drow, 4 * (size_t)n);
    void *a[] = {&dx, &dt, &drow, &scale, &n};
    void *b[] = {&drow, &n, &dl};
    gu_run(m, "fwdbwd", n, 0, a);
    gu_run(m, "sum", n, 0, b);
    gu_download(out, dx, nb);
    gu_download(&lg, dl, 4);
    float lgot = (float)((double)lg - l0), lwant = (float)lref;
    gu_check("loss.loss_sum", shape, counted ? gu_rel_err_f32(&lgot, &lwant, 1) : fabs(lgot), TOL_F32);
    gu_check("loss.dlogits", shape, gu_rel_err_bf16(out, ref, cnt), TOL_BF16);
    /* again on the same logits, the outputs poisoned: the same bits (row losses, their sum, the gradient) */
    float *rows = malloc(4 * (size_t)n), *rows2 = malloc(4 * (size_t)n), lg2;
    uint16_t *out2 = malloc(nb);
    gu_download(rows, drow, 4 * (size_t)n);
    gu_upload(dx, x, nb);
    gu_upload(dl, &l0, 4);
    gu_poison(drow, 4 * (size_t)n);
    gu_run(m, "fwdbwd", n, 0, a);
    gu_run(m, "sum", n, 0, b);
    gu_download(out2, dx, nb);
    gu_download(&lg2, dl, 4);
    gu_download(rows2, drow, 4 * (size_t)n);
    gu_check("loss.repeat", shape,
             memcmp(&lg, &lg2, 4) || memcmp(rows, rows2, 4 * (size_t)n) || memcmp(out, out2, nb) ? 1.0 : 0.0, 0);
    free(rows), free(rows2), free(out2);
    gu_free_dev(drow);
    /* the small entries alone (the targets' -1 dominate the norm above) */
    for (int64_t i = 0; i < n; i++)
        if (t[i] >= 0) out[i * V + t[i]] = ref[i * V + t[i]] = 0;
    gu_check("loss.dlogits_nontarget", shape, gu_rel_err_bf16(out, ref, cnt), TOL_BF16);
    free(x), free(ref), free(out), free(t);
    gu_free_dev(dx), gu_free_dev(dt), gu_free_dev(dl);
}

static void test_loss(void **state) {
    (void)state;
    const int64_t V[] = {512, 128256, 151936};
    const int64_t N[] = {1, 7, 33};
    for (int v = 0; v < 3; v++) {
        cp_kernel_spec k;
        cp_k_loss(&k, V[v]);
        gu_module *m = gu_build(&k);
        cp_kspec_free(&k);
        for (int i = 0; i < 3; i++) loss_case(m, V[v], N[i]);
        if (V[v] == 512) loss_case(m, V[v], 4097);
        gu_free(m);
    }
}

/* ---- adamw ---- */

static void adamw_case(gu_module *m, int64_t n, int off, int step) {
    char shape[96];
    snprintf(shape, sizeof shape, "n%lld step%d%s", (long long)n, step, off ? " unaligned" : "");
    const int64_t N = n + off;
    float *p = gu_rand_f32(&rng, N, 0.02), *mm = gu_rand_f32(&rng, N, 1e-4), *v = gu_rand_f32(&rng, N, 1e-6);
    float *g = gu_rand_f32(&rng, N, 1e-3);
    for (int64_t i = 0; i < N; i++) v[i] = v[i] * v[i] * 1e6f; /* second moments are positive */
    float *rp = host_copy(p, 4 * (size_t)N), *rm = host_copy(mm, 4 * (size_t)N), *rv = host_copy(v, 4 * (size_t)N);
    uint16_t *rb = malloc(2 * (size_t)N), *gb = malloc(2 * (size_t)N);
    const float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.7f;
    ref_adamw(rp + off, rm + off, rv + off, g + off, rb + off, n, lr, b1, b2, eps, wd, gs, step);
    float *dp = dev_copy(p, 4 * (size_t)N), *dm = dev_copy(mm, 4 * (size_t)N), *dv = dev_copy(v, 4 * (size_t)N);
    float *dg = dev_copy(g, 4 * (size_t)N);
    uint16_t *db = gu_malloc(2 * (size_t)N);
    gu_poison(db, 2 * (size_t)N);
    float *ap = dp + off, *am = dm + off, *av = dv + off, *ag = dg + off;
    uint16_t *abf = db + off;
    void *a[] = {&ap, &am, &av, &ag, &abf, &n, (void *)&lr, (void *)&b1, (void *)&b2, (void *)&eps, (void *)&wd,
                 (void *)&gs, &step};
    gu_run(m, "update", n, 0, a);
    float *gp = malloc(4 * (size_t)N), *gm = malloc(4 * (size_t)N), *gv = malloc(4 * (size_t)N);
    gu_download(gp, dp, 4 * (size_t)N);
    gu_download(gm, dm, 4 * (size_t)N);
    gu_download(gv, dv, 4 * (size_t)N);
    gu_download(gb, db, 2 * (size_t)N);
    gu_check("adamw.master", shape, gu_rel_err_f32(gp + off, rp + off, n), TOL_F32);
    gu_check("adamw.m", shape, gu_rel_err_f32(gm + off, rm + off, n), TOL_F32);
    gu_check("adamw.v", shape, gu_rel_err_f32(gv + off, rv + off, n), TOL_F32);
    gu_check("adamw.param_bf16", shape, gu_rel_err_bf16(gb + off, rb + off, n), TOL_BF16);
    /* the step itself, new - old, per element: the new master weight is rounded to fp32, so the step taken carries
     * up to half an fp32 ulp of the weight beside its own rounding. A step of lr's size (1e-4 to 1e-3) against a
     * weight near 0.02 makes that about 3e-5 of it; a small one (a moment near 0) can make it more, so each element's
     * error is measured in units of 1e-3 of its step plus one ulp of its weight: the worst must be at most 1 */
    double worst = 0;
    for (int64_t i = off; i < N; i++) {
        double gs_ = (double)gp[i] - p[i], rs = (double)rp[i] - p[i];
        double unit = TOL_ADAMW_STEP * fabs(rs) + ldexp(fabs((double)rp[i]), -23);
        double e = fabs(gs_ - rs) / unit;
        if (!(e <= worst)) worst = e; /* NaN propagates */
    }
    gu_check("adamw.update (per element)", shape, worst, 1.0);
    if (off && (memcmp(&gp[0], &p[0], 4) || gb[0] != 0xFFFF)) gu_fail("adamw %s wrote before its arrays", shape);
    free(p), free(mm), free(v), free(g), free(rp), free(rm), free(rv), free(rb), free(gb), free(gp), free(gm), free(gv);
    gu_free_dev(dp), gu_free_dev(dm), gu_free_dev(dv), gu_free_dev(dg), gu_free_dev(db);
}

static void sumsq_case(gu_module *m, int64_t n, int off) {
    char shape[96];
    snprintf(shape, sizeof shape, "n%lld%s", (long long)n, off ? " unaligned" : "");
    float *g = gu_rand_f32(&rng, n + off, 1e-2);
    /* out += sum: start from a value of the sum's own size, so fp32 rounding of the total stays ~1e-7 of it */
    const double sum = ref_sumsq(g + off, n);
    const float o0 = (float)sum;
    float want = (float)(sum + o0), got;
    /* the blocks' partials: as many bytes as the planner gives the step; the counter starts (and must end) at 0 */
    const size_t pb = (size_t)cp_k_scratch_bytes(&m->spec, "sumsq", n);
    if (pb < (size_t)gu_dims(m, "sumsq", n, 0).grid[0] * 8) gu_fail("sumsq %s: scratch of %zu bytes", shape, pb);
    const unsigned zero = 0;
    float *dg = dev_copy(g, 4 * (size_t)(n + off)), *dout = dev_copy(&o0, 4), *ag = dg + off;
    double *dpart = gu_malloc(pb);
    unsigned *dcnt = dev_copy(&zero, 4), cnt;
    void *a[] = {&ag, &n, &dpart, &dcnt, &dout};
    gu_poison(dpart, pb);
    gu_run(m, "sumsq", n, 0, a);
    gu_download(&got, dout, 4);
    gu_check("adamw_sumsq", shape, gu_rel_err_f32(&got, &want, 1), TOL_F32);
    gu_download(&cnt, dcnt, 4);
    if (cnt != 0) gu_fail("sumsq %s: the counter is %u after the launch, not 0", shape, cnt);
    /* twice more into the same out, twice over from o0 (partials poisoned before each launch): the same bits */
    float twice[2];
    for (int rep = 0; rep < 2; rep++) {
        gu_upload(dout, &o0, 4);
        for (int call = 0; call < 2; call++) {
            gu_poison(dpart, pb);
            gu_run(m, "sumsq", n, 0, a);
        }
        gu_download(&twice[rep], dout, 4);
    }
    gu_download(&cnt, dcnt, 4);
    gu_check("adamw_sumsq.repeat", shape, memcmp(&twice[0], &twice[1], 4) || cnt != 0 ? 1.0 : 0.0, 0);
    free(g);
    gu_free_dev(dg), gu_free_dev(dout), gu_free_dev(dpart), gu_free_dev(dcnt);
}

static void test_adamw(void **state) {
    (void)state;
    cp_kernel_spec k;
    cp_k_adamw(&k);
    gu_module *m = gu_build(&k);
    cp_kspec_free(&k);
    const int64_t N[] = {1, 7, 1000, 4097, (1 << 20) + 3};
    for (int i = 0; i < 5; i++) {
        adamw_case(m, N[i], 0, 1);
        adamw_case(m, N[i], 0, 1000);
        adamw_case(m, N[i], 1, 7);
        sumsq_case(m, N[i], 0);
        sumsq_case(m, N[i], 1);
    }
    sumsq_case(m, (1 << 26) + 5, 0);
    gu_free(m);
}

/* ---- ulysses ---- */

static void ulysses_case(int C, int R, int64_t T, int nout, int64_t rb, int64_t extra_heads) {
    cp_kernel_spec k;
    cp_k_ulysses(&k, C, R, T, nout, rb);
    gu_module *m = gu_build(&k);
    const bool copies = cp_k_fp8_copies(&k, "unpack");
    cp_kspec_free(&k);
    char shape[96];
    snprintf(shape, sizeof shape, "c%d r%d t%lld n%d b%lld stride+%lld", C, R, (long long)T, nout, (long long)rb,
             (long long)extra_heads);
    /* the source rows hold NIN heads plus extra_heads more (a stage's columns inside a wider buffer) */
    const int64_t nin = (int64_t)C / R * nout, stride = (nin + extra_heads) * rb;
    const size_t sb = (size_t)(T * stride), pb = (size_t)((int64_t)C * T * nout * rb);
    uint16_t *src = gu_rand_bf16(&rng, (int64_t)sb / 2, 1.0);
    uint8_t *ref = malloc(pb), *out = malloc(pb);
    ref_ulysses_pack(src, stride, ref, C, R, T, nout, rb);
    uint8_t *dsrc = dev_copy(src, sb), *dpk = gu_malloc(pb);
    gu_poison(dpk, pb);
    void *a[] = {&dsrc, (void *)&stride, &dpk};
    gu_run(m, "pack", 0, 0, a);
    gu_download(out, dpk, pb);
    gu_check("ulysses_pack", shape, memcmp(out, ref, pb) ? 1.0 : 0.0, 0);

    /* unpack (R = 1): from a packed receive buffer back into the stage's columns of a poisoned wide buffer */
    uint16_t *recv = gu_rand_bf16(&rng, (int64_t)pb / 2, 1.0);
    uint8_t *dst = malloc(sb), *gdst = malloc(sb);
    uint8_t *drecv = dev_copy(recv, pb), *ddst = gu_malloc(sb);
    if (R == 1) {
        memset(dst, 0xFF, sb);
        ref_ulysses_unpack(recv, dst, stride, C, T, nout, rb);
        gu_poison(ddst, sb);
        void *b[] = {&drecv, &ddst, (void *)&stride};
        gu_run(m, "unpack", 0, 0, b);
        gu_download(gdst, ddst, sb);
        gu_check("ulysses_unpack", shape, memcmp(gdst, dst, sb) ? 1.0 : 0.0, 0);
        /* unpack_amax (bf16 rows): unpack's bytes, and their amax in a scale slot (E5M2's scales for odd T, else
         * E4M3's) */
        if (rb % 2 == 0) {
            float *dslot = amax_slot_new(), fmax = T % 2 ? 57344.0f : 448.0f;
            gu_poison(ddst, sb);
            void *ba[] = {&drecv, &ddst, (void *)&stride, &dslot, &fmax};
            gu_run(m, "unpack_amax", 0, 0, ba);
            gu_download(gdst, ddst, sb);
            gu_check("ulysses_unpack_amax", shape, memcmp(gdst, dst, sb) ? 1.0 : 0.0, 0);
            amax_check("ulysses_unpack_amax.amax", shape, dslot, recv, (int64_t)pb / 2, T % 2);
            gu_free_dev(dslot);
        }
        /* unpack_copy where the kernel can, onto whole rows (the attention output's): unpack's bytes, and their FP8
         * copy (E5M2 for odd T, else E4M3) */
        if (copies && extra_heads == 0) {
            const int64_t cols = stride / 2;
            float fmax = T % 2 ? 57344.0f : 448.0f;
            copy_dev cp = copy_dev_new(T, cols);
            gu_poison(ddst, sb);
            void *bc[] = {&drecv, &ddst, (void *)&stride, &fmax, &cp.copy, &cp.scales};
            gu_run(m, "unpack_copy", 0, 0, bc);
            gu_download(gdst, ddst, sb);
            gu_check("ulysses_unpack_copy", shape, memcmp(gdst, dst, sb) ? 1.0 : 0.0, 0);
            copy_check(T % 2 ? "ulysses_unpack_copy.copy e5m2" : "ulysses_unpack_copy.copy e4m3", shape, cp,
                       (const uint16_t *)gdst, T, cols, T % 2);
        }
    }
    /* unpack_add: dst += the replicas' sum (bf16) */
    uint16_t *d0 = gu_rand_bf16(&rng, (int64_t)sb / 2, 1.0);
    memcpy(dst, d0, sb);
    ref_ulysses_unpack_add(recv, dst, stride, C, R, T, nout, rb);
    gu_upload(ddst, d0, sb);
    void *c[] = {&drecv, &ddst, (void *)&stride};
    gu_run(m, "unpack_add", 0, 0, c);
    gu_download(gdst, ddst, sb);
    gu_check("ulysses_unpack_add", shape, gu_rel_err_bf16((uint16_t *)gdst, (uint16_t *)dst, (int64_t)sb / 2), TOL_BF16);
    free(src), free(ref), free(out), free(recv), free(dst), free(gdst), free(d0);
    gu_free_dev(dsrc), gu_free_dev(dpk), gu_free_dev(drecv), gu_free_dev(ddst);
    gu_free(m);
}

static void test_ulysses(void **state) {
    (void)state;
    ulysses_case(8, 1, 1000, 4, 256, 0);   /* q, d128 bf16, 8 ranks */
    ulysses_case(8, 1, 7, 4, 4, 28);       /* delta rows of 4 bytes inside [T][32 heads] fp32 */
    ulysses_case(8, 2, 1000, 1, 256, 0);   /* KV heads replicated over 2 ranks */
    ulysses_case(1, 1, 4097, 8, 256, 24);  /* one rank: a stage's 8 heads out of 32 */
    ulysses_case(2, 1, 1, 3, 128, 2);      /* d64, odd head counts */
    ulysses_case(4, 4, 33, 2, 128, 0);     /* every rank a replica */
    ulysses_case(1, 1, 4097, 24, 256, 0);  /* one rank, one stage: the 3B's attention output, with its FP8 copy */
    ulysses_case(2, 1, 1000, 8, 128, 0);   /* d64: a 1 x 128 block spans two heads */
}

/* ---- cast ---- */

static void test_cast(void **state) {
    (void)state;
    cp_kernel_spec k;
    cp_k_cast(&k);
    gu_module *m = gu_build(&k);
    cp_kspec_free(&k);
    const int64_t N[] = {1, 7, 1000, 4097, (1 << 22) + 1};
    for (int i = 0; i < 5; i++)
        for (int off = 0; off < 2; off++) {
            int64_t n = N[i];
            char shape[96];
            snprintf(shape, sizeof shape, "n%lld%s", (long long)n, off ? " unaligned" : "");
            float *s = gu_rand_f32(&rng, n + off, 10.0);
            uint16_t *ref = malloc(2 * (size_t)(n + off)), *out = malloc(2 * (size_t)(n + off));
            ref_cast_f32_to_bf16(s + off, ref + off, n);
            float *ds = dev_copy(s, 4 * (size_t)(n + off)), *as = ds + off;
            uint16_t *dd = gu_malloc(2 * (size_t)(n + off)), *ad = dd + off;
            gu_poison(dd, 2 * (size_t)(n + off));
            void *a[] = {&as, &ad, &n};
            gu_run(m, "f32_to_bf16", n, 0, a);
            gu_download(out, dd, 2 * (size_t)(n + off));
            gu_check("cast_f32_to_bf16", shape, memcmp(out + off, ref + off, 2 * (size_t)n) ? 1.0 : 0.0, 0);
            free(s), free(ref), free(out);
            gu_free_dev(ds), gu_free_dev(dd);
        }
    gu_free(m);
}

/* ---- fp8 ---- */

/* The fp8 module's kernels, built for this GPU */
static gu_module *fp8_module(void) {
    cp_kernel_spec k;
    cp_k_fp8(&k);
    gu_module *m = gu_build(&k);
    cp_kspec_free(&k);
    return m;
}

/* amax then cast of a strided bf16 [rows][cols] (row stride ld) to E4M3 or E5M2, as rows or transposed: the slot
 * against the CPU's amax and scales (exact: a maximum and one division), every byte against the CPU's encoding with
 * the kernel's own scale (exact). The counter must be left 0, so the second amax of a run reuses it. */
static void fp8_case(gu_module *m, int64_t rows, int64_t cols, int64_t ld, bool e5m2, bool zeros) {
    char shape[96];
    snprintf(shape, sizeof shape, "%lldx%lld ld%lld %s%s", (long long)rows, (long long)cols, (long long)ld,
             e5m2 ? "e5m2" : "e4m3", zeros ? " zeros" : "");
    const int64_t cnt = rows * ld, n = rows * cols;
    uint16_t *src = gu_rand_bf16(&rng, cnt, 3.0);
    if (zeros)
        for (int64_t i = 0; i < cnt; i++) src[i] = i % ld < cols ? 0 : 0x7f80; /* infinities outside the matrix */
    else
        for (int64_t r = 0; r < rows; r++) src[r * ld + cols - 1 - r % cols] = 0x4500; /* 2048: the amax, anywhere */
    float ref_slot[3], slot[4];
    ref_fp8_amax(src, rows, cols, ld, e5m2, ref_slot);
    uint16_t *dsrc = dev_copy(src, 2 * (size_t)cnt);
    float *dparts = gu_malloc(CP_FP8_AMAX_PARTS * 4), *dslot = gu_malloc(16);
    unsigned *dcounter = gu_malloc(4);
    gu_upload(dcounter, &(unsigned){0}, 4);
    uint8_t *dst = gu_malloc((size_t)n), *out = malloc((size_t)n), *ref = malloc((size_t)n);
    for (int rep = 0; rep < 2; rep++) {
        gu_poison(dparts, CP_FP8_AMAX_PARTS * 4);
        gu_poison(dslot, 16);
        void *a[] = {&dsrc, &rows, &cols, &ld, &dparts, &dcounter, &dslot};
        gu_run(m, e5m2 ? "amax_e5m2" : "amax_e4m3", rows, cols, a);
        gu_download(slot, dslot, 16);
        unsigned counter;
        gu_download(&counter, dcounter, 4);
        double bad = counter != 0;
        for (int j = 0; j < 3; j++) bad += slot[j] != ref_slot[j];
        gu_check(rep ? "fp8_amax (again)" : "fp8_amax", shape, bad, 0);
    }
    for (int t = 0; t < 2; t++) {
        gu_poison(dst, (size_t)n);
        void *a[] = {&dsrc, &rows, &cols, &ld, &dslot, &dst};
        gu_run(m, t ? (e5m2 ? "cast_t_e5m2" : "cast_t_e4m3") : (e5m2 ? "cast_e5m2" : "cast_e4m3"), rows, cols, a);
        gu_download(out, dst, (size_t)n);
        ref_fp8_cast(src, rows, cols, ld, e5m2, t, slot[1], ref);
        int64_t diff = 0;
        for (int64_t i = 0; i < n; i++) diff += out[i] != ref[i];
        gu_check(t ? "fp8_cast_t (bytes differing)" : "fp8_cast (bytes differing)", shape, (double)diff, 0);
    }
    free(src), free(out), free(ref);
    gu_free_dev(dsrc), gu_free_dev(dparts), gu_free_dev(dslot), gu_free_dev(dcounter), gu_free_dev(dst);
}

static void test_fp8(void **state) {
    (void)state;
    gu_module *m = fp8_module();
    /* one tile, partial tiles (80, 1008), a stride beyond the row, a projection's 4096 x 3072 and one with more
     * blocks than amax parts */
    const int64_t shapes[][3] = {{16, 16, 16}, {64, 128, 136}, {1008, 80, 96}, {4096, 3072, 3072}, {16384, 1024, 1024}};
    for (size_t i = 0; i < CP_ARRAY_LEN(shapes); i++)
        for (int e5 = 0; e5 < 2; e5++) fp8_case(m, shapes[i][0], shapes[i][1], shapes[i][2], e5, false);
    fp8_case(m, 32, 48, 64, false, true);
    gu_free(m);
}

/* The block-scaled casts (train.fp8_scaling = "block") and the row-scaled ones ("row") of a strided bf16
 * [rows][cols] (row stride ld) by `role` (cast_1d_e4m3, cast_t_2d_e4m3, cast_row_e5m2, cast_t_row_e4m3, ...;
 * cast_rt_1d_* writes the copy and the transposed copy, each checked as cast_1d's and cast_t_1d's): every byte and
 * every scale the kernel writes against ref_fp8_cast_block or ref_fp8_cast_row, both exact (the scales are powers of
 * two, the bytes one rounding of an exact product). A row cast's block is a whole row of the source, or a whole
 * column when transposed. The source's magnitudes change by powers of two from one 16 x 16 patch to the next
 * (2^-10 .. 2^10), so that blocks get different scales and elements of a block span the FP8 range down to its
 * subnormals and zero; and the role's own blocks, in order, cycle through special ones: all zeros (+0 and -0: scale
 * 1), one outlier of -2^20 among values near 1 (a scale far from its neighbours'), a largest |x| of exactly FMAX
 * (scale 1) and of the next bf16 above it (scale 2: a q rounded up would saturate it), values near 2^-122 (q capped
 * at 2^126), near 2^100 (q near 2^-93), and values near 1 with every 37th times 1000 (a few outliers that set the
 * scale). The row padding of a strided source holds infinities, so a kernel that reads it gets an infinite amax. dst
 * and scales start as NaN (0xFF); the scale entries that pad a tiled layout's rows to a multiple of 4 are not
 * compared (not written). */
static void fp8_scaled_cast_case(gu_module *m, const char *role, int64_t rows, int64_t cols, int64_t ld) {
    const bool e5m2 = strstr(role, "e5m2") != NULL, both = strncmp(role, "cast_rt_", 8) == 0;
    const bool tiles = strstr(role, "_2d_") != NULL, row = strstr(role, "_row_") != NULL;
    bool transpose = strncmp(role, "cast_t_", 7) == 0;
    char shape[96], what[64];
    snprintf(shape, sizeof shape, "%lldx%lld ld%lld", (long long)rows, (long long)cols, (long long)ld);
    snprintf(what, sizeof what, "fp8_%s", role);
    const int64_t cnt = rows * ld, n = rows * cols;
    uint16_t *src = gu_rand_bf16(&rng, cnt, 1.0);
    /* magnitudes by 16 x 16 patch; infinities in the row padding */
    const int64_t pr = (rows + 15) / 16, pc = (ld + 15) / 16;
    int *pexp = malloc(sizeof(int) * (size_t)(pr * pc));
    for (int64_t i = 0; i < pr * pc; i++) pexp[i] = (int)(gu_next(&rng) % 21) - 10;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < ld; c++) {
            uint16_t *x = &src[r * ld + c];
            *x = c >= cols ? 0x7f80 : f32_to_bf16(ldexpf(bf16_to_f32(*x), pexp[r / 16 * pc + c / 16]));
        }
    free(pexp);
    /* the role's blocks (br x bc of the source) in row-major order, every eighth kind the same */
    const int64_t br = row ? (transpose ? rows : 1) : tiles || transpose ? 128 : 1;
    const int64_t bc = row ? (transpose ? 1 : cols) : tiles || !transpose ? 128 : 1;
    const uint16_t fmax = e5m2 ? 0x4760 : 0x43e0; /* 57344, 448 */
    int64_t b = 0;
    for (int64_t r0 = 0; r0 < rows; r0 += br)
        for (int64_t c0 = 0; c0 < cols; c0 += bc, b++) {
            const int64_t r1 = r0 + br < rows ? r0 + br : rows, c1 = c0 + bc < cols ? c0 + bc : cols;
            const int kind = (int)(b % 8);
            if (kind == 0) continue; /* the patches' values */
            for (int64_t r = r0; r < r1; r++)
                for (int64_t c = c0; c < c1; c++) {
                    uint16_t *x = &src[r * ld + c];
                    const float v = (float)gu_normal(&rng); /* |v| < 448 */
                    if (kind == 1) *x = (r + c) % 2 ? 0x8000 : 0; /* -0 and +0 */
                    else if (kind == 5) *x = f32_to_bf16(ldexpf(v, -122));
                    else if (kind == 6) *x = f32_to_bf16(ldexpf(v, 100));
                    else if (kind == 7) *x = f32_to_bf16((r * cols + c) % 37 ? v : v * 1000);
                    else *x = f32_to_bf16(v);
                }
            /* one element in the block's middle sets its amax */
            uint16_t *mid = &src[(r0 + r1) / 2 * ld + (c0 + c1) / 2];
            if (kind == 2) *mid = 0xc980; /* -2^20 */
            if (kind == 3) *mid = fmax;
            if (kind == 4) *mid = (uint16_t)(fmax + 1); /* 450, 57344 + 2^8 */
        }
    /* the copy is [rows][cols], or [cols][rows] transposed; its scales as gen/kernels.h counts them; a cast of both
     * ways writes the first, then the second */
    const int ncopies = both ? 2 : 1;
    const int scale = row ? CP_GEMM_SCALE_ROW : tiles ? CP_GEMM_SCALE_2D : CP_GEMM_SCALE_1D;
    const int64_t most = CP_MAX(cp_fp8_scales(scale, rows, cols), cp_fp8_scales(scale, cols, rows)) + /* either way */
                         (row ? cp_fp8_row_parts(rows, cols) : 0); /* a transposed row cast's column maxima */
    uint8_t *out = malloc((size_t)n), *ref = malloc((size_t)n), *dst[2] = {NULL, NULL};
    float *sout = malloc(4 * (size_t)most), *sref = malloc(4 * (size_t)most), *dscales[2] = {NULL, NULL};
    uint16_t *dsrc = dev_copy(src, 2 * (size_t)cnt);
    for (int k = 0; k < ncopies; k++) {
        dst[k] = gu_malloc((size_t)n);
        dscales[k] = gu_malloc(4 * (size_t)most);
        gu_poison(dst[k], (size_t)n);
        gu_poison(dscales[k], 4 * (size_t)most);
    }
    void *a[] = {&dsrc, &rows, &cols, &ld, &dst[0], &dscales[0], &dst[1], &dscales[1]};
    gu_run_fp8_cast(m, role, rows, cols, a);
    for (int k = 0; k < ncopies; k++) {
        if (both) transpose = k == 1;
        const int64_t crows = transpose ? cols : rows, ccols = transpose ? rows : cols;
        const int64_t ns = cp_fp8_scales(scale, crows, ccols); /* this copy's */
        for (int64_t i = 0; i < ns; i++) sref[i] = NAN;
        if (row) ref_fp8_cast_row(src, rows, cols, ld, e5m2, transpose, ref, sref);
        else ref_fp8_cast_block(src, rows, cols, ld, e5m2, transpose, tiles, ref, sref);
        gu_download(out, dst[k], (size_t)n);
        gu_download(sout, dscales[k], 4 * (size_t)ns);
        int64_t diff = 0;
        for (int64_t i = 0; i < n; i++) diff += out[i] != ref[i];
        char label[96];
        snprintf(label, sizeof label, "%s%s (bytes differing)", what, both ? (k ? " transposed" : " rows") : "");
        gu_check(label, shape, (double)diff, 0);
        /* tiled: the copy's rows of scales hold ceil(ccols / 128) entries, padded to a multiple of 4 */
        const int64_t per_row = tiles ? (ccols + 127) / 128 : ns, pitch = tiles ? (per_row + 3) / 4 * 4 : ns;
        int64_t sdiff = 0, compared = 0;
        for (int64_t i = 0; i < ns; i++) {
            if (i % pitch >= per_row) continue;
            sdiff += !(sout[i] == sref[i]); /* NaN: not written */
            compared++;
        }
        if (compared != (tiles ? (crows + 127) / 128 * per_row : ns))
            gu_fail("%s %s: scale entries miscounted", what, shape);
        snprintf(label, sizeof label, "%s%s (scales differing)", what, both ? (k ? " transposed" : " rows") : "");
        gu_check(label, shape, (double)sdiff, 0);
        gu_free_dev(dst[k]), gu_free_dev(dscales[k]);
    }
    free(src), free(out), free(ref), free(sout), free(sref);
    gu_free_dev(dsrc);
}

/* The 128 x 128 tiles of one weight of every layer at once (cp_plan.fp8_weights_once with block scales): `layers`
 * weights [rows][cols] stride elements apart (the gaps huge, so a read outside a weight shows in a tile's scale),
 * cast_2d_layers and cast_t_2d_layers as the plan launches them, every layer's copies and scales cast_2d's and
 * cast_t_2d's on the CPU. */
static void fp8_layers_2d_case(gu_module *m, int64_t layers, int64_t rows, int64_t cols, int64_t stride) {
    char shape[64];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)layers, (long long)rows, (long long)cols);
    const int64_t n = rows * cols;
    int64_t pitch[2] = {cp_fp8_layers_pitch(CP_GEMM_SCALE_2D, rows, cols, false),
                        cp_fp8_layers_pitch(CP_GEMM_SCALE_2D, rows, cols, true)};
    uint16_t *src = malloc(2 * (size_t)(layers * stride));
    for (int64_t i = 0; i < layers * stride; i++) src[i] = f32_to_bf16(1e30f);
    for (int64_t z = 0; z < layers; z++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                src[z * stride + r * cols + c] = f32_to_bf16(ldexpf((float)gu_normal(&rng), (int)(z * 3 + r % 5) - 8));
    uint16_t *dsrc = dev_copy(src, 2 * (size_t)(layers * stride));
    uint8_t *got = malloc((size_t)(layers * n)), *ref = malloc((size_t)n);
    int64_t diff = 0;
    for (int t = 0; t < 2; t++) {
        uint8_t *dcopy = gu_malloc((size_t)(layers * n));
        float *dscales = gu_malloc(4 * (size_t)(layers * pitch[t])), *sgot = malloc(4 * (size_t)(layers * pitch[t]));
        float *sref = malloc(4 * (size_t)pitch[t]);
        gu_poison(dcopy, (size_t)(layers * n)), gu_poison(dscales, 4 * (size_t)(layers * pitch[t]));
        int64_t ld = cols;
        void *a[] = {&dsrc, &rows, &cols, &ld, &dcopy, &dscales, &stride, &pitch[t]};
        gu_run_z(m, t ? "cast_t_2d_layers_e4m3" : "cast_2d_layers_e4m3", rows, cols, (unsigned)layers, a);
        gu_download(got, dcopy, (size_t)(layers * n));
        gu_download(sgot, dscales, 4 * (size_t)(layers * pitch[t]));
        /* the copy's rows of scales hold ceil(ccols / 128) entries, padded to a multiple of 4 */
        const int64_t ccols = t ? rows : cols, per_row = (ccols + 127) / 128, ld4 = (per_row + 3) / 4 * 4;
        const int64_t ns = cp_fp8_scales(CP_GEMM_SCALE_2D, t ? cols : rows, ccols);
        for (int64_t z = 0; z < layers; z++) {
            ref_fp8_cast_block(src + z * stride, rows, cols, cols, false, t == 1, true, ref, sref);
            for (int64_t i = 0; i < n; i++) diff += got[z * n + i] != ref[i];
            for (int64_t i = 0; i < ns; i++) diff += i % ld4 < per_row && !(sgot[z * pitch[t] + i] == sref[i]);
        }
        free(sgot), free(sref);
        gu_free_dev(dcopy), gu_free_dev(dscales);
    }
    gu_check("cast_2d_layers_e4m3, cast_t_2d_layers_e4m3 (bytes and scales differing)", shape, (double)diff, 0);
    free(src), free(got), free(ref);
    gu_free_dev(dsrc);
}

/* Every block-scaled cast at shapes its contract allows: 1D along the copy's rows (cols a multiple of 128) and
 * transposed (rows a multiple of 128) with one block a row or column up to many, both ways at once (whole 128 x 128
 * tiles, one up to an MLP tile's 4096 x 8192; a strided source), and the tiled casts with partial
 * tiles at both edges (272 x 400, 400 x 272: rows of scales padded or not), a single partial tile (16 x 16), tiles
 * narrower than one (1008 x 80); strided sources (ld > cols), and a projection input's 4096 x 3072; then the tiles of
 * every layer's weight at once (fp8_layers_2d_case). */
static void test_fp8_block(void **state) {
    (void)state;
    gu_module *m = fp8_module();
    static const struct {
        const char *role;
        int64_t rows, cols, ld;
    } cases[] = {
        {"cast_1d_e4m3", 16, 128, 128},     {"cast_1d_e4m3", 272, 384, 384},    {"cast_1d_e4m3", 64, 256, 264},
        {"cast_1d_e4m3", 4096, 3072, 3072}, {"cast_1d_e5m2", 16, 128, 128},     {"cast_1d_e5m2", 1008, 1024, 1152},
        {"cast_1d_e5m2", 4096, 3072, 3072}, {"cast_t_1d_e4m3", 128, 16, 16},    {"cast_t_1d_e4m3", 256, 400, 400},
        {"cast_t_1d_e4m3", 384, 80, 96},    {"cast_t_1d_e4m3", 4096, 3072, 3072}, {"cast_t_1d_e5m2", 128, 16, 16},
        {"cast_t_1d_e5m2", 640, 1008, 1024}, {"cast_t_1d_e5m2", 4096, 3072, 3072}, {"cast_2d_e4m3", 16, 16, 16},
        {"cast_2d_e4m3", 272, 400, 400},    {"cast_2d_e4m3", 400, 272, 280},    {"cast_2d_e4m3", 1008, 80, 96},
        {"cast_2d_e4m3", 3072, 1024, 1024}, {"cast_t_2d_e4m3", 16, 16, 16},     {"cast_t_2d_e4m3", 272, 400, 400},
        {"cast_t_2d_e4m3", 400, 272, 280},  {"cast_t_2d_e4m3", 1008, 80, 96},   {"cast_t_2d_e4m3", 3072, 1024, 1024},
        {"cast_rt_1d_e4m3", 128, 128, 128}, {"cast_rt_1d_e4m3", 384, 256, 264}, {"cast_rt_1d_e4m3", 4096, 8192, 8192},
        {"cast_rt_1d_e5m2", 256, 640, 640}, {"cast_rt_1d_e5m2", 4096, 3072, 3072},
    };
    for (size_t i = 0; i < CP_ARRAY_LEN(cases); i++)
        fp8_scaled_cast_case(m, cases[i].role, cases[i].rows, cases[i].cols, cases[i].ld);
    /* every layer's weight at once: partial tiles at both edges, a 3B's k_proj and down_proj */
    static const int64_t layered[][4] = {{4, 272, 400, 272 * 400 + 64}, {3, 1024, 3072, 1024 * 3072 + 4096},
                                         {2, 3072, 8192, 3072 * 8192}};
    for (size_t i = 0; i < CP_ARRAY_LEN(layered); i++)
        fp8_layers_2d_case(m, layered[i][0], layered[i][1], layered[i][2], layered[i][3]);
    gu_free(m);
}

/* cast_t_row8's definition on the CPU: the transposed copy [cols][rows] of a row copy (bytes rcopy, scales rscales),
 * each element's value (byte times its row's scale, exact) cast with its column's multiplier (1 / tscales[c]) */
static void ref_t_from_rows(const uint8_t *rcopy, const float *rscales, const float *tscales, int64_t rows,
                            int64_t cols, bool e5m2, uint8_t *out) {
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < rows; r++) {
            const float v = (float)ref_fp8_value(rcopy[r * cols + c], e5m2) * rscales[r];
            out[c * rows + r] = ref_fp8_of(v * (1.0f / tscales[c]), e5m2);
        }
}

/* cast_t_row8 (the transposed copy from the row copy) of a bf16 [rows][cols] whose rows' scales spread over 2^-40 ..
 * 2^40 (so that rows and columns take different scales; a zero row and a zero column among them), after cast_row and
 * cast_t_row_max as the plan's producer leaves them: every byte the row copy's value (byte times row scale) cast with
 * its column's multiplier on the CPU, the scales cast_t_row's; and against cast_t_row's bytes from the source, a
 * difference only where an element is below the normal range in one of the copies (the counts printed). Then the
 * same after cast_rt_row, as a cast of both ways launches it: both copies and both scales the CPU's. */
static void fp8_row8_case(gu_module *m, bool e5m2, int64_t rows, int64_t cols) {
    char shape[64], what[48];
    snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
    snprintf(what, sizeof what, "cast_t_row8_%s", e5m2 ? "e5m2" : "e4m3");
    const int64_t n = rows * cols, parts = cp_fp8_row_parts(rows, cols);
    uint16_t *src = malloc(2 * (size_t)n);
    for (int64_t r = 0; r < rows; r++) {
        const int e = (int)(r * 7919 % 81) - 40;
        for (int64_t c = 0; c < cols; c++)
            src[r * cols + c] = r == rows / 2 || c == cols / 3 ? 0 : f32_to_bf16(ldexpf((float)gu_normal(&rng), e));
    }
    uint8_t *rcopy = malloc((size_t)n), *tref = malloc((size_t)n), *want = malloc((size_t)n), *got = malloc((size_t)n);
    float *rscales = malloc(4 * (size_t)rows), *tscales = malloc(4 * (size_t)cols), *sgot = malloc(4 * (size_t)cols);
    ref_fp8_cast_row(src, rows, cols, cols, e5m2, false, rcopy, rscales);
    ref_fp8_cast_row(src, rows, cols, cols, e5m2, true, tref, tscales);
    ref_t_from_rows(rcopy, rscales, tscales, rows, cols, e5m2, want);
    uint16_t *dsrc = dev_copy(src, 2 * (size_t)n);
    uint8_t *drow = gu_malloc((size_t)n), *dt = gu_malloc((size_t)n);
    float *drs = gu_malloc(4 * (size_t)rows), *dts = gu_malloc(4 * (size_t)(cols + parts));
    gu_poison(drow, (size_t)n), gu_poison(dt, (size_t)n), gu_poison(drs, 4 * (size_t)rows);
    gu_poison(dts, 4 * (size_t)(cols + parts));
    int64_t ld = cols;
    void *ar[] = {&dsrc, &rows, &cols, &ld, &drow, &drs};
    gu_run(m, e5m2 ? "cast_row_e5m2" : "cast_row_e4m3", rows, cols, ar);
    void *am[] = {&dsrc, &rows, &cols, &ld, &dt, &dts};
    gu_run(m, "cast_t_row_max", rows, cols, am);
    void *a8[] = {&drow, &rows, &cols, &ld, &dt, &dts, &drs};
    gu_run(m, what, rows, cols, a8);
    gu_download(got, dt, (size_t)n);
    gu_download(sgot, dts, 4 * (size_t)cols);
    int64_t diff = 0, sdiff = 0, moved = 0, normal_moved = 0;
    for (int64_t i = 0; i < n; i++) diff += got[i] != want[i];
    for (int64_t c = 0; c < cols; c++) sdiff += !(sgot[c] == tscales[c]);
    /* the same two launches as a cast of both ways makes them (the plan's cast_rt_row with from_rows): cast_rt_row's
     * row copy and column maxima (its parts zeroed as the plan's memset does), then this entry on them */
    uint8_t *got_rt = malloc((size_t)n), *rgot = malloc((size_t)n);
    float *rsgot = malloc(4 * (size_t)rows);
    gu_poison(drow, (size_t)n), gu_poison(dt, (size_t)n), gu_poison(drs, 4 * (size_t)rows);
    gu_poison(dts, 4 * (size_t)cols);
    float *zeros = calloc((size_t)parts, 4);
    gu_upload(dts + cols, zeros, 4 * (size_t)parts);
    free(zeros);
    void *art[] = {&dsrc, &rows, &cols, &ld, &drow, &drs, &dt, &dts};
    gu_run(m, e5m2 ? "cast_rt_row_e5m2" : "cast_rt_row_e4m3", rows, cols, art);
    gu_run(m, what, rows, cols, a8);
    gu_download(got_rt, dt, (size_t)n);
    gu_download(rgot, drow, (size_t)n);
    gu_download(rsgot, drs, 4 * (size_t)rows);
    int64_t diff_rt = 0;
    for (int64_t i = 0; i < n; i++) diff_rt += (got_rt[i] != want[i]) + (rgot[i] != rcopy[i]);
    for (int64_t r = 0; r < rows; r++) diff_rt += !(rsgot[r] == rscales[r]);
    gu_download(sgot, dts, 4 * (size_t)cols);
    for (int64_t c = 0; c < cols; c++) diff_rt += !(sgot[c] == tscales[c]);
    char label_rt[96];
    snprintf(label_rt, sizeof label_rt, "%s after cast_rt_row (bytes and scales differing)", what);
    gu_check(label_rt, shape, (double)diff_rt, 0);
    free(got_rt), free(rgot), free(rsgot);
    const float normal = e5m2 ? 0x1p-14f : 0x1p-6f; /* the type's least normal value */
    for (int64_t c = 0; c < cols; c++)
        for (int64_t r = 0; r < rows; r++) {
            if (got[c * rows + r] == tref[c * rows + r]) continue;
            const float x = fabsf(bf16_to_f32(src[r * cols + c]));
            moved++;
            normal_moved += x / rscales[r] >= normal && x / tscales[c] >= normal; /* scaled, before rounding */
        }
    char label[96];
    snprintf(label, sizeof label, "%s (bytes differing)", what);
    gu_check(label, shape, (double)diff, 0);
    snprintf(label, sizeof label, "%s (scales differing)", what);
    gu_check(label, shape, (double)sdiff, 0);
    printf("  %s %s: %lld of %lld bytes unlike cast_t_row's from the source, %lld of them of elements in the "
           "normal range in both copies\n", what, shape, (long long)moved, (long long)n, (long long)normal_moved);
    snprintf(label, sizeof label, "%s (normal elements unlike cast_t_row's)", what);
    gu_check(label, shape, (double)normal_moved, 0);
    free(src), free(rcopy), free(tref), free(want), free(got), free(rscales), free(tscales), free(sgot);
    gu_free_dev(dsrc), gu_free_dev(drow), gu_free_dev(dt), gu_free_dev(drs), gu_free_dev(dts);
}

/* The casts of one weight of every layer at once (cp_plan.fp8_weights_once): `layers` weights [rows][cols] stride
 * elements apart (the gaps between them huge, so a read outside a weight would show in its maxima), each layer's
 * rows scaled over 2^-20 .. 2^20 differently; cast_rt_row_layers then cast_t_row8_layers as the plan launches them
 * (the transposed scales and maxima zeroed first), every layer's row copy and scales cast_row's on the CPU, its
 * transposed copy the row copy's values cast with the column's multiplier (fp8_row8_case's definition), its scales
 * cast_t_row's. */
static void fp8_layers_case(gu_module *m, int64_t layers, int64_t rows, int64_t cols, int64_t stride) {
    char shape[64];
    snprintf(shape, sizeof shape, "%lldx%lldx%lld", (long long)layers, (long long)rows, (long long)cols);
    const int64_t n = rows * cols;
    int64_t pr = cp_fp8_layers_pitch(CP_GEMM_SCALE_ROW, rows, cols, false);
    int64_t pt = cp_fp8_layers_pitch(CP_GEMM_SCALE_ROW, rows, cols, true);
    uint16_t *src = malloc(2 * (size_t)(layers * stride));
    for (int64_t i = 0; i < layers * stride; i++) src[i] = f32_to_bf16(1e30f);
    for (int64_t z = 0; z < layers; z++)
        for (int64_t r = 0; r < rows; r++) {
            const int e = (int)((r + 13 * z) * 7919 % 41) - 20;
            for (int64_t c = 0; c < cols; c++)
                src[z * stride + r * cols + c] = f32_to_bf16(ldexpf((float)gu_normal(&rng), e));
        }
    uint16_t *dsrc = dev_copy(src, 2 * (size_t)(layers * stride));
    uint8_t *drow = gu_malloc((size_t)(layers * n)), *dt = gu_malloc((size_t)(layers * n));
    float *drs = gu_malloc(4 * (size_t)(layers * pr)), *dts = gu_malloc(4 * (size_t)(layers * pt));
    gu_poison(drow, (size_t)(layers * n)), gu_poison(dt, (size_t)(layers * n));
    gu_poison(drs, 4 * (size_t)(layers * pr));
    float *zeros = calloc((size_t)(layers * pt), 4);
    gu_upload(dts, zeros, 4 * (size_t)(layers * pt));
    int64_t ld = cols;
    void *a[] = {&dsrc, &rows, &cols, &ld, &drow, &drs, &dt, &dts, &stride, &pr, &pt};
    gu_run_z(m, "cast_rt_row_layers_e4m3", rows, cols, (unsigned)layers, a);
    void *a8[] = {&drow, &rows, &cols, &ld, &dt, &dts, &drs, &pt, &pr};
    gu_run_z(m, "cast_t_row8_layers_e4m3", rows, cols, (unsigned)layers, a8);
    uint8_t *rcopy = malloc((size_t)n), *tref = malloc((size_t)n), *got = malloc((size_t)(layers * n));
    uint8_t *tgot = malloc((size_t)(layers * n));
    float *rscales = malloc(4 * (size_t)rows), *tscales = malloc(4 * (size_t)cols);
    float *rsgot = malloc(4 * (size_t)(layers * pr)), *tsgot = malloc(4 * (size_t)(layers * pt));
    gu_download(got, drow, (size_t)(layers * n));
    gu_download(tgot, dt, (size_t)(layers * n));
    gu_download(rsgot, drs, 4 * (size_t)(layers * pr));
    gu_download(tsgot, dts, 4 * (size_t)(layers * pt));
    int64_t diff = 0;
    for (int64_t z = 0; z < layers; z++) {
        ref_fp8_cast_row(src + z * stride, rows, cols, cols, false, false, rcopy, rscales);
        ref_fp8_cast_row(src + z * stride, rows, cols, cols, false, true, tref, tscales);
        for (int64_t i = 0; i < n; i++) diff += got[z * n + i] != rcopy[i];
        for (int64_t r = 0; r < rows; r++) diff += !(rsgot[z * pr + r] == rscales[r]);
        for (int64_t c = 0; c < cols; c++) diff += !(tsgot[z * pt + c] == tscales[c]);
        ref_t_from_rows(rcopy, rscales, tscales, rows, cols, false, tref);
        for (int64_t i = 0; i < n; i++) diff += tgot[z * n + i] != tref[i];
    }
    gu_check("cast_rt_row_layers_e4m3, cast_t_row8_layers_e4m3 (bytes and scales differing)", shape, (double)diff, 0);
    free(src), free(zeros), free(rcopy), free(tref), free(got), free(tgot), free(rscales), free(tscales);
    free(rsgot), free(tsgot);
    gu_free_dev(dsrc), gu_free_dev(drow), gu_free_dev(dt), gu_free_dev(drs), gu_free_dev(dts);
}

/* Every row-scaled cast (train.fp8_scaling = "row"; rows and cols multiples of 16, of 32 transposed), E4M3 and E5M2,
 * as rows, transposed and both at once (cast_rt_row: each block's column maxima gathered by atomics, over one or
 * many chunks of rows, blocks of 16 rows on a weight's 3072, of 128 on 32768), at a single 16 x 32, odd multiples of
 * 16 and 32 (48 x 96, 272 x 416), strided sources (ld > cols), one row as long as an MLP's (16 x 8192), rows longer
 * than a block holds in registers (16 x 20480: read again for the cast), columns over several chunks of
 * CP_FP8_ROW_CHUNK rows and part of one (2064 x 96), and a projection input's 4096 x 3072 and 512 x 8192. The
 * special blocks of fp8_scaled_cast_case are whole rows here (whole columns transposed): a zero row, outliers, amax
 * at FMAX and just above, the 2^126 cap. Then the transposed copy cast from the row copy (fp8_row8_case), and the
 * casts of a weight of every layer at once (fp8_layers_case). */
static void test_fp8_row(void **state) {
    (void)state;
    gu_module *m = fp8_module();
    static const char *const roles[] = {"cast_row_e4m3",    "cast_row_e5m2",    "cast_t_row_e4m3",
                                        "cast_t_row_e5m2",  "cast_rt_row_e4m3", "cast_rt_row_e5m2"};
    static const int64_t shapes[][3] = {{16, 32, 32},       {48, 96, 96},     {272, 416, 416}, {48, 96, 104},
                                        {64, 256, 264},     {16, 8192, 8192}, {4096, 3072, 3072},
                                        {512, 8192, 8192},  {16, 20480, 20480}, {2064, 96, 96},
                                        {1040, 1024, 1032}, {48, 4096, 4096},   {32, 4128, 4128},
                                        {3072, 3072, 3072}, {48, 16384, 16384}, {32768, 1024, 1024}};
    for (size_t r = 0; r < CP_ARRAY_LEN(roles); r++)
        for (size_t i = 0; i < CP_ARRAY_LEN(shapes); i++)
            if (strncmp(roles[r], "cast_rt_", 8) || cp_fp8_row_held(shapes[i][1])) /* both: rows held whole */
                fp8_scaled_cast_case(m, roles[r], shapes[i][0], shapes[i][1], shapes[i][2]);
    /* cast_row takes rows a group of threads each, blocks of 8 rows of 1024 columns and 4 of 3072: a last block part
     * full */
    fp8_scaled_cast_case(m, "cast_row_e4m3", 1029, 1024, 1024);
    fp8_scaled_cast_case(m, "cast_row_e5m2", 30, 3072, 3080);
    /* the transposed copy from the row copy: one strip and chunk, a part chunk, several chunks of an MLP's width */
    static const int64_t row8[][2] = {{16, 64}, {2064, 192}, {4096, 8192}, {32768, 1024}};
    for (int e = 0; e < 2; e++)
        for (size_t i = 0; i < CP_ARRAY_LEN(row8); i++) fp8_row8_case(m, e == 1, row8[i][0], row8[i][1]);
    /* every layer's weight at once: a few small ones, a 3B's k_proj and down_proj (rows over several chunks, the
     * widest row held), the weights apart by more than their size and by exactly it */
    static const int64_t layered[][4] = {{4, 48, 192, 48 * 192 + 64}, {3, 1024, 3072, 1024 * 3072 + 4096},
                                         {2, 3072, 8192, 3072 * 8192}};
    for (size_t i = 0; i < CP_ARRAY_LEN(layered); i++)
        fp8_layers_case(m, layered[i][0], layered[i][1], layered[i][2], layered[i][3]);
    gu_free(m);
}

/* ---- attn_delta ---- */

static void test_attn_delta(void **state) {
    (void)state;
    const int64_t D[] = {128, 64};
    const int heads[] = {8, 32, 3};
    for (int d = 0; d < 2; d++) {
        cp_kernel_spec k;
        cp_k_attn_delta(&k, D[d]);
        gu_module *m = gu_build(&k);
        cp_kspec_free(&k);
        for (int i = 0; i < NROWS; i++)
            for (int h = 0; h < 3; h++) {
                int64_t n = ROWS[i];
                int nh = heads[h];
                char shape[96];
                snprintf(shape, sizeof shape, "d%lld n%lld h%d", (long long)D[d], (long long)n, nh);
                const int64_t cnt = n * nh * D[d];
                uint16_t *go = gu_rand_bf16(&rng, cnt, 1.0), *o = gu_rand_bf16(&rng, cnt, 1.0);
                float *ref = malloc(4 * (size_t)(n * nh)), *out = malloc(4 * (size_t)(n * nh));
                ref_attn_delta(go, o, ref, n, nh, D[d]);
                uint16_t *dgo = dev_copy(go, 2 * (size_t)cnt), *dO = dev_copy(o, 2 * (size_t)cnt);
                float *dd = gu_malloc(4 * (size_t)(n * nh));
                gu_poison(dd, 4 * (size_t)(n * nh));
                void *a[] = {&dgo, &dO, &dd, &n, &nh};
                gu_run(m, "fwd", n, nh, a);
                gu_download(out, dd, 4 * (size_t)(n * nh));
                gu_check("attn_delta", shape, gu_rel_err_f32(out, ref, n * nh), TOL_F32);
                free(go), free(o), free(ref), free(out);
                gu_free_dev(dgo), gu_free_dev(dO), gu_free_dev(dd);
            }
        gu_free(m);
    }
}

static int group_setup(void **state) {
    (void)state;
    gu_cmocka = true;
    gu_seed(&rng, 20261129);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    gu_print_table();
    return 0;
}

/* usage: test_kernels [PATTERN]: only the tests whose names match PATTERN (* and ? wildcards); a pattern that
 * matches none fails rather than passing on nothing run */
int main(int argc, char **argv) {
    gu_init_or_skip("test_kernels");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding), cmocka_unit_test(test_rmsnorm), cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu),    cmocka_unit_test(test_loss),    cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_ulysses),   cmocka_unit_test(test_cast),    cmocka_unit_test(test_attn_delta),
        cmocka_unit_test(test_fp8),       cmocka_unit_test(test_fp8_block), cmocka_unit_test(test_fp8_row),
    };
    if (argc > 1) {
        bool any = false;
        for (size_t i = 0; i < CP_ARRAY_LEN(tests); i++) any = any || fnmatch(argv[1], tests[i].name, 0) == 0;
        if (!any) {
            fprintf(stderr, "test_kernels: no test matches %s (test_fp8, test_adamw, ...)\n", argv[1]);
            return 1;
        }
        cmocka_set_test_filter(argv[1]);
    }
    return gu_status(cmocka_run_group_tests(tests, group_setup, group_teardown));
}
