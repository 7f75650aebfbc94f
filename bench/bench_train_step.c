/* Times full training steps of BertForSequenceClassification (or BertForQuestionAnswering) as `bertqat finetune` / `bertqat qat` run
 * them (bq_train_step, bq_train_apply of src/train.h): forward with tape, backward, global-norm
 * clipping, AdamW at a constant lr, gradient zeroing. The model is a
 * Hugging Face directory (--model, e.g. all-MiniLM-L6-v2) or, without --model, a randomly initialised
 * BERT-base-shaped model (12 layers, hidden 768, 12 heads, intermediate 3072). Batches are fixed,
 * random, full length (attention mask all ones), dropout as in the config (training mode).
 *
 *   bench_train_step [--model DIR] [--batch 32] [--seq 128] [--steps 5] [--warmup 1] [--threads 0]
 *                    [--qat] [--scheme ort|qdqbert|cpu] [--profile] [--precision fp32|bf16|auto]
 *                    [--infer | --infer-ops] [--fp32-linear] [--clock wall|cpu] [--task cls|qa]
 *
 * --task qa replaces the head by BertForQuestionAnswering's qa_outputs (as `finetune --task qa` does)
 * and gives every example a random answer span: the same step on SQuAD-shaped batches, for comparing
 * the two heads' tokens/s at the same sequence length.
 * --precision resolves as the CLI's flag does (autograd/bq.h bq_precision_resolve: auto is bf16 on a CPU
 * with AVX512-BF16 or AMX-BF16 and fp32 elsewhere, bf16 runs emulated on a CPU without bf16 units; a word
 * that is no precision is the CLI's one-line error and exit status 2). --infer times the forward alone
 * without a tape (evaluation mode, as `bertqat eval` runs it: bq_fp32_forward's fused layers, or fake
 * quant with --qat) and reports examples/s; --infer-ops times bq_bert_forward's op-by-op path instead.
 *
 * --qat adds the fake-quantized modules of the scheme with live moving-average observers, as `bertqat
 * qat` trains them. --fp32-linear runs its quantized Linears in fp32 on the fake-quantized values (the
 * forward before the integer GEMMs of layers/quant.h, bq_quant_linear) for comparison. --clock cpu times
 * process CPU time (every thread, spin-waits included) instead of wall time: on a loaded machine at
 * --threads 1 it says what a step costs rather than how long the scheduler let it wait. Prints one JSON line (read by bench/bench_train.py): median ms/step, tokens/s,
 * peak RSS, the BLAS runtime; --profile also prints per-op forward/backward milliseconds per step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autograd/bq.h"
#include "autograd/gemm.h"
#include "autograd/tensor.h"
#include "export/ckpt.h"
#include "layers/bert.h"
#include "layers/bert_fp32.h"
#include "layers/quant.h"
#include "src/train.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* CPU seconds of the whole process (all threads): on a loaded machine this, unlike the wall time, does
 * not count the time other jobs hold the cores. */
static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void base_config(BqBertConfig *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->vocab_size = 30522;
    cfg->hidden_size = 768;
    cfg->num_hidden_layers = 12;
    cfg->num_attention_heads = 12;
    cfg->intermediate_size = 3072;
    cfg->max_position_embeddings = 512;
    cfg->type_vocab_size = 2;
    cfg->pad_token_id = 0;
    cfg->layer_norm_eps = 1e-12f;
    cfg->hidden_dropout_prob = 0.1f;
    cfg->attention_probs_dropout_prob = 0.1f;
    cfg->classifier_dropout = -1.0f;
    cfg->initializer_range = 0.02f;
    cfg->num_labels = 2;
    cfg->id2label = bq_calloc(2, sizeof(char *));
    cfg->id2label[0] = bq_strdup("neg");
    cfg->id2label[1] = bq_strdup("pos");
}

static int usage(void) {
    fprintf(stderr, "usage: bench_train_step [--model DIR] [--batch B] [--seq T] [--steps N] [--warmup N] "
                    "[--threads N] [--qat] [--scheme ort|qdqbert|cpu] [--profile] [--precision P] [--infer | --infer-ops] "
                    "[--fp32-linear] [--clock wall|cpu] [--task cls|qa]\n");
    return 2;
}

