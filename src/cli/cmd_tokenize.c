/* `bertqat tokenize`: prints the WordPiece ids (or tokens) of each input record, one output line per
 * record. Records are the lines of FILE or stdin (a trailing \r is part of the text and cleaned away as
 * whitespace), or NUL-separated with --null-separated (then texts may hold newlines). With --pair a
 * record is "A<TAB>B". Without --max-seq-len the plain word pieces are printed; with it (or --special)
 * the encoded form [CLS] A [SEP] (B [SEP]) truncated to that length. --offsets (plain pieces only) adds
 * " ||" and each piece's "begin:end" byte span in the record (HF offset_mapping, in bytes). Reference:
 * HF tokenizers Tokenizer.encode(text, add_special_tokens). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "src/cli/args.h"
#include "src/cli/cli.h"
#include "src/cli/cmd_common.h"
#include "tokenizer/tokenizer.h"

static void print_ids(FILE *out, const BqTokenizer *tok, const int32_t *ids, const int32_t *types, int64_t n,
                      int tokens) {
    for (int64_t i = 0; i < n; i++) {
        if (i) fputc(' ', out);
        if (tokens) fputs(bq_tokenizer_token(tok, ids[i]), out);
        else fprintf(out, "%d", ids[i]);
    }
    if (types) {
        fputs(" |", out);
        for (int64_t i = 0; i < n; i++) fprintf(out, " %d", types[i]);
    }
    fputc('\n', out);
}

/* One record as plain WordPiece pieces (no [CLS]/[SEP], no truncation): ids or tokens, or with
 * offsets_flag the ids followed by each piece's begin:end byte span after " ||". *ids, *offs and *cap
 * are the caller's growing buffers. */
static void print_plain(const BqTokenizer *tok, const char *a, size_t alen, int offsets_flag, int tokens_flag,
                        int32_t **ids, int64_t **offs, int64_t *cap) {
    int64_t n = 0;
    if (offsets_flag) {
        bq_tokenizer_tokenize_offsets(tok, a, alen, ids, offs, &n, cap);
        for (int64_t i = 0; i < n; i++) fprintf(stdout, i ? " %d" : "%d", (*ids)[i]);
        fputs(" ||", stdout);
        for (int64_t i = 0; i < n; i++) fprintf(stdout, " %lld:%lld", (long long)(*offs)[2 * i], (long long)(*offs)[2 * i + 1]);
        fputc('\n', stdout);
        return;
    }
    bq_tokenizer_tokenize(tok, a, alen, ids, &n, cap);
    print_ids(stdout, tok, *ids, NULL, n, tokens_flag);
}

