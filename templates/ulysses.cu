// module: ulysses_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}
// Ulysses all-to-all layouts for one stage (arguments: gen/kernels.h). C ranks, T tokens per rank, rows of
// ROW_BYTES bytes (one head of one token). Destination rank r gets NOUT heads: head (r / R) * NOUT + j, j < NOUT,
// of the source's NIN = C / R * NOUT heads.
//   pack:       dst[r][t][j] = src[t][(r / R) * NOUT + j]                 (src rows src_stride bytes apart)
//   unpack:     dst[t][r * NOUT + j] = src[r][t][j]                       (R = 1)
//   unpack_add: dst[t][k * NOUT + j] += sum over i < R of src[k * R + i][t][j]   (bf16, fp32 sum, one rounding)
//   unpack_amax: unpack that also takes the bf16 values' amax into an FP8 scale slot (fp8_amax.cuh): the attention
//               output's, for the output projection on FP8 with one scale per tensor
//   unpack_copy: unpack that also writes dst's FP8 copy [T][C * NOUT * ROW_BYTES / 2] (bf16 rows written whole,
//               dst_stride a row) and its 1 x 128 scales (fp8_block.cuh), in the format fmax names: the attention
//               output's copy for the output projection on FP8 (COPY_OK; elsewhere it traps)
// Work is counted in UNIT-byte pieces (16 bytes when ROW_BYTES % 16 == 0, else 4); each thread moves UNROLL of
// them per iteration, loads first. All divisions are by compile-time constants.
#include <cuda_bf16.h>

#include "fp8_amax.cuh"
#include "fp8_block.cuh"

typedef long long i64;
typedef __nv_bfloat16 bf16;
typedef {{IDX}} idx_t;

#define C {{C}}
#define R {{R}}
#define T {{T}}
#define NOUT {{NOUT}}
#define ROW_BYTES {{ROW_BYTES}}
#define UNIT {{UNIT}}
#define BLOCK {{BLOCK}}
#define UNROLL {{UNROLL}}
#define IN ((idx_t)NOUT * (ROW_BYTES / UNIT)) // units of one token's heads for one destination
#define TOTAL ((idx_t)C * T * IN)             // units of pack and unpack
#define TOTAL_ADD ((idx_t)(C / R) * T * IN)   // units of unpack_add

static_assert(C % R == 0 && ROW_BYTES % UNIT == 0 && (UNIT == 16 || UNIT == 4), "layout");
// unpack_copy: a 1 x 128 block of a row is 16 units of 8 values that 16 consecutive indices (an aligned half-warp)
// move, as gen/kernels.c's cp_k_fp8_copies tells the planner
#define COPY_OK (UNIT == 16 && R == 1 && NOUT * (ROW_BYTES / UNIT) % 16 == 0) // IN % 16 == 0
#define COLS (C * NOUT * ROW_BYTES / 2) // values of a token row

template <int N> struct word;
template <> struct word<16> { typedef uint4 T_; };
template <> struct word<4> { typedef unsigned int T_; };
typedef word<UNIT>::T_ unit_t;
union bunit {
    unit_t w;
    __nv_bfloat162 h[UNIT / 4];
};

extern "C" __global__ void ulysses_pack_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(const char *src, i64 src_stride, char *dst);
extern "C" __global__ void ulysses_unpack_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(const char *src, char *dst, i64 dst_stride);
extern "C" __global__ void ulysses_unpack_add_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(const char *src, char *dst, i64 dst_stride);
extern "C" __global__ void ulysses_unpack_amax_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(const char *src, char *dst,
    i64 dst_stride, float *amax_slot, float amax_fmax);
extern "C" __global__ void ulysses_unpack_copy_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(const char *src, char *dst,
    i64 dst_stride, float fmax, unsigned char *copy, float *copy_scales);

__global__ void __launch_bounds__(BLOCK) ulysses_pack_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(
    const char *__restrict__ src, i64 src_stride, char *__restrict__ dst) {
    unit_t *out = reinterpret_cast<unit_t *>(dst);
    for (idx_t base = (idx_t)blockIdx.x * (BLOCK * UNROLL); base < TOTAL; base += (idx_t)gridDim.x * (BLOCK * UNROLL)) {
        unit_t v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const idx_t i = base + u * BLOCK + threadIdx.x;
            if (i >= TOTAL) continue;
            const idx_t inner = i % IN, x = i / IN, t = x % T, r = x / T;
            v[u] = *reinterpret_cast<const unit_t *>(src + (i64)t * src_stride + (i64)(r / R) * (NOUT * ROW_BYTES) +
                                                     (i64)inner * UNIT);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const idx_t i = base + u * BLOCK + threadIdx.x;
            if (i < TOTAL) out[i] = v[u];
        }
    }
}

