/* Question answering on SQuAD windows (see src/qa.h). Reference for the batching: Hugging Face
 * transformers examples/pytorch/question-answering/run_qa.py (without --pad_to_max_length the collator
 * pads each batch to its longest window). */
#include "src/qa.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"

#define ACT_RESERVE ((size_t)64 << 30) /* virtual; only touched pages cost memory */

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

int bq_qa_answer(BqBert *m, BqInt8Engine *e, const BqSquadSet *s, int n_best, int max_answer_len, int64_t B,
                 BqSquadScore *score, char ***answers, double *seconds) {
    if (answers) *answers = NULL;
    float *start = bq_malloc(sizeof(float) * (size_t)(s->n * s->T + 1));
    float *end = bq_malloc(sizeof(float) * (size_t)(s->n * s->T + 1));
    char **ans = NULL;
    double t0 = bq_now();
    int st = bq_qa_logits(m, e, s, B, start, end);
    if (!st) st = bq_squad_postprocess(s, start, end, n_best, max_answer_len, &ans);
    if (seconds) *seconds = bq_now() - t0;
    if (!st) bq_squad_score(s, ans, score);
    free(start);
    free(end);
    if (!st && answers) *answers = ans;
    else if (ans) bq_squad_answers_free(ans, s->n_examples);
    return st;
}
