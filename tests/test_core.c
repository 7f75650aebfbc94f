/* Core services (autograd/core.c, src/cli/args.c): arena alignment, zeroing, rewind and capacity
 * accounting, the 4 KiB pages of its first bytes; RNG determinism and ranges; the counter hash (fixed values for fixed inputs, so dropout
 * masks cannot drift silently, and uniform in [0,1)); tensor helpers; the flag parser (--name value,
 * --name=value, flags, ranges, unknown/missing/required errors). Prints the max error (of the
 * uniformity checks). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "autograd/bq.h"
#include "autograd/tensor.h"
#include "src/cli/args.h"

static int fails = 0;
#define EXPECT(c)                                                   \
    do {                                                            \
        if (!(c)) {                                                 \
            printf("  FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);   \
            fails++;                                                \
        }                                                           \
    } while (0)

int main(void) {
    double max_err = 0.0;
    /* arena */
    BqArena a;
    EXPECT(bq_arena_init(&a, (size_t)1 << 26, "test") == BQ_OK);
    char *p1 = bq_arena_alloc(&a, 3);
    char *p2 = bq_arena_alloc(&a, 100);
    EXPECT(((uintptr_t)p1 % 64) == 0 && ((uintptr_t)p2 % 64) == 0 && p2 > p1);
    size_t mark = bq_arena_mark(&a);
    float *z = bq_arena_alloc(&a, 1000 * sizeof(float));
    for (int i = 0; i < 1000; i++) z[i] = 7.0f;
    bq_arena_rewind(&a, mark);
    float *z2 = bq_arena_alloc_zero(&a, 1000 * sizeof(float));
    EXPECT(z2 == z); /* rewinding reuses the same memory ... */
    int nz = 0;
    for (int i = 0; i < 1000; i++) nz += z2[i] != 0.0f;
    EXPECT(nz == 0); /* ... and alloc_zero clears it */
    EXPECT(a.peak >= a.used);

    /* tensors */
    BqCtx ctx = {.act = &a};
    int64_t sh[3] = {2, 3, 4};
    BqTensor *t = bq_tensor_new(&ctx, 3, sh);
    EXPECT(bq_tensor_numel(t) == 24 && t->stride[0] == 12 && t->stride[1] == 4 && t->stride[2] == 1);
    EXPECT(t->grad == NULL && bq_tensor_is_contiguous(t));
    BqTape tape;
    bq_tape_init(&tape, 2);
    ctx.tape = &tape;
    BqTensor *tg = bq_tensor_new(&ctx, 3, sh);
    EXPECT(tg->grad != NULL && tg->grad[23] == 0.0f);
    /* a wrapped tensor shares the caller's memory and gets contiguous strides */
    float wdata[6] = {1, 2, 3, 4, 5, 6}, wgrad[6] = {0};
    int64_t sh2[2] = {2, 3};
    BqTensor w = bq_tensor_wrap(wdata, wgrad, 2, sh2);
    EXPECT(w.data == wdata && w.grad == wgrad && bq_tensor_numel(&w) == 6 && w.stride[0] == 3 && w.stride[1] == 1);
    /* The tape grows past its initial capacity and records one node per op. Five broadcast adds of the
     * (4) vector v = w's first row give tg + 5·v; bq_backward seeds the gradient of element 0 of the
     * (2,3,4) output, so tg's gradient is one-hot at 0 and v's is 5 at 0 (accumulated over the adds),
     * and the rest of w's gradient buffer stays untouched. */
    int64_t sh1[1] = {4};
    BqTensor v = bq_tensor_wrap(wdata, wgrad, 1, sh1);
    BqTensor *x = tg;
    for (int i = 0; i < 24; i++) tg->data[i] = (float)i;
    for (int i = 0; i < 5; i++) x = bq_op_add(&ctx, x, &v);
    EXPECT(tape.n == 5 && tape.cap >= 5 && tape.nodes[4].op == BQ_OP_ADD && x->ndim == 3 && x->shape[2] == 4);
    for (int i = 0; i < 24; i++) EXPECT(x->data[i] == (float)i + 5.0f * wdata[i % 4]);
    bq_backward(&ctx, x);
    EXPECT(tg->grad[0] == 1.0f && wgrad[0] == 5.0f);
    int stray = 0;
    for (int i = 1; i < 24; i++) stray += tg->grad[i] != 0.0f;
    for (int i = 1; i < 6; i++) stray += wgrad[i] != 0.0f;
    EXPECT(stray == 0);
    bq_tape_free(&tape);
    bq_arena_free(&a);

    /* the arena's first BQ_ARENA_SMALL_PAGES bytes (16 MiB: an inference forward's activations) take 4 KiB
     * pages: one byte written at the last 2 MiB boundary in them, past 12 MiB (a huge page could map the 2
     * MiB from there), makes one page resident, not a huge page (which it would where transparent huge
     * pages are on, as asked for the rest; with them off the check cannot tell, and says so) */
    {
        BqArena sp;
        EXPECT(bq_arena_init(&sp, (size_t)1 << 26, "small pages") == BQ_OK);
        const size_t span = (size_t)2 << 20, page = 4096;
        char *al = (char *)((((uintptr_t)sp.base + BQ_ARENA_SMALL_PAGES) & ~(uintptr_t)(span - 1)) - span);
        EXPECT(al >= sp.base + ((size_t)12 << 20) && al + span <= sp.base + BQ_ARENA_SMALL_PAGES);
        char *b0 = bq_arena_alloc(&sp, (size_t)(al - sp.base) + 1);
        b0[al - sp.base] = 1;
        unsigned char *vec = calloc(span / page, 1);
        int resident = -1;
        if (mincore(al, span, vec) == 0) {
            resident = 0;
            for (size_t i = 0; i < span / page; i++) resident += vec[i] & 1;
        }
        char thp[64] = "";
        FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
        if (f) {
            if (!fgets(thp, sizeof thp, f)) thp[0] = 0;
            fclose(f);
        }
        printf("arena prefix: %d of 2 MiB's 4 KiB pages resident after one byte (THP: %s)\n", resident,
               strstr(thp, "[never]") ? "off, the check cannot tell" : "on");
        EXPECT(resident == 1);
        free(vec);
        bq_arena_free(&sp);
    }

    /* rng: same seed, same stream; different seeds differ; ranges */
    BqRng r1, r2, r3;
    bq_rng_seed(&r1, 42), bq_rng_seed(&r2, 42), bq_rng_seed(&r3, 43);
    int same = 1, diff = 0;
    for (int i = 0; i < 100; i++) {
        uint64_t u1 = bq_rng_u64(&r1), u2 = bq_rng_u64(&r2), u3 = bq_rng_u64(&r3);
        same &= u1 == u2;
        diff += u1 != u3;
    }
    EXPECT(same && diff > 90);
    double mean = 0;
    int inrange = 1;
    for (int i = 0; i < 100000; i++) {
        double u = bq_rng_uniform(&r1);
        inrange &= u >= 0.0 && u < 1.0;
        mean += u;
        uint64_t k = bq_rng_below(&r1, 7);
        inrange &= k < 7;
    }
    mean /= 100000;
    EXPECT(inrange && fabs(mean - 0.5) < 0.01);
    if (fabs(mean - 0.5) > max_err) max_err = fabs(mean - 0.5);
    int32_t perm[50];
    for (int i = 0; i < 50; i++) perm[i] = i;
    bq_rng_shuffle_i32(&r1, perm, 50);
    int seen[50] = {0}, moved = 0;
    for (int i = 0; i < 50; i++) seen[perm[i]]++, moved += perm[i] != i;
    int isperm = 1;
    for (int i = 0; i < 50; i++) isperm &= seen[i] == 1;
    EXPECT(isperm && moved > 30);

    /* hash: golden values, so a change to either hash (and with it every dropout mask and shuffle
     * order of a saved run) fails here. bq_hash64(0, 0) is splitmix64's first output from state 0
     * (0xE220A8397B1DCDAF, Vigna's reference); the others were computed by a separate Python transcription
     * of the definitions in autograd/bq.h (splitmix64 of key ^ index * 0xD1B54A32D192ED03; two rounds of
     * the MurmurHash3 finaliser, top 24 bits). */
    EXPECT(bq_hash64(0, 0) == 0xE220A8397B1DCDAFull && bq_hash64(1, 2) == 0x09A23C3A0FFEDFE9ull &&
           bq_hash64(2, 1) == 0x2D839779CDFBC413ull && bq_hash64(42, 7) == 0xF08AAEFCEC7303C2ull);
    EXPECT(bq_hash_uniform(12345, 0) == 0.3882526159286499f && bq_hash_uniform(12345, 1) == 0.6587032079696655f &&
           bq_hash_uniform((1ull << 40) | 5, (1ull << 33) + 9) == 0.3594484329223633f);
    double hm = 0;
    int hin = 1;
    for (uint64_t i = 0; i < 100000; i++) {
        float u = bq_hash_uniform(12345, i);
        hin &= u >= 0.0f && u < 1.0f;
        hm += u;
    }
    hm /= 100000;
    EXPECT(hin && fabs(hm - 0.5) < 0.01);
    if (fabs(hm - 0.5) > max_err) max_err = fabs(hm - 0.5);

    /* args */
    const char *s = "def";
    int n = 3, flag = 0;
    double f = 0.5;
    BqArgSpec specs[] = {
        {"name", BQ_ARG_STR, &s, "a string", 0, 0, 0},
        {"count", BQ_ARG_INT, &n, "an int", 0, 1, 10},
        {"rate", BQ_ARG_FLOAT, &f, "a float", 0, 0, 1},
        {"fast", BQ_ARG_FLAG, &flag, "a flag", 0, 0, 0},
    };
    BqArgs args = {.cmd = "test", .specs = specs, .nspecs = 4, .max_positional = 1, .positional_name = "X"};
    char *argv1[] = {"test", "--name", "abc", "--count=7", "--rate", "0.25", "--fast", "pos"};
    EXPECT(bq_args_parse(&args, 8, argv1) == BQ_OK);
    EXPECT(!strcmp(s, "abc") && n == 7 && f == 0.25 && flag == 1 && args.npositional == 1 &&
           !strcmp(args.positional[0], "pos"));
    /* bq_args_format writes each value so that the parser reads it back unchanged (the pipeline passes
     * its settings on to its stages so): the shortest exact form of a double, and a flag only when set */
    char fbuf[64];
    EXPECT(!strcmp(bq_args_format(&specs[0], fbuf, sizeof fbuf), "abc"));
    EXPECT(!strcmp(bq_args_format(&specs[1], fbuf, sizeof fbuf), "7"));
    EXPECT(!strcmp(bq_args_format(&specs[2], fbuf, sizeof fbuf), "0.25"));
    EXPECT(bq_args_format(&specs[3], fbuf, sizeof fbuf) != NULL);
    f = 0.1 + 0.2; /* 0.30000000000000004: "%g" alone would write 0.3 */
    const char *fv = bq_args_format(&specs[2], fbuf, sizeof fbuf);
    EXPECT(fv && strtod(fv, NULL) == 0.1 + 0.2);
    char *argv7[] = {"test", "--rate", fbuf};
    f = 0;
    EXPECT(bq_args_parse(&args, 3, argv7) == BQ_OK && f == 0.1 + 0.2);
    flag = 0;
    EXPECT(bq_args_format(&specs[3], fbuf, sizeof fbuf) == NULL);
    char *argv2[] = {"test", "--count", "11"};
    EXPECT(bq_args_parse(&args, 3, argv2) == BQ_EINVAL && strstr(bq_errmsg(), "--count"));
    char *argv3[] = {"test", "--bogus", "1"};
    EXPECT(bq_args_parse(&args, 3, argv3) == BQ_EINVAL && strstr(bq_errmsg(), "bogus"));
    char *argv4[] = {"test", "--rate", "x1"};
    EXPECT(bq_args_parse(&args, 3, argv4) == BQ_EINVAL && strstr(bq_errmsg(), "--rate"));
    char *argv5[] = {"test", "--count"};
    EXPECT(bq_args_parse(&args, 2, argv5) == BQ_EINVAL);
    specs[0].required = 1;
    char *argv6[] = {"test", "--fast"};
    EXPECT(bq_args_parse(&args, 2, argv6) == BQ_EINVAL && strstr(bq_errmsg(), "--name"));

    printf("test_core: max error %.3e (uniform mean deviations), %d failures, %s\n", max_err, fails,
           fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
