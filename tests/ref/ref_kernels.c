/* ref_kernels.c: plain C references of the kernel families (see ref.h). Straight from the definitions, in double;
 * speed does not matter, being obviously right does. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"

static double bf(uint16_t h) { return bf16_to_f32(h); }

void ref_embedding_fwd(const int32_t *tokens, int64_t n, const uint16_t *table, int64_t vocab, int64_t hidden,
                       uint16_t *out) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < hidden; j++)
            out[i * hidden + j] = tokens[i] >= 0 && tokens[i] < vocab ? table[tokens[i] * hidden + j] : 0x7fc0;
}

void ref_embedding_bwd(const int32_t *tokens, int64_t n, const uint16_t *dout, int64_t vocab, int64_t hidden,
                       float *dtable) {
    for (int64_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= vocab) continue;
        for (int64_t j = 0; j < hidden; j++)
            dtable[tokens[i] * hidden + j] = (float)((double)dtable[tokens[i] * hidden + j] + bf(dout[i * hidden + j]));
    }
}

void ref_rmsnorm_fwd(const uint16_t *x, const uint16_t *resid, uint16_t *sum_out, const uint16_t *weight,
                     uint16_t *out, float *rstd, int64_t n, int64_t hidden, double eps) {
    double *s = malloc(sizeof(double) * (size_t)hidden);
    for (int64_t r = 0; r < n; r++) {
        const int64_t o = r * hidden;
        double ss = 0;
        for (int64_t j = 0; j < hidden; j++) {
            s[j] = resid ? bf16_round(bf(x[o + j]) + bf(resid[o + j])) : bf(x[o + j]);
            if (resid) sum_out[o + j] = f64_to_bf16(s[j]);
            ss += s[j] * s[j];
        }
        double rs = 1.0 / sqrt(ss / (double)hidden + eps);
        rstd[r] = (float)rs;
        for (int64_t j = 0; j < hidden; j++) out[o + j] = f64_to_bf16(bf(weight[j]) * bf16_round(s[j] * rs));
    }
    free(s);
}

void ref_rmsnorm_bwd(const uint16_t *dout, const uint16_t *x, const uint16_t *weight, const float *rstd,
                     const uint16_t *dresid, uint16_t *dx, float *dweight, int64_t n, int64_t hidden) {
    double *dw = calloc((size_t)hidden, sizeof(double));
    for (int64_t r = 0; r < n; r++) {
        const int64_t o = r * hidden;
        const double rs = rstd[r];
        double dot = 0;
        for (int64_t j = 0; j < hidden; j++) dot += bf(dout[o + j]) * bf(weight[j]) * bf(x[o + j]) * rs;
        const double mean = dot / (double)hidden;
        for (int64_t j = 0; j < hidden; j++) {
            const double xh = bf(x[o + j]) * rs, g = bf(dout[o + j]) * bf(weight[j]);
            double d = rs * (g - xh * mean);
            if (dresid) d += bf(dresid[o + j]);
            dx[o + j] = f64_to_bf16(d);
            dw[j] += bf(dout[o + j]) * bf16_round(xh);
        }
    }
    for (int64_t j = 0; j < hidden; j++) dweight[j] = (float)((double)dweight[j] + dw[j]);
    free(dw);
}

void ref_rope_inv_freq(int64_t head_dim, double theta, const ref_rope_scaling *s, double *inv_freq) {
    for (int64_t i = 0; i < head_dim / 2; i++) {
        double f = 1.0 / pow(theta, (double)(2 * i) / (double)head_dim);
        if (s && s->enabled) {
            double wavelen = 2 * M_PI / f;
            double low_wavelen = s->original_max / s->low_freq, high_wavelen = s->original_max / s->high_freq;
            if (wavelen > low_wavelen) {
                f = f / s->factor; /* low frequencies: scaled down */
            } else if (wavelen >= high_wavelen) {
                double smooth = (s->original_max / wavelen - s->low_freq) / (s->high_freq - s->low_freq);
                f = (1 - smooth) * f / s->factor + smooth * f; /* between: interpolated */
            }                                                  /* high frequencies: kept */
        }
        inv_freq[i] = f;
    }
}

