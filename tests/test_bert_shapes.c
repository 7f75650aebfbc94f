/* Shape and contract tests of layers/bert.c over config variations the reference fixture does not
 * cover: odd hidden size (15, 3 heads of 5), one layer, three labels, sequences of length 1.
 *
 * For each config: the parameter table (HF order, count, 64-byte aligned offsets, decay groups, HF
 * init statistics, padding row zeroed, views), forward output shapes, padding invariance (a padded
 * sequence gives the logits of the same sequence unpadded — the additive mask and positions are
 * right), evaluation = training logits with dropout 0, central finite differences against the tape's
 * gradients on sampled parameter elements, no loss for unlabeled batches, and the input errors
 * (token id, token type, label out of range; T above max_position_embeddings) returned, not aborted.
 * Prints the max error of each check; exits non-zero on failure. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "autograd/tensor.h"
#include "layers/bert.h"
#include "src/train.h"
#include "tests/test_util.h"

/* bq_bert_forward on a batch of datasets/batch.h (which the tests below mutate in place). */
static int forward_batch(BqBert *m, BqCtx *ctx, const BqBatch *bt, BqTensor **logits, BqTensor **loss) {
    BqBertInput in = bq_batch_input(bt);
    return bq_bert_forward(m, ctx, &in, logits, loss);
}

/* lengths[b] tokens, the rest padding (id 0, mask 0, type 0); random ids in [1, vocab). */
static void batch_make(BqBatch *bt, int64_t B, int64_t T, const int *lengths, int vocab, BqRng *rng) {
    memset(bt, 0, sizeof *bt);
    bt->B = B;
    bt->T = T;
    bt->input_ids = bq_calloc((size_t)(B * T), sizeof(int32_t));
    bt->token_type_ids = bq_calloc((size_t)(B * T), sizeof(int32_t));
    bt->attention_mask = bq_calloc((size_t)(B * T), sizeof(float));
    bt->labels = bq_calloc((size_t)B, sizeof(int32_t));
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < lengths[b]; t++) {
            bt->input_ids[b * T + t] = 1 + (int32_t)bq_rng_below(rng, (uint64_t)vocab - 1);
            bt->attention_mask[b * T + t] = 1.0f;
            bt->token_type_ids[b * T + t] = t >= lengths[b] / 2;
        }
    }
}

static void batch_free(BqBatch *bt) {
    free(bt->input_ids);
    free(bt->token_type_ids);
    free(bt->attention_mask);
    free(bt->labels);
}

/* Loss of one evaluation forward without a tape (activations released afterwards). */
static float eval_loss(BqBert *m, BqArena *act, const BqBatch *bt) {
    size_t mark = bq_arena_mark(act);
    BqCtx ctx = {.act = act, .tape = NULL, .training = 0};
    BqTensor *logits, *loss;
    BQ_CHECK(forward_batch(m, &ctx, bt, &logits, &loss) == BQ_OK && loss);
    float v = loss->data[0];
    bq_arena_rewind(act, mark);
    return v;
}

