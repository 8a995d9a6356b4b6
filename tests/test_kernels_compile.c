/* test_kernels_compile.c: every kernel module that the shipped specs' plans ask for is emitted from the templates and
 * compiled with NVRTC for Hopper (sm_90a) and Ampere (sm_80), cold (a fresh cache folder), with no register spills,
 * and every variant of those that have variants for the architecture that runs it; then `cpgen gen` and
 * `cpgen build` run on the tiny spec. Needs NVRTC but no GPU. */
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
#include "emit.h"
#include "jit.h"
#include "kernels.h"
#include "kernels_attn.h"
#include "plan.h"
#include "spec.h"
#include "util.h"

static const char *SPECS[] = {"tiny", "llama1b", "llama3b", "llama8b", "qwen32b"};
static const char *ARCHS[] = {"sm_90a", "sm_80"};

static char cache_dir[256];

static int group_setup(void **state) {
    (void)state;
    return tmpdir_make(cache_dir, sizeof cache_dir, "compile");
}

static int group_teardown(void **state) {
    (void)state;
    tmpdir_remove(cache_dir);
    return 0;
}

static void load_plan(const char *name, cp_plan *plan) {
    cp_spec spec;
    char err[CP_ERR_MAX];
    if (cp_spec_load(name, NULL, 0, &spec, err, sizeof err) != 0) fail_msg("spec %s: %s", name, err);
    if (cp_plan_build(&spec, plan, err, sizeof err) != 0) fail_msg("plan %s: %s", name, err);
}

static void opts_for(cp_jit_opts *o, const char *arch) {
    memset(o, 0, sizeof *o);
    snprintf(o->arch, sizeof o->arch, "%s", arch);
    snprintf(o->cache_dir, sizeof o->cache_dir, "%s", cache_dir);
    o->threads = 2; /* CI machines have two cores */
}

static void test_all_modules_compile_without_spills(void **state) {
    (void)state;
    int cap = 64, n = 0;
    cp_module_src *mods = cp_xcalloc((size_t)cap, sizeof *mods);
    char owner[256][16];
    for (size_t s = 0; s < CP_ARRAY_LEN(SPECS); s++) {
        cp_plan plan;
        load_plan(SPECS[s], &plan);
        assert_true(plan.nmodules > 0);
        for (int i = 0; i < plan.nmodules; i++) {
            cp_module_src m;
            char err[2048];
            if (cp_emit(&plan.modules[i], &m, err, sizeof err) != 0)
                fail_msg("spec %s, module %d (%s): %s", SPECS[s], i, plan.modules[i].family, err);
            int same = -1;
            for (int k = 0; k < n; k++)
                if (strcmp(mods[k].name, m.name) == 0) same = k;
            if (same >= 0) {
                if (strcmp(mods[same].source, m.source) != 0)
                    fail_msg("module %s differs between specs %s and %s: its module line must name every value "
                             "that changes the code", m.name, owner[same], SPECS[s]);
                cp_module_src_free(&m);
                continue;
            }
            if (n == cap) {
                cap *= 2;
                mods = cp_xrealloc(mods, sizeof *mods * (size_t)cap);
            }
            assert_true(n < 256);
            snprintf(owner[n], sizeof owner[n], "%s", SPECS[s]);
            mods[n++] = m;
        }
        cp_plan_free(&plan);
    }

    cp_jit_module *out = cp_xcalloc((size_t)n, sizeof *out);
    double total = 0;
    for (size_t a = 0; a < CP_ARRAY_LEN(ARCHS); a++) {
        cp_jit_opts o;
        opts_for(&o, ARCHS[a]);
        char err[16384];
        double t0 = cp_now();
        if (cp_jit_compile(mods, n, &o, out, err, sizeof err) != 0) fail_msg("%s: %s", ARCHS[a], err);
        double wall = cp_now() - t0;
        total += wall;
        int spills = 0;
        double slowest = 0;
        const char *slowest_name = "";
        for (int i = 0; i < n; i++) {
            assert_false(out[i].from_cache); /* a fresh cache: everything really compiled */
            assert_non_null(out[i].cubin);
            assert_memory_equal(out[i].cubin, "\x7f" "ELF", 4);
            assert_int_equal(out[i].nentries, mods[i].nentries);
            if (out[i].seconds > slowest) {
                slowest = out[i].seconds;
                slowest_name = mods[i].name;
            }
            for (int e = 0; e < out[i].nentries; e++) {
                const cp_entry_info *x = &out[i].entries[e];
                assert_true(x->registers > 0);
                if (x->spill_stores > 0 || x->spill_loads > 0) {
                    print_message("%s: %s (%s) spills: %d B stores, %d B loads, %d registers\n", ARCHS[a], x->name,
                                  owner[i], x->spill_stores, x->spill_loads, x->registers);
                    spills++;
                }
            }
            if (out[i].warnings) print_message("%s: notes for %s:\n%s", ARCHS[a], mods[i].name, out[i].warnings);
        }
        print_message("%s: %d modules compiled in %.1f s on 2 threads (slowest %s, %.1f s)\n", ARCHS[a], n, wall,
                      slowest_name, slowest);
        for (int i = 0; i < n; i++) cp_jit_module_free(&out[i]);
        assert_int_equal(spills, 0);
    }
    print_message("%d modules from %zu specs, %zu archs: %.1f s in all\n", n, CP_ARRAY_LEN(SPECS),
                  CP_ARRAY_LEN(ARCHS), total);
    free(out);
    for (int i = 0; i < n; i++) cp_module_src_free(&mods[i]);
    free(mods);
}

