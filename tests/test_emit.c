/* test_emit.c: the emitter fills {{KEY}} placeholders and rejects templates that break its conventions, with a
 * message naming the template and what is wrong. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "emit.h"
#include "kernels.h"

static const char *GOOD =
    "// module: fam_h{{H}}\n"
    "#include <cuda_bf16.h>\n"
    "extern \"C\" __global__ void fam_fwd_h{{H}}(float *x) { x[0] = {{EPS}}; }\n"
    "extern \"C\" __global__ void fam_bwd_h{{H}} (float *x) { x[0] = {{H}}; }\n";

static void spec_h_eps(cp_kernel_spec *k) {
    cp_kspec_init(k, "fam");
    cp_kspec_set_int(k, "H", 4096);
    cp_kspec_set_double(k, "EPS", 1e-5);
}

static void test_fills_and_finds_entries(void **state) {
    (void)state;
    cp_kernel_spec k;
    spec_h_eps(&k);
    cp_module_src m;
    char err[1024];
    assert_int_equal(cp_emit_text("fam", GOOD, &k, &m, err, sizeof err), 0);
    assert_string_equal(m.name, "fam_h4096");
    assert_string_equal(m.family, "fam");
    assert_int_equal(m.nentries, 2);
    assert_string_equal(m.entries[0], "fam_fwd_h4096");
    assert_string_equal(m.entries[1], "fam_bwd_h4096");
    assert_null(strstr(m.source, "{{"));
    assert_non_null(strstr(m.source, "x[0] = 1.0000000000000001e-05;"));
    char name[CP_KNAME_MAX];
    cp_entry_name("fam", m.name, "fwd", name);
    assert_string_equal(name, "fam_fwd_h4096");
    cp_module_src_free(&m);
    cp_kspec_free(&k);
}

/* Emitting `text` with H and EPS set fails, and the message contains every one of `needles`. */
static void expect_error(const char *text, const char *const *needles, int n) {
    cp_kernel_spec k;
    spec_h_eps(&k);
    cp_module_src m;
    char err[1024] = "";
    int rc = cp_emit_text("fam", text, &k, &m, err, sizeof err);
    cp_kspec_free(&k);
    if (rc == 0) {
        cp_module_src_free(&m);
        fail_msg("emitting succeeded for:\n%s", text);
    }
    assert_int_equal(rc, -1);
    for (int i = 0; i < n; i++)
        if (!strstr(err, needles[i])) fail_msg("message \"%s\" does not mention \"%s\"", err, needles[i]);
}

/* __launch_bounds__ between the qualifiers and the name is not taken for the name. */
static void test_launch_bounds(void **state) {
    (void)state;
    cp_kernel_spec k;
    spec_h_eps(&k);
    const char *t = "// module: fam_h{{H}}\n"
                    "extern \"C\" __global__ void __launch_bounds__(256, 1) fam_fwd_h{{H}}(float *x) { x[0] = {{EPS}}; }\n";
    cp_module_src m;
    char err[1024];
    assert_int_equal(cp_emit_text("fam", t, &k, &m, err, sizeof err), 0);
    assert_int_equal(m.nentries, 1);
    assert_string_equal(m.entries[0], "fam_fwd_h4096");
    cp_module_src_free(&m);
    cp_kspec_free(&k);
}

