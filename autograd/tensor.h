/* Tensors (views into arenas), the linear tape, and the recorded ops that BERT for sequence
 * classification needs, fp32 and fake-quantized.
 *
 * Execution model (llm.c style, with a tape): each bq_op_* call computes its output immediately with
 * a pure kernel from kernels.h and, when the context records, appends one node to the tape.
 * bq_backward() walks the tape in reverse and calls each op's backward kernel, which ACCUMULATES
 * (+=) into the gradients of its inputs. Activation tensors and their gradients come from the
 * context's activation arena (gradients zeroed at allocation; large ones as page blocks that cost no
 * memory until the backward writes them and are given back once their tensor's producer has run its
 * backward); the whole arena and the tape are rewound after each step, so a training step performs
 * no malloc.
 *
 * Shapes are written (B,T,H): batch, sequence, hidden. All op outputs are contiguous. */
#ifndef BQ_TENSOR_H
#define BQ_TENSOR_H

#include <stdint.h>

#include "autograd/bq.h"

#define BQ_MAX_DIMS 4
/* Activation gradients from this size up are page blocks given back during the backward (bq_tensor_new). */
#define BQ_GRAD_PAGED_BYTES ((size_t)64 << 10)

typedef struct BqTensor {
    float *data;  /* element (i0,i1,..) at data[sum i_k * stride[k]]; NULL when stored in data16 */
    float *grad;  /* same layout as data; NULL when no gradient is tracked */
    uint16_t *data16; /* the values as bf16 words (same layout), for an activation of a bf16 step that only
                       * readers rounding it to bf16 anyway consume (the *_bf16 ops below); else NULL */
    int ndim;
    int64_t shape[BQ_MAX_DIMS];
    int64_t stride[BQ_MAX_DIMS];
    const char *name; /* optional, for messages; not owned */
    int owns_grad;    /* 1: grad is this tensor's own bq_arena_alloc_pages block in ctx->act, released
                       * by bq_backward once the op that produced the tensor has run its backward */
    int data_pages;   /* 1: data was computed in a bq_arena_alloc_pages block, given back once the values
                       * went to data16 */
} BqTensor;

/* The closed set of recorded ops; bq_backward() dispatches on it. */
typedef enum BqOp {
    BQ_OP_LINEAR,        /* y = x·Wᵀ + b */
    BQ_OP_ATTN_SCORES,   /* s[b,h,i,j] = Σ_d q[b,i,h,d]·k[b,j,h,d] */
    BQ_OP_ATTN_CONTEXT,  /* c[b,i,h,d] = Σ_j p[b,h,i,j]·v[b,j,h,d] */
    BQ_OP_ADD,           /* y = a + b */
    BQ_OP_EMBEDDING,     /* y[n,:] = table[ids[n],:] */
    BQ_OP_LAYERNORM,     /* y = (x−μ)/√(σ²+eps)·w + b over the last axis */
    BQ_OP_GELU,          /* y = x·Φ(x), exact erf form */
    BQ_OP_TANH,
    BQ_OP_SOFTMAX_MASK,  /* y = softmax(scale·x + (1−mask)·mask_value) over the last axis */
    BQ_OP_DROPOUT,       /* y = x·m/(1−p), m ~ Bernoulli(1−p) from a counter-based hash */
    BQ_OP_SELECT_TOKEN,  /* y[b,:] = x[b,t,:] */
    BQ_OP_CROSS_ENTROPY, /* loss = mean_b −log softmax(logits[b])[label[b]] */
    BQ_OP_FAKEQUANT,     /* y = clamp(rne(x/s), qmin, qmax)·s, straight-through gradient (and LSQ's ∂/∂s) */
    BQ_OP_SPAN_CROSS_ENTROPY, /* loss = (CE over T of logits[:,:,0] + CE of logits[:,:,1]) / 2 */
    BQ_OP_BIAS_GELU,     /* y = gelu(x + b) */
    BQ_OP_RESIDUAL_LAYERNORM, /* y = LayerNorm(dropout(a) + b) */
    BQ_OP_GELU_LINEAR,   /* y = gelu(u + bi)·Wᵀ + b, the GELU output recomputed, never kept */
    BQ_OP_EMBED_LAYERNORM, /* y = LayerNorm(word[ids] + type[tids] + pos[pids]) */
    BQ_OP_KL_DISTILL,    /* loss = T²·mean_b KL(softmax(t[b]/T) ‖ softmax(s[b]/T)), gradient to s only */
    BQ_OP_MSE,           /* loss = mean (x − y)² over every element */
    BQ_OP_SCALE,         /* y = a·x, a a constant */
    BQ_OP_COUNT
} BqOp;

