/* test_ktune.c: kernel variants (kernels.h cp_kvariants: the Hopper attention forward's K/V ring depths), what
 * emitting one gives, and the kernel tuning cache (gen/ktune.h): its file read back, its keys, a plan's choice from
 * it or from a bundle's names, and files that are not a cache ignored with one warning. No GPU, no NVRTC. */
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

#include "emit.h"
#include "kernels.h"
#include "kernels_attn.h"
#include "ktune.h"
#include "plan.h"
#include "util.h"

static char root[256];

static int group_setup(void **state) {
    (void)state;
    return tmpdir_make(root, sizeof root, "ktune");
}

static int group_teardown(void **state) {
    (void)state;
    tmpdir_remove(root);
    return 0;
}

#define SMEM_MAX (227 * 1024)

/* fwd_sm90's shared memory with the K/V ring of `stages` */
static unsigned fwd_smem(const cp_kernel_spec *base, const cp_kvariants *v, int stages) {
    cp_kernel_spec k;
    cp_kspec_copy(&k, base);
    cp_k_set_variant(&k, v, stages);
    cp_kdims d;
    assert_int_equal(cp_k_attention_dims(&k, "fwd_sm90", &d), 0);
    cp_kspec_free(&k);
    return d.smem;
}

/* The depths are every one from 2 that fits 227 KiB (head_dim 128: 2, 3; 64: 2 to 6), the default the template's old
 * constant, the key the values the kernel's speed depends on. */
static void test_attention_variants(void **state) {
    (void)state;
    struct {
        int64_t D;
        int n, last, def;
        const char *shape;
    } want[] = {{128, 2, 3, 2, "d128 q24 kv8 s32768 causal"}, {64, 5, 6, 4, "d64 q24 kv8 s32768 causal"}};
    for (size_t c = 0; c < CP_ARRAY_LEN(want); c++) {
        cp_kernel_spec k;
        cp_k_attention(&k, want[c].D, 24, 8, 32768, true, false, false);
        cp_kvariants v;
        assert_true(cp_k_variants(&k, &v));
        assert_string_equal(v.kernel, "attention.fwd_sm90");
        assert_string_equal(v.arch, "sm_90a");
        assert_string_equal(v.param, "FWD_STAGES");
        assert_string_equal(v.shape, want[c].shape);
        assert_int_equal(v.n, want[c].n);
        for (int i = 0; i < v.n; i++) {
            assert_int_equal(v.values[i], 2 + i);
            assert_true(fwd_smem(&k, &v, v.values[i]) <= SMEM_MAX);
        }
        assert_int_equal(v.values[v.n - 1], want[c].last);
        assert_true(fwd_smem(&k, &v, want[c].last + 1) > SMEM_MAX); /* the list stops where the ring stops fitting */
        assert_int_equal(v.def, want[c].def);
        assert_int_equal(cp_k_variant(&k, &v), v.def);
        cp_kspec_free(&k);
    }
    /* a non-causal shape of another length is another key */
    cp_kernel_spec k;
    cp_k_attention(&k, 128, 4, 1, 1000, false, true, false);
    cp_kvariants v;
    assert_true(cp_k_variants(&k, &v));
    assert_string_equal(v.shape, "d128 q4 kv1 s1000 full");
    cp_kspec_free(&k);
    /* no other family has variants */
    cp_k_rmsnorm(&k, 4096, 1e-5);
    assert_false(cp_k_variants(&k, &v));
    cp_kspec_free(&k);
}

/* The default emits what an untouched spec emits, byte for byte, under the same names; another depth is its own
 * module, every entry tagged, the ring's depth the only change in the code. */
