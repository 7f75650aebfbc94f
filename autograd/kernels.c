/* Forward/backward kernels of the recorded ops (contracts in kernels.h).
 *
 * References: llm.c train_gpt2.c (layout of the kernels, LayerNorm backward formula); HF transformers
 * BertSelfAttention / nn.LayerNorm / GELUActivation / nn.CrossEntropyLoss for the semantics;
 * torch.fake_quantize_per_tensor_affine / _per_channel_affine (PyTorch 1.13) for the fake
 * quantization and its straight-through mask on the rounded value.
 *
 * Parallelism: OpenMP `parallel for` over rows (or column blocks when a reduction over rows is
 * needed, so every sum keeps a fixed order and results never depend on the thread count); matrix
 * products go to bq_gemm (autograd/gemm.h) in the precision the caller passes: the Linears' from the
 * serial region, the attention's one (batch, head) block per call inside the parallel loop. The
 * products on integer codes are exact in fp32 and always run in fp32. */
#include "autograd/kernels.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "autograd/bq.h"
#include "autograd/fastmath.h"
#include "autograd/gemm.h"
#include "autograd/qgemm.h"

/* Below this many elements a loop stays serial (thread start-up would dominate). */
#define PAR_MIN 16384
/* Column block width for reductions over rows (cache line multiples; 64 floats = 256 bytes). */
#define COLBLK 64

/* Elementwise kernels are compiled three times (baseline x86-64, AVX2, AVX-512F) and the loader picks
 * the best one the CPU supports (GCC function multi-versioning through an ifunc; clones are chosen by
 * ISA feature, which works on AMD and Intel alike, unlike "arch=" clones that test the CPU model), so
 * the portable build still gets 8- or 16-wide loops. The clones differ only in vector width:
 * floating-point contraction is off (-std=c11) and reductions use fixed lanes, so all give the same
 * bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(BQ_NO_CLONES)
#define BQ_VEC __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define BQ_VEC
#endif
#define BQ_INLINE static inline __attribute__((always_inline))

/* ---- vectorizable scalar math (branch-free, inlined into the loops above so they vectorize) ----
 * rne_small, exp_fast, erfc_pos, row_max, row_sum and ln_row_forward come from autograd/fastmath.h. */

/* The dot product and the LayerNorm backward sums use row_sum's 8 fixed lanes and order. */
#define LANES 8


BQ_INLINE float row_dot(const float *x, const float *y, int64_t n) {
    float a[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) a[l] += x[j + l] * y[j + l];
    for (; j < n; j++) a[0] += x[j] * y[j];
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* Φ(x), the standard normal CDF, as 1 − erfc/2 or erfc/2 so both tails keep relative precision. */
BQ_INLINE float normal_cdf(float x) {
    float h = 0.5f * erfc_pos(fabsf(x) * (float)M_SQRT1_2);
    return x >= 0.0f ? 1.0f - h : h;
}


/* The dropout factor of element i: 1/(1−p) kept, 0 dropped (the expression of the dropout kernels). */
BQ_INLINE float drop_factor(uint64_t key, int64_t i, float p, float inv) {
    return bq_hash_uniform(key, (uint64_t)i) >= p ? inv : 0.0f;
}

/* ---- linear ---- */

void bq_kernel_linear_forward(float *out, const float *inp, const float *weight, const float *bias, int64_t N,
                              int64_t C, int64_t OC, BqPrecision prec) {
    bq_kernel_linear_forward_m(out, bq_mat_f32(inp), weight, bias, N, C, OC, prec);
}

void bq_kernel_linear_forward_m(float *out, BqMat inp, const float *weight, const float *bias, int64_t N, int64_t C,
                                int64_t OC, BqPrecision prec) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for if (N * OC > PAR_MIN) schedule(static)
        for (int64_t n = 0; n < N; n++) memcpy(out + n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    bq_gemm_mat(prec, BQ_NOTRANS, BQ_TRANS, N, OC, C, inp, C, bq_mat_f32(weight), C, beta, out, OC);
}

int bq_kernel_linear_qgemm_forward(float *out, uint8_t *codes, int32_t *acc, const float *inp,
                                   struct BqQGemmWeights *w, float sx, const float *bias, int64_t N, int64_t C,
                                   int64_t OC) {
    BQ_CHECK(bq_qgemm_weights_n(w) == OC && bq_qgemm_weights_k(w) == C);
    return bq_qgemm_linear_f32(w, inp, N, sx, bias, out, codes, acc);
}

void bq_kernel_colsum_acc(float *dst, const float *src, int64_t rows, int64_t C) {
    int64_t nblk = (C + COLBLK - 1) / COLBLK;
#pragma omp parallel for if (rows * C > PAR_MIN) schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * COLBLK, c1 = c0 + COLBLK < C ? c0 + COLBLK : C;
        float acc[COLBLK];
        for (int64_t c = c0; c < c1; c++) acc[c - c0] = 0.0f;
        for (int64_t r = 0; r < rows; r++) {
            const float *s = src + r * C;
            for (int64_t c = c0; c < c1; c++) acc[c - c0] += s[c];
        }
        for (int64_t c = c0; c < c1; c++) dst[c] += acc[c - c0];
    }
}

void bq_kernel_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, int64_t N, int64_t C, int64_t OC, BqPrecision prec) {
    bq_kernel_linear_backward_m(dinp, dweight, dbias, dout, bq_mat_f32(dout), bq_mat_f32(inp), weight, N, C, OC, prec);
}

void bq_kernel_linear_backward_m(float *dinp, float *dweight, float *dbias, const float *dout, BqMat dy, BqMat inp,
                                 const float *weight, int64_t N, int64_t C, int64_t OC, BqPrecision prec) {
    if (dinp) bq_gemm_mat(prec, BQ_NOTRANS, BQ_NOTRANS, N, C, OC, dy, OC, bq_mat_f32(weight), C, 1.0f, dinp, C);
    if (dweight) bq_gemm_mat(prec, BQ_TRANS, BQ_NOTRANS, OC, C, N, dy, OC, inp, C, 1.0f, dweight, C);
    if (dbias) bq_kernel_colsum_acc(dbias, dout, N, OC);
}

/* ---- attention: one single-threaded sgemm per (batch, head) on strided head views (leading dimension
 * H), the (batch, head) pairs spread over the OpenMP threads. Inside a parallel region Debian's OpenMP
 * OpenBLAS runs each call on the calling thread, so the small products (T×T×d) do not pay for
 * threading each; every pair writes its own output block, so the result is the same for any thread
 * count. ---- */

void bq_kernel_attn_scores_forward(float *scores, const float *q, const float *k, int64_t B, int64_t Tq,
                                   int64_t T, int64_t NH, int64_t d, BqPrecision prec) {
    bq_kernel_attn_scores_forward_m(scores, bq_mat_f32(q), bq_mat_f32(k), B, Tq, T, NH, d, prec);
}

void bq_kernel_attn_scores_forward_m(float *scores, BqMat q, BqMat k, int64_t B, int64_t Tq, int64_t T, int64_t NH,
                                     int64_t d, BqPrecision prec) {
    int64_t H = NH * d;
#pragma omp parallel for schedule(static) if (B * NH > 1)
    for (int64_t bh = 0; bh < B * NH; bh++) {
        int64_t b = bh / NH, h = bh % NH;
        bq_gemm_mat(prec, BQ_NOTRANS, BQ_TRANS, Tq, T, d, bq_mat_at(q, b * Tq * H + h * d), H,
                    bq_mat_at(k, b * T * H + h * d), H, 0.0f, scores + bh * Tq * T, T);
    }
}

void bq_kernel_attn_scores_backward(float *dq, float *dk, const float *dscores, const float *q, const float *k,
                                    int64_t B, int64_t T, int64_t NH, int64_t d, BqPrecision prec) {
    bq_kernel_attn_scores_backward_m(dq, dk, dscores, bq_mat_f32(q), bq_mat_f32(k), B, T, NH, d, prec);
}