/* A variant tag goes after the module line's name and every entry's, and nowhere else; only [a-z0-9] is a tag. */
static void test_variant_tag(void **state) {
    (void)state;
    cp_kernel_spec k;
    spec_h_eps(&k);
    snprintf(k.tag, sizeof k.tag, "kvs3");
    cp_module_src m;
    char err[1024];
    assert_int_equal(cp_emit_text("fam", GOOD, &k, &m, err, sizeof err), 0);
    assert_string_equal(m.name, "fam_h4096_kvs3");
    assert_int_equal(m.nentries, 2);
    assert_string_equal(m.entries[0], "fam_fwd_h4096_kvs3");
    assert_string_equal(m.entries[1], "fam_bwd_h4096_kvs3");
    assert_string_equal(m.source, "// module: fam_h4096_kvs3\n"
                                  "#include <cuda_bf16.h>\n"
                                  "extern \"C\" __global__ void fam_fwd_h4096_kvs3(float *x) { x[0] = 1.0000000000000001e-05; }\n"
                                  "extern \"C\" __global__ void fam_bwd_h4096_kvs3 (float *x) { x[0] = 4096; }\n");
    char name[CP_KNAME_MAX];
    cp_entry_name("fam", m.name, "bwd", name);
    assert_string_equal(name, "fam_bwd_h4096_kvs3");
    cp_module_src_free(&m);

    cp_kernel_spec copy; /* a copy keeps the tag */
    cp_kspec_copy(&copy, &k);
    assert_string_equal(copy.tag, "kvs3");
    cp_kspec_free(&copy);

    snprintf(k.tag, sizeof k.tag, "Kvs_3");
    assert_int_equal(cp_emit_text("fam", GOOD, &k, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "variant tag \"Kvs_3\""));
    cp_kspec_free(&k);
}

static void test_unknown_placeholder(void **state) {
    (void)state;
    const char *t = "// module: fam_h{{H}}\n"
                    "extern \"C\" __global__ void fam_fwd_h{{H}}(float *x) { x[0] = {{EPS}} * {{WIDTH}}; }\n";
    const char *n[] = {"templates/fam.cu:2", "{{WIDTH}}"};
    expect_error(t, n, 2);
}

static void test_unused_value(void **state) {
    (void)state;
    const char *t = "// module: fam_h{{H}}\n"
                    "extern \"C\" __global__ void fam_fwd_h{{H}}(float *x) { x[0] = 1; }\n";
    const char *n[] = {"templates/fam.cu", "EPS", "never used"};
    expect_error(t, n, 3);
}

static void test_missing_module_line(void **state) {
    (void)state;
    const char *t = "// fam kernels for {{H}}\n"
                    "extern \"C\" __global__ void fam_fwd_h{{H}}(float *x) { x[0] = {{EPS}}; }\n";
    const char *n[] = {"templates/fam.cu", "module:"};
    expect_error(t, n, 2);
}

static void test_module_name_without_family(void **state) {
    (void)state;
    const char *t = "// module: other_h{{H}}\n"
                    "extern \"C\" __global__ void fam_fwd_h{{H}}(float *x) { x[0] = {{EPS}}; }\n";
    const char *n[] = {"templates/fam.cu", "must start with \"fam\""};
    expect_error(t, n, 2);
}

static void test_entry_breaks_naming_rule(void **state) {
    (void)state;
    const char *wrong_suffix = "// module: fam_h{{H}}\n"
                               "extern \"C\" __global__ void fam_fwd(float *x) { x[0] = {{EPS}} + {{H}}; }\n";
    const char *n1[] = {"templates/fam.cu", "fam_fwd", "fam_<role>_h4096"};
    expect_error(wrong_suffix, n1, 3);
    const char *wrong_family = "// module: fam_h{{H}}\n"
                               "extern \"C\" __global__ void other_fwd_h{{H}}(float *x) { x[0] = {{EPS}}; }\n";
    const char *n2[] = {"templates/fam.cu", "other_fwd_h4096"};
    expect_error(wrong_family, n2, 2);
    const char *no_role = "// module: fam_h{{H}}\n"
                          "extern \"C\" __global__ void fam_h{{H}}(float *x) { x[0] = {{EPS}}; }\n";
    const char *n3[] = {"templates/fam.cu", "fam_h4096"};
    expect_error(no_role, n3, 2);
}

static void test_no_kernel(void **state) {
    (void)state;
    const char *t = "// module: fam_h{{H}}\n"
                    "__device__ float fam_helper(float x) { return x * {{EPS}}; }\n";
    const char *n[] = {"templates/fam.cu", "no extern \"C\" __global__ kernel"};
    expect_error(t, n, 2);
}

