/* ONNX graph builder over protobuf-c (export/onnx.proto, ONNX IR spec). All memory handed to the
 * protobuf-c structs comes from one pointer pool owned by the graph, freed at once. */
#include "export/onnx_graph.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autograd/bq.h"

struct BqOnnxGraph {
    Onnx__GraphProto gp;
    void **pool;
    size_t npool, cpool;
    size_t cnode, cinit, cin, cout;
    Onnx__StringStringEntryProto **meta;
    size_t nmeta, cmeta;
};

static void *own(BqOnnxGraph *g, void *p) {
    if (g->npool == g->cpool) {
        g->cpool = g->cpool ? g->cpool * 2 : 256;
        g->pool = realloc(g->pool, g->cpool * sizeof *g->pool);
        BQ_CHECK(g->pool);
    }
    g->pool[g->npool++] = p;
    return p;
}
static void *galloc(BqOnnxGraph *g, size_t n) { return own(g, bq_calloc(1, n ? n : 1)); }
static char *gstr(BqOnnxGraph *g, const char *s) {
    size_t n = strlen(s);
    char *d = galloc(g, n + 1);
    memcpy(d, s, n);
    return d;
}
/* grows *arr (an array of pointers owned by the graph, not the pool) to hold one more */
static void push(void ***arr, size_t *n, size_t *cap, void *item) {
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        *arr = realloc(*arr, *cap * sizeof **arr);
        BQ_CHECK(*arr);
    }
    (*arr)[(*n)++] = item;
}

BqOnnxGraph *bq_onnx_graph_new(const char *name) {
    BqOnnxGraph *g = bq_calloc(1, sizeof *g);
    Onnx__GraphProto init = ONNX__GRAPH_PROTO__INIT;
    g->gp = init;
    g->gp.name = gstr(g, name);
    return g;
}

void bq_onnx_graph_free(BqOnnxGraph *g) {
    if (!g) return;
    for (size_t i = 0; i < g->npool; i++) free(g->pool[i]);
    free(g->pool);
    free(g->gp.node);
    free(g->gp.initializer);
    free(g->gp.input);
    free(g->gp.output);
    free(g->meta);
    free(g);
}

static const char *add_init(BqOnnxGraph *g, const char *name, int type, int ndim, const int64_t *dims,
                            const void *data, size_t elsize) {
    Onnx__TensorProto *t = galloc(g, sizeof *t);
    Onnx__TensorProto init = ONNX__TENSOR_PROTO__INIT;
    *t = init;
    t->name = gstr(g, name);
    t->has_data_type = 1;
    t->data_type = type;
    t->n_dims = (size_t)ndim;
    t->dims = galloc(g, sizeof(int64_t) * (size_t)(ndim ? ndim : 1));
    size_t n = 1;
    for (int i = 0; i < ndim; i++) t->dims[i] = dims[i], n *= (size_t)dims[i];
    t->has_raw_data = 1;
    t->raw_data.len = n * elsize;
    t->raw_data.data = galloc(g, n * elsize);
    memcpy(t->raw_data.data, data, n * elsize); /* raw_data is little-endian; so is every supported host */
    push((void ***)&g->gp.initializer, &g->gp.n_initializer, &g->cinit, t);
    return t->name;
}

const char *bq_onnx_init_float(BqOnnxGraph *g, const char *name, int ndim, const int64_t *dims, const float *data) {
    return add_init(g, name, BQ_ONNX_FLOAT, ndim, dims, data, sizeof(float));
}
const char *bq_onnx_init_int8(BqOnnxGraph *g, const char *name, int ndim, const int64_t *dims, const int8_t *data) {
    return add_init(g, name, BQ_ONNX_INT8, ndim, dims, data, 1);
}
const char *bq_onnx_init_uint8(BqOnnxGraph *g, const char *name, int ndim, const int64_t *dims, const uint8_t *data) {
    return add_init(g, name, BQ_ONNX_UINT8, ndim, dims, data, 1);
}
const char *bq_onnx_init_int64(BqOnnxGraph *g, const char *name, int ndim, const int64_t *dims, const int64_t *data) {
    return add_init(g, name, BQ_ONNX_INT64, ndim, dims, data, sizeof(int64_t));
}
const char *bq_onnx_init_scalar_float(BqOnnxGraph *g, const char *name, float v) {
    return bq_onnx_init_float(g, name, 0, NULL, &v);
}
const char *bq_onnx_init_scalar_int8(BqOnnxGraph *g, const char *name, int8_t v) {
    return bq_onnx_init_int8(g, name, 0, NULL, &v);
}
const char *bq_onnx_init_scalar_uint8(BqOnnxGraph *g, const char *name, uint8_t v) {
    return bq_onnx_init_uint8(g, name, 0, NULL, &v);
}
const char *bq_onnx_init_vec_int64(BqOnnxGraph *g, const char *name, int n, const int64_t *v) {
    int64_t d = n;
    return bq_onnx_init_int64(g, name, 1, &d, v);
}

