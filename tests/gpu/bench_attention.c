/* bench_attention.c: causal attention forward and backward at head_dim 128 (or 64), 32K tokens, on the shapes of
 * bench_shapes below (query/KV heads): 32/32 and 32/8, and 64/8 (a Llama-3.1-70B-like layer, the shape cudnn-frontend
 * publishes SDPA figures for: causal, head_dim 128, batch 1): median time of many runs (CUDA events) and TF/s by the
 * brief's count (forward 4 S^2 H D / 2 when causal, H the query heads, backward 2.5 times that). The backward time
 * covers zeroing the dQ progress counters, bwd (whose dQ sums are ordered, so the same bits run to run) and the dQ
 * conversion; on Hopper also with atomic dQ sums (train.deterministic = false), whose time covers zeroing the whole
 * dQ workspace instead.
 * Then it runs tests/gpu/bench_attention_sdpa.py (PyTorch SDPA, FLASH_ATTENTION and CUDNN_ATTENTION backends) on the
 * same shapes (handed to it by --shapes, so that the list lives here only), when python3 with torch is there, and
 * prints both side by side.
 * On Hopper it times both forwards and both backwards: the wgmma ones the runtime runs and the mma.sync ones of sm_80
 * and sm_89.
 * --docs LEN also times the kernels with document masks (templates/attention.cu) on documents of LEN tokens (the last
 * one shorter), causal, and prints their TF/s counted on the scores they keep (sum over documents of L (L + 1) / 2
 * per head) beside the causal kernels' time: the work skipped outside the documents shows as time saved; the lines
 * "DOCS <qh> <kvh> <len> <fwd_ms> <bwd_ms>" (the kernels the runtime runs) are for tools/gpu-docs-bench.sh to read.
 * --only fwd|bwd times that direction of the kernels the runtime runs (wgmma on Hopper) and nothing else: no SDPA, no
 * mma.sync kernels, no atomic dQ sums, no documents, and no forward at all for fwd (for bwd one forward runs first,
 * for the rowsum(dO * O) the backward reads). The kernel of that direction runs twice to warm up and then --reps
 * times, so a profiler can be pointed at one launch of it: tools/gpu-attention-profile.sh runs
 * `ncu --kernel-name regex:^attention_bwd_(sm90_)?d[0-9] --launch-skip 2 --launch-count 1` on `--only bwd --reps 1`.
 * Options: --seq N (default 32768), --head-dim 64|128 (default 128), --reps N (default 10), --no-sdpa, --quick (only
 * what the runtime runs beside SDPA's CUDNN backend: no mma.sync kernels on Hopper, no FLASH backend), --docs LEN,
 * --shapes QH/KVH[,QH/KVH...] (default every shape of bench_shapes; KVH must divide QH), --only fwd|bwd.
 * Memory for 64/8 heads at --seq 131072 (the longest tools/gpu-attention-check.sh runs), head_dim 128: q, o, dO, dQ
 * 2 GiB each (bf16), K, V, dK, dV 256 MiB each, the fp32 dQ workspace 4 GiB, LSE and delta 32 MiB each: about
 * 13.1 GiB on the GPU (one shape at a time) and 6.5 GiB of host copies. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "attn_util.h"
#include "gpu_util.h"
#include "ref/bf16.h"
#include "util.h"

/* The shapes timed by default, query/KV heads; the SDPA peer gets the same list through --shapes. */
static const struct {
    int qh, kvh;
} bench_shapes[] = {{32, 32}, {32, 8}, {64, 8}};
#define MAX_SHAPES 16

