/* Flag parsing for the subcommands (see args.h). */
#include "src/cli/args.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/gemm.h"
#include "src/dist.h"

/* --precision's names; the first two are in BqPrecision's order, so an index below 2 is a BqPrecision. */
static const char *const PRECISION_NAMES[] = {"fp32", "bf16", "auto", NULL};
enum { PRECISION_AUTO = 2 };

#define PRECISION_HELP "arithmetic of the GEMMs: fp32, bf16 (mixed precision as PyTorch's bf16 autocast; " \
    "emulated and slower than fp32 on a CPU without bf16 units) or auto (bf16 where the CPU has AVX512-BF16 " \
    "or AMX-BF16, else fp32; bertqat --version says which); not given: $BQ_PRECISION, else auto"

/* 1 for the kinds that name an output to lock (args.h). */
static int is_output(BqArgKind k) { return k == BQ_ARG_OUT || k == BQ_ARG_OUT_MKDIR; }

static int nrows(const BqArgs *a) { return a->nspecs + a->ncommon; }

/* Row i of the command's table followed by the common rows. */
static const BqArgSpec *row(const BqArgs *a, int i) {
    return i < a->nspecs ? &a->specs[i] : &a->common_specs[i - a->nspecs];
}

/* Appends the rows of the common flags a->common asks for, with their defaults (threads 0, precision
 * auto). Called before every use of the rows, so that a BqArgs may be parsed more than once. */
static void add_common(BqArgs *a) {
    a->ncommon = 0;
    a->threads = 0;
    a->precision = PRECISION_AUTO;
    if (a->common & BQ_ARGS_THREADS)
        a->common_specs[a->ncommon++] = (BqArgSpec){
            .name = "threads", .kind = BQ_ARG_INT, .dst = &a->threads, .min = 0, .max = 4096,
            .help = a->threads_help ? a->threads_help : "threads (0: all cores)"};
    if (a->common & BQ_ARGS_PRECISION)
        a->common_specs[a->ncommon++] = (BqArgSpec){.name = "precision", .kind = BQ_ARG_ENUM, .dst = &a->precision,
                                                    .choices = PRECISION_NAMES, .help = PRECISION_HELP};
    BQ_CHECK(nrows(a) <= BQ_ARGS_MAX);
}

static int find_row(const BqArgs *a, const char *name, size_t len) {
    for (int i = 0; i < nrows(a); i++)
        if (strlen(row(a, i)->name) == len && strncmp(row(a, i)->name, name, len) == 0) return i;
    return -1;
}

/* The value of choice k of an enum row. */
static int choice_value(const BqArgSpec *s, int k) { return s->values ? s->values[k] : k; }

/* 1 when choice k is an alias: an earlier choice has its value. */
static int is_alias(const BqArgSpec *s, int k) {
    for (int j = 0; j < k; j++)
        if (choice_value(s, j) == choice_value(s, k)) return 1;
    return 0;
}

/* "a, b or c" (sep ", " and last " or ") or "a|b|c" (both "|"): the choices that are not aliases. */
static void choices_list(const BqArgSpec *s, const char *sep, const char *last, char *buf, size_t n) {
    int count = 0;
    for (int k = 0; s->choices[k]; k++) count += !is_alias(s, k);
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0, i = 0; s->choices[k]; k++) {
        if (is_alias(s, k)) continue;
        const char *before = i == 0 ? "" : i == count - 1 ? last : sep;
        int w = snprintf(buf + len, n - len, "%s%s", before, s->choices[k]);
        if (w < 0 || (size_t)w >= n - len) return;
        len += (size_t)w;
        i++;
    }
}

/* The error names the flag and the choices, without the command (as bq_scheme_parse and the other
 * parsers of names have always worded it). */
static int set_enum(const BqArgSpec *s, const char *v) {
    for (int k = 0; s->choices[k]; k++)
        if (!strcmp(v, s->choices[k])) {
            *(int *)s->dst = choice_value(s, k);
            return BQ_OK;
        }
    char list[512];
    choices_list(s, ", ", " or ", list, sizeof list);
    return bq_err(BQ_EINVAL, "--%s: '%s' is not %s", s->name, v, list);
}

/* An integer flag's value into *x, range-checked against s. */
static int parse_integer(const BqArgs *a, const BqArgSpec *s, const char *v, long long *x) {
    char *end = NULL;
    errno = 0;
    *x = strtoll(v, &end, 10);
    if (!*v || *end || errno)
        return bq_err(BQ_EINVAL, "%s: --%s expects an integer, got '%s'", a->cmd, s->name, v);
    if (s->min < s->max && ((double)*x < s->min || (double)*x > s->max))
        return bq_err(BQ_EINVAL, "%s: --%s must be in [%.0f, %.0f], got %lld", a->cmd, s->name, s->min, s->max, *x);
    return BQ_OK;
}

