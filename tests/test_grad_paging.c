/* Activation gradients as page blocks (autograd/tensor.c bq_tensor_new and bq_backward; autograd/core.c
 * bq_arena_alloc_pages and bq_arena_release).
 *
 * A training step of a small random BERT whose activations are large enough to be paged (2 layers,
 * hidden 64, 4 heads, intermediate 256, batch 8 x 64 tokens: every (B,T,H) tensor is 128 KiB, above
 * BQ_GRAD_PAGED_BYTES), in fp32 and in the `ort` QAT scheme (whose sole fake-quant ops quantize in place,
 * so a node's output is also its input), with dropout on and a padded batch, is run twice from the same
 * state: once with every activation gradient zeroed in place and kept (BqCtx.grad_unpaged, the layout
 * before paging) and once paged. The loss, the logits and every parameter gradient must be equal bit for
 * bit: giving pages back changes where gradients live, never a value. In the paged run:
 *  - after the forward, no paged gradient block is resident, except those of the intermediate
 *    activations that a fused GELU-Linear uses as scratch for its GELU output (layers/bert.c), which the
 *    forward writes;
 *  - after the backward, none is resident: each was given back once the op that produced its tensor had
 *    run its backward (a block given back too early would have zeroed a gradient still to be read, and
 *    the bitwise comparison above would fail).
 * The arena uses 4 KiB pages here so that residency shows exactly which blocks were written.
 * Prints the number of paged blocks, their bytes, the bytes resident after the forward and the largest
 * gradient difference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "autograd/tensor.h"
#include "layers/bert.h"
#include "layers/quant.h"
#include "tests/test_util.h"

enum { B = 8, T = 64, NL = 3, LAYERS = 2, HID = 64, INTER = 256 };

typedef struct Out {
    float loss;
    float logits[B * NL];
    float *grad;
    int64_t n;
    int blocks;
    size_t block_bytes, resident_fwd;
} Out;

/* 1 when t is the GELU input of a fused GELU-Linear node of the tape (its gradient block holds the
 * GELU output from the forward to that node's backward). */
static int gelu_scratch(const BqTape *tape, const BqTensor *t) {
    for (int64_t i = 0; i < tape->n; i++)
        if (tape->nodes[i].op == BQ_OP_GELU_LINEAR && tape->nodes[i].in[0] == t) return 1;
    return 0;
}

/* Resident bytes of the paged gradient blocks of the tape's outputs; the GELU scratch blocks are left out
 * when skip_scratch is set. Counts the blocks and their bytes into o when o is not NULL. */
static size_t paged_resident(const BqTape *tape, int skip_scratch, Out *o) {
    size_t in = 0;
    for (int64_t i = 0; i < tape->n; i++) {
        const BqTensor *t = tape->nodes[i].out;
        int seen = 0;
        for (int64_t j = 0; j < i; j++) seen |= tape->nodes[j].out == t; /* an in-place op's output */
        if (!t->owns_grad || seen || (skip_scratch && gelu_scratch(tape, t))) continue;
        size_t bytes = (size_t)bq_tensor_numel(t) * sizeof(float);
        in += bq_test_resident_bytes(t->grad, bytes);
        if (o) o->blocks++, o->block_bytes += bytes;
    }
    return in;
}

static void run(const char *scheme, int unpaged, Out *o) {
    memset(o, 0, sizeof *o);
    BqBertConfig cfg = bq_test_config(60, HID, LAYERS, 4, INTER, T, NL, 0.1f, 0.1f);
    BqRng rng;
    bq_rng_seed(&rng, 5);
    BqBert m;
    memset(&m, 0, sizeof m);
    BQ_CHECK(bq_bert_create(&m, &cfg, 1, &rng) == BQ_OK);
    if (scheme) {
        BqQuantConfig qc;
        bq_quant_config_default(&qc);
        BQ_CHECK(bq_scheme_parse(&qc.scheme, scheme, "scheme") == BQ_OK);
        BQ_CHECK(bq_quant_create(&m.quant, &m, &qc) == BQ_OK);
        m.quant->observe = 1; /* live observers: the same updates in both runs */
    }
    int32_t ids[B * T], types[B * T], labels[B] = {0, 2, 1, 2, 1, 0, 0, 2};
    float mask[B * T];
    BqBertInput in = bq_test_padded_input(B, T, 60, 11, ids, types, mask, labels);
    BqArena act;
    BqTape tape;
    bq_test_step_small_pages(&act, &tape);
    BqCtx ctx = {.act = &act, .tape = &tape, .training = 1, .rng_key = 99, .grad_unpaged = unpaged};
    BqTensor *lg = NULL, *ls = NULL;
    BQ_CHECK(bq_bert_forward(&m, &ctx, &in, &lg, &ls) == BQ_OK);
    if (!unpaged) {
        o->resident_fwd = paged_resident(&tape, 0, o);
        size_t other = paged_resident(&tape, 1, NULL);
        EXPECT(other == 0, "%s: %zu bytes of paged gradient blocks resident after the forward (only the GELU "
               "scratch may be)", scheme ? scheme : "fp32", other);
    }
    bq_backward(&ctx, ls);
    if (!unpaged) {
        size_t left = paged_resident(&tape, 0, NULL);
        EXPECT(left == 0, "%s: %zu bytes of paged gradient blocks still resident after the backward",
               scheme ? scheme : "fp32", left);
    }
    o->loss = ls->data[0];
    memcpy(o->logits, lg->data, sizeof o->logits);
    o->n = m.params.total;
    o->grad = bq_malloc(sizeof(float) * (size_t)o->n);
    memcpy(o->grad, m.params.grad, sizeof(float) * (size_t)o->n);
    bq_arena_free(&act);
    bq_tape_free(&tape);
    if (m.quant) bq_quant_free(m.quant), m.quant = NULL;
    bq_bert_free(&m);
}

int main(void) {
    const char *schemes[2] = {NULL, "ort"};
    double worst = 0;
    for (int s = 0; s < 2; s++) {
        const char *name = schemes[s] ? schemes[s] : "fp32";
        Out r, p;
        run(schemes[s], 1, &r);
        run(schemes[s], 0, &p);
        EXPECT(p.blocks >= 10 * LAYERS, "%s: only %d paged gradient blocks (the shapes are too small to page)",
               name, p.blocks);
        EXPECT(memcmp(&p.loss, &r.loss, sizeof r.loss) == 0, "%s: loss %.9g paged vs %.9g", name, p.loss, r.loss);
        EXPECT(memcmp(p.logits, r.logits, sizeof r.logits) == 0, "%s: logits differ", name);
        BQ_CHECK(p.n == r.n);
        double d = 0;
        int64_t ndiff = 0;
        for (int64_t i = 0; i < r.n; i++) {
            if (memcmp(&p.grad[i], &r.grad[i], sizeof(float))) ndiff++;
            d = fmax(d, fabs((double)p.grad[i] - r.grad[i]));
        }
        EXPECT(ndiff == 0, "%s: %lld of %lld parameter gradients differ (max %.3g)", name, (long long)ndiff,
               (long long)r.n, d);
        worst = fmax(worst, d);
        printf("%-5s %d paged gradient blocks, %.1f MiB; resident after the forward %.2f MiB (GELU scratch); "
               "after the backward 0; loss %.7f; max gradient difference %.3g\n",
               name, p.blocks, p.block_bytes / 1048576.0, p.resident_fwd / 1048576.0, p.loss, d);
        free(r.grad);
        free(p.grad);
    }
    printf("test_grad_paging: %s (max gradient difference %.3g)\n", fails ? "FAIL" : "ok", worst);
    return fails ? 1 : 0;
}
