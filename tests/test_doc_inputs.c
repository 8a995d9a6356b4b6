/* test_doc_inputs.c: a step's packed-document inputs (runtime/doc_inputs.c) without a GPU. The data and the plan must
 * agree on documents: a plan built from a spec whose data.documents was never resolved (it plans one stream) meets a
 * dataset that masks synthetic:packed's documents, and adding its micro-batch is refused with the cause named; from
 * the resolved spec every row gets its document's bounds and RoPE position (restarting at each document), and the
 * step's attention work is the documents' tile fraction, as cp_docs_tile_work counts it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"
#include "doc_inputs.h"
#include "plan.h"
#include "spec.h"
#include "util.h"

static char err[CP_ERR_MAX];
/* the one rank of one replica, no ring */
static const cp_data_slice ONE_GPU = {.replica = 0, .replicas = 1, .ring_pos = 0, .ring = 1, .rank = 0, .gpus = 1};

static void plan_of(cp_plan *P, bool resolve) {
    const char *sets[] = {"data.source=synthetic:packed", "train.micro_batches=2", "parallel.gpus=1"};
    cp_spec s;
    if (cp_spec_load("tiny", sets, 3, &s, err, sizeof err)) fail_msg("%s", err);
    if (resolve && cp_data_resolve_documents(&s, err, sizeof err)) fail_msg("%s", err);
    if (cp_plan_build(&s, P, err, sizeof err)) fail_msg("%s", err);
}

static void test_unresolved_plan_refused(void **state) {
    (void)state;
    cp_plan P;
    plan_of(&P, false);
    assert_false(P.docs);
    cp_dataset d;
    if (cp_dataset_open(&d, &P.spec, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(d.documents, CP_DOCS_MASK); /* the data cuts the documents whatever the plan says */
    int32_t *tok = cp_xmalloc(sizeof(int32_t) * 2 * (size_t)P.T);
    const cp_data_slice sl = ONE_GPU;
    if (cp_dataset_next_slice(&d, &sl, tok, tok + P.T, err, sizeof err)) fail_msg("%s", err);
    cp_doc_inputs di;
    cp_doc_inputs_init(&di, &P);
    err[0] = 0;
    assert_int_equal(cp_doc_inputs_add(&di, &P, &sl, &d, err, sizeof err), -1);
    if (!strstr(err, "the data's documents are masked and the plan's one stream") ||
        !strstr(err, "cp_data_resolve_documents"))
        fail_msg("the refusal does not name its cause: %s", err);
    cp_doc_inputs_free(&di);
    cp_dataset_close(&d);
    free(tok);
    cp_plan_free(&P);
}

static void test_resolved_bounds(void **state) {
    (void)state;
    cp_plan P;
    plan_of(&P, true);
    assert_true(P.docs && P.doc_positions);
    assert_int_equal(P.T, P.S); /* one GPU: its rows are the whole sequence */
    cp_dataset d;
    if (cp_dataset_open(&d, &P.spec, err, sizeof err)) fail_msg("%s", err);
    int32_t *tok = cp_xmalloc(sizeof(int32_t) * 2 * (size_t)P.T);
    cp_doc_inputs di;
    cp_doc_inputs_init(&di, &P);
    double work_sum = 0;
    for (int b = 0; b < 2; b++) {
        const cp_data_slice sl = ONE_GPU;
        if (cp_dataset_next_slice(&d, &sl, tok, tok + P.T, err, sizeof err)) fail_msg("%s", err);
        if (cp_doc_inputs_add(&di, &P, &sl, &d, err, sizeof err)) fail_msg("%s", err);
        const cp_docs *docs = &d.docs;
        const int32_t *st = di.start + (size_t)b * (size_t)P.S, *en = di.end + (size_t)b * (size_t)P.S,
                      *pos = di.pos + (size_t)b * (size_t)P.T;
        /* every position's document from the tokens alone: it starts after the last end-of-document id before it */
        int64_t first = 0;
        for (int64_t p = 0; p < P.S; p++) {
            if (p > 0 && tok[p - 1] == d.eod) first = p;
            if (st[p] != first) fail_msg("micro-batch %d, position %lld: document starts at %d, not %lld", b,
                                         (long long)p, st[p], (long long)first);
            if (en[p] <= p || en[p] > P.S || (en[p] < P.S && tok[en[p] - 1] != d.eod))
                fail_msg("micro-batch %d, position %lld: document ends at %d", b, (long long)p, en[p]);
            if (pos[p] != p - first)
                fail_msg("micro-batch %d, position %lld: RoPE position %d", b, (long long)p, pos[p]);
        }
        double kept;
        work_sum += cp_docs_tile_work(docs, P.S, 128, 128, &kept);
    }
    assert_true(di.work > 0 && di.work <= 1);
    assert_true(fabs(di.work - work_sum / 2) < 1e-12);
    cp_doc_inputs_free(&di);
    cp_dataset_close(&d);
    free(tok);
    cp_plan_free(&P);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unresolved_plan_refused),
        cmocka_unit_test(test_resolved_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
