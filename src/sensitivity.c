/* Per-group quantization sensitivity and the greedy fp32 fallback (src/sensitivity.h). The grouping
 * follows the quantizer names of layers/qscheme.c; KL is computed in double from the logits. */
#include "src/sensitivity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "src/dist.h"
#include "src/train.h"

/* 1 when `prefix` equals a dotted prefix of name ("a.b" matches "a.b.c", not "a.bc"). */
static int dotted_prefix(const char *prefix, const char *name) {
    size_t len = strlen(prefix);
    return strncmp(name, prefix, len) == 0 && (name[len] == '.' || name[len] == '\0');
}

/* The group name of quantizer q in scheme s (src/sensitivity.h). */
static void group_name(const BqQuantizer *q, BqScheme s, char *out, size_t cap) {
    const char *last = strrchr(q->name, '.');
    BQ_CHECK(last != NULL);
    int plen = (int)(last - q->name);
    const char *role = last + 1;
    if (!strncmp(role, "matmul_q_", 9) || !strncmp(role, "matmul_k_", 9))
        snprintf(out, cap, "%.*s.matmul_qk", plen, q->name);
    else if (!strncmp(role, "matmul_a_", 9) || !strncmp(role, "matmul_v_", 9))
        snprintf(out, cap, "%.*s.matmul_av", plen, q->name);
    else if (!strncmp(role, "add_", 4))
        snprintf(out, cap, "%.*s.residual_add", plen, q->name);
    else if (s == BQ_SCHEME_CPU && q->is_weight &&
             (q->point == BQ_QP_W_Q || q->point == BQ_QP_W_K || q->point == BQ_QP_W_V)) {
        /* query/key/value read the one attention.self input quantizer: one QKV group */
        const char *p = q->name + plen;
        while (p > q->name && *--p != '.') {}
        snprintf(out, cap, "%.*s", (int)(p - q->name), q->name);
    } else {
        snprintf(out, cap, "%.*s", plen, q->name);
    }
}

int bq_sens_groups(const BqQuantState *qs, BqSensGroup **out, int *ng) {
    int st = BQ_OK;
    *out = NULL;
    *ng = 0;
    BqSensGroup *g = bq_calloc((size_t)(qs->n > 0 ? qs->n : 1), sizeof *g);
    int n = 0;
    char name[sizeof g->name];
    for (int i = 0; i < qs->n; i++) {
        group_name(&qs->q[i], qs->cfg.scheme, name, sizeof name);
        int k = 0;
        while (k < n && strcmp(g[k].name, name)) k++;
        if (k == n) snprintf(g[n++].name, sizeof name, "%s", name);
        if (g[k].n == BQ_SENS_MAX_MEMBERS) {
            st = bq_err(BQ_EINVAL, "sensitivity: group %s has more than %d quantizers", name, BQ_SENS_MAX_MEMBERS);
            goto cleanup;
        }
        g[k].q[g[k].n++] = i;
    }
    /* exclude entries: the group name when it selects exactly the members, else every member's name */
    for (int k = 0; k < n; k++) {
        int exact = 1;
        for (int i = 0; i < qs->n && exact; i++) {
            int member = 0;
            for (int j = 0; j < g[k].n; j++) member |= g[k].q[j] == i;
            exact = member == dotted_prefix(g[k].name, qs->q[i].name);
        }
        if (exact) {
            snprintf(g[k].exclude, sizeof g[k].exclude, "%s", g[k].name);
            continue;
        }
        size_t len = 0;
        for (int j = 0; j < g[k].n; j++)
            len += (size_t)snprintf(g[k].exclude + len, sizeof g[k].exclude - len, "%s%s", j ? "," : "",
                                    qs->q[g[k].q[j]].name);
        BQ_CHECK(len < sizeof g[k].exclude);
    }
    *out = g;
    *ng = n;
    g = NULL;
cleanup:
    free(g);
    return st;
}

