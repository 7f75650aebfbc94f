/* BERT WordPiece tokenizer, identical to Hugging Face `tokenizers` BertNormalizer + BertPreTokenizer +
 * WordPiece + TemplateProcessing ([CLS] A [SEP] B [SEP]) and its longest_first truncation.
 * Reference: HF tokenizers normalizers/bert.rs, pre_tokenizers/bert.rs, models/wordpiece,
 * utils/truncation.rs; HF transformers models/bert/tokenization_bert.py.
 *
 * Pipeline per text, in one pass with no per-token allocation:
 *   raw bytes -> split on literal added/special tokens (HF added vocabulary, normalized=false)
 *   -> lossy UTF-8 decode (an invalid byte is U+FFFD, which cleaning drops)
 *   -> clean: drop NUL, U+FFFD and "other" chars (Cc, Cf, Cn, Co, Cs) except \t\n\r; whitespace -> break
 *   -> CJK ideographs become their own word (handle_chinese_chars)
 *   -> strip_accents: NFD and drop Mn; then lowercase (Rust char::to_lowercase: simple mapping except
 *      U+0130 -> "i\u0307")
 *   -> pre-tokenize: split on whitespace, every punctuation char (P* or ASCII punctuation) is a word
 *   -> WordPiece: greedy longest-match-first, "##" continuation, > 100 chars or no match -> [UNK].
 * The ASCII bytes go through a 256-entry class table; the vocabulary is two open-addressing hash tables
 * (word-initial tokens, and "##" tokens keyed without their prefix) so continuation lookups need no copy. */
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "autograd/bq.h"

#define MAX_WORD_CHARS 100
/* a word of <= 100 chars, each at most 4 UTF-8 bytes (lowercase expansion counted in chars) */
#define WORD_BUF 512
#define MAX_ADDED 64

typedef struct Slot {
    uint64_t h;   /* 0: empty */
    int32_t id;
} Slot;

typedef struct Table {
    Slot *slots;
    uint64_t mask;
    int32_t max_len; /* longest key in bytes */
} Table;

typedef struct Added {
    char *s;
    size_t len;
    int32_t id;
} Added;

struct BqTokenizer {
    char *buf;         /* all tokens, NUL-terminated, back to back */
    int64_t *off;      /* token i starts at buf + off[i] */
    int32_t *len;
    int32_t n;
    Table init, cont;
    int32_t unk, cls, sep, pad;
    int lower, strip, cjk;
    Added added[MAX_ADDED];
    int nadded;
    uint8_t added_first[256]; /* first bytes of added tokens */
    uint64_t hash;
};

/* ---- hashing ---- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ULL;
    }
    h ^= h >> 29;
    return h | 1; /* never 0 (empty marker) */
}

static void table_init(Table *t, int32_t n) {
    uint64_t cap = 16;
    while (cap < (uint64_t)n * 2 + 16) cap <<= 1;
    t->slots = bq_calloc(cap, sizeof(Slot));
    t->mask = cap - 1;
    t->max_len = 0;
}

/* key = token bytes (without "##" for the continuation table); tok holds id's full text */
static int32_t table_find(const BqTokenizer *tk, const Table *t, const char *s, size_t n, uint64_t h, int cont) {
    for (uint64_t i = h & t->mask;; i = (i + 1) & t->mask) {
        const Slot *sl = &t->slots[i];
        if (!sl->h) return -1;
        if (sl->h == h) {
            const char *k = tk->buf + tk->off[sl->id] + (cont ? 2 : 0);
            size_t kl = (size_t)tk->len[sl->id] - (cont ? 2 : 0);
            if (kl == n && !memcmp(k, s, n)) return sl->id;
        }
    }
}

