/* Fake-quantization state of a QAT/PTQ BERT: named quantizers at placement points chosen by a scheme
 * (docs/design.md §4), their observers/calibrators, and the hook the model forward calls at each
 * point. The ONNX exporter asks the same table which points carry a quantizer, so the exported Q/DQ
 * graph is the graph that was trained.
 *
 * Convention (written into checkpoints and exported unchanged): symmetric int8 with zero point 0,
 * scale = amax / 127, q = clamp(rne(x / scale), -128, 127) — exactly ONNX QuantizeLinear with an int8
 * zero point of 0, so ONNX Runtime computes what training simulated. The `cpu` scheme's weights are
 * 7-bit on the same rule (scale = amax / 63, q in [-64, 63]): ONNX Runtime's x86 U8S8 kernels
 * (AVX2/AVX-512 without VNNI) add u8·s8 products in pairs into saturating int16, which is exact only
 * while |w| <= 64 (onnxruntime_session_options_config_keys.h, session.x64quantprecision). */
#ifndef BQ_QUANT_H
#define BQ_QUANT_H

#include <stdint.h>

#include "autograd/tensor.h"

/* Quantization schemes: where quantizers sit (bq_quant_create, layers/qscheme.c). Checkpoints
 * (config.json "scheme") and ONNX metadata store the name, bq_scheme_name(). */
typedef enum BqScheme { BQ_SCHEME_ORT, BQ_SCHEME_QDQBERT, BQ_SCHEME_CPU } BqScheme;
#define BQ_SCHEME_COUNT 3
/* Bit of a scheme in the scheme masks of BQ_QPOINTS. */
#define BQ_SCHEME_BIT(s) (1u << (s))
#define BQ_ORT BQ_SCHEME_BIT(BQ_SCHEME_ORT)
#define BQ_QDQ BQ_SCHEME_BIT(BQ_SCHEME_QDQBERT)
#define BQ_CPU BQ_SCHEME_BIT(BQ_SCHEME_CPU)

/* The quantization points inside one encoder layer (docs/design.md §4), one line each:
 *   X(point, role, is_weight, sole, schemes, feeds)
 * point: the BqQPoint name; role: the Hugging Face module path after "bert.encoder.layer.<L>." plus
 * the quantizer role, written into checkpoints (/quant/<name>) and ONNX node/initializer names;
 * is_weight: 1 quantizes a Linear's weight (per output channel unless per-tensor), 0 a tensor the
 * forward (layers/bert.c) produces; sole: 1 when the forward reads that activation only through its
 * quantizer, so bq_quant_act may use bq_op_fakequant_sole (shared gradient buffer); 0 where other ops
 * read the same tensor (the layer input and the attention LayerNorm output feed several Linears or a
 * residual) and for weights, which never take that path; schemes: mask of the schemes placing it;
 * feeds: the first of the layer's Linears whose output the point changes, Q, K, V, QKV (the shared
 * query/key/value input: all three), AO, I, O, or NONE (after the output dense), from which
 * bq_bert_linear_reach (layers/bert.c) follows the layer's data flow to the Linears after it. INTER_OUT
 * names I: whether it is placed decides whether the intermediate dense adds its own bias (layers/bert.c).
 * The order of this list is the order of a layer's quantizers in every scheme's table (checkpoints
 * and `bertqat info` list them so): never reorder it; add a point by adding one line (and its call
 * in layers/bert.c and export/onnx_bert.c, which checks that every quantizer it is given is placed). */
