/* training_state.h5 (layout in train_state.h), written through export/ckpt.h's BqCkptExtra hook and
 * dataset helpers so that it shares the checkpoint's atomic replacement and dataset format. */
#include "src/train_state.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "export/ckpt.h"
#include "export/h5sum.h"
#include "export/quant_io.h"
#include "layers/quant.h"

#define PATH_LEN 4400

typedef struct SaveCtx {
    const BqBert *m;
    const BqTrainState *ts;
    const BqCkptExtra *more;
} SaveCtx;

static int put_i64(hid_t f, const char *path, const char *name, int64_t v) {
    return bq_ckpt_h5_attr_write(f, path, name, H5T_NATIVE_INT64, &v, 1);
}

static int put_f64(hid_t f, const char *path, const char *name, double v) {
    return bq_ckpt_h5_attr_write(f, path, name, H5T_NATIVE_DOUBLE, &v, 1);
}

/* A fixed-length string root attribute. */
static int put_str(hid_t f, const char *path, const char *name, const char *v) {
    hid_t ty = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR), a = -1;
    int ok = ty >= 0 && sp >= 0 && H5Tset_size(ty, strlen(v) + 1) >= 0 &&
             (a = H5Acreate2(f, name, ty, sp, H5P_DEFAULT, H5P_DEFAULT)) >= 0 && H5Awrite(a, ty, v) >= 0;
    int st = ok ? BQ_OK : bq_err(BQ_EIO, "%s: cannot write attribute %s%s", path, name, bq_h5_io_reason());
    if (a >= 0 && H5Aclose(a) < 0 && !st)
        st = bq_err(BQ_EIO, "%s: cannot write attribute %s%s", path, name, bq_h5_io_reason());
    if (sp >= 0) H5Sclose(sp);
    if (ty >= 0) H5Tclose(ty);
    return st;
}

static int write_state(void *user, const char *tmp_dir) {
    const SaveCtx *c = user;
    const BqTrainState *ts = c->ts;
    const BqParamTable *t = &c->m->params;
    char path[PATH_LEN];
    snprintf(path, sizeof path, "%s/training_state.h5", tmp_dir);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return bq_err(BQ_EIO, "%s: cannot create%s", path, bq_h5_io_reason());
    int st = put_i64(f, path, "format_version", BQ_CKPT_FORMAT_VERSION);
    if (!st) st = put_i64(f, path, "step", ts->step);
    if (!st) st = put_i64(f, path, "epoch", ts->epoch);
    if (!st) st = put_i64(f, path, "batch_cursor", ts->batch_cursor);
    if (!st) st = put_i64(f, path, "total_steps", ts->total_steps);
    if (!st) st = put_i64(f, path, "warmup_steps", ts->warmup_steps);
    if (!st) st = put_i64(f, path, "adam_step", ts->opt ? ts->opt->step : 0);
    if (!st) st = put_i64(f, path, "best_step", ts->best_step);
    if (!st) st = put_f64(f, path, "lr", ts->lr);
    if (!st) st = put_f64(f, path, "best_accuracy", ts->best_accuracy);
    if (!st) st = bq_ckpt_h5_attr_write(f, path, "seed", H5T_NATIVE_UINT64, &ts->seed, 1);
    if (!st) st = bq_ckpt_h5_attr_write(f, path, "rng", H5T_NATIVE_UINT64, ts->rng.s, 4);
    if (!st && ts->precision) st = put_str(f, path, "precision", ts->precision);
    if (ts->opt) {
        if (!st) st = put_f64(f, path, "beta1", ts->opt->beta1);
        if (!st) st = put_f64(f, path, "beta2", ts->opt->beta2);
        if (!st) st = put_f64(f, path, "eps", ts->opt->eps);
        if (!st) st = put_f64(f, path, "weight_decay", ts->opt->weight_decay);
        if (!st) st = bq_ckpt_h5_write_params(f, path, "adam/m", t, ts->opt->m);
        if (!st) st = bq_ckpt_h5_write_params(f, path, "adam/v", t, ts->opt->v);
    }
    if (!st && ts->best_params) st = bq_ckpt_h5_write_params(f, path, "best", t, ts->best_params);
    /* --ranges learn: the scales' moments (and best copy); the scales themselves are in model.h5 */
    if (!st && c->m->quant) st = bq_quant_learn_save_hdf5(c->m->quant, (int64_t)f, path, ts->best_params != NULL);
    /* the metadata (and any chunk still cached) is written here: a full disk may only show now */
    if (H5Fclose(f) < 0 && !st) st = bq_err(BQ_EIO, "%s: cannot write%s", path, bq_h5_io_reason());
    if (!st) st = bq_fsync_path(path);
    if (!st && c->more) st = c->more->write(c->more->user, tmp_dir);
    return st;
}

int bq_train_state_save(const BqBert *m, const char *dir, const char *vocab_dir, const BqTrainState *ts) {
    return bq_train_state_save_with(m, dir, vocab_dir, ts, NULL);
}

int bq_train_state_save_with(const BqBert *m, const char *dir, const char *vocab_dir, const BqTrainState *ts,
                             const BqCkptExtra *more) {
    SaveCtx c = {.m = m, .ts = ts, .more = more};
    BqCkptExtra extra = {.write = write_state, .user = &c};
    return bq_ckpt_save(m, dir, vocab_dir, &extra);
}

static int get_i64(hid_t f, const char *path, const char *name, int64_t *v) {
    return bq_ckpt_h5_attr_read(f, path, name, H5T_NATIVE_INT64, v, 1);
}

static int get_f64(hid_t f, const char *path, const char *name, double *v) {
    return bq_ckpt_h5_attr_read(f, path, name, H5T_NATIVE_DOUBLE, v, 1);
}