int main(int argc, char **argv) {
    if (bq_runtime_boot(argc, argv) != BQ_OK) {
        fprintf(stderr, "bench_train_step: %s\n", bq_errmsg());
        return 1;
    }
    const char *model = NULL, *scheme = "ort", *precision = "auto";
    int B = 32, T = 128, steps = 5, warmup = 1, threads = 0, qat = 0, profile = 0, infer = 0, infer_ops = 0;
    int fp32_linear = 0, cpu_clock = 0, qa = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has = i + 1 < argc;
        if (!strcmp(a, "--model") && has) model = argv[++i];
        else if (!strcmp(a, "--batch") && has) B = atoi(argv[++i]);
        else if (!strcmp(a, "--seq") && has) T = atoi(argv[++i]);
        else if (!strcmp(a, "--steps") && has) steps = atoi(argv[++i]);
        else if (!strcmp(a, "--warmup") && has) warmup = atoi(argv[++i]);
        else if (!strcmp(a, "--threads") && has) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--scheme") && has) scheme = argv[++i];
        else if (!strcmp(a, "--qat")) qat = 1;
        else if (!strcmp(a, "--profile")) profile = 1;
        else if (!strcmp(a, "--infer")) infer = 1;
        else if (!strcmp(a, "--infer-ops")) infer = infer_ops = 1;
        else if (!strcmp(a, "--fp32-linear")) fp32_linear = 1;
        else if (!strcmp(a, "--clock") && has && (!strcmp(argv[i + 1], "wall") || !strcmp(argv[i + 1], "cpu")))
            cpu_clock = !strcmp(argv[++i], "cpu");
        else if (!strcmp(a, "--precision") && has) precision = argv[++i];
        else if (!strcmp(a, "--task") && has && (!strcmp(argv[i + 1], "cls") || !strcmp(argv[i + 1], "qa")))
            qa = !strcmp(argv[++i], "qa");
        else return usage();
    }
    if (B < 1 || T < 2 || steps < 1 || warmup < 0) return usage();
    bq_runtime_set_threads(threads);
    BqPrecision prec;
    if (bq_precision_resolve(precision, bq_cpu_features(), &prec, NULL)) {
        fprintf(stderr, "bench_train_step: %s\n", bq_errmsg());
        return 2;
    }

    BqBert m;
    memset(&m, 0, sizeof m);
    BqRng rng;
    bq_rng_seed(&rng, 1);
    char *report = NULL;
    int st;
    if (model) {
        st = bq_model_load_any(&m, model, 2, &rng, &report);
        free(report);
        if (!st) st = bq_bert_grad_alloc(&m); /* loaded models have none */
    } else {
        BqBertConfig cfg;
        base_config(&cfg);
        st = bq_bert_create(&m, &cfg, 1, &rng);
    }
    if (st) {
        fprintf(stderr, "bench_train_step: %s\n", bq_errmsg());
        return 1;
    }
    m.prec = prec;
    if (qa && (st = bq_bert_set_head(&m, BQ_HEAD_QA, &rng))) { /* qa_outputs on every token, as finetune --task qa */
        fprintf(stderr, "bench_train_step: %s\n", bq_errmsg());
        return 1;
    }
    if (T > m.cfg.max_position_embeddings) T = m.cfg.max_position_embeddings;
    if (qat) {
        BqQuantConfig qc;
        bq_quant_config_default(&qc);
        if (bq_scheme_parse(&qc.scheme, scheme, "--scheme") || bq_quant_create(&m.quant, &m, &qc)) {
            fprintf(stderr, "bench_train_step: %s\n", bq_errmsg());
            return 1;
        }
        m.quant->observe = 1; /* live moving-average observers; the first batch sets the ranges */
        m.quant->fp32_linear = fp32_linear;
    }

    BqBatch bt;
    memset(&bt, 0, sizeof bt);
    bt.B = B;
    bt.T = T;
    bt.input_ids = bq_malloc((size_t)B * (size_t)T * sizeof(int32_t));
    bt.token_type_ids = bq_calloc((size_t)B * (size_t)T, sizeof(int32_t));
    bt.attention_mask = bq_malloc((size_t)B * (size_t)T * sizeof(float));
    bt.labels = bq_malloc((size_t)B * sizeof(int32_t));
    for (int64_t i = 0; i < (int64_t)B * T; i++) {
        bt.input_ids[i] = 1000 + (int32_t)bq_rng_below(&rng, (uint64_t)(m.cfg.vocab_size - 1000));
        bt.attention_mask[i] = 1.0f;
    }
    for (int b = 0; b < B; b++) bt.labels[b] = (int32_t)bq_rng_below(&rng, 2);
    if (qa) { /* answer spans somewhere in the window, as SQuAD batches carry them */
        bt.start_positions = bq_malloc((size_t)B * sizeof(int32_t));
        bt.end_positions = bq_malloc((size_t)B * sizeof(int32_t));
        for (int b = 0; b < B; b++) {
            bt.start_positions[b] = (int32_t)bq_rng_below(&rng, (uint64_t)T);
            bt.end_positions[b] = bt.start_positions[b] + (int32_t)bq_rng_below(&rng, (uint64_t)(T - bt.start_positions[b]));
        }
    }

    BqArena act;
    BqTape tape;
    BqAdamW opt;
    BQ_CHECK(bq_arena_init(&act, (size_t)64 << 30, "act") == BQ_OK);
    BQ_CHECK(bq_tape_init(&tape, 4096) == BQ_OK);
    bq_adamw_init(&opt, m.params.total, 0.0f);
    /* The step of src/train.c at a constant lr 5e-5 (total_steps 0), clipping at 1.0. */
    BqTrainConfig tc;
    bq_train_config_default(&tc);
    tc.lr = 5e-5;
    tc.max_grad_norm = 1.0;
    BqTrainState ts = {.opt = &opt};
    double *times = bq_malloc(sizeof(double) * (size_t)steps), *ctimes = bq_malloc(sizeof(double) * (size_t)steps);
    float loss_v = 0;
    for (int s = 0; s < warmup + steps; s++) {
        if (s == warmup) {
            bq_profile_reset();
            bq_profile_enable(profile);
            bq_sections_reset();
            bq_sections_enable(profile);
        }
        BqCtx ctx = {.act = &act, .tape = &tape, .training = 1, .rng_key = bq_hash64(1, (uint64_t)s), .prec = m.prec};
        double t0 = bq_now(), c0 = cpu_now();
        bq_profile_mark();
        if (infer) { /* the evaluation forward: no tape, no dropout, activations rewound per batch */
            BqCtx ev = {.act = &act, .tape = NULL, .training = 0, .prec = m.prec};
            BqBertInput in = bq_batch_input(&bt);
            BqTensor *lg = NULL;
            if (infer_ops ? bq_bert_forward(&m, &ev, &in, &lg, NULL) : bq_fp32_forward(&m, &ev, &in, &lg)) {
                fprintf(stderr, "bench_train_step: %s\n", bq_errmsg());
                return 1;
            }
            loss_v = lg->data[0];
            bq_arena_rewind(&act, 0);
        } else if (bq_train_step(&m, &ctx, &bt, &ts, &loss_v, NULL) || bq_train_apply(&m, &tc, &ts, NULL, NULL)) {
            fprintf(stderr, "bench_train_step: %s\n", bq_errmsg());
            return 1;
        }
        double dt = bq_now() - t0, dc = cpu_now() - c0;
        if (s >= warmup) times[s - warmup] = cpu_clock ? dc : dt, ctimes[s - warmup] = dc;
    }
    bq_profile_enable(0);
    bq_sections_enable(0);
    double *sorted = bq_malloc(sizeof(double) * (size_t)steps);
    memcpy(sorted, times, sizeof(double) * (size_t)steps);
    qsort(sorted, (size_t)steps, sizeof(double), cmp_double);
    double ms = sorted[steps / 2] * 1e3;
    qsort(ctimes, (size_t)steps, sizeof(double), cmp_double);
    double cpu_ms = ctimes[steps / 2] * 1e3;
    if (profile) {
        const BqProfile *p = bq_profile_get();
        double tf = 0, tb = 0, tm = 0;
        fprintf(stderr, "%-14s %10s %10s %8s %10s\n", "op (per step)", "fwd ms", "bwd ms", "calls", "kept MiB");
        for (int op = 0; op < BQ_OP_COUNT; op++) {
            if (!p->fwd_n[op]) continue;
            fprintf(stderr, "%-14s %10.1f %10.1f %8lld %10.1f\n", bq_op_name((BqOp)op), p->fwd_s[op] * 1e3 / steps,
                    p->bwd_s[op] * 1e3 / steps, (long long)(p->fwd_n[op] / steps), p->fwd_bytes[op] / steps / 1048576.0);
            tf += p->fwd_s[op], tb += p->bwd_s[op], tm += p->fwd_bytes[op];
        }
        fprintf(stderr, "%-14s %10s %10s %8s %10.1f   (the forward's activations and saved state)\n", "kept", "", "",
                "", tm / steps / 1048576.0);
        fprintf(stderr, "%-14s %10.1f %10.1f   (step %.1f ms: the rest is clip + AdamW + zeroing)\n", "total",
                tf * 1e3 / steps, tb * 1e3 / steps, ms);
        fprintf(stderr, "%-14s %10s %8s   (wall time by section, every pass; bf16 convert is part of gemm bf16)\n",
                "section", "ms/step", "calls");
        for (int k = 0; k < BQ_SEC_COUNT; k++)
            if (bq_section_calls((BqSection)k))
                fprintf(stderr, "%-14s %10.1f %8lld\n", bq_section_name((BqSection)k),
                        bq_section_seconds((BqSection)k) * 1e3 / steps, (long long)(bq_section_calls((BqSection)k) / steps));
    }
    printf("{\"peer\": \"bertqat\", \"task\": \"%s\", \"model\": \"%s\", \"batch\": %d, \"seq\": %d, \"threads\": %d, \"qat\": %s, "
           "\"scheme\": \"%s\", \"linear\": \"%s\", \"clock\": \"%s\", \"mode\": \"%s\", \"precision\": \"%s\", \"ms_per_step\": %.3f, \"cpu_ms_per_step\": %.3f, \"cpu_ms_min_step\": %.3f, "
           "\"tokens_per_s\": %.1f, \"examples_per_s\": %.2f, \"peak_rss_mib\": %.1f, "
           "\"activation_peak_mib\": %.1f, \"loss\": %.6f, \"runtime\": \"%s\", \"cpu_bf16\": \"%s\", \"bf16_gemms\": \"%s\"}\n",
           qa ? "qa" : "cls", model ? model : "bert-base-shape", B, T, bq_runtime_threads(), qat ? "true" : "false",
           qat ? scheme : "", qat && fp32_linear ? "fp32" : qat ? "integer where quantized" : "fp32",
           cpu_clock ? "cpu" : "wall", infer ? "infer" : "train", bq_precision_name(prec), ms, cpu_ms, ctimes[0] * 1e3, (double)B * T / (ms / 1e3),
           (double)B / (ms / 1e3), (double)bq_peak_rss() / (1 << 20), (double)act.peak / (1 << 20), loss_v,
           bq_runtime_describe(), bq_cpu_bf16_describe(), bq_gemm_bf16_describe());
    free(times);
    free(ctimes);
    free(sorted);
    free(bt.input_ids);
    free(bt.token_type_ids);
    free(bt.attention_mask);
    free(bt.labels);
    free(bt.start_positions);
    free(bt.end_positions);
    bq_adamw_free(&opt);
    bq_tape_free(&tape);
    bq_arena_free(&act);
    if (m.quant) bq_quant_free(m.quant), m.quant = NULL;
    bq_bert_free(&m);
    return 0;
}
