// module: rope_d{{D}}_f{{FREQ_TAG}}{{POS_TAG}}
// Rotary position embedding in place on [n][heads][D] bf16 (arguments: gen/kernels.h), Hugging Face's rotate_half
// convention: pairs (i, i + D/2) with angle pos * inv_freq[i], i < D/2, row r at position pos0 + r, or, with
// POS_ARRAY (packed documents whose positions restart at each document), at pos[r]:
//   fwd: y_i = x_i cos - x_{i+D/2} sin,  y_{i+D/2} = x_{i+D/2} cos + x_i sin
//   bwd: the transpose (angle -> -angle), the gradient of fwd.
// inv_freq (theta and Llama-3 scaling) is computed on the host in double and baked in below. The angle is formed
// and reduced modulo 2*pi in double, so it stays exact to ~1e-9 rad at millions of positions; the sine and cosine
// of the reduced angle (|a| <= pi) then come from the fast fp32 unit (abs error < 4e-7, far below bf16's step).
// One thread per (token, group of VEC pairs): it computes VEC sines and cosines once and applies them to every
// head of the token, HU heads at a time (all loads of a group first).
// bwd_copy, bwd's twin (COPY_OK: a head of 128 values is one 1 x 128 block, its CPH = 8 threads consecutive lanes),
// also writes dx's FP8 copy [rows][heads * D] and its 1 x 128 scales as the casts would (fp8_block.cuh), in the
// format fmax names: bwd_copy(dx, n, heads, pos0, fmax, copy, copy_scales, row0, scale_rows) with the launch's rows
// at rows row0 .. of the copy, whose scales are laid out [heads][scale_rows] (a ring's rank runs one launch a run).
#include <cuda_bf16.h>

#include "fp8_block.cuh"

typedef long long i64;
typedef __nv_bfloat16 bf16;

#define D {{D}}
#define HALF (D / 2)
#define VEC {{VEC}}
#define CPH (HALF / VEC) // threads per token
#define BLOCK {{BLOCK}}
#define HU 4
#define POS_ARRAY {{POS_ARRAY}}
#if POS_ARRAY
typedef const int *pos_t; // each row's position
#else
typedef i64 pos_t; // the first row's; the others follow it
#endif

static_assert(HALF % VEC == 0, "VEC must divide D/2");
#define COPY_OK (D == 128 && VEC == 8) // as gen/kernels.c's cp_k_fp8_copies tells the planner

template <int N> struct __align__(2 * N) bvec { bf16 h[N]; };
typedef bvec<VEC> vec_t;

__constant__ double rope_inv_freq[HALF] = {
    {{INV_FREQ}}};

extern "C" __global__ void rope_fwd_d{{D}}_f{{FREQ_TAG}}{{POS_TAG}}(bf16 *x, i64 n, int heads, pos_t pos0);
extern "C" __global__ void rope_bwd_d{{D}}_f{{FREQ_TAG}}{{POS_TAG}}(bf16 *dx, i64 n, int heads, pos_t pos0);
extern "C" __global__ void rope_bwd_copy_d{{D}}_f{{FREQ_TAG}}{{POS_TAG}}(bf16 *dx, i64 n, int heads, pos_t pos0,
    float fmax, unsigned char *copy, float *copy_scales, i64 row0, i64 scale_rows);

// A head's 1 x 128 block of the copy: its 8 threads' 16 values each (lo: columns c VEC .., hi: HALF + c VEC ..), the
// block's maximum by shuffles among them (every lane of the warp calls it; one outside the rows with in = false); as
// fp8_block.cuh's fp8_block_store, which takes 16 lanes of 8 consecutive values.
template <__nv_fp8_interpretation_t KIND>
static __device__ __forceinline__ void head_block_store(const float *lo, const float *hi, bool in, float fmax, int c,
                                                        unsigned char *dst, float *scale) {
    float m = 0.0f;
    if (in) {
#pragma unroll
        for (int j = 0; j < 8; j++) m = fmaxf(m, fmaxf(fabsf(lo[j]), fabsf(hi[j])));
    }
    m = fp8_group_max<CPH>(m);
    if (!in) return;
    const float q = pow2_quant(m, fmax);
    *reinterpret_cast<uint2 *>(dst + c * VEC) = fp8x8s<KIND>(lo, q);
    *reinterpret_cast<uint2 *>(dst + HALF + c * VEC) = fp8x8s<KIND>(hi, q);
    if (c == 0) *scale = pow2_inverse(q);
}

