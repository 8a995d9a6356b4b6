// module: fp8
// FP8 copies of a GEMM's bf16 inputs with a per-tensor scale from the tensor's current values (train.precision =
// "fp8"; arguments: gen/kernels.h). The source is a bf16 matrix [rows][cols] with row stride ld elements; rows and
// cols are multiples of 16, ld of 8, src 16-byte aligned.
//   amax_e4m3, amax_e5m2: the largest |x| of the source, reduced in a fixed order (each block's maximum to
//     parts[block], then the last block to finish takes the maximum of the parts) into the operand's 16-byte scale
//     slot: slot[0] = amax / FMAX (the GEMM's scale: what an FP8 element stands for), slot[1] = FMAX / amax (the
//     cast's), slot[2] = amax, FMAX the type's largest finite value (448, 57344); amax 0 gives scales of 1. counter
//     is 0 before and left 0.
//   cast_e4m3, cast_e5m2: dst[rows][cols] = fp8(x * slot[1]), saturating to the type's finite range.
//   cast_t_e4m3, cast_t_e5m2: the same into dst[cols][rows] (the transposed copy the x W^T form needs), through
//     64 x 64 tiles in shared memory so that reads and writes both go along rows.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

typedef long long i64;
typedef __nv_bfloat16 bf16;

#define BLOCK {{BLOCK}}
#define UNROLL {{UNROLL}}
#define AMAX_PARTS {{AMAX_PARTS}}
#define TILE 64

extern "C" __global__ void fp8_amax_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld, float *parts,
                                         unsigned *counter, float *slot);
extern "C" __global__ void fp8_amax_e5m2(const bf16 *src, i64 rows, i64 cols, i64 ld, float *parts,
                                         unsigned *counter, float *slot);
extern "C" __global__ void fp8_cast_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld, const float *slot,
                                         unsigned char *dst);
extern "C" __global__ void fp8_cast_e5m2(const bf16 *src, i64 rows, i64 cols, i64 ld, const float *slot,
                                         unsigned char *dst);
extern "C" __global__ void fp8_cast_t_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld, const float *slot,
                                           unsigned char *dst);
extern "C" __global__ void fp8_cast_t_e5m2(const bf16 *src, i64 rows, i64 cols, i64 ld, const float *slot,
                                           unsigned char *dst);

// eight bf16 of one 16-byte load as floats
__device__ __forceinline__ void unpack8(uint4 v, float *f) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float2 p = __bfloat1622float2(h[j]);
        f[2 * j] = p.x, f[2 * j + 1] = p.y;
    }
}

__device__ __forceinline__ float block_max(float m) {
    __shared__ float warp_max[BLOCK / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
    __syncthreads();
    m = threadIdx.x < BLOCK / 32 ? warp_max[threadIdx.x] : 0.0f;
    if (threadIdx.x < 32) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    return m; // valid in thread 0
}

__device__ __forceinline__ void amax_of(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                        float *__restrict__ parts, unsigned *counter, float *slot, float fmax) {
    const i64 vrow = cols / 8, units = rows * vrow;
    float m = 0.0f;
    for (i64 base = (i64)blockIdx.x * (BLOCK * UNROLL); base < units; base += (i64)gridDim.x * (BLOCK * UNROLL)) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const i64 i = base + u * BLOCK + threadIdx.x;
            if (i < units) v[u] = *reinterpret_cast<const uint4 *>(src + (i / vrow) * ld + (i % vrow) * 8);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            if (base + u * BLOCK + threadIdx.x >= units) continue;
            float f[8];
            unpack8(v[u], f);
#pragma unroll
            for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(f[j]));
        }
    }
    m = block_max(m);
    __shared__ bool last;
    if (threadIdx.x == 0) {
        parts[blockIdx.x] = m;
        __threadfence();
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    float a = 0.0f;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += BLOCK) a = fmaxf(a, __ldcg(parts + b));
    a = block_max(a);
    if (threadIdx.x == 0) {
        slot[0] = a > 0.0f ? a / fmax : 1.0f;
        slot[1] = a > 0.0f ? fmax / a : 1.0f;
        slot[2] = a;
        *counter = 0u;
    }
}

__global__ void __launch_bounds__(BLOCK) fp8_amax_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld, float *parts,
                                                       unsigned *counter, float *slot) {
    amax_of(src, rows, cols, ld, parts, counter, slot, 448.0f);
}
__global__ void __launch_bounds__(BLOCK) fp8_amax_e5m2(const bf16 *src, i64 rows, i64 cols, i64 ld, float *parts,
                                                       unsigned *counter, float *slot) {
    amax_of(src, rows, cols, ld, parts, counter, slot, 57344.0f);
}

