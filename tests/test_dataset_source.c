/* Source readers (datasets/source.c) on the committed fixtures in tests/fixtures/data (made by
 * tests/make_dataset_fixtures.py): aclImdb folder vs archive (identical, deterministic order), CSV
 * quoting, TSV, JSONL, text pairs, empty-text skips, invalid UTF-8 passed through; no text held after the
 * listing of any source, the texts asked for read in chunks; and one clear error naming the file (and
 * line) for every bad input, including a review id listed twice and a review or a CSV/JSONL record
 * rewritten between the listing and the reading. Needs no tokenizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "datasets/source.h"
#include "tests/test_util.h"

static char root[1024];
static const char *fx(const char *rel) {
    static char buf[8][1200];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/tests/fixtures/data/%s", root, rel);
    return buf[k];
}

static int read_split(BqRawSet *r, const char *rel, const char *split, const BqSourceOptions *o) {
    BqDataKind k;
    int ht;
    int st = bq_data_probe(fx(rel), &k, &ht);
    if (st) return st;
    static const BqSourceOptions none = {0};
    return bq_source_read(r, fx(rel), k, split, o ? o : &none);
}

/* Expects failure whose message contains every needle. */
static void expect_error(const char *rel, const char *split, const BqSourceOptions *o, const char *n1, const char *n2) {
    BqRawSet r;
    memset(&r, 0, sizeof r);
    bq_err_clear();
    int st = read_split(&r, rel, split, o);
    const char *m = bq_errmsg();
    printf("  %-28s -> %s\n", rel, st ? m : "(no error!)");
    EXPECT(st != 0);
    EXPECT(strchr(m, '\n') == NULL);
    if (n1) EXPECT(strstr(m, n1) != NULL);
    if (n2) EXPECT(strstr(m, n2) != NULL);
    bq_raw_free(&r);
}

/* Checks the texts bq_source_texts hands out: each asked-for example once, at most chunk a call, with
 * the text its position names. */
typedef struct Seen {
    const char *const *want;
    const int64_t *sel;
    int64_t n, chunk;
    int calls, got, bad;
    int hit[16];
} Seen;

static int seen_texts(void *user, const int64_t *at, const BqRawExample *ex, int64_t cnt) {
    Seen *s = user;
    s->calls++;
    if (cnt < 1 || cnt > s->chunk) s->bad++;
    for (int64_t k = 0; k < cnt; k++) {
        if (at[k] < 0 || at[k] >= s->n || s->hit[at[k]]++) {
            s->bad++;
            continue;
        }
        const char *w = s->want[s->sel[at[k]]];
        if (!ex[k].text || ex[k].len != strlen(ex[k].text) || strncmp(ex[k].text, w, strlen(w))) s->bad++;
        s->got++;
    }
    return BQ_OK;
}

/* A review rewritten between the listing and the reading of its text: one clear error naming the file. */
static void changed_review(const char *src) {
    char dir[] = "/tmp/bq_source_XXXXXX", cmd[2600], file[1200];
    EXPECT(mkdtemp(dir) != NULL);
    snprintf(cmd, sizeof cmd, "cp -r '%s/tests/fixtures/data/imdb/aclImdb' '%s/'", src, dir);
    EXPECT(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s/aclImdb", dir);
    BqRawSet r;
    BqDataKind k;
    int ht;
    EXPECT(bq_data_probe(cmd, &k, &ht) == 0 && bq_source_read(&r, cmd, k, "train", &(BqSourceOptions){0}) == 0);
    snprintf(file, sizeof file, "%s/aclImdb/train/pos/2_8.txt", dir);
    FILE *f = fopen(file, "ab");
    EXPECT(f && fputs(" and more", f) >= 0 && fclose(f) == 0);
    bq_err_clear();
    EXPECT(bq_source_hold_texts(&r) != 0);
    printf("  changed review -> %s\n", bq_errmsg());
    EXPECT(strstr(bq_errmsg(), "2_8.txt") && strstr(bq_errmsg(), "changed while being read"));
    bq_raw_free(&r);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0);
}

/* A CSV/TSV/JSONL record rewritten (from, in the fixture rel, becomes to) between the listing and the
 * reading of its text: one clear error naming the file. */
