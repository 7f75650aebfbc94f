/* datasets/squad.c against Hugging Face and the official SQuAD v1.1 evaluation:
 *  - windows of the whole dev set (tests/fixtures/squad/dev_windows.json, made by
 *    tests/make_squad_fixture.py from transformers' fast tokenizer and run_qa.py's logic): the window
 *    count of every question, and for the sampled questions every window's ids, token types, padding,
 *    labels and context byte offsets, in two configurations (384/128/64 and 96/24/16);
 *  - post-processing against utils_qa.py's on the fixture's hashed logits, and on hand-built sets
 *    (best span across windows, n-best cut, max_answer_len, end < start, non-context pieces, "empty");
 *  - EM/F1 against hand-computed cases and the official normalisation (values from evaluate-v1.1.py);
 *  - the cache (hit, corrupt file rebuilt), 1 thread == 2 threads, bq_squad_batch;
 *  - malformed files: one-line errors naming the file and the question id, nothing written.
 * Needs BERTQAT_DATA (or ../shared/data) with squad/dev-v1.1.json and vocab/bert-base-uncased/vocab.txt
 * (the same vocabulary and normalizer settings as all-MiniLM-L6-v2's, which made the fixture). */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "datasets/squad.h"
#include "tokenizer/tokenizer.h"
#include "tests/test_util.h"

static char root[1024], tmp[256], cache[300];
static const BqTokenizer *tok;

