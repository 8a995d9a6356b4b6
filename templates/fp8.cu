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
// Block scaling (train.fp8_scaling = "block"): each copy carries its own scales, one per block of the GEMM's k, each
// the power of two that puts the block's largest |x| in FP8's top binade (pow2_quant); scales[] holds what an element
// stands for (1 / the cast's multiplier), laid out as cuBLASLt's VEC128_32F and BLK128x128_32F modes read them:
//   cast_1d_e4m3, cast_1d_e5m2(src, rows, cols, ld, dst [rows][cols], scales): a scale per row and 128 columns,
//     scales[(c / 128) * rows + r]; cols a multiple of 128.
//   cast_t_1d_e4m3, cast_t_1d_e5m2(the same, dst [cols][rows]): the transposed copy, a scale per source column and
//     128 source rows (the copy's rows and 128 of its columns), scales[(r / 128) * cols + c]; rows a multiple of 128.
//   cast_rt_1d_e4m3, cast_rt_1d_e5m2(src, rows, cols, ld, dst, scales, dst_t, scales_t): both copies from one read
//     of the source (a tensor one GEMM reads as rows and another transposed); rows and cols multiples of 128.
//   cast_2d_e4m3(src, rows, cols, ld, dst [rows][cols], scales): a scale per 128 x 128 tile (a weight's: the same
//     for its copy and its transposed copy), scales[(r / 128) * ld4(cols) + c / 128], ld4(x) = the blocks of x
//     (x / 128 rounded up) rounded up to a multiple of 4 (cuBLASLt's 16-byte row pitch).
//   cast_t_2d_e4m3(the same, dst [cols][rows]): the transposed copy of the same tiles, scales[(c / 128) * ld4(rows)
//     + r / 128].
// Row scaling (train.fp8_scaling = "row"): a copy's scale per row over the whole of k, the same power-of-two rule,
// applied by cuBLASLt's OUTER_VEC_32F after the sums (so the GEMM runs at the per-tensor rate):
//   cast_row_e4m3, cast_row_e5m2(src, rows, cols, ld, dst [rows][cols], scales f32[rows]): a scale per row.
//   cast_t_row_e4m3, cast_t_row_e5m2(the same, dst [cols][rows], scales f32[cols + chunks x cols]): the transposed
//     copy, a scale per source column over all its rows (cols a multiple of 32), after cast_t_row_max(the same
//     arguments) has put each chunk of ROWT_CHUNK rows' column maxima behind the scales (chunks: rows / ROWT_CHUNK
//     rounded up); rows a multiple of 16.
//   cast_t_row8_e4m3, cast_t_row8_e5m2(src8 [rows][cols], rows, cols, ld, dst [cols][rows], scales, src_scales
//     f32[rows]): the transposed copy cast from the tensor's row copy (src8 and its scales, what an element stands
//     for), the column maxima behind the scales gathered by the kernel that wrote the tensor: each element's value
//     (the row copy's byte times its row's scale, exact) times its column's multiplier. A power of two moves an
//     element's exponent alone, so each byte is cast_t_row's from the tensor where the element is a normal number in
//     both copies; one below the type's normal range in either (after its scale under 2^-6 in E4M3, 2^-14 in E5M2:
//     in E4M3 below 1/14,000 to 1/28,000 of its row's or column's largest |x|) may round otherwise. It reads half of
//     cast_t_row's bytes.
//   cast_rt_row_e4m3, cast_rt_row_e5m2(src, rows, cols, ld, dst, scales, dst_t, scales_t): both copies of a tensor, in
//     two launches: this one writes the row copy and adds the chunks' column maxima to the transposed copy's parts
//     (zeroed before), then cast_t_row_*(src, rows, cols, ld, dst_t, scales_t) the transposed copy; cols at most
//     BLOCK x ROW_VECS x 8 (16384) and a multiple of 32, rows of 16.
//   cast_rt_row_layers_e4m3(src, rows, cols, ld, dst, scales, dst_t, scales_t, src_stride, scales_pitch,
//     scales_t_pitch), then cast_t_row8_layers_e4m3(dst, rows, cols, cols, dst_t, scales_t, scales, scales_t_pitch,
//     scales_pitch): both copies of one weight of every layer at once (gridDim.z layers, the weights src_stride
//     elements apart), from_rows; each layer's copies rows x cols bytes apart, its scales (and the transposed copy's
//     maxima behind them, all zeroed before) the pitches apart: a micro-batch's weights cast once (cp_fp8_copy.layers).
//   cast_2d_layers_e4m3, cast_t_2d_layers_e4m3(src, rows, cols, ld, dst, scales, src_stride, scales_pitch): the same
//     with 128 x 128 tiles, each copy by its own launch.
// A contiguous source (ld = cols, every tensor of the shipped specs) is walked as one run of vectors, without the
// 64-bit division per load that a strided one needs and that held these memory-bound kernels to half the HBM rate.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "fp8_amax.cuh"
#include "fp8_block.cuh"

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
extern "C" __global__ void fp8_cast_1d_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                            float *scales);
extern "C" __global__ void fp8_cast_1d_e5m2(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                            float *scales);
extern "C" __global__ void fp8_cast_t_1d_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                              float *scales);
extern "C" __global__ void fp8_cast_t_1d_e5m2(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                              float *scales);
extern "C" __global__ void fp8_cast_rt_1d_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                               float *scales, unsigned char *dst_t, float *scales_t);
extern "C" __global__ void fp8_cast_rt_1d_e5m2(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                               float *scales, unsigned char *dst_t, float *scales_t);
extern "C" __global__ void fp8_cast_row_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                             float *scales);
extern "C" __global__ void fp8_cast_row_e5m2(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                             float *scales);
extern "C" __global__ void fp8_cast_rt_row_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                                float *scales, unsigned char *dst_t, float *scales_t);
extern "C" __global__ void fp8_cast_rt_row_e5m2(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                                float *scales, unsigned char *dst_t, float *scales_t);
extern "C" __global__ void fp8_cast_t_row_max(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                              float *scales);
extern "C" __global__ void fp8_cast_t_row_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                               float *scales);
extern "C" __global__ void fp8_cast_t_row_e5m2(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                               float *scales);
extern "C" __global__ void fp8_cast_t_row8_e4m3(const unsigned char *src, i64 rows, i64 cols, i64 ld,
                                                unsigned char *dst, float *scales, const float *src_scales);
