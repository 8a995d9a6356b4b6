// module: attn_merge_d{{D}}
// Ring attention's merge of partial results by their log-sum-exp (arguments: gen/kernels.h). Each block of K/V a
// rank attends to gives a partial output O_i and lse_i over the same query rows; the exact output over all blocks is
// O = sum_i exp(lse_i - lse) O_i with lse = log sum_i exp(lse_i). Merged one block at a time into an fp32
// accumulator, in place:
//   init: o_acc = o_blk, lse_acc = lse_blk (the first block);
//   fwd:  lse = logaddexp(lse_acc, lse_blk); o_acc = exp(lse_acc - lse) o_acc + exp(lse_blk - lse) o_blk;
//         lse_acc = lse. A row that no key reached yet (lse = -inf on both sides) stays as it is.
// Per (token, head) row of D values, laid out over threads as head_rows.cuh says. lse rows are [heads][lse_stride],
// so a range of query rows (half of a zigzag block) is merged by offsetting the pointers.
#include "head_rows.cuh"

#define NEG_INF __int_as_float(0xff800000)

extern "C" __global__ void attn_merge_init_d{{D}}(const bf16 *o_blk, const float *lse_blk, float *o_acc, float *lse_acc,
                                                 i64 n, int heads, i64 lse_stride);
extern "C" __global__ void attn_merge_fwd_d{{D}}(const bf16 *o_blk, const float *lse_blk, float *o_acc, float *lse_acc,
                                                i64 n, int heads, i64 lse_stride);

// Where a (token, head) row's lse sits in [heads][lse_stride].
__device__ __forceinline__ i64 lse_index(i64 row, int heads, i64 lse_stride) {
    return (row % heads) * lse_stride + row / heads;
}

__global__ void __launch_bounds__(BLOCK) attn_merge_init_d{{D}}(const bf16 *__restrict__ o_blk,
                                                               const float *__restrict__ lse_blk,
                                                               float *__restrict__ o_acc, float *__restrict__ lse_acc,
                                                               i64 n, int heads, i64 lse_stride) {
    const i64 row = thread_row();
    const int lane = threadIdx.x % TPR;
    if (row >= n * heads) return;
    const i64 base = row * D;
#pragma unroll
    for (int k = 0; k < NV; k++)
        if (IN_ROW(k)) {
            const bvec_t b = reinterpret_cast<const bvec_t *>(o_blk + base)[lane + k * TPR];
            fvec_t a;
#pragma unroll
            for (int i = 0; i < VEC; i++) a.f[i] = __bfloat162float(b.h[i]);
            reinterpret_cast<fvec_t *>(o_acc + base)[lane + k * TPR] = a;
        }
    if (lane == 0) {
        const i64 li = lse_index(row, heads, lse_stride);
        lse_acc[li] = lse_blk[li];
    }
}

__global__ void __launch_bounds__(BLOCK) attn_merge_fwd_d{{D}}(const bf16 *__restrict__ o_blk,
                                                              const float *__restrict__ lse_blk,
                                                              float *__restrict__ o_acc, float *__restrict__ lse_acc,
                                                              i64 n, int heads, i64 lse_stride) {
    const i64 row = thread_row();
    const int lane = threadIdx.x % TPR;
    if (row >= n * heads) return;
    const i64 li = lse_index(row, heads, lse_stride);
    // lane 0 of the row reads both lse and shares them, so its write of lse_acc below races with no other read
    const unsigned row_mask = (TPR == 32 ? 0xffffffffu : ((1u << TPR) - 1u)) << (threadIdx.x % 32 / TPR * TPR);
    float la = 0.f, lb = 0.f;
    if (lane == 0) la = lse_acc[li], lb = lse_blk[li];
    la = __shfl_sync(row_mask, la, 0, TPR);
    lb = __shfl_sync(row_mask, lb, 0, TPR);
    const float m = fmaxf(la, lb);
    if (m == NEG_INF) return; // no key reached this row in either: nothing to weigh
    // log(exp(la - m) + exp(lb - m)) with one of the two terms exactly 1
    const float lse = m + log1pf(expf(fminf(la, lb) - m));
    const float wa = expf(la - lse), wb = expf(lb - lse);
    const i64 base = row * D;
#pragma unroll
    for (int k = 0; k < NV; k++)
        if (IN_ROW(k)) {
            const bvec_t b = reinterpret_cast<const bvec_t *>(o_blk + base)[lane + k * TPR];
            fvec_t a = reinterpret_cast<const fvec_t *>(o_acc + base)[lane + k * TPR];
#pragma unroll
            for (int i = 0; i < VEC; i++) a.f[i] = fmaf(wa, a.f[i], wb * __bfloat162float(b.h[i]));
            reinterpret_cast<fvec_t *>(o_acc + base)[lane + k * TPR] = a;
        }
    if (lane == 0) lse_acc[li] = lse;
}
