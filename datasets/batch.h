/* The unit of data the trainer, evaluator and calibrator consume. Shapes (B,T), row-major; T is the
 * longest sequence in the batch (dynamic padding). Padding positions have id [PAD], mask 0, type 0. */
#ifndef BQ_BATCH_H
#define BQ_BATCH_H

#include <stdint.h>

typedef struct BqBatch {
    int64_t B, T;
    int32_t *input_ids;      /* (B,T) */
    float *attention_mask;   /* (B,T) 1 = token, 0 = padding */
    int32_t *token_type_ids; /* (B,T) */
    int32_t *labels;         /* (B); -1 when unlabeled (predict) */
    int64_t *example_index;  /* (B) index of each example in its split, for reports */
    int32_t *start_positions; /* (B) question answering: answer start/end token (datasets/squad.h); */
    int32_t *end_positions;   /* NULL for classification batches */
} BqBatch;

#endif
