/* test_spec.c: spec loading: the shipped specs and their parameter counts, lengths, --set overrides, inheritance
 * (dofile, cpgen.load, cpgen.extend), defaults, the UPipe stage choice, cp_spec_check, the time and memory limits
 * inside library calls, and every bad spec in tests/specs_bad/ (each file names the message fragments it must
 * produce). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "source_tree.h"
#include "spec.h"
#include "spec_write.h"
#include "tmpdir.h"
#include "util.h"

#define BAD_DIR "tests/specs_bad"

static cp_spec spec;
static char err[CP_ERR_MAX];

static void load_ok(const char *path, const char *const *sets, int nsets) {
    int rc = cp_spec_load(path, sets, nsets, &spec, err, sizeof err);
    if (rc != 0) fail_msg("loading %s failed: %s", path, err);
}

static int load_bad(const char *path, const char *const *sets, int nsets) {
    err[0] = 0;
    return cp_spec_load(path, sets, nsets, &spec, err, sizeof err);
}

static void assert_contains(const char *text, const char *fragment) {
    if (!strstr(text, fragment)) fail_msg("expected \"%s\" in: %s", fragment, text);
}

/* ------------------------------------------------------------------------------------------------------------ */

static void test_llama1b(void **state) {
    (void)state;
    load_ok("llama1b", NULL, 0);
    const cp_model *m = &spec.model;
    assert_int_equal(m->family, CP_FAMILY_LLAMA);
    assert_int_equal(m->vocab, 128256);
    assert_int_equal(m->hidden, 2048);
    assert_int_equal(m->layers, 16);
    assert_int_equal(m->heads, 32);
    assert_int_equal(m->kv_heads, 8);
    assert_int_equal(m->head_dim, 64);
    assert_int_equal(m->ffn, 8192);
    assert_true(m->tie_embeddings);
    assert_false(m->qk_norm);
    assert_true(m->rope_scaling.enabled);
    assert_true(m->rope_scaling.factor == 32);
    assert_int_equal(m->rope_scaling.original_max, 8192);
    assert_int_equal(cp_model_params(m), 1235814400LL);
    assert_string_equal(spec.path, "<embedded>/llama1b.lua");
    assert_string_equal(spec.name, "llama1b");
}

static void test_llama3b(void **state) {
    (void)state;
    load_ok("llama3b", NULL, 0);
    const cp_model *m = &spec.model;
    assert_int_equal(m->hidden, 3072);
    assert_int_equal(m->layers, 28);
    assert_int_equal(m->heads, 24);
    assert_int_equal(m->kv_heads, 8);
    assert_int_equal(m->head_dim, 128);
    assert_true(m->tie_embeddings);
    assert_true(m->rope_scaling.factor == 32);
    assert_int_equal(cp_model_params(m), 3212749824LL);
}

static void test_llama8b(void **state) {
    (void)state;
    load_ok("specs/llama8b.lua", NULL, 0);
    const cp_model *m = &spec.model;
    assert_int_equal(m->vocab, 128256);
    assert_int_equal(m->hidden, 4096);
    assert_int_equal(m->layers, 32);
    assert_int_equal(m->ffn, 14336);
    assert_false(m->tie_embeddings);
    assert_true(m->rope_theta == 500000);
    assert_true(m->rope_scaling.enabled);
    assert_true(m->rope_scaling.factor == 8);
    assert_true(m->rope_scaling.low_freq == 1);
    assert_true(m->rope_scaling.high_freq == 4);
    assert_true(m->norm_eps == 1e-5);
    /* One layer: q 16.8M + k,v 8.4M + o 16.8M + MLP 176.2M + 2 norms. */
    assert_int_equal(cp_model_layer_params(m), 218112000LL);
    assert_int_equal(cp_model_params(m), 8030261248LL);
    /* the GPUs at hand: without a GPU counter (cpgen's asks a launcher or CUDA), one */
    assert_true(spec.parallel.gpus_auto);
    assert_int_equal(spec.parallel.gpus, 1);
    assert_string_equal(spec.parallel.gpus_found, "1 GPU (nothing counted them)");
    assert_int_equal(spec.parallel.upipe_heads, 8);
    assert_int_equal(spec.train.seq_len, 1048576);
    const char *eight[] = {"parallel.gpus=8"};
    load_ok("specs/llama8b.lua", eight, 1);
    assert_false(spec.parallel.gpus_auto);
    assert_int_equal(spec.parallel.gpus, 8);
    assert_string_equal(spec.train.out_dir, "runs/llama8b");
}

static void test_qwen32b(void **state) {
    (void)state;
    load_ok("qwen32b", NULL, 0);
    const cp_model *m = &spec.model;
    assert_int_equal(m->family, CP_FAMILY_QWEN3);
    assert_int_equal(m->vocab, 151936);
    assert_int_equal(m->hidden, 5120);
    assert_int_equal(m->layers, 64);
    assert_int_equal(m->heads, 64);
    assert_int_equal(m->kv_heads, 8);
    assert_int_equal(m->head_dim, 128); /* q projects 5120 -> 8192 */
    assert_int_equal(m->ffn, 25600);
    assert_true(m->qk_norm);
    assert_false(m->tie_embeddings);
    assert_false(m->rope_scaling.enabled);
    assert_true(m->rope_theta == 1e6);
    assert_true(m->norm_eps == 1e-6);
    assert_int_equal(cp_model_params(m), 32762123264LL);
}

static void test_tiny(void **state) {
    (void)state;
    load_ok("tiny", NULL, 0);
    const cp_model *m = &spec.model;
    assert_int_equal(m->vocab, 512);
    assert_int_equal(m->hidden, 256);
    assert_int_equal(m->layers, 2);
    assert_int_equal(m->heads, 4);
    assert_int_equal(m->kv_heads, 2);
    assert_int_equal(m->head_dim, 64);
    assert_int_equal(m->ffn, 768);
    assert_false(m->tie_embeddings);
    assert_int_equal(spec.parallel.gpus, 1);
    assert_int_equal(spec.train.steps, 800);
    assert_int_equal(spec.train.micro_batches, 8);
    assert_true(spec.train.lr == 3e-3);
    assert_int_equal(spec.train.warmup, 50);
    assert_string_equal(spec.data.source, "synthetic:copy");
    /* The file and the embedded copy are the same spec. */
    cp_spec embedded = spec;
    load_ok("specs/tiny.lua", NULL, 0);
    assert_string_equal(spec.path, "specs/tiny.lua");
    assert_int_equal(cp_model_params(&spec.model), cp_model_params(&embedded.model));
    assert_int_equal(spec.train.seq_len, embedded.train.seq_len);
}

