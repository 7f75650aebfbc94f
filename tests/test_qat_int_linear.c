/* The integer forward of quantized Linears in fake quant and QAT (bq_op_linear_qgemm, bq_quant_linear of
 * layers/quant.h):
 *  - exactness: at 7 and 8 bits (8 bits runs as sgemm on float codes in blocks of 1024 inputs on a CPU
 *    without VNNI or AMX), per channel and per tensor, and at 8 bits with K = 2100 inputs (three blocks;
 *    the saturated row's sum is odd and above 2^24 after one block and after two, so a single block, or
 *    blocks added in fp32, give other outputs: both tried), the
 *    int32 sums equal a 64-bit reference Σ qx·qw and the output equals
 *    fl(fl((float)acc·fl(sx·sw[n])) + b[n]) bit for bit, with rows of codes at saturation (activation
 *    codes 127 and -128 against weight codes qmin and qmax, where int16 pair sums would overflow) and
 *    weights with exact ties (the codes equal bq_kernel_fakequant_forward's rounding);
 *  - bq_qgemm_weights_set reports a change only when codes or scales change;
 *  - gradients: a recorded bq_op_linear_qgemm and bq_op_linear on the same grid inputs give bit-identical
 *    dx, dW and db (one tape node kind, one backward);
 *  - the tiny model (tests/fixtures/bert_tiny, cpu scheme, max-calibrated): every encoder Linear runs on
 *    integers, and the fake-quant logits against the integer engine (layers/bert_int8.h). Op by op
 *    (engine fusion off) both compute the same Linears bit for bit; what differs is the pooler and
 *    classifier summation order (the engine's fixed-order row_linear vs sgemm), so the bound is
 *    ε = 4·(H+1)·2^-24·max|logit|, far below one quantization step (max|logit|/127). With fusion on, the
 *    engine's fused kernels (FMA) differ in the last bits and may move a rare value across a rounding
 *    boundary: bound max|logit|/127 as tests/test_int8_forward.c derives. The fp32-Linear fake quant
 *    (qs->fp32_linear) is printed beside it for comparison;
 *  - the qdqbert scheme (8-bit weights, split here without VNNI) against its fp32-Linear fake quant, to
 *    the bound of tests/test_int8_forward.c;
 *  - the ort scheme, whose Linears have no input quantizer of their own: every encoder Linear runs on the
 *    codes of the grid its input already lies on (the output quantizer before it), against the same
 *    bound. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/kernels.h"
#include "autograd/qgemm.h"
#include "export/hf_load.h"
#include "layers/bert_int8.h"
#include "layers/quant.h"
#include "tests/gradcheck.h"
#include "tests/test_util.h"


/* ---- one Linear ---- */

enum { M = 37, KMAX = 2100, N = 24 };
static int K = 200; /* inputs of the Linear under test, at most KMAX */

static float xh[M * KMAX], wraw[N * KMAX], wh[N * KMAX], bias[N], sw[N];
static int qx[M * KMAX], qw[N * KMAX];

/* Codes at saturation in rows 0..3 of x and rows 0..3 of w (row 0 of w one below qmax at k = 1 and
 * k = 2050, so that x row 0 · w row 0 is odd after one block of 1024 inputs and after two, above 2^24 not a
 * float, and at K = 2100 adding the blocks in fp32 ends on another float than the exact sum's), random
 * elsewhere; x̂ = fl(qx·sx);
 * w raw with exact ties on half of its elements of rows >= 4, ŵ its fake quantization. */
