/* Checksummed float32 tensors in HDF5 (contract in export/h5sum.h). HDF5 C API: H5Pset_chunk,
 * H5Pset_fletcher32 (the checksum is verified by every H5Dread while error detection is on, HDF5's
 * default), H5Pget_filter2. */
#include "export/h5sum.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"

/* HDF5 stores a chunk's size in 32 bits: a chunk must stay below 4 GiB. */
#define CHUNK_MAX_BYTES 0xffffffffull

hid_t bq_h5sum_dcpl(int ndim, const hsize_t *dims) {
    BQ_CHECK(ndim >= 1 && ndim <= H5S_MAX_RANK);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    BQ_CHECK(dcpl >= 0);
    hsize_t chunk[H5S_MAX_RANK];
    unsigned long long bytes = sizeof(float);
    for (int i = 0; i < ndim; i++) {
        if (dims[i] == 0) return dcpl;
        chunk[i] = dims[i];
        bytes *= dims[i];
    }
    for (int i = 0; bytes > CHUNK_MAX_BYTES; ) {
        if (chunk[i] == 1) {
            i++;
            continue;
        }
        bytes = bytes / chunk[i] * ((chunk[i] + 1) / 2);
        chunk[i] = (chunk[i] + 1) / 2;
    }
    BQ_CHECK(H5Pset_chunk(dcpl, ndim, chunk) >= 0 && H5Pset_fletcher32(dcpl) >= 0);
    return dcpl;
}

/* 1 when ds was written with the Fletcher-32 filter. Walks the filter list (H5Pget_filter_by_id2
 * would push an HDF5 error for an absent filter). */
static int has_checksum(hid_t ds) {
    hid_t dcpl = H5Dget_create_plist(ds);
    if (dcpl < 0) return 0;
    int n = H5Pget_nfilters(dcpl), found = 0;
    for (int i = 0; i < n && !found; i++) {
        unsigned flags = 0, cd[4];
        size_t ncd = 4;
        found = H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cd, 0, NULL, NULL) == H5Z_FILTER_FLETCHER32;
    }
    H5Pclose(dcpl);
    return found;
}

int bq_h5sum_read_f32(hid_t ds, const char *file, const char *tensor, float *dst) {
    hid_t type = H5Dget_type(ds);
    int st = BQ_OK;
    if (type < 0 || H5Tequal(type, H5T_IEEE_F32LE) <= 0)
        st = bq_err(BQ_EFORMAT, "%s: tensor %s: stored type is not little-endian float32 (file corrupt?)", file,
                    tensor);
    else if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0)
        st = has_checksum(ds) ? bq_err(BQ_EFORMAT, "%s: tensor %s: checksum mismatch (file corrupt)", file, tensor)
                              : bq_err(BQ_EFORMAT, "%s: tensor %s: cannot read (file corrupt?)", file, tensor);
    if (type >= 0) H5Tclose(type);
    return st;
}

int bq_h5sum_write_f32(hid_t loc, const char *file, const char *name, const char *shown, hid_t lcpl, int ndim,
                       const hsize_t *dims, const float *data) {
    hid_t sp = H5Screate_simple(ndim, dims, NULL);
    hid_t dcpl = bq_h5sum_dcpl(ndim, dims);
    hid_t ds = H5Dcreate2(loc, name, H5T_IEEE_F32LE, sp, lcpl, dcpl, H5P_DEFAULT);
    int st = BQ_OK;
    if (ds < 0 || H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
        st = bq_err(BQ_EIO, "%s: cannot write dataset %s%s", file, shown, bq_h5_io_reason());
    if (ds >= 0 && H5Dclose(ds) < 0 && !st)
        st = bq_err(BQ_EIO, "%s: cannot write dataset %s%s", file, shown, bq_h5_io_reason());
    H5Pclose(dcpl);
    H5Sclose(sp);
    return st;
}

int bq_h5_attr_write(hid_t loc, const char *file, const char *name, const char *of, hid_t file_type,
                     hid_t mem_type, const void *v, int rank, hsize_t n) {
    hid_t sp = rank ? H5Screate_simple(1, &n, NULL) : H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(loc, name, file_type, sp, H5P_DEFAULT, H5P_DEFAULT);
    int st = BQ_OK;
    if (a < 0 || H5Awrite(a, mem_type, v) < 0)
        st = bq_err(BQ_EIO, "%s: cannot write attribute %s%s%s", file, name, of, bq_h5_io_reason());
    if (a >= 0 && H5Aclose(a) < 0 && !st)
        st = bq_err(BQ_EIO, "%s: cannot write attribute %s%s%s", file, name, of, bq_h5_io_reason());
    H5Sclose(sp);
    return st;
}

void bq_h5_init(void) { H5dont_atexit(); }

/* H5Ewalk2 callback: the first "errno = N" in a message of the stack (the sec2 and core drivers write
 * their failed read, write and truncate calls so). */
static herr_t find_errno(unsigned n, const H5E_error2_t *e, void *found) {
    (void)n;
    const char *s = e->desc ? strstr(e->desc, "errno = ") : NULL;
    if (s && !*(int *)found) *(int *)found = atoi(s + 8);
    return 0;
}

const char *bq_h5_io_reason(void) {
    static _Thread_local char buf[160];
    int err = 0;
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, find_errno, &err);
    if (err <= 0) return "";
    snprintf(buf, sizeof buf, ": %s", strerror(err));
    return buf;
}
