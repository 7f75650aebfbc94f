/* A whole bf16 training step against the fp32 step (src/train.c bq_train_step; autograd/gemm.h).
 *
 * A small random BERT (2 layers, hidden 32, 4 heads, intermediate 48, 3 labels, dropout on, a padded
 * batch), fp32 master weights, runs one forward+backward in fp32 and one in bf16 from the same state and
 * dropout keys; then the same for the `cpu` QAT scheme (its integer Linears and attention products keep
 * their exact forward; the backward GEMMs and the products off integer grids run in bf16).
 *
 * Bound: a bf16 GEMM perturbs each product by at most 2·u_b relative (each operand rounded once,
 * u_b = 2^-9, the unit roundoff of bf16's 8-bit significand), i.e. by at most 2·u_b·Σ|a·b| per output.
 * A gradient of the step passes through at most D GEMMs (forward and backward: per layer the query/key/
 * value Linear, the two attention products, the attention output, intermediate and output Linears, then
 * the pooler and the classifier, D = 2·(6·L + 2)). The bf16 step of the float model also stores the
 * attention probabilities and the GELU input as bf16 words (autograd/tensor.h, "bf16 storage"), which
 * the softmax backward, the probabilities' dropout and the GELU forward and backward read: 4 more
 * roundings of u_b per layer on a path, forward and backward. First-order propagation gives a normwise
 * relative error of at most (2·D + 8·L)·u_b per tensor, the bound checked here for the loss, the logits
 * and every parameter gradient with a norm above 1e-6 of the largest. The bf16 step must also differ from the fp32
 * step (the GEMMs really ran in bf16): its largest relative difference must exceed 64 fp32 roundoffs.
 * Where the CPU has bf16 units the oneDNN path is run as well and must agree with the emulated one
 * within the same bound. Prints the path, the bound and the worst ratio. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/gemm.h"
#include "autograd/tensor.h"
#include "layers/bert.h"
#include "layers/quant.h"
#include "src/train.h"
#include "tests/test_util.h"

enum { B = 4, T = 11, NL = 3, LAYERS = 2 };

typedef struct Out {
    float loss;
    float logits[B * NL];
    float *grad;
    int64_t n;
    BqBert m;
} Out;

static void run(const char *scheme, BqPrecision prec, Out *o) {
    BqBertConfig cfg = bq_test_config(60, 32, LAYERS, 4, 48, 16, NL, 0.1f, 0.1f);
    BqRng rng;
    bq_rng_seed(&rng, 3);
    memset(&o->m, 0, sizeof o->m);
    BQ_CHECK(bq_bert_create(&o->m, &cfg, 1, &rng) == BQ_OK);
    BqBert *m = &o->m;
    m->prec = prec;
    if (scheme) {
        BqQuantConfig qc;
        bq_quant_config_default(&qc);
        BQ_CHECK(bq_scheme_parse(&qc.scheme, scheme, "scheme") == BQ_OK);
        BQ_CHECK(bq_quant_create(&m->quant, m, &qc) == BQ_OK);
        m->quant->observe = 0;
    }
    int32_t ids[B * T], types[B * T], labels[B] = {0, 2, 1, 2};
    float mask[B * T];
    BqRng drng;
    bq_rng_seed(&drng, 9);
    bq_test_padded_batch(ids, types, mask, B, T, &drng, 60, 2);
    BqBatch bt = {.B = B, .T = T, .input_ids = ids, .attention_mask = mask, .token_type_ids = types, .labels = labels};
    BqArena act;
    BqTape tape;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 26, "act") == BQ_OK);
    BQ_CHECK(bq_tape_init(&tape, 64) == BQ_OK);
    BqTrainState ts = {0};
    if (scheme) { /* ranges from one fp32 observation of the batch, the same for both precisions */
        BqPrecision keep = m->prec;
        m->prec = BQ_PRECISION_FP32;
        m->quant->observe = 1;
        BqCtx c0 = {.act = &act, .tape = &tape, .training = 1, .rng_key = 77};
        float l0;
        BQ_CHECK(bq_train_step(m, &c0, &bt, &ts, &l0, NULL) == BQ_OK);
        bq_arena_rewind(&act, 0);
        m->quant->observe = 0;
        m->prec = keep;
    }
    memset(m->params.grad, 0, sizeof(float) * (size_t)m->params.total);
    BqCtx ctx = {.act = &act, .tape = &tape, .training = 1, .rng_key = 1234, .prec = m->prec};
    BQ_CHECK(bq_train_step(m, &ctx, &bt, &ts, &o->loss, o->logits) == BQ_OK);
    o->n = m->params.total;
    o->grad = bq_malloc(sizeof(float) * (size_t)o->n);
    memcpy(o->grad, m->params.grad, sizeof(float) * (size_t)o->n);
    bq_arena_free(&act);
    bq_tape_free(&tape);
}