typedef struct BqNode {
    BqOp op;
    BqTensor *out;
    BqTensor *in[3];
    const int32_t *ids;   /* embedding ids or labels */
    const float *fparam;  /* mask (softmax), scales (fake quant) */
    void *saved;          /* op-specific saved state in the activation arena (mean/rstd, masks) */
    int64_t iparam[4];
    float fval[3];
    BqPrecision prec;     /* the GEMM precision of the forward (ctx->prec), used again by the backward */
} BqNode;

typedef struct BqTape {
    BqNode *nodes;
    int64_t n;
    int64_t cap;
} BqTape;

/* Context for one forward (and backward) pass. */
typedef struct BqCtx {
    BqArena *act;       /* activations, their gradients and saved state; rewound by the caller */
    BqTape *tape;       /* NULL: no recording and no activation gradients (evaluation) */
    int training;       /* dropout active */
    uint64_t rng_key;   /* dropout key for this step (e.g. hash of seed and step) */
    uint64_t rng_count; /* incremented by each dropout op, so each mask differs */
    BqPrecision prec;   /* GEMM precision of the floating-point products (autograd/gemm.h); 0: fp32 */
    int grad_unpaged;   /* 1: every activation gradient zeroed in place and kept to the end of the step
                         * (tests compare paged gradients against it); 0: bq_tensor_new's paging */
    int keep_fp32;      /* 1: a bf16 forward stores every activation as floats (tests compare); 0: models
                         * use the *_bf16 storage ops where they apply (layers/bert.c) */
} BqCtx;

int bq_tape_init(BqTape *t, int64_t capacity);
void bq_tape_free(BqTape *t);
static inline void bq_tape_rewind(BqTape *t) { t->n = 0; }

/* ---- tensors ---- */

int64_t bq_tensor_numel(const BqTensor *t);
int bq_tensor_is_contiguous(const BqTensor *t);
/* Fills shape and contiguous strides. */
void bq_tensor_set_shape(BqTensor *t, int ndim, const int64_t *shape);
/* A new contiguous activation from ctx->act; data uninitialised; grad allocated and zeroed when
 * ctx->tape is set (from BQ_GRAD_PAGED_BYTES up as a page block that costs no memory until the
 * backward writes it, and is given back once the producing op's backward has run). */
BqTensor *bq_tensor_new(BqCtx *ctx, int ndim, const int64_t *shape);
/* A tensor over caller-owned memory (parameters): data and grad (may be NULL) are not copied. */
BqTensor bq_tensor_wrap(float *data, float *grad, int ndim, const int64_t *shape);

/* ---- recorded ops (each returns its output, allocated in ctx->act) ---- */

/* x (..., C), w (OC, C), b (OC) or NULL → (..., OC). Through bq_gemm in ctx->prec. x may be stored as
 * bf16 words (in bf16 precision). */
BqTensor *bq_op_linear(BqCtx *ctx, BqTensor *x, BqTensor *w, BqTensor *b);