static void test_every_shipped_spec_loads(void **state) {
    (void)state;
    const char *names[] = {"tiny", "llama1b", "llama3b", "llama8b", "qwen32b"};
    for (size_t i = 0; i < CP_ARRAY_LEN(names); i++) {
        char path[64];
        snprintf(path, sizeof path, "specs/%s.lua", names[i]);
        load_ok(path, NULL, 0);
        assert_string_equal(spec.name, names[i]);
        assert_int_equal(cp_spec_check(&spec, err, sizeof err), 0);
        /* Every shipped spec begins with a header comment naming itself. */
        size_t len;
        char *text = cp_read_file(path, &len);
        assert_non_null(text);
        char head[80];
        snprintf(head, sizeof head, "-- specs/%s.lua: ", names[i]);
        assert_true(strncmp(text, head, strlen(head)) == 0);
        free(text);
    }
}

static void test_lengths(void **state) {
    (void)state;
    int64_t v;
    assert_true(cp_parse_length("128K", &v));
    assert_int_equal(v, 131072);
    assert_true(cp_parse_length("1M", &v));
    assert_int_equal(v, 1048576);
    assert_true(cp_parse_length("5M", &v));
    assert_int_equal(v, 5242880);
    assert_true(cp_parse_length("4096", &v));
    assert_int_equal(v, 4096);
    assert_false(cp_parse_length("1Q", &v));
    assert_true(cp_parse_bytes("141G", &v));
    assert_int_equal(v, 141LL << 30);
    assert_true(cp_parse_bytes("80GiB", &v));
    assert_int_equal(v, 80LL << 30);

    const char *s = "return { model = { vocab = 512, hidden = 256, layers = 1, heads = 4, ffn = 768,\n"
                    "  rope = { scaling = { factor = 8, original_max = \"8K\" } } },\n"
                    "  parallel = { gpus = 2, mlp_tile = \"64K\", loss_tile = 32768 },\n"
                    "  train = { seq_len = \"128K\" }, machine = { gpu_mem = \"80GiB\", host_mem = \"1T\" } }\n";
    assert_int_equal(cp_spec_load_string("lengths.lua", s, NULL, 0, &spec, err, sizeof err), 0);
    assert_int_equal(spec.train.seq_len, 131072);
    assert_int_equal(spec.parallel.mlp_tile, 65536);
    assert_int_equal(spec.parallel.loss_tile, 32768);
    assert_int_equal(spec.model.rope_scaling.original_max, 8192);
    assert_int_equal(spec.machine.gpu_mem, 80LL << 30);
    assert_int_equal(spec.machine.host_mem, 1LL << 40);

    const char *sets[] = {"train.seq_len=5M", "parallel.gpus=1"};
    load_ok("tiny", sets, 2);
    assert_int_equal(spec.train.seq_len, 5242880);
}

static void test_defaults(void **state) {
    (void)state;
    const char *s = "return { model = { vocab = 1024, hidden = 512, layers = 2, heads = 8, ffn = 1536 },\n"
                    "         train = { seq_len = 4096, lr = 1e-3 } }\n";
    assert_int_equal(cp_spec_load_string("examples/minimal.lua", s, NULL, 0, &spec, err, sizeof err), 0);
    assert_string_equal(spec.path, "examples/minimal.lua");
    assert_string_equal(spec.name, "minimal");
    const cp_model *m = &spec.model;
    assert_int_equal(m->family, CP_FAMILY_LLAMA);
    assert_int_equal(m->kv_heads, 8);
    assert_int_equal(m->head_dim, 64);
    assert_false(m->qk_norm);
    assert_false(m->tie_embeddings);
    assert_true(m->norm_eps == 1e-5);
    assert_true(m->rope_theta == 500000);
    assert_false(m->rope_scaling.enabled);
    assert_int_equal(spec.parallel.gpus, 1);
    assert_int_equal(spec.parallel.checkpoint, CP_CKPT_LAYER);
    assert_int_equal(spec.parallel.offload, CP_OFFLOAD_AUTO);
    assert_int_equal(spec.parallel.optimizer, CP_OPT_AUTO);
    assert_int_equal(spec.parallel.mlp_tile, 0);
    assert_int_equal(spec.parallel.loss_tile, 0);
    assert_int_equal(spec.train.micro_batches, 1);
    assert_true(spec.train.min_lr == 1e-4);
    assert_true(spec.train.beta1 == 0.9);
    assert_true(spec.train.beta2 == 0.95);
    assert_true(spec.train.eps == 1e-8);
    assert_int_equal(spec.train.log_every, 1);
    assert_int_equal(spec.train.save_every, 0);
    assert_int_equal(spec.train.keep_checkpoints, 0); /* every checkpoint kept */
    assert_true(spec.train.async_save);
    assert_string_equal(spec.train.out_dir, "runs/minimal");
    assert_string_equal(spec.data.source, "synthetic:recall");
    assert_int_equal(spec.init.from, CP_INIT_RANDOM);
    assert_true(spec.init.std == 0.02);
    assert_int_equal(spec.machine.gpu_mem, 143150LL << 20);
    assert_int_equal(spec.machine.host_mem, 128LL << 30);
    assert_int_equal(spec.machine.reserve, 560LL << 20);
    assert_int_equal(spec.machine.host_runtime, 320LL << 20);
    assert_true(spec.machine.gemm_tflops == 730 && spec.machine.peak_tflops == 790);
    assert_true(spec.machine.attn_fwd_tflops == 650 && spec.machine.attn_bwd_tflops == 535);
    assert_true(spec.machine.attn_fwd_tflops_d64 == 518 && spec.machine.attn_bwd_tflops_d64 == 405);
    assert_true(cp_machine_attn_tflops(&spec.machine, true, 64) == 405);
    assert_true(cp_machine_attn_tflops(&spec.machine, false, 128) == 650);
    assert_true(spec.machine.hbm_gbps == 4300);
    assert_true(spec.train.deterministic); /* dQ summed in key-block order unless asked otherwise */
    assert_true(spec.machine.host_gbps == 55);
    assert_true(spec.machine.a2a_gbps == 328);
    assert_true(spec.machine.allgather_gbps == 278);

    /* Qwen3 defaults differ: qk_norm on, norm_eps 1e-6, theta 1e6; head_dim need not be hidden/heads. */
    s = "return { model = { family = 'qwen3', vocab = 1024, hidden = 640, layers = 2, heads = 8, kv_heads = 2,\n"
        "  head_dim = 128, ffn = 1536 }, train = { seq_len = 4096 } }\n";
    assert_int_equal(cp_spec_load_string("q.lua", s, NULL, 0, &spec, err, sizeof err), 0);
    assert_true(spec.model.qk_norm);
    assert_true(spec.model.norm_eps == 1e-6);
    assert_true(spec.model.rope_theta == 1e6);
    assert_int_equal(spec.model.head_dim, 128);
    /* q 640*1024, k,v 640*256 each, o 1024*640, MLP 3*640*1536, norms 2*640 + qk 2*128. */
    assert_int_equal(cp_model_layer_params(&spec.model),
                     640 * 1024 + 2 * 640 * 256 + 1024 * 640 + 3 * 640 * 1536 + 2 * 640 + 2 * 128);
}

