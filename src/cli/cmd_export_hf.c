/* `bertqat export-hf --model CKPT --out DIR`: writes a Hugging Face BertForSequenceClassification
 * directory that transformers loads with from_pretrained (and the safetensors library reads):
 *   DIR/config.json         BertConfig keys, architectures, id2label/label2id, "bertqat" provenance
 *   DIR/model.safetensors   every parameter under its HF state-dict name, float32
 *   DIR/vocab.txt (+ tokenizer_config.json, special_tokens_map.json, tokenizer.json when present)
 * The directory is assembled as DIR.tmp and put in place of DIR (bq_replace_dir: an existing export
 * is swapped out in one step); anything at DIR but an earlier export is refused. Quantizer ranges of
 * a QAT checkpoint have no place in the HF format: the fp32 (shadow) weights are exported and a note
 * says so. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "export/ckpt.h"
#include "export/hf_load.h"
#include "layers/config.h"
#include "layers/quant.h"
#include "src/cli/args.h"
#include "src/cli/cli.h"

#define PATH_LEN 4096

/* rm -r of a directory holding only plain files (what this command writes). */
static void remove_flat_dir(const char *dir) {
    static const char *const files[] = {"config.json", "model.safetensors", "model.safetensors.tmp",
                                        "config.json.tmp", "vocab.txt", "tokenizer_config.json",
                                        "special_tokens_map.json", "tokenizer.json"};
    char p[PATH_LEN + 64];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* Writes the export into tmp (an empty directory). */
static int write_export(const BqBert *m, const char *model_dir, const char *tmp) {
    char p[PATH_LEN + 64], s[PATH_LEN + 64];
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    int rc = bq_hf_save_safetensors(m, p);
    if (rc) return rc;
    json_t *extra = json_pack("{s:s,s:s,s:b}", "exported_by", "bertqat " BQ_VERSION_STRING, "source", model_dir,
                              "quantized_source", m->quant != NULL);
    snprintf(p, sizeof p, "%s/config.json", tmp);
    rc = bq_config_save(&m->cfg, p, extra);
    json_decref(extra);
    if (rc) return rc;
    static const char *const tok_files[] = {"vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
                                            "tokenizer.json"};
    for (size_t i = 0; i < sizeof tok_files / sizeof *tok_files && !rc; i++) {
        snprintf(s, sizeof s, "%s/%s", model_dir, tok_files[i]);
        if (!bq_is_file(s)) {
            if (i == 0) fprintf(stderr, "[export-hf] note: %s has no vocab.txt; the export has no tokenizer\n", model_dir);
            continue;
        }
        snprintf(p, sizeof p, "%s/%s", tmp, tok_files[i]);
        rc = bq_copy_file(s, p);
    }
    if (!rc) rc = bq_fsync_path(tmp);
    return rc;
}

/* An earlier export (or an empty directory) may be replaced; anything else is refused. */
static int replaceable(const char *out) {
    char p[PATH_LEN + 64];
    snprintf(p, sizeof p, "%s/model.safetensors", out);
    if (bq_is_file(p)) return 1;
    return rmdir(out) == 0 || errno == ENOENT; /* empty: removed now */
}

int bq_cmd_export_hf(int argc, char **argv) {
    const char *model = NULL, *out = NULL;
    const BqArgSpec specs[] = {
        {"model", BQ_ARG_STR, &model, "native checkpoint directory (or a Hugging Face directory)", 1, 0, 0},
        {"out", BQ_ARG_OUT, &out, "output directory (written as OUT.tmp, then swapped in)", 1, 0, 0},
    };
    BqArgs args = {.cmd = "export-hf", .usage = "--model CKPT --out DIR",
                   .summary = "Export a checkpoint as a Hugging Face BertForSequenceClassification directory "
                              "(config.json, model.safetensors, tokenizer files).",
                   .specs = specs, .nspecs = (int)(sizeof specs / sizeof *specs)};
    int rc = bq_args_parse(&args, argc, argv);
    if (rc || args.help) return rc;
    char tmp[PATH_LEN], old[PATH_LEN];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", out) >= (int)sizeof tmp ||
        snprintf(old, sizeof old, "%s.old", out) >= (int)sizeof old)
        return bq_err(BQ_EINVAL, "--out: path too long");
    if (!bq_is_dir(model)) return bq_err(BQ_EIO, "--model: %s is not a directory", model);
    if ((rc = bq_check_writable_parent(out))) return rc;

    BqBert m;
    memset(&m, 0, sizeof m);
    char *report = NULL;
    BqRng rng;
    bq_rng_seed(&rng, 0);
    rc = bq_model_load_any(&m, model, 0, &rng, &report);
    if (rc) goto cleanup;
    if (report) fprintf(stderr, "[export-hf] %s\n", report);
    if (m.quant)
        fprintf(stderr, "[export-hf] note: %s is quantized; the HF export holds its fp32 weights without the "
                        "quantizer ranges (use `bertqat export` for ONNX with Q/DQ)\n", model);

    if (bq_is_dir(out) || bq_is_file(out)) {
        if (!bq_is_dir(out) || !replaceable(out)) {
            rc = bq_err(BQ_EINVAL, "--out: %s exists and is not an earlier export; refusing to replace it", out);
            goto cleanup;
        }
    }
    remove_flat_dir(tmp); /* leftover of an interrupted run */
    if (mkdir(tmp, 0755) != 0) {
        rc = bq_err(BQ_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        goto cleanup;
    }
    if ((rc = write_export(&m, model, tmp))) {
        remove_flat_dir(tmp);
        goto cleanup;
    }
    remove_flat_dir(old); /* leftover of an interrupted run */
    const char *leftover;
    if ((rc = bq_replace_dir(tmp, out, old, &leftover))) {
        remove_flat_dir(tmp);
        goto cleanup;
    }
    if (leftover) remove_flat_dir(leftover);
    int64_t count = 0;
    for (int i = 0; i < m.params.n; i++) count += m.params.p[i].numel;
    printf("export-hf: wrote %s (%d tensors, %lld parameters, %d labels)\n", out, m.params.n, (long long)count,
           m.cfg.num_labels);
cleanup:
    free(report);
    if (m.quant) bq_quant_free(m.quant);
    bq_bert_free(&m);
    return rc;
}
