/* SQuAD v1.1 extractive question answering data: the reader (official JSON through jansson), the
 * window ("feature") construction of Hugging Face transformers examples/pytorch/question-answering
 * run_qa.py (prepare_train_features / prepare_validation_features with a fast BERT tokenizer), the
 * on-disk cache of encoded windows, run_qa.py's post-processing of start/end logits into answer
 * texts (utils_qa.py postprocess_qa_predictions, v1.1 branch), and the official v1.1 evaluation
 * (evaluate-v1.1.py: normalised exact match and token F1). docs/squad.md describes the format and
 * the options.
 *
 * Windows: each example is encoded as [CLS] question [SEP] context-slice [SEP], padded with [PAD] to
 * max_seq_len tokens (token types 0 for [CLS] question [SEP], 1 for the context slice and its
 * [SEP]; mask 1 for real tokens). The question keeps its first max_query_length word pieces. With
 * q question pieces, a window holds k = max_seq_len - q - 3 context pieces; windows start at context
 * pieces 0, k - doc_stride, 2 (k - doc_stride), ... and the last one is the first that reaches the
 * end of the context (HF tokenizers' truncation="only_second" with stride=doc_stride and
 * return_overflowing_tokens), so consecutive windows share doc_stride context pieces.
 *
 * Labels (from the FIRST reference answer, as run_qa.py): with the answer's byte span [s, e) in the
 * context, a window whose first context piece begins at or before s and whose last context piece ends
 * at or after e gets start = the last context piece beginning at or before s and end = the first
 * context piece ending at or after e (positions in the window); any other window gets start = end = 0
 * ([CLS]). (run_qa.py's start loop can run past the last context piece when the answer starts in it
 * and then labels the last position of the window; here it stops at the last context piece.)
 *
 * Errors (return non-zero, one line naming the file and the question id, *out stays NULL): invalid or
 * truncated JSON (jansson also rejects invalid UTF-8), a missing or mistyped field (data[].paragraphs[]
 * .context, .qas[].id, .question, .answers[].text, .answer_start), an answer whose text is not found
 * at its answer_start in the context, a question with no answer, SQuAD v2.0 questions
 * (is_impossible true: not supported), and a context longer than 2^31 - 1 bytes. */
#ifndef BQ_SQUAD_H
#define BQ_SQUAD_H

#include <stdint.h>

#include "datasets/batch.h"
#include "tokenizer/tokenizer.h"

struct json_t; /* jansson's value type */

typedef struct BqSquadOptions {
    int64_t max_seq_len;      /* tokens per window including [CLS] and the two [SEP]s (384) */
    int64_t doc_stride;       /* context pieces shared by consecutive windows (128) */
    int64_t max_query_length; /* question pieces kept (64) */
    int64_t max_examples;     /* the first N questions in file order; 0 = all */
    const char *cache_dir;    /* NULL: bq_data_default_cache_dir(); "": no cache */
    int threads;              /* encoding threads; <= 0: bq_runtime_threads() */
    const struct json_t *doc; /* NULL: read the file at path; else this parsed SQuAD document (path then
                                 only names it in messages) and no cache */
} BqSquadOptions;

/* max_seq_len 384, doc_stride 128, max_query_length 64, all examples, default cache, runtime threads. */
void bq_squad_options_default(BqSquadOptions *o);

typedef struct BqSquadExample {
    char *id;              /* the question id ("qas"[].id) */
    char *title;           /* the article title ("" when absent) */
    char *question;        /* UTF-8, as in the file */
    char *context;         /* UTF-8, as in the file; points into BqSquadSet.contexts (shared by the
                            * questions of one paragraph) */
    int64_t context_len;   /* bytes */
    int n_answers;         /* >= 1 */
    char **answers;        /* (n_answers) reference answer texts */
    int64_t *answer_start; /* (n_answers) byte offsets into context (the file's answer_start counts
                            * Unicode code points; converted here) */
} BqSquadExample;

typedef struct BqSquadSet {
    int64_t n_examples;
    BqSquadExample *examples; /* (n_examples) in file order */
    int64_t n_contexts;       /* distinct paragraphs the examples come from */
    char **contexts;          /* (n_contexts) their texts (storage of BqSquadExample.context) */
    int64_t n;                /* windows, grouped by example in example order */
    int64_t T;                /* max_seq_len: every window row has T entries */
    int32_t *input_ids;       /* (n,T) [CLS] q [SEP] c [SEP] [PAD]... */
    int32_t *token_type_ids;  /* (n,T) */
    float *attention_mask;    /* (n,T) 1 token, 0 padding */
    int32_t *len;             /* (n) real tokens in the window (the rest is padding) */
    int32_t *start_positions; /* (n) label, 0 ([CLS]) when the answer is not inside the window */
    int32_t *end_positions;   /* (n) */
    int64_t *example_index;   /* (n) index into examples */
    int32_t *offsets;         /* (n,T,2) [begin, end) byte offsets of each context piece into its
                               * example's context; -1, -1 for [CLS], question, [SEP] and [PAD] */
    int64_t max_context_pieces; /* the most word pieces of any context */
    int32_t pad_id;
    int from_cache;         /* 1 when the windows came from a valid cache file */
    int cache_rejected;     /* 1 when a cache file existed but was stale/corrupt and was rebuilt */
    int cache_write_failed; /* 1 when the cache could not be written (the set is still valid) */
    char *cache_path;       /* NULL: cache disabled */
    double read_seconds;    /* wall time reading and parsing the JSON */
    double encode_seconds;  /* wall time tokenizing and building windows (0 when cached) */
} BqSquadSet;

