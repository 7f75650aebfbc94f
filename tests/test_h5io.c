/* HDF5 wrapper (export/h5io.c): f32/i64 round trip through nested groups (bit exact), attributes of
 * every kind on the root, a group and a dataset, listing, shape queries, and errors that name the
 * file and dataset: shape mismatch (expected and found shapes), missing dataset, wrong type, missing
 * file (BQ_EIO), corrupt and truncated files (BQ_EFORMAT). HDF5 must print nothing (checked by the
 * test's own stderr being free of "HDF5-DIAG"). Prints the max error of the round trip. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "export/h5io.h"

static int fails = 0;
#define EXPECT(c, ...)                                   \
    do {                                                 \
        if (!(c)) {                                      \
            fprintf(stderr, "FAIL line %d: ", __LINE__); \
            fprintf(stderr, __VA_ARGS__);                \
            fprintf(stderr, "\n");                       \
            fails++;                                     \
        }                                                \
    } while (0)

int main(void) {
    char root[] = "/tmp/bq_test_h5_XXXXXX";
    BQ_CHECK(mkdtemp(root));
    char p[512], errlog[512];
    snprintf(p, sizeof p, "%s/a.h5", root);
    snprintf(errlog, sizeof errlog, "%s/stderr.txt", root);
    /* HDF5 diagnostics would go to stderr: capture it to check silence, restore at the end */
    fflush(stderr);
    int saved_err = dup(2);
    BQ_CHECK(freopen(errlog, "w", stderr));
    double maxerr = 0;

    BqRng rng;
    bq_rng_seed(&rng, 3);
    float w[6 * 4], b[6];
    for (int i = 0; i < 24; i++) w[i] = bq_rng_normal(&rng);
    for (int i = 0; i < 6; i++) b[i] = bq_rng_normal(&rng);
    int64_t cur[4] = {1, -2, INT64_MAX, INT64_MIN};
    int64_t sw[] = {6, 4}, sb[] = {6}, sc[] = {4};

    BqH5 *f = NULL;
    int rc = bq_h5_create(&f, p);
    EXPECT(rc == BQ_OK, "create: %s", bq_errmsg());
    if (!rc) {
        EXPECT(bq_h5_write_f32(f, "/params/bert.encoder.layer.0.attention.self.query.weight", w, 2, sw) == BQ_OK, "%s",
               bq_errmsg());
        EXPECT(bq_h5_write_f32(f, "/params/bert.encoder.layer.0.attention.self.query.bias", b, 1, sb) == BQ_OK, "%s",
               bq_errmsg());
        EXPECT(bq_h5_write_i64(f, "/state/cursors", cur, 1, sc) == BQ_OK, "%s", bq_errmsg());
        float one = 2.5f;
        EXPECT(bq_h5_write_f32(f, "scalar", &one, 0, NULL) == BQ_OK, "%s", bq_errmsg());
        EXPECT(bq_h5_set_attr_i64(f, "/", "format_version", 1) == BQ_OK, "%s", bq_errmsg());
        EXPECT(bq_h5_set_attr_f64(f, "/state", "lr", 5e-5) == BQ_OK, "%s", bq_errmsg());
        EXPECT(bq_h5_set_attr_str(f, "/params/bert.encoder.layer.0.attention.self.query.weight", "note", "héllo") == BQ_OK,
               "%s", bq_errmsg());
        EXPECT(bq_h5_set_attr_i64(f, "/", "format_version", 2) == BQ_OK, "attribute replace: %s", bq_errmsg());
        EXPECT(bq_h5_set_attr_i64(f, "/nothing", "x", 1) == BQ_EFORMAT, "attribute on a missing object accepted");
        EXPECT(bq_h5_close(f) == BQ_OK, "close: %s", bq_errmsg());
    }
    rc = bq_h5_open(&f, p);
    EXPECT(rc == BQ_OK, "open: %s", bq_errmsg());
    if (!rc) {
        float rw[24], rb[6], rs;
        int64_t rcur[4];
        EXPECT(bq_h5_read_f32(f, "/params/bert.encoder.layer.0.attention.self.query.weight", rw, 2, sw) == BQ_OK, "%s",
               bq_errmsg());
        EXPECT(bq_h5_read_f32(f, "/params/bert.encoder.layer.0.attention.self.query.bias", rb, 1, sb) == BQ_OK, "%s",
               bq_errmsg());
        EXPECT(bq_h5_read_i64(f, "/state/cursors", rcur, 1, sc) == BQ_OK, "%s", bq_errmsg());
        EXPECT(bq_h5_read_f32(f, "scalar", &rs, 0, NULL) == BQ_OK && rs == 2.5f, "scalar: %s", bq_errmsg());
        for (int i = 0; i < 24; i++) maxerr = fmax(maxerr, fabs(rw[i] - w[i]));
        for (int i = 0; i < 6; i++) maxerr = fmax(maxerr, fabs(rb[i] - b[i]));
        EXPECT(memcmp(rw, w, sizeof w) == 0 && memcmp(rb, b, sizeof b) == 0, "f32 round trip not bit exact");
        EXPECT(memcmp(rcur, cur, sizeof cur) == 0, "i64 round trip differs");
        int nd = -1;
        int64_t shp[4];
        EXPECT(bq_h5_shape(f, "/params/bert.encoder.layer.0.attention.self.query.weight", &nd, shp) == BQ_OK && nd == 2 &&
                   shp[0] == 6 && shp[1] == 4,
               "shape query");
        EXPECT(bq_h5_exists(f, "/params") == 1 && bq_h5_exists(f, "/params/nope") == 0 && bq_h5_exists(f, "/a/b/c") == 0,
               "exists");
        char **names = NULL;
        int n = 0;
        EXPECT(bq_h5_list(f, "/params", &names, &n) == BQ_OK && n == 2, "list /params: %d", n);
        if (n == 2)
            EXPECT(strcmp(names[0], "bert.encoder.layer.0.attention.self.query.bias") == 0 &&
                       strcmp(names[1], "bert.encoder.layer.0.attention.self.query.weight") == 0,
                   "list order/names");
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
        EXPECT(bq_h5_list(f, "/", &names, &n) == BQ_OK && n == 3, "list /: %d", n);
        for (int i = 0; i < n; i++) free(names[i]);
        free(names);
        int64_t fv = 0;
        double lr = 0;
        char *s = NULL;
        EXPECT(bq_h5_get_attr_i64(f, "/", "format_version", &fv) == BQ_OK && fv == 2, "attr i64 %lld", (long long)fv);
        EXPECT(bq_h5_get_attr_f64(f, "/state", "lr", &lr) == BQ_OK && lr == 5e-5, "attr f64 %g", lr);
        EXPECT(bq_h5_get_attr_str(f, "/params/bert.encoder.layer.0.attention.self.query.weight", "note", &s) == BQ_OK && s &&
                   strcmp(s, "héllo") == 0,
               "attr str");
        free(s);
        rc = bq_h5_get_attr_i64(f, "/", "missing_attr", &fv);
        EXPECT(rc == BQ_EFORMAT && strstr(bq_errmsg(), "missing_attr") && strstr(bq_errmsg(), p), "missing attr: %s",
               bq_errmsg());
        rc = bq_h5_get_attr_str(f, "/", "format_version", &s);
        EXPECT(rc == BQ_EFORMAT, "int attribute read as string accepted");

        /* errors name the file, the dataset and both shapes */
        int64_t wrong[] = {4, 6};
        rc = bq_h5_read_f32(f, "/params/bert.encoder.layer.0.attention.self.query.weight", rw, 2, wrong);
        EXPECT(rc == BQ_EFORMAT && strstr(bq_errmsg(), p) && strstr(bq_errmsg(), "query.weight") &&
                   strstr(bq_errmsg(), "expected shape [4, 6]") && strstr(bq_errmsg(), "found [6, 4]"),
               "shape mismatch: %s", bq_errmsg());
        printf("  shape mismatch  -> %s\n", bq_errmsg());
        int64_t flat[] = {24};
        rc = bq_h5_read_f32(f, "/params/bert.encoder.layer.0.attention.self.query.weight", rw, 1, flat);
        EXPECT(rc == BQ_EFORMAT && strstr(bq_errmsg(), "found [6, 4]"), "rank mismatch: %s", bq_errmsg());
        rc = bq_h5_read_f32(f, "/params/missing", rw, 1, flat);
        EXPECT(rc == BQ_EFORMAT && strstr(bq_errmsg(), "/params/missing") && strstr(bq_errmsg(), p), "missing: %s",
               bq_errmsg());
        printf("  missing dataset -> %s\n", bq_errmsg());
        rc = bq_h5_read_f32(f, "/state/cursors", rw, 1, sc);
        EXPECT(rc == BQ_EFORMAT && strstr(bq_errmsg(), "cursors"), "int dataset read as float: %s", bq_errmsg());
        EXPECT(bq_h5_close(f) == BQ_OK, "close");
    }

    /* missing, corrupt and truncated files */
    char q[600];
    snprintf(q, sizeof q, "%s/absent.h5", root);
    rc = bq_h5_open(&f, q);
    EXPECT(rc == BQ_EIO && f == NULL && strstr(bq_errmsg(), q), "missing file: %d %s", rc, bq_errmsg());
    printf("  missing file    -> %s\n", bq_errmsg());
    snprintf(q, sizeof q, "%s/garbage.h5", root);
    FILE *g = fopen(q, "wb");
    for (int i = 0; i < 4096; i++) fputc((i * 7919) & 0xff, g);
    fclose(g);
    rc = bq_h5_open(&f, q);
    EXPECT(rc == BQ_EFORMAT && f == NULL && strstr(bq_errmsg(), q), "corrupt file: %d %s", rc, bq_errmsg());
    printf("  corrupt file    -> %s\n", bq_errmsg());
    /* truncated copy of the real file: first 1 KiB */
    snprintf(q, sizeof q, "%s/trunc.h5", root);
    {
        FILE *in = fopen(p, "rb"), *out = fopen(q, "wb");
        char buf[1024];
        size_t k = fread(buf, 1, sizeof buf, in);
        fwrite(buf, 1, k, out);
        fclose(in), fclose(out);
    }
    rc = bq_h5_open(&f, q);
    if (rc == BQ_OK) { /* the superblock may survive: reading the data must then fail */
        float rw[24];
        rc = bq_h5_read_f32(f, "/params/bert.encoder.layer.0.attention.self.query.weight", rw, 2, sw);
        bq_h5_close(f);
    }
    EXPECT(rc == BQ_EFORMAT && strstr(bq_errmsg(), q), "truncated file: %d %s", rc, bq_errmsg());
    printf("  truncated file  -> %s\n", bq_errmsg());
    snprintf(q, sizeof q, "%s/nodir/x.h5", root);
    rc = bq_h5_create(&f, q);
    EXPECT(rc == BQ_EIO && strstr(bq_errmsg(), q), "create in a missing dir: %s", bq_errmsg());

    fflush(stderr);
    dup2(saved_err, 2);
    close(saved_err);
    FILE *el = fopen(errlog, "r");
    char line[512];
    int diag = 0;
    while (el && fgets(line, sizeof line, el)) {
        if (strstr(line, "HDF5-DIAG")) diag = 1;
        if (!strstr(line, "FAIL")) continue;
        fputs(line, stdout);
    }
    if (el) fclose(el);
    EXPECT(!diag, "HDF5 printed diagnostics to stderr");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", root);
    printf("test_h5io: max error %g, %d failures\n", maxerr, fails);
    return fails ? 1 : 0;
}
