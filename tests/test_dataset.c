/* bq_dataset_load (datasets/dataset.c) on the committed fixtures with the bert-base-uncased vocabulary:
 * every encoded example equals bq_tokenizer_encode of its source text (head/tail/head_tail truncation,
 * pairs), archive == folder, 1 thread == 2 threads, the recipe's split selection (seeded shuffle, take N,
 * carve val), label indexing for IMDB/CSV/TSV/JSONL/split folder, and the cache: hit on reload, and a
 * corrupt, truncated or foreign cache file detected and rebuilt. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "datasets/dataset.h"
#include "datasets/source.h"
#include "tokenizer/tokenizer.h"
#include "tests/test_util.h"

static char root[1024], cache[256];
static const BqTokenizer *tok;

static const char *fx(const char *rel) {
    static char buf[8][1200];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/tests/fixtures/data/%s", root, rel);
    return buf[k];
}

static BqDataSpec spec_for(const char *rel, const char *split) {
    BqDataSpec s;
    bq_data_spec_default(&s);
    s.path = fx(rel);
    s.split = split;
    s.cache_dir = cache;
    return s;
}

static BqDataset *load(const BqDataSpec *s) {
    BqDataset *d = NULL;
    int st = bq_dataset_load(&d, s, tok);
    if (st) fprintf(stderr, "load %s/%s: %s\n", s->path, s->split, bq_errmsg());
    EXPECT(st == 0 && d);
    return d;
}

static int same(const BqDataset *a, const BqDataset *b) {
    if (!a || !b || a->n != b->n || a->nlabels != b->nlabels || a->offsets[a->n] != b->offsets[b->n]) return 0;
    return !memcmp(a->offsets, b->offsets, (size_t)(a->n + 1) * 8) && !memcmp(a->ids, b->ids, (size_t)a->offsets[a->n] * 4) &&
           !memcmp(a->types, b->types, (size_t)a->offsets[a->n]) && !memcmp(a->labels, b->labels, (size_t)a->n * 4) &&
           !memcmp(a->full_len, b->full_len, (size_t)a->n * 4) && !memcmp(a->source_index, b->source_index, (size_t)a->n * 8);
}

/* Every example equals the tokenizer's own encoding of the source text; returns the max id mismatch count. */
static int check_encoding(const BqDataset *d, const char *rel, const char *split, const BqDataSpec *s) {
    BqRawSet r;
    BqDataKind k;
    int ht, bad = 0;
    BqSourceOptions o = {s->text_column, s->text_pair_column, s->label_column};
    EXPECT(bq_data_probe(fx(rel), &k, &ht) == 0);
    EXPECT(bq_source_read(&r, fx(rel), k, split, &o) == 0);
    EXPECT(bq_source_hold_texts(&r) == 0);
    int32_t ids[4096], types[4096];
    for (int64_t i = 0; i < d->n; i++) {
        const BqRawExample *x = &r.ex[d->source_index[i]];
        int64_t n = bq_tokenizer_encode(tok, x->text, x->len, x->pair, x->pair_len, s->max_seq_len, s->truncation, ids, types, 4096);
        int64_t full = bq_tokenizer_encode(tok, x->text, x->len, x->pair, x->pair_len, 0, s->truncation, ids + 2048, types + 2048, 2048);
        if (n != bq_dataset_len(d, i) || full != d->full_len[i]) {
            bad++;
            continue;
        }
        for (int64_t t = 0; t < n; t++)
            if (ids[t] != d->ids[d->offsets[i] + t] || types[t] != d->types[d->offsets[i] + t]) bad++;
    }
    bq_raw_free(&r);
    return bad;
}

static void rm_cache(void) {
    DIR *dir = opendir(cache);
    struct dirent *e;
    char p[512];
    while (dir && (e = readdir(dir)))
        if (e->d_name[0] != '.') snprintf(p, sizeof p, "%s/%s", cache, e->d_name), unlink(p);
    if (dir) closedir(dir);
}

