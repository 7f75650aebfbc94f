/* Word embeddings served from the checkpoint file by rows (layers/bert.h, bq_bert_word_rows_attach;
 * export/h5sum.h, bq_h5rows_open; export/ckpt.h, BqCkptLoadHook.word_rows):
 *  - bq_h5rows_open accepts a 2,000 × 256 tensor written by bq_h5sum_write_f32 (its Fletcher-32, summed
 *    over two buffers of the file, a partial 360-word block at the end, agrees with HDF5's) and every row
 *    it reads equals the tensor's; a byte changed inside the data is "checksum mismatch" at open; a
 *    contiguous tensor without checksum (the files of before the filter) reads the same rows; the whole
 *    tensor read by bq_h5sum_read_f32 (from the file itself, past HDF5: bq_h5sum_direct_reads counts it)
 *    equals it, and the changed byte is "checksum mismatch" there too;
 *  - the pool on its own (check_pool): rows right over calls that repeat and change words, a word of
 *    every call fetched once, growth to a call's distinct words, a failed fetch that leaves it usable;
 *  - a random cpu-scheme PTQ (vocabulary 500, hidden 256) saved and loaded with word_rows = 4 (the pool
 *    grows to one forward's words, then gives rows to new words): the word embeddings' storage is given
 *    back (no data, pages not resident), and over 12 random batches the logits equal, bit for bit, those
 *    of the model loaded whole (every parameter read from the file itself, bq_h5sum_direct_reads), on the
 *    fp32 engine and the fake-quant forward (a load without the engine)
 *    and on the int8 engine packed while loading; rows were given to other words;
 *  - the file cut short after the load: a forward that needs a row not fetched yet fails with a message
 *    naming model.h5 and the row (no crash), and the model is freed cleanly;
 *  - a corrupted word-embedding byte fails the load with "checksum mismatch" whether or not the rows are
 *    served from the file.
 * Prints the largest logit difference (0 when the test passes). */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "export/ckpt.h"
#include "export/h5sum.h"
#include "layers/bert_fp32.h"
#include "layers/bert_int8.h"
#include "layers/quant.h"
#include "layers/word_rows.h"
#include "tests/test_util.h"

enum { B = 3, T = 16, L = 2, H = 256, I = 512, VOCAB = 500, BATCHES = 12 };

static double maxd = 0.0;

/* The file offset of the data of dataset name in the HDF5 file path (one chunk or contiguous). */
static long data_offset(const char *path, const char *name) {
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    BQ_CHECK(f >= 0);
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    BQ_CHECK(ds >= 0);
    hsize_t coord[2] = {0, 0}, size = 0;
    unsigned mask = 0;
    haddr_t a = H5Dget_offset(ds);
    if (a == HADDR_UNDEF) BQ_CHECK(H5Dget_chunk_info_by_coord(ds, coord, &mask, &a, &size) >= 0);
    H5Dclose(ds);
    H5Fclose(f);
    return (long)a;
}

/* Adds 1 to byte `at` of the file. */
static void flip_byte(const char *path, long at) {
    FILE *fp = fopen(path, "r+b");
    BQ_CHECK(fp && fseek(fp, at, SEEK_SET) == 0);
    int c = fgetc(fp);
    BQ_CHECK(c != EOF && fseek(fp, at, SEEK_SET) == 0);
    fputc((c + 1) & 0xff, fp);
    fclose(fp);
}

static void copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    BQ_CHECK(a && b);
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) BQ_CHECK(fwrite(buf, 1, n, b) == n);
    fclose(a);
    BQ_CHECK(fclose(b) == 0);
}

