/* test_profile.c: the sums behind CPGEN_PROFILE's report, from made-up step times on real plans (the events
 * themselves need a GPU): every timed step counted once, under its kind and stream, untimed ones left out. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plan.h"
#include "profile.h"
#include "spec.h"

#define assert_close(a, b) assert_true(fabs((a) - (b)) <= 1e-9 * (fabs(b) + 1e-12))

static void plan(const char *name, const char *const *sets, int nsets, cp_plan *p) {
    cp_spec s;
    char err[CP_ERR_MAX];
    if (cp_spec_load(name, sets, nsets, &s, err, sizeof err)) fail_msg("spec %s: %s", name, err);
    if (cp_plan_build(&s, p, err, sizeof err)) fail_msg("plan %s: %s", name, err);
}

/* Each step at a made-up multiple of its predicted time that depends on the step, so that a step summed twice or
 * into the wrong row shows; every fifth step untimed. */
static void check_sums(const char *name, const char *const *sets, int nsets) {
    cp_plan p;
    plan(name, sets, nsets, &p);
    double *measured = malloc(sizeof(double) * (size_t)p.nsteps);
    double want[CP_STREAM_COUNT] = {0}, want_pred[CP_STREAM_COUNT] = {0}, total = 0;
    int timed = 0, kinds_seen[CP_OP_COUNT] = {0};
    for (int i = 0; i < p.nsteps; i++) {
        bool on = i % 5 != 4;
        measured[i] = on ? p.steps[i].seconds * (1 + i % 7) + 1e-6 : -1;
        if (!on) continue;
        timed++;
        total += measured[i];
        want[p.steps[i].stream] += measured[i];
        want_pred[p.steps[i].stream] += p.steps[i].seconds;
        kinds_seen[p.steps[i].kind] = 1;
    }
    cp_profile_row *rows;
    double busy[CP_STREAM_COUNT], busy_pred[CP_STREAM_COUNT];
    int n = cp_profile_sum(&p, measured, &rows, busy, busy_pred);
    assert_true(n > 0);
    int count = 0;
    double sum = 0;
    for (int r = 0; r < n; r++) {
        count += rows[r].count;
        sum += rows[r].measured;
        if (r) assert_true(rows[r - 1].measured >= rows[r].measured);
        for (int q = 0; q < r; q++) /* one row per kind of step and stream */
            assert_false(rows[q].stream == rows[r].stream && !strcmp(rows[q].key, rows[r].key));
    }
    assert_int_equal(count, timed);
    assert_close(sum, total);
    for (int k = 0; k < CP_STREAM_COUNT; k++) {
        assert_close(busy[k], want[k]);
        assert_close(busy_pred[k], want_pred[k]);
    }
    /* every kind of step the plan has appears under its name */
    for (int k = 0; k < CP_OP_COUNT; k++) {
        if (!kinds_seen[k]) continue;
        bool found = false;
        const char *name = cp_opkind_name((cp_opkind)k);
        for (int r = 0; r < n && !found; r++) found = !strncmp(rows[r].key, name, strlen(name));
        assert_true(found);
    }
    free(rows);
    free(measured);
    cp_plan_free(&p);
}

static void test_one_gpu(void **state) {
    (void)state;
    check_sums("tiny", NULL, 0);
    const char *off[] = {"parallel.offload=all", "train.micro_batches=2"};
    check_sums("tiny", off, 2);
}

static void test_two_gpus(void **state) {
    (void)state;
    const char *sets[] = {"parallel.gpus=2", "model.layers=2", "train.seq_len=16K"};
    check_sums("llama8b", sets, 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_one_gpu), cmocka_unit_test(test_two_gpus)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
