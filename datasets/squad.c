/* SQuAD v1.1: JSON reader, run_qa.py windows and labels, the tokenization cache, n-best
 * post-processing and the official v1.1 EM/F1. References: Hugging Face transformers
 * examples/pytorch/question-answering run_qa.py (prepare_train_features, prepare_validation_features)
 * and utils_qa.py (postprocess_qa_predictions); HF tokenizers Encoding::truncate (overflow windows);
 * the official evaluate-v1.1.py (normalize_answer, exact_match_score, f1_score). Contracts in
 * datasets/squad.h; the user-facing description in docs/squad.md.
 *
 * Pipeline: the JSON is parsed into examples (texts kept for post-processing and scoring); every
 * distinct context is tokenized once with byte offsets and every question once (first
 * max_query_length pieces); those pieces are what the cache stores (they do not depend on
 * max_seq_len or doc_stride); windows, labels and the padded (n,T) arrays are rebuilt from them. */
#include "datasets/squad.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "autograd/bq.h"
#include "datasets/cache.h"
#include "datasets/dataset.h"
#include "datasets/source.h"

#define CACHE_MAGIC "BQSQUAD\n"
#define CACHE_VERSION 1u

void bq_squad_options_default(BqSquadOptions *o) {
    memset(o, 0, sizeof *o);
    o->max_seq_len = 384;
    o->doc_stride = 128;
    o->max_query_length = 64;
}

void bq_squad_free(BqSquadSet *s) {
    if (!s) return;
    for (int64_t i = 0; s->examples && i < s->n_examples; i++) {
        BqSquadExample *e = &s->examples[i];
        free(e->id);
        free(e->title);
        free(e->question);
        for (int k = 0; e->answers && k < e->n_answers; k++) free(e->answers[k]);
        free(e->answers);
        free(e->answer_start);
    }
    free(s->examples);
    for (int64_t i = 0; s->contexts && i < s->n_contexts; i++) free(s->contexts[i]);
    free(s->contexts);
    free(s->input_ids);
    free(s->token_type_ids);
    free(s->attention_mask);
    free(s->len);
    free(s->start_positions);
    free(s->end_positions);
    free(s->example_index);
    free(s->offsets);
    free(s->cache_path);
    free(s);
}

/* ---------------------------------------------------------------- JSON reader */

static char *dup_json_str(json_t *v) {
    size_t n = json_string_length(v);
    char *s = bq_malloc(n + 1);
    memcpy(s, json_string_value(v), n);
    s[n] = 0;
    return s;
}

/* Byte offset of code point index ci in s[0, n) (Python str indexing), -1 when past the end. */
static int64_t char_to_byte(const char *s, int64_t n, int64_t ci) {
    int64_t c = 0;
    for (int64_t b = 0; b <= n; b++) {
        if (b == n || ((uint8_t)s[b] & 0xC0) != 0x80) {
            if (c == ci) return b;
            c++;
        }
    }
    return -1;
}

/* Fills s->examples / s->contexts from the file, keeping the first max_examples questions (0: all). */
/* The answers of question id (av, a non-empty array) into e: each needs a string "text" found at its
 * character offset "answer_start" of the context ctx (clen bytes), stored as a byte offset.
 * Errors: BQ_EFORMAT naming the file, the question and the answer. */
static int read_answers(BqSquadExample *e, json_t *av, const char *ctx, size_t clen, const char *path, const char *id) {
    size_t ki;
    json_t *ans;
    json_array_foreach(av, ki, ans) {
        json_t *txt = json_is_object(ans) ? json_object_get(ans, "text") : NULL;
        json_t *stv = json_is_object(ans) ? json_object_get(ans, "answer_start") : NULL;
        if (!json_is_string(txt) || !json_is_integer(stv)) {
            return bq_err(BQ_EFORMAT, "%s: question %s: answers[%zu] needs a string \"text\" and an integer \"answer_start\"",
                          path, id, ki);
        }
        e->answers[ki] = dup_json_str(txt);
        e->n_answers = (int)ki + 1;
        size_t tl = json_string_length(txt);
        json_int_t ci = json_integer_value(stv);
        int64_t b = ci < 0 ? -1 : char_to_byte(ctx, (int64_t)clen, (int64_t)ci);
        if (b < 0 || (size_t)b + tl > clen || memcmp(ctx + b, e->answers[ki], tl) != 0) {
            return bq_err(BQ_EFORMAT, "%s: question %s: answer %zu \"%.40s\" is not at answer_start %lld of its context",
                          path, id, ki, e->answers[ki], (long long)ci);
        }
        e->answer_start[ki] = b;
    }
    return BQ_OK;
}

/* One question qa (data[ai].paragraphs[pi].qas[qi] of path) of the context ctx_index (ctx, clen bytes,
 * in an article titled title), appended to s->examples with its context in (*ex_par) (both grown
 * together, *cap_ex entries). ids holds the ids seen so far. Errors: BQ_EFORMAT naming the file and the
 * question: a missing id, question or answers, a duplicate id, a SQuAD v2.0 unanswerable question, an
 * answer not at its offset. */
