/* Latency of the fp32 forward (bq_bert_forward, no tape), the fake-quant forward and the int8 engine
 * (layers/bert_int8.h) on MiniLM-L6 shapes (hidden 384, 12 heads, intermediate 1536, 6 layers) or those of
 * any Hugging Face BERT directory, seq 128, batch 1 and 32, cpu scheme calibrated (max) on two random batches.
 *
 * Usage: bench_int8 [MODEL_DIR]   (default data/models/all-MiniLM-L6-v2 when present, else a randomly
 * initialised model of the same shapes; the BERT-base shape: the directory bench/make_random_bert.py
 * writes). Threads: BQ_THREADS (default all cores). Prints the CPU model,
 * oneDNN's ISA, the OpenBLAS kernel, the median latency of each path (paths alternate within each
 * round) and the ratios. BQ_SCHEME=ort|qdqbert quantizes in that scheme instead of cpu. BQ_SWEEP_ROWS=N
 * instead times the int8 forward at batch 32 for each block size of the fused layers
 * (bq_int8_set_step_rows), median of N rounds: the figure that sets BQ_FUSED_BLOCK_ROWS
 * (layers/bert_fused.h) on a new CPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "autograd/infer_kernels.h"
#include "autograd/qgemm.h"
#include "export/hf_load.h"
#include "layers/bert_int8.h"
#include "layers/quant.h"

enum { T = 128 };

static void fill_input(int32_t *ids, float *mask, int B, BqRng *rng, int vocab) {
    for (int i = 0; i < B * T; i++) {
        ids[i] = i % T == 0 ? 101 % vocab : 1000 + (int32_t)bq_rng_below(rng, (uint64_t)(vocab - 1000));
        mask[i] = 1.0f;
    }
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One forward; path 0 fp32, 1 fake quant, 2 int8. Returns seconds. */
static double run_path(int path, BqBert *m, BqQuantState *qs, BqInt8Engine *e, BqArena *act, const BqBertInput *in) {
    m->quant = path == 0 ? NULL : qs;
    BqCtx ctx = {.act = act};
    BqTensor *lg;
    double t0 = bq_now();
    int rc = path == 2 ? bq_int8_forward(e, m, &ctx, in, &lg) : bq_bert_forward(m, &ctx, in, &lg, NULL);
    double dt = bq_now() - t0;
    m->quant = qs;
    if (rc) {
        fprintf(stderr, "bench_int8: %s\n", bq_errmsg());
        exit(1);
    }
    bq_arena_rewind(act, 0);
    return dt;
}

/* Median seconds of each path over `reps` rounds after one warm-up round; the three paths alternate
 * within a round, so a change in machine load affects them alike. */
static void time_paths(double med[3], BqBert *m, BqQuantState *qs, BqInt8Engine *e, BqArena *act,
                       const BqBertInput *in, int reps) {
    double t[3][64];
    BQ_CHECK(reps <= 64);
    for (int r = -1; r < reps; r++)
        for (int p = 0; p < 3; p++) {
            double dt = run_path(p, m, qs, e, act, in);
            if (r >= 0) t[p][r] = dt;
        }
    for (int p = 0; p < 3; p++) {
        qsort(t[p], (size_t)reps, sizeof t[p][0], cmp_d);
        med[p] = t[p][reps / 2];
    }
}

/* The int8 engine's forward by section (autograd/bq.h), the mean of `reps` forwards. */
static void print_sections(BqBert *m, BqQuantState *qs, BqInt8Engine *e, BqArena *act, const BqBertInput *in,
                           int reps) {
    bq_sections_reset();
    bq_sections_enable(1);
    double t = 0.0;
    for (int r = 0; r < reps; r++) t += run_path(2, m, qs, e, act, in);
    bq_sections_enable(0);
    printf("       int8 forward %.2f ms by section:", t * 1e3 / reps);
    for (int k = 0; k < BQ_SEC_COUNT; k++)
        if (bq_section_calls((BqSection)k))
            printf(" %s %.2f", bq_section_name((BqSection)k), bq_section_seconds((BqSection)k) * 1e3 / reps);
    printf("\n");
}

/* The int8 forward at batch 32 for each block size of the fused layers (bq_int8_set_step_rows), the
 * sizes alternating within each round; median of `reps` rounds. The block bounds the int32 sums a GEMM
 * writes before its epilogue reads them back, so it sets how much of that round trip stays in cache. */
