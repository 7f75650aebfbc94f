/* The attention products on integer codes (autograd/tensor.h bq_op_attn_scores_int, bq_op_attn_context_int),
 * which the QAT forward, fake quant and the int8 engine use where both inputs of Q·Kᵀ or P·V are on
 * 8-bit grids (`ort`, `qdqbert`; layers/bert.c):
 *   - forward equal bit for bit to fl(Σ ca·cb · fl(sa·sb)) with the integer sum computed in 64 bits, on
 *     random codes with the saturation codes −128 and 127 (and 0..255 for probabilities) in every row
 *     (the kernels' sgemm on fp32 codes), and on codes up to ±3000 (their int32 path);
 *   - within fp32 rounding of the fp32 products on the same values (bq_op_attn_scores / _context);
 *   - gradients equal bit for bit to the fp32 ops' (straight-through: the same backward);
 *   - the same bits on 1 and 2 threads;
 *   - a whole QAT step of a small model in the `ort` and `qdqbert` schemes, in training and evaluation
 *     mode, with and without the integer products (qs->fp32_linear): loss, logits and every parameter
 *     tensor's gradient within the fp32 rounding the two forwards differ by (the bound is derived in
 *     main), and, in every scheme and mode, a check that the integer products ran: each Q·Kᵀ and P·V of a
 *     recorded forward equals the integer result bit for bit, and none of the fp32 run's does.
 * Prints the largest differences. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/kernels.h"
#include "autograd/tensor.h"
#include "layers/bert.h"
#include "layers/quant.h"
#include "src/train.h"
#include "tests/test_util.h"

enum { B = 2, T = 13, NH = 3, D = 8, H = NH * D };
/* The model of the QAT steps: layers, hidden size, heads, intermediate size; its batch: SB examples of ST
 * tokens. */
enum { ML = 2, MH = 24, MHEADS = 3, MI = 40, SB = 3, ST = 9 };

/* Codes in [lo, hi] with the ends present in every row of `cols` values; values = code·s. */
static void make_codes(int32_t *c, float *x, int64_t n, int64_t cols, int lo, int hi, float s, BqRng *r) {
    for (int64_t i = 0; i < n; i++) {
        int64_t col = i % cols;
        c[i] = col == 0 ? lo : col == 1 ? hi : lo + (int32_t)bq_rng_below(r, (uint64_t)(hi - lo + 1));
        x[i] = (float)c[i] * s;
    }
}

/* Runs the scores (which = 0) or context (1) product, int or fp32, recorded, with dout = g; copies the
 * output and both input gradients out. */
static void run(int which, int integer, const float *a, const float *b, float sa, float sb, const float *g,
                float *out, float *da, float *db) {
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 24, "t") == BQ_OK);
    BqTape tape;
    bq_tape_init(&tape, 8);
    BqCtx ctx = {.act = &act, .tape = &tape};
    int64_t sh3[3] = {B, T, H}, sh4[4] = {B, NH, T, T};
    int64_t na = which == 0 ? B * T * H : B * NH * T * T, nb = B * T * H;
    BqTensor *A = bq_tensor_new(&ctx, which == 0 ? 3 : 4, which == 0 ? sh3 : sh4);
    BqTensor *Bt = bq_tensor_new(&ctx, 3, sh3);
    memcpy(A->data, a, (size_t)na * sizeof(float));
    memcpy(Bt->data, b, (size_t)nb * sizeof(float));
    A->grad = bq_arena_alloc_zero(&act, (size_t)na * sizeof(float));
    Bt->grad = bq_arena_alloc_zero(&act, (size_t)nb * sizeof(float));
    BqTensor *y = which == 0 ? (integer ? bq_op_attn_scores_int(&ctx, A, Bt, sa, sb, NH) : bq_op_attn_scores(&ctx, A, Bt, NH))
                             : (integer ? bq_op_attn_context_int(&ctx, A, Bt, sa, sb, NH)
                                        : bq_op_attn_context(&ctx, A, Bt, NH));
    int64_t ny = bq_tensor_numel(y);
    y->grad = bq_arena_alloc(&act, (size_t)ny * sizeof(float));
    memcpy(y->grad, g, (size_t)ny * sizeof(float));
    memcpy(out, y->data, (size_t)ny * sizeof(float));
    float one = 0, gs = 0;
    int64_t sh1 = 1;
    BqTensor seed = bq_tensor_wrap(&one, &gs, 1, &sh1);
    bq_backward(&ctx, &seed);
    memcpy(da, A->grad, (size_t)na * sizeof(float));
    memcpy(db, Bt->grad, (size_t)nb * sizeof(float));
    bq_tape_free(&tape);
    bq_arena_free(&act);
}

