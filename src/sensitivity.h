/* Per-group quantization sensitivity of a calibrated (PTQ or QAT) model, and the fp32-fallback choice
 * built on it (`bertqat sensitivity`, `calibrate --keep-fp32 auto`; docs/quantization.md).
 *
 * A group is one Hugging Face module's quantizers: a quantizer's group is its name without the last
 * dotted component (a Linear's weight quantizer with its input or output quantizer), except that the
 * cpu scheme's query/key/value weights join the shared attention.self input quantizer (one QKV group),
 * qdqbert's attention-matmul input quantizers form attention.self.matmul_qk and .matmul_av, and its
 * residual-add input quantizers form <module>.residual_add (the names the ort scheme uses).
 *
 * Measurements run forward only on a fixed set of labelled batches, with quantizers toggled through
 * BqQuantizer.enabled; the fp32 teacher logits (every quantizer disabled) are computed once. */
#ifndef BQ_SENSITIVITY_H
#define BQ_SENSITIVITY_H

#include <stdint.h>

#include "datasets/dataset.h"
#include "layers/bert.h"
#include "layers/quant.h"

#define BQ_SENS_MAX_MEMBERS 8

typedef struct BqSensGroup {
    char name[160];                     /* e.g. "bert.encoder.layer.3.attention.output.dense" */
    char exclude[512];                  /* BqQuantConfig.exclude entries selecting exactly these quantizers */
    int n;                              /* members */
    int q[BQ_SENS_MAX_MEMBERS];         /* indices into qs->q */
    double acc_only, kl_only;           /* only this group quantized */
    double acc_without, kl_without;     /* every quantizer but this group's */
} BqSensGroup;

typedef struct BqSensitivity {
    BqBert *m;                          /* borrowed; m->quant calibrated */
    BqBatcher *b;                       /* borrowed; unshuffled */
    int64_t n;                          /* examples measured */
    int num_labels;
    float *teacher;                     /* (n, num_labels) fp32 logits */
    int32_t *labels;                    /* (n) */
    BqArena act;
    BqSensGroup *g;
    int ng;
    double acc_fp32, acc_quant, kl_quant; /* the baselines, from bq_sens_run_groups's reference passes */
    int measured;                       /* 1 once bq_sens_run_groups has filled the teacher and baselines */
    int64_t forwards;                   /* batch forwards run, teacher included */
    /* Per-batch caches (bq_sens_run_groups). For each batch the fp32 pass and the all-quantized pass keep
     * the output of every encoder layer but the last and the output of every encoder Linear; a group's
     * "only quantized" pass then starts at the group's first layer from the fp32 layer outputs and takes
     * from the fp32 Linear outputs those of that layer's Linears its quantizers cannot reach
     * (bq_bert_linear_reach), and its "all but this group" pass does the same from the all-quantized
     * ones. The layers before compute exactly those values in that pass, and an unreached Linear sees the
     * same input and the same quantizers, so the results are the same bit for bit.
     * prefix_cache = 0 runs every pass from the embeddings (and reuses nothing); reuse_linears = 0 keeps
     * the layer outputs but computes every Linear. bq_sens_init sets each to 1 when its caches take at
     * most BQ_SENS_CACHE_MAX bytes. */
    int prefix_cache, reuse_linears;
    int64_t bt_max;                     /* tokens of the largest batch: batch_size · max_len */
    float *hid_fp32, *hid_quant;        /* (layers − 1)·bt_max·H floats each */
    float *lin_fp32, *lin_quant;        /* layers·bt_max·(5·H + intermediate_size) floats each */
    int64_t reused;                     /* Linear products taken from the caches */
} BqSensitivity;

#define BQ_SENS_CACHE_MAX ((int64_t)3 << 30)

/* Groups of qs (see above), in table order. Errors: a group of more than BQ_SENS_MAX_MEMBERS. */
int bq_sens_groups(const BqQuantState *qs, BqSensGroup **out, int *ng);

/* Prepares a measurement over the first max_examples (0: all) examples of b: groups m->quant (every
 * quantizer must have a range: BQ_EINVAL otherwise) and sets up the per-batch caches. No forward runs
 * here: bq_sens_run_groups computes the teacher and the baselines with the reference passes it needs
 * anyway. m->quant is left with every quantizer enabled. */
int bq_sens_init(BqSensitivity *s, BqBert *m, BqBatcher *b, int64_t max_examples);
void bq_sens_free(BqSensitivity *s);

/* Accuracy and mean KL(fp32 ‖ quantized) of the class softmax with quantizer i enabled iff
 * enabled[i] (m->quant->n entries). Needs the teacher: after bq_sens_run_groups. */
int bq_sens_measure(BqSensitivity *s, const unsigned char *enabled, double *acc, double *kl);

/* Fills every group's two measurements, batch by batch through the per-batch caches above, and the
 * teacher logits, labels and baselines (acc_fp32, acc_quant, kl_quant) from each batch's fp32 and
 * all-quantized reference passes; progress lines (one per batch, then one per group) go to stderr
 * unless quiet. */
int bq_sens_run_groups(BqSensitivity *s, int quiet);

/* Group indices ordered by harm: largest acc_fp32 − acc_only first, ties by larger kl_only. The caller
 * frees the array. */
int *bq_sens_order(const BqSensitivity *s);

/* Greedy fp32 fallback: keeps groups in fp32 in bq_sens_order until the accuracy with every other
 * quantizer enabled is within max_drop_points (percentage points) of fp32 (or every group is kept).
 * keep[g] receives 1 for kept groups (ng entries); *acc receives the final accuracy, *kept the count. */
int bq_sens_keep_fp32(BqSensitivity *s, double max_drop_points, unsigned char *keep, int *kept, double *acc,
                      int quiet);

/* Leaves the modules named by `entries` (comma-separated BqQuantConfig.exclude entries) in fp32 without
 * recalibrating: appends them to m->quant->cfg.exclude, rebuilds the quantizer table and copies every
 * remaining quantizer's range and observer state by name. Errors (m->quant unchanged): an entry that
 * selects no quantizer (BQ_EINVAL naming `flag` and the entry), an exclude list too long. */
int bq_sens_exclude(BqBert *m, const char *entries, const char *flag);

#endif
