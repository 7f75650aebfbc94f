/* The training loop shared by `finetune` and `qat`: micro-batches from a batch source, forward with
 * tape, backward, gradient accumulation, global-norm clipping, AdamW with the HF linear warmup/decay
 * schedule, periodic evaluation on a validation source, best-model tracking (HF
 * load_best_model_at_end on eval accuracy), checkpoints with full training state, exact resume,
 * NaN/Inf detection and SIGINT/SIGTERM/SIGUSR1 handling (save, then BQ_EINTR).
 *
 * Determinism: the batch order of epoch e is a function of (seed, e) only (the source's contract);
 * the dropout key of micro-batch k is bq_hash64(seed, k); reductions are thread-count independent
 * only as far as the kernels are. A resumed run therefore reproduces the uninterrupted run's losses
 * bit for bit at the same thread count.
 *
 * Under mpirun (src/dist.h, docs/distributed.md) bq_train is collective: the batch source yields the
 * global batches, each rank trains on its contiguous share of every one, gradients and step counters
 * are summed over the ranks before bq_train_apply (which divides by grad_accum · N), SIGUSR1 (which
 * mpirun forwards) stops like SIGINT, and rank 0 alone writes checkpoints and logs. bq_evaluate and
 * bq_evaluate_engine are collective too: batches are sharded and the confusion counts summed. */
#ifndef BQ_TRAIN_H
#define BQ_TRAIN_H

#include <stdint.h>

#include "datasets/batch.h"
#include "layers/bert.h"
#include "layers/bert_int8.h"
#include "src/distill.h"
#include "src/metrics.h"
#include "src/train_state.h"

/* The model's view of a batch (layers/bert.h does not know datasets/). */
static inline BqBertInput bq_batch_input(const BqBatch *b) {
    return (BqBertInput){.B = b->B, .T = b->T, .input_ids = b->input_ids, .attention_mask = b->attention_mask,
                         .token_type_ids = b->token_type_ids, .labels = b->labels,
                         .start_positions = b->start_positions, .end_positions = b->end_positions};
}

/* Where batches come from. The trainer never owns the batches: `next` hands out a batch that stays
 * valid until the following call. */
typedef struct BqBatchSource {
    void *ctx;
    int64_t (*num_batches)(void *ctx);              /* batches per epoch (> 0) */
    /* Starts epoch `epoch` (0-based); the order must depend only on the source's seed and epoch. */
    int (*begin_epoch)(void *ctx, int64_t epoch);
    /* *out = next batch, or NULL at the end of the epoch. Returns a BqStatus. */
    int (*next)(void *ctx, const BqBatch **out);
} BqBatchSource;

typedef struct BqTrainConfig {
    double epochs;          /* may be fractional: total steps = ceil(epochs · steps per epoch) */
    int64_t max_steps;      /* > 0: overrides epochs */
    double lr;
    double weight_decay;
    double warmup_ratio;
    double max_grad_norm;   /* 0: no clipping */
    int grad_accum;         /* micro-batches per optimizer step (>= 1) */
    uint64_t seed;
    int64_t eval_every;     /* optimizer steps between evaluations; 0: at the end of each epoch */
    int evals_per_epoch;    /* > 0 (and eval_every == 0): evaluate every ceil(steps per epoch / this) steps */
    int save_best;          /* keep the parameters with the best validation accuracy; final = best */
    int64_t log_every;      /* optimizer steps between log lines (>= 1) */
    int resume;             /* continue from out_dir/training_state.h5 */
    const char *vocab_dir;  /* copied into every checkpoint (vocab.txt, tokenizer_config.json) */
    const char *logdir;     /* TensorBoard event directory, or NULL */
    const char *tag;        /* progress prefix, e.g. "finetune" or "qat" */
    int quiet;              /* no progress output (tests) */
    int64_t interrupt_at_step; /* tests: behave as if SIGINT arrived after this step (0: never) */
    /* When m->quant is set the trainer itself calls bq_quant_step() after every optimizer step (and on
     * resume sets steps_seen to the resumed step), so freeze_after works without a hook.
     * Called after every optimizer step (extra per-step quantizer bookkeeping, tests recording losses);
     * a non-zero return stops training with that status. */
    int (*on_step)(void *user, BqBert *m, int64_t step, double loss);
    void *user;
    const BqDistill *distill; /* NULL: cross-entropy only */
} BqTrainConfig;

/* A BqBatchSource over a datasets/dataset.h batcher (epoch e = bq_batcher_seek(b, e, 0)). */
struct BqBatcher;
typedef struct BqBatcherSource {
    struct BqBatcher *b;
    BqBatch cur;
} BqBatcherSource;
void bq_batch_source_batcher(BqBatchSource *src, BqBatcherSource *bs, struct BqBatcher *b);

/* Defaults in the HF Trainer spirit: 1 epoch, lr 5e-5, wd 0, warmup 0, clip 1.0, accum 1, seed 42,
 * eval at each epoch end, save_best on, log every 10 steps. */
void bq_train_config_default(BqTrainConfig *tc);