/* bq_h5rows_open on a (rows, cols) tensor written with or without the checksum filter. */
static void check_rows_file(const char *dir) {
    enum { R = 2000, C = 256 };
    char path[400];
    float *w = bq_malloc(sizeof(float) * R * C), row[C];
    BqRng rng;
    bq_rng_seed(&rng, 3);
    for (int i = 0; i < R * C; i++) w[i] = bq_rng_normal(&rng);
    for (int sum = 1; sum >= 0; sum--) {
        snprintf(path, sizeof path, "%s/rows%d.h5", dir, sum);
        hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        const hsize_t dims[2] = {R, C};
        if (sum) {
            BQ_CHECK(bq_h5sum_write_f32(f, path, "w", "w", H5P_DEFAULT, 2, dims, w) == BQ_OK);
        } else {
            hid_t sp = H5Screate_simple(2, dims, NULL);
            hid_t ds = H5Dcreate2(f, "w", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
            BQ_CHECK(ds >= 0 && H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, w) >= 0);
            H5Dclose(ds);
            H5Sclose(sp);
        }
        H5Fclose(f);
        for (int corrupt = 0; corrupt <= sum; corrupt++) {
            if (corrupt) flip_byte(path, data_offset(path, "w") + 4 * (R * C / 2) + 1);
            f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
            hid_t ds = H5Dopen2(f, "w", H5P_DEFAULT);
            BqH5Rows *r = NULL;
            const int st = bq_h5rows_open(&r, ds, path, "w", R, C);
            if (corrupt) {
                EXPECT(st == BQ_EFORMAT && !r && strstr(bq_errmsg(), "checksum mismatch") &&
                           strstr(bq_errmsg(), "rows1.h5"),
                       "a changed byte: status %d, '%s'", st, bq_errmsg());
            } else {
                EXPECT(st == BQ_OK && r, "%s: open: %s", sum ? "with checksum" : "contiguous", bq_errmsg());
                int bad = 0;
                for (int i = 0; r && i < R; i += 37) {
                    BQ_CHECK(bq_h5rows_read(r, i, row) == BQ_OK);
                    bad += memcmp(row, w + (size_t)i * C, sizeof row) != 0;
                }
                EXPECT(bad == 0, "%s: %d rows differ from the tensor", sum ? "with checksum" : "contiguous", bad);
            }
            bq_err_clear();
            /* the whole tensor (2 MB) through bq_h5sum_read_f32, which reads it from the file itself */
            float *whole = bq_malloc(sizeof(float) * R * C);
            const int64_t direct0 = bq_h5sum_direct_reads();
            const int wst = bq_h5sum_read_f32(ds, path, "w", whole);
            EXPECT(bq_h5sum_direct_reads() == direct0 + 1, "%s: the tensor was not read directly",
                   sum ? "with checksum" : "contiguous");
            if (corrupt)
                EXPECT(wst == BQ_EFORMAT && strstr(bq_errmsg(), "checksum mismatch") && strstr(bq_errmsg(), "rows1.h5"),
                       "a changed byte, whole read: status %d, '%s'", wst, bq_errmsg());
            else
                EXPECT(wst == BQ_OK && memcmp(whole, w, sizeof(float) * R * C) == 0, "%s: whole read: status %d, %s",
                       sum ? "with checksum" : "contiguous", wst, wst ? bq_errmsg() : "values differ");
            bq_err_clear();
            free(whole);
            bq_h5rows_close(r);
            H5Dclose(ds);
            H5Fclose(f);
        }
    }
    free(w);
}

/* The pool's fetch in check_pool: row id is id·1000 + e, except that the word `fail` (when ≥ 0) fails. */
typedef struct FakeTable {
    int64_t fetches[64];
    int fail;
} FakeTable;

static int fake_fetch(void *user, int64_t id, float *dst) {
    FakeTable *t = user;
    if (id == t->fail) return bq_err(BQ_EIO, "word %lld cannot be read", (long long)id);
    t->fetches[id]++;
    for (int e = 0; e < 4; e++) dst[e] = (float)(id * 1000 + e);
    return BQ_OK;
}

/* One bq_word_rows_map call: every token's row holds its word; returns the number of wrong values. */
static int map_check(BqWordRows *w, const int32_t *ids, int64_t n) {
    int32_t local[64];
    BqTensor table;
    if (bq_word_rows_map(w, ids, n, local, &table) != BQ_OK) return -1;
    int bad = 0;
    for (int64_t i = 0; i < n; i++)
        for (int e = 0; e < 4; e++) bad += table.data[local[i] * 4 + e] != (float)(ids[i] * 1000 + e);
    return bad;
}

