/* Unit tests of tokenizer/tokenizer.c on a small vocabulary written by the test: vocab.txt parsing
 * (CRLF, no final newline, missing specials), cleaning, punctuation, CJK, accents/lowercase, WordPiece
 * (## continuation, 100-char limit, no match), invalid UTF-8, literal special tokens, truncation
 * (head/tail/head_tail) and pairs (longest_first, token types). Expected outputs follow HF tokenizers
 * (BertNormalizer, BertPreTokenizer, WordPiece); the full HF comparison is tests/python/test_tokenizer_hf.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "tokenizer/tokenizer.h"
#include "tests/test_util.h"

static char dir[256];

static const char *VOCAB[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", ",", "!", ".",
                              "un", "##aff", "##able", "cafe", "café", "中", "国", "a", "##a", "b", "##b",
                              "'", "s", "don", "t", "i", "##̇", "straße", "strasse", "x", "##x", "<", ">", "/",
                              "br", "e", "##e", "Hello", "World", "CAFE", "ı", "ς", "σ", "##́", "1", "##0", "$",
                              "€", "ab", "##ab", NULL};

static int mkdir_p_ok(const char *d);

static void write_file(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    BQ_CHECK(f);
    fputs(s, f);
    fclose(f);
}

/* writes VOCAB as dir/name/vocab.txt with line ending eol; returns the path (static) */
static const char *make_vocab(const char *name, const char *eol, int final_newline, const char *skip) {
    static char path[512];
    char d[400];
    snprintf(d, sizeof d, "%s/%s", dir, name);
    BQ_CHECK(mkdir_p_ok(d));
    snprintf(path, sizeof path, "%s/vocab.txt", d);
    FILE *f = fopen(path, "wb");
    BQ_CHECK(f);
    for (int i = 0; VOCAB[i]; i++) {
        if (skip && !strcmp(VOCAB[i], skip)) fputs("[unused]", f);
        else fputs(VOCAB[i], f);
        if (VOCAB[i + 1] || final_newline) fputs(eol, f);
    }
    fclose(f);
    return path;
}

/* tokens of text, space-joined */
static const char *toks(const BqTokenizer *t, const char *text, size_t len) {
    static char out[4096];
    int32_t *ids = NULL;
    int64_t n = 0, cap = 0;
    bq_tokenizer_tokenize(t, text, len, &ids, &n, &cap);
    out[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i) strcat(out, " ");
        strcat(out, bq_tokenizer_token(t, ids[i]));
    }
    free(ids);
    return out;
}

#define TOK(t, text, want)                                                                \
    do {                                                                                  \
        const char *got_ = toks(t, text, strlen(text));                                   \
        EXPECT(!strcmp(got_, want), "tokenize(%s): got '%s' want '%s'", #text, got_, want); \
    } while (0)

static int mkdir_p_ok(const char *d) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", d);
    return system(cmd) == 0;
}

