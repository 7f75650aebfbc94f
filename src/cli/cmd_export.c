/* `bertqat export`: ONNX export of a checkpoint (export/onnx_bert.h, docs/design.md). fp32 for an fp32
 * checkpoint, Q/DQ at the quantizer points for a quantized one. --dump-logits writes a random padded
 * batch and bertqat's own logits for it as JSON ("logits" (B, num_labels), or for a question-answering
 * model "start_logits" and "end_logits" (B,T)), so tests compare ONNX Runtime against the C forward on
 * exactly the exported weights. The logits are those `eval` computes (bq_infer_forward) with the engine
 * --dump-engine picks: fake quant by default (the forward whose quantizer points the graph mirrors), int8
 * for the integer engine that `eval` uses by default. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "export/ckpt.h"
#include "export/onnx_bert.h"
#include "layers/bert_int8.h"
#include "layers/quant.h"
#include "src/cli/args.h"
#include "src/cli/cli.h"
#include "src/cli/cmd_common.h"
#include "src/cli/qa_setup.h"
#include "src/train.h"

#define ACT_RESERVE ((size_t)16 << 30)

/* Random batch (ids uniform in the vocabulary, rows padded to random lengths >= T/2, types 0 then 1),
 * forward in inference mode, JSON {input_ids, attention_mask, token_type_ids?, logits} to path. */
/* Reads one (B,T) integer matrix key of a JSON object into *out (allocated). */
static int read_matrix(json_t *j, const char *key, const char *path, int *B, int *T, int32_t **out) {
    json_t *a = json_object_get(j, key);
    if (!a) return BQ_OK;
    if (!json_is_array(a) || json_array_size(a) == 0 || !json_is_array(json_array_get(a, 0)))
        return bq_err(BQ_EFORMAT, "%s: \"%s\" must be a non-empty array of arrays", path, key);
    int b = (int)json_array_size(a), t = (int)json_array_size(json_array_get(a, 0));
    if (*B && (b != *B || t != *T)) return bq_err(BQ_EFORMAT, "%s: \"%s\" is not %dx%d", path, key, *B, *T);
    if (t == 0) return bq_err(BQ_EFORMAT, "%s: \"%s\" has empty rows", path, key);
    *B = b, *T = t;
    *out = bq_malloc(sizeof(int32_t) * (size_t)(b * t));
    for (int r = 0; r < b; r++) {
        json_t *row = json_array_get(a, (size_t)r);
        if (!json_is_array(row) || (int)json_array_size(row) != t)
            return bq_err(BQ_EFORMAT, "%s: \"%s\" row %d does not have %d entries", path, key, r, t);
        for (int c = 0; c < t; c++) {
            json_t *v = json_array_get(row, (size_t)c);
            if (!json_is_integer(v)) return bq_err(BQ_EFORMAT, "%s: \"%s\"[%d][%d] is not an integer", path, key, r, c);
            (*out)[r * t + c] = (int32_t)json_integer_value(v);
        }
    }
    return BQ_OK;
}

/* The random batch of --dump-logits: B rows of T tokens (T capped at the model's positions; returns
 * the T used), the first row full, the others between T/2 and T real tokens of random ids from seed,
 * then padding; with_types marks the second half of each row's real tokens as type 1 (when the model
 * has two types). *ids, *types and *mask are allocated (the caller frees them). */
static int random_batch(const BqBert *m, int B, int T, int seed, int with_types, int32_t **ids_out,
                        int32_t **types_out, float **mask_out) {
    if (T > m->cfg.max_position_embeddings) T = m->cfg.max_position_embeddings;
    int32_t *ids = *ids_out = bq_malloc(sizeof(int32_t) * (size_t)(B * T));
    int32_t *types = *types_out = bq_calloc((size_t)(B * T), sizeof(int32_t));
    float *mask = *mask_out = bq_calloc((size_t)(B * T), sizeof(float));
    BqRng rng;
    bq_rng_seed(&rng, (uint64_t)seed);
    for (int b = 0; b < B; b++) {
        int len = b == 0 ? T : T / 2 + (int)bq_rng_below(&rng, (uint64_t)(T - T / 2) + 1);
        if (len < 1) len = 1;
        for (int t = 0; t < T; t++) {
            int i = b * T + t;
            ids[i] = t < len ? (int32_t)bq_rng_below(&rng, (uint64_t)m->cfg.vocab_size) : m->cfg.pad_token_id;
            mask[i] = t < len ? 1.f : 0.f;
            types[i] = (with_types && m->cfg.type_vocab_size > 1 && t >= len / 2 && t < len) ? 1 : 0;
        }
    }
    return T;
}

