/* Fuzz target: a Hugging Face config.json through bq_config_load and bq_config_validate, as model
 * loading calls them (the "bertqat" block of a checkpoint's config.json included). Input: the bytes of
 * config.json. */
#include <stdint.h>

#include "layers/bert.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char p[600];
    fz_write(p, sizeof p, "config.json", data, size);
    BqBertConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    bq_err_clear();
    int st = bq_config_load(&cfg, p);
    fz_check_refusal(st);
    if (st == BQ_OK) {
        bq_err_clear();
        fz_check_refusal(bq_config_validate(&cfg));
        bq_config_free(&cfg);
    }
    return 0;
}
