/* Question answering in the CLI (BertForQuestionAnswering, layers/bert.h BQ_HEAD_QA, on SQuAD v1.1
 * data, datasets/squad.h): the task choice shared by every command (--task, from the model's head by
 * default), the window and post-processing flags, and the loading of a model and a SQuAD file with
 * them. The batch source, the inference pass and the scoring are the library's (src/qa.h). */
#ifndef BQ_CLI_QA_SETUP_H
#define BQ_CLI_QA_SETUP_H

#include "datasets/squad.h"
#include "layers/bert.h"
#include "src/cli/args.h"
#include "src/cli/cmd_common.h"
#include "src/qa.h"

/* Defaults of the QA flags: run_qa.py's (max_seq_length 384, doc_stride 128, max query 64 pieces,
 * n_best_size 20, max_answer_length 30). A checkpoint records the windowing it was trained with, and
 * the flags left at 0 take it. */
#define BQ_QA_MAX_SEQ_LEN 384
#define BQ_QA_DOC_STRIDE 128
#define BQ_QA_MAX_QUERY_LENGTH 64

struct json_t; /* jansson's value type */

/* --task's values, and its names in their order (NULL-terminated, for BQ_ARG_ENUM). */
typedef enum BqCliTask { BQ_CLI_TASK_QA, BQ_CLI_TASK_CLS } BqCliTask;
extern const char *const bq_cli_task_names[3];

typedef struct BqCliQa {
    int task;             /* a BqCliTask, or -1: the model's head decides */
    int doc_stride, max_query_length; /* 0: the checkpoint's, else the defaults above */
    int n_best, max_answer_len;
    const struct json_t *doc; /* predict: the questions as a parsed SQuAD document; NULL: read --data */
} BqCliQa;

void bq_cli_qa_default(BqCliQa *q);

#define BQ_CLI_TASK_SPEC(q)                                                                                     \
    {"task", BQ_ARG_ENUM, &(q).task, "the task (default: from the model's head; qa on a classification "      \
     "model keeps the encoder and creates qa_outputs, as Hugging Face does)", 0, 0, 0, bq_cli_task_names}

/* Windowing of SQuAD examples (commands that encode SQuAD data). */
#define BQ_CLI_QA_WINDOW_SPECS(q)                                                                               \
    {"doc-stride", BQ_ARG_INT, &(q).doc_stride, "QA: context tokens shared by consecutive windows (0: the "    \
     "checkpoint's, else 128)", 0, 0, 8192},                                                                    \
    {"max-query-length", BQ_ARG_INT, &(q).max_query_length, "QA: question tokens kept (0: the checkpoint's, "   \
     "else 64)", 0, 0, 8192}

/* Post-processing of start/end logits into answers (commands that answer questions). */
#define BQ_CLI_QA_POST_SPECS(q)                                                                                 \
    {"n-best", BQ_ARG_INT, &(q).n_best, "QA: start and end candidates per window", 0, 1, 1000},                 \
    {"max-answer-len", BQ_ARG_INT, &(q).max_answer_len, "QA: longest answer in tokens", 0, 1, 8192}

/* The task of a command on the model at dir: --task when given (qa or cls), else the head named by
 * DIR/config.json's architectures. *qa = 1 for question answering. Then checks the flags of the other
 * task were not given (a QA flag on a classification run, or --truncation/--text-column/
 * --text-pair-column/--label-column on a QA run): each is an error naming the flag. A classification
 * task on a question-answering checkpoint is an error (its encoder was trained for spans). */
int bq_cli_task_resolve(const BqArgs *args, const BqCliQa *q, const char *dir, int *qa);
/* For a classification task, data (may be NULL) must not be SQuAD JSON (a .json file whose first 64 KiB
 * hold "paragraphs"): an error naming the file and the flag to use instead. */
int bq_cli_task_check_data(int qa, const char *data);

/* Loads the model at dir (native checkpoint or Hugging Face directory) and its tokenizer (dir/vocab.txt)
 * and gives the model the QA head: a model with another head or none keeps its encoder and gets a
 * fresh qa_outputs drawn from seed (a note on stderr says so). */
int bq_qa_model_load(BqBert *m, BqTokenizer **tok, const char *dir, uint64_t seed, const char *tag);

/* bq_qa_model_load for evaluating (eval, predict), and the forward to run (bq_cli_engine_select): a bertqat
 * checkpoint with a QA head loads as bq_cli_model_load_engine loads a classifier (the integer engine packed
 * while it loads, the word embeddings read by rows from the file); any other model as bq_qa_model_load. */
int bq_qa_model_load_engine(BqBert *m, BqTokenizer **tok, const char *dir, BqCliEngine engine, const char *tag,
                            BqInt8Engine **eng, const char **name);

/* Resolves the sequence length (--max-seq-len, else the checkpoint's, else 384), doc stride and query
 * length (flag, else the checkpoint's, else 128 and 64) into d->used and q, and loads the SQuAD file
 * d->path windowed with them on the runtime's threads; max_examples > 0 keeps the first questions. A
 * file that is not SQuAD JSON is an error naming the file (and saying the model answers questions).
 * "[tag] ..." lines on stderr say what was loaded. */
int bq_qa_data_load(BqSquadSet **out, BqCliData *d, const BqBert *m, const BqTokenizer *tok, BqCliQa *q,
                    int64_t max_examples, const char *tag);

#endif
