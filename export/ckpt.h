/* Native checkpoint directory (DESIGN.md §6):
 *   DIR/config.json          HF BertConfig keys + "bertqat" block (format version, num_labels,
 *                            id2label, quant config when the model is quantized, "data": how the
 *                            examples were encoded, BqDataMeta in layers/bert.h)
 *   DIR/vocab.txt            (+ tokenizer_config.json, special_tokens_map.json when present) copied
 *   DIR/model.h5             /params/<HF name> float32 datasets; root attribute format_version;
 *                            /quant/... written by the QAT module when m->quant is set
 *   DIR/training_state.h5    /adam/m/<name>, /adam/v/<name>, /best/<name> (best parameters when
 *                            tracked); attributes step, epoch, batch_cursor, total_steps,
 *                            warmup_steps, lr, seed, adam_step, best_accuracy, best_step, rng
 * Saved into DIR.tmp, every file fsynced, then DIR.tmp renamed over DIR (the old DIR moved to
 * DIR.old first and removed afterwards), so DIR is always either the old or the new checkpoint.
 * A training_log.jsonl in the old DIR is carried over into the new one. */
#ifndef BQ_CKPT_H
#define BQ_CKPT_H

#include <stdint.h>

#include "layers/bert.h"
#include "src/optim.h"

#define BQ_CKPT_FORMAT_VERSION 1

typedef struct BqTrainState {
    BqAdamW *opt;          /* moments and adam step; must match the model's parameter table */
    int64_t step;          /* optimizer steps done */
    int64_t epoch;         /* epoch in progress */
    int64_t batch_cursor;  /* micro-batches of that epoch already consumed */
    int64_t total_steps, warmup_steps;
    double lr;             /* peak learning rate */
    uint64_t seed;
    BqRng rng;
    double best_accuracy;  /* -1: none */
    int64_t best_step;
    float *best_params;    /* (params.total) or NULL */
} BqTrainState;

int bq_ckpt_save(const BqBert *m, const char *dir, const char *vocab_dir, const BqTrainState *ts);
/* Loads DIR into m: when m->params.data is NULL, creates the model from DIR/config.json first (always
 * with gradients, so the model can be trained further). When config.json carries a bertqat.quant block
 * and m->quant is NULL, m->quant is created (bq_quant_create; the caller frees it with bq_quant_free). ts (may be NULL) receives the training state: ts->opt must be
 * initialised for the model's table; ts->best_params is allocated when the state holds one. */
int bq_ckpt_load(BqBert *m, const char *dir, BqTrainState *ts);
/* Native checkpoint when DIR/model.h5 exists, else a Hugging Face directory through bq_hf_load. */
int bq_model_load_any(BqBert *m, const char *dir, int num_labels, BqRng *rng, char **report);
int bq_ckpt_is_native(const char *dir);

#endif
