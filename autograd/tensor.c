/* Tensors (views into arenas), the linear tape and the recorded ops of tensor.h: each bq_op_* computes
 * its output with a kernel of kernels.h and, when ctx->tape is set, appends one node; bq_backward walks
 * the tape in reverse through a dispatch table indexed by BqOp.
 *
 * Reference: the tape design of micrograd/llm.c (explicit forward/backward kernels, gradients
 * accumulated), HF transformers BertForSequenceClassification for the op set. */
#include "autograd/tensor.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/kernels.h"

/* ---- profile ---- */

static int g_prof_on;
static double g_prof_last;
static size_t g_prof_used; /* ctx->act->used at the previous recorded op */
static BqProfile g_prof;

void bq_profile_enable(int on) { g_prof_on = on; }
void bq_profile_mark(void) {
    g_prof_last = bq_now();
    g_prof_used = SIZE_MAX; /* the next op counts from its own first allocation's arena position */
}
void bq_profile_reset(void) { memset(&g_prof, 0, sizeof g_prof); }
const BqProfile *bq_profile_get(void) { return &g_prof; }

const char *bq_op_name(BqOp op) {
    static const char *const names[BQ_OP_COUNT] = {
        [BQ_OP_LINEAR] = "linear", [BQ_OP_ATTN_SCORES] = "attn_scores", [BQ_OP_ATTN_CONTEXT] = "attn_context",
        [BQ_OP_ADD] = "add", [BQ_OP_EMBEDDING] = "embedding",
        [BQ_OP_LAYERNORM] = "layernorm", [BQ_OP_GELU] = "gelu", [BQ_OP_TANH] = "tanh",
        [BQ_OP_SOFTMAX_MASK] = "softmax_mask", [BQ_OP_DROPOUT] = "dropout", [BQ_OP_SELECT_TOKEN] = "select_token",
        [BQ_OP_CROSS_ENTROPY] = "cross_entropy", [BQ_OP_FAKEQUANT] = "fakequant", [BQ_OP_BIAS_GELU] = "bias_gelu",
        [BQ_OP_RESIDUAL_LAYERNORM] = "residual_ln", [BQ_OP_GELU_LINEAR] = "gelu_linear",
        [BQ_OP_EMBED_LAYERNORM] = "embed_ln",
        [BQ_OP_SPAN_CROSS_ENTROPY] = "span_cross_entropy",
        [BQ_OP_KL_DISTILL] = "kl_distill", [BQ_OP_MSE] = "mse", [BQ_OP_SCALE] = "scale",
    };
    return op >= 0 && op < BQ_OP_COUNT ? names[op] : "?";
}

/* ---- tape ---- */

int bq_tape_init(BqTape *t, int64_t capacity) {
    BQ_CHECK(capacity > 0);
    t->nodes = bq_malloc((size_t)capacity * sizeof(BqNode));
    t->n = 0;
    t->cap = capacity;
    return BQ_OK;
}

void bq_tape_free(BqTape *t) {
    free(t->nodes);
    t->nodes = NULL;
    t->n = t->cap = 0;
}

/* 1 when out's gradient is its own page block, which the op recording out produced (not an in-place op
 * whose output is one of its inputs a, b, c): bq_backward gives it back after that op's backward. */
static int grad_block_of(const BqTensor *out, const BqTensor *a, const BqTensor *b, const BqTensor *c) {
    return out->owns_grad && out != a && out != b && out != c;
}

/* Appends the node of op with its output and up to three inputs (NULL where the op has fewer). Grows
 * geometrically if a model records more nodes than the capacity it asked for (first step only; the tape
 * is rewound, not freed, between steps). */
static BqNode *tape_push(BqCtx *ctx, BqOp op, BqTensor *out, BqTensor *in0, BqTensor *in1, BqTensor *in2) {
    BqTape *t = ctx->tape;
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->nodes = bq_realloc(t->nodes, (size_t)t->cap * sizeof(BqNode));
    }
    BqNode *nd = &t->nodes[t->n++];
    memset(nd, 0, sizeof *nd);
    if (g_prof_on) {
        double now = bq_now();
        g_prof.fwd_s[op] += now - g_prof_last;
        g_prof.fwd_n[op]++;
        g_prof_last = now;
        size_t used = ctx->act->used, paged = 0;
        if (grad_block_of(out, in0, in1, in2)) paged = bq_arena_pages_len((size_t)bq_tensor_numel(out) * sizeof(float));
        if (out->data_pages && out != in0) paged += bq_arena_pages_len((size_t)bq_tensor_numel(out) * sizeof(float));
        if (g_prof_used != SIZE_MAX && used >= g_prof_used + paged)
            g_prof.fwd_bytes[op] += (double)(used - g_prof_used - paged);
        g_prof_used = used;
    }
    nd->op = op;
    nd->out = out;
    nd->in[0] = in0, nd->in[1] = in1, nd->in[2] = in2;
    nd->prec = ctx->prec;
    return nd;
}

/* ---- tensors ---- */

int64_t bq_tensor_numel(const BqTensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

int bq_tensor_is_contiguous(const BqTensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s) return 0;
        s *= t->shape[i];
    }
    return 1;
}

void bq_tensor_set_shape(BqTensor *t, int ndim, const int64_t *shape) {
    BQ_CHECK(ndim >= 1 && ndim <= BQ_MAX_DIMS);
    t->ndim = ndim;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        BQ_CHECK(shape[i] >= 0);
        t->shape[i] = shape[i];
        t->stride[i] = s;
        s *= shape[i];
    }
    for (int i = ndim; i < BQ_MAX_DIMS; i++) t->shape[i] = 1, t->stride[i] = 0;
}

/* bq_tensor_new; data_pages: the data as a page block (an output to be stored as bf16 words, seal_bf16). */
static BqTensor *tensor_new(BqCtx *ctx, int ndim, const int64_t *shape, int data_pages) {
    BqTensor *t = bq_arena_alloc(ctx->act, sizeof(BqTensor));
    memset(t, 0, sizeof *t);
    bq_tensor_set_shape(t, ndim, shape);
    size_t bytes = (size_t)bq_tensor_numel(t) * sizeof(float);
    t->data_pages = data_pages;
    t->data = data_pages ? bq_arena_alloc_pages(ctx->act, bytes) : bq_arena_alloc(ctx->act, bytes ? bytes : sizeof(float));
    if (ctx->tape && !ctx->grad_unpaged && bytes >= BQ_GRAD_PAGED_BYTES) {
        t->grad = bq_arena_alloc_pages(ctx->act, bytes);
        t->owns_grad = 1;
    } else {
        t->grad = ctx->tape ? bq_arena_alloc_zero(ctx->act, bytes ? bytes : sizeof(float)) : NULL;
    }
    return t;
}

BqTensor *bq_tensor_new(BqCtx *ctx, int ndim, const int64_t *shape) { return tensor_new(ctx, ndim, shape, 0); }

BqTensor bq_tensor_wrap(float *data, float *grad, int ndim, const int64_t *shape) {
    BqTensor t;
    memset(&t, 0, sizeof t);
    bq_tensor_set_shape(&t, ndim, shape);
    t.data = data;
    t.grad = grad;
    return t;
}

/* ---- helpers ---- */

static int64_t last_dim(const BqTensor *t) { return t->shape[t->ndim - 1]; }

static BqTensor *new_like(BqCtx *ctx, const BqTensor *x) { return bq_tensor_new(ctx, x->ndim, x->shape); }

