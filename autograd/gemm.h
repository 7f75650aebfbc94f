/* The one floating-point GEMM entry point of the library: every product of the tape ops (Linear
 * forward and both backward GEMMs, the attention products), the fused evaluation layers and the
 * benchmarks goes through bq_gemm with a precision.
 *
 *   fp32: cblas_sgemm (OpenBLAS), as the kernels always did.
 *   bf16: mixed precision as torch.autocast(dtype=torch.bfloat16) runs a matmul: both operands are
 *         rounded to bf16 (round to nearest even, the rounding of PyTorch's and oneDNN's conversions),
 *         multiplied exactly (a bf16·bf16 product fits the fp32 significand) and accumulated in fp32;
 *         the output is fp32. Where the CPU has AVX512-BF16 or AMX-BF16 the product runs on oneDNN's
 *         bf16 matmul (primitives created once per shape and cached); elsewhere it is emulated: the
 *         rounded operands go to cblas_sgemm. The two give the same values up to the order of the fp32
 *         accumulation (docs/training.md, "Precision"). */
#ifndef BQ_GEMM_H
#define BQ_GEMM_H

#include <stdint.h>

#include "autograd/bq.h"

typedef enum BqTrans { BQ_NOTRANS = 0, BQ_TRANS = 1 } BqTrans;

/* C (M,N), rows ldc apart, = op(A)·op(B) + beta·C with beta 0 or 1. op(A) is (M,K): A stored (M,K) with
 * rows lda apart (BQ_NOTRANS) or (K,M) (BQ_TRANS); op(B) is (K,N): B stored (K,N) or (N,K), rows ldb
 * apart. Row-major. May be called from inside an OpenMP parallel region (then it runs on the calling
 * thread alone, as the attention products do) or from the serial region (threaded inside). Scratch for
 * the bf16 operands is kept per thread and grows on demand, so only the first call at a size allocates.
 * oneDNN failures (out of memory) abort with the message: there is no status path through the ops. */
void bq_gemm(BqPrecision prec, BqTrans ta, BqTrans tb, int64_t M, int64_t N, int64_t K, const float *A,
             int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

/* A GEMM operand or elementwise input in either storage: fp32 values (f) or bf16 words (h, the upper
 * halves of the binary32 values), exactly one of the two set. Activations the bf16 step keeps for its
 * backward are stored as bf16 words where every reader rounds them to bf16 anyway (autograd/tensor.h). */
typedef struct BqMat {
    const float *f;
    const uint16_t *h;
} BqMat;

static inline BqMat bq_mat_f32(const float *f) { return (BqMat){.f = f, .h = NULL}; }
/* The operand off elements into m. */
static inline BqMat bq_mat_at(BqMat m, int64_t off) {
    return m.h ? (BqMat){.f = NULL, .h = m.h + off} : (BqMat){.f = m.f + off, .h = NULL};
}

/* bq_gemm with operands in either storage. A bf16-word operand needs prec BQ_PRECISION_BF16; its values
 * are exactly bf16 already, so the result equals bq_gemm on the same values as floats. */
void bq_gemm_mat(BqPrecision prec, BqTrans ta, BqTrans tb, int64_t M, int64_t N, int64_t K, BqMat A, int64_t lda,
                 BqMat B, int64_t ldb, float beta, float *C, int64_t ldc);

/* dst[i] = bq_bf16_bits(src[i]) for i < n, threaded outside parallel regions. */
void bq_bf16_words(uint16_t *dst, const float *src, int64_t n);

/* The bf16 words of x (rows, cols), packed, in the calling thread's own buffer (grown on demand, kept
 * for the process), valid until that thread's next call: an operand that two products read (a Linear's
 * dout in its backward) is converted once. */
BqMat bq_gemm_words(const float *x, int64_t rows, int64_t cols);

/* How bf16 products run in this process. */
typedef enum BqBf16Path {
    BQ_BF16_EMULATED = 0, /* rounded operands, cblas_sgemm */
    BQ_BF16_ONEDNN = 1    /* oneDNN bf16 matmul on the CPU's bf16 units */
} BqBf16Path;

/* The path bf16 products take: oneDNN where the CPU has AVX512-BF16 or AMX-BF16 and oneDNN creates a
 * bf16 matmul on it (checked once), else emulated. */
BqBf16Path bq_gemm_bf16_path(void);
/* Forces a path (tests compare the two on a CPU with bf16 units). BQ_BF16_ONEDNN where the CPU cannot
 * run it returns BQ_EINVAL and changes nothing. */
int bq_gemm_bf16_force(BqBf16Path path);
/* One line: "bf16 GEMMs: oneDNN 2.6.3 avx512_core_bf16" or "bf16 GEMMs: emulated (rounded operands,
 * OpenBLAS sgemm): this CPU has neither AVX512-BF16 nor AMX-BF16". */
const char *bq_gemm_bf16_describe(void);

/* x rounded to the nearest bf16, ties to even, returned as an fp32 value (low 16 bits zero); NaN stays
 * NaN, ±Inf stays, values that round past the largest bf16 become ±Inf. */
static inline float bq_bf16_round(float x) {
    union {
        float f;
        uint32_t u;
    } v = {.f = x};
    if ((v.u & 0x7f800000u) == 0x7f800000u) { /* Inf or NaN: keep, quieting a NaN that would lose its bits */
        if (v.u & 0x007fffffu) v.u |= 0x00400000u;
        v.u &= 0xffff0000u;
        return v.f;
    }
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    v.u &= 0xffff0000u;
    return v.f;
}

/* The bf16 word of bq_bf16_round(x), and the float value of a bf16 word (exact). */
static inline uint16_t bq_bf16_bits(float x) {
    union {
        float f;
        uint32_t u;
    } v = {.f = bq_bf16_round(x)};
    return (uint16_t)(v.u >> 16);
}
static inline float bq_bf16_float(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)h << 16};
    return v.f;
}

#endif
