/* Persistence of the quantizer state (layers/quant.h): the quantization config as the "bertqat"."quant"
 * block of a checkpoint's config.json, the ranges and observer state in model.h5 (/quant) and the
 * learned scales' optimizer state in training_state.h5 (/lsq). layers/quant.c keeps the numerics; the
 * serialisation lives here, next to the checkpoint writer (export/ckpt.c) that calls it, so layers/
 * needs neither HDF5 nor JSON for quantizers. Layouts: docs/formats.md and docs/design.md §6. */
#ifndef BQ_QUANT_IO_H
#define BQ_QUANT_IO_H

#include <stdint.h>

#include "layers/quant.h"

struct json_t;

/* Config as the "bertqat" JSON block of a checkpoint's config.json, and back (missing keys keep
 * their defaults; bad types are errors naming the key). */
struct json_t *bq_quant_config_to_json(const BqQuantConfig *cfg);
int bq_quant_config_from_json(BqQuantConfig *cfg, struct json_t *j);

/* Ranges in an HDF5 checkpoint, on an open file handle (hid_t, an int64_t in HDF5 >= 1.10) of
 * export/ckpt.c; `path` names the file in messages. Layout: /quant/<name>/{amax, scale} with
 * attributes axis, bits, scheme, frozen, initialized, and observer_min/observer_max (the
 * moving-average state, so QAT resumes exactly). load requires qs (the model's quantizers, built
 * from config.json; NULL is a BQ_EFORMAT error) and fills every quantizer; a missing quantizer group or
 * a shape mismatch is a BQ_EFORMAT error naming the file and quantizer. */
int bq_quant_save_hdf5(const BqQuantState *qs, int64_t file_id, const char *path);
int bq_quant_load_hdf5(BqQuantState *qs, int64_t file_id, const char *path);

/* The scale group's optimizer state in training_state.h5 (src/train_state.c): /lsq/m, /lsq/v and,
 * when with_best, /lsq/best, each (nscales) float32 in table order with checksums. load: a file
 * without /lsq for a learning table, or with /lsq for a table that does not learn, is a BQ_EFORMAT
 * error naming the file and --ranges; *has_best says whether /lsq/best was read. */
int bq_quant_learn_save_hdf5(const BqQuantState *qs, int64_t file_id, const char *path, int with_best);
int bq_quant_learn_load_hdf5(BqQuantState *qs, int64_t file_id, const char *path, int *has_best);


#endif
