// head_rows.cuh: what the kernels over (token, head) rows of D bf16 values share (attn_delta.cu, attn_merge.cu;
// their parameters come from head_row_params in gen/kernels.c): TPR threads per row (a power of two up to 32), NV
// vectors of VEC values each per thread; a block of BLOCK threads covers BLOCK / TPR rows.
#include <cuda_bf16.h>

typedef long long i64;
typedef __nv_bfloat16 bf16;

#define D {{D}}
#define VEC {{VEC}}
#define TPR {{TPR}}
#define NV {{NV}}
#define BLOCK {{BLOCK}}
#define NVEC (D / VEC)

static_assert(D % VEC == 0 && 32 % TPR == 0 && BLOCK % 32 == 0, "shape");
static_assert(NV * TPR >= NVEC && (NV - 1) * TPR < NVEC, "NV vectors per thread cover the row");

template <int N> struct __align__(2 * N) bvec { bf16 h[N]; };
template <int N> struct __align__(4 * N) fvec { float f[N]; };
typedef bvec<VEC> bvec_t;
typedef fvec<VEC> fvec_t;

// The (token, head) row of this thread.
__device__ __forceinline__ i64 thread_row() { return ((i64)blockIdx.x * BLOCK + threadIdx.x) / TPR; }
// True when vector k of this lane lies in the row (the last lanes may have one vector fewer).
#define IN_ROW(k) (NV * TPR == NVEC || lane + (k) * TPR < NVEC)
