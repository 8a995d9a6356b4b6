/* cmd_tune_kernels.c: `cpgen tune-kernels SPEC`: every kernel of the spec's plan that has variants (kernels.h
 * cp_kvariants) is compiled in each variant, timed on this GPU on random bf16 inputs, and the fastest whose output is
 * bit for bit the default's goes into the kernel tuning cache (gen/ktune.h). `cpgen tune` runs it as a child process,
 * as it runs its candidates: a kernel that faults takes only the child down, and the child's GPU memory is given back
 * before the candidates are measured. */
#include "commands.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cuda_check.h"
#include "kernels_attn.h"
#include "ktune.h"
#include "module.h"
#include "tma.h"
#include "util.h"

#define WARMUPS 2 /* launches of each variant before timing: module load, caches, clocks */
#define REPS 7    /* timed launches of each variant, the variants taking turns so drift hits all alike */
#define PATTERN_ELEMS (8 << 20) /* random bf16 values tiled over each input */

/* A kernel of the plan to time: its variants and the plan's module (with the default). */
typedef struct {
    cp_kvariants v;
    const cp_kernel_spec *k;
    int first; /* its first variant among the compiled modules; then v.n of them in v.values order */
} job;

/* The CUDA call `call` of a timing: on failure, a message naming it and the kernel timed, then `goto done`. */
#define TK_CUDA(call)                                                                                               \
    do {                                                                                                            \
        cudaError_t e_ = (call);                                                                                    \
        if (e_ != cudaSuccess) {                                                                                    \
            char what_[512];                                                                                        \
            snprintf(what_, sizeof what_, "cpgen tune-kernels, timing %s %s: %s", j->v.kernel, j->v.shape, #call); \
            rc = cp_cuda_errmsg(e_, what_, err, errlen);                                                            \
            goto done;                                                                                              \
        }                                                                                                           \
    } while (0)

/* bf16 of a uniform value in [-1, 1) from a xorshift state (the top half of the float: inputs need no rounding). */
static uint16_t rand_bf16(uint64_t *x) {
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    float f = (float)((double)(*x >> 11) / (double)(1ULL << 53) * 2.0 - 1.0);
    uint32_t bits;
    memcpy(&bits, &f, 4);
    return (uint16_t)(bits >> 16);
}

/* Fill bytes of dev with random bf16 values: a pattern drawn on the host, uploaded and copied over the buffer (the
 * kernels' speed does not depend on the values, and drawing gigabytes on the host would take longer than timing). */
static cudaError_t fill_random(void *dev, int64_t bytes, uint64_t seed, uint16_t *host) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
    int64_t chunk = CP_MIN(bytes, (int64_t)PATTERN_ELEMS * 2);
    for (int64_t i = 0; i < chunk / 2; i++) host[i] = rand_bf16(&x);
    cudaError_t e = cudaMemcpy(dev, host, (size_t)chunk, cudaMemcpyHostToDevice);
    for (int64_t off = chunk; e == cudaSuccess && off < bytes; off += chunk)
        e = cudaMemcpy((char *)dev + off, dev, (size_t)CP_MIN(chunk, bytes - off), cudaMemcpyDeviceToDevice);
    return e;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int64_t kparam(const cp_kernel_spec *k, const char *key) {
    const char *v = cp_kspec_get(k, key);
    return v ? strtoll(v, NULL, 10) : -1;
}

/* Time the variants of the attention forward fwd_sm90 (jit[0 .. v.n), in v.values order) on one shape: the median
 * of REPS launches each into e->ms, the variants whose output (o and lse) differs from the default's left out with a
 * line on out. e gets the kernel's key and the variants kept. 0, or -1 with a message. */
static int time_attn_fwd(const job *j, const cp_module_src *src, const cp_jit_module *jit, cp_ktune_entry *e, FILE *out,
                         char *err, int errlen) {
    const cp_kernel_spec *k = j->k;
    const int64_t D = kparam(k, "HEAD_DIM"), QH = kparam(k, "Q_HEADS"), KVH = kparam(k, "KV_HEADS"),
                  S = kparam(k, "SEQ");
    const int64_t qb = S * QH * D * 2, kvb = S * KVH * D * 2, lseb = QH * S * 4;
    const int nv = j->v.n;
    int rc = 0, ndef = -1;
    void *q = NULL, *kk = NULL, *vv = NULL, *o = NULL;
    float *lse = NULL;
    char *ref = NULL, *got = NULL;
    uint16_t *pattern = NULL;
    cudaEvent_t ev[2 * REPS * CP_KVAR_MAX] = {0};
    cp_module mods[CP_KVAR_MAX];
    memset(mods, 0, sizeof mods);
    cudaKernel_t kern[CP_KVAR_MAX];
    cp_kdims dims[CP_KVAR_MAX];
    cp_tmap tm[3];
    void *args[] = {&tm[0], &tm[1], &tm[2], &o, &lse};
    const int64_t heads[3] = {QH, KVH, KVH};
    bool same[CP_KVAR_MAX];
    double t[CP_KVAR_MAX][REPS];

    for (int i = 0; i < nv; i++) {
        cp_kernel_spec kv;
        cp_kspec_copy(&kv, k);
        cp_k_set_variant(&kv, &j->v, j->v.values[i]);
        int bad = cp_k_attention_dims(&kv, "fwd_sm90", &dims[i]);
        cp_kspec_free(&kv);
        if (bad) {
            rc = cp_errf(err, errlen, "internal: no fwd_sm90 geometry for %s", src[i].name);
            goto done;
        }
        if (cp_module_load(&mods[i], src[i].name, jit[i].cubin, jit[i].cubin_len, err, errlen) ||
            cp_module_role(&mods[i], "attention", "fwd_sm90", &kern[i], err, errlen) ||
            cp_kernel_set_max_smem(kern[i], dims[i].smem, err, errlen)) {
            rc = -1;
            goto done;
        }
        if (j->v.values[i] == j->v.def) ndef = i;
    }
    if (ndef < 0) {
        rc = cp_errf(err, errlen, "internal: the default %d is not among the variants of %s", j->v.def, j->v.kernel);
        goto done;
    }
    pattern = cp_xmalloc((size_t)PATTERN_ELEMS * 2);
    TK_CUDA(cudaMalloc(&q, (size_t)qb));
    TK_CUDA(cudaMalloc(&kk, (size_t)kvb));
    TK_CUDA(cudaMalloc(&vv, (size_t)kvb));
    TK_CUDA(cudaMalloc(&o, (size_t)qb));
    TK_CUDA(cudaMalloc((void **)&lse, (size_t)lseb));
    TK_CUDA(fill_random(q, qb, 1, pattern));
    TK_CUDA(fill_random(kk, kvb, 2, pattern));
    TK_CUDA(fill_random(vv, kvb, 3, pattern));
    void *const in[3] = {q, kk, vv};
    for (int x = 0; x < 3; x++)
        if (cp_tmap_heads(&tm[x], in[x], 2, S, heads[x], D, CP_ATTN_SM90_BOX_ROWS, err, errlen)) {
            rc = -1;
            goto done;
        }
    for (int i = 0; i < nv; i++)
        for (int w = 0; w < WARMUPS; w++) TK_CUDA(cp_launch(kern[i], &dims[i], args, 0));
    for (int x = 0; x < 2 * REPS * nv; x++) TK_CUDA(cudaEventCreate(&ev[x]));
    for (int r = 0; r < REPS; r++)
        for (int i = 0; i < nv; i++) {
            cudaEvent_t *p = &ev[2 * (r * nv + i)];
            TK_CUDA(cudaEventRecord(p[0], 0));
            TK_CUDA(cp_launch(kern[i], &dims[i], args, 0));
            TK_CUDA(cudaEventRecord(p[1], 0));
        }
    TK_CUDA(cudaDeviceSynchronize());
    for (int r = 0; r < REPS; r++)
        for (int i = 0; i < nv; i++) {
            float ms;
            TK_CUDA(cudaEventElapsedTime(&ms, ev[2 * (r * nv + i)], ev[2 * (r * nv + i) + 1]));
            t[i][r] = ms;
        }
    /* every variant's output against the default's, bit for bit: a ring depth changes when tiles arrive, never what
     * is computed, so any difference is a broken variant, never recorded */
    ref = cp_xmalloc((size_t)(qb + lseb));
    got = cp_xmalloc((size_t)(qb + lseb));
    for (int pass = 0; pass <= nv; pass++) {
        int i = pass == 0 ? ndef : pass - 1;
        if (pass && i == ndef) continue;
        char *dst = pass ? got : ref;
        TK_CUDA(cp_launch(kern[i], &dims[i], args, 0));
        TK_CUDA(cudaMemcpy(dst, o, (size_t)qb, cudaMemcpyDeviceToHost));
        TK_CUDA(cudaMemcpy(dst + qb, lse, (size_t)lseb, cudaMemcpyDeviceToHost));
        same[i] = !pass || memcmp(ref, got, (size_t)(qb + lseb)) == 0;
    }
    same[ndef] = true;

    memset(e, 0, sizeof *e);
    snprintf(e->kernel, sizeof e->kernel, "%s", j->v.kernel);
    snprintf(e->shape, sizeof e->shape, "%s", j->v.shape);
    snprintf(e->param, sizeof e->param, "%s", j->v.param);
    e->def = j->v.def;
    e->flops = 4.0 * (double)S * (double)S * (double)QH * (double)D / (kparam(k, "CAUSAL") == 1 ? 2 : 1);
    for (int i = 0; i < nv; i++) {
        qsort(t[i], REPS, sizeof t[i][0], cmp_double);
        if (!same[i]) {
            fprintf(out, "  %s %s: %s %d gives other bits than the default: left out (a bug in that variant)\n",
                    j->v.kernel, j->v.shape, j->v.param, j->v.values[i]);
            continue;
        }
        e->values[e->n] = j->v.values[i];
        e->ms[e->n++] = t[i][REPS / 2];
    }
    int best = 0;
    for (int i = 1; i < e->n; i++)
        if (e->ms[i] < e->ms[best]) best = i;
    e->winner = e->values[best];
done:
    for (int x = 0; x < 2 * REPS * CP_KVAR_MAX; x++)
        if (ev[x]) (void)cudaEventDestroy(ev[x]);
    void *bufs[] = {q, kk, vv, o, lse};
    for (size_t x = 0; x < CP_ARRAY_LEN(bufs); x++)
        if (bufs[x]) (void)cudaFree(bufs[x]);
    for (int i = 0; i < nv; i++) cp_module_unload(&mods[i]);
    free(pattern);
    free(ref);
    free(got);
    return rc;
}

/* A kernels.jsonl that cpgen tune-kernels wrote: lines of cp_ktune_entry_json. */
static bool jsonl_ours(const char *head, size_t n, const void *ctx) {
    (void)ctx;
    return n >= 9 && !memcmp(head, "{\"arch\": ", 9);
}

/* Whether outdir/kernels.jsonl may be written: checked before the timing, not after. */
static int check_jsonl(const char *outdir, char *err, int errlen) {
    char path[CP_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/kernels.jsonl", outdir);
    struct stat st;
    if (stat(outdir, &st) == 0 && !S_ISDIR(st.st_mode))
        return cp_errf(err, errlen, "-o %s: not a folder; give -o a folder for kernels.jsonl", outdir);
    return cp_may_replace(path, jsonl_ours, NULL, "a kernels.jsonl of cpgen tune-kernels",
                          "give another -o, or move it away", err, errlen);
}

/* outdir/kernels.jsonl: the n entries, one per line (none: an empty file, so that the caller knows none ran). */
static int write_jsonl(const char *outdir, const cp_ktune_entry *got, int n, FILE *out, char *err, int errlen) {
    cp_str s = {0};
    for (int x = 0; x < n; x++) {
        cp_ktune_entry_json(&s, &got[x]);
        cp_str_printf(&s, "\n");
    }
    char path[CP_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/kernels.jsonl", outdir);
    int rc = check_jsonl(outdir, err, errlen);
    if (rc) {
    } else if (cp_mkdir_p(outdir)) {
        rc = cp_errf(err, errlen, "cannot create %s (%s); give -o a folder you can write", outdir, strerror(errno));
    } else if (cp_write_file_atomic(path, s.data ? s.data : "", s.len)) {
        rc = cp_errf(err, errlen, "cannot write %s (%s); give -o a folder you can write", path, strerror(errno));
    } else {
        fprintf(out, "wrote %s (%d kernel shape%s)\n", path, n, n == 1 ? "" : "s");
    }
    cp_str_free(&s);
    return rc;
}

int cp_cmd_tune_kernels(const cp_plan *P, const char *outdir, FILE *out, char *err, int errlen) {
    char why[256], arch[256], driver[32]; /* arch: room for cp_device_arch's message */
    if (outdir && check_jsonl(outdir, err, errlen)) return -1;
    if (cp_gpu_count(why, sizeof why) <= 0) {
        fprintf(out, "no GPU (%s): kernel timing skipped; the kernel tuning cache is unchanged\n", why);
        return outdir ? write_jsonl(outdir, NULL, 0, out, err, errlen) : 0; /* -o is not ignored: nothing timed */
    }
    if (cp_device_arch(0, arch, sizeof arch)) return cp_errf(err, errlen, "cpgen tune-kernels: %s", arch);
    if (cp_driver_version(driver, sizeof driver))
        return cp_errf(err, errlen, "cpgen tune-kernels: the NVIDIA driver's version cannot be read (NVML and the CUDA "
                       "runtime both failed), so the tuning cache has no key: check the driver with nvidia-smi");
    /* the kernels to time: each kernel and shape once, where this GPU runs it */
    job jobs[CP_MAX_ENTRIES * 8];
    int njobs = 0, nmods = 0;
    for (int m = 0; m < P->nmodules && njobs < (int)CP_ARRAY_LEN(jobs); m++) {
        job *j = &jobs[njobs];
        if (!cp_k_variants(&P->modules[m], &j->v) || strcmp(j->v.arch, arch)) continue;
        bool seen = false;
        for (int i = 0; i < njobs; i++)
            seen |= !strcmp(jobs[i].v.kernel, j->v.kernel) && !strcmp(jobs[i].v.shape, j->v.shape);
        if (seen) continue;
        j->k = &P->modules[m];
        j->first = nmods;
        nmods += j->v.n;
        njobs++;
    }
    if (!njobs) {
        fprintf(out, "no kernel of this plan has variants on %s: nothing to time\n", arch);
        return outdir ? write_jsonl(outdir, NULL, 0, out, err, errlen) : 0;
    }
    cp_module_src *src = cp_xcalloc((size_t)nmods, sizeof *src);
    cp_jit_module *jit = cp_xcalloc((size_t)nmods, sizeof *jit);
    int rc = 0, emitted = 0;
    for (int x = 0; x < njobs && !rc; x++)
        for (int i = 0; i < jobs[x].v.n && !rc; i++, emitted++) {
            cp_kernel_spec k;
            cp_kspec_copy(&k, jobs[x].k);
            cp_k_set_variant(&k, &jobs[x].v, jobs[x].v.values[i]);
            rc = cp_emit(&k, &src[emitted], err, errlen);
            cp_kspec_free(&k);
        }
    cp_jit_opts jo;
    memset(&jo, 0, sizeof jo);
    snprintf(jo.arch, sizeof jo.arch, "%.15s", arch);
    double t0 = cp_now();
    if (!rc) rc = cp_jit_compile(src, nmods, &jo, jit, err, errlen);
    if (!rc) {
        int cached = 0;
        for (int i = 0; i < nmods; i++) cached += jit[i].from_cache;
        fprintf(out, "compiled %d variants of %d kernel shape%s for %s in %.1f s (%d from the cache)\n", nmods, njobs,
                njobs > 1 ? "s" : "", arch, cp_now() - t0, cached);
    }
    cp_ktune_entry *got = cp_xcalloc((size_t)njobs, sizeof *got);
    if (!rc) fprintf(out, "kernel timing on %s, driver %s: median of %d launches after %d warm-ups, variants taking "
                     "turns\n", arch, driver, REPS, WARMUPS);
    for (int x = 0; x < njobs && !rc; x++) {
        const job *j = &jobs[x];
        if (strcmp(j->v.kernel, "attention.fwd_sm90"))
            rc = cp_errf(err, errlen, "internal: cpgen tune-kernels cannot time %s", j->v.kernel);
        else rc = time_attn_fwd(j, src + j->first, jit + j->first, &got[x], out, err, errlen);
        if (rc) break;
        snprintf(got[x].arch, sizeof got[x].arch, "%.15s", arch);
        snprintf(got[x].driver, sizeof got[x].driver, "%s", driver);
        snprintf(got[x].cpgen, sizeof got[x].cpgen, "%s", CP_VERSION);
        cp_ktune_entry_print(out, &got[x]);
        fflush(out);
    }
    /* the winners into the cache, and every time into outdir/kernels.jsonl */
    char path[CP_PATH_MAX + 32];
    if (!rc) {
        cp_ktune_path(NULL, path, sizeof path);
        cp_ktune_cache kc;
        cp_ktune_load(path, &kc, out);
        for (int x = 0; x < njobs; x++) cp_ktune_put(&kc, &got[x]);
        rc = cp_ktune_save(&kc, path, err, errlen);
        cp_ktune_free(&kc);
        if (!rc) fprintf(out, "wrote %d winner%s to the kernel tuning cache %s\n", njobs, njobs > 1 ? "s" : "", path);
    }
    if (!rc && outdir) rc = write_jsonl(outdir, got, njobs, out, err, errlen);
    free(got);
    for (int i = 0; i < nmods; i++) {
        cp_jit_module_free(&jit[i]);
        cp_module_src_free(&src[i]);
    }
    free(jit);
    free(src);
    return rc;
}
