/* Fuzz target: the tokenizer settings read next to a vocabulary (tokenizer.json, then
 * tokenizer_config.json) through bq_tokenizer_load. Input: tokenizer.json, a NUL byte, then
 * tokenizer_config.json (absent when there is no NUL). The vocabulary is a fixed valid one. */
#include <stdint.h>
#include <stdlib.h>

#include "tests/fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static char dir[512], vocab[600];
    if (!dir[0]) {
        fz_path(dir, sizeof dir, "tokjson");
        BQ_CHECK(mkdir(dir, 0700) == 0);
        fz_tiny_vocab(vocab, sizeof vocab, dir);
    }
    const uint8_t *a, *b;
    size_t an, bn;
    fz_split(data, size, &a, &an, &b, &bn);
    char p[600];
    fz_write(p, sizeof p, "tokjson/tokenizer.json", a, an);
    if (an < size) fz_write(p, sizeof p, "tokjson/tokenizer_config.json", b, bn);
    else unlink(fz_path(p, sizeof p, "tokjson/tokenizer_config.json"));
    BqTokenizer *t = NULL;
    bq_err_clear();
    int st = bq_tokenizer_load(&t, vocab, NULL);
    fz_check_refusal(st);
    if (st == BQ_OK) {
        static const char text[] = "What a GREAT movie, caf\xc3\xa9 \xe4\xb8\xad!";
        int32_t ids[64];
        int64_t len = bq_tokenizer_encode(t, text, sizeof text - 1, "it", 2, 64, BQ_TRUNC_HEAD, ids, NULL, 64);
        int32_t V = bq_tokenizer_vocab_size(t);
        for (int64_t i = 0; i < len && i < 64; i++) BQ_CHECK(ids[i] >= 0 && ids[i] < V);
        bq_tokenizer_free(t);
    }
    return 0;
}
