/* test_gemm_check.c: the GEMM descriptions without a GPU (runtime/gemm.c cp_gemm_check). Every GEMM of every
 * shipped spec's plan, at its shipped length and at 128K on one GPU, passes the check that runs before cuBLASLt;
 * inconsistent descriptions and what FP8 tensor cores cannot take are refused, each with its reason and the GEMM's
 * name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "gemm.h"
#include "plan.h"
#include "spec.h"
#include "util.h"

static char err[CP_ERR_MAX];
static char buf[64]; /* stands for every operand: the check reads no memory */

static void test_shipped_plans(void **state) {
    (void)state;
    const char *specs[] = {"tiny", "llama1b", "llama3b", "llama8b", "qwen32b"};
    const char *lengths[] = {NULL, "train.seq_len=128K"};
    int checked = 0;
    for (size_t i = 0; i < CP_ARRAY_LEN(specs); i++)
        for (size_t l = 0; l < CP_ARRAY_LEN(lengths); l++) {
            const char *sets[2] = {"parallel.gpus=1", lengths[l]};
            cp_spec s;
            cp_plan P;
            if (cp_spec_load(specs[i], sets, lengths[l] ? 2 : 1, &s, err, sizeof err) ||
                cp_plan_build_folded(&s, &P, err, sizeof err))
                fail_msg("%s: %s", specs[i], err);
            for (int k = 0; k < P.nsteps; k++) {
                const cp_step *st = &P.steps[k];
                if (st->kind != CP_OP_GEMM) continue;
                if (cp_gemm_check(&st->gemm, st->what, buf, buf, buf, buf, err, sizeof err))
                    fail_msg("%s%s%s, step %d: %s", specs[i], lengths[l] ? " " : "", lengths[l] ? lengths[l] : "", k,
                             err);
                checked++;
            }
            cp_plan_free(&P);
        }
    printf("  %d GEMM steps checked\n", checked);
    assert_true(checked > 100);
}

static void test_refusals(void **state) {
    (void)state;
    /* x W^T with a bf16 residual, as o_proj: accepted in bf16 and in FP8 */
    const cp_gemm ok = {.m = 256, .n = 128, .k = 64, .lda = 64, .ldb = 64, .ldd = 128, .trans_b = true, .has_c = true};
    assert_int_equal(cp_gemm_check(&ok, "ok", buf, buf, buf, buf, err, sizeof err), 0);
    cp_gemm fp8 = ok;
    fp8.a_type = CP_GEMM_E4M3, fp8.b_type = CP_GEMM_E4M3;
    assert_int_equal(cp_gemm_check(&fp8, "ok_fp8", buf, buf, buf, buf, err, sizeof err), 0);
    fp8.a_type = CP_GEMM_E5M2; /* a gradient */
    assert_int_equal(cp_gemm_check(&fp8, "ok_fp8_grad", buf, buf, buf, buf, err, sizeof err), 0);
    const struct {
        const char *change, *says;
    } bad[] = {
        {"ldb", "ldb is shorter than a row of B as stored"},
        {"acc", "has_c and accumulate together"},
        {"null", "a NULL operand"},
        {"type", "an input type that is not a cp_gemm_type"},
        {"mixed", "one FP8 input and one bf16"},
        {"e5m2", "two E5M2 inputs"},
        {"nn", "outside the x W^T form"},
        {"ta", "outside the x W^T form"},
        {"k", "not a multiple of 16"},
        {"lda", "not a multiple of 16"},
    };
    for (size_t i = 0; i < CP_ARRAY_LEN(bad); i++) {
        cp_gemm p = ok;
        const void *c = buf;
        const char *w = bad[i].change;
        bool f8 = strcmp(w, "ldb") && strcmp(w, "acc") && strcmp(w, "null");
        if (f8) p.a_type = CP_GEMM_E4M3, p.b_type = CP_GEMM_E4M3;
        if (!strcmp(w, "ldb")) p.ldb = 32;
        if (!strcmp(w, "acc")) p.accumulate = true;
        if (!strcmp(w, "null")) c = NULL;
        if (!strcmp(w, "type")) p.b_type = 7;
        if (!strcmp(w, "mixed")) p.b_type = CP_GEMM_BF16;
        if (!strcmp(w, "e5m2")) p.a_type = p.b_type = CP_GEMM_E5M2;
        if (!strcmp(w, "nn")) p.trans_b = false, p.ldb = 128;
        if (!strcmp(w, "ta")) p.trans_a = true, p.lda = 256;
        if (!strcmp(w, "k")) p.k = 72, p.lda = p.ldb = 72;
        if (!strcmp(w, "lda")) p.lda = 72;
        char what[32];
        snprintf(what, sizeof what, "bad_%s", w);
        err[0] = 0;
        assert_int_equal(cp_gemm_check(&p, what, buf, buf, c, buf, err, sizeof err), -1);
        if (!strstr(err, bad[i].says) || !strstr(err, what)) fail_msg("%s: \"%s\" not said: %s", w, bad[i].says, err);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_plans),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