/* tests/make_squad_fixture.py's logit() */
static float hashed_logit(int64_t ex, int64_t wl, int64_t t, int64_t salt) {
    uint64_t h = ((uint64_t)ex * 1000003u + (uint64_t)wl * 7919u + (uint64_t)t * 104729u + (uint64_t)salt * 15485863u) &
                 0xFFFFFFFFu;
    h = (h * 2654435761u) & 0xFFFFFFFFu;
    h ^= h >> 13;
    h = (h * 2246822519u) & 0xFFFFFFFFu;
    h ^= h >> 16;
    return (float)((double)h / 4294967296.0 * 8.0 - 4.0);
}

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static void check_config(const char *dev, json_t *cfg, json_t *fx) {
    BqSquadOptions o;
    bq_squad_options_default(&o);
    o.max_seq_len = json_integer_value(json_object_get(cfg, "max_seq_len"));
    o.doc_stride = json_integer_value(json_object_get(cfg, "doc_stride"));
    o.max_query_length = json_integer_value(json_object_get(cfg, "max_query_length"));
    o.cache_dir = cache;
    o.threads = 2;
    BqSquadSet *s = NULL;
    int st = bq_squad_load(&s, dev, tok, &o);
    EXPECT(st == 0, "%s", bq_errmsg());
    if (st) return;
    printf("config %lld/%lld/%lld: %lld questions, %lld windows, read %.2f s, encode %.2f s (cache %s)\n",
           (long long)o.max_seq_len, (long long)o.doc_stride, (long long)o.max_query_length,
           (long long)s->n_examples, (long long)s->n, s->read_seconds, s->encode_seconds,
           s->from_cache ? "hit" : "miss");
    EXPECT(s->n_examples == json_integer_value(json_object_get(fx, "n_examples")));
    EXPECT(s->T == o.max_seq_len);
    /* window counts of every question, and windows grouped in example order */
    json_t *counts = json_object_get(cfg, "window_counts");
    int64_t *first = bq_calloc((size_t)s->n_examples + 1, sizeof(int64_t));
    int64_t bad_counts = 0, w = 0;
    for (int64_t e = 0; e < s->n_examples; e++) {
        first[e] = w;
        int64_t c = 0;
        while (w < s->n && s->example_index[w] == e) w++, c++;
        if (c != json_integer_value(json_array_get(counts, (size_t)e))) bad_counts++;
    }
    first[s->n_examples] = w;
    EXPECT(w == s->n && bad_counts == 0, "%lld of %lld questions with a different window count", (long long)bad_counts,
           (long long)s->n_examples);
    /* sampled windows */
    int64_t T = s->T, nwin = 0, bad_ids = 0, bad_types = 0, bad_lab = 0, bad_off = 0, bad_pad = 0;
    size_t i;
    json_t *ex;
    json_array_foreach(json_object_get(cfg, "examples"), i, ex) {
        int64_t e = json_integer_value(json_object_get(ex, "index"));
        EXPECT(!strcmp(s->examples[e].id, json_string_value(json_object_get(ex, "id"))));
        json_t *wins = json_object_get(ex, "windows");
        if ((int64_t)json_array_size(wins) != first[e + 1] - first[e]) continue; /* counted above */
        size_t k;
        json_t *win;
        json_array_foreach(wins, k, win) {
            int64_t wi = first[e] + (int64_t)k;
            nwin++;
            json_t *ids = json_object_get(win, "input_ids");
            const char *types = json_string_value(json_object_get(win, "token_type_ids"));
            int64_t len = (int64_t)json_array_size(ids), nq = -1;
            if (s->len[wi] != len) {
                bad_ids++;
                continue;
            }
            for (int64_t t = 0; t < len; t++) {
                if (s->input_ids[wi * T + t] != json_integer_value(json_array_get(ids, (size_t)t))) bad_ids++;
                if (s->token_type_ids[wi * T + t] != types[t] - '0') bad_types++;
                if (nq < 0 && types[t] == '1') nq = t - 2;
            }
            for (int64_t t = len; t < T; t++)
                if (s->input_ids[wi * T + t] != s->pad_id || s->token_type_ids[wi * T + t] != 0 ||
                    s->attention_mask[wi * T + t] != 0.0f || s->offsets[2 * (wi * T + t)] != -1)
                    bad_pad++;
            for (int64_t t = 0; t < len; t++)
                if (s->attention_mask[wi * T + t] != 1.0f) bad_pad++;
            if (s->start_positions[wi] != json_integer_value(json_object_get(win, "start")) ||
                s->end_positions[wi] != json_integer_value(json_object_get(win, "end")))
                bad_lab++;
            json_t *offs = json_object_get(win, "context_offsets");
            int64_t nctx = (int64_t)json_array_size(offs) / 2;
            if (nq < 0 || nq + 3 + nctx != len) {
                bad_off++;
                continue;
            }
            for (int64_t t = 0; t < len; t++) {
                int64_t c = t - nq - 2;
                int in = c >= 0 && c < nctx;
                int32_t b = s->offsets[2 * (wi * T + t)], en = s->offsets[2 * (wi * T + t) + 1];
                if (in ? (b != json_integer_value(json_array_get(offs, (size_t)(2 * c))) ||
                          en != json_integer_value(json_array_get(offs, (size_t)(2 * c + 1))))
                       : (b != -1 || en != -1))
                    bad_off++;
            }
        }
    }
    printf("  %lld sampled windows: %lld id, %lld type, %lld padding/mask, %lld label, %lld offset mismatches\n",
           (long long)nwin, (long long)bad_ids, (long long)bad_types, (long long)bad_pad, (long long)bad_lab,
           (long long)bad_off);
    EXPECT(nwin > 100 && bad_ids == 0 && bad_types == 0 && bad_pad == 0 && bad_lab == 0 && bad_off == 0);

    /* post-processing on the fixture's hashed logits */
    float *sl = bq_malloc((size_t)(s->n * T) * sizeof(float)), *el = bq_malloc((size_t)(s->n * T) * sizeof(float));
    int64_t ss = json_integer_value(json_object_get(fx, "start_salt")), es = json_integer_value(json_object_get(fx, "end_salt"));
    for (int64_t e = 0; e < s->n_examples; e++)
        for (int64_t x = first[e]; x < first[e + 1]; x++)
            for (int64_t t = 0; t < T; t++) {
                sl[x * T + t] = hashed_logit(e, x - first[e], t, ss);
                el[x * T + t] = hashed_logit(e, x - first[e], t, es);
            }
    char **pred = NULL;
    st = bq_squad_postprocess(s, sl, el, (int)json_integer_value(json_object_get(fx, "n_best")),
                              (int)json_integer_value(json_object_get(fx, "max_answer_len")), &pred);
    EXPECT(st == 0);
    int64_t bad_pred = 0, npred = 0;
    json_array_foreach(json_object_get(cfg, "examples"), i, ex) {
        int64_t e = json_integer_value(json_object_get(ex, "index"));
        const char *want = json_string_value(json_object_get(ex, "prediction"));
        npred++;
        if (!pred || strcmp(pred[e], want)) {
            if (bad_pred++ < 3) fprintf(stderr, "  prediction %s: got '%s' want '%s'\n", s->examples[e].id, pred ? pred[e] : "", want);
        }
    }
    printf("  post-processing: %lld of %lld sampled answers differ from utils_qa.py's\n", (long long)bad_pred, (long long)npred);
    EXPECT(bad_pred == 0);
    bq_squad_answers_free(pred, s->n_examples);

    /* the cache: a second load hits and gives identical windows; 1 thread without cache == 2 threads */
    BqSquadSet *c = NULL;
    o.threads = 1;
    EXPECT(bq_squad_load(&c, dev, tok, &o) == 0 && c && c->from_cache == 1);
    BqSquadOptions o1 = o;
    o1.cache_dir = "";
    BqSquadSet *u = NULL;
    EXPECT(bq_squad_load(&u, dev, tok, &o1) == 0 && u && u->from_cache == 0 && u->cache_path == NULL);
    BqSquadSet *sets[2] = {c, u};
    for (int k = 0; k < 2; k++) {
        BqSquadSet *x = sets[k];
        if (!x) continue;
        size_t nt = (size_t)(s->n * T);
        EXPECT(x->n == s->n && !memcmp(x->input_ids, s->input_ids, nt * 4) &&
               !memcmp(x->token_type_ids, s->token_type_ids, nt * 4) &&
               !memcmp(x->attention_mask, s->attention_mask, nt * 4) && !memcmp(x->offsets, s->offsets, nt * 8) &&
               !memcmp(x->start_positions, s->start_positions, (size_t)s->n * 4) &&
               !memcmp(x->end_positions, s->end_positions, (size_t)s->n * 4) &&
               !memcmp(x->example_index, s->example_index, (size_t)s->n * 8),
               "set %d differs from the first load", k);
    }
    bq_squad_free(c);
    bq_squad_free(u);
    free(sl);
    free(el);
    free(first);
    bq_squad_free(s);
}

