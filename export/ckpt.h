/* Native checkpoint directory (docs/design.md §6):
 *   DIR/config.json          HF BertConfig keys + "bertqat" block (format version, num_labels,
 *                            id2label, quant config when the model is quantized, "data": how the
 *                            examples were encoded, BqDataMeta in layers/bert.h)
 *   DIR/vocab.txt            (+ tokenizer_config.json, special_tokens_map.json when present) copied
 *   DIR/model.h5             /params/<HF name> float32 datasets; root attribute format_version;
 *                            /quant/... written by the QAT module when m->quant is set
 *   DIR/training_state.h5    optimizer moments, counters and RNG of an interrupted run, written by
 *                            the trainer through BqCkptExtra (layout in src/train_state.h)
 * Saved into DIR.tmp, every file fsynced, then DIR.tmp swapped with DIR in one step and the old
 * contents removed (bq_replace_dir, autograd/bq.h), so DIR is always either the old or the new
 * checkpoint, whenever the process is killed. A save that fails (a full disk) removes DIR.tmp and
 * leaves DIR as it was; its message starts "DIR: not saved (...)". A training_log.jsonl in the old
 * DIR is carried over into the new one. */
#ifndef BQ_CKPT_H
#define BQ_CKPT_H

#include <stdint.h>

#include "layers/bert.h"

#define BQ_CKPT_FORMAT_VERSION 1

/* Files that a caller adds to a checkpoint (the trainer's training_state.h5): `write` creates them
 * in tmp_dir (DIR.tmp) after the model files and before the fsyncs and the rename, so they appear
 * in DIR together with the model. A non-zero return (a BqStatus) abandons the save and leaves DIR
 * as it was. */
typedef struct BqCkptExtra {
    int (*write)(void *user, const char *tmp_dir);
    void *user;
} BqCkptExtra;

/* extra may be NULL. */
int bq_ckpt_save(const BqBert *m, const char *dir, const char *vocab_dir, const BqCkptExtra *extra);
/* Loads DIR's model into m: when m->params.data is NULL, creates the model from DIR/config.json first
 * (without gradients: a trainer adds them, bq_bert_grad_alloc). When config.json carries a
 * bertqat.quant block and m->quant is NULL, m->quant is created (bq_quant_create; the caller frees it
 * with bq_quant_free). Files added through BqCkptExtra are left to their writer. */
int bq_ckpt_load(BqBert *m, const char *dir);

/* Told by bq_ckpt_load_with after each parameter tensor is read (i: its table index), in table order,
 * with m's quantizers and their ranges already loaded: an inference engine packs its weights as they
 * arrive and may give their fp32 storage back (bq_bert_param_release), so the whole fp32 model is never
 * resident. A non-zero return (a BqStatus) stops the load with that status. */
typedef struct BqCkptLoadHook {
    int (*param_read)(void *user, BqBert *m, int i);
    void *user;
    /* > 0: the word embeddings are not read; the model fetches their rows from model.h5 as it needs them,
     * through a pool of this many rows (bq_bert_word_rows_attach, bq_h5rows_open: the checksum is verified
     * here all the same), where the tensor's layout allows; param_read is still told. The file stays open
     * until the model is freed. */
    int64_t word_rows;
} BqCkptLoadHook;

/* bq_ckpt_load with hook (NULL: none). */
int bq_ckpt_load_with(BqBert *m, const char *dir, const BqCkptLoadHook *hook);

/* HDF5 access for the files added through BqCkptExtra, so they share the model file's dataset
 * format and error messages. f is an open HDF5 file id (hid_t) passed as int64_t; file names it in
 * messages; type is an HDF5 native type id (H5T_NATIVE_INT64, ...). */
/* Datasets GROUP/<parameter name> with the parameter shapes, from/into a block parallel to t->data. */
int bq_ckpt_h5_write_params(int64_t f, const char *file, const char *group, const BqParamTable *t,
                            const float *block);
int bq_ckpt_h5_read_params(int64_t f, const char *file, const char *group, const BqParamTable *t, float *block);
/* Root attribute NAME holding n values of type. */
int bq_ckpt_h5_attr_write(int64_t f, const char *file, const char *name, int64_t type, const void *v, int64_t n);
int bq_ckpt_h5_attr_read(int64_t f, const char *file, const char *name, int64_t type, void *v, int64_t n);
/* 1 when every component of PATH ("/a/b") exists. */
int bq_ckpt_h5_exists(int64_t f, const char *path);
int bq_model_load_any(BqBert *m, const char *dir, int num_labels, BqRng *rng, char **report);
int bq_ckpt_is_native(const char *dir);

#endif
