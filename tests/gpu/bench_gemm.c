/* bench_gemm.c: every GEMM of a training step on cuBLASLt, bf16 as the plan runs it beside FP8 (runtime/gemm.c), for
 * the shapes of the 3B step at 32K and the 8B step at 128K on one GPU (or the spec and length given).
 * Method: the plan is built as `cpgen plan SPEC --seq S --gpus 1` builds it; its GEMM steps are grouped by name and
 * shape, each counted as often as a step runs it (folded tiles included). Each distinct GEMM is timed as planned
 * (bf16 inputs, its own transposes, residual and accumulation) and as train.precision = "fp8" runs it (the form
 * of cp_plan_fp8_gemm: the same m, n, k in the x W^T form Hopper's FP8 tensor cores take, the backward's GEMMs
 * reading transposed FP8 copies, E4M3 x E4M3 in the forward, E5M2 (the gradient) x E4M3 in the backward, the same
 * output type, residual and accumulation), with cuBLASLt's promotion to fp32 and with fast accumulation, and as
 * train.fp8_scaling = "block" runs it (the same FP8 form with block scales, as cp_plan_fp8_gemm gives them: a weight
 * input's per 128 x 128 tile, any other's per 1 x 128 of k, always promoted; scales all 1, in buffers of their real
 * sizes; the GEMMs whose k is not a multiple of 128 stay bf16 there, as the plan leaves them). The weights'
 * gradients are timed on FP8 too, as train.fp8_weight_grads = "fp8" runs them. The GEMMs that pass leaves in bf16
 * (the LM head and its gradients) show bf16 only. Inputs are random bytes, finite in every type; each time is the
 * median of REPS launches timed with CUDA events after WARM. TF/s = 2 m n k / time. The totals weigh each GEMM by its
 * count: the step's GEMM seconds in bf16 and with FP8 where FP8 applies, before the casts and transposes FP8 adds.
 * Where the generator's FP8 GEMM kernel (templates/gemm_fp8.cu) takes a block-scaled GEMM, it is timed too (column
 * "own"), and a line gives the block-scaled total with it in place of cuBLASLt's where it is faster. The last line,
 * GEMMSUM SPEC SEQ bf16 fp8 fast block best row rowfast, gives the totals in seconds for scripts (best: each
 * block-scaled GEMM on the faster of cuBLASLt and the own kernel).
 * Column "row" times each FP8 GEMM with a scale per row of each input (train.fp8_scaling = "row": cuBLASLt's
 * OUTER_VEC_32F, applied after the sums, promoted; the per-tensor form's types; scales all 1), and "row fast" the
 * same with fast accumulation; their totals close the GEMMSUM line.
 * With --algos N every GEMM's time is the fastest of the first N algorithms cuBLASLt's heuristic offers for it (the
 * heuristic's own first choice is what the runtime launches), and a line compares the totals with the first's.
 * --only NAME times the GEMMs of that name alone (a profiler's run); --cluster N and --consumers N build the own
 * kernel with clusters of N CTAs and N consumer warpgroups (cp_k_gemm_fp8).
 * usage: bench_gemm [--algos N] [--only NAME] [--cluster N] [--consumers N] [SPEC SEQ]...
 *        (default: llama3b 32K llama8b 128K) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "gemm_fp8.h"
#include "gpu_util.h"
#include "plan.h"
#include "plan_internal.h"
#include "spec.h"

#define REPS 20
#define WARM 3

typedef struct {
    char what[40];
    cp_gemm g;
    bool fp8;      /* a GEMM train.precision = "fp8" runs on FP8 inputs (a layer's); else the LM head's, in bf16 */
    cp_gemm f;     /* its FP8 form, as the plan's FP8 pass gives it */
    bool block;    /* it runs on FP8 inputs with train.fp8_scaling = "block" too (k a multiple of 128) */
    cp_gemm fb;    /* its block-scaled FP8 form */
    int64_t count;
} gemm_use;

static void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        char m[1024];
        cp_cuda_errmsg(e, what, m, sizeof m);
        gu_fail("%s", m);
    }
}