Onnx__NodeProto *bq_onnx_node(BqOnnxGraph *g, const char *op_type, const char *name, int nin, const char *const *in,
                              int nout, const char *const *out) {
    Onnx__NodeProto *n = galloc(g, sizeof *n);
    Onnx__NodeProto init = ONNX__NODE_PROTO__INIT;
    *n = init;
    n->op_type = gstr(g, op_type);
    n->name = gstr(g, name);
    n->n_input = (size_t)nin;
    n->input = galloc(g, sizeof(char *) * (size_t)(nin ? nin : 1));
    for (int i = 0; i < nin; i++) n->input[i] = gstr(g, in[i]);
    n->n_output = (size_t)nout;
    n->output = galloc(g, sizeof(char *) * (size_t)(nout ? nout : 1));
    for (int i = 0; i < nout; i++) n->output[i] = gstr(g, out[i]);
    push((void ***)&g->gp.node, &g->gp.n_node, &g->cnode, n);
    return n;
}

static Onnx__AttributeProto *add_attr(BqOnnxGraph *g, Onnx__NodeProto *n, const char *name) {
    Onnx__AttributeProto *a = galloc(g, sizeof *a);
    Onnx__AttributeProto init = ONNX__ATTRIBUTE_PROTO__INIT;
    *a = init;
    a->name = gstr(g, name);
    a->has_type = 1;
    Onnx__AttributeProto **arr = galloc(g, sizeof *arr * (n->n_attribute + 1));
    if (n->n_attribute) memcpy(arr, n->attribute, sizeof *arr * n->n_attribute);
    arr[n->n_attribute++] = a;
    n->attribute = arr; /* the old array stays in the pool until the graph is freed */
    return a;
}
void bq_onnx_attr_int(BqOnnxGraph *g, Onnx__NodeProto *n, const char *name, int64_t v) {
    Onnx__AttributeProto *a = add_attr(g, n, name);
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT;
    a->has_i = 1;
    a->i = v;
}
void bq_onnx_attr_float(BqOnnxGraph *g, Onnx__NodeProto *n, const char *name, float v) {
    Onnx__AttributeProto *a = add_attr(g, n, name);
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT;
    a->has_f = 1;
    a->f = v;
}
void bq_onnx_attr_ints(BqOnnxGraph *g, Onnx__NodeProto *n, const char *name, int cnt, const int64_t *v) {
    Onnx__AttributeProto *a = add_attr(g, n, name);
    a->type = ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS;
    a->n_ints = (size_t)cnt;
    a->ints = galloc(g, sizeof(int64_t) * (size_t)(cnt ? cnt : 1));
    memcpy(a->ints, v, sizeof(int64_t) * (size_t)cnt);
}

static Onnx__ValueInfoProto *value_info(BqOnnxGraph *g, const char *name, int elem_type, int ndim,
                                        const int64_t *dims, const char *const *dim_params) {
    Onnx__ValueInfoProto *v = galloc(g, sizeof *v);
    Onnx__ValueInfoProto vi = ONNX__VALUE_INFO_PROTO__INIT;
    *v = vi;
    v->name = gstr(g, name);
    Onnx__TypeProto *tp = galloc(g, sizeof *tp);
    Onnx__TypeProto tpi = ONNX__TYPE_PROTO__INIT;
    *tp = tpi;
    Onnx__TypeProto__Tensor *tt = galloc(g, sizeof *tt);
    Onnx__TypeProto__Tensor tti = ONNX__TYPE_PROTO__TENSOR__INIT;
    *tt = tti;
    tt->has_elem_type = 1;
    tt->elem_type = elem_type;
    Onnx__TensorShapeProto *sh = galloc(g, sizeof *sh);
    Onnx__TensorShapeProto shi = ONNX__TENSOR_SHAPE_PROTO__INIT;
    *sh = shi;
    sh->n_dim = (size_t)ndim;
    sh->dim = galloc(g, sizeof *sh->dim * (size_t)(ndim ? ndim : 1));
    for (int i = 0; i < ndim; i++) {
        Onnx__TensorShapeProto__Dimension *d = galloc(g, sizeof *d);
        Onnx__TensorShapeProto__Dimension di = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__INIT;
        *d = di;
        if (dims[i] >= 0) {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            d->dim_value = dims[i];
        } else {
            d->value_case = ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            d->dim_param = gstr(g, dim_params[i]);
        }
        sh->dim[i] = d;
    }
    tt->shape = sh;
    tp->value_case = ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    tp->tensor_type = tt;
    v->type = tp;
    return v;
}

