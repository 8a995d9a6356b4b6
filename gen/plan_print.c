/* plan_print.c: the plan as text (the startup table and `cpgen plan`) and as JSON for tools. */
#include <string.h>

#include "kernels.h"
#include "plan.h"
#include "plan_eval.h"
#include "ring.h"
#include "util.h"

static const char *cat_names[] = {
    "parameters (bf16 shard)", "master weights (fp32 shard)", "AdamW moments (fp32 shard)", "gradients (fp32 shard)",
    "gathered layer weights", "full gradients before reduce-scatter", "checkpoints (layer inputs)",
    "kept attention outputs and LSE", "layer activations", "attention working set (one stage)",
    "attention output, LSE, delta", "MLP tile", "loss tile (logits)", "all-to-all buffers",
    "ring attention (blocks, merge, dK/dV)", "FP8 copies of GEMM inputs", "tokens, scalars, GEMM workspace"};
static const char *cat_keys[] = {"params", "master", "optim", "grads", "gathered", "unit_grads",
                                 "ckpt", "attn_saved", "act", "attn", "attn_kept", "mlp", "loss",
                                 "comm", "ring", "fp8", "workspace"};

_Static_assert(CP_ARRAY_LEN(cat_names) == CP_CAT_COUNT && CP_ARRAY_LEN(cat_keys) == CP_CAT_COUNT,
               "a name and a JSON key for every memory category");

const char *cp_cat_name(cp_cat c) { return c < CP_CAT_COUNT ? cat_names[c] : "?"; }

const char *cp_opkind_name(cp_opkind k) {
    static const char *n[CP_OP_COUNT] = {"kernel", "gemm", "all_to_all", "all_gather", "reduce_scatter", "all_reduce",
                                         "copy_d2h", "copy_h2d", "memset", "send_recv"};
    return k < CP_OP_COUNT ? n[k] : "?";
}

const char *cp_phase_name(cp_phase p) {
    static const char *n[CP_PHASE_COUNT] = {"fwd", "recompute", "bwd", "optim"};
    return p < CP_PHASE_COUNT ? n[p] : "?";
}

/* Tokens one group trains on per optimizer step: its micro-batches of sequences (a ring's groups share one). */
static double tokens_per_step(const cp_plan *P) { return (double)P->group_tokens * P->spec.train.micro_batches; }

/* Bytes one layer keeps of its attention: its output in token layout (T x H x head_dim bf16) and its heads' LSE
 * ((H / C) x the group's tokens, fp32). */
static int64_t attn_kept_bytes(const cp_plan *P) {
    const cp_model *m = &P->spec.model;
    return P->T * m->heads * m->head_dim * 2 + m->heads / P->C * P->group_tokens * 4;
}

/* "; kept on the GPU for layers a-b (size)" for [first, first + n), appended at line + *n; nothing for count 0. */
static void append_layers(char *line, size_t len, int *at, const char *what, int first, int count, int64_t bytes) {
    if (count < 1 || *at >= (int)len) return;
    char b[32];
    *at += snprintf(line + *at, len - (size_t)*at, "%s%s layer%s %d", *at && line[*at - 1] != ':' ? ";" : "", what,
                    count > 1 ? "s" : "", first);
    if (count > 1 && *at < (int)len) *at += snprintf(line + *at, len - (size_t)*at, "-%d", first + count - 1);
    if (bytes > 0 && *at < (int)len)
        *at += snprintf(line + *at, len - (size_t)*at, " (%s)", cp_fmt_bytes(bytes, b, sizeof b));
}

/* Where each layer keeps its attention output and LSE for the backward, what that holds, and what it saves. */
static void print_attention_output(const cp_plan *P, FILE *out) {
    int L = (int)P->spec.model.layers, h = P->attn_host_layers, g = P->attn_gpu_layers;
    int64_t per = attn_kept_bytes(P);
    char line[512], a[32];
    int n = snprintf(line, sizeof line, "  attention output (%s):",
                     cp_attn_keep_name(P->spec.parallel.attention_output));
    append_layers(line, sizeof line, &n, " kept on the GPU for", h, g, g * per);
    append_layers(line, sizeof line, &n, " on the host for", 0, h, h * per);
    if (h && n < (int)sizeof line)
        n += snprintf(line + n, sizeof line - (size_t)n, ", through %s of GPU staging",
                      cp_fmt_bytes(2 * per, a, sizeof a));
    append_layers(line, sizeof line, &n, " attention recomputed for", h + g, L - h - g, 0);
    fprintf(out, "%s\n", line);
    const double fwd_rate = cp_machine_attn_tflops(&P->spec.machine, false, P->spec.model.head_dim);
    if (P->flops_attn_saved > 0)
        fprintf(out, "                        the backward skips %.4g TFLOP of attention forward per step (%.2f s at "
                     "%.0f TF/s)\n",
                P->flops_attn_saved / 1e12, P->flops_attn_saved / (fwd_rate * 1e12), fwd_rate);
}

/* The variants of choice c's module into v (kernels.h cp_kvariants); true when an earlier choice has the same kernel
 * and shape (modules that differ only in what that kernel does not depend on, such as dkv_accum, share one line). */
static bool kchoice_repeats(const cp_plan *P, int c, cp_kvariants *v) {
    cp_k_variants(&P->modules[P->kchoices[c].module], v);
    for (int i = 0; i < c; i++) {
        cp_kvariants w;
        cp_k_variants(&P->modules[P->kchoices[i].module], &w);
        if (!strcmp(w.kernel, v->kernel) && !strcmp(w.shape, v->shape)) return true;
    }
    return false;
}

