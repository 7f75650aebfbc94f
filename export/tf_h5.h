/* Reader for a Hugging Face TensorFlow checkpoint `tf_model.h5` (Keras save_weights H5 layout as
 * written by transformers' TFPreTrainedModel.save_pretrained): the root carries a `layer_names`
 * attribute; each top-level layer group (e.g. "bert", "classifier") carries `weight_names`, the
 * full TF variable names, which start with the model name (dropped on mapping), e.g.
 * "tf_bert_for_sequence_classification/" followed by
 *   bert/embeddings/word_embeddings/weight:0
 *   bert/embeddings/position_embeddings/embeddings:0
 *   bert/encoder/layer_._0/attention/self/query/kernel:0     (Dense kernel, stored [in, out])
 *   bert/encoder/layer_._0/attention/output/LayerNorm/gamma:0
 *   bert/pooler/dense/bias:0, classifier/kernel:0
 * and each weight is the dataset <layer group>/<weight name>.
 * Names are mapped as transformers' modeling_tf_pytorch_utils does (strip ":0", "layer_._N" ->
 * "layer.N", kernel/gamma/embeddings -> weight, beta -> bias, "/" -> ".") and Dense kernels are
 * transposed to PyTorch's [out, in]. */
#ifndef BQ_TF_H5_H
#define BQ_TF_H5_H

#include <stdint.h>

typedef struct BqTfTensor {
    char *tf_name;   /* e.g. "bert/encoder/layer_._0/attention/self/query/kernel:0" */
    char *pt_name;   /* e.g. "bert.encoder.layer.0.attention.self.query.weight" */
    int ndim;
    int64_t shape[2];  /* PyTorch shape (after the kernel transpose) */
    float *data;       /* PyTorch layout */
} BqTfTensor;

typedef struct BqTfModel {
    BqTfTensor *t;
    int n;
} BqTfModel;

/* Reads every weight of PATH into memory (float32; ndim 1 or 2). Errors name the file and weight. The
 * file is read in a forked child process, so that a crash inside libhdf5 on a corrupt file is an
 * error here. */
int bq_tf_h5_read(BqTfModel *out, const char *path);
/* The same read in the calling process, unprotected: for the fuzz target, whose coverage feedback
 * must come from this process (tests/fuzz/fuzz_tf_h5.c). */
int bq_tf_h5_read_direct(BqTfModel *out, const char *path);
void bq_tf_h5_free(BqTfModel *m);
/* Maps one TF weight name to its PyTorch name (caller frees) and whether it is a transposed kernel. */
char *bq_tf_name_to_pt(const char *tf_name, int *transpose);

#endif
