/* exec.c: the executor's life (see exec.h): creation (kernels compiled while the host arena is pinned, the GPU
 * arena, the prepared steps and their waits), destruction, and the model and optimizer state in and out of the
 * arenas. The prepared steps are in exec_args.c, their order between streams in exec_order.c, running them in
 * exec_run.c, the arenas and memory measurement in exec_mem.c, the host optimizer in exec_hostopt.c. */
#include "exec_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "bundle.h"
#include "emit.h"
#include "jit.h"
#include "kernels.h"
#include "ranks.h"
#include "util.h"
#include "weights.h"

/* ---------------------------------------------------------------- create */

static int buf_index(const cp_exec *ex, const char *name) {
    for (int i = 0; i < ex->P->nbufs; i++)
        if (!strcmp(ex->P->bufs[i].name, name)) return i;
    return -1;
}

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
    if (!rc && ex->o.bundle) rc = cp_bundle_modules(ex->o.bundle, src, n, jo.arch, jm, err, errlen);
    else if (!rc) rc = cp_jit_compile(src, n, &jo, jm, err, errlen);
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
            fprintf(ex->o.out, "kernels: %d modules for %s in %.2f s (%d from %s)\n", n, jo.arch,
                    ex->info.compile_seconds, cached, ex->o.bundle ? "the bundle" : "the cache");
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
    ex->base_free_nvml = ex->o.base_free > 0 ? ex->o.base_free : first && *first > 0 ? *first : exec_nvml_free(bus);
    if (first && *first <= 0 && ex->base_free_nvml > 0) *first = ex->base_free_nvml;
    char sel[64];
    snprintf(sel, sizeof sel, "selecting GPU %d", ex->dev);
    CK(cudaSetDevice(ex->dev), sel);
    CK(cudaFree(0), "creating the CUDA context");
    ex->ctx_free_nvml = exec_nvml_free(bus);
    ex->ctx_free_cuda = exec_cuda_free_now();
    ex->nvml = ex->base_free_nvml >= 0 && ex->ctx_free_nvml >= 0;
    ex->info.nvml = ex->nvml;
    ex->info.mem_context = ex->nvml ? ex->base_free_nvml - ex->ctx_free_nvml : 0;
    snprintf(ex->bus, sizeof ex->bus, "%s", bus);
    /* this process's own bytes where NVML counts them: other processes on this GPU (ranks sharing it, or another
     * run beside this one) allocate and free meanwhile, and the GPU's free memory would count theirs too */
    int64_t own = exec_nvml_process_used(bus);
    if (own >= 0) {
        ex->per_process = true;
        ex->info.per_process = true;
        ex->info.mem_context = own;
        ex->nvml = true;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, ex->dev), "reading the GPU's properties");
    ex->info.sms = prop.multiProcessorCount;
    snprintf(ex->info.device, sizeof ex->info.device, "%s", prop.name);
    if (P->spec.train.fp8 && prop.major < 9)
        return cp_errf(err, errlen, "train.precision = \"fp8\" needs FP8 tensor cores (compute capability 9.0, "
                       "Hopper); GPU %d (%s) is %d.%d: train with train.precision = \"bf16\" there", ex->dev,
                       prop.name, prop.major, prop.minor);
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
    ex->skip_comm = (P->C > 1 || P->ring > 1) && skip && !strcmp(skip, "1");
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
    if (ex->o.trace_path && (cp_trace_check_path(ex->o.trace_path, err, errlen) ||
                             !(ex->trace = cp_trace_rec_create(P, err, errlen))))
        return -1;
    /* pin the host arena on threads while the kernels compile */
    ex->rss_base = cp_proc_status_bytes("VmRSS");
    exec_host_pieces(ex);
    pthread_t *th = cp_xcalloc((size_t)(ex->npieces ? ex->npieces : 1), sizeof *th);
    double t_pin = cp_now();
    for (int i = 0; i < ex->npieces; i++)
        if (pthread_create(&th[i], NULL, exec_pin_thread, &ex->pieces[i])) cp_fatal(CP_EXIT_FAIL, "pthread_create failed");
    int64_t before_mods = exec_cuda_free_now();
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
    int64_t f0 = exec_cuda_free_now();
    cudaError_t e = cudaMalloc((void **)&ex->gpu, (size_t)(P->gpu_arena ? P->gpu_arena : 1));
    if (e != cudaSuccess) {
        char what[128], a[32];
        snprintf(what, sizeof what, "allocating the GPU arena of %s", cp_fmt_bytes(P->gpu_arena, a, sizeof a));
        return cp_cuda_errmsg(e, what, err, errlen);
    }
    ex->info.mem_arena = f0 - exec_cuda_free_now();
    exec_place_buffers(ex);
    void *ws = cp_exec_buffer(ex, "gemm_workspace");
    ex->loss_sum = cp_exec_buffer(ex, "loss_sum");
    if (!ws || !ex->loss_sum) return cp_errf(err, errlen, "the plan has no gemm_workspace or loss_sum buffer");
    if (P->bufs[buf_index(ex, "loss_sum")].bytes < CP_SCALARS_BYTES)
        return cp_errf(err, errlen, "the plan's loss_sum buffer is smaller than the %d bytes of the step's scalars",
                       CP_SCALARS_BYTES);
    if (cp_gemm_lib_create(&ex->gemm, ws, CP_GEMM_WORKSPACE, err, errlen)) return -1;
    int mb = P->spec.train.micro_batches;
    CK(cudaHostAlloc((void **)&ex->staging, sizeof(int32_t) * (size_t)cp_plan_input_ints(P) * (size_t)mb,
                     cudaHostAllocDefault),
       "pinning the token staging buffer");
    ex->sort_count = cp_xcalloc((size_t)P->spec.model.vocab + 1, sizeof *ex->sort_count);
    CK(cudaHostAlloc((void **)&ex->host_scalars, 32 + CP_SCALARS_RANK_INTS * sizeof(int64_t), cudaHostAllocDefault),
       "pinning the loss read-back");

    /* every step's launch, GEMM entry, copy; then the waits between streams and the progress markers */
    for (int i = 0; i < P->nsteps; i++)
        if (exec_prep_step(ex, i, err, errlen)) return -1;
    if (exec_check_weight_ranges(ex, err, errlen)) return -1;
    exec_build_deps(ex, 0, P->micro_steps);
    exec_build_deps(ex, P->micro_steps, P->nsteps);
    ex->info.cross_waits = ex->nwaits;
    ex->info.events = ex->nevents;
    ex->events = cp_xcalloc((size_t)(ex->nevents ? ex->nevents : 1), sizeof *ex->events);
    for (int i = 0; i < ex->nevents; i++)
        CK(cudaEventCreateWithFlags(&ex->events[i], cudaEventDisableTiming), "creating an event");
    exec_build_markers(ex);
    ex->marker_ev = cp_xcalloc((size_t)(ex->nmarkers * mb + 1), sizeof *ex->marker_ev);
    for (int i = 0; i < ex->nmarkers * mb; i++)
        CK(cudaEventCreateWithFlags(&ex->marker_ev[i], cudaEventDisableTiming), "creating an event");
    ex->nmarker_ev = ex->nmarkers * mb;
    ex->info.gemm_entries = cp_gemm_entries(ex->gemm);
    CK(cudaDeviceSynchronize(), "setting up the executor");
    ex->info.mem_modules = before_mods - exec_cuda_free_now() - ex->info.mem_arena;
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

