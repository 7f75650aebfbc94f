/* Inference-only fused kernels of the integer engine (layers/bert_int8.h): each takes the int32
 * accumulators of an integer GEMM (autograd/qgemm.h, before the zero-point compensation) and does in
 * one pass over a row everything the fp32 forward does between that GEMM and the next one, ending in
 * the next GEMM's uint8 codes; and the attention block (scores, masked softmax, context) of one
 * encoder layer with its head loop inside one parallel region. No tape, no gradients, no allocation:
 * scratch comes from the caller.
 *
 * Every kernel works row by row (attention: per (batch, head) pair) with fixed summation orders, so a
 * row's result depends neither on the batch size nor on the thread count. GELU and exp use the same
 * formulas as autograd/kernels.c, so given the same input they give the same bits; LayerNorm's and
 * the attention products' sums run in 8 fixed lanes (a different order than autograd/kernels.c's).
 *
 * The dequantization of an accumulator a of output column n is the one of autograd/qgemm.c:
 *   y = fl(fl((float)(a − comp[n])·scale[n]) + bias[n]),  scale[n] = fl(sx·sw[n]),
 * and quantization to a uint8 code with scale s is bq_qgemm_quantize_u8's:
 *   code = clamp(rne(x / s), −128, 127) + 128   (NaN → 128).
 * References: HF transformers BertSelfAttention / BertSelfOutput / BertIntermediate / BertOutput
 * (modeling_bert.py) for the semantics; layers/bert.c for the op order they replace. */
#ifndef BQ_INFER_KERNELS_H
#define BQ_INFER_KERNELS_H

#include <stdint.h>

/* The vector code the fused kernels run on this CPU: "AVX-512" (16 lanes, where the CPU has AVX-512
 * F/VL/BW/DQ), "AVX2" (8 lanes, AVX2 + FMA) or "portable". The AVX-512 kernels give the AVX2 kernels' bits;
 * the portable ones differ from both in the last bits of GELU, exp and the attention products (no fused
 * multiply-add). BQ_INFER_AVX2=1 in the environment keeps a CPU with AVX-512 on the AVX2 kernels and
 * BQ_INFER_PORTABLE=1 any CPU on the portable ones (the tests compare them). */
/* The bound of the GELU codes' fast path (autograd/infer_kernels.c, gelu8_fast and gelu16_fast):
 * |fast(x) − exact(x)| ≤ BQ_GELU_FAST_ABS + BQ_GELU_FAST_REL·|x| for every float x. */
#define BQ_GELU_FAST_ABS 1e-6f
#define BQ_GELU_FAST_REL 1e-6f

/* Test support: the largest |fast(x) − exact(x)| / (a + b·|x|) of the GELU codes' fast path over every finite
 * float x (all 2³² bit patterns; a few seconds on two cores), in the kernels this process runs (AVX-512, or
 * AVX2 + FMA where the CPU has no AVX-512 or BQ_INFER_AVX2 is set), or −1 where it runs the portable ones
 * (which have no fast path). With the AVX-512 kernels exact(x) is both their fused multiply-add GELU (the
 * cpu scheme's codes) and the portable GELU's bits (qdqbert's codes, bq_infer_gelu_fq_quant without
 * quantizers), and the worst of the two counts. BQ_INFER_GELU_EXACT=1 turns the fast path off (tests compare
 * the two). */
double bq_infer_gelu_fast_check(float a, float b);

const char *bq_infer_isa(void);

/* 1 where the fake-quant attention (bq_infer_attention_fq: ort, qdqbert) multiplies its codes by AVX512-VNNI
 * u8·s8 dot products: the AVX-512 kernels run (bq_infer_isa) and the CPU has AVX512-VNNI. Same values as
 * the fp32 products of the other kernels, whose integer sums are exact. */
int bq_infer_vnni(void);

/* What --version, bench and bench_int8 print for the fused kernels: bq_infer_isa(), with ", VNNI attention
 * products" where bq_infer_vnni() holds. */
const char *bq_infer_describe(void);

/* out (M,N) = LayerNorm(dequant(acc) + bias + resid) with weight lnw and bias lnb (BertSelfOutput,
 * BertOutput without dropout), and, when codes is not NULL, codes (M,N) = its uint8 codes at scale sq
 * (the next Linear's input quantizer). out may be resid itself (each value is read before its place is
 * written), not an overlapping shift of it. */
void bq_infer_residual_layernorm(float *out, uint8_t *codes, const int32_t *acc, const int32_t *comp,
                                 const float *scale, const float *bias, const float *resid, const float *lnw,
                                 const float *lnb, float eps, float sq, int64_t M, int64_t N);

/* codes (M,N, row stride ldc >= N) = uint8 codes at scale sq of gelu(dequant(acc) + bias) (BertIntermediate
 * followed by the output dense's input quantizer); gelu is the exact-erf GELU of autograd/kernels.c. A
 * stride wider than N writes a column block of a wider product (layers/bert_int8.c: the intermediate
 * dense in column pieces). */
void bq_infer_gelu_quant(uint8_t *codes, const int32_t *acc, const int32_t *comp, const float *scale,
                         const float *bias, float sq, int64_t M, int64_t N, int64_t ldc);