/* ---- hand-built post-processing ---- */

/* One example "a0 a1 a2 a3 a4 a5 a6 a7" over two windows of T = 8: window 0 holds context pieces 0..4
 * at positions 3..7, window 1 pieces 3..7 at positions 3..7; positions 0..2 are [CLS] q [SEP]. */
static void hand_postprocess(void) {
    static char ctx[] = "a0 a1 a2 a3 a4 a5 a6 a7";
    BqSquadExample ex = {0};
    ex.id = "h";
    ex.context = ctx;
    ex.context_len = (int64_t)strlen(ctx);
    BqSquadSet s = {0};
    s.n_examples = 1;
    s.examples = &ex;
    s.n = 2;
    s.T = 8;
    int64_t eidx[2] = {0, 0};
    int32_t offs[2 * 8 * 2];
    for (int w = 0; w < 2; w++)
        for (int t = 0; t < 8; t++) {
            int piece = t - 3 + (w ? 3 : 0);
            int in = t >= 3;
            offs[2 * (w * 8 + t)] = in ? piece * 3 : -1;
            offs[2 * (w * 8 + t) + 1] = in ? piece * 3 + 2 : -1;
        }
    s.example_index = eidx;
    s.offsets = offs;
    float sl[16], el[16];
    char **a = NULL;
#define RESET()                                  \
    do {                                         \
        for (int q = 0; q < 16; q++) sl[q] = el[q] = -5.0f; \
    } while (0)
    /* best across windows: window 1 (pieces 5..6) beats window 0 (pieces 1..1) */
    RESET();
    sl[0 * 8 + 4] = 2, el[0 * 8 + 4] = 2;   /* "a1", 4 */
    sl[1 * 8 + 5] = 3, el[1 * 8 + 6] = 2.5f; /* "a5 a6", 5.5 */
    EXPECT(bq_squad_postprocess(&s, sl, el, 20, 30, &a) == 0 && !strcmp(a[0], "a5 a6"), "got '%s'", a ? a[0] : "");
    bq_squad_answers_free(a, 1);
    /* max_answer_len 1 rules the two-piece span out */
    EXPECT(bq_squad_postprocess(&s, sl, el, 20, 1, &a) == 0 && !strcmp(a[0], "a1"), "got '%s'", a ? a[0] : "");
    bq_squad_answers_free(a, 1);
    /* a span across the window boundary (pieces 2..5) exists only in no window: the answer comes from
     * one window; end < start is never chosen */
    RESET();
    sl[0 * 8 + 5] = 4;  /* piece 2 in window 0 */
    el[1 * 8 + 5] = 4;  /* piece 5 in window 1 */
    el[0 * 8 + 3] = 3;  /* piece 0 in window 0: before the start */
    sl[1 * 8 + 3] = 1;  /* piece 3 in window 1 */
    EXPECT(bq_squad_postprocess(&s, sl, el, 20, 30, &a) == 0 && !strcmp(a[0], "a3 a4 a5"), "got '%s'", a ? a[0] : "");
    bq_squad_answers_free(a, 1);
    /* non-context positions never count; the n-best cut: with n_best 1 only the top start and the top
     * end of each window pair up ([CLS] tops window 0, so window 0 gives nothing) */
    RESET();
    sl[0] = 9, el[0] = 9;                  /* [CLS] of window 0 */
    sl[0 * 8 + 6] = 8, el[0 * 8 + 6] = 8;  /* "a3" second best in window 0: 16 */
    sl[1 * 8 + 7] = 1, el[1 * 8 + 7] = 1;  /* "a7" in window 1: 2 */
    EXPECT(bq_squad_postprocess(&s, sl, el, 2, 30, &a) == 0 && !strcmp(a[0], "a3"), "got '%s'", a ? a[0] : "");
    bq_squad_answers_free(a, 1);
    EXPECT(bq_squad_postprocess(&s, sl, el, 1, 30, &a) == 0 && !strcmp(a[0], "a7"), "got '%s'", a ? a[0] : "");
    bq_squad_answers_free(a, 1);
    /* nothing valid: "empty" (every top end before every top start) */
    RESET();
    for (int w = 0; w < 2; w++) sl[w * 8 + 7] = 5, el[w * 8 + 3] = 5;
    EXPECT(bq_squad_postprocess(&s, sl, el, 1, 30, &a) == 0 && !strcmp(a[0], "empty"), "got '%s'", a ? a[0] : "");
    bq_squad_answers_free(a, 1);
    EXPECT(bq_squad_postprocess(&s, sl, el, 0, 30, &a) != 0 && a == NULL);
    EXPECT(bq_squad_postprocess(&s, sl, el, 20, 0, &a) != 0 && a == NULL);
#undef RESET
}