static bool same_shape(const cp_gemm *a, const cp_gemm *b) {
    return a->m == b->m && a->n == b->n && a->k == b->k && a->trans_a == b->trans_a && a->trans_b == b->trans_b &&
           a->has_c == b->has_c && a->accumulate == b->accumulate && a->out_f32 == b->out_f32;
}

/* The generator's kernel for a block-scaled GEMM: its median milliseconds on these buffers, or -1 where it does
 * not take the GEMM. */
typedef struct {
    cudaKernel_t k;
    cp_kdims d;
    cp_gemm_fp8_args a;
} own_launch;

static void launch_own(void *ctx) {
    own_launch *l = ctx;
    char err[1024];
    if (cp_gemm_fp8_launch(l->k, &l->d, &l->a, 0, err, sizeof err)) gu_fail("%s", err);
}

static double time_own(const cp_gemm *g, cp_gemm_fp8_cfg cfg, char *A, char *B, char *C, char *D, const float *sa,
                       const float *sb) {
    cp_kernel_spec ks;
    if (!cp_gemm_fp8_kspec(g, cfg, &ks)) return -1;
    gu_module *m = gu_build(&ks);
    cp_kspec_free(&ks);
    own_launch l = {.k = gu_kernel(m, "sm90"), .d = gu_dims(m, "sm90", g->m, 0)};
    char err[2048];
    if (cp_gemm_fp8_args_make(&l.a, g, &m->spec, A, B, g->has_c ? C : NULL, D, sa, sb, err, sizeof err) ||
        cp_kernel_set_max_smem(l.k, l.d.smem, err, sizeof err))
        gu_fail("%s", err);
    double t = gu_median_ms(REPS, WARM, launch_own, &l);
    gu_free(m);
    return t;
}

typedef struct {
    cp_gemm_lib *lib;
    int id;
    const void *A, *B, *C;
    void *D;
    const float *sa, *sb;
} gemm_launch;

static void launch_gemm(void *ctx) {
    const gemm_launch *l = ctx;
    char err[2048];
    if (cp_gemm_launch_scaled(l->lib, l->id, l->A, l->B, l->C, l->D, l->sa, l->sb, 0, err, sizeof err))
        gu_fail("%s", err);
}

static int algos; /* --algos N: also time the heuristic's first N algorithms of each GEMM, and keep the fastest */
static const char *only; /* --only NAME: the GEMMs of that name alone (for a profiler) */
static cp_gemm_fp8_cfg own_cfg; /* --cluster N, --consumers N: the own kernel's (cp_k_gemm_fp8; 0 its defaults) */

/* Median milliseconds of REPS launches of g (scales NULL: bf16) on buffers big enough for it: of the heuristic's
 * algorithm, or with --algos of the fastest of its first N (the heuristic's time in *first, when given). */
static double time_gemm_first(cp_gemm_lib *lib, const cp_gemm *g, const char *what, char *A, char *B, char *C,
                              char *D, const float *sa, const float *sb, double *first) {
    char err[2048];
    int id = cp_gemm_prepare(lib, g, what, A, B, g->has_c ? C : NULL, D, err, sizeof err);
    if (id < 0) gu_fail("%s", err);
    gemm_launch l = {lib, id, A, B, C, D, sa, sb};
    double t = gu_median_ms(REPS, WARM, launch_gemm, &l);
    if (first) *first = t;
    if (algos < 2) return t;
    int n = cp_gemm_candidates(lib, id, algos, err, sizeof err);
    if (n < 0) gu_fail("%s", err);
    for (int c = 1, best = 0; c <= n; c++) { /* the last round puts the fastest back */
        if (cp_gemm_pick(lib, id, c < n ? c : best, err, sizeof err)) gu_fail("%s", err);
        if (c == n) break;
        double tc = gu_median_ms(REPS, WARM, launch_gemm, &l);
        if (tc < t) t = tc, best = c;
    }
    return t;
}

static double time_gemm(cp_gemm_lib *lib, const cp_gemm *g, const char *what, char *A, char *B, char *C, char *D,
                        const float *sa, const float *sb) {
    return time_gemm_first(lib, g, what, A, B, C, D, sa, sb, NULL);
}