extern "C" __global__ void fp8_cast_t_row8_e5m2(const unsigned char *src, i64 rows, i64 cols, i64 ld,
                                                unsigned char *dst, float *scales, const float *src_scales);
extern "C" __global__ void fp8_cast_rt_row_layers_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld,
    unsigned char *dst, float *scales, unsigned char *dst_t, float *scales_t, i64 src_stride, i64 scales_pitch,
    i64 scales_t_pitch);
extern "C" __global__ void fp8_cast_t_row8_layers_e4m3(const unsigned char *src, i64 rows, i64 cols, i64 ld,
    unsigned char *dst, float *scales, const float *src_scales, i64 scales_pitch, i64 src_scales_pitch);
extern "C" __global__ void fp8_cast_2d_layers_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld,
    unsigned char *dst, float *scales, i64 src_stride, i64 scales_pitch);
extern "C" __global__ void fp8_cast_t_2d_layers_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld,
    unsigned char *dst, float *scales, i64 src_stride, i64 scales_pitch);
extern "C" __global__ void fp8_cast_2d_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                            float *scales);
extern "C" __global__ void fp8_cast_t_2d_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,
                                              float *scales);

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

// Eight bf16 of one 16-byte load, times q, as eight FP8 bytes in order
template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ uint2 fp8x8(uint4 v, float q) {
    float f[8];
    unpack8(v, f);
    return fp8x8s<KIND>(f, q);
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

// The transposed store of a 128 x 64 tile at (r0, c0) of the source through shared memory: thread (g, t) of 128
// holds p[i][k], the FP8 bytes of source row r0 + 4t + i, columns c0 + 16g + 4k .. + 3 (valid: the thread's rows and
// columns are inside the source), stores each column's four bytes as one word of the transposed tile (a warp, one g, 32
// consecutive words of each column), then writes 16-byte runs of the tile's columns as rows of dst [cols][rows]. Tiles
// at the edges are partial in steps of 16 rows and columns. Every thread of the block calls it.
__device__ __forceinline__ void store_transposed(const unsigned (*p)[4], bool valid, i64 r0, i64 c0, i64 rows,
                                                 i64 cols, unsigned char *__restrict__ dst) {
    __shared__ __align__(16) unsigned tile[TILE_C][TILE_PITCH]; // [source column][word: 4 source rows]
    const int t = threadIdx.x % 32, c = 16 * (threadIdx.x / 32);
    if (valid) {
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
    __syncthreads(); // the tile may be filled again
}

// Thread (g, t)'s part of the 128 x 64 tile at (r0, c0): rows r0 + 4t .. + 3, columns c0 + 16g .. + 15 (32 bytes of
// each row: one sector), v[i][h] row i's columns 8h .. 8h + 7; whether they are inside the source.
__device__ __forceinline__ bool load_tile_part(const bf16 *__restrict__ src, i64 r0, i64 c0, i64 rows, i64 cols,
                                               i64 ld, uint4 (*v)[2]) {
    const i64 r = r0 + 4 * (threadIdx.x % 32), c = c0 + 16 * (threadIdx.x / 32);
    if (r >= rows || c >= cols) return false;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) v[i][h] = *reinterpret_cast<const uint4 *>(src + (r + i) * ld + c + 8 * h);
    return true;
}

// The part times q[j] (a multiplier per column) as the bytes p[i][k] store_transposed takes
template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ void convert_part(const uint4 (*v)[2], const float *q, unsigned (*p)[4]) {
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float f[8];
            unpack8(v[i][h], f);
            const uint2 w = fp8x8q<KIND>(f, q + 8 * h);
            p[i][2 * h] = w.x, p[i][2 * h + 1] = w.y;
        }
}

// The part's largest |x| in each of its 16 columns
__device__ __forceinline__ void part_col_max(const uint4 (*v)[2], float *m) {
#pragma unroll
    for (int j = 0; j < 16; j++) m[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float f[8];
            unpack8(v[i][h], f);
#pragma unroll
            for (int j = 0; j < 8; j++) m[8 * h + j] = fmaxf(m[8 * h + j], fabsf(f[j]));
        }
}

// One 128 x 64 tile of the source per block of 128 threads (grid: cols / 64 and rows / 128, rounded up), converted
// with the slot's multiplier and stored transposed.
template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ void cast_cols(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                          const float *__restrict__ slot, unsigned char *__restrict__ dst) {
    const i64 r0 = (i64)blockIdx.y * TILE_R, c0 = (i64)blockIdx.x * TILE_C;
    uint4 v[4][2];
    float q[16];
    unsigned p[4][4];
    const bool valid = load_tile_part(src, r0, c0, rows, cols, ld, v);
#pragma unroll
    for (int j = 0; j < 16; j++) q[j] = slot[1];
    if (valid) convert_part<KIND>(v, q, p);
    store_transposed(p, valid, r0, c0, rows, cols, dst);
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

// ---- block scaling ----

// 1 x 128: 16 consecutive threads take a row's 128 columns (cols a multiple of 128, BLOCK of 16, so that a group
// never straddles rows), as the producers that write a copy beside their output do (fp8_block_store).
template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ void cast_1d(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                        unsigned char *__restrict__ dst, float *__restrict__ scales) {
    const i64 vrow = cols / 8, units = rows * vrow;
    for (i64 base = (i64)blockIdx.x * (BLOCK * UNROLL); base < units; base += (i64)gridDim.x * (BLOCK * UNROLL)) {
        uint4 v[UNROLL];
        load_units(src, base, units, vrow, ld, v);
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const i64 i = base + u * BLOCK + threadIdx.x;
            float f[8];
            if (i < units) unpack8(v[u], f);
            fp8_block_store(f, i < units, fp8_max<KIND>(), dst + 8 * i, scales + (i % vrow) / 16 * rows + i / vrow);
        }
    }
}

