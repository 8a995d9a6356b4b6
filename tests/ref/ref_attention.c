/* ref_attention.c: float64 reference attention (see ref_attention.h). One query row at a time, straight from the
 * definitions: s = scale * q k^T, p = softmax(s) over the kept keys, o = p v; backward
 * dp = dout v^T, ds = p * (dp - sum(p * dp)), dq = scale * ds k, dk += scale * ds^T q, dv += p^T dout. */
#include "ref_attention.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* The keys that query row i keeps, [*lo, *hi) (empty when *lo >= *hi): the causal rule bounds them above, the
 * query's document below, so they are one run. The document's end must say the same as its start (the two arrays
 * describe one partition): the first kept key is in the row's document and the key before it is not. */
static void kept_keys(const ref_attn_shape *sh, int64_t i, int64_t *lo, int64_t *hi) {
    *hi = sh->causal ? i + 1 : sh->seq;
    *lo = 0;
    if (!sh->doc_start) return;
    const int64_t qp = sh->q_pos + i, first = sh->doc_start[qp] - sh->k_pos;
    if (first > 0) *lo = first;
    const bool in_doc = *lo < *hi && *lo < sh->seq && qp < sh->doc_end[sh->k_pos + *lo];
    const bool before_out = *lo == 0 || *lo - 1 >= *hi || qp >= sh->doc_end[sh->k_pos + *lo - 1];
    if (sh->doc_start[qp] > qp || (*lo < *hi && !in_doc) || !before_out) {
        fprintf(stderr, "ref_attention: doc_start and doc_end disagree at position %lld\n", (long long)qp);
        abort();
    }
}

/* Softmax probabilities of query row i of head h over keys [lo, hi) into p[lo..hi); returns the log-sum-exp of the
 * scaled scores (natural log), -inf when there is no key. */
static double row_softmax(const ref_attn_shape *sh, const double *q, const double *k, int h, int64_t i, int64_t lo,
                          int64_t hi, double *p) {
    const int64_t D = sh->head_dim;
    const int kvh = h / (sh->q_heads / sh->kv_heads);
    const double *qi = q + (i * sh->q_heads + h) * D;
    double mx = -INFINITY;
    for (int64_t j = lo; j < hi; j++) {
        const double *kj = k + (j * sh->kv_heads + kvh) * D;
        double s = 0;
        for (int64_t d = 0; d < D; d++) s += qi[d] * kj[d];
        p[j] = s * sh->scale;
        if (p[j] > mx) mx = p[j];
    }
    if (lo >= hi) return -INFINITY;
    double sum = 0;
    for (int64_t j = lo; j < hi; j++) {
        p[j] = exp(p[j] - mx);
        sum += p[j];
    }
    for (int64_t j = lo; j < hi; j++) p[j] /= sum;
    return mx + log(sum);
}

void ref_attention_fwd(const ref_attn_shape *sh, const double *q, const double *k, const double *v, double *o,
                       double *lse, int h0, int h1, int64_t r0, int64_t r1) {
    const int64_t D = sh->head_dim;
    double *p = malloc(sizeof(double) * (size_t)sh->seq);
    if (!p) abort();
    for (int h = h0; h < h1; h++) {
        const int kvh = h / (sh->q_heads / sh->kv_heads);
        for (int64_t i = r0; i < r1; i++) {
            int64_t lo, hi;
            kept_keys(sh, i, &lo, &hi);
            lse[(int64_t)h * sh->seq + i] = row_softmax(sh, q, k, h, i, lo, hi, p);
            double *oi = o + (i * sh->q_heads + h) * D;
            for (int64_t d = 0; d < D; d++) oi[d] = 0;
            for (int64_t j = lo; j < hi; j++) {
                const double *vj = v + (j * sh->kv_heads + kvh) * D;
                for (int64_t d = 0; d < D; d++) oi[d] += p[j] * vj[d];
            }
        }
    }
    free(p);
}

void ref_attention_bwd(const ref_attn_shape *sh, const double *q, const double *k, const double *v,
                       const double *dout, double *dq, double *dk, double *dv, int h0, int h1, int64_t r0,
                       int64_t r1) {
    const int64_t D = sh->head_dim;
    double *p = malloc(sizeof(double) * (size_t)sh->seq);
    double *ds = malloc(sizeof(double) * (size_t)sh->seq);
    if (!p || !ds) abort();
    for (int h = h0; h < h1; h++) {
        const int kvh = h / (sh->q_heads / sh->kv_heads);
        for (int64_t i = r0; i < r1; i++) {
            int64_t lo, hi;
            kept_keys(sh, i, &lo, &hi);
            row_softmax(sh, q, k, h, i, lo, hi, p);
            const double *qi = q + (i * sh->q_heads + h) * D;
            const double *doi = dout + (i * sh->q_heads + h) * D;
            /* ds holds dp first; rowdot = sum_j p_j dp_j (equals rowsum(dout * o)) */
            double rowdot = 0;
            for (int64_t j = lo; j < hi; j++) {
                const double *vj = v + (j * sh->kv_heads + kvh) * D;
                double s = 0;
                for (int64_t d = 0; d < D; d++) s += doi[d] * vj[d];
                ds[j] = s;
                rowdot += p[j] * s;
            }
            double *dqi = dq + (i * sh->q_heads + h) * D;
            for (int64_t d = 0; d < D; d++) dqi[d] = 0;
            for (int64_t j = lo; j < hi; j++) {
                ds[j] = p[j] * (ds[j] - rowdot);
                const double *kj = k + (j * sh->kv_heads + kvh) * D;
                double *dkj = dk + (j * sh->kv_heads + kvh) * D;
                double *dvj = dv + (j * sh->kv_heads + kvh) * D;
                for (int64_t d = 0; d < D; d++) {
                    dqi[d] += sh->scale * ds[j] * kj[d];
                    dkj[d] += sh->scale * ds[j] * qi[d];
                    dvj[d] += p[j] * doi[d];
                }
            }
        }
    }
    free(ds);
    free(p);
}
