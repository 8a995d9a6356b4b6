/* ref_attention.c: float64 reference attention (see ref_attention.h). One query row at a time, straight from the
 * definitions: s = scale * q k^T, p = softmax(s) over the visible keys, o = p v; backward
 * dp = dout v^T, ds = p * (dp - sum(p * dp)), dq = scale * ds k, dk += scale * ds^T q, dv += p^T dout. */
#include "ref_attention.h"

#include <math.h>
#include <stdlib.h>

/* Softmax probabilities of query row i of head h over keys 0..n-1 into p; returns the log-sum-exp of the scaled
 * scores (natural log). */
static double row_softmax(const ref_attn_shape *sh, const double *q, const double *k, int h, int64_t i, int64_t n,
                          double *p) {
    const int64_t D = sh->head_dim;
    const int kvh = h / (sh->q_heads / sh->kv_heads);
    const double *qi = q + (i * sh->q_heads + h) * D;
    double mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        const double *kj = k + (j * sh->kv_heads + kvh) * D;
        double s = 0;
        for (int64_t d = 0; d < D; d++) s += qi[d] * kj[d];
        p[j] = s * sh->scale;
        if (p[j] > mx) mx = p[j];
    }
    double sum = 0;
    for (int64_t j = 0; j < n; j++) {
        p[j] = exp(p[j] - mx);
        sum += p[j];
    }
    for (int64_t j = 0; j < n; j++) p[j] /= sum;
    return mx + log(sum);
}

static int64_t visible_keys(const ref_attn_shape *sh, int64_t i) { return sh->causal ? i + 1 : sh->seq; }

void ref_attention_fwd(const ref_attn_shape *sh, const double *q, const double *k, const double *v, double *o,
                       double *lse, int h0, int h1, int64_t r0, int64_t r1) {
    const int64_t D = sh->head_dim;
    double *p = malloc(sizeof(double) * (size_t)sh->seq);
    if (!p) abort();
    for (int h = h0; h < h1; h++) {
        const int kvh = h / (sh->q_heads / sh->kv_heads);
        for (int64_t i = r0; i < r1; i++) {
            const int64_t n = visible_keys(sh, i);
            lse[(int64_t)h * sh->seq + i] = row_softmax(sh, q, k, h, i, n, p);
            double *oi = o + (i * sh->q_heads + h) * D;
            for (int64_t d = 0; d < D; d++) oi[d] = 0;
            for (int64_t j = 0; j < n; j++) {
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
            const int64_t n = visible_keys(sh, i);
            row_softmax(sh, q, k, h, i, n, p);
            const double *qi = q + (i * sh->q_heads + h) * D;
            const double *doi = dout + (i * sh->q_heads + h) * D;
            /* ds holds dp first; rowdot = sum_j p_j dp_j (equals rowsum(dout * o)) */
            double rowdot = 0;
            for (int64_t j = 0; j < n; j++) {
                const double *vj = v + (j * sh->kv_heads + kvh) * D;
                double s = 0;
                for (int64_t d = 0; d < D; d++) s += doi[d] * vj[d];
                ds[j] = s;
                rowdot += p[j] * s;
            }
            double *dqi = dq + (i * sh->q_heads + h) * D;
            for (int64_t d = 0; d < D; d++) dqi[d] = 0;
            for (int64_t j = 0; j < n; j++) {
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
