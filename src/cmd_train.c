/* `bertqat finetune`: fp32 fine-tuning of a Hugging Face BERT (or a native checkpoint) for sequence
 * classification, HF Trainer semantics (see src/train.h). Defaults follow HF TrainingArguments where
 * they exist (lr 5e-5, 1 epoch, warmup 0, weight decay 0, max_grad_norm 1.0, seed 42) and the ONNX
 * Runtime IMDB example otherwise (batch 32, seq 128, 10% of the training reviews for validation). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "datasets/dataset.h"
#include "export/ckpt.h"
#include "src/args.h"
#include "src/cli.h"
#include "src/train.h"

typedef struct FtOpts {
    const char *model, *data, *out, *truncation, *logdir;
    double epochs, lr, warmup_ratio, weight_decay, max_grad_norm, val_fraction, dropout;
    int batch_size, grad_accum, max_seq_len, seed, eval_every, evals_per_epoch, save_best, threads, train_samples,
        eval_samples, log_every, resume, bucket, max_steps, no_save_best;
} FtOpts;

static int parse_trunc(const char *s, BqTruncation *t) {
    if (!strcmp(s, "head")) *t = BQ_TRUNC_HEAD;
    else if (!strcmp(s, "tail")) *t = BQ_TRUNC_TAIL;
    else if (!strcmp(s, "head_tail") || !strcmp(s, "head-tail")) *t = BQ_TRUNC_HEAD_TAIL;
    else return bq_err(BQ_EINVAL, "--truncation: '%s' is not head, tail or head_tail", s);
    return BQ_OK;
}

int bq_cmd_finetune(int argc, char **argv) {
    FtOpts o = {0};
    o.epochs = 1, o.lr = 5e-5, o.warmup_ratio = 0.0, o.weight_decay = 0.0, o.max_grad_norm = 1.0;
    o.val_fraction = 0.1, o.dropout = -1, o.batch_size = 32, o.grad_accum = 1, o.max_seq_len = 128;
    o.seed = 42, o.eval_every = 0, o.threads = 0, o.train_samples = 0, o.eval_samples = 0, o.log_every = 10;
    o.truncation = "head";
    const BqArgSpec specs[] = {
        {"model", BQ_ARG_STR, &o.model, "Hugging Face BERT directory or native checkpoint", 1, 0, 0},
        {"data", BQ_ARG_STR, &o.data, "IMDB archive/folder, CSV, TSV or JSONL", 1, 0, 0},
        {"out", BQ_ARG_STR, &o.out, "output checkpoint directory (replaced atomically)", 1, 0, 0},
        {"epochs", BQ_ARG_FLOAT, &o.epochs, "training epochs (fractional allowed)", 0, 0.001, 1000},
        {"max-steps", BQ_ARG_INT, &o.max_steps, "optimizer steps (> 0 overrides --epochs)", 0, 0, 1e9},
        {"lr", BQ_ARG_FLOAT, &o.lr, "peak learning rate (AdamW)", 0, 0, 1},
        {"batch-size", BQ_ARG_INT, &o.batch_size, "examples per micro-batch", 0, 1, 65536},
        {"grad-accum", BQ_ARG_INT, &o.grad_accum, "micro-batches per optimizer step", 0, 1, 65536},
        {"max-seq-len", BQ_ARG_INT, &o.max_seq_len, "tokens per example incl. [CLS]/[SEP]", 0, 8, 8192},
        {"warmup-ratio", BQ_ARG_FLOAT, &o.warmup_ratio, "fraction of steps with linear warmup", 0, 0, 1},
        {"weight-decay", BQ_ARG_FLOAT, &o.weight_decay, "AdamW decoupled weight decay (not biases/LayerNorm)", 0, 0, 10},
        {"max-grad-norm", BQ_ARG_FLOAT, &o.max_grad_norm, "global gradient-norm clip (0: off)", 0, 0, 1e9},
        {"seed", BQ_ARG_INT, &o.seed, "seed for data selection, shuffling, dropout and init", 0, 0, 2147483647},
        {"eval-every", BQ_ARG_INT, &o.eval_every, "evaluate every N optimizer steps (0: each epoch end)", 0, 0, 1e9},
        {"evals-per-epoch", BQ_ARG_INT, &o.evals_per_epoch, "without --eval-every: evaluations per epoch (0: 1)", 0, 0, 1e6},
        {"no-save-best", BQ_ARG_FLAG, &o.no_save_best, "final model = last step, not the best evaluation", 0, 0, 0},
        {"save-best", BQ_ARG_FLAG, &o.save_best, "final model = best validation accuracy (default)", 0, 0, 0},
        {"threads", BQ_ARG_INT, &o.threads, "threads (0: all cores)", 0, 0, 4096},
        {"train-samples", BQ_ARG_INT, &o.train_samples, "training reviews to use, incl. validation (0: all)", 0, 0, 1e9},
        {"eval-samples", BQ_ARG_INT, &o.eval_samples, "cap on validation examples (0: all)", 0, 0, 1e9},
        {"val-fraction", BQ_ARG_FLOAT, &o.val_fraction, "fraction of the training reviews held out for validation", 0, 0, 0.9},
        {"dropout", BQ_ARG_FLOAT, &o.dropout, "override hidden and attention dropout (< 0: from config)", 0, -1, 0.99},
        {"log-every", BQ_ARG_INT, &o.log_every, "optimizer steps between log lines", 0, 1, 1e9},
        {"resume", BQ_ARG_FLAG, &o.resume, "continue from OUT/training_state.h5", 0, 0, 0},
        {"bucket", BQ_ARG_FLAG, &o.bucket, "length bucketing of training batches (less padding)", 0, 0, 0},
        {"truncation", BQ_ARG_STR, &o.truncation, "head, tail or head_tail", 0, 0, 0},
        {"logdir", BQ_ARG_STR, &o.logdir, "TensorBoard event directory", 0, 0, 0},
    };
    BqArgs args = {.cmd = "finetune", .usage = "--model DIR --data PATH --out DIR [options]",
                   .summary = "Fine-tune BERT for sequence classification (fp32), HF Trainer semantics.",
                   .specs = specs, .nspecs = (int)(sizeof specs / sizeof *specs)};
    int st = bq_args_parse(&args, argc, argv);
    if (st || args.help) return st;

    BqTokenizer *tok = NULL;
    BqDataset *dtrain = NULL, *dval = NULL;
    BqBatcher btrain = {0}, bval = {0};
    BqBert m;
    memset(&m, 0, sizeof m);
    char *report = NULL;
    char vocab[4200];
    BqTruncation trunc = BQ_TRUNC_HEAD;
    if ((st = parse_trunc(o.truncation, &trunc))) return st;
    bq_runtime_set_threads(o.threads);

    /* Load the model before the (possibly long) data encoding, so a wrong --model fails fast; it is
     * loaded again below if the data has a different number of labels than its config. */
    BqRng rng;
    bq_rng_seed(&rng, (uint64_t)o.seed);
    if ((st = bq_model_load_any(&m, o.model, 0, &rng, &report))) goto cleanup;
    free(report);
    report = NULL;
    /* The vocabulary travels with the model: HF dir or native checkpoint both hold vocab.txt. */
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", o.model);
    if ((st = bq_tokenizer_load(&tok, vocab, NULL))) goto cleanup;

    BqDataSpec spec;
    bq_data_spec_default(&spec);
    spec.path = o.data;
    spec.split = "train";
    spec.max_seq_len = o.max_seq_len;
    spec.truncation = trunc;
    spec.val_fraction = o.val_fraction;
    spec.seed = (uint64_t)o.seed;
    spec.train_samples = o.train_samples;
    spec.threads = o.threads;
    if ((st = bq_dataset_load(&dtrain, &spec, tok))) goto cleanup;
    if (dtrain->nlabels < 2) {
        st = bq_err(BQ_EINVAL, "%s: training data needs labels of at least 2 classes (found %d)", o.data, dtrain->nlabels);
        goto cleanup;
    }
    if (o.val_fraction > 0) {
        spec.split = "val";
        if ((st = bq_dataset_load(&dval, &spec, tok))) goto cleanup;
        if (o.eval_samples > 0 && dval->n > o.eval_samples) dval->n = o.eval_samples; /* prefix stays valid */
        if (dval->n == 0) bq_dataset_free(dval), dval = NULL;
    }
    fprintf(stderr, "[finetune] %lld training, %lld validation examples (%s); %s\n", (long long)dtrain->n,
            (long long)(dval ? dval->n : 0), o.data, bq_runtime_describe());

    if (m.cfg.num_labels != dtrain->nlabels || !bq_ckpt_is_native(o.model)) {
        /* HF: the classifier is created for the data's labels with the seeded init */
        bq_bert_free(&m);
        bq_rng_seed(&rng, (uint64_t)o.seed);
        if ((st = bq_model_load_any(&m, o.model, dtrain->nlabels, &rng, &report))) goto cleanup;
    }
    if (report) fprintf(stderr, "[finetune] %s\n", report);
    if (!m.params.grad) {
        st = bq_err(BQ_EINVAL, "%s: model loaded without gradients", o.model);
        goto cleanup;
    }
    if (m.cfg.max_position_embeddings < o.max_seq_len) {
        st = bq_err(BQ_EINVAL, "--max-seq-len: %d exceeds the model's max_position_embeddings %d", o.max_seq_len,
                    m.cfg.max_position_embeddings);
        goto cleanup;
    }
    /* Label names from the data (HF dirs carry LABEL_0.. placeholders). */
    if (!bq_ckpt_is_native(o.model) && m.cfg.id2label && dtrain->label_names) {
        for (int i = 0; i < m.cfg.num_labels && i < dtrain->nlabels; i++) {
            free(m.cfg.id2label[i]);
            m.cfg.id2label[i] = bq_strdup(dtrain->label_names[i]);
        }
    }
    if (o.dropout >= 0) m.cfg.hidden_dropout_prob = m.cfg.attention_probs_dropout_prob = (float)o.dropout;

    if ((st = bq_batcher_init(&btrain, dtrain, o.batch_size, 1, (uint64_t)o.seed, o.bucket))) goto cleanup;
    if (dval && (st = bq_batcher_init(&bval, dval, o.batch_size, 0, (uint64_t)o.seed, 1))) goto cleanup;
    BqBatchSource strain, sval;
    BqBatcherSource bs_train, bs_val;
    bq_batch_source_batcher(&strain, &bs_train, &btrain);
    if (dval) bq_batch_source_batcher(&sval, &bs_val, &bval);

    BqTrainConfig tc;
    bq_train_config_default(&tc);
    tc.epochs = o.epochs;
    tc.max_steps = o.max_steps;
    tc.lr = o.lr;
    tc.weight_decay = o.weight_decay;
    tc.warmup_ratio = o.warmup_ratio;
    tc.max_grad_norm = o.max_grad_norm;
    tc.grad_accum = o.grad_accum;
    tc.seed = (uint64_t)o.seed;
    tc.eval_every = o.eval_every;
    tc.evals_per_epoch = o.evals_per_epoch;
    tc.save_best = !o.no_save_best;
    tc.log_every = o.log_every;
    tc.resume = o.resume;
    tc.vocab_dir = o.model;
    tc.logdir = o.logdir;
    tc.tag = "finetune";
    BqTrainResult res = {0};
    st = bq_train(&m, &tc, &strain, dval ? &sval : NULL, o.out, &res);
    if (st) goto cleanup;
    printf("finetune: %lld steps in %.1fs, last loss %.4f", (long long)res.steps, res.seconds, res.last_loss);
    if (res.best_accuracy >= 0)
        printf(", best validation accuracy %.4f (step %lld)", res.best_accuracy, (long long)res.best_step);
    printf("; checkpoint %s\n", o.out);

cleanup:
    free(report);
    if (btrain.ds) bq_batcher_free(&btrain);
    if (bval.ds) bq_batcher_free(&bval);
    if (dtrain) bq_dataset_free(dtrain);
    if (dval) bq_dataset_free(dval);
    if (tok) bq_tokenizer_free(tok);
    bq_bert_free(&m);
    return st;
}
