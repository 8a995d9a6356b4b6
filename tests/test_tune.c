/* test_tune.c: `cpgen tune` without a GPU: the default axes (the valid UPipe sizes, tiles that divide the tokens per
 * GPU), --sweep's checks, candidates skipped with their reason, the ranking by the plan, tune.jsonl (candidates, then
 * the kernel variants timed), the table's kernel rows, tune.svg (XML, both panels, their axes, one line per
 * combination of the other axes, the winner) and tuned.lua (loads, and equals the input spec with the command's sets
 * and the winner's values; file names and --set values in it, and in a bundle's spec.lua, are data and never code);
 * the commands `tune` and `tune-kernels` say that kernel timing needs a GPU and leave the kernel tuning cache
 * alone. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tmpdir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "json.h"
#include "module.h"
#include "source_tree.h"
#include "spec.h"
#include "spec_write.h"
#include "tune.h"
#include "util.h"
#include "xml_check.h"

static char root[256];

static int setup(void **state) {
    (void)state;
    return tmpdir_make(root, sizeof root, "tune");
}

static int teardown(void **state) {
    (void)state;
    tmpdir_remove(root);
    return 0;
}

static const cp_tune_axis *axis(const cp_tune_axes *ax, const char *key) {
    for (int a = 0; a < ax->naxes; a++)
        if (!strcmp(ax->axes[a].key, key)) return &ax->axes[a];
    fail_msg("no axis %s", key);
    return NULL;
}

static void values_are(const cp_tune_axis *x, const char *const *want, int n) {
    assert_int_equal(x->nvalues, n);
    for (int i = 0; i < n; i++) assert_string_equal(x->values[i], want[i]);
}

/* cp_tune_print's table for the first max candidates, as a string to free */
static char *table_of(const cp_tune *t, int max) {
    char *table = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&table, &len);
    cp_tune_print(t, f, max);
    fclose(f);
    return table;
}

static void test_default_axes(void **state) {
    (void)state;
    cp_spec s;
    char err[CP_ERR_MAX];
    const char *seq[] = {"train.seq_len=128K"};
    assert_int_equal(cp_spec_load("llama3b", seq, 1, &s, err, sizeof err), 0);
    cp_tune_axes ax;
    cp_tune_default_axes(&s, &ax);
    assert_int_equal(ax.naxes, 6);
    /* 24 query heads over 8 KV heads on one GPU: U divides 24 and keeps whole GQA groups in step */
    const char *u[] = {"1", "3", "6", "12", "24"};
    values_are(axis(&ax, "parallel.upipe_heads"), u, 5);
    const char *mlp[] = {"auto", "8K", "16K"}, *loss[] = {"auto", "4K"}, *every[] = {"auto", "1"};
    values_are(axis(&ax, "parallel.mlp_tile"), mlp, 3);
    values_are(axis(&ax, "parallel.loss_tile"), loss, 2);
    values_are(axis(&ax, "parallel.checkpoint_every"), every, 2);
    /* the tiny spec's 2K tokens: no tile larger than them; its 4 heads over 2 KV heads */
    assert_int_equal(cp_spec_load("tiny", NULL, 0, &s, err, sizeof err), 0);
    cp_tune_default_axes(&s, &ax);
    const char *tu[] = {"1", "2", "4"}, *only_auto[] = {"auto"};
    values_are(axis(&ax, "parallel.upipe_heads"), tu, 3);
    values_are(axis(&ax, "parallel.mlp_tile"), only_auto, 1);

    /* --sweep replaces an axis, adds a new one, and checks values as --set does */
    assert_int_equal(cp_tune_sweep(&ax, "parallel.upipe_heads=2,4", "tiny", NULL, 0, err, sizeof err), 0);
    const char *two[] = {"2", "4"};
    values_are(axis(&ax, "parallel.upipe_heads"), two, 2);
    assert_int_equal(cp_tune_sweep(&ax, "train.micro_batches=4,8", "tiny", NULL, 0, err, sizeof err), 0);
    assert_int_equal(ax.naxes, 7);
    assert_int_equal(cp_tune_sweep(&ax, "parallel.upipe_heads=3", "tiny", NULL, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "parallel.upipe_heads = 3: must divide heads (4)"));
    values_are(axis(&ax, "parallel.upipe_heads"), two, 2); /* a refused sweep changes nothing */
    assert_int_equal(cp_tune_sweep(&ax, "paralel.mlp_tile=1K", "tiny", NULL, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "did you mean 'parallel'?"));
    assert_int_equal(cp_tune_sweep(&ax, "parallel.mlp_tile", "tiny", NULL, 0, err, sizeof err), -1);
    assert_non_null(strstr(err, "expected KEY=V1,V2"));
    assert_true(cp_tune_parse_budget("10m") == 600 && cp_tune_parse_budget("90s") == 90 &&
                cp_tune_parse_budget("1h") == 3600 && cp_tune_parse_budget("5") == 5);
    assert_true(cp_tune_parse_budget("ten") < 0 && cp_tune_parse_budget("-1m") < 0 && cp_tune_parse_budget("3d") < 0);
    /* past 30 days, and an infinite time, are slips */
    assert_true(cp_tune_parse_budget("720h") == 720 * 3600.0 && cp_tune_parse_budget("721h") < 0 &&
                cp_tune_parse_budget("1e308h") < 0 && cp_tune_parse_budget("inf") < 0);
}

