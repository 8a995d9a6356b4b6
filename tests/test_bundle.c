/* test_bundle.c: AOT bundles without a GPU. `cpgen aot` makes a bundle of the tiny spec for sm_90a and sm_80 (NVRTC
 * runs in that child process); this process then makes NVRTC impossible to load and checks the manifest, the
 * resolved spec, every refusal (another plan, another architecture, another cpgen version, a damaged or missing
 * cubin), the loader's cubins, that nothing asked for NVRTC, and that a compile says NVRTC is missing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tmpdir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bundle.h"
#include "data.h"
#include "jit.h"
#include "module.h"
#include "plan.h"
#include "sh.h"
#include "sha256.h"
#include "source_tree.h"
#include "spec.h"
#include "spec_write.h"
#include "util.h"

static char root[256], bundle[300];

static int group_setup(void **state) {
    (void)state;
    if (tmpdir_make(root, sizeof root, "bundle")) return -1;
    snprintf(bundle, sizeof bundle, "%s/tiny.bundle", root);
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME=%s/cache build/cpgen aot tiny -o %s --arch sm_90a,sm_80", root, bundle);
    int rc = sh(cmd, &out);
    if (rc != 0) fprintf(stderr, "%s\n%s\n", cmd, out);
    free(out);
    /* from here on this process cannot load NVRTC */
    setenv("CPGEN_NVRTC_LIB", "/nonexistent/libnvrtc.so.13", 1);
    return rc;
}

static int group_teardown(void **state) {
    (void)state;
    tmpdir_remove(root);
    return 0;
}

/* The plan of the tiny spec with sets, as the command line makes it: data.documents resolved first. */
static void load_plan(const char *const *sets, int nsets, cp_plan *plan) {
    cp_spec spec;
    char err[CP_ERR_MAX];
    if (cp_spec_load("tiny", sets, nsets, &spec, err, sizeof err) || cp_data_resolve_documents(&spec, err, sizeof err))
        fail_msg("%s", err);
    if (cp_plan_build(&spec, plan, err, sizeof err)) fail_msg("%s", err);
}

/* A copy of the bundle to damage. */
static void copy_bundle(const char *to) {
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "rm -rf %s && cp -r %s %s", to, bundle, to);
    assert_int_equal(sh(cmd, &out), 0);
    free(out);
}

static void test_resolved_spec_round_trip(void **state) {
    (void)state;
    const char *names[] = {"tiny", "llama1b", "llama3b", "llama8b", "qwen32b"};
    const char *sets[] = {"train.seq_len=64K", "parallel.gpus=2", "parallel.mlp_tile=2K", "train.out_dir=a \"q\"\\b"};
    for (size_t i = 0; i < CP_ARRAY_LEN(names); i++) {
        cp_spec a, b;
        char err[CP_ERR_MAX];
        if (cp_spec_load(names[i], sets, (int)CP_ARRAY_LEN(sets), &a, err, sizeof err)) fail_msg("%s", err);
        cp_str text = {0};
        cp_spec_write_lua(&a, &text);
        if (cp_spec_load_string("resolved.lua", text.data, NULL, 0, &b, err, sizeof err))
            fail_msg("%s: %s\n%s", names[i], err, text.data);
        assert_true(cp_spec_same(&a, &b));
        assert_int_equal(b.train.seq_len, 65536);
        assert_int_equal(b.parallel.mlp_tile, 2048);
        assert_string_equal(b.train.out_dir, "a \"q\"\\b");
        assert_int_equal(b.model.layers, a.model.layers);
        assert_true(b.model.norm_eps == a.model.norm_eps && b.machine.gemm_tflops == a.machine.gemm_tflops);
        assert_int_equal(b.parallel.upipe_auto, a.parallel.upipe_auto);
        cp_str_free(&text);
    }
    /* a changed key is named with both values */
    cp_spec a, b;
    char err[CP_ERR_MAX];
    const char *one[] = {"train.seq_len=4K"};
    assert_int_equal(cp_spec_load("tiny", NULL, 0, &a, err, sizeof err), 0);
    assert_int_equal(cp_spec_load("tiny", one, 1, &b, err, sizeof err), 0);
    assert_false(cp_spec_same(&a, &b));
    cp_str x = {0}, y = {0}, d = {0};
    cp_spec_write_lua(&a, &x);
    cp_spec_write_lua(&b, &y);
    assert_int_equal(cp_spec_diff(x.data, y.data, &d, 4), 1);
    assert_string_equal(d.data, "train.seq_len = 4096 here, 2048 in the bundle");
    cp_str_free(&x), cp_str_free(&y), cp_str_free(&d);
}