static void changed_record(const char *src, const char *rel, const char *from, const char *to) {
    char dir[] = "/tmp/bq_source_XXXXXX", path[1200], cmd[3000];
    EXPECT(mkdtemp(dir) != NULL);
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    snprintf(cmd, sizeof cmd, "cp '%s/tests/fixtures/data/%s' '%s'", src, rel, path);
    EXPECT(system(cmd) == 0);
    BqRawSet r;
    BqDataKind k;
    int ht;
    BqSourceOptions o = {0};
    if (!strcmp(rel, "pairs.csv")) o = (BqSourceOptions){"premise", "hypothesis", NULL};
    EXPECT(bq_data_probe(path, &k, &ht) == 0 && bq_source_read(&r, path, k, "train", &o) == 0);
    snprintf(cmd, sizeof cmd, "sed -i 's/%s/%s/' '%s'", from, to, path);
    EXPECT(system(cmd) == 0);
    bq_err_clear();
    EXPECT(bq_source_hold_texts(&r) != 0);
    printf("  changed %-20s -> %s\n", rel, bq_errmsg());
    EXPECT(strstr(bq_errmsg(), rel) && strstr(bq_errmsg(), "changed while being read") && !strchr(bq_errmsg(), '\n'));
    bq_raw_free(&r);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0);
}

/* Text k of big_files: 5-8 KB of a deterministic mix, with quotes, commas and newlines for CSV. */
static void big_text(char *t, size_t cap, int k) {
    size_t n = 0;
    for (int w = 0; n + 40 < cap && w < 900 + 37 * (k % 11); w++)
        n += (size_t)snprintf(t + n, cap - n, w % 97 == 5 ? "\"q%d\", " : w % 131 == 7 ? "line%d\n" : "w%d ", k * 7 + w);
    t[n] = 0;
}

/* CSV and JSONL files of 500 texts of 5-8 KB (about 3 MiB: records cross the listing's 1 MiB windows, quoted
 * fields and lines among them): every text and label read back as written. */
static void big_files(void) {
    enum { N = 500, CAP = 16384 };
    char dir[] = "/tmp/bq_source_XXXXXX", path[2][1200], *t = bq_malloc(CAP), *q = bq_malloc(2 * CAP);
    EXPECT(mkdtemp(dir) != NULL);
    snprintf(path[0], sizeof path[0], "%s/big.csv", dir);
    snprintf(path[1], sizeof path[1], "%s/big.jsonl", dir);
    FILE *fc = fopen(path[0], "wb"), *fj = fopen(path[1], "wb");
    EXPECT(fc && fj);
    fputs("text,label\n", fc);
    for (int k = 0; k < N && fc && fj; k++) {
        big_text(t, CAP, k);
        size_t m = 0;
        for (const char *c = t; *c; c++) { /* CSV: quotes doubled; JSON: quotes and newlines escaped */
            if (*c == '"') q[m++] = '"';
            q[m++] = *c;
        }
        q[m] = 0;
        fprintf(fc, "\"%s\",%s\n", q, k % 2 ? "pos" : "neg");
        m = 0;
        for (const char *c = t; *c; c++) {
            if (*c == '"' || *c == '\n') q[m++] = '\\';
            q[m++] = *c == '\n' ? 'n' : *c;
        }
        q[m] = 0;
        fprintf(fj, "{\"text\": \"%s\", \"label\": \"%s\"}\n", q, k % 2 ? "pos" : "neg");
    }
    if (fc) fclose(fc);
    if (fj) fclose(fj);
    for (int f = 0; f < 2; f++) {
        BqRawSet r;
        BqDataKind kind;
        int ht, bad = 0;
        EXPECT(bq_data_probe(path[f], &kind, &ht) == 0 &&
               bq_source_read(&r, path[f], kind, "train", &(BqSourceOptions){0}) == 0 && bq_source_hold_texts(&r) == 0);
        for (int k = 0; k < N && k < r.n; k++) {
            big_text(t, CAP, k);
            bad += r.ex[k].len != strlen(t) || strcmp(r.ex[k].text, t) || strcmp(r.ex[k].label, k % 2 ? "pos" : "neg");
        }
        printf("  %-28s -> %lld texts, %d differ from what was written\n", f ? "big.jsonl" : "big.csv",
               (long long)r.n, bad);
        EXPECT(r.n == N && bad == 0);
        bq_raw_free(&r);
    }
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0);
    free(t);
    free(q);
}

