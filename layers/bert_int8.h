/* Integer inference forward of a quantized BertForSequenceClassification: every encoder Linear whose
 * input and weight are both quantized by the checkpoint's scheme runs as an exact integer GEMM
 * (autograd/qgemm.h) on the int8 codes the fake quantizers would produce; everything else
 * (embeddings, LayerNorm, softmax, GELU, attention matmuls, residuals, the other quantizers, pooler,
 * classifier) is the fp32/fake-quant evaluation path of layers/bert.c, op for op.
 *
 * So the result equals bq_bert_forward without a tape up to fp32 summation order inside those
 * Linears (tests/test_int8_forward.c states and checks the bound), and it does not depend on batch
 * size or thread count.
 *
 * Schemes: `cpu` runs all 6 Linears of every layer on integers (query/key/value as one fused GEMM);
 * `qdqbert` runs them too (query/key/value as one GEMM where their three input quantizers have one
 * scale; 8-bit weights: one GEMM where oneDNN's ISA has VNNI/AMX, an exact sgemm on float codes
 * elsewhere); `ort` quantizes op outputs rather than Linear inputs, and its Linears run on
 * the codes of the grid their input already lies on (the output quantizer of the LayerNorm, context or
 * GELU before them), as its fake-quant forward does. A Linear with no grid, or whose quantizers are
 * disabled (--keep-fp32), stays the fp32 fake-quant Linear; bq_int8_fp32_linears names them. */
#ifndef BQ_BERT_INT8_H
#define BQ_BERT_INT8_H

#include "layers/bert.h"

typedef struct BqInt8Engine BqInt8Engine;

/* Packs the integer weights of m (which must carry calibrated or trained quantizers, m->quant) once.
 * The engine is a snapshot: weights, biases and ranges as they are now; re-prepare after changing
 * them. Errors (BQ_EINVAL, one line): no quantizers, no Linear with a quantized input and weight, an
 * enabled quantizer without a range, codes outside a quantizer's bits, oneDNN failures. */
int bq_int8_prepare(BqInt8Engine **out, const BqBert *m);
void bq_int8_free(BqInt8Engine *e);

/* bq_int8_prepare in steps, for packing while a checkpoint loads (export/ckpt.h, BqCkptLoadHook).
 * bq_int8_begin decides from m's quantizers alone which Linears run on integers and makes every check
 * (the errors of bq_int8_prepare, except oneDNN's); it reads no weight. bq_int8_load_step(e, m, i),
 * called after parameter i (table order) is read, packs each group of a layer's Linears whose weights
 * and biases have all arrived (query/key/value, then attention.output, intermediate and output) from
 * m's weights as they are now, and gives back the fp32 storage of the weights it packed
 * (bq_bert_param_release): afterwards m runs only through this engine (bq_int8_forward; its biases,
 * LayerNorms, embeddings and head stay fp32 in m). So a load holds at most one group's fp32 weights
 * besides the packed ones (the intermediate's 9 MiB in BERT-base, not a layer's 27 MiB). The engine is
 * complete when every layer is packed. */
int bq_int8_begin(BqInt8Engine **out, const BqBert *m);
int bq_int8_load_step(BqInt8Engine *e, BqBert *m, int i);

/* Bytes the engine holds: integer codes with their oneDNN layouts, scales, bias copies (the integer
 * weights' only copy once their fp32 storage is released). */
int64_t bq_int8_bytes(const BqInt8Engine *e);

/* Number of encoder Linears that run on integers, how many integer products a forward's layers make
 * (query/key/value as one where they share a scale), and how many GEMM calls those products take per block
 * of rows once the widest are cut in column pieces (bq_int8_set_piece_macs). */
int bq_int8_linear_count(const BqInt8Engine *e);
int bq_int8_gemm_count(const BqInt8Engine *e);
int bq_int8_piece_count(const BqInt8Engine *e);
/* The encoder Linears that stay fp32 (fake quant), as "layer L: query key value, ..." in buf (truncated
 * to n bytes with "..."), "" when there are none; returns buf. */
const char *bq_int8_fp32_linears(const BqInt8Engine *e, char *buf, size_t n);

/* Encoder layers that run as one fused block: when all 6 Linears run on integers and the head size is a
 * multiple of 8, the layer is 4 integer GEMMs (query/key/value as one, or as three where their input
 * quantizers' scales differ), each followed by a
 * single pass that dequantizes, adds bias (and residual + LayerNorm, or GELU) and quantizes for the next
 * GEMM, with the attention block in between (autograd/infer_kernels.h): a layer whose only quantizers
 * are its Linears' (the cpu scheme) with the fused multiply-add kernels, a layer with fake quantizers
 * between the GEMMs (ort, qdqbert) with kernels that give fake quant's bits, provided both attention
 * products read codes. Other layers run op by op through layers/bert.c. On by default;
 * bq_int8_set_layer_fusion(e, 0) turns it off (tests compare both). */