/* The root string attribute "precision" as "fp32" or "bf16" (static strings); NULL when absent (a
 * state written before precisions were recorded counts as fp32 for the caller). Other values are
 * BQ_EFORMAT naming the file. */
static int get_precision(hid_t f, const char *path, const char **out) {
    *out = NULL;
    if (H5Aexists(f, "precision") <= 0) return BQ_OK;
    char v[16] = "";
    hid_t a = H5Aopen(f, "precision", H5P_DEFAULT), ty = H5Tcopy(H5T_C_S1), fty = a >= 0 ? H5Aget_type(a) : -1;
    int ok = a >= 0 && ty >= 0 && fty >= 0 && H5Tget_class(fty) == H5T_STRING && !H5Tis_variable_str(fty) &&
             H5Tget_size(fty) <= sizeof v && H5Tset_size(ty, sizeof v) >= 0 && H5Aread(a, ty, v) >= 0;
    v[sizeof v - 1] = 0;
    if (fty >= 0) H5Tclose(fty);
    if (ty >= 0) H5Tclose(ty);
    if (a >= 0) H5Aclose(a);
    if (ok && !strcmp(v, "fp32")) *out = "fp32";
    else if (ok && !strcmp(v, "bf16")) *out = "bf16";
    else return bq_err(BQ_EFORMAT, "%s: attribute precision is not fp32 or bf16", path);
    return BQ_OK;
}

static int read_state(const BqBert *m, BqTrainState *ts, const char *path) {
    const BqParamTable *t = &m->params;
    H5E_auto2_t fn;
    void *data;
    H5Eget_auto2(H5E_DEFAULT, &fn, &data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    int st = BQ_OK;
    ts->best_params = NULL;
    if (f < 0) {
        st = bq_err(BQ_EIO, "%s: cannot open (not an HDF5 file?)", path);
        goto cleanup;
    }
    int64_t fv = 0, adam_step = 0;
    st = get_i64(f, path, "format_version", &fv);
    if (!st && fv != BQ_CKPT_FORMAT_VERSION)
        st = bq_err(BQ_EFORMAT, "%s: format version %lld, this build reads %d", path, (long long)fv,
                    BQ_CKPT_FORMAT_VERSION);
    if (!st) st = get_i64(f, path, "step", &ts->step);
    if (!st) st = get_i64(f, path, "epoch", &ts->epoch);
    if (!st) st = get_i64(f, path, "batch_cursor", &ts->batch_cursor);
    if (!st) st = get_i64(f, path, "total_steps", &ts->total_steps);
    if (!st) st = get_i64(f, path, "warmup_steps", &ts->warmup_steps);
    if (!st) st = get_i64(f, path, "adam_step", &adam_step);
    if (!st) st = get_i64(f, path, "best_step", &ts->best_step);
    if (!st) st = get_f64(f, path, "lr", &ts->lr);
    if (!st) st = get_f64(f, path, "best_accuracy", &ts->best_accuracy);
    if (!st) st = bq_ckpt_h5_attr_read(f, path, "seed", H5T_NATIVE_UINT64, &ts->seed, 1);
    if (!st) st = bq_ckpt_h5_attr_read(f, path, "rng", H5T_NATIVE_UINT64, ts->rng.s, 4);
    if (!st) st = get_precision(f, path, &ts->precision);
    if (!st && ts->opt) {
        BQ_CHECK(ts->opt->total == t->total);
        ts->opt->step = adam_step;
        double b1, b2, eps, wd;
        if (!st) st = get_f64(f, path, "beta1", &b1);
        if (!st) st = get_f64(f, path, "beta2", &b2);
        if (!st) st = get_f64(f, path, "eps", &eps);
        if (!st) st = get_f64(f, path, "weight_decay", &wd);
        if (!st) {
            ts->opt->beta1 = (float)b1, ts->opt->beta2 = (float)b2, ts->opt->eps = (float)eps;
            ts->opt->weight_decay = (float)wd;
        }
        if (!st) st = bq_ckpt_h5_read_params(f, path, "adam/m", t, ts->opt->m);
        if (!st) st = bq_ckpt_h5_read_params(f, path, "adam/v", t, ts->opt->v);
    }
    if (!st && bq_ckpt_h5_exists(f, "/best")) {
        /* zeroed: the table may have padding between tensors that the reader leaves alone, and the
         * trainer copies the whole block back */
        ts->best_params = bq_calloc((size_t)t->total, sizeof(float));
        st = bq_ckpt_h5_read_params(f, path, "best", t, ts->best_params);
        if (st) free(ts->best_params), ts->best_params = NULL;
    }
    if (!st && ts->opt) {
        int has_best = 0;
        st = bq_quant_learn_load_hdf5(m->quant, (int64_t)f, path, &has_best);
        if (!st && ts->best_params && m->quant && m->quant->lsq && !has_best)
            st = bq_err(BQ_EFORMAT, "%s: /lsq/best is missing (the best parameters are there)", path);
        if (st) free(ts->best_params), ts->best_params = NULL;
    }
cleanup:
    if (f >= 0) H5Fclose(f);
    H5Eset_auto2(H5E_DEFAULT, fn, data);
    return st;
}

int bq_train_state_load(BqBert *m, const char *dir, BqTrainState *ts) {
    int st = bq_ckpt_load(m, dir);
    if (st) return st;
    char path[PATH_LEN];
    snprintf(path, sizeof path, "%s/training_state.h5", dir);
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
        return bq_err(BQ_EIO, "%s: missing (no training state to resume from)", path);
    return read_state(m, ts, path);
}
