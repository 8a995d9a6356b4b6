/* test_trace.c: the step trace (`cpgen run --trace`) from made-up step times on real plans (the events need a GPU):
 * the tiny spec's plan (with copies and two micro-batches as well) and a plan of 2 GPUs whose ranks' parts are
 * merged. The file parses, tools/trace_check.py passes it (every plan step once, streams' sums, the step time, the
 * waits, memory), its memory counter peaks at the plan's most bytes live, its flows join existing slices; and the
 * checker fails a trace with a step missing, a step twice, a flow off its slice or a total 5% off the step time. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "exec.h"
#include "json.h"
#include "plan.h"
#include "source_tree.h"
#include "spec.h"
#include "tmpdir.h"
#include "trace.h"
#include "util.h"

static char dir[64], err[CP_ERR_MAX];

static void plan(const char *name, const char *const *sets, int nsets, cp_plan *p) {
    cp_spec s;
    if (cp_spec_load(name, sets, nsets, &s, err, sizeof err)) fail_msg("spec %s: %s", name, err);
    if (cp_plan_build(&s, p, err, sizeof err)) fail_msg("plan %s: %s", name, err);
}

/* The checker's exit status (0 ok) and its output. */
static int checker(const char *path, const char *extra, char *out, size_t n) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "python3 tools/trace_check.py %s %s 2>&1", path, extra);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t len = fread(out, 1, n - 1, f);
    out[len] = 0;
    int st = pclose(f);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* Made-up times per plan step (a multiple of the prediction that differs by step and rank, so a slice drawn from
 * the wrong step or rank shows), placed by the same rules the GPU follows: stream order, waits, joins. */
static void made_up_times(const cp_plan *P, const cp_trace_wait *w, int nw, int rank, double *start, double *end) {
    double *secs = malloc(sizeof *secs * (size_t)P->nsteps);
    for (int i = 0; i < P->nsteps; i++) secs[i] = P->steps[i].seconds * (1 + 0.1 * ((i * 7 + rank) % 5)) + 1e-6;
    cp_trace_schedule(P, w, nw, secs, start, end);
    free(secs);
}

static double last_end(const cp_plan *P, const double *end) {
    double t = 0;
    for (int k = 0; k < cp_trace_instances(P); k++) t = fmax(t, end[k]);
    return t;
}

static cp_json load(const char *path) {
    size_t len;
    char *text = cp_read_file(path, &len);
    assert_non_null(text);
    cp_json j;
    if (cp_json_parse(text, len, &j, err, sizeof err)) fail_msg("%s is not JSON: %s", path, err);
    free(text);
    return j;
}

static int64_t num_i(const cp_json *o, const char *key) {
    const cp_json *v = cp_json_get(o, key);
    assert_non_null(v);
    assert_int_equal(v->type, CP_JSON_NUMBER);
    return (int64_t)v->number;
}

static double num(const cp_json *o, const char *key) {
    const cp_json *v = cp_json_get(o, key);
    assert_non_null(v);
    assert_int_equal(v->type, CP_JSON_NUMBER);
    return v->number;
}

static const char *str(const cp_json *o, const char *key) {
    const cp_json *v = cp_json_get(o, key);
    return v && v->type == CP_JSON_STRING ? v->string : "";
}

/* What the C side reads back: slices per process, flows each starting and ending at a slice's start on the stream
 * named, and the memory counter's peak per process. */
typedef struct {
    int slices[8], flows, counters;
    int64_t peak[8];
    char names[8][64];
} readback;