// 1 x 128 blocks of the transposed copy (128 x 1 of the source), and with ROWS of the row copy too from the same read:
// a 128 x 128 tile of the source per block of 256 threads (grid: cols / 128 rounded up, rows / 128; rows a multiple of
// 128, and with ROWS cols too). Thread l of warp w takes rows r0 + 8j .. + 7, j = 2w + l / 16, and columns c0 + 8(l %
// 16) .. + 7: a warp's load is two runs of 256 bytes, a half-warp holds whole rows of the tile (the row copy's blocks:
// maxima by four shuffles, stores of 128 bytes a row), and a thread 8 x 8 bytes of the transposed copy, which it
// transposes in registers and writes to shared memory as 8-byte runs of the transposed tile's rows. Run j of row c
// lies at run j ^ (c / 8 % 16) of it: each warp's store of a run per column and each 16-byte read of the tile's rows
// then touch every bank once a wavefront. The tile goes out as 16-byte runs, 128 bytes a transposed row; the columns'
// scales from 128 threads, one column each.
template <__nv_fp8_interpretation_t KIND, bool ROWS>
__device__ __forceinline__ void cast_tile_1d(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                             unsigned char *__restrict__ dst, float *__restrict__ scales,
                                             unsigned char *__restrict__ dst_t, float *__restrict__ scales_t) {
    __shared__ __align__(16) uint2 tile[128][16]; // [source column][run of 8 source rows, swizzled]
    __shared__ __align__(16) float col_max[8][128]; // [warp][tile column]; then [0][column] its multiplier
    const int l = threadIdx.x % 32, w = threadIdx.x / 32, j = 2 * w + l / 16, cl = 8 * (l % 16);
    const i64 r0 = (i64)blockIdx.y * 128, c0 = (i64)blockIdx.x * 128, c = c0 + cl;
    const bool in = c < cols; // a thread's 8 columns all (cols is a multiple of 8), or none
    uint4 v[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        v[i] = in ? *reinterpret_cast<const uint4 *>(src + (r0 + 8 * j + i) * ld + c) : make_uint4(0, 0, 0, 0);
    // the columns' maxima over this thread's rows, then the warp's
    float m[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float f[8];
        unpack8(v[i], f);
        float rm = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) m[k] = fmaxf(m[k], fabsf(f[k])), rm = fmaxf(rm, fabsf(f[k]));
        if (ROWS) { // row r0 + 8j + i's block: its half-warp's 128 columns
            const float qr = pow2_quant(fp8_group_max<16>(rm), fp8_max<KIND>());
            const i64 r = r0 + 8 * j + i;
            *reinterpret_cast<uint2 *>(dst + r * cols + c) = fp8x8s<KIND>(f, qr);
            if (l % 16 == 0) scales[c0 / 128 * rows + r] = pow2_inverse(qr);
        }
    }
#pragma unroll
    for (int k = 0; k < 8; k++) m[k] = fmaxf(m[k], __shfl_xor_sync(0xffffffffu, m[k], 16));
    if (l < 16) {
        *reinterpret_cast<float4 *>(&col_max[w][cl]) = make_float4(m[0], m[1], m[2], m[3]);
        *reinterpret_cast<float4 *>(&col_max[w][cl + 4]) = make_float4(m[4], m[5], m[6], m[7]);
    }
    __syncthreads();
    if (threadIdx.x < 128) { // column c0 + threadIdx.x's multiplier over the tile's 128 rows, and its scale
        float a = col_max[0][threadIdx.x];
#pragma unroll
        for (int u = 1; u < 8; u++) a = fmaxf(a, col_max[u][threadIdx.x]);
        const float q = pow2_quant(a, fp8_max<KIND>());
        if (c0 + threadIdx.x < cols) scales_t[r0 / 128 * cols + c0 + threadIdx.x] = pow2_inverse(q);
        col_max[0][threadIdx.x] = q; // only this thread read column threadIdx.x's maxima
    }
    __syncthreads();
    float q[8];
    *reinterpret_cast<float4 *>(q) = *reinterpret_cast<const float4 *>(&col_max[0][cl]);
    *reinterpret_cast<float4 *>(q + 4) = *reinterpret_cast<const float4 *>(&col_max[0][cl + 4]);
    // the 8 x 8 bytes, rows as words (lo: columns 0-3, hi: 4-7), then columns as words (lo: rows 0-3, hi: 4-7)
    unsigned b[8][2];
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float f[8];
        unpack8(v[i], f);
        const uint2 x = fp8x8q<KIND>(f, q);
        b[i][0] = x.x, b[i][1] = x.y;
    }
    const int run = j ^ (l % 16);
#pragma unroll
    for (int h = 0; h < 2; h++) { // columns 4h .. 4h + 3
        unsigned lo[4], hi[4];
        transpose4(b[0][h], b[1][h], b[2][h], b[3][h], lo);
        transpose4(b[4][h], b[5][h], b[6][h], b[7][h], hi);
#pragma unroll
        for (int k = 0; k < 4; k++) tile[cl + 4 * h + k][run] = make_uint2(lo[k], hi[k]);
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < 4; u++) { // 16-byte runs: 8 a transposed row, 4 rows a warp
        const int x = u * 256 + threadIdx.x, cc = x / 8, s = (cc / 8) % 16, p = (x % 8) ^ (s / 2);
        if (c0 + cc >= cols) continue;
        uint2 a = tile[cc][2 * p], z = tile[cc][2 * p + 1];
        if (s & 1) { // runs 2p and 2p + 1 of the row hold its logical runs 2(x % 8) + 1 and 2(x % 8)
            const uint2 t = a;
            a = z, z = t;
        }
        *reinterpret_cast<uint4 *>(dst_t + (c0 + cc) * rows + r0 + 16 * (x % 8)) = make_uint4(a.x, a.y, z.x, z.y);
    }
}

