// module: swiglu_f{{FFN}}
// SwiGLU on a tile of n rows of FFN values, element-wise (arguments: gen/kernels.h), rounding as HF does in bf16:
//   fwd: out = bf16(bf16(silu(gate)) * up), silu(g) = g * sigmoid(g)
//   bwd: dup = dout * bf16(silu(gate)); dgate = dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))), written over
//        gate and up (fp32 math, one rounding to bf16).
// Vectors of VEC bf16 (16 bytes when FFN % 8 == 0); each thread handles UNROLL vectors per iteration, loads first.
// Where an FP8 GEMM reads an output (out; dgate, dup) with one scale per tensor, its amax slot is that GEMM input's
// scale slot and the kernel takes the output's amax too (fp8_amax.cuh); NULL elsewhere. With block scales the twins
// fwd_copy, bwd_copy (both gradients), bwd_copy_gate and bwd_copy_up write the outputs' FP8 copies [n][FFN] and their
// 1 x 128 scales beside them (fp8_block.cuh; COPY_OK, elsewhere they trap), each in the format its fmax names: entries of
// their own, so that fwd and bwd keep their registers.
#include <cuda_bf16.h>

#include "fp8_amax.cuh"
#include "fp8_block.cuh"

typedef long long i64;
typedef __nv_bfloat16 bf16;

#define FFN {{FFN}}
#define VEC {{VEC}}
#define BLOCK {{BLOCK}}
#define UNROLL {{UNROLL}}

static_assert(FFN % VEC == 0, "VEC must divide FFN");
#define COPY_OK (VEC == 8 && FFN % 128 == 0) // whole 1 x 128 blocks of a row, 16 vectors each

template <int N> struct __align__(2 * N) bvec { bf16 h[N]; };
typedef bvec<VEC> vec_t;

extern "C" __global__ void swiglu_fwd_f{{FFN}}(const bf16 *gate, const bf16 *up, bf16 *out, i64 n, float *amax_slot,
                                              float amax_fmax);
extern "C" __global__ void swiglu_bwd_f{{FFN}}(const bf16 *dout, bf16 *gate, bf16 *up, i64 n, float *gate_amax_slot,
                                              float gate_amax_fmax, float *up_amax_slot, float up_amax_fmax);
extern "C" __global__ void swiglu_fwd_copy_f{{FFN}}(const bf16 *gate, const bf16 *up, bf16 *out, i64 n, float fmax,
                                                   unsigned char *copy, float *copy_scales);
#define BWD_COPY_ARGS                                                                                                  \
    const bf16 *dout, bf16 *gate, bf16 *up, i64 n, float gate_fmax, unsigned char *gate_copy, float *gate_scales,     \
        float up_fmax, unsigned char *up_copy, float *up_scales
extern "C" __global__ void swiglu_bwd_copy_f{{FFN}}(BWD_COPY_ARGS);
extern "C" __global__ void swiglu_bwd_copy_gate_f{{FFN}}(BWD_COPY_ARGS);
extern "C" __global__ void swiglu_bwd_copy_up_f{{FFN}}(BWD_COPY_ARGS);

static __device__ __forceinline__ float sigmoid(float g) { return __frcp_rn(1.f + __expf(-g)); }
static __device__ __forceinline__ float bf16_round(float f) { return __bfloat162float(__float2bfloat16_rn(f)); }

// Vector idx of the output (its values f as stored) into the FP8 copy [n][FFN] and its scales; every lane calls it.
static __device__ __forceinline__ void copy_vector(const float *f, bool in, i64 idx, i64 n, float fmax,
                                                   unsigned char *copy, float *scales) {
#if COPY_OK
    fp8_block_store(f, in, fmax, copy + 8 * idx, scales + (idx % (FFN / 8)) / 16 * n + idx / (FFN / 8));
#endif
}

// The forward over the kernel's vectors, out's copy written (COPY: fwd_copy) or not (fwd). Returns the thread's largest
// |out|.
template <bool COPY>
static __device__ __forceinline__ float fwd_loop(const bf16 *__restrict__ gate, const bf16 *__restrict__ up,
                                                 bf16 *__restrict__ out, i64 n, float fmax,
                                                 unsigned char *__restrict__ copy, float *__restrict__ copy_scales) {
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
            const bool in = idx < total;
            if (!COPY && !in) continue; // with a copy every lane goes on to its block's shuffles
            float f[VEC];
            if (in) {
                vec_t r;
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    const float x = __bfloat162float(gv[k].h[i]);
                    r.h[i] = __float2bfloat16_rn(bf16_round(x * sigmoid(x)) * __bfloat162float(uv[k].h[i]));
                    f[i] = __bfloat162float(r.h[i]);
                    amax = fmaxf(amax, fabsf(f[i]));
                }
                o[idx] = r;
            }
            if (COPY) copy_vector(f, in, idx, n, fmax, copy, copy_scales);
        }
    }
    return amax;
}

__global__ void __launch_bounds__(BLOCK) swiglu_fwd_f{{FFN}}(const bf16 *__restrict__ gate, const bf16 *__restrict__ up,
                                                        bf16 *__restrict__ out, i64 n,
                                                        float *__restrict__ amax_slot, float amax_fmax) {
    fp8_amax_commit(fwd_loop<false>(gate, up, out, n, amax_fmax, nullptr, nullptr), amax_slot, amax_fmax);
}