typedef struct {
    char name[32]; /* "MHA 32/32", "GQA 32/8" */
    int qh, kvh;
    double fwd_ms, bwd_ms;         /* < 0: not run (--only) */
    double bwd_atomic_ms;          /* on Hopper: the backward with atomic dQ sums; < 0: not run */
    double fwd_mma_ms, bwd_mma_ms; /* on Hopper: the mma.sync kernels of sm_80 and sm_89 beside the wgmma ones; < 0:
                                      not run */
    double sdpa_fwd_ms[2], sdpa_bwd_ms[2]; /* flash, cudnn; < 0: not run */
    double docs_fwd_ms, docs_bwd_ms, docs_fwd_mma_ms, docs_bwd_mma_ms; /* --docs; < 0: not run */
} bench_row;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Uniform bf16 values in [-1, 1): a fast generator, since the inputs are hundreds of millions of elements. */
static uint16_t *rand_bf16(int64_t n, uint64_t seed) {
    uint16_t *p = malloc(sizeof(uint16_t) * (size_t)n);
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        float f = (float)((double)(x >> 11) / (double)(1ULL << 53) * 2.0 - 1.0);
        p[i] = f32_to_bf16(f == 0.0f ? 1e-3f : f);
    }
    return p;
}

static double flops_fwd(int64_t S, int H, int64_t D) { return 4.0 * (double)S * (double)S * H * (double)D / 2; }

/* Scores kept per head by causal attention over documents of len tokens (the last one shorter) in S. */
static double kept_scores(int64_t S, int64_t len) {
    double n = 0;
    for (int64_t a = 0; a < S; a += len) {
        const double l = (double)(S - a < len ? S - a : len);
        n += l * (l + 1) / 2;
    }
    return n;
}

/* What --only asks for: everything, or one direction of the runtime's kernels alone. */
typedef enum { ONLY_NONE, ONLY_FWD, ONLY_BWD } only_dir;