/* wide: codes up to ±3000, so that the sums may exceed 2^24 and the kernel takes its int32 path instead
 * of the sgemm on fp32 codes (autograd/kernels.c); both must give the exact result. */
static void check_product(int which, int wide) {
    const char *name = which == 0 ? (wide ? "Q·Kᵀ (wide codes, int32 path)" : "Q·Kᵀ (sgemm path)")
                                  : (wide ? "P·V (wide codes, int32 path)" : "P·V (sgemm path)");
    BqRng r;
    bq_rng_seed(&r, 11 + (uint64_t)which);
    const int64_t na = which == 0 ? B * T * H : B * NH * T * T, nb = B * T * H, ny = which == 0 ? B * NH * T * T : B * T * H;
    int32_t *ca = malloc(sizeof(int32_t) * (size_t)na), *cb = malloc(sizeof(int32_t) * (size_t)nb);
    float *a = malloc(sizeof(float) * (size_t)na), *b = malloc(sizeof(float) * (size_t)nb);
    float *g = malloc(sizeof(float) * (size_t)ny);
    float *y[3], *da[3], *db[3];
    for (int k = 0; k < 3; k++) {
        y[k] = malloc(sizeof(float) * (size_t)ny);
        da[k] = malloc(sizeof(float) * (size_t)na);
        db[k] = malloc(sizeof(float) * (size_t)nb);
    }
    const float sa = which == 0 ? 0.0371f : 1.0f / 255.0f, sb = 0.0213f;
    /* scores: both signed; context: probabilities as unsigned codes 0..255, rows of T keys */
    const int w = wide ? 3000 : 0;
    make_codes(ca, a, na, which == 0 ? D : T, which == 0 ? -128 - w : 0, which == 0 ? 127 + w : 255 + w, sa, &r);
    make_codes(cb, b, nb, D, -128 - w, 127 + w, sb, &r);
    for (int64_t i = 0; i < ny; i++) g[i] = (float)bq_rng_uniform(&r) - 0.5f;

    omp_set_num_threads(2);
    run(which, 1, a, b, sa, sb, g, y[0], da[0], db[0]);
    omp_set_num_threads(1);
    run(which, 1, a, b, sa, sb, g, y[1], da[1], db[1]);
    omp_set_num_threads(2);
    run(which, 0, a, b, sa, sb, g, y[2], da[2], db[2]);

    /* exact reference */
    const float f = sa * sb;
    int64_t exact_bad = 0, thread_bad = 0, grad_bad = 0;
    double max_fp32 = 0.0, bound = 0.0;
    for (int64_t bb = 0; bb < B; bb++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < T; i++) {
                int64_t ncol = which == 0 ? T : D;
                for (int64_t j = 0; j < ncol; j++) {
                    int64_t sum = 0, abs_sum = 0;
                    if (which == 0)
                        for (int64_t c = 0; c < D; c++) {
                            int64_t p = (int64_t)ca[(bb * T + i) * H + h * D + c] * cb[(bb * T + j) * H + h * D + c];
                            sum += p, abs_sum += p < 0 ? -p : p;
                        }
                    else
                        for (int64_t t = 0; t < T; t++) {
                            int64_t p = (int64_t)ca[((bb * NH + h) * T + i) * T + t] * cb[(bb * T + t) * H + h * D + j];
                            sum += p, abs_sum += p < 0 ? -p : p;
                        }
                    int64_t at = which == 0 ? ((bb * NH + h) * T + i) * T + j : (bb * T + i) * H + h * D + j;
                    float want = (float)sum * f;
                    exact_bad += memcmp(&y[0][at], &want, sizeof(float)) != 0;
                    /* fp32 products of the same values: each term and partial sum rounded */
                    double err = fabs((double)y[0][at] - (double)y[2][at]);
                    double tol = 4.0 * (double)(which == 0 ? D : T) * 6e-8 * (double)abs_sum * (double)f + 1e-30;
                    if (err > max_fp32) max_fp32 = err;
                    if (err > tol) {
                        if (exact_bad + 1 < 5) printf("  %s[%lld]: int %.9g fp32 %.9g tol %.3g\n", name, (long long)at,
                                                      y[0][at], y[2][at], tol);
                        bound += 1;
                    }
                }
            }
    thread_bad += memcmp(y[0], y[1], sizeof(float) * (size_t)ny) != 0;
    thread_bad += memcmp(da[0], da[1], sizeof(float) * (size_t)na) != 0;
    thread_bad += memcmp(db[0], db[1], sizeof(float) * (size_t)nb) != 0;
    grad_bad += memcmp(da[0], da[2], sizeof(float) * (size_t)na) != 0;
    grad_bad += memcmp(db[0], db[2], sizeof(float) * (size_t)nb) != 0;
    printf("%s on codes: %lld outputs, %lld differ from the exact integer result, max |int − fp32| %.3g "
           "(%g beyond the rounding bound); 1 vs 2 threads %s; gradients %s the fp32 op's\n",
           name, (long long)ny, (long long)exact_bad, max_fp32, bound, thread_bad ? "DIFFER" : "identical",
           grad_bad ? "DIFFER from" : "equal to");
    EXPECT(exact_bad == 0, " %s", name);
    EXPECT(bound == 0, " %s", name);
    EXPECT(thread_bad == 0, " %s", name);
    EXPECT(grad_bad == 0, " %s", name);
    for (int k = 0; k < 3; k++) free(y[k]), free(da[k]), free(db[k]);
    free(ca), free(cb), free(a), free(b), free(g);
}

