/* test_plan.c: the plan's memory model against arithmetic written out term by term, the UPipe stage tables,
 * the arena packing (no two buffers alive at once share a byte), folded plans against their flat program, --max-seq
 * (its quick fit test against the whole search) and the JSON output; replicas, and ring attention's stages, memory,
 * --max-seq and refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <math.h>

#include <cmocka.h>

#include "doc_work.h"
#include "exec.h"
#include "kernels_attn.h"
#include "gemm.h"
#include "plan.h"
#include "plan_internal.h"
#include "ring.h"
#include "sh.h"
#include "source_tree.h"
#include "spec_write.h"
#include "spec.h"

static void load(const char *name, cp_spec *s, int nsets, ...) {
    const char *sets[32];
    va_list ap;
    va_start(ap, nsets);
    for (int i = 0; i < nsets; i++) sets[i] = va_arg(ap, const char *);
    va_end(ap);
    char err[CP_ERR_MAX];
    int rc = cp_spec_load(name, sets, nsets, s, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
}

static void build(const cp_spec *s, cp_plan *p) {
    char err[CP_ERR_MAX];
    int rc = cp_plan_build(s, p, err, sizeof err);
    if (rc) fprintf(stderr, "%s\n", err);
    assert_int_equal(rc, 0);
}

/* What `cpgen plan` prints of p (the caller frees it) */
static char *printed(const cp_plan *p) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    cp_plan_print(p, f, false);
    assert_int_equal(fclose(f), 0);
    return text;
}

static const cp_buffer *buf(const cp_plan *p, const char *name) {
    for (int i = 0; i < p->nbufs; i++)
        if (!strcmp(p->bufs[i].name, name)) return &p->bufs[i];
    fail_msg("no buffer %s", name);
    return NULL;
}

static int64_t up64(int64_t v) { return (v + 63) / 64 * 64; }

/* tiny: vocab 512, hidden 256, 2 layers, 4 heads, 2 KV, head_dim 64, ffn 768, seq 2K, one GPU, untied. */
static void test_tiny_arithmetic(void **state) {
    (void)state;
    cp_spec s;
    load("tiny", &s, 1, "parallel.upipe_heads=1");
    cp_plan p;
    build(&s, &p);
    const int64_t V = 512, h = 256, L = 2, H = 4, KV = 2, D = 64, F = 768, S = 2048;
    /* one layer: q, k, v, o, gate, up, down, two norms, each padded to 64 elements */
    int64_t layer = up64(H * D * h) + up64(KV * D * h) * 2 + up64(h * H * D) + up64(F * h) * 3 + up64(h) * 2;
    assert_int_equal(layer, 65536 + 32768 * 2 + 65536 + 196608 * 3 + 256 * 2);
    int64_t shard = V * h + L * layer + (up64(h) + V * h); /* embedding, layers, final norm + LM head */
    assert_int_equal(p.params_shard, shard);
    assert_int_equal(p.params_total, shard); /* nothing padded at these shapes */
    assert_int_equal(buf(&p, "params.bf16")->bytes, shard * 2);
    assert_int_equal(buf(&p, "grads.f32")->bytes, shard * 4);
    assert_int_equal(buf(&p, "master.f32")->bytes, shard * 4);
    assert_int_equal(buf(&p, "adam_m.f32")->bytes + buf(&p, "adam_v.f32")->bytes, shard * 8);
    assert_int_equal(p.cat_bytes[CP_CAT_PARAMS] + p.cat_bytes[CP_CAT_MASTER] + p.cat_bytes[CP_CAT_OPTIM] +
                         p.cat_bytes[CP_CAT_GRADS],
                     shard * 18);
    /* checkpoints: one layer input per layer, S x hidden bf16, on the GPU */
    assert_int_equal(buf(&p, "ckpt.0")->bytes, S * h * 2);
    assert_int_equal(p.cat_bytes[CP_CAT_CKPT], L * S * h * 2);
    assert_int_equal(p.ckpt_host_layers, 0);
    assert_int_equal(p.host_arena, 0);
    /* tiles: the whole 2K tokens fit one tile of each */
    assert_int_equal(p.mlp_tile, 2048);
    assert_int_equal(buf(&p, "mlp_gate")->bytes, 2048 * F * 2);
    assert_int_equal(p.cat_bytes[CP_CAT_MLP], 3 * 2048 * F * 2);
    assert_int_equal(buf(&p, "logits")->bytes, p.loss_tile * V * 2);
    /* UPipe on one GPU, U = 1: four stages of one head, K/V once per two stages */
    assert_int_equal(p.U, 1);
    assert_int_equal(p.nstages, 4);
    assert_int_equal(p.group_len, 2);
    assert_int_equal(buf(&p, "q_stage")->bytes, S * 1 * D * 2);
    assert_int_equal(buf(&p, "dkv_accum.f32")->bytes, 2 * S * 1 * D * 4);
    assert_int_equal(buf(&p, "lse")->bytes, H * S * 4);
    assert_int_equal(buf(&p, "attn_out")->bytes, S * H * D * 2);
    /* arena: at least what is live at the peak step, at most every buffer side by side */
    int64_t all = 0;
    for (int k = 0; k < CP_CAT_COUNT; k++) all += p.cat_bytes[k];
    assert_true(p.gpu_arena >= p.gpu_live_peak);
    assert_true(p.gpu_arena <= all + p.nbufs * CP_ARENA_ALIGN);
    assert_true(p.gpu_arena < all); /* lifetimes let buffers share */
    assert_int_equal(p.gpu_peak, p.gpu_arena + s.machine.reserve);
    assert_true(p.fits);
    cp_plan_free(&p);
}

/* upipe_heads = "auto": the largest stage that fits; where that one does not fit, a smaller one. */
static void test_upipe_auto(void **state) {
    (void)state;
    cp_spec s;
    cp_plan p;
    load("tiny", &s, 0);
    build(&s, &p);
    assert_true(p.fits);
    assert_int_equal(p.U, 4); /* plain Ulysses: one stage of all four heads */
    assert_int_equal(p.nstages, 1);
    cp_plan_free(&p);
    /* the 3B shape on one GPU at 420K tokens with every checkpoint on the GPU: 24 heads per stage do not fit with
     * every layer checkpointed, a smaller stage does, and is chosen before sparser checkpoints */
    load("llama3b", &s, 3, "parallel.gpus=1", "train.seq_len=420K", "parallel.offload=none");
    build(&s, &p);
    assert_true(p.fits);
    int chosen = p.U;
    assert_true(chosen < 24);
    assert_int_equal(p.ckpt_every, 1);
    cp_plan_free(&p);
    assert_false(p.opt_on_host); /* nothing given up: the optimizer stays on the GPU */
    load("llama3b", &s, 6, "parallel.gpus=1", "train.seq_len=420K", "parallel.offload=none",
         "parallel.upipe_heads=24", "parallel.checkpoint_every=1", "parallel.optimizer=gpu");
    build(&s, &p);
    assert_false(p.fits);
    cp_plan_free(&p);
    /* and the next larger valid stage than the one chosen does not fit either */
    int64_t U[64];
    int n = cp_spec_upipe_values(&s, U, 64);
    for (int i = 0; i + 1 < n; i++)
        if (U[i] == chosen) {
            char set[64];
            snprintf(set, sizeof set, "parallel.upipe_heads=%lld", (long long)U[i + 1]);
            load("llama3b", &s, 6, "parallel.gpus=1", "train.seq_len=420K", "parallel.offload=none", set,
                 "parallel.checkpoint_every=1", "parallel.optimizer=gpu");
            build(&s, &p);
            assert_false(p.fits);
            cp_plan_free(&p);
        }
}

/* checkpoint_every = k: the inputs of layers 0, k, 2k... kept, k - 1 segment inputs, and the layers between
 * recomputed in the backward; "auto" turns to it only where every layer checkpointed on the GPU cannot fit. */
static void test_checkpoint_every(void **state) {
    (void)state;
    cp_spec s;
    cp_plan p, q;
    const int64_t S = 8192, h = 3072;
    load("llama3b", &s, 5, "parallel.gpus=1", "train.seq_len=8K", "model.layers=5", "parallel.checkpoint_every=2",
         "parallel.offload=none");
    build(&s, &p);
    assert_int_equal(p.ckpt_every, 2);
    int ckpts = 0, segs = 0;
    for (int i = 0; i < p.nbufs; i++) {
        ckpts += !strncmp(p.bufs[i].name, "ckpt.", 5);
        segs += !strncmp(p.bufs[i].name, "segment_input.", 14);
    }
    assert_int_equal(ckpts, 3); /* layers 0, 2, 4 */
    assert_int_equal(segs, 1);
    assert_non_null(buf(&p, "ckpt.4"));
    assert_int_equal(buf(&p, "segment_input.1")->bytes, S * h * 2);
    assert_int_equal(p.cat_bytes[CP_CAT_CKPT], 4 * S * h * 2);
    /* the segments [0, 1] and [2, 3] are forwarded again in the backward: two more layer forwards than k = 1 */
    load("llama3b", &s, 5, "parallel.gpus=1", "train.seq_len=8K", "model.layers=5", "parallel.checkpoint_every=1",
         "parallel.offload=none");
    build(&s, &q);
    int rec_p = 0, rec_q = 0;
    for (int i = 0; i < p.nsteps; i++) rec_p += p.steps[i].phase == CP_PHASE_RECOMPUTE && !strcmp(p.steps[i].what, "norm1");
    for (int i = 0; i < q.nsteps; i++) rec_q += q.steps[i].phase == CP_PHASE_RECOMPUTE && !strcmp(q.steps[i].what, "norm1");
    assert_int_equal(rec_q, 5);
    assert_int_equal(rec_p, 5 + 2);
    assert_true(p.t_step > q.t_step);
    cp_plan_free(&p);
    cp_plan_free(&q);
    /* auto: at 460K tokens with every checkpoint and the optimizer on the GPU no stage size fits every layer's
     * input; every second layer's does */
    load("llama3b", &s, 4, "parallel.gpus=1", "train.seq_len=460K", "parallel.offload=none", "parallel.optimizer=gpu");
    build(&s, &p);
    assert_true(p.fits);
    assert_int_equal(p.ckpt_every, 2);
    load("llama3b", &s, 5, "parallel.gpus=1", "train.seq_len=460K", "parallel.offload=none",
         "parallel.checkpoint_every=1", "parallel.optimizer=gpu");
    build(&s, &q);
    assert_false(q.fits);
    cp_plan_free(&q);
    /* optimizer = "auto" weighs that recompute against moving the optimizer to the host, which fits every layer's
     * input: faster by the cost model, so chosen */
    load("llama3b", &s, 3, "parallel.gpus=1", "train.seq_len=460K", "parallel.offload=none");
    build(&s, &q);
    assert_true(q.fits);
    assert_true(q.opt_on_host);
    assert_int_equal(q.ckpt_every, 1);
    assert_true(q.t_step < p.t_step);
    cp_plan_free(&p);
    cp_plan_free(&q);
}

/* Before a reduce-scatter overwrites a gradient shard that already holds gradients, grad_accum adds the shard into
 * this rank's slice of the full gradients: every unit with several micro-batches, the tied embedding always. */
static int count_steps(const cp_plan *p, const char *what) {
    int n = 0;
    for (int i = 0; i < p->nsteps; i++) n += !strcmp(p->steps[i].what, what);
    return n;
}

static void test_grad_accum(void **state) {
    (void)state;
    static const struct {
        const char *mb, *tie;
        int accum, scatters; /* grad_accum and reduce_scatter steps per micro-batch program */
    } cases[] = {{"train.micro_batches=1", "model.tie_embeddings=false", 0, 4},
                 {"train.micro_batches=1", "model.tie_embeddings=true", 2, 5},
                 {"train.micro_batches=3", "model.tie_embeddings=false", 4, 4},
                 {"train.micro_batches=3", "model.tie_embeddings=true", 5, 5}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cp_spec s;
        cp_plan p;
        load("tiny", &s, 3, "parallel.gpus=2", cases[k].mb, cases[k].tie);
        build(&s, &p);
        assert_int_equal(count_steps(&p, "reduce_scatter"), cases[k].scatters);
        assert_int_equal(count_steps(&p, "grad_accum"), cases[k].accum);
        cp_plan_free(&p);
    }
}

/* Bytes one layer keeps of its attention: the output in token layout, T x H x head_dim bf16, and its heads' LSE,
 * (H / C) x S fp32. */
static int64_t kept_bytes(int64_t S, int64_t C, int64_t H, int64_t D) { return S / C * H * D * 2 + H / C * S * 4; }

static void plan_of(cp_plan *p, int nsets, const char **sets) {
    cp_spec s;
    char err[CP_ERR_MAX];
    if (cp_spec_load("llama3b", sets, nsets, &s, err, sizeof err)) fail_msg("%s", err);
    build(&s, p);
}

/* The 3B shape on one H200, attention_output = "auto" against "recompute" at 32K and 128K: every layer keeps its
 * output and LSE on the GPU, because the recompute plan leaves more free than all 28 layers' kept bytes; the
 * backward then skips 28 attention forwards (one stage of 24 heads each), and the step is predicted faster by at
 * least their time at the attention ceiling. */
static void test_kept_attention_3b(void **state) {
    (void)state;
    const int64_t H = 24, D = 128, L = 28;
    const char *lens[] = {"train.seq_len=32K", "train.seq_len=128K"};
    for (int k = 0; k < 2; k++) {
        const int64_t S = (k ? 128 : 32) * 1024;
        const char *a[] = {"parallel.gpus=1", lens[k]};
        const char *r[] = {"parallel.gpus=1", lens[k], "parallel.attention_output=recompute"};
        cp_plan p, q;
        plan_of(&p, 2, a);
        plan_of(&q, 3, r);
        int64_t per = kept_bytes(S, 1, H, D);
        assert_int_equal(per, S * 24 * 128 * 2 + 24 * S * 4);
        /* why all on the GPU: the recompute plan leaves room for every layer's */
        assert_true(q.spec.machine.gpu_mem - q.gpu_peak > L * per);
        assert_true(p.fits);
        assert_int_equal(p.attn_gpu_layers, L);
        assert_int_equal(p.attn_host_layers, 0);
        assert_int_equal(cp_plan_attn_where(&p, 0), CP_ATTN_GPU);
        assert_int_equal(cp_plan_attn_where(&p, 27), CP_ATTN_GPU);
        assert_int_equal(q.attn_gpu_layers + q.attn_host_layers, 0);
        assert_int_equal(cp_plan_attn_where(&q, 0), CP_ATTN_RECOMPUTE);
        /* the same other choices */
        assert_int_equal(p.U, q.U);
        assert_int_equal(p.U, 24);
        assert_int_equal(p.ckpt_every, q.ckpt_every);
        assert_int_equal(p.opt_on_host, q.opt_on_host);
        /* memory: each kept buffer, their sum, no host memory */
        assert_int_equal(buf(&p, "attn_out.0")->bytes, S * H * D * 2);
        assert_int_equal(buf(&p, "lse.27")->bytes, H * S * 4);
        assert_int_equal(buf(&p, "attn_out.27")->space, CP_SPACE_GPU);
        assert_int_equal(p.cat_bytes[CP_CAT_ATTN_SAVED], L * per);
        assert_int_equal(q.cat_bytes[CP_CAT_ATTN_SAVED], 0);
        assert_int_equal(p.host_arena, q.host_arena);
        /* the arena grows by the kept outputs less the recompute's scratch output and LSE they replace: at most all
         * of them, at least all but one layer's (the layer being recomputed used the scratch) */
        assert_true(p.gpu_arena - q.gpu_arena <= L * per);
        assert_true(p.gpu_arena - q.gpu_arena >= (L - 1) * per);
        /* work and time: 28 attention forwards of 4 S^2 H D / 2 FLOPs fewer */
        double fwd = 4.0 * (double)S * S * H * D / 2;
        assert_true(fabs(p.flops_attn_saved - L * fwd) < 1e-9 * L * fwd);
        assert_true(fabs((q.flops_attn - p.flops_attn) - L * fwd) < 1e-9 * L * fwd);
        assert_true(q.t_step - p.t_step >= L * fwd / (p.spec.machine.attn_fwd_tflops * 1e12));
        assert_int_equal(count_steps(&q, "attn_fwd"), 2 * L);
        assert_int_equal(count_steps(&p, "attn_fwd"), L);
        printf("  3B, %lld tokens: recompute %.2f s, kept on the GPU %.2f s predicted (%.1f%% faster)\n", (long long)S,
               q.t_step, p.t_step, 100 * (1 - p.t_step / q.t_step));
        cp_plan_free(&p);
        cp_plan_free(&q);
    }
}

/* At the longest length (the --max-seq answer, 1,398,784 tokens, unchanged: the kept outputs take only memory left
 * over) "auto" keeps nothing on the GPU, where less than one layer's 8.13 GiB is free, and keeps the first 9 layers
 * in host memory, as many as the host's 128 GiB hold beside the optimizer; their GPU staging is not live at the
 * plan's peak. The other 19 layers recompute attention. One more 1K tokens does not fit. */
static void test_kept_attention_3b_longest(void **state) {
    (void)state;
    const int64_t S = 1398784, H = 24, D = 128;
    const char *a[] = {"parallel.gpus=1", "train.seq_len=1398784"};
    cp_plan p;
    plan_of(&p, 2, a);
    int64_t per = kept_bytes(S, 1, H, D);
    assert_true(p.fits);
    assert_int_equal(p.attn_gpu_layers, 0);
    assert_int_equal(p.attn_host_layers, 9);
    assert_int_equal(cp_plan_attn_where(&p, 8), CP_ATTN_HOST);
    assert_int_equal(cp_plan_attn_where(&p, 9), CP_ATTN_RECOMPUTE);
    assert_true(p.spec.machine.gpu_mem - p.gpu_peak < per);         /* no room for one on the GPU */
    assert_true(p.host_peak + per > p.spec.machine.host_mem);        /* nor for a 10th on the host */
    assert_int_equal(p.cat_host_bytes[CP_CAT_ATTN_SAVED], 9 * per);
    assert_int_equal(p.cat_bytes[CP_CAT_ATTN_SAVED], 2 * per);       /* the staging pair */
    assert_int_equal(p.cat_at_peak[CP_CAT_ATTN_SAVED], 0);
    assert_true(p.opt_on_host);
    assert_int_equal(p.ckpt_every, 5);
    cp_plan_free(&p);
    const char *b[] = {"parallel.gpus=1", "train.seq_len=1399808"};
    plan_of(&p, 2, b);
    assert_false(p.fits);
    cp_plan_free(&p);
}

/* parallel.mlp_tile = "auto": the tile grown, once the kept attention outputs are placed, to the largest divisor of
 * T that fits and that the cost model finds no slower. The 3B at 32K on one GPU: one tile of 32K tokens beside every
 * layer's kept attention output, predicted no slower than 4K tiles in bf16 and faster in fp8, the MLP's buffers 8
 * times theirs; its spec still says "auto". The 8B at 5M on 8 GPUs of 80 GB (test_8b_arithmetic): T / 4, since
 * T / 2 fits but is predicted slower, and T does not fit. An explicit tile stays as given. */
