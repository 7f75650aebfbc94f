/* Checksummed float32 tensors in HDF5 (contract in export/h5sum.h). HDF5 C API: H5Pset_chunk,
 * H5Pset_fletcher32 (the checksum is verified by every H5Dread while error detection is on, HDF5's
 * default), H5Pget_filter2. */
#include "export/h5sum.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

static int read_direct(hid_t ds, const char *file, const char *tensor, float *dst, int *done);
static _Atomic int64_t direct_reads;

/* 1 when Fletcher-32 is the only filter of the dataset creation property list dcpl. */
static int fletcher_only(hid_t dcpl) {
    unsigned flags = 0, cd[4];
    size_t ncd = 4;
    return H5Pget_nfilters(dcpl) == 1 &&
           H5Pget_filter2(dcpl, 0, &flags, &ncd, cd, 0, NULL, NULL) == H5Z_FILTER_FLETCHER32;
}

/* 1 when ds has Fletcher-32 as its only filter: the one checksum bertqat writes, and the only filter list
 * check_stored lets H5Dread see. */
static int has_checksum(hid_t ds) {
    hid_t dcpl = H5Dget_create_plist(ds);
    const int sum = dcpl >= 0 && fletcher_only(dcpl);
    if (dcpl >= 0) H5Pclose(dcpl);
    return sum;
}

/* 1 when [addr, addr + size) lies inside a file of fsize bytes. */
static int in_file(haddr_t addr, hsize_t size, hsize_t fsize) {
    return addr != HADDR_UNDEF && addr <= fsize && size <= fsize - addr;
}

/* 1 when every chunk of a chunked ds (nd dimensions of dims, chunks of chunk, Fletcher-32 its only filter
 * when sum is set, none otherwise) is where H5Dread would look: found in the chunk index, unmasked,
 * inside its file of fsize bytes and exactly as long as a chunk's floats (and their checksum). At most
 * 65,536 chunks are looked at (a bertqat tensor has one per 4 GiB). */
static int chunks_in_file(hid_t ds, int nd, const hsize_t *dims, const hsize_t *chunk, int sum, hsize_t fsize) {
    hsize_t coord[H5S_MAX_RANK] = {0};
    double count = 1, bytes = sizeof(float);
    for (int k = 0; k < nd; k++) {
        if (chunk[k] == 0) return 0;
        count *= (double)((dims[k] + chunk[k] - 1) / chunk[k]);
        bytes *= (double)chunk[k];
    }
    if (count > 65536 || bytes > 4294967295.0) return 0;
    for (;;) {
        unsigned mask = 0;
        haddr_t addr = HADDR_UNDEF;
        hsize_t size = 0;
        if (H5Dget_chunk_info_by_coord(ds, coord, &mask, &addr, &size) < 0 || mask != 0 ||
            (double)size != bytes + (sum ? 4 : 0) || !in_file(addr, size, fsize))
            return 0;
        int k = nd - 1;
        for (; k >= 0; k--) {
            coord[k] += chunk[k];
            if (coord[k] < dims[k]) break;
            coord[k] = 0;
        }
        if (k < 0) return 1;
    }
}

/* BQ_OK when H5Dread may read ds, whose type is float32: it is stored as bertqat writes its tensors, a
 * contiguous block or chunks with Fletcher-32 or no filter, and every byte H5Dread would take is where the
 * dataset says (chunks_in_file). libhdf5 1.10's H5Dread trusts a corrupt chunk index or chunk shape and
 * can crash on it; a compact or virtual layout (values in the object header, or in other files) is
 * refused outright. */