// (at least 2 blocks an SM: with BLOCK alone ptxas held this entry to 64 registers and spilled)
__global__ void __launch_bounds__(BLOCK, 2) swiglu_fwd_copy_f{{FFN}}(const bf16 *__restrict__ gate,
                                                                const bf16 *__restrict__ up, bf16 *__restrict__ out,
                                                                i64 n, float fmax, unsigned char *__restrict__ copy,
                                                                float *__restrict__ copy_scales) {
#if COPY_OK
    fwd_loop<true>(gate, up, out, n, fmax, copy, copy_scales);
#else
    __trap(); // the planner writes copies only where COPY_OK holds
#endif
}

// The backward's loop, as fwd_loop with U vectors a thread per pass: dgate's copy written (GC) or not, and dup's (UC);
// the largest |dgate| and |dup| into *gate_amax and *up_amax. The entries that write copies take one vector a pass:
// 78 registers rather than 104, three blocks an SM rather than two (on an H200 5.7% faster alone, 3.6 ms of the 3B
// step at 32K).
template <bool GC, bool UC, int U>
static __device__ __forceinline__ void bwd_loop(const bf16 *__restrict__ dout, bf16 *__restrict__ gate,
                                                bf16 *__restrict__ up, i64 n, float gate_fmax,
                                                unsigned char *__restrict__ gate_copy, float *__restrict__ gate_scales,
                                                float up_fmax, unsigned char *__restrict__ up_copy,
                                                float *__restrict__ up_scales, float *gate_amax, float *up_amax) {
    const i64 total = n * (FFN / VEC);
    const vec_t *d = reinterpret_cast<const vec_t *>(dout);
    vec_t *g = reinterpret_cast<vec_t *>(gate), *u = reinterpret_cast<vec_t *>(up);
    for (i64 base = (i64)blockIdx.x * (BLOCK * U); base < total; base += (i64)gridDim.x * (BLOCK * U)) {
        vec_t dv[U], gv[U], uv[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            const i64 idx = base + k * BLOCK + threadIdx.x;
            if (idx < total) {
                dv[k] = d[idx];
                gv[k] = g[idx];
                uv[k] = u[idx];
            }
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            const i64 idx = base + k * BLOCK + threadIdx.x;
            const bool in = idx < total;
            if (!GC && !UC && !in) continue;
            float fg[VEC], fu[VEC];
            if (in) {
                vec_t dg, du;
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    const float x = __bfloat162float(gv[k].h[i]), y = __bfloat162float(uv[k].h[i]);
                    const float dy = __bfloat162float(dv[k].h[i]);
                    const float s = sigmoid(x);
                    du.h[i] = __float2bfloat16_rn(dy * bf16_round(x * s));
                    dg.h[i] = __float2bfloat16_rn(dy * y * s * fmaf(x, 1.f - s, 1.f));
                    fg[i] = __bfloat162float(dg.h[i]);
                    fu[i] = __bfloat162float(du.h[i]);
                    *gate_amax = fmaxf(*gate_amax, fabsf(fg[i]));
                    *up_amax = fmaxf(*up_amax, fabsf(fu[i]));
                }
                g[idx] = dg;
                u[idx] = du;
            }
            if (GC) copy_vector(fg, in, idx, n, gate_fmax, gate_copy, gate_scales);
            if (UC) copy_vector(fu, in, idx, n, up_fmax, up_copy, up_scales);
        }
    }
}

__global__ void __launch_bounds__(BLOCK) swiglu_bwd_f{{FFN}}(const bf16 *__restrict__ dout, bf16 *__restrict__ gate,
                                                        bf16 *__restrict__ up, i64 n,
                                                        float *__restrict__ gate_amax_slot, float gate_amax_fmax,
                                                        float *__restrict__ up_amax_slot, float up_amax_fmax) {
    float gate_amax = 0.f, up_amax = 0.f;
    bwd_loop<false, false, UNROLL>(dout, gate, up, n, gate_amax_fmax, nullptr, nullptr, up_amax_fmax, nullptr,
                                   nullptr, &gate_amax, &up_amax);
    fp8_amax_commit(gate_amax, gate_amax_slot, gate_amax_fmax);
    fp8_amax_commit(up_amax, up_amax_slot, up_amax_fmax);
}

#if COPY_OK
#define BWD_COPY(name, GC, UC)                                                                                         \
    __global__ void __launch_bounds__(BLOCK) name(BWD_COPY_ARGS) {                                                     \
        float gate_amax = 0.f, up_amax = 0.f;                                                                          \
        bwd_loop<GC, UC, 1>(dout, gate, up, n, gate_fmax, gate_copy, gate_scales, up_fmax, up_copy, up_scales,         \
                            &gate_amax, &up_amax);                                                                     \
    }
#else
#define BWD_COPY(name, GC, UC)                                                                                         \
    __global__ void name(BWD_COPY_ARGS) { __trap(); /* the planner writes copies only where COPY_OK holds */ }
#endif
BWD_COPY(swiglu_bwd_copy_f{{FFN}}, true, true)
BWD_COPY(swiglu_bwd_copy_gate_f{{FFN}}, true, false)
BWD_COPY(swiglu_bwd_copy_up_f{{FFN}}, false, true)