/* Shape of x with its last dimension replaced; data_pages as tensor_new. */
static BqTensor *new_last_as(BqCtx *ctx, const BqTensor *x, int64_t last, int data_pages) {
    int64_t shape[BQ_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[x->ndim - 1] = last;
    return tensor_new(ctx, x->ndim, shape, data_pages);
}

static BqTensor *new_last(BqCtx *ctx, const BqTensor *x, int64_t last) { return new_last_as(ctx, x, last, 0); }

/* t's values in their storage (floats or bf16 words). */
static BqMat mat_of(const BqTensor *t) {
    BQ_CHECK(!t->data != !t->data16);
    return t->data16 ? (BqMat){.f = NULL, .h = t->data16} : bq_mat_f32(t->data);
}

/* t's values as floats: for the ops that read no bf16 storage. */
static float *f32_of(const BqTensor *t) {
    BQ_CHECK(t->data != NULL);
    return t->data;
}

/* Stores t's values (computed in its page block, tensor_new with data_pages) as bf16 words in ctx->act,
 * rounded to nearest even, and gives the page block back. */
static void seal_bf16(BqCtx *ctx, BqTensor *t) {
    BQ_CHECK(t->data_pages && t->data && !t->data16 && ctx->prec == BQ_PRECISION_BF16);
    const int64_t n = bq_tensor_numel(t);
    uint16_t *h = bq_arena_alloc(ctx->act, (size_t)(n ? n : 1) * sizeof(uint16_t));
    bq_bf16_words(h, t->data, n);
    bq_arena_release(ctx->act, t->data, (size_t)n * sizeof(float));
    t->data = NULL;
    t->data16 = h;
}

#define CONTIG(t) BQ_CHECK((t) != NULL && bq_tensor_is_contiguous(t))

/* The key of the next dropout mask; each mask-drawing op takes one. */
static uint64_t next_dropout_key(BqCtx *ctx) { return ctx->rng_key + ctx->rng_count++; }


/* ---- ops ---- */

/* bq_op_linear; out16: the output stored as bf16 words. */
static BqTensor *linear_op(BqCtx *ctx, BqTensor *x, BqTensor *w, BqTensor *b, int out16) {
    CONTIG(x);
    CONTIG(w);
    BQ_CHECK(w->ndim == 2 && last_dim(x) == w->shape[1]);
    int64_t C = w->shape[1], OC = w->shape[0], N = bq_tensor_numel(x) / C;
    if (b) {
        CONTIG(b);
        BQ_CHECK(bq_tensor_numel(b) == OC);
    }
    BqTensor *y = new_last_as(ctx, x, OC, out16);
    bq_kernel_linear_forward_m(y->data, mat_of(x), w->data, b ? b->data : NULL, N, C, OC, ctx->prec);
    if (out16) seal_bf16(ctx, y);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_LINEAR, y, x, w, b);
        nd->iparam[0] = N, nd->iparam[1] = C, nd->iparam[2] = OC;
    }
    return y;
}

BqTensor *bq_op_linear(BqCtx *ctx, BqTensor *x, BqTensor *w, BqTensor *b) { return linear_op(ctx, x, w, b, 0); }

BqTensor *bq_op_linear_bf16(BqCtx *ctx, BqTensor *x, BqTensor *w, BqTensor *b) { return linear_op(ctx, x, w, b, 1); }

BqTensor *bq_op_linear_qgemm(BqCtx *ctx, BqTensor *x, float sx, BqTensor *w, struct BqQGemmWeights *pw,
                             BqTensor *b) {
    CONTIG(x);
    CONTIG(w);
    BQ_CHECK(w->ndim == 2 && last_dim(x) == w->shape[1] && pw);
    int64_t C = w->shape[1], OC = w->shape[0], N = bq_tensor_numel(x) / C;
    if (b) {
        CONTIG(b);
        BQ_CHECK(bq_tensor_numel(b) == OC);
    }
    BqTensor *y = new_last(ctx, x, OC);
    const size_t mark = bq_arena_mark(ctx->act); /* the scratch below is released at once */
    uint8_t *codes = bq_arena_alloc(ctx->act, (size_t)(N * C));
    int32_t *acc = bq_arena_alloc(ctx->act, (size_t)(N * OC) * sizeof(int32_t));
    int rc = bq_kernel_linear_qgemm_forward(y->data, codes, acc, f32_of(x), pw, sx, b ? b->data : NULL, N, C, OC);
    bq_arena_rewind(ctx->act, mark);
    if (rc) { /* oneDNN could not run (out of memory): no status path through the ops, as bq_malloc */
        fprintf(stderr, "bertqat: %s\n", bq_errmsg());
        BQ_CHECK(rc == BQ_OK);
    }
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_LINEAR, y, x, w, b);
        nd->iparam[0] = N, nd->iparam[1] = C, nd->iparam[2] = OC;
    }
    return y;
}

/* The operand a Linear's two backward products read for dout (N,OC): in bf16, when both run, its bf16
 * words converted once (bq_gemm_words); else dout itself. */
static BqMat dy_operand(const float *dout, int64_t N, int64_t OC, BqPrecision prec, int both) {
    return prec == BQ_PRECISION_BF16 && both ? bq_gemm_words(dout, N, OC) : bq_mat_f32(dout);
}

static void back_linear(BqNode *nd) {
    BqTensor *x = nd->in[0], *w = nd->in[1], *b = nd->in[2];
    const int64_t N = nd->iparam[0], C = nd->iparam[1], OC = nd->iparam[2];
    const BqMat dy = dy_operand(nd->out->grad, N, OC, nd->prec, x->grad && w->grad);
    bq_kernel_linear_backward_m(x->grad, w->grad, b ? b->grad : NULL, nd->out->grad, dy, mat_of(x), w->data, N, C,
                                OC, nd->prec);
}

/* The scores (B,NH,Tq,T) of q (B,Tq,H) against k (B,T,H), allocated after the checks: Tq = T, or Tq < T
 * without a tape (the backwards take Tq = T); data_pages as tensor_new. */
static BqTensor *new_scores(BqCtx *ctx, BqTensor *q, BqTensor *k, int nheads, int data_pages) {
    CONTIG(q);
    CONTIG(k);
    BQ_CHECK(q->ndim == 3 && k->ndim == 3 && nheads > 0);
    BQ_CHECK(q->shape[0] == k->shape[0] && q->shape[2] == k->shape[2] && q->shape[2] % nheads == 0);
    BQ_CHECK(q->shape[1] == k->shape[1] || (!ctx->tape && q->shape[1] < k->shape[1]));
    int64_t shape[4] = {q->shape[0], nheads, q->shape[1], k->shape[1]};
    return tensor_new(ctx, 4, shape, data_pages);
}

/* The context (B,Tq,H) of probs (B,NH,Tq,T) over v (B,T,H), allocated after the checks (Tq as
 * new_scores). */
static BqTensor *new_context(BqCtx *ctx, BqTensor *probs, BqTensor *v, int nheads, int data_pages) {
    CONTIG(probs);
    CONTIG(v);
    BQ_CHECK(probs->ndim == 4 && v->ndim == 3 && nheads > 0 && v->shape[2] % nheads == 0);
    BQ_CHECK(probs->shape[0] == v->shape[0] && probs->shape[1] == nheads && probs->shape[3] == v->shape[1]);
    BQ_CHECK(probs->shape[2] == v->shape[1] || (!ctx->tape && probs->shape[2] < v->shape[1]));
    int64_t shape[3] = {v->shape[0], probs->shape[2], v->shape[2]};
    return tensor_new(ctx, 3, shape, data_pages);
}

/* Records an attention product (op BQ_OP_ATTN_SCORES with q, k or BQ_OP_ATTN_CONTEXT with probs, v):
 * its backward reads B, T, the head count and the head size from iparam, all of them known from the
 * second input b (B,T,H). Returns the node, NULL without a tape. */
