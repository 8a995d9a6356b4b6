/* test_kernel_families.c: the kernel family constructors of gen/kernels.h (attention aside) at the shapes the GPU
 * tests use, including odd ones the shipped specs do not (hidden 200, head_dim 64, 4-byte Ulysses rows, replicated
 * heads, odd head counts, an LSE merge of head_dim 96): each module emits, names the entries its roles need, compiles
 * with NVRTC for sm_90a and sm_80 without register spills, and cp_k_dims gives launch geometry that covers the
 * work. Needs NVRTC, no GPU. */
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

#include "emit.h"
#include "gemm_fp8.h"
#include "jit.h"
#include "kernels.h"
#include "util.h"

static char cache_dir[256];

static int group_setup(void **state) {
    (void)state;
    return tmpdir_make(cache_dir, sizeof cache_dir, "families");
}

static int group_teardown(void **state) {
    (void)state;
    tmpdir_remove(cache_dir);
    return 0;
}

#define MAXSPECS 64
static cp_kernel_spec specs[MAXSPECS];
static int nspecs;

static cp_kernel_spec *add(void) {
    assert_true(nspecs < MAXSPECS);
    return &specs[nspecs++];
}

static void rope_spec(int64_t D, double theta, bool scaled, double factor) {
    cp_model m;
    memset(&m, 0, sizeof m);
    m.head_dim = D;
    m.rope_theta = theta;
    m.rope_scaling = (cp_rope_scaling){scaled, factor, 1, 4, 8192};
    cp_k_rope(add(), &m);
}

static void make_specs(void) {
    nspecs = 0;
    const int64_t H[] = {128, 200, 256, 2048, 3072, 4096, 5120};
    for (size_t i = 0; i < CP_ARRAY_LEN(H); i++) cp_k_rmsnorm(add(), H[i], i % 2 ? 1e-6 : 1e-5);
    cp_k_embedding(add(), 512, 256);
    cp_k_embedding(add(), 128256, 2048);
    cp_k_embedding(add(), 1000, 5120);
    cp_k_embedding(add(), 1000, 100); /* rows of 100 bf16: 8-byte vectors */
    rope_spec(128, 500000, true, 8);
    rope_spec(64, 500000, true, 32);
    rope_spec(128, 1e6, false, 1);
    rope_spec(96, 10000, false, 1);
    const int64_t F[] = {8192, 14336, 25600, 1000};
    for (size_t i = 0; i < CP_ARRAY_LEN(F); i++) cp_k_swiglu(add(), F[i]);
    const int64_t V[] = {512, 128256, 151936, 1001};
    for (size_t i = 0; i < CP_ARRAY_LEN(V); i++) cp_k_loss(add(), V[i]);
    cp_k_adamw(add());
    cp_k_cast(add());
    cp_k_fp8(add());
    /* the FP8 GEMM: each output mode, both ways of scaling B, a gradient in E5M2 on either side */
    assert_true(cp_k_gemm_fp8(add(), 3072, 3072, false, false, true, CP_GEMM_FP8_WRITE, (cp_gemm_fp8_cfg){0}));
    assert_true(cp_k_gemm_fp8(add(), 3072, 8192, false, false, true, CP_GEMM_FP8_RESIDUAL, (cp_gemm_fp8_cfg){0}));
    assert_true(cp_k_gemm_fp8(add(), 1024, 3072, true, false, true, CP_GEMM_FP8_ADD_BF16, (cp_gemm_fp8_cfg){0}));
    assert_true(cp_k_gemm_fp8(add(), 3072, 32768, true, false, false, CP_GEMM_FP8_ADD_F32, (cp_gemm_fp8_cfg){0}));
    assert_true(cp_k_gemm_fp8(add(), 8192, 4096, false, true, false, CP_GEMM_FP8_ADD_F32, (cp_gemm_fp8_cfg){0}));
    /* a cluster of two; two consumer warpgroups (tiles of 128 rows), with and without B's 1 x 128 scales */
    assert_true(cp_k_gemm_fp8(add(), 3072, 3072, false, false, true, CP_GEMM_FP8_WRITE, (cp_gemm_fp8_cfg){2, 0}));
    assert_true(cp_k_gemm_fp8(add(), 3072, 3072, false, false, true, CP_GEMM_FP8_WRITE, (cp_gemm_fp8_cfg){0, 2}));
    assert_true(cp_k_gemm_fp8(add(), 3072, 32768, true, false, false, CP_GEMM_FP8_ADD_F32, (cp_gemm_fp8_cfg){1, 2}));
    cp_kernel_spec no;
    assert_false(cp_k_gemm_fp8(&no, 3072, 3072, false, false, true, CP_GEMM_FP8_WRITE, (cp_gemm_fp8_cfg){2, 3}));
    assert_false(cp_k_gemm_fp8(&no, 3000, 3072, false, false, true, CP_GEMM_FP8_WRITE, (cp_gemm_fp8_cfg){0}));
    assert_false(cp_k_gemm_fp8(&no, 3072, 3000, false, false, true, CP_GEMM_FP8_WRITE, (cp_gemm_fp8_cfg){0}));
    assert_false(cp_k_gemm_fp8(&no, 3072, 3072, true, true, true, CP_GEMM_FP8_WRITE, (cp_gemm_fp8_cfg){0}));
    assert_false(cp_k_gemm_fp8(&no, 3072, 3072, false, false, true, CP_GEMM_FP8_WRITE, (cp_gemm_fp8_cfg){0, 4}));
    cp_k_attn_delta(add(), 128);
    cp_k_attn_delta(add(), 64);
    cp_k_attn_merge(add(), 128);
    cp_k_attn_merge(add(), 64);
    cp_k_attn_merge(add(), 96); /* rows of 12 vectors: the last lanes hold one vector fewer */
    cp_k_ulysses(add(), 8, 1, 1000, 4, 256);
    cp_k_ulysses(add(), 8, 1, 7, 4, 4);
    cp_k_ulysses(add(), 8, 2, 1000, 1, 256);
    cp_k_ulysses(add(), 1, 1, 4097, 8, 256);
    cp_k_ulysses(add(), 2, 1, 1, 3, 128);
    cp_k_ulysses(add(), 4, 4, 33, 2, 128);
    cp_k_ulysses(add(), 8, 1, 1 << 20, 8, 256); /* 64-bit unit indices */
}

