/* Checksummed float32 tensors in HDF5 files, shared by the two checkpoint writers: export/ckpt.c
 * (/params of model.h5, the training state) and layers/quant.c (/quant ranges). Each tensor is one
 * chunked dataset with HDF5's Fletcher-32 filter, so a corrupted byte in its data makes the read fail
 * instead of loading different numbers. Files written before the filter (contiguous datasets without
 * checksum) still read. Layout documented in export/ckpt.h. */
#ifndef BQ_H5SUM_H
#define BQ_H5SUM_H

#include <hdf5.h>

/* Dataset creation property list for a float32 tensor of shape dims[0..ndim): one chunk covering the
 * whole tensor, halved along its leading dimensions while a chunk would reach HDF5's 4 GiB chunk
 * limit, with the Fletcher-32 filter. A tensor with a zero dimension gets the default (contiguous,
 * nothing to check). The caller closes the list with H5Pclose. */
hid_t bq_h5sum_dcpl(int ndim, const hsize_t *dims);

/* Reads the whole float32 dataset ds into dst (its shape already checked by the caller). `file` and
 * `tensor` name it in messages. Errors (BQ_EFORMAT): a stored type other than little-endian IEEE
 * float32, "<file>: tensor <tensor>: checksum mismatch (file corrupt)" when the Fletcher-32 check
 * (or any other read of a checksummed dataset) fails, and a plain read error otherwise. */
int bq_h5sum_read_f32(hid_t ds, const char *file, const char *tensor, float *dst);

#endif