static void test_variant_emits(void **state) {
    (void)state;
    cp_kernel_spec plain, def, three;
    cp_k_attention(&plain, 128, 24, 8, 32768, true, false, false);
    cp_kvariants v;
    assert_true(cp_k_variants(&plain, &v));
    cp_kspec_copy(&def, &plain);
    cp_k_set_variant(&def, &v, 3);
    cp_k_set_variant(&def, &v, v.def); /* there and back */
    cp_kspec_copy(&three, &plain);
    cp_k_set_variant(&three, &v, 3);
    assert_string_equal(three.tag, "kvs3");
    assert_int_equal(cp_k_variant(&three, &v), 3);
    cp_module_src mp, md, m3;
    char err[2048];
    assert_int_equal(cp_emit(&plain, &mp, err, sizeof err), 0);
    assert_int_equal(cp_emit(&def, &md, err, sizeof err), 0);
    assert_int_equal(cp_emit(&three, &m3, err, sizeof err), 0);
    assert_string_equal(md.name, mp.name);
    assert_string_equal(md.source, mp.source);
    assert_string_equal(mp.name, "attention_d128_q24_kv8_s32768_c1_a0_dqa0");
    assert_non_null(strstr(mp.source, "#define HSTAGES 2 "));
    assert_string_equal(m3.name, "attention_d128_q24_kv8_s32768_c1_a0_dqa0_kvs3");
    assert_int_equal(m3.nentries, mp.nentries);
    for (int e = 0; e < m3.nentries; e++) {
        char want[CP_KNAME_MAX + 8];
        snprintf(want, sizeof want, "%s_kvs3", mp.entries[e]);
        assert_string_equal(m3.entries[e], want);
    }
    assert_non_null(strstr(m3.source, "#define HSTAGES 3 "));
    assert_non_null(strstr(m3.source, "attention_fwd_sm90_d128_q24_kv8_s32768_c1_a0_dqa0_kvs3("));
    cp_module_src_free(&mp), cp_module_src_free(&md), cp_module_src_free(&m3);
    cp_kspec_free(&plain), cp_kspec_free(&def), cp_kspec_free(&three);
}

/* An entry of the tiny spec's attention (head_dim 64: depths 2 to 6, default 4) on a made-up machine. */
static cp_ktune_entry entry(const char *arch, const char *driver, const char *shape, int winner) {
    cp_ktune_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.arch, sizeof e.arch, "%s", arch);
    snprintf(e.driver, sizeof e.driver, "%s", driver);
    snprintf(e.kernel, sizeof e.kernel, "attention.fwd_sm90");
    snprintf(e.shape, sizeof e.shape, "%s", shape);
    snprintf(e.param, sizeof e.param, "FWD_STAGES");
    snprintf(e.cpgen, sizeof e.cpgen, "%s", CP_VERSION);
    e.def = 4;
    e.winner = winner;
    for (int i = 0; i < 5; i++) {
        e.values[e.n] = 2 + i;
        e.ms[e.n++] = 1.0 + 0.125 * i + (2 + i == winner ? -1 : 0) + 1.0 / 3;
    }
    e.flops = 4.5e12;
    return e;
}

#define TINY_SHAPE "d64 q4 kv2 s2048 causal"

static void write_text(const char *path, const char *text) {
    assert_int_equal(cp_write_file_atomic(path, text, strlen(text)), 0);
}

/* Put, save, load: every field comes back; a put of the same key replaces; find needs all four parts of the key. */
static void test_cache_round_trip_and_keys(void **state) {
    (void)state;
    char path[512], err[CP_ERR_MAX];
    snprintf(path, sizeof path, "%s/rt/cpgen/tuning.json", root); /* folders made on save */
    cp_ktune_cache c = {0};
    cp_ktune_entry a = entry("sm_90a", "580.82.07", TINY_SHAPE, 3), b = entry("sm_90a", "580.82.07", "d128 q24 kv8 s32768 causal", 2);
    cp_ktune_put(&c, &a);
    cp_ktune_put(&c, &b);
    a.winner = 5; /* timed again: replaces */
    cp_ktune_put(&c, &a);
    assert_int_equal(c.n, 2);
    assert_int_equal(cp_ktune_save(&c, path, err, sizeof err), 0);
    cp_ktune_free(&c);

    char *warn = NULL;
    size_t wlen = 0;
    FILE *w = open_memstream(&warn, &wlen);
    assert_int_equal(cp_ktune_load(path, &c, w), 2);
    fclose(w);
    assert_int_equal(wlen, 0);
    free(warn);
    const cp_ktune_entry *got = cp_ktune_find(&c, "sm_90a", "580.82.07", "attention.fwd_sm90", TINY_SHAPE);
    assert_non_null(got);
    assert_int_equal(got->winner, 5);
    assert_int_equal(got->def, 4);
    assert_int_equal(got->n, 5);
    for (int i = 0; i < got->n; i++) {
        assert_int_equal(got->values[i], a.values[i]);
        assert_true(got->ms[i] == a.ms[i]); /* exactly: the JSON numbers round-trip */
    }
    assert_true(got->flops == 4.5e12);
    assert_string_equal(got->param, "FWD_STAGES");
    assert_string_equal(got->cpgen, CP_VERSION);
    assert_non_null(cp_ktune_find(&c, "sm_90a", "580.82.07", "attention.fwd_sm90", "d128 q24 kv8 s32768 causal"));
    /* another architecture, driver, shape or kernel misses */
    assert_null(cp_ktune_find(&c, "sm_80", "580.82.07", "attention.fwd_sm90", TINY_SHAPE));
    assert_null(cp_ktune_find(&c, "sm_90a", "580.95.05", "attention.fwd_sm90", TINY_SHAPE));
    assert_null(cp_ktune_find(&c, "sm_90a", "580.82.07", "attention.fwd_sm90", "d64 q4 kv2 s4096 causal"));
    assert_null(cp_ktune_find(&c, "sm_90a", "580.82.07", "attention.fwd_sm90", "d64 q4 kv2 s2048 full"));
    assert_null(cp_ktune_find(&c, "sm_90a", "580.82.07", "attention.bwd_sm90", TINY_SHAPE));
    cp_ktune_free(&c);

    /* a missing file is an empty cache, without a word */
    snprintf(path, sizeof path, "%s/no-such/tuning.json", root);
    w = open_memstream(&warn, &wlen);
    assert_int_equal(cp_ktune_load(path, &c, w), 0);
    fclose(w);
    assert_int_equal(wlen, 0);
    free(warn);
    assert_int_equal(c.n, 0);
}

