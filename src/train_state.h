/* The trainer's state between optimizer steps and its file DIR/training_state.h5, written into a
 * checkpoint directory together with the model (export/ckpt.h) so that an interrupted run resumes
 * bit for bit:
 *   /adam/m/<name>, /adam/v/<name>   AdamW moments, one float32 dataset per parameter
 *   /best/<name>                     the best parameters when tracked
 *   /lsq/m, /lsq/v, /lsq/best        --ranges learn: the learned scales' AdamW moments and best copy
 *                                    (export/quant_io.h, bq_quant_learn_save_hdf5)
 *   root attributes                  format_version, step, epoch, batch_cursor, total_steps,
 *                                    warmup_steps, adam_step, best_step (int64); lr, best_accuracy,
 *                                    beta1, beta2, eps, weight_decay (double); seed (uint64),
 *                                    rng (4 × uint64)
 * Quantizer ranges and observer state live in model.h5 (/quant, layers/quant.h). */
#ifndef BQ_TRAIN_STATE_H
#define BQ_TRAIN_STATE_H

#include <stdint.h>

#include "layers/bert.h"
#include "src/optim.h"

typedef struct BqTrainState {
    BqAdamW *opt;          /* moments and adam step; must match the model's parameter table */
    int64_t step;          /* optimizer steps done */
    int64_t epoch;         /* epoch in progress */
    int64_t batch_cursor;  /* micro-batches of that epoch already consumed */
    int64_t total_steps;   /* of the lr schedule; 0: constant learning rate (tests, benchmarks) */
    int64_t warmup_steps;
    double lr;             /* peak learning rate */
    uint64_t seed;
    BqRng rng;
    double best_accuracy;  /* -1: none */
    int64_t best_step;
    float *best_params;    /* (params.total) or NULL */
    const char *precision; /* "fp32"/"bf16" of the run, written as a string attribute; NULL: not written
                            * (or, loaded, absent) */
} BqTrainState;

/* Saves m as a checkpoint DIR (bq_ckpt_save) with ts in DIR/training_state.h5, both appearing by
 * the same atomic rename. */
int bq_train_state_save(const BqBert *m, const char *dir, const char *vocab_dir, const BqTrainState *ts);
/* bq_train_state_save that also lets `more` (may be NULL) add its files to the checkpoint (after
 * training_state.h5, by the same atomic rename). */
struct BqCkptExtra;
int bq_train_state_save_with(const BqBert *m, const char *dir, const char *vocab_dir, const BqTrainState *ts,
                             const struct BqCkptExtra *more);
/* Loads DIR's model into m (bq_ckpt_load), then DIR/training_state.h5 into ts: ts->opt must be
 * initialised for the model's table; ts->best_params is allocated when the state holds one (the
 * caller frees it). A missing training_state.h5 is BQ_EIO naming it. */
int bq_train_state_load(BqBert *m, const char *dir, BqTrainState *ts);

#endif