#define BQ_QPOINTS(X)                                                                                     \
    /* weights of the 6 encoder Linears, every scheme */                                                  \
    X(W_Q, "attention.self.query.weight_quantizer", 1, 0, BQ_ORT | BQ_QDQ | BQ_CPU, Q)                    \
    X(W_K, "attention.self.key.weight_quantizer", 1, 0, BQ_ORT | BQ_QDQ | BQ_CPU, K)                      \
    X(W_V, "attention.self.value.weight_quantizer", 1, 0, BQ_ORT | BQ_QDQ | BQ_CPU, V)                    \
    X(W_AO, "attention.output.dense.weight_quantizer", 1, 0, BQ_ORT | BQ_QDQ | BQ_CPU, AO)                \
    X(W_I, "intermediate.dense.weight_quantizer", 1, 0, BQ_ORT | BQ_QDQ | BQ_CPU, I)                      \
    X(W_O, "output.dense.weight_quantizer", 1, 0, BQ_ORT | BQ_QDQ | BQ_CPU, O)                            \
    /* ort: outputs of ops (ONNX Runtime bert_imdb_finetune_qat) */                                       \
    X(Q_OUT, "attention.self.query.output_quantizer", 0, 1, BQ_ORT, AO)     /* after bias */              \
    X(K_OUT, "attention.self.key.output_quantizer", 0, 1, BQ_ORT, AO)                                     \
    X(V_OUT, "attention.self.value.output_quantizer", 0, 1, BQ_ORT, AO)                                   \
    X(SCORES, "attention.self.matmul_qk.output_quantizer", 0, 1, BQ_ORT, AO) /* Q·Kᵀ, before 1/√d */      \
    X(PROBS, "attention.self.softmax.output_quantizer", 0, 1, BQ_ORT, AO)   /* before dropout */          \
    X(CONTEXT, "attention.self.matmul_av.output_quantizer", 0, 1, BQ_ORT, AO) /* before head merge */     \
    X(ATTN_RESID, "attention.output.residual_add.output_quantizer", 0, 1, BQ_ORT, I) /* before LN */      \
    X(ATTN_LN, "attention.output.LayerNorm.output_quantizer", 0, 1, BQ_ORT, I)                            \
    X(INTER_OUT, "intermediate.dense.output_quantizer", 0, 1, BQ_ORT, I)    /* before GELU */             \
    X(GELU_OUT, "intermediate.intermediate_act_fn.output_quantizer", 0, 1, BQ_ORT, O)                     \
    X(OUT_RESID, "output.residual_add.output_quantizer", 0, 1, BQ_ORT, NONE) /* before LN */              \
    X(OUT_LN, "output.LayerNorm.output_quantizer", 0, 1, BQ_ORT, NONE)                                    \
    /* qdqbert: inputs of the Linears (HF QDQBERT); cpu: one Q/K/V input, the other Linear inputs */      \
    X(Q_IN, "attention.self.query.input_quantizer", 0, 0, BQ_QDQ, Q)                                      \
    X(K_IN, "attention.self.key.input_quantizer", 0, 0, BQ_QDQ, K)                                        \
    X(V_IN, "attention.self.value.input_quantizer", 0, 0, BQ_QDQ, V)                                      \
    X(QKV_IN, "attention.self.input_quantizer", 0, 0, BQ_CPU, QKV)          /* quantized once */          \
    X(AO_IN, "attention.output.dense.input_quantizer", 0, 1, BQ_QDQ | BQ_CPU, AO)                         \
    X(I_IN, "intermediate.dense.input_quantizer", 0, 0, BQ_QDQ | BQ_CPU, I)                               \
    X(O_IN, "output.dense.input_quantizer", 0, 1, BQ_QDQ | BQ_CPU, O)                                     \
    /* qdqbert: both inputs of the two attention matmuls and of the two residual adds */                  \
    X(MM1_Q, "attention.self.matmul_q_input_quantizer", 0, 1, BQ_QDQ, AO)                                 \
    X(MM1_K, "attention.self.matmul_k_input_quantizer", 0, 1, BQ_QDQ, AO)                                 \
    X(MM2_P, "attention.self.matmul_a_input_quantizer", 0, 1, BQ_QDQ, AO)                                 \
    X(MM2_V, "attention.self.matmul_v_input_quantizer", 0, 1, BQ_QDQ, AO)                                 \
    X(ADD1_LOCAL, "attention.output.add_local_input_quantizer", 0, 1, BQ_QDQ, I) /* dense output */       \
    X(ADD1_RESID, "attention.output.add_residual_input_quantizer", 0, 0, BQ_QDQ, I) /* layer input */     \
    X(ADD2_LOCAL, "output.add_local_input_quantizer", 0, 1, BQ_QDQ, NONE)                                 \
    X(ADD2_RESID, "output.add_residual_input_quantizer", 0, 0, BQ_QDQ, NONE) /* attention LN out */

typedef enum BqQPoint {
#define BQ_QP_ENUM_(point, role, is_weight, sole, schemes, feeds) BQ_QP_##point,
    BQ_QPOINTS(BQ_QP_ENUM_)
#undef BQ_QP_ENUM_
    BQ_QP_LAYER_COUNT
} BqQPoint;

