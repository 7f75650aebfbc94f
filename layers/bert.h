/* BertForSequenceClassification and BertForQuestionAnswering with Hugging Face module structure and
 * parameter names (transformers models/bert/modeling_bert.py): BertEmbeddings, BertSelfAttention,
 * BertSelfOutput, BertIntermediate, BertOutput, BertLayer, BertEncoder, then either BertPooler, dropout
 * and classifier (BQ_HEAD_CLS) or qa_outputs on every token's final hidden state (BQ_HEAD_QA, no
 * pooler: HF builds its BertModel with add_pooling_layer=False).
 *
 * One parameter table (BqParamTable) with the HF names of BertForSequenceClassification's state dict
 * ("bert.embeddings.word_embeddings.weight", ..., "classifier.bias") drives allocation, init, the
 * optimizer's decay groups, checkpoint I/O, ONNX initializer names and the reference tests. */
#ifndef BQ_BERT_H
#define BQ_BERT_H

#include <stdint.h>

#include "autograd/tensor.h"
#include "tokenizer/tokenizer.h"
#include "layers/word_rows.h"

#define BQ_NAME_MAX 128

/* The task head on top of the encoder; config.json "architectures" names it. */
typedef enum BqHead {
    BQ_HEAD_CLS, /* BertForSequenceClassification (also any config without a QA architecture) */
    BQ_HEAD_QA   /* BertForQuestionAnswering */
} BqHead;

typedef struct BqBertConfig {
    BqHead head;
    int vocab_size;
    int hidden_size;
    int num_hidden_layers;
    int num_attention_heads;
    int intermediate_size;
    int max_position_embeddings;
    int type_vocab_size;
    int pad_token_id;
    float layer_norm_eps;
    float hidden_dropout_prob;
    float attention_probs_dropout_prob;
    float classifier_dropout;  /* < 0: use hidden_dropout_prob (HF classifier_dropout = null) */
    float initializer_range;
    int num_labels;            /* BQ_HEAD_QA: 2 (qa_outputs has num_labels outputs, start and end) */
    char **id2label;           /* num_labels strings, owned */
} BqBertConfig;

/* Parses a Hugging Face config.json (model_type bert; hidden_act must be gelu). num_labels comes from
 * id2label/num_labels when present, else 2. head is BQ_HEAD_QA when "architectures" lists
 * BertForQuestionAnswering, else BQ_HEAD_CLS. Errors name the file and key. */
int bq_config_load(BqBertConfig *cfg, const char *path);
void bq_config_free(BqBertConfig *cfg);
/* Checks internal consistency (heads divide hidden, positive sizes); errors name the field. */
int bq_config_validate(const BqBertConfig *cfg);

typedef enum BqInit { BQ_INIT_NORMAL, BQ_INIT_ZEROS, BQ_INIT_ONES } BqInit;

typedef struct BqParam {
    char name[BQ_NAME_MAX]; /* HF name, with the "bert." prefix for encoder parameters */
    int ndim;
    int64_t shape[2];       /* Linear weights (out, in) as in PyTorch */
    int64_t numel;
    int64_t offset;         /* in floats, into BqParamTable.data/grad */
    int decay;              /* AdamW weight decay applies (not biases, not LayerNorm weights) */
    BqInit init;
} BqParam;

typedef struct BqParamTable {
    BqParam *p;
    int n;
    int64_t total;          /* floats */
    float *data;            /* one 64-byte aligned block of `total` floats */
    float *grad;            /* same layout; NULL until bq_bert_grad_alloc (loaded models have none) */
    unsigned char *released; /* NULL, or (n) flags: 1 where bq_bert_param_release gave the storage back */
} BqParamTable;

/* Index of a parameter by HF name (accepts names with or without "bert."); -1 if absent. */
int bq_params_find(const BqParamTable *t, const char *name);

typedef struct BqBertLayer {
    BqTensor q_w, q_b, k_w, k_b, v_w, v_b;  /* attention.self.{query,key,value} */
    BqTensor ao_w, ao_b, ln1_w, ln1_b;      /* attention.output.{dense,LayerNorm} */
    BqTensor i_w, i_b;                      /* intermediate.dense */
    BqTensor o_w, o_b, ln2_w, ln2_b;        /* output.{dense,LayerNorm} */
} BqBertLayer;