static void test_manifest(void **state) {
    (void)state;
    cp_bundle b;
    char err[CP_ERR_MAX];
    if (cp_bundle_open(bundle, &b, err, sizeof err)) fail_msg("%s", err);
    cp_plan plan;
    load_plan(NULL, 0, &plan);
    cp_module_src *mods;
    int n = cp_plan_emit(&plan, &mods, err, sizeof err);
    assert_true(n >= 8);
    assert_int_equal(b.nmodules, n);
    assert_string_equal(b.version, CP_VERSION);
    assert_int_equal(b.narchs, 2);
    assert_string_equal(b.archs[0], "sm_90a");
    assert_string_equal(b.archs[1], "sm_80");
    assert_non_null(strstr(b.command, "cpgen aot tiny -o "));
    char hex[CP_SHA256_HEX];
    assert_int_equal(cp_bundle_plan_hash(&plan, hex, err, sizeof err), 0);
    assert_string_equal(b.plan_sha256, hex);
    assert_string_equal(b.spec_sha256, cp_sha256_hex(b.spec_text, strlen(b.spec_text), hex));
    for (int i = 0; i < n; i++) {
        const cp_bundle_module *m = &b.modules[i];
        assert_string_equal(m->name, mods[i].name);
        assert_string_equal(m->source_sha256, cp_sha256_hex(mods[i].source, strlen(mods[i].source), hex));
        char path[1024];
        snprintf(path, sizeof path, "%s/src/%s.cu", bundle, m->name);
        size_t len;
        char *src = cp_read_file(path, &len);
        assert_non_null(src);
        assert_string_equal(src, mods[i].source);
        free(src);
        for (int a = 0; a < 2; a++) {
            const cp_bundle_cubin *c = &m->cubins[a];
            snprintf(path, sizeof path, "%s/%s", bundle, c->file);
            char *cubin = cp_read_file(path, &len);
            assert_non_null(cubin);
            assert_int_equal((int64_t)len, c->bytes);
            assert_memory_equal(cubin, "\177ELF", 4);
            assert_string_equal(c->sha256, cp_sha256_hex(cubin, len, hex));
            free(cubin);
            assert_int_equal(c->nentries, mods[i].nentries);
            for (int e = 0; e < c->nentries; e++) {
                assert_string_equal(c->entries[e].name, mods[i].entries[e]);
                assert_in_range(c->entries[e].registers, 1, 255);
            }
        }
    }
    /* the command line resolved the data's modes before it planned: the bundle says them */
    assert_non_null(strstr(b.spec_text, "documents = \"stream\""));
    assert_non_null(strstr(b.spec_text, "positions = \"sequence\""));
    /* the resolved spec runs as the tiny spec */
    cp_spec s;
    assert_int_equal(cp_spec_load_string("spec.lua", b.spec_text, NULL, 0, &s, err, sizeof err), 0);
    assert_true(cp_spec_same(&s, &plan.spec));
    cp_module_srcs_free(mods, n);
    cp_plan_free(&plan);
    cp_bundle_close(&b);
}

/* cp_bundle_check's message for the plan of sets on arch, against the bundle at dir (0 when it fits). */
static int check(const char *dir, const char *const *sets, int nsets, const char *arch, char *err, int errlen,
                 cp_str *note) {
    cp_bundle b;
    if (cp_bundle_open(dir, &b, err, errlen)) fail_msg("%s", err);
    cp_plan plan;
    load_plan(sets, nsets, &plan);
    int rc = cp_bundle_check(&b, &plan, arch, "REBUILD", note, err, errlen);
    cp_plan_free(&plan);
    cp_bundle_close(&b);
    return rc;
}

