/* `bertqat calibrate` (post-training quantization), `bertqat qat` (quantization-aware fine-tuning)
 * and `bertqat info` (checkpoint summary with every quantizer).
 *
 * calibrate: loads an fp32 model, places quantizers by scheme (layers/qscheme.c), runs forwards over
 *   --calib-samples training examples collecting |x| statistics, sets each activation amax with the
 *   chosen calibrator (layers/calib.c) and each weight range to its per-channel max, freezes, and
 *   saves a native checkpoint (export/ckpt.h) carrying the ranges.
 * qat: the `finetune` training loop (src/train.h, same flags) on the fake-quantized model. When the
 *   input has no ranges it is first calibrated (--calibrator, default max); then either the
 *   moving-average observers (c = 0.01) run in every training forward until --freeze-ranges-after
 *   steps (--ranges observe, ONNX Runtime's example), or the ranges stay as calibrated and only the
 *   weights learn (--ranges fixed, pytorch-quantization / QDQBERT), or every scale is trained with the
 *   weights from its calibrated value (--ranges learn, LSQ: layers/quant.h, docs/quantization.md).
 * The quantization convention (symmetric int8, zero point 0, scale = amax/127; the cpu scheme's weights
 * 7-bit, amax/63) is in layers/quant.h. A question-answering model (src/qa.h) calibrates and trains on
 * SQuAD windows; its qa_outputs, like the classifier, has no quantizer (none of layers/quant.h's points
 * is outside the encoder, except the embeddings' LayerNorm output). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "datasets/dataset.h"
#include "export/ckpt.h"
#include "layers/quant.h"
#include "src/cli/args.h"
#include "src/cli/cli.h"
#include "src/cli/cmd_common.h"
#include "src/dist.h"
#include "src/distill.h"
#include "src/metrics.h"
#include "src/cli/qa_setup.h"
#include "src/sensitivity.h"
#include "src/train.h"

/* Quantization flags shared by calibrate and qat. */
/* The quantization flags of calibrate and qat: the placement settings are the library's BqQuantConfig
 * itself (the flag rows point at its fields); the calibration settings are the command's. */
typedef struct QuantOpts {
    BqQuantConfig cfg;
    BqCalibrator calibrator;
    int calib_samples;
    double percentile;
} QuantOpts;

static void quant_opts_default(QuantOpts *q, BqCalibrator calibrator) {
    bq_quant_config_default(&q->cfg);
    q->calibrator = calibrator;
    q->calib_samples = 128;
    q->percentile = 99.99;
}

#define QUANT_SPECS(q)                                                                                          \
    {"scheme", BQ_ARG_ENUM, BQ_ARG_ENUM_DST(&(q).cfg.scheme), "quantizer placement: ort (ONNX Runtime example), " \
     "qdqbert or cpu (ORT CPU integer kernels)", 0, 0, 0, bq_scheme_names},                                   \
    {"calibrator", BQ_ARG_ENUM, BQ_ARG_ENUM_DST(&(q).calibrator), "range calibrator of the activations", 0, 0, 0, \
     bq_calibrator_names},                                                                                      \
    {"percentile", BQ_ARG_FLOAT, &(q).percentile, "percentile calibrator: percent of |x| kept", 0, 50, 100},     \
    {"calib-samples", BQ_ARG_INT, &(q).calib_samples, "training examples for calibration", 0, 1, 1e9},         \
    {"per-tensor", BQ_ARG_FLAG, &(q).cfg.per_tensor_weights, "per-tensor weight ranges (default per output "     \
     "channel)", 0, 0, 0},                                                                                      \
    {"fuse-qkv", BQ_ARG_FLAG, &(q).cfg.fuse_qkv, "one shared range for the query/key/value outputs (inputs)", 0, \
     0, 0},                                                                                                     \
    {"clip-gelu", BQ_ARG_F32, &(q).cfg.clip_gelu, "cap the GELU-output amax at this value (0: off)", 0, 0, 1e6}, \
    {"exclude", BQ_ARG_CHARS, (q).cfg.exclude, "comma-separated module prefixes kept fp32 (e.g. encoder.layer.0)", \
     0, 0, sizeof(q).cfg.exclude}

/* Places quantizers on m and calibrates them over up to `samples` examples of epoch 0 of `calib`
 * (forward only, no tape). Replaces any quantizer state m already has. */
static int calibrate_model(BqBert *m, const BqQuantConfig *qcfg, BqCalibrator method, double percentile,
                           BqBatchSource *calib, int64_t samples, const char *tag) {
    int st = BQ_OK;
    BqArena act = {0};
    if (m->quant) bq_quant_free(m->quant), m->quant = NULL;
    if ((st = bq_quant_create(&m->quant, m, qcfg))) return st;
    if ((st = bq_arena_init(&act, (size_t)16 << 30, "calibration activations"))) goto cleanup;
    bq_quant_calib_begin(m->quant, method);
    BqCtx ctx = {.act = &act, .tape = NULL, .training = 0, .prec = m->prec};
    int64_t seen = 0;
    double t0 = bq_now();
    if ((st = calib->begin_epoch(calib->ctx, 0))) goto cleanup;
    const BqBatch *b;
    /* Under mpirun rank r collects batches k with k mod N = r; src/dist.h merges the statistics. */
    for (int64_t k = 0; seen < samples; k++) {
        if ((st = calib->next(calib->ctx, &b))) goto cleanup;
        if (!b) break;
        if (k % bq_dist_size() == bq_dist_rank()) {
            size_t mark = bq_arena_mark(&act);
            BqTensor *logits = NULL;
            BqBertInput in = bq_batch_input(b);
            if ((st = bq_bert_forward(m, &ctx, &in, &logits, NULL))) goto cleanup;
            bq_arena_rewind(&act, mark);
        }
        if (k == 0) bq_dist_calib_first_batch(m->quant);
        seen += b->B;
    }
    if (seen == 0) {
        st = bq_err(BQ_EINVAL, "--calib-samples: no calibration examples");
        goto cleanup;
    }
    if ((st = bq_dist_calib_merge(m->quant))) goto cleanup;
    if ((st = bq_quant_calib_finish(m->quant, method, percentile))) goto cleanup;
    bq_dist_quant_bcast(m->quant); /* weight ranges of a rank that ran no batch */
    fprintf(stderr, "[%s] calibrated %d quantizers (%s, scheme %s) on %lld examples in %.1fs\n", tag, m->quant->n,
            bq_calibrator_name(method), bq_scheme_name(qcfg->scheme), (long long)seen, bq_now() - t0);
cleanup:
    if (act.base) bq_arena_free(&act);
    return st;
}