struct BqQuantState; /* layers/quant.h; NULL for fp32 models */

/* How a checkpoint's examples were encoded when it was trained or calibrated, so that eval, predict
 * and export default to the same settings (config.json "bertqat"."data", export/ckpt.c). An empty
 * column name means the data loader's automatic choice (datasets/dataset.h). */
#define BQ_COLUMN_MAX 64
typedef struct BqDataMeta {
    int max_seq_len;                          /* tokens incl. [CLS]/[SEP]; 0: unknown (nothing recorded) */
    BqTruncation truncation;
    char text_column[BQ_COLUMN_MAX];
    char text_pair_column[BQ_COLUMN_MAX];     /* "": single texts, not sentence pairs */
    char label_column[BQ_COLUMN_MAX];
    int doc_stride;                           /* question answering windows (src/qa.h); 0: not recorded */
    int max_query_length;
} BqDataMeta;

typedef struct BqBert {
    BqBertConfig cfg;
    BqParamTable params;
    BqTensor word_emb, pos_emb, type_emb, emb_ln_w, emb_ln_b;
    BqBertLayer *layers;
    BqTensor pool_w, pool_b, cls_w, cls_b;  /* BQ_HEAD_CLS only (views with NULL data otherwise) */
    BqTensor qa_w, qa_b;                    /* qa_outputs (2,H) and (2); BQ_HEAD_QA only */
    struct BqQuantState *quant;
    BqDataMeta data;
    BqPrecision prec; /* GEMM precision of the forwards run on this model (--precision; 0: fp32) */
    BqWordRows *word_rows; /* NULL, or where the word embeddings come from (bq_bert_word_rows_attach) */
} BqBert;

/* Builds the parameter table for cfg and allocates parameters (and gradients when with_grad),
 * initialised as HF does: normal(0, initializer_range) for weights and embeddings, zeros for biases,
 * ones for LayerNorm weights, using rng. rng NULL leaves every parameter zero and writes no page of the
 * block (a loader that reads every parameter: export/ckpt.c). Takes ownership of cfg's allocations. */
int bq_bert_create(BqBert *m, const BqBertConfig *cfg, int with_grad, BqRng *rng);
void bq_bert_free(BqBert *m);

/* Allocates the gradient block (zeros) and points the tensor views' grad at it; no-op when there is
 * one. The loaders create models without gradients (evaluation never touches them); the trainer calls
 * this before its first step. BQ_ENOMEM when the mapping fails. */
int bq_bert_grad_alloc(BqBert *m);

/* Gives back the storage of parameter i (table index): its whole pages go back to the system (their
 * addresses stay reserved, inaccessible) and every view of it gets data NULL; no-op when it was
 * released already. For an inference engine that keeps its own
 * copy of a weight (layers/bert_int8.h): afterwards the model runs only forwards in which that engine
 * computes the Linear, and is neither saved nor trained. */
void bq_bert_param_release(BqBert *m, int i);

/* Serves m's word embeddings through fetch instead of from its parameters, whose storage is released
 * (bq_bert_param_release): for an inference engine's model, whose table (vocab_size · hidden_size floats,
 * 89 MiB in BERT-base) is most of what fp32 it holds while a run reads the rows of a few thousand words.
 * Each forward fetches the rows of its words not in the pool yet into a pool of `rows` rows (at least one
 * forward's distinct words: it grows to the largest), a new word taking the row of one not used lately
 * once it is full (layers/word_rows.h); the embedding reads the pool, so the values and the logits are
 * those of the held table, bit for bit. close(user) (may be NULL) runs when m is freed. Forwards only: with a tape the forward aborts. A fetch error fails the forward with
 * its message. */
void bq_bert_word_rows_attach(BqBert *m, BqRowFetch fetch, void (*close)(void *), void *user, int64_t rows);

/* Bytes of fp32 parameters m holds: the table's numel · 4 over the parameters not released. */
int64_t bq_bert_param_bytes(const BqBert *m);

/* What the model reads of a batch: shapes (B,T) row-major, the same fields as datasets/batch.h's
 * BqBatch (src/train.h converts). Nothing is owned; everything must outlive the backward pass. */
