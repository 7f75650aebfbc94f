/* safetensors reader/writer (export/safetensors.c): F32 round trip through bq_st_write (exact, with
 * __metadata__ ignored and the header padded to 8 bytes), F16/BF16/I64 decoding of hand-made files,
 * and every malformed-file case the reader must reject with BQ_EFORMAT and a message naming the file
 * (and tensor): truncated file, header length past EOF, bad JSON, non-object header, offsets out of
 * range, shape/size mismatch, unknown dtype, overlapping tensors; a missing file is BQ_EIO. Prints
 * the max error of the round trip. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "export/safetensors.h"
#include "tests/test_util.h"

static char root[64];

/* Writes a raw safetensors file: length field hlen_field (or strlen(header) when < 0), header, data. */
static void write_raw(const char *path, long long hlen_field, const char *header, const void *data, size_t nd) {
    FILE *f = fopen(path, "wb");
    BQ_CHECK(f);
    uint64_t hl = hlen_field < 0 ? strlen(header) : (uint64_t)hlen_field;
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hl >> (8 * i));
    fwrite(b, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    if (nd) fwrite(data, 1, nd, f);
    fclose(f);
}

/* Opening PATH must fail with status and a message containing both needles. */
static void expect_bad(const char *what, const char *path, int status, const char *needle) {
    BqSt *st = NULL;
    bq_err_clear();
    int rc = bq_st_open(&st, path);
    EXPECT(rc == status, "%s: status %d, expected %d (%s)", what, rc, status, bq_errmsg());
    EXPECT(st == NULL, "%s: handle returned on error", what);
    EXPECT(strstr(bq_errmsg(), path) != NULL, "%s: message does not name the file: %s", what, bq_errmsg());
    EXPECT(strstr(bq_errmsg(), needle) != NULL, "%s: message lacks \"%s\": %s", what, needle, bq_errmsg());
    printf("  %-26s -> %s\n", what, bq_errmsg());
    if (st) bq_st_close(st);
}

