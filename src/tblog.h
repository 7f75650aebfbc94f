/* TensorBoard scalar logs: standard `events.out.tfevents.*` files (TFRecord framing with masked
 * CRC32C; Event/Summary protobufs from export/tb_event.proto through protobuf-c), readable by the
 * `tensorboard` package and TensorFlow's summary iterator. */
#ifndef BQ_TBLOG_H
#define BQ_TBLOG_H

#include <stddef.h>
#include <stdint.h>

typedef struct BqTbWriter BqTbWriter;

/* Creates logdir (and parents) if needed and opens a new event file in it. */
int bq_tb_open(BqTbWriter **out, const char *logdir);
/* Appends one scalar; flushed to the OS after each call so a crash loses nothing already logged. */
int bq_tb_scalar(BqTbWriter *w, const char *tag, float value, int64_t step);
int bq_tb_close(BqTbWriter *w);
const char *bq_tb_path(const BqTbWriter *w);

/* CRC-32C (Castagnoli) of data and TFRecord's mask of it; exposed for tests. */
uint32_t bq_crc32c(const void *data, size_t n);
uint32_t bq_crc32c_masked(const void *data, size_t n);

#endif
