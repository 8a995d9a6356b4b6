/* test_exec.c: the step executor's reading of plans, without a GPU (cp_exec_check): every step of the shipped specs'
 * one-GPU plans (and tiny's variants: offload, host optimizer, plain Ulysses, micro-batches, no checkpointing,
 * Qwen3's qk-norm, tied embeddings) gets an argument list whose operand sizes and alignment satisfy its kernel's
 * contract, GEMM extents that fit their buffers, and cross-stream waits under which every pair of steps on different
 * streams touching the same bytes is ordered. Plans of several GPUs likewise, seen from rank 0: their collectives
 * (all-to-all, all-gather, reduce-scatter, all-reduce) get operands that match what NCCL will be asked to move, and
 * their layout kernels get token rows and blocks of the right sizes; replica groups' all-reduces across the groups
 * likewise. A checkpoint's snapshot: in every layout only the optimizer's update writes what it copies (so the next
 * step's update alone waits for it), and with the optimizer on the host its memcpy holds back that update and
 * nothing else. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "exec.h"
#include "exec_internal.h"
#include "plan.h"
#include "ranks.h"
#include "ring.h"
#include "snapshot.h"
#include "spec.h"

/* Plans of packed documents masked, their positions per document (test_documents sets it around its checks). */
static bool with_docs;

/* Plan `name` with overrides, check it, print what the executor derived; returns the report. */
static cp_exec_check_report check(const char *name, int nsets, ...) {
    const char *sets[16];
    va_list ap;
    va_start(ap, nsets);
    for (int i = 0; i < nsets; i++) sets[i] = va_arg(ap, const char *);
    va_end(ap);
    cp_spec s;
    char err[CP_ERR_MAX];
    if (cp_spec_load(name, sets, nsets, &s, err, sizeof err)) fail_msg("spec %s: %s", name, err);
    if (with_docs) s.data.documents = CP_DOCS_MASK, s.data.positions = CP_POS_DOCUMENT;
    cp_plan p;
    if (cp_plan_build(&s, &p, err, sizeof err)) fail_msg("plan %s: %s", name, err);
    assert_int_equal(p.docs, with_docs);
    cp_exec_check_report r;
    int rc = cp_exec_check(&p, &r, err, sizeof err);
    printf("  %-8s", name);
    for (int i = 0; i < nsets; i++) printf(" %s", sets[i]);
    printf("\n    %d steps: %d kernel steps (%d launches), %d GEMMs, %d copies, %d memsets; %d cross-stream waits on "
           "%d events, %lld ordered pairs; %d progress markers; host arena in %d pieces\n",
           r.steps, r.kernels, r.launches, r.gemms, r.copies, r.memsets, r.waits, r.events, (long long)r.ordered_pairs,
           r.markers, r.pin_pieces);
    if (rc) fail_msg("%s: %s", name, err);
    cp_plan_free(&p);
    return r;
}

static void test_tiny(void **state) {
    (void)state;
    cp_exec_check_report r = check("tiny", 1, "parallel.upipe_heads=4");
    assert_int_equal(r.waits, 0); /* one stream: nothing to wait for */
    assert_true(r.gemms > 0 && r.kernels > 0);
    check("tiny", 0);
    check("tiny", 1, "parallel.upipe_heads=2");
    check("tiny", 1, "train.micro_batches=3");
    check("tiny", 1, "parallel.checkpoint=none");
    check("tiny", 2, "parallel.mlp_tile=512", "parallel.loss_tile=256");
}

/* Checkpoints on the host: offload on the copy stream, prefetch back; the waits must order them with compute. */
static void test_offload_and_host_optimizer(void **state) {
    (void)state;
    cp_exec_check_report r = check("tiny", 2, "parallel.offload=all", "parallel.upipe_heads=4");
    assert_true(r.waits > 0);
    assert_true(r.ordered_pairs > 0);
    check("tiny", 1, "parallel.offload=all");
    r = check("tiny", 3, "parallel.offload=all", "parallel.optimizer=host", "parallel.upipe_heads=4");
    assert_true(r.pin_pieces >= 1);
    check("tiny", 3, "parallel.offload=all", "train.micro_batches=2", "parallel.upipe_heads=4");
}

/* The shipped model shapes on one GPU, truncated to two layers and a short sequence. */
static void test_shipped_shapes(void **state) {
    (void)state;
    check("llama1b", 4, "parallel.gpus=1", "model.layers=2", "train.seq_len=4K", "parallel.upipe_heads=8");
    check("llama3b", 3, "parallel.gpus=1", "model.layers=2", "train.seq_len=4K");
    check("llama8b", 4, "parallel.gpus=1", "model.layers=2", "train.seq_len=8K", "parallel.offload=all");
    check("qwen32b", 3, "parallel.gpus=1", "model.layers=1", "train.seq_len=4K");
    check("llama3b", 5, "parallel.gpus=1", "model.layers=5", "train.seq_len=4K", "parallel.checkpoint_every=2",
          "parallel.offload=none");
    check("tiny", 3, "parallel.checkpoint_every=2", "parallel.offload=none", "train.micro_batches=2");
}

/* Plans of 2 and 4 GPUs: Ulysses and UPipe stages, GQA groups split across ranks, KV heads fewer than GPUs
 * (replicated, their gradients summed by unpack_add), gradient accumulation over micro-batches (grad_accum before
 * each reduce-scatter). */
static void test_parallel(void **state) {
    (void)state;
    cp_exec_check_report r = check("tiny", 1, "parallel.gpus=2");
    assert_true(r.steps > 0 && r.waits > 0);
    check("tiny", 2, "parallel.gpus=2", "parallel.upipe_heads=2");
    check("tiny", 2, "parallel.gpus=4", "parallel.upipe_heads=4"); /* 2 KV heads on 4 GPUs */
    check("tiny", 2, "parallel.gpus=2", "train.micro_batches=3");
    check("tiny", 2, "parallel.gpus=2", "parallel.optimizer=host"); /* the norm on the GPU, summed across ranks */
    check("tiny", 3, "parallel.gpus=2", "model.family=qwen3", "model.tie_embeddings=true");
    check("llama3b", 3, "parallel.gpus=2", "model.layers=2", "train.seq_len=8K"); /* GQA 3 */
    check("llama8b", 4, "parallel.gpus=2", "model.layers=2", "train.seq_len=8K", "parallel.upipe_heads=2");
    check("llama8b", 4, "parallel.gpus=8", "model.layers=2", "train.seq_len=64K", "parallel.upipe_heads=8");
    check("llama8b", 4, "parallel.gpus=8", "model.layers=2", "train.seq_len=64K", "parallel.upipe_heads=32");
    /* sparse checkpoints: the segments' forward again, with their weights gathered again */
    check("llama1b", 5, "parallel.gpus=2", "model.layers=5", "train.seq_len=8K", "parallel.checkpoint_every=2",
          "parallel.offload=none");
}

