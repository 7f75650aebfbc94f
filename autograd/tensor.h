/* Tensors (views into arenas), the linear tape, and the recorded ops that BERT for sequence
 * classification needs, fp32 and fake-quantized.
 *
 * Execution model (llm.c style, with a tape): each bq_op_* call computes its output immediately with
 * a pure kernel from kernels.h and, when the context records, appends one node to the tape.
 * bq_backward() walks the tape in reverse and calls each op's backward kernel, which ACCUMULATES
 * (+=) into the gradients of its inputs. Activation tensors and their gradients come from the
 * context's activation arena (gradients zeroed at allocation); the whole arena and the tape are
 * rewound after each step, so a training step performs no malloc.
 *
 * Shapes are written (B,T,H): batch, sequence, hidden. All op outputs are contiguous. */
#ifndef BQ_TENSOR_H
#define BQ_TENSOR_H

#include <stdint.h>

#include "autograd/bq.h"

#define BQ_MAX_DIMS 4

typedef struct BqTensor {
    float *data;  /* element (i0,i1,..) at data[sum i_k * stride[k]] */
    float *grad;  /* same layout as data; NULL when no gradient is tracked */
    int ndim;
    int64_t shape[BQ_MAX_DIMS];
    int64_t stride[BQ_MAX_DIMS];
    const char *name; /* optional, for messages; not owned */
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
    BQ_OP_FAKEQUANT,     /* y = clamp(rne(x/s), qmin, qmax)·s, straight-through gradient */
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
 * ctx->tape is set. */
BqTensor *bq_tensor_new(BqCtx *ctx, int ndim, const int64_t *shape);
/* A tensor over caller-owned memory (parameters): data and grad (may be NULL) are not copied. */
BqTensor bq_tensor_wrap(float *data, float *grad, int ndim, const int64_t *shape);

/* ---- recorded ops (each returns its output, allocated in ctx->act) ---- */

/* x (..., C), w (OC, C), b (OC) or NULL → (..., OC). Through cblas_sgemm. */
BqTensor *bq_op_linear(BqCtx *ctx, BqTensor *x, BqTensor *w, BqTensor *b);
/* q, k (B,T,H) with H = nheads·d → scores (B,nheads,T,T), unscaled. Heads are strided views, no copy. */
BqTensor *bq_op_attn_scores(BqCtx *ctx, BqTensor *q, BqTensor *k, int nheads);
/* probs (B,nheads,T,T), v (B,T,H) → context (B,T,H), heads already merged. */
BqTensor *bq_op_attn_context(BqCtx *ctx, BqTensor *probs, BqTensor *v, int nheads);
/* Same shapes, or b of shape (last dim of a) broadcast over the leading dims. */
BqTensor *bq_op_add(BqCtx *ctx, BqTensor *a, BqTensor *b);
/* table (V,H), ids (B·T) in [0,V) (checked by the caller) → (B,T,H). */
BqTensor *bq_op_embedding(BqCtx *ctx, BqTensor *table, const int32_t *ids, int64_t B, int64_t T);
/* x (...,H), w and b (H). */
BqTensor *bq_op_layernorm(BqCtx *ctx, BqTensor *x, BqTensor *w, BqTensor *b, float eps);
BqTensor *bq_op_gelu(BqCtx *ctx, BqTensor *x);
BqTensor *bq_op_tanh(BqCtx *ctx, BqTensor *x);
/* x (B,NH,T,T); mask (B,T) of 0/1 floats over the key axis, or NULL; mask_value e.g. -FLT_MAX.
 * Masked positions get scale·x + mask_value (HF semantics, computed so it stays finite). */
BqTensor *bq_op_softmax_mask(BqCtx *ctx, BqTensor *x, const float *mask, float scale, float mask_value);
/* Identity when !ctx->training or p == 0. */
BqTensor *bq_op_dropout(BqCtx *ctx, BqTensor *x, float p);
/* x (B,T,H) → (B,H), token t of each sequence (t = 0 is [CLS]). */
BqTensor *bq_op_select_token(BqCtx *ctx, BqTensor *x, int64_t t);
/* logits (B,C), labels (B) in [0,C) → scalar loss (shape (1)), mean over the batch. */
BqTensor *bq_op_cross_entropy(BqCtx *ctx, BqTensor *logits, const int32_t *labels);
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

/* ---- optional per-op timing, for benchmarks ----
 * When enabled, a recorded op's forward time is the wall time from the previous recorded op (or from
 * bq_profile_mark) to its own recording: its allocations, its kernel and the model code between. Its
 * backward time is the wall time of its backward call. Only recorded (tape) passes are timed. */
typedef struct BqProfile {
    double fwd_s[BQ_OP_COUNT], bwd_s[BQ_OP_COUNT];
    int64_t fwd_n[BQ_OP_COUNT], bwd_n[BQ_OP_COUNT];
} BqProfile;
void bq_profile_enable(int on);
void bq_profile_mark(void);      /* start of a forward: the next op's time counts from here */
void bq_profile_reset(void);
const BqProfile *bq_profile_get(void);
const char *bq_op_name(BqOp op);

#endif
