// module: adamw
// AdamW update and gradient sum of squares over flat fp32 arrays (arguments and formulas: gen/kernels.h).
// update follows PyTorch's torch.optim.AdamW (decoupled weight decay, bias corrections from step):
//   g = grad * grad_scale;  p *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr / (1 - b1^step) * m / (sqrt(v) / sqrt(1 - b2^step) + eps);  master = p;  param = bf16(p)
// 1 - b^step is computed as -expm1(step * log1p(b - 1)), accurate in fp32 even for b2 = 0.999 at step 1.
// Both kernels move float4 vectors, UNROLL per thread per iteration, when every pointer is 16-byte aligned (param:
// 8-byte), else element by element.
// sumsq: out += sum of grad^2, the same bits run to run: squares summed in fp32 per float4, in double per thread
// (its elements in index order) and per block (a fixed shuffle tree, then the warps in order); each block writes its
// total to partial[blockIdx.x]; the last block to finish (a fence, then a ticket from counter) sums partial[0..grid)
// in index order, adds the total to out (rounded to fp32 once) and sets counter back to 0. The grid is persistent
// (one SM's worth of threads per SM, see cp_k_dims) and SUMSQ_UNROLL float4 loads in flight per thread make up for
// it; the bits depend on the grid, so on the GPU's SM count, not on timing.
#include <cuda_bf16.h>

typedef long long i64;
typedef __nv_bfloat16 bf16;

#define BLOCK {{BLOCK}}
#define UNROLL {{UNROLL}}
#define SUMSQ_UNROLL {{SUMSQ_UNROLL}}

extern "C" __global__ void adamw_update(float *master, float *m, float *v, const float *grad, bf16 *param, i64 n,
                                        float lr, float beta1, float beta2, float eps, float wd, float grad_scale,
                                        int step);
extern "C" __global__ void adamw_sumsq(const float *grad, i64 n, double *partial, unsigned *counter, float *out);

struct adamw_k {
    float decay, b1, b2, c1, c2, step_size, inv_bc2_sqrt, eps, gs;
    __device__ __forceinline__ void apply(float &p, float &m, float &v, float grad) const {
        const float g = grad * gs;
        p *= decay;
        m = fmaf(b1, m, c1 * g);
        v = fmaf(b2, v, c2 * g * g);
        p = fmaf(-step_size, m / fmaf(sqrtf(v), inv_bc2_sqrt, eps), p);
    }
};

