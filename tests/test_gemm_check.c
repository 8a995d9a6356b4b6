/* test_gemm_check.c: the GEMM descriptions without a GPU (runtime/gemm.c cp_gemm_check). Every GEMM of every
 * shipped spec's plan, at its shipped length and at 128K on one GPU, in bf16 and with FP8 (per-tensor and block
 * scales), passes the check that runs before cuBLASLt; inconsistent descriptions and what FP8 tensor cores cannot
 * take (block scales included) are refused, each with its reason and the GEMM's name. */
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
    /* bf16, and FP8 with block (the default), per-tensor and row scales (the GEMMs cp_plan_fp8_gemm makes) */
    const char *precisions[][2] = {{NULL, NULL},
                                   {"train.precision=fp8", NULL},
                                   {"train.precision=fp8", "train.fp8_scaling=tensor"},
                                   {"train.precision=fp8", "train.fp8_scaling=row"}};
    const char *names[] = {"", " fp8", " fp8 tensor", " fp8 row"};
    int checked = 0, blocks = 0, rows = 0;
    for (size_t i = 0; i < CP_ARRAY_LEN(specs); i++)
        for (size_t l = 0; l < CP_ARRAY_LEN(lengths); l++)
            for (size_t f = 0; f < CP_ARRAY_LEN(precisions); f++) {
                const char *sets[4] = {"parallel.gpus=1"};
                int nsets = 1;
                if (lengths[l]) sets[nsets++] = lengths[l];
                for (int j = 0; j < 2; j++)
                    if (precisions[f][j]) sets[nsets++] = precisions[f][j];
                char what[160];
                snprintf(what, sizeof what, "%s%s%s%s", specs[i], lengths[l] ? " " : "", lengths[l] ? lengths[l] : "",
                         names[f]);
                cp_spec s;
                cp_plan P;
                if (cp_spec_load(specs[i], sets, nsets, &s, err, sizeof err) ||
                    cp_plan_build_folded(&s, &P, err, sizeof err))
                    fail_msg("%s: %s", what, err);
                for (int k = 0; k < P.nsteps; k++) {
                    const cp_step *st = &P.steps[k];
                    if (st->kind != CP_OP_GEMM) continue;
                    if (cp_gemm_check(&st->gemm, st->what, buf, buf, buf, buf, err, sizeof err))
                        fail_msg("%s, step %d: %s", what, k, err);
                    checked++;
                    blocks += st->gemm.a_scale == CP_GEMM_SCALE_1D;
                    rows += st->gemm.a_scale == CP_GEMM_SCALE_ROW;
                }
                cp_plan_free(&P);
            }
    printf("  %d GEMM steps checked, %d of them block-scaled, %d row-scaled\n", checked, blocks, rows);
    assert_true(checked > 100);
    assert_true(blocks > 100); /* the block-scaled plans do put GEMMs on block scales */
    assert_true(rows > 100);   /* and the row-scaled ones on row scales */
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
    /* block scales (k a multiple of 128): 1 x 128 with 128 x 128 either way round, and 1 x 128 on both */
    cp_gemm blk = fp8;
    blk.k = blk.lda = blk.ldb = 256;
    const uint8_t modes[][2] = {{CP_GEMM_SCALE_1D, CP_GEMM_SCALE_2D},
                                {CP_GEMM_SCALE_2D, CP_GEMM_SCALE_1D},
                                {CP_GEMM_SCALE_1D, CP_GEMM_SCALE_1D}};
    for (size_t i = 0; i < CP_ARRAY_LEN(modes); i++) {
        blk.a_scale = modes[i][0], blk.b_scale = modes[i][1];
        if (cp_gemm_check(&blk, "ok_blk", buf, buf, buf, buf, err, sizeof err)) fail_msg("%s", err);
    }
    /* row scales on both inputs: applied after the sums, so any k and fast accumulation too */
    cp_gemm row = fp8;
    row.a_scale = row.b_scale = CP_GEMM_SCALE_ROW;
    row.fast_accum = true;
    if (cp_gemm_check(&row, "ok_row", buf, buf, buf, buf, err, sizeof err)) fail_msg("%s", err);
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
        /* block scales (the rest of each is a valid block-scaled GEMM: k 256, A 1 x 128, B in tiles) */
        {"blk_mode", "not a cp_gemm_scale"},
        {"blk_bf16", "block scales for bf16 inputs"},
        {"blk_half", "one input scaled per tensor and the other by blocks"},
        {"blk_half_b", "one input scaled per tensor and the other by blocks"},
        {"blk_tiles", "both inputs scaled by 128 x 128 tiles"},
        {"blk_k", "block scales with k not a multiple of 128"},
        {"blk_fast", "block scales with fast accumulation"},
        {"blk_row", "one input scaled per row and the other by blocks"},
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
        if (!strncmp(w, "blk_", 4))
            p.k = p.lda = p.ldb = 256, p.a_scale = CP_GEMM_SCALE_1D, p.b_scale = CP_GEMM_SCALE_2D;
        if (!strcmp(w, "blk_mode")) p.b_scale = CP_GEMM_SCALE_ROW + 1;
        if (!strcmp(w, "blk_bf16")) p.a_type = p.b_type = CP_GEMM_BF16;
        if (!strcmp(w, "blk_half")) p.b_scale = CP_GEMM_SCALE_TENSOR;
        if (!strcmp(w, "blk_half_b")) p.a_scale = CP_GEMM_SCALE_TENSOR;
        if (!strcmp(w, "blk_tiles")) p.a_scale = CP_GEMM_SCALE_2D;
        if (!strcmp(w, "blk_k")) p.k = p.lda = p.ldb = 208; /* a multiple of 16, not of 128 */
        if (!strcmp(w, "blk_fast")) p.fast_accum = true;
        if (!strcmp(w, "blk_row")) p.b_scale = CP_GEMM_SCALE_ROW;
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
