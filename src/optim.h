/* AdamW with decoupled weight decay (Loshchilov & Hutter, "Decoupled Weight Decay Regularization";
 * numerics of torch.optim.AdamW), global-norm gradient clipping (torch.nn.utils.clip_grad_norm_) and the
 * linear warmup + linear decay learning-rate schedule of HF transformers
 * get_linear_schedule_with_warmup.
 *
 * Optimizer state m, v lives in one block of 2·total floats parallel to BqParamTable.data: the moments
 * of parameter p are at m[p.offset .. p.offset + p.numel) and v[same]. */
#ifndef BQ_OPTIM_H
#define BQ_OPTIM_H

#include <stdint.h>

#include "layers/bert.h"

typedef struct BqAdamW {
    float beta1, beta2, eps, weight_decay;
    int64_t step;  /* updates applied so far (bias correction uses step + 1 for the next one) */
    int64_t total; /* floats, == BqParamTable.total */
    float *m;      /* (total) first moment; v = m + total */
    float *v;      /* (total) second moment */
} BqAdamW;

/* Zeroed state for `total` parameters; betas (0.9, 0.999), eps 1e-8 unless changed afterwards. */
void bq_adamw_init(BqAdamW *o, int64_t total, float weight_decay);
void bq_adamw_free(BqAdamW *o);

/* One update of every parameter of t from t->grad at learning rate lr (torch.optim.AdamW):
 *   p -= lr·wd·p   (only where BqParam.decay)
 *   m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
 *   p -= lr/(1−β1^k) · m / (√v/√(1−β2^k) + eps),   k = step + 1
 * Increments o->step. Gradients are left unchanged (the caller zeroes them). */
void bq_adamw_step(BqAdamW *o, BqParamTable *t, float lr);

/* The learned scales of --ranges learn (layers/quant.h, BqQuantState.lsq) as their own parameter group:
 * the AdamW update of bq_adamw_step with o's betas and eps, no weight decay, learning rate lr (the
 * caller passes range_lr times the schedule's multiplier), on the gradients times grad_mult (1/grad_accum,
 * as the parameters' gradients are divided). Call it right BEFORE bq_adamw_step of the same optimizer
 * step: the bias correction uses k = o->step + 1. Each scale is then clamped to BQ_QUANT_SCALE_FLOOR
 * (positivity), amax follows (scale·qmax), and the scale gradients are zeroed. A non-finite scale
 * gradient is BQ_ENUMERIC naming the quantizer and the step, with nothing changed. The scales' gradients
 * are not part of the parameters' global-norm clip (bq_grad_clip); no-op without learned scales. */
struct BqQuantState;
int bq_adamw_step_scales(const BqAdamW *o, struct BqQuantState *qs, float lr, float grad_mult);

/* L2 norm over all gradients of t (accumulated in double). */
double bq_grad_global_norm(const BqParamTable *t);
/* Multiplies every gradient by s. */
void bq_grad_scale(BqParamTable *t, float s);
/* torch clip_grad_norm_: when max_norm > 0 and the norm exceeds it, scales gradients by
 * max_norm / (norm + 1e-6). Returns the norm before clipping. */
double bq_grad_clip(BqParamTable *t, double max_norm);

/* HF get_warmup_steps: ceil(warmup_ratio · total_steps). */
int64_t bq_warmup_steps(double warmup_ratio, int64_t total_steps);
/* HF get_linear_schedule_with_warmup multiplier at optimizer step `step` (0-based):
 * step/warmup during warmup, then (total − step)/(total − warmup), floored at 0. */
double bq_lr_lambda(int64_t step, int64_t warmup_steps, int64_t total_steps);

#endif
