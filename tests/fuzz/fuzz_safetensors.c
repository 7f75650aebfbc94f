/* Fuzz target: a safetensors file (model.safetensors) through bq_st_open, then every tensor it lists
 * read as float32 with its own shape (bq_st_read_f32, as Hugging Face loading reads weights; other
 * dtypes are converted or refused there). Input: the bytes of the file. */
#include <stdint.h>
#include <stdlib.h>

#include "export/safetensors.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char p[600];
    fz_write(p, sizeof p, "model.safetensors", data, size);
    BqSt *st = NULL;
    bq_err_clear();
    int rc = bq_st_open(&st, p);
    fz_check_refusal(rc);
    if (rc != BQ_OK) return 0;
    for (int i = 0; i < st->n; i++) {
        const BqStTensor *t = &st->t[i];
        BQ_CHECK(t->end >= t->begin && st->data_off + t->end <= st->size);
        if (t->numel > (1 << 20)) continue; /* a valid header may describe a large tensor; not read here */
        float *dst = malloc((size_t)(t->numel > 0 ? t->numel : 1) * sizeof(float));
        BQ_CHECK(dst != NULL);
        bq_err_clear();
        fz_check_refusal(bq_st_read_f32(st, t->name, dst, t->ndim, t->shape));
        free(dst);
    }
    bq_st_close(st);
    return 0;
}
