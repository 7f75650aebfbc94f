/* Training loop for finetune and qat (see train.h). Reference for the loop's semantics: HF
 * transformers Trainer (gradient accumulation, clip_grad_norm_, AdamW, get_linear_schedule_with_warmup,
 * evaluation every N steps, load_best_model_at_end on the eval metric). */
#include "src/train.h"

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datasets/dataset.h"
#include "export/ckpt.h"
#include "layers/bert_fp32.h"
#include "layers/quant.h"
#include "src/dist.h"
#include "src/distill.h"
#include "src/optim.h"
#include "src/progress.h"

#define ACT_RESERVE ((size_t)64 << 30) /* virtual; only touched pages cost memory */

static volatile sig_atomic_t g_stop_signal = 0;
static void on_signal(int sig) { g_stop_signal = sig; }

void bq_train_config_default(BqTrainConfig *tc) {
    memset(tc, 0, sizeof *tc);
    tc->epochs = 1;
    tc->lr = 5e-5;
    tc->weight_decay = 0.0;
    tc->warmup_ratio = 0.0;
    tc->max_grad_norm = 1.0;
    tc->grad_accum = 1;
    tc->seed = 42;
    tc->eval_every = 0;
    tc->save_best = 1;
    tc->log_every = 10;
    tc->tag = "train";
}

int bq_infer_forward(BqBert *m, BqInt8Engine *e, BqCtx *ctx, const BqBertInput *in, BqTensor **logits) {
    BQ_CHECK(!ctx->tape && !ctx->training);
    return e ? bq_int8_forward(e, m, ctx, in, logits) : bq_fp32_forward(m, ctx, in, logits);
}

int bq_evaluate(BqBert *m, BqBatchSource *src, BqArena *act, BqConfusion *conf, int64_t max_examples,
                void (*probs_cb)(void *user, const BqBatch *b, const float *probs), void *user) {
    return bq_evaluate_engine(m, NULL, src, act, conf, max_examples, probs_cb, user);
}

/* Under mpirun the evaluation is sharded by batch: rank r runs the forwards of batches k with
 * k mod N = r (each batch whole, so every logit is the one a single process computes), and the
 * confusion counts this call added are summed over the ranks at the end. */
static void eval_reduce_delta(BqConfusion *conf, const int64_t *cm0, int64_t n0, double loss0, int64_t *scratch) {
    int64_t cc = (int64_t)conf->nclass * conf->nclass;
    for (int64_t i = 0; i < cc; i++) scratch[i] = conf->cm[i] - cm0[i];
    scratch[cc] = conf->n - n0;
    bq_dist_sum_i64(scratch, cc + 1);
    double dl = conf->loss_sum - loss0;
    bq_dist_sum_f64(&dl, 1);
    for (int64_t i = 0; i < cc; i++) conf->cm[i] = cm0[i] + scratch[i];
    conf->n = n0 + scratch[cc];
    conf->loss_sum = loss0 + dl;
}

int bq_evaluate_engine(BqBert *m, BqInt8Engine *e, BqBatchSource *src, BqArena *act, BqConfusion *conf,
                       int64_t max_examples, void (*probs_cb)(void *user, const BqBatch *b, const float *probs),
                       void *user) {
    int st = src->begin_epoch(src->ctx, 0);
    if (st) return st;
    int C = m->cfg.num_labels;
    int64_t seen = 0;
    int nr = bq_dist_size(), rk = bq_dist_rank();
    size_t entry = bq_arena_mark(act);
    int64_t cc = (int64_t)conf->nclass * conf->nclass, n0 = conf->n, *cm0 = NULL, *scratch = NULL;
    double loss0 = conf->loss_sum;
    if (nr > 1) {
        cm0 = bq_arena_alloc(act, sizeof(int64_t) * (size_t)cc);
        scratch = bq_arena_alloc(act, sizeof(int64_t) * (size_t)(cc + 1));
        memcpy(cm0, conf->cm, sizeof(int64_t) * (size_t)cc);
    }
    for (int64_t k = 0;; k++) {
        if (max_examples > 0 && seen >= max_examples) break;
        const BqBatch *b = NULL;
        if ((st = src->next(src->ctx, &b))) return st;
        if (!b) break;
        if (k % nr != rk) { /* another rank's batch */
            seen += max_examples > 0 && seen + b->B > max_examples ? max_examples - seen : b->B;
            continue;
        }
        size_t mark = bq_arena_mark(act);
        BqCtx ctx = {.act = act, .tape = NULL, .training = 0, .prec = m->prec};
        BqTensor *logits = NULL;
        BqBertInput in = bq_batch_input(b);
        st = bq_infer_forward(m, e, &ctx, &in, &logits);
        if (st) {
            bq_arena_rewind(act, mark);
            return st;
        }
        int64_t B = b->B;
        if (max_examples > 0 && seen + B > max_examples) B = max_examples - seen;
        bq_confusion_add_logits(conf, logits->data, b->labels, B);
        if (probs_cb) {
            float *pr = bq_arena_alloc(act, sizeof(float) * (size_t)(b->B * C));
            for (int64_t i = 0; i < b->B; i++) {
                const float *z = logits->data + i * C;
                float mx = z[0], s = 0;
                for (int j = 1; j < C; j++) mx = z[j] > mx ? z[j] : mx;
                for (int j = 0; j < C; j++) s += (pr[i * C + j] = expf(z[j] - mx));
                for (int j = 0; j < C; j++) pr[i * C + j] /= s;
            }
            BqBatch part = *b;
            part.B = B;
            probs_cb(user, &part, pr);
        }
        seen += B;
        bq_arena_rewind(act, mark);
    }
    if (nr > 1) eval_reduce_delta(conf, cm0, n0, loss0, scratch);
    bq_arena_rewind(act, entry);
    return BQ_OK;
}

