/* What the int8 engine's inference holds in memory, by byte accounting rather than by resident-set
 * figures (which depend on the allocator and the machine):
 *  - a loaded checkpoint has no gradient block (the trainer adds one, bq_bert_grad_alloc);
 *  - packed while the checkpoint loads (bq_ckpt_load_with + bq_int8_begin/bq_int8_load_step, as eval
 *    and predict do), the engine leaves the model no fp32 copy of any weight it runs on integers:
 *    bq_bert_param_bytes drops by exactly those weights, their views have no data, and their pages are
 *    not resident but still reserved (mincore succeeds and reports none of them resident; a kept
 *    tensor's are all resident), so no other mapping can take their addresses; their quantizers' QAT
 *    observer state goes too, and saving such a model is refused with one error naming a weight;
 *  - during that load the fp32 weights of the integer Linears held at any moment never exceed one group's
 *    (query/key/value, or one of the other three Linears: bq_int8_load_step), the largest being the
 *    intermediate's H·I floats (the whole fp32 model is never resident);
 *  - the engine's own bytes (codes, scales, biases) stay below 0.3x the fp32 bytes it replaced at load
 *    (1 byte of codes per weight), and so they stay after a forward, when oneDNN's layout has taken the
 *    plain codes' place (the codes are not kept next to it);
 *  - the logits equal, bit for bit, those of the engine prepared from the fully loaded model;
 *  - the engine's blocks of rows (whose int32 sums it holds at once) are what BQ_INT8_BLOCK_BYTES_PER_THREAD
 *    per thread allows for the intermediate's sums, within BQ_FUSED_BLOCK_BYTES (check_step_rows);
 *  - a forward's activations take the room of one layer, not of every layer: the activation arena's
 *    high-water mark of one evaluation forward is the same, to the byte, for 2 and 4 encoder layers, on
 *    the fp32 engine (bq_fp32_forward) and on the integer engine, whose fused layers write their outputs
 *    over their inputs (layers/bert_fused.h: keeping every layer's output then takes at least the room of
 *    the three full-size outputs more), and on the fake-quant forward op by op
 *    (bq_bert_forward, the path of the ort and qdqbert schemes), which copies each layer's output into
 *    one of two buffers and gives the layer's activations back; keeping every layer's output
 *    (BqBertInput.hidden) takes more room and gives the same logits, bit for bit; the fp32 engine in
 *    blocks of one sequence (bq_fused_set_block_rows) holds one block's query/key/value products, not every
 *    row's (a bound its earlier build, which held them all, exceeds); the integer engine in
 *    passes of one example (bq_int8_set_pass_rows: passes of whole examples of at most that many rows)
 *    takes less than half the batch's room and gives the same logits, bit for bit, as it does for a
 *    question-answering head's (B,T,2) logits; the integer engine's peak is that of its intermediate dense,
 *    where the layer holds only its output's room (the attention LayerNorm's output written over it), the
 *    next layer's codes, the LayerNorm output's codes and one block's sums and GELU codes; with its widest
 *    products in column pieces (bq_int8_set_piece_macs) one piece's sums instead of the block's, and the
 *    same logits.
 * The model is a random cpu-scheme PTQ, 2 layers, hidden 256, intermediate 1024 (weights of whole pages),
 * max-calibrated on random batches and saved as a checkpoint. */
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "autograd/infer_kernels.h"
#include "autograd/qgemm.h"
#include "export/ckpt.h"
#include "layers/bert_fp32.h"
#include "layers/bert_fused.h"
#include "layers/bert_int8.h"
#include "layers/quant.h"
#include "tests/test_util.h"

enum { B = 3, T = 16, L = 2, H = 256, I = 1024, NCAL = 3, VOCAB = 500 };

typedef struct Batch {
    int32_t ids[B * T], types[B * T];
    float mask[B * T];
} Batch;

static BqBertInput input_of(const Batch *bt) {
    BqBertInput in = {.B = B, .T = T, .input_ids = bt->ids, .attention_mask = bt->mask, .token_type_ids = bt->types};
    return in;
}

