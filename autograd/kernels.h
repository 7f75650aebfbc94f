/* Pure forward/backward kernels on raw contiguous float arrays for the ops of tensor.h.
 *
 * Argument order follows llm.c: forward (out, saved, inputs, weights, dims); backward (dinputs,
 * dweights, dout, saved/inputs, dims). Every backward ACCUMULATES (+=) into its gradient arrays, and
 * any gradient pointer may be NULL (frozen parameter or input without gradient): that term is then
 * skipped. Kernels never allocate; saved state is passed in by the caller (tensor.c puts it in the
 * activation arena). Large loops run under OpenMP `parallel for`; matrix products go through bq_gemm
 * (autograd/gemm.h) in the precision `prec` the caller passes (fp32: OpenBLAS; bf16: bf16 operands, fp32
 * accumulation): the Linears' from the serial region (threaded inside the call), the attention's one
 * call per head from inside an OpenMP loop over the heads (each computed on the calling thread).
 * Every kernel's result is independent of the thread count (no atomics, fixed reduction orders), except
 * the Linear kernels' last bits: OpenBLAS splits their sgemm by its thread count (docs/design.md §5).
 *
 * References: llm.c (train_gpt2.c) for the kernel layout; HF transformers BertSelfAttention,
 * BertLayerNorm (nn.LayerNorm), GELUActivation (exact erf) for the semantics; pytorch-quantization
 * TensorQuantizer (fake quant with straight-through estimator). */
#ifndef BQ_KERNELS_H
#define BQ_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "autograd/bq.h"
#include "autograd/gemm.h"

struct BqQGemmWeights; /* autograd/qgemm.h */

/* out (N,OC) = inp (N,C) · weight(OC,C)ᵀ + bias (OC) (bias may be NULL). */
void bq_kernel_linear_forward(float *out, const float *inp, const float *weight, const float *bias, int64_t N,
                              int64_t C, int64_t OC, BqPrecision prec);
/* The kernels named *_m take the inputs marked BqMat in either storage (autograd/gemm.h; bf16 words only
 * with prec BQ_PRECISION_BF16, where the products round them to bf16 anyway); the plain kernels are
 * these on fp32 inputs. */
void bq_kernel_linear_forward_m(float *out, BqMat inp, const float *weight, const float *bias, int64_t N, int64_t C,
                                int64_t OC, BqPrecision prec);
/* The same Linear on integers (autograd/qgemm.h) for inp on the per-tensor 8-bit grid sx (zero point 0)
 * and a weight whose codes and scales sw are in w (N = bq_qgemm_weights_n(w) rows of C): codes (N·C
 * bytes) = clamp(rne(inp/sx), -128, 127) + 128, acc (N·OC int32) = Σ_c code·qw exactly, out =
 * fl(fl(acc·fl(sx·sw[o])) + bias[o]). codes (unused by split weights) and acc are caller scratch. Returns
 * bq_qgemm_linear's status. */
int bq_kernel_linear_qgemm_forward(float *out, uint8_t *codes, int32_t *acc, const float *inp,
                                   struct BqQGemmWeights *w, float sx, const float *bias, int64_t N, int64_t C,
                                   int64_t OC);
/* dinp += dout·weight, dweight += doutᵀ·inp, dbias += Σ_n dout[n,:]. */
void bq_kernel_linear_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                               const float *weight, int64_t N, int64_t C, int64_t OC, BqPrecision prec);
/* The same with the input in either storage, and dy the operand both products read: dout itself
 * (bq_mat_f32(dout)) or, in bf16, its words from bq_gemm_words, converted once for the two products
 * (the same values either way); dbias reads dout. */
void bq_kernel_linear_backward_m(float *dinp, float *dweight, float *dbias, const float *dout, BqMat dy, BqMat inp,
                                 const float *weight, int64_t N, int64_t C, int64_t OC, BqPrecision prec);