/* Accuracy of m over the batches of b (forward only). */
static int accuracy(BqBert *m, BqBatcher *b, double *acc) {
    BqBatchSource src;
    BqBatcherSource bs;
    BqArena act = {0};
    BqConfusion conf;
    int st = bq_arena_init(&act, (size_t)16 << 30, "evaluation activations");
    if (st) return st;
    bq_batch_source_batcher(&src, &bs, b);
    bq_confusion_init(&conf, m->cfg.num_labels);
    st = bq_evaluate(m, &src, &act, &conf, 0, NULL, NULL);
    if (!st) *acc = bq_metrics_compute(&conf).accuracy;
    bq_confusion_free(&conf);
    bq_arena_free(&act);
    return st;
}

/* --keep-fp32 auto: measures every group's sensitivity on up to `samples` validation examples (the last
 * 10 % of the training examples, as in finetune) and keeps in fp32 the most harmful groups until the
 * accuracy is within max_drop points of fp32 (src/sensitivity.h), without recalibrating. */
static int keep_fp32_auto(BqBert *m, BqCliData *d, const BqTokenizer *tok, uint64_t seed, int batch_size,
                          int samples, double max_drop, const char *tag) {
    BqDataset *ds = NULL;
    BqBatcher bt = {0};
    BqSensitivity s;
    memset(&s, 0, sizeof s);
    unsigned char *keep = NULL;
    char *entries = NULL;
    BqDataSpec spec;
    bq_cli_data_spec(&spec, d, "val", seed);
    spec.val_fraction = 0.1;
    int st = bq_dataset_load(&ds, &spec, tok);
    if (st) goto cleanup;
    if ((st = bq_batcher_init(&bt, ds, batch_size, 0, seed, 0))) goto cleanup;
    if ((st = bq_sens_init(&s, m, &bt, samples))) goto cleanup;
    fprintf(stderr, "[%s] --keep-fp32 auto: %d groups on %lld validation examples\n", tag, s.ng, (long long)s.n);
    if ((st = bq_sens_run_groups(&s, 0))) goto cleanup;
    keep = bq_calloc((size_t)s.ng + 1, 1);
    int kept = 0;
    double acc = 0.0;
    if ((st = bq_sens_keep_fp32(&s, max_drop, keep, &kept, &acc, 0))) goto cleanup;
    size_t cap = 1, len = 0;
    for (int k = 0; k < s.ng; k++) cap += keep[k] ? strlen(s.g[k].exclude) + 1 : 0;
    entries = bq_calloc(cap, 1);
    printf("keep-fp32: validation accuracy (%lld examples): fp32 %.4f, all quantized %.4f, with %d group%s in "
           "fp32 %.4f (budget %.2f points)\n", (long long)s.n, s.acc_fp32, s.acc_quant, kept, kept == 1 ? "" : "s",
           acc, max_drop);
    for (int k = 0; k < s.ng; k++) {
        if (!keep[k]) continue;
        printf("keep-fp32: kept in fp32: %s (only this group quantized: accuracy %.4f)\n", s.g[k].name,
               s.g[k].acc_only);
        len += (size_t)snprintf(entries + len, cap - len, "%s%s", len ? "," : "", s.g[k].exclude);
    }
    if ((s.acc_fp32 - acc) * 100.0 > max_drop + 1e-9)
        printf("keep-fp32: even with every group in fp32 the budget is not met\n");
    bq_sens_free(&s);
    if (len && (st = bq_sens_exclude(m, entries, "--keep-fp32"))) goto cleanup;
cleanup:
    bq_sens_free(&s);
    free(keep);
    free(entries);
    if (bt.ds) bq_batcher_free(&bt);
    if (ds) bq_dataset_free(ds);
    return st;
}

/* ---- question answering ---- */

/* calibrate and qat on SQuAD: the model with its QA head, the first `questions` questions of d->path
 * (0: all) windowed, in a seeded shuffled order. */
typedef struct QaTrainData {
    BqTokenizer *tok;
    BqSquadSet *s;
    BqQaSource qs;
    BqBatchSource src;
} QaTrainData;

static int qa_train_data(QaTrainData *q, BqBert *m, const char *model, BqCliData *d, BqCliQa *qa,
                         int64_t questions, int batch_size, uint64_t seed, const char *tag) {
    memset(q, 0, sizeof *q);
    int st = bq_qa_model_load(m, &q->tok, model, seed, tag);
    if (!st) st = bq_qa_data_load(&q->s, d, m, q->tok, qa, questions, tag);
    if (!st) bq_qa_source_init(&q->qs, &q->src, q->s, q->s->n, batch_size, 1, seed);
    return st;
}

