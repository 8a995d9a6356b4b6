/* ref_attention.h: plain float64 reference of (causal or full) grouped-query attention, forward and backward,
 * on the head layout of gen/kernels.h: q[S][QH][D], k,v[S][KVH][D], o[S][QH][D], lse[QH][S] (natural log).
 * Query head h uses KV head h / (QH / KVH). With document masks it follows the contract of templates/attention.cu
 * ("Document masks"): the S query rows lie at positions q_pos.., the S key rows at k_pos.. of a longer sequence. */
#ifndef REF_ATTENTION_H
#define REF_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    int64_t seq;       /* S */
    int q_heads;       /* QH */
    int kv_heads;      /* KVH, divides QH */
    int64_t head_dim;  /* D */
    bool causal;       /* query i sees keys 0..i (rows and keys of the launch compared, whatever their positions) */
    double scale;      /* softmax scale, 1/sqrt(D) in cpgen */
    /* Document masks, or NULL (no documents: q_pos, k_pos unused). doc_start[i] <= i is where the document holding
     * position i starts, doc_end[i] > i one past its last position, over the whole sequence; query row r is at
     * q_pos + r, key row c at k_pos + c. Score (r, c) is kept when the causal rule keeps it and
     * k_pos + c >= doc_start[q_pos + r]. A row that keeps no key has o = 0, lse = -inf and no gradient. */
    const int *doc_start, *doc_end;
    int64_t q_pos, k_pos;
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