static void test_vocab_files(void) {
    BqTokenizer *t = NULL;
    /* CRLF, no final newline: same ids as LF */
    const char *p = make_vocab("crlf", "\r\n", 0, NULL);
    EXPECT(bq_tokenizer_load(&t, p, NULL) == 0, "crlf load: %s", bq_errmsg());
    if (t) {
        int32_t n = 0;
        while (VOCAB[n]) n++;
        EXPECT(bq_tokenizer_vocab_size(t) == n, "vocab size %d want %d", bq_tokenizer_vocab_size(t), n);
        EXPECT(bq_tokenizer_unk_id(t) == 1 && bq_tokenizer_cls_id(t) == 2 && bq_tokenizer_sep_id(t) == 3 &&
                   bq_tokenizer_pad_id(t) == 0, "special ids");
        EXPECT(!strcmp(bq_tokenizer_token(t, n - 1), "##ab"), "last token '%s'", bq_tokenizer_token(t, n - 1));
        EXPECT(bq_tokenizer_token(t, n) == NULL && bq_tokenizer_token(t, -1) == NULL, "out of range token");
        TOK(t, "hello world", "hello world");
        uint64_t h1 = bq_tokenizer_hash(t);
        bq_tokenizer_free(t);
        t = NULL;
        p = make_vocab("lf", "\n", 1, NULL);
        EXPECT(bq_tokenizer_load(&t, p, NULL) == 0, "lf load");
        EXPECT(t && bq_tokenizer_hash(t) == h1, "hash differs between CRLF and LF copies");
        BqTokenizerOptions o = {0, -1, -1};
        BqTokenizer *t2 = NULL;
        EXPECT(bq_tokenizer_load(&t2, p, &o) == 0, "cased load");
        EXPECT(t2 && t && bq_tokenizer_hash(t2) != bq_tokenizer_hash(t), "hash ignores settings");
        bq_tokenizer_free(t2);
        bq_tokenizer_free(t);
        t = NULL;
    }
    /* a missing special token is an error naming the file */
    const char *miss[4] = {"[UNK]", "[CLS]", "[SEP]", "[PAD]"};
    for (int k = 0; k < 4; k++) {
        char name[32];
        snprintf(name, sizeof name, "miss%d", k);
        p = make_vocab(name, "\n", 1, miss[k]);
        int st = bq_tokenizer_load(&t, p, NULL);
        EXPECT(st == BQ_EFORMAT && t == NULL, "missing %s: status %d", miss[k], st);
        EXPECT(strstr(bq_errmsg(), p) && strstr(bq_errmsg(), miss[k]), "message '%s'", bq_errmsg());
    }
    char nofile[400];
    snprintf(nofile, sizeof nofile, "%s/nope/vocab.txt", dir);
    EXPECT(bq_tokenizer_load(&t, nofile, NULL) == BQ_EIO && strstr(bq_errmsg(), nofile), "missing file");
    /* a broken tokenizer_config.json is an error naming it */
    p = make_vocab("badjson", "\n", 1, NULL);
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/badjson/tokenizer_config.json", dir);
    write_file(cfg, "{\"do_lower_case\": tru");
    EXPECT(bq_tokenizer_load(&t, p, NULL) == BQ_EFORMAT && strstr(bq_errmsg(), "tokenizer_config.json"),
           "bad json: '%s'", bq_errmsg());
}

static void test_config(void) {
    BqTokenizer *t = NULL;
    const char *p = make_vocab("cased", "\n", 1, NULL);
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s/cased/tokenizer_config.json", dir);
    write_file(cfg, "{\"do_lower_case\": false, \"model_max_length\": 1000000000000000019884624838656}");
    EXPECT(bq_tokenizer_load(&t, p, NULL) == 0, "cased config: %s", bq_errmsg());
    if (!t) return;
    TOK(t, "Hello World CAFE café", "Hello World CAFE café"); /* strip_accents null follows lowercase=false */
    bq_tokenizer_free(t);
    /* tokenizer.json's BertNormalizer wins over tokenizer_config.json */
    char tj[512];
    snprintf(tj, sizeof tj, "%s/cased/tokenizer.json", dir);
    write_file(tj, "{\"normalizer\": {\"type\": \"BertNormalizer\", \"lowercase\": true, \"strip_accents\": false,"
                   " \"handle_chinese_chars\": false, \"clean_text\": true}, \"added_tokens\": []}");
    t = NULL;
    EXPECT(bq_tokenizer_load(&t, p, NULL) == 0, "tokenizer.json: %s", bq_errmsg());
    if (!t) return;
    TOK(t, "CAFÉ", "café");             /* lowercase without accent stripping */
    TOK(t, "中国", "[UNK]");            /* no CJK splitting: one word, no match */
    TOK(t, "a [SEP] b", "a [UNK] [UNK] [UNK] b"); /* added_tokens empty: '[' 'sep' ']' */
    TOK(t, "İ", "i ##̇");              /* Rust to_lowercase: U+0130 -> i + U+0307 */
    bq_tokenizer_free(t);
}

