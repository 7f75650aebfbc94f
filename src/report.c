/* Pipeline report writer (see report.h): reads each stage's evaluation JSON, predictions TSV and training
 * JSONL log and the bench JSON, draws the curves as SVG and writes report.md atomically. */
#include "src/report.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "autograd/bq.h"

typedef struct Series {
    double *x, *y;
    int n, cap;
} Series;

static void series_push(Series *s, double x, double y) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->x = bq_realloc(s->x, sizeof(double) * (size_t)s->cap);
        s->y = bq_realloc(s->y, sizeof(double) * (size_t)s->cap);
    }
    s->x[s->n] = x, s->y[s->n] = y, s->n++;
}

static double json_num(json_t *o, const char *key, int *found) {
    json_t *v = json_object_get(o, key);
    if (v && json_is_number(v)) {
        *found = 1;
        return json_number_value(v);
    }
    return 0;
}

/* Training log lines: {"type":"train","step":..,"loss":..} and {"type":"eval","step":..,"accuracy":..}
 * (a missing "type" with an "eval_accuracy" key is read as an eval line as well). */
static void read_log(const char *path, Series *loss, Series *acc) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *o = json_loads(line, 0, NULL);
        if (!o) continue;
        int fs = 0, fl = 0, fa = 0;
        double step = json_num(o, "step", &fs);
        const char *type = json_string_value(json_object_get(o, "type"));
        double a = json_num(o, "eval_accuracy", &fa);
        if (!fa && type && !strcmp(type, "eval")) a = json_num(o, "accuracy", &fa);
        double l = json_num(o, "loss", &fl);
        if (fs && fa) series_push(acc, step, a);
        else if (fs && fl && (!type || !strcmp(type, "train"))) series_push(loss, step, l);
        json_decref(o);
    }
    free(line);
    fclose(f);
}

static double nice_step(double span) {
    double raw = span / 5, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
}

int bq_svg_chart(const char *path, const char *title, const char *xlabel, const char *ylabel, int nseries,
                 const char *const *names, const double *const *xs, const double *const *ys, const int *ns) {
    static const char *colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
    /* The legend sits in the right margin (R), outside the plot area, so it hides no data. */
    const double W = 800, H = 360, L = 64, R = 176, T = 36, B = 48;
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int s = 0; s < nseries; s++)
        for (int i = 0; i < ns[s]; i++) {
            x0 = fmin(x0, xs[s][i]), x1 = fmax(x1, xs[s][i]);
            y0 = fmin(y0, ys[s][i]), y1 = fmax(y1, ys[s][i]);
        }
    if (!isfinite(x0)) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
    if (x1 <= x0) x1 = x0 + 1;
    if (y1 <= y0) y1 = y0 + 1e-3, y0 -= 1e-3;
    double pad = 0.05 * (y1 - y0);
    y0 -= pad, y1 += pad;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return bq_err(BQ_EIO, "%s: cannot write: %s", tmp, strerror(errno));
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">%s</text>\n", (L + W - R) / 2,
            title);
#define PX(x) (L + ((x) - x0) / (x1 - x0) * (W - L - R))
#define PY(y) (H - B - ((y) - y0) / (y1 - y0) * (H - T - B))
    double sx = nice_step(x1 - x0), sy = nice_step(y1 - y0);
    /* tick labels: "+ 0.0" turns the -0 that ceil() gives just below zero into 0 */
    for (double t = ceil(x0 / sx) * sx; t <= x1 + 1e-9; t += sx)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.0f\" "
                   "text-anchor=\"middle\">%g</text>\n", PX(t), T, PX(t), H - B, PX(t), H - B + 16, t + 0.0);
    for (double t = ceil(y0 / sy) * sy; t <= y1 + 1e-12; t += sy)
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.0f\" y=\"%.1f\" "
                   "text-anchor=\"end\">%.4g</text>\n", L, PY(t), W - R, PY(t), L - 6, PY(t) + 4, t + 0.0);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#333\"/>\n", L, T,
            W - L - R, H - T - B);
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">%s</text>\n", (L + W - R) / 2, H - 10, xlabel);
    fprintf(f, "<text transform=\"translate(16 %.0f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
            (T + H - B) / 2, ylabel);
    for (int s = 0; s < nseries; s++) {
        const char *c = colors[s % 5];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" points=\"", c);
        for (int i = 0; i < ns[s]; i++) fprintf(f, "%.1f,%.1f ", PX(xs[s][i]), PY(ys[s][i]));
        fprintf(f, "\"/>\n");
        if (ns[s] <= 30)
            for (int i = 0; i < ns[s]; i++)
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", PX(xs[s][i]), PY(ys[s][i]), c);
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"3\" fill=\"%s\"/><text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
                W - R + 12, T + 12 + 16.0 * s, c, W - R + 30, T + 17 + 16.0 * s, names[s]);
    }