static void make_linear(BqRng *r, int bits, int per_channel, float sx) {
    const int qmin = -(1 << (bits - 1)), qmax = (1 << (bits - 1)) - 1;
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) {
            int q = m == 0 ? 127 : m == 1 ? -128 : m == 2 ? (k % 2 ? 127 : -128) : (int)bq_rng_below(r, 256) - 128;
            qx[m * K + k] = q;
            xh[m * K + k] = (float)q * sx;
        }
    for (int n = 0; n < N; n++) sw[n] = per_channel ? 0.001f + 0.01f * (float)bq_rng_uniform(r) : 0.0047f;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            float v;
            if (n < 4)
                v = (float)(n == 0 ? qmax - (k == 1 || k == 2050) : n == 1 ? qmin : n == 2 ? (k % 2 ? qmin : qmax) : qmax + 9);
            else if (k % 2) v = (float)((int)bq_rng_below(r, (uint64_t)(qmax - qmin)) + qmin) + 0.5f; /* a tie */
            else v = (float)(qmax - qmin + 6) * ((float)bq_rng_uniform(r) - 0.5f);
            wraw[n * K + k] = v * sw[n];
        }
    bq_kernel_fakequant_forward(wh, wraw, sw, 1, N, K, qmin, qmax);
    for (int i = 0; i < N * K; i++) qw[i] = (int)lrintf(wh[i] / sw[i / K]);
    for (int n = 0; n < N; n++) bias[n] = (float)bq_rng_uniform(r) - 0.5f;
}