static BqNode *record_attn(BqCtx *ctx, BqOp op, BqTensor *out, BqTensor *a, BqTensor *b, int nheads) {
    if (!ctx->tape) return NULL;
    BqNode *nd = tape_push(ctx, op, out, a, b, NULL);
    nd->iparam[0] = b->shape[0], nd->iparam[1] = b->shape[1], nd->iparam[2] = nheads;
    nd->iparam[3] = b->shape[2] / nheads;
    return nd;
}

/* The two floating-point attention products (autograd/kernels.h bq_kernel_attn_{scores,context}_forward_m),
 * which take the same arguments: (out, a, b, B, Tq, T, NH, d, precision). */
typedef void (*AttnKernel)(float *, BqMat, BqMat, int64_t, int64_t, int64_t, int64_t, int64_t, BqPrecision);

/* Runs kernel on a (Tq query rows) and b (B,T,H) into out and records the node. */
static void attn_fp(BqCtx *ctx, AttnKernel kernel, BqOp op, BqTensor *out, BqTensor *a, BqTensor *b, int64_t Tq,
                    int nheads) {
    kernel(out->data, mat_of(a), mat_of(b), b->shape[0], Tq, b->shape[1], nheads, b->shape[2] / nheads, ctx->prec);
    record_attn(ctx, op, out, a, b, nheads);
}

BqTensor *bq_op_attn_scores(BqCtx *ctx, BqTensor *q, BqTensor *k, int nheads) {
    BqTensor *s = new_scores(ctx, q, k, nheads, 0);
    attn_fp(ctx, bq_kernel_attn_scores_forward_m, BQ_OP_ATTN_SCORES, s, q, k, q->shape[1], nheads);
    return s;
}

static void back_attn_scores(BqNode *nd) {
    BqTensor *q = nd->in[0], *k = nd->in[1];
    bq_kernel_attn_scores_backward_m(q->grad, k->grad, nd->out->grad, mat_of(q), mat_of(k), nd->iparam[0],
                                     nd->iparam[1], nd->iparam[2], nd->iparam[3], nd->prec);
}

BqTensor *bq_op_attn_context(BqCtx *ctx, BqTensor *probs, BqTensor *v, int nheads) {
    BqTensor *c = new_context(ctx, probs, v, nheads, 0);
    attn_fp(ctx, bq_kernel_attn_context_forward_m, BQ_OP_ATTN_CONTEXT, c, probs, v, probs->shape[2], nheads);
    return c;
}

/* The two attention products on integer codes (autograd/kernels.h bq_kernel_attn_*_int_forward), which
 * take the same arguments: (out, scratch, threads, a, b, scale of a, scale of b, B, Tq, T, NH, d). */
typedef void (*AttnIntKernel)(float *, void *, int, const float *, const float *, float, float, int64_t, int64_t,
                              int64_t, int64_t, int64_t);

/* Runs kernel on a (Tq query rows) and b (B,T,H) into out, each thread's scratch
 * (bq_kernel_attn_int_scratch) in the activation arena for the call only, and records the node of the
 * floating-point product op, whose backward serves both. */
static void attn_int(BqCtx *ctx, AttnIntKernel kernel, BqOp op, BqTensor *out, BqTensor *a, BqTensor *b, float sa,
                     float sb, int64_t Tq, int nheads) {
    BQ_CHECK(sa > 0.0f && sb > 0.0f);
    const int64_t T = b->shape[1], d = b->shape[2] / nheads;
    const size_t mark = bq_arena_mark(ctx->act);
    const int nthr = omp_get_max_threads();
    void *scratch = bq_arena_alloc(ctx->act, (size_t)nthr * bq_kernel_attn_int_scratch(T, d));
    kernel(out->data, scratch, nthr, f32_of(a), f32_of(b), sa, sb, b->shape[0], Tq, T, nheads, d);
    bq_arena_rewind(ctx->act, mark);
    record_attn(ctx, op, out, a, b, nheads);
}

BqTensor *bq_op_attn_scores_int(BqCtx *ctx, BqTensor *q, BqTensor *k, float sq, float sk, int nheads) {
    BqTensor *s = new_scores(ctx, q, k, nheads, 0);
    attn_int(ctx, bq_kernel_attn_scores_int_forward, BQ_OP_ATTN_SCORES, s, q, k, sq, sk, q->shape[1], nheads);
    return s;
}

BqTensor *bq_op_attn_context_int(BqCtx *ctx, BqTensor *probs, BqTensor *v, float sp, float sv, int nheads) {
    BqTensor *c = new_context(ctx, probs, v, nheads, 0);
    attn_int(ctx, bq_kernel_attn_context_int_forward, BQ_OP_ATTN_CONTEXT, c, probs, v, sp, sv, probs->shape[2],
             nheads);
    return c;
}

typedef struct CtxDropSaved {
    float *scratch;
    int nscratch;
    uint64_t key;
} CtxDropSaved;

/* bq_op_attn_context_dropout; out16: the context stored as bf16 words. */
static BqTensor *context_dropout(BqCtx *ctx, BqTensor *probs, float p, BqTensor *v, int nheads, int out16) {
    BQ_CHECK(p >= 0.0f && p < 1.0f);
    if (!ctx->training || p == 0.0f) {
        BqTensor *c = new_context(ctx, probs, v, nheads, out16);
        attn_fp(ctx, bq_kernel_attn_context_forward_m, BQ_OP_ATTN_CONTEXT, c, probs, v, probs->shape[2], nheads);
        if (out16) seal_bf16(ctx, c);
        return c;
    }
    BqTensor *c = new_context(ctx, probs, v, nheads, out16);
    BQ_CHECK(probs->shape[2] == v->shape[1]); /* all T query rows: the backward recomputes the dropout */
    int64_t B = v->shape[0], T = v->shape[1], H = v->shape[2];
    CtxDropSaved *sv = bq_arena_alloc(ctx->act, sizeof(CtxDropSaved));
    sv->nscratch = omp_get_max_threads();
    sv->scratch = bq_arena_alloc(ctx->act, (size_t)sv->nscratch * (size_t)(T * T) * sizeof(float));
    sv->key = next_dropout_key(ctx);
    bq_kernel_attn_context_dropout_forward_m(c->data, sv->scratch, sv->nscratch, mat_of(probs), mat_of(v), p, sv->key,
                                             B, T, nheads, H / nheads, ctx->prec);
    if (out16) seal_bf16(ctx, c);
    BqNode *nd = record_attn(ctx, BQ_OP_ATTN_CONTEXT, c, probs, v, nheads);
    if (nd) {
        nd->saved = sv;
        nd->fval[0] = p;
    }
    return c;
}

BqTensor *bq_op_attn_context_dropout(BqCtx *ctx, BqTensor *probs, float p, BqTensor *v, int nheads) {
    return context_dropout(ctx, probs, p, v, nheads, 0);
}

BqTensor *bq_op_attn_context_dropout_bf16(BqCtx *ctx, BqTensor *probs, float p, BqTensor *v, int nheads) {
    return context_dropout(ctx, probs, p, v, nheads, 1);
}

static void back_attn_context(BqNode *nd) {
    BqTensor *p = nd->in[0], *v = nd->in[1];
    const CtxDropSaved *sv = nd->saved;
    if (sv)
        bq_kernel_attn_context_dropout_backward_m(p->grad, v->grad, sv->scratch, sv->nscratch, nd->out->grad,
                                                  mat_of(p), mat_of(v), nd->fval[0], sv->key, nd->iparam[0],
                                                  nd->iparam[1], nd->iparam[2], nd->iparam[3], nd->prec);
    else
        bq_kernel_attn_context_backward_m(p->grad, v->grad, nd->out->grad, mat_of(p), mat_of(v), nd->iparam[0],
                                          nd->iparam[1], nd->iparam[2], nd->iparam[3], nd->prec);
}