static void test_mlp_tile_auto(void **state) {
    (void)state;
    for (int fp8 = 0; fp8 < 2; fp8++) {
        const char *prec = fp8 ? "train.precision=fp8" : "train.precision=bf16";
        const char *a[] = {"parallel.gpus=1", "train.seq_len=32K", prec};
        const char *f[] = {"parallel.gpus=1", "train.seq_len=32K", prec, "parallel.mlp_tile=4K"};
        cp_plan p, q;
        plan_of(&p, 3, a);
        plan_of(&q, 4, f);
        assert_true(p.fits && q.fits);
        assert_int_equal(p.mlp_tile, 32768);
        assert_int_equal(q.mlp_tile, 4096);
        assert_int_equal(p.attn_gpu_layers, 28);
        assert_int_equal(p.cat_bytes[CP_CAT_MLP], 8 * q.cat_bytes[CP_CAT_MLP]);
        assert_true(fp8 ? p.t_step < q.t_step : p.t_step <= q.t_step);
        assert_int_equal(p.spec.parallel.mlp_tile, 0);
        cp_str lua = {0};
        cp_spec_write_lua(&p.spec, &lua);
        assert_non_null(strstr(lua.data, "mlp_tile = \"auto\""));
        cp_str_free(&lua);
        printf("  3B at 32K, %s: 4K tiles %.3f s, one tile %.3f s predicted\n", prec, q.t_step, p.t_step);
        cp_plan_free(&p);
        cp_plan_free(&q);
    }
    const char *big[] = {"parallel.gpus=8", "train.seq_len=5M", "machine.gpu_mem=80G", "parallel.offload=all",
                         "machine.host_mem=2T", "parallel.attention_output=recompute"};
    cp_spec s;
    char err[CP_ERR_MAX];
    if (cp_spec_load("llama8b", big, 6, &s, err, sizeof err)) fail_msg("%s", err);
    cp_plan p, half, whole;
    build(&s, &p);
    assert_true(p.fits);
    assert_int_equal(p.mlp_tile, p.T / 4);
    s.parallel.mlp_tile = p.T / 2;
    build(&s, &half);
    s.parallel.mlp_tile = p.T;
    build(&s, &whole);
    assert_true(half.fits && half.t_step > p.t_step);
    assert_false(whole.fits);
    cp_plan_free(&p);
    cp_plan_free(&half);
    cp_plan_free(&whole);
}

/* The memory arithmetic of each explicit mode, term by term, on the 3B shape cut to 4 layers, 2 GPUs, 64K tokens:
 * "gpu" adds L kept buffers to the GPU; "host" puts them in the pinned arena (exactly their sum: all are live at
 * the turn from forward to backward) with two GPU staging pairs; "recompute" keeps none. */
static void test_kept_attention_memory(void **state) {
    (void)state;
    const int64_t S = 65536, C = 2, T = S / C, H = 24, D = 128, L = 4;
    const char *modes[] = {"parallel.attention_output=recompute", "parallel.attention_output=gpu",
                           "parallel.attention_output=host"};
    cp_plan p[3];
    for (int k = 0; k < 3; k++) {
        const char *sets[] = {"parallel.gpus=2", "model.layers=4", "train.seq_len=64K", "parallel.offload=none",
                              "parallel.optimizer=gpu", "parallel.checkpoint_every=1", modes[k]};
        plan_of(&p[k], 7, sets);
        assert_true(p[k].fits);
    }
    int64_t out = T * H * D * 2, lse = H / C * S * 4;
    assert_int_equal(out, 32768LL * 3072 * 2);
    assert_int_equal(lse, 12LL * 65536 * 4);
    /* recompute: only the scratch the layer being recomputed uses */
    assert_int_equal(p[0].cat_bytes[CP_CAT_ATTN_SAVED] + p[0].cat_host_bytes[CP_CAT_ATTN_SAVED], 0);
    /* gpu */
    assert_int_equal(p[1].attn_gpu_layers, L);
    assert_int_equal(buf(&p[1], "attn_out.3")->bytes, out);
    assert_int_equal(buf(&p[1], "lse.3")->bytes, lse);
    assert_int_equal(p[1].cat_bytes[CP_CAT_ATTN_SAVED], L * (out + lse));
    assert_int_equal(p[1].host_arena, p[0].host_arena);
    assert_true(p[1].gpu_arena - p[0].gpu_arena <= L * (out + lse));
    assert_true(p[1].gpu_arena - p[0].gpu_arena >= (L - 1) * (out + lse));
    /* host */
    assert_int_equal(p[2].attn_host_layers, L);
    assert_int_equal(buf(&p[2], "attn_out.0")->space, CP_SPACE_HOST);
    assert_int_equal(buf(&p[2], "attn_stage.1")->bytes, out);
    assert_int_equal(buf(&p[2], "lse_stage.1")->bytes, lse);
    assert_int_equal(p[2].cat_host_bytes[CP_CAT_ATTN_SAVED], L * (out + lse));
    assert_int_equal(p[2].host_arena - p[0].host_arena, L * (out + lse));
    assert_int_equal(p[2].cat_bytes[CP_CAT_ATTN_SAVED], 2 * (out + lse));
    assert_true(p[2].gpu_arena - p[0].gpu_arena <= 2 * (out + lse));
    /* out after each forward, back before each backward: 2 copies each way per layer */
    assert_int_equal(count_steps(&p[2], "offload_attn") + count_steps(&p[2], "offload_lse"), 2 * L);
    assert_int_equal(count_steps(&p[2], "prefetch_attn") + count_steps(&p[2], "prefetch_lse"), 2 * L);
    /* both kept modes skip the recompute's attention forward and its all-to-all back (C = 2) */
    for (int k = 1; k < 3; k++) {
        assert_int_equal(count_steps(&p[k], "attn_fwd"), count_steps(&p[0], "attn_fwd") / 2);
        assert_int_equal(count_steps(&p[k], "a2a_o"), count_steps(&p[0], "a2a_o") / 2);
        assert_true(p[k].t_step < p[0].t_step);
    }
    for (int k = 0; k < 3; k++) cp_plan_free(&p[k]);
}

/* The Llama-3.1-8B shape on 8 GPUs at 5M tokens with 80 GB GPUs, every checkpoint on the host. */
/* The memset before each attention backward: ordered dQ sums (the default) zero the progress counters after the
 * fp32 dQ only, atomic ones (train.deterministic = false) the whole workspace they add into; the attention module
 * is built for the one or the other. */
static void test_dq_order(void **state) {
    (void)state;
    for (int det = 0; det < 2; det++) {
        const char *sets[] = {"train.seq_len=32K", det ? "train.deterministic=true" : "train.deterministic=false"};
        cp_plan p;
        plan_of(&p, 2, sets);
        int found = 0;
        for (int i = 0; i < p.nsteps; i++) {
            const cp_step *st = &p.steps[i];
            if (st->kind != CP_OP_KERNEL || strcmp(st->what, "attn_bwd") != 0) continue;
            const cp_kernel_spec *ak = &p.modules[st->module];
            bool atomic = false;
            for (int k = 0; k < ak->nparams; k++)
                if (!strcmp(ak->params[k].key, "DQ_ATOMIC")) atomic = strcmp(ak->params[k].value, "1") == 0;
            assert_int_equal(atomic, !det);
            /* the memset of the dQ workspace just before it */
            const int ws = st->ops[6].buf;
            const cp_step *z = NULL;
            for (int j = i - 1; j >= 0 && !z; j--)
                if (p.steps[j].kind == CP_OP_MEMSET && p.steps[j].ops[0].buf == ws) z = &p.steps[j];
            assert_non_null(z);
            const int64_t off = det ? cp_k_attention_prog_offset(ak) : 0,
                          bytes = det ? cp_k_attention_prog_bytes(ak) : cp_k_attention_workspace_bytes(ak);
            assert_int_equal(z->ops[0].offset, off);
            assert_int_equal(z->ops[0].bytes, bytes);
            assert_int_equal(bytes, det ? 8 * 256 * 4 : 32768LL * 24 * 128 * 4 + 8 * 256 * 4); /* 8 KV heads x 256 key blocks */
            found++;
        }
        assert_int_equal(found, 28);
        cp_plan_free(&p);
    }
}

static void test_8b_arithmetic(void **state) {
    (void)state;
    cp_spec s;
    load("llama8b", &s, 6, "parallel.gpus=8", "train.seq_len=5M", "machine.gpu_mem=80G", "parallel.offload=all",
         "machine.host_mem=2T", "parallel.attention_output=recompute");
    cp_plan p;
    build(&s, &p);
    const int64_t V = 128256, h = 4096, L = 32, H = 32, KV = 8, D = 128, F = 14336, C = 8;
    const int64_t S = 5 * 1024 * 1024, T = S / C;
    assert_int_equal(T, 655360);
    int64_t layer = 4096 * 4096      /* q */
                    + 1024 * 4096 * 2 /* k, v */
                    + 4096 * 4096    /* o */
                    + 14336 * 4096 * 3 /* gate, up, down */
                    + 4096 * 2;      /* norms */
    assert_int_equal(layer, 218112000);
    assert_int_equal(p.layout.padded, layer); /* already a multiple of 64 x 8 elements */
    int64_t embed = V * h, head = 4096 + V * h;
    assert_int_equal(embed % (64 * C), 0);
    assert_int_equal(head % (64 * C), 0);
    int64_t shard = (embed + L * layer + head) / C;
    assert_int_equal(p.params_shard, shard);
    assert_int_equal(p.params_total, 8030261248LL);
    /* model states per GPU: bf16 params 2 + fp32 master 4 + moments 8 + fp32 grads 4 bytes per element */
    assert_int_equal(p.cat_bytes[CP_CAT_PARAMS], shard * 2);
    assert_int_equal(p.cat_bytes[CP_CAT_MASTER], shard * 4);
    assert_int_equal(p.cat_bytes[CP_CAT_OPTIM], shard * 8);
    assert_int_equal(p.cat_bytes[CP_CAT_GRADS], shard * 4);
    /* FSDP: two gathered layers (in use, prefetched) + gathered embedding and head; full fp32 grads likewise */
    assert_int_equal(p.cat_bytes[CP_CAT_GATHERED], 2 * layer * 2 + embed * 2 + head * 2);
    assert_int_equal(p.cat_bytes[CP_CAT_UNIT_GRADS], layer * 4 + embed * 4 + head * 4);
    /* every checkpoint on the host, two GPU staging buffers for the copies */
    assert_int_equal(p.ckpt_host_layers, L);
    assert_int_equal(p.cat_host_bytes[CP_CAT_CKPT], L * T * h * 2);
    assert_int_equal(p.cat_bytes[CP_CAT_CKPT], 2 * T * h * 2);
    assert_int_equal(p.host_arena, L * T * h * 2);
    /* UPipe U = 8 on 8 GPUs: 4 stages of one query head per GPU, K/V of one head per GPU once per 4 stages */
    assert_int_equal(p.nstages, 4);
    assert_int_equal(p.u, 1);
    assert_int_equal(p.kvr, 1);
    assert_int_equal(p.group_len, 4);
    assert_int_equal(buf(&p, "q_stage")->bytes, T * 8 * D * 2);  /* this rank's tokens, the stage's 8 heads */
    assert_int_equal(buf(&p, "k_stage")->bytes, T * KV * D * 2); /* the group's 8 KV heads */
    assert_int_equal(buf(&p, "q_heads")->bytes, S * 1 * D * 2);  /* all tokens, one head */
    assert_int_equal(buf(&p, "dkv_accum.f32")->bytes, 2 * S * 1 * D * 4);
    /* the fp32 dQ, then a progress counter per key block of 128 (1 KV head) that orders its sums */
    assert_int_equal(buf(&p, "dq_accum.f32")->bytes, S * 1 * D * 4 + 1 * (S / 128) * 4);
    assert_int_equal(buf(&p, "a2a_send")->bytes, T * 8 * D * 2);
    assert_int_equal(buf(&p, "attn_out")->bytes, T * H * D * 2);
    assert_int_equal(buf(&p, "lse")->bytes, (H / C) * S * 4);
    assert_int_equal(buf(&p, "delta")->bytes, T * H * 4);
    /* tiles: MLP tiles grown from 4K tokens into the memory left (test_mlp_tile_auto), loss tiles of at most 512 MiB
     * of logits */
    assert_int_equal(p.mlp_tile, T / 4);
    assert_int_equal(p.cat_bytes[CP_CAT_MLP], 3 * (T / 4) * F * 2);
    assert_true(p.loss_tile * V * 2 <= (512LL << 20));
    assert_int_equal(T % p.loss_tile, 0);
    /* the deterministic sums' scratch: each token's loss; a 4096-float row per norm backward block (2 rounds of 2
     * blocks on each of at most 192 SMs); a double per sumsq block (4 per SM); the step's scalars */
    assert_int_equal(buf(&p, "token_loss")->bytes, T * 4);
    assert_int_equal(buf(&p, "norm_partials.f32")->bytes, 192 * 2 * 2 * h * 4);
    assert_int_equal(buf(&p, "sumsq_partials")->bytes, 192 * 4 * 8);
    assert_int_equal(buf(&p, "loss_sum")->bytes, 256);
    /* what is live at the peak sums to the live peak; the arena holds it */
    int64_t at_peak = 0;
    for (int k = 0; k < CP_CAT_COUNT; k++) at_peak += p.cat_at_peak[k];
    assert_int_equal(at_peak, p.gpu_live_peak);
    assert_true(p.gpu_arena >= p.gpu_live_peak);
    assert_true(p.gpu_peak <= 80LL << 30);
    assert_true(p.fits);
    /* attention FLOPs per GPU: forward 4 S^2 (H/C) D / 2 per layer, recomputed once, backward 2.5x */
    double fwd = 4.0 * (double)S * S * (H / C) * D / 2 * L;
    assert_true(p.flops_attn > fwd * 4.5 * (1 - 1e-9) && p.flops_attn < fwd * 4.5 * (1 + 1e-9));
    cp_plan_free(&p);
}

/* Every query head once per layer; each rank holds the KV head of each of its query heads; K,V fresh exactly at
 * the first stage of each group. */
static void check_stage_table(const cp_plan *p, int H, int KV) {
    int g = H / KV, C = p->C;
    int *seen = calloc((size_t)H, sizeof(int));
    for (int s = 0; s < p->nstages; s++) {
        for (int r = 0; r < C; r++) {
            const cp_stage_rank *e = &p->stages[s * C + r];
            assert_int_equal(e->nq, p->u);
            assert_int_equal(e->kv_fresh, s % p->group_len == 0);
            assert_int_equal(e->kv_last, s % p->group_len == p->group_len - 1);
            for (int j = 0; j < e->nq; j++) {
                int q = e->q_heads[j];
                assert_true(q >= 0 && q < H);
                seen[q]++;
                bool held = false;
                for (int k = 0; k < e->nkv; k++) held |= e->kv_heads[k] == q / g;
                assert_true(held);
            }
            if (!e->kv_fresh) { /* same KV heads as the stage before */
                const cp_stage_rank *prev = &p->stages[(s - 1) * C + r];
                assert_int_equal(prev->nkv, e->nkv);
                for (int k = 0; k < e->nkv; k++) assert_int_equal(prev->kv_heads[k], e->kv_heads[k]);
            }
        }
    }
    for (int q = 0; q < H; q++) assert_int_equal(seen[q], 1);
    free(seen);
}

static void stage_case(const char *heads, const char *kv, const char *gpus, const char *U, int H, int KV,
                       int expect_group, int expect_repl) {
    cp_spec s;
    char a[64], b[64], c[64], d[64];
    snprintf(a, sizeof a, "model.heads=%s", heads);
    snprintf(b, sizeof b, "model.kv_heads=%s", kv);
    snprintf(c, sizeof c, "parallel.gpus=%s", gpus);
    snprintf(d, sizeof d, "parallel.upipe_heads=%s", U);
    load("tiny", &s, 6, a, b, c, d, "model.hidden=512", "model.head_dim=64");
    cp_plan p;
    build(&s, &p);
    check_stage_table(&p, H, KV);
    assert_int_equal(p.group_len, expect_group);
    assert_int_equal(p.repl, expect_repl);
    cp_plan_free(&p);
}

static void test_stage_tables(void **state) {
    (void)state;
    stage_case("8", "8", "2", "2", 8, 8, 1, 1);   /* GQA 1: every stage projects its own K,V */
    stage_case("24", "8", "2", "2", 24, 8, 3, 1); /* GQA 3 (the 3B shape): K,V kept over 3 stages */
    stage_case("32", "8", "8", "8", 32, 8, 4, 1); /* GQA 4 (the 8B shape), U = C */
    stage_case("8", "2", "4", "4", 8, 2, 2, 2);   /* KV heads < GPUs: each KV head on 2 GPUs */
    stage_case("8", "1", "2", "2", 8, 1, 4, 2);   /* one KV head (MQA) on 2 GPUs */
    stage_case("8", "8", "2", "8", 8, 8, 1, 1);   /* plain Ulysses (U = H), 4 heads per GPU */
    stage_case("8", "2", "2", "8", 8, 2, 1, 1);   /* U = H with GQA 4: 4 query heads, 1 KV head per GPU */
}

/* The layout of the 3B shape's stages on 2 GPUs, written out. */
static void test_stage_table_3b(void **state) {
    (void)state;
    cp_spec s;
    load("llama3b", &s, 3, "parallel.gpus=2", "parallel.upipe_heads=2", "train.seq_len=64K");
    cp_plan p;
    build(&s, &p);
    assert_int_equal(p.nstages, 12);
    /* stage s, rank r: KV head (s div 3)*2 + r, query head kv*3 + s mod 3 */
    for (int st = 0; st < 12; st++)
        for (int r = 0; r < 2; r++) {
            int kv = (st / 3) * 2 + r;
            assert_int_equal(p.stages[st * 2 + r].kv_heads[0], kv);
            assert_int_equal(p.stages[st * 2 + r].q_heads[0], kv * 3 + st % 3);
        }
    /* ranks hold NCCL's buffers beside the context */
    assert_int_equal(p.gpu_peak, p.gpu_arena + s.machine.reserve + s.machine.comm_reserve);
    cp_plan_free(&p);
}

/* Property: over many random small specs, buffers alive at the same step never share bytes, every buffer lies
 * inside its arena, and nothing is read before it is written (liveness succeeded). */
static void test_arena_property(void **state) {
    (void)state;
    srand(12345);
    const int heads_kv[][2] = {{4, 4}, {4, 2}, {4, 1}, {8, 2}, {6, 2}, {8, 8}, {12, 4}};
    int checked = 0;
    for (int iter = 0; iter < 60; iter++) {
        int hk = rand() % (int)(sizeof heads_kv / sizeof heads_kv[0]);
        int H = heads_kv[hk][0], KV = heads_kv[hk][1];
        int gpus_opts[] = {1, 2, 4};
        int C = gpus_opts[rand() % 3];
        if (H % C) C = 1;
        int g = H / KV;
        /* a valid U: a multiple of C dividing H, with u | g or g | u, and the replication rule */
        int cand[16], nc = 0;
        for (int U = C; U <= H; U += C) {
            if (H % U) continue;
            int u = U / C;
            if (KV < C) {
                if (C % KV || g % (u * (C / KV))) continue;
            } else if (KV % C) continue;
            if (u % g && g % u) continue;
            cand[nc++] = U;
        }
        if (!nc) continue;
        int U = cand[rand() % nc];
        int64_t T = 64 * (1 + rand() % 8);
        const char *offload[] = {"none", "all", "auto"};
        char sets[10][64];
        snprintf(sets[0], 64, "model.heads=%d", H);
        snprintf(sets[1], 64, "model.kv_heads=%d", KV);
        snprintf(sets[2], 64, "model.hidden=%d", H * 32);
        snprintf(sets[3], 64, "model.head_dim=64");
        snprintf(sets[4], 64, "parallel.gpus=%d", C);
        snprintf(sets[5], 64, "parallel.upipe_heads=%d", U);
        snprintf(sets[6], 64, "train.seq_len=%lld", (long long)(T * C));
        snprintf(sets[7], 64, "parallel.offload=%s", offload[rand() % 3]);
        snprintf(sets[8], 64, "model.layers=%d", 1 + rand() % 4);
        snprintf(sets[9], 64, "model.tie_embeddings=%s", rand() % 2 ? "true" : "false");
        const char *sp[10];
        for (int i = 0; i < 10; i++) sp[i] = sets[i];
        cp_spec s;
        char err[CP_ERR_MAX];
        if (cp_spec_load("tiny", sp, 10, &s, err, sizeof err)) fail_msg("spec: %s", err);
        cp_plan p;
        if (cp_plan_build(&s, &p, err, sizeof err)) fail_msg("plan: %s", err);
        for (int i = 0; i < p.nbufs; i++) {
            const cp_buffer *a = &p.bufs[i];
            if (a->offset < 0) continue;
            int64_t arena = a->space == CP_SPACE_GPU ? p.gpu_arena : p.host_arena;
            assert_true(a->offset % CP_ARENA_ALIGN == 0);
            assert_true(a->offset + a->bytes <= arena);
            for (int j = i + 1; j < p.nbufs; j++) {
                const cp_buffer *b = &p.bufs[j];
                if (b->offset < 0 || b->space != a->space || !cp_plan_lifetimes_overlap(a, b)) continue;
                bool disjoint = a->offset + a->bytes <= b->offset || b->offset + b->bytes <= a->offset;
                if (!disjoint) fail_msg("%s and %s are alive together and overlap", a->name, b->name);
            }
        }
        checked++;
        cp_plan_free(&p);
    }
    assert_true(checked >= 40);
}