#undef PX
#undef PY
    fprintf(f, "</svg>\n");
    int st = bq_fclose_written(f, tmp);
    if (st) {
        remove(tmp);
        return st;
    }
    return bq_rename_durable(tmp, path);
}

typedef struct Metrics {
    int ok;
    double acc, f1, eps;
    long n;
    char engine[96]; /* "engine" of eval --json (int8, fake-quant, fp32) or "runtime" of onnx_eval.py --json */
} Metrics;

/* qa: acc holds the exact match (x100) and f1 the SQuAD F1 (x100). */
static Metrics read_metrics(const char *run_dir, const char *name, int qa) {
    Metrics m = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", run_dir, name);
    json_t *o = json_load_file(path, 0, NULL);
    if (!o) return m;
    int fa = 0, ff = 0, fe = 0, fn = 0;
    m.acc = json_num(o, qa ? "exact_match" : "accuracy", &fa);
    m.f1 = json_num(o, "f1", &ff);
    m.eps = json_num(o, "examples_per_s", &fe);
    m.n = (long)json_num(o, "examples", &fn);
    m.ok = fa;
    const char *e = json_string_value(json_object_get(o, "engine"));
    if (!e) e = json_string_value(json_object_get(o, "runtime"));
    snprintf(m.engine, sizeof m.engine, "%s", e ? e : "-");
    json_decref(o);
    return m;
}

/* One line of a predictions TSV: index, true label, predicted label and the probability of the positive
 * class (the file holds that of the predicted label). */
typedef struct Pred {
    long idx;
    int label, pred;
    double ppos;
} Pred;

