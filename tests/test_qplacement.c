/* Quantizer placement tables (BQ_QPOINTS in layers/quant.h, layers/qscheme.c, docs/design.md §4): the
 * full ordered list of names of layer 0 for the ort, qdqbert and cpu schemes pinned as checkpoints
 * and ONNX graphs have them, counts per layer, positions of representative points, per-channel sizes,
 * bits (8; 7 for the cpu scheme's weights), the sole-consumer column, --fuse-qkv sharing, --exclude
 * matching (layer 1 vs layer 10), --per-tensor, --clip-gelu, the scale rule scale = amax/127
 * (amax/63 at 7 bits), and scheme names parsed in one place (bq_scheme_parse/bq_scheme_name). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "layers/bert.h"
#include "layers/quant.h"

static int failures = 0;
#define EXPECT(cond, ...)                  \
    do {                                   \
        if (!(cond)) {                     \
            printf("FAIL line %d: ", __LINE__); \
            printf(__VA_ARGS__);           \
            printf("\n");                  \
            failures++;                    \
        }                                  \
    } while (0)

static void model_shape(BqBert *m, int L) {
    memset(m, 0, sizeof *m);
    m->cfg.num_hidden_layers = L;
    m->cfg.hidden_size = 32;
    m->cfg.intermediate_size = 48;
    m->cfg.num_attention_heads = 4;
}

static int count_layer(BqQuantState *qs, int l, int weights) {
    int k = 0;
    for (int i = 0; i < qs->n; i++) k += qs->q[i].layer == l && qs->q[i].is_weight == weights;
    return k;
}

static const char *name_at(BqQuantState *qs, int l, int p) {
    BqQuantizer *q = bq_quant_at(qs, l, p);
    return q ? q->name : "(none)";
}

/* The quantizers of the embeddings and encoder layer 0 in table order, as every checkpoint written
 * so far lists them; a change here breaks reading old checkpoints and the ONNX names. */
static const char *const want_ort[] = {
    "bert.embeddings.LayerNorm.output_quantizer",
    "attention.self.query.weight_quantizer", "attention.self.key.weight_quantizer",
    "attention.self.value.weight_quantizer", "attention.output.dense.weight_quantizer",
    "intermediate.dense.weight_quantizer", "output.dense.weight_quantizer",
    "attention.self.query.output_quantizer", "attention.self.key.output_quantizer",
    "attention.self.value.output_quantizer", "attention.self.matmul_qk.output_quantizer",
    "attention.self.softmax.output_quantizer", "attention.self.matmul_av.output_quantizer",
    "attention.output.residual_add.output_quantizer", "attention.output.LayerNorm.output_quantizer",
    "intermediate.dense.output_quantizer", "intermediate.intermediate_act_fn.output_quantizer",
    "output.residual_add.output_quantizer", "output.LayerNorm.output_quantizer", NULL};
static const char *const want_qdq[] = {
    "attention.self.query.weight_quantizer", "attention.self.key.weight_quantizer",
    "attention.self.value.weight_quantizer", "attention.output.dense.weight_quantizer",
    "intermediate.dense.weight_quantizer", "output.dense.weight_quantizer",
    "attention.self.query.input_quantizer", "attention.self.key.input_quantizer",
    "attention.self.value.input_quantizer", "attention.output.dense.input_quantizer",
    "intermediate.dense.input_quantizer", "output.dense.input_quantizer",
    "attention.self.matmul_q_input_quantizer", "attention.self.matmul_k_input_quantizer",
    "attention.self.matmul_a_input_quantizer", "attention.self.matmul_v_input_quantizer",
    "attention.output.add_local_input_quantizer", "attention.output.add_residual_input_quantizer",
    "output.add_local_input_quantizer", "output.add_residual_input_quantizer", NULL};
static const char *const want_cpu[] = {
    "attention.self.query.weight_quantizer", "attention.self.key.weight_quantizer",
    "attention.self.value.weight_quantizer", "attention.output.dense.weight_quantizer",
    "intermediate.dense.weight_quantizer", "output.dense.weight_quantizer",
    "attention.self.input_quantizer", "attention.output.dense.input_quantizer",
    "intermediate.dense.input_quantizer", "output.dense.input_quantizer", NULL};