/* A random model of `layers` encoder layers into m (intermediate size inter), with a classification head or
 * (qa) a question-answering one; with quant, its cpu-scheme PTQ, max-calibrated on random batches. */
static void make_model_inter(BqBert *m, int layers, int quant, int qa, int inter) {
    BqRng rng;
    bq_rng_seed(&rng, 11);
    BqBertConfig c = bq_test_config(VOCAB, H, layers, 4, inter, 64, 2, 0.0f, 0.05f);
    if (qa) c.head = BQ_HEAD_QA;
    BQ_CHECK(bq_bert_create(m, &c, 0, &rng) == BQ_OK);
    if (quant) bq_test_calibrate(m, "cpu", &rng, NCAL, B, T, VOCAB);
}

static void make_model(BqBert *m, int layers, int quant, int qa) { make_model_inter(m, layers, quant, qa, I); }

static void free_model(BqBert *m) {
    bq_quant_free(m->quant);
    m->quant = NULL;
    bq_bert_free(m);
}

/* The random cpu-scheme PTQ of L layers, saved to dir. */
static void make_checkpoint(const char *dir) {
    BqBert m;
    make_model(&m, L, 1, 0);
    BQ_CHECK(bq_ckpt_save(&m, dir, NULL, NULL) == BQ_OK);
    free_model(&m);
}

/* The engine's default block of rows (bq_int8_step_rows), on every CPU: the rows whose intermediate int32
 * sums take BQ_INT8_BLOCK_BYTES_PER_THREAD per thread, at most BQ_FUSED_BLOCK_ROWS and BQ_FUSED_BLOCK_BYTES'
 * worth (an intermediate of 3,072, BERT-base's: 128, 256 and 512 rows on 1, 2 and 4 threads), read anew
 * when the thread count changes. */
static void check_step_rows(void) {
    static const int inters[2] = {I, 3072}, threads[3] = {1, 2, 4};
    static const int64_t expect[2][3] = {{384, 768, 1024}, {128, 256, 512}};
    const int saved = omp_get_max_threads();
    for (int k = 0; k < 2; k++) {
        BqBert m;
        make_model_inter(&m, 1, 1, 0, inters[k]);
        BqInt8Engine *e = NULL;
        BQ_CHECK(bq_int8_prepare(&e, &m) == BQ_OK);
        for (int t = 0; t < 3; t++) {
            omp_set_num_threads(threads[t]);
            const int64_t cap = bq_fused_block_rows(inters[k]);
            const int64_t by = (int64_t)threads[t] * BQ_INT8_BLOCK_BYTES_PER_THREAD / (4 * (int64_t)inters[k]);
            const int64_t want = by < cap ? by : cap, got = bq_int8_step_rows(e);
            printf("intermediate %d, %d threads: blocks of %lld rows\n", inters[k], threads[t], (long long)got);
            EXPECT(got == want && want == expect[k][t], "intermediate %d, %d threads: blocks of %lld rows, expected %lld",
                   inters[k], threads[t], (long long)got, (long long)expect[k][t]);
        }
        bq_int8_set_step_rows(e, 7);
        EXPECT(bq_int8_step_rows(e) == 7, "a block size set by hand is not kept");
        bq_int8_free(e);
        free_model(&m);
    }
    omp_set_num_threads(saved);
}

/* The engine's default passes (bq_int8_set_pass_rows): the rows whose fp32 hidden states take
 * BQ_INT8_PASS_BYTES (6,144 rows at hidden 256), and a batch of 8 examples more than one such pass takes
 * one pass's room (its first pass's, plus the logits) and gives the first pass's examples the same logits. */