/* One line per kernel with variants: which one runs and where that choice came from. */
/* The checkpoint's snapshot: how a save copies the state out, and what it adds to the node's host memory. */
static void print_snapshot(const cp_plan *P, FILE *out) {
    char a[32], b[32], c[32];
    const cp_train *tr = &P->spec.train;
    if (P->ckpt_snap == CP_SNAP_NONE) return;
    const char *how = P->ckpt_snap == CP_SNAP_PINNED ? "pinned: the GPU copies into it, the files written meanwhile"
                      : P->ckpt_snap == CP_SNAP_IN_PLACE
                          ? "none: the host optimizer's state is written where it is, the loop waiting (no room for a copy)"
                      : P->C == 1 && P->opt_on_host ? "pageable: a memcpy of the host optimizer's state, then written meanwhile"
                      : P->C == 1 ? "pageable, through 64 MiB pinned staging (too little room to pin it)"
                                  : "pageable: the gathers copy into it (too little room to pin it)";
    const char *slots = P->ckpt_slots == 2 ? "2 slots (a save takes the one not being written), " : "";
    fprintf(out, "  %-40s %14s   %s%s%s\n", "checkpoint snapshot (the writing rank)",
            cp_fmt_bytes(P->ckpt_snap_bytes, a, sizeof a), slots, how,
            tr->async_save || P->ckpt_snap == CP_SNAP_IN_PLACE ? "" : " (train.async_save = false: the loop waits for the write)");
    fprintf(out, "  %-40s %14s   of %s\n", "node with the snapshot", cp_fmt_bytes(P->host_node, b, sizeof b),
            cp_fmt_bytes(P->spec.machine.host_mem, c, sizeof c));
}

static void print_kernel_variants(const cp_plan *P, FILE *out) {
    for (int c = 0, n = 0; c < P->nkchoices; c++) {
        cp_kvariants v;
        if (kchoice_repeats(P, c, &v)) continue;
        const cp_kchoice *k = &P->kchoices[c];
        fprintf(out, "  %-9s %s %s: %d %s, %s\n", n++ ? "" : "kernels", v.kernel, v.shape, k->value, v.what, k->note);
    }
}

static void print_stage_table(const cp_plan *P, FILE *out) {
    int C = P->C, shown = 0;
    fprintf(out, "\nUPipe stages: %d per layer, %d query head%s per GPU each; K,V projected and sent once per %d "
                 "stage%s%s\n",
            P->nstages, P->u, P->u > 1 ? "s" : "", P->group_len, P->group_len > 1 ? "s" : "",
            P->repl > 1 ? " (KV heads replicated on several GPUs, their gradients summed)" : "");
    int cols = CP_MIN(C, 8);
    fprintf(out, "  stage  K,V ");
    for (int r = 0; r < cols; r++) fprintf(out, " rank %-11d", r);
    fprintf(out, "%s\n", C > cols ? " ..." : "");
    for (int s = 0; s < P->nstages; s++) {
        if (P->nstages > 12 && s >= 6 && s < P->nstages - 4) {
            if (!shown++) fprintf(out, "  ...\n");
            continue;
        }
        const cp_stage_rank *e0 = &P->stages[s * C];
        fprintf(out, "  %5d  %-4s", s, e0->kv_fresh ? "new" : "kept");
        for (int r = 0; r < cols; r++) {
            const cp_stage_rank *e = &P->stages[s * C + r];
            char cell[64];
            if (e->nq == 1) snprintf(cell, sizeof cell, "q%d", e->q_heads[0]);
            else snprintf(cell, sizeof cell, "q%d-%d", e->q_heads[0], e->q_heads[e->nq - 1]);
            size_t n = strlen(cell);
            if (e->nkv == 1) snprintf(cell + n, sizeof cell - n, " kv%d", e->kv_heads[0]);
            else snprintf(cell + n, sizeof cell - n, " kv%d-%d", e->kv_heads[0], e->kv_heads[e->nkv - 1]);
            fprintf(out, " %-16s", cell);
        }
        fprintf(out, "\n");
    }
}

/* Seconds as "1.23 s" or "4.56 ms". */
static const char *fmt_seconds(double t, char *buf, size_t n) {
    if (t >= 1) snprintf(buf, n, "%.2f s", t);
    else snprintf(buf, n, "%.2f ms", t * 1e3);
    return buf;
}

/* Ring step k of position p as a table cell: "j: causal" for the own block j = p, else "j: " and its two half
 * launches, query half Q against key half K as qQkK; with documents the own block's three, the causal ones marked
 * "c". */
static void ring_cell(int R, int p, int k, bool docs, char *cell, size_t n) {
    cp_ring_step st = cp_ring_step_of(R, p, k);
    if (k == 0 && docs) {
        int m = snprintf(cell, n, "%d:", st.source);
        for (int part = 0; part < CP_RING_STEP0_PARTS && m > 0 && (size_t)m < n; part++) {
            cp_ring_half h = cp_ring_half_of(R, p, 0, part);
            m += snprintf(cell + m, n - (size_t)m, " q%dk%d%s", h.q_half, h.k_half,
                          cp_ring_half_causal(0, part) ? "c" : "");
        }
        return;
    }
    if (k == 0) {
        snprintf(cell, n, "%d: causal", st.source);
        return;
    }
    cp_ring_half a = cp_ring_half_of(R, p, k, 0), b = cp_ring_half_of(R, p, k, 1);
    snprintf(cell, n, "%d: q%dk%d q%dk%d", st.source, a.q_half, a.k_half, b.q_half, b.k_half);
}

/* The ring's schedule (gen/ring.h), what it adds per GPU and stage (cp_ring_terms), and what its send/recvs cost;
 * nothing without a ring. */
