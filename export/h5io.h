/* Small HDF5 wrapper (HDF5 1.10+ C API) for checkpoints: float32 / int64 datasets addressed by a
 * path such as "/params/bert.embeddings.word_embeddings.weight" (intermediate groups are created on
 * write), string / int64 / double attributes, listing of a group's children.
 *
 * HDF5's own error stack printing is switched off (H5Eset_auto2) the first time a file is opened or
 * created; every error returned here is a one-line bq_err message naming the file and dataset.
 * Status: BQ_EIO for files that cannot be opened/written, BQ_EFORMAT for missing datasets, wrong
 * types and shape mismatches. */
#ifndef BQ_H5IO_H
#define BQ_H5IO_H

#include <stdint.h>

#define BQ_H5_MAX_DIMS 4

typedef struct BqH5 BqH5;

int bq_h5_create(BqH5 **out, const char *path);  /* create or truncate for writing */
int bq_h5_open(BqH5 **out, const char *path);    /* read-only; missing -> BQ_EIO, not HDF5 -> BQ_EFORMAT */
int bq_h5_close(BqH5 *f);                        /* flushes; returns the status of the close */
const char *bq_h5_path(const BqH5 *f);
/* The underlying hid_t (as int64_t so this header needs no hdf5.h), for modules with own layouts. */
int64_t bq_h5_hid(const BqH5 *f);

/* ndim in 0..BQ_H5_MAX_DIMS (0: scalar). Reads require the stored shape to equal (ndim, shape)
 * exactly, else BQ_EFORMAT naming the dataset, expected and found shapes. */
int bq_h5_write_f32(BqH5 *f, const char *name, const float *data, int ndim, const int64_t *shape);
int bq_h5_read_f32(BqH5 *f, const char *name, float *dst, int ndim, const int64_t *shape);
int bq_h5_write_i64(BqH5 *f, const char *name, const int64_t *data, int ndim, const int64_t *shape);
int bq_h5_read_i64(BqH5 *f, const char *name, int64_t *dst, int ndim, const int64_t *shape);

int bq_h5_shape(BqH5 *f, const char *name, int *ndim, int64_t shape[BQ_H5_MAX_DIMS]);
int bq_h5_exists(BqH5 *f, const char *name);     /* 1 if NAME (group or dataset) exists, else 0 */
/* Names of GROUP's direct children, sorted; caller frees each name and the array (free()). */
int bq_h5_list(BqH5 *f, const char *group, char ***names, int *n);

/* Attributes on object OBJ ("/" for the root, a group or a dataset); set replaces. */
int bq_h5_set_attr_str(BqH5 *f, const char *obj, const char *attr, const char *value);
int bq_h5_set_attr_i64(BqH5 *f, const char *obj, const char *attr, int64_t value);
int bq_h5_set_attr_f64(BqH5 *f, const char *obj, const char *attr, double value);
int bq_h5_get_attr_str(BqH5 *f, const char *obj, const char *attr, char **out); /* caller free() */
int bq_h5_get_attr_i64(BqH5 *f, const char *obj, const char *attr, int64_t *out);
int bq_h5_get_attr_f64(BqH5 *f, const char *obj, const char *attr, double *out);

#endif
