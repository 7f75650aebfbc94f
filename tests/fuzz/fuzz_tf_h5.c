/* Fuzz target: a TensorFlow Hugging Face checkpoint (tf_model.h5, Keras HDF5 weights) through
 * bq_tf_h5_read, as loading a TF-only model directory calls it. Under libFuzzer (BQ_FUZZ_INPROCESS)
 * it calls bq_tf_h5_read_direct instead: bq_tf_h5_read reads in a child process, whose coverage
 * libFuzzer would not see. Input: the bytes of the file. */
#include <stdint.h>

#include "export/tf_h5.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char p[600];
    fz_write(p, sizeof p, "tf_model.h5", data, size);
    BqTfModel m;
    memset(&m, 0, sizeof m);
    bq_err_clear();
#ifdef BQ_FUZZ_INPROCESS
    int st = bq_tf_h5_read_direct(&m, p);
#else
    int st = bq_tf_h5_read(&m, p);
#endif
    fz_check_refusal(st);
    if (st == BQ_OK) {
        for (int i = 0; i < m.n; i++) BQ_CHECK(m.t[i].ndim == 1 || m.t[i].ndim == 2);
        bq_tf_h5_free(&m);
    }
    return 0;
}