static void check_linear(int bits, int per_channel, int k) {
    K = k;
    BqRng r;
    bq_rng_seed(&r, (uint64_t)(17 * bits + per_channel));
    const float sx = 0.0123f;
    make_linear(&r, bits, per_channel, sx);
    BqQGemmWeights *pw = NULL;
    BQ_CHECK(bq_qgemm_weights_create_empty(&pw, N, K, bits, "test") == BQ_OK);
    const int64_t nscale = per_channel ? N : 1;
    /* codes from the raw weights (ties included) and from the fake-quantized ones are the same */
    EXPECT(bq_qgemm_weights_set(pw, wraw, sw, nscale) == 1, "first set reports no change");
    EXPECT(bq_qgemm_weights_set(pw, wh, sw, nscale) == 0, "%d bits: codes of ŵ differ from those of w", bits);
    EXPECT(bq_qgemm_weights_set(pw, wh, sw, nscale) == 0, "same weights reported as changed");

    /* the int32 sums against a 64-bit reference */
    uint8_t *xu = malloc(M * K);
    int32_t *acc = malloc(sizeof(int32_t) * M * N);
    bq_qgemm_quantize_u8(xu, xh, M * K, sx);
    BQ_CHECK(bq_qgemm_s32(pw, xu, M, acc) == BQ_OK);
    int64_t bad_acc = 0, bad_y = 0;
    int32_t ref[M * N];
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            int64_t s = 0;
            for (int k = 0; k < K; k++) s += (int64_t)qx[m * K + k] * qw[n * K + k];
            ref[m * N + n] = (int32_t)s;
            bad_acc += s != acc[m * N + n];
        }

    /* the op: y = fl(fl((float)acc·fl(sx·sw[n])) + b[n]) bit for bit */
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 24, "t") == BQ_OK);
    BqCtx ctx = {.act = &act};
    int64_t xs[2] = {M, K}, ws[2] = {N, K}, bs[1] = {N};
    BqTensor X = bq_tensor_wrap(xh, NULL, 2, xs), W = bq_tensor_wrap(wh, NULL, 2, ws), Bt = bq_tensor_wrap(bias, NULL, 1, bs);
    BqTensor *y = bq_op_linear_qgemm(&ctx, &X, sx, &W, pw, &Bt);
    BqTensor *yf = bq_op_linear(&ctx, &X, &W, &Bt);
    double maxd_fp32 = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float s = sx * sw[per_channel ? n : 0];
            float want = (float)ref[m * N + n] * s + bias[n];
            bad_y += memcmp(&want, &y->data[m * N + n], sizeof(float)) != 0;
            maxd_fp32 = fmax(maxd_fp32, fabs((double)yf->data[m * N + n] - want));
        }
    printf("linear %d bits, K %d, %s%s: %lld of %d int32 sums and %lld outputs differ from the reference "
           "(max error 0); fp32 sgemm on the same values: max error %.3g\n",
           bits, K, per_channel ? "per channel" : "per tensor", bq_qgemm_weights_split(pw) ? ", split" : "",
           (long long)bad_acc, M * N, (long long)bad_y, maxd_fp32);
    EXPECT(bad_acc == 0 && bad_y == 0, "%d bits: integer Linear not exact", bits);
    EXPECT(bq_qgemm_weights_split(pw) == (bits == 8 && !bq_qgemm_exact_8bit()), "split where it must not be");

    /* a changed weight is packed again */
    wh[5 * K + 3] = (float)(qw[5 * K + 3] == 0 ? 1 : 0) * sw[per_channel ? 5 : 0];
    EXPECT(bq_qgemm_weights_set(pw, wh, sw, nscale) == 1, "a changed code is not reported");
    qw[5 * K + 3] = qw[5 * K + 3] == 0 ? 1 : 0;
    BQ_CHECK(bq_qgemm_s32(pw, xu, M, acc) == BQ_OK);
    int64_t bad2 = 0;
    for (int m = 0; m < M; m++) {
        int64_t s = 0;
        for (int k = 0; k < K; k++) s += (int64_t)qx[m * K + k] * qw[5 * K + k];
        bad2 += s != acc[m * N + 5];
    }
    EXPECT(bad2 == 0, "%d bits: %lld sums stale after a weight change", bits, (long long)bad2);
    if (bq_qgemm_weights_split(pw)) {
        /* frozen split weights (the integer engine's, on a CPU without VNNI): the float copy only, 4 bytes
         * per weight, and the same sums */
        const int64_t before = bq_qgemm_weights_bytes(pw);
        bq_qgemm_weights_freeze(pw);
        const int64_t after = bq_qgemm_weights_bytes(pw);
        BQ_CHECK(bq_qgemm_s32(pw, xu, M, acc) == BQ_OK);
        int64_t bad3 = 0;
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                int64_t s = 0;
                for (int k = 0; k < K; k++) s += (int64_t)qx[m * K + k] * qw[n * K + k];
                bad3 += s != acc[m * N + n];
            }
        printf("linear %d bits, K %d, frozen split weights: %lld bytes (%lld before), %lld sums differ\n", bits, K,
               (long long)after, (long long)before, (long long)bad3);
        EXPECT(bad3 == 0 && before - after == (int64_t)N * K && after < (int64_t)N * K * 4 + 4096,
               "frozen split weights: %lld sums differ, %lld bytes (%lld before)", (long long)bad3,
               (long long)after, (long long)before);
    }
    bq_arena_free(&act);
    free(xu);
    free(acc);
    bq_qgemm_weights_free(pw);
}

/* ---- gradients ---- */

static float gx[M * KMAX], gw[N * KMAX], gb[N], R[M * N];

static void run_pass(int integer, BqQGemmWeights *pw, float sx, float *dx, float *dw, float *db, float *y) {
    memset(dx, 0, sizeof gx), memset(dw, 0, sizeof gw), memset(db, 0, sizeof gb);
    BqGcPass p;
    bq_gc_pass_begin(&p, 2, (size_t)1 << 24, 1, 1, 0);
    int64_t xs[3] = {1, M, K}, ws[2] = {N, K}, bs[1] = {N};
    BqTensor *T3 = bq_arena_alloc(p.ctx.act, 3 * sizeof(BqTensor));
    T3[0] = bq_tensor_wrap(xh, dx, 3, xs);
    T3[1] = bq_tensor_wrap(wh, dw, 2, ws);
    T3[2] = bq_tensor_wrap(bias, db, 1, bs);
    BqTensor *out = integer ? bq_op_linear_qgemm(&p.ctx, &T3[0], sx, &T3[1], pw, &T3[2])
                            : bq_op_linear(&p.ctx, &T3[0], &T3[1], &T3[2]);
    bq_gc_pass_end(&p, out, R, y);
}

