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

/* As bq_tokenizer_tokenize, and also appends each word piece's source span: (*offs)[2k], (*offs)[2k+1]
 * are the [begin, end) BYTE offsets into text of piece k (the caller frees *offs; it grows with *ids
 * and holds 2 * *cap entries). The span is that of Hugging Face tokenizers' offset_mapping, in bytes
 * instead of characters: from the first byte of the original character the piece's first normalized
 * character came from to the last byte of the original character its last one came from ("##"
 * excluded; an accent stripped or a lowercase expansion belongs to its source character; a word that
 * becomes [UNK] spans the whole word; an added/special token its literal). HF's Python offsets count
 * Unicode code points: for valid UTF-8, char_offset = the number of bytes of text[0, byte_offset) that
 * are not continuation bytes (10xxxxxx). Never fails on bad UTF-8 (invalid bytes are dropped). */
void bq_tokenizer_tokenize_offsets(const BqTokenizer *t, const char *text, size_t len, int32_t **ids,
                                   int64_t **offs, int64_t *n, int64_t *cap);

typedef enum BqTruncation { BQ_TRUNC_HEAD = 0, BQ_TRUNC_TAIL = 1, BQ_TRUNC_HEAD_TAIL = 2 } BqTruncation;

/* [CLS] a [SEP] (or [CLS] a [SEP] b [SEP] when b != NULL), truncated to max_len tokens in total
 * (max_len <= 0: no truncation). Each sequence gets a budget of k word pieces: k = max_len - 2 for one
 * sequence; for pairs (HF tokenizers longest_first) with m = max_len - 3, the shorter sequence keeps
 * min(its length, m / 2) and the longer the rest (equal lengths: a counts as the shorter).
 * Within its budget k a sequence keeps: head the first k pieces; tail the last k; head_tail the first
 * (k + 2) / 4 and the last k - (k + 2) / 4 (for one sequence that is the first max_len / 4: at
 * max_len 512 the first 128 and the last 382). Writes ids and token types (0 for [CLS] a [SEP], 1 for
 * b [SEP]; out_types may be NULL) into out_ids/out_types up to capacity cap and returns the full
 * length, which may exceed cap (then only the first cap entries were written). */
int64_t bq_tokenizer_encode(const BqTokenizer *t, const char *a, size_t alen, const char *b, size_t blen,
                            int64_t max_len, BqTruncation trunc, int32_t *out_ids, int32_t *out_types,
                            int64_t cap);

#endif
