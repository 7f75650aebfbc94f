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
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "autograd/fastmath.h"
#include "autograd/gemm.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(BQ_NO_CLONES)
#define IK_VEC __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define IK_VEC
#endif
#define IK_INLINE static inline __attribute__((always_inline))
/* Elements below which an epilogue stays on the calling thread, where waking and joining a second thread
 * would cost about what it saves. A LayerNorm pass over one sequence of 128 tokens (49,152 values at
 * hidden 384) is above it: splitting it took the batch-1 forward of all-MiniLM-L6-v2 from 2.23-2.29 to
 * 2.13-2.17 ms at 2 threads on a Zen 5 (docs/results.md, "Inference on Zen 5"). */
#define PAR_MIN_ELEMS 16384

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4))); /* unaligned load/store */

/* ---- scalar math: rne_small, exp_fast and erfc_pos are those of autograd/kernels.c, shared through
 * autograd/fastmath.h (same bits in both engines) ---- */

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

/* ---- GEMM epilogues ---- */

IK_VEC static void residual_layernorm_portable(float *out, uint8_t *codes, const int32_t *acc, const int32_t *comp,
                                               const float *scale, const float *bias, const float *resid,
                                               const float *lnw, const float *lnb, float eps, float sq, int64_t M,
                                               int64_t N) {
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++) {
        float *y = out + m * N;
        const int32_t *a = acc + m * N;
        const float *r = resid + m * N;
        for (int64_t n = 0; n < N; n++) y[n] = dequant(a[n], comp[n], scale[n], bias[n]) + r[n];
        float mean, rstd;
        ln_row_forward(y, &mean, &rstd, y, lnw, lnb, N, eps);
        if (codes)
            for (int64_t n = 0; n < N; n++) codes[m * N + n] = quant_u8(y[n], sq);
    }
}

IK_VEC static void gelu_quant_portable(uint8_t *codes, const int32_t *acc, const int32_t *comp, const float *scale,
                                      const float *bias, float sq, int64_t M, int64_t N, int64_t ldc) {
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++)
            codes[m * ldc + n] = quant_u8(gelu(dequant(acc[m * N + n], comp[n], scale[n], bias[n])), sq);
}

/* ---- fp32 GEMM epilogues (layers/bert_fp32.c) ---- */

IK_VEC void bq_infer_bias_residual_layernorm_f32(float *out, const float *x, const float *bias, const float *resid,
                                                 const float *lnw, const float *lnb, float eps, int64_t M, int64_t N) {
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++) {
        float *y = out + m * N;
        const float *a = x + m * N, *r = resid + m * N;
        for (int64_t n = 0; n < N; n++) y[n] = (a[n] + bias[n]) + r[n];
        float mean, rstd;
        ln_row_forward(y, &mean, &rstd, y, lnw, lnb, N, eps);
    }
}

IK_VEC static void bias_gelu_portable(float *x, const float *bias, int64_t M, int64_t N) {
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) x[m * N + n] = gelu(x[m * N + n] + bias[n]);
}

IK_VEC static void bias_gelu_bf16_portable(uint16_t *h, const float *x, const float *bias, int64_t M, int64_t N) {
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) h[m * N + n] = bf16_bits(gelu(x[m * N + n] + bias[n]));
}

/* ---- attention ---- */

static int64_t pad16(int64_t x) { return (x + 15) / 16 * 16; }


/* K_hᵀ (d, Tp), S/P (T, Tp), then Q_h, K_h, V_h (T, d) each; every block starts 64-byte aligned. */
int64_t bq_infer_attention_scratch(int64_t T, int64_t d) {
    return d * pad16(T) + T * pad16(T) + 3 * pad16(T * d) + 16;
}

/* Rows ahead that dequant_head and load_head_f32 prefetch. */
#define PREFETCH_ROWS 16

/* Q_h, K_h, V_h (T, d) each, contiguous at dst, dst + Td, dst + 2·Td (Td = pad16(T·d)), dequantized
 * from the query/key/value sums s of head h, rows [r0, r0 + T). Row by row, the three parts of a row
 * together: each row is in another 4 KiB page, where the hardware prefetchers stop, so the rows
 * PREFETCH_ROWS ahead are fetched by hand (without it the accumulator loads took a third of the
 * attention's time). */
IK_INLINE void dequant_head(float *dst, const BqQkvSums *s, int64_t r0, int64_t h, int64_t T, int64_t d) {
    const int64_t Td = pad16(T * d), ld = s->ld, c0 = h * d;
    for (int64_t t = 0; t < T; t++)
        for (int part = 0; part < 3; part++) {
            const int32_t *a = s->acc[part] + (r0 + t) * ld + c0, *comp = s->comp[part] + c0;
            const float *scale = s->scale[part] + c0, *bias = s->bias[part] + c0;
            for (int64_t e = 0; e < d && t + PREFETCH_ROWS < T; e += 16)
                __builtin_prefetch(a + PREFETCH_ROWS * ld + e, 0, 3);
            float *o = dst + part * Td + t * d;
            for (int64_t e = 0; e < d; e++) o[e] = dequant(a[e], comp[e], scale[e], bias[e]);
        }
}

/* Q_h, K_h, V_h (T, d) each, contiguous at dst, dst + Td, dst + 2·Td, from the fp32 query/key/value
 * GEMM output qkv (T rows, leading dim ld, no bias yet) plus bias. */
IK_INLINE void load_head_f32(float *dst, const float *qkv, int64_t ld, const float *bias, int64_t H, int64_t h,
                             int64_t T, int64_t d) {
    const int64_t Td = pad16(T * d);
    for (int part = 0; part < 3; part++) {
        const int64_t c0 = part * H + h * d;
        float *o = dst + part * Td;
        for (int64_t t = 0; t < T; t++) {
            /* Each row is in another 4 KiB page, where the hardware prefetchers stop: fetch ahead. */
            for (int64_t e = 0; e < d && t + PREFETCH_ROWS < T; e += 16)
                __builtin_prefetch(qkv + (t + PREFETCH_ROWS) * ld + c0 + e, 0, 3);
            for (int64_t e = 0; e < d; e++) o[t * d + e] = qkv[t * ld + c0 + e] + bias[c0 + e];
        }
    }
}

/* What one attention call reads, for either engine: the integer engine's query/key/value sums, or, when
 * sums is NULL, the fp32 engine's bias-free GEMM output qkv (B·T rows, leading dim 3H) and its bias (3H);
 * the optional (B,T) mask, the softmax scale, the context's code scale sq (integer engine) and the sizes;
 * Q, the query rows of each sequence whose context is computed (the first Q of T). */
typedef struct AttnIn {
    const BqQkvSums *sums;
    const float *qkv, *bias, *mask;
    float scale, sq;
    int64_t T, NH, d;
    const BqFq *fq; /* the fake quantizers of the attention (BQ_FQ_ATTN: ort, qdqbert), or NULL */
    int64_t Q;
    int64_t ldo; /* the output's row stride (NH·d, or more where the heads are a column block of it) */
} AttnIn;

/* The mask row of sequence b, or NULL where it has none or every key is kept (all ones): the masked
 * softmax then adds (1 − 1)·(−FLT_MAX) = −0 to each scaled score, which leaves every value as it is, so
 * skipping the term gives the same bits. */
IK_INLINE const float *mask_row(const AttnIn *in, int64_t b) {
    if (!in->mask) return NULL;
    const float *m = in->mask + b * in->T;
    for (int64_t j = 0; j < in->T; j++)
        if (m[j] != 1.0f) return m;
    return NULL;
}

/* Q_h, K_h, V_h of sequence b and head h into the scratch after K_hᵀ and S (Kt + d·Tp + T·Tp), from
 * whichever input in holds. */
IK_INLINE void load_head(float *Kt, const AttnIn *in, int64_t b, int64_t h) {
    const int64_t T = in->T, d = in->d, H = in->NH * d, ld = 3 * H;
    float *dst = Kt + d * pad16(T) + T * pad16(T);
    if (in->sums) dequant_head(dst, in->sums, b * T, h, T, d);
    else load_head_f32(dst, in->qkv + b * T * ld, ld, in->bias, H, h, T, d);
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

/* C rows [i, i+R) (d columns, leading dim ldc) = P rows [i, i+R) (leading dim Tp, T keys) · V (T, d,
 * leading dim ldv), written as codes at scale sq when codes is not NULL, else as fp32 to C. */
IK_INLINE void context_rows(uint8_t *codes, float *C, int64_t ldc, int64_t i, const float *S, int64_t Tp,
                            const float *V, int64_t ldv, int64_t T, int64_t d, float sq, const int R) {
    const float *P = S + i * Tp;
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
        for (int r = 0; r < R; r++) {
            if (!codes) {
                *(v8u *)(C + (i + r) * ldc + c) = acc[r][0];
                if (two) *(v8u *)(C + (i + r) * ldc + c + 8) = acc[r][1];
                continue;
            }
            for (int l = 0; l < (two ? 16 : 8); l++)
                codes[(i + r) * ldc + c + l] = quant_u8(l < 8 ? acc[r][0][l] : acc[r][1][l - 8], sq);
        }
    }
}

/* Kt[e][j] = k[j][e] (k: T rows, leading dim ld) for the keys j in [j0, T), one at a time, then zeros in
 * the padding columns [T, Tp) that the 16-wide score blocks read. */
IK_INLINE void transpose_tail(float *Kt, int64_t Tp, const float *k, int64_t ld, int64_t j0, int64_t T, int64_t d) {
    for (int64_t j = j0; j < T; j++)
        for (int64_t e = 0; e < d; e++) Kt[e * Tp + j] = k[j * ld + e];
    for (int64_t e = 0; e < d; e++)
        for (int64_t j = T; j < Tp; j++) Kt[e * Tp + j] = 0.0f;
}

/* The masked softmax of one row of T scores (row length Tp), in place: the operations and summation
 * orders of autograd/kernels.c bq_kernel_softmax_mask_forward (the fake-quant kernels' bits). With
 * blocks set, the sum runs over whole blocks of 8 with zeros past T, as softmax_row_fma sums, so that a
 * sequence gets the same bits whatever length its batch is padded to (row_sum adds a tail shorter than
 * 8 into one lane, which moves with the padded length). */
IK_INLINE void softmax_row(float *y, const float *mrow, float scale, int64_t T, int blocks) {
    if (mrow)
        for (int64_t j = 0; j < T; j++) y[j] = scale * y[j] + (1.0f - mrow[j]) * -FLT_MAX;
    else
        for (int64_t j = 0; j < T; j++) y[j] = scale * y[j];
    const float mx = row_max(y, T);
    for (int64_t j = 0; j < T; j++) y[j] = exp_fast(y[j] - mx);
    const int64_t n = blocks ? (T + 7) / 8 * 8 : T;
    for (int64_t j = T; j < n; j++) y[j] = 0.0f;
    const float inv = 1.0f / row_sum(y, n);
    for (int64_t j = 0; j < T; j++) y[j] *= inv;
}

/* ---- fake quantizers (ort, qdqbert) ---- */

/* The code c = clamp(rne(x/s), lo, hi) of x, as a float. The integer attention products of the op-by-op
 * forward take the codes of fake-quantized values, rne(fl(fl(c·s)/s)) (autograd/kernels.c head_codes),
 * which is c itself: for |c| <= 2^15 the two roundings move c·s/s by less than 2^15·2^-23 < 1/2. So one
 * division gives what fq_value and head_codes give with two. */
IK_INLINE float fq_code(float x, BqFq q) { return fq_code_of(x, q.s, q.lo, q.hi); }

/* The fake-quantized value of x, fq_code(x)·s: autograd/kernels.c fq_value's operations. */
IK_INLINE float fq_value(float x, BqFq q) { return fq_code(x, q) * q.s; }

/* fq_value where q is a quantizer, x itself where the place has none (q.s = 0). */
IK_INLINE float fq_apply(float x, BqFq q) { return q.s > 0.0f ? fq_value(x, q) : x; }

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define IK_FMA __attribute__((target("avx2,fma")))
#define IK_FMA_INLINE static inline __attribute__((always_inline, target("avx2,fma")))