// The largest of every thread's m in its group of `group` threads (32, 64, .. up to 256; the same for the whole block,
// which every thread of it calls together), for all of them
__device__ __forceinline__ float group_max(float m, int group) {
    __shared__ float warp_max[8];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (group == 32) return m;
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
    __syncthreads();
    const int first = (int)threadIdx.x / group * (group / 32);
    m = warp_max[first];
    for (int w = 1; w < group / 32; w++) m = fmaxf(m, warp_max[first + w]);
    __syncthreads(); // warp_max is written again by the next call
    return m;
}

__device__ __forceinline__ i64 ld4(i64 x) { return ((x + 127) / 128 + 3) / 4 * 4; }

// 128 x 128 (a weight's, always E4M3): one tile per block of 256 threads (grid: cols / 128 and rows / 128, rounded
// up); thread x takes vector x % 16 of rows x / 16 + 16u, u < 8.
__device__ __forceinline__ void cast_2d(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                        unsigned char *__restrict__ dst, float *__restrict__ scales) {
    const i64 r0 = (i64)blockIdx.y * 128, c = (i64)blockIdx.x * 128 + 8 * (threadIdx.x % 16);
    float f[8][8], m = 0.0f;
    bool in[8];
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const i64 r = r0 + threadIdx.x / 16 + 16 * u;
        in[u] = r < rows && c < cols;
        if (in[u]) {
            unpack8(*reinterpret_cast<const uint4 *>(src + r * ld + c), f[u]);
#pragma unroll
            for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(f[u][j]));
        }
    }
    const float q = pow2_quant(group_max(m, 256), fp8_max<__NV_E4M3>());
#pragma unroll
    for (int u = 0; u < 8; u++)
        if (in[u])
            *reinterpret_cast<uint2 *>(dst + (r0 + threadIdx.x / 16 + 16 * u) * cols + c) =
                fp8x8s<__NV_E4M3>(f[u], q);
    if (threadIdx.x == 0) scales[blockIdx.y * ld4(cols) + blockIdx.x] = pow2_inverse(q);
}

// The transposed copy of the same 128 x 128 tiles: a block of 128 threads takes the tile as two 128 x 64 halves,
// both loaded before the tile's maximum, then converted and stored transposed one after the other.
__device__ __forceinline__ void cast_t_2d(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                          unsigned char *__restrict__ dst, float *__restrict__ scales) {
    const i64 r0 = (i64)blockIdx.y * 128, c0 = (i64)blockIdx.x * 128, c1 = c0 + TILE_C;
    uint4 va[4][2], vb[4][2];
    float m = 0.0f, cm[16];
    const bool valid_a = load_tile_part(src, r0, c0, rows, cols, ld, va);
    const bool valid_b = load_tile_part(src, r0, c1, rows, cols, ld, vb);
    if (valid_a) {
        part_col_max(va, cm);
#pragma unroll
        for (int j = 0; j < 16; j++) m = fmaxf(m, cm[j]);
    }
    if (valid_b) {
        part_col_max(vb, cm);
#pragma unroll
        for (int j = 0; j < 16; j++) m = fmaxf(m, cm[j]);
    }
    const float q0 = pow2_quant(group_max(m, 128), fp8_max<__NV_E4M3>());
    float q[16];
#pragma unroll
    for (int j = 0; j < 16; j++) q[j] = q0;
    unsigned p[4][4];
    if (valid_a) convert_part<__NV_E4M3>(va, q, p);
    store_transposed(p, valid_a, r0, c0, rows, cols, dst);
    if (valid_b) convert_part<__NV_E4M3>(vb, q, p);
    store_transposed(p, valid_b, r0, c1, rows, cols, dst);
    if (threadIdx.x == 0) scales[blockIdx.x * ld4(rows) + blockIdx.y] = pow2_inverse(q0);
}

#define CAST_BLOCK_KERNEL(name, threads, body)                                                                       \
    __global__ void __launch_bounds__(threads) name(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst, \
                                                    float *scales) {                                                 \
        body(src, rows, cols, ld, dst, scales);                                                                      \
    }
CAST_BLOCK_KERNEL(fp8_cast_1d_e4m3, BLOCK, cast_1d<__NV_E4M3>)
CAST_BLOCK_KERNEL(fp8_cast_1d_e5m2, BLOCK, cast_1d<__NV_E5M2>)
CAST_BLOCK_KERNEL(fp8_cast_2d_e4m3, 256, cast_2d)
CAST_BLOCK_KERNEL(fp8_cast_t_2d_e4m3, 128, cast_t_2d)
// cast_2d and cast_t_2d over the same weight of every layer at once, layer blockIdx.z: its source src_stride elements
// on from the last's, its copy rows x cols bytes on, its scales scales_pitch floats on. One block an SM is all the
// bounds ask: without it ptxas held cast_2d's twin to 80 registers and spilled (91-95 and none with it)
#define CAST_2D_LAYERS_KERNEL(name, threads, body)                                                                   \
    __global__ void __launch_bounds__(threads, 1) name(const bf16 *src, i64 rows, i64 cols, i64 ld,                 \
                                                       unsigned char *dst, float *scales, i64 src_stride,            \
                                                       i64 scales_pitch) {                                           \
        const i64 z = blockIdx.z;                                                                                    \
        body(src + z * src_stride, rows, cols, ld, dst + z * rows * cols, scales + z * scales_pitch);                \
    }