/* Returns 1 when b broadcasts over a's leading dims, 0 for equal sizes. */
static int binary_bcast(const BqTensor *a, const BqTensor *b) {
    CONTIG(a);
    CONTIG(b);
    int64_t na = bq_tensor_numel(a), nb = bq_tensor_numel(b);
    if (na == nb && a->ndim == b->ndim) {
        for (int i = 0; i < a->ndim; i++) BQ_CHECK(a->shape[i] == b->shape[i]);
        return 0;
    }
    BQ_CHECK(nb == last_dim(a));
    return 1;
}

BqTensor *bq_op_add(BqCtx *ctx, BqTensor *a, BqTensor *b) {
    int bc = binary_bcast(a, b);
    int64_t n = bq_tensor_numel(a), C = last_dim(a);
    BqTensor *y = new_like(ctx, a);
    bq_kernel_add_forward(y->data, a->data, b->data, n, C, bc);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_ADD, y, a, b, NULL);
        nd->iparam[0] = n, nd->iparam[1] = C, nd->iparam[2] = bc;
    }
    return y;
}

static void back_add(BqNode *nd) {
    bq_kernel_add_backward(nd->in[0]->grad, nd->in[1]->grad, nd->out->grad, nd->iparam[0], nd->iparam[1],
                           (int)nd->iparam[2]);
}

BqTensor *bq_op_embedding(BqCtx *ctx, BqTensor *table, const int32_t *ids, int64_t B, int64_t T) {
    return bq_op_embedding_pad(ctx, table, ids, B, T, -1);
}

BqTensor *bq_op_embedding_pad(BqCtx *ctx, BqTensor *table, const int32_t *ids, int64_t B, int64_t T,
                              int32_t padding_idx) {
    CONTIG(table);
    BQ_CHECK(table->ndim == 2 && ids != NULL);
    int64_t H = table->shape[1];
    int64_t shape[3] = {B, T, H};
    BqTensor *y = bq_tensor_new(ctx, 3, shape);
    bq_kernel_embedding_forward(y->data, table->data, ids, B * T, H);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_EMBEDDING, y, table, NULL, NULL);
        nd->ids = ids;
        nd->iparam[0] = B * T, nd->iparam[1] = H, nd->iparam[2] = padding_idx;
    }
    return y;
}

static void back_embedding(BqNode *nd) {
    if (nd->in[0]->grad)
        bq_kernel_embedding_backward_pad(nd->in[0]->grad, nd->out->grad, nd->ids, nd->iparam[0], nd->iparam[1],
                                         (int32_t)nd->iparam[2]);
}

typedef struct LnSaved {
    float *mean, *rstd;
} LnSaved;

BqTensor *bq_op_layernorm(BqCtx *ctx, BqTensor *x, BqTensor *w, BqTensor *b, float eps) {
    CONTIG(x);
    CONTIG(w);
    CONTIG(b);
    int64_t H = last_dim(x), N = bq_tensor_numel(x) / H;
    BQ_CHECK(bq_tensor_numel(w) == H && bq_tensor_numel(b) == H);
    BqTensor *y = new_like(ctx, x);
    LnSaved *sv = bq_arena_alloc(ctx->act, sizeof(LnSaved));
    sv->mean = bq_arena_alloc(ctx->act, (size_t)N * sizeof(float));
    sv->rstd = bq_arena_alloc(ctx->act, (size_t)N * sizeof(float));
    bq_kernel_layernorm_forward(y->data, sv->mean, sv->rstd, x->data, w->data, b->data, N, H, eps);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_LAYERNORM, y, x, w, b);
        nd->saved = sv;
        nd->iparam[0] = N, nd->iparam[1] = H;
        nd->fval[0] = eps;
    }
    return y;
}

static void back_layernorm(BqNode *nd) {
    LnSaved *sv = nd->saved;
    bq_kernel_layernorm_backward(nd->in[0]->grad, nd->in[1]->grad, nd->in[2]->grad, nd->out->grad, nd->in[0]->data,
                                 nd->in[1]->data, sv->mean, sv->rstd, nd->iparam[0], nd->iparam[1]);
}

static BqTensor *unary_op(BqCtx *ctx, BqOp op, BqTensor *x) {
    CONTIG(x);
    BqTensor *y = new_like(ctx, x);
    int64_t n = bq_tensor_numel(x);
    if (op == BQ_OP_GELU)
        bq_kernel_gelu_forward(y->data, x->data, n);
    else
        bq_kernel_tanh_forward(y->data, x->data, n);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, op, y, x, NULL, NULL);
        nd->iparam[0] = n;
    }
    return y;
}

BqTensor *bq_op_gelu(BqCtx *ctx, BqTensor *x) { return unary_op(ctx, BQ_OP_GELU, x); }
BqTensor *bq_op_tanh(BqCtx *ctx, BqTensor *x) { return unary_op(ctx, BQ_OP_TANH, x); }

static void back_gelu(BqNode *nd) {
    if (nd->in[0]->grad) bq_kernel_gelu_backward(nd->in[0]->grad, nd->out->grad, nd->in[0]->data, nd->iparam[0]);
}

static void back_tanh(BqNode *nd) {
    if (nd->in[0]->grad) bq_kernel_tanh_backward(nd->in[0]->grad, nd->out->grad, nd->out->data, nd->iparam[0]);
}

/* sole: in place (bq_op_softmax_mask_sole); sole 2: in place, then the probabilities stored as bf16
 * words (x's data a page block: bq_op_attn_probs_bf16). */
static BqTensor *softmax_mask(BqCtx *ctx, BqTensor *x, const float *mask, float scale, float mask_value,
                              int sole) {
    CONTIG(x);
    f32_of(x);
    /* (B,NH,Tq,T); Tq < T (a query subset) only without a tape, as the attention products */
    BQ_CHECK(x->ndim == 4 && (x->shape[2] == x->shape[3] || (!ctx->tape && x->shape[2] < x->shape[3])));
    int64_t B = x->shape[0], NH = x->shape[1], Tq = x->shape[2], T = x->shape[3];
    BqTensor *y = sole ? x : new_like(ctx, x);
    bq_kernel_softmax_mask_forward(y->data, x->data, mask, scale, mask_value, B, NH, Tq, T);
    if (sole == 2) seal_bf16(ctx, y);
    if (ctx->tape) {
        /* the backward needs only y, the output itself */
        BqNode *nd = tape_push(ctx, BQ_OP_SOFTMAX_MASK, y, x, NULL, NULL);
        nd->fparam = mask;
        nd->iparam[0] = B * NH * Tq, nd->iparam[1] = T, nd->iparam[2] = sole;
        nd->fval[0] = scale, nd->fval[1] = mask_value;
    }
    return y;
}

BqTensor *bq_op_softmax_mask(BqCtx *ctx, BqTensor *x, const float *mask, float scale, float mask_value) {
    return softmax_mask(ctx, x, mask, scale, mask_value, 0);
}

BqTensor *bq_op_softmax_mask_sole(BqCtx *ctx, BqTensor *x, const float *mask, float scale, float mask_value) {
    return softmax_mask(ctx, x, mask, scale, mask_value, 1);
}

BqTensor *bq_op_attn_probs_bf16(BqCtx *ctx, BqTensor *q, BqTensor *k, int nheads, const float *mask, float scale,
                                float mask_value) {
    BqTensor *s = new_scores(ctx, q, k, nheads, 1);
    attn_fp(ctx, bq_kernel_attn_scores_forward_m, BQ_OP_ATTN_SCORES, s, q, k, q->shape[1], nheads);
    return softmax_mask(ctx, s, mask, scale, mask_value, 2);
}

