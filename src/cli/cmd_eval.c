/* `bertqat eval` (accuracy, precision, recall, F1, confusion matrix, throughput of a checkpoint on a
 * labelled split) and `bertqat predict` (label and probability per text, from arguments or stdin
 * lines). Metric definitions: src/metrics.h (sklearn semantics). For a question-answering model
 * (src/qa.h): eval prints the official SQuAD v1.1 exact match and F1 and writes the official
 * {id: answer} predictions; predict answers --question/--context or every line of a JSONL file. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "datasets/dataset.h"
#include "export/ckpt.h"
#include "src/cli/args.h"
#include "src/cli/cli.h"
#include "src/cli/cmd_common.h"
#include "src/dist.h"
#include "src/metrics.h"
#include "src/cli/qa_setup.h"
#include "src/train.h"

#define ACT_RESERVE ((size_t)64 << 30)

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
    int64_t calls; /* under mpirun: batches written; rank r's call i is global batch i·N + r */
} PredWriter;

static void pred_write(void *user, const BqBatch *b, const float *probs) {
    PredWriter *w = user;
    int64_t batch = w->calls++ * bq_dist_size() + bq_dist_rank();
    for (int64_t i = 0; i < b->B; i++) {
        const float *p = probs + i * w->C;
        int k = bq_argmax(p, w->C);
        if (bq_dist_size() > 1) fprintf(w->f, "%lld\t", (long long)batch); /* the key bq_dist_gather_lines drops */
        fprintf(w->f, "%lld\t%d\t%d\t%.6f\n", (long long)b->example_index[i], b->labels[i], k, p[k]);
    }
}