CAST_2D_LAYERS_KERNEL(fp8_cast_2d_layers_e4m3, 256, cast_2d)
CAST_2D_LAYERS_KERNEL(fp8_cast_t_2d_layers_e4m3, 128, cast_t_2d)
// The 1 x 128 casts of cast_tile_1d: the transposed copy alone, or both. Hopper takes three blocks of the first an SM
// (80 registers, no spills: the loads of three tiles in flight), which spill on sm_80; both copies need 126.
#if __CUDA_ARCH__ >= 900
#define CAST_T_BLOCKS 3
#else
#define CAST_T_BLOCKS 2
#endif
#define CAST_T_KERNEL(name, kind)                                                                                    \
    __global__ void __launch_bounds__(256, CAST_T_BLOCKS)                                                            \
        name(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst, float *scales) {                       \
        cast_tile_1d<kind, false>(src, rows, cols, ld, nullptr, nullptr, dst, scales);                               \
    }
#define CAST_BOTH_KERNEL(name, kind)                                                                                 \
    __global__ void __launch_bounds__(256) name(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,      \
                                                float *scales, unsigned char *dst_t, float *scales_t) {             \
        cast_tile_1d<kind, true>(src, rows, cols, ld, dst, scales, dst_t, scales_t);                                 \
    }
CAST_T_KERNEL(fp8_cast_t_1d_e4m3, __NV_E4M3)
CAST_T_KERNEL(fp8_cast_t_1d_e5m2, __NV_E5M2)
CAST_BOTH_KERNEL(fp8_cast_rt_1d_e4m3, __NV_E4M3)
CAST_BOTH_KERNEL(fp8_cast_rt_1d_e5m2, __NV_E5M2)

// ---- row scaling ----

// A row per group of threads, held in registers: ROW_VECS vectors of 8 a thread, the group the fewest threads of 32,
// 64, ... BLOCK that hold the row (rows of up to BLOCK x ROW_VECS x 8 columns, 16384 with 256 threads), so that a block
// takes BLOCK / group rows at a time (grid-stride): a row of 1024 or 3072 columns a block left most of its threads idle
// and too few bytes in flight (0.9 and 2.2 TB/s in the 3B step, against 4 TB/s at 8192). Then the row's largest |x|
// over its group and the cast from the registers, so that the row is read once. A longer row is read again for the
// cast (from L2). gen/kernels.h's cp_fp8_row_group is the same choice, for the grid.
#define ROW_VECS {{ROW_VECS}}
__device__ __forceinline__ int row_group(i64 vrow) {
    int g = 32;
    while (g < BLOCK && vrow > (i64)g * ROW_VECS) g *= 2;
    return g;
}

// The transposed copy's tiles (cast_t_row, below), and the column maxima of each ROWT_CHUNK rows behind its scales
#define ROWT_COLS 32
#define ROWT_ROWS 64
#define ROWT_CHUNK {{ROW_CHUNK}}
#define ROWT_PITCH (ROWT_ROWS + 4) // bytes of a tile row: 17 words, so the 4 column groups' byte stores hit 4 banks
__device__ __forceinline__ float *row_parts(float *scales, i64 cols) { return scales + cols; }

// With BOTH (cast_rt_row: the first of two launches when one GEMM reads the tensor as rows and another transposed) a
// block takes rows / gridDim.x consecutive rows (rounded up) and also keeps, per thread, the largest |x| of each of
// its columns over them (as bf16, which holds them exactly); the block's groups then meet in shared memory and each
// column's maximum goes to a row of parts, its first row's chunk's, by an atomic max of the float's bits (they order
// as the floats do for x >= 0; the parts are zeroed before). Any row of parts would do: cast_t_row takes the maximum
// over all of them. It then casts the transposed copy, so the source is read twice for both copies instead of three
// times. Rows held in registers only (cols / 8 <= BLOCK x ROW_VECS).
__device__ __forceinline__ uint4 *rt_col_max() { // one array for every instance of cast_row_in
    __shared__ uint4 col_max[BLOCK * ROW_VECS];
    return col_max;
}
template <__nv_fp8_interpretation_t KIND, int GROUP, bool BOTH>
__device__ __forceinline__ void cast_row_in(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                            unsigned char *__restrict__ dst, float *__restrict__ scales,
                                            float *__restrict__ parts) {
    constexpr int per_block = BLOCK / GROUP;
    const i64 vrow = cols / 8;
    const int lane = (int)threadIdx.x % GROUP;
    const bool held = vrow <= (i64)GROUP * ROW_VECS;
    const i64 span = (rows + gridDim.x - 1) / gridDim.x; // BOTH's rows a block
    const i64 first = BOTH ? (i64)blockIdx.x * span : (i64)blockIdx.x * per_block;
    const i64 end = BOTH ? min(first + span, rows) : rows, step = BOTH ? per_block : (i64)gridDim.x * per_block;
    if (BOTH && first >= rows) return; // (the whole block) no rows left for it
    __nv_bfloat162 cm[BOTH ? ROW_VECS : 1][4];
    if constexpr (BOTH)
#pragma unroll
        for (int u = 0; u < ROW_VECS; u++)
#pragma unroll
            for (int j = 0; j < 4; j++) cm[u][j] = __float2bfloat162_rn(0.0f);
    for (i64 r0 = first; r0 < end; r0 += step) {
        const i64 r = r0 + (int)threadIdx.x / GROUP;
        const bool live = r < end; // every thread takes part in group_max
        const bf16 *row = src + r * ld;
        uint4 v[ROW_VECS];
        float m = 0.0f;
        for (i64 v0 = 0; live && v0 < vrow; v0 += GROUP * ROW_VECS) {
#pragma unroll
            for (int u = 0; u < ROW_VECS; u++) {
                const i64 i = v0 + u * GROUP + lane;
                if (i < vrow) v[u] = *reinterpret_cast<const uint4 *>(row + 8 * i);
            }
#pragma unroll
            for (int u = 0; u < ROW_VECS; u++) {
                if (v0 + u * GROUP + lane >= vrow) continue;
                float f[8];
                unpack8(v[u], f);
#pragma unroll
                for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(f[j]));
                if constexpr (BOTH) {
                    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&v[u]);
#pragma unroll
                    for (int j = 0; j < 4; j++) cm[u][j] = __hmax2(cm[u][j], __habs2(h[j]));
                }
            }
        }
        const float q = pow2_quant(group_max(m, GROUP), fp8_max<KIND>());
        if (!live) continue;
        for (i64 v0 = 0; v0 < vrow; v0 += GROUP * ROW_VECS) {
#pragma unroll
            for (int u = 0; u < ROW_VECS; u++) {
                const i64 i = v0 + u * GROUP + lane;
                if (i >= vrow) continue;
                if (!held) v[u] = *reinterpret_cast<const uint4 *>(row + 8 * i);
                *reinterpret_cast<uint2 *>(dst + r * cols + 8 * i) = fp8x8<KIND>(v[u], q);
            }
        }
        if (lane == 0) scales[r] = pow2_inverse(q);
    }
    if constexpr (BOTH) {
        uint4 *col_max = rt_col_max(); // [group of the block][column / 8], 8 bf16 each
        const int g = (int)threadIdx.x / GROUP;
#pragma unroll
        for (int u = 0; u < ROW_VECS; u++)
            if (u * GROUP + lane < vrow) col_max[g * vrow + u * GROUP + lane] = *reinterpret_cast<const uint4 *>(cm[u]);
        __syncthreads();
        const bf16 *cmax = reinterpret_cast<const bf16 *>(col_max);
        float *chunk = parts + first / ROWT_CHUNK * cols;
        for (i64 c = threadIdx.x; c < cols; c += BLOCK) {
            float x = 0.0f;
#pragma unroll
            for (int k = 0; k < per_block; k++) x = fmaxf(x, __bfloat162float(cmax[k * cols + c]));
            fp8_col_max_add(chunk + c, x);
        }
    }
}

