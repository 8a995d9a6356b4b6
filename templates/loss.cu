// module: loss_v{{VOCAB}}
// Cross-entropy over a tile of logits [n][VOCAB] bf16, fused with its gradient (arguments: gen/kernels.h).
// One block per row. Pass 1 reads the row once, keeping a running max and a running sum of exp per thread (the
// sum rescaled when the max grows), then combines them over the block: lse = max + log(sum).
// Pass 2 reads the row again (mostly from L2: it was just read) and writes (softmax - onehot) * scale in place as
// bf16, with streaming cache hints so the writes do not push other rows' logits out of L2.
// row_loss[row] = lse - logit[target] (unscaled), one plain store per row: no atomics, so the loss is the same bits
// run to run. target < 0: ignored (zero gradient row, row_loss 0); target >= VOCAB: NaN in both.
// sum: loss_sum[0] += the sum of row_loss[0..n) in double, in a fixed order (one block: thread t takes rows t,
// t + SUM_BLOCK, ... in turn, then a fixed shuffle tree and the warps in order), rounded to fp32 once. The plan runs
// it once per micro-batch over the micro-batch's rows, so the accumulation into loss_sum is in stream order.
// Math in base 2: exp(x - m) = exp2(x * log2(e) - m * log2(e)).
#include <cuda_bf16.h>

typedef long long i64;
typedef __nv_bfloat16 bf16;

#define VOCAB {{VOCAB}}
#define VEC {{VEC}}
#define BLOCK {{BLOCK}}
#define UNROLL {{UNROLL}}
#define NVEC (VOCAB / VEC)
#define NWARP (BLOCK / 32)
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define NEG_INF __int_as_float(0xff800000)
#define SUM_BLOCK {{SUM_BLOCK}}

static_assert(VOCAB % VEC == 0, "VEC must divide VOCAB");
static_assert(BLOCK % 32 == 0 && BLOCK <= 1024 && SUM_BLOCK % 32 == 0 && SUM_BLOCK <= 1024, "whole warps");

// VEC bf16 values moved as one machine word (so the cache-hinted load/store intrinsics apply)
template <int N> struct word;
template <> struct word<8> { typedef uint4 T; };
template <> struct word<4> { typedef uint2 T; };
template <> struct word<2> { typedef unsigned int T; };
template <> struct word<1> { typedef unsigned short T; };
typedef word<VEC>::T word_t;
union vec_t {
    word_t w;
    bf16 h[VEC];
};

extern "C" __global__ void loss_fwdbwd_v{{VOCAB}}(bf16 *logits, const int *targets, float *row_loss, float scale, i64 n);
extern "C" __global__ void loss_sum_v{{VOCAB}}(const float *row_loss, i64 n, float *loss_sum);

// (m, s): running max and sum of exp2((x - m) * LOG2E). Merge two such pairs.
static __device__ __forceinline__ void merge(float &m, float &s, float m2, float s2) {
    if (m2 == NEG_INF) return;
    if (m == NEG_INF) {
        m = m2;
        s = s2;
        return;
    }
    const float mx = fmaxf(m, m2);
    s = s * exp2f((m - mx) * LOG2E) + s2 * exp2f((m2 - mx) * LOG2E);
    m = mx;
}

__global__ void __launch_bounds__(BLOCK) loss_fwdbwd_v{{VOCAB}}(bf16 *__restrict__ logits, const int *__restrict__ targets,
                                                          float *__restrict__ row_loss, float scale, i64 n) {
    const i64 row = blockIdx.x;
    if (row >= n) return;
    word_t *p = reinterpret_cast<word_t *>(logits + row * VOCAB);
    const int target = targets[row];
    if (target < 0) { // ignored token: zero gradient, no loss
        if (threadIdx.x == 0) row_loss[row] = 0.f;
        vec_t z;
#pragma unroll
        for (int i = 0; i < VEC; i++) z.h[i] = __float2bfloat16_rn(0.f);
        for (int v = threadIdx.x; v < NVEC; v += BLOCK) __stcs(p + v, z.w);
        return;
    }
    const bool bad = target >= VOCAB;
    __shared__ float sm[NWARP], ss[NWARP], s_lse, s_tgt;
    if (threadIdx.x == 0) s_tgt = bad ? __int_as_float(0x7fffffff) : __bfloat162float(logits[row * VOCAB + target]);

    // pass 1: running max and sum
    float m = NEG_INF, s = 0.f;
    for (int v0 = 0; v0 < NVEC; v0 += BLOCK * UNROLL) {
        vec_t x[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int v = v0 + u * BLOCK + threadIdx.x;
            if (v < NVEC) x[u].w = p[v];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int v = v0 + u * BLOCK + threadIdx.x;
            if (v >= NVEC) continue;
            float mv = NEG_INF;
#pragma unroll
            for (int i = 0; i < VEC; i++) mv = fmaxf(mv, __bfloat162float(x[u].h[i]));
            if (mv > m) {
                s = m == NEG_INF ? 0.f : s * exp2f((m - mv) * LOG2E);
                m = mv;
            }
            const float mb = m * LOG2E;
#pragma unroll
            for (int i = 0; i < VEC; i++) s += exp2f(fmaf(__bfloat162float(x[u].h[i]), LOG2E, -mb));
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
    if (threadIdx.x % 32 == 0) {
        sm[threadIdx.x / 32] = m;
        ss[threadIdx.x / 32] = s;
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        m = threadIdx.x < NWARP ? sm[threadIdx.x] : NEG_INF;
        s = threadIdx.x < NWARP ? ss[threadIdx.x] : 0.f;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
        if (threadIdx.x == 0) {
            const float lse = m + log2f(s) * LN2;
            s_lse = lse;
            row_loss[row] = lse - s_tgt;
        }
    }
    __syncthreads();

    // pass 2: gradient in place
    const float lb = s_lse * LOG2E;
    const float g_scale = bad ? __int_as_float(0x7fffffff) : scale;
    for (int v0 = 0; v0 < NVEC; v0 += BLOCK * UNROLL) {
        vec_t x[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int v = v0 + u * BLOCK + threadIdx.x;
            if (v < NVEC) x[u].w = __ldcs(p + v);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int v = v0 + u * BLOCK + threadIdx.x;
            if (v >= NVEC) continue;
            vec_t g;
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                float pr = exp2f(fmaf(__bfloat162float(x[u].h[i]), LOG2E, -lb));
                if (v * VEC + i == target) pr -= 1.f;
                g.h[i] = __float2bfloat16_rn(pr * g_scale);
            }
            __stcs(p + v, g.w);
        }
    }
}

__global__ void __launch_bounds__(SUM_BLOCK) loss_sum_v{{VOCAB}}(const float *__restrict__ row_loss, i64 n,
                                                                float *__restrict__ loss_sum) {
    double acc = 0.0;
    i64 i = threadIdx.x;
    // four loads in flight per thread; the additions stay in row order for each thread
    for (; i + 3 * SUM_BLOCK < n; i += 4 * SUM_BLOCK) {
        const float a = row_loss[i], b = row_loss[i + SUM_BLOCK], c = row_loss[i + 2 * SUM_BLOCK],
                    d = row_loss[i + 3 * SUM_BLOCK];
        acc += (double)a;
        acc += (double)b;
        acc += (double)c;
        acc += (double)d;
    }
    for (; i < n; i += SUM_BLOCK) acc += (double)row_loss[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    __shared__ double part[SUM_BLOCK / 32];
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
#pragma unroll
        for (int w = 0; w < SUM_BLOCK / 32; w++) t += part[w];
        *loss_sum = (float)((double)*loss_sum + t);
    }
}
