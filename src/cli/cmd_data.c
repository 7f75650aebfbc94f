/* `bertqat data-stats`: loads every split of a data source through datasets/ (same selection, encoding
 * and cache as training) and prints example counts per split and label, token-length percentiles
 * (before truncation) and the padding that dynamic padding and length bucketing leave. With
 * --dump-batches N it also prints a checksum of the first N batches, so two sources (an archive and its
 * extracted folder) or two thread counts can be checked for identical batches. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "autograd/bq.h"
#include "datasets/dataset.h"
#include "src/cli/args.h"
#include "src/cli/cli.h"
#include "src/cli/cmd_common.h"
#include "tokenizer/tokenizer.h"

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* nearest-rank percentile of a sorted array */
static int32_t pct(const int32_t *v, int64_t n, double p) {
    int64_t k = (int64_t)((p / 100.0) * (double)n + 0.999999999);
    if (k < 1) k = 1;
    if (k > n) k = n;
    return v[k - 1];
}

static double padding_of(const BqDataset *d, int bs, int bucket, uint64_t seed) {
    BqBatcher b;
    if (bq_batcher_init(&b, d, bs, 1, seed, bucket)) return 0;
    BqBatch x;
    int64_t real = 0, padded = 0;
    while (bq_batcher_next(&b, &x)) bq_batcher_padding(&b, &real, &padded);
    bq_batcher_free(&b);
    return real ? (double)padded / (double)real : 1.0;
}

/* The table of examples per split: kept, in the source, empty texts skipped, and per label. */
static void print_counts(BqDataset *const ds[3], const char *const splits[3]) {
    printf("\n%-6s %9s %7s %6s  %s\n", "split", "examples", "source", "empty", "labels");
    for (int s = 0; s < 3; s++) {
        const BqDataset *d = ds[s];
        if (!d) continue;
        printf("%-6s %9lld %7lld %6lld ", splits[s], (long long)d->n, (long long)d->source_count, (long long)d->skipped_empty);
        int64_t unl = 0;
        for (int k = 0; k < d->nlabels; k++) {
            int64_t c = 0;
            for (int64_t i = 0; i < d->n; i++) c += d->labels[i] == k;
            printf(" %s=%lld", d->label_names[k], (long long)c);
        }
        for (int64_t i = 0; i < d->n; i++) unl += d->labels[i] < 0;
        if (unl) printf(" unlabeled=%lld", (long long)unl);
        printf("\n");
    }
}

/* The table of token lengths per split before truncation (percentiles, max, mean, how many
 * max_seq_len truncates) and the padding factor of batch_size batches, without and with bucketing. */
static void print_lengths(BqDataset *const ds[3], const char *const splits[3], int batch_size, int max_seq_len,
                          int seed) {
    printf("\ntokens per example before truncation (incl. [CLS]/[SEP]); padding = B*T / real tokens at batch %d\n", batch_size);
    printf("%-6s %6s %6s %6s %6s %7s %8s %12s %10s %10s\n", "split", "p50", "p90", "p95", "p99", "max", "mean", "truncated", "pad", "pad+bucket");
    for (int s = 0; s < 3; s++) {
        const BqDataset *d = ds[s];
        if (!d) continue;
        int32_t *v = bq_malloc((size_t)d->n * sizeof(int32_t));
        memcpy(v, d->full_len, (size_t)d->n * sizeof(int32_t));
        qsort(v, (size_t)d->n, sizeof *v, cmp_i32);
        double mean = 0;
        int64_t ntr = 0;
        for (int64_t i = 0; i < d->n; i++) {
            mean += v[i];
            ntr += max_seq_len > 0 && v[i] > max_seq_len;
        }
        mean /= (double)d->n;
        char trs[32];
        snprintf(trs, sizeof trs, "%lld(%.1f%%)", (long long)ntr, 100.0 * (double)ntr / (double)d->n);
        printf("%-6s %6d %6d %6d %6d %7d %8.1f %12s %9.3fx %9.3fx\n", splits[s], pct(v, d->n, 50), pct(v, d->n, 90),
               pct(v, d->n, 95), pct(v, d->n, 99), v[d->n - 1], mean, trs, padding_of(d, batch_size, 0, (uint64_t)seed),
               padding_of(d, batch_size, 1, (uint64_t)seed));
        free(v);
    }
}

/* --dump-batches: the checksums of the first n shuffled batches of dump_split (as the trainer would
 * draw them) and of the sequence. Errors: a split that was not loaded (BQ_EINVAL). */
static int dump_batches(BqDataset *const ds[3], const char *dump_split, int n, int batch_size, int seed, int bucket) {
    int s = !strcmp(dump_split, "train") ? 0 : !strcmp(dump_split, "val") ? 1 : !strcmp(dump_split, "test") ? 2 : -1;
    if (s < 0 || !ds[s]) return bq_err(BQ_EINVAL, "data-stats: --dump-split '%s' is not a loaded split", dump_split);
    BqBatcher b;
    int st = bq_batcher_init(&b, ds[s], batch_size, 1, (uint64_t)seed, bucket);
    if (st) return st;
    BqBatch x;
    uint64_t all = 1469598103934665603ULL;
    int k = 0;
    printf("\nbatches of %s (batch %d, seed %d, bucket %d):\n", dump_split, batch_size, seed, bucket);
    while (k < n && bq_batcher_next(&b, &x)) {
        uint64_t h = bq_batch_checksum(&x);
        printf("batch %d B=%lld T=%lld checksum %016llx\n", k, (long long)x.B, (long long)x.T, (unsigned long long)h);
        all = (all ^ h) * 1099511628211ULL;
        k++;
    }
    printf("batches %d checksum %016llx\n", k, (unsigned long long)all);
    bq_batcher_free(&b);
    return BQ_OK;
}

