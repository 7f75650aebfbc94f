/* bf16 storage of the activations of a bf16 training step (autograd/tensor.h "bf16 storage", layers/bert.c
 * store_bf16; autograd/gemm.h BqMat).
 *
 * A training step of a small random BERT in bf16 precision (2 layers, hidden 64, 4 heads, intermediate 256,
 * batch 8 x 64 tokens, dropout on, a padded batch) is run twice from the same state and dropout keys: with
 * every activation stored as floats (BqCtx.keep_fp32) and with the model's bf16 storage. Checked:
 *  - storage: after the forward exactly 6 tensors per layer are held as bf16 words and no floats (query,
 *    key, value, attention probabilities, context, intermediate dense output);
 *  - memory: the resident bytes of the activation arena after the forward shrink by the bytes those
 *    tensors no longer take (2 per element), within 5 % (page rounding): the fp32 page blocks they were
 *    computed in, and the scores, were given back;
 *  - values: the storage changes only what the non-GEMM readers see (the softmax backward and the
 *    probabilities' dropout read rounded probabilities; the GELU, forward and backward, reads the rounded
 *    intermediate output; every GEMM rounds its operands to bf16 anyway). That is 4 roundings of at most
 *    u_b = 2^-9 relative per layer on a gradient's path, so loss, logits and every parameter gradient with
 *    a norm above 1e-6 of the largest must agree normwise within 2·4·L·u_b, and must differ (the storage
 *    really ran) by more than 64 fp32 roundoffs somewhere. The key biases' gradients are zero in exact
 *    arithmetic (rounding noise in both runs): their norm must stay within the bound times the norm of the
 *    key weight's gradient.
 * The arena uses 4 KiB pages so that residency counts exactly the pages written. Prints the counts, the
 * resident bytes and the worst relative difference against the bound. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "autograd/gemm.h"
#include "autograd/tensor.h"
#include "layers/bert.h"
#include "tests/test_util.h"

enum { B = 8, T = 64, NL = 3, LAYERS = 2, HID = 64, HEADS = 4, INTER = 256 };

typedef struct Out {
    float loss;
    float logits[B * NL];
    float *grad;
    int64_t n;
    int stored;          /* tape outputs held as bf16 words after the forward */
    size_t stored_saved; /* the bytes they save: 2 per element */
    size_t resident;     /* resident bytes of the activation arena after the forward */
    BqBert m;
} Out;

static void run(int keep_fp32, Out *o) {
    memset(o, 0, sizeof *o);
    BqBertConfig cfg = bq_test_config(60, HID, LAYERS, HEADS, INTER, T, NL, 0.1f, 0.1f);
    BqRng rng;
    bq_rng_seed(&rng, 5);
    BQ_CHECK(bq_bert_create(&o->m, &cfg, 1, &rng) == BQ_OK);
    int32_t ids[B * T], types[B * T], labels[B] = {0, 2, 1, 2, 1, 0, 0, 2};
    float mask[B * T];
    BqBertInput in = bq_test_padded_input(B, T, 60, 11, ids, types, mask, labels);
    BqArena act;
    BqTape tape;
    bq_test_step_small_pages(&act, &tape);
    BqCtx ctx = {.act = &act, .tape = &tape, .training = 1, .rng_key = 99, .prec = BQ_PRECISION_BF16,
                 .keep_fp32 = keep_fp32};
    BqTensor *lg = NULL, *ls = NULL;
    BQ_CHECK(bq_bert_forward(&o->m, &ctx, &in, &lg, &ls) == BQ_OK);
    for (int64_t i = 0; i < tape.n; i++) {
        const BqTensor *t = tape.nodes[i].out;
        int seen = 0;
        for (int64_t j = 0; j < i; j++) seen |= tape.nodes[j].out == t; /* an in-place op's output */
        if (seen || !t->data16) continue;
        EXPECT(t->data == NULL, "node %lld (%s): bf16 words and floats both held", (long long)i,
               bq_op_name(tape.nodes[i].op));
        o->stored++;
        o->stored_saved += (size_t)bq_tensor_numel(t) * 2;
    }
    o->resident = bq_test_resident_bytes(act.base, act.used);
    bq_backward(&ctx, ls);
    o->loss = ls->data[0];
    memcpy(o->logits, lg->data, sizeof o->logits);
    o->n = o->m.params.total;
    o->grad = bq_malloc(sizeof(float) * (size_t)o->n);
    memcpy(o->grad, o->m.params.grad, sizeof(float) * (size_t)o->n);
    bq_arena_free(&act);
    bq_tape_free(&tape);
}

