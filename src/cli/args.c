/* Flag parsing for the subcommands (see args.h). */
#include "src/cli/args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "src/dist.h"

/* 1 for the kinds that name an output to lock (args.h). */
static int is_output(BqArgKind k) { return k == BQ_ARG_OUT || k == BQ_ARG_OUT_MKDIR; }

static const BqArgSpec *find_spec(const BqArgs *a, const char *name, size_t len) {
    for (int i = 0; i < a->nspecs; i++)
        if (strlen(a->specs[i].name) == len && strncmp(a->specs[i].name, name, len) == 0) return &a->specs[i];
    return NULL;
}

static int set_value(const BqArgs *a, const BqArgSpec *s, const char *v) {
    char *end = NULL;
    errno = 0;
    switch (s->kind) {
    case BQ_ARG_STR:
    case BQ_ARG_OUT:
    case BQ_ARG_OUT_MKDIR:
        if (!*v) return bq_err(BQ_EINVAL, "%s: --%s needs a non-empty value", a->cmd, s->name);
        *(const char **)s->dst = v;
        return BQ_OK;
    case BQ_ARG_INT: {
        long long x = strtoll(v, &end, 10);
        if (!*v || *end || errno)
            return bq_err(BQ_EINVAL, "%s: --%s expects an integer, got '%s'", a->cmd, s->name, v);
        if (s->min < s->max && ((double)x < s->min || (double)x > s->max))
            return bq_err(BQ_EINVAL, "%s: --%s must be in [%.0f, %.0f], got %lld", a->cmd, s->name, s->min, s->max, x);
        if (x < -2147483647LL || x > 2147483647LL)
            return bq_err(BQ_EINVAL, "%s: --%s is out of range: %s", a->cmd, s->name, v);
        *(int *)s->dst = (int)x;
        return BQ_OK;
    }
    case BQ_ARG_FLOAT: {
        double x = strtod(v, &end);
        if (!*v || *end || errno || !isfinite(x))
            return bq_err(BQ_EINVAL, "%s: --%s expects a finite number, got '%s'", a->cmd, s->name, v);
        if (s->min < s->max && (x < s->min || x > s->max))
            return bq_err(BQ_EINVAL, "%s: --%s must be in [%g, %g], got %g", a->cmd, s->name, s->min, s->max, x);
        *(double *)s->dst = x;
        return BQ_OK;
    }
    case BQ_ARG_FLAG:
        *(int *)s->dst = 1;
        return BQ_OK;
    }
    return BQ_EINVAL;
}

/* Positional arguments are gathered in place at argv[1..]: the k-th positional is written to
 * argv[1 + k] only after argv[1 + k] has been read (1 + k <= i), so no storage is allocated and the
 * caller has nothing to free. */
int bq_args_parse(BqArgs *a, int argc, char **argv) {
    a->npositional = 0;
    a->positional = argv + 1;
    a->help = 0;
    unsigned char *seen = a->given;
    memset(seen, 0, sizeof a->given);
    BQ_CHECK(a->nspecs <= BQ_ARGS_MAX);
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
        const BqArgSpec *s = find_spec(a, name, len);
        if (!s) return bq_err(BQ_EINVAL, "%s: unknown flag '--%.*s' (see --help)", a->cmd, (int)len, name);
        seen[s - a->specs] = 1;
        const char *value;
        if (s->kind == BQ_ARG_FLAG) {
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
    for (int k = 0; k < a->nspecs; k++)
        if (a->specs[k].required && !seen[k])
            return bq_err(BQ_EINVAL, "%s: --%s is required (see --help)", a->cmd, a->specs[k].name);
    for (int k = 0; k < a->nspecs && bq_dist_rank() == 0; k++) {
        if (!is_output(a->specs[k].kind) || !seen[k]) continue;
        char flag[72];
        snprintf(flag, sizeof flag, "--%s", a->specs[k].name);
        int st = bq_out_lock(*(const char **)a->specs[k].dst, flag, a->cmd, a->specs[k].kind == BQ_ARG_OUT_MKDIR);
        if (st) return st;
    }
    return BQ_OK;
}

int bq_args_given(const BqArgs *a, const char *name) {
    const BqArgSpec *s = find_spec(a, name, strlen(name));
    BQ_CHECK(s != NULL);
    return a->given[s - a->specs];
}

const BqArgSpec *bq_args_find(const BqArgs *a, const char *name) { return find_spec(a, name, strlen(name)); }

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
    case BQ_ARG_FLOAT: { /* the shortest "%g" form that reads back to the same double */
        double x = *(const double *)s->dst;
        for (int prec = 6; prec <= 17; prec++) {
            snprintf(buf, n, "%.*g", prec, x);
            if (strtod(buf, NULL) == x) break;
        }
        return buf;
    }
    case BQ_ARG_FLAG:
        if (!*(const int *)s->dst) return NULL;
        buf[0] = '\0';
        return buf;
    }
    return NULL;
}

void bq_args_usage(const BqArgs *a, FILE *out) {
    fprintf(out, "usage: bertqat %s %s\n", a->cmd, a->usage ? a->usage : "[options]");
    if (a->summary) fprintf(out, "\n%s\n", a->summary);
    fprintf(out, "\noptions:\n");
    for (int i = 0; i < a->nspecs; i++) {
        const BqArgSpec *s = &a->specs[i];
        char left[64], def[96] = "";
        const char *meta = s->kind == BQ_ARG_STR   ? " STR"
                           : is_output(s->kind)      ? " PATH"
                           : s->kind == BQ_ARG_INT   ? " N"
                           : s->kind == BQ_ARG_FLOAT ? " X"
                                                     : "";
        snprintf(left, sizeof left, "--%s%s", s->name, meta);
        if (s->required) snprintf(def, sizeof def, " (required)");
        else if ((s->kind == BQ_ARG_STR || is_output(s->kind)) && *(const char **)s->dst)
            snprintf(def, sizeof def, " (default: %s)", *(const char **)s->dst);
        else if (s->kind == BQ_ARG_INT) snprintf(def, sizeof def, " (default: %d)", *(int *)s->dst);
        else if (s->kind == BQ_ARG_FLOAT) snprintf(def, sizeof def, " (default: %g)", *(double *)s->dst);
        fprintf(out, "  %-26s %s%s\n", left, s->help ? s->help : "", def);
    }
    fprintf(out, "  %-26s %s\n", "-h, --help", "show this help");
}