static int set_value(const BqArgs *a, const BqArgSpec *s, const char *v) {
    long long x = 0;
    int st;
    switch (s->kind) {
    case BQ_ARG_STR:
    case BQ_ARG_OUT:
    case BQ_ARG_OUT_MKDIR:
        if (!*v) return bq_err(BQ_EINVAL, "%s: --%s needs a non-empty value", a->cmd, s->name);
        *(const char **)s->dst = v;
        return BQ_OK;
    case BQ_ARG_INT:
        if ((st = parse_integer(a, s, v, &x))) return st;
        if (x < -2147483647LL || x > 2147483647LL)
            return bq_err(BQ_EINVAL, "%s: --%s is out of range: %s", a->cmd, s->name, v);
        *(int *)s->dst = (int)x;
        return BQ_OK;
    case BQ_ARG_I64:
        if ((st = parse_integer(a, s, v, &x))) return st;
        *(int64_t *)s->dst = (int64_t)x;
        return BQ_OK;
    case BQ_ARG_U64:
        if ((st = parse_integer(a, s, v, &x))) return st;
        if (x < 0) return bq_err(BQ_EINVAL, "%s: --%s must be >= 0, got %lld", a->cmd, s->name, x);
        *(uint64_t *)s->dst = (uint64_t)x;
        return BQ_OK;
    case BQ_ARG_FLOAT:
    case BQ_ARG_F32: {
        char *end = NULL;
        errno = 0;
        double d = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(d) || (s->kind == BQ_ARG_F32 && !isfinite((float)d)))
            return bq_err(BQ_EINVAL, "%s: --%s expects a finite number, got '%s'", a->cmd, s->name, v);
        if (s->min < s->max && (d < s->min || d > s->max))
            return bq_err(BQ_EINVAL, "%s: --%s must be in [%g, %g], got %g", a->cmd, s->name, s->min, s->max, d);
        if (s->kind == BQ_ARG_F32) *(float *)s->dst = (float)d;
        else *(double *)s->dst = d;
        return BQ_OK;
    }
    case BQ_ARG_CHARS:
        if (!*v) return bq_err(BQ_EINVAL, "%s: --%s needs a non-empty value", a->cmd, s->name);
        if (strlen(v) >= (size_t)s->max)
            return bq_err(BQ_EINVAL, "%s: --%s is longer than %.0f characters", a->cmd, s->name, s->max - 1);
        memcpy(s->dst, v, strlen(v) + 1);
        return BQ_OK;
    case BQ_ARG_FLAG:
    case BQ_ARG_OFF:
        *(int *)s->dst = s->kind == BQ_ARG_FLAG;
        return BQ_OK;
    case BQ_ARG_ENUM:
        return set_enum(s, v);
    }
    return BQ_EINVAL;
}

/* The value --precision resolves: the flag's when it was on the line, else $BQ_PRECISION when set and not
 * empty (a->prec_env set), else the default, auto. */
static const char *precision_value(BqArgs *a) {
    for (int k = 0; k < nrows(a); k++)
        if (row(a, k)->dst == &a->precision && a->given[k]) return PRECISION_NAMES[a->precision];
    const char *env = getenv("BQ_PRECISION");
    a->prec_env = env && *env;
    return a->prec_env ? env : PRECISION_NAMES[a->precision];
}

/* Applies the common flags once the line has parsed: the thread count of the process, and the
 * precision resolved on this CPU (its header waits for bq_args_header). A $BQ_PRECISION that is no
 * precision is BQ_EINVAL naming the variable. */
static int apply_common(BqArgs *a) {
    if (a->common & BQ_ARGS_THREADS) bq_runtime_set_threads(a->threads);
    if (!(a->common & BQ_ARGS_PRECISION)) return BQ_OK;
    const char *value = precision_value(a);
    int st = bq_precision_resolve(value, bq_cpu_features(), &a->prec, &a->prec_why);
    if (st && a->prec_env) return bq_err(st, "BQ_PRECISION: '%s' is not fp32, bf16 or auto", value);
    return st;
}

