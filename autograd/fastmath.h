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
    int32_t bits = ((int32_t)n + 127) << 23;
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

#endif