/* ---- bf16 storage (ctx->prec BQ_PRECISION_BF16 only) ----
 * The ops below compute what their fp32-stored namesakes compute and then keep the output as bf16
 * words (data16, half the memory) instead of floats: its fp32 values live only in a page block that is
 * given back at once. Their outputs may feed only ops that round them to bf16 anyway or that are
 * written for the rounded values: bq_op_linear and bq_op_gelu_linear (input), the attention products
 * (both inputs) and the softmax backward. The gradients stay fp32. This is torch.autocast's storage: a
 * bf16 matmul's output is bf16, and so is what the backward saves of it. */
/* bq_op_linear with the output stored as bf16 words. */
BqTensor *bq_op_linear_bf16(BqCtx *ctx, BqTensor *x, BqTensor *w, BqTensor *b);
/* softmax(scale·q·kᵀ + mask) per head, the probabilities (B,NH,T,T) stored as bf16 words: the ops
 * bq_op_attn_scores and bq_op_softmax_mask_sole (two tape nodes), the scores in a page block given back
 * once the probabilities are stored. Their backward reads the rounded probabilities. */
BqTensor *bq_op_attn_probs_bf16(BqCtx *ctx, BqTensor *q, BqTensor *k, int nheads, const float *mask, float scale,
                                float mask_value);
/* bq_op_attn_context_dropout with the context stored as bf16 words. */
BqTensor *bq_op_attn_context_dropout_bf16(BqCtx *ctx, BqTensor *probs, float p, BqTensor *v, int nheads);
/* bq_op_linear for x and w on integer grids: x = qx·sx (fake-quantized per tensor to 8 bits, zero point
 * 0) and w = qw·sw[o] with codes qw and scales sw already set in pw (bq_qgemm_weights_set on this w).
 * The forward sums the codes exactly in int32 (autograd/qgemm.h) and rounds once:
 * y = fl(fl(Σ qx·qw · fl(sx·sw[o])) + b[o]), the value of the integer engine (layers/bert_int8.h). The
 * tape node is bq_op_linear's: the backward reads x and w as floats, so gradients are bq_op_linear's
 * on the same inputs. Scratch (codes, int32 sums) is released before returning. */
struct BqQGemmWeights;
BqTensor *bq_op_linear_qgemm(BqCtx *ctx, BqTensor *x, float sx, BqTensor *w, struct BqQGemmWeights *pw,
                             BqTensor *b);
/* q (B,Tq,H), k (B,T,H) with H = nheads·d → scores (B,nheads,Tq,T), unscaled. Heads are strided views, no
 * copy. Tq = T; Tq < T only without a tape (a query subset: the last layer's [CLS] row, layers/bert.c). The
 * other attention ops below take Tq query rows the same way. */
BqTensor *bq_op_attn_scores(BqCtx *ctx, BqTensor *q, BqTensor *k, int nheads);
/* probs (B,nheads,Tq,T), v (B,T,H) → context (B,Tq,H), heads already merged. */
BqTensor *bq_op_attn_context(BqCtx *ctx, BqTensor *probs, BqTensor *v, int nheads);
/* context = dropout_p(probs)·v, the dropout of bq_op_dropout (its key, counter use and mask) applied
 * inside the head loop: the dropped probabilities are never stored (the backward forms them again).
 * Not training or p == 0: bq_op_attn_context. Same values and gradients as
 * bq_op_attn_context(bq_op_dropout(probs, p), v). */
BqTensor *bq_op_attn_context_dropout(BqCtx *ctx, BqTensor *probs, float p, BqTensor *v, int nheads);
/* bq_op_attn_scores / bq_op_attn_context for inputs that are fake-quant outputs on per-tensor grids of
 * scales sq, sk (sp, sv): the products summed exactly on the integer codes and scaled once,
 * fl(Σ ca·cb · fl(sa·sb)) (what ONNX Runtime's integer MatMuls compute on the exported Q/DQ graph);
 * gradients exactly those of the fp32 ops on the same values (straight-through). Values off the grids
 * are a bug of the caller (they would be rounded to it). */