int bq_train_step(BqBert *m, BqCtx *ctx, const BqBatch *b, const BqTrainState *ts, float *loss, float *logits) {
    return bq_train_step_distill(m, ctx, b, ts, NULL, NULL, loss, logits);
}

/* (1 − A)·CE + A·T²·KL + W·Σ_l MSE_l, as in train.h's BqDistill, from scale and add ops on the tape. */
BqTensor *bq_train_distill_loss(BqCtx *ctx, const BqDistill *dist, int layers, BqTensor *ce, BqTensor *lg,
                                BqTensor *tl, BqTensor **hs, BqTensor **ht, double terms[3]) {
    BqTensor *kl = bq_op_kl_distill(ctx, lg, tl, (float)dist->temperature);
    BqTensor *loss = bq_op_add(ctx, bq_op_scale(ctx, ce, (float)(1.0 - dist->alpha)),
                               bq_op_scale(ctx, kl, (float)dist->alpha));
    BqTensor *h = NULL;
    for (int l = 0; hs && l < layers; l++) {
        BqTensor *e = bq_op_mse(ctx, hs[l], ht[l]);
        h = h ? bq_op_add(ctx, h, e) : e;
    }
    if (h) loss = bq_op_add(ctx, loss, bq_op_scale(ctx, h, (float)dist->hidden_weight));
    if (terms) terms[0] = ce->data[0], terms[1] = kl->data[0], terms[2] = h ? h->data[0] : 0.0;
    return loss;
}

int bq_train_step_distill(BqBert *m, BqCtx *ctx, const BqBatch *b, const BqTrainState *ts, const BqDistill *dist,
                          double terms[3], float *loss, float *logits) {
    size_t mark = bq_arena_mark(ctx->act);
    bq_tape_rewind(ctx->tape);
    BqTensor *lg = NULL, *ls = NULL, *tl = NULL, **hs = NULL, **ht = NULL;
    BqBertInput in = bq_batch_input(b);
    int st = BQ_OK;
    const int layers = m->cfg.num_hidden_layers;
    if (terms) terms[0] = terms[1] = terms[2] = 0.0;
    if (dist) {
        /* The teacher first, forward only and with dropout off; its outputs stay in the arena until the
         * student's backward has read them. */
        BqCtx tctx = {.act = ctx->act, .tape = NULL, .training = 0, .prec = ctx->prec};
        BqBertInput tin = in;
        tin.labels = NULL;
        if (dist->hidden_weight > 0) {
            hs = bq_arena_alloc_zero(ctx->act, 2 * sizeof(BqTensor *) * (size_t)layers);
            ht = hs + layers;
            in.hidden = hs;
            tin.hidden = ht;
            tin.all_rows = 1; /* the hidden-state loss reads every token of the teacher's last layer */
        }
        if ((st = bq_bert_forward(dist->teacher, &tctx, &tin, &tl, NULL))) {
            bq_err_ctx(st, "--teacher");
            goto cleanup;
        }
    }
    if ((st = bq_bert_forward(m, ctx, &in, &lg, &ls))) goto cleanup;
    BQ_CHECK(ls);
    if (dist) ls = bq_train_distill_loss(ctx, dist, layers, ls, lg, tl, hs, ht, terms);
    else if (terms) terms[0] = ls->data[0];
    float lv = ls->data[0];
    *loss = lv;
    if (logits) memcpy(logits, lg->data, sizeof(float) * (size_t)(b->B * m->cfg.num_labels));
    if (!isfinite(lv)) {
        st = bq_err(BQ_ENUMERIC, "train: loss is %s at step %lld (epoch %lld, batch %lld)", isnan(lv) ? "NaN" : "Inf",
                    (long long)ts->step + 1, (long long)ts->epoch, (long long)ts->batch_cursor);
        goto cleanup;
    }
    bq_backward(ctx, ls);
cleanup:
    bq_arena_rewind(ctx->act, mark);
    return st;
}

int bq_train_apply(BqBert *m, const BqTrainConfig *tc, BqTrainState *ts, double *gnorm, double *lr) {
    BqParamTable *pt = &m->params;
    int nmicro = tc->grad_accum * bq_dist_size(); /* the gradient is a sum over N ranks' micro-batches */
    if (nmicro > 1) bq_grad_scale(pt, 1.0f / (float)nmicro);
    double norm = bq_grad_clip(pt, tc->max_grad_norm);
    double rate = ts->total_steps > 0 ? tc->lr * bq_lr_lambda(ts->step, ts->warmup_steps, ts->total_steps) : tc->lr;
    if (gnorm) *gnorm = norm;
    if (lr) *lr = rate;
    if (!isfinite(norm))
        return bq_err(BQ_ENUMERIC, "train: gradient norm is not finite at step %lld", (long long)ts->step + 1);
    if (m->quant && m->quant->lsq) { /* --ranges learn: the scales' group, range_lr on the same schedule */
        double lam = ts->total_steps > 0 ? bq_lr_lambda(ts->step, ts->warmup_steps, ts->total_steps) : 1.0;
        int st = bq_adamw_step_scales(ts->opt, m->quant, (float)(m->quant->cfg.range_lr * lam),
                                      1.0f / (float)nmicro);
        if (st) return st;
    }
    bq_adamw_step(ts->opt, pt, (float)rate);
    memset(pt->grad, 0, sizeof(float) * (size_t)pt->total);
    ts->step++;
    if (m->quant) bq_quant_step(m->quant); /* steps_seen; freezes at freeze_after */
    return BQ_OK;
}

