/* A small ONNX graph builder on the protobuf-c bindings of export/onnx.proto (ONNX IR spec,
 * onnx/onnx.proto field numbers): initializers stored as raw_data (little-endian), nodes with
 * attributes, graph inputs/outputs with symbolic dims, atomic save. Every string and array the
 * builder hands to protobuf-c is owned by the builder and freed by bq_onnx_graph_free. */
#ifndef BQ_ONNX_GRAPH_H
#define BQ_ONNX_GRAPH_H

#include <stdint.h>

#include "onnx.pb-c.h"

/* ONNX TensorProto.DataType values used here */
enum { BQ_ONNX_FLOAT = 1, BQ_ONNX_UINT8 = 2, BQ_ONNX_INT8 = 3, BQ_ONNX_INT32 = 6, BQ_ONNX_INT64 = 7 };

typedef struct BqOnnxGraph BqOnnxGraph;

BqOnnxGraph *bq_onnx_graph_new(const char *name);
void bq_onnx_graph_free(BqOnnxGraph *g);

/* Initializers (data copied into raw_data; ndim 0 = scalar). Each returns the tensor's name, owned by
 * the graph. */
const char *bq_onnx_init_float(BqOnnxGraph *g, const char *name, int ndim, const int64_t *dims, const float *data);
const char *bq_onnx_init_int8(BqOnnxGraph *g, const char *name, int ndim, const int64_t *dims, const int8_t *data);
const char *bq_onnx_init_uint8(BqOnnxGraph *g, const char *name, int ndim, const int64_t *dims, const uint8_t *data);
const char *bq_onnx_init_int64(BqOnnxGraph *g, const char *name, int ndim, const int64_t *dims, const int64_t *data);
/* Scalar / 1-D shortcuts. */
const char *bq_onnx_init_scalar_float(BqOnnxGraph *g, const char *name, float v);
const char *bq_onnx_init_scalar_int8(BqOnnxGraph *g, const char *name, int8_t v);
const char *bq_onnx_init_scalar_uint8(BqOnnxGraph *g, const char *name, uint8_t v);
const char *bq_onnx_init_vec_int64(BqOnnxGraph *g, const char *name, int n, const int64_t *v);

/* A node op_type (domain "" = ai.onnx) with nin inputs ("" = omitted optional input) and nout outputs.
 * Returns the node, whose attributes can then be added. */
Onnx__NodeProto *bq_onnx_node(BqOnnxGraph *g, const char *op_type, const char *name, int nin, const char *const *in,
                              int nout, const char *const *out);
void bq_onnx_attr_int(BqOnnxGraph *g, Onnx__NodeProto *n, const char *name, int64_t v);
void bq_onnx_attr_float(BqOnnxGraph *g, Onnx__NodeProto *n, const char *name, float v);
void bq_onnx_attr_ints(BqOnnxGraph *g, Onnx__NodeProto *n, const char *name, int cnt, const int64_t *v);

/* Graph inputs and outputs: dims[i] >= 0 is a fixed size, < 0 takes the symbolic name dim_params[i]. */
void bq_onnx_input(BqOnnxGraph *g, const char *name, int elem_type, int ndim, const int64_t *dims,
                   const char *const *dim_params);
void bq_onnx_output(BqOnnxGraph *g, const char *name, int elem_type, int ndim, const int64_t *dims,
                    const char *const *dim_params);
void bq_onnx_metadata(BqOnnxGraph *g, const char *key, const char *value);

/* Serialises a ModelProto (ir_version chosen for opset, default domain at opset, producer "bertqat")
 * to path.tmp and renames it over path (bq_rename_durable); on error nothing is left at path.tmp.
 * Errors: BQ_EIO naming the path. */
int bq_onnx_save(BqOnnxGraph *g, int opset, const char *path);

/* Number of nodes so far (for tests and reports). */
int bq_onnx_graph_node_count(const BqOnnxGraph *g);

/* The IR version written for an opset (7 for 13-14, 8 for 15-18, 9 for 19-20, 10 for 21). */
int bq_onnx_ir_version(int opset);

#endif
