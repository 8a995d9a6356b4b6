/* exec.c: the one-GPU step executor (see exec.h).
 *
 * Start-up turns every step of the plan into an `xstep`: a kernel launch with its argument list already built
 * (one small function per step `what` below, so each list is explicit and checked against the kernel's contract),
 * a prepared GEMM, a memset or a copy, plus the events it waits for on other streams. Argument values that change
 * from step to step (the loss scale, the learning rate, AdamW's step count) are passed as pointers to fields of the
 * executor, which cudaLaunchKernel reads at each launch. A training step then only walks the array.
 *
 * Streams: the plan puts every step on compute, comm or copy. A step waits for the last step of another stream that
 * wrote bytes it touches, or read bytes it writes. Hazards are found on arena bytes, not buffer names, because the
 * memory plan lets buffers with disjoint lifetimes share bytes and the copy stream may run ahead of compute. The
 * streams are joined at each micro-batch and before the optimizer, so the analysis covers one program at a time. */
#include "exec.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "emit.h"
#include "gemm.h"
#include "jit.h"
#include "kernels.h"
#include "kernels_attn.h"
#include "module.h"
#include "profile.h"
#include "util.h"
#include "weights.h"

#define MAXARGS 16
#define PIN_PIECE ((int64_t)8 << 30) /* pinned host allocations are at most 8 GiB each, made in parallel */
#define PROGRESS_AFTER 3.0           /* seconds: steps expected to run longer report progress */

enum { X_NONE, X_KERNEL, X_GEMM, X_MEMSET, X_COPY, X_LOAD_TOKENS, X_HOST_ADAMW, X_COLL };
enum { S_PLAIN, S_ADAMW };

typedef struct {
    cudaKernel_t k;
    cp_kdims d;
    int nargs;
    void *args[MAXARGS];
    uint64_t val[MAXARGS]; /* storage of the arguments that do not change */
} xlaunch;

typedef struct {
    int kind, special, stream;
    int nl;
    xlaunch L[2];
    int gemm;
    const void *ga, *gb, *gc;
    void *gd;
    void *dst;
    const void *src;
    size_t bytes;
    size_t count;         /* X_COLL: elements per rank (all-to-all: to each peer) */
    ncclDataType_t dtype; /* X_COLL */
    int wait0, nwait; /* into ex->waits: events of other streams to wait for */
    int event;        /* recorded after the step when another stream waits for it, else -1 */
    int marker;       /* progress marker recorded before the step, or -1 */
} xstep;

typedef struct {
    int64_t start, end; /* arena bytes */
    void *p;
    double seconds;
    cudaError_t e;
    int dev;
} hpiece;

typedef struct {
    int step;        /* step index of the marker */
    double before;   /* predicted seconds of the program before it */
    char label[48];
} marker;

/* Scalars the kernels read by pointer at each launch. */
typedef struct {
    float loss_scale, lr, beta1, beta2, eps, wd, grad_scale;
    int adam_step;
} scalars;

struct cp_exec {
    const cp_plan *P;
    cp_exec_opts o;
    cp_exec_startup info;
    int dev;
    char *gpu;      /* the arena */
    int npieces;
    hpiece *pieces; /* the host arena */
    void **bufptr;  /* per buffer: its address (NULL for a buffer of 0 bytes) */
    cp_module *mods;
    int nmods;
    cudaStream_t streams[CP_STREAM_COUNT];
    cudaEvent_t *events;
    int nevents;
    int *waits;
    int nwaits;
    cudaEvent_t join_ev[CP_STREAM_COUNT];
    cudaEvent_t ring_ev[2][2]; /* host optimizer: [slot] gradients down, [slot] parameters up */
    bool stream_used[CP_STREAM_COUNT];
    cp_gemm_lib *gemm;
    xstep *x;
    scalars sc;
    int32_t *staging;   /* pinned: [micro_batches][3][T] tokens, targets, rows sorted by token */
    int32_t *sort_count; /* [vocab + 1]: the counting sort of the tokens */
    float *host_scalars; /* pinned: loss_sum[0..1] read back once per step */
    float *loss_sum;    /* device */
    /* memory measurement */
    bool nvml;
    int64_t base_free_nvml, ctx_free_nvml, ctx_free_cuda;
    int64_t rss_base; /* resident host bytes before the host arena was pinned */
    bool skip_comm;   /* CPGEN_BENCH_SKIP_COMM=1: collectives replaced by local copies, to time the step without them */
    cp_profile *prof; /* CPGEN_PROFILE=N: step N (counted from 1 in this executor) timed step by step */
    int prof_step, steps_run;
    bool profiling;   /* the step running now is the one profiled */
    /* progress */
    int nmarkers;
    marker *markers;
    cudaEvent_t *marker_ev; /* [micro_batches][nmarkers] */
    int nmarker_ev;
    double t_micro, t_optim; /* predicted seconds of one micro-batch and of the optimizer */
    double last_seconds;
    int updates;
    bool dry; /* cp_exec_check: no GPU; addresses are made up, nothing is launched */
    int *event_step; /* the step recording each event */
};

/* ---------------------------------------------------------------- messages */

#define CK(call, what)                                                              \
    do {                                                                            \
        cudaError_t e_ = (call);                                                    \
        if (e_ != cudaSuccess) return cp_cuda_errmsg(e_, what, err, errlen);        \
    } while (0)

static const char *step_desc(const cp_plan *P, int i, char *buf, size_t n) {
    const cp_step *s = &P->steps[i];
    int k = snprintf(buf, n, "step %d (%s %s", i, cp_phase_name(s->phase), s->what);
    if (s->layer >= 0) k += snprintf(buf + k, n - (size_t)k, ", layer %d", s->layer);
    if (s->stage >= 0) k += snprintf(buf + k, n - (size_t)k, ", stage %d", s->stage);
    if (s->tile >= 0) k += snprintf(buf + k, n - (size_t)k, ", tile %d", s->tile);
    snprintf(buf + k, n - (size_t)k, ")");
    return buf;
}

/* ---------------------------------------------------------------- memory measurement (NVML by dlopen) */

typedef struct {
    unsigned long long total, free, used;
} nvml_memory;

/* Free bytes on the GPU with this PCI bus id from NVML, which needs no CUDA context. -1 when unavailable. */
static int64_t nvml_free(const char *bus_id) {
    static void *lib;
    static int (*init)(void), (*by_bus)(const char *, void **), (*meminfo)(void *, nvml_memory *);
    static bool tried, ok;
    if (!tried) {
        tried = true;
        lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib) {
            *(void **)&init = dlsym(lib, "nvmlInit_v2");
            *(void **)&by_bus = dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
            *(void **)&meminfo = dlsym(lib, "nvmlDeviceGetMemoryInfo");
            ok = init && by_bus && meminfo && init() == 0;
        }
    }
    if (!ok) return -1;
    void *h = NULL;
    nvml_memory m;
    if (by_bus(bus_id, &h) != 0 || meminfo(h, &m) != 0) return -1;
    return (int64_t)m.free;
}

static int64_t cuda_free_now(void) {
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) return -1;
    return (int64_t)f;
}

int64_t cp_exec_device_free(int dev) {
    char bus[64] = "";
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess) return -1;
    return nvml_free(bus);
}

/* A field of /proc/self/status in bytes ("VmRSS", "VmHWM"), or -1 where there is none. */
int64_t cp_proc_status_bytes(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    size_t n = strlen(field);
    long long kib = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, field, n) && line[n] == ':' && sscanf(line + n + 1, "%lld", &kib) == 1) break;
    fclose(f);
    return kib < 0 ? -1 : (int64_t)kib * 1024;
}

int64_t cp_exec_host_used(const cp_exec *ex) {
    int64_t rss = cp_proc_status_bytes("VmRSS");
    return rss < 0 || ex->rss_base < 0 ? -1 : rss - ex->rss_base;
}

int64_t cp_exec_mem_used(const cp_exec *ex) {
    int64_t f = cuda_free_now();
    if (f < 0) return -1;
    return (ex->nvml ? ex->base_free_nvml - ex->ctx_free_nvml : 0) + (ex->ctx_free_cuda - f);
}

/* ---------------------------------------------------------------- pinned host arena */

static void *pin_thread(void *arg) {
    hpiece *h = arg;
    double t0 = cp_now();
    h->e = cudaSetDevice(h->dev);
    if (h->e == cudaSuccess) h->e = cudaHostAlloc(&h->p, (size_t)(h->end - h->start), cudaHostAllocPortable);
    h->seconds = cp_now() - t0;
    return NULL;
}