/* ---- scoring ---- */

static void scoring(void) {
    /* expected values printed by evaluate-v1.1.py's normalize_answer / f1_score */
    static const char *norm[][2] = {
        {"The  Quick, brown fox!", "quick brown fox"},
        {"an apple a day", "apple day"},
        {"Theater anathema", "theater anathema"},
        {"a-b", "ab"},
        {"the_end", "theend"},
        {"\xc3\x89lan the \xc3\x84", "\xc3\xa9lan \xc3\xa4"},
        {"th\xc3\xa9 a", "th\xc3\xa9"},
        {"  \t a \n", ""},
        {"U.S.A.", "usa"},
        {"\xc4\xb0stanbul", "i\xcc\x87stanbul"},
        {"don't", "dont"},
        {"1,000", "1000"},
        {"a\xc2\xa0" "b x", "b x"},
        {"x\xe2\x80\x8by", "x\xe2\x80\x8by"},
        {"the\xe2\x80\x83" "end\x1c" "A", "end"},
        {"a\xcc\x81 an", "\xcc\x81"},
        {"An  AN aN", ""},
        {"(the) [a] {an}", ""},
        {"x_a", "xa"},
        {"3a the3 a3", "3a the3 a3"},
    };
    for (size_t i = 0; i < sizeof norm / sizeof norm[0]; i++) {
        char *n = bq_squad_normalize(norm[i][0]);
        EXPECT(!strcmp(n, norm[i][1]), "normalize('%s') = '%s', want '%s'", norm[i][0], n, norm[i][1]);
        free(n);
    }
    double maxerr = 0;
    struct { const char *p, *r; double em, f1; } c[] = {
        {"Denver Broncos", "the Denver Broncos.", 1, 1},
        {"Denver Broncos won", "Denver Broncos", 0, 0.8},
        {"x y y z", "y y y w", 0, 0.5},
        {"", "foo", 0, 0},
        {"", "the", 1, 0}, /* both normalize to "": exact, but no shared token */
        {"year 1990", "in 1990", 0, 0.5},
        {"year 1990", "1990", 0, 2.0 / 3.0},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        double em = bq_squad_exact(c[i].p, c[i].r), f1 = bq_squad_f1(c[i].p, c[i].r);
        EXPECT(em == c[i].em, "EM('%s', '%s') = %g", c[i].p, c[i].r, em);
        if (fabs(f1 - c[i].f1) > maxerr) maxerr = fabs(f1 - c[i].f1);
    }
    printf("scoring: max F1 error %.3g over %zu hand cases\n", maxerr, sizeof c / sizeof c[0]);
    EXPECT(maxerr < 1e-12);
    /* maximum over references, averaged over questions, x100 */
    char *r0[] = {"Denver Broncos", "Broncos"}, *r1[] = {"1990", "in 1990"}, *r2[] = {"Santa Clara"};
    BqSquadExample ex[3] = {{.id = "q0", .n_answers = 2, .answers = r0},
                            {.id = "q1", .n_answers = 2, .answers = r1},
                            {.id = "q2", .n_answers = 1, .answers = r2}};
    BqSquadSet s = {.n_examples = 3, .examples = ex};
    char *pred[] = {"broncos", "year 1990", NULL};
    BqSquadScore sc;
    bq_squad_score(&s, pred, &sc);
    double want_f1 = 100.0 * (1 + 2.0 / 3.0 + 0) / 3, want_em = 100.0 / 3;
    printf("scoring: EM %.4f (want %.4f) F1 %.4f (want %.4f)\n", sc.exact_match, want_em, sc.f1, want_f1);
    EXPECT(sc.n == 3 && fabs(sc.exact_match - want_em) < 1e-9 && fabs(sc.f1 - want_f1) < 1e-9);

    /* the predictions file */
    char path[400], bad[400];
    snprintf(path, sizeof path, "%s/pred.json", tmp);
    char *pw[] = {"Broncos", "caf\xc3\xa9 \"1990\"", ""};
    EXPECT(bq_squad_write_predictions(path, &s, pw) == 0, "%s", bq_errmsg());
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    EXPECT(j && json_object_size(j) == 3 && !strcmp(json_string_value(json_object_get(j, "q1")), pw[1]) &&
           !strcmp(json_string_value(json_object_get(j, "q2")), ""));
    if (j) json_decref(j);
    snprintf(bad, sizeof bad, "%s/no/such/dir/pred.json", tmp);
    EXPECT(bq_squad_write_predictions(bad, &s, pw) != 0 && access(bad, F_OK) != 0);
    char *pinv[] = {"ok", "bad \xff byte", "ok"};
    snprintf(bad, sizeof bad, "%s/pred_invalid.json", tmp);
    EXPECT(bq_squad_write_predictions(bad, &s, pinv) != 0 && access(bad, F_OK) != 0);
    EXPECT(strstr(bq_errmsg(), "q1") != NULL, "%s", bq_errmsg());
}