/* Completes a BQ_ENUMERIC message of bq_train_step/bq_train_apply with where the last good
 * checkpoint is. */
static int numeric_ctx(int st, const char *out_dir, const char *hint) {
    if (st != BQ_ENUMERIC) return st;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", bq_errmsg());
    return bq_err(st, "%s; the last good checkpoint in %s is intact%s", msg, out_dir, hint);
}

static int64_t bs_num(void *c) { return ((BqBatcherSource *)c)->b->nbatches; }
static int bs_begin(void *c, int64_t epoch) {
    bq_batcher_seek(((BqBatcherSource *)c)->b, epoch, 0);
    return BQ_OK;
}
static int bs_next(void *c, const BqBatch **out) {
    BqBatcherSource *bs = c;
    *out = bq_batcher_next(bs->b, &bs->cur) ? &bs->cur : NULL;
    return BQ_OK;
}

void bq_batch_source_batcher(BqBatchSource *src, BqBatcherSource *bs, struct BqBatcher *b) {
    bs->b = b;
    memset(&bs->cur, 0, sizeof bs->cur);
    src->ctx = bs;
    src->num_batches = bs_num;
    src->begin_epoch = bs_begin;
    src->next = bs_next;
}

/* ---- data parallelism (src/dist.h, docs/distributed.md) ----
 * Under N ranks every rank reads every global batch of the source and takes a contiguous share of its
 * rows, rows [r·B/N, (r+1)·B/N), re-padded to the longest sequence of the share: exactly the
 * micro-batch a single process with --batch-size B/N and --grad-accum N·A would see as its
 * micro-batch N·a + r, so the dropout key is taken from that index too. */

/* Rank rk's share of b in act (valid until act is rewound). Returns 0 when the share is empty (a
 * last batch smaller than N, which every rank then skips). */
static int shard_batch(const BqBatch *b, BqArena *act, int nr, int rk, BqBatch *out) {
    if (nr == 1) {
        *out = *b;
        return 1;
    }
    if (b->B < nr) return 0;
    int64_t lo = rk * b->B / nr, hi = (rk + 1) * b->B / nr, B = hi - lo, T = 0;
    for (int64_t i = lo; i < hi; i++) {
        int64_t l = 0; /* dynamic padding: a row's tokens are its mask's leading ones */
        for (int64_t t = 0; t < b->T; t++)
            if (b->attention_mask[i * b->T + t] != 0.0f) l = t + 1;
        if (l > T) T = l;
    }
    out->B = B;
    out->T = T;
    out->input_ids = bq_arena_alloc(act, sizeof(int32_t) * (size_t)(B * T));
    out->attention_mask = bq_arena_alloc(act, sizeof(float) * (size_t)(B * T));
    out->token_type_ids = bq_arena_alloc(act, sizeof(int32_t) * (size_t)(B * T));
    out->labels = b->labels ? b->labels + lo : NULL;
    out->example_index = b->example_index ? b->example_index + lo : NULL;
    out->start_positions = b->start_positions ? b->start_positions + lo : NULL; /* question answering */
    out->end_positions = b->end_positions ? b->end_positions + lo : NULL;
    for (int64_t i = 0; i < B; i++) {
        memcpy(out->input_ids + i * T, b->input_ids + (lo + i) * b->T, sizeof(int32_t) * (size_t)T);
        memcpy(out->attention_mask + i * T, b->attention_mask + (lo + i) * b->T, sizeof(float) * (size_t)T);
        memcpy(out->token_type_ids + i * T, b->token_type_ids + (lo + i) * b->T, sizeof(int32_t) * (size_t)T);
    }
    return 1;
}

/* Gradient accumulation by partial sums: micro-batch a > 0 computes its gradient into the zeroed
 * buffer, then adds the sum so far (held in acc), so a step's gradient is g1 + g2 + ... exactly as the
 * MPI sum of the ranks' micro-batch gradients (for two ranks the same single addition). */
static void grad_micro_begin(BqParamTable *pt, float *acc, int micro) {
    if (micro == 0) return;
    memcpy(acc, pt->grad, sizeof(float) * (size_t)pt->total);
    memset(pt->grad, 0, sizeof(float) * (size_t)pt->total);
}
static void grad_micro_end(BqParamTable *pt, const float *acc, int micro) {
    if (micro == 0) return;
    float *g = pt->grad;
    int64_t n = pt->total;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) g[i] += acc[i];
}

/* Per-step numbers every rank must agree on, summed over the ranks in one small allreduce. */
typedef struct StepSums {
    double loss, micro, examples, tokens, stop;
} StepSums;

/* The word-embedding gradient (V, H) summed over the ranks by sending only the rows a rank touched
 * (the batch's token ids; any row with a non-zero bit, so -0 counts), when the rows of all ranks
 * together are fewer than V/2; otherwise densely. The sum reproduces the dense rank-order sum
 * g_0 + g_1 + ... bit for bit, signed zeros included: an untouched row is +0, and adding +0 turns -0
 * into +0, which the first-copy / add sequence below applies where a rank is skipped. scratch is
 * rewound on return. */