int main(void) {
    bq_test_tmpdir(root, sizeof root, "st");
    char p[512];
    double maxerr = 0;

    /* ---- round trip ---- */
    BqRng rng;
    bq_rng_seed(&rng, 7);
    float a[3 * 5], b[4], c[1];
    for (int i = 0; i < 15; i++) a[i] = bq_rng_normal(&rng);
    for (int i = 0; i < 4; i++) b[i] = bq_rng_normal(&rng) * 1e-20f;
    c[0] = -3.5f;
    const char *names[] = {"z.weight", "a.bias", "scalar"};
    const float *data[] = {a, b, c};
    int ndims[] = {2, 1, 0};
    int64_t sa[] = {3, 5}, sb[] = {4}, sc[] = {0};
    const int64_t *shapes[] = {sa, sb, sc};
    json_t *meta = json_pack("{s:s}", "format", "pt");
    snprintf(p, sizeof p, "%s/rt.safetensors", root);
    int rc = bq_st_write(p, names, data, ndims, shapes, 3, meta);
    json_decref(meta);
    EXPECT(rc == BQ_OK, "write: %s", bq_errmsg());
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    EXPECT(access(tmp, F_OK) != 0, "writer left %s behind", tmp);
    BqSt *st = NULL;
    rc = bq_st_open(&st, p);
    EXPECT(rc == BQ_OK, "open round trip: %s", bq_errmsg());
    if (!rc) {
        EXPECT(st->n == 3, "listed %d tensors, expected 3 (__metadata__ must not be listed)", st->n);
        EXPECT(st->data_off % 8 == 0, "header not padded to 8 bytes (data at %llu)", (unsigned long long)st->data_off);
        EXPECT(st->n == 3 && strcmp(st->t[0].name, "a.bias") == 0, "tensors not sorted by name");
        const BqStTensor *t = bq_st_find(st, "z.weight");
        EXPECT(t && t->dtype == BQ_ST_F32 && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 5, "z.weight entry");
        EXPECT(bq_st_find(st, "nope") == NULL, "find of a missing name");
        float ra[15], rb[4], rcv[1];
        EXPECT(bq_st_read_f32(st, "z.weight", ra, 2, sa) == BQ_OK, "%s", bq_errmsg());
        EXPECT(bq_st_read_f32(st, "a.bias", rb, 1, sb) == BQ_OK, "%s", bq_errmsg());
        EXPECT(bq_st_read_f32(st, "scalar", rcv, 0, sc) == BQ_OK, "%s", bq_errmsg());
        for (int i = 0; i < 15; i++) maxerr = fmax(maxerr, fabs(ra[i] - a[i]));
        for (int i = 0; i < 4; i++) maxerr = fmax(maxerr, fabs(rb[i] - b[i]));
        maxerr = fmax(maxerr, fabs(rcv[0] - c[0]));
        EXPECT(memcmp(ra, a, sizeof a) == 0 && memcmp(rb, b, sizeof b) == 0 && rcv[0] == c[0], "round trip not bit exact");
        /* wrong shape asked for: message names the tensor, expected and found shapes */
        int64_t wrong[] = {5, 3};
        bq_err_clear();
        rc = bq_st_read_f32(st, "z.weight", ra, 2, wrong);
        EXPECT(rc == BQ_EFORMAT && strstr(bq_errmsg(), "z.weight") && strstr(bq_errmsg(), "expected shape [5, 3]") &&
                   strstr(bq_errmsg(), "found [3, 5]"),
               "shape mismatch message: %s", bq_errmsg());
        printf("  %-26s -> %s\n", "read with wrong shape", bq_errmsg());
        rc = bq_st_read_f32(st, "missing.tensor", ra, 1, sb);
        EXPECT(rc == BQ_EFORMAT && strstr(bq_errmsg(), "missing.tensor"), "missing tensor: %s", bq_errmsg());
        bq_st_close(st);
    }
    /* duplicate names are refused by the writer */
    const char *dup[] = {"x", "x"};
    const float *dd[] = {b, b};
    int dn[] = {1, 1};
    const int64_t *ds[] = {sb, sb};
    snprintf(p, sizeof p, "%s/dup.safetensors", root);
    EXPECT(bq_st_write(p, dup, dd, dn, ds, 2, NULL) == BQ_EINVAL, "duplicate names accepted");

    /* ---- F16 / BF16 / I64 decoding ---- */
    {
        /* F16: 1.0, -2.0, 0.5, smallest subnormal 2^-24, 65504, +inf; BF16: 1.0, -0.15625 */
        uint16_t h[6] = {0x3C00, 0xC000, 0x3800, 0x0001, 0x7BFF, 0x7C00};
        uint16_t bf[2] = {0x3F80, 0xBE20};
        int64_t iv[3] = {0, 1, 511};
        unsigned char buf[12 + 4 + 24];
        memcpy(buf, h, 12);
        memcpy(buf + 12, bf, 4);
        memcpy(buf + 16, iv, 24);
        const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                          "\"h\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
                          "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[12,16]},"
                          "\"embeddings.position_ids\":{\"dtype\":\"I64\",\"shape\":[1,3],\"data_offsets\":[16,40]}}";
        snprintf(p, sizeof p, "%s/types.safetensors", root);
        write_raw(p, -1, hdr, buf, sizeof buf);
        rc = bq_st_open(&st, p);
        EXPECT(rc == BQ_OK, "open types: %s", bq_errmsg());
        if (!rc) {
            float fh[6], fb[2];
            int64_t sh[] = {2, 3}, s2[] = {2}, si[] = {1, 3}, ri[3];
            EXPECT(bq_st_read_f32(st, "h", fh, 2, sh) == BQ_OK, "%s", bq_errmsg());
            float want[6] = {1.0f, -2.0f, 0.5f, ldexpf(1.0f, -24), 65504.0f, INFINITY};
            for (int i = 0; i < 6; i++) EXPECT(fh[i] == want[i], "F16[%d] = %g, expected %g", i, fh[i], want[i]);
            EXPECT(bq_st_read_f32(st, "b", fb, 1, s2) == BQ_OK, "%s", bq_errmsg());
            EXPECT(fb[0] == 1.0f && fb[1] == -0.15625f, "BF16 decoded as %g %g", fb[0], fb[1]);
            EXPECT(bq_st_read_i64(st, "embeddings.position_ids", ri, 2, si) == BQ_OK && ri[2] == 511, "I64 read");
            float fi[3];
            rc = bq_st_read_f32(st, "embeddings.position_ids", fi, 2, si);
            EXPECT(rc == BQ_EFORMAT && strstr(bq_errmsg(), "I64"), "I64 read as float: %s", bq_errmsg());
            bq_st_close(st);
        }
    }

    /* ---- malformed files ---- */
    float four[4] = {1, 2, 3, 4};
    const char *good = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    snprintf(p, sizeof p, "%s/good.safetensors", root);
    write_raw(p, -1, good, four, 16);
    rc = bq_st_open(&st, p);
    EXPECT(rc == BQ_OK, "control file rejected: %s", bq_errmsg());
    if (!rc) bq_st_close(st);

    snprintf(p, sizeof p, "%s/short.safetensors", root);
    {
        FILE *f = fopen(p, "wb");
        fwrite("\x10\x00\x00", 1, 3, f);
        fclose(f);
    }
    expect_bad("truncated (3 bytes)", p, BQ_EFORMAT, "truncated");
    snprintf(p, sizeof p, "%s/hlen.safetensors", root);
    write_raw(p, 1000, good, four, 16);
    expect_bad("header length past EOF", p, BQ_EFORMAT, "header length 1000");
    snprintf(p, sizeof p, "%s/json.safetensors", root);
    write_raw(p, -1, "{\"w\":{\"dtype\":\"F32\",", four, 16);
    expect_bad("bad JSON", p, BQ_EFORMAT, "not valid JSON");
    snprintf(p, sizeof p, "%s/arr.safetensors", root);
    write_raw(p, -1, "[1,2]", four, 16);
    expect_bad("header not an object", p, BQ_EFORMAT, "not a JSON object");
    snprintf(p, sizeof p, "%s/off.safetensors", root);
    write_raw(p, -1, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", four, 16);
    expect_bad("offsets out of range", p, BQ_EFORMAT, "outside the data");
    snprintf(p, sizeof p, "%s/trunc.safetensors", root);
    write_raw(p, -1, good, four, 12);
    expect_bad("data truncated", p, BQ_EFORMAT, "\"w\"");
    snprintf(p, sizeof p, "%s/neg.safetensors", root);
    write_raw(p, -1, "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}", four, 16);
    expect_bad("offsets reversed", p, BQ_EFORMAT, "data_offsets");
    snprintf(p, sizeof p, "%s/size.safetensors", root);
    write_raw(p, -1, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", four, 16);
    expect_bad("shape/size mismatch", p, BQ_EFORMAT, "shape needs 24 bytes");
    snprintf(p, sizeof p, "%s/dtype.safetensors", root);
    write_raw(p, -1, "{\"w\":{\"dtype\":\"Q4\",\"shape\":[4],\"data_offsets\":[0,16]}}", four, 16);
    expect_bad("unknown dtype", p, BQ_EFORMAT, "unknown dtype \"Q4\"");
    snprintf(p, sizeof p, "%s/overlap.safetensors", root);
    write_raw(p, -1,
              "{\"u\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"v\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
              four, 16);
    expect_bad("overlapping tensors", p, BQ_EFORMAT, "overlap");
    snprintf(p, sizeof p, "%s/shape.safetensors", root);
    write_raw(p, -1, "{\"w\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", four, 16);
    expect_bad("negative dimension", p, BQ_EFORMAT, "shape");
    snprintf(p, sizeof p, "%s/nodtype.safetensors", root);
    write_raw(p, -1, "{\"w\":{\"shape\":[4],\"data_offsets\":[0,16]}}", four, 16);
    expect_bad("missing dtype", p, BQ_EFORMAT, "missing dtype");
    snprintf(p, sizeof p, "%s/absent.safetensors", root);
    expect_bad("missing file", p, BQ_EIO, "cannot open");

    bq_test_rmtree(root);
    printf("test_safetensors: max error %g, %d fails\n", maxerr, fails);
    return fails ? 1 : 0;
}
