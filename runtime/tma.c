/* tma.c: see tma.h. */
#include "tma.h"

#include <pthread.h>
#include <stdint.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cuda_check.h"
#include "util.h"

_Static_assert(sizeof(cp_tmap) == sizeof(CUtensorMap), "cp_tmap must be the driver's CUtensorMap");

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static pthread_once_t once = PTHREAD_ONCE_INIT;
static encode_tiled_fn encode_tiled;
static cudaError_t lookup_err;
static enum cudaDriverEntryPointQueryResult lookup_res;

static void lookup(void) {
    void *fn = NULL;
    lookup_err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &lookup_res);
    if (lookup_err == cudaSuccess && lookup_res == cudaDriverEntryPointSuccess) encode_tiled = (encode_tiled_fn)fn;
}

/* The driver's encoder, or -1 with a message saying the driver is too old */
static int encoder(char *err, int errlen) {
    pthread_once(&once, lookup);
    if (encode_tiled) return 0;
    if (lookup_err != cudaSuccess)
        return cp_cuda_errmsg(lookup_err, "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)", err, errlen);
    return cp_errf(err, errlen, "the NVIDIA driver has no cuTensorMapEncodeTiled (query result %d): the Hopper "
                   "kernels need a driver for CUDA 12.0 or newer; update the driver", (int)lookup_res);
}

int cp_tmap_heads(cp_tmap *m, const void *base, int elem_bytes, int64_t seq, int64_t heads, int64_t head_dim,
                  int box_rows, char *err, int errlen) {
    if (encoder(err, errlen)) return -1;
    const char *type = elem_bytes == 2 ? "bf16" : elem_bytes == 4 ? "f32" : "?";
    if ((elem_bytes != 2 && elem_bytes != 4) || (uintptr_t)base % 16 || head_dim * elem_bytes % 128 || seq < 1 ||
        heads < 1 || box_rows < 1 || box_rows > 256)
        return cp_errf(err, errlen, "tensor map of [%lld][%lld][%lld] %s at %p in boxes of %d rows: the elements must "
                       "be bf16 or f32, the address 16-byte aligned, a row a multiple of 128 bytes and the box 1..256 "
                       "rows", (long long)seq, (long long)heads, (long long)head_dim, type, base, box_rows);
    const cuuint64_t dims[3] = {(cuuint64_t)head_dim, (cuuint64_t)heads, (cuuint64_t)seq};
    const cuuint64_t strides[2] = {(cuuint64_t)(head_dim * elem_bytes), (cuuint64_t)(heads * head_dim * elem_bytes)};
    const cuuint32_t box[3] = {(cuuint32_t)(128 / elem_bytes), 1, (cuuint32_t)box_rows}, estride[3] = {1, 1, 1};
    CUresult r = encode_tiled((CUtensorMap *)m,
                              elem_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3,
                              (void *)base, dims, strides, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return cp_errf(err, errlen, "cuTensorMapEncodeTiled failed (CUresult %d) for [%lld][%lld][%lld] %s at %p, "
                       "boxes of %d rows: a bug in the caller's shape or alignment", (int)r, (long long)seq,
                       (long long)heads, (long long)head_dim, type, base, box_rows);
    return 0;
}

int cp_tmap_2d(cp_tmap *m, const void *base, int elem_bytes, int64_t rows, int64_t cols, int64_t pitch_bytes,
               int box_cols, int box_rows, int swizzle128, char *err, int errlen) {
    if (encoder(err, errlen)) return -1;
    if ((elem_bytes != 1 && elem_bytes != 4) || (uintptr_t)base % 16 || pitch_bytes % 16 || rows < 1 || cols < 1 ||
        pitch_bytes < cols * elem_bytes || box_cols < 1 || box_cols > 256 || box_rows < 1 || box_rows > 256 ||
        (swizzle128 && box_cols * elem_bytes != 128))
        return cp_errf(err, errlen, "tensor map of [%lld][%lld] elements of %d bytes at %p, rows %lld bytes apart, in "
                       "boxes of %d x %d%s: the elements must be of 1 or 4 bytes, the address and the pitch 16-byte "
                       "aligned, the box 1..256 each way (128 bytes a row with the swizzle)", (long long)rows,
                       (long long)cols, elem_bytes, base, (long long)pitch_bytes, box_cols, box_rows,
                       swizzle128 ? " with the 128-byte swizzle" : "");
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)pitch_bytes};
    const cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows}, estride[2] = {1, 1};
    CUresult r = encode_tiled((CUtensorMap *)m,
                              elem_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2,
                              (void *)base, dims, strides, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              swizzle128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return cp_errf(err, errlen, "cuTensorMapEncodeTiled failed (CUresult %d) for [%lld][%lld] elements of %d bytes "
                       "at %p, boxes of %d x %d: a bug in the caller's shape or alignment", (int)r, (long long)rows,
                       (long long)cols, elem_bytes, base, box_cols, box_rows);
    return 0;
}