/* Stores the first `rows` logits of a batch whose first example is example `seen` as the teacher (store), or
 * compares them with it: adds the correct predictions to *correct and writes each example's
 * KL(teacher ‖ logits) to kl[seen + r]. */
static void score(BqSensitivity *s, const BqBatch *b, const BqTensor *logits, int64_t seen, int64_t rows, int store,
                  int64_t *correct, double *kl) {
    const int C = s->num_labels;
    for (int64_t r = 0; r < rows; r++) {
        const float *z = logits->data + r * C;
        float *t = s->teacher + (seen + r) * C;
        if (store) {
            memcpy(t, z, (size_t)C * sizeof *t);
            s->labels[seen + r] = b->labels[r];
        }
        int arg = 0;
        for (int c = 1; c < C; c++)
            if (z[c] > z[arg]) arg = c;
        *correct += arg == s->labels[seen + r];
        /* KL(p ‖ q) with p = softmax(t), q = softmax(z), via log-sum-exp */
        double mt = t[0], mz = z[0], st_ = 0.0, sz = 0.0;
        for (int c = 1; c < C; c++) mt = fmax(mt, t[c]), mz = fmax(mz, z[c]);
        for (int c = 0; c < C; c++) st_ += exp(t[c] - mt), sz += exp(z[c] - mz);
        double lt = mt + log(st_), lz = mz + log(sz), d = 0.0;
        for (int c = 0; c < C; c++) {
            double lp = t[c] - lt, lq = z[c] - lz;
            d += exp(lp) * (lp - lq);
        }
        kl[seen + r] = d > 0.0 ? d : 0.0;
    }
}

/* One forward of batch b with the current enabled flags, logits into *out (in s->act: the caller rewinds).
 * start > 0: from layer `start` on `from`, the output of layer start − 1 (B·T·H floats). keep_hidden (may
 * be NULL): receives the output of every layer but the last, (layers − 1)·B·T·H floats. keep, reuse (may
 * be NULL): BqBertReuse.lin_keep and lin_reuse (layers/bert.h). */
static int forward_batch(BqSensitivity *s, const BqBatch *b, int start, const float *from, float *keep_hidden,
                         float *const *keep, const float *const *reuse, BqTensor **out) {
    BqCtx ctx = {.act = &s->act, .tape = NULL, .training = 0, .prec = s->m->prec};
    const int L = s->m->cfg.num_hidden_layers;
    const int64_t bth = b->B * b->T * s->m->cfg.hidden_size;
    BqBertInput in = bq_batch_input(b);
    BqBertReuse r = {.start_layer = start, .lin_keep = keep, .lin_reuse = reuse};
    if (start > 0) {
        int64_t shape[3] = {b->B, b->T, s->m->cfg.hidden_size};
        r.start_hidden = bq_tensor_new(&ctx, 3, shape);
        memcpy(r.start_hidden->data, from, (size_t)bth * sizeof(float));
    }
    if (keep_hidden) in.hidden = bq_arena_alloc_zero(&s->act, (size_t)L * sizeof(BqTensor *));
    int st = bq_bert_forward_reuse(s->m, &ctx, &in, &r, out);
    if (st) return st;
    s->forwards++;
    if (keep_hidden)
        for (int l = 0; l + 1 < L; l++) memcpy(keep_hidden + l * bth, in.hidden[l]->data, (size_t)bth * sizeof(float));
    return BQ_OK;
}

/* The mean of n per-example terms, added in example order (so one process and N ranks give the same bits). */
static double row_mean(const double *row, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) sum += row[i];
    return sum / (double)n;
}

/* Accuracy and mean KL of every measured example with the current enabled flags, from the embeddings.
 * Under mpirun rank r runs the batches bi with bi mod N = r (its teacher rows and labels are those of its
 * batches) and writes each example's KL term into its slot of a zeroed array; one sum over the ranks fills
 * every slot (each is one rank's value plus zeros, exact), and the terms are then added in example order
 * as one process adds them: accuracy and KL equal the single-process ones bit for bit. */