/* q (B,Tq,H), k (B,T,H), H = NH·d; head h is the column block [h·d, (h+1)·d) (strided view, leading dim
 * H). scores (B,NH,Tq,T): scores[b,h,i,j] = Σ_e q[b,i,h·d+e]·k[b,j,h·d+e]. The forwards take Tq query rows
 * against T keys and values (Tq = T, or Tq = 1: the last layer's [CLS] query in a tape-less classification
 * forward, layers/bert.c); the backwards take Tq = T. */
void bq_kernel_attn_scores_forward(float *scores, const float *q, const float *k, int64_t B, int64_t Tq,
                                   int64_t T, int64_t NH, int64_t d, BqPrecision prec);
void bq_kernel_attn_scores_backward(float *dq, float *dk, const float *dscores, const float *q, const float *k,
                                    int64_t B, int64_t T, int64_t NH, int64_t d, BqPrecision prec);
void bq_kernel_attn_scores_forward_m(float *scores, BqMat q, BqMat k, int64_t B, int64_t Tq, int64_t T, int64_t NH,
                                     int64_t d, BqPrecision prec);
void bq_kernel_attn_scores_backward_m(float *dq, float *dk, const float *dscores, BqMat q, BqMat k, int64_t B,
                                      int64_t T, int64_t NH, int64_t d, BqPrecision prec);
/* probs (B,NH,Tq,T), v (B,T,H) → ctx (B,Tq,H): ctx[b,i,h·d+e] = Σ_j probs[b,h,i,j]·v[b,j,h·d+e]. */
void bq_kernel_attn_context_forward(float *ctx, const float *probs, const float *v, int64_t B, int64_t Tq,
                                    int64_t T, int64_t NH, int64_t d, BqPrecision prec);
void bq_kernel_attn_context_backward(float *dprobs, float *dv, const float *dctx, const float *probs,
                                     const float *v, int64_t B, int64_t T, int64_t NH, int64_t d, BqPrecision prec);
void bq_kernel_attn_context_forward_m(float *ctx, BqMat probs, BqMat v, int64_t B, int64_t Tq, int64_t T, int64_t NH,
                                      int64_t d, BqPrecision prec);
void bq_kernel_attn_context_backward_m(float *dprobs, float *dv, const float *dctx, BqMat probs, BqMat v, int64_t B,
                                       int64_t T, int64_t NH, int64_t d, BqPrecision prec);
/* The two attention products on integer codes, for inputs that are fake-quant outputs of per-tensor
 * quantizers with scales sa, sb: codes rne(x/s) (exact on such values), int32 sums, one fp32 scaling,
 * out = fl(Σ ca·cb · fl(sa·sb)); shapes and layout as bq_kernel_attn_scores_forward /
 * bq_kernel_attn_context_forward (their backwards apply unchanged: straight-through on the fp32 values).
 * scratch: nscratch · bq_kernel_attn_int_scratch(T, d) bytes; at most nscratch threads run. Results do
 * not depend on the CPU or the thread count. */
size_t bq_kernel_attn_int_scratch(int64_t T, int64_t d);
void bq_kernel_attn_scores_int_forward(float *scores, void *scratch, int nscratch, const float *q, const float *k,
                                       float sq, float sk, int64_t B, int64_t Tq, int64_t T, int64_t NH, int64_t d);
void bq_kernel_attn_context_int_forward(float *ctx, void *scratch, int nscratch, const float *probs, const float *v,
                                        float sp, float sv, int64_t B, int64_t Tq, int64_t T, int64_t NH, int64_t d);

/* ctx = dropout(probs)·v with the mask of bq_kernel_dropout_forward(key) over the (B,NH,T,T) elements
 * (0 < p < 1), the dropped probabilities formed per (batch, head) in a thread's scratch block and never
 * stored; backward: dprobs += (dctx·vᵀ)·m/(1−p), dv += dropout(probs)ᵀ·dctx. scratch: nscratch·T·T
 * floats, thread k using block k; the head loop runs on at most nscratch threads. Same bits as
 * bq_kernel_dropout_forward followed by bq_kernel_attn_context_forward (and their backwards). */