// unpack's walk, shared by its twins: every unit from the head layout to its place in the token rows, then
// each(unit, ok, t, k): ok whether it is inside TOTAL (each sees every lane, as a copy's shuffles need), t its token,
// k its unit of the token's row
template <typename Each>
static __device__ __forceinline__ void unpack_walk(const char *__restrict__ src, char *__restrict__ dst, i64 dst_stride,
                                                   Each each) {
    if (R != 1) __trap(); // replicated heads come back through unpack_add
    const unit_t *in = reinterpret_cast<const unit_t *>(src);
    for (idx_t base = (idx_t)blockIdx.x * (BLOCK * UNROLL); base < TOTAL; base += (idx_t)gridDim.x * (BLOCK * UNROLL)) {
        bunit v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const idx_t i = base + u * BLOCK + threadIdx.x;
            if (i < TOTAL) v[u].w = in[i];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const idx_t i = base + u * BLOCK + threadIdx.x;
            const bool ok = i < TOTAL;
            const idx_t inner = i % IN, x = i / IN, t = x % T, r = x / T;
            const i64 k = (i64)r * IN + inner;
            if (ok) *reinterpret_cast<unit_t *>(dst + (i64)t * dst_stride + k * UNIT) = v[u].w;
            each(v[u], ok, (i64)t, k);
        }
    }
}

__global__ void __launch_bounds__(BLOCK) ulysses_unpack_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(
    const char *__restrict__ src, char *__restrict__ dst, i64 dst_stride) {
    unpack_walk(src, dst, dst_stride, [](const bunit &, bool, i64, i64) {});
}

__global__ void __launch_bounds__(BLOCK) ulysses_unpack_amax_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(
    const char *__restrict__ src, char *__restrict__ dst, i64 dst_stride, float *__restrict__ amax_slot,
    float amax_fmax) {
    float amax = 0.f;
    unpack_walk(src, dst, dst_stride, [&](const bunit &v, bool ok, i64, i64) {
        if (!ok) return;
#pragma unroll
        for (int e = 0; e < UNIT / 4; e++) {
            const float2 p = __bfloat1622float2(v.h[e]);
            amax = fmaxf(amax, fmaxf(fabsf(p.x), fabsf(p.y)));
        }
    });
    fp8_amax_commit(amax, amax_slot, amax_fmax);
}

__global__ void __launch_bounds__(BLOCK) ulysses_unpack_copy_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(
    const char *__restrict__ src, char *__restrict__ dst, i64 dst_stride, float fmax, unsigned char *__restrict__ copy,
    float *__restrict__ copy_scales) {
#if COPY_OK
    // a half-warp is in or out as a whole (TOTAL % 16 == 0)
    unpack_walk(src, dst, dst_stride, [&](const bunit &v, bool ok, i64 t, i64 k) {
        float f[8];
        if (ok) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float2 p = __bfloat1622float2(v.h[e]);
                f[2 * e] = p.x, f[2 * e + 1] = p.y;
            }
        }
        const i64 col = k * 8; // the unit's first value in the row
        fp8_block_store(f, ok, fmax, copy + t * COLS + col, copy_scales + col / 128 * T + t);
    });
#else
    __trap(); // the planner writes copies only where COPY_OK holds
#endif
}

__global__ void __launch_bounds__(BLOCK) ulysses_unpack_add_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(
    const char *__restrict__ src, char *__restrict__ dst, i64 dst_stride) {
    const unit_t *in = reinterpret_cast<const unit_t *>(src);
    for (idx_t base = (idx_t)blockIdx.x * (BLOCK * UNROLL); base < TOTAL_ADD; base += (idx_t)gridDim.x * (BLOCK * UNROLL)) {
        bunit acc[UNROLL], s[UNROLL][R];
        unit_t *d[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const idx_t i = base + u * BLOCK + threadIdx.x;
            d[u] = nullptr;
            if (i >= TOTAL_ADD) continue;
            const idx_t inner = i % IN, x = i / IN, t = x % T, k = x / T;
            d[u] = reinterpret_cast<unit_t *>(dst + (i64)t * dst_stride + (i64)k * (NOUT * ROW_BYTES) + (i64)inner * UNIT);
            acc[u].w = *d[u];
#pragma unroll
            for (int j = 0; j < R; j++) s[u][j].w = in[((idx_t)(k * R + j) * T + t) * IN + inner];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            if (!d[u]) continue;
#pragma unroll
            for (int e = 0; e < UNIT / 4; e++) {
                float2 a = __bfloat1622float2(acc[u].h[e]);
#pragma unroll
                for (int j = 0; j < R; j++) {
                    const float2 b = __bfloat1622float2(s[u][j].h[e]);
                    a.x += b.x;
                    a.y += b.y;
                }
                acc[u].h[e] = __floats2bfloat162_rn(a.x, a.y);
            }
            *d[u] = acc[u].w;
        }
    }
}
