// fp8_block.cuh: FP8 encoding shared by the casts (templates/fp8.cu) and by the kernels that write a GEMM's input and
// its FP8 copy together (rmsnorm, SwiGLU), so that both ways of making a copy give the same bytes and scales.
// fp8_block_store writes one 1 x 128 block of a row copy (train.fp8_scaling = "block"): the copy [rows][cols] dense,
// its scales laid out as cuBLASLt's VEC128_32F reads them, scales[(c / 128) * rows + r] = what an element stands for
// (1 / the multiplier). fp8_row_vector and fp8_col_max_add are the pieces of a copy with one scale per row
// (train.fp8_scaling = "row", fp8.cu's cast_row and cast_rt_row).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ unsigned short fp8x2(float a, float b) {
    return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, KIND);
}

// Eight floats, each times its multiplier q[j], as eight FP8 bytes in order
template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ uint2 fp8x8q(const float *f, const float *q) {
    uint2 w;
    w.x = fp8x2<KIND>(f[0] * q[0], f[1] * q[1]) | (unsigned)fp8x2<KIND>(f[2] * q[2], f[3] * q[3]) << 16;
    w.y = fp8x2<KIND>(f[4] * q[4], f[5] * q[5]) | (unsigned)fp8x2<KIND>(f[6] * q[6], f[7] * q[7]) << 16;
    return w;
}

// Eight floats times one multiplier q
template <__nv_fp8_interpretation_t KIND>
__device__ __forceinline__ uint2 fp8x8s(const float *f, float q) {
    const float qq[8] = {q, q, q, q, q, q, q, q};
    return fp8x8q<KIND>(f, qq);
}

// The cast's multiplier for a block whose largest |x| is a: the largest power of two q with a * q <= fmax (the power of
// two below fmax / a rounded to nearest), so that q and the GEMM's 1 / q are exact; 1 for a block of zeros; at most
// 2^126, so that 1 / q stays a normal float; 0 for an infinite amax (the GEMM's scale then infinite and its output
// NaN, as with a per-tensor scale). Found from the exponents, without a division (whose slow path is a call that made
// the producers keep registers on the stack): fmax / a has fmax's exponent less a's, one less where a's mantissa is
// the larger (the quotient's mantissa is then in (1/2, 1), and rounding never takes it to 1); a subnormal a gives
// more than 2^126.
__device__ __forceinline__ float pow2_quant(float a, float fmax) {
    if (!(a > 0.0f)) return 1.0f;
    const unsigned ab = __float_as_uint(a), fb = __float_as_uint(fmax);
    if (ab >= 0x7f800000u) return 0.0f;
    const int e = ab < 0x00800000u ? 126
                                   : (int)(fb >> 23) - (int)(ab >> 23) - ((ab & 0x7fffffu) > (fb & 0x7fffffu) ? 1 : 0);
    return __uint_as_float((unsigned)(min(e, 126) + 127) << 23);
}

// 1 / q of pow2_quant's q, exactly (infinite for 0)
__device__ __forceinline__ float pow2_inverse(float q) {
    return q == 0.0f ? __int_as_float(0x7f800000) : __uint_as_float(0x7f000000u - __float_as_uint(q));
}

template <__nv_fp8_interpretation_t KIND> __device__ __forceinline__ float fp8_max();
template <> __device__ __forceinline__ float fp8_max<__NV_E4M3>() { return 448.0f; }
template <> __device__ __forceinline__ float fp8_max<__NV_E5M2>() { return 57344.0f; }

// The largest of m over the LANES consecutive lanes of an aligned group (LANES a power of two; every lane of the warp
// calls it)
template <int LANES> __device__ __forceinline__ float fp8_group_max(float m) {
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    return m;
}

// A producer's part of one 1 x 128 block of its output's row copy: the 16 lanes of an aligned half-warp each hold 8
// consecutive values f (as stored: bf16-rounded) of the block's 128, lane % 16 == 0 the first. Every lane of the warp
// calls it, a lane outside the output with in = false (it stores nothing; a half-warp is in or out as a whole). The
// block's maximum by shuffles, its multiplier, the lane's 8 bytes to dst8 and, from the first lane, the scale to
// *scale. fmax names the format: 448 E4M3, else E5M2.
__device__ __forceinline__ void fp8_block_store(const float *f, bool in, float fmax, unsigned char *dst8,
                                                float *scale) {
    float m = 0.0f;
    if (in) {
#pragma unroll
        for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(f[j]));
    }
    m = fp8_group_max<16>(m);
    if (!in) return;
    const float q = pow2_quant(m, fmax);
    *reinterpret_cast<uint2 *>(dst8) = fmax == 448.0f ? fp8x8s<__NV_E4M3>(f, q) : fp8x8s<__NV_E5M2>(f, q);
    if ((threadIdx.x & 15) == 0) *scale = pow2_inverse(q);
}

// Eight values f (as stored) of a row whose multiplier is q (pow2_quant of the row's largest |x|) as eight bytes at
// dst8, in the format fmax names (448 E4M3, else E5M2): cast_row's bytes
__device__ __forceinline__ void fp8_row_vector(const float *f, float q, float fmax, unsigned char *dst8) {
    *reinterpret_cast<uint2 *>(dst8) = fmax == 448.0f ? fp8x8s<__NV_E4M3>(f, q) : fp8x8s<__NV_E5M2>(f, q);
}

// A column's largest |x| m (>= 0) over some of its rows into *col_max, a transposed row-scaled copy's column maxima
// (zeroed before): an atomic max of the float's bits, which order as the floats do for m >= 0
__device__ __forceinline__ void fp8_col_max_add(float *col_max, float m) {
    atomicMax(reinterpret_cast<unsigned *>(col_max), __float_as_uint(m));
}

// Eight consecutive columns' maxima, kept as four pairs of bf16 (which hold a bf16 tensor's exactly), into col_max
__device__ __forceinline__ void fp8_col_max_add8(float *col_max, const __nv_bfloat162 *m) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float2 f = __bfloat1622float2(m[j]);
        fp8_col_max_add(col_max + 2 * j, f.x);
        fp8_col_max_add(col_max + 2 * j + 1, f.y);
    }
}
