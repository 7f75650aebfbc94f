/* Distillation set-up and record (see src/distill.h). Reference for the loss: Hinton, Vinyals, Dean,
 * "Distilling the Knowledge in a Neural Network" (2015), the T² factor keeping the soft-target gradients
 * on the scale of the hard-target ones. */
#include "src/distill.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "export/ckpt.h"
#include "layers/quant.h"

int bq_distill_check_flags(double alpha, double temperature, double hidden_weight) {
    if (!(alpha >= 0.0 && alpha <= 1.0)) return bq_err(BQ_EINVAL, "--distill-alpha: %g is not in [0, 1]", alpha);
    if (!(temperature > 0.0)) return bq_err(BQ_EINVAL, "--distill-temperature: %g is not > 0", temperature);
    if (!(hidden_weight >= 0.0)) return bq_err(BQ_EINVAL, "--distill-hidden: %g is not >= 0", hidden_weight);
    return BQ_OK;
}

/* Reads a whole (small) file; *len receives its size. NULL with errno set when it cannot. */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = bq_malloc(cap);
    size_t k;
    while ((k = fread(buf + n, 1, cap - n, f)) > 0) {
        n += k;
        if (n == cap) buf = bq_realloc(buf, cap *= 2);
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

int bq_distill_load_teacher(BqBert *teacher, const char *teacher_dir, const BqBert *student, const char *student_dir,
                            double hidden_weight) {
    char tv[4200], sv[4200], *report = NULL, *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    BqRng rng;
    bq_rng_seed(&rng, 42);
    memset(teacher, 0, sizeof *teacher);
    int st = bq_model_load_any(teacher, teacher_dir, 0, &rng, &report);
    free(report);
    if (st) {
        bq_err_ctx(st, "--teacher");
        goto cleanup;
    }
    snprintf(tv, sizeof tv, "%s/vocab.txt", teacher_dir);
    snprintf(sv, sizeof sv, "%s/vocab.txt", student_dir);
    if (!(a = slurp(tv, &na))) {
        st = bq_err(BQ_EIO, "--teacher: cannot read %s: %s", tv, strerror(errno));
        goto cleanup;
    }
    if (!(b = slurp(sv, &nb))) {
        st = bq_err(BQ_EIO, "%s: cannot read: %s", sv, strerror(errno));
        goto cleanup;
    }
    if (na != nb || memcmp(a, b, na) || teacher->cfg.vocab_size != student->cfg.vocab_size) {
        st = bq_err(BQ_EINVAL, "--teacher: %s differs from the student's %s (the teacher must use the same "
                    "tokenizer and vocabulary)", tv, sv);
        goto cleanup;
    }
    if (hidden_weight > 0 && (teacher->cfg.hidden_size != student->cfg.hidden_size ||
                              teacher->cfg.num_hidden_layers != student->cfg.num_hidden_layers)) {
        st = bq_err(BQ_EINVAL, "--distill-hidden: the teacher %s has %d layers of hidden size %d, the student %d of "
                    "%d; the hidden-state term needs the same (use --distill-hidden 0)", teacher_dir,
                    teacher->cfg.num_hidden_layers, teacher->cfg.hidden_size, student->cfg.num_hidden_layers,
                    student->cfg.hidden_size);
        goto cleanup;
    }
cleanup:
    free(a);
    free(b);
    if (st) {
        if (teacher->quant) bq_quant_free(teacher->quant), teacher->quant = NULL;
        bq_bert_free(teacher);
    }
    return st;
}

int bq_distill_check_labels(const BqBert *teacher, const BqBert *student) {
    if (teacher->cfg.num_labels != student->cfg.num_labels)
        return bq_err(BQ_EINVAL, "--teacher: the teacher has %d labels, the student %d", teacher->cfg.num_labels,
                      student->cfg.num_labels);
    return BQ_OK;
}

int bq_distill_record_write(const BqDistill *d, const char *dir) {
    if (!d) return BQ_OK;
    char path[4200], abs[PATH_MAX];
    snprintf(path, sizeof path, "%s/distill.json", dir);
    const char *teacher = realpath(d->teacher_dir, abs) ? abs : d->teacher_dir;
    json_t *j = json_pack("{s:s, s:f, s:f, s:f}", "teacher", teacher, "alpha", d->alpha, "temperature",
                          d->temperature, "hidden_weight", d->hidden_weight);
    if (!j) return bq_err(BQ_ENOMEM, "%s: cannot build the record", path);
    int st = BQ_OK;
    errno = 0;
    if (json_dump_file(j, path, JSON_INDENT(1)))
        st = bq_err(BQ_EIO, "%s: cannot write: %s", path, errno ? strerror(errno) : "I/O error");
    json_decref(j);
    if (!st) st = bq_fsync_path(path);
    return st;
}

int bq_distill_record_read(const char *dir, BqDistillRecord *r, int *found) {
    char path[4200];
    snprintf(path, sizeof path, "%s/distill.json", dir);
    memset(r, 0, sizeof *r);
    *found = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return BQ_OK;
    fclose(f);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    if (!j) return bq_err(BQ_EFORMAT, "%s: not JSON (%s)", path, je.text);
    const char *teacher = NULL;
    int st = BQ_OK;
    if (json_unpack(j, "{s:s, s:F, s:F, s:F}", "teacher", &teacher, "alpha", &r->alpha, "temperature",
                    &r->temperature, "hidden_weight", &r->hidden_weight) ||
        strlen(teacher) >= sizeof r->teacher)
        st = bq_err(BQ_EFORMAT, "%s: needs teacher, alpha, temperature and hidden_weight", path);
    else
        strcpy(r->teacher, teacher), *found = 1;
    json_decref(j);
    return st;
}
