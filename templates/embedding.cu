// module: embedding_v{{VOCAB}}_h{{HIDDEN}}
// Token embedding (arguments: gen/kernels.h). The rows of out (fwd) and dout (bwd) are cut into vectors of VEC
// bf16 values (16 bytes when HIDDEN % 8 == 0); each thread moves UNROLL vectors per iteration, all loads first.
// fwd: out[i] = table[tokens[i]] (NaN row for a token outside [0, VOCAB)).
// bwd: dtable[tokens[i]] += dout[i] in fp32 with atomics (float4 reductions on sm_90), so repeated tokens sum.
// bwd_sorted: the same sum without atomics, deterministic: order lists the rows sorted by token (stably), so each
// token's rows form one run of positions. The work items are (position, column chunk of SGROUP threads x SCOLS
// vectors); the item at a run's first position owns that run's chunk of dtable[tok]: it loads it, adds the run's
// dout rows in sorted order (SROWS rows in flight) and stores it. Other items only look and leave. The result is the
// sequential dtable[tokens[i]] += dout[i] for i ascending, bit for bit.
#include <cuda_bf16.h>

typedef long long i64;
typedef __nv_bfloat16 bf16;

#define VOCAB {{VOCAB}}
#define HIDDEN {{HIDDEN}}
#define VEC {{VEC}}
#define BLOCK {{BLOCK}}
#define UNROLL {{UNROLL}}
#define CPR (HIDDEN / VEC) // vectors per row
#define SGROUP {{SGROUP}}
#define SCOLS {{SCOLS}}
#define SROWS {{SROWS}}
#define SCHUNK (SGROUP * SCOLS)                // vectors of a row one item covers
#define NCHUNK ((CPR + SCHUNK - 1) / SCHUNK)   // items per position
#define NOTOK (-2147483647 - 1)                // the token of a position outside [0, n): differs from every run's

static_assert(HIDDEN % VEC == 0, "VEC must divide HIDDEN");
static_assert(SGROUP >= 2 && SGROUP <= 32 && (SGROUP & (SGROUP - 1)) == 0 && BLOCK % SGROUP == 0, "bad SGROUP");

template <int N> struct __align__(2 * N) bvec { bf16 h[N]; };
typedef bvec<VEC> vec_t;
// VEC fp32 values of dtable, in 16-byte pieces at most (the row pointer is only known to be 16-byte aligned)
template <int N> struct __align__(4 * N > 16 ? 16 : 4 * N) fvec { float f[N]; };
typedef fvec<VEC> fvec_t;

extern "C" __global__ void embedding_fwd_v{{VOCAB}}_h{{HIDDEN}}(const int *tokens, const bf16 *table, bf16 *out, i64 n);
extern "C" __global__ void embedding_bwd_v{{VOCAB}}_h{{HIDDEN}}(const int *tokens, const bf16 *dout, float *dtable, i64 n);
extern "C" __global__ void embedding_bwd_sorted_v{{VOCAB}}_h{{HIDDEN}}(const int *tokens, const int *order,
                                                                     const bf16 *dout, float *dtable, i64 n);

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

__global__ void __launch_bounds__(BLOCK, 3) embedding_bwd_sorted_v{{VOCAB}}_h{{HIDDEN}}(
    const int *__restrict__ tokens, const int *__restrict__ order, const bf16 *__restrict__ dout,
    float *__restrict__ dtable, i64 n) {
    const int lane = threadIdx.x % SGROUP, gbase = threadIdx.x % 32 / SGROUP * SGROUP;
    const unsigned gmask = SGROUP == 32 ? 0xffffffffu : ((1u << SGROUP) - 1) << gbase;
    const i64 items = n * NCHUNK, stride = (i64)gridDim.x * (BLOCK / SGROUP);
    // the groups of a block take consecutive items: the chunks of one position share the look-up in L1
    for (i64 w = (i64)blockIdx.x * (BLOCK / SGROUP) + threadIdx.x / SGROUP; w < items; w += stride) {
        const int p = (int)(w / NCHUNK), ch = (int)(w - (i64)p * NCHUNK); // positions fit int: order is i32
        // lane l looks at position p - 1 + l: the one before p says whether p starts a run, those after where it ends
        int base = p - 1;
        int src = base + lane >= 0 && base + lane < n ? __ldg(order + base + lane) : -1;
        int t = src >= 0 ? __ldg(tokens + src) : NOTOK;
        const int tok = __shfl_sync(gmask, t, 1, SGROUP), prev = __shfl_sync(gmask, t, 0, SGROUP);
        if ((p > 0 && prev == tok) || tok < 0 || tok >= VOCAB) continue; // uniform over the group
        unsigned diff = (__ballot_sync(gmask, t != tok) >> gbase) & ~1u;
        int end = base; // the position lane 0 looked at; the run ends at the first lane that sees another token
        while (!diff) { // the run goes on past the window: look at the next SGROUP positions
            end += SGROUP;
            const int q = end + lane;
            const int tq = q < n ? __ldg(tokens + __ldg(order + q)) : NOTOK;
            diff = __ballot_sync(gmask, tq != tok) >> gbase;
        }
        end += __ffs((int)diff) - 1;
        float *drow = dtable + (i64)tok * HIDDEN;
        const int c0 = ch * SCHUNK + lane;
        fvec_t acc[SCOLS];
#pragma unroll
        for (int u = 0; u < SCOLS; u++)
            if (c0 + u * SGROUP < CPR) acc[u] = reinterpret_cast<const fvec_t *>(drow)[c0 + u * SGROUP];
        // rows of positions lo..end-1, in order; src holds the row of position base + lane
        for (int lo = p; lo < end;) {
            const int have = (end < base + SGROUP ? end : base + SGROUP) - lo, off = lo - base;
            for (int j = 0; j < have; j += SROWS) {
                vec_t v[SROWS][SCOLS];
#pragma unroll
                for (int k = 0; k < SROWS; k++) {
                    const int r = __shfl_sync(gmask, src, off + (j + k < have ? j + k : have - 1), SGROUP);
                    if (j + k >= have) continue;
                    const vec_t *drow_in = reinterpret_cast<const vec_t *>(dout + (i64)r * HIDDEN);
#pragma unroll
                    for (int u = 0; u < SCOLS; u++)
                        if (c0 + u * SGROUP < CPR) v[k][u] = drow_in[c0 + u * SGROUP];
                }
#pragma unroll
                for (int k = 0; k < SROWS; k++) {
                    if (j + k >= have) continue;
#pragma unroll
                    for (int u = 0; u < SCOLS; u++)
#pragma unroll
                        for (int i = 0; i < VEC; i++) acc[u].f[i] += __bfloat162float(v[k][u].h[i]);
                }
            }
            lo += have;
            if (lo < end) {
                base = lo;
                src = lo + lane < n ? __ldg(order + lo + lane) : -1;
            }
        }
#pragma unroll
        for (int u = 0; u < SCOLS; u++)
            if (c0 + u * SGROUP < CPR) reinterpret_cast<fvec_t *>(drow)[c0 + u * SGROUP] = acc[u];
    }
}
