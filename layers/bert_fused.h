/* One fused encoder layer for inference, shared by every engine (fp32 and bf16: layers/bert_fp32.h;
 * int8: layers/bert_int8.h). The layer is written once:
 *
 *   x → [QKV Linear → attention] = context → (cls_only: token 0's rows of context and x)
 *     → [AO Linear → +bias +x → LayerNorm] = a → [I Linear → +bias → GELU] = h
 *     → [O Linear → +bias +a → LayerNorm] = y
 *
 * and an engine supplies only how a Linear multiplies and finishes: BqFusedEngine.linear computes one
 * bracket above (the product and its epilogue, in one pass after the GEMM). The fp32/bf16 engine
 * multiplies floats with bq_gemm in ctx->prec and finishes with autograd/infer_kernels.h's fp32
 * kernels; the int8 engine multiplies 8-bit codes with the integer GEMM and finishes with the kernels
 * that dequantize the int32 sums and end in the next Linear's codes.
 *
 * Activations between the brackets are BqFusedAct: floats, codes (the next integer Linear's input), or
 * both. An engine with codes (BqFusedEngine.codes) passes codes between its Linears and floats only
 * where the layer reads them again (a, the residual of y; y, the layer's output).
 *
 * Memory: a forward's fused layers write their outputs (floats, and codes for the next layer when
 * asked) into two buffers of BqFusedRun taken from ctx->act at its first fused layer, alternately: layer
 * l reads the buffer layer l-1 wrote and writes the other one, so the outputs take two layers' room
 * however many layers the model has. Every temporary is taken after them: the activations between the
 * brackets (context, a, h) are given back when the layer ends, and what an engine takes inside one
 * bracket (BqFusedEngine.linear's int32 sums or float products, the attention's scratch) when the bracket
 * ends, so a forward holds one layer's activations and one bracket's scratch at a time. A caller that
 * keeps every layer's output (BqBertInput.hidden) sets BqFusedRun.keep: each output then gets its own
 * room in ctx->act, as a layer run op by op does.
 * Reference: HF transformers modeling_bert.py (BertLayer in evaluation mode) for the semantics. */
#ifndef BQ_BERT_FUSED_H
#define BQ_BERT_FUSED_H

#include <stdint.h>

#include "layers/bert.h"

/* Rows of one activation: f (rows, N) floats or NULL, codes (rows, N) uint8 codes or NULL. */
typedef struct BqFusedAct {
    float *f;
    uint8_t *codes;
} BqFusedAct;

/* One bracket: the Linear `id` (BQ_LIN_QKV, BQ_LIN_AO, BQ_LIN_I or BQ_LIN_O) of layer l on `rows` rows
 * of its input, then the epilogue that Linear has in the layer (QKV: +bias and the attention block; AO and
 * O: +bias +resid, LayerNorm; I: +bias, GELU). The output act has its buffers allocated by the layer: f (rows, N) where
 * floats are wanted, codes (rows, N) where the next Linear reads codes (for BQ_LIN_O: the next layer's
 * query/key/value input), else NULL. */
typedef struct BqFusedStep {
    BqLinearId id;
    int64_t rows, N;
    const float *mask;          /* attention: (B,T) or NULL */
    int64_t B, T, NH, d;        /* attention: batch, tokens, heads, head size */
    float scale;                /* attention: 1/sqrt(d) */
    const float *resid;         /* residual LN: (rows, N) */
    const float *lnw, *lnb;     /* residual LN: LayerNorm weight and bias (N) */
    float eps;
} BqFusedStep;

typedef struct BqFusedEngine {
    void *user;
    int codes; /* 1: the Linears read codes (int8); 0: floats (fp32, bf16) */
    /* 1 when layer l runs fused in this engine (else the forward runs it op by op) */
    int (*layer_ok)(void *user, int l);
    /* One bracket (see BqFusedStep) on in (rows of the input, floats and/or codes) into out; scratch
     * from ctx->act, given back by the layer when the call returns. Returns BQ_OK or the GEMM's error. */
    int (*linear)(void *user, BqCtx *ctx, int l, const BqFusedAct *in, const BqFusedStep *s, BqFusedAct *out);
    /* codes engines: the codes of x (rows·H floats) for layer l's query/key/value input, in ctx->act */
    uint8_t *(*quantize_input)(void *user, BqCtx *ctx, int l, const float *x, int64_t n);
} BqFusedEngine;

/* State of one forward through fused layers. Set e, m and keep, zero the rest before a forward; the
 * tensors a layer returns live as long as the run and its arena (and, unless keep, until the layer
 * after next overwrites them). */
typedef struct BqFusedRun {
    const BqFusedEngine *e;
    const BqBert *m;
    int keep;               /* 1: every layer's output gets its own room (the caller keeps them all) */
    const float *pend_src;  /* the last layer's output, and its codes for the next layer (or NULL) */
    uint8_t *pend_codes;
    float *buf[2];          /* unless keep: the two output buffers, (B·T·H) floats each */
    uint8_t *buf_codes[2];  /* the codes of each buffer's rows for the next layer (codes engines) */
    int64_t buf_n;          /* values each buffer holds; 0 until the first fused layer */
    BqTensor out[2];        /* the views of buf returned as the layers' outputs */
} BqFusedRun;

/* The BqLinearHook.layer callback (layers/bert.h) of every engine: user is a BqFusedRun. Leaves *y NULL
 * when layer l is not fused in this engine or x is not a contiguous (B,T,H). */
int bq_fused_layer(void *user, BqCtx *ctx, int l, BqTensor *x, const float *mask, int cls_only, BqTensor **y);

#endif