static int run_pass(BqSensitivity *s, double *acc, double *kl) {
    int st = BQ_OK;
    const int nr = bq_dist_size(), rank = bq_dist_rank();
    int64_t seen = 0, correct = 0, bi = 0;
    double *klrow = bq_calloc((size_t)s->n, sizeof(double));
    BqBatch b;
    bq_batcher_seek(s->b, 0, 0);
    while (seen < s->n && bq_batcher_next(s->b, &b)) {
        int64_t rows = b.B < s->n - seen ? b.B : s->n - seen;
        if (bi++ % nr == rank) {
            size_t mark = bq_arena_mark(&s->act);
            BqTensor *logits = NULL;
            if ((st = forward_batch(s, &b, 0, NULL, NULL, NULL, NULL, &logits))) goto cleanup;
            score(s, &b, logits, seen, rows, 0, &correct, klrow);
            bq_arena_rewind(&s->act, mark);
        }
        seen += rows;
    }
    bq_dist_sum_i64(&correct, 1);
    bq_dist_sum_f64(klrow, seen);
    if (seen == 0) {
        st = bq_err(BQ_EINVAL, "sensitivity: no labelled examples to measure");
        goto cleanup;
    }
    *acc = (double)correct / (double)seen;
    *kl = row_mean(klrow, seen);
cleanup:
    free(klrow);
    return st;
}

static void set_enabled(BqQuantState *qs, const unsigned char *enabled) {
    for (int i = 0; i < qs->n; i++) qs->q[i].enabled = enabled ? enabled[i] : 1;
}

int bq_sens_measure(BqSensitivity *s, const unsigned char *enabled, double *acc, double *kl) {
    BQ_CHECK(s->measured); /* the teacher logits come from bq_sens_run_groups */
    set_enabled(s->m->quant, enabled);
    int st = run_pass(s, acc, kl);
    set_enabled(s->m->quant, NULL);
    return st;
}

/* Floats of one Linear's kept output per batch: batch tokens × its output features. */
static int64_t lin_floats(const BqSensitivity *s, int id) {
    return s->bt_max * (id == BQ_LIN_I ? s->m->cfg.intermediate_size : s->m->cfg.hidden_size);
}

/* Points the (L·BQ_LIN_ENCODER) entries of ptr at the Linear outputs of `cache` (layer-major, the six
 * Linears in BqLinearId order, lin_floats each). */
static void lin_slots(const BqSensitivity *s, float *cache, float **ptr) {
    for (int l = 0; l < s->m->cfg.num_hidden_layers; l++)
        for (int id = 0; id < BQ_LIN_ENCODER; id++) {
            ptr[l * BQ_LIN_ENCODER + id] = cache;
            cache += lin_floats(s, id);
        }
}