typedef struct BqBertInput {
    int64_t B, T;
    const int32_t *input_ids;      /* (B,T), each in [0, vocab_size) */
    const float *attention_mask;   /* (B,T) 1 = token, 0 = padding; NULL: no padding */
    const int32_t *token_type_ids; /* (B,T), or NULL: all 0 */
    const int32_t *labels;         /* (B), or NULL; a label < 0 (unlabeled) disables the loss */
    /* BQ_HEAD_QA: token index of the answer's first and last token per example, (B) each, or NULL (no
     * loss). As HF, positions are clamped to [0,T] and T is ignored by the loss; a negative one
     * (unlabeled) disables the loss. */
    const int32_t *start_positions;
    const int32_t *end_positions;
    BqTensor **hidden;             /* NULL, or (num_hidden_layers) outputs: the forward stores each encoder
                                    * layer's output (B,T,H) there, tensors in ctx->act (distillation,
                                    * sensitivity); the last is (B,H) when that layer ran on [CLS] only */
    int all_rows;                  /* 1: compute every token of the last layer even where only [CLS] is
                                    * read (tests compare the two; see bq_bert_forward) */
} BqBertInput;

/* Forward pass of BertForSequenceClassification: logits (B, num_labels); when the input has labels
 * (all >= 0) and loss != NULL, also the mean cross-entropy loss (shape (1)). BertForQuestionAnswering
 * (cfg.head BQ_HEAD_QA): logits (B,T,2), start logit at [b,t,0] and end logit at [b,t,1] (HF splits
 * the same tensor into start_logits and end_logits); with start and end positions, loss =
 * (CE(start) + CE(end)) / 2 (bq_op_span_cross_entropy). Records on ctx->tape when set. Fake quantization happens at the placement points of m->quant, if any. Bad ids, types,
 * labels or lengths are BQ_EINVAL/BQ_EFORMAT errors.
 * The classification head reads only the [CLS] token of the last layer, so without a tape, in
 * evaluation, and when every enabled quantizer has a fixed range (no
 * calibration statistics collected, none uninitialized), the last layer computes its keys and values
 * for every token and its query, the query's attention row, the attention output, feed-forward and
 * LayerNorms for token 0 only: about 84 % of that layer's products (MiniLM at 128 tokens) and all but
 * one row of its attention. Token 0's attention row reads only its own query, every op after the
 * attention is row-wise and the activation quantizers are per tensor with fixed scales, so the logits
 * are those of the whole layer up to the summation order inside its fp32 products (the same code,
 * fewer rows; tests/test_bert_cls_rows.c bounds it). in->all_rows = 1 turns it off. */
int bq_bert_forward(BqBert *m, BqCtx *ctx, const BqBertInput *in, BqTensor **logits, BqTensor **loss);

/* Validates a batch against the model (ids, token types, lengths, labels) as every forward does first: a
 * bad value is a BQ_EINVAL/BQ_EFORMAT error naming the position. *labelled = 1 when every example has a
 * label. For an engine that runs a batch in parts, so that a message names the position in the batch. */
int bq_bert_check_input(const BqBert *m, const BqBertInput *in, int *labelled);

/* The Linears of the model as an engine hook sees them: the six of each encoder layer, query, key and
 * value as one product (asked first; when the hook declines, each is asked alone), then the pooler and
 * the classifier (layer -1). qa_outputs is not offered to hooks: it always runs in fp32 through
 * bq_op_linear. */
typedef enum BqLinearId {
    BQ_LIN_Q, BQ_LIN_K, BQ_LIN_V, BQ_LIN_AO, BQ_LIN_I, BQ_LIN_O, BQ_LIN_QKV, BQ_LIN_POOLER, BQ_LIN_CLASSIFIER
} BqLinearId;

/* The six Linears of an encoder layer (BqBertReuse.lin_keep, lin_reuse). */
#define BQ_LIN_ENCODER 6

/* The encoder Linears of its own layer whose output a quantizer at `point` (a BqQPoint) can change, as a
 * mask of bits 1 << BqLinearId (BQ_LIN_Q … BQ_LIN_O): the Linears it quantizes and every Linear after it
 * in the layer's data flow (query, key and value are side by side; the attention output dense, the
 * intermediate and the output dense follow in that order). A point after the last Linear (the residual
 * adds and LayerNorm of the output) reaches none; the embeddings' point (-1) and any point not named
 * reach all six. The quantizers of other layers reach this layer's Linears only through its input (the
 * values and the grid they lie on). */
