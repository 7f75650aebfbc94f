/* The fused inference encoder layer shared by the engines (contracts in layers/bert_fused.h).
 * The ops and their order are layer_forward's of layers/bert.c in evaluation (no dropout). */
#include "layers/bert_fused.h"

#include <math.h>
#include <string.h>

#include "autograd/infer_kernels.h"
#include "autograd/kernels.h"

/* An activation of rows·n values: floats and/or codes as asked, from ctx->act. */
static BqFusedAct act_new(BqCtx *ctx, int64_t rows, int64_t n, int floats, int codes) {
    BqFusedAct a = {NULL, NULL};
    if (floats) a.f = bq_arena_alloc(ctx->act, (size_t)(rows * n) * sizeof(float));
    if (codes) a.codes = bq_arena_alloc(ctx->act, (size_t)(rows * n));
    return a;
}

/* Token 0's row of each example of a (B·T rows of H) as B rows, in ctx->act. */
static BqFusedAct act_token0(BqCtx *ctx, const BqFusedAct *a, int64_t B, int64_t T, int64_t H) {
    BqFusedAct r = act_new(ctx, B, H, a->f != NULL, a->codes != NULL);
    if (a->f) bq_kernel_select_token_forward(r.f, a->f, B, T, H, 0);
    if (a->codes)
        for (int64_t b = 0; b < B; b++) memcpy(r.codes + b * H, a->codes + b * T * H, (size_t)H);
    return r;
}

/* The room for a layer's output of shape (ndim, shape) on input x, and for its codes when next (the next
 * layer reads them). Unless r->keep: x's own values, which the layer reads last in the attention output's
 * residual, before it writes any output row (no output is larger than x: every layer's input has the
 * batch's shape, and the [CLS]-only last layer's output is smaller), and r->codes, taken from ctx->act at
 * the forward's first fused layer that writes codes, with room for x's values (the layer's input codes,
 * when they are r->codes, are read only by its first bracket). With r->keep, new room in ctx->act. */
static BqTensor *out_room(BqFusedRun *r, BqCtx *ctx, BqTensor *x, int ndim, const int64_t *shape, int next,
                          uint8_t **codes) {
    const int64_t n = shape[0] * shape[1] * (ndim == 3 ? shape[2] : 1);
    if (r->keep) {
        *codes = next ? bq_arena_alloc(ctx->act, (size_t)n) : NULL;
        return bq_tensor_new(ctx, ndim, shape);
    }
    BQ_CHECK(n <= bq_tensor_numel(x));
    if (next && !r->codes) {
        r->codes_n = bq_tensor_numel(x);
        r->codes = bq_arena_alloc(ctx->act, (size_t)r->codes_n);
    }
    BQ_CHECK(!next || n <= r->codes_n);
    *codes = next ? r->codes : NULL;
    const int slot = x == &r->out[0]; /* the header x is not: the layer still reads x's shape */
    r->out[slot] = bq_tensor_wrap(x->data, NULL, ndim, shape);
    return &r->out[slot];
}

/* One bracket into out, whose buffers are already taken: what the engine takes from ctx->act for it (its
 * int32 sums or float products, the attention's scratch) is dead once it returns, and given back. */
static int run_step(const BqFusedEngine *e, BqCtx *ctx, int l, const BqFusedAct *in, const BqFusedStep *s,
                    BqFusedAct *out) {
    const size_t mark = bq_arena_mark(ctx->act);
    const int st = e->linear(e->user, ctx, l, in, s, out);
    bq_arena_rewind(ctx->act, mark);
    return st;
}

static int64_t g_block_rows; /* bq_fused_set_block_rows; 0: the default */

void bq_fused_set_block_rows(int64_t rows) { g_block_rows = rows > 0 ? rows : 0; }

int64_t bq_fused_block_rows(int64_t inter) {
    BQ_CHECK(inter > 0);
    if (g_block_rows) return g_block_rows;
    const int64_t by_bytes = BQ_FUSED_BLOCK_BYTES / (4 * inter);
    return by_bytes < 1 ? 1 : by_bytes < BQ_FUSED_BLOCK_ROWS ? by_bytes : BQ_FUSED_BLOCK_ROWS;
}

