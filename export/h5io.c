/* HDF5 wrapper for checkpoints (HDF5 1.10+ C API: H5F/H5G/H5D/H5A/H5S/H5T, H5Lexists, H5Literate).
 * All HDF5 error-stack printing is disabled; failures become one-line bq_err messages naming the
 * file and the dataset or attribute. */
#include "export/h5io.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"

struct BqH5 {
    hid_t fid;
    char *path;
    int writable;
};

static void quiet(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

const char *bq_h5_path(const BqH5 *f) { return f->path; }
int64_t bq_h5_hid(const BqH5 *f) { return (int64_t)f->fid; }

int bq_h5_create(BqH5 **out, const char *path) {
    quiet();
    *out = NULL;
    hid_t fid = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (fid < 0) return bq_err(BQ_EIO, "%s: cannot create HDF5 file", path);
    BqH5 *f = bq_calloc(1, sizeof *f);
    f->fid = fid, f->path = bq_strdup(path), f->writable = 1;
    *out = f;
    return BQ_OK;
}

int bq_h5_open(BqH5 **out, const char *path) {
    quiet();
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return bq_err(BQ_EIO, "%s: cannot open", path);
    fclose(fp);
    if (H5Fis_hdf5(path) <= 0) return bq_err(BQ_EFORMAT, "%s: not an HDF5 file (corrupt or truncated?)", path);
    hid_t fid = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (fid < 0) return bq_err(BQ_EFORMAT, "%s: cannot open as HDF5 (corrupt or truncated?)", path);
    BqH5 *f = bq_calloc(1, sizeof *f);
    f->fid = fid, f->path = bq_strdup(path);
    *out = f;
    return BQ_OK;
}

int bq_h5_close(BqH5 *f) {
    if (!f) return BQ_OK;
    int rc = BQ_OK;
    if (f->writable && H5Fflush(f->fid, H5F_SCOPE_GLOBAL) < 0) rc = bq_err(BQ_EIO, "%s: flush failed", f->path);
    if (H5Fclose(f->fid) < 0 && !rc) rc = bq_err(BQ_EIO, "%s: close failed", f->path);
    free(f->path);
    free(f);
    return rc;
}

/* 1 when every component of the absolute or relative path NAME exists (H5Lexists needs parents). */
int bq_h5_exists(BqH5 *f, const char *name) {
    if (strcmp(name, "/") == 0) return 1;
    char buf[1024];
    if (snprintf(buf, sizeof buf, "%s", name) >= (int)sizeof buf) return 0;
    for (char *p = buf + 1; ; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (H5Lexists(f->fid, buf, H5P_DEFAULT) <= 0) return 0;
            if (c == '\0') return 1;
            *p = c;
        }
    }
}

/* Creates missing intermediate groups (link creation property). */
static hid_t lcpl_parents(void) {
    hid_t l = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(l, 1);
    return l;
}

