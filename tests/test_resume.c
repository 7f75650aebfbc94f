/* Exact resume (src/train.c + export/ckpt.c): a tiny random BERT (dropout on) trained on synthetic
 * batches for 12 optimizer steps (gradient accumulation 2, warmup, clipping, weight decay, evaluation
 * each epoch with best tracking) is compared with the same run interrupted after step 5 (the
 * SIGINT path: checkpoint + BQ_EINTR) and continued with resume: every step loss and the final
 * parameters must match bit for bit. The same for QAT (schemes ort and cpu) with live moving-average
 * observers and ranges frozen after step 8, interrupted at step 5 and at step 9: losses, parameters
 * and every quantizer's amax, scale, observer state and frozen flag bit-identical; and QAT with learned
 * ranges (--ranges learn: scales trained by AdamW, best copy kept), where the scales and their moments
 * must also match bit for bit and every scale must have moved. Also: a NaN
 * injected into the weights stops training with BQ_ENUMERIC naming the step and leaves the last good
 * checkpoint loadable. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "autograd/gemm.h"
#include "export/ckpt.h"
#include "layers/quant.h"
#include "src/train.h"
#include "tests/test_util.h"

#define NB 5      /* micro-batches per epoch */
#define BS 4
#define TT 9
#define STEPS 12

/* Synthetic data: NB fixed batches; epoch e visits them in an order shuffled by hash(seed, e). The
 * label is a function of the first token so the model can learn something. */
typedef struct Synth {
    BqBatch b[NB];
    int32_t order[NB];
    int64_t pos;
    uint64_t seed;
} Synth;

static void synth_init(Synth *s, uint64_t seed) {
    BqRng r;
    bq_rng_seed(&r, seed);
    s->seed = seed;
    for (int k = 0; k < NB; k++) {
        BqBatch *b = &s->b[k];
        b->B = BS, b->T = TT;
        b->input_ids = bq_calloc(BS * TT, sizeof(int32_t));
        b->token_type_ids = bq_calloc(BS * TT, sizeof(int32_t));
        b->attention_mask = bq_calloc(BS * TT, sizeof(float));
        b->labels = bq_calloc(BS, sizeof(int32_t));
        b->example_index = bq_calloc(BS, sizeof(int64_t));
        for (int i = 0; i < BS; i++) {
            int len = 3 + (int)bq_rng_below(&r, TT - 2);
            for (int t = 0; t < len; t++) {
                b->input_ids[i * TT + t] = 1 + (int32_t)bq_rng_below(&r, 39);
                b->attention_mask[i * TT + t] = 1;
            }
            b->labels[i] = b->input_ids[i * TT + 1] % 3;
            b->example_index[i] = k * BS + i;
        }
    }
}

static void synth_free(Synth *s) {
    for (int k = 0; k < NB; k++) {
        free(s->b[k].input_ids), free(s->b[k].token_type_ids), free(s->b[k].attention_mask);
        free(s->b[k].labels), free(s->b[k].example_index);
    }
}

static int64_t s_num(void *c) { (void)c; return NB; }
static int s_begin(void *c, int64_t epoch) {
    Synth *s = c;
    BqRng r;
    bq_rng_seed(&r, bq_hash64(s->seed, (uint64_t)epoch));
    for (int k = 0; k < NB; k++) s->order[k] = k;
    bq_rng_shuffle_i32(&r, s->order, NB);
    s->pos = 0;
    return BQ_OK;
}
static int s_next(void *c, const BqBatch **out) {
    Synth *s = c;
    *out = s->pos < NB ? &s->b[s->order[s->pos++]] : NULL;
    return BQ_OK;
}

typedef struct Rec {
    double loss[STEPS + 1];
    int nan_at;   /* inject NaN into the classifier after this step (0: never) */
} Rec;

static int on_step(void *user, BqBert *m, int64_t step, double loss) {
    Rec *r = user;
    if (step >= 1 && step <= STEPS) r->loss[step] = loss;
    if (r->nan_at && step == r->nan_at) m->cls_w.data[0] = NAN;
    return BQ_OK;
}

