// module: rmsnorm_h{{HIDDEN}}_e{{EPS_TAG}}
// RMSNorm over rows of HIDDEN bf16 values, as Hugging Face's LlamaRMSNorm (arguments: gen/kernels.h):
//   s = x, or bf16(x + resid);  rstd = 1 / sqrt(mean(s^2) + eps);  out = bf16(weight * bf16(s * rstd)).
// TPR threads share a row; thread `lane` holds vectors lane, lane + TPR, ... (NV of them, VEC values each) in
// registers, so the row is read once. A block holds RPB rows (RPB > 1 only when TPR < 32).
// fwd: one group of RPB rows per block. bwd: persistent blocks loop over rows; each thread keeps the dweight
// partial sums of its columns in registers and stores them, at the end, into its block's own row of dw_part
// [gridDim.x][HIDDEN] (no atomics). bwd_dw then adds the parts to dweight, in part order for every column, so
// dweight gets the same bits run to run: a block per DW_COLS columns, DW_GROUPS threads per column each summing
// every DW_GROUPS-th part in turn (in double), then the groups in order; dweight = fp32(dweight + sum).
// Where an FP8 GEMM reads the output (out of fwd, dx of bwd) with one scale per tensor, amax_slot is its scale slot and
// the kernel takes the output's amax too (fp8_amax.cuh); NULL elsewhere. With block scales fwd_copy, fwd's twin, writes
// out's FP8 copy [n][HIDDEN] and its 1 x 128 scales beside out (fp8_block.cuh), in the format fmax names (COPY_OK;
// elsewhere it traps): an entry of its own, so that fwd keeps its registers. bwd_copy is bwd's twin for dx (COPY_OK_B).
// With row scales fwd_row and bwd_row write the copy with one scale per row (copy_scales f32[n]: the bytes and scales
// of fp8.cu's cast_row) and, given col_max (the transposed copy's column maxima f32[col_max_rows][HIDDEN], zeroed
// before), also do cast_rt_row's other half: each thread keeps its columns' largest |x| over its block's rows and adds
// them at the end to row blockIdx.x % col_max_rows (any row would do: cast_t_row takes the largest of them all; spread,
// fewer atomics wait on one address), one atomic max a column and thread, so fwd_row's blocks are persistent as bwd's
// (ROW_OK); with copy NULL they gather those maxima alone. Their rows reach them through a row_pipe (row_pipe.cuh).
#include <cuda_bf16.h>

#include "fp8_amax.cuh"
#include "fp8_block.cuh"
#include "row_pipe.cuh"

typedef long long i64;
typedef __nv_bfloat16 bf16;

#define HIDDEN {{HIDDEN}}
#define VEC {{VEC}}
#define NVEC (HIDDEN / VEC)
// forward split: TPR threads per row, NV vectors per thread, RPB rows per block
#define TPR {{TPR}}
#define NV {{NV}}
#define RPB {{RPB}}
#define BLOCK (TPR * RPB)
// backward split: more threads per row, fewer vectors each (it holds more per vector: dweight sums, dout, x)
#define TPR_B {{TPR_B}}
#define NV_B {{NV_B}}
#define RPB_B {{RPB_B}}
#define BLOCK_B (TPR_B * RPB_B)
#define MIN_BLOCKS {{MIN_BLOCKS}}
#define MIN_BLOCKS_B {{MIN_BLOCKS_B}}
#define MIN_BLOCKS_R {{MIN_BLOCKS_R}} // fwd_row's: more blocks than fwd's, its rows' loads in shared memory
// bwd_dw: DW_V columns per thread (a float4 when HIDDEN allows), DW_COLS columns per block, DW_GROUPS threads per column
#define DW_V {{DW_V}}
#define DW_TPC {{DW_TPC}}
#define DW_GROUPS {{DW_GROUPS}}
#define DW_COLS (DW_TPC * DW_V)
#define DW_BLOCK (DW_TPC * DW_GROUPS)
static constexpr float EPS = (float)({{EPS}});