/* A folded plan (runs of tiles held once) against its flat program, the one cp_plan_build hands the runtime: the same
 * figures, step numbers, offsets and live peak, every tile of a loop at its rows, and packing the flat program's own
 * lifetimes from scratch gives the folded offsets again (so folding changes nothing but the planner's work). Over
 * runs of 1 to 4 tiles (nothing or one tile folded), long ones, several micro-batches, segments, offloaded
 * checkpoints, the optimizer on the host, replicas and a ring. */
static void test_folded_matches_flat(void **state) {
    (void)state;
    static const char *cases[][6] = {
        {"tiny"},
        {"tiny", "train.seq_len=3K"},
        {"tiny", "train.seq_len=6K"},
        {"tiny", "train.seq_len=9K"},
        {"tiny", "train.seq_len=12K", "parallel.loss_tile=512"},
        {"tiny", "train.seq_len=1M"},
        {"tiny", "parallel.ring=2", "train.seq_len=32K"},
        {"tiny", "train.seq_len=64K", "parallel.offload=all", "parallel.optimizer=host"},
        {"tiny", "parallel.gpus=2", "parallel.replicas=2", "train.seq_len=64K"},
        {"llama1b", "parallel.gpus=1", "train.seq_len=256K", "parallel.checkpoint_every=4"},
        {"llama3b", "parallel.gpus=1", "train.seq_len=128K"},
        {"llama8b", "parallel.gpus=8", "train.seq_len=1M", "train.micro_batches=2"},
        {"tiny", "train.seq_len=12K", "train.precision=fp8"},
        {"llama3b", "parallel.gpus=1", "train.seq_len=128K", "train.precision=fp8"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int n = 1;
        while (n < 6 && cases[c][n]) n++;
        char err[CP_ERR_MAX];
        cp_spec s;
        if (cp_spec_load(cases[c][0], cases[c] + 1, n - 1, &s, err, sizeof err)) fail_msg("spec: %s", err);
        cp_plan f, p;
        if (cp_plan_build_folded(&s, &f, err, sizeof err)) fail_msg("folded: %s", err);
        build(&s, &p);
        assert_int_equal(p.nloops, 0);
        int64_t tiles = p.T / p.mlp_tile;
        if (tiles > 3) assert_true(f.nloops > 0);
        assert_int_equal(cp_plan_flat_steps(&f), p.nsteps);
        assert_int_equal(cp_plan_flat_index(&f, f.micro_steps), p.micro_steps);
        assert_int_equal(cp_plan_flat_index(&f, f.peak_step), p.peak_step);
        assert_int_equal(f.gpu_arena, p.gpu_arena);
        assert_int_equal(f.host_arena, p.host_arena);
        assert_int_equal(f.gpu_live_peak, p.gpu_live_peak);
        assert_memory_equal(f.cat_at_peak, p.cat_at_peak, sizeof f.cat_at_peak);
        assert_true(fabs(f.t_step - p.t_step) <= 1e-12 * p.t_step);
        assert_true(fabs(f.flops_other - p.flops_other) <= 1e-12 * p.flops_other);
        assert_true(f.fits == p.fits);
        assert_int_equal(f.nbufs, p.nbufs);
        for (int i = 0; i < f.nbufs; i++) assert_int_equal(f.bufs[i].offset, p.bufs[i].offset);
        /* each folded step at its flat place; a loop's repeats at the next tiles and rows */
        for (int i = 0, lp = 0; i < f.nsteps; i++) {
            const cp_step *a = &f.steps[i];
            int64_t reps = cp_plan_step_repeats(&f, i), at = cp_plan_flat_index(&f, i);
            int64_t body = lp < f.nloops && i >= f.loops[lp].first ? f.loops[lp].nsteps : 0;
            for (int64_t r = 0; r < reps; r++) {
                const cp_step *b = &p.steps[at + r * body];
                assert_string_equal(a->what, b->what);
                assert_int_equal(a->layer, b->layer);
                assert_int_equal(a->phase, b->phase);
                assert_int_equal(a->tile + r, b->tile);
                assert_int_equal(a->nops, b->nops);
                for (int o = 0; o < a->nops; o++) {
                    assert_int_equal(a->ops[o].buf, b->ops[o].buf);
                    assert_int_equal(a->ops[o].offset + r * a->ops[o].stride, b->ops[o].offset);
                    assert_int_equal(a->ops[o].bytes, b->ops[o].bytes);
                }
            }
            if (body && i + 1 == f.loops[lp].first + f.loops[lp].nsteps) lp++;
        }
        /* the flat program's lifetimes packed afresh */
        cp_plan_assign_offsets(&p);
        assert_int_equal(p.gpu_arena, f.gpu_arena);
        assert_int_equal(p.host_arena, f.host_arena);
        for (int i = 0; i < f.nbufs; i++) assert_int_equal(f.bufs[i].offset, p.bufs[i].offset);
        cp_plan_free(&f);
        cp_plan_free(&p);
    }
}

/* What an FP8 scale slot or copy buffer holds while the checker walks an fp8 program: the operand it was made
 * from, the format and (copies) whether transposed and with which slot's scale. */
typedef struct {
    bool valid, transposed;
    cp_operand src;
    bool e5m2;
    int64_t slot;
    /* a copy buffer of one weight of every layer (layers > 1): src and slot layer 0's, layer z's copy z n bytes on,
     * made from src stride bytes on each layer, its scales pitch floats on */
    int64_t layers, stride, n, pitch;
} fp8_held;

/* The bytes of held entry h's sources: every layer's for a copy of every layer's weight */
static int64_t fp8_extent(const fp8_held *h) {
    return (h->layers > 1 ? (h->layers - 1) * h->stride : 0) + h->src.bytes;
}

static bool fp8_same(const cp_operand *a, const cp_operand *b) {
    return a->buf == b->buf && a->offset == b->offset && a->bytes == b->bytes;
}

/* FP8 step x's copy (cp_step.fp8), which the executor checks the cast by, after checking that the kernel its role
 * names is of the same layout */
static cp_fp8_copy fp8_copy(const cp_step *x) {
    const cp_fp8_copy c = x->fp8;
    const char *r = x->role;
    bool block = x->task == CP_TASK_FP8_CAST_BLOCK;
    if ((strstr(r, "e5m2") != NULL) != (c.fmt == CP_GEMM_E5M2) || (c.fmt != CP_GEMM_E4M3 && c.fmt != CP_GEMM_E5M2) ||
        (strstr(r, "cast_t_") == r) != c.transposed || (strstr(r, "cast_rt_") == r) != c.both ||
        (strstr(r, "_2d_") != NULL) != (c.scale == CP_GEMM_SCALE_2D) ||
        (strstr(r, "_1d_") != NULL) != (c.scale == CP_GEMM_SCALE_1D) ||
        (strstr(r, "_row_") != NULL || strstr(r, "_row8_") != NULL) != (c.scale == CP_GEMM_SCALE_ROW) ||
        (strstr(r, "_row8_") != NULL) != (c.from_rows && !c.both) || block != (c.scale != CP_GEMM_SCALE_TENSOR))
        fail_msg("FP8 step %s (layer %d): role %s against its copy (format %d, scale %d, transposed %d)", x->what,
                 x->layer, r, c.fmt, c.scale, c.transposed);
    return c;
}

/* FP8 GEMM step x (y before the fp8 pass): a GEMM cuBLASLt takes, its two scale operands behind its inputs, each
 * input a copy held of the operand y reads now, the way round the GEMM reads it */
static void fp8_gemm_inputs(const fp8_held *held, int i, const cp_step *x, const cp_step *y) {
    const cp_gemm *g = &y->gemm;
    char e[256];
    const void *at = (const void *)(uintptr_t)256; /* any aligned address: the arena's come later */
    if (cp_gemm_check(&x->gemm, x->what, at, at, at, at, e, sizeof e)) fail_msg("%s", e);
    assert_int_equal(x->nops, y->nops + 2);
    for (int in = 0; in < 2; in++) {
        const fp8_held *h = &held[x->ops[in].buf];
        const cp_operand *sc = &x->ops[x->nops - 2 + in];
        cp_operand src = h->src; /* of the copy the GEMM reads: layer z's of a copy of every layer's weight */
        int64_t z = 0;
        if (h->layers > 1) {
            z = x->ops[in].offset / h->n;
            assert_true(x->ops[in].offset == z * h->n && x->ops[in].bytes == h->n && z < h->layers);
            src.offset += z * h->stride;
        } else {
            assert_int_equal(x->ops[in].offset, 0);
        }
        if (!h->valid || !fp8_same(&src, &y->ops[in]))
            fail_msg("step %d (%s, layer %d, tile %d): input %d's copy is not of its operand now", i, x->what,
                     x->layer, x->tile, in);
        assert_true(h->transposed == (in ? !g->trans_b : g->trans_a));
        assert_true(sc->buf == x->ops[in].buf && sc->offset == h->slot + z * h->pitch * 4 && sc->access == CP_READ);
    }
}

/* A cast of one weight of every layer (cp_plan.fp8_weights_once), both ways at the program's start with `scale`'s
 * scales (row: the transposed copies from the row copies): from the parameters the layers' weights apart, the copies
 * and their scales laid out as gen/plan.h says, held for each layer's GEMMs to read their slice (fp8_gemm_inputs) */
static void fp8_layered_cast(const cp_plan *f, const cp_step *x, int scale, fp8_held *held) {
    const cp_fp8_copy cc = fp8_copy(x);
    const int64_t rows = x->count, cols = x->heads, n = rows * cols, nl = cc.layers;
    const int64_t so = cp_fp8_layers_scales_off(nl, rows, cols);
    const int64_t pitch[2] = {cp_fp8_layers_pitch(scale, rows, cols, false),
                              cp_fp8_layers_pitch(scale, rows, cols, true)};
    const bool row = scale == CP_GEMM_SCALE_ROW;
    assert_true(cc.both && cc.from_rows == row && !cc.transposed && cc.scale == scale && cc.fmt == CP_GEMM_E4M3 &&
                nl == f->spec.model.layers && x->nops == 5 && x->ld == cols && x->layer < 0 && f->fp8_weights_once &&
                (!row || cols % CP_FP8_ROW8_COLS == 0));
    assert_true(f->bufs[x->ops[0].buf].cat == CP_CAT_PARAMS && cc.src_stride == f->unit_padded[1] &&
                x->ops[0].bytes == (nl - 1) * cc.src_stride * 2 + 2 * n && x->ops[0].access == CP_READ);
    for (int k = 0; k < 2; k++) {
        const cp_operand *cp = &x->ops[1 + 2 * k], *sc = &x->ops[2 + 2 * k];
        assert_true(f->bufs[cp->buf].cat == CP_CAT_FP8 && cp->offset == 0 && cp->bytes == nl * n &&
                    sc->buf == cp->buf && sc->offset == so && sc->bytes == nl * pitch[k] * 4 &&
                    sc->offset + sc->bytes <= f->bufs[cp->buf].bytes && (cp->access & CP_WRITE));
        held[cp->buf] = (fp8_held){.valid = true, .transposed = k == 1, .slot = so, .layers = nl,
                                   .stride = cc.src_stride * 2, .n = n, .pitch = pitch[k],
                                   .src = {.buf = x->ops[0].buf, .offset = x->ops[0].offset, .bytes = 2 * n}};
    }
}

/* What step x writes no longer holds what was made from it: each of the n entries of held made from it is dropped */
static void fp8_forget(fp8_held *held, int n, const cp_step *x) {
    for (int o = 0; o < x->nops; o++) {
        const cp_operand *w = &x->ops[o];
        if (!(w->access & CP_WRITE)) continue;
        for (int k = 0; k < n; k++)
            if (held[k].valid && held[k].src.buf == w->buf && held[k].src.offset < w->offset + w->bytes &&
                w->offset < held[k].src.offset + fp8_extent(&held[k]))
                held[k].valid = false;
    }
}

/* Where the plan casts every layer's weights once (cp_plan.fp8_weights_once, fill_memory): where memory is left and
 * the cost model gains 0.1% of the step (the 3B at 32K, both scalings), not where the weights are gathered (two GPUs:
 * each layer's arrive just before its GEMMs) nor where the gain is a sliver of the step (the 8B at 128K, whose default
 * plan would be left with half a GiB); the plan fits either way. */
static void test_fp8_weights_once(void **state) {
    (void)state;
    const struct {
        const char *spec, *seq, *gpus, *scaling;
        bool once;
    } cases[] = {{"llama3b", "train.seq_len=32K", "parallel.gpus=1", "train.fp8_scaling=block", true},
                 {"llama3b", "train.seq_len=32K", "parallel.gpus=1", "train.fp8_scaling=row", true},
                 {"llama3b", "train.seq_len=32K", "parallel.gpus=2", "train.fp8_scaling=row", false},
                 {"llama8b", "train.seq_len=128K", "parallel.gpus=1", "train.fp8_scaling=block", false},
                 {"llama3b", "train.seq_len=32K", "parallel.gpus=1", "train.fp8_scaling=tensor", false}};
    for (size_t i = 0; i < CP_ARRAY_LEN(cases); i++) {
        cp_spec s;
        cp_plan p;
        load(cases[i].spec, &s, 4, cases[i].seq, cases[i].gpus, "train.precision=fp8", cases[i].scaling);
        build(&s, &p);
        int layered = 0;
        for (int j = 0; j < p.nsteps; j++) layered += p.steps[j].fp8.layers > 1;
        print_message("  %s %s %s %s: %s (%d casts of every layer's weight)\n", cases[i].spec, cases[i].seq,
                      cases[i].gpus, cases[i].scaling, p.fp8_weights_once ? "weights cast once" : "per layer", layered);
        assert_true(p.fits && p.fp8_weights_once == cases[i].once && layered == (cases[i].once ? 7 : 0));
        assert_true(cases[i].once ? p.fp8_weights_bytes > 5600000000LL : p.fp8_weights_bytes == 0);
        cp_plan_free(&p);
    }
}

/* train.precision = "fp8" (gen/plan_fp8.c): every GEMM of a layer, and only those, reads FP8 copies of the very
 * operands the bf16 plan gives it, made by a cast (transposed where that GEMM read them transposed; E5M2 for a
 * backward GEMM's gradient, and only there) with the scale of an amax of the same operand (by a pass of its own, or
 * by the rmsnorm or SwiGLU kernel that wrote exactly that operand), with nothing written to that operand, that
 * scale or that copy since; a tensor read by several GEMMs is cast and measured once while
 * it holds (q, k and v share one copy; MLP weights are cast once per layer and pass, not per tile); the copies are
 * counted in memory; the step is predicted faster at the 3B shape; the rest of the program is the bf16 plan's.
 * Over one GPU's 1 and 8 MLP tiles and two GPUs' UPipe stages and gathered weights.
 * Checked on the flat program the runtime runs, so folded tiles are checked in every repeat. */
static void test_fp8(void **state) {
    (void)state;
    const char *shapes[][3] = {{"tiny", "train.seq_len=2K"},
                               {"llama3b", "train.seq_len=32K", "parallel.gpus=1"},
                               {"llama8b", "train.seq_len=64K", "parallel.gpus=2"}};
    for (int c = 0; c < 3; c++) {
        cp_spec s;
        cp_plan b, f;
        load(shapes[c][0], &s, 2, shapes[c][1], shapes[c][2] ? shapes[c][2] : "train.micro_batches=8");
        build(&s, &b);
        s.train.fp8 = true;
        s.train.fp8_scaling = CP_FP8_SCALING_TENSOR; /* per-tensor scales, E5M2 gradients */
        s.train.fp8_e4m3_grads = false;
        s.train.fp8_bf16_wgrad = false;                       /* every layer GEMM on FP8 */
        build(&s, &f);
        fp8_held *held = calloc((size_t)f.nbufs, sizeof *held); /* each copy buffer */
        fp8_held slot[256] = {0}; /* each scale slot, by its offset / CP_FP8_SLOT_BYTES */
        int *wcast = calloc((size_t)f.nsteps, sizeof *wcast);    /* the casts of weights */
        int bi = 0, gemms = 0, layer_gemms = 0, casts = 0, amaxes = 0, grad_gemms = 0, weight_casts = 0, own = 0;
        for (int i = 0; i < f.nsteps; i++) {
            const cp_step *x = &f.steps[i];
            if (x->task == CP_TASK_FP8_AMAX) {
                amaxes++;
                int64_t k = x->ops[3].offset / CP_FP8_SLOT_BYTES;
                assert_true(k < 256 && x->ops[3].offset % CP_FP8_SLOT_BYTES == 0);
                slot[k] = (fp8_held){.valid = true, .src = x->ops[0], .e5m2 = fp8_copy(x).fmt == CP_GEMM_E5M2};
                for (int o = 0; o < f.nbufs; o++)
                    if (held[o].slot == k) held[o].valid = false;
                continue;
            }
            if (x->task == CP_TASK_FP8_CAST) {
                casts++;
                cp_cat from = f.bufs[x->ops[0].buf].cat;
                if (from == CP_CAT_PARAMS || from == CP_CAT_GATHERED) { /* once per layer, pass and orientation */
                    for (int w = 0; w < weight_casts; w++) {
                        const cp_step *o = &f.steps[wcast[w]];
                        if (fp8_same(&o->ops[0], &x->ops[0]) && o->fp8.transposed == x->fp8.transposed &&
                            o->fp8.fmt == x->fp8.fmt && o->layer == x->layer &&
                            (o->phase == CP_PHASE_FWD) == (x->phase == CP_PHASE_FWD))
                            fail_msg("steps %d and %d (layer %d): the same weights cast twice in one pass", wcast[w],
                                     i, x->layer);
                    }
                    wcast[weight_casts++] = i;
                }
                int64_t k = x->ops[1].offset / CP_FP8_SLOT_BYTES;
                const cp_fp8_copy cc = fp8_copy(x);
                bool e5 = cc.fmt == CP_GEMM_E5M2;
                assert_true(slot[k].valid && fp8_same(&slot[k].src, &x->ops[0]) && slot[k].e5m2 == e5);
                assert_int_equal(f.bufs[x->ops[2].buf].cat, CP_CAT_FP8);
                held[x->ops[2].buf] = (fp8_held){.valid = true, .transposed = cc.transposed, .src = x->ops[0],
                                                 .e5m2 = e5, .slot = k};
                continue;
            }
            if (x->kind == CP_OP_MEMSET && !strcmp(f.bufs[x->ops[0].buf].name, "fp8_state")) {
                memset(slot, 0, sizeof slot);
                continue;
            }
            const cp_step *y = &b.steps[bi++]; /* its place in the bf16 program */
            assert_string_equal(x->what, y->what);
            if (x->kind != CP_OP_GEMM) { /* as it was, but for the scale slots of its own amaxes */
                assert_int_equal(x->nops, y->nops + x->nfp8_out);
                for (int o = 0; o < y->nops; o++) assert_true(fp8_same(&x->ops[o], &y->ops[o]));
            }
            if (x->kind == CP_OP_GEMM) {
                gemms++;
                if (y->layer < 0) { /* the LM head's: as it was */
                    assert_int_equal(x->gemm.a_type, CP_GEMM_BF16);
                    assert_memory_equal(&x->gemm, &y->gemm, sizeof x->gemm);
                } else {
                    layer_gemms++;
                    bool grad = y->what[0] == 'd' && y->what[1] == '_'; /* d_wq, d_xn_q, d_act, ... */
                    assert_true(grad == y->gemm.a_grad);
                    assert_true(!grad || y->phase == CP_PHASE_BWD);
                    grad_gemms += grad;
                    assert_int_equal(x->gemm.a_type, grad ? CP_GEMM_E5M2 : CP_GEMM_E4M3);
                    assert_int_equal(x->gemm.b_type, CP_GEMM_E4M3);
                    assert_true(x->gemm.fast_accum == !grad);
                    assert_true(!x->gemm.trans_a && x->gemm.trans_b);
                    assert_int_equal(x->nops, y->nops + 2);
                    char e[256];
                    const void *at = (const void *)(uintptr_t)256; /* any aligned address: the arena's come later */
                    if (cp_gemm_check(&x->gemm, x->what, at, at, at, at, e, sizeof e)) fail_msg("%s", e);
                    for (int in = 0; in < 2; in++) {
                        const fp8_held *h = &held[x->ops[in].buf];
                        const cp_gemm *g = &y->gemm;
                        int64_t k = x->ops[x->nops - 2 + in].offset / CP_FP8_SLOT_BYTES;
                        assert_int_equal(f.bufs[x->ops[in].buf].cat, CP_CAT_FP8);
                        if (!h->valid || !fp8_same(&h->src, &y->ops[in]) || h->slot != k || !slot[k].valid)
                            fail_msg("step %d (%s, layer %d, tile %d): input %d's copy is not of its operand now", i,
                                     x->what, x->layer, x->tile, in);
                        assert_true(h->transposed == (in ? !g->trans_b : g->trans_a));
                        assert_true(h->e5m2 == (in == 0 && grad));
                        assert_true(x->ops[in].bytes == (in ? g->n : g->m) * g->k);
                    }
                }
            }
            /* what a step writes no longer holds its copies and scales */
            fp8_forget(held, f.nbufs, x);
            fp8_forget(slot, 256, x);
            /* a kernel's own amaxes: of an output it wrote whole, into a slot that then holds it */
            for (int j = 0; j < x->nfp8_out; j++) {
                const cp_step_fp8_out *a = &x->fp8_out[j];
                own++;
                assert_true(cp_plan_fp8_producer(&f, x, a->out, CP_GEMM_SCALE_TENSOR) &&
                            (x->ops[a->out].access & CP_WRITE));
                assert_int_equal(a->scales, -1);
                assert_true(a->slot >= y->nops && a->slot < x->nops);
                const cp_operand *so = &x->ops[a->slot];
                assert_true(!strcmp(f.bufs[so->buf].name, "fp8_state") && so->offset % CP_FP8_SLOT_BYTES == 0 &&
                            so->bytes == CP_FP8_SLOT_BYTES && so->access == CP_RW);
                int64_t k = so->offset / CP_FP8_SLOT_BYTES;
                slot[k] = (fp8_held){.valid = true, .src = x->ops[a->out], .e5m2 = a->fmt == CP_GEMM_E5M2};
                for (int o = 0; o < f.nbufs; o++)
                    if (held[o].slot == k) held[o].valid = false;
            }
        }
        free(held);
        free(wcast);
        assert_int_equal(bi, b.nsteps);
        assert_true(layer_gemms > 0 && layer_gemms < gemms && grad_gemms > 0 && grad_gemms < layer_gemms);
        /* made once while they hold: q, k and v (and gate and up) share the A copy, so fewer casts than inputs */
        print_message("%s fp8: %d layer GEMMs, %d casts (%d of weights), %d amax passes, %d amaxes in the kernels "
                      "that write the tensors\n", shapes[c][0], layer_gemms, casts, weight_casts, amaxes, own);
        assert_true(own > 0);
        assert_true(casts < 2 * layer_gemms && amaxes < casts);
        assert_int_equal(b.cat_bytes[CP_CAT_FP8], 0);
        assert_true(f.cat_bytes[CP_CAT_FP8] > 0);
        assert_true(f.gpu_peak > b.gpu_peak);
        if (c == 1) { /* the 3B step at 32K (measured: 2.43 s and 2.10 s, the casts 150 ms of it) */
            assert_true(f.t_step < b.t_step * 0.95);
            assert_true(f.t_fp8_casts > 0 && f.t_fp8_casts < 0.08 * f.t_step);
        }
        cp_plan_free(&b);
        cp_plan_free(&f);
    }
    /* the recipe's keys: every layer GEMM's gradient in E4M3, no fast accumulation anywhere */
    cp_spec s;
    cp_plan f;
    load("tiny", &s, 5, "train.precision=fp8", "train.fp8_scaling=tensor", "train.fp8_format=e4m3",
         "train.fp8_fast_accum=false", "train.fp8_weight_grads=fp8");
    build(&s, &f);
    int layer_gemms = 0;
    for (int i = 0; i < f.nsteps; i++) {
        const cp_gemm *g = &f.steps[i].gemm;
        if (f.steps[i].kind != CP_OP_GEMM || f.steps[i].layer < 0) continue;
        layer_gemms++;
        assert_true(g->a_type == CP_GEMM_E4M3 && g->b_type == CP_GEMM_E4M3 && !g->fast_accum);
    }
    assert_true(layer_gemms > 0);
    cp_plan_free(&f);
    /* train.fp8_input_grads = "bf16": FP8 left to the forward (and its recompute) and the weights' gradients */
    load("tiny", &s, 3, "train.precision=fp8", "train.fp8_weight_grads=fp8", "train.fp8_input_grads=bf16");
    build(&s, &f);
    int on_fp8[3] = {0}, in_bf16[3] = {0}; /* forward, dX, dW */
    for (int i = 0; i < f.nsteps; i++) {
        const cp_gemm *g = &f.steps[i].gemm;
        if (f.steps[i].kind != CP_OP_GEMM || f.steps[i].layer < 0) continue;
        const int kind = g->w_grad ? 2 : g->a_grad ? 1 : 0;
        (g->a_type == CP_GEMM_BF16 ? in_bf16 : on_fp8)[kind]++;
    }
    assert_true(on_fp8[0] > 0 && in_bf16[0] == 0 && on_fp8[1] == 0 && in_bf16[1] > 0 && on_fp8[2] > 0 &&
                in_bf16[2] == 0);
    cp_plan_free(&f);
}

/* train.fp8_gemm on the 3B at 32K in fp8: under "auto" (the default) the generator's kernel takes exactly the
 * block-scaled GEMMs where it measured faster than cuBLASLt inside the step (cp_plan_fp8_kernel_wins: with the
 * weights' gradients on FP8 those of 3072 rows or more; none with them in bf16), as a gemm_fp8 module and its sm90
 * entry on the GEMM step, one module a shape; "cublaslt" none; "cpgen" every one it takes. The step keeps its
 * cp_gemm, the plan its buffers, and the cost model prices the kernel's GEMMs at its own rates. */
static void test_fp8_gemm_kernel(void **state) {
    (void)state;
    const char *modes[] = {"train.fp8_gemm=auto", "train.fp8_gemm=cublaslt", "train.fp8_gemm=cpgen"};
    for (int wg = 0; wg < 2; wg++) {
        cp_plan p[3];
        int own[3] = {0}, fp8[3] = {0}, wins[3] = {0};
        for (int m = 0; m < 3; m++) {
            const char *sets[] = {"parallel.gpus=1", "train.seq_len=32K", "train.precision=fp8", modes[m],
                                  wg ? "train.fp8_weight_grads=fp8" : "train.fp8_weight_grads=bf16"};
            plan_of(&p[m], 5, sets);
            assert_true(p[m].fits);
            for (int i = 0; i < p[m].nsteps; i++) {
                const cp_step *s = &p[m].steps[i];
                if (s->kind != CP_OP_GEMM) continue;
                bool blk = s->gemm.a_type != CP_GEMM_BF16;
                fp8[m] += blk;
                wins[m] += blk && cp_plan_fp8_kernel_wins(&s->gemm);
                if (s->module < 0) continue;
                own[m]++;
                assert_true(blk);
                assert_string_equal(p[m].modules[s->module].family, "gemm_fp8");
                assert_string_equal(s->role, "sm90");
                assert_int_equal(strtoll(cp_kspec_get(&p[m].modules[s->module], "N"), NULL, 10), s->gemm.n);
                assert_int_equal(strtoll(cp_kspec_get(&p[m].modules[s->module], "K"), NULL, 10), s->gemm.k);
                if (m == 0) assert_true(cp_plan_fp8_kernel_wins(&s->gemm));
                double rate = s->gemm.w_grad ? p[m].spec.machine.fp8_cpgen_wgrad_tflops
                                             : p[m].spec.machine.fp8_cpgen_gemm_tflops;
                assert_true(s->seconds >= s->flops / (rate * 1e12));
            }
            int gemm_mods = 0;
            for (int k = 0; k < p[m].nmodules; k++) gemm_mods += !strcmp(p[m].modules[k].family, "gemm_fp8");
            assert_true(own[m] == 0 ? gemm_mods == 0 : gemm_mods >= 1 && gemm_mods < own[m]);
        }
        /* with FP8 weights' gradients d_wdown, d_wgate, d_wup, d_wo and d_wq of 28 layers (one MLP tile of 32K) */
        assert_int_equal(own[0], wg ? 28 * 5 : 0);
        assert_int_equal(own[0], wins[0]);
        assert_int_equal(own[1], 0);
        assert_true(own[2] > own[0] && own[2] <= fp8[2]);
        assert_true(fp8[0] == fp8[1] && fp8[1] == fp8[2]);
        assert_int_equal(p[0].gpu_arena, p[1].gpu_arena);
        assert_true(wg ? p[0].t_step < p[1].t_step : p[0].t_step == p[1].t_step);
        printf("  3B at 32K, fp8 weights' gradients %s: %d of %d FP8 GEMMs on the kernel (auto; cpgen %d), %.3f s "
               "predicted against cuBLASLt's %.3f s\n", wg ? "fp8" : "bf16", own[0], fp8[0], own[2], p[0].t_step,
               p[1].t_step);
        for (int m = 0; m < 3; m++) cp_plan_free(&p[m]);
    }
}

/* Whether a step of flat program P after step i (then of the next run of it, up to step i) reads bytes of operand o
 * before one writes them all anew */
static bool read_before_rewritten(const cp_plan *P, int i, const cp_operand *o) {
    for (int n = 1; n <= P->nsteps; n++) {
        const int k = (i + n) % P->nsteps;
        bool anew = false;
        for (int j = 0; j < P->steps[k].nops; j++) {
            const cp_operand *w = &P->steps[k].ops[j];
            if (w->buf != o->buf || w->offset >= o->offset + o->bytes || o->offset >= w->offset + w->bytes) continue;
            if (w->access & CP_READ) return true;
            anew |= w->offset <= o->offset && w->offset + w->bytes >= o->offset + o->bytes;
        }
        if (anew) return false;
    }
    return true;
}

/* train.fp8_scaling = "block": every layer GEMM reads copies of its very operands made by a block-scaled cast (no
 * amax, no scale slots), each copy with its scales behind it in its buffer: a weight's in 128 x 128 tiles, any other
 * input's per 128 of k, E4M3 but for a gradient under "hybrid"; without fast accumulation; the casts are priced and
 * the step predicted faster than bf16 at the 3B shape. With the weights' gradients on FP8 the 3B's MLP backward casts
 * its tensors read both ways in one step each (cast_rt_1d: the copy and the transposed copy into two buffers);
 * with them in bf16 no cast is of both ways. A GEMM whose k is not a multiple of 128 stays bf16 (tiny's
 * K and V projections at head_dim 32 x 2 KV heads). Checked on the flat program. */
static void test_fp8_block(void **state) {
    (void)state;
    /* the 3B twice: the second with train.fp8_weight_grads = "bf16" */
    const char *shapes[][2] = {{"tiny", "train.seq_len=2K"}, {"llama3b", "train.seq_len=32K"},
                               {"llama3b", "train.seq_len=32K"}};
    int gemms_of[3] = {0}, casts_of[3] = {0}, wgrads = 0; /* the 3B's weight gradients on FP8 */
    for (int c = 0; c < 3; c++) {
        cp_spec s;
        cp_plan b, f;
        load(shapes[c][0], &s, 2, shapes[c][1], "parallel.gpus=1");
        build(&s, &b);
        s.train.fp8 = true, s.train.fp8_scaling = CP_FP8_SCALING_BLOCK;
        s.train.fp8_e4m3_grads = c > 0; /* tiny's gradients E5M2 ("hybrid"), the 3B's E4M3 (the default) */
        s.train.fp8_bf16_wgrad = c == 2;
        build(&s, &f);
        fp8_held *held = calloc((size_t)f.nbufs, sizeof *held);
        bool *tiled = calloc((size_t)f.nbufs, sizeof *tiled);
        int bi = 0, fp8_gemms = 0, casts = 0, both = 0, fused = 0, unread = 0, layered = 0;
        for (int i = 0; i < f.nsteps; i++) {
            const cp_step *x = &f.steps[i];
            assert_true(x->task != CP_TASK_FP8_AMAX && x->task != CP_TASK_FP8_CAST);
            if (x->task == CP_TASK_FP8_CAST_BLOCK && x->fp8.layers > 1) { /* every layer's weight, both ways */
                fp8_layered_cast(&f, x, CP_GEMM_SCALE_2D, held);
                tiled[x->ops[1].buf] = tiled[x->ops[3].buf] = true;
                casts++;
                layered++;
                continue;
            }
            if (x->task == CP_TASK_FP8_CAST_BLOCK) {
                casts++;
                const cp_fp8_copy cc = fp8_copy(x);
                bool tiles = cc.scale == CP_GEMM_SCALE_2D;
                cp_cat from = f.bufs[x->ops[0].buf].cat;
                assert_true(tiles == (from == CP_CAT_PARAMS || from == CP_CAT_GATHERED));
                /* a cast of both ways writes the copy, then the transposed copy, from one source */
                assert_true(!cc.both || (!tiles && !cc.transposed && x->count % 128 == 0 && x->heads % 128 == 0));
                assert_int_equal(x->nops, cc.both ? 5 : 3);
                both += cc.both;
                for (int o = 1; o < x->nops; o += 2) {
                    bool t = cc.transposed || o == 3;
                    int64_t rows = t ? x->heads : x->count, cols = t ? x->count : x->heads; /* the copy's */
                    int64_t nsc = cp_fp8_scales(tiles ? CP_GEMM_SCALE_2D : CP_GEMM_SCALE_1D, rows, cols);
                    const cp_operand *cp = &x->ops[o], *sc = &x->ops[o + 1];
                    assert_int_equal(f.bufs[cp->buf].cat, CP_CAT_FP8);
                    assert_true(sc->buf == cp->buf && cp->bytes == rows * cols && sc->offset >= rows * cols &&
                                sc->offset % 256 == 0 && sc->bytes == 4 * nsc);
                    assert_true(sc->offset + sc->bytes <= f.bufs[cp->buf].bytes);
                    held[cp->buf] = (fp8_held){.valid = true, .transposed = t, .src = x->ops[0],
                                               .e5m2 = cc.fmt == CP_GEMM_E5M2, .slot = sc->offset};
                    tiled[cp->buf] = tiles;
                }
                assert_true(!cc.both || x->ops[1].buf != x->ops[3].buf);
                continue;
            }
            const cp_step *y = &b.steps[bi++];
            assert_string_equal(x->what, y->what);
            if (x->kind != CP_OP_GEMM) { /* as it was, but for the copies its kernel writes beside its outputs */
                assert_int_equal(x->nops, y->nops + 2 * x->nfp8_out);
                for (int o = 0; o < y->nops; o++) assert_true(fp8_same(&x->ops[o], &y->ops[o]));
            }
            /* the planner marks exactly the weights' gradients */
            if (y->kind == CP_OP_GEMM)
                assert_true(y->gemm.w_grad == (!strncmp(y->what, "d_w", 3) || !strcmp(y->what, "d_lm_head")));
            if (x->kind == CP_OP_GEMM && x->gemm.a_type != CP_GEMM_BF16) {
                fp8_gemms++;
                const cp_gemm *g = &y->gemm, *q = &x->gemm;
                assert_true(y->layer >= 0 && g->k % 128 == 0 && !(c == 2 && g->w_grad));
                wgrads += c == 1 && g->w_grad;
                assert_int_equal(q->a_type, g->a_grad && c == 0 ? CP_GEMM_E5M2 : CP_GEMM_E4M3);
                assert_true(q->a_scale == CP_GEMM_SCALE_1D && !q->fast_accum && !q->trans_a && q->trans_b);
                fp8_gemm_inputs(held, i, x, y);
                for (int in = 0; in < 2; in++) {
                    assert_true(held[x->ops[in].buf].e5m2 == (in == 0 && g->a_grad && c == 0));
                    assert_true((in ? q->b_scale : q->a_scale) == (tiled[x->ops[in].buf] ? CP_GEMM_SCALE_2D
                                                                                         : CP_GEMM_SCALE_1D));
                }
            } else if (x->kind == CP_OP_GEMM) {
                assert_memory_equal(&x->gemm, &y->gemm, sizeof x->gemm);
                assert_true(y->layer < 0 || y->gemm.k % 128 || (c == 2 && y->gemm.w_grad));
            }
            fp8_forget(held, f.nbufs, x);
            /* copies a kernel writes beside its outputs: of an output it wrote whole, as rows in 1 x 128 blocks */
            for (int j = 0; j < x->nfp8_out; j++) {
                const cp_step_fp8_out *a = &x->fp8_out[j];
                const cp_operand *out = &x->ops[a->out], *cp = &x->ops[a->slot], *sc = &x->ops[a->scales];
                assert_true(cp_plan_fp8_producer(&f, x, a->out, a->scale) && (out->access & CP_WRITE));
                assert_true(a->slot >= y->nops && a->scales == a->slot + 1 && a->scales < x->nops);
                const bool grad_out = x->task == CP_TASK_SWIGLU_BWD || x->task == CP_TASK_NORM1_BWD ||
                                      x->task == CP_TASK_NORM2_BWD;
                assert_true(a->fmt == (c == 0 && grad_out ? CP_GEMM_E5M2 : CP_GEMM_E4M3));
                /* rows: the kernel's, a layout kernel's its T */
                int64_t rows = x->task == CP_TASK_UNPACK_O ? f.T : x->count, cols = out->bytes / 2 / rows;
                assert_int_equal(f.bufs[cp->buf].cat, CP_CAT_FP8);
                assert_true(out->bytes == 2 * rows * cols && cols % 128 == 0 && cp->offset == 0 &&
                            cp->bytes == rows * cols && sc->buf == cp->buf && sc->offset >= rows * cols &&
                            sc->offset % 256 == 0 && sc->bytes == 4 * rows * (cols / 128) &&
                            sc->offset + sc->bytes <= f.bufs[cp->buf].bytes && (cp->access & CP_WRITE) &&
                            (sc->access & CP_WRITE));
                held[cp->buf] = (fp8_held){.valid = true, .src = *out, .e5m2 = a->fmt == CP_GEMM_E5M2,
                                           .slot = sc->offset};
                tiled[cp->buf] = false;
                fused++;
                /* copied alone: the forward's, an output no later step reads before one writes it whole */
                assert_true(a->copy_only == (x->phase == CP_PHASE_FWD && x->task != CP_TASK_UNPACK_O));
                assert_true(read_before_rewritten(&f, i, out) == !a->copy_only);
                unread += a->copy_only;
            }
        }
        assert_int_equal(bi, b.nsteps);
        print_message("%s fp8 block: %d GEMMs on FP8 inputs, %d casts (%d of every layer's weight, %d others of both "
                      "ways), %d copies by producers (%d of them alone)\n", shapes[c][0], fp8_gemms, casts, layered,
                      both, fused, unread);
        /* the weights of every layer cast once (the plans keep their copies) */
        assert_true(f.fp8_weights_once && layered == 7);
        /* the 3B's default recipe: per layer the forward's normed input (q, k, v), its attention output unpacked
         * (o), the MLP's normed input in the forward and the recompute when the MLP is one tile (gate, up), each MLP
         * tile's SwiGLU output (down), each backward tile's dgate and dup (the d_xn2 GEMMs), the backward norms' d_h2
         * (d_attn) and d_resid (d_act; but layer 27's, which the final norm's backward writes), and dq and dk from
         * rope's backward (d_xn_q, d_xn_k) */
        const int64_t tiles = f.T / f.mlp_tile;
        if (c == 2) assert_int_equal(fused, 28 * (2 + (tiles == 1 ? 2 : 0) + tiles + tiles * 2 + 2 + 2) - 1);
        /* of them alone: the forward's normed inputs and SwiGLU outputs, which the backward recomputes */
        if (c >= 1) assert_int_equal(unread, 28 * (1 + (tiles == 1) + tiles));
        /* the 3B's MLP backward reads xn2, d_resid and the gradients of gate and up both ways in every tile */
        if (c == 1) assert_true(both >= 4 * tiles * 28);
        if (c == 2) assert_int_equal(both, 0); /* only the weights' gradients read activations transposed */
        assert_true(fp8_gemms > 0 && casts > 0 && casts < 2 * fp8_gemms);
        assert_true(f.t_fp8_casts > 0);
        if (c >= 1) assert_true(f.t_step < b.t_step * 0.95);
        gemms_of[c] = fp8_gemms, casts_of[c] = casts;
        /* bf16 weights' gradients: exactly those leave FP8, and with them casts of the copies only they read */
        if (c == 2) assert_true(wgrads > 0 && gemms_of[2] == gemms_of[1] - wgrads && casts_of[2] < casts_of[1]);
        free(held);
        free(tiled);
        cp_plan_free(&b);
        cp_plan_free(&f);
    }
}

/* train.fp8_scaling = "row", on the flat program of the 3B at 32K with the weights' gradients on FP8 and in bf16, and
 * of tiny: every layer GEMM but the bf16 weights' gradients on FP8 (any k a multiple of 16: tiny's K and V projections
 * too), both inputs scaled per row (A's m scales, B's n, read behind copies of the operands the GEMM reads now, made
 * the way round it reads them), fast accumulation in the forward alone by default, in the activations' gradients too
 * with train.fp8_fast_accum = "dx", never in the weights'; every copy made by a cast, its scales behind it and a
 * transposed one's column maxima behind those, or as rows by the rmsnorm or SwiGLU step that wrote its source (then
 * maybe the transposed copy's column maxima too, into exactly the bytes a memset just before it zeroed, which a cast
 * of the transposed copy alone then reads with nothing written to the source between); the step predicted faster
 * than bf16's. */
static void test_fp8_row(void **state) {
    (void)state;
    const char *shapes[][2] = {{"tiny", "train.seq_len=2K"}, {"llama3b", "train.seq_len=32K"},
                               {"llama3b", "train.seq_len=32K"}};
    for (int c = 0; c < 3; c++) {
        cp_spec s;
        cp_plan b, f;
        load(shapes[c][0], &s, 3, shapes[c][1], "parallel.gpus=1", "train.fp8_scaling=row");
        build(&s, &b);
        assert_true(s.train.fp8_e4m3_grads && s.train.fp8_fast_accum == CP_FP8_FAST_FORWARD); /* row's defaults */
        const int fast = (int[]){CP_FP8_FAST_FORWARD, CP_FP8_FAST_DX, CP_FP8_FAST_DX}[c];
        s.train.fp8_fast_accum = fast;
        s.train.fp8 = true;
        s.train.fp8_bf16_wgrad = c == 2;
        build(&s, &f);
        /* held: each copy buffer's copy; gathered: the column maxima a producer left in a buffer (.slot: where) */
        fp8_held *held = calloc((size_t)f.nbufs, sizeof *held), *gathered = calloc((size_t)f.nbufs, sizeof *gathered);
        int bi = 0, fp8_gemms = 0, casts = 0, transposed = 0, both = 0, fused = 0, maxima = 0, alone = 0, unread = 0,
            from_rows = 0, both_rows8 = 0, layered = 0;
        for (int i = 0; i < f.nsteps; i++) {
            const cp_step *x = &f.steps[i];
            assert_true(x->task != CP_TASK_FP8_AMAX && x->task != CP_TASK_FP8_CAST);
            if (x->kind == CP_OP_MEMSET && f.bufs[x->ops[0].buf].cat == CP_CAT_FP8) {
                /* zeroes exactly the column maxima behind the transposed copy's scales of the cast of both ways next,
                 * or those the producer after the memsets gathers */
                const cp_step *n = &f.steps[i + 1];
                const cp_operand *z = &x->ops[0];
                while (n->kind == CP_OP_MEMSET && n->task != CP_TASK_FP8_CAST_BLOCK) n++;
                if (n->task == CP_TASK_FP8_CAST_BLOCK && n->fp8.layers > 1) { /* every layer's scales and maxima */
                    assert_true(fp8_copy(n).both && n->nops == 5 && fp8_same(z, &n->ops[4]));
                } else if (n->task == CP_TASK_FP8_CAST_BLOCK) {
                    assert_true(fp8_copy(n).both && n->nops == 5);
                    const int64_t parts = 4 * cp_fp8_row_parts(n->count, n->heads);
                    assert_true(z->buf == n->ops[4].buf && z->bytes == parts &&
                                z->offset == n->ops[4].offset + 4 * n->heads && n->ops[4].access == CP_RW);
                } else {
                    bool zeroed = false;
                    for (int j = 0; j < n->nfp8_out; j++)
                        zeroed |= n->fp8_out[j].col_max >= 0 && fp8_same(&n->ops[n->fp8_out[j].col_max], z);
                    assert_true(zeroed);
                }
                continue;
            }
            if (x->task == CP_TASK_FP8_CAST_BLOCK && x->fp8.maxima) {
                /* the transposed copy from the column maxima its source's producer left, nothing written since; from
                 * the source, or from the row copy that producer wrote and its scales (from_rows) */
                const cp_fp8_copy cc = fp8_copy(x);
                const cp_operand *cp = &x->ops[1], *sc = &x->ops[2];
                const fp8_held *g = &gathered[sc->buf], *r = &held[x->ops[0].buf];
                const cp_operand src = cc.from_rows ? r->src : x->ops[0];
                assert_true(cc.transposed && !cc.both && cc.scale == CP_GEMM_SCALE_ROW &&
                            x->nops == (cc.from_rows ? 4 : 3));
                assert_true(g->valid && fp8_same(&g->src, &src) && cp->buf == sc->buf &&
                            cp->bytes == x->count * x->heads && sc->offset + 4 * x->heads == g->slot &&
                            sc->bytes == 4 * (x->heads + cp_fp8_row_parts(x->count, x->heads)) &&
                            sc->access == CP_RW);
                if (cc.from_rows) {
                    const cp_operand *rs = &x->ops[3];
                    assert_true(r->valid && !r->transposed && f.bufs[x->ops[0].buf].cat == CP_CAT_FP8 &&
                                x->ops[0].offset == 0 && x->ops[0].bytes == x->count * x->heads &&
                                x->ld == x->heads && rs->buf == x->ops[0].buf && rs->offset == r->slot &&
                                rs->bytes == 4 * x->count && rs->access == CP_READ);
                    from_rows++;
                }
                held[cp->buf] = (fp8_held){.valid = true, .transposed = true, .src = src, .slot = sc->offset};
                gathered[sc->buf].valid = false;
                casts++;
                transposed++;
                continue;
            }
            if (x->task == CP_TASK_FP8_CAST_BLOCK && x->fp8.layers > 1) {
                fp8_layered_cast(&f, x, CP_GEMM_SCALE_ROW, held);
                casts++;
                transposed++;
                layered++;
                continue;
            }
            if (x->task == CP_TASK_FP8_CAST_BLOCK) {
                const cp_fp8_copy cc = fp8_copy(x);
                assert_true(cc.scale == CP_GEMM_SCALE_ROW && cc.fmt == CP_GEMM_E4M3 && x->nops == (cc.both ? 5 : 3));
                /* a cast of both ways: the copy as rows, then transposed (from the row copy where the columns come
                 * in strips of 64); rows held whole, after its memset */
                assert_true(!cc.both || (!cc.transposed && cp_fp8_row_held(x->heads) &&
                                         x->ops[1].buf != x->ops[3].buf && f.steps[i - 1].kind == CP_OP_MEMSET));
                assert_true(cc.from_rows == (cc.both && x->heads % CP_FP8_ROW8_COLS == 0));
                both_rows8 += cc.from_rows;
                for (int k = 0; k < (cc.both ? 2 : 1); k++) {
                    const bool t = cc.both ? k == 1 : cc.transposed;
                    const int64_t rows = t ? x->heads : x->count, cols = t ? x->count : x->heads;
                    const int64_t parts = t ? cp_fp8_row_parts(x->count, x->heads) : 0;
                    const cp_operand *cp = &x->ops[1 + 2 * k], *sc = &x->ops[2 + 2 * k];
                    assert_int_equal(f.bufs[cp->buf].cat, CP_CAT_FP8);
                    assert_true(cp->bytes == rows * cols && sc->buf == cp->buf && sc->offset >= rows * cols &&
                                sc->offset % 256 == 0 && sc->bytes == 4 * (rows + parts) &&
                                sc->offset + sc->bytes <= f.bufs[cp->buf].bytes);
                    assert_true(!t || x->heads % 32 == 0);
                    held[cp->buf] = (fp8_held){.valid = true, .transposed = t, .src = x->ops[0], .slot = sc->offset};
                    transposed += t;
                }
                casts++;
                both += cc.both;
                continue;
            }
            const cp_step *y = &b.steps[bi++];
            assert_string_equal(x->what, y->what);
            const bool fp8 = x->kind == CP_OP_GEMM && x->gemm.a_type != CP_GEMM_BF16;
            if (x->kind == CP_OP_GEMM && y->layer >= 0) assert_true(fp8 == !(c == 2 && y->gemm.w_grad));
            if (fp8) {
                fp8_gemms++;
                const cp_gemm *g = &y->gemm, *q = &x->gemm;
                assert_true(q->a_type == CP_GEMM_E4M3 && q->b_type == CP_GEMM_E4M3);
                assert_true(q->a_scale == CP_GEMM_SCALE_ROW && q->b_scale == CP_GEMM_SCALE_ROW);
                const bool fast_wanted = !g->a_grad || (!g->w_grad && fast == CP_FP8_FAST_DX);
                assert_true(q->fast_accum == fast_wanted && !q->trans_a && q->trans_b);
                fp8_gemm_inputs(held, i, x, y);
                assert_true(x->ops[x->nops - 2].bytes == 4 * q->m && x->ops[x->nops - 1].bytes == 4 * q->n);
            } else if (x->kind == CP_OP_GEMM) {
                assert_memory_equal(&x->gemm, &y->gemm, sizeof x->gemm);
            } else { /* as it was, but for the copies its kernel writes beside its outputs */
                int extra = 0;
                for (int j = 0; j < x->nfp8_out; j++)
                    extra += x->fp8_out[j].kind == CP_FP8_OUT_COPY ? 2 + (x->fp8_out[j].col_max >= 0) : 1;
                assert_int_equal(x->nops, y->nops + extra);
                for (int o = 0; o < y->nops; o++) assert_true(fp8_same(&x->ops[o], &y->ops[o]));
            }
            fp8_forget(held, f.nbufs, x);
            fp8_forget(gathered, f.nbufs, x);
            /* row copies a norm or SwiGLU writes beside an output it wrote whole, or the transposed copy's column
             * maxima alone; the maxima where the memset was */
            for (int j = 0; j < x->nfp8_out; j++) {
                const cp_step_fp8_out *a = &x->fp8_out[j];
                const bool copy = a->kind == CP_FP8_OUT_COPY;
                const cp_operand *out = &x->ops[a->out];
                const int64_t rows = x->count, cols = out->bytes / 2 / rows;
                assert_true(a->scale == CP_GEMM_SCALE_ROW && a->fmt == CP_GEMM_E4M3 &&
                            cp_plan_fp8_producer(&f, x, a->out, CP_GEMM_SCALE_ROW) && (out->access & CP_WRITE));
                assert_true(out->bytes == 2 * rows * cols);
                if (copy) {
                    const cp_operand *cp = &x->ops[a->slot], *sc = &x->ops[a->scales];
                    assert_true(a->slot >= y->nops && a->scales == a->slot + 1 &&
                                (a->col_max < 0 || a->col_max == a->scales + 1));
                    assert_true(cp->offset == 0 && cp->bytes == rows * cols && sc->buf == cp->buf &&
                                sc->offset >= rows * cols && sc->offset % 256 == 0 && sc->bytes == 4 * rows &&
                                (cp->access & CP_WRITE) && (sc->access & CP_WRITE));
                    held[cp->buf] = (fp8_held){.valid = true, .src = *out, .slot = sc->offset};
                    fused++;
                    if (a->copy_only) { /* an output no later step reads before one writes it whole */
                        assert_true(x->task == CP_TASK_NORM1 || x->task == CP_TASK_NORM2 ||
                                    x->task == CP_TASK_SWIGLU || x->task == CP_TASK_SWIGLU_BWD);
                        assert_false(read_before_rewritten(&f, i, out));
                        unread++;
                    } else {
                        assert_true(read_before_rewritten(&f, i, out));
                    }
                } else {
                    assert_false(a->copy_only);
                    assert_true(a->kind == CP_FP8_OUT_MAXIMA && a->slot < 0 && a->scales < 0 && a->col_max == y->nops);
                    alone++;
                }
                if (a->col_max >= 0) { /* zeroed by one of the memsets just before */
                    const cp_operand *m = &x->ops[a->col_max];
                    bool zeroed = false;
                    for (int k = i - 1; k >= 0 && f.steps[k].kind == CP_OP_MEMSET; k--)
                        zeroed |= fp8_same(&f.steps[k].ops[0], m);
                    assert_true(zeroed && m->access == CP_RW && m->bytes == 4 * cp_fp8_row_parts(rows, cols) &&
                                (!copy || m->buf != x->ops[a->slot].buf));
                    gathered[m->buf] = (fp8_held){.valid = true, .src = *out, .slot = m->offset};
                    maxima++;
                }
            }
        }
        assert_int_equal(bi, b.nsteps);
        print_message("%s fp8 row%s: %d GEMMs on FP8 inputs, %d casts (%d copies transposed, %d of every layer's "
                      "weight, %d others of both ways, %d of them and %d others from row copies), %d copies by "
                      "producers (%d of them alone), %d column maxima by producers (%d of them alone)\n",
                      shapes[c][0], c == 2 ? ", weights' gradients bf16" : "", fp8_gemms, casts, transposed, layered,
                      both, both_rows8, from_rows, fused, unread, maxima, alone);
        assert_true(fp8_gemms > 0 && casts > 0 && transposed > 0 && f.t_fp8_casts > 0);
        /* the 3B's copies by producers, per layer: the normed inputs in the forward and the recompute (4), SwiGLU's
         * output in the forward, dgate and dup, d_h2 and d_resid (but layer 0's d_resid, which no GEMM reads); with
         * FP8 weights' gradients those but the forward's normed inputs and SwiGLU's output with the transposed
         * copy's column maxima too, and the maxima alone of the recompute's SwiGLU output, which only d_wdown reads
         * (transposed) */
        if (c >= 1) assert_int_equal(fused, 28 * 9 - 1);
        if (c >= 1) assert_int_equal(maxima, c == 1 ? 28 * 7 - 1 : 0);
        if (c >= 1) assert_int_equal(alone, c == 1 ? 28 : 0);
        /* the transposed copies whose producers wrote the row copy too are cast from it (per layer the recomputed
         * normed inputs, dgate and dup, d_h2 and d_resid, but layer 0's d_resid) */
        if (c >= 1) assert_int_equal(from_rows, c == 1 ? 28 * 6 - 1 : 0);
        /* the seven weights of every layer cast once (the plan keeps their copies: 5.6 GB fit beside the rest),
         * and every other cast of both ways from the row copy (the 3B's columns all multiples of 64): with FP8
         * weights' gradients per layer the recompute's attention output, dq, dk and dv, and the last layer's
         * d_resid, which no producer writes */
        if (c >= 1) assert_true(f.fp8_weights_once && layered == 7 && f.fp8_weights_bytes > 5600000000LL);
        if (c >= 1) assert_true(both_rows8 == both && both == (c == 1 ? 28 * 4 + 1 : 0));
        /* copied alone: the forward's normed inputs and SwiGLU output, which the backward recomputes, and with FP8
         * weights' gradients the recompute's normed inputs, dgate and dup, which only their casts from row copies
         * read */
        if (c >= 1) assert_int_equal(unread, c == 1 ? 28 * 7 : 28 * 3);
        assert_true(unread >= 3 * (int)s.model.layers);
        if (c == 1) { /* the weights' gradients on FP8 read tensors both ways; fast dX said and priced: dX's 185 TF of
                       * a step at machine.fp8_gemm_fast_tflops, not fp8_gemm_tflops, about 9 ms less */
            assert_true(both > 0);
            char *text = printed(&f);
            assert_non_null(strstr(text, "1450 summed without promotion (the forward's and dX's)"));
            free(text);
            cp_plan promoted;
            s.train.fp8_fast_accum = CP_FP8_FAST_FORWARD;
            build(&s, &promoted);
            assert_true(promoted.t_step > f.t_step + 0.005 && promoted.t_step < f.t_step + 0.015);
            cp_plan_free(&promoted);
        }
        if (c >= 1) assert_true(f.t_step < b.t_step * 0.95);
        free(held);
        free(gathered);
        cp_plan_free(&b);
        cp_plan_free(&f);
    }
}

/* A producer writes the copy of an output it writes whole: never a launch of a ring's run of rows (rope's backward
 * under a ring: with an odd number of GPUs in a group two launches, each naming the whole buffer, whose copy would
 * hold the last run's rows alone); there a cast makes it. Without a ring rope writes dq's and dk's copies. */
static void test_fp8_copies_of_whole_outputs(void **state) {
    (void)state;
    const char *gpus[] = {"parallel.gpus=1", "parallel.gpus=2"};
    for (int g = 0; g < 2; g++)
        for (int ring = 1; ring <= 2; ring++) {
            cp_spec s;
            cp_plan p;
            char r[32];
            snprintf(r, sizeof r, "parallel.ring=%d", ring);
            load("llama3b", &s, 5, gpus[g], r, "model.layers=2", "train.seq_len=8K", "train.precision=fp8");
            build(&s, &p);
            int rope_runs = 0, rope_copies = 0;
            for (int i = 0; i < p.nsteps; i++) {
                const cp_step *x = &p.steps[i];
                if (x->nfp8_out) assert_true(x->ring_part < 0);
                if (x->task == CP_TASK_ROPE_DQ || x->task == CP_TASK_ROPE_DK) {
                    rope_runs += x->ring_part >= 0;
                    rope_copies += x->nfp8_out;
                }
            }
            /* two layers, dq and dk: under a ring a launch a run (two runs with one GPU a group), else each with
             * its copy */
            assert_int_equal(rope_runs, ring == 1 ? 0 : g == 0 ? 8 : 4);
            assert_int_equal(rope_copies, ring == 1 ? 4 : 0);
            cp_plan_free(&p);
        }
}

/* --max-seq asks each length only whether it fits, quickly (cp_plan_fits): the same answer as the whole search, at
 * the shipped specs' longest lengths (docs/ARCHITECTURE.md, README) and one granule beyond, and far beyond, where
 * plans stop at their floor. */
static void test_quick_fit_agrees(void **state) {
    (void)state;
    static const struct {
        const char *spec, *sets[3];
        int64_t longest, gran;
    } cases[] = {
        {"tiny", {"parallel.gpus=1"}, 33039360, 1024},
        {"llama1b", {"parallel.gpus=1"}, 2641920, 1024},
        {"llama3b", {"parallel.gpus=1"}, 1398784, 1024},
        {"llama8b", {"parallel.gpus=8"}, 7356416, 8192},
        {"llama8b", {"parallel.gpus=8", "parallel.ring=8"}, 50659328, 65536},
        {"qwen32b", {"parallel.gpus=8", "machine.host_mem=2T"}, 4022272, 8192},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t lens[] = {cases[c].longest, cases[c].longest + cases[c].gran, 4 * cases[c].longest};
        for (size_t k = 0; k < 3; k++) {
            char len[64], err[CP_ERR_MAX];
            snprintf(len, sizeof len, "train.seq_len=%lld", (long long)lens[k]);
            const char *sets[4] = {len};
            int n = 1;
            for (int j = 0; j < 3 && cases[c].sets[j]; j++) sets[n++] = cases[c].sets[j];
            cp_spec s;
            if (cp_spec_load(cases[c].spec, sets, n, &s, err, sizeof err)) fail_msg("spec: %s", err);
            bool quick, whole;
            assert_int_equal(cp_plan_fits(&s, true, &quick, err, sizeof err), 0);
            assert_int_equal(cp_plan_fits(&s, false, &whole, err, sizeof err), 0);
            if (quick != whole) fail_msg("%s %s: quick %d, whole %d", cases[c].spec, len, quick, whole);
            assert_true(whole == (k == 0));
        }
    }
    /* and on random small machines for the tiny shape, where every choice comes into play (offloaded checkpoints,
     * their spacing, the stage size, the optimizer's place) and fits are near the machine's edge */
    srand(2026);
    int fit = 0, n = 200;
    for (int i = 0; i < n; i++) {
        char sets[6][64], err[CP_ERR_MAX];
        snprintf(sets[0], 64, "model.layers=%d", 1 + rand() % 6);
        snprintf(sets[1], 64, "parallel.gpus=%d", 1 + rand() % 2);
        snprintf(sets[2], 64, "train.seq_len=%dK", 16 << (rand() % 7));
        snprintf(sets[3], 64, "machine.gpu_mem=%dM", 1024 + rand() % 6144);
        snprintf(sets[4], 64, "machine.host_mem=%dM", 4608 + rand() % 8192);
        snprintf(sets[5], 64, "train.micro_batches=%d", 1 + rand() % 2);
        const char *sp[6];
        for (int j = 0; j < 6; j++) sp[j] = sets[j];
        cp_spec s;
        if (cp_spec_load("tiny", sp, 6, &s, err, sizeof err)) fail_msg("spec: %s", err);
        bool quick, whole;
        assert_int_equal(cp_plan_fits(&s, true, &quick, err, sizeof err), 0);
        assert_int_equal(cp_plan_fits(&s, false, &whole, err, sizeof err), 0);
        if (quick != whole) fail_msg("tiny %s %s %s %s %s: quick %d, whole %d", sp[0], sp[1], sp[2], sp[3], sp[4], quick,
                                     whole);
        fit += whole;
    }
    printf("  random tiny machines: %d of %d fit\n", fit, n);
    assert_true(fit > n / 5 && fit < n * 4 / 5); /* both sides of the edge */
}

/* Every step's operands lie inside their buffers and refer to live bytes (liveness would have failed). */
static void test_every_shipped_spec_plans(void **state) {
    (void)state;
    const char *names[] = {"tiny", "llama1b", "llama3b", "llama8b", "qwen32b"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        cp_spec s;
        load(names[i], &s, 1, "machine.host_mem=2T");
        cp_plan p;
        build(&s, &p);
        assert_true(p.nsteps > 0);
        assert_true(p.gpu_arena > 0);
        assert_true(p.t_step > 0);
        cp_plan_free(&p);
    }
}

static void test_refuses_when_too_small(void **state) {
    (void)state;
    cp_spec s;
    load("tiny", &s, 2, "machine.gpu_mem=1G", "machine.reserve=1000M");
    cp_plan p;
    build(&s, &p);
    assert_false(p.fits);
    assert_non_null(strstr(p.why, "GPU memory"));
    cp_plan_free(&p);
}

/* Ranks sharing GPUs (machine.ranks_per_gpu): each rank's peak is its arena, the reserve and NCCL over sockets (its
 * kernels and collectives, more with send/recv or all-to-all, more per communicator split off the run's); K of them
 * must fit one GPU, and K ranks per GPU of a node's 8 share its host memory. The same arenas as on GPUs of their
 * own: the numbers and memory per rank are the layout's. */
static void test_ranks_per_gpu(void **state) {
    (void)state;
    const struct {
        const char *sets[4];
        int world, splits;
        bool p2p;
    } cases[] = {
        {{"parallel.gpus=1", "parallel.replicas=2"}, 2, 0, false},   /* all-reduces only */
        {{"parallel.gpus=2"}, 2, 0, true},                           /* all-to-alls */
        {{"parallel.gpus=1", "parallel.ring=2"}, 2, 0, true},        /* send/recv, the run's own communicator */
        {{"parallel.gpus=2", "parallel.replicas=2"}, 4, 2, true},    /* Ulysses group and shard split */
        {{"parallel.gpus=2", "parallel.ring=2"}, 4, 3, true},        /* Ulysses group, ring and shard */
        {{"parallel.gpus=1", "parallel.replicas=2", "parallel.ring=2"}, 4, 1, true}, /* the ring */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int n = 0;
        while (n < 4 && cases[k].sets[n]) n++;
        cp_spec s, own;
        const char *sets[6];
        for (int i = 0; i < n; i++) sets[i] = cases[k].sets[i];
        sets[n] = "train.micro_batches=2";
        char err[CP_ERR_MAX];
        if (cp_spec_load("tiny", sets, n + 1, &own, err, sizeof err)) fail_msg("%s", err);
        char share[48];
        snprintf(share, sizeof share, "machine.ranks_per_gpu=%d", cases[k].world);
        sets[n + 1] = share;
        if (cp_spec_load("tiny", sets, n + 2, &s, err, sizeof err)) fail_msg("%s", err);
        cp_plan p, q;
        build(&s, &p);
        build(&own, &q);
        assert_int_equal(cp_plan_ranks_per_gpu(&p), cases[k].world);
        assert_int_equal(cp_plan_ranks_per_gpu(&q), 1);
        assert_int_equal(p.gpu_arena, q.gpu_arena);
        const cp_machine *mc = &s.machine;
        int64_t comm = mc->comm_reserve_shared + (cases[k].p2p ? mc->comm_reserve_p2p : 0) +
                       cases[k].splits * mc->comm_reserve_split;
        assert_int_equal(cp_plan_comm_reserve(&p), comm);
        assert_int_equal(p.gpu_peak, p.gpu_arena + mc->reserve + comm);
        assert_int_equal(q.gpu_peak, q.gpu_arena + mc->reserve + mc->comm_reserve);
        assert_int_equal(cp_plan_node_ranks(&p), cases[k].world);
        if (!p.fits) fail_msg("case %zu: %s", k, p.why);
        cp_plan_free(&p);
        cp_plan_free(&q);
    }
    /* K peaks on one GPU: 8 ranks of the 8B shape's 2 layers at 32K fit an H200, not 40 GiB */
    cp_spec s;
    load("llama8b", &s, 5, "model.layers=2", "train.seq_len=32K", "parallel.gpus=8", "machine.ranks_per_gpu=8",
         "machine.gpu_mem=40G");
    cp_plan p;
    build(&s, &p);
    assert_false(p.fits);
    assert_non_null(strstr(p.why, "x 8 ranks sharing each GPU"));
    assert_true(p.gpu_peak < s.machine.gpu_mem && p.gpu_peak * 8 > s.machine.gpu_mem);
    char *text = printed(&p);
    assert_non_null(strstr(text, "8 ranks on 1 GPU, 8 to a GPU, each its own NCCL host"));
    assert_non_null(strstr(text, "reserve: NCCL over sockets"));
    free(text);
    cp_plan_free(&p);
    /* a count outside 1..64 is refused with the key named */
    char err[CP_ERR_MAX];
    const char *bad[] = {"machine.ranks_per_gpu=0"};
    assert_int_equal(cp_spec_load("tiny", bad, 1, &s, err, sizeof err), -1);
    assert_non_null(strstr(err, "machine.ranks_per_gpu = 0: must be between 1 and 64"));
}

/* Host memory per process: the pinned arena, the fp32 weights while they load (the whole model where one process
 * reads it, else the largest unit beside the rank's shard), and the reserve; a node too small is refused. */
static void test_host_memory(void **state) {
    (void)state;
    for (int gpus = 1; gpus <= 2; gpus++) {
        cp_spec s;
        char g[32];
        snprintf(g, sizeof g, "parallel.gpus=%d", gpus);
        load("llama3b", &s, 2, g, "train.seq_len=16K");
        cp_plan p;
        build(&s, &p);
        int64_t model = 0, unit_max = 0;
        for (int u = 0; u < p.nunits; u++) {
            model += p.unit_padded[u];
            if (p.unit_padded[u] > unit_max) unit_max = p.unit_padded[u];
        }
        assert_int_equal(p.host_load, gpus == 1 ? 4 * model : 4 * (unit_max + p.params_shard));
        assert_int_equal(p.host_peak, p.host_arena + p.host_load + s.machine.host_reserve);
        assert_int_equal(p.host_run, p.host_arena + s.machine.host_runtime);
        assert_true(p.fits);
        /* a node one byte short of every process's peak */
        char h[64];
        snprintf(h, sizeof h, "machine.host_mem=%lld", (long long)(p.host_peak * gpus - 1));
        cp_plan_free(&p);
        load("llama3b", &s, 3, g, "train.seq_len=16K", h);
        build(&s, &p);
        assert_false(p.fits);
        assert_non_null(strstr(p.why, "host memory"));
        cp_plan_free(&p);
    }
}

/* A checkpoint's snapshot in the host memory of the node: three fp32 models on the writing rank when saves are on,
 * twice (two slots) where the node holds two by the same rule, pinned where the node has room (a quarter of host_mem left unpinned), pageable (with its staging) where it does
 * not, a memcpy of the host optimizer's state (pageable) or that state written in place, and a plan refused when the
 * snapshot does not fit at all. */
static void test_ckpt_snapshot(void **state) {
    (void)state;
    cp_spec s;
    cp_plan p;
    load("tiny", &s, 0);
    build(&s, &p);
    int64_t model = 0;
    for (int u = 0; u < p.nunits; u++) model += p.unit_padded[u];
    assert_int_equal(p.ckpt_snap, CP_SNAP_NONE); /* no saves: nothing to copy */
    assert_int_equal(p.ckpt_snap_bytes, 0);
    assert_int_equal(p.host_node, p.host_peak);
    cp_plan_free(&p);

    load("tiny", &s, 1, "train.save_every=10");
    build(&s, &p);
    /* room for two: two slots, both counted in the snapshot's bytes and the node's */
    assert_int_equal(p.ckpt_snap, CP_SNAP_PINNED);
    assert_int_equal(p.ckpt_slots, 2);
    assert_int_equal(p.ckpt_snap_bytes, 2 * 12 * model);
    assert_int_equal(p.host_node, p.host_peak + 2 * 12 * model);
    int64_t node = p.host_node;
    cp_plan_free(&p);
    /* one byte short of the node with two: one slot, pinned, as before there were two */
    char h[64];
    snprintf(h, sizeof h, "machine.host_mem=%lld", (long long)(node - 1));
    load("tiny", &s, 2, "train.save_every=10", h);
    build(&s, &p);
    assert_true(p.fits);
    assert_int_equal(p.ckpt_snap, CP_SNAP_PINNED);
    assert_int_equal(p.ckpt_slots, 1);
    assert_int_equal(p.ckpt_snap_bytes, 12 * model);
    assert_int_equal(p.host_node, p.host_peak + 12 * model);
    node = p.host_node;
    cp_plan_free(&p);
    /* one byte short of the node with one: refused, naming the snapshot and the way out */
    snprintf(h, sizeof h, "machine.host_mem=%lld", (long long)(node - 1));
    load("tiny", &s, 2, "train.save_every=10", h);
    build(&s, &p);
    assert_false(p.fits);
    assert_int_equal(p.ckpt_slots, 1);
    assert_non_null(strstr(p.why, "checkpoint's snapshot"));
    assert_non_null(strstr(p.why, "train.save_every = 0"));
    cp_plan_free(&p);
    load("tiny", &s, 2, "train.save_every=0", h); /* without saves the same machine holds it */
    build(&s, &p);
    assert_true(p.fits);
    assert_int_equal(p.ckpt_slots, 0);
    cp_plan_free(&p);

    /* the host optimizer's state: a memcpy into pageable memory, two slots with room for them, one without; written
     * in place when asked to wait anyway, or when there is no room for one copy */
    load("tiny", &s, 2, "train.save_every=10", "parallel.optimizer=host");
    build(&s, &p);
    assert_int_equal(p.ckpt_snap, CP_SNAP_PAGEABLE);
    assert_int_equal(p.ckpt_slots, 2);
    assert_int_equal(p.ckpt_snap_bytes, 2 * 12 * model);
    node = p.host_node;
    cp_plan_free(&p);
    snprintf(h, sizeof h, "machine.host_mem=%lld", (long long)(node - 1));
    load("tiny", &s, 3, "train.save_every=10", "parallel.optimizer=host", h);
    build(&s, &p);
    assert_int_equal(p.ckpt_snap, CP_SNAP_PAGEABLE);
    assert_int_equal(p.ckpt_slots, 1);
    assert_int_equal(p.ckpt_snap_bytes, 12 * model);
    node = p.host_node;
    cp_plan_free(&p);
    load("tiny", &s, 3, "train.save_every=10", "parallel.optimizer=host", "train.async_save=false");
    build(&s, &p);
    assert_int_equal(p.ckpt_snap, CP_SNAP_IN_PLACE);
    assert_int_equal(p.ckpt_slots, 0);
    assert_int_equal(p.ckpt_snap_bytes, 0);
    cp_plan_free(&p);
    snprintf(h, sizeof h, "machine.host_mem=%lld", (long long)(node - 1));
    load("tiny", &s, 3, "train.save_every=10", "parallel.optimizer=host", h);
    build(&s, &p);
    assert_int_equal(p.ckpt_snap, CP_SNAP_IN_PLACE);
    assert_true(p.fits);
    cp_plan_free(&p);

    /* checkpoints offloaded to pinned memory take most of a small host: the snapshot fits, but pinned it would leave
     * less than a quarter unpinned, so it is pageable, with its staging */
    const char *base[] = {"train.save_every=10", "parallel.offload=all", "train.seq_len=512K",
                          "machine.host_reserve=16M", "machine.host_runtime=16M"};
    load("tiny", &s, 5, base[0], base[1], base[2], base[3], base[4]);
    build(&s, &p);
    assert_true(p.host_arena + 12 * model > 3 * (p.host_load + s.machine.host_reserve + CP_SNAP_STAGING)); /* the case */
    int64_t tight = p.host_peak + 12 * model + CP_SNAP_STAGING;
    cp_plan_free(&p);
    snprintf(h, sizeof h, "machine.host_mem=%lld", (long long)tight);
    load("tiny", &s, 6, base[0], base[1], base[2], base[3], base[4], h);
    build(&s, &p);
    assert_int_equal(p.ckpt_snap, CP_SNAP_PAGEABLE);
    assert_int_equal(p.ckpt_slots, 1);
    assert_int_equal(p.ckpt_snap_bytes, 12 * model + CP_SNAP_STAGING);
    assert_true(p.fits);
    assert_int_equal(p.host_node, tight);
    cp_plan_free(&p);
    /* room for a second pageable copy beside it: two slots, one staging buffer */
    snprintf(h, sizeof h, "machine.host_mem=%lld", (long long)(tight + 12 * model));
    load("tiny", &s, 6, base[0], base[1], base[2], base[3], base[4], h);
    build(&s, &p);
    assert_int_equal(p.ckpt_snap, CP_SNAP_PAGEABLE);
    assert_int_equal(p.ckpt_slots, 2);
    assert_int_equal(p.ckpt_snap_bytes, 2 * 12 * model + CP_SNAP_STAGING);
    assert_int_equal(p.host_node, tight + 12 * model);
    cp_plan_free(&p);
}

static void test_max_seq(void **state) {
    (void)state;
    cp_spec s;
    load("llama1b", &s, 3, "parallel.gpus=1", "parallel.upipe_heads=1", "machine.gpu_mem=40G");
    cp_plan best;
    char err[CP_ERR_MAX];
    int64_t n = cp_plan_max_seq(&s, &best, err, sizeof err);
    assert_true(n > 0);
    assert_true(best.fits);
    assert_int_equal(best.S, n);
    assert_int_equal(n % 1024, 0);
    cp_plan_free(&best);
    /* one step of the granularity longer does not fit */
    char set[64];
    snprintf(set, sizeof set, "train.seq_len=%lld", (long long)(n + 1024));
    cp_spec s2;
    load("llama1b", &s2, 4, "parallel.gpus=1", "parallel.upipe_heads=1", "machine.gpu_mem=40G", set);
    cp_plan p;
    build(&s2, &p);
    assert_false(p.fits);
    cp_plan_free(&p);
}

/* When nothing fits, the answer says why, at the shortest length tried. */
static void test_max_seq_none_fits(void **state) {
    (void)state;
    cp_spec s;
    load("qwen32b", &s, 2, "parallel.gpus=1", "parallel.upipe_heads=1");
    cp_plan best;
    char err[CP_ERR_MAX];
    assert_int_equal(cp_plan_max_seq(&s, &best, err, sizeof err), 0);
    assert_non_null(strstr(err, "not even 1024 tokens"));
    assert_non_null(strstr(err, "GPU memory: needs"));
}

/* Replicas (hybrid sharding): memory per GPU is the group's, byte for byte; after each unit's reduce-scatter, one
 * all-reduce of its gradient shard across the groups (last micro-batch only, comm stream, its exact bytes), counted
 * against the backward by the cost model; the loss summed over groups once per step. */
static void test_replicas(void **state) {
    (void)state;
    cp_spec s1, s2;
    load("llama8b", &s1, 4, "parallel.gpus=8", "train.seq_len=1M", "train.micro_batches=2",
         "parallel.attention_output=recompute");
    load("llama8b", &s2, 5, "parallel.gpus=8", "train.seq_len=1M", "train.micro_batches=2",
         "parallel.attention_output=recompute", "parallel.replicas=2");
    cp_plan p1, p2;
    build(&s1, &p1);
    build(&s2, &p2);
    assert_int_equal(p2.replicas, 2);
    assert_int_equal(p2.gpu_arena, p1.gpu_arena);
    assert_int_equal(p2.gpu_peak, p1.gpu_peak);
    assert_int_equal(p2.host_arena, p1.host_arena);
    for (int k = 0; k < CP_CAT_COUNT; k++) assert_int_equal(p2.cat_bytes[k], p1.cat_bytes[k]);
    /* the same program plus L + 2 shard all-reduces (embedding, 32 layers, head) and the loss's */
    assert_int_equal(p2.nsteps, p1.nsteps + 32 + 2 + 1);
    const int64_t layer = 218112000, C = 8, V = 128256, h = 4096;
    int n = 0, prev_rs = 0;
    int64_t total = 0;
    for (int i = 0; i < p2.nsteps; i++) {
        const cp_step *st = &p2.steps[i];
        if (st->kind == CP_OP_REDUCE_SCATTER) prev_rs = i;
        if (strcmp(st->what, "shard_allreduce")) continue;
        assert_true(i < p2.micro_steps);
        assert_int_equal(prev_rs, i - 1); /* right after the reduce-scatter of its unit */
        assert_int_equal(st->kind, CP_OP_ALLREDUCE);
        assert_int_equal(st->comm, CP_COMM_SHARD);
        assert_int_equal(st->stream, CP_STREAM_COMM);
        assert_true(st->last_micro);
        assert_int_equal(st->nops, 1);
        assert_int_equal(st->ops[0].buf, p2.steps[i - 1].ops[1].buf); /* the shard the reduce-scatter wrote */
        assert_int_equal(st->ops[0].offset, p2.steps[i - 1].ops[1].offset);
        assert_int_equal(st->count, st->ops[0].bytes);
        /* ring all-reduce over 2 groups at 40 GB/s: 2 (n - 1) / n of the bytes, plus its latency */
        assert_true(fabs(st->seconds - ((double)st->count / 40e9 + 20e-6)) < 1e-12);
        total += st->count;
        n++;
    }
    assert_int_equal(n, 34);
    assert_int_equal(total, p2.params_shard * 4);
    assert_int_equal(p2.params_shard, (V * h + 32 * layer + 4096 + V * h) / C);
    int loss = -1;
    for (int i = p2.micro_steps; i < p2.nsteps; i++)
        if (!strcmp(p2.steps[i].what, "loss_allreduce")) loss = i;
    assert_true(loss > 0);
    assert_int_equal(p2.steps[loss].count, 4);
    assert_int_equal(p2.steps[loss].comm, CP_COMM_SHARD);
    /* a layer's all-reduce hides behind its backward; the embedding's and the head's have little compute beside
     * them, so the exposed communication grows by at most those two and the loss's, and at least the loss's */
    double outside = 0;
    for (int i = 0; i < p2.micro_steps; i++)
        if (!strcmp(p2.steps[i].what, "shard_allreduce") && p2.steps[i].layer < 0) outside += p2.steps[i].seconds;
    assert_true(outside > 0);
    assert_true(p2.t_comm > p1.t_comm + (double)total / 40e9);
    double grown = p2.t_comm_exposed - p1.t_comm_exposed;
    assert_true(grown >= p2.steps[loss].seconds - 1e-12);
    assert_true(grown <= p2.steps[loss].seconds + outside + 1e-12);
    assert_true(fabs(p2.t_compute - p1.t_compute) < 1e-12);
    cp_plan_free(&p1);
    cp_plan_free(&p2);
}

/* The 8B shape at 8M tokens on 32 GPUs (ring 4 x 8 GPUs, U = 8), attention recomputed: a group holds L = S/4 = 2M
 * tokens in head layout (u = 1 query head and 1 KV head per GPU per stage), each GPU T = 256K in token layout. */
static const char *const RING_8M[] = {"parallel.gpus=8", "parallel.ring=4", "train.seq_len=8M",
                                      "parallel.attention_output=recompute"};

static void load_ring_8m(cp_spec *s, const char *extra) {
    if (extra) load("llama8b", s, 5, RING_8M[0], RING_8M[1], RING_8M[2], RING_8M[3], extra);
    else load("llama8b", s, 4, RING_8M[0], RING_8M[1], RING_8M[2], RING_8M[3]);
}

static bool has_buf(const cp_plan *p, const char *name) {
    for (int i = 0; i < p->nbufs; i++)
        if (!strcmp(p->bufs[i].name, name)) return true;
    return false;
}

/* Memory term by term: every buffer of a ring of 4 at 8M is the buffer of one group at 2M (the same T and head
 * layout), the ring adds its terms (cp_ring_terms_of) and drops the GQA group's dK, dV accumulator (the ring's home
 * accumulator sums the group); with 2 replicas (64 GPUs) every byte is the same again. The model states are the
 * group's shards. The attention FLOPs per GPU are the whole sequence's over 32 GPUs. */
static void test_ring_8b_arithmetic(void **state) {
    (void)state;
    cp_spec s, s1, s2;
    load_ring_8m(&s, NULL);
    load("llama8b", &s1, 3, "parallel.gpus=8", "train.seq_len=2M", "parallel.attention_output=recompute");
    load_ring_8m(&s2, "parallel.replicas=2");
    /* the figures below are of 4K-token MLP tiles ("auto" grows them into the memory left: test_mlp_tile_auto) */
    s.parallel.mlp_tile = s1.parallel.mlp_tile = s2.parallel.mlp_tile = 4096;
    cp_plan p, one, two;
    build(&s, &p);
    build(&s1, &one);
    build(&s2, &two);
    const int64_t h = 4096, H = 32, D = 128, C = 8, R = 4, S = 8LL << 20, L = S / R, c = L / 2, T = L / C;
    assert_int_equal(p.ring, 4);
    assert_int_equal(p.group_tokens, 2097152);
    assert_int_equal(p.T, 262144);
    assert_int_equal(p.T, one.T);
    assert_int_equal(p.u, 1);
    assert_int_equal(p.kvr, 1);
    assert_int_equal(p.group_len, 4);
    assert_int_equal(p.params_shard, one.params_shard);
    /* token layout: this GPU's T tokens */
    assert_int_equal(buf(&p, "ckpt.0")->bytes, T * h * 2);                 /* 2 GiB */
    assert_int_equal(buf(&p, "attn_out")->bytes, T * H * D * 2);           /* 2 GiB */
    assert_int_equal(buf(&p, "q_stage")->bytes, T * 8 * D * 2);            /* the stage's 8 heads: 512 MiB */
    assert_int_equal(buf(&p, "a2a_send")->bytes, T * 8 * D * 2);
    /* head layout: the group's L tokens, one head */
    assert_int_equal(buf(&p, "q_heads")->bytes, L * 1 * D * 2);            /* 512 MiB */
    assert_int_equal(buf(&p, "k_heads")->bytes, L * 1 * D * 2);
    assert_int_equal(buf(&p, "o_heads")->bytes, L * 1 * D * 2);
    assert_int_equal(buf(&p, "delta_heads")->bytes, L * 4);                 /* 8 MiB */
    assert_int_equal(buf(&p, "lse")->bytes, (H / C) * L * 4);              /* 32 MiB */
    assert_int_equal(buf(&p, "dq_accum.f32")->bytes, L * D * 4 + (L / 128) * 4); /* 1 GiB + 64 KiB of counters */
    assert_false(has_buf(&p, "dkv_accum.f32"));
    /* the ring's terms: K, V arriving (two slots each), the merge, the travelling dK, dV, a half launch's dQ */
    cp_ring_terms t;
    cp_ring_terms_of(4, L, 1, 1, D, &t);
    assert_int_equal(buf(&p, "ring_k.0")->bytes, L * D * 2);                /* 512 MiB: half a K/V block */
    assert_int_equal(buf(&p, "ring_k.0")->bytes + buf(&p, "ring_v.0")->bytes, t.kv_block);
    assert_int_equal(buf(&p, "ring_k.1")->bytes + buf(&p, "ring_v.1")->bytes + t.kv_block, t.kv_recv);
    assert_int_equal(buf(&p, "ring_o.f32")->bytes, L * D * 4);              /* 1 GiB */
    assert_int_equal(buf(&p, "ring_o.f32")->bytes, t.o_acc);
    assert_int_equal(buf(&p, "ring_lse")->bytes, L * 4);                    /* 8 MiB */
    assert_int_equal(buf(&p, "ring_lse")->bytes, t.lse_blk);
    assert_int_equal(buf(&p, "ring_dkv.0.f32")->bytes, 2 * L * D * 4);      /* 2 GiB */
    assert_int_equal(buf(&p, "ring_dkv.0.f32")->bytes + buf(&p, "ring_dkv.1.f32")->bytes, t.dkv_recv);
    assert_int_equal(buf(&p, "ring_dkv_step.f32")->bytes, t.dkv_step);
    assert_int_equal(buf(&p, "dq_half.f32")->bytes, c * D * 4 + (c / 128) * 4); /* 512 MiB + 32 KiB */
    assert_int_equal(buf(&p, "dq_half.f32")->bytes, t.dq_half + (c / 128) * 4);
    int64_t ring = t.kv_recv + t.o_acc + t.lse_blk + t.dkv_recv + t.dkv_step + t.dq_half + (c / 128) * 4;
    assert_int_equal(ring, 10208968704LL); /* 9.51 GiB */
    assert_int_equal(p.cat_bytes[CP_CAT_RING], ring);
    /* against one group at 2M: the same bytes in every category but the ring's and the stage's working set, which
     * lost the 2 GiB dK, dV accumulator */
    for (int k = 0; k < CP_CAT_COUNT; k++) {
        if (k == CP_CAT_RING || k == CP_CAT_ATTN) continue;
        if (p.cat_bytes[k] != one.cat_bytes[k]) fail_msg("%s: %lld against %lld", cp_cat_name((cp_cat)k),
                                                         (long long)p.cat_bytes[k], (long long)one.cat_bytes[k]);
    }
    assert_int_equal(one.cat_bytes[CP_CAT_RING], 0);
    assert_int_equal(one.cat_bytes[CP_CAT_ATTN] - p.cat_bytes[CP_CAT_ATTN], 2 * L * D * 4);
    /* what that makes per GPU, and that it fits a 139.79 GiB H200 */
    assert_int_equal(p.gpu_live_peak, 107435238656LL);
    assert_int_equal(p.gpu_arena, 109582722304LL);
    assert_int_equal(p.gpu_peak, p.gpu_arena + (560LL << 20) + (1280LL << 20)); /* + reserve + NCCL reserve */
    assert_true(p.fits);
    /* 2 replicas: 64 GPUs, the same bytes, the same program (the shard all-reduces are there with a ring already) */
    assert_int_equal(two.replicas * two.ring * two.C, 64);
    assert_int_equal(two.gpu_arena, p.gpu_arena);
    assert_int_equal(two.gpu_peak, p.gpu_peak);
    assert_int_equal(two.host_arena, p.host_arena);
    for (int k = 0; k < CP_CAT_COUNT; k++) assert_int_equal(two.cat_bytes[k], p.cat_bytes[k]);
    for (int i = 0; i < p.nbufs; i++) assert_int_equal(two.bufs[i].bytes, p.bufs[i].bytes);
    assert_int_equal(two.nsteps, p.nsteps);
    assert_true(fabs(two.t_compute - p.t_compute) < 1e-9);
    /* attention per GPU: the causal forward 2 S^2 H D of 32 layers over 32 GPUs, recomputed once, backward 2.5x */
    double fwd = 2.0 * (double)S * S * H * D * 32 / 32;
    assert_true(fabs(p.flops_attn / (4.5 * fwd) - 1) < 1e-12);
    cp_plan_free(&p);
    cp_plan_free(&one);
    cp_plan_free(&two);
}

/* The steps of layer `layer`, phase `ph` and stage `st`, in order, into out (at most max): their count. */
static int stage_steps(const cp_plan *p, int layer, cp_phase ph, int st, const cp_step **out, int max) {
    int n = 0;
    for (int i = 0; i < p->nsteps && n < max; i++) {
        const cp_step *x = &p->steps[i];
        if (x->layer == layer && x->phase == ph && x->stage == st) out[n++] = x;
    }
    return n;
}

/* An operand's buffer name, offset and bytes. */
static void assert_op(const cp_plan *p, const cp_step *x, int j, const char *name, int64_t off, int64_t bytes) {
    const cp_operand *o = &x->ops[j];
    if (strcmp(p->bufs[o->buf].name, name) || o->offset != off || o->bytes != bytes)
        fail_msg("%s ring step %d part %d operand %d: %s [%lld, +%lld), expected %s [%lld, +%lld)", x->what,
                 x->ring_step, x->ring_part, j, p->bufs[o->buf].name, (long long)o->offset, (long long)o->bytes, name,
                 (long long)off, (long long)bytes);
}

/* The stage table with rings: a forward stage is, after its Q (K, V) projection and all-to-all, P ring steps: K and
 * V sent on (not at the last step) while the block in hand is attended to (its own causal, a received one in two half
 * launches), each launch's result merged by LSE; then the merged output cast back for the all-to-all. Operands: the
 * part-0 launch takes query half 1 and key half 0 at every position, exactly; part 1's half depends on the position,
 * so it covers both. The backward sends K, V round again and every accumulator home; bytes sent are the terms. */
static void test_ring_stage_tables(void **state) {
    (void)state;
    cp_spec s;
    load_ring_8m(&s, NULL);
    cp_plan p;
    build(&s, &p);
    const int64_t D = 128, L = 2097152, c = L / 2;
    cp_ring_terms t;
    cp_ring_terms_of(4, L, 1, 1, D, &t);
    const cp_step *st[512];
    int n = stage_steps(&p, 0, CP_PHASE_FWD, 1, st, 512);
    /* stage 1 of a GQA group: K, V kept, Q projected, roped and sent */
    const char *want[] = {"q_proj", "rope_q", "pack_q", "a2a_q",
                          "ring_send_k", "ring_send_v", "attn_fwd", "attn_merge_init",
                          "ring_send_k", "ring_send_v", "attn_fwd_half", "attn_merge", "attn_fwd_half", "attn_merge",
                          "ring_send_k", "ring_send_v", "attn_fwd_half", "attn_merge", "attn_fwd_half", "attn_merge",
                          "attn_fwd_half", "attn_merge", "attn_fwd_half", "attn_merge",
                          "cast_o", "a2a_o", "unpack_o"};
    assert_int_equal(n, (int)(sizeof want / sizeof *want));
    double flops = 0;
    int64_t sent = 0;
    int nhalf = 0, nmerge = 0;
    for (int i = 0; i < n; i++) {
        const cp_step *x = st[i];
        if (strcmp(x->what, want[i])) fail_msg("forward stage step %d: %s, expected %s", i, x->what, want[i]);
        flops += x->flops * (x->kind == CP_OP_KERNEL);
        bool ringed = i >= 4 && i < 24;
        if (!ringed) assert_int_equal(x->ring_step, -1);
        if (x->kind == CP_OP_SENDRECV) {
            assert_int_equal(x->comm, CP_COMM_RING);
            assert_int_equal(x->stream, CP_STREAM_COMM);
            assert_int_equal(x->count, L * D * 2);
            assert_true(fabs(x->seconds - ((double)L * D * 2 / 40e9 + 20e-6)) < 1e-12);
            sent += x->count;
        }
        bool half = !strcmp(x->what, "attn_fwd_half"), merge = !strcmp(x->what, "attn_merge");
        if (half || merge) { /* part 0, then part 1, of each step k >= 1 */
            assert_true(x->ring_step >= 1);
            assert_int_equal(x->ring_part, (half ? nhalf++ : nmerge++) % 2);
            assert_int_equal(x->lse_stride, L);
        }
    }
    assert_int_equal(sent, t.fwd_sent); /* 3 K/V blocks of 1 GiB */
    /* ring steps 0..3 in order; the received block comes from the slot the send before it filled */
    assert_int_equal(st[6]->ring_step, 0);
    assert_int_equal(st[6]->ring_part, -1);
    assert_int_equal(st[10]->ring_step, 1);
    assert_int_equal(st[20]->ring_step, 3);
    assert_op(&p, st[4], 0, "k_heads", 0, L * D * 2);
    assert_op(&p, st[4], 1, "ring_k.0", 0, L * D * 2);
    /* part 0 of step 1: query half 1 against key half 0, at every position */
    assert_op(&p, st[10], 0, "q_heads", c * D * 2, c * D * 2);
    assert_op(&p, st[10], 1, "ring_k.0", 0, c * D * 2);
    assert_op(&p, st[10], 2, "ring_v.0", 0, c * D * 2);
    assert_op(&p, st[10], 3, "o_heads", c * D * 2, c * D * 2);
    assert_op(&p, st[10], 4, "ring_lse", c * 4, c * 4);
    assert_op(&p, st[11], 2, "ring_o.f32", c * D * 4, c * D * 4);
    assert_op(&p, st[11], 3, "lse", 1 * 1 * L * 4 + c * 4, c * 4); /* stage 1's LSE row, its second half */
    /* part 1: half 0 or 1 by the position: both halves */
    assert_op(&p, st[12], 0, "q_heads", 0, L * D * 2);
    assert_op(&p, st[12], 1, "ring_k.0", 0, L * D * 2);
    assert_op(&p, st[14], 0, "ring_k.1", 0, L * D * 2); /* step 2's block, passed on into the slot step 1 used */
    assert_op(&p, st[14], 1, "ring_k.0", 0, L * D * 2);
    /* the stage's attention FLOPs: 4 ring steps of 2 L^2 D each, the causal forward 2 S^2 D of one head over 4 */
    assert_true(fabs(flops - 4 * 2.0 * (double)L * L * D) < 1);
    assert_true(fabs(flops - 2.0 * (double)(4 * L) * (4 * L) * D / 4) < 1);
    /* the backward of the last stage: K, V round again, P accumulator hops, the last home into slot 0 (P even) */
    n = stage_steps(&p, 31, CP_PHASE_BWD, 3, st, 512);
    int kv = 0, hops = 0, halves = 0, adds = 0;
    sent = 0;
    const char *last_hop = NULL;
    for (int i = 0; i < n; i++) {
        const cp_step *x = st[i];
        if (x->kind == CP_OP_SENDRECV) sent += x->count;
        kv += !strcmp(x->what, "ring_send_k") + !strcmp(x->what, "ring_send_v");
        halves += !strcmp(x->what, "attn_bwd_half");
        adds += !strcmp(x->what, "ring_add_dq");
        if (!strcmp(x->what, "ring_send_dkv")) {
            hops++;
            assert_int_equal(x->count, 2 * L * D * 4);
            last_hop = p.bufs[x->ops[1].buf].name;
        }
        if (!strcmp(x->what, "cast_dk")) assert_string_equal(p.bufs[x->ops[0].buf].name, "ring_dkv.0.f32");
    }
    assert_int_equal(kv, 6);
    assert_int_equal(hops, 4);
    assert_int_equal(halves, 6);
    assert_int_equal(adds, 6);
    assert_string_equal(last_hop, "ring_dkv.0.f32");
    assert_int_equal(sent, t.bwd_sent); /* 3 blocks and 4 hops of 2 GiB: 11 GiB */
    /* every send/recv is counted; only what no attention runs under is exposed: each backward stage's last hop home,
     * less the dQ conversion that follows it (an attention launch, and no reader of the hop) */
    double sr = 0, dq = 0;
    for (int i = 0; i < p.nsteps; i++) {
        if (p.steps[i].kind == CP_OP_SENDRECV) sr += p.steps[i].seconds;
        if (!strcmp(p.steps[i].what, "attn_bwd_dq")) dq = p.steps[i].seconds;
    }
    assert_true(fabs(p.t_ring - sr) < 1e-9);
    assert_true(dq > 0);
    assert_true(fabs(p.t_ring_exposed - 32 * 4 * (cp_ring_sendrecv_seconds(2 * L * D * 4, &p.spec.machine) - dq)) < 1e-9);
    /* the startup table shows the schedule */
    char *text = printed(&p);
    if (!strstr(text, "         1  1, 6     1: causal        0: q1k0 q0k0     3: q1k0 q1k1     2: q1k0 q1k1") ||
        !strstr(text, "ring attention (blocks, merge, dK/dV)          9.51 GiB") ||
        !strstr(text, "sent per GPU and stage: 3.00 GiB forward (3 blocks), 11.00 GiB backward (3 blocks, 4 "
                      "accumulator hops)"))
        fail_msg("%s", text);
    free(text);
    cp_plan_free(&p);
    /* train.deterministic = false: a half launch adds its dQ into all of its workspace, so all of it starts at zero
     * (ordered, only the progress counters do) */
    load_ring_8m(&s, "train.deterministic=false");
    build(&s, &p);
    int zeroed = 0;
    for (int i = 0; i < p.nsteps; i++) {
        const cp_step *x = &p.steps[i];
        const cp_buffer *b = &p.bufs[x->ops[0].buf];
        if (x->kind != CP_OP_MEMSET || strcmp(b->name, "dq_half.f32")) continue;
        assert_int_equal(x->ops[0].offset, 0);
        assert_int_equal(x->ops[0].bytes, b->bytes);
        zeroed++;
    }
    assert_int_equal(zeroed, 32 * 4 * 3 * 2); /* layers x stages x received blocks x parts */
    cp_plan_free(&p);
}

/* With an odd number of GPUs per group a rank's rows can straddle its two chunks: every RoPE launch site has one
 * launch per run (the tiny shape on 1 GPU per group, ring 2: chunks 0 and 3 of position 0 on the one rank). */
static void test_ring_rope_runs(void **state) {
    (void)state;
    cp_spec s;
    load("tiny", &s, 2, "parallel.gpus=1", "parallel.ring=2");
    cp_plan p;
    build(&s, &p);
    int runs[2] = {0};
    for (int i = 0; i < p.nsteps; i++) {
        const cp_step *x = &p.steps[i];
        if (strncmp(x->what, "rope_", 5)) continue;
        assert_true(x->ring_part == 0 || x->ring_part == 1);
        runs[x->ring_part]++;
        assert_int_equal(x->count, p.T);
    }
    assert_true(runs[0] > 0);
    assert_int_equal(runs[0], runs[1]);
    cp_plan_free(&p);
    /* an even number: one run each, still marked for the executor (its positions are the zigzag's) */
    load_ring_8m(&s, NULL);
    build(&s, &p);
    for (int i = 0; i < p.nsteps; i++)
        if (!strncmp(p.steps[i].what, "rope_", 5)) assert_int_equal(p.steps[i].ring_part, 0);
    cp_plan_free(&p);
}

/* `cpgen plan llama8b --gpus 8 --set parallel.ring=4 --max-seq`: the longest sequence on 32 GPUs. */
static void test_ring_max_seq(void **state) {
    (void)state;
    cp_spec s;
    load("llama8b", &s, 2, "parallel.gpus=8", "parallel.ring=4");
    cp_plan best;
    char err[CP_ERR_MAX];
    int64_t n = cp_plan_max_seq(&s, &best, err, sizeof err);
    if (n <= 0) fail_msg("%s", err);
    assert_int_equal(n, 25329664); /* 24736K: 773K per GPU */
    assert_int_equal(n % (1024 * 32), 0);
    assert_int_equal(best.S, n);
    assert_int_equal(best.T, n / 32);
    assert_true(best.fits);
    assert_true(best.t_step > 0);
    cp_plan_free(&best);
}

/* The LSE rows of a ring's attention launches: the own block's launch (SEQ = the group's L tokens) and the half-block
 * launches (SEQ = L / 2) read and write the stage's u LSE rows L apart, so the half module is compiled with
 * LSE_STRIDE = L; with one query head per GPU and stage (u = 1) as with several (u = 2). Then what a ring cannot be
 * is refused, naming the key, why and the fix. */
static void check_ring_lse_strides(const cp_plan *p) {
    int full = 0, half = 0;
    for (int i = 0; i < p->nmodules; i++) {
        const cp_kernel_spec *k = &p->modules[i];
        if (strcmp(k->family, "attention")) continue;
        const long long seq = atoll(cp_kspec_get(k, "SEQ")), stride = atoll(cp_kspec_get(k, "LSE_STRIDE"));
        assert_int_equal(stride, p->group_tokens);
        full += seq == p->group_tokens;
        half += 2 * seq == p->group_tokens;
        assert_int_equal(cp_k_attention_lse_bytes(k), ((p->u - 1) * p->group_tokens + seq) * 4);
    }
    assert_int_equal(full, 1);
    assert_int_equal(half, 1);
}

static void test_ring_refusals(void **state) {
    (void)state;
    cp_spec s;
    cp_plan p;
    load("llama8b", &s, 3, "parallel.gpus=8", "parallel.ring=4", "train.seq_len=1M");
    build(&s, &p);
    assert_int_equal(p.u, 1);
    check_ring_lse_strides(&p);
    cp_plan_free(&p);
    load("llama8b", &s, 4, "parallel.gpus=8", "parallel.ring=4", "train.seq_len=1M", "parallel.upipe_heads=16");
    build(&s, &p);
    assert_int_equal(p.u, 2);
    check_ring_lse_strides(&p);
    cp_plan_free(&p);
    char *out;
    /* the spec's own refusal: a length the zigzag cannot cut, with the two nearest that it can */
    assert_int_equal(sh("build/cpgen plan llama8b --gpus 8 --set parallel.ring=4 --seq 1000032", &out), 2);
    if (!strstr(out, "train.seq_len = 1000032: with ring = 4 the sequence is cut into 2 x ring = 8 zigzag chunks") ||
        !strstr(out, "it must be a multiple of 2 x ring x gpus = 64; use 1000000 or 1000064"))
        fail_msg("%s", out);
    free(out);
    /* nothing fits: --max-seq says why at the shortest length (1K tokens on each of the 32 GPUs) */
    assert_int_equal(sh("build/cpgen plan llama8b --gpus 8 --set parallel.ring=4 --set machine.gpu_mem=16G --max-seq",
                        &out), 2);
    if (!strstr(out, "<embedded>/llama8b.lua: no sequence length fits, not even 32768 tokens: ") ||
        !strstr(out, "the machine has"))
        fail_msg("%s", out);
    free(out);
}

/* Rings over packed documents. Without documents a ring's plan is as it was before rings masked them (the step
 * counts below are those plans', every launch of step 0 one causal launch over the own block, no module masking
 * documents). With them: no launch over the own block whole (its two chunks are not consecutive positions), step 0
 * in three half launches per pass (gen/ring.h: two causal, on a causal module of SEQ = c, and one maskless),
 * each with the sequence's bounds as its last operands; so the program grows by exactly what that split adds: per
 * forward pass of a stage 3 steps (3 half launches and a merge for one launch), per backward pass 8 (3 x a dQ
 * workspace zeroed, a launch and a dQ sum, for one launch). */
static void test_ring_documents_plan(void **state) {
    (void)state;
    static const struct {
        const char *sets[3];
        int steps; /* without documents */
    } rings[] = {
        {{"parallel.ring=2", "parallel.upipe_heads=2", "parallel.gpus=1"}, 284},
        {{"parallel.ring=4", "parallel.upipe_heads=2", "parallel.gpus=1"}, 420},
        {{"parallel.ring=2", "parallel.upipe_heads=4", "parallel.gpus=2"}, 225},
        {{"parallel.ring=2", "parallel.upipe_heads=2", "parallel.replicas=2"}, 284},
    };
    for (size_t r = 0; r < sizeof rings / sizeof rings[0]; r++) {
        cp_spec s;
        cp_plan p, d;
        load("tiny", &s, 3, rings[r].sets[0], rings[r].sets[1], rings[r].sets[2]);
        build(&s, &p);
        s.data.documents = CP_DOCS_MASK;
        s.data.positions = CP_POS_DOCUMENT;
        build(&s, &d);
        assert_true(p.ring > 1 && !p.docs && d.docs);
        assert_int_equal(p.nsteps, rings[r].steps);
        for (int m = 0; m < p.nmodules; m++) {
            const char *docs = cp_kspec_get(&p.modules[m], "DOCS");
            assert_true(!docs || !strcmp(docs, "0"));
        }
        for (int i = 0; i < p.nsteps; i++)
            if (p.steps[i].ring_step == 0) assert_int_equal(p.steps[i].ring_part, -1);
        const int fwd_passes = count_steps(&p, "attn_merge_init"), bwd_passes = count_steps(&p, "attn_bwd");
        assert_true(fwd_passes > 0 && bwd_passes > 0);
        assert_int_equal(count_steps(&p, "attn_fwd"), fwd_passes);
        /* with documents */
        assert_int_equal(count_steps(&d, "attn_fwd") + count_steps(&d, "attn_bwd"), 0);
        assert_int_equal(count_steps(&d, "attn_merge_init"), fwd_passes);
        assert_int_equal(d.nsteps, p.nsteps + 3 * fwd_passes + 8 * bwd_passes);
        int step0[2] = {0}, causal = 0;
        for (int i = 0; i < d.nsteps; i++) {
            const cp_step *st = &d.steps[i];
            const bool fwd = !strcmp(st->what, "attn_fwd_half");
            if (!fwd && strcmp(st->what, "attn_bwd_half")) continue;
            const cp_kernel_spec *k = &d.modules[st->module];
            assert_string_equal(cp_kspec_get(k, "DOCS"), "1");
            assert_int_equal(atoll(cp_kspec_get(k, "SEQ")), d.group_tokens / 2);
            assert_int_equal(atoll(cp_kspec_get(k, "LSE_STRIDE")), d.group_tokens);
            assert_true(!strcmp(d.bufs[st->ops[st->nops - 2].buf].name, "doc_start") &&
                        !strcmp(d.bufs[st->ops[st->nops - 1].buf].name, "doc_end"));
            const bool c = !strcmp(cp_kspec_get(k, "CAUSAL"), "1");
            assert_int_equal(c, st->ring_step == 0 && st->ring_part < 2);
            causal += c;
            if (st->ring_step == 0) step0[!fwd]++;
        }
        assert_int_equal(step0[0], 3 * fwd_passes);
        assert_int_equal(step0[1], 3 * bwd_passes);
        assert_int_equal(causal, 2 * (fwd_passes + bwd_passes));
        /* the memory a ring's documents add: the bounds alone (the causal half module's dQ workspace is the
         * maskless one's size) */
        assert_int_equal(buf(&d, "dq_half.f32")->bytes, buf(&p, "dq_half.f32")->bytes);
        /* the printed schedule says so: step 0's halves with documents, none without */
        for (int j = 0; j < 2; j++) {
            char *text = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&text, &len);
            assert_non_null(f);
            cp_plan_print(j ? &d : &p, f, false);
            cp_plan_print_json(j ? &d : &p, f);
            assert_int_equal(fclose(f), 0);
            assert_int_equal(strstr(text, "0: q0k0c q1k1c q1k0") != NULL, j);
            const char *json = "{\"source\": 0, \"causal\": true, \"halves\": [[0, 0], [1, 1], [1, 0]]}";
            assert_int_equal(strstr(text, json) != NULL, j);
            free(text);
        }
        printf("  tiny %s %s %s: %d steps, %d with documents\n", rings[r].sets[0], rings[r].sets[1],
               rings[r].sets[2], p.nsteps, d.nsteps);
        cp_plan_free(&p);
        cp_plan_free(&d);
    }
}