static void back_softmax_mask(BqNode *nd) {
    if (!nd->in[0]->grad) return;
    if (nd->iparam[2]) /* in place: input and output are one tensor */
        bq_kernel_softmax_mask_backward_inplace_m(nd->out->grad, mat_of(nd->out), nd->fval[0], nd->iparam[0],
                                                  nd->iparam[1]);
    else
        bq_kernel_softmax_mask_backward(nd->in[0]->grad, nd->out->grad, nd->out->data, nd->fval[0], nd->iparam[0],
                                        nd->iparam[1]);
}

static BqTensor *dropout(BqCtx *ctx, BqTensor *x, float p, int sole) {
    BQ_CHECK(p >= 0.0f && p < 1.0f);
    if (!ctx->training || p == 0.0f) return x;
    CONTIG(x);
    int64_t n = bq_tensor_numel(x);
    uint64_t key = next_dropout_key(ctx);
    BqTensor *y;
    if (sole && ctx->tape && x->grad) {
        y = bq_arena_alloc(ctx->act, sizeof(BqTensor));
        memset(y, 0, sizeof *y);
        bq_tensor_set_shape(y, x->ndim, x->shape);
        y->data = bq_arena_alloc(ctx->act, (size_t)(n ? n : 1) * sizeof(float));
        y->grad = x->grad;
    } else {
        sole = 0;
        y = new_like(ctx, x);
    }
    bq_kernel_dropout_forward(y->data, x->data, p, key, n);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_DROPOUT, y, x, NULL, NULL);
        nd->iparam[0] = n, nd->iparam[1] = (int64_t)key, nd->iparam[2] = sole;
        nd->fval[0] = p;
    }
    return y;
}

BqTensor *bq_op_dropout(BqCtx *ctx, BqTensor *x, float p) { return dropout(ctx, x, p, 0); }
BqTensor *bq_op_dropout_sole(BqCtx *ctx, BqTensor *x, float p) { return dropout(ctx, x, p, 1); }

static void back_dropout(BqNode *nd) {
    if (!nd->in[0]->grad) return;
    uint64_t key = (uint64_t)nd->iparam[1];
    if (nd->iparam[2])
        bq_kernel_dropout_scale_inplace(nd->in[0]->grad, nd->fval[0], key, nd->iparam[0]);
    else
        bq_kernel_dropout_backward(nd->in[0]->grad, nd->out->grad, nd->fval[0], key, nd->iparam[0]);
}

static BqTensor *bias_gelu(BqCtx *ctx, BqTensor *x, BqTensor *b, int sole) {
    CONTIG(x);
    f32_of(x);
    int64_t C = last_dim(x), N = bq_tensor_numel(x) / (C ? C : 1);
    if (b) {
        CONTIG(b);
        BQ_CHECK(bq_tensor_numel(b) == C);
    }
    BqTensor *y;
    if (sole && !ctx->tape) { /* inference: nothing else reads x */
        bq_kernel_bias_gelu_forward(x->data, x->data, b ? b->data : NULL, N, C);
        return x;
    }
    if (sole && x->grad) {
        y = bq_arena_alloc(ctx->act, sizeof(BqTensor));
        memset(y, 0, sizeof *y);
        bq_tensor_set_shape(y, x->ndim, x->shape);
        y->data = bq_arena_alloc(ctx->act, (size_t)(N * C > 0 ? N * C : 1) * sizeof(float));
        y->grad = x->grad;
    } else {
        y = new_like(ctx, x);
    }
    bq_kernel_bias_gelu_forward(y->data, x->data, b ? b->data : NULL, N, C);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_BIAS_GELU, y, x, b, NULL);
        nd->iparam[0] = N, nd->iparam[1] = C;
    }
    return y;
}

BqTensor *bq_op_bias_gelu(BqCtx *ctx, BqTensor *x, BqTensor *b) { return bias_gelu(ctx, x, b, 0); }
BqTensor *bq_op_bias_gelu_sole(BqCtx *ctx, BqTensor *x, BqTensor *b) { return bias_gelu(ctx, x, b, 1); }

/* A shared buffer (x->grad == y->grad) is passed as dinp == dout, which the kernel treats as in place. */
static void back_bias_gelu(BqNode *nd) {
    BqTensor *x = nd->in[0], *b = nd->in[1];
    bq_kernel_bias_gelu_backward(x->grad, b ? b->grad : NULL, nd->out->grad, x->data, b ? b->data : NULL,
                                 nd->iparam[0], nd->iparam[1]);
}

typedef struct ResLnSaved {
    float *sum, *mean, *rstd;
    BqTensor *beta; /* the LayerNorm bias (the node's three inputs are a, b and the weight) */
} ResLnSaved;

static BqTensor *residual_layernorm(BqCtx *ctx, BqTensor *a, float p, BqTensor *b, BqTensor *w, BqTensor *beta,
                                    float eps, int sole) {
    BQ_CHECK(p >= 0.0f && p < 1.0f);
    BQ_CHECK(binary_bcast(a, b) == 0);
    CONTIG(w);
    CONTIG(beta);
    int64_t H = last_dim(a), N = bq_tensor_numel(a) / H;
    BQ_CHECK(bq_tensor_numel(w) == H && bq_tensor_numel(beta) == H);
    if (!ctx->training) p = 0.0f;
    uint64_t key = p > 0.0f ? next_dropout_key(ctx) : 0;
    BqTensor *y = new_like(ctx, a);
    ResLnSaved *sv = bq_arena_alloc(ctx->act, sizeof(ResLnSaved));
    sv->sum = sole ? a->data : bq_arena_alloc(ctx->act, (size_t)(N * H) * sizeof(float));
    sv->mean = bq_arena_alloc(ctx->act, (size_t)N * sizeof(float));
    sv->rstd = bq_arena_alloc(ctx->act, (size_t)N * sizeof(float));
    bq_kernel_residual_layernorm_forward(y->data, sv->sum, sv->mean, sv->rstd, a->data, b->data, w->data, beta->data,
                                         p, key, N, H, eps);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_RESIDUAL_LAYERNORM, y, a, b, w);
        sv->beta = beta;
        nd->saved = sv;
        nd->iparam[0] = N, nd->iparam[1] = H, nd->iparam[2] = (int64_t)key;
        nd->fval[0] = p, nd->fval[1] = eps;
    }
    return y;
}

BqTensor *bq_op_residual_layernorm(BqCtx *ctx, BqTensor *a, float p, BqTensor *b, BqTensor *w, BqTensor *beta,
                                   float eps) {
    return residual_layernorm(ctx, a, p, b, w, beta, eps, 0);
}

BqTensor *bq_op_residual_layernorm_sole(BqCtx *ctx, BqTensor *a, float p, BqTensor *b, BqTensor *w,
                                        BqTensor *beta, float eps) {
    return residual_layernorm(ctx, a, p, b, w, beta, eps, 1);
}

static void back_residual_layernorm(BqNode *nd) {
    ResLnSaved *sv = nd->saved;
    const BqTensor *beta = sv->beta;
    bq_kernel_residual_layernorm_backward(nd->in[0]->grad, nd->in[1]->grad, nd->in[2]->grad, beta->grad,
                                          nd->out->grad, sv->sum, nd->in[2]->data, sv->mean, sv->rstd, nd->fval[0],
                                          (uint64_t)nd->iparam[2], nd->iparam[0], nd->iparam[1]);
}

