/* Benchmark of the linear op (forward + backward through bq_op_linear and bq_backward) at BERT-base
 * shapes, N = 4096 rows (batch 32 × seq 128): 768→768, 768→3072, 3072→768. Prints achieved GFLOP/s
 * (6·N·C·OC per forward+backward) and the fraction of the GFLOP/s of the same three plain cblas_sgemm
 * calls measured in the same run. Also times the attention ops (scores + context, forward + backward)
 * at B=32, T=128, NH=12, d=32 and d=64: one sgemm per head on strided views (the implementation)
 * against an OpenMP-over-(b,h) loop kernel, to justify the choice.
 * Usage: bench_linear [reps]   (default 3; best of reps is reported) */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/kernels.h"
#include "autograd/tensor.h"

static void fill(float *v, int64_t n, uint64_t seed) {
    BqRng r;
    bq_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) v[i] = (float)bq_rng_uniform(&r) - 0.5f;
}

/* The alternative to sgemm-per-head: OpenMP over (b,h), dot products over d. */
static void scores_omp(float *s, const float *q, const float *k, int64_t B, int64_t T, int64_t NH, int64_t d) {
    int64_t H = NH * d;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < T; i++) {
                const float *qi = q + (b * T + i) * H + h * d;
                float *si = s + ((b * NH + h) * T + i) * T;
                for (int64_t j = 0; j < T; j++) {
                    const float *kj = k + (b * T + j) * H + h * d;
                    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                    for (int64_t e = 0; e < d; e++) acc += qi[e] * kj[e];
                    si[j] = acc;
                }
            }
}

