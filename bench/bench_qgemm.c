/* The integer engine's GEMM rate by block rows: bq_qgemm_raw (autograd/qgemm.h, the call the fused layers
 * make: u8 activations × s8 weights in oneDNN's layout → s32) on the four GEMMs of one encoder layer of
 * all-MiniLM-L6-v2 (N×K: 1152×384 query/key/value, 384×384, 1536×384, 384×1536) and of BERT-base
 * (2304×768, 768×768, 3072×768, 768×3072), at M = 128 to 4,096 rows, with 8-bit weights where the CPU
 * sums them exactly (VNNI, AMX) and 7-bit ones elsewhere (the cpu scheme's). Prints the CPU, oneDNN's ISA, and
 * per model and M the four GEMMs' combined rate (their 2·M·N·K operations over their summed best time)
 * and each one's. The figure behind the block size of the fused layers (BQ_FUSED_BLOCK_ROWS,
 * layers/bert_fused.h) on a new CPU, beside bench_int8's BQ_SWEEP_ROWS sweep of the whole forward. Then,
 * per model and M, the query/key/value product whole and in 3 column pieces and the intermediate dense
 * whole and in 4 (BQ_INT8_PIECE_MACS, layers/bert_int8.h): what the pieces cost in GEMM calls.
 *
 * Usage: bench_qgemm [ROWS...]   (default 128 256 512 1024 4096). Threads: BQ_THREADS (default all
 * cores). Each GEMM runs until about 0.2 s have passed, best of 3 such runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "autograd/qgemm.h"

/* Best seconds of bq_qgemm_raw on (M,K)·(K,N) as np GEMMs of N/np columns each (np 1: one GEMM; the
 * integer engine's column pieces, layers/bert_int8.h), one after the other into one (M, N/np) buffer, or
 * a negative value on error (message printed). */
static double time_gemm(int64_t M, int64_t N, int64_t K, int np, BqRng *rng) {
    const int64_t pn = N / np;
    int8_t *qw = bq_malloc((size_t)(pn * K));
    uint8_t *x = bq_malloc((size_t)(M * K));
    int32_t *acc = bq_malloc(sizeof(int32_t) * (size_t)(M * pn));
    float sw = 0.01f;
    double best = -1.0;
    BqQGemmWeights *w[4] = {NULL, NULL, NULL, NULL};
    BQ_CHECK(np >= 1 && np <= 4 && pn * np == N);
    /* 8-bit weights where oneDNN sums u8·s8 exactly (VNNI, AMX), else the 7-bit weights the cpu scheme
     * gives there (the same kernels either way) */
    const int bits = bq_qgemm_exact_8bit() ? 8 : 7, half = (1 << (bits - 1)) - 1;
    for (int64_t i = 0; i < M * K; i++) x[i] = (uint8_t)bq_rng_below(rng, 256);
    for (int c = 0; c < np; c++) {
        for (int64_t i = 0; i < pn * K; i++)
            qw[i] = (int8_t)((int64_t)bq_rng_below(rng, (uint64_t)(2 * half + 1)) - half);
        if (bq_qgemm_weights_create(&w[c], qw, &sw, 1, pn, K, bits, "bench") != BQ_OK ||
            bq_qgemm_raw(w[c], x, M, acc) != BQ_OK) { /* the first call packs the weights */
            fprintf(stderr, "bench_qgemm: %s\n", bq_errmsg());
            goto cleanup;
        }
    }
    for (int run = 0; run < 3; run++) {
        int64_t calls = 0;
        const double t0 = bq_now();
        double t = t0;
        while (t - t0 < 0.2) {
            for (int c = 0; c < np; c++)
                if (bq_qgemm_raw(w[c], x, M, acc) != BQ_OK) {
                    fprintf(stderr, "bench_qgemm: %s\n", bq_errmsg());
                    best = -1.0;
                    goto cleanup;
                }
            calls++;
            t = bq_now();
        }
        const double per = (t - t0) / (double)calls;
        if (best < 0.0 || per < best) best = per;
    }
cleanup:
    for (int c = 0; c < np; c++) bq_qgemm_weights_free(w[c]);
    free(qw), free(x), free(acc);
    return best;
}