/* Plan p's --json into path, and the Python expression `check` (the JSON as d) must hold of it */
static void json_holds(const cp_plan *p, const char *path, const char *check) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    cp_plan_print_json(p, f);
    fclose(f);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); %s' %s", check, path);
    assert_int_equal(system(cmd), 0);
}

static void test_json_parses(void **state) {
    (void)state;
    cp_spec s;
    load("llama3b", &s, 1, "parallel.gpus=2");
    cp_plan p;
    build(&s, &p);
    char path[] = "/tmp/cpgen_plan_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    char check[1024];
    snprintf(check, sizeof check,
             "assert d[\"parallel\"][\"gpus\"]==2 and d[\"memory\"][\"gpu_arena\"]>0 and len(d[\"stages\"])==%d",
             p.nstages);
    json_holds(&p, path, check);
    cp_plan_free(&p);
    /* FP8 with row scales on one GPU: the weights' copies kept, and how many bytes */
    load("llama3b", &s, 4, "parallel.gpus=1", "train.seq_len=32K", "train.precision=fp8", "train.fp8_scaling=row");
    build(&s, &p);
    snprintf(check, sizeof check,
             "w=d[\"fp8_weights_once\"]; assert d[\"precision\"]==\"fp8\" and w[\"kept\"] is True and "
             "w[\"bytes\"]==%lld",
             (long long)p.fp8_weights_bytes);
    assert_true(p.fp8_weights_once && p.fp8_weights_bytes > 0);
    json_holds(&p, path, check);
    cp_plan_free(&p);
    /* a ring's schedule and terms: position 1 (chunks 1 and 6) takes block 0 through query halves 1 and 0 against key
     * half 0; the ring's buffers in the memory table */
    load_ring_8m(&s, NULL);
    build(&s, &p);
    json_holds(&p, path,
               "r=d[\"ring\"]; "
               "assert r[\"positions\"]==4 and r[\"group_tokens\"]==2097152 and r[\"chunk_tokens\"]==1048576; "
               "assert r[\"schedule\"][1][0]=={\"source\":1,\"causal\":True}; "
               "assert r[\"schedule\"][1][1]=={\"source\":0,\"halves\":[[1,0],[0,0]]}; "
               "assert r[\"schedule\"][0][1]=={\"source\":3,\"halves\":[[1,0],[1,1]]}; "
               "assert r[\"per_stage\"][\"bwd_sent\"]==11*2**30 and d[\"memory\"][\"gpu\"][\"ring\"]==10208968704; "
               "assert d[\"groups\"][\"world\"]==32");
    unlink(path);
    cp_plan_free(&p);
}

