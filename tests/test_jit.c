/* test_jit.c: NVRTC compile of emitted modules to CUBIN, the ptxas resource parse, and the on-disk cache
 * (hits, misses, corruption, compile errors). Needs NVRTC but no GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "emit.h"
#include "jit.h"
#include "util.h"

static const char *DEMO =
    "// module: demo_n{{N}}\n"
    "#include <cuda_bf16.h>\n"
    "extern \"C\" __global__ void demo_scale_n{{N}}(float *x) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < {{N}}) x[i] = x[i] * (float){{SCALE}} + __bfloat162float(__float2bfloat16(1.0f));\n"
    "}\n";

/* Many values live at once under a 32-register cap: ptxas must spill. */
static const char *SPILL =
    "// module: demo_spill\n"
    "#define BOUNDS __launch_bounds__(1024, 2)\n"
    "extern \"C\" __global__ void BOUNDS demo_k_spill(float *x, int n) {\n"
    "    float a[64];\n"
    "#pragma unroll\n"
    "    for (int i = 0; i < 64; i++) a[i] = x[i * n + threadIdx.x];\n"
    "    float s = 0;\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < 64; j++)\n"
    "#pragma unroll\n"
    "        for (int i = 0; i < 64; i++) s += a[i] * a[(i + j) & 63];\n"
    "    x[threadIdx.x] = s;\n"
    "}\n";

static const char *BROKEN =
    "// module: demo_broken\n"
    "extern \"C\" __global__ void demo_go_broken(float *x) { x[0] = not_declared_anywhere; }\n";