static void print_ring(const cp_plan *P, FILE *out) {
    const int R = P->ring;
    if (R == 1) return;
    const int64_t L = P->group_tokens, D = P->spec.model.head_dim;
    char a[32], b[32], c[32], d[32], e[32], f[32], g[32], h[32];
    fprintf(out, "\nRing: %d groups share each sequence, cut into %d zigzag chunks of %s tokens; position p holds chunks "
                 "p and %d - p (%s tokens, %s per GPU). Every UPipe stage takes %d ring steps: at step k position p "
                 "attends to the K/V block of position (p - k) mod %d, its own causal, a received one in two "
                 "half-block launches with no mask (qQkK: query half Q against key half K)%s\n",
            R, 2 * R, cp_fmt_length(L / 2, a, sizeof a), 2 * R - 1, cp_fmt_length(L, b, sizeof b),
            cp_fmt_length(P->T, c, sizeof c), R, R,
            P->docs ? "; with documents masked the own block in three, its diagonal halves causal (c), every launch "
                      "masked at its halves' positions in the sequence" : "");
    int shown = 0, cols = CP_MIN(R, 8);
    fprintf(out, "  position  chunks  ");
    const int w = P->docs ? 21 : 16; /* a cell's width: step 0's three launches with documents */
    for (int k = 0; k < cols; k++) fprintf(out, " step %-*d", w - 5, k);
    fprintf(out, "%s\n", R > cols ? " ..." : "");
    for (int p = 0; p < R; p++) {
        if (R > 12 && p >= 6 && p < R - 4) {
            if (!shown++) fprintf(out, "  ...\n");
            continue;
        }
        char chunks[32];
        snprintf(chunks, sizeof chunks, "%d, %d", p, 2 * R - 1 - p);
        fprintf(out, "  %8d  %-8s", p, chunks);
        for (int k = 0; k < cols; k++) {
            char cell[40];
            ring_cell(R, p, k, P->docs, cell, sizeof cell);
            fprintf(out, " %-*s", w, cell);
        }
        fprintf(out, "\n");
    }
    cp_ring_terms t;
    cp_ring_terms_of(R, L, P->u, P->kvr, D, &t);
    fprintf(out, "  per GPU and stage: K/V block %s, receive buffers %s | merged output %s, a launch's LSE %s | "
                 "dK, dV accumulator %s, 2 receive buffers %s, a step's own %s | a half launch's dQ %s\n",
            cp_fmt_bytes(t.kv_block, a, sizeof a), cp_fmt_bytes(t.kv_recv, b, sizeof b),
            cp_fmt_bytes(t.o_acc, c, sizeof c), cp_fmt_bytes(t.lse_blk, d, sizeof d),
            cp_fmt_bytes(t.dkv_block, e, sizeof e), cp_fmt_bytes(t.dkv_recv, f, sizeof f),
            cp_fmt_bytes(t.dkv_step, g, sizeof g), cp_fmt_bytes(t.dq_half, h, sizeof h));
    const char *blocks = R > 2 ? "blocks" : "block";
    fprintf(out, "  sent per GPU and stage: %s forward (%d %s), %s backward (%d %s, %d accumulator hops) at %.0f GB/s; "
                 "per step %s of send/recv, %s of it not under the attention on the block in hand\n",
            cp_fmt_bytes(t.fwd_sent, a, sizeof a), R - 1, blocks, cp_fmt_bytes(t.bwd_sent, b, sizeof b), R - 1, blocks, R,
            P->spec.machine.net_gbps, fmt_seconds(P->t_ring, c, sizeof c),
            fmt_seconds(P->t_ring_exposed, d, sizeof d));
}