template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ unsigned short fp8x2(float a, float b) {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, KIND);
}

template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ void cast_rows(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                          const float *__restrict__ slot, unsigned char *__restrict__ dst) {
    const float q = slot[1];
    const i64 vrow = cols / 8, units = rows * vrow;
    for (i64 base = (i64)blockIdx.x * (BLOCK * UNROLL); base < units; base += (i64)gridDim.x * (BLOCK * UNROLL)) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const i64 i = base + u * BLOCK + threadIdx.x;
            if (i < units) v[u] = *reinterpret_cast<const uint4 *>(src + (i / vrow) * ld + (i % vrow) * 8);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const i64 i = base + u * BLOCK + threadIdx.x;
            if (i >= units) continue;
            float f[8];
            unpack8(v[u], f);
            uint2 w;
            w.x = fp8x2<KIND>(f[0] * q, f[1] * q) | (unsigned)fp8x2<KIND>(f[2] * q, f[3] * q) << 16;
            w.y = fp8x2<KIND>(f[4] * q, f[5] * q) | (unsigned)fp8x2<KIND>(f[6] * q, f[7] * q) << 16;
            reinterpret_cast<uint2 *>(dst)[i] = w; // dst is dense: unit i is bytes [8i, 8i + 8)
        }
    }
}

// One 64 x 64 tile per block (grid: cols / 64 rounded up, rows / 64 rounded up): 256 threads read the tile's rows
// as 16-byte vectors (two each), convert, and write its columns as rows of dst, 16 bytes a thread. Tiles at the
// edges are partial in steps of 16 rows and columns.
template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ void cast_cols(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                          const float *__restrict__ slot, unsigned char *__restrict__ dst) {
    __shared__ unsigned char tile[TILE][TILE + 16]; // [source column][source row], padded against bank conflicts
    const float q = slot[1];
    const i64 r0 = (i64)blockIdx.y * TILE, c0 = (i64)blockIdx.x * TILE;
    for (int v = threadIdx.x; v < TILE * TILE / 8; v += blockDim.x) {
        const int r = v / (TILE / 8), c = (v % (TILE / 8)) * 8;
        if (r0 + r >= rows || c0 + c >= cols) continue;
        float f[8];
        unpack8(*reinterpret_cast<const uint4 *>(src + (r0 + r) * ld + c0 + c), f);
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
            unsigned short p = fp8x2<KIND>(f[j] * q, f[j + 1] * q);
            tile[c + j][r] = (unsigned char)(p & 0xff);
            tile[c + j + 1][r] = (unsigned char)(p >> 8);
        }
    }
    __syncthreads();
    for (int v = threadIdx.x; v < TILE * TILE / 16; v += blockDim.x) {
        const int c = v / (TILE / 16), r = (v % (TILE / 16)) * 16;
        if (c0 + c >= cols || r0 + r >= rows) continue;
        uint4 w;
        unsigned *wp = reinterpret_cast<unsigned *>(&w);
#pragma unroll
        for (int j = 0; j < 4; j++)
            wp[j] = tile[c][r + 4 * j] | (unsigned)tile[c][r + 4 * j + 1] << 8 |
                    (unsigned)tile[c][r + 4 * j + 2] << 16 | (unsigned)tile[c][r + 4 * j + 3] << 24;
        *reinterpret_cast<uint4 *>(dst + (c0 + c) * rows + r0 + r) = w;
    }
}

__global__ void __launch_bounds__(BLOCK) fp8_cast_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld, const float *slot,
                                                       unsigned char *dst) {
    cast_rows<__NV_E4M3>(src, rows, cols, ld, slot, dst);
}
__global__ void __launch_bounds__(BLOCK) fp8_cast_e5m2(const bf16 *src, i64 rows, i64 cols, i64 ld, const float *slot,
                                                       unsigned char *dst) {
    cast_rows<__NV_E5M2>(src, rows, cols, ld, slot, dst);
}
__global__ void __launch_bounds__(256) fp8_cast_t_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld,
                                                       const float *slot, unsigned char *dst) {
    cast_cols<__NV_E4M3>(src, rows, cols, ld, slot, dst);
}
__global__ void __launch_bounds__(256) fp8_cast_t_e5m2(const bf16 *src, i64 rows, i64 cols, i64 ld,
                                                       const float *slot, unsigned char *dst) {
    cast_cols<__NV_E5M2>(src, rows, cols, ld, slot, dst);
}
