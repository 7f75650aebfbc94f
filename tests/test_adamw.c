/* One and two AdamW updates (src/optim.c) against the scalar torch.optim.AdamW formula written out in
 * double; decay applied only where BqParam.decay; the HF linear schedule and gradient clipping. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "src/optim.h"

static double maxerr = 0;
static int fails = 0;
static void expect(const char *what, double got, double want, double tol) {
    double e = fabs(got - want);
    if (e > maxerr) maxerr = e;
    if (!(e <= tol)) {
        printf("FAIL %s: got %.9g want %.9g\n", what, got, want);
        fails++;
    }
}

int main(void) {
    BqParam ps[2] = {0};
    snprintf(ps[0].name, BQ_NAME_MAX, "w");
    ps[0].ndim = 1, ps[0].shape[0] = 3, ps[0].numel = 3, ps[0].offset = 0, ps[0].decay = 1;
    snprintf(ps[1].name, BQ_NAME_MAX, "b");
    ps[1].ndim = 1, ps[1].shape[0] = 2, ps[1].numel = 2, ps[1].offset = 3, ps[1].decay = 0;
    float data[5] = {0.5f, -1.0f, 2.0f, 0.25f, -0.75f};
    float grad[5] = {0.1f, -0.2f, 0.0f, 3.0f, -0.01f};
    BqParamTable t = {.p = ps, .n = 2, .total = 5, .data = data, .grad = grad};
    double ref[5], m[5] = {0}, v[5] = {0};
    for (int j = 0; j < 5; j++) ref[j] = data[j];
    BqAdamW o;
    bq_adamw_init(&o, 5, 0.01f);
    const double lr[2] = {1e-3, 5e-4};
    for (int k = 1; k <= 2; k++) {
        bq_adamw_step(&o, &t, (float)lr[k - 1]);
        for (int j = 0; j < 5; j++) {
            double g = grad[j];
            if (j < 3) ref[j] *= 1 - lr[k - 1] * 0.01;
            m[j] = 0.9 * m[j] + 0.1 * g;
            v[j] = 0.999 * v[j] + 0.001 * g * g;
            double mh = m[j] / (1 - pow(0.9, k)), vh = v[j] / (1 - pow(0.999, k));
            ref[j] -= lr[k - 1] * mh / (sqrt(vh) + 1e-8);
            char what[64];
            snprintf(what, sizeof what, "step %d param %d", k, j);
            expect(what, data[j], ref[j], 2e-7);
        }
    }
    expect("step count", (double)o.step, 2, 0);
    bq_adamw_free(&o);

    /* Schedule: HF get_linear_schedule_with_warmup with 10 total steps, 2 warmup. */
    expect("warmup steps", (double)bq_warmup_steps(0.1, 15), 2, 0);
    expect("lambda 0", bq_lr_lambda(0, 2, 10), 0.0, 0);
    expect("lambda 1", bq_lr_lambda(1, 2, 10), 0.5, 1e-15);
    expect("lambda 2", bq_lr_lambda(2, 2, 10), 1.0, 1e-15);
    expect("lambda 6", bq_lr_lambda(6, 2, 10), 0.5, 1e-15);
    expect("lambda 10", bq_lr_lambda(10, 2, 10), 0.0, 0);
    expect("lambda no warmup", bq_lr_lambda(0, 0, 4), 1.0, 0);

    /* Clipping: norm of (3, 4) is 5; clipped to 1 → (0.6, 0.8)·5/(5+1e-6). */
    float g2[2] = {3, 4}, d2[2] = {0, 0};
    BqParam p2 = {.ndim = 1, .shape = {2}, .numel = 2};
    BqParamTable t2 = {.p = &p2, .n = 1, .total = 2, .data = d2, .grad = g2};
    double norm = bq_grad_clip(&t2, 1.0);
    expect("norm", norm, 5.0, 1e-12);
    expect("clipped 0", g2[0], 3.0 / (5 + 1e-6), 1e-7);
    expect("clipped 1", g2[1], 4.0 / (5 + 1e-6), 1e-7);
    bq_grad_clip(&t2, 0); /* off */
    expect("off", g2[0], 3.0 / (5 + 1e-6), 1e-7);

    printf("test_adamw: max error %.3g, %s\n", maxerr, fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