static void check_gradients(void) {
    K = 200;
    BqRng r;
    bq_rng_seed(&r, 5);
    const float sx = 0.02f;
    make_linear(&r, 7, 1, sx);
    bq_gc_fill_uniform(R, M * N, 9, -1, 1);
    BqQGemmWeights *pw = NULL;
    BQ_CHECK(bq_qgemm_weights_create_empty(&pw, N, K, 7, "test") == BQ_OK);
    bq_qgemm_weights_set(pw, wh, sw, N);
    static float dx1[M * KMAX], dw1[N * KMAX], db1[N], y1[M * N], dx2[M * KMAX], dw2[N * KMAX], db2[N], y2[M * N];
    run_pass(1, pw, sx, dx1, dw1, db1, y1);
    run_pass(0, pw, sx, dx2, dw2, db2, y2);
    int64_t nd = bq_gc_ndiff(dx1, dx2, M * K) + bq_gc_ndiff(dw1, dw2, N * K) + bq_gc_ndiff(db1, db2, N);
    double maxy = 0;
    for (int i = 0; i < M * N; i++) maxy = fmax(maxy, fabs((double)y1[i] - y2[i]));
    printf("gradients, integer vs fp32 forward on the same grid inputs: %lld of %d differ (max error 0); "
           "outputs differ by at most %.3g (fp32 summation)\n",
           (long long)nd, M * K + N * K + N, maxy);
    EXPECT(nd == 0, "gradients of the integer Linear differ from bq_op_linear's");
    bq_qgemm_weights_free(pw);
}

/* ---- the tiny model ---- */

enum { BB = 4, TT = 12, NCAL = 6 };

typedef struct Batch {
    int32_t ids[BB * TT], types[BB * TT];
    float mask[BB * TT];
} Batch;

static void make_batch(Batch *bt, BqRng *rng, int vocab) {
    bq_test_padded_batch(bt->ids, bt->types, bt->mask, BB, TT, rng, vocab, 3);
}

static BqBertInput input_of(Batch *bt) {
    BqBertInput in = {.B = BB, .T = TT, .input_ids = bt->ids, .attention_mask = bt->mask,
                      .token_type_ids = bt->types};
    return in;
}

static void load_model(BqBert *m, const char *scheme) {
    BqRng rng;
    bq_rng_seed(&rng, 3);
    char *report = NULL;
    BQ_CHECK(bq_hf_load(m, "tests/fixtures/bert_tiny", 0, &rng, &report) == BQ_OK);
    free(report);
    bq_test_calibrate(m, scheme, &rng, NCAL, BB, TT, m->cfg.vocab_size);
}

enum { HMAX = 64 };

/* Logits (BB·C) of the fake-quant forward (fp32 Linears when fp32_linear) or of engine e, and the last
 * encoder layer's output (BB·TT·H) into hid. */
static void logits_of(BqBert *m, BqInt8Engine *e, int fp32_linear, Batch *bt, float *out, float *hid) {
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 26, "act") == BQ_OK);
    BqCtx ctx = {.act = &act};
    BqBertInput in = input_of(bt);
    BqTensor *hs[16], *lg;
    BQ_CHECK(m->cfg.num_hidden_layers <= 16 && m->cfg.hidden_size <= HMAX);
    in.hidden = hs;
    in.all_rows = 1; /* the whole last layer, not only its [CLS] rows */
    m->quant->fp32_linear = fp32_linear;
    if (e) BQ_CHECK(bq_int8_forward(e, m, &ctx, &in, &lg) == BQ_OK);
    else BQ_CHECK(bq_bert_forward(m, &ctx, &in, &lg, NULL) == BQ_OK);
    m->quant->fp32_linear = 0;
    memcpy(out, lg->data, sizeof(float) * (size_t)(BB * m->cfg.num_labels));
    memcpy(hid, hs[m->cfg.num_hidden_layers - 1]->data, sizeof(float) * (size_t)(BB * TT * m->cfg.hidden_size));
    bq_arena_free(&act);
}