static void sweep_step_rows(BqBert *m, BqQuantState *qs, BqInt8Engine *e, BqArena *act, const BqBertInput *in,
                            int reps) {
    static const int64_t rows[] = {4096, 2048, 1024, 512, 256, 128};
    enum { NR = sizeof rows / sizeof rows[0] };
    double t[NR][64];
    BQ_CHECK(reps <= 64);
    for (int r = -1; r < reps; r++)
        for (int k = 0; k < NR; k++) {
            bq_int8_set_step_rows(e, rows[k]);
            double dt = run_path(2, m, qs, e, act, in);
            if (r >= 0) t[k][r] = dt;
        }
    bq_int8_set_step_rows(e, 0);
    printf("int8 forward, batch %d, by block rows (median of %d):", (int)in->B, reps);
    for (int k = 0; k < NR; k++) {
        qsort(t[k], (size_t)reps, sizeof t[k][0], cmp_d);
        printf(" %lld: %.2f ms", (long long)rows[k], t[k][reps / 2] * 1e3);
    }
    printf("\n");
}

int main(int argc, char **argv) {
    /* the OpenBLAS kernel bertqat picks (SkylakeX on AVX-512 CPUs) for the fp32 column, as in bertqat */
    if (bq_runtime_boot(argc, argv) != BQ_OK) {
        fprintf(stderr, "bench_int8: %s\n", bq_errmsg());
        return 1;
    }
    bq_runtime_set_threads(0);
    const char *dir = argc > 1 ? argv[1] : "data/models/all-MiniLM-L6-v2";
    struct stat sb;
    BqBert m;
    BqRng rng;
    bq_rng_seed(&rng, 1);
    char cpu[256];
    bq_cpu_model(cpu, sizeof cpu);
    const char *source;
    if (stat(dir, &sb) == 0) {
        char *report = NULL;
        if (bq_hf_load(&m, dir, 2, &rng, &report)) {
            fprintf(stderr, "bench_int8: %s\n", bq_errmsg());
            return 1;
        }
        free(report);
        source = dir;
    } else {
        BqBertConfig c = {.vocab_size = 30522, .hidden_size = 384, .num_hidden_layers = 6, .num_attention_heads = 12,
                          .intermediate_size = 1536, .max_position_embeddings = 512, .type_vocab_size = 2,
                          .layer_norm_eps = 1e-12f, .classifier_dropout = -1.0f, .initializer_range = 0.02f,
                          .num_labels = 2};
        c.id2label = bq_calloc(2, sizeof(char *));
        c.id2label[0] = bq_strdup("LABEL_0");
        c.id2label[1] = bq_strdup("LABEL_1");
        BQ_CHECK(bq_bert_create(&m, &c, 0, &rng) == BQ_OK);
        source = "random init (MiniLM-L6 shapes)";
    }
    BqQuantConfig qc;
    bq_quant_config_default(&qc);
    qc.scheme = BQ_SCHEME_CPU;
    if (getenv("BQ_SCHEME") && bq_scheme_parse(&qc.scheme, getenv("BQ_SCHEME"), "BQ_SCHEME")) {
        fprintf(stderr, "bench_int8: %s\n", bq_errmsg());
        return 1;
    }
    BQ_CHECK(bq_quant_create(&m.quant, &m, &qc) == BQ_OK);
    BqQuantState *qs = m.quant;

    static int32_t ids[32 * T];
    static float mask[32 * T];
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)8 << 30, "act") == BQ_OK);
    bq_quant_calib_begin(qs, BQ_CALIBRATOR_MAX);
    for (int i = 0; i < 2; i++) {
        fill_input(ids, mask, 8, &rng, m.cfg.vocab_size);
        BqBertInput in = {.B = 8, .T = T, .input_ids = ids, .attention_mask = mask};
        BqCtx ctx = {.act = &act};
        BqTensor *lg;
        BQ_CHECK(bq_bert_forward(&m, &ctx, &in, &lg, NULL) == BQ_OK);
        bq_arena_rewind(&act, 0);
    }
    BQ_CHECK(bq_quant_calib_finish(qs, BQ_CALIBRATOR_MAX, 0.0) == BQ_OK);
    BqInt8Engine *e = NULL;
    double tp = bq_now();
    if (bq_int8_prepare(&e, &m)) {
        fprintf(stderr, "bench_int8: %s\n", bq_errmsg());
        return 1;
    }
    tp = bq_now() - tp;

    printf("CPU: %s\n%s\nfused inference kernels: %s\n%s\n", cpu, bq_dnnl_describe(), bq_infer_describe(),
           bq_runtime_describe());
    printf("model: %s, %s scheme, %d integer Linears in %d GEMMs, packed in %.1f ms; seq %d\n", source,
           bq_scheme_name(qc.scheme), bq_int8_linear_count(e), bq_int8_gemm_count(e), tp * 1e3, T);
    printf("%6s %12s %12s %12s %10s %10s\n", "batch", "fp32 ms", "fakequant ms", "int8 ms", "fp32/int8",
           "fq/int8");
    if (getenv("BQ_SWEEP_ROWS")) { /* only the block-size sweep */
        fill_input(ids, mask, 32, &rng, m.cfg.vocab_size);
        BqBertInput in = {.B = 32, .T = T, .input_ids = ids, .attention_mask = mask};
        const int reps = atoi(getenv("BQ_SWEEP_ROWS"));
        sweep_step_rows(&m, qs, e, &act, &in, reps > 0 && reps <= 64 ? reps : 5);
        goto cleanup;
    }
    static const int batches[2] = {1, 32};
    for (int i = 0; i < 2; i++) {
        int B = batches[i], reps = B == 1 ? 21 : 5;
        fill_input(ids, mask, B, &rng, m.cfg.vocab_size);
        BqBertInput in = {.B = B, .T = T, .input_ids = ids, .attention_mask = mask};
        double med[3];
        time_paths(med, &m, qs, e, &act, &in, reps);
        double f = med[0], q = med[1], n = med[2];
        printf("%6d %12.2f %12.2f %12.2f %9.2fx %9.2fx\n", B, f * 1e3, q * 1e3, n * 1e3, f / n, q / n);
        print_sections(&m, qs, e, &act, &in, reps);
    }
    /* agreement on the last batch: int8 engine vs fake quant (same checkpoint), and fake quant vs fp32
     * for the scale of the quantization error itself */
    {
        BqBertInput in = {.B = 32, .T = T, .input_ids = ids, .attention_mask = mask};
        BqCtx ctx = {.act = &act};
        BqTensor *lf, *lq, *li;
        m.quant = NULL;
        BQ_CHECK(bq_bert_forward(&m, &ctx, &in, &lf, NULL) == BQ_OK);
        m.quant = qs;
        BQ_CHECK(bq_bert_forward(&m, &ctx, &in, &lq, NULL) == BQ_OK);
        BQ_CHECK(bq_int8_forward(e, &m, &ctx, &in, &li) == BQ_OK);
        const int C = m.cfg.num_labels;
        /* fake quant on each example alone: its own batch dependence (sgemm rounds rows differently
         * for different M), the reference scale for the int8-vs-fake-quant difference */
        double d_q1 = 0.0;
        for (int r = 0; r < 32; r++) {
            BqBertInput one = {.B = 1, .T = T, .input_ids = ids + r * T, .attention_mask = mask + r * T};
            BqTensor *l1;
            BQ_CHECK(bq_bert_forward(&m, &ctx, &one, &l1, NULL) == BQ_OK);
            for (int k = 0; k < C; k++) {
                double d = fabs((double)l1->data[k] - lq->data[r * C + k]);
                d_q1 = d > d_q1 ? d : d_q1;
            }
        }
        double d_iq = 0.0, d_qf = 0.0, ml = 0.0;
        int agree_iq = 0, agree_qf = 0;
        for (int r = 0; r < 32; r++) {
            int af = 0, aq = 0, ai = 0;
            for (int k = 0; k < C; k++) {
                const float f = lf->data[r * C + k], q = lq->data[r * C + k], i = li->data[r * C + k];
                d_iq = fabs((double)i - q) > d_iq ? fabs((double)i - q) : d_iq;
                d_qf = fabs((double)q - f) > d_qf ? fabs((double)q - f) : d_qf;
                ml = fabs((double)q) > ml ? fabs((double)q) : ml;
                if (f > lf->data[r * C + af]) af = k;
                if (q > lq->data[r * C + aq]) aq = k;
                if (i > li->data[r * C + ai]) ai = k;
            }
            agree_iq += ai == aq;
            agree_qf += aq == af;
        }
        printf("batch 32 logits (max |logit| %.3g): int8 vs fake quant max |d| %.3g, labels agree %d/32; fake "
               "quant batch 32 vs batch 1 max |d| %.3g; fake quant vs fp32 max |d| %.3g, labels agree %d/32\n", ml,
               d_iq, agree_iq, d_q1, d_qf, agree_qf);
        bq_arena_rewind(&act, 0);
    }
cleanup:
    bq_int8_free(e);
    bq_quant_free(qs);
    m.quant = NULL;
    bq_bert_free(&m);
    bq_arena_free(&act);
    bq_qgemm_cache_clear();
    return 0;
}
