/* bench_kernels.c: bandwidth of the memory-bound kernels at large sizes. Each kernel: warm-up launches, then REPS
 * launches timed one by one with CUDA events; the median time gives GB/s from the bytes the kernel must move (each
 * input read once, each output written once) and the percentage of 4300 GB/s, the H200's measured copy ceiling.
 * A device-to-device cudaMemcpy of 1 GiB is timed the same way as this run's own ceiling. The table comes last.
 * Inputs are filled with a byte pattern (0x3C: bf16 0.0115, fp32 0.0115), tokens and targets are in range. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"
#include "plan.h"
#include "util.h"

#define REPS 60
#define WARM 5
#define CEILING_GBPS 4300.0
#define GOAL 0.70

typedef struct {
    char name[40], shape[48];
    double us, gbps;
    bool goal; /* the >= 70% goal applies */
} result;

static result res[128];
static int nres;
static double memcpy_gbps;

static void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        char m[1024];
        cp_cuda_errmsg(e, what, m, sizeof m);
        gu_fail("%s", m);
    }
}

typedef struct {
    cudaKernel_t k;
    const cp_kdims *d;
    void **args;
} kernel_launch;

static void launch_kernel(void *ctx) {
    const kernel_launch *l = ctx;
    check(cp_launch(l->k, l->d, l->args, 0), "launch");
}

/* Median microseconds of REPS launches of k (geometry d) with args, after WARM launches. */
static double time_kernel(cudaKernel_t k, const cp_kdims *d, void **args) {
    kernel_launch l = {k, d, args};
    return 1000.0 * gu_median_ms(REPS, WARM, launch_kernel, &l);
}

static void report(const char *name, const char *shape, double us, double bytes, bool goal) {
    if (nres == (int)CP_ARRAY_LEN(res)) {
        fprintf(stderr, "bench_kernels: more than %d results: make res larger\n", nres);
        exit(1);
    }
    result *r = &res[nres++];
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->shape, sizeof r->shape, "%s", shape);
    r->us = us;
    r->gbps = bytes / (us * 1e-6) / 1e9;
    r->goal = goal;
    printf("%-22s %-26s %10.1f us %8.0f GB/s %6.1f%% of %.0f\n", name, shape, us, r->gbps,
           100 * r->gbps / CEILING_GBPS, CEILING_GBPS);
    fflush(stdout);
}

static void bench(gu_module *m, const char *role, int64_t n, int64_t heads, void **args, const char *name,
                  const char *shape, double bytes, bool goal) {
    cp_kdims d = gu_dims(m, role, n, heads);
    cudaKernel_t k = gu_kernel(m, role);
    char err[1024];
    if (d.smem && cp_kernel_set_max_smem(k, d.smem, err, sizeof err)) gu_fail("%s: %s", name, err);
    report(name, shape, time_kernel(k, &d, args), bytes, goal);
}

static void *filled(size_t bytes) {
    void *p = gu_malloc(bytes);
    check(cudaMemset(p, 0x3C, bytes), "cudaMemset");
    return p;
}

static gu_module *build(cp_kernel_spec *k) {
    gu_module *m = gu_build(k);
    cp_kspec_free(k);
    return m;
}

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} copy_launch;

static void launch_copy(void *ctx) {
    const copy_launch *c = ctx;
    check(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, 0), "memcpy");
}

static void bench_memcpy(void) {
    const size_t bytes = (size_t)1 << 30;
    void *a = filled(bytes), *b = gu_malloc(bytes);
    copy_launch c = {b, a, bytes};
    report("cudaMemcpy D2D", "1 GiB", 1000.0 * gu_median_ms(REPS, WARM, launch_copy, &c), 2.0 * (double)bytes, false);
    memcpy_gbps = res[nres - 1].gbps;
    gu_free_dev(a);
    gu_free_dev(b);
}

