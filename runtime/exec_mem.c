/* exec_mem.c: the executor's memory: what the GPU and this process hold (NVML by dlopen, the CUDA runtime,
 * /proc/self/status), the pinned host arena cut into pieces pinned in parallel, and every buffer's address in the
 * two arenas. */
#include "exec_internal.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "util.h"

/* ---------------------------------------------------------------- memory measurement (NVML by dlopen) */

typedef struct {
    unsigned long long total, free, used;
} nvml_memory;

/* nvmlProcessInfo_v2_t and _v3_t (the same fields) */
typedef struct {
    unsigned int pid;
    unsigned long long used; /* usedGpuMemory; ~0ULL when NVML cannot tell */
    unsigned int gpu_instance, compute_instance;
} nvml_process;

static struct {
    bool tried, ok;
    int (*by_bus)(const char *, void **);
    int (*meminfo)(void *, nvml_memory *);
    int (*processes)(void *, unsigned int *, nvml_process *); /* NULL where the library lacks it */
} nvml;

/* The GPU with this PCI bus id, through NVML loaded once (it needs no CUDA context). NULL when unavailable. */
static void *nvml_device(const char *bus_id) {
    if (!nvml.tried) {
        nvml.tried = true;
        void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        int (*init)(void) = NULL;
        if (lib) {
            *(void **)&init = dlsym(lib, "nvmlInit_v2");
            *(void **)&nvml.by_bus = dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
            *(void **)&nvml.meminfo = dlsym(lib, "nvmlDeviceGetMemoryInfo");
            *(void **)&nvml.processes = dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
            if (!nvml.processes) *(void **)&nvml.processes = dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v2");
            nvml.ok = init && nvml.by_bus && nvml.meminfo && init() == 0;
        }
    }
    void *h = NULL;
    return nvml.ok && nvml.by_bus(bus_id, &h) == 0 ? h : NULL;
}

/* Free bytes on the GPU with this PCI bus id from NVML. -1 when unavailable. */
int64_t exec_nvml_free(const char *bus_id) {
    void *h = nvml_device(bus_id);
    nvml_memory m;
    if (!h || nvml.meminfo(h, &m) != 0) return -1;
    return (int64_t)m.free;
}

/* This process's own bytes on the GPU with this bus id, as the driver counts them for it (its context, its
 * allocations and its libraries'): where ranks share a GPU the free memory counts the others' too. -1 when NVML
 * cannot say. */
int64_t exec_nvml_process_used(const char *bus_id) {
    void *h = nvml_device(bus_id);
    if (!h || !nvml.processes) return -1;
    enum { MOST = 256 };
    nvml_process p[MOST];
    unsigned int n = MOST;
    if (nvml.processes(h, &n, p) != 0) return -1;
    unsigned int me = (unsigned int)getpid();
    for (unsigned int i = 0; i < n && i < MOST; i++)
        if (p[i].pid == me) return p[i].used == ~0ULL ? -1 : (int64_t)p[i].used;
    return -1;
}

int64_t exec_cuda_free_now(void) {
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) != cudaSuccess) return -1;
    return (int64_t)f;
}

int64_t cp_exec_device_free(int dev) {
    char bus[64] = "";
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, dev) != cudaSuccess) return -1;
    return exec_nvml_free(bus);
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
    if (ex->per_process) return exec_nvml_process_used(ex->bus);
    int64_t f = exec_cuda_free_now();
    if (f < 0) return -1;
    return (ex->nvml ? ex->base_free_nvml - ex->ctx_free_nvml : 0) + (ex->ctx_free_cuda - f);
}

/* ---------------------------------------------------------------- pinned host arena */

void *exec_pin_thread(void *arg) {
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
void exec_host_pieces(cp_exec *ex) {
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

/* Every buffer's address: in the GPU arena, or in the pinned piece that holds its bytes (NULL for 0 bytes). */
void exec_place_buffers(cp_exec *ex) {
    const cp_plan *P = ex->P;
    for (int i = 0; i < P->nbufs; i++) {
        const cp_buffer *b = &P->bufs[i];
        if (b->bytes <= 0 || b->offset < 0) continue;
        ex->bufptr[i] = b->space == CP_SPACE_GPU ? (void *)(ex->gpu + b->offset) : host_addr(ex, b->offset);
    }
}
