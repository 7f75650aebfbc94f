/* Loading a Hugging Face BERT directory (config.json + model.safetensors, or tf_model.h5) into a
 * BqBert with BertForSequenceClassification parameter names, mirroring what
 * BertForSequenceClassification.from_pretrained does for a base BertModel checkpoint. */
#ifndef BQ_HF_LOAD_H
#define BQ_HF_LOAD_H

#include "autograd/bq.h"
#include "layers/bert.h"

/* Reads DIR/config.json (bq_config_load), overrides num_labels when num_labels > 0 (labels then
 * "LABEL_i" unless the config already has that many), creates m without gradients (bq_bert_create; a trainer adds them), and
 * loads DIR/model.safetensors (else DIR/tf_model.h5; DIR/pytorch_model.bin alone is an error telling
 * the user to convert). Tensor names are accepted with or without the "bert." prefix;
 * "embeddings.position_ids" and other buffers with "position_ids" are ignored. Parameters absent
 * from the file: the pooler and classifier keep their fresh initialisation and are listed in *report
 * (like HF's "newly initialized" warning; *report is NULL when nothing is missing; caller frees);
 * any other missing parameter, an unknown tensor, or a shape mismatch is BQ_EFORMAT naming the
 * tensor with the expected and found shapes. On error m is freed and zeroed. */
int bq_hf_load(BqBert *m, const char *dir, int num_labels, BqRng *rng, char **report);

/* Loads parameters only, into an already created m (shapes must match), from a safetensors file or
 * a tf_model.h5 (chosen by extension). Same naming and missing-parameter rules; *report as above. */
int bq_hf_load_weights(BqBert *m, const char *path, char **report);

/* Writes m's parameters as DIR_FILE (model.safetensors) with BertForSequenceClassification names. */
int bq_hf_save_safetensors(const BqBert *m, const char *path);

#endif