static int cmp_pred(const void *a, const void *b) {
    long x = ((const Pred *)a)->idx, y = ((const Pred *)b)->idx;
    return x < y ? -1 : x > y;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Reads RUN_DIR/name (eval --predictions or scripts/onnx_eval.py --predictions) sorted by index; NULL when
 * the file is missing, empty or has a line that is not four numbers. */
static Pred *read_preds(const char *run_dir, const char *name, long *n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", run_dir, name);
    FILE *f = fopen(path, "r");
    *n = 0;
    if (!f) return NULL;
    Pred *v = NULL;
    long cap = 0;
    char line[256];
    int bad = 0;
    while (fgets(line, sizeof line, f)) {
        Pred q;
        double prob;
        if (sscanf(line, "%ld %d %d %lf", &q.idx, &q.label, &q.pred, &prob) != 4) {
            bad = 1;
            break;
        }
        q.ppos = q.pred == 1 ? prob : 1.0 - prob;
        if (*n == cap) v = bq_realloc(v, sizeof *v * (size_t)(cap = cap ? 2 * cap : 1024));
        v[(*n)++] = q;
    }
    fclose(f);
    if (bad || *n == 0) {
        free(v);
        *n = 0;
        return NULL;
    }
    qsort(v, (size_t)*n, sizeof *v, cmp_pred);
    return v;
}

/* Review-by-review agreement of two prediction files over the same reviews, computed as
 * scripts/compare_predictions.py does: the share of equal predicted labels and the median and maximum of
 * |p_a(positive) - p_b(positive)|. ok is 0 when a file is missing or they list other reviews. */
typedef struct Agreement {
    int ok;
    long n, differ;
    double median_dp, max_dp;
} Agreement;

static Agreement agreement(const char *run_dir, const char *a_name, const char *b_name) {
    Agreement g = {0};
    long na = 0, nb = 0;
    Pred *a = a_name ? read_preds(run_dir, a_name, &na) : NULL, *b = b_name ? read_preds(run_dir, b_name, &nb) : NULL;
    double *dp = NULL;
    if (!a || !b || na != nb) goto cleanup;
    dp = bq_malloc(sizeof *dp * (size_t)na);
    for (long i = 0; i < na; i++) {
        if (a[i].idx != b[i].idx || a[i].label != b[i].label) goto cleanup;
        g.differ += a[i].pred != b[i].pred;
        dp[i] = fabs(a[i].ppos - b[i].ppos);
        g.max_dp = fmax(g.max_dp, dp[i]);
    }
    qsort(dp, (size_t)na, sizeof *dp, cmp_double);
    g.median_dp = na % 2 ? dp[na / 2] : 0.5 * (dp[na / 2 - 1] + dp[na / 2]);
    g.n = na, g.ok = 1;

cleanup:
    free(a);
    free(b);
    free(dp);
    return g;
}

/* Answer-by-answer agreement of two official SQuAD predictions files ({id: answer}): ok is 0 when a
 * file is missing or they answer other questions. */
static Agreement qa_agreement(const char *run_dir, const char *a_name, const char *b_name) {
    Agreement g = {0};
    char pa[4096], pb[4096];
    if (!a_name || !b_name) return g;
    snprintf(pa, sizeof pa, "%s/%s", run_dir, a_name);
    snprintf(pb, sizeof pb, "%s/%s", run_dir, b_name);
    json_t *a = json_load_file(pa, 0, NULL), *b = json_load_file(pb, 0, NULL);
    if (json_is_object(a) && json_is_object(b) && json_object_size(a) == json_object_size(b) && json_object_size(a)) {
        const char *k;
        json_t *v;
        g.ok = 1;
        json_object_foreach(a, k, v) {
            json_t *w = json_object_get(b, k);
            if (!json_is_string(v) || !json_is_string(w)) {
                g.ok = 0;
                break;
            }
            g.differ += strcmp(json_string_value(v), json_string_value(w)) != 0;
        }
        g.n = (long)json_object_size(a);
    }
    json_decref(a);
    json_decref(b);
    return g;
}

/* "## Speed on this machine" from `bench --json` (src/cli/cmd_bench.c): the CPU, its ISA line, ms per
 * forward of every path at each batch size, the ratios and the bench's verdict; "(no result)" when the
 * file is missing or unreadable. The float path (the JSON's fp32_* keys) is named after the bench's
 * "precision" (fp32, or bf16 where --precision auto chose it), fp32 when that key is absent. */
static void speed_write(FILE *f, const char *run_dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", run_dir, name);
    json_t *j = json_load_file(path, 0, NULL), *res = j ? json_object_get(j, "results") : NULL;
    if (!j || !json_is_array(res) || json_array_size(res) == 0) {
        fprintf(f, "\n## Speed on this machine\n\n(no result: %s is missing or unreadable)\n", name);
        if (j) json_decref(j);
        return;
    }
#define JSTR(key) json_string_value(json_object_get(j, key))
    const char *cpu = JSTR("cpu"), *isa = JSTR("onednn"), *blas = JSTR("blas"), *ort = JSTR("onnxruntime");
    const char *verdict = JSTR("verdict"), *prec = JSTR("precision");
#undef JSTR
    if (!prec) prec = "fp32";
    int found = 0;
    fprintf(f, "\n## Speed on this machine\n\n");
    fprintf(f, "- CPU: %s\n- ISA: %s\n- %s\n", cpu ? cpu : "?", isa ? isa : "?", blas ? blas : "?");
    fprintf(f, "- `bertqat bench` of the QAT checkpoint%s: %.0f threads, seq %.0f, median ms per forward over "
               "the timed rounds (%.0f) after a warm-up\n\n",
            ort ? " and, in ONNX Runtime, its CPU-layout export" : "", json_num(j, "threads", &found),
            json_num(j, "seq", &found), json_num(j, "rounds", &found));
    fprintf(f, "| ms per forward |");
    size_t nb = json_array_size(res);
    for (size_t i = 0; i < nb; i++) fprintf(f, " batch %.0f |", json_num(json_array_get(res, i), "batch", &found));
    fprintf(f, "\n|---|");
    for (size_t i = 0; i < nb; i++) fprintf(f, "---|");
    fprintf(f, "\n");
    static const char *const keys[] = {"fp32_ms", "fake-quant_ms", "int8_ms", "onnxruntime_ms", "fp32_over_int8",
                                       "onnxruntime_over_int8"};
    char ort_label[96], float_ratio[64];
    snprintf(ort_label, sizeof ort_label, "ONNX Runtime %s (int8 export, CPU layout)", ort ? ort : "");
    snprintf(float_ratio, sizeof float_ratio, "%s / int8 engine", prec);
    const char *labels[] = {prec, "fake quant", "int8 engine", ort_label, float_ratio, "ONNX Runtime / int8 engine"};
    int int8 = json_is_true(json_object_get(j, "int8_available"));
    for (int k = 0; k < 6; k++) {
        if ((k == 3 || k == 5) && !ort) continue;
        if (k >= 4 && !int8) continue;
        fprintf(f, "| %s |", labels[k]);
        for (size_t i = 0; i < nb; i++) {
            int has = 0;
            double v = json_num(json_array_get(res, i), keys[k], &has);
            if (!has) fprintf(f, " %s |", k == 2 ? "refused" : "-");
            else fprintf(f, k >= 4 ? " %.2fx |" : " %.2f |", v);
        }
        fprintf(f, "\n");
    }
    fprintf(f, "\n%s\n", verdict ? verdict : "(the bench gave no verdict)");
    printf("speed: %s\n", verdict ? verdict : "(no verdict)");
    json_decref(j);
}

static void human_size(char *buf, size_t n, int64_t b) {
    if (b <= 0) snprintf(buf, n, "-");
    else if (b >= 1 << 20) snprintf(buf, n, "%.1f MiB", (double)b / (1 << 20));
    else snprintf(buf, n, "%.1f KiB", (double)b / 1024);
}

/* The report's lines on the modules kept in fp32 (the exclude list of info->fallback_ckpt's config.json without
 * the default classifier and pooler entries) and on distillation (info->distill_ckpt's distill.json), in the
 * header of report.md and on stdout. */
static void fallback_write(FILE *f, const char *run_dir, const BqReportInfo *info) {
    char path[4200];
    if (info->fallback_ckpt) {
        snprintf(path, sizeof path, "%s/%s/config.json", run_dir, info->fallback_ckpt);
        json_t *j = json_load_file(path, 0, NULL);
        const char *ex = json_string_value(json_object_get(json_object_get(json_object_get(j, "bertqat"), "quant"),
                                                           "exclude"));
        char list[2048] = "";
        size_t len = 0;
        int n = 0;
        for (const char *e = ex; e && *e;) {
            size_t k = strcspn(e, ",");
            if (k && !(k == 10 && !strncmp(e, "classifier", 10)) && !(k == 6 && !strncmp(e, "pooler", 6)) &&
                len + k + 3 < sizeof list) {
                len += (size_t)snprintf(list + len, sizeof list - len, "%s%.*s", n ? ", " : "", (int)k, e);
                n++;
            }
            e += k + (e[k] == ',');
        }
        if (ex) {
            fprintf(f, "- kept in fp32 (%s, `--keep-fp32`): %s\n", info->fallback_ckpt, n ? list : "none");
            printf("kept in fp32 (%s): %s\n", info->fallback_ckpt, n ? list : "none");
        }
        if (j) json_decref(j);
    }
    if (info->distill_ckpt) {
        snprintf(path, sizeof path, "%s/%s/distill.json", run_dir, info->distill_ckpt);
        json_t *j = json_load_file(path, 0, NULL);
        const char *t = json_string_value(json_object_get(j, "teacher"));
        int found;
        if (t) {
            const char *slash = strrchr(t, '/');
            fprintf(f, "- distillation (%s): teacher %s, alpha %g, temperature %g, hidden-state weight %g\n",
                    info->distill_ckpt, slash ? slash + 1 : t, json_num(j, "alpha", &found),
                    json_num(j, "temperature", &found), json_num(j, "hidden_weight", &found));
        } else {
            fprintf(f, "- distillation (%s): none\n", info->distill_ckpt);
        }
        if (j) json_decref(j);
    }
}

/* The training curves of the stages that have a training log (at most 5): RUN_DIR/curves-loss.svg,
 * and RUN_DIR/curves-eval.svg when a stage validated (otherwise an old one is removed). *nacc receives
 * the number of validation points. Errors: a chart cannot be written or the old one removed. */
static int curves_write(const char *run_dir, const BqReportRow *rows, int nrows, int *nacc_out) {
    /* Curves: loss per training stage in one chart, eval accuracy in another. */
    Series loss[5] = {{0}}, acc[5] = {{0}};
    const char *names[5] = {0};
    const double *lx[5] = {0}, *ly[5] = {0}, *ax[5] = {0}, *ay[5] = {0};
    int ln[5] = {0}, an[5] = {0}, ns = 0, nacc = 0;
    for (int i = 0; i < nrows && ns < 5; i++) {
        if (!rows[i].train_log) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", run_dir, rows[i].train_log);
        read_log(path, &loss[ns], &acc[ns]);
        names[ns] = rows[i].label;
        lx[ns] = loss[ns].x, ly[ns] = loss[ns].y, ln[ns] = loss[ns].n;
        ax[ns] = acc[ns].x, ay[ns] = acc[ns].y, an[ns] = acc[ns].n;
        nacc += an[ns];
        ns++;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/curves-loss.svg", run_dir);
    int st = bq_svg_chart(path, "Training loss", "step", "loss", ns, names, lx, ly, ln);
    /* The validation chart only when a stage validated (question answering trains without a validation
     * pass); a chart left by an earlier run of this directory would otherwise outlive its data. */
    snprintf(path, sizeof path, "%s/curves-eval.svg", run_dir);
    if (!st && nacc > 0) st = bq_svg_chart(path, "Validation accuracy", "step", "accuracy", ns, names, ax, ay, an);
    else if (!st && unlink(path) != 0 && errno != ENOENT)
        st = bq_err(BQ_EIO, "%s: cannot remove: %s", path, strerror(errno));
    for (int i = 0; i < ns; i++) free(loss[i].x), free(loss[i].y), free(acc[i].x), free(acc[i].y);
    *nacc_out = nacc;
    return st;
}

/* The report's first lines: date, machine, runtime, model, data, budget, recipe, fallbacks and the
 * wall time of this invocation. */
static void header_write(FILE *f, const char *run_dir, const BqReportInfo *info) {
    struct utsname u;
    uname(&u);
    time_t now = time(NULL);
    char date[64], cpu[128];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    bq_cpu_model(cpu, sizeof cpu);
    fprintf(f, "# bertqat pipeline report\n\n");
    fprintf(f, "- date: %s; machine: %s, %ld CPUs, %s %s; %s\n", date, cpu, sysconf(_SC_NPROCESSORS_ONLN), u.sysname,
            u.machine, info->runtime);
    fprintf(f, "- model: `%s`; data: `%s`; budget: %s\n", info->model, info->data, info->budget);
    if (info->recipe) fprintf(f, "- recipe: %s\n", info->recipe);
    fallback_write(f, run_dir, info);
    fprintf(f, "- wall time of this invocation: %.0f s (stages done earlier are skipped; their times are below)\n\n",
            info->seconds);
}

/* The results table, one row per stage (accuracy and F1, or exact match and F1 for question
 * answering, against the first row), in report.md and on stdout. */
static void results_write(FILE *f, const char *run_dir, const BqReportRow *rows, int nrows, int qa) {
    const char *hdr = qa ? "| stage | engine | exact match | F1 | F1 vs fp32 | questions | model size | questions/s |\n"
                           "|---|---|---|---|---|---|---|---|\n"
                         : "| stage | engine | accuracy | vs fp32 | F1 | examples | model size | examples/s |\n"
                           "|---|---|---|---|---|---|---|---|\n";
    fputs(hdr, f);
    if (qa)
        printf("\n%-40s %-11s %11s %7s %10s %9s %11s %11s\n", "stage", "engine", "exact match", "F1", "F1 vs fp32",
               "questions", "size", "questions/s");
    else
        printf("\n%-40s %-11s %9s %8s %7s %9s %11s %11s\n", "stage", "engine", "accuracy", "vs fp32", "F1", "examples",
               "size", "examples/s");
    double base = NAN;
    for (int i = 0; i < nrows; i++) {
        Metrics m = read_metrics(run_dir, rows[i].eval_json, qa);
        char size[32], delta[32] = "";
        human_size(size, sizeof size, rows[i].size_bytes);
        if (qa) { /* EM and F1 are percentages already; the delta is of F1 */
            if (m.ok && i == 0) base = m.f1;
            if (m.ok && i > 0 && !isnan(base)) snprintf(delta, sizeof delta, "%+.2f", m.f1 - base);
            if (m.ok) {
                fprintf(f, "| %s | %s | %.2f | %.2f | %s | %ld | %s | %.1f |\n", rows[i].label, m.engine, m.acc, m.f1,
                        delta, m.n, size, m.eps);
                printf("%-40s %-11.11s %11.2f %7.2f %10s %9ld %11s %11.1f\n", rows[i].label, m.engine, m.acc, m.f1,
                       delta, m.n, size, m.eps);
            } else {
                fprintf(f, "| %s | | (no result) | | | | %s | |\n", rows[i].label, size);
                printf("%-40s %11s\n", rows[i].label, "(no result)");
            }
            continue;
        }
        if (m.ok && i == 0) base = m.acc;
        if (m.ok && i > 0 && !isnan(base)) snprintf(delta, sizeof delta, "%+.2f pt", 100.0 * (m.acc - base));
        if (m.ok) {
            fprintf(f, "| %s | %s | %.4f | %s | %.4f | %ld | %s | %.1f |\n", rows[i].label, m.engine, m.acc, delta,
                    m.f1, m.n, size, m.eps);
            printf("%-40s %-11.11s %9.4f %8s %7.4f %9ld %11s %11.1f\n", rows[i].label, m.engine, m.acc, delta, m.f1,
                   m.n, size, m.eps);
        } else {
            fprintf(f, "| %s | | (no result) | | | | %s | |\n", rows[i].label, size);
            printf("%-40s %9s\n", rows[i].label, "(no result)");
        }
    }
}

/* Each row with a peer (an export and its checkpoint, fake quant and the integer engine) against it:
 * how many predictions agree and the difference of accuracy (or F1), under one table. */
static void agreement_write(FILE *f, const char *run_dir, const BqReportRow *rows, int nrows, int qa) {
    int npar = 0;
    for (int i = 0; i < nrows; i++) {
        if (rows[i].same_as < 0 || rows[i].same_as >= nrows) continue;
        const BqReportRow *o = &rows[rows[i].same_as];
        Metrics a = read_metrics(run_dir, rows[i].eval_json, qa), b = read_metrics(run_dir, o->eval_json, qa);
        if (!a.ok || !b.ok) continue;
        if (qa) {
            if (!npar++)
                fprintf(f, "\nAnswer by answer:\n\n| compared | questions | answers agree | F1 difference |\n"
                           "|---|---|---|---|\n");
            char what[512];
            if (!strcmp(rows[i].label, o->label))
                snprintf(what, sizeof what, "%s: %s vs %s", o->label, b.engine, a.engine);
            else
                snprintf(what, sizeof what, "%s vs %s (%s)", rows[i].label, o->label, b.engine);
            double diff = !strcmp(rows[i].label, o->label) ? b.f1 - a.f1 : a.f1 - b.f1;
            Agreement g = qa_agreement(run_dir, rows[i].predictions, o->predictions);
            if (g.ok)
                fprintf(f, "| %s | %ld | %.2f%% (%ld differ) | %+.2f |\n", what, g.n,
                        100.0 * (double)(g.n - g.differ) / (double)g.n, g.differ, diff);
            else
                fprintf(f, "| %s | %ld | (no predictions) | %+.2f |\n", what, a.n, diff);
            continue;
        }
        if (!npar++)
            fprintf(f, "\nReview by review (Δp = |p(positive) of one − p(positive) of the other|, as "
                       "scripts/compare_predictions.py computes it):\n\n| compared | reviews | labels agree | accuracy "
                       "difference | median Δp | max Δp |\n|---|---|---|---|---|---|\n");
        /* "X vs Y" with the accuracy of X minus that of Y: one checkpoint on two engines reads "label: peer's
         * engine vs this row's engine", an export "export vs checkpoint (its engine)" */
        char what[512];
        double diff = 100.0 * (a.acc - b.acc);
        if (!strcmp(rows[i].label, o->label)) {
            snprintf(what, sizeof what, "%s: %s vs %s", o->label, b.engine, a.engine);
            diff = 100.0 * (b.acc - a.acc);
        } else {
            snprintf(what, sizeof what, "%s vs %s (%s)", rows[i].label, o->label, b.engine);
        }
        Agreement g = agreement(run_dir, rows[i].predictions, o->predictions);
        if (g.ok)
            fprintf(f, "| %s | %ld | %.2f%% (%ld differ) | %+.2f pt | %.2g | %.2g |\n", what, g.n,
                    100.0 * (double)(g.n - g.differ) / (double)g.n, g.differ, diff, g.median_dp, g.max_dp);
        else
            fprintf(f, "| %s | %ld | (no predictions) | %+.2f pt | | |\n", what, a.n, diff);
    }
}

/* Each stage's settings, thread count and wall time from its marker (src/cli/cmd_pipeline.c, stage_run:
 * {"settings", "argv", "finished", "seconds"}), so the report shows what actually ran. Paths inside
 * RUN_DIR are printed relative to it. */
static void stages_write(FILE *f, const char *run_dir, const BqReportInfo *info) {
    if (info->nstages > 0) fprintf(f, "\n## Stages as run\n\n");
    size_t rl = strlen(run_dir);
    for (int i = 0; i < info->nstages; i++) {
        char mp[4096];
        snprintf(mp, sizeof mp, "%s/.done-%s", run_dir, info->stages[i]);
        json_t *m = json_load_file(mp, 0, NULL), *argv = m ? json_object_get(m, "argv") : NULL;
        if (!m || !json_is_array(argv) || json_array_size(argv) < 2) {
            fprintf(f, "- %s: (no record)\n", info->stages[i]);
            if (m) json_decref(m);
            continue;
        }
        int found = 0;
        double secs = json_num(m, "seconds", &found);
        fprintf(f, "- %s (%.0f s): `", info->stages[i], secs);
        for (size_t k = 1; k < json_array_size(argv); k++) {
            const char *a = json_string_value(json_array_get(argv, k));
            if (!a) continue;
            const char *slash = strrchr(a, '/');
            if (k == 1 && slash) a = slash + 1; /* a script: its name */
            else if (!strncmp(a, run_dir, rl) && a[rl] == '/') a += rl + 1;
            fprintf(f, "%s%s", k > 1 ? " " : "", a);
        }
        fprintf(f, "`\n");
        json_decref(m);
    }
}

int bq_report_write(const char *run_dir, const BqReportRow *rows, int nrows, const BqReportInfo *info) {
    int nacc = 0;
    int st = curves_write(run_dir, rows, nrows, &nacc);
    if (st) return st;

    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/report.md", run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return bq_err(BQ_EIO, "%s: cannot write: %s", tmp, strerror(errno));
    header_write(f, run_dir, info);
    const int qa = info->qa;
    results_write(f, run_dir, rows, nrows, qa);
    agreement_write(f, run_dir, rows, nrows, qa);
    for (int i = 0; i < nrows; i++)
        if (rows[i].note) fprintf(f, "\n%s: %s\n", rows[i].label, rows[i].note);
    fprintf(f, "\nengine: what scored the row (`bertqat eval`: int8 is the integer engine, fake-quant the fp32 "
               "simulation QAT trains, fp32 a float checkpoint; ONNX Runtime CPU for the .onnx files). %s: "
               "inference only, tokenization excluded.\n", qa ? "questions/s" : "examples/s");
    if (info->bench_json) speed_write(f, run_dir, info->bench_json);
    stages_write(f, run_dir, info);
    if (info->onnx_skipped)
        fprintf(f, "\nONNX Runtime evaluation was skipped: --python was none or not an executable.\n");
    fprintf(f, "\n## Training curves\n\n![training loss](curves-loss.svg)\n\n");
    if (nacc > 0) fprintf(f, "![validation accuracy](curves-eval.svg)\n");
    else fprintf(f, "No stage ran a validation pass, so there is no validation curve.\n");
    if ((st = bq_fclose_written(f, tmp))) {
        remove(tmp);
        return st;
    }
    printf("\nreport: %s\n", path);
    return bq_rename_durable(tmp, path);
}