static void qa_train_data_free(QaTrainData *q) {
    if (q->qs.order) bq_qa_source_free(&q->qs);
    bq_squad_free(q->s);
    if (q->tok) bq_tokenizer_free(q->tok);
    memset(q, 0, sizeof *q);
}

static int calibrate_qa(const char *model, const char *out, BqCliData *d, BqCliQa *qa, const QuantOpts *q,
                        BqCalibrator method, const BqQuantConfig *qcfg, int batch_size, int seed, BqPrecision prec) {
    BqBert m;
    memset(&m, 0, sizeof m);
    QaTrainData td;
    /* calib_samples counts windows; a question gives at least one */
    int st = qa_train_data(&td, &m, model, d, qa, q->calib_samples, batch_size, (uint64_t)seed, "calibrate");
    m.prec = prec;
    if (!st) st = calibrate_model(&m, qcfg, method, q->percentile, &td.src, q->calib_samples, "calibrate");
    if (!st && bq_dist_rank() == 0) { /* rank 0 writes */
        m.data = d->used;
        st = bq_ckpt_save(&m, out, model, NULL);
    }
    if (!st) {
        printf("calibrate: %d quantizers, calibrator %s", m.quant->n, bq_calibrator_name(method));
        if (method == BQ_CALIBRATOR_PERCENTILE) printf(" %.4g", q->percentile);
        printf(", scheme %s; question answering; checkpoint %s\n", bq_scheme_name(qcfg->scheme), out);
    }
    qa_train_data_free(&td);
    if (m.quant) bq_quant_free(m.quant), m.quant = NULL;
    bq_bert_free(&m);
    return st;
}

/* calibrate --eval-samples: loads that many test examples of spec's data (*dtest, batched in *btest,
 * both freed by the caller) and measures the input's own fp32 accuracy (quantizers, if any, set aside)
 * into *acc. spec is left describing the test selection. Errors: those of loading and evaluation. */
static int calibrate_test_fp32(BqBert *m, BqDataSpec *spec, int eval_samples, const BqTokenizer *tok, int batch_size,
                               int seed, BqDataset **dtest, BqBatcher *btest, double *acc) {
    int st;
    spec->split = "test";
    spec->train_samples = 0;
    spec->eval_samples = eval_samples;
    if ((st = bq_dataset_load(dtest, spec, tok))) return st;
    if ((st = bq_batcher_init(btest, *dtest, batch_size, 0, (uint64_t)seed, 1))) return st;
    struct BqQuantState *keep = m->quant;
    m->quant = NULL; /* the input's own fp32 accuracy */
    st = accuracy(m, btest, acc);
    m->quant = keep;
    return st;
}