// The group's width a constant of each instance, so that its divisions are shifts
#define ROW_GROUPS(KIND, BOTH, parts)                                                                                  \
    switch (row_group(cols / 8)) {                                                                                     \
    case 32: cast_row_in<KIND, 32, BOTH>(src, rows, cols, ld, dst, scales, parts); break;                              \
    case 64: cast_row_in<KIND, 64, BOTH>(src, rows, cols, ld, dst, scales, parts); break;                              \
    case 128: cast_row_in<KIND, 128, BOTH>(src, rows, cols, ld, dst, scales, parts); break;                            \
    default: cast_row_in<KIND, 256, BOTH>(src, rows, cols, ld, dst, scales, parts); break;                             \
    }
template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ void cast_row(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                         unsigned char *__restrict__ dst, float *__restrict__ scales) {
    static_assert(BLOCK == 256, "the groups are 32 to 256 threads");
    ROW_GROUPS(KIND, false, nullptr)
}

// The transposed copy, a scale per source column over all the rows, in two launches over the same grid: strips of 32
// source columns by chunks of ROWT_CHUNK rows (grid: cols / 32 and rows / ROWT_CHUNK rounded up), 256 threads a block,
// thread t reading 8 columns (16 bytes, 8 (t % 4) on) of the chunk's rows t / 4 + 64 i. The first
// (cast_t_row_max) writes each chunk's column maxima to parts f32[chunks][cols], behind the scales; the second reduces
// a strip's parts (from L2), writes the scales (the first chunk's blocks) and casts its chunk 64 rows at a time into a
// shared tile [column][row] of bytes, written out as 16-byte runs of the copy's rows. The memory reads the source
// twice and writes the copy once.

// The largest of the 8 partial maxima of strip column threadIdx.x (< ROWT_COLS), after the block has written them
__device__ __forceinline__ float strip_col_max(const float (*part)[ROWT_COLS]) {
    float a = part[0][threadIdx.x];
#pragma unroll
    for (int k = 1; k < 8; k++) a = fmaxf(a, part[k][threadIdx.x]);
    return a;
}

__device__ __forceinline__ void cast_t_row_max(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                               unsigned char *__restrict__, float *__restrict__ scales) {
    __shared__ float warp_max[8][ROWT_COLS];
    const int g = threadIdx.x % 4, w = threadIdx.x / 32;
    const i64 c0 = (i64)blockIdx.x * ROWT_COLS, c = c0 + 8 * g, r0 = (i64)blockIdx.y * ROWT_CHUNK;
    const i64 r1 = min(r0 + ROWT_CHUNK, rows);
    float m[8];
#pragma unroll
    for (int j = 0; j < 8; j++) m[j] = 0.0f;
    for (i64 rb = r0 + threadIdx.x / 4; rb < r1; rb += 4 * ROWT_ROWS) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (rb + u * ROWT_ROWS < r1) v[u] = *reinterpret_cast<const uint4 *>(src + (rb + u * ROWT_ROWS) * ld + c);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            if (rb + u * ROWT_ROWS >= r1) continue;
            float f[8];
            unpack8(v[u], f);
#pragma unroll
            for (int j = 0; j < 8; j++) m[j] = fmaxf(m[j], fabsf(f[j]));
        }
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) m[j] = fmaxf(m[j], __shfl_xor_sync(0xffffffffu, m[j], o));
    }
    if (threadIdx.x % 32 < 4) {
#pragma unroll
        for (int j = 0; j < 8; j++) warp_max[w][8 * g + j] = m[j];
    }
    __syncthreads();
    if (threadIdx.x < ROWT_COLS)
        row_parts(scales, cols)[blockIdx.y * cols + c0 + threadIdx.x] = strip_col_max(warp_max);
}

