/* test_attention.c: the attention kernels (templates/attention.cu) against the float64 reference
 * (tests/ref/ref_attention.c) on fresh random inputs, over sequence lengths that are and are not multiples of the
 * tiles, GQA ratios 1, 3 and 4, head_dim 64 and 128, causal and full, dK/dV written and accumulated. Outputs are
 * poisoned with NaN first; relative error in norm must be at most 1e-2 for the bf16 outputs.
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
    {1, 64, 1, 1, true, false},       {1, 128, 4, 1, false, false},     {100, 128, 3, 1, true, false},
    {100, 64, 2, 2, false, true},     {1000, 64, 4, 1, true, false},    {1000, 128, 3, 1, false, false},
    {1000, 128, 4, 4, true, true},    {256, 128, 8, 2, true, false},    {4097, 128, 4, 1, true, false},
    {4097, 64, 3, 1, false, false},   {4097, 128, 2, 2, true, true},    {2048, 64, 4, 4, true, false},
};
#define NSHAPES ((int)(sizeof SHAPES / sizeof SHAPES[0]))
#define BOUND 1e-2

static attn_mod mods[NSHAPES];
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
} host_io;

/* Run fwd then bwd of module m on fresh random inputs; results in io (host). */
static void run_shape(attn_mod *m, host_io *io) {
    const attn_shape *s = &m->sh;
    gu_rng rng;
    gu_seed(&rng, seed++);
    io->nq = s->seq * s->q_heads * s->head_dim;
    io->nkv = s->seq * s->kv_heads * s->head_dim;
    io->nlse = s->seq * s->q_heads;
    io->q = gu_rand_bf16(&rng, io->nq, 1.0);
    io->k = gu_rand_bf16(&rng, io->nkv, 1.0);
    io->v = gu_rand_bf16(&rng, io->nkv, 1.0);
    io->dout = gu_rand_bf16(&rng, io->nq, 1.0);
    size_t bq = (size_t)io->nq * 2, bkv = (size_t)io->nkv * 2, blse = (size_t)io->nlse * 4;
    size_t bdkv = s->dkv_accum ? (size_t)io->nkv * 4 : bkv;
    void *q = gu_malloc(bq), *k = gu_malloc(bkv), *v = gu_malloc(bkv), *dout = gu_malloc(bq), *o = gu_malloc(bq),
         *dq = gu_malloc(bq), *dk = gu_malloc(bdkv), *dv = gu_malloc(bdkv);
    float *lse = gu_malloc(blse), *delta = gu_malloc(blse),
          *ws = gu_malloc((size_t)cp_k_attention_workspace_bytes(&m->spec));
    gu_upload(q, io->q, bq);
    gu_upload(k, io->k, bkv);
    gu_upload(v, io->v, bkv);
    gu_upload(dout, io->dout, bq);
    gu_poison(o, bq);
    gu_poison(lse, blse);
    attn_fwd(m, q, k, v, o, lse, 0);
    if (cudaDeviceSynchronize() != cudaSuccess) gu_fail("attention fwd failed: %s", cudaGetErrorString(cudaGetLastError()));
    io->o = malloc(bq);
    io->lse = malloc(blse);
    gu_download(io->o, o, bq);
    gu_download(io->lse, lse, blse);

    io->delta = row_delta(io->dout, io->o, io->nlse, s->head_dim);
    gu_upload(delta, io->delta, blse);
    gu_poison(dq, bq);
    gu_poison(ws, (size_t)cp_k_attention_workspace_bytes(&m->spec));
    if (s->dkv_accum) {
        io->dk32_init = gu_rand_f32(&rng, io->nkv, 0.5);
        io->dv32_init = gu_rand_f32(&rng, io->nkv, 0.5);
        gu_upload(dk, io->dk32_init, bdkv);
        gu_upload(dv, io->dv32_init, bdkv);
    } else {
        gu_poison(dk, bdkv);
        gu_poison(dv, bdkv);
    }
    attn_bwd(m, q, k, v, dout, lse, delta, ws, dq, dk, dv, 0);
    if (cudaDeviceSynchronize() != cudaSuccess) gu_fail("attention bwd failed: %s", cudaGetErrorString(cudaGetLastError()));
    io->dq = malloc(bq);
    gu_download(io->dq, dq, bq);
    if (s->dkv_accum) {
        io->dk32 = malloc(bdkv);
        io->dv32 = malloc(bdkv);
        gu_download(io->dk32, dk, bdkv);
        gu_download(io->dv32, dv, bdkv);
    } else {
        io->dk16 = malloc(bdkv);
        io->dv16 = malloc(bdkv);
        gu_download(io->dk16, dk, bdkv);
        gu_download(io->dv16, dv, bdkv);
    }
    void *bufs[] = {q, k, v, dout, o, dq, dk, dv, lse, delta, ws};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gu_free_dev(bufs[i]);
}