static double maxdiff(const float *a, const float *b, int n) {
    double d = 0;
    for (int i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

static void check_model_cpu(void) {
    BqBert m;
    load_model(&m, "cpu");
    BqInt8Engine *e = NULL;
    BQ_CHECK(bq_int8_prepare(&e, &m) == BQ_OK);
    const int C = m.cfg.num_labels, L = m.cfg.num_hidden_layers, H = m.cfg.hidden_size, n = BB * C;
    BqRng rng;
    bq_rng_seed(&rng, 99);
    double d_unf = 0, d_fus = 0, d_old_unf = 0, d_old_fus = 0, maxl = 0;
    int64_t hid_unf = 0, hid_fus = 0, hid_old = 0, nhid = 0;
    for (int it = 0; it < 4; it++) {
        Batch bt;
        make_batch(&bt, &rng, m.cfg.vocab_size);
        float fq[BB * 8], fq32[BB * 8], unf[BB * 8], fus[BB * 8];
        static float h_fq[BB * TT * HMAX], h_fq32[BB * TT * HMAX], h_unf[BB * TT * HMAX], h_fus[BB * TT * HMAX];
        BQ_CHECK(C <= 8);
        logits_of(&m, NULL, 0, &bt, fq, h_fq);
        logits_of(&m, NULL, 1, &bt, fq32, h_fq32);
        bq_int8_set_layer_fusion(e, 0);
        logits_of(&m, e, 0, &bt, unf, h_unf);
        bq_int8_set_layer_fusion(e, 1);
        logits_of(&m, e, 0, &bt, fus, h_fus);
        hid_unf += bq_gc_ndiff(h_fq, h_unf, BB * TT * H);
        hid_fus += bq_gc_ndiff(h_fq, h_fus, BB * TT * H);
        hid_old += bq_gc_ndiff(h_fq32, h_unf, BB * TT * H);
        nhid += BB * TT * H;
        for (int i = 0; i < n; i++) maxl = fmax(maxl, fabs(fq[i]));
        d_unf = fmax(d_unf, maxdiff(fq, unf, n));
        d_fus = fmax(d_fus, maxdiff(fq, fus, n));
        d_old_unf = fmax(d_old_unf, maxdiff(fq32, unf, n));
        d_old_fus = fmax(d_old_fus, maxdiff(fq32, fus, n));
    }
    int nint = 0;
    static const int wpts[6] = {BQ_QP_W_Q, BQ_QP_W_K, BQ_QP_W_V, BQ_QP_W_AO, BQ_QP_W_I, BQ_QP_W_O};
    for (int l = 0; l < L; l++)
        for (int j = 0; j < 6; j++) nint += bq_quant_at(m.quant, l, wpts[j])->qgemm != NULL;
    const double eps = 4.0 * (H + 1) * ldexp(1.0, -24) * maxl, step = maxl / 127.0;
    printf("cpu scheme: %d of %d encoder Linears on integers in fake quant\n", nint, 6 * L);
    printf("cpu scheme, max |fake quant - int8 engine| logit (max |logit| %.3g):\n"
           "  integer Linears: %.3g op by op (bound %.3g), %.3g fused (bound %.3g)\n"
           "  fp32 Linears:    %.3g op by op, %.3g fused\n",
           maxl, d_unf, eps, d_fus, step, d_old_unf, d_old_fus);
    printf("  last encoder layer outputs that differ bit for bit from the integer engine's, of %lld: %lld op by op, "
           "%lld fused; %lld op by op with fp32 Linears\n",
           (long long)nhid, (long long)hid_unf, (long long)hid_fus, (long long)hid_old);
    EXPECT(hid_unf == 0, "the encoder output of fake quant and the op-by-op integer engine differ in %lld values",
           (long long)hid_unf);
    EXPECT(nint == 6 * L, "%d of %d Linears on integers", nint, 6 * L);
    EXPECT(maxl > 0, "logits all zero");
    EXPECT(d_unf <= eps, "fake quant differs from the op-by-op integer engine by %.3g > %.3g", d_unf, eps);
    EXPECT(d_fus <= step, "fake quant differs from the fused integer engine by %.3g > %.3g", d_fus, step);
    bq_int8_free(e);
    bq_quant_free(m.quant);
    m.quant = NULL;
    bq_bert_free(&m);
}

/* A scheme with 8-bit weights (qdqbert: each Linear's own input quantizer; ort: the grid of the output
 * quantizer before it) against its fp32-Linear fake quant. */
static void check_model_8bit(const char *scheme) {
    BqBert m;
    load_model(&m, scheme);
    const int C = m.cfg.num_labels, n = BB * C;
    BqRng rng;
    bq_rng_seed(&rng, 98);
    double d = 0, maxl = 0;
    for (int it = 0; it < 3; it++) {
        Batch bt;
        make_batch(&bt, &rng, m.cfg.vocab_size);
        float fq[BB * 8], fq32[BB * 8];
        static float h1[BB * TT * HMAX], h2[BB * TT * HMAX];
        logits_of(&m, NULL, 0, &bt, fq, h1);
        logits_of(&m, NULL, 1, &bt, fq32, h2);
        for (int i = 0; i < n; i++) maxl = fmax(maxl, fabs(fq32[i]));
        d = fmax(d, maxdiff(fq, fq32, n));
    }
    const BqQuantizer *wq = bq_quant_at(m.quant, 0, BQ_QP_W_Q);
    const double bound = 1e-4 * maxl + maxl / 127.0;
    int nint = 0;
    static const int wpts[6] = {BQ_QP_W_Q, BQ_QP_W_K, BQ_QP_W_V, BQ_QP_W_AO, BQ_QP_W_I, BQ_QP_W_O};
    for (int l = 0; l < m.cfg.num_hidden_layers; l++)
        for (int j = 0; j < 6; j++) nint += bq_quant_at(m.quant, l, wpts[j])->qgemm != NULL;
    printf("%s (8-bit weights%s): %d of %d encoder Linears on integers; max |integer - fp32 Linears| logit %.3g "
           "(bound %.3g, max |logit| %.3g)\n",
           scheme, wq->qgemm && bq_qgemm_weights_split(wq->qgemm) ? ", sgemm on float codes" : "", nint,
           6 * m.cfg.num_hidden_layers, d, bound, maxl);
    EXPECT(nint == 6 * m.cfg.num_hidden_layers, "%s: %d of %d Linears on integers", scheme, nint,
           6 * m.cfg.num_hidden_layers);
    EXPECT(d <= bound, "%s: integer and fp32 Linears differ by %.3g > %.3g", scheme, d, bound);
    EXPECT(maxl > 0, "%s: logits all zero", scheme);
    bq_quant_free(m.quant);
    m.quant = NULL;
    bq_bert_free(&m);
}

int main(void) {
    bq_runtime_set_threads(2);
    printf("%s\n", bq_dnnl_describe());
    check_linear(7, 1, 200);
    check_linear(7, 0, 200);
    check_linear(8, 1, 200);
    check_linear(8, 0, 200);
    check_linear(8, 1, KMAX);
    check_gradients();
    check_model_cpu();
    check_model_8bit("qdqbert");
    check_model_8bit("ort");
    bq_qgemm_cache_clear();
    if (fails) printf("%d check(s) FAILED\n", fails);
    else printf("all integer QAT Linear checks passed\n");
    return fails ? 1 : 0;
}
