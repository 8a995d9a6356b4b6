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
#include <cuda_bf16.h>

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

template <int N> struct __align__(2 * N) bvec { bf16 h[N]; };
typedef bvec<VEC> vec_t;

__constant__ double rope_inv_freq[HALF] = {
    {{INV_FREQ}}};

extern "C" __global__ void rope_fwd_d{{D}}_f{{FREQ_TAG}}{{POS_TAG}}(bf16 *x, i64 n, int heads, pos_t pos0);
extern "C" __global__ void rope_bwd_d{{D}}_f{{FREQ_TAG}}{{POS_TAG}}(bf16 *dx, i64 n, int heads, pos_t pos0);

template <bool BWD> static __device__ __forceinline__ void rope_apply(bf16 *__restrict__ x, i64 n, int heads, pos_t pos0) {
    const i64 t = (i64)blockIdx.x * BLOCK + threadIdx.x;
    const i64 row = t / CPH;
    const int c = (int)(t - row * CPH);
    if (row >= n) return;
    float cs[VEC], sn[VEC];
#if POS_ARRAY
    const double pos = (double)pos0[row];
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
            if (h0 + u < heads) {
                lo[u] = *reinterpret_cast<const vec_t *>(p + (h0 + u) * D);
                hi[u] = *reinterpret_cast<const vec_t *>(p + (h0 + u) * D + HALF);
            }
#pragma unroll
        for (int u = 0; u < HU; u++) {
            if (h0 + u >= heads) continue;
            vec_t a, b;
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                const float x0 = __bfloat162float(lo[u].h[j]), x1 = __bfloat162float(hi[u].h[j]);
                a.h[j] = __float2bfloat16_rn(fmaf(x0, cs[j], -x1 * sn[j]));
                b.h[j] = __float2bfloat16_rn(fmaf(x1, cs[j], x0 * sn[j]));
            }
            *reinterpret_cast<vec_t *>(p + (h0 + u) * D) = a;
            *reinterpret_cast<vec_t *>(p + (h0 + u) * D + HALF) = b;
        }
    }
}

__global__ void __launch_bounds__(BLOCK) rope_fwd_d{{D}}_f{{FREQ_TAG}}{{POS_TAG}}(bf16 *x, i64 n, int heads, pos_t pos0) {
    rope_apply<false>(x, n, heads, pos0);
}

__global__ void __launch_bounds__(BLOCK) rope_bwd_d{{D}}_f{{FREQ_TAG}}{{POS_TAG}}(bf16 *dx, i64 n, int heads, pos_t pos0) {
    rope_apply<true>(dx, n, heads, pos0);
}