/* attention_output: each explicit mode on every shipped shape (cut to a few layers), with 1, 2 and 8 GPUs, UPipe
 * U = C, KV heads fewer than GPUs, sparse checkpoints, offloaded checkpoints, the host optimizer and micro-batches.
 * The kept outputs (and the copies of host-kept ones) must be ordered with every step that touches their bytes. */
static void test_attention_output(void **state) {
    (void)state;
    static const char *const modes[] = {"parallel.attention_output=gpu", "parallel.attention_output=host",
                                        "parallel.attention_output=recompute"};
    for (int k = 0; k < 3; k++) {
        const char *m = modes[k];
        check("tiny", 1, m);
        check("tiny", 3, m, "parallel.upipe_heads=1", "train.micro_batches=2");
        check("tiny", 3, m, "parallel.offload=all", "parallel.optimizer=host");
        check("tiny", 4, m, "parallel.checkpoint_every=2", "parallel.offload=none", "train.micro_batches=2");
        check("tiny", 3, m, "parallel.gpus=2", "parallel.upipe_heads=2");
        check("tiny", 3, m, "parallel.gpus=4", "parallel.upipe_heads=4"); /* 2 KV heads on 4 GPUs */
        check("tiny", 4, m, "parallel.gpus=2", "parallel.optimizer=host", "train.micro_batches=2");
        check("llama1b", 5, m, "parallel.gpus=1", "model.layers=2", "train.seq_len=4K", "parallel.upipe_heads=8");
        check("llama3b", 4, m, "parallel.gpus=1", "model.layers=2", "train.seq_len=4K");
        check("llama3b", 6, m, "parallel.gpus=1", "model.layers=5", "train.seq_len=4K", "parallel.checkpoint_every=2",
              "parallel.offload=none");
        check("llama3b", 4, m, "parallel.gpus=2", "model.layers=2", "train.seq_len=8K");
        check("llama8b", 5, m, "parallel.gpus=1", "model.layers=2", "train.seq_len=8K", "parallel.offload=all");
        check("llama8b", 5, m, "parallel.gpus=8", "model.layers=2", "train.seq_len=64K", "parallel.upipe_heads=8");
        check("llama1b", 6, m, "parallel.gpus=2", "model.layers=5", "train.seq_len=8K", "parallel.checkpoint_every=2",
              "parallel.offload=none");
        check("qwen32b", 4, m, "parallel.gpus=1", "model.layers=1", "train.seq_len=4K");
        check("qwen32b", 5, m, "parallel.gpus=8", "model.layers=2", "train.seq_len=32K", "parallel.upipe_heads=8");
    }
    /* "auto" where memory is short: the first layers on the host, the next on the GPU (3B, 6 layers, 32K tokens, a
     * GPU of 21,000 MiB) */
    cp_exec_check_report r = check("llama3b", 7, "parallel.gpus=1", "model.layers=6", "train.seq_len=32K",
                                   "machine.gpu_mem=21000M", "parallel.optimizer=gpu", "parallel.offload=none",
                                   "parallel.checkpoint_every=1");
    assert_true(r.copies > 0);
}

/* Replica groups (hybrid sharding): each unit's shard all-reduced across the groups after its reduce-scatter, in
 * the last micro-batch only, and the loss summed over them, on the shipped shapes with groups of 1, 2 and 8 GPUs;
 * their collectives get the shard's bytes and waits that order them with every step touching those bytes. */
static void test_replicas(void **state) {
    (void)state;
    cp_exec_check_report one = check("tiny", 1, "parallel.upipe_heads=4");
    cp_exec_check_report two = check("tiny", 2, "parallel.upipe_heads=4", "parallel.replicas=2");
    /* one GPU per group: a shard all-reduce per unit (embedding, 2 layers, final norm and head) and the loss's */
    assert_int_equal(two.steps, one.steps + 4 + 1);
    assert_true(two.waits > 0 && two.ordered_pairs > 0); /* the all-reduces run on the comm stream */
    check("tiny", 3, "parallel.replicas=2", "train.micro_batches=3", "parallel.upipe_heads=2");
    check("tiny", 3, "parallel.replicas=3", "parallel.offload=all", "parallel.optimizer=host");
    cp_exec_check_report g2 = check("tiny", 1, "parallel.gpus=2");
    cp_exec_check_report r2 = check("tiny", 2, "parallel.gpus=2", "parallel.replicas=2");
    assert_int_equal(r2.steps, g2.steps + 4 + 1);
    check("tiny", 3, "parallel.gpus=2", "parallel.replicas=2", "train.micro_batches=2");
    /* a tied LM head: the embedding's shard all-reduced once, after its own backward, not also after the head's */
    cp_exec_check_report t1 = check("tiny", 3, "parallel.gpus=2", "model.family=qwen3", "model.tie_embeddings=true");
    cp_exec_check_report t2 = check("tiny", 4, "parallel.gpus=2", "parallel.replicas=2", "model.family=qwen3",
                                    "model.tie_embeddings=true");
    assert_int_equal(t2.steps, t1.steps + 4 + 1);
    t1 = check("tiny", 2, "model.family=qwen3", "model.tie_embeddings=true");
    t2 = check("tiny", 3, "parallel.replicas=2", "model.family=qwen3", "model.tie_embeddings=true");
    assert_int_equal(t2.steps, t1.steps + 4 + 1);
    check("llama3b", 4, "parallel.gpus=2", "parallel.replicas=2", "model.layers=2", "train.seq_len=8K");
    check("llama8b", 5, "parallel.gpus=8", "parallel.replicas=2", "model.layers=2", "train.seq_len=64K",
          "parallel.upipe_heads=8");
    check("llama1b", 5, "parallel.gpus=1", "parallel.replicas=2", "model.layers=2", "train.seq_len=4K",
          "parallel.upipe_heads=8");
    check("qwen32b", 5, "parallel.gpus=8", "parallel.replicas=2", "model.layers=2", "train.seq_len=32K",
          "parallel.upipe_heads=8");
}