/* Scratch floats per thread that bq_infer_attention needs for sequences of T tokens and head size d. */
int64_t bq_infer_attention_scratch(int64_t T, int64_t d);

/* The query/key/value accumulators of one attention call: the sum of part p (0 query, 1 key, 2 value),
 * row r (of B·T), column c (of H = NH·d) is acc[p][r·ld + c], with its compensation comp[p][c],
 * dequantization scale scale[p][c] and bias bias[p][c]. One fused GEMM's (B·T, 3H) sums are three column
 * blocks of one array (bq_qkv_sums_fused); three GEMMs' (B·T, H) sums, when query, key and value have
 * input quantizers of different scales, are three arrays with ld = H. */
typedef struct BqQkvSums {
    const int32_t *acc[3], *comp[3];
    const float *scale[3], *bias[3];
    int64_t ld;
} BqQkvSums;

/* The sums of the fused GEMM: acc (B·T, 3H) of query | key | value column blocks, comp, scale, bias (3H). */
BqQkvSums bq_qkv_sums_fused(const int32_t *acc, const int32_t *comp, const float *scale, const float *bias,
                            int64_t H);

/* The attention block of one layer on the query/key/value sums (d a multiple of 8): for every (b, h),
 * Q_h, K_h, V_h = dequant + bias of its columns, S = Q_h·K_hᵀ, P = softmax(scale·S + (1 − mask)·(−FLT_MAX))
 * over keys (mask (B,T) of 0/1, or NULL), C_h = P·V_h; codes (B,Q, row stride ldc >= NH·d) = uint8
 * codes of C's first Q query rows of each sequence at scale sq (a stride wider than NH·d: these NH heads
 * are a column block of a layer's heads, layers/bert_int8.c). Q is T, or BQ_INFER_QUERY_BLOCK (< T) where only token 0's row is
 * read: the kernels' first block of query rows, so that each of its rows gets the operations, and the bits,
 * it gets among all T. scratch: nthreads · bq_infer_attention_scratch(T, d) floats, 64-byte aligned, where
 * nthreads is at least omp_get_max_threads(). */
#define BQ_INFER_QUERY_BLOCK 8
void bq_infer_attention(uint8_t *codes, const BqQkvSums *sums, const float *mask, float *scratch, int64_t nthreads,
                        float scale, float sq, int64_t B, int64_t T, int64_t Q, int64_t NH, int64_t d, int64_t ldc);

/* ---- the fused layers with fake quantizers between the GEMMs (ort, qdqbert) ----
 * The ort scheme fake-quantizes op outputs, qdqbert the inputs of the attention products and of the
 * residual adds (layers/quant.h): between two GEMMs their layers run fp32 ops with fake quantizers among
 * them. These kernels do the same ops in the same order with the same arithmetic as the op-by-op
 * forward (autograd/kernels.c: bq_kernel_fakequant_forward, the integer attention products,
 * bq_kernel_softmax_mask_forward, bq_kernel_layernorm_forward's rows, bq_kernel_bias_gelu_forward),
 * without fused multiply-adds, so they give its bits exactly. The two attention products sum codes
 * (integers of at most 8 bits) in fp32, exact while every partial sum stays below 2^24: the caller
 * guarantees T·|qmin|² <= 2^24 and d·|qmin|² <= 2^24 (T <= 1024 and d <= 1024 at 8 bits), as the
 * op-by-op kernels then take the same exact path. */

/* One per-tensor fake quantizer: x → clamp(rne(x/s), lo, hi)·s, lo and hi its integer bounds; s = 0:
 * none at that place (the value passes unchanged). */
typedef struct BqFq {
    float s, lo, hi;
} BqFq;

/* The places of a layer's fake quantizers, the index of a BqFq array of BQ_FQ_LAYER: the attention's
 * (bq_infer_attention_fq reads the first BQ_FQ_ATTN), then for each residual block (the attention's
 * BertSelfOutput, the feed-forward's BertOutput) the dense output, the skip input, the sum and the
 * LayerNorm output (bq_infer_residual_layernorm_fq reads the four from its first), with the
 * intermediate dense's and the GELU's outputs between them. Q, K, V and PROBS are the grids of the two
 * attention products' inputs and must be quantizers (s > 0); every other place may be empty. */
enum {
    BQ_FQ_Q, BQ_FQ_K, BQ_FQ_V, BQ_FQ_SCORES, BQ_FQ_PROBS, BQ_FQ_CONTEXT, BQ_FQ_ATTN,
    BQ_FQ_ATTN_LOCAL = BQ_FQ_ATTN, BQ_FQ_ATTN_SKIP, BQ_FQ_ATTN_SUM, BQ_FQ_ATTN_LN,
    BQ_FQ_INTER, BQ_FQ_GELU,
    BQ_FQ_OUT_LOCAL, BQ_FQ_OUT_SKIP, BQ_FQ_OUT_SUM, BQ_FQ_OUT_LN,
    BQ_FQ_LAYER
};
/* Offsets from a residual block's first place (BQ_FQ_ATTN_LOCAL or BQ_FQ_OUT_LOCAL). */
enum { BQ_FQ_LOCAL, BQ_FQ_SKIP, BQ_FQ_SUM, BQ_FQ_LN };

