/* Central-difference gradient checking (contract in gradcheck.h). Reference: the standard
 * finite-difference gradient check (cs231n notes; torch.autograd.gradcheck uses the same
 * atol + rtol·|num| acceptance form). */
#include "tests/gradcheck.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GC_ATOL 1e-4
#define GC_RTOL 1e-2
#define GC_PREFILL 0.25f /* initial gradient value: backward must add to it */

void bq_gc_fill_uniform(float *v, int64_t n, uint64_t seed, float lo, float hi) {
    BqRng r;
    bq_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * (float)bq_rng_uniform(&r);
}

/* One forward without recording; returns Σ out·R in double. Resets the dropout counter so every
 * evaluation draws the same mask. */
static double eval_loss(BqCtx *ctx, BqGcForward fwd, BqGcReference ref, void *ud, const float *R, int64_t nR,
                        double *dbuf) {
    if (ref) {
        ref(dbuf, ud);
        double L = 0.0;
        for (int64_t i = 0; i < nR; i++) L += dbuf[i] * (double)R[i];
        return L;
    }
    size_t mark = bq_arena_mark(ctx->act);
    BqTape *tape = ctx->tape;
    ctx->tape = NULL;
    ctx->rng_count = 0;
    BqTensor *out = fwd(ctx, ud);
    BQ_CHECK(bq_tensor_numel(out) == nR);
    double L = 0.0;
    for (int64_t i = 0; i < nR; i++) L += (double)out->data[i] * (double)R[i];
    ctx->tape = tape;
    bq_arena_rewind(ctx->act, mark);
    return L;
}

int bq_gradcheck(const char *op, BqGcForward fwd, void *ud, BqGcInput *inputs, int ninputs, double eps,
                 double *max_err) {
    return bq_gradcheck_ref(op, fwd, NULL, ud, inputs, ninputs, eps, max_err);
}

int bq_gradcheck_ref(const char *op, BqGcForward fwd, BqGcReference ref, void *ud, BqGcInput *inputs, int ninputs,
                     double eps, double *max_err) {
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 28, "gradcheck") == BQ_OK);
    BqTape tape;
    bq_tape_init(&tape, 64);
    BqCtx ctx = {.act = &act, .tape = &tape, .training = 1, .rng_key = 0x5eedULL, .rng_count = 0};

    /* analytic: gradients pre-filled, one recorded forward, out->grad = R, backward */
    for (int k = 0; k < ninputs; k++)
        if (inputs[k].grad)
            for (int64_t i = 0; i < inputs[k].n; i++) inputs[k].grad[i] = GC_PREFILL;
    BqTensor *out = fwd(&ctx, ud);
    int64_t nR = bq_tensor_numel(out);
    float *R = bq_malloc((size_t)nR * sizeof(float));
    bq_gc_fill_uniform(R, nR, 1234, -1.0f, 1.0f);
    BQ_CHECK(out->grad != NULL);
    memcpy(out->grad, R, (size_t)nR * sizeof(float));
    double *dbuf = bq_malloc((size_t)nR * sizeof(double));
    int fails = 0;
    double worst = 0.0;
    if (ref) { /* the float forward must agree with the reference before its gradient is compared */
        ref(dbuf, ud);
        double ferr = 0.0;
        int fbad = 0;
        for (int64_t i = 0; i < nR; i++) {
            double e = fabs((double)out->data[i] - dbuf[i]);
            if (e > ferr) ferr = e;
            if (!(e <= 1e-5 + 1e-5 * fabs(dbuf[i]))) fbad++;
        }
        printf("%s forward vs double reference: %lld outputs, max abs err %.3e%s\n", op, (long long)nR, ferr,
               fbad ? "  FAILED" : "");
        fails += fbad;
        worst = ferr;
    }
    float dummy_grad = 0.0f, dummy_data = 0.0f;
    int64_t one = 1;
    BqTensor seed = bq_tensor_wrap(&dummy_data, &dummy_grad, 1, &one); /* not on the tape */
    bq_backward(&ctx, &seed);
    bq_tape_rewind(&tape);
    bq_arena_rewind(&act, 0);

    for (int k = 0; k < ninputs; k++) {
        BqGcInput *in = &inputs[k];
        if (!in->grad) continue;
        double kmax_abs = 0.0, kmax_rel = 0.0;
        int kfails = 0;
        for (int64_t i = 0; i < in->n; i++) {
            double ana = (double)in->grad[i] - (double)GC_PREFILL;
            float x0 = in->data[i];
            float xp = x0 + (float)eps, xm = x0 - (float)eps;
            in->data[i] = xp;
            double Lp = eval_loss(&ctx, fwd, ref, ud, R, nR, dbuf);
            in->data[i] = xm;
            double Lm = eval_loss(&ctx, fwd, ref, ud, R, nR, dbuf);
            in->data[i] = x0;
            double num = (Lp - Lm) / ((double)xp - (double)xm);
            double err = fabs(num - ana);
            double rel = err / (fabs(num) > 1e-12 ? fabs(num) : 1e-12);
            if (err > kmax_abs) kmax_abs = err;
            if (err > 1e-6 && rel > kmax_rel) kmax_rel = rel;
            if (!(err <= GC_ATOL + GC_RTOL * fabs(num))) {
                if (kfails < 5)
                    printf("  FAIL %s %s[%lld]: numerical %.8g analytic %.8g\n", op, in->name, (long long)i, num,
                           ana);
                kfails++;
            }
        }
        printf("%s d%s: %lld elements, max abs err %.3e, max rel err %.3e%s\n", op, in->name, (long long)in->n,
               kmax_abs, kmax_rel, kfails ? "  FAILED" : "");
        if (kmax_abs > worst) worst = kmax_abs;
        fails += kfails;
    }
    if (max_err) *max_err = worst;
    free(R);
    free(dbuf);
    bq_tape_free(&tape);
    bq_arena_free(&act);
    return fails;
}

void bq_gc_pass_begin(BqGcPass *p, int threads, size_t arena_bytes, int record, uint64_t rng_key,
                      uint64_t rng_count) {
    if (threads > 0) omp_set_num_threads(threads);
    BQ_CHECK(bq_arena_init(&p->act, arena_bytes, "gradcheck pass") == BQ_OK);
    BQ_CHECK(bq_tape_init(&p->tape, 16) == BQ_OK);
    p->ctx = (BqCtx){.act = &p->act, .tape = record ? &p->tape : NULL, .training = 1, .rng_key = rng_key,
                     .rng_count = rng_count};
}

uint64_t bq_gc_pass_end(BqGcPass *p, const BqTensor *out, const float *R, float *y) {
    int64_t n = bq_tensor_numel(out);
    uint64_t count = p->ctx.rng_count;
    memcpy(y, out->data, (size_t)n * sizeof(float));
    if (p->ctx.tape) {
        memcpy(out->grad, R, (size_t)n * sizeof(float));
        float dd = 0, dg = 0;
        int64_t one = 1;
        BqTensor seed = bq_tensor_wrap(&dd, &dg, 1, &one);
        bq_backward(&p->ctx, &seed);
    }
    bq_tape_free(&p->tape);
    bq_arena_free(&p->act);
    return count;
}

int64_t bq_gc_ndiff(const float *a, const float *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}