static_assert(HIDDEN % VEC == 0, "VEC must divide HIDDEN");
static_assert(TPR <= 32 ? (32 % TPR == 0) : (TPR % 32 == 0 && RPB == 1), "TPR: power of two up to 32, or whole warps");
static_assert(TPR_B <= 32 ? (32 % TPR_B == 0) : (TPR_B % 32 == 0 && RPB_B == 1), "TPR_B: as TPR");
static_assert(BLOCK % 32 == 0 && BLOCK <= 1024 && BLOCK_B % 32 == 0 && BLOCK_B <= 1024, "whole warps");
static_assert(NV * TPR >= NVEC && (NV - 1) * TPR < NVEC, "NV vectors per thread cover the row");
static_assert(NV_B * TPR_B >= NVEC && (NV_B - 1) * TPR_B < NVEC, "NV_B vectors per thread cover the row");
static_assert((DW_V == 4 || DW_V == 1) && HIDDEN % DW_V == 0 && DW_BLOCK <= 1024 && DW_BLOCK % 32 == 0, "bwd_dw split");
// fwd_copy, bwd_copy: the 16 vectors of a 1 x 128 block in the 16 lanes of an aligned half-warp (as gen/kernels.c's
// cp_k_fp8_copies tells the planner)
#define COPY_OK (VEC == 8 && HIDDEN % 128 == 0 && TPR % 16 == 0)
#define COPY_OK_B (VEC == 8 && HIDDEN % 128 == 0 && TPR_B % 16 == 0) // bwd_copy's, as COPY_OK
// fwd_row, bwd_row: the rows in flight in each one's row_pipe, 0 where it has none (gen/kernels.c's cp_k_rmsnorm
// decides: vectors of 8, the stages in shared memory); words of fwd_row's: x's vectors then resid's, of bwd_row's:
// dout's, x's and dresid's
#define ROW_STAGES {{ROW_STAGES}}
#define ROW_STAGES_B {{ROW_STAGES_B}}
#define ROW_OK (ROW_STAGES > 0)
#define ROW_OK_B (ROW_STAGES_B > 0)

template <int N> struct __align__(2 * N) bvec { bf16 h[N]; };
typedef bvec<VEC> vec_t;

extern "C" __global__ void rmsnorm_fwd_h{{HIDDEN}}_e{{EPS_TAG}}(const bf16 *x, const bf16 *resid, bf16 *sum_out,
    const bf16 *weight, bf16 *out, float *rstd, i64 n, float *amax_slot, float amax_fmax);
extern "C" __global__ void rmsnorm_fwd_copy_h{{HIDDEN}}_e{{EPS_TAG}}(const bf16 *x, const bf16 *resid, bf16 *sum_out,
    const bf16 *weight, bf16 *out, float *rstd, i64 n, float fmax, unsigned char *copy, float *copy_scales);
extern "C" __global__ void rmsnorm_bwd_h{{HIDDEN}}_e{{EPS_TAG}}(const bf16 *dout, const bf16 *x, const bf16 *weight,
    const float *rstd, const bf16 *dresid, bf16 *dx, float *dw_part, i64 n, float *amax_slot, float amax_fmax);
extern "C" __global__ void rmsnorm_bwd_copy_h{{HIDDEN}}_e{{EPS_TAG}}(const bf16 *dout, const bf16 *x,
    const bf16 *weight, const float *rstd, const bf16 *dresid, bf16 *dx, float *dw_part, i64 n, float fmax,
    unsigned char *copy, float *copy_scales);
extern "C" __global__ void rmsnorm_fwd_row_h{{HIDDEN}}_e{{EPS_TAG}}(const bf16 *x, const bf16 *resid, bf16 *sum_out,
    const bf16 *weight, bf16 *out, float *rstd, i64 n, float fmax, unsigned char *copy, float *copy_scales,
    float *col_max, int col_max_rows);
extern "C" __global__ void rmsnorm_bwd_row_h{{HIDDEN}}_e{{EPS_TAG}}(const bf16 *dout, const bf16 *x,
    const bf16 *weight, const float *rstd, const bf16 *dresid, bf16 *dx, float *dw_part, i64 n, float fmax,
    unsigned char *copy, float *copy_scales, float *col_max, int col_max_rows);
extern "C" __global__ void rmsnorm_bwd_dw_h{{HIDDEN}}_e{{EPS_TAG}}(const float *dw_part, int parts, float *dweight);

static __device__ __forceinline__ float bf16_round(float f) { return __bfloat162float(__float2bfloat16_rn(f)); }

// Whether vector k of thread `lane` lies in the row (vector number lane + k * P).
template <int P, int N> static __device__ __forceinline__ bool in_row(int k, int lane) {
    return N * P == NVEC || lane + k * P < NVEC;
}