void bq_args_header(const BqArgs *a) {
    if (!(a->common & BQ_ARGS_PRECISION)) return;
    /* a value from $BQ_PRECISION names the variable where bq_precision_resolve's reason says "flag" */
    if (a->prec_env && !strncmp(a->prec_why, "flag", 4))
        fprintf(stderr, "[%s] precision: %s (BQ_PRECISION%s)\n", a->cmd, bq_precision_name(a->prec), a->prec_why + 4);
    else
        fprintf(stderr, "[%s] precision: %s (%s)\n", a->cmd, bq_precision_name(a->prec), a->prec_why);
    if (a->prec == BQ_PRECISION_BF16) fprintf(stderr, "[%s] %s\n", a->cmd, bq_gemm_bf16_describe());
}

/* Checks the required flags and takes the locks of the outputs given (args.h). */
static int finish(BqArgs *a) {
    for (int k = 0; k < nrows(a); k++)
        if (row(a, k)->required && !a->given[k])
            return bq_err(BQ_EINVAL, "%s: --%s is required (see --help)", a->cmd, row(a, k)->name);
    for (int k = 0; k < nrows(a) && bq_dist_rank() == 0; k++) {
        const BqArgSpec *s = row(a, k);
        if (!is_output(s->kind) || !a->given[k]) continue;
        char flag[72];
        snprintf(flag, sizeof flag, "--%s", s->name);
        int st = bq_out_lock(*(const char **)s->dst, flag, a->cmd, s->kind == BQ_ARG_OUT_MKDIR);
        if (st) return st;
    }
    return apply_common(a);
}

/* Positional arguments are gathered in place at argv[1..]: the k-th positional is written to
 * argv[1 + k] only after argv[1 + k] has been read (1 + k <= i), so no storage is allocated and the
 * caller has nothing to free. */
int bq_args_parse(BqArgs *a, int argc, char **argv) {
    a->npositional = 0;
    a->positional = argv + 1;
    a->help = 0;
    memset(a->given, 0, sizeof a->given);
    BQ_CHECK(a->nspecs <= BQ_ARGS_MAX);
    add_common(a);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            a->help = 1;
            bq_args_usage(a, stdout);
            return BQ_OK;
        }
        if (!strcmp(arg, "--")) { /* everything after is positional */
            for (i++; i < argc; i++) {
                if (a->npositional >= a->max_positional)
                    return bq_err(BQ_EINVAL, "%s: unexpected argument '%s'", a->cmd, argv[i]);
                argv[1 + a->npositional++] = argv[i];
            }
            break;
        }
        if (strncmp(arg, "--", 2) != 0 || !arg[2]) {
            if (a->npositional >= a->max_positional) {
                if (arg[0] == '-') return bq_err(BQ_EINVAL, "%s: unknown flag '%s' (see --help)", a->cmd, arg);
                return bq_err(BQ_EINVAL, "%s: unexpected argument '%s' (see --help)", a->cmd, arg);
            }
            argv[1 + a->npositional++] = (char *)arg;
            continue;
        }
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int k = find_row(a, name, len);
        if (k < 0) return bq_err(BQ_EINVAL, "%s: unknown flag '--%.*s' (see --help)", a->cmd, (int)len, name);
        const BqArgSpec *s = row(a, k);
        a->given[k] = 1;
        const char *value;
        if (s->kind == BQ_ARG_FLAG || s->kind == BQ_ARG_OFF) {
            if (eq) return bq_err(BQ_EINVAL, "%s: --%s takes no value", a->cmd, s->name);
            value = "";
        } else if (eq) {
            value = eq + 1;
        } else {
            if (i + 1 >= argc) return bq_err(BQ_EINVAL, "%s: --%s needs a value", a->cmd, s->name);
            value = argv[++i];
        }
        int st = set_value(a, s, value);
        if (st) return st;
    }
    return finish(a);
}

int bq_args_given(const BqArgs *a, const char *name) {
    int k = find_row(a, name, strlen(name));
    BQ_CHECK(k >= 0);
    return a->given[k];
}

const BqArgSpec *bq_args_find(const BqArgs *a, const char *name) {
    int k = find_row(a, name, strlen(name));
    return k < 0 ? NULL : row(a, k);
}

