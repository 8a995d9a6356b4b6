// module: cast
// Type conversions over flat arrays (arguments: gen/kernels.h).
//   f32_to_bf16: dst = bf16(src), round to nearest even; float4 -> 4 bf16 per vector, UNROLL vectors per thread
//   per iteration when src is 16-byte and dst 8-byte aligned, else element by element.
//   add_f32: dst += src (fp32), float4 vectors likewise when both are 16-byte aligned. Before a reduce-scatter of
//   a later micro-batch, it adds this rank's accumulated gradient shard into its slice of the unit's gradients.
#include <cuda_bf16.h>

typedef long long i64;
typedef __nv_bfloat16 bf16;

#define BLOCK {{BLOCK}}
#define UNROLL {{UNROLL}}

extern "C" __global__ void cast_f32_to_bf16(const float *src, bf16 *dst, i64 n);
extern "C" __global__ void cast_add_f32(const float *src, float *dst, i64 n);

__global__ void __launch_bounds__(BLOCK) cast_f32_to_bf16(const float *__restrict__ src, bf16 *__restrict__ dst, i64 n) {
    const i64 tid = (i64)blockIdx.x * BLOCK + threadIdx.x, nthreads = (i64)gridDim.x * BLOCK;
    i64 done = 0;
    if (((reinterpret_cast<unsigned long long>(src) & 15) | (reinterpret_cast<unsigned long long>(dst) & 7)) == 0) {
        const i64 n4 = n / 4;
        const float4 *S = reinterpret_cast<const float4 *>(src);
        uint2 *Dv = reinterpret_cast<uint2 *>(dst);
        for (i64 base = (i64)blockIdx.x * (BLOCK * UNROLL); base < n4; base += (i64)gridDim.x * (BLOCK * UNROLL)) {
            float4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const i64 i = base + u * BLOCK + threadIdx.x;
                if (i < n4) v[u] = S[i];
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const i64 i = base + u * BLOCK + threadIdx.x;
                if (i >= n4) continue;
                __nv_bfloat162 lo = __floats2bfloat162_rn(v[u].x, v[u].y), hi = __floats2bfloat162_rn(v[u].z, v[u].w);
                uint2 w;
                w.x = *reinterpret_cast<unsigned int *>(&lo);
                w.y = *reinterpret_cast<unsigned int *>(&hi);
                Dv[i] = w;
            }
        }
        done = n4 * 4;
    }
    for (i64 i = done + tid; i < n; i += nthreads) dst[i] = __float2bfloat16_rn(src[i]);
}

__global__ void __launch_bounds__(BLOCK) cast_add_f32(const float *__restrict__ src, float *__restrict__ dst, i64 n) {
    const i64 tid = (i64)blockIdx.x * BLOCK + threadIdx.x, nthreads = (i64)gridDim.x * BLOCK;
    i64 done = 0;
    if (((reinterpret_cast<unsigned long long>(src) | reinterpret_cast<unsigned long long>(dst)) & 15) == 0) {
        const i64 n4 = n / 4;
        const float4 *S = reinterpret_cast<const float4 *>(src);
        float4 *D = reinterpret_cast<float4 *>(dst);
        for (i64 base = (i64)blockIdx.x * (BLOCK * UNROLL); base < n4; base += (i64)gridDim.x * (BLOCK * UNROLL)) {
            float4 a[UNROLL], b[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const i64 i = base + u * BLOCK + threadIdx.x;
                if (i < n4) a[u] = S[i], b[u] = D[i];
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const i64 i = base + u * BLOCK + threadIdx.x;
                if (i < n4) D[i] = make_float4(b[u].x + a[u].x, b[u].y + a[u].y, b[u].z + a[u].z, b[u].w + a[u].w);
            }
        }
        done = n4 * 4;
    }
    for (i64 i = done + tid; i < n; i += nthreads) dst[i] += src[i];
}