/* R (1..4) rows of S = Q·Kt, 16 keys at a time, fused multiply-adds over the head dimension e. */
IK_FMA_INLINE void scores_rows_fma(float *S, int64_t Tp, const float *q, int64_t ldq, const float *Kt, int64_t d,
                                   const int R) {
    for (int64_t j = 0; j < Tp; j += 16) {
        __m256 acc[4][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int64_t e = 0; e < d; e++) {
            const __m256 k0 = _mm256_load_ps(Kt + e * Tp + j), k1 = _mm256_load_ps(Kt + e * Tp + j + 8);
            for (int r = 0; r < R; r++) {
                const __m256 qb = _mm256_broadcast_ss(q + r * ldq + e);
                acc[r][0] = _mm256_fmadd_ps(qb, k0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(qb, k1, acc[r][1]);
            }
        }
        for (int r = 0; r < R; r++) {
            _mm256_store_ps(S + r * Tp + j, acc[r][0]);
            _mm256_store_ps(S + r * Tp + j + 8, acc[r][1]);
        }
    }
}

/* 8 uint8 codes of x at scale s: quant_u8's value for every input (NaN → 0 first, then the clamp). */
IK_FMA_INLINE void quant8_fma(uint8_t *dst, __m256 x, __m256 s) {
    __m256 v = _mm256_div_ps(x, s);
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
    v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f));
    __m256i i = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)),
                                 _mm256_set1_epi32(128));
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64((__m128i *)dst, _mm_packus_epi16(w, w));
}

/* The polynomials that the 8- and 16-lane kernels share, written once with the vector operations of a
 * width (VEC is V8 or V16, T its type), so that both widths do the same operations in the same order
 * and give the same bits. Both run in Estrin's order: the passes that evaluate them are bound by their
 * dependency chains, which this shortens (exp: 3 multiply-adds after r², Horner's scheme chains 7). */
#define V8(op) _mm256_##op##_ps
#define V16(op) _mm512_##op##_ps

/* p = exp_fast's degree-7 Taylor polynomial of e^r. */
#define EXP_POLY(VEC, T, p, r)                                                                                  \
    const T r2_ = VEC(mul)(r, r), r4_ = VEC(mul)(r2_, r2_);                                                   \
    const T p01_ = VEC(add)(r, VEC(set1)(1.0f));                                                              \
    const T p23_ = VEC(fmadd)(VEC(set1)(1.0f / 6.0f), r, VEC(set1)(0.5f));                                    \
    const T p45_ = VEC(fmadd)(VEC(set1)(1.0f / 120.0f), r, VEC(set1)(1.0f / 24.0f));                          \
    const T p67_ = VEC(fmadd)(VEC(set1)(1.0f / 5040.0f), r, VEC(set1)(1.0f / 720.0f));                        \
    const T p = VEC(fmadd)(VEC(fmadd)(p67_, r2_, p45_), r4_, VEC(fmadd)(p23_, r2_, p01_))

/* erfc_pos's coefficients (autograd/fastmath.h), highest power first. */
static const float ERFC_CF[10] = {0.17087277f, -0.82215223f, 1.48851587f,  -1.13520398f, 0.27886807f,
                                  -0.18628806f, 0.09678418f, 0.37409196f, 1.00002368f,  -1.26551223f};

/* p = erfc_pos's P(t) = Σ ERFC_CF[9-k]·t^k. */
#define ERFC_POLY(VEC, T, p, t)                                                                                        \
    const T t2_ = VEC(mul)(t, t), t4_ = VEC(mul)(t2_, t2_), t8_ = VEC(mul)(t4_, t4_);                                  \
    T a_[5];                                                                                                           \
    for (int k_ = 0; k_ < 5; k_++)                                                                                     \
        a_[k_] = VEC(fmadd)(VEC(set1)(ERFC_CF[8 - 2 * k_]), t, VEC(set1)(ERFC_CF[9 - 2 * k_]));                        \
    const T p = VEC(fmadd)(a_[4], t8_, VEC(fmadd)(VEC(fmadd)(a_[3], t2_, a_[2]), t4_, VEC(fmadd)(a_[1], t2_, a_[0])))

/* e^x for 8 lanes: exp_fast's range reduction and polynomial (EXP_POLY) with fused multiply-adds. */
IK_FMA_INLINE __m256 exp8_fma(__m256 x) {
    const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    EXP_POLY(V8, __m256, p, r);
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    y = _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ), y);
    return _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_GT_OQ));
}

/* The masked softmax of one row (softmax_row's operations; exp with fused multiply-adds; the row padded
 * to a multiple of 16). Any T: the lanes past T in its last block of 8 hold −inf, whose e^x is 0, so a
 * sequence gets the same bits whatever length its batch is padded to (a masked key gives 0 too). */
IK_FMA_INLINE void softmax_row_fma(float *y, const float *mrow, float scale, int64_t T) {
    const __m256 sc = _mm256_set1_ps(scale), one = _mm256_set1_ps(1.0f), mv = _mm256_set1_ps(-FLT_MAX);
    __m256 mx = _mm256_set1_ps(-INFINITY);
    const int64_t T8 = (T + 7) / 8 * 8;
    for (int64_t j = 0; j < T8; j += 8) {
        __m256 v = _mm256_mul_ps(sc, _mm256_load_ps(y + j));
        if (mrow && j + 8 <= T) v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_sub_ps(one, _mm256_loadu_ps(mrow + j)), mv));
        if (j + 8 > T) { /* the last block of a length that is not a multiple of 8 */
            float b[8], mb[8];
            for (int l = 0; l < 8; l++) mb[l] = mrow && j + l < T ? mrow[j + l] : 1.0f;
            if (mrow) v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_sub_ps(one, _mm256_loadu_ps(mb)), mv));
            _mm256_storeu_ps(b, v);
            for (int l = (int)(T - j); l < 8; l++) b[l] = -INFINITY; /* no key there: e^-inf = 0 */
            v = _mm256_loadu_ps(b);
        }
        _mm256_store_ps(y + j, v);
        mx = _mm256_max_ps(mx, v);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const __m256 m = _mm256_broadcastss_ps(m4);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < T8; j += 8) {
        const __m256 e = exp8_fma(_mm256_sub_ps(_mm256_load_ps(y + j), m));
        _mm256_store_ps(y + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    float l[8];
    _mm256_storeu_ps(l, sum);
    const __m256 inv = _mm256_set1_ps(1.0f / (((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))));
    for (int64_t j = 0; j < T8; j += 8) _mm256_store_ps(y + j, _mm256_mul_ps(_mm256_load_ps(y + j), inv));
}

/* Kt[e][j] = k[j][e] for j < T (T a multiple of 8, d a multiple of 8), in 8×8 blocks. */
IK_FMA_INLINE void transpose_fma(float *Kt, int64_t Tp, const float *k, int64_t ld, int64_t T, int64_t d) {
    for (int64_t j = 0; j < T; j += 8)
        for (int64_t e = 0; e < d; e += 8) {
            __m256 r[8], t[8], u[8];
            for (int i = 0; i < 8; i++) r[i] = _mm256_loadu_ps(k + (j + i) * ld + e);
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
                u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
                u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
                u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
            }
            for (int i = 0; i < 4; i++) {
                _mm256_store_ps(Kt + (e + i) * Tp + j, _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
                _mm256_store_ps(Kt + (e + i + 4) * Tp + j, _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
            }
        }
}

/* context_rows with fused multiply-adds, d columns 16 or 8 at a time. */
IK_FMA_INLINE void context_rows_fma(uint8_t *codes, float *C, int64_t ldc, int64_t i, const float *S, int64_t Tp,
                                    const float *V, int64_t ldv, int64_t T, int64_t d, float sq, const int R) {
    const __m256 s = _mm256_set1_ps(sq);
    const float *P = S + i * Tp;
    for (int64_t c = 0; c < d; c += 16) {
        const int two = c + 16 <= d;
        __m256 acc[4][2];
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        if (two) {
            for (int64_t j = 0; j < T; j++) {
                const __m256 v0 = _mm256_loadu_ps(V + j * ldv + c), v1 = _mm256_loadu_ps(V + j * ldv + c + 8);
                for (int r = 0; r < R; r++) {
                    const __m256 pb = _mm256_broadcast_ss(P + r * Tp + j);
                    acc[r][0] = _mm256_fmadd_ps(pb, v0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(pb, v1, acc[r][1]);
                }
            }
        } else {
            for (int64_t j = 0; j < T; j++) {
                const __m256 v0 = _mm256_loadu_ps(V + j * ldv + c);
                for (int r = 0; r < R; r++)
                    acc[r][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(P + r * Tp + j), v0, acc[r][0]);
            }
        }
        for (int r = 0; r < R; r++) {
            if (codes) {
                quant8_fma(codes + (i + r) * ldc + c, acc[r][0], s);
                if (two) quant8_fma(codes + (i + r) * ldc + c + 8, acc[r][1], s);
            } else {
                _mm256_storeu_ps(C + (i + r) * ldc + c, acc[r][0]);
                if (two) _mm256_storeu_ps(C + (i + r) * ldc + c + 8, acc[r][1]);
            }
        }
    }
}

/* gelu_quant_portable's row with fused multiply-adds, 8 columns at a time (N a multiple of 8). */
/* gelu(x) = x·Φ(x) of 8 values with fused multiply-adds: Φ from erfc's rational approximation (the
 * coefficients of autograd/fastmath.h, its polynomial in Estrin's order) and exp8_fma. */
IK_FMA_INLINE __m256 gelu8_fma(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f), half = _mm256_set1_ps(0.5f);
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 z = _mm256_mul_ps(_mm256_and_ps(x, absmask), _mm256_set1_ps((float)M_SQRT1_2));
    const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(half, z, one));
    ERFC_POLY(V8, __m256, p, t);
    const __m256 h = _mm256_mul_ps(half, _mm256_mul_ps(t, exp8_fma(_mm256_fnmadd_ps(z, z, p))));
    const __m256 cdf = _mm256_blendv_ps(_mm256_sub_ps(one, h), h, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
    return _mm256_mul_ps(x, cdf);
}

/* ---- GELU codes: a fast erf with an exact fallback ----
 * A code only depends on which side of a half-integer gelu16(x)/sq falls. gelu16_fast computes
 * x·Φ(x) with erf(y) ≈ y·P(y²)/Q(y²) on |y| ≤ 4 (clamped to [−1, 1]; P of degree 6 and Q of degree 4,
 * least-squares fitted for this kernel, |error| below 5e-7 in fp32), in about a third of gelu16's
 * operations, and |gelu16_fast(x) − gelu16(x)| ≤ BQ_GELU_FAST_ABS + BQ_GELU_FAST_REL·|x| for every float x
 * (tests/test_infer_kernels.c checks all 2³² inputs through bq_infer_gelu_fast_check). Where the fast
 * quotient lies farther than that bound over sq, plus GELU_FAST_SLACK codes for the roundings of the two
 * quotients, from every half-integer, its rounding is gelu16's code; elsewhere (and for NaN or infinite
 * inputs, whose distance is NaN) the block of 16 is recomputed by gelu16 and quant16. So the codes are
 * gelu16's bit for bit, and the fallback runs for 0.3-1.2 % of the blocks. The slack: below 256 codes the
 * fast quotient (two roundings, 1/sq and the product) is within 256·2⁻²³ = 2⁻¹⁵ of g̃/sq and the exact one
 * within 2⁻¹⁶ of gelu16(x)/sq, together under 2⁻¹⁴; at or above 256 the clamp decides alone, since a
 * passing lane's two quotients lie within half a code of each other. */
#define GELU_FAST_SLACK 0x1p-14f
static const float GELU_FAST_P[7] = {1.12837887f, 0.206113622f, 0.0513860062f, 0.00396561809f,
                                     0.000148224586f, -1.97751569e-06f, 1.96679313e-08f};
static const float GELU_FAST_Q[5] = {1.0f, 0.515992582f, 0.117553338f, 0.01488066f, 0.00102047005f};

/* 1 unless the environment sets BQ_INFER_GELU_EXACT (tests set it to compare with the exact codes). */
static int gelu_fast_on(void) { return !getenv("BQ_INFER_GELU_EXACT"); }

/* g = x·Φ(x) by the fast erf, written once for both widths (VEC V8 or V16, T its type), so that gelu8_fast
 * and gelu16_fast do the same operations in the same order and give the same bits. P and Q run in Estrin's
 * order: the GELU codes' pass is bound by this chain, and Horner's (6 and 4 dependent multiply-adds) made
 * it 9 % slower on a Zen 5 core (0.337 against 0.306 ns a value). */
#define GELU_FAST(VEC, T, g, x)                                                                                        \
    const T one_ = VEC(set1)(1.0f), half_ = VEC(set1)(0.5f);                                                           \
    const T y_ = VEC(min)(VEC(max)(VEC(mul)(x, VEC(set1)((float)M_SQRT1_2)), VEC(set1)(-4.0f)), VEC(set1)(4.0f));    \
    const T u_ = VEC(mul)(y_, y_);                                                                                     \
    const T u2_ = VEC(mul)(u_, u_), u4_ = VEC(mul)(u2_, u2_);                                                         \
    const T pa_ = VEC(fmadd)(VEC(set1)(GELU_FAST_P[1]), u_, VEC(set1)(GELU_FAST_P[0]));                                \
    const T pb_ = VEC(fmadd)(VEC(set1)(GELU_FAST_P[3]), u_, VEC(set1)(GELU_FAST_P[2]));                                \
    const T pc_ = VEC(fmadd)(VEC(set1)(GELU_FAST_P[5]), u_, VEC(set1)(GELU_FAST_P[4]));                                \
    const T p_ = VEC(fmadd)(VEC(fmadd)(VEC(set1)(GELU_FAST_P[6]), u2_, pc_), u4_, VEC(fmadd)(pb_, u2_, pa_));          \
    const T qa_ = VEC(fmadd)(VEC(set1)(GELU_FAST_Q[1]), u_, VEC(set1)(GELU_FAST_Q[0]));                                \
    const T qb_ = VEC(fmadd)(VEC(set1)(GELU_FAST_Q[3]), u_, VEC(set1)(GELU_FAST_Q[2]));                                \
    const T q_ = VEC(fmadd)(VEC(fmadd)(VEC(set1)(GELU_FAST_Q[4]), u2_, qb_), u2_, qa_);                                \
    T e_ = VEC(div)(VEC(mul)(y_, p_), q_);                                                                             \
    e_ = VEC(min)(VEC(max)(e_, VEC(set1)(-1.0f)), one_);                                                               \
    const T g = VEC(mul)(x, VEC(fmadd)(e_, half_, half_))

IK_FMA_INLINE __m256 gelu8_fast(__m256 x) {
    GELU_FAST(V8, __m256, g, x);
    return g;
}

/* gelu_codes_fast16 (below) for 8 lanes. */
IK_FMA_INLINE int gelu_codes_fast8(uint8_t *dst, __m256 x, __m256 inv, __m256 lim_a, __m256 lim_b) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 v = _mm256_mul_ps(gelu8_fast(x), inv);
    const __m256 r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 room = _mm256_sub_ps(_mm256_set1_ps(0.5f), _mm256_and_ps(_mm256_sub_ps(v, r), absmask));
    const __m256 lim = _mm256_fmadd_ps(_mm256_and_ps(x, absmask), lim_b, lim_a);
    if (_mm256_movemask_ps(_mm256_cmp_ps(room, lim, _CMP_GT_OQ)) != 0xff) return 0;
    const __m256 c = _mm256_min_ps(_mm256_max_ps(r, _mm256_set1_ps(-128.0f)), _mm256_set1_ps(127.0f));
    const __m256i i = _mm256_add_epi32(_mm256_cvtps_epi32(c), _mm256_set1_epi32(128));
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64((__m128i *)dst, _mm_packus_epi16(w, w));
    return 1;
}

/* The codes of GELU(dequant(acc)) at scale sq, 8 columns at a time (N a multiple of 8): gelu_codes_fast8
 * where fast is set, gelu8_fma and quant8_fma where it is not or where the fast path declines. */
IK_FMA static void gelu_quant_rows_fma(uint8_t *codes, const int32_t *acc, const int32_t *comp, const float *scale,
                                       const float *bias, float sq, int64_t M, int64_t N, int64_t ldc, int fast) {
    const __m256 s = _mm256_set1_ps(sq), inv = _mm256_set1_ps(1.0f / sq);
    const __m256 lim_a = _mm256_set1_ps(BQ_GELU_FAST_ABS / sq + GELU_FAST_SLACK);
    const __m256 lim_b = _mm256_set1_ps(BQ_GELU_FAST_REL / sq);
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n += 8) {
            const __m256i a = _mm256_sub_epi32(_mm256_loadu_si256((const __m256i *)(acc + m * N + n)),
                                               _mm256_loadu_si256((const __m256i *)(comp + n)));
            const __m256 x =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(a), _mm256_loadu_ps(scale + n), _mm256_loadu_ps(bias + n));
            if (!fast || !gelu_codes_fast8(codes + m * ldc + n, x, inv, lim_a, lim_b))
                quant8_fma(codes + m * ldc + n, gelu8_fma(x), s);
        }
}