int bq_cmd_calibrate(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *keep_fp32 = NULL;
    int batch_size = 32, seed = 42, eval_samples = 0, keep_samples = 512;
    double max_drop = 0.5;
    BqCliData d = BQ_CLI_DATA_INIT;
    QuantOpts q;
    quant_opts_default(&q, BQ_CALIBRATOR_PERCENTILE);
    BqCliQa qa;
    bq_cli_qa_default(&qa);
    const BqArgSpec specs[] = {
        {"model", BQ_ARG_STR, &model, "fp32 checkpoint (native or Hugging Face directory)", 1, 0, 0},
        {"data", BQ_ARG_STR, &d.path, "IMDB archive/folder, CSV, TSV or JSONL (training split is used); question "
         "answering: SQuAD v1.1 JSON (training file)", 1, 0, 0},
        {"out", BQ_ARG_OUT, &out, "output PTQ checkpoint directory (replaced atomically)", 1, 0, 0},
        QUANT_SPECS(q),
        {"batch-size", BQ_ARG_INT, &batch_size, "examples per calibration forward", 0, 1, 65536},
        BQ_CLI_DATA_SPECS(d),
        {"seed", BQ_ARG_INT, &seed, "seed of the calibration sample", 0, 0, 2147483647},
        {"eval-samples", BQ_ARG_INT, &eval_samples,
         "also report fp32 and PTQ accuracy on this many test examples (0: skip)", 0, 0, 1e9},
        {"keep-fp32", BQ_ARG_STR, &keep_fp32, "NAME,...: module prefixes left in fp32 (added to the exclude list); "
         "auto: the most harmful groups until validation accuracy is within --max-drop of fp32", 0, 0, 0},
        {"max-drop", BQ_ARG_FLOAT, &max_drop, "--keep-fp32 auto: accuracy budget in percentage points", 0, 0, 100},
        {"keep-fp32-samples", BQ_ARG_INT, &keep_samples, "--keep-fp32 auto: validation examples measured", 0, 1,
         1e9},
        BQ_CLI_TASK_SPEC(qa),
        BQ_CLI_QA_WINDOW_SPECS(qa),
    };
    BqArgs args = {.cmd = "calibrate", .usage = "--model DIR --data PATH --out DIR [options]",
                   .summary = "Post-training quantization: place fake-quant modules and calibrate their ranges.",
                   .specs = specs, .nspecs = (int)(sizeof specs / sizeof *specs),
                   .common = BQ_ARGS_THREADS | BQ_ARGS_PRECISION};
    int st = bq_args_parse(&args, argc, argv);
    if (st || args.help) return st;
    if ((st = bq_check_writable_parent(out))) return st;
    if ((bq_args_given(&args, "max-drop") || bq_args_given(&args, "keep-fp32-samples")) &&
        !(keep_fp32 && !strcmp(keep_fp32, "auto")))
        return bq_err(BQ_EINVAL, "--max-drop and --keep-fp32-samples apply only with --keep-fp32 auto");

    BqTokenizer *tok = NULL;
    BqDataset *dcal = NULL, *dtest = NULL;
    BqBatcher bcal = {0}, btest = {0};
    BqBert m;
    memset(&m, 0, sizeof m);
    BqCalibrator method = q.calibrator;
    const BqQuantConfig *qcfg = &q.cfg;
    BqPrecision prec = args.prec;
    bq_args_header(&args);
    int is_qa = 0;
    if ((st = bq_cli_task_resolve(&args, &qa, model, &is_qa)) || (st = bq_cli_task_check_data(is_qa, d.path))) return st;
    if (is_qa && eval_samples > 0)
        return bq_err(BQ_EINVAL, "--eval-samples: question answering is scored by `bertqat eval` on the dev set");
    if (is_qa) return calibrate_qa(model, out, &d, &qa, &q, method, qcfg, batch_size, seed, prec);
    BqDataSpec spec;
    if ((st = bq_cli_model_load(&m, &tok, model, 0, (uint64_t)seed, "calibrate")) ||
        (st = bq_cli_data_resolve(&d, &m, "calibrate")))
        goto cleanup;
    bq_cli_data_spec(&spec, &d, "train", (uint64_t)seed);
    spec.train_samples = q.calib_samples;
    if ((st = bq_dataset_load(&dcal, &spec, tok)) || (st = bq_cli_model_fit(&m, model, dcal, (uint64_t)seed, "calibrate")) ||
        (st = bq_batcher_init(&bcal, dcal, batch_size, 1, (uint64_t)seed, 0)))
        goto cleanup;
    m.prec = prec;
    double acc_fp32 = -1, acc_ptq = -1;
    if (eval_samples > 0 && (st = calibrate_test_fp32(&m, &spec, eval_samples, tok, batch_size, seed, &dtest, &btest,
                                                      &acc_fp32)))
        goto cleanup;
    BqBatchSource scal;
    BqBatcherSource bscal;
    bq_batch_source_batcher(&scal, &bscal, &bcal);
    if ((st = calibrate_model(&m, qcfg, method, q.percentile, &scal, q.calib_samples, "calibrate"))) goto cleanup;
    if (keep_fp32 && !strcmp(keep_fp32, "auto")) {
        if ((st = keep_fp32_auto(&m, &d, tok, (uint64_t)seed, batch_size, keep_samples, max_drop, "calibrate")))
            goto cleanup;
    } else if (keep_fp32 && (st = bq_sens_exclude(&m, keep_fp32, "--keep-fp32"))) {
        goto cleanup;
    }
    if (eval_samples > 0 && (st = accuracy(&m, &btest, &acc_ptq))) goto cleanup;
    m.data = d.used;
    if (bq_dist_rank() == 0 && (st = bq_ckpt_save(&m, out, model, NULL))) goto cleanup; /* rank 0 writes */
    printf("calibrate: %d quantizers, calibrator %s", m.quant->n, bq_calibrator_name(method));
    if (method == BQ_CALIBRATOR_PERCENTILE) printf(" %.4g", q.percentile);
    printf(", scheme %s; checkpoint %s\n", bq_scheme_name(qcfg->scheme), out);
    if (keep_fp32) printf("calibrate: exclude list (kept in fp32) \"%s\"\n", m.quant->cfg.exclude);
    if (eval_samples > 0)
        printf("calibrate: accuracy on %lld test examples: fp32 %.4f, ptq %.4f\n", (long long)dtest->n, acc_fp32,
               acc_ptq);

cleanup:
    if (bcal.ds) bq_batcher_free(&bcal);
    if (btest.ds) bq_batcher_free(&btest);
    if (dcal) bq_dataset_free(dcal);
    if (dtest) bq_dataset_free(dtest);
    if (tok) bq_tokenizer_free(tok);
    if (m.quant) bq_quant_free(m.quant), m.quant = NULL;
    bq_bert_free(&m);
    return st;
}

/* A calibrated input keeps its quantizers and ranges, so a quantization flag that asks for something
 * else would be silently ignored: each is an error naming the flag. A flag that repeats the input's
 * own setting is accepted (the pipeline passes --scheme to every quantized stage). */
static int check_kept_quant_flags(const BqArgs *a, const BqQuantConfig *want, const BqQuantConfig *have,
                                  const char *model) {
    const char *flag = NULL;
    if (bq_args_given(a, "scheme") && want->scheme != have->scheme) flag = "scheme";
    else if (bq_args_given(a, "per-tensor") && !have->per_tensor_weights) flag = "per-tensor";
    else if (bq_args_given(a, "fuse-qkv") && !have->fuse_qkv) flag = "fuse-qkv";
    else if (bq_args_given(a, "clip-gelu") && want->clip_gelu != have->clip_gelu) flag = "clip-gelu";
    else if (bq_args_given(a, "exclude") && strcmp(want->exclude, have->exclude)) flag = "exclude";
    else if (bq_args_given(a, "calibrator")) flag = "calibrator";
    else if (bq_args_given(a, "percentile")) flag = "percentile";
    else if (bq_args_given(a, "calib-samples")) flag = "calib-samples";
    if (!flag) return BQ_OK;
    return bq_err(BQ_EINVAL, "--%s would be ignored: %s is already calibrated (scheme %s) and QAT keeps its "
                  "quantizers and ranges; drop the flag or start from an fp32 checkpoint", flag, model, bq_scheme_name(have->scheme));
}