/* A review id listed twice (two ratings of one id) in a folder and in an archive: one clear error. */
static void twice_listed(const char *src) {
    char dir[] = "/tmp/bq_source_XXXXXX", cmd[2600], p[1200];
    EXPECT(mkdtemp(dir) != NULL);
    snprintf(cmd, sizeof cmd,
             "cp -r '%s/tests/fixtures/data/imdb/aclImdb' '%s/' && echo 'Another take.' > '%s/aclImdb/train/pos/2_3.txt' && "
             "tar czf '%s/twice.tar.gz' -C '%s' aclImdb",
             src, dir, dir, dir, dir);
    EXPECT(system(cmd) == 0);
    const char *rel[2] = {"aclImdb", "twice.tar.gz"};
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof p, "%s/%s", dir, rel[k]);
        BqRawSet r;
        BqDataKind kind;
        int ht;
        memset(&r, 0, sizeof r);
        bq_err_clear();
        EXPECT(bq_data_probe(p, &kind, &ht) == 0 && bq_source_read(&r, p, kind, "train", &(BqSourceOptions){0}) != 0);
        printf("  %-28s -> %s\n", rel[k], bq_errmsg());
        EXPECT(strstr(bq_errmsg(), "pos/2_*.txt appears twice") && strchr(bq_errmsg(), '\n') == NULL);
        bq_raw_free(&r);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    EXPECT(system(cmd) == 0);
}