int bq_sens_init(BqSensitivity *s, BqBert *m, BqBatcher *b, int64_t max_examples) {
    int st = BQ_OK;
    memset(s, 0, sizeof *s);
    BqQuantState *qs = m->quant;
    if (!qs) return bq_err(BQ_EINVAL, "sensitivity: the model has no quantizers (an fp32 checkpoint)");
    for (int i = 0; i < qs->n; i++)
        if (!qs->q[i].initialized)
            return bq_err(BQ_EINVAL, "sensitivity: quantizer %s has no range (calibrate first)", qs->q[i].name);
    s->m = m;
    s->b = b;
    s->num_labels = m->cfg.num_labels;
    s->n = b->ds->n;
    if (max_examples > 0 && max_examples < s->n) s->n = max_examples;
    if (s->n <= 0) return bq_err(BQ_EINVAL, "sensitivity: no labelled examples to measure");
    s->teacher = bq_calloc((size_t)s->n * (size_t)s->num_labels, sizeof(float));
    s->labels = bq_calloc((size_t)s->n, sizeof(int32_t));
    if ((st = bq_arena_init(&s->act, (size_t)16 << 30, "sensitivity activations"))) goto cleanup;
    if ((st = bq_sens_groups(qs, &s->g, &s->ng))) goto cleanup;
    /* the per-batch caches, when they fit: batches of at most b->batch_size examples of max_len tokens */
    const int L = m->cfg.num_hidden_layers;
    const int64_t H = m->cfg.hidden_size;
    s->bt_max = (int64_t)b->batch_size * b->ds->max_len;
    int64_t hid = (L - 1) * s->bt_max * H, lin = 0;
    for (int id = 0; id < BQ_LIN_ENCODER; id++) lin += L * lin_floats(s, id);
    if (L > 1 && 2 * hid * 4 <= BQ_SENS_CACHE_MAX) {
        s->prefix_cache = 1;
        s->hid_fp32 = bq_malloc((size_t)hid * sizeof(float));
        s->hid_quant = bq_malloc((size_t)hid * sizeof(float));
    }
    if (2 * (hid + lin) * 4 <= BQ_SENS_CACHE_MAX) {
        s->reuse_linears = 1;
        s->lin_fp32 = bq_malloc((size_t)lin * sizeof(float));
        s->lin_quant = bq_malloc((size_t)lin * sizeof(float));
    }
cleanup:
    return st;
}

void bq_sens_free(BqSensitivity *s) {
    free(s->hid_fp32);
    free(s->hid_quant);
    free(s->lin_fp32);
    free(s->lin_quant);
    free(s->teacher);
    free(s->labels);
    free(s->g);
    if (s->act.base) bq_arena_free(&s->act);
    memset(s, 0, sizeof *s);
}

/* The plan of group k's two passes: start[k], the first layer its quantizers touch (with the prefix
 * cache; the embeddings' quantizer: none can be skipped; L - 1 at most), reach[k], the Linears of that
 * layer they can change (all where one sits in another layer), and the enabled rows of en (nq + 1 each):
 * row 2k only this group quantized, row 2k + 1 every quantizer but this group's. */
static void group_plan(const BqSensitivity *s, int k, int prefix, unsigned char *en, int *start, unsigned *reach) {
    const BqQuantState *qs = s->m->quant;
    const int nq = qs->n, L = s->m->cfg.num_hidden_layers;
    const BqSensGroup *g = &s->g[k];
    /* the first layer the group touches (the embeddings' quantizer: none can be skipped), and the
     * Linears of that layer its quantizers reach (all where one sits in another layer) */
    start[k] = prefix ? L - 1 : 0;
    for (int j = 0; j < g->n; j++) {
        int l = qs->q[g->q[j]].layer;
        if (l < start[k]) start[k] = l < 0 ? 0 : l;
    }
    reach[k] = 0;
    for (int j = 0; j < g->n; j++) {
        const BqQuantizer *q = &qs->q[g->q[j]];
        reach[k] |= q->layer == start[k] ? bq_bert_linear_reach(q->point) : ~0u;
    }
    /* en rows 2k: only this group quantized; 2k + 1: every quantizer but this group's */
    unsigned char *only = en + (size_t)(2 * k) * (size_t)(nq + 1), *without = only + nq + 1;
    memset(only, 0, (size_t)nq);
    memset(without, 1, (size_t)nq);
    for (int j = 0; j < g->n; j++) only[g->q[j]] = 1, without[g->q[j]] = 0;
}

/* The results after every batch: sums the per-rank counts (correct: 2·ng + 2 rows, kl: as many rows of
 * s->n) over the ranks, then the accuracies and mean KL of the references and of each group's two
 * passes, each group printed unless quiet (rank 0 only). */
