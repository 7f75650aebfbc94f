/* Set-up shared by the subcommands (see src/cli/cmd_common.h). */
#include "src/cli/cmd_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "export/ckpt.h"
#include "layers/quant.h"
#include "src/dist.h"

const char *const bq_truncation_names[5] = {"head", "tail", "head_tail", "head-tail", NULL};
const int bq_truncation_values[4] = {BQ_TRUNC_HEAD, BQ_TRUNC_TAIL, BQ_TRUNC_HEAD_TAIL, BQ_TRUNC_HEAD_TAIL};

const char *bq_truncation_name(BqTruncation t) { return bq_truncation_names[t]; }

int bq_cli_model_load(BqBert *m, BqTokenizer **tok, const char *dir, int num_labels, uint64_t seed, const char *tag) {
    char vocab[4200], *report = NULL;
    BqRng rng;
    bq_rng_seed(&rng, seed);
    /* The model first: its errors (no config.json, bad weights) say more than a missing vocab.txt. */
    int st = bq_model_load_any(m, dir, num_labels, &rng, &report);
    if (!st && report) fprintf(stderr, "[%s] %s\n", tag, report);
    free(report);
    if (st) return st;
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
    return bq_tokenizer_load(tok, vocab, NULL);
}

/* ---- inference engine ---- */

const char *const bq_cli_engine_names[4] = {"auto", "int8", "fake-quant", NULL};

/* "[tag] engine: int8 ..." on stderr: the integer Linears, the GEMMs (and the calls they take where the
 * widest run in column pieces), the encoder layers that run as fused blocks (the others op by op), the time
 * `what` took, the bytes the engine and the model's fp32 parameters hold, and the encoder Linears that stay
 * fp32. */
static void engine_report(const char *tag, const BqBert *m, const BqInt8Engine *e, const char *what, double secs) {
    char pieces[64] = "";
    if (bq_int8_piece_count(e) != bq_int8_gemm_count(e))
        snprintf(pieces, sizeof pieces, " (%d calls: the widest in column pieces)", bq_int8_piece_count(e));
    fprintf(stderr, "[%s] engine: int8 (%d integer Linears in %d GEMMs%s, %d of %d layers fused, %s in %.0f ms; "
            "%.1f MiB integer weights, %.1f MiB fp32 parameters)\n", tag, bq_int8_linear_count(e),
            bq_int8_gemm_count(e), pieces, bq_int8_fused_layer_count(e), m->cfg.num_hidden_layers, what, secs * 1e3,
            (double)bq_int8_bytes(e) / (1 << 20), (double)bq_bert_param_bytes(m) / (1 << 20));
    char fp32[512];
    if (*bq_int8_fp32_linears(e, fp32, sizeof fp32))
        fprintf(stderr, "[%s] engine: %d encoder Linears stay fp32 (no quantized input or weight): %s\n", tag,
                m->cfg.num_hidden_layers * BQ_LIN_ENCODER - bq_int8_linear_count(e), fp32);
}

int bq_cli_engine_select(BqInt8Engine **out, const BqBert *m, BqCliEngine engine, const char *flag, const char *tag,
                         const char **name) {
    *out = NULL;
    int want_int8 = engine == BQ_CLI_ENGINE_INT8;
    if (!m->quant) {
        if (want_int8)
            return bq_err(BQ_EINVAL, "%s int8: the model has no quantizers (a fp32 checkpoint); the integer "
                          "engine runs PTQ/QAT checkpoints", flag);
        *name = "fp32";
        fprintf(stderr, "[%s] engine: fp32 (the model has no quantizers)\n", tag);
        return BQ_OK;
    }
    if (engine == BQ_CLI_ENGINE_FAKE_QUANT) {
        *name = "fake-quant";
        fprintf(stderr, "[%s] engine: fake-quant (quantized Linears on integers, the rest fp32 on quantized values)\n", tag);
        return BQ_OK;
    }
    double t0 = bq_now();
    int st = bq_int8_prepare(out, m);
    if (st == BQ_EINVAL && !want_int8) {
        fprintf(stderr, "[%s] note: the int8 engine does not run this model (%s); using fake-quant\n", tag,
                bq_errmsg());
        bq_err_clear();
        *out = NULL;
        *name = "fake-quant";
        fprintf(stderr, "[%s] engine: fake-quant (quantized Linears on integers, the rest fp32 on quantized values)\n", tag);
        return BQ_OK;
    }
    if (st) {
        *out = NULL;
        return want_int8 ? bq_err_ctx(st, "%s int8", flag) : st;
    }
    *name = "int8";
    engine_report(tag, m, *out, "packed", bq_now() - t0);
    return BQ_OK;
}

