/* ONNX export (export/onnx_bert.c) of a tiny random BERT, fp32 and Q/DQ (ort, qdqbert and cpu
 * schemes; default and CPU layouts), opsets 13 and 17: parsed back with protobuf-c and checked for
 * structure: inputs/outputs, opset and IR version, op counts (MatMul, LayerNormalization vs its
 * decomposition, Erf, Softmax), the [K,N] weights with per-channel DequantizeLinear(axis 1)
 * reproducing the fake-quantized weights (int8; 7-bit values for the cpu scheme; uint8 w + 128 with
 * zero point 128 for 8-bit weights in the CPU layout), activation zero points (int8 0, or uint8 128 in
 * the CPU layout), one Q/DQ per quantized activation, the shared DQ of the embeddings output (Q/K/V
 * MatMuls + residual), topological order, and the error path (unwritable output: error, no file).
 * `test_onnx_export --write DIR` also saves the models as native checkpoints DIR/{fp32,ort,qdqbert,cpu}
 * for tests/python/test_onnx_export.py. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "export/ckpt.h"
#include "export/onnx_bert.h"
#include "export/onnx_graph.h"
#include "layers/quant.h"
#include "onnx.pb-c.h"
#include "tests/test_util.h"

#define L 2
static double max_err = 0;

static void make_model(BqBert *m, uint64_t seed) {
    BqBertConfig c = bq_test_config(100, 32, L, 4, 64, 64, 2, 0.0f, 0.2f);
    BqRng rng;
    bq_rng_seed(&rng, seed);
    BQ_CHECK(bq_bert_create(m, &c, 0, &rng) == BQ_OK);
    /* non-trivial biases and LayerNorm parameters */
    for (int i = 0; i < m->params.n; i++) {
        BqParam *p = &m->params.p[i];
        if (p->init != BQ_INIT_NORMAL)
            for (int64_t k = 0; k < p->numel; k++)
                m->params.data[p->offset + k] += 0.1f * bq_rng_normal(&rng);
    }
}

/* one inference forward on a random batch so every quantizer gets its range */
static void init_ranges(BqBert *m) {
    enum { B = 3, T = 16 };
    int32_t ids[B * T], types[B * T];
    float mask[B * T];
    BqRng rng;
    bq_rng_seed(&rng, 7);
    for (int i = 0; i < B * T; i++) {
        ids[i] = (int32_t)bq_rng_below(&rng, 100);
        types[i] = (i % T) >= T / 2;
        mask[i] = (i % T) < T - (i / T) * 3;
    }
    BqArena act = {0};
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 28, "act") == BQ_OK);
    BqBertInput b = {.B = B, .T = T, .input_ids = ids, .attention_mask = mask, .token_type_ids = types};
    BqCtx ctx = {.act = &act};
    BqTensor *logits;
    BQ_CHECK(bq_bert_forward(m, &ctx, &b, &logits, NULL) == BQ_OK);
    bq_arena_free(&act);
}

static Onnx__ModelProto *load(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = bq_malloc((size_t)n);
    BQ_CHECK(fread(buf, 1, (size_t)n, f) == (size_t)n);
    fclose(f);
    Onnx__ModelProto *mp = onnx__model_proto__unpack(NULL, (size_t)n, buf);
    free(buf);
    return mp;
}

static int count_op(const Onnx__GraphProto *g, const char *op) {
    int k = 0;
    for (size_t i = 0; i < g->n_node; i++) k += !strcmp(g->node[i]->op_type, op);
    return k;
}
static int consumers(const Onnx__GraphProto *g, const char *name) {
    int k = 0;
    for (size_t i = 0; i < g->n_node; i++)
        for (size_t j = 0; j < g->node[i]->n_input; j++) k += !strcmp(g->node[i]->input[j], name);
    return k;
}
static const Onnx__TensorProto *init_named(const Onnx__GraphProto *g, const char *name) {
    for (size_t i = 0; i < g->n_initializer; i++)
        if (!strcmp(g->initializer[i]->name, name)) return g->initializer[i];
    return NULL;
}
static const Onnx__NodeProto *producer(const Onnx__GraphProto *g, const char *name) {
    for (size_t i = 0; i < g->n_node; i++)
        if (!strcmp(g->node[i]->output[0], name)) return g->node[i];
    return NULL;
}

