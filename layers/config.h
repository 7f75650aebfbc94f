/* Hugging Face BertConfig (config.json) writing, reading being declared in layers/bert.h; the atomic
 * JSON file writer that config.json and the reports of the layers above share. */
#ifndef BQ_CONFIG_H
#define BQ_CONFIG_H

#include <jansson.h>

#include "layers/bert.h"

/* Writes cfg as a transformers-loadable config.json (architectures BertForSequenceClassification
 * or BertForQuestionAnswering by cfg->head,
 * model_type bert, hidden_act gelu, id2label / label2id, ...) to PATH atomically. extra (may be
 * NULL, not stolen) is stored under the key "bertqat". */
int bq_config_save(const BqBertConfig *cfg, const char *path, json_t *extra);
/* The same object, for callers that add keys before writing (new reference). */
json_t *bq_config_to_json(const BqBertConfig *cfg);
/* Writes j to path atomically with jansson's dump flags: to "<path>.tmp", then bq_rename_durable (nothing
 * is left at <path>.tmp on error). j is not stolen. Errors (BQ_EINVAL, BQ_EIO) name the file. */
int bq_json_save(json_t *j, const char *path, size_t flags);

#endif
