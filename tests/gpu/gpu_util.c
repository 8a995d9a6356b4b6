/* gpu_util.c: see gpu_util.h. */
#include "gpu_util.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../ref/bf16.h"
#include "data.h"
#include "spec.h"
#include "util.h"

gu_device gu_dev;
bool gu_cmocka;

void gu_fail(const char *fmt, ...) {
    char msg[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (gu_cmocka) fail_msg("%s", msg);
    fprintf(stderr, "FAIL: %s\n", msg);
    exit(1);
}

void gu_plan(const char *spec, const char **sets, int nsets, cp_plan *p) {
    cp_spec s;
    char err[CP_ERR_MAX];
    if (cp_spec_load(spec, sets, nsets, &s, err, sizeof err) || cp_data_resolve_documents(&s, err, sizeof err))
        gu_fail("spec: %s", err);
    if (cp_plan_build(&s, p, err, sizeof err)) gu_fail("plan: %s", err);
    if (!p->fits) gu_fail("plan: %s does not fit", spec);
}

#define GU_CUDA(call)                                                            \
    do {                                                                         \
        cudaError_t e_ = (call);                                                 \
        if (e_ != cudaSuccess) {                                                 \
            char m_[1024];                                                       \
            cp_cuda_errmsg(e_, #call, m_, sizeof m_);                            \
            gu_fail("%s:%d: %s", __FILE__, __LINE__, m_);                        \
        }                                                                        \
    } while (0)

int gu_init(void) {
    char why[1024];
    if (cp_gpu_count(why, sizeof why) < 1) {
        fprintf(stderr, "%s\n", why);
        return -1;
    }
    memset(&gu_dev, 0, sizeof gu_dev);
    if (cudaSetDevice(0) != cudaSuccess || cp_device_arch(0, gu_dev.arch, sizeof gu_dev.arch) != 0) {
        fprintf(stderr, "cannot use GPU 0: %s\n", gu_dev.arch);
        return -1;
    }
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return -1;
    snprintf(gu_dev.name, sizeof gu_dev.name, "%s", p.name);
    gu_dev.sms = p.multiProcessorCount;
    gu_dev.mem = p.totalGlobalMem;
    printf("GPU 0: %s, %d SMs, %.1f GiB, compiling for %s\n", gu_dev.name, gu_dev.sms,
           (double)gu_dev.mem / (1 << 30), gu_dev.arch);
    return 0;
}

void gu_skip(const char *test, const char *fmt, ...) {
    char why[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    printf("%s: skipped: %s\n", test, why);
    fflush(stdout);
    exit(GU_SKIPPED);
}

void gu_need_gpus(const char *test, int n) {
    char why[1024];
    int have = cp_gpu_count(why, sizeof why);
    if (have < 1) gu_skip(test, "no GPU (%s)", why);
    if (have < n) gu_skip(test, "needs %d GPUs, this machine has %d", n, have);
}

void gu_init_or_skip(const char *test) {
    gu_need_gpus(test, 1);
    if (gu_init() != 0) {
        fprintf(stderr, "%s: FAILED: a GPU is present but cannot be used\n", test);
        exit(1);
    }
}

static int compared(void);

int gu_status(int failed) {
    if (failed) return 1;
    if (compared() == 0) {
        printf("FAILED: no comparison ran: nothing was checked\n");
        return 1;
    }
    return 0;
}

gu_module *gu_build(const cp_kernel_spec *k) {
    gu_module *m = calloc(1, sizeof *m);
    char err[8192];
    cp_kspec_copy(&m->spec, k);
    if (cp_emit(k, &m->src, err, sizeof err) != 0) gu_fail("emit %s: %s", k->family, err);
    cp_jit_opts o;
    memset(&o, 0, sizeof o);
    snprintf(o.arch, sizeof o.arch, "%s", gu_dev.arch);
    if (cp_jit_compile(&m->src, 1, &o, &m->jit, err, sizeof err) != 0) gu_fail("compile %s: %s", m->src.name, err);
    if (cp_module_load(&m->mod, m->src.name, m->jit.cubin, m->jit.cubin_len, err, sizeof err) != 0)
        gu_fail("%s", err);
    for (int i = 0; i < m->jit.nentries; i++) {
        const cp_entry_info *e = &m->jit.entries[i];
        printf("  built %-48s %3d registers, %d bytes stack, spills %d/%d%s\n", e->name, e->registers, e->stack_bytes,
               e->spill_stores, e->spill_loads, m->jit.from_cache ? " (cached)" : "");
        if (e->spill_stores || e->spill_loads) gu_fail("%s spills registers (%d/%d bytes)", e->name, e->spill_stores,
                                                      e->spill_loads);
    }
    return m;
}

void gu_free(gu_module *m) {
    if (!m) return;
    cp_module_unload(&m->mod);
    cp_jit_module_free(&m->jit);
    cp_module_src_free(&m->src);
    cp_kspec_free(&m->spec);
    free(m);
}

cudaKernel_t gu_kernel(gu_module *m, const char *role) {
    cudaKernel_t k;
    char err[1024];
    if (cp_module_role(&m->mod, m->spec.family, role, &k, err, sizeof err) != 0) gu_fail("%s", err);
    return k;
}

cp_kdims gu_dims(gu_module *m, const char *role, int64_t n, int64_t heads) {
    cp_kdims d;
    if (cp_k_dims(&m->spec, role, n, heads, gu_dev.sms, &d) != 0) gu_fail("cp_k_dims: no geometry for %s %s", m->src.name, role);
    return d;
}

void gu_run(gu_module *m, const char *role, int64_t n, int64_t heads, void **args) {
    gu_run_z(m, role, n, heads, 1, args);
}

void gu_run_z(gu_module *m, const char *role, int64_t n, int64_t heads, unsigned z, void **args) {
    cp_kdims d = gu_dims(m, role, n, heads);
    d.grid[2] = z;
    cudaKernel_t k = gu_kernel(m, role);
    char err[1024];
    if (d.smem && cp_kernel_set_max_smem(k, d.smem, err, sizeof err)) gu_fail("%s %s: %s", m->src.name, role, err);
    GU_CUDA(cp_launch(k, &d, args, 0));
    GU_CUDA(cudaDeviceSynchronize());
}

void gu_run_fp8_cast(gu_module *m, const char *role, int64_t rows, int64_t cols, void **args) {
    if (strncmp(role, "cast_t_row_", 11) == 0) gu_run(m, "cast_t_row_max", rows, cols, args);
    if (strncmp(role, "cast_rt_row_", 12) == 0) { /* the transposed copy's parts zeroed (the plan's memset step) */
        float *scales_t = *(float **)args[7];
        GU_CUDA(cudaMemset(scales_t + cols, 0, 4 * (size_t)cp_fp8_row_parts(rows, cols)));
    }
    gu_run(m, role, rows, cols, args);
    if (strncmp(role, "cast_rt_row_", 12) == 0) { /* then the transposed copy from the columns' maxima */
        char cast_t[32];
        snprintf(cast_t, sizeof cast_t, "cast_t_row_%s", role + 12);
        void *t[] = {args[0], args[1], args[2], args[3], args[6], args[7]};
        gu_run(m, cast_t, rows, cols, t);
    }
}

void *gu_malloc(size_t bytes) {
    void *p = NULL;
    GU_CUDA(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}
void gu_free_dev(void *p) { GU_CUDA(cudaFree(p)); }
void gu_upload(void *dst, const void *src, size_t bytes) { GU_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice)); }
void gu_download(void *dst, const void *src, size_t bytes) {
    GU_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void gu_poison(void *dev, size_t bytes) { GU_CUDA(cudaMemset(dev, 0xFF, bytes)); }

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

double gu_median_ms(int reps, int warm, void (*launch)(void *ctx), void *ctx) {
    enum { MOST = 256 };
    if (reps < 1 || reps > MOST) gu_fail("gu_median_ms: %d repetitions, not 1 to %d", reps, MOST);
    cudaEvent_t e0[MOST], e1[MOST];
    for (int i = 0; i < reps; i++) {
        GU_CUDA(cudaEventCreate(&e0[i]));
        GU_CUDA(cudaEventCreate(&e1[i]));
    }
    for (int i = 0; i < warm; i++) launch(ctx);
    GU_CUDA(cudaDeviceSynchronize());
    for (int i = 0; i < reps; i++) {
        GU_CUDA(cudaEventRecord(e0[i], 0));
        launch(ctx);
        GU_CUDA(cudaEventRecord(e1[i], 0));
    }
    GU_CUDA(cudaDeviceSynchronize());
    float ms[MOST];
    for (int i = 0; i < reps; i++) {
        GU_CUDA(cudaEventElapsedTime(&ms[i], e0[i], e1[i]));
        cudaEventDestroy(e0[i]);
        cudaEventDestroy(e1[i]);
    }
    qsort(ms, (size_t)reps, sizeof ms[0], cmp_float);
    return reps % 2 ? ms[reps / 2] : (ms[reps / 2 - 1] + ms[reps / 2]) / 2;
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
void gu_seed(gu_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix(&seed);
}
static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
uint64_t gu_next(gu_rng *r) {
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}
double gu_uniform(gu_rng *r) { return (double)(gu_next(r) >> 11) / (double)(1ULL << 53) * 2.0 - 1.0; }
double gu_normal(gu_rng *r) {
    double u = (double)((gu_next(r) >> 11) + 1) / (double)(1ULL << 53), v = gu_uniform(r);
    return sqrt(-2.0 * log(u)) * cos(M_PI * v);
}
uint16_t *gu_rand_bf16(gu_rng *r, int64_t n, double scale) {
    uint16_t *p = malloc(sizeof(uint16_t) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        double v = gu_normal(r) * scale;
        p[i] = f64_to_bf16(v);
        if ((p[i] & 0x7fff) == 0) p[i] = f64_to_bf16(v < 0 ? -scale * 1e-3 : scale * 1e-3);
    }
    return p;
}
float *gu_rand_f32(gu_rng *r, int64_t n, double scale) {
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        double v = gu_normal(r) * scale;
        p[i] = (float)v;
        if (p[i] == 0.0f) p[i] = (float)(scale * 1e-3);
    }
    return p;
}

double gu_rel_err_bf16(const uint16_t *out, const uint16_t *ref, int64_t n) {
    double num = 0, den = 0, on = 0;
    for (int64_t i = 0; i < n; i++) {
        double o = bf16_to_f32(out[i]), r = bf16_to_f32(ref[i]);
        if (isnan(o) || isnan(r)) return NAN;
        num += (o - r) * (o - r);
        den += r * r;
        on += o * o;
    }
    return den > 0 ? sqrt(num / den) : sqrt(on);
}
double gu_rel_err_f32(const float *out, const float *ref, int64_t n) {
    double num = 0, den = 0, on = 0;
    for (int64_t i = 0; i < n; i++) {
        double o = out[i], r = ref[i];
        if (isnan(o) || isnan(r)) return NAN;
        num += (o - r) * (o - r);
        den += r * r;
        on += o * o;
    }
    return den > 0 ? sqrt(num / den) : sqrt(on);
}
int64_t gu_nan_bf16(const uint16_t *p, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += isnan(bf16_to_f32(p[i])) != 0;
    return c;
}
int64_t gu_nan_f32(const float *p, int64_t n) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += isnan(p[i]) != 0;
    return c;
}

typedef struct {
    char what[64], shape[96];
    double err, bound;
    int count;
} gu_row;
static gu_row *rows;
static int nrows, caprows;

void gu_check(const char *what, const char *shape, double err, double bound) {
    bool ok = !isnan(err) && err <= bound;
    printf("  compare %-22s %-40s rel err %.3e (bound %.0e)%s\n", what, shape, err, bound, ok ? "" : "  FAIL");
    fflush(stdout);
    gu_row *r = NULL;
    for (int i = 0; i < nrows; i++)
        if (!strcmp(rows[i].what, what) && !strcmp(rows[i].shape, shape)) r = &rows[i];
    if (!r) {
        if (nrows == caprows) rows = realloc(rows, sizeof *rows * (size_t)(caprows = caprows ? 2 * caprows : 64));
        r = &rows[nrows++];
        memset(r, 0, sizeof *r);
        snprintf(r->what, sizeof r->what, "%s", what);
        snprintf(r->shape, sizeof r->shape, "%s", shape);
        r->err = err;
    }
    if (isnan(err) || err > r->err) r->err = err;
    r->bound = bound;
    r->count++;
    if (!ok) gu_fail("%s %s: relative error %.3e above the bound %.0e (NaN: an output not written or a NaN computed)",
                     what, shape, err, bound);
}

static int compared(void) {
    int n = 0;
    for (int i = 0; i < nrows; i++) n += rows[i].count;
    return n;
}

void gu_print_table(void) {
    printf("\n%-22s %-40s %12s %8s  %s\n", "kernel", "shape", "worst rel", "bound", "");
    int bad = 0;
    for (int i = 0; i < nrows; i++) {
        bool ok = !isnan(rows[i].err) && rows[i].err <= rows[i].bound;
        bad += !ok;
        printf("%-22s %-40s %12.3e %8.0e  %s\n", rows[i].what, rows[i].shape, rows[i].err, rows[i].bound,
               ok ? "ok" : "FAIL");
    }
    printf("%d comparisons, %d above their bound\n", nrows, bad);
}