static void test_fits_and_notes(void **state) {
    (void)state;
    char err[CP_ERR_MAX];
    cp_str note = {0};
    assert_int_equal(check(bundle, NULL, 0, "sm_90a", err, sizeof err, &note), 0);
    assert_null(note.data);
    assert_int_equal(check(bundle, NULL, 0, NULL, err, sizeof err, &note), 0);
    const char *lr[] = {"train.lr=1e-3", "train.steps=900"};
    assert_int_equal(check(bundle, lr, 2, "sm_80", err, sizeof err, &note), 0);
    assert_non_null(note.data);
    assert_non_null(strstr(note.data, "train.steps = 900 here, 800 in the bundle"));
    assert_non_null(strstr(note.data, "train.lr = 0.001 here"));
    cp_str_free(&note);
}

static void test_refusals(void **state) {
    (void)state;
    char err[CP_ERR_MAX], other[320];
    const char *seq[] = {"train.seq_len=4K"};
    assert_int_equal(check(bundle, seq, 1, "sm_90a", err, sizeof err, NULL), -1);
    assert_non_null(strstr(err, "was made for another plan: train.seq_len = 4096 here, 2048 in the bundle"));
    assert_non_null(strstr(err, "3 of this run's 10 kernel modules are not in it (attention_d64_q4_kv2_s4096"));
    assert_non_null(strstr(err, "rebuild it for this run: REBUILD"));

    assert_int_equal(check(bundle, NULL, 0, "sm_89", err, sizeof err, NULL), -1);
    assert_non_null(strstr(err, "holds cubins for sm_90a, sm_80; this GPU is sm_89"));
    assert_non_null(strstr(err, "REBUILD"));

    snprintf(other, sizeof other, "%s/old.bundle", root);
    copy_bundle(other);
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "sed -i 's/\"cpgen_version\": \"%s\"/\"cpgen_version\": \"0.0.9\"/' %s/manifest.json",
             CP_VERSION, other);
    assert_int_equal(sh(cmd, &out), 0);
    free(out);
    assert_int_equal(check(other, NULL, 0, "sm_90a", err, sizeof err, NULL), -1);
    assert_non_null(strstr(err, "was made by cpgen 0.0.9; this is cpgen " CP_VERSION));

    snprintf(other, sizeof other, "%s/damaged.bundle", root);
    copy_bundle(other);
    snprintf(cmd, sizeof cmd, "printf 'x' | dd of=%s/sm_80/adamw.cubin bs=1 seek=100 conv=notrunc", other);
    assert_int_equal(sh(cmd, &out), 0);
    free(out);
    assert_int_equal(check(other, NULL, 0, "sm_90a", err, sizeof err, NULL), 0); /* the damage is in another arch */
    assert_int_equal(check(other, NULL, 0, "sm_80", err, sizeof err, NULL), -1);
    assert_non_null(strstr(err, "cubin sm_80/adamw.cubin is damaged"));
    assert_int_equal(check(other, NULL, 0, NULL, err, sizeof err, NULL), -1); /* no GPU: every arch checked */

    snprintf(other, sizeof other, "%s/missing.bundle", root);
    copy_bundle(other);
    snprintf(cmd, sizeof cmd, "%s/sm_90a/loss_v512.cubin", other);
    assert_int_equal(remove(cmd), 0);
    assert_int_equal(check(other, NULL, 0, "sm_90a", err, sizeof err, NULL), -1);
    assert_non_null(strstr(err, "cubin sm_90a/loss_v512.cubin is missing"));
    assert_int_equal(cp_nvrtc_requests(), 0);
}