void bq_kernel_attn_scores_backward_m(float *dq, float *dk, const float *dscores, BqMat q, BqMat k, int64_t B,
                                      int64_t T, int64_t NH, int64_t d, BqPrecision prec) {
    int64_t H = NH * d;
#pragma omp parallel for schedule(static) if (B * NH > 1)
    for (int64_t bh = 0; bh < B * NH; bh++) {
        int64_t b = bh / NH, h = bh % NH;
        const float *ds = dscores + bh * T * T;
        int64_t off = b * T * H + h * d;
        if (dq) /* dQ_h += dS·K_h */
            bq_gemm_mat(prec, BQ_NOTRANS, BQ_NOTRANS, T, d, T, bq_mat_f32(ds), T, bq_mat_at(k, off), H, 1.0f, dq + off,
                        H);
        if (dk) /* dK_h += dSᵀ·Q_h */
            bq_gemm_mat(prec, BQ_TRANS, BQ_NOTRANS, T, d, T, bq_mat_f32(ds), T, bq_mat_at(q, off), H, 1.0f, dk + off,
                        H);
    }
}

void bq_kernel_attn_context_forward(float *ctx, const float *probs, const float *v, int64_t B, int64_t Tq,
                                    int64_t T, int64_t NH, int64_t d, BqPrecision prec) {
    bq_kernel_attn_context_forward_m(ctx, bq_mat_f32(probs), bq_mat_f32(v), B, Tq, T, NH, d, prec);
}

void bq_kernel_attn_context_forward_m(float *ctx, BqMat probs, BqMat v, int64_t B, int64_t Tq, int64_t T, int64_t NH,
                                      int64_t d, BqPrecision prec) {
    int64_t H = NH * d;
#pragma omp parallel for schedule(static) if (B * NH > 1)
    for (int64_t bh = 0; bh < B * NH; bh++) {
        int64_t b = bh / NH, h = bh % NH;
        bq_gemm_mat(prec, BQ_NOTRANS, BQ_NOTRANS, Tq, d, T, bq_mat_at(probs, bh * Tq * T), T,
                    bq_mat_at(v, b * T * H + h * d), H, 0.0f, ctx + b * Tq * H + h * d, H);
    }
}

void bq_kernel_attn_context_backward(float *dprobs, float *dv, const float *dctx, const float *probs,
                                     const float *v, int64_t B, int64_t T, int64_t NH, int64_t d, BqPrecision prec) {
    bq_kernel_attn_context_backward_m(dprobs, dv, dctx, bq_mat_f32(probs), bq_mat_f32(v), B, T, NH, d, prec);
}

void bq_kernel_attn_context_backward_m(float *dprobs, float *dv, const float *dctx, BqMat probs, BqMat v, int64_t B,
                                       int64_t T, int64_t NH, int64_t d, BqPrecision prec) {
    int64_t H = NH * d;
#pragma omp parallel for schedule(static) if (B * NH > 1)
    for (int64_t bh = 0; bh < B * NH; bh++) {
        int64_t b = bh / NH, h = bh % NH;
        int64_t off = b * T * H + h * d, poff = bh * T * T;
        if (dprobs) /* dP += dC_h·V_hᵀ */
            bq_gemm_mat(prec, BQ_NOTRANS, BQ_TRANS, T, T, d, bq_mat_f32(dctx + off), H, bq_mat_at(v, off), H, 1.0f,
                        dprobs + poff, T);
        if (dv) /* dV_h += Pᵀ·dC_h */
            bq_gemm_mat(prec, BQ_TRANS, BQ_NOTRANS, T, d, T, bq_mat_at(probs, poff), T, bq_mat_f32(dctx + off), H, 1.0f,
                        dv + off, H);
    }
}

/* ---- attention on integer codes: both inputs of the product are fake-quant outputs (values c·s on
 * one per-tensor grid each), so their codes c = rne(x/s) are recovered exactly, multiplied and summed
 * exactly and scaled once, y = fl(Σ ca·cb · fl(sa·sb)), the convention of the integer Linears
 * (autograd/qgemm.h). The per-thread scratch holds one (batch, head) block of codes as floats. When every
 * partial sum is an integer below 2^24 in magnitude (n·max|ca|·max|cb| <= 2^24 for n products, true for
 * 8-bit codes up to n = 1024: head size for Q·Kᵀ, sequence length for P·V), each product and each sum is
 * exact in fp32 whatever the order, so the block is one single-threaded sgemm on the codes, at sgemm's
 * speed (the integer loops below ran at a third of it); otherwise the codes are summed in int32 (exact
 * for |c| <= 255 and sums of at most T·255·128 < 2^31). Either way the integer is exact, so the result
 * is the same on every CPU and thread count. ---- */

/* codes of the (T, d) block at x with row stride H, into dst (T, d); returns max |code| (an integer max,
 * so that the loop vectorizes) */
BQ_INLINE float head_codes(float *dst, const float *x, int64_t T, int64_t d, int64_t H, float s) {
    int32_t mx = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < d; c++) {
            float v = x[t * H + c] / s;
            v = v < -32768.0f ? -32768.0f : v;
            v = v > 32767.0f ? 32767.0f : v;
            v = rne_small(v);
            dst[t * d + c] = v;
            int32_t a = (int32_t)v;
            a = a < 0 ? -a : a;
            mx = a > mx ? a : mx;
        }
    return (float)mx;
}

/* 1 when n products of codes bounded by ma and mb sum exactly in fp32 (every partial sum < 2^24) */
static int f32_exact(int64_t n, float ma, float mb) { return (double)n * ma * mb <= 16777216.0; }

size_t bq_kernel_attn_int_scratch(int64_t T, int64_t d) { return (size_t)(2 * T * (T > d ? T : d)) * sizeof(float); }

/* One (batch, head) product of both attention kernels: the codes of a (M, K; row stride lda, scale sa)
 * into ac and of b (row stride ldb, scale sb; (N, K) with transb, for Q·Kᵀ, else (K, N), for P·V) into bc,
 * both contiguous; then, when fp32 sums the K products exactly, out (M, N; row stride ldo) = (ac·bcᵀ or
 * ac·bc)·fl(sa·sb) by one sgemm on the codes, returning 1. Returns 0 otherwise, the codes left in ac and
 * bc for the caller's int32 sums. */
BQ_INLINE int codes_gemm(float *out, int64_t ldo, float *ac, float *bc, const float *a, int64_t lda, float sa,
                         const float *b, int64_t ldb, float sb, int transb, int64_t M, int64_t N, int64_t K) {
    const int64_t bcols = transb ? K : N;
    const float ma = head_codes(ac, a, M, K, lda, sa), mb = head_codes(bc, b, transb ? N : K, bcols, ldb, sb);
    if (!f32_exact(K, ma, mb)) return 0;
    const float f = sa * sb;
    bq_gemm(BQ_PRECISION_FP32, BQ_NOTRANS, transb ? BQ_TRANS : BQ_NOTRANS, M, N, K, ac, K, bc, bcols, 0.0f, out, ldo);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) out[i * ldo + j] *= f;
    return 1;
}

/* The calling thread's scratch in the kernels on codes: thread k's starts k·bq_kernel_attn_int_scratch(T, d)
 * bytes into scratch. */
static float *thread_scratch(void *scratch, int64_t T, int64_t d) {
    return (float *)((char *)scratch + (size_t)omp_get_thread_num() * bq_kernel_attn_int_scratch(T, d));
}

