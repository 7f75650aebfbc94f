/* Times one training step's forward + backward (tape) of BertForSequenceClassification at the
 * all-MiniLM-L6-v2 shapes (6 layers, hidden 384, 12 heads, intermediate 1536, vocab 30522), random
 * HF-style init, dropout 0.1 in training mode, random full-length batches.
 * Usage: bench_bert_step [B=32] [T=128] [steps=5] [threads=0 (all)]
 * Prints ms/step, tokens/s and the activation arena's peak. The optimizer step is not included. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "autograd/tensor.h"
#include "layers/bert.h"

int main(int argc, char **argv) {
    if (bq_runtime_boot(argc, argv) != BQ_OK) {
        fprintf(stderr, "%s\n", bq_errmsg());
        return 1;
    }
    int64_t B = argc > 1 ? atoll(argv[1]) : 32, T = argc > 2 ? atoll(argv[2]) : 128;
    int steps = argc > 3 ? atoi(argv[3]) : 5;
    bq_runtime_set_threads(argc > 4 ? atoi(argv[4]) : 0);
    if (B <= 0 || T <= 0 || T > 512 || steps <= 0) {
        fprintf(stderr, "usage: bench_bert_step [B] [T<=512] [steps] [threads]\n");
        return 2;
    }

    BqBertConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.vocab_size = 30522;
    cfg.hidden_size = 384;
    cfg.num_hidden_layers = 6;
    cfg.num_attention_heads = 12;
    cfg.intermediate_size = 1536;
    cfg.max_position_embeddings = 512;
    cfg.type_vocab_size = 2;
    cfg.pad_token_id = 0;
    cfg.layer_norm_eps = 1e-12f;
    cfg.hidden_dropout_prob = 0.1f;
    cfg.attention_probs_dropout_prob = 0.1f;
    cfg.classifier_dropout = -1.0f;
    cfg.initializer_range = 0.02f;
    cfg.num_labels = 2;
    cfg.id2label = bq_calloc(2, sizeof(char *));
    cfg.id2label[0] = bq_strdup("neg");
    cfg.id2label[1] = bq_strdup("pos");

    BqRng rng;
    bq_rng_seed(&rng, 1);
    BqBert m;
    if (bq_bert_create(&m, &cfg, 1, &rng) != BQ_OK) {
        fprintf(stderr, "%s\n", bq_errmsg());
        return 1;
    }
    BqBatch bt;
    memset(&bt, 0, sizeof bt);
    bt.B = B;
    bt.T = T;
    bt.input_ids = bq_malloc((size_t)(B * T) * sizeof(int32_t));
    bt.token_type_ids = bq_calloc((size_t)(B * T), sizeof(int32_t));
    bt.attention_mask = bq_malloc((size_t)(B * T) * sizeof(float));
    bt.labels = bq_malloc((size_t)B * sizeof(int32_t));
    for (int64_t i = 0; i < B * T; i++) {
        bt.input_ids[i] = 1 + (int32_t)bq_rng_below(&rng, 30521);
        bt.attention_mask[i] = 1.0f;
    }
    for (int64_t b = 0; b < B; b++) bt.labels[b] = (int32_t)(b & 1);

    BqArena act;
    BqTape tape;
    BQ_CHECK(bq_arena_init(&act, (size_t)64 << 30, "act") == BQ_OK);
    BQ_CHECK(bq_tape_init(&tape, 1 << 14) == BQ_OK);
    printf("%s\n", bq_runtime_describe());
    double total = 0;
    for (int s = 0; s <= steps; s++) { /* step 0 warms up (page faults, BLAS buffers) */
        BqCtx ctx = {.act = &act, .tape = &tape, .training = 1, .rng_key = bq_hash64(1, (uint64_t)s)};
        double t0 = bq_now();
        BqTensor *logits, *loss;
        if (bq_bert_forward(&m, &ctx, &bt, &logits, &loss) != BQ_OK) {
            fprintf(stderr, "%s\n", bq_errmsg());
            return 1;
        }
        bq_backward(&ctx, loss);
        double dt = bq_now() - t0;
        if (s > 0) total += dt;
        printf("step %d: loss %.4f  %.1f ms\n", s, loss->data[0], dt * 1e3);
        bq_arena_rewind(&act, 0);
        bq_tape_rewind(&tape);
    }
    double ms = total / steps * 1e3;
    printf("B=%lld T=%lld: %.1f ms/step (forward+backward), %.0f tokens/s, activation arena peak %.2f GiB\n",
           (long long)B, (long long)T, ms, (double)(B * T) / (ms / 1e3), (double)act.peak / (1 << 30));
    free(bt.input_ids);
    free(bt.token_type_ids);
    free(bt.attention_mask);
    free(bt.labels);
    bq_tape_free(&tape);
    bq_arena_free(&act);
    bq_bert_free(&m);
    return 0;
}