/* Rows of the word embeddings an evaluation holds (bq_bert_word_rows_attach), more where one batch needs
 * more: 6 MiB at BERT-base's width against the table's 89 MiB. The frequent words stay (the pool's clock),
 * so 2,000 IMDB reviews at batch 32 fetch a row for about one token in six, at about 0.6 µs a row. */
#define WORD_ROWS_POOL 2048

/* The hook of bq_cli_model_load_engine's load: at the first parameter (the quantizers are loaded by
 * then) it begins the engine, then packs each group of a layer's Linears as its parameters arrive. Where
 * the engine refuses the model (BQ_EINVAL) it stays out, and bq_cli_engine_select gives the refusal or
 * the fallback. */
typedef struct EngineLoad {
    BqInt8Engine *e;
    int begun;
} EngineLoad;

static int engine_load_step(void *user, BqBert *m, int i) {
    EngineLoad *el = user;
    if (!el->begun) {
        el->begun = 1;
        int st = m->quant ? bq_int8_begin(&el->e, m) : BQ_OK;
        if (st == BQ_EINVAL) bq_err_clear();
        else if (st) return st;
    }
    return el->e ? bq_int8_load_step(el->e, m, i) : BQ_OK;
}

int bq_cli_model_load_engine(BqBert *m, BqTokenizer **tok, const char *dir, BqCliEngine engine, const char *tag,
                             BqInt8Engine **out, const char **name) {
    *out = NULL;
    int st;
    if (engine == BQ_CLI_ENGINE_FAKE_QUANT || !bq_ckpt_is_native(dir)) {
        if ((st = bq_cli_model_load(m, tok, dir, 0, 0, tag))) return st;
        return bq_cli_engine_select(out, m, engine, "--engine", tag, name);
    }
    EngineLoad el = {0};
    BqCkptLoadHook hook = {.param_read = engine_load_step, .user = &el, .word_rows = WORD_ROWS_POOL};
    double t0 = bq_now();
    char vocab[4200];
    snprintf(vocab, sizeof vocab, "%s/vocab.txt", dir);
    if ((st = bq_ckpt_load_with(m, dir, &hook)) || (st = bq_tokenizer_load(tok, vocab, NULL))) {
        bq_int8_free(el.e);
        return st;
    }
    if (m->word_rows)
        fprintf(stderr, "[%s] word embeddings: rows read from %s/model.h5 as the texts need them, at most %d held "
                "(%.1f MiB; the table is %.1f MiB)\n", tag, dir, WORD_ROWS_POOL,
                (double)WORD_ROWS_POOL * m->cfg.hidden_size * 4 / (1 << 20),
                (double)m->cfg.vocab_size * m->cfg.hidden_size * 4 / (1 << 20));
    if (!el.e) return bq_cli_engine_select(out, m, engine, "--engine", tag, name);
    *out = el.e;
    *name = "int8";
    engine_report(tag, m, *out, "packed while loading, load", bq_now() - t0);
    return BQ_OK;
}

/* ---- data flags ---- */