static void sum_embedding_rows(float *g, int64_t V, int64_t H, BqArena *scratch) {
    int nr = bq_dist_size();
    size_t mark = bq_arena_mark(scratch);
    int32_t *idx = bq_arena_alloc(scratch, sizeof(int32_t) * (size_t)V);
    int64_t k = 0;
    for (int64_t v = 0; v < V; v++) {
        const uint32_t *row = (const uint32_t *)(g + v * H);
        for (int64_t j = 0; j < H; j++)
            if (row[j]) {
                idx[k++] = (int32_t)v;
                break;
            }
    }
    int64_t *cnt = bq_arena_alloc(scratch, sizeof(int64_t) * (size_t)nr);
    int64_t *bytes = bq_arena_alloc(scratch, sizeof(int64_t) * (size_t)nr);
    bq_dist_allgather_i64(k, cnt);
    int64_t tot = 0;
    for (int r = 0; r < nr; r++) tot += cnt[r];
    if (2 * tot > V) { /* every rank takes the same branch: tot is the same everywhere */
        bq_dist_sum_f32(g, V * H);
        bq_arena_rewind(scratch, mark);
        return;
    }
    float *rows = bq_arena_alloc(scratch, sizeof(float) * (size_t)(k * H));
    for (int64_t i = 0; i < k; i++) memcpy(rows + i * H, g + (int64_t)idx[i] * H, sizeof(float) * (size_t)H);
    int32_t *all_idx = bq_arena_alloc(scratch, sizeof(int32_t) * (size_t)tot);
    float *all_rows = bq_arena_alloc(scratch, sizeof(float) * (size_t)(tot * H));
    for (int r = 0; r < nr; r++) bytes[r] = cnt[r] * (int64_t)sizeof(int32_t);
    bq_dist_allgatherv(idx, bytes, all_idx);
    for (int r = 0; r < nr; r++) bytes[r] = cnt[r] * H * (int64_t)sizeof(float);
    bq_dist_allgatherv(rows, bytes, all_rows);
    int32_t *last = bq_arena_alloc(scratch, sizeof(int32_t) * (size_t)V); /* last rank added, -1: none */
    for (int64_t i = 0; i < tot; i++) last[all_idx[i]] = -1;
    int64_t i = 0;
    for (int r = 0; r < nr; r++) {
        for (int64_t e = i + cnt[r]; i < e; i++) {
            float *dst = g + (int64_t)all_idx[i] * H;
            const float *src = all_rows + i * H;
            int p = last[all_idx[i]];
            if (p < 0) memcpy(dst, src, sizeof(float) * (size_t)H);
            if (p < 0 ? r > 0 : r > p + 1)
                for (int64_t j = 0; j < H; j++) dst[j] += 0.0f; /* the +0 of the skipped ranks */
            if (p >= 0)
                for (int64_t j = 0; j < H; j++) dst[j] += src[j];
            last[all_idx[i]] = r;
        }
    }
    for (int64_t t = 0; t < tot; t++) {
        if (last[all_idx[t]] == nr - 1) continue;
        float *dst = g + (int64_t)all_idx[t] * H;
        for (int64_t j = 0; j < H; j++) dst[j] += 0.0f; /* the +0 of the ranks after the last one */
    }
    bq_arena_rewind(scratch, mark);
}

/* Ends a step's micro-batches under N ranks: sums the step's counters and the gradient, with one
 * allreduce over the contiguous gradient block outside the word embeddings and, for them, the
 * touched rows only (sum_embedding_rows), and the learned scales' gradients (--ranges learn; qs may
 * be NULL). scratch: the activation arena, between steps. */
static void step_reduce(BqParamTable *pt, BqQuantState *qs, StepSums *s, BqArena *scratch) {
    if (bq_dist_size() == 1) return;
    bq_dist_sum_f64((double *)s, sizeof *s / sizeof(double));
    if (qs && qs->lsq_grad) bq_dist_sum_f32(qs->lsq_grad, qs->nscales);
    int w = bq_params_find(pt, "embeddings.word_embeddings.weight");
    if (w < 0 || pt->p[w].ndim != 2) {
        bq_dist_sum_f32(pt->grad, pt->total);
        return;
    }
    int64_t off = pt->p[w].offset, V = pt->p[w].shape[0], H = pt->p[w].shape[1];
    bq_dist_sum_f32(pt->grad, off);
    bq_dist_sum_f32(pt->grad + off + V * H, pt->total - off - V * H);
    sum_embedding_rows(pt->grad + off, V, H, scratch);
}

/* State shared by the helpers of one bq_train call. */
typedef struct Run {
    BqBert *m;
    const BqTrainConfig *tc;
    BqBatchSource *val;
    const char *out;
    BqArena *act;
    BqProgress prog;
    BqTrainState ts;
    BqAdamW opt;
    BqConfusion conf;
    int saved_any;
    /* The loop's state, read and updated by the helpers between bq_train and its steps. */
    BqTape *tape;
    int nr, rk;             /* processes and this one's rank (1 and 0 without mpirun) */
    float *acc;             /* the sum of a step's earlier micro-batch gradients (grad_accum > 1), else NULL */
    int64_t nb;             /* micro-batches per epoch */
    int64_t total;          /* optimizer steps of the run */
    int64_t eval_every;     /* steps between evaluations; 0: after every epoch */
    double loss_acc;        /* sum of micro-batch losses since the last optimizer step */
    int micro;              /* micro-batches since the last optimizer step */
    double terms_acc[3];    /* distillation: sums of the loss terms since the last log line */
    int64_t terms_n;
    double t_log;           /* when the last log line was written (evaluation time left out) */
    int64_t ex_since_log, tok_since_log;
} Run;