#define assert_near(a, b, tol) assert_true(fabs((double)(a) - (double)(b)) <= (tol))
/* Packed documents: the predicted attention follows the documents' expected length (data.doc_len), memory does not.
 * 131072 tokens of 8192-token documents in tiles of 128 x 128: query tile q computes (q mod 64) + 1 key tiles
 * instead of q + 1, so 16 x 2080 of 1024 x 1025 / 2 tiles, 13/205. */
static void test_document_work(void **state) {
    (void)state;
    assert_near(cp_doc_tile_work_uniform(131072, 8192, 128, 128, NULL), 13.0 / 205.0, 1e-15);
    double kept;
    assert_near(cp_doc_tile_work_uniform(131072, 131072, 128, 128, &kept), 1.0, 0);
    assert_near(kept, 1.0, 0);
    assert_near(cp_doc_tile_work_uniform(1000, 1, 128, 128, &kept), 8.0 / 36.0, 1e-15); /* the diagonal */
    assert_near(kept, 1000.0 / (1000.0 * 1001.0 / 2), 1e-15);
    cp_plan p[3];
    char err[CP_ERR_MAX];
    const char *sets[3][4] = {{"train.seq_len=128K", "data.source=synthetic:packed", "data.documents=stream",
                               "data.positions=sequence"},
                              {"train.seq_len=128K", "data.source=synthetic:packed", "data.doc_len=8K", ""},
                              {"train.seq_len=128K", "data.source=synthetic:packed", "data.documents=mask", ""}};
    for (int i = 0; i < 3; i++) {
        cp_spec s;
        if (cp_spec_load("llama3b", sets[i], i == 0 ? 4 : 3, &s, err, sizeof err)) fail_msg("%s", err);
        if (s.data.documents == CP_DOCS_AUTO) s.data.documents = CP_DOCS_MASK; /* what the command line resolves */
        if (cp_plan_build(&s, &p[i], err, sizeof err)) fail_msg("%s", err);
    }
    assert_false(p[0].docs);
    assert_true(p[1].docs && p[2].docs);
    assert_near(p[1].attn_work, 13.0 / 205.0, 1e-15);
    assert_near(p[2].attn_work, 1.0, 0); /* no length given: one document, the most work */
    /* the kernels' flops scale exactly; their time too but for the fixed costs and the dQ conversion */
    assert_near(p[1].flops_attn / p[0].flops_attn, 13.0 / 205.0, 1e-12);
    assert_true(p[1].t_attn < 0.07 * p[0].t_attn);
    assert_near(p[2].t_attn, p[0].t_attn, 1e-9 * p[0].t_attn);
    assert_true(p[1].gpu_peak >= p[0].gpu_peak && p[1].gpu_peak == p[2].gpu_peak); /* the documents' arrays */
    for (int i = 0; i < 3; i++) cp_plan_free(&p[i]);
}

