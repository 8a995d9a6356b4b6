// module: embedding_v{{VOCAB}}_h{{HIDDEN}}
// Token embedding (arguments: gen/kernels.h). The rows of out (fwd) and dout (bwd) are cut into vectors of VEC
// bf16 values (16 bytes when HIDDEN % 8 == 0); each thread moves UNROLL vectors per iteration, all loads first.
// fwd: out[i] = table[tokens[i]] (NaN row for a token outside [0, VOCAB)).
// bwd: dtable[tokens[i]] += dout[i] in fp32 with atomics (float4 reductions on sm_90), so repeated tokens sum.
#include <cuda_bf16.h>

typedef long long i64;
typedef __nv_bfloat16 bf16;

#define VOCAB {{VOCAB}}
#define HIDDEN {{HIDDEN}}
#define VEC {{VEC}}
#define BLOCK {{BLOCK}}
#define UNROLL {{UNROLL}}
#define CPR (HIDDEN / VEC) // vectors per row

static_assert(HIDDEN % VEC == 0, "VEC must divide HIDDEN");

template <int N> struct __align__(2 * N) bvec { bf16 h[N]; };
typedef bvec<VEC> vec_t;

extern "C" __global__ void embedding_fwd_v{{VOCAB}}_h{{HIDDEN}}(const int *tokens, const bf16 *table, bf16 *out, i64 n);
extern "C" __global__ void embedding_bwd_v{{VOCAB}}_h{{HIDDEN}}(const int *tokens, const bf16 *dout, float *dtable, i64 n);

__global__ void __launch_bounds__(BLOCK) embedding_fwd_v{{VOCAB}}_h{{HIDDEN}}(
    const int *__restrict__ tokens, const bf16 *__restrict__ table, bf16 *__restrict__ out, i64 n) {
    const i64 total = n * CPR;
    for (i64 base = (i64)blockIdx.x * (BLOCK * UNROLL); base < total; base += (i64)gridDim.x * (BLOCK * UNROLL)) {
        vec_t v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const i64 idx = base + u * BLOCK + threadIdx.x;
            if (idx >= total) continue;
            const i64 row = idx / CPR;
            const int col = (int)(idx - row * CPR);
            const int tok = __ldg(tokens + row);
            if (tok >= 0 && tok < VOCAB) {
                v[u] = reinterpret_cast<const vec_t *>(table + (i64)tok * HIDDEN)[col];
            } else {
#pragma unroll
                for (int i = 0; i < VEC; i++) v[u].h[i] = __ushort_as_bfloat16((unsigned short)0x7fc0);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const i64 idx = base + u * BLOCK + threadIdx.x;
            if (idx < total) reinterpret_cast<vec_t *>(out)[idx] = v[u];
        }
    }
}

__global__ void __launch_bounds__(BLOCK) embedding_bwd_v{{VOCAB}}_h{{HIDDEN}}(
    const int *__restrict__ tokens, const bf16 *__restrict__ dout, float *__restrict__ dtable, i64 n) {
    const i64 total = n * CPR;
    for (i64 base = (i64)blockIdx.x * (BLOCK * UNROLL); base < total; base += (i64)gridDim.x * (BLOCK * UNROLL)) {
        vec_t v[UNROLL];
        int tok[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const i64 idx = base + u * BLOCK + threadIdx.x;
            tok[u] = -1;
            if (idx >= total) continue;
            tok[u] = __ldg(tokens + idx / CPR);
            v[u] = reinterpret_cast<const vec_t *>(dout)[idx];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            if (tok[u] < 0 || tok[u] >= VOCAB) continue;
            const i64 idx = base + u * BLOCK + threadIdx.x;
            const int col = (int)(idx % CPR);
            float *p = dtable + (i64)tok[u] * HIDDEN + col * VEC;
#if __CUDA_ARCH__ >= 900 && VEC % 4 == 0
#pragma unroll
            for (int i = 0; i < VEC; i += 4)
                atomicAdd(reinterpret_cast<float4 *>(p + i),
                          make_float4(__bfloat162float(v[u].h[i]), __bfloat162float(v[u].h[i + 1]),
                                      __bfloat162float(v[u].h[i + 2]), __bfloat162float(v[u].h[i + 3])));
#else
#pragma unroll
            for (int i = 0; i < VEC; i++) atomicAdd(p + i, __bfloat162float(v[u].h[i]));
#endif
        }
    }
}