BQ_VEC void bq_kernel_attn_scores_int_forward(float *scores, void *scratch, int nscratch, const float *q,
                                              const float *k, float sq, float sk, int64_t B, int64_t Tq, int64_t T,
                                              int64_t NH, int64_t d) {
    const int64_t H = NH * d;
#pragma omp parallel for schedule(static) if (B * NH > 1) num_threads(nscratch)
    for (int64_t bh = 0; bh < B * NH; bh++) {
        const int64_t b = bh / NH, h = bh % NH;
        float *qc = thread_scratch(scratch, T, d), *kc = qc + T * d, *out = scores + bh * Tq * T;
        if (codes_gemm(out, T, qc, kc, q + b * Tq * H + h * d, H, sq, k + b * T * H + h * d, H, sk, 1, Tq, T, d))
            continue;
        const float f = sq * sk;
        for (int64_t i = 0; i < Tq; i++)
            for (int64_t j = 0; j < T; j++) {
                int32_t acc = 0;
                for (int64_t c = 0; c < d; c++) acc += (int32_t)qc[i * d + c] * (int32_t)kc[j * d + c];
                out[i * T + j] = (float)acc * f;
            }
    }
}

BQ_VEC void bq_kernel_attn_context_int_forward(float *ctx, void *scratch, int nscratch, const float *probs,
                                               const float *v, float sp, float sv, int64_t B, int64_t Tq, int64_t T,
                                               int64_t NH, int64_t d) {
    const int64_t H = NH * d;
#pragma omp parallel for schedule(static) if (B * NH > 1) num_threads(nscratch)
    for (int64_t bh = 0; bh < B * NH; bh++) {
        const int64_t b = bh / NH, h = bh % NH, off = b * Tq * H + h * d;
        float *pc = thread_scratch(scratch, T, d), *vc = pc + T * T;
        if (codes_gemm(ctx + off, H, pc, vc, probs + bh * Tq * T, T, sp, v + b * T * H + h * d, H, sv, 0, Tq, d, T))
            continue;
        const float f = sp * sv;
        int32_t acc[512];
        for (int64_t c0 = 0; c0 < d; c0 += 512) {
            const int64_t dc = d - c0 < 512 ? d - c0 : 512;
            for (int64_t i = 0; i < Tq; i++) {
                for (int64_t c = 0; c < dc; c++) acc[c] = 0;
                for (int64_t j = 0; j < T; j++) {
                    const int32_t pij = (int32_t)pc[i * T + j];
                    if (!pij) continue;
                    const float *vr = vc + j * d + c0;
                    for (int64_t c = 0; c < dc; c++) acc[c] += pij * (int32_t)vr[c];
                }
                float *out = ctx + off + i * H + c0;
                for (int64_t c = 0; c < dc; c++) out[c] = (float)acc[c] * f;
            }
        }
    }
}

/* Attention context with the probabilities' dropout inside the head loop: each (batch, head) block of
 * dropout(probs) is formed in the calling thread's scratch (T·T floats) right before its product, in the
 * forward and again in the backward, so the dropped probabilities are never stored. The scratch of
 * thread k is scratch + k·T·T; the loop runs on at most nscratch threads. */
/* The (batch, head) loop of both kernels below: the forward when ctx is set (ctx = dropout(P)·V per
 * head), else the backward (dprobs and dv, either may be NULL). One loop, so both form dropout(P) the
 * same way in the same scratch. */
/* One (batch, head) block of dropout(P) into S: P's n elements from poff on, each times its mask factor. */
BQ_INLINE void dropped_probs(float *S, BqMat probs, int64_t poff, int64_t n, uint64_t key, float p, float inv) {
    if (probs.h)
        for (int64_t k = 0; k < n; k++) S[k] = bq_bf16_float(probs.h[poff + k]) * drop_factor(key, poff + k, p, inv);
    else
        for (int64_t k = 0; k < n; k++) S[k] = probs.f[poff + k] * drop_factor(key, poff + k, p, inv);
}

BQ_VEC static void context_dropout_heads(float *ctx, float *dprobs, float *dv, float *scratch, int nscratch,
                                         const float *dctx, BqMat probs, BqMat v, float p, uint64_t key, int64_t B,
                                         int64_t T, int64_t NH, int64_t d, BqPrecision prec) {
    int64_t H = NH * d;
    float inv = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) num_threads(nscratch) if (B * NH > 1)
    for (int64_t bh = 0; bh < B * NH; bh++) {
        int64_t b = bh / NH, h = bh % NH;
        int64_t off = b * T * H + h * d, poff = bh * T * T;
        float *S = scratch + (int64_t)omp_get_thread_num() * T * T;
        if (ctx) {
            dropped_probs(S, probs, poff, T * T, key, p, inv);
            bq_gemm_mat(prec, BQ_NOTRANS, BQ_NOTRANS, T, d, T, bq_mat_f32(S), T, bq_mat_at(v, off), H, 0.0f, ctx + off,
                        H);
            continue;
        }
        /* dP += (dC_h·V_hᵀ)·m/(1−p) */
        if (dprobs) {
            bq_gemm_mat(prec, BQ_NOTRANS, BQ_TRANS, T, T, d, bq_mat_f32(dctx + off), H, bq_mat_at(v, off), H, 0.0f, S,
                        T);
            /* the same pass over the mask leaves dropout(P) in S for dV */
            if (probs.h)
                for (int64_t k = 0; k < T * T; k++) {
                    float f = drop_factor(key, poff + k, p, inv);
                    dprobs[poff + k] += S[k] * f;
                    S[k] = bq_bf16_float(probs.h[poff + k]) * f;
                }
            else
                for (int64_t k = 0; k < T * T; k++) {
                    float f = drop_factor(key, poff + k, p, inv);
                    dprobs[poff + k] += S[k] * f;
                    S[k] = probs.f[poff + k] * f;
                }
        } else if (dv) {
            dropped_probs(S, probs, poff, T * T, key, p, inv);
        }
        if (dv) /* dV_h += dropout(P)ᵀ·dC_h */
            bq_gemm(prec, BQ_TRANS, BQ_NOTRANS, T, d, T, S, T, dctx + off, H, 1.0f, dv + off, H);
    }
}

void bq_kernel_attn_context_dropout_forward(float *ctx, float *scratch, int nscratch, const float *probs,
                                            const float *v, float p, uint64_t key, int64_t B, int64_t T, int64_t NH,
                                            int64_t d, BqPrecision prec) {
    bq_kernel_attn_context_dropout_forward_m(ctx, scratch, nscratch, bq_mat_f32(probs), bq_mat_f32(v), p, key, B, T,
                                             NH, d, prec);
}

void bq_kernel_attn_context_dropout_forward_m(float *ctx, float *scratch, int nscratch, BqMat probs, BqMat v, float p,
                                              uint64_t key, int64_t B, int64_t T, int64_t NH, int64_t d,
                                              BqPrecision prec) {
    BQ_CHECK(ctx != NULL);
    context_dropout_heads(ctx, NULL, NULL, scratch, nscratch, NULL, probs, v, p, key, B, T, NH, d, prec);
}

void bq_kernel_attn_context_dropout_backward(float *dprobs, float *dv, float *scratch, int nscratch,
                                             const float *dctx, const float *probs, const float *v, float p,
                                             uint64_t key, int64_t B, int64_t T, int64_t NH, int64_t d,
                                             BqPrecision prec) {
    bq_kernel_attn_context_dropout_backward_m(dprobs, dv, scratch, nscratch, dctx, bq_mat_f32(probs), bq_mat_f32(v),
                                              p, key, B, T, NH, d, prec);
}

void bq_kernel_attn_context_dropout_backward_m(float *dprobs, float *dv, float *scratch, int nscratch,
                                               const float *dctx, BqMat probs, BqMat v, float p, uint64_t key,
                                               int64_t B, int64_t T, int64_t NH, int64_t d, BqPrecision prec) {
    context_dropout_heads(NULL, dprobs, dv, scratch, nscratch, dctx, probs, v, p, key, B, T, NH, d, prec);
}

/* ---- elementwise ---- */