/* One column setting: the flag, else the record; *from names where it came from. */
static int resolve_column(char *dst, const char *flag_value, const BqDataMeta *rec, const char *recorded,
                          const char *flag, const char **from) {
    const char *v = flag_value ? flag_value : recorded;
    *from = flag_value ? "flag" : rec->max_seq_len > 0 ? "checkpoint" : "default";
    if (strlen(v) >= BQ_COLUMN_MAX) return bq_err(BQ_EINVAL, "--%s: name longer than %d bytes", flag, BQ_COLUMN_MAX - 1);
    strcpy(dst, v);
    return BQ_OK;
}

int bq_cli_data_resolve(BqCliData *d, const BqBert *m, const char *tag) {
    static const BqDataMeta none;
    const BqDataMeta *rec = m ? &m->data : &none;
    BqDataMeta *u = &d->used;
    memset(u, 0, sizeof *u);
    const char *f_len, *f_trunc, *f_text, *f_pair, *f_label;
    if (d->max_seq_len > 0 && d->max_seq_len < 8)
        return bq_err(BQ_EINVAL, "--max-seq-len: %d is too short (at least 8 tokens, or 0 for the checkpoint's)",
                      d->max_seq_len);
    u->max_seq_len = d->max_seq_len > 0 ? d->max_seq_len : rec->max_seq_len > 0 ? rec->max_seq_len : 128;
    f_len = d->max_seq_len > 0 ? "flag" : rec->max_seq_len > 0 ? "checkpoint" : "default";
    u->truncation = rec->max_seq_len > 0 ? rec->truncation : BQ_TRUNC_HEAD;
    f_trunc = d->truncation >= 0 ? "flag" : rec->max_seq_len > 0 ? "checkpoint" : "default";
    if (d->truncation >= 0) u->truncation = (BqTruncation)d->truncation;
    int st;
    if ((st = resolve_column(u->text_column, d->text_column, rec, rec->text_column, "text-column", &f_text)) ||
        (st = resolve_column(u->text_pair_column, d->text_pair_column, rec, rec->text_pair_column, "text-pair-column",
                             &f_pair)) ||
        (st = resolve_column(u->label_column, d->label_column, rec, rec->label_column, "label-column", &f_label)))
        return st;
    if (m && u->max_seq_len > m->cfg.max_position_embeddings)
        return bq_err(BQ_EINVAL, "--max-seq-len: %d exceeds the model's max_position_embeddings %d", u->max_seq_len,
                      m->cfg.max_position_embeddings);
    if (!tag) return BQ_OK;
    fprintf(stderr, "[%s] encoding: max_seq_len %d (%s), truncation %s (%s), text column %s (%s), pair column %s (%s), "
            "label column %s (%s)\n", tag, u->max_seq_len, f_len, bq_truncation_name(u->truncation), f_trunc,
            u->text_column[0] ? u->text_column : "auto", f_text, u->text_pair_column[0] ? u->text_pair_column : "none",
            f_pair, u->label_column[0] ? u->label_column : "auto", f_label);
    return BQ_OK;
}

void bq_cli_data_spec(BqDataSpec *spec, const BqCliData *d, const char *split, uint64_t seed) {
    bq_data_spec_default(spec);
    spec->path = d->path;
    spec->split = split;
    spec->max_seq_len = d->used.max_seq_len;
    spec->truncation = d->used.truncation;
    spec->text_column = d->used.text_column[0] ? d->used.text_column : NULL;
    spec->text_pair_column = d->used.text_pair_column[0] ? d->used.text_pair_column : NULL;
    spec->label_column = d->used.label_column[0] ? d->used.label_column : NULL;
    spec->cache_dir = d->no_cache ? "" : d->cache_dir;
    spec->seed = seed;
}