/* Operand j of step st in ex's made-up arena, `off` bytes into its buffer. */
static uint64_t addr(const cp_exec *ex, const cp_plan *p, const cp_step *st, int j, int64_t off) {
    return (uint64_t)(uintptr_t)cp_exec_buffer(ex, p->bufs[st->ops[j].buf].name) + (uint64_t)off;
}

/* Where the ring communicator (its members in ring order, gen/ranks.c) numbers world rank `who`, seen from `me`. */
static int ring_index(const cp_rank_layout *L, int me, int who) {
    int members[64], color, n = cp_rank_comm(L, me, CP_COMM_RING, &color, members);
    for (int k = 0; k < n; k++)
        if (members[k] == who) return k;
    return -1;
}

/* The global position of the first row of half `half` of ring position `pos` (of R), halves of c tokens: the zigzag
 * puts chunk pos in half 0 and chunk 2R-1-pos in half 1 (written out here rather than taken from gen/ring.c). */
static int64_t half_position(int R, int pos, int half, int64_t c) { return (half ? 2 * R - 1 - pos : pos) * c; }

/* What each rank of a ring of `heads` query heads per GPU and stage prepares, checked against gen/ring.c and
 * gen/ranks.c by the arguments' values: every step prepared; each half-block launch (attention forward and backward), its merge
 * and its dQ sum at the rows and LSE columns of the query and key halves cp_ring_half_of gives the rank's ring
 * position; each RoPE launch at the rows and positions of the rank's run cp_ring_rope_runs gives (none for a second
 * run the rank does not have); each send/recv whole, to the ring's next rank and from its previous one as the ring
 * communicator numbers them. With documents (with_docs) step 0 runs as three half launches too, two of them causal
 * (the diagonal chunks), and every half launch passes the sequence's doc_start and doc_end with the global
 * positions of its query half (this rank's chunk) and key half (the chunk of the block's source position). Returns
 * how many half launches took query half 0 and half 1, over all ranks. */