/* The 3B at 128K: nothing fits a GPU of 4 GiB (its bf16 parameters alone take 6 GiB, 3 GiB a GPU on two), and two GPUs cannot
 * run one head per stage (U must be a multiple of the GPU count). */
static void plan_3b(cp_tune *t, const char *const *sets, int nsets) {
    cp_spec s;
    char err[CP_ERR_MAX];
    if (cp_spec_load("llama3b", sets, nsets, &s, err, sizeof err)) fail_msg("%s", err);
    cp_tune_axes ax = {0};
    const char *sweeps[] = {"parallel.upipe_heads=1,6,24", "machine.gpu_mem=143150M,4G", "parallel.gpus=1,2",
                            "parallel.mlp_tile=auto,16K"};
    for (size_t i = 0; i < CP_ARRAY_LEN(sweeps); i++)
        if (cp_tune_sweep(&ax, sweeps[i], "llama3b", sets, nsets, err, sizeof err)) fail_msg("%s", err);
    if (cp_tune_plan(t, &ax, "llama3b", sets, nsets, err, sizeof err)) fail_msg("%s", err);
}

static void test_candidates_skipped_and_ranked(void **state) {
    (void)state;
    const char *sets[] = {"train.seq_len=128K"};
    cp_tune t;
    plan_3b(&t, sets, 1);
    assert_int_equal(t.n, 3 * 2 * 2 * 2);
    int no_fit = 0, bad_u = 0;
    for (int i = 0; i < t.n; i++) {
        const cp_tune_cand *c = &t.c[i];
        bool small = !strcmp(c->values[1], "4G"), one = !strcmp(c->values[2], "1");
        if (!strcmp(c->values[0], "1") && !one) { /* U = 1 on 2 GPUs: the spec refuses it */
            assert_false(c->fits);
            assert_non_null(strstr(c->why, "parallel.upipe_heads"));
            bad_u++;
        } else if (small) {
            assert_false(c->fits);
            assert_non_null(strstr(c->why, "does not fit"));
            no_fit++;
        } else {
            assert_true(c->fits);
            assert_true(c->t_plan > 1 && c->gpu_peak > 0 && c->gpu_peak < 143150LL * 1024 * 1024);
        }
    }
    assert_int_equal(bad_u, 4);
    assert_int_equal(no_fit, 10);
    /* ranked by the plan's step, fastest first, every ranked one fits and is distinct */
    assert_true(t.nranked >= 4);
    for (int r = 0; r < t.nranked; r++) {
        const cp_tune_cand *c = &t.c[t.order[r]];
        assert_true(c->fits && c->same_as < 0 && !c->measured);
        assert_int_equal(c->rank, r + 1);
        if (r) assert_true(c->t_full >= t.c[t.order[r - 1]].t_full);
    }
    /* two GPUs share the sequence: the winner runs on both */
    assert_int_equal(t.c[t.order[0]].C, 2);
    cp_tune_free(&t);
}