static void table_put(BqTokenizer *tk, Table *t, const char *s, size_t n, int32_t id, int cont) {
    uint64_t h = hash_bytes(s, n);
    int32_t old = table_find(tk, t, s, n, h, cont);
    uint64_t i = h & t->mask;
    /* a duplicate line: the last id wins, as in HF's vocab.txt reader */
    while (t->slots[i].h && !(old >= 0 && t->slots[i].id == old)) i = (i + 1) & t->mask;
    t->slots[i].h = h;
    t->slots[i].id = id;
    if ((int32_t)n > t->max_len) t->max_len = (int32_t)n;
}

static int32_t vocab_lookup(const BqTokenizer *tk, const char *s, size_t n) {
    if (n >= 2 && s[0] == '#' && s[1] == '#') {
        int32_t id = table_find(tk, &tk->cont, s + 2, n - 2, hash_bytes(s + 2, n - 2), 1);
        if (id >= 0) return id;
    }
    return table_find(tk, &tk->init, s, n, hash_bytes(s, n), 0);
}

/* ---- character classes ---- */

enum { C_DROP = 0, C_WORD = 1, C_SPACE = 2, C_PUNCT = 3 };
static uint8_t ascii_class[128];
static char ascii_lower[128];
static int tables_ready;

static void init_ascii(void) {
    if (tables_ready) return;
    for (int c = 0; c < 128; c++) {
        uint8_t k = C_WORD;
        if (c == 0 || (c < 32 && c != '\t' && c != '\n' && c != '\r' && c != 11 && c != 12) || c == 127) k = C_DROP;
        /* \v and \f are Cc: cleaning drops them before whitespace mapping */
        if (c == 11 || c == 12) k = C_DROP;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') k = C_SPACE;
        if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126))
            k = C_PUNCT;
        ascii_class[c] = k;
        ascii_lower[c] = (char)((c >= 'A' && c <= 'Z') ? c + 32 : c);
    }
    tables_ready = 1; /* idempotent writes of identical values: benign if two threads race here */
}