/* The scale of the per-tensor grid at (layer l, point), or at alt where the scheme has no quantizer at
 * point: the grid an integer attention product reads its input's codes on (layers/bert.c grid_of). */
static float grid_scale(BqQuantState *qs, int l, int point, int alt) {
    const BqQuantizer *q = bq_quant_at(qs, l, point);
    if (!q) q = bq_quant_at(qs, l, alt);
    BQ_CHECK(q && q->nch == 1);
    return q->scale[0];
}

/* Codes c = x/s of n values on the grid s; 0 when a value is not c·s exactly (then no integer product
 * could have read it). */
static int grid_codes(const float *x, int64_t n, float s, int32_t *c) {
    for (int64_t i = 0; i < n; i++) {
        float q = rintf(x[i] / s), back = q * s;
        if (memcmp(&back, &x[i], sizeof back) != 0) return 0;
        c[i] = (int32_t)q;
    }
    return 1;
}

/* Of the attention products recorded on tape (a forward of the model with quantizers qs, every
 * activation quantizer writing a new tensor: qs->plain_fakequant), counts in *products those that must
 * run on integer codes (Q·Kᵀ, and P·V unless dropout sits inside it: ort in training) and in *exact those
 * whose output is fl(Σ ca·cb · fl(sa·sb)) bit for bit, the integer kernels' result. The l-th product of
 * each kind is layer l's. The softmax overwrites a Q·Kᵀ output that nothing else reads (qdqbert): that
 * one is compared through the softmax, recomputed by the same kernel from the integer result. */