static char *read_text(const char *path) {
    size_t len;
    char *s = cp_read_file(path, &len);
    if (!s) fail_msg("cannot read %s", path);
    return s;
}

static void test_outputs(void **state) {
    (void)state;
    const char *sets[] = {"train.seq_len=128K", "train.steps=3"};
    cp_tune t;
    plan_3b(&t, sets, 2);
    char path[512], err[CP_ERR_MAX];

    /* the kernel variants timed (as cpgen tune-kernels reports them): a second timing of a shape replaces the first */
    cp_ktune_entry k = {.arch = "sm_90a", .driver = "580.82.07", .kernel = "attention.fwd_sm90",
                        .shape = "d128 q24 kv8 s131072 causal", .param = "FWD_STAGES", .def = 2, .winner = 2, .n = 2,
                        .values = {2, 3}, .ms = {300.5, 310.25}, .flops = 1.0e14, .cpgen = CP_VERSION};
    cp_tune_add_kernel(&t, &k);
    k.winner = 3, k.ms[1] = 290.0;
    cp_tune_add_kernel(&t, &k);
    cp_ktune_entry k2 = k;
    snprintf(k2.shape, sizeof k2.shape, "d128 q12 kv4 s131072 causal");
    cp_tune_add_kernel(&t, &k2);
    assert_int_equal(t.nkern, 2);
    char *table = table_of(&t, 40);
    assert_non_null(strstr(table, "kernel variants, timed on this GPU"));
    assert_non_null(strstr(table, "  attention.fwd_sm90 d128 q24 kv8 s131072 causal (sm_90a, driver 580.82.07)\n"
                                  "    FWD_STAGES  2    300.500 ms    333 TF/s  default\n"
                                  "    FWD_STAGES  3    290.000 ms    345 TF/s  winner, 3.5% faster than the default\n"));
    free(table);

    /* tune.jsonl: one object per candidate, the winner's figures; then one per kernel shape timed */
    snprintf(path, sizeof path, "%s/tune.jsonl", root);
    assert_int_equal(cp_tune_write_jsonl(&t, path, err, sizeof err), 0);
    char *text = read_text(path);
    int lines = 0, winners = 0, skipped = 0, kernels = 0;
    for (char *p = text, *nl; *p; p = nl + 1) {
        nl = strchr(p, '\n');
        assert_non_null(nl);
        cp_json o;
        if (cp_json_parse(p, (size_t)(nl - p), &o, err, sizeof err)) fail_msg("line %d: %s", lines + 1, err);
        if (cp_json_get(&o, "kernel")) {
            cp_ktune_entry e;
            assert_int_equal(cp_ktune_entry_parse(&o, &e, err, sizeof err), 0);
            assert_string_equal(e.shape, t.kern[kernels].shape);
            assert_int_equal(e.winner, 3);
            assert_true(e.ms[0] == 300.5 && e.ms[1] == 290.0);
            assert_null(cp_json_get(&o, "candidate"));
            kernels++;
            cp_json_free(&o);
            continue;
        }
        assert_int_equal(kernels, 0); /* the candidates come first */
        const cp_json *rank = cp_json_get(&o, "rank"), *cand = cp_json_get(&o, "candidate");
        assert_int_equal(cand->integer, lines);
        if (cp_json_get(&o, "skipped")) skipped++;
        if (rank->integer == 1) {
            winners++;
            const cp_tune_cand *w = &t.c[t.order[0]];
            assert_int_equal(cand->integer, t.order[0]);
            assert_true(cp_json_get(&o, "step_seconds")->number == w->t_full);
            assert_int_equal(cp_json_get(cp_json_get(&o, "plan"), "gpu_peak")->integer, w->gpu_peak);
            assert_string_equal(cp_json_get(cp_json_get(&o, "values"), "parallel.gpus")->string, "2");
        }
        cp_json_free(&o);
        lines++;
    }
    free(text);
    assert_int_equal(lines, t.n);
    assert_int_equal(kernels, 2);
    assert_int_equal(winners, 1);
    assert_int_equal(skipped, 14);

    /* tune.svg */
    snprintf(path, sizeof path, "%s/tune.svg", root);
    assert_int_equal(cp_tune_svg(&t, path, err, sizeof err), 0);
    char *svg = read_text(path), why[256];
    if (xml_check(svg, why, sizeof why)) fail_msg("not XML: %s", why);
    assert_int_equal(xml_count(svg, "id", "time"), 1);
    assert_int_equal(xml_count(svg, "id", "memory"), 1);
    assert_int_equal(xml_count(svg, "class", "axis x"), 2);
    assert_int_equal(xml_count(svg, "class", "axis y"), 2);
    assert_int_equal(xml_count(svg, "id", "winner"), 1);
    assert_int_equal(xml_count(svg, "class", "winner"), 2);
    assert_non_null(strstr(svg, "UPipe chunk size U"));
    /* one line per combination of gpu_mem, gpus and mlp_tile that has a fitting candidate, in both panels */
    assert_int_equal(xml_count(svg, "data-name", "gpu_mem=143150M gpus=2 mlp_tile=16K"), 2);
    assert_int_equal(xml_count(svg, "data-name", "gpu_mem=143150M gpus=1 mlp_tile=auto"), 2);
    assert_int_equal(xml_count(svg, "data-name", "gpu_mem=4G gpus=2 mlp_tile=auto"), 0); /* none fits */
    assert_int_equal(xml_count(svg, "class", "series"), 2 * 4);
    /* a measurement of a truncated model leaves the memory panel (the full-depth plan's) as it was, and the table
     * sets its peak against its own plan's */
    cp_tune_cand *w = &t.c[t.order[0]];
    w->measured = true;
    w->measured_layers = 1;
    w->measured_step = w->per_layer = 1.0;
    w->measured_peak = 3LL << 30;
    w->measured_plan_peak = 13LL << 28; /* 3.25 GiB */
    snprintf(path, sizeof path, "%s/tune_measured.svg", root);
    assert_int_equal(cp_tune_svg(&t, path, err, sizeof err), 0);
    char *svg2 = read_text(path);
    const char *mem = strstr(svg, "id=\"memory\""), *mem2 = strstr(svg2, "id=\"memory\"");
    assert_non_null(mem);
    assert_non_null(mem2);
    assert_string_equal(mem, mem2);
    free(svg2);
    char *tab = table_of(&t, 3);
    assert_non_null(strstr(tab, "3.00/3.25"));
    assert_non_null(strstr(tab, "L-layer GiB"));
    free(tab);
    w->measured = false;
    free(svg);

    /* tuned.lua: the input, the command's sets and the winner */
    cp_spec input, tuned, expect;
    assert_int_equal(cp_spec_load("llama3b", sets, 2, &input, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/tuned.lua", root);
    assert_int_equal(cp_tune_write_lua(&t, path, &input, sets, 2, err, sizeof err), 0);
    if (cp_spec_load(path, NULL, 0, &tuned, err, sizeof err)) fail_msg("%s", err);
    const char *all[2 + CP_TUNE_MAX_AXES];
    char buf[CP_TUNE_MAX_AXES][160];
    all[0] = sets[0], all[1] = sets[1];
    for (int a = 0; a < t.axes.naxes; a++) {
        cp_tune_set_text(&t, t.order[0], a, buf[a], sizeof buf[a]);
        all[2 + a] = buf[a];
    }
    assert_int_equal(cp_spec_load("llama3b", all, 2 + t.axes.naxes, &expect, err, sizeof err), 0);
    assert_true(cp_spec_same(&tuned, &expect));
    assert_false(cp_spec_same(&tuned, &input));
    assert_int_equal(tuned.parallel.gpus, 2);
    assert_int_equal(tuned.train.seq_len, 128 * 1024);
    assert_int_equal(tuned.train.steps, 3);
    assert_int_equal(tuned.parallel.upipe_heads, t.c[t.order[0]].U);
    cp_tune_free(&t);
}

/* tuned.lua and a bundle's spec.lua hold the user's file names and --set values as data: a spec file whose name
 * holds a newline and Lua code, and a --set value that Lua reads as a number only through tonumber, give files that
 * load to the intended spec and run nothing else. */
static void test_generated_lua_runs_no_code(void **state) {
    (void)state;
    char path[512], out[512], err[CP_ERR_MAX];
    snprintf(path, sizeof path, "%s/x\nerror('injected by the file name') --.lua", root);
    const char *text = "return cpgen.load('tiny')\n";
    assert_int_equal(cp_write_file_atomic(path, text, strlen(text)), 0);
    const char *sets[] = {"train.steps= 70", "train.out_dir=runs/\"quoted\" ]] --[[ x"};
    cp_spec input;
    if (cp_spec_load(path, sets, 2, &input, err, sizeof err)) fail_msg("%s", err);
    assert_int_equal(input.train.steps, 70);
    cp_tune_axes ax = {0};
    const char *sweeps[] = {"parallel.upipe_heads=2", "parallel.mlp_tile=auto"};
    for (size_t i = 0; i < CP_ARRAY_LEN(sweeps); i++)
        if (cp_tune_sweep(&ax, sweeps[i], path, sets, 2, err, sizeof err)) fail_msg("%s", err);
    cp_tune t;
    if (cp_tune_plan(&t, &ax, path, sets, 2, err, sizeof err)) fail_msg("%s", err);
    snprintf(out, sizeof out, "%s/injected_tuned.lua", root);
    assert_int_equal(cp_tune_write_lua(&t, out, &input, sets, 2, err, sizeof err), 0);
    cp_spec tuned, expect;
    if (cp_spec_load(out, NULL, 0, &tuned, err, sizeof err)) fail_msg("tuned.lua ran something else: %s", err);
    const char *all[] = {sets[0], sets[1], "parallel.upipe_heads=2", "parallel.mlp_tile=auto"};
    assert_int_equal(cp_spec_load(path, all, 4, &expect, err, sizeof err), 0);
    assert_true(cp_spec_same(&tuned, &expect));
    assert_int_equal(tuned.train.steps, 70);
    assert_string_equal(tuned.train.out_dir, "runs/\"quoted\" ]] --[[ x");
    cp_tune_free(&t);
    /* the resolved spec of a bundle names its file in its first line */
    cp_str lua = {0};
    cp_spec_write_lua(&input, &lua);
    cp_spec back;
    if (cp_spec_load_string("resolved.lua", lua.data, NULL, 0, &back, err, sizeof err))
        fail_msg("spec.lua ran something else: %s", err);
    assert_true(cp_spec_same(&back, &input));
    assert_non_null(strstr(lua.data, "x\\010error('injected by the file name')"));
    cp_str_free(&lua);
}

/* An output folder that cannot be made is refused before any candidate is planned or measured. */
static void test_unwritable_outdir(void **state) {
    (void)state;
    char err[CP_ERR_MAX];
    cp_spec spec;
    assert_int_equal(cp_spec_load("tiny", NULL, 0, &spec, err, sizeof err), 0);
    cp_tune_opts o = {.spec_arg = "tiny", .budget = 60, .plan_only = true, .outdir = "/proc/cpgen-none/tune"};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    int rc = cp_cmd_tune(&spec, &o, f, err, sizeof err);
    fclose(f);
    assert_int_equal(rc, CP_EXIT_USAGE);
    assert_non_null(strstr(err, "cannot create /proc/cpgen-none/tune"));
    assert_null(strstr(text, "planned in"));
    free(text);
}

/* Without a GPU, `cpgen tune` ranks by the plan and says that kernel timing was skipped, and `cpgen tune-kernels`
 * says so too: neither writes the kernel tuning cache, nor kernels.jsonl. (On a GPU machine they would measure:
 * skipped there.) */
static void test_no_gpu_no_kernel_timing(void **state) {
    (void)state;
    char why[256];
    if (cp_gpu_count(why, sizeof why) > 0) {
        print_message("a GPU is here: the commands would measure, so this test is skipped\n");
        return;
    }
    char xdg[300], cache[400], outdir[300], path[400], err[CP_ERR_MAX];
    snprintf(xdg, sizeof xdg, "%s/xdg", root);
    snprintf(cache, sizeof cache, "%s/cpgen/tuning.json", xdg);
    snprintf(outdir, sizeof outdir, "%s/nogpu", root);
    const char *old = getenv("XDG_CACHE_HOME");
    char *saved = old ? cp_xstrdup(old) : NULL;
    setenv("XDG_CACHE_HOME", xdg, 1);
    const char *sets[] = {"parallel.gpus=1"}, *sweeps[] = {"parallel.upipe_heads=2,4", "parallel.mlp_tile=auto",
                                                           "parallel.loss_tile=auto", "parallel.checkpoint_every=auto",
                                                           "parallel.optimizer=auto", "parallel.attention_output=auto"};
    cp_spec spec;
    assert_int_equal(cp_spec_load("tiny", sets, 1, &spec, err, sizeof err), 0);
    cp_tune_opts o = {.spec_arg = "tiny", .sets = sets, .nsets = 1, .sweeps = sweeps, .nsweeps = 6, .budget = 60,
                      .outdir = outdir};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    int rc = cp_cmd_tune(&spec, &o, f, err, sizeof err);
    fclose(f);
    if (rc) fail_msg("cpgen tune: %s\n%s", err, text);
    assert_non_null(strstr(text, "no GPU found"));
    assert_non_null(strstr(text, "kernel timing was skipped: the kernel tuning cache is unchanged"));
    assert_null(strstr(text, "kernel variants, timed"));
    free(text);

    cp_plan P;
    assert_int_equal(cp_plan_build(&spec, &P, err, sizeof err), 0);
    f = open_memstream(&text, &len);
    assert_int_equal(cp_cmd_tune_kernels(&P, outdir, f, err, sizeof err), 0);
    fclose(f);
    assert_non_null(strstr(text, "kernel timing skipped; the kernel tuning cache is unchanged"));
    free(text);
    cp_plan_free(&P);
    struct stat st; /* -o is not ignored: an empty kernels.jsonl says that nothing was timed */
    snprintf(path, sizeof path, "%s/kernels.jsonl", outdir);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 0);
    assert_int_equal(stat(cache, &st), -1);
    snprintf(path, sizeof path, "%s/tune.jsonl", outdir); /* the rest of tune's work is done */
    assert_int_equal(stat(path, &st), 0);
    if (saved) setenv("XDG_CACHE_HOME", saved, 1);
    else unsetenv("XDG_CACHE_HOME");
    free(saved);
}

int main(int argc, char **argv) {
    (void)argc;
    go_to_source_tree(argv[0], "tests/specs_bad");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_default_axes),
        cmocka_unit_test(test_candidates_skipped_and_ranked),
        cmocka_unit_test(test_outputs),
        cmocka_unit_test(test_generated_lua_runs_no_code),
        cmocka_unit_test(test_unwritable_outdir),
        cmocka_unit_test(test_no_gpu_no_kernel_timing),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
