/* Fuzz target: the aclImdb archive reader (libarchive: tar, gzip and the other formats it detects),
 * from the file's kind through the encoded splits (fz_load_data), as --data ARCHIVE reads them.
 * Input: the bytes of the archive. */
#include <stdint.h>

#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char p[600];
    fz_write(p, sizeof p, "aclImdb.tar.gz", data, size);
    fz_load_data(p, 0);
    return 0;
}