typedef struct {
    char dir[256];
    cp_jit_opts opts;
} fixture;

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    snprintf(f->dir, sizeof f->dir, "/tmp/cpgen-test-jit-XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    snprintf(f->opts.arch, sizeof f->opts.arch, "sm_90a");
    snprintf(f->opts.cache_dir, sizeof f->opts.cache_dir, "%s", f->dir);
    f->opts.threads = 2;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    nftw(f->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(f);
    return 0;
}

static void emit_demo(cp_module_src *m, int n, double scale) {
    cp_kernel_spec k;
    cp_kspec_init(&k, "demo");
    cp_kspec_set_int(&k, "N", n);
    cp_kspec_set_double(&k, "SCALE", scale);
    char err[1024];
    int rc = cp_emit_text("demo", DEMO, &k, m, err, sizeof err);
    if (rc != 0) fail_msg("emit: %s", err);
    cp_kspec_free(&k);
}

static void emit_plain(cp_module_src *m, const char *family, const char *text) {
    cp_kernel_spec k;
    cp_kspec_init(&k, family);
    char err[1024];
    if (cp_emit_text(family, text, &k, m, err, sizeof err) != 0) fail_msg("emit: %s", err);
}

static void compile_ok(const cp_module_src *m, int n, const cp_jit_opts *o, cp_jit_module *out) {
    char err[8192];
    if (cp_jit_compile(m, n, o, out, err, sizeof err) != 0) fail_msg("compile: %s", err);
}

static void cubin_path(const cp_jit_module *jm, char *out, size_t n) {
    size_t l = strlen(jm->source_path);
    assert_true(l > 3 && strcmp(jm->source_path + l - 3, ".cu") == 0);
    snprintf(out, n, "%.*s.cubin", (int)(l - 3), jm->source_path);
}

static void check_demo(const cp_jit_module *jm) {
    assert_non_null(jm->cubin);
    assert_true(jm->cubin_len > 64);
    assert_memory_equal(jm->cubin, "\x7f" "ELF", 4);
    assert_int_equal(jm->nentries, 1);
    assert_string_equal(jm->entries[0].name, "demo_scale_n256");
    assert_true(jm->entries[0].registers > 0);
    assert_int_equal(jm->entries[0].spill_stores, 0);
    assert_int_equal(jm->entries[0].spill_loads, 0);
    assert_int_equal(access(jm->source_path, R_OK), 0);
}

static void test_compile_both_archs_then_cache(void **state) {
    fixture *f = *state;
    cp_module_src m;
    emit_demo(&m, 256, 2.0);
    const char *archs[] = {"sm_90a", "sm_80"};
    for (int a = 0; a < 2; a++) {
        cp_jit_opts o = f->opts;
        snprintf(o.arch, sizeof o.arch, "%s", archs[a]);
        cp_jit_module first, second;
        compile_ok(&m, 1, &o, &first);
        assert_false(first.from_cache);
        check_demo(&first);
        assert_string_equal(first.name, "demo_n256");
        compile_ok(&m, 1, &o, &second);
        assert_true(second.from_cache);
        check_demo(&second);
        assert_int_equal(second.cubin_len, first.cubin_len);
        assert_memory_equal(second.cubin, first.cubin, first.cubin_len);
        assert_memory_equal(&second.entries[0], &first.entries[0], sizeof first.entries[0]);
        assert_string_equal(second.source_path, first.source_path);
        /* the CUBIN's own sections say the same as ptxas's report */
        cp_entry_info from_elf[CP_MAX_ENTRIES];
        memset(from_elf, 0, sizeof from_elf);
        from_elf[0].registers = -1;
        assert_int_equal(cp_jit_entries_from_cubin(first.cubin, first.cubin_len, &m, from_elf), 1);
        assert_int_equal(from_elf[0].registers, first.entries[0].registers);
        assert_int_equal(cp_jit_entries_from_cubin(first.cubin, 63, &m, from_elf), 0);
        size_t len;
        char *kept = cp_read_file(first.source_path, &len);
        assert_non_null(kept);
        assert_string_equal(kept, m.source);
        free(kept);
        cp_jit_module_free(&first);
        cp_jit_module_free(&second);
    }
    cp_module_src_free(&m);
}

static void test_changes_miss_the_cache(void **state) {
    fixture *f = *state;
    cp_module_src a, b;
    emit_demo(&a, 256, 2.0);
    emit_demo(&b, 256, 3.0); /* same module name, different source */
    assert_string_equal(a.name, b.name);
    cp_jit_module ja, jb, jc, jd;
    compile_ok(&a, 1, &f->opts, &ja);
    compile_ok(&b, 1, &f->opts, &jb);
    assert_false(jb.from_cache);
    assert_string_not_equal(ja.source_path, jb.source_path);
    cp_jit_opts o80 = f->opts;
    snprintf(o80.arch, sizeof o80.arch, "sm_80");
    compile_ok(&a, 1, &o80, &jc);
    assert_false(jc.from_cache);
    cp_jit_opts oline = f->opts;
    oline.line_info = true; /* options are part of the key too */
    compile_ok(&a, 1, &oline, &jd);
    assert_false(jd.from_cache);
    cp_jit_module_free(&ja);
    cp_jit_module_free(&jb);
    cp_jit_module_free(&jc);
    cp_jit_module_free(&jd);
    compile_ok(&a, 1, &f->opts, &ja);
    assert_true(ja.from_cache);
    cp_jit_module_free(&ja);
    cp_module_src_free(&a);
    cp_module_src_free(&b);
}

typedef enum { FLIP_PAYLOAD, TRUNCATE, GARBAGE_HEADER, FLIP_KEY } damage;

static void damage_file(const char *path, damage d) {
    size_t len;
    char *data = cp_read_file(path, &len);
    assert_non_null(data);
    assert_true(len > 200);
    switch (d) {
    case FLIP_PAYLOAD: data[len / 2] ^= 0x20; break;
    case TRUNCATE: len -= 17; break;
    case GARBAGE_HEADER: memset(data, 'x', 64); break;
    case FLIP_KEY: data[20] ^= 1; break;
    }
    assert_int_equal(cp_write_file_atomic(path, data, len), 0);
    free(data);
}

static void test_corrupt_entries_are_rebuilt(void **state) {
    fixture *f = *state;
    cp_module_src m;
    emit_demo(&m, 256, 2.0);
    cp_jit_module ref;
    compile_ok(&m, 1, &f->opts, &ref);
    char path[1100];
    cubin_path(&ref, path, sizeof path);
    const damage kinds[] = {FLIP_PAYLOAD, TRUNCATE, GARBAGE_HEADER, FLIP_KEY};
    for (size_t i = 0; i < CP_ARRAY_LEN(kinds); i++) {
        damage_file(path, kinds[i]);
        cp_jit_module again, loaded;
        compile_ok(&m, 1, &f->opts, &again);
        assert_false(again.from_cache);
        assert_int_equal(again.cubin_len, ref.cubin_len);
        assert_memory_equal(again.cubin, ref.cubin, ref.cubin_len);
        compile_ok(&m, 1, &f->opts, &loaded);
        assert_true(loaded.from_cache);
        assert_memory_equal(loaded.cubin, ref.cubin, ref.cubin_len);
        cp_jit_module_free(&again);
        cp_jit_module_free(&loaded);
    }
    /* An empty file is corrupt too. */
    assert_int_equal(cp_write_file_atomic(path, "", 0), 0);
    cp_jit_module again;
    compile_ok(&m, 1, &f->opts, &again);
    assert_false(again.from_cache);
    cp_jit_module_free(&again);
    cp_jit_module_free(&ref);
    cp_module_src_free(&m);
}

static void test_no_cache_compiles_and_still_writes(void **state) {
    fixture *f = *state;
    cp_module_src m;
    emit_demo(&m, 256, 2.0);
    cp_jit_opts o = f->opts;
    o.no_cache = true;
    cp_jit_module a, b, c;
    compile_ok(&m, 1, &o, &a);
    compile_ok(&m, 1, &o, &b);
    assert_false(a.from_cache);
    assert_false(b.from_cache);
    compile_ok(&m, 1, &f->opts, &c);
    assert_true(c.from_cache);
    assert_memory_equal(c.cubin, a.cubin, a.cubin_len);
    cp_jit_module_free(&a);
    cp_jit_module_free(&b);
    cp_jit_module_free(&c);
    cp_module_src_free(&m);
}

static void test_compile_error_reports_log_and_source(void **state) {
    fixture *f = *state;
    cp_module_src m[2];
    emit_demo(&m[0], 256, 2.0);
    emit_plain(&m[1], "demo", BROKEN);
    cp_jit_module out[2];
    char err[8192];
    assert_int_equal(cp_jit_compile(m, 2, &f->opts, out, err, sizeof err), -1);
    assert_non_null(strstr(err, "demo_broken"));
    assert_non_null(strstr(err, "not_declared_anywhere")); /* the NVRTC log text */
    assert_non_null(strstr(err, "is undefined"));
    assert_non_null(strstr(err, f->dir));
    char *cu = strstr(err, "source: ");
    assert_non_null(cu);
    char path[1100];
    assert_int_equal(sscanf(cu, "source: %1099s", path), 1);
    assert_non_null(strstr(path, "demo_broken-"));
    assert_int_equal(access(path, R_OK), 0);
    char *lg = strstr(err, "log:    ");
    assert_non_null(lg);
    char logpath[1100];
    assert_int_equal(sscanf(lg, "log: %1099s", logpath), 1);
    char *log = cp_read_file(logpath, NULL);
    assert_non_null(log);
    assert_non_null(strstr(log, "not_declared_anywhere"));
    assert_non_null(strstr(log, "--gpu-architecture=sm_90a"));
    free(log);
    /* On failure everything was freed. */
    assert_null(out[0].cubin);
    assert_null(out[1].cubin);
    cp_module_src_free(&m[0]);
    cp_module_src_free(&m[1]);
}

/* A kernel the emitter sees but the compiler never builds would fail at launch; it fails at build time instead. */
static void test_entry_missing_from_the_cubin(void **state) {
    fixture *f = *state;
    cp_module_src m;
    emit_plain(&m, "demo", "// module: demo_gone\n"
                           "extern \"C\" __global__ void demo_here_gone(float *x) { x[0] = 1; }\n"
                           "#if 0\n"
                           "extern \"C\" __global__ void demo_away_gone(float *x) { x[0] = 2; }\n"
                           "#endif\n");
    assert_int_equal(m.nentries, 2);
    cp_jit_module jm;
    char err[8192];
    assert_int_equal(cp_jit_compile(&m, 1, &f->opts, &jm, err, sizeof err), -1);
    assert_non_null(strstr(err, "demo_away_gone"));
    assert_non_null(strstr(err, "source: "));
    cp_module_src_free(&m);
}

static void test_spills_are_reported(void **state) {
    fixture *f = *state;
    cp_module_src m;
    emit_plain(&m, "demo", SPILL);
    cp_jit_module jm;
    compile_ok(&m, 1, &f->opts, &jm);
    assert_int_equal(jm.nentries, 1);
    assert_string_equal(jm.entries[0].name, "demo_k_spill");
    assert_true(jm.entries[0].registers > 0 && jm.entries[0].registers <= 32);
    assert_true(jm.entries[0].spill_stores > 0);
    assert_true(jm.entries[0].spill_loads > 0);
    assert_true(jm.entries[0].stack_bytes > 0);
    cp_jit_module cached;
    compile_ok(&m, 1, &f->opts, &cached);
    assert_true(cached.from_cache);
    assert_memory_equal(&cached.entries[0], &jm.entries[0], sizeof jm.entries[0]);
    cp_jit_module_free(&jm);
    cp_jit_module_free(&cached);
    cp_module_src_free(&m);
}

static void test_parallel_and_duplicates(void **state) {
    fixture *f = *state;
    enum { N = 6 };
    cp_module_src m[N];
    for (int i = 0; i < N - 1; i++) emit_demo(&m[i], 64 << i, 2.0);
    emit_demo(&m[N - 1], 64, 2.0); /* the same as m[0] */
    cp_jit_opts o = f->opts;
    o.threads = 3;
    cp_jit_module out[N];
    compile_ok(m, N, &o, out);
    for (int i = 0; i < N; i++) {
        assert_string_equal(out[i].name, m[i].name);
        assert_non_null(out[i].cubin);
        assert_memory_equal(out[i].cubin, "\x7f" "ELF", 4);
        assert_string_equal(out[i].entries[0].name, m[i].entries[0]);
        assert_false(out[i].from_cache);
    }
    assert_int_equal(out[N - 1].cubin_len, out[0].cubin_len);
    assert_memory_equal(out[N - 1].cubin, out[0].cubin, out[0].cubin_len);
    for (int i = 0; i < N; i++) cp_jit_module_free(&out[i]);
    compile_ok(m, N, &o, out);
    for (int i = 0; i < N; i++) {
        assert_true(out[i].from_cache);
        cp_jit_module_free(&out[i]);
    }
    for (int i = 0; i < N; i++) cp_module_src_free(&m[i]);
}

static void test_bad_arch(void **state) {
    fixture *f = *state;
    cp_module_src m;
    emit_demo(&m, 256, 2.0);
    cp_jit_module jm;
    char err[4096];
    const char *bad[] = {"compute_90", "sm_9x", "sm_1"};
    for (size_t i = 0; i < CP_ARRAY_LEN(bad); i++) {
        cp_jit_opts o = f->opts;
        snprintf(o.arch, sizeof o.arch, "%s", bad[i]);
        assert_int_equal(cp_jit_compile(&m, 1, &o, &jm, err, sizeof err), -1);
        assert_non_null(strstr(err, bad[i]));
    }
    cp_module_src_free(&m);
}

/* The real CUDA 13.0 ptxas -v format, with a non-entry function and a made-up spill on the second entry. */
static void test_parse_ptxas_log(void **state) {
    (void)state;
    const char *log =
        "ptxas info    : 0 bytes gmem\n"
        "ptxas info    : Compiling entry function 'fam_b_x' for 'sm_80'\n"
        "ptxas info    : Function properties for fam_b_x\n"
        "ptxas         .     256 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 32 registers, used 0 barriers, 800 bytes cumulative stack size, 364 bytes cmem[0]\n"
        "ptxas info    : Compile time = 4.162 ms\n"
        "ptxas info    : Function properties for _Z6helperPfi\n"
        "ptxas         .     0 bytes stack frame, 40 bytes spill stores, 40 bytes spill loads\n"
        "ptxas info    : Compiling entry function 'fam_a_x' for 'sm_80'\n"
        "ptxas info    : Function properties for fam_a_x\n"
        "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 10 registers, used 1 barriers, 256 bytes smem, 360 bytes cmem[0]\n"
        "ptxas info    : Compile time = 0.842 ms\n";
    cp_module_src m = {.nentries = 3};
    snprintf(m.entries[0], CP_KNAME_MAX, "fam_a_x");
    snprintf(m.entries[1], CP_KNAME_MAX, "fam_b_x");
    snprintf(m.entries[2], CP_KNAME_MAX, "fam_c_x");
    cp_entry_info e[3];
    assert_int_equal(cp_jit_parse_ptxas_log(log, &m, e), 2);
    assert_string_equal(e[0].name, "fam_a_x");
    assert_int_equal(e[0].registers, 10);
    assert_int_equal(e[0].shared_bytes, 256);
    assert_int_equal(e[0].stack_bytes, 0);
    assert_int_equal(e[0].spill_stores, 0);
    assert_int_equal(e[1].registers, 32);
    assert_int_equal(e[1].shared_bytes, 0);
    assert_int_equal(e[1].stack_bytes, 800);
    assert_int_equal(e[1].spill_stores, 8);
    assert_int_equal(e[1].spill_loads, 12);
    assert_int_equal(e[2].registers, -1);
    assert_int_equal(cp_jit_parse_ptxas_log("", &m, e), 0);
    assert_int_equal(cp_jit_parse_ptxas_log(NULL, &m, e), 0);
}

static void test_cache_dir_default(void **state) {
    (void)state;
    cp_jit_opts o = {0};
    char dir[1024];
    char *old_xdg = getenv("XDG_CACHE_HOME") ? cp_xstrdup(getenv("XDG_CACHE_HOME")) : NULL;
    char *old_home = getenv("HOME") ? cp_xstrdup(getenv("HOME")) : NULL;
    setenv("XDG_CACHE_HOME", "/some/where", 1);
    cp_jit_cache_dir(&o, dir, sizeof dir);
    assert_string_equal(dir, "/some/where/cpgen");
    setenv("XDG_CACHE_HOME", "relative", 1); /* ignored, per the XDG spec */
    setenv("HOME", "/home/someone", 1);
    cp_jit_cache_dir(&o, dir, sizeof dir);
    assert_string_equal(dir, "/home/someone/.cache/cpgen");
    snprintf(o.cache_dir, sizeof o.cache_dir, "/explicit");
    cp_jit_cache_dir(&o, dir, sizeof dir);
    assert_string_equal(dir, "/explicit");
    if (old_xdg) setenv("XDG_CACHE_HOME", old_xdg, 1);
    else unsetenv("XDG_CACHE_HOME");
    if (old_home) setenv("HOME", old_home, 1);
    free(old_xdg);
    free(old_home);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_compile_both_archs_then_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_changes_miss_the_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_entries_are_rebuilt, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_cache_compiles_and_still_writes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_compile_error_reports_log_and_source, setup, teardown),
        cmocka_unit_test_setup_teardown(test_entry_missing_from_the_cubin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_spills_are_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parallel_and_duplicates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_arch, setup, teardown),
        cmocka_unit_test(test_parse_ptxas_log),
        cmocka_unit_test(test_cache_dir_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