/* The JSON of --dump-logits: the batch (input_ids, attention_mask, token_type_ids when with_types), the
 * logits ((B, labels), or start_logits and end_logits of the QA head), whether the model is quantized
 * and the engine that ran it. */
static json_t *logits_json(const BqBert *m, const char *engine, int B, int T, int with_types, const int32_t *ids,
                           const float *mask, const int32_t *types, const BqTensor *logits) {
    json_t *j = json_object();
    json_t *ji = json_array(), *jm = json_array(), *jt = json_array(), *jl = json_array(), *je = json_array();
    for (int b = 0; b < B; b++) {
        json_t *ri = json_array(), *rm = json_array(), *rt = json_array(), *rl = json_array();
        for (int t = 0; t < T; t++) {
            json_array_append_new(ri, json_integer(ids[b * T + t]));
            json_array_append_new(rm, json_integer((int)mask[b * T + t]));
            json_array_append_new(rt, json_integer(types[b * T + t]));
        }
        if (m->cfg.head == BQ_HEAD_QA) { /* (B,T,2): start then end rows */
            json_t *re = json_array();
            for (int t = 0; t < T; t++) {
                json_array_append_new(rl, json_real(logits->data[(b * T + t) * 2]));
                json_array_append_new(re, json_real(logits->data[(b * T + t) * 2 + 1]));
            }
            json_array_append_new(je, re);
        } else {
            for (int k = 0; k < m->cfg.num_labels; k++)
                json_array_append_new(rl, json_real(logits->data[b * m->cfg.num_labels + k]));
        }
        json_array_append_new(ji, ri);
        json_array_append_new(jm, rm);
        json_array_append_new(jt, rt);
        json_array_append_new(jl, rl);
    }
    json_object_set_new(j, "input_ids", ji);
    json_object_set_new(j, "attention_mask", jm);
    if (with_types) json_object_set_new(j, "token_type_ids", jt);
    else json_decref(jt);
    if (m->cfg.head == BQ_HEAD_QA) {
        json_object_set_new(j, "start_logits", jl);
        json_object_set_new(j, "end_logits", je);
    } else {
        json_object_set_new(j, "logits", jl);
        json_decref(je);
    }
    json_object_set_new(j, "quantized", json_boolean(m->quant != NULL));
    json_object_set_new(j, "engine", json_string(engine));
    return j;
}

static int dump_logits(BqBert *m, BqInt8Engine *e, const char *engine, const char *path, int B, int T, int seed,
                       int with_types, const char *inputs) {
    int st = BQ_OK;
    BqArena act = {0};
    json_t *j = NULL, *jin = NULL;
    char *tmp = NULL;
    int32_t *ids = NULL, *types = NULL, *mask32 = NULL;
    float *mask = NULL;
    if (inputs) { /* the batch from a JSON file {input_ids, attention_mask[, token_type_ids]} */
        json_error_t je;
        jin = json_load_file(inputs, 0, &je);
        if (!jin) return bq_err(BQ_EFORMAT, "%s: line %d: %s", inputs, je.line, je.text);
        B = T = 0;
        if ((st = read_matrix(jin, "input_ids", inputs, &B, &T, &ids))) goto cleanup;
        if (!ids) {
            st = bq_err(BQ_EFORMAT, "%s: no \"input_ids\"", inputs);
            goto cleanup;
        }
        if ((st = read_matrix(jin, "attention_mask", inputs, &B, &T, &mask32))) goto cleanup;
        if (with_types && (st = read_matrix(jin, "token_type_ids", inputs, &B, &T, &types))) goto cleanup;
        if (!types) types = bq_calloc((size_t)(B * T), sizeof(int32_t));
        mask = bq_malloc(sizeof(float) * (size_t)(B * T));
        for (int i = 0; i < B * T; i++) mask[i] = mask32 ? (float)mask32[i] : 1.f;
    } else {
        T = random_batch(m, B, T, seed, with_types, &ids, &types, &mask);
    }
    if ((st = bq_arena_init(&act, ACT_RESERVE, "activations"))) goto cleanup;
    if (m->quant) m->quant->observe = 0;
    BqBertInput batch = {.B = B, .T = T, .input_ids = ids, .attention_mask = mask, .token_type_ids = types};
    BqCtx ctx = {.act = &act, .tape = NULL, .training = 0};
    BqTensor *logits = NULL;
    if ((st = bq_infer_forward(m, e, &ctx, &batch, &logits))) goto cleanup;
    j = logits_json(m, engine, B, T, with_types, ids, mask, types, logits);
    size_t n = strlen(path);
    tmp = bq_malloc(n + 5);
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp", 5);
    errno = 0;
    if (json_dump_file(j, tmp, JSON_COMPACT)) {
        st = bq_err(BQ_EIO, "%s: cannot write: %s", path, errno ? strerror(errno) : "I/O error");
        remove(tmp);
        goto cleanup;
    }
    st = bq_rename_durable(tmp, path);

cleanup:
    if (j) json_decref(j);
    if (jin) json_decref(jin);
    free(mask32);
    free(tmp);
    free(ids);
    free(types);
    free(mask);
    if (act.base) bq_arena_free(&act);
    return st;
}

