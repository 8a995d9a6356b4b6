// module: fp8
// FP8 copies of a GEMM's bf16 inputs with a per-tensor scale from the tensor's current values (train.precision =
// "fp8"; arguments: gen/kernels.h). The source is a bf16 matrix [rows][cols] with row stride ld elements; rows and
// cols are multiples of 16, ld of 8, src 16-byte aligned.
//   amax_e4m3, amax_e5m2: the largest |x| of the source, reduced in a fixed order (each block's maximum to
//     parts[block], then the last block to finish takes the maximum of the parts) into the operand's scale slot
//     (f32[8]): slot[0] = amax / FMAX (the GEMM's scale: what an FP8 element stands for), slot[1] = FMAX / amax
//     (the cast's), slot[2] = amax, FMAX the type's largest finite value (448, 57344); amax 0 gives scales of 1.
//     counter is 0 before and left 0. (A kernel that writes a GEMM's input may fill the slot instead: fp8_amax.cuh.)
//   cast_e4m3, cast_e5m2: dst[rows][cols] = fp8(x * slot[1]), saturating to the type's finite range.
//   cast_t_e4m3, cast_t_e5m2: the same into dst[cols][rows] (the transposed copy the x W^T form needs), through
//     128 x 64 tiles in shared memory so that reads and writes both go along rows.
// A contiguous source (ld = cols, every tensor of the shipped specs) is walked as one run of vectors, without the
// 64-bit division per load that a strided one needs and that held these memory-bound kernels to half the HBM rate.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "fp8_amax.cuh"

typedef long long i64;
typedef __nv_bfloat16 bf16;

#define BLOCK {{BLOCK}}
#define UNROLL {{UNROLL}}
#define AMAX_PARTS {{AMAX_PARTS}}
#define TILE_R 128 // cast_t: source rows of a tile (4 per thread: 32 threads a column group)
#define TILE_C 64  // and source columns (16 per thread: 4 column groups; 128 threads)
#define TILE_PITCH 36 // words of a transposed tile row: 32 and 4 of padding, 16-byte aligned, no bank conflicts

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

// The UNROLL vectors (8 bf16 each) of one pass of a grid-stride loop from vector `base`: vector i of the source
// [rows][cols] with row stride ld (vrow vectors a row, units in all; a contiguous source is one run of vectors)
__device__ __forceinline__ void load_units(const bf16 *__restrict__ src, i64 base, i64 units, i64 vrow, i64 ld,
                                           uint4 *v) {
    const bool dense = ld == vrow * 8;
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        const i64 i = base + u * BLOCK + threadIdx.x;
        if (i < units)
            v[u] = *reinterpret_cast<const uint4 *>(src + (dense ? i * 8 : (i / vrow) * ld + (i % vrow) * 8));
    }
}

