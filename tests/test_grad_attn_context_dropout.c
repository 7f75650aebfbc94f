/* bq_op_attn_context_dropout (context = dropout_p(probs)·v, the dropout formed per (batch, head) in a
 * thread's scratch, never stored):
 *  - gradient check with a random-weighted loss, p = 0.3 in training (bilinear for a fixed mask:
 *    exact differences with a large eps), B=2, T=5, H=6, NH=2;
 *  - equality with bq_op_attn_context(bq_op_dropout(probs), v) of the same context: forward, dprobs
 *    and dv bit for bit, and the same dropout-counter advance;
 *  - 1 against 2 threads (B=4, T=64, H=64, NH=4): same bits;
 *  - p = 0 or evaluation: the plain op (no dropout, no saved state). */
#include <stdio.h>
#include <string.h>

#include "tests/gradcheck.h"

enum { B = 2, T = 5, H = 6, NH = 2, NV = B * T * H, NP = B * NH * T * T };
static float p[NP], gp[NP], v[NV], gv[NV];
static const float P = 0.3f;

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t vs[3] = {B, T, H}, ps[4] = {B, NH, T, T};
    BqTensor *X = bq_arena_alloc(ctx->act, 2 * sizeof(BqTensor));
    X[0] = bq_tensor_wrap(p, gp, 4, ps);
    X[1] = bq_tensor_wrap(v, gv, 3, vs);
    return bq_op_attn_context_dropout(ctx, &X[0], P, &X[1], NH);
}

enum { B2 = 4, T2 = 64, H2 = 64, NH2 = 4, NV2 = B2 * T2 * H2, NP2 = B2 * NH2 * T2 * T2 };

/* One recorded pass with `threads`: out, dprobs, dv (prefilled 0.5); fused or dropout + context. */
static void run(int fused, int threads, const float *pin, const float *vin, const float *R, float *out, float *dp,
                float *dv, uint64_t *count) {
    BqGcPass pass;
    bq_gc_pass_begin(&pass, threads, (size_t)1 << 28, 1, 0xabcULL, 5);
    BqCtx *ctx = &pass.ctx;
    int64_t vs[3] = {B2, T2, H2}, ps[4] = {B2, NH2, T2, T2};
    for (int i = 0; i < NP2; i++) dp[i] = 0.5f;
    for (int i = 0; i < NV2; i++) dv[i] = 0.5f;
    BqTensor Pt = bq_tensor_wrap((float *)pin, dp, 4, ps), Vt = bq_tensor_wrap((float *)vin, dv, 3, vs);
    BqTensor *c = fused ? bq_op_attn_context_dropout(ctx, &Pt, 0.1f, &Vt, NH2)
                        : bq_op_attn_context(ctx, bq_op_dropout(ctx, &Pt, 0.1f), &Vt, NH2);
    *count = bq_gc_pass_end(&pass, c, R, out);
}

int main(void) {
    bq_gc_fill_uniform(p, NP, 31, 0, 1);
    bq_gc_fill_uniform(v, NV, 32, -1, 1);
    BqGcInput in[2] = {{"probs", p, gp, NP}, {"v", v, gv, NV}};
    double err = 0;
    int fails = bq_gradcheck("attn_context_dropout", fwd, NULL, in, 2, 0.5, &err);

    static float P2[NP2], V2[NV2], R[NV2], out[2][2][NV2], dp[2][2][NP2], dv[2][2][NV2];
    bq_gc_fill_uniform(P2, NP2, 33, 0, 1);
    bq_gc_fill_uniform(V2, NV2, 34, -1, 1);
    bq_gc_fill_uniform(R, NV2, 35, -1, 1);
    uint64_t cnt[2][2];
    for (int f = 0; f < 2; f++)
        for (int t = 0; t < 2; t++) run(f, t + 1, P2, V2, R, out[f][t], dp[f][t], dv[f][t], &cnt[f][t]);
    for (int f = 0; f < 2; f++) {
        int64_t d = bq_gc_ndiff(out[f][0], out[f][1], NV2) + bq_gc_ndiff(dp[f][0], dp[f][1], NP2) + bq_gc_ndiff(dv[f][0], dv[f][1], NV2);
        printf("%-22s 1 vs 2 threads: %lld values differ\n", f ? "fused" : "dropout + context", (long long)d);
        fails += d != 0;
    }
    int64_t dy = bq_gc_ndiff(out[1][1], out[0][1], NV2), dgp = bq_gc_ndiff(dp[1][1], dp[0][1], NP2),
            dgv = bq_gc_ndiff(dv[1][1], dv[0][1], NV2);
    printf("fused vs dropout + context: forward %lld, dprobs %lld, dv %lld values differ (bit-equal expected); "
           "dropout counter %llu vs %llu\n", (long long)dy, (long long)dgp, (long long)dgv,
           (unsigned long long)cnt[1][1], (unsigned long long)cnt[0][1]);
    fails += dy + dgp + dgv != 0 || cnt[1][1] != cnt[0][1];

    /* p = 0 and evaluation: the plain op, no saved state */
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 24, "t") == BQ_OK);
    BqTape tape;
    bq_tape_init(&tape, 4);
    BqCtx ctx = {.act = &act, .tape = &tape, .training = 1};
    int64_t vs[3] = {B, T, H}, ps[4] = {B, NH, T, T};
    BqTensor Pt = bq_tensor_wrap(p, gp, 4, ps), Vt = bq_tensor_wrap(v, gv, 3, vs);
    bq_op_attn_context_dropout(&ctx, &Pt, 0.0f, &Vt, NH);
    int plain = tape.n == 1 && tape.nodes[0].saved == NULL && ctx.rng_count == 0;
    ctx.training = 0;
    bq_op_attn_context_dropout(&ctx, &Pt, P, &Vt, NH);
    plain &= tape.n == 2 && tape.nodes[1].saved == NULL && ctx.rng_count == 0;
    printf("p = 0 / evaluation: %s\n", plain ? "plain context op" : "FAILED");
    fails += !plain;
    bq_tape_free(&tape);
    bq_arena_free(&act);
    printf("test_grad_attn_context_dropout: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