/* The file lies beside the JIT cache: XDG_CACHE_HOME when absolute, or the folder given. */
static void test_cache_path(void **state) {
    (void)state;
    char path[512];
    const char *old = getenv("XDG_CACHE_HOME");
    char *saved = old ? cp_xstrdup(old) : NULL;
    setenv("XDG_CACHE_HOME", "/somewhere/cache", 1);
    cp_ktune_path(NULL, path, sizeof path);
    assert_string_equal(path, "/somewhere/cache/cpgen/tuning.json");
    cp_ktune_path("/my/jit", path, sizeof path);
    assert_string_equal(path, "/my/jit/tuning.json");
    if (saved) setenv("XDG_CACHE_HOME", saved, 1);
    else unsetenv("XDG_CACHE_HOME");
    free(saved);
}

/* Files that are not a tuning cache: each is ignored whole (no entry kept, not even the good one beside a bad one)
 * with exactly one warning line naming the file and what is wrong. */
static void test_bad_cache_ignored_with_one_warning(void **state) {
    (void)state;
    const char *good = "{\"arch\": \"sm_90a\", \"driver\": \"1\", \"kernel\": \"attention.fwd_sm90\", \"shape\": \"" TINY_SHAPE
                       "\", \"param\": \"FWD_STAGES\", \"default\": 4, \"winner\": 3, \"ms\": {\"3\": 1.5, \"4\": 2}, "
                       "\"cpgen\": \"0.1.0\"}";
    struct {
        const char *text, *why;
    } bad[] = {
        {"{\"format\": \"cpgen-tuning-1\", \"entries\": [", "not JSON"},
        {"\x7f" "ELF\x01\x02", "not JSON"},
        {"", "not JSON"},
        {"[1, 2]", "\"format\""},
        {"{\"format\": \"cpgen-tuning-0\", \"entries\": []}", "\"format\""},
        {"{\"format\": \"cpgen-tuning-1\"}", "no \"entries\""},
        {"{\"format\": \"cpgen-tuning-1\", \"entries\": {}}", "no \"entries\""},
        {"{\"format\": \"cpgen-tuning-1\", \"entries\": [7]}", "entry 0"},
        {"{\"format\": \"cpgen-tuning-1\", \"entries\": [{\"arch\": \"sm_90a\"}]}", "\"driver\""},
        {"{\"format\": \"cpgen-tuning-1\", \"entries\": [{\"arch\": \"sm_90a\", \"driver\": \"1\", \"kernel\": \"k\", "
         "\"shape\": \"s\", \"param\": \"P\", \"cpgen\": \"x\", \"default\": 2, \"winner\": 3, \"ms\": {\"2\": 1}}]}",
         "the winner 3 has no time"},
        {"{\"format\": \"cpgen-tuning-1\", \"entries\": [{\"arch\": \"sm_90a\", \"driver\": \"1\", \"kernel\": \"k\", "
         "\"shape\": \"s\", \"param\": \"P\", \"cpgen\": \"x\", \"default\": 2, \"winner\": 2, \"ms\": {\"2\": -1}}]}",
         "positive time"},
        {"{\"format\": \"cpgen-tuning-1\", \"entries\": [{\"arch\": \"sm_90a\", \"driver\": \"1\", \"kernel\": \"k\", "
         "\"shape\": \"s\", \"param\": \"P\", \"cpgen\": \"x\", \"default\": 2.5, \"winner\": 2, \"ms\": {\"2\": 1}}]}",
         "\"default\""},
        {NULL, "entry 1"}, /* a good entry, then a bad one */
    };
    char path[512], text[2048];
    snprintf(path, sizeof path, "%s/bad.json", root);
    for (size_t i = 0; i < CP_ARRAY_LEN(bad); i++) {
        if (bad[i].text) write_text(path, bad[i].text);
        else {
            snprintf(text, sizeof text, "{\"format\": \"cpgen-tuning-1\", \"entries\": [%s, {\"arch\": 1}]}", good);
            write_text(path, text);
        }
        char *warn = NULL;
        size_t wlen = 0;
        FILE *w = open_memstream(&warn, &wlen);
        cp_ktune_cache c;
        assert_int_equal(cp_ktune_load(path, &c, w), 0);
        fclose(w);
        assert_int_equal(c.n, 0);
        int lines = 0;
        for (size_t k = 0; k < wlen; k++) lines += warn[k] == '\n';
        if (lines != 1 || !strstr(warn, path) || !strstr(warn, "ignored") || !strstr(warn, bad[i].why))
            fail_msg("case %zu: warning \"%s\" should be one line naming %s and \"%s\"", i, warn, path, bad[i].why);
        free(warn);
        cp_ktune_free(&c);
    }
    /* the good entry alone is read */
    snprintf(text, sizeof text, "{\"format\": \"cpgen-tuning-1\", \"entries\": [%s]}", good);
    write_text(path, text);
    cp_ktune_cache c;
    assert_int_equal(cp_ktune_load(path, &c, NULL), 1);
    assert_int_equal(c.e[0].winner, 3);
    cp_ktune_free(&c);
    /* a folder where the file should be cannot be read: ignored with a warning too */
    snprintf(path, sizeof path, "%s/a-folder", root);
    assert_int_equal(mkdir(path, 0755), 0);
    char *warn = NULL;
    size_t wlen = 0;
    FILE *w = open_memstream(&warn, &wlen);
    assert_int_equal(cp_ktune_load(path, &c, w), 0);
    fclose(w);
    assert_non_null(strstr(warn, "cannot be read"));
    free(warn);
}

