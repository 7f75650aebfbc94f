/* Pipeline report writer (see report.h): reads each stage's evaluation JSON and training JSONL log,
 * draws the curves as SVG and writes report.md atomically. */
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
    for (double t = ceil(x0 / sx) * sx; t <= x1 + 1e-9; t += sx)
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.0f\" "
                   "text-anchor=\"middle\">%g</text>\n", PX(t), T, PX(t), H - B, PX(t), H - B + 16, t);
    for (double t = ceil(y0 / sy) * sy; t <= y1 + 1e-12; t += sy)
        fprintf(f, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.0f\" y=\"%.1f\" "
                   "text-anchor=\"end\">%.4g</text>\n", L, PY(t), W - R, PY(t), L - 6, PY(t) + 4, t);
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
    if (fclose(f) != 0) return bq_err(BQ_EIO, "%s: write failed", tmp);
    return bq_rename_durable(tmp, path);
}

typedef struct Metrics {
    int ok;
    double acc, f1, eps;
    long n;
} Metrics;

static Metrics read_metrics(const char *run_dir, const char *name) {
    Metrics m = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", run_dir, name);
    json_t *o = json_load_file(path, 0, NULL);
    if (!o) return m;
    int fa = 0, ff = 0, fe = 0, fn = 0;
    m.acc = json_num(o, "accuracy", &fa);
    m.f1 = json_num(o, "f1", &ff);
    m.eps = json_num(o, "examples_per_s", &fe);
    m.n = (long)json_num(o, "examples", &fn);
    m.ok = fa;
    json_decref(o);
    return m;
}

/* "model name" of /proc/cpuinfo, or the machine name from uname. */
static void cpu_model(char *buf, size_t n) {
    snprintf(buf, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        char *c = strchr(line, ':');
        if (!c) break;
        c++;
        while (*c == ' ' || *c == '\t') c++;
        c[strcspn(c, "\n")] = 0;
        snprintf(buf, n, "%s", c);
        break;
    }
    fclose(f);
}

static void human_size(char *buf, size_t n, int64_t b) {
    if (b <= 0) snprintf(buf, n, "-");
    else if (b >= 1 << 20) snprintf(buf, n, "%.1f MiB", (double)b / (1 << 20));
    else snprintf(buf, n, "%.1f KiB", (double)b / 1024);
}