void bq_onnx_input(BqOnnxGraph *g, const char *name, int elem_type, int ndim, const int64_t *dims,
                   const char *const *dim_params) {
    push((void ***)&g->gp.input, &g->gp.n_input, &g->cin, value_info(g, name, elem_type, ndim, dims, dim_params));
}
void bq_onnx_output(BqOnnxGraph *g, const char *name, int elem_type, int ndim, const int64_t *dims,
                    const char *const *dim_params) {
    push((void ***)&g->gp.output, &g->gp.n_output, &g->cout, value_info(g, name, elem_type, ndim, dims, dim_params));
}
void bq_onnx_metadata(BqOnnxGraph *g, const char *key, const char *value) {
    Onnx__StringStringEntryProto *e = galloc(g, sizeof *e);
    Onnx__StringStringEntryProto ei = ONNX__STRING_STRING_ENTRY_PROTO__INIT;
    *e = ei;
    e->key = gstr(g, key);
    e->value = gstr(g, value);
    push((void ***)&g->meta, &g->nmeta, &g->cmeta, e);
}

int bq_onnx_graph_node_count(const BqOnnxGraph *g) { return (int)g->gp.n_node; }

int bq_onnx_ir_version(int opset) {
    if (opset <= 14) return 7;
    if (opset <= 18) return 8;
    if (opset <= 20) return 9;
    return 10;
}

int bq_onnx_save(BqOnnxGraph *g, int opset, const char *path) {
    int st = BQ_OK;
    FILE *f = NULL;
    uint8_t *buf = NULL;
    size_t plen = strlen(path);
    char *tmp = bq_malloc(plen + 5);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);

    Onnx__OperatorSetIdProto ops = ONNX__OPERATOR_SET_ID_PROTO__INIT;
    ops.domain = "";
    ops.has_version = 1;
    ops.version = opset;
    Onnx__OperatorSetIdProto *opsp = &ops;
    Onnx__ModelProto mp = ONNX__MODEL_PROTO__INIT;
    mp.has_ir_version = 1;
    mp.ir_version = bq_onnx_ir_version(opset);
    mp.producer_name = "bertqat";
    mp.producer_version = "0.1";
    mp.has_model_version = 1;
    mp.model_version = 1;
    mp.graph = &g->gp;
    mp.n_opset_import = 1;
    mp.opset_import = &opsp;
    mp.n_metadata_props = g->nmeta;
    mp.metadata_props = g->meta;

    size_t n = onnx__model_proto__get_packed_size(&mp);
    buf = malloc(n ? n : 1);
    if (!buf) {
        st = bq_err(BQ_ENOMEM, "%s: cannot allocate %zu bytes for the serialized model", path, n);
        goto cleanup;
    }
    size_t w = onnx__model_proto__pack(&mp, buf);
    BQ_CHECK(w == n);
    f = fopen(tmp, "wb");
    if (!f) {
        st = bq_err(BQ_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        goto cleanup;
    }
    if (fwrite(buf, 1, n, f) != n || fflush(f) != 0) {
        st = bq_err(BQ_EIO, "%s: write failed: %s", tmp, strerror(errno));
        goto cleanup;
    }
    int rc = fclose(f);
    f = NULL;
    if (rc != 0) {
        st = bq_err(BQ_EIO, "%s: write failed: %s", tmp, strerror(errno));
        goto cleanup;
    }
    st = bq_rename_durable(tmp, path);

cleanup:
    if (f) fclose(f);
    if (st) unlink(tmp);
    free(tmp);
    free(buf);
    return st;
}