static void damage(const char *path, long at, int truncate_to) {
    FILE *f = fopen(path, "r+b");
    EXPECT(f != NULL);
    if (!f) return;
    if (truncate_to) {
        fclose(f);
        EXPECT(truncate(path, at) == 0);
        return;
    }
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

int main(void) {
    const char *src = getenv("BQ_SOURCE_DIR"), *data = getenv("BERTQAT_DATA");
    snprintf(root, sizeof root, "%s", src ? src : ".");
    char vocab[2200];
    /* BERTQAT_DATA, else ../shared/data beside the checkout (the README's layout) */
    if (data) snprintf(vocab, sizeof vocab, "%s/vocab/bert-base-uncased/vocab.txt", data);
    else snprintf(vocab, sizeof vocab, "%s/../shared/data/vocab/bert-base-uncased/vocab.txt", root);
    BqTokenizer *t = NULL;
    if (bq_tokenizer_load(&t, vocab, NULL)) {
        fprintf(stderr, "test_dataset: %s (set BERTQAT_DATA)\n", bq_errmsg());
        return 1;
    }
    tok = t;
    bq_test_tmpdir(cache, sizeof cache, "dataset");

    /* IMDB folder, all of train: 6 reviews (1 blank skipped), labels neg/pos */
    BqDataSpec s = spec_for("imdb", "train");
    s.max_seq_len = 8;
    BqDataset *d = load(&s);
    if (!d) return 1;
    EXPECT(d->n == 6 && d->source_count == 6 && d->skipped_empty == 1 && d->nlabels == 2);
    EXPECT(!strcmp(d->label_names[0], "neg") && !strcmp(d->label_names[1], "pos"));
    int npos = 0;
    for (int64_t i = 0; i < d->n; i++) npos += d->labels[i] == 1 && d->source_index[i] >= 3;
    EXPECT(npos == 3); /* source order neg..., pos... */
    EXPECT(d->from_cache == 0 && d->max_len <= 8);
    int mismatch = check_encoding(d, "imdb", "train", &s);
    EXPECT(mismatch == 0);
    for (int tr = 1; tr <= 2; tr++) {
        BqDataSpec s2 = s;
        s2.truncation = (BqTruncation)tr;
        BqDataset *d2 = load(&s2);
        if (d2) EXPECT(check_encoding(d2, "imdb", "train", &s2) == 0 && d2->cache_path && strcmp(d2->cache_path, d->cache_path));
        bq_dataset_free(d2);
    }
    /* archive == folder; threads do not matter; reload hits the cache */
    BqDataSpec sa = spec_for("imdb.tar.gz", "train");
    sa.max_seq_len = 8;
    sa.threads = 1;
    BqDataset *da = load(&sa);
    EXPECT(same(d, da));
    bq_dataset_free(da);
    s.threads = 2;
    BqDataset *dc = load(&s);
    EXPECT(dc && dc->from_cache == 1 && same(d, dc));
    /* corrupt payload byte, bad magic, truncation: each detected, rebuilt, identical */
    long offs[3] = {200, 0, 100};
    for (int k = 0; k < 3 && dc; k++) {
        damage(dc->cache_path, offs[k], k == 2);
        BqDataset *dr = load(&s);
        EXPECT(dr && dr->from_cache == 0 && dr->cache_rejected == 1 && same(d, dr));
        bq_dataset_free(dr);
        dr = load(&s);
        EXPECT(dr && dr->from_cache == 1 && same(d, dr));
        bq_dataset_free(dr);
    }
    bq_dataset_free(dc);
    bq_dataset_free(d);

    /* split selection: keep 4 of 6 with the seed, last ceil(0.25*4)=1 is val; test keeps 3 of 4 */
    s = spec_for("imdb.tar.gz", "train");
    s.train_samples = 4;
    s.val_fraction = 0.25;
    BqDataset *tr = load(&s);
    s.split = "val";
    BqDataset *va = load(&s);
    s.split = "train";
    s.train_samples = 0;
    s.val_fraction = 0;
    BqDataset *all = load(&s);
    if (tr && va && all) {
        EXPECT(tr->n == 3 && va->n == 1);
        /* train then val = the first 4 of the full seeded order */
        for (int64_t i = 0; i < 3; i++) EXPECT(tr->source_index[i] == all->source_index[i]);
        EXPECT(va->source_index[0] == all->source_index[3]);
        EXPECT(check_encoding(tr, "imdb", "train", &s) == 0);
    }
    bq_dataset_free(tr);
    bq_dataset_free(va);
    s.seed = 7;
    BqDataset *other = load(&s);
    if (other && all) EXPECT(memcmp(other->source_index, all->source_index, 6 * 8) != 0);
    bq_dataset_free(other);
    bq_dataset_free(all);
    s = spec_for("imdb", "test");
    s.eval_samples = 3;
    BqDataset *te = load(&s);
    EXPECT(te && te->n == 3 && te->source_count == 4);
    bq_dataset_free(te);

    /* generic sources and labels */
    s = spec_for("kaggle.csv", "train");
    d = load(&s);
    EXPECT(d && d->n == 4 && d->nlabels == 2 && !strcmp(d->label_names[0], "negative") && !strcmp(d->label_names[1], "positive"));
    if (d) EXPECT(check_encoding(d, "kaggle.csv", "train", &s) == 0);
    bq_dataset_free(d);
    s = spec_for("ints.tsv", "train");
    d = load(&s);
    EXPECT(d && d->n == 3 && d->nlabels == 3 && !strcmp(d->label_names[2], "2"));
    for (int64_t i = 0; d && i < d->n; i++) EXPECT(d->labels[i] == (int32_t)(d->source_index[i] == 0 ? 1 : d->source_index[i] == 1 ? 0 : 2));
    bq_dataset_free(d);
    s = spec_for("reviews.jsonl", "test");
    d = load(&s);
    EXPECT(d && d->n == 3 && d->skipped_empty == 1 && d->nlabels == 2 && !strcmp(d->label_names[1], "pos"));
    bq_dataset_free(d);
    s = spec_for("pairs.csv", "train");
    s.text_column = "premise";
    s.text_pair_column = "hypothesis";
    s.max_seq_len = 7;
    d = load(&s);
    int ones = 0;
    for (int64_t i = 0; d && i < d->offsets[d->n]; i++) ones += d->types[i];
    EXPECT(d && d->n == 2 && ones > 0 && check_encoding(d, "pairs.csv", "train", &s) == 0);
    bq_dataset_free(d);
    s = spec_for("split", "test");
    d = load(&s);
    EXPECT(d && d->n == 2 && d->nlabels == 2 && !strcmp(d->label_names[0], "negative"));
    bq_dataset_free(d);

    /* errors: one line naming the file and line */
    struct { const char *rel, *split, *needle; } bad[] = {
        {"bad/unknown_label", "test", "test.csv:3: unknown label 'neutral'"},
        {"bad/truncated.tar.gz", "train", "truncated.tar.gz"},
        {"bad/unterminated.csv", "train", "unterminated.csv:3"},
        {"bad/sparse_labels.csv", "train", "sparse_labels.csv:3: label 5000"},
        {"imdb", "valid", "--split"},
        {"imdb", "val", "val-fraction"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        s = spec_for(bad[k].rel, bad[k].split);
        d = NULL;
        int st = bq_dataset_load(&d, &s, tok);
        printf("  %-22s %-5s -> %s\n", bad[k].rel, bad[k].split, st ? bq_errmsg() : "(no error!)");
        EXPECT(st != 0 && d == NULL && strstr(bq_errmsg(), bad[k].needle) && !strchr(bq_errmsg(), '\n'));
    }

    rm_cache();
    rmdir(cache);
    bq_tokenizer_free(t);
    printf("test_dataset: %d failure(s), encoding mismatches %d (max error %d)\n", fails, mismatch, fails);
    return fails ? 1 : 0;
}