static readback read_trace(const char *path) {
    cp_json j = load(path);
    const cp_json *ev = cp_json_get(&j, "traceEvents");
    assert_non_null(ev);
    readback rb;
    memset(&rb, 0, sizeof rb);
    for (int k = 0; k < ev->n; k++) {
        const cp_json *e = &ev->items[k];
        const char *ph = str(e, "ph");
        int pid = (int)num_i(e, "pid");
        assert_true(pid >= 0 && pid < 8);
        if (!strcmp(ph, "X")) rb.slices[pid]++;
        if (!strcmp(ph, "M") && !strcmp(str(e, "name"), "process_name"))
            snprintf(rb.names[pid], sizeof rb.names[pid], "%s", str(cp_json_get(e, "args"), "name"));
        if (!strcmp(ph, "C")) {
            rb.counters++;
            rb.peak[pid] = CP_MAX(rb.peak[pid], num_i(cp_json_get(e, "args"), "bytes"));
        }
        if (strcmp(ph, "s") && strcmp(ph, "f")) continue;
        if (!strcmp(ph, "s")) rb.flows++;
        bool found = false;
        for (int q = 0; q < ev->n && !found; q++) {
            const cp_json *x = &ev->items[q];
            found = !strcmp(str(x, "ph"), "X") && num_i(x, "pid") == pid && num_i(x, "tid") == num_i(e, "tid") &&
                    num(x, "ts") == num(e, "ts");
        }
        if (!found) fail_msg("%s: flow %lld (%s) is on no slice", path, (long long)num_i(e, "id"), ph);
    }
    cp_json_free(&j);
    return rb;
}

static int64_t live_at_peak(const cp_plan *P) {
    int64_t *live = cp_plan_live_by_cat(P, CP_SPACE_GPU), t = 0;
    for (int c = 0; c < CP_CAT_COUNT; c++) t += live[(size_t)P->peak_step * CP_CAT_COUNT + c];
    free(live);
    return t;
}

/* The lines of a file; edit: drop (copies 0) or repeat (copies 2) line `at`. */
static void edit_line(const char *from, const char *to, int at, int copies) {
    size_t len;
    char *text = cp_read_file(from, &len);
    assert_non_null(text);
    FILE *f = fopen(to, "w");
    assert_non_null(f);
    int line = 0;
    for (char *p = text; *p; line++) {
        char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p + 1) : strlen(p);
        for (int c = 0; c < (line == at ? copies : 1); c++) assert_int_equal(fwrite(p, 1, n, f), n);
        p += n;
    }
    assert_int_equal(fclose(f), 0);
    free(text);
}

/* The line of the n-th slice of process pid, and its plan step and micro-batch. */
static int slice_line(const char *path, int pid, int nth, int *step, int *mb) {
    size_t len;
    char *text = cp_read_file(path, &len);
    assert_non_null(text);
    char want[64];
    snprintf(want, sizeof want, "{\"ph\":\"X\",\"pid\":%d,", pid);
    int line = 0, seen = 0, found = -1;
    for (char *p = text; *p && found < 0; line++) {
        char *nl = strchr(p, '\n');
        if (!strncmp(p, want, strlen(want)) && seen++ == nth) {
            found = line;
            assert_int_equal(sscanf(strstr(p, "\"args\":{\"step\":"), "\"args\":{\"step\":%d,\"micro_batch\":%d", step, mb), 2);
        }
        p = nl ? nl + 1 : p + strlen(p);
    }
    free(text);
    assert_true(found >= 0);
    return found;
}