/* One row of BQ_QPOINTS. */
typedef struct BqQPointDef {
    const char *role;
    int is_weight;
    int sole;
    unsigned schemes;
} BqQPointDef;
/* (BQ_QP_LAYER_COUNT) rows of BQ_QPOINTS indexed by BqQPoint (layers/quant.c). */
extern const BqQPointDef bq_qpoint_defs[BQ_QP_LAYER_COUNT];

/* The one point outside the encoder layers, its own row of the same columns: the embeddings'
 * LayerNorm output (layer BQ_QP_LAYER_EMB, point -1), read only through its quantizer, placed by the
 * ort scheme only, first in its table. */
#define BQ_QP_LAYER_EMB (-1)
#define BQ_QP_EMB_NAME "bert.embeddings.LayerNorm.output_quantizer"
#define BQ_QP_EMB_SOLE 1
#define BQ_QP_EMB_SCHEMES BQ_ORT

typedef enum BqCalibMode {
    BQ_CALIB_OFF = 0,      /* use current ranges (frozen, or moving-average observer in training) */
    BQ_CALIB_COLLECT = 1,  /* collect statistics (max or histogram); pass tensors through unquantized */
} BqCalibMode;

typedef struct BqQuantizer {
    char name[160];        /* HF module path + role, e.g.
                              "bert.encoder.layer.3.attention.self.query.output_quantizer" */
    int layer;             /* encoder layer, or BQ_QP_LAYER_EMB */
    int point;             /* BqQPoint, or -1 for the embeddings LN output */
    int is_weight;
    int axis;              /* -1: per tensor; 0: per output channel of a (out,in) weight */
    int bits;              /* 8, or 7 for the cpu scheme's weights: q in [-2^(bits-1), 2^(bits-1)-1],
                              scale = amax / (2^(bits-1) - 1) */
    int64_t nch;           /* number of scales (1 when per tensor) */
    float *amax;           /* (nch) */
    float *scale;          /* (nch) = amax / 127 (amax / 63 at 7 bits), floored at a tiny positive value */
    int initialized;       /* a range has been set */
    int frozen;            /* ranges no longer updated */
    float run_min, run_max;/* moving-average observer state (activations) */
    struct BqHistogram *hist; /* calibration statistics, NULL unless collecting */
    /* additions (qat helper): per-channel moving-average observer state of weights, (nch) each;
     * NULL for activations. Weights follow PyTorch's default_per_channel_weight_fake_quant
     * (MovingAveragePerChannelMinMaxObserver, averaging constant 0.01), as the ORT example does. */
    float *ch_min, *ch_max;
    int enabled;           /* 1 (bq_quant_create's default): quantize; 0: bq_quant_act/bq_quant_weight pass
                              tensors through unquantized, so a run can leave chosen quantizers in fp32
                              without rebuilding the table (src/sensitivity.c); never saved */
    /* --ranges learn: the gradient of scale (nch floats in BqQuantState.lsq, where
     * scale then points too); NULL when the ranges are not learned */
    float *dscale;
    /* A weight's codes and scales packed for the integer GEMM of bq_quant_linear (autograd/qgemm.h),
     * refilled from the fake-quantized weight at every forward and packed again only when they changed;
     * NULL until a forward runs this Linear on integers. Never saved. */
    struct BqQGemmWeights *qgemm;
} BqQuantizer;

typedef struct BqQuantConfig {
    BqScheme scheme;       /* config.json "scheme": bq_scheme_name() */
    int per_tensor_weights;
    int fuse_qkv;          /* one shared range for Q, K and V outputs (or inputs) */
    float clip_gelu;       /* > 0: cap the GELU-output amax at this value */
    float averaging_constant; /* moving-average observer constant, 0.01 */
    char exclude[1024];    /* comma-separated module names kept in fp32 ("classifier,pooler") */
    /* additions (qat helper) */
    int64_t freeze_after;  /* > 0: freeze every range after this many optimizer steps */
    /* --ranges learn, config.json "ranges": "learn" and "range_lr" */
    int learn_ranges;      /* every scale is a trained parameter (LSQ, bq_quant_learn_enable) */
    double range_lr;       /* its peak learning rate (AdamW, no weight decay, the run's schedule) */
} BqQuantConfig;

