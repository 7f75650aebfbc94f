/* config.json parsing, validation and writing (layers/config.c): the all-MiniLM-L6-v2 config
 * (committed copy, tests/fixtures/ckptio/minilm_config.json) and the tiny BertForSequenceClassification
 * fixture parse to the right fields; missing keys, heads not dividing hidden, unsupported
 * hidden_act/model_type, bad id2label, bad JSON and a missing file are errors naming the file and key;
 * bq_config_save writes HF keys (architectures, id2label/label2id, "bertqat" extra) that read back
 * identically. Prints the max error of the float fields after the round trip. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "layers/config.h"
#include "tests/test_util.h"

static char root[64];

static const char *BASE =
    "{\"model_type\":\"bert\",\"hidden_act\":\"gelu\",\"vocab_size\":100,\"hidden_size\":32,"
    "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":64%s}";

/* Writes BASE with EXTRA spliced in (or TEXT verbatim when not NULL) and loads it. */
static int load_text(const char *name, const char *text, const char *extra, BqBertConfig *c, char *path) {
    sprintf(path, "%s/%s.json", root, name);
    FILE *f = fopen(path, "w");
    BQ_CHECK(f);
    if (text) fputs(text, f);
    else fprintf(f, BASE, extra);
    fclose(f);
    bq_err_clear();
    return bq_config_load(c, path);
}

static void expect_bad(const char *name, const char *text, const char *extra, int status, const char *needle) {
    BqBertConfig c;
    char path[512];
    int rc = load_text(name, text, extra, &c, path);
    EXPECT(rc == status, "%s: status %d, expected %d (%s)", name, rc, status, bq_errmsg());
    EXPECT(strstr(bq_errmsg(), path) != NULL, "%s: message does not name the file: %s", name, bq_errmsg());
    EXPECT(strstr(bq_errmsg(), needle) != NULL, "%s: message lacks \"%s\": %s", name, needle, bq_errmsg());
    printf("  %-18s -> %s\n", name, bq_errmsg());
    if (rc == BQ_OK) bq_config_free(&c);
}