/* Rust char::is_whitespace (Unicode White_Space) */
static int is_ws(int32_t c) {
    return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
           c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static int is_other(int32_t c) {
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CN ||
           k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CS;
}

static int is_punct(int32_t c) {
    if (c < 128) return ascii_class[c] == C_PUNCT;
    utf8proc_category_t k = utf8proc_category(c);
    return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}

/* HF tokenizers is_chinese_char */
static int is_cjk(int32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* Decodes one char at s (n > 0 bytes left); returns its byte length; *cp = -1 for an invalid byte
 * (consumed alone, as U+FFFD would be and then dropped). Rejects overlongs, surrogates, > U+10FFFF. */
static int utf8_next(const uint8_t *s, size_t n, int32_t *cp) {
    uint8_t b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int need;
    int32_t c, min;
    if (b >= 0xC2 && b <= 0xDF) need = 1, c = b & 0x1F, min = 0x80;
    else if (b >= 0xE0 && b <= 0xEF) need = 2, c = b & 0x0F, min = 0x800;
    else if (b >= 0xF0 && b <= 0xF4) need = 3, c = b & 0x07, min = 0x10000;
    else {
        *cp = -1;
        return 1;
    }
    if ((size_t)need >= n) {
        *cp = -1;
        return 1;
    }
    for (int i = 1; i <= need; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = -1;
            return 1;
        }
        c = (c << 6) | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
        *cp = -1;
        return 1;
    }
    *cp = c;
    return need + 1;
}

static int utf8_put(char *o, int32_t c) {
    utf8proc_ssize_t n = utf8proc_encode_char(c, (utf8proc_uint8_t *)o);
    return (int)n;
}

/* ---- output buffer ---- */

typedef struct Out {
    int32_t **ids;
    int64_t *n, *cap;
} Out;

static inline void out_push(Out *o, int32_t id) {
    if (*o->n >= *o->cap) {
        int64_t nc = *o->cap < 64 ? 64 : *o->cap * 2;
        *o->ids = bq_realloc(*o->ids, (size_t)nc * sizeof(int32_t));
        *o->cap = nc;
    }
    (*o->ids)[(*o->n)++] = id;
}

/* ---- WordPiece ---- */

typedef struct Word {
    char b[WORD_BUF];
    int len;    /* bytes */
    int chars;  /* chars (may exceed MAX_WORD_CHARS; bytes stop being stored then) */
} Word;

static void wordpiece(const BqTokenizer *tk, Word *w, Out *o) {
    if (!w->chars) return;
    if (w->chars > MAX_WORD_CHARS) {
        out_push(o, tk->unk);
        w->len = w->chars = 0;
        return;
    }
    int64_t mark = *o->n;
    int start = 0, n = w->len;
    const char *s = w->b;
    while (start < n) {
        int cont = start > 0;
        const Table *t = cont ? &tk->cont : &tk->init;
        int end = n;
        if (end - start > t->max_len) {
            end = start + t->max_len;
            while (end > start && (s[end] & 0xC0) == 0x80) end--; /* back to a char boundary */
        }
        int32_t id = -1;
        while (end > start) {
            id = table_find(tk, t, s + start, (size_t)(end - start), hash_bytes(s + start, (size_t)(end - start)), cont);
            if (id >= 0) break;
            end--;
            while (end > start && (s[end] & 0xC0) == 0x80) end--;
        }
        if (id < 0) {
            *o->n = mark; /* no match anywhere: the whole word is [UNK] */
            out_push(o, tk->unk);
            w->len = w->chars = 0;
            return;
        }
        out_push(o, id);
        start = end;
    }
    w->len = w->chars = 0;
}

static inline void word_add(Word *w, const char *b, int n) {
    if (w->chars < MAX_WORD_CHARS) { /* past 100 chars only the count matters: the word is [UNK] */
        memcpy(w->b + w->len, b, (size_t)n);
        w->len += n;
    }
    w->chars++;
}

/* appends normalized char c (after cleaning/CJK) to the current word, or emits it as punctuation */
static void emit_norm_char(const BqTokenizer *tk, Word *w, int32_t c, Out *o) {
    char tmp[4];
    if (is_punct(c)) {
        wordpiece(tk, w, o);
        int n = utf8_put(tmp, c);
        word_add(w, tmp, n);
        wordpiece(tk, w, o);
        return;
    }
    if (is_ws(c)) {
        wordpiece(tk, w, o);
        return;
    }
    word_add(w, tmp, utf8_put(tmp, c));
}

static void lower_emit(const BqTokenizer *tk, Word *w, int32_t c, Out *o) {
    if (tk->lower) {
        if (c == 0x130) { /* Rust to_lowercase: U+0130 -> U+0069 U+0307 */
            emit_norm_char(tk, w, 0x69, o);
            emit_norm_char(tk, w, 0x307, o);
            return;
        }
        c = utf8proc_tolower(c);
    }
    emit_norm_char(tk, w, c, o);
}

static void tokenize_segment(const BqTokenizer *tk, const uint8_t *s, size_t n, Word *w, Out *o) {
    size_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        if (b < 0x80) { /* ASCII fast path */
            switch (ascii_class[b]) {
            case C_WORD:
                if (w->chars < MAX_WORD_CHARS) w->b[w->len++] = tk->lower ? ascii_lower[b] : (char)b;
                w->chars++;
                break;
            case C_SPACE: wordpiece(tk, w, o); break;
            case C_PUNCT:
                wordpiece(tk, w, o);
                w->b[0] = (char)b, w->len = 1, w->chars = 1;
                wordpiece(tk, w, o);
                break;
            default: break;
            }
            i++;
            continue;
        }
        int32_t c;
        i += (size_t)utf8_next(s + i, n - i, &c);
        if (c < 0 || c == 0xFFFD) continue;
        if (is_ws(c)) { /* checked before is_other: \t\n\r handled above; U+0085 is Cc and dropped */
            if (c == 0x85) continue;
            wordpiece(tk, w, o);
            continue;
        }
        if (is_other(c)) continue;
        if (tk->cjk && is_cjk(c)) {
            wordpiece(tk, w, o);
            if (tk->strip) { /* CJK compatibility ideographs decompose to one unified ideograph */
                utf8proc_int32_t d[4];
                utf8proc_ssize_t nd = utf8proc_decompose_char(c, d, 4, UTF8PROC_DECOMPOSE, NULL);
                if (nd == 1) c = d[0];
            }
            lower_emit(tk, w, c, o);
            wordpiece(tk, w, o);
            continue;
        }
        if (tk->strip) {
            utf8proc_int32_t d[32];
            utf8proc_ssize_t nd = utf8proc_decompose_char(c, d, 32, UTF8PROC_DECOMPOSE, NULL);
            if (nd < 0 || nd > 32) {
                d[0] = c;
                nd = 1;
            }
            for (utf8proc_ssize_t k = 0; k < nd; k++) {
                if (utf8proc_category(d[k]) == UTF8PROC_CATEGORY_MN) continue;
                lower_emit(tk, w, d[k], o);
            }
        } else {
            lower_emit(tk, w, c, o);
        }
    }
}