int bq_cli_model_fit(BqBert *m, const char *dir, const BqDataset *ds, uint64_t seed, const char *tag) {
    int native = bq_ckpt_is_native(dir);
    int want = ds->nlabels > 0 ? ds->nlabels : m->cfg.num_labels;
    if (want != m->cfg.num_labels || !native) {
        /* A Hugging Face directory gets the classifier for the data's labels with the seeded init (the same
         * parameters whatever the first load drew); a native checkpoint refuses other labels. */
        BqDataMeta keep = m->data;
        if (m->quant) bq_quant_free(m->quant), m->quant = NULL;
        bq_bert_free(m);
        BqRng rng;
        bq_rng_seed(&rng, seed);
        char *report = NULL;
        int st = bq_model_load_any(m, dir, want, &rng, &report);
        if (!st && report) fprintf(stderr, "[%s] %s\n", tag, report);
        free(report);
        if (st) return st;
        m->data = keep;
    }
    /* Label names from the data (Hugging Face directories carry LABEL_0.. placeholders). */
    if (!native && m->cfg.id2label && ds->label_names) {
        for (int i = 0; i < m->cfg.num_labels && i < ds->nlabels; i++) {
            free(m->cfg.id2label[i]);
            m->cfg.id2label[i] = bq_strdup(ds->label_names[i]);
        }
    }
    return BQ_OK;
}

/* ---- training flags ---- */

void bq_cli_train_default(BqTrainConfig *tc, BqCliSplits *s, double lr) {
    bq_train_config_default(tc);
    tc->lr = lr;
    memset(s, 0, sizeof *s);
    s->batch_size = 32, s->val_fraction = 0.1, s->dropout = -1;
}

int bq_cli_splits_load(BqCliSplits *s, BqBert *m, const char *dir, BqCliData *d, uint64_t seed,
                       const BqTokenizer *tok, const char *tag) {
    if (s->batch_size % bq_dist_size())
        return bq_err(BQ_EINVAL, "--batch-size %d: the global batch must be a multiple of the %d MPI ranks",
                      s->batch_size, bq_dist_size());
    int st = bq_cli_data_resolve(d, m, tag);
    if (st) return st;
    BqDataSpec spec;
    bq_cli_data_spec(&spec, d, "train", seed);
    spec.val_fraction = s->val_fraction;
    spec.train_samples = s->train_samples;
    if ((st = bq_dataset_load(&s->train, &spec, tok))) return st;
    if (s->train->nlabels < 2)
        return bq_err(BQ_EINVAL, "%s: training data needs labels of at least 2 classes (found %d)", d->path,
                      s->train->nlabels);
    if (s->val_fraction > 0) {
        spec.split = "val";
        if ((st = bq_dataset_load(&s->val, &spec, tok))) return st;
        if (s->eval_samples > 0 && s->val->n > s->eval_samples) s->val->n = s->eval_samples; /* prefix stays valid */
        if (s->val->n == 0) bq_dataset_free(s->val), s->val = NULL;
    }
    fprintf(stderr, "[%s] %lld training, %lld validation examples (%s); %s\n", tag, (long long)s->train->n,
            (long long)(s->val ? s->val->n : 0), d->path, bq_runtime_describe());
    if ((st = bq_cli_model_fit(m, dir, s->train, seed, tag))) return st;
    if (s->dropout >= 0) m->cfg.hidden_dropout_prob = m->cfg.attention_probs_dropout_prob = (float)s->dropout;
    if ((st = bq_batcher_init(&s->btrain, s->train, s->batch_size, 1, seed, s->bucket))) return st;
    bq_batch_source_batcher(&s->strain, &s->bs_train, &s->btrain);
    if (s->val) {
        if ((st = bq_batcher_init(&s->bval, s->val, s->batch_size, 0, seed, 1))) return st;
        bq_batch_source_batcher(&s->sval, &s->bs_val, &s->bval);
    }
    return BQ_OK;
}

void bq_cli_splits_free(BqCliSplits *s) {
    if (s->btrain.ds) bq_batcher_free(&s->btrain);
    if (s->bval.ds) bq_batcher_free(&s->bval);
    bq_dataset_free(s->train);
    bq_dataset_free(s->val);
    memset(s, 0, sizeof *s);
}

