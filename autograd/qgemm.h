/* Integer GEMM for quantized Linears on oneDNN's u8×s8→s32 matmul, and the kernels around it
 * (activation quantization to codes, the fp32 epilogue).
 *
 * Contract (the integer engine of layers/bert_int8.h, and the quantized Linears of the fake-quant and QAT
 * forward, bq_op_linear_qgemm of autograd/tensor.h):
 *   qx[m,k] = clamp(rne(x[m,k] / sx), -128, 127)        (symmetric int8 codes, zero point 0, as the
 *                                                         fake quantizer bq_op_fakequant rounds)
 *   acc[m,n] = Σ_k qx[m,k]·qw[n,k]                      (exact, int32)
 *   y[m,n]   = fl(fl((float)acc[m,n] · fl(sx·sw[n])) + b[n])
 * oneDNN multiplies unsigned by signed bytes, so activations go in as u8 = qx + 128 and the product
 * is corrected with the precomputed row sums of qw: Σ(qx+128)·qw − 128·Σqw, exact in int32.
 *
 * Exactness on CPUs without VNNI: AVX2/AVX-512 kernels without VNNI multiply u8 by s8 with
 * vpmaddubsw, which adds products in pairs into SATURATING int16; 2·255·|w| <= 32767 holds only for
 * |w| <= 64. Weights are therefore accepted only when the codes fit [-64, 64] (7-bit weights, the `cpu`
 * scheme) unless oneDNN dispatches to a VNNI or AMX ISA (32-bit accumulation of every product); weights
 * made by bq_qgemm_weights_create_empty sum 8-bit codes there with exact single-precision GEMMs instead
 * (autograd/qgemm.c says why they are exact).
 *
 * Every result is independent of M (rows are computed from their own data only: the integer part is
 * exact and the epilogue is elementwise) and of the thread count. Not safe for concurrent callers:
 * one thread at a time calls into this module (oneDNN itself runs the OpenMP pool). */
#ifndef BQ_QGEMM_H
#define BQ_QGEMM_H

#include <stdint.h>

#include "autograd/bq.h"

/* One line: oneDNN version, the ISA it dispatches to, and whether the CPU has AVX512-VNNI,
 * AVX-VNNI and AMX-INT8 (cpuid), e.g.
 * "oneDNN 2.6.3 (isa avx2), CPU VNNI: no (avx512-vnni no, avx-vnni no), AMX-INT8: no". */
const char *bq_dnnl_describe(void);
/* 1 when oneDNN's int8 kernels on this CPU accumulate every u8·s8 product in 32 bits (its effective
 * ISA has VNNI or AMX, and a probe of saturating products at three row counts comes out exact), so
 * 8-bit weights are exact; 0 when only |w| <= 64 is exact. Decided once per process. */
int bq_qgemm_exact_8bit(void);

/* Packed weights of one Linear (N outputs, K inputs) with their per-channel scales. */
typedef struct BqQGemmWeights BqQGemmWeights;

/* Packs int8 codes qw (N,K) row-major (PyTorch's (out,in) layout) with scales sw (N values, or 1 for
 * per tensor: nscale 1) of a quantizer of `bits` bits. The codes are copied, and fixed: such weights are
 * never refilled (bq_qgemm_weights_set is for bq_qgemm_weights_create_empty's), so the copy is freed
 * once the first GEMM has made oneDNN's layout of them, and the weights then hold one byte per code.
 * Errors (BQ_EINVAL naming
 * `name` and its bits): codes outside [-2^(bits-1), 2^(bits-1)-1]; bits > 7 or codes outside [-64, 64]
 * on a CPU without VNNI (bq_qgemm_exact_8bit() == 0). */
int bq_qgemm_weights_create(BqQGemmWeights **out, const int8_t *qw, const float *sw, int64_t nscale, int64_t N,
                            int64_t K, int bits, const char *name);
void bq_qgemm_weights_free(BqQGemmWeights *w);
int64_t bq_qgemm_weights_n(const BqQGemmWeights *w);
int64_t bq_qgemm_weights_k(const BqQGemmWeights *w);
/* Bytes w holds: its plain codes (N·K; none once fixed weights have a layout), their float copy where
 * the sums run on sgemm, each oneDNN layout made so far (one per distinct layout a GEMM asked for), and
 * the per-row sums and scales. */
int64_t bq_qgemm_weights_bytes(const BqQGemmWeights *w);

/* The whole Linear from fp32 input: bq_qgemm_quantize_u8 of x (M,K) with sx, then bq_qgemm_linear
 * into out (M,N), nout 1; the same bits. scratch: M·N int32 of caller memory; codes: M·K bytes (unused,
 * may be NULL, for split weights, which skip the u8 codes). */