static int check_stored(hid_t ds, const char *file, const char *tensor) {
    hid_t dcpl = H5Dget_create_plist(ds), sp = H5Dget_space(ds), fid = H5Iget_file_id(ds);
    hsize_t dims[H5S_MAX_RANK], chunk[H5S_MAX_RANK], fsize = 0;
    const H5D_layout_t layout = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
    const int nd = sp >= 0 ? H5Sget_simple_extent_dims(sp, dims, NULL) : -1;
    const hssize_t np = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    const int nf = dcpl >= 0 ? H5Pget_nfilters(dcpl) : -1, sum = dcpl >= 0 && fletcher_only(dcpl);
    const hsize_t bytes = np > 0 ? (hsize_t)np * sizeof(float) : 0;
    int ok = (layout == H5D_CONTIGUOUS || layout == H5D_CHUNKED) && nd >= 0 && np >= 0 && (nf == 0 || sum) &&
             fid >= 0 && H5Fget_filesize(fid, &fsize) >= 0;
    if (ok && np > 0 && layout == H5D_CONTIGUOUS)
        ok = H5Dget_storage_size(ds) == bytes && in_file(H5Dget_offset(ds), bytes, fsize);
    else if (ok && np > 0)
        ok = nd >= 1 && H5Pget_chunk(dcpl, nd, chunk) == nd && chunks_in_file(ds, nd, dims, chunk, sum, fsize);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    if (fid >= 0) H5Fclose(fid);
    return ok ? BQ_OK
              : bq_err(BQ_EFORMAT, "%s: tensor %s: stored in a way bertqat does not write (file corrupt?)", file,
                       tensor);
}

int64_t bq_h5sum_direct_reads(void) { return direct_reads; }

