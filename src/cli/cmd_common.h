/* Set-up shared by the subcommands (src/cli/cmd_*.c): truncation and engine names, model and tokenizer
 * loading, the data flags (source columns, cache, length, truncation) with the checkpoint's record of
 * how it was trained (BqDataMeta, layers/bert.h) as their default, the training and validation splits
 * of a training command, the training flags `finetune` and `qat` share, whose rows write the
 * BqTrainConfig and BqCliSplits fields directly, and where the Python helper scripts and their Python
 * are found. Every function returns a BqStatus with a message naming the flag or file. How to add a
 * flag: docs/design.md §11. */
#ifndef BQ_CMD_COMMON_H
#define BQ_CMD_COMMON_H

#include "datasets/dataset.h"
#include "layers/bert.h"
#include "layers/bert_int8.h"
#include "src/cli/args.h"
#include "src/train.h"

/* --truncation's names, BqTruncation's in order and then the alias head-tail (NULL-terminated), with
 * the value of each (for BQ_ARG_ENUM). */
extern const char *const bq_truncation_names[5];
extern const int bq_truncation_values[4];
/* "head", "tail" or "head_tail". */
const char *bq_truncation_name(BqTruncation t);

/* Loads the tokenizer DIR/vocab.txt (the vocabulary travels with every model directory) and the model
 * at DIR, native checkpoint or Hugging Face directory (num_labels 0: its own; a fresh classifier is
 * drawn from `seed`). The loader's report goes to stderr as "[tag] ...". */
int bq_cli_model_load(BqBert *m, BqTokenizer **tok, const char *dir, int num_labels, uint64_t seed, const char *tag);

/* ---- inference engine (eval, predict) ---- */

/* --engine's values, and its names in their order (NULL-terminated, for BQ_ARG_ENUM). */
typedef enum BqCliEngine { BQ_CLI_ENGINE_AUTO, BQ_CLI_ENGINE_INT8, BQ_CLI_ENGINE_FAKE_QUANT } BqCliEngine;
extern const char *const bq_cli_engine_names[4];

/* The forward eval and predict run, chosen by --engine `engine` for m:
 *   m without quantizers (fp32): *out NULL, *name "fp32"; `int8` is an error naming the flag;
 *   int8: the integer engine (layers/bert_int8.h) packed now, or an error naming the flag and why the
 *         engine refuses the model;
 *   auto: int8 when bq_int8_prepare accepts m, else fake quant with a one-line note on stderr giving
 *         the engine's reason;
 *   fake-quant: *out NULL (bq_bert_forward with m->quant).
 * *name receives "int8", "fake-quant" or "fp32", and "[tag] engine: NAME ..." goes to stderr. The
 * caller frees *out with bq_int8_free. Errors: BQ_EINVAL naming flag ("--engine"); the engine's other failures. */
int bq_cli_engine_select(BqInt8Engine **out, const BqBert *m, BqCliEngine engine, const char *flag, const char *tag,
                         const char **name);

/* bq_cli_model_load (num_labels 0, seed 0) then bq_cli_engine_select with flag "--engine", the same
 * results, except that for a native checkpoint and `engine` auto or int8 the integer engine packs each
 * encoder layer as its tensors are read and gives back the fp32 weights it packed (BqCkptLoadHook,
 * bq_int8_load_step): the model is then held in fp32 only where the engine does not run it, and the
 * whole fp32 model is never resident. */
int bq_cli_model_load_engine(BqBert *m, BqTokenizer **tok, const char *dir, BqCliEngine engine, const char *tag,
                             BqInt8Engine **out, const char **name);

#define BQ_CLI_ENGINE_HELP "the forward of a quantized checkpoint (auto: the integer " \
    "engine where it accepts the model, else fake quant; fp32 checkpoints run fp32)"

/* ---- data flags ---- */

typedef struct BqCliData {
    const char *path;                /* --data (NULL: none, e.g. predict reading stdin) */
    int truncation;                  /* a BqTruncation; -1: the checkpoint's, else head */
    const char *text_column, *text_pair_column, *label_column; /* NULL: the checkpoint's, else automatic */
    const char *cache_dir;           /* NULL: the default cache folder */
    int max_seq_len;                 /* 0: the checkpoint's, else 128 */
    int no_cache;
    BqDataMeta used;                 /* filled by bq_cli_data_resolve: what the command encodes with */
} BqCliData;

/* The flags' defaults: every field 0 (none given) but truncation, -1. */
#define BQ_CLI_DATA_INIT {.truncation = -1}

