/* Branch-free scalar math shared by autograd/kernels.c and autograd/infer_kernels.c (internal header,
 * not part of the public API).
 *
 * The functions are always inlined, so each one is compiled inside the calling loop with that loop's
 * target (the baseline, AVX2 and AVX-512F clones of the kernels' function multi-versioning) and
 * vectorizes there. Both kernel files therefore compute the same bits from the same formulas; the
 * integer engine's GELU and softmax match the training kernels exactly.
 *
 * References: Cody and Waite argument reduction for e^x; Press et al., Numerical Recipes §6.2 for the
 * Chebyshev fit of erfc. */
#ifndef BQ_FASTMATH_H
#define BQ_FASTMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define BQ_FASTMATH_INLINE static inline __attribute__((always_inline))

/* Round to nearest, ties to even, for |x| < 2^22, in the default rounding mode: adding and subtracting
 * 1.5·2^23 leaves exactly the rounded integer (the float spacing there is 1). */
BQ_FASTMATH_INLINE float rne_small(float x) {
    const float magic = 12582912.0f; /* not folded away: without -ffast-math this is no identity */
    return (x + magic) - magic;
}

/* The code clamp(rne(x/s), lo, hi) of a fake quantizer with scale s and integer bounds lo, hi, as a float:
 * rne(clamp(x/s, lo, hi)), which is the same (rounding is monotonic, the bounds are integers) and keeps
 * the argument small enough for rne_small. A NaN x/s stays NaN. */
BQ_FASTMATH_INLINE float fq_code_of(float x, float s, float lo, float hi) {
    float v = x / s;
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    return rne_small(v);
}

/* The bf16 word of x rounded to nearest, ties to even, without branches (so that it vectorizes):
 * autograd/gemm.h bq_bf16_bits's bits (Inf kept, NaN kept and quieted). */
BQ_FASTMATH_INLINE uint16_t bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t special = (u & 0x7f800000u) == 0x7f800000u;
    const uint32_t quiet = special && (u & 0x007fffffu) ? 0x00400000u : 0u;
    const uint32_t r = special ? u | quiet : u + 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(r >> 16);
}

/* e^x with relative error below 2e-7 for x in [-87.3, 88]; 0 below (the softmax's masked keys),
 * +inf above. 2^n·e^r with n = rne(x·log2 e), r = x − n·ln 2 in two parts (Cody-Waite), and the degree-7
 * Taylor polynomial of e^r on |r| <= ln2/2 (truncation error < 3e-9). */
BQ_FASTMATH_INLINE float exp_fast(float x) {
    float xc = x < -87.3f ? -87.3f : x;
    xc = xc > 88.0f ? 88.0f : xc;
    float n = rne_small(xc * 1.44269504088896341f);
    float r = xc - n * 0.693359375f; /* ln2 high part: exact product for |n| <= 2^10 */
    r = r - n * -2.12194440e-4f;     /* ln2 = 0.693359375 - 2.12194440e-4 */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    /* n is in [-126, 127] unless x is NaN, whose NaN comes through p; 0 then keeps the conversion and the
     * shift defined */
    int32_t bits = ((int32_t)(n == n ? n : 0.0f) + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    float y = p * two_n;
    y = x < -87.3f ? 0.0f : y;
    return x > 88.0f ? INFINITY : y;
}

/* erfc(z) for z >= 0 with relative error below 1.2e-7 before rounding (the Chebyshev fit
 * erfc(z) = t·exp(−z² + P(t)), t = 1/(1 + z/2), of Press et al., Numerical Recipes §6.2). */
BQ_FASTMATH_INLINE float erfc_pos(float z) {
    float t = 1.0f / (1.0f + 0.5f * z);
    float p = 0.17087277f;
    p = p * t - 0.82215223f;
    p = p * t + 1.48851587f;
    p = p * t - 1.13520398f;
    p = p * t + 0.27886807f;
    p = p * t - 0.18628806f;
    p = p * t + 0.09678418f;
    p = p * t + 0.37409196f;
    p = p * t + 1.00002368f;
    p = p * t - 1.26551223f;
    return t * exp_fast(-z * z + p);
}

/* Reductions over a row in 8 fixed lanes (element i in lane i mod 8 below the last multiple of 8, the
 * tail in lane 0) combined pairwise: they vectorize, and the result is the same whatever vector width
 * the running clone has and whatever the thread count. */
BQ_FASTMATH_INLINE float row_max(const float *x, int64_t n) {
    float m[8];
    for (int l = 0; l < 8; l++) m[l] = -INFINITY;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
    for (; j < n; j++) m[0] = x[j] > m[0] ? x[j] : m[0];
    float r = m[0];
    for (int l = 1; l < 8; l++) r = m[l] > r ? m[l] : r;
    return r;
}

BQ_FASTMATH_INLINE float row_sum(const float *x, int64_t n) {
    float a[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) a[l] += x[j + l];
    for (; j < n; j++) a[0] += x[j];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* One row of LayerNorm, y = (x − mean)·rstd·weight + bias over H values (y may be x): two passes (the
 * mean, then the variance of the centred values: no cancellation), each in row_sum's lanes and order. */
BQ_FASTMATH_INLINE void ln_row_forward(float *y, float *mean, float *rstd, const float *x, const float *weight,
                                       const float *bias, int64_t H, float eps) {
    float m = row_sum(x, H) / (float)H;
    float a[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= H; j += 8)
        for (int l = 0; l < 8; l++) {
            float xc = x[j + l] - m;
            a[l] += xc * xc;
        }
    for (; j < H; j++) a[0] += (x[j] - m) * (x[j] - m);
    float v = (((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))) / (float)H;
    float r = 1.0f / sqrtf(v + eps);
    for (int64_t i = 0; i < H; i++) y[i] = (x[i] - m) * r * weight[i] + bias[i];
    *mean = m;
    *rstd = r;
}

#endif
