// module: attn_delta_d{{D}}
// delta = rowsum(dout * out) for the attention backward, per (token, head) row of D bf16 values, in fp32
// (arguments: gen/kernels.h), rows laid out over threads as head_rows.cuh says.
#include "head_rows.cuh"

extern "C" __global__ void attn_delta_fwd_d{{D}}(const bf16 *dout, const bf16 *out, float *delta, i64 n, int heads);

__global__ void __launch_bounds__(BLOCK) attn_delta_fwd_d{{D}}(const bf16 *__restrict__ dout, const bf16 *__restrict__ out,
                                                          float *__restrict__ delta, i64 n, int heads) {
    const i64 rows = n * heads;
    const i64 row = thread_row();
    const int lane = threadIdx.x % TPR;
    const bool valid = row < rows; // rows past the end compute on the last row (for the shuffles), store nothing
    const i64 base = (valid ? row : rows - 1) * D;
    bvec_t a[NV], b[NV];
#pragma unroll
    for (int k = 0; k < NV; k++)
        if (IN_ROW(k)) {
            a[k] = reinterpret_cast<const bvec_t *>(dout + base)[lane + k * TPR];
            b[k] = reinterpret_cast<const bvec_t *>(out + base)[lane + k * TPR];
        }
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++)
        if (IN_ROW(k))
#pragma unroll
            for (int i = 0; i < VEC; i++) s = fmaf(__bfloat162float(a[k].h[i]), __bfloat162float(b[k].h[i]), s);
#pragma unroll
    for (int o = TPR / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (valid && lane == 0) delta[row] = s;
}