/* gelu_pair_512 (below) for 8 lanes (n a multiple of 8). */
IK_FMA static void gelu_pair_fma(float *fast, float *exact, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        _mm256_storeu_ps(fast + i, gelu8_fast(v));
        _mm256_storeu_ps(exact + i, gelu8_fma(v));
    }
}

/* Kt (d, Tp) = kᵀ for the head block k (T, d), zero in the padding columns: 8×8 blocks, then the tail. */
IK_FMA static void transpose_all_fma(float *Kt, int64_t Tp, const float *k, int64_t T, int64_t d) {
    const int64_t T8 = T / 8 * 8;
    transpose_fma(Kt, Tp, k, d, T8, d);
    transpose_tail(Kt, Tp, k, d, T8, T, d);
}

/* S (T rows, leading dim Tp) = q (T, d) · Kt (d, Tp), 4 query rows at a time. */
IK_FMA static void scores_all_fma(float *S, int64_t Tp, const float *q, const float *Kt, int64_t T, int64_t d) {
    int64_t i = 0;
    for (; i + 4 <= T; i += 4) scores_rows_fma(S + i * Tp, Tp, q + i * d, d, Kt, d, 4);
    for (; i < T; i++) scores_rows_fma(S + i * Tp, Tp, q + i * d, d, Kt, d, 1);
}

/* The context's first Q rows (Q, d) = P (Q rows, leading dim Tp) · V (T, d) as codes at scale sq when
 * codes is not NULL, else as fp32 to C; either with leading dim ldc. */
IK_FMA static void context_all_fma(uint8_t *codes, float *C, int64_t ldc, const float *S, int64_t Tp,
                                   const float *V, int64_t T, int64_t d, float sq, int64_t Q) {
    int64_t i = 0;
    for (; i + 4 <= Q; i += 4) context_rows_fma(codes, C, ldc, i, S, Tp, V, d, T, d, sq, 4);
    for (; i < Q; i++) context_rows_fma(codes, C, ldc, i, S, Tp, V, d, T, d, sq, 1);
}

/* The attention of one (batch, head) pair on AVX2 + FMA, its query, key and value (T, d) each already at
 * Kt + d·Tp + T·Tp and the next two pad16(T·d) blocks: scores, softmax (softmax_row's bits), context
 * rows written as codes at scale sq when codes is not NULL, else as fp32 to C (leading dim ldc). */
IK_FMA static void attn_core_fma(uint8_t *codes, float *C, int64_t ldc, const float *mrow, float *Kt, float scale,
                                 float sq, int64_t T, int64_t d, int64_t Q) {
    const int64_t Tp = pad16(T);
    float *S = Kt + d * Tp, *q = S + T * Tp, *k = q + pad16(T * d), *v = k + pad16(T * d);
    transpose_all_fma(Kt, Tp, k, T, d);
    scores_all_fma(S, Tp, q, Kt, Q, d);
    for (int64_t i = 0; i < Q; i++) {
        softmax_row_fma(S + i * Tp, mrow, scale, T);
    }
    context_all_fma(codes, C, ldc, S, Tp, v, T, d, sq, Q);
}

/* One (batch, head) pair on AVX2 + FMA: its query, key and value loaded (here, so that the loads get
 * the AVX2 code too), then attn_core_fma into codes or C (leading dim H). */
IK_FMA static void attn_head_fma(uint8_t *codes, float *C, const AttnIn *in, int64_t b, int64_t h, float *Kt) {
    load_head(Kt, in, b, h);
    attn_core_fma(codes, C, in->ldo, mask_row(in, b), Kt, in->scale, in->sq, in->T, in->d, in->Q);
}

/* x = gelu(x + bias) in place, gelu_quant_rows_fma's GELU, 8 columns at a time (N a multiple of 8). */
IK_FMA static void bias_gelu_rows_fma(float *x, const float *bias, int64_t M, int64_t N) {
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n += 8)
            _mm256_storeu_ps(x + m * N + n,
                             gelu8_fma(_mm256_add_ps(_mm256_loadu_ps(x + m * N + n), _mm256_loadu_ps(bias + n))));
}

/* bias_gelu_rows_fma's values as bf16 words into h (N a multiple of 8): each block of up to 256 columns
 * goes through a buffer in L1, GELU first and then autograd/gemm.h's conversion (one loop doing both ran
 * slower). */
IK_FMA static void bias_gelu_bf16_rows_fma(uint16_t *h, const float *x, const float *bias, int64_t M, int64_t N) {
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n0 = 0; n0 < N; n0 += 256) {
            float g[256];
            const int64_t nb = N - n0 < 256 ? N - n0 : 256;
            for (int64_t n = 0; n < nb; n += 8)
                _mm256_storeu_ps(g + n, gelu8_fma(_mm256_add_ps(_mm256_loadu_ps(x + m * N + n0 + n),
                                                                _mm256_loadu_ps(bias + n0 + n))));
            bq_bf16_words(h + m * N + n0, g, nb);
        }
}

/* ---- AVX-512: the same kernels 16 lanes wide ----
 * Every lane runs the AVX2 kernels' operations in their order (the products' multiply-add chains over
 * the head dimension or the keys, the dequantization, GELU, exp and the code conversion), and the
 * softmax sums its 16-wide blocks into the AVX2 kernel's 8 lanes, low half then high half. So the
 * AVX-512 kernels give the AVX2 kernels' bits; they only do twice the work per instruction
 * (tests/test_infer_kernels.c compares the two bit for bit). */
#define IK_512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))
#define IK_512_INLINE                                                                                                  \
    static inline __attribute__((always_inline, target("avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")))

/* The engine's dequantization of 16 accumulators, (a − comp)·scale + bias with one fused multiply-add, as
 * the AVX2 kernels compute it. */
IK_512_INLINE __m512 dequant16_fma(const int32_t *a, const int32_t *comp, const float *scale, const float *bias) {
    const __m512i q = _mm512_sub_epi32(_mm512_loadu_si512(a), _mm512_loadu_si512(comp));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), _mm512_loadu_ps(scale), _mm512_loadu_ps(bias));
}

/* quant8_fma for 16 lanes. */
IK_512_INLINE void quant16(uint8_t *dst, __m512 x, __m512 s) {
    __m512 v = _mm512_div_ps(x, s);
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);
    v = _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-128.0f)), _mm512_set1_ps(127.0f));
    const __m512i i = _mm512_add_epi32(
        _mm512_cvtps_epi32(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)),
        _mm512_set1_epi32(128));
    _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(i));
}

/* exp8_fma for 16 lanes, for x ≤ 88 (or NaN), as the softmax's x − max and GELU's −z² + P(t) are: the
 * upper clamp is dropped and the power of two applied by scalef (p·2ⁿ is exact, or below 2⁻¹²⁶ rounded
 * once as exp8_fma's multiply rounds it), which gives exp8_fma's bits. */
IK_512_INLINE __m512 exp16(__m512 x) {
    const __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    EXP_POLY(V16, __m512, p, r);
    const __m512 y = _mm512_scalef_ps(p, n);
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ), _mm512_setzero_ps());
}

/* gelu8_fma for 16 lanes. */
IK_512_INLINE __m512 gelu16(__m512 x) {
    const __m512 one = _mm512_set1_ps(1.0f), half = _mm512_set1_ps(0.5f);
    const __m512 z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps((float)M_SQRT1_2));
    const __m512 t = _mm512_div_ps(one, _mm512_fmadd_ps(half, z, one));
    ERFC_POLY(V16, __m512, p, t);
    const __m512 h = _mm512_mul_ps(half, _mm512_mul_ps(t, exp16(_mm512_fnmadd_ps(z, z, p))));
    const __m512 cdf =
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_sub_ps(one, h), h);
    return _mm512_mul_ps(x, cdf);
}

/* GELU of 16 lanes by the fast erf (GELU_FAST). */
IK_512_INLINE __m512 gelu16_fast(__m512 x) {
    GELU_FAST(V16, __m512, g, x);
    return g;
}

/* 16 codes of gelu16_fast(x) at scale sq (inv = 1/sq, lim_a = BQ_GELU_FAST_ABS/sq + GELU_FAST_SLACK, lim_b =
 * BQ_GELU_FAST_REL/sq) where every lane is provably gelu16's code; returns 0 (and writes nothing) where
 * one is not. */
