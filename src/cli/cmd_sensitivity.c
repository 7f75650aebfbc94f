/* `bertqat sensitivity`: per-group quantization sensitivity of a calibrated (PTQ or QAT) checkpoint
 * (src/sensitivity.h): for each group of quantizers (one Hugging Face module's), the accuracy and the
 * mean KL(fp32 ‖ quantized) of the class softmax with only that group quantized and with only that
 * group left in fp32, on the first --samples examples of a labelled split. Prints the ten most harmful
 * groups and writes OUT/sensitivity.json and OUT/sensitivity.svg (horizontal bars sorted by harm),
 * each atomically. docs/quantization.md ("Sensitivity and fp32 fallback") describes the use. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "autograd/bq.h"
#include "datasets/dataset.h"
#include "layers/config.h"
#include "src/cli/args.h"
#include "src/cli/cli.h"
#include "src/cli/cmd_common.h"
#include "src/dist.h"
#include "src/sensitivity.h"

/* The group name without the "bert.encoder." / "bert." prefix, for tables and chart labels. */
static const char *short_name(const char *name) {
    if (!strncmp(name, "bert.encoder.", 13)) return name + 13;
    if (!strncmp(name, "bert.", 5)) return name + 5;
    return name;
}

static int write_json(const BqSensitivity *s, const int *order, const char *path, const char *model,
                      const char *data, const char *split, double secs) {
    json_t *j = json_object(), *groups = json_array();
    json_object_set_new(j, "model", json_string(model));
    json_object_set_new(j, "data", json_string(data));
    json_object_set_new(j, "split", json_string(split));
    json_object_set_new(j, "examples", json_integer(s->n));
    json_object_set_new(j, "scheme", json_string(bq_scheme_name(s->m->quant->cfg.scheme)));
    json_object_set_new(j, "quantizers", json_integer(s->m->quant->n));
    json_object_set_new(j, "threads", json_integer(bq_runtime_threads()));
    json_object_set_new(j, "precision", json_string(bq_precision_name(s->m->prec)));
    json_object_set_new(j, "seconds", json_real(secs));
    json_object_set_new(j, "batch_forwards", json_integer(s->forwards));
    json_object_set_new(j, "linears_reused", json_integer(s->reused));
    json_object_set_new(j, "accuracy_fp32", json_real(s->acc_fp32));
    json_object_set_new(j, "accuracy_quantized", json_real(s->acc_quant));
    json_object_set_new(j, "kl_quantized", json_real(s->kl_quant));
    for (int r = 0; r < s->ng; r++) {
        const BqSensGroup *g = &s->g[order[r]];
        json_t *o = json_object(), *qn = json_array();
        json_object_set_new(o, "group", json_string(g->name));
        json_object_set_new(o, "rank", json_integer(r + 1));
        for (int k = 0; k < g->n; k++) json_array_append_new(qn, json_string(s->m->quant->q[g->q[k]].name));
        json_object_set_new(o, "quantizers", qn);
        json_object_set_new(o, "exclude", json_string(g->exclude));
        json_object_set_new(o, "only_quantized_accuracy", json_real(g->acc_only));
        json_object_set_new(o, "only_quantized_drop_points", json_real((s->acc_fp32 - g->acc_only) * 100.0));
        json_object_set_new(o, "only_quantized_kl", json_real(g->kl_only));
        json_object_set_new(o, "only_fp32_accuracy", json_real(g->acc_without));
        json_object_set_new(o, "only_fp32_kl", json_real(g->kl_without));
        json_array_append_new(groups, o);
    }
    json_object_set_new(j, "groups", groups);
    const int st = bq_json_save(j, path, JSON_INDENT(1));
    json_decref(j);
    return st;
}

/* Horizontal bars sorted by harm: the accuracy drop (points) with only the group quantized, and the
 * mean KL beside it, one row per group. */
