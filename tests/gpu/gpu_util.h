/* gpu_util.h: helpers of the GPU tests and benchmarks: the device, modules emitted from the templates and compiled
 * with the JIT, device buffers, seeded random inputs, NaN poisoning, error measures and the closing table. */
#ifndef GPU_UTIL_H
#define GPU_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "emit.h"
#include "jit.h"
#include "kernels.h"
#include "module.h"
#include "plan.h"

typedef struct {
    int dev, sms;
    char arch[16];
    char name[256];
    size_t mem;
} gu_device;
extern gu_device gu_dev;

/* Use GPU 0 and print what it is. Returns 0, or -1 after printing why there is no usable GPU. */
int gu_init(void);

/* A test that cannot run on this machine (no GPU, too few, the wrong architecture) is skipped, neither passed nor
 * failed: it prints one line "<test>: skipped: <why>" and exits GU_SKIPPED, the status automake gives a skipped
 * test, which tools/run-tests.sh and the check scripts (tools/check_common.sh) count as skipped. */
#define GU_SKIPPED 77
void gu_skip(const char *test, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
/* Skip unless this machine has n usable GPUs (cp_gpu_count: those CUDA_VISIBLE_DEVICES leaves). */
void gu_need_gpus(const char *test, int n);
/* gu_need_gpus(test, 1), then gu_init: a GPU that is there but cannot be used fails the test (exit 1), it is not
 * a skip. */
void gu_init_or_skip(const char *test);
/* A test binary's exit status from cmocka's count of failed tests: 1 when a test failed (a count of 77 must not
 * read as skipped) or when no comparison was recorded by gu_check (a test that compared nothing proves nothing),
 * else 0. */
int gu_status(int failed);

/* Inside a cmocka test, failures fail the test (fail_msg); outside (benchmarks), they exit(1). */
extern bool gu_cmocka;
void gu_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

typedef struct {
    cp_kernel_spec spec;
    cp_module_src src;
    cp_jit_module jit;
    cp_module mod;
} gu_module;

/* Emit the module for k, compile it for gu_dev.arch through the JIT cache, load it. Prints each entry's registers
 * and spills once. Fails on any error or spill. */
gu_module *gu_build(const cp_kernel_spec *k);
void gu_free(gu_module *m);
cudaKernel_t gu_kernel(gu_module *m, const char *role);
/* Geometry of role for (n, heads) from cp_k_dims. */
cp_kdims gu_dims(gu_module *m, const char *role, int64_t n, int64_t heads);
/* Launch role with cp_k_dims(n, heads) geometry, wait for it and check for errors. */
void gu_run(gu_module *m, const char *role, int64_t n, int64_t heads, void **args);
/* The same with a grid of z in its third dimension (the FP8 casts of every layer's weight at once) */
void gu_run_z(gu_module *m, const char *role, int64_t n, int64_t heads, unsigned z, void **args);
/* An fp8 module's cast `role` of a source [rows][cols] as the executor launches it: a transposed row-scaled cast
 * (cast_t_row_*) after cast_t_row_max with the same arguments, whose scales then need room for
 * cp_fp8_row_parts(rows, cols) more (gen/kernels.h); both row-scaled copies (cast_rt_row_*: args src, rows, cols,
 * ld, dst, scales, dst_t, scales_t, the last with that room) as the zeroed parts, the role, then cast_t_row_* on the
 * transposed copy; any other cast alone. */
void gu_run_fp8_cast(gu_module *m, const char *role, int64_t rows, int64_t cols, void **args);

/* The plan of spec (a shipped spec's name or a path) with the overrides sets ("key=value"), as the command line
 * makes it: the documents resolved from the data source first. Fails (gu_fail) on an error or a plan that does not
 * fit. */
void gu_plan(const char *spec, const char **sets, int nsets, cp_plan *p);

/* Device memory (failures fail). */
void *gu_malloc(size_t bytes);
void gu_free_dev(void *p);
void gu_upload(void *dst, const void *src, size_t bytes);
void gu_download(void *dst, const void *src, size_t bytes);
/* Fill with 0xFF bytes: NaN as bf16 (0xFFFF) and as fp32 (0xFFFFFFFF), so unwritten outputs show up. */
void gu_poison(void *dev, size_t bytes);

/* The median milliseconds of `reps` (at most 256) calls of launch(ctx), each between two CUDA events on the default
 * stream, after `warm` untimed calls; launch enqueues its work on the default stream (and fails the test itself). */
double gu_median_ms(int reps, int warm, void (*launch)(void *ctx), void *ctx);

/* Seeded generator: xoshiro256** seeded by splitmix64. */
typedef struct {
    uint64_t s[4];
} gu_rng;
void gu_seed(gu_rng *r, uint64_t seed);
uint64_t gu_next(gu_rng *r);
double gu_uniform(gu_rng *r); /* [-1, 1) */
double gu_normal(gu_rng *r);
/* Arrays of normal(0, scale) values, never exactly zero; caller frees. */
uint16_t *gu_rand_bf16(gu_rng *r, int64_t n, double scale);
float *gu_rand_f32(gu_rng *r, int64_t n, double scale);

/* Relative error ||out - ref|| / ||ref|| in double (||out|| when ref is all zero); NaN if out or ref holds a NaN. */
double gu_rel_err_bf16(const uint16_t *out, const uint16_t *ref, int64_t n);
double gu_rel_err_f32(const float *out, const float *ref, int64_t n);
int64_t gu_nan_bf16(const uint16_t *p, int64_t n);
int64_t gu_nan_f32(const float *p, int64_t n);

/* Print "compare <what> <shape>: rel err E (bound B)" and record it for the table (worst per kernel and shape);
 * fail if E is NaN or above B. */
void gu_check(const char *what, const char *shape, double err, double bound);
/* The table of the worst relative error of every kernel and shape checked, with its bound. */
void gu_print_table(void);

#endif