/* qat --teacher: validates the distillation flags, takes the record of OUT on --resume (the teacher is
 * loaded again from its recorded path; flags that disagree with the record are an error), loads the
 * teacher and checks it against the student. *on = 1 when distillation runs. */
static int distill_setup(const BqArgs *a, BqDistill *dist, BqBert *teacher, BqDistillRecord *rec, const char *teacher_dir,
                         const BqBert *m, const char *model, const char *out, int resume, int *on) {
    *on = 0;
    static const char *const dflags[3] = {"distill-alpha", "distill-temperature", "distill-hidden"};
    for (int k = 0; k < 3 && !teacher_dir; k++)
        if (bq_args_given(a, dflags[k]))
            return bq_err(BQ_EINVAL, "--%s applies only with --teacher", dflags[k]);
    int st, found = 0;
    if (resume && (st = bq_distill_record_read(out, rec, &found))) return st;
    if (resume && found && !teacher_dir) {
        dist->teacher_dir = rec->teacher;
        dist->alpha = rec->alpha, dist->temperature = rec->temperature, dist->hidden_weight = rec->hidden_weight;
        fprintf(stderr, "[qat] --resume: distilling from %s as recorded in %s/distill.json\n", rec->teacher, out);
    } else if (resume && teacher_dir) {
        char abs[4096];
        const char *want = realpath(teacher_dir, abs) ? abs : teacher_dir;
        if (!found)
            return bq_err(BQ_EINVAL, "--teacher: %s was trained without distillation; resume it without --teacher",
                          out);
        if (strcmp(want, rec->teacher) || dist->alpha != rec->alpha || dist->temperature != rec->temperature ||
            dist->hidden_weight != rec->hidden_weight)
            return bq_err(BQ_EINVAL, "--teacher: %s/distill.json records teacher %s, alpha %g, temperature %g, hidden "
                          "%g; resume with those settings (or without the distillation flags)", out, rec->teacher,
                          rec->alpha, rec->temperature, rec->hidden_weight);
        dist->teacher_dir = teacher_dir;
    } else if (teacher_dir) {
        dist->teacher_dir = teacher_dir;
    } else {
        return BQ_OK;
    }
    if ((st = bq_distill_check_flags(dist->alpha, dist->temperature, dist->hidden_weight))) return st;
    if ((st = bq_distill_load_teacher(teacher, dist->teacher_dir, m, model, dist->hidden_weight))) return st;
    dist->teacher = teacher;
    *on = 1;
    fprintf(stderr, "[qat] distillation: teacher %s (%s), alpha %g, temperature %g, hidden-state weight %g\n",
            dist->teacher_dir, teacher->quant ? "quantized" : "fp32", dist->alpha, dist->temperature,
            dist->hidden_weight);
    return BQ_OK;
}

/* qat's distillation flags: the teacher's folder into teacher_dir, the loss weights into the BqDistill
 * dist (src/distill.h; checked by bq_distill_check_flags once parsed). */
#define DISTILL_SPECS(teacher_dir, dist)                                                                        \
    {"teacher", BQ_ARG_STR, &(teacher_dir), "distill from this checkpoint (same vocabulary and labels): loss = " \
     "(1-A)·CE + A·T²·KL + W·Σ hidden MSE", 0, 0, 0},                                                           \
    {"distill-alpha", BQ_ARG_FLOAT, &(dist).alpha, "--teacher: weight A of the KL term, in [0, 1]", 0, 0, 0},   \
    {"distill-temperature", BQ_ARG_FLOAT, &(dist).temperature, "--teacher: softmax temperature T (> 0)", 0, 0,  \
     0},                                                                                                        \
    {"distill-hidden", BQ_ARG_FLOAT, &(dist).hidden_weight, "--teacher: weight W of the summed per-layer "     \
     "hidden-state MSE (>= 0; > 0 needs the same layers and hidden size)", 0, 0, 0}

/* qat --ranges: how the ranges move while QAT trains (qat_ranges_mode). */
static const char *const RANGES_NAMES[] = {"observe", "fixed", "learn", NULL};
enum { RANGES_OBSERVE, RANGES_FIXED, RANGES_LEARN };

/* qat's checks of its own flags after parsing: *fixed and *learn say which --ranges; --range-lr only with learn and > 0 (default: lr, written to *range_lr);
 * --freeze-ranges-after not with learn; --max-drop and --keep-fp32-samples only with --keep-fp32 auto;
 * the distillation settings when --teacher is given. Errors: BQ_EINVAL naming the flag. */
static int qat_check_flags(const BqArgs *args, int ranges, double *range_lr, int64_t freeze_after, double lr,
                           const char *keep_fp32, const char *teacher_dir, const BqDistill *dist, int *fixed,
                           int *learn) {
    *fixed = ranges == RANGES_FIXED, *learn = ranges == RANGES_LEARN;
    if (bq_args_given(args, "range-lr") && !*learn)
        return bq_err(BQ_EINVAL, "--range-lr applies only with --ranges learn");
    if (*learn && bq_args_given(args, "range-lr") && !(*range_lr > 0.0))
        return bq_err(BQ_EINVAL, "--range-lr: must be > 0, got %g", *range_lr);
    if (*learn && freeze_after > 0)
        return bq_err(BQ_EINVAL, "--freeze-ranges-after applies to observed ranges, not --ranges learn");
    if (*learn && !bq_args_given(args, "range-lr")) *range_lr = lr;
    if ((bq_args_given(args, "max-drop") || bq_args_given(args, "keep-fp32-samples")) &&
        !(keep_fp32 && !strcmp(keep_fp32, "auto")))
        return bq_err(BQ_EINVAL, "--max-drop and --keep-fp32-samples apply only with --keep-fp32 auto");
    if (teacher_dir) return bq_distill_check_flags(dist->alpha, dist->temperature, dist->hidden_weight);
    return BQ_OK;
}