static void check_table(BqBert *m) {
    const BqParamTable *t = &m->params;
    const BqBertConfig *c = &m->cfg;
    EXPECT(t->n == 5 + 16 * c->num_hidden_layers + 4, "table has %d entries", t->n);
    EXPECT(((uintptr_t)t->data & 63) == 0 && ((uintptr_t)t->grad & 63) == 0, "blocks not 64-byte aligned");
    EXPECT(strcmp(t->p[0].name, "bert.embeddings.word_embeddings.weight") == 0, "first entry %s", t->p[0].name);
    EXPECT(strcmp(t->p[t->n - 1].name, "classifier.bias") == 0, "last entry %s", t->p[t->n - 1].name);
    char want[BQ_NAME_MAX];
    snprintf(want, sizeof want, "bert.encoder.layer.%d.output.LayerNorm.bias", c->num_hidden_layers - 1);
    EXPECT(strcmp(t->p[t->n - 5].name, want) == 0, "entry %d is %s", t->n - 5, t->p[t->n - 5].name);
    int64_t end = 0;
    double std_err = 0;
    for (int i = 0; i < t->n; i++) {
        const BqParam *p = &t->p[i];
        EXPECT(p->offset % 16 == 0 && p->offset >= end, "%s offset %lld", p->name, (long long)p->offset);
        end = p->offset + p->numel;
        size_t len = strlen(p->name);
        int is_bias = len > 5 && strcmp(p->name + len - 5, ".bias") == 0;
        int is_ln = strstr(p->name, "LayerNorm") != NULL;
        EXPECT(p->decay == (!is_bias && !is_ln), "%s decay %d", p->name, p->decay);
        const float *d = t->data + p->offset;
        const float *g = t->grad + p->offset;
        double s1 = 0, s2 = 0, gmax = 0;
        for (int64_t k = 0; k < p->numel; k++) {
            s1 += d[k];
            s2 += (double)d[k] * d[k];
            if (fabs(g[k]) > gmax) gmax = fabs(g[k]);
        }
        EXPECT(gmax == 0, "%s grad not zeroed", p->name);
        if (is_ln && !is_bias) EXPECT(s1 == (double)p->numel && s2 == (double)p->numel, "%s not ones", p->name);
        else if (is_bias) EXPECT(s2 == 0, "%s not zeros", p->name);
        else if (p->numel >= 200) {
            int64_t n = p->numel - (i == 0 ? c->hidden_size : 0); /* pad row excluded */
            double sd = sqrt(s2 / (double)n);
            double e = fabs(sd / c->initializer_range - 1.0);
            if (e > std_err) std_err = e;
            EXPECT(e < 0.25, "%s std %.4f, want %.4f", p->name, sd, c->initializer_range);
        }
        EXPECT(bq_params_find(t, p->name) == i, "find %s", p->name);
    }
    EXPECT(end <= t->total, "total %lld < end %lld", (long long)t->total, (long long)end);
    printf("  table: %d params, %lld floats, init std max rel err %.3f\n", t->n, (long long)t->total, std_err);
    for (int64_t k = 0; k < c->hidden_size; k++)
        EXPECT(m->word_emb.data[(int64_t)c->pad_token_id * c->hidden_size + k] == 0, "pad row not zero");
    /* views */
    int li = bq_params_find(t, "bert.encoder.layer.0.intermediate.dense.weight");
    EXPECT(li >= 0 && m->layers[0].i_w.data == t->data + t->p[li].offset && m->layers[0].i_w.grad == t->grad + t->p[li].offset &&
               m->layers[0].i_w.shape[0] == c->intermediate_size && m->layers[0].i_w.shape[1] == c->hidden_size,
           "intermediate view");
    EXPECT(m->cls_w.shape[0] == c->num_labels && m->cls_w.shape[1] == c->hidden_size, "classifier view");
    EXPECT(m->pos_emb.shape[0] == c->max_position_embeddings, "position view");
}

/* Random parameters of magnitude ~0.5 so every path carries signal (HF init is near-identity). */
static void randomize(BqBert *m, BqRng *rng) {
    const BqParamTable *t = &m->params;
    for (int i = 0; i < t->n; i++) {
        const BqParam *p = &t->p[i];
        int ln_w = strstr(p->name, "LayerNorm.weight") != NULL;
        for (int64_t k = 0; k < p->numel; k++)
            t->data[p->offset + k] = (ln_w ? 1.0f : 0.0f) + 0.3f * bq_rng_normal(rng);
    }
}