/* The first quantizers of qs are want[] (layer-0 roles prefixed with "bert.encoder.layer.0."). */
static void expect_order(BqQuantState *qs, const char *const *want, const char *scheme) {
    int i = 0;
    for (; want[i]; i++) {
        char full[200];
        snprintf(full, sizeof full, "%s%s", strncmp(want[i], "bert.", 5) ? "bert.encoder.layer.0." : "", want[i]);
        EXPECT(i < qs->n && strcmp(qs->q[i].name, full) == 0, "%s quantizer %d: %s, want %s", scheme, i,
               i < qs->n ? qs->q[i].name : "(none)", full);
    }
    EXPECT(qs->n > i && strncmp(qs->q[i].name, "bert.encoder.layer.1.", 21) == 0, "%s: layer 0 has extra quantizers",
           scheme);
}

int main(void) {
    const int L = 12;
    BqBert m;
    model_shape(&m, L);
    BqQuantConfig cfg;
    BqQuantState *qs = NULL;

    /* ort: 6 weight + 12 activation per layer + embeddings LN = 18L+1 */
    bq_quant_config_default(&cfg);
    EXPECT(bq_quant_create(&qs, &m, &cfg) == BQ_OK, "create ort");
    EXPECT(qs->n == 18 * L + 1, "ort count %d want %d", qs->n, 18 * L + 1);
    expect_order(qs, want_ort, "ort");
    for (int l = 0; l < L; l++) {
        EXPECT(count_layer(qs, l, 1) == 6, "ort layer %d weights %d", l, count_layer(qs, l, 1));
        EXPECT(count_layer(qs, l, 0) == 12, "ort layer %d acts %d", l, count_layer(qs, l, 0));
        for (int p = 0; p < BQ_QP_LAYER_COUNT; p++) {
            int want = p <= BQ_QP_OUT_LN; /* the 6 weights, then the 12 ort activations */
            EXPECT((bq_quant_at(qs, l, p) != NULL) == want, "ort layer %d point %d presence", l, p);
        }
    }
    EXPECT(strcmp(name_at(qs, BQ_QP_LAYER_EMB, -1), "bert.embeddings.LayerNorm.output_quantizer") == 0, "emb %s",
           name_at(qs, BQ_QP_LAYER_EMB, -1));
    EXPECT(strcmp(name_at(qs, 3, BQ_QP_Q_OUT), "bert.encoder.layer.3.attention.self.query.output_quantizer") == 0,
           "%s", name_at(qs, 3, BQ_QP_Q_OUT));
    EXPECT(strcmp(name_at(qs, 3, BQ_QP_W_Q), "bert.encoder.layer.3.attention.self.query.weight_quantizer") == 0,
           "%s", name_at(qs, 3, BQ_QP_W_Q));
    EXPECT(strcmp(name_at(qs, 11, BQ_QP_OUT_LN), "bert.encoder.layer.11.output.LayerNorm.output_quantizer") == 0,
           "%s", name_at(qs, 11, BQ_QP_OUT_LN));
    EXPECT(strcmp(name_at(qs, 0, BQ_QP_W_I), "bert.encoder.layer.0.intermediate.dense.weight_quantizer") == 0, "%s",
           name_at(qs, 0, BQ_QP_W_I));
    {
        BqQuantizer *wi = bq_quant_at(qs, 2, BQ_QP_W_I), *wo = bq_quant_at(qs, 2, BQ_QP_W_O);
        BqQuantizer *a = bq_quant_at(qs, 2, BQ_QP_PROBS);
        EXPECT(wi->nch == 48 && wi->axis == 0, "intermediate weight channels %lld", (long long)wi->nch);
        EXPECT(wo->nch == 32 && wo->axis == 0, "output weight channels %lld", (long long)wo->nch);
        EXPECT(a->nch == 1 && a->axis == -1 && !a->is_weight, "probs per tensor");
        EXPECT(a->layer == 2 && a->point == BQ_QP_PROBS, "probs position");
        /* the quantizer says where it sits */
        for (int i = 0; i < qs->n; i++) {
            BqQuantizer *q = &qs->q[i];
            EXPECT(bq_quant_at(qs, q->layer, q->point) == q, "slot of %s", q->name);
        }
        /* scale = amax/127 */
        a->amax[0] = 12.7f;
        bq_quant_update_scale(qs, a);
        EXPECT(a->scale[0] == 12.7f / 127.0f, "scale %g", a->scale[0]);
        a->amax[0] = 0.0f;
        bq_quant_update_scale(qs, a);
        EXPECT(a->scale[0] > 0.0f, "scale floor");
    }
    bq_quant_free(qs);

    /* qdqbert: input + weight of 6 Linears, 4 matmul inputs, 4 residual-add inputs = 20 per layer */
    cfg.scheme = BQ_SCHEME_QDQBERT;
    EXPECT(bq_quant_create(&qs, &m, &cfg) == BQ_OK, "create qdqbert");
    EXPECT(qs->n == 20 * L, "qdqbert count %d want %d", qs->n, 20 * L);
    expect_order(qs, want_qdq, "qdqbert");
    EXPECT(bq_quant_at(qs, BQ_QP_LAYER_EMB, -1) == NULL, "qdqbert has no embedding quantizer");
    for (int l = 0; l < L; l++) {
        EXPECT(count_layer(qs, l, 1) == 6 && count_layer(qs, l, 0) == 14, "qdqbert layer %d", l);
        EXPECT(bq_quant_at(qs, l, BQ_QP_ATTN_LN) == NULL && bq_quant_at(qs, l, BQ_QP_GELU_OUT) == NULL,
               "qdqbert quantizes no LayerNorm/GELU output");
    }
    EXPECT(strcmp(name_at(qs, 3, BQ_QP_MM1_Q), "bert.encoder.layer.3.attention.self.matmul_q_input_quantizer") == 0,
           "%s", name_at(qs, 3, BQ_QP_MM1_Q));
    EXPECT(strcmp(name_at(qs, 3, BQ_QP_Q_IN), "bert.encoder.layer.3.attention.self.query.input_quantizer") == 0,
           "%s", name_at(qs, 3, BQ_QP_Q_IN));
    EXPECT(strcmp(name_at(qs, 5, BQ_QP_ADD2_RESID), "bert.encoder.layer.5.output.add_residual_input_quantizer") ==
               0, "%s", name_at(qs, 5, BQ_QP_ADD2_RESID));
    bq_quant_free(qs);

    /* cpu: one Q/K/V input + 3 Linear inputs, 6 weights at 7 bits = 10 per layer */
    cfg.scheme = BQ_SCHEME_CPU;
    EXPECT(bq_quant_create(&qs, &m, &cfg) == BQ_OK, "create cpu");
    EXPECT(qs->n == 10 * L, "cpu count %d want %d", qs->n, 10 * L);
    expect_order(qs, want_cpu, "cpu");
    EXPECT(bq_quant_at(qs, BQ_QP_LAYER_EMB, -1) == NULL, "cpu has no embedding quantizer");
    for (int l = 0; l < L; l++) {
        EXPECT(count_layer(qs, l, 1) == 6 && count_layer(qs, l, 0) == 4, "cpu layer %d", l);
        for (int p = 0; p < BQ_QP_LAYER_COUNT; p++) {
            int want = p == BQ_QP_QKV_IN || p == BQ_QP_AO_IN || p == BQ_QP_I_IN || p == BQ_QP_O_IN || p <= BQ_QP_W_O;
            BqQuantizer *q = bq_quant_at(qs, l, p);
            EXPECT((q != NULL) == want, "cpu layer %d point %d presence", l, p);
            if (q) EXPECT(q->bits == (q->is_weight ? 7 : 8) && q->layer == l && q->point == p, "cpu %s bits %d", q->name, q->bits);
        }
    }
    EXPECT(strcmp(name_at(qs, 2, BQ_QP_QKV_IN), "bert.encoder.layer.2.attention.self.input_quantizer") == 0, "%s",
           name_at(qs, 2, BQ_QP_QKV_IN));
    EXPECT(strcmp(name_at(qs, 2, BQ_QP_O_IN), "bert.encoder.layer.2.output.dense.input_quantizer") == 0, "%s",
           name_at(qs, 2, BQ_QP_O_IN));
    EXPECT(strcmp(name_at(qs, 2, BQ_QP_W_I), "bert.encoder.layer.2.intermediate.dense.weight_quantizer") == 0, "%s",
           name_at(qs, 2, BQ_QP_W_I));
    {
        BqQuantizer *w = bq_quant_at(qs, 1, BQ_QP_W_I), *a = bq_quant_at(qs, 1, BQ_QP_I_IN);
        EXPECT(w->nch == 48 && w->axis == 0 && bq_quant_qmin(w) == -64 && bq_quant_qmax(w) == 63, "7-bit weight range");
        EXPECT(bq_quant_qmin(a) == -128 && bq_quant_qmax(a) == 127, "8-bit activation range");
        w->amax[0] = 6.3f;
        bq_quant_update_scale(qs, w);
        EXPECT(w->scale[0] == 6.3f / 63.0f, "7-bit scale %g", w->scale[0]);
    }
    EXPECT(bq_quant_scheme_weight_bits(BQ_SCHEME_CPU) == 7 && bq_quant_scheme_weight_bits(BQ_SCHEME_ORT) == 8 &&
               bq_quant_scheme_weight_bits(BQ_SCHEME_QDQBERT) == 8,
           "weight bits");
    bq_quant_free(qs);

    /* --fuse-qkv: K and V share Q's quantizer */
    bq_quant_config_default(&cfg);
    cfg.fuse_qkv = 1;
    EXPECT(bq_quant_create(&qs, &m, &cfg) == BQ_OK, "create fused");
    EXPECT(qs->n == 16 * L + 1, "fused count %d", qs->n);
    EXPECT(bq_quant_at(qs, 4, BQ_QP_K_OUT) == bq_quant_at(qs, 4, BQ_QP_Q_OUT) &&
               bq_quant_at(qs, 4, BQ_QP_V_OUT) == bq_quant_at(qs, 4, BQ_QP_Q_OUT),
           "fused slots");
    bq_quant_free(qs);

    /* --exclude: layer 1 stays fp32, layer 10 does not; embeddings excluded by prefix */
    bq_quant_config_default(&cfg);
    strcpy(cfg.exclude, "classifier, pooler,encoder.layer.1,bert.embeddings");
    EXPECT(bq_quant_create(&qs, &m, &cfg) == BQ_OK, "create excluded");
    EXPECT(qs->n == 18 * (L - 1), "excluded count %d want %d", qs->n, 18 * (L - 1));
    EXPECT(count_layer(qs, 1, 0) + count_layer(qs, 1, 1) == 0, "layer 1 excluded");
    EXPECT(count_layer(qs, 10, 0) == 12, "layer 10 kept");
    EXPECT(bq_quant_at(qs, BQ_QP_LAYER_EMB, -1) == NULL, "embeddings excluded");
    bq_quant_free(qs);

    /* --per-tensor weights; --clip-gelu caps only the GELU output */
    bq_quant_config_default(&cfg);
    cfg.per_tensor_weights = 1;
    cfg.clip_gelu = 10.0f;
    EXPECT(bq_quant_create(&qs, &m, &cfg) == BQ_OK, "create per-tensor");
    for (int i = 0; i < qs->n; i++) EXPECT(qs->q[i].nch == 1 && qs->q[i].axis == -1, "%s per tensor", qs->q[i].name);
    BqQuantizer *g = bq_quant_at(qs, 0, BQ_QP_GELU_OUT), *io = bq_quant_at(qs, 0, BQ_QP_INTER_OUT);
    g->amax[0] = io->amax[0] = 25.0f;
    bq_quant_update_scale(qs, g);
    bq_quant_update_scale(qs, io);
    EXPECT(g->amax[0] == 10.0f && g->scale[0] == 10.0f / 127.0f, "gelu clipped to %g", g->amax[0]);
    EXPECT(io->amax[0] == 25.0f, "intermediate output not clipped");
    bq_quant_free(qs);

    /* the sole-consumer column: false exactly where another op reads the same tensor (layers/bert.c) */
    for (int p = 0; p < BQ_QP_LAYER_COUNT; p++) {
        int shared = p == BQ_QP_Q_IN || p == BQ_QP_K_IN || p == BQ_QP_V_IN || p == BQ_QP_QKV_IN || p == BQ_QP_I_IN ||
                     p == BQ_QP_ADD1_RESID || p == BQ_QP_ADD2_RESID;
        if (!bq_qpoint_defs[p].is_weight)
            EXPECT(bq_qpoint_defs[p].sole == !shared, "point %s sole %d", bq_qpoint_defs[p].role, bq_qpoint_defs[p].sole);
    }

    /* scheme names: one parser, names round trip, an unknown one is an input error naming the flag
     * and listing the valid names */
    const char *names[] = {"ort", "qdqbert", "cpu"};
    for (int s = 0; s < BQ_SCHEME_COUNT; s++) {
        BqScheme sc = (BqScheme)-1;
        EXPECT(bq_scheme_parse(&sc, names[s], "--scheme") == BQ_OK && (int)sc == s && !strcmp(bq_scheme_name(sc), names[s]),
               "scheme %s", names[s]);
    }
    BqScheme sc = BQ_SCHEME_CPU;
    EXPECT(bq_scheme_parse(&sc, "tflite", "--scheme") == BQ_EINVAL && strstr(bq_errmsg(), "--scheme") &&
               strstr(bq_errmsg(), "tflite") && strstr(bq_errmsg(), "ort, qdqbert, cpu") && sc == BQ_SCHEME_CPU,
           "bad scheme: %s", bq_errmsg());
    EXPECT(bq_scheme_parse(&sc, "ORT", "quant config: scheme") == BQ_EINVAL && strstr(bq_errmsg(), "quant config: scheme"),
           "scheme names are case-sensitive: %s", bq_errmsg());

    printf("test_qplacement: %d failures (max error 0 expected)\n", failures);
    return failures ? 1 : 0;
}