typedef struct BqQuantState {
    BqQuantConfig cfg;
    BqQuantizer *q;
    int n;
    int *slot;             /* (num_layers·BQ_QP_LAYER_COUNT + 1) → index into q, or -1; last = emb LN */
    int num_layers;
    int observe;           /* training with live moving-average observers (unfrozen quantizers) */
    BqCalibMode calib;
    int64_t steps_seen;
    int fp32_linear;       /* 1: bq_quant_linear always runs the fp32 Linear (tests and benchmarks compare
                              the integer forward with it); 0, the default: integers where it applies */
    int plain_fakequant;   /* tests: every activation quantizer gets its own gradient buffer (no
                              bq_op_fakequant_sole), to check the shared-buffer path against it */
    /* Set by src/train.c under mpirun: reduces an activation observer's batch min/max over the ranks
     * (min of mins, max of maxes) in training forwards, so every rank's ranges stay identical. */
    void (*reduce_minmax)(float *mn, float *mx);
    /* --ranges learn. One block of 5·nscales floats, nscales = Σ nch over the
     * table: the scales (each q->scale points into it, in table order), their gradients (q->dscale),
     * the AdamW moments m and v of the scale group (src/optim.h) and the best scales (the trainer's
     * best-model copy). NULL when the ranges are not learned. */
    int64_t nscales;
    float *lsq, *lsq_grad, *lsq_m, *lsq_v, *lsq_best;
} BqQuantState;

/* Smallest scale: torch.finfo(float32).eps, PyTorch's scale floor; learned scales are clamped to it. */
#define BQ_QUANT_SCALE_FLOOR 1.1920928955078125e-07f

/* Integer range of a quantizer: [qmin, qmax] = [-2^(bits-1), 2^(bits-1) - 1]. */
static inline int bq_quant_qmax(const BqQuantizer *q) { return (1 << (q->bits - 1)) - 1; }
static inline int bq_quant_qmin(const BqQuantizer *q) { return -(1 << (q->bits - 1)); }

/* The scheme names in BqScheme's order, NULL-terminated: the one list bq_scheme_parse, bq_scheme_name
 * and the CLI's --scheme (src/cli/args.h, BQ_ARG_ENUM) read. */
extern const char *const bq_scheme_names[BQ_SCHEME_COUNT + 1];
/* Parses a scheme name ("ort", "qdqbert", "cpu"); anything else is a BQ_EINVAL error naming
 * flag_or_key and listing the valid names. */
int bq_scheme_parse(BqScheme *out, const char *s, const char *flag_or_key);
/* "ort", "qdqbert" or "cpu". */
const char *bq_scheme_name(BqScheme s);
/* Bits of the weight quantizers of a scheme: 7 for cpu, 8 otherwise. */
int bq_quant_scheme_weight_bits(BqScheme s);

/* The quantizer at (layer, point), or NULL when the scheme puts none there. layer = BQ_QP_LAYER_EMB
 * with point -1 is the embeddings' LayerNorm output. */
BqQuantizer *bq_quant_at(BqQuantState *qs, int layer, int point);

/* The hook the forward calls at each activation point: returns x unchanged when qs is NULL or no
 * quantizer sits there; otherwise updates the observer (when observing) or the calibration
 * statistics (when collecting) and returns the fake-quantized tensor. */
BqTensor *bq_quant_act(BqQuantState *qs, BqCtx *ctx, int layer, int point, BqTensor *x);
/* Same for a Linear weight (per channel along axis 0 unless per-tensor). */
BqTensor *bq_quant_weight(BqQuantState *qs, BqCtx *ctx, int layer, int point, BqTensor *w);

/* The quantizer at (layer, point) when it quantizes in this forward (enabled, not collecting calibration
 * statistics, range set), else NULL. */
BqQuantizer *bq_quant_active(BqQuantState *qs, int layer, int point);

/* y = x·wᵀ + b for a Linear whose input x went through the activation quantizer iq and whose weight w
 * through the weight quantizer wq (x and w are those hooks' outputs; either quantizer NULL when the
 * tensor was not quantized). When both quantize — iq per tensor at 8 bits (zero point 0), wq per channel
 * or per tensor at up to 8 bits — and qs->fp32_linear is 0, the forward runs on integers
 * (bq_op_linear_qgemm): the codes of w are set in wq->qgemm (packed again only when they changed, so once
 * per optimizer step in training and once in evaluation), the products summed exactly in int32 and
 * rounded once, as the integer engine of layers/bert_int8.h computes them. Otherwise bq_op_linear. The
 * tape node is bq_op_linear's either way, so the backward (straight-through, LSQ) is unchanged. */
BqTensor *bq_quant_linear(BqQuantState *qs, BqCtx *ctx, const BqQuantizer *iq, BqTensor *x, BqQuantizer *wq,
                          BqTensor *w, BqTensor *b);