static void tiny_plan(cp_plan *P) {
    cp_spec spec;
    char err[CP_ERR_MAX];
    if (cp_spec_load("tiny", NULL, 0, &spec, err, sizeof err)) fail_msg("%s", err);
    if (cp_plan_build(&spec, P, err, sizeof err)) fail_msg("%s", err);
}

/* The plan's emitted modules as one text (name and source of each), to compare plans by. */
static char *emitted(const cp_plan *P) {
    cp_module_src *mods;
    char err[CP_ERR_MAX];
    int n = cp_plan_emit(P, &mods, err, sizeof err);
    if (n < 0) fail_msg("%s", err);
    cp_str s = {0};
    for (int i = 0; i < n; i++) cp_str_printf(&s, "== %s\n%s", mods[i].name, mods[i].source);
    cp_module_srcs_free(mods, n);
    return s.data;
}

static int attention_module(const cp_plan *P) {
    for (int i = 0; i < P->nmodules; i++)
        if (!strcmp(P->modules[i].family, "attention")) return i;
    fail_msg("no attention module");
    return -1;
}

static char *printed(const cp_plan *P) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cp_plan_print(P, f, false);
    fclose(f);
    return text;
}

/* A cached winner for this machine and shape changes the attention module (and nothing else); an empty cache, or an
 * entry of another machine or shape, leaves every module byte for byte as the plan made it, and says why. */
