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
 * Memory: a fused layer writes its output over its input x, which it reads last as the residual of the
 * attention output's LayerNorm, before its output dense writes any output row (an engine whose epilogues
 * read a row's residual before writing that row, BqFusedEngine.resid_in_place, writes a over x too, and
 * y over a: the layer then holds one set of hidden-state floats instead of two); codes for the next layer
 * go to one buffer of BqFusedRun, taken from ctx->act at the forward's first fused layer that writes
 * codes; the layer's own input codes, read by its first bracket only, are in it too (the previous layer
 * wrote them there, or the layer quantizes its input, the embeddings' output, into it). So the outputs
 * take one layer's room however many layers the model has, the embeddings' output included. Every
 * temporary is taken after them: the context, a (read until the output dense's last block) and h (one
 * block of rows: BqFusedEngine.mlp_rows), given back when the layer ends; a is taken first and the
 * context given back after the attention output dense, so the intermediate dense runs without the context.
 * What an engine takes inside one bracket (BqFusedEngine.linear's int32 sums or float products of one
 * block of whole sequences, the attention's scratch) is given back when the bracket ends. So a forward
 * holds one layer's activations and one bracket's scratch at a time.
 * A caller that keeps every layer's output (BqBertInput.hidden) sets BqFusedRun.keep: each output then
 * gets its own room in ctx->act, as a layer run op by op does.
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
 * query/key/value input), else NULL; for BQ_LIN_QKV (B·Q, N): the context of each sequence's first Q query
 * rows (autograd/infer_kernels.h bq_infer_attention: T, or a block of 8 whose row 0 the [CLS]-only last
 * layer reads). */
typedef struct BqFusedStep {
    BqLinearId id;
    int64_t rows, N;
    const float *mask;          /* attention: (B,T) or NULL */
    int64_t B, T, NH, d;        /* attention: batch, tokens, heads, head size */
    int64_t Q;                  /* attention: query rows per sequence whose context is computed */
    float scale;                /* attention: 1/sqrt(d) */
    const float *resid;         /* residual LN: (rows, N) */
    const float *lnw, *lnb;     /* residual LN: LayerNorm weight and bias (N) */
    float eps;
} BqFusedStep;

typedef struct BqFusedEngine {
    void *user;
    int codes; /* 1: the Linears read codes (int8); 0: floats (fp32, bf16) */
    /* the intermediate and output dense run on blocks of at most this many rows (<= 0: all rows at once),
     * one block's intermediate activations at a time */
    int64_t mlp_rows;
    /* 1 when the attention output and output dense brackets read each row of their residual before they
     * write that row of their output, and nothing else (the int8 engine: its epilogues read int32 sums,
     * not the output): then a is written over x and y over a, unless BqFusedRun.keep */
    int resid_in_place;
    /* 1 when layer l runs fused in this engine (else the forward runs it op by op) */
    int (*layer_ok)(void *user, int l);
    /* One bracket (see BqFusedStep) on in (rows of the input, floats and/or codes) into out; scratch
     * from ctx->act, given back by the layer when the call returns. Returns BQ_OK or the GEMM's error. */
    int (*linear)(void *user, BqCtx *ctx, int l, const BqFusedAct *in, const BqFusedStep *s, BqFusedAct *out);
    /* codes engines: the codes of x (n floats, rows of H) for layer l's query/key/value input, into dst (n) */
    void (*quantize_input)(void *user, int l, const float *x, int64_t n, uint8_t *dst);
} BqFusedEngine;

/* State of one forward through fused layers. Set e, m and keep, zero the rest before a forward; the
 * tensors a layer returns live as long as the run and its arena (and, unless keep, until the next layer
 * overwrites them: a fused layer's input is its output's room). */
typedef struct BqFusedRun {
    const BqFusedEngine *e;
    const BqBert *m;
    int keep;               /* 1: every layer's output gets its own room (the caller keeps them all) */
    const float *pend_src;  /* the last fused layer's output, and its codes for the next layer (or NULL) */
    uint8_t *pend_codes;
    int pend_layer;         /* the layer that wrote them */
    uint8_t *codes;         /* unless keep: the codes of a layer's output for the next layer (codes engines) */
    int64_t codes_n;        /* values codes holds; 0 until a fused layer writes codes */
    BqTensor out[2];        /* the headers of the layers' outputs, in turn (the input's header stays valid) */
} BqFusedRun;

/* The default block of the fused layers: BQ_FUSED_BLOCK_ROWS rows (8 sequences of 128 tokens), fewer where
 * a block's intermediate activations, `inter` int32 sums or floats per row, would pass BQ_FUSED_BLOCK_BYTES
 * (BERT-base: 512 rows, 6 MiB); at least 1. The fp32 engine's intermediate and output dense
 * (BqFusedEngine.mlp_rows) run in such blocks, the integer engine's steps in blocks of at most so many
 * rows (bq_int8_step_rows: fewer on fewer threads). */
#define BQ_FUSED_BLOCK_ROWS 1024
#define BQ_FUSED_BLOCK_BYTES (6 << 20)
int64_t bq_fused_block_rows(int64_t inter);
/* Blocks of `rows` rows for every model from the next forward (fp32) or engine preparation (int8) on,
 * instead of the default (tests run blocks smaller than their batches); rows <= 0 restores the default. */
void bq_fused_set_block_rows(int64_t rows);

/* The BqLinearHook.layer callback (layers/bert.h) of every engine: user is a BqFusedRun. Leaves *y NULL
 * when layer l is not fused in this engine or x is not a contiguous (B,T,H). */
int bq_fused_layer(void *user, BqCtx *ctx, int l, BqTensor *x, const float *mask, int cls_only, BqTensor **y);

#endif
