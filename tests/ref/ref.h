/* ref.h: plain C references of every kernel family in gen/kernels.h, for the tests to compare the GPU with.
 * Each reads and writes the same storage types as its kernel (bf16 as uint16_t, fp32 as float) and computes in
 * double, straight from the definitions, reproducing the bf16 roundings of intermediates that the kernels (and
 * Hugging Face) make. Arguments follow the kernels' (gen/kernels.h), plus the compile-time shapes.
 * Attention's references are in ref_attention.h (float64 in and out). */
#ifndef REF_H
#define REF_H

#include <stdbool.h>
#include <stdint.h>

#include "bf16.h"
#include "ref_attention.h"

/* out[i] = table[tokens[i]]; a token outside [0, vocab) gives a NaN row. */
void ref_embedding_fwd(const int32_t *tokens, int64_t n, const uint16_t *table, int64_t vocab, int64_t hidden,
                       uint16_t *out);
/* dtable[tokens[i]] += dout[i] (fp32); tokens outside [0, vocab) are skipped. */
void ref_embedding_bwd(const int32_t *tokens, int64_t n, const uint16_t *dout, int64_t vocab, int64_t hidden,
                       float *dtable);

/* s = x or bf16(x + resid) (then written to sum_out); rstd = 1/sqrt(mean(s^2) + eps);
 * out = bf16(weight * bf16(s * rstd)). resid and sum_out may be NULL. */
void ref_rmsnorm_fwd(const uint16_t *x, const uint16_t *resid, uint16_t *sum_out, const uint16_t *weight,
                     uint16_t *out, float *rstd, int64_t n, int64_t hidden, double eps);
/* dx = rstd * (g - xhat * mean(g * xhat)) (+ dresid), g = dout * weight, xhat = x * rstd;
 * dweight += sum over rows of dout * bf16(xhat). dresid may be NULL. */
void ref_rmsnorm_bwd(const uint16_t *dout, const uint16_t *x, const uint16_t *weight, const float *rstd,
                     const uint16_t *dresid, uint16_t *dx, float *dweight, int64_t n, int64_t hidden);

/* Llama-3 frequency scaling parameters (enabled = false: plain theta^(-2i/D)). */
typedef struct {
    bool enabled;
    double factor, low_freq, high_freq, original_max;
} ref_rope_scaling;
/* inv_freq[i], i < head_dim/2, as Hugging Face's default and llama3 rope initialisation, in double. */
void ref_rope_inv_freq(int64_t head_dim, double theta, const ref_rope_scaling *s, double *inv_freq);
/* In place on x[n][heads][head_dim], row r at position pos0 + r, pairs (i, i + D/2) rotated by pos * inv_freq[i]
 * (backward: by minus that angle). */
void ref_rope(uint16_t *x, int64_t n, int64_t heads, int64_t head_dim, int64_t pos0, const double *inv_freq,
              bool backward);

/* out = bf16(bf16(silu(gate)) * up) over count elements. */
void ref_swiglu_fwd(const uint16_t *gate, const uint16_t *up, uint16_t *out, int64_t count);
/* gate <- dout * up * silu'(gate), up <- dout * bf16(silu(gate)). */
void ref_swiglu_bwd(const uint16_t *dout, uint16_t *gate, uint16_t *up, int64_t count);

/* Returns the sum over rows with target >= 0 of logsumexp(row) - row[target] (NaN if a target >= vocab) and
 * writes (softmax - onehot) * scale over each row in place (zero rows for target < 0). */
double ref_loss(uint16_t *logits, const int32_t *targets, int64_t n, int64_t vocab, double scale);

/* PyTorch AdamW step on n elements (see gen/kernels.h), in double, results stored as float / bf16. */
void ref_adamw(float *master, float *m, float *v, const float *grad, uint16_t *param, int64_t n, double lr,
               double beta1, double beta2, double eps, double wd, double grad_scale, int step);
/* Sum of grad[i]^2 in double. */
double ref_sumsq(const float *grad, int64_t n);

/* Ulysses layouts, byte rows (see gen/kernels.h): C ranks, R replicas, T tokens, nout heads per rank. */
void ref_ulysses_pack(const void *src, int64_t src_stride, void *dst, int C, int R, int64_t T, int nout,
                      int64_t row_bytes);
void ref_ulysses_unpack(const void *src, void *dst, int64_t dst_stride, int C, int64_t T, int nout,
                        int64_t row_bytes);