static void test_set_overrides(void **state) {
    (void)state;
    const char *sets[] = {"train.seq_len=1M",
                          "train.lr=1e-3",
                          "model.tie_embeddings=true",
                          "parallel.upipe_heads=4",
                          "data.source=tokens:/data/shards/*.bin",
                          "train.out_dir=runs/x=y",
                          "parallel.offload=all",
                          "parallel.mlp_tile=16K",
                          "machine.gpu_mem=80G",
                          "model.rope.theta=1e6"};
    load_ok("tiny", sets, (int)CP_ARRAY_LEN(sets));
    assert_int_equal(spec.train.seq_len, 1048576);
    assert_true(spec.train.lr == 1e-3);
    assert_true(spec.train.min_lr == 1e-4); /* the default follows the overridden lr */
    assert_true(spec.model.tie_embeddings);
    assert_int_equal(spec.parallel.upipe_heads, 4);
    assert_string_equal(spec.data.source, "tokens:/data/shards/*.bin");
    assert_string_equal(spec.train.out_dir, "runs/x=y");
    assert_int_equal(spec.parallel.offload, CP_OFFLOAD_ALL);
    assert_int_equal(spec.parallel.mlp_tile, 16384);
    assert_int_equal(spec.machine.gpu_mem, 80LL << 30);
    assert_true(spec.model.rope_theta == 1e6);

    /* --set creates missing tables: this turns on rope scaling with the Llama-3 defaults. */
    const char *scale[] = {"model.rope.scaling.factor=8"};
    load_ok("tiny", scale, 1);
    assert_true(spec.model.rope_scaling.enabled);
    assert_true(spec.model.rope_scaling.factor == 8);
    assert_true(spec.model.rope_scaling.low_freq == 1);
    assert_true(spec.model.rope_scaling.high_freq == 4);
    assert_int_equal(spec.model.rope_scaling.original_max, 8192);

    /* ...and false turns it off again. */
    const char *off[] = {"model.rope.scaling=false"};
    load_ok("llama8b", off, 1);
    assert_false(spec.model.rope_scaling.enabled);

    /* "auto" stays a string and resolves to the smallest valid stage. */
    const char *autou[] = {"parallel.upipe_heads=auto", "parallel.gpus=2", "train.seq_len=1M"};
    load_ok("llama8b", autou, 3);
    assert_int_equal(spec.parallel.upipe_heads, 2);
}

/* Every rate and fixed cost of the machine (cp_machine_nums, the one list the reading, the checks and the writing go
 * through): --set reads it into its field; a written spec carries it where it should (the network's only for several
 * groups) and reads back to the same value; a rate of 0 and a negative fixed cost are refused with the key's path. */
static void test_machine_numbers(void **state) {
    (void)state;
    for (size_t i = 0; i < cp_machine_nnums; i++) {
        const cp_machine_num *k = &cp_machine_nums[i];
        char set[96], line[96], path[64];
        snprintf(set, sizeof set, "machine.%s=7.5", k->key);
        const char *sets[] = {set};
        load_ok("tiny", sets, 1);
        const double v = cp_machine_num_of(&spec.machine, k);
        if (v != 7.5) fail_msg("%s read as %g", set, v);
        cp_str text = {0};
        cp_spec_write_lua(&spec, &text);
        snprintf(line, sizeof line, "%s = 7.5", k->key);
        const bool written = strstr(text.data, line) != NULL;
        if (written != (k->write != CP_MACHINE_WRITE_GROUPS))
            fail_msg("%s: written %d in:\n%s", k->key, written, text.data);
        cp_spec b;
        if (cp_spec_load_string("resolved.lua", text.data, NULL, 0, &b, err, sizeof err)) fail_msg("%s", err);
        assert_true(!written || cp_machine_num_of(&b.machine, k) == 7.5);
        cp_str_free(&text);
        snprintf(set, sizeof set, "machine.%s=%s", k->key, k->fixed_cost ? "-1" : "0");
        snprintf(path, sizeof path, "machine.%s", k->key);
        assert_int_equal(load_bad("tiny", sets, 1), -1);
        assert_contains(err, path);
    }
}

static void test_inheritance(void **state) {
    (void)state;
    load_ok("examples/llama8b_2layers.lua", NULL, 0);
    assert_int_equal(spec.model.layers, 2);
    assert_int_equal(spec.model.hidden, 4096);
    assert_int_equal(spec.model.vocab, 128256);
    assert_int_equal(spec.train.seq_len, 1048576);
    assert_int_equal(spec.train.steps, 2);
    assert_string_equal(spec.name, "llama8b_2layers");
    assert_string_equal(spec.train.out_dir, "runs/llama8b_2layers");
    cp_model full = spec.model;
    full.layers = 32;
    assert_int_equal(cp_model_params(&full), 8030261248LL);

    load_ok("tests/specs_ok/child.lua", NULL, 0);
    assert_int_equal(spec.model.layers, 6);
    assert_int_equal(spec.model.hidden, 512);
    assert_int_equal(spec.train.seq_len, 16384);
    assert_int_equal(spec.train.steps, 30);
    assert_int_equal(spec.parallel.gpus, 2);

    load_ok("tests/specs_ok/sub/grandchild.lua", NULL, 0);
    assert_int_equal(spec.model.layers, 6);
    assert_int_equal(spec.parallel.upipe_heads, 4);

    load_ok("tests/specs_ok/computed.lua", NULL, 0);
    assert_int_equal(spec.model.hidden, 384);
    assert_int_equal(spec.model.heads, 6);
    assert_int_equal(spec.model.ffn, 1024);
    assert_int_equal(spec.model.layers, 3);
    assert_int_equal(spec.train.seq_len, 3072);
    assert_int_equal(spec.model.vocab, 512); /* from tiny */

    /* From text in memory, shipped specs are reachable by name, by path and through dofile. */
    const char *s = "local a = cpgen.load('llama3b')\n"
                    "local b = dofile('specs/llama3b.lua')\n"
                    "assert(a.model.hidden == b.model.hidden)\n"
                    "return cpgen.extend(a, { model = { layers = 1 } })\n";
    assert_int_equal(cp_spec_load_string("/nowhere/x.lua", s, NULL, 0, &spec, err, sizeof err), 0);
    assert_int_equal(spec.model.layers, 1);
    assert_int_equal(spec.model.hidden, 3072);
}