BqTensor *bq_op_select_token(BqCtx *ctx, BqTensor *x, int64_t t) {
    CONTIG(x);
    BQ_CHECK(x->ndim == 3 && t >= 0 && t < x->shape[1]);
    int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2];
    int64_t shape[2] = {B, H};
    BqTensor *y = bq_tensor_new(ctx, 2, shape);
    bq_kernel_select_token_forward(y->data, x->data, B, T, H, t);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_SELECT_TOKEN, y, x, NULL, NULL);
        nd->iparam[0] = B, nd->iparam[1] = T, nd->iparam[2] = H, nd->iparam[3] = t;
    }
    return y;
}

static void back_select_token(BqNode *nd) {
    if (nd->in[0]->grad)
        bq_kernel_select_token_backward(nd->in[0]->grad, nd->out->grad, nd->iparam[0], nd->iparam[1], nd->iparam[2],
                                        nd->iparam[3]);
}

BqTensor *bq_op_cross_entropy(BqCtx *ctx, BqTensor *logits, const int32_t *labels) {
    CONTIG(logits);
    BQ_CHECK(logits->ndim == 2 && labels != NULL);
    int64_t B = logits->shape[0], C = logits->shape[1];
    for (int64_t b = 0; b < B; b++) BQ_CHECK(labels[b] >= 0 && labels[b] < C);
    int64_t one = 1;
    BqTensor *loss = bq_tensor_new(ctx, 1, &one);
    float *probs = bq_arena_alloc(ctx->act, (size_t)(B * C) * sizeof(float));
    bq_kernel_cross_entropy_forward(loss->data, probs, logits->data, labels, B, C);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_CROSS_ENTROPY, loss, logits, NULL, NULL);
        nd->ids = labels;
        nd->saved = probs;
        nd->iparam[0] = B, nd->iparam[1] = C;
    }
    return loss;
}

static void back_cross_entropy(BqNode *nd) {
    if (nd->in[0]->grad)
        bq_kernel_cross_entropy_backward(nd->in[0]->grad, nd->out->grad[0], nd->saved, nd->ids, nd->iparam[0],
                                         nd->iparam[1]);
}

BqTensor *bq_op_span_cross_entropy(BqCtx *ctx, BqTensor *logits, const int32_t *pos) {
    CONTIG(logits);
    BQ_CHECK(logits->ndim == 3 && logits->shape[2] == 2 && pos != NULL);
    int64_t B = logits->shape[0], T = logits->shape[1];
    for (int64_t i = 0; i < 2 * B; i++) BQ_CHECK(pos[i] >= 0 && pos[i] <= T);
    int64_t one = 1;
    BqTensor *loss = bq_tensor_new(ctx, 1, &one);
    float *probs = bq_arena_alloc(ctx->act, (size_t)(B * T * 2) * sizeof(float));
    int64_t cnt[2];
    bq_kernel_span_ce_forward(loss->data, probs, cnt, logits->data, pos, B, T);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_SPAN_CROSS_ENTROPY, loss, logits, NULL, NULL);
        nd->ids = pos;
        nd->saved = probs;
        nd->iparam[0] = B, nd->iparam[1] = T, nd->iparam[2] = cnt[0], nd->iparam[3] = cnt[1];
    }
    return loss;
}

static void back_span_cross_entropy(BqNode *nd) {
    if (nd->in[0]->grad)
        bq_kernel_span_ce_backward(nd->in[0]->grad, nd->out->grad[0], nd->saved, &nd->iparam[2], nd->ids,
                                   nd->iparam[0], nd->iparam[1]);
}

/* Views x as (outer, nscale, inner). Per tensor, the rows of the last axis serve as `outer` so the
 * kernel still has rows to spread over threads. */
static void fq_dims(const BqTensor *x, int64_t nscale, int axis, int64_t *outer, int64_t *inner) {
    int64_t n = bq_tensor_numel(x);
    if (nscale == 1) {
        int64_t last = x->ndim ? last_dim(x) : 1;
        if (last <= 0) last = 1;
        *inner = last;
        *outer = n / last;
        return;
    }
    BQ_CHECK(axis >= 0 && axis < x->ndim && x->shape[axis] == nscale);
    int64_t in = 1;
    for (int i = axis + 1; i < x->ndim; i++) in *= x->shape[i];
    *inner = in;
    *outer = n / (in * nscale);
}

/* 1 when the values of x are read by no backward to come once a sole-consumer quantizer has used them: x was
 * made by one of the last few tape nodes, whose backward does not read its own output (softmax and tanh
 * do), and no later node has it as an input. Anything else (x from further back, a parameter, an op that
 * reads its output) keeps the copying path. */
static int output_free_after(const BqTape *t, const BqTensor *x) {
    for (int64_t i = t->n - 1; i >= 0 && i >= t->n - 8; i--) {
        const BqNode *nd = &t->nodes[i];
        if (nd->in[0] == x || nd->in[1] == x || nd->in[2] == x) return 0;
        if (nd->out == x) return nd->op != BQ_OP_SOFTMAX_MASK && nd->op != BQ_OP_TANH;
    }
    return 0;
}

static BqTensor *fakequant(BqCtx *ctx, BqTensor *x, const float *scale, float *dscale, float grad_factor,
                           int64_t nscale, int axis, int qmin, int qmax, int sole) {
    CONTIG(x);
    BQ_CHECK(scale != NULL && nscale >= 1 && qmin < qmax);
    int64_t outer, inner;
    fq_dims(x, nscale, axis, &outer, &inner);
    BqTensor *y;
    if (sole && !ctx->tape) { /* inference: nothing else reads x, so quantize it in place */
        bq_kernel_fakequant_forward(x->data, x->data, scale, outer, nscale, inner, qmin, qmax);
        return x;
    }
    if (sole && ctx->tape && x->grad && nscale == 1 && !dscale && output_free_after(ctx->tape, x)) {
        /* training, and nobody reads x's values again: quantize in place and keep the straight-through
         * mask as bits instead of a second copy of the activation */
        const int64_t n = bq_tensor_numel(x);
        uint32_t *bits = bq_arena_alloc(ctx->act, (size_t)((n + 31) / 32 > 0 ? (n + 31) / 32 : 1) * sizeof(uint32_t));
        bq_kernel_fakequant_forward_bits(x->data, bits, scale[0], n, qmin, qmax);
        BqNode *nd = tape_push(ctx, BQ_OP_FAKEQUANT, x, x, NULL, NULL);
        nd->fparam = scale;
        nd->iparam[0] = outer, nd->iparam[1] = nscale, nd->iparam[2] = inner;
        nd->iparam[3] = (int64_t)(uint32_t)qmin | ((int64_t)(uint32_t)qmax << 32);
        nd->fval[0] = 2.0f; /* in place: the mask is in nd->saved */
        nd->saved = bits;
        return x;
    }
    if (sole && ctx->tape && x->grad) {
        y = bq_arena_alloc(ctx->act, sizeof(BqTensor));
        memset(y, 0, sizeof *y);
        bq_tensor_set_shape(y, x->ndim, x->shape);
        y->data = bq_arena_alloc(ctx->act, (size_t)bq_tensor_numel(x) * sizeof(float));
        y->grad = x->grad;
    } else {
        sole = 0;
        y = new_like(ctx, x);
    }
    bq_kernel_fakequant_forward(y->data, x->data, scale, outer, nscale, inner, qmin, qmax);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_FAKEQUANT, y, x, NULL, NULL);
        nd->fparam = scale;
        nd->iparam[0] = outer, nd->iparam[1] = nscale, nd->iparam[2] = inner;
        nd->iparam[3] = (int64_t)(uint32_t)qmin | ((int64_t)(uint32_t)qmax << 32);
        nd->fval[0] = (float)sole;
        nd->saved = dscale; /* the learned scale's gradient (caller-owned), or NULL */
        nd->fval[1] = grad_factor;
    }
    return y;
}