int bq_cli_train_run(BqBert *m, const BqTrainConfig *tc, BqPrecision prec, BqBatchSource *train,
                     BqBatchSource *val, const BqCliData *d, const char *out, BqTrainResult *res) {
    m->prec = prec;
    m->data = d->used;
    memset(res, 0, sizeof *res);
    int st = bq_train(m, tc, train, val, out, res);
    if (st) return st;
    printf("%s: %lld steps in %.1fs (%.3f s/step), last loss %.4f", tc->tag, (long long)res->steps, res->seconds,
           res->steps > 0 ? res->seconds / (double)res->steps : 0.0, res->last_loss);
    if (res->best_accuracy >= 0)
        printf(", best validation accuracy %.4f (step %lld)", res->best_accuracy, (long long)res->best_step);
    return BQ_OK;
}

/* ---- the Python helper scripts ---- */

/* The two roots of the lookup (src/cli/cmd_common.h): roots[0] the executable's folder, roots[1] its parent
 * ("/" when the folder is "/"). */
static int exe_roots(char roots[2][4096]) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0 || n >= (ssize_t)sizeof exe - 1)
        return bq_err(BQ_EIO, "cannot locate the bertqat executable (/proc/self/exe)");
    exe[n] = '\0';
    for (int k = 0; k < 2; k++) {
        char *slash = strrchr(exe, '/');
        if (!slash) return bq_err(BQ_EIO, "cannot locate the bertqat executable (/proc/self/exe is %s)", exe);
        if (slash == exe) slash[1] = '\0'; /* the root folder stays "/" */
        else slash[0] = '\0';
        snprintf(roots[k], sizeof roots[k], "%s", exe);
    }
    return BQ_OK;
}

/* ROOT + "/" + rest into out; 0 when it fits. */
static int path_join2(char *out, size_t n, const char *root, const char *rest) {
    int len = snprintf(out, n, "%s%s%s", root, strcmp(root, "/") ? "/" : "", rest);
    return len < 0 || (size_t)len >= n;
}

int bq_cli_script_path(const char *name, char *out, size_t n) {
    char roots[2][4096], rest[512];
    int st = exe_roots(roots);
    if (st) return st;
    snprintf(rest, sizeof rest, "share/bertqat/scripts/%s", name);
    for (int k = 0; k < 2; k++)
        if (!path_join2(out, n, roots[k], rest) && bq_is_file(out)) return BQ_OK;
    return bq_err(BQ_EIO, "helper script %s not found in %s%sshare/bertqat/scripts or %s%sshare/bertqat/scripts (the "
                  "build copies the scripts there, `cmake --install` installs them)", name, roots[0],
                  strcmp(roots[0], "/") ? "/" : "", roots[1], strcmp(roots[1], "/") ? "/" : "");
}

int bq_cli_python_path(const char *flag, char *out, size_t n) {
    const char *env = getenv("BQ_PYTHON"), *given = flag && *flag ? flag : env && *env ? env : NULL;
    if (given) {
        if (snprintf(out, n, "%s", given) >= (int)n) return bq_err(BQ_EINVAL, "--python: path too long");
        return BQ_OK;
    }
    char roots[2][4096], tried[2][4200];
    int st = exe_roots(roots);
    if (st) return st;
    for (int k = 0; k < 2; k++) {
        if (path_join2(tried[k], sizeof tried[k], roots[k], ".venv/bin/python")) tried[k][0] = '\0';
        if (tried[k][0] && access(tried[k], X_OK) == 0) {
            if (snprintf(out, n, "%s", tried[k]) >= (int)n) return bq_err(BQ_EINVAL, "--python: path too long");
            return BQ_OK;
        }
    }
    return bq_err(BQ_EINVAL, "no Python with onnxruntime for the ONNX Runtime scripts: give --python PATH, set "
                  "BQ_PYTHON, or create a venv at %s%s.venv (looked for %s and %s)", roots[1],
                  strcmp(roots[1], "/") ? "/" : "", tried[0], tried[1]);
}