static void groups_results(BqSensitivity *s, int64_t *correct, double *kl, int quiet) {
    const int ng = s->ng, rank = bq_dist_rank();
    /* every slot is one rank's value plus zeros (run_pass); then the same sums as one process */
    bq_dist_sum_i64(correct, 2 * ng + 2);
    bq_dist_sum_f64(kl, (2 * ng + 2) * s->n);
    s->acc_fp32 = (double)correct[2 * ng] / (double)s->n;
    s->acc_quant = (double)correct[2 * ng + 1] / (double)s->n;
    s->kl_quant = row_mean(kl + (2 * ng + 1) * s->n, s->n);
    s->measured = 1;
    for (int k = 0; k < ng; k++) {
        BqSensGroup *g = &s->g[k];
        g->acc_only = (double)correct[2 * k] / (double)s->n;
        g->kl_only = row_mean(kl + 2 * k * s->n, s->n);
        g->acc_without = (double)correct[2 * k + 1] / (double)s->n;
        g->kl_without = row_mean(kl + (2 * k + 1) * s->n, s->n);
        if (!quiet && rank == 0)
            fprintf(stderr, "[sensitivity] %d/%d %s: only quantized acc %.4f KL %.3g, only fp32 acc %.4f KL %.3g\n",
                    k + 1, ng, g->name, g->acc_only, g->kl_only, g->acc_without, g->kl_without);
    }
}

int bq_sens_run_groups(BqSensitivity *s, int quiet) {
    BqQuantState *qs = s->m->quant;
    const int nq = qs->n, ng = s->ng, L = s->m->cfg.num_hidden_layers, NL = L * BQ_LIN_ENCODER;
    const int64_t H = s->m->cfg.hidden_size;
    const int nr = bq_dist_size(), rank = bq_dist_rank();
    const int prefix = s->prefix_cache && s->hid_fp32, reuse = prefix && s->reuse_linears && s->lin_fp32;
    int st = BQ_OK;
    int64_t seen = 0, bi = 0, nb = (s->n + s->b->batch_size - 1) / s->b->batch_size;
    unsigned char *en = bq_malloc((size_t)(2 * ng) * ((size_t)nq + 1)), *off = bq_calloc((size_t)nq + 1, 1);
    int *start = bq_malloc((size_t)(ng > 0 ? ng : 1) * sizeof *start);
    unsigned *reach = bq_malloc((size_t)(ng > 0 ? ng : 1) * sizeof *reach);
    /* rows 2k, 2k + 1: group k's two passes; rows 2·ng, 2·ng + 1: the fp32 and all-quantized references */
    int64_t *correct = bq_calloc((size_t)(2 * ng + 2), sizeof *correct);
    double *kl = bq_calloc((size_t)(2 * ng + 2) * (size_t)s->n, sizeof *kl);
    float **keep_f = bq_calloc((size_t)NL, sizeof(float *)), **keep_q = bq_calloc((size_t)NL, sizeof(float *));
    const float **use = bq_calloc((size_t)NL, sizeof(float *));
    double t0 = bq_now();
    if (reuse) {
        lin_slots(s, s->lin_fp32, keep_f);
        lin_slots(s, s->lin_quant, keep_q);
    }
    for (int k = 0; k < ng; k++) group_plan(s, k, prefix, en, start, reach);
    /* batch by batch: the fp32 and the all-quantized passes keep their layer and Linear outputs, then each
     * group's two passes start from them (the layers before the group's compute exactly those values) */
    BqBatch b;
    bq_batcher_seek(s->b, 0, 0);
    while (seen < s->n && bq_batcher_next(s->b, &b)) {
        int64_t rows = b.B < s->n - seen ? b.B : s->n - seen;
        if (bi++ % nr != rank) {
            seen += rows;
            continue;
        }
        const int64_t bth = b.B * b.T * H, nn = s->n;
        BQ_CHECK(b.B * b.T <= s->bt_max);
        size_t mark = bq_arena_mark(&s->act);
        BqTensor *z = NULL;
        /* the references: fp32 (every quantizer off; its logits become the teacher of this batch's rows),
         * then every quantizer on; with the caches they keep their layer and Linear outputs */
        set_enabled(qs, off);
        st = forward_batch(s, &b, 0, NULL, prefix ? s->hid_fp32 : NULL, reuse ? keep_f : NULL, NULL, &z);
        set_enabled(qs, NULL);
        if (!st) score(s, &b, z, seen, rows, 1, &correct[2 * ng], kl + 2 * ng * nn);
        bq_arena_rewind(&s->act, mark);
        if (st) goto cleanup;
        st = forward_batch(s, &b, 0, NULL, prefix ? s->hid_quant : NULL, reuse ? keep_q : NULL, NULL, &z);
        if (!st) score(s, &b, z, seen, rows, 0, &correct[2 * ng + 1], kl + (2 * ng + 1) * nn);
        bq_arena_rewind(&s->act, mark);
        if (st) goto cleanup;
        for (int k = 0; k < ng; k++)
            for (int w = 0; w < 2; w++) {
                /* w 0: only the group quantized, from the fp32 reference; w 1: all but the group, from the
                 * all-quantized one */
                float *const *lin = w ? keep_q : keep_f;
                const int base = start[k] * BQ_LIN_ENCODER;
                int nuse = 0;
                memset(use, 0, (size_t)NL * sizeof *use);
                for (int id = 0; reuse && id < BQ_LIN_ENCODER; id++)
                    if (!(reach[k] >> id & 1u)) use[base + id] = lin[base + id], nuse++;
                const float *from = start[k] > 0 ? (w ? s->hid_quant : s->hid_fp32) + (start[k] - 1) * bth : NULL;
                set_enabled(qs, en + (size_t)(2 * k + w) * (size_t)(nq + 1));
                st = forward_batch(s, &b, start[k], from, NULL, NULL, nuse ? use : NULL, &z);
                set_enabled(qs, NULL);
                if (st) goto cleanup;
                score(s, &b, z, seen, rows, 0, &correct[2 * k + w], kl + (2 * k + w) * nn);
                s->reused += nuse;
                bq_arena_rewind(&s->act, mark);
            }
        seen += rows;
        if (!quiet && rank == 0)
            fprintf(stderr, "[sensitivity] batch %lld/%lld done: %lld of %lld examples (%.0fs)\n", (long long)bi,
                    (long long)nb, (long long)seen, (long long)s->n, bq_now() - t0);
    }
    groups_results(s, correct, kl, quiet);
cleanup:
    set_enabled(qs, NULL);
    free(en);
    free(off);
    free(start);
    free(reach);
    free(correct);
    free(kl);
    free(keep_f);
    free(keep_q);
    free(use);
    return st;
}