/* The GEMM precision of every model made below (the last cases run in bf16). */
static BqPrecision g_prec = BQ_PRECISION_FP32;

static void make_model(BqBert *m) {
    BqBertConfig cfg = bq_test_config(40, 16, 2, 2, 24, 32, 3, 0.1f, 0.2f);
    BqRng rng;
    bq_rng_seed(&rng, 11);
    memset(m, 0, sizeof *m);
    BQ_CHECK(bq_bert_create(m, &cfg, 1, &rng) == BQ_OK);
    m->prec = g_prec;
}

static void config(BqTrainConfig *tc, Rec *rec, const char *vocab) {
    bq_train_config_default(tc);
    tc->epochs = 4; /* 5 micro-batches / accum 2 = 3 steps per epoch → 12 steps */
    tc->lr = 3e-3;
    tc->weight_decay = 0.01;
    tc->warmup_ratio = 0.2;
    tc->max_grad_norm = 0.5;
    tc->grad_accum = 2;
    tc->seed = 7;
    tc->log_every = 1;
    tc->vocab_dir = vocab;
    tc->quiet = 1;
    tc->on_step = on_step;
    tc->user = rec;
}

/* QAT with live observers: the model of make_model with the scheme's quantizers, observers on,
 * ranges frozen after FREEZE_AFTER optimizer steps. */
#define FREEZE_AFTER 8

static void make_qat_model(BqBert *m, const char *scheme, int learn) {
    make_model(m);
    BqQuantConfig qc;
    bq_quant_config_default(&qc);
    BQ_CHECK(bq_scheme_parse(&qc.scheme, scheme, "scheme") == BQ_OK);
    qc.freeze_after = learn ? 0 : FREEZE_AFTER;
    BQ_CHECK(bq_quant_create(&m->quant, m, &qc) == BQ_OK);
    m->quant->observe = 1;
    /* --ranges learn: each range is set by its first batch (uninitialised quantizers observe once),
     * then its scale is trained */
    if (learn) bq_quant_learn_enable(m->quant, 2e-3);
}

