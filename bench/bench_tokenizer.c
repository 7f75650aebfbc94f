/* Single-thread throughput of bq_tokenizer_encode (tokenizer/tokenizer.c) over a file of NUL-separated
 * texts, e.g. the 25,000 IMDB test reviews written by bench/bench_tokenizer.py, which runs HF
 * `tokenizers` on the same texts for the ratio. With --dump it also writes the encoded ids, one line per
 * text ([CLS] .. [SEP], truncated at --max-seq-len when > 0), which tests/python/test_tokenizer_hf.py
 * compares with HF. Prints "reviews/s" and "tokens/s" of the best of --repeat passes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autograd/bq.h"
#include "src/cli/args.h"
#include "tokenizer/tokenizer.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* process CPU time: on a shared, loaded machine this is fairer than wall time for both sides */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const char *vocab = NULL, *input = NULL, *dump = NULL, *trunc_s = "head";
    int max_len = 0, repeat = 3, pair = 0;
    const BqArgSpec specs[] = {
        {"vocab", BQ_ARG_STR, &vocab, "vocab.txt", 1, 0, 0},
        {"input", BQ_ARG_STR, &input, "NUL-separated texts", 1, 0, 0},
        {"max-seq-len", BQ_ARG_INT, &max_len, "truncate to N tokens incl. specials (0: none)", 0, 0, 1 << 30},
        {"truncation", BQ_ARG_STR, &trunc_s, "head, tail or head_tail", 0, 0, 0},
        {"pair", BQ_ARG_FLAG, &pair, "each text is A<TAB>B", 0, 0, 0},
        {"repeat", BQ_ARG_INT, &repeat, "timed passes (best is reported; 0 with --dump: no timing)", 0, 0, 1000},
        {"dump", BQ_ARG_STR, &dump, "write the ids of each text, one line per text", 0, 0, 0},
    };
    BqArgs args = {.cmd = "bench_tokenizer", .usage = "--vocab PATH --input FILE [options]",
                   .summary = "Single-thread tokenizer throughput.", .specs = specs,
                   .nspecs = (int)(sizeof specs / sizeof specs[0])};
    int st = bq_args_parse(&args, argc, argv);
    if (st) {
        fprintf(stderr, "bench_tokenizer: %s\n", bq_errmsg());
        return 2;
    }
    if (args.help) return 0;
    BqTruncation trunc = !strcmp(trunc_s, "tail") ? BQ_TRUNC_TAIL
                         : !strcmp(trunc_s, "head_tail") ? BQ_TRUNC_HEAD_TAIL : BQ_TRUNC_HEAD;
    BqTokenizer *tok = NULL;
    if (bq_tokenizer_load(&tok, vocab, NULL)) {
        fprintf(stderr, "bench_tokenizer: %s\n", bq_errmsg());
        return 1;
    }
    FILE *f = fopen(input, "rb");
    if (!f) {
        fprintf(stderr, "bench_tokenizer: %s: cannot open\n", input);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = bq_malloc((size_t)sz + 1);
    if (fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        fprintf(stderr, "bench_tokenizer: %s: read error\n", input);
        return 1;
    }
    fclose(f);
    buf[sz] = 0;
    /* record boundaries */
    int64_t nrec = 0, rcap = 1024;
    int64_t *starts = bq_malloc((size_t)rcap * sizeof(int64_t)), *lens = bq_malloc((size_t)rcap * sizeof(int64_t));
    for (int64_t p = 0; p < sz;) {
        char *z = memchr(buf + p, 0, (size_t)(sz - p));
        int64_t e = z ? z - buf : sz;
        if (nrec == rcap) {
            rcap *= 2;
            starts = bq_realloc(starts, (size_t)rcap * sizeof(int64_t));
            lens = bq_realloc(lens, (size_t)rcap * sizeof(int64_t));
        }
        starts[nrec] = p, lens[nrec] = e - p, nrec++;
        p = e + 1;
    }
    int64_t cap = 1 << 16;
    int32_t *ids = bq_malloc((size_t)cap * sizeof(int32_t)), *types = bq_malloc((size_t)cap * sizeof(int32_t));
    FILE *df = dump ? fopen(dump, "w") : NULL;
    if (dump && !df) {
        fprintf(stderr, "bench_tokenizer: %s: cannot open\n", dump);
        return 1;
    }
    double best = 1e30, best_cpu = 1e30;
    int64_t ntok = 0;
    for (int r = 0; r < repeat + (df ? 1 : 0); r++) {
        int writing = df && r == repeat; /* the dump pass is untimed */
        double t0 = now_s(), c0 = cpu_s();
        ntok = 0;
        for (int64_t i = 0; i < nrec; i++) {
            const char *a = buf + starts[i], *b = NULL;
            size_t alen = (size_t)lens[i], blen = 0;
            if (pair) {
                const char *tab = memchr(a, '\t', alen);
                if (tab) b = tab + 1, blen = alen - (size_t)(tab - a) - 1, alen = (size_t)(tab - a);
            }
            int64_t n = bq_tokenizer_encode(tok, a, alen, b, blen, max_len, trunc, ids, types, cap);
            BQ_CHECK(n <= cap);
            ntok += n;
            if (writing) {
                for (int64_t k = 0; k < n; k++) fprintf(df, k ? " %d" : "%d", ids[k]);
                if (pair) {
                    fputs(" |", df);
                    for (int64_t k = 0; k < n; k++) fprintf(df, " %d", types[k]);
                }
                fputc('\n', df);
            }
        }
        double dt = now_s() - t0, dc = cpu_s() - c0;
        if (!writing && dt < best) best = dt;
        if (!writing && dc < best_cpu) best_cpu = dc;
    }
    if (df && fclose(df)) {
        fprintf(stderr, "bench_tokenizer: %s: write error\n", dump);
        return 1;
    }
    if (repeat > 0 && nrec > 0)
        printf("bq_tokenizer: %lld texts, %lld tokens, best of %d: %.3f s wall, %.1f reviews/s, %.0f tokens/s; "
               "%.3f s cpu, %.1f reviews/cpu-s\n",
               (long long)nrec, (long long)ntok, repeat, best, (double)nrec / best, (double)ntok / best, best_cpu,
               (double)nrec / best_cpu);
    free(ids);
    free(types);
    free(starts);
    free(lens);
    free(buf);
    bq_tokenizer_free(tok);
    return 0;
}