void bq_kernel_add_forward(float *out, const float *a, const float *b, int64_t n, int64_t C, int bcast) {
    if (!bcast) {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
        return;
    }
    int64_t rows = n / C;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < C; c++) out[r * C + c] = a[r * C + c] + b[c];
}

void bq_kernel_add_backward(float *da, float *db, const float *dout, int64_t n, int64_t C, int bcast) {
    if (da) {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) da[i] += dout[i];
    }
    if (db) {
        if (bcast) {
            bq_kernel_colsum_acc(db, dout, n / C, C);
        } else {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
            for (int64_t i = 0; i < n; i++) db[i] += dout[i];
        }
    }
}

/* ---- embedding ---- */

void bq_kernel_embedding_forward(float *out, const float *table, const int32_t *ids, int64_t N, int64_t H) {
#pragma omp parallel for if (N * H > PAR_MIN) schedule(static)
    for (int64_t n = 0; n < N; n++) memcpy(out + n * H, table + (int64_t)ids[n] * H, (size_t)H * sizeof(float));
}

/* Each thread owns a block of columns and visits the tokens in order: no two threads write the same
 * element and repeated ids accumulate in a fixed order. */
void bq_kernel_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t N, int64_t H) {
    bq_kernel_embedding_backward_pad(dtable, dout, ids, N, H, -1);
}

void bq_kernel_embedding_backward_pad(float *dtable, const float *dout, const int32_t *ids, int64_t N, int64_t H,
                                      int32_t padding_idx) {
    int64_t nblk = (H + COLBLK - 1) / COLBLK;
#pragma omp parallel for if (N * H > PAR_MIN) schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * COLBLK, c1 = c0 + COLBLK < H ? c0 + COLBLK : H;
        for (int64_t n = 0; n < N; n++) {
            if (ids[n] == padding_idx) continue;
            float *dst = dtable + (int64_t)ids[n] * H;
            const float *src = dout + n * H;
            for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
}

/* ---- layernorm ---- */

/* One row of LayerNorm: ln_row_forward of autograd/fastmath.h, shared by the plain, residual and
 * embedding kernels and by the inference epilogues of autograd/infer_kernels.c, so all give the same bits. */

/* The 8 lanes of a row reduction, combined pairwise. */
BQ_INLINE float lanes_sum(const float *a) {
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

/* mean(g) and mean(g⊙x̂) of one row, g = dy⊙w: dx = r·(g − mean(g) − x̂·mean(g⊙x̂)). Both sums in 8
 * fixed lanes (element i in lane i mod 8 below the last multiple of 8, the tail in lane 0). */
BQ_INLINE void ln_row_stats(float *sg_out, float *sgx_out, const float *x, const float *dy, const float *weight,
                            float m, float r, int64_t H) {
    float ag[LANES] = {0}, agx[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= H; j += LANES)
        for (int l = 0; l < LANES; l++) {
            float g = dy[j + l] * weight[j + l];
            ag[l] += g;
            agx[l] += g * (x[j + l] - m) * r;
        }
    for (; j < H; j++) {
        float g = dy[j] * weight[j];
        ag[0] += g;
        agx[0] += g * (x[j] - m) * r;
    }
    *sg_out = lanes_sum(ag) / (float)H;
    *sgx_out = lanes_sum(agx) / (float)H;
}

BQ_INLINE float ln_dx(float x, float dy, float w, float m, float r, float sg, float sgx) {
    float xh = (x - m) * r;
    return r * (dy * w - sg - xh * sgx);
}

/* dweight += Σ_n dy⊙x̂, dbias += Σ_n dy, column blocks over threads, rows in order. */
static void ln_param_grads(float *dweight, float *dbias, const float *dout, const float *inp, const float *mean,
                           const float *rstd, int64_t N, int64_t H) {
    int64_t nblk = (H + COLBLK - 1) / COLBLK;
#pragma omp parallel for if (N * H > PAR_MIN) schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * COLBLK, c1 = c0 + COLBLK < H ? c0 + COLBLK : H;
        float aw[COLBLK], ab[COLBLK];
        for (int64_t c = c0; c < c1; c++) aw[c - c0] = ab[c - c0] = 0.0f;
        for (int64_t n = 0; n < N; n++) {
            const float *x = inp + n * H, *dy = dout + n * H;
            float m = mean[n], r = rstd[n];
            for (int64_t c = c0; c < c1; c++) {
                aw[c - c0] += dy[c] * (x[c] - m) * r;
                ab[c - c0] += dy[c];
            }
        }
        for (int64_t c = c0; c < c1; c++) {
            if (dweight) dweight[c] += aw[c - c0];
            if (dbias) dbias[c] += ab[c - c0];
        }
    }
}

BQ_VEC void bq_kernel_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                 const float *bias, int64_t N, int64_t H, float eps) {
#pragma omp parallel for if (N * H > PAR_MIN) schedule(static)
    for (int64_t n = 0; n < N; n++) ln_row_forward(out + n * H, mean + n, rstd + n, inp + n * H, weight, bias, H, eps);
}

BQ_VEC void bq_kernel_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, const float *mean, const float *rstd,
                                  int64_t N, int64_t H) {
    if (dinp) {
#pragma omp parallel for if (N * H > PAR_MIN) schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const float *x = inp + n * H, *dy = dout + n * H;
            float m = mean[n], r = rstd[n], sg, sgx;
            ln_row_stats(&sg, &sgx, x, dy, weight, m, r, H);
            float *dx = dinp + n * H;
            for (int64_t i = 0; i < H; i++) dx[i] += ln_dx(x[i], dy[i], weight[i], m, r, sg, sgx);
        }
    }
    if (dweight || dbias) ln_param_grads(dweight, dbias, dout, inp, mean, rstd, N, H);
}

/* ---- embeddings + layernorm ---- */

BQ_INLINE float emb_sum(const float *word, const float *type, const float *pos, int32_t w, int32_t t, int32_t p,
                        int64_t H, int64_t i) {
    return (word[(int64_t)w * H + i] + type[(int64_t)t * H + i]) + pos[(int64_t)p * H + i];
}

BQ_VEC void bq_kernel_embed_layernorm_forward(float *out, float *mean, float *rstd, const float *word, const float *type,
                                       const float *pos, const int32_t *wid, const int32_t *tid, const int32_t *pid,
                                       const float *weight, const float *bias, int64_t N, int64_t H, float eps) {
#pragma omp parallel for if (N * H > PAR_MIN) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        float *y = out + n * H;
        for (int64_t i = 0; i < H; i++) y[i] = emb_sum(word, type, pos, wid[n], tid[n], pid[n], H, i);
        ln_row_forward(y, mean + n, rstd + n, y, weight, bias, H, eps);
    }
}

BQ_VEC void bq_kernel_embed_layernorm_backward(float *dword, float *dtype, float *dpos, float *dweight, float *dbias,
                                        float *stats, const float *dout, const float *word, const float *type,
                                        const float *pos, const int32_t *wid, const int32_t *tid,
                                        const int32_t *pid, const float *weight, const float *mean,
                                        const float *rstd, int64_t N, int64_t H, int32_t word_padding_idx) {
    /* pass 1, rows: mean(g) and mean(g⊙x̂) of each row (the expressions of ln_row_stats) */
#pragma omp parallel for if (N * H > PAR_MIN) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *dy = dout + n * H;
        float m = mean[n], r = rstd[n], ag[LANES] = {0}, agx[LANES] = {0};
        int64_t j = 0;
        for (; j + LANES <= H; j += LANES)
            for (int l = 0; l < LANES; l++) {
                float x = emb_sum(word, type, pos, wid[n], tid[n], pid[n], H, j + l);
                float g = dy[j + l] * weight[j + l];
                ag[l] += g;
                agx[l] += g * (x - m) * r;
            }
        for (; j < H; j++) {
            float x = emb_sum(word, type, pos, wid[n], tid[n], pid[n], H, j);
            float g = dy[j] * weight[j];
            ag[0] += g;
            agx[0] += g * (x - m) * r;
        }
        stats[2 * n] = lanes_sum(ag) / (float)H;
        stats[2 * n + 1] = lanes_sum(agx) / (float)H;
    }
    /* pass 2, column blocks: scatter the input gradient into the tables, sum the LayerNorm's parameter
     * gradients; rows in order within each block */
    int64_t nblk = (H + COLBLK - 1) / COLBLK;