/* The ranges QAT starts from: an input whose quantizers are all calibrated keeps them (its config wins;
 * --freeze-ranges-after still applies), else m is calibrated over strain as `calibrate` does. Then the
 * fp32 fallback --keep-fp32: from an fp32 input as calibrate does; a PTQ input keeps its recorded list
 * and these modules are added to it (their quantizers removed, every other range kept). Errors: those
 * of calibration and of the fallback. */
static int qat_start_ranges(BqBert *m, int calibrated, const BqQuantConfig *qcfg, BqCalibrator method,
                            const QuantOpts *q, BqBatchSource *strain, const char *keep_fp32, BqCliData *d,
                            const BqTokenizer *tok, uint64_t seed, int batch_size, int keep_samples,
                            double max_drop) {
    int st;
    if (calibrated) {
        fprintf(stderr, "[qat] starting from the input's %d calibrated quantizers (scheme %s)\n", m->quant->n,
                bq_scheme_name(m->quant->cfg.scheme));
        m->quant->cfg.freeze_after = qcfg->freeze_after;
    } else if ((st = calibrate_model(m, qcfg, method, q->percentile, strain, q->calib_samples, "qat"))) {
        return st;
    }
    if (keep_fp32 && !strcmp(keep_fp32, "auto")) {
        if ((st = keep_fp32_auto(m, d, tok, seed, batch_size, keep_samples, max_drop, "qat")))
            return st;
    } else if (keep_fp32 && (st = bq_sens_exclude(m, keep_fp32, "--keep-fp32"))) {
        return st;
    }
    if (keep_fp32) fprintf(stderr, "[qat] exclude list (kept in fp32) \"%s\"\n", m->quant->cfg.exclude);
    return BQ_OK;
}

/* How the ranges move while QAT trains: fixed (frozen; the weights learn around them), observed
 * (moving-average observers, c = 0.01) or learned (observers off; each scale a parameter initialised
 * from its calibrated value, at range_lr). The quantizers' step count restarts at 0. */
static void qat_ranges_mode(BqQuantState *qs, int fixed, int learn, double range_lr) {
    bq_quant_freeze(qs, fixed || learn);
    qs->observe = !fixed && !learn;
    qs->steps_seen = 0;
    if (learn) { /* observers off; each scale a parameter, initialised from its calibrated value */
        bq_quant_learn_enable(qs, range_lr);
        fprintf(stderr, "[qat] ranges: learned (LSQ) from the calibrated scales, %lld scales, range lr %g\n",
                (long long)qs->nscales, range_lr);
    } else {
        bq_quant_learn_disable(qs); /* an input that learned its ranges keeps them as they are */
        fprintf(stderr, "[qat] ranges: %s\n", fixed ? "fixed (calibrated ranges, weights learn around them)"
                                                  : "moving-average observers (c = 0.01)");
    }
}

/* Loads qat's input model into m: a question-answering model with its SQuAD training windows in td
 * (sel's selection and batching, shuffled by seed; *strain = &td->src; --dropout applied), else the
 * model and its tokenizer (*tok). Errors: --teacher
 * or --keep-fp32 (teacher_dir, keep_fp32 given) with a question-answering model (BQ_EINVAL), those of
 * loading. */
static int qat_load_model(BqBert *m, BqTokenizer **tok, QaTrainData *td, BqBatchSource **strain, int is_qa,
                          const char *model, BqCliData *d, BqCliQa *qa, const BqCliSplits *sel, uint64_t seed,
                          const char *teacher_dir, const char *keep_fp32) {
    int st;
    if (is_qa && (teacher_dir || keep_fp32))
        return bq_err(BQ_EINVAL, "--%s: applies to sequence-classification models only", teacher_dir ? "teacher" : "keep-fp32");
    if (is_qa) {
        if ((st = qa_train_data(td, m, model, d, qa, sel->train_samples, sel->batch_size, seed, "qat"))) return st;
        if (sel->dropout >= 0) m->cfg.hidden_dropout_prob = m->cfg.attention_probs_dropout_prob = (float)sel->dropout;
        *strain = &td->src;
    } else if ((st = bq_cli_model_load(m, tok, model, 0, seed, "qat"))) {
        return st;
    }
    return BQ_OK;
}

