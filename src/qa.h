/* Question answering on SQuAD v1.1 windows (BertForQuestionAnswering, layers/bert.h BQ_HEAD_QA;
 * datasets/squad.h): a batch source over windows for the trainer and the calibrator, the inference
 * pass that fills start/end logits per window, and EM/F1 scoring through run_qa.py's post-processing.
 * The CLI's flags and loading live in src/cli/qa_setup.h. */
#ifndef BQ_QA_H
#define BQ_QA_H

#include "datasets/squad.h"
#include "layers/bert.h"
#include "layers/bert_int8.h"
#include "src/train.h"

/* A BqBatchSource over the first n windows of a SQuAD set: batches of up to B windows, padded to the
 * longest window of the batch (dynamic padding, as run_qa.py without --pad_to_max_length), carrying
 * start/end positions. shuffle: the order of epoch e is a permutation drawn from (seed, e); else the
 * set's order. The source points into qs; neither may move while in use. */
typedef struct BqQaSource {
    const BqSquadSet *s;
    int64_t n, B, pos;
    int shuffle;
    uint64_t seed;
    int32_t *order;
    BqBatch cur;
} BqQaSource;
void bq_qa_source_init(BqQaSource *qs, BqBatchSource *src, const BqSquadSet *s, int64_t n, int64_t B, int shuffle,
                       uint64_t seed);
void bq_qa_source_free(BqQaSource *qs);

/* Start and end logits (s->n, s->T) of every window, through the integer engine e when set, else the
 * forward of m (fp32 or fake quant); columns past a window's length are -INFINITY, so padding never
 * takes an n-best slot (run_qa.py pads every window to 384 and ranks the padding's logits too; the
 * two agree unless a padding position ranks among a window's n-best). Batches of B windows, each
 * padded to its longest window. */
int bq_qa_logits(BqBert *m, BqInt8Engine *e, const BqSquadSet *s, int64_t B, float *start, float *end);

/* Answers of every question of s from its windows' logits (run_qa.py post-processing keeping n_best
 * start and end candidates per window and answers of at most max_answer_len tokens) and their official EM/F1. *answers (may be NULL) receives the texts (free
 * with bq_squad_answers_free(*answers, s->n_examples)). */
int bq_qa_answer(BqBert *m, BqInt8Engine *e, const BqSquadSet *s, int n_best, int max_answer_len, int64_t B,
                 BqSquadScore *score, char ***answers, double *seconds);

#endif