static int cmp_i64pair(const void *a, const void *b) {
    const int64_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Cut the host arena into pieces of at most PIN_PIECE bytes where no buffer crosses a cut: each buffer's bytes
 * must be one pinned allocation. */
static void host_pieces(cp_exec *ex) {
    const cp_plan *P = ex->P;
    int n = 0;
    int64_t *iv = cp_xmalloc(sizeof(int64_t) * 2 * (size_t)(P->nbufs + 1));
    for (int i = 0; i < P->nbufs; i++) {
        const cp_buffer *b = &P->bufs[i];
        if (b->space != CP_SPACE_HOST || b->bytes <= 0 || b->offset < 0) continue;
        iv[2 * n] = b->offset;
        iv[2 * n + 1] = b->offset + b->bytes;
        n++;
    }
    qsort(iv, (size_t)n, 2 * sizeof(int64_t), cmp_i64pair);
    ex->pieces = cp_xcalloc((size_t)(n ? n : 1), sizeof *ex->pieces);
    ex->npieces = 0;
    for (int i = 0; i < n;) {
        /* one connected group of overlapping buffers */
        int64_t s = iv[2 * i], e = iv[2 * i + 1];
        int j = i + 1;
        while (j < n && iv[2 * j] < e) e = CP_MAX(e, iv[2 * j + 1]), j++;
        hpiece *last = ex->npieces ? &ex->pieces[ex->npieces - 1] : NULL;
        if (last && e - last->start <= PIN_PIECE) last->end = e;
        else ex->pieces[ex->npieces++] = (hpiece){.start = s, .end = e, .dev = ex->dev};
        i = j;
    }
    free(iv);
}

static void *host_addr(const cp_exec *ex, int64_t off) {
    for (int i = 0; i < ex->npieces; i++)
        if (off >= ex->pieces[i].start && off < ex->pieces[i].end) return (char *)ex->pieces[i].p + (off - ex->pieces[i].start);
    return NULL;
}

/* ---------------------------------------------------------------- operands and argument lists */

typedef struct {
    cp_exec *ex;
    int i;
    const cp_step *s;
    xstep *x;
    char *err;
    int errlen;
} pctx;

static int pfail(pctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int pfail(pctx *c, const char *fmt, ...) {
    char d[160], m[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    snprintf(c->err, (size_t)c->errlen, "%s: %s (the plan's operands and the runtime's reading of them disagree)",
             step_desc(c->ex->P, c->i, d, sizeof d), m);
    return -1;
}

static char *opp(const pctx *c, int j) { return (char *)c->ex->bufptr[c->s->ops[j].buf] + c->s->ops[j].offset; }
static int64_t opbytes(const pctx *c, int j) { return c->s->ops[j].bytes; }
static const cp_buffer *opbuf(const pctx *c, int j) { return &c->ex->P->bufs[c->s->ops[j].buf]; }

static int need_ops(pctx *c, int n) {
    if (c->s->nops != n) return pfail(c, "%d operands, expected %d", c->s->nops, n);
    for (int j = 0; j < n; j++)
        if (!c->ex->bufptr[c->s->ops[j].buf])
            return pfail(c, "operand %d (%s) has no memory", j, opbuf(c, j)->name);
    return 0;
}

static int need_bytes(pctx *c, int j, int64_t bytes) {
    if (opbytes(c, j) < bytes)
        return pfail(c, "operand %d (%s) has %lld bytes, the kernel touches %lld", j, opbuf(c, j)->name,
                     (long long)opbytes(c, j), (long long)bytes);
    return 0;
}

static int need_align(pctx *c, int j, int a) {
    if ((uintptr_t)opp(c, j) % (uintptr_t)a)
        return pfail(c, "operand %d (%s + %lld) is not %d-byte aligned", j, opbuf(c, j)->name,
                     (long long)c->s->ops[j].offset, a);
    return 0;
}

static const cp_kernel_spec *kspec(const pctx *c) { return &c->ex->P->modules[c->s->module]; }

static int64_t kint(pctx *c, const char *key) {
    const char *v = cp_kspec_get(kspec(c), key);
    return v ? strtoll(v, NULL, 10) : -1;
}

static void a_ptr(xlaunch *l, const void *p) {
    l->val[l->nargs] = (uint64_t)(uintptr_t)p;
    l->args[l->nargs] = &l->val[l->nargs];
    l->nargs++;
}
static void a_i64(xlaunch *l, int64_t v) {
    memcpy(&l->val[l->nargs], &v, sizeof v);
    l->args[l->nargs] = &l->val[l->nargs];
    l->nargs++;
}
static void a_i32(xlaunch *l, int v) {
    memcpy(&l->val[l->nargs], &v, sizeof v);
    l->args[l->nargs] = &l->val[l->nargs];
    l->nargs++;
}
/* An argument read from the executor's scalars at each launch. */
static void a_dyn(xlaunch *l, void *p) { l->args[l->nargs++] = p; }

/* The kernel for `role` of the step's module, with the geometry for (n, heads). */
static int launch_of(pctx *c, const char *role, int64_t n, int64_t heads, xlaunch *l) {
    const cp_exec *ex = c->ex;
    const cp_kernel_spec *k = kspec(c);
    char e[1024];
    if (!ex->dry && cp_module_role(&ex->mods[c->s->module], k->family, role, &l->k, e, sizeof e))
        return pfail(c, "%s", e);
    int rc = strcmp(k->family, "attention") == 0 ? cp_k_attention_dims(k, role, &l->d)
                                                 : cp_k_dims(k, role, n, heads, ex->info.sms, &l->d);
    if (rc) return pfail(c, "no launch geometry for %s role %s", k->family, role);
    if (!l->d.grid[0] || !l->d.grid[1] || !l->d.grid[2] || !l->d.block)
        return pfail(c, "%s role %s gets an empty launch (%u x %u x %u blocks of %u)", k->family, role, l->d.grid[0],
                     l->d.grid[1], l->d.grid[2], l->d.block);
    if (!ex->dry && l->d.smem > 48 * 1024 && cp_kernel_set_max_smem(l->k, l->d.smem, e, sizeof e)) return pfail(c, "%s", e);
    c->x->nl++;
    return 0;
}

/* ---- one function per step `what` ---- */

/* embed: fwd(tokens i32[n], table[V][H], out[n][H], n) */
static int k_embed(pctx *c) {
    if (need_ops(c, 3)) return -1;
    int64_t n = c->s->count, H = kint(c, "HIDDEN"), V = kint(c, "VOCAB");
    if (need_bytes(c, 0, n * 4) || need_bytes(c, 1, V * H * 2) || need_bytes(c, 2, n * H * 2)) return -1;
    if (need_align(c, 1, 16) || need_align(c, 2, 16)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "fwd", n, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_ptr(l, opp(c, 1));
    a_ptr(l, opp(c, 2));
    a_i64(l, n);
    return 0;
}

/* embed_bwd: operands tokens, token_order, dout, dtable; bwd_sorted(tokens, order i32[n], dout[n][H],
 * dtable f32[V][H] +=, n) */
static int k_embed_bwd(pctx *c) {
    if (need_ops(c, 4)) return -1;
    int64_t n = c->s->count, H = kint(c, "HIDDEN"), V = kint(c, "VOCAB");
    if (need_bytes(c, 0, n * 4) || need_bytes(c, 1, n * 4) || need_bytes(c, 2, n * H * 2) ||
        need_bytes(c, 3, V * H * 4))
        return -1;
    if (need_align(c, 2, 16) || need_align(c, 3, 16)) return -1;
    if (n > INT32_MAX) return pfail(c, "%lld rows: the sorted order holds 32-bit positions", (long long)n);
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "bwd_sorted", n, 0, l)) return -1;
    for (int j = 0; j < 4; j++) a_ptr(l, opp(c, j));
    a_i64(l, n);
    return 0;
}

/* norm1, norm2, final_norm, q_norm, k_norm: operands x, weight, out, rstd;
 * fwd(x, resid NULL, sum_out NULL, weight, out, rstd f32[n], n) */
static int k_norm_fwd(pctx *c) {
    if (need_ops(c, 4)) return -1;
    int64_t n = c->s->count, H = kint(c, "HIDDEN");
    if (need_bytes(c, 0, n * H * 2) || need_bytes(c, 1, H * 2) || need_bytes(c, 2, n * H * 2) ||
        need_bytes(c, 3, n * 4))
        return -1;
    for (int j = 0; j < 3; j++)
        if (need_align(c, j, 16)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "fwd", n, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_ptr(l, NULL);
    a_ptr(l, NULL);
    a_ptr(l, opp(c, 1));
    a_ptr(l, opp(c, 2));
    a_ptr(l, opp(c, 3));
    a_i64(l, n);
    return 0;
}

/* The norm backward, two launches: bwd(dout, x, weight, rstd, dresid|NULL, dx, dw_part f32[grid][H], n), then
 * bwd_dw(dw_part, parts = bwd's grid, dweight f32 +=): the weight gradient summed in a fixed order. */
static int norm_bwd(pctx *c, int dout, int x, int w, int rstd, int dresid, int dx, int dw, int part) {
    int64_t n = c->s->count, H = kint(c, "HIDDEN");
    if (need_bytes(c, dout, n * H * 2) || need_bytes(c, x, n * H * 2) || need_bytes(c, w, H * 2) ||
        need_bytes(c, rstd, n * 4) || need_bytes(c, dx, n * H * 2) || need_bytes(c, dw, H * 4) ||
        (dresid >= 0 && need_bytes(c, dresid, n * H * 2)))
        return -1;
    if (need_align(c, dout, 16) || need_align(c, x, 16) || need_align(c, w, 16) || need_align(c, dx, 16) ||
        need_align(c, dw, 16) || need_align(c, part, 16) || (dresid >= 0 && need_align(c, dresid, 16)))
        return -1;
    xlaunch *l = &c->x->L[0], *r = &c->x->L[1];
    if (launch_of(c, "bwd", n, 0, l)) return -1;
    int64_t parts = l->d.grid[0];
    if (need_bytes(c, part, parts * H * 4)) return -1;
    a_ptr(l, opp(c, dout));
    a_ptr(l, opp(c, x));
    a_ptr(l, opp(c, w));
    a_ptr(l, opp(c, rstd));
    a_ptr(l, dresid >= 0 ? opp(c, dresid) : NULL);
    a_ptr(l, opp(c, dx));
    a_ptr(l, opp(c, part));
    a_i64(l, n);
    if (launch_of(c, "bwd_dw", n, 0, r)) return -1;
    a_ptr(r, opp(c, part));
    a_i32(r, (int)parts);
    a_ptr(r, opp(c, dw));
    return 0;
}

/* norm1_bwd, norm2_bwd: operands dxn, x, weight, rstd, d_resid-in (dresid), dx out, dweight, norm partials */
static int k_norm_bwd_resid(pctx *c) { return need_ops(c, 8) ? -1 : norm_bwd(c, 0, 1, 2, 3, 4, 5, 6, 7); }
/* final_norm_bwd: operands dout, x, weight, rstd, dx, dweight, norm partials */
static int k_norm_bwd(pctx *c) { return need_ops(c, 7) ? -1 : norm_bwd(c, 0, 1, 2, 3, -1, 4, 5, 6); }
/* qk_norm_bwd: operands d (in place: dout and dx), x (before the norm), weight, rstd, dweight, norm partials */
static int k_qk_norm_bwd(pctx *c) { return need_ops(c, 6) ? -1 : norm_bwd(c, 0, 1, 2, 3, -1, 0, 4, 5); }

/* rope_q, rope_k (fwd), rope_dq, rope_dk (bwd): in place on [n][heads][D], row r at position pos0 + r:
 * fwd/bwd(x, n, heads, pos0) */
static int k_rope(pctx *c) {
    if (need_ops(c, 1)) return -1;
    int64_t n = c->s->count, heads = c->s->heads, D = kint(c, "D");
    if (n < 1 || heads < 1) return pfail(c, "%lld rows of %lld heads", (long long)n, (long long)heads);
    if (opbytes(c, 0) != n * heads * D * 2)
        return pfail(c, "%lld bytes are not %lld rows of %lld heads of %lld", (long long)opbytes(c, 0), (long long)n,
                     (long long)heads, (long long)D);
    if (need_align(c, 0, 16)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, c->s->role, n, heads, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_i64(l, n);
    a_i32(l, (int)heads);
    a_i64(l, (int64_t)c->ex->o.rank * c->ex->P->T); /* this rank's slice starts at position rank * T */
    return 0;
}

/* attn_fwd: operands q, k, v, o, lse (the stage's slice): fwd(q, k, v, o, lse) */
static int k_attn_fwd(pctx *c) {
    if (need_ops(c, 5)) return -1;
    int64_t S = kint(c, "SEQ"), D = kint(c, "HEAD_DIM"), QH = kint(c, "Q_HEADS"), KH = kint(c, "KV_HEADS");
    if (need_bytes(c, 0, S * QH * D * 2) || need_bytes(c, 1, S * KH * D * 2) || need_bytes(c, 2, S * KH * D * 2) ||
        need_bytes(c, 3, S * QH * D * 2) || need_bytes(c, 4, QH * S * 4))
        return -1;
    for (int j = 0; j < 5; j++)
        if (need_align(c, j, 16)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "fwd", 0, 0, l)) return -1;
    for (int j = 0; j < 5; j++) a_ptr(l, opp(c, j));
    return 0;
}

/* attn_bwd: operands q, k, v, dout, lse (the stage's slice), delta, the dQ workspace (fp32 dQ, written, then the
 * progress counters, zeroed by the plan), then dkv_accum (fp32 dK then dV, +=) or dk, dv (bf16):
 * bwd(q, k, v, dout, lse, delta, dq_ws, dq_prog, dk, dv) */
static int k_attn_bwd(pctx *c) {
    bool acc = kint(c, "DKV_ACCUM") == 1;
    if (need_ops(c, acc ? 8 : 9)) return -1;
    int64_t S = kint(c, "SEQ"), D = kint(c, "HEAD_DIM"), QH = kint(c, "Q_HEADS"), KH = kint(c, "KV_HEADS");
    if (need_bytes(c, 0, S * QH * D * 2) || need_bytes(c, 1, S * KH * D * 2) || need_bytes(c, 2, S * KH * D * 2) ||
        need_bytes(c, 3, S * QH * D * 2) || need_bytes(c, 4, QH * S * 4) || need_bytes(c, 5, S * QH * 4) ||
        need_bytes(c, 6, cp_k_attention_workspace_bytes(kspec(c))))
        return -1;
    if (acc ? need_bytes(c, 7, 2 * S * KH * D * 4) : (need_bytes(c, 7, S * KH * D * 2) || need_bytes(c, 8, S * KH * D * 2)))
        return -1;
    for (int j = 0; j < c->s->nops; j++)
        if (need_align(c, j, 16)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "bwd", 0, 0, l)) return -1;
    for (int j = 0; j < 7; j++) a_ptr(l, opp(c, j));
    a_ptr(l, opp(c, 6) + cp_k_attention_prog_offset(kspec(c)));
    a_ptr(l, opp(c, 7));
    a_ptr(l, acc ? opp(c, 7) + S * KH * D * 4 : opp(c, 8));
    return 0;
}

/* attn_bwd_dq: operands dq_ws (fp32), dq (bf16): bwd_dq(dq_ws, dq), dq = bf16(scale * dq_ws) */
static int k_attn_bwd_dq(pctx *c) {
    if (need_ops(c, 2)) return -1;
    int64_t S = kint(c, "SEQ"), D = kint(c, "HEAD_DIM"), QH = kint(c, "Q_HEADS");
    if (need_bytes(c, 0, S * QH * D * 4) || need_bytes(c, 1, S * QH * D * 2) || need_align(c, 0, 16) ||
        need_align(c, 1, 16))
        return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "bwd_dq", 0, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_ptr(l, opp(c, 1));
    return 0;
}

/* Ulysses layout kernels: between a stage's columns of a token-layout buffer (T rows of the whole buffer's width)
 * and C contiguous blocks of [T][NOUT][ROW_BYTES] heads, one per rank (with one GPU, a strided copy). */
static int layout_check(pctx *c, int tokbuf_op, int64_t *stride) {
    const cp_plan *P = c->ex->P;
    int64_t T = kint(c, "T"), nout = kint(c, "NOUT"), rb = kint(c, "ROW_BYTES"), unit = kint(c, "UNIT");
    int64_t C = kint(c, "C"), R = kint(c, "R");
    if (C != P->C) return pfail(c, "a layout kernel for %lld GPUs in a plan of %d", (long long)C, P->C);
    /* a token row holds C/R * NOUT heads of the stage; the all-to-all side C blocks of T x NOUT heads */
    int64_t row = C / R * nout * rb;
    const cp_buffer *b = opbuf(c, tokbuf_op);
    if (T != P->T || b->bytes % T) return pfail(c, "%s is not %lld token rows", b->name, (long long)T);
    *stride = b->bytes / T;
    if (*stride % unit || *stride < row) return pfail(c, "row stride %lld of %s", (long long)*stride, b->name);
    int other = 1 - tokbuf_op;
    /* the stage's columns of every row: from the operand's offset to near the buffer's end, whatever the
     * operand's byte count says (step_ranges widens it to the whole buffer for the stream analysis) */
    if (need_bytes(c, other, C * T * nout * rb)) return -1;
    if (c->s->ops[tokbuf_op].offset + (T - 1) * *stride + row > b->bytes)
        return pfail(c, "the stage's columns run past the end of %s", b->name);
    if (need_align(c, 0, (int)unit) || need_align(c, 1, (int)unit)) return -1;
    return 0;
}

/* pack_do, pack_delta: operands src (the stage's columns), dst (head layout): pack(src, src_stride, dst) */
static int k_pack(pctx *c) {
    int64_t stride;
    if (need_ops(c, 2) || layout_check(c, 0, &stride)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "pack", 0, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_i64(l, stride);
    a_ptr(l, opp(c, 1));
    return 0;
}

/* unpack_o, unpack_dq, unpack_dk, unpack_dv: operands src (head layout: the all-to-all's C blocks), dst (the stage's
 * columns of the token rows): unpack or unpack_add (the step's role) (src, dst, dst_stride) */
static int k_unpack(pctx *c) {
    int64_t stride;
    if (need_ops(c, 2) || layout_check(c, 1, &stride)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, c->s->role, 0, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_ptr(l, opp(c, 1));
    a_i64(l, stride);
    return 0;
}

/* swiglu: operands gate, up, out: fwd(gate, up, out, n) */
static int k_swiglu(pctx *c) {
    if (need_ops(c, 3)) return -1;
    int64_t n = c->s->count, F = kint(c, "FFN");
    for (int j = 0; j < 3; j++)
        if (need_bytes(c, j, n * F * 2) || need_align(c, j, 16)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "fwd", n, 0, l)) return -1;
    for (int j = 0; j < 3; j++) a_ptr(l, opp(c, j));
    a_i64(l, n);
    return 0;
}

/* swiglu_bwd: operands dout (d act), gate, up (overwritten with their gradients): bwd(dout, gate, up, n) */
static int k_swiglu_bwd(pctx *c) {
    if (need_ops(c, 3)) return -1;
    int64_t n = c->s->count, F = kint(c, "FFN");
    for (int j = 0; j < 3; j++)
        if (need_bytes(c, j, n * F * 2) || need_align(c, j, 16)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "bwd", n, 0, l)) return -1;
    for (int j = 0; j < 3; j++) a_ptr(l, opp(c, j));
    a_i64(l, n);
    return 0;
}

/* loss: operands logits (in place -> dlogits * scale), targets (the tile's), token_loss (the tile's):
 * fwdbwd(logits, targets, row_loss f32[n] out, scale, n); scale = 1 / target tokens of the whole step */
static int k_loss(pctx *c) {
    if (need_ops(c, 3)) return -1;
    int64_t n = c->s->count, V = kint(c, "VOCAB");
    if (need_bytes(c, 0, n * V * 2) || need_bytes(c, 1, n * 4) || need_bytes(c, 2, n * 4) || need_align(c, 0, 16))
        return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "fwdbwd", n, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_ptr(l, opp(c, 1));
    a_ptr(l, opp(c, 2));
    a_dyn(l, &c->ex->sc.loss_scale);
    a_i64(l, n);
    return 0;
}

/* loss_sum: operands token_loss, loss_sum float 0: sum(row_loss f32[n], n, loss_sum f32[1] +=) */
static int k_loss_sum(pctx *c) {
    if (need_ops(c, 2)) return -1;
    int64_t n = c->s->count;
    if (need_bytes(c, 0, n * 4) || need_bytes(c, 1, 4)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "sum", n, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_i64(l, n);
    a_ptr(l, opp(c, 1));
    return 0;
}

/* attn_delta: operands dout, out (token layout [n][heads][D]), delta f32[n][heads]: fwd(dout, out, delta, n, heads) */
static int k_attn_delta(pctx *c) {
    if (need_ops(c, 3)) return -1;
    int64_t n = c->s->count, heads = c->s->heads, D = kint(c, "D");
    if (heads < 1) return pfail(c, "no heads given");
    if (need_bytes(c, 0, n * heads * D * 2) || need_bytes(c, 1, n * heads * D * 2) || need_bytes(c, 2, n * heads * 4))
        return -1;
    for (int j = 0; j < 3; j++)
        if (need_align(c, j, 16)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "fwd", n, heads, l)) return -1;
    for (int j = 0; j < 3; j++) a_ptr(l, opp(c, j));
    a_i64(l, n);
    a_i32(l, (int)heads);
    return 0;
}

/* grad_accum (C > 1, micro-batches > 1): operands this rank's gradient shard of a unit, the unit's full gradients:
 * add_f32(shard, full + rank * shard, n) before the reduce-scatter overwrites the shard with the sum */
static int k_grad_accum(pctx *c) {
    if (need_ops(c, 2)) return -1;
    const cp_exec *ex = c->ex;
    int64_t n = c->s->count;
    if (need_bytes(c, 0, n * 4) || need_bytes(c, 1, n * 4 * ex->P->C)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "add_f32", n, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_ptr(l, opp(c, 1) + (size_t)ex->o.rank * (size_t)n * 4);
    a_i64(l, n);
    return 0;
}

/* cast_dk, cast_dv: operands src f32, dst bf16: f32_to_bf16(src, dst, n) */
static int k_cast(pctx *c) {
    if (need_ops(c, 2)) return -1;
    int64_t n = c->s->count;
    if (need_bytes(c, 0, n * 4) || need_bytes(c, 1, n * 2)) return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "f32_to_bf16", n, 0, l)) return -1;
    a_ptr(l, opp(c, 0));
    a_ptr(l, opp(c, 1));
    a_i64(l, n);
    return 0;
}

/* grad_norm: operands grads, sumsq_partials, loss_sum float 1, sumsq's counter in loss_sum:
 * sumsq(grad f32[n], n, partial f64[grid], counter u32, out f32[1] +=) */
static int k_grad_norm(pctx *c) {
    if (need_ops(c, 4)) return -1;
    int64_t n = c->s->count;
    if (need_bytes(c, 0, n * 4) || need_bytes(c, 2, 4) || need_bytes(c, 3, 4) || need_align(c, 1, 8) ||
        need_align(c, 3, 4))
        return -1;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "sumsq", n, 0, l)) return -1;
    if (need_bytes(c, 1, (int64_t)l->d.grid[0] * 8)) return -1;
    a_ptr(l, opp(c, 0));
    a_i64(l, n);
    a_ptr(l, opp(c, 1));
    a_ptr(l, opp(c, 3));
    a_ptr(l, opp(c, 2));
    return 0;
}