static int write_svg(const BqSensitivity *s, const int *order, const char *path, const char *model) {
    int st = BQ_OK;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return bq_err(BQ_EIO, "%s: cannot create: %s", tmp, strerror(errno));
    const int label_w = 330, bar_w = 300, gap = 60, row_h = 18, top = 70;
    const int W = label_w + 2 * bar_w + gap + 40, H = top + s->ng * row_h + 40;
    double dmin = 0.0, dmax = 0.0, kmax = 0.0;
    for (int k = 0; k < s->ng; k++) {
        double d = (s->acc_fp32 - s->g[k].acc_only) * 100.0;
        dmin = d < dmin ? d : dmin;
        dmax = d > dmax ? d : dmax;
        kmax = s->g[k].kl_only > kmax ? s->g[k].kl_only : kmax;
    }
    if (dmax - dmin < 1e-9) dmax = dmin + 1.0;
    if (kmax <= 0.0) kmax = 1.0;
    const double x0 = label_w + bar_w * (-dmin / (dmax - dmin)); /* zero of the drop axis */
    const int kx = label_w + bar_w + gap;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"monospace\" "
            "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", W, H);
    fprintf(f, "<text x=\"10\" y=\"20\" font-size=\"14\">Quantization sensitivity: %lld examples, fp32 %.4f, "
            "all quantized %.4f</text>\n<text x=\"10\" y=\"36\" font-size=\"10\">", (long long)s->n, s->acc_fp32,
            s->acc_quant);
    for (const char *c = model; *c; c++) { /* the checkpoint path, XML-escaped */
        if (*c == '&') fputs("&amp;", f);
        else if (*c == '<') fputs("&lt;", f);
        else if (*c == '>') fputs("&gt;", f);
        else fputc(*c, f);
    }
    fprintf(f, "</text>\n<text x=\"%d\" y=\"52\">accuracy drop, points</text>\n", label_w);
    fprintf(f, "<text x=\"%d\" y=\"52\">mean KL(fp32 || quantized)</text>\n", kx);
    fprintf(f, "<text x=\"10\" y=\"52\" font-size=\"10\">group (only it quantized), most harmful first</text>\n");
    fprintf(f, "<text x=\"%d\" y=\"64\" font-size=\"10\">%.3g</text><text x=\"%d\" y=\"64\" font-size=\"10\" "
            "text-anchor=\"end\">%.3g</text>\n", label_w, dmin, label_w + bar_w, dmax);
    fprintf(f, "<text x=\"%d\" y=\"64\" font-size=\"10\">0</text><text x=\"%d\" y=\"64\" font-size=\"10\" "
            "text-anchor=\"end\">%.3g</text>\n", kx, kx + bar_w, kmax);
    for (int r = 0; r < s->ng; r++) {
        const BqSensGroup *g = &s->g[order[r]];
        int y = top + r * row_h;
        double d = (s->acc_fp32 - g->acc_only) * 100.0;
        double xa = label_w + bar_w * ((d - dmin) / (dmax - dmin));
        double bx = d >= 0 ? x0 : xa, bw = d >= 0 ? xa - x0 : x0 - xa;
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>\n", label_w - 8, y + 13,
                short_name(g->name));
        fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\"/>\n", bx, y + 3,
                bw > 0.5 ? bw : 0.5, row_h - 5, d >= 0 ? "#c0392b" : "#27ae60");
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"#2c7fb8\"/>\n", kx, y + 3,
                bar_w * (g->kl_only / kmax) > 0.5 ? bar_w * (g->kl_only / kmax) : 0.5, row_h - 5);
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"black\"/>\n", x0, top, x0,
            top + s->ng * row_h);
    fprintf(f, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n</svg>\n", kx, top, kx,
            top + s->ng * row_h);
    if ((st = bq_fclose_written(f, tmp))) {
        remove(tmp);
        return st;
    }
    st = bq_rename_durable(tmp, path);
    return st;
}

/* The sensitivity scan needs a classifier with calibrated quantizers. Errors: BQ_EINVAL naming --model:
 * a question-answering model, an fp32 checkpoint, quantizers without ranges. */
static int check_model(const BqBert *m, const char *model) {
    if (m->cfg.head == BQ_HEAD_QA)
        return bq_err(BQ_EINVAL, "--model %s: a question-answering model; the sensitivity scan scores classifiers", model);
    if (!m->quant)
        return bq_err(BQ_EINVAL, "--model %s: an fp32 checkpoint has no quantizers; calibrate it first "
                      "(bertqat calibrate)", model);
    if (bq_quant_count_initialized(m->quant) != m->quant->n)
        return bq_err(BQ_EINVAL, "--model %s: quantizers without ranges; calibrate it first", model);
    return BQ_OK;
}

/* The scan's summary on stdout: what was measured, the reference accuracies and the ten most harmful
 * groups (order: bq_sens_order). */
static void print_summary(const BqSensitivity *s, const int *order, const char *split, const char *scheme,
                          double secs) {
    printf("sensitivity: %lld %s examples, scheme %s, %d groups, %.1fs (%d threads; %lld batch forwards, %lld "
           "Linear products reused)\n", (long long)s->n, split, scheme, s->ng, secs,
           bq_runtime_threads(), (long long)s->forwards, (long long)s->reused);
    printf("accuracy: fp32 %.4f, all quantized %.4f (mean KL %.4g)\n", s->acc_fp32, s->acc_quant, s->kl_quant);
    printf("%4s  %-44s %12s %10s %12s %10s\n", "rank", "group (most harmful first)", "only int8", "KL", "only fp32",
           "KL");
    for (int r = 0; r < s->ng && r < 10; r++) {
        const BqSensGroup *g = &s->g[order[r]];
        printf("%4d  %-44s %12.4f %10.4g %12.4f %10.4g\n", r + 1, short_name(g->name), g->acc_only, g->kl_only,
               g->acc_without, g->kl_without);
    }
}