int main(void) {
    bq_test_tmpdir(root, sizeof root, "cfg");
    const char *src = getenv("BQ_SOURCE_DIR");
    if (!src) src = BQ_SOURCE_DIR;
    char p[1024];
    double maxerr = 0;

    BqBertConfig c;
    snprintf(p, sizeof p, "%s/tests/fixtures/ckptio/minilm_config.json", src);
    int rc = bq_config_load(&c, p);
    EXPECT(rc == BQ_OK, "MiniLM config: %s", bq_errmsg());
    if (!rc) {
        EXPECT(c.vocab_size == 30522 && c.hidden_size == 384 && c.num_hidden_layers == 6 &&
                   c.num_attention_heads == 12 && c.intermediate_size == 1536 && c.max_position_embeddings == 512 &&
                   c.type_vocab_size == 2 && c.pad_token_id == 0,
               "MiniLM sizes");
        EXPECT(c.layer_norm_eps == 1e-12f && c.hidden_dropout_prob == 0.1f && c.attention_probs_dropout_prob == 0.1f &&
                   c.initializer_range == 0.02f && c.classifier_dropout < 0,
               "MiniLM floats");
        EXPECT(c.num_labels == 2 && strcmp(c.id2label[0], "LABEL_0") == 0 && strcmp(c.id2label[1], "LABEL_1") == 0,
               "MiniLM default labels (%d)", c.num_labels);
        bq_config_free(&c);
    }
    snprintf(p, sizeof p, "%s/tests/fixtures/bert_tiny/config.json", src);
    rc = bq_config_load(&c, p);
    EXPECT(rc == BQ_OK, "tiny config: %s", bq_errmsg());
    if (!rc) {
        EXPECT(c.num_labels == 3 && strcmp(c.id2label[0], "neg") == 0 && strcmp(c.id2label[2], "pos") == 0,
               "tiny labels");
        EXPECT(c.hidden_dropout_prob == 0.0f && c.intermediate_size == 37 && c.classifier_dropout < 0, "tiny fields");

        /* save -> load round trip, with the extra block */
        json_t *extra = json_pack("{s:i,s:s}", "format_version", 1, "note", "x");
        char q[600];
        snprintf(q, sizeof q, "%s/saved.json", root);
        c.classifier_dropout = 0.25f;
        EXPECT(bq_config_save(&c, q, extra) == BQ_OK, "save: %s", bq_errmsg());
        json_decref(extra);
        char tmpq[700];
        snprintf(tmpq, sizeof tmpq, "%s.tmp", q);
        EXPECT(access(tmpq, F_OK) != 0, "save left %s", tmpq);
        BqBertConfig d;
        rc = bq_config_load(&d, q);
        EXPECT(rc == BQ_OK, "reload: %s", bq_errmsg());
        if (!rc) {
            EXPECT(d.vocab_size == c.vocab_size && d.hidden_size == c.hidden_size &&
                       d.num_hidden_layers == c.num_hidden_layers && d.num_attention_heads == c.num_attention_heads &&
                       d.intermediate_size == c.intermediate_size &&
                       d.max_position_embeddings == c.max_position_embeddings &&
                       d.type_vocab_size == c.type_vocab_size && d.pad_token_id == c.pad_token_id &&
                       d.num_labels == 3 && strcmp(d.id2label[1], "neu") == 0,
                   "round trip ints/labels");
            float a[] = {c.layer_norm_eps, c.hidden_dropout_prob, c.attention_probs_dropout_prob,
                         c.classifier_dropout, c.initializer_range};
            float b[] = {d.layer_norm_eps, d.hidden_dropout_prob, d.attention_probs_dropout_prob,
                         d.classifier_dropout, d.initializer_range};
            for (int i = 0; i < 5; i++) maxerr = fmax(maxerr, fabs(a[i] - b[i]));
            EXPECT(memcmp(a, b, sizeof a) == 0, "round trip floats differ");
            bq_config_free(&d);
        }
        json_error_t e;
        json_t *j = json_load_file(q, 0, &e);
        EXPECT(j != NULL, "saved file is not JSON");
        if (j) {
            EXPECT(strcmp(json_string_value(json_array_get(json_object_get(j, "architectures"), 0)),
                          "BertForSequenceClassification") == 0,
                   "architectures");
            EXPECT(json_integer_value(json_object_get(json_object_get(j, "label2id"), "pos")) == 2, "label2id");
            EXPECT(strcmp(json_string_value(json_object_get(j, "hidden_act")), "gelu") == 0, "hidden_act");
            EXPECT(json_integer_value(json_object_get(json_object_get(j, "bertqat"), "format_version")) == 1, "extra");
            EXPECT(json_real_value(json_object_get(j, "classifier_dropout")) == 0.25, "classifier_dropout");
            EXPECT(json_real_value(json_object_get(j, "initializer_range")) == 0.02, "0.02f written as 0.02");
            json_decref(j);
        }
        bq_config_free(&c);
    }

    char path[512];
    rc = load_text("minimal", NULL, "", &c, path);
    EXPECT(rc == BQ_OK && c.num_labels == 2 && c.max_position_embeddings == 512 && c.type_vocab_size == 2 &&
               c.hidden_dropout_prob == 0.1f,
           "defaults: %s", bq_errmsg());
    if (!rc) bq_config_free(&c);
    rc = load_text("numlabels", NULL, ",\"num_labels\":5", &c, path);
    EXPECT(rc == BQ_OK && c.num_labels == 5 && strcmp(c.id2label[4], "LABEL_4") == 0, "num_labels key");
    if (!rc) bq_config_free(&c);

    expect_bad("missing_hidden", "{\"model_type\":\"bert\",\"vocab_size\":10,\"num_hidden_layers\":1,"
               "\"num_attention_heads\":1,\"intermediate_size\":4}", NULL, BQ_EFORMAT, "\"hidden_size\"");
    expect_bad("missing_vocab", "{\"hidden_size\":8,\"num_hidden_layers\":1,"
               "\"num_attention_heads\":1,\"intermediate_size\":4}", NULL, BQ_EFORMAT, "\"vocab_size\"");
    expect_bad("heads", "{\"vocab_size\":10,\"hidden_size\":30,\"num_hidden_layers\":1,"
               "\"num_attention_heads\":4,\"intermediate_size\":4}", NULL, BQ_EFORMAT,
               "hidden_size 30 is not a multiple of num_attention_heads 4");
    expect_bad("act", NULL, ",\"hidden_act\":\"relu\"", BQ_EFORMAT, "hidden_act");
    expect_bad("model_type", NULL, ",\"model_type\":\"roberta\"", BQ_EFORMAT, "roberta");
    expect_bad("string_int", NULL, ",\"max_position_embeddings\":\"512\"", BQ_EFORMAT, "max_position_embeddings");
    expect_bad("negative", NULL, ",\"type_vocab_size\":0", BQ_EFORMAT, "type_vocab_size");
    expect_bad("dropout", NULL, ",\"hidden_dropout_prob\":1.5", BQ_EFORMAT, "hidden_dropout_prob");
    expect_bad("id2label_key", NULL, ",\"id2label\":{\"0\":\"a\",\"2\":\"b\"}", BQ_EFORMAT, "id2label key \"2\"");
    expect_bad("id2label_val", NULL, ",\"id2label\":{\"0\":1}", BQ_EFORMAT, "id2label");
    expect_bad("pad", NULL, ",\"pad_token_id\":100", BQ_EFORMAT, "pad_token_id");
    expect_bad("bad_json", "{\"vocab_size\": 10,", NULL, BQ_EFORMAT, "line");
    expect_bad("not_object", "[1]", NULL, BQ_EFORMAT, "object");
    snprintf(p, sizeof p, "%s/absent.json", root);
    rc = bq_config_load(&c, p);
    EXPECT(rc == BQ_EIO && strstr(bq_errmsg(), p), "missing file: %d %s", rc, bq_errmsg());

    bq_test_rmtree(root);
    printf("test_config: max error %g, %d fails\n", maxerr, fails);
    return fails ? 1 : 0;
}