#pragma omp parallel for if (N * H > PAR_MIN) schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * COLBLK, c1 = c0 + COLBLK < H ? c0 + COLBLK : H;
        float aw[COLBLK], ab[COLBLK];
        for (int64_t c = c0; c < c1; c++) aw[c - c0] = ab[c - c0] = 0.0f;
        for (int64_t n = 0; n < N; n++) {
            const float *dy = dout + n * H;
            float m = mean[n], r = rstd[n], sg = stats[2 * n], sgx = stats[2 * n + 1];
            for (int64_t c = c0; c < c1; c++) {
                float x = emb_sum(word, type, pos, wid[n], tid[n], pid[n], H, c);
                float dx = ln_dx(x, dy[c], weight[c], m, r, sg, sgx);
                if (dword && wid[n] != word_padding_idx) dword[(int64_t)wid[n] * H + c] += dx;
                if (dtype) dtype[(int64_t)tid[n] * H + c] += dx;
                if (dpos) dpos[(int64_t)pid[n] * H + c] += dx;
                aw[c - c0] += dy[c] * (x - m) * r;
                ab[c - c0] += dy[c];
            }
        }
        for (int64_t c = c0; c < c1; c++) {
            if (dweight) dweight[c] += aw[c - c0];
            if (dbias) dbias[c] += ab[c - c0];
        }
    }
}

/* ---- residual add + layernorm ---- */

BQ_VEC void bq_kernel_residual_layernorm_forward(float *out, float *sum, float *mean, float *rstd, const float *a,
                                                 const float *b, const float *weight, const float *bias, float p,
                                                 uint64_t key, int64_t N, int64_t H, float eps) {
    float inv = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
#pragma omp parallel for if (N * H > PAR_MIN) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *ar = a + n * H, *br = b + n * H;
        float *s = sum + n * H;
        if (p > 0.0f)
            for (int64_t i = 0; i < H; i++) s[i] = ar[i] * drop_factor(key, n * H + i, p, inv) + br[i];
        else
            for (int64_t i = 0; i < H; i++) s[i] = ar[i] + br[i];
        ln_row_forward(out + n * H, mean + n, rstd + n, s, weight, bias, H, eps);
    }
}

BQ_VEC void bq_kernel_residual_layernorm_backward(float *da, float *db, float *dweight, float *dbias,
                                                  const float *dout, const float *sum, const float *weight,
                                                  const float *mean, const float *rstd, float p, uint64_t key,
                                                  int64_t N, int64_t H) {
    float inv = p > 0.0f ? 1.0f / (1.0f - p) : 1.0f;
    if (da || db) {
#pragma omp parallel for if (N * H > PAR_MIN) schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const float *x = sum + n * H, *dy = dout + n * H;
            float m = mean[n], r = rstd[n], sg, sgx;
            ln_row_stats(&sg, &sgx, x, dy, weight, m, r, H);
            for (int64_t i = 0; i < H; i++) {
                float dx = ln_dx(x[i], dy[i], weight[i], m, r, sg, sgx);
                if (db) db[n * H + i] += dx;
                if (da) da[n * H + i] += p > 0.0f ? dx * drop_factor(key, n * H + i, p, inv) : dx;
            }
        }
    }
    if (dweight || dbias) ln_param_grads(dweight, dbias, dout, sum, mean, rstd, N, H);
}

/* ---- activations ---- */

BQ_VEC void bq_kernel_gelu_forward(float *out, const float *x, int64_t n) {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * normal_cdf(x[i]);
}

/* d/dx x·Φ(x) = Φ(x) + x·φ(x), φ(x) = e^(−x²/2)/√(2π). */
BQ_VEC void bq_kernel_gelu_backward(float *dx, const float *dout, const float *x, int64_t n) {
    const float inv_sqrt_2pi = 0.3989422804014327f;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float pdf = inv_sqrt_2pi * exp_fast(-0.5f * xi * xi);
        dx[i] += dout[i] * (normal_cdf(xi) + xi * pdf);
    }
}

/* gelu'(x), the expression of bq_kernel_gelu_backward. */
BQ_INLINE float gelu_grad(float xi) {
    const float inv_sqrt_2pi = 0.3989422804014327f;
    float pdf = inv_sqrt_2pi * exp_fast(-0.5f * xi * xi);
    return normal_cdf(xi) + xi * pdf;
}

/* One row of bq_kernel_bias_gelu_forward_m; x16/out16 (compile-time constants at each call) select the
 * storage, so each of the four loops vectorizes. */
BQ_INLINE void gelu_fwd_row(float *y, uint16_t *y16, const float *x, const uint16_t *xh, const float *bias, int64_t C,
                            int x16, int out16) {
    for (int64_t c = 0; c < C; c++) {
        float v = (x16 ? bq_bf16_float(xh[c]) : x[c]) + (bias ? bias[c] : 0.0f);
        float g = v * normal_cdf(v);
        if (out16)
            y16[c] = bq_bf16_bits(g);
        else
            y[c] = g;
    }
}

BQ_VEC void bq_kernel_bias_gelu_forward_m(float *out, uint16_t *out16, BqMat inp, const float *bias, int64_t N,
                                          int64_t C) {
    BQ_CHECK(!out != !out16 && !inp.f != !inp.h);
#pragma omp parallel for if (N * C > PAR_MIN) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const int64_t o = n * C;
        if (inp.h && out16)
            gelu_fwd_row(NULL, out16 + o, NULL, inp.h + o, bias, C, 1, 1);
        else if (inp.h)
            gelu_fwd_row(out + o, NULL, NULL, inp.h + o, bias, C, 1, 0);
        else if (out16)
            gelu_fwd_row(NULL, out16 + o, inp.f + o, NULL, bias, C, 0, 1);
        else
            gelu_fwd_row(out + o, NULL, inp.f + o, NULL, bias, C, 0, 0);
    }
}

BQ_VEC void bq_kernel_bias_gelu_forward(float *out, const float *inp, const float *bias, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C > PAR_MIN) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * C;
        float *y = out + n * C;
        if (bias)
            for (int64_t c = 0; c < C; c++) {
                float v = x[c] + bias[c];
                y[c] = v * normal_cdf(v);
            }
        else
            for (int64_t c = 0; c < C; c++) y[c] = x[c] * normal_cdf(x[c]);
    }
}

/* One row of the elementwise part: dx = dy·gelu'(x + bias), written over the row when the gradient
 * buffer is shared (read and written through one pointer, so the vectorizer needs no overlap check,
 * which an exact alias would fail), else added. */
BQ_INLINE void gelu_bwd_row(float *dx, const float *dy, const float *x, const float *bias, int64_t C, int shared) {
    if (shared && bias)
        for (int64_t c = 0; c < C; c++) dx[c] = dx[c] * gelu_grad(x[c] + bias[c]);
    else if (shared)
        for (int64_t c = 0; c < C; c++) dx[c] = dx[c] * gelu_grad(x[c]);
    else if (bias)
        for (int64_t c = 0; c < C; c++) dx[c] = dx[c] + dy[c] * gelu_grad(x[c] + bias[c]);
    else
        for (int64_t c = 0; c < C; c++) dx[c] = dx[c] + dy[c] * gelu_grad(x[c]);
}

