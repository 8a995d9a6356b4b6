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
// their own, so that fwd and bwd keep their registers. With row scales fwd_row and bwd_row write them with one scale
// per row (the bytes and scales of fp8.cu's cast_row) and, given col_max, the transposed copies' column maxima as
// cast_rt_row gathers them (rmsnorm.cu's fwd_row says how), or those maxima alone (copy NULL): a block of ROW_THREADS
// takes a row at a time through a row_pipe (row_pipe.cuh), each thread ROW_VECS vectors of it held in registers for
// the row's maximum, persistent blocks over the rows (ROW_OK). An output read only through its copy
// (cp_step_fp8_out.copy_only) is not written: fwd_copy's and fwd_row's out NULL; bwd_row stores dgate and dup as its
// last argument says (1 dgate, 2 dup).
#include <cuda_bf16.h>

#include "fp8_amax.cuh"
#include "fp8_block.cuh"
#include "row_pipe.cuh"

typedef long long i64;
typedef __nv_bfloat16 bf16;

#define FFN {{FFN}}
#define VEC {{VEC}}
#define BLOCK {{BLOCK}}
#define UNROLL {{UNROLL}}

static_assert(FFN % VEC == 0, "VEC must divide FFN");
#define COPY_OK (VEC == 8 && FFN % 128 == 0) // whole 1 x 128 blocks of a row, 16 vectors each
#define ROW_THREADS {{ROW_THREADS}}
#define ROW_VECS {{ROW_VECS}} // vectors of a row a thread: FFN / VEC over ROW_THREADS, rounded up
// fwd_row, bwd_row: the rows in flight in each one's row_pipe, 0 where it has none (gen/kernels.c's cp_k_swiglu
// decides: vectors of 8, at most 4 of them a thread, the stages in shared memory); two blocks of fwd_row an SM where a
// thread holds at most 2 vectors
#define ROW_STAGES_F {{ROW_STAGES_F}}
#define ROW_STAGES_B {{ROW_STAGES_B}}
#define ROW_OK (ROW_STAGES_F > 0)
#define ROW_FWD_BLOCKS {{ROW_FWD_BLOCKS}}

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
#define ROW_ARGS(x) float x##_fmax, unsigned char *x##_copy, float *x##_scales, float *x##_col_max, int x##_col_max_rows
extern "C" __global__ void swiglu_fwd_row_f{{FFN}}(const bf16 *gate, const bf16 *up, bf16 *out, i64 n, ROW_ARGS(out));
extern "C" __global__ void swiglu_bwd_row_f{{FFN}}(const bf16 *dout, bf16 *gate, bf16 *up, i64 n, ROW_ARGS(gate),
                                                  ROW_ARGS(up), int store);

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
// |out|. With COPY out may be NULL: only its copy is wanted (cp_step_fp8_out.copy_only).
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
                if (!COPY || o) o[idx] = r;
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

#if ROW_OK
// The row entries. Vector k of thread t is the row's vector t + k * ROW_THREADS (in_row: inside the row).
static __device__ __forceinline__ bool in_row(int k) {
    return ROW_VECS * ROW_THREADS * VEC == FFN || (int)threadIdx.x + k * ROW_THREADS < FFN / VEC;
}

// The largest of each of a and b over the block's threads, for all of them (every thread calls it; it ends with a
// barrier, so it may be called again right away): one reduction for both outputs of bwd_row
static __device__ __forceinline__ float2 block_max2(float a, float b) {
    __shared__ float2 warp_max[ROW_THREADS / 32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
        b = fmaxf(b, __shfl_xor_sync(0xffffffffu, b, o));
    }
    if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = make_float2(a, b);
    __syncthreads();
    float2 m = warp_max[0];
#pragma unroll
    for (int w = 1; w < ROW_THREADS / 32; w++) m = make_float2(fmaxf(m.x, warp_max[w].x), fmaxf(m.y, warp_max[w].y));
    __syncthreads();
    return m;
}

// One output of the row entries: its arguments (ROW_ARGS: the copy and scales, copy NULL for none; the column maxima,
// NULL for none), read from the kernel's parameters where used rather than held in registers
struct row_args {
    float fmax;
    unsigned char *copy;
    float *scales, *col_max;
    int col_max_rows;
};