/* Every family's kernels at large sizes */
static void bench_families(void) {
    cp_kernel_spec k;
    { /* rmsnorm 65536 x 4096 */
        int64_t n = 65536, H = 4096;
        cp_k_rmsnorm(&k, H, 1e-5);
        size_t scratch = (size_t)cp_k_scratch_bytes(&k, "bwd", n); /* build() frees the spec */
        gu_module *m = build(&k);
        size_t nb = 2 * (size_t)(n * H);
        void *x = filled(nb), *r = filled(nb), *s = gu_malloc(nb), *w = filled(2 * (size_t)H), *o = gu_malloc(nb);
        void *rs = gu_malloc(4 * (size_t)n), *dw = filled(4 * (size_t)H), *null = NULL;
        void *slot = gu_malloc(CP_FP8_SLOT_BYTES);
        float none = 0.0f, e4 = 448.0f;
        static const char zeros[CP_FP8_SLOT_BYTES];
        gu_upload(slot, zeros, CP_FP8_SLOT_BYTES); /* a scale slot's running maxima and counts start at 0 (left 0) */
        int parts = (int)gu_dims(m, "bwd", n, 0).grid[0];
        void *part = gu_malloc(scratch);
        void *a[] = {&x, &null, &null, &w, &o, &rs, &n, &null, &none};
        bench(m, "fwd", n, 0, a, "rmsnorm_fwd", "65536x4096", 2.0 * nb + 4.0 * n, true);
        void *a8[] = {&x, &null, &null, &w, &o, &rs, &n, &slot, &e4};
        bench(m, "fwd", n, 0, a8, "rmsnorm_fwd amax", "65536x4096", 2.0 * nb + 4.0 * n, true);
        /* with the FP8 copy and its 1 x 128 scales beside out (block scales) */
        void *copy = gu_malloc(nb / 2), *scales = gu_malloc(nb / 64);
        void *ac[] = {&x, &null, &null, &w, &o, &rs, &n, &e4, &copy, &scales};
        bench(m, "fwd_copy", n, 0, ac, "rmsnorm_fwd_copy", "65536x4096", 2.5 * nb + nb / 64 + 4.0 * n, true);
        /* the backward as norm1_bwd and norm2_bwd run it (dresid added), with and without dx's copy */
        void *bc[] = {&r, &x, &w, &rs, &s, &o, &part, &n, &e4, &copy, &scales};
        bench(m, "bwd_copy", n, 0, bc, "rmsnorm_bwd_copy", "65536x4096", 4.5 * nb + nb / 64 + 4.0 * n, true);
        gu_free_dev(copy), gu_free_dev(scales);
        void *b[] = {&x, &r, &s, &w, &o, &rs, &n, &null, &none};
        bench(m, "fwd", n, 0, b, "rmsnorm_fwd resid", "65536x4096", 4.0 * nb + 4.0 * n, true);
        void *c[] = {&r, &x, &w, &rs, &null, &o, &part, &n, &null, &none};
        bench(m, "bwd", n, 0, c, "rmsnorm_bwd", "65536x4096", 3.0 * nb + 4.0 * n, true);
        void *c8[] = {&r, &x, &w, &rs, &null, &o, &part, &n, &slot, &e4};
        bench(m, "bwd", n, 0, c8, "rmsnorm_bwd amax", "65536x4096", 3.0 * nb + 4.0 * n, true);
        void *e[] = {&r, &x, &w, &rs, &s, &o, &part, &n, &null, &none};
        bench(m, "bwd", n, 0, e, "rmsnorm_bwd dresid", "65536x4096", 4.0 * nb + 4.0 * n, true);
        /* the fixed-order sum of the blocks' dweight rows, the bwd step's second launch (fixed cost per step) */
        void *f[] = {&part, &parts, &dw};
        char shape[48];
        snprintf(shape, sizeof shape, "%d parts x 4096", parts);
        bench(m, "bwd_dw", n, 0, f, "rmsnorm_bwd_dw", shape, 4.0 * parts * H + 8.0 * H, false);
        gu_free_dev(x), gu_free_dev(r), gu_free_dev(s), gu_free_dev(w), gu_free_dev(o), gu_free_dev(rs), gu_free_dev(dw);
        gu_free_dev(part), gu_free_dev(slot);
        gu_free(m);
    }
    { /* rope 65536 tokens x 32 heads x 128 */
        cp_model md;
        memset(&md, 0, sizeof md);
        md.head_dim = 128;
        md.rope_theta = 500000;
        md.rope_scaling = (cp_rope_scaling){true, 8, 1, 4, 8192};
        cp_k_rope(&k, &md);
        gu_module *m = build(&k);
        int64_t n = 65536, pos0 = 0;
        int heads = 32;
        size_t nb = 2 * (size_t)(n * heads * 128);
        void *x = filled(nb);
        void *a[] = {&x, &n, &heads, &pos0};
        bench(m, "fwd", n, heads, a, "rope_fwd", "65536x32x128", 2.0 * nb, true);
        int kvh = 8;
        void *b[] = {&x, &n, &kvh, &pos0};
        bench(m, "bwd", n, kvh, b, "rope_bwd (8 kv heads)", "65536x8x128", 2.0 * nb / 4, true);
        /* dq's backward with its FP8 copy and 1 x 128 scales beside it (block scales) */
        void *copy = gu_malloc(nb / 2), *scales = gu_malloc(nb / 64);
        float e4 = 448.0f;
        int64_t row0 = 0;
        void *c[] = {&x, &n, &heads, &pos0, &e4, &copy, &scales, &row0, &n};
        bench(m, "bwd", n, heads, a, "rope_bwd", "65536x32x128", 2.0 * nb, true);
        bench(m, "bwd_copy", n, heads, c, "rope_bwd_copy", "65536x32x128", 2.5 * nb + nb / 64, true);
        gu_free_dev(copy), gu_free_dev(scales);
        gu_free_dev(x);
        gu_free(m);
    }
    { /* swiglu 16384 x 14336 */
        int64_t n = 16384, F = 14336;
        cp_k_swiglu(&k, F);
        gu_module *m = build(&k);
        size_t nb = 2 * (size_t)(n * F);
        void *g = filled(nb), *u = filled(nb), *o = filled(nb), *null = NULL, *slot = gu_malloc(2 * CP_FP8_SLOT_BYTES);
        void *slot2 = (char *)slot + CP_FP8_SLOT_BYTES;
        float none = 0.0f, e4 = 448.0f, e5 = 57344.0f;
        static const char zeros[2 * CP_FP8_SLOT_BYTES];
        gu_upload(slot, zeros, 2 * CP_FP8_SLOT_BYTES);
        void *a[] = {&g, &u, &o, &n, &null, &none};
        bench(m, "fwd", n, 0, a, "swiglu_fwd", "16384x14336", 3.0 * nb, true);
        void *a8[] = {&g, &u, &o, &n, &slot, &e4};
        bench(m, "fwd", n, 0, a8, "swiglu_fwd amax", "16384x14336", 3.0 * nb, true);
        /* with FP8 copies and their 1 x 128 scales beside the outputs (block scales) */
        void *copy = gu_malloc(nb), *scales = gu_malloc(nb / 32), *copy2 = (char *)copy + nb / 2;
        void *scales2 = (char *)scales + nb / 64;
        void *ac[] = {&g, &u, &o, &n, &e4, &copy, &scales};
        bench(m, "fwd_copy", n, 0, ac, "swiglu_fwd_copy", "16384x14336", 3.5 * nb + nb / 64, true);
        void *b[] = {&o, &g, &u, &n, &null, &none, &null, &none};
        bench(m, "bwd", n, 0, b, "swiglu_bwd", "16384x14336", 5.0 * nb, true);
        void *b8[] = {&o, &g, &u, &n, &slot, &e5, &slot2, &e5};
        bench(m, "bwd", n, 0, b8, "swiglu_bwd amaxes", "16384x14336", 5.0 * nb, true);
        void *bc[] = {&o, &g, &u, &n, &e4, &copy, &scales, &e4, &copy2, &scales2};
        bench(m, "bwd_copy", n, 0, bc, "swiglu_bwd_copy", "16384x14336", 6.0 * nb + nb / 32, true);
        gu_free_dev(g), gu_free_dev(u), gu_free_dev(o), gu_free_dev(slot), gu_free_dev(copy), gu_free_dev(scales);
        gu_free(m);
    }
    { /* embedding: 65536 tokens of a 128256 x 4096 table */
        int64_t V = 128256, H = 4096, n = 65536;
        cp_k_embedding(&k, V, H);
        gu_module *m = build(&k);
        gu_rng r;
        gu_seed(&r, 7);
        int32_t *tok = malloc(4 * (size_t)n);
        for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)(gu_next(&r) % (uint64_t)V);
        /* the rows sorted by token (counting sort, stable), as the executor makes them on the host */
        int32_t *order = malloc(4 * (size_t)n), *count = calloc((size_t)V + 1, 4);
        for (int64_t i = 0; i < n; i++) count[tok[i] + 1]++;
        for (int64_t v = 0; v < V; v++) count[v + 1] += count[v];
        for (int64_t i = 0; i < n; i++) order[count[tok[i]]++] = (int32_t)i;
        void *dt = gu_malloc(4 * (size_t)n), *dord = gu_malloc(4 * (size_t)n);
        gu_upload(dt, tok, 4 * (size_t)n);
        gu_upload(dord, order, 4 * (size_t)n);
        free(tok), free(order), free(count);
        size_t nb = 2 * (size_t)(n * H);
        void *table = filled(2 * (size_t)(V * H)), *o = gu_malloc(nb), *dtab = filled(4 * (size_t)(V * H));
        void *a[] = {&dt, &table, &o, &n};
        bench(m, "fwd", n, 0, a, "embedding_fwd", "65536 of 128256x4096", 2.0 * nb + 4.0 * n, true);
        void *b[] = {&dt, &o, &dtab, &n};
        bench(m, "bwd", n, 0, b, "embedding_bwd (atomic)", "65536 of 128256x4096", 5.0 * nb + 4.0 * n, false);
        void *c[] = {&dt, &dord, &o, &dtab, &n};
        bench(m, "bwd_sorted", n, 0, c, "embedding_bwd (sorted)", "65536 of 128256x4096", 5.0 * nb + 4.0 * n, true);
        gu_free_dev(dt), gu_free_dev(dord), gu_free_dev(table), gu_free_dev(o), gu_free_dev(dtab);
        gu_free(m);
    }
    { /* FP8 amax and casts (train.precision = "fp8") at the 3B step's shapes: an MLP tile's 4096 x 8192, a
       * projection input's 32768 x 3072, the MLP's 32768 x 8192 and k's or v's 32768 x 1024; with block and row
       * scales too, and a weight's tiled casts */
        cp_k_fp8(&k);
        gu_module *m = build(&k);
        const int64_t shapes[][2] = {{4096, 8192}, {32768, 3072}, {32768, 8192}, {32768, 1024}};
        for (int i = 0; i < 4; i++) {
            int64_t rows = shapes[i][0], cols = shapes[i][1], ld = cols;
            size_t nb = 2 * (size_t)(rows * cols);
            void *x = filled(nb), *dst = gu_malloc(nb / 2), *parts = gu_malloc(CP_FP8_AMAX_PARTS * 4);
            void *cnt = gu_malloc(4), *slot = gu_malloc(16);
            check(cudaMemset(cnt, 0, 4), "zeroing amax's counter"); /* each launch leaves it at 0 again */
            char shape[48];
            snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
            void *a[] = {&x, &rows, &cols, &ld, &parts, &cnt, &slot};
            bench(m, "amax_e4m3", rows, cols, a, "fp8_amax", shape, (double)nb, true);
            void *c[] = {&x, &rows, &cols, &ld, &slot, &dst};
            bench(m, "cast_e4m3", rows, cols, c, "fp8_cast", shape, 1.5 * (double)nb, true);
            bench(m, "cast_t_e4m3", rows, cols, c, "fp8_cast_t", shape, 1.5 * (double)nb, true);
            /* block scaling (train.fp8_scaling = "block"): the same copies with a scale per 1 x 128 of the copy's
             * rows; bytes: the source, the copy and the scales */
            const int64_t s1 = cp_fp8_scales(CP_GEMM_SCALE_1D, rows, cols),
                          s1t = cp_fp8_scales(CP_GEMM_SCALE_1D, cols, rows);
            void *scales = gu_malloc(4 * (size_t)(s1 > s1t ? s1 : s1t));
            void *b[] = {&x, &rows, &cols, &ld, &dst, &scales};
            bench(m, "cast_1d_e4m3", rows, cols, b, "fp8_cast_1d", shape, 1.5 * (double)nb + 4.0 * (double)s1, true);
            bench(m, "cast_t_1d_e4m3", rows, cols, b, "fp8_cast_t_1d", shape, 1.5 * (double)nb + 4.0 * (double)s1t,
                  true);
            /* row scaling (train.fp8_scaling = "row"): a scale per row of the copy; the transposed copy in two
             * launches, the columns' maxima (reading the source) and the cast (reading it again) */
            bench(m, "cast_row_e4m3", rows, cols, b, "fp8_cast_row", shape, 1.5 * (double)nb + 4.0 * (double)rows,
                  true);
            bench(m, "cast_t_row_max", rows, cols, b, "fp8_cast_t_row_max", shape, (double)nb, true);
            bench(m, "cast_t_row_e4m3", rows, cols, b, "fp8_cast_t_row", shape, 1.5 * (double)nb + 4.0 * (double)cols,
                  true);
            /* the same from the row copy cast_row left (its bytes and scales): half the reads */
            void *rowcopy = gu_malloc(nb / 2), *row_scales = gu_malloc(4 * (size_t)rows);
            check(cudaMemcpy(rowcopy, dst, nb / 2, cudaMemcpyDeviceToDevice), "copying the row copy");
            check(cudaMemcpy(row_scales, scales, 4 * (size_t)rows, cudaMemcpyDeviceToDevice), "copying its scales");
            void *r8[] = {&rowcopy, &rows, &cols, &cols, &dst, &scales, &row_scales};
            bench(m, "cast_t_row8_e4m3", rows, cols, r8, "fp8_cast_t_row8", shape,
                  (double)nb + 4.0 * (double)(rows + cols), true);
            gu_free_dev(rowcopy), gu_free_dev(row_scales);
            /* both copies from one read: the source, two copies and their scales */
            void *dst_t = gu_malloc(nb / 2), *scales_t = gu_malloc(4 * (size_t)s1t);
            void *rt[] = {&x, &rows, &cols, &ld, &dst, &scales, &dst_t, &scales_t};
            bench(m, "cast_rt_1d_e4m3", rows, cols, rt, "fp8_cast_rt_1d", shape,
                  2.0 * (double)nb + 4.0 * (double)(s1 + s1t), true);
            /* both with row scales: the row copy and the columns' maxima (one read), then cast_t_row (above) */
            bench(m, "cast_rt_row_e4m3", rows, cols, rt, "fp8_cast_rt_row", shape,
                  1.5 * (double)nb + 4.0 * (double)(rows + cols), true);
            gu_free_dev(x), gu_free_dev(dst), gu_free_dev(parts), gu_free_dev(cnt), gu_free_dev(slot);
            gu_free_dev(scales), gu_free_dev(dst_t), gu_free_dev(scales_t);
        }
        { /* a weight's copies in 128 x 128 tiles (the 3B MLP's 8192 x 3072), as rows and transposed */
            int64_t rows = 8192, cols = 3072, ld = cols;
            size_t nb = 2 * (size_t)(rows * cols);
            const int64_t s2 = cp_fp8_scales(CP_GEMM_SCALE_2D, rows, cols),
                          s2t = cp_fp8_scales(CP_GEMM_SCALE_2D, cols, rows);
            const double tiles = (double)((rows + 127) / 128 * ((cols + 127) / 128)); /* the scales written */
            void *x = filled(nb), *dst = gu_malloc(nb / 2), *scales = gu_malloc(4 * (size_t)(s2 > s2t ? s2 : s2t));
            void *b[] = {&x, &rows, &cols, &ld, &dst, &scales};
            bench(m, "cast_2d_e4m3", rows, cols, b, "fp8_cast_2d", "8192x3072", 1.5 * (double)nb + 4.0 * tiles, true);
            bench(m, "cast_t_2d_e4m3", rows, cols, b, "fp8_cast_t_2d", "8192x3072", 1.5 * (double)nb + 4.0 * tiles,
                  true);
            gu_free_dev(x), gu_free_dev(dst), gu_free_dev(scales);
        }
        gu_free(m);
    }
    { /* adamw over 256M parameters */
        int64_t n = (int64_t)1 << 28;
        cp_k_adamw(&k);
        size_t scratch = (size_t)cp_k_scratch_bytes(&k, "sumsq", n);
        gu_module *m = build(&k);
        size_t fb = 4 * (size_t)n;
        void *p = filled(fb), *mm = filled(fb), *v = filled(fb), *g = filled(fb), *pb = gu_malloc(2 * (size_t)n);
        void *out = filled(4), *part = gu_malloc(scratch), *cnt = gu_malloc(4);
        check(cudaMemset(cnt, 0, 4), "zeroing sumsq's counter"); /* each launch leaves it at 0 again */
        float lr = 1e-5f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 1.0f;
        int step = 10;
        void *a[] = {&p, &mm, &v, &g, &pb, &n, &lr, &b1, &b2, &eps, &wd, &gs, &step};
        bench(m, "update", n, 0, a, "adamw_update", "256M params", 30.0 * (double)n, true);
        void *b[] = {&g, &n, &part, &cnt, &out};
        bench(m, "sumsq", n, 0, b, "adamw_sumsq", "256M params", 4.0 * (double)n, true);
        gu_free_dev(p), gu_free_dev(mm), gu_free_dev(v), gu_free_dev(g), gu_free_dev(pb), gu_free_dev(out);
        gu_free_dev(part), gu_free_dev(cnt);
        gu_free(m);
    }
    { /* ulysses: 65536 tokens x 32 heads x 128 bf16 over 8 ranks (4 heads each), and the 1-rank strided copy */
        int64_t T = 65536, rb = 256;
        cp_k_ulysses(&k, 8, 1, T, 4, rb);
        gu_module *m = build(&k);
        size_t nb = (size_t)(T * 32 * rb);
        int64_t stride = 32 * rb;
        void *src = filled(nb), *dst = gu_malloc(nb);
        void *a[] = {&src, &stride, &dst};
        bench(m, "pack", 0, 0, a, "ulysses_pack", "65536x32x128 c8", 2.0 * nb, true);
        void *b[] = {&dst, &src, &stride};
        bench(m, "unpack", 0, 0, b, "ulysses_unpack", "65536x32x128 c8", 2.0 * nb, true);
        bench(m, "unpack_add", 0, 0, b, "ulysses_unpack_add", "65536x32x128 c8", 3.0 * nb, true);
        /* with the FP8 copy of the rows and their 1 x 128 scales (the attention output's) */
        void *copy = gu_malloc(nb / 2), *scales = gu_malloc(nb / 64);
        float e4 = 448.0f;
        void *bc[] = {&dst, &src, &stride, &e4, &copy, &scales};
        bench(m, "unpack_copy", 0, 0, bc, "ulysses_unpack_copy", "65536x32x128 c8", 2.5 * nb + nb / 64, true);
        gu_free_dev(copy), gu_free_dev(scales);
        gu_free(m);
        cp_k_ulysses(&k, 1, 1, T, 8, rb); /* one stage's 8 of 64 heads: columns of a wider buffer */
        m = build(&k);
        int64_t wide = 64 * rb;
        void *w = filled((size_t)(T * wide));
        void *c[] = {&w, &wide, &dst};
        bench(m, "pack", 0, 0, c, "ulysses_pack c1 stage", "65536x8of64x128", 2.0 * (double)(T * 8 * rb), true);
        gu_free_dev(src), gu_free_dev(dst), gu_free_dev(w);
        gu_free(m);
    }
    { /* loss on a tile of 2048 x 128256 */
        int64_t n = 2048, V = 128256;
        cp_k_loss(&k, V);
        gu_module *m = build(&k);
        size_t nb = 2 * (size_t)(n * V);
        int32_t *t = malloc(4 * (size_t)n);
        for (int64_t i = 0; i < n; i++) t[i] = (int32_t)((i * 7919) % V);
        void *dtg = gu_malloc(4 * (size_t)n), *x = filled(nb), *rows = gu_malloc(4 * (size_t)n);
        gu_upload(dtg, t, 4 * (size_t)n);
        free(t);
        float scale = 1.0f / 2048;
        void *a[] = {&x, &dtg, &rows, &scale, &n};
        bench(m, "fwdbwd", n, 0, a, "loss_fwdbwd", "2048x128256", 2.0 * nb, false);
        /* the fixed-order sum of a micro-batch's token losses (one block, once per micro-batch): 640K tokens */
        int64_t T = 655360;
        void *tl = filled(4 * (size_t)T), *ls = filled(4);
        void *b[] = {&tl, &T, &ls};
        bench(m, "sum", T, 0, b, "loss_sum", "655360 tokens", 4.0 * (double)T, false);
        gu_free_dev(dtg), gu_free_dev(x), gu_free_dev(rows), gu_free_dev(tl), gu_free_dev(ls);
        gu_free(m);
    }
    { /* cast and attn_delta */
        int64_t n = (int64_t)1 << 28;
        cp_k_cast(&k);
        gu_module *m = build(&k);
        void *s = filled(4 * (size_t)n), *d = gu_malloc(2 * (size_t)n);
        void *a[] = {&s, &d, &n};
        bench(m, "f32_to_bf16", n, 0, a, "cast_f32_to_bf16", "256M", 6.0 * (double)n, true);
        gu_free_dev(s), gu_free_dev(d);
        gu_free(m);
        cp_k_attn_delta(&k, 128);
        m = build(&k);
        int64_t T = 65536;
        int heads = 32;
        size_t nb = 2 * (size_t)(T * heads * 128);
        void *go = filled(nb), *o = filled(nb), *dl = gu_malloc(4 * (size_t)(T * heads));
        void *b[] = {&go, &o, &dl, &T, &heads};
        bench(m, "fwd", T, heads, b, "attn_delta", "65536x32x128", 2.0 * nb + 4.0 * T * heads, true);
        gu_free_dev(go), gu_free_dev(o), gu_free_dev(dl);
        gu_free(m);
    }
}