void ref_rope(uint16_t *x, int64_t n, int64_t heads, int64_t head_dim, int64_t pos0, const double *inv_freq,
              bool backward) {
    const int64_t half = head_dim / 2;
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = 0; i < half; i++) {
            double a = (double)(pos0 + r) * inv_freq[i];
            double c = cos(a), s = backward ? -sin(a) : sin(a);
            for (int64_t h = 0; h < heads; h++) {
                uint16_t *p = x + (r * heads + h) * head_dim;
                double x0 = bf(p[i]), x1 = bf(p[i + half]);
                p[i] = f64_to_bf16(x0 * c - x1 * s);
                p[i + half] = f64_to_bf16(x1 * c + x0 * s);
            }
        }
}

static double sigmoid(double g) { return 1.0 / (1.0 + exp(-g)); }

void ref_swiglu_fwd(const uint16_t *gate, const uint16_t *up, uint16_t *out, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        double g = bf(gate[i]);
        out[i] = f64_to_bf16(bf16_round(g * sigmoid(g)) * bf(up[i]));
    }
}

void ref_swiglu_bwd(const uint16_t *dout, uint16_t *gate, uint16_t *up, int64_t count) {
    for (int64_t i = 0; i < count; i++) {
        double g = bf(gate[i]), u = bf(up[i]), d = bf(dout[i]), s = sigmoid(g);
        gate[i] = f64_to_bf16(d * u * s * (1 + g * (1 - s)));
        up[i] = f64_to_bf16(d * bf16_round(g * s));
    }
}

double ref_loss(uint16_t *logits, const int32_t *targets, int64_t n, int64_t vocab, double scale) {
    double total = 0;
    for (int64_t r = 0; r < n; r++) {
        uint16_t *row = logits + r * vocab;
        const int32_t t = targets[r];
        if (t < 0) {
            memset(row, 0, sizeof(uint16_t) * (size_t)vocab);
            continue;
        }
        if (t >= vocab) {
            total = NAN;
            for (int64_t j = 0; j < vocab; j++) row[j] = 0x7fc0;
            continue;
        }
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < vocab; j++) mx = fmax(mx, bf(row[j]));
        for (int64_t j = 0; j < vocab; j++) sum += exp(bf(row[j]) - mx);
        const double lse = mx + log(sum);
        total += lse - bf(row[t]);
        for (int64_t j = 0; j < vocab; j++) row[j] = f64_to_bf16((exp(bf(row[j]) - lse) - (j == t)) * scale);
    }
    return total;
}

void ref_adamw(float *master, float *m, float *v, const float *grad, uint16_t *param, int64_t n, double lr,
               double beta1, double beta2, double eps, double wd, double grad_scale, int step) {
    const double bc1 = 1 - pow(beta1, step), bc2 = 1 - pow(beta2, step);
    for (int64_t i = 0; i < n; i++) {
        const double g = (double)grad[i] * grad_scale;
        double p = (double)master[i] * (1 - lr * wd);
        const double mm = beta1 * m[i] + (1 - beta1) * g;
        const double vv = beta2 * v[i] + (1 - beta2) * g * g;
        p -= lr / bc1 * mm / (sqrt(vv) / sqrt(bc2) + eps);
        master[i] = (float)p;
        m[i] = (float)mm;
        v[i] = (float)vv;
        param[i] = f32_to_bf16((float)p);
    }
}

double ref_sumsq(const float *grad, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)grad[i] * grad[i];
    return s;
}

void ref_ulysses_pack(const void *src, int64_t src_stride, void *dst, int C, int R, int64_t T, int nout,
                      int64_t row_bytes) {
    const char *s = src;
    char *d = dst;
    for (int r = 0; r < C; r++)
        for (int64_t t = 0; t < T; t++)
            for (int j = 0; j < nout; j++)
                memcpy(d + (((int64_t)r * T + t) * nout + j) * row_bytes,
                       s + t * src_stride + ((int64_t)(r / R) * nout + j) * row_bytes, (size_t)row_bytes);
}