BqTensor *bq_op_fakequant(BqCtx *ctx, BqTensor *x, const float *scale, int64_t nscale, int axis, int qmin,
                          int qmax) {
    return fakequant(ctx, x, scale, NULL, 0.0f, nscale, axis, qmin, qmax, 0);
}

BqTensor *bq_op_fakequant_sole(BqCtx *ctx, BqTensor *x, const float *scale, int64_t nscale, int axis, int qmin,
                               int qmax) {
    return fakequant(ctx, x, scale, NULL, 0.0f, nscale, axis, qmin, qmax, 1);
}

BqTensor *bq_op_fakequant_lsq(BqCtx *ctx, BqTensor *x, const float *scale, float *dscale, int64_t nscale, int axis,
                              int qmin, int qmax, float grad_factor, int sole) {
    return fakequant(ctx, x, scale, dscale, grad_factor, nscale, axis, qmin, qmax, sole);
}

static void back_fakequant(BqNode *nd) {
    int qmin = (int)(int32_t)(uint32_t)(nd->iparam[3] & 0xffffffff);
    int qmax = (int)(int32_t)(uint32_t)((uint64_t)nd->iparam[3] >> 32);
    if (nd->fval[0] == 2.0f) { /* quantized in place (never with a learned scale): nd->saved is the mask */
        bq_kernel_fakequant_mask_bits_inplace(nd->in[0]->grad, nd->saved, nd->iparam[0] * nd->iparam[1] * nd->iparam[2]);
        return;
    }
    /* the scale's gradient first: with a shared buffer the mask below overwrites dout */
    if (nd->saved)
        bq_kernel_fakequant_backward_scale(nd->saved, nd->out->grad, nd->in[0]->data, nd->fparam, nd->iparam[0],
                                           nd->iparam[1], nd->iparam[2], qmin, qmax, nd->fval[1]);
    if (!nd->in[0]->grad) return;
    if (nd->fval[0] != 0.0f) /* output and input share the gradient buffer */
        bq_kernel_fakequant_mask_inplace(nd->in[0]->grad, nd->in[0]->data, nd->fparam, nd->iparam[0], nd->iparam[1],
                                         nd->iparam[2], qmin, qmax);
    else
        bq_kernel_fakequant_backward(nd->in[0]->grad, nd->out->grad, nd->in[0]->data, nd->fparam, nd->iparam[0],
                                     nd->iparam[1], nd->iparam[2], qmin, qmax);
}

/* Where bq_op_gelu_linear's backward finds the GELU output: u's gradient buffer, as floats kept from the
 * forward, or in bf16 precision as bf16 words in the buffer's first half, formed again from u. */
static BqMat gelu_out(const BqTensor *u, BqPrecision prec) {
    return prec == BQ_PRECISION_BF16 ? (BqMat){.f = NULL, .h = (const uint16_t *)(const void *)u->grad}
                                     : bq_mat_f32(u->grad);
}

BqTensor *bq_op_gelu_linear(BqCtx *ctx, BqTensor *u, BqTensor *bi, BqTensor *w, BqTensor *b) {
    CONTIG(u);
    CONTIG(w);
    BQ_CHECK(w->ndim == 2 && last_dim(u) == w->shape[1]);
    if (!ctx->tape || !u->grad) return bq_op_linear(ctx, bq_op_bias_gelu_sole(ctx, u, bi), w, b);
    int64_t C = w->shape[1], OC = w->shape[0], N = bq_tensor_numel(u) / C;
    if (bi) {
        CONTIG(bi);
        BQ_CHECK(bq_tensor_numel(bi) == C);
    }
    if (b) {
        CONTIG(b);
        BQ_CHECK(bq_tensor_numel(b) == OC);
    }
    BqTensor *y = new_last(ctx, u, OC);
    if (ctx->prec == BQ_PRECISION_BF16) {
        /* bf16: the GELU output as bf16 words in a page block given back after the product; the
         * backward forms it again (one GELU pass) rather than keep N·C words to the backward */
        const size_t bytes = (size_t)(N * C) * sizeof(uint16_t), mark = bq_arena_mark(ctx->act);
        uint16_t *g = bq_arena_alloc_pages(ctx->act, bytes);
        bq_kernel_bias_gelu_forward_m(NULL, g, mat_of(u), bi ? bi->data : NULL, N, C);
        bq_kernel_linear_forward_m(y->data, (BqMat){.f = NULL, .h = g}, w->data, b ? b->data : NULL, N, C, OC,
                                   ctx->prec);
        bq_arena_release(ctx->act, g, bytes);
        bq_arena_rewind(ctx->act, mark);
    } else {
        /* u's gradient buffer is untouched until this op's backward (u has no other consumer): it holds
         * the GELU output meanwhile */
        bq_kernel_bias_gelu_forward(u->grad, u->data, bi ? bi->data : NULL, N, C);
        bq_kernel_linear_forward(y->data, u->grad, w->data, b ? b->data : NULL, N, C, OC, ctx->prec);
    }
    BqNode *nd = tape_push(ctx, BQ_OP_GELU_LINEAR, y, u, w, b);
    nd->saved = bi;
    nd->iparam[0] = N, nd->iparam[1] = C, nd->iparam[2] = OC;
    return y;
}

static void back_gelu_linear(BqNode *nd) {
    BqTensor *u = nd->in[0], *w = nd->in[1], *b = nd->in[2], *bi = nd->saved;
    int64_t N = nd->iparam[0], C = nd->iparam[1], OC = nd->iparam[2];
    /* dw and db from the GELU output in u->grad (kept from the forward, or in bf16 formed again there now);
     * then u->grad = dy·w (the buffer's previous content was the GELU output, not a gradient) and the
     * GELU backward in place */
    BqMat g = gelu_out(u, nd->prec);
    if (g.h) bq_kernel_bias_gelu_forward_m(NULL, (uint16_t *)g.h, mat_of(u), bi ? bi->data : NULL, N, C);
    const BqMat dy = dy_operand(nd->out->grad, N, OC, nd->prec, 1);
    bq_kernel_linear_backward_m(NULL, w->grad, b ? b->grad : NULL, nd->out->grad, dy, g, w->data, N, C, OC, nd->prec);
    memset(u->grad, 0, (size_t)(N * C) * sizeof(float));
    bq_kernel_linear_backward_m(u->grad, NULL, NULL, nd->out->grad, dy, bq_mat_f32(NULL), w->data, N, C, OC, nd->prec);
    bq_kernel_bias_gelu_backward_m(u->grad, bi ? bi->grad : NULL, u->grad, mat_of(u), bi ? bi->data : NULL, N, C);
}

typedef struct EmbLnSaved {
    const int32_t *ids, *type_ids, *pos_ids;
    BqTensor *w, *b;
    float *mean, *rstd, *stats;
} EmbLnSaved;