/* adamw: operands master, m, v, grads, params:
 * update(master, m, v, grad, param, n, lr, beta1, beta2, eps, wd, grad_scale, step) */
static int k_adamw(pctx *c) {
    if (need_ops(c, 5)) return -1;
    int64_t n = c->s->count;
    for (int j = 0; j < 4; j++)
        if (need_bytes(c, j, n * 4)) return -1;
    if (need_bytes(c, 4, n * 2)) return -1;
    scalars *sc = &c->ex->sc;
    xlaunch *l = &c->x->L[0];
    if (launch_of(c, "update", n, 0, l)) return -1;
    for (int j = 0; j < 5; j++) a_ptr(l, opp(c, j));
    a_i64(l, n);
    a_dyn(l, &sc->lr);
    a_dyn(l, &sc->beta1);
    a_dyn(l, &sc->beta2);
    a_dyn(l, &sc->eps);
    a_dyn(l, &sc->wd);
    a_dyn(l, &sc->grad_scale);
    a_dyn(l, &sc->adam_step);
    c->x->special = S_ADAMW;
    return 0;
}

typedef int (*kprep)(pctx *c);
static const struct {
    const char *what;
    kprep fn;
} KERNEL_STEPS[] = {
    {"embed", k_embed},           {"embed_bwd", k_embed_bwd},   {"norm1", k_norm_fwd},
    {"norm2", k_norm_fwd},        {"final_norm", k_norm_fwd},   {"q_norm", k_norm_fwd},
    {"k_norm", k_norm_fwd},       {"norm1_bwd", k_norm_bwd_resid}, {"norm2_bwd", k_norm_bwd_resid},
    {"final_norm_bwd", k_norm_bwd}, {"qk_norm_bwd", k_qk_norm_bwd}, {"rope_q", k_rope},
    {"rope_k", k_rope},           {"rope_dq", k_rope},          {"rope_dk", k_rope},
    {"attn_fwd", k_attn_fwd},     {"attn_bwd", k_attn_bwd},     {"attn_bwd_dq", k_attn_bwd_dq},     {"unpack_o", k_unpack},
    {"pack_do", k_pack},          {"pack_delta", k_pack},       {"pack_q", k_pack},
    {"pack_k", k_pack},           {"pack_v", k_pack},           {"unpack_dq", k_unpack},
    {"unpack_dk", k_unpack},      {"unpack_dv", k_unpack},      {"grad_accum", k_grad_accum},
    {"swiglu", k_swiglu},         {"swiglu_bwd", k_swiglu_bwd}, {"loss", k_loss},
    {"loss_sum", k_loss_sum},     {"attn_delta", k_attn_delta}, {"cast_dk", k_cast},
    {"cast_dv", k_cast},          {"grad_norm", k_grad_norm},   {"adamw", k_adamw},
};

/* GEMM: operands A, B, (C), D with the plan's cp_gemm; every operand must hold the rows its leading dimension
 * implies. */
static int prep_gemm(pctx *c) {
    const cp_gemm *g = &c->s->gemm;
    int n = 3 + (g->has_c ? 1 : 0);
    if (need_ops(c, n)) return -1;
    int64_t ar = g->trans_a ? g->k : g->m, ac = g->trans_a ? g->m : g->k;
    int64_t br = g->trans_b ? g->n : g->k, bc = g->trans_b ? g->k : g->n;
    int64_t esz = g->out_f32 ? 4 : 2;
    if (need_bytes(c, 0, ((ar - 1) * g->lda + ac) * 2) || need_bytes(c, 1, ((br - 1) * g->ldb + bc) * 2) ||
        need_bytes(c, n - 1, ((g->m - 1) * g->ldd + g->n) * esz) ||
        (g->has_c && need_bytes(c, 2, ((g->m - 1) * g->ldd + g->n) * 2)))
        return -1;
    xstep *x = c->x;
    x->ga = opp(c, 0);
    x->gb = opp(c, 1);
    x->gc = g->has_c ? opp(c, 2) : NULL;
    x->gd = opp(c, n - 1);
    if (c->ex->dry) return 0;
    x->gemm = cp_gemm_prepare(c->ex->gemm, g, c->s->what, x->ga, x->gb, x->gc, x->gd, c->err, c->errlen);
    return x->gemm < 0 ? -1 : 0;
}

static int buf_index(const cp_exec *ex, const char *name);

/* The plan's collectives over the C ranks (gen/plan.c says what each moves):
 *   all-to-all      operands send (C equal blocks, one per rank), recv: bytes, moved as bytes
 *   all-gather      operands this rank's shard of a unit (bf16), the gathered unit: the shards in rank order
 *   reduce-scatter  operands the unit's full fp32 gradients, this rank's shard: summed over the ranks
 *   all-reduce      operand the loss sum and the gradient's sum of squares (fp32), summed in place */