static void out_free(Out *o) {
    if (o->m.quant) bq_quant_free(o->m.quant), o->m.quant = NULL;
    bq_bert_free(&o->m);
    free(o->grad);
}

/* Normwise relative difference of x against the reference r. */
static double rel(const float *x, const float *r, int64_t n) {
    double d = 0, s = 0;
    for (int64_t i = 0; i < n; i++) d += ((double)x[i] - r[i]) * ((double)x[i] - r[i]), s += (double)r[i] * r[i];
    return s > 0 ? sqrt(d / s) : sqrt(d);
}

/* Compares run a against reference r within bound; returns the largest relative difference seen. */
static double compare(const char *what, const Out *a, const Out *r, double bound) {
    double worst = fabs((double)a->loss - r->loss) / fabs((double)r->loss);
    EXPECT(worst <= bound, "%s: loss %.7g vs %.7g, relative %.3g > %.3g", what, a->loss, r->loss, worst, bound);
    double lg = rel(a->logits, r->logits, B * NL);
    EXPECT(lg <= bound, "%s: logits relative %.3g > %.3g", what, lg, bound);
    worst = fmax(worst, lg);
    const BqParamTable *pt = &r->m.params;
    double gmax = 0;
    for (int64_t i = 0; i < r->n; i++) gmax = fmax(gmax, fabs((double)r->grad[i]));
    int over = 0, checked = 0;
    for (int i = 0; i < pt->n; i++) {
        const BqParam *p = &pt->p[i];
        int64_t off = p->offset, n = p->numel;
        double nrm = 0;
        for (int64_t k = 0; k < n; k++) nrm = fmax(nrm, fabs((double)r->grad[off + k]));
        if (nrm <= 1e-6 * gmax) continue;
        checked++;
        double e = rel(a->grad + off, r->grad + off, n);
        worst = fmax(worst, e);
        if (e > bound) {
            if (over < 5) fprintf(stderr, "  %s: %s gradient relative %.3g > %.3g\n", what, p->name, e, bound);
            over++;
        }
    }
    EXPECT(over == 0, "%s: %d of %d gradient tensors beyond the bound", what, over, checked);
    EXPECT(checked >= pt->n / 2, "%s: only %d of %d gradient tensors non-zero", what, checked, pt->n);
    printf("%-34s loss %.6f vs %.6f; %d gradient tensors; worst relative difference %.3g = %.3f of the bound %.3g\n",
           what, a->loss, r->loss, checked, worst, worst / bound, bound);
    return worst;
}

int main(void) {
    const double ub = ldexp(1.0, -9), D = 2.0 * (6.0 * LAYERS + 2.0), bound = (2.0 * D + 8.0 * LAYERS) * ub;
    const BqBf16Path native = bq_gemm_bf16_path();
    printf("%s\n", bq_gemm_bf16_describe());
    const char *schemes[2] = {NULL, "cpu"};
    for (int s = 0; s < 2; s++) {
        const char *name = schemes[s] ? "qat cpu" : "fp32 model";
        Out f, b;
        run(schemes[s], BQ_PRECISION_FP32, &f);
        BQ_CHECK(bq_gemm_bf16_force(BQ_BF16_EMULATED) == BQ_OK);
        run(schemes[s], BQ_PRECISION_BF16, &b);
        char what[96];
        snprintf(what, sizeof what, "%s: bf16 emulated vs fp32", name);
        double w = compare(what, &b, &f, bound);
        EXPECT(w > 64.0 * ldexp(1.0, -24), "%s: bf16 step equals the fp32 step (largest difference %.3g)", name, w);
        if (native == BQ_BF16_ONEDNN) {
            Out h;
            BQ_CHECK(bq_gemm_bf16_force(BQ_BF16_ONEDNN) == BQ_OK);
            run(schemes[s], BQ_PRECISION_BF16, &h);
            snprintf(what, sizeof what, "%s: bf16 oneDNN vs fp32", name);
            compare(what, &h, &f, bound);
            snprintf(what, sizeof what, "%s: bf16 oneDNN vs emulated", name);
            compare(what, &h, &b, bound);
            out_free(&h);
        }
        out_free(&f), out_free(&b);
    }
    BQ_CHECK(bq_gemm_bf16_force(native) == BQ_OK);
    if (native != BQ_BF16_ONEDNN)
        printf("oneDNN bf16 path not exercised: this CPU has neither AVX512-BF16 nor AMX-BF16 (emulated only)\n");
    printf("test_bf16_step: %s\n", fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
