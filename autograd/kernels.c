/* Forward/backward kernels of the recorded ops (contracts in kernels.h).
 *
 * References: llm.c train_gpt2.c (layout of the kernels, LayerNorm backward formula); HF transformers
 * BertSelfAttention / nn.LayerNorm / GELUActivation / nn.CrossEntropyLoss for the semantics;
 * torch.fake_quantize_per_tensor_affine / _per_channel_affine (PyTorch 1.13) for the fake
 * quantization and its straight-through mask on the rounded value.
 *
 * Parallelism: OpenMP `parallel for` over rows (or column blocks when a reduction over rows is
 * needed, so every sum keeps a fixed order and results never depend on the thread count); matrix
 * products go to cblas_sgemm from the serial region only. */
#include "autograd/kernels.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

#include "autograd/bq.h"

/* Below this many elements a loop stays serial (thread start-up would dominate). */
#define PAR_MIN 16384
/* Column block width for reductions over rows (cache line multiples; 64 floats = 256 bytes). */
#define COLBLK 64

/* ---- linear ---- */

void bq_kernel_linear_forward(float *out, const float *inp, const float *weight, const float *bias, int64_t N,
                              int64_t C, int64_t OC) {
    float beta = 0.0f;
    if (bias) {
#pragma omp parallel for if (N * OC > PAR_MIN) schedule(static)
        for (int64_t n = 0; n < N; n++) memcpy(out + n * OC, bias, (size_t)OC * sizeof(float));
        beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC, (int)C, 1.0f, inp, (int)C, weight,
                (int)C, beta, out, (int)OC);
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
                               const float *weight, int64_t N, int64_t C, int64_t OC) {
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)C, (int)OC, 1.0f, dout, (int)OC,
                    weight, (int)C, 1.0f, dinp, (int)C);
    if (dweight)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C, (int)N, 1.0f, dout, (int)OC, inp,
                    (int)C, 1.0f, dweight, (int)C);
    if (dbias) bq_kernel_colsum_acc(dbias, dout, N, OC);
}

/* ---- attention: one sgemm per (batch, head) on strided head views (leading dimension H) ---- */

void bq_kernel_attn_scores_forward(float *scores, const float *q, const float *k, int64_t B, int64_t T,
                                   int64_t NH, int64_t d) {
    int64_t H = NH * d;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)d, 1.0f, q + b * T * H + h * d,
                        (int)H, k + b * T * H + h * d, (int)H, 0.0f, scores + (b * NH + h) * T * T, (int)T);
}

void bq_kernel_attn_scores_backward(float *dq, float *dk, const float *dscores, const float *q, const float *k,
                                    int64_t B, int64_t T, int64_t NH, int64_t d) {
    int64_t H = NH * d;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
            const float *ds = dscores + (b * NH + h) * T * T;
            int64_t off = b * T * H + h * d;
            if (dq) /* dQ_h += dS·K_h */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)d, (int)T, 1.0f, ds, (int)T,
                            k + off, (int)H, 1.0f, dq + off, (int)H);
            if (dk) /* dK_h += dSᵀ·Q_h */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)d, (int)T, 1.0f, ds, (int)T,
                            q + off, (int)H, 1.0f, dk + off, (int)H);
        }
}

void bq_kernel_attn_context_forward(float *ctx, const float *probs, const float *v, int64_t B, int64_t T,
                                    int64_t NH, int64_t d) {
    int64_t H = NH * d;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
            int64_t off = b * T * H + h * d;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)d, (int)T, 1.0f,
                        probs + (b * NH + h) * T * T, (int)T, v + off, (int)H, 0.0f, ctx + off, (int)H);
        }
}

void bq_kernel_attn_context_backward(float *dprobs, float *dv, const float *dctx, const float *probs,
                                     const float *v, int64_t B, int64_t T, int64_t NH, int64_t d) {
    int64_t H = NH * d;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++) {
            int64_t off = b * T * H + h * d, poff = (b * NH + h) * T * T;
            if (dprobs) /* dP += dC_h·V_hᵀ */
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)T, (int)d, 1.0f, dctx + off, (int)H,
                            v + off, (int)H, 1.0f, dprobs + poff, (int)T);
            if (dv) /* dV_h += Pᵀ·dC_h */
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)T, (int)d, (int)T, 1.0f, probs + poff,
                            (int)T, dctx + off, (int)H, 1.0f, dv + off, (int)H);
        }
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

void bq_kernel_mul_forward(float *out, const float *a, const float *b, int64_t n, int64_t C, int bcast) {
    if (!bcast) {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
        for (int64_t i = 0; i < n; i++) out[i] = a[i] * b[i];
        return;
    }
    int64_t rows = n / C;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < C; c++) out[r * C + c] = a[r * C + c] * b[c];
}

