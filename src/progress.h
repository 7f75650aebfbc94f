/* Training progress: a one-line bar redrawn in place on a TTY, plain log lines otherwise (stderr),
 * a JSONL log of every logged step and evaluation ({"type":"train",...} / {"type":"eval",...}, read by
 * src/report.c) and optional TensorBoard scalars. */
#ifndef BQ_PROGRESS_H
#define BQ_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

#include "src/metrics.h"
#include "src/tblog.h"

typedef struct BqProgress {
    const char *tag;
    int tty, quiet;
    char jsonl_path[4096];
    BqTbWriter *tb;
    double t0;
    int64_t total_steps;
    int64_t first_step;  /* first step logged by this process (a resumed run starts late), for the ETA */
    double t_first;
    int bar_open;  /* a bar line is on screen without a newline */
} BqProgress;

/* jsonl_path may be NULL (no JSONL), logdir may be NULL (no TensorBoard). The JSONL file is opened in
 * append mode for each record, so it may live in a directory that checkpoints replace. */
int bq_progress_open(BqProgress *p, const char *tag, const char *jsonl_path, const char *logdir,
                     int64_t total_steps, int quiet);
/* examples_per_s and tokens_per_s (B·T per batch, padding included: what the model computes on) are
 * measured over the steps since the previous call. */
void bq_progress_step(BqProgress *p, int64_t step, double epoch, double loss, double lr, double grad_norm,
                      double examples_per_s, double tokens_per_s);
void bq_progress_eval(BqProgress *p, int64_t step, double epoch, const BqMetrics *m);
/* A free-form message line (ends the bar line first). */
void bq_progress_note(BqProgress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void bq_progress_close(BqProgress *p);

#endif
