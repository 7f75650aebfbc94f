/* Fuzz target: loading a vocabulary file (vocab.txt, one token per line) through bq_tokenizer_load, as
 * every command that tokenizes calls it; a vocabulary that loads must tokenize a fixed text with ids
 * inside it. Input: the bytes of vocab.txt. */
#include <stdint.h>
#include <stdlib.h>

#include "tests/fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char dir[512], vocab[600];
    fz_path(dir, sizeof dir, "vocab");
    mkdir(dir, 0700);
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
    fz_write(vocab, sizeof vocab, "vocab/vocab.txt", data, size);
    BqTokenizer *t = NULL;
    bq_err_clear();
    int st = bq_tokenizer_load(&t, vocab, NULL);
    fz_check_refusal(st);
    if (st == BQ_OK) {
        static const char text[] = "This film was un-watchable!! caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 [SEP] 42";
        int32_t ids[64];
        int64_t len = bq_tokenizer_encode(t, text, sizeof text - 1, NULL, 0, 64, BQ_TRUNC_HEAD, ids, NULL, 64);
        int32_t V = bq_tokenizer_vocab_size(t);
        for (int64_t i = 0; i < len && i < 64; i++) BQ_CHECK(ids[i] >= 0 && ids[i] < V);
        bq_tokenizer_free(t);
    }
    return 0;
}
