/* bq_bert_linear_reach (layers/bert.c), derived from the `feeds` column of BQ_QPOINTS (layers/quant.h) and
 * the layer's data flow, against the literal masks of the hand-written switch it replaced, for every
 * point of the table, the embeddings' point (-1) and a point past the table: prints the number of
 * mismatches and the largest number of differing Linears, and exits non-zero on any mismatch. */
#include <stdio.h>

#include "layers/bert.h"
#include "layers/quant.h"

/* The masks of the switch bq_bert_linear_reach had before the table (copied as it was). */
static unsigned expected_reach(int point) {
    const unsigned q = 1u << BQ_LIN_Q, k = 1u << BQ_LIN_K, v = 1u << BQ_LIN_V, ao = 1u << BQ_LIN_AO,
                   i = 1u << BQ_LIN_I, o = 1u << BQ_LIN_O;
    switch (point) {
    case BQ_QP_W_Q: case BQ_QP_Q_IN: return q | ao | i | o;
    case BQ_QP_W_K: case BQ_QP_K_IN: return k | ao | i | o;
    case BQ_QP_W_V: case BQ_QP_V_IN: return v | ao | i | o;
    case BQ_QP_Q_OUT: case BQ_QP_K_OUT: case BQ_QP_V_OUT: case BQ_QP_MM1_Q: case BQ_QP_MM1_K: case BQ_QP_SCORES:
    case BQ_QP_PROBS: case BQ_QP_MM2_P: case BQ_QP_MM2_V: case BQ_QP_CONTEXT: case BQ_QP_AO_IN: case BQ_QP_W_AO:
        return ao | i | o;
    case BQ_QP_ADD1_LOCAL: case BQ_QP_ADD1_RESID: case BQ_QP_ATTN_RESID: case BQ_QP_ATTN_LN: case BQ_QP_I_IN:
    case BQ_QP_W_I: case BQ_QP_INTER_OUT:
        return i | o;
    case BQ_QP_GELU_OUT: case BQ_QP_O_IN: case BQ_QP_W_O: return o;
    case BQ_QP_ADD2_LOCAL: case BQ_QP_ADD2_RESID: case BQ_QP_OUT_RESID: case BQ_QP_OUT_LN: return 0;
    default: return q | k | v | ao | i | o;
    }
}

static int popcount(unsigned x) {
    int n = 0;
    for (; x; x &= x - 1) n++;
    return n;
}

int main(void) {
    int mismatches = 0, max_err = 0, checked = 0;
    for (int p = BQ_QP_LAYER_EMB; p <= BQ_QP_LAYER_COUNT; p++) {
        unsigned got = bq_bert_linear_reach(p), want = expected_reach(p);
        const char *name = p >= 0 && p < BQ_QP_LAYER_COUNT ? bq_qpoint_defs[p].role : "(outside the table)";
        int err = popcount(got ^ want);
        if (err) {
            printf("FAIL point %d %s: reach 0x%02x, expected 0x%02x\n", p, name, got, want);
            mismatches++;
        }
        if (err > max_err) max_err = err;
        checked++;
    }
    printf("linear reach: %d points checked, %d mismatches, max error %d Linears\n", checked, mismatches, max_err);
    return mismatches ? 1 : 0;
}