void bq_tokenizer_tokenize(const BqTokenizer *t, const char *text, size_t len, int32_t **ids, int64_t *n,
                           int64_t *cap) {
    Out o = {ids, n, cap};
    Word w;
    w.len = w.chars = 0;
    const uint8_t *s = (const uint8_t *)text;
    size_t seg = 0;
    if (t->nadded) {
        for (size_t i = 0; i < len; i++) {
            if (!t->added_first[s[i]]) continue;
            int best = -1;
            size_t bl = 0;
            for (int a = 0; a < t->nadded; a++) {
                const Added *ad = &t->added[a];
                if (ad->len > bl && ad->len <= len - i && !memcmp(s + i, ad->s, ad->len)) best = a, bl = ad->len;
            }
            if (best < 0) continue;
            tokenize_segment(t, s + seg, i - seg, &w, &o);
            wordpiece(t, &w, &o);
            out_push(&o, t->added[best].id);
            i += bl - 1;
            seg = i + 1;
        }
    }
    tokenize_segment(t, s + seg, len - seg, &w, &o);
    wordpiece(t, &w, &o);
}

/* ---- encode with truncation ---- */

/* head_tail: of a budget of k content tokens keep the first (k + 2) / 4 and the last k - (k + 2) / 4;
 * at max_len 512 for one sequence (k = 510) that is the first 128 and the last 382. */
static void pick(int64_t n, int64_t keep, BqTruncation tr, int64_t *h, int64_t *tl) {
    if (keep >= n) {
        *h = n, *tl = 0;
        return;
    }
    if (tr == BQ_TRUNC_HEAD) *h = keep, *tl = 0;
    else if (tr == BQ_TRUNC_TAIL) *h = 0, *tl = keep;
    else *h = (keep + 2) / 4, *tl = keep - (keep + 2) / 4;
}

int64_t bq_tokenizer_encode(const BqTokenizer *t, const char *a, size_t alen, const char *b, size_t blen,
                            int64_t max_len, BqTruncation trunc, int32_t *out_ids, int32_t *out_types,
                            int64_t cap) {
    int32_t *wa = NULL, *wb = NULL;
    int64_t na = 0, ca = 0, nb = 0, cb = 0;
    bq_tokenizer_tokenize(t, a, alen, &wa, &na, &ca);
    if (b) bq_tokenizer_tokenize(t, b, blen, &wb, &nb, &cb);
    int64_t special = b ? 3 : 2;
    int64_t ka = na, kb = nb;
    if (max_len > 0 && na + nb + special > max_len) {
        int64_t m = max_len - special;
        if (m < 0) m = 0;
        if (!b) ka = m;
        else { /* HF longest_first: the shorter keeps min(len, m/2), the longer the rest; tie: a is "shorter" */
            if (na > nb) {
                kb = nb < m / 2 ? nb : m / 2;
                ka = m - kb;
            } else {
                ka = na < m / 2 ? na : m / 2;
                kb = m - ka;
            }
        }
    }
    int64_t ha, ta, hb, tb;
    pick(na, ka, trunc, &ha, &ta);
    pick(nb, kb, trunc, &hb, &tb);
    int64_t len = 0;
#define PUT(id, ty)                                 \
    do {                                            \
        if (len < cap) {                            \
            out_ids[len] = (id);                    \
            if (out_types) out_types[len] = (ty);   \
        }                                           \
        len++;                                      \
    } while (0)
    PUT(t->cls, 0);
    for (int64_t i = 0; i < ha; i++) PUT(wa[i], 0);
    for (int64_t i = na - ta; i < na; i++) PUT(wa[i], 0);
    PUT(t->sep, 0);
    if (b) {
        for (int64_t i = 0; i < hb; i++) PUT(wb[i], 1);
        for (int64_t i = nb - tb; i < nb; i++) PUT(wb[i], 1);
        PUT(t->sep, 1);
    }
#undef PUT
    free(wa);
    free(wb);
    return len;
}