// The multipliers of a strip's COLS columns into col_q, from the column maxima behind the scales (every chunk's row of
// them), and the strip's scales written by the blocks of the first chunk; the block's 256 threads all call it
template <__nv_fp8_interpretation_t KIND, int COLS>
__device__ __forceinline__ void strip_multipliers(float *__restrict__ scales, i64 rows, i64 cols, i64 c0,
                                                  float *col_q) {
    constexpr int READERS = 256 / COLS; // a column's
    __shared__ float part_max[READERS][COLS];
    const i64 chunks = (rows + ROWT_CHUNK - 1) / ROWT_CHUNK;
    {
        const float *parts = row_parts(scales, cols);
        float a = 0.0f;
        for (i64 k = threadIdx.x / COLS; k < chunks; k += READERS)
            a = fmaxf(a, __ldcg(parts + k * cols + c0 + threadIdx.x % COLS));
        part_max[threadIdx.x / COLS][threadIdx.x % COLS] = a;
    }
    __syncthreads();
    if (threadIdx.x < COLS) {
        float a = part_max[0][threadIdx.x];
#pragma unroll
        for (int k = 1; k < READERS; k++) a = fmaxf(a, part_max[k][threadIdx.x]);
        const float q = pow2_quant(a, fp8_max<KIND>());
        col_q[threadIdx.x] = q;
        if (blockIdx.y == 0) scales[c0 + threadIdx.x] = pow2_inverse(q);
    }
    __syncthreads();
}

// A tile of the copy [COLS][rows t0 ..] out of shared memory as 16-byte runs of the copy's rows, between the barriers
// that let it be filled again; a tile row of a column c >= 32 holds its bytes with the 8-byte halves of each 16
// swapped when SWAP (cast_t_row8's stores, apart in the banks)
template <int COLS, int TILE, int PITCH, bool SWAP>
__device__ __forceinline__ void store_strip_tile(const unsigned char (*tile)[PITCH], i64 t0, i64 r1, i64 c0,
                                                 i64 rows, unsigned char *__restrict__ dst) {
    constexpr int RUNS = COLS * (TILE / 16);
    __syncthreads();
#pragma unroll
    for (int u0 = 0; u0 < RUNS; u0 += 256) {
        const int u = u0 + threadIdx.x, cc = u / (TILE / 16), rr = 16 * (u % (TILE / 16));
        if ((RUNS % 256 == 0 || u < RUNS) && t0 + rr < r1) {
            const unsigned *t = reinterpret_cast<const unsigned *>(&tile[cc][rr]);
            const bool swap = SWAP && cc >= 32;
            *reinterpret_cast<uint4 *>(dst + (c0 + cc) * rows + t0 + rr) =
                swap ? make_uint4(t[2], t[3], t[0], t[1]) : make_uint4(t[0], t[1], t[2], t[3]);
        }
    }
    __syncthreads();
}

template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ void cast_t_row(const bf16 *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                           unsigned char *__restrict__ dst, float *__restrict__ scales) {
    __shared__ float col_q[ROWT_COLS];
    __shared__ __align__(16) unsigned char tile[ROWT_COLS][ROWT_PITCH];
    const int g = threadIdx.x % 4, rt = threadIdx.x / 4;
    const i64 c0 = (i64)blockIdx.x * ROWT_COLS, c = c0 + 8 * g, r0 = (i64)blockIdx.y * ROWT_CHUNK;
    const i64 r1 = min(r0 + ROWT_CHUNK, rows);
    strip_multipliers<KIND, ROWT_COLS>(scales, rows, cols, c0, col_q);
    float q[8];
#pragma unroll
    for (int j = 0; j < 8; j++) q[j] = col_q[8 * g + j];
    // each pass loads the next pass's vector before it converts and stores its own, so that a load is in flight
    // across the pass's two barriers (on an H200: 2% faster at 8192 columns, the same at 3072; 3.3-3.5 TB/s)
    uint4 next = make_uint4(0, 0, 0, 0);
    if (r0 + rt < r1) next = *reinterpret_cast<const uint4 *>(src + (r0 + rt) * ld + c);
    for (i64 t0 = r0; t0 < r1; t0 += ROWT_ROWS) {
        const i64 r = t0 + rt;
        const uint4 v = next;
        if (r + ROWT_ROWS < r1) next = *reinterpret_cast<const uint4 *>(src + (r + ROWT_ROWS) * ld + c);
        if (r < r1) {
            float f[8];
            unpack8(v, f);
            const uint2 b = fp8x8q<KIND>(f, q);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                tile[8 * g + j][rt] = (unsigned char)(b.x >> (8 * j));
                tile[8 * g + 4 + j][rt] = (unsigned char)(b.y >> (8 * j));
            }
        }
        store_strip_tile<ROWT_COLS, ROWT_ROWS, ROWT_PITCH, false>(tile, t0, r1, c0, rows, dst); // 64-byte columns
    }
}

// cast_t_row8: strips of 64 columns by the same chunks of rows, thread t reading 16 columns (16 bytes, 16 (t % 4) on:
// a strip's row of the copy, 64 bytes, by 4 neighbours) of the row copy's rows t / 4 + 64 h (h < 2) and their scales;
// each element's value (byte times its row's scale: a power of two, exact) cast with its column's multiplier into a
// tile of 128 rows. A tile row is 33 words, and the rows of columns 32 on hold their bytes 8 apart (SWAP), so that a
// warp's byte stores (4 column groups, 8 rows) and 16-byte reads hit 32 banks.
#define ROWT8_COLS 64
#define ROWT8_ROWS 128
#define ROWT8_PITCH (ROWT8_ROWS + 4)
template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ void cast_t_row8(const unsigned char *__restrict__ src, i64 rows, i64 cols, i64 ld,
                                            unsigned char *__restrict__ dst, float *__restrict__ scales,
                                            const float *__restrict__ src_scales) {
    __shared__ float col_q[ROWT8_COLS];
    __shared__ __align__(16) unsigned char tile[ROWT8_COLS][ROWT8_PITCH];
    const int g = threadIdx.x % 4, rt = threadIdx.x / 4, swap = g >= 2 ? 8 : 0;
    const i64 c0 = (i64)blockIdx.x * ROWT8_COLS, c = c0 + 16 * g, r0 = (i64)blockIdx.y * ROWT_CHUNK;
    const i64 r1 = min(r0 + ROWT_CHUNK, rows);
    strip_multipliers<KIND, ROWT8_COLS>(scales, rows, cols, c0, col_q);
    float q[16];
#pragma unroll
    for (int j = 0; j < 16; j++) q[j] = col_q[16 * g + j];
    // as cast_t_row: the next pass's vectors and scales in flight across the pass's barriers
    uint4 next[2];
    float snext[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const i64 r = r0 + rt + 64 * h;
        next[h] = make_uint4(0, 0, 0, 0), snext[h] = 0.0f;
        if (r < r1) next[h] = *reinterpret_cast<const uint4 *>(src + r * ld + c), snext[h] = src_scales[r];
    }
    for (i64 t0 = r0; t0 < r1; t0 += ROWT8_ROWS) {
        uint4 v[2];
        float sr[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const i64 r = t0 + rt + 64 * h;
            v[h] = next[h], sr[h] = snext[h];
            if (r + ROWT8_ROWS < r1) {
                next[h] = *reinterpret_cast<const uint4 *>(src + (r + ROWT8_ROWS) * ld + c);
                snext[h] = src_scales[r + ROWT8_ROWS];
            }
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (t0 + rt + 64 * h >= r1) continue;
            const __nv_fp8x2_storage_t *e = reinterpret_cast<const __nv_fp8x2_storage_t *>(&v[h]);
            float f[16];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float2 p = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(e[j], KIND)));
                f[2 * j] = p.x * sr[h], f[2 * j + 1] = p.y * sr[h];
            }
            const int row = (rt + 64 * h) ^ swap;