static void free_specs(void) {
    for (int i = 0; i < nspecs; i++) cp_kspec_free(&specs[i]);
    nspecs = 0;
}

/* The roles each family's entries must have (cp_entry_name of each must be among the module's entries). */
static const char *const *roles_of(const char *family) {
    static const char *const fb[] = {"fwd", "bwd", NULL}, *const f[] = {"fwd", NULL},
                             *const loss[] = {"fwdbwd", "sum", NULL},
                             *const norm[] = {"fwd", "fwd_copy", "fwd_row", "bwd", "bwd_copy", "bwd_row", "bwd_dw",
                                              NULL},
                             *const swiglu[] = {"fwd", "fwd_copy", "fwd_row", "bwd", "bwd_copy", "bwd_row", NULL},
                             *const adamw[] = {"update", "sumsq", NULL}, *const cast[] = {"f32_to_bf16", "add_f32", NULL},
                             *const uly[] = {"pack", "unpack", "unpack_amax", "unpack_copy", "unpack_add", NULL},
                             *const emb[] = {"fwd", "bwd", "bwd_sorted", NULL},
                             *const merge[] = {"fwd", "init", NULL}, *const gemm[] = {"sm90", NULL},
                             *const rope[] = {"fwd", "bwd", "bwd_copy", NULL},
                             *const fp8[] = {"amax_e4m3",   "amax_e5m2",   "cast_e4m3", "cast_e5m2",
                                             "cast_t_e4m3", "cast_t_e5m2", "cast_1d_e4m3", "cast_1d_e5m2",
                                             "cast_t_1d_e4m3", "cast_t_1d_e5m2", "cast_rt_1d_e4m3", "cast_rt_1d_e5m2",
                                             "cast_2d_e4m3", "cast_t_2d_e4m3", NULL};
    if (!strcmp(family, "loss")) return loss;
    if (!strcmp(family, "rmsnorm")) return norm;
    if (!strcmp(family, "swiglu")) return swiglu;
    if (!strcmp(family, "adamw")) return adamw;
    if (!strcmp(family, "cast")) return cast;
    if (!strcmp(family, "ulysses")) return uly;
    if (!strcmp(family, "attn_delta")) return f;
    if (!strcmp(family, "embedding")) return emb;
    if (!strcmp(family, "attn_merge")) return merge;
    if (!strcmp(family, "fp8")) return fp8;
    if (!strcmp(family, "gemm_fp8")) return gemm;
    if (!strcmp(family, "rope")) return rope;
    return fb;
}