void bq_kernel_mul_backward(float *da, float *db, const float *dout, const float *a, const float *b, int64_t n,
                            int64_t C, int bcast) {
    int64_t rows = bcast ? n / C : 1;
    if (da) {
        if (bcast) {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < C; c++) da[r * C + c] += dout[r * C + c] * b[c];
        } else {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
            for (int64_t i = 0; i < n; i++) da[i] += dout[i] * b[i];
        }
    }
    if (db) {
        if (bcast) { /* column blocks, rows in order: deterministic */
            int64_t nblk = (C + COLBLK - 1) / COLBLK;
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
            for (int64_t blk = 0; blk < nblk; blk++) {
                int64_t c0 = blk * COLBLK, c1 = c0 + COLBLK < C ? c0 + COLBLK : C;
                float acc[COLBLK];
                for (int64_t c = c0; c < c1; c++) acc[c - c0] = 0.0f;
                for (int64_t r = 0; r < rows; r++)
                    for (int64_t c = c0; c < c1; c++) acc[c - c0] += dout[r * C + c] * a[r * C + c];
                for (int64_t c = c0; c < c1; c++) db[c] += acc[c - c0];
            }
        } else {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
            for (int64_t i = 0; i < n; i++) db[i] += dout[i] * a[i];
        }
    }
}

void bq_kernel_scale_forward(float *out, const float *x, float s, int64_t n) {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = s * x[i];
}

void bq_kernel_scale_backward(float *dx, const float *dout, float s, int64_t n) {
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++) dx[i] += s * dout[i];
}

/* ---- embedding ---- */

void bq_kernel_embedding_forward(float *out, const float *table, const int32_t *ids, int64_t N, int64_t H) {
#pragma omp parallel for if (N * H > PAR_MIN) schedule(static)
    for (int64_t n = 0; n < N; n++) memcpy(out + n * H, table + (int64_t)ids[n] * H, (size_t)H * sizeof(float));
}

/* Each thread owns a block of columns and visits the tokens in order: no two threads write the same
 * element and repeated ids accumulate in a fixed order. */
void bq_kernel_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t N, int64_t H) {
    int64_t nblk = (H + COLBLK - 1) / COLBLK;
#pragma omp parallel for if (N * H > PAR_MIN) schedule(static)
    for (int64_t blk = 0; blk < nblk; blk++) {
        int64_t c0 = blk * COLBLK, c1 = c0 + COLBLK < H ? c0 + COLBLK : H;
        for (int64_t n = 0; n < N; n++) {
            float *dst = dtable + (int64_t)ids[n] * H;
            const float *src = dout + n * H;
            for (int64_t c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
}

/* ---- layernorm ---- */

void bq_kernel_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                 const float *bias, int64_t N, int64_t H, float eps) {
#pragma omp parallel for if (N * H > PAR_MIN) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float *x = inp + n * H;
        float *y = out + n * H;
        float m = 0.0f;
        for (int64_t i = 0; i < H; i++) m += x[i];
        m /= (float)H;
        float v = 0.0f; /* second pass over centred values (no cancellation) */
        for (int64_t i = 0; i < H; i++) {
            float xc = x[i] - m;
            v += xc * xc;
        }
        v /= (float)H;
        float r = 1.0f / sqrtf(v + eps);
        for (int64_t i = 0; i < H; i++) y[i] = (x[i] - m) * r * weight[i] + bias[i];
        mean[n] = m;
        rstd[n] = r;
    }
}

void bq_kernel_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, const float *mean, const float *rstd,
                                  int64_t N, int64_t H) {
    if (dinp) {
#pragma omp parallel for if (N * H > PAR_MIN) schedule(static)
        for (int64_t n = 0; n < N; n++) {
            const float *x = inp + n * H, *dy = dout + n * H;
            float m = mean[n], r = rstd[n];
            /* dx = r·(g − mean(g) − x̂·mean(g⊙x̂)) with g = dy⊙w */
            float sg = 0.0f, sgx = 0.0f;
            for (int64_t i = 0; i < H; i++) {
                float g = dy[i] * weight[i];
                sg += g;
                sgx += g * (x[i] - m) * r;
            }
            sg /= (float)H;
            sgx /= (float)H;
            float *dx = dinp + n * H;
            for (int64_t i = 0; i < H; i++) {
                float xh = (x[i] - m) * r;
                dx[i] += r * (dy[i] * weight[i] - sg - xh * sgx);
            }
        }
    }
    if (dweight || dbias) {
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
}

/* ---- activations ---- */

void bq_kernel_gelu_forward(float *out, const float *x, int64_t n) {
#pragma omp parallel for if (n > PAR_MIN / 4) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = 0.5f * x[i] * (1.0f + erff(x[i] * (float)M_SQRT1_2));
}

void bq_kernel_gelu_backward(float *dx, const float *dout, const float *x, int64_t n) {
    const float inv_sqrt_2pi = 0.3989422804014327f;
#pragma omp parallel for if (n > PAR_MIN / 4) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float cdf = 0.5f * (1.0f + erff(xi * (float)M_SQRT1_2));
        float pdf = inv_sqrt_2pi * expf(-0.5f * xi * xi);
        dx[i] += dout[i] * (cdf + xi * pdf);
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

void bq_kernel_softmax_mask_forward(float *out, const float *x, const float *mask, float scale, float mask_value,
                                    int64_t B, int64_t NH, int64_t T) {
    int64_t rows = B * NH * T;
#pragma omp parallel for if (rows * T > PAR_MIN / 4) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * T;
        const float *mr = mask ? mask + (r / (NH * T)) * T : NULL;
        float *y = out + r * T;
        float mx = -INFINITY;
        for (int64_t j = 0; j < T; j++) {
            /* (1−m)·mask_value is 0 or mask_value for 0/1 masks; scale·x + (−FLT_MAX) stays finite */
            float z = scale * xr[j] + (mr ? (1.0f - mr[j]) * mask_value : 0.0f);
            y[j] = z;
            if (z > mx) mx = z;
        }
        float s = 0.0f;
        for (int64_t j = 0; j < T; j++) {
            float e = expf(y[j] - mx);
            y[j] = e;
            s += e;
        }
        float inv = 1.0f / s;
        for (int64_t j = 0; j < T; j++) y[j] *= inv;
    }
}

void bq_kernel_softmax_mask_backward(float *dx, const float *dout, const float *out, float scale, int64_t rows,
                                     int64_t T) {
#pragma omp parallel for if (rows * T > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *dy = dout + r * T, *y = out + r * T;
        float dot = 0.0f;
        for (int64_t j = 0; j < T; j++) dot += dy[j] * y[j];
        float *d = dx + r * T;
        for (int64_t j = 0; j < T; j++) d[j] += scale * y[j] * (dy[j] - dot);
    }
}