static void check_pass_rows(void) {
    enum { NP = BQ_INT8_PASS_BYTES / (4 * H) / T, NB = NP + 8 }; /* examples of one pass, of the batch */
    BqBert m;
    make_model(&m, 1, 1, 0);
    BqInt8Engine *e = NULL;
    BQ_CHECK(bq_int8_prepare(&e, &m) == BQ_OK);
    printf("hidden %d: passes of %lld rows\n", H, (long long)bq_int8_pass_rows(e));
    EXPECT(bq_int8_pass_rows(e) == (int64_t)NP * T && NP * T == 6144, "hidden %d: passes of %lld rows, expected %d",
           H, (long long)bq_int8_pass_rows(e), NP * T);
    int32_t *ids = bq_malloc(sizeof(int32_t) * NB * T), *types = bq_malloc(sizeof(int32_t) * NB * T);
    float *mask = bq_malloc(sizeof(float) * NB * T), first[NP * 2];
    BqRng rng;
    bq_rng_seed(&rng, 9);
    bq_test_padded_batch(ids, types, mask, NB, T, &rng, VOCAB, 3);
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 28, "act") == BQ_OK);
    size_t peak[2];
    int same = 1;
    for (int k = 0; k < 2; k++) {
        BqCtx ctx = {.act = &act};
        BqBertInput in = {.B = k ? NB : NP, .T = T, .input_ids = ids, .attention_mask = mask, .token_type_ids = types};
        BqTensor *lg;
        act.peak = 0;
        BQ_CHECK(bq_int8_forward(e, &m, &ctx, &in, &lg) == BQ_OK);
        peak[k] = act.peak;
        if (!k) memcpy(first, lg->data, sizeof first);
        else same = memcmp(first, lg->data, sizeof first) == 0;
        bq_arena_rewind(&act, 0);
    }
    printf("hidden %d: activation arena peak %zu bytes for %d examples of %d tokens (one pass), %zu for %d\n", H,
           peak[0], NP, T, peak[1], NB);
    EXPECT(peak[1] <= peak[0] + sizeof(float) * 2 * NB + 4096,
           "%d examples take %zu bytes against %zu for one pass of %d: the batch ran in one pass", NB, peak[1], peak[0],
           NP);
    EXPECT(same, "the first pass's logits differ from those of its examples alone");
    bq_arena_free(&act);
    free(ids);
    free(types);
    free(mask);
    bq_int8_free(e);
    free_model(&m);
}

/* The forwards compared by forward_peak. */
enum { FWD_FP32, FWD_INT8, FWD_FAKE_QUANT, FWD_COUNT };
static const char *const fwd_name[FWD_COUNT] = {"fp32", "int8", "fake quant, op by op"};

/* The activation arena's high-water mark of one evaluation forward of bt on a random model of `layers`
 * encoder layers: the fp32 engine, the integer engine of its cpu-scheme PTQ, or that PTQ's fake-quant
 * forward op by op (bq_bert_forward, which copies each layer's output into one of two buffers and gives
 * the layer's activations back); the logits go to out. With hidden, the forward keeps every layer's
 * output (BqBertInput.hidden). */
static size_t forward_peak(int layers, int fwd, int hidden, const Batch *bt, float *out, int64_t pass_rows) {
    BqBert m;
    const int int8 = fwd == FWD_INT8;
    make_model(&m, layers, fwd != FWD_FP32, 0);
    BqInt8Engine *e = NULL;
    if (int8) {
        BQ_CHECK(bq_int8_prepare(&e, &m) == BQ_OK);
        bq_int8_set_pass_rows(e, pass_rows);
        EXPECT(bq_int8_fused_layer_count(e) == layers, "int8, %d layers: every layer fused", layers);
    } else if (fwd == FWD_FP32) {
        EXPECT(bq_fp32_fused_layer_count(&m) == layers, "fp32, %d layers: every layer fused", layers);
    }
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 28, "act") == BQ_OK);
    BqCtx ctx = {.act = &act};
    BqBertInput in = input_of(bt);
    BqTensor *hs[8], *logits;
    BQ_CHECK(layers <= 8);
    if (hidden) in.hidden = hs;
    BQ_CHECK((int8                      ? bq_int8_forward(e, &m, &ctx, &in, &logits)
              : fwd == FWD_FAKE_QUANT ? bq_bert_forward(&m, &ctx, &in, &logits, NULL)
                                        : bq_fp32_forward(&m, &ctx, &in, &logits)) == BQ_OK);
    memcpy(out, logits->data, sizeof(float) * B * 2);
    const size_t peak = act.peak;
    bq_arena_free(&act);
    bq_int8_free(e);
    free_model(&m);
    return peak;
}