// Sum (or with MAX the largest) of v over the P threads of a row. With P > 32 (one row per block) it goes through
// shared memory and ends with a barrier, so it may be called again right away.
template <int P, bool MAX = false> static __device__ __forceinline__ float row_sum(float v) {
#pragma unroll
    for (int o = (P < 32 ? P : 32) / 2; o > 0; o >>= 1) {
        const float w = __shfl_xor_sync(0xffffffffu, v, o);
        v = MAX ? fmaxf(v, w) : v + w;
    }
    if (P > 32) {
        __shared__ float part[P > 32 ? P / 32 : 1];
        if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
        __syncthreads();
        v = MAX ? part[0] : 0.f;
#pragma unroll
        for (int w = MAX ? 1 : 0; w < P / 32; w++) v = MAX ? fmaxf(v, part[w]) : v + part[w];
        __syncthreads();
    }
    return v;
}

// The thread's column maxima over its rows, pairs of bf16 (which hold them exactly: the values are bf16)
template <int N> struct col_maxima {
    __nv_bfloat162 m[N][VEC / 2];
    __device__ __forceinline__ col_maxima() {
#pragma unroll
        for (int k = 0; k < N; k++)
#pragma unroll
            for (int j = 0; j < VEC / 2; j++) m[k][j] = __float2bfloat162_rn(0.f);
    }
};

// A row's values o (thread lane's vectors of its P, N of them; as stored, 0 outside the row) into its row-scaled FP8
// copy (row `row` of copy and scales; NULL copy: none) where row < n, and into the thread's column maxima cm. Every
// thread of the row calls it (the row's maximum is a reduction).
template <int P, int N>
static __device__ __forceinline__ void row_copy(const vec_t (&o)[N], i64 row, i64 n, int lane, float fmax,
                                                unsigned char *copy, float *scales, col_maxima<N> &cm) {
    float m = 0.f;
    if (copy) {
#pragma unroll
        for (int k = 0; k < N; k++)
#pragma unroll
            for (int i = 0; i < VEC; i++) m = fmaxf(m, fabsf(__bfloat162float(o[k].h[i])));
        m = row_sum<P, true>(m);
    }
    if (row >= n) return;
    const float q = pow2_quant(m, fmax);
#pragma unroll
    for (int k = 0; k < N; k++) {
        if (!in_row<P, N>(k, lane)) continue;
        if (copy) {
            float f[VEC];
#pragma unroll
            for (int i = 0; i < VEC; i++) f[i] = __bfloat162float(o[k].h[i]);
            fp8_row_vector(f, q, fmax, copy + row * HIDDEN + (lane + k * P) * VEC);
        }
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(o[k].h);
#pragma unroll
        for (int j = 0; j < VEC / 2; j++) cm.m[k][j] = __hmax2(cm.m[k][j], __habs2(h[j]));
    }
    if (copy && lane == 0) scales[row] = pow2_inverse(q);
}

// The thread's column maxima cm into the block's row of col_max (NULL: none asked for)
template <int P, int N>
static __device__ __forceinline__ void col_max_add(const col_maxima<N> &cm, int lane, float *col_max, int rows) {
    if (!col_max) return;
    col_max += (i64)(blockIdx.x % rows) * HIDDEN;
#pragma unroll
    for (int k = 0; k < N; k++)
        if (in_row<P, N>(k, lane)) fp8_col_max_add8(col_max + (lane + k * P) * VEC, cm.m[k]);
}

// Thread lane's vectors of a row (its base offset) of src, of its P, N of them
template <int P, int N>
static __device__ __forceinline__ void load_row(const bf16 *__restrict__ src, i64 base, int lane, vec_t (&v)[N]) {
#pragma unroll
    for (int k = 0; k < N; k++)
        if (in_row<P, N>(k, lane)) v[k] = *reinterpret_cast<const vec_t *>(src + base + (lane + k * P) * VEC);
}

// The same vectors into words word0, ... of a row_pipe stage (zeros where !ok), and from there
template <class Pipe, int P, int N>
static __device__ __forceinline__ void pipe_row(int stage, int word0, const bf16 *src, i64 base, int lane, bool ok) {
#pragma unroll
    for (int k = 0; k < N; k++)
        if (in_row<P, N>(k, lane)) Pipe::load(stage, word0 + k, src + base + (lane + k * P) * VEC, ok);
}
template <class Pipe, int P, int N>
static __device__ __forceinline__ void piped_row(int stage, int word0, int lane, vec_t (&v)[N]) {
#pragma unroll
    for (int k = 0; k < N; k++)
        if (in_row<P, N>(k, lane)) v[k] = Pipe::template get<vec_t>(stage, word0 + k);
}