/* The smallest valid UPipe stage for a few head layouts. */
static void test_upipe_auto(void **state) {
    (void)state;
    struct {
        int heads, kv, gpus, want;
    } cases[] = {
        /* clang-format off */
        {32, 8, 1, 1},  /* g = 4, u = 1 divides it */
        {32, 8, 8, 8},  /* one head per GPU per stage */
        {32, 8, 2, 2},
        {64, 8, 8, 8},
        {24, 8, 2, 2},
        {4, 2, 4, 4},   /* KV heads replicated on 2 GPUs each */
        {8, 1, 4, 4},
        {12, 2, 4, 4},  /* g = 6 */
        /* clang-format on */
    };
    for (size_t i = 0; i < CP_ARRAY_LEN(cases); i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "return { model = { vocab = 512, hidden = %d, layers = 1, heads = %d, kv_heads = %d, ffn = 512 },"
                 " parallel = { gpus = %d }, train = { seq_len = 8192 } }",
                 cases[i].heads * 64, cases[i].heads, cases[i].kv, cases[i].gpus);
        if (cp_spec_load_string("u.lua", text, NULL, 0, &spec, err, sizeof err) != 0) fail_msg("case %zu: %s", i, err);
        if (spec.parallel.upipe_heads != cases[i].want)
            fail_msg("case %zu: U = %d, want %d", i, spec.parallel.upipe_heads, cases[i].want);
    }
}

static void test_check(void **state) {
    (void)state;
    const char *eight[] = {"parallel.gpus=8"};
    load_ok("llama8b", eight, 1);
    cp_spec s = spec;
    assert_int_equal(cp_spec_check(&s, err, sizeof err), 0);
    s.train.seq_len = 4 * 1048576;
    assert_int_equal(cp_spec_check(&s, err, sizeof err), 0);
    s.train.seq_len = 1000001;
    assert_int_equal(cp_spec_check(&s, err, sizeof err), -1);
    assert_contains(err, "<embedded>/llama8b.lua: train.seq_len = 1000001");
    assert_contains(err, "multiple of gpus (8)");
    s = spec;
    s.parallel.mlp_tile = 3000;
    assert_int_equal(cp_spec_check(&s, err, sizeof err), -1);
    assert_contains(err, "parallel.mlp_tile = 3000");
    s = spec;
    s.parallel.upipe_heads = 12;
    assert_int_equal(cp_spec_check(&s, err, sizeof err), -1);
    assert_contains(err, "parallel.upipe_heads = 12");
    assert_contains(err, "8, 16 or 32");
    /* cp_spec_check leaves its argument alone. */
    s = spec;
    s.parallel.upipe_heads = 0;
    assert_int_equal(cp_spec_check(&s, err, sizeof err), 0);
    assert_int_equal(s.parallel.upipe_heads, 0);
}

/* replicas and ring: default 1, read back, and parallel.gpus = "auto" shared out per group of the counted GPUs. */
static int count_sixteen(char *found, int len) {
    snprintf(found, (size_t)len, "16 GPUs, the world size srun started");
    return 16;
}

static void test_replicas_ring(void **state) {
    (void)state;
    load_ok("llama8b", NULL, 0);
    assert_int_equal(spec.parallel.replicas, 1);
    assert_int_equal(spec.parallel.ring, 1);
    const char *sets[] = {"parallel.gpus=8", "parallel.replicas=2", "parallel.ring=4", "train.seq_len=8M"};
    load_ok("llama8b", sets, 4);
    assert_int_equal(spec.parallel.gpus, 8);
    assert_int_equal(spec.parallel.replicas, 2);
    assert_int_equal(spec.parallel.ring, 4);
    cp_spec_set_gpu_counter(count_sixteen);
    const char *autos[] = {"parallel.gpus=auto", "parallel.ring=2"};
    load_ok("llama8b", autos, 2);
    assert_int_equal(spec.parallel.gpus, 8); /* 16 counted, 2 groups */
    const char *uneven[] = {"parallel.gpus=auto", "parallel.replicas=3"};
    assert_int_equal(load_bad("llama8b", uneven, 2), -1);
    assert_contains(err, "parallel.gpus = \"auto\" found 16 GPUs, the world size srun started");
    assert_contains(err, "replicas (3) x ring (1) = 3 groups cannot share equally");
    assert_contains(err, "(from --set parallel.gpus=auto)");
    cp_spec_set_gpu_counter(NULL);
    /* cp_spec_check sees a ring changed in C */
    load_ok("llama8b", sets, 4);
    cp_spec s = spec;
    s.train.seq_len = 8 * 1048576 + 32;
    assert_int_equal(cp_spec_check(&s, err, sizeof err), -1);
    assert_contains(err, "train.seq_len = 8388640: with ring = 4");
    assert_contains(err, "multiple of 2 x ring x gpus = 64; use 8388608 or 8388672");
    s = spec;
    s.parallel.replicas = 3000;
    assert_int_equal(cp_spec_check(&s, err, sizeof err), -1);
    assert_contains(err, "parallel.replicas = 3000: replicas x ring x gpus = 3000 x 4 x 8 = 96000 ranks");
}

/* data.val, train.eval_every and train.eval_sequences: their defaults (none; about ten evaluations a run once there
 * is held-out data; one step's sequences, every group's), explicit values kept, "none", the split's fraction, and
 * the resolved spec written back with them (and without them where there is no held-out data). */