/* The activations of a forward do not grow with the number of layers (see the top of the file). */
static void check_activation_peaks(const Batch *bt) {
    for (int fwd = 0; fwd < FWD_COUNT; fwd++) {
        const char *name = fwd_name[fwd];
        float l2[B * 2], l4[B * 2], k4[B * 2];
        const size_t p2 = forward_peak(2, fwd, 0, bt, l2, 0), p4 = forward_peak(4, fwd, 0, bt, l4, 0);
        const size_t k = forward_peak(4, fwd, 1, bt, k4, 0);
        printf("%s: activation arena peak %zu bytes with 2 layers, %zu with 4; %zu keeping every layer's output\n",
               name, p2, p4, k);
        EXPECT(p2 == p4, "%s: the activation peak grows with the layers (%zu bytes for 2, %zu for 4)", name, p2, p4);
        EXPECT(k > p4, "%s: keeping every layer's output takes no more room", name);
        const size_t out_bytes = (size_t)B * T * H * sizeof(float); /* one full-size layer output */
        EXPECT(fwd == FWD_FAKE_QUANT || k - p4 >= 3 * out_bytes,
               "%s: the fused layers' outputs take room of their own (%zu bytes less than keeping 4 layers' "
               "outputs; at least %zu when each layer writes over its input)", name, k - p4, 3 * out_bytes);
        EXPECT(memcmp(l4, k4, sizeof l4) == 0, "%s: logits differ when every layer's output is kept", name);
        if (fwd == FWD_FP32) { /* blocks of one sequence: the query/key/value bracket holds one block's products */
            float b4[B * 2];
            bq_fused_set_block_rows(T);
            const size_t pb = forward_peak(4, fwd, 0, bt, b4, 0);
            bq_fused_set_block_rows(0);
            /* x, a and the context (4·M·H bytes each) with one block's products (12·T·H), the biases (12·H) and
             * the attention's scratch; or, in the intermediate dense, x, a and one block's (T, I) floats */
            const size_t MH = (size_t)B * T * H, TH = (size_t)T * H, d = H / 4;
            const size_t scr = (size_t)omp_get_max_threads() * (size_t)bq_infer_attention_scratch(T, d) * 4;
            const size_t qkv = 12 * MH + 12 * TH + 12 * (size_t)H + scr, mlp = 8 * MH + 4 * (size_t)T * I;
            const size_t bound = (qkv > mlp ? qkv : mlp) + 4096;
            printf("fp32: activation arena peak %zu bytes in blocks of one sequence (bound %zu)\n", pb, bound);
            EXPECT(pb <= bound, "fp32: blocks of one sequence take %zu bytes, more than %zu (the query/key/value "
                   "bracket holds every row's products?)", pb, bound);
            /* OpenBLAS rounds a row differently for another M (layers/bert_int8.c, row_linear) */
            double dmax = 0.0;
            for (int i = 0; i < B * 2; i++) dmax = fmax(dmax, fabs((double)l4[i] - b4[i]));
            printf("fp32: blocks of one sequence against the batch at once: max |logit difference| %.3g\n", dmax);
            EXPECT(dmax <= 1e-5, "fp32: logits in blocks of one sequence differ by %.3g", dmax);
        }
        if (fwd != FWD_INT8) continue;
        /* the fused layers' room at its largest, in the intermediate dense: the output's room (the embeddings'
         * output, M·H floats), which a's floats share (BqFusedEngine.resid_in_place), the next layer's codes
         * (M·H), a's codes (M·H) and one block's int32 sums and GELU codes (5·mb·I); 4 KiB more for the ids,
         * the mask and alignment. The context and layer 0's input codes (M·H each) are not held then
         * (layers/bert_fused.h); a's floats in room of their own would take 4·M·H more. */
        const int64_t blk = bq_fused_block_rows(I);
        const size_t MH = (size_t)B * T * H, mb = (size_t)(blk < B * T ? blk : B * T);
        const size_t ideal = 6 * MH + 5 * mb * I;
        EXPECT(p4 <= ideal + 4096, "%s: activation peak %zu bytes, more than %zu + 4096 (a's floats, a context or "
               "input codes held through the intermediate dense?)", name, p4, ideal);
        /* with the query/key/value product and the intermediate dense in 4 column pieces each
         * (bq_int8_set_piece_macs: heads of 64, 256 columns): one piece's int32 sums, a quarter of the
         * block's, so the intermediate dense holds 6·M·H + mb·I (GELU codes) + mb·I (a piece's sums) */
        float q4[B * 2];
        bq_int8_set_piece_macs(1);
        const size_t pq = forward_peak(4, fwd, 0, bt, q4, 0);
        bq_int8_set_piece_macs(0);
        const size_t ideal_pieces = 6 * MH + 2 * mb * I;
        printf("%s: activation arena peak %zu bytes with the widest products in 4 pieces (bound %zu + 4096)\n", name,
               pq, ideal_pieces);
        EXPECT(pq <= ideal_pieces + 4096, "%s: in pieces the activation peak is %zu bytes, more than %zu + 4096 (the "
               "block's int32 sums held whole?)", name, pq, ideal_pieces);
        EXPECT(memcmp(l4, q4, sizeof l4) == 0, "%s: logits differ with the products in pieces", name);
        /* passes of one example (bq_int8_set_pass_rows(e, T)): one example's activations and the logits */
        float c4[B * 2];
        const size_t pc = forward_peak(4, fwd, 0, bt, c4, T);
        printf("%s: activation arena peak %zu bytes in passes of one example\n", name, pc);
        EXPECT(pc < p4 / 2, "%s: passes of one example of %d take %zu bytes against %zu for the batch", name, B, pc,
               p4);
        EXPECT(memcmp(l4, c4, sizeof l4) == 0, "%s: logits differ in passes of one example", name);
    }
}