__device__ __forceinline__ void amax_of(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                        float *__restrict__ parts, unsigned *counter, float *slot, float fmax) {
    const i64 vrow = cols / 8, units = rows * vrow;
    float m = 0.0f;
    for (i64 base = (i64)blockIdx.x * (BLOCK * UNROLL); base < units; base += (i64)gridDim.x * (BLOCK * UNROLL)) {
        uint4 v[UNROLL];
        load_units(src, base, units, vrow, ld, v);
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
        fp8_scales(slot, a, fmax);
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

// Eight bf16 of one 16-byte load, times q, as eight FP8 bytes in order
template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ uint2 fp8x8(uint4 v, float q) {
    float f[8];
    unpack8(v, f);
    uint2 w;
    w.x = fp8x2<KIND>(f[0] * q, f[1] * q) | (unsigned)fp8x2<KIND>(f[2] * q, f[3] * q) << 16;
    w.y = fp8x2<KIND>(f[4] * q, f[5] * q) | (unsigned)fp8x2<KIND>(f[6] * q, f[7] * q) << 16;
    return w;
}

template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ void cast_rows(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                          const float *__restrict__ slot, unsigned char *__restrict__ dst) {
    const float q = slot[1];
    const i64 vrow = cols / 8, units = rows * vrow;
    for (i64 base = (i64)blockIdx.x * (BLOCK * UNROLL); base < units; base += (i64)gridDim.x * (BLOCK * UNROLL)) {
        uint4 v[UNROLL];
        load_units(src, base, units, vrow, ld, v);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) { // dst is dense: unit i is bytes [8i, 8i + 8)
            const i64 i = base + u * BLOCK + threadIdx.x;
            if (i < units) reinterpret_cast<uint2 *>(dst)[i] = fp8x8<KIND>(v[u], q);
        }
    }
}

// The four bytes k of a, b, c, d as one word each: word k = a.k | b.k << 8 | c.k << 16 | d.k << 24 (a 4 x 4 byte
// transpose: rows a..d of four columns become four columns of rows a..d)
__device__ __forceinline__ void transpose4(unsigned a, unsigned b, unsigned c, unsigned d, unsigned *w) {
    const unsigned ab01 = __byte_perm(a, b, 0x5140), ab23 = __byte_perm(a, b, 0x7362);
    const unsigned cd01 = __byte_perm(c, d, 0x5140), cd23 = __byte_perm(c, d, 0x7362);
    w[0] = __byte_perm(ab01, cd01, 0x5410);
    w[1] = __byte_perm(ab01, cd01, 0x7632);
    w[2] = __byte_perm(ab23, cd23, 0x5410);
    w[3] = __byte_perm(ab23, cd23, 0x7632);
}

// One 128 x 64 tile of the source per block of 128 threads (grid: cols / 64 and rows / 128, rounded up). Thread
// (g, t) reads rows 4t .. 4t + 3, columns 16g .. 16g + 15 (32 bytes of each row: one sector), converts them and
// stores each column's four bytes as one word of the transposed tile; a warp (one g) stores 32 consecutive words
// of each column. Then each thread writes 16-byte runs of the tile's columns as rows of dst. Tiles at the edges
// are partial in steps of 16 rows and columns (rows and cols are multiples of 16).
template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ void cast_cols(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                          const float *__restrict__ slot, unsigned char *__restrict__ dst) {
    __shared__ __align__(16) unsigned tile[TILE_C][TILE_PITCH]; // [source column][word: 4 source rows]
    const float q = slot[1];
    const i64 r0 = (i64)blockIdx.y * TILE_R, c0 = (i64)blockIdx.x * TILE_C;
    const int t = threadIdx.x % 32, g = threadIdx.x / 32, r = 4 * t, c = 16 * g;
    if (r0 + r < rows && c0 + c < cols) {
        uint4 v[4][2];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                v[i][h] = *reinterpret_cast<const uint4 *>(src + (r0 + r + i) * ld + c0 + c + 8 * h);
        unsigned p[4][4]; // p[i][k]: row r + i's columns 4k .. 4k + 3 as FP8 bytes
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint2 w = fp8x8<KIND>(v[i][h], q);
                p[i][2 * h] = w.x, p[i][2 * h + 1] = w.y;
            }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            unsigned w[4];
            transpose4(p[0][k], p[1][k], p[2][k], p[3][k], w);
#pragma unroll
            for (int j = 0; j < 4; j++) tile[c + 4 * k + j][t] = w[j];
        }
    }
    __syncthreads();
    // the tile's TILE_C columns of TILE_R bytes: 8 runs of 16 bytes each
    for (int v = threadIdx.x; v < TILE_C * (TILE_R / 16); v += blockDim.x) {
        const int cc = v / (TILE_R / 16), rr = (v % (TILE_R / 16)) * 16;
        if (c0 + cc >= cols || r0 + rr >= rows) continue;
        *reinterpret_cast<uint4 *>(dst + (c0 + cc) * rows + r0 + rr) =
            *reinterpret_cast<const uint4 *>(&tile[cc][rr / 4]);
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
__global__ void __launch_bounds__(128) fp8_cast_t_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld,
                                                       const float *slot, unsigned char *dst) {
    cast_cols<__NV_E4M3>(src, rows, cols, ld, slot, dst);
}
__global__ void __launch_bounds__(128) fp8_cast_t_e5m2(const bf16 *src, i64 rows, i64 cols, i64 ld,
                                                       const float *slot, unsigned char *dst) {
    cast_cols<__NV_E5M2>(src, rows, cols, ld, slot, dst);
}