static void ring_ranks(int halves_seen[2], int heads, const char *name, int nsets, const char *const *sets) {
    cp_spec sp;
    char err[CP_ERR_MAX];
    if (cp_spec_load(name, sets, nsets, &sp, err, sizeof err)) fail_msg("spec %s: %s", name, err);
    if (with_docs) sp.data.documents = CP_DOCS_MASK, sp.data.positions = CP_POS_DOCUMENT;
    cp_plan p;
    if (cp_plan_build(&sp, &p, err, sizeof err)) fail_msg("plan %s: %s", name, err);
    assert_true(p.ring > 1);
    assert_int_equal(p.docs, with_docs);
    assert_int_equal(p.u, heads);
    cp_exec_check_report rep;
    if (cp_exec_check(&p, &rep, err, sizeof err)) fail_msg("%s: %s", name, err);
    const cp_rank_layout L = {p.replicas, p.ring, p.C};
    const int64_t Lg = p.group_tokens, c = Lg / 2, D = p.spec.model.head_dim, u = p.u, kvr = p.kvr;
    const int64_t qrow = u * D * 2, kvrow = kvr * D * 2, kv32 = kvr * D * 4;
    /* half fwd, half bwd, merges, dQ sums, RoPE launches, RoPE launches left out, send/recvs; with documents the
     * half launches of step 0 (forward and backward), the causal ones among them, and the launches whose query and
     * key positions differ */
    int counted[11] = {0};
    for (int w = 0; w < cp_rank_world(&L); w++) {
        cp_rank_place pl = cp_rank_of(&L, w);
        cp_exec_opts o = {.rank = pl.local, .world_rank = w};
        cp_exec *ex;
        if (cp_exec_dry(&ex, &p, &o, err, sizeof err)) fail_msg("%s, rank %d: %s", name, w, err);
        for (int i = 0; i < p.nsteps; i++) {
            const cp_step *st = &p.steps[i];
            cp_exec_prepared x;
            cp_exec_prepared_step(ex, i, &x);
            const uint64_t *a = x.args[0];
            cp_ring_half h = {-1, -1};
            if (st->ring_part >= 0 && st->ring_step >= 0) { /* not a RoPE run: a half launch's */
                assert_true(st->ring_step > 0 || with_docs); /* step 0 in halves only with documents */
                h = cp_ring_half_of(p.ring, pl.ring_pos, st->ring_step, st->ring_part);
            }
            if (!strcmp(st->what, "attn_fwd_half") || !strcmp(st->what, "attn_bwd_half")) {
                const bool fwd = st->what[5] == 'f', causal = st->ring_step == 0 && st->ring_part < 2;
                const char *mod_causal = cp_kspec_get(&p.modules[st->module], "CAUSAL");
                assert_non_null(mod_causal);
                assert_int_equal(atoi(mod_causal), causal);
                if (causal) assert_int_equal(h.q_half, h.k_half); /* a diagonal chunk */
                if (st->ring_step == 0) {
                    assert_true(st->ring_part < 3);
                    counted[7 + !fwd]++;
                }
                const int nargs = fwd ? 5 : 10;
                assert_int_equal(x.nargs[0], nargs + (with_docs ? 4 : 0));
                if (with_docs) { /* doc_start, doc_end, q_pos, k_pos after the launch's usual arguments */
                    const int src = ((pl.ring_pos - st->ring_step) % p.ring + p.ring) % p.ring;
                    const int64_t qp = half_position(p.ring, pl.ring_pos, h.q_half, c),
                                  kp = half_position(p.ring, src, h.k_half, c);
                    assert_int_equal(a[nargs], addr(ex, &p, st, st->nops - 2, 0));
                    assert_int_equal(a[nargs + 1], addr(ex, &p, st, st->nops - 1, 0));
                    assert_true(!strcmp(p.bufs[st->ops[st->nops - 2].buf].name, "doc_start") &&
                                !strcmp(p.bufs[st->ops[st->nops - 1].buf].name, "doc_end"));
                    assert_int_equal(a[nargs + 2], qp);
                    assert_int_equal(a[nargs + 3], kp);
                    if (causal) assert_int_equal(qp, kp);
                    else assert_true(kp < qp); /* every key of a maskless half before every query */
                    if (causal) counted[9]++;
                    if (qp != kp) counted[10]++;
                }
            }
            const int64_t lse0 = (int64_t)st->stage * u * Lg * 4; /* the stage's LSE row */
            if (!strcmp(st->what, "attn_fwd_half")) { /* fwd(q, k, v, o, lse) */
                assert_int_equal(x.launches, 1);
                assert_int_equal(a[0], addr(ex, &p, st, 0, h.q_half * c * qrow));
                assert_int_equal(a[1], addr(ex, &p, st, 1, h.k_half * c * kvrow));
                assert_int_equal(a[2], addr(ex, &p, st, 2, h.k_half * c * kvrow));
                assert_int_equal(a[3], addr(ex, &p, st, 3, h.q_half * c * qrow));
                assert_int_equal(a[4], addr(ex, &p, st, 4, h.q_half * c * 4));
                halves_seen[h.q_half]++;
                counted[0]++;
            } else if (!strcmp(st->what, "attn_bwd_half")) { /* bwd(q, k, v, dout, lse, delta, dq_ws, prog, dk, dv) */
                assert_int_equal(x.launches, 1);
                assert_int_equal(a[0], addr(ex, &p, st, 0, h.q_half * c * qrow));
                assert_int_equal(a[1], addr(ex, &p, st, 1, h.k_half * c * kvrow));
                assert_int_equal(a[2], addr(ex, &p, st, 2, h.k_half * c * kvrow));
                assert_int_equal(a[3], addr(ex, &p, st, 3, h.q_half * c * qrow));
                assert_int_equal(a[4], addr(ex, &p, st, 4, lse0 + h.q_half * c * 4));
                assert_int_equal(a[5], addr(ex, &p, st, 5, h.q_half * c * u * 4));
                assert_int_equal(a[6], addr(ex, &p, st, 6, 0));
                assert_int_equal(a[8], addr(ex, &p, st, 7, h.k_half * c * kv32));
                assert_int_equal(a[9], addr(ex, &p, st, 8, Lg * kv32 + h.k_half * c * kv32));
                counted[1]++;
            } else if (!strcmp(st->what, "attn_merge")) { /* fwd(o_blk, lse_blk, o_acc, lse_acc, n, heads, stride) */
                assert_int_equal(x.launches, 1);
                assert_int_equal(a[0], addr(ex, &p, st, 0, h.q_half * c * qrow));
                assert_int_equal(a[1], addr(ex, &p, st, 1, h.q_half * c * 4));
                assert_int_equal(a[2], addr(ex, &p, st, 2, h.q_half * c * u * D * 4));
                assert_int_equal(a[3], addr(ex, &p, st, 3, lse0 + h.q_half * c * 4));
                assert_true(a[4] == (uint64_t)c && a[5] == (uint64_t)u && a[6] == (uint64_t)Lg);
                counted[2]++;
            } else if (!strcmp(st->what, "ring_add_dq")) { /* add_f32(src, dst, n) */
                assert_int_equal(x.launches, 1);
                assert_int_equal(a[0], addr(ex, &p, st, 0, 0));
                assert_int_equal(a[1], addr(ex, &p, st, 1, h.q_half * c * u * D * 4));
                assert_int_equal(a[2], c * u * D);
                counted[3]++;
            } else if (!strncmp(st->what, "rope_", 5)) { /* fwd/bwd(x, n, heads, pos0) */
                cp_ring_rope_run run[2];
                int runs = cp_ring_rope_runs(p.ring, pl.ring_pos, p.S, p.C, pl.local, run);
                int part = st->ring_part;
                assert_true(part >= 0 && part < 2);
                if (part >= runs) {
                    assert_int_equal(x.launches, 0);
                    counted[5]++;
                    continue;
                }
                assert_int_equal(x.launches, 1);
                assert_int_equal(a[0], addr(ex, &p, st, 0, run[part].row0 * st->heads * D * 2));
                assert_int_equal(a[1], run[part].rows);
                assert_int_equal(a[2], st->heads);
                if (p.doc_positions) /* each row's position, from the rank's first row of the run */
                    assert_int_equal(a[3], addr(ex, &p, st, 1, run[part].row0 * 4));
                else
                    assert_int_equal(a[3], run[part].pos0);
                counted[4]++;
            } else if (st->kind == CP_OP_SENDRECV) {
                assert_int_equal(x.to, ring_index(&L, w, cp_rank_ring_next(&L, w)));
                assert_int_equal(x.from, ring_index(&L, w, cp_rank_ring_prev(&L, w)));
                assert_int_equal(x.to, (pl.ring_pos + 1) % p.ring); /* the ring's members in ring order */
                assert_int_equal(x.from, (pl.ring_pos + p.ring - 1) % p.ring);
                assert_ptr_equal(x.src, (const void *)(uintptr_t)addr(ex, &p, st, 0, 0));
                assert_ptr_equal(x.dst, (const void *)(uintptr_t)addr(ex, &p, st, 1, 0));
                assert_int_equal(x.count, st->count);
                assert_int_equal(st->ops[0].bytes, st->count);
                assert_int_equal(st->ops[1].bytes, st->count);
                counted[6]++;
            } else if (st->kind == CP_OP_KERNEL && st->module >= 0) {
                assert_true(x.launches >= 1); /* every other kernel step has its launch */
            }
        }
        cp_exec_destroy(ex);
    }
    printf("  %-8s", name);
    for (int i = 0; i < nsets; i++) printf(" %s", sets[i]);
    printf("\n    %d ranks: %d half launches forward, %d backward, %d merges and %d dQ sums of them; %d RoPE launches "
           "(%d left out: a second run the rank does not have); %d send/recvs; %d cross-stream waits\n",
           cp_rank_world(&L), counted[0], counted[1], counted[2], counted[3], counted[4], counted[5], counted[6],
           rep.waits);
    if (with_docs)
        printf("    documents: step 0 in %d half launches forward and %d backward, %d causal; %d launches with query "
               "and key positions apart\n", counted[7], counted[8], counted[9], counted[10]);
    assert_true(counted[0] > 0 && counted[0] == counted[1] && counted[0] == counted[3]);
    /* step 0's two diagonal halves start the merge together (one init), its third is merged like a received one */
    assert_int_equal(counted[2], counted[0] - 2 * counted[7] / 3);
    assert_int_equal(counted[7], counted[8]);
    if (with_docs) {
        assert_true(counted[7] > 0 && counted[7] % 3 == 0);
        assert_int_equal(counted[9], 2 * (counted[7] + counted[8]) / 3);
        assert_true(counted[10] > 0);
    } else {
        assert_int_equal(counted[7], 0);
    }
    assert_true(counted[4] > 0 && counted[6] > 0);
    cp_plan_free(&p);
}

/* Ring layouts both ring tests run: ring 2 x 3 GPUs (a rank straddling its group's two chunks: two RoPE runs), and
 * ring 2 with offload, the host optimizer and micro-batches */