/* ---- additions (qat helper): life cycle and calibration (layers/quant.c, qscheme.c); their
 * persistence (config.json, model.h5, training_state.h5) is in export/quant_io.h ---- */

struct BqBert;

typedef enum BqCalibrator {
    BQ_CALIBRATOR_MAX = 0,        /* running max of |x| */
    BQ_CALIBRATOR_PERCENTILE = 1, /* histogram percentile (pytorch-quantization semantics) */
    BQ_CALIBRATOR_MSE = 2,        /* histogram, amax minimising the quantization MSE */
    BQ_CALIBRATOR_ENTROPY = 3,    /* histogram, amax minimising KL divergence (TensorRT) */
} BqCalibrator;

/* Defaults: scheme ort, per-channel weights, no fusion, no clip, averaging 0.01,
 * exclude "classifier,pooler", freeze_after 0. */
void bq_quant_config_default(BqQuantConfig *cfg);
/* The calibrator names in BqCalibrator's order, NULL-terminated (as bq_scheme_names). */
extern const char *const bq_calibrator_names[5];
/* Parses "max|percentile|mse|entropy"; errors name the flag value. */
int bq_calibrator_parse(BqCalibrator *out, const char *s);
const char *bq_calibrator_name(BqCalibrator c);

/* Builds the quantizer table of cfg's scheme for model m (uninitialised ranges). Errors: unknown
 * scheme. layers/qscheme.c, which reads the model's configuration (layers/bert.h) and this file's
 * numerics; layers/quant.c never calls it, so the dependency goes one way. */
int bq_quant_create(BqQuantState **out, const struct BqBert *m, const BqQuantConfig *cfg);
void bq_quant_free(BqQuantState *qs);

/* Recomputes q->scale from q->amax (clip_gelu applied to the GELU-output point). */
void bq_quant_update_scale(BqQuantState *qs, BqQuantizer *q);
/* Freezes (or unfreezes) every range. Freezing an uninitialised quantizer is allowed: it keeps
 * initialising from its first batch. */
void bq_quant_freeze(BqQuantState *qs, int frozen);
/* Call after each optimizer step: counts steps and freezes at cfg.freeze_after. */
void bq_quant_step(BqQuantState *qs);
/* Number of quantizers whose range is set. */
int bq_quant_count_initialized(const BqQuantState *qs);

/* Calibration: begin switches every activation quantizer to collecting (tensors pass through
 * unquantized); run forwards; finish computes each amax with `method` (percentile in percent, e.g.
 * 99.99), sets weights to their per-channel (or per-tensor) max, frees statistics, freezes ranges. */
void bq_quant_calib_begin(BqQuantState *qs, BqCalibrator method);
int bq_quant_calib_finish(BqQuantState *qs, BqCalibrator method, double percentile);

/* ---- learned step sizes, --ranges learn (LSQ, Esser et al., ICLR 2020) ----
 * Each scale becomes a trained parameter: the hooks use bq_op_fakequant_lsq with the paper's gradient
 * scale g = 1/√(N·qmax), N = the elements one scale quantizes per example (a weight: its elements per
 * channel, or all of them per tensor; an activation: its elements divided by the batch size, the
 * paper's feature count); the zero point stays 0. Observers stay off (every quantizer frozen). */

/* Moves the current scales into the block described at BqQuantState.lsq (gradients and moments
 * zeroed), sets cfg.learn_ranges and cfg.range_lr, freezes every quantizer and turns observing off.
 * Called again it only sets range_lr. bq_quant_create calls it when cfg->learn_ranges is set. */
void bq_quant_learn_enable(BqQuantState *qs, double range_lr);
/* The inverse: every quantizer gets its own copy of its current scale back, the block is freed and
 * cfg.learn_ranges cleared (QAT with fixed or observed ranges from a checkpoint that learned them). */
void bq_quant_learn_disable(BqQuantState *qs);
/* Best-model copy of the learned scales (the trainer keeps parameters and scales of the best
 * evaluation together): keep copies scales → lsq_best, restore copies back (amax follows). No-ops
 * when the ranges are not learned. */
void bq_quant_learn_keep_best(BqQuantState *qs);
void bq_quant_learn_restore_best(BqQuantState *qs);
/* amax = scale·qmax for every learned scale, so amax and scale describe the same range. */
void bq_quant_learn_sync_amax(BqQuantState *qs);
#endif