static void integer_products(const BqTape *tape, BqQuantState *qs, int *products, int *exact) {
    int ls = 0, lc = 0;
    *products = *exact = 0;
    for (int64_t k = 0; k < tape->n; k++) {
        const BqNode *nd = &tape->nodes[k];
        const int scores = nd->op == BQ_OP_ATTN_SCORES;
        if (!scores && (nd->op != BQ_OP_ATTN_CONTEXT || nd->saved)) continue;
        const int64_t Bn = nd->iparam[0], Tn = nd->iparam[1], NHn = nd->iparam[2], d = nd->iparam[3], Hn = NHn * d;
        const int l = scores ? ls++ : lc++;
        const float sa = scores ? grid_scale(qs, l, BQ_QP_MM1_Q, BQ_QP_Q_OUT)
                                : grid_scale(qs, l, BQ_QP_MM2_P, BQ_QP_PROBS);
        const float sb = scores ? grid_scale(qs, l, BQ_QP_MM1_K, BQ_QP_K_OUT)
                                : grid_scale(qs, l, BQ_QP_MM2_V, BQ_QP_V_OUT);
        const float f = sa * sb;
        const int64_t na = bq_tensor_numel(nd->in[0]), nb = bq_tensor_numel(nd->in[1]);
        const int64_t ny = bq_tensor_numel(nd->out);
        int32_t *ca = malloc(sizeof(int32_t) * (size_t)na), *cb = malloc(sizeof(int32_t) * (size_t)nb);
        float *want = malloc(sizeof(float) * (size_t)ny);
        (*products)++;
        int ok = grid_codes(nd->in[0]->data, na, sa, ca) && grid_codes(nd->in[1]->data, nb, sb, cb);
        for (int64_t b = 0; ok && b < Bn; b++)
            for (int64_t h = 0; h < NHn; h++)
                for (int64_t i = 0; i < Tn; i++)
                    for (int64_t j = 0; j < (scores ? Tn : d); j++) {
                        int64_t sum = 0;
                        if (scores)
                            for (int64_t e = 0; e < d; e++)
                                sum += (int64_t)ca[(b * Tn + i) * Hn + h * d + e] * cb[(b * Tn + j) * Hn + h * d + e];
                        else
                            for (int64_t t = 0; t < Tn; t++)
                                sum += (int64_t)ca[((b * NHn + h) * Tn + i) * Tn + t] *
                                       cb[(b * Tn + t) * Hn + h * d + j];
                        const int64_t at = scores ? ((b * NHn + h) * Tn + i) * Tn + j : (b * Tn + i) * Hn + h * d + j;
                        want[at] = (float)sum * f;
                    }
        for (int64_t k2 = k + 1; ok && scores && k2 < tape->n; k2++) {
            const BqNode *sm = &tape->nodes[k2];
            if (sm->op == BQ_OP_SOFTMAX_MASK && sm->in[0] == nd->out && sm->iparam[2]) {
                bq_kernel_softmax_mask_forward(want, want, sm->fparam, sm->fval[0], sm->fval[1], Bn, NHn, Tn, Tn);
                break;
            }
        }
        *exact += ok && memcmp(want, nd->out->data, sizeof(float) * (size_t)ny) == 0;
        free(ca), free(cb), free(want);
    }
}

typedef struct Step {
    float loss, logits[6];
    int64_t np;
    int products, exact; /* integer_products of a recorded forward after the step */
} Step;

/* One QAT step (bq_train_step) of a small model; fp32_products = 1 runs the attention products (and the
 * Linears) in fp32 on the fake-quantized values. Copies the gradients to grad and the parameter table's
 * entries to params (when not NULL); then one recorded forward of the same batch counts the integer
 * attention products. */