/* The question-answering head's logits (B,T,2) on the integer engine in passes of one example equal, bit
 * for bit, those of the batch in one pass. */
static void check_qa_passes(const Batch *bt) {
    BqBert m;
    make_model(&m, L, 1, 1);
    BqInt8Engine *e = NULL;
    BQ_CHECK(bq_int8_prepare(&e, &m) == BQ_OK);
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 28, "act") == BQ_OK);
    BqCtx ctx = {.act = &act};
    BqBertInput in = input_of(bt);
    static float one[B * T * 2];
    BqTensor *lg;
    BQ_CHECK(bq_int8_forward(e, &m, &ctx, &in, &lg) == BQ_OK);
    BQ_CHECK(lg->ndim == 3 && lg->shape[0] == B && lg->shape[1] == T && lg->shape[2] == 2);
    memcpy(one, lg->data, sizeof one);
    bq_arena_rewind(&act, 0);
    bq_int8_set_pass_rows(e, T);
    BQ_CHECK(bq_int8_forward(e, &m, &ctx, &in, &lg) == BQ_OK);
    EXPECT(lg->ndim == 3 && lg->shape[0] == B && lg->shape[1] == T && lg->shape[2] == 2 &&
               memcmp(one, lg->data, sizeof one) == 0,
           "QA head: logits in passes of one example differ from the batch's");
    printf("QA head: logits (%d,%d,2) in passes of one example %s those of one pass\n", B, T,
           memcmp(one, lg->data, sizeof one) ? "differ from" : "equal");
    bq_arena_free(&act);
    bq_int8_free(e);
    free_model(&m);
}

/* 1 for the weight of an encoder Linear (the six per layer the cpu scheme runs on integers). */
static int is_linear_weight(const char *name) {
    static const char *const tails[5] = {"self.query.weight", "self.key.weight", "self.value.weight",
                                         "output.dense.weight", "intermediate.dense.weight"};
    if (strncmp(name, "bert.encoder.layer.", 19)) return 0;
    for (int k = 0; k < 5; k++) {
        size_t n = strlen(name), t = strlen(tails[k]);
        if (n >= t && !strcmp(name + n - t, tails[k])) return 1;
    }
    return 0;
}

/* The load hook: the engine begun at the first tensor, each layer packed when it is in, and the largest
 * number of fp32 bytes of encoder Linear weights read and not yet released at any point. */