/* BqCkptExtra writer of distill.json (the distillation settings, src/distill.h). */
static int write_distill(void *user, const char *tmp_dir) { return bq_distill_record_write(user, tmp_dir); }

/* On --resume the log in OUT can run past the checkpoint: a run killed after its last save logged the
 * steps after it, which the resumed run computes and logs again. Keeps the lines of steps up to `step`
 * (and drops a last line cut short), replacing the file atomically, so a resumed run's log reads as
 * that of the uninterrupted run. Lines without an integer step are kept. */
static int log_rewind(const char *path, int64_t step) {
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *in = fopen(path, "r"), *out = NULL;
    if (!in) return BQ_OK; /* no log yet */
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int64_t dropped = 0;
    int st = BQ_OK;
    if (!(out = fopen(tmp, "w"))) {
        st = bq_err(BQ_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        goto cleanup;
    }
    while ((n = getline(&line, &cap, in)) > 0) {
        json_t *o = line[n - 1] == '\n' ? json_loads(line, 0, NULL) : NULL;
        json_t *s = o ? json_object_get(o, "step") : NULL;
        if (line[n - 1] != '\n' || (json_is_integer(s) && json_integer_value(s) > step)) dropped++;
        else fputs(line, out);
        json_decref(o);
    }
    st = bq_fclose_written(out, tmp);
    out = NULL;
    if (!st && dropped) st = bq_rename_durable(tmp, path);
cleanup:
    if (out) fclose(out);
    if (st || !dropped) remove(tmp);
    free(line);
    fclose(in);
    return st;
}

static int save_ckpt(Run *r) {
    if (bq_dist_rank() != 0) return BQ_OK; /* under mpirun rank 0 alone writes */
    /* The ckpt writer carries training_log.jsonl over from the old directory. */
    BqCkptExtra more = {.write = write_distill, .user = (void *)r->tc->distill};
    int st = bq_train_state_save_with(r->m, r->out, r->tc->vocab_dir, &r->ts, r->tc->distill ? &more : NULL);
    if (!st) r->saved_any = 1;
    return st;
}

static int run_eval(Run *r, double epoch, int *improved) {
    *improved = 0;
    if (!r->val) return BQ_OK;
    bq_confusion_reset(&r->conf);
    int st = bq_evaluate(r->m, r->val, r->act, &r->conf, 0, NULL, NULL);
    if (st) return st;
    BqMetrics mt = bq_metrics_compute(&r->conf);
    bq_progress_eval(&r->prog, r->ts.step, epoch, &mt);
    if (r->tc->save_best && mt.accuracy > r->ts.best_accuracy) {
        r->ts.best_accuracy = mt.accuracy;
        r->ts.best_step = r->ts.step;
        if (!r->ts.best_params) r->ts.best_params = bq_malloc(sizeof(float) * (size_t)r->m->params.total);
        memcpy(r->ts.best_params, r->m->params.data, sizeof(float) * (size_t)r->m->params.total);
        if (r->m->quant) bq_quant_learn_keep_best(r->m->quant); /* learned scales go with the weights */
        *improved = 1;
    }
    return BQ_OK;
}

/* The run's length from the training source and tc: r->nb micro-batches per epoch, r->total optimizer
 * steps (at least 1), r->eval_every; then the fresh run's training state (schedule, seed, no best
 * model yet), which --resume replaces. Errors: BQ_EINVAL when the source has no batches. */
static int run_schedule(Run *r, BqBatchSource *train) {
    const BqTrainConfig *tc = r->tc;
    r->nb = train->num_batches(train->ctx);
    if (r->nb <= 0) return bq_err(BQ_EINVAL, "train: the training set has no batches");
    int64_t steps_per_epoch = (r->nb + tc->grad_accum - 1) / tc->grad_accum;
    int64_t total = tc->max_steps > 0 ? tc->max_steps : (int64_t)ceil(tc->epochs * (double)steps_per_epoch);
    if (total < 1) total = 1;
    r->total = total;
    r->eval_every = tc->eval_every;
    if (r->eval_every == 0 && tc->evals_per_epoch > 0)
        r->eval_every = (steps_per_epoch + tc->evals_per_epoch - 1) / tc->evals_per_epoch;

    r->ts.opt = &r->opt;
    r->ts.total_steps = total;
    r->ts.warmup_steps = bq_warmup_steps(tc->warmup_ratio, total);
    r->ts.lr = tc->lr;
    r->ts.seed = tc->seed;
    bq_rng_seed(&r->ts.rng, tc->seed);
    r->ts.best_accuracy = -1;
    r->ts.best_step = -1;
    return BQ_OK;
}

/* --resume: parameters, moments, counters and the best model come from the checkpoint in r->out; the
 * schedule is the one the run started with (r->total becomes the saved one; a warning when seed or
 * steps differ from tc). The quantizers take over the step count and freeze when it is past
 * freeze_after. Errors: those of bq_train_state_load, in the context "--resume". */
static int run_resume(Run *r) {
    const BqTrainConfig *tc = r->tc;
    BqBert *m = r->m;
    BqTrainState saved = {.opt = &r->opt};
    int st = bq_train_state_load(m, r->out, &saved);
    if (st) {
        bq_err_ctx(st, "--resume");
        return st;
    }
    /* the precision is part of the run: a resume in another one would not continue it bit for bit */
    const char *was = saved.precision ? saved.precision : "fp32", *now = bq_precision_name(m->prec);
    if (strcmp(was, now)) {
        free(saved.best_params);
        return bq_err(BQ_EINVAL, "--resume: %s was trained with --precision %s; resume it with --precision %s "
                      "(this run resolved to %s)", r->out, was, was, now);
    }
    if (saved.seed != tc->seed || saved.total_steps != r->total)
        fprintf(stderr, "[%s] warning: resuming with seed/steps from the checkpoint (seed %llu, %lld steps)\n",
                tc->tag ? tc->tag : "train", (unsigned long long)saved.seed, (long long)saved.total_steps);
    r->ts = saved;
    r->ts.opt = &r->opt;
    r->total = r->ts.total_steps;
    if (m->quant) {
        m->quant->steps_seen = r->ts.step;
        if (m->quant->cfg.freeze_after > 0 && r->ts.step >= m->quant->cfg.freeze_after) bq_quant_freeze(m->quant, 1);
    }
    return BQ_OK;
}

/* OUT exists from the start so the JSONL log has a home before the first checkpoint: rank 0 makes it
 * (*created_out = 1 when it did not exist, set before any error), starts a fresh log (or, on --resume,
 * trims it to the checkpoint's step) at logpath (cap bytes; left "" on other ranks), and every rank
 * opens its progress output, which logs nothing on ranks other than 0 (no JSONL, no TensorBoard, no
 * progress lines). *progress_open = 1 once r->prog must be closed. Errors: OUT or the log cannot be
 * written. */
static int run_open_log(Run *r, int *created_out, char *logpath, size_t cap, int *progress_open) {
    const BqTrainConfig *tc = r->tc;
    const char *out_dir = r->out;
    int writer = r->rk == 0, st;
    struct stat sb_out;
    *created_out = writer && stat(out_dir, &sb_out) != 0;
    if (writer && (st = bq_mkdir_p(out_dir))) return st;
    if (writer) snprintf(logpath, cap, "%s/training_log.jsonl", out_dir);
    if (writer && !tc->resume) remove(logpath);
    if (writer && tc->resume && (st = log_rewind(logpath, r->ts.step))) return st;
    if ((st = bq_progress_open(&r->prog, tc->tag, writer ? logpath : NULL, writer ? tc->logdir : NULL, r->total,
                               tc->quiet || !writer)))
        return st;
    *progress_open = 1;
    if (tc->resume)
        bq_progress_note(&r->prog, "resumed from %s at step %lld (epoch %lld, batch %lld)", out_dir,
                         (long long)r->ts.step, (long long)r->ts.epoch, (long long)r->ts.batch_cursor);
    return BQ_OK;
}

/* SIGINT, SIGTERM and SIGUSR1 (mpirun forwards SIGUSR1 to every rank without killing them) set
 * g_stop_signal, which the loop reads after each optimizer step; old (3) receives the handlers that
 * signals_restore puts back. */
static void signals_install(struct sigaction old[3]) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    g_stop_signal = 0;
    sigaction(SIGINT, &sa, &old[0]);
    sigaction(SIGTERM, &sa, &old[1]);
    sigaction(SIGUSR1, &sa, &old[2]);
}