/* Every variant of every module with variants (kernels.h cp_kvariants: the Hopper attention forward's K/V ring
 * depths) in the shipped specs' plans, beside the defaults compiled above: each compiles for the architecture that
 * runs it without spills, and its entry's shared memory fits the 227 KiB a block may have. */
static void test_variants_compile_without_spills(void **state) {
    (void)state;
    int n = 0;
    cp_module_src mods[64];
    int64_t smem[64];
    for (size_t s = 0; s < CP_ARRAY_LEN(SPECS); s++) {
        cp_plan plan;
        load_plan(SPECS[s], &plan);
        for (int i = 0; i < plan.nmodules; i++) {
            cp_kvariants v;
            if (!cp_k_variants(&plan.modules[i], &v)) continue;
            assert_string_equal(v.arch, "sm_90a");
            assert_int_equal(cp_k_variant(&plan.modules[i], &v), v.def); /* a plan starts with the defaults */
            for (int x = 0; x < v.n; x++) {
                if (v.values[x] == v.def) continue;
                cp_kernel_spec k;
                cp_kspec_copy(&k, &plan.modules[i]);
                cp_k_set_variant(&k, &v, v.values[x]);
                cp_module_src m;
                char err[2048];
                if (cp_emit(&k, &m, err, sizeof err)) fail_msg("%s: %s", SPECS[s], err);
                bool seen = false;
                for (int j = 0; j < n; j++) seen |= !strcmp(mods[j].name, m.name);
                cp_kdims d;
                assert_int_equal(cp_k_attention_dims(&k, "fwd_sm90", &d), 0);
                cp_kspec_free(&k);
                if (seen) {
                    cp_module_src_free(&m);
                    continue;
                }
                assert_true(n < (int)CP_ARRAY_LEN(mods));
                smem[n] = d.smem;
                mods[n++] = m;
            }
        }
        cp_plan_free(&plan);
    }
    assert_true(n >= 5); /* head_dim 64 and 128 both have variants besides the default */
    cp_jit_module *out = cp_xcalloc((size_t)n, sizeof *out);
    cp_jit_opts o;
    opts_for(&o, "sm_90a");
    char err[16384];
    double t0 = cp_now();
    if (cp_jit_compile(mods, n, &o, out, err, sizeof err) != 0) fail_msg("sm_90a: %s", err);
    for (int i = 0; i < n; i++) {
        assert_int_equal(out[i].nentries, mods[i].nentries);
        assert_true(smem[i] <= 227 * 1024);
        for (int e = 0; e < out[i].nentries; e++) {
            const cp_entry_info *x = &out[i].entries[e];
            if (x->spill_stores > 0 || x->spill_loads > 0)
                fail_msg("%s spills: %d B stores, %d B loads, %d registers", x->name, x->spill_stores, x->spill_loads,
                         x->registers);
        }
        print_message("%s: fwd_sm90 with %lld bytes of shared memory\n", mods[i].name, (long long)smem[i]);
        cp_jit_module_free(&out[i]);
        cp_module_src_free(&mods[i]);
    }
    print_message("sm_90a: %d variants compiled in %.1f s\n", n, cp_now() - t0);
    free(out);
}

