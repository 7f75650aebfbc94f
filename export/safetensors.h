/* Reader and writer for the safetensors format (huggingface/safetensors, "format" section of its
 * README): 8-byte little-endian header length N, N bytes of UTF-8 JSON mapping tensor name ->
 * {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the byte after the header),
 * an optional "__metadata__" string map, then the raw little-endian tensor bytes.
 *
 * The reader validates everything before any tensor is touched: header length inside the file,
 * well-formed JSON, known dtype, numel * dtype size == end - begin, offsets inside the data region,
 * no two tensors overlapping. F32, F16 and BF16 are converted to float on read; other dtypes (I64,
 * I32, ...) are listed but only readable through bq_st_read_i64 (I64) or not at all. */
#ifndef BQ_SAFETENSORS_H
#define BQ_SAFETENSORS_H

#include <stdint.h>

#include <jansson.h>

typedef enum BqStDtype {
    BQ_ST_F32, BQ_ST_F16, BQ_ST_BF16, BQ_ST_F64, BQ_ST_I64, BQ_ST_I32, BQ_ST_I16, BQ_ST_I8,
    BQ_ST_U8, BQ_ST_BOOL, BQ_ST_F8_E4M3, BQ_ST_F8_E5M2, BQ_ST_U16, BQ_ST_U32, BQ_ST_U64,
} BqStDtype;

#define BQ_ST_MAX_DIMS 8

typedef struct BqStTensor {
    char *name;
    BqStDtype dtype;
    int ndim;
    int64_t shape[BQ_ST_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end;  /* byte offsets into the data region */
} BqStTensor;

typedef struct BqSt {
    char *path;
    int fd;
    const unsigned char *map;  /* whole file, mmap'ed read-only */
    uint64_t size;             /* file size */
    uint64_t data_off;         /* 8 + header length */
    BqStTensor *t;             /* sorted by name */
    int n;
} BqSt;

/* Opens and validates PATH. Errors (BQ_EIO / BQ_EFORMAT) name the file and, where relevant, the tensor. */
int bq_st_open(BqSt **out, const char *path);
void bq_st_close(BqSt *st);
/* The tensor named NAME, or NULL. Tensors are listed as st->t[0..st->n). */
const BqStTensor *bq_st_find(const BqSt *st, const char *name);
const char *bq_st_dtype_name(BqStDtype d);
/* Copies tensor NAME into dst as float. The file's shape must equal (ndim, shape) exactly, else
 * BQ_EFORMAT naming the tensor with the expected and found shapes; dtype must be F32/F16/BF16/F64. */
int bq_st_read_f32(const BqSt *st, const char *name, float *dst, int ndim, const int64_t *shape);
/* Same for an I64 tensor. */
int bq_st_read_i64(const BqSt *st, const char *name, int64_t *dst, int ndim, const int64_t *shape);

/* Writes n F32 tensors (names[i], data[i], ndims[i], shapes[i]) to PATH atomically (PATH.tmp then
 * bq_rename_durable). Tensors are laid out in name order, 8-byte aligned header as the reference
 * writer does. metadata (may be NULL) is a JSON object of string values stored as "__metadata__". */
int bq_st_write(const char *path, const char *const names[], const float *const data[],
                const int ndims[], const int64_t *const shapes[], int n, json_t *metadata);

#endif