// fwd's row for thread `lane` of its TPR: out (and sum_out, rstd) stored, and s left holding out's values as stored
// (0 outside the row). A row past n computes on row n-1 (for the shuffles) and stores nothing. With COPY out may be
// NULL: only its copy is wanted (cp_step_fp8_out.copy_only).
template <bool COPY>
static __device__ __forceinline__ void fwd_one_row(const bf16 *__restrict__ x, const bf16 *__restrict__ resid,
                                                   bf16 *__restrict__ sum_out, const bf16 *__restrict__ weight,
                                                   bf16 *__restrict__ out, float *__restrict__ rstd, i64 n, i64 row,
                                                   int lane, float (&s)[NV][VEC]) {
    const bool valid = row < n;
    const i64 base = (valid ? row : n - 1) * HIDDEN;
    vec_t xv[NV], wv[NV];
    load_row<TPR, NV>(x, base, lane, xv);
    if (resid) {
        vec_t rv[NV];
        load_row<TPR, NV>(resid, base, lane, rv);
#pragma unroll
        for (int k = 0; k < NV; k++)
#pragma unroll
            for (int i = 0; i < VEC; i++)
                s[k][i] = in_row<TPR, NV>(k, lane) ? bf16_round(__bfloat162float(xv[k].h[i]) + __bfloat162float(rv[k].h[i])) : 0.f;
    } else {
#pragma unroll
        for (int k = 0; k < NV; k++)
#pragma unroll
            for (int i = 0; i < VEC; i++) s[k][i] = in_row<TPR, NV>(k, lane) ? __bfloat162float(xv[k].h[i]) : 0.f;
    }
    load_row<TPR, NV>(weight, 0, lane, wv);
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++)
#pragma unroll
        for (int i = 0; i < VEC; i++) ss = fmaf(s[k][i], s[k][i], ss);
    ss = row_sum<TPR>(ss);
    const float r = rsqrtf(ss / (float)HIDDEN + EPS);
    if (valid && lane == 0) rstd[row] = r;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const bool in = valid && in_row<TPR, NV>(k, lane);
        const i64 off = base + (lane + k * TPR) * VEC;
        if (!in) {
#pragma unroll
            for (int i = 0; i < VEC; i++) s[k][i] = 0.f;
            continue;
        }
        vec_t o;
#pragma unroll
        for (int i = 0; i < VEC; i++)
            o.h[i] = __float2bfloat16_rn(__bfloat162float(wv[k].h[i]) * bf16_round(s[k][i] * r));
        if (!COPY || out) *reinterpret_cast<vec_t *>(out + off) = o;
        if (resid) {
            vec_t so;
#pragma unroll
            for (int i = 0; i < VEC; i++) so.h[i] = __float2bfloat16_rn(s[k][i]); // exact: s is bf16-valued
            *reinterpret_cast<vec_t *>(sum_out + off) = so;
        }
#pragma unroll
        for (int i = 0; i < VEC; i++) s[k][i] = __bfloat162float(o.h[i]);
    }
}

// fwd's rows, and with COPY out's FP8 copy with 1 x 128 scales instead of its amax
template <bool COPY>
static __device__ __forceinline__ void fwd_rows(const bf16 *__restrict__ x, const bf16 *__restrict__ resid,
                                                bf16 *__restrict__ sum_out, const bf16 *__restrict__ weight,
                                                bf16 *__restrict__ out, float *__restrict__ rstd, i64 n,
                                                float *__restrict__ amax_slot, float fmax,
                                                unsigned char *__restrict__ copy, float *__restrict__ copy_scales) {
    const int lane = threadIdx.x % TPR;
    const i64 row = (i64)blockIdx.x * RPB + threadIdx.x / TPR;
    const bool valid = row < n;
    float f[NV][VEC];
    fwd_one_row<COPY>(x, resid, sum_out, weight, out, rstd, n, row, lane, f);
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
#pragma unroll
        for (int i = 0; i < VEC; i++) amax = fmaxf(amax, fabsf(f[k][i]));
        if (COPY) // every lane goes on to its block's shuffles
            fp8_block_store(f[k], valid && in_row<TPR, NV>(k, lane), fmax,
                            copy + (valid ? row : n - 1) * HIDDEN + (lane + k * TPR) * VEC,
                            copy_scales + (lane + k * TPR) / 16 * n + row);
    }
    if (!COPY) fp8_amax_commit(amax, amax_slot, fmax);
}