/* Whether entry role's launch for n rows asks for no more shared memory than a Hopper block has */
static bool fits(const cp_kernel_spec *k, const char *role, int64_t n) {
    cp_kdims d;
    return cp_k_dims(k, role, n, 0, gu_dev.sms, &d) == 0 && d.smem <= 227 * 1024;
}

/* The row-scaled producers (train.fp8_scaling = "row") at the 3B step's shapes, 32768 rows: rmsnorm's and SwiGLU's
 * _row entries beside their plain entries as the step runs them (the norm's forward without resid, its backward
 * with dresid), with the row copy and the transposed copy's column maxima, and SwiGLU's forward with the maxima
 * alone; for each depth of their pipes that fits (templates/row_pipe.cuh; the generator's own first). Bytes: the
 * inputs, the outputs, the copies and their scales. */
static void bench_row_producers(void) {
    int64_t n = 32768;
    const int64_t H = 3072, F = 8192;
    float e4 = 448.0f, e5 = 57344.0f, none = 0.0f;
    void *null = NULL;
    for (int v = 0; v < 4; v++) {
        cp_kernel_spec k;
        cp_k_rmsnorm(&k, H, 1e-5);
        const int64_t own = strtoll(cp_kspec_get(&k, "ROW_STAGES"), NULL, 10), stages = v ? v + 1 : own;
        cp_kspec_set_int(&k, "ROW_STAGES", stages);
        cp_kspec_set_int(&k, "ROW_STAGES_B", stages);
        if ((v && stages == own) || !fits(&k, "fwd_row", n) || !fits(&k, "bwd_row", n)) {
            cp_kspec_free(&k);
            continue;
        }
        size_t scratch = (size_t)cp_k_scratch_bytes(&k, "bwd", n);
        gu_module *m = build(&k);
        const size_t nb = 2 * (size_t)(n * H);
        int col_rows = (int)(cp_fp8_row_parts(n, H) / H);
        void *x = filled(nb), *r = filled(nb), *o = gu_malloc(nb), *w = filled(2 * (size_t)H);
        void *rs = filled(4 * (size_t)n);
        void *part = gu_malloc(scratch), *copy = gu_malloc(nb / 2), *scales = gu_malloc(4 * (size_t)n);
        void *cm = gu_malloc(4 * (size_t)(col_rows * H));
        check(cudaMemset(cm, 0, 4 * (size_t)(col_rows * H)), "zeroing the column maxima");
        char shape[48];
        snprintf(shape, sizeof shape, "32768x3072, %lld stages", (long long)stages);
        if (v == 0) {
            void *a[] = {&x, &null, &null, &w, &o, &rs, &n, &null, &none};
            bench(m, "fwd", n, 0, a, "rmsnorm_fwd", "32768x3072", 2.0 * nb + 4.0 * n, true);
            void *b[] = {&r, &x, &w, &rs, &r, &o, &part, &n, &null, &none};
            bench(m, "bwd", n, 0, b, "rmsnorm_bwd dresid", "32768x3072", 4.0 * nb + 4.0 * n, true);
        }
        void *ar[] = {&x, &null, &null, &w, &o, &rs, &n, &e4, &copy, &scales, &cm, &col_rows};
        bench(m, "fwd_row", n, 0, ar, "rmsnorm_fwd_row", shape, 2.5 * nb + 8.0 * n, true);
        void *br[] = {&r, &x, &w, &rs, &r, &o, &part, &n, &e5, &copy, &scales, &cm, &col_rows};
        bench(m, "bwd_row", n, 0, br, "rmsnorm_bwd_row dresid", shape, 4.5 * nb + 8.0 * n, true);
        gu_free_dev(x), gu_free_dev(r), gu_free_dev(o), gu_free_dev(w), gu_free_dev(rs), gu_free_dev(part);
        gu_free_dev(copy), gu_free_dev(scales), gu_free_dev(cm);
        gu_free(m);
    }
    for (int v = 0; v < 4; v++) {
        cp_kernel_spec k;
        cp_k_swiglu(&k, F);
        const int64_t own_f = strtoll(cp_kspec_get(&k, "ROW_STAGES_F"), NULL, 10);
        const int64_t own_b = strtoll(cp_kspec_get(&k, "ROW_STAGES_B"), NULL, 10), stages = v ? v + 1 : own_b;
        /* fwd_row's two blocks an SM hold three stages at most */
        cp_kspec_set_int(&k, "ROW_STAGES_F", v == 0 ? own_f : CP_MIN(stages, 3));
        cp_kspec_set_int(&k, "ROW_STAGES_B", stages);
        if ((v && stages == own_b) || !fits(&k, "fwd_row", n) || !fits(&k, "bwd_row", n)) {
            cp_kspec_free(&k);
            continue;
        }
        gu_module *m = build(&k);
        const size_t nb = 2 * (size_t)(n * F);
        int col_rows = (int)(cp_fp8_row_parts(n, F) / F), one = 1;
        void *g = filled(nb), *u = filled(nb), *o = filled(nb), *c1 = gu_malloc(nb / 2), *c2 = gu_malloc(nb / 2);
        void *s1 = gu_malloc(4 * (size_t)n), *s2 = gu_malloc(4 * (size_t)n);
        void *m1 = gu_malloc(4 * (size_t)(col_rows * F)), *m2 = gu_malloc(4 * (size_t)(col_rows * F));
        check(cudaMemset(m1, 0, 4 * (size_t)(col_rows * F)), "zeroing the column maxima");
        check(cudaMemset(m2, 0, 4 * (size_t)(col_rows * F)), "zeroing the column maxima");
        char shape[48];
        snprintf(shape, sizeof shape, "32768x8192, %lld stages", (long long)(v == 0 ? own_f : CP_MIN(stages, 3)));
        if (v == 0) {
            void *a[] = {&g, &u, &o, &n, &null, &none};
            bench(m, "fwd", n, 0, a, "swiglu_fwd", "32768x8192", 3.0 * nb, true);
            void *b[] = {&o, &g, &u, &n, &null, &none, &null, &none};
            bench(m, "bwd", n, 0, b, "swiglu_bwd", "32768x8192", 5.0 * nb, true);
        }
        void *ar[] = {&g, &u, &o, &n, &e4, &c1, &s1, &m1, &col_rows};
        bench(m, "fwd_row", n, 0, ar, "swiglu_fwd_row", shape, 3.5 * nb + 4.0 * n, true);
        void *am[] = {&g, &u, &o, &n, &e4, &null, &null, &m1, &col_rows};
        bench(m, "fwd_row", n, 0, am, "swiglu_fwd_row maxima", shape, 3.0 * nb, true);
        snprintf(shape, sizeof shape, "32768x8192, %lld stages", (long long)stages);
        int store = 3; /* dgate and dup */
        void *br[] = {&o, &g, &u, &n, &e5, &c1, &s1, &m1, &col_rows, &e4, &c2, &s2, &m2, &one, &store};
        bench(m, "bwd_row", n, 0, br, "swiglu_bwd_row", shape, 6.0 * nb + 8.0 * n, true);
        gu_free_dev(g), gu_free_dev(u), gu_free_dev(o), gu_free_dev(c1), gu_free_dev(c2), gu_free_dev(s1);
        gu_free_dev(s2), gu_free_dev(m1), gu_free_dev(m2);
        gu_free(m);
    }
}