/* One GPU: write, check, read back, then break it four ways. */
static void one_gpu(const char *label, const char *name, const char *const *sets, int nsets, int want_waits) {
    cp_plan P;
    plan(name, sets, nsets, &P);
    cp_trace_wait *w;
    int nw;
    if (cp_exec_plan_waits(&P, &w, &nw, err, sizeof err)) fail_msg("waits: %s", err);
    assert_true(want_waits ? nw > 0 : nw == 0);
    int n = cp_trace_instances(&P);
    assert_int_equal(n, P.spec.train.micro_batches * P.micro_steps + P.nsteps - P.micro_steps);
    double *start = malloc(sizeof *start * (size_t)n), *end = malloc(sizeof *end * (size_t)n);
    made_up_times(&P, w, nw, 0, start, end);
    /* the step line's time: the GPU's work plus a little host time around it */
    cp_trace_rank r = {.rank = 0, .step = 2, .step_seconds = last_end(&P, end) * 1.01, .start = start, .end = end,
                       .waits = w, .nwaits = nw};
    char path[128], bad[160], out[8192];
    snprintf(path, sizeof path, "%s/%s.json", dir, label);
    if (cp_trace_write(&P, &r, path, err, sizeof err)) fail_msg("%s", err);
    if (checker(path, "", out, sizeof out)) fail_msg("%s", out);
    assert_non_null(strstr(out, "ok: 1 rank(s)"));

    readback rb = read_trace(path);
    assert_int_equal(rb.slices[0], n);
    assert_int_equal(rb.slices[P.C], n); /* predicted */
    assert_string_equal(rb.names[0], "rank 0 (measured)");
    assert_string_equal(rb.names[P.C], "predicted (cost model)");
    int flows = 0; /* a micro-batch's waits once per micro-batch, the optimizer's once */
    for (int k = 0; k < nw; k++) flows += w[k].step < P.micro_steps ? P.spec.train.micro_batches : 1;
    assert_int_equal(rb.flows, flows);
    assert_true(P.gpu_live_peak > 0);
    assert_int_equal(live_at_peak(&P), P.gpu_live_peak);
    assert_int_equal(rb.peak[0], P.gpu_live_peak);
    assert_int_equal(rb.peak[P.C], P.gpu_live_peak);

    /* a step missing, a step twice: the checker names it */
    int step, mb, at = slice_line(path, 0, n / 2, &step, &mb);
    char want[128];
    snprintf(bad, sizeof bad, "%s/%s_missing.json", dir, label);
    edit_line(path, bad, at, 0);
    assert_int_equal(checker(bad, "", out, sizeof out), 1);
    snprintf(want, sizeof want, "rank 0: plan step %d of micro-batch %d is missing", step, mb);
    if (!strstr(out, want)) fail_msg("wanted '%s' in:\n%s", want, out);
    snprintf(bad, sizeof bad, "%s/%s_twice.json", dir, label);
    edit_line(path, bad, at, 2);
    assert_int_equal(checker(bad, "", out, sizeof out), 1);
    snprintf(want, sizeof want, "rank 0: plan step %d of micro-batch %d appears 2 times", step, mb);
    if (!strstr(out, want)) fail_msg("wanted '%s' in:\n%s", want, out);
    assert_non_null(strstr(out, "starts before")); /* the copy overlaps the original on its stream */

    /* the step line 5% longer than the slices: outside the 2% */
    char extra[64];
    snprintf(extra, sizeof extra, "--step-seconds %.9f", last_end(&P, end) * 1.05);
    assert_int_equal(checker(path, extra, out, sizeof out), 1);
    assert_non_null(strstr(out, "more than 2% apart"));
    snprintf(extra, sizeof extra, "--step-seconds %.9f", last_end(&P, end) * 0.99);
    if (checker(path, extra, out, sizeof out)) fail_msg("%s", out);

    free(start);
    free(end);
    free(w);
    cp_plan_free(&P);
}

static void test_tiny(void **state) {
    (void)state;
    one_gpu("tiny", "tiny", NULL, 0, 0);
}

/* Host copies on their own stream, waits between it and compute, and two micro-batches. */
static void test_tiny_offload(void **state) {
    (void)state;
    const char *sets[] = {"parallel.offload=all", "train.micro_batches=2"};
    one_gpu("tiny_offload", "tiny", sets, 2, 1);
}

/* A flow moved off its slice fails the check. */
static void test_flow_off_slice(void **state) {
    (void)state;
    char path[128], bad[128], out[8192];
    snprintf(path, sizeof path, "%s/tiny_offload.json", dir);
    snprintf(bad, sizeof bad, "%s/flow_off.json", dir);
    size_t len;
    char *text = cp_read_file(path, &len);
    assert_non_null(text);
    char *f = strstr(text, "{\"ph\":\"f\",");
    assert_non_null(f);
    char *ts = strstr(f, "\"ts\":") + 5;
    memcpy(ts, "9", 1); /* a time where no slice starts */
    FILE *o = fopen(bad, "w");
    assert_non_null(o);
    assert_int_equal(fwrite(text, 1, len, o), len);
    assert_int_equal(fclose(o), 0);
    free(text);
    assert_int_equal(checker(bad, "", out, sizeof out), 1);
    assert_non_null(strstr(out, "no slice of process 0"));
}