__global__ void __launch_bounds__(BLOCK, MIN_BLOCKS) rmsnorm_fwd_h{{HIDDEN}}_e{{EPS_TAG}}(
    const bf16 *__restrict__ x, const bf16 *__restrict__ resid, bf16 *__restrict__ sum_out,
    const bf16 *__restrict__ weight, bf16 *__restrict__ out, float *__restrict__ rstd, i64 n,
    float *__restrict__ amax_slot, float amax_fmax) {
    fwd_rows<false>(x, resid, sum_out, weight, out, rstd, n, amax_slot, amax_fmax, nullptr, nullptr);
}

__global__ void __launch_bounds__(BLOCK, MIN_BLOCKS) rmsnorm_fwd_copy_h{{HIDDEN}}_e{{EPS_TAG}}(
    const bf16 *__restrict__ x, const bf16 *__restrict__ resid, bf16 *__restrict__ sum_out,
    const bf16 *__restrict__ weight, bf16 *__restrict__ out, float *__restrict__ rstd, i64 n, float fmax,
    unsigned char *__restrict__ copy, float *__restrict__ copy_scales) {
#if COPY_OK
    fwd_rows<true>(x, resid, sum_out, weight, out, rstd, n, nullptr, fmax, copy, copy_scales);
#else
    __trap(); // the planner writes copies only where COPY_OK holds
#endif
}

__global__ void __launch_bounds__(BLOCK, MIN_BLOCKS_R) rmsnorm_fwd_row_h{{HIDDEN}}_e{{EPS_TAG}}(
    const bf16 *__restrict__ x, const bf16 *__restrict__ resid, bf16 *__restrict__ sum_out,
    const bf16 *__restrict__ weight, bf16 *__restrict__ out, float *__restrict__ rstd, i64 n, float fmax,
    unsigned char *__restrict__ copy, float *__restrict__ copy_scales, float *__restrict__ col_max, int col_max_rows) {
#if ROW_OK
    typedef row_pipe<ROW_STAGES, 2 * NV, BLOCK> pipe; // words: x's vectors, then resid's
    const int lane = threadIdx.x % TPR, sub = threadIdx.x / TPR;
    col_maxima<NV> cm;
    pipe::run((i64)blockIdx.x * RPB, (i64)gridDim.x * RPB, n,
        [&](int stage, i64 first) {
            const i64 row = first + sub, base = (row < n ? row : 0) * HIDDEN;
            pipe_row<pipe, TPR, NV>(stage, 0, x, base, lane, row < n);
            if (resid) pipe_row<pipe, TPR, NV>(stage, NV, resid, base, lane, row < n);
        },
        [&](int stage, i64 first) {
            // fwd_one_row's values, but read from the stage twice, for the sum of squares and again for the output,
            // so that nothing of the row is held across its reduction: the entry is bound by the latency of its
            // warps, more of which fit an SM with fewer registers
            const i64 row = first + sub;
            const bool valid = row < n;
            auto in = [&](int k, int i) { // the norm's input: x, or bf16(x + resid)
                const float xf = __bfloat162float(pipe::template get<vec_t>(stage, k).h[i]);
                return resid ? bf16_round(xf + __bfloat162float(pipe::template get<vec_t>(stage, NV + k).h[i])) : xf;
            };
            float ss = 0.f;
#pragma unroll
            for (int k = 0; k < NV; k++)
                if (in_row<TPR, NV>(k, lane))
#pragma unroll
                    for (int i = 0; i < VEC; i++) ss = fmaf(in(k, i), in(k, i), ss);
            const float r = rsqrtf(row_sum<TPR>(ss) / (float)HIDDEN + EPS);
            if (valid && lane == 0) rstd[row] = r;
            vec_t o[NV];
#pragma unroll
            for (int k = 0; k < NV; k++) {
                o[k] = vec_t{};
                if (!valid || !in_row<TPR, NV>(k, lane)) continue;
                const i64 off = row * HIDDEN + (lane + k * TPR) * VEC;
                const vec_t wv = *reinterpret_cast<const vec_t *>(weight + (lane + k * TPR) * VEC);
                vec_t so;
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    const float v = in(k, i);
                    o[k].h[i] = __float2bfloat16_rn(__bfloat162float(wv.h[i]) * bf16_round(v * r));
                    so.h[i] = __float2bfloat16_rn(v); // exact: v is bf16-valued
                }
                if (out) *reinterpret_cast<vec_t *>(out + off) = o[k]; // NULL: the copy alone
                if (resid) *reinterpret_cast<vec_t *>(sum_out + off) = so;
            }
            row_copy<TPR, NV>(o, row, n, lane, fmax, copy, copy_scales, cm);
        });
    col_max_add<TPR, NV>(cm, lane, col_max, col_max_rows);
