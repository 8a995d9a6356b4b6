// module: ulysses_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}
// Ulysses all-to-all layouts for one stage (arguments: gen/kernels.h). C ranks, T tokens per rank, rows of
// ROW_BYTES bytes (one head of one token). Destination rank r gets NOUT heads: head (r / R) * NOUT + j, j < NOUT,
// of the source's NIN = C / R * NOUT heads.
//   pack:       dst[r][t][j] = src[t][(r / R) * NOUT + j]                 (src rows src_stride bytes apart)
//   unpack:     dst[t][r * NOUT + j] = src[r][t][j]                       (R = 1)
//   unpack_add: dst[t][k * NOUT + j] += sum over i < R of src[k * R + i][t][j]   (bf16, fp32 sum, one rounding)
// Work is counted in UNIT-byte pieces (16 bytes when ROW_BYTES % 16 == 0, else 4); each thread moves UNROLL of
// them per iteration, loads first. All divisions are by compile-time constants.
#include <cuda_bf16.h>

typedef long long i64;
typedef __nv_bfloat16 bf16;
typedef {{IDX}} idx_t;

#define C {{C}}
#define R {{R}}
#define T {{T}}
#define NOUT {{NOUT}}
#define ROW_BYTES {{ROW_BYTES}}
#define UNIT {{UNIT}}
#define BLOCK {{BLOCK}}
#define UNROLL {{UNROLL}}
#define IN ((idx_t)NOUT * (ROW_BYTES / UNIT)) // units of one token's heads for one destination
#define TOTAL ((idx_t)C * T * IN)             // units of pack and unpack
#define TOTAL_ADD ((idx_t)(C / R) * T * IN)   // units of unpack_add

static_assert(C % R == 0 && ROW_BYTES % UNIT == 0 && (UNIT == 16 || UNIT == 4), "layout");

template <int N> struct word;
template <> struct word<16> { typedef uint4 T_; };
template <> struct word<4> { typedef unsigned int T_; };
typedef word<UNIT>::T_ unit_t;
union bunit {
    unit_t w;
    __nv_bfloat162 h[UNIT / 4];
};

extern "C" __global__ void ulysses_pack_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(const char *src, i64 src_stride, char *dst);
extern "C" __global__ void ulysses_unpack_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(const char *src, char *dst, i64 dst_stride);
extern "C" __global__ void ulysses_unpack_add_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(const char *src, char *dst, i64 dst_stride);

__global__ void __launch_bounds__(BLOCK) ulysses_pack_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(
    const char *__restrict__ src, i64 src_stride, char *__restrict__ dst) {
    unit_t *out = reinterpret_cast<unit_t *>(dst);
    for (idx_t base = (idx_t)blockIdx.x * (BLOCK * UNROLL); base < TOTAL; base += (idx_t)gridDim.x * (BLOCK * UNROLL)) {
        unit_t v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const idx_t i = base + u * BLOCK + threadIdx.x;
            if (i >= TOTAL) continue;
            const idx_t inner = i % IN, x = i / IN, t = x % T, r = x / T;
            v[u] = *reinterpret_cast<const unit_t *>(src + (i64)t * src_stride + (i64)(r / R) * (NOUT * ROW_BYTES) +
                                                     (i64)inner * UNIT);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const idx_t i = base + u * BLOCK + threadIdx.x;
            if (i < TOTAL) out[i] = v[u];
        }
    }
}

__global__ void __launch_bounds__(BLOCK) ulysses_unpack_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(
    const char *__restrict__ src, char *__restrict__ dst, i64 dst_stride) {
    if (R != 1) __trap(); // replicated heads come back through unpack_add
    const unit_t *in = reinterpret_cast<const unit_t *>(src);
    for (idx_t base = (idx_t)blockIdx.x * (BLOCK * UNROLL); base < TOTAL; base += (idx_t)gridDim.x * (BLOCK * UNROLL)) {
        unit_t v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const idx_t i = base + u * BLOCK + threadIdx.x;
            if (i < TOTAL) v[u] = in[i];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const idx_t i = base + u * BLOCK + threadIdx.x;
            if (i >= TOTAL) continue;
            const idx_t inner = i % IN, x = i / IN, t = x % T, r = x / T;
            *reinterpret_cast<unit_t *>(dst + (i64)t * dst_stride + (i64)r * (NOUT * ROW_BYTES) + (i64)inner * UNIT) = v[u];
        }
    }
}

__global__ void __launch_bounds__(BLOCK) ulysses_unpack_add_c{{C}}_r{{R}}_t{{T}}_n{{NOUT}}_b{{ROW_BYTES}}(
    const char *__restrict__ src, char *__restrict__ dst, i64 dst_stride) {
    const unit_t *in = reinterpret_cast<const unit_t *>(src);
    for (idx_t base = (idx_t)blockIdx.x * (BLOCK * UNROLL); base < TOTAL_ADD; base += (idx_t)gridDim.x * (BLOCK * UNROLL)) {
        bunit acc[UNROLL], s[UNROLL][R];
        unit_t *d[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const idx_t i = base + u * BLOCK + threadIdx.x;
            d[u] = nullptr;
            if (i >= TOTAL_ADD) continue;
            const idx_t inner = i % IN, x = i / IN, t = x % T, k = x / T;
            d[u] = reinterpret_cast<unit_t *>(dst + (i64)t * dst_stride + (i64)k * (NOUT * ROW_BYTES) + (i64)inner * UNIT);
            acc[u].w = *d[u];
#pragma unroll
            for (int j = 0; j < R; j++) s[u][j].w = in[((idx_t)(k * R + j) * T + t) * IN + inner];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            if (!d[u]) continue;
#pragma unroll
            for (int e = 0; e < UNIT / 4; e++) {
                float2 a = __bfloat1622float2(acc[u].h[e]);
#pragma unroll
                for (int j = 0; j < R; j++) {
                    const float2 b = __bfloat1622float2(s[u][j].h[e]);
                    a.x += b.x;
                    a.y += b.y;
                }
                acc[u].h[e] = __floats2bfloat162_rn(a.x, a.y);
            }
            *d[u] = acc[u].w;
        }
    }
}