static void test_plan_takes_the_winner_or_the_default(void **state) {
    (void)state;
    cp_plan base;
    tiny_plan(&base);
    char *want = emitted(&base);
    char *text = printed(&base);
    assert_null(strstr(text, "kernels   ")); /* no choice made: nothing said */
    free(text);

    cp_ktune_cache c = {0};
    struct {
        const char *archs, *driver;
        cp_ktune_entry e;
        const char *why;
    } miss[] = {
        {"sm_90a", "580.82.07", entry("sm_90a", "580.95.05", TINY_SHAPE, 3), "no entry for sm_90a, driver 580.82.07"},
        {"sm_90a", "580.82.07", entry("sm_80", "580.82.07", TINY_SHAPE, 3), "no entry for sm_90a"},
        {"sm_90a", "580.82.07", entry("sm_90a", "580.82.07", "d64 q4 kv2 s4096 causal", 3), "no entry"},
        {"sm_90a", "580.82.07", entry("sm_90a", "580.82.07", TINY_SHAPE, 9), "the cached winner 9 is not a variant"},
        {"sm_80", "580.82.07", entry("sm_90a", "580.82.07", TINY_SHAPE, 3), "only sm_90a runs it"},
        {"sm_90a", "", entry("sm_90a", "", TINY_SHAPE, 3), "no GPU driver"},
    };
    for (size_t i = 0; i < CP_ARRAY_LEN(miss); i++) {
        cp_plan P;
        tiny_plan(&P);
        c.n = 0;
        if (miss[i].e.winner == 9) miss[i].e.values[0] = 9; /* timed once, no longer a candidate */
        cp_ktune_put(&c, &miss[i].e);
        cp_ktune_apply(&P, &c, miss[i].archs, miss[i].driver);
        assert_int_equal(P.nkchoices, 1);
        assert_int_equal(P.kchoices[0].module, attention_module(&P));
        assert_int_equal(P.kchoices[0].source, CP_KVAR_DEFAULT);
        assert_int_equal(P.kchoices[0].value, 4);
        if (!strstr(P.kchoices[0].note, miss[i].why)) fail_msg("case %zu: note \"%s\"", i, P.kchoices[0].note);
        char *got = emitted(&P);
        assert_string_equal(got, want);
        free(got);
        text = printed(&P);
        assert_non_null(strstr(text, "  kernels   attention.fwd_sm90 " TINY_SHAPE ": 4 K/V stages, the default ("));
        free(text);
        cp_plan_free(&P);
    }

    /* the winner: the attention module tagged and deeper, every other module as it was */
    cp_plan P;
    tiny_plan(&P);
    c.n = 0;
    cp_ktune_entry hit = entry("sm_90a", "580.82.07", TINY_SHAPE, 6);
    cp_ktune_put(&c, &hit);
    cp_ktune_put(&c, &miss[0].e);
    cp_ktune_apply(&P, &c, "sm_90a,sm_80", "580.82.07"); /* aot for both: sm_90a's winner */
    assert_int_equal(P.nkchoices, 1);
    assert_int_equal(P.kchoices[0].source, CP_KVAR_CACHE);
    assert_int_equal(P.kchoices[0].value, 6);
    int a = attention_module(&P);
    assert_string_equal(P.modules[a].tag, "kvs6");
    assert_string_equal(cp_kspec_get(&P.modules[a], "FWD_STAGES"), "6");
    char *got = emitted(&P);
    assert_string_not_equal(got, want);
    assert_non_null(strstr(got, "== attention_d64_q4_kv2_s2048_c1_a0_dqa0_kvs6\n"));
    assert_non_null(strstr(got, "#define HSTAGES 6 "));
    assert_null(strstr(want, "_kvs"));
    /* the rest is the same: cut the attention module out of both */
    for (int i = 0; i < P.nmodules; i++) {
        if (i == a) continue;
        cp_module_src m;
        char err[CP_ERR_MAX];
        assert_int_equal(cp_emit(&P.modules[i], &m, err, sizeof err), 0);
        assert_non_null(strstr(want, m.source));
        cp_module_src_free(&m);
    }
    text = printed(&P);
    assert_non_null(strstr(text, "  kernels   attention.fwd_sm90 " TINY_SHAPE ": 6 K/V stages, from the tuning cache "
                                 "(sm_90a, driver 580.82.07: 0.833 ms; the default 4: 1.583 ms)"));
    free(text);
    free(got);

    /* a bundle's module names decide for a bundle run, whatever the cache says */
    cp_module_src m;
    char err[CP_ERR_MAX];
    assert_int_equal(cp_emit(&P.modules[a], &m, err, sizeof err), 0);
    cp_plan B;
    tiny_plan(&B);
    const char *names[] = {"rmsnorm_h256_e1em05", m.name};
    cp_ktune_apply_bundle(&B, names, 2);
    assert_int_equal(B.nkchoices, 1);
    assert_int_equal(B.kchoices[0].source, CP_KVAR_BUNDLE);
    assert_int_equal(B.kchoices[0].value, 6);
    assert_string_equal(B.modules[attention_module(&B)].tag, "kvs6");
    cp_ktune_apply_bundle(&B, names, 1); /* a bundle built with the default */
    assert_int_equal(B.kchoices[0].value, 4);
    assert_string_equal(B.modules[attention_module(&B)].tag, "");
    got = emitted(&B);
    assert_string_equal(got, want);
    free(got);
    cp_module_src_free(&m);
    cp_plan_free(&B);
    cp_plan_free(&P);
    cp_plan_free(&base);
    cp_ktune_free(&c);
    free(want);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_variants),
        cmocka_unit_test(test_variant_emits),
        cmocka_unit_test(test_cache_round_trip_and_keys),
        cmocka_unit_test(test_cache_path),
        cmocka_unit_test(test_bad_cache_ignored_with_one_warning),
        cmocka_unit_test(test_plan_takes_the_winner_or_the_default),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
