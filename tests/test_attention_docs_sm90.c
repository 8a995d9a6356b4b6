/* test_attention_docs_sm90.c: the Hopper attention kernels with document masks (DOCS = 1, templates/attention.cu,
 * "Document masks"; fwd_sm90 in attention_sm90.cuh, bwd_sm90 in attention_bwd_sm90.cuh) at the shapes the plans use
 * and the ones the masks make different: head_dim 64 (192-row forward blocks, K and V in registers in the backward)
 * and 128, causal and not (a ring's half block), GQA, dQ summed in order and by atomics. Each module emits under its
 * own name, takes the launch geometry of its twin without documents (the masks change no tile, thread count or
 * shared memory), and compiles for sm_90a with NVRTC with no register spills and no ptxas performance notes (a
 * serialised wgmma pipeline would show there). Needs NVRTC, no GPU; what the masks compute is the GPU tests'. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tmpdir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"
#include "jit.h"
#include "kernels.h"
#include "kernels_attn.h"
#include "util.h"

static char cache_dir[256];

static int group_setup(void **state) {
    (void)state;
    return tmpdir_make(cache_dir, sizeof cache_dir, "attn-docs");
}

static int group_teardown(void **state) {
    (void)state;
    tmpdir_remove(cache_dir);
    return 0;
}

static const struct {
    int64_t D;
    int qh, kvh;
    int64_t seq;
    bool causal, dkv_accum, dq_atomic;
} SHAPES[] = {
    {128, 32, 8, 4096, true, false, false}, /* llama8b's stage, ordered dQ */
    {64, 32, 8, 1000, true, false, false},  /* ragged: the last query and key tiles are partial */
    {128, 8, 2, 2048, false, true, false},  /* a ring's half block: no causal rule, ordered dQ (zeroes the tiles no
                                               key block visits) */
    {64, 8, 8, 2048, false, true, true},    /* the same, atomic dQ */
    {128, 16, 4, 300, true, true, true},
};

static void test_docs_geometry_is_the_twins(void **state) {
    (void)state;
    static const char *roles[] = {"fwd_sm90", "bwd_sm90", "bwd_dq"};
    for (size_t s = 0; s < CP_ARRAY_LEN(SHAPES); s++) {
        cp_kernel_spec a, b;
        cp_k_attention(&a, SHAPES[s].D, SHAPES[s].qh, SHAPES[s].kvh, SHAPES[s].seq, SHAPES[s].causal,
                       SHAPES[s].dkv_accum, SHAPES[s].dq_atomic);
        cp_kspec_copy(&b, &a);
        cp_k_attention_docs(&b, true);
        for (size_t r = 0; r < CP_ARRAY_LEN(roles); r++) {
            cp_kdims da, db;
            assert_int_equal(cp_k_attention_dims(&a, roles[r], &da), 0);
            assert_int_equal(cp_k_attention_dims(&b, roles[r], &db), 0);
            assert_memory_equal(&da, &db, sizeof da);
        }
        assert_int_equal(cp_k_attention_workspace_bytes(&a), cp_k_attention_workspace_bytes(&b));
        cp_kspec_free(&a);
        cp_kspec_free(&b);
    }
}

static void test_docs_modules_compile_for_hopper(void **state) {
    (void)state;
    enum { N = CP_ARRAY_LEN(SHAPES) };
    cp_module_src mods[N];
    for (int s = 0; s < N; s++) {
        cp_kernel_spec k;
        cp_k_attention(&k, SHAPES[s].D, SHAPES[s].qh, SHAPES[s].kvh, SHAPES[s].seq, SHAPES[s].causal,
                       SHAPES[s].dkv_accum, SHAPES[s].dq_atomic);
        cp_k_attention_docs(&k, true);
        char err[2048];
        if (cp_emit(&k, &mods[s], err, sizeof err) != 0) fail_msg("shape %d: %s", s, err);
        cp_kspec_free(&k);
        const size_t nl = strlen(mods[s].name);
        assert_true(nl > 4 && strcmp(mods[s].name + nl - 4, "_dm1") == 0);
        assert_non_null(strstr(mods[s].source, "#define DOCS 1\n"));
        bool fwd = false, bwd = false;
        for (int e = 0; e < mods[s].nentries; e++) {
            fwd |= strncmp(mods[s].entries[e], "attention_fwd_sm90_", 19) == 0;
            bwd |= strncmp(mods[s].entries[e], "attention_bwd_sm90_", 19) == 0;
        }
        assert_true(fwd && bwd);
    }
    cp_jit_opts o;
    memset(&o, 0, sizeof o);
    snprintf(o.arch, sizeof o.arch, "sm_90a");
    snprintf(o.cache_dir, sizeof o.cache_dir, "%s", cache_dir);
    o.threads = 2; /* CI machines have two cores */
    cp_jit_module out[N];
    char err[16384];
    const double t0 = cp_now();
    if (cp_jit_compile(mods, N, &o, out, err, sizeof err) != 0) fail_msg("sm_90a: %s", err);
    for (int i = 0; i < N; i++) {
        assert_int_equal(out[i].nentries, mods[i].nentries);
        for (int e = 0; e < out[i].nentries; e++) {
            const cp_entry_info *x = &out[i].entries[e];
            assert_true(x->registers > 0);
            /* the Hopper entries: sm_90a runs fwd_sm90 and bwd_sm90, not the mma.sync ones of the same module (which
             * test_kernels_compile holds to no spills for sm_80 in the modules plans make) */
            if (!strstr(x->name, "_sm90_")) continue;
            if (x->spill_stores > 0 || x->spill_loads > 0)
                fail_msg("%s spills: %d B stores, %d B loads, %d registers", x->name, x->spill_stores, x->spill_loads,
                         x->registers);
        }
        if (out[i].warnings && strstr(out[i].warnings, "Performance Loss"))
            fail_msg("%s: ptxas notes:\n%s", mods[i].name, out[i].warnings);
        cp_jit_module_free(&out[i]);
        cp_module_src_free(&mods[i]);
    }
    print_message("sm_90a: %d modules with document masks compiled in %.1f s\n", N, cp_now() - t0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_docs_geometry_is_the_twins),
        cmocka_unit_test(test_docs_modules_compile_for_hopper),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