static void test_eval_keys(void **state) {
    (void)state;
    load_ok("tiny", NULL, 0);
    assert_string_equal(spec.data.val, "");
    assert_int_equal(spec.train.eval_every, 0);
    assert_int_equal(spec.train.eval_sequences, 8); /* tiny's 8 micro-batches */
    const char *copy[] = {"data.val=synthetic:copy"};
    load_ok("tiny", copy, 1);
    assert_string_equal(spec.data.val, "synthetic:copy");
    assert_int_equal(spec.train.eval_every, 80); /* tiny's 800 steps / 10 */
    assert_int_equal(spec.train.eval_sequences, 8);
    const char *short_run[] = {"data.val=synthetic:recall", "train.steps=5", "train.warmup=0"};
    load_ok("tiny", short_run, 3);
    assert_int_equal(spec.train.eval_every, 1); /* at least 1 */
    const char *replicas[] = {"data.val=synthetic:copy", "parallel.replicas=2", "train.micro_batches=3",
                              "train.eval_every=7"};
    load_ok("tiny", replicas, 4);
    assert_int_equal(spec.train.eval_sequences, 6); /* 3 micro-batches x 2 groups */
    assert_int_equal(spec.train.eval_every, 7);
    const char *off[] = {"data.val=synthetic:copy", "train.eval_every=0", "train.eval_sequences=3"};
    load_ok("tiny", off, 3);
    assert_int_equal(spec.train.eval_every, 0); /* held-out data kept, never evaluated */
    assert_int_equal(spec.train.eval_sequences, 3);
    const char *none[] = {"data.val=none"};
    load_ok("tiny", none, 1);
    assert_string_equal(spec.data.val, "");
    assert_int_equal(spec.train.eval_every, 0);
    const char *split[] = {"data.source=tokens:d/*.bin", "data.val=split:0.05", "train.eval_every=25"};
    load_ok("tiny", split, 3);
    assert_string_equal(spec.data.val, "split:0.05");
    assert_int_equal(spec.train.eval_every, 25);
    const char *held[] = {"data.source=tokens:d/*.bin", "data.val=tokens:v/*.bin"};
    load_ok("tiny", held, 2);
    assert_int_equal(spec.train.eval_every, 80);

    /* the fraction: a plain decimal strictly between 0 and 1 */
    double f;
    assert_true(cp_val_split("split:0.05", &f) && f == 0.05);
    assert_true(cp_val_split("split:1e-3", &f) && f == 1e-3);
    assert_true(cp_val_split("split:.5", &f) && f == 0.5);
    const char *bad[] = {"split:0", "split:1", "split:-0.1", "split:1.5", "split:", "split:nan", "split:inf",
                         "split:0x0.8", "split:0.1x", "split: 0.1", "tokens:x", "", "split"};
    for (size_t i = 0; i < CP_ARRAY_LEN(bad); i++)
        if (cp_val_split(bad[i], &f) || !isnan(f)) fail_msg("\"%s\" was taken for a split", bad[i]);

    /* cp_spec_check sees a replica count changed in C that the sequences no longer divide among */
    load_ok("tiny", copy, 1);
    cp_spec s = spec;
    assert_int_equal(cp_spec_check(&s, err, sizeof err), 0);
    s.parallel.replicas = 3;
    assert_int_equal(cp_spec_check(&s, err, sizeof err), -1);
    assert_contains(err, "train.eval_sequences = 8: the 3 replica groups evaluate equal shares");
    s = spec;
    s.train.eval_every = -4;
    assert_int_equal(cp_spec_check(&s, err, sizeof err), -1);
    assert_contains(err, "train.eval_every = -4: must be at least 0");

    /* written back: with held-out data every key, read again to the same spec; without it, none of them */
    const char *written[] = {"data.val=synthetic:copy", "train.eval_every=0", "train.eval_sequences=2"};
    load_ok("tiny", written, 3);
    cp_spec a = spec;
    cp_str text = {0};
    cp_spec_write_lua(&a, &text);
    assert_contains(text.data, "val = \"synthetic:copy\"");
    assert_contains(text.data, "eval_every = 0");
    assert_contains(text.data, "eval_sequences = 2");
    cp_spec b;
    if (cp_spec_load_string("resolved.lua", text.data, NULL, 0, &b, err, sizeof err)) fail_msg("%s", err);
    assert_true(cp_spec_same(&a, &b));
    assert_int_equal(b.train.eval_every, 0); /* not the default again: 0 was written */
    cp_str_free(&text);
    load_ok("tiny", NULL, 0);
    cp_spec_write_lua(&spec, &text);
    if (strstr(text.data, "eval_") || strstr(text.data, "val =")) fail_msg("written without held-out data:\n%s", text.data);
    cp_str_free(&text);
}

/* data.documents, positions and eod: AUTO (0) and -1 when not given; the values read; the rules that need no file;
 * written back only where given, and read again to the same spec. (What the shards say: tests/test_data.c.) */