int *bq_sens_order(const BqSensitivity *s) {
    int *o = bq_malloc((size_t)(s->ng > 0 ? s->ng : 1) * sizeof *o);
    for (int k = 0; k < s->ng; k++) o[k] = k;
    /* insertion sort (stable: table order among equals) */
    for (int i = 1; i < s->ng; i++) {
        int v = o[i], j = i;
        const BqSensGroup *a = &s->g[v];
        while (j > 0) {
            const BqSensGroup *p = &s->g[o[j - 1]];
            int before = a->acc_only < p->acc_only || (a->acc_only == p->acc_only && a->kl_only > p->kl_only);
            if (!before) break;
            o[j] = o[j - 1];
            j--;
        }
        o[j] = v;
    }
    return o;
}

int bq_sens_keep_fp32(BqSensitivity *s, double max_drop_points, unsigned char *keep, int *kept, double *acc,
                      int quiet) {
    const int nq = s->m->quant->n;
    int *order = bq_sens_order(s);
    unsigned char *en = bq_malloc((size_t)nq + 1);
    int st = BQ_OK;
    memset(keep, 0, (size_t)s->ng);
    memset(en, 1, (size_t)nq);
    *kept = 0;
    *acc = s->acc_quant;
    for (int k = 0; k <= s->ng; k++) {
        if ((s->acc_fp32 - *acc) * 100.0 <= max_drop_points + 1e-9) break;
        if (k == s->ng) break;
        const BqSensGroup *g = &s->g[order[k]];
        keep[order[k]] = 1;
        (*kept)++;
        for (int j = 0; j < g->n; j++) en[g->q[j]] = 0;
        double kl;
        if ((st = bq_sens_measure(s, en, acc, &kl))) goto cleanup;
        if (!quiet)
            fprintf(stderr, "[keep-fp32] + %s: accuracy %.4f (fp32 %.4f, drop %.2f points)\n", g->name, *acc,
                    s->acc_fp32, (s->acc_fp32 - *acc) * 100.0);
    }
cleanup:
    free(order);
    free(en);
    return st;
}