/* ---- malformed files ---- */

static void malformed(void) {
    static const struct { const char *name, *json, *want; } bad[] = {
        {"truncated", "{\"data\": [{\"title\": \"t\", \"paragraphs\": [{\"context\": \"abc\", \"qas\": [", "invalid JSON"},
        {"not_at_start",
         "{\"data\":[{\"paragraphs\":[{\"context\":\"the cat sat\",\"qas\":[{\"id\":\"q-not\",\"question\":\"who?\","
         "\"answers\":[{\"text\":\"cat\",\"answer_start\":5}]}]}]}]}",
         "q-not"},
        {"past_end",
         "{\"data\":[{\"paragraphs\":[{\"context\":\"the cat\",\"qas\":[{\"id\":\"q-end\",\"question\":\"who?\","
         "\"answers\":[{\"text\":\"cat\",\"answer_start\":6}]}]}]}]}",
         "q-end"},
        {"no_context", "{\"data\":[{\"paragraphs\":[{\"qas\":[{\"id\":\"q-ctx\",\"question\":\"x\",\"answers\":[]}]}]}]}", "q-ctx"},
        {"no_question",
         "{\"data\":[{\"paragraphs\":[{\"context\":\"abc\",\"qas\":[{\"id\":\"q-q\","
         "\"answers\":[{\"text\":\"abc\",\"answer_start\":0}]}]}]}]}",
         "q-q"},
        {"no_text",
         "{\"data\":[{\"paragraphs\":[{\"context\":\"abc\",\"qas\":[{\"id\":\"q-t\",\"question\":\"x\","
         "\"answers\":[{\"answer_start\":0}]}]}]}]}",
         "q-t"},
        {"no_answers",
         "{\"data\":[{\"paragraphs\":[{\"context\":\"abc\",\"qas\":[{\"id\":\"q-a\",\"question\":\"x\",\"answers\":[]}]}]}]}",
         "q-a"},
        {"no_id", "{\"data\":[{\"paragraphs\":[{\"context\":\"abc\",\"qas\":[{\"question\":\"x\"}]}]}]}", "missing string \"id\""},
        {"v2",
         "{\"version\":\"v2.0\",\"data\":[{\"paragraphs\":[{\"context\":\"abc\",\"qas\":[{\"id\":\"q-v2\",\"question\":\"x\","
         "\"answers\":[],\"is_impossible\":true}]}]}]}",
         "q-v2"},
        {"dup",
         "{\"data\":[{\"paragraphs\":[{\"context\":\"abc\",\"qas\":[{\"id\":\"q-d\",\"question\":\"x\","
         "\"answers\":[{\"text\":\"abc\",\"answer_start\":0}]},{\"id\":\"q-d\",\"question\":\"y\","
         "\"answers\":[{\"text\":\"abc\",\"answer_start\":0}]}]}]}]}",
         "q-d"},
        {"bad_utf8",
         "{\"data\":[{\"paragraphs\":[{\"context\":\"ab\xff\",\"qas\":[{\"id\":\"q-u\",\"question\":\"x\","
         "\"answers\":[{\"text\":\"ab\",\"answer_start\":0}]}]}]}]}",
         "invalid UTF-8"},
        {"not_squad", "[1, 2, 3]", "\"data\""},
    };
    char path[400], dir[400];
    snprintf(dir, sizeof dir, "%s/badcache", tmp);
    BqSquadOptions o;
    bq_squad_options_default(&o);
    o.cache_dir = dir;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(path, sizeof path, "%s/%s.json", tmp, bad[i].name);
        FILE *f = fopen(path, "wb");
        BQ_CHECK(f);
        fputs(bad[i].json, f);
        fclose(f);
        BqSquadSet *s = (BqSquadSet *)1;
        int st = bq_squad_load(&s, path, tok, &o);
        const char *m = bq_errmsg();
        printf("  %-12s -> %s\n", bad[i].name, m);
        EXPECT(st != 0 && s == NULL && strstr(m, path) && strstr(m, bad[i].want) && !strchr(m, '\n'),
               "%s: status %d message '%s'", bad[i].name, st, m);
    }
    EXPECT(count_files(dir) == 0, "a failed load wrote into the cache folder");
    /* a valid answer after multi-byte characters: answer_start counts code points */
    snprintf(path, sizeof path, "%s/ok.json", tmp);
    FILE *f = fopen(path, "wb");
    BQ_CHECK(f);
    fputs("{\"data\":[{\"title\":\"T\",\"paragraphs\":[{\"context\":\"Caf\\u00e9 \\ud83d\\ude00 in Paris\",\"qas\":[{\"id\":\"q1\","
          "\"question\":\"where?\",\"answers\":[{\"text\":\"Paris\",\"answer_start\":10},{\"text\":\"in Paris\","
          "\"answer_start\":7}]}]}]}]}",
          f);
    fclose(f);
    BqSquadSet *s = NULL;
    EXPECT(bq_squad_load(&s, path, tok, &o) == 0, "%s", bq_errmsg());
    if (s) {
        EXPECT(s->n_examples == 1 && s->examples[0].n_answers == 2 && s->examples[0].answer_start[0] == 14 &&
               s->examples[0].answer_start[1] == 11 && !strcmp(s->examples[0].title, "T"));
        /* the label covers "paris", the last context piece: run_qa.py's edge case (docs/squad.md §2,
         * its start loop would run into [SEP] and the padding), labelled at the piece here */
        int32_t st0 = s->start_positions[0], en0 = s->end_positions[0];
        EXPECT(st0 > 0 && st0 == en0 && s->offsets[2 * st0] == 14 && s->offsets[2 * st0 + 1] == 19, "label %d..%d", st0, en0);
        /* bq_squad_batch: dynamic padding to the window's length */
        int64_t wins[1] = {0}, T = s->len[0];
        int32_t ids[64], types[64], lab_s, lab_e;
        float mask[64];
        int64_t exi;
        BqBatch b = {.input_ids = ids, .token_type_ids = types, .attention_mask = mask, .example_index = &exi};
        bq_squad_batch(s, wins, 1, T, &b, &lab_s, &lab_e);
        EXPECT(b.B == 1 && b.T == T && lab_s == st0 && lab_e == en0 && exi == 0 && !memcmp(ids, s->input_ids, (size_t)T * 4) &&
               mask[T - 1] == 1.0f);
        bq_squad_free(s);
    }
    /* options */
    BqSquadOptions ob = o;
    ob.doc_stride = 400;
    s = (BqSquadSet *)1;
    EXPECT(bq_squad_load(&s, path, tok, &ob) != 0 && s == NULL && strstr(bq_errmsg(), "--doc-stride"));
    ob = o;
    ob.max_query_length = 0;
    EXPECT(bq_squad_load(&s, path, tok, &ob) != 0 && strstr(bq_errmsg(), "--max-query-length"));
    snprintf(path, sizeof path, "%s/absent.json", tmp);
    EXPECT(bq_squad_load(&s, path, tok, &o) != 0 && strstr(bq_errmsg(), path));
}