int bq_report_write(const char *run_dir, const BqReportRow *rows, int nrows, const BqReportInfo *info) {
    /* Curves: loss per training stage in one chart, eval accuracy in another. */
    Series loss[5] = {{0}}, acc[5] = {{0}};
    const char *names[5] = {0};
    const double *lx[5] = {0}, *ly[5] = {0}, *ax[5] = {0}, *ay[5] = {0};
    int ln[5] = {0}, an[5] = {0}, ns = 0;
    for (int i = 0; i < nrows && ns < 5; i++) {
        if (!rows[i].train_log) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", run_dir, rows[i].train_log);
        read_log(path, &loss[ns], &acc[ns]);
        names[ns] = rows[i].label;
        lx[ns] = loss[ns].x, ly[ns] = loss[ns].y, ln[ns] = loss[ns].n;
        ax[ns] = acc[ns].x, ay[ns] = acc[ns].y, an[ns] = acc[ns].n;
        ns++;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/curves-loss.svg", run_dir);
    int st = bq_svg_chart(path, "Training loss", "step", "loss", ns, names, lx, ly, ln);
    if (!st) {
        snprintf(path, sizeof path, "%s/curves-eval.svg", run_dir);
        st = bq_svg_chart(path, "Validation accuracy", "step", "accuracy", ns, names, ax, ay, an);
    }
    for (int i = 0; i < ns; i++) free(loss[i].x), free(loss[i].y), free(acc[i].x), free(acc[i].y);
    if (st) return st;

    char tmp[4200];
    snprintf(path, sizeof path, "%s/report.md", run_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return bq_err(BQ_EIO, "%s: cannot write: %s", tmp, strerror(errno));
    struct utsname u;
    uname(&u);
    time_t now = time(NULL);
    char date[64], cpu[128];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    cpu_model(cpu, sizeof cpu);
    fprintf(f, "# bertqat pipeline report\n\n");
    fprintf(f, "- date: %s; machine: %s, %ld CPUs, %s %s; %s\n", date, cpu, sysconf(_SC_NPROCESSORS_ONLN), u.sysname,
            u.machine, info->runtime);
    fprintf(f, "- model: `%s`; data: `%s`; budget: %s\n", info->model, info->data, info->budget);
    if (info->recipe) fprintf(f, "- recipe: %s\n", info->recipe);
    fprintf(f, "- wall time of this invocation: %.0f s (stages done earlier are skipped; their times are below)\n\n",
            info->seconds);
    const char *hdr = "| stage | accuracy | vs fp32 | F1 | examples | model size | examples/s |\n"
                      "|---|---|---|---|---|---|---|\n";
    fputs(hdr, f);
    printf("\n%-40s %9s %8s %7s %9s %11s %11s\n", "stage", "accuracy", "vs fp32", "F1", "examples", "size",
           "examples/s");
    double base = NAN;
    for (int i = 0; i < nrows; i++) {
        Metrics m = read_metrics(run_dir, rows[i].eval_json);
        char size[32], delta[32] = "";
        human_size(size, sizeof size, rows[i].size_bytes);
        if (m.ok && i == 0) base = m.acc;
        if (m.ok && i > 0 && !isnan(base)) snprintf(delta, sizeof delta, "%+.2f pt", 100.0 * (m.acc - base));
        if (m.ok) {
            fprintf(f, "| %s | %.4f | %s | %.4f | %ld | %s | %.1f |\n", rows[i].label, m.acc, delta, m.f1, m.n, size,
                    m.eps);
            printf("%-40s %9.4f %8s %7.4f %9ld %11s %11.1f\n", rows[i].label, m.acc, delta, m.f1, m.n, size, m.eps);
        } else {
            fprintf(f, "| %s | (no result) | | | | %s | |\n", rows[i].label, size);
            printf("%-40s %9s\n", rows[i].label, "(no result)");
        }
    }
    int npar = 0;
    for (int i = 0; i < nrows; i++) { /* exports against the checkpoints they came from */
        if (rows[i].same_as < 0 || rows[i].same_as >= nrows) continue;
        Metrics a = read_metrics(run_dir, rows[i].eval_json), b = read_metrics(run_dir, rows[rows[i].same_as].eval_json);
        if (!a.ok || !b.ok) continue;
        fprintf(f, "%s%s vs %s: %+.2f pt accuracy on the same %ld reviews", npar++ ? "; " : "\n", rows[i].label,
                rows[rows[i].same_as].label, 100.0 * (a.acc - b.acc), a.n);
    }
    if (npar) fprintf(f, ".\n");
    for (int i = 0; i < nrows; i++)
        if (rows[i].note) fprintf(f, "\n%s: %s\n", rows[i].label, rows[i].note);
    fprintf(f, "\nexamples/s: inference only (bertqat eval for checkpoints with fake quantization simulated in fp32; "
               "ONNX Runtime CPU for the .onnx files), tokenization excluded.\n");
    /* Each stage's settings, thread count and wall time from its marker (src/cmd_pipeline.c, stage_run:
     * {"settings", "argv", "finished", "seconds"}), so the report shows what actually ran. Paths inside
     * RUN_DIR are printed relative to it. */
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
    if (info->onnx_skipped)
        fprintf(f, "\nONNX Runtime evaluation was skipped: no Python with onnxruntime was given (--python).\n");
    fprintf(f, "\n## Training curves\n\n![training loss](curves-loss.svg)\n\n![validation accuracy](curves-eval.svg)\n");
    if (fclose(f) != 0) return bq_err(BQ_EIO, "%s: write failed", tmp);
    printf("\nreport: %s\n", path);
    return bq_rename_durable(tmp, path);
}