int bq_cmd_qat(int argc, char **argv) {
    double range_lr = -1.0, max_drop = 0.5;
    const char *model = NULL, *out = NULL, *keep_fp32 = NULL, *teacher_dir = NULL;
    int keep_samples = 512, ranges = RANGES_OBSERVE;
    BqDistill dist = {.alpha = 0.5, .temperature = 2.0, .hidden_weight = 0.0};
    BqDistillRecord rec;
    BqBert teacher = {0};
    BqCliData d = BQ_CLI_DATA_INIT;
    BqTrainConfig tc;
    BqCliSplits sp;
    bq_cli_train_default(&tc, &sp, 2e-5);
    QuantOpts q;
    quant_opts_default(&q, BQ_CALIBRATOR_MAX);
    BqCliQa qa;
    bq_cli_qa_default(&qa);
    const BqArgSpec specs[] = {
        {"model", BQ_ARG_STR, &model, "fp32 or PTQ checkpoint (native) or Hugging Face directory", 1, 0, 0},
        {"data", BQ_ARG_STR, &d.path, "IMDB archive/folder, CSV, TSV or JSONL; question answering: SQuAD v1.1 JSON", 1,
         0, 0},
        {"out", BQ_ARG_OUT, &out, "output checkpoint directory (replaced atomically)", 1, 0, 0},
        QUANT_SPECS(q),
        {"freeze-ranges-after", BQ_ARG_I64, &q.cfg.freeze_after, "freeze every range after N optimizer steps (0: never)",
         0, 0, 1e9},
        {"ranges", BQ_ARG_ENUM, &ranges, "observe: moving-average min/max observers (ONNX Runtime example); fixed: the "
         "calibrated (or PTQ input's) ranges never move (pytorch-quantization); learn: every scale is trained from "
         "its calibrated value (LSQ, docs/quantization.md)", 0, 0, 0, RANGES_NAMES},
        {"range-lr", BQ_ARG_FLOAT, &range_lr, "--ranges learn: peak learning rate of the scales (AdamW, no weight "
         "decay, the --lr schedule; -1: the --lr value)", 0, -1, 1},
        {"keep-fp32", BQ_ARG_STR, &keep_fp32, "NAME,...: module prefixes left in fp32 (added to the exclude list, "
         "also of a PTQ input); auto: the most harmful groups until validation accuracy is within --max-drop of "
         "fp32", 0, 0, 0},
        {"max-drop", BQ_ARG_FLOAT, &max_drop, "--keep-fp32 auto: accuracy budget in percentage points", 0, 0, 100},
        {"keep-fp32-samples", BQ_ARG_INT, &keep_samples, "--keep-fp32 auto: validation examples measured", 0, 1,
         1e9},
        DISTILL_SPECS(teacher_dir, dist),
        BQ_CLI_TRAIN_SPECS(tc, sp),
        BQ_CLI_DATA_SPECS(d),
        BQ_CLI_TASK_SPEC(qa),
        BQ_CLI_QA_WINDOW_SPECS(qa),
    };
    BqArgs args = {.cmd = "qat", .usage = "--model DIR --data PATH --out DIR [options]",
                   .summary = "Quantization-aware fine-tuning with fake-quant modules and moving-average observers.",
                   .specs = specs, .nspecs = (int)(sizeof specs / sizeof *specs),
                   .common = BQ_ARGS_THREADS | BQ_ARGS_PRECISION};
    int st = bq_args_parse(&args, argc, argv);
    if (st || args.help) return st;
    if ((st = bq_check_writable_parent(out))) return st;

    BqTokenizer *tok = NULL;
    BqBert m = {0};
    BqCalibrator method = q.calibrator;
    const BqQuantConfig *qcfg = &q.cfg;
    BqTrainResult res;
    int fixed = 0, learn = 0;
    if ((st = qat_check_flags(&args, ranges, &range_lr, q.cfg.freeze_after, tc.lr, keep_fp32, teacher_dir, &dist, &fixed,
                              &learn)))
        return st;
    tc.vocab_dir = model;
    tc.tag = "qat";
    int is_qa = 0, distilling = 0;
    QaTrainData td = {0};
    BqBatchSource *strain = &sp.strain, *sval = NULL;
    if ((st = bq_cli_task_resolve(&args, &qa, model, &is_qa)) || (st = bq_cli_task_check_data(is_qa, d.path))) return st;
    bq_args_header(&args);
    if ((st = qat_load_model(&m, &tok, &td, &strain, is_qa, model, &d, &qa, &sp, tc.seed, teacher_dir, keep_fp32)))
        goto cleanup;
    if ((st = distill_setup(&args, &dist, &teacher, &rec, teacher_dir, &m, model, out, tc.resume, &distilling)))
        goto cleanup;
    /* Ranges: keep a calibrated input's (its config wins; --freeze-ranges-after still applies), else calibrate. */
    int calibrated = m.quant && bq_quant_count_initialized(m.quant) == m.quant->n;
    if (calibrated && (st = check_kept_quant_flags(&args, qcfg, &m.quant->cfg, model))) goto cleanup;
    if (!is_qa) {
        if ((st = bq_cli_splits_load(&sp, &m, model, &d, tc.seed, tok, "qat"))) goto cleanup;
        sval = sp.val ? &sp.sval : NULL;
        m.prec = args.prec; /* calibration runs in the training's precision */
    }
    if (distilling && (st = bq_distill_check_labels(&teacher, &m))) goto cleanup;
    if ((st = qat_start_ranges(&m, calibrated, qcfg, method, &q, strain, keep_fp32, &d, tok, tc.seed, sp.batch_size,
                               keep_samples, max_drop)))
        goto cleanup;
    qat_ranges_mode(m.quant, fixed, learn, range_lr);
    /* the trainer calls bq_quant_step after each optimizer step (freeze at --freeze-ranges-after) */
    tc.distill = distilling ? &dist : NULL;
    if ((st = bq_cli_train_run(&m, &tc, args.prec, strain, sval, &d, out, &res))) goto cleanup;
    printf("; %d quantizers (scheme %s)%s; checkpoint %s\n", m.quant->n, bq_scheme_name(m.quant->cfg.scheme),
           learn ? ", ranges learned" : m.quant->q[0].frozen ? ", frozen" : "", out);

cleanup:
    bq_cli_splits_free(&sp);
    qa_train_data_free(&td);
    if (tok) bq_tokenizer_free(tok);
    if (m.quant) bq_quant_free(m.quant), m.quant = NULL;
    bq_bert_free(&m);
    if (teacher.quant) bq_quant_free(teacher.quant), teacher.quant = NULL;
    bq_bert_free(&teacher);
    return st;
}