BqTensor *bq_op_attn_scores_int(BqCtx *ctx, BqTensor *q, BqTensor *k, float sq, float sk, int nheads);
BqTensor *bq_op_attn_context_int(BqCtx *ctx, BqTensor *probs, BqTensor *v, float sp, float sv, int nheads);
/* Same shapes, or b of shape (last dim of a) broadcast over the leading dims. */
BqTensor *bq_op_add(BqCtx *ctx, BqTensor *a, BqTensor *b);
/* table (V,H), ids (B·T) in [0,V) (checked by the caller) → (B,T,H). */
BqTensor *bq_op_embedding(BqCtx *ctx, BqTensor *table, const int32_t *ids, int64_t B, int64_t T);
/* The same; the backward gives row padding_idx no gradient (torch nn.Embedding(padding_idx), which
 * HF's BertEmbeddings uses for the word embeddings with pad_token_id); padding_idx < 0: none. */
BqTensor *bq_op_embedding_pad(BqCtx *ctx, BqTensor *table, const int32_t *ids, int64_t B, int64_t T,
                              int32_t padding_idx);
/* BertEmbeddings before its dropout: LayerNorm(word[ids] + type[type_ids] + pos[pos_ids])·w + b → (B,T,H);
 * tables (V,H), (Vt,H), (Vp,H); ids of B·T entries in range (checked by the caller), kept alive by the
 * caller until backward. Saves mean/rstd only (the sum is formed again from the tables in backward).
 * Same bits as the embedding, add and layernorm ops in HF's order. Row word_padding_idx of the word
 * table gets no gradient (torch nn.Embedding(padding_idx), as bq_op_embedding_pad); < 0: none. */
BqTensor *bq_op_embed_layernorm(BqCtx *ctx, BqTensor *word, BqTensor *type, BqTensor *pos, const int32_t *ids,
                                const int32_t *type_ids, const int32_t *pos_ids, int64_t B, int64_t T, BqTensor *w,
                                BqTensor *b, float eps, int32_t word_padding_idx);
/* x (...,H), w and b (H). */
BqTensor *bq_op_layernorm(BqCtx *ctx, BqTensor *x, BqTensor *w, BqTensor *b, float eps);
BqTensor *bq_op_gelu(BqCtx *ctx, BqTensor *x);
BqTensor *bq_op_tanh(BqCtx *ctx, BqTensor *x);
/* x (B,NH,Tq,T); mask (B,T) of 0/1 floats over the key axis, or NULL; mask_value e.g. -FLT_MAX.
 * Masked positions get scale·x + mask_value (HF semantics, computed so it stays finite). */
BqTensor *bq_op_softmax_mask(BqCtx *ctx, BqTensor *x, const float *mask, float scale, float mask_value);
/* The same op computed in place, for an x whose ONLY consumer is this op and whose producer's backward
 * does not read x->data (attention scores, a fake-quant output): the result is x itself (its data now
 * holds the probabilities) and the backward transforms x's gradient buffer in place. Same values and
 * gradients as bq_op_softmax_mask, without the (B,NH,T,T) output and its gradient. */
BqTensor *bq_op_softmax_mask_sole(BqCtx *ctx, BqTensor *x, const float *mask, float scale, float mask_value);
/* Identity when !ctx->training or p == 0. The mask is drawn from (ctx->rng_key + ctx->rng_count, element)
 * and drawn again in backward: nothing is stored for it. */
BqTensor *bq_op_dropout(BqCtx *ctx, BqTensor *x, float p);
/* The same op for an x whose ONLY consumer is this op: the output shares x's gradient buffer, which the
 * backward scales in place. Same values, gradients and counter use as bq_op_dropout. */
BqTensor *bq_op_dropout_sole(BqCtx *ctx, BqTensor *x, float p);
/* y = gelu(x + b): x (..., C), b (C) or NULL (then y = gelu(x)). The bias-free GEMM's output goes in, so
 * the bias add, GELU and (backward) the bias gradient are one pass each way; the backward needs only x,
 * never y. */