/* ---- dropout ---- */

void bq_kernel_dropout_forward(float *out, uint8_t *keep, const float *x, float p, uint64_t key, int64_t n) {
    float inv = 1.0f / (1.0f - p);
#pragma omp parallel for if (n > PAR_MIN / 4) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        uint8_t k = bq_hash_uniform(key, (uint64_t)i) >= p;
        keep[i] = k;
        out[i] = k ? x[i] * inv : 0.0f;
    }
}

void bq_kernel_dropout_backward(float *dx, const float *dout, const uint8_t *keep, float p, int64_t n) {
    float inv = 1.0f / (1.0f - p);
#pragma omp parallel for if (n > PAR_MIN) schedule(static)
    for (int64_t i = 0; i < n; i++)
        if (keep[i]) dx[i] += dout[i] * inv;
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

/* ---- fake quantization ---- */

void bq_kernel_fakequant_forward(float *out, const float *x, const float *scale, int64_t outer, int64_t nscale,
                                 int64_t inner, int qmin, int qmax) {
    int64_t rows = outer * nscale;
    float lo = (float)qmin, hi = (float)qmax;
#pragma omp parallel for if (rows * inner > PAR_MIN / 4) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float s = scale[r % nscale];
        const float *xr = x + r * inner;
        float *y = out + r * inner;
        for (int64_t i = 0; i < inner; i++) {
            /* fmaxf/fminf return the number when x/s is NaN (s == 0), so q stays finite */
            float q = fminf(fmaxf(nearbyintf(xr[i] / s), lo), hi);
            y[i] = q * s;
        }
    }
}

void bq_kernel_fakequant_backward(float *dx, const float *dout, const float *x, const float *scale,
                                  int64_t outer, int64_t nscale, int64_t inner, int qmin, int qmax) {
    int64_t rows = outer * nscale;
    float lo = (float)qmin, hi = (float)qmax;
#pragma omp parallel for if (rows * inner > PAR_MIN) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float s = scale[r % nscale];
        const float *xr = x + r * inner, *dy = dout + r * inner;
        float *d = dx + r * inner;
        for (int64_t i = 0; i < inner; i++) {
            float q = nearbyintf(xr[i] / s); /* NaN (s == 0) fails both tests: no gradient */
            if (q >= lo && q <= hi) d[i] += dy[i];
        }
    }
}