static int read_question(BqSquadSet *s, json_t *qa, json_t *ids, const char *path, size_t ai, size_t pi, size_t qi,
                         int64_t ctx_index, size_t clen, const char *title, int64_t *cap_ex, int64_t **ex_par) {
    const char *ctx = s->contexts[ctx_index];
    json_t *idv = json_is_object(qa) ? json_object_get(qa, "id") : NULL;
    if (!json_is_string(idv)) {
        return bq_err(BQ_EFORMAT, "%s: data[%zu].paragraphs[%zu].qas[%zu]: missing string \"id\"", path, ai, pi, qi);
    }
    const char *id = json_string_value(idv);
    if (json_object_get(ids, id)) {
        return bq_err(BQ_EFORMAT, "%s: question %s: duplicate id", path, id);
    }
    json_object_set_new(ids, id, json_true());
    if (json_is_true(json_object_get(qa, "is_impossible"))) {
        return bq_err(BQ_EFORMAT, "%s: question %s: is_impossible is true (SQuAD v2.0 unanswerable questions are not supported; use v1.1 data)",
                      path, id);
    }
    json_t *qv = json_object_get(qa, "question"), *av = json_object_get(qa, "answers");
    if (!json_is_string(qv)) {
        return bq_err(BQ_EFORMAT, "%s: question %s: missing string \"question\"", path, id);
    }
    if (!json_is_array(av) || json_array_size(av) == 0) {
        return bq_err(BQ_EFORMAT, "%s: question %s: missing or empty \"answers\" array", path, id);
    }
    if (s->n_examples == *cap_ex) {
        *cap_ex = *cap_ex ? *cap_ex * 2 : 1024;
        s->examples = bq_realloc(s->examples, (size_t)*cap_ex * sizeof(BqSquadExample));
        *ex_par = bq_realloc(*ex_par, (size_t)*cap_ex * sizeof(int64_t));
    }
    BqSquadExample *e = &s->examples[s->n_examples];
    memset(e, 0, sizeof *e);
    (*ex_par)[s->n_examples] = ctx_index;
    s->n_examples++;
    e->id = bq_strdup(id);
    e->title = bq_strdup(title);
    e->question = dup_json_str(qv);
    e->context = s->contexts[ctx_index];
    e->context_len = (int64_t)clen;
    size_t na = json_array_size(av);
    e->answers = bq_calloc(na, sizeof(char *));
    e->answer_start = bq_calloc(na, sizeof(int64_t));
    return read_answers(e, av, ctx, clen, path, id);
}

static int read_json(BqSquadSet *s, const char *path, const json_t *doc, int64_t max_examples, int64_t **ex_par) {
    int st = BQ_OK;
    json_error_t jerr;
    json_t *root = doc ? json_incref((json_t *)doc) : json_load_file(path, 0, &jerr), *ids = json_object();
    int64_t cap_ex = 0, cap_ctx = 0;
    *ex_par = NULL;
    if (!root) {
        if (jerr.line < 0) st = bq_err(BQ_EIO, "%s: %s", path, jerr.text);
        else if (json_error_code(&jerr) == json_error_invalid_utf8)
            st = bq_err(BQ_EFORMAT, "%s: invalid UTF-8 (line %d, column %d: %s)", path, jerr.line, jerr.column, jerr.text);
        else st = bq_err(BQ_EFORMAT, "%s: invalid JSON (line %d, column %d: %s)", path, jerr.line, jerr.column, jerr.text);
        goto cleanup;
    }
    json_t *data = json_is_object(root) ? json_object_get(root, "data") : NULL;
    if (!json_is_array(data)) {
        st = bq_err(BQ_EFORMAT, "%s: not a SQuAD file (no \"data\" array at the top level)", path);
        goto cleanup;
    }
    size_t ai, pi, qi;
    json_t *art, *para, *qa;
    json_array_foreach(data, ai, art) {
        json_t *paras = json_is_object(art) ? json_object_get(art, "paragraphs") : NULL;
        if (!json_is_array(paras)) {
            st = bq_err(BQ_EFORMAT, "%s: data[%zu]: missing \"paragraphs\" array", path, ai);
            goto cleanup;
        }
        json_t *tv = json_object_get(art, "title");
        const char *title = json_is_string(tv) ? json_string_value(tv) : "";
        json_array_foreach(paras, pi, para) {
            if (max_examples > 0 && s->n_examples >= max_examples) goto cleanup;
            json_t *qas = json_is_object(para) ? json_object_get(para, "qas") : NULL;
            json_t *cv = json_is_object(para) ? json_object_get(para, "context") : NULL;
            json_t *q0 = json_is_array(qas) ? json_array_get(qas, 0) : NULL;
            const char *first_id = json_is_object(q0) && json_is_string(json_object_get(q0, "id"))
                                       ? json_string_value(json_object_get(q0, "id")) : "(none)";
            if (!json_is_array(qas) || !json_is_string(cv)) {
                st = bq_err(BQ_EFORMAT, "%s: question %s: data[%zu].paragraphs[%zu] has no string \"context\" or no \"qas\" array",
                            path, first_id, ai, pi);
                goto cleanup;
            }
            size_t clen = json_string_length(cv);
            if (clen > INT32_MAX - 1) {
                st = bq_err(BQ_EFORMAT, "%s: question %s: context longer than 2^31 - 1 bytes", path, first_id);
                goto cleanup;
            }
            if (json_array_size(qas) == 0) continue;
            if (s->n_contexts == cap_ctx) {
                cap_ctx = cap_ctx ? cap_ctx * 2 : 256;
                s->contexts = bq_realloc(s->contexts, (size_t)cap_ctx * sizeof(char *));
            }
            int64_t ctx_index = s->n_contexts++;
            s->contexts[ctx_index] = dup_json_str(cv);
            json_array_foreach(qas, qi, qa) {
                if (max_examples > 0 && s->n_examples >= max_examples) goto cleanup;
                if ((st = read_question(s, qa, ids, path, ai, pi, qi, ctx_index, clen, title, &cap_ex, ex_par)))
                    goto cleanup;
            }
        }
    }
cleanup:
    if (root) json_decref(root);
    json_decref(ids);
    return st;
}

