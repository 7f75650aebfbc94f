/* Hugging Face BertConfig (config.json) parsing, validation and writing.
 * Reference: transformers models/bert/configuration_bert.py (BertConfig keys and defaults) and
 * configuration_utils.py (PretrainedConfig: id2label / label2id / num_labels, default 2 labels). */
#include "layers/config.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"

/* Required integer key: present, integer, in range. */
static int get_int(json_t *j, const char *path, const char *key, int *out, int required, int def) {
    json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v)) {
        if (required) return bq_err(BQ_EFORMAT, "%s: missing key \"%s\"", path, key);
        *out = def;
        return BQ_OK;
    }
    if (!json_is_integer(v)) return bq_err(BQ_EFORMAT, "%s: key \"%s\" must be an integer", path, key);
    json_int_t x = json_integer_value(v);
    if (x < -2147483647 || x > 2147483647) return bq_err(BQ_EFORMAT, "%s: key \"%s\" out of range", path, key);
    *out = (int)x;
    return BQ_OK;
}

static int get_float(json_t *j, const char *path, const char *key, float *out, float def) {
    json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return BQ_OK;
    }
    if (!json_is_number(v)) return bq_err(BQ_EFORMAT, "%s: key \"%s\" must be a number", path, key);
    *out = (float)json_number_value(v);
    return BQ_OK;
}

/* The numeric keys of config.json with the BqBertConfig field each fills (an int or a float at off): a
 * required one must be present, an optional one takes transformers' BertConfig default when absent or
 * null. bq_config_load reads them and bq_config_to_json writes them back. */
typedef struct IntKey {
    const char *key;
    size_t off;
    int required, def;
} IntKey;

typedef struct FloatKey {
    const char *key;
    size_t off;
    float def; /* a negative default stands for HF's null, and a negative value is written back as null */
} FloatKey;

static const IntKey int_keys[] = {
    {"vocab_size", offsetof(BqBertConfig, vocab_size), 1, 0},
    {"hidden_size", offsetof(BqBertConfig, hidden_size), 1, 0},
    {"num_hidden_layers", offsetof(BqBertConfig, num_hidden_layers), 1, 0},
    {"num_attention_heads", offsetof(BqBertConfig, num_attention_heads), 1, 0},
    {"intermediate_size", offsetof(BqBertConfig, intermediate_size), 1, 0},
    {"max_position_embeddings", offsetof(BqBertConfig, max_position_embeddings), 0, 512},
    {"type_vocab_size", offsetof(BqBertConfig, type_vocab_size), 0, 2},
    {"pad_token_id", offsetof(BqBertConfig, pad_token_id), 0, 0},
};

static const FloatKey float_keys[] = {
    {"layer_norm_eps", offsetof(BqBertConfig, layer_norm_eps), 1e-12f},
    {"hidden_dropout_prob", offsetof(BqBertConfig, hidden_dropout_prob), 0.1f},
    {"attention_probs_dropout_prob", offsetof(BqBertConfig, attention_probs_dropout_prob), 0.1f},
    {"classifier_dropout", offsetof(BqBertConfig, classifier_dropout), -1.0f},
    {"initializer_range", offsetof(BqBertConfig, initializer_range), 0.02f},
};

#define NKEYS(t) (sizeof(t) / sizeof((t)[0]))

void bq_config_free(BqBertConfig *cfg) {
    if (!cfg) return;
    if (cfg->id2label) {
        for (int i = 0; i < cfg->num_labels; i++) free(cfg->id2label[i]);
        free(cfg->id2label);
    }
    cfg->id2label = NULL;
}

