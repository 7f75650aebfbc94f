/* Fake-quantization state of a QAT/PTQ BERT: named quantizers at placement points chosen by a scheme
 * (../shared/DESIGN.md §4), their observers/calibrators, and the hook the model forward calls at each
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

/* Placement points inside one encoder layer. Activation points quantize a tensor the forward
 * produces; weight points quantize a Linear's weight (per output channel unless per-tensor). */
typedef enum BqQPoint {
    /* ort scheme activations (DESIGN.md §4, rows 7-18) */
    BQ_QP_Q_OUT, BQ_QP_K_OUT, BQ_QP_V_OUT,   /* query/key/value Linear outputs, after bias */
    BQ_QP_SCORES,                            /* Q·Kᵀ before 1/√d and the mask */
    BQ_QP_PROBS,                             /* softmax output, before attention dropout */
    BQ_QP_CONTEXT,                           /* probs·V, before the head merge */
    BQ_QP_ATTN_RESID,                        /* attention.output dense + bias + residual, before LN */
    BQ_QP_ATTN_LN,                           /* attention.output.LayerNorm output */
    BQ_QP_INTER_OUT,                         /* intermediate.dense output, before GELU */
    BQ_QP_GELU_OUT,                          /* GELU output */
    BQ_QP_OUT_RESID,                         /* output dense + bias + residual, before LN */
    BQ_QP_OUT_LN,                            /* output.LayerNorm output */
    /* qdqbert scheme activations */
    BQ_QP_Q_IN, BQ_QP_K_IN, BQ_QP_V_IN,      /* inputs of query/key/value Linears */
    BQ_QP_AO_IN, BQ_QP_I_IN, BQ_QP_O_IN,     /* inputs of attention.output/intermediate/output dense */
    BQ_QP_MM1_Q, BQ_QP_MM1_K,                /* both inputs of Q·Kᵀ */
    BQ_QP_MM2_P, BQ_QP_MM2_V,                /* both inputs of probs·V */
    BQ_QP_ADD1_LOCAL, BQ_QP_ADD1_RESID,      /* attention.output residual add: dense out, residual */
    BQ_QP_ADD2_LOCAL, BQ_QP_ADD2_RESID,      /* output residual add: dense out, residual */
    /* cpu scheme activation */
    BQ_QP_QKV_IN,                            /* the one input of query/key/value (quantized once) */
    /* weights */
    BQ_QP_W_Q, BQ_QP_W_K, BQ_QP_W_V, BQ_QP_W_AO, BQ_QP_W_I, BQ_QP_W_O,
    BQ_QP_LAYER_COUNT
} BqQPoint;

/* The one point outside the encoder layers: the embeddings' LayerNorm output (ort scheme). */
#define BQ_QP_LAYER_EMB (-1)

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
} BqQuantizer;

typedef struct BqQuantConfig {
    char scheme[16];       /* "ort" | "qdqbert" | "cpu" */
    int per_tensor_weights;
    int fuse_qkv;          /* one shared range for Q, K and V outputs (or inputs) */
    float clip_gelu;       /* > 0: cap the GELU-output amax at this value */
    float averaging_constant; /* moving-average observer constant, 0.01 */
    char exclude[256];     /* comma-separated module names kept in fp32 ("classifier,pooler") */
    /* additions (qat helper) */
    int64_t freeze_after;  /* > 0: freeze every range after this many optimizer steps */
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
    int plain_fakequant;   /* tests: every activation quantizer gets its own gradient buffer (no
                              bq_op_fakequant_sole), to check the shared-buffer path against it */
} BqQuantState;

/* Integer range of a quantizer: [qmin, qmax] = [-2^(bits-1), 2^(bits-1) - 1]. */
static inline int bq_quant_qmax(const BqQuantizer *q) { return (1 << (q->bits - 1)) - 1; }
static inline int bq_quant_qmin(const BqQuantizer *q) { return -(1 << (q->bits - 1)); }

/* Bits of the weight quantizers of a scheme: 7 for "cpu", 8 otherwise. */
int bq_quant_scheme_weight_bits(const char *scheme);
/* BQ_OK when scheme is one of ort, qdqbert, cpu; else a BQ_EINVAL error naming flag_or_key. */
int bq_quant_scheme_check(const char *scheme, const char *flag_or_key);

/* The quantizer at (layer, point), or NULL when the scheme puts none there. layer = BQ_QP_LAYER_EMB
 * with point -1 is the embeddings' LayerNorm output. */
BqQuantizer *bq_quant_at(BqQuantState *qs, int layer, int point);

/* The hook the forward calls at each activation point: returns x unchanged when qs is NULL or no
 * quantizer sits there; otherwise updates the observer (when observing) or the calibration
 * statistics (when collecting) and returns the fake-quantized tensor. */
BqTensor *bq_quant_act(BqQuantState *qs, BqCtx *ctx, int layer, int point, BqTensor *x);
/* Same for a Linear weight (per channel along axis 0 unless per-tensor). */
BqTensor *bq_quant_weight(BqQuantState *qs, BqCtx *ctx, int layer, int point, BqTensor *w);

/* ---- additions (qat helper): life cycle, calibration, persistence (layers/quant.c, qscheme.c) ---- */

struct BqBert;
struct json_t;

typedef enum BqCalibrator {
    BQ_CALIBRATOR_MAX = 0,        /* running max of |x| */
    BQ_CALIBRATOR_PERCENTILE = 1, /* histogram percentile (pytorch-quantization semantics) */
    BQ_CALIBRATOR_MSE = 2,        /* histogram, amax minimising the quantization MSE */
    BQ_CALIBRATOR_ENTROPY = 3,    /* histogram, amax minimising KL divergence (TensorRT) */
} BqCalibrator;

/* Defaults: scheme "ort", per-channel weights, no fusion, no clip, averaging 0.01,
 * exclude "classifier,pooler", freeze_after 0. */
void bq_quant_config_default(BqQuantConfig *cfg);
/* Parses "max|percentile|mse|entropy"; errors name the flag value. */
int bq_calibrator_parse(BqCalibrator *out, const char *s);
const char *bq_calibrator_name(BqCalibrator c);

/* Builds the quantizer table of cfg's scheme for model m (uninitialised ranges). Errors: unknown
 * scheme. layers/qscheme.c. */
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

/* Config as the "bertqat" JSON block of a checkpoint's config.json, and back (missing keys keep
 * their defaults; bad types are errors naming the key). */
struct json_t *bq_quant_config_to_json(const BqQuantConfig *cfg);
int bq_quant_config_from_json(BqQuantConfig *cfg, struct json_t *j);

/* Ranges in an HDF5 checkpoint, on an open file handle (hid_t, an int64_t in HDF5 >= 1.10) of
 * export/ckpt.c; `path` names the file in messages. Layout: /quant/<name>/{amax, scale} with
 * attributes axis, bits, scheme, frozen, initialized, and observer_min/observer_max (the
 * moving-average state, so QAT resumes exactly). load requires m->quant to exist (built from
 * config.json) and fills every quantizer; a missing quantizer group or a shape mismatch is a
 * BQ_EFORMAT error naming the file and quantizer. */
int bq_quant_save_hdf5(const BqQuantState *qs, int64_t file_id, const char *path);
int bq_quant_load_hdf5(struct BqBert *m, int64_t file_id, const char *path);

#endif
