/* Speed of bq_squad_load (datasets/squad.c) on a SQuAD v1.1 file without the cache: JSON reading, and
 * tokenizing plus building run_qa.py's windows, timed separately (wall), best of --repeat passes; and
 * process CPU time of the whole load and of jansson's parse of the file alone (the CPU time of the
 * encoding is their difference; on a loaded machine CPU time is the fairer measure). bench/bench_squad.py runs this and HF's fast tokenizer with run_qa.py's
 * prepare_validation_features on the same file for the ratio. Prints the question and window counts. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "autograd/bq.h"
#include "datasets/squad.h"
#include "src/cli/args.h"
#include "tokenizer/tokenizer.h"

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    const char *vocab = NULL, *data = NULL;
    int repeat = 3, threads = 1, max_seq_len = 384, doc_stride = 128, mql = 64;
    const BqArgSpec specs[] = {
        {"vocab", BQ_ARG_STR, &vocab, "vocab.txt", 1, 0, 0},
        {"data", BQ_ARG_STR, &data, "SQuAD v1.1 JSON file", 1, 0, 0},
        {"threads", BQ_ARG_INT, &threads, "encoding threads", 0, 1, 1024},
        {"max-seq-len", BQ_ARG_INT, &max_seq_len, "window length", 0, 8, 65536},
        {"doc-stride", BQ_ARG_INT, &doc_stride, "context pieces shared by consecutive windows", 0, 0, 65536},
        {"max-query-length", BQ_ARG_INT, &mql, "question pieces kept", 0, 1, 65536},
        {"repeat", BQ_ARG_INT, &repeat, "timed passes (best is reported)", 0, 1, 1000},
    };
    BqArgs args = {.cmd = "bench_squad", .usage = "--vocab PATH --data FILE [options]",
                   .summary = "SQuAD reading and window encoding speed.", .specs = specs,
                   .nspecs = (int)(sizeof specs / sizeof specs[0])};
    if (bq_args_parse(&args, argc, argv)) {
        fprintf(stderr, "bench_squad: %s\n", bq_errmsg());
        return 2;
    }
    if (args.help) return 0;
    bq_runtime_set_threads(threads);
    BqTokenizer *tok = NULL;
    if (bq_tokenizer_load(&tok, vocab, NULL)) {
        fprintf(stderr, "bench_squad: %s\n", bq_errmsg());
        return 1;
    }
    BqSquadOptions o;
    bq_squad_options_default(&o);
    o.max_seq_len = max_seq_len;
    o.doc_stride = doc_stride;
    o.max_query_length = mql;
    o.cache_dir = "";
    o.threads = threads;
    double best_read = 1e30, best_enc = 1e30, best_cpu = 1e30, best_parse = 1e30;
    int64_t nq = 0, nw = 0, maxpieces = 0;
    for (int r = 0; r < repeat; r++) {
        BqSquadSet *s = NULL;
        double c0 = cpu_s();
        if (bq_squad_load(&s, data, tok, &o)) {
            fprintf(stderr, "bench_squad: %s\n", bq_errmsg());
            return 1;
        }
        double c = cpu_s() - c0;
        if (s->read_seconds < best_read) best_read = s->read_seconds;
        if (s->encode_seconds < best_enc) best_enc = s->encode_seconds;
        if (c < best_cpu) best_cpu = c;
        nq = s->n_examples;
        nw = s->n;
        maxpieces = s->max_context_pieces;
        bq_squad_free(s);
        c0 = cpu_s();
        json_error_t je;
        json_t *j = json_load_file(data, 0, &je);
        c = cpu_s() - c0;
        if (j) json_decref(j);
        if (c < best_parse) best_parse = c;
    }
    printf("questions %lld windows %lld (max_seq_len %d, doc_stride %d, max_query_length %d; longest context %lld pieces)\n",
           (long long)nq, (long long)nw, max_seq_len, doc_stride, mql, (long long)maxpieces);
    printf("threads %d: read %.3f s, encode %.3f s (wall, best of %d); cpu: load %.3f s, JSON parse alone %.3f s, "
           "encode %.3f s; %.0f questions/s encode (wall)\n",
           threads, best_read, best_enc, repeat, best_cpu, best_parse, best_cpu - best_parse, (double)nq / best_enc);
    bq_tokenizer_free(tok);
    return 0;
}