static const char *const RING_STRADDLE[] = {"parallel.ring=2", "parallel.gpus=3", "model.heads=3", "model.kv_heads=3",
                                            "parallel.upipe_heads=3", "train.seq_len=3K"};
static const char *const RING_HOST[] = {"parallel.ring=2", "parallel.upipe_heads=1", "parallel.offload=all",
                                        "parallel.optimizer=host", "train.micro_batches=2"};

/* Rings of one query head per GPU and stage run: every rank of ring 2 x 1 GPU and ring 4 x 2 GPUs of tiny, of ring
 * 2 x 3 GPUs (a rank straddling its group's two chunks: two RoPE runs) and of two layers of the 8B shape (ring 2 x 4
 * GPUs) prepares every step at its own ring position. A rank whose group rank disagrees with its place in the run
 * is refused. */
static void test_rings(void **state) {
    (void)state;
    int seen[2] = {0};
    const char *r2[] = {"parallel.ring=2", "parallel.upipe_heads=1"};
    ring_ranks(seen, 1, "tiny", 2, r2);
    /* two and four query heads per GPU and stage: the half launches take columns of LSE rows L apart */
    const char *u2[] = {"parallel.ring=2", "parallel.upipe_heads=2"};
    ring_ranks(seen, 2, "tiny", 2, u2);
    const char *u4[] = {"parallel.ring=2", "parallel.upipe_heads=4", "parallel.offload=all"};
    ring_ranks(seen, 4, "tiny", 3, u4);
    const char *r4[] = {"parallel.ring=4", "parallel.gpus=2", "parallel.upipe_heads=2"};
    ring_ranks(seen, 1, "tiny", 3, r4);
    ring_ranks(seen, 1, "tiny", 6, RING_STRADDLE);
    ring_ranks(seen, 1, "tiny", 5, RING_HOST);
    const char *b8[] = {"parallel.ring=2", "parallel.gpus=4", "parallel.upipe_heads=4", "model.layers=2",
                        "train.seq_len=16K"};
    ring_ranks(seen, 1, "llama8b", 5, b8);
    const char *b8u2[] = {"parallel.ring=2", "parallel.gpus=4", "parallel.upipe_heads=8", "model.layers=2",
                          "train.seq_len=16K"};
    ring_ranks(seen, 2, "llama8b", 5, b8u2);
    assert_true(seen[0] > 0 && seen[1] > 0); /* both query halves, by position */
    /* rank 1 of the run is local rank 0 of ring 2 x 1 GPU's second group, not local rank 1 */
    cp_spec s;
    char err[CP_ERR_MAX];
    if (cp_spec_load("tiny", r2, 2, &s, err, sizeof err)) fail_msg("spec: %s", err);
    cp_plan p;
    if (cp_plan_build(&s, &p, err, sizeof err)) fail_msg("plan: %s", err);
    cp_exec_opts o = {.rank = 1, .world_rank = 1};
    cp_exec *ex;
    assert_int_equal(cp_exec_dry(&ex, &p, &o, err, sizeof err), -1);
    if (!strstr(err, "rank 1 of the run (of 2) is not rank 1 of its group of 1 GPUs")) fail_msg("%s", err);
    cp_plan_free(&p);
}

/* A checkpoint of a run of groups of one GPU (2 replicas, or a ring of 2): every rank saves, and only the run's rank
 * 0 keeps the model, so the others read the weights and moments into nothing. With one GPU there is nothing to
 * gather either, so such a rank does nothing: no copy into a NULL array, no GPU call at all (this runs without
 * one). */
static void test_save_on_ranks_that_keep_nothing(void **state) {
    (void)state;
    const char *sets[][2] = {{"parallel.replicas=2", "parallel.gpus=1"}, {"parallel.ring=2", "parallel.gpus=1"}};
    for (int k = 0; k < 2; k++) {
        cp_spec s;
        char err[CP_ERR_MAX];
        if (cp_spec_load("tiny", sets[k], 2, &s, err, sizeof err)) fail_msg("%s", err);
        cp_plan p;
        if (cp_plan_build(&s, &p, err, sizeof err)) fail_msg("%s", err);
        assert_int_equal(p.C, 1);
        struct cp_exec ex;
        memset(&ex, 0, sizeof ex);
        ex.P = &p;
        ex.updates = 7;
        int updates = -1;
        if (cp_exec_read_weights(&ex, NULL, err, sizeof err)) fail_msg("%s: %s", sets[k][0], err);
        if (cp_exec_read_optimizer(&ex, NULL, NULL, &updates, err, sizeof err)) fail_msg("%s: %s", sets[k][0], err);
        assert_int_equal(updates, 7);
        cp_plan_free(&p);
    }
}

/* A checkpoint of several GPUs gathers the master weights and both moments through a unit-gradient buffer, also
 * where the optimizer keeps them in host memory (every rank stopped at the first save there: only GPU buffers were
 * gathered). */
static void test_checkpoint_gathers(void **state) {
    (void)state;
    const char *where[] = {"parallel.optimizer=gpu", "parallel.optimizer=host"};
    for (int k = 0; k < 2; k++) {
        cp_spec s;
        char err[CP_ERR_MAX];
        const char *sets[] = {"parallel.gpus=2", where[k]};
        if (cp_spec_load("tiny", sets, 2, &s, err, sizeof err)) fail_msg("%s", err);
        cp_plan p;
        if (cp_plan_build(&s, &p, err, sizeof err)) fail_msg("%s", err);
        struct cp_exec ex;
        memset(&ex, 0, sizeof ex);
        ex.P = &p;
        const char *state_bufs[] = {"master.f32", "adam_m.f32", "adam_v.f32"};
        for (int i = 0; i < 3; i++) {
            int src = -1, stage = -1;
            if (exec_gather_through(&ex, state_bufs[i], &src, &stage, err, sizeof err)) fail_msg("%s: %s", where[k], err);
            assert_int_equal(p.bufs[src].space, k ? CP_SPACE_HOST : CP_SPACE_GPU);
            assert_int_equal(p.bufs[stage].space, CP_SPACE_GPU);
        }
        cp_plan_free(&p);
    }
}

/* Packed documents: attention launches take the sequence's doc_start and doc_end (two operands more, 4-byte int32
 * [S] each) and RoPE each row's position, loaded with the tokens; in one-GPU and Ulysses/UPipe layouts, offloaded
 * checkpoints, kept attention outputs and the host optimizer, and rings (test_rings_documents checks their launches'
 * positions rank by rank). */