static int prep_collective(pctx *c) {
    const cp_plan *P = c->ex->P;
    const cp_step *s = c->s;
    xstep *x = c->x;
    int64_t C = P->C;
    x->kind = X_COLL;
    if (C < 2) return pfail(c, "a collective in a plan of one GPU");
    switch (s->kind) {
    case CP_OP_ALLTOALL:
        if (need_ops(c, 2) || need_bytes(c, 0, s->count) || need_bytes(c, 1, s->count)) return -1;
        if (s->count % C) return pfail(c, "an all-to-all of %lld bytes does not split into %lld blocks",
                                       (long long)s->count, (long long)C);
        x->src = opp(c, 0), x->dst = opp(c, 1);
        x->count = (size_t)(s->count / C);
        x->dtype = ncclUint8;
        return 0;
    case CP_OP_ALLGATHER:
        if (need_ops(c, 2)) return -1;
        if (opbytes(c, 0) * C != s->count || opbytes(c, 1) < s->count || opbytes(c, 0) % 2)
            return pfail(c, "gathering %lld-byte shards into %lld of %lld bytes", (long long)opbytes(c, 0),
                         (long long)s->count, (long long)opbytes(c, 1));
        x->src = opp(c, 0), x->dst = opp(c, 1);
        x->count = (size_t)(opbytes(c, 0) / 2);
        x->dtype = ncclBfloat16;
        return 0;
    case CP_OP_REDUCE_SCATTER:
        if (need_ops(c, 2)) return -1;
        if (opbytes(c, 1) * C != s->count || opbytes(c, 0) < s->count || opbytes(c, 1) % 4)
            return pfail(c, "reduce-scattering %lld of %lld bytes into %lld-byte shards", (long long)s->count,
                         (long long)opbytes(c, 0), (long long)opbytes(c, 1));
        x->src = opp(c, 0), x->dst = opp(c, 1);
        x->count = (size_t)(opbytes(c, 1) / 4);
        x->dtype = ncclFloat32;
        return 0;
    case CP_OP_ALLREDUCE:
        if (need_ops(c, 1) || need_bytes(c, 0, s->count) || s->count % 4) return -1;
        x->src = x->dst = opp(c, 0);
        x->count = (size_t)(s->count / 4);
        x->dtype = ncclFloat32;
        return 0;
    default:
        return pfail(c, "not a collective");
    }
}

/* CPGEN_BENCH_SKIP_COMM: the collective's output made without the peers, from this rank's own blocks by device
 * copies, so what follows computes on real values (on zeros the GPU would run cooler and faster than the real step)
 * at the price of one on-GPU copy of the bytes; the step's all-reduce of the scalars still runs, keeping the ranks
 * in step. */
static cudaError_t local_stand_in(const cp_exec *ex, int i, cudaStream_t st) {
    const xstep *x = &ex->x[i];
    size_t b = x->count * cp_nccl_type_size(x->dtype);
    int C = ex->P->C;
    const char *src = x->src;
    char *dst = x->dst;
    cudaError_t e = cudaSuccess;
    switch (ex->P->steps[i].kind) {
    case CP_OP_ALLTOALL: return cudaMemcpyAsync(dst, src, b * (size_t)C, cudaMemcpyDeviceToDevice, st);
    case CP_OP_ALLGATHER: /* every slot gets this rank's shard; the slot that is the shard itself stays */
        for (int k = 0; k < C && e == cudaSuccess; k++)
            if (dst + (size_t)k * b != src)
                e = cudaMemcpyAsync(dst + (size_t)k * b, src, b, cudaMemcpyDeviceToDevice, st);
        return e;
    case CP_OP_REDUCE_SCATTER: {
        const char *mine = src + (size_t)ex->o.rank * b;
        return mine == dst ? cudaSuccess : cudaMemcpyAsync(dst, mine, b, cudaMemcpyDeviceToDevice, st);
    }
    default: return cudaSuccess;
    }
}

static int run_collective(cp_exec *ex, int i, cudaStream_t st, char *err, int errlen) {
    const xstep *x = &ex->x[i];
    cp_nccl_comm *cm = ex->o.comm;
    switch (ex->P->steps[i].kind) {
    case CP_OP_ALLTOALL: return cp_nccl_all_to_all(cm, x->src, x->dst, x->count, x->dtype, st, err, errlen);
    case CP_OP_ALLGATHER: return cp_nccl_all_gather(cm, x->src, x->dst, x->count, x->dtype, st, err, errlen);
    case CP_OP_REDUCE_SCATTER:
        return cp_nccl_reduce_scatter(cm, x->src, x->dst, x->count, x->dtype, ncclSum, st, err, errlen);
    case CP_OP_ALLREDUCE: return cp_nccl_all_reduce(cm, x->src, x->dst, x->count, x->dtype, ncclSum, st, err, errlen);
    default: return cp_errf(err, errlen, "step %d is not a collective", i);
    }
}

static int prep_step(cp_exec *ex, int i, char *err, int errlen) {
    const cp_plan *P = ex->P;
    const cp_step *s = &P->steps[i];
    xstep *x = &ex->x[i];
    memset(x, 0, sizeof *x);
    x->event = x->marker = -1;
    x->gemm = -1;
    x->stream = s->stream;
    pctx c = {.ex = ex, .i = i, .s = s, .x = x, .err = err, .errlen = errlen};
    switch (s->kind) {
    case CP_OP_KERNEL:
        if (s->module < 0) {
            if (strcmp(s->what, "adamw_host")) return pfail(&c, "a host step this runtime does not know");
            /* grads (GPU), gradient ring (host), master, m, v, parameter ring (host), params (GPU) */
            int64_t n = P->params_shard, ch = P->host_chunk;
            if (need_ops(&c, 7) || need_bytes(&c, 0, n * 4) || need_bytes(&c, 1, 2 * ch * 4) ||
                need_bytes(&c, 2, n * 4) || need_bytes(&c, 3, n * 4) || need_bytes(&c, 4, n * 4) ||
                need_bytes(&c, 5, 2 * ch * 2) || need_bytes(&c, 6, n * 2))
                return -1;
            if (ch < 1) return pfail(&c, "the plan has no host chunk size");
            x->kind = X_HOST_ADAMW;
            return 0;
        }
        x->kind = X_KERNEL;
        for (size_t k = 0; k < CP_ARRAY_LEN(KERNEL_STEPS); k++)
            if (!strcmp(KERNEL_STEPS[k].what, s->what)) return KERNEL_STEPS[k].fn(&c);
        return pfail(&c, "a kernel step this runtime does not know (module %s, role %s)", P->modules[s->module].family,
                     s->role);
    case CP_OP_GEMM:
        x->kind = X_GEMM;
        return prep_gemm(&c);
    case CP_OP_MEMSET:
        if (need_ops(&c, 1)) return -1;
        x->kind = X_MEMSET;
        x->dst = opp(&c, 0);
        x->bytes = (size_t)opbytes(&c, 0);
        if (s->count != opbytes(&c, 0)) return pfail(&c, "memset of %lld bytes on an operand of %lld",
                                                     (long long)s->count, (long long)opbytes(&c, 0));
        return 0;
    case CP_OP_COPY_H2D:
    case CP_OP_COPY_D2H:
        if (!strcmp(s->what, "load_tokens")) {
            /* tokens, targets, token_order */
            if (need_ops(&c, 3) || need_bytes(&c, 0, P->T * 4) || need_bytes(&c, 1, P->T * 4) ||
                need_bytes(&c, 2, P->T * 4))
                return -1;
            x->kind = X_LOAD_TOKENS;
            return 0;
        }
        if (need_ops(&c, 2)) return -1;
        x->kind = X_COPY;
        x->src = opp(&c, 0);
        x->dst = opp(&c, 1);
        x->bytes = (size_t)opbytes(&c, 1);
        if (opbytes(&c, 0) != opbytes(&c, 1))
            return pfail(&c, "a copy of %lld bytes into %lld", (long long)opbytes(&c, 0), (long long)opbytes(&c, 1));
        return 0;
    case CP_OP_ALLTOALL:
    case CP_OP_ALLGATHER:
    case CP_OP_REDUCE_SCATTER:
    case CP_OP_ALLREDUCE:
        return prep_collective(&c);
    default:
        return pfail(&c, "a step kind this runtime does not know");
    }
}

/* ---------------------------------------------------------------- weights read by the backward */

typedef struct {
    int64_t off, len; /* elements */
} erange;

static int cmp_erange(const void *a, const void *b) {
    const erange *x = a, *y = b;
    return x->off != y->off ? (x->off < y->off ? -1 : 1) : (x->len > y->len) - (x->len < y->len);
}

static bool is_weights(cp_cat c) { return c == CP_CAT_PARAMS || c == CP_CAT_GATHERED; }
static bool is_grads(cp_cat c) { return c == CP_CAT_GRADS || c == CP_CAT_UNIT_GRADS; }

/* Every weight slice a backward GEMM reads, and every gradient slice it accumulates into, must be a slice some
 * forward GEMM read as weights: otherwise the backward trains rows the forward never used, silently. */
static int check_weight_ranges(const cp_exec *ex, char *err, int errlen) {
    const cp_plan *P = ex->P;
    int n = 0, cap = 64;
    erange *fw = cp_xmalloc(sizeof *fw * (size_t)cap);
    for (int i = 0; i < P->micro_steps; i++) {
        const cp_step *s = &P->steps[i];
        if (s->kind != CP_OP_GEMM || s->phase != CP_PHASE_FWD) continue;
        for (int j = 0; j < s->nops; j++)
            if (is_weights(P->bufs[s->ops[j].buf].cat)) {
                if (n == cap) fw = cp_xrealloc(fw, sizeof *fw * (size_t)(cap *= 2));
                fw[n++] = (erange){s->ops[j].offset / 2, s->ops[j].bytes / 2};
            }
    }
    qsort(fw, (size_t)n, sizeof *fw, cmp_erange);
    int rc = 0;
    for (int i = 0; i < P->micro_steps && !rc; i++) {
        const cp_step *s = &P->steps[i];
        if (s->kind != CP_OP_GEMM || s->phase == CP_PHASE_FWD) continue;
        for (int j = 0; j < s->nops && !rc; j++) {
            const cp_operand *o = &s->ops[j];
            cp_cat c = P->bufs[o->buf].cat;
            if (!is_weights(c) && !is_grads(c)) continue;
            int64_t es = is_weights(c) ? 2 : 4;
            erange key = {o->offset / es, o->bytes / es};
            if (bsearch(&key, fw, (size_t)n, sizeof *fw, cmp_erange)) continue;
            char d[160];
            rc = cp_errf(err, errlen,
                       "plan bug: %s %s elements [%lld, %lld) of %s, which no forward GEMM read as weights: the "
                       "backward would use and train the wrong rows (in gen/plan.c, proj_backward's row0 counts "
                       "heads; its offsets need row0 * head_dim * hidden)",
                       step_desc(P, i, d, sizeof d), is_weights(c) ? "reads" : "accumulates into",
                       (long long)key.off, (long long)(key.off + key.len), P->bufs[o->buf].name);
        }
    }
    free(fw);
    return rc;
}

/* ---------------------------------------------------------------- cross-stream dependencies */

typedef struct {
    int space;
    int64_t lo, hi;
    bool w;
} prange;

static int step_ranges(const cp_exec *ex, int i, prange *r) {
    const cp_step *s = &ex->P->steps[i];
    int n = 0;
    for (int j = 0; j < s->nops; j++) {
        const cp_operand *o = &s->ops[j];
        const cp_buffer *b = &ex->P->bufs[o->buf];
        if (o->bytes <= 0) continue;
        r[n++] = (prange){.space = b->space, .lo = b->offset + o->offset, .hi = b->offset + o->offset + o->bytes,
                          .w = (o->access & CP_WRITE) != 0};
        /* a layout kernel's token-layout operand is a stage's columns of every row: strided over the buffer */
        if (s->module >= 0 && !strcmp(ex->P->modules[s->module].family, "ulysses")) {
            r[n - 1].lo = b->offset;
            r[n - 1].hi = b->offset + b->bytes;
        }
    }
    return n;
}

static bool conflict(const prange *a, int na, const prange *b, int nb) {
    for (int i = 0; i < na; i++)
        for (int j = 0; j < nb; j++)
            if (a[i].space == b[j].space && a[i].lo < b[j].hi && b[j].lo < a[i].hi && (a[i].w || b[j].w)) return true;
    return false;
}

/* For the steps [from, to): each step waits for the latest conflicting step of every other stream, unless it (or
 * an earlier step of its stream) already waited for that one or a later one. */