int bq_sens_exclude(BqBert *m, const char *entries, const char *flag) {
    int st = BQ_OK;
    BqQuantState *old = m->quant, *qs = NULL;
    BQ_CHECK(old != NULL);
    BqQuantConfig cfg = old->cfg;
    char *list = bq_malloc(strlen(entries) + 1);
    strcpy(list, entries);
    for (char *e = strtok(list, ","); e; e = strtok(NULL, ",")) {
        while (*e == ' ') e++;
        size_t len = strlen(e);
        while (len > 0 && e[len - 1] == ' ') e[--len] = '\0';
        if (!len) continue;
        /* the entry on top of the list as it stands, so that it is judged by what it adds */
        BqQuantConfig probe = old->cfg;
        int used = snprintf(probe.exclude, sizeof probe.exclude, "%s%s%s", old->cfg.exclude,
                            old->cfg.exclude[0] ? "," : "", e);
        BQ_CHECK(used >= 0);
        if ((size_t)used >= sizeof probe.exclude) {
            st = bq_err(BQ_EINVAL, "%s: the exclude list with '%s' would exceed %zu characters", flag, e,
                        sizeof probe.exclude - 1);
            goto cleanup;
        }
        if ((st = bq_quant_create(&qs, m, &probe))) goto cleanup;
        int selects = qs->n < old->n;
        bq_quant_free(qs);
        qs = NULL;
        if (!selects) {
            st = bq_err(BQ_EINVAL, "%s: '%s' selects no quantizer of the %s scheme", flag, e,
                        bq_scheme_name(old->cfg.scheme));
            goto cleanup;
        }
        size_t cur = strlen(cfg.exclude);
        if (cur + 1 + len + 1 > sizeof cfg.exclude) {
            st = bq_err(BQ_EINVAL, "%s: the exclude list would exceed %zu characters", flag, sizeof cfg.exclude - 1);
            goto cleanup;
        }
        snprintf(cfg.exclude + cur, sizeof cfg.exclude - cur, "%s%s", cur ? "," : "", e);
    }
    if ((st = bq_quant_create(&qs, m, &cfg))) goto cleanup;
    for (int i = 0; i < qs->n; i++) {
        BqQuantizer *q = &qs->q[i];
        const BqQuantizer *o = NULL;
        for (int k = 0; k < old->n && !o; k++)
            if (!strcmp(old->q[k].name, q->name)) o = &old->q[k];
        BQ_CHECK(o && o->nch == q->nch && o->bits == q->bits);
        memcpy(q->amax, o->amax, (size_t)q->nch * sizeof *q->amax);
        memcpy(q->scale, o->scale, (size_t)q->nch * sizeof *q->scale);
        if (q->ch_min && o->ch_min) {
            memcpy(q->ch_min, o->ch_min, (size_t)q->nch * sizeof *q->ch_min);
            memcpy(q->ch_max, o->ch_max, (size_t)q->nch * sizeof *q->ch_max);
        }
        q->initialized = o->initialized;
        q->frozen = o->frozen;
        q->run_min = o->run_min;
        q->run_max = o->run_max;
    }
    qs->observe = old->observe;
    qs->steps_seen = old->steps_seen;
    bq_quant_free(old);
    m->quant = qs;
    qs = NULL;
cleanup:
    if (qs) bq_quant_free(qs);
    free(list);
    return st;
}