static int64_t bits_differ(const float *a, const float *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

/* Values of every quantizer (amax, scale, observer state, frozen and initialized flags) that differ
 * between a and b, plus any difference in steps_seen; *frozen counts a's frozen quantizers. */
static int64_t quant_differ(const BqQuantState *a, const BqQuantState *b, int *frozen) {
    if (a->n != b->n) return 1 + (a->n > b->n ? a->n : b->n);
    int64_t d = a->steps_seen != b->steps_seen;
    *frozen = 0;
    for (int i = 0; i < a->n; i++) {
        const BqQuantizer *x = &a->q[i], *y = &b->q[i];
        if (x->nch != y->nch || x->is_weight != y->is_weight) {
            d++;
            continue;
        }
        d += bits_differ(x->amax, y->amax, x->nch) + bits_differ(x->scale, y->scale, x->nch);
        d += bits_differ(&x->run_min, &y->run_min, 1) + bits_differ(&x->run_max, &y->run_max, 1);
        if (x->is_weight) d += bits_differ(x->ch_min, y->ch_min, x->nch) + bits_differ(x->ch_max, y->ch_max, x->nch);
        d += (x->frozen != y->frozen) + (x->initialized != y->initialized);
        *frozen += x->frozen;
    }
    if ((a->lsq != NULL) != (b->lsq != NULL) || a->nscales != b->nscales) return d + 1;
    if (a->lsq) /* the learned scales' AdamW moments */
        d += bits_differ(a->lsq_m, b->lsq_m, a->nscales) + bits_differ(a->lsq_v, b->lsq_v, a->nscales);
    return d;
}

/* QAT run on scheme: uninterrupted, then interrupted after step k and resumed in a fresh model whose
 * quantizers start empty; losses, parameters and quantizer state must be bit-identical. */
static void qat_case(const char *root, const char *vocab, BqBatchSource *train, BqBatchSource *val,
                     const char *scheme, int64_t k, int learn) {
    char outA[256], outB[256];
    snprintf(outA, sizeof outA, "%s/qat_%s%s_a", root, scheme, learn ? "_learn" : "");
    snprintf(outB, sizeof outB, "%s/qat_%s%s_%lld", root, scheme, learn ? "_learn" : "", (long long)k);
    Rec ra, rb;
    memset(&ra, 0, sizeof ra);
    memset(&rb, 0, sizeof rb);
    BqTrainConfig tc;
    BqTrainResult res;
    BqBert ma, mb;
    make_qat_model(&ma, scheme, learn);
    config(&tc, &ra, vocab);
    /* the final parameters are those of the last step, not an earlier best; with learned ranges the
     * best copy (parameters and scales, /lsq/best) is kept and restored, so it is part of the check */
    tc.save_best = learn;
    int st = bq_train(&ma, &tc, train, val, outA, &res);
    EXPECT(st == BQ_OK, "qat %s run A: %s", scheme, bq_errmsg());

    make_qat_model(&mb, scheme, learn);
    config(&tc, &rb, vocab);
    tc.save_best = learn;
    tc.interrupt_at_step = k;
    st = bq_train(&mb, &tc, train, val, outB, &res);
    EXPECT(st == BQ_EINTR, "qat %s interrupt at %lld: %d %s", scheme, (long long)k, st, bq_errmsg());
    bq_quant_free(mb.quant), mb.quant = NULL;
    bq_bert_free(&mb);
    make_qat_model(&mb, scheme, learn); /* parameters and every range must come from the checkpoint */
    for (int64_t i = 0; i < mb.params.total; i++) mb.params.data[i] = 0;
    config(&tc, &rb, vocab);
    tc.save_best = learn;
    tc.resume = 1;
    st = bq_train(&mb, &tc, train, val, outB, &res);
    EXPECT(st == BQ_OK && res.steps == STEPS, "qat %s resume at %lld: %d %s", scheme, (long long)k, st, bq_errmsg());

    int same = 0;
    double maxd = 0;
    for (int s = 1; s <= STEPS; s++) {
        maxd = fmax(maxd, fabs(ra.loss[s] - rb.loss[s]));
        same += memcmp(&ra.loss[s], &rb.loss[s], sizeof(double)) == 0;
    }
    int64_t pd = bits_differ(ma.params.data, mb.params.data, ma.params.total);

    int frozen = 0;
    int64_t qd = quant_differ(ma.quant, mb.quant, &frozen);
    printf("%sqat %-7s%s interrupted at %2lld: %d/%d losses bit-identical (max difference %.3g), %lld parameters and "
           "%lld quantizer values differ, %d/%d quantizers frozen\n",
           g_prec == BQ_PRECISION_BF16 ? "bf16 " : "", scheme, learn ? " (ranges learned)" : "", (long long)k, same,
           STEPS, maxd, (long long)pd, (long long)qd,
           frozen, ma.quant->n);
    if (learn) { /* the scales did move: amax = scale·qmax no longer equals the first batch's range */
        int moved = 0;
        for (int i = 0; i < ma.quant->n; i++) {
            const BqQuantizer *q = &ma.quant->q[i];
            float a = q->is_weight ? fmaxf(-q->ch_min[0], q->ch_max[0]) : fmaxf(-q->run_min, q->run_max);
            moved += q->amax[0] != a;
        }
        printf("qat %s (ranges learned): %d/%d scales moved from their first-batch ranges\n", scheme, moved,
               ma.quant->n);
        EXPECT(moved == ma.quant->n, "qat %s learn: only %d of %d scales moved", scheme, moved, ma.quant->n);
    }
    EXPECT(same == STEPS, "qat %s at %lld: %d of %d losses identical", scheme, (long long)k, same, STEPS);
    EXPECT(pd == 0 && qd == 0, "qat %s at %lld: %lld parameters, %lld quantizer values differ", scheme, (long long)k,
           (long long)pd, (long long)qd);
    EXPECT(frozen == ma.quant->n && ma.quant->steps_seen == STEPS && (learn == (ma.quant->lsq != NULL)), "qat %s: %d of %d frozen, steps_seen %lld", scheme,
           frozen, ma.quant->n, (long long)ma.quant->steps_seen);
    bq_quant_free(ma.quant), ma.quant = NULL;
    bq_quant_free(mb.quant), mb.quant = NULL;
    bq_bert_free(&ma), bq_bert_free(&mb);
}

/* The float model trained uninterrupted (A, into out/a) and interrupted after step 5, then resumed in a
 * fresh model (B, into out/b): every loss and every final parameter must be the same bits. Counts into
 * *same, *maxd and *pd for main's summary. */
static void float_case(const char *out, const char *vocab, BqBatchSource *train, BqBatchSource *val, int *same,
                       double *maxd, int64_t *pd) {
    char outA[256], outB[256], p[512];
    snprintf(outA, sizeof outA, "%s/a", out);
    snprintf(outB, sizeof outB, "%s/b", out);
    mkdir(out, 0755);
    Rec ra, rb;
    memset(&ra, 0, sizeof ra);
    memset(&rb, 0, sizeof rb);
    BqTrainConfig tc;
    BqBert ma, mb;
    make_model(&ma);
    config(&tc, &ra, vocab);
    BqTrainResult res;
    int st = bq_train(&ma, &tc, train, val, outA, &res);
    EXPECT(st == BQ_OK, "run A: %s", bq_errmsg());
    EXPECT(res.steps == STEPS, "run A took %lld steps", (long long)res.steps);

    make_model(&mb);
    config(&tc, &rb, vocab);
    tc.interrupt_at_step = 5;
    st = bq_train(&mb, &tc, train, val, outB, &res);
    EXPECT(st == BQ_EINTR && strstr(bq_errmsg(), "--resume"), "interrupt: %d %s", st, bq_errmsg());
    bq_bert_free(&mb);
    make_model(&mb);
    for (int64_t i = 0; i < mb.params.total; i++) mb.params.data[i] = 0; /* must come from the checkpoint */
    config(&tc, &rb, vocab);
    tc.resume = 1;
    st = bq_train(&mb, &tc, train, val, outB, &res);
    EXPECT(st == BQ_OK, "resume: %s", bq_errmsg());
    EXPECT(res.steps == STEPS, "resumed run ended at %lld", (long long)res.steps);

    const char *prec = g_prec == BQ_PRECISION_BF16 ? "bf16 " : "";
    int n_same = 0;
    for (int s = 1; s <= STEPS; s++) {
        double d = fabs(ra.loss[s] - rb.loss[s]);
        if (d > *maxd) *maxd = d;
        n_same += memcmp(&ra.loss[s], &rb.loss[s], sizeof(double)) == 0;
        printf("%sstep %2d loss %.9f resumed %.9f\n", prec, s, ra.loss[s], rb.loss[s]);
    }
    EXPECT(n_same == STEPS, "%s%d of %d losses identical", prec, n_same, STEPS);
    *same += n_same;
    /* the parameters do move: losses are finite and not all the same */
    int distinct = 0;
    for (int s = 2; s <= STEPS; s++) distinct += isfinite(ra.loss[s]) && ra.loss[s] != ra.loss[s - 1];
    EXPECT(distinct == STEPS - 1, "%slosses stuck or not finite", prec);
    int64_t n_pd = 0;
    for (int64_t i = 0; i < ma.params.total; i++) n_pd += memcmp(&ma.params.data[i], &mb.params.data[i], 4) != 0;
    EXPECT(n_pd == 0, "%s%lld final parameters differ", prec, (long long)n_pd);
    *pd += n_pd;
    snprintf(p, sizeof p, "%s/training_log.jsonl", outB);
    struct stat sb;
    EXPECT(stat(p, &sb) == 0 && sb.st_size > 0, "%s missing", p);
    bq_bert_free(&ma), bq_bert_free(&mb);
}

int main(void) {
    char root[64];
    bq_test_tmpdir(root, sizeof root, "resume");
    char vocab[256], outC[256], p[512];
    snprintf(vocab, sizeof vocab, "%s/vocab", root);
    snprintf(outC, sizeof outC, "%s/c", root);
    bq_test_write_vocab(vocab, 40);

    Synth tr, va;
    synth_init(&tr, 5);
    synth_init(&va, 6);
    BqBatchSource train = {.ctx = &tr, .num_batches = s_num, .begin_epoch = s_begin, .next = s_next};
    BqBatchSource val = {.ctx = &va, .num_batches = s_num, .begin_epoch = s_begin, .next = s_next};

    /* A and B: the float model, uninterrupted and resumed */
    int same = 0;
    double maxd = 0;
    int64_t pd = 0;
    snprintf(p, sizeof p, "%s/fp32", root);
    float_case(p, vocab, &train, &val, &same, &maxd, &pd);
    BqTrainConfig tc;
    BqTrainResult res;
    int st;

    /* NaN: injected after step 7, detected in the loss of step 8 */
    Rec rc = {.nan_at = 7};
    BqBert mc;
    make_model(&mc);
    config(&tc, &rc, vocab);
    tc.eval_every = 3; /* checkpoints at steps 3 and 6 */
    st = bq_train(&mc, &tc, &train, &val, outC, &res);
    EXPECT(st == BQ_ENUMERIC && strstr(bq_errmsg(), "step 8"), "NaN: %d %s", st, bq_errmsg());
    BqBert md;
    memset(&md, 0, sizeof md);
    BqAdamW o;
    bq_adamw_init(&o, mc.params.total, 0);
    BqTrainState ts = {.opt = &o};
    st = bq_train_state_load(&md, outC, &ts);
    EXPECT(st == BQ_OK && ts.step == 6, "last good checkpoint: %d step %lld %s", st, (long long)ts.step, bq_errmsg());
    free(ts.best_params);
    bq_adamw_free(&o);

    bq_bert_free(&mc), bq_bert_free(&md);

    /* QAT: interrupted while the observers move (step 5) and after the ranges froze (step 9 > 8). */
    const char *schemes[] = {"ort", "cpu"};
    for (int i = 0; i < 2; i++) {
        qat_case(root, vocab, &train, &val, schemes[i], 5, 0);
        qat_case(root, vocab, &train, &val, schemes[i], FREEZE_AFTER + 1, 0);
    }
    /* --ranges learn: the scales and their moments (training_state.h5 /lsq) resume bit for bit; one
     * interruption before the last evaluation's best copy and one after it */
    for (int i = 0; i < 2; i++) {
        qat_case(root, vocab, &train, &val, schemes[i], 5, 1);
        qat_case(root, vocab, &train, &val, schemes[i], FREEZE_AFTER + 1, 1);
    }

    /* bf16 mixed precision (autograd/gemm.h; emulated on a CPU without bf16 units): fake-quant Linears
     * (ort) and integer Linears with bf16 backward GEMMs (cpu) resume bit for bit too */
    g_prec = BQ_PRECISION_BF16;
    printf("%s\n", bq_gemm_bf16_describe());
    for (int i = 0; i < 2; i++) qat_case(root, vocab, &train, &val, schemes[i], 5, 0);
    /* and the float model, whose bf16 step stores activations as bf16 words (autograd/tensor.h) */
    snprintf(p, sizeof p, "%s/bf16", root);
    float_case(p, vocab, &train, &val, &same, &maxd, &pd);

    synth_free(&tr), synth_free(&va);
    bq_test_rmtree(root);
    printf("test_resume: %d/%d losses bit-identical, max loss difference %.3g, %lld parameters differ, %s\n", same,
           2 * STEPS, maxd, (long long)pd, fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