static void test_malformed_placeholders(void **state) {
    (void)state;
    const char *lower = "// module: fam_h{{H}}\n"
                        "extern \"C\" __global__ void fam_fwd_h{{H}}(float *x) { x[0] = {{EPS}} * {{width}}; }\n";
    const char *n1[] = {"templates/fam.cu:2", "{{width}}"};
    expect_error(lower, n1, 2);
    const char *unterminated = "// module: fam_h{{H}}\n"
                               "\n"
                               "extern \"C\" __global__ void fam_fwd_h{{H}}(float *x) { x[0] = {{EPS; }\n";
    const char *n2[] = {"templates/fam.cu:3", "malformed placeholder"};
    expect_error(unterminated, n2, 2);
    const char *empty = "// module: fam_h{{H}}\n"
                        "extern \"C\" __global__ void fam_fwd_h{{H}}(float *x) { x[0] = {{EPS}} + {{}}; }\n";
    const char *n3[] = {"templates/fam.cu:2", "malformed placeholder"};
    expect_error(empty, n3, 2);
}

static void test_unknown_template(void **state) {
    (void)state;
    cp_kernel_spec k;
    cp_kspec_init(&k, "no_such_family");
    cp_module_src m;
    char err[1024];
    assert_int_equal(cp_emit(&k, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "templates/no_such_family.cu"));
}

/* A template's #include "x.cuh" of an embedded header is inlined (its placeholders filled, its kernels found), so
 * the emitted module is one self-contained source; other includes stay; a missing header is named. */
static void test_includes_inlined(void **state) {
    (void)state;
    cp_kernel_spec k;
    cp_k_attention(&k, 128, 4, 1, 1000, true, false, false);
    cp_module_src m;
    char err[1024];
    assert_int_equal(cp_emit(&k, &m, err, sizeof err), 0);
    assert_null(strstr(m.source, "#include \"attention_sm90.cuh\""));
    assert_null(strstr(m.source, "{{"));
    assert_non_null(strstr(m.source, "attention_sm90.cuh: the attention forward for Hopper"));
    bool fwd90 = false, bwd90 = false;
    for (int i = 0; i < m.nentries; i++) {
        fwd90 |= strcmp(m.entries[i], "attention_fwd_sm90_d128_q4_kv1_s1000_c1_a0_dqa0") == 0;
        bwd90 |= strcmp(m.entries[i], "attention_bwd_sm90_d128_q4_kv1_s1000_c1_a0_dqa0") == 0;
    }
    assert_true(fwd90 && bwd90);
    cp_module_src_free(&m);
    cp_kspec_free(&k);

    spec_h_eps(&k);
    const char *missing = "// module: fam_h{{H}}\n#include <cuda_bf16.h>\n#include \"no_such_header.cuh\"\n"
                          "extern \"C\" __global__ void fam_fwd_h{{H}}(float *x) { x[0] = {{EPS}}; }\n";
    assert_int_equal(cp_emit_text("fam", missing, &k, &m, err, sizeof err), -1);
    assert_non_null(strstr(err, "templates/no_such_header.cuh"));
    assert_non_null(strstr(err, "templates/fam.cu:3"));
    cp_kspec_free(&k);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_includes_inlined),
        cmocka_unit_test(test_fills_and_finds_entries),
        cmocka_unit_test(test_launch_bounds),
        cmocka_unit_test(test_variant_tag),
        cmocka_unit_test(test_unknown_placeholder),
        cmocka_unit_test(test_unused_value),
        cmocka_unit_test(test_missing_module_line),
        cmocka_unit_test(test_module_name_without_family),
        cmocka_unit_test(test_entry_breaks_naming_rule),
        cmocka_unit_test(test_no_kernel),
        cmocka_unit_test(test_malformed_placeholders),
        cmocka_unit_test(test_unknown_template),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
