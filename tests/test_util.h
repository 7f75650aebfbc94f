/* Helpers shared by the C tests (header only): the EXPECT macro and its failure counter, a small BERT
 * configuration, temporary directories, and a minimal safetensors reader for the fixtures made by
 * tests/make_bert_fixture.py (8-byte little-endian header length, JSON header
 * {name: {dtype, shape, data_offsets}}, raw little-endian data), so that the reference tests depend
 * only on the model code and the ops, not on export/safetensors.c.
 *
 * A test counts failures in `fails` and returns non-zero from main when it is positive. */
#ifndef BQ_TEST_UTIL_H
#define BQ_TEST_UTIL_H

#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "autograd/tensor.h"
#include "layers/bert.h"
#include "layers/quant.h"

/* Failures so far; every EXPECT that does not hold adds one. */
static int fails = 0;

static inline void bq_test_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static inline void bq_test_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    fprintf(stderr, "FAIL %s:%d: %s", file, line, cond);
    if (fmt[1]) { /* fmt is " " followed by the caller's format (none: nothing more to print) */
        va_list ap;
        va_start(ap, fmt);
        fputc(':', stderr);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fputc('\n', stderr);
    fails++;
}

/* EXPECT(cond) or EXPECT(cond, "format", ...): when cond is false, prints
 * "FAIL file:line: cond: message" to stderr and counts a failure; the test goes on. */
#define EXPECT(cond, ...)                                                        \
    do {                                                                         \
        if (!(cond)) bq_test_fail(__FILE__, __LINE__, #cond, " " __VA_ARGS__);   \
    } while (0)

/* A padded batch of random token ids for the tiny-model tests, (B,T) each: example b has T − short_by·b
 * tokens (ids drawn from rng in [1, vocab), then [PAD] 0), mask 1 on its tokens, token type 1 on the
 * second half of them. */
static inline void bq_test_padded_batch(int32_t *ids, int32_t *types, float *mask, int B, int T, BqRng *rng,
                                        int vocab, int short_by) {
    for (int b = 0; b < B; b++) {
        int len = T - short_by * b;
        for (int t = 0; t < T; t++) {
            int i = b * T + t;
            ids[i] = t < len ? 1 + (int32_t)bq_rng_below(rng, (uint64_t)vocab - 1) : 0;
            mask[i] = t < len ? 1.0f : 0.0f;
            types[i] = t >= len / 2 && t < len;
        }
    }
}

/* bq_test_padded_batch (each example 2 tokens shorter) from a generator seeded with seed, and the
 * classification input over those arrays with labels (B entries). */
static inline BqBertInput bq_test_padded_input(int B, int T, int vocab, uint64_t seed, int32_t *ids, int32_t *types,
                                               float *mask, const int32_t *labels) {
    BqRng rng;
    bq_rng_seed(&rng, seed);
    bq_test_padded_batch(ids, types, mask, B, T, &rng, vocab, 2);
    return (BqBertInput){.B = B, .T = T, .input_ids = ids, .attention_mask = mask, .token_type_ids = types,
                         .labels = labels};
}

/* A tape and an activation arena of 1 GiB reserved with 4 KiB pages only, so that residency
 * (bq_test_resident_bytes) shows exactly which pages were written: a huge page faulted in for one buffer
 * would also make its neighbours resident. */
static inline void bq_test_step_small_pages(BqArena *act, BqTape *tape) {
    BQ_CHECK(bq_arena_init(act, (size_t)1 << 30, "act") == BQ_OK);
    BQ_CHECK(madvise(act->base, act->cap, MADV_NOHUGEPAGE) == 0);
    BQ_CHECK(bq_tape_init(tape, 64) == BQ_OK);
}

/* Bytes of the whole pages of [p, p + bytes) that are resident (mincore). */
static inline size_t bq_test_resident_bytes(const void *p, size_t bytes) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p, hi = lo + bytes;
    const uintptr_t a = (lo + page - 1) / page * page, b = hi / page * page;
    if (b <= a) return 0;
    size_t np = (b - a) / page, in = 0;
    unsigned char *vec = bq_malloc(np);
    BQ_CHECK(mincore((void *)a, b - a, vec) == 0);
    for (size_t k = 0; k < np; k++) in += vec[k] & 1;
    free(vec);
    return in * page;
}

/* dir/vocab.txt of n tokens tok0 … tok(n−1), dir created (a tokenizer folder for trainer tests). */
static inline void bq_test_write_vocab(const char *dir, int n) {
    char p[512];
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "%s/vocab.txt", dir);
    FILE *f = fopen(p, "w");
    BQ_CHECK(f != NULL);
    for (int i = 0; i < n; i++) fprintf(f, "tok%d\n", i);
    BQ_CHECK(fclose(f) == 0);
}

/* A small BERT configuration: type vocabulary 2, pad id 0, LayerNorm eps 1e-12, dropout p on the
 * hidden states and attention probabilities (the classifier follows the hidden dropout),
 * initializer range init, labels named LABEL_0, LABEL_1, ... (freed by bq_config_free or with the
 * model). */
