/* Fuzz target: CSV, TSV and JSONL datasets, from the file's kind through the encoded splits
 * (fz_load_data: rows, columns, labels, validation split, tokenization), as every command with --data
 * reads them. Input: the first byte picks the extension (.csv, .tsv, .jsonl) and whether the columns
 * are premise and hypothesis (a text pair); the rest is the file. */
#include <stdint.h>

#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    static const char *const names[] = {"d.csv", "d.tsv", "d.jsonl"};
    char p[600];
    fz_write(p, sizeof p, names[data[0] % 3], data + 1, size - 1);
    fz_load_data(p, (data[0] & 4) != 0);
    return 0;
}