int main(int argc, char **argv) {
    static const int64_t shapes[2][4][2] = {{{1152, 384}, {384, 384}, {1536, 384}, {384, 1536}},
                                            {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}}};
    static const char *names[2] = {"MiniLM", "BERT-base"};
    int64_t rows[16] = {128, 256, 512, 1024, 4096};
    int nrows = 5;
    if (argc > 1) {
        nrows = 0;
        for (int i = 1; i < argc && nrows < 16; i++) {
            char *end = NULL;
            const long v = strtol(argv[i], &end, 10);
            if (!end || *end || v < 1 || v > 65536) {
                fprintf(stderr, "bench_qgemm: rows '%s' is not an integer in [1, 65536]\n", argv[i]);
                return 2;
            }
            rows[nrows++] = v;
        }
    }
    if (bq_runtime_boot(argc, argv) != BQ_OK) {
        fprintf(stderr, "bench_qgemm: %s\n", bq_errmsg());
        return 1;
    }
    bq_runtime_set_threads(0); /* BQ_THREADS, else every core */
    char cpu[256];
    bq_cpu_model(cpu, sizeof cpu);
    printf("CPU: %s\n%s\nthreads: %d\n", cpu, bq_dnnl_describe(), bq_runtime_threads());
    BqRng rng;
    bq_rng_seed(&rng, 7);
    for (int m = 0; m < 2; m++)
        for (int r = 0; r < nrows; r++) {
            double ops = 0.0, secs = 0.0, rate[4];
            for (int g = 0; g < 4; g++) {
                const int64_t N = shapes[m][g][0], K = shapes[m][g][1];
                const double t = time_gemm(rows[r], N, K, 1, &rng);
                if (t < 0.0) return 1;
                const double op = 2.0 * (double)rows[r] * (double)N * (double)K;
                ops += op, secs += t, rate[g] = op / t * 1e-9;
            }
            printf("%-9s M=%5lld  layer GEMMs %7.0f GOP/s  (%lldx%lld %.0f, %lldx%lld %.0f, %lldx%lld %.0f, "
                   "%lldx%lld %.0f)\n",
                   names[m], (long long)rows[r], ops / secs * 1e-9, (long long)shapes[m][0][0],
                   (long long)shapes[m][0][1], rate[0], (long long)shapes[m][1][0], (long long)shapes[m][1][1],
                   rate[1], (long long)shapes[m][2][0], (long long)shapes[m][2][1], rate[2],
                   (long long)shapes[m][3][0], (long long)shapes[m][3][1], rate[3]);
            /* the query/key/value product in 3 pieces and the intermediate in 4, whole for comparison */
            const double q1 = time_gemm(rows[r], shapes[m][0][0], shapes[m][0][1], 1, &rng),
                         q3 = time_gemm(rows[r], shapes[m][0][0], shapes[m][0][1], 3, &rng),
                         i1 = time_gemm(rows[r], shapes[m][2][0], shapes[m][2][1], 1, &rng),
                         i4 = time_gemm(rows[r], shapes[m][2][0], shapes[m][2][1], 4, &rng);
            if (q1 < 0.0 || q3 < 0.0 || i1 < 0.0 || i4 < 0.0) return 1;
            printf("%-9s M=%5lld  pieces: query/key/value whole %.1f us, in 3 %.1f us (%+.1f %%); intermediate whole "
                   "%.1f us, in 4 %.1f us (%+.1f %%)\n",
                   names[m], (long long)rows[r], q1 * 1e6, q3 * 1e6, (q3 / q1 - 1.0) * 100.0, i1 * 1e6, i4 * 1e6,
                   (i4 / i1 - 1.0) * 100.0);
        }
    return 0;
}