BqTensor *bq_op_bias_gelu(BqCtx *ctx, BqTensor *x, BqTensor *b);
/* The same op for an x whose ONLY consumer is this op: in training the output shares x's gradient buffer
 * (the backward turns dy into dx in place); without a tape x itself is overwritten and returned. */
BqTensor *bq_op_bias_gelu_sole(BqCtx *ctx, BqTensor *x, BqTensor *b);
/* y = LayerNorm(dropout_p(a) + b)·w + beta over the last axis: a, b (..., H) of equal shapes, w, beta (H).
 * Dropout as bq_op_dropout (active only when ctx->training and p > 0; it advances ctx->rng_count the
 * same way), so the values equal bq_op_layernorm(bq_op_add(bq_op_dropout(a), b)) bit for bit. Saves the
 * sum and mean/rstd only: no dropout output, no separate sum tensor and no gradient buffer for either. */
BqTensor *bq_op_residual_layernorm(BqCtx *ctx, BqTensor *a, float p, BqTensor *b, BqTensor *w, BqTensor *beta,
                                   float eps);
/* The same op for an a whose ONLY consumer is this op and whose producer's backward does not read
 * a->data (a Linear's output): the sum is written over a's data instead of a buffer of its own. */
BqTensor *bq_op_residual_layernorm_sole(BqCtx *ctx, BqTensor *a, float p, BqTensor *b, BqTensor *w,
                                        BqTensor *beta, float eps);
/* y = gelu(u + bi)·wᵀ + b (BertIntermediate's activation and BertOutput's dense): u (..., C) the bias-free
 * intermediate GEMM output, bi (C) or NULL, w (OC, C), b (OC) or NULL. u's ONLY consumer must be this op.
 * In training the GELU output lives only in u's gradient buffer between the forward and this op's
 * backward (which uses it for dw, then overwrites the buffer with u's gradient), so no (..., C) tensor
 * is kept for it. In bf16 precision not even that: the forward's GELU output (bf16 words, the values
 * the GEMMs round it to) lives in a page block given back after the product, and the backward forms
 * the same words again from u in the buffer's first half. Without a tape the GELU runs in place on u. For u stored
 * as floats, same values and gradients, bit for bit, as bq_op_linear(bq_op_bias_gelu_sole(u, bi), w, b);
 * u may also be stored as bf16 words (bq_op_linear_bf16, training only): the GELU reads those values. */
BqTensor *bq_op_gelu_linear(BqCtx *ctx, BqTensor *u, BqTensor *bi, BqTensor *w, BqTensor *b);
/* x (B,T,H) → (B,H), token t of each sequence (t = 0 is [CLS]). */
BqTensor *bq_op_select_token(BqCtx *ctx, BqTensor *x, int64_t t);
/* logits (B,C), labels (B) in [0,C) → scalar loss (shape (1)), mean over the batch. */
BqTensor *bq_op_cross_entropy(BqCtx *ctx, BqTensor *logits, const int32_t *labels);
/* Question-answering loss of HF's BertForQuestionAnswering: logits (B,T,2) (start at [b,t,0], end at
 * [b,t,1]), pos (B,2) = (start, end) token index per example, each in [0,T] where T is the ignored
 * index → scalar loss (shape (1)) = (CE_start + CE_end) / 2, each CE the mean over its non-ignored
 * examples of −log softmax over T. A side whose examples are all ignored contributes 0 (PyTorch gives
 * NaN there). pos must stay alive until backward. */
BqTensor *bq_op_span_cross_entropy(BqCtx *ctx, BqTensor *logits, const int32_t *pos);
/* Symmetric fake quantization with zero point 0. nscale == 1: per tensor. Otherwise per channel
 * along `axis` of x, nscale == x->shape[axis]. scale is read when the op runs (the caller owns it
 * and keeps it alive until backward). Exact numerics: q = clamp(rne(x / s), qmin, qmax), y = q·s;
 * dx = dy where qmin <= rne(x/s) <= qmax (the ROUNDED value, as torch.fake_quantize_per_*_affine and
 * tests/test_fakequant_ref.c), else 0. */
