/* The integer engine's passes between its GEMMs, each alone on synthetic data (autograd/infer_kernels.h):
 * the `cpu` scheme's GELU codes (bq_infer_gelu_quant on M × I accumulators), its residual LayerNorm with
 * codes (bq_infer_residual_layernorm on M × H) and its attention (bq_infer_attention, M/128 sequences of
 * 128 tokens, per head), at MiniLM's and BERT-base's widths, on one of the engine's blocks of M rows
 * (bq_fused_block_rows: 1,024 and 512). Prints the CPU, the kernel set the fused kernels
 * run on this CPU, the thread count, and per pass its best time over the rounds, in ns a value (µs a head
 * for the attention), with a checksum of the codes, which must not change with a change that keeps the
 * bits. The figures behind the per-pass timings of docs/quantization.md and docs/results.md.
 *
 * Usage: bench_passes [ROUNDS]   (default 100). Threads: BQ_THREADS (default every core). Inputs: sums
 * uniform in ±30,000 at scale 1e-4 (values in ±3), code scale 0.05, LayerNorm residual in [0, 1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "autograd/infer_kernels.h"
#include "layers/bert_fused.h"

/* FNV-1a over n bytes. */
static uint32_t checksum(const uint8_t *c, int64_t n) {
    uint32_t h = 2166136261u;
    for (int64_t i = 0; i < n; i++) h = (h ^ c[i]) * 16777619u;
    return h;
}

/* acc (n) uniform in ±30,000, comp zero, scale 1e-4 and bias b·(i mod 3) for the n2 columns. */
static void fill(int32_t *acc, int64_t n, int32_t *comp, float *scale, float *bias, int64_t n2, BqRng *rng) {
    for (int64_t i = 0; i < n; i++) acc[i] = (int32_t)bq_rng_below(rng, 60001) - 30000;
    for (int64_t i = 0; i < n2; i++) comp[i] = 0, scale[i] = 1e-4f, bias[i] = 0.01f * (float)(i % 3);
}

/* Best seconds of one pass over `rounds` runs; which: 0 GELU codes, 1 residual LayerNorm, 2 attention. */
static double time_pass(int which, int64_t M, int64_t H, int64_t I, int64_t NH, int rounds, uint32_t *sum, BqRng *rng) {
    const int64_t N = which == 0 ? I : which == 1 ? H : 3 * H, T = 128, B = M / T;
    int32_t *acc = bq_malloc(sizeof(int32_t) * (size_t)(M * N)), *comp = bq_malloc(sizeof(int32_t) * (size_t)N);
    float *scale = bq_malloc(sizeof(float) * (size_t)N), *bias = bq_malloc(sizeof(float) * (size_t)N);
    uint8_t *codes = bq_malloc((size_t)(M * (which == 0 ? I : H)));
    float *out = NULL, *resid = NULL, *lnw = NULL, *lnb = NULL, *scratch = NULL;
    fill(acc, M * N, comp, scale, bias, N, rng);
    if (which == 1) {
        out = bq_malloc(sizeof(float) * (size_t)(M * H)), resid = bq_malloc(sizeof(float) * (size_t)(M * H));
        lnw = bq_malloc(sizeof(float) * (size_t)H), lnb = bq_malloc(sizeof(float) * (size_t)H);
        for (int64_t i = 0; i < M * H; i++) resid[i] = (float)bq_rng_below(rng, 1000) * 1e-3f;
        for (int64_t i = 0; i < H; i++) lnw[i] = 1.0f + 0.01f * (float)(i % 5), lnb[i] = 0.02f * (float)(i % 7);
    }
    const int64_t nthr = bq_runtime_threads(), per = bq_infer_attention_scratch(T, H / NH);
    BqQkvSums sums;
    if (which == 2) {
        BQ_CHECK(posix_memalign((void **)&scratch, 64, sizeof(float) * (size_t)(nthr * per)) == 0);
        sums = bq_qkv_sums_fused(acc, comp, scale, bias, H);
    }
    double best = -1.0;
    for (int r = 0; r < rounds; r++) {
        const double t0 = bq_now();
        if (which == 0) bq_infer_gelu_quant(codes, acc, comp, scale, bias, 0.05f, M, I, I);
        if (which == 1)
            bq_infer_residual_layernorm(out, codes, acc, comp, scale, bias, resid, lnw, lnb, 1e-12f, 0.05f, M, H);
        if (which == 2) bq_infer_attention(codes, &sums, NULL, scratch, nthr, 0.125f, 0.05f, B, T, T, NH, H / NH, H);
        const double t = bq_now() - t0;
        if (best < 0.0 || t < best) best = t;
    }
    *sum = checksum(codes, M * (which == 0 ? I : H));
    free(acc), free(comp), free(scale), free(bias), free(codes), free(out), free(resid), free(lnw), free(lnb);
    free(scratch);
    return best;
}

int main(int argc, char **argv) {
    int rounds = 100;
    if (argc > 1) {
        char *end = NULL;
        const long v = strtol(argv[1], &end, 10);
        if (!end || *end || v < 1 || v > 100000) {
            fprintf(stderr, "bench_passes: rounds '%s' is not an integer in [1, 100000]\n", argv[1]);
            return 2;
        }
        rounds = (int)v;
    }
    if (bq_runtime_boot(argc, argv) != BQ_OK) {
        fprintf(stderr, "bench_passes: %s\n", bq_errmsg());
        return 1;
    }
    bq_runtime_set_threads(0); /* BQ_THREADS, else every core */
    char cpu[256];
    bq_cpu_model(cpu, sizeof cpu);
    printf("CPU: %s\nfused inference kernels: %s\nthreads: %d, best of %d rounds\n", cpu, bq_infer_describe(),
           bq_runtime_threads(), rounds);
    static const struct {
        const char *name;
        int64_t H, I, NH;
    } models[2] = {{"MiniLM", 384, 1536, 12}, {"BERT-base", 768, 3072, 12}};
    BqRng rng;
    bq_rng_seed(&rng, 3);
    for (int k = 0; k < 2; k++) {
        const int64_t H = models[k].H, I = models[k].I, NH = models[k].NH, M = bq_fused_block_rows(I);
        uint32_t sg, sl, sa;
        const double tg = time_pass(0, M, H, I, NH, rounds, &sg, &rng);
        const double tl = time_pass(1, M, H, I, NH, rounds, &sl, &rng);
        const double ta = time_pass(2, M, H, I, NH, rounds, &sa, &rng);
        printf("%-9s GELU codes %lldx%lld %.3f ns a value (%08x); residual LayerNorm %lldx%lld %.3f ns a value "
               "(%08x); attention %lld sequences x %lld heads of %lld %.2f us a head (%08x)\n",
               models[k].name, (long long)M, (long long)I, tg * 1e9 / (double)(M * I), sg, (long long)M,
               (long long)H, tl * 1e9 / (double)(M * H), sl, (long long)(M / 128), (long long)NH,
               (long long)(H / NH), ta * 1e6 / (double)(M / 128 * NH), sa);
    }
    return 0;
}