/* Reads the SQuAD v1.1 JSON at path and builds the windows with tok (the model's tokenizer). The
 * examples are always read from the file (they hold the texts needed for post-processing and
 * scoring); the windows come from <cache_dir>/<key>.bqsq when a valid entry exists, key = hash of the
 * file identity (canonical path, size, mtime), the tokenizer hash and the options. Cache files follow
 * datasets/dataset.h's conventions (magic, version, key, FNV-1a checksum, temp file then durable
 * rename; a stale or corrupt file is rebuilt, a failure to write is only flagged). */
int bq_squad_load(BqSquadSet **out, const char *path, const BqTokenizer *tok, const BqSquadOptions *opt);
void bq_squad_free(BqSquadSet *s);

/* Copies windows[0..B) of s into a batch of B rows of T columns (caller buffers in *b, each sized
 * B*T or B; T >= the longest len among them and <= s->T), cutting the padding beyond T (dynamic
 * padding). b->labels is left untouched; start/end (B) receive the labels (either may be NULL);
 * b->example_index (when not NULL) receives the window indices; windows may be b->example_index
 * itself (row r reads windows[r] before writing it). Sets b->B and b->T. */
void bq_squad_batch(const BqSquadSet *s, const int64_t *windows, int64_t B, int64_t T, BqBatch *b,
                    int32_t *start, int32_t *end);

/* run_qa.py post-processing (utils_qa.py postprocess_qa_predictions, version_2_with_negative false).
 * start_logits, end_logits: (s->n, s->T) row-major, one row per window. Columns past a window's len
 * take part in the ranking, as in run_qa.py whose windows are padded to max_seq_len: pass the model's
 * logits for the padded window, or -INFINITY there to leave them out. For each window, the n_best
 * highest start and the n_best highest end logits over its T columns (ties: lower position first) are
 * paired; a pair is kept when both are context pieces, end >= start and end - start + 1 <=
 * max_answer_len; its score is start_logit + end_logit (float). Each example's answer is the context
 * bytes [offsets[start].begin, offsets[end].end) of its best pair over all its windows (ties: the first
 * found in window, start-rank, end-rank order, as Python's stable sort), or the string "empty" when no
 * pair is valid (as run_qa.py). *answers receives s->n_examples malloc'd strings in a malloc'd array
 * (free with bq_squad_answers_free). Errors (BQ_EINVAL): n_best < 1 or max_answer_len < 1. */
int bq_squad_postprocess(const BqSquadSet *s, const float *start_logits, const float *end_logits, int n_best,
                         int max_answer_len, char ***answers);
void bq_squad_answers_free(char **answers, int64_t n);

/* The official SQuAD v1.1 evaluation (evaluate-v1.1.py). normalize, in its order: lowercase (Unicode
 * simple case mapping and U+0130 -> "i\u0307", as Python's str.lower() except its final-sigma rule),
 * remove every character of Python's string.punctuation (ASCII only), replace each whole word a, an,
 * the by a space (words as Python's regex \b: runs of letters, numbers and '_'), and collapse
 * whitespace (Python's str.isspace set) to single spaces with none leading or trailing. Invalid UTF-8
 * bytes are kept as they are. Returns a malloc'd string. */
char *bq_squad_normalize(const char *text);
/* Exact match (0 or 1) and token F1 in [0, 1] of one prediction against one reference: F1 over the
 * whitespace-split tokens of the normalized strings (multiset overlap; 0 when either side is empty
 * or nothing is shared). */
double bq_squad_exact(const char *prediction, const char *reference);
double bq_squad_f1(const char *prediction, const char *reference);

typedef struct BqSquadScore {
    double exact_match; /* x100, averaged over the questions */
    double f1;          /* x100 */
    int64_t n;          /* questions scored */
} BqSquadScore;

/* Scores predictions (n_examples strings, NULL counts as the empty answer) against s's reference
 * answers: the maximum EM and F1 over each question's references, averaged over questions, x100. */
void bq_squad_score(const BqSquadSet *s, char *const *predictions, BqSquadScore *out);

/* Writes the official predictions file {"<id>": "<answer>", ...} (jansson, UTF-8, keys in example
 * order) to a temp file and renames it over path; on error nothing is left at path. */
int bq_squad_write_predictions(const char *path, const BqSquadSet *s, char *const *predictions);

#endif
