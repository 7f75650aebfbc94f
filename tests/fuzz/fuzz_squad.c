/* Fuzz target: a SQuAD v1.1 JSON file through bq_squad_load without a cache (parsing, answer offsets
 * in code points, windows over the tokenized context), as --task qa reads --data; a loaded set's
 * windows are then batched. Input: the bytes of the JSON file. */
#include <stdint.h>
#include <stdlib.h>

#include "datasets/squad.h"
#include "tests/fuzz/fuzz.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char p[600];
    fz_write(p, sizeof p, "dev.json", data, size);
    BqSquadOptions o;
    bq_squad_options_default(&o);
    o.max_seq_len = 24;
    o.doc_stride = 6;
    o.max_query_length = 8;
    o.cache_dir = "";
    o.threads = 1;
    BqSquadSet *s = NULL;
    bq_err_clear();
    int st = bq_squad_load(&s, p, fz_tiny_tokenizer("squad"), &o);
    fz_check_refusal(st);
    if (st != BQ_OK) return 0;
    /* Post-processing reads the windows' offsets into the contexts: logits from a fixed pattern pick
     * spans all over each window, and every answer must be bytes of its context or "empty". */
    size_t nl = (size_t)(s->n * s->T);
    float *sl = malloc((nl ? nl : 1) * sizeof(float)), *el = malloc((nl ? nl : 1) * sizeof(float));
    BQ_CHECK(sl && el);
    for (size_t i = 0; i < nl; i++) sl[i] = (float)((i * 7919u) % 31u), el[i] = (float)((i * 104729u) % 37u);
    char **ans = NULL;
    BQ_CHECK(bq_squad_postprocess(s, sl, el, 4, 6, &ans) == BQ_OK);
    for (int64_t e = 0; e < s->n_examples; e++) {
        const BqSquadExample *x = &s->examples[e];
        size_t al = strlen(ans[e]);
        int inside = 0;
        for (int64_t o = 0; !inside && o + (int64_t)al <= x->context_len; o++)
            inside = memcmp(x->context + o, ans[e], al) == 0;
        BQ_CHECK(inside || strcmp(ans[e], "empty") == 0);
    }
    bq_squad_answers_free(ans, s->n_examples);
    free(sl);
    free(el);
    bq_squad_free(s);
    return 0;
}