/* Two GPUs: each rank writes its part, rank 0 merges them into one file with a process per rank. */
static void test_two_gpus(void **state) {
    (void)state;
    const char *sets[] = {"parallel.gpus=2", "model.layers=2", "train.seq_len=16K"};
    cp_plan P;
    plan("llama8b", sets, 3, &P);
    cp_trace_wait *w;
    int nw;
    if (cp_exec_plan_waits(&P, &w, &nw, err, sizeof err)) fail_msg("waits: %s", err);
    assert_true(nw > 0);
    int n = cp_trace_instances(&P);
    char path[128], part[160], out[8192];
    snprintf(path, sizeof path, "%s/two.json", dir);
    /* rank 1 alone: the merge waits for rank 0's part and gives up with a message */
    double *start = malloc(sizeof *start * (size_t)n), *end = malloc(sizeof *end * (size_t)n);
    for (int rank = 1; rank >= 0; rank--) {
        made_up_times(&P, w, nw, rank, start, end);
        cp_trace_rank r = {.rank = rank, .step = 2, .step_seconds = last_end(&P, end) * 1.005, .start = start,
                           .end = end, .waits = w, .nwaits = nw};
        cp_trace_part_path(path, rank, part, sizeof part);
        if (cp_trace_write(&P, &r, part, err, sizeof err)) fail_msg("%s", err);
        if (rank == 1) {
            assert_int_equal(cp_trace_merge(path, 2, 0.2, err, sizeof err), -1);
            assert_non_null(strstr(err, "two.json.rank0 did not appear within 0 s"));
            assert_int_equal(access(part, F_OK), 0); /* left for a later look */
        }
    }
    if (cp_trace_merge(path, 2, 5, err, sizeof err)) fail_msg("%s", err);
    for (int rank = 0; rank < 2; rank++) {
        cp_trace_part_path(path, rank, part, sizeof part);
        assert_int_equal(access(part, F_OK), -1); /* merged, then removed */
    }
    if (checker(path, "", out, sizeof out)) fail_msg("%s", out);
    assert_non_null(strstr(out, "ok: 2 rank(s)"));
    readback rb = read_trace(path);
    assert_string_equal(rb.names[0], "rank 0 (measured)");
    assert_string_equal(rb.names[1], "rank 1 (measured)");
    assert_string_equal(rb.names[2], "predicted (cost model)");
    for (int pid = 0; pid < 3; pid++) {
        assert_int_equal(rb.slices[pid], n);
        assert_int_equal(rb.peak[pid], P.gpu_live_peak);
    }
    assert_int_equal(live_at_peak(&P), P.gpu_live_peak);
    assert_int_equal(rb.flows, 2 * nw); /* every wait once per rank (one micro-batch) */
    int collectives = 0;
    for (int i = 0; i < P.nsteps; i++) collectives += P.steps[i].stream == CP_STREAM_COMM;
    assert_true(collectives > 0);

    /* a step of rank 1 missing in the merged file */
    int step, mb, at = slice_line(path, 1, 3, &step, &mb);
    char bad[160], want[128];
    snprintf(bad, sizeof bad, "%s/two_missing.json", dir);
    edit_line(path, bad, at, 0);
    assert_int_equal(checker(bad, "", out, sizeof out), 1);
    snprintf(want, sizeof want, "rank 1: plan step %d of micro-batch %d is missing", step, mb);
    if (!strstr(out, want)) fail_msg("wanted '%s' in:\n%s", want, out);
    free(start);
    free(end);
    free(w);
    cp_plan_free(&P);
}

static void test_bad_path(void **state) {
    (void)state;
    assert_int_equal(cp_trace_check_path("/nonexistent-cpgen-dir/t.json", err, sizeof err), -1);
    assert_non_null(strstr(err, "the folder /nonexistent-cpgen-dir does not exist"));
    assert_int_equal(cp_trace_check_path(dir, err, sizeof err), -1);
    assert_non_null(strstr(err, "give a file name"));
    char ok[128];
    snprintf(ok, sizeof ok, "%s/t.json", dir);
    assert_int_equal(cp_trace_check_path(ok, err, sizeof err), 0);
    assert_int_equal(cp_trace_check_path("t.json", err, sizeof err), 0);
}

int main(int argc, char **argv) {
    (void)argc;
    go_to_source_tree(argv[0], "tools/trace_check.py");
    if (tmpdir_make(dir, sizeof dir, "trace")) return 1;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_tiny), cmocka_unit_test(test_tiny_offload),
                                       cmocka_unit_test(test_flow_off_slice), cmocka_unit_test(test_two_gpus),
                                       cmocka_unit_test(test_bad_path)};
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tmpdir_remove(dir);
    return rc;
}
