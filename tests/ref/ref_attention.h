/* ref_attention.h: plain float64 reference of (causal or full) grouped-query attention, forward and backward,
 * on the head layout of gen/kernels.h: q[S][QH][D], k,v[S][KVH][D], o[S][QH][D], lse[QH][S] (natural log).
 * Query head h uses KV head h / (QH / KVH). */
#ifndef REF_ATTENTION_H
#define REF_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    int64_t seq;       /* S */
    int q_heads;       /* QH */
    int kv_heads;      /* KVH, divides QH */
    int64_t head_dim;  /* D */
    bool causal;       /* query i sees keys 0..i */
    double scale;      /* softmax scale, 1/sqrt(D) in cpgen */
} ref_attn_shape;

/* Forward for query heads [h0, h1) and query rows [r0, r1): writes those rows of o and lse. */
void ref_attention_fwd(const ref_attn_shape *sh, const double *q, const double *k, const double *v, double *o,
                       double *lse, int h0, int h1, int64_t r0, int64_t r1);

/* Backward of o for the same ranges, given dout: writes those rows of dq and ADDS their contribution to dk and dv
 * (so ranges can be split over threads with private dk, dv that are summed afterwards). Recomputes the softmax
 * from q and k; needs neither o nor lse. */
void ref_attention_bwd(const ref_attn_shape *sh, const double *q, const double *k, const double *v,
                       const double *dout, double *dq, double *dk, double *dv, int h0, int h1, int64_t r0,
                       int64_t r1);

#endif