static void test_basic(const BqTokenizer *t) {
    TOK(t, "Hello, World!", "hello , world !");
    TOK(t, "  hello\t\n\rworld  ", "hello world");
    TOK(t, "unaffable", "un ##aff ##able");
    TOK(t, "UNAFFABLE.", "un ##aff ##able .");
    TOK(t, "café CAFÉ cafe\xcc\x81", "cafe cafe cafe"); /* NFD + drop Mn (lowercase implies strip) */
    TOK(t, "中国a", "中 国 a");
    TOK(t, "don't", "don ' t");
    TOK(t, "<br />", "< br / >");
    TOK(t, "$10 €", "$ 1 ##0 €");            /* $ is ASCII punct (Sc); € is Sc: not punctuation */
    TOK(t, "xyz", "[UNK]");                    /* no piece for 'y': the whole word */
    TOK(t, "aaa bbb", "a ##a ##a b ##b ##b");
    TOK(t, "abab", "ab ##ab");
    TOK(t, "STRASSE Straße", "strasse straße");
    TOK(t, "ı Σ ς", "ı σ ς");                 /* simple lowercase per char, no final-sigma rule */
    TOK(t, "İ", "i");                          /* NFD drops U+0307, then lowercase */
    TOK(t, "", "");
    TOK(t, "!!!", "! ! !");
    /* cleaning: controls and format chars dropped, Unicode spaces split */
    TOK(t, "hel\x01lo\x7f wor\xe2\x80\x8bld", "hello world");        /* U+200B is Cf */
    TOK(t, "hello\xc2\xa0world\xe3\x80\x80!", "hello world !");        /* NBSP, ideographic space */
    TOK(t, "hello\xc2\x85world", "[UNK]"); /* U+0085 is Cc: dropped, "helloworld" has no ##world */
    TOK(t, "\xe2\x80\x9chello\xe2\x80\x9d", "[UNK] hello [UNK]");     /* curly quotes are P*: own words */
    TOK(t, "a\xe2\x80\x94" "b", "a [UNK] b");                         /* em dash Pd */
    /* NUL is dropped too */
    const char nul[] = "hel\0lo";
    const char *g = toks(t, nul, sizeof nul - 1);
    EXPECT(!strcmp(g, "hello"), "NUL: '%s'", g);
    /* invalid UTF-8: each bad byte -> U+FFFD -> dropped; valid neighbours survive */
    TOK(t, "hel\xfflo", "hello");
    TOK(t, "a\xe2\x82" "b", "ab");            /* truncated sequence does not swallow 'b' */
    TOK(t, "a\xc0\xaf" "b", "ab");            /* overlong '/' is not punctuation */
    TOK(t, "a\xed\xa0\x80" "b", "ab");        /* surrogate */
    TOK(t, "a\xf4\x90\x80\x80" "b", "ab");    /* > U+10FFFF */
    TOK(t, "\xe2\x82\xac", "€");
    TOK(t, "a\xef\xbf\xbd" "b", "ab");        /* literal U+FFFD dropped */
    TOK(t, "\xf0\x9f\x98", "");               /* truncated at end */
    /* literal special tokens (HF added vocabulary) */
    TOK(t, "hello[SEP]world [MASK]", "hello [SEP] world [MASK]");
    TOK(t, "[sep]", "[UNK] [UNK] [UNK]"); /* case-sensitive match: '[' 'sep' ']', none in the vocab */
    /* 100-char limit counts chars, not bytes */
    char w[512];
    memset(w, 'a', 100), w[100] = 0;
    {
        const char *r = toks(t, w, 100);
        int na = 0;
        for (const char *q = r; (q = strstr(q, "a")); q++) na++;
        EXPECT(strncmp(r, "a ##a", 5) == 0 && na == 100, "100 a's: '%.40s...' (%d a)", r, na);
    }
    memset(w, 'a', 101), w[101] = 0;
    TOK(t, w, "[UNK]");
    /* 100 two-byte chars (200 bytes) are still a word: "é" * 100 -> e ##e ... after stripping */
    char e2[512] = "";
    for (int i = 0; i < 100; i++) strcat(e2, "\xc3\xa9");
    {
        const char *r = toks(t, e2, strlen(e2));
        EXPECT(strncmp(r, "e ##e", 5) == 0, "100 é: '%.40s'", r);
    }
    strcat(e2, "\xc3\xa9");
    TOK(t, e2, "[UNK]");
}