static void test_document_keys(void **state) {
    (void)state;
    load_ok("tiny", NULL, 0);
    assert_int_equal(spec.data.documents, CP_DOCS_AUTO);
    assert_int_equal(spec.data.positions, CP_POS_AUTO);
    assert_int_equal(spec.data.eod, -1);
    cp_str text = {0};
    cp_spec_write_lua(&spec, &text);
    if (strstr(text.data, "documents") || strstr(text.data, "positions") || strstr(text.data, "eod ="))
        fail_msg("written without document keys:\n%s", text.data);
    cp_str_free(&text);
    const char *keys[] = {"data.source=tokens:x/*.bin", "data.documents=mask", "data.positions=sequence",
                          "data.eod=300"};
    load_ok("tiny", keys, 4);
    assert_int_equal(spec.data.documents, CP_DOCS_MASK);
    assert_int_equal(spec.data.positions, CP_POS_SEQUENCE);
    assert_int_equal(spec.data.eod, 300);
    cp_spec a = spec, b;
    cp_spec_write_lua(&a, &text);
    assert_contains(text.data, "documents = \"mask\"");
    assert_contains(text.data, "positions = \"sequence\"");
    assert_contains(text.data, "eod = 300");
    if (cp_spec_load_string("resolved.lua", text.data, NULL, 0, &b, err, sizeof err)) fail_msg("%s", err);
    assert_true(cp_spec_same(&a, &b));
    assert_int_equal(b.data.eod, 300);
    assert_int_equal(b.data.documents, CP_DOCS_MASK);
    cp_str_free(&text);
    const char *stream[] = {"data.source=synthetic:copy", "data.documents=stream"};
    load_ok("tiny", stream, 2);
    assert_int_equal(spec.data.documents, CP_DOCS_STREAM);
    assert_int_equal(spec.data.positions, CP_POS_AUTO);
    /* refused without looking at any file */
    const struct {
        const char *sets[3], *says[2];
    } bad[] = {
        {{"data.documents=masked"}, {"data.documents = \"masked\": not a valid choice; did you mean \"mask\"?",
                                      "(from --set data.documents=masked)"}},
        {{"data.positions=doc"}, {"data.positions = \"doc\"", "did you mean \"document\"?"}},
        {{"data.source=synthetic:copy", "data.documents=mask"},
         {"data.documents = \"mask\": data.source = \"synthetic:copy\" has no document boundaries",
          "or data.documents = \"stream\""}},
        {{"data.source=tokens:x/*.bin", "data.documents=stream", "data.positions=document"},
         {"data.positions = \"document\": positions restart at each document only where attention stays inside "
          "documents", "set data.documents = \"mask\", or data.positions = \"sequence\""}},
        {{"data.source=synthetic:recall", "data.positions=document"},
         {"data.positions = \"document\"", "(data.source has no document boundaries)"}},
        {{"data.source=tokens:x/*.bin", "data.eod=512"},
         {"data.eod = 512: not below model.vocab (512)", "eod_id"}},
        {{"data.source=tokens:x/*.bin", "data.eod=-2"}, {"data.eod = -2: must be a token id, at least 0", NULL}},
        {{"data.source=synthetic:copy", "data.eod=3"},
         {"data.eod = 3: the end-of-document id of tokens: shards", "remove it"}},
        {{"data.source=tokens:x/*.bin", "data.eod=end"}, {"data.eod: expected an integer", NULL}},
    };
    for (size_t k = 0; k < CP_ARRAY_LEN(bad); k++) {
        int n = 0;
        while (n < 3 && bad[k].sets[n]) n++;
        if (load_bad("tiny", bad[k].sets, n) != -1) fail_msg("case %zu loaded", k);
        for (int f = 0; f < 2 && bad[k].says[f]; f++) assert_contains(err, bad[k].says[f]);
        assert_contains(err, "<embedded>/tiny.lua: data.");
    }
    /* data.eod with held-out shards alone is theirs */
    const char *val_eod[] = {"data.source=synthetic:copy", "data.val=tokens:v/*.bin", "data.eod=3"};
    load_ok("tiny", val_eod, 3);
    assert_int_equal(spec.data.eod, 3);
    /* cp_spec_check sees a mode set in C */
    load_ok("tiny", stream, 2);
    cp_spec s = spec;
    s.data.positions = CP_POS_DOCUMENT;
    assert_int_equal(cp_spec_check(&s, err, sizeof err), -1);
    assert_contains(err, "data.positions = \"document\"");
}

/* train.precision: bf16 unless asked; fp8 read, written back and read again the same, with its recipe's keys
 * (train.fp8_format, train.fp8_fast_accum, train.fp8_scaling, train.fp8_weight_grads, train.fp8_input_grads,
 * train.fp8_gemm); a wrong value named with the choices */
static void test_precision_key(void **state) {
    (void)state;
    load_ok("tiny", NULL, 0);
    assert_false(spec.train.fp8);
    assert_true(spec.train.fp8_e4m3_grads && spec.train.fp8_fast_accum == CP_FP8_FAST_FORWARD &&
                spec.train.fp8_scaling == CP_FP8_SCALING_BLOCK && spec.train.fp8_bf16_wgrad &&
                spec.train.fp8_gemm == CP_FP8_GEMM_AUTO);
    const char *tensor[] = {"train.fp8_scaling=tensor"}; /* E5M2 gradients by default with one scale per tensor */
    load_ok("tiny", tensor, 1);
    assert_true(!spec.train.fp8_e4m3_grads && spec.train.fp8_scaling == CP_FP8_SCALING_TENSOR);
    assert_true(spec.machine.fp8_gemm_tflops > spec.machine.gemm_tflops);
    const char *row[] = {"train.fp8_scaling=row"}; /* E4M3 throughout by default, as with block scales */
    load_ok("tiny", row, 1);
    assert_true(spec.train.fp8_e4m3_grads && spec.train.fp8_scaling == CP_FP8_SCALING_ROW);
    /* fast accumulation by name, and by the booleans it took before "dx"; never the weights' gradients ("all") */
    const char *fast_names[] = {"none", "forward", "dx", "false", "true"};
    const int fast_values[] = {CP_FP8_FAST_NONE, CP_FP8_FAST_FORWARD, CP_FP8_FAST_DX, CP_FP8_FAST_NONE,
                               CP_FP8_FAST_FORWARD};
    for (int i = 0; i < 5; i++) {
        char kv[64];
        snprintf(kv, sizeof kv, "train.fp8_fast_accum=%s", fast_names[i]);
        const char *one[] = {kv};
        load_ok("tiny", one, 1);
        assert_int_equal(spec.train.fp8_fast_accum, fast_values[i]);
    }
    assert_false(spec.train.fp8_bf16_dgrad);
    const char *fp8[] = {"train.precision=fp8", "train.fp8_format=hybrid", "train.fp8_fast_accum=false",
                         "train.fp8_scaling=block", "train.fp8_weight_grads=fp8", "train.fp8_gemm=cpgen",
                         "train.fp8_input_grads=bf16"};
    load_ok("tiny", fp8, 7);
    assert_true(spec.train.fp8 && !spec.train.fp8_e4m3_grads && !spec.train.fp8_fast_accum &&
                spec.train.fp8_bf16_dgrad && spec.train.fp8_scaling == CP_FP8_SCALING_BLOCK && !spec.train.fp8_bf16_wgrad &&
                spec.train.fp8_gemm == CP_FP8_GEMM_CPGEN);
    cp_str text = {0};
    cp_spec a = spec, b;
    cp_spec_write_lua(&a, &text);
    assert_contains(text.data, "precision = \"fp8\"");
    if (cp_spec_load_string("resolved.lua", text.data, NULL, 0, &b, err, sizeof err)) fail_msg("%s", err);
    assert_contains(text.data, "fp8_gemm = \"cpgen\"");
    assert_contains(text.data, "fp8_fast_accum = \"none\"");
    assert_true(cp_spec_same(&a, &b) && b.train.fp8 && !b.train.fp8_e4m3_grads && !b.train.fp8_fast_accum &&
                b.train.fp8_bf16_dgrad &&
                b.train.fp8_scaling == CP_FP8_SCALING_BLOCK && !b.train.fp8_bf16_wgrad &&
                b.train.fp8_gemm == CP_FP8_GEMM_CPGEN);
    cp_str_free(&text);
    const char *bad[] = {"train.precision=fp16"};
    assert_int_equal(load_bad("tiny", bad, 1), -1);
    assert_contains(err, "<embedded>/tiny.lua: train.precision = \"fp16\": not a valid choice");
    assert_contains(err, "\"bf16\"");
    /* each wrong value named with its key, and the choices or the nearest one */
    const char *wrong[][3] = {
        {"train.fp8_format=e5m2", "train.fp8_format = \"e5m2\": not a valid choice", "\"hybrid\""},
        {"train.fp8_scaling=column", "train.fp8_scaling = \"column\": not a valid choice", "\"row\""},
        {"train.fp8_weight_grads=fp16", "train.fp8_weight_grads = \"fp16\": not a valid choice",
         "(one of \"fp8\" or \"bf16\")"},
        {"train.fp8_input_grads=fp16", "train.fp8_input_grads = \"fp16\": not a valid choice",
         "(one of \"fp8\" or \"bf16\")"},
        {"train.fp8_fast_accum=all", "train.fp8_fast_accum = \"all\": not a valid choice", "\"dx\""},
        {"train.fp8_fast_accum=dw", "train.fp8_fast_accum = \"dw\": not a valid choice", "did you mean \"dx\"?"},
        {"train.fp8_gemm=cublas", "train.fp8_gemm = \"cublas\": not a valid choice", "did you mean \"cublaslt\"?"},
        {"machine.fp8_gemm_tflops=0", "machine.fp8_gemm_tflops", ""},
        {"machine.fp8_gemm_fast_tflops=0", "machine.fp8_gemm_fast_tflops", ""},
    };
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        assert_int_equal(load_bad("tiny", &wrong[i][0], 1), -1);
        assert_contains(err, wrong[i][1]);
        assert_contains(err, wrong[i][2]);
    }
    /* fast dX where the recipe has it (row or per-tensor scales), refused with block scales, which always promote */
    const char *dx_row[] = {"train.precision=fp8", "train.fp8_scaling=row", "train.fp8_fast_accum=dx"};
    load_ok("tiny", dx_row, 3);
    assert_int_equal(spec.train.fp8_fast_accum, CP_FP8_FAST_DX);
    const char *dx_block[] = {"train.precision=fp8", "train.fp8_fast_accum=dx"};
    assert_int_equal(load_bad("tiny", dx_block, 2), -1);
    assert_contains(err, "train.fp8_fast_accum = \"dx\": block-scaled GEMMs always promote");
    assert_contains(err, "train.fp8_scaling = \"row\"");
}