/* every node input is a graph input, an initializer or an earlier node's output */
static int topo_ok(const Onnx__GraphProto *g) {
    for (size_t i = 0; i < g->n_node; i++)
        for (size_t j = 0; j < g->node[i]->n_input; j++) {
            const char *in = g->node[i]->input[j];
            int ok = !*in || init_named(g, in) != NULL;
            for (size_t k = 0; !ok && k < g->n_input; k++) ok = !strcmp(g->input[k]->name, in);
            for (size_t k = 0; !ok && k < i; k++)
                for (size_t o = 0; o < g->node[k]->n_output; o++) ok |= !strcmp(g->node[k]->output[o], in);
            if (!ok) {
                printf("node %s: input %s undefined\n", g->node[i]->name, in);
                return 0;
            }
        }
    return 1;
}

static void check_export(BqBert *m, BqQuantState *qs, int opset, int cpu_layout, const char *path) {
    BqOnnxOptions o = {.opset = opset, .qdq = qs != NULL, .token_type_ids = 1, .cpu_layout = cpu_layout};
    BqOnnxStats s;
    int st = bq_onnx_export_bert(m, qs, &o, path, &s);
    EXPECT(st == BQ_OK, "%s: export failed: %s", path, bq_errmsg());
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    EXPECT(access(tmp, F_OK) != 0, "%s left behind", tmp);
    Onnx__ModelProto *mp = load(path);
    EXPECT(mp != NULL, "%s: does not parse", path);
    if (!mp) return;
    const Onnx__GraphProto *g = mp->graph;
    EXPECT(mp->n_opset_import == 1 && mp->opset_import[0]->version == opset, "opset");
    EXPECT(mp->ir_version == bq_onnx_ir_version(opset), "ir_version %lld", (long long)mp->ir_version);
    EXPECT(g->n_input == 3 && !strcmp(g->input[0]->name, "input_ids") && !strcmp(g->input[1]->name, "attention_mask") &&
               !strcmp(g->input[2]->name, "token_type_ids"), "inputs");
    EXPECT(g->n_input == 3 && g->input[0]->type->tensor_type->elem_type == 7 &&
               !strcmp(g->input[0]->type->tensor_type->shape->dim[1]->dim_param, "sequence"), "input type/dims");
    EXPECT(g->n_output == 1 && !strcmp(g->output[0]->name, "logits"), "output");
    EXPECT(topo_ok(g), "%s: not in topological order", path);
    EXPECT(count_op(g, "MatMul") == 8 * L + 2, "MatMul %d", count_op(g, "MatMul"));
    EXPECT(count_op(g, "Softmax") == L && count_op(g, "Erf") == L, "Softmax/Erf");
    if (opset >= 17) EXPECT(count_op(g, "LayerNormalization") == 2 * L + 1 && count_op(g, "ReduceMean") == 0, "LN op");
    else EXPECT(count_op(g, "LayerNormalization") == 0 && count_op(g, "ReduceMean") == 2 * (2 * L + 1), "LN decomposed");
    int nq = count_op(g, "QuantizeLinear"), ndq = count_op(g, "DequantizeLinear");
    if (!qs) {
        EXPECT(nq == 0 && ndq == 0, "fp32 export has Q/DQ");
    } else {
        int acts = 0;
        for (int i = 0; i < qs->n; i++) acts += !qs->q[i].is_weight;
        EXPECT(ndq == nq + 6 * L, "DQ %d = Q %d + %d weights", ndq, nq, 6 * L);
        EXPECT(s.int8_weights == 6 * L, "int8 weights %d", s.int8_weights);
        const int cpu = cpu_layout || qs->cfg.scheme == BQ_SCHEME_CPU;
        EXPECT(s.cpu_layout == cpu, "stats.cpu_layout %d", s.cpu_layout);
        if (qs->cfg.scheme == BQ_SCHEME_ORT) EXPECT(nq == acts && nq == 12 * L + 1, "ort Q %d, quantizers %d", nq, acts);
        else if (qs->cfg.scheme == BQ_SCHEME_CPU) EXPECT(nq == acts && nq == 4 * L, "cpu Q %d, quantizers %d", nq, acts);
        else EXPECT(nq <= acts && nq > 0, "qdqbert Q %d, quantizers %d", nq, acts);
        /* activation Q/DQ zero points: int8 0, or uint8 128 in the CPU layout (the same values) */
        for (size_t i = 0; i < g->n_node; i++) {
            const Onnx__NodeProto *n = g->node[i];
            if (strcmp(n->op_type, "QuantizeLinear")) continue;
            const Onnx__TensorProto *zp = init_named(g, n->input[2]);
            EXPECT(zp && zp->n_dims == 0 && zp->raw_data.len == 1, "Q zero point");
            if (zp && zp->raw_data.len == 1)
                EXPECT(cpu ? zp->data_type == 2 && zp->raw_data.data[0] == 128 : zp->data_type == 3 && zp->raw_data.data[0] == 0,
                       "%s: zero point type %d value %d", n->name, zp->data_type, zp->raw_data.data[0]);
        }
        /* no two QuantizeLinear of the same tensor with the same scale */
        for (size_t i = 0; i < g->n_node; i++)
            for (size_t j = i + 1; j < g->n_node; j++) {
                const Onnx__NodeProto *a = g->node[i], *b = g->node[j];
                if (strcmp(a->op_type, "QuantizeLinear") || strcmp(b->op_type, "QuantizeLinear")) continue;
                if (strcmp(a->input[0], b->input[0])) continue;
                const Onnx__TensorProto *sa = init_named(g, a->input[1]), *sb = init_named(g, b->input[1]);
                EXPECT(memcmp(sa->raw_data.data, sb->raw_data.data, 4) != 0, "duplicate Q/DQ of %s", a->input[0]);
            }
        /* weights: int8 (uint8 + 128 for 8-bit weights in the CPU layout) [K,N] raw_data, DQ axis 1 with
         * scale [N] and zero point [N], q*s within s/2 of W, q inside the quantizer's bits */
        const BqTensor *W = &m->layers[0].q_w;
        int64_t N = W->shape[0], K = W->shape[1];
        const Onnx__TensorProto *wq = init_named(g, "bert.encoder.layer.0.attention.self.query.weight_quantized");
        const Onnx__TensorProto *ws = init_named(g, "bert.encoder.layer.0.attention.self.query.weight_scale");
        EXPECT(wq && ws, "query weight initializers");
        BqQuantizer *wqz = bq_quant_at(qs, 0, BQ_QP_W_Q);
        const int u8w = cpu && wqz->bits == 8;
        const Onnx__TensorProto *wz = init_named(g, "bert.encoder.layer.0.attention.self.query.weight_zero_point");
        EXPECT(wz && wz->n_dims == 1 && wz->dims[0] == N && wz->data_type == (u8w ? 2 : 3), "weight zero point");
        for (size_t i = 0; wz && i < wz->raw_data.len; i++)
            EXPECT(wz->raw_data.data[i] == (u8w ? 128 : 0), "weight zero point value");
        EXPECT(wqz->bits == (qs->cfg.scheme == BQ_SCHEME_CPU ? 7 : 8), "%s weight bits %d", bq_scheme_name(qs->cfg.scheme), wqz->bits);
        if (wq && ws) {
            EXPECT(wq->data_type == (u8w ? 2 : 3) && wq->n_dims == 2 && wq->dims[0] == K && wq->dims[1] == N &&
                       wq->raw_data.len == (size_t)(K * N), "int8 [K,N] raw_data");
            EXPECT(ws->n_dims == 1 && ws->dims[0] == N, "scale [N]");
            const float *sc = (const float *)ws->raw_data.data;
            double e = 0;
            int qlo = 0, qhi = 0;
            for (int64_t n = 0; n < N; n++) {
                EXPECT(sc[n] == wqz->scale[n], "scale %lld", (long long)n);
                for (int64_t k = 0; k < K; k++) {
                    uint8_t raw = wq->raw_data.data[k * N + n];
                    int qv = u8w ? (int)raw - 128 : (int)(int8_t)raw;
                    qlo = qv < qlo ? qv : qlo;
                    qhi = qv > qhi ? qv : qhi;
                    double d = fabs((double)qv * sc[n] - W->data[n * K + k]);
                    if (d > e) e = d;
                    EXPECT(d <= sc[n] * 0.5 + 1e-7, "weight (%lld,%lld) off by %g", (long long)n, (long long)k, d);
                }
            }
            EXPECT(qlo >= bq_quant_qmin(wqz) && qhi <= bq_quant_qmax(wqz) && qhi == bq_quant_qmax(wqz),
                   "weight values [%d, %d] for %d bits", qlo, qhi, wqz->bits);
            if (e > max_err) max_err = e;
            printf("%s: max |dequantized weight - weight| %.3g, values [%d, %d]\n", path, e, qlo, qhi);
            const Onnx__NodeProto *dq = NULL;
            for (size_t i = 0; i < g->n_node; i++)
                if (!strcmp(g->node[i]->input[0], wq->name)) dq = g->node[i];
            EXPECT(dq && !strcmp(dq->op_type, "DequantizeLinear") && dq->n_attribute == 1 &&
                       !strcmp(dq->attribute[0]->name, "axis") && dq->attribute[0]->i == 1, "weight DQ axis 1");
            if (dq) {
                EXPECT(consumers(g, dq->output[0]) == 1, "weight DQ consumers");
            }
        }
        if (qs->cfg.scheme == BQ_SCHEME_CPU) {
            /* layer input: one DQ read by the Q, K, V MatMuls; the residual Add reads the fp32 tensor */
            const Onnx__NodeProto *mmq = producer(g, "/bert/encoder/layer.1/attention/self/query/MatMul_output_0");
            const Onnx__NodeProto *res = producer(g, "/bert/encoder/layer.1/attention/output/Add_output_0");
            EXPECT(mmq && res, "query MatMul, residual Add");
            if (mmq && res) {
                const Onnx__NodeProto *dq = producer(g, mmq->input[0]);
                EXPECT(dq && !strcmp(dq->op_type, "DequantizeLinear"), "query MatMul reads a DQ");
                EXPECT(consumers(g, mmq->input[0]) == 3, "QKV DQ consumers %d", consumers(g, mmq->input[0]));
                const Onnx__NodeProto *r = producer(g, res->input[1]);
                EXPECT(r && strcmp(r->op_type, "DequantizeLinear") != 0, "residual reads fp32");
            }
        }
        if (qs->cfg.scheme == BQ_SCHEME_ORT) {
            /* embeddings output: one DQ read by the Q, K, V MatMuls and the residual Add */
            const Onnx__NodeProto *mmq = producer(g, "/bert/encoder/layer.0/attention/self/query/MatMul_output_0");
            EXPECT(mmq != NULL, "query MatMul");
            if (mmq) {
                const Onnx__NodeProto *dq = producer(g, mmq->input[0]);
                EXPECT(dq && !strcmp(dq->op_type, "DequantizeLinear"), "query MatMul reads a DQ");
                EXPECT(consumers(g, mmq->input[0]) == 4, "shared DQ consumers %d", consumers(g, mmq->input[0]));
            }
        }
    }
    onnx__model_proto__free_unpacked(mp, NULL);
}