int bq_cmd_data_stats(int argc, char **argv) {
    const char *vocab = NULL, *dump_split = "train";
    int max_seq_len = 512, seed = 42, train_samples = 0, eval_samples = 0, dump = 0, batch_size = 32,
        bucket = 0;
    double val_fraction = 0.0;
    BqCliData d = BQ_CLI_DATA_INIT;
    d.truncation = BQ_TRUNC_HEAD; /* no checkpoint here to take it from */
    const BqArgSpec specs[] = {
        {"data", BQ_ARG_STR, &d.path, "IMDB archive/aclImdb folder, CSV, TSV, JSONL, or folder with train/test files", 1, 0, 0},
        {"vocab", BQ_ARG_STR, &vocab, "vocab.txt (or the folder holding it)", 1, 0, 0},
        {"max-seq-len", BQ_ARG_INT, &max_seq_len, "encoded length cap incl. [CLS]/[SEP] (0: none)", 0, 0, 1 << 20},
        {"truncation", BQ_ARG_ENUM, &d.truncation, "tokens kept of a longer text", 0, 0, 0, bq_truncation_names,
         bq_truncation_values},
        BQ_CLI_COLUMN_SPECS(d),
        {"val-fraction", BQ_ARG_FLOAT, &val_fraction, "fraction of the kept train samples used as val", 0, 0, 0.99},
        {"seed", BQ_ARG_INT, &seed, "selection and shuffling seed", 0, 0, 2147483647.0},
        {"train-samples", BQ_ARG_INT, &train_samples, "train samples kept after the seeded shuffle (0: all)", 0, 0, 2147483647.0},
        {"eval-samples", BQ_ARG_INT, &eval_samples, "test samples kept after the seeded shuffle (0: all)", 0, 0, 2147483647.0},
        {"batch-size", BQ_ARG_INT, &batch_size, "batch size for the padding figures and --dump-batches", 0, 1, 1 << 16},
        {"bucket", BQ_ARG_FLAG, &bucket, "length bucketing for --dump-batches", 0, 0, 0},
        {"dump-batches", BQ_ARG_INT, &dump, "print checksums of the first N shuffled batches", 0, 0, 2147483647.0},
        {"dump-split", BQ_ARG_STR, &dump_split, "split for --dump-batches (train, val, test)", 0, 0, 0},
    };
    BqArgs args = {.cmd = "data-stats", .usage = "--data PATH --vocab PATH [options]",
                   .summary = "Counts per split and label, token-length percentiles and padding of a data source.",
                   .specs = specs, .nspecs = (int)(sizeof specs / sizeof specs[0]), .common = BQ_ARGS_THREADS,
                   .threads_help = "encoding threads (0: all CPUs)"};
    int st = bq_args_parse(&args, argc, argv);
    if (st || args.help) return st;
    if ((st = bq_cli_data_resolve(&d, NULL, NULL))) return st;

    BqTokenizer *tok = NULL;
    BqDataset *ds[3] = {NULL, NULL, NULL};
    char vpath[4096];
    struct stat sb;
    if (stat(vocab, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(vpath, sizeof vpath, "%s/vocab.txt", vocab);
    else snprintf(vpath, sizeof vpath, "%s", vocab);
    BqDataKind kind;
    int has_test;
    if ((st = bq_data_probe(d.path, &kind, &has_test))) goto cleanup;
    if ((st = bq_tokenizer_load(&tok, vpath, NULL))) goto cleanup;

    const char *splits[3] = {"train", "val", "test"};
    BqDataSpec spec;
    bq_cli_data_spec(&spec, &d, "train", (uint64_t)seed);
    spec.max_seq_len = max_seq_len;
    spec.val_fraction = val_fraction;
    spec.train_samples = train_samples;
    spec.eval_samples = eval_samples;
    printf("data: %s (%s)\nvocab: %s (hash %016llx), max_seq_len %d, truncation %s, seed %d\n", d.path,
           bq_data_kind_name(kind), vpath, (unsigned long long)bq_tokenizer_hash(tok), max_seq_len, bq_truncation_name(d.used.truncation), seed);
    for (int s = 0; s < 3; s++) {
        if (s == 1 && val_fraction <= 0) continue;
        if (s == 2 && !has_test) continue;
        spec.split = splits[s];
        if ((st = bq_dataset_load(&ds[s], &spec, tok))) goto cleanup;
        const BqDataset *d = ds[s];
        printf("%s: %s%s", splits[s], d->from_cache ? "loaded from cache" : "encoded", d->cache_rejected ? " (stale/corrupt cache rebuilt)" : "");
        if (!d->from_cache)
            printf(" in %.2f s (listing %.2f s, reading texts and encoding %.2f s with %d thread(s))", d->encode_seconds, d->read_seconds,
                   d->encode_seconds - d->read_seconds, bq_runtime_threads());
        if (d->cache_path) printf("%s %s", d->cache_write_failed ? "; cache NOT written:" : "; cache", d->cache_path);
        printf("\n");
    }

    print_counts(ds, splits);

    print_lengths(ds, splits, batch_size, max_seq_len, seed);

    if (dump > 0) st = dump_batches(ds, dump_split, dump, batch_size, seed, bucket);
cleanup:
    for (int s = 0; s < 3; s++) bq_dataset_free(ds[s]);
    if (tok) bq_tokenizer_free(tok);
    return st;
}