int exec_place_rank(cp_exec *ex, char *err, int errlen) {
    const cp_plan *P = ex->P;
    ex->ring_pos = 0;
    ex->ring_to = ex->ring_from = -1;
    if (P->replicas * P->ring == 1) return 0; /* one group: its ranks are the run's, world_rank may be left 0 */
    cp_rank_layout L = {P->replicas, P->ring, P->C};
    int world = cp_rank_world(&L), me = ex->o.world_rank;
    if (me < 0 || me >= world || cp_rank_of(&L, me).local != ex->o.rank)
        return cp_errf(err, errlen, "rank %d of the run (of %d) is not rank %d of its group of %d GPUs: ranks are "
                       "numbered (replica x ring + ring position) x gpus + the rank in the group (gen/ranks.c); the "
                       "caller's ranks disagree with the plan's layout", me, world, ex->o.rank, P->C);
    ex->ring_pos = cp_rank_of(&L, me).ring_pos;
    if (P->ring == 1) return 0;
    /* the ring's neighbours, as the ring communicator numbers its members (cp_world_split ranks them so) */
    int *members = cp_xmalloc(sizeof(int) * (size_t)world), color;
    int n = cp_rank_comm(&L, me, CP_COMM_RING, &color, members);
    int next = cp_rank_ring_next(&L, me), prev = cp_rank_ring_prev(&L, me);
    for (int k = 0; k < n; k++) {
        if (members[k] == next) ex->ring_to = k;
        if (members[k] == prev) ex->ring_from = k;
    }
    free(members);
    return 0;
}