/* gelu_bwd_row's shared case for an input stored as bf16 words. */
BQ_INLINE void gelu_bwd_row_h(float *dx, const uint16_t *x, const float *bias, int64_t C) {
    if (bias)
        for (int64_t c = 0; c < C; c++) dx[c] = dx[c] * gelu_grad(bq_bf16_float(x[c]) + bias[c]);
    else
        for (int64_t c = 0; c < C; c++) dx[c] = dx[c] * gelu_grad(bq_bf16_float(x[c]));
}

BQ_VEC void bq_kernel_bias_gelu_backward_m(float *dinp, float *dbias, const float *dout, BqMat inp,
                                           const float *bias, int64_t N, int64_t C) {
    if (!inp.h) {
        bq_kernel_bias_gelu_backward(dinp, dbias, dout, inp.f, bias, N, C);
        return;
    }
    BQ_CHECK(dinp && dinp == dout); /* bf16 words: the shared-buffer form only */
#pragma omp parallel for if (N * C > PAR_MIN) schedule(static)
    for (int64_t n = 0; n < N; n++) gelu_bwd_row_h(dinp + n * C, inp.h + n * C, bias, C);
    if (dbias) bq_kernel_colsum_acc(dbias, dinp, N, C);
}

/* Shared buffer (or no bias gradient): rows over the threads, then the column sums of the finished
 * buffer. Separate buffers with a bias gradient: column blocks over the threads, each summing v over
 * the rows in order (the same order as bq_kernel_colsum_acc, so the same bits). The parallel loops sit
 * in this function itself so that every vector clone gets its own. */
BQ_VEC void bq_kernel_bias_gelu_backward(float *dinp, float *dbias, const float *dout, const float *inp,
                                         const float *bias, int64_t N, int64_t C) {
    int shared = dinp == dout;
    if (dinp && (shared || !dbias)) {
#pragma omp parallel for if (N * C > PAR_MIN) schedule(static)
        for (int64_t n = 0; n < N; n++) gelu_bwd_row(dinp + n * C, dout + n * C, inp + n * C, bias, C, shared);
        if (dbias) bq_kernel_colsum_acc(dbias, dinp, N, C);
        return;
    }
    if (!dbias) return;
    int64_t nblk = (C + COLBLK - 1) / COLBLK;
#pragma omp parallel for if (N * C > PAR_MIN) schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * COLBLK, c1 = c0 + COLBLK < C ? c0 + COLBLK : C;
        float acc[COLBLK];
        for (int64_t c = c0; c < c1; c++) acc[c - c0] = 0.0f;
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = c0; c < c1; c++) {
                int64_t i = n * C + c;
                float v = dout[i] * gelu_grad(bias ? inp[i] + bias[c] : inp[i]);
                if (dinp) dinp[i] += v;
                acc[c - c0] += v;
            }
        for (int64_t c = c0; c < c1; c++) dbias[c] += acc[c - c0];
    }
}

void bq_kernel_tanh_forward(float *out, const float *x, int64_t n) {
#pragma omp parallel for if (n > PAR_MIN / 4) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = tanhf(x[i]);
}

void bq_kernel_tanh_backward(float *dx, const float *dout, const float *out, int64_t n) {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) dx[i] += dout[i] * (1.0f - out[i] * out[i]);
}

/* ---- softmax with additive key mask ---- */

BQ_VEC void bq_kernel_softmax_mask_forward(float *out, const float *x, const float *mask, float scale,
                                           float mask_value, int64_t B, int64_t NH, int64_t Tq, int64_t T) {
    int64_t rows = B * NH * Tq;
#pragma omp parallel for if (rows * T > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * T;
        const float *mr = mask ? mask + (r / (NH * Tq)) * T : NULL;
        float *y = out + r * T;
        /* (1−m)·mask_value is 0 or mask_value for 0/1 masks; scale·x + (−FLT_MAX) stays finite */
        if (mr)
            for (int64_t j = 0; j < T; j++) y[j] = scale * xr[j] + (1.0f - mr[j]) * mask_value;
        else
            for (int64_t j = 0; j < T; j++) y[j] = scale * xr[j];
        float mx = row_max(y, T);
        for (int64_t j = 0; j < T; j++) y[j] = exp_fast(y[j] - mx);
        float inv = 1.0f / row_sum(y, T);
        for (int64_t j = 0; j < T; j++) y[j] *= inv;
    }
}

BQ_VEC void bq_kernel_softmax_mask_backward(float *dx, const float *dout, const float *out, float scale,
                                            int64_t rows, int64_t T) {
#pragma omp parallel for if (rows * T > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *dy = dout + r * T, *y = out + r * T;
        float dot = row_dot(dy, y, T);
        float *d = dx + r * T;
        for (int64_t j = 0; j < T; j++) d[j] += scale * y[j] * (dy[j] - dot);
    }
}

/* row_dot with y stored as bf16 words (the same lanes and order). */
BQ_INLINE float row_dot_h(const float *x, const uint16_t *y, int64_t n) {
    float a[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= n; j += LANES)
        for (int l = 0; l < LANES; l++) a[l] += x[j + l] * bq_bf16_float(y[j + l]);
    for (; j < n; j++) a[0] += x[j] * bq_bf16_float(y[j]);
    return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

BQ_VEC void bq_kernel_softmax_mask_backward_inplace_m(float *g, BqMat out, float scale, int64_t rows, int64_t T) {
    if (!out.h) {
        bq_kernel_softmax_mask_backward_inplace(g, out.f, scale, rows, T);
        return;
    }
#pragma omp parallel for if (rows * T > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *d = g + r * T;
        const uint16_t *y = out.h + r * T;
        float dot = row_dot_h(d, y, T);
        for (int64_t j = 0; j < T; j++) d[j] = scale * bq_bf16_float(y[j]) * (d[j] - dot);
    }
}

BQ_VEC void bq_kernel_softmax_mask_backward_inplace(float *g, const float *out, float scale, int64_t rows,
                                                    int64_t T) {
#pragma omp parallel for if (rows * T > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *d = g + r * T;
        const float *y = out + r * T;
        float dot = row_dot(d, y, T);
        for (int64_t j = 0; j < T; j++) d[j] = scale * y[j] * (d[j] - dot);
    }
}

/* ---- dropout ---- */

/* Dropped elements are x·0 (as PyTorch's x·mask/(1−p)), kept ones x/(1−p). */
BQ_VEC void bq_kernel_dropout_forward(float *out, const float *x, float p, uint64_t key, int64_t n) {
    float inv = 1.0f / (1.0f - p);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * drop_factor(key, i, p, inv);
}

BQ_VEC void bq_kernel_dropout_backward(float *dx, const float *dout, float p, uint64_t key, int64_t n) {
    float inv = 1.0f / (1.0f - p);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) dx[i] += dout[i] * drop_factor(key, i, p, inv);
}

BQ_VEC void bq_kernel_dropout_scale_inplace(float *g, float p, uint64_t key, int64_t n) {
    float inv = 1.0f / (1.0f - p);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) g[i] = g[i] * drop_factor(key, i, p, inv);
}

/* ---- token selection ---- */

void bq_kernel_select_token_forward(float *out, const float *x, int64_t B, int64_t T, int64_t H, int64_t t) {
    for (int64_t b = 0; b < B; b++) memcpy(out + b * H, x + (b * T + t) * H, (size_t)H * sizeof(float));
}

void bq_kernel_select_token_backward(float *dx, const float *dout, int64_t B, int64_t T, int64_t H, int64_t t) {
    for (int64_t b = 0; b < B; b++) {
        float *d = dx + (b * T + t) * H;
        for (int64_t i = 0; i < H; i++) d[i] += dout[b * H + i];
    }
}

/* ---- cross entropy (stable log-softmax) ---- */