/* ---------------------------------------------------------------- pieces (cached) */

/* Word pieces of every context (with int32 byte offsets) and of every question (first
 * max_query_length), concatenated; what the cache file holds. */
typedef struct Pieces {
    int64_t n_ctx, n_ex;
    int64_t *ctx_off; /* (n_ctx+1) */
    int32_t *ctx_ids; /* (ctx_off[n_ctx]) */
    int32_t *ctx_span; /* (2 ctx_off[n_ctx]) begin, end */
    int64_t *q_off;   /* (n_ex+1) */
    int32_t *q_ids;   /* (q_off[n_ex]) */
} Pieces;

static void pieces_free(Pieces *p) {
    free(p->ctx_off);
    free(p->ctx_ids);
    free(p->ctx_span);
    free(p->q_off);
    free(p->q_ids);
    memset(p, 0, sizeof *p);
}

typedef struct Tok {
    int32_t *ids;
    int64_t *offs;
    int64_t n, cap;
} Tok;

static void build_pieces(Pieces *p, const BqSquadSet *s, const BqTokenizer *tok, int64_t mql, int threads) {
    int64_t nc = s->n_contexts, ne = s->n_examples;
    Tok *ct = bq_calloc((size_t)(nc ? nc : 1), sizeof(Tok)), *qt = bq_calloc((size_t)(ne ? ne : 1), sizeof(Tok));
    int nt = threads > 0 ? threads : bq_runtime_threads();
    if (nt < 1) nt = 1;
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(dynamic, 4)
        for (int64_t i = 0; i < nc; i++)
            bq_tokenizer_tokenize_offsets(tok, s->contexts[i], strlen(s->contexts[i]), &ct[i].ids, &ct[i].offs, &ct[i].n,
                                          &ct[i].cap);
#pragma omp for schedule(dynamic, 32)
        for (int64_t i = 0; i < ne; i++) {
            const char *q = s->examples[i].question;
            bq_tokenizer_tokenize(tok, q, strlen(q), &qt[i].ids, &qt[i].n, &qt[i].cap);
            if (qt[i].n > mql) qt[i].n = mql;
        }
    }
    p->n_ctx = nc;
    p->n_ex = ne;
    p->ctx_off = bq_malloc((size_t)(nc + 1) * sizeof(int64_t));
    p->q_off = bq_malloc((size_t)(ne + 1) * sizeof(int64_t));
    p->ctx_off[0] = p->q_off[0] = 0;
    for (int64_t i = 0; i < nc; i++) p->ctx_off[i + 1] = p->ctx_off[i] + ct[i].n;
    for (int64_t i = 0; i < ne; i++) p->q_off[i + 1] = p->q_off[i] + qt[i].n;
    p->ctx_ids = bq_malloc((size_t)(p->ctx_off[nc] + 1) * sizeof(int32_t));
    p->ctx_span = bq_malloc((size_t)(p->ctx_off[nc] + 1) * 2 * sizeof(int32_t));
    p->q_ids = bq_malloc((size_t)(p->q_off[ne] + 1) * sizeof(int32_t));
    for (int64_t i = 0; i < nc; i++) {
        int64_t o = p->ctx_off[i];
        if (ct[i].n) memcpy(p->ctx_ids + o, ct[i].ids, (size_t)ct[i].n * sizeof(int32_t));
        for (int64_t k = 0; k < 2 * ct[i].n; k++) p->ctx_span[2 * o + k] = (int32_t)ct[i].offs[k];
        free(ct[i].ids);
        free(ct[i].offs);
    }
    for (int64_t i = 0; i < ne; i++) {
        if (qt[i].n) memcpy(p->q_ids + p->q_off[i], qt[i].ids, (size_t)qt[i].n * sizeof(int32_t));
        free(qt[i].ids);
    }
    free(ct);
    free(qt);
}