// fwd, bwd, and with COPY bwd_copy's copy of what it writes
template <bool BWD, bool COPY = false>
static __device__ __forceinline__ void rope_apply(bf16 *__restrict__ x, i64 n, int heads, pos_t pos0, float fmax = 0.f,
                                                  unsigned char *__restrict__ copy = nullptr,
                                                  float *__restrict__ copy_scales = nullptr, i64 row0 = 0,
                                                  i64 scale_rows = 0) {
    const i64 t = (i64)blockIdx.x * BLOCK + threadIdx.x;
    const i64 row = t / CPH;
    const int c = (int)(t - row * CPH);
    const bool valid = row < n;
    if (!COPY && !valid) return; // with a copy every lane goes on to its blocks' shuffles
    float cs[VEC], sn[VEC];
#if POS_ARRAY
    const double pos = (double)pos0[valid ? row : 0];
#else
    const double pos = (double)(pos0 + row);
#endif
#pragma unroll
    for (int j = 0; j < VEC; j++) {
        double a = pos * rope_inv_freq[c * VEC + j];
        const double k = rint(a * 0.15915494309189535); // 1 / (2 pi)
        a = fma(-k, 6.283185307179586, a);              // |a| <= pi (plus rounding)
        __sincosf((float)a, &sn[j], &cs[j]);
        if (BWD) sn[j] = -sn[j];
    }
    bf16 *p = x + row * heads * D + c * VEC;
    for (int h0 = 0; h0 < heads; h0 += HU) {
        vec_t lo[HU], hi[HU];
#pragma unroll
        for (int u = 0; u < HU; u++)
            if (valid && h0 + u < heads) {
                lo[u] = *reinterpret_cast<const vec_t *>(p + (h0 + u) * D);
                hi[u] = *reinterpret_cast<const vec_t *>(p + (h0 + u) * D + HALF);
            }
#pragma unroll
        for (int u = 0; u < HU; u++) {
            if (h0 + u >= heads) continue; // the same heads for every thread
            vec_t a, b;
            float fa[VEC], fb[VEC];
            if (valid) {
#pragma unroll
                for (int j = 0; j < VEC; j++) {
                    const float x0 = __bfloat162float(lo[u].h[j]), x1 = __bfloat162float(hi[u].h[j]);
                    a.h[j] = __float2bfloat16_rn(fmaf(x0, cs[j], -x1 * sn[j]));
                    b.h[j] = __float2bfloat16_rn(fmaf(x1, cs[j], x0 * sn[j]));
                    fa[j] = __bfloat162float(a.h[j]), fb[j] = __bfloat162float(b.h[j]);
                }
                *reinterpret_cast<vec_t *>(p + (h0 + u) * D) = a;
                *reinterpret_cast<vec_t *>(p + (h0 + u) * D + HALF) = b;
            }
            if (COPY) {
                const i64 r = row0 + row;
                unsigned char *dst = copy + (r * heads + h0 + u) * D;
                float *scale = copy_scales + (i64)(h0 + u) * scale_rows + r;
                if (fmax == 448.0f) head_block_store<__NV_E4M3>(fa, fb, valid, fmax, c, dst, scale);
                else head_block_store<__NV_E5M2>(fa, fb, valid, fmax, c, dst, scale);
            }
        }
    }
}

__global__ void __launch_bounds__(BLOCK) rope_fwd_d{{D}}_f{{FREQ_TAG}}{{POS_TAG}}(bf16 *x, i64 n, int heads, pos_t pos0) {
    rope_apply<false>(x, n, heads, pos0);
}

__global__ void __launch_bounds__(BLOCK) rope_bwd_d{{D}}_f{{FREQ_TAG}}{{POS_TAG}}(bf16 *dx, i64 n, int heads, pos_t pos0) {
    rope_apply<true>(dx, n, heads, pos0);
}

__global__ void __launch_bounds__(BLOCK) rope_bwd_copy_d{{D}}_f{{FREQ_TAG}}{{POS_TAG}}(bf16 *dx, i64 n, int heads,
    pos_t pos0, float fmax, unsigned char *copy, float *copy_scales, i64 row0, i64 scale_rows) {
#if COPY_OK
    rope_apply<true, true>(dx, n, heads, pos0, fmax, copy, copy_scales, row0, scale_rows);
#else
    __trap(); // the planner writes copies only where COPY_OK holds
#endif
}
