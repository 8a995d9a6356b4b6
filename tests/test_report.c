/* test_report.c: `cpgen report` on a made-up metrics.jsonl: every step drawn, the SVG parses as XML with its four
 * panels and series, a null (a skipped step) leaves a gap, and a bad line or a missing file is named. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"
#include "spec.h"
#include "tmpdir.h"
#include "util.h"
#include "xml_check.h"

static char dir[64], err[CP_ERR_MAX];

static void write_metrics(const char *text) {
    char path[128];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void test_report(void **state) {
    (void)state;
    assert_int_equal(tmpdir_make(dir, sizeof dir, "report"), 0);
    cp_str m = {0};
    for (int s = 1; s <= 20; s++)
        cp_str_printf(&m,
                      "{\"step\":%d,\"loss\":%s,\"norm\":%.3f,\"lr\":0.001,\"tokens_per_s\":%d,"
                      "\"mem_measured\":%lld,\"mem_planned\":%lld,\"skipped\":%s}\n",
                      s, s == 7 ? "null" : (s % 2 ? "5.5" : "4.25"), 1.0 / s, 7000 + 10 * s, (60LL << 30) + s,
                      61LL << 30, s == 7 ? "true" : "false");
    write_metrics(m.data);
    cp_str_free(&m);
    assert_int_equal(cp_report_write(dir, err, sizeof err), 20);
    char path[128];
    snprintf(path, sizeof path, "%s/report.svg", dir);
    size_t len;
    char *svg = cp_read_file(path, &len);
    assert_non_null(svg);
    char why[256];
    if (xml_check(svg, why, sizeof why)) fail_msg("not XML: %s", why);
    const char *panels[] = {"loss", "norm", "tokens", "memory"};
    for (int i = 0; i < 4; i++) assert_int_equal(xml_count(svg, "id", panels[i]), 1);
    assert_int_equal(xml_count(svg, "class", "axis x"), 4);
    const char *series[] = {"loss", "norm", "tokens_per_s", "mem_measured", "mem_planned"};
    for (int i = 0; i < 5; i++) assert_int_equal(xml_count(svg, "data-name", series[i]), 1);
    /* the loss line breaks at the skipped step: two pieces, 6 and 13 points */
    const char *loss = strstr(svg, "data-name=\"loss\" d=\"");
    assert_non_null(loss);
    const char *end = strchr(loss + 20, '"');
    int moves = 0, lines = 0;
    for (const char *p = loss + 20; p < end; p++) moves += *p == 'M', lines += *p == 'L';
    assert_int_equal(moves, 2);
    assert_int_equal(lines, 17);
    free(svg);

    write_metrics("{\"step\":1,\"loss\":2}\n\n{\"step\":2,\"loss\":}\n");
    assert_int_equal(cp_report_write(dir, err, sizeof err), -1);
    assert_non_null(strstr(err, "metrics.jsonl:3: "));
    write_metrics("[1, 2]\n");
    assert_int_equal(cp_report_write(dir, err, sizeof err), -1);
    assert_non_null(strstr(err, "metrics.jsonl:1: not a step's metrics"));
    write_metrics("");
    assert_int_equal(cp_report_write(dir, err, sizeof err), -1);
    assert_non_null(strstr(err, "holds no steps"));
    tmpdir_remove(dir);
    assert_int_equal(cp_report_write(dir, err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot read"));
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_report)};
    return cmocka_run_group_tests_name("report", tests, NULL, NULL);
}