static void run_case(const char *label, BqBertConfig cfg, int64_t B, int64_t T, const int *lengths) {
    printf("case %s: H=%d L=%d NH=%d I=%d C=%d B=%lld T=%lld\n", label, cfg.hidden_size, cfg.num_hidden_layers,
           cfg.num_attention_heads, cfg.intermediate_size, cfg.num_labels, (long long)B, (long long)T);
    BqRng rng;
    bq_rng_seed(&rng, 7);
    BqBert m;
    int rc = bq_bert_create(&m, &cfg, 1, &rng);
    EXPECT(rc == BQ_OK, "create: %s", bq_errmsg());
    if (rc) return;
    const int C = m.cfg.num_labels, vocab = m.cfg.vocab_size;
    check_table(&m);
    randomize(&m, &rng);

    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 28, "act") == BQ_OK);
    BqTape tape;
    BQ_CHECK(bq_tape_init(&tape, 4096) == BQ_OK);
    BqBatch bt;
    batch_make(&bt, B, T, lengths, vocab, &rng);
    for (int64_t b = 0; b < B; b++) bt.labels[b] = (int32_t)(b % C);
    /* padding positions hold arbitrary (nonzero) ids and types: the mask alone must hide them */
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = lengths[b]; t < T; t++) {
            bt.input_ids[b * T + t] = 1 + (int32_t)bq_rng_below(&rng, (uint64_t)vocab - 1);
            bt.token_type_ids[b * T + t] = 1;
        }

    /* training forward + backward */
    BqCtx ctx = {.act = &act, .tape = &tape, .training = 1, .rng_key = 1};
    BqTensor *logits = NULL, *loss = NULL;
    rc = forward_batch(&m, &ctx, &bt, &logits, &loss);
    EXPECT(rc == BQ_OK && logits && loss, "forward: %s", bq_errmsg());
    if (rc || !logits || !loss) goto cleanup;
    EXPECT(logits->ndim == 2 && logits->shape[0] == B && logits->shape[1] == C, "logits shape");
    EXPECT(bq_tensor_numel(loss) == 1 && isfinite(loss->data[0]), "loss");
    float *train_logits = bq_malloc((size_t)(B * C) * sizeof(float));
    memcpy(train_logits, logits->data, (size_t)(B * C) * sizeof(float));
    bq_backward(&ctx, loss);
    size_t mark0 = 0;

    /* finite differences on sampled elements of several tensors (float loss: loose tolerance) */
    {
        BqTensor *probe[] = {&m.word_emb, &m.pos_emb, &m.type_emb, &m.emb_ln_w, &m.layers[0].q_w, &m.layers[0].k_b,
                             &m.layers[0].v_w, &m.layers[0].i_w, &m.layers[m.cfg.num_hidden_layers - 1].o_w,
                             &m.layers[m.cfg.num_hidden_layers - 1].ln2_b, &m.pool_w, &m.cls_b};
        double worst = 0;
        for (size_t pi = 0; pi < sizeof probe / sizeof *probe; pi++) {
            BqTensor *w = probe[pi];
            int64_t n = bq_tensor_numel(w);
            double gmax = 0;
            for (int64_t k = 0; k < n; k++)
                if (fabs(w->grad[k]) > gmax) gmax = fabs(w->grad[k]);
            for (int s = 0; s < 4; s++) {
                int64_t k;
                if (w == &m.word_emb) k = (int64_t)bt.input_ids[bq_rng_below(&rng, (uint64_t)lengths[0])] * m.cfg.hidden_size +
                                          (int64_t)bq_rng_below(&rng, (uint64_t)m.cfg.hidden_size);
                else k = (int64_t)bq_rng_below(&rng, (uint64_t)n);
                float keep = w->data[k];
                const float h = 1e-2f;
                w->data[k] = keep + h;
                double lp = eval_loss(&m, &act, &bt);
                w->data[k] = keep - h;
                double lm = eval_loss(&m, &act, &bt);
                w->data[k] = keep;
                double fd = (lp - lm) / (2.0 * h);
                double e = fabs(fd - w->grad[k]) / fmax(gmax, 1e-2);
                if (!(e <= worst)) worst = e;
                EXPECT(e < 5e-3, "%s[%lld]: fd %.6g tape %.6g (max|g| %.3g)", w->name ? w->name : "?", (long long)k, fd,
                       w->grad[k], gmax);
            }
        }
        printf("  finite differences: max error %.3e (relative to each tensor's max |grad|)\n", worst);
    }

    /* evaluation without tape gives the training logits (dropout 0) */
    bq_tape_rewind(&tape);
    bq_arena_rewind(&act, mark0);
    {
        BqCtx ectx = {.act = &act, .tape = NULL, .training = 0};
        BqTensor *el, *eloss;
        EXPECT(forward_batch(&m, &ectx, &bt, &el, &eloss) == BQ_OK, "eval forward");
        double e = 0;
        for (int64_t i = 0; i < B * C; i++) e = fmax(e, fabs(el->data[i] - train_logits[i]));
        printf("  eval vs train logits: max abs diff %.3e\n", e);
        EXPECT(e <= 1e-6, "eval logits differ by %.3g", e);
    }

    /* padding invariance: each sequence alone, unpadded (B=1, T=length), gives its row of logits */
    {
        double e = 0;
        for (int64_t b = 0; b < B; b++) {
            BqBatch one = {.B = 1, .T = lengths[b]};
            one.input_ids = bt.input_ids + b * T;
            one.token_type_ids = bt.token_type_ids + b * T;
            one.attention_mask = bt.attention_mask + b * T;
            one.labels = bt.labels + b;
            /* the unpadded copy must not see the padding's types either: they are past its length */
            bq_arena_rewind(&act, mark0);
            BqCtx ectx = {.act = &act, .tape = NULL, .training = 0};
            BqTensor *l1, *loss1;
            EXPECT(forward_batch(&m, &ectx, &one, &l1, &loss1) == BQ_OK, "forward of one");
            for (int j = 0; j < C; j++) e = fmax(e, fabs(l1->data[j] - train_logits[b * C + j]));
        }
        printf("  padded vs unpadded logits: max abs diff %.3e\n", e);
        EXPECT(e <= 1e-5, "padding changes logits by %.3g", e);
    }

    /* unlabeled batch: logits, no loss */
    {
        bq_arena_rewind(&act, mark0);
        BqCtx ectx = {.act = &act, .tape = NULL, .training = 0};
        int32_t keep = bt.labels[0];
        bt.labels[0] = -1;
        BqTensor *l1, *loss1 = (BqTensor *)1;
        EXPECT(forward_batch(&m, &ectx, &bt, &l1, &loss1) == BQ_OK && l1 && loss1 == NULL, "unlabeled batch");
        bt.labels[0] = keep;
    }

    /* input errors are returned with a message */
    {
        BqCtx ectx = {.act = &act, .tape = NULL, .training = 0};
        BqTensor *l1, *loss1;
        int32_t keep = bt.input_ids[0];
        bt.input_ids[0] = vocab;
        bq_err_clear();
        rc = forward_batch(&m, &ectx, &bt, &l1, &loss1);
        EXPECT(rc == BQ_EFORMAT && strstr(bq_errmsg(), "vocabulary"), "id out of range: %d %s", rc, bq_errmsg());
        bt.input_ids[0] = -3;
        EXPECT(forward_batch(&m, &ectx, &bt, &l1, &loss1) == BQ_EFORMAT, "negative id");
        bt.input_ids[0] = keep;
        bt.token_type_ids[0] = 2;
        EXPECT(forward_batch(&m, &ectx, &bt, &l1, &loss1) == BQ_EFORMAT, "type out of range");
        bt.token_type_ids[0] = 0;
        bt.labels[0] = C;
        EXPECT(forward_batch(&m, &ectx, &bt, &l1, &loss1) == BQ_EFORMAT, "label out of range");
        bt.labels[0] = 0;
        BqBatch longb = bt;
        longb.B = 1;
        longb.T = m.cfg.max_position_embeddings + 1;
        EXPECT(forward_batch(&m, &ectx, &longb, &l1, &loss1) == BQ_EINVAL, "T > max_position_embeddings");
    }
    free(train_logits);

cleanup:
    batch_free(&bt);
    bq_tape_free(&tape);
    bq_arena_free(&act);
    bq_bert_free(&m);
}

int main(void) {
    /* odd hidden size and head size, odd intermediate, binary */
    int len_a[3] = {9, 5, 1};
    run_case("odd-hidden", bq_test_config(50, 15, 2, 3, 7, 16, 2, 0.0f, 0.02f), 3, 9, len_a);
    /* one layer, three labels */
    int len_b[2] = {6, 3};
    run_case("one-layer-3-labels", bq_test_config(40, 8, 1, 2, 12, 8, 3, 0.0f, 0.02f), 2, 6, len_b);
    /* sequences of length 1 (only [CLS]) */
    int len_c[2] = {1, 1};
    run_case("T=1", bq_test_config(30, 12, 2, 4, 20, 4, 3, 0.0f, 0.02f), 2, 1, len_c);
    if (fails) {
        fprintf(stderr, "test_bert_shapes: %d failure(s)\n", fails);
        return 1;
    }
    printf("test_bert_shapes: OK\n");
    return 0;
}
