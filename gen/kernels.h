/* kernels.h: one constructor per kernel family: which template, which compile-time values.
 * The planner calls these; the template files in templates/ define what each value means.
 * Layout conventions (row-major, bf16 unless stated):
 *   token layout  [T][heads][head_dim]   (a projection's output, T = tokens of this rank)
 *   head layout   [S][heads][head_dim]   (after the all-to-all, S = all tokens, heads = this rank's share)
 *   lse           [heads][S] fp32;  delta (rowsum dO*O) [S][heads] fp32 */
#ifndef CP_KERNELS_H
#define CP_KERNELS_H

#include "emit.h"
#include "spec.h"

/* embedding: fwd(tokens i32[n], table[V][H], out[n][H]); bwd(tokens, dout[n][H], dtable f32[V][H] +=). */
void cp_k_embedding(cp_kernel_spec *k, int64_t vocab, int64_t hidden);
/* rmsnorm over rows of HIDDEN: fwd(x, resid|NULL, sum_out|NULL, weight, out, rstd f32[n], n): if resid, x+resid is
 * normalised and written to sum_out. bwd(dout, x, weight, rstd, dresid|NULL, dx, dweight f32 +=, n): dx = dnorm (+ dresid). */
void cp_k_rmsnorm(cp_kernel_spec *k, int64_t hidden, double eps);
/* rope in place on [n][heads][D] with positions pos0 + row: fwd(x, n, heads, pos0); bwd(dx, n, heads, pos0). */
void cp_k_rope(cp_kernel_spec *k, const cp_model *m);
/* swiglu on a tile: fwd(gate[n][F], up[n][F], out[n][F], n); bwd(dout, gate, up, n): gate,up <- dgate,dup in place. */
void cp_k_swiglu(cp_kernel_spec *k, int64_t ffn);
/* loss on a tile of logits [n][V] (bf16, in place -> dlogits*scale): fwdbwd(logits, targets i32[n] (-1 ignored),
 * loss_sum f32[1] +=, scale, n). */
void cp_k_loss(cp_kernel_spec *k, int64_t vocab);
/* adamw: update(master f32, m, v, grad f32, param bf16 out, n, lr, beta1, beta2, eps, wd, grad_scale, step);
 * sumsq(grad f32, n, out f32[1] +=). */
void cp_k_adamw(cp_kernel_spec *k);
/* Ulysses layout for one stage. C ranks; each destination rank r gets NOUT heads, head (r / R) * NOUT + j of the
 * source [T][NIN = C/R*NOUT][ROW_BYTES]; R > 1 replicates heads over R ranks (KV heads < GPUs).
 * pack(src, src_row_stride_bytes, dst[C][T][NOUT][ROW_BYTES]);
 * unpack(src[C][T][NOUT][ROW_BYTES], dst, dst_row_stride_bytes) (R must be 1);
 * unpack_add(src, dst, dst_row_stride_bytes): dst += sum over replicas (bf16 rows of ROW_BYTES/2 elements). */
void cp_k_ulysses(cp_kernel_spec *k, int gpus, int repl, int64_t tokens, int nout, int64_t row_bytes);
/* attention on head layout: q[S][QH][D], k,v[S][KVH][D], o[S][QH][D], lse[QH][S]; query head j uses KV head j/(QH/KVH).
 * fwd(q, k, v, o, lse); bwd(q, k, v, dout, lse, delta[S][QH], dq, dk, dv): dq bf16 is written; dk, dv are bf16
 * written when dkv_accum is false, else f32 [S][KVH][D] accumulated (+=) over the stages of a GQA group. */
void cp_k_attention(cp_kernel_spec *k, int64_t head_dim, int q_heads, int kv_heads, int64_t seq, bool causal,
                    bool dkv_accum);
/* cast: f32_to_bf16(src f32, dst bf16, n). */
void cp_k_cast(cp_kernel_spec *k);
/* delta for the attention backward in token layout: fwd(dout[n][heads][D], out[n][heads][D], delta f32[n][heads], n, heads). */
void cp_k_attn_delta(cp_kernel_spec *k, int64_t head_dim);

#endif