/* ---- loading ---- */

/* reads "key" as bool (1/0), -1 when absent or null */
static int json_flag(json_t *o, const char *key) {
    json_t *v = o ? json_object_get(o, key) : NULL;
    if (!v || json_is_null(v)) return -1;
    return json_is_true(v) ? 1 : 0;
}

static const char *json_token_str(json_t *o, const char *key) {
    json_t *v = o ? json_object_get(o, key) : NULL;
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v) && json_is_string(json_object_get(v, "content"))) /* AddedToken dict */
        return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static int read_file(const char *path, char **out, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return bq_err(BQ_EIO, "%s: cannot open", path);
    char *buf = NULL;
    size_t cap = 0, len = 0;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            cap = (len + 65536 + 1) * 2;
            buf = bq_realloc(buf, cap);
        }
        size_t r = fread(buf + len, 1, cap - len - 1, f);
        len += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return bq_err(BQ_EIO, "%s: read error", path);
    }
    buf[len] = 0;
    *out = buf;
    *n = len;
    return 0;
}

static void add_added(BqTokenizer *t, const char *s, int32_t id) {
    if (!s || !*s || id < 0 || t->nadded >= MAX_ADDED) return;
    for (int i = 0; i < t->nadded; i++)
        if (!strcmp(t->added[i].s, s)) return;
    Added *a = &t->added[t->nadded++];
    a->len = strlen(s);
    a->s = bq_malloc(a->len + 1);
    memcpy(a->s, s, a->len + 1);
    a->id = id;
    t->added_first[(uint8_t)s[0]] = 1;
}