IK_512_INLINE int gelu_codes_fast16(uint8_t *dst, __m512 x, __m512 inv, __m512 lim_a, __m512 lim_b) {
    const __m512 v = _mm512_mul_ps(gelu16_fast(x), inv);
    const __m512 r = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 room = _mm512_sub_ps(_mm512_set1_ps(0.5f), _mm512_abs_ps(_mm512_sub_ps(v, r)));
    const __m512 lim = _mm512_fmadd_ps(_mm512_abs_ps(x), lim_b, lim_a);
    if (_mm512_cmp_ps_mask(room, lim, _CMP_GT_OQ) != 0xffff) return 0;
    const __m512 c = _mm512_min_ps(_mm512_max_ps(r, _mm512_set1_ps(-128.0f)), _mm512_set1_ps(127.0f));
    const __m512i i = _mm512_add_epi32(_mm512_cvtps_epi32(c), _mm512_set1_epi32(128));
    _mm_storeu_si128((__m128i *)dst, _mm512_cvtepi32_epi8(i));
    return 1;
}

/* fast[i] = gelu16_fast(x[i]) and exact[i] = gelu16(x[i]) for n values (n a multiple of 16), for
 * bq_infer_gelu_fast_check. */
IK_512 static void gelu_pair_512(float *fast, float *exact, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        _mm512_storeu_ps(fast + i, gelu16_fast(v));
        _mm512_storeu_ps(exact + i, gelu16(v));
    }
}

/* acc[r][v] = Σ_k a[r·lda + k] · b[k·ldb + 16v] for rows r < R and blocks of 16 columns v < V (R·V ≤ 16),
 * k < K: one fused multiply-add chain per output, in k's order, as the AVX2 kernels run it; the tile only
 * sets how many chains run side by side (16 fill both FMA pipes' latency with room for the operands). */
IK_512_INLINE void mm_tile_512(__m512 acc[8][4], const float *a, int64_t lda, const float *b, int64_t ldb, int64_t K,
                               const int R, const int V) {
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) acc[r][v] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512 bv[4];
        for (int v = 0; v < V; v++) bv[v] = _mm512_loadu_ps(b + k * ldb + 16 * v);
        for (int r = 0; r < R; r++) {
            const __m512 ab = _mm512_set1_ps(a[r * lda + k]);
            for (int v = 0; v < V; v++) acc[r][v] = _mm512_fmadd_ps(ab, bv[v], acc[r][v]);
        }
    }
}

/* R (1..4) rows of S = Q·Kt, 64 keys at a time, then 16 at a time. */
IK_512_INLINE void scores_rows_512(float *S, int64_t Tp, const float *q, int64_t ldq, const float *Kt, int64_t d,
                                   const int R) {
    __m512 acc[8][4];
    int64_t j = 0;
    for (; j + 64 <= Tp; j += 64) {
        mm_tile_512(acc, q, ldq, Kt + j, Tp, d, R, 4);
        for (int r = 0; r < R; r++)
            for (int v = 0; v < 4; v++) _mm512_storeu_ps(S + r * Tp + j + 16 * v, acc[r][v]);
    }
    for (; j < Tp; j += 16) {
        mm_tile_512(acc, q, ldq, Kt + j, Tp, d, R, 1);
        for (int r = 0; r < R; r++) _mm512_storeu_ps(S + r * Tp + j, acc[r][0]);
    }
}

/* context_rows_fma with 16-lane blocks on R (1..8) rows from row i: d columns 32 or 16 at a time (d a
 * multiple of 16). */
IK_512_INLINE void context_rows_512(uint8_t *codes, float *C, int64_t ldc, int64_t i, const float *S, int64_t Tp,
                                    const float *V, int64_t ldv, int64_t T, int64_t d, float sq, const int R) {
    const __m512 s = _mm512_set1_ps(sq);
    __m512 acc[8][4];
    for (int64_t c = 0; c < d; c += 16) {
        const int two = c + 32 <= d;
        if (two) mm_tile_512(acc, S + i * Tp, Tp, V + c, ldv, T, R, 2);
        else mm_tile_512(acc, S + i * Tp, Tp, V + c, ldv, T, R, 1);
        for (int r = 0; r < R; r++)
            for (int v = 0; v < 1 + two; v++) {
                if (codes) quant16(codes + (i + r) * ldc + c + 16 * v, acc[r][v], s);
                else _mm512_storeu_ps(C + (i + r) * ldc + c + 16 * v, acc[r][v]);
            }
        c += 16 * two; /* with the loop's 16: past both blocks (this form compiles to the faster loop) */
    }
}

/* The running sum s of autograd/fastmath.h row_sum's 8 lanes, with the 16 values of x added in its order
 * (the low 8, then the high 8). */
IK_512_INLINE __m256 sum8_add16(__m256 s, __m512 x) {
    return _mm256_add_ps(_mm256_add_ps(s, _mm512_castps512_ps256(x)), _mm512_extractf32x8_ps(x, 1));
}

/* row_sum's pairwise combination of its 8 lanes. */
IK_512_INLINE float sum8_total(__m256 s) {
    float l[8];
    _mm256_storeu_ps(l, s);
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

/* exp_fast of 16 lanes in the portable kernel's operations (no fused multiply-add; the fake-quant kernels
 * below use it, and the max and min take the bound as the first operand, so a NaN lane keeps its NaN as
 * the scalar compares do). */
IK_512_INLINE __m512 exp16_exact(__m512 x) {
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 xc = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(_mm512_set1_ps(-87.3f), x));
    const __m512 n =
        _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)), magic), magic);
    __m512 r = _mm512_sub_ps(xc, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
    r = _mm512_sub_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(-2.12194440e-4f)));
    static const float cf[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f};
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    for (int i = 0; i < 7; i++) p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(cf[i]));
    const __m512 nz = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(n, n, _CMP_ORD_Q), n);
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(nz), _mm512_set1_epi32(127)), 23);
    __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ), _mm512_setzero_ps());
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_GT_OQ), _mm512_set1_ps(INFINITY));
}

/* fq_code of 16 lanes: clamp(x/s) to [lo, hi], rounded as rne_small rounds (fq_code_of's operations). */
IK_512_INLINE __m512 fq_code16(__m512 x, BqFq q) {
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    __m512 v = _mm512_div_ps(x, _mm512_set1_ps(q.s));
    v = _mm512_min_ps(_mm512_set1_ps(q.hi), _mm512_max_ps(_mm512_set1_ps(q.lo), v));
    return _mm512_sub_ps(_mm512_add_ps(v, magic), magic);
}

/* The softmax of four rows (leading dim ldy, T a multiple of 16) whose masked, scaled scores are in y and
 * whose lane maxima are in mx: exp of the differences from each row's max (exp16, or exp16_exact where
 * exact), the sums in 8 lanes, and the normalized values, or their codes on the grid fp where fp is given. */
IK_512_INLINE void softmax_rows_tail_512(float *y, int64_t ldy, const __m512 mx[4], int64_t T, const int exact,
                                         const BqFq *fp) {
    __m512 m[4], inv[4];
    __m256 sum[4];
    for (int r = 0; r < 4; r++) m[r] = _mm512_set1_ps(_mm512_reduce_max_ps(mx[r])), sum[r] = _mm256_setzero_ps();
    for (int64_t j = 0; j < T; j += 16)
        for (int r = 0; r < 4; r++) {
            const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(y + r * ldy + j), m[r]);
            const __m512 e = exact ? exp16_exact(x) : exp16(x);
            _mm512_storeu_ps(y + r * ldy + j, e);
            sum[r] = sum8_add16(sum[r], e);
        }
    for (int r = 0; r < 4; r++) inv[r] = _mm512_set1_ps(1.0f / sum8_total(sum[r]));
    for (int64_t j = 0; j < T; j += 16)
        for (int r = 0; r < 4; r++) {
            const __m512 p = _mm512_mul_ps(_mm512_loadu_ps(y + r * ldy + j), inv[r]);
            _mm512_storeu_ps(y + r * ldy + j, fp ? fq_code16(p, *fp) : p);
        }
}

/* softmax_row_fma 16 lanes wide (T a multiple of 16) on 4 rows of y (row stride ldy) at once: each row gets
 * exactly the single-row operations, in their order, with its sum in the AVX2 kernel's 8 lanes; the rows
 * only interleave, so that one row's max, exp and sum chains overlap the others' (5-9 % off the attention
 * of bench_int8 on a Zen 5). */
IK_512_INLINE void softmax_rows_512(float *y, int64_t ldy, const float *mrow, float scale, int64_t T) {
    enum { R = 4 };
    const __m512 sc = _mm512_set1_ps(scale), one = _mm512_set1_ps(1.0f), mv = _mm512_set1_ps(-FLT_MAX);
    __m512 mx[4];
    for (int r = 0; r < R; r++) mx[r] = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < T; j += 16) {
        const __m512 mt = mrow ? _mm512_mul_ps(_mm512_sub_ps(one, _mm512_loadu_ps(mrow + j)), mv) : one;
        for (int r = 0; r < R; r++) {
            __m512 v = _mm512_mul_ps(sc, _mm512_loadu_ps(y + r * ldy + j));
            if (mrow) v = _mm512_add_ps(v, mt);
            _mm512_storeu_ps(y + r * ldy + j, v);
            mx[r] = _mm512_max_ps(mx[r], v);
        }
    }
    softmax_rows_tail_512(y, ldy, mx, T, 0, NULL);
}

/* S = q · Kt, 4 query rows at a time. */
IK_512 static void scores_all_512(float *S, int64_t Tp, const float *q, const float *Kt, int64_t T, int64_t d) {
    int64_t i = 0;
    for (; i + 4 <= T; i += 4) scores_rows_512(S + i * Tp, Tp, q + i * d, d, Kt, d, 4);
    for (; i < T; i++) scores_rows_512(S + i * Tp, Tp, q + i * d, d, Kt, d, 1);
}

/* context_all_fma with context_rows_512 (d a multiple of 16). */
IK_512 static void context_all_512(uint8_t *codes, float *C, int64_t ldc, const float *S, int64_t Tp,
                                   const float *V, int64_t T, int64_t d, float sq, int64_t Q) {
    int64_t i = 0;
    for (; i + 8 <= Q; i += 8) context_rows_512(codes, C, ldc, i, S, Tp, V, d, T, d, sq, 8);
    for (; i < Q; i++) context_rows_512(codes, C, ldc, i, S, Tp, V, d, T, d, sq, 1);
}

/* load_head for the 16-lane kernels: dequant_head's rows, parts and operations (a separate multiply and
 * add) with the head's compensations, scales and biases held in registers (d a multiple of 16, at most 64),
 * which dequant_head reloads for every row since its stores might alias them (8 % off a head's attention
 * on a Zen 5 core at d = 32, 6 % at d = 64); load_head elsewhere. */
IK_512 static void load_head_512(float *Kt, const AttnIn *in, int64_t b, int64_t h) {
    const int64_t T = in->T, d = in->d, V = d / 16;
    const BqQkvSums *s = in->sums;
    if (!s || d % 16 || V > 4) {
        load_head(Kt, in, b, h);
        return;
    }
    float *dst = Kt + d * pad16(T) + T * pad16(T);
    const int64_t Td = pad16(T * d), ld = s->ld, c0 = h * d, r0 = b * T;
    __m512i cm[3][4];
    __m512 sc[3][4], bs[3][4];
    for (int p = 0; p < 3; p++)
        for (int64_t v = 0; v < V; v++) {
            cm[p][v] = _mm512_loadu_si512(s->comp[p] + c0 + 16 * v);
            sc[p][v] = _mm512_loadu_ps(s->scale[p] + c0 + 16 * v);
            bs[p][v] = _mm512_loadu_ps(s->bias[p] + c0 + 16 * v);
        }
    for (int64_t t = 0; t < T; t++)
        for (int p = 0; p < 3; p++) {
            const int32_t *a = s->acc[p] + (r0 + t) * ld + c0;
            for (int64_t v = 0; v < V && t + PREFETCH_ROWS < T; v++)
                _mm_prefetch((const char *)(a + PREFETCH_ROWS * ld + 16 * v), _MM_HINT_T0);
            float *o = dst + p * Td + t * d;
            for (int64_t v = 0; v < V; v++) {
                const __m512 q = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(a + 16 * v), cm[p][v]));
                _mm512_storeu_ps(o + 16 * v, _mm512_add_ps(_mm512_mul_ps(q, sc[p][v]), bs[p][v]));
            }
        }
}

