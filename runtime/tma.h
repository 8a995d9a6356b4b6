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

/* A 2-D tensor [rows][cols] at base of elem_bytes-byte elements (1: FP8 bytes, 4: f32) with rows pitch_bytes apart, in
 * boxes of box_cols x box_rows; with swizzle128 the 128-byte swizzle (a box row must then be 128 bytes). Rows and
 * columns past the tensor's end read as zeros. base and pitch_bytes must be 16-byte aligned. Returns 0, or -1 with
 * a message in err. */
int cp_tmap_2d(cp_tmap *m, const void *base, int elem_bytes, int64_t rows, int64_t cols, int64_t pitch_bytes,
               int box_cols, int box_rows, int swizzle128, char *err, int errlen);

#endif
