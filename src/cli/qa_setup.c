/* The task choice and the question-answering flags of the CLI (see src/cli/qa_setup.h). Reference
 * for the defaults: Hugging Face transformers examples/pytorch/question-answering/run_qa.py
 * (max_seq_length 384, doc_stride 128, n_best_size 20, max_answer_length 30). */
#include "src/cli/qa_setup.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "export/ckpt.h"

const char *const bq_cli_task_names[3] = {"qa", "cls", NULL};

void bq_cli_qa_default(BqCliQa *q) {
    memset(q, 0, sizeof *q);
    q->task = -1;
    q->n_best = 20;
    q->max_answer_len = 30;
}

/* bq_args_given for a flag the command may not have (then: not given). */
static int given(const BqArgs *a, const char *name) {
    for (int i = 0; i < a->nspecs; i++)
        if (!strcmp(a->specs[i].name, name)) return a->given[i];
    return 0;
}

int bq_cli_task_resolve(const BqArgs *args, const BqCliQa *q, const char *dir, int *qa) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    BqBertConfig cfg;
    int st = bq_config_load(&cfg, p);
    if (st) return st;
    BqHead head = cfg.head;
    bq_config_free(&cfg);
    *qa = q->task < 0 ? head == BQ_HEAD_QA : q->task == BQ_CLI_TASK_QA;
    if (!*qa && head == BQ_HEAD_QA)
        return bq_err(BQ_EINVAL, "--task cls: %s is a question-answering model (BertForQuestionAnswering); start a "
                      "classifier from a classification checkpoint or a pre-trained encoder", dir);
    static const char *const qa_only[] = {"doc-stride", "max-query-length", "n-best", "max-answer-len", "question",
                                          "context"};
    static const char *const cls_only[] = {"truncation",   "text-column",     "text-pair-column", "label-column",
                                           "keep-fp32",    "val-fraction",    "eval-every",       "evals-per-epoch",
                                           "no-save-best", "split",           "bucket"};
    for (size_t i = 0; i < sizeof qa_only / sizeof *qa_only; i++)
        if (!*qa && given(args, qa_only[i]))
            return bq_err(BQ_EINVAL, "--%s applies to question answering only (%s has a classification head; "
                          "--task qa to train one)", qa_only[i], dir);
    for (size_t i = 0; i < sizeof cls_only / sizeof *cls_only; i++)
        if (*qa && given(args, cls_only[i]))
            return bq_err(BQ_EINVAL, "--%s applies to classification only (the task is question answering)",
                          cls_only[i]);
    return BQ_OK;
}

int bq_cli_task_check_data(int qa, const char *data) {
    size_t n = data ? strlen(data) : 0;
    if (qa || n < 5 || strcmp(data + n - 5, ".json")) return BQ_OK;
    FILE *f = fopen(data, "rb");
    if (!f) return BQ_OK; /* the data loader names the problem */
    char *buf = bq_malloc(65537);
    size_t got = fread(buf, 1, 65536, f);
    fclose(f);
    buf[got] = 0;
    int squad = strstr(buf, "\"paragraphs\"") != NULL;
    free(buf);
    if (squad)
        return bq_err(BQ_EINVAL, "--data %s: SQuAD question-answering data, but the model has a classification head "
                      "(--task qa trains a question-answering head on its encoder)", data);
    return BQ_OK;
}

int bq_qa_model_load(BqBert *m, BqTokenizer **tok, const char *dir, uint64_t seed, const char *tag) {
    char vocab[4200], *report = NULL;
    BqRng rng;
    bq_rng_seed(&rng, seed);
    int st = bq_model_load_any(m, dir, 0, &rng, &report);
    /* the loader's note on a fresh classifier would mislead: that classifier is dropped below */
    if (!st && report && m->cfg.head == BQ_HEAD_QA) fprintf(stderr, "[%s] %s\n", tag, report);
    free(report);
    if (st) return st;
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
    if ((st = bq_tokenizer_load(tok, vocab, NULL))) return st;
    if (m->cfg.head == BQ_HEAD_QA) return BQ_OK;
    fprintf(stderr, "[%s] %s is not a question-answering model: keeping its encoder, dropping any pooler and "
            "classifier, qa_outputs newly initialized (seed %llu)\n", tag, dir, (unsigned long long)seed);
    memset(&m->data, 0, sizeof m->data); /* its sequence length was chosen for another task */
    return bq_bert_set_head(m, BQ_HEAD_QA, &rng);
}