BqTensor *bq_op_embed_layernorm(BqCtx *ctx, BqTensor *word, BqTensor *type, BqTensor *pos, const int32_t *ids,
                                const int32_t *type_ids, const int32_t *pos_ids, int64_t B, int64_t T, BqTensor *w,
                                BqTensor *b, float eps, int32_t word_padding_idx) {
    CONTIG(word);
    CONTIG(type);
    CONTIG(pos);
    CONTIG(w);
    CONTIG(b);
    int64_t H = word->shape[1], N = B * T;
    BQ_CHECK(word->ndim == 2 && type->ndim == 2 && pos->ndim == 2 && type->shape[1] == H && pos->shape[1] == H);
    BQ_CHECK(bq_tensor_numel(w) == H && bq_tensor_numel(b) == H && ids && type_ids && pos_ids);
    int64_t shape[3] = {B, T, H};
    BqTensor *y = bq_tensor_new(ctx, 3, shape);
    EmbLnSaved *sv = bq_arena_alloc(ctx->act, sizeof(EmbLnSaved));
    sv->ids = ids, sv->type_ids = type_ids, sv->pos_ids = pos_ids, sv->w = w, sv->b = b;
    sv->mean = bq_arena_alloc(ctx->act, (size_t)N * sizeof(float));
    sv->rstd = bq_arena_alloc(ctx->act, (size_t)N * sizeof(float));
    sv->stats = ctx->tape ? bq_arena_alloc(ctx->act, (size_t)(2 * N) * sizeof(float)) : NULL;
    bq_kernel_embed_layernorm_forward(y->data, sv->mean, sv->rstd, word->data, type->data, pos->data, ids, type_ids,
                                      pos_ids, w->data, b->data, N, H, eps);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_EMBED_LAYERNORM, y, word, type, pos);
        nd->saved = sv;
        nd->iparam[0] = N, nd->iparam[1] = H, nd->iparam[2] = word_padding_idx;
    }
    return y;
}

static void back_embed_layernorm(BqNode *nd) {
    EmbLnSaved *sv = nd->saved;
    bq_kernel_embed_layernorm_backward(nd->in[0]->grad, nd->in[1]->grad, nd->in[2]->grad, sv->w->grad, sv->b->grad,
                                       sv->stats, nd->out->grad, nd->in[0]->data, nd->in[1]->data, nd->in[2]->data,
                                       sv->ids, sv->type_ids, sv->pos_ids, sv->w->data, sv->mean, sv->rstd,
                                       nd->iparam[0], nd->iparam[1], (int32_t)nd->iparam[2]);
}

/* ---- distillation losses ---- */

BqTensor *bq_op_kl_distill(BqCtx *ctx, BqTensor *s, BqTensor *t, float T) {
    CONTIG(s);
    CONTIG(t);
    BQ_CHECK(s->ndim == 2 && t->ndim == 2 && s->shape[0] == t->shape[0] && s->shape[1] == t->shape[1] && T > 0);
    int64_t B = s->shape[0], C = s->shape[1], one = 1;
    BqTensor *loss = bq_tensor_new(ctx, 1, &one);
    float *p = bq_arena_alloc(ctx->act, (size_t)(2 * B * C) * sizeof(float)); /* p_s then p_t */
    bq_kernel_kl_distill_forward(loss->data, p, p + B * C, s->data, t->data, B, C, T);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_KL_DISTILL, loss, s, t, NULL);
        nd->saved = p;
        nd->iparam[0] = B, nd->iparam[1] = C;
        nd->fval[0] = T;
    }
    return loss;
}

static void back_kl_distill(BqNode *nd) {
    int64_t B = nd->iparam[0], C = nd->iparam[1];
    const float *p = nd->saved;
    if (nd->in[0]->grad)
        bq_kernel_kl_distill_backward(nd->in[0]->grad, nd->out->grad[0], p, p + B * C, B, C, nd->fval[0]);
}

BqTensor *bq_op_mse(BqCtx *ctx, BqTensor *x, BqTensor *y) {
    CONTIG(x);
    CONTIG(y);
    int64_t n = bq_tensor_numel(x), one = 1;
    BQ_CHECK(n > 0 && n == bq_tensor_numel(y));
    BqTensor *loss = bq_tensor_new(ctx, 1, &one);
    bq_kernel_mse_forward(loss->data, x->data, y->data, n);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_MSE, loss, x, y, NULL);
        nd->iparam[0] = n;
    }
    return loss;
}

static void back_mse(BqNode *nd) {
    if (nd->in[0]->grad || nd->in[1]->grad)
        bq_kernel_mse_backward(nd->in[0]->grad, nd->in[1]->grad, nd->out->grad[0], nd->in[0]->data, nd->in[1]->data,
                               nd->iparam[0]);
}

BqTensor *bq_op_scale(BqCtx *ctx, BqTensor *x, float a) {
    CONTIG(x);
    BqTensor *y = bq_tensor_new(ctx, x->ndim, x->shape);
    int64_t n = bq_tensor_numel(x);
    bq_kernel_scale_forward(y->data, x->data, a, n);
    if (ctx->tape) {
        BqNode *nd = tape_push(ctx, BQ_OP_SCALE, y, x, NULL, NULL);
        nd->iparam[0] = n;
        nd->fval[0] = a;
    }
    return y;
}

static void back_scale(BqNode *nd) {
    if (nd->in[0]->grad) bq_kernel_scale_backward(nd->in[0]->grad, nd->out->grad, nd->fval[0], nd->iparam[0]);
}

/* ---- backward ---- */

typedef void (*BackFn)(BqNode *);

static const BackFn g_backward[BQ_OP_COUNT] = {
    [BQ_OP_LINEAR] = back_linear,
    [BQ_OP_ATTN_SCORES] = back_attn_scores,
    [BQ_OP_ATTN_CONTEXT] = back_attn_context,
    [BQ_OP_ADD] = back_add,
    [BQ_OP_EMBEDDING] = back_embedding,
    [BQ_OP_LAYERNORM] = back_layernorm,
    [BQ_OP_GELU] = back_gelu,
    [BQ_OP_TANH] = back_tanh,
    [BQ_OP_SOFTMAX_MASK] = back_softmax_mask,
    [BQ_OP_DROPOUT] = back_dropout,
    [BQ_OP_SELECT_TOKEN] = back_select_token,
    [BQ_OP_CROSS_ENTROPY] = back_cross_entropy,
    [BQ_OP_FAKEQUANT] = back_fakequant,
    [BQ_OP_SPAN_CROSS_ENTROPY] = back_span_cross_entropy,
    [BQ_OP_BIAS_GELU] = back_bias_gelu,
    [BQ_OP_RESIDUAL_LAYERNORM] = back_residual_layernorm,
    [BQ_OP_GELU_LINEAR] = back_gelu_linear,
    [BQ_OP_EMBED_LAYERNORM] = back_embed_layernorm,
    [BQ_OP_KL_DISTILL] = back_kl_distill,
    [BQ_OP_MSE] = back_mse,
    [BQ_OP_SCALE] = back_scale,
};

void bq_backward(BqCtx *ctx, BqTensor *loss) {
    BQ_CHECK(ctx->tape != NULL && loss != NULL && loss->grad != NULL);
    loss->grad[0] = 1.0f;
    for (int64_t i = ctx->tape->n - 1; i >= 0; i--) {
        BqNode *nd = &ctx->tape->nodes[i];
        BQ_CHECK(nd->op >= 0 && nd->op < BQ_OP_COUNT && g_backward[nd->op] != NULL);
        if (!nd->out->grad) continue;
        if (g_prof_on) {
            double t0 = bq_now();
            g_backward[nd->op](nd);
            g_prof.bwd_s[nd->op] += bq_now() - t0;
            g_prof.bwd_n[nd->op]++;
        } else {
            g_backward[nd->op](nd);
        }
        /* Every consumer of nd->out ran its backward before this node (the tape is in topological
         * order), so its gradient is complete and read by nobody else: give its pages back. An in-place
         * op (out is one of its inputs) leaves that to the op that produced the tensor. */
        BqTensor *o = nd->out;
        if (grad_block_of(o, nd->in[0], nd->in[1], nd->in[2]))
            bq_arena_release(ctx->act, o->grad, (size_t)bq_tensor_numel(o) * sizeof(float));
    }
}