int cp_exec_create(cp_exec **out, const cp_plan *P, const cp_exec_opts *o, char *err, int errlen) {
    *out = NULL;
    if (P->C > 1 && (!o || !o->comm || o->comm->size != P->C || o->rank != o->comm->rank))
        return cp_errf(err, errlen, "the plan has %d GPUs: each needs its own process with a communicator of all %d "
                       "(`cpgen run` starts them; under mpirun or srun, start one process per GPU)", P->C, P->C);
    int groups = P->replicas * P->ring;
    if (groups > 1 && (!o || !o->shard_comm || o->shard_comm->size != groups || !o->world_comm ||
                       o->world_comm->size != groups * P->C))
        return cp_errf(err, errlen, "the plan has %d groups of %d GPUs: each rank needs the communicator of its shard "
                       "across the groups (%d ranks) and the run's (%d; cp_world_split makes them)", groups, P->C,
                       groups, groups * P->C);
    cp_exec *ex = cp_xcalloc(1, sizeof *ex);
    ex->P = P;
    if (o) ex->o = *o;
    ex->dev = ex->o.device;
    ex->bufptr = cp_xcalloc((size_t)(P->nbufs ? P->nbufs : 1), sizeof *ex->bufptr);
    ex->x = cp_xcalloc((size_t)(P->nsteps ? P->nsteps : 1), sizeof *ex->x);
    int rc = exec_place_rank(ex, err, errlen);
    const cp_nccl_comm *ring = ex->o.ring_comm;
    if (!rc && P->ring > 1 && (!ring || ring->size != P->ring || ring->rank != ex->ring_pos))
        rc = cp_errf(err, errlen, "the plan has a ring of %d groups: each rank needs the ring's communicator (%d "
                     "ranks, this one at ring position %d; cp_world_split makes it)", P->ring, P->ring, ex->ring_pos);
    if (rc || setup(ex, err, errlen)) {
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
    exec_snap_free(ex);
    cp_gemm_lib_destroy(ex->gemm);
    for (int i = 0; i < ex->nevents && ex->events; i++) (void)cudaEventDestroy(ex->events[i]);
    for (int i = 0; i < ex->nmarker_ev; i++) (void)cudaEventDestroy(ex->marker_ev[i]);
    cp_profile_free(ex->prof);
    cp_trace_rec_free(ex->trace);
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
    for (int i = 0; ex->x && i < ex->P->nsteps; i++)
        for (int j = 0; j < 2; j++) free(ex->x[i].L[j].tmaps);
    free(ex->x);
    free(ex->events);
    free(ex->waits);
    free(ex->event_step);
    free(ex->eval_run);
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

/* ---------------------------------------------------------------- weights */

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

/* The full flat model from each rank's shard of the fp32 buffer `name`, gathered to the rank that writes
 * checkpoints: unit by unit, group 0's ranks send their shards to its rank 0, which receives them into a
 * unit-gradient buffer (it holds nothing between steps) and copies the unit out to flat. Only that rank receives
 * the model: an all-gather would send every rank all of it, C times the traffic, which over sockets (ranks
 * sharing a GPU) made a save of the 8B shape's two layers take a minute. The other groups hold the same model
 * (replicas and ring stages keep equal shards) and take no part. A shard in host memory (the optimizer on the
 * host) is first copied to the GPU. flat is filled on group 0's rank 0 only; elsewhere it may be NULL. */
int exec_gather_through(const cp_exec *ex, const char *name, int *src, int *stage, char *err, int errlen) {
    const cp_plan *P = ex->P;
    int b = buf_index(ex, name);
    if (b < 0) return cp_errf(err, errlen, "the plan has no buffer %s", name);
    int64_t most = 0;
    for (int u = 0; u < P->nunits; u++) most = CP_MAX(most, P->unit_padded[u]);
    int s = -1;
    for (int i = 0; i < P->nbufs; i++)
        if (P->bufs[i].cat == CP_CAT_UNIT_GRADS && P->bufs[i].space == CP_SPACE_GPU && P->bufs[i].bytes >= most * 4 &&
            (s < 0 || P->bufs[i].bytes < P->bufs[s].bytes))
            s = i;
    if (s < 0) return cp_errf(err, errlen, "no unit-gradient buffer holds the largest unit (%lld elements) to gather "
                              "%s through", (long long)most, name);
    *src = b, *stage = s;
    return 0;
}

/* flat may be registered in pieces (exec_piece_span): a unit may be larger than a piece (the 8B shape's embedding is
 * 2.1 GB), so it is copied out piece by piece. */
int exec_gather_full(cp_exec *ex, const char *name, float *flat, size_t piece, char *err, int errlen) {
    const cp_plan *P = ex->P;
    if (ex->o.world_rank >= P->C) return 0; /* not group 0: its rank 0 alone writes */
    int b, stage;
    if (exec_gather_through(ex, name, &b, &stage, err, errlen)) return -1;
    bool on_host = P->bufs[b].space == CP_SPACE_HOST, root = ex->o.rank == 0;
    cudaStream_t st = ex->streams[CP_STREAM_COMPUTE];
    CK(cudaDeviceSynchronize(), "finishing the step before gathering the model");
    int64_t full = 0;
    for (int u = 0; u < P->nunits; u++) {
        int64_t part = P->unit_padded[u] / P->C;
        float *unit = (float *)ex->bufptr[stage];
        const float *src = (const float *)ex->bufptr[b] + P->unit_shard_off[u];
        if (on_host) { /* to the GPU first, at the rank's place in the unit: at the root, gathered in place */
            float *to = unit + part * ex->o.rank;
            CK(cudaMemcpyAsync(to, src, sizeof(float) * (size_t)part, cudaMemcpyHostToDevice, st),
               "copying a host shard to the GPU to gather it");
            src = to;
        }
        if (cp_nccl_gather(ex->o.comm, src, root ? unit : NULL, (size_t)part, ncclFloat32, 0, st, err, errlen))
            return -1;
        if (root && flat) {
            size_t at = sizeof(float) * (size_t)full, end = at + sizeof(float) * (size_t)P->unit_padded[u];
            for (size_t k; at < end; at += k) {
                k = exec_piece_span(at, end, piece);
                CK(cudaMemcpyAsync((char *)flat + at, (const char *)unit + (at - sizeof(float) * (size_t)full), k,
                                   cudaMemcpyDeviceToHost, st), "copying a gathered unit to the host");
            }
        }
        if (exec_sync_stream(ex, st, "gathering the model to rank 0", err, errlen)) return -1;
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
        for (int64_t i = 0; i < k; i++) bf[i] = exec_to_bf16(shard[at + i]);
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
    if (ex->P->C > 1) return exec_gather_full(ex, "master.f32", flat, 0, err, errlen);
    if (!flat) return 0; /* a group of one GPU gathers nothing: a rank that keeps nothing has nothing to do */
    int b = buf_index(ex, "master.f32");
    if (b < 0) return cp_errf(err, errlen, "the plan has no master.f32");
    size_t n = sizeof(float) * (size_t)ex->P->params_shard;
    CK(cudaDeviceSynchronize(), "finishing the step before reading the weights");
    if (ex->P->bufs[b].space == CP_SPACE_HOST) memcpy(flat, ex->bufptr[b], n);
    else CK(cudaMemcpy(flat, ex->bufptr[b], n, cudaMemcpyDeviceToHost), "reading the master weights");
    return 0;
}

int cp_exec_read_grads(cp_exec *ex, float *flat, bool zero, char *err, int errlen) {
    void *g = cp_exec_buffer(ex, "grads.f32");
    if (!g) return cp_errf(err, errlen, "the plan has no grads.f32");
    size_t n = sizeof(float) * (size_t)ex->P->params_shard;
    CK(cudaDeviceSynchronize(), "finishing the step before reading the gradients");
    if (ex->P->C > 1) {
        if (exec_gather_full(ex, "grads.f32", flat, 0, err, errlen)) return -1;
    } else {
        CK(cudaMemcpy(flat, g, n, cudaMemcpyDeviceToHost), "reading the gradients");
    }
    if (zero) CK(cudaMemset(g, 0, n), "zeroing the gradients");
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
    if (ex->P->C == 1 && !m && !v) { /* nothing to gather, nothing to copy: the count alone */
        if (updates) *updates = ex->updates;
        return 0;
    }
    CK(cudaDeviceSynchronize(), "finishing the step before reading the optimizer state");
    int rc = 0;
    if (ex->P->C > 1) { /* both moments, on every rank alike: the gathers are collectives */
        rc = exec_gather_full(ex, "adam_m.f32", m, 0, err, errlen);
        if (!rc) rc = exec_gather_full(ex, "adam_v.f32", v, 0, err, errlen);
        if (!rc && updates) *updates = ex->updates;
        return rc;
    }
    if (m) rc = get(ex, "adam_m.f32", m, n, err, errlen);
    if (!rc && v) rc = get(ex, "adam_v.f32", v, n, err, errlen);
    if (!rc && updates) *updates = ex->updates;
    return rc;
}

int cp_exec_load_optimizer(cp_exec *ex, const float *m, const float *v, int updates, char *err, int errlen) {
    float *ms = m ? rank_shard(ex, m) : NULL, *vs = v ? rank_shard(ex, v) : NULL;
    int rc = cp_exec_load_optimizer_shard(ex, ms ? ms : m, vs ? vs : v, updates, err, errlen);
    free(ms);
    free(vs);
    return rc;
}

int cp_exec_load_optimizer_shard(cp_exec *ex, const float *m, const float *v, int updates, char *err, int errlen) {
    if (updates < 0) return cp_errf(err, errlen, "loading the optimizer state: %d updates (must be >= 0)", updates);
    size_t n = sizeof(float) * (size_t)ex->P->params_shard;
    int rc = 0;
    if (m) rc = put(ex, "adam_m.f32", 0, m, n, err, errlen);
    if (!rc && v) rc = put(ex, "adam_v.f32", 0, v, n, err, errlen);
    if (!rc) CK(cudaDeviceSynchronize(), "uploading the optimizer state");
    /* the next update is number updates + 1, as in the run that saved them (cp_exec_step: ++updates) */
    if (!rc) ex->updates = ex->sc.adam_step = updates;
    return rc;
}