BqTensor *bq_op_fakequant(BqCtx *ctx, BqTensor *x, const float *scale, int64_t nscale, int axis, int qmin,
                          int qmax);
/* The same op for an x whose ONLY consumer is this op (the caller guarantees it): the output shares
 * x's gradient buffer instead of getting a zeroed one of its own, and the backward masks that buffer
 * in place; without a tape (inference) x itself is quantized in place and returned. Same values and
 * gradients as bq_op_fakequant, one buffer and two memory passes fewer. */
BqTensor *bq_op_fakequant_sole(BqCtx *ctx, BqTensor *x, const float *scale, int64_t nscale, int axis, int qmin,
                               int qmax);

/* Learned step size (LSQ, Esser et al., ICLR 2020): bq_op_fakequant (sole != 0: bq_op_fakequant_sole, same
 * contract) whose backward also accumulates the scales' gradient into dscale (nscale floats, caller-owned,
 * alive until backward): dscale[c] += grad_factor·Σ dy·t with t = rne(x/s) − x/s inside the range and
 * qmin/qmax where the rounded value falls below/above it (bq_kernel_fakequant_backward_scale). dx is
 * the straight-through gradient of bq_op_fakequant. dscale NULL: exactly bq_op_fakequant(_sole). */
BqTensor *bq_op_fakequant_lsq(BqCtx *ctx, BqTensor *x, const float *scale, float *dscale, int64_t nscale, int axis,
                              int qmin, int qmax, float grad_factor, int sole);
/* Distillation loss of student logits s (B,C) against teacher logits t (B,C) at temperature T > 0
 * (Hinton et al. 2015): T²·(1/B)·Σ_b Σ_c p_t[b,c]·(log p_t[b,c] − log p_s[b,c]) with p = softmax(z/T),
 * i.e. torch F.kl_div(log_softmax(s/T), log_softmax(t/T), reduction="batchmean", log_target=True)·T²
 * → scalar (shape (1)). Only s receives a gradient (the teacher is a constant): ds += dloss·T·(p_s − p_t)/B. */
BqTensor *bq_op_kl_distill(BqCtx *ctx, BqTensor *s, BqTensor *t, float T);
/* Mean squared difference of two tensors with the same number of elements, averaged over every element
 * → scalar (shape (1)); both receive gradients where tracked (dx += dloss·2(x − y)/n, dy −= the same). */
BqTensor *bq_op_mse(BqCtx *ctx, BqTensor *x, BqTensor *y);
/* y = a·x for a constant a (loss weights); dx += a·dy. */
BqTensor *bq_op_scale(BqCtx *ctx, BqTensor *x, float a);

/* Sets loss->grad[0] = 1 and runs every recorded node's backward in reverse order. */
void bq_backward(BqCtx *ctx, BqTensor *loss);

/* ---- optional per-op timing and memory, for benchmarks ----
 * When enabled, a recorded op's forward time is the wall time from the previous recorded op (or from
 * bq_profile_mark) to its own recording: its allocations, its kernel and the model code between. Its
 * backward time is the wall time of its backward call. Only recorded (tape) passes are timed. */
typedef struct BqProfile {
    double fwd_s[BQ_OP_COUNT], bwd_s[BQ_OP_COUNT];
    int64_t fwd_n[BQ_OP_COUNT], bwd_n[BQ_OP_COUNT];
    /* Bytes the forward wrote into the activation arena per op (outputs and saved state, from the
     * previous recorded op to this one's recording), paged gradient blocks left out: what the step
     * holds until the backward. */
    double fwd_bytes[BQ_OP_COUNT];
} BqProfile;
void bq_profile_enable(int on);
void bq_profile_mark(void);      /* start of a forward: the next op's time counts from here */
void bq_profile_reset(void);
const BqProfile *bq_profile_get(void);
const char *bq_op_name(BqOp op);

#endif