/* attn_head_fma with the 16-lane kernels (T and d multiples of 16): the loads compiled for AVX-512, the
 * transpose of AVX2. */
IK_512 static void attn_head_512(uint8_t *codes, float *C, const AttnIn *in, int64_t b, int64_t h, float *Kt) {
    const int64_t T = in->T, d = in->d, Tp = pad16(T);
    const float *mrow = mask_row(in, b);
    float *S = Kt + d * Tp, *q = S + T * Tp, *k = q + pad16(T * d), *v = k + pad16(T * d);
    load_head_512(Kt, in, b, h);
    transpose_all_fma(Kt, Tp, k, T, d);
    scores_all_512(S, Tp, q, Kt, in->Q, d);
    for (int64_t i = 0; i < in->Q; i += 4) softmax_rows_512(S + i * Tp, Tp, mrow, in->scale, T); /* Q: T or 8 */
    context_all_512(codes, C, in->ldo, S, Tp, v, T, d, in->sq, in->Q);
}

/* bias_gelu_rows_fma, 16 columns at a time (N a multiple of 16). */
IK_512 static void bias_gelu_rows_512(float *x, const float *bias, int64_t M, int64_t N) {
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n += 16)
            _mm512_storeu_ps(x + m * N + n,
                             gelu16(_mm512_add_ps(_mm512_loadu_ps(x + m * N + n), _mm512_loadu_ps(bias + n))));
}

/* ---- AVX-512 kernels with fake quantizers (ort, qdqbert) ----
 * These replicate the portable kernels' bits (no fused multiply-add: autograd/fastmath.h's exp_fast,
 * erfc_pos and fq_code_of, operation for operation, with exp16_exact and fq_code16 above), since fake
 * quant's forward runs those. The max and min below take the bound as the first operand, so a NaN lane
 * keeps its NaN as the scalar compares do. */

/* gelu (erfc_pos, exp_fast) of 16 lanes. */
IK_512_INLINE __m512 gelu16_exact(__m512 x) {
    static const float cf[9] = {-0.82215223f, 1.48851587f, -1.13520398f, 0.27886807f, -0.18628806f,
                                0.09678418f,  0.37409196f, 1.00002368f,  -1.26551223f};
    const __m512 one = _mm512_set1_ps(1.0f), half = _mm512_set1_ps(0.5f);
    const __m512 z = _mm512_mul_ps(_mm512_abs_ps(x), _mm512_set1_ps((float)M_SQRT1_2));
    const __m512 t = _mm512_div_ps(one, _mm512_add_ps(one, _mm512_mul_ps(half, z)));
    __m512 p = _mm512_set1_ps(0.17087277f);
    for (int i = 0; i < 9; i++) p = _mm512_add_ps(_mm512_mul_ps(p, t), _mm512_set1_ps(cf[i]));
    const __m512 mz = _mm512_xor_ps(z, _mm512_set1_ps(-0.0f));
    const __m512 h = _mm512_mul_ps(half, _mm512_mul_ps(t, exp16_exact(_mm512_add_ps(_mm512_mul_ps(mz, z), p))));
    const __m512 cdf =
        _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ), h, _mm512_sub_ps(one, h));
    return _mm512_mul_ps(x, cdf);
}

/* fq_apply of 16 lanes. */
IK_512_INLINE __m512 fq_apply16(__m512 x, BqFq q) {
    return q.s > 0.0f ? _mm512_mul_ps(fq_code16(x, q), _mm512_set1_ps(q.s)) : x;
}

/* The portable dequantization (a separate multiply and add) of 16 accumulators. */
IK_512_INLINE __m512 dequant16(const int32_t *a, const int32_t *comp, const float *scale, const float *bias) {
    const __m512 q = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(a), _mm512_loadu_si512(comp)));
    return _mm512_add_ps(_mm512_mul_ps(q, _mm512_loadu_ps(scale)), _mm512_loadu_ps(bias));
}

/* gelu_quant_rows_fma's codes, 64 or 16 columns at a time (N a multiple of 16), by gelu_codes_fast16 where
 * fast is set, with gelu16 and quant16 where it is not or where the fast path declines. With exact set the
 * operations are the portable kernel's instead (dequant16, gelu16_exact: qdqbert's GELU codes); the fast
 * path's bound holds against both (bq_infer_gelu_fast_check). */
IK_512_INLINE void gelu_quant_rows_512_as(uint8_t *codes, const int32_t *acc, const int32_t *comp,
                                          const float *scale, const float *bias, float sq, int64_t M, int64_t N, int64_t ldc,
                                          int fast, const int exact) {
    const __m512 s = _mm512_set1_ps(sq), inv = _mm512_set1_ps(1.0f / sq);
    const __m512 lim_a = _mm512_set1_ps(BQ_GELU_FAST_ABS / sq + GELU_FAST_SLACK);
    const __m512 lim_b = _mm512_set1_ps(BQ_GELU_FAST_REL / sq);
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++) {
        int64_t n = 0;
        for (; n + 64 <= N; n += 64) {
            __m512 x[4];
            int ok[4];
            for (int u = 0; u < 4; u++) {
                const int64_t o = n + 16 * u;
                x[u] = exact ? dequant16(acc + m * N + o, comp + o, scale + o, bias + o)
                             : dequant16_fma(acc + m * N + o, comp + o, scale + o, bias + o);
            }
            for (int u = 0; u < 4; u++)
                ok[u] = fast && gelu_codes_fast16(codes + m * ldc + n + 16 * u, x[u], inv, lim_a, lim_b);
            for (int u = 0; u < 4; u++)
                if (!ok[u]) quant16(codes + m * ldc + n + 16 * u, exact ? gelu16_exact(x[u]) : gelu16(x[u]), s);
        }
        for (; n < N; n += 16) {
            const __m512 x = exact ? dequant16(acc + m * N + n, comp + n, scale + n, bias + n)
                                   : dequant16_fma(acc + m * N + n, comp + n, scale + n, bias + n);
            if (!fast || !gelu_codes_fast16(codes + m * ldc + n, x, inv, lim_a, lim_b))
                quant16(codes + m * ldc + n, exact ? gelu16_exact(x) : gelu16(x), s);
        }
    }
}

IK_512 static void gelu_quant_rows_512(uint8_t *codes, const int32_t *acc, const int32_t *comp, const float *scale,
                                       const float *bias, float sq, int64_t M, int64_t N, int64_t ldc, int fast) {
    gelu_quant_rows_512_as(codes, acc, comp, scale, bias, sq, M, N, ldc, fast, 0);
}

/* exact[i] = gelu16_exact(x[i]) (the portable GELU's bits) for n values (n a multiple of 16), for
 * bq_infer_gelu_fast_check. */
IK_512 static void gelu_exact_512(float *exact, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(exact + i, gelu16_exact(_mm512_loadu_ps(x + i)));
}

IK_512 static void gelu_quant_rows_exact_512(uint8_t *codes, const int32_t *acc, const int32_t *comp,
                                             const float *scale, const float *bias, float sq, int64_t M, int64_t N, int64_t ldc,
                                             int fast) {
    gelu_quant_rows_512_as(codes, acc, comp, scale, bias, sq, M, N, ldc, fast, 1);
}

/* bq_infer_gelu_fq_quant 16 columns at a time (N a multiple of 16). */
IK_512 static void gelu_fq_quant_512(uint8_t *codes, const int32_t *acc, const int32_t *comp, const float *scale,
                                     const float *bias, BqFq fin, BqFq fout, float sq, int64_t M, int64_t N, int64_t ldc) {
    const __m512 s = _mm512_set1_ps(sq);
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n += 16) {
            const __m512 x = fq_apply16(dequant16(acc + m * N + n, comp + n, scale + n, bias + n), fin);
            quant16(codes + m * ldc + n, fq_apply16(gelu16_exact(x), fout), s);
        }
}

/* The lookup of a BqGeluFq table, 32 columns at a time (N a multiple of 16): fin's code of each dequantized sum as
 * a 16-bit index, the table's 256 entries in eight registers of 32 words, looked up by four word permutes
 * (entries 0-63, 64-127, 128-191, 192-255) and two blends on the index's bits 6 and 7 (AVX512-BW, which
 * every CPU of these kernels has); NaN lanes get entry nt. */
IK_512 static void gelu_fq_lut_512(uint8_t *codes, const int32_t *acc, const int32_t *comp, const float *scale,
                                   const float *bias, BqFq fin, const int32_t *tab, int nt, int64_t M, int64_t N, int64_t ldc) {
    int16_t t16[256];
    for (int i = 0; i < 256; i++) t16[i] = (int16_t)(i < nt ? tab[i] : 0);
    __m512i t[8];
    for (int i = 0; i < 8; i++) t[i] = _mm512_loadu_si512(t16 + 32 * i);
    const __m512i lo = _mm512_set1_epi32((int32_t)fin.lo), nanv = _mm512_set1_epi16((int16_t)tab[nt]);
    const __m512i b6 = _mm512_set1_epi16(64), b7 = _mm512_set1_epi16(128);
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N;) {
            const int parts = N - n >= 32 ? 2 : 1;
            __m256i half[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
            __mmask32 nan = 0;
            for (int u = 0; u < parts; u++) {
                const int64_t o = n + 16 * u;
                const __m512 c = fq_code16(dequant16(acc + m * N + o, comp + o, scale + o, bias + o), fin);
                nan |= (__mmask32)_mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q) << (16 * u);
                half[u] = _mm512_cvtepi32_epi16(_mm512_sub_epi32(_mm512_cvtps_epi32(c), lo));
            }
            const __m512i idx = _mm512_inserti64x4(_mm512_castsi256_si512(half[0]), half[1], 1);
            const __mmask32 k6 = _mm512_test_epi16_mask(idx, b6), k7 = _mm512_test_epi16_mask(idx, b7);
            const __m512i low = _mm512_mask_blend_epi16(k6, _mm512_permutex2var_epi16(t[0], idx, t[1]),
                                                        _mm512_permutex2var_epi16(t[2], idx, t[3]));
            const __m512i high = _mm512_mask_blend_epi16(k6, _mm512_permutex2var_epi16(t[4], idx, t[5]),
                                                         _mm512_permutex2var_epi16(t[6], idx, t[7]));
            const __m512i r = _mm512_mask_mov_epi16(_mm512_mask_blend_epi16(k7, low, high), nan, nanv);
            const __m256i bytes = _mm512_cvtepi16_epi8(r);
            if (parts == 2) _mm256_storeu_si256((__m256i *)(codes + m * ldc + n), bytes);
            else _mm_storeu_si128((__m128i *)(codes + m * ldc + n), _mm256_castsi256_si128(bytes));
            n += 16 * parts;
        }
}

/* Rows [m, m + R) (R 1..4) of residual_layernorm_fq_512, 16 columns at a time, in the portable kernel's
 * operations: the dequantization with a separate multiply and add, the places' fake quantizers when fqon
 * is set (an empty place passes its value), ln_row_forward's two sums in its 8 lanes and order, its
 * normalization left to right, quant_u8's codes. Each row gets exactly the single-row operations in their
 * order; the rows only interleave, so that one row's chains of sums overlap the others'. fqon is a
 * constant in each caller, so the loops without places carry no test of them (with the tests, bench_int8's
 * epilogue section of the cpu scheme took 2-6 % longer on Zen 5). */