int bq_cmd_tokenize(int argc, char **argv) {
    const char *vocab = NULL;
    BqTruncation trunc = BQ_TRUNC_HEAD;
    int max_len = 0, ids_flag = 0, tokens_flag = 0, pair = 0, nul = 0, special = 0, show_types = 0;
    int lower = -1, strip = -1, offsets_flag = 0;
    const BqArgSpec specs[] = {
        {"vocab", BQ_ARG_STR, &vocab, "vocab.txt (tokenizer_config.json / tokenizer.json next to it are honoured)", 1, 0, 0},
        {"max-seq-len", BQ_ARG_INT, &max_len, "print [CLS] .. [SEP] truncated to N tokens (0: plain pieces)", 0, 0, 1 << 30},
        {"truncation", BQ_ARG_ENUM, BQ_ARG_ENUM_DST(&trunc), "tokens kept of a longer text (with --max-seq-len)", 0,
         0, 0, bq_truncation_names, bq_truncation_values},
        {"special", BQ_ARG_FLAG, &special, "add [CLS]/[SEP] without truncation", 0, 0, 0},
        {"ids", BQ_ARG_FLAG, &ids_flag, "print ids (default)", 0, 0, 0},
        {"tokens", BQ_ARG_FLAG, &tokens_flag, "print token strings", 0, 0, 0},
        {"types", BQ_ARG_FLAG, &show_types, "also print token types after ' |' (encoded form)", 0, 0, 0},
        {"pair", BQ_ARG_FLAG, &pair, "each record is two texts separated by a TAB", 0, 0, 0},
        {"null-separated", BQ_ARG_FLAG, &nul, "records are separated by NUL bytes instead of newlines", 0, 0, 0},
        {"lowercase", BQ_ARG_INT, &lower, "override do_lower_case (-1: from config)", 0, -1, 1},
        {"offsets", BQ_ARG_FLAG, &offsets_flag, "also print each piece's begin:end byte span after ' ||' (plain pieces)", 0, 0, 0},
        {"strip-accents", BQ_ARG_INT, &strip, "override strip_accents (-1: follow config / lowercase)", 0, -1, 1},
    };
    BqArgs args = {.cmd = "tokenize", .usage = "--vocab PATH [--max-seq-len N] [--ids|--tokens] [--pair] [FILE]",
                   .summary = "Prints the BERT WordPiece ids or tokens of each input line.",
                   .specs = specs, .nspecs = (int)(sizeof specs / sizeof specs[0]), .max_positional = 1,
                   .positional_name = "FILE"};
    int st = bq_args_parse(&args, argc, argv);
    if (st || args.help) return st;
    if (ids_flag && tokens_flag) return bq_err(BQ_EINVAL, "tokenize: --ids and --tokens exclude each other");

    BqTokenizer *tok = NULL;
    FILE *in = stdin;
    char *rec = NULL;
    size_t rcap = 0;
    int32_t *ids = NULL, *types = NULL;
    int64_t *offs = NULL;
    int64_t cap = 0, ecap = 0;
    const char *in_name = args.npositional ? args.positional[0] : "<stdin>";
    BqTokenizerOptions opts = {.do_lower_case = lower, .strip_accents = strip, .tokenize_chinese_chars = -1};
    if ((st = bq_tokenizer_load(&tok, vocab, &opts))) goto cleanup;
    if (args.npositional && strcmp(in_name, "-")) {
        in = fopen(in_name, "rb");
        if (!in) {
            st = bq_err(BQ_EIO, "%s: cannot open", in_name);
            in = NULL;
            goto cleanup;
        }
    }
    int encoded = max_len > 0 || special || pair;
    if (offsets_flag && encoded) {
        st = bq_err(BQ_EINVAL, "tokenize: --offsets prints plain pieces (no --max-seq-len, --special or --pair)");
        goto cleanup;
    }
    ssize_t got;
    while ((got = getdelim(&rec, &rcap, nul ? '\0' : '\n', in)) >= 0) {
        size_t len = (size_t)got;
        if (len && rec[len - 1] == (nul ? '\0' : '\n')) len--;
        if (nul && len == 0 && feof(in)) break;
        const char *a = rec, *b = NULL;
        size_t alen = len, blen = 0;
        if (pair) {
            char *tab = memchr(rec, '\t', len);
            if (!tab) {
                st = bq_err(BQ_EFORMAT, "%s: --pair record without a TAB", in_name);
                goto cleanup;
            }
            alen = (size_t)(tab - rec);
            b = tab + 1;
            blen = len - alen - 1;
        }
        if (!encoded) {
            print_plain(tok, a, alen, offsets_flag, tokens_flag, &ids, &offs, &cap);
            continue;
        }
        int64_t need = bq_tokenizer_encode(tok, a, alen, b, blen, max_len, trunc, ids, types, ecap);
        if (need > ecap) {
            ecap = need;
            free(ids);
            free(types);
            ids = bq_malloc((size_t)ecap * sizeof(int32_t));
            types = bq_malloc((size_t)ecap * sizeof(int32_t));
            cap = ecap;
            need = bq_tokenizer_encode(tok, a, alen, b, blen, max_len, trunc, ids, types, ecap);
        }
        print_ids(stdout, tok, ids, show_types ? types : NULL, need, tokens_flag);
    }
    if (ferror(in)) st = bq_err(BQ_EIO, "%s: read error", in_name);
    if (fflush(stdout)) st = bq_err(BQ_EIO, "<stdout>: write error");
cleanup:
    if (in && in != stdin) fclose(in);
    free(rec);
    free(ids);
    free(types);
    free(offs);
    bq_tokenizer_free(tok);
    return st;
}