int bq_config_validate(const BqBertConfig *c) {
    if (c->vocab_size <= 0) return bq_err(BQ_EFORMAT, "config: vocab_size must be positive (got %d)", c->vocab_size);
    if (c->hidden_size <= 0) return bq_err(BQ_EFORMAT, "config: hidden_size must be positive (got %d)", c->hidden_size);
    if (c->num_hidden_layers <= 0)
        return bq_err(BQ_EFORMAT, "config: num_hidden_layers must be positive (got %d)", c->num_hidden_layers);
    if (c->num_attention_heads <= 0)
        return bq_err(BQ_EFORMAT, "config: num_attention_heads must be positive (got %d)", c->num_attention_heads);
    if (c->hidden_size % c->num_attention_heads != 0)
        return bq_err(BQ_EFORMAT, "config: hidden_size %d is not a multiple of num_attention_heads %d",
                      c->hidden_size, c->num_attention_heads);
    if (c->intermediate_size <= 0)
        return bq_err(BQ_EFORMAT, "config: intermediate_size must be positive (got %d)", c->intermediate_size);
    if (c->max_position_embeddings <= 0)
        return bq_err(BQ_EFORMAT, "config: max_position_embeddings must be positive (got %d)",
                      c->max_position_embeddings);
    if (c->type_vocab_size <= 0)
        return bq_err(BQ_EFORMAT, "config: type_vocab_size must be positive (got %d)", c->type_vocab_size);
    if (c->pad_token_id < 0 || c->pad_token_id >= c->vocab_size)
        return bq_err(BQ_EFORMAT, "config: pad_token_id %d outside the vocabulary (%d)", c->pad_token_id, c->vocab_size);
    if (!(c->layer_norm_eps > 0)) return bq_err(BQ_EFORMAT, "config: layer_norm_eps must be positive");
    if (!(c->hidden_dropout_prob >= 0 && c->hidden_dropout_prob < 1))
        return bq_err(BQ_EFORMAT, "config: hidden_dropout_prob must be in [0, 1)");
    if (!(c->attention_probs_dropout_prob >= 0 && c->attention_probs_dropout_prob < 1))
        return bq_err(BQ_EFORMAT, "config: attention_probs_dropout_prob must be in [0, 1)");
    if (!(c->classifier_dropout < 1)) return bq_err(BQ_EFORMAT, "config: classifier_dropout must be < 1");
    if (!(c->initializer_range >= 0)) return bq_err(BQ_EFORMAT, "config: initializer_range must be >= 0");
    if (c->num_labels < 1 || c->num_labels > 100000)
        return bq_err(BQ_EFORMAT, "config: num_labels must be in 1..100000 (got %d)", c->num_labels);
    if (c->head == BQ_HEAD_QA && c->num_labels != 2)
        return bq_err(BQ_EFORMAT, "config: BertForQuestionAnswering needs num_labels 2 (start, end), got %d",
                      c->num_labels);
    return BQ_OK;
}

/* id2label {"0": "neg", ...}: keys must be exactly 0..n-1. */
static int parse_labels(BqBertConfig *c, json_t *i2l, const char *path) {
    size_t n = json_object_size(i2l);
    if (n == 0 || n > 100000) return bq_err(BQ_EFORMAT, "%s: id2label must have 1..100000 entries", path);
    c->num_labels = (int)n;
    c->id2label = bq_calloc(n, sizeof(char *));
    const char *key;
    json_t *v;
    json_object_foreach(i2l, key, v) {
        char *end;
        long id = strtol(key, &end, 10);
        if (*key == '\0' || *end != '\0' || id < 0 || id >= (long)n)
            return bq_err(BQ_EFORMAT, "%s: id2label key \"%s\" is not an id in 0..%zu", path, key, n - 1);
        if (!json_is_string(v)) return bq_err(BQ_EFORMAT, "%s: id2label[\"%s\"] must be a string", path, key);
        if (c->id2label[id]) return bq_err(BQ_EFORMAT, "%s: id2label has id %ld twice", path, id);
        c->id2label[id] = bq_strdup(json_string_value(v));
    }
    return BQ_OK;
}

int bq_config_load(BqBertConfig *cfg, const char *path) {
    memset(cfg, 0, sizeof *cfg);
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j) {
        FILE *f = fopen(path, "rb");
        if (!f) return bq_err(BQ_EIO, "%s: cannot open", path);
        fclose(f);
        return bq_err(BQ_EFORMAT, "%s: line %d: %s", path, e.line, e.text);
    }
    int st = BQ_OK;
    BqBertConfig c;
    memset(&c, 0, sizeof c);
    if (!json_is_object(j)) {
        st = bq_err(BQ_EFORMAT, "%s: not a JSON object", path);
        goto cleanup;
    }
    json_t *mt = json_object_get(j, "model_type");
    if (mt && !(json_is_string(mt) && strcmp(json_string_value(mt), "bert") == 0)) {
        st = bq_err(BQ_EFORMAT, "%s: model_type is %s, only \"bert\" is supported", path,
                    json_is_string(mt) ? json_string_value(mt) : "not a string");
        goto cleanup;
    }
    json_t *act = json_object_get(j, "hidden_act");
    if (act && !(json_is_string(act) && strcmp(json_string_value(act), "gelu") == 0)) {
        st = bq_err(BQ_EFORMAT, "%s: hidden_act is %s, only \"gelu\" is supported", path,
                    json_is_string(act) ? json_string_value(act) : "not a string");
        goto cleanup;
    }
    json_t *pe = json_object_get(j, "position_embedding_type");
    if (pe && !json_is_null(pe) && !(json_is_string(pe) && strcmp(json_string_value(pe), "absolute") == 0)) {
        st = bq_err(BQ_EFORMAT, "%s: position_embedding_type must be \"absolute\"", path);
        goto cleanup;
    }
    for (size_t i = 0; i < NKEYS(int_keys); i++) {
        const IntKey *k = &int_keys[i];
        if ((st = get_int(j, path, k->key, (int *)((char *)&c + k->off), k->required, k->def))) goto cleanup;
    }
    for (size_t i = 0; i < NKEYS(float_keys); i++) {
        const FloatKey *k = &float_keys[i];
        if ((st = get_float(j, path, k->key, (float *)((char *)&c + k->off), k->def))) goto cleanup;
    }
    json_t *arch = json_object_get(j, "architectures"), *a;
    size_t ai;
    if (json_is_array(arch))
        json_array_foreach(arch, ai, a) if (json_is_string(a) && !strcmp(json_string_value(a), "BertForQuestionAnswering"))
            c.head = BQ_HEAD_QA;
    json_t *i2l = json_object_get(j, "id2label");
    if (i2l && !json_is_null(i2l)) {
        if (!json_is_object(i2l)) {
            st = bq_err(BQ_EFORMAT, "%s: id2label must be an object", path);
            goto cleanup;
        }
        if ((st = parse_labels(&c, i2l, path))) goto cleanup;
    } else {
        if ((st = get_int(j, path, "num_labels", &c.num_labels, 0, 2))) goto cleanup;
        if (c.num_labels < 1 || c.num_labels > 100000) {
            st = bq_err(BQ_EFORMAT, "%s: num_labels must be in 1..100000", path);
            goto cleanup;
        }
        c.id2label = bq_calloc((size_t)c.num_labels, sizeof(char *));
        for (int i = 0; i < c.num_labels; i++) {
            char b[32];
            snprintf(b, sizeof b, "LABEL_%d", i);
            c.id2label[i] = bq_strdup(b);
        }
    }
    if ((st = bq_config_validate(&c))) {
        bq_err_ctx(st, "%s", path);
        goto cleanup;
    }