IK_512_INLINE void resid_ln_rows_512(float *out, uint8_t *codes, const int32_t *acc, const int32_t *comp,
                                     const float *scale, const float *bias, const float *resid, const BqFq *f,
                                     const float *lnw, const float *lnb, float eps, __m512 s, int64_t m, int64_t N,
                                     const int R, const int fqon) {
    __m256 s8[4];
    __m512 mean[4], rstd[4];
    for (int r = 0; r < R; r++) s8[r] = _mm256_setzero_ps();
    for (int64_t n = 0; n < N; n += 16)
        for (int r = 0; r < R; r++) {
            const int64_t o = (m + r) * N + n;
            __m512 v = dequant16(acc + o, comp + n, scale + n, bias + n);
            const __m512 x = _mm512_loadu_ps(resid + o);
            if (fqon)
                v = fq_apply16(_mm512_add_ps(fq_apply16(v, f[BQ_FQ_LOCAL]), fq_apply16(x, f[BQ_FQ_SKIP])),
                               f[BQ_FQ_SUM]);
            else
                v = _mm512_add_ps(v, x);
            _mm512_storeu_ps(out + o, v);
            s8[r] = sum8_add16(s8[r], v);
        }
    for (int r = 0; r < R; r++) mean[r] = _mm512_set1_ps(sum8_total(s8[r]) / (float)N), s8[r] = _mm256_setzero_ps();
    for (int64_t n = 0; n < N; n += 16)
        for (int r = 0; r < R; r++) {
            const __m512 xc = _mm512_sub_ps(_mm512_loadu_ps(out + (m + r) * N + n), mean[r]);
            s8[r] = sum8_add16(s8[r], _mm512_mul_ps(xc, xc));
        }
    for (int r = 0; r < R; r++) rstd[r] = _mm512_set1_ps(1.0f / sqrtf(sum8_total(s8[r]) / (float)N + eps));
    for (int64_t n = 0; n < N; n += 16)
        for (int r = 0; r < R; r++) {
            float *y = out + (m + r) * N + n;
            __m512 v = _mm512_add_ps(
                _mm512_mul_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(y), mean[r]), rstd[r]),
                              _mm512_loadu_ps(lnw + n)),
                _mm512_loadu_ps(lnb + n));
            if (fqon) v = fq_apply16(v, f[BQ_FQ_LN]);
            _mm512_storeu_ps(y, v);
            if (codes) quant16(codes + (m + r) * N + n, v, s);
        }
}

/* bq_infer_residual_layernorm_fq 16 columns at a time (N a multiple of 16), four rows at a time
 * (resid_ln_rows_512). With f NULL (every place empty) it is bq_infer_residual_layernorm's AVX-512 kernel:
 * fq_apply passes a value through an empty place unchanged, so leaving the places out gives the same bits. */
IK_512 static void residual_layernorm_fq_512(float *out, uint8_t *codes, const int32_t *acc, const int32_t *comp,
                                             const float *scale, const float *bias, const float *resid,
                                             const BqFq *f, const float *lnw, const float *lnb, float eps, float sq,
                                             int64_t M, int64_t N) {
    const __m512 s = _mm512_set1_ps(sq);
    /* the places in a local copy, which no store to out can alias, so the loops keep them in registers
     * (unused when f is NULL) */
    BqFq fl[4] = {{0}};
    if (f) memcpy(fl, f, sizeof fl);
    const int64_t groups = (M + 3) / 4;
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t g = 0; g < groups; g++) {
        const int64_t m = 4 * g;
        const int rows = M - m < 4 ? (int)(M - m) : 4; /* the last group may be short */
        /* fqon and the row count as constants, so the whole groups' loops carry no tests */
        if (rows == 4 && f)
            resid_ln_rows_512(out, codes, acc, comp, scale, bias, resid, fl, lnw, lnb, eps, s, m, N, 4, 1);
        else if (rows == 4)
            resid_ln_rows_512(out, codes, acc, comp, scale, bias, resid, fl, lnw, lnb, eps, s, m, N, 4, 0);
        else if (f)
            resid_ln_rows_512(out, codes, acc, comp, scale, bias, resid, fl, lnw, lnb, eps, s, m, N, rows, 1);
        else
            resid_ln_rows_512(out, codes, acc, comp, scale, bias, resid, fl, lnw, lnb, eps, s, m, N, rows, 0);
    }
}

/* x[i] = fq_code(x[i], f) for n values (n a multiple of 16). */
IK_512 static void fq_codes_512(float *x, int64_t n, BqFq f) {
    for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(x + i, fq_code16(_mm512_loadu_ps(x + i), f));
}

/* Four rows of attn_head_fq's scores (leading dim ldy, T a multiple of 16), in place: scaled and
 * fake-quantized, the masked softmax with softmax_row's operations (exp_fast), the probabilities' codes.
 * Each row's operations run in its own order; the rows are interleaved so that their chains overlap. */
IK_512 static void scores_fq_rows_512(float *y, int64_t ldy, const float *mrow, float scale, float fqk, BqFq fs,
                                      BqFq fp, int64_t T) {
    enum { R = 4 };
    const __m512 sc = _mm512_set1_ps(scale), one = _mm512_set1_ps(1.0f), mv = _mm512_set1_ps(-FLT_MAX);
    const __m512 k = _mm512_set1_ps(fqk);
    __m512 mx[R];
    for (int r = 0; r < R; r++) mx[r] = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < T; j += 16) {
        const __m512 mt = mrow ? _mm512_mul_ps(_mm512_sub_ps(one, _mm512_loadu_ps(mrow + j)), mv) : one;
        for (int r = 0; r < R; r++) {
            __m512 v = _mm512_mul_ps(sc, fq_apply16(_mm512_mul_ps(_mm512_loadu_ps(y + r * ldy + j), k), fs));
            if (mrow) v = _mm512_add_ps(v, mt);
            _mm512_storeu_ps(y + r * ldy + j, v);
            mx[r] = _mm512_max_ps(v, mx[r]);
        }
    }
    softmax_rows_tail_512(y, ldy, mx, T, 1, &fp);
}

/* The context codes of attn_head_fq (d a multiple of 16): c[t·H + e] = quant_u8(fq_apply(q[t·d + e]·fpv, fc)). */
IK_512 static void context_fq_codes_512(uint8_t *c, const float *q, float fpv, BqFq fc, float sq, int64_t T, int64_t d,
                                        int64_t H) {
    const __m512 s = _mm512_set1_ps(sq), f = _mm512_set1_ps(fpv);
    for (int64_t t = 0; t < T; t++)
        for (int64_t e = 0; e < d; e += 16)
            quant16(c + t * H + e, fq_apply16(_mm512_mul_ps(_mm512_loadu_ps(q + t * d + e), f), fc), s);
}

/* ---- the fake-quant attention's two products on AVX512-VNNI ----
 * Both products of attn_head_fq multiply integer codes, and their fp32 sums are exact (every partial sum
 * is an integer below 2^24: vnni_exact), so u8·s8 dot products in int32 give the same floats at four
 * times the multiply rate. The left operand is shifted to u8 (u = c − lo) and the shift added back per
 * column: Σ c·k = Σ u·k + lo·Σ k. */
#define IK_VNNI_ISA "avx512f,avx512vl,avx512bw,avx512dq,avx512vnni,avx2,fma"
#define IK_VNNI __attribute__((target(IK_VNNI_ISA)))
#define IK_VNNI_INLINE static inline __attribute__((always_inline, target(IK_VNNI_ISA)))

/* out rows [0,R) (leading dim ldo), columns [0, 16·NC) = float(Σ_w a_r[4w..4w+3]·b[w][column] + off[column]):
 * a (R rows of 4·W bytes, leading dim lda) u8, b (W rows of 16·NC words of four s8, leading dim ldb). */
IK_VNNI_INLINE void dot_tile_vnni(float *out, int64_t ldo, const uint8_t *a, int64_t lda, const int32_t *b,
                                  int64_t ldb, const int32_t *off, int64_t W, const int R, const int NC) {
    __m512i acc[8][4];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NC; c++) acc[r][c] = _mm512_setzero_si512();
    for (int64_t w = 0; w < W; w++) {
        __m512i bv[4];
        for (int c = 0; c < NC; c++) bv[c] = _mm512_loadu_si512(b + w * ldb + 16 * c);
        for (int r = 0; r < R; r++) {
            int32_t aw;
            memcpy(&aw, a + r * lda + 4 * w, sizeof aw);
            const __m512i av = _mm512_set1_epi32(aw);
            for (int c = 0; c < NC; c++) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], av, bv[c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < NC; c++)
            _mm512_storeu_ps(out + r * ldo + 16 * c,
                             _mm512_cvtepi32_ps(_mm512_add_epi32(acc[r][c], _mm512_loadu_si512(off + 16 * c))));
}

/* dot_tile_vnni over rows [0,R) (a multiple of 8) and columns [0,N) (a multiple of 16), in tiles of 4 × 64
 * columns where N allows, else 8 × 32 or 8 × 16. */
IK_VNNI static void dot_all_vnni(float *out, int64_t ldo, const uint8_t *a, int64_t lda, const int32_t *b,
                                 int64_t ldb, const int32_t *off, int64_t R, int64_t N, int64_t W) {
    for (int64_t i = 0; i < R; i += 8)
        for (int64_t c = 0; c < N;) {
            float *o = out + i * ldo + c;
            const uint8_t *ai = a + i * lda;
            if (N - c >= 64) {
                dot_tile_vnni(o, ldo, ai, lda, b + c, ldb, off + c, W, 4, 4);
                dot_tile_vnni(o + 4 * ldo, ldo, ai + 4 * lda, lda, b + c, ldb, off + c, W, 4, 4);
                c += 64;
            } else if (N - c >= 32) {
                dot_tile_vnni(o, ldo, ai, lda, b + c, ldb, off + c, W, 8, 2);
                c += 32;
            } else {
                dot_tile_vnni(o, ldo, ai, lda, b + c, ldb, off + c, W, 8, 1);
                c += 16;
            }
        }
}

/* The codes x (n floats, a multiple of 16, integers in [lo, lo + 255]) as bytes x − lo into dst. dst may
 * start at x (the bytes then overwrite floats already read). */
IK_VNNI static void u8_codes_vnni(uint8_t *dst, const float *x, int64_t n, float lo) {
    const __m512i l = _mm512_set1_epi32((int32_t)lo);
    for (int64_t i = 0; i < n; i += 16)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm512_cvtepi32_epi8(_mm512_sub_epi32(_mm512_cvtps_epi32(_mm512_loadu_ps(x + i)), l)));
}

/* K's codes k (T, d) (s8 values) as words of four along d: k4[w·ld + j] = bytes k[j][4w..4w+3]; and
 * off[j] = lo·Σ_e k[j][e], the shift of the left operand. */
IK_VNNI static void key_words_vnni(int32_t *k4, int64_t ld, int32_t *off, const float *k, int64_t T, int64_t d,
                                   float lo) {
    for (int64_t j = 0; j < T; j++) {
        __m512i sum = _mm512_setzero_si512();
        for (int64_t e = 0; e < d; e += 16) {
            const __m512i v = _mm512_cvtps_epi32(_mm512_loadu_ps(k + j * d + e));
            const __m128i w = _mm512_cvtepi32_epi8(v);
            sum = _mm512_add_epi32(sum, v);
            k4[(e / 4 + 0) * ld + j] = _mm_extract_epi32(w, 0);
            k4[(e / 4 + 1) * ld + j] = _mm_extract_epi32(w, 1);
            k4[(e / 4 + 2) * ld + j] = _mm_extract_epi32(w, 2);
            k4[(e / 4 + 3) * ld + j] = _mm_extract_epi32(w, 3);
        }
        off[j] = (int32_t)lo * _mm512_reduce_add_epi32(sum);
    }
}

/* V's codes v (T, d) (s8 values, T a multiple of 4) as words of four along T: v4[w·d + e] = bytes
 * v[4w..4w+3][e]; and off[e] = lo·Σ_j v[j][e]. */
IK_VNNI static void value_words_vnni(int32_t *v4, int32_t *off, const float *v, int64_t T, int64_t d, float lo) {
    const __m512i m8 = _mm512_set1_epi32(0xff), l = _mm512_set1_epi32((int32_t)lo);
    for (int64_t e = 0; e < d; e += 16) {
        __m512i sum = _mm512_setzero_si512();
        for (int64_t w = 0; w < T / 4; w++) {
            const float *r = v + 4 * w * d + e;
            const __m512i r0 = _mm512_cvtps_epi32(_mm512_loadu_ps(r)), r1 = _mm512_cvtps_epi32(_mm512_loadu_ps(r + d));
            const __m512i r2 = _mm512_cvtps_epi32(_mm512_loadu_ps(r + 2 * d));
            const __m512i r3 = _mm512_cvtps_epi32(_mm512_loadu_ps(r + 3 * d));
            sum = _mm512_add_epi32(_mm512_add_epi32(sum, _mm512_add_epi32(r0, r1)), _mm512_add_epi32(r2, r3));
            __m512i x = _mm512_or_si512(_mm512_and_si512(r0, m8), _mm512_slli_epi32(_mm512_and_si512(r1, m8), 8));
            x = _mm512_or_si512(x, _mm512_slli_epi32(_mm512_and_si512(r2, m8), 16));
            _mm512_storeu_si512(v4 + w * d + e, _mm512_or_si512(x, _mm512_slli_epi32(r3, 24)));
        }
        _mm512_storeu_si512(off + e, _mm512_mullo_epi32(sum, l));
    }
}

/* 1 when have_512() holds and the CPU has AVX512-VNNI (BQ_INFER_AVX2 and BQ_INFER_PORTABLE turn it off with
 * the AVX-512 kernels). */