static void shape_str(char *b, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(b, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(b + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(b + k, n - k, "]");
}

static int write_ds(BqH5 *f, const char *name, hid_t mtype, hid_t ftype, const void *data, int ndim,
                    const int64_t *shape) {
    if (ndim < 0 || ndim > BQ_H5_MAX_DIMS) return bq_err(BQ_EINVAL, "%s: %s: rank %d not supported", f->path, name, ndim);
    hsize_t dims[BQ_H5_MAX_DIMS];
    for (int i = 0; i < ndim; i++) dims[i] = (hsize_t)shape[i];
    int rc = BQ_OK;
    hid_t sp = ndim ? H5Screate_simple(ndim, dims, NULL) : H5Screate(H5S_SCALAR);
    hid_t l = lcpl_parents();
    if (bq_h5_exists(f, name)) H5Ldelete(f->fid, name, H5P_DEFAULT);
    hid_t ds = H5Dcreate2(f->fid, name, ftype, sp, l, H5P_DEFAULT, H5P_DEFAULT);
    if (ds < 0) rc = bq_err(BQ_EIO, "%s: cannot create dataset %s", f->path, name);
    else if (H5Dwrite(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
        rc = bq_err(BQ_EIO, "%s: cannot write dataset %s", f->path, name);
    if (ds >= 0) H5Dclose(ds);
    H5Pclose(l);
    H5Sclose(sp);
    return rc;
}

int bq_h5_shape(BqH5 *f, const char *name, int *ndim, int64_t shape[BQ_H5_MAX_DIMS]) {
    if (!bq_h5_exists(f, name)) return bq_err(BQ_EFORMAT, "%s: no dataset %s", f->path, name);
    hid_t ds = H5Dopen2(f->fid, name, H5P_DEFAULT);
    if (ds < 0) return bq_err(BQ_EFORMAT, "%s: %s is not a dataset", f->path, name);
    hid_t sp = H5Dget_space(ds);
    int nd = H5Sget_simple_extent_ndims(sp);
    int rc = BQ_OK;
    if (nd < 0 || nd > BQ_H5_MAX_DIMS) {
        rc = bq_err(BQ_EFORMAT, "%s: dataset %s has rank %d (at most %d supported)", f->path, name, nd, BQ_H5_MAX_DIMS);
    } else {
        hsize_t dims[BQ_H5_MAX_DIMS];
        H5Sget_simple_extent_dims(sp, dims, NULL);
        *ndim = nd;
        for (int i = 0; i < nd; i++) shape[i] = (int64_t)dims[i];
    }
    H5Sclose(sp);
    H5Dclose(ds);
    return rc;
}

static int read_ds(BqH5 *f, const char *name, hid_t mtype, H5T_class_t want_class, void *dst, int ndim,
                   const int64_t *shape) {
    int fnd;
    int64_t fsh[BQ_H5_MAX_DIMS];
    int rc = bq_h5_shape(f, name, &fnd, fsh);
    if (rc) return rc;
    int ok = fnd == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = fsh[i] == shape[i];
    if (!ok) {
        char a[128], b[128];
        shape_str(a, sizeof a, ndim, shape);
        shape_str(b, sizeof b, fnd, fsh);
        return bq_err(BQ_EFORMAT, "%s: dataset %s: expected shape %s, found %s", f->path, name, a, b);
    }
    hid_t ds = H5Dopen2(f->fid, name, H5P_DEFAULT);
    hid_t ty = H5Dget_type(ds);
    if (H5Tget_class(ty) != want_class)
        rc = bq_err(BQ_EFORMAT, "%s: dataset %s has type class %d, expected %s", f->path, name, (int)H5Tget_class(ty),
                    want_class == H5T_FLOAT ? "float" : "integer");
    else if (H5Dread(ds, mtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
        rc = bq_err(BQ_EFORMAT, "%s: cannot read dataset %s (corrupt?)", f->path, name);
    H5Tclose(ty);
    H5Dclose(ds);
    return rc;
}

int bq_h5_write_f32(BqH5 *f, const char *name, const float *data, int ndim, const int64_t *shape) {
    return write_ds(f, name, H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, data, ndim, shape);
}
int bq_h5_read_f32(BqH5 *f, const char *name, float *dst, int ndim, const int64_t *shape) {
    return read_ds(f, name, H5T_NATIVE_FLOAT, H5T_FLOAT, dst, ndim, shape);
}
int bq_h5_write_i64(BqH5 *f, const char *name, const int64_t *data, int ndim, const int64_t *shape) {
    return write_ds(f, name, H5T_NATIVE_INT64, H5T_STD_I64LE, data, ndim, shape);
}
int bq_h5_read_i64(BqH5 *f, const char *name, int64_t *dst, int ndim, const int64_t *shape) {
    return read_ds(f, name, H5T_NATIVE_INT64, H5T_INTEGER, dst, ndim, shape);
}

typedef struct ListCtx {
    char **v;
    int n, cap;
} ListCtx;

static herr_t list_cb(hid_t g, const char *name, const H5L_info_t *info, void *op) {
    (void)g, (void)info;
    ListCtx *c = op;
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 16;
        c->v = bq_realloc(c->v, sizeof(char *) * (size_t)c->cap);
    }
    c->v[c->n++] = bq_strdup(name);
    return 0;
}

int bq_h5_list(BqH5 *f, const char *group, char ***names, int *n) {
    *names = NULL, *n = 0;
    if (!bq_h5_exists(f, group)) return bq_err(BQ_EFORMAT, "%s: no group %s", f->path, group);
    hid_t g = H5Gopen2(f->fid, group, H5P_DEFAULT);
    if (g < 0) return bq_err(BQ_EFORMAT, "%s: %s is not a group", f->path, group);
    ListCtx c = {0};
    hsize_t idx = 0;
    herr_t e = H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, list_cb, &c);
    H5Gclose(g);
    if (e < 0) {
        for (int i = 0; i < c.n; i++) free(c.v[i]);
        free(c.v);
        return bq_err(BQ_EFORMAT, "%s: cannot list group %s", f->path, group);
    }
    *names = c.v, *n = c.n;
    return BQ_OK;
}

/* Opens OBJ (group or dataset) for attribute access. */
static hid_t obj_open(BqH5 *f, const char *obj) {
    if (!bq_h5_exists(f, obj)) return -1;
    return H5Oopen(f->fid, obj, H5P_DEFAULT);
}

static int attr_set(BqH5 *f, const char *obj, const char *attr, hid_t ftype, hid_t mtype, const void *v) {
    hid_t o = obj_open(f, obj);
    if (o < 0) return bq_err(BQ_EFORMAT, "%s: no object %s for attribute %s", f->path, obj, attr);
    if (H5Aexists(o, attr) > 0) H5Adelete(o, attr);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(o, attr, ftype, sp, H5P_DEFAULT, H5P_DEFAULT);
    int rc = BQ_OK;
    if (a < 0 || H5Awrite(a, mtype, v) < 0) rc = bq_err(BQ_EIO, "%s: cannot write attribute %s of %s", f->path, attr, obj);
    if (a >= 0) H5Aclose(a);
    H5Sclose(sp);
    H5Oclose(o);
    return rc;
}

int bq_h5_set_attr_i64(BqH5 *f, const char *obj, const char *attr, int64_t value) {
    return attr_set(f, obj, attr, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}
int bq_h5_set_attr_f64(BqH5 *f, const char *obj, const char *attr, double value) {
    return attr_set(f, obj, attr, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}
int bq_h5_set_attr_str(BqH5 *f, const char *obj, const char *attr, const char *value) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);
    H5Tset_cset(t, H5T_CSET_UTF8);
    int rc = attr_set(f, obj, attr, t, t, &value);
    H5Tclose(t);
    return rc;
}

static int attr_open(BqH5 *f, const char *obj, const char *attr, hid_t *o, hid_t *a) {
    *o = obj_open(f, obj);
    if (*o < 0) return bq_err(BQ_EFORMAT, "%s: no object %s (reading attribute %s)", f->path, obj, attr);
    if (H5Aexists(*o, attr) <= 0) {
        H5Oclose(*o);
        return bq_err(BQ_EFORMAT, "%s: %s has no attribute %s", f->path, obj, attr);
    }
    *a = H5Aopen(*o, attr, H5P_DEFAULT);
    hid_t sp = H5Aget_space(*a);
    hssize_t np = H5Sget_simple_extent_npoints(sp);
    H5Sclose(sp);
    if (np != 1) {
        H5Aclose(*a), H5Oclose(*o);
        return bq_err(BQ_EFORMAT, "%s: attribute %s of %s is not a scalar", f->path, attr, obj);
    }
    return BQ_OK;
}

static int attr_num(BqH5 *f, const char *obj, const char *attr, H5T_class_t cls, hid_t mtype, void *out) {
    hid_t o, a;
    int rc = attr_open(f, obj, attr, &o, &a);
    if (rc) return rc;
    hid_t t = H5Aget_type(a);
    H5T_class_t c = H5Tget_class(t);
    if (c != cls && !(cls == H5T_FLOAT && c == H5T_INTEGER))
        rc = bq_err(BQ_EFORMAT, "%s: attribute %s of %s has the wrong type", f->path, attr, obj);
    else if (H5Aread(a, mtype, out) < 0)
        rc = bq_err(BQ_EFORMAT, "%s: cannot read attribute %s of %s", f->path, attr, obj);
    H5Tclose(t), H5Aclose(a), H5Oclose(o);
    return rc;
}

int bq_h5_get_attr_i64(BqH5 *f, const char *obj, const char *attr, int64_t *out) {
    return attr_num(f, obj, attr, H5T_INTEGER, H5T_NATIVE_INT64, out);
}
int bq_h5_get_attr_f64(BqH5 *f, const char *obj, const char *attr, double *out) {
    return attr_num(f, obj, attr, H5T_FLOAT, H5T_NATIVE_DOUBLE, out);
}

int bq_h5_get_attr_str(BqH5 *f, const char *obj, const char *attr, char **out) {
    *out = NULL;
    hid_t o, a;
    int rc = attr_open(f, obj, attr, &o, &a);
    if (rc) return rc;
    hid_t t = H5Aget_type(a);
    if (H5Tget_class(t) != H5T_STRING) {
        rc = bq_err(BQ_EFORMAT, "%s: attribute %s of %s is not a string", f->path, attr, obj);
    } else if (H5Tis_variable_str(t) > 0) {
        hid_t m = H5Tcopy(H5T_C_S1);
        H5Tset_size(m, H5T_VARIABLE);
        H5Tset_cset(m, H5Tget_cset(t));
        char *s = NULL;
        if (H5Aread(a, m, &s) < 0 || !s) rc = bq_err(BQ_EFORMAT, "%s: cannot read attribute %s of %s", f->path, attr, obj);
        else *out = bq_strdup(s);
        if (s) H5free_memory(s);
        H5Tclose(m);
    } else {
        size_t n = H5Tget_size(t);
        char *s = bq_calloc(n + 1, 1);
        hid_t m = H5Tcopy(H5T_C_S1);
        H5Tset_size(m, n + 1);
        H5Tset_strpad(m, H5T_STR_NULLTERM);
        if (H5Aread(a, m, s) < 0) {
            free(s);
            rc = bq_err(BQ_EFORMAT, "%s: cannot read attribute %s of %s", f->path, attr, obj);
        } else {
            *out = s;
        }
        H5Tclose(m);
    }
    H5Tclose(t), H5Aclose(a), H5Oclose(o);
    return rc;
}