static void test_documents(void **state) {
    (void)state;
    with_docs = true;
    check("tiny", 0);
    check("tiny", 1, "parallel.gpus=2");
    check("tiny", 2, "parallel.gpus=2", "parallel.upipe_heads=2");
    check("tiny", 1, "parallel.gpus=4"); /* 2 KV heads on 4 GPUs */
    check("tiny", 2, "parallel.gpus=2", "parallel.offload=all");
    check("tiny", 2, "parallel.gpus=2", "parallel.attention_output=host");
    check("tiny", 2, "parallel.gpus=2", "parallel.optimizer=host");
    check("tiny", 2, "parallel.replicas=2", "train.micro_batches=1");
    check("llama8b", 4, "parallel.gpus=8", "model.layers=2", "train.seq_len=64K", "parallel.upipe_heads=8");
    check("tiny", 1, "parallel.ring=2");
    check("tiny", 3, "parallel.ring=2", "parallel.gpus=2", "parallel.offload=all");
    with_docs = false;
}

/* train.precision = "fp8": the layers' GEMMs on FP8 copies, each after its casts (and with per-tensor scales its
 * amaxes), prepared in the layouts that move GEMM operands around (stages, tiles folded, recompute, rings, offload,
 * micro-batches), with the weights' gradients in bf16 (the default) and on FP8 (their activations and gradients
 * read transposed, with block scales cast both ways at once), per tensor, by blocks and by rows. */
static void test_fp8(void **state) {
    (void)state;
    const char *fp8 = "train.precision=fp8", *pt = "train.fp8_scaling=tensor", *wg = "train.fp8_weight_grads=fp8";
    check("tiny", 2, fp8, pt);
    check("tiny", 3, fp8, pt, wg);
    check("tiny", 4, fp8, pt, "parallel.gpus=2", "parallel.upipe_heads=2");
    check("tiny", 5, fp8, pt, wg, "parallel.mlp_tile=512", "parallel.loss_tile=256");
    check("tiny", 5, fp8, pt, wg, "parallel.checkpoint_every=2", "parallel.offload=none");
    check("tiny", 4, fp8, pt, "parallel.offload=all", "train.micro_batches=2");
    check("tiny", 5, fp8, pt, wg, "parallel.ring=2", "parallel.gpus=2");
    check("llama3b", 6, fp8, pt, wg, "parallel.gpus=1", "model.layers=2", "train.seq_len=4K");
    check("llama8b", 6, fp8, pt, "parallel.gpus=2", "model.layers=2", "train.seq_len=8K", "parallel.offload=all");
    /* block scales (the default): one block-scaled cast per copy, its scales beside it */
    const char *blk = "train.fp8_scaling=block";
    check("tiny", 2, fp8, blk);
    check("tiny", 3, fp8, blk, wg);
    check("tiny", 4, fp8, blk, "parallel.gpus=2", "parallel.upipe_heads=2");
    check("tiny", 5, fp8, blk, wg, "parallel.gpus=2", "parallel.upipe_heads=2");
    check("tiny", 5, fp8, blk, wg, "parallel.mlp_tile=512", "parallel.loss_tile=256");
    check("llama3b", 5, fp8, blk, "parallel.gpus=1", "model.layers=2", "train.seq_len=4K");
    check("llama3b", 6, fp8, blk, wg, "parallel.gpus=1", "model.layers=2", "train.seq_len=4K");
    check("llama8b", 7, fp8, blk, wg, "parallel.gpus=2", "model.layers=2", "train.seq_len=8K", "parallel.offload=all");
    /* the copies written by their producers across layouts: the attention output's unpack after the all-to-all, rope's
     * backward on two GPUs, and under a ring with one GPU a group (rope in two runs, its copies by casts) */
    check("llama3b", 5, fp8, blk, "parallel.gpus=2", "model.layers=2", "train.seq_len=8K");
    check("llama3b", 6, fp8, blk, "parallel.gpus=1", "parallel.ring=2", "model.layers=2", "train.seq_len=8K");
    /* the generator's FP8 GEMM kernel as a launch with its tensor maps, where "auto" puts it (the weights' gradients
     * of 16K and 32K tokens) and on every GEMM it takes ("cpgen"), in MLP tiles */
    const char *gk = "train.fp8_gemm=auto", *ga = "train.fp8_gemm=cpgen";
    check("llama3b", 7, fp8, blk, gk, wg, "parallel.gpus=1", "model.layers=2", "train.seq_len=16K");
    check("llama3b", 7, fp8, blk, gk, wg, "parallel.gpus=1", "model.layers=2", "train.seq_len=32K");
    check("llama3b", 8, fp8, blk, ga, wg, "parallel.gpus=1", "model.layers=2", "train.seq_len=8K", "parallel.mlp_tile=2K");
    check("llama8b", 7, fp8, blk, ga, "parallel.gpus=2", "model.layers=2", "train.seq_len=8K", "parallel.offload=all");
    /* row scales: a cast per copy, the transposed ones in two launches with the columns' maxima behind the scales */
    const char *row = "train.fp8_scaling=row";
    check("tiny", 2, fp8, row);
    check("tiny", 3, fp8, row, wg);
    check("tiny", 5, fp8, row, wg, "parallel.gpus=2", "parallel.upipe_heads=2");
    check("tiny", 5, fp8, row, wg, "parallel.mlp_tile=512", "parallel.loss_tile=256");
    check("llama3b", 6, fp8, row, wg, "parallel.gpus=1", "model.layers=2", "train.seq_len=4K");
    check("llama8b", 7, fp8, row, wg, "parallel.gpus=2", "model.layers=2", "train.seq_len=8K", "parallel.offload=all");
    /* every layer's weights cast at once (the plans keep their copies), over micro-batches too */
    check("llama3b", 7, fp8, row, wg, "parallel.gpus=1", "model.layers=2", "train.seq_len=4K", "train.micro_batches=2");
    check("tiny", 4, fp8, row, "train.micro_batches=2", "parallel.offload=all");
}

/* Rings over packed documents, every rank of: ring 2 and ring 4 of one GPU, ring 2 x Ulysses 2, 2 replicas x ring 2
 * (two query heads per GPU and stage each), ring 2 x 3 GPUs (a rank straddling its group's chunks) and the host
 * optimizer with micro-batches: step 0's three half launches and every received block's two at the halves'
 * global positions, with the sequence's document bounds (ring_ranks). */