int bq_qgemm_linear_f32(BqQGemmWeights *w, const float *x, int64_t M, float sx, const float *b, float *out,
                        uint8_t *codes, int32_t *scratch);

/* Codes of x (n floats) as u8 = clamp(rne(x/sx), -128, 127) + 128, with a true division as
 * bq_kernel_fakequant_forward (so fl(code·sx) is exactly the fake-quantized value). A NaN gives code 0. */
void bq_qgemm_quantize_u8(uint8_t *out, const float *x, int64_t n, float sx);

/* acc (M,N) = Σ_k qx[m,k]·qw[n,k], exact; xu8 (M,K) holds qx + 128. Errors: oneDNN failures
 * (BQ_ENOMEM for memory, else BQ_EINVAL with oneDNN's status). */
int bq_qgemm_s32(BqQGemmWeights *w, const uint8_t *xu8, int64_t M, int32_t *acc);

/* acc (M,N) = Σ_k (qx[m,k] + 128)·qw[n,k], exact and NOT yet corrected: acc − comp[n] is the product
 * of the codes (comp = bq_qgemm_weights_comp, 128·Σ_k qw[n,k]). For fused epilogues
 * (autograd/infer_kernels.h) that fold the correction into their pass. Errors as bq_qgemm_s32. */
int bq_qgemm_raw(BqQGemmWeights *w, const uint8_t *xu8, int64_t M, int32_t *acc);
/* (N) the zero-point corrections 128·Σ_k qw[n,k] and the weight scales sw[n] (per-tensor expanded). */
const int32_t *bq_qgemm_weights_comp(const BqQGemmWeights *w);
const float *bq_qgemm_weights_scale(const BqQGemmWeights *w);

/* The whole Linear: y = fl(fl(acc·fl(sx·sw[n])) + b[n]) (b may be NULL: no bias). The N columns are
 * split into nout equal blocks; block j is written to out[j] as a contiguous (M, N/nout) array (the
 * fused query/key/value GEMM writes three tensors). scratch: M·N int32 of caller memory. */
int bq_qgemm_linear(BqQGemmWeights *w, const uint8_t *xu8, int64_t M, float sx, const float *b, int nout,
                    float *const out[], int32_t *scratch);

/* ---- weights refilled in place: the QAT forward (layers/quant.c), codes that change every step ----
 * Such weights are exact on every CPU at up to 8 bits: where 8-bit codes are not
 * (bq_qgemm_exact_8bit() == 0), the codes are also kept as floats and summed by sgemm in blocks of at
 * most 1024 inputs, each block sum an integer below 2^24 and so exact (added in int32): the same
 * integers one 8-bit GEMM gives on a VNNI CPU, at one sgemm's cost. Every bq_qgemm_* function above
 * accepts them. */

/* An (N,K) weights object with `bits`-bit codes (2..8), all codes 0 until bq_qgemm_weights_set.
 * Errors (BQ_EINVAL naming `name`): bits out of range, K overflowing the int32 accumulator. */
int bq_qgemm_weights_create_empty(BqQGemmWeights **out, int64_t N, int64_t K, int bits, const char *name);
/* Sets the codes to clamp(rne(wf[n,k] / sw[n]), qmin, qmax) with a true division (the rounding of
 * bq_kernel_fakequant_forward, so a fake-quantized weight wf = fl(q·sw[n]) gives back exactly q) and the
 * scales to sw (nscale N, or 1 for per tensor). Returns 1 when codes or scales changed (their packed
 * copies are then made again on next use, into the same memory), 0 when they are the ones already
 * packed. Allocates nothing. */
int bq_qgemm_weights_set(BqQGemmWeights *w, const float *wf, const float *sw, int64_t nscale);
/* 1 when the codes are summed by sgemm on floats (8-bit codes on a CPU without VNNI or AMX). */
int bq_qgemm_weights_split(const BqQGemmWeights *w);
/* Split weights (bq_qgemm_weights_split) that are never refilled again: their int8 codes go, one byte
 * per weight, since their sums read the float copy; w is then fixed (bq_qgemm_weights_set refuses it). */
void bq_qgemm_weights_freeze(BqQGemmWeights *w);

/* Drops every cached oneDNN primitive (they are rebuilt on demand); for tests and shutdown. */
void bq_qgemm_cache_clear(void);
/* Number of primitives created since start (a test checks the cache reuses them). */
int64_t bq_qgemm_primitives_created(void);

#endif