/* The pool on its own (vocabulary 64, rows of 4 floats, 8 rows): calls of repeated words are served
 * right; a word used in every call stays while 40 others pass through (fetched once); a call of 12
 * distinct words grows the pool to 12 rows and the next calls still evict; a failed fetch returns its
 * error and leaves the pool usable (the word is fetched on the next call, every row still right). */
static void check_pool(void) {
    FakeTable t = {.fail = -1};
    BqWordRows *w = bq_word_rows_new(fake_fetch, NULL, &t, 64, 4, 8);
    int bad = 0;
    for (int k = 0; k < 40; k++) { /* word 7 in every call, beside three words that change */
        const int32_t ids[6] = {7, 10 + k % 50, 7, 11 + (k * 3) % 50, 12 + (k * 7) % 50, 7};
        bad += map_check(w, ids, 6);
    }
    int64_t fetched = 0, evicted = 0, cap = 0;
    bq_word_rows_stats(w, &fetched, &evicted, &cap);
    EXPECT(bad == 0 && t.fetches[7] == 1 && cap == 8 && evicted > 0,
           "pool: %d wrong values; the word of every call fetched %lld times; %lld rows, %lld evicted", bad,
           (long long)t.fetches[7], (long long)cap, (long long)evicted);
    const int32_t wide[14] = {20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 20, 31};
    bad = map_check(w, wide, 14);
    bq_word_rows_stats(w, NULL, NULL, &cap);
    EXPECT(bad == 0 && cap == 12, "pool: a call of 12 words: %d wrong values, %lld rows", bad, (long long)cap);
    for (int k = 0; k < 20; k++) {
        const int32_t ids[3] = {40 + k, 7, 41 + k};
        bad += map_check(w, ids, 3);
    }
    t.fail = 63; /* a word not asked for before */
    const int32_t f[4] = {58, 63, 1, 7};
    const int st = map_check(w, f, 4);
    EXPECT(st == -1 && strstr(bq_errmsg(), "word 63"), "pool: a failed fetch: %d, '%s'", st, bq_errmsg());
    bq_err_clear();
    t.fail = -1;
    const int64_t before = t.fetches[63];
    bad += map_check(w, f, 4);
    for (int k = 0; k < 30; k++) {
        const int32_t ids[5] = {(int32_t)(k % 64), 63, (int32_t)((k * 5) % 64), 58, 1};
        bad += map_check(w, ids, 5);
    }
    EXPECT(bad == 0 && t.fetches[63] > before, "pool after a failed fetch: %d wrong values, word fetched again: %s",
           bad, t.fetches[63] > before ? "yes" : "no");
    bq_word_rows_stats(w, &fetched, &evicted, &cap);
    printf("pool of 8 rows (grown to %lld): %lld fetches, %lld rows given to other words, word of every call "
           "fetched %lld time(s)\n", (long long)cap, (long long)fetched, (long long)evicted, (long long)t.fetches[7]);
    bq_word_rows_free(w);
}

/* A random cpu-scheme PTQ, max-calibrated on random batches, saved to dir. */
static void make_checkpoint(const char *dir) {
    BqRng rng;
    bq_rng_seed(&rng, 17);
    BqBertConfig c = bq_test_config(VOCAB, H, L, 4, I, 64, 2, 0.0f, 0.05f);
    BqBert m;
    BQ_CHECK(bq_bert_create(&m, &c, 0, &rng) == BQ_OK);
    BqQuantConfig qc;
    bq_quant_config_default(&qc);
    BQ_CHECK(bq_scheme_parse(&qc.scheme, "cpu", "scheme") == BQ_OK);
    BQ_CHECK(bq_quant_create(&m.quant, &m, &qc) == BQ_OK);
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 26, "calib") == BQ_OK);
    bq_quant_calib_begin(m.quant, BQ_CALIBRATOR_MAX);
    for (int i = 0; i < 3; i++) {
        int32_t ids[B * T], types[B * T];
        float mask[B * T];
        BqBertInput in = bq_test_padded_input(B, T, VOCAB, 100 + (uint64_t)i, ids, types, mask, NULL);
        BqCtx ctx = {.act = &act};
        BqTensor *lg;
        BQ_CHECK(bq_bert_forward(&m, &ctx, &in, &lg, NULL) == BQ_OK);
        bq_arena_rewind(&act, 0);
    }
    BQ_CHECK(bq_quant_calib_finish(m.quant, BQ_CALIBRATOR_MAX, 0.0) == BQ_OK);
    bq_arena_free(&act);
    BQ_CHECK(bq_ckpt_save(&m, dir, NULL, NULL) == BQ_OK);
    bq_quant_free(m.quant);
    m.quant = NULL;
    bq_bert_free(&m);
}