static void test_rings_documents(void **state) {
    (void)state;
    int seen[2] = {0};
    with_docs = true;
    const char *r2[] = {"parallel.ring=2", "parallel.upipe_heads=2"};
    ring_ranks(seen, 2, "tiny", 2, r2);
    const char *r4[] = {"parallel.ring=4", "parallel.upipe_heads=2"};
    ring_ranks(seen, 2, "tiny", 2, r4);
    const char *r2u2[] = {"parallel.ring=2", "parallel.gpus=2", "parallel.upipe_heads=4"};
    ring_ranks(seen, 2, "tiny", 3, r2u2);
    const char *rep2[] = {"parallel.replicas=2", "parallel.ring=2", "parallel.upipe_heads=2"};
    ring_ranks(seen, 2, "tiny", 3, rep2);
    ring_ranks(seen, 1, "tiny", 6, RING_STRADDLE);
    ring_ranks(seen, 1, "tiny", 5, RING_HOST);
    with_docs = false;
    assert_true(seen[0] > 0 && seen[1] > 0);
}

/* A gathered unit goes to a snapshot registered with CUDA in pieces of CP_SNAP_PIECE bytes: its copies out of the
 * GPU (exec_piece_span) cover it exactly and none crosses a piece. The 8B shape's embedding and LM head (2.1 GB
 * each) cross pieces: copied whole, every save of the 8B shape on 8 GPUs failed (cudaErrorInvalidValue). */
static void test_snapshot_pieces(void **state) {
    (void)state;
    cp_spec s;
    char err[CP_ERR_MAX];
    const char *sets[] = {"model.layers=2", "train.seq_len=32768", "parallel.gpus=8"};
    if (cp_spec_load("llama8b", sets, 3, &s, err, sizeof err)) fail_msg("%s", err);
    cp_plan p;
    if (cp_plan_build(&s, &p, err, sizeof err)) fail_msg("%s", err);
    const size_t piece = (size_t)CP_SNAP_PIECE;
    int crossing = 0;
    size_t full = 0;
    for (int u = 0; u < p.nunits; u++) {
        size_t at = full, end = full + sizeof(float) * (size_t)p.unit_padded[u], copies = 0;
        crossing += at / piece != (end - 1) / piece;
        for (size_t k; at < end; at += k, copies++) {
            k = exec_piece_span(at, end, piece);
            assert_true(k > 0 && at + k <= end);
            assert_true(at / piece == (at + k - 1) / piece); /* within one piece */
        }
        assert_int_equal(at, end);
        assert_int_equal(copies, (end - 1) / piece - full / piece + 1);
        full = end;
    }
    assert_true(crossing >= 2); /* the case the test is for: units larger than a piece */
    assert_int_equal(exec_piece_span(5, 17, 0), 12); /* unregistered memory: one copy */
    cp_plan_free(&p);
}

/* The planner and the executor meet through the step's task: every task has its preparation, so that no task the
 * planner may give is left to fail at run time. And the steps of the shipped specs each carry a task that labels
 * them as their `what` says (the trace, the profile and the plan's text name steps by it). */
static void test_every_task_prepared(void **state) {
    (void)state;
    for (int t = CP_TASK_NONE + 1; t < CP_TASK_COUNT; t++)
        if (!cp_exec_prepares((cp_task)t)) fail_msg("the executor has no preparation for task %s", cp_task_name((cp_task)t));
    assert_false(cp_exec_prepares(CP_TASK_NONE));
    const char *names[] = {"tiny", "llama8b"};
    for (int k = 0; k < 2; k++) {
        cp_spec s;
        char err[CP_ERR_MAX];
        const char *sets[] = {"parallel.gpus=2", "train.seq_len=32K"};
        if (cp_spec_load(names[k], sets, k ? 2 : 1, &s, err, sizeof err)) fail_msg("%s", err);
        cp_plan p;
        if (cp_plan_build(&s, &p, err, sizeof err)) fail_msg("%s", err);
        for (int i = 0; i < p.nsteps; i++) {
            const cp_step *st = &p.steps[i];
            if (st->kind == CP_OP_KERNEL) assert_true(st->task != CP_TASK_NONE);
            if (st->task != CP_TASK_NONE) assert_string_equal(st->what, cp_task_name(st->task));
        }
        cp_plan_free(&p);
    }
}

/* ---- a checkpoint's snapshot */

static int buf_named(const cp_plan *p, const char *name) {
    for (int i = 0; i < p->nbufs; i++)
        if (!strcmp(p->bufs[i].name, name)) return i;
    fail_msg("no buffer %s", name);
    return -1;
}

/* The next update alone waits for a snapshot: the first step that writes the master weights or a moment is the
 * optimizer's update, and no step before it (none of the micro-batches') writes them, in every layout; a plan whose
 * micro-batch wrote them would get no overlap (the gate says so). */
static void test_snapshot_gate(void **state) {
    (void)state;
    const char *cases[][3] = {{"tiny", NULL, NULL},
                              {"tiny", "parallel.optimizer=host", NULL},
                              {"tiny", "train.micro_batches=3", "parallel.offload=all"},
                              {"tiny", "parallel.gpus=2", NULL},
                              {"tiny", "parallel.gpus=2", "parallel.optimizer=host"},
                              {"tiny", "parallel.replicas=2", "parallel.gpus=1"},
                              {"tiny", "parallel.ring=2", "parallel.gpus=1"},
                              {"llama1b", "train.seq_len=32K", NULL}};
    const char *state_bufs[] = {"master.f32", "adam_m.f32", "adam_v.f32"};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        cp_spec s;
        char err[CP_ERR_MAX];
        const char *sets[2] = {cases[k][1], cases[k][2]};
        int nsets = (sets[0] != NULL) + (sets[1] != NULL);
        if (cp_spec_load(cases[k][0], sets, nsets, &s, err, sizeof err)) fail_msg("%s", err);
        cp_plan p;
        if (cp_plan_build(&s, &p, err, sizeof err)) fail_msg("%s", err);
        int gate = cp_exec_snapshot_gate(&p);
        printf("  %-8s %-24s %-22s gate at step %d of %d (micro-batch steps %d): %s\n", cases[k][0],
               sets[0] ? sets[0] : "", sets[1] ? sets[1] : "", gate, p.nsteps, p.micro_steps,
               gate >= 0 ? p.steps[gate].what : "-");
        assert_true(gate >= p.micro_steps);
        assert_true(p.steps[gate].task == CP_TASK_ADAMW || p.steps[gate].task == CP_TASK_ADAMW_HOST);
        int b[3];
        for (int j = 0; j < 3; j++) b[j] = buf_named(&p, state_bufs[j]);
        for (int i = 0; i < p.nsteps; i++)
            for (int o = 0; o < p.steps[i].nops; o++)
                for (int j = 0; j < 3; j++)
                    if (p.steps[i].ops[o].buf == b[j] && (p.steps[i].ops[o].access & CP_WRITE)) assert_true(i >= gate);
        /* a micro-batch step that writes the master weights: no step may run beside the copies */
        p.steps[0].ops[0] = (cp_operand){.buf = b[0], .offset = 0, .bytes = 4, .access = CP_RW};
        assert_int_equal(cp_exec_snapshot_gate(&p), -1);
        cp_plan_free(&p);
    }
}

