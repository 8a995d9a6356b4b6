/* exec_run.c: running training steps: the micro-batches' prepared steps walked in order on their streams, the
 * streams joined, one read of the loss and gradient norm, the optimizer; progress within a long step, the inputs
 * staged for the GPU, and the collectives (or their local stand-ins when timing without communication). */
#include "exec_internal.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "util.h"

/* ---------------------------------------------------------------- collectives */

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
    case CP_OP_SENDRECV: return cudaMemcpyAsync(dst, src, b, cudaMemcpyDeviceToDevice, st); /* the own block again */
    default: return cudaSuccess;
    }
}

/* The communicator a step's collective runs over (cp_step.comm): the Ulysses group's, the ring's, the shard's across
 * groups, or the run's. */
static cp_nccl_comm *step_comm(const cp_exec *ex, int i) {
    switch (ex->P->steps[i].comm) {
    case CP_COMM_RING: return ex->o.ring_comm;
    case CP_COMM_SHARD: return ex->o.shard_comm;
    case CP_COMM_WORLD: return ex->o.world_comm;
    default: return ex->o.comm;
    }
}

/* The communicator watched while waiting, and the one the loss is summed over outside the plan: the run's. */
cp_nccl_comm *exec_run_comm(const cp_exec *ex) { return ex->o.world_comm ? ex->o.world_comm : ex->o.comm; }

static int run_collective(cp_exec *ex, int i, cudaStream_t st, char *err, int errlen) {
    const xstep *x = &ex->x[i];
    cp_nccl_comm *cm = step_comm(ex, i);
    switch (ex->P->steps[i].kind) {
    case CP_OP_ALLTOALL: return cp_nccl_all_to_all(cm, x->src, x->dst, x->count, x->dtype, st, err, errlen);
    case CP_OP_ALLGATHER: return cp_nccl_all_gather(cm, x->src, x->dst, x->count, x->dtype, st, err, errlen);
    case CP_OP_REDUCE_SCATTER:
        return cp_nccl_reduce_scatter(cm, x->src, x->dst, x->count, x->dtype, ncclSum, st, err, errlen);
    case CP_OP_ALLREDUCE: return cp_nccl_all_reduce(cm, x->src, x->dst, x->count, x->dtype, ncclSum, st, err, errlen);
    case CP_OP_SENDRECV:
        return cp_nccl_send_recv(cm, x->src, x->to, x->dst, x->from, x->count, x->dtype, st, err, errlen);
    default: return cp_errf(err, errlen, "step %d is not a collective", i);
    }
}

/* Wait for a stream; with several GPUs through the communicator's watchdog, so that a rank that failed or hangs
 * stops this one with a message instead of a wait forever. */
