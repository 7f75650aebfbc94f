/* Fuzz target: BERT tokenization (normalisation, pre-tokenization, WordPiece, truncation and pairs)
 * on arbitrary bytes, through bq_tokenizer_encode and bq_tokenizer_tokenize_offsets as the datasets and
 * SQuAD readers call them. Input: the first byte picks the case, accent and truncation settings; the
 * rest is text a, then a NUL and text b of a pair. Contract checked: ids within the vocabulary, token
 * types 0/1, offsets ordered inside the text, the returned length at most max_len. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

static BqTokenizer *tok[4];

static void load(void) {
    char dir[512], vocab[600];
    fz_path(dir, sizeof dir, "wordpiece");
    BQ_CHECK(mkdir(dir, 0700) == 0);
    fz_tiny_vocab(vocab, sizeof vocab, dir);
    for (int i = 0; i < 4; i++) {
        BqTokenizerOptions o = {.do_lower_case = i & 1, .strip_accents = (i & 2) ? 1 : -1,
                                .tokenize_chinese_chars = 1};
        BQ_CHECK(bq_tokenizer_load(&tok[i], vocab, &o) == BQ_OK);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!tok[0]) load();
    if (size == 0) return 0;
    const BqTokenizer *t = tok[data[0] & 3];
    BqTruncation trunc = (BqTruncation)((data[0] >> 2) % 3);
    int64_t max_len = 3 + (data[0] >> 4) * 4;
    const uint8_t *a, *b;
    size_t an, bn;
    fz_split(data + 1, size - 1, &a, &an, &b, &bn);
    int pair = memchr(data + 1, 0, size - 1) != NULL;

    int32_t ids[128], types[128];
    int64_t len = bq_tokenizer_encode(t, (const char *)a, an, pair ? (const char *)b : NULL, bn, max_len, trunc,
                                      ids, types, 128);
    BQ_CHECK(len >= 2 && len <= max_len);
    int32_t V = bq_tokenizer_vocab_size(t);
    for (int64_t i = 0; i < len; i++) BQ_CHECK(ids[i] >= 0 && ids[i] < V && (types[i] == 0 || types[i] == 1));

    int32_t *pid = NULL;
    int64_t *offs = NULL, n = 0, cap = 0;
    bq_tokenizer_tokenize_offsets(t, (const char *)a, an, &pid, &offs, &n, &cap);
    for (int64_t k = 0; k < n; k++) {
        BQ_CHECK(pid[k] >= 0 && pid[k] < V);
        BQ_CHECK(offs[2 * k] >= 0 && offs[2 * k] <= offs[2 * k + 1] && offs[2 * k + 1] <= (int64_t)an);
        if (k) BQ_CHECK(offs[2 * k] >= offs[2 * k - 2]);
    }
    free(pid);
    free(offs);
    return 0;
}