static int have_vnni(void);

/* attn_head_fq's products on VNNI (T and d multiples of 16; vnni_exact): the scores S (T, Tp) from the
 * codes q and k, and, after softmax_fq has turned S into the probabilities' codes, the context's sums into
 * q (T, d). The scratch Kt (4·d·Tp bytes) holds the operands; the probabilities' bytes overwrite S. */
IK_VNNI static void scores_vnni(float *S, int64_t Tp, float *Kt, const float *q, const float *k, BqFq fq, int64_t T,
                                int64_t d, int64_t Q) {
    uint8_t *q8 = (uint8_t *)Kt;
    int32_t *k4 = (int32_t *)(q8 + T * d), *off = k4 + d / 4 * Tp;
    u8_codes_vnni(q8, q, Q * d, fq.lo);
    key_words_vnni(k4, Tp, off, k, T, d, fq.lo);
    dot_all_vnni(S, Tp, q8, d, k4, Tp, off, Q, T, d / 4);
}

/* The context's first Q rows (Q a multiple of 8). */
IK_VNNI static void context_vnni(float *C, float *S, int64_t Tp, float *Kt, const float *v, BqFq fp, int64_t T,
                                 int64_t d, int64_t Q) {
    uint8_t *p8 = (uint8_t *)S;
    int32_t *v4 = (int32_t *)Kt, *off = v4 + T / 4 * d;
    for (int64_t i = 0; i < Q; i++) u8_codes_vnni(p8 + i * Tp, S + i * Tp, T, fp.lo);
    value_words_vnni(v4, off, v, T, d, fp.lo);
    dot_all_vnni(C, d, p8, Tp, v4, d, off, Q, d, T / 4);
}

/* 1 when the CPU has AVX-512 F/VL/BW/DQ and the environment sets neither BQ_INFER_PORTABLE nor
 * BQ_INFER_AVX2 (which tests set to run the AVX2 kernels on such CPUs too). */
static int have_512(void) {
    static int v = -1;
    if (v < 0)
        v = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
    return v && !getenv("BQ_INFER_PORTABLE") && !getenv("BQ_INFER_AVX2");
}

static int have_vnni(void) {
    static int v = -1;
    if (v < 0) v = __builtin_cpu_supports("avx512vnni");
    return v && have_512();
}

/* 1 when the CPU has AVX2 and FMA and the environment does not set BQ_INFER_PORTABLE (which tests
 * set to run the portable kernels on such CPUs too). */
static int have_fma(void) {
    static int v = -1;
    if (v < 0) v = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return v && !getenv("BQ_INFER_PORTABLE");
}
#else
static int have_fma(void) { return 0; }
static int have_512(void) { return 0; }
static int have_vnni(void) { return 0; }
#endif

/* scores_all_fma, portable. */
static void scores_all(float *S, int64_t Tp, const float *q, const float *Kt, int64_t T, int64_t d) {
    int64_t i = 0;
    for (; i + 4 <= T; i += 4) scores_rows(S + i * Tp, Tp, q + i * d, d, Kt, d, 4);
    for (; i < T; i++) scores_rows(S + i * Tp, Tp, q + i * d, d, Kt, d, 1);
}

/* context_all_fma, portable. */
static void context_all(uint8_t *codes, float *C, int64_t ldc, const float *S, int64_t Tp, const float *V,
                        int64_t T, int64_t d, float sq, int64_t Q) {
    int64_t i = 0;
    for (; i + 4 <= Q; i += 4) context_rows(codes, C, ldc, i, S, Tp, V, d, T, d, sq, 4);
    for (; i < Q; i++) context_rows(codes, C, ldc, i, S, Tp, V, d, T, d, sq, 1);
}

/* attn_core_fma's steps, portable (vector extensions, separate multiply and add). */
static void attn_core(uint8_t *codes, float *C, int64_t ldc, const float *mrow, float *Kt, float scale, float sq,
                      int64_t T, int64_t d, int64_t Q) {
    const int64_t Tp = pad16(T);
    float *S = Kt + d * Tp, *q = S + T * Tp, *k = q + pad16(T * d), *v = k + pad16(T * d);
    transpose_tail(Kt, Tp, k, d, 0, T, d);
    scores_all(S, Tp, q, Kt, Q, d);
    for (int64_t i = 0; i < Q; i++) softmax_row(S + i * Tp, mrow, scale, T, 1);
    context_all(codes, C, ldc, S, Tp, v, T, d, sq, Q);
}

/* One (batch, head) pair, portable: attn_head_fma's steps. */
static void attn_head(uint8_t *codes, float *C, const AttnIn *in, int64_t b, int64_t h, float *Kt) {
    load_head(Kt, in, b, h);
    attn_core(codes, C, in->ldo, mask_row(in, b), Kt, in->scale, in->sq, in->T, in->d, in->Q);
}

/* One (batch, head) pair with fake quantizers (bq_infer_attention_fq) into its codes (leading dim H), in
 * the op order of layers/bert.c attention_context: the query, key and value through their quantizers and
 * turned into codes, the scores' integer sums scaled and fake-quantized where a quantizer sits there, the
 * masked softmax (softmax_row: bq_kernel_softmax_mask_forward's bits) and its quantizer, the context's
 * integer sums scaled and fake-quantized where a quantizer sits there, then its uint8 codes at in->sq.
 * The products sum integers exactly, so isa (attn_heads: 0 portable, 1 AVX2, 2 AVX-512) and vnni (the two
 * products as u8·s8 dot products: scores_vnni, context_vnni) change nothing but speed; everything else is
 * portable arithmetic. */
IK_VEC static void attn_head_fq(uint8_t *codes, const AttnIn *in, int64_t b, int64_t h, float *Kt, int isa,
                                int vnni) {
    const int64_t T = in->T, d = in->d, Tp = pad16(T), Td = pad16(T * d), Q = in->Q;
    const BqFq *fq = in->fq;
    float *S = Kt + d * Tp, *q = S + T * Tp, *k = q + Td, *v = k + Td;
#if defined(__x86_64__) && defined(__GNUC__)
    if (isa == 2) load_head_512(Kt, in, b, h);
    else
#endif
        load_head(Kt, in, b, h);
    const int w16 = isa == 2 && T % 16 == 0; /* the AVX-512 elementwise loops (d is a multiple of 16) */
    for (int part = 0; part < 3; part++) {
        const BqFq f = fq[BQ_FQ_Q + part];
        float *x = q + part * Td;
#if defined(__x86_64__) && defined(__GNUC__)
        if (w16) {
            fq_codes_512(x, T * d, f);
            continue;
        }
#endif
        for (int64_t i = 0; i < T * d; i++) x[i] = fq_code(x[i], f);
    }
#if defined(__x86_64__) && defined(__GNUC__)
    if (vnni) scores_vnni(S, Tp, Kt, q, k, fq[BQ_FQ_Q], T, d, Q);
    if (isa && !vnni) transpose_all_fma(Kt, Tp, k, T, d);
    if (isa == 2 && !vnni) scores_all_512(S, Tp, q, Kt, Q, d);
    if (isa == 1) scores_all_fma(S, Tp, q, Kt, Q, d);
#endif
    if (!isa) {
        transpose_tail(Kt, Tp, k, d, 0, T, d);
        scores_all(S, Tp, q, Kt, Q, d);
    }
    const float fqk = fq[BQ_FQ_Q].s * fq[BQ_FQ_K].s, fpv = fq[BQ_FQ_PROBS].s * fq[BQ_FQ_V].s;
    const BqFq fs = fq[BQ_FQ_SCORES], fp = fq[BQ_FQ_PROBS], fc = fq[BQ_FQ_CONTEXT];
    const float *mrow = mask_row(in, b);
    for (int64_t i = 0; i < Q; i++) {
        float *y = S + i * Tp;
#if defined(__x86_64__) && defined(__GNUC__)
        if (w16) { /* T is a multiple of 16 (Q: T or 8): four rows at a time */
            if (i % 4 == 0) scores_fq_rows_512(y, Tp, mrow, in->scale, fqk, fs, fp, T);
            continue;
        }
#endif
        for (int64_t j = 0; j < T; j++) y[j] = fq_apply(y[j] * fqk, fs);
        softmax_row(y, mrow, in->scale, T, 0);
        for (int64_t j = 0; j < T; j++) y[j] = fq_code(y[j], fp);
    }
    /* the context's sums (Q, d) over the query block, which the scores no longer need */
#if defined(__x86_64__) && defined(__GNUC__)
    if (vnni) context_vnni(q, S, Tp, Kt, v, fq[BQ_FQ_PROBS], T, d, Q);
    if (isa == 2 && !vnni) context_all_512(NULL, q, d, S, Tp, v, T, d, 0.0f, Q);
    if (isa == 1) context_all_fma(NULL, q, d, S, Tp, v, T, d, 0.0f, Q);
#endif
    if (!isa) context_all(NULL, q, d, S, Tp, v, T, d, 0.0f, Q);
    uint8_t *c = codes + b * Q * in->ldo + h * d;
#if defined(__x86_64__) && defined(__GNUC__)
    if (w16) {
        context_fq_codes_512(c, q, fpv, fc, in->sq, Q, d, in->ldo);
        return;
    }
#endif
    for (int64_t t = 0; t < Q; t++)
        for (int64_t e = 0; e < d; e++) c[t * in->ldo + e] = quant_u8(fq_apply(q[t * d + e] * fpv, fc), in->sq);
}

/* The largest |x| on the grid [lo, hi]. */
static float grid_abs(BqFq f) { return fabsf(f.lo) > fabsf(f.hi) ? fabsf(f.lo) : fabsf(f.hi); }

/* 1 when the four grids of attn_head_fq's products fit the u8·s8 form (the left operands span at most 256
 * codes, the right ones are s8) and every sum is exact in fp32 (below 2^24), so the integer products give
 * the fp32 products' values. */
static int vnni_exact(const BqFq *fq, int64_t T, int64_t d) {
    const BqFq q = fq[BQ_FQ_Q], k = fq[BQ_FQ_K], p = fq[BQ_FQ_PROBS], v = fq[BQ_FQ_V];
    const int grids = q.s > 0.0f && k.s > 0.0f && p.s > 0.0f && v.s > 0.0f && q.hi - q.lo <= 255.0f &&
                      p.hi - p.lo <= 255.0f && k.lo >= -128.0f && k.hi <= 127.0f && v.lo >= -128.0f && v.hi <= 127.0f;
    return grids && (double)grid_abs(q) * grid_abs(k) * (double)d < 16777216.0 &&
           (double)grid_abs(p) * grid_abs(v) * (double)T < 16777216.0;
}

/* The (batch, head) loop of both engines' attention, the context written as codes when codes is not
 * NULL, else as fp32 to ctx ((B,T,H) either way). Each pair runs on one thread in that thread's scratch.
 * The products use fused multiply-adds where the CPU has AVX2 and FMA (rounding differs from the
 * portable path's separate multiply and add, so results are the same on every CPU of one kind, not
 * across kinds; batch size, the padded length and thread count never change them). */
static void attn_heads(uint8_t *codes, float *ctx, const AttnIn *in, float *scratch, int64_t nthreads, int64_t B) {
    BQ_CHECK(in->d % 8 == 0 && omp_get_max_threads() <= nthreads);
    const int64_t NH = in->NH, per = bq_infer_attention_scratch(in->T, in->d);
    /* 0 portable, 1 AVX2 + FMA, 2 AVX-512 (the 16-lane kernels need d, and T outside the products, to be
     * multiples of 16) */
    const int isa = have_fma() ? (have_512() && in->d % 16 == 0 ? 2 : 1) : 0;
    const int vnni = isa == 2 && in->T % 16 == 0 && in->fq && have_vnni() && vnni_exact(in->fq, in->T, in->d);
#pragma omp parallel for if (B * NH > 1) schedule(static)
    for (int64_t bh = 0; bh < B * NH; bh++) {
        const int64_t b = bh / NH, h = bh % NH, off = b * in->Q * in->ldo + h * in->d;
        float *Kt = scratch + (int64_t)omp_get_thread_num() * per;
        uint8_t *c = codes ? codes + off : NULL;
        float *f = ctx ? ctx + off : NULL;
        if (in->fq) {
            attn_head_fq(codes, in, b, h, Kt, isa, vnni);
            continue;
        }
#if defined(__x86_64__) && defined(__GNUC__)
        if (isa == 2 && in->T % 16 == 0) {
            attn_head_512(c, f, in, b, h, Kt);
            continue;
        }
        if (isa) {
            attn_head_fma(c, f, in, b, h, Kt);
            continue;
        }
#endif
        attn_head(c, f, in, b, h, Kt);
    }
}