unsigned bq_bert_linear_reach(int point);

/* What an evaluation forward takes from, and leaves for, other forwards of the same batch
 * (bq_bert_forward_reuse): `bertqat sensitivity` (src/sensitivity.c) runs one batch under many sets of
 * enabled quantizers and recomputes only what each set can change. Nothing is owned.
 * start_layer > 0: the embeddings and the layers before it are skipped, and start_hidden (B,T,H), the
 * caller's copy of layer start_layer − 1's output, is the input of layer start_layer.
 * lin_keep, lin_reuse: NULL, or (num_hidden_layers·BQ_LIN_ENCODER) entries indexed l·BQ_LIN_ENCODER + id
 * for the six encoder Linears (BQ_LIN_Q … BQ_LIN_O). The output of a Linear is the tensor the forward
 * goes on from: the product plus bias before any output quantizer, the intermediate dense without its
 * bias where the GELU pass adds it, and the output dense as the fused GELU + dense where the forward
 * fuses them. Its shape is the Linear's input's with the last dimension the weight's rows (hidden_size
 * or intermediate_size). lin_keep[i] non-NULL: the forward copies that output there (room for
 * B·T·features floats). lin_reuse[i] non-NULL: the forward copies that output from there instead of
 * computing the Linear; the caller guarantees that it is what this forward would compute (the same
 * Linear input and the same enabled quantizers up to the Linear: bq_bert_linear_reach). */
typedef struct BqBertReuse {
    int start_layer;
    BqTensor *start_hidden;
    float *const *lin_keep;
    const float *const *lin_reuse;
} BqBertReuse;

/* bq_bert_forward without a tape and without the loss, taking and leaving what `r` names; every value
 * it computes is the one bq_bert_forward computes on the same input with the same quantizers, so its
 * logits are those of bq_bert_forward bit for bit when the caller's copies are. */
int bq_bert_forward_reuse(BqBert *m, BqCtx *ctx, const BqBertInput *in, const BqBertReuse *r, BqTensor **logits);

/* An inference engine that computes some Linears its own way (layers/bert_int8.h). run() receives the
 * Linear's input x before any input quantizer, and its fp32 weight and bias (NULL for BQ_LIN_QKV). It
 * returns BQ_OK with out[0] set (out[0..2] for BQ_LIN_QKV) when it computed the Linear, BQ_OK with
 * out[0] left NULL to leave the Linear to the forward (fake-quantized operands, bq_op_linear), or an
 * error status, which the forward returns. */
typedef struct BqLinearHook {
    void *user;
    int (*run)(void *user, BqCtx *ctx, int layer, BqLinearId id, BqTensor *x, const BqTensor *w,
               const BqTensor *b, BqTensor **out);
    /* Optional (NULL: never): asked first for each whole encoder layer on x (B,T,H) with the batch's
     * attention mask (B,T) or NULL; sets *y (B,T,H) when it computed the layer, leaves it NULL to let
     * the forward run the layer (asking run() for its Linears), or returns an error status. cls_only
     * (the last layer of a classification forward, bq_bert_forward): only token 0's output is read,
     * and *y may be (B,H), that token's row per example. */
    int (*layer)(void *user, BqCtx *ctx, int layer, BqTensor *x, const float *mask, int cls_only, BqTensor **y);
} BqLinearHook;

/* Replaces m's head by `head` as HF's from_pretrained does for a checkpoint of another architecture:
 * the encoder parameters are kept, the new head's parameters are freshly initialised from rng
 * (qa_outputs, or pooler + classifier with cfg.num_labels), the old head's are dropped. A quantized
 * model keeps its quantizers (they sit in the encoder). No-op when the head is already `head`. */
int bq_bert_set_head(BqBert *m, BqHead head, BqRng *rng);

/* bq_bert_forward with hook (may be NULL) asked for every Linear; only without a tape. */
int bq_bert_forward_hooked(BqBert *m, BqCtx *ctx, const BqBertInput *in, const BqLinearHook *hook,
                           BqTensor **logits, BqTensor **loss);

#endif