static void test_names(void **state) {
    (void)state;
    assert_string_equal(cp_family_name(CP_FAMILY_LLAMA), "llama");
    assert_string_equal(cp_family_name(CP_FAMILY_QWEN3), "qwen3");
    assert_string_equal(cp_offload_name(CP_OFFLOAD_AUTO), "auto");
    assert_string_equal(cp_offload_name(CP_OFFLOAD_NONE), "none");
    assert_string_equal(cp_offload_name(CP_OFFLOAD_ALL), "all");
    assert_string_equal(cp_opt_place_name(CP_OPT_AUTO), "auto");
    assert_string_equal(cp_opt_place_name(CP_OPT_GPU), "gpu");
    assert_string_equal(cp_opt_place_name(CP_OPT_HOST), "host");
}

static void test_missing_file(void **state) {
    (void)state;
    assert_int_equal(load_bad("no/such/spec.lua", NULL, 0), -1);
    assert_contains(err, "no/such/spec.lua: cannot read spec");
    assert_int_equal(load_bad("llama9b", NULL, 0), -1);
    assert_contains(err, "llama9b");
    assert_contains(err, "did you mean the shipped spec");
    /* A small error buffer gets a truncated message, never an overflow. */
    char small[16];
    assert_int_equal(cp_spec_load("llama9b", NULL, 0, &spec, small, sizeof small), -1);
    assert_int_equal(strlen(small), sizeof small - 1);
}

/* The time limit holds inside one call of a library function, where Lua's count hook never fires, and memory
 * stays bounded. Each case runs in a child process with an alarm and 2 GiB of address space, so a load that does
 * not stop fails the test instead of hanging it. */
#define LIMIT_S 1.0
#define CASE_ALARM_S 30

static const struct {
    const char *text, *expect;
} LIMIT_CASES[] = {
    {"local s = string.rep('a', 300000) s:find('.-.-.-b') return cpgen.load('tiny')", "ran for more than 1 s"},
    {"local h = string.rep('a', 1 << 24) h:find(string.rep('a', 1 << 23) .. 'b', 1, true) return cpgen.load('tiny')",
     "ran for more than 1 s"},
    {"string.rep('', 1e18) return cpgen.load('tiny')", "ran for more than 1 s"},
    {"table.move({}, 1, 1e15, 2) return cpgen.load('tiny')", "ran for more than 1 s"},
    {"while true do end", "limit.lua:1: the spec ran for more than 1 s; does it loop forever?"},
    {"local s = string.rep('abc', 8e9) return cpgen.load('tiny')", "resulting string too large"},
    {"local s = ('ab'):rep(6e8) return cpgen.load('tiny')", "more than 1024 MiB of memory"},
    {"return dofile('/dev/zero')", "dofile: cannot read '/dev/zero' (a character device, not a regular file)"},
};