/* the cache: a corrupt file is detected and rebuilt (on the small file of malformed()) */
static void corrupt_cache(void) {
    char path[400];
    snprintf(path, sizeof path, "%s/ok.json", tmp);
    BqSquadOptions o;
    bq_squad_options_default(&o);
    o.cache_dir = cache;
    BqSquadSet *a = NULL, *b = NULL;
    EXPECT(bq_squad_load(&a, path, tok, &o) == 0 && a && a->n_examples == 1 && a->cache_path && !a->from_cache);
    if (!a) return;
    FILE *f = fopen(a->cache_path, "r+b");
    EXPECT(f != NULL);
    if (f) {
        fseek(f, -3, SEEK_END);
        long at = ftell(f);
        int c = fgetc(f);
        fseek(f, at, SEEK_SET);
        fputc(c ^ 0x20, f);
        fclose(f);
    }
    EXPECT(bq_squad_load(&b, path, tok, &o) == 0 && b && b->cache_rejected == 1 && b->from_cache == 0);
    if (b)
        EXPECT(b->n == a->n && !memcmp(b->input_ids, a->input_ids, (size_t)(a->n * a->T) * 4) &&
               !memcmp(b->offsets, a->offsets, (size_t)(a->n * a->T) * 8));
    bq_squad_free(a);
    bq_squad_free(b);
    b = NULL;
    EXPECT(bq_squad_load(&b, path, tok, &o) == 0 && b && b->from_cache == 1);
    bq_squad_free(b);
}