void bq_kernel_attn_context_dropout_forward(float *ctx, float *scratch, int nscratch, const float *probs,
                                            const float *v, float p, uint64_t key, int64_t B, int64_t T, int64_t NH,
                                            int64_t d, BqPrecision prec);
void bq_kernel_attn_context_dropout_backward(float *dprobs, float *dv, float *scratch, int nscratch,
                                             const float *dctx, const float *probs, const float *v, float p,
                                             uint64_t key, int64_t B, int64_t T, int64_t NH, int64_t d,
                                             BqPrecision prec);
void bq_kernel_attn_context_dropout_forward_m(float *ctx, float *scratch, int nscratch, BqMat probs, BqMat v, float p,
                                              uint64_t key, int64_t B, int64_t T, int64_t NH, int64_t d,
                                              BqPrecision prec);
void bq_kernel_attn_context_dropout_backward_m(float *dprobs, float *dv, float *scratch, int nscratch,
                                               const float *dctx, BqMat probs, BqMat v, float p, uint64_t key,
                                               int64_t B, int64_t T, int64_t NH, int64_t d, BqPrecision prec);

/* Elementwise with optional broadcast: b has n elements when bcast == 0, else C elements broadcast
 * over the rows of a (n = rows·C). */
void bq_kernel_add_forward(float *out, const float *a, const float *b, int64_t n, int64_t C, int bcast);
void bq_kernel_add_backward(float *da, float *db, const float *dout, int64_t n, int64_t C, int bcast);
/* dst[c] += Σ_r src[r,c] over a (rows,C) array; rows summed in order (deterministic). */
void bq_kernel_colsum_acc(float *dst, const float *src, int64_t rows, int64_t C);

/* out (N,H) = table[ids[n],:]; backward scatter-adds into dtable, partitioned over columns. */
void bq_kernel_embedding_forward(float *out, const float *table, const int32_t *ids, int64_t N, int64_t H);
void bq_kernel_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t N, int64_t H);
/* The same, skipping the tokens whose id is padding_idx (torch nn.Embedding(padding_idx): that row
 * never receives a gradient); padding_idx < 0 skips nothing. */
void bq_kernel_embedding_backward_pad(float *dtable, const float *dout, const int32_t *ids, int64_t N, int64_t H,
                                      int32_t padding_idx);

/* BertEmbeddings without its dropout: out[n] = LayerNorm(word[wid[n]] + type[tid[n]] + pos[pid[n]]) over rows
 * of H, the sum in that order (HF's), computed in place in out; mean and rstd (N) saved. The backward
 * forms each row's sum again from the tables (nothing else is stored), then scatter-adds the LayerNorm
 * input gradient into the three tables (each may be NULL) and the weight and bias gradients, column
 * blocks over the threads, rows in order: the same bits as the embedding, add and layernorm kernels
 * one after the other. stats: 2·N floats of scratch for the backward. */
void bq_kernel_embed_layernorm_forward(float *out, float *mean, float *rstd, const float *word, const float *type,
                                       const float *pos, const int32_t *wid, const int32_t *tid, const int32_t *pid,
                                       const float *weight, const float *bias, int64_t N, int64_t H, float eps);
void bq_kernel_embed_layernorm_backward(float *dword, float *dtype, float *dpos, float *dweight, float *dbias,
                                        float *stats, const float *dout, const float *word, const float *type,
                                        const float *pos, const int32_t *wid, const int32_t *tid,
                                        const int32_t *pid, const float *weight, const float *mean,
                                        const float *rstd, int64_t N, int64_t H, int32_t word_padding_idx);

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

/* x (B,NH,Tq,T) as B·NH·Tq rows of T (Tq query rows against T keys; Tq < T: the last layer's [CLS]
 * query, layers/bert.c); mask (B,T) or NULL. out = softmax(scale·x + (1−mask)·mask_value); out may be x
 * (in place).
 * Backward: dx += scale·y⊙(dy − Σ dy⊙y). */
