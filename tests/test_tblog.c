/* TensorBoard writer: CRC-32C against the standard check value, and a written event file parsed
 * back record by record (lengths, both masked CRCs, Event/Summary contents). The Python suite also
 * reads these files with the tensorboard package (tests/python/test_tensorboard.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/tblog.h"
#include "tb_event.pb-c.h"
#include "tests/test_util.h"

static uint32_t get_u32(const unsigned char *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

int main(void) {
    /* CRC-32C check value of "123456789" is 0xE3069283 (RFC 3720 B.4). */
    EXPECT(bq_crc32c("123456789", 9) == 0xE3069283u);
    char dir[64];
    bq_test_tmpdir(dir, sizeof dir, "tblog");
    char logdir[256];
    snprintf(logdir, sizeof logdir, "%s/a/b", dir);
    BqTbWriter *w = NULL;
    EXPECT(bq_tb_open(&w, logdir) == 0);
    if (!w) return 1;
    for (int s = 0; s < 5; s++) EXPECT(bq_tb_scalar(w, "train/loss", 1.0f / (float)(s + 1), s * 10) == 0);
    char path[512];
    snprintf(path, sizeof path, "%s", bq_tb_path(w));
    EXPECT(strstr(path, "events.out.tfevents.") != NULL);
    EXPECT(bq_tb_close(w) == 0);

    FILE *fp = fopen(path, "rb");
    EXPECT(fp != NULL);
    if (!fp) return 1;
    int nrec = 0;
    double max_err = 0;
    unsigned char head[12];
    while (fread(head, 1, 12, fp) == 12) {
        uint64_t len = 0;
        for (int i = 0; i < 8; i++) len |= (uint64_t)head[i] << (8 * i);
        EXPECT(get_u32(head + 8) == bq_crc32c_masked(head, 8));
        unsigned char *buf = malloc(len + 4);
        EXPECT(fread(buf, 1, len + 4, fp) == len + 4);
        EXPECT(get_u32(buf + len) == bq_crc32c_masked(buf, len));
        Bqtb__Event *ev = bqtb__event__unpack(NULL, len, buf);
        EXPECT(ev != NULL);
        if (ev && nrec == 0) {
            EXPECT(ev->what_case == BQTB__EVENT__WHAT_FILE_VERSION);
            EXPECT(!strcmp(ev->file_version, "brain.Event:2"));
        } else if (ev) {
            EXPECT(ev->what_case == BQTB__EVENT__WHAT_SUMMARY && ev->summary->n_value == 1);
            int s = nrec - 1;
            EXPECT(ev->step == s * 10);
            EXPECT(!strcmp(ev->summary->value[0]->tag, "train/loss"));
            double e = ev->summary->value[0]->simple_value - 1.0 / (s + 1);
            if (e < 0) e = -e;
            if (e > max_err) max_err = e;
        }
        if (ev) bqtb__event__free_unpacked(ev, NULL);
        free(buf);
        nrec++;
    }
    fclose(fp);
    EXPECT(nrec == 6);
    EXPECT(max_err < 1e-7);
    bq_test_rmtree(dir);
    printf("test_tblog: %d records, max value error %.3g, %s\n", nrec, max_err, fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