static void bench(cp_gemm_lib *lib, const char *spec, const char *seq, gu_rng *rng) {
    char set_seq[64], err[4096];
    snprintf(set_seq, sizeof set_seq, "train.seq_len=%s", seq);
    const char *sets[] = {set_seq, "parallel.gpus=1"};
    cp_spec s;
    cp_plan P;
    if (cp_spec_load(spec, sets, 2, &s, err, sizeof err) || cp_plan_build_folded(&s, &P, err, sizeof err))
        gu_fail("%s at %s: %s", spec, seq, err);
    /* the plan as each scaling sees it, for cp_plan_fp8_eligible and cp_plan_fp8_gemm (which read train's fp8_scaling
     * and the buffers' categories; nothing else differs, so copies of P with the flags set each way do), each with
     * its own default format: per tensor "hybrid" (E5M2 gradients), block E4M3 throughout */
    cp_plan Pt = P, Pb = P;
    Pt.spec.train.fp8_scaling = CP_FP8_SCALING_TENSOR;
    Pt.spec.train.fp8_e4m3_grads = false;
    Pt.spec.train.fp8_bf16_wgrad = false;
    Pb.spec.train.fp8_scaling = CP_FP8_SCALING_BLOCK;
    Pb.spec.train.fp8_e4m3_grads = true;
    Pb.spec.train.fp8_bf16_wgrad = false; /* both: the weights' gradients on FP8 too (fp8_weight_grads = "fp8") */
    gemm_use *u = calloc((size_t)P.nsteps, sizeof *u);
    int nu = 0;
    for (int i = 0; i < P.nsteps; i++) {
        const cp_step *st = &P.steps[i];
        if (st->kind != CP_OP_GEMM || (only && strcmp(st->what, only))) continue;
        int j = 0;
        while (j < nu && !(same_shape(&u[j].g, &st->gemm) && !strcmp(u[j].what, st->what))) j++;
        if (j == nu) {
            snprintf(u[nu].what, sizeof u[nu].what, "%s", st->what);
            u[nu].fp8 = cp_plan_fp8_eligible(&Pt.spec.train, st);
            if (u[nu].fp8) u[nu].f = cp_plan_fp8_gemm(&Pt, st);
            u[nu].block = cp_plan_fp8_eligible(&Pb.spec.train, st);
            if (u[nu].block) u[nu].fb = cp_plan_fp8_gemm(&Pb, st);
            u[nu++].g = st->gemm;
        }
        u[j].count += cp_plan_step_repeats(&P, i);
    }
    /* buffers for the largest operands, and the largest block scales of either input */
    size_t amax = 0, bmax = 0, dmax = 0, smax = 0;
    for (int j = 0; j < nu; j++) {
        const cp_gemm *g = &u[j].g, *f = &u[j].fb;
        size_t a = (size_t)((g->trans_a ? g->k : g->m) * g->lda) * 2;
        size_t b = (size_t)((g->trans_b ? g->n : g->k) * g->ldb) * 2, d = (size_t)(g->m * g->ldd) * 4;
        amax = a > amax ? a : amax, bmax = b > bmax ? b : bmax, dmax = d > dmax ? d : dmax;
        if (!u[j].block) continue;
        size_t sa = (size_t)cp_fp8_scales(f->a_scale, f->m, f->k), sb = (size_t)cp_fp8_scales(f->b_scale, f->n, f->k);
        smax = sa > smax ? sa : smax, smax = sb > smax ? sb : smax;
    }
    for (int j = 0; j < nu; j++) /* row scales: one per row of A (m) and of B (n) */
        if (u[j].fp8) {
            size_t r = (size_t)(u[j].g.m > u[j].g.n ? u[j].g.m : u[j].g.n);
            smax = r > smax ? r : smax;
        }
    char *A = gu_malloc(amax), *B = gu_malloc(bmax), *C = gu_malloc(dmax), *D = gu_malloc(dmax);
    /* random bytes 0x20-0x3f with a random sign: finite as E4M3 (exponent 4-7), as E5M2 (8-15) and as bf16 pairs */
    uint8_t *h = malloc(1 << 26);
    for (size_t off = 0; off < amax; off += 1 << 26) {
        size_t n = amax - off < (1 << 26) ? amax - off : (1 << 26);
        for (size_t i = 0; i < n; i++) h[i] = (uint8_t)((gu_next(rng) & 0x9f) | 0x20);
        gu_upload(A + off, h, n);
    }
    free(h);
    check(cudaMemcpy(B, A, bmax < amax ? bmax : amax, cudaMemcpyDeviceToDevice), "filling B");
    check(cudaMemset(C, 0, dmax), "clearing C");
    check(cudaMemset(D, 0, dmax), "clearing D");
    /* each scale on its own 16 bytes, as cuBLASLt takes them */
    const float scales[8] = {1.0f / 64, 0, 0, 0, 1.0f / 64};
    float *dS = gu_malloc(sizeof scales);
    gu_upload(dS, scales, sizeof scales);
    /* block (and row) scales of 1 for A and B (the bytes' values as they are), padding included */
    const size_t sbytes = 4 * (smax ? smax : 1);
    float *ones = malloc(sbytes), *dSA = gu_malloc(sbytes), *dSB = gu_malloc(sbytes);
    for (size_t i = 0; i < sbytes / 4; i++) ones[i] = 1.0f;
    gu_upload(dSA, ones, sbytes);
    gu_upload(dSB, ones, sbytes);
    free(ones);

    printf("\n%s at %s tokens on one GPU: %d distinct GEMMs\n", spec, seq, nu);
    printf("%-14s %5s %21s %4s | %8s %6s | %8s %6s | %8s %6s | %8s %6s | %8s %6s | %8s %6s | %8s %6s | %5s\n",
           "GEMM", "count", "m x n x k", "form", "bf16 ms", "TF/s", "fp8 ms", "TF/s", "fast ms", "TF/s", "block ms",
           "TF/s", "own ms", "TF/s", "row ms", "TF/s", "rfast ms", "TF/s", "x");
    double t_bf16 = 0, t_fp8 = 0, t_fast = 0, fl_fp8 = 0, tb_fp8part = 0;
    double t_blk = 0, fl_blk = 0, tb_blkpart = 0; /* the same with block scales, over the GEMMs they apply to */
    double t_bf16_first = 0, t_blk_first = 0;     /* bf16 and block with the heuristic's first algorithm */
    double t_best = 0, t_own = 0, t_own_blk = 0;  /* block with the faster of cuBLASLt and the own kernel; where it ran */
    double t_row = 0, t_rowfast = 0;              /* row scales, promoted and with fast accumulation */
    for (int j = 0; j < nu; j++) {
        const cp_gemm *g = &u[j].g;
        double fl = 2.0 * (double)g->m * (double)g->n * (double)g->k;
        double tb1, tb = time_gemm_first(lib, g, u[j].what, A, B, C, D, NULL, NULL, &tb1);
        t_bf16 += tb * (double)u[j].count;
        t_bf16_first += tb1 * (double)u[j].count;
        char form[8];
        snprintf(form, sizeof form, "%s%s", g->trans_a ? "T" : "N", g->trans_b ? "T" : "N");
        if (!u[j].fp8) { /* then not with block scales either */
            t_fp8 += tb * (double)u[j].count;
            t_fast += tb * (double)u[j].count;
            t_blk += tb * (double)u[j].count;
            t_blk_first += tb1 * (double)u[j].count;
            t_best += tb * (double)u[j].count;
            t_row += tb * (double)u[j].count;
            t_rowfast += tb * (double)u[j].count;
            printf("%-14s %5lld %6lldx%6lldx%6lld %4s | %8.3f %6.0f | %8s %6s | %8s %6s | %8s %6s | %8s %6s | "
                   "%8s %6s | %8s %6s | %5s\n",
                   u[j].what, (long long)u[j].count, (long long)g->m, (long long)g->n, (long long)g->k, form, tb,
                   fl / tb / 1e9, "bf16", "", "bf16", "", "bf16", "", "bf16", "", "bf16", "", "bf16", "", "");
            continue;
        }
        cp_gemm f = u[j].f; /* timed with cuBLASLt's promotion to fp32 and with fast accumulation */
        f.fast_accum = false;
        double tf = time_gemm(lib, &f, u[j].what, A, B, C, D, dS, dS + 4);
        f.fast_accum = true;
        double tq = time_gemm(lib, &f, u[j].what, A, B, C, D, dS, dS + 4);
        t_fp8 += tf * (double)u[j].count;
        t_fast += tq * (double)u[j].count;
        cp_gemm r = u[j].f; /* one scale per row of each input */
        r.a_scale = r.b_scale = CP_GEMM_SCALE_ROW;
        r.fast_accum = false;
        double tr = time_gemm(lib, &r, u[j].what, A, B, C, D, dSA, dSB);
        r.fast_accum = true;
        double trq = time_gemm(lib, &r, u[j].what, A, B, C, D, dSA, dSB);
        t_row += tr * (double)u[j].count;
        t_rowfast += trq * (double)u[j].count;
        fl_fp8 += fl * (double)u[j].count;
        tb_fp8part += tb * (double)u[j].count;
        /* with block scales where the plan would use them (k a multiple of 128), else it stays bf16 */
        char blk_ms[16] = "bf16", blk_tf[16] = "", own_ms[16] = "-", own_tf[16] = "";
        if (u[j].block) {
            double tk1, tk = time_gemm_first(lib, &u[j].fb, u[j].what, A, B, C, D, dSA, dSB, &tk1);
            double to = time_own(&u[j].fb, own_cfg, A, B, C, D, dSA, dSB);
            t_blk += tk * (double)u[j].count;
            t_blk_first += tk1 * (double)u[j].count;
            t_best += (to > 0 && to < tk ? to : tk) * (double)u[j].count;
            fl_blk += fl * (double)u[j].count;
            tb_blkpart += tb * (double)u[j].count;
            snprintf(blk_ms, sizeof blk_ms, "%.3f", tk);
            snprintf(blk_tf, sizeof blk_tf, "%.0f", fl / tk / 1e9);
            if (to > 0) {
                t_own += to * (double)u[j].count;
                t_own_blk += tk * (double)u[j].count;
                snprintf(own_ms, sizeof own_ms, "%.3f", to);
                snprintf(own_tf, sizeof own_tf, "%.0f", fl / to / 1e9);
            }
        } else {
            t_blk += tb * (double)u[j].count;
            t_blk_first += tb1 * (double)u[j].count;
            t_best += tb * (double)u[j].count;
        }
        printf("%-14s %5lld %6lldx%6lldx%6lld %4s | %8.3f %6.0f | %8.3f %6.0f | %8.3f %6.0f | %8s %6s | %8s %6s | "
               "%8.3f %6.0f | %8.3f %6.0f | %5.2f\n",
               u[j].what, (long long)u[j].count, (long long)g->m, (long long)g->n, (long long)g->k, form, tb,
               fl / tb / 1e9, tf, fl / tf / 1e9, tq, fl / tq / 1e9, blk_ms, blk_tf, own_ms, own_tf, tr, fl / tr / 1e9,
               trq, fl / trq / 1e9, tb / tq);
    }
    printf("%s at %s: the step's GEMMs %.3f s in bf16 (of them %.3f s where FP8 applies, %.0f TF/s); with FP8 there "
           "%.3f s (%.0f TF/s), with fast accumulation %.3f s (%.0f TF/s): the GEMMs %.2fx / %.2fx faster\n",
           spec, seq, t_bf16 / 1e3, tb_fp8part / 1e3, fl_fp8 / tb_fp8part / 1e9, (t_fp8 - (t_bf16 - tb_fp8part)) / 1e3,
           fl_fp8 / (t_fp8 - (t_bf16 - tb_fp8part)) / 1e9, (t_fast - (t_bf16 - tb_fp8part)) / 1e3,
           fl_fp8 / (t_fast - (t_bf16 - tb_fp8part)) / 1e9, t_bf16 / t_fp8, t_bf16 / t_fast);
    /* block scales apply to fewer GEMMs (k a multiple of 128): their own part of the bf16 time */
    printf("%s at %s: with block scales (%.3f s in bf16 where they apply, %.0f TF/s) %.3f s there (%.0f TF/s), the "
           "step's GEMMs %.3f s: %.2fx faster than bf16\n",
           spec, seq, tb_blkpart / 1e3, fl_blk / tb_blkpart / 1e9, (t_blk - (t_bf16 - tb_blkpart)) / 1e3,
           fl_blk / (t_blk - (t_bf16 - tb_blkpart)) / 1e9, t_blk / 1e3, t_bf16 / t_blk);
    printf("%s at %s: the own FP8 kernel %.3f s where it runs against cuBLASLt's block-scaled %.3f s; the step's "
           "GEMMs with the faster of the two %.3f s (block scales, cuBLASLt alone: %.3f s)\n",
           spec, seq, t_own / 1e3, t_own_blk / 1e3, t_best / 1e3, t_blk / 1e3);
    if (algos > 1)
        printf("%s at %s: the fastest of the heuristic's first %d algorithms against its first: bf16 %.3f s against "
               "%.3f s, block %.3f s against %.3f s\n", spec, seq, algos, t_bf16 / 1e3, t_bf16_first / 1e3,
               t_blk / 1e3, t_blk_first / 1e3);
    printf("%s at %s: with row scales %.3f s where FP8 applies (%.0f TF/s), with fast accumulation %.3f s "
           "(%.0f TF/s)\n", spec, seq, (t_row - (t_bf16 - tb_fp8part)) / 1e3, fl_fp8 / (t_row - (t_bf16 - tb_fp8part)) / 1e9,
           (t_rowfast - (t_bf16 - tb_fp8part)) / 1e3, fl_fp8 / (t_rowfast - (t_bf16 - tb_fp8part)) / 1e9);
    printf("GEMMSUM %s %s %.4f %.4f %.4f %.4f %.4f %.4f %.4f\n", spec, seq, t_bf16 / 1e3, t_fp8 / 1e3, t_fast / 1e3,
           t_blk / 1e3, t_best / 1e3, t_row / 1e3, t_rowfast / 1e3);
    gu_free_dev(A), gu_free_dev(B), gu_free_dev(C), gu_free_dev(D), gu_free_dev(dS), gu_free_dev(dSA), gu_free_dev(dSB);
    free(u);
    cp_plan_free(&P);
}

