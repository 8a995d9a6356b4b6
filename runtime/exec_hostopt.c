/* exec_hostopt.c: AdamW on the host (optimizer = "host"): the gradients stream down and the bf16 parameters up
 * through two-slot pinned rings while all cores update the fp32 master weights and moments in host memory. */
#include "exec_internal.h"

#include <math.h>
#include <unistd.h>

#include "util.h"

/* ---------------------------------------------------------------- the host optimizer */

typedef struct {
    const cp_exec *ex;
    int64_t lo, hi; /* elements of the chunk this thread updates */
    float *master, *m, *v;
    const float *g;
    uint16_t *out;
} hopt;

/* AdamW on elements [lo, hi) of a chunk, with the same formulas as templates/adamw.cu, and their bf16 copy. */
static void *hopt_thread(void *arg) {
    hopt *h = arg;
    const scalars *sc = &h->ex->sc;
    const float b1 = sc->beta1, b2 = sc->beta2, lr = sc->lr;
    const float bc1 = -expm1f((float)sc->adam_step * log1pf(b1 - 1.f));
    const float bc2 = -expm1f((float)sc->adam_step * log1pf(b2 - 1.f));
    const float step_size = lr / bc1, inv = 1.f / sqrtf(bc2), decay = 1.f - lr * sc->wd;
    for (int64_t i = h->lo; i < h->hi; i++) {
        float g = h->g[i] * sc->grad_scale, p = h->master[i] * decay;
        float m = b1 * h->m[i] + (1.f - b1) * g, v = b2 * h->v[i] + (1.f - b2) * g * g;
        float w = p - step_size * m / (sqrtf(v) * inv + sc->eps);
        h->master[i] = w;
        h->m[i] = m;
        h->v[i] = v;
        h->out[i] = exec_to_bf16(w);
    }
    return NULL;
}

/* The update of n elements on all cores: master, m, v in place, out = bf16(master). */
static void host_adamw(cp_exec *ex, float *master, float *m, float *v, const float *g, uint16_t *out, int64_t n) {
    enum { MAX_THREADS = 32 };
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = cores < 1 ? 1 : cores > MAX_THREADS ? MAX_THREADS : (int)cores;
    hopt h[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    for (int t = 0; t < nt; t++) {
        h[t] = (hopt){.ex = ex, .lo = n * t / nt, .hi = n * (t + 1) / nt, .master = master, .m = m, .v = v, .g = g,
                      .out = out};
        if (t + 1 < nt && pthread_create(&th[t], NULL, hopt_thread, &h[t])) cp_fatal(CP_EXIT_FAIL, "pthread_create failed");
    }
    hopt_thread(&h[nt - 1]); /* this thread takes the last part */
    for (int t = 0; t + 1 < nt; t++) pthread_join(th[t], NULL);
}

/* The optimizer step on the host (step i): chunk by chunk, the gradients come down into a two-slot pinned ring,
 * the CPU updates the fp32 master weights and moments (host memory) and writes the bf16 parameters into a second
 * ring, which goes up to the GPU's parameters. The copy of chunk k + 1 down and of chunk k up run while the CPU
 * works on chunk k; a slot is reused only after its previous copy has finished. */
int exec_host_update(cp_exec *ex, int i, char *err, int errlen) {
    const cp_plan *P = ex->P;
    const cp_step *s = &P->steps[i];
    char *ops[7];
    for (int j = 0; j < 7; j++) ops[j] = (char *)ex->bufptr[s->ops[j].buf] + s->ops[j].offset;
    const float *grads = (const float *)ops[0];
    float *ring_g = (float *)ops[1], *master = (float *)ops[2], *m = (float *)ops[3], *v = (float *)ops[4];
    uint16_t *ring_p = (uint16_t *)ops[5], *params = (uint16_t *)ops[6];
    cudaStream_t st = ex->streams[s->stream];
    const int64_t n = P->params_shard, ch = P->host_chunk, nch = (n + ch - 1) / ch;
#define CHUNK_LEN(k) ((size_t)CP_MIN(ch, n - (k) * ch))
    CK(cudaMemcpyAsync(ring_g, grads, sizeof(float) * CHUNK_LEN(0), cudaMemcpyDeviceToHost, st), "gradients to the host");
    CK(cudaEventRecord(ex->ring_ev[0][0], st), "recording a copy");
    for (int64_t k = 0; k < nch; k++) {
        int slot = (int)(k % 2), next = 1 - slot;
        if (k + 1 < nch) { /* the CPU finished with that slot at chunk k - 1 */
            CK(cudaMemcpyAsync(ring_g + next * ch, grads + (k + 1) * ch, sizeof(float) * CHUNK_LEN(k + 1),
                               cudaMemcpyDeviceToHost, st), "gradients to the host");
            CK(cudaEventRecord(ex->ring_ev[0][next], st), "recording a copy");
        }
        CK(cudaEventSynchronize(ex->ring_ev[0][slot]), "waiting for gradients from the GPU");
        if (k >= 2) CK(cudaEventSynchronize(ex->ring_ev[1][slot]), "waiting for parameters to the GPU");
        host_adamw(ex, master + k * ch, m + k * ch, v + k * ch, ring_g + slot * ch, ring_p + slot * ch,
                   (int64_t)CHUNK_LEN(k));
        CK(cudaMemcpyAsync(params + k * ch, ring_p + slot * ch, sizeof(uint16_t) * CHUNK_LEN(k),
                           cudaMemcpyHostToDevice, st), "parameters to the GPU");
        CK(cudaEventRecord(ex->ring_ev[1][slot], st), "recording a copy");
    }
#undef CHUNK_LEN
    return 0;
}