void bq_kernel_softmax_mask_forward(float *out, const float *x, const float *mask, float scale, float mask_value,
                                    int64_t B, int64_t NH, int64_t Tq, int64_t T);
void bq_kernel_softmax_mask_backward(float *dx, const float *dout, const float *out, float scale, int64_t rows,
                                     int64_t T);
/* The same backward for a softmax computed in place whose input and output share one gradient buffer:
 * g = scale·y⊙(g − Σ g⊙y) row by row. */
void bq_kernel_softmax_mask_backward_inplace(float *g, const float *out, float scale, int64_t rows, int64_t T);
/* The same with the probabilities in either storage. */
void bq_kernel_softmax_mask_backward_inplace_m(float *g, BqMat out, float scale, int64_t rows, int64_t T);

/* out = x·m/(1−p) with m[i] = bq_hash_uniform(key, i) >= p. Nothing is stored: the backward draws the
 * same mask again from (key, i), so the mask costs no memory (not even bits) and no pass of its own. */
void bq_kernel_dropout_forward(float *out, const float *x, float p, uint64_t key, int64_t n);
/* dx += dout·m/(1−p). */
void bq_kernel_dropout_backward(float *dx, const float *dout, float p, uint64_t key, int64_t n);
/* g = g·m/(1−p) in place: the backward of a dropout whose output shares its input's gradient buffer
 * (the input has no other consumer). */
void bq_kernel_dropout_scale_inplace(float *g, float p, uint64_t key, int64_t n);

/* out (N,C) = gelu(inp + bias), bias (C) broadcast over the rows (NULL: none); out may be inp (in place).
 * Backward: with v = dout·gelu'(inp + bias), dinp += v and dbias += Σ_n v (columns summed in row order,
 * so any thread count gives the same bits). dinp == dout is allowed and means the two share one buffer
 * (the input has no other consumer): the buffer then becomes v, since nothing else has accumulated
 * into the input's gradient. inp is the pre-activation, so the GELU output need not be kept for this
 * backward. */
void bq_kernel_bias_gelu_forward(float *out, const float *inp, const float *bias, int64_t N, int64_t C);
void bq_kernel_bias_gelu_backward(float *dinp, float *dbias, const float *dout, const float *inp, const float *bias,
                                  int64_t N, int64_t C);
/* The same with the input in either storage and the output as floats (out) or as bf16 words (out16, the
 * rounded values; exactly one of the two set). The backward takes bf16 words only in the shared-buffer
 * form (dinp == dout). */
void bq_kernel_bias_gelu_forward_m(float *out, uint16_t *out16, BqMat inp, const float *bias, int64_t N, int64_t C);
void bq_kernel_bias_gelu_backward_m(float *dinp, float *dbias, const float *dout, BqMat inp, const float *bias,
                                    int64_t N, int64_t C);

/* Residual add and LayerNorm in one pass (BertSelfOutput / BertOutput): sum = drop(a) + b, out =
 * LayerNorm(sum)·weight + bias over rows of H, where drop(a) = a·m/(1−p) with the mask of
 * bq_kernel_dropout_forward(key) when p > 0, else a. sum (N,H), mean and rstd (N) are saved for the
 * backward. The arithmetic is that of dropout, add and layernorm_forward one after the other, so the
 * results are the same bits. */
void bq_kernel_residual_layernorm_forward(float *out, float *sum, float *mean, float *rstd, const float *a,
                                          const float *b, const float *weight, const float *bias, float p,
                                          uint64_t key, int64_t N, int64_t H, float eps);
/* With ds the LayerNorm input gradient: da += ds·m/(1−p) (ds when p == 0), db += ds, dweight and
 * dbias as layernorm_backward. Any gradient may be NULL. */