static void test_emit_compile_no_spills(void **state) {
    (void)state;
    make_specs();
    cp_module_src *mods = cp_xcalloc((size_t)nspecs, sizeof *mods);
    for (int i = 0; i < nspecs; i++) {
        char err[4096];
        if (cp_emit(&specs[i], &mods[i], err, sizeof err) != 0) fail_msg("%s: %s", specs[i].family, err);
        for (const char *const *r = roles_of(specs[i].family); *r; r++) {
            char want[CP_KNAME_MAX];
            cp_entry_name(specs[i].family, mods[i].name, *r, want);
            bool found = false;
            for (int e = 0; e < mods[i].nentries; e++) found |= !strcmp(mods[i].entries[e], want);
            if (!found) fail_msg("module %s has no entry %s", mods[i].name, want);
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(mods[i].name, mods[j].name)) fail_msg("two different specs give module name %s", mods[i].name);
    }
    const char *archs[] = {"sm_90a", "sm_80"};
    cp_jit_module *out = cp_xcalloc((size_t)nspecs, sizeof *out);
    for (int a = 0; a < 2; a++) {
        cp_jit_opts o;
        memset(&o, 0, sizeof o);
        snprintf(o.arch, sizeof o.arch, "%s", archs[a]);
        snprintf(o.cache_dir, sizeof o.cache_dir, "%s", cache_dir);
        char err[16384];
        double t0 = cp_now();
        if (cp_jit_compile(mods, nspecs, &o, out, err, sizeof err) != 0) fail_msg("%s: %s", archs[a], err);
        int spills = 0;
        for (int i = 0; i < nspecs; i++) {
            assert_int_equal(out[i].nentries, mods[i].nentries);
            for (int e = 0; e < out[i].nentries; e++) {
                const cp_entry_info *x = &out[i].entries[e];
                assert_true(x->registers > 0);
                /* its static shared memory beside the dynamic its launch asks for fits a Hopper block */
                for (const char *const *r = roles_of(specs[i].family); a == 0 && *r; r++) {
                    char name[CP_KNAME_MAX];
                    cp_entry_name(specs[i].family, mods[i].name, *r, name);
                    cp_kdims d;
                    if (strcmp(name, x->name) || cp_k_dims(&specs[i], *r, 1 << 20, 8, 132, &d)) continue;
                    if (x->shared_bytes + d.smem > 227 * 1024)
                        fail_msg("%s: %d bytes of static shared memory and %u dynamic", x->name, x->shared_bytes,
                                 d.smem);
                }
                if (x->spill_stores || x->spill_loads || x->stack_bytes) {
                    print_message("%s: %s spills %d/%d bytes, stack %d bytes\n", archs[a], x->name, x->spill_stores,
                                  x->spill_loads, x->stack_bytes);
                    spills++;
                }
            }
            cp_jit_module_free(&out[i]);
        }
        print_message("%s: %d modules in %.1f s\n", archs[a], nspecs, cp_now() - t0);
        assert_int_equal(spills, 0);
    }
    free(out);
    for (int i = 0; i < nspecs; i++) cp_module_src_free(&mods[i]);
    free(mods);
    free_specs();
}

static int64_t param(const cp_kernel_spec *k, const char *key) {
    const char *v = cp_kspec_get(k, key);
    assert_non_null(v);
    return strtoll(v, NULL, 10);
}