int main(int argc, char **argv) {
    (void)argc;
    go_to_source_tree(argv[0], "tests/specs_bad"); /* the cpgen binary is build/cpgen from there */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_arithmetic),
        cmocka_unit_test(test_upipe_auto),
        cmocka_unit_test(test_checkpoint_every),
        cmocka_unit_test(test_grad_accum),  cmocka_unit_test(test_8b_arithmetic), cmocka_unit_test(test_fp8),
        cmocka_unit_test(test_fp8_block),
        cmocka_unit_test(test_fp8_row),
        cmocka_unit_test(test_fp8_weights_once),
        cmocka_unit_test(test_fp8_copies_of_whole_outputs),
        cmocka_unit_test(test_kept_attention_3b), cmocka_unit_test(test_kept_attention_3b_longest),
        cmocka_unit_test(test_mlp_tile_auto),
        cmocka_unit_test(test_fp8_gemm_kernel),
        cmocka_unit_test(test_kept_attention_memory),
        cmocka_unit_test(test_dq_order),
        cmocka_unit_test(test_stage_tables),     cmocka_unit_test(test_stage_table_3b),
        cmocka_unit_test(test_arena_property),   cmocka_unit_test(test_every_shipped_spec_plans),
        cmocka_unit_test(test_folded_matches_flat), cmocka_unit_test(test_quick_fit_agrees),
        cmocka_unit_test(test_refuses_when_too_small), cmocka_unit_test(test_ranks_per_gpu),
        cmocka_unit_test(test_host_memory), cmocka_unit_test(test_ckpt_snapshot), cmocka_unit_test(test_max_seq),
        cmocka_unit_test(test_max_seq_none_fits), cmocka_unit_test(test_json_parses),
        cmocka_unit_test(test_replicas),     cmocka_unit_test(test_ring_8b_arithmetic),
        cmocka_unit_test(test_ring_stage_tables), cmocka_unit_test(test_ring_rope_runs),
        cmocka_unit_test(test_ring_max_seq), cmocka_unit_test(test_ring_refusals),
        cmocka_unit_test(test_document_work), cmocka_unit_test(test_ring_documents_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