int main(void) {
    const char *src = getenv("BQ_SOURCE_DIR");
    snprintf(root, sizeof root, "%s", src ? src : ".");

    /* kinds */
    struct { const char *rel; BqDataKind kind; int has_test; } kinds[] = {
        {"imdb", BQ_DATA_IMDB_DIR, 1}, {"imdb/aclImdb", BQ_DATA_IMDB_DIR, 1}, {"imdb.tar.gz", BQ_DATA_IMDB_ARCHIVE, 1},
        {"kaggle.csv", BQ_DATA_CSV, 0}, {"ints.tsv", BQ_DATA_TSV, 0}, {"reviews.jsonl", BQ_DATA_JSONL, 0},
        {"split", BQ_DATA_SPLIT_DIR, 1}};
    for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
        BqDataKind k = 0;
        int ht = -1;
        int st = bq_data_probe(fx(kinds[i].rel), &k, &ht);
        EXPECT(st == 0 && k == kinds[i].kind && ht == kinds[i].has_test);
    }

    /* aclImdb folder: neg ids 1,3,11 then pos 0,2,10 (numeric order); 7_1.txt is blank: skipped. The set
     * holds no texts (lengths and labels only) until they are asked for. */
    BqRawSet d, a;
    EXPECT(read_split(&d, "imdb", "train", NULL) == 0);
    EXPECT(d.n == 6 && d.skipped_empty == 1 && d.fixed_imdb && d.lazy);
    for (int64_t i = 0; i < d.n; i++) EXPECT(d.ex[i].text == NULL && d.ex[i].len > 0);
    const char *want[6] = {"Dull", "The worst", "Bad lighting", "A wonderful", "Great acting", "I loved"};
    /* a selection read in chunks of 2: each text once, at its position, as the file holds it */
    const int64_t sel[4] = {0, 2, 3, 5};
    Seen seen = {.want = want, .sel = sel, .n = 4, .chunk = 2};
    EXPECT(bq_source_texts(&d, sel, 4, 2, seen_texts, &seen) == 0);
    EXPECT(seen.calls == 2 && seen.got == 4 && seen.bad == 0);
    EXPECT(bq_source_hold_texts(&d) == 0 && !d.lazy);
    for (int i = 0; i < 6 && i < d.n; i++) {
        EXPECT(d.ex[i].text && strncmp(d.ex[i].text, want[i], strlen(want[i])) == 0);
        EXPECT(strcmp(d.ex[i].label, i < 3 ? "neg" : "pos") == 0);
    }
    EXPECT(d.n > 2 && d.ex[2].text && memchr(d.ex[2].text, 0xff, d.ex[2].len) != NULL); /* invalid UTF-8 passed through */
    /* the archive (entries shuffled) gives the identical sequence; its texts come in archive order */
    EXPECT(read_split(&a, "imdb.tar.gz", "train", NULL) == 0);
    EXPECT(a.n == d.n && a.skipped_empty == d.skipped_empty && a.lazy);
    seen = (Seen){.want = want, .sel = sel, .n = 4, .chunk = 3};
    EXPECT(bq_source_texts(&a, sel, 4, 3, seen_texts, &seen) == 0);
    EXPECT(seen.calls == 2 && seen.got == 4 && seen.bad == 0);
    EXPECT(bq_source_hold_texts(&a) == 0);
    for (int64_t i = 0; i < a.n && i < d.n; i++)
        EXPECT(a.ex[i].text && a.ex[i].len == d.ex[i].len && !memcmp(a.ex[i].text, d.ex[i].text, a.ex[i].len) &&
               !strcmp(a.ex[i].label, d.ex[i].label));
    bq_raw_free(&a);
    bq_raw_free(&d);
    EXPECT(read_split(&a, "imdb.tar.gz", "test", NULL) == 0 && bq_source_hold_texts(&a) == 0);
    EXPECT(a.n == 4 && a.skipped_empty == 0 && !strncmp(a.ex[0].text, "Boring", 6) && !strcmp(a.ex[3].label, "pos"));
    bq_raw_free(&a);
    changed_review(root);
    twice_listed(root);

    /* identity: folder identity is stable across calls */
    uint64_t i1 = 0, i2 = 1;
    EXPECT(bq_source_identity(fx("imdb"), BQ_DATA_IMDB_DIR, "train", &i1) == 0);
    EXPECT(bq_source_identity(fx("imdb"), BQ_DATA_IMDB_DIR, "train", &i2) == 0 && i1 == i2);
    EXPECT(bq_source_identity(fx("imdb"), BQ_DATA_IMDB_DIR, "test", &i2) == 0 && i1 != i2);

    /* CSV: RFC 4180 quoting, "" escapes, embedded newline, CRLF, empty review skipped. The listing holds
     * no text (lengths, labels and lines only); a selection read in chunks of 1 gives each record's text
     * as parsed, with its quotes undone */
    EXPECT(read_split(&d, "kaggle.csv", "train", NULL) == 0);
    EXPECT(d.n == 4 && d.skipped_empty == 1 && d.lazy);
    for (int64_t i = 0; i < d.n; i++) EXPECT(d.ex[i].text == NULL && d.ex[i].pair == NULL && d.ex[i].len > 0);
    const char *kaggle[4] = {"One of the best films, \"truly\" great.", "A mess.\nTwo lines of pure boredom.",
                             "Plain unquoted review", "Caf"};
    const int64_t sel3[2] = {1, 3};
    seen = (Seen){.want = kaggle, .sel = sel3, .n = 2, .chunk = 1};
    EXPECT(bq_source_texts(&d, sel3, 2, 1, seen_texts, &seen) == 0);
    EXPECT(seen.calls == 2 && seen.got == 2 && seen.bad == 0);
    EXPECT(bq_source_hold_texts(&d) == 0 && !d.lazy);
    if (d.n == 4) {
        EXPECT(!strcmp(d.ex[0].text, "One of the best films, \"truly\" great.") && !strcmp(d.ex[0].label, "positive"));
        EXPECT(!strcmp(d.ex[1].text, "A mess.\nTwo lines of pure boredom.") && !strcmp(d.ex[1].label, "negative"));
        EXPECT(!strcmp(d.ex[2].text, "Plain unquoted review") && d.ex[2].line == 5);
        EXPECT(d.ex[0].line == 2 && d.ex[1].line == 3 && d.ex[3].line == 7);
    }
    bq_raw_free(&d);
    EXPECT(read_split(&d, "ints.tsv", "train", NULL) == 0);
    EXPECT(d.lazy && d.ex[0].text == NULL && bq_source_hold_texts(&d) == 0);
    EXPECT(d.n == 3 && !strcmp(d.ex[2].text, "meh") && !strcmp(d.ex[2].label, "2"));
    bq_raw_free(&d);
    EXPECT(read_split(&d, "reviews.jsonl", "train", NULL) == 0);
    EXPECT(d.lazy && d.ex[0].text == NULL);
    const char *jsonl[3] = {"great movie", "bad movie", "fine \xc3\xa9t\xc3\xa9"};
    const int64_t sel2[2] = {0, 2};
    seen = (Seen){.want = jsonl, .sel = sel2, .n = 2, .chunk = 2};
    EXPECT(bq_source_texts(&d, sel2, 2, 2, seen_texts, &seen) == 0);
    EXPECT(seen.calls == 1 && seen.got == 2 && seen.bad == 0);
    EXPECT(bq_source_hold_texts(&d) == 0);
    EXPECT(d.n == 3 && d.skipped_empty == 1 && !strcmp(d.ex[2].text, "fine \xc3\xa9t\xc3\xa9") && d.ex[2].line == 5);
    bq_raw_free(&d);
    BqSourceOptions pair = {"premise", "hypothesis", NULL};
    EXPECT(read_split(&d, "pairs.csv", "train", &pair) == 0);
    EXPECT(d.lazy && d.ex[1].pair == NULL && d.ex[1].pair_len == strlen("grass is blue"));
    EXPECT(bq_source_hold_texts(&d) == 0);
    EXPECT(d.n == 2 && d.ex[1].pair && !strcmp(d.ex[1].pair, "grass is blue") && !strcmp(d.ex[1].label, "0") &&
           !strcmp(d.ex[0].text, "a man sleeps") && !strcmp(d.ex[0].pair, "a person rests"));
    bq_raw_free(&d);
    EXPECT(read_split(&d, "split", "test", NULL) == 0 && bq_source_hold_texts(&d) == 0);
    EXPECT(d.n == 2 && !strcmp(d.ex[0].text, "awful"));
    bq_raw_free(&d);
    changed_record(root, "kaggle.csv", "Plain unquoted review", "Plain unquoted reviews");
    changed_record(root, "reviews.jsonl", "bad movie", "bad movies");
    changed_record(root, "pairs.csv", "grass is blue", "grass is blu");
    big_files();

    /* bad inputs: one line, naming the file (and line) */
    printf("errors:\n");
    BqSourceOptions col = {"review", NULL, NULL};
    expect_error("does/not/exist.csv", "train", NULL, "does/not/exist.csv", "No such file");
    expect_error("bad/empty.csv", "train", NULL, "empty.csv", "empty file");
    expect_error("bad/notes.txt", "train", NULL, "notes.txt", "unknown data file type");
    expect_error("bad/nopos", "train", NULL, "nopos/train", "without pos/");
    expect_error("bad/truncated.tar.gz", "train", NULL, "truncated.tar.gz", "truncated");
    expect_error("bad/damaged.tar.gz", "train", NULL, "damaged.tar.gz", "Damaged tar archive");
    expect_error("bad/corrupt.tar.gz", "train", NULL, "corrupt.tar.gz", "corrupt");
    expect_error("bad/missing_column.csv", "train", NULL, "missing_column.csv:1", "no text column");
    expect_error("bad/missing_column.csv", "train", &col, "missing_column.csv:1", "'review'");
    expect_error("bad/unterminated.csv", "train", NULL, "unterminated.csv:3", "unterminated");
    expect_error("bad/fields.csv", "train", NULL, "fields.csv:3", "expected 2 fields");
    expect_error("bad/broken.jsonl", "train", NULL, "broken.jsonl:3", "invalid JSON");
    expect_error("bad/only_empty.csv", "train", NULL, "only_empty.csv", "no examples");
    expect_error("bad", "train", NULL, "bad", "neither");

    printf("test_dataset_source: %d failure(s) (max error %d)\n", fails, fails);
    return fails ? 1 : 0;
}