typedef struct BqTrainResult {
    int64_t steps;
    double last_loss;
    double best_accuracy;   /* -1 when never evaluated */
    int64_t best_step;
    double seconds;
} BqTrainResult;

/* Trains m (its gradients are allocated first when it has none: bq_bert_grad_alloc) and leaves the final checkpoint in out_dir (with training
 * state, so `--resume` of a finished run is a no-op). val may be NULL (no evaluation, no best
 * tracking). On BQ_ENUMERIC the last good checkpoint is left intact; on a signal (or
 * interrupt_at_step) a resumable checkpoint is saved and BQ_EINTR returned. */
int bq_train(BqBert *m, const BqTrainConfig *tc, BqBatchSource *train, BqBatchSource *val, const char *out_dir,
             BqTrainResult *res);

/* The training step, in two halves that every caller (bq_train, bench/bench_train_step.c, the tests)
 * shares, so there is one definition of what a step does.
 *
 * bq_train_step: one micro-batch b. Forward with tape on ctx (ctx->training = 1; ctx->rng_key is the
 * dropout key), then backward, accumulating into m->params.grad. ctx->tape is rewound before and
 * ctx->act rewound to its entry mark on return. *loss receives the loss; logits (may be NULL)
 * receives the training forward's logits (b->B, num_labels). A NaN/Inf loss is BQ_ENUMERIC naming
 * the step, epoch and batch of ts (the step about to be taken, ts->step + 1); gradients are then not
 * accumulated. */
int bq_train_step(BqBert *m, BqCtx *ctx, const BqBatch *b, const BqTrainState *ts, float *loss, float *logits);
/* bq_train_step with the distillation loss of dist (NULL: bq_train_step). terms (may be NULL) receives the
 * three unweighted terms of the loss: cross-entropy, T²·KL and Σ_l MSE_l (0 when hidden_weight is 0). */
/* The loss of BqDistill on top of the student's cross-entropy ce (shape (1)), from the student's logits lg
 * (B,C) and per-layer hidden states hs (layers tensors (B,T,H); NULL when hidden_weight is 0) and the
 * teacher's tl and ht, recorded on ctx's tape; terms as in bq_train_step_distill. */
BqTensor *bq_train_distill_loss(BqCtx *ctx, const BqDistill *dist, int layers, BqTensor *ce, BqTensor *lg,
                                BqTensor *tl, BqTensor **hs, BqTensor **ht, double terms[3]);
int bq_train_step_distill(BqBert *m, BqCtx *ctx, const BqBatch *b, const BqTrainState *ts, const BqDistill *dist,
                          double terms[3], float *loss, float *logits);

/* bq_train_apply: ends an optimizer step over the gradients accumulated since the last one.
 * Gradients are divided by tc->grad_accum times the number of MPI ranks (when > 1; HF divides each
 * micro-batch loss), clipped to
 * tc->max_grad_norm (torch clip_grad_norm_, 0: none), then AdamW (ts->opt) at
 * lr = tc->lr · bq_lr_lambda(ts->step, ts->warmup_steps, ts->total_steps) (tc->lr itself when
 * ts->total_steps is 0), gradients zeroed, ts->step incremented and, when m->quant is set,
 * bq_quant_step (steps_seen; freezes ranges at freeze_after). gnorm and lr (may be NULL) receive the
 * norm before clipping and the rate used. A non-finite gradient norm is BQ_ENUMERIC naming the step,
 * with the parameters untouched. */
int bq_train_apply(BqBert *m, const BqTrainConfig *tc, BqTrainState *ts, double *gnorm, double *lr);

/* Forward-only evaluation over one pass of src (begin_epoch(0)), accumulating into conf (which the
 * caller initialises with m->cfg.num_labels classes). act is a scratch arena rewound per batch.
 * When probs_cb is set it receives each batch's softmax probabilities (B, num_labels). */
int bq_evaluate(BqBert *m, BqBatchSource *src, BqArena *act, BqConfusion *conf, int64_t max_examples,
                void (*probs_cb)(void *user, const BqBatch *b, const float *probs), void *user);

/* The inference forward of eval and predict: logits (B, num_labels) of in, through the integer engine
 * e (layers/bert_int8.h, prepared from m) when e is set, else bq_fp32_forward (layers/bert_fp32.h: the
 * fused fp32 layers, or bq_bert_forward without a tape for fake quant). ctx->tape must be NULL and ctx->training 0. */
int bq_infer_forward(BqBert *m, BqInt8Engine *e, BqCtx *ctx, const BqBertInput *in, BqTensor **logits);

/* bq_evaluate with its forwards through bq_infer_forward(m, e, ...); e NULL is bq_evaluate. The trainer's
 * validation uses bq_evaluate (fake quant, the function training optimises). */
int bq_evaluate_engine(BqBert *m, BqInt8Engine *e, BqBatchSource *src, BqArena *act, BqConfusion *conf,
                       int64_t max_examples, void (*probs_cb)(void *user, const BqBatch *b, const float *probs),
                       void *user);

#endif
