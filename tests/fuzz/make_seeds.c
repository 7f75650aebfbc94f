/* Writes the seed inputs of every fuzz target into tests/fuzz/corpus/<target>/seed-* (run from the
 * repository root by `scripts/fuzz.sh --seeds`): small valid files of each format, made here or copied
 * from tests/fixtures, so the fuzzers start from inputs that reach deep into each parser. Inputs that
 * once made a target fail are kept next to them as regress-* files and are not touched here. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "export/safetensors.h"
#include "tests/fuzz/fuzz.h"
#include "tests/fuzz/fuzz_model.h"

#define CORPUS "tests/fuzz/corpus"

static void seed(const char *target, const char *name, const void *data, size_t n) {
    char p[512];
    snprintf(p, sizeof p, CORPUS "/%s", target);
    mkdir(p, 0755);
    snprintf(p, sizeof p, CORPUS "/%s/seed-%s", target, name);
    FILE *f = fopen(p, "wb");
    BQ_CHECK(f != NULL && (n == 0 || fwrite(data, 1, n, f) == n) && fclose(f) == 0);
}

/* A seed made of a literal with embedded NULs (sizeof - 1 bytes). */
#define SEED_LIT(target, name, lit) seed(target, name, lit, sizeof(lit) - 1)

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "%s: missing (run from the repository root)\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    BQ_CHECK(b && fread(b, 1, *n, f) == *n);
    fclose(f);
    return b;
}

/* A seed made of one byte followed by a file's bytes. */
static void seed_prefixed(const char *target, const char *name, unsigned char first, const char *path) {
    size_t n;
    unsigned char *b = slurp(path, &n), *c = malloc(n + 1);
    c[0] = first;
    memcpy(c + 1, b, n);
    seed(target, name, c, n + 1);
    free(b);
    free(c);
}

static void seed_file(const char *target, const char *name, const char *path) {
    size_t n;
    unsigned char *b = slurp(path, &n);
    seed(target, name, b, n);
    free(b);
}