// The thread's column maxima of one output over the block's rows, as bf16 (which holds them exactly): in registers,
// or with SHARED in the thread's own 16-byte words of shared memory (bwd_row keeps dup's there, for registers)
template <bool SHARED> struct col_maxima {
    __nv_bfloat162 reg[SHARED ? 1 : ROW_VECS][VEC / 2];

    __device__ __forceinline__ __nv_bfloat162 *at(int k) {
        if constexpr (SHARED) {
            __shared__ uint4 words[ROW_VECS * ROW_THREADS];
            return reinterpret_cast<__nv_bfloat162 *>(&words[k * ROW_THREADS + threadIdx.x]);
        } else {
            return reg[k];
        }
    }
    __device__ __forceinline__ const __nv_bfloat162 *at(int k) const { return const_cast<col_maxima *>(this)->at(k); }

    __device__ __forceinline__ col_maxima() {
#pragma unroll
        for (int k = 0; k < ROW_VECS; k++) {
            __nv_bfloat162 z[VEC / 2];
#pragma unroll
            for (int j = 0; j < VEC / 2; j++) z[j] = __float2bfloat162_rn(0.f);
            *reinterpret_cast<uint4 *>(at(k)) = *reinterpret_cast<const uint4 *>(z);
        }
    }

    // The thread's largest |v| (its vectors of a row, as stored), which also go into the column maxima
    __device__ __forceinline__ float absorb(const vec_t (&v)[ROW_VECS]) {
        float m = 0.f;
#pragma unroll
        for (int k = 0; k < ROW_VECS; k++) {
            if (!in_row(k)) continue;
#pragma unroll
            for (int i = 0; i < VEC; i++) m = fmaxf(m, fabsf(__bfloat162float(v[k].h[i])));
            const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(v[k].h);
            __nv_bfloat162 c[VEC / 2];
            *reinterpret_cast<uint4 *>(c) = *reinterpret_cast<const uint4 *>(at(k));
#pragma unroll
            for (int j = 0; j < VEC / 2; j++) c[j] = __hmax2(c[j], __habs2(h[j]));
            *reinterpret_cast<uint4 *>(at(k)) = *reinterpret_cast<const uint4 *>(c);
        }
        return m;
    }

    // The block's column maxima into its row of a.col_max (rmsnorm.cu's col_max_add)
    __device__ __forceinline__ void commit(const row_args &a) const {
        if (!a.col_max) return;
        float *c = a.col_max + (i64)(blockIdx.x % a.col_max_rows) * FFN;
#pragma unroll
        for (int k = 0; k < ROW_VECS; k++)
            if (in_row(k)) fp8_col_max_add8(c + ((int)threadIdx.x + k * ROW_THREADS) * VEC, at(k));
    }
};

// Row `row`'s copy of the thread's vectors v and its scale, the row's largest |x| being m (a.copy NULL: none)
static __device__ __forceinline__ void row_store(const row_args &a, const vec_t (&v)[ROW_VECS], i64 row, float m) {
    if (!a.copy) return;
    const float q = pow2_quant(m, a.fmax);
#pragma unroll
    for (int k = 0; k < ROW_VECS; k++) {
        if (!in_row(k)) continue;
        float f[VEC];
#pragma unroll
        for (int i = 0; i < VEC; i++) f[i] = __bfloat162float(v[k].h[i]);
        fp8_row_vector(f, q, a.fmax, a.copy + row * FFN + ((int)threadIdx.x + k * ROW_THREADS) * VEC);
    }
    if (threadIdx.x == 0) a.scales[row] = pow2_inverse(q);
}

// The thread's vectors of a row of N inputs, through a row_pipe (words: input t's vector k at t * ROW_VECS + k): issued
// for a row below n (nothing past it), then read
template <int N> struct row_in {
    vec_t v[N][ROW_VECS];
    template <class Pipe>
    static __device__ __forceinline__ void issue(int stage, const bf16 *const (&src)[N], i64 row, i64 n) {
        if (row >= n) return;
#pragma unroll
        for (int k = 0; k < ROW_VECS; k++)
            if (in_row(k))
#pragma unroll
                for (int t = 0; t < N; t++) {
                    const i64 vec = row * (FFN / VEC) + threadIdx.x + k * ROW_THREADS;
                    Pipe::load(stage, t * ROW_VECS + k, src[t] + vec * VEC, true);
                }
    }
    template <class Pipe> __device__ __forceinline__ void read(int stage) {
#pragma unroll
        for (int k = 0; k < ROW_VECS; k++)
            if (in_row(k))
#pragma unroll
                for (int t = 0; t < N; t++) v[t][k] = Pipe::template get<vec_t>(stage, t * ROW_VECS + k);
    }
};

// fwd_row's row: out's values over gate's, stored (unless out is NULL: the copy alone), then its copy
static __device__ __forceinline__ void fwd_row_step(row_in<2> &r, i64 row, bf16 *__restrict__ out, const row_args &a,
                                                    col_maxima<false> &o) {
    vec_t(&gv)[ROW_VECS] = r.v[0];
#pragma unroll
    for (int k = 0; k < ROW_VECS; k++) {
        if (!in_row(k)) continue;
#pragma unroll
        for (int i = 0; i < VEC; i++) {
            const float x = __bfloat162float(gv[k].h[i]);
            gv[k].h[i] = __float2bfloat16_rn(bf16_round(x * sigmoid(x)) * __bfloat162float(r.v[1][k].h[i]));
        }
        if (out) reinterpret_cast<vec_t *>(out)[row * (FFN / VEC) + threadIdx.x + k * ROW_THREADS] = gv[k];
    }
    if (a.copy) row_store(a, gv, row, block_max2(o.absorb(gv), 0.f).x);
    else if (a.col_max) o.absorb(gv); // the maxima alone
}