/* dst (bf16 rows) += sum over the R replicas, summed in double, rounded once. */
void ref_ulysses_unpack_add(const void *src, void *dst, int64_t dst_stride, int C, int R, int64_t T, int nout,
                            int64_t row_bytes);

void ref_cast_f32_to_bf16(const float *src, uint16_t *dst, int64_t n);

/* FP8 (OCP, as Hopper reads it): E4M3 has 4 exponent bits (bias 7), 3 mantissa bits and no infinities (S.1111.111 is
 * NaN, 448 the largest); E5M2 has 5 (bias 15) and 2, IEEE-like (57344 the largest finite). The value of byte b, and
 * the byte nearest to v (ties to the even byte), saturated to the largest finite value; NaN gives NaN. */
double ref_fp8_value(uint8_t b, bool e5m2);
uint8_t ref_fp8_of(float v, bool e5m2);
/* The fp8 module's amax and cast (templates/fp8.cu) of src [rows][cols] (row stride ld): slot = {amax / fmax,
 * fmax / amax, amax} in float (1, 1, 0 for amax 0); dst[rows][cols], or dst[cols][rows] when transposed, each
 * element fp8(x * q) for the quant scale q given (the kernel's own slot[1], so that a byte compares exactly). */
void ref_fp8_amax(const uint16_t *src, int64_t rows, int64_t cols, int64_t ld, bool e5m2, float slot[3]);
void ref_fp8_cast(const uint16_t *src, int64_t rows, int64_t cols, int64_t ld, bool e5m2, bool transpose, float q,
                  uint8_t *dst);
/* The fp8 module's block-scaled casts (train.fp8_scaling = "block") of src [rows][cols] (row stride ld): each
 * block's multiplier q is the largest power of two with amax * q <= fmax (amax the block's largest |x| in float, fmax
 * 448 or 57344), 1 when amax is 0, at most 2^126 (0 for an infinite amax); each element fp8(x * q) (x * q in float,
 * then ref_fp8_of); the block's scale 1 / q. The blocks and where their scales go, ld4(x) = ceil(x / 128) rounded up
 * to a multiple of 4:
 *   !tiles, !transpose: 1 x 128 (cols a multiple of 128), dst [rows][cols], scales[(c / 128) * rows + r];
 *   !tiles, transpose: 128 x 1 of the source (rows a multiple of 128), dst [cols][rows] (dst[c][r] = fp8(src[r][c]
 *     * q)), scales[(r / 128) * cols + c];
 *   tiles: 128 x 128 (partial at the edges), dst [rows][cols] and scales[(r / 128) * ld4(cols) + c / 128], or when
 *     transposed dst [cols][rows] and scales[(c / 128) * ld4(rows) + r / 128] (the same q per tile).
 * The tiles' padding entries (column blocks beyond ceil(cols / 128), of rows when transposed) are left as they were. */
void ref_fp8_cast_block(const uint16_t *src, int64_t rows, int64_t cols, int64_t ld, bool e5m2, bool transpose,
                        bool tiles, uint8_t *dst, float *scales);
/* The fp8 module's row-scaled casts (train.fp8_scaling = "row"): ref_fp8_cast_block's rule with a whole row as the
 * block, dst [rows][cols] and scales[r]; or, transposed, a whole source column, dst [cols][rows] (dst[c][r] =
 * fp8(src[r][c] * q_c)) and scales[c]. */
void ref_fp8_cast_row(const uint16_t *src, int64_t rows, int64_t cols, int64_t ld, bool e5m2, bool transpose,
                      uint8_t *dst, float *scales);

/* delta[r][h] = sum over d of dout[r][h][d] * out[r][h][d]. */
void ref_attn_delta(const uint16_t *dout, const uint16_t *out, float *delta, int64_t n, int64_t heads,
                    int64_t head_dim);

/* The LSE merge of ring attention (attn_merge): lse = log(exp(lse_acc) + exp(lse_blk)), o_acc = exp(lse_acc - lse)
 * o_acc + exp(lse_blk - lse) o_blk, lse_acc = lse, in double; rows with both -inf are left as they are. lse rows are
 * [heads][lse_stride]. */
void ref_attn_merge(const uint16_t *o_blk, const float *lse_blk, float *o_acc, float *lse_acc, int64_t n,
                    int64_t heads, int64_t head_dim, int64_t lse_stride);

#endif