int main(int argc, char **argv) {
    gu_init_or_skip("bench_gemm");
    int major = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), "reading the compute capability");
    if (major < 9) gu_skip("bench_gemm", "FP8 tensor cores need compute capability 9.0, this GPU has %d", major);
    void *ws = gu_malloc(CP_GEMM_WORKSPACE);
    cp_gemm_lib *lib;
    char err[1024];
    if (cp_gemm_lib_create(&lib, ws, CP_GEMM_WORKSPACE, err, sizeof err)) gu_fail("%s", err);
    gu_rng rng;
    gu_seed(&rng, 20261202);
    int a = 1;
    for (; a + 1 < argc && argv[a][0] == '-'; a += 2) {
        if (!strcmp(argv[a], "--algos")) algos = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--only")) only = argv[a + 1];
        else if (!strcmp(argv[a], "--cluster")) own_cfg.cluster = atoi(argv[a + 1]);
        else if (!strcmp(argv[a], "--consumers")) own_cfg.consumers = atoi(argv[a + 1]);
        else gu_fail("bench_gemm: unknown option %s (--algos N, --only NAME, --cluster N, --consumers N)", argv[a]);
    }
    if (argc > a) {
        for (int i = a; i + 1 < argc; i += 2) bench(lib, argv[i], argv[i + 1], &rng);
    } else {
        bench(lib, "llama3b", "32K", &rng);
        bench(lib, "llama8b", "128K", &rng);
    }
    cp_gemm_lib_destroy(lib);
    gu_free_dev(ws);
    return 0;
}