/* Columns and cache, for every command that reads a data source. */
#define BQ_CLI_COLUMN_SPECS(d)                                                                                  \
    {"text-column", BQ_ARG_STR, &(d).text_column, "text column/field (default: the checkpoint's, else the "  \
     "first of text, review, sentence, content)", 0, 0, 0},                                                    \
    {"text-pair-column", BQ_ARG_STR, &(d).text_pair_column, "second text column: sentence pairs (default: the " \
     "checkpoint's, else none)", 0, 0, 0},                                                                       \
    {"label-column", BQ_ARG_STR, &(d).label_column, "label column/field (default: the checkpoint's, else the " \
     "first of label, sentiment, labels)", 0, 0, 0},                                                            \
    {"cache-dir", BQ_ARG_STR, &(d).cache_dir, "encoded-set cache folder (default $BERTQAT_CACHE, "             \
     "$XDG_CACHE_HOME/bertqat, ~/.cache/bertqat)", 0, 0, 0},                                                    \
    {"no-cache", BQ_ARG_FLAG, &(d).no_cache, "neither read nor write the encoded-set cache", 0, 0, 0}

/* Length and truncation, then columns and cache: every command that encodes text for a model. */
#define BQ_CLI_DATA_SPECS(d)                                                                                    \
    {"max-seq-len", BQ_ARG_INT, &(d).max_seq_len, "tokens per example incl. [CLS]/[SEP] (0: the checkpoint's " \
     "training length, else 128)", 0, 0, 8192},                                                                \
    {"truncation", BQ_ARG_ENUM, &(d).truncation, "tokens kept of a longer text (default: the checkpoint's, else " \
     "head)", 0, 0, 0, bq_truncation_names, bq_truncation_values},                                             \
    BQ_CLI_COLUMN_SPECS(d)

/* Fills d->used from the flags given, else from m->data (the checkpoint's record; m NULL: none), else
 * the defaults (128 tokens, head, automatic columns); checks the length against the model's position
 * table and (tag not NULL) prints the settings and where each came from to stderr as
 * "[tag] encoding: ...". */
int bq_cli_data_resolve(BqCliData *d, const BqBert *m, const char *tag);

/* A BqDataSpec for `split` of d->path encoded as d->used, with d's cache choice and seed, encoded on the
 * runtime's threads; the sample selection (train/eval samples, val fraction) is left at "all" for the
 * caller. */
void bq_cli_data_spec(BqDataSpec *spec, const BqCliData *d, const char *split, uint64_t seed);

/* For commands that write a checkpoint from data: makes m's classifier fit ds's labels (a Hugging Face
 * model is loaded again with a fresh classifier of ds->nlabels outputs drawn from `seed`; a native
 * checkpoint with another label count is an error) and names the labels after the data's. */
int bq_cli_model_fit(BqBert *m, const char *dir, const BqDataset *ds, uint64_t seed, const char *tag);

/* ---- the Python helper scripts (pipeline, bench) ---- */

/* One rule serves the build tree and an installed prefix. The roots are the folder of the running
 * executable (/proc/self/exe, links resolved) and that folder's parent: build/bertqat has build/ and the
 * checkout; PREFIX/bin/bertqat (`cmake --install`) has PREFIX/bin and PREFIX. */

/* The helper script `name` (onnx_eval.py, onnx_eval_qa.py, onnx_bench.py): the first
 * ROOT/share/bertqat/scripts/name that is a file (the build copies the scripts into
 * BUILD/share/bertqat/scripts, `cmake --install` into PREFIX/share/bertqat/scripts), into out (n bytes).
 * Errors: BQ_EIO naming both folders looked in. */
int bq_cli_script_path(const char *name, char *out, size_t n);

/* The Python that runs the helper scripts, into out (n bytes): `flag` (--python as given; NULL or empty:
 * not given) as it is, else $BQ_PYTHON when set and not empty, as it is, else the first
 * ROOT/.venv/bin/python that is executable (scripts/setup_env.sh's venv in the checkout, for a build
 * tree in it; PREFIX/.venv for an install). Errors: BQ_EINVAL naming --python, BQ_PYTHON and the venv
 * paths tried. */
int bq_cli_python_path(const char *flag, char *out, size_t n);

#define BQ_CLI_PYTHON_HELP "(default: $BQ_PYTHON, else the .venv in the folder of the bertqat executable or " \
    "the folder above it: the checkout's for build/bertqat, PREFIX/.venv for an installed one)"

/* ---- training flags (finetune, qat) ---- */

/* The training and validation splits of a training run, with their batchers and batch sources: the
 * selection and batching flags first (set by BQ_CLI_TRAIN_SPECS, defaults from bq_cli_train_default),
 * then what bq_cli_splits_load fills. Not movable once loaded (the sources point into it). */
typedef struct BqCliSplits {
    int batch_size;        /* examples per micro-batch (global under mpirun) */
    int64_t train_samples; /* training examples to use, incl. validation (0: all) */
    int64_t eval_samples;  /* cap on validation examples (0: all) */
    double val_fraction;   /* fraction of the training examples held out for validation */
    double dropout;        /* < 0: the model's; else its hidden and attention dropout */
    int bucket;            /* length bucketing of the training batches */
    BqDataset *train, *val;
    BqBatcher btrain, bval;
    BqBatcherSource bs_train, bs_val;
    BqBatchSource strain, sval;
} BqCliSplits;