/* The load hook: nothing (a model without an engine), or the int8 engine packed while loading. */
typedef struct Load {
    int engine;
    BqInt8Engine *e;
} Load;

static int on_param(void *user, BqBert *m, int i) {
    Load *ld = user;
    if (!ld->engine) return BQ_OK;
    if (!ld->e) BQ_CHECK(bq_int8_begin(&ld->e, m) == BQ_OK);
    return bq_int8_load_step(ld->e, m, i);
}

/* Loads dir into m: whole (rows 0) or with the word rows served from the file through a pool of rows. */
static int load(BqBert *m, const char *dir, int64_t rows, Load *ld) {
    memset(m, 0, sizeof *m);
    BqCkptLoadHook hook = {.param_read = on_param, .user = ld, .word_rows = rows};
    return bq_ckpt_load_with(m, dir, &hook);
}

static void free_model(BqBert *m, Load *ld) {
    bq_int8_free(ld->e);
    ld->e = NULL;
    bq_quant_free(m->quant);
    m->quant = NULL;
    bq_bert_free(m);
}

enum { FWD_FP32, FWD_FAKE_QUANT, FWD_INT8 };

/* Logits (B·2) of batch k through one of the forwards; the status of the forward. */
static int logits_of(BqBert *m, BqInt8Engine *e, int fwd, int k, float *out) {
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 26, "act") == BQ_OK);
    int32_t ids[B * T], types[B * T];
    float mask[B * T];
    BqBertInput in = bq_test_padded_input(B, T, VOCAB, 1000 + (uint64_t)k, ids, types, mask, NULL);
    BqCtx ctx = {.act = &act};
    BqTensor *lg = NULL;
    const int st = fwd == FWD_INT8         ? bq_int8_forward(e, m, &ctx, &in, &lg)
                   : fwd == FWD_FAKE_QUANT ? bq_bert_forward(m, &ctx, &in, &lg, NULL)
                                           : bq_fp32_forward(m, &ctx, &in, &lg);
    if (!st) memcpy(out, lg->data, sizeof(float) * B * 2);
    bq_arena_free(&act);
    return st;
}

/* The model loaded whole against the model whose word rows come from the file, batch by batch. */
static void check_same_logits(const char *dir) {
    static const char *const name[3] = {"fp32", "fake quant", "int8"};
    for (int fwd = FWD_FP32; fwd <= FWD_INT8; fwd++) {
        BqBert whole, rows;
        Load lw = {.engine = fwd == FWD_INT8}, lr = {.engine = fwd == FWD_INT8};
        const int64_t direct0 = bq_h5sum_direct_reads();
        BQ_CHECK(load(&whole, dir, 0, &lw) == BQ_OK);
        EXPECT(bq_h5sum_direct_reads() - direct0 >= whole.params.n, "%s: %lld of %d parameters read from the file "
               "itself", name[fwd], (long long)(bq_h5sum_direct_reads() - direct0), whole.params.n);
        EXPECT(load(&rows, dir, 4, &lr) == BQ_OK, "%s: load with the rows from the file: %s", name[fwd], bq_errmsg());
        if (fails) return;
        /* the fp32 engine on the checkpoint's float weights: its quantizers set aside meanwhile */
        BqQuantState *qw = whole.quant, *qr = rows.quant;
        if (fwd == FWD_FP32) whole.quant = rows.quant = NULL;
        EXPECT(rows.word_rows && !rows.word_emb.data && whole.word_emb.data, "%s: the table's storage released",
               name[fwd]);
        int bad = 0;
        for (int k = 0; k < BATCHES; k++) {
            float a[B * 2], b[B * 2];
            BQ_CHECK(logits_of(&whole, lw.e, fwd, k, a) == BQ_OK);
            EXPECT(logits_of(&rows, lr.e, fwd, k, b) == BQ_OK, "%s: forward: %s", name[fwd], bq_errmsg());
            for (int i = 0; i < B * 2; i++) maxd = fmax(maxd, fabs((double)a[i] - b[i]));
            bad += memcmp(a, b, sizeof a) != 0;
        }
        int64_t fetched = 0, evicted = 0, cap = 0;
        bq_word_rows_stats(rows.word_rows, &fetched, &evicted, &cap);
        printf("%s: %d batches, %d with other logits; %lld rows fetched, pool of %lld rows, %lld given to other "
               "words\n", name[fwd], BATCHES, bad, (long long)fetched, (long long)cap, (long long)evicted);
        EXPECT(bad == 0, "%s: %d of %d batches give other logits with the rows from the file", name[fwd], bad,
               BATCHES);
        EXPECT(cap > 4 && cap <= B * T && evicted >= 1, "%s: the pool grew to one forward's words (%lld rows) and "
               "rows were given to other words (%lld)", name[fwd], (long long)cap, (long long)evicted);
        whole.quant = qw, rows.quant = qr;
        free_model(&whole, &lw);
        free_model(&rows, &lr);
    }
}

