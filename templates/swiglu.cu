// module: swiglu_f{{FFN}}
// SwiGLU on a tile of n rows of FFN values, element-wise (arguments: gen/kernels.h), rounding as HF does in bf16:
//   fwd: out = bf16(bf16(silu(gate)) * up), silu(g) = g * sigmoid(g)
//   bwd: dup = dout * bf16(silu(gate)); dgate = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))), written over
//        gate and up (fp32 math, one rounding to bf16).
// Vectors of VEC bf16 (16 bytes when FFN % 8 == 0); each thread handles UNROLL vectors per iteration, loads first.
// Where an FP8 GEMM reads an output (out; dgate, dup), its amax slot is that GEMM input's scale slot and the kernel
// takes the output's amax too (fp8_amax.cuh); NULL elsewhere.
#include <cuda_bf16.h>

#include "fp8_amax.cuh"

typedef long long i64;
typedef __nv_bfloat16 bf16;

#define FFN {{FFN}}
#define VEC {{VEC}}
#define BLOCK {{BLOCK}}
#define UNROLL {{UNROLL}}

static_assert(FFN % VEC == 0, "VEC must divide FFN");

template <int N> struct __align__(2 * N) bvec { bf16 h[N]; };
typedef bvec<VEC> vec_t;

extern "C" __global__ void swiglu_fwd_f{{FFN}}(const bf16 *gate, const bf16 *up, bf16 *out, i64 n, float *amax_slot,
                                              float amax_fmax);
extern "C" __global__ void swiglu_bwd_f{{FFN}}(const bf16 *dout, bf16 *gate, bf16 *up, i64 n, float *gate_amax_slot,
                                              float gate_amax_fmax, float *up_amax_slot, float up_amax_fmax);

static __device__ __forceinline__ float sigmoid(float g) { return __frcp_rn(1.f + __expf(-g)); }
static __device__ __forceinline__ float bf16_round(float f) { return __bfloat162float(__float2bfloat16_rn(f)); }

__global__ void __launch_bounds__(BLOCK) swiglu_fwd_f{{FFN}}(const bf16 *__restrict__ gate, const bf16 *__restrict__ up,
                                                        bf16 *__restrict__ out, i64 n,
                                                        float *__restrict__ amax_slot, float amax_fmax) {
    float amax = 0.f;
    const i64 total = n * (FFN / VEC);
    const vec_t *g = reinterpret_cast<const vec_t *>(gate), *u = reinterpret_cast<const vec_t *>(up);
    vec_t *o = reinterpret_cast<vec_t *>(out);
    for (i64 base = (i64)blockIdx.x * (BLOCK * UNROLL); base < total; base += (i64)gridDim.x * (BLOCK * UNROLL)) {
        vec_t gv[UNROLL], uv[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            const i64 idx = base + k * BLOCK + threadIdx.x;
            if (idx < total) {
                gv[k] = g[idx];
                uv[k] = u[idx];
            }
        }
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            const i64 idx = base + k * BLOCK + threadIdx.x;
            if (idx >= total) continue;
            vec_t r;
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                const float x = __bfloat162float(gv[k].h[i]);
                r.h[i] = __float2bfloat16_rn(bf16_round(x * sigmoid(x)) * __bfloat162float(uv[k].h[i]));
                amax = fmaxf(amax, fabsf(__bfloat162float(r.h[i])));
            }
            o[idx] = r;
        }
    }
    fp8_amax_commit(amax, amax_slot, amax_fmax);
}

__global__ void __launch_bounds__(BLOCK) swiglu_bwd_f{{FFN}}(const bf16 *__restrict__ dout, bf16 *__restrict__ gate,
                                                        bf16 *__restrict__ up, i64 n,
                                                        float *__restrict__ gate_amax_slot, float gate_amax_fmax,
                                                        float *__restrict__ up_amax_slot, float up_amax_fmax) {
    float gate_amax = 0.f, up_amax = 0.f;
    const i64 total = n * (FFN / VEC);
    const vec_t *d = reinterpret_cast<const vec_t *>(dout);
    vec_t *g = reinterpret_cast<vec_t *>(gate), *u = reinterpret_cast<vec_t *>(up);
    for (i64 base = (i64)blockIdx.x * (BLOCK * UNROLL); base < total; base += (i64)gridDim.x * (BLOCK * UNROLL)) {
        vec_t dv[UNROLL], gv[UNROLL], uv[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            const i64 idx = base + k * BLOCK + threadIdx.x;
            if (idx < total) {
                dv[k] = d[idx];
                gv[k] = g[idx];
                uv[k] = u[idx];
            }
        }
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            const i64 idx = base + k * BLOCK + threadIdx.x;
            if (idx >= total) continue;
            vec_t dg, du;
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                const float x = __bfloat162float(gv[k].h[i]), y = __bfloat162float(uv[k].h[i]);
                const float dy = __bfloat162float(dv[k].h[i]);
                const float s = sigmoid(x);
                du.h[i] = __float2bfloat16_rn(dy * bf16_round(x * s));
                dg.h[i] = __float2bfloat16_rn(dy * y * s * fmaf(x, 1.f - s, 1.f));
                gate_amax = fmaxf(gate_amax, fabsf(__bfloat162float(dg.h[i])));
                up_amax = fmaxf(up_amax, fabsf(__bfloat162float(du.h[i])));
            }
            g[idx] = dg;
            u[idx] = du;
        }
    }
    fp8_amax_commit(gate_amax, gate_amax_slot, gate_amax_fmax);
    fp8_amax_commit(up_amax, up_amax_slot, up_amax_fmax);
}
