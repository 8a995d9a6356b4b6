/* test_report.c: `cpgen report` on a made-up metrics.jsonl: every step drawn, the SVG parses as XML with its four
 * panels and series, a null (a skipped step) leaves a gap, a bad line is skipped and named, a missing file is named;
 * a crashed run's cut last line, steps and values near the limits of a double, a long run's size, and the validation
 * loss of the steps that have one beside the training loss. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

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

    /* a line that is not a step's metrics is skipped and named; the good ones are drawn */
    write_metrics("{\"step\":1,\"loss\":2}\n\n{\"step\":2,\"loss\":}\n");
    assert_int_equal(cp_report_write(dir, err, sizeof err), 1);
    assert_non_null(strstr(err, "metrics.jsonl: skipped 1 line that is not a step's metrics (line 3: "));
    write_metrics("[1, 2]\n");
    assert_int_equal(cp_report_write(dir, err, sizeof err), -1);
    assert_non_null(strstr(err, "metrics.jsonl:1: not a step's metrics"));
    write_metrics("");
    assert_int_equal(cp_report_write(dir, err, sizeof err), -1);
    assert_non_null(strstr(err, "holds no steps"));
    tmpdir_remove(dir);
    assert_int_equal(cp_report_write(dir, err, sizeof err), -1);
    assert_non_null(strstr(err, "cannot read"));
    assert_int_equal(cp_report_write("", err, sizeof err), -1); /* not /metrics.jsonl */
    assert_non_null(strstr(err, "the out_dir is empty"));
}

static char *read_svg(size_t *len) {
    char path[128];
    snprintf(path, sizeof path, "%s/report.svg", dir);
    char *svg = cp_read_file(path, len);
    assert_non_null(svg);
    char why[256];
    if (xml_check(svg, why, sizeof why)) fail_msg("not XML: %s", why);
    return svg;
}

/* A run that crashed while writing a step leaves its last line cut short: the steps before it are drawn, and the
 * note says what was skipped. */
static void test_cut_last_line(void **state) {
    (void)state;
    assert_int_equal(tmpdir_make(dir, sizeof dir, "report"), 0);
    write_metrics("{\"step\":1,\"loss\":6.2,\"tokens_per_s\":900}\n{\"step\":2,\"loss\":5.9,\"tokens_per_s\":910}\n"
                  "{\"step\":3,\"loss\":5.7,\"tokens_per_s\":905}\n{\"step\":4,\"lo");
    int steps = cp_report_write(dir, err, sizeof err);
    if (steps != 3) fail_msg("%d steps drawn: %s", steps, err);
    assert_non_null(strstr(err, "metrics.jsonl:4: the last line is cut short"));
    size_t len;
    free(read_svg(&len));
    tmpdir_remove(dir);
}

/* Steps and values near the limits of a double: the lines or values are skipped with a note, the rest is drawn,
 * and the picture holds no NaN or infinity. Run in a child with an alarm and a cap on the file size, since drawing
 * them once wrote report.svg without end; the child checks without cmocka, whose failure would carry on with the
 * other tests in the child. */