int main(int argc, char **argv) {
    if (bq_runtime_boot(argc, argv) != BQ_OK) {
        fprintf(stderr, "bench_linear: %s\n", bq_errmsg());
        return 1;
    }
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    if (reps < 1) reps = 1;
    printf("%s\n", bq_runtime_describe());
    const int64_t N = 4096;
    const int64_t shapes[3][2] = {{768, 768}, {768, 3072}, {3072, 768}};
    BqArena act;
    if (bq_arena_init(&act, (size_t)1 << 32, "bench") != BQ_OK) return 1;
    BqTape tape;
    bq_tape_init(&tape, 16);
    double tot_op = 0, tot_blas = 0, tot_flop = 0;
    for (int si = 0; si < 3; si++) {
        int64_t C = shapes[si][0], OC = shapes[si][1];
        float *x = bq_malloc((size_t)(N * C) * sizeof(float)), *w = bq_malloc((size_t)(OC * C) * sizeof(float));
        float *b = bq_malloc((size_t)OC * sizeof(float)), *gw = bq_calloc((size_t)(OC * C), sizeof(float));
        float *gb = bq_calloc((size_t)OC, sizeof(float)), *gx = bq_calloc((size_t)(N * C), sizeof(float));
        float *y = bq_malloc((size_t)(N * OC) * sizeof(float)), *dy = bq_malloc((size_t)(N * OC) * sizeof(float));
        fill(x, N * C, 1), fill(w, OC * C, 2), fill(b, OC, 3), fill(dy, N * OC, 4);
        double flop = 6.0 * (double)N * (double)C * (double)OC;
        double best_op = 1e30, best_blas = 1e30;
        for (int r = 0; r < reps; r++) {
            /* the op path: wrap, record, backward from a seeded output gradient */
            BqCtx ctx = {.act = &act, .tape = &tape};
            int64_t xs[2] = {N, C}, ws[2] = {OC, C}, bs[1] = {OC};
            BqTensor X = bq_tensor_wrap(x, gx, 2, xs), W = bq_tensor_wrap(w, gw, 2, ws), Bv = bq_tensor_wrap(b, gb, 1, bs);
            double t0 = bq_now();
            BqTensor *Y = bq_op_linear(&ctx, &X, &W, &Bv);
            memcpy(Y->grad, dy, (size_t)(N * OC) * sizeof(float));
            float dd = 0, dg = 0;
            int64_t one = 1;
            BqTensor seed = bq_tensor_wrap(&dd, &dg, 1, &one);
            bq_backward(&ctx, &seed);
            double t1 = bq_now();
            bq_tape_rewind(&tape);
            bq_arena_rewind(&act, 0);
            if (t1 - t0 < best_op) best_op = t1 - t0;
            /* plain sgemm: the same three products */
            t0 = bq_now();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)OC, (int)C, 1.0f, x, (int)C, w, (int)C,
                        0.0f, y, (int)OC);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)C, (int)OC, 1.0f, dy, (int)OC, w,
                        (int)C, 1.0f, gx, (int)C);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)OC, (int)C, (int)N, 1.0f, dy, (int)OC, x,
                        (int)C, 1.0f, gw, (int)C);
            t1 = bq_now();
            if (t1 - t0 < best_blas) best_blas = t1 - t0;
        }
        double g_op = flop / best_op * 1e-9, g_blas = flop / best_blas * 1e-9;
        printf("linear %4lldx%-4lld -> %-4lld fwd+bwd: op %7.2f ms %6.1f GFLOP/s | plain sgemm %7.2f ms %6.1f GFLOP/s "
               "| op/sgemm %.3f\n",
               (long long)N, (long long)C, (long long)OC, best_op * 1e3, g_op, best_blas * 1e3, g_blas, g_op / g_blas);
        tot_op += best_op, tot_blas += best_blas, tot_flop += flop;
        free(x), free(w), free(b), free(gw), free(gb), free(gx), free(y), free(dy);
    }
    printf("linear all three shapes: op %.1f GFLOP/s, plain sgemm %.1f GFLOP/s, fraction %.3f\n",
           tot_flop / tot_op * 1e-9, tot_flop / tot_blas * 1e-9, tot_blas / tot_op);

    /* attention at BERT shapes */
    const int64_t B = 32, T = 128, NH = 12;
    for (int64_t d = 32; d <= 64; d *= 2) {
        int64_t H = NH * d, nq = B * T * H, ns = B * NH * T * T;
        float *q = bq_malloc((size_t)nq * sizeof(float)), *k = bq_malloc((size_t)nq * sizeof(float));
        float *s = bq_malloc((size_t)ns * sizeof(float)), *c = bq_malloc((size_t)nq * sizeof(float));
        float *gq = bq_calloc((size_t)nq, sizeof(float)), *gk = bq_calloc((size_t)nq, sizeof(float));
        float *gs = bq_malloc((size_t)ns * sizeof(float)), *gc = bq_malloc((size_t)nq * sizeof(float));
        fill(q, nq, 5), fill(k, nq, 6), fill(gs, ns, 7), fill(gc, nq, 8);
        double flop_s = 2.0 * B * NH * T * T * d; /* one product */
        double bf = 1e30, bb = 1e30, bcf = 1e30, bcb = 1e30, bomp = 1e30;
        for (int r = 0; r < reps; r++) {
            double t0 = bq_now();
            bq_kernel_attn_scores_forward(s, q, k, B, T, T, NH, d, BQ_PRECISION_FP32);
            double t1 = bq_now();
            bq_kernel_attn_scores_backward(gq, gk, gs, q, k, B, T, NH, d, BQ_PRECISION_FP32);
            double t2 = bq_now();
            bq_kernel_attn_context_forward(c, s, q, B, T, T, NH, d, BQ_PRECISION_FP32);
            double t3 = bq_now();
            bq_kernel_attn_context_backward(gs, gk, gc, s, q, B, T, NH, d, BQ_PRECISION_FP32);
            double t4 = bq_now();
            scores_omp(s, q, k, B, T, NH, d);
            double t5 = bq_now();
            if (t1 - t0 < bf) bf = t1 - t0;
            if (t2 - t1 < bb) bb = t2 - t1;
            if (t3 - t2 < bcf) bcf = t3 - t2;
            if (t4 - t3 < bcb) bcb = t4 - t3;
            if (t5 - t4 < bomp) bomp = t5 - t4;
        }
        printf("attention B=%lld T=%lld NH=%lld d=%lld (sgemm per head): scores fwd %.2f ms (%.1f GFLOP/s), bwd %.2f ms "
               "(%.1f), context fwd %.2f ms (%.1f), bwd %.2f ms (%.1f); OpenMP loop scores fwd %.2f ms (%.1f GFLOP/s)\n",
               (long long)B, (long long)T, (long long)NH, (long long)d, bf * 1e3, flop_s / bf * 1e-9, bb * 1e3,
               2 * flop_s / bb * 1e-9, bcf * 1e3, flop_s / bcf * 1e-9, bcb * 1e3, 2 * flop_s / bcb * 1e-9, bomp * 1e3,
               flop_s / bomp * 1e-9);
        free(q), free(k), free(s), free(c), free(gq), free(gk), free(gs), free(gc);
    }
    bq_tape_free(&tape);
    bq_arena_free(&act);
    return 0;
}
