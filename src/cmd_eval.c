/* `bertqat eval` (accuracy, precision, recall, F1, confusion matrix, throughput of a checkpoint on a
 * labelled split) and `bertqat predict` (label and probability per text, from arguments or stdin
 * lines). Metric definitions: src/metrics.h (sklearn semantics). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "datasets/dataset.h"
#include "export/ckpt.h"
#include "src/args.h"
#include "src/cli.h"
#include "src/metrics.h"
#include "src/train.h"

#define ACT_RESERVE ((size_t)64 << 30)

static int load_model_and_tok(BqBert *m, BqTokenizer **tok, const char *dir, int num_labels, char **report) {
    char vocab[4200];
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
    int st = bq_tokenizer_load(tok, vocab, NULL);
    if (st) return st;
    BqRng rng;
    bq_rng_seed(&rng, 0);
    return bq_model_load_any(m, dir, num_labels, &rng, report);
}

static const char *label_name(const BqBert *m, int k, char *buf, size_t n) {
    if (m->cfg.id2label && m->cfg.id2label[k]) return m->cfg.id2label[k];
    snprintf(buf, n, "LABEL_%d", k);
    return buf;
}

/* --predictions: one line per example, "index<TAB>label<TAB>predicted<TAB>probability of predicted", index
 * being the example's position in the evaluated selection (scripts/onnx_eval.py writes the same). */
typedef struct PredWriter {
    FILE *f;
    int C;
} PredWriter;

static void pred_write(void *user, const BqBatch *b, const float *probs) {
    PredWriter *w = user;
    for (int64_t i = 0; i < b->B; i++) {
        const float *p = probs + i * w->C;
        int k = bq_argmax(p, w->C);
        fprintf(w->f, "%lld\t%d\t%d\t%.6f\n", (long long)b->example_index[i], b->labels[i], k, p[k]);
    }
}