int bq_cmd_sensitivity(int argc, char **argv) {
    const char *model = NULL, *out = ".", *split = "val";
    int samples = 512, batch_size = 32, seed = 42, no_cache = 0;
    double val_fraction = 0.1;
    BqCliData d = BQ_CLI_DATA_INIT;
    const BqArgSpec specs[] = {
        {"model", BQ_ARG_STR, &model, "calibrated (PTQ) or QAT checkpoint", 1, 0, 0},
        {"data", BQ_ARG_STR, &d.path, "IMDB archive/folder, CSV, TSV or JSONL", 1, 0, 0},
        {"samples", BQ_ARG_INT, &samples, "examples measured (the first of the split; 0: all)", 0, 0, 1e9},
        {"split", BQ_ARG_STR, &split, "val (as in finetune, --val-fraction) or test", 0, 0, 0},
        {"val-fraction", BQ_ARG_FLOAT, &val_fraction, "for --split val: as in finetune", 0, 0.001, 0.9},
        {"seed", BQ_ARG_INT, &seed, "seed of the split selection (as in finetune)", 0, 0, 2147483647},
        {"batch-size", BQ_ARG_INT, &batch_size, "examples per forward", 0, 1, 65536},
        {"out", BQ_ARG_STR, &out, "folder for sensitivity.json and sensitivity.svg (created)", 0, 0, 0},
        {"no-prefix-cache", BQ_ARG_FLAG, &no_cache, "run every pass from the embeddings and compute every Linear "
         "(same results, slower; for timing)", 0, 0, 0},
        BQ_CLI_DATA_SPECS(d),
    };
    BqArgs args = {.cmd = "sensitivity", .usage = "--model CKPT --data PATH [options]",
                   .summary = "Accuracy and KL against fp32 with one quantizer group quantized (or left fp32) at a "
                              "time.",
                   .specs = specs, .nspecs = (int)(sizeof specs / sizeof *specs),
                   .common = BQ_ARGS_THREADS | BQ_ARGS_PRECISION};
    int st = bq_args_parse(&args, argc, argv);
    if (st || args.help) return st;
    if (strcmp(split, "val") && strcmp(split, "test"))
        return bq_err(BQ_EINVAL, "--split: '%s' is not val or test", split);
    if (bq_dist_rank() == 0 && (st = bq_mkdir_p(out))) return bq_err_ctx(st, "--out"); /* rank 0 writes */

    BqTokenizer *tok = NULL;
    BqDataset *ds = NULL;
    BqBatcher bt = {0};
    BqSensitivity s;
    memset(&s, 0, sizeof s);
    int *order = NULL;
    BqBert m;
    memset(&m, 0, sizeof m);
    char path[4096];
    bq_args_header(&args);
    if ((st = bq_cli_model_load(&m, &tok, model, 0, (uint64_t)seed, "sensitivity"))) goto cleanup;
    m.prec = args.prec;
    if ((st = check_model(&m, model))) goto cleanup;
    if ((st = bq_cli_data_resolve(&d, &m, "sensitivity"))) goto cleanup;
    BqDataSpec spec;
    bq_cli_data_spec(&spec, &d, split, (uint64_t)seed);
    if (!strcmp(split, "test")) spec.eval_samples = samples;
    else spec.val_fraction = val_fraction;
    if ((st = bq_dataset_load(&ds, &spec, tok))) goto cleanup;
    if ((st = bq_batcher_init(&bt, ds, batch_size, 0, (uint64_t)seed, 0))) goto cleanup;
    double t0 = bq_now();
    if ((st = bq_sens_init(&s, &m, &bt, samples))) goto cleanup;
    if (no_cache) s.prefix_cache = 0;
    fprintf(stderr, "[sensitivity] per-batch cache: %s\n",
            !s.prefix_cache ? (no_cache ? "off (--no-prefix-cache)" : "off (it would exceed 3 GiB)")
            : s.reuse_linears ? "on (each group's passes start at its first layer and reuse the Linears there "
                                "that its quantizers cannot reach)"
                              : "layer outputs only (each group's passes start at its first layer; the Linear "
                                "outputs would exceed 3 GiB)");
    fprintf(stderr, "[sensitivity] %d groups of %d quantizers (scheme %s) on %lld %s examples\n", s.ng, m.quant->n,
            bq_scheme_name(m.quant->cfg.scheme), (long long)s.n, split);
    if ((st = bq_sens_run_groups(&s, 0))) goto cleanup;
    double secs = bq_now() - t0;
    bq_dist_sum_i64(&s.forwards, 1); /* under mpirun each rank counted its own batches */
    bq_dist_sum_i64(&s.reused, 1);
    order = bq_sens_order(&s);
    print_summary(&s, order, split, bq_scheme_name(m.quant->cfg.scheme), secs);
    if (bq_dist_rank() != 0) goto cleanup;
    snprintf(path, sizeof path, "%s/sensitivity.json", out);
    if ((st = write_json(&s, order, path, model, d.path, split, secs))) goto cleanup;
    snprintf(path, sizeof path, "%s/sensitivity.svg", out);
    if ((st = write_svg(&s, order, path, model))) goto cleanup;
    printf("wrote %s/sensitivity.json and %s/sensitivity.svg\n", out, out);
cleanup:
    free(order);
    bq_sens_free(&s);
    if (bt.ds) bq_batcher_free(&bt);
    if (ds) bq_dataset_free(ds);
    if (tok) bq_tokenizer_free(tok);
    if (m.quant) bq_quant_free(m.quant), m.quant = NULL;
    bq_bert_free(&m);
    return st;
}