cleanup:
    json_decref(j);
    if (st) bq_config_free(&c);
    else *cfg = c;
    return st;
}

/* A float as the shortest decimal that reads back as the same float (0.1f -> 0.1), so config.json
 * shows the values a user typed. */
static json_t *real_of_float(float x) {
    char b[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, (double)x);
        if (strtof(b, NULL) == x) break;
    }
    return json_real(strtod(b, NULL));
}

json_t *bq_config_to_json(const BqBertConfig *c) {
    json_t *j = json_object();
    json_object_set_new(j, "architectures", json_pack("[s]", c->head == BQ_HEAD_QA ? "BertForQuestionAnswering"
                                                                                  : "BertForSequenceClassification"));
    json_object_set_new(j, "model_type", json_string("bert"));
    json_object_set_new(j, "hidden_act", json_string("gelu"));
    for (size_t i = 0; i < NKEYS(int_keys); i++)
        json_object_set_new(j, int_keys[i].key, json_integer(*(const int *)((const char *)c + int_keys[i].off)));
    /* Floats go through %.9g-equivalent doubles of the float value, so 0.1f prints as 0.1. */
    for (size_t i = 0; i < NKEYS(float_keys); i++) {
        const float v = *(const float *)((const char *)c + float_keys[i].off);
        json_object_set_new(j, float_keys[i].key, float_keys[i].def < 0 && v < 0 ? json_null() : real_of_float(v));
    }
    json_object_set_new(j, "position_embedding_type", json_string("absolute"));
    if (c->head != BQ_HEAD_QA) json_object_set_new(j, "problem_type", json_string("single_label_classification"));
    json_object_set_new(j, "torch_dtype", json_string("float32"));
    json_object_set_new(j, "use_cache", json_true());
    json_t *i2l = json_object(), *l2i = json_object();
    for (int i = 0; i < c->num_labels; i++) {
        char key[32], def[32];
        snprintf(key, sizeof key, "%d", i);
        snprintf(def, sizeof def, "LABEL_%d", i);
        const char *name = c->id2label && c->id2label[i] ? c->id2label[i] : def;
        json_object_set_new(i2l, key, json_string(name));
        json_object_set_new(l2i, name, json_integer(i));
    }
    json_object_set_new(j, "id2label", i2l);
    json_object_set_new(j, "label2id", l2i);
    return j;
}

int bq_json_save(json_t *j, const char *path, size_t flags) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return bq_err(BQ_EINVAL, "%s: path too long", path);
    errno = 0;
    if (json_dump_file(j, tmp, flags) != 0) {
        const int st = bq_err(BQ_EIO, "%s: cannot write: %s", tmp, errno ? strerror(errno) : "I/O error");
        remove(tmp);
        return st;
    }
    return bq_rename_durable(tmp, path);
}

int bq_config_save(const BqBertConfig *cfg, const char *path, json_t *extra) {
    json_t *j = bq_config_to_json(cfg);
    if (extra) json_object_set(j, "bertqat", extra);
    const int st = bq_json_save(j, path, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
    json_decref(j);
    return st;
}