/* --task on the loaded model: cls refuses a question-answering model; qa on a classification model
 * keeps the encoder and creates qa_outputs from rng (with no --num-labels). Errors: BQ_EINVAL naming
 * the flag. */
static int export_task(BqBert *m, int task, const char *model, int num_labels, BqRng *rng) {
    if (task == BQ_CLI_TASK_CLS && m->cfg.head == BQ_HEAD_QA)
        return bq_err(BQ_EINVAL, "--task cls: %s is a question-answering model (BertForQuestionAnswering)", model);
    if (task == BQ_CLI_TASK_QA && m->cfg.head != BQ_HEAD_QA) {
        if (num_labels > 0)
            return bq_err(BQ_EINVAL, "--num-labels: a question-answering model has start and end outputs only");
        fprintf(stderr, "[export] %s: encoder kept, qa_outputs newly initialized (seed 0)\n", model);
        return bq_bert_set_head(m, BQ_HEAD_QA, rng);
    }
    return BQ_OK;
}

int bq_cmd_export(int argc, char **argv) {
    static const char *const QDQ_NAMES[] = {"on", "off", "auto", NULL};
    static const int QDQ_VALUES[] = {1, 0, -1}; /* want: Q/DQ on, off, or as the checkpoint (quantized: on) */
    const char *model = NULL, *out = NULL, *dump = NULL, *dump_in = NULL, *engine_name = NULL;
    BqCliEngine dump_engine = BQ_CLI_ENGINE_FAKE_QUANT;
    BqInt8Engine *eng = NULL;
    int want = -1, task = -1, opset = 13, no_types = 0, int32 = 0, cpu = 0, num_labels = 0, dump_b = 4, dump_t = 0, dump_seed = 1;
    const BqArgSpec specs[] = {
        {"model", BQ_ARG_STR, &model, "native checkpoint (or HF directory: fresh classifier)", 1, 0, 0},
        {"out", BQ_ARG_OUT, &out, "output .onnx file (written atomically)", 1, 0, 0},
        {"qdq", BQ_ARG_ENUM, &want, "Q/DQ nodes (auto: on for a quantized checkpoint)", 0, 0, 0, QDQ_NAMES, QDQ_VALUES},
        {"opset", BQ_ARG_INT, &opset, "ONNX opset (LayerNormalization op from 17)", 0, 13, 21},
        {"no-token-type-ids", BQ_ARG_FLAG, &no_types, "no token_type_ids input (all type 0)", 0, 0, 0},
        {"input-int32", BQ_ARG_FLAG, &int32, "int32 inputs instead of int64", 0, 0, 0},
        {"cpu-layout", BQ_ARG_FLAG, &cpu, "Q/DQ for ONNX Runtime CPU: uint8 activations (zero point 128, same values) so every quantized Linear becomes an integer kernel; 8-bit weights as uint8 (exact U8U8 kernels). Always on for --scheme cpu checkpoints; the default int8 layout is what the transformer optimizer's QOrdered fusions need", 0, 0, 0},
        {"num-labels", BQ_ARG_INT, &num_labels, "labels for an HF directory (0: from its config)", 0, 0, 1000},
        {"dump-logits", BQ_ARG_OUT, &dump, "also write a random batch and bertqat's logits as JSON", 0, 0, 0},
        {"dump-batch", BQ_ARG_INT, &dump_b, "rows of the --dump-logits batch", 0, 1, 4096},
        {"dump-seq", BQ_ARG_INT, &dump_t, "sequence length of the --dump-logits batch (0: the checkpoint's training "
         "length, else 32)", 0, 0, 8192},
        {"dump-seed", BQ_ARG_INT, &dump_seed, "seed of the --dump-logits batch", 0, 0, 1 << 30},
        {"dump-inputs", BQ_ARG_STR, &dump_in, "--dump-logits on this JSON batch {input_ids, attention_mask, token_type_ids}", 0, 0, 0},
        {"dump-engine", BQ_ARG_ENUM, BQ_ARG_ENUM_DST(&dump_engine), "forward of a quantized checkpoint for "
         "--dump-logits, as eval's --engine", 0, 0, 0, bq_cli_engine_names},
        {"task", BQ_ARG_ENUM, &task, "the task (default: from the model's head; qa on a classification model "
         "keeps the encoder and creates qa_outputs, seed 0)", 0, 0, 0, bq_cli_task_names},
    };
    BqArgs args = {.cmd = "export", .usage = "--model CKPT --out FILE.onnx [options]",
                   .summary = "Export a checkpoint to ONNX (fp32, or Q/DQ for a quantized checkpoint).",
                   .specs = specs, .nspecs = (int)(sizeof specs / sizeof *specs)};
    int st = bq_args_parse(&args, argc, argv);
    if (st || args.help) return st;
    if ((st = bq_check_writable_parent(out))) return st;
    if (dump && (st = bq_check_writable_parent(dump))) return st;
    if (!dump && dump_engine != BQ_CLI_ENGINE_FAKE_QUANT) return bq_err(BQ_EINVAL, "--dump-engine: only with --dump-logits");

    BqBert m;
    memset(&m, 0, sizeof m);
    char *report = NULL;
    BqRng rng;
    bq_rng_seed(&rng, 0);
    if ((st = bq_model_load_any(&m, model, num_labels, &rng, &report))) goto cleanup;
    if (report) fprintf(stderr, "[export] %s\n", report);
    if ((st = export_task(&m, task, model, num_labels, &rng))) goto cleanup;
    if (want == 1 && !m.quant) {
        st = bq_err(BQ_EINVAL, "--qdq on: %s is an fp32 checkpoint (no quantizers)", model);
        goto cleanup;
    }
    /* the engine is chosen (and the integer engine prepared) before anything is written: a model it
     * refuses leaves no file. --qdq off of a quantized checkpoint dumps the fp32 forward. */
    if (dump && m.quant && want == 0) {
        if (dump_engine == BQ_CLI_ENGINE_INT8) {
            st = bq_err(BQ_EINVAL, "--dump-engine int8: --qdq off dumps the fp32 forward");
            goto cleanup;
        }
        engine_name = "fp32";
    } else if (dump && (st = bq_cli_engine_select(&eng, &m, dump_engine, "--dump-engine", "export", &engine_name))) {
        goto cleanup;
    }
    BqOnnxOptions o = {.opset = opset, .qdq = want < 0 ? m.quant != NULL : want, .token_type_ids = !no_types,
                       .input_int32 = int32, .cpu_layout = cpu};
    BqOnnxStats s;
    if ((st = bq_onnx_export_bert(&m, m.quant, &o, out, &s))) goto cleanup;
    fprintf(stderr, "[export] %s: opset %d, %s, %d nodes, %d QuantizeLinear, %d DequantizeLinear, %d quantized weights\n",
            out, opset, !o.qdq ? "fp32" : s.cpu_layout ? "Q/DQ (CPU layout)" : "Q/DQ", s.nodes, s.quantize_linear,
            s.dequantize_linear, s.int8_weights);
    if (dump) {
        if (!dump_in) {
            const char *from = dump_t > 0 ? "flag" : m.data.max_seq_len > 0 ? "the checkpoint's training length" : "default";
            if (dump_t == 0) dump_t = m.data.max_seq_len > 0 ? m.data.max_seq_len : 32;
            fprintf(stderr, "[export] --dump-logits batch %d x %d tokens (sequence length: %s)\n", dump_b, dump_t, from);
        }
        BqQuantState *qs = m.quant;
        if (!o.qdq) m.quant = NULL; /* fp32 export of a quantized checkpoint: compare with the fp32 forward */
        st = dump_logits(&m, eng, engine_name, dump, dump_b, dump_t, dump_seed, !no_types, dump_in);
        m.quant = qs;
        if (st) goto cleanup;
    }

cleanup:
    free(report);
    if (eng) bq_int8_free(eng);
    if (m.quant) bq_quant_free(m.quant);
    m.quant = NULL;
    bq_bert_free(&m);
    return st;
}
