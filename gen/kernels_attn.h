/* kernels_attn.h: launch geometry and workspace of the attention module made by cp_k_attention (kernels.h).
 * Entries (templates/attention.cu; bf16 = uint16_t on the host):
 *   fwd(q, k, v, o, lse f32): lse [QH] rows of S, LSE_STRIDE apart (S unless cp_k_attention_lse_stride)
 *   bwd(q, k, v, dout, lse f32, delta f32, dq_ws f32, dq_prog u32, dk, dv): dq_ws [S][QH][D] fp32 is the dQ
 *       workspace: dS K summed over the key blocks, ordered (bwd writes it whole, in key-block order: the same bits
 *       run to run) or, when dq_atomic, added into a dq_ws the caller zeroes before every bwd. dq_prog
 *       [KVH][ceil(S/128)] are the progress counters that order those sums, which the caller zeroes before every
 *       bwd. Both live in one workspace (cp_k_attention_workspace_bytes), dq_prog at cp_k_attention_prog_offset.
 *       dk, dv are bf16 written, or fp32 added to (+=) when dkv_accum.
 *   bwd_dq(dq_ws f32, dq): dq = bf16(scale * dq_ws), the last step of the backward.
 * With document masks (cp_k_attention_docs) fwd, bwd, fwd_sm90 and bwd_sm90 take four more arguments, last:
 * (const int *doc_start, const int *doc_end, int q_pos, int k_pos), the contract of templates/attention.cu; the
 * workspace and the caller's zeroing are the same (bwd still writes dq_ws whole).
 * fwd and bwd use dynamic shared memory above 48 KiB: the loader must raise the entry's limit to d->smem. */
#ifndef CP_KERNELS_ATTN_H
#define CP_KERNELS_ATTN_H

#include "kernels.h"

/* Whether the module compiled for `arch` runs the Hopper forward fwd_sm90 and backward bwd_sm90 (wgmma, TMA:
 * sm_90a) instead of fwd and bwd.
 * fwd_sm90(tm_q, tm_k, tm_v, o, lse f32) takes tensor maps of q, k, v made by cp_tmap_heads (runtime/tma.h) with
 * boxes of CP_ATTN_SM90_BOX_ROWS rows.
 * bwd_sm90(tm_q, tm_k, tm_v, tm_do, tm_dq, lse, delta, dq_prog, dk, dv): bwd's contract and workspace, with tensor
 * maps of q and dout (boxes of CP_ATTN_SM90_BWD_Q_ROWS rows), of k and v (CP_ATTN_SM90_BOX_ROWS rows) and of dq_ws
 * (fp32, boxes of CP_ATTN_SM90_BWD_Q_ROWS rows). */
bool cp_k_attention_hopper(const char *arch);
/* The rows of the boxes of fwd_sm90's tensor maps (its query and key tiles). */
#define CP_ATTN_SM90_BOX_ROWS 128
/* The rows of the boxes of bwd_sm90's q and dout tensor maps (its query tiles). */
#define CP_ATTN_SM90_BWD_Q_ROWS 64

/* Geometry of entry `role` ("fwd", "fwd_sm90", "bwd", "bwd_sm90", "bwd_dq") of an attention module. Returns 0, or
 * -1 for another role or a spec that is not attention. */
int cp_k_attention_dims(const cp_kernel_spec *k, const char *role, cp_kdims *d);

/* The variants of an attention module (kernels.h cp_kvariants, through cp_k_variants): the depths of fwd_sm90's K/V
 * ring (FWD_STAGES) that fit its shared memory, default 2 for head_dim 128 and 4 for 64. */
bool cp_k_attention_variants(const cp_kernel_spec *k, cp_kvariants *v);

/* The LSE rows of the module's kernels `stride` floats apart instead of SEQ (stride >= SEQ): a ring's half-block
 * launches, whose SEQ is half the group's tokens, read and write columns of the stage's LSE rows of the group's
 * tokens. cp_k_attention_lse_bytes: the bytes the LSE operand spans, from its first row's first column to its last
 * row's last: ((QH - 1) * stride + SEQ) * 4. */
void cp_k_attention_lse_stride(cp_kernel_spec *k, int64_t stride);
int64_t cp_k_attention_lse_bytes(const cp_kernel_spec *k);

/* The module's kernels with document masks (DOCS, templates/attention.cu: four more arguments, doc_start, doc_end,
 * q_pos, k_pos, and only the work within documents), or without (the default). */
void cp_k_attention_docs(cp_kernel_spec *k, bool docs);

/* Bytes of the backward's workspace: the fp32 dQ, S * QH * D * 4, then the progress counters (prog_bytes). */
int64_t cp_k_attention_workspace_bytes(const cp_kernel_spec *k);
/* Where the progress counters start in the workspace (S * QH * D * 4), and their bytes: KVH * ceil(S/128) * 4,
 * rounded up to 16. Only these bytes need zeroing before an ordered bwd; an atomic one needs the whole workspace
 * zeroed. */
int64_t cp_k_attention_prog_offset(const cp_kernel_spec *k);
int64_t cp_k_attention_prog_bytes(const cp_kernel_spec *k);

#endif