int main(void) {
    mkdir(CORPUS, 0755);
    SEED_LIT("wordpiece", "plain", "\x01This film was GREAT, un-watchable!");
    SEED_LIT("wordpiece", "pair", "\x35what is it?\0the movie was good \xe4\xb8\xad\xe6\x96\x87");
    SEED_LIT("wordpiece", "accents", "\x03" "Caf\xc3\xa9 na\xc3\xafve \xc3\x9c""ber");
    SEED_LIT("wordpiece", "bad-utf8", "\xf9" "ab\xff\xfe\xc3 \xe4\xb8 \xed\xa0\x80 x\t\r\n\x01\x7f");
    SEED_LIT("wordpiece", "tail", "\x26" "a b c d e f g h i j k l m n o p q r s t u v w x y z 0 1 2 3");

    char dir[512], vocab[600];
    fz_path(dir, sizeof dir, "seeds");
    BQ_CHECK(mkdir(dir, 0700) == 0);
    seed_file("vocab", "tiny", fz_tiny_vocab(vocab, sizeof vocab, dir));
    SEED_LIT("vocab", "crlf", "[PAD]\r\n[UNK]\r\n[CLS]\r\n[SEP]\r\n[MASK]\r\nthis\r\n##s\r\nfilm\r\n");
    SEED_LIT("vocab", "no-special", "a\nb\n##c\n");

    SEED_LIT("tokenizer_json", "normalizer",
             "{\"normalizer\": {\"type\": \"BertNormalizer\", \"lowercase\": true, \"strip_accents\": null, "
             "\"handle_chinese_chars\": true, \"clean_text\": true}, \"model\": {\"type\": \"WordPiece\", "
             "\"unk_token\": \"[UNK]\"}, \"added_tokens\": [{\"id\": 0, \"content\": \"[PAD]\", \"special\": true}, "
             "{\"id\": 4, \"content\": \"[MASK]\", \"special\": true}]}");
    SEED_LIT("tokenizer_json", "with-config",
             "{\"normalizer\": {\"type\": \"BertNormalizer\", \"lowercase\": false}}\0"
             "{\"do_lower_case\": false, \"strip_accents\": true, \"tokenize_chinese_chars\": false, "
             "\"unk_token\": \"[UNK]\", \"cls_token\": {\"content\": \"[CLS]\"}, \"sep_token\": \"[SEP]\"}");

    seed_file("config", "bert-tiny", "tests/fixtures/bert_tiny/config.json");
    seed_file("config", "qa-tiny", "tests/fixtures/qa_tiny/config.json");

    /* The tiny checkpoint: its config.json (with the bertqat block), model.h5 and training_state.h5. */
    char ck[600], p[700];
    snprintf(ck, sizeof ck, "%s/ckpt", dir);
    fz_tiny_checkpoint(ck);
    seed_file("config", "checkpoint", (snprintf(p, sizeof p, "%s/config.json", ck), p));
    seed_file("ckpt", "model.h5", (snprintf(p, sizeof p, "%s/model.h5", ck), p));
    seed_file("train_state", "training_state.h5", (snprintf(p, sizeof p, "%s/training_state.h5", ck), p));
    seed_file("tf_h5", "tf_model.h5", "tests/fixtures/ckptio/tf_tiny/tf_model.h5");

    /* safetensors: the tiny model's first tensors as float32, and a hand-made file with an int64
     * tensor and a 0-d one. */
    BqBert m;
    fz_tiny_model(&m);
    const char *names[4];
    const float *data[4];
    int ndims[4];
    const int64_t *shapes[4];
    for (int k = 0; k < 4; k++) {
        const BqParam *q = &m.params.p[k];
        names[k] = q->name, data[k] = m.params.data + q->offset, ndims[k] = q->ndim, shapes[k] = q->shape;
    }
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    BQ_CHECK(bq_st_write(p, names, data, ndims, shapes, 4, NULL) == BQ_OK);
    seed_file("safetensors", "f32", p);
    bq_quant_free(m.quant);
    bq_bert_free(&m);
    {
        static const char hdr[] = "{\"__metadata__\":{\"format\":\"pt\"},\"embeddings.position_ids\":{\"dtype\":"
                                  "\"I64\",\"shape\":[1,3],\"data_offsets\":[0,24]},\"s\":{\"dtype\":\"F32\","
                                  "\"shape\":[],\"data_offsets\":[24,28]}}";
        unsigned char buf[512];
        uint64_t hl = sizeof hdr - 1;
        size_t n = 0;
        for (int i = 0; i < 8; i++) buf[n++] = (unsigned char)(hl >> (8 * i));
        memcpy(buf + n, hdr, hl), n += hl;
        for (int v = 0; v < 3; v++)
            for (int i = 0; i < 8; i++) buf[n++] = i == 0 ? (unsigned char)v : 0;
        float one = 1.0f;
        memcpy(buf + n, &one, 4), n += 4;
        seed("safetensors", "i64", buf, n);
    }

    seed_prefixed("rows", "kaggle-csv", 0, "tests/fixtures/data/kaggle.csv");
    seed_prefixed("rows", "pairs-csv", 12, "tests/fixtures/data/pairs.csv");
    seed_prefixed("rows", "ints-tsv", 1, "tests/fixtures/data/ints.tsv");
    seed_prefixed("rows", "reviews-jsonl", 2, "tests/fixtures/data/reviews.jsonl");
    SEED_LIT("rows", "pair-jsonl", "\x05{\"premise\": \"good film\", \"hypothesis\": \"is it?\", \"label\": \"yes\"}\n"
                                   "{\"premise\": \"bad\", \"hypothesis\": \"is it?\", \"label\": \"no\"}\n");
    SEED_LIT("rows", "quoted-csv", "\x00text,label\n\"a \"\"quoted\"\", multi\nline\",1\n\"b\",0\n,1\n");

    seed_file("imdb_archive", "tar-gz", "tests/fixtures/data/imdb.tar.gz");

    SEED_LIT("squad", "dev",
             "{\"version\": \"1.1\", \"data\": [{\"title\": \"T\", \"paragraphs\": [{\"context\": "
             "\"The film was good. The movie is great caf\\u00e9 \\u4e2d\\u6587 and it was bad.\", \"qas\": "
             "[{\"id\": \"q1\", \"question\": \"What was the film?\", \"answers\": [{\"text\": \"good\", "
             "\"answer_start\": 13}]}, {\"id\": \"q2\", \"question\": \"who is great?\", \"answers\": "
             "[{\"text\": \"The movie\", \"answer_start\": 19}, {\"text\": \"movie\", \"answer_start\": 23}]}]}]}]}");

    SEED_LIT("args", "flags", "fuzz\0--model\0m\0--epochs\0" "3\0--lr=1e-4\0--bucket\0file");
    SEED_LIT("args", "dashdash", "fuzz\0--model=x\0--val-fraction\0" "0.5\0--\0--a\0b");
    SEED_LIT("args", "help", "fuzz\0--seed\0-7\0--help");
    printf("seeds written under " CORPUS "/\n");
    return 0;
}