int bq_h5sum_read_f32(hid_t ds, const char *file, const char *tensor, float *dst) {
    hid_t type = H5Dget_type(ds);
    int st = BQ_OK, done = 0;
    if (type < 0 || H5Tequal(type, H5T_IEEE_F32LE) <= 0)
        st = bq_err(BQ_EFORMAT, "%s: tensor %s: stored type is not little-endian float32 (file corrupt?)", file,
                    tensor);
    else if ((st = read_direct(ds, file, tensor, dst, &done)) || done || (st = check_stored(ds, file, tensor)))
        ;
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

/* ---- row reads ---- */

struct BqH5Rows {
    int fd;
    int64_t offset;     /* file offset of row 0 */
    int64_t rows, cols;
    char *path, *tensor; /* for messages */
};

/* Fletcher-32 as HDF5 computes it (H5_checksum_fletcher32): the bytes as big-endian 16-bit words,
 * sum1 += word and sum2 += sum1, each folded to 16 bits plus carry after every 360 words and at the end;
 * the checksum is sum2 << 16 | sum1. fletcher_add takes the words in pieces: every piece but the last
 * must be a whole number of 360-word blocks (an even byte count is all a float tensor ever has). */
enum { FLETCHER_BLOCK = 720 }; /* bytes per 360-word block */

static void fletcher_add(uint32_t *s1, uint32_t *s2, const uint8_t *p, size_t n) {
    uint32_t a = *s1, b = *s2;
    for (size_t words = n / 2; words;) {
        size_t t = words > 360 ? 360 : words;
        words -= t;
        for (; t; t--, p += 2) {
            a += (uint32_t)p[0] << 8 | p[1];
            b += a;
        }
        a = (a & 0xffff) + (a >> 16);
        b = (b & 0xffff) + (b >> 16);
    }
    *s1 = a, *s2 = b;
}

/* 1 when the running sums s1, s2 of fletcher_add, folded, give the little-endian checksum word at tail;
 * HDF5 also accepts the word with the bytes of each half swapped (files of its early versions), and so
 * does this. */
static int fletcher_matches(uint32_t s1, uint32_t s2, const uint8_t tail[4]) {
    s1 = (s1 & 0xffff) + (s1 >> 16);
    s2 = (s2 & 0xffff) + (s2 >> 16);
    const uint32_t sum = s2 << 16 | s1;
    const uint32_t stored = (uint32_t)tail[0] | (uint32_t)tail[1] << 8 | (uint32_t)tail[2] << 16 |
                            (uint32_t)tail[3] << 24;
    const uint32_t swapped = (uint32_t)tail[1] | (uint32_t)tail[0] << 8 | (uint32_t)tail[3] << 16 |
                             (uint32_t)tail[2] << 24;
    return sum == stored || sum == swapped;
}

/* Reads n bytes at off into buf; 0 when they all came. */
static int read_at(int fd, void *buf, size_t n, int64_t off) {
    for (size_t got = 0; got < n;) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + (int64_t)got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = 0;
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

/* The Fletcher-32 of bytes [off, off + n) of fd against the little-endian word after them
 * (fletcher_matches). */
static int verify_chunk(const BqH5Rows *r, int64_t off, int64_t n) {
    const size_t piece = (size_t)FLETCHER_BLOCK * 1456; /* 1,048,320 bytes */
    uint8_t *buf = bq_malloc(piece);
    uint32_t s1 = 0, s2 = 0;
    uint8_t tail[4];
    int st = BQ_OK;
    for (int64_t at = 0; at < n && !st; at += (int64_t)piece) {
        const size_t len = n - at < (int64_t)piece ? (size_t)(n - at) : piece;
        if (read_at(r->fd, buf, len, off + at)) st = BQ_EIO;
        else fletcher_add(&s1, &s2, buf, len);
    }
    if (!st && read_at(r->fd, tail, 4, off + n)) st = BQ_EIO;
    free(buf);
    if (st)
        return bq_err(BQ_EIO, "%s: tensor %s: cannot read: %s", r->path, r->tensor,
                      errno ? strerror(errno) : "the file ends early");
    if (!fletcher_matches(s1, s2, tail))
        return bq_err(BQ_EFORMAT, "%s: tensor %s: checksum mismatch (file corrupt)", r->path, r->tensor);
    return BQ_OK;
}

/* Where ds's values (bytes of them) start in the file and whether a checksum follows them: 1 for one
 * chunk with Fletcher-32 as its only filter, 0 for contiguous storage, -1 for any other layout. The
 * chunk is found by its coordinates: HDF5 1.10's H5Dget_num_chunks counts none in a single-chunk index. */
static int row_storage(hid_t ds, int64_t bytes, int64_t *off) {
    hsize_t dims[H5S_MAX_RANK], chunk[H5S_MAX_RANK], coord[H5S_MAX_RANK] = {0};
    hid_t sp = H5Dget_space(ds), dcpl = H5Dget_create_plist(ds);
    const int nd = sp >= 0 ? H5Sget_simple_extent_dims(sp, dims, NULL) : -1;
    const H5D_layout_t layout = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
    const int nf = dcpl >= 0 ? H5Pget_nfilters(dcpl) : -1;
    int one = layout == H5D_CHUNKED && nd >= 1 && fletcher_only(dcpl) && H5Pget_chunk(dcpl, nd, chunk) == nd;
    for (int k = 0; one && k < nd; k++) one = chunk[k] == dims[k];
    if (sp >= 0) H5Sclose(sp);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (layout == H5D_CONTIGUOUS && nf == 0) {
        const haddr_t a = H5Dget_offset(ds);
        if (a == HADDR_UNDEF || (int64_t)H5Dget_storage_size(ds) != bytes) return -1;
        *off = (int64_t)a;
        return 0;
    }
    unsigned mask = 0;
    haddr_t a = HADDR_UNDEF;
    hsize_t size = 0;
    if (!one || H5Dget_chunk_info_by_coord(ds, coord, &mask, &a, &size) < 0 || mask != 0 || a == HADDR_UNDEF ||
        (int64_t)size != bytes + 4)
        return -1;
    *off = (int64_t)a;
    return 1;
}

/* ds's values straight into dst (bq_h5sum_read_f32's contract) where ds is stored as row_storage reads
 * (one chunk with Fletcher-32, or contiguous) and the file is open read-only through HDF5's default
 * (sec2) driver, whose descriptor is read with pread; the checksum is then computed over dst itself.
 * H5Dread would read a checksummed chunk larger than its chunk cache (1 MiB by default) into a buffer of
 * its own, as large as the tensor, and copy it out, so that loading a Linear's weight took twice its
 * size; every tensor takes this path, so that the small ones of the tests and fuzz targets exercise it.
 * *done is 0 where any of that does not hold (the caller reads through HDF5). */
static int read_direct(hid_t ds, const char *file, const char *tensor, float *dst, int *done) {
    *done = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    hid_t sp = H5Dget_space(ds);
    const hssize_t np = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
    if (sp >= 0) H5Sclose(sp);
    const int64_t bytes = (int64_t)np * (int64_t)sizeof(float);
    int64_t off = 0;
    const int sum = np > 0 ? row_storage(ds, bytes, &off) : -1;
    if (sum < 0) return BQ_OK;
    hid_t fid = H5Iget_file_id(ds), fapl = fid >= 0 ? H5Fget_access_plist(fid) : -1;
    int *fdp = NULL;
    unsigned intent = 0;
    /* read-only: in a file open for writing, HDF5 may still hold written bytes in its buffers */
    const int sec2 = fapl >= 0 && H5Fget_intent(fid, &intent) >= 0 && !(intent & H5F_ACC_RDWR) &&
                     H5Pget_driver(fapl) == H5FD_SEC2 && H5Fget_vfd_handle(fid, fapl, (void **)&fdp) >= 0 && fdp &&
                     *fdp >= 0;
    const int fd = sec2 ? *fdp : -1;
    if (fapl >= 0) H5Pclose(fapl);
    if (fid >= 0) H5Fclose(fid);
    if (!sec2) return BQ_OK;
    *done = 1;
    direct_reads++;
    uint8_t tail[4];
    if (read_at(fd, dst, (size_t)bytes, off) || (sum && read_at(fd, tail, 4, off + bytes)))
        return bq_err(BQ_EIO, "%s: tensor %s: cannot read: %s", file, tensor,
                      errno ? strerror(errno) : "the file ends early");
    uint32_t s1 = 0, s2 = 0;
    if (sum) fletcher_add(&s1, &s2, (const uint8_t *)dst, (size_t)bytes);
    if (sum && !fletcher_matches(s1, s2, tail))
        return bq_err(BQ_EFORMAT, "%s: tensor %s: checksum mismatch (file corrupt)", file, tensor);
#else
    (void)ds, (void)file, (void)tensor, (void)dst;
#endif
    return BQ_OK;
}

int bq_h5rows_open(BqH5Rows **out, hid_t ds, const char *path, const char *tensor, int64_t rows, int64_t cols) {
    *out = NULL;
    hid_t type = H5Dget_type(ds);
    const int f32 = type >= 0 && H5Tequal(type, H5T_IEEE_F32LE) > 0;
    if (type >= 0) H5Tclose(type);
    if (!f32)
        return bq_err(BQ_EFORMAT, "%s: tensor %s: stored type is not little-endian float32 (file corrupt?)", path,
                      tensor);
    const int64_t bytes = rows * cols * (int64_t)sizeof(float);
    int64_t off = 0;
    const int sum = row_storage(ds, bytes, &off);
    if (sum < 0 || rows <= 0 || cols <= 0) return BQ_OK;
    BqH5Rows *r = bq_calloc(1, sizeof *r);
    r->offset = off, r->rows = rows, r->cols = cols;
    r->path = bq_strdup(path), r->tensor = bq_strdup(tensor);
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    int st = r->fd < 0 ? bq_err(BQ_EIO, "%s: tensor %s: cannot read: %s", path, tensor, strerror(errno))
             : sum    ? verify_chunk(r, off, bytes)
                      : BQ_OK;
    if (st) {
        bq_h5rows_close(r);
        return st;
    }
    *out = r;
    return BQ_OK;
}

int bq_h5rows_read(void *rows, int64_t i, float *dst) {
    const BqH5Rows *r = rows;
    BQ_CHECK(i >= 0 && i < r->rows);
    const size_t n = (size_t)r->cols * sizeof(float);
    if (read_at(r->fd, dst, n, r->offset + i * (int64_t)n))
        return bq_err(BQ_EIO, "%s: tensor %s: cannot read row %lld (the file changed since it was opened?)", r->path,
                      r->tensor, (long long)i);
    return BQ_OK;
}

void bq_h5rows_close(void *rows) {
    BqH5Rows *r = rows;
    if (!r) return;
    if (r->fd >= 0) close(r->fd);
    free(r->path);
    free(r->tensor);
    free(r);
}