/* ---------------------------------------------------------------- cache file */

static int cache_write(const char *path, uint64_t key, const Pieces *p) {
    BqCacheWriter w;
    int st = bq_cache_writer_open(&w, path, CACHE_MAGIC, CACHE_VERSION, key);
    if (st) return st;
    int64_t head[2] = {p->n_ctx, p->n_ex};
    bq_cache_append(&w, head, sizeof head);
    bq_cache_append(&w, p->ctx_off, (size_t)(p->n_ctx + 1) * 8);
    bq_cache_append(&w, p->q_off, (size_t)(p->n_ex + 1) * 8);
    bq_cache_append(&w, p->ctx_ids, (size_t)p->ctx_off[p->n_ctx] * 4);
    bq_cache_append(&w, p->ctx_span, (size_t)p->ctx_off[p->n_ctx] * 8);
    bq_cache_append(&w, p->q_ids, (size_t)p->q_off[p->n_ex] * 4);
    return bq_cache_writer_commit(&w);
}

/* Reads and validates a cache file against the parsed set: 1 valid, 0 absent, -1 stale or corrupt
 * (then nothing of it is used). */
static int cache_read(const char *path, uint64_t key, const BqSquadSet *s, int64_t mql, int32_t vocab, Pieces *p) {
    memset(p, 0, sizeof *p);
    BqCacheReader r;
    int ok = bq_cache_reader_open(&r, path, CACHE_MAGIC, CACHE_VERSION, key);
    if (ok != 1) return ok;
    ok = -1;
    int64_t head[2];
    if (!bq_cache_take(&r, head, sizeof head) || head[0] != s->n_contexts || head[1] != s->n_examples) goto cleanup;
    p->n_ctx = head[0];
    p->n_ex = head[1];
    p->ctx_off = bq_malloc((size_t)(p->n_ctx + 1) * 8);
    p->q_off = bq_malloc((size_t)(p->n_ex + 1) * 8);
    if (!bq_cache_take(&r, p->ctx_off, (size_t)(p->n_ctx + 1) * 8) ||
        !bq_cache_take(&r, p->q_off, (size_t)(p->n_ex + 1) * 8))
        goto cleanup;
    int64_t tc = p->ctx_off[p->n_ctx], tq = p->q_off[p->n_ex];
    if (p->ctx_off[0] != 0 || p->q_off[0] != 0 || tc < 0 || tq < 0 ||
        bq_cache_left(&r) != (uint64_t)tc * 12 + (uint64_t)tq * 4)
        goto cleanup;
    p->ctx_ids = bq_malloc((size_t)(tc + 1) * 4);
    p->ctx_span = bq_malloc((size_t)(tc + 1) * 8);
    p->q_ids = bq_malloc((size_t)(tq + 1) * 4);
    /* the exact remaining size was checked above, so every take succeeds */
    bq_cache_take(&r, p->ctx_ids, (size_t)tc * 4);
    bq_cache_take(&r, p->ctx_span, (size_t)tc * 8);
    bq_cache_take(&r, p->q_ids, (size_t)tq * 4);
    for (int64_t i = 0; i < p->n_ctx; i++) {
        if (p->ctx_off[i + 1] < p->ctx_off[i]) goto cleanup;
        int32_t clen = (int32_t)strlen(s->contexts[i]), prev = 0;
        for (int64_t k = p->ctx_off[i]; k < p->ctx_off[i + 1]; k++) {
            int32_t b = p->ctx_span[2 * k], e = p->ctx_span[2 * k + 1];
            if (b < prev || e <= b || e > clen) goto cleanup;
            prev = b;
        }
    }
    for (int64_t i = 0; i < p->n_ex; i++)
        if (p->q_off[i + 1] < p->q_off[i] || p->q_off[i + 1] - p->q_off[i] > mql) goto cleanup;
    for (int64_t k = 0; k < tc; k++)
        if (p->ctx_ids[k] < 0 || p->ctx_ids[k] >= vocab) goto cleanup;
    for (int64_t k = 0; k < tq; k++)
        if (p->q_ids[k] < 0 || p->q_ids[k] >= vocab) goto cleanup;
    ok = 1;
cleanup:
    bq_cache_reader_close(&r);
    if (ok != 1) pieces_free(p);
    return ok;
}

/* ---------------------------------------------------------------- windows */

/* Number of windows of an example with nq question and nc context pieces (HF Encoding::truncate with
 * max_len k = T - nq - 3 and stride; the options guarantee k > stride). */