int main(void) {
    const char *src = getenv("BQ_SOURCE_DIR"), *data = getenv("BERTQAT_DATA");
    snprintf(root, sizeof root, "%s", src ? src : ".");
    char vocab[2200], dev[2200], fxp[1200];
    char base[1100];
    if (data) snprintf(base, sizeof base, "%s", data);
    else snprintf(base, sizeof base, "%s/../shared/data", root);
    snprintf(vocab, sizeof vocab, "%s/vocab/bert-base-uncased/vocab.txt", base);
    snprintf(dev, sizeof dev, "%s/squad/dev-v1.1.json", base);
    snprintf(fxp, sizeof fxp, "%s/tests/fixtures/squad/dev_windows.json", root);
    BqTokenizer *t = NULL;
    if (bq_tokenizer_load(&t, vocab, NULL)) {
        fprintf(stderr, "test_squad: %s (set BERTQAT_DATA)\n", bq_errmsg());
        return 1;
    }
    tok = t;
    json_error_t je;
    json_t *fx = json_load_file(fxp, 0, &je);
    if (!fx) {
        fprintf(stderr, "test_squad: %s: %s\n", fxp, je.text);
        return 1;
    }
    bq_test_tmpdir(tmp, sizeof tmp, "squad");
    snprintf(cache, sizeof cache, "%s/cache", tmp);
    scoring();
    hand_postprocess();
    malformed();
    size_t i;
    json_t *cfg;
    json_array_foreach(json_object_get(fx, "configs"), i, cfg) check_config(dev, cfg, fx);
    corrupt_cache();
    json_decref(fx);
    bq_tokenizer_free(t);
    bq_test_rmtree(tmp);
    if (fails) fprintf(stderr, "test_squad: %d failure(s)\n", fails);
    else printf("test_squad: ok\n");
    return fails != 0;
}
