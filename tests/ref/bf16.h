/* bf16.h: bfloat16 stored as uint16_t on the host: conversions with round-to-nearest-even, as the GPU's
 * __float2bfloat16_rn does. */
#ifndef REF_BF16_H
#define REF_BF16_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest, ties to even; NaN stays NaN (quiet, sign kept); overflow goes to infinity. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Correctly rounded double -> bf16 (no double rounding through float): round to float toward zero with a sticky
 * bit for what was dropped (round-to-odd), then to bf16 with ties to even. */
static inline uint16_t f64_to_bf16(double d) {
    if (isnan(d)) return f32_to_bf16((float)d);
    float f = (float)d;
    if (isinf(f)) return f32_to_bf16(f);
    if ((double)f != d) {
        if (fabs((double)f) > fabs(d)) f = nextafterf(f, 0.0f);
        uint32_t u;
        memcpy(&u, &f, sizeof u);
        u |= 1u;
        memcpy(&f, &u, sizeof f);
    }
    return f32_to_bf16(f);
}

/* d rounded to the nearest bf16, as a double. */
static inline double bf16_round(double d) { return bf16_to_f32(f64_to_bf16(d)); }

#endif