static int64_t window_count(int64_t T, int64_t stride, int64_t nq, int64_t nc) {
    int64_t k = T - nq - 3, step = k - stride;
    if (nc <= k) return 1;
    return 1 + (nc - k + step - 1) / step;
}

/* Label of one window: context pieces [cs, cs + w) of the example, placed from position base. */
static void window_label(const int32_t *span, int64_t cs, int64_t w, int64_t base, int64_t ans_b, int64_t ans_e,
                         int32_t *start, int32_t *end) {
    *start = *end = 0;
    if (w <= 0) return;
    int64_t first = cs, last = cs + w - 1;
    if (!(span[2 * first] <= ans_b && span[2 * last + 1] >= ans_e)) return;
    int64_t a = first, b = last;
    while (a + 1 <= last && span[2 * (a + 1)] <= ans_b) a++;  /* last piece beginning at or before ans_b */
    while (b - 1 >= first && span[2 * (b - 1) + 1] >= ans_e) b--; /* first piece ending at or after ans_e */
    *start = (int32_t)(base + a - cs);
    *end = (int32_t)(base + b - cs);
}

static void build_windows(BqSquadSet *s, const Pieces *p, const int64_t *ex_par, const BqTokenizer *tok,
                          const BqSquadOptions *o) {
    int64_t T = o->max_seq_len, ne = s->n_examples;
    int64_t *wstart = bq_malloc((size_t)(ne + 1) * sizeof(int64_t));
    wstart[0] = 0;
    for (int64_t i = 0; i < ne; i++) {
        int64_t c = ex_par[i];
        int64_t nc = p->ctx_off[c + 1] - p->ctx_off[c];
        if (nc > s->max_context_pieces) s->max_context_pieces = nc;
        wstart[i + 1] = wstart[i] + window_count(T, o->doc_stride, p->q_off[i + 1] - p->q_off[i], nc);
    }
    int64_t n = wstart[ne];
    s->n = n;
    s->T = T;
    s->pad_id = bq_tokenizer_pad_id(tok);
    size_t nt = (size_t)(n ? n : 1) * (size_t)T;
    s->input_ids = bq_malloc(nt * sizeof(int32_t));
    s->token_type_ids = bq_malloc(nt * sizeof(int32_t));
    s->attention_mask = bq_malloc(nt * sizeof(float));
    s->offsets = bq_malloc(nt * 2 * sizeof(int32_t));
    s->len = bq_malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    s->start_positions = bq_malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    s->end_positions = bq_malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    s->example_index = bq_malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    int32_t cls = bq_tokenizer_cls_id(tok), sep = bq_tokenizer_sep_id(tok), pad = s->pad_id;
    int nthr = o->threads > 0 ? o->threads : bq_runtime_threads();
    if (nthr < 1) nthr = 1;
#pragma omp parallel for num_threads(nthr) schedule(dynamic, 64)
    for (int64_t i = 0; i < ne; i++) {
        const BqSquadExample *ex = &s->examples[i];
        int64_t c = ex_par[i], nq = p->q_off[i + 1] - p->q_off[i];
        int64_t nc = p->ctx_off[c + 1] - p->ctx_off[c], k = T - nq - 3;
        const int32_t *qids = p->q_ids + p->q_off[i], *cids = p->ctx_ids + p->ctx_off[c];
        const int32_t *span = p->ctx_span + 2 * p->ctx_off[c];
        int64_t ans_b = ex->answer_start[0], ans_e = ans_b + (int64_t)strlen(ex->answers[0]);
        int64_t cs = 0;
        for (int64_t wi = wstart[i]; wi < wstart[i + 1]; wi++) {
            int64_t w = nc - cs < k ? nc - cs : k, len = nq + w + 3;
            int32_t *ids = s->input_ids + wi * T, *ty = s->token_type_ids + wi * T, *of = s->offsets + 2 * wi * T;
            float *m = s->attention_mask + wi * T;
            int64_t t = 0;
            ids[t++] = cls;
            for (int64_t j = 0; j < nq; j++) ids[t++] = qids[j];
            ids[t++] = sep;
            for (int64_t j = 0; j < w; j++) ids[t++] = cids[cs + j];
            ids[t++] = sep;
            for (; t < T; t++) ids[t] = pad;
            for (t = 0; t < T; t++) {
                ty[t] = t >= nq + 2 && t < len;
                m[t] = t < len ? 1.0f : 0.0f;
                of[2 * t] = of[2 * t + 1] = -1;
            }
            for (int64_t j = 0; j < w; j++) {
                of[2 * (nq + 2 + j)] = span[2 * (cs + j)];
                of[2 * (nq + 2 + j) + 1] = span[2 * (cs + j) + 1];
            }
            s->len[wi] = (int32_t)len;
            s->example_index[wi] = i;
            window_label(span, cs, w, nq + 2, ans_b, ans_e, &s->start_positions[wi], &s->end_positions[wi]);
            cs += k - o->doc_stride;
        }
    }
    free(wstart);
}