/* What the executor does with a bundle, less the GPU: the plan's modules emitted, their cubins from the bundle. */
static void test_loader_never_compiles(void **state) {
    (void)state;
    cp_bundle b;
    char err[CP_ERR_MAX];
    assert_int_equal(cp_bundle_open(bundle, &b, err, sizeof err), 0);
    cp_plan plan;
    load_plan(NULL, 0, &plan);
    int n = plan.nmodules;
    cp_module_src *src = calloc((size_t)n, sizeof *src);
    cp_jit_module *jm = calloc((size_t)n, sizeof *jm);
    for (int i = 0; i < n; i++) assert_int_equal(cp_emit(&plan.modules[i], &src[i], err, sizeof err), 0);
    if (cp_bundle_modules(&b, src, n, "sm_80", jm, err, sizeof err)) fail_msg("%s", err);
    for (int i = 0; i < n; i++) {
        assert_string_equal(jm[i].name, src[i].name);
        assert_true(jm[i].from_cache);
        char path[1024], hex[CP_SHA256_HEX];
        snprintf(path, sizeof path, "%s/sm_80/%s.cubin", bundle, src[i].name);
        size_t len;
        char *file = cp_read_file(path, &len);
        assert_int_equal(jm[i].cubin_len, len);
        assert_memory_equal(jm[i].cubin, file, len);
        free(file);
        const char *want = NULL;
        for (int k = 0; k < b.nmodules; k++)
            if (!strcmp(b.modules[k].name, src[i].name)) want = b.modules[k].cubins[1].sha256; /* sm_80 */
        assert_non_null(want);
        assert_string_equal(cp_sha256_hex(jm[i].cubin, jm[i].cubin_len, hex), want);
        assert_int_equal(jm[i].nentries, src[i].nentries);
        cp_jit_module_free(&jm[i]);
    }
    assert_int_equal(cp_bundle_modules(&b, src, n, "sm_89", jm, err, sizeof err), -1);
    assert_non_null(strstr(err, "holds cubins for sm_90a, sm_80, not for sm_89"));
    assert_int_equal(cp_nvrtc_requests(), 0); /* nothing asked for NVRTC */

    /* a compile here says NVRTC is missing and how to do without it */
    cp_jit_opts jo = {0};
    snprintf(jo.arch, sizeof jo.arch, "sm_90a");
    snprintf(jo.cache_dir, sizeof jo.cache_dir, "%s/cache2", root);
    assert_int_equal(cp_jit_compile(src, n, &jo, jm, err, sizeof err), -1);
    assert_non_null(strstr(err, "NVRTC, the CUDA runtime compiler, is not installed here"));
    assert_non_null(strstr(err, "/nonexistent/libnvrtc.so.13"));
    assert_non_null(strstr(err, "cpgen aot SPEC -o BUNDLE"));
    assert_int_equal(cp_nvrtc_requests(), 1);
    for (int i = 0; i < n; i++) cp_module_src_free(&src[i]);
    free(src);
    free(jm);
    cp_plan_free(&plan);
    cp_bundle_close(&b);
}

/* The command line: a bundle checked by `cpgen run` on a machine without a GPU or NVRTC; aot's folder rules. */
static void test_command_line(void **state) {
    (void)state;
    char cmd[1024], *out, why[256];
    if (cp_gpu_count(why, sizeof why) > 0) skip(); /* with a GPU, run would train */
    snprintf(cmd, sizeof cmd, "build/cpgen run %s", bundle);
    assert_int_equal(sh(cmd, &out), 0);
    assert_non_null(strstr(out, "10 modules for sm_90a, sm_80 (cpgen " CP_VERSION "), every cubin matches its SHA-256"));
    free(out);
    snprintf(cmd, sizeof cmd, "build/cpgen run tiny --bundle %s --seq 4K", bundle);
    assert_int_equal(sh(cmd, &out), 2);
    assert_non_null(strstr(out, "rebuild it for this run: cpgen aot tiny --set train.seq_len=4K -o "));
    assert_non_null(strstr(out, "--arch sm_90a,sm_80"));
    free(out);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/notabundle && touch %s/notabundle/keep && build/cpgen aot tiny -o "
             "%s/notabundle", root, root, root);
    assert_int_equal(sh(cmd, &out), 1);
    assert_non_null(strstr(out, "not a bundle written by cpgen aot: it holds no bundle (no manifest.json)"));
    free(out);
    snprintf(cmd, sizeof cmd, "ls %s | grep -c tmp", root);
    assert_int_equal(sh(cmd, &out), 1); /* grep found nothing: no temporary folder was left */
    free(out);
}

int main(int argc, char **argv) {
    (void)argc;
    go_to_source_tree(argv[0], "tests/specs_bad");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resolved_spec_round_trip),
        cmocka_unit_test(test_manifest),
        cmocka_unit_test(test_fits_and_notes),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_loader_never_compiles),
        cmocka_unit_test(test_command_line),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