#else
    __trap(); // the planner writes copies only where ROW_OK holds
#endif
}

// dx = rstd * (g - xhat * mean(g * xhat)) (+ dresid), g = dout * weight, xhat = x * rstd;
// dw_part[blockIdx.x] = this block's sum over its rows of dout * bf16(xhat) (the product HF's weight multiplies).
// bwd's rows, and instead of dx's amax (OUT) its FP8 copy with 1 x 128 scales (bwd_copy) or one scale per row and the
// column maxima (bwd_row); dout and dresid may be dx itself (qk-norm's backward runs in place): no __restrict__ on
// the three
enum { OUT_AMAX, OUT_BLOCK, OUT_ROW };
template <int OUT>
static __device__ __forceinline__ void bwd_rows(const bf16 *dout, const bf16 *__restrict__ x,
                                                const bf16 *__restrict__ weight, const float *__restrict__ rstd,
                                                const bf16 *dresid, bf16 *dx, float *__restrict__ dw_part, i64 n,
                                                float *__restrict__ amax_slot, float fmax,
                                                unsigned char *__restrict__ copy, float *__restrict__ copy_scales,
                                                float *__restrict__ col_max, int col_max_rows) {
    constexpr bool COPY = OUT != OUT_AMAX; // every lane goes on to its block's shuffles
    const int lane = threadIdx.x % TPR_B;
    const int sub = threadIdx.x / TPR_B;
    float dw[NV_B][VEC];
#pragma unroll
    for (int k = 0; k < NV_B; k++)
#pragma unroll
        for (int i = 0; i < VEC; i++) dw[k][i] = 0.f;
    float amax = 0.f;
    col_maxima<OUT == OUT_ROW ? NV_B : 1> cm;
    // a row from its vectors of dout, x, weight and dresid (dv, xv, wv, rv)
    auto one = [&](i64 row, const vec_t (&dv)[NV_B], const vec_t (&xv)[NV_B], const vec_t (&wv)[NV_B],
                   const vec_t (&rv)[NV_B]) {
        const bool valid = row < n;
        const i64 base = (valid ? row : n - 1) * HIDDEN;
        const float r = rstd[valid ? row : n - 1];
        float dot = 0.f;
#pragma unroll
        for (int k = 0; k < NV_B; k++)
            if (in_row<TPR_B, NV_B>(k, lane))
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    dot = fmaf(__bfloat162float(dv[k].h[i]) * __bfloat162float(wv[k].h[i]), __bfloat162float(xv[k].h[i]) * r, dot);
        dot = row_sum<TPR_B>(dot);
        const float mean = dot / (float)HIDDEN;
        if (!COPY && !valid) return;
        vec_t ov[OUT == OUT_ROW ? NV_B : 1]; // bwd_row's: the row's values, for its maximum
#pragma unroll
        for (int k = 0; k < NV_B; k++) {
            const bool in = valid && in_row<TPR_B, NV_B>(k, lane);
            if (!COPY && !in) continue;
            float f[VEC];
#pragma unroll
            for (int i = 0; i < VEC; i++) f[i] = 0.f;
            vec_t &o = ov[OUT == OUT_ROW ? k : 0];
            o = vec_t{};
            if (in) {
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    const float d = __bfloat162float(dv[k].h[i]);
                    const float xh = __bfloat162float(xv[k].h[i]) * r;
                    // the residual's add as an explicit fma: left to contraction, the entries rounded it apart
                    const float u = fmaf(-xh, mean, d * __bfloat162float(wv[k].h[i]));
                    const float v = dresid ? fmaf(r, u, __bfloat162float(rv[k].h[i])) : r * u;
                    o.h[i] = __float2bfloat16_rn(v);
                    f[i] = __bfloat162float(o.h[i]);
                    amax = fmaxf(amax, fabsf(f[i]));
                    dw[k][i] = fmaf(d, bf16_round(xh), dw[k][i]);
                }
                *reinterpret_cast<vec_t *>(dx + base + (lane + k * TPR_B) * VEC) = o;
            }
            if (OUT == OUT_BLOCK)
                fp8_block_store(f, in, fmax, copy + base + (lane + k * TPR_B) * VEC,
                                copy_scales + (lane + k * TPR_B) / 16 * n + row);
        }
        if constexpr (OUT == OUT_ROW) row_copy<TPR_B, NV_B>(ov, row, n, lane, fmax, copy, copy_scales, cm);
    };
    // every thread of the block runs the same number of iterations (the shuffles and barriers need that)
    const i64 first = (i64)blockIdx.x * RPB_B, step = (i64)gridDim.x * RPB_B;
    if constexpr (OUT == OUT_ROW) {
#if ROW_OK_B
        typedef row_pipe<ROW_STAGES_B, 3 * NV_B, BLOCK_B> pipe;
        pipe::run(first, step, n,
            [&](int stage, i64 f) {
                const i64 row = f + sub, base = (row < n ? row : 0) * HIDDEN;
                pipe_row<pipe, TPR_B, NV_B>(stage, 0, dout, base, lane, row < n);
                pipe_row<pipe, TPR_B, NV_B>(stage, NV_B, x, base, lane, row < n);
                if (dresid) pipe_row<pipe, TPR_B, NV_B>(stage, 2 * NV_B, dresid, base, lane, row < n);
            },
            [&](int stage, i64 f) {
                vec_t dv[NV_B], xv[NV_B], wv[NV_B], rv[NV_B];
                piped_row<pipe, TPR_B, NV_B>(stage, 0, lane, dv);
                piped_row<pipe, TPR_B, NV_B>(stage, NV_B, lane, xv);
                load_row<TPR_B, NV_B>(weight, 0, lane, wv);
                if (dresid) piped_row<pipe, TPR_B, NV_B>(stage, 2 * NV_B, lane, rv);
                one(f + sub, dv, xv, wv, rv);
            });
#endif
    } else {
        for (i64 f = first; f < n; f += step) {
            const i64 row = f + sub, base = (row < n ? row : n - 1) * HIDDEN;
            vec_t dv[NV_B], xv[NV_B], wv[NV_B], rv[NV_B];
#pragma unroll
            for (int k = 0; k < NV_B; k++)
                if (in_row<TPR_B, NV_B>(k, lane)) {
                    dv[k] = *reinterpret_cast<const vec_t *>(dout + base + (lane + k * TPR_B) * VEC);
                    xv[k] = *reinterpret_cast<const vec_t *>(x + base + (lane + k * TPR_B) * VEC);
                    wv[k] = *reinterpret_cast<const vec_t *>(weight + (lane + k * TPR_B) * VEC);
                }
            if (dresid) load_row<TPR_B, NV_B>(dresid, base, lane, rv);
            one(row, dv, xv, wv, rv);
        }
    }
    if (OUT == OUT_AMAX) fp8_amax_commit(amax, amax_slot, fmax);
    if constexpr (OUT == OUT_ROW) col_max_add<TPR_B, NV_B>(cm, lane, col_max, col_max_rows);
    float *part = dw_part + (i64)blockIdx.x * HIDDEN;