static void qat_step(const char *scheme, int fp32_products, int training, float *grad, BqParam *params,
                     int *nparams, Step *out) {
    BqBertConfig cfg = bq_test_config(50, MH, ML, MHEADS, MI, 16, 2, 0.1f, 0.2f);
    BqRng rng;
    bq_rng_seed(&rng, 3);
    BqBert m;
    BQ_CHECK(bq_bert_create(&m, &cfg, 1, &rng) == BQ_OK);
    BqQuantConfig qc;
    bq_quant_config_default(&qc);
    BQ_CHECK(bq_scheme_parse(&qc.scheme, scheme, "scheme") == BQ_OK);
    BQ_CHECK(bq_quant_create(&m.quant, &m, &qc) == BQ_OK);
    m.quant->observe = 1;
    m.quant->fp32_linear = fp32_products;
    int32_t ids[SB * ST], types[SB * ST] = {0}, labels[SB] = {0, 1, 1};
    float mask[SB * ST];
    for (int i = 0; i < SB * ST; i++) {
        ids[i] = 1 + (int32_t)bq_rng_below(&rng, 49);
        mask[i] = (i % ST) < ST - (i / ST) ? 1.0f : 0.0f;
    }
    BqBatch bt = {.B = SB, .T = ST, .input_ids = ids, .attention_mask = mask, .token_type_ids = types, .labels = labels};
    BqArena act;
    BqTape tape;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 26, "act") == BQ_OK);
    BQ_CHECK(bq_tape_init(&tape, 64) == BQ_OK);
    BqTrainState ts = {0};
    memset(m.params.grad, 0, sizeof(float) * (size_t)m.params.total);
    BqCtx ctx = {.act = &act, .tape = &tape, .training = training, .rng_key = 99};
    BQ_CHECK(bq_train_step(&m, &ctx, &bt, &ts, &out->loss, out->logits) == BQ_OK);
    out->np = m.params.total;
    memcpy(grad, m.params.grad, sizeof(float) * (size_t)m.params.total);
    if (params) {
        memcpy(params, m.params.p, sizeof(BqParam) * (size_t)m.params.n);
        *nparams = m.params.n;
    }
    /* the recorded forward keeps every product's output: no quantizer overwrites one in place */
    m.quant->plain_fakequant = 1;
    bq_tape_rewind(&tape);
    BqCtx fctx = {.act = &act, .tape = &tape, .training = training, .rng_key = 99};
    BqBertInput in = bq_batch_input(&bt);
    BqTensor *lg = NULL;
    BQ_CHECK(bq_bert_forward(&m, &fctx, &in, &lg, NULL) == BQ_OK);
    integer_products(&tape, m.quant, &out->products, &out->exact);
    bq_arena_free(&act);
    bq_tape_free(&tape);
    bq_quant_free(m.quant);
    m.quant = NULL;
    bq_bert_free(&m);
}

/* Largest |x| of n values. */
static double max_abs(const float *x, int64_t n) {
    double r = 0.0;
    for (int64_t i = 0; i < n; i++) r = fmax(r, fabs((double)x[i]));
    return r;
}