int bq_tokenizer_load(BqTokenizer **out, const char *vocab_path, const BqTokenizerOptions *opts) {
    int st = 0;
    char *raw = NULL, *dir = NULL, *jpath = NULL;
    size_t rawn = 0;
    json_t *cfg = NULL, *tj = NULL;
    BqTokenizer *t = NULL;
    *out = NULL;
    init_ascii();
    if ((st = read_file(vocab_path, &raw, &rawn))) goto cleanup;
    t = bq_calloc(1, sizeof *t);
    /* lines: id = line index; CRLF and a missing final newline are fine */
    int32_t nl = 0;
    for (size_t i = 0; i < rawn; i++) nl += raw[i] == '\n';
    if (rawn && raw[rawn - 1] != '\n') nl++;
    if (nl == 0) {
        st = bq_err(BQ_EFORMAT, "%s: empty vocabulary", vocab_path);
        goto cleanup;
    }
    t->buf = bq_malloc(rawn + 1);
    t->off = bq_malloc((size_t)nl * sizeof(int64_t));
    t->len = bq_malloc((size_t)nl * sizeof(int32_t));
    {
        size_t p = 0, o = 0;
        for (int32_t i = 0; i < nl; i++) {
            size_t e = p;
            while (e < rawn && raw[e] != '\n') e++;
            size_t l = e - p;
            if (l && raw[p + l - 1] == '\r') l--;
            memcpy(t->buf + o, raw + p, l);
            t->buf[o + l] = 0;
            t->off[i] = (int64_t)o;
            t->len[i] = (int32_t)l;
            o += l + 1;
            p = e + 1;
        }
    }
    t->n = nl;
    table_init(&t->init, nl);
    table_init(&t->cont, nl);
    for (int32_t i = 0; i < nl; i++) {
        const char *s = t->buf + t->off[i];
        size_t l = (size_t)t->len[i];
        if (l > 2 && s[0] == '#' && s[1] == '#') table_put(t, &t->cont, s + 2, l - 2, i, 1);
        else table_put(t, &t->init, s, l, i, 0);
    }
    /* settings: tokenizer_config.json, then tokenizer.json's BertNormalizer (wins when present) */
    const char *slash = strrchr(vocab_path, '/');
    size_t dl = slash ? (size_t)(slash - vocab_path + 1) : 0;
    dir = bq_malloc(dl + 1);
    memcpy(dir, vocab_path, dl);
    dir[dl] = 0;
    jpath = bq_malloc(dl + 64);
    int lower = -1, strip = -1, cjk = -1;
    const char *unk_s = "[UNK]", *cls_s = "[CLS]", *sep_s = "[SEP]", *pad_s = "[PAD]", *mask_s = "[MASK]";
    json_error_t jerr;
    snprintf(jpath, dl + 64, "%stokenizer_config.json", dir);
    FILE *probe = fopen(jpath, "rb");
    if (probe) {
        fclose(probe);
        cfg = json_load_file(jpath, JSON_DECODE_INT_AS_REAL, &jerr); /* model_max_length can be 1e30 */
        if (!cfg || !json_is_object(cfg)) {
            st = bq_err(BQ_EFORMAT, "%s: invalid JSON (line %d: %s)", jpath, jerr.line, jerr.text);
            goto cleanup;
        }
        lower = json_flag(cfg, "do_lower_case");
        strip = json_flag(cfg, "strip_accents");
        cjk = json_flag(cfg, "tokenize_chinese_chars");
        if (json_token_str(cfg, "unk_token")) unk_s = json_token_str(cfg, "unk_token");
        if (json_token_str(cfg, "cls_token")) cls_s = json_token_str(cfg, "cls_token");
        if (json_token_str(cfg, "sep_token")) sep_s = json_token_str(cfg, "sep_token");
        if (json_token_str(cfg, "pad_token")) pad_s = json_token_str(cfg, "pad_token");
        if (json_token_str(cfg, "mask_token")) mask_s = json_token_str(cfg, "mask_token");
    }
    snprintf(jpath, dl + 64, "%stokenizer.json", dir);
    probe = fopen(jpath, "rb");
    json_t *added = NULL;
    if (probe) {
        fclose(probe);
        tj = json_load_file(jpath, JSON_DECODE_INT_AS_REAL, &jerr);
        if (!tj || !json_is_object(tj)) {
            st = bq_err(BQ_EFORMAT, "%s: invalid JSON (line %d: %s)", jpath, jerr.line, jerr.text);
            goto cleanup;
        }
        json_t *norm = json_object_get(tj, "normalizer");
        if (json_is_object(norm)) {
            const char *ty = json_string_value(json_object_get(norm, "type"));
            if (ty && strcmp(ty, "BertNormalizer")) {
                st = bq_err(BQ_EFORMAT, "%s: normalizer %s is not supported (BertNormalizer only)", jpath, ty);
                goto cleanup;
            }
            int v;
            if ((v = json_flag(norm, "lowercase")) >= 0) lower = v;
            strip = json_flag(norm, "strip_accents"); /* null: follow lowercase */
            if ((v = json_flag(norm, "handle_chinese_chars")) >= 0) cjk = v;
        }
        json_t *model = json_object_get(tj, "model");
        if (json_is_object(model) && json_is_string(json_object_get(model, "unk_token")))
            unk_s = json_string_value(json_object_get(model, "unk_token"));
        added = json_object_get(tj, "added_tokens");
    }
    if (opts && opts->do_lower_case >= 0) lower = opts->do_lower_case;
    if (opts && opts->strip_accents >= 0) strip = opts->strip_accents;
    if (opts && opts->tokenize_chinese_chars >= 0) cjk = opts->tokenize_chinese_chars;
    t->lower = lower < 0 ? 1 : lower;
    t->strip = strip < 0 ? t->lower : strip;
    t->cjk = cjk < 0 ? 1 : cjk;
    const char *names[4] = {unk_s, cls_s, sep_s, pad_s};
    int32_t *dst[4] = {&t->unk, &t->cls, &t->sep, &t->pad};
    for (int k = 0; k < 4; k++) {
        *dst[k] = vocab_lookup(t, names[k], strlen(names[k]));
        if (*dst[k] < 0) {
            st = bq_err(BQ_EFORMAT, "%s: special token %s is not in the vocabulary", vocab_path, names[k]);
            goto cleanup;
        }
    }
    /* literal special tokens split the raw text (HF added vocabulary, normalized=false) */
    if (json_is_array(added)) {
        size_t i;
        json_t *e;
        json_array_foreach(added, i, e) {
            const char *c = json_string_value(json_object_get(e, "content"));
            json_t *idv = json_object_get(e, "id");
            if (!c || !json_is_number(idv) || json_is_true(json_object_get(e, "normalized"))) continue;
            double idd = json_number_value(idv);
            if (idd < 0 || idd >= t->n) continue;
            add_added(t, c, (int32_t)idd);
        }
    } else {
        const char *sp[5] = {unk_s, cls_s, sep_s, pad_s, mask_s};
        for (int k = 0; k < 5; k++) add_added(t, sp[k], vocab_lookup(t, sp[k], strlen(sp[k])));
    }
    /* FNV-1a 64 over tokens and settings */
    uint64_t h = 1469598103934665603ULL;
    for (int32_t i = 0; i < t->n; i++) {
        const char *s = t->buf + t->off[i];
        for (int32_t k = 0; k <= t->len[i]; k++) h = (h ^ (uint8_t)s[k]) * 1099511628211ULL;
    }
    int settings[3] = {t->lower, t->strip, t->cjk};
    for (int k = 0; k < 3; k++) h = (h ^ (uint64_t)(settings[k] + 1)) * 1099511628211ULL;
    for (int k = 0; k < t->nadded; k++)
        for (size_t j = 0; j <= t->added[k].len; j++) h = (h ^ (uint8_t)t->added[k].s[j]) * 1099511628211ULL;
    t->hash = h;
    *out = t;
    t = NULL;
cleanup:
    if (t) bq_tokenizer_free(t);
    if (cfg) json_decref(cfg);
    if (tj) json_decref(tj);
    free(raw);
    free(dir);
    free(jpath);
    return st;
}

void bq_tokenizer_free(BqTokenizer *t) {
    if (!t) return;
    free(t->buf);
    free(t->off);
    free(t->len);
    free(t->init.slots);
    free(t->cont.slots);
    for (int i = 0; i < t->nadded; i++) free(t->added[i].s);
    free(t);
}

int32_t bq_tokenizer_vocab_size(const BqTokenizer *t) { return t->n; }
int32_t bq_tokenizer_cls_id(const BqTokenizer *t) { return t->cls; }
int32_t bq_tokenizer_sep_id(const BqTokenizer *t) { return t->sep; }
int32_t bq_tokenizer_pad_id(const BqTokenizer *t) { return t->pad; }
int32_t bq_tokenizer_unk_id(const BqTokenizer *t) { return t->unk; }
const char *bq_tokenizer_token(const BqTokenizer *t, int32_t id) {
    return (id < 0 || id >= t->n) ? NULL : t->buf + t->off[id];
}
uint64_t bq_tokenizer_hash(const BqTokenizer *t) { return t->hash; }