int exec_sync_stream(cp_exec *ex, cudaStream_t st, const char *what, char *err, int errlen) {
    /* a wait may span a whole step: the communicator's deadline plus four times the step the plan predicts, so a
     * long step is not taken for a stuck peer */
    cp_nccl_comm *cm = exec_run_comm(ex);
    if (cm) return cp_nccl_wait(cm, st, NULL, what, cm->timeout_s + 4 * ex->P->t_step, err, errlen);
    CK(cudaStreamSynchronize(st), what);
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

int exec_join_streams(cp_exec *ex, char *err, int errlen) {
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
    return exec_run_step(ex, i, mb, pr, false, err, errlen);
}

int exec_run_step(cp_exec *ex, int i, int mb, void *progress_state, bool skip, char *err, int errlen) {
    progress *pr = progress_state;
    const xstep *x = &ex->x[i];
    cudaStream_t st = ex->streams[x->stream];
    cudaError_t e = cudaSuccess;
    char d[160], what[200];
    if (x->marker >= 0 && pr) {
        e = cudaEventRecord(ex->marker_ev[mb * ex->nmarkers + x->marker], ex->streams[CP_STREAM_COMPUTE]);
        if (e == cudaSuccess) atomic_fetch_add(&pr->recorded, 1);
    }
    for (int w = 0; w < x->nwait && e == cudaSuccess; w++) e = cudaStreamWaitEvent(st, ex->events[ex->waits[x->wait0 + w]], 0);
    /* a step of the last micro-batch only (the all-reduce of gradients accumulated over all of them): in the others
     * it does nothing, but still takes its waits and records its event, so whatever waits for it is ordered as in
     * the last */
    bool idle = skip || (ex->P->steps[i].last_micro && mb + 1 < ex->P->spec.train.micro_batches);
    bool timed = ex->profiling && mb == 0 && !idle;
    if (timed && e == cudaSuccess) e = cp_profile_begin(ex->prof, i, st);
    int traced = ex->tracing ? cp_trace_instance(ex->P, mb, i) : -1;
    if (traced >= 0 && e == cudaSuccess) e = cp_trace_rec_begin(ex->trace, traced, st);
    if (e == cudaSuccess && !idle) switch (x->kind) {
        case X_KERNEL:
            for (int k = 0; k < x->nl && e == cudaSuccess; k++) e = cp_launch(x->L[k].k, &x->L[k].d, (void **)x->L[k].args, st);
            break;
        case X_GEMM:
            if (cp_gemm_launch_scaled(ex->gemm, x->gemm, x->ga, x->gb, x->gc, x->gd, x->gsa, x->gsb, st, err, errlen)) {
                char m[1024];
                snprintf(m, sizeof m, "%s", err);
                return cp_errf(err, errlen, "%s: %s", exec_step_desc(ex->P, i, d, sizeof d), m);
            }
            break;
        case X_MEMSET: e = cudaMemsetAsync(x->dst, 0, x->bytes, st); break;
        case X_COPY: {
            e = cudaMemcpyAsync(x->dst, x->src, x->bytes, cudaMemcpyDefault, st);
            break;
        }
        case X_HOST_ADAMW:
            if (exec_host_update(ex, i, err, errlen)) return -1;
            break;
        case X_COLL:
            if (ex->skip_comm && ex->P->steps[i].kind != CP_OP_ALLREDUCE) {
                e = local_stand_in(ex, i, st);
                break;
            }
            if (run_collective(ex, i, st, err, errlen)) {
                char m[CP_ERR_MAX];
                snprintf(m, sizeof m, "%s", err);
                return cp_errf(err, errlen, "rank %d, %s: %s", ex->o.rank, exec_step_desc(ex->P, i, d, sizeof d), m);
            }
            break;
        case X_LOAD_TOKENS: { /* each operand whole, from consecutive parts of the micro-batch's staging */
            const cp_step *s = &ex->P->steps[i];
            const char *src = (const char *)(ex->staging + (size_t)mb * (size_t)cp_plan_input_ints(ex->P));
            for (int j = 0; j < s->nops && e == cudaSuccess; j++) {
                size_t n = (size_t)ex->P->bufs[s->ops[j].buf].bytes;
                e = cudaMemcpyAsync((char *)ex->bufptr[s->ops[j].buf] + s->ops[j].offset, src, n,
                                    cudaMemcpyHostToDevice, st);
                src += n;
            }
            break;
        }
        default: break;
        }
    if (timed && e == cudaSuccess) e = cp_profile_end(ex->prof, i, st);
    if (traced >= 0 && e == cudaSuccess) e = cp_trace_rec_end(ex->trace, traced, st);
    if (e == cudaSuccess && x->event >= 0) e = cudaEventRecord(ex->events[x->event], st);
    if (e != cudaSuccess) {
        snprintf(what, sizeof what, "%s", exec_step_desc(ex->P, i, d, sizeof d));
        return cp_cuda_errmsg(e, what, err, errlen);
    }
    return 0;
}

/* With several ranks, the most and the least GPU memory any rank measured and the most host memory it added: each
 * rank's figure is its own, and the plan's must hold for every one. One all-reduce (max) of five integers in the
 * step's scalars, after the step; the fifth is the stop request (cp_exec_opts.stop_request), so that a signal that
 * reached any rank stops every rank after this same step. */
static int spread_memory(cp_exec *ex, cp_step_result *r, char *err, int errlen) {
    enum { N = CP_SCALARS_RANK_INTS };
    int64_t *h = (int64_t *)((char *)ex->host_scalars + 32);
    h[0] = r->mem_used, h[1] = -r->mem_used, h[2] = r->host_used, h[3] = -r->host_used, h[4] = r->stop;
    char *d = (char *)ex->loss_sum + CP_SCALARS_MEMORY;
    cudaStream_t st = ex->streams[CP_STREAM_COMPUTE];
    CK(cudaMemcpyAsync(d, h, N * sizeof(int64_t), cudaMemcpyHostToDevice, st), "staging the memory figures");
    if (cp_nccl_all_reduce(exec_run_comm(ex), d, d, N, ncclInt64, ncclMax, st, err, errlen)) return -1;
    CK(cudaMemcpyAsync(h, d, N * sizeof(int64_t), cudaMemcpyDeviceToHost, st), "reading the memory figures");
    if (exec_sync_stream(ex, st, "comparing the ranks' memory", err, errlen)) return -1;
    r->mem_used = h[0], r->mem_least = -h[1], r->host_used = h[2], r->stop = (int)h[4];
    return 0;
}

/* One sync: the loss sum and the gradient's sum of squares. */
int exec_read_scalars(cp_exec *ex, char *err, int errlen) {
    cudaStream_t st = ex->streams[CP_STREAM_COMPUTE];
    /* the all-reduce of the two sums runs on the communication stream; the read is not a plan step, so no event
     * orders it after that */
    if (exec_run_comm(ex) && exec_sync_stream(ex, ex->streams[CP_STREAM_COMM], "summing the loss across the ranks", err, errlen))
        return -1;
    CK(cudaMemcpyAsync(ex->host_scalars, ex->loss_sum, 2 * sizeof(float), cudaMemcpyDeviceToHost, st),
       "reading the loss");
    return exec_sync_stream(ex, st, "running the micro-batches (a kernel failed; rerun with CUDA_LAUNCH_BLOCKING=1 to "
                               "find which)", err, errlen);
}

/* The rows of one micro-batch's tokens (all in [0, V)) sorted by token, stably: a counting sort, O(T + V). */
static void sort_tokens(const int32_t *tok, int64_t T, int64_t V, int32_t *count, int32_t *order) {
    memset(count, 0, sizeof *count * (size_t)(V + 1));
    for (int64_t t = 0; t < T; t++) count[tok[t] + 1]++;
    for (int64_t v = 0; v < V; v++) count[v + 1] += count[v];
    for (int64_t t = 0; t < T; t++) order[count[tok[t]]++] = (int32_t)t;
}

int cp_exec_set_documents(cp_exec *ex, int mb, const int32_t *positions, const int32_t *doc_start,
                          const int32_t *doc_end, char *err, int errlen) {
    const cp_plan *P = ex->P;
    int64_t T = P->T, S = P->S, stride = cp_plan_input_ints(P);
    if (mb < 1 || mb > P->spec.train.micro_batches)
        return cp_errf(err, errlen, "documents of %d micro-batches, the plan has %d", mb, P->spec.train.micro_batches);
    for (int b = 0; b < mb; b++) {
        int32_t *dst = ex->staging + (size_t)(b * stride + 3 * T);
        if (P->doc_positions) {
            if (!positions) return cp_errf(err, errlen, "the plan restarts positions per document, and none were given");
            for (int64_t t = 0; t < T; t++) {
                int32_t p = positions[b * T + t];
                if (p < 0 || p >= S)
                    return cp_errf(err, errlen, "position %d of row %lld of micro-batch %d is outside [0, %lld)", p,
                                   (long long)t, b, (long long)S);
                dst[t] = p;
            }
            dst += T;
        }
        if (!P->docs) continue;
        if (!doc_start || !doc_end) return cp_errf(err, errlen, "the plan masks documents, and no bounds were given");
        /* the kernels bound their loops by these: each position inside its document, documents in order */
        const int32_t *a = doc_start + b * S, *e = doc_end + b * S;
        for (int64_t i = 0; i < S; i++) {
            bool starts = a[i] == i, ok = a[i] >= 0 && a[i] <= i && e[i] > i && e[i] <= S;
            if (i == 0) ok = ok && starts;
            else if (starts) ok = ok && e[i - 1] == i;
            else ok = ok && a[i] == a[i - 1] && e[i] == e[i - 1];
            if (!ok)
                return cp_errf(err, errlen, "micro-batch %d: position %lld's document [%d, %d) is not a document of "
                               "the sequence's %lld positions in order", b, (long long)i, a[i], e[i], (long long)S);
        }
        memcpy(dst, a, sizeof(int32_t) * (size_t)S);
        memcpy(dst + S, e, sizeof(int32_t) * (size_t)S);
    }
    ex->docs_staged = true;
    return 0;
}

/* Tokens and targets into the pinned staging (checked against the vocabulary), each micro-batch's rows sorted by
 * token for the embedding's backward, and the loss's divisor: the step's target tokens, over all ranks with several
 * GPUs (targets_all, from the caller: each rank sees only its slice). Returns that count, or -1. */
int64_t exec_stage_inputs(cp_exec *ex, int mb, const int32_t *tokens, const int32_t *targets, int64_t targets_all,
                          char *err, int errlen) {
    const cp_plan *P = ex->P;
    int64_t T = P->T, V = P->spec.model.vocab, ntgt = 0, stride = cp_plan_input_ints(P);
    if ((P->docs || P->doc_positions) && !ex->docs_staged)
        return cp_errf(err, errlen, "the plan masks packed documents, and this step's documents were not given "
                       "(cp_exec_set_documents before every step and evaluation)");
    ex->docs_staged = false;
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
            ex->staging[(size_t)(b * stride + t)] = tok;
            ex->staging[(size_t)(b * stride + T + t)] = tg;
        }
    for (int b = 0; b < mb; b++) {
        int32_t *st = ex->staging + (size_t)(b * stride);
        sort_tokens(st, T, V, ex->sort_count, st + 2 * T);
    }
    if (exec_run_comm(ex)) { /* several GPUs: the divisor counts every rank of every group */
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
    if (exec_stage_inputs(ex, P->spec.train.micro_batches, tokens, targets, targets_all, err, errlen) < 0) return -1;
    CK(cudaMemsetAsync(ex->loss_sum, 0, CP_SCALARS_BYTES, ex->streams[CP_STREAM_COMPUTE]), "zeroing the loss");
    int rc = 0;
    for (int b = 0; b < P->spec.train.micro_batches && !rc; b++) {
        rc = exec_join_streams(ex, err, errlen);
        for (int i = 0; i < P->micro_steps && !rc; i++) rc = run_step(ex, i, b, NULL, err, errlen);
    }
    if (!rc) rc = exec_join_streams(ex, err, errlen);
    /* the optimizer's all-reduce of the loss does not run here: sum it across the ranks now */
    if (!rc && exec_run_comm(ex))
        rc = cp_nccl_all_reduce(exec_run_comm(ex), ex->loss_sum, ex->loss_sum, 1, ncclFloat32, ncclSum,
                                ex->streams[CP_STREAM_COMPUTE], err, errlen);
    if (!rc) rc = exec_read_scalars(ex, err, errlen);
    if (!rc) CK(cudaDeviceSynchronize(), "finishing the backward");
    if (!rc) *loss = (double)ex->host_scalars[0] * ex->sc.loss_scale;
    return rc;
}

int cp_exec_step(cp_exec *ex, const int32_t *tokens, const int32_t *targets, const cp_optim_hp *hp, const char *label,
                 cp_step_result *r, char *err, int errlen) {
    const cp_plan *P = ex->P;
    int mb = P->spec.train.micro_batches;
    memset(r, 0, sizeof *r);
    double t0 = cp_now();
    /* the trace's time 0, taken first so that its total compares with this step's wall time */
    ex->steps_run++;
    ex->tracing = ex->trace && ex->steps_run == ex->o.trace_step;
    if (ex->tracing) CK(cp_trace_rec_start(ex->trace, ex->streams[CP_STREAM_COMPUTE]), "starting the step trace");
    int64_t ntgt = exec_stage_inputs(ex, mb, tokens, targets, hp->targets_all, err, errlen);
    if (ntgt < 0) return -1;
    r->targets = ntgt;
    ex->sc.lr = (float)hp->lr;
    ex->sc.beta1 = (float)hp->beta1;
    ex->sc.beta2 = (float)hp->beta2;
    ex->sc.eps = (float)hp->eps;
    ex->sc.wd = (float)hp->weight_decay;
    cudaStream_t cs = ex->streams[CP_STREAM_COMPUTE];
    CK(cudaMemsetAsync(ex->loss_sum, 0, CP_SCALARS_BYTES, cs), "zeroing the loss");
    ex->profiling = ex->prof && ex->steps_run == ex->prof_step;
    ex->snap_waited = 0;

    double expect = ex->last_seconds > 0 ? ex->last_seconds : P->t_step * 3;
    progress pr = {.ex = ex, .label = label ? label : "step", .t0 = t0};
    atomic_init(&pr.recorded, 0);
    atomic_init(&pr.done, false);
    pthread_t pth;
    bool prog = expect > PROGRESS_AFTER && ex->nmarkers > 0 && ex->o.rank == 0 && ex->o.world_rank == 0 && /* one voice */
                pthread_create(&pth, NULL, progress_thread, &pr) == 0;
    int rc = 0;
    for (int b = 0; b < mb && !rc; b++) {
        rc = exec_join_streams(ex, err, errlen);
        for (int i = 0; i < P->micro_steps && !rc; i++) rc = run_step(ex, i, b, prog ? &pr : NULL, err, errlen);
    }
    if (!rc) rc = exec_join_streams(ex, err, errlen);
    bool decided = false, skip = false;
    for (int i = P->micro_steps; i < P->nsteps && !rc; i++) {
        const xstep *x = &ex->x[i];
        if (!decided && (x->special == S_ADAMW || x->kind == X_HOST_ADAMW)) {
            rc = exec_read_scalars(ex, err, errlen);
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
        rc = exec_snap_gate(ex, i, err, errlen); /* a checkpoint's snapshot still reading what the update writes */
        if (!rc) rc = run_step(ex, i, 0, NULL, err, errlen);
    }
    if (!rc && !decided) rc = exec_read_scalars(ex, err, errlen);
    if (!rc) {
        for (int s = 0; s < CP_STREAM_COUNT && !rc; s++)
            if (ex->stream_used[s] || s == CP_STREAM_COMPUTE) rc = exec_sync_stream(ex, ex->streams[s], "finishing the step", err, errlen);
    }
    /* the step's end, before the progress thread is joined: it sleeps up to 100 ms between looks, not step time */
    double t_end = cp_now();
    if (prog) {
        atomic_store(&pr.done, true);
        pthread_join(pth, NULL);
    }
    if (rc) return -1;
    if (!decided) r->loss = (double)ex->host_scalars[0] * ex->sc.loss_scale;
    r->skipped = skip;
    r->seconds = t_end - t0;
    r->mem_used = r->mem_least = cp_exec_mem_used(ex);
    r->host_used = cp_exec_host_used(ex);
    r->snap_wait = ex->snap_waited;
    r->stop = ex->o.stop_request ? (int)*ex->o.stop_request : 0;
    if (exec_run_comm(ex) && spread_memory(ex, r, err, errlen)) return -1;
    ex->last_seconds = r->seconds;
    /* a trace that cannot be written is reported and the run goes on: the training is worth more than its picture */
    if (ex->tracing && exec_trace_write(ex, r->seconds, err, errlen)) fprintf(stderr, "cpgen: rank %d: %s\n", ex->o.rank, err);
    ex->tracing = false;
    if (ex->profiling && ex->o.out) return cp_profile_report(ex->prof, r->seconds, mb, ex->o.out, err, errlen);
    return 0;
}