void bq_kernel_residual_layernorm_backward(float *da, float *db, float *dweight, float *dbias, const float *dout,
                                           const float *sum, const float *weight, const float *mean,
                                           const float *rstd, float p, uint64_t key, int64_t N, int64_t H);

/* x (B,T,H) → out (B,H) = x[:,t,:]. */
void bq_kernel_select_token_forward(float *out, const float *x, int64_t B, int64_t T, int64_t H, int64_t t);
void bq_kernel_select_token_backward(float *dx, const float *dout, int64_t B, int64_t T, int64_t H, int64_t t);

/* logits (B,C), labels (B) → *loss = mean_b −log softmax(logits[b])[labels[b]]; probs (B,C) saved.
 * Backward: dlogits += dloss·(probs − onehot)/B. */
void bq_kernel_cross_entropy_forward(float *loss, float *probs, const float *logits, const int32_t *labels,
                                     int64_t B, int64_t C);
void bq_kernel_cross_entropy_backward(float *dlogits, float dloss, const float *probs, const int32_t *labels,
                                      int64_t B, int64_t C);

/* logits (B,T,2), pos (B,2) in [0,T] (T: ignored) → *loss = (Σ_k mean over b with pos[b,k] < T of
 * −log softmax_t(logits[b,:,k])[pos[b,k]]) / 2; probs (B,T,2) saved; cnt[k] = number of examples
 * counted on side k. Backward: dlogits[b,t,k] += dloss·(probs − onehot)/(2·cnt[k]) for counted b. */
void bq_kernel_span_ce_forward(float *loss, float *probs, int64_t *cnt, const float *logits, const int32_t *pos,
                               int64_t B, int64_t T);
void bq_kernel_span_ce_backward(float *dlogits, float dloss, const float *probs, const int64_t *cnt,
                                const int32_t *pos, int64_t B, int64_t T);
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
/* In place, for an activation whose input is needed by nobody after it: x = fake-quant(x) (same values as
 * bq_kernel_fakequant_forward, one scale), with the straight-through mask stored as bits in mask
 * ((n + 31) / 32 words; bit i%32 of word i/32 is element i's) instead of keeping x. */
void bq_kernel_fakequant_forward_bits(float *x, uint32_t *mask, float s, int64_t n, int qmin, int qmax);
/* g = 0 where the mask bit is clear: the backward of bq_kernel_fakequant_forward_bits on a gradient buffer
 * shared by its output and input. */
void bq_kernel_fakequant_mask_bits_inplace(float *g, const uint32_t *mask, int64_t n);
/* Learned step size (LSQ, Esser et al., ICLR 2020, eq. 3), the scale's gradient of the same op: for each
 * scale c, dscale[c] += grad_factor · Σ dout·t over the elements (o,c,i) using it, where with v = x/s and
 * q = nearbyintf(v): t = q − v where qmin <= q <= qmax (the straight-through mask of
 * bq_kernel_fakequant_backward, on the ROUNDED value as torch._fake_quantize_learnable_per_tensor_affine),
 * t = qmin where q < qmin and t = qmax where q > qmax. grad_factor is the paper's g = 1/√(N·qmax).
 * Sums run in double in a fixed order (any thread count gives the same bits). dout must be read before an
 * in-place mask (bq_kernel_fakequant_mask_inplace) overwrites it. */
void bq_kernel_fakequant_backward_scale(float *dscale, const float *dout, const float *x, const float *scale,
                                        int64_t outer, int64_t nscale, int64_t inner, int qmin, int qmax,
                                        float grad_factor);
/* Minimum and maximum of x (n > 0); NaNs are ignored. Order-independent, so exact for any thread count. */
void bq_kernel_minmax(const float *x, int64_t n, float *mn, float *mx);
/* mn[r], mx[r] = min and max of row r of x (rows, n): per-channel weight ranges, rows in parallel. */
void bq_kernel_minmax_rows(const float *x, int64_t rows, int64_t n, float *mn, float *mx);

#endif