int bq_fused_layer(void *user, BqCtx *ctx, int l, BqTensor *x, const float *mask, int cls_only, BqTensor **y) {
    BqFusedRun *r = user;
    const BqFusedEngine *e = r->e;
    const BqBert *m = r->m;
    const BqBertConfig *c = &m->cfg;
    *y = NULL;
    if (!e->layer_ok(e->user, l) || x->ndim != 3 || !bq_tensor_is_contiguous(x) || x->shape[2] != c->hidden_size)
        return BQ_OK;
    const BqBertLayer *L = &m->layers[l];
    const int64_t B = x->shape[0], T = x->shape[1], H = c->hidden_size, NI = c->intermediate_size;
    const int64_t NH = c->num_attention_heads, d = H / NH, M = B * T;
    const int64_t R = cls_only ? B : M; /* rows after the attention: every token, or token 0 of each example */

    /* kept: the layer's output, and its codes where the next layer reads them */
    int64_t shape[3] = {B, cls_only ? H : T, H};
    const int next = e->codes && !cls_only && l + 1 < c->num_hidden_layers && e->layer_ok(e->user, l + 1);
    uint8_t *next_codes = NULL;
    BqTensor *o = out_room(r, ctx, x, cls_only ? 2 : 3, shape, next, &next_codes);
    const size_t mark = bq_arena_mark(ctx->act);
    int st;

    /* a = LayerNorm(dense(context) + x) lives until the output dense's last block: it is taken first, so
     * that the context and the input codes, dead after the attention output dense, are given back before
     * the intermediate dense (the query/key/value bracket holds one block's products: a on top of it costs
     * no more than the attention output dense's x, context and a together) */
    const int a_on_x = e->resid_in_place && !r->keep;
    BqFusedAct a = act_new(ctx, R, H, !a_on_x, e->codes);
    if (a_on_x) a.f = x->data; /* R <= M rows: x's room, which o (the same room) then overwrites row by row */
    const size_t attn_mark = bq_arena_mark(ctx->act);
    BqFusedAct in = {x->data, NULL};
    if (e->codes) {
        in.codes = r->pend_src == x->data && r->pend_layer == l - 1 ? r->pend_codes : NULL;
        if (!in.codes) { /* the embeddings' output, or a layer run op by op: into r->codes where it is taken */
            const int in_buf = !r->keep && r->codes && r->codes_n >= M * H;
            in.codes = in_buf ? r->codes : bq_arena_alloc(ctx->act, (size_t)(M * H));
            e->quantize_input(e->user, l, x->data, M * H, in.codes);
        }
    }

    /* BertSelfAttention: the query/key/value product and the attention block. A [CLS]-only layer reads
     * token 0's row of the context alone, so its attention computes the first block of query rows (against
     * every key) */
    const int64_t Q = cls_only && T > BQ_INFER_QUERY_BLOCK ? BQ_INFER_QUERY_BLOCK : T;
    BqFusedAct cx = act_new(ctx, B * Q, H, !e->codes, e->codes);
    BqFusedStep s = {.id = BQ_LIN_QKV, .rows = M, .N = H, .mask = mask, .B = B, .T = T,
                     .NH = NH, .d = d, .Q = Q, .scale = 1.0f / sqrtf((float)d)};
    if ((st = run_step(e, ctx, l, &in, &s, &cx))) goto cleanup;
    const float *xr = x->data;
    if (cls_only) {
        cx = act_token0(ctx, &cx, B, Q, H);
        BqFusedAct xf = {x->data, NULL}, x0 = act_token0(ctx, &xf, B, T, H);
        xr = x0.f;
    }

    /* BertSelfOutput: LayerNorm(dense(context) + x) */
    s = (BqFusedStep){.id = BQ_LIN_AO, .rows = R, .N = H, .resid = xr,
                      .lnw = L->ln1_w.data, .lnb = L->ln1_b.data, .eps = c->layer_norm_eps};
    if ((st = run_step(e, ctx, l, &cx, &s, &a))) goto cleanup;
    bq_arena_rewind(ctx->act, attn_mark);

    /* BertIntermediate and BertOutput, e->mlp_rows rows at a time: h = gelu(dense(a)) of a block, then
     * LayerNorm(dense(h) + a) of its rows, so h takes one block's room (every op is row-wise) */
    const int64_t mb = e->mlp_rows > 0 && e->mlp_rows < R ? e->mlp_rows : R;
    BqFusedAct h = act_new(ctx, mb, NI, !e->codes, e->codes);
    for (int64_t r0 = 0; r0 < R; r0 += mb) {
        const int64_t rb = R - r0 < mb ? R - r0 : mb;
        BqFusedAct ab = {a.f + r0 * H, a.codes ? a.codes + r0 * H : NULL};
        s = (BqFusedStep){.id = BQ_LIN_I, .rows = rb, .N = NI};
        if ((st = run_step(e, ctx, l, &ab, &s, &h))) goto cleanup;
        BqFusedAct out = {o->data + r0 * H, next_codes ? next_codes + r0 * H : NULL};
        s = (BqFusedStep){.id = BQ_LIN_O, .rows = rb, .N = H, .resid = a.f + r0 * H,
                          .lnw = L->ln2_w.data, .lnb = L->ln2_b.data, .eps = c->layer_norm_eps};
        if ((st = run_step(e, ctx, l, &h, &s, &out))) goto cleanup;
    }
cleanup:
    bq_arena_rewind(ctx->act, mark);
    if (st) return st;
    r->pend_src = o->data;
    r->pend_codes = next_codes;
    r->pend_layer = l;
    *y = o;
    return BQ_OK;
}