static void save_ckpt(BqBert *m, const char *dir, const char *sub) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, sub);
    int st = bq_ckpt_save(m, p, NULL, NULL);
    EXPECT(st == BQ_OK, "save %s: %s", p, bq_errmsg());
}

int main(int argc, char **argv) {
    const char *write_dir = argc == 3 && !strcmp(argv[1], "--write") ? argv[2] : NULL;
    char dir[64];
    bq_test_tmpdir(dir, sizeof dir, "onnx");
    char path[512];
    BqBert m;
    make_model(&m, 1);

    /* fp32, opsets 13 and 17 */
    snprintf(path, sizeof path, "%s/fp32_13.onnx", dir);
    check_export(&m, NULL, 13, 0, path);
    snprintf(path, sizeof path, "%s/fp32_17.onnx", dir);
    check_export(&m, NULL, 17, 0, path);
    if (write_dir) save_ckpt(&m, write_dir, "fp32");

    /* errors: opset range, Q/DQ without quantizers, unwritable output */
    BqOnnxOptions o = {.opset = 12, .qdq = 0, .token_type_ids = 1};
    EXPECT(bq_onnx_export_bert(&m, NULL, &o, path, NULL) == BQ_EINVAL, "opset 12 accepted");
    o.opset = 13;
    o.qdq = 1;
    EXPECT(bq_onnx_export_bert(&m, NULL, &o, path, NULL) == BQ_EINVAL, "qdq without quantizers accepted");
    o.qdq = 0;
    int st = bq_onnx_export_bert(&m, NULL, &o, "/nonexistent_bq_dir/x.onnx", NULL);
    EXPECT(st == BQ_EIO, "unwritable path: status %d", st);
    EXPECT(access("/nonexistent_bq_dir/x.onnx.tmp", F_OK) != 0, "tmp file");
    printf("unwritable path -> %s\n", bq_errmsg());

    /* Q/DQ for each scheme */
    const char *schemes[3] = {"ort", "qdqbert", "cpu"};
    for (int s = 0; s < 3; s++) {
        BqQuantConfig cfg;
        bq_quant_config_default(&cfg);
        BQ_CHECK(bq_scheme_parse(&cfg.scheme, schemes[s], "scheme") == BQ_OK);
        BqQuantState *qs = NULL;
        EXPECT(bq_quant_create(&qs, &m, &cfg) == BQ_OK, "quant create %s", schemes[s]);
        if (!qs) continue;
        m.quant = qs;
        /* an uninitialised quantizer is an error naming it */
        o.qdq = 1;
        snprintf(path, sizeof path, "%s/uninit.onnx", dir);
        EXPECT(bq_onnx_export_bert(&m, qs, &o, path, NULL) == BQ_EINVAL && access(path, F_OK) != 0,
               "uninitialised quantizers accepted");
        init_ranges(&m);
        EXPECT(bq_quant_count_initialized(qs) == qs->n, "ranges set");
        snprintf(path, sizeof path, "%s/%s_13.onnx", dir, schemes[s]);
        check_export(&m, qs, 13, 0, path);
        snprintf(path, sizeof path, "%s/%s_17.onnx", dir, schemes[s]);
        check_export(&m, qs, 17, 0, path);
        snprintf(path, sizeof path, "%s/%s_13_cpu.onnx", dir, schemes[s]);
        check_export(&m, qs, 13, 1, path);
        if (write_dir) save_ckpt(&m, write_dir, schemes[s]);
        m.quant = NULL;
        bq_quant_free(qs);
    }
    bq_bert_free(&m);
    bq_test_rmtree(dir);
    printf("test_onnx_export: %s (max error %g)\n", fails ? "FAILED" : "ok", max_err);
    return fails ? 1 : 0;
}