int main(void) {
    check_product(0, 0);
    check_product(1, 0);
    check_product(0, 1);
    check_product(1, 1);
    /* The model with and without the integer products. The two forwards differ only in the rounding of
     * the products that qs->fp32_linear switches: per layer the Linears query, key, value,
     * attention.output.dense, intermediate.dense (K = H terms per sum) and output.dense (K = I), Q·Kᵀ
     * (K = d) and P·V (K = T). An integer product is the exact sum rounded once; an fp32 one is within
     * (K − 1)·u of the exact sum, relative to the sum of its terms' magnitudes (u = 2^-24), so the two
     * differ by at most K·u of it. These sums do not cancel (their terms' magnitudes add up to a small
     * multiple of the result) and the ops in between (LayerNorm, softmax, GELU, tanh, the quantizers'
     * straight-through masks) pass a relative change on at a gain of about 1, so, to first order, every
     * value of the forward moves by at most R = u·L·(5H + I + d + T) relative to its tensor's scale
     * (2.1e-5 here). On this fixed batch no fake-quant input lies within that of a rounding boundary, so
     * both runs read the same codes (a flipped code would move a value by a whole step, far beyond R).
     * The backward is the same code in the same order, so each parameter's gradient moves by at most R
     * times the magnitude of the per-token terms it sums: R·max|g| over the tensor; a bias also sums
     * the terms its weight's gradient sums, times inputs of about unit size (LayerNorm outputs), which
     * covers a bias whose terms cancel (the key bias: the softmax ignores a shift common to a row of
     * scores, so only the quantizers make that gradient nonzero) — R·(max|g| + max|g of the weight|).
     * Logits move by at most R·max|logit|, and the mean cross entropy, whose gradient in the logits
     * has an L1 norm of at most 2 per example, by 2·R·max|logit| plus R·|loss| for its own rounding.
     * Training mode (dropout on: ort keeps P·V in fp32 there) and evaluation mode (every product
     * integer). */
    const char *schemes[2] = {"ort", "qdqbert"};
    const double R = 0x1p-24 * ML * (5 * MH + MI + MH / MHEADS + ST);
    static float g0[20000], g1[20000];
    BqParam params[64];
    int nparams = 0;
    for (int s = 0; s < 2; s++)
        for (int training = 0; training <= 1; training++) {
            Step st0, st1;
            qat_step(schemes[s], 0, training, g0, params, &nparams, &st0);
            qat_step(schemes[s], 1, training, g1, NULL, NULL, &st1);
            BQ_CHECK(st0.np == st1.np && st0.np <= 20000 && nparams <= 64);
            const double ml = max_abs(st1.logits, 6);
            double dlog = 0;
            for (int i = 0; i < 6; i++) dlog = fmax(dlog, fabs((double)st0.logits[i] - st1.logits[i]));
            const double dl = fabs((double)st0.loss - st1.loss), loss_bound = 2 * R * ml + R * fabs((double)st1.loss);
            /* every parameter tensor against its own bound */
            double worst = 0, worst_dg = 0;
            const char *worst_name = "";
            int bad = 0;
            for (int p = 0; p < nparams; p++) {
                const BqParam *pp = &params[p];
                double dg = 0;
                for (int64_t i = pp->offset; i < pp->offset + pp->numel; i++)
                    dg = fmax(dg, fabs((double)g0[i] - g1[i]));
                double scale = max_abs(g1 + pp->offset, pp->numel);
                size_t len = strlen(pp->name);
                if (len > 5 && !strcmp(pp->name + len - 5, ".bias")) {
                    char wname[BQ_NAME_MAX + 8];
                    snprintf(wname, sizeof wname, "%.*sweight", (int)(len - 4), pp->name);
                    for (int q = 0; q < nparams; q++)
                        if (!strcmp(params[q].name, wname)) scale += max_abs(g1 + params[q].offset, params[q].numel);
                }
                const double bound = R * scale;
                const double ratio = dg == 0 ? 0 : bound > 0 ? dg / bound : INFINITY;
                if (ratio > worst) worst = ratio, worst_dg = dg, worst_name = pp->name;
                if (!(dg <= bound)) {
                    if (bad++ < 4)
                        printf("  %s %s: %s max |Δgrad| %.3g > bound %.3g\n", schemes[s],
                               training ? "training" : "evaluation", pp->name, dg, bound);
                }
            }
            printf("%-8s %-10s step, integer vs fp32 products: loss %.7f vs %.7f, max |Δlogit| %.3g (bound %.3g); "
                   "max |Δgrad|/bound %.3f (%s, %.3g); integer products %d of %d (fp32 run: %d)\n",
                   schemes[s], training ? "training" : "evaluation", st0.loss, st1.loss, dlog, R * ml, worst,
                   worst_name, worst_dg, st0.exact, st0.products, st1.exact);
            EXPECT(dl <= loss_bound, " %s: |Δloss| %.3g > %.3g", schemes[s], dl, loss_bound);
            EXPECT(dlog <= R * ml, " %s: max |Δlogit| %.3g > %.3g", schemes[s], dlog, R * ml);
            EXPECT(bad == 0, " %s: %d gradient tensors beyond their bound", schemes[s], bad);
            /* Q·Kᵀ of every layer, and P·V except where dropout sits inside it (ort in training) */
            const int want_products = ML * (s == 0 && training ? 1 : 2);
            EXPECT(st0.products == want_products && st0.exact == want_products,
                   " %s: %d of %d attention products ran on integer codes (%d expected)", schemes[s], st0.exact,
                   st0.products, want_products);
            EXPECT(st1.products == want_products && st1.exact == 0,
                   " %s: %d of the fp32 run's %d products equal the integer result: the check cannot tell them "
                   "apart", schemes[s], st1.exact, st1.products);
        }
    printf("test_qat_int_attention: %s\n", fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
