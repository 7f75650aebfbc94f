/* AdamW, gradient clipping and the linear warmup/decay schedule (see optim.h; torch.optim.AdamW,
 * torch.nn.utils.clip_grad_norm_, transformers.optimization.get_linear_schedule_with_warmup). */
#include "src/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layers/quant.h"

void bq_adamw_init(BqAdamW *o, int64_t total, float weight_decay) {
    memset(o, 0, sizeof *o);
    o->beta1 = 0.9f;
    o->beta2 = 0.999f;
    o->eps = 1e-8f;
    o->weight_decay = weight_decay;
    o->total = total;
    o->m = bq_calloc((size_t)(2 * total > 0 ? 2 * total : 1), sizeof(float));
    o->v = o->m + total;
}

void bq_adamw_free(BqAdamW *o) {
    free(o->m);
    memset(o, 0, sizeof *o);
}

void bq_adamw_step(BqAdamW *o, BqParamTable *t, float lr) {
    BQ_CHECK(t->grad && o->total == t->total);
    int64_t k = ++o->step;
    /* Bias corrections in double, as torch computes them from Python floats. */
    double bc1 = 1.0 - pow((double)o->beta1, (double)k);
    double bc2 = 1.0 - pow((double)o->beta2, (double)k);
    float step_size = (float)(lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
    for (int i = 0; i < t->n; i++) {
        const BqParam *p = &t->p[i];
        float *w = t->data + p->offset;
        const float *g = t->grad + p->offset;
        float *m = o->m + p->offset, *v = o->v + p->offset;
        float decay = p->decay ? 1.0f - lr * o->weight_decay : 1.0f;
        int64_t n = p->numel;
#pragma omp parallel for schedule(static) if (n > 65536)
        for (int64_t j = 0; j < n; j++) {
            w[j] *= decay;
            m[j] = b1 * m[j] + (1.0f - b1) * g[j];
            v[j] = b2 * v[j] + (1.0f - b2) * g[j] * g[j];
            float denom = sqrtf(v[j]) / bc2_sqrt + eps;
            w[j] -= step_size * (m[j] / denom);
        }
    }
}

int bq_adamw_step_scales(const BqAdamW *o, BqQuantState *qs, float lr, float grad_mult) {
    if (!qs || !qs->lsq) return BQ_OK;
    for (int i = 0; i < qs->n; i++)
        for (int64_t c = 0; c < qs->q[i].nch; c++)
            if (!isfinite(qs->q[i].dscale[c]))
                return bq_err(BQ_ENUMERIC, "train: the gradient of the learned scale of %s is not finite at step %lld",
                              qs->q[i].name, (long long)o->step + 1);
    int64_t k = o->step + 1;
    double bc1 = 1.0 - pow((double)o->beta1, (double)k);
    double bc2 = 1.0 - pow((double)o->beta2, (double)k);
    float step_size = (float)(lr / bc1);
    float bc2_sqrt = (float)sqrt(bc2);
    float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
    float *w = qs->lsq, *g = qs->lsq_grad, *m = qs->lsq_m, *v = qs->lsq_v;
    for (int64_t j = 0; j < qs->nscales; j++) {
        float gj = g[j] * grad_mult;
        m[j] = b1 * m[j] + (1.0f - b1) * gj;
        v[j] = b2 * v[j] + (1.0f - b2) * gj * gj;
        float denom = sqrtf(v[j]) / bc2_sqrt + eps;
        w[j] -= step_size * (m[j] / denom);
        w[j] = w[j] > BQ_QUANT_SCALE_FLOOR ? w[j] : BQ_QUANT_SCALE_FLOOR; /* also maps a NaN to the floor */
        g[j] = 0.0f;
    }
    bq_quant_learn_sync_amax(qs);
    return BQ_OK;
}

double bq_grad_global_norm(const BqParamTable *t) {
    double s = 0.0;
    const float *g = t->grad;
    int64_t n = t->total;
    /* 256 fixed blocks summed in parallel, then added in block order: the result does not depend on the
     * thread count, and nothing is allocated. */
    enum { NB = 256 };
    double part[NB];
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int b = 0; b < NB; b++) {
        int64_t lo = n * b / NB, hi = n * (b + 1) / NB;
        double acc = 0.0;
        for (int64_t j = lo; j < hi; j++) acc += (double)g[j] * g[j];
        part[b] = acc;
    }
    for (int b = 0; b < NB; b++) s += part[b];
    return sqrt(s);
}

void bq_grad_scale(BqParamTable *t, float s) {
    float *g = t->grad;
    int64_t n = t->total;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t j = 0; j < n; j++) g[j] *= s;
}

double bq_grad_clip(BqParamTable *t, double max_norm) {
    double norm = bq_grad_global_norm(t);
    if (max_norm > 0) {
        double coef = max_norm / (norm + 1e-6);
        if (coef < 1.0) bq_grad_scale(t, (float)coef);
    }
    return norm;
}

int64_t bq_warmup_steps(double warmup_ratio, int64_t total_steps) {
    if (warmup_ratio <= 0) return 0;
    return (int64_t)ceil(warmup_ratio * (double)total_steps);
}

double bq_lr_lambda(int64_t step, int64_t warmup_steps, int64_t total_steps) {
    if (step < warmup_steps) return (double)step / (double)(warmup_steps > 1 ? warmup_steps : 1);
    int64_t den = total_steps - warmup_steps;
    double r = (double)(total_steps - step) / (double)(den > 1 ? den : 1);
    return r > 0 ? r : 0.0;
}