typedef struct Load {
    BqInt8Engine *e;
    int64_t held_max;
} Load;

static int on_param(void *user, BqBert *m, int i) {
    Load *ld = user;
    if (!ld->e) BQ_CHECK(bq_int8_begin(&ld->e, m) == BQ_OK);
    int64_t held = 0;
    for (int k = 0; k <= i; k++)
        if (is_linear_weight(m->params.p[k].name) && !(m->params.released && m->params.released[k]))
            held += m->params.p[k].numel * 4;
    if (held > ld->held_max) ld->held_max = held;
    return bq_int8_load_step(ld->e, m, i);
}

static void logits_of(BqInt8Engine *e, BqBert *m, const Batch *bt, float *out) {
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 28, "act") == BQ_OK);
    BqCtx ctx = {.act = &act};
    BqBertInput in = input_of(bt);
    BqTensor *logits;
    BQ_CHECK(bq_int8_forward(e, m, &ctx, &in, &logits) == BQ_OK);
    memcpy(out, logits->data, sizeof(float) * B * 2);
    bq_arena_free(&act);
}

/* 1 when every whole page inside [p, p + bytes) is resident, 0 when none is. The range must still be
 * mapped (mincore succeeds): a released tensor's pages stay reserved, so that no other mapping can be
 * placed in the hole and then be unmapped with the parameter block. */
static int pages_resident(const void *p, size_t bytes) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (uintptr_t)p, hi = lo + bytes;
    const uintptr_t a = (lo + page - 1) / page * page, b = hi / page * page;
    BQ_CHECK(b > a);
    unsigned char vec[1024];
    size_t np = (b - a) / page, in = 0;
    BQ_CHECK(np <= sizeof vec);
    if (mincore((void *)a, b - a, vec) != 0) return -1; /* unmapped: the hole could be reused */
    for (size_t k = 0; k < np; k++) in += vec[k] & 1;
    return in == np ? 1 : in == 0 ? 0 : -1;
}