const char *bq_args_format(const BqArgSpec *s, char *buf, size_t n) {
    switch (s->kind) {
    case BQ_ARG_STR:
    case BQ_ARG_OUT:
    case BQ_ARG_OUT_MKDIR: {
        const char *v = *(const char *const *)s->dst;
        if (!v) return NULL;
        snprintf(buf, n, "%s", v);
        return buf;
    }
    case BQ_ARG_INT: snprintf(buf, n, "%d", *(const int *)s->dst); return buf;
    case BQ_ARG_I64: snprintf(buf, n, "%" PRId64, *(const int64_t *)s->dst); return buf;
    case BQ_ARG_U64: snprintf(buf, n, "%" PRIu64, *(const uint64_t *)s->dst); return buf;
    case BQ_ARG_FLOAT: { /* the shortest "%g" form that reads back to the same double */
        double x = *(const double *)s->dst;
        for (int prec = 6; prec <= 17; prec++) {
            snprintf(buf, n, "%.*g", prec, x);
            if (strtod(buf, NULL) == x) break;
        }
        return buf;
    }
    case BQ_ARG_F32: { /* likewise for a float */
        float x = *(const float *)s->dst;
        for (int prec = 6; prec <= 9; prec++) {
            snprintf(buf, n, "%.*g", prec, (double)x);
            if (strtof(buf, NULL) == x) break;
        }
        return buf;
    }
    case BQ_ARG_CHARS:
        if (!*(const char *)s->dst) return NULL;
        snprintf(buf, n, "%s", (const char *)s->dst);
        return buf;
    case BQ_ARG_FLAG:
    case BQ_ARG_OFF: /* on the line when it has the value it sets */
        if (!*(const int *)s->dst != (s->kind == BQ_ARG_OFF)) return NULL;
        buf[0] = '\0';
        return buf;
    case BQ_ARG_ENUM:
        for (int c = 0; s->choices[c]; c++)
            if (choice_value(s, c) == *(const int *)s->dst) {
                snprintf(buf, n, "%s", s->choices[c]);
                return buf;
            }
        return NULL;
    }
    return NULL;
}

const char *bq_args_choice(const BqArgs *a, const char *name) {
    int k = find_row(a, name, strlen(name));
    BQ_CHECK(k >= 0 && row(a, k)->kind == BQ_ARG_ENUM);
    const BqArgSpec *s = row(a, k);
    for (int c = 0; s->choices[c]; c++)
        if (choice_value(s, c) == *(const int *)s->dst) return s->choices[c];
    return NULL;
}

/* The default of row s as " (default: ...)" into def (empty when it has none to show). */
static void default_text(const BqArgSpec *s, char *def, size_t n) {
    def[0] = '\0';
    if (s->required) snprintf(def, n, " (required)");
    else if ((s->kind == BQ_ARG_STR || is_output(s->kind)) && *(const char **)s->dst)
        snprintf(def, n, " (default: %s)", *(const char **)s->dst);
    else if (s->kind == BQ_ARG_INT) snprintf(def, n, " (default: %d)", *(int *)s->dst);
    else if (s->kind == BQ_ARG_I64) snprintf(def, n, " (default: %" PRId64 ")", *(int64_t *)s->dst);
    else if (s->kind == BQ_ARG_U64) snprintf(def, n, " (default: %" PRIu64 ")", *(uint64_t *)s->dst);
    else if (s->kind == BQ_ARG_FLOAT) snprintf(def, n, " (default: %g)", *(double *)s->dst);
    else if (s->kind == BQ_ARG_F32) snprintf(def, n, " (default: %g)", (double)*(float *)s->dst);
    else if (s->kind == BQ_ARG_CHARS && *(const char *)s->dst) snprintf(def, n, " (default: %s)", (const char *)s->dst);
    else if (s->kind == BQ_ARG_ENUM) {
        for (int c = 0; s->choices[c]; c++)
            if (choice_value(s, c) == *(const int *)s->dst) {
                snprintf(def, n, " (default: %s)", s->choices[c]);
                break;
            }
    }
}

void bq_args_usage(BqArgs *a, FILE *out) {
    add_common(a);
    fprintf(out, "usage: bertqat %s %s\n", a->cmd, a->usage ? a->usage : "[options]");
    if (a->summary) fprintf(out, "\n%s\n", a->summary);
    fprintf(out, "\noptions:\n");
    for (int i = 0; i < nrows(a); i++) {
        const BqArgSpec *s = row(a, i);
        char left[600], meta[520] = "", def[160];
        if (s->kind == BQ_ARG_ENUM) {
            meta[0] = ' ';
            choices_list(s, "|", "|", meta + 1, sizeof meta - 1);
        } else {
            snprintf(meta, sizeof meta, "%s", s->kind == BQ_ARG_STR || s->kind == BQ_ARG_CHARS ? " STR"
                     : is_output(s->kind) ? " PATH" : s->kind == BQ_ARG_FLOAT || s->kind == BQ_ARG_F32 ? " X"
                     : s->kind == BQ_ARG_FLAG || s->kind == BQ_ARG_OFF ? "" : " N");
        }
        snprintf(left, sizeof left, "--%s%s", s->name, meta);
        default_text(s, def, sizeof def);
        fprintf(out, "  %-26s %s%s\n", left, s->help ? s->help : "", def);
    }
    fprintf(out, "  %-26s %s\n", "-h, --help", "show this help");
}