/* Threads the entry needs for n rows (or elements): each family's unit of work per thread, from its template. */
static void test_dims_cover_the_work(void **state) {
    (void)state;
    make_specs();
    const int64_t ns[] = {1, 7, 1000, 4097, 1 << 20};
    for (int i = 0; i < nspecs; i++) {
        const cp_kernel_spec *k = &specs[i];
        for (const char *const *r = roles_of(k->family); *r; r++)
            for (size_t j = 0; j < CP_ARRAY_LEN(ns); j++) {
                int64_t n = ns[j], heads = 8;
                cp_kdims d;
                assert_int_equal(cp_k_dims(k, *r, n, heads, 132, &d), 0);
                assert_true(d.block >= 32 && d.block <= 1024 && d.block % 32 == 0);
                /* 2D grids: 128 x 64 tiles (the per-tensor transposed casts), 128 x 128 (the block-scaled casts
                 * that transpose, and a weight's) */
                bool fp8 = !strcmp(k->family, "fp8");
                bool wide = fp8 && (strstr(*r, "_2d_") || !strncmp(*r, "cast_t_1d", 9) || !strncmp(*r, "cast_rt", 7));
                bool tiles = wide || (fp8 && !strncmp(*r, "cast_t", 6));
                assert_true(d.grid[0] >= 1 && (tiles || d.grid[1] == 1) && d.grid[2] == 1);
                const char *f = k->family;
                /* the row entries' pipes (templates/row_pipe.cuh): stages of 16-byte words a thread, where the
                 * planner may ask for those entries (none elsewhere: the entry traps) */
                bool row = (!strcmp(f, "rmsnorm") || !strcmp(f, "swiglu")) && strstr(*r, "_row");
                int64_t smem = !strcmp(f, "gemm_fp8") ? param(k, "SMEM_BYTES") : 0;
                if (row) {
                    bool fwd = (*r)[0] == 'f', norm = !strcmp(f, "rmsnorm");
                    int64_t stages = param(k, fwd ? (norm ? "ROW_STAGES" : "ROW_STAGES_F") : "ROW_STAGES_B");
                    int64_t words = norm ? param(k, fwd ? "NV" : "NV_B") : (param(k, "FFN") / 8 + 511) / 512;
                    smem = stages * (fwd ? 2 : 3) * words * d.block * 16;
                    assert_true(smem <= 227 * 1024);
                    assert_int_equal(stages > 0, cp_k_fp8_row_copies(k, fwd ? "fwd" : "bwd"));
                }
                assert_int_equal(d.smem, smem);
                int64_t threads = (int64_t)d.grid[0] * d.block, need = 0;
                if (!strcmp(f, "gemm_fp8")) {
                    /* persistent: a block per SM at most, each walking tiles of (64 x CONSUMERS) x 128 */
                    int64_t cl = param(k, "CLUSTER"), cw = param(k, "CONSUMERS"), bm = 64 * cw;
                    int64_t units = ((n + bm - 1) / bm + cl - 1) / cl * (param(k, "N") / 128);
                    assert_int_equal(d.grid[0], CP_MIN(units, 132 / cl) * cl);
                    assert_int_equal(d.block, 128 * (1 + cw));
                    assert_true(d.smem <= 227 * 1024 && param(k, "STAGES") >= 4);
                    need = 1;
                } else if (tiles) {
                    /* n rows, heads columns: a block per tile */
                    assert_int_equal(d.grid[0], (heads + (wide ? 127 : 63)) / (wide ? 128 : 64));
                    assert_int_equal(d.grid[1], (n + 127) / 128);
                    need = 1;
                } else if (!strcmp(f, "fp8") && !strncmp(*r, "amax", 4)) {
                    assert_true(d.grid[0] <= CP_FP8_AMAX_PARTS); /* a part per block */
                    need = 1;
                } else if (!strcmp(f, "rmsnorm") && !strcmp(*r, "bwd_dw")) {
                    /* a thread per DW_V columns for each of DW_GROUPS groups of parts */
                    assert_int_equal(d.block, param(k, "DW_TPC") * param(k, "DW_GROUPS"));
                    need = (param(k, "HIDDEN") + param(k, "DW_V") - 1) / param(k, "DW_V") * param(k, "DW_GROUPS");
                } else if (!strcmp(f, "rmsnorm")) {
                    bool fwd = !strncmp(*r, "fwd", 3); /* fwd, fwd_copy, fwd_row; bwd, bwd_copy, bwd_row */
                    int64_t tpr = param(k, fwd ? "TPR" : "TPR_B"), rpb = param(k, fwd ? "RPB" : "RPB_B");
                    assert_int_equal(d.block, tpr * rpb);
                    need = fwd && !row ? n * tpr : CP_MIN(n * tpr, threads); /* bwd and the row entries loop */
                    if (!fwd) {
                        assert_true(d.grid[0] <= 132 * 2 * param(k, "MIN_BLOCKS_B"));
                        /* the planner's scratch holds a row per block on any GPU */
                        assert_true(cp_k_scratch_bytes(k, "bwd", n) >= (int64_t)d.grid[0] * param(k, "HIDDEN") * 4);
                        cp_kdims big;
                        assert_int_equal(cp_k_dims(k, "bwd", n, 0, 100000, &big), 0);
                        assert_true(cp_k_scratch_bytes(k, "bwd", n) >= (int64_t)big.grid[0] * param(k, "HIDDEN") * 4);
                    }
                } else if (!strcmp(f, "loss") && !strcmp(*r, "sum")) {
                    assert_int_equal(d.grid[0], 1); /* one block: a fixed order */
                    need = threads;
                } else if (!strcmp(f, "loss")) {
                    assert_int_equal(d.grid[0], n);
                    need = threads;
                } else if (!strcmp(f, "adamw") && !strcmp(*r, "sumsq")) {
                    cp_kdims big;
                    assert_int_equal(cp_k_dims(k, "sumsq", n, 0, 100000, &big), 0);
                    assert_true(cp_k_scratch_bytes(k, "sumsq", n) >= (int64_t)big.grid[0] * 8);
                    assert_true(cp_k_scratch_bytes(k, "sumsq", n) >= (int64_t)d.grid[0] * 8);
                    need = 1;
                } else if (!strcmp(f, "rope")) {
                    need = n * (param(k, "D") / 2 / param(k, "VEC"));
                } else if (!strcmp(f, "attn_delta") || !strcmp(f, "attn_merge")) {
                    need = n * heads * param(k, "TPR");
                } else {
                    need = 1; /* grid-stride loops: any grid covers the work */
                }
                if (threads < need)
                    fail_msg("%s %s n=%lld: %lld threads for %lld", k->family, *r, (long long)n, (long long)threads,
                             (long long)need);
            }
        cp_kdims d;
        assert_int_equal(cp_k_dims(k, "no_such_role", 10, 1, 132, &d), -1);
        if (strcmp(k->family, "ulysses") != 0) { /* n = 0: nothing to launch */
            const char *r0 = roles_of(k->family)[0];
            assert_int_equal(cp_k_dims(k, r0, 0, 8, 132, &d), 0);
            assert_int_equal(d.grid[0], 0);
        }
    }
    cp_kernel_spec other;
    cp_kspec_init(&other, "attention");
    cp_kdims d;
    assert_int_equal(cp_k_dims(&other, "fwd", 1, 1, 132, &d), -1);
    cp_kspec_free(&other);
    free_specs();
}