static inline BqBertConfig bq_test_config(int vocab, int hidden, int layers, int heads, int inter, int maxpos,
                                          int labels, float dropout, float init) {
    BqBertConfig c;
    memset(&c, 0, sizeof c);
    c.vocab_size = vocab;
    c.hidden_size = hidden;
    c.num_hidden_layers = layers;
    c.num_attention_heads = heads;
    c.intermediate_size = inter;
    c.max_position_embeddings = maxpos;
    c.type_vocab_size = 2;
    c.pad_token_id = 0;
    c.layer_norm_eps = 1e-12f;
    c.hidden_dropout_prob = dropout;
    c.attention_probs_dropout_prob = dropout;
    c.classifier_dropout = -1.0f;
    c.initializer_range = init;
    c.num_labels = labels;
    c.id2label = bq_calloc((size_t)labels, sizeof(char *));
    for (int i = 0; i < labels; i++) {
        char s[32];
        snprintf(s, sizeof s, "LABEL_%d", i);
        c.id2label[i] = bq_strdup(s);
    }
    return c;
}

/* Quantizers of `scheme` on m (m->quant), max-calibrated on `batches` random padded batches of B
 * examples of T tokens drawn from rng (bq_test_padded_batch, ids below vocab, each example 3 tokens
 * shorter than the one before); aborts where that fails (the test cannot run). */
static inline void bq_test_calibrate(BqBert *m, const char *scheme, BqRng *rng, int batches, int B, int T, int vocab) {
    BqQuantConfig qc;
    bq_quant_config_default(&qc);
    BQ_CHECK(bq_scheme_parse(&qc.scheme, scheme, "scheme") == BQ_OK);
    BQ_CHECK(bq_quant_create(&m->quant, m, &qc) == BQ_OK);
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 26, "calib") == BQ_OK);
    int32_t *ids = bq_malloc(sizeof(int32_t) * (size_t)(B * T)), *types = bq_malloc(sizeof(int32_t) * (size_t)(B * T));
    float *mask = bq_malloc(sizeof(float) * (size_t)(B * T));
    bq_quant_calib_begin(m->quant, BQ_CALIBRATOR_MAX);
    for (int i = 0; i < batches; i++) {
        bq_test_padded_batch(ids, types, mask, B, T, rng, vocab, 3);
        BqBertInput in = {.B = B, .T = T, .input_ids = ids, .attention_mask = mask, .token_type_ids = types};
        BqCtx ctx = {.act = &act};
        BqTensor *logits;
        BQ_CHECK(bq_bert_forward(m, &ctx, &in, &logits, NULL) == BQ_OK);
        bq_arena_rewind(&act, 0);
    }
    BQ_CHECK(bq_quant_calib_finish(m->quant, BQ_CALIBRATOR_MAX, 0.0) == BQ_OK);
    bq_arena_free(&act);
    free(ids);
    free(types);
    free(mask);
}

/* Creates a fresh directory /tmp/bq_test_<name>_XXXXXX, written into buf (n bytes); aborts when it
 * cannot (the test cannot run). */
static inline char *bq_test_tmpdir(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "/tmp/bq_test_%s_XXXXXX", name);
    BQ_CHECK(mkdtemp(buf) != NULL);
    return buf;
}

/* Removes a directory tree a test made; a failure is reported, not counted. */
static inline void bq_test_rmtree(const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

/* ---- safetensors reader ---- */

typedef struct StFile {
    char *buf;       /* whole file */
    size_t size;
    json_t *header;
    size_t data_off; /* start of the data section */
} StFile;

/* Reads PATH whole; 0 on success, else 1 with a message on stderr. */
static inline int st_open(StFile *f, const char *path) {
    memset(f, 0, sizeof *f);
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        fprintf(stderr, "%s: cannot open\n", path);
        return 1;
    }
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    f->buf = bq_malloc((size_t)n + 1);
    f->size = fread(f->buf, 1, (size_t)n, fp);
    fclose(fp);
    if (f->size != (size_t)n || n < 8) {
        fprintf(stderr, "%s: short read\n", path);
        return 1;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)(unsigned char)f->buf[i] << (8 * i);
    if (hlen > f->size - 8) {
        fprintf(stderr, "%s: bad header length\n", path);
        return 1;
    }
    json_error_t err;
    f->header = json_loadb(f->buf + 8, (size_t)hlen, 0, &err);
    if (!f->header) {
        fprintf(stderr, "%s: header: %s\n", path, err.text);
        return 1;
    }
    f->data_off = 8 + (size_t)hlen;
    return 0;
}

static inline void st_close(StFile *f) {
    if (f->header) json_decref(f->header);
    free(f->buf);
}

/* Pointer to tensor `name` if it exists with the given dtype; its shape goes to shape/ndim. */
static inline const void *st_get(const StFile *f, const char *name, const char *dtype, int64_t *shape, int *ndim,
                                 int64_t *numel) {
    json_t *e = json_object_get(f->header, name);
    if (!e) return NULL;
    const char *dt = json_string_value(json_object_get(e, "dtype"));
    if (!dt || strcmp(dt, dtype) != 0) {
        fprintf(stderr, "%s: dtype %s, expected %s\n", name, dt ? dt : "?", dtype);
        return NULL;
    }
    json_t *sh = json_object_get(e, "shape");
    *ndim = (int)json_array_size(sh);
    *numel = 1;
    for (int i = 0; i < *ndim && i < BQ_MAX_DIMS; i++) {
        shape[i] = json_integer_value(json_array_get(sh, (size_t)i));
        *numel *= shape[i];
    }
    json_t *off = json_object_get(e, "data_offsets");
    size_t b0 = (size_t)json_integer_value(json_array_get(off, 0));
    size_t b1 = (size_t)json_integer_value(json_array_get(off, 1));
    if (b1 - b0 != (size_t)*numel * 4 || f->data_off + b1 > f->size) {
        fprintf(stderr, "%s: bad data offsets\n", name);
        return NULL;
    }
    return f->buf + f->data_off + b0;
}

#endif
