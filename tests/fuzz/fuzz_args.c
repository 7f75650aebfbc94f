/* Fuzz target: the command-line flag parser (bq_args_parse, which every subcommand calls on its argv)
 * with a table of every flag kind: required and optional strings, ranged and unranged integers and
 * floats, flags, and positional arguments. Input: argv, one argument per NUL-terminated piece (the
 * first is the subcommand name). Contract checked: a parsed value lies in its flag's range. */
#include <stdint.h>
#include <stdlib.h>

#include "src/cli/args.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *buf = malloc(size + 1);
    BQ_CHECK(buf != NULL);
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *argv[256];
    int argc = 0;
    for (size_t i = 0; i <= size && argc < 255;) {
        argv[argc++] = buf + i;
        i += strlen(buf + i) + 1;
    }
    argv[argc] = NULL;

    const char *model = NULL, *out = "default", *scheme = "cpu";
    int epochs = 3, seed = 42, verbose = 0, bucket = 0;
    double lr = 5e-5, frac = 0.1, temp = 1.0;
    const BqArgSpec specs[] = {
        {"model", BQ_ARG_STR, &model, "model directory", 1, 0, 0},
        {"out", BQ_ARG_STR, &out, "output directory", 0, 0, 0},
        {"scheme", BQ_ARG_STR, &scheme, "quantization scheme", 0, 0, 0},
        {"epochs", BQ_ARG_INT, &epochs, "epochs", 0, 1, 1000},
        {"seed", BQ_ARG_INT, &seed, "seed", 0, 0, 0},
        {"lr", BQ_ARG_FLOAT, &lr, "learning rate", 0, 1e-9, 1.0},
        {"val-fraction", BQ_ARG_FLOAT, &frac, "validation fraction", 0, 0.0, 0.9},
        {"temperature", BQ_ARG_FLOAT, &temp, "temperature", 0, 0, 0},
        {"verbose", BQ_ARG_FLAG, &verbose, "more output", 0, 0, 0},
        {"bucket", BQ_ARG_FLAG, &bucket, "bucket by length", 0, 0, 0},
    };
    BqArgs a = {.cmd = "fuzz", .usage = "--model DIR [options] [FILE...]", .summary = "Flag parser fuzzing.",
                .specs = specs, .nspecs = (int)(sizeof specs / sizeof specs[0]), .max_positional = 2,
                .positional_name = "FILE"};
    static int quiet;
    if (!quiet) quiet = freopen("/dev/null", "w", stdout) != NULL; /* --help prints the usage there */
    bq_err_clear();
    int st = bq_args_parse(&a, argc, argv);
    fz_check_refusal(st);
    if (st == BQ_OK && !a.help) {
        BQ_CHECK(model != NULL);
        BQ_CHECK(epochs >= 1 && epochs <= 1000 && lr >= 1e-9 && lr <= 1.0 && frac >= 0.0 && frac <= 0.9);
        BQ_CHECK(a.npositional <= 2);
        for (int i = 0; i < a.npositional; i++) BQ_CHECK(a.positional[i] >= buf && a.positional[i] <= buf + size);
    }
    free(buf);
    return 0;
}