/* bq_infer_attention with fake quantizers (fq, BQ_FQ_ATTN of them): Q_h, K_h, V_h = fq_Q/K/V(dequant +
 * bias); S = fq_SCORES(Σ codes(Q_h)·codes(K_h)ᵀ · fl(s_Q·s_K)); P = fq_PROBS(masked softmax(scale·S));
 * C_h = fq_CONTEXT(Σ codes(P)·codes(V_h) · fl(s_PROBS·s_V)); codes (B,T,H) = uint8 codes of C at scale
 * sq. Q, codes (B,Q, row stride ldc) and scratch as bq_infer_attention's. */
void bq_infer_attention_fq(uint8_t *codes, const BqQkvSums *sums, const float *mask, float *scratch,
                           int64_t nthreads, float scale, const BqFq *fq, float sq, int64_t B, int64_t T, int64_t Q,
                           int64_t NH, int64_t d, int64_t ldc);

/* out (M,N) = f[LN](LayerNorm(f[SUM](f[LOCAL](dequant(acc) + bias) + f[SKIP](resid)))) (BertSelfOutput and
 * BertOutput with their quantizers: f points at the block's four places), and, when codes is not NULL,
 * codes (M,N) = its uint8 codes at scale sq. out may be resid itself (each value is read before its place is
 * written), not an overlapping shift of it. */
void bq_infer_residual_layernorm_fq(float *out, uint8_t *codes, const int32_t *acc, const int32_t *comp,
                                    const float *scale, const float *bias, const float *resid, const BqFq *f,
                                    const float *lnw, const float *lnb, float eps, float sq, int64_t M, int64_t N);

/* One layer's fake-quant GELU pass (BertIntermediate with the dense's and the GELU's output quantizers,
 * codes at the output dense's input scale sq), prepared once (bq_infer_gelu_fq_prepare): where the dense
 * output has a quantizer (ort), GELU's input is one of at most 256 values c·fin.s, and tab holds the code
 * for each c (tab[i] for c = fin.lo + i, tab[nt] for a NaN input), computed by the portable operations,
 * the same bits as every kernel here. nt is 0 where there is no such table (no fin, bounds wider than
 * 256 codes, or BQ_INFER_GELU_EXACT set when it was prepared: tests compare the two): the pass then
 * computes every value. */
typedef struct BqGeluFq {
    BqFq fin, fout;
    float sq;
    int nt;
    int32_t tab[257];
} BqGeluFq;
void bq_infer_gelu_fq_prepare(BqGeluFq *g, BqFq fin, BqFq fout, float sq);

/* codes (M,N, row stride ldc >= N) = uint8 codes at scale g->sq of g->fout(gelu(g->fin(dequant(acc) +
 * bias))). */
void bq_infer_gelu_fq_quant(uint8_t *codes, const int32_t *acc, const int32_t *comp, const float *scale,
                            const float *bias, const BqGeluFq *g, int64_t M, int64_t N, int64_t ldc);

/* ---- fp32 kernels of the fused evaluation forward (layers/bert_fp32.h) ----
 * The same structure without integers: each takes the fp32 output of a bias-free GEMM. */

/* out (M,N) = LayerNorm((x + bias) + resid) with weight lnw and bias lnb (BertSelfOutput, BertOutput
 * without dropout); LayerNorm's sums in 8 fixed lanes. out may be x (in place), not resid. */
void bq_infer_bias_residual_layernorm_f32(float *out, const float *x, const float *bias, const float *resid,
                                          const float *lnw, const float *lnb, float eps, int64_t M, int64_t N);

/* x (M,N) = gelu(x + bias) in place, the exact-erf GELU of autograd/kernels.c (with fused multiply-adds
 * where the CPU has AVX2 and FMA and N is a multiple of 8). */
void bq_infer_bias_gelu_f32(float *x, const float *bias, int64_t M, int64_t N);
/* The same GELU values rounded to bf16 (ties to even) as words into h (M,N); x is only read. One pass for
 * the bf16 forward, whose next product reads the GELU output as bf16 anyway. */
void bq_infer_bias_gelu_bf16(uint16_t *h, const float *x, const float *bias, int64_t M, int64_t N);

/* bq_infer_attention on the fp32 output qkv (B,T,3H) of the bias-free fused query/key/value GEMM: for
 * every (b, h), Q_h, K_h, V_h = its columns + bias (3H), S = Q_h·K_hᵀ, P = softmax(scale·S + (1 −
 * mask)·(−FLT_MAX)) over keys, ctx (B,Q,H) head columns = P·V_h of the first Q query rows in fp32. d a
 * multiple of 8; Q and scratch as bq_infer_attention's. */
void bq_infer_attention_f32(float *ctx, const float *qkv, const float *bias, const float *mask, float *scratch,
                            int64_t nthreads, float scale, int64_t B, int64_t T, int64_t Q, int64_t NH, int64_t d);

#endif