/* The file cut short after the load: the next row not in the pool cannot be read. */
static void check_truncated(const char *dir) {
    char path[400];
    snprintf(path, sizeof path, "%s/model.h5", dir);
    BqBert m;
    Load ld = {.engine = 1};
    BQ_CHECK(load(&m, dir, 4, &ld) == BQ_OK);
    BQ_CHECK(truncate(path, data_offset(path, "/params/bert.embeddings.word_embeddings.weight") + 4 * H) == 0);
    float out[B * 2];
    const int st = logits_of(&m, ld.e, FWD_INT8, 0, out);
    EXPECT(st == BQ_EIO && strstr(bq_errmsg(), "model.h5") && strstr(bq_errmsg(), "cannot read row"),
           "a file cut short: status %d, '%s'", st, bq_errmsg());
    printf("file cut short: %s\n", bq_errmsg());
    bq_err_clear();
    free_model(&m, &ld);
}

/* A changed byte of the word embeddings fails the load, rows from the file or not. */
static void check_corrupt(const char *dir) {
    char path[400];
    snprintf(path, sizeof path, "%s/model.h5", dir);
    flip_byte(path, data_offset(path, "/params/bert.embeddings.word_embeddings.weight") + 4 * H * 100 + 2);
    for (int64_t rows = 0; rows <= 4; rows += 4) {
        BqBert m;
        Load ld = {.engine = 1};
        const int st = load(&m, dir, rows, &ld);
        EXPECT(st == BQ_EFORMAT && strstr(bq_errmsg(), "checksum mismatch") &&
                   strstr(bq_errmsg(), "word_embeddings"),
               "rows %lld: a corrupt table loads: status %d, '%s'", (long long)rows, st, bq_errmsg());
        bq_err_clear();
        free_model(&m, &ld);
    }
}

int main(void) {
    bq_h5_init();
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    char tmp[256], dir[300], cut[300], bad[300], src[400], dst[400];
    bq_test_tmpdir(tmp, sizeof tmp, "word_rows");
    check_rows_file(tmp);
    check_pool();
    snprintf(dir, sizeof dir, "%s/ptq", tmp);
    make_checkpoint(dir);
    check_same_logits(dir);
    /* copies for the destructive checks */
    const char *files[] = {"model.h5", "config.json"};
    snprintf(cut, sizeof cut, "%s/cut", tmp);
    snprintf(bad, sizeof bad, "%s/bad", tmp);
    for (int d = 0; d < 2; d++) {
        BQ_CHECK(bq_mkdir_p(d ? bad : cut) == BQ_OK);
        for (int i = 0; i < 2; i++) {
            snprintf(src, sizeof src, "%s/%s", dir, files[i]);
            snprintf(dst, sizeof dst, "%s/%s", d ? bad : cut, files[i]);
            copy_file(src, dst);
        }
    }
    check_truncated(cut);
    check_corrupt(bad);
    printf("max |logit difference| %.3g\n", maxd);
    bq_test_rmtree(tmp);
    if (!fails) printf("ok\n");
    return fails ? 1 : 0;
}