void bq_kernel_cross_entropy_forward(float *loss, float *probs, const float *logits, const int32_t *labels,
                                     int64_t B, int64_t C) {
    double total = 0.0;
    for (int64_t b = 0; b < B; b++) {
        const float *z = logits + b * C;
        float *p = probs + b * C;
        float mx = z[0];
        for (int64_t c = 1; c < C; c++)
            if (z[c] > mx) mx = z[c];
        double s = 0.0;
        for (int64_t c = 0; c < C; c++) s += exp((double)z[c] - mx);
        double lse = mx + log(s);
        for (int64_t c = 0; c < C; c++) p[c] = (float)exp((double)z[c] - lse);
        total += lse - (double)z[labels[b]];
    }
    *loss = (float)(total / (double)B);
}

void bq_kernel_cross_entropy_backward(float *dlogits, float dloss, const float *probs, const int32_t *labels,
                                      int64_t B, int64_t C) {
    float g = dloss / (float)B;
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++)
            dlogits[b * C + c] += g * (probs[b * C + c] - (c == labels[b] ? 1.0f : 0.0f));
}

/* ---- span cross entropy (BertForQuestionAnswering's loss) ---- */

void bq_kernel_span_ce_forward(float *loss, float *probs, int64_t *cnt, const float *logits, const int32_t *pos,
                               int64_t B, int64_t T) {
    double side[2] = {0.0, 0.0};
    cnt[0] = cnt[1] = 0;
    for (int64_t b = 0; b < B; b++)
        for (int k = 0; k < 2; k++) {
            const float *z = logits + b * T * 2 + k; /* stride 2 over t */
            float *p = probs + b * T * 2 + k;
            float mx = z[0];
            for (int64_t t = 1; t < T; t++)
                if (z[2 * t] > mx) mx = z[2 * t];
            double s = 0.0;
            for (int64_t t = 0; t < T; t++) s += exp((double)z[2 * t] - mx);
            double lse = mx + log(s);
            for (int64_t t = 0; t < T; t++) p[2 * t] = (float)exp((double)z[2 * t] - lse);
            int32_t y = pos[2 * b + k];
            if (y < T) {
                side[k] += lse - (double)z[2 * (int64_t)y];
                cnt[k]++;
            }
        }
    double l = 0.0;
    for (int k = 0; k < 2; k++)
        if (cnt[k]) l += side[k] / (double)cnt[k];
    *loss = (float)(l / 2.0);
}

void bq_kernel_span_ce_backward(float *dlogits, float dloss, const float *probs, const int64_t *cnt,
                                const int32_t *pos, int64_t B, int64_t T) {
    for (int k = 0; k < 2; k++) {
        if (!cnt[k]) continue;
        float g = dloss / (2.0f * (float)cnt[k]);
        for (int64_t b = 0; b < B; b++) {
            int32_t y = pos[2 * b + k];
            if (y >= T) continue;
            float *d = dlogits + b * T * 2 + k;
            const float *p = probs + b * T * 2 + k;
            for (int64_t t = 0; t < T; t++) d[2 * t] += g * (p[2 * t] - (t == y ? 1.0f : 0.0f));
        }
    }
}

/* ---- fake quantization ---- */

/* One fake-quantized value, clamp(rne(x/s), lo, hi)·s (see below); shared by both forward kernels. */
BQ_INLINE float fq_value(float x, float s, float lo, float hi) { return fq_code_of(x, s, lo, hi) * s; }

/* q = clamp(rne(x/s), qmin, qmax) is computed as rne(clamp(x/s, qmin, qmax)): rounding is monotonic
 * and the bounds are integers, so the two agree, and the clamped value is small enough for rne_small.
 * A NaN x/s (only possible for s == 0, which the quantizers never produce) stays NaN. */
BQ_VEC void bq_kernel_fakequant_forward(float *out, const float *x, const float *scale, int64_t outer,
                                        int64_t nscale, int64_t inner, int qmin, int qmax) {
    int64_t rows = outer * nscale;
    float lo = (float)qmin, hi = (float)qmax;
#pragma omp parallel for if (rows * inner > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float s = scale[r % nscale];
        const float *xr = x + r * inner;
        float *y = out + r * inner;
        for (int64_t i = 0; i < inner; i++) y[i] = fq_value(xr[i], s, lo, hi);
    }
}

/* Straight-through estimator mask: lo <= rne(x/s) <= hi. x/s is clamped to [lo−2, hi+2] first (which
 * decides the test the same way) so rne_small applies; a NaN (s == 0) fails both tests. */
BQ_INLINE int ste_pass(float x, float s, float lo, float hi) {
    float v = x / s;
    v = v < lo - 2.0f ? lo - 2.0f : v;
    v = v > hi + 2.0f ? hi + 2.0f : v;
    float q = rne_small(v);
    return q >= lo && q <= hi;
}

/* dst = (accumulate ? dst : 0) + (mask ? src : 0) over one row of n elements sharing scale s; always
 * inlined with a constant `accumulate`, so each caller gets its own branch-free vector loop. The
 * parallel loops live in the BQ_VEC kernels below, not here: OpenMP outlines a parallel region inside the
 * function that holds it, and only a BQ_VEC function's outlined regions get the AVX2 clones. */
BQ_INLINE void ste_row(float *d, const float *g, const float *xr, float s, float lo, float hi, int64_t n,
                       int accumulate) {
    for (int64_t i = 0; i < n; i++) {
        float m = ste_pass(xr[i], s, lo, hi) ? g[i] : 0.0f;
        d[i] = accumulate ? d[i] + m : m;
    }
}

/* dx += dy where the mask passes. */
BQ_VEC void bq_kernel_fakequant_backward(float *dx, const float *dout, const float *x, const float *scale,
                                         int64_t outer, int64_t nscale, int64_t inner, int qmin, int qmax) {
    const int64_t rows = outer * nscale;
#pragma omp parallel for if (rows * inner > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        ste_row(dx + r * inner, dout + r * inner, x + r * inner, scale[r % nscale], (float)qmin, (float)qmax, inner, 1);
}

/* g = 0 where the mask fails (g is both the output's and the input's gradient). */
BQ_VEC void bq_kernel_fakequant_mask_inplace(float *g, const float *x, const float *scale, int64_t outer,
                                             int64_t nscale, int64_t inner, int qmin, int qmax) {
    const int64_t rows = outer * nscale;
#pragma omp parallel for if (rows * inner > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        ste_row(g + r * inner, g + r * inner, x + r * inner, scale[r % nscale], (float)qmin, (float)qmax, inner, 0);
}

/* In-place fake quantization of n elements sharing scale s, with the straight-through mask kept as bits:
 * bit i%32 of mask[i/32] = ste_pass(x[i]) (taken from x before it is overwritten), then x[i] = the value
 * bq_kernel_fakequant_forward gives. Words of 32 elements are spread over threads, so no two threads write
 * one word. */
BQ_VEC void bq_kernel_fakequant_forward_bits(float *x, uint32_t *mask, float s, int64_t n, int qmin, int qmax) {
    const int64_t nw = (n + 31) / 32;
    const float lo = (float)qmin, hi = (float)qmax;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t w = 0; w < nw; w++) {
        float *xw = x + w * 32;
        const int m = n - w * 32 < 32 ? (int)(n - w * 32) : 32;
        uint32_t pass[32];
        for (int k = 0; k < m; k++) pass[k] = (uint32_t)ste_pass(xw[k], s, lo, hi);
        for (int k = m; k < 32; k++) pass[k] = 0;
        uint32_t bits = 0;
        for (int k = 0; k < 32; k++) bits |= pass[k] << k;
        mask[w] = bits;
        for (int k = 0; k < m; k++) xw[k] = fq_value(xw[k], s, lo, hi);
    }
}

