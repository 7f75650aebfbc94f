/* TensorBoard event-file writer. Record framing (TFRecord): uint64 length (LE), uint32 masked
 * CRC32C of the length bytes, the payload, uint32 masked CRC32C of the payload; mask(c) =
 * ((c >> 15) | (c << 17)) + 0xa282ead8. The first record is an Event with file_version
 * "brain.Event:2"; each scalar is an Event holding a Summary with one simple_value. */
#include "src/tblog.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "tb_event.pb-c.h"

struct BqTbWriter {
    FILE *fp;
    char *path;
};

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1; /* reflected 0x1EDC6F41 */
        crc_table[i] = c;
    }
}

uint32_t bq_crc32c(const void *data, size_t n) {
    if (!crc_table[1]) crc_init();
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t bq_crc32c_masked(const void *data, size_t n) {
    uint32_t c = bq_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static double wall_time(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

static void put_u32(unsigned char *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static int write_record(BqTbWriter *w, const Bqtb__Event *ev) {
    size_t n = bqtb__event__get_packed_size(ev);
    unsigned char head[12], tail[4];
    unsigned char *payload = bq_malloc(n);
    bqtb__event__pack(ev, payload);
    uint64_t len = n;
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)(len >> (8 * i));
    put_u32(head + 8, bq_crc32c_masked(head, 8));
    put_u32(tail, bq_crc32c_masked(payload, n));
    int ok = fwrite(head, 1, 12, w->fp) == 12 && fwrite(payload, 1, n, w->fp) == n && fwrite(tail, 1, 4, w->fp) == 4 &&
             fflush(w->fp) == 0;
    free(payload);
    return ok ? BQ_OK : bq_err(BQ_EIO, "%s: write failed: %s", w->path, strerror(errno));
}

int bq_tb_open(BqTbWriter **out, const char *logdir) {
    *out = NULL;
    int st = bq_mkdir_p(logdir);
    if (st) return st;
    char host[128] = "localhost";
    gethostname(host, sizeof host - 1);
    size_t n = strlen(logdir) + strlen(host) + 96;
    BqTbWriter *w = bq_calloc(1, sizeof *w);
    w->path = bq_malloc(n);
    snprintf(w->path, n, "%s/events.out.tfevents.%ld.%s.%d", logdir, (long)wall_time(), host, (int)getpid());
    w->fp = fopen(w->path, "wb");
    if (!w->fp) {
        st = bq_err(BQ_EIO, "%s: cannot create event file: %s", w->path, strerror(errno));
        goto cleanup;
    }
    Bqtb__Event ev = BQTB__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.what_case = BQTB__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    st = write_record(w, &ev);
cleanup:
    if (st) {
        if (w->fp) fclose(w->fp);
        free(w->path);
        free(w);
        return st;
    }
    *out = w;
    return BQ_OK;
}

int bq_tb_scalar(BqTbWriter *w, const char *tag, float value, int64_t step) {
    Bqtb__Summary__Value v = BQTB__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag;
    v.simple_value = value;
    Bqtb__Summary__Value *vals[1] = {&v};
    Bqtb__Summary sum = BQTB__SUMMARY__INIT;
    sum.n_value = 1;
    sum.value = vals;
    Bqtb__Event ev = BQTB__EVENT__INIT;
    ev.wall_time = wall_time();
    ev.step = step;
    ev.what_case = BQTB__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    return write_record(w, &ev);
}

int bq_tb_close(BqTbWriter *w) {
    if (!w) return BQ_OK;
    int st = BQ_OK;
    if (fclose(w->fp) != 0) st = bq_err(BQ_EIO, "%s: close failed: %s", w->path, strerror(errno));
    free(w->path);
    free(w);
    return st;
}

const char *bq_tb_path(const BqTbWriter *w) { return w->path; }
