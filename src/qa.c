/* Question answering in the CLI (see src/qa.h). Reference for the defaults and the batching:
 * Hugging Face transformers examples/pytorch/question-answering/run_qa.py (max_seq_length 384,
 * doc_stride 128, n_best_size 20, max_answer_length 30; without --pad_to_max_length the collator pads
 * each batch to its longest window). */
#include "src/qa.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "export/ckpt.h"

#define ACT_RESERVE ((size_t)64 << 30) /* virtual; only touched pages cost memory */

void bq_cli_qa_default(BqCliQa *q) {
    memset(q, 0, sizeof *q);
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
    if (!q->task) *qa = head == BQ_HEAD_QA;
    else if (!strcmp(q->task, "qa")) *qa = 1;
    else if (!strcmp(q->task, "cls")) *qa = 0;
    else return bq_err(BQ_EINVAL, "--task: '%s' is not qa or cls", q->task);
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

int bq_qa_data_load(BqSquadSet **out, BqCliData *d, const BqBert *m, const BqTokenizer *tok, BqCliQa *q,
                    int64_t max_examples, int threads, const char *tag) {
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
    o.threads = threads;
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

/* ---- batch source ---- */

static int64_t qs_num(void *c) {
    BqQaSource *qs = c;
    return (qs->n + qs->B - 1) / qs->B;
}

static int qs_begin(void *c, int64_t epoch) {
    BqQaSource *qs = c;
    for (int64_t i = 0; i < qs->n; i++) qs->order[i] = (int32_t)i;
    if (qs->shuffle) {
        BqRng rng;
        bq_rng_seed(&rng, bq_hash64(qs->seed, (uint64_t)epoch));
        bq_rng_shuffle_i32(&rng, qs->order, qs->n);
    }
    qs->pos = 0;
    return BQ_OK;
}

static int qs_next(void *c, const BqBatch **out) {
    BqQaSource *qs = c;
    *out = NULL;
    if (qs->pos >= qs->n) return BQ_OK;
    int64_t B = qs->n - qs->pos < qs->B ? qs->n - qs->pos : qs->B;
    int64_t T = 1;
    for (int64_t i = 0; i < B; i++) {
        int64_t w = qs->order[qs->pos + i];
        qs->cur.example_index[i] = w;
        if (qs->s->len[w] > T) T = qs->s->len[w];
    }
    /* example_index doubles as the window list bq_squad_batch reads; it copies before overwriting */
    int64_t *win = qs->cur.example_index + qs->B;
    memcpy(win, qs->cur.example_index, sizeof(int64_t) * (size_t)B);
    bq_squad_batch(qs->s, win, B, T, &qs->cur, qs->cur.start_positions, qs->cur.end_positions);
    for (int64_t i = 0; i < B; i++) qs->cur.labels[i] = -1; /* no class labels */
    qs->pos += B;
    *out = &qs->cur;
    return BQ_OK;
}

void bq_qa_source_init(BqQaSource *qs, BqBatchSource *src, const BqSquadSet *s, int64_t n, int64_t B, int shuffle,
                       uint64_t seed) {
    BQ_CHECK(n >= 0 && n <= s->n && B >= 1);
    memset(qs, 0, sizeof *qs);
    qs->s = s, qs->n = n, qs->B = B, qs->shuffle = shuffle, qs->seed = seed;
    qs->order = bq_malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
    size_t bt = (size_t)(B * s->T);
    qs->cur.input_ids = bq_malloc(bt * sizeof(int32_t));
    qs->cur.token_type_ids = bq_malloc(bt * sizeof(int32_t));
    qs->cur.attention_mask = bq_malloc(bt * sizeof(float));
    qs->cur.labels = bq_malloc((size_t)B * sizeof(int32_t));
    qs->cur.example_index = bq_malloc(2 * (size_t)B * sizeof(int64_t));
    qs->cur.start_positions = bq_malloc((size_t)B * sizeof(int32_t));
    qs->cur.end_positions = bq_malloc((size_t)B * sizeof(int32_t));
    src->ctx = qs;
    src->num_batches = qs_num;
    src->begin_epoch = qs_begin;
    src->next = qs_next;
}

void bq_qa_source_free(BqQaSource *qs) {
    free(qs->order);
    free(qs->cur.input_ids);
    free(qs->cur.token_type_ids);
    free(qs->cur.attention_mask);
    free(qs->cur.labels);
    free(qs->cur.example_index);
    free(qs->cur.start_positions);
    free(qs->cur.end_positions);
    memset(qs, 0, sizeof *qs);
}

/* ---- inference ---- */

int bq_qa_logits(BqBert *m, BqInt8Engine *e, const BqSquadSet *s, int64_t B, float *start, float *end) {
    BqArena act = {0};
    BqQaSource qs;
    BqBatchSource src;
    int st = bq_arena_init(&act, ACT_RESERVE, "activations");
    if (st) return st;
    /* padding columns are left out of the n-best ranking (datasets/squad.h) */
    for (int64_t i = 0; i < s->n * s->T; i++) start[i] = end[i] = -INFINITY;
    bq_qa_source_init(&qs, &src, s, s->n, B, 0, 0);
    if ((st = src.begin_epoch(src.ctx, 0))) goto cleanup;
    for (;;) {
        const BqBatch *b = NULL;
        if ((st = src.next(src.ctx, &b)) || !b) break;
        BqCtx ctx = {.act = &act, .tape = NULL, .training = 0, .prec = m->prec};
        BqBertInput in = bq_batch_input(b);
        in.start_positions = in.end_positions = NULL;
        BqTensor *lg = NULL;
        if ((st = bq_infer_forward(m, e, &ctx, &in, &lg))) break;
        for (int64_t i = 0; i < b->B; i++) {
            int64_t w = b->example_index[i];
            for (int64_t t = 0; t < s->len[w]; t++) { /* the batch's padding stays -INFINITY */
                start[w * s->T + t] = lg->data[(i * b->T + t) * 2];
                end[w * s->T + t] = lg->data[(i * b->T + t) * 2 + 1];
            }
        }
        bq_arena_rewind(&act, 0);
    }
cleanup:
    bq_qa_source_free(&qs);
    bq_arena_free(&act);
    return st;
}

int bq_qa_answer(BqBert *m, BqInt8Engine *e, const BqSquadSet *s, const BqCliQa *q, int64_t B, BqSquadScore *score,
                 char ***answers, double *seconds) {
    if (answers) *answers = NULL;
    float *start = bq_malloc(sizeof(float) * (size_t)(s->n * s->T + 1));
    float *end = bq_malloc(sizeof(float) * (size_t)(s->n * s->T + 1));
    char **ans = NULL;
    double t0 = bq_now();
    int st = bq_qa_logits(m, e, s, B, start, end);
    if (!st) st = bq_squad_postprocess(s, start, end, q->n_best, q->max_answer_len, &ans);
    if (seconds) *seconds = bq_now() - t0;
    if (!st) bq_squad_score(s, ans, score);
    free(start);
    free(end);
    if (!st && answers) *answers = ans;
    else if (ans) bq_squad_answers_free(ans, s->n_examples);
    return st;
}