static double rel(const float *x, const float *r, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) num += ((double)x[i] - r[i]) * ((double)x[i] - r[i]), den += (double)r[i] * r[i];
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

int main(void) {
    const double ub = ldexp(1.0, -9), bound = 2.0 * 4.0 * LAYERS * ub;
    printf("%s\n", bq_gemm_bf16_describe());
    Out f, h;
    run(1, &f);
    run(0, &h);
    EXPECT(f.stored == 0, "keep_fp32: %d tensors stored as bf16 words", f.stored);
    EXPECT(h.stored == 6 * LAYERS, "%d tensors stored as bf16 words, expected %d (6 per layer)", h.stored,
           6 * LAYERS);
    /* the saving: (B,T,H) query, key, value and context, (B,NH,T,T) probabilities, (B,T,I) GELU input */
    const size_t expect = (size_t)LAYERS * 2 * ((size_t)4 * B * T * HID + (size_t)B * HEADS * T * T + (size_t)B * T * INTER);
    EXPECT(h.stored_saved == expect, "the stored tensors save %zu bytes, expected %zu", h.stored_saved, expect);
    const double drop = (double)f.resident - (double)h.resident;
    EXPECT(fabs(drop - (double)expect) <= 0.05 * (double)expect,
           "resident after the forward %.3f MiB (floats) vs %.3f MiB (bf16 storage): %.3f MiB less, expected %.3f",
           f.resident / 1048576.0, h.resident / 1048576.0, drop / 1048576.0, expect / 1048576.0);

    double worst = fabs((double)h.loss - f.loss) / fabs((double)f.loss);
    EXPECT(worst <= bound, "loss %.7g vs %.7g, relative %.3g > %.3g", h.loss, f.loss, worst, bound);
    double lg = rel(h.logits, f.logits, B * NL);
    EXPECT(lg <= bound, "logits relative %.3g > %.3g", lg, bound);
    worst = fmax(worst, lg);
    double gmax = 0;
    for (int i = 0; i < f.m.params.n; i++) {
        const BqParam *p = &f.m.params.p[i];
        double nrm = 0;
        for (int64_t k = 0; k < p->numel; k++) nrm += (double)f.grad[p->offset + k] * f.grad[p->offset + k];
        gmax = fmax(gmax, sqrt(nrm));
    }
    int checked = 0, over = 0;
    for (int i = 0; i < f.m.params.n; i++) {
        const BqParam *p = &f.m.params.p[i];
        double nrm = 0;
        for (int64_t k = 0; k < p->numel; k++) nrm += (double)f.grad[p->offset + k] * f.grad[p->offset + k];
        if (sqrt(nrm) <= 1e-6 * gmax) continue;
        checked++;
        double e = rel(h.grad + p->offset, f.grad + p->offset, p->numel);
        if (strstr(p->name, "attention.self.key.bias")) {
            /* exactly zero in exact arithmetic (the key bias shifts a row of scores by q·b, which the
             * softmax ignores), so both runs hold rounding noise only: its norm is checked against the key
             * weight's gradient, which precedes it in the table */
            const BqParam *wk = p - 1;
            double nw = 0, nb = 0;
            for (int64_t k = 0; k < wk->numel; k++) nw += (double)h.grad[wk->offset + k] * h.grad[wk->offset + k];
            for (int64_t k = 0; k < p->numel; k++) nb += (double)h.grad[p->offset + k] * h.grad[p->offset + k];
            e = sqrt(nb / nw);
        }
        worst = fmax(worst, e);
        if (e > bound && over++ < 5) fprintf(stderr, "  %s gradient relative %.3g > %.3g\n", p->name, e, bound);
    }
    EXPECT(over == 0, "%d of %d gradient tensors beyond the bound", over, checked);
    EXPECT(worst > 64.0 * ldexp(1.0, -24), "bf16 storage changed nothing (worst relative difference %.3g)", worst);
    printf("%d tensors stored as bf16 words (%.3f MiB saved); resident after the forward %.3f -> %.3f MiB; "
           "loss %.6f vs %.6f; %d gradient tensors; worst relative difference %.3g = %.3f of the bound %.3g\n",
           h.stored, expect / 1048576.0, f.resident / 1048576.0, h.resident / 1048576.0, h.loss, f.loss, checked,
           worst, worst / bound, bound);
    free(f.grad);
    free(h.grad);
    bq_bert_free(&f.m);
    bq_bert_free(&h.m);
    printf("test_bf16_storage: %s\n", fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