void cp_plan_print(const cp_plan *P, FILE *out, bool verbose) {
    const cp_spec *sp = &P->spec;
    const cp_model *m = &sp->model;
    const cp_parallel *par = &sp->parallel;
    const cp_machine *mc = &sp->machine;
    char a[32], b[32], c[32], d[32];
    fprintf(out, "cpgen %s plan: %s\n", CP_VERSION, sp->path);
    fprintf(out, "  model     %s | %s parameters | hidden %lld | layers %lld | heads %lld (%lld KV, GQA %lld) | "
                 "head_dim %lld | ffn %lld | vocab %lld | %s%s\n",
            cp_family_name(m->family), cp_fmt_count((double)P->params_total, a, sizeof a), (long long)m->hidden,
            (long long)m->layers, (long long)m->heads, (long long)m->kv_heads, (long long)(m->heads / m->kv_heads),
            (long long)m->head_dim, (long long)m->ffn, (long long)m->vocab, m->tie_embeddings ? "tied" : "untied",
            m->qk_norm ? " | qk-norm" : "");
    char ck[64];
    if (par->checkpoint == CP_CKPT_NONE) snprintf(ck, sizeof ck, "none");
    else if (P->ckpt_every == 1) snprintf(ck, sizeof ck, "every layer");
    else snprintf(ck, sizeof ck, "every %d layers (%lld kept)", P->ckpt_every,
                  (long long)((m->layers + P->ckpt_every - 1) / P->ckpt_every));
    fprintf(out, "  parallel  %d GPU%s | seq %s (%s per GPU) x %d micro-batch%s | UPipe U=%d%s | checkpoint %s | "
                 "checkpoints on host: %d of %lld layers | optimizer on %s\n",
            P->C, P->C > 1 ? "s" : "", cp_fmt_length(P->S, a, sizeof a), cp_fmt_length(P->T, b, sizeof b),
            sp->train.micro_batches, sp->train.micro_batches > 1 ? "es" : "", P->U,
            P->U == m->heads ? (par->upipe_auto ? " (plain Ulysses, auto)" : " (plain Ulysses)")
                             : (par->upipe_auto ? " (auto)" : ""),
            ck, P->ckpt_host_layers, (long long)m->layers, P->opt_on_host ? "host" : "GPU");
    if (P->replicas * P->ring > 1) {
        fprintf(out, "  groups    %d replica%s x ring %d x %d GPU%s = %d GPUs | group g of the replicas reads sequences "
                     "g, g + %d, ... | parameters sharded in a group, gradient shards all-reduced over %d groups "
                     "(%.0f GB/s between nodes)",
                P->replicas, P->replicas > 1 ? "s" : "", P->ring, P->C, P->C > 1 ? "s" : "",
                P->replicas * P->ring * P->C, P->replicas, P->replicas * P->ring, mc->net_gbps);
        if (P->ring > 1)
            fprintf(out, " | ring: %s tokens per group in 2 zigzag chunks, K,V passed around %d groups",
                    cp_fmt_length(P->S / P->ring, a, sizeof a), P->ring);
        fprintf(out, "\n");
    }
    int world = P->replicas * P->ring * P->C, share = cp_plan_ranks_per_gpu(P);
    if (share > 1)
        fprintf(out, "  ranks     %d ranks on %d GPU%s, %d to a GPU, each its own NCCL host talking over sockets: "
                     "the numbers and each rank's memory are the %d-GPU run's, the speed is not\n",
                world, (world + share - 1) / share, world > share ? "s" : "", share, world);
    if (P->docs) {
        fprintf(out, "  documents masked (data.documents = \"mask\"): attention stays inside each document of %s and "
                     "computes only the tiles that reach one; RoPE positions %s; memory planned for one document (the "
                     "most work), ", P->spec.data.source,
                P->doc_positions ? "restart at each document" : "run over the sequence");
        if (P->spec.data.doc_len > 0)
            fprintf(out, "time for documents of %s tokens (data.doc_len, or the data's mean): attention %.1f%% of causal\n",
                    cp_fmt_length(P->spec.data.doc_len, a, sizeof a), 100 * P->attn_work);
        else
            fprintf(out, "time too (no data.doc_len, --doc-len)\n");
    }
    long long nm = P->T / P->mlp_tile, nl = P->T / P->loss_tile;
    fprintf(out, "  tiles     MLP %s tokens (%lld tile%s) | loss %s tokens (%lld tile%s)\n",
            cp_fmt_length(P->mlp_tile, a, sizeof a), nm, nm == 1 ? "" : "s", cp_fmt_length(P->loss_tile, b, sizeof b),
            nl, nl == 1 ? "" : "s");
    print_kernel_variants(P, out);
    const int64_t D = P->spec.model.head_dim;
    fprintf(out, "  machine   GPU %s | host %s | bf16 GEMM %.0f TF/s | attention fwd %.0f, bwd %.0f TF/s | "
                 "HBM %.0f GB/s | host link %.0f GB/s | all-to-all %.0f GB/s | all-gather %.0f GB/s\n",
            cp_fmt_bytes(mc->gpu_mem, a, sizeof a), cp_fmt_bytes(mc->host_mem, b, sizeof b), mc->gemm_tflops,
            cp_machine_attn_tflops(mc, false, D), cp_machine_attn_tflops(mc, true, D), mc->hbm_gbps, mc->host_gbps,
            mc->a2a_gbps, mc->allgather_gbps);
    print_attention_output(P, out);
    print_stage_table(P, out);
    print_ring(P, out);

    fprintf(out, "\nGPU memory per GPU                         %14s %14s\n", "all buffers", "live at peak");
    for (int k = 0; k < CP_CAT_COUNT; k++) {
        if (!P->cat_bytes[k]) continue;
        fprintf(out, "  %-40s %14s %14s\n", cat_names[k], cp_fmt_bytes(P->cat_bytes[k], a, sizeof a),
                cp_fmt_bytes(P->cat_at_peak[k], b, sizeof b));
    }
    int64_t total = 0;
    for (int k = 0; k < CP_CAT_COUNT; k++) total += P->cat_bytes[k];
    const cp_step *ps = &P->steps[P->peak_step < P->nsteps ? P->peak_step : 0];
    fprintf(out, "  %-40s %14s %14s   (at step %lld: %s %s, layer %d)\n", "sum", cp_fmt_bytes(total, a, sizeof a),
            cp_fmt_bytes(P->gpu_live_peak, b, sizeof b), (long long)cp_plan_flat_index(P, P->peak_step),
            cp_phase_name(ps->phase), ps->what, ps->layer);
    fprintf(out, "  %-40s %14s   (buffers whose lifetimes do not overlap share bytes)\n", "arena",
            cp_fmt_bytes(P->gpu_arena, a, sizeof a));
    fprintf(out, "  %-40s %14s\n", "reserve: CUDA context, modules, libraries", cp_fmt_bytes(mc->reserve, a, sizeof a));
    if (cp_plan_reserve(P) > mc->reserve)
        fprintf(out, "  %-40s %14s\n", share > 1 ? "reserve: NCCL over sockets" : "reserve: NCCL buffers",
                cp_fmt_bytes(cp_plan_comm_reserve(P), a, sizeof a));
    if (share > 1)
        fprintf(out, "  %-40s %14s   x %d ranks sharing a GPU = %s of %s\n", "peak per rank",
                cp_fmt_bytes(P->gpu_peak, a, sizeof a), share, cp_fmt_bytes(P->gpu_peak * share, c, sizeof c),
                cp_fmt_bytes(mc->gpu_mem, b, sizeof b));
    else
        fprintf(out, "  %-40s %14s   of %s\n", "peak", cp_fmt_bytes(P->gpu_peak, a, sizeof a),
                cp_fmt_bytes(mc->gpu_mem, b, sizeof b));
    fprintf(out, "host memory per GPU\n");
    for (int k = 0; k < CP_CAT_COUNT; k++)
        if (P->cat_host_bytes[k])
            fprintf(out, "  %-40s %14s\n", cat_names[k], cp_fmt_bytes(P->cat_host_bytes[k], a, sizeof a));
    fprintf(out, "  %-40s %14s\n", "arena (pinned)", cp_fmt_bytes(P->host_arena, a, sizeof a));
    fprintf(out, "  %-40s %14s\n", "weights while loading (fp32, freed)", cp_fmt_bytes(P->host_load, a, sizeof a));
    fprintf(out, "  %-40s %14s   (%s of it resident beside the arena during steps)\n",
            "reserve: driver, libraries, buffers", cp_fmt_bytes(mc->host_reserve, a, sizeof a),
            cp_fmt_bytes(mc->host_runtime, b, sizeof b));
    fprintf(out, "  %-40s %14s   x %d ranks of a node = %s of %s\n", "peak", cp_fmt_bytes(P->host_peak, a, sizeof a),
            cp_plan_node_ranks(P), cp_fmt_bytes(P->host_peak * cp_plan_node_ranks(P), b, sizeof b),
            cp_fmt_bytes(mc->host_mem, c, sizeof c));
    print_snapshot(P, out);

    double flops = P->flops_attn + P->flops_other;
    double tok = tokens_per_step(P) / P->C;
    fprintf(out, "\nwork per optimizer step, per GPU: %.4g TFLOP (attention %.4g, other %.4g); %lld steps, %d kernel "
                 "modules\n",
            flops / 1e12, P->flops_attn / 1e12, P->flops_other / 1e12, (long long)cp_plan_flat_steps(P), P->nmodules);
    char t[6][24];
    const double ts[6] = {P->t_step, P->t_compute, P->t_attn, P->t_comm_exposed, P->t_comm, P->t_copy};
    for (int k = 0; k < 6; k++) fmt_seconds(ts[k], t[k], sizeof t[k]);
    fprintf(out, "predicted step: %s = compute %s (attention %s) + exposed communication %s (all communication %s, "
                 "host copies %s)\n",
            t[0], t[1], t[2], t[3], t[4], t[5]);
    fprintf(out, "predicted rate: %s tokens/s per GPU | %.0f TF/s per GPU | %.0f%% MFU of %.0f TF/s\n",
            cp_fmt_count(tok / P->t_step, d, sizeof d), flops / P->t_step / 1e12,
            100.0 * flops / P->t_step / (mc->peak_tflops * 1e12), mc->peak_tflops);
    if (P->spec.train.fp8) {
        int64_t n = 0, all = 0, fused = 0, own = 0; /* fused: the amaxes and copies their producers make */
        bool fast_fwd = false, fast_dx = false;      /* which GEMMs the plan sums without promotion */
        for (int i = 0; i < P->nsteps; i++) {
            const cp_step *s = &P->steps[i];
            int64_t reps = cp_plan_step_repeats(P, i);
            fused += s->nfp8_out * reps;
            if (s->kind == CP_OP_GEMM) {
                all += reps;
                n += s->gemm.a_type != CP_GEMM_BF16 ? reps : 0;
                own += s->module >= 0 ? reps : 0;
                fast_fwd |= s->gemm.fast_accum && !s->gemm.a_grad;
                fast_dx |= s->gemm.fast_accum && s->gemm.a_grad;
            }
        }
        fmt_seconds(P->t_fp8_casts, t[0], sizeof t[0]);
        const int scaling = P->spec.train.fp8_scaling;
        const bool blk = scaling == CP_FP8_SCALING_BLOCK, tensor = scaling == CP_FP8_SCALING_TENSOR;
        const cp_train *tr = &P->spec.train;
        char rate[192];
        if (blk && !tr->fp8_bf16_wgrad)
            snprintf(rate, sizeof rate, "%.0f TF/s, the weights' gradients at %.0f", mc->fp8_block_gemm_tflops,
                     mc->fp8_block_wgrad_tflops);
        else if (blk) snprintf(rate, sizeof rate, "%.0f TF/s", mc->fp8_block_gemm_tflops);
        else if (!fast_fwd && !fast_dx) snprintf(rate, sizeof rate, "%.0f TF/s", mc->fp8_gemm_tflops);
        else
            snprintf(rate, sizeof rate, "%.0f TF/s, %.0f summed without promotion (%s)", mc->fp8_gemm_tflops,
                     mc->fp8_gemm_fast_tflops,
                     fast_fwd && fast_dx ? "the forward's and dX's" : fast_fwd ? "the forward's" : "dX's");
        const size_t l = strlen(rate);
        snprintf(rate + l, sizeof rate - l, "%s%s", tr->fp8_bf16_wgrad ? ", the weights' gradients in bf16" : "",
                 tr->fp8_bf16_dgrad ? ", the inputs' gradients in bf16" : "");
        fprintf(out, "precision: fp8: %lld of the %lld GEMMs of a micro-batch on FP8 inputs (%s scales) at %s (the "
                     "layers'; the LM head's stay bf16); their %s %s of the step, %lld of the %s made by the kernels "
                     "that write their inputs\n",
                (long long)n, (long long)all, blk ? "block" : tensor ? "per-tensor" : "row", rate,
                tensor ? "amax and casts" : "copies", t[0], (long long)fused, tensor ? "amaxes" : "copies");
        if (own)
            fprintf(out, "           %lld of them on the generator's FP8 GEMM kernel (train.fp8_gemm), at %.0f TF/s, the "
                         "weights' gradients at %.0f\n",
                    (long long)own, mc->fp8_cpgen_gemm_tflops, mc->fp8_cpgen_wgrad_tflops);
        if (P->fp8_weights_once)
            fprintf(out, "           every layer's weights cast both ways once a micro-batch, their copies kept (%s)\n",
                    cp_fmt_bytes(P->fp8_weights_bytes, a, sizeof a));
    }
    cp_plan_eval_print(P, out);
    if (P->fits)
        fprintf(out, "fits: yes (%s free per GPU)\n", cp_fmt_bytes(mc->gpu_mem - P->gpu_peak * share, a, sizeof a));
    else fprintf(out, "fits: NO: %s\n", P->why);

    if (!verbose) return;
    fprintf(out, "\nsteps (one micro-batch, then the optimizer)\n");
    for (int i = 0, lp = 0; i < P->nsteps; i++) {
        const cp_step *s = &P->steps[i];
        if (lp < P->nloops && P->loops[lp].first == i) { /* a folded plan: the body once, with its count */
            fprintf(out, "  the next %d steps run for each of %lld tiles, from tile %d:\n", P->loops[lp].nsteps,
                    (long long)P->loops[lp].count, s->tile);
            lp++;
        }
        fprintf(out, "  %6lld %-9s L%-3d", (long long)cp_plan_flat_index(P, i), cp_phase_name(s->phase), s->layer);
        if (s->stage >= 0) fprintf(out, " s%-3d", s->stage);
        else fprintf(out, "     ");
        if (s->tile >= 0) fprintf(out, " t%-4d", s->tile);
        else fprintf(out, "      ");
        fprintf(out, " %-14s %-16s", cp_opkind_name(s->kind), s->what);
        if (s->module >= 0 && s->role[0]) fprintf(out, " (%s)", s->role); /* the kernel's entry */
        if (s->kind == CP_OP_GEMM)
            fprintf(out, " %lldx%lldx%lld", (long long)s->gemm.m, (long long)s->gemm.n, (long long)s->gemm.k);
        for (int j = 0; j < s->nops; j++) {
            const cp_operand *o = &s->ops[j];
            bool unwritten = false; /* an output the kernel leaves unwritten, writing its FP8 copy alone */
            for (int k = 0; k < s->nfp8_out; k++) unwritten |= s->fp8_out[k].copy_only && s->fp8_out[k].out == j;
            fprintf(out, " %s%s%s", o->access == CP_READ ? "" : o->access == CP_RW ? "~" : ">", P->bufs[o->buf].name,
                    unwritten ? "[copy only]" : "");
        }
        fprintf(out, "  %.0f us\n", s->seconds * 1e6);
    }
    fprintf(out, "\nbuffers live at the peak (step %lld)\n", (long long)cp_plan_flat_index(P, P->peak_step));
    for (int i = 0; i < P->nbufs; i++) {
        const cp_buffer *b = &P->bufs[i];
        if (b->space != CP_SPACE_GPU) continue;
        for (int k = 0; k < b->nlive; k++)
            if (b->live[k].start <= P->peak_step && P->peak_step <= b->live[k].end)
                fprintf(out, "  %-22s %14s  %s\n", b->name, cp_fmt_bytes(b->bytes, a, sizeof a), cat_keys[b->cat]);
    }
    fprintf(out, "\nbuffers\n");
    for (int i = 0; i < P->nbufs; i++) {
        const cp_buffer *b = &P->bufs[i];
        fprintf(out, "  %-22s %-4s %14s at %14lld  %s, %d lifetime%s\n", b->name,
                b->space == CP_SPACE_GPU ? "gpu" : "host", cp_fmt_bytes(b->bytes, a, sizeof a), (long long)b->offset,
                cat_keys[b->cat], b->nlive, b->nlive == 1 ? "" : "s");
    }
}