// bwd_row's row: dgate and dup over gate's and up's values, stored (as `store` says: 1 dgate, 2 dup; not one no later
// step reads, only its copy: cp_step_fp8_out.copy_only), then their copies from one reduction
static __device__ __forceinline__ void bwd_row_step(row_in<3> &r, i64 row, bf16 *__restrict__ gate,
                                                    bf16 *__restrict__ up, int store, const row_args &ag,
                                                    col_maxima<false> &og, const row_args &au, col_maxima<true> &ou) {
    vec_t(&gv)[ROW_VECS] = r.v[1], (&uv)[ROW_VECS] = r.v[2];
#pragma unroll
    for (int k = 0; k < ROW_VECS; k++) {
        if (!in_row(k)) continue;
#pragma unroll
        for (int i = 0; i < VEC; i++) {
            const float x = __bfloat162float(gv[k].h[i]), y = __bfloat162float(uv[k].h[i]);
            const float dy = __bfloat162float(r.v[0][k].h[i]);
            const float s = sigmoid(x);
            uv[k].h[i] = __float2bfloat16_rn(dy * bf16_round(x * s));
            gv[k].h[i] = __float2bfloat16_rn(dy * y * s * fmaf(x, 1.f - s, 1.f));
        }
        const i64 idx = row * (FFN / VEC) + threadIdx.x + k * ROW_THREADS;
        if (store & 1) reinterpret_cast<vec_t *>(gate)[idx] = gv[k];
        if (store & 2) reinterpret_cast<vec_t *>(up)[idx] = uv[k];
    }
    const float mg = ag.copy || ag.col_max ? og.absorb(gv) : 0.f, mu = au.copy || au.col_max ? ou.absorb(uv) : 0.f;
    if (!ag.copy && !au.copy) return; // the maxima alone
    const float2 m = block_max2(mg, mu);
    row_store(ag, gv, row, m.x);
    row_store(au, uv, row, m.y);
}

#endif

__global__ void __launch_bounds__(ROW_THREADS, ROW_FWD_BLOCKS) swiglu_fwd_row_f{{FFN}}(const bf16 *__restrict__ gate,
                                                                   const bf16 *__restrict__ up, bf16 *__restrict__ out,
                                                                   i64 n, ROW_ARGS(out)) {
#if ROW_OK
    const row_args a = {out_fmax, out_copy, out_scales, out_col_max, out_col_max_rows};
    col_maxima<false> o;
    const bf16 *const src[2] = {gate, up};
    typedef row_pipe<ROW_STAGES_F, 2 * ROW_VECS, ROW_THREADS> pipe;
    pipe::run(blockIdx.x, gridDim.x, n, [&](int stage, i64 row) { row_in<2>::issue<pipe>(stage, src, row, n); },
              [&](int stage, i64 row) {
                  row_in<2> r;
                  r.read<pipe>(stage);
                  fwd_row_step(r, row, out, a, o);
              });
    o.commit(a);
#else
    __trap(); // the planner writes copies only where ROW_OK holds
#endif
}

// One block an SM (dgate's column maxima in registers, dup's in shared memory)
__global__ void __launch_bounds__(ROW_THREADS, 1) swiglu_bwd_row_f{{FFN}}(const bf16 *__restrict__ dout,
                                                                      bf16 *__restrict__ gate, bf16 *__restrict__ up,
                                                                      i64 n, ROW_ARGS(gate), ROW_ARGS(up), int store) {
#if ROW_STAGES_B > 0
    const row_args ag = {gate_fmax, gate_copy, gate_scales, gate_col_max, gate_col_max_rows};
    const row_args au = {up_fmax, up_copy, up_scales, up_col_max, up_col_max_rows};
    col_maxima<false> og;
    col_maxima<true> ou;
    const bf16 *const src[3] = {dout, gate, up};
    typedef row_pipe<ROW_STAGES_B, 3 * ROW_VECS, ROW_THREADS> pipe;
    pipe::run(blockIdx.x, gridDim.x, n, [&](int stage, i64 row) { row_in<3>::issue<pipe>(stage, src, row, n); },
              [&](int stage, i64 row) {
                  row_in<3> r;
                  r.read<pipe>(stage);
                  bwd_row_step(r, row, gate, up, store, ag, og, au, ou);
              });
    og.commit(ag);
    ou.commit(au);
#else
    __trap(); // the planner writes copies only where ROW_OK holds
#endif
}