static void test_encode(const BqTokenizer *t) {
    /* a = "a b a b a b a b a b" (10 pieces) */
    const char *a = "a b a b a b a b a b", *b = "hello world hello";
    int32_t ids[64], ty[64];
    int32_t A = 17, B = 19, H = 5, W = 6, CLS = 2, SEP = 3;
    int64_t n = bq_tokenizer_encode(t, a, strlen(a), NULL, 0, 0, BQ_TRUNC_HEAD, ids, ty, 64);
    EXPECT(n == 12 && ids[0] == CLS && ids[1] == A && ids[10] == B && ids[11] == SEP, "untruncated n=%lld", (long long)n);
    n = bq_tokenizer_encode(t, a, strlen(a), NULL, 0, 12, BQ_TRUNC_HEAD, ids, ty, 64);
    EXPECT(n == 12, "exact fit n=%lld", (long long)n);
    n = bq_tokenizer_encode(t, a, strlen(a), NULL, 0, 5, BQ_TRUNC_HEAD, ids, ty, 64);
    EXPECT(n == 5 && ids[1] == A && ids[2] == B && ids[3] == A && ids[4] == SEP, "head n=%lld", (long long)n);
    n = bq_tokenizer_encode(t, a, strlen(a), NULL, 0, 5, BQ_TRUNC_TAIL, ids, ty, 64);
    EXPECT(n == 5 && ids[1] == B && ids[2] == A && ids[3] == B && ids[4] == SEP, "tail");
    /* head_tail at 10: budget 8 -> first (8+2)/4 = 2, last 6 */
    n = bq_tokenizer_encode(t, a, strlen(a), NULL, 0, 10, BQ_TRUNC_HEAD_TAIL, ids, ty, 64);
    EXPECT(n == 10 && ids[1] == A && ids[2] == B && ids[3] == A && ids[8] == B && ids[9] == SEP, "head_tail");
    /* head_tail at 512 keeps the first 128 and the last 382 of 1000 pieces */
    {
        static char big[4096];
        big[0] = 0;
        for (int i = 0; i < 1000; i++) strcat(big, i < 128 ? "a " : i < 618 ? "hello " : "b ");
        static int32_t bi[512], bt[512];
        n = bq_tokenizer_encode(t, big, strlen(big), NULL, 0, 512, BQ_TRUNC_HEAD_TAIL, bi, bt, 512);
        int ok = n == 512 && bi[0] == CLS && bi[511] == SEP;
        for (int i = 1; i <= 128; i++) ok &= bi[i] == A;
        for (int i = 129; i <= 510; i++) ok &= bi[i] == B;
        EXPECT(ok, "head_tail 512: first 128 and last 382");
    }
    /* pairs: [CLS] a [SEP] b [SEP], types 0..0 1..1 */
    n = bq_tokenizer_encode(t, a, strlen(a), b, strlen(b), 0, BQ_TRUNC_HEAD, ids, ty, 64);
    EXPECT(n == 16 && ids[11] == SEP && ids[12] == H && ids[13] == W && ids[15] == SEP && ty[11] == 0 && ty[12] == 1 &&
               ty[15] == 1 && ty[0] == 0, "pair n=%lld", (long long)n);
    /* longest_first at 9: budget 6, shorter b (3) keeps min(3, 3) = 3, a keeps 3 */
    n = bq_tokenizer_encode(t, a, strlen(a), b, strlen(b), 9, BQ_TRUNC_HEAD, ids, ty, 64);
    EXPECT(n == 9 && ids[1] == A && ids[3] == A && ids[4] == SEP && ids[5] == H && ids[7] == H && ids[8] == SEP,
           "longest_first 9");
    /* at 12: budget 9, b keeps 3, a keeps 6 */
    n = bq_tokenizer_encode(t, a, strlen(a), b, strlen(b), 12, BQ_TRUNC_HEAD, ids, ty, 64);
    EXPECT(n == 12 && ids[7] == SEP && ids[8] == H && ty[7] == 0 && ty[8] == 1, "longest_first 12");
    /* at 6: budget 3, b keeps min(3, 1) = 1, a keeps 2 */
    n = bq_tokenizer_encode(t, a, strlen(a), b, strlen(b), 6, BQ_TRUNC_HEAD, ids, ty, 64);
    EXPECT(n == 6 && ids[3] == SEP && ids[4] == H && ids[5] == SEP, "longest_first 6");
    /* cap smaller than the result: writes cap entries, returns the full length */
    ids[3] = -7;
    n = bq_tokenizer_encode(t, a, strlen(a), NULL, 0, 0, BQ_TRUNC_HEAD, ids, NULL, 3);
    EXPECT(n == 12 && ids[3] == -7, "cap: n=%lld", (long long)n);
    /* empty text: [CLS] [SEP] */
    n = bq_tokenizer_encode(t, "", 0, NULL, 0, 512, BQ_TRUNC_HEAD, ids, ty, 64);
    EXPECT(n == 2 && ids[0] == CLS && ids[1] == SEP, "empty");
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/bq_test_tokenizer_%d", (int)getpid());
    BQ_CHECK(mkdir_p_ok(dir));
    test_vocab_files();
    test_config();
    BqTokenizer *t = NULL;
    const char *p = make_vocab("main", "\n", 1, NULL);
    if (bq_tokenizer_load(&t, p, NULL)) {
        fprintf(stderr, "load: %s\n", bq_errmsg());
        return 1;
    }
    test_basic(t);
    test_encode(t);
    bq_tokenizer_free(t);
    bq_test_rmtree(dir);
    printf("test_tokenizer: %d fails (max error %d)\n", fails, fails ? 1 : 0);
    return fails ? 1 : 0;
}
