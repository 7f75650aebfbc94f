/* Times the gradient exchange of a data-parallel step (src/dist.h, docs/distributed.md): one
 * in-place sum over all ranks of the whole gradient block, of word_embeddings' block alone and of the
 * rest, for all-MiniLM-L6-v2's parameter table (--model, its config.json) and for a BERT-base-shaped
 * table (12 layers, hidden 768, intermediate 3072). Parameter counts come from the parameter table
 * (layers/bert.h), as the trainer's gradient does.
 *
 *   mpirun -np 2 bench_allreduce [--model DIR] [--rounds 10]
 *
 * Rank 0 prints one JSON line per table: floats, bytes, median milliseconds of each allreduce. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "layers/bert.h"
#include "src/dist.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median milliseconds of `rounds` sums of n floats of buf (after one untimed warm-up). */
static double time_sum(float *buf, int64_t n, int rounds) {
    double *t = bq_malloc(sizeof(double) * (size_t)rounds);
    bq_dist_sum_f32(buf, n);
    for (int r = 0; r < rounds; r++) {
        bq_dist_barrier();
        double t0 = bq_now();
        bq_dist_sum_f32(buf, n);
        t[r] = (bq_now() - t0) * 1e3;
    }
    qsort(t, (size_t)rounds, sizeof *t, cmp_double);
    double med = t[rounds / 2];
    free(t);
    return med;
}

static void base_config(BqBertConfig *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->vocab_size = 30522;
    cfg->hidden_size = 768;
    cfg->num_hidden_layers = 12;
    cfg->num_attention_heads = 12;
    cfg->intermediate_size = 3072;
    cfg->max_position_embeddings = 512;
    cfg->type_vocab_size = 2;
    cfg->layer_norm_eps = 1e-12f;
    cfg->classifier_dropout = -1.0f;
    cfg->initializer_range = 0.02f;
    cfg->num_labels = 2;
    cfg->id2label = bq_calloc(2, sizeof(char *));
    cfg->id2label[0] = bq_strdup("neg");
    cfg->id2label[1] = bq_strdup("pos");
}

static int measure(const char *label, BqBertConfig *cfg, int rounds) {
    BqBert m;
    memset(&m, 0, sizeof m);
    BqRng rng;
    bq_rng_seed(&rng, 1);
    int st = bq_bert_create(&m, cfg, 0, &rng);
    if (st) return st;
    BqParamTable *pt = &m.params;
    int w = bq_params_find(pt, "embeddings.word_embeddings.weight");
    BQ_CHECK(w >= 0);
    int64_t nw = pt->p[w].numel, off = pt->p[w].offset;
    float *g = pt->data; /* the sums only need a buffer of the gradient's size */
    double all = time_sum(g, pt->total, rounds);
    double emb = time_sum(g + off, nw, rounds);
    double rest = time_sum(g + off + nw, pt->total - off - nw, rounds);
    if (bq_dist_rank() == 0)
        printf("{\"table\":\"%s\",\"ranks\":%d,\"floats\":%lld,\"bytes\":%lld,\"word_embeddings_floats\":%lld,"
               "\"ms_all\":%.3f,\"ms_word_embeddings\":%.3f,\"ms_rest\":%.3f,\"rounds\":%d}\n",
               label, bq_dist_size(), (long long)pt->total, (long long)pt->total * 4, (long long)nw, all, emb, rest,
               rounds);
    bq_bert_free(&m);
    return BQ_OK;
}

int main(int argc, char **argv) {
    const char *model = NULL;
    int rounds = 10;
    if (bq_runtime_boot(argc, argv) || bq_dist_init(&argc, &argv)) {
        fprintf(stderr, "bench_allreduce: %s\n", bq_errmsg());
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: mpirun -np N bench_allreduce [--model DIR] [--rounds R]\n");
            bq_dist_abort(2);
        }
    }
    if (rounds < 1) rounds = 1;
    int st = BQ_OK;
    if (model) {
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", model);
        BqBertConfig cfg;
        if (!(st = bq_config_load(&cfg, path))) st = measure("minilm-l6", &cfg, rounds); /* the model frees cfg */
    }
    BqBertConfig base;
    base_config(&base);
    if (!st) st = measure("bert-base", &base, rounds);
    if (st) {
        fprintf(stderr, "bench_allreduce: %s\n", bq_errmsg());
        bq_dist_abort(1);
    }
    bq_dist_finalize();
    return 0;
}