static void bench(bench_row *r, int64_t S, int64_t D, int reps, bool quick, int64_t doc_len, only_dir only) {
    attn_mod mods[3]; /* dQ sums ordered, atomic; with documents */
    memset(mods, 0, sizeof mods);
    mods[0].sh = (attn_shape){S, D, r->qh, r->kvh, true, false, false, false};
    mods[1].sh = (attn_shape){S, D, r->qh, r->kvh, true, false, true, false};
    mods[2].sh = (attn_shape){S, D, r->qh, r->kvh, true, false, false, true};
    /* --only needs the module the runtime runs alone: the others would cost compile time and nothing else */
    const int nmods = only != ONLY_NONE ? 1 : doc_len > 0 ? 3 : 2;
    attn_build(mods, nmods);
    int *docs = NULL; /* doc_start then doc_end on the device */
    if (doc_len > 0) {
        int *h = malloc(sizeof(int) * (size_t)(2 * S));
        for (int64_t i = 0; i < S; i++) h[i] = (int)(i / doc_len * doc_len), h[S + i] = (int)CP_MIN(h[i] + doc_len, S);
        docs = gu_malloc(sizeof(int) * (size_t)(2 * S));
        gu_upload(docs, h, sizeof(int) * (size_t)(2 * S));
        free(h);
        mods[2].doc_start = docs, mods[2].doc_end = docs + S;
    }
    attn_mod *const m = &mods[0];
    const int64_t nq = S * r->qh * D, nkv = S * r->kvh * D, nlse = S * r->qh;
    uint16_t *hq = rand_bf16(nq, 1), *hk = rand_bf16(nkv, 2), *hv = rand_bf16(nkv, 3), *hdo = rand_bf16(nq, 4);
    void *q = gu_malloc(nq * 2), *k = gu_malloc(nkv * 2), *v = gu_malloc(nkv * 2), *dout = gu_malloc(nq * 2),
         *o = gu_malloc(nq * 2), *dq = gu_malloc(nq * 2), *dk = gu_malloc(nkv * 2), *dv = gu_malloc(nkv * 2);
    float *lse = gu_malloc(nlse * 4), *delta = gu_malloc(nlse * 4),
          *ws = gu_malloc((size_t)cp_k_attention_workspace_bytes(&m->spec)); /* the same bytes for both modules */
    gu_upload(q, hq, nq * 2);
    gu_upload(k, hk, nkv * 2);
    gu_upload(v, hv, nkv * 2);
    gu_upload(dout, hdo, nq * 2);
    /* delta = rowsum(dout * o) from the forward's output, computed once on the host (a memory-bound pass of
     * well under a millisecond on the GPU, not part of either kernel); --only fwd needs neither, and leaves this
     * forward out so that the timed ones are the only launches of its kernel */
    uint16_t *ho = malloc(nq * 2);
    float *hdelta = malloc(nlse * 4);
    if (only != ONLY_FWD) {
        attn_fwd(m, q, k, v, o, lse, 0);
        if (cudaDeviceSynchronize() != cudaSuccess) gu_fail("fwd: %s", cudaGetErrorString(cudaGetLastError()));
        gu_download(ho, o, nq * 2);
        for (int64_t row = 0; row < nlse; row++) {
            float s = 0;
            for (int64_t x = 0; x < D; x++) s += bf16_to_f32(hdo[row * D + x]) * bf16_to_f32(ho[row * D + x]);
            hdelta[row] = s;
        }
        gu_upload(delta, hdelta, nlse * 4);
    }

    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    double *t = malloc(sizeof(double) * (size_t)reps);
    /* phases: the forward and backward the runtime uses, and on Hopper the backward with atomic dQ sums and the
     * mma.sync forward and backward too */
    const char *phase_name[9] = {m->hopper ? "fwd (wgmma)" : "fwd", m->hopper ? "bwd (wgmma)" : "bwd",
                                 "bwd (wgmma, atomic dQ)", "fwd (mma.sync)", "bwd (mma.sync)",
                                 m->hopper ? "docs fwd (wgmma)" : "docs fwd", m->hopper ? "docs bwd (wgmma)" : "docs bwd",
                                 "docs fwd (mma.sync)", "docs bwd (mma.sync)"};
    double *phase_ms[9] = {&r->fwd_ms,          &r->bwd_ms,          &r->bwd_atomic_ms,
                           &r->fwd_mma_ms,      &r->bwd_mma_ms,      &r->docs_fwd_ms,
                           &r->docs_bwd_ms,     &r->docs_fwd_mma_ms, &r->docs_bwd_mma_ms};
    r->fwd_ms = r->bwd_ms = r->fwd_mma_ms = r->bwd_mma_ms = r->bwd_atomic_ms = -1;
    r->docs_fwd_ms = r->docs_bwd_ms = r->docs_fwd_mma_ms = r->docs_bwd_mma_ms = -1;
    for (int phase = 0; phase < 9; phase++) {
        /* the phases this machine and these options run: the mma.sync ones and atomic dQ sums only on Hopper (the
         * default path elsewhere), not with --quick; the document ones only with --docs; with --only, its one */
        if (only != ONLY_NONE && phase != (only == ONLY_FWD ? 0 : 1)) continue;
        if ((phase >= 2 && phase <= 4 && !m->hopper) || ((phase == 3 || phase == 4) && quick)) continue;
        if (phase >= 5 && (doc_len <= 0 || (phase >= 7 && (!m->hopper || quick)))) continue;
        attn_mod *pm = phase == 2 ? &mods[1] : phase >= 5 ? &mods[2] : m;
        pm->use_mma = phase == 3 || phase == 4 || phase >= 7;
        const bool fwd = phase == 0 || phase == 3 || phase == 5 || phase == 7;
        for (int i = -2; i < reps; i++) { /* two warm-up runs */
            cudaEventRecord(e0, 0);
            if (fwd) attn_fwd(pm, q, k, v, o, lse, 0);
            else attn_bwd(pm, q, k, v, dout, lse, delta, ws, dq, dk, dv, 0);
            cudaEventRecord(e1, 0);
            if (cudaEventSynchronize(e1) != cudaSuccess)
                gu_fail("%s: %s", phase_name[phase], cudaGetErrorString(cudaGetLastError()));
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            if (i >= 0) t[i] = ms;
        }
        qsort(t, (size_t)reps, sizeof *t, cmp_double);
        double med = reps % 2 ? t[reps / 2] : 0.5 * (t[reps / 2 - 1] + t[reps / 2]);
        *phase_ms[phase] = med;
        printf("  %s %s: median %.3f ms, min %.3f, max %.3f over %d runs\n", r->name, phase_name[phase], med, t[0],
               t[reps - 1], reps);
        pm->use_mma = false;
    }
    /* a sanity look at the outputs: no NaN in o, dq (dq only where a backward ran: --only fwd leaves it unwritten) */
    gu_download(ho, o, nq * 2);
    int64_t nan_o = gu_nan_bf16(ho, nq), nan_dq = 0;
    if (only != ONLY_FWD) {
        gu_download(ho, dq, nq * 2);
        nan_dq = gu_nan_bf16(ho, nq);
    }
    if (nan_o || nan_dq)
        gu_fail("%s: NaN in the outputs (o %lld, dq %lld)", r->name, (long long)nan_o, (long long)nan_dq);
    free(t), free(hq), free(hk), free(hv), free(hdo), free(ho), free(hdelta);
    void *bufs[] = {q, k, v, dout, o, dq, dk, dv, lse, delta, ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gu_free_dev(bufs[i]);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    for (int i = 0; i < nmods; i++) attn_free(&mods[i]);
    if (docs) gu_free_dev(docs);
}

/* The SDPA script beside this source: from the binary's folder build/tests/gpu up to the source tree. */
static void sdpa_script(char *out, size_t n) {
    char exe[PATH_MAX];
    ssize_t l = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[l > 0 ? l : 0] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(out, n, "%s/../../../tests/gpu/bench_attention_sdpa.py", exe);
}

/* Returns 0, or 1 when the peer could not run or failed: the table would then lack what it is for. */
static int run_sdpa(bench_row *rows, int nrows, int64_t S, int64_t D, int reps, bool quick) {
    /* the shapes go to the peer as --shapes 32/32,32/8,...: the list lives in this program only */
    char script[PATH_MAX + 64], shapes[MAX_SHAPES * 24] = "", cmd[sizeof script + sizeof shapes + 256];
    sdpa_script(script, sizeof script);
    if (access(script, R_OK) != 0) {
        printf("FAILED: no %s: no SDPA comparison (--no-sdpa runs without it)\n", script);
        return 1;
    }
    for (int i = 0; i < nrows; i++)
        snprintf(shapes + strlen(shapes), sizeof shapes - strlen(shapes), "%s%d/%d", i ? "," : "", rows[i].qh,
                 rows[i].kvh);
    snprintf(cmd, sizeof cmd, "python3 '%s' --seq %lld --head-dim %lld --reps %d --shapes %s%s 2>&1", script,
             (long long)S, (long long)D, reps, shapes, quick ? " --cudnn-only" : "");
    printf("\n$ %s\n", cmd);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) return 1;
    char line[1024];
    while (fgets(line, sizeof line, p)) {
        fputs(line, stdout);
        /* machine-readable lines: "SDPA <backend> <qh> <kvh> <fwd_ms> <bwd_ms>" */
        char be[32];
        int qh, kvh;
        double f, b;
        if (sscanf(line, "SDPA %31s %d %d %lf %lf", be, &qh, &kvh, &f, &b) == 5)
            for (int i = 0; i < nrows; i++)
                if (rows[i].qh == qh && rows[i].kvh == kvh) {
                    int j = strcmp(be, "FLASH_ATTENTION") == 0 ? 0 : strcmp(be, "CUDNN_ATTENTION") == 0 ? 1 : -1;
                    if (j >= 0) rows[i].sdpa_fwd_ms[j] = f, rows[i].sdpa_bwd_ms[j] = b;
                }
    }
    int st = pclose(p);
    if (st != 0) printf("FAILED: the SDPA peer exited with status %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return st != 0;
}

static void tfs(char *buf, size_t n, double flops, double ms) {
    if (ms > 0) snprintf(buf, n, "%7.1f", flops / (ms * 1e-3) / 1e12);
    else snprintf(buf, n, "%7s", "-");
}

/* A time in the table's column of 9, "-" where it was not measured (< 0). */
static void ms_cell(char *buf, size_t n, double ms) {
    if (ms >= 0) snprintf(buf, n, "%9.3f", ms);
    else snprintf(buf, n, "%9s", "-");
}

/* A row for qh/kvh heads, nothing timed yet. */
static void row_init(bench_row *r, int qh, int kvh) {
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s %d/%d", qh == kvh ? "MHA" : "GQA", qh, kvh);
    r->qh = qh, r->kvh = kvh;
    for (int j = 0; j < 2; j++) r->sdpa_fwd_ms[j] = r->sdpa_bwd_ms[j] = -1;
}

/* Parses "QH/KVH[,QH/KVH...]" into rows; returns how many, or -1 (with why on stderr) when the list is malformed,
 * names more than MAX_SHAPES or a KVH that does not divide its QH. */
static int parse_shapes(const char *list, bench_row *rows) {
    int n = 0;
    for (const char *p = list; *p;) {
        int qh, kvh, used;
        if (n == MAX_SHAPES || sscanf(p, "%d/%d%n", &qh, &kvh, &used) != 2 || qh < 1 || kvh < 1 || qh % kvh ||
            (p[used] && p[used] != ',')) {
            fprintf(stderr, "bench_attention: --shapes takes up to %d of QH/KVH, comma-separated, KVH dividing QH: "
                            "not \"%s\"\n", MAX_SHAPES, list);
            return -1;
        }
        row_init(&rows[n++], qh, kvh);
        p += used + (p[used] == ',');
    }
    if (n == 0) fprintf(stderr, "bench_attention: --shapes names no shape\n");
    return n ? n : -1;
}

int main(int argc, char **argv) {
    int64_t S = 32768, D = 128, doc_len = 0;
    int reps = 10;
    bool sdpa = true, quick = false;
    only_dir only = ONLY_NONE;
    const char *shapes = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seq") && i + 1 < argc) S = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--head-dim") && i + 1 < argc) D = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-sdpa")) sdpa = false;
        else if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--docs") && i + 1 < argc) doc_len = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) shapes = argv[++i];
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "fwd")) only = ONLY_FWD, i++;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc && !strcmp(argv[i + 1], "bwd")) only = ONLY_BWD, i++;
        else {
            fprintf(stderr, "usage: bench_attention [--seq N] [--head-dim 64|128] [--reps N] [--no-sdpa] [--quick] "
                            "[--docs LEN] [--shapes QH/KVH,...] [--only fwd|bwd]\n");
            return 2;
        }
    }
    if (doc_len < 0 || (doc_len > 0 && S > (1LL << 30))) {
        fprintf(stderr, "bench_attention: --docs takes a length of at least 1\n");
        return 2;
    }
    if (only != ONLY_NONE && doc_len > 0) {
        fprintf(stderr, "bench_attention: --only times the causal kernels alone; it does not take --docs\n");
        return 2;
    }
    if (reps < 1) reps = 1;
    bench_row rows[MAX_SHAPES];
    int nrows = 0;
    if (shapes) {
        if ((nrows = parse_shapes(shapes, rows)) < 0) return 2;
    } else {
        for (size_t i = 0; i < sizeof bench_shapes / sizeof bench_shapes[0]; i++)
            row_init(&rows[nrows++], bench_shapes[i].qh, bench_shapes[i].kvh);
    }
    /* --only leaves everything but its kernel out: no peer, no mma.sync kernels */
    if (only != ONLY_NONE) sdpa = false, quick = true;
    gu_init_or_skip("bench_attention");
    for (int i = 0; i < nrows; i++) bench(&rows[i], S, D, reps, quick, doc_len, only);
    int rc = sdpa ? run_sdpa(rows, nrows, S, D, reps, quick) : 0;

    printf("\ncausal attention, S=%lld, D=%lld, query/KV heads by shape; TF/s = fwd 4*S^2*H*D/2 (H query heads), "
           "bwd 2.5x fwd\n", (long long)S, (long long)D);
    printf("%-10s %-18s %9s %9s %9s %8s %8s %8s\n", "shape", "kernel", "fwd ms", "bwd ms", "total ms", "fwd TF/s",
           "bwd TF/s", "f+b TF/s");
    for (int i = 0; i < nrows; i++) {
        const double F = flops_fwd(S, rows[i].qh, D);
        /* cpgen as the runtime runs it, with atomic dQ sums and with the mma.sync kernels (on Hopper), then the
         * peers */
        const bench_row *w = &rows[i];
        const char *names[5] = {"cpgen", "cpgen atomic dQ", "cpgen mma.sync", "sdpa FLASH", "sdpa CUDNN"};
        for (int j = 0; j < 5; j++) {
            /* the atomic row shares the forward */
            double f = j == 0 ? w->fwd_ms : j == 1 ? w->fwd_ms : j == 2 ? w->fwd_mma_ms : w->sdpa_fwd_ms[j - 3],
                   b = j == 0 ? w->bwd_ms : j == 1 ? w->bwd_atomic_ms : j == 2 ? w->bwd_mma_ms : w->sdpa_bwd_ms[j - 3];
            /* a row needs both directions, but for cpgen's own under --only, which times one */
            if (j == 0 ? f < 0 && b < 0 : f < 0 || b < 0) continue;
            const double fb = f >= 0 && b >= 0 ? f + b : -1;
            char a[16], c[16], d[16], fc[16], bc[16], tc[16];
            tfs(a, sizeof a, F, f);
            tfs(c, sizeof c, 2.5 * F, b);
            tfs(d, sizeof d, 3.5 * F, fb);
            ms_cell(fc, sizeof fc, f);
            ms_cell(bc, sizeof bc, b);
            ms_cell(tc, sizeof tc, fb);
            printf("%-10s %-18s %9s %9s %9s %8s %8s %8s\n", j ? "" : rows[i].name, names[j], fc, bc, tc, a, c, d);
        }
    }
    if (doc_len > 0) {
        const double kept = kept_scores(S, doc_len);
        printf("\ncausal attention over documents of %lld tokens, S=%lld, D=%lld, heads by shape: %.2f%% of the causal "
               "scores kept;\nTF/s = fwd 4*kept*H*D, bwd 2.5x fwd; 'x causal': the causal kernel's time over this one's\n",
               (long long)doc_len, (long long)S, (long long)D, 100 * kept / ((double)S * (double)(S + 1) / 2));
        printf("%-10s %-18s %9s %9s %8s %8s %9s %9s\n", "shape", "kernel", "fwd ms", "bwd ms", "fwd TF/s", "bwd TF/s",
               "fwd x causal", "bwd x causal");
        for (int i = 0; i < nrows; i++) {
            const bench_row *w = &rows[i];
            const double F = 4.0 * kept * w->qh * (double)D;
            for (int j = 0; j < 2; j++) {
                const double f = j ? w->docs_fwd_mma_ms : w->docs_fwd_ms, b = j ? w->docs_bwd_mma_ms : w->docs_bwd_ms,
                             cf = j ? w->fwd_mma_ms : w->fwd_ms, cb = j ? w->bwd_mma_ms : w->bwd_ms;
                if (f < 0 || b < 0) continue;
                char a[16], c[16];
                tfs(a, sizeof a, F, f);
                tfs(c, sizeof c, 2.5 * F, b);
                printf("%-10s %-18s %9.3f %9.3f %8s %8s %11.1fx %11.1fx\n", j ? "" : w->name,
                       j ? "cpgen docs mma.sync" : "cpgen docs", f, b, a, c, cf / f, cb / b);
            }
        }
        for (int i = 0; i < nrows; i++)
            if (rows[i].docs_fwd_ms > 0 && rows[i].docs_bwd_ms > 0)
                printf("DOCS %d %d %lld %.4f %.4f\n", rows[i].qh, rows[i].kvh, (long long)doc_len, rows[i].docs_fwd_ms,
                       rows[i].docs_bwd_ms);
    }
    return rc;
}
