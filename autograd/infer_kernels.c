/* Fused inference kernels of the integer engine (autograd/infer_kernels.h).
 *
 * Elementwise loops are written to vectorize (branch-free scalar math, always inlined) and compiled
 * for baseline x86-64, AVX2 and AVX-512F through function multi-versioning, as autograd/kernels.c
 * does; -std=c11 keeps floating-point contraction off, so every clone gives the same bits. The two
 * attention products use GCC vector extensions (8 floats) with register blocking: 4 query rows × 16
 * keys for Q·Kᵀ (on a transposed copy of K_h) and 4 rows × 16 columns of V_h for P·V. */
#include "autograd/infer_kernels.h"

#include <float.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "autograd/bq.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(BQ_NO_CLONES)
#define IK_VEC __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define IK_VEC
#endif
#define IK_INLINE static inline __attribute__((always_inline))
#define PAR_ROWS 16 /* rows below which a kernel stays on the calling thread */

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4))); /* unaligned load/store */

/* ---- scalar math: the formulas of autograd/kernels.c (same constants, same operation order) ---- */

IK_INLINE float rne_small(float x) {
    const float magic = 12582912.0f; /* 1.5·2^23 */
    return (x + magic) - magic;
}

/* e^x, relative error below 2e-7 on [-87.3, 88]; 0 below, +inf above (autograd/kernels.c exp_fast). */
IK_INLINE float exp_fast(float x) {
    float xc = x < -87.3f ? -87.3f : x;
    xc = xc > 88.0f ? 88.0f : xc;
    float n = rne_small(xc * 1.44269504088896341f);
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
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

/* erfc(z), z >= 0, by the Chebyshev fit of Press et al., Numerical Recipes §6.2 (autograd/kernels.c). */
IK_INLINE float erfc_pos(float z) {
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

IK_INLINE float gelu(float x) {
    float h = 0.5f * erfc_pos(fabsf(x) * (float)M_SQRT1_2);
    return x * (x >= 0.0f ? 1.0f - h : h);
}

IK_INLINE uint8_t quant_u8(float x, float s) {
    float v = x / s;
    v = v < -128.0f ? -128.0f : v;
    v = v > 127.0f ? 127.0f : v;
    v = v == v ? v : 0.0f;
    return (uint8_t)((int)rne_small(v) + 128);
}

IK_INLINE float dequant(int32_t a, int32_t comp, float scale, float bias) {
    return (float)(a - comp) * scale + bias;
}

/* Sums in 8 fixed lanes combined pairwise (autograd/kernels.c row_sum's order). */
IK_INLINE float row_sum8(const float *x, int64_t n) {
    float a[8] = {0};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (int l = 0; l < 8; l++) a[l] += x[j + l];
    for (; j < n; j++) a[0] += x[j];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

IK_INLINE float row_max8(const float *x, int64_t n) {
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

/* ---- GEMM epilogues ---- */

IK_VEC void bq_infer_dequant_bias(float *y, const int32_t *acc, const int32_t *comp, const float *scale,
                                  const float *bias, int64_t M, int64_t N) {
#pragma omp parallel for if (M >= PAR_ROWS) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) y[m * N + n] = dequant(acc[m * N + n], comp[n], scale[n], bias[n]);
}

IK_VEC void bq_infer_residual_layernorm(float *out, uint8_t *codes, const int32_t *acc, const int32_t *comp,
                                        const float *scale, const float *bias, const float *resid,
                                        const float *lnw, const float *lnb, float eps, float sq, int64_t M,
                                        int64_t N) {
#pragma omp parallel for if (M >= PAR_ROWS) schedule(static)
    for (int64_t m = 0; m < M; m++) {
        float *y = out + m * N;
        const int32_t *a = acc + m * N;
        const float *r = resid + m * N;
        for (int64_t n = 0; n < N; n++) y[n] = dequant(a[n], comp[n], scale[n], bias[n]) + r[n];
        const float mean = row_sum8(y, N) / (float)N;
        float v8a[8] = {0};
        int64_t n = 0;
        for (; n + 8 <= N; n += 8)
            for (int l = 0; l < 8; l++) {
                float c = y[n + l] - mean;
                v8a[l] += c * c;
            }
        for (; n < N; n++) v8a[0] += (y[n] - mean) * (y[n] - mean);
        const float var = (((v8a[0] + v8a[1]) + (v8a[2] + v8a[3])) + ((v8a[4] + v8a[5]) + (v8a[6] + v8a[7]))) / (float)N;
        const float rs = 1.0f / sqrtf(var + eps);
        for (n = 0; n < N; n++) y[n] = (y[n] - mean) * rs * lnw[n] + lnb[n];
        if (codes)
            for (n = 0; n < N; n++) codes[m * N + n] = quant_u8(y[n], sq);
    }
}

IK_VEC void bq_infer_gelu_quant(uint8_t *codes, const int32_t *acc, const int32_t *comp, const float *scale,
                                const float *bias, float sq, int64_t M, int64_t N) {
#pragma omp parallel for if (M >= PAR_ROWS) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++)
            codes[m * N + n] = quant_u8(gelu(dequant(acc[m * N + n], comp[n], scale[n], bias[n])), sq);
}

/* ---- attention ---- */

static int64_t pad16(int64_t x) { return (x + 15) / 16 * 16; }

int64_t bq_infer_attention_scratch(int64_t T, int64_t d) {
    return d * pad16(T) + T * pad16(T) + 16; /* K_hᵀ, then S/P; 16 floats keep both 64-byte aligned */
}

/* S rows [0,R) (leading dim Tp) = the R query rows q (leading dim ldq) · Kt (d, Tp). */
IK_INLINE void scores_rows(float *S, int64_t Tp, const float *q, int64_t ldq, const float *Kt, int64_t d,
                           const int R) {
    for (int64_t j = 0; j < Tp; j += 16) {
        v8 acc[4][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = (v8){0};
        for (int64_t e = 0; e < d; e++) {
            const v8 k0 = *(const v8 *)(Kt + e * Tp + j), k1 = *(const v8 *)(Kt + e * Tp + j + 8);
            for (int r = 0; r < R; r++) {
                const v8 qb = (v8){0} + q[r * ldq + e];
                acc[r][0] += qb * k0;
                acc[r][1] += qb * k1;
            }
        }
        for (int r = 0; r < R; r++) {
            *(v8 *)(S + r * Tp + j) = acc[r][0];
            *(v8 *)(S + r * Tp + j + 8) = acc[r][1];
        }
    }
}

/* C rows [0,R) (d columns, written as codes at scale sq, leading dim ldc) = P rows (leading dim Tp, T
 * keys) · V (T, d, leading dim ldv). */
IK_INLINE void context_rows(uint8_t *codes, int64_t ldc, const float *P, int64_t Tp, const float *V, int64_t ldv,
                            int64_t T, int64_t d, float sq, const int R) {
    for (int64_t c = 0; c < d; c += 16) {
        const int two = c + 16 <= d; /* d is a multiple of 8: the last block may be 8 wide */
        v8 acc[4][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = (v8){0};
        for (int64_t j = 0; j < T; j++) {
            const v8 v0 = *(const v8u *)(V + j * ldv + c);
            const v8 v1 = two ? *(const v8u *)(V + j * ldv + c + 8) : (v8){0};
            for (int r = 0; r < R; r++) {
                const v8 pb = (v8){0} + P[r * Tp + j];
                acc[r][0] += pb * v0;
                acc[r][1] += pb * v1;
            }
        }
        for (int r = 0; r < R; r++)
            for (int l = 0; l < (two ? 16 : 8); l++)
                codes[r * ldc + c + l] = quant_u8(l < 8 ? acc[r][0][l] : acc[r][1][l - 8], sq);
    }
}

/* The masked softmax of one row of T scores (row length Tp), in place: the operations and summation
 * orders of autograd/kernels.c bq_kernel_softmax_mask_forward. */
IK_INLINE void softmax_row(float *y, const float *mrow, float scale, int64_t T) {
    if (mrow)
        for (int64_t j = 0; j < T; j++) y[j] = scale * y[j] + (1.0f - mrow[j]) * -FLT_MAX;
    else
        for (int64_t j = 0; j < T; j++) y[j] = scale * y[j];
    const float mx = row_max8(y, T);
    for (int64_t j = 0; j < T; j++) y[j] = exp_fast(y[j] - mx);
    const float inv = 1.0f / row_sum8(y, T);
    for (int64_t j = 0; j < T; j++) y[j] *= inv;
}

IK_VEC void bq_infer_attention(uint8_t *codes, const float *qkv, const float *mask, float *scratch,
                               int64_t nthreads, float scale, float sq, int64_t B, int64_t T, int64_t NH,
                               int64_t d) {
    BQ_CHECK(d % 8 == 0 && omp_get_max_threads() <= nthreads);
    const int64_t H = NH * d, ld = 3 * H, Tp = pad16(T), per = bq_infer_attention_scratch(T, d);
#pragma omp parallel for if (B * NH > 1) schedule(static)
    for (int64_t bh = 0; bh < B * NH; bh++) {
        const int64_t b = bh / NH, h = bh % NH;
        float *Kt = scratch + (int64_t)omp_get_thread_num() * per;
        float *S = Kt + d * Tp;
        const float *q = qkv + b * T * ld + h * d, *k = q + H, *v = q + 2 * H;
        const float *mrow = mask ? mask + b * T : NULL;
        for (int64_t e = 0; e < d; e++) {
            for (int64_t j = 0; j < T; j++) Kt[e * Tp + j] = k[j * ld + e];
            for (int64_t j = T; j < Tp; j++) Kt[e * Tp + j] = 0.0f;
        }
        int64_t i = 0;
        for (; i + 4 <= T; i += 4) scores_rows(S + i * Tp, Tp, q + i * ld, ld, Kt, d, 4);
        for (; i < T; i++) scores_rows(S + i * Tp, Tp, q + i * ld, ld, Kt, d, 1);
        for (i = 0; i < T; i++) softmax_row(S + i * Tp, mrow, scale, T);
        uint8_t *c = codes + b * T * H + h * d;
        for (i = 0; i + 4 <= T; i += 4) context_rows(c + i * H, H, S + i * Tp, Tp, v, ld, T, d, sq, 4);
        for (; i < T; i++) context_rows(c + i * H, H, S + i * Tp, Tp, v, ld, T, d, sq, 1);
    }
}
