/* Pure forward/backward kernels on raw contiguous float arrays for the ops of tensor.h.
 *
 * Argument order follows llm.c: forward (out, saved, inputs, weights, dims); backward (dinputs,
 * dweights, dout, saved/inputs, dims). Every backward ACCUMULATES (+=) into its gradient arrays, and
 * any gradient pointer may be NULL (frozen parameter or input without gradient): that term is then
 * skipped. Kernels never allocate; saved state is passed in by the caller (tensor.c puts it in the
 * activation arena). Large loops run under OpenMP `parallel for`; matrix products go through
 * cblas_sgemm (OpenBLAS threads itself, so no sgemm is ever called inside an OpenMP region).
 * Every kernel's result is independent of the thread count (no atomics, fixed reduction orders).
 *
 * References: llm.c (train_gpt2.c) for the kernel layout; HF transformers BertSelfAttention,
 * BertLayerNorm (nn.LayerNorm), GELUActivation (exact erf) for the semantics; pytorch-quantization
 * TensorQuantizer (fake quant with straight-through estimator). */
#ifndef BQ_KERNELS_H
#define BQ_KERNELS_H

#include <stdint.h>

/* out (N,OC) = inp (N,C) · weight(OC,C)ᵀ + bias (OC) (bias may be NULL). */
void bq_kernel_linear_forward(float *out, const float *inp, const float *weight, const float *bias, int64_t N,
                              int64_t C, int64_t OC);
/* dinp += dout·weight, dweight += doutᵀ·inp, dbias += Σ_n dout[n,:]. */
void bq_kernel_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, int64_t N, int64_t C, int64_t OC);

/* q, k (B,T,H), H = NH·d; head h is the column block [h·d, (h+1)·d) (strided view, leading dim H).
 * scores (B,NH,T,T): scores[b,h,i,j] = Σ_e q[b,i,h·d+e]·k[b,j,h·d+e]. */
void bq_kernel_attn_scores_forward(float *scores, const float *q, const float *k, int64_t B, int64_t T,
                                   int64_t NH, int64_t d);
void bq_kernel_attn_scores_backward(float *dq, float *dk, const float *dscores, const float *q, const float *k,
                                    int64_t B, int64_t T, int64_t NH, int64_t d);
/* probs (B,NH,T,T), v (B,T,H) → ctx (B,T,H): ctx[b,i,h·d+e] = Σ_j probs[b,h,i,j]·v[b,j,h·d+e]. */
void bq_kernel_attn_context_forward(float *ctx, const float *probs, const float *v, int64_t B, int64_t T,
                                    int64_t NH, int64_t d);
void bq_kernel_attn_context_backward(float *dprobs, float *dv, const float *dctx, const float *probs,
                                     const float *v, int64_t B, int64_t T, int64_t NH, int64_t d);

/* Elementwise with optional broadcast: b has n elements when bcast == 0, else C elements broadcast
 * over the rows of a (n = rows·C). */
void bq_kernel_add_forward(float *out, const float *a, const float *b, int64_t n, int64_t C, int bcast);
void bq_kernel_add_backward(float *da, float *db, const float *dout, int64_t n, int64_t C, int bcast);
/* dst[c] += Σ_r src[r,c] over a (rows,C) array; rows summed in order (deterministic). */
void bq_kernel_colsum_acc(float *dst, const float *src, int64_t rows, int64_t C);

/* out (N,H) = table[ids[n],:]; backward scatter-adds into dtable, partitioned over columns. */
void bq_kernel_embedding_forward(float *out, const float *table, const int32_t *ids, int64_t N, int64_t H);
void bq_kernel_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t N, int64_t H);

/* Two-pass LayerNorm over rows of length H; mean and rstd (N) are saved for backward. */
void bq_kernel_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *weight,
                                 const float *bias, int64_t N, int64_t H, float eps);
void bq_kernel_layernorm_backward(float *dinp, float *dweight, float *dbias, const float *dout,
                                  const float *inp, const float *weight, const float *mean, const float *rstd,
                                  int64_t N, int64_t H);

/* y = x·Φ(x) = 0.5·x·(1 + erf(x/√2)). */
void bq_kernel_gelu_forward(float *out, const float *x, int64_t n);
void bq_kernel_gelu_backward(float *dx, const float *dout, const float *x, int64_t n);
/* Backward uses the output: dx += dout·(1 − y²). */
void bq_kernel_tanh_forward(float *out, const float *x, int64_t n);
void bq_kernel_tanh_backward(float *dx, const float *dout, const float *out, int64_t n);