#define CHILD_CHECK(cond, ...)                                                                                       \
    do {                                                                                                             \
        if (!(cond)) {                                                                                               \
            fprintf(stderr, __VA_ARGS__);                                                                            \
            fprintf(stderr, " (%s)\n", #cond);                                                                       \
            _exit(1);                                                                                                \
        }                                                                                                            \
    } while (0)

static char *child_svg(size_t *len) {
    char path[128], why[256];
    snprintf(path, sizeof path, "%s/report.svg", dir);
    char *svg = cp_read_file(path, len);
    CHILD_CHECK(svg, "no report.svg");
    CHILD_CHECK(!xml_check(svg, why, sizeof why), "not XML: %s", why);
    return svg;
}

static void absurd_values_child(void) {
    write_metrics("{\"step\": 1e16, \"loss\": 1}\n");
    int steps = cp_report_write(dir, err, sizeof err);
    CHILD_CHECK(steps == -1 && strstr(err, "metrics.jsonl:1: \"step\": 1e+16 is not a step"), "a lone step 1e16: %s",
                err);
    write_metrics("{\"step\":1,\"loss\":2,\"norm\":1,\"tokens_per_s\":1000,\"mem_measured\":1e9,\"mem_planned\":2e9}\n"
                  "{\"step\":1e16,\"loss\":1}\n"
                  "{\"step\":-1,\"loss\":1}\n"
                  "{\"step\":2.5,\"loss\":1}\n"
                  "{\"step\":2,\"loss\":1e300,\"norm\":1e999,\"tokens_per_s\":1e308}\n"
                  "{\"step\":3,\"loss\":1.5,\"norm\":0.5,\"tokens_per_s\":1100,\"mem_measured\":-1e300}\n");
    steps = cp_report_write(dir, err, sizeof err);
    CHILD_CHECK(steps == 3, "%d steps drawn: %s", steps, err);
    CHILD_CHECK(strstr(err, "skipped 3 lines that are not a step's metrics (line 2: \"step\": 1e+16"), "note: %s", err);
    CHILD_CHECK(strstr(err, "4 values out of range left as gaps (line 5: loss = 1e+300"), "note: %s", err);
    size_t len;
    char *svg = child_svg(&len);
    CHILD_CHECK(len < 64 * 1024 && !strstr(svg, "nan") && !strstr(svg, "inf"), "report.svg of %zu bytes", len);
    free(svg);
    /* one step far out: an axis of no width around it */
    write_metrics("{\"step\":2147483647,\"loss\":1e15}\n{\"step\":2147483647,\"loss\":-1e15}\n");
    steps = cp_report_write(dir, err, sizeof err);
    CHILD_CHECK(steps == 2, "%d steps drawn: %s", steps, err);
    svg = child_svg(&len);
    CHILD_CHECK(len < 64 * 1024, "report.svg of %zu bytes", len);
    free(svg);
}

static void test_absurd_values(void **state) {
    (void)state;
    assert_int_equal(tmpdir_make(dir, sizeof dir, "report"), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(30);
        struct rlimit fsize = {.rlim_cur = 16 << 20, .rlim_max = 16 << 20}, as = {2ull << 30, 2ull << 30};
        if (setrlimit(RLIMIT_FSIZE, &fsize) || setrlimit(RLIMIT_AS, &as)) _exit(3);
        absurd_values_child();
        _exit(0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    tmpdir_remove(dir);
    if (WIFSIGNALED(st))
        fail_msg("the report was killed by signal %d%s", WTERMSIG(st),
                 WTERMSIG(st) == SIGALRM ? " (it did not end)" : WTERMSIG(st) == SIGXFSZ ? " (report.svg grew past 16 MiB)" : "");
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* A long run's picture stays small: at most a few thousand points per line, and a spike among 100000 steps still
 * shows. */
static void test_bounded_output(void **state) {
    (void)state;
    assert_int_equal(tmpdir_make(dir, sizeof dir, "report"), 0);
    cp_str m = {0};
    for (int s = 1; s <= 100000; s++)
        cp_str_printf(&m, "{\"step\":%d,\"loss\":%g,\"norm\":1,\"tokens_per_s\":1000,\"mem_measured\":1e9}\n", s,
                      s == 54321 ? 100.0 : 2.0 + 1.0 / s);
    write_metrics(m.data);
    cp_str_free(&m);
    err[0] = 0;
    assert_int_equal(cp_report_write(dir, err, sizeof err), 100000);
    size_t len;
    char *svg = read_svg(&len);
    if (len > 512 * 1024) fail_msg("report.svg is %zu bytes for 100000 steps", len);
    assert_string_equal(err, ""); /* nothing was skipped */
    const char *loss = strstr(svg, "data-name=\"loss\" d=\"");
    assert_non_null(loss);
    int points = 0;
    double top = 1e9;
    for (const char *p = loss + 20; *p != '"'; p++) {
        if (*p != 'M' && *p != 'L') continue;
        double x, y;
        assert_int_equal(sscanf(p + 1, "%lf %lf", &x, &y), 2);
        points++;
        if (y < top) top = y;
    }
    assert_true(points <= 4096);
    assert_true(top < 80 + 30); /* the spike reaches the top of the loss panel (it starts at y = 80) */
    free(svg);
    tmpdir_remove(dir);
}

/* The validation loss, logged after some steps only (val_loss on those steps' lines): drawn in the loss panel beside
 * the training loss, one line through its points and a mark at each (a single evaluation still shows), under a
 * legend naming both; the panel's range takes its points in; a null (a loss that was not finite) is left out. A run
 * without it draws no such series, mark or legend. */
static void test_validation_loss(void **state) {
    (void)state;
    assert_int_equal(tmpdir_make(dir, sizeof dir, "report"), 0);
    cp_str m = {0};
    for (int s = 1; s <= 20; s++) {
        cp_str_printf(&m, "{\"step\":%d,\"loss\":%.2f,\"norm\":1,\"tokens_per_s\":1000,", s, 5.5 - 0.05 * s);
        /* evaluated after steps 5, 10, 15 (null), 20; the one after step 10 far above the training loss */
        if (s % 5 == 0)
            cp_str_printf(&m, "\"val_loss\":%s,\"val_tokens\":4096,", s == 15 ? "null" : s == 10 ? "9.5" : "5.25");
        cp_str_printf(&m, "\"skipped\":false}\n");
    }
    write_metrics(m.data);
    cp_str_free(&m);
    assert_int_equal(cp_report_write(dir, err, sizeof err), 20);
    assert_string_equal(err, "");
    size_t len;
    char *svg = read_svg(&len);
    assert_int_equal(xml_count(svg, "data-name", "val_loss"), 1);
    assert_int_equal(xml_count(svg, "data-points", "val_loss"), 1);
    assert_non_null(strstr(svg, ">loss: training and validation<"));
    assert_non_null(strstr(svg, ">loss (training)<"));
    assert_non_null(strstr(svg, ">val_loss (data.val)<"));
    /* its line: 3 points, one pen down; its marks: 3, all inside the loss panel (y 80 to 370), 9.5 at the top */
    const char *line = strstr(svg, "data-name=\"val_loss\" d=\"");
    assert_non_null(line);
    int moves = 0, draws = 0;
    for (const char *p = line + 24; *p != '"'; p++) moves += *p == 'M', draws += *p == 'L';
    assert_int_equal(moves, 1);
    assert_int_equal(draws, 2);
    const char *pts = strstr(svg, "data-points=\"val_loss\"");
    const char *end = strstr(pts, "</g>");
    int marks = 0;
    double top = 1e9;
    for (const char *p = strstr(pts, "<circle"); p && p < end; p = strstr(p + 1, "<circle")) {
        double cx, cy;
        assert_int_equal(sscanf(p, "<circle cx=\"%lf\" cy=\"%lf\"", &cx, &cy), 2);
        if (!(cy >= 80 && cy <= 370 && cx >= 90 && cx <= 550)) fail_msg("a mark at %g, %g: outside the loss panel", cx, cy);
        top = fmin(top, cy);
        marks++;
    }
    assert_int_equal(marks, 3);
    assert_true(top < 80 + 30); /* 9.5 is the panel's highest value */
    free(svg);

    /* one evaluation alone: a mark, though its line has no length */
    write_metrics("{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":4,\"val_loss\":4.5,\"val_tokens\":10}\n");
    assert_int_equal(cp_report_write(dir, err, sizeof err), 2);
    svg = read_svg(&len);
    pts = strstr(svg, "data-points=\"val_loss\"");
    assert_non_null(pts);
    assert_non_null(strstr(pts, "<circle"));
    free(svg);

    /* none: as before */
    write_metrics("{\"step\":1,\"loss\":5}\n{\"step\":2,\"loss\":4}\n");
    assert_int_equal(cp_report_write(dir, err, sizeof err), 2);
    svg = read_svg(&len);
    assert_int_equal(xml_count(svg, "data-name", "val_loss"), 0);
    assert_null(strstr(svg, "data-points"));
    assert_null(strstr(svg, "validation"));
    free(svg);
    tmpdir_remove(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_report), cmocka_unit_test(test_cut_last_line),
                                       cmocka_unit_test(test_absurd_values), cmocka_unit_test(test_bounded_output),
                                       cmocka_unit_test(test_validation_loss)};
    return cmocka_run_group_tests_name("report", tests, NULL, NULL);
}