/* The metrics as a table or (json) one JSON object on stdout. */
static void eval_print(const BqBert *m, const BqConfusion *conf, const BqCliData *d, const char *model,
                       const char *split, double secs, int batch_size, const char *engine, int json) {
    BqMetrics mt = bq_metrics_compute(conf);
    double eps = mt.n / (secs > 1e-9 ? secs : 1e-9);
    int C = m->cfg.num_labels;
    char nb[32];
    if (json) {
        json_t *j = json_object();
        json_object_set_new(j, "model", json_string(model));
        json_object_set_new(j, "data", json_string(d->path));
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
        json_object_set_new(j, "max_seq_len", json_integer(d->used.max_seq_len));
        json_object_set_new(j, "truncation", json_string(bq_truncation_name(d->used.truncation)));
        json_object_set_new(j, "batch_size", json_integer(batch_size));
        json_object_set_new(j, "threads", json_integer(bq_runtime_threads()));
        json_object_set_new(j, "engine", json_string(engine));
        json_t *labels = json_array(), *cm = json_array();
        for (int i = 0; i < C; i++) {
            json_array_append_new(labels, json_string(label_name(m, i, nb, sizeof nb)));
            json_t *row = json_array();
            for (int k = 0; k < C; k++) json_array_append_new(row, json_integer(conf->cm[i * C + k]));
            json_array_append_new(cm, row);
        }
        json_object_set_new(j, "labels", labels);
        json_object_set_new(j, "confusion_matrix", cm);
        char *s = json_dumps(j, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
        json_decref(j);
    } else {
        printf("model      %s\ndata       %s (%s split, %lld examples, seq %d, truncation %s)\n", model, d->path, split,
               (long long)mt.n, d->used.max_seq_len, bq_truncation_name(d->used.truncation));
        printf("accuracy   %.4f\nprecision  %.4f\nrecall     %.4f\nf1         %.4f   (%s)\nloss       %.4f\n",
               mt.accuracy, mt.precision, mt.recall, mt.f1, C == 2 ? "binary, positive class 1" : "macro", mt.loss);
        printf("speed      %.1f examples/s (%.2fs, %d threads)\n", eps, secs, bq_runtime_threads());
        printf("engine     %s\n", engine);
        printf("confusion matrix (rows: true, columns: predicted)\n%12s", "");
        for (int k = 0; k < C; k++) printf(" %10.10s", label_name(m, k, nb, sizeof nb));
        printf("\n");
        for (int i = 0; i < C; i++) {
            printf("%12.12s", label_name(m, i, nb, sizeof nb));
            for (int k = 0; k < C; k++) printf(" %10lld", (long long)conf->cm[i * C + k]);
            printf("\n");
        }
    }
}

/* ---- question answering ---- */

static int eval_qa(const char *model, BqCliData *d, BqCliQa *q, int samples, int batch_size, int json, BqCliEngine engine, const char *predictions, BqPrecision prec) {
    BqTokenizer *tok = NULL;
    BqBert m;
    memset(&m, 0, sizeof m);
    BqSquadSet *s = NULL;
    BqInt8Engine *eng = NULL;
    const char *engine_name = NULL;
    char **answers = NULL;
    BqSquadScore sc;
    double secs = 0;
    int st;
    if ((st = bq_qa_model_load_engine(&m, &tok, model, engine, "eval", &eng, &engine_name))) goto cleanup;
    m.prec = prec;
    if ((st = bq_qa_data_load(&s, d, &m, tok, q, samples, "eval")) ||
        (st = bq_qa_answer(&m, eng, s, q->n_best, q->max_answer_len, batch_size, &sc, &answers, &secs)))
        goto cleanup;
    if (predictions && (st = bq_squad_write_predictions(predictions, s, answers))) goto cleanup;
    double qps = (double)sc.n / (secs > 1e-9 ? secs : 1e-9);
    if (json) {
        json_t *j = json_object();
        json_object_set_new(j, "model", json_string(model));
        json_object_set_new(j, "data", json_string(d->path));
        json_object_set_new(j, "task", json_string("qa"));
        json_object_set_new(j, "examples", json_integer(sc.n));
        json_object_set_new(j, "windows", json_integer(s->n));
        json_object_set_new(j, "exact_match", json_real(sc.exact_match));
        json_object_set_new(j, "f1", json_real(sc.f1));
        json_object_set_new(j, "seconds", json_real(secs));
        json_object_set_new(j, "examples_per_s", json_real(qps));
        json_object_set_new(j, "max_seq_len", json_integer(s->T));
        json_object_set_new(j, "doc_stride", json_integer(q->doc_stride));
        json_object_set_new(j, "max_query_length", json_integer(q->max_query_length));
        json_object_set_new(j, "n_best", json_integer(q->n_best));
        json_object_set_new(j, "max_answer_len", json_integer(q->max_answer_len));
        json_object_set_new(j, "batch_size", json_integer(batch_size));
        json_object_set_new(j, "threads", json_integer(bq_runtime_threads()));
        json_object_set_new(j, "engine", json_string(engine_name));
        char *txt = json_dumps(j, JSON_INDENT(2));
        printf("%s\n", txt);
        free(txt);
        json_decref(j);
    } else {
        printf("model        %s\ndata         %s (%lld questions, %lld windows, seq %lld, doc stride %d, query <= %d)\n",
               model, d->path, (long long)sc.n, (long long)s->n, (long long)s->T, q->doc_stride, q->max_query_length);
        printf("exact match  %.2f\nf1           %.2f\n", sc.exact_match, sc.f1);
        printf("speed        %.1f questions/s (%.2fs, %d threads)\nengine       %s\n", qps, secs, bq_runtime_threads(),
               engine_name);
        if (predictions) printf("predictions  %s\n", predictions);
    }
cleanup:
    if (answers) bq_squad_answers_free(answers, s->n_examples);
    bq_squad_free(s);
    if (tok) bq_tokenizer_free(tok);
    bq_int8_free(eng);
    bq_bert_free(&m);
    return st;
}

/* The questions to answer as a SQuAD v1.1 document in memory (*out, the caller's reference): one
 * paragraph per question; each gets the placeholder reference answer "the context's first character at
 * 0", which the reader requires and predict never scores. From --question/--context (jsonl NULL) or
 * a JSONL file with "question" and "context" fields (and an optional "id"; default the line number). */
static int qa_questions_doc(json_t **out, const char *question, const char *context, const char *jsonl) {
    json_t *data = json_array();
    int st = BQ_OK;
    *out = NULL;
    FILE *in = NULL;
    char *line = NULL;
    size_t cap = 0;
    if (jsonl && !(in = fopen(jsonl, "r"))) {
        st = bq_err(BQ_EIO, "--data %s: %s", jsonl, strerror(errno));
        goto cleanup;
    }
    for (int64_t ln = 1;; ln++) {
        json_t *row = NULL;
        const char *q = question, *c = context;
        char idb[32];
        snprintf(idb, sizeof idb, "%lld", (long long)ln);
        const char *id = idb;
        if (in) {
            ssize_t n = getline(&line, &cap, in);
            if (n < 0) break;
            while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
            if (n == 0) continue;
            json_error_t e;
            row = json_loads(line, 0, &e);
            json_t *jq = json_object_get(row, "question"), *jc = json_object_get(row, "context"),
                   *ji = json_object_get(row, "id");
            if (!row || !json_is_string(jq) || !json_is_string(jc) || (ji && !json_is_string(ji))) {
                json_decref(row);
                st = bq_err(BQ_EFORMAT, "--data %s: line %lld: %s", jsonl, (long long)ln,
                            !row ? e.text : "needs string fields \"question\" and \"context\" (and \"id\" if any)");
                goto cleanup;
            }
            q = json_string_value(jq), c = json_string_value(jc);
            if (ji) id = json_string_value(ji);
        } else if (ln > 1) {
            break;
        }
        if (!*c || !*q) {
            json_decref(row);
            if (in)
                st = bq_err(BQ_EINVAL, "--data %s: line %lld: empty %s", jsonl, (long long)ln, *q ? "context" : "question");
            else
                st = bq_err(BQ_EINVAL, "--%s: empty", *q ? "context" : "question");
            goto cleanup;
        }
        size_t first = 1; /* the placeholder answer: the first UTF-8 character */
        while (c[first] && ((unsigned char)c[first] & 0xC0) == 0x80) first++;
        json_t *qa = json_pack("{s:s, s:s, s:[{s:s%, s:i}]}", "id", id, "question", q, "answers", "text", c, first,
                               "answer_start", 0);
        json_t *para = json_pack("{s:s, s:[o]}", "context", c, "qas", qa);
        json_array_append_new(data, json_pack("{s:s, s:[o]}", "title", "", "paragraphs", para));
        json_decref(row);
    }
    if (json_array_size(data) == 0) {
        st = bq_err(BQ_EINVAL, "--data %s: no questions", jsonl);
        goto cleanup;
    }
    *out = json_pack("{s:s, s:O}", "version", "1.1", "data", data);
cleanup:
    if (in) fclose(in);
    free(line);
    json_decref(data);
    return st;
}

/* predict for a question-answering model: one line per question, "id<TAB>answer" (--json: an object
 * with id, question and answer). A .json --data is read as SQuAD v1.1 itself. */
static int predict_qa(const char *model, BqCliData *d, BqCliQa *q, const char *question, const char *context,
                      int json, BqCliEngine engine, BqPrecision prec) {
    BqTokenizer *tok = NULL;
    BqBert m;
    memset(&m, 0, sizeof m);
    BqSquadSet *s = NULL;
    BqInt8Engine *eng = NULL;
    const char *engine_name = NULL, *data = d->path;
    char **answers = NULL;
    json_t *doc = NULL;
    int st;
    BqSquadScore sc;
    size_t n = data ? strlen(data) : 0;
    if (!data && (!question || !context)) return bq_err(BQ_EINVAL, "predict: a question-answering model needs "
                                                        "--question and --context, or --data FILE.jsonl");
    if (data && (question || context)) return bq_err(BQ_EINVAL, "predict: --data and --question/--context exclude each other");
    if (!data || !(n >= 5 && !strcmp(data + n - 5, ".json"))) {
        if ((st = qa_questions_doc(&doc, question, context, data))) return st;
        q->doc = doc;
        if (!data) d->path = "--question/--context";
    }
    if ((st = bq_qa_model_load_engine(&m, &tok, model, engine, "predict", &eng, &engine_name))) goto cleanup;
    m.prec = prec;
    if ((st = bq_qa_data_load(&s, d, &m, tok, q, 0, "predict")) ||
        (st = bq_qa_answer(&m, eng, s, q->n_best, q->max_answer_len, 32, &sc, &answers, NULL)))
        goto cleanup;
    for (int64_t i = 0; i < s->n_examples; i++) {
        const BqSquadExample *x = &s->examples[i];
        if (json) {
            json_t *j = json_pack("{s:s, s:s, s:s}", "id", x->id, "question", x->question, "answer", answers[i]);
            char *l = json_dumps(j, JSON_COMPACT);
            printf("%s\n", l);
            free(l);
            json_decref(j);
        } else {
            printf("%s\t%s\n", x->id, answers[i]);
        }
    }
cleanup:
    if (answers) bq_squad_answers_free(answers, s->n_examples);
    json_decref(doc);
    q->doc = NULL;
    d->path = data;
    bq_squad_free(s);
    if (tok) bq_tokenizer_free(tok);
    bq_int8_free(eng);
    bq_bert_free(&m);
    return st;
}

/* eval's examples: split of d's data encoded as the model was trained (--samples caps the examples
 * kept; val and train are selected as finetune selects them). Errors: loading, a split without labels,
 * more labels in the data than the model has (BQ_EINVAL naming the data). */
static int eval_data_load(BqDataset **out, const BqCliData *d, const BqBert *m, const BqTokenizer *tok,
                          const char *split, int seed, int samples, int train_samples, double val_fraction) {
    BqDataSpec spec;
    bq_cli_data_spec(&spec, d, split, (uint64_t)seed);
    spec.eval_samples = !strcmp(split, "test") ? samples : 0;
    spec.train_samples = train_samples;
    spec.val_fraction = val_fraction;
    int st = bq_dataset_load(out, &spec, tok);
    if (st) return st;
    BqDataset *ds = *out;
    if (samples > 0 && ds->n > samples) ds->n = samples;
    if (ds->nlabels < 1) return bq_err(BQ_EINVAL, "%s: split %s has no labels to evaluate against", d->path, split);
    if (ds->nlabels > m->cfg.num_labels)
        return bq_err(BQ_EINVAL, "%s: data has %d labels, the model %d", d->path, ds->nlabels, m->cfg.num_labels);
    return BQ_OK;
}

/* Opens --predictions for writing: under mpirun each rank keeps its batches' lines in memory
 * (*pred_mem, *pred_len), which rank 0 gathers and writes in pred_finish; in one process the lines go
 * straight to pred_tmp (cap bytes; PREDICTIONS.tmp). pw->C = C labels. Errors: BQ_ENOMEM or BQ_EIO
 * naming --predictions. */
static int pred_open(PredWriter *pw, const char *predictions, char *pred_tmp, size_t cap, int C, char **pred_mem,
                     size_t *pred_len) {
    if (bq_dist_size() > 1 && !(pw->f = open_memstream(pred_mem, pred_len)))
        return bq_err(BQ_ENOMEM, "--predictions: %s", strerror(errno));
    if (bq_dist_size() > 1) pw->C = C;
    if (bq_dist_size() == 1) {
        snprintf(pred_tmp, cap, "%s.tmp", predictions);
        if (!(pw->f = fopen(pred_tmp, "w")))
            return bq_err(BQ_EIO, "--predictions %s: %s", predictions, strerror(errno));
        pw->C = C;
    }
    return BQ_OK;
}

/* Completes --predictions after the evaluation: under mpirun rank 0 gathers every rank's lines (in rank
 * order of the batches) into pred_tmp; then the file is closed and renamed to PREDICTIONS. Nothing when
 * pw has no file. Errors: BQ_EIO naming --predictions. */
static int pred_finish(PredWriter *pw, const char *predictions, char *pred_tmp, size_t cap, char **pred_mem,
                       const size_t *pred_len) {
    int st;
    if (pw->f && bq_dist_size() > 1) {
        fclose(pw->f);
        pw->f = NULL;
        if (bq_dist_rank() == 0) {
            snprintf(pred_tmp, cap, "%s.tmp", predictions);
            if (!(pw->f = fopen(pred_tmp, "w")))
                return bq_err(BQ_EIO, "--predictions %s: %s", predictions, strerror(errno));
        }
        bq_dist_gather_lines(*pred_mem, *pred_len, pw->f); /* the length open_memstream set at fclose */
        free(*pred_mem);
        *pred_mem = NULL;
    }
    if (pw->f) {
        st = bq_fclose_written(pw->f, pred_tmp);
        pw->f = NULL;
        if (st) {
            bq_err_ctx(st, "--predictions");
            return st;
        }
        return bq_rename_durable(pred_tmp, predictions);
    }
    return BQ_OK;
}

int bq_cmd_eval(int argc, char **argv) {
    const char *model = NULL, *split = "test", *predictions = NULL, *engine_name = NULL;
    BqCliEngine engine = BQ_CLI_ENGINE_AUTO;
    int samples = 0, batch_size = 64, json = 0, seed = 42;
    double val_fraction = 0.1;
    int train_samples = 0;
    BqCliData d = BQ_CLI_DATA_INIT;
    BqCliQa q;
    bq_cli_qa_default(&q);
    const BqArgSpec specs[] = {
        {"model", BQ_ARG_STR, &model, "native checkpoint (or HF directory)", 1, 0, 0},
        {"data", BQ_ARG_STR, &d.path, "IMDB archive/folder, CSV, TSV or JSONL; question answering: SQuAD v1.1 JSON "
         "(dev set)", 1, 0, 0},
        {"split", BQ_ARG_STR, &split, "test, val or train", 0, 0, 0},
        {"samples", BQ_ARG_INT, &samples, "examples to evaluate (0: all; test: seeded selection)", 0, 0, 1e9},
        BQ_CLI_DATA_SPECS(d),
        {"batch-size", BQ_ARG_INT, &batch_size, "examples per forward", 0, 1, 65536},
        {"seed", BQ_ARG_INT, &seed, "seed of the example selection (as in finetune)", 0, 0, 2147483647},
        {"val-fraction", BQ_ARG_FLOAT, &val_fraction, "for --split val: as in finetune", 0, 0, 0.9},
        {"train-samples", BQ_ARG_INT, &train_samples, "for --split val/train: as in finetune", 0, 0, 1e9},
        {"json", BQ_ARG_FLAG, &json, "print one JSON object instead of a table", 0, 0, 0},
        {"engine", BQ_ARG_ENUM, BQ_ARG_ENUM_DST(&engine), BQ_CLI_ENGINE_HELP, 0, 0, 0, bq_cli_engine_names},
        {"predictions", BQ_ARG_OUT, &predictions, "write index, label, predicted label, its probability per example "
         "(TSV) to this file; question answering: the official {id: answer} JSON", 0, 0, 0},
        BQ_CLI_TASK_SPEC(q),
        BQ_CLI_QA_WINDOW_SPECS(q),
        BQ_CLI_QA_POST_SPECS(q),
    };
    BqArgs args = {.cmd = "eval", .usage = "--model CKPT --data PATH [options]",
                   .summary = "Evaluate a checkpoint: accuracy, precision, recall, F1, confusion matrix, examples/s; a "
                              "question-answering model: SQuAD exact match and F1.",
                   .specs = specs, .nspecs = (int)(sizeof specs / sizeof *specs),
                   .common = BQ_ARGS_THREADS | BQ_ARGS_PRECISION};
    int st = bq_args_parse(&args, argc, argv);
    if (st || args.help) return st;
    if (strcmp(split, "test") && strcmp(split, "val") && strcmp(split, "train"))
        return bq_err(BQ_EINVAL, "--split: '%s' is not test, val or train", split);
    if (predictions && (st = bq_check_writable_parent(predictions))) return bq_err_ctx(st, "--predictions");
    bq_args_header(&args);
    int qa = 0;
    if ((st = bq_cli_task_resolve(&args, &q, model, &qa)) || (st = bq_cli_task_check_data(qa, d.path))) return st;
    if (qa) return eval_qa(model, &d, &q, samples, batch_size, json, engine, predictions, args.prec);

    BqTokenizer *tok = NULL;
    BqDataset *ds = NULL;
    BqBatcher bt = {0};
    BqBert m;
    memset(&m, 0, sizeof m);
    BqArena act = {0};
    BqConfusion conf = {0};
    char pred_tmp[4200] = "";
    PredWriter pw = {0};
    BqInt8Engine *eng = NULL;
    if ((st = bq_cli_model_load_engine(&m, &tok, model, engine, "eval", &eng, &engine_name)) ||
        (st = bq_cli_data_resolve(&d, &m, "eval")))
        goto cleanup;
    m.prec = args.prec;
    if ((st = eval_data_load(&ds, &d, &m, tok, split, seed, samples, train_samples, val_fraction)))
        goto cleanup;
    if ((st = bq_arena_init(&act, ACT_RESERVE, "activations"))) goto cleanup;
    if ((st = bq_batcher_init(&bt, ds, batch_size, 0, (uint64_t)seed, 1))) goto cleanup;
    BqBatchSource src;
    BqBatcherSource bs;
    bq_batch_source_batcher(&src, &bs, &bt);
    bq_confusion_init(&conf, m.cfg.num_labels);
    char *pred_mem = NULL;
    size_t pred_len = 0;
    if (predictions && (st = pred_open(&pw, predictions, pred_tmp, sizeof pred_tmp, m.cfg.num_labels, &pred_mem,
                                       &pred_len)))
        goto cleanup;
    double t0 = bq_now();
    if ((st = bq_evaluate_engine(&m, eng, &src, &act, &conf, 0, pw.f ? pred_write : NULL, &pw))) goto cleanup;
    double secs = bq_now() - t0;
    if ((st = pred_finish(&pw, predictions, pred_tmp, sizeof pred_tmp, &pred_mem, &pred_len))) goto cleanup;
    eval_print(&m, &conf, &d, model, split, secs, batch_size, engine_name, json);

cleanup:
    if (pw.f) fclose(pw.f);
    if (st && pred_tmp[0]) remove(pred_tmp);
    if (conf.cm) bq_confusion_free(&conf);
    if (bt.ds) bq_batcher_free(&bt);
    if (act.base) bq_arena_free(&act);
    if (ds) bq_dataset_free(ds);
    if (tok) bq_tokenizer_free(tok);
    bq_int8_free(eng);
    bq_bert_free(&m);
    return st;
}

/* ---- predict ---- */

/* One example through the model (batch of 1, no padding): *label = argmax, *prob its softmax
 * probability. ids, types (T). */
static int predict_one(BqBert *m, BqInt8Engine *e, BqArena *act, const int32_t *ids, const int32_t *types, float *mask, int64_t T,
                       int *label, double *prob) {
    for (int64_t t = 0; t < T; t++) mask[t] = 1;
    int32_t none = -1;
    int64_t ex = 0;
    BqBatch b = {.B = 1, .T = T, .input_ids = (int32_t *)ids, .attention_mask = mask,
                 .token_type_ids = (int32_t *)types, .labels = &none, .example_index = &ex};
    BqCtx ctx = {.act = act, .tape = NULL, .training = 0, .prec = m->prec};
    BqTensor *logits = NULL;
    BqBertInput in = bq_batch_input(&b);
    int st = bq_infer_forward(m, e, &ctx, &in, &logits);
    if (st) return st;
    const float *z = logits->data;
    int C = m->cfg.num_labels, k = bq_argmax(z, C);
    double s = 0;
    for (int c = 0; c < C; c++) s += exp(z[c] - z[k]);
    *label = k;
    *prob = 1.0 / s;
    bq_arena_rewind(act, 0);
    return BQ_OK;
}

/* One output line: TEXT/stdin input "label<TAB>probability<TAB>text[<TAB>pair]" (texts cut at 60
 * bytes), --data input "index<TAB>label<TAB>probability[<TAB>true label]"; --json: one object. */
typedef struct PredictOut {
    const BqBert *m;
    int json;
    int64_t index;               /* --data: position in the source; -1 for TEXT/stdin */
    const char *text, *pair;     /* TEXT/stdin (pair NULL: single text) */
    size_t len, pair_len;
    const char *truth;           /* --data with labels: the example's label name, else NULL */
} PredictOut;

static void predict_print(const PredictOut *o, int k, double prob) {
    char nb[32];
    const char *name = label_name(o->m, k, nb, sizeof nb);
    if (o->json) {
        json_t *j = json_pack("{s:s, s:i, s:f}", "label", name, "label_id", k, "probability", prob);
        if (o->index >= 0) json_object_set_new(j, "index", json_integer(o->index));
        if (o->truth) json_object_set_new(j, "true_label", json_string(o->truth));
        if (o->text) json_object_set_new(j, "text", json_stringn(o->text, o->len));
        if (o->pair) json_object_set_new(j, "text_pair", json_stringn(o->pair, o->pair_len));
        char *line = json_dumps(j, JSON_COMPACT);
        printf("%s\n", line);
        free(line);
        json_decref(j);
    } else if (o->index >= 0) {
        printf("%lld\t%s\t%.4f%s%s\n", (long long)o->index, name, prob, o->truth ? "\t" : "", o->truth ? o->truth : "");
    } else {
        printf("%s\t%.4f\t%.*s", name, prob, (int)(o->len > 60 ? 60 : o->len), o->text);
        if (o->pair) printf("\t%.*s", (int)(o->pair_len > 60 ? 60 : o->pair_len), o->pair);
        printf("\n");
    }
    fflush(stdout);
}

/* --data: every example of the split, in source order. */
static int predict_dataset(BqBert *m, BqInt8Engine *e, BqArena *act, const BqDataset *ds, PredictOut *o) {
    int64_t cap = ds->max_len > 0 ? ds->max_len : 1;
    int64_t *at = bq_malloc(sizeof(int64_t) * (size_t)(ds->source_count + 1));
    int32_t *types = bq_malloc(sizeof(int32_t) * (size_t)cap);
    float *mask = bq_malloc(sizeof(float) * (size_t)cap);
    int st = BQ_OK;
    for (int64_t k = 0; k < ds->source_count; k++) at[k] = -1;
    for (int64_t i = 0; i < ds->n; i++) at[ds->source_index[i]] = i;
    for (int64_t k = 0; k < ds->source_count && !st; k++) {
        int64_t i = at[k];
        if (i < 0) continue;
        int64_t T = bq_dataset_len(ds, i);
        const int32_t *ids = ds->ids + ds->offsets[i];
        for (int64_t t = 0; t < T; t++) types[t] = ds->types[ds->offsets[i] + t];
        int label;
        double prob;
        if ((st = predict_one(m, e, act, ids, types, mask, T, &label, &prob))) break;
        o->index = k;
        o->truth = ds->labels[i] >= 0 ? ds->label_names[ds->labels[i]] : NULL;
        predict_print(o, label, prob);
    }
    free(at);
    free(types);
    free(mask);
    return st;
}

/* TEXT arguments, else stdin lines; with a pair model each record is "text<TAB>pair". */
static int predict_texts(BqBert *m, BqInt8Engine *e, BqArena *act, const BqTokenizer *tok, const BqCliData *d, const BqArgs *args,
                         PredictOut *o) {
    int L = d->used.max_seq_len, pairs = d->used.text_pair_column[0] != 0, st = BQ_OK;
    int32_t *ids = bq_malloc(sizeof(int32_t) * (size_t)L), *types = bq_malloc(sizeof(int32_t) * (size_t)L);
    float *mask = bq_malloc(sizeof(float) * (size_t)L);
    char *line = NULL;
    size_t cap = 0;
    for (int64_t idx = 0;; idx++) {
        char *text;
        size_t len;
        if (args->npositional > 0) {
            if (idx >= args->npositional) break;
            text = args->positional[idx];
            len = strlen(text);
        } else {
            ssize_t n = getline(&line, &cap, stdin);
            if (n < 0) break;
            while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
            text = line;
            len = (size_t)n;
        }
        char *tab = pairs ? memchr(text, '\t', len) : NULL;
        if (pairs && !tab) {
            st = bq_err(BQ_EFORMAT, "predict: %s %lld has no TAB between text and pair (the model reads sentence "
                        "pairs, column %s)", args->npositional ? "TEXT" : "stdin line", (long long)idx + 1,
                        d->used.text_pair_column);
            break;
        }
        o->text = text;
        o->len = tab ? (size_t)(tab - text) : len;
        o->pair = tab ? tab + 1 : NULL;
        o->pair_len = tab ? len - o->len - 1 : 0;
        int64_t T = bq_tokenizer_encode(tok, o->text, o->len, o->pair, o->pair_len, L, d->used.truncation, ids, types, L);
        int label;
        double prob;
        if ((st = predict_one(m, e, act, ids, types, mask, T, &label, &prob))) break;
        predict_print(o, label, prob);
    }
    free(line);
    free(ids);
    free(types);
    free(mask);
    return st;
}

int bq_cmd_predict(int argc, char **argv) {
    const char *model = NULL, *split = "test", *engine_name = NULL;
    BqCliEngine engine = BQ_CLI_ENGINE_AUTO;
    int json = 0, seed = 42;
    BqCliData d = BQ_CLI_DATA_INIT;
    BqCliQa q;
    bq_cli_qa_default(&q);
    const char *question = NULL, *context = NULL;
    const BqArgSpec specs[] = {
        {"model", BQ_ARG_STR, &model, "native checkpoint (or HF directory)", 1, 0, 0},
        BQ_CLI_DATA_SPECS(d),
        {"data", BQ_ARG_STR, &d.path, "classify every example of a CSV, TSV, JSONL or IMDB source instead of "
         "TEXT/stdin; prints index (position in the source), label, probability and the true label if any", 0, 0, 0},
        {"split", BQ_ARG_STR, &split, "with --data: test, val or train (as in eval)", 0, 0, 0},
        {"seed", BQ_ARG_INT, &seed, "with --data: seed of the split selection (as in finetune)", 0, 0, 2147483647},
        {"json", BQ_ARG_FLAG, &json, "one JSON object per line", 0, 0, 0},
        {"engine", BQ_ARG_ENUM, BQ_ARG_ENUM_DST(&engine), BQ_CLI_ENGINE_HELP, 0, 0, 0, bq_cli_engine_names},
        BQ_CLI_TASK_SPEC(q),
        {"question", BQ_ARG_STR, &question, "QA: the question (with --context)", 0, 0, 0},
        {"context", BQ_ARG_STR, &context, "QA: the text holding the answer (with --question); or --data FILE.jsonl "
         "with question/context (and optional id) fields, or a SQuAD .json; prints id<TAB>answer", 0, 0, 0},
        BQ_CLI_QA_WINDOW_SPECS(q),
        BQ_CLI_QA_POST_SPECS(q),
    };
    BqArgs args = {.cmd = "predict", .usage = "--model CKPT [TEXT...]   (no TEXT: one text per stdin line; QA: --question Q --context C)",
                   .summary = "Classify texts: prints the label and its probability per text, as label<TAB>probability"
                              "<TAB>text. A model trained on sentence pairs (or --text-pair-column) reads each TEXT or "
                              "stdin line as text<TAB>pair. Length, truncation and columns default to the checkpoint's "
                              "training settings; the settings used go to stderr.",
                   .specs = specs, .nspecs = (int)(sizeof specs / sizeof *specs), .max_positional = 1 << 20,
                   .positional_name = "TEXT", .common = BQ_ARGS_THREADS | BQ_ARGS_PRECISION};
    int st = bq_args_parse(&args, argc, argv);
    if (st || args.help) return st;
    if (d.path && args.npositional) return bq_err(BQ_EINVAL, "predict: --data and TEXT arguments exclude each other");
    int qa = 0;
    if ((st = bq_cli_task_resolve(&args, &q, model, &qa)) || (st = bq_cli_task_check_data(qa, d.path))) return st;
    if (qa && args.npositional) return bq_err(BQ_EINVAL, "predict: a question-answering model takes --question and --context, not TEXT");
    if (!qa && strcmp(split, "test") && strcmp(split, "val") && strcmp(split, "train"))
        return bq_err(BQ_EINVAL, "--split: '%s' is not test, val or train", split);
    bq_args_header(&args);
    if (qa) return predict_qa(model, &d, &q, question, context, json, engine, args.prec);

    BqTokenizer *tok = NULL;
    BqDataset *ds = NULL;
    BqBert m;
    memset(&m, 0, sizeof m);
    BqArena act = {0};
    PredictOut o = {.m = &m, .json = json, .index = -1};
    BqInt8Engine *eng = NULL;
    if ((st = bq_cli_model_load_engine(&m, &tok, model, engine, "predict", &eng, &engine_name)) ||
        (st = bq_cli_data_resolve(&d, &m, "predict")) ||
        (st = bq_arena_init(&act, ACT_RESERVE, "activations")))
        goto cleanup;
    m.prec = args.prec;
    if (d.path) {
        BqDataSpec spec;
        bq_cli_data_spec(&spec, &d, split, (uint64_t)seed);
        if ((st = bq_dataset_load(&ds, &spec, tok))) goto cleanup;
        st = predict_dataset(&m, eng, &act, ds, &o);
    } else {
        st = predict_texts(&m, eng, &act, tok, &d, &args, &o);
    }

cleanup:
    if (ds) bq_dataset_free(ds);
    if (act.base) bq_arena_free(&act);
    if (tok) bq_tokenizer_free(tok);
    bq_int8_free(eng);
    bq_bert_free(&m);
    return st;
}