static void free_io(host_io *io) {
    void *p[] = {io->q, io->k, io->v, io->dout, io->o, io->dq, io->dk16, io->dv16, io->lse, io->delta,
                 io->dk32, io->dv32, io->dk32_init, io->dv32_init};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    memset(io, 0, sizeof *io);
}

static void check_shape(void **state) {
    attn_mod *m = *state;
    const attn_shape *s = &m->sh;
    char name[96];
    attn_shape_str(s, name, sizeof name);
    host_io io;
    memset(&io, 0, sizeof io);
    double t0 = cp_now();
    run_shape(m, &io);
    double t1 = cp_now();
    ref_attn_shape rs = {s->seq, s->q_heads, s->kv_heads, s->head_dim, s->causal, 1.0 / sqrt((double)s->head_dim)};
    double *q = to_f64(io.q, io.nq), *k = to_f64(io.k, io.nkv), *v = to_f64(io.v, io.nkv),
           *dout = to_f64(io.dout, io.nq);
    double *o = malloc(sizeof(double) * io.nq), *lse = malloc(sizeof(double) * io.nlse),
           *dq = malloc(sizeof(double) * io.nq), *dk = malloc(sizeof(double) * io.nkv),
           *dv = malloc(sizeof(double) * io.nkv);
    reference(&rs, q, k, v, dout, o, lse, dq, dk, dv);
    printf("  %s: GPU %.2f s, reference %.2f s\n", name, t1 - t0, cp_now() - t1);
    gu_check("attention fwd o", name, rel_bf16(io.o, o, io.nq), BOUND);
    gu_check("attention fwd lse", name, rel_f32(io.lse, lse, io.nlse), 1e-4);
    gu_check("attention bwd dq", name, rel_bf16(io.dq, dq, io.nq), BOUND);
    if (s->dkv_accum) {
        /* the kernel added its gradient to the initial values: compare the difference */
        float *gk = malloc(sizeof(float) * io.nkv), *gv = malloc(sizeof(float) * io.nkv);
        for (int64_t i = 0; i < io.nkv; i++) gk[i] = io.dk32[i] - io.dk32_init[i], gv[i] = io.dv32[i] - io.dv32_init[i];
        gu_check("attention bwd dk f32+=", name, rel_f32(gk, dk, io.nkv), BOUND);
        gu_check("attention bwd dv f32+=", name, rel_f32(gv, dv, io.nkv), BOUND);
        free(gk);
        free(gv);
    } else {
        gu_check("attention bwd dk", name, rel_bf16(io.dk16, dk, io.nkv), BOUND);
        gu_check("attention bwd dv", name, rel_bf16(io.dv16, dv, io.nkv), BOUND);
    }
    free(q), free(k), free(v), free(dout), free(o), free(lse), free(dq), free(dk), free(dv);
    free_io(&io);
}

/* The same shape twice on different inputs gives different outputs (no stale buffers), and twice on the same inputs
 * the same dk, dv (no races there; dq may differ in the last bits from the order of its atomics). */
static void check_repeatable(void **state) {
    attn_mod *m = *state;
    host_io a, b;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    uint64_t keep = seed;
    run_shape(m, &a);
    seed = keep;
    run_shape(m, &b);
    assert_memory_equal(a.o, b.o, (size_t)a.nq * 2);
    assert_memory_equal(a.dk16, b.dk16, (size_t)a.nkv * 2);
    assert_memory_equal(a.dv16, b.dv16, (size_t)a.nkv * 2);
    free_io(&a);
    free_io(&b);
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
    m.sh = (attn_shape){atoll(argv[3]), atoll(argv[6]), atoi(argv[4]), atoi(argv[5]), atoi(argv[7]) != 0, false};
    attn_build(&m, 1);
    host_io io;
    memset(&io, 0, sizeof io);
    run_shape(&m, &io);
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
    if (gu_init() != 0) return 0; /* no GPU: nothing to test here */
    if (argc == 8 && strcmp(argv[1], "--dump") == 0) return dump(argv);
    if (argc != 1) {
        fprintf(stderr, "usage: test_attention [--dump DIR S QH KVH D CAUSAL]\n");
        return 2;
    }
    gu_cmocka = true;
    for (int i = 0; i < NSHAPES; i++) mods[i].sh = SHAPES[i];
    attn_build(mods, NSHAPES);
    struct CMUnitTest tests[NSHAPES + 1];
    char names[NSHAPES][96];
    for (int i = 0; i < NSHAPES; i++) {
        attn_shape_str(&SHAPES[i], names[i], sizeof names[i]);
        tests[i] = (struct CMUnitTest){names[i], check_shape, NULL, NULL, &mods[i]};
    }
    tests[NSHAPES] = (struct CMUnitTest){"repeatable", check_repeatable, NULL, NULL, &mods[8]};
    int fails = _cmocka_run_group_tests("attention", tests, NSHAPES + 1, NULL, NULL);
    gu_print_table();
    for (int i = 0; i < NSHAPES; i++) attn_free(&mods[i]);
    return fails;
}