static void build_deps(cp_exec *ex, int from, int to) {
    int synced[CP_STREAM_COUNT][CP_STREAM_COUNT];
    for (int a = 0; a < CP_STREAM_COUNT; a++)
        for (int b = 0; b < CP_STREAM_COUNT; b++) synced[a][b] = from - 1;
    int *bystream[CP_STREAM_COUNT], nby[CP_STREAM_COUNT] = {0};
    /* sv[i - from]: how far step i's stream had waited for each stream once step i was issued */
    int (*sv)[CP_STREAM_COUNT] = cp_xmalloc(sizeof *sv * (size_t)(to - from + 1));
    for (int s = 0; s < CP_STREAM_COUNT; s++) bystream[s] = cp_xmalloc(sizeof(int) * (size_t)(to - from + 1));
    prange ri[CP_MAX_OPERANDS + 2], rj[CP_MAX_OPERANDS + 2];
    for (int i = from; i < to; i++) {
        xstep *x = &ex->x[i];
        int X = x->stream;
        ex->stream_used[X] = true;
        int ni = step_ranges(ex, i, ri);
        x->wait0 = ex->nwaits;
        for (int Y = 0; Y < CP_STREAM_COUNT; Y++) {
            if (Y == X) continue;
            for (int q = nby[Y] - 1; q >= 0 && bystream[Y][q] > synced[X][Y]; q--) {
                int j = bystream[Y][q];
                int nj = step_ranges(ex, j, rj);
                if (!conflict(ri, ni, rj, nj)) continue;
                if (ex->x[j].event < 0) {
                    ex->event_step = cp_xrealloc(ex->event_step, sizeof(int) * (size_t)(ex->nevents + 1));
                    ex->event_step[ex->nevents] = j;
                    ex->x[j].event = ex->nevents++;
                }
                ex->waits = cp_xrealloc(ex->waits, sizeof(int) * (size_t)(ex->nwaits + 1));
                ex->waits[ex->nwaits++] = ex->x[j].event;
                synced[X][Y] = j;
                /* what step j had waited for (on its stream, when it was issued), X now follows too */
                for (int Z = 0; Z < CP_STREAM_COUNT; Z++)
                    if (Z != X && sv[j - from][Z] > synced[X][Z]) synced[X][Z] = sv[j - from][Z];
                break;
            }
        }
        x->nwait = ex->nwaits - x->wait0;
        bystream[X][nby[X]++] = i;
        for (int Z = 0; Z < CP_STREAM_COUNT; Z++) sv[i - from][Z] = Z == X ? i : synced[X][Z];
    }
    for (int s = 0; s < CP_STREAM_COUNT; s++) free(bystream[s]);
    free(sv);
}

/* ---------------------------------------------------------------- progress markers */

static void build_markers(cp_exec *ex) {
    const cp_plan *P = ex->P;
    ex->markers = cp_xcalloc((size_t)P->micro_steps + 1, sizeof *ex->markers);
    double t = 0;
    int prev_layer = -3, prev_phase = -1;
    for (int i = 0; i < P->micro_steps; i++) {
        const cp_step *s = &P->steps[i];
        if (s->layer != prev_layer || (int)s->phase != prev_phase) {
            marker *m = &ex->markers[ex->nmarkers++];
            m->step = i;
            m->before = t;
            const char *ph = s->phase == CP_PHASE_RECOMPUTE ? "bwd" : cp_phase_name(s->phase);
            if (s->layer >= 0)
                snprintf(m->label, sizeof m->label, "%s layer %d of %lld", ph, s->layer + 1, (long long)P->spec.model.layers);
            else
                snprintf(m->label, sizeof m->label, "%s", i == 0 ? "embedding" : s->phase == CP_PHASE_FWD ? "LM head and loss" : "embedding bwd");
            ex->x[i].marker = ex->nmarkers - 1;
            prev_layer = s->layer;
            prev_phase = (int)s->phase;
        }
        t += s->seconds;
    }
    ex->t_micro = t;
    ex->t_optim = 0;
    for (int i = P->micro_steps; i < P->nsteps; i++) ex->t_optim += P->steps[i].seconds;
}

/* ---------------------------------------------------------------- create */

static int load_modules(cp_exec *ex, char *err, int errlen) {
    const cp_plan *P = ex->P;
    int n = P->nmodules;
    cp_module_src *src = cp_xcalloc((size_t)n, sizeof *src);
    cp_jit_module *jm = cp_xcalloc((size_t)n, sizeof *jm);
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = cp_emit(&P->modules[i], &src[i], err, errlen);
    cp_jit_opts jo;
    memset(&jo, 0, sizeof jo);
    snprintf(jo.arch, sizeof jo.arch, "%s", ex->o.arch);
    jo.no_cache = ex->o.no_cache;
    double t0 = cp_now();
    if (!rc) rc = cp_jit_compile(src, n, &jo, jm, err, errlen);
    ex->info.compile_seconds = cp_now() - t0;
    if (!rc) {
        ex->mods = cp_xcalloc((size_t)n, sizeof *ex->mods);
        ex->nmods = n;
        int cached = 0;
        for (int i = 0; i < n && !rc; i++) {
            rc = cp_module_load(&ex->mods[i], jm[i].name, jm[i].cubin, jm[i].cubin_len, err, errlen);
            cached += jm[i].from_cache;
        }
        if (ex->o.out && !rc)
            fprintf(ex->o.out, "kernels: %d modules for %s in %.2f s (%d from the cache)\n", n, jo.arch,
                    ex->info.compile_seconds, cached);
        for (int i = 0; i < n; i++) cp_jit_module_free(&jm[i]);
    }
    for (int i = 0; i < n; i++) cp_module_src_free(&src[i]);
    free(src);
    free(jm);
    return rc;
}

/* Everything of cp_exec_create after the checks; on failure the caller destroys the partial executor. */
static int setup(cp_exec *ex, char *err, int errlen) {
    const cp_plan *P = ex->P;
    double t_start = cp_now();
    /* memory in use before this process's context: NVML needs none, so ask it first */
    char bus[64] = "";
    CK(cudaDeviceGetPCIBusId(bus, sizeof bus, ex->dev), "reading the GPU's PCI bus id");
    /* a rank of several GPUs has its context (and NCCL's buffers) already: the caller measured before them; a later
     * executor of the same process (tests run several) finds its context made, so the first one's reading stands */
    static int64_t first_base_free[64];
    int64_t *first = ex->dev >= 0 && ex->dev < 64 ? &first_base_free[ex->dev] : NULL;
    ex->base_free_nvml = ex->o.base_free > 0 ? ex->o.base_free : first && *first > 0 ? *first : nvml_free(bus);
    if (first && *first <= 0 && ex->base_free_nvml > 0) *first = ex->base_free_nvml;
    char sel[64];
    snprintf(sel, sizeof sel, "selecting GPU %d", ex->dev);
    CK(cudaSetDevice(ex->dev), sel);
    CK(cudaFree(0), "creating the CUDA context");
    ex->ctx_free_nvml = nvml_free(bus);
    ex->ctx_free_cuda = cuda_free_now();
    ex->nvml = ex->base_free_nvml >= 0 && ex->ctx_free_nvml >= 0;
    ex->info.nvml = ex->nvml;
    ex->info.mem_context = ex->nvml ? ex->base_free_nvml - ex->ctx_free_nvml : 0;
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, ex->dev), "reading the GPU's properties");
    ex->info.sms = prop.multiProcessorCount;
    snprintf(ex->info.device, sizeof ex->info.device, "%s", prop.name);
    if (!ex->o.arch[0] && cp_device_arch(ex->dev, ex->o.arch, sizeof ex->o.arch))
        return cp_errf(err, errlen, "%s", ex->o.arch);
    /* a plan made for more memory than this GPU has is refused here, before any host memory is pinned: what the
     * plan gives the GPU beyond what is used now (the context, and NCCL's first buffers on a rank) must be free */
    ex->info.mem_total = (int64_t)prop.totalGlobalMem;
    int64_t need = ex->nvml ? P->gpu_peak - ex->info.mem_context : P->gpu_arena, gfree = ex->ctx_free_cuda;
    if (gfree >= 0 && need > gfree) {
        char a[32], b[32], c[32], d[32], e[32];
        return cp_errf(err, errlen, "GPU %d (%s) has %s free of %s once the CUDA context exists; the plan needs %s "
                       "more (its peak %s, planned for machine.gpu_mem = %s): plan for this GPU with --gpu-mem %lldM, "
                       "less what other processes hold, or stop the processes that hold its memory", ex->dev, prop.name,
                       cp_fmt_bytes(gfree, a, sizeof a), cp_fmt_bytes(ex->info.mem_total, b, sizeof b),
                       cp_fmt_bytes(need, c, sizeof c), cp_fmt_bytes(P->gpu_peak, d, sizeof d),
                       cp_fmt_bytes(P->spec.machine.gpu_mem, e, sizeof e), (long long)(ex->info.mem_total >> 20));
    }

    /* a measurement of communication's exposed time: the step without its collectives (wrong numbers, same work
     * otherwise) against the step with them */
    const char *skip = getenv("CPGEN_BENCH_SKIP_COMM");
    ex->skip_comm = P->C > 1 && skip && !strcmp(skip, "1");
    if (ex->skip_comm && ex->o.out)
        fprintf(ex->o.out, "CPGEN_BENCH_SKIP_COMM=1: collectives are replaced by copies of this rank's own blocks on "
                           "the GPU, but the step's 8-byte all-reduce, which keeps the ranks in step; losses and weights "
                           "are meaningless, step times are the step's without communication\n");
    const char *prof = getenv("CPGEN_PROFILE");
    if (prof && *prof) {
        char *end;
        long n = strtol(prof, &end, 10);
        if (*end || n < 0 || n > INT32_MAX)
            return cp_errf(err, errlen, "CPGEN_PROFILE=%s: give the number of the step to time (0: none)", prof);
        ex->prof_step = (int)n;
        if (n > 0 && !(ex->prof = cp_profile_create(P, err, errlen))) return -1;
    }
    /* pin the host arena on threads while the kernels compile */
    ex->rss_base = cp_proc_status_bytes("VmRSS");
    host_pieces(ex);
    pthread_t *th = cp_xcalloc((size_t)(ex->npieces ? ex->npieces : 1), sizeof *th);
    double t_pin = cp_now();
    for (int i = 0; i < ex->npieces; i++)
        if (pthread_create(&th[i], NULL, pin_thread, &ex->pieces[i])) cp_fatal(CP_EXIT_FAIL, "pthread_create failed");
    int64_t before_mods = cuda_free_now();
    int rc = load_modules(ex, err, errlen);
    for (int i = 0; i < ex->npieces; i++) pthread_join(th[i], NULL);
    free(th);
    ex->info.pin_seconds = cp_now() - t_pin;
    ex->info.pin_pieces = ex->npieces;
    for (int i = 0; i < ex->npieces && !rc; i++) {
        hpiece *h = &ex->pieces[i];
        ex->info.host_pinned += h->end - h->start;
        if (h->e != cudaSuccess) {
            char what[128], a[32];
            snprintf(what, sizeof what, "pinning %s of host memory (piece %d of the host arena)",
                     cp_fmt_bytes(h->end - h->start, a, sizeof a), i);
            rc = cp_cuda_errmsg(h->e, what, err, errlen);
        }
    }
    if (rc) return -1;

    /* streams, the arena, cuBLASLt */
    for (int s = 0; s < CP_STREAM_COUNT; s++) {
        CK(cudaStreamCreateWithFlags(&ex->streams[s], cudaStreamNonBlocking), "creating a stream");
        CK(cudaEventCreateWithFlags(&ex->join_ev[s], cudaEventDisableTiming), "creating an event");
    }
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 2; k++) CK(cudaEventCreateWithFlags(&ex->ring_ev[d][k], cudaEventDisableTiming), "creating an event");
    int64_t f0 = cuda_free_now();
    cudaError_t e = cudaMalloc((void **)&ex->gpu, (size_t)(P->gpu_arena ? P->gpu_arena : 1));
    if (e != cudaSuccess) {
        char what[128], a[32];
        snprintf(what, sizeof what, "allocating the GPU arena of %s", cp_fmt_bytes(P->gpu_arena, a, sizeof a));
        return cp_cuda_errmsg(e, what, err, errlen);
    }
    ex->info.mem_arena = f0 - cuda_free_now();
    for (int i = 0; i < P->nbufs; i++) {
        const cp_buffer *b = &P->bufs[i];
        if (b->bytes <= 0 || b->offset < 0) continue;
        ex->bufptr[i] = b->space == CP_SPACE_GPU ? (void *)(ex->gpu + b->offset) : host_addr(ex, b->offset);
    }
    void *ws = cp_exec_buffer(ex, "gemm_workspace");
    ex->loss_sum = cp_exec_buffer(ex, "loss_sum");
    if (!ws || !ex->loss_sum) return cp_errf(err, errlen, "the plan has no gemm_workspace or loss_sum buffer");
    if (P->bufs[buf_index(ex, "loss_sum")].bytes < CP_SCALARS_BYTES)
        return cp_errf(err, errlen, "the plan's loss_sum buffer is smaller than the %d bytes of the step's scalars",
                       CP_SCALARS_BYTES);
    if (cp_gemm_lib_create(&ex->gemm, ws, CP_GEMM_WORKSPACE, err, errlen)) return -1;
    int mb = P->spec.train.micro_batches;
    CK(cudaHostAlloc((void **)&ex->staging, sizeof(int32_t) * 3 * (size_t)P->T * (size_t)mb, cudaHostAllocDefault),
       "pinning the token staging buffer");
    ex->sort_count = cp_xcalloc((size_t)P->spec.model.vocab + 1, sizeof *ex->sort_count);
    CK(cudaHostAlloc((void **)&ex->host_scalars, 64, cudaHostAllocDefault), "pinning the loss read-back");

    /* every step's launch, GEMM entry, copy; then the waits between streams and the progress markers */
    for (int i = 0; i < P->nsteps; i++)
        if (prep_step(ex, i, err, errlen)) return -1;
    if (check_weight_ranges(ex, err, errlen)) return -1;
    build_deps(ex, 0, P->micro_steps);
    build_deps(ex, P->micro_steps, P->nsteps);
    ex->info.cross_waits = ex->nwaits;
    ex->info.events = ex->nevents;
    ex->events = cp_xcalloc((size_t)(ex->nevents ? ex->nevents : 1), sizeof *ex->events);
    for (int i = 0; i < ex->nevents; i++)
        CK(cudaEventCreateWithFlags(&ex->events[i], cudaEventDisableTiming), "creating an event");
    build_markers(ex);
    ex->marker_ev = cp_xcalloc((size_t)(ex->nmarkers * mb + 1), sizeof *ex->marker_ev);
    for (int i = 0; i < ex->nmarkers * mb; i++)
        CK(cudaEventCreateWithFlags(&ex->marker_ev[i], cudaEventDisableTiming), "creating an event");
    ex->nmarker_ev = ex->nmarkers * mb;
    ex->info.gemm_entries = cp_gemm_entries(ex->gemm);
    CK(cudaDeviceSynchronize(), "setting up the executor");
    ex->info.mem_modules = before_mods - cuda_free_now() - ex->info.mem_arena;
    ex->info.total_seconds = cp_now() - t_start;
    if (ex->o.out) {
        char a[32], b[32], c2[32], d[32], t[32];
        fprintf(ex->o.out, "device: %s, %d SMs, %s | memory: CUDA context %s, modules and cuBLASLt %s, arena %s (one "
                           "cudaMalloc of %lld bytes)\n",
                ex->info.device, ex->info.sms, cp_fmt_bytes(ex->info.mem_total, t, sizeof t),
                ex->nvml ? cp_fmt_bytes(ex->info.mem_context, a, sizeof a) : "? (no NVML)",
                cp_fmt_bytes(ex->info.mem_modules, b, sizeof b), cp_fmt_bytes(ex->info.mem_arena, c2, sizeof c2),
                (long long)P->gpu_arena);
        if (ex->npieces)
            fprintf(ex->o.out, "host: pinned %s in %d piece%s in %.2f s, overlapped with compilation\n",
                    cp_fmt_bytes(ex->info.host_pinned, d, sizeof d), ex->npieces, ex->npieces > 1 ? "s" : "",
                    ex->info.pin_seconds);
        fprintf(ex->o.out, "executor: %d steps, %d GEMM shapes, %d cross-stream waits; ready in %.2f s\n", P->nsteps,
                ex->info.gemm_entries, ex->nwaits, ex->info.total_seconds);
    }
    return 0;
}