BqQkvSums bq_qkv_sums_fused(const int32_t *acc, const int32_t *comp, const float *scale, const float *bias,
                            int64_t H) {
    BqQkvSums s = {.ld = 3 * H};
    for (int p = 0; p < 3; p++) {
        s.acc[p] = acc + p * H;
        s.comp[p] = comp + p * H;
        s.scale[p] = scale + p * H;
        s.bias[p] = bias + p * H;
    }
    return s;
}

/* Q is T, or the first block of query rows (BQ_INFER_QUERY_BLOCK, a multiple of the 4-row score and softmax
 * and the 8-row context and VNNI tiles, so each of its rows is computed as among all T). */
static int query_rows_ok(int64_t T, int64_t Q) { return Q == T || (Q == BQ_INFER_QUERY_BLOCK && T > Q); }

void bq_infer_attention(uint8_t *codes, const BqQkvSums *sums, const float *mask, float *scratch, int64_t nthreads,
                        float scale, float sq, int64_t B, int64_t T, int64_t Q, int64_t NH, int64_t d, int64_t ldc) {
    BQ_CHECK(sums && codes && query_rows_ok(T, Q) && ldc >= NH * d);
    const AttnIn in = {sums, NULL, NULL, mask, scale, sq, T, NH, d, NULL, Q, ldc};
    attn_heads(codes, NULL, &in, scratch, nthreads, B);
}

void bq_infer_attention_fq(uint8_t *codes, const BqQkvSums *sums, const float *mask, float *scratch,
                           int64_t nthreads, float scale, const BqFq *fq, float sq, int64_t B, int64_t T, int64_t Q,
                           int64_t NH, int64_t d, int64_t ldc) {
    BQ_CHECK(sums && fq && codes && ldc >= NH * d && fq[BQ_FQ_Q].s > 0.0f && fq[BQ_FQ_K].s > 0.0f && fq[BQ_FQ_V].s > 0.0f &&
             fq[BQ_FQ_PROBS].s > 0.0f);
    BQ_CHECK(query_rows_ok(T, Q));
    const AttnIn in = {sums, NULL, NULL, mask, scale, sq, T, NH, d, fq, Q, ldc};
    attn_heads(codes, NULL, &in, scratch, nthreads, B);
}

IK_VEC static void residual_layernorm_fq_portable(float *out, uint8_t *codes, const int32_t *acc,
                                                  const int32_t *comp, const float *scale, const float *bias,
                                                  const float *resid, const BqFq *f, const float *lnw,
                                                  const float *lnb, float eps, float sq, int64_t M, int64_t N) {
    const BqFq floc = f[BQ_FQ_LOCAL], fskip = f[BQ_FQ_SKIP], fsum = f[BQ_FQ_SUM], fln = f[BQ_FQ_LN];
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++) {
        float *y = out + m * N;
        const int32_t *a = acc + m * N;
        const float *r = resid + m * N;
        for (int64_t n = 0; n < N; n++)
            y[n] = fq_apply(fq_apply(dequant(a[n], comp[n], scale[n], bias[n]), floc) + fq_apply(r[n], fskip), fsum);
        float mean, rstd;
        ln_row_forward(y, &mean, &rstd, y, lnw, lnb, N, eps);
        for (int64_t n = 0; n < N; n++) y[n] = fq_apply(y[n], fln);
        if (codes)
            for (int64_t n = 0; n < N; n++) codes[m * N + n] = quant_u8(y[n], sq);
    }
}

IK_VEC static void gelu_fq_quant_portable(uint8_t *codes, const int32_t *acc, const int32_t *comp,
                                          const float *scale, const float *bias, BqFq fin, BqFq fout, float sq,
                                          int64_t M, int64_t N, int64_t ldc) {
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++)
            codes[m * ldc + n] =
                quant_u8(fq_apply(gelu(fq_apply(dequant(acc[m * N + n], comp[n], scale[n], bias[n]), fin)), fout), sq);
}

/* With AVX2 and FMA (and N a multiple of 8) the fused multiply-add version: its values differ from the
 * portable ones (and from autograd/kernels.c's GELU) in the last bits, so a code can land on the other
 * side of a rounding boundary; the same on every CPU of one kind. */
void bq_infer_gelu_quant(uint8_t *codes, const int32_t *acc, const int32_t *comp, const float *scale,
                         const float *bias, float sq, int64_t M, int64_t N, int64_t ldc) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_512() && N % 16 == 0) {
        gelu_quant_rows_512(codes, acc, comp, scale, bias, sq, M, N, ldc, gelu_fast_on());
        return;
    }
    if (have_fma() && N % 8 == 0) {
        gelu_quant_rows_fma(codes, acc, comp, scale, bias, sq, M, N, ldc, gelu_fast_on());
        return;
    }
#endif
    gelu_quant_portable(codes, acc, comp, scale, bias, sq, M, N, ldc);
}

/* The fake-quant kernels give the same bits on every CPU, as fake quant's own ops do. */
void bq_infer_residual_layernorm_fq(float *out, uint8_t *codes, const int32_t *acc, const int32_t *comp,
                                    const float *scale, const float *bias, const float *resid, const BqFq *f,
                                    const float *lnw, const float *lnb, float eps, float sq, int64_t M, int64_t N) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_512() && N % 16 == 0) {
        residual_layernorm_fq_512(out, codes, acc, comp, scale, bias, resid, f, lnw, lnb, eps, sq, M, N);
        return;
    }
#endif
    residual_layernorm_fq_portable(out, codes, acc, comp, scale, bias, resid, f, lnw, lnb, eps, sq, M, N);
}

void bq_infer_gelu_fq_prepare(BqGeluFq *g, BqFq fin, BqFq fout, float sq) {
    *g = (BqGeluFq){.fin = fin, .fout = fout, .sq = sq};
    const int bounded = fin.lo >= -128.0f && fin.hi <= 255.0f && fin.hi - fin.lo < 256.0f;
    if (!(fin.s > 0.0f) || !bounded || getenv("BQ_INFER_GELU_EXACT")) return;
    g->nt = (int)(fin.hi - fin.lo) + 1;
    for (int i = 0; i < g->nt; i++) g->tab[i] = quant_u8(fq_apply(gelu((fin.lo + (float)i) * fin.s), fout), sq);
    g->tab[g->nt] = quant_u8(fq_apply(gelu(NAN), fout), sq);
}

IK_VEC static void gelu_fq_lut_portable(uint8_t *codes, const int32_t *acc, const int32_t *comp, const float *scale,
                                        const float *bias, BqFq fin, const int32_t *tab, int nt, int64_t M,
                                        int64_t N, int64_t ldc) {
#pragma omp parallel for if (M * N >= PAR_MIN_ELEMS) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            const float c = fq_code(dequant(acc[m * N + n], comp[n], scale[n], bias[n]), fin);
            codes[m * ldc + n] = (uint8_t)tab[c == c ? (int)c - (int)fin.lo : nt];
        }
}

void bq_infer_gelu_fq_quant(uint8_t *codes, const int32_t *acc, const int32_t *comp, const float *scale,
                            const float *bias, const BqGeluFq *g, int64_t M, int64_t N, int64_t ldc) {
    const BqFq fin = g->fin, fout = g->fout;
#if defined(__x86_64__) && defined(__GNUC__)
    if (g->nt && have_512() && N % 16 == 0) {
        gelu_fq_lut_512(codes, acc, comp, scale, bias, fin, g->tab, g->nt, M, N, ldc);
        return;
    }
#endif
    if (g->nt) {
        gelu_fq_lut_portable(codes, acc, comp, scale, bias, fin, g->tab, g->nt, M, N, ldc);
        return;
    }
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_512() && N % 16 == 0 && !(fin.s > 0.0f) && !(fout.s > 0.0f)) {
        gelu_quant_rows_exact_512(codes, acc, comp, scale, bias, g->sq, M, N, ldc, gelu_fast_on());
        return;
    }
    if (have_512() && N % 16 == 0) {
        gelu_fq_quant_512(codes, acc, comp, scale, bias, fin, fout, g->sq, M, N, ldc);
        return;
    }
#endif
    gelu_fq_quant_portable(codes, acc, comp, scale, bias, fin, fout, g->sq, M, N, ldc);
}

/* Every CPU gives the same bits here: the portable loops have no fused multiply-add to differ by. */
void bq_infer_residual_layernorm(float *out, uint8_t *codes, const int32_t *acc, const int32_t *comp,
                                 const float *scale, const float *bias, const float *resid, const float *lnw,
                                 const float *lnb, float eps, float sq, int64_t M, int64_t N) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_512() && N % 16 == 0) { /* the fake-quant kernel with every place empty: the same operations */
        residual_layernorm_fq_512(out, codes, acc, comp, scale, bias, resid, NULL, lnw, lnb, eps, sq, M, N);
        return;
    }
#endif
    residual_layernorm_portable(out, codes, acc, comp, scale, bias, resid, lnw, lnb, eps, sq, M, N);
}

/* Every float bit pattern in chunks of 4,096: both GELUs by the kernels this process runs, then the ratio
 * in scalar code (a NaN ratio at a finite input counts as unbounded). */
double bq_infer_gelu_fast_check(float a, float b) {
#if defined(__x86_64__) && defined(__GNUC__)
    const int isa = have_512() ? 2 : have_fma() ? 1 : 0;
    if (!isa) return -1.0;
    enum { CHUNK = 4096 };
    double worst = 0.0;
#pragma omp parallel for schedule(static) reduction(max : worst)
    for (int64_t c = 0; c < ((int64_t)1 << 32) / CHUNK; c++) {
        float x[CHUNK], fast[CHUNK], exact[CHUNK], portable[CHUNK];
        for (int64_t i = 0; i < CHUNK; i++) {
            const uint32_t u = (uint32_t)(c * CHUNK + i);
            memcpy(&x[i], &u, sizeof u);
        }
        if (isa == 2) gelu_pair_512(fast, exact, x, CHUNK);
        else gelu_pair_fma(fast, exact, x, CHUNK);
        if (isa == 2) gelu_exact_512(portable, x, CHUNK);
        for (int64_t i = 0; i < CHUNK; i++) {
            if (!(fabsf(x[i]) <= FLT_MAX)) continue;
            const double den = (double)a + (double)b * fabsf(x[i]);
            double r = fabs((double)fast[i] - (double)exact[i]) / den;
            if (isa == 2) {
                const double rp = fabs((double)fast[i] - (double)portable[i]) / den;
                r = rp > r || rp != rp ? rp : r;
            }
            worst = r == r ? (r > worst ? r : worst) : INFINITY;
        }
    }
    return worst;
#else
    (void)a, (void)b;
    return -1.0;
#endif
}

const char *bq_infer_isa(void) { return have_512() ? "AVX-512" : have_fma() ? "AVX2" : "portable"; }

int bq_infer_vnni(void) { return have_vnni(); }

const char *bq_infer_describe(void) {
    return have_vnni() ? "AVX-512, VNNI attention products" : bq_infer_isa();
}

/* ---- fp32 attention and GELU (layers/bert_fp32.c) ---- */

void bq_infer_attention_f32(float *ctx, const float *qkv, const float *bias, const float *mask, float *scratch,
                            int64_t nthreads, float scale, int64_t B, int64_t T, int64_t Q, int64_t NH, int64_t d) {
    BQ_CHECK(qkv != NULL && query_rows_ok(T, Q));
    const AttnIn in = {NULL, qkv, bias, mask, scale, 0.0f, T, NH, d, NULL, Q, NH * d};
    attn_heads(NULL, ctx, &in, scratch, nthreads, B);
}

void bq_infer_bias_gelu_f32(float *x, const float *bias, int64_t M, int64_t N) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_512() && N % 16 == 0) {
        bias_gelu_rows_512(x, bias, M, N);
        return;
    }
    if (have_fma() && N % 8 == 0) {
        bias_gelu_rows_fma(x, bias, M, N);
        return;
    }
#endif
    bias_gelu_portable(x, bias, M, N);
}

void bq_infer_bias_gelu_bf16(uint16_t *h, const float *x, const float *bias, int64_t M, int64_t N) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (have_fma() && N % 8 == 0) {
        bias_gelu_bf16_rows_fma(h, x, bias, M, N);
        return;
    }
#endif
    bias_gelu_bf16_portable(h, x, bias, M, N);
}