static void signals_restore(const struct sigaction old[3]) {
    sigaction(SIGINT, &old[0], NULL);
    sigaction(SIGTERM, &old[1], NULL);
    sigaction(SIGUSR1, &old[2], NULL);
}

/* Skips the first n micro-batches of the epoch just begun: those the checkpointed run consumed. */
static int skip_consumed(BqBatchSource *train, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const BqBatch *b = NULL;
        int st = train->next(train->ctx, &b);
        if (st) return st;
        if (!b) break;
    }
    return BQ_OK;
}

/* Forward and backward of this process's share of micro-batch b (all of it without mpirun; nothing
 * when the share is empty): the gradient is added to the step's (r->acc when accumulating), the loss
 * and distillation terms to the sums since the last step and log line, its examples and tokens to
 * the speed's. The activations are rewound on success. Errors: a non-finite loss or gradient
 * (BQ_ENUMERIC, naming OUT and suggesting a lower --lr). */
static int micro_step(Run *r, const BqBatch *b) {
    const BqTrainConfig *tc = r->tc;
    BqParamTable *pt = &r->m->params;
    size_t share_mark = bq_arena_mark(r->act);
    BqBatch share;
    if (shard_batch(b, r->act, r->nr, r->rk, &share)) {
        /* global micro-batch index, that of the single-process run with grad_accum·N */
        int64_t k = (r->ts.step * tc->grad_accum + r->micro) * r->nr + r->rk;
        BqCtx ctx = {.act = r->act, .tape = r->tape, .training = 1, .rng_key = bq_hash64(r->ts.seed, (uint64_t)k),
                     .prec = r->m->prec};
        float lv;
        grad_micro_begin(pt, r->acc, r->micro);
        double terms[3];
        int st = bq_train_step_distill(r->m, &ctx, &share, &r->ts, tc->distill, terms, &lv, NULL);
        if (st) return numeric_ctx(st, r->out, " (try a lower --lr)");
        grad_micro_end(pt, r->acc, r->micro);
        r->loss_acc += lv;
        for (int j = 0; j < 3; j++) r->terms_acc[j] += terms[j];
        r->terms_n++;
        r->ex_since_log += share.B;
        r->tok_since_log += share.B * share.T;
        r->micro++;
    }
    bq_arena_rewind(r->act, share_mark);
    return BQ_OK;
}