int cp_exec_create(cp_exec **out, const cp_plan *P, const cp_exec_opts *o, char *err, int errlen) {
    *out = NULL;
    if (P->C > 1 && (!o || !o->comm || o->comm->size != P->C || o->rank != o->comm->rank))
        return cp_errf(err, errlen, "the plan has %d GPUs: each needs its own process with a communicator of all %d "
                       "(`cpgen run` starts them; under mpirun or srun, start one process per GPU)", P->C, P->C);
    cp_exec *ex = cp_xcalloc(1, sizeof *ex);
    ex->P = P;
    if (o) ex->o = *o;
    ex->dev = ex->o.device;
    ex->bufptr = cp_xcalloc((size_t)(P->nbufs ? P->nbufs : 1), sizeof *ex->bufptr);
    ex->x = cp_xcalloc((size_t)(P->nsteps ? P->nsteps : 1), sizeof *ex->x);
    if (setup(ex, err, errlen)) {
        cp_exec_destroy(ex);
        return -1;
    }
    *out = ex;
    return 0;
}

void cp_exec_destroy(cp_exec *ex) {
    if (!ex) return;
    if (ex->dry) {
        ex->gpu = NULL;
        for (int i = 0; i < ex->npieces; i++) ex->pieces[i].p = NULL;
    } else {
        (void)cudaDeviceSynchronize();
    }
    cp_gemm_lib_destroy(ex->gemm);
    for (int i = 0; i < ex->nevents && ex->events; i++) (void)cudaEventDestroy(ex->events[i]);
    for (int i = 0; i < ex->nmarker_ev; i++) (void)cudaEventDestroy(ex->marker_ev[i]);
    cp_profile_free(ex->prof);
    for (int s = 0; s < CP_STREAM_COUNT; s++) {
        if (ex->streams[s]) (void)cudaStreamDestroy(ex->streams[s]);
        if (ex->join_ev[s]) (void)cudaEventDestroy(ex->join_ev[s]);
    }
    for (int d = 0; d < 2; d++)
        for (int k = 0; k < 2; k++)
            if (ex->ring_ev[d][k]) (void)cudaEventDestroy(ex->ring_ev[d][k]);
    for (int i = 0; i < ex->nmods; i++) cp_module_unload(&ex->mods[i]);
    if (ex->gpu) (void)cudaFree(ex->gpu);
    for (int i = 0; i < ex->npieces; i++)
        if (ex->pieces[i].p) (void)cudaFreeHost(ex->pieces[i].p);
    if (ex->staging) (void)cudaFreeHost(ex->staging);
    free(ex->sort_count);
    if (ex->host_scalars) (void)cudaFreeHost(ex->host_scalars);
    free(ex->pieces);
    free(ex->mods);
    free(ex->bufptr);
    free(ex->x);
    free(ex->events);
    free(ex->waits);
    free(ex->event_step);
    free(ex->markers);
    free(ex->marker_ev);
    free(ex);
}

const cp_exec_startup *cp_exec_startup_info(const cp_exec *ex) { return &ex->info; }
int cp_exec_updates(const cp_exec *ex) { return ex->updates; }

void *cp_exec_buffer(const cp_exec *ex, const char *name) {
    for (int i = 0; i < ex->P->nbufs; i++)
        if (!strcmp(ex->P->bufs[i].name, name)) return ex->bufptr[i];
    return NULL;
}

static int buf_index(const cp_exec *ex, const char *name) {
    for (int i = 0; i < ex->P->nbufs; i++)
        if (!strcmp(ex->P->bufs[i].name, name)) return i;
    return -1;
}

/* ---------------------------------------------------------------- weights */

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Copy n bytes from src into buffer `name` (device or host) at byte offset off. */
static int put(cp_exec *ex, const char *name, size_t off, const void *src, size_t n, char *err, int errlen) {
    int b = buf_index(ex, name);
    if (b < 0) return cp_errf(err, errlen, "the plan has no buffer %s", name);
    char *dst = (char *)ex->bufptr[b] + off;
    if (ex->P->bufs[b].space == CP_SPACE_HOST) memcpy(dst, src, n);
    else CK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), "uploading the weights");
    return 0;
}

static int zero_buf(cp_exec *ex, const char *name, char *err, int errlen) {
    int b = buf_index(ex, name);
    if (b < 0) return 0;
    size_t n = (size_t)ex->P->bufs[b].bytes;
    if (ex->P->bufs[b].space == CP_SPACE_HOST) memset(ex->bufptr[b], 0, n);
    else CK(cudaMemset(ex->bufptr[b], 0, n), "zeroing the optimizer state");
    return 0;
}

/* This rank's shard of the full flat model (cp_weights_shard), or NULL with one GPU, where the shard is the model. */
static float *rank_shard(const cp_exec *ex, const float *flat) {
    if (ex->P->C == 1) return NULL;
    float *sh = cp_xmalloc(sizeof(float) * (size_t)ex->P->params_shard);
    cp_weights_shard(ex->P, ex->o.rank, flat, sh);
    return sh;
}

/* Wait for a stream; with several GPUs through the communicator's watchdog, so that a rank that failed or hangs
 * stops this one with a message instead of a wait forever. */
static int sync_stream(cp_exec *ex, cudaStream_t st, const char *what, char *err, int errlen) {
    /* a wait may span a whole step: the communicator's deadline plus four times the step the plan predicts, so a
     * long step is not taken for a stuck peer */
    if (ex->o.comm)
        return cp_nccl_wait(ex->o.comm, st, NULL, what, ex->o.comm->timeout_s + 4 * ex->P->t_step, err, errlen);
    CK(cudaStreamSynchronize(st), what);
    return 0;
}

/* The full flat model from each rank's shard of the fp32 GPU buffer `name`: unit by unit, the shards are
 * all-gathered into a unit-gradient buffer, which holds nothing between steps, and copied out to flat; every rank
 * takes part, and a rank with flat NULL copies nothing (only rank 0 writes checkpoints). */
static int gather_full(cp_exec *ex, const char *name, float *flat, char *err, int errlen) {
    const cp_plan *P = ex->P;
    int b = buf_index(ex, name);
    if (b < 0 || P->bufs[b].space != CP_SPACE_GPU) return cp_errf(err, errlen, "the plan has no GPU buffer %s", name);
    int64_t most = 0;
    for (int u = 0; u < P->nunits; u++) most = CP_MAX(most, P->unit_padded[u]);
    int stage = -1;
    for (int i = 0; i < P->nbufs; i++)
        if (P->bufs[i].cat == CP_CAT_UNIT_GRADS && P->bufs[i].space == CP_SPACE_GPU && P->bufs[i].bytes >= most * 4 &&
            (stage < 0 || P->bufs[i].bytes < P->bufs[stage].bytes))
            stage = i;
    if (stage < 0) return cp_errf(err, errlen, "no unit-gradient buffer holds the largest unit (%lld elements) to gather "
                                  "%s through", (long long)most, name);
    cudaStream_t st = ex->streams[CP_STREAM_COMPUTE];
    CK(cudaDeviceSynchronize(), "finishing the step before gathering the model");
    int64_t full = 0;
    for (int u = 0; u < P->nunits; u++) {
        int64_t part = P->unit_padded[u] / P->C;
        const float *src = (const float *)ex->bufptr[b] + P->unit_shard_off[u];
        if (cp_nccl_all_gather(ex->o.comm, src, ex->bufptr[stage], (size_t)part, ncclFloat32, st, err, errlen)) return -1;
        if (flat)
            CK(cudaMemcpyAsync(flat + full, ex->bufptr[stage], sizeof(float) * (size_t)P->unit_padded[u],
                               cudaMemcpyDeviceToHost, st), "copying a gathered unit to the host");
        if (sync_stream(ex, st, "gathering the model from every rank", err, errlen)) return -1;
        full += P->unit_padded[u];
    }
    return 0;
}

int cp_exec_load_weights(cp_exec *ex, const float *flat, char *err, int errlen) {
    float *sh = rank_shard(ex, flat);
    int rc = cp_exec_load_shard(ex, sh ? sh : flat, err, errlen);
    free(sh);
    return rc;
}