void ref_ulysses_unpack(const void *src, void *dst, int64_t dst_stride, int C, int64_t T, int nout,
                        int64_t row_bytes) {
    const char *s = src;
    char *d = dst;
    for (int r = 0; r < C; r++)
        for (int64_t t = 0; t < T; t++)
            for (int j = 0; j < nout; j++)
                memcpy(d + t * dst_stride + ((int64_t)r * nout + j) * row_bytes,
                       s + (((int64_t)r * T + t) * nout + j) * row_bytes, (size_t)row_bytes);
}

void ref_ulysses_unpack_add(const void *src, void *dst, int64_t dst_stride, int C, int R, int64_t T, int nout,
                            int64_t row_bytes) {
    const uint16_t *s = src;
    const int64_t e = row_bytes / 2; /* bf16 values per row */
    for (int k = 0; k < C / R; k++)
        for (int64_t t = 0; t < T; t++)
            for (int j = 0; j < nout; j++) {
                uint16_t *d = (uint16_t *)((char *)dst + t * dst_stride + ((int64_t)k * nout + j) * row_bytes);
                for (int64_t x = 0; x < e; x++) {
                    double acc = bf(d[x]);
                    for (int i = 0; i < R; i++) acc += bf(s[((((int64_t)k * R + i) * T + t) * nout + j) * e + x]);
                    d[x] = f64_to_bf16(acc);
                }
            }
}

void ref_cast_f32_to_bf16(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
}

double ref_fp8_value(uint8_t b, bool e5m2) {
    int e_bits = e5m2 ? 5 : 4, m_bits = 7 - e_bits, bias = (1 << (e_bits - 1)) - 1;
    int e = (b >> m_bits) & ((1 << e_bits) - 1), m = b & ((1 << m_bits) - 1);
    double v;
    if (!e5m2 && (b & 0x7f) == 0x7f) v = NAN;
    else if (e5m2 && e == 31) v = m ? NAN : INFINITY;
    else v = e ? ldexp(1.0 + m / (double)(1 << m_bits), e - bias) : ldexp(m / (double)(1 << m_bits), 1 - bias);
    return b & 0x80 ? -v : v;
}

uint8_t ref_fp8_of(float v, bool e5m2) {
    if (isnan(v)) return e5m2 ? 0x7e : 0x7f;
    static double value[2][128]; /* each format's non-negative bytes' values, growing with the byte */
    static bool made[2];
    uint8_t sign = signbit(v) ? 0x80 : 0, top = e5m2 ? 0x7b : 0x7e; /* the largest finite byte */
    if (!made[e5m2]) {
        for (int b = 0; b <= top; b++) value[e5m2][b] = ref_fp8_value((uint8_t)b, e5m2);
        made[e5m2] = true;
    }
    const double *val = value[e5m2], a = fabs((double)v);
    /* the nearest of bytes 0..top, the even one on a tie: the largest lo with val[lo] <= a, then lo or lo + 1 */
    int lo = 0, hi = top;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (val[mid] <= a) lo = mid;
        else hi = mid - 1;
    }
    if (lo == top) return sign | top; /* beyond the largest finite value: saturated */
    double dlo = a - val[lo], dhi = val[lo + 1] - a;
    int best = dlo < dhi ? lo : dhi < dlo ? lo + 1 : (lo & 1 ? lo + 1 : lo);
    return sign | (uint8_t)best;
}

void ref_fp8_amax(const uint16_t *src, int64_t rows, int64_t cols, int64_t ld, bool e5m2, float slot[3]) {
    float amax = 0, fmax = e5m2 ? 57344.0f : 448.0f;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) amax = fmaxf(amax, fabsf(bf16_to_f32(src[r * ld + c])));
    slot[0] = amax > 0 ? amax / fmax : 1.0f;
    slot[1] = amax > 0 ? fmax / amax : 1.0f;
    slot[2] = amax;
}

void ref_fp8_cast(const uint16_t *src, int64_t rows, int64_t cols, int64_t ld, bool e5m2, bool transpose, float q,
                  uint8_t *dst) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            float x = bf16_to_f32(src[r * ld + c]) * q;
            dst[transpose ? c * rows + r : r * cols + c] = ref_fp8_of(x, e5m2);
        }
}

/* The largest power of two q with amax * q <= fmax, by counting down from the cap 2^126 (amax * 2^e is exact in
 * double); 1 for amax 0, 0 for an infinite amax (no q fits). */