/* The log line of step r->ts.step (loss, learning rate, gradient norm, examples and tokens per second
 * since the last line over all ranks, and the mean distillation terms), then restarts the sums since
 * the last line. */
static void log_step(Run *r, double epoch_f, double step_loss, double lr, double gnorm, const StepSums *sums) {
    double now = bq_now();
    double dt = now - r->t_log > 1e-9 ? now - r->t_log : 1e-9;
    bq_progress_step(&r->prog, r->ts.step, epoch_f, step_loss, lr, gnorm, sums->examples / dt, sums->tokens / dt);
    if (r->tc->distill && r->terms_n > 0)
        bq_progress_note(&r->prog, "distill step %lld: ce %.4f kl %.4f hidden %.4f (unweighted, mean of "
                         "%lld micro-batches)", (long long)r->ts.step, r->terms_acc[0] / (double)r->terms_n,
                         r->terms_acc[1] / (double)r->terms_n, r->terms_acc[2] / (double)r->terms_n,
                         (long long)r->terms_n);
    r->terms_acc[0] = r->terms_acc[1] = r->terms_acc[2] = 0.0;
    r->terms_n = 0;
    r->t_log = now;
    r->ex_since_log = r->tok_since_log = 0;
}

/* The optimizer step after r->micro micro-batches: sums gradients, losses and counts over the ranks
 * (step_reduce; *sums receives the totals, with the ranks asked to stop), applies the update
 * (bq_train_apply), reports the step's mean loss to res and tc->on_step, and logs every log_every
 * steps and at the last. *epoch_f receives the fractional epoch reached. Errors: a non-finite update
 * (BQ_ENUMERIC naming OUT), tc->on_step's. */
static int optimizer_step(Run *r, BqTrainResult *res, StepSums *sums, double *epoch_f) {
    const BqTrainConfig *tc = r->tc;
    BqBert *m = r->m;
    double gnorm, lr;
    *sums = (StepSums){r->loss_acc, r->micro, (double)r->ex_since_log, (double)r->tok_since_log, g_stop_signal != 0};
    step_reduce(&m->params, m->quant, sums, r->act);
    int st = bq_train_apply(m, tc, &r->ts, &gnorm, &lr);
    if (st) return numeric_ctx(st, r->out, "");
    double step_loss = sums->loss / sums->micro; /* the mean over all ranks' micro-batches */
    r->loss_acc = 0;
    r->micro = 0;
    if (res) res->last_loss = step_loss;
    *epoch_f = (double)r->ts.epoch + (double)r->ts.batch_cursor / (double)r->nb;
    if (tc->on_step && (st = tc->on_step(tc->user, m, r->ts.step, step_loss))) return st;
    if (r->ts.step % (tc->log_every > 0 ? tc->log_every : 1) == 0 || r->ts.step == r->total)
        log_step(r, *epoch_f, step_loss, lr, gnorm, sums);
    return BQ_OK;
}

/* Every eval_every steps (but not at the last, which the final evaluation covers): evaluation, then a
 * checkpoint; the time they take is left out of the training speed logged next. */
static int eval_at_interval(Run *r, double epoch_f) {
    if (!(r->eval_every > 0 && r->ts.step % r->eval_every == 0 && r->ts.step < r->total)) return BQ_OK;
    int improved, st;
    double te = bq_now();
    if ((st = run_eval(r, epoch_f, &improved))) return st;
    if ((st = save_ckpt(r))) return st;
    r->t_log += bq_now() - te;
    return BQ_OK;
}

/* When a signal (on any rank, sums->stop) or --interrupt-at-step asks the run to stop after this step:
 * saves a resumable checkpoint and returns BQ_EINTR saying how to continue. */
static int stop_if_asked(Run *r, const StepSums *sums) {
    if (!((r->nr > 1 ? sums->stop > 0 : g_stop_signal != 0) ||
          (r->tc->interrupt_at_step > 0 && r->ts.step == r->tc->interrupt_at_step)))
        return BQ_OK;
    int st = save_ckpt(r);
    if (st) return st;
    bq_dist_barrier(); /* the other ranks' exit must not cut rank 0's checkpoint short */
    return bq_err(BQ_EINTR, "train: interrupted at step %lld/%lld; state saved in %s, continue "
                  "with the same command plus --resume", (long long)r->ts.step, (long long)r->total, r->out);
}

/* The end of an epoch: the next starts at its first batch; without a step interval an evaluation and
 * a checkpoint follow every epoch but the last. */
static int end_epoch(Run *r) {
    r->ts.epoch++;
    r->ts.batch_cursor = 0;
    if (r->eval_every == 0 && r->ts.step < r->total) {
        int improved, st;
        if ((st = run_eval(r, (double)r->ts.epoch, &improved))) return st;
        if ((st = save_ckpt(r))) return st;
    }
    return BQ_OK;
}

/* Final evaluation (unless the run had finished before this call), then the final checkpoint: the best
 * parameters when tracked (HF load_best_model_at_end), with the finished training state. */