int cp_exec_load_shard(cp_exec *ex, const float *shard, char *err, int errlen) {
    int64_t n = ex->P->params_shard;
    int rc = put(ex, "master.f32", 0, shard, sizeof(float) * (size_t)n, err, errlen);
    /* the bf16 copy in pieces: the plan counts one fp32 model in host memory while loading, not a bf16 one too */
    enum { PIECE = 1 << 24 };
    uint16_t *bf = cp_xmalloc(sizeof(uint16_t) * (size_t)CP_MIN(n, PIECE));
    for (int64_t at = 0; at < n && !rc; at += PIECE) {
        int64_t k = CP_MIN(PIECE, n - at);
        for (int64_t i = 0; i < k; i++) bf[i] = to_bf16(shard[at + i]);
        rc = put(ex, "params.bf16", sizeof(uint16_t) * (size_t)at, bf, sizeof(uint16_t) * (size_t)k, err, errlen);
    }
    free(bf);
    if (!rc) rc = zero_buf(ex, "adam_m.f32", err, errlen);
    if (!rc) rc = zero_buf(ex, "adam_v.f32", err, errlen);
    if (!rc) rc = zero_buf(ex, "grads.f32", err, errlen);
    if (!rc) CK(cudaDeviceSynchronize(), "uploading the weights");
    ex->updates = 0;
    return rc;
}

bool cp_exec_host_state(cp_exec *ex, const float **master, const float **m, const float **v) {
    const cp_plan *P = ex->P;
    int b = buf_index(ex, "master.f32");
    if (P->C != 1 || b < 0 || P->bufs[b].space != CP_SPACE_HOST) return false;
    if (cudaDeviceSynchronize() != cudaSuccess) return false; /* the last update is done; an error shows later */
    *master = cp_exec_buffer(ex, "master.f32");
    *m = cp_exec_buffer(ex, "adam_m.f32");
    *v = cp_exec_buffer(ex, "adam_v.f32");
    return *master && *m && *v;
}

int cp_exec_read_weights(cp_exec *ex, float *flat, char *err, int errlen) {
    if (ex->P->C > 1) return gather_full(ex, "master.f32", flat, err, errlen);
    int b = buf_index(ex, "master.f32");
    if (b < 0) return cp_errf(err, errlen, "the plan has no master.f32");
    size_t n = sizeof(float) * (size_t)ex->P->params_shard;
    CK(cudaDeviceSynchronize(), "finishing the step before reading the weights");
    if (ex->P->bufs[b].space == CP_SPACE_HOST) memcpy(flat, ex->bufptr[b], n);
    else CK(cudaMemcpy(flat, ex->bufptr[b], n, cudaMemcpyDeviceToHost), "reading the master weights");
    return 0;
}

/* Copy buffer `name` (device or host) into dst, n bytes. */
static int get(cp_exec *ex, const char *name, void *dst, size_t n, char *err, int errlen) {
    int b = buf_index(ex, name);
    if (b < 0) return cp_errf(err, errlen, "the plan has no buffer %s", name);
    if (ex->P->bufs[b].space == CP_SPACE_HOST) memcpy(dst, ex->bufptr[b], n);
    else CK(cudaMemcpy(dst, ex->bufptr[b], n, cudaMemcpyDeviceToHost), "reading the optimizer state");
    return 0;
}

int cp_exec_read_optimizer(cp_exec *ex, float *m, float *v, int *updates, char *err, int errlen) {
    size_t n = sizeof(float) * (size_t)ex->P->params_shard;
    CK(cudaDeviceSynchronize(), "finishing the step before reading the optimizer state");
    int rc = 0;
    if (ex->P->C > 1) { /* both moments, on every rank alike: the gathers are collectives */
        rc = gather_full(ex, "adam_m.f32", m, err, errlen);
        if (!rc) rc = gather_full(ex, "adam_v.f32", v, err, errlen);
        if (!rc && updates) *updates = ex->updates;
        return rc;
    }
    if (m) rc = get(ex, "adam_m.f32", m, n, err, errlen);
    if (!rc && v) rc = get(ex, "adam_v.f32", v, n, err, errlen);
    if (!rc && updates) *updates = ex->updates;
    return rc;
}

int cp_exec_load_optimizer(cp_exec *ex, const float *m, const float *v, int updates, char *err, int errlen) {
    if (updates < 0) return cp_errf(err, errlen, "loading the optimizer state: %d updates (must be >= 0)", updates);
    size_t n = sizeof(float) * (size_t)ex->P->params_shard;
    float *ms = m ? rank_shard(ex, m) : NULL, *vs = v ? rank_shard(ex, v) : NULL;
    int rc = 0;
    if (m) rc = put(ex, "adam_m.f32", 0, ms ? ms : m, n, err, errlen);
    if (!rc && v) rc = put(ex, "adam_v.f32", 0, vs ? vs : v, n, err, errlen);
    free(ms);
    free(vs);
    if (!rc) CK(cudaDeviceSynchronize(), "uploading the optimizer state");
    /* the next update is number updates + 1, as in the run that saved them (cp_exec_step: ++updates) */
    if (!rc) ex->updates = ex->sc.adam_step = updates;
    return rc;
}

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
        h->out[i] = to_bf16(w);
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
static int host_update(cp_exec *ex, int i, char *err, int errlen) {
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

/* ---------------------------------------------------------------- running */

typedef struct {
    cp_exec *ex;
    const char *label;
    atomic_int recorded; /* marker events recorded so far */
    atomic_bool done;
    double t0;
} progress;

static void *progress_thread(void *arg) {
    progress *p = arg;
    cp_exec *ex = p->ex;
    int mb = ex->P->spec.train.micro_batches, seen = -1;
    double next = p->t0 + PROGRESS_AFTER, total = ex->t_micro * mb + ex->t_optim, t_seen = p->t0;
    (void)cudaSetDevice(ex->dev);
    while (!atomic_load(&p->done)) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        int rec = atomic_load(&p->recorded), before = seen;
        while (seen + 1 < rec && cudaEventQuery(ex->marker_ev[seen + 1]) == cudaSuccess) seen++;
        double now = cp_now();
        if (seen != before) t_seen = now;
        if (now < next || seen < 0) continue;
        next = now + 5.0;
        int m = seen % ex->nmarkers, b = seen / ex->nmarkers;
        double frac = total > 0 ? (b * ex->t_micro + ex->markers[m].before) / total : 0;
        double el = now - p->t0;
        char eta[48] = "", mbs[48] = "";
        /* the rate is the one up to the last marker reached; time since then is already spent on what remains, so the
         * estimate does not grow while a long layer runs */
        if (frac > 0.02)
            snprintf(eta, sizeof eta, " | ETA %.0f s",
                     CP_MAX(0.0, (t_seen - p->t0) * (1 - frac) / frac - (now - t_seen)));
        if (mb > 1) snprintf(mbs, sizeof mbs, " | micro-batch %d of %d", b + 1, mb);
        fprintf(stderr, "  %s | %s%s | %.0f s elapsed, ~%.0f%% of the predicted work done%s\n", p->label,
                ex->markers[m].label, mbs, el, 100 * frac, eta);
    }
    return NULL;
}

static int join_streams(cp_exec *ex, char *err, int errlen) {
    for (int s = 0; s < CP_STREAM_COUNT; s++) {
        if (s == CP_STREAM_COMPUTE || !ex->stream_used[s]) continue;
        CK(cudaEventRecord(ex->join_ev[s], ex->streams[s]), "joining streams");
        CK(cudaStreamWaitEvent(ex->streams[CP_STREAM_COMPUTE], ex->join_ev[s], 0), "joining streams");
    }
    CK(cudaEventRecord(ex->join_ev[CP_STREAM_COMPUTE], ex->streams[CP_STREAM_COMPUTE]), "joining streams");
    for (int s = 0; s < CP_STREAM_COUNT; s++)
        if (s != CP_STREAM_COMPUTE && ex->stream_used[s])
            CK(cudaStreamWaitEvent(ex->streams[s], ex->join_ev[CP_STREAM_COMPUTE], 0), "joining streams");
    return 0;
}

static int run_step(cp_exec *ex, int i, int mb, progress *pr, char *err, int errlen) {
    const xstep *x = &ex->x[i];
    cudaStream_t st = ex->streams[x->stream];
    cudaError_t e = cudaSuccess;
    char d[160], what[200];
    if (x->marker >= 0 && pr) {
        e = cudaEventRecord(ex->marker_ev[mb * ex->nmarkers + x->marker], ex->streams[CP_STREAM_COMPUTE]);
        if (e == cudaSuccess) atomic_fetch_add(&pr->recorded, 1);
    }
    for (int w = 0; w < x->nwait && e == cudaSuccess; w++) e = cudaStreamWaitEvent(st, ex->events[ex->waits[x->wait0 + w]], 0);
    bool timed = ex->profiling && mb == 0;
    if (timed && e == cudaSuccess) e = cp_profile_begin(ex->prof, i, st);
    if (e == cudaSuccess) switch (x->kind) {
        case X_KERNEL:
            for (int k = 0; k < x->nl && e == cudaSuccess; k++) e = cp_launch(x->L[k].k, &x->L[k].d, (void **)x->L[k].args, st);
            break;
        case X_GEMM:
            if (cp_gemm_launch(ex->gemm, x->gemm, x->ga, x->gb, x->gc, x->gd, st, err, errlen)) {
                char m[1024];
                snprintf(m, sizeof m, "%s", err);
                return cp_errf(err, errlen, "%s: %s", step_desc(ex->P, i, d, sizeof d), m);
            }
            break;
        case X_MEMSET: e = cudaMemsetAsync(x->dst, 0, x->bytes, st); break;
        case X_COPY: {
            e = cudaMemcpyAsync(x->dst, x->src, x->bytes, cudaMemcpyDefault, st);
            break;
        }
        case X_HOST_ADAMW:
            if (host_update(ex, i, err, errlen)) return -1;
            break;
        case X_COLL:
            if (ex->skip_comm && ex->P->steps[i].kind != CP_OP_ALLREDUCE) {
                e = local_stand_in(ex, i, st);
                break;
            }
            if (run_collective(ex, i, st, err, errlen)) {
                char m[CP_ERR_MAX];
                snprintf(m, sizeof m, "%s", err);
                return cp_errf(err, errlen, "rank %d, %s: %s", ex->o.rank, step_desc(ex->P, i, d, sizeof d), m);
            }
            break;
        case X_LOAD_TOKENS: {
            const cp_step *s = &ex->P->steps[i];
            size_t tb = sizeof(int32_t) * (size_t)ex->P->T;
            const int32_t *src = ex->staging + (size_t)mb * 3 * (size_t)ex->P->T;
            for (int j = 0; j < 3 && e == cudaSuccess; j++) /* tokens, targets, token_order */
                e = cudaMemcpyAsync((char *)ex->bufptr[s->ops[j].buf] + s->ops[j].offset, src + j * ex->P->T, tb,
                                    cudaMemcpyHostToDevice, st);
            break;
        }
        default: break;
        }
    if (timed && e == cudaSuccess) e = cp_profile_end(ex->prof, i, st);
    if (e == cudaSuccess && x->event >= 0) e = cudaEventRecord(ex->events[x->event], st);
    if (e != cudaSuccess) {
        snprintf(what, sizeof what, "%s", step_desc(ex->P, i, d, sizeof d));
        return cp_cuda_errmsg(e, what, err, errlen);
    }
    return 0;
}

/* One sync: the loss sum and the gradient's sum of squares. */
static int read_scalars(cp_exec *ex, char *err, int errlen) {
    cudaStream_t st = ex->streams[CP_STREAM_COMPUTE];
    /* the all-reduce of the two sums runs on the communication stream; the read is not a plan step, so no event
     * orders it after that */
    if (ex->o.comm && sync_stream(ex, ex->streams[CP_STREAM_COMM], "summing the loss across the ranks", err, errlen))
        return -1;
    CK(cudaMemcpyAsync(ex->host_scalars, ex->loss_sum, 2 * sizeof(float), cudaMemcpyDeviceToHost, st),
       "reading the loss");
    return sync_stream(ex, st, "running the micro-batches (a kernel failed; rerun with CUDA_LAUNCH_BLOCKING=1 to "
                               "find which)", err, errlen);
}

/* The rows of one micro-batch's tokens (all in [0, V)) sorted by token, stably: a counting sort, O(T + V). */
static void sort_tokens(const int32_t *tok, int64_t T, int64_t V, int32_t *count, int32_t *order) {
    memset(count, 0, sizeof *count * (size_t)(V + 1));
    for (int64_t t = 0; t < T; t++) count[tok[t] + 1]++;
    for (int64_t v = 0; v < V; v++) count[v + 1] += count[v];
    for (int64_t t = 0; t < T; t++) order[count[tok[t]]++] = (int32_t)t;
}

/* Tokens and targets into the pinned staging (checked against the vocabulary), each micro-batch's rows sorted by
 * token for the embedding's backward, and the loss's divisor: the step's target tokens, over all ranks with several
 * GPUs (targets_all, from the caller: each rank sees only its slice). Returns that count, or -1. */