int main(void) {
    char tmp[256], dir[300];
    bq_test_tmpdir(tmp, sizeof tmp, "int8_memory");
    snprintf(dir, sizeof dir, "%s/ptq", tmp);
    make_checkpoint(dir);
    check_step_rows();
    check_pass_rows();
    BqRng rng;
    bq_rng_seed(&rng, 5);
    Batch bt;
    bq_test_padded_batch(bt.ids, bt.types, bt.mask, B, T, &rng, VOCAB, 3);

    /* the reference: the whole model loaded, then the engine prepared from it */
    BqBert m1;
    memset(&m1, 0, sizeof m1);
    EXPECT(bq_ckpt_load(&m1, dir) == BQ_OK, "load: %s", bq_errmsg());
    EXPECT(m1.params.grad == NULL && m1.word_emb.grad == NULL, "a loaded model has no gradient block");
    int64_t all = 0, lin = 0, group_lin = 0;
    for (int i = 0; i < m1.params.n; i++) {
        all += m1.params.p[i].numel * 4;
        if (is_linear_weight(m1.params.p[i].name)) lin += m1.params.p[i].numel * 4;
    }
    group_lin = (int64_t)(3 * H * H > H * I ? 3 * H * H : H * I) * 4;
    EXPECT(bq_bert_param_bytes(&m1) == all, "every parameter held after a plain load");
    BqInt8Engine *e1 = NULL;
    EXPECT(bq_int8_prepare(&e1, &m1) == BQ_OK && bq_int8_linear_count(e1) == 6 * L, "prepare: %s", bq_errmsg());
    EXPECT(bq_bert_param_bytes(&m1) == all, "bq_int8_prepare releases nothing");
    float ref[B * 2];
    logits_of(e1, &m1, &bt, ref);

    /* packed while loading */
    BqBert m2;
    memset(&m2, 0, sizeof m2);
    Load ld = {0};
    BqCkptLoadHook hook = {.param_read = on_param, .user = &ld};
    EXPECT(bq_ckpt_load_with(&m2, dir, &hook) == BQ_OK, "load with the engine: %s", bq_errmsg());
    EXPECT(ld.e && bq_int8_linear_count(ld.e) == 6 * L, "every encoder Linear on integers");
    printf("fp32 parameters %lld bytes, of which encoder Linear weights %lld; after the load %lld; engine %lld\n",
           (long long)all, (long long)lin, (long long)bq_bert_param_bytes(&m2), (long long)bq_int8_bytes(ld.e));
    EXPECT(bq_bert_param_bytes(&m2) == all - lin, "no fp32 copy of an integer Linear's weight is kept");
    EXPECT(ld.held_max <= group_lin, "at most one group's fp32 Linear weights at once (%lld > %lld bytes)",
           (long long)ld.held_max, (long long)group_lin);
    for (int l = 0; l < L; l++) {
        const BqBertLayer *Ly = &m2.layers[l];
        EXPECT(!Ly->q_w.data && !Ly->k_w.data && !Ly->v_w.data && !Ly->ao_w.data && !Ly->i_w.data && !Ly->o_w.data,
               "layer %d: released weights have no data", l);
        EXPECT(Ly->q_b.data && Ly->ln1_w.data && Ly->ln2_b.data, "layer %d: biases and LayerNorms kept", l);
        char name[BQ_NAME_MAX];
        snprintf(name, sizeof name, "bert.encoder.layer.%d.intermediate.dense.weight", l);
        const BqParam *pi = &m2.params.p[bq_params_find(&m2.params, name)];
        EXPECT(pages_resident(m2.params.data + pi->offset, (size_t)pi->numel * 4) == 0,
               "layer %d: released pages are reserved and not resident", l);
        int observers = 0; /* the weight quantizers' QAT observer state goes with the weights */
        for (int i = 0; i < m2.quant->n; i++)
            observers += m2.quant->q[i].layer == l && m2.quant->q[i].is_weight && m2.quant->q[i].ch_min != NULL;
        EXPECT(observers == 0, "layer %d: %d weight quantizers keep their observer state", l, observers);
    }
    /* a model whose weights the engine took cannot be saved: one clear error naming a weight */
    char dir_save[600];
    snprintf(dir_save, sizeof dir_save, "%s.saved", dir);
    bq_err_clear();
    EXPECT(bq_ckpt_save(&m2, dir_save, NULL, NULL) == BQ_EINVAL && strstr(bq_errmsg(), ".weight") &&
               strstr(bq_errmsg(), "cannot be saved") && !bq_ckpt_is_native(dir_save),
           "save of a released model: '%s'", bq_errmsg());
    printf("save of the engine's model: %s\n", bq_errmsg());
    EXPECT(pages_resident(m2.word_emb.data, (size_t)VOCAB * H * 4) == 1, "kept pages stay resident");
    const int64_t loaded = bq_int8_bytes(ld.e);
    EXPECT(loaded < lin * 3 / 10, "engine bytes %lld at load against %lld fp32 bytes replaced", (long long)loaded,
           (long long)lin);
    float got[B * 2];
    logits_of(ld.e, &m2, &bt, got);
    EXPECT(memcmp(ref, got, sizeof ref) == 0, "logits bit-identical to the engine prepared after a full load");
    /* after a forward: oneDNN's layout (1 byte per weight here: no dimension needs padding) instead of the
     * plain codes, not next to them */
    printf("engine %lld bytes after a forward\n", (long long)bq_int8_bytes(ld.e));
    EXPECT(bq_int8_bytes(ld.e) < lin * 3 / 10, "engine bytes %lld after a forward against %lld fp32 bytes replaced: "
           "the plain codes are kept next to oneDNN's layout", (long long)bq_int8_bytes(ld.e), (long long)lin);
    check_activation_peaks(&bt);
    check_qa_passes(&bt);

    bq_int8_free(e1);
    bq_int8_free(ld.e);
    bq_quant_free(m1.quant);
    bq_quant_free(m2.quant);
    m1.quant = m2.quant = NULL;
    bq_bert_free(&m1);
    bq_bert_free(&m2);
    bq_test_rmtree(tmp);
    if (!fails) printf("ok\n");
    return fails ? 1 : 0;
}