#if RPB_B > 1
    // several rows per block share columns: sum the RPB_B partials in shared memory first (HIDDEN <= 512 here), in
    // row order
    __shared__ float sdw[RPB_B][HIDDEN];
#pragma unroll
    for (int k = 0; k < NV_B; k++)
#pragma unroll
        for (int i = 0; i < VEC; i++)
            if (in_row<TPR_B, NV_B>(k, lane)) sdw[sub][(lane + k * TPR_B) * VEC + i] = dw[k][i];
    __syncthreads();
    for (int c = threadIdx.x; c < HIDDEN; c += BLOCK_B) {
        float t = 0.f;
#pragma unroll
        for (int j = 0; j < RPB_B; j++) t += sdw[j][c];
        part[c] = t;
    }
#else
#pragma unroll
    for (int k = 0; k < NV_B; k++) {
        if (!in_row<TPR_B, NV_B>(k, lane)) continue;
        float *p = part + (lane + k * TPR_B) * VEC;
#if VEC % 4 == 0
#pragma unroll
        for (int i = 0; i < VEC; i += 4)
            *reinterpret_cast<float4 *>(p + i) = make_float4(dw[k][i], dw[k][i + 1], dw[k][i + 2], dw[k][i + 3]);
#else
#pragma unroll
        for (int i = 0; i < VEC; i++) p[i] = dw[k][i];
#endif
    }
#endif
}

__global__ void __launch_bounds__(BLOCK_B, MIN_BLOCKS_B) rmsnorm_bwd_h{{HIDDEN}}_e{{EPS_TAG}}(
    const bf16 *dout, const bf16 *__restrict__ x, const bf16 *__restrict__ weight, const float *__restrict__ rstd,
    const bf16 *dresid, bf16 *dx, float *__restrict__ dw_part, i64 n, float *__restrict__ amax_slot, float amax_fmax) {
    bwd_rows<OUT_AMAX>(dout, x, weight, rstd, dresid, dx, dw_part, n, amax_slot, amax_fmax, nullptr, nullptr, nullptr,
                       1);
}