/* The FP8 GEMM kernel's consumer warpgroups for a call: three (tiles of 192 rows) where the rows fill the SMs in as
 * many waves or fewer per row of time, two where 192-row tiles leave a wave nearly empty (a 1024-row weight's
 * gradient); two in clusters of two; a GEMM the kernel does not take (fast accumulation, A read transposed) refused. */
static void test_gemm_fp8_choice(void **state) {
    (void)state;
    assert_int_equal(cp_gemm_fp8_consumers(32768, 3072, 132), 3); /* q_proj: 32 waves of 192 rows, 47 of 128 */
    assert_int_equal(cp_gemm_fp8_consumers(3072, 3072, 132), 3);  /* d_wq: 3 waves against 5 */
    assert_int_equal(cp_gemm_fp8_consumers(1024, 3072, 132), 2);  /* d_wk: 2 waves either way */
    cp_gemm g = {.m = 1024, .n = 3072, .k = 32768, .lda = 32768, .ldb = 32768, .ldd = 3072, .trans_b = true,
                 .accumulate = true, .out_f32 = true, .a_type = CP_GEMM_E5M2, .b_type = CP_GEMM_E4M3,
                 .a_scale = CP_GEMM_SCALE_1D, .b_scale = CP_GEMM_SCALE_1D};
    cp_kernel_spec k;
    assert_true(cp_gemm_fp8_kspec(&g, (cp_gemm_fp8_cfg){0}, &k));
    assert_string_equal(cp_kspec_get(&k, "CONSUMERS"), "2");
    cp_kspec_free(&k);
    g.m = 32768;
    assert_true(cp_gemm_fp8_kspec(&g, (cp_gemm_fp8_cfg){0}, &k));
    assert_string_equal(cp_kspec_get(&k, "CONSUMERS"), "3");
    cp_kspec_free(&k);
    assert_true(cp_gemm_fp8_kspec(&g, (cp_gemm_fp8_cfg){2, 0}, &k));
    assert_string_equal(cp_kspec_get(&k, "CONSUMERS"), "2");
    assert_string_equal(cp_kspec_get(&k, "CLUSTER"), "2");
    cp_kspec_free(&k);
    cp_gemm fast = g, ta = g;
    fast.fast_accum = true;
    ta.trans_a = true;
    assert_false(cp_gemm_fp8_kspec(&fast, (cp_gemm_fp8_cfg){0}, &k));
    assert_false(cp_gemm_fp8_kspec(&ta, (cp_gemm_fp8_cfg){0}, &k));
}