static void json_str(FILE *out, const char *s) {
    fputc('"', out);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(out, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(out, "\\u%04x", *s);
        else fputc(*s, out);
    }
    fputc('"', out);
}

/* "ring": the schedule of every position (step k: the source block, the own one causal, a received one as its two
 * half launches [query half, key half]), the terms per GPU and stage, and the send/recv time per step; only with a
 * ring. */
static void print_ring_json(const cp_plan *P, FILE *out) {
    const int R = P->ring;
    if (R == 1) return;
    fprintf(out, "  \"ring\": {\"positions\": %d, \"group_tokens\": %lld, \"chunk_tokens\": %lld, \"schedule\": [", R,
            (long long)P->group_tokens, (long long)(P->group_tokens / 2));
    for (int p = 0; p < R; p++) {
        fprintf(out, "%s[", p ? ", " : "");
        fprintf(out, "{\"source\": %d, \"causal\": true", p); /* step 0: the own block */
        if (P->docs) /* in half launches: the diagonal ones causal (gen/ring.h) */
            for (int part = 0; part < CP_RING_STEP0_PARTS; part++) {
                cp_ring_half h = cp_ring_half_of(R, p, 0, part);
                fprintf(out, "%s[%d, %d]%s", part ? ", " : ", \"halves\": [", h.q_half, h.k_half,
                        part + 1 < CP_RING_STEP0_PARTS ? "" : "]");
            }
        fprintf(out, "}");
        for (int k = 1; k < R; k++) {
            cp_ring_half a = cp_ring_half_of(R, p, k, 0), b = cp_ring_half_of(R, p, k, 1);
            fprintf(out, ", {\"source\": %d, \"halves\": [[%d, %d], [%d, %d]]}", cp_ring_step_of(R, p, k).source,
                    a.q_half, a.k_half, b.q_half, b.k_half);
        }
        fprintf(out, "]");
    }
    cp_ring_terms t;
    cp_ring_terms_of(R, P->group_tokens, P->u, P->kvr, P->spec.model.head_dim, &t);
    fprintf(out, "],\n    \"per_stage\": {\"kv_block\": %lld, \"kv_recv\": %lld, \"o_acc\": %lld, \"lse_blk\": %lld, "
                 "\"dkv_block\": %lld, \"dkv_recv\": %lld, \"dkv_step\": %lld, \"dq_half\": %lld, \"fwd_sent\": %lld, "
                 "\"bwd_sent\": %lld},\n    \"sendrecv_seconds\": %.6g, \"sendrecv_exposed_seconds\": %.6g},\n",
            (long long)t.kv_block, (long long)t.kv_recv, (long long)t.o_acc, (long long)t.lse_blk,
            (long long)t.dkv_block, (long long)t.dkv_recv, (long long)t.dkv_step, (long long)t.dq_half,
            (long long)t.fwd_sent, (long long)t.bwd_sent, P->t_ring, P->t_ring_exposed);
}

