/* Progress bar / log lines / JSONL / TensorBoard for the trainer (see progress.h). */
#include "src/progress.h"

#include <stdarg.h>
#include <string.h>
#include <unistd.h>

#include "autograd/bq.h"

int bq_progress_open(BqProgress *p, const char *tag, const char *jsonl_path, const char *logdir,
                     int64_t total_steps, int quiet) {
    memset(p, 0, sizeof *p);
    p->tag = tag ? tag : "train";
    p->quiet = quiet;
    p->tty = !quiet && isatty(fileno(stderr));
    p->t0 = bq_now();
    p->total_steps = total_steps;
    p->first_step = -1;
    if (jsonl_path) snprintf(p->jsonl_path, sizeof p->jsonl_path, "%s", jsonl_path);
    if (logdir) {
        int st = bq_tb_open(&p->tb, logdir);
        if (st) return st;
    }
    return BQ_OK;
}

static void jsonl_append(BqProgress *p, const char *line) {
    if (!p->jsonl_path[0]) return;
    FILE *f = fopen(p->jsonl_path, "a");
    if (!f) return; /* logging is best effort; the checkpoint is what matters */
    fputs(line, f);
    fputc('\n', f);
    fclose(f);
}

static void end_bar(BqProgress *p) {
    if (p->bar_open) fputc('\n', stderr), p->bar_open = 0;
}

void bq_progress_step(BqProgress *p, int64_t step, double epoch, double loss, double lr, double grad_norm,
                      double examples_per_s, double tokens_per_s) {
    char line[512];
    double now = bq_now(), el = now - p->t0;
    snprintf(line, sizeof line,
             "{\"type\":\"train\",\"step\":%lld,\"epoch\":%.4f,\"loss\":%.7g,\"lr\":%.6g,\"grad_norm\":%.6g,"
             "\"examples_per_s\":%.2f,\"tokens_per_s\":%.1f,\"elapsed_s\":%.2f}",
             (long long)step, epoch, loss, lr, grad_norm, examples_per_s, tokens_per_s, el);
    jsonl_append(p, line);
    if (p->tb) {
        bq_tb_scalar(p->tb, "train/loss", (float)loss, step);
        bq_tb_scalar(p->tb, "train/learning_rate", (float)lr, step);
        bq_tb_scalar(p->tb, "train/grad_norm", (float)grad_norm, step);
        bq_tb_scalar(p->tb, "train/tokens_per_s", (float)tokens_per_s, step);
    }
    if (p->first_step < 0) p->first_step = step, p->t_first = now;
    if (p->quiet) return;
    /* ETA from this process's own pace (from its first logged step on, once there is one to go by) */
    double eta = step > p->first_step ? (now - p->t_first) / (double)(step - p->first_step) * (double)(p->total_steps - step)
                 : step > 0 ? el / (double)step * (double)(p->total_steps - step) : 0;
    if (p->tty) {
        int width = 24, fill = p->total_steps > 0 ? (int)(width * step / p->total_steps) : 0;
        char bar[32];
        for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
        bar[width] = 0;
        fprintf(stderr, "\r[%s] [%s] %lld/%lld epoch %.2f loss %.4f lr %.2e %.0f tok/s eta %.0fs   ", p->tag, bar,
                (long long)step, (long long)p->total_steps, epoch, loss, lr, tokens_per_s, eta);
        fflush(stderr);
        p->bar_open = 1;
    } else {
        fprintf(stderr, "[%s] step %lld/%lld epoch %.2f loss %.4f lr %.3e grad_norm %.3f %.1f ex/s %.0f tok/s eta %.0fs\n",
                p->tag, (long long)step, (long long)p->total_steps, epoch, loss, lr, grad_norm, examples_per_s,
                tokens_per_s, eta);
    }
}

void bq_progress_eval(BqProgress *p, int64_t step, double epoch, const BqMetrics *m) {
    char line[512];
    snprintf(line, sizeof line,
             "{\"type\":\"eval\",\"step\":%lld,\"epoch\":%.4f,\"accuracy\":%.6f,\"f1\":%.6f,\"precision\":%.6f,"
             "\"recall\":%.6f,\"loss\":%.7g,\"examples\":%lld,\"elapsed_s\":%.2f}",
             (long long)step, epoch, m->accuracy, m->f1, m->precision, m->recall, m->loss, (long long)m->n,
             bq_now() - p->t0);
    jsonl_append(p, line);
    if (p->tb) {
        bq_tb_scalar(p->tb, "eval/accuracy", (float)m->accuracy, step);
        bq_tb_scalar(p->tb, "eval/f1", (float)m->f1, step);
        bq_tb_scalar(p->tb, "eval/loss", (float)m->loss, step);
    }
    if (p->quiet) return;
    end_bar(p);
    fprintf(stderr, "[%s] eval step %lld: accuracy %.4f f1 %.4f loss %.4f (%lld examples)\n", p->tag,
            (long long)step, m->accuracy, m->f1, m->loss, (long long)m->n);
}

void bq_progress_note(BqProgress *p, const char *fmt, ...) {
    if (p->quiet) return;
    end_bar(p);
    fprintf(stderr, "[%s] ", p->tag);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void bq_progress_close(BqProgress *p) {
    if (!p->quiet) end_bar(p);
    if (p->tb) bq_tb_close(p->tb);
    p->tb = NULL;
}