int bq_cmd_eval(int argc, char **argv) {
    const char *model = NULL, *data = NULL, *split = "test", *truncation = "head", *predictions = NULL;
    int samples = 0, max_seq_len = 128, batch_size = 64, threads = 0, json = 0, seed = 42;
    double val_fraction = 0.1;
    int train_samples = 0;
    const BqArgSpec specs[] = {
        {"model", BQ_ARG_STR, &model, "native checkpoint (or HF directory)", 1, 0, 0},
        {"data", BQ_ARG_STR, &data, "IMDB archive/folder, CSV, TSV or JSONL", 1, 0, 0},
        {"split", BQ_ARG_STR, &split, "test, val or train", 0, 0, 0},
        {"samples", BQ_ARG_INT, &samples, "examples to evaluate (0: all; test: seeded selection)", 0, 0, 1e9},
        {"max-seq-len", BQ_ARG_INT, &max_seq_len, "tokens per example incl. [CLS]/[SEP]", 0, 8, 8192},
        {"batch-size", BQ_ARG_INT, &batch_size, "examples per forward", 0, 1, 65536},
        {"threads", BQ_ARG_INT, &threads, "threads (0: all cores)", 0, 0, 4096},
        {"seed", BQ_ARG_INT, &seed, "seed of the example selection (as in finetune)", 0, 0, 2147483647},
        {"val-fraction", BQ_ARG_FLOAT, &val_fraction, "for --split val: as in finetune", 0, 0, 0.9},
        {"train-samples", BQ_ARG_INT, &train_samples, "for --split val/train: as in finetune", 0, 0, 1e9},
        {"truncation", BQ_ARG_STR, &truncation, "head, tail or head_tail", 0, 0, 0},
        {"json", BQ_ARG_FLAG, &json, "print one JSON object instead of a table", 0, 0, 0},
        {"predictions", BQ_ARG_STR, &predictions, "write index, label, predicted label, its probability per example "
         "(TSV) to this file", 0, 0, 0},
    };
    BqArgs args = {.cmd = "eval", .usage = "--model CKPT --data PATH [options]",
                   .summary = "Evaluate a checkpoint: accuracy, precision, recall, F1, confusion matrix, examples/s.",
                   .specs = specs, .nspecs = (int)(sizeof specs / sizeof *specs)};
    int st = bq_args_parse(&args, argc, argv);
    if (st || args.help) return st;
    if (strcmp(split, "test") && strcmp(split, "val") && strcmp(split, "train"))
        return bq_err(BQ_EINVAL, "--split: '%s' is not test, val or train", split);
    BqTruncation trunc = BQ_TRUNC_HEAD;
    if (!strcmp(truncation, "tail")) trunc = BQ_TRUNC_TAIL;
    else if (!strcmp(truncation, "head_tail") || !strcmp(truncation, "head-tail")) trunc = BQ_TRUNC_HEAD_TAIL;
    else if (strcmp(truncation, "head")) return bq_err(BQ_EINVAL, "--truncation: '%s' is not head, tail or head_tail", truncation);
    if (predictions && (st = bq_check_writable_parent(predictions))) return bq_err_ctx(st, "--predictions");
    bq_runtime_set_threads(threads);

    BqTokenizer *tok = NULL;
    BqDataset *ds = NULL;
    BqBatcher bt = {0};
    BqBert m;
    memset(&m, 0, sizeof m);
    BqArena act = {0};
    BqConfusion conf = {0};
    char *report = NULL;
    char pred_tmp[4200] = "";
    PredWriter pw = {0};
    char vocab[4200];
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", model);
    if ((st = bq_tokenizer_load(&tok, vocab, NULL))) goto cleanup;
    BqDataSpec spec;
    bq_data_spec_default(&spec);
    spec.path = data;
    spec.split = split;
    spec.max_seq_len = max_seq_len;
    spec.truncation = trunc;
    spec.seed = (uint64_t)seed;
    spec.eval_samples = !strcmp(split, "test") ? samples : 0;
    spec.train_samples = train_samples;
    spec.val_fraction = val_fraction;
    spec.threads = threads;
    if ((st = bq_dataset_load(&ds, &spec, tok))) goto cleanup;
    if (samples > 0 && ds->n > samples) ds->n = samples;
    if (ds->nlabels < 1) {
        st = bq_err(BQ_EINVAL, "%s: split %s has no labels to evaluate against", data, split);
        goto cleanup;
    }
    BqRng rng;
    bq_rng_seed(&rng, 0);
    if ((st = bq_model_load_any(&m, model, 0, &rng, &report))) goto cleanup;
    if (ds->nlabels > m.cfg.num_labels) {
        st = bq_err(BQ_EINVAL, "%s: data has %d labels, the model %d", data, ds->nlabels, m.cfg.num_labels);
        goto cleanup;
    }
    if ((st = bq_arena_init(&act, ACT_RESERVE, "activations"))) goto cleanup;
    if ((st = bq_batcher_init(&bt, ds, batch_size, 0, (uint64_t)seed, 1))) goto cleanup;
    BqBatchSource src;
    BqBatcherSource bs;
    bq_batch_source_batcher(&src, &bs, &bt);
    bq_confusion_init(&conf, m.cfg.num_labels);
    if (predictions) {
        snprintf(pred_tmp, sizeof pred_tmp, "%s.tmp", predictions);
        if (!(pw.f = fopen(pred_tmp, "w"))) {
            st = bq_err(BQ_EIO, "--predictions %s: %s", predictions, strerror(errno));
            goto cleanup;
        }
        pw.C = m.cfg.num_labels;
    }
    double t0 = bq_now();
    if ((st = bq_evaluate(&m, &src, &act, &conf, 0, pw.f ? pred_write : NULL, &pw))) goto cleanup;
    double secs = bq_now() - t0;
    if (pw.f) {
        int bad = fclose(pw.f) != 0;
        pw.f = NULL;
        if (bad) {
            st = bq_err(BQ_EIO, "--predictions %s: write failed: %s", predictions, strerror(errno));
            goto cleanup;
        }
        if ((st = bq_rename_durable(pred_tmp, predictions))) goto cleanup;
    }
    BqMetrics mt = bq_metrics_compute(&conf);
    double eps = mt.n / (secs > 1e-9 ? secs : 1e-9);
    int C = m.cfg.num_labels;
    char nb[32];
    if (json) {
        json_t *j = json_object();
        json_object_set_new(j, "model", json_string(model));
        json_object_set_new(j, "data", json_string(data));
        json_object_set_new(j, "split", json_string(split));
        json_object_set_new(j, "examples", json_integer(mt.n));
        json_object_set_new(j, "accuracy", json_real(mt.accuracy));
        json_object_set_new(j, "precision", json_real(mt.precision));
        json_object_set_new(j, "recall", json_real(mt.recall));
        json_object_set_new(j, "f1", json_real(mt.f1));
        json_object_set_new(j, "loss", json_real(mt.loss));
        json_object_set_new(j, "average", json_string(C == 2 ? "binary (positive class 1)" : "macro"));
        json_object_set_new(j, "seconds", json_real(secs));
        json_object_set_new(j, "examples_per_s", json_real(eps));
        json_object_set_new(j, "max_seq_len", json_integer(max_seq_len));
        json_object_set_new(j, "batch_size", json_integer(batch_size));
        json_object_set_new(j, "threads", json_integer(bq_runtime_threads()));
        json_t *labels = json_array(), *cm = json_array();
        for (int i = 0; i < C; i++) {
            json_array_append_new(labels, json_string(label_name(&m, i, nb, sizeof nb)));
            json_t *row = json_array();
            for (int k = 0; k < C; k++) json_array_append_new(row, json_integer(conf.cm[i * C + k]));
            json_array_append_new(cm, row);
        }
        json_object_set_new(j, "labels", labels);
        json_object_set_new(j, "confusion_matrix", cm);
        char *s = json_dumps(j, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        printf("model      %s\ndata       %s (%s split, %lld examples, seq %d)\n", model, data, split, (long long)mt.n,
               max_seq_len);
        printf("accuracy   %.4f\nprecision  %.4f\nrecall     %.4f\nf1         %.4f   (%s)\nloss       %.4f\n",
               mt.accuracy, mt.precision, mt.recall, mt.f1, C == 2 ? "binary, positive class 1" : "macro", mt.loss);
        printf("speed      %.1f examples/s (%.2fs, %d threads)\n", eps, secs, bq_runtime_threads());
        printf("confusion matrix (rows: true, columns: predicted)\n%12s", "");
        for (int k = 0; k < C; k++) printf(" %10.10s", label_name(&m, k, nb, sizeof nb));
        printf("\n");
        for (int i = 0; i < C; i++) {
            printf("%12.12s", label_name(&m, i, nb, sizeof nb));
            for (int k = 0; k < C; k++) printf(" %10lld", (long long)conf.cm[i * C + k]);
            printf("\n");
        }
    }

cleanup:
    if (pw.f) fclose(pw.f);
    if (st && pred_tmp[0]) remove(pred_tmp);
    free(report);
    if (conf.cm) bq_confusion_free(&conf);
    if (bt.ds) bq_batcher_free(&bt);
    if (act.base) bq_arena_free(&act);
    if (ds) bq_dataset_free(ds);
    if (tok) bq_tokenizer_free(tok);
    bq_bert_free(&m);
    return st;
}

/* ---- predict ---- */

int bq_cmd_predict(int argc, char **argv) {
    const char *model = NULL, *truncation = "head";
    int max_seq_len = 512, threads = 0, json = 0;
    const BqArgSpec specs[] = {
        {"model", BQ_ARG_STR, &model, "native checkpoint (or HF directory)", 1, 0, 0},
        {"max-seq-len", BQ_ARG_INT, &max_seq_len, "tokens per text incl. [CLS]/[SEP]", 0, 8, 8192},
        {"truncation", BQ_ARG_STR, &truncation, "head, tail or head_tail", 0, 0, 0},
        {"threads", BQ_ARG_INT, &threads, "threads (0: all cores)", 0, 0, 4096},
        {"json", BQ_ARG_FLAG, &json, "one JSON object per line", 0, 0, 0},
    };
    BqArgs args = {.cmd = "predict", .usage = "--model CKPT [TEXT...]   (no TEXT: one text per stdin line)",
                   .summary = "Classify texts: prints the label and its probability per text.",
                   .specs = specs, .nspecs = (int)(sizeof specs / sizeof *specs), .max_positional = 1 << 20,
                   .positional_name = "TEXT"};
    int st = bq_args_parse(&args, argc, argv);
    if (st || args.help) return st;
    BqTruncation trunc = BQ_TRUNC_HEAD;
    if (!strcmp(truncation, "tail")) trunc = BQ_TRUNC_TAIL;
    else if (!strcmp(truncation, "head_tail") || !strcmp(truncation, "head-tail")) trunc = BQ_TRUNC_HEAD_TAIL;
    else if (strcmp(truncation, "head")) return bq_err(BQ_EINVAL, "--truncation: '%s' is not head, tail or head_tail", truncation);
    bq_runtime_set_threads(threads);

    BqTokenizer *tok = NULL;
    BqBert m;
    memset(&m, 0, sizeof m);
    BqArena act = {0};
    char *report = NULL, *line = NULL;
    size_t line_cap = 0;
    int32_t *ids = NULL, *types32 = NULL;
    float *mask = NULL;
    if ((st = load_model_and_tok(&m, &tok, model, 0, &report))) goto cleanup;
    if (max_seq_len > m.cfg.max_position_embeddings) max_seq_len = m.cfg.max_position_embeddings;
    if ((st = bq_arena_init(&act, ACT_RESERVE, "activations"))) goto cleanup;
    ids = bq_malloc(sizeof(int32_t) * (size_t)max_seq_len);
    types32 = bq_malloc(sizeof(int32_t) * (size_t)max_seq_len);
    mask = bq_malloc(sizeof(float) * (size_t)max_seq_len);
    int C = m.cfg.num_labels;
    for (int64_t idx = 0;; idx++) {
        const char *text;
        size_t len;
        if (args.npositional > 0) {
            if (idx >= args.npositional) break;
            text = args.positional[idx];
            len = strlen(text);
        } else {
            ssize_t n = getline(&line, &line_cap, stdin);
            if (n < 0) break;
            while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
            text = line;
            len = (size_t)n;
        }
        int64_t T = bq_tokenizer_encode(tok, text, len, NULL, 0, max_seq_len, trunc, ids, types32, max_seq_len);
        for (int64_t t = 0; t < T; t++) mask[t] = 1;
        int32_t label = -1;
        int64_t ex = idx;
        BqBatch b = {.B = 1, .T = T, .input_ids = ids, .attention_mask = mask, .token_type_ids = types32,
                     .labels = &label, .example_index = &ex};
        BqCtx ctx = {.act = &act, .tape = NULL, .training = 0};
        BqTensor *logits = NULL;
        BqBertInput in = bq_batch_input(&b);
        if ((st = bq_bert_forward(&m, &ctx, &in, &logits, NULL))) goto cleanup;
        const float *z = logits->data;
        int arg = bq_argmax(z, C);
        double mx = z[arg], s = 0;
        for (int k = 0; k < C; k++) s += exp(z[k] - mx);
        double prob = 1.0 / s;
        char nb[32];
        const char *name = label_name(&m, arg, nb, sizeof nb);
        if (json) {
            json_t *j = json_pack("{s:s, s:i, s:f}", "label", name, "label_id", arg, "probability", prob);
            json_object_set_new(j, "text", json_stringn(text, len));
            char *o = json_dumps(j, JSON_COMPACT);
            printf("%s\n", o);
            free(o);
            json_decref(j);
        } else {
            printf("%s\t%.4f\t%.*s\n", name, prob, (int)(len > 60 ? 60 : len), text);
        }
        fflush(stdout);
        bq_arena_rewind(&act, 0);
    }

cleanup:
    free(report);
    free(line);
    free(ids);
    free(types32);
    free(mask);
    if (act.base) bq_arena_free(&act);
    if (tok) bq_tokenizer_free(tok);
    bq_bert_free(&m);
    return st;
}