/* x (B,NH,T,T) as B·NH·T rows of T; mask (B,T) or NULL. out = softmax(scale·x + (1−mask)·mask_value).
 * Backward: dx += scale·y⊙(dy − Σ dy⊙y). */
void bq_kernel_softmax_mask_forward(float *out, const float *x, const float *mask, float scale, float mask_value,
                                    int64_t B, int64_t NH, int64_t T);
void bq_kernel_softmax_mask_backward(float *dx, const float *dout, const float *out, float scale, int64_t rows,
                                     int64_t T);

/* keep[i] = bq_hash_uniform(key, i) >= p; out = x·keep/(1−p). */
void bq_kernel_dropout_forward(float *out, uint8_t *keep, const float *x, float p, uint64_t key, int64_t n);
void bq_kernel_dropout_backward(float *dx, const float *dout, const uint8_t *keep, float p, int64_t n);

/* x (B,T,H) → out (B,H) = x[:,t,:]. */
void bq_kernel_select_token_forward(float *out, const float *x, int64_t B, int64_t T, int64_t H, int64_t t);
void bq_kernel_select_token_backward(float *dx, const float *dout, int64_t B, int64_t T, int64_t H, int64_t t);

/* logits (B,C), labels (B) → *loss = mean_b −log softmax(logits[b])[labels[b]]; probs (B,C) saved.
 * Backward: dlogits += dloss·(probs − onehot)/B. */
void bq_kernel_cross_entropy_forward(float *loss, float *probs, const float *logits, const int32_t *labels,
                                     int64_t B, int64_t C);
void bq_kernel_cross_entropy_backward(float *dlogits, float dloss, const float *probs, const int32_t *labels,
                                      int64_t B, int64_t C);

/* Distillation KL at temperature T: student s and teacher t logits (B,C) → *loss =
 * T²·(1/B)·Σ_b Σ_c p_t·(log p_t − log p_s), p = softmax(z/T) (stable log-softmax in double); ps and pt
 * (B,C) receive the two softmaxes (saved). Backward: ds += dloss·T·(ps − pt)/B; the teacher has none. */
void bq_kernel_kl_distill_forward(float *loss, float *ps, float *pt, const float *s, const float *t, int64_t B,
                                  int64_t C, float T);
void bq_kernel_kl_distill_backward(float *ds, float dloss, const float *ps, const float *pt, int64_t B, int64_t C,
                                   float T);
/* *loss = (1/n)·Σ_i (x_i − y_i)², summed in double in a fixed order. Backward: dx += dloss·2(x − y)/n and
 * dy −= dloss·2(x − y)/n (either may be NULL). */
void bq_kernel_mse_forward(float *loss, const float *x, const float *y, int64_t n);
void bq_kernel_mse_backward(float *dx, float *dy, float dloss, const float *x, const float *y, int64_t n);
/* out = a·x; backward dx += a·dout. */
void bq_kernel_scale_forward(float *out, const float *x, float a, int64_t n);
void bq_kernel_scale_backward(float *dx, const float *dout, float a, int64_t n);

/* Fake quantization of x viewed as (outer, nscale, inner): element (o,c,i) uses scale[c] (per tensor:
 * nscale = 1, inner = n). q = clamp(nearbyintf(x/s), qmin, qmax) with a true division, out = q·s.
 * Backward (straight-through): dx += dout where qmin <= nearbyintf(x/s) <= qmax, else nothing — the
 * mask is on the ROUNDED value, as in torch.fake_quantize_per_tensor_affine (so x/s in (127, 127.5]
 * still passes the gradient, x/s = 127.5 does not: it rounds to 128). */
void bq_kernel_fakequant_forward(float *out, const float *x, const float *scale, int64_t outer, int64_t nscale,
                                 int64_t inner, int qmin, int qmax);
void bq_kernel_fakequant_backward(float *dx, const float *dout, const float *x, const float *scale,
                                  int64_t outer, int64_t nscale, int64_t inner, int qmin, int qmax);
/* The straight-through mask applied in place: g[i] = g[i] where qmin <= rne(x/s) <= qmax, else 0. For a
 * fake-quant op whose output shares its input's gradient buffer (the input has no other consumer). */
void bq_kernel_fakequant_mask_inplace(float *g, const float *x, const float *scale, int64_t outer, int64_t nscale,
                                      int64_t inner, int qmin, int qmax);
/* Minimum and maximum of x (n > 0); NaNs are ignored. Order-independent, so exact for any thread count. */
void bq_kernel_minmax(const float *x, int64_t n, float *mn, float *mx);

#endif
