/* Fuzz target: a bertqat checkpoint's model.h5 (parameters, Fletcher-32 checksums, the quantizers'
 * ranges and observer state under /quant) through bq_ckpt_load, as every command that takes a
 * checkpoint calls it; config.json is the tiny model's (tests/fuzz/fuzz_model.h). Input: the bytes of
 * model.h5. */
#include <stdint.h>

#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_model.h"

static char dir[512];

/* Writes the reference checkpoint once, before the first input (its time is not an input's). */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    fz_checkpoint_dir(dir, sizeof dir, "ckpt", 0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char p[600];
    fz_write(p, sizeof p, "ckpt/model.h5", data, size);
    BqBert m;
    memset(&m, 0, sizeof m);
    bq_err_clear();
    int st = bq_ckpt_load(&m, dir);
    fz_check_refusal(st);
    bq_quant_free(m.quant);
    bq_bert_free(&m);
    return 0;
}