static void test_limits_inside_library_calls(void **state) {
    (void)state;
    size_t n = CP_ARRAY_LEN(LIMIT_CASES);
    pid_t pid[CP_ARRAY_LEN(LIMIT_CASES)];
    int fds[CP_ARRAY_LEN(LIMIT_CASES)];
    double t0 = cp_now();
    for (size_t i = 0; i < n; i++) { /* all at once: each takes the limit and more */
        int p[2];
        assert_int_equal(pipe(p), 0);
        fflush(NULL);
        pid[i] = fork();
        assert_true(pid[i] >= 0);
        if (pid[i] == 0) {
            close(p[0]);
            alarm(CASE_ALARM_S);
            struct rlimit as = {.rlim_cur = 2ull << 30, .rlim_max = 2ull << 30};
            if (setrlimit(RLIMIT_AS, &as) != 0) _exit(3);
            cp_spec_set_time_limit(LIMIT_S);
            char msg[CP_ERR_MAX];
            int rc = cp_spec_load_string("limit.lua", LIMIT_CASES[i].text, NULL, 0, &spec, msg, sizeof msg);
            if (rc == 0) snprintf(msg, sizeof msg, "(loaded)");
            ssize_t w = write(p[1], msg, strlen(msg));
            _exit(w < 0 ? 4 : 0);
        }
        close(p[1]);
        fds[i] = p[0];
    }
    for (size_t i = 0; i < n; i++) {
        char msg[CP_ERR_MAX] = "";
        size_t got = 0;
        ssize_t r;
        while (got < sizeof msg - 1 && (r = read(fds[i], msg + got, sizeof msg - 1 - got)) > 0) got += (size_t)r;
        msg[got] = 0;
        close(fds[i]);
        int st;
        assert_int_equal(waitpid(pid[i], &st, 0), pid[i]);
        if (WIFSIGNALED(st))
            fail_msg("case %zu (%s): killed by signal %d%s", i, LIMIT_CASES[i].text, WTERMSIG(st),
                     WTERMSIG(st) == SIGALRM ? ": the load did not stop" : "");
        assert_int_equal(WEXITSTATUS(st), 0);
        print_message("%s\n    %s\n", LIMIT_CASES[i].text, msg);
        if (!strstr(msg, LIMIT_CASES[i].expect))
            fail_msg("case %zu (%s): expected \"%s\" in: %s", i, LIMIT_CASES[i].text, LIMIT_CASES[i].expect, msg);
        assert_contains(msg, "limit.lua");
    }
    /* the limit, the loader's grace to report a Lua loop itself, and a loaded machine's slack */
    double took = cp_now() - t0;
    if (took > LIMIT_S + 10) fail_msg("the cases took %.1f s with a limit of %.0f s", took, LIMIT_S);
}

/* A load runs where cpgen stands now: dofile's relative paths follow a change of folder between loads. */
static void test_loads_follow_the_working_folder(void **state) {
    (void)state;
    load_ok("tiny", NULL, 0); /* the process that runs specs exists by now */
    char here[PATH_MAX], dir[64];
    assert_non_null(getcwd(here, sizeof here));
    assert_int_equal(tmpdir_make(dir, sizeof dir, "spec-cwd"), 0);
    char path[128];
    snprintf(path, sizeof path, "%s/base.lua", dir);
    const char *base = "return cpgen.extend(cpgen.load('tiny'), { model = { layers = 3 } })\n";
    assert_int_equal(cp_write_file_atomic(path, base, strlen(base)), 0);
    assert_int_equal(chdir(dir), 0);
    int rc = cp_spec_load_string("top.lua", "return dofile('base.lua')", NULL, 0, &spec, err, sizeof err);
    assert_int_equal(chdir(here), 0);
    tmpdir_remove(dir);
    if (rc) fail_msg("%s", err);
    assert_int_equal(spec.model.layers, 3);
}

/* ------------------------------------------------------------------------------------------------------------
 * tests/specs_bad: one test per file. Header comment lines "-- expect: <fragment>" give fragments the message
 * must contain; "-- set: key=value" lines are passed as --set overrides. */

#define MAX_LINES 16

static void test_bad_spec(void **state) {
    const char *path = *state;
    size_t len;
    char *text = cp_read_file(path, &len);
    assert_non_null(text);
    char *expect[MAX_LINES], *sets[MAX_LINES];
    int nexpect = 0, nsets = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "--", 2) != 0) break;
        if (strncmp(line, "-- expect: ", 11) == 0 && nexpect < MAX_LINES) expect[nexpect++] = line + 11;
        if (strncmp(line, "-- set: ", 8) == 0 && nsets < MAX_LINES) sets[nsets++] = line + 8;
    }
    if (nexpect == 0) fail_msg("%s has no '-- expect: ' line", path);
    int rc = load_bad(path, (const char *const *)sets, nsets);
    if (rc != -1) fail_msg("%s loaded without error", path);
    print_message("%s\n    %s\n", path, err);
    assert_contains(err, path);
    for (int i = 0; i < nexpect; i++) assert_contains(err, expect[i]);
    if (strchr(err, '\n')) fail_msg("message is not one line: %s", err);
    for (const char *p = err; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f) fail_msg("message holds control byte %#x: %s", *p, err);
    free(text);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int run_bad_specs(void) {
    DIR *d = opendir(BAD_DIR);
    if (!d) {
        fprintf(stderr, "cannot open %s\n", BAD_DIR);
        return 1;
    }
    int n = 0, cap = 64;
    char **paths = cp_xmalloc((size_t)cap * sizeof *paths);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 5 || strcmp(e->d_name + l - 4, ".lua") != 0) continue;
        if (n == cap) paths = cp_xrealloc(paths, (size_t)(cap *= 2) * sizeof *paths);
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", BAD_DIR, e->d_name);
        paths[n++] = cp_xstrdup(p);
    }
    closedir(d);
    qsort(paths, (size_t)n, sizeof *paths, cmp_str);
    int failures = 0;
    if (n < 30) {
        fprintf(stderr, "%s holds %d bad specs; at least 30 expected\n", BAD_DIR, n);
        failures++;
    }
    struct CMUnitTest *tests = cp_xcalloc((size_t)n, sizeof *tests);
    for (int i = 0; i < n; i++) {
        tests[i].name = strrchr(paths[i], '/') + 1;
        tests[i].test_func = test_bad_spec;
        tests[i].initial_state = paths[i];
    }
    failures += _cmocka_run_group_tests("bad_specs", tests, (size_t)n, NULL, NULL);
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
    free(tests);
    return failures;
}

int main(int argc, char **argv) {
    (void)argc;
    go_to_source_tree(argv[0], BAD_DIR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama1b),       cmocka_unit_test(test_llama3b),
        cmocka_unit_test(test_llama8b),       cmocka_unit_test(test_qwen32b),
        cmocka_unit_test(test_tiny),          cmocka_unit_test(test_every_shipped_spec_loads),
        cmocka_unit_test(test_lengths),       cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_set_overrides), cmocka_unit_test(test_machine_numbers),
        cmocka_unit_test(test_inheritance),
        cmocka_unit_test(test_upipe_auto),    cmocka_unit_test(test_check),
        cmocka_unit_test(test_replicas_ring), cmocka_unit_test(test_eval_keys),
        cmocka_unit_test(test_document_keys), cmocka_unit_test(test_precision_key),
        cmocka_unit_test(test_names),         cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_limits_inside_library_calls), cmocka_unit_test(test_loads_follow_the_working_folder),
    };
    int failures = cmocka_run_group_tests_name("spec", tests, NULL, NULL);
    failures += run_bad_specs();
    return failures ? 1 : 0;
}