int bq_cmd_info(int argc, char **argv) {
    int all = 0;
    const BqArgSpec specs[] = {
        {"all", BQ_ARG_FLAG, &all, "also list every parameter tensor: name, shape, min, max, mean |x|", 0, 0, 0},
    };
    BqArgs args = {.cmd = "info", .usage = "[--all] CKPT",
                   .summary = "Print a checkpoint's config, training data settings, parameter count and every "
                              "quantizer.",
                   .specs = specs, .nspecs = 1, .max_positional = 1, .positional_name = "CKPT"};
    int st = bq_args_parse(&args, argc, argv);
    if (st || args.help) return st;
    if (args.npositional != 1) return bq_err(BQ_EINVAL, "info: expected one checkpoint directory");
    const char *dir = args.positional[0];
    BqBert m;
    memset(&m, 0, sizeof m);
    char *report = NULL;
    BqRng rng;
    bq_rng_seed(&rng, 42);
    if ((st = bq_model_load_any(&m, dir, 0, &rng, &report))) goto cleanup;
    const BqBertConfig *c = &m.cfg;
    printf("checkpoint   %s (%s)\n", dir, bq_ckpt_is_native(dir) ? "native" : "Hugging Face");
    printf("config       %s: layers %d, hidden %d, heads %d, intermediate %d, vocab %d, max positions %d, labels %d\n",
           c->head == BQ_HEAD_QA ? "BertForQuestionAnswering" : "BertForSequenceClassification",
           c->num_hidden_layers, c->hidden_size, c->num_attention_heads, c->intermediate_size, c->vocab_size,
           c->max_position_embeddings, c->num_labels);
    if (m.data.doc_stride > 0)
        printf("qa windows   max_seq_len %d, doc stride %d, question tokens <= %d\n", m.data.max_seq_len,
               m.data.doc_stride, m.data.max_query_length);
    if (m.data.max_seq_len > 0)
        printf("data         max_seq_len %d, truncation %s, text column %s, pair column %s, label column %s\n",
               m.data.max_seq_len, bq_truncation_name(m.data.truncation),
               m.data.text_column[0] ? m.data.text_column : "auto",
               m.data.text_pair_column[0] ? m.data.text_pair_column : "none",
               m.data.label_column[0] ? m.data.label_column : "auto");
    else
        printf("data         not recorded (eval/predict default to 128 tokens, head truncation)\n");
    printf("parameters   %lld in %d tensors\n", (long long)m.params.total, m.params.n);
    if (all) printf("  %-64s %12s %12s %12s %12s\n", "parameter", "shape", "min", "max", "mean |x|");
    for (int i = 0; all && i < m.params.n; i++) {
        const BqParam *p = &m.params.p[i];
        const float *x = m.params.data + p->offset;
        float lo = x[0], hi = x[0];
        double mean_abs = 0;
        for (int64_t k = 0; k < p->numel; k++) {
            lo = fminf(lo, x[k]);
            hi = fmaxf(hi, x[k]);
            mean_abs += fabs((double)x[k]);
        }
        char shape[48];
        if (p->ndim == 2) snprintf(shape, sizeof shape, "%lldx%lld", (long long)p->shape[0], (long long)p->shape[1]);
        else snprintf(shape, sizeof shape, "%lld", (long long)p->shape[0]);
        printf("  %-64s %12s %12.6g %12.6g %12.6g\n", p->name, shape, lo, hi, mean_abs / (double)p->numel);
    }
    if (!m.quant) {
        printf("quantization none (fp32)\n");
        goto cleanup;
    }
    const BqQuantConfig *qc = &m.quant->cfg;
    int wb = bq_quant_scheme_weight_bits(qc->scheme);
    printf("quantization scheme %s, int8 symmetric (zero point 0, scale = amax/127), weights %s%s%s", bq_scheme_name(qc->scheme),
           wb == 7 ? "int7 (scale = amax/63) " : "", qc->per_tensor_weights ? "per tensor" : "per channel",
           qc->fuse_qkv ? ", fused QKV" : "");
    if (qc->clip_gelu > 0) printf(", GELU clip %g", qc->clip_gelu);
    printf(", exclude \"%s\"; %d quantizers, %d with ranges\n", qc->exclude, m.quant->n,
           bq_quant_count_initialized(m.quant));
    if (qc->learn_ranges) printf("ranges       learned (--ranges learn, LSQ), range lr %g\n", qc->range_lr);
    printf("%-72s %-8s %5s %4s %12s %12s %12s %s\n", "quantizer", "granul.", "nch", "bits", "amax min", "amax max",
           "scale min", "state");
    for (int i = 0; i < m.quant->n; i++) {
        const BqQuantizer *q = &m.quant->q[i];
        float amin = FLT_MAX, amax = 0.0f, smin = FLT_MAX;
        for (int64_t k = 0; k < q->nch; k++) {
            amin = fminf(amin, q->amax[k]);
            amax = fmaxf(amax, q->amax[k]);
            smin = fminf(smin, q->scale[k]);
        }
        printf("%-72s %-8s %5lld %4d %12.6g %12.6g %12.6g %s\n", q->name, q->nch > 1 ? "channel" : "tensor",
               (long long)q->nch, q->bits, amin, amax, smin,
               !q->initialized ? "no range" : q->dscale ? "learned" : q->frozen ? "frozen" : "observing");
    }
cleanup:
    free(report);
    if (m.quant) bq_quant_free(m.quant), m.quant = NULL;
    bq_bert_free(&m);
    return st;
}
