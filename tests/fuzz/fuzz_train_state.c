/* Fuzz target: a checkpoint's training_state.h5 (AdamW moments, best parameters, counters, RNG)
 * through bq_train_state_load, as --resume calls it; config.json and model.h5 are the tiny model's
 * (tests/fuzz/fuzz_model.h). Input: the bytes of training_state.h5. */
#include <stdint.h>
#include <stdlib.h>

#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_model.h"

static char dir[512];
static int64_t total;

/* Writes the reference checkpoint once, before the first input (its time is not an input's). */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fz_checkpoint_dir(dir, sizeof dir, "ts", 1);
    BqBert m;
    fz_tiny_model(&m);
    total = m.params.total;
    bq_quant_free(m.quant);
    bq_bert_free(&m);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char p[600];
    fz_write(p, sizeof p, "ts/training_state.h5", data, size);
    BqBert m;
    memset(&m, 0, sizeof m);
    BqAdamW o;
    bq_adamw_init(&o, total, 0.01f);
    BqTrainState ts;
    memset(&ts, 0, sizeof ts);
    ts.opt = &o;
    bq_err_clear();
    int st = bq_train_state_load(&m, dir, &ts);
    fz_check_refusal(st);
    free(ts.best_params);
    bq_adamw_free(&o);
    bq_quant_free(m.quant);
    bq_bert_free(&m);
    return 0;
}
