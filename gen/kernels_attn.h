/* kernels_attn.h: launch geometry and workspace of the attention module made by cp_k_attention (kernels.h).
 * Entries (templates/attention.cu; bf16 = uint16_t on the host):
 *   fwd(q, k, v, o, lse f32)
 *   bwd(q, k, v, dout, lse f32, delta f32, dq_ws f32, dk, dv): dq_ws [S][QH][D] fp32 is the dQ workspace, which the
 *       caller zeroes before bwd (cp_k_attention_workspace_bytes); bwd adds dS K into it. dk, dv are bf16 written,
 *       or fp32 added to (+=) when dkv_accum.
 *   bwd_dq(dq_ws f32, dq): dq = bf16(scale * dq_ws), the last step of the backward.
 * fwd and bwd use dynamic shared memory above 48 KiB: the loader must raise the entry's limit to d->smem. */
#ifndef CP_KERNELS_ATTN_H
#define CP_KERNELS_ATTN_H

#include "kernels.h"

/* Geometry of entry `role` ("fwd", "bwd", "bwd_dq") of an attention module. Returns 0, or -1 for another role or a
 * spec that is not attention. */
int cp_k_attention_dims(const cp_kernel_spec *k, const char *role, cp_kdims *d);

/* Bytes of the fp32 dQ workspace the backward needs: S * QH * D * 4. */
int64_t cp_k_attention_workspace_bytes(const cp_kernel_spec *k);

#endif