/* Module names carry every value that changes the code: eps, the frequency table, Ulysses' layout. */
static void test_module_names(void **state) {
    (void)state;
    cp_kernel_spec a, b;
    cp_module_src ma, mb;
    char err[2048];
    cp_k_rmsnorm(&a, 4096, 1e-5);
    cp_k_rmsnorm(&b, 4096, 1e-6);
    assert_int_equal(cp_emit(&a, &ma, err, sizeof err), 0);
    assert_int_equal(cp_emit(&b, &mb, err, sizeof err), 0);
    assert_string_equal(ma.name, "rmsnorm_h4096_e1em05");
    assert_string_equal(mb.name, "rmsnorm_h4096_e1em06");
    cp_module_src_free(&ma), cp_module_src_free(&mb), cp_kspec_free(&a), cp_kspec_free(&b);
    cp_model m;
    memset(&m, 0, sizeof m);
    m.head_dim = 128;
    m.rope_theta = 500000;
    cp_k_rope(&a, &m);
    m.rope_scaling = (cp_rope_scaling){true, 8, 1, 4, 8192};
    cp_k_rope(&b, &m);
    assert_int_equal(cp_emit(&a, &ma, err, sizeof err), 0);
    assert_int_equal(cp_emit(&b, &mb, err, sizeof err), 0);
    assert_true(strncmp(ma.name, "rope_d128_f", 11) == 0 && strlen(ma.name) == 19);
    assert_string_not_equal(ma.name, mb.name);
    cp_module_src_free(&ma), cp_module_src_free(&mb), cp_kspec_free(&a), cp_kspec_free(&b);
    cp_k_ulysses(&a, 8, 2, 4096, 1, 256);
    assert_int_equal(cp_emit(&a, &ma, err, sizeof err), 0);
    assert_string_equal(ma.name, "ulysses_c8_r2_t4096_n1_b256");
    assert_string_equal(ma.entries[2], "ulysses_unpack_add_c8_r2_t4096_n1_b256");
    cp_module_src_free(&ma), cp_kspec_free(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_module_names),
        cmocka_unit_test(test_gemm_fp8_choice),
        cmocka_unit_test(test_dims_cover_the_work),
        cmocka_unit_test(test_emit_compile_no_spills),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