#pragma unroll
            for (int k = 0; k < 2; k++) {
                const uint2 b = fp8x8q<KIND>(f + 8 * k, q + 8 * k);
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    tile[16 * g + 8 * k + j][row] = (unsigned char)(b.x >> (8 * j));
                    tile[16 * g + 8 * k + 4 + j][row] = (unsigned char)(b.y >> (8 * j));
                }
            }
        }
        store_strip_tile<ROWT8_COLS, ROWT8_ROWS, ROWT8_PITCH, true>(tile, t0, r1, c0, rows, dst); // 128-byte columns
    }
}
CAST_BLOCK_KERNEL(fp8_cast_row_e4m3, BLOCK, cast_row<__NV_E4M3>)
CAST_BLOCK_KERNEL(fp8_cast_row_e5m2, BLOCK, cast_row<__NV_E5M2>)
#define CAST_RT_ROW_KERNEL(name, kind)                                                                               \
    __global__ void __launch_bounds__(BLOCK) name(const bf16 *src, i64 rows, i64 cols, i64 ld, unsigned char *dst,    \
                                                  float *scales, unsigned char *, float *scales_t) {                  \
        ROW_GROUPS(kind, true, row_parts(scales_t, cols))                                                            \
    }
CAST_RT_ROW_KERNEL(fp8_cast_rt_row_e4m3, __NV_E4M3)
CAST_RT_ROW_KERNEL(fp8_cast_rt_row_e5m2, __NV_E5M2)
// cast_rt_row over the same weight of every layer at once, layer blockIdx.z: its source src_stride elements on from
// the last's, its copy rows x cols bytes on, its scales scales_pitch floats on, the transposed copy's scales and
// maxima scales_t_pitch on (that copy's bytes are cast_t_row8_layers')
__global__ void __launch_bounds__(BLOCK) fp8_cast_rt_row_layers_e4m3(const bf16 *src, i64 rows, i64 cols, i64 ld,
    unsigned char *dst, float *scales, unsigned char *, float *scales_t, i64 src_stride, i64 scales_pitch,
    i64 scales_t_pitch) {
    const i64 z = blockIdx.z;
    src += z * src_stride, dst += z * rows * cols, scales += z * scales_pitch, scales_t += z * scales_t_pitch;
    ROW_GROUPS(__NV_E4M3, true, row_parts(scales_t, cols))
}
CAST_BLOCK_KERNEL(fp8_cast_t_row_max, 256, cast_t_row_max)
CAST_BLOCK_KERNEL(fp8_cast_t_row_e4m3, 256, cast_t_row<__NV_E4M3>)
CAST_BLOCK_KERNEL(fp8_cast_t_row_e5m2, 256, cast_t_row<__NV_E5M2>)
// four blocks an SM on Hopper (64 registers, none spilled: 32 KB of loads in flight; 79 left to itself), three on
// sm_80, where 64 spill
#if __CUDA_ARCH__ >= 900
#define CAST_T_ROW8_BLOCKS 4
#else
#define CAST_T_ROW8_BLOCKS 3
#endif
#define CAST_T_ROW8_KERNEL(name, kind)                                                                               \
    __global__ void __launch_bounds__(256, CAST_T_ROW8_BLOCKS)                                                       \
        name(const unsigned char *src, i64 rows, i64 cols, i64 ld, unsigned char *dst, float *scales,                \
             const float *src_scales) {                                                                              \
        cast_t_row8<kind>(src, rows, cols, ld, dst, scales, src_scales);                                             \
    }
CAST_T_ROW8_KERNEL(fp8_cast_t_row8_e4m3, __NV_E4M3)
CAST_T_ROW8_KERNEL(fp8_cast_t_row8_e5m2, __NV_E5M2)
// cast_t_row8 over every layer's row copy that cast_rt_row_layers wrote, layer blockIdx.z (its copies rows x cols
// bytes apart, the transposed copy's scales scales_pitch floats apart, the row copy's src_scales_pitch)
__global__ void __launch_bounds__(256, CAST_T_ROW8_BLOCKS) fp8_cast_t_row8_layers_e4m3(const unsigned char *src,
    i64 rows, i64 cols, i64 ld, unsigned char *dst, float *scales, const float *src_scales, i64 scales_pitch,
    i64 src_scales_pitch) {
    const i64 z = blockIdx.z;
    src += z * rows * cols, dst += z * rows * cols, scales += z * scales_pitch, src_scales += z * src_scales_pitch;
    cast_t_row8<__NV_E4M3>(src, rows, cols, ld, dst, scales, src_scales);
}