static float block_quant(float amax, double fmax) {
    if (!(amax > 0)) return 1.0f;
    if (isinf(amax)) return 0.0f;
    int e = 126;
    while (ldexp((double)amax, e) > fmax) e--;
    return ldexpf(1.0f, e);
}

/* The source's block [r0, r1) x [c0, c1) cast with its own multiplier q into dst [rows][cols] (or [cols][rows] when
 * transposed); returns the block's scale 1 / q */
static float cast_scaled_block(const uint16_t *src, int64_t rows, int64_t cols, int64_t ld, bool e5m2, bool transpose,
                               int64_t r0, int64_t r1, int64_t c0, int64_t c1, uint8_t *dst) {
    float amax = 0;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) amax = fmaxf(amax, fabsf(bf16_to_f32(src[r * ld + c])));
    const float q = block_quant(amax, e5m2 ? 57344.0 : 448.0);
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++)
            dst[transpose ? c * rows + r : r * cols + c] = ref_fp8_of(bf16_to_f32(src[r * ld + c]) * q, e5m2);
    return 1.0f / q;
}

void ref_fp8_cast_block(const uint16_t *src, int64_t rows, int64_t cols, int64_t ld, bool e5m2, bool transpose,
                        bool tiles, uint8_t *dst, float *scales) {
    /* a block's extent in source rows and columns */
    const int64_t br = tiles || transpose ? 128 : 1, bc = tiles || !transpose ? 128 : 1;
    const int64_t ld4_rows = ((rows + 127) / 128 + 3) / 4 * 4, ld4_cols = ((cols + 127) / 128 + 3) / 4 * 4;
    for (int64_t r0 = 0; r0 < rows; r0 += br)
        for (int64_t c0 = 0; c0 < cols; c0 += bc) {
            const int64_t r1 = r0 + br < rows ? r0 + br : rows, c1 = c0 + bc < cols ? c0 + bc : cols;
            int64_t at;
            if (!tiles) at = transpose ? r0 / 128 * cols + c0 : c0 / 128 * rows + r0;
            else at = transpose ? c0 / 128 * ld4_rows + r0 / 128 : r0 / 128 * ld4_cols + c0 / 128;
            scales[at] = cast_scaled_block(src, rows, cols, ld, e5m2, transpose, r0, r1, c0, c1, dst);
        }
}

void ref_fp8_cast_row(const uint16_t *src, int64_t rows, int64_t cols, int64_t ld, bool e5m2, bool transpose,
                      uint8_t *dst, float *scales) {
    if (transpose)
        for (int64_t c = 0; c < cols; c++)
            scales[c] = cast_scaled_block(src, rows, cols, ld, e5m2, true, 0, rows, c, c + 1, dst);
    else
        for (int64_t r = 0; r < rows; r++)
            scales[r] = cast_scaled_block(src, rows, cols, ld, e5m2, false, r, r + 1, 0, cols, dst);
}

void ref_attn_delta(const uint16_t *dout, const uint16_t *out, float *delta, int64_t n, int64_t heads,
                    int64_t head_dim) {
    for (int64_t r = 0; r < n * heads; r++) {
        double s = 0;
        for (int64_t d = 0; d < head_dim; d++) s += bf(dout[r * head_dim + d]) * bf(out[r * head_dim + d]);
        delta[r] = (float)s;
    }
}

void ref_attn_merge(const uint16_t *o_blk, const float *lse_blk, float *o_acc, float *lse_acc, int64_t n,
                    int64_t heads, int64_t head_dim, int64_t lse_stride) {
    for (int64_t r = 0; r < n; r++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t li = h * lse_stride + r;
            double la = lse_acc[li], lb = lse_blk[li];
            if (isinf(la) && la < 0 && isinf(lb) && lb < 0) continue;
            double m = la > lb ? la : lb, lse = m + log(exp(la - m) + exp(lb - m));
            double wa = exp(la - lse), wb = exp(lb - lse);
            for (int64_t d = 0; d < head_dim; d++) {
                int64_t x = (r * heads + h) * head_dim + d;
                o_acc[x] = (float)(wa * o_acc[x] + wb * bf(o_blk[x]));
            }
            lse_acc[li] = (float)lse;
        }
}