__global__ void __launch_bounds__(BLOCK) adamw_update(float *__restrict__ master, float *__restrict__ m,
                                                     float *__restrict__ v, const float *__restrict__ grad,
                                                     bf16 *__restrict__ param, i64 n, float lr, float beta1,
                                                     float beta2, float eps, float wd, float grad_scale, int step) {
    adamw_k K;
    K.decay = 1.f - lr * wd;
    K.b1 = beta1;
    K.b2 = beta2;
    K.c1 = 1.f - beta1;
    K.c2 = 1.f - beta2;
    const float bc1 = -expm1f((float)step * log1pf(beta1 - 1.f));
    const float bc2 = -expm1f((float)step * log1pf(beta2 - 1.f));
    K.step_size = lr / bc1;
    K.inv_bc2_sqrt = 1.f / sqrtf(bc2);
    K.eps = eps;
    K.gs = grad_scale;
    const i64 tid = (i64)blockIdx.x * BLOCK + threadIdx.x, nthreads = (i64)gridDim.x * BLOCK;
    const bool aligned = ((reinterpret_cast<unsigned long long>(master) | reinterpret_cast<unsigned long long>(m) |
                           reinterpret_cast<unsigned long long>(v) | reinterpret_cast<unsigned long long>(grad)) & 15) == 0 &&
                         (reinterpret_cast<unsigned long long>(param) & 7) == 0;
    if (!aligned) {
        for (i64 i = tid; i < n; i += nthreads) {
            float p = master[i], mm = m[i], vv = v[i];
            K.apply(p, mm, vv, grad[i]);
            master[i] = p;
            m[i] = mm;
            v[i] = vv;
            param[i] = __float2bfloat16_rn(p);
        }
        return;
    }
    const i64 n4 = n / 4;
    float4 *P = reinterpret_cast<float4 *>(master), *M = reinterpret_cast<float4 *>(m), *V = reinterpret_cast<float4 *>(v);
    const float4 *G = reinterpret_cast<const float4 *>(grad);
    for (i64 base = (i64)blockIdx.x * (BLOCK * UNROLL); base < n4; base += (i64)gridDim.x * (BLOCK * UNROLL)) {
        float4 p[UNROLL], mm[UNROLL], vv[UNROLL], g[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const i64 i = base + u * BLOCK + threadIdx.x;
            if (i < n4) {
                p[u] = P[i];
                mm[u] = M[i];
                vv[u] = V[i];
                g[u] = G[i];
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const i64 i = base + u * BLOCK + threadIdx.x;
            if (i >= n4) continue;
            K.apply(p[u].x, mm[u].x, vv[u].x, g[u].x);
            K.apply(p[u].y, mm[u].y, vv[u].y, g[u].y);
            K.apply(p[u].z, mm[u].z, vv[u].z, g[u].z);
            K.apply(p[u].w, mm[u].w, vv[u].w, g[u].w);
            P[i] = p[u];
            M[i] = mm[u];
            V[i] = vv[u];
            __nv_bfloat162 lo = __floats2bfloat162_rn(p[u].x, p[u].y), hi = __floats2bfloat162_rn(p[u].z, p[u].w);
            uint2 w;
            w.x = *reinterpret_cast<unsigned int *>(&lo);
            w.y = *reinterpret_cast<unsigned int *>(&hi);
            reinterpret_cast<uint2 *>(param)[i] = w;
        }
    }
    // the last n % 4 elements
    for (i64 i = n4 * 4 + tid; i < n; i += nthreads) {
        float p = master[i], mm = m[i], vv = v[i];
        K.apply(p, mm, vv, grad[i]);
        master[i] = p;
        m[i] = mm;
        v[i] = vv;
        param[i] = __float2bfloat16_rn(p);
    }
}

__global__ void __launch_bounds__(BLOCK) adamw_sumsq(const float *__restrict__ grad, i64 n, double *__restrict__ partial,
                                                    unsigned *__restrict__ counter, float *__restrict__ out) {
    const i64 tid = (i64)blockIdx.x * BLOCK + threadIdx.x, nthreads = (i64)gridDim.x * BLOCK;
    double acc = 0.0;
    i64 done = 0;
    if ((reinterpret_cast<unsigned long long>(grad) & 15) == 0) {
        const i64 n4 = n / 4;
        const float4 *G = reinterpret_cast<const float4 *>(grad);
        for (i64 base = (i64)blockIdx.x * (BLOCK * SUMSQ_UNROLL); base < n4; base += (i64)gridDim.x * (BLOCK * SUMSQ_UNROLL)) {
            float4 g[SUMSQ_UNROLL];
#pragma unroll
            for (int u = 0; u < SUMSQ_UNROLL; u++) {
                const i64 i = base + u * BLOCK + threadIdx.x;
                if (i < n4) g[u] = G[i];
            }
#pragma unroll
            for (int u = 0; u < SUMSQ_UNROLL; u++) {
                const i64 i = base + u * BLOCK + threadIdx.x;
                if (i < n4) acc += (double)fmaf(g[u].x, g[u].x, fmaf(g[u].y, g[u].y, fmaf(g[u].z, g[u].z, g[u].w * g[u].w)));
            }
        }
        done = n4 * 4;
    }
    for (i64 i = done + tid; i < n; i += nthreads) acc += (double)grad[i] * grad[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    __shared__ double part[BLOCK / 32];
    __shared__ bool last;
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
#pragma unroll
        for (int w = 0; w < BLOCK / 32; w++) t += part[w];
        partial[blockIdx.x] = t;
        __threadfence(); // the partial is visible to every block before this block's ticket is
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    // the last block: every other block's partial was written before its ticket
    __threadfence();
    double t = 0.0;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += BLOCK) t += __ldcg(partial + b);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = t;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
#pragma unroll
        for (int w = 0; w < BLOCK / 32; w++) total += part[w];
        *out = (float)((double)*out + total);
        *counter = 0u; // ready for the next launch (launches on one stream run one after another)
    }
}