/* Every attention module of the shipped specs' plans with document masks (cp_k_attention_docs; templates/attention.cu,
 * "Document masks") compiles for both architectures without spills; its name gains "_dm1" while the module without
 * them keeps its name (tuned variants are keyed by it), and fwd and bwd take the rows' document starts in 512 more
 * bytes of shared memory. */
static void test_document_modules_compile_without_spills(void **state) {
    (void)state;
    int n = 0;
    cp_module_src mods[64];
    for (size_t s = 0; s < CP_ARRAY_LEN(SPECS); s++) {
        cp_plan plan;
        load_plan(SPECS[s], &plan);
        for (int i = 0; i < plan.nmodules; i++) {
            if (strcmp(plan.modules[i].family, "attention") != 0) continue;
            cp_kernel_spec k;
            cp_kspec_copy(&k, &plan.modules[i]);
            cp_k_attention_docs(&k, true);
            cp_module_src plain, m;
            char err[2048];
            if (cp_emit(&plan.modules[i], &plain, err, sizeof err) || cp_emit(&k, &m, err, sizeof err))
                fail_msg("%s: %s", SPECS[s], err);
            assert_null(strstr(plain.name, "_dm1"));
            char want[CP_KNAME_MAX + 8];
            snprintf(want, sizeof want, "%s_dm1", plain.name);
            assert_string_equal(m.name, want);
            const char *roles[2] = {"fwd", "bwd"};
            for (int r = 0; r < 2; r++) {
                cp_kdims d0, d1;
                assert_int_equal(cp_k_attention_dims(&plan.modules[i], roles[r], &d0), 0);
                assert_int_equal(cp_k_attention_dims(&k, roles[r], &d1), 0);
                assert_int_equal(d1.smem, d0.smem + 512);
            }
            cp_module_src_free(&plain);
            cp_kspec_free(&k);
            bool seen = false;
            for (int j = 0; j < n; j++) seen |= !strcmp(mods[j].name, m.name);
            if (seen) {
                cp_module_src_free(&m);
                continue;
            }
            assert_true(n < (int)CP_ARRAY_LEN(mods));
            mods[n++] = m;
        }
        cp_plan_free(&plan);
    }
    assert_true(n >= 2);
    cp_jit_module *out = cp_xcalloc((size_t)n, sizeof *out);
    for (size_t a = 0; a < CP_ARRAY_LEN(ARCHS); a++) {
        cp_jit_opts o;
        opts_for(&o, ARCHS[a]);
        char err[16384];
        double t0 = cp_now();
        if (cp_jit_compile(mods, n, &o, out, err, sizeof err) != 0) fail_msg("%s: %s", ARCHS[a], err);
        for (int i = 0; i < n; i++) {
            assert_int_equal(out[i].nentries, mods[i].nentries);
            for (int e = 0; e < out[i].nentries; e++) {
                const cp_entry_info *x = &out[i].entries[e];
                assert_non_null(strstr(x->name, "_dm1"));
                if (x->spill_stores > 0 || x->spill_loads > 0)
                    fail_msg("%s: %s spills: %d B stores, %d B loads, %d registers", ARCHS[a], x->name,
                             x->spill_stores, x->spill_loads, x->registers);
            }
            cp_jit_module_free(&out[i]);
        }
        print_message("%s: %d attention modules with document masks compiled in %.1f s\n", ARCHS[a], n,
                      cp_now() - t0);
    }
    for (int i = 0; i < n; i++) cp_module_src_free(&mods[i]);
    free(out);
}

