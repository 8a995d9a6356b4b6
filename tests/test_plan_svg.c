/* test_plan_svg.c: `cpgen plan --svg`: the live bytes per step behind it peak where the plan says, and the SVG
 * parses as XML with both panels, their axes, the series of each category that holds memory, the capacity lines
 * and a peak marker at the plan's peak step and bytes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "plan.h"
#include "spec.h"
#include "util.h"
#include "xml_check.h"

static char err[CP_ERR_MAX];

static void plan_of(const char *name, const char *const *sets, int nsets, cp_plan *p) {
    cp_spec s;
    if (cp_spec_load(name, sets, nsets, &s, err, sizeof err)) fail_msg("spec %s: %s", name, err);
    if (cp_plan_build(&s, p, err, sizeof err)) fail_msg("plan %s: %s", name, err);
}

static char *draw(const cp_plan *p) {
    char path[] = "/tmp/cpgen-test-svg-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    if (cp_plan_svg(p, path, err, sizeof err)) fail_msg("%s", err);
    size_t len;
    char *text = cp_read_file(path, &len);
    assert_non_null(text);
    unlink(path);
    char why[256];
    if (xml_check(text, why, sizeof why)) fail_msg("not XML: %s", why);
    return text;
}

static void test_live_peak(void **state) {
    (void)state;
    const char *sets[] = {"parallel.gpus=2", "model.layers=3", "train.seq_len=64K"};
    cp_plan p;
    plan_of("llama8b", sets, 3, &p);
    int64_t *live = cp_plan_live_by_cat(&p, CP_SPACE_GPU), best = 0;
    int at = -1;
    for (int s = 0; s < p.nsteps; s++) {
        int64_t t = 0;
        for (int c = 0; c < CP_CAT_COUNT; c++) {
            assert_true(live[(size_t)s * CP_CAT_COUNT + c] >= 0);
            t += live[(size_t)s * CP_CAT_COUNT + c];
        }
        if (t > best) best = t, at = s;
    }
    assert_int_equal(best, p.gpu_live_peak);
    assert_int_equal(at, p.peak_step);
    for (int c = 0; c < CP_CAT_COUNT; c++) assert_int_equal(live[(size_t)at * CP_CAT_COUNT + c], p.cat_at_peak[c]);
    /* parameters are live at every step, and the arena holds at least what is live */
    for (int s = 0; s < p.nsteps; s++) assert_true(live[(size_t)s * CP_CAT_COUNT + CP_CAT_PARAMS] > 0);
    assert_true(p.gpu_arena >= best);
    free(live);
    cp_plan_free(&p);
}

static void test_svg(void **state) {
    (void)state;
    const char *sets[] = {"parallel.gpus=1", "train.seq_len=128K"};
    cp_plan p;
    plan_of("llama3b", sets, 2, &p);
    char *svg = draw(&p);
    assert_non_null(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_non_null(strstr(svg, "&lt;embedded&gt;/llama3b.lua")); /* escaped */
    assert_int_equal(xml_count(svg, "id", "gpu"), 1);
    assert_int_equal(xml_count(svg, "id", "host"), 1);
    assert_int_equal(xml_count(svg, "class", "axis x"), 2);
    assert_int_equal(xml_count(svg, "class", "axis y"), 2);
    assert_int_equal(xml_count(svg, "id", "capacity"), 2);
    assert_int_equal(xml_count(svg, "id", "planned-peak"), 2);
    assert_int_equal(xml_count(svg, "id", "peak-marker"), 1);
    /* on one GPU with the optimizer there: parameters, gradients, optimizer state, checkpoints, activations */
    const char *series[] = {"parameters (shard + gathered layers)", "gradients (shard + layer in backward)",
                            "optimizer state (master, AdamW)", "checkpoints", "activations",
                            "reserve (CUDA context, libraries, NCCL)"};
    for (size_t i = 0; i < CP_ARRAY_LEN(series); i++)
        if (xml_count(svg, "data-name", series[i]) != 1) fail_msg("series %s: %d", series[i], xml_count(svg, "data-name", series[i]));
    char want[128];
    snprintf(want, sizeof want, "data-step=\"%d\" data-bytes=\"%lld\"", p.peak_step,
             (long long)(p.gpu_live_peak + cp_plan_reserve(&p)));
    if (!strstr(svg, want)) fail_msg("no peak marker with %s", want);
    free(svg);
    cp_plan_free(&p);

    /* every checkpoint offloaded: the host panel holds them */
    const char *off[] = {"parallel.offload=all"};
    plan_of("tiny", off, 1, &p);
    svg = draw(&p);
    const char *host = strstr(svg, "<g id=\"host\">");
    assert_non_null(host);
    assert_non_null(strstr(host, "data-name=\"checkpoints\""));
    free(svg);
    assert_int_equal(cp_plan_svg(&p, "/nonexistent/dir/m.svg", err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot write /nonexistent/dir/m.svg"));
    cp_plan_free(&p);
}

static void test_xml_check_catches(void **state) {
    (void)state;
    char why[256];
    assert_int_equal(xml_check("<svg><g></svg>", why, sizeof why), -1);
    assert_int_equal(xml_check("<svg><text>a < b</text></svg>", why, sizeof why), -1);
    assert_int_equal(xml_check("<svg a=1/>", why, sizeof why), -1);
    assert_int_equal(xml_check("<svg>&nbsp;</svg>", why, sizeof why), -1);
    assert_int_equal(xml_check("<svg/><svg/>", why, sizeof why), -1);
    assert_int_equal(xml_check("<?xml version=\"1.0\"?>\n<svg a=\"1\"><g><text>&lt;x&gt;</text></g></svg>\n", why,
                               sizeof why),
                     0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xml_check_catches),
        cmocka_unit_test(test_live_peak),
        cmocka_unit_test(test_svg),
    };
    return cmocka_run_group_tests_name("plan_svg", tests, NULL, NULL);
}