/* ---------------------------------------------------------------- load */

int bq_squad_load(BqSquadSet **out, const char *path, const BqTokenizer *tok, const BqSquadOptions *opt) {
    BqSquadOptions def;
    if (!opt) {
        bq_squad_options_default(&def);
        opt = &def;
    }
    *out = NULL;
    if (opt->max_query_length < 1)
        return bq_err(BQ_EINVAL, "--max-query-length: must be >= 1, got %lld", (long long)opt->max_query_length);
    if (opt->doc_stride < 0) return bq_err(BQ_EINVAL, "--doc-stride: must be >= 0, got %lld", (long long)opt->doc_stride);
    if (opt->max_examples < 0) return bq_err(BQ_EINVAL, "max examples: negative (%lld)", (long long)opt->max_examples);
    if (opt->max_seq_len > 65536 || opt->max_seq_len - opt->max_query_length - 3 <= opt->doc_stride)
        return bq_err(BQ_EINVAL,
                      "--doc-stride %lld: must be less than --max-seq-len (%lld) - --max-query-length (%lld) - 3, "
                      "with --max-seq-len <= 65536",
                      (long long)opt->doc_stride, (long long)opt->max_seq_len, (long long)opt->max_query_length);
    int st = BQ_OK;
    int64_t *ex_par = NULL;
    Pieces p = {0};
    BqSquadSet *s = bq_calloc(1, sizeof *s);
    double t0 = bq_now();
    if ((st = read_json(s, path, opt->doc, opt->max_examples, &ex_par))) goto cleanup;
    s->read_seconds = bq_now() - t0;
    if (s->n_examples == 0) {
        st = bq_err(BQ_EFORMAT, "%s: no questions", path);
        goto cleanup;
    }
    uint64_t ident = 0, vh = bq_tokenizer_hash(tok), v = CACHE_VERSION;
    if (!opt->doc && (st = bq_source_identity(path, BQ_DATA_JSONL, "train", &ident))) goto cleanup;
    int64_t kv[2] = {opt->max_query_length, opt->max_examples};
    uint64_t key = BQ_FNV_OFFSET;
    key = bq_fnv1a(key, "squad", 5);
    key = bq_fnv1a(key, &v, sizeof v);
    key = bq_fnv1a(key, &ident, sizeof ident);
    key = bq_fnv1a(key, &vh, sizeof vh);
    key = bq_fnv1a(key, kv, sizeof kv);
    const char *cdir = opt->doc ? "" : opt->cache_dir ? opt->cache_dir : bq_data_default_cache_dir();
    int hit = 0;
    if (*cdir) {
        size_t n = strlen(cdir) + 40;
        s->cache_path = bq_malloc(n);
        snprintf(s->cache_path, n, "%s/%016llx.bqsq", cdir, (unsigned long long)key);
        int r = cache_read(s->cache_path, key, s, opt->max_query_length, bq_tokenizer_vocab_size(tok), &p);
        if (r == 1) hit = 1;
        if (r < 0) s->cache_rejected = 1;
    }
    double t1 = bq_now();
    if (!hit) {
        build_pieces(&p, s, tok, opt->max_query_length, opt->threads);
        if (s->cache_path) {
            if (bq_mkdir_p(cdir) != BQ_OK || cache_write(s->cache_path, key, &p) != BQ_OK) s->cache_write_failed = 1;
            bq_err_clear();
        }
    }
    s->from_cache = hit;
    build_windows(s, &p, ex_par, tok, opt);
    s->encode_seconds = bq_now() - t1;
cleanup:
    pieces_free(&p);
    free(ex_par);
    if (st) bq_squad_free(s);
    else *out = s;
    return st;
}

void bq_squad_batch(const BqSquadSet *s, const int64_t *windows, int64_t B, int64_t T, BqBatch *b, int32_t *start,
                    int32_t *end) {
    BQ_CHECK(T >= 1 && T <= s->T);
    for (int64_t r = 0; r < B; r++) {
        int64_t w = windows[r];
        BQ_CHECK(w >= 0 && w < s->n && s->len[w] <= T);
        memcpy(b->input_ids + r * T, s->input_ids + w * s->T, (size_t)T * sizeof(int32_t));
        memcpy(b->token_type_ids + r * T, s->token_type_ids + w * s->T, (size_t)T * sizeof(int32_t));
        memcpy(b->attention_mask + r * T, s->attention_mask + w * s->T, (size_t)T * sizeof(float));
        if (b->example_index) b->example_index[r] = w;
        if (start) start[r] = s->start_positions[w];
        if (end) end[r] = s->end_positions[w];
    }
    b->B = B;
    b->T = T;
}

/* ---------------------------------------------------------------- post-processing */