typedef struct {
    cp_exec *ex;
    int step;
    volatile int done;
} gate_arg;

static void *gate_thread(void *arg) {
    gate_arg *g = arg;
    char err[CP_ERR_MAX];
    if (exec_snap_gate(g->ex, g->step, err, sizeof err)) g->done = -1;
    else g->done = 1;
    return NULL;
}

static void sleep_ms(int ms) {
    struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

typedef struct {
    struct cp_exec *ex;
    cp_exec_snap d;
    int done;
} start_arg;

static void *start_thread(void *arg) {
    start_arg *a = arg;
    char err[CP_ERR_MAX];
    int updates;
    if (cp_exec_snapshot_start(a->ex, &a->d, &updates, err, sizeof err)) return NULL;
    a->done = 1;
    return NULL;
}

/* One GPU with the optimizer in host memory: the snapshot is a memcpy of the host state made by the writer's thread
 * (cp_exec_snapshot_finish), and the next step's host update waits for it and for nothing else; no GPU is needed.
 * A rank that writes nothing (a replica) copies nothing. */
static void test_snapshot_host_memcpy(void **state) {
    (void)state;
    cp_spec s;
    char err[CP_ERR_MAX];
    const char *sets[] = {"parallel.optimizer=host"};
    if (cp_spec_load("tiny", sets, 1, &s, err, sizeof err)) fail_msg("%s", err);
    cp_plan p;
    if (cp_plan_build(&s, &p, err, sizeof err)) fail_msg("%s", err);
    struct cp_exec ex;
    memset(&ex, 0, sizeof ex);
    ex.P = &p;
    ex.updates = 3;
    ex.bufptr = calloc((size_t)p.nbufs, sizeof *ex.bufptr);
    int64_t n = p.params_shard;
    float *src[3], *dst[3];
    const char *names[] = {"master.f32", "adam_m.f32", "adam_v.f32"};
    for (int k = 0; k < 3; k++) {
        src[k] = malloc(sizeof(float) * (size_t)n);
        dst[k] = calloc((size_t)n, sizeof(float));
        for (int64_t i = 0; i < n; i++) src[k][i] = (float)(i % 1000) * 0.5f + (float)k;
        ex.bufptr[buf_named(&p, names[k])] = src[k];
    }
    cp_exec_snap d = {.w = dst[0], .m = dst[1], .v = dst[2]};
    int updates = -1;
    if (cp_exec_snapshot_start(&ex, &d, &updates, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(updates, 3);
    int gate = cp_exec_snapshot_gate(&p);
    /* a step that does not write the state passes while the copy is pending */
    if (exec_snap_gate(&ex, 0, err, sizeof err)) fail_msg("%s", err);
    /* the update waits until the writer's thread has copied */
    gate_arg g = {&ex, gate, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, gate_thread, &g), 0);
    sleep_ms(200);
    assert_int_equal(g.done, 0);
    if (cp_exec_snapshot_finish(&ex, err, sizeof err)) fail_msg("%s", err);
    pthread_join(th, NULL);
    assert_int_equal(g.done, 1);
    assert_true(ex.snap_waited >= 0.15);
    for (int k = 0; k < 3; k++) assert_memory_equal(dst[k], src[k], sizeof(float) * (size_t)n);
    /* nothing pending now: the next update does not wait */
    ex.snap_waited = 0;
    if (exec_snap_gate(&ex, gate, err, sizeof err)) fail_msg("%s", err);
    assert_true(ex.snap_waited == 0);
    /* two slots: a snapshot into slot B started before A's copy was made (no update between) waits for that copy,
     * which goes into A's arrays, not B's; then B's */
    float *dst2[3];
    for (int k = 0; k < 3; k++) {
        memset(dst[k], 0, sizeof(float) * (size_t)n);
        dst2[k] = calloc((size_t)n, sizeof(float));
    }
    if (cp_exec_snapshot_start(&ex, &d, &updates, err, sizeof err)) fail_msg("%s", err);
    start_arg b = {&ex, {.w = dst2[0], .m = dst2[1], .v = dst2[2]}, 0};
    assert_int_equal(pthread_create(&th, NULL, start_thread, &b), 0);
    sleep_ms(200);
    assert_int_equal(b.done, 0);
    if (cp_exec_snapshot_finish(&ex, err, sizeof err)) fail_msg("%s", err);
    pthread_join(th, NULL);
    assert_int_equal(b.done, 1);
    for (int k = 0; k < 3; k++) assert_memory_equal(dst[k], src[k], sizeof(float) * (size_t)n);
    if (cp_exec_snapshot_finish(&ex, err, sizeof err)) fail_msg("%s", err);
    for (int k = 0; k < 3; k++) assert_memory_equal(dst2[k], src[k], sizeof(float) * (size_t)n);
    for (int k = 0; k < 3; k++) free(dst2[k]);
    /* a rank that does not write */
    cp_exec_snap none = {0};
    ex.updates = 4;
    if (cp_exec_snapshot_start(&ex, &none, &updates, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(updates, 4);
    exec_snap_free(&ex);
    for (int k = 0; k < 3; k++) free(src[k]), free(dst[k]);
    free(ex.bufptr);
    cp_plan_free(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny),
        cmocka_unit_test(test_offload_and_host_optimizer),
        cmocka_unit_test(test_shipped_shapes),
        cmocka_unit_test(test_parallel),
        cmocka_unit_test(test_attention_output),
        cmocka_unit_test(test_replicas),
        cmocka_unit_test(test_rings),
        cmocka_unit_test(test_save_on_ranks_that_keep_nothing),
        cmocka_unit_test(test_checkpoint_gathers),
        cmocka_unit_test(test_snapshot_pieces),
        cmocka_unit_test(test_documents),
        cmocka_unit_test(test_rings_documents),
        cmocka_unit_test(test_fp8),
        cmocka_unit_test(test_every_task_prepared),
        cmocka_unit_test(test_snapshot_gate),
        cmocka_unit_test(test_snapshot_host_memcpy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
