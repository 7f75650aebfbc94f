/* Gradient check of bq_op_fakequant_lsq (learned step size, Esser et al., ICLR 2020): central
 * differences of a random-weighted loss Σ y ⊙ R against the backward's dx and dscale, per tensor (a
 * (B,T,H) activation), per channel along axis 0 of a 7-bit (OC,C)
 * weight and along axis 1 of an unsigned [0, 255] (3,4,5) tensor, each with the paper's gradient scale
 * g = 1/√(N·qmax).
 *
 * What is differentiated: the paper's autograd graph, in double. With v = x/s, the round-pass term
 * rne(v) − v and the clamp's choice of branch are stop-gradient constants, and grad_scale gives s the
 * value s0 with gradient g, so around the unperturbed point (x0, s0)
 *   y = x + (rne(v0) − v0)·s_e  inside [qmin, qmax],   y = qmin·s_e or qmax·s_e outside,
 *   s_e = s0 + g·(s − s0).
 * The reference holds those constants at (x0, s0) and the differences measure exactly what the backward
 * must return: dx = R inside (straight through), 0 outside; dscale = g·Σ R·(rne(v) − v or the bound).
 * The data lie away from rounding ties (x/s = k + f, |f| <= 0.35) so the float forward's rounding is
 * the reference's; k spans both clamp edges. The reference also checks the float forward at (x0, s0).
 * The sole-consumer path (output and input share one gradient buffer, which the pre-filled gradients
 * of tests/gradcheck.h cannot express) is checked against the PyTorch fixture in tests/test_lsq_ref.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/gradcheck.h"

typedef struct Case {
    const char *name;
    int ndim;
    int64_t shape[3];
    int axis, qmin, qmax;
    int64_t n, ns, inner;
    float g;
    float *x, *gx, *s, *gs; /* current (perturbed) values and gradient buffers */
    float *x0, *s0;         /* the unperturbed point */
} Case;

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    Case *c = ud;
    BqTensor *X = bq_arena_alloc(ctx->act, sizeof(BqTensor));
    X[0] = bq_tensor_wrap(c->x, c->gx, c->ndim, c->shape);
    return bq_op_fakequant_lsq(ctx, X, c->s, c->gs, c->ns, c->axis, c->qmin, c->qmax, c->g, 0);
}

static void ref(double *out, void *ud) {
    Case *c = ud;
    for (int64_t i = 0; i < c->n; i++) {
        int64_t k = c->ns > 1 ? (i / c->inner) % c->ns : 0;
        float v0 = c->x0[i] / c->s0[k];
        float q0 = nearbyintf(v0);
        double se = (double)c->s0[k] + (double)c->g * ((double)c->s[k] - (double)c->s0[k]);
        if (q0 < c->qmin) out[i] = c->qmin * se;
        else if (q0 > c->qmax) out[i] = c->qmax * se;
        else out[i] = (double)c->x[i] + ((double)q0 - (double)v0) * se;
    }
}

/* x = (k + f)·s with k uniform over [qmin − 12, qmax + 12] and |f| <= 0.35. */
static void fill(Case *c, uint64_t seed) {
    BqRng r;
    bq_rng_seed(&r, seed);
    for (int64_t i = 0; i < c->n; i++) {
        int64_t k = c->ns > 1 ? (i / c->inner) % c->ns : 0;
        int span = c->qmax - c->qmin + 24;
        double q = c->qmin - 12 + (double)bq_rng_below(&r, (uint64_t)span + 1);
        double f = 0.7 * bq_rng_uniform(&r) - 0.35;
        c->x[i] = (float)((q + f) * c->s[k]);
    }
}

static int run(Case *c, uint64_t seed, double *err) {
    static float x[64], gx[64], s[8], gs[8], x0[64], s0[8];
    c->n = 1;
    for (int d = 0; d < c->ndim; d++) c->n *= c->shape[d];
    c->ns = c->axis < 0 ? 1 : c->shape[c->axis];
    c->inner = 1;
    for (int d = c->axis + 1; c->axis >= 0 && d < c->ndim; d++) c->inner *= c->shape[d];
    BQ_CHECK(c->n <= 64 && c->ns <= 8);
    /* N: elements per scale per example (activations) or per scale (weights), as layers/quant.c */
    int64_t N = c->axis < 0 ? c->n / c->shape[0] : c->n / c->ns;
    c->g = (float)(1.0 / sqrt((double)N * c->qmax));
    c->x = x, c->gx = gx, c->s = s, c->gs = gs, c->x0 = x0, c->s0 = s0;
    for (int64_t k = 0; k < c->ns; k++) s[k] = 0.02f + 0.015f * (float)k;
    fill(c, seed);
    memcpy(x0, x, sizeof(float) * (size_t)c->n);
    memcpy(s0, s, sizeof(float) * (size_t)c->ns);
    BqGcInput in[2] = {{"x", x, gx, c->n}, {"scale", s, gs, c->ns}};
    double e = 0;
    int fails = bq_gradcheck_ref(c->name, fwd, ref, c, in, 2, 1e-3, &e);
    *err = e > *err ? e : *err;
    return fails;
}

int main(void) {
    double err = 0;
    int fails = 0;
    Case a = {.name = "lsq per tensor (B,T,H)", .ndim = 3, .shape = {2, 5, 6}, .axis = -1, .qmin = -128, .qmax = 127};
    fails += run(&a, 161, &err);
    Case c = {.name = "lsq per channel, 7-bit weight", .ndim = 2, .shape = {4, 7}, .axis = 0, .qmin = -64, .qmax = 63};
    fails += run(&c, 163, &err);
    Case d = {.name = "lsq per channel axis 1, [0, 255]", .ndim = 3, .shape = {3, 4, 5}, .axis = 1, .qmin = 0,
              .qmax = 255};
    fails += run(&d, 164, &err);
    printf("test_grad_fakequant_lsq: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
