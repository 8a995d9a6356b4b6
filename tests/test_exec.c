/* test_exec.c: the step executor's reading of plans, without a GPU (cp_exec_check): every step of the shipped specs'
 * one-GPU plans (and tiny's variants: offload, host optimizer, plain Ulysses, micro-batches, no checkpointing,
 * Qwen3's qk-norm, tied embeddings) gets an argument list whose operand sizes and alignment satisfy its kernel's
 * contract, GEMM extents that fit their buffers, and cross-stream waits under which every pair of steps on different
 * streams touching the same bytes is ordered. Plans of several GPUs likewise, seen from rank 0: their collectives
 * (all-to-all, all-gather, reduce-scatter, all-reduce) get operands that match what NCCL will be asked to move, and
 * their layout kernels get token rows and blocks of the right sizes; replica groups' all-reduces across the groups
 * likewise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "exec.h"
#include "plan.h"
#include "spec.h"

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
    cp_plan p;
    if (cp_plan_build(&s, &p, err, sizeof err)) fail_msg("plan %s: %s", name, err);
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

/* Rings are planned but not executed: the check says what is missing rather than reading their steps. */
static void test_refuses_rings(void **state) {
    (void)state;
    cp_spec s;
    char err[CP_ERR_MAX];
    const char *sets[] = {"parallel.ring=2"};
    if (cp_spec_load("tiny", sets, 1, &s, err, sizeof err)) fail_msg("spec: %s", err);
    cp_plan p;
    if (cp_plan_build(&s, &p, err, sizeof err)) fail_msg("plan: %s", err);
    cp_exec_check_report r;
    assert_int_equal(cp_exec_check(&p, &r, err, sizeof err), -1);
    if (!strstr(err, "<embedded>/tiny.lua: parallel.ring = 2 (2 GPUs in all): this build plans ring attention but "
                     "cannot run it yet; missing: (1) the ring communicator") ||
        !strstr(err, "Train with parallel.ring = 1"))
        fail_msg("%s", err);
    assert_int_equal(r.steps, 0);
    cp_trace_wait *w = NULL;
    int n = -1;
    assert_int_equal(cp_exec_plan_waits(&p, &w, &n, err, sizeof err), -1);
    assert_int_equal(n, 0);
    assert_null(w);
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
        cmocka_unit_test(test_refuses_rings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
