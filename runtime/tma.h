/* tma.h: tensor maps for the bulk tensor copies (TMA) of the Hopper kernels. The driver encodes them
 * (cuTensorMapEncodeTiled, reached through the CUDA runtime's driver entry point, so cpgen links no libcuda); a
 * kernel takes one by value as a __grid_constant__ parameter. */
#ifndef CP_TMA_H
#define CP_TMA_H

#include <stdint.h>

/* The driver's CUtensorMap: 128 opaque bytes, 64-byte aligned. */
typedef struct {
    _Alignas(64) uint64_t opaque[16];
} cp_tmap;

/* A head-layout tensor [seq][heads][head_dim] at base, of bf16 (elem_bytes 2) or fp32 (4), as the 3-D tensor
 * (head_dim, heads, seq), in boxes of (128 / elem_bytes, 1, box_rows) with the 128-byte swizzle: one head's
 * box_rows rows of 128 bytes (rows past seq read as zeros, and are not written). base must be 16-byte aligned and
 * a row of head_dim a multiple of 128 bytes. Returns 0, or -1 with a message in err. */
int cp_tmap_heads(cp_tmap *m, const void *base, int elem_bytes, int64_t seq, int64_t heads, int64_t head_dim,
                  int box_rows, char *err, int errlen);

#endif
