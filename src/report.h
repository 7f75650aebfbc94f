/* The pipeline report: RUN_DIR/report.md (a results table with the engine of each row, review-by-review
 * agreement of rows with a peer, the speed table of `bench --json`, and training curves as SVG pictures,
 * drawn here directly as SVG polylines: no plotting library is needed for two line charts) and the
 * same table on stdout. */
#ifndef BQ_REPORT_H
#define BQ_REPORT_H

#include <stdint.h>

typedef struct BqReportRow {
    const char *label;     /* e.g. "QAT" */
    const char *eval_json; /* file in RUN_DIR written by `eval --json` or scripts/onnx_eval.py --json */
    const char *artifact;  /* checkpoint dir or .onnx file in RUN_DIR, for the size column */
    const char *train_log; /* JSONL training log in RUN_DIR, or NULL */
    int64_t size_bytes;
    int same_as;           /* index of the row this one must agree with (an export and its checkpoint), or -1 */
    const char *note;      /* printed under the table, or NULL */
    const char *predictions; /* TSV in RUN_DIR written by `eval --predictions` or scripts/onnx_eval.py
                                --predictions, or NULL; with same_as, the report compares the two rows
                                review by review */
} BqReportRow;

typedef struct BqReportInfo {
    const char *model, *data, *budget, *runtime;
    const char *recipe;    /* one line: what the stages do */
    const char *const *stages; /* the stages of this invocation, whose markers RUN_DIR/.done-<stage> list the
                                  settings, command line and wall time of their last run */
    int nstages;
    double seconds;
    int onnx_skipped;
    const char *bench_json; /* file in RUN_DIR written by `bench --json` (the "Speed on this machine"
                               section), or NULL */
    int qa;                 /* question answering: rows hold SQuAD exact match and F1 (x100, `eval --json`,
                               scripts/onnx_eval_qa.py --json), predictions are {id: answer} JSON files and
                               compared answer by answer */
    const char *fallback_ckpt; /* checkpoint in RUN_DIR whose exclude list gives the modules kept in fp32
                                  (every entry but classifier and pooler), or NULL */
    const char *distill_ckpt;  /* checkpoint in RUN_DIR whose distill.json (qat --teacher) is listed, or NULL */
} BqReportInfo;

int bq_report_write(const char *run_dir, const BqReportRow *rows, int nrows, const BqReportInfo *info);

/* Writes an SVG line chart of (x, y) series to path; used for loss and eval-accuracy curves. */
int bq_svg_chart(const char *path, const char *title, const char *xlabel, const char *ylabel, int nseries,
                 const char *const *names, const double *const *xs, const double *const *ys, const int *ns);

#endif
