/* Shared by the fuzz targets in tests/fuzz/ (header only). Each target defines
 * LLVMFuzzerTestOneInput(data, size) and reaches its parser through the same entry point the CLI
 * calls, by writing the input into a file of a private scratch folder. The same sources build two
 * ways: with clang's libFuzzer (scripts/fuzz.sh, -DBQ_FUZZ=ON) to search for new inputs, and with
 * tests/fuzz/replay.c as a plain program that runs every committed input of tests/fuzz/corpus/<name>
 * once (one ctest per target, in the normal and the sanitizer builds).
 *
 * Contract of a target: any input returns 0 after freeing everything it allocated; a parser that
 * refuses an input must have set a message (bq_errmsg() non-empty). A crash, a leak, an out-of-bounds
 * access or an input that takes over a second is a bug in the parser. */
#ifndef BQ_FUZZ_H
#define BQ_FUZZ_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "datasets/dataset.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* Optional one-time set-up before the first input (libFuzzer's hook; tests/fuzz/replay.c calls it too). */
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static char fz_root[256];

/* Removes the files of DIR (one level) and DIR itself; errors are ignored (scratch space). */
static inline void fz_rmdir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[1024];
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%.700s/%.255s", dir, e->d_name);
            struct stat s;
            if (lstat(p, &s) == 0 && S_ISDIR(s.st_mode)) fz_rmdir(p);
            else unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

static inline void fz_cleanup(void) {
    if (fz_root[0]) fz_rmdir(fz_root);
}

/* The process's scratch folder (in /dev/shm when it is writable: no disk traffic per input), made on
 * first use and removed at exit. */
static inline const char *fz_scratch(void) {
    if (!fz_root[0]) {
        const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
        snprintf(fz_root, sizeof fz_root, "%s/bq-fuzz-XXXXXX", base);
        BQ_CHECK(mkdtemp(fz_root) != NULL);
        atexit(fz_cleanup);
        bq_runtime_set_threads(1);
    }
    return fz_root;
}

/* The path of NAME in the scratch folder, written into out (n bytes) and returned. */
static inline const char *fz_path(char *out, size_t n, const char *name) {
    snprintf(out, n, "%.255s/%.255s", fz_scratch(), name);
    return out;
}

/* Writes n bytes into the scratch file NAME and returns its path in out. */
static inline const char *fz_write(char *out, size_t outn, const char *name, const void *data, size_t n) {
    fz_path(out, outn, name);
    FILE *f = fopen(out, "wb");
    BQ_CHECK(f != NULL);
    BQ_CHECK(n == 0 || fwrite(data, 1, n, f) == n);
    BQ_CHECK(fclose(f) == 0);
    return out;
}

/* A refused input must say why: call bq_err_clear() before the parser, then this with its status.
 * BQ_FUZZ_VERBOSE=1 prints each refusal (to see how deep the seeds reach). */
static inline void fz_check_refusal(int st) {
    if (st == BQ_OK) return;
    BQ_CHECK(strcmp(bq_errmsg(), "unknown error") != 0);
    if (getenv("BQ_FUZZ_VERBOSE")) fprintf(stderr, "refused: %s\n", bq_errmsg());
}

/* Splits data at the first NUL byte: the part before is (*a, *an), the part after (*b, *bn) (empty
 * when there is no NUL), so one input can carry two files or two strings. */
static inline void fz_split(const uint8_t *data, size_t size, const uint8_t **a, size_t *an, const uint8_t **b,
                            size_t *bn) {
    const uint8_t *z = size ? memchr(data, 0, size) : NULL;
    *a = data;
    *an = z ? (size_t)(z - data) : size;
    *b = z ? z + 1 : data + size;
    *bn = z ? size - *an - 1 : 0;
}

/* A small WordPiece vocabulary (special tokens, ASCII punctuation, digits, letters and their "##"
 * continuations, a few words, accented and CJK characters) written as DIR/vocab.txt; returns the
 * path in out. */
static inline const char *fz_tiny_vocab(char *out, size_t n, const char *dir) {
    static const char *const words[] = {"the", "a", "movie", "film", "good", "bad", "great", "was", "is", "it",
                                        "this", "what", "who", "un", "##able", "##ing", "##ed", "##s", "##ly",
                                        "\xc3\xa9", "\xc3\xbc", "\xe4\xb8\xad", "\xe6\x96\x87"};
    snprintf(out, n, "%s/vocab.txt", dir);
    FILE *f = fopen(out, "wb");
    BQ_CHECK(f != NULL);
    fputs("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n", f);
    for (int c = 33; c < 127; c++)
        if (!(c >= 'A' && c <= 'Z')) fprintf(f, "%c\n", c);
    for (int c = 'a'; c <= 'z'; c++) fprintf(f, "##%c\n", c);
    for (int c = '0'; c <= '9'; c++) fprintf(f, "##%c\n", c);
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) fprintf(f, "%s\n", words[i]);
    BQ_CHECK(fclose(f) == 0);
    return out;
}

/* A tokenizer over fz_tiny_vocab, loaded once per process from the scratch folder SUB. */
static inline BqTokenizer *fz_tiny_tokenizer(const char *sub) {
    static BqTokenizer *tok;
    if (!tok) {
        char dir[512], vocab[600];
        fz_path(dir, sizeof dir, sub);
        BQ_CHECK(mkdir(dir, 0700) == 0);
        BQ_CHECK(bq_tokenizer_load(&tok, fz_tiny_vocab(vocab, sizeof vocab, dir), NULL) == BQ_OK);
    }
    return tok;
}

/* The --data path of every command: the kind of PATH (bq_data_probe), then its train, val and test
 * splits through bq_dataset_load without a cache (max_seq_len 16, a quarter held out for val; with
 * pair, the columns premise and hypothesis). Checks each loaded split's offsets, lengths and labels. */
static inline void fz_load_data(const char *path, int pair) {
    BqDataKind kind = 0;
    int has_test = 0;
    bq_err_clear();
    int st = bq_data_probe(path, &kind, &has_test);
    fz_check_refusal(st);
    if (st != BQ_OK) return;
    static const char *const splits[] = {"train", "val", "test"};
    for (int s = 0; s < 3; s++) {
        BqDataSpec spec;
        bq_data_spec_default(&spec);
        spec.path = path;
        spec.split = splits[s];
        spec.max_seq_len = 16;
        spec.val_fraction = 0.25;
        spec.cache_dir = "";
        spec.threads = 1;
        if (pair) spec.text_column = "premise", spec.text_pair_column = "hypothesis";
        BqDataset *d = NULL;
        bq_err_clear();
        st = bq_dataset_load(&d, &spec, fz_tiny_tokenizer("data"));
        fz_check_refusal(st);
        if (st != BQ_OK) continue;
        BQ_CHECK(d->n >= 0 && d->offsets[0] == 0);
        for (int64_t i = 0; i < d->n; i++) {
            BQ_CHECK(d->offsets[i + 1] > d->offsets[i] && bq_dataset_len(d, i) <= 16);
            BQ_CHECK(d->labels[i] >= -1 && d->labels[i] < (d->nlabels > 0 ? d->nlabels : 1));
        }
        bq_dataset_free(d);
    }
}

#endif
