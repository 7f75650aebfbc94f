/* BERT tokenization identical to Hugging Face BertTokenizer / tokenizers' BertNormalizer +
 * BertPreTokenizer + WordPiece (HF transformers models/bert/tokenization_bert.py).
 * Contract: bq_tokenizer_encode produces exactly the ids HF produces for the same text and settings.
 * Invalid UTF-8: each invalid byte becomes U+FFFD, which cleaning then drops (HF lossy decode + clean). */
#ifndef BQ_TOKENIZER_H
#define BQ_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct BqTokenizer BqTokenizer; /* opaque; immutable after load, safe to share across threads */

typedef struct BqTokenizerOptions {
    int do_lower_case;          /* -1: from tokenizer_config.json / tokenizer.json, else 1 */
    int strip_accents;          /* -1: follow do_lower_case (HF default when unset), 0/1 forced */
    int tokenize_chinese_chars; /* -1: from config, else 1 */
} BqTokenizerOptions;

/* Loads vocab.txt and honours tokenizer_config.json / tokenizer.json found next to it.
 * opts may be NULL (all from config). Errors name the file. */
int bq_tokenizer_load(BqTokenizer **out, const char *vocab_path, const BqTokenizerOptions *opts);
void bq_tokenizer_free(BqTokenizer *t);

int32_t bq_tokenizer_vocab_size(const BqTokenizer *t);
int32_t bq_tokenizer_cls_id(const BqTokenizer *t);
int32_t bq_tokenizer_sep_id(const BqTokenizer *t);
int32_t bq_tokenizer_pad_id(const BqTokenizer *t);
int32_t bq_tokenizer_unk_id(const BqTokenizer *t);
const char *bq_tokenizer_token(const BqTokenizer *t, int32_t id); /* NULL if out of range */
/* FNV-1a 64 over the vocabulary and the settings, for cache keys. */
uint64_t bq_tokenizer_hash(const BqTokenizer *t);

/* Word-piece ids of text (no special tokens), appended to a growable buffer (*ids, *n, *cap; the
 * caller frees *ids). Never fails on bad UTF-8. */
void bq_tokenizer_tokenize(const BqTokenizer *t, const char *text, size_t len, int32_t **ids, int64_t *n,
                           int64_t *cap);

typedef enum BqTruncation { BQ_TRUNC_HEAD = 0, BQ_TRUNC_TAIL = 1, BQ_TRUNC_HEAD_TAIL = 2 } BqTruncation;

/* [CLS] a [SEP] (or [CLS] a [SEP] b [SEP] when b != NULL), truncated to max_len tokens in total
 * (max_len <= 0: no truncation). head keeps the first tokens; tail the last; head_tail keeps the first
 * max(1, max_len*128/512) - 1... see the implementation's comment (the first 128 and last 382 at 512).
 * For pairs, the longer sequence is truncated first (HF longest_first). Writes ids and
 * token types into out_ids/out_types (capacity cap); returns the length. */
int64_t bq_tokenizer_encode(const BqTokenizer *t, const char *a, size_t alen, const char *b, size_t blen,
                            int64_t max_len, BqTruncation trunc, int32_t *out_ids, int32_t *out_types,
                            int64_t cap);

#endif
