/* test_ktune.c: kernel variants (kernels.h cp_kvariants: the Hopper attention forward's K/V ring depths) and what
 * emitting one gives. No GPU, no NVRTC. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emit.h"
#include "kernels.h"
#include "kernels_attn.h"
#include "util.h"

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
        cp_k_attention(&k, want[c].D, 24, 8, 32768, true, false);
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
    cp_k_attention(&k, 128, 4, 1, 1000, false, true);
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
    cp_k_attention(&plain, 128, 24, 8, 32768, true, false);
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
    assert_string_equal(mp.name, "attention_d128_q24_kv8_s32768_c1_a0");
    assert_non_null(strstr(mp.source, "#define HSTAGES 2 "));
    assert_string_equal(m3.name, "attention_d128_q24_kv8_s32768_c1_a0_kvs3");
    assert_int_equal(m3.nentries, mp.nentries);
    for (int e = 0; e < m3.nentries; e++) {
        char want[CP_KNAME_MAX + 8];
        snprintf(want, sizeof want, "%s_kvs3", mp.entries[e]);
        assert_string_equal(m3.entries[e], want);
    }
    assert_non_null(strstr(m3.source, "#define HSTAGES 3 "));
    assert_non_null(strstr(m3.source, "attention_fwd_sm90_d128_q24_kv8_s32768_c1_a0_kvs3("));
    cp_module_src_free(&mp), cp_module_src_free(&md), cp_module_src_free(&m3);
    cp_kspec_free(&plain), cp_kspec_free(&def), cp_kspec_free(&three);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_variants),
        cmocka_unit_test(test_variant_emits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