/* fwd_sm90's launch geometry follows its consumers: 128-row blocks of 384 threads at head_dim 128, 192-row blocks of
 * 512 threads at 64 (three consumer warpgroups), Q held in boxes of 128 rows before the K, V ring. */
static void test_fwd_sm90_geometry(void **state) {
    (void)state;
    struct {
        int64_t D, seq;
        unsigned rows, threads, qboxes;
    } want[] = {{128, 32768, 128, 384, 1}, {128, 1000, 128, 384, 1}, {64, 32768, 192, 512, 2}, {64, 100, 192, 512, 2}};
    for (size_t c = 0; c < CP_ARRAY_LEN(want); c++) {
        cp_kernel_spec k;
        cp_k_attention(&k, want[c].D, 8, 2, want[c].seq, true, false, false);
        cp_kdims d;
        assert_int_equal(cp_k_attention_dims(&k, "fwd_sm90", &d), 0);
        assert_int_equal(d.grid[0], 8);
        assert_int_equal(d.grid[1], (want[c].seq + want[c].rows - 1) / want[c].rows);
        assert_int_equal(d.block, want[c].threads);
        const unsigned tile = (unsigned)want[c].D * 256, stages = want[c].D == 128 ? 2 : 4; /* the default rings */
        assert_int_equal(d.smem, (want[c].qboxes + 2 * stages) * tile + 8 * (1 + 4 * stages) + 1024);
        cp_kspec_free(&k);
    }
}

/* `cpgen gen` writes one stand-alone .cu per module; `cpgen build` prints the table and, with the cache warm from
 * the test above, loads everything from it. */
static void test_gen_and_build_commands(void **state) {
    (void)state;
    cp_plan plan;
    load_plan("tiny", &plan);
    char outdir[300], err[16384];
    snprintf(outdir, sizeof outdir, "%s/gen-out/tiny", cache_dir);
    assert_int_equal(cp_cmd_gen(&plan, outdir, err, sizeof err), 0);
    for (int i = 0; i < plan.nmodules; i++) {
        cp_module_src m;
        assert_int_equal(cp_emit(&plan.modules[i], &m, err, sizeof err), 0);
        char path[600];
        snprintf(path, sizeof path, "%s/%s.cu", outdir, m.name);
        char *text = cp_read_file(path, NULL);
        if (!text) fail_msg("cpgen gen did not write %s", path);
        assert_string_equal(text, m.source);
        free(text);
        cp_module_src_free(&m);
    }

    cp_jit_opts o;
    opts_for(&o, "sm_90a");
    o.fail_on_spill = true;
    char *report = NULL;
    size_t report_len = 0;
    FILE *f = open_memstream(&report, &report_len);
    assert_non_null(f);
    int rc = cp_cmd_build(&plan, &o, f, err, sizeof err);
    fclose(f);
    if (rc != 0) fail_msg("cpgen build: %s\n%s", err, report);
    fputs(report, stdout); /* longer than print_message's buffer */
    assert_non_null(strstr(report, "module"));
    assert_non_null(strstr(report, "regs"));
    assert_non_null(strstr(report, "cached load:"));
    assert_non_null(strstr(report, "0 compiled"));
    free(report);
    cp_plan_free(&plan);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_modules_compile_without_spills),
        cmocka_unit_test(test_variants_compile_without_spills),
        cmocka_unit_test(test_document_modules_compile_without_spills),
        cmocka_unit_test(test_fwd_sm90_geometry),
        cmocka_unit_test(test_gen_and_build_commands),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