int bq_qa_model_load_engine(BqBert *m, BqTokenizer **tok, const char *dir, BqCliEngine engine, const char *tag,
                            BqInt8Engine **eng, const char **name) {
    char p[4200];
    snprintf(p, sizeof p, "%s/config.json", dir);
    BqBertConfig cfg;
    int qa = bq_ckpt_is_native(dir) && bq_config_load(&cfg, p) == BQ_OK;
    if (qa) {
        qa = cfg.head == BQ_HEAD_QA;
        bq_config_free(&cfg);
    } else {
        bq_err_clear(); /* bq_qa_model_load names the problem */
    }
    if (qa) return bq_cli_model_load_engine(m, tok, dir, engine, tag, eng, name);
    int st = bq_qa_model_load(m, tok, dir, 0, tag);
    return st ? st : bq_cli_engine_select(eng, m, engine, "--engine", tag, name);
}

int bq_qa_data_load(BqSquadSet **out, BqCliData *d, const BqBert *m, const BqTokenizer *tok, BqCliQa *q,
                    int64_t max_examples, const char *tag) {
    *out = NULL;
    const char *from = "flag";
    int L = d->max_seq_len;
    if (L <= 0) {
        L = m->data.max_seq_len > 0 ? m->data.max_seq_len : BQ_QA_MAX_SEQ_LEN;
        from = m->data.max_seq_len > 0 ? "checkpoint" : "default";
    }
    if (q->doc_stride <= 0) q->doc_stride = m->data.doc_stride > 0 ? m->data.doc_stride : BQ_QA_DOC_STRIDE;
    if (q->max_query_length <= 0)
        q->max_query_length = m->data.max_query_length > 0 ? m->data.max_query_length : BQ_QA_MAX_QUERY_LENGTH;
    if (L > m->cfg.max_position_embeddings)
        return bq_err(BQ_EINVAL, "--max-seq-len: %d exceeds the model's max_position_embeddings %d", L,
                      m->cfg.max_position_embeddings);
    if (q->max_query_length + 4 > L)
        return bq_err(BQ_EINVAL, "--max-query-length: %d leaves no room for context in %d tokens", q->max_query_length, L);
    if (q->doc_stride >= L - q->max_query_length - 3)
        return bq_err(BQ_EINVAL, "--doc-stride: %d must be below the %d context tokens of a window (--max-seq-len %d "
                      "minus --max-query-length %d minus 3)", q->doc_stride, L - q->max_query_length - 3, L,
                      q->max_query_length);
    memset(&d->used, 0, sizeof d->used);
    d->used.max_seq_len = L;
    d->used.doc_stride = q->doc_stride;
    d->used.max_query_length = q->max_query_length;
    BqSquadOptions o;
    bq_squad_options_default(&o);
    o.max_seq_len = L;
    o.doc_stride = q->doc_stride;
    o.max_query_length = q->max_query_length;
    o.max_examples = max_examples;
    o.cache_dir = d->no_cache ? "" : d->cache_dir;
    o.doc = q->doc;
    size_t n = strlen(d->path);
    int json = n >= 5 && !strcmp(d->path + n - 5, ".json");
    int st = bq_squad_load(out, d->path, tok, &o);
    if (st && !json && !q->doc)
        return bq_err(st, "--data %s: not a SQuAD v1.1 JSON file; the model answers questions (--task qa), give a "
                      "classification model or a .json SQuAD file", d->path);
    if (st) return st;
    const BqSquadSet *s = *out;
    fprintf(stderr, "[%s] %s: %lld questions, %lld windows of %lld tokens (%s), doc stride %d, query <= %d%s\n", tag,
            d->path, (long long)s->n_examples, (long long)s->n, (long long)s->T, from, q->doc_stride,
            q->max_query_length, s->from_cache ? ", from cache" : "");
    return BQ_OK;
}