void cp_plan_print_json(const cp_plan *P, FILE *out) {
    const cp_spec *sp = &P->spec;
    const cp_model *m = &sp->model;
    fprintf(out, "{\n  \"version\": \"%s\",\n  \"spec\": ", CP_VERSION);
    json_str(out, sp->path);
    fprintf(out, ",\n  \"model\": {\"family\": \"%s\", \"params\": %lld, \"hidden\": %lld, \"layers\": %lld, "
                 "\"heads\": %lld, \"kv_heads\": %lld, \"head_dim\": %lld, \"ffn\": %lld, \"vocab\": %lld, "
                 "\"tie_embeddings\": %s, \"qk_norm\": %s, \"norm_eps\": %.17g, \"rope_theta\": %.17g",
            cp_family_name(m->family), (long long)P->params_total, (long long)m->hidden, (long long)m->layers,
            (long long)m->heads, (long long)m->kv_heads, (long long)m->head_dim, (long long)m->ffn,
            (long long)m->vocab, m->tie_embeddings ? "true" : "false", m->qk_norm ? "true" : "false", m->norm_eps,
            m->rope_theta);
    const cp_rope_scaling *rs = &m->rope_scaling;
    if (rs->enabled)
        fprintf(out, ", \"rope_scaling\": {\"factor\": %.17g, \"low_freq\": %.17g, \"high_freq\": %.17g, "
                     "\"original_max\": %lld}",
                rs->factor, rs->low_freq, rs->high_freq, (long long)rs->original_max);
    fprintf(out, "},\n");
    fprintf(out, "  \"parallel\": {\"gpus\": %d, \"seq_len\": %lld, \"tokens_per_gpu\": %lld, \"micro_batches\": %d, "
                 "\"upipe_heads\": %d, \"stages\": %d, \"q_heads_per_gpu_stage\": %d, \"kv_heads_per_gpu_stage\": %d, "
                 "\"kv_replication\": %d, \"gqa_group_stages\": %d, \"mlp_tile\": %lld, \"loss_tile\": %lld, "
                 "\"ckpt_host_layers\": %d, \"checkpoint_every\": %d, \"optimizer_on_host\": %s},\n",
            P->C, (long long)P->S, (long long)P->T, sp->train.micro_batches, P->U, P->nstages, P->u, P->kvr, P->repl,
            P->group_len, (long long)P->mlp_tile, (long long)P->loss_tile, P->ckpt_host_layers, P->ckpt_every,
            P->opt_on_host ? "true" : "false");
    if (P->replicas * P->ring > 1) /* only for runs of several groups: one group's JSON stays as it was */
        fprintf(out, "  \"groups\": {\"replicas\": %d, \"ring\": %d, \"gpus\": %d, \"world\": %d},\n", P->replicas,
                P->ring, P->C, P->replicas * P->ring * P->C);
    if (cp_plan_ranks_per_gpu(P) > 1) /* likewise only where ranks share GPUs */
        fprintf(out, "  \"ranks_per_gpu\": %d,\n", cp_plan_ranks_per_gpu(P));
    print_ring_json(P, out);
    int64_t kept = attn_kept_bytes(P);
    fprintf(out, "  \"attention_output\": {\"mode\": \"%s\", \"host_layers\": %d, \"gpu_layers\": %d, "
                 "\"recompute_layers\": %d, \"bytes_per_layer\": %lld, \"gpu_bytes\": %lld, \"host_bytes\": %lld, "
                 "\"flops_saved\": %.6g, \"where\": [",
            cp_attn_keep_name(sp->parallel.attention_output), P->attn_host_layers, P->attn_gpu_layers,
            (int)m->layers - P->attn_host_layers - P->attn_gpu_layers, (long long)kept,
            (long long)P->cat_bytes[CP_CAT_ATTN_SAVED], (long long)P->cat_host_bytes[CP_CAT_ATTN_SAVED],
            P->flops_attn_saved);
    for (int l = 0; l < m->layers; l++)
        fprintf(out, "%s\"%s\"", l ? ", " : "", cp_attn_keep_name(cp_plan_attn_where(P, l)));
    fprintf(out, "]},\n");
    fprintf(out, "  \"stages\": [");
    for (int s = 0; s < P->nstages; s++) {
        fprintf(out, "%s\n    {\"stage\": %d, \"kv_fresh\": %s, \"ranks\": [", s ? "," : "", s,
                P->stages[s * P->C].kv_fresh ? "true" : "false");
        for (int r = 0; r < P->C; r++) {
            const cp_stage_rank *e = &P->stages[s * P->C + r];
            fprintf(out, "%s{\"q\": [", r ? ", " : "");
            for (int j = 0; j < e->nq; j++) fprintf(out, "%s%d", j ? ", " : "", e->q_heads[j]);
            fprintf(out, "], \"kv\": [");
            for (int j = 0; j < e->nkv; j++) fprintf(out, "%s%d", j ? ", " : "", e->kv_heads[j]);
            fprintf(out, "]}");
        }
        fprintf(out, "]}");
    }
    fprintf(out, "\n  ],\n  \"memory\": {\n    \"gpu\": {");
    for (int k = 0; k < CP_CAT_COUNT; k++) fprintf(out, "%s\"%s\": %lld", k ? ", " : "", cat_keys[k], (long long)P->cat_bytes[k]);
    fprintf(out, "},\n    \"gpu_at_peak\": {");
    for (int k = 0; k < CP_CAT_COUNT; k++)
        fprintf(out, "%s\"%s\": %lld", k ? ", " : "", cat_keys[k], (long long)P->cat_at_peak[k]);
    fprintf(out, "},\n    \"host\": {");
    for (int k = 0; k < CP_CAT_COUNT; k++)
        fprintf(out, "%s\"%s\": %lld", k ? ", " : "", cat_keys[k], (long long)P->cat_host_bytes[k]);
    fprintf(out, "},\n    \"gpu_live_peak\": %lld, \"gpu_arena\": %lld, \"reserve\": %lld, \"gpu_peak\": %lld, "
                 "\"gpu_mem\": %lld, \"host_arena\": %lld, \"host_run\": %lld, \"host_load\": %lld, "
                 "\"host_peak\": %lld, \"host_mem\": %lld, \"host_node\": %lld,\n    \"ckpt_snapshot\": "
                 "{\"kind\": \"%s\", \"slots\": %d, \"bytes\": %lld, \"async\": %s}\n  },\n",
            (long long)P->gpu_live_peak, (long long)P->gpu_arena, (long long)cp_plan_reserve(P),
            (long long)P->gpu_peak, (long long)sp->machine.gpu_mem, (long long)P->host_arena,
            (long long)P->host_run, (long long)P->host_load, (long long)P->host_peak, (long long)sp->machine.host_mem,
            (long long)P->host_node, cp_snap_kind_name(P->ckpt_snap), P->ckpt_slots, (long long)P->ckpt_snap_bytes,
            sp->train.async_save && P->ckpt_snap != CP_SNAP_IN_PLACE && P->ckpt_snap != CP_SNAP_NONE ? "true" : "false");
    double flops = P->flops_attn + P->flops_other;
    fprintf(out, "  \"flops\": {\"attention\": %.6g, \"other\": %.6g, \"total\": %.6g},\n", P->flops_attn,
            P->flops_other, flops);
    fprintf(out, "  \"time\": {\"step\": %.6g, \"compute\": %.6g, \"attention\": %.6g, \"comm\": %.6g, "
                 "\"comm_exposed\": %.6g, \"host_copies\": %.6g, \"fp8_casts\": %.6g, \"tokens_per_s_per_gpu\": "
                 "%.6g},\n",
            P->t_step, P->t_compute, P->t_attn, P->t_comm, P->t_comm_exposed, P->t_copy, P->t_fp8_casts,
            tokens_per_step(P) / P->C / P->t_step);
    fprintf(out, "  \"precision\": \"%s\",\n", sp->train.fp8 ? "fp8" : "bf16");
    /* every layer's FP8 weights cast once a micro-batch and kept (cp_plan.fp8_weights_once), and those copies' bytes */
    fprintf(out, "  \"fp8_weights_once\": {\"kept\": %s, \"bytes\": %lld},\n", P->fp8_weights_once ? "true" : "false",
            (long long)P->fp8_weights_bytes);
    cp_plan_eval_print_json(P, out);
    fprintf(out, "  \"steps\": %lld,\n  \"modules\": [", (long long)cp_plan_flat_steps(P));
    for (int i = 0; i < P->nmodules; i++) {
        fprintf(out, "%s", i ? ", " : "");
        json_str(out, P->modules[i].family);
    }
    fprintf(out, "],\n  \"kernel_variants\": [");
    static const char *sources[] = {"default", "cache", "bundle"};
    for (int c = 0, n = 0; c < P->nkchoices; c++) {
        cp_kvariants v;
        if (kchoice_repeats(P, c, &v)) continue;
        const cp_kchoice *k = &P->kchoices[c];
        fprintf(out, "%s{\"kernel\": ", n++ ? ", " : "");
        json_str(out, v.kernel);
        fprintf(out, ", \"shape\": ");
        json_str(out, v.shape);
        fprintf(out, ", \"param\": ");
        json_str(out, v.param);
        fprintf(out, ", \"value\": %d, \"default\": %d, \"source\": \"%s\", \"note\": ", k->value, v.def,
                sources[k->source]);
        json_str(out, k->note);
        fprintf(out, "}");
    }
    fprintf(out, "],\n  \"fits\": %s,\n  \"why\": ", P->fits ? "true" : "false");
    json_str(out, P->why);
    fprintf(out, "\n}\n");
}

void cp_plan_print_precisions(const cp_plan *P, const cp_plan *other, FILE *out) {
    const cp_plan *b = P->spec.train.fp8 ? other : P, *f = P->spec.train.fp8 ? P : other;
    char tb[24], tf[24], pb[32], pf[32];
    fmt_seconds(b->t_step, tb, sizeof tb);
    fmt_seconds(f->t_step, tf, sizeof tf);
    cp_fmt_bytes(b->gpu_peak, pb, sizeof pb);
    cp_fmt_bytes(f->gpu_peak, pf, sizeof pf);
    fprintf(out, "precisions: bf16 %s a step (%s a GPU), fp8 %s (%s): %.2fx; this plan is %s (train.precision)\n", tb,
            pb, tf, pf, b->t_step / f->t_step, P->spec.train.fp8 ? "fp8" : "bf16");
}
