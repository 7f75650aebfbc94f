/* Gradient checking by central differences, for the tests/test_grad_*.c programs.
 *
 * The checked function is L(inputs) = Σ out ⊙ R for a fixed random R, accumulated in double. The
 * analytic gradient comes from one recorded forward and bq_backward, with the input gradients
 * pre-filled with a constant so that the check also proves backward ACCUMULATES (+=). The numerical
 * gradient perturbs each float input element by ±eps and divides by the difference of the actually
 * stored floats (computed in double); bq_gradcheck_ref evaluates those perturbed losses with a
 * double-precision reference of the op instead of the float kernel. Pass: |num − ana| <= atol + rtol·|num| with atol 1e-4,
 * rtol 1e-2. Ops that are linear in each single input element have no truncation error, so those
 * tests use a large eps that makes float rounding of the forward negligible. */
#ifndef BQ_GRADCHECK_H
#define BQ_GRADCHECK_H

#include <stdint.h>

#include "autograd/tensor.h"

/* Builds the op under test from the caller's inputs (wrapped each call) and returns its output. */
typedef BqTensor *(*BqGcForward)(BqCtx *ctx, void *ud);

typedef struct BqGcInput {
    const char *name;
    float *data;  /* perturbed in place (restored afterwards) */
    float *grad;  /* gradient buffer the forward wraps together with data (NULL: not checked) */
    int64_t n;
} BqGcInput;

/* Fills v with uniform values in [lo, hi) from a seeded RNG. */
void bq_gc_fill_uniform(float *v, int64_t n, uint64_t seed, float lo, float hi);

/* Runs the check for every input with a grad buffer; prints one line per input with its max absolute
 * and relative error, the first few failures, and returns the number of failing elements (0 = pass).
 * *max_err receives the largest |num − ana| seen. */
int bq_gradcheck(const char *op, BqGcForward fwd, void *ud, BqGcInput *inputs, int ninputs, double eps,
                 double *max_err);

/* Computes the op's output in double from the current (float) input arrays. */
typedef void (*BqGcReference)(double *out, void *ud);

/* As bq_gradcheck, but the numerical side differentiates a double-precision reference of the op, so
 * nonlinear ops can use eps ~1e-3 without float rounding noise in the differences; the float forward
 * itself is first compared with the reference (|out − ref| <= 1e-5 + 1e-5·|ref|, failure counted). */
int bq_gradcheck_ref(const char *op, BqGcForward fwd, BqGcReference ref, void *ud, BqGcInput *inputs, int ninputs,
                     double eps, double *max_err);

/* ---- recorded passes, for the tests that compare a fused op with its unfused sequence (and one thread
 * with two) bit for bit ---- */

/* One pass's activation arena, tape and context. p->ctx points into the struct: keep it in place. */
typedef struct BqGcPass {
    BqArena act;
    BqTape tape;
    BqCtx ctx;
} BqGcPass;

/* Opens a pass: sets the OpenMP thread count (when threads > 0), an activation arena of arena_bytes,
 * training on with the given dropout key and counter, and a tape when record is set (otherwise
 * p->ctx.tape is NULL and the pass is forward only). The caller then wraps its arrays with gradient
 * buffers it has prefilled, builds the graph on &p->ctx and closes the pass with bq_gc_pass_end. */
void bq_gc_pass_begin(BqGcPass *p, int threads, size_t arena_bytes, int record, uint64_t rng_key,
                      uint64_t rng_count);

/* Closes a pass: copies out's values to y; with a tape, sets out's gradient to R (the weights of the
 * loss Σ y⊙R) and runs bq_backward, which adds into the caller's gradient buffers. Frees the tape and
 * the arena and returns the dropout counter as the forward left it. */
uint64_t bq_gc_pass_end(BqGcPass *p, const BqTensor *out, const float *R, float *y);

/* Number of positions where a and b differ bit for bit. */
int64_t bq_gc_ndiff(const float *a, const float *b, int64_t n);

#endif