/* g[i] = 0 where bit i of mask (bq_kernel_fakequant_forward_bits) is clear. */
BQ_VEC void bq_kernel_fakequant_mask_bits_inplace(float *g, const uint32_t *mask, int64_t n) {
    const int64_t nw = (n + 31) / 32;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t w = 0; w < nw; w++) {
        float *gw = g + w * 32;
        const int m = n - w * 32 < 32 ? (int)(n - w * 32) : 32;
        const uint32_t bits = mask[w];
        for (int k = 0; k < m; k++) gw[k] = (bits >> k) & 1u ? gw[k] : 0.0f;
    }
}

/* LSQ step-size gradient term of one element: with v = x/s and q = rne(v) (the forward's rounding),
 * ∂(clamp(q, lo, hi)·s)/∂s under the straight-through rounding is q − v where lo <= q <= hi (the same
 * inside test as ste_pass), lo below and hi above. v is clamped to [lo−2, hi+2] only for the rounding
 * and the test, as in ste_pass; inside the range that clamp is inactive. */
BQ_INLINE float lsq_term(float x, float s, float lo, float hi) {
    float v = x / s;
    float vc = v < lo - 2.0f ? lo - 2.0f : v;
    vc = vc > hi + 2.0f ? hi + 2.0f : vc;
    float q = rne_small(vc);
    return q < lo ? lo : q > hi ? hi : q - v;
}

/* Σ dout·lsq_term over n contiguous elements with one scale, in double (a fixed order). */
BQ_INLINE double lsq_sum(const float *dout, const float *x, float s, float lo, float hi, int64_t n) {
    double acc = 0.0;
    for (int64_t i = 0; i < n; i++) acc += (double)dout[i] * (double)lsq_term(x[i], s, lo, hi);
    return acc;
}

/* Per tensor: LSQ_NB fixed blocks summed in parallel, then added in block order; per channel: one
 * channel per iteration, its (outer, inner) elements in order. Either way the sum does not depend on
 * the thread count, and nothing is allocated. */
#define LSQ_NB 64
BQ_VEC void bq_kernel_fakequant_backward_scale(float *dscale, const float *dout, const float *x, const float *scale,
                                               int64_t outer, int64_t nscale, int64_t inner, int qmin, int qmax,
                                               float grad_factor) {
    float lo = (float)qmin, hi = (float)qmax;
    if (nscale == 1) {
        int64_t n = outer * inner;
        double part[LSQ_NB];
        float s = scale[0];
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int b = 0; b < LSQ_NB; b++) {
            int64_t a = n * b / LSQ_NB, e = n * (b + 1) / LSQ_NB;
            part[b] = lsq_sum(dout + a, x + a, s, lo, hi, e - a);
        }
        double acc = 0.0;
        for (int b = 0; b < LSQ_NB; b++) acc += part[b];
        dscale[0] += (float)(acc * (double)grad_factor);
        return;
    }
#pragma omp parallel for if (outer * nscale * inner > PAR_MIN) schedule(static)
    for (int64_t c = 0; c < nscale; c++) {
        float s = scale[c];
        double acc = 0.0;
        for (int64_t o = 0; o < outer; o++) {
            int64_t off = (o * nscale + c) * inner;
            acc += lsq_sum(dout + off, x + off, s, lo, hi, inner);
        }
        dscale[c] += (float)(acc * (double)grad_factor);
    }
}

/* ---- min/max (observers) ---- */

/* *lo = min(*lo, p[0..len)), *hi = max(*hi, ...), in LANES lanes (min and max are exact: any order gives
 * the same result). */
BQ_INLINE void minmax_span(const float *p, int64_t len, float *lo, float *hi) {
    float l[LANES], h[LANES];
    for (int k = 0; k < LANES; k++) l[k] = INFINITY, h[k] = -INFINITY;
    int64_t j = 0;
    for (; j + LANES <= len; j += LANES)
        for (int k = 0; k < LANES; k++) {
            l[k] = p[j + k] < l[k] ? p[j + k] : l[k];
            h[k] = p[j + k] > h[k] ? p[j + k] : h[k];
        }
    for (; j < len; j++) {
        l[0] = p[j] < l[0] ? p[j] : l[0];
        h[0] = p[j] > h[0] ? p[j] : h[0];
    }
    for (int k = 0; k < LANES; k++) {
        *lo = l[k] < *lo ? l[k] : *lo;
        *hi = h[k] > *hi ? h[k] : *hi;
    }
}

BQ_VEC void bq_kernel_minmax(const float *x, int64_t n, float *mn, float *mx) {
    enum { CHUNK = 1 << 16 };
    int64_t nch = (n + CHUNK - 1) / CHUNK;
    float lo = INFINITY, hi = -INFINITY;
#pragma omp parallel for if (n > PAR_MIN) schedule(static) reduction(min : lo) reduction(max : hi)
    for (int64_t c = 0; c < nch; c++)
        minmax_span(x + c * CHUNK, c * CHUNK + CHUNK <= n ? CHUNK : n - c * CHUNK, &lo, &hi);
    *mn = lo;
    *mx = hi;
}

BQ_VEC void bq_kernel_minmax_rows(const float *x, int64_t rows, int64_t n, float *mn, float *mx) {
#pragma omp parallel for if (rows * n > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float lo = INFINITY, hi = -INFINITY;
        minmax_span(x + r * n, n, &lo, &hi);
        mn[r] = lo;
        mx[r] = hi;
    }
}

/* ---- distillation: KL at temperature T, mean squared error, constant scale ---- */

/* Softmax of z/T into p (double accumulation); returns the log-sum-exp of z/T. */
static double softmax_t(float *p, const float *z, int64_t C, double invT) {
    double mx = (double)z[0] * invT;
    for (int64_t c = 1; c < C; c++)
        if ((double)z[c] * invT > mx) mx = (double)z[c] * invT;
    double s = 0.0;
    for (int64_t c = 0; c < C; c++) s += exp((double)z[c] * invT - mx);
    double lse = mx + log(s);
    for (int64_t c = 0; c < C; c++) p[c] = (float)exp((double)z[c] * invT - lse);
    return lse;
}

void bq_kernel_kl_distill_forward(float *loss, float *ps, float *pt, const float *s, const float *t, int64_t B,
                                  int64_t C, float T) {
    double invT = 1.0 / (double)T, total = 0.0;
    for (int64_t b = 0; b < B; b++) {
        double lse_s = softmax_t(ps + b * C, s + b * C, C, invT);
        double lse_t = softmax_t(pt + b * C, t + b * C, C, invT);
        for (int64_t c = 0; c < C; c++) {
            /* log p_t − log p_s = (t − s)/T − lse_t + lse_s, exact even where p_t underflows */
            double lpt = (double)t[b * C + c] * invT - lse_t, lps = (double)s[b * C + c] * invT - lse_s;
            total += exp(lpt) * (lpt - lps);
        }
    }
    *loss = (float)((double)T * (double)T * total / (double)B);
}

void bq_kernel_kl_distill_backward(float *ds, float dloss, const float *ps, const float *pt, int64_t B, int64_t C,
                                   float T) {
    float g = dloss * T / (float)B;
    for (int64_t i = 0; i < B * C; i++) ds[i] += g * (ps[i] - pt[i]);
}

void bq_kernel_mse_forward(float *loss, const float *x, const float *y, int64_t n) {
    double total = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)x[i] - (double)y[i];
        total += d * d;
    }
    *loss = (float)(total / (double)n);
}

void bq_kernel_mse_backward(float *dx, float *dy, float dloss, const float *x, const float *y, int64_t n) {
    float g = 2.0f * dloss / (float)n;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float d = g * (x[i] - y[i]);
        if (dx) dx[i] += d;
        if (dy) dy[i] -= d;
    }
}

void bq_kernel_scale_forward(float *out, const float *x, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = a * x[i];
}

void bq_kernel_scale_backward(float *dx, const float *dout, float a, int64_t n) {
    for (int64_t i = 0; i < n; i++) dx[i] += a * dout[i];
}
