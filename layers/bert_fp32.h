/* Fused fp32/bf16 evaluation forward of BertForSequenceClassification / BertForQuestionAnswering: the
 * forward of layers/bert.c without a tape, where every encoder layer of a model without quantizers
 * runs as the shared fused layer of layers/bert_fused.h with 6 GEMMs in ctx->prec (query, key and value
 * into one interleaved (B·T, 3H) block), each followed by a single fused pass, with the attention's
 * head loop inside one parallel region (autograd/infer_kernels.h):
 *   x → [x·W_qkvᵀ] → +bias, per (b,h): Q·Kᵀ, scale + mask + softmax, P·V → ctx
 *   → [ctx·W_aoᵀ] → +bias +x → LayerNorm = a → [a·W_iᵀ] → +bias, GELU
 *   → [h·W_oᵀ] → +bias +a → LayerNorm = y.
 * The result equals bq_bert_forward without a tape up to fp32 rounding (other summation orders in
 * LayerNorm and the attention products, fused multiply-adds where the CPU has them;
 * tests/test_fp32_forward.c states and checks the bound); it does not depend on the thread count.
 * Reference: HF transformers modeling_bert.py (BertLayer in evaluation mode) for the semantics. */
#ifndef BQ_BERT_FP32_H
#define BQ_BERT_FP32_H

#include "layers/bert.h"

/* logits (B, num_labels) (QA head: (B,T,2)) of the batch, in ctx->act, as bq_bert_forward computes them
 * in evaluation (ctx->tape must be NULL and ctx->training 0). A model with quantizers (m->quant) runs
 * bq_bert_forward itself (fake quant); layers whose head size is not a multiple of 8 run op by op.
 * Errors as bq_bert_forward's (bad ids, types or lengths). */
int bq_fp32_forward(BqBert *m, BqCtx *ctx, const BqBertInput *in, BqTensor **logits);

/* Number of encoder layers of m that bq_fp32_forward runs as fused blocks (0 with quantizers). */
int bq_fp32_fused_layer_count(const BqBert *m);

#endif
