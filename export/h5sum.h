/* Checksummed float32 tensors in HDF5 files, shared by the checkpoint writers: export/ckpt.c (/params
 * of model.h5, the training state) and export/quant_io.c (/quant ranges, /lsq state). Each tensor is one
 * chunked dataset with HDF5's Fletcher-32 filter, so a corrupted byte in its data makes the read fail
 * instead of loading different numbers. Files written before the filter (contiguous datasets without
 * checksum) still read. Layout documented in export/ckpt.h. Also the HDF5 set-up of a process and the
 * system error behind a failed HDF5 write, for the writers' messages, and their one attribute
 * writer. */
#ifndef BQ_H5SUM_H
#define BQ_H5SUM_H

#include <hdf5.h>

/* Dataset creation property list for a float32 tensor of shape dims[0..ndim): one chunk covering the
 * whole tensor, halved along its leading dimensions while a chunk would reach HDF5's 4 GiB chunk
 * limit, with the Fletcher-32 filter. A tensor with a zero dimension gets the default (contiguous,
 * nothing to check). The caller closes the list with H5Pclose. */
hid_t bq_h5sum_dcpl(int ndim, const hsize_t *dims);

/* Creates the dataset `name` (relative to loc; lcpl may be H5P_DEFAULT) of shape dims[0..ndim) with
 * bq_h5sum_dcpl and writes data into it, closing it before it returns: the chunk reaches the file at
 * the latest when the dataset closes, so a full disk may only show there. Error (BQ_EIO):
 * "<file>: cannot write dataset <shown>: <reason>" (shown: the dataset's path as messages show it;
 * reason: bq_h5_io_reason). */
int bq_h5sum_write_f32(hid_t loc, const char *file, const char *name, const char *shown, hid_t lcpl, int ndim,
                       const hsize_t *dims, const float *data);

/* Writes the attribute `name` of loc, closing it before it returns: rank 1, n values of mem_type
 * stored as file_type; rank 0, one value in a scalar dataspace (n unused). The one attribute writer of
 * the checkpoint files (export/ckpt.c, export/quant_io.c, src/train_state.c). Error (BQ_EIO):
 * "<file>: cannot write attribute <name><of><reason>" (of: "" or where the attribute sits, e.g.
 * " of /quant/<quantizer>"; reason: bq_h5_io_reason). */
int bq_h5_attr_write(hid_t loc, const char *file, const char *name, const char *of, hid_t file_type,
                     hid_t mem_type, const void *v, int rank, hsize_t n);

/* HDF5 set-up of a process, called before any other HDF5 call: no clean-up at exit (H5dont_atexit).
 * A file whose close failed (a full disk) stays half-closed inside HDF5 1.10, and its exit-time
 * clean-up crashes on it; every file the program writes is closed explicitly, so the clean-up has
 * nothing left to save. */
void bq_h5_init(void);

/* The system error behind the HDF5 call that just failed, ": File too large" or ": No space left on
 * device" (with the separator, for appending to a message), from the errno that HDF5's file driver
 * records on the error stack; "" when the stack records none. Call it right after the failing call:
 * the next HDF5 call clears the stack. */
const char *bq_h5_io_reason(void);

/* Reads the whole float32 dataset ds into dst (its shape already checked by the caller). `file` and
 * `tensor` name it in messages. Errors (BQ_EFORMAT): a stored type other than little-endian IEEE
 * float32, "<file>: tensor <tensor>: checksum mismatch (file corrupt)" when the Fletcher-32 check
 * (or any other read of a checksummed dataset) fails, "<file>: tensor <tensor>: stored in a way
 * bertqat does not write (file corrupt?)" for a layout, filter or chunk index that HDF5 would read
 * unchecked (a compact or virtual layout, a filter but Fletcher-32, a chunk not in the file or not a
 * chunk's size), and a plain read error otherwise; BQ_EIO
 * "<file>: tensor <tensor>: cannot read: <reason>" where a tensor read from the file itself
 * (bq_h5sum_direct_reads) comes up short. */
int bq_h5sum_read_f32(hid_t ds, const char *file, const char *tensor, float *dst);

/* How many tensors bq_h5sum_read_f32 has read from the file itself rather than through H5Dread (those
 * stored as one checksummed chunk or contiguous, in a file opened read-only with HDF5's default driver):
 * H5Dread would first read a chunk beyond its cache into a buffer of its own, as large as the tensor. */
int64_t bq_h5sum_direct_reads(void);

/* A float32 matrix (rows, cols) of an HDF5 file read row by row from the file itself (pread), for a
 * table too large to hold of which a run reads a few rows: the word embeddings of an inference
 * engine's model (layers/bert.h, bq_bert_word_rows_attach). */
typedef struct BqH5Rows BqH5Rows;

/* Opens dataset ds of the HDF5 file at path, shape (rows, cols) already checked by the caller, for row
 * reads. Applies to a tensor stored as bq_h5sum_dcpl writes it (one chunk, Fletcher-32 its only filter)
 * or contiguous (files written before the filter); anything else (several chunks, other filters, no
 * storage yet) gives *out NULL and BQ_OK: the caller reads the tensor whole. The checksum is verified
 * here as HDF5 verifies it (the Fletcher-32 of the chunk's bytes against the 4 bytes after them), over
 * the file through a buffer of about 1 MiB, so the tensor is never resident. Errors: as
 * bq_h5sum_read_f32's, and BQ_EIO "<path>: tensor <tensor>: cannot read: <reason>". */
int bq_h5rows_open(BqH5Rows **out, hid_t ds, const char *path, const char *tensor, int64_t rows, int64_t cols);

/* Row r (0 <= r < rows) into dst (cols floats). BQ_EIO "<path>: tensor <tensor>: cannot read row <r>
 * (the file changed since it was opened?)" when the read comes up short. Safe from several threads. The
 * void pointer is the BqH5Rows, so the function serves as a BqRowFetch (layers/word_rows.h). */
int bq_h5rows_read(void *rows, int64_t r, float *dst);

/* Closes the file; NULL is a no-op. */
void bq_h5rows_close(void *rows);

#endif