static int run_finish(Run *r, int finished_before) {
    BqBert *m = r->m;
    BqParamTable *pt = &m->params;
    int st;
    if (r->val && r->ts.step >= r->total && !finished_before) {
        int improved;
        if ((st = run_eval(r, (double)r->ts.epoch + (double)r->ts.batch_cursor / (double)r->nb, &improved)))
            return st;
    }
    if (r->tc->save_best && r->ts.best_params && r->ts.best_step != r->ts.step) {
        bq_progress_note(&r->prog, "final model = best evaluation (step %lld, accuracy %.4f)",
                         (long long)r->ts.best_step, r->ts.best_accuracy);
        memcpy(pt->data, r->ts.best_params, sizeof(float) * (size_t)pt->total);
        if (m->quant) bq_quant_learn_restore_best(m->quant);
    }
    if ((st = save_ckpt(r))) return st;
    bq_progress_note(&r->prog, "saved %s (%lld steps, %.1fs)", r->out, (long long)r->ts.step, bq_now() - r->prog.t0);
    return BQ_OK;
}

int bq_train(BqBert *m, const BqTrainConfig *tc, BqBatchSource *train, BqBatchSource *val, const char *out_dir,
             BqTrainResult *res) {
    if (tc->grad_accum < 1) return bq_err(BQ_EINVAL, "--grad-accum: must be >= 1");
    int st = bq_bert_grad_alloc(m); /* loaded models have none */
    if (st) return st;
    Run r = {.m = m, .tc = tc, .val = val, .out = out_dir};
    BqArena act = {0};
    BqTape tape = {0};
    struct sigaction sa_old[3];
    int handlers = 0;
    int progress_open = 0;
    BqArena accum = {0}; /* holds r.acc */
    int created_out = 0; /* OUT did not exist: removed again if training fails before any checkpoint */
    char logpath[4200];
    logpath[0] = 0;
    BqParamTable *pt = &m->params;
    r.act = &act;
    r.tape = &tape;
    r.nr = bq_dist_size();
    r.rk = bq_dist_rank();
    bq_confusion_init(&r.conf, m->cfg.num_labels);
    bq_adamw_init(&r.opt, pt->total, (float)tc->weight_decay);

    if ((st = run_schedule(&r, train))) goto cleanup;
    if (tc->resume && (st = run_resume(&r))) goto cleanup;
    r.ts.precision = bq_precision_name(m->prec);
    if ((st = bq_arena_init(&act, ACT_RESERVE, "activations"))) goto cleanup;
    if ((st = bq_tape_init(&tape, 4096))) goto cleanup;
    if (m->quant && r.nr > 1) m->quant->reduce_minmax = bq_dist_reduce_minmax; /* identical observers on all ranks */
    if (tc->grad_accum > 1) {
        if ((st = bq_arena_init(&accum, sizeof(float) * (size_t)pt->total + 4096, "gradient accumulation")))
            goto cleanup;
        r.acc = bq_arena_alloc(&accum, sizeof(float) * (size_t)pt->total);
    }
    if ((st = run_open_log(&r, &created_out, logpath, sizeof logpath, &progress_open))) goto cleanup;
    signals_install(sa_old);
    handlers = 1;

    r.t_log = bq_now();
    int finished_before = r.ts.step >= r.total; /* resume of a finished run: nothing to do */
    memset(pt->grad, 0, sizeof(float) * (size_t)pt->total);

    /* The loop: batch → step (forward and backward of each micro-batch) → apply (after grad_accum
     * micro-batches or at the end of the epoch) → log, evaluate and save at their intervals. */
    while (r.ts.step < r.total) {
        if ((st = train->begin_epoch(train->ctx, r.ts.epoch))) goto cleanup;
        if ((st = skip_consumed(train, r.ts.batch_cursor))) goto cleanup;
        for (;;) {
            const BqBatch *b = NULL;
            if ((st = train->next(train->ctx, &b))) goto cleanup;
            int end_of_epoch = b == NULL;
            if (b && (st = micro_step(&r, b))) goto cleanup;
            if (b) r.ts.batch_cursor++;
            if (r.micro == tc->grad_accum || (end_of_epoch && r.micro > 0)) {
                StepSums sums;
                double epoch_f = 0;
                if ((st = optimizer_step(&r, res, &sums, &epoch_f))) goto cleanup;
                if ((st = eval_at_interval(&r, epoch_f))) goto cleanup;
                if ((st = stop_if_asked(&r, &sums))) goto cleanup;
                if (r.ts.step >= r.total) break;
            }
            if (end_of_epoch) {
                if ((st = end_epoch(&r))) goto cleanup;
                break;
            }
        }
    }
    st = run_finish(&r, finished_before);

cleanup:
    if (res) {
        res->steps = r.ts.step;
        res->best_accuracy = r.ts.best_accuracy;
        res->best_step = r.ts.best_step;
        res->seconds = progress_open ? bq_now() - r.prog.t0 : 0;
    }
    if (handlers) signals_restore(sa_old);
    if (progress_open) bq_progress_close(&r.prog);
    if (st && created_out && !r.saved_any) {
        if (logpath[0]) remove(logpath);
        rmdir(out_dir);
    }
    free(r.ts.best_params);
    bq_confusion_free(&r.conf);
    bq_adamw_free(&r.opt);
    bq_tape_free(&tape);
    if (act.base) bq_arena_free(&act);
    if (accum.base) bq_arena_free(&accum);
    return st;
}
