/* ONNX export of BertForSequenceClassification (layers/bert.h) laid out as PyTorch's exporter writes
 * Hugging Face BERT, so ONNX Runtime's transformer optimizer fuses it (docs/design.md §7), with Q/DQ node
 * pairs exactly at the placement points of a quantizer table (layers/quant.h). */
#ifndef BQ_ONNX_BERT_H
#define BQ_ONNX_BERT_H

#include "layers/bert.h"
#include "layers/quant.h"

typedef struct BqOnnxOptions {
    int opset;          /* 13..21; LayerNormalization op from 17, decomposed below */
    int qdq;            /* 1: Q/DQ at every quantizer of qs (qs must be non-NULL) */
    int token_type_ids; /* 1: token_type_ids input; 0: type-0 row folded into the word embeddings */
    int input_int32;    /* inputs int32 instead of int64 */
    int cpu_layout;     /* CPU layout (ORT CPU integer kernels for every quantized Linear): activation
                           Q/DQ uint8 with zero point 128, 8-bit weights uint8 + 128; always on for the
                           cpu scheme. The default int8 layout is what the transformer optimizer's
                           QOrdered fusions need. */
} BqOnnxOptions;

typedef struct BqOnnxStats {
    int nodes, initializers;
    int quantize_linear, dequantize_linear; /* node counts */
    int int8_weights;                       /* quantized (int8 or uint8) weight initializers */
    int cpu_layout;                         /* the CPU layout was written */
} BqOnnxStats;

/* Graph inputs input_ids, attention_mask[, token_type_ids] (dims "batch", "sequence"), output
 * logits (batch, num_labels). Weights as MatMul([in,out]) + Add bias; with Q/DQ, quantized weights
 * are int8 [in,out] initializers "<HF name>_quantized" → DequantizeLinear(axis 1, "<HF name>_scale").
 * Activation Q/DQ: scale = quantizer scale (amax/127), int8 zero point 0 (CPU layout: uint8, zero
 * point 128, the same values); a tensor quantized with the same scale for several consumers gets one
 * shared Q/DQ. Metadata "quantization" (scheme or "none") and "qdq_layout" (default|cpu). Written
 * atomically to path.
 * Errors: options out of range, Q/DQ without quantizers, an uninitialised quantizer (name given),
 * I/O failures naming the path. */
int bq_onnx_export_bert(const BqBert *m, BqQuantState *qs, const BqOnnxOptions *opt, const char *path,
                        BqOnnxStats *stats);

#endif