/* Indices of the n largest of x[0, T) in descending order (ties: lower index first); returns count. */
static int top_n(const float *x, int64_t T, int n, int32_t *idx) {
    int k = 0;
    for (int64_t t = 0; t < T; t++) {
        if (k == n && !(x[t] > x[idx[k - 1]])) continue;
        int j = k < n ? k++ : n - 1;
        while (j > 0 && x[t] > x[idx[j - 1]]) {
            idx[j] = idx[j - 1];
            j--;
        }
        idx[j] = (int32_t)t;
    }
    return k;
}

int bq_squad_postprocess(const BqSquadSet *s, const float *start_logits, const float *end_logits, int n_best,
                         int max_answer_len, char ***answers) {
    *answers = NULL;
    if (n_best < 1) return bq_err(BQ_EINVAL, "--n-best: must be >= 1, got %d", n_best);
    if (max_answer_len < 1) return bq_err(BQ_EINVAL, "--max-answer-len: must be >= 1, got %d", max_answer_len);
    if (n_best > s->T) n_best = (int)s->T;
    char **out = bq_calloc((size_t)(s->n_examples ? s->n_examples : 1), sizeof(char *));
    int32_t *si = bq_malloc((size_t)n_best * sizeof(int32_t)), *ei = bq_malloc((size_t)n_best * sizeof(int32_t));
    int64_t T = s->T, w = 0;
    for (int64_t e = 0; e < s->n_examples; e++) {
        int found = 0;
        float best = 0;
        int32_t bb = 0, be = 0;
        for (; w < s->n && s->example_index[w] == e; w++) {
            const float *sl = start_logits + w * T, *el = end_logits + w * T;
            const int32_t *of = s->offsets + 2 * w * T;
            int ns = top_n(sl, T, n_best, si), ne = top_n(el, T, n_best, ei);
            for (int a = 0; a < ns; a++) {
                int32_t i = si[a];
                if (of[2 * i] < 0) continue;
                for (int c = 0; c < ne; c++) {
                    int32_t j = ei[c];
                    if (of[2 * j] < 0 || j < i || j - i + 1 > max_answer_len) continue;
                    float score = sl[i] + el[j];
                    if (!found || score > best) {
                        found = 1;
                        best = score;
                        bb = of[2 * i];
                        be = of[2 * j + 1];
                    }
                }
            }
        }
        const char *ctx = s->examples[e].context;
        if (!found) {
            out[e] = bq_strdup("empty");
        } else {
            if (be < bb) be = bb;
            out[e] = bq_malloc((size_t)(be - bb) + 1);
            memcpy(out[e], ctx + bb, (size_t)(be - bb));
            out[e][be - bb] = 0;
        }
    }
    free(si);
    free(ei);
    *answers = out;
    return BQ_OK;
}

void bq_squad_answers_free(char **answers, int64_t n) {
    if (!answers) return;
    for (int64_t i = 0; i < n; i++) free(answers[i]);
    free(answers);
}

/* ---------------------------------------------------------------- official v1.1 evaluation */

/* Python str.isspace */
static int py_space(int32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Python re's \w on str: alphanumeric (categories L* and N*) or '_' */
static int py_word(int32_t c) {
    if (c < 0) return 0;
    if (c < 128) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

/* string.punctuation */
static int py_punct(int32_t c) {
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
}

/* Decodes UTF-8 into code points; an invalid byte b becomes -(b) and is kept as that byte. */
static int64_t decode(const char *text, int32_t *cp) {
    const uint8_t *s = (const uint8_t *)text;
    int64_t n = 0;
    size_t len = strlen(text);
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(len - i), &c);
        if (k <= 0) {
            cp[n++] = -(int32_t)s[i];
            i++;
        } else {
            cp[n++] = c;
            i += (size_t)k;
        }
    }
    return n;
}

char *bq_squad_normalize(const char *text) {
    size_t len = strlen(text);
    /* lowercase can turn one code point into two (U+0130) */
    int32_t *cp = bq_malloc((len + 1) * sizeof(int32_t)), *a = bq_malloc((2 * len + 1) * sizeof(int32_t));
    int64_t n = decode(text, cp), m = 0;
    for (int64_t i = 0; i < n; i++) { /* lower, then drop string.punctuation */
        int32_t c = cp[i];
        if (c == 0x130) {
            a[m++] = 'i';
            a[m++] = 0x307;
            continue;
        }
        if (c >= 0) c = utf8proc_tolower(c);
        if (py_punct(c)) continue;
        a[m++] = c;
    }
    /* \b(a|an|the)\b -> ' ': a maximal run of word characters equal to one of the three */
    for (int64_t i = 0; i < m;) {
        if (!py_word(a[i])) {
            i++;
            continue;
        }
        int64_t j = i;
        while (j < m && py_word(a[j])) j++;
        int64_t l = j - i;
        int art = (l == 1 && a[i] == 'a') || (l == 2 && a[i] == 'a' && a[i + 1] == 'n') ||
                  (l == 3 && a[i] == 't' && a[i + 1] == 'h' && a[i + 2] == 'e');
        if (art) {
            a[i] = ' ';
            for (int64_t k = i + 1; k < j; k++) a[k] = -1000; /* removed */
        }
        i = j;
    }
    char *out = bq_malloc((size_t)m * 4 + 1);
    size_t o = 0;
    int pending = 0;
    for (int64_t i = 0; i < m; i++) {
        int32_t c = a[i];
        if (c == -1000) continue;
        if (c >= 0 && py_space(c)) {
            pending = o > 0;
            continue;
        }
        if (pending) out[o++] = ' ';
        pending = 0;
        if (c < 0) out[o++] = (char)(uint8_t)(-c);
        else o += (size_t)utf8proc_encode_char(c, (utf8proc_uint8_t *)out + o);
    }
    out[o] = 0;
    free(cp);
    free(a);
    return out;
}