static int64_t stage_inputs(cp_exec *ex, const int32_t *tokens, const int32_t *targets, int64_t targets_all, char *err,
                            int errlen) {
    const cp_plan *P = ex->P;
    int mb = P->spec.train.micro_batches;
    int64_t T = P->T, V = P->spec.model.vocab, ntgt = 0;
    for (int b = 0; b < mb; b++)
        for (int64_t t = 0; t < T; t++) {
            int32_t tok = tokens[b * T + t], tg = targets[b * T + t];
            if (tok < 0 || tok >= V)
                return cp_errf(err, errlen, "token %d at position %lld of micro-batch %d is outside the vocabulary "
                             "[0, %lld): the data does not match model.vocab", tok, (long long)t, b, (long long)V);
            if (tg >= V)
                return cp_errf(err, errlen, "target %d at position %lld of micro-batch %d is outside the vocabulary "
                             "[0, %lld)", tg, (long long)t, b, (long long)V);
            ntgt += tg >= 0;
            ex->staging[(size_t)b * 3 * T + t] = tok;
            ex->staging[(size_t)b * 3 * T + T + t] = tg;
        }
    for (int b = 0; b < mb; b++) {
        int32_t *st = ex->staging + (size_t)b * 3 * T;
        sort_tokens(st, T, V, ex->sort_count, st + 2 * T);
    }
    if (P->C > 1) {
        if (targets_all < ntgt)
            return cp_errf(err, errlen, "rank %d: the step's target count over all ranks (%lld) is below this rank's "
                           "(%lld): the caller must count the targets of every rank's slice", ex->o.rank,
                           (long long)targets_all, (long long)ntgt);
        ntgt = targets_all;
    }
    ex->sc.loss_scale = ntgt ? (float)(1.0 / (double)ntgt) : 0.f;
    return ntgt;
}

int cp_exec_gradients(cp_exec *ex, const int32_t *tokens, const int32_t *targets, int64_t targets_all, double *loss,
                      char *err, int errlen) {
    const cp_plan *P = ex->P;
    if (stage_inputs(ex, tokens, targets, targets_all, err, errlen) < 0) return -1;
    CK(cudaMemsetAsync(ex->loss_sum, 0, CP_SCALARS_BYTES, ex->streams[CP_STREAM_COMPUTE]), "zeroing the loss");
    int rc = 0;
    for (int b = 0; b < P->spec.train.micro_batches && !rc; b++) {
        rc = join_streams(ex, err, errlen);
        for (int i = 0; i < P->micro_steps && !rc; i++) rc = run_step(ex, i, b, NULL, err, errlen);
    }
    if (!rc) rc = join_streams(ex, err, errlen);
    /* the optimizer's all-reduce of the loss does not run here: sum it across the ranks now */
    if (!rc && ex->o.comm)
        rc = cp_nccl_all_reduce(ex->o.comm, ex->loss_sum, ex->loss_sum, 1, ncclFloat32, ncclSum,
                                ex->streams[CP_STREAM_COMPUTE], err, errlen);
    if (!rc) rc = read_scalars(ex, err, errlen);
    if (!rc) CK(cudaDeviceSynchronize(), "finishing the backward");
    if (!rc) *loss = (double)ex->host_scalars[0] * ex->sc.loss_scale;
    return rc;
}

int cp_exec_read_grads(cp_exec *ex, float *flat, bool zero, char *err, int errlen) {
    void *g = cp_exec_buffer(ex, "grads.f32");
    if (!g) return cp_errf(err, errlen, "the plan has no grads.f32");
    size_t n = sizeof(float) * (size_t)ex->P->params_shard;
    CK(cudaDeviceSynchronize(), "finishing the step before reading the gradients");
    if (ex->P->C > 1) {
        if (gather_full(ex, "grads.f32", flat, err, errlen)) return -1;
    } else {
        CK(cudaMemcpy(flat, g, n, cudaMemcpyDeviceToHost), "reading the gradients");
    }
    if (zero) CK(cudaMemset(g, 0, n), "zeroing the gradients");
    return 0;
}

int cp_exec_step(cp_exec *ex, const int32_t *tokens, const int32_t *targets, const cp_optim_hp *hp, const char *label,
                 cp_step_result *r, char *err, int errlen) {
    const cp_plan *P = ex->P;
    int mb = P->spec.train.micro_batches;
    memset(r, 0, sizeof *r);
    double t0 = cp_now();
    int64_t ntgt = stage_inputs(ex, tokens, targets, hp->targets_all, err, errlen);
    if (ntgt < 0) return -1;
    r->targets = ntgt;
    ex->sc.lr = (float)hp->lr;
    ex->sc.beta1 = (float)hp->beta1;
    ex->sc.beta2 = (float)hp->beta2;
    ex->sc.eps = (float)hp->eps;
    ex->sc.wd = (float)hp->weight_decay;
    cudaStream_t cs = ex->streams[CP_STREAM_COMPUTE];
    CK(cudaMemsetAsync(ex->loss_sum, 0, CP_SCALARS_BYTES, cs), "zeroing the loss");
    ex->profiling = ex->prof && ++ex->steps_run == ex->prof_step;

    double expect = ex->last_seconds > 0 ? ex->last_seconds : P->t_step * 3;
    progress pr = {.ex = ex, .label = label ? label : "step", .t0 = t0};
    atomic_init(&pr.recorded, 0);
    atomic_init(&pr.done, false);
    pthread_t pth;
    bool prog = expect > PROGRESS_AFTER && ex->nmarkers > 0 && ex->o.rank == 0 && /* one voice for all ranks */
                pthread_create(&pth, NULL, progress_thread, &pr) == 0;
    int rc = 0;
    for (int b = 0; b < mb && !rc; b++) {
        rc = join_streams(ex, err, errlen);
        for (int i = 0; i < P->micro_steps && !rc; i++) rc = run_step(ex, i, b, prog ? &pr : NULL, err, errlen);
    }
    if (!rc) rc = join_streams(ex, err, errlen);
    bool decided = false, skip = false;
    for (int i = P->micro_steps; i < P->nsteps && !rc; i++) {
        const xstep *x = &ex->x[i];
        if (!decided && (x->special == S_ADAMW || x->kind == X_HOST_ADAMW)) {
            rc = read_scalars(ex, err, errlen);
            if (rc) break;
            decided = true;
            r->loss = (double)ex->host_scalars[0] * ex->sc.loss_scale;
            r->norm = sqrt((double)ex->host_scalars[1]);
            skip = !isfinite(r->loss) || !isfinite(r->norm);
            r->clip_scale = hp->clip > 0 ? CP_MIN(1.0, hp->clip / (r->norm + 1e-6)) : 1.0;
            ex->sc.grad_scale = (float)r->clip_scale;
            if (!skip) ex->sc.adam_step = ++ex->updates;
        }
        if (skip && (x->special == S_ADAMW || x->kind == X_HOST_ADAMW)) continue;
        rc = run_step(ex, i, 0, NULL, err, errlen);
    }
    if (!rc && !decided) rc = read_scalars(ex, err, errlen);
    if (!rc) {
        for (int s = 0; s < CP_STREAM_COUNT && !rc; s++)
            if (ex->stream_used[s] || s == CP_STREAM_COMPUTE) rc = sync_stream(ex, ex->streams[s], "finishing the step", err, errlen);
    }
    if (prog) {
        atomic_store(&pr.done, true);
        pthread_join(pth, NULL);
    }
    if (rc) return -1;
    if (!decided) r->loss = (double)ex->host_scalars[0] * ex->sc.loss_scale;
    r->skipped = skip;
    r->seconds = cp_now() - t0;
    r->mem_used = cp_exec_mem_used(ex);
    r->host_used = cp_exec_host_used(ex);
    ex->last_seconds = r->seconds;
    if (ex->profiling && ex->o.out) return cp_profile_report(ex->prof, r->seconds, mb, ex->o.out, err, errlen);
    return 0;
}

/* ---------------------------------------------------------------- checking a plan without a GPU */

/* Every pair of steps on different streams that touch the same bytes (one of them writing) must be ordered by the
 * waits: a vector clock per step says the latest step of each stream it follows. */
static int verify_order(const cp_exec *ex, int from, int to, int64_t *pairs, char *err, int errlen) {
    int n = to - from;
    int (*hb)[CP_STREAM_COUNT] = cp_xmalloc(sizeof *hb * (size_t)(n + 1));
    int last[CP_STREAM_COUNT];
    for (int s = 0; s < CP_STREAM_COUNT; s++) last[s] = -1;
    prange ri[CP_MAX_OPERANDS + 2], rj[CP_MAX_OPERANDS + 2];
    int rc = 0;
    for (int i = from; i < to && !rc; i++) {
        const xstep *x = &ex->x[i];
        int X = x->stream;
        for (int s = 0; s < CP_STREAM_COUNT; s++) hb[i - from][s] = last[X] >= 0 ? hb[last[X] - from][s] : from - 1;
        for (int w = 0; w < x->nwait; w++) {
            int j = ex->event_step[ex->waits[x->wait0 + w]];
            for (int s = 0; s < CP_STREAM_COUNT; s++)
                if (hb[j - from][s] > hb[i - from][s]) hb[i - from][s] = hb[j - from][s];
        }
        hb[i - from][X] = i;
        last[X] = i;
        int ni = step_ranges(ex, i, ri);
        for (int j = from; j < i; j++) {
            int Y = ex->x[j].stream;
            if (Y == X) continue;
            int nj = step_ranges(ex, j, rj);
            if (!conflict(ri, ni, rj, nj)) continue;
            (*pairs)++;
            if (hb[i - from][Y] < j) {
                char a[160], b[160];
                rc = cp_errf(err, errlen, "%s may run before %s on another stream, and they touch the same bytes",
                           step_desc(ex->P, i, a, sizeof a), step_desc(ex->P, j, b, sizeof b));
            }
        }
    }
    free(hb);
    return rc;
}

int cp_exec_check(const cp_plan *P, cp_exec_check_report *rep, char *err, int errlen) {
    memset(rep, 0, sizeof *rep);
    cp_exec *ex = cp_xcalloc(1, sizeof *ex);
    ex->P = P;
    ex->dry = true;
    ex->info.sms = 132;
    ex->bufptr = cp_xcalloc((size_t)(P->nbufs ? P->nbufs : 1), sizeof *ex->bufptr);
    ex->x = cp_xcalloc((size_t)(P->nsteps ? P->nsteps : 1), sizeof *ex->x);
    /* made-up addresses with the arenas' alignment: 1 TiB for the GPU arena, 2 TiB for the host arena */
    ex->gpu = (char *)((uintptr_t)1 << 40);
    host_pieces(ex);
    for (int i = 0; i < ex->npieces; i++) ex->pieces[i].p = (char *)((uintptr_t)1 << 41) + ex->pieces[i].start;
    for (int i = 0; i < P->nbufs; i++) {
        const cp_buffer *b = &P->bufs[i];
        if (b->bytes <= 0 || b->offset < 0) continue;
        ex->bufptr[i] = b->space == CP_SPACE_GPU ? (void *)(ex->gpu + b->offset) : host_addr(ex, b->offset);
    }
    int rc = 0;
    for (int i = 0; i < P->nsteps && !rc; i++) rc = prep_step(ex, i, err, errlen);
    if (!rc) rc = check_weight_ranges(ex, err, errlen);
    if (!rc) {
        build_deps(ex, 0, P->micro_steps);
        build_deps(ex, P->micro_steps, P->nsteps);
        build_markers(ex);
        rc = verify_order(ex, 0, P->micro_steps, &rep->ordered_pairs, err, errlen);
        if (!rc) rc = verify_order(ex, P->micro_steps, P->nsteps, &rep->ordered_pairs, err, errlen);
    }
    for (int i = 0; i < P->nsteps; i++) {
        const xstep *x = &ex->x[i];
        rep->kernels += x->kind == X_KERNEL || x->kind == X_HOST_ADAMW;
        rep->launches += x->nl;
        rep->gemms += x->kind == X_GEMM;
        rep->copies += x->kind == X_COPY || x->kind == X_LOAD_TOKENS;
        rep->memsets += x->kind == X_MEMSET;
    }
    rep->steps = P->nsteps;
    rep->waits = ex->nwaits;
    rep->events = ex->nevents;
    rep->markers = ex->nmarkers;
    rep->pin_pieces = ex->npieces;
    cp_exec_destroy(ex);
    return rc;
}