int bq_int8_fused_layer_count(const BqInt8Engine *e);
void bq_int8_set_layer_fusion(BqInt8Engine *e, int on);
/* A fused layer's GEMM and its epilogue cover at most this many rows at once (whole sequences for the
 * query/key/value product and its attention; the intermediate and output dense one block after the
 * other, BqFusedEngine.mlp_rows): a step on more rows runs in blocks, so its int32 sums take one block's
 * room, not the batch's. The results are the same bits for any block size (the sums are exact, every
 * epilogue is row-wise and the attention is per sequence). The default, read anew at each forward, is the
 * rows whose intermediate sums take BQ_INT8_BLOCK_BYTES_PER_THREAD per OpenMP thread, at most
 * bq_fused_block_rows (layers/bert_fused.h: 1024 rows, BERT-base 512), at least one: with 2 threads
 * BERT-base's blocks are 256 rows and MiniLM's 512, from 4 threads on 512 and 1024. The cap: bench_int8's
 * sweep (batch 32) put it at least as fast as blocks of 4096 rows, with VNNI (Zen 5) about 3 % faster
 * (a block's sums stay in cache for its pass), on AVX2 (Zen 3) within the noise for MiniLM and 4 % faster
 * for BERT-base. Fewer rows on fewer threads: a 2-thread BERT-base evaluation at batch 8 peaks about 4 MiB
 * lower, at the speed of 512-row blocks within the noise of three alternations (Zen 5, docs/results.md),
 * while many threads keep enough sequences per block for the attention's (sequence, head) units. Every
 * block of a larger batch has the shape of the first, so the blocks share their oneDNN primitives and
 * weight layouts. rows <= 0 restores the default (tests set small blocks); bq_int8_step_rows reads it. */
#define BQ_INT8_BLOCK_BYTES_PER_THREAD (3 << 19)
void bq_int8_set_step_rows(BqInt8Engine *e, int64_t rows);
int64_t bq_int8_step_rows(const BqInt8Engine *e);

/* A forward covers at most so many rows at once (whole examples, at least one): a larger batch runs in
 * passes of the whole model, each on its own examples, so the activations take one pass's room whatever
 * the batch. The default is the rows whose fp32 hidden states take BQ_INT8_PASS_BYTES (6 MiB): 4,096 rows
 * (32 sequences of 128 tokens) at MiniLM's hidden size 384, 2,048 at BERT-base's 768. A pass holds about
 * four such arrays (the layer's input and output, the attention block's LayerNorm output, with their codes)
 * besides one block's sums, so a BERT-base evaluation at batch 64 peaked 13 MiB lower than in 4,096-row
 * passes (150 against 164 MiB, Zen 5, before the layer wrote its LayerNorm output over its input), at the
 * same speed within the noise of five alternations: its blocks of 256-512 rows read every weight again
 * anyway. Not fewer rows: a pass reads every
 * weight again, which cost MiniLM 2-4 % of the batch-32 forward on Zen 5 in passes of 1,024 rows, where
 * the blocks of one pass reuse each weight from cache. The results are the same bits (every example's
 * computation is its own). rows <= 0 restores the default (tests set small passes); bq_int8_pass_rows reads
 * it. One pass whenever the forward keeps every layer's output (BqBertInput.hidden). */
#define BQ_INT8_PASS_BYTES (6 << 20)
void bq_int8_set_pass_rows(BqInt8Engine *e, int64_t rows);
int64_t bq_int8_pass_rows(const BqInt8Engine *e);

/* A fused layer runs its query/key/value product (one GEMM) and its intermediate dense in column pieces
 * where each piece keeps at least BQ_INT8_PIECE_MACS multiply-adds per row: the query, key and value of a
 * group of heads, and a group of the intermediate's columns (whole multiples of 16), at most 4 pieces. A
 * block's int32 sums then take one piece's room, and its attention or GELU pass reads them while they are
 * in cache: BERT-base runs both in pieces of 768 columns, the shape of the attention output dense, so a
 * sequence length makes two oneDNN primitives rather than four; smaller models (MiniLM: 384 inputs) keep
 * one GEMM per product, where a piece's call costs more than it saves (each call has a fixed cost of a
 * few microseconds: MiniLM in pieces ran its batch-1 forward 8-13 % slower on Zen 5, docs/quantization.md). The results are the same bits either way (the sums are exact and the epilogues
 * elementwise, per head or per row). Set before bq_int8_begin/prepare (tests set 1, every piece count the
 * shapes allow); macs <= 0 restores the default. */
#define BQ_INT8_PIECE_MACS (768 * 768)
void bq_int8_set_piece_macs(int64_t macs);

/* logits (B, num_labels), or (B,T,2) for the QA head, of the batch, in ctx->act, as bq_bert_forward
 * computes them in evaluation (ctx->tape must be NULL and ctx->training 0), in passes
 * (bq_int8_set_pass_rows). m must be the model e was prepared from. Bad ids, types or lengths are
 * BQ_EINVAL/BQ_EFORMAT errors as in bq_bert_forward, naming the position in the batch. */
int bq_int8_forward(BqInt8Engine *e, BqBert *m, BqCtx *ctx, const BqBertInput *in, BqTensor **logits);

#endif