double bq_squad_exact(const char *prediction, const char *reference) {
    char *a = bq_squad_normalize(prediction), *b = bq_squad_normalize(reference);
    double r = strcmp(a, b) == 0;
    free(a);
    free(b);
    return r;
}

static int cmp_strp(const void *x, const void *y) { return strcmp(*(char *const *)x, *(char *const *)y); }

/* Splits a normalized string (single spaces) in place into sorted tokens; returns the count. */
static int64_t split_sorted(char *s, char ***tok) {
    int64_t n = 0, cap = 8;
    *tok = bq_malloc((size_t)cap * sizeof(char *));
    for (char *p = s; *p;) {
        if (n == cap) *tok = bq_realloc(*tok, (size_t)(cap *= 2) * sizeof(char *));
        (*tok)[n++] = p;
        char *sp = strchr(p, ' ');
        if (!sp) break;
        *sp = 0;
        p = sp + 1;
    }
    qsort(*tok, (size_t)n, sizeof(char *), cmp_strp);
    return n;
}

double bq_squad_f1(const char *prediction, const char *reference) {
    char *a = bq_squad_normalize(prediction), *b = bq_squad_normalize(reference);
    char **ta, **tb;
    int64_t na = split_sorted(a, &ta), nb = split_sorted(b, &tb), same = 0;
    for (int64_t i = 0, j = 0; i < na && j < nb;) { /* multiset intersection of two sorted lists */
        int c = strcmp(ta[i], tb[j]);
        if (c == 0) same++, i++, j++;
        else if (c < 0) i++;
        else j++;
    }
    double f1 = 0;
    if (same > 0) {
        double prec = (double)same / (double)na, rec = (double)same / (double)nb;
        f1 = 2 * prec * rec / (prec + rec);
    }
    free(ta);
    free(tb);
    free(a);
    free(b);
    return f1;
}

void bq_squad_score(const BqSquadSet *s, char *const *predictions, BqSquadScore *out) {
    double em = 0, f1 = 0;
    for (int64_t i = 0; i < s->n_examples; i++) {
        const BqSquadExample *e = &s->examples[i];
        const char *p = predictions[i] ? predictions[i] : "";
        double bem = 0, bf = 0;
        for (int k = 0; k < e->n_answers; k++) {
            double x = bq_squad_exact(p, e->answers[k]), y = bq_squad_f1(p, e->answers[k]);
            if (x > bem) bem = x;
            if (y > bf) bf = y;
        }
        em += bem;
        f1 += bf;
    }
    out->n = s->n_examples;
    out->exact_match = s->n_examples ? 100.0 * em / (double)s->n_examples : 0;
    out->f1 = s->n_examples ? 100.0 * f1 / (double)s->n_examples : 0;
}

int bq_squad_write_predictions(const char *path, const BqSquadSet *s, char *const *predictions) {
    int st = BQ_OK;
    json_t *o = json_object();
    size_t pl = strlen(path) + 8;
    char *tmp = bq_malloc(pl);
    snprintf(tmp, pl, "%s.tmp", path);
    for (int64_t i = 0; i < s->n_examples; i++) {
        json_t *v = json_string(predictions[i] ? predictions[i] : "");
        if (!v) { /* jansson refuses invalid UTF-8 */
            st = bq_err(BQ_EINVAL, "%s: question %s: the prediction is not valid UTF-8", path, s->examples[i].id);
            goto cleanup;
        }
        json_object_set_new(o, s->examples[i].id, v);
    }
    errno = 0;
    if (json_dump_file(o, tmp, JSON_INDENT(1) | JSON_PRESERVE_ORDER) != 0) {
        st = bq_err(BQ_EIO, "%s: cannot write: %s", tmp, errno ? strerror(errno) : "I/O error");
        remove(tmp);
        goto cleanup;
    }
    st = bq_rename_durable(tmp, path);
    if (st) remove(tmp);
cleanup:
    json_decref(o);
    free(tmp);
    return st;
}
