/* The tiny quantized model and checkpoint the HDF5 fuzz targets start from (header only; used by the
 * targets and by tests/fuzz/make_seeds.c, which writes the same files as the corpus seeds). A fixed
 * seed makes the files identical on every run. */
#ifndef BQ_FUZZ_MODEL_H
#define BQ_FUZZ_MODEL_H

#include <string.h>

#include "autograd/bq.h"
#include "export/ckpt.h"
#include "layers/bert.h"
#include "layers/quant.h"
#include "src/optim.h"
#include "src/train_state.h"

/* vocab 24, hidden 8, one layer of 2 heads, intermediate 12, 16 positions, 2 labels; `ort` scheme
 * quantizers with ranges set (observers included) so that /quant is complete. */
static inline void fz_tiny_model(BqBert *m) {
    BqBertConfig c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 24, c.hidden_size = 8, c.num_hidden_layers = 1, c.num_attention_heads = 2;
    c.intermediate_size = 12, c.max_position_embeddings = 16, c.type_vocab_size = 2;
    c.pad_token_id = 0, c.layer_norm_eps = 1e-12f, c.hidden_dropout_prob = 0.1f;
    c.attention_probs_dropout_prob = 0.1f, c.classifier_dropout = -1, c.initializer_range = 0.02f;
    c.num_labels = 2;
    BqRng rng;
    bq_rng_seed(&rng, 5);
    memset(m, 0, sizeof *m);
    BQ_CHECK(bq_bert_create(m, &c, 1, &rng) == BQ_OK);
    BqQuantConfig qc;
    bq_quant_config_default(&qc);
    BQ_CHECK(bq_quant_create(&m->quant, m, &qc) == BQ_OK);
    for (int i = 0; i < m->quant->n; i++) {
        BqQuantizer *q = &m->quant->q[i];
        for (int64_t k = 0; k < q->nch; k++) q->amax[k] = 0.25f + 0.5f * (float)bq_rng_uniform(&rng);
        q->initialized = 1;
        bq_quant_update_scale(m->quant, q);
    }
}

/* Writes the tiny model as a checkpoint DIR (config.json, model.h5, training_state.h5 with AdamW
 * moments and a best copy). */
static inline void fz_tiny_checkpoint(const char *dir) {
    BqBert m;
    fz_tiny_model(&m);
    BqAdamW o;
    bq_adamw_init(&o, m.params.total, 0.01f);
    for (int64_t i = 0; i < m.params.total; i++) m.params.grad[i] = 0.001f * (float)(i % 7) - 0.003f;
    bq_adamw_step(&o, &m.params, 1e-3f);
    BqTrainState ts;
    memset(&ts, 0, sizeof ts);
    ts.opt = &o;
    ts.step = 3, ts.total_steps = 10, ts.warmup_steps = 1, ts.lr = 1e-3, ts.seed = 42;
    bq_rng_seed(&ts.rng, 42);
    ts.best_accuracy = 0.5, ts.best_step = 2, ts.best_params = m.params.data;
    BQ_CHECK(bq_train_state_save(&m, dir, NULL, &ts) == BQ_OK);
    bq_adamw_free(&o);
    bq_quant_free(m.quant);
    bq_bert_free(&m);
}

/* Copies the file FROM to TO (scratch files; aborts on failure). */
static inline void fz_copy(const char *from, const char *to) {
    FILE *f = fopen(from, "rb"), *g = fopen(to, "wb");
    BQ_CHECK(f && g);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) BQ_CHECK(fwrite(buf, 1, n, g) == n);
    fclose(f);
    BQ_CHECK(fclose(g) == 0);
}

/* Makes the scratch checkpoint folder SUB for a target that fuzzes one of its files: a reference
 * checkpoint is written to SUB-ref once, and SUB receives its config.json and, when with_model, its
 * model.h5. Returns SUB's path in out. */
static inline const char *fz_checkpoint_dir(char *out, size_t n, const char *sub, int with_model) {
    char ref[600], p[700], q[700];
    snprintf(p, sizeof p, "%s-ref", sub);
    fz_path(ref, sizeof ref, p);
    fz_tiny_checkpoint(ref);
    fz_path(out, n, sub);
    BQ_CHECK(mkdir(out, 0700) == 0);
    static const char *const files[] = {"config.json", "model.h5"};
    for (int i = 0; i < 1 + (with_model != 0); i++) {
        snprintf(p, sizeof p, "%s/%s", ref, files[i]);
        snprintf(q, sizeof q, "%s/%s", out, files[i]);
        fz_copy(p, q);
    }
    return out;
}

#endif