/* The defaults of everything BQ_CLI_TRAIN_SPECS(tc, s) writes: the trainer's (bq_train_config_default)
 * with the command's peak learning rate lr, and the ONNX Runtime IMDB example's selection (batch 32, 10%
 * of the training examples for validation, the model's dropout, no bucketing). */
void bq_cli_train_default(BqTrainConfig *tc, BqCliSplits *s, double lr);

/* The flags `finetune` and `qat` share. Each row writes the field it sets: the trainer's settings
 * straight into the BqTrainConfig tc, the selection and batching into the BqCliSplits s (defaults for
 * both: bq_cli_train_default). Threads and precision are the parser's (BqArgs.common). */
#define BQ_CLI_TRAIN_SPECS(tc, s)                                                                               \
    {"epochs", BQ_ARG_FLOAT, &(tc).epochs, "training epochs (fractional allowed)", 0, 0.001, 1000},            \
    {"max-steps", BQ_ARG_I64, &(tc).max_steps, "optimizer steps (> 0 overrides --epochs)", 0, 0, 1e9},         \
    {"lr", BQ_ARG_FLOAT, &(tc).lr, "peak learning rate (AdamW)", 0, 0, 1},                                    \
    {"batch-size", BQ_ARG_INT, &(s).batch_size, "examples per micro-batch", 0, 1, 65536},                      \
    {"grad-accum", BQ_ARG_INT, &(tc).grad_accum, "micro-batches per optimizer step", 0, 1, 65536},             \
    {"warmup-ratio", BQ_ARG_FLOAT, &(tc).warmup_ratio, "fraction of steps with linear warmup", 0, 0, 1},       \
    {"weight-decay", BQ_ARG_FLOAT, &(tc).weight_decay, "AdamW decoupled weight decay (not biases/LayerNorm)", \
     0, 0, 10},                                                                                                 \
    {"max-grad-norm", BQ_ARG_FLOAT, &(tc).max_grad_norm, "global gradient-norm clip (0: off)", 0, 0, 1e9},     \
    {"seed", BQ_ARG_U64, &(tc).seed, "seed for data selection, shuffling, dropout, classifier init and "       \
     "calibration", 0, 0, 2147483647},                                                                         \
    {"eval-every", BQ_ARG_I64, &(tc).eval_every, "evaluate every N optimizer steps (0: each epoch end)", 0, 0, \
     1e9},                                                                                                      \
    {"evals-per-epoch", BQ_ARG_INT, &(tc).evals_per_epoch, "without --eval-every: evaluations per epoch (0: 1)",\
     0, 0, 1e6},                                                                                                \
    {"no-save-best", BQ_ARG_OFF, &(tc).save_best, "final model = last step (default: the parameters of the "   \
     "best validation accuracy)", 0, 0, 0},                                                                     \
    {"train-samples", BQ_ARG_I64, &(s).train_samples, "training examples to use, incl. validation (0: all)",  \
     0, 0, 1e9},                                                                                                \
    {"eval-samples", BQ_ARG_I64, &(s).eval_samples, "cap on validation examples (0: all)", 0, 0, 1e9},        \
    {"val-fraction", BQ_ARG_FLOAT, &(s).val_fraction, "fraction of the training examples held out for "       \
     "validation", 0, 0, 0.9},                                                                                  \
    {"dropout", BQ_ARG_FLOAT, &(s).dropout, "override hidden and attention dropout (< 0: from config)", 0, -1, \
     0.99},                                                                                                     \
    {"log-every", BQ_ARG_I64, &(tc).log_every, "optimizer steps between log lines", 0, 1, 1e9},                \
    {"resume", BQ_ARG_FLAG, &(tc).resume, "continue from OUT/training_state.h5", 0, 0, 0},                     \
    {"bucket", BQ_ARG_FLAG, &(s).bucket, "length bucketing of training batches (less padding)", 0, 0, 0},      \
    {"logdir", BQ_ARG_STR, &(tc).logdir, "TensorBoard event directory", 0, 0, 0}

/* Resolves d against m, loads the splits with s's selection, fits m to the training labels
 * (bq_cli_model_fit on the model directory `dir`, a classifier drawn from seed), applies s->dropout
 * and builds the batchers (shuffled by seed). */
int bq_cli_splits_load(BqCliSplits *s, BqBert *m, const char *dir, BqCliData *d, uint64_t seed,
                       const BqTokenizer *tok, const char *tag);
void bq_cli_splits_free(BqCliSplits *s);

/* Records d->used and the precision prec (the command's --precision, BqArgs.prec, which the
 * checkpoint's training_state.h5 records) in m and trains m with tc into `out` (src/train.h); tc->tag
 * prefixes the progress and the summary printed to stdout. val may be NULL: no evaluation, the final
 * model is the last step (question answering trains so, src/qa.h). */
int bq_cli_train_run(BqBert *m, const BqTrainConfig *tc, BqPrecision prec, BqBatchSource *train,
                     BqBatchSource *val, const BqCliData *d, const char *out, BqTrainResult *res);

#endif