/* bench_kernels [row]: every family's kernels, or (row) the row-scaled producers alone */
int main(int argc, char **argv) {
    gu_init_or_skip("bench_kernels");
    gu_cmocka = false;
    printf("\n%-22s %-26s %13s %13s\n", "kernel", "shape", "median", "bandwidth");
    bench_memcpy();
    if (argc < 2 || strcmp(argv[1], "row")) bench_families();
    bench_row_producers();

    printf("\n%-22s %-26s %10s %9s %8s %10s  %s\n", "kernel", "shape", "median us", "GB/s", "%4300", "%memcpy",
           "goal >= 70% of 4300");
    int below = 0;
    for (int i = 0; i < nres; i++) {
        double pct = 100 * res[i].gbps / CEILING_GBPS;
        const char *g = !res[i].goal ? "-" : pct >= 100 * GOAL ? "ok" : "BELOW";
        below += res[i].goal && pct < 100 * GOAL;
        printf("%-22s %-26s %10.1f %9.0f %7.1f%% %9.1f%%  %s\n", res[i].name, res[i].shape, res[i].us, res[i].gbps,
               pct, 100 * res[i].gbps / memcpy_gbps, g);
    }
    printf("%d kernels timed, %d below the goal; this run's cudaMemcpy ceiling %.0f GB/s\n", nres - 1, below,
           memcpy_gbps);
    return 0;
}