__global__ void __launch_bounds__(BLOCK_B, MIN_BLOCKS_B) rmsnorm_bwd_copy_h{{HIDDEN}}_e{{EPS_TAG}}(
    const bf16 *dout, const bf16 *__restrict__ x, const bf16 *__restrict__ weight, const float *__restrict__ rstd,
    const bf16 *dresid, bf16 *dx, float *__restrict__ dw_part, i64 n, float fmax, unsigned char *__restrict__ copy,
    float *__restrict__ copy_scales) {
#if COPY_OK_B
    bwd_rows<OUT_BLOCK>(dout, x, weight, rstd, dresid, dx, dw_part, n, nullptr, fmax, copy, copy_scales, nullptr, 1);
#else
    __trap(); // the planner writes copies only where COPY_OK_B holds
#endif
}

__global__ void __launch_bounds__(BLOCK_B, MIN_BLOCKS_B) rmsnorm_bwd_row_h{{HIDDEN}}_e{{EPS_TAG}}(
    const bf16 *dout, const bf16 *__restrict__ x, const bf16 *__restrict__ weight, const float *__restrict__ rstd,
    const bf16 *dresid, bf16 *dx, float *__restrict__ dw_part, i64 n, float fmax, unsigned char *__restrict__ copy,
    float *__restrict__ copy_scales, float *__restrict__ col_max, int col_max_rows) {
#if ROW_OK_B
    bwd_rows<OUT_ROW>(dout, x, weight, rstd, dresid, dx, dw_part, n, nullptr, fmax, copy, copy_scales, col_max,
                      col_max_rows);
#else
    __trap(); // the planner writes copies only where ROW_OK_B holds
#endif
}

template <int N> struct fvec;
template <> struct fvec<4> {
    typedef float4 T;
    static __device__ __forceinline__ void add(double (&a)[4], const float4 &v) { a[0] += v.x, a[1] += v.y, a[2] += v.z, a[3] += v.w; }
};
template <> struct fvec<1> {
    typedef float T;
    static __device__ __forceinline__ void add(double (&a)[1], const float &v) { a[0] += v; }
};

// dweight[c] = fp32(dweight[c] + sum over p of dw_part[p][c]), the parts summed in a fixed order.
__global__ void __launch_bounds__(DW_BLOCK) rmsnorm_bwd_dw_h{{HIDDEN}}_e{{EPS_TAG}}(
    const float *__restrict__ dw_part, int parts, float *__restrict__ dweight) {
    typedef fvec<DW_V> F;
    const int t = threadIdx.x % DW_TPC, g = threadIdx.x / DW_TPC;
    const int c = blockIdx.x * DW_COLS + t * DW_V;
    const bool ok = c < HIDDEN;
    double a[DW_V];
#pragma unroll
    for (int i = 0; i < DW_V; i++) a[i] = 0.0;
    if (ok) {
        const typename F::T *src = reinterpret_cast<const typename F::T *>(dw_part + c);
        constexpr int STRIDE = HIDDEN / DW_V; // one part row, in units of F::T
        int p = g;
        // four parts in flight per thread; each thread adds its parts in increasing order
        for (; p + 3 * DW_GROUPS < parts; p += 4 * DW_GROUPS) {
            typename F::T v0 = src[(i64)p * STRIDE], v1 = src[(i64)(p + DW_GROUPS) * STRIDE],
                          v2 = src[(i64)(p + 2 * DW_GROUPS) * STRIDE], v3 = src[(i64)(p + 3 * DW_GROUPS) * STRIDE];
            F::add(a, v0);
            F::add(a, v1);
            F::add(a, v2);
            F::add(a, v3);
        }
        for (; p < parts; p += DW_GROUPS) F::add(a, src[(i64)p * STRIDE]);
    }
    __shared__ double s[DW_GROUPS][DW_COLS];
#pragma unroll
    for (int i = 0; i < DW_V; i++) s[g][t * DW_V + i] = a[i];
    __syncthreads();
    if (threadIdx.x < DW_COLS) {
        const int col = blockIdx.x * DW_COLS + threadIdx.x;
        if (col < HIDDEN) {
            double sum = 0.0;
#pragma unroll 8
            for (int j = 0; j < DW_GROUPS; j++) sum += s[j][threadIdx.x];
            dweight[col] = (float)((double)dweight[col] + sum);
        }
    }
}
