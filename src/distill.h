/* Set-up of knowledge distillation for `qat --teacher` (the loss itself is in src/train.c, the settings
 * type BqDistill here): loading the teacher with the checks that make its logits and hidden
 * states comparable with the student's, and the record DIR/distill.json that every checkpoint of a
 * distilled run carries, so that `--resume` reloads the same teacher with the same settings:
 *   {"teacher": "/abs/path", "alpha": A, "temperature": T, "hidden_weight": W} */
#ifndef BQ_DISTILL_H
#define BQ_DISTILL_H

#include "layers/bert.h"

#define BQ_DISTILL_PATH_MAX 4096

/* Knowledge distillation during training (qat --teacher; docs/quantization.md "Distillation"). The loss
 * of a micro-batch becomes
 *   (1 − alpha)·CE + alpha·T²·KL(softmax(teacher/T) ‖ softmax(student/T)) + hidden_weight·Σ_l MSE_l
 * with the KL averaged over the batch (autograd/tensor.h bq_op_kl_distill) and MSE_l the mean over every
 * element (B·T·H, padding positions included) of the squared difference between the student's and the
 * teacher's output of encoder layer l. The teacher runs forward on the same batch, without a tape and
 * with dropout off, in the step's activation arena. */
typedef struct BqDistill {
    BqBert *teacher;        /* same vocabulary and labels; same layers and hidden size when hidden_weight > 0 */
    const char *teacher_dir; /* recorded in every checkpoint (distill.json) so that --resume reloads it */
    double alpha;           /* in [0, 1] */
    double temperature;     /* > 0 */
    double hidden_weight;   /* >= 0; 0: no hidden-state term (and no hidden states kept) */
} BqDistill;

/* The settings read back from a checkpoint's distill.json. */
typedef struct BqDistillRecord {
    char teacher[BQ_DISTILL_PATH_MAX];
    double alpha, temperature, hidden_weight;
} BqDistillRecord;

/* Checks the settings (alpha in [0,1], temperature > 0, hidden_weight >= 0; errors name the flag). */
int bq_distill_check_flags(double alpha, double temperature, double hidden_weight);

/* Loads the teacher at teacher_dir into *teacher (native checkpoint or Hugging Face directory, with its
 * quantizers when it has any) and checks it against the student loaded from student_dir: the same
 * vocab.txt, and the same number of layers and hidden size when hidden_weight > 0. Errors name
 * --teacher (or --distill-hidden) and the file. */
int bq_distill_load_teacher(BqBert *teacher, const char *teacher_dir, const BqBert *student, const char *student_dir,
                            double hidden_weight);

/* After the student is fitted to the data: the teacher must have as many labels (BQ_EINVAL naming --teacher). */
int bq_distill_check_labels(const BqBert *teacher, const BqBert *student);

/* Writes dir/distill.json (fsynced) for d (NULL: nothing). The teacher is recorded as an absolute path. */
int bq_distill_record_write(const BqDistill *d, const char *dir);

/* Reads dir/distill.json into r; *found = 0 (and BQ_OK) when the file does not exist. A malformed file is
 * BQ_EFORMAT naming it. */
int bq_distill_record_read(const char *dir, BqDistillRecord *r, int *found);

#endif
