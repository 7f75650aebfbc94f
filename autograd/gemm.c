/* The GEMM entry point with a precision (contracts in gemm.h).
 *
 * References: oneDNN 2.6 C API (oneapi/dnnl/dnnl.h: dnnl_matmul_desc_init, dnnl_memory_desc_init_by_strides,
 * dnnl_post_ops_append_sum, dnnl_primitive_desc_query with dnnl_query_impl_info_str); the bf16 format
 * (the upper 16 bits of an IEEE-754 binary32) and its round-to-nearest-even conversion as in PyTorch's
 * c10::BFloat16 round_to_nearest_even and oneDNN's cvt_float_to_bfloat16.
 *
 * bf16 operands are converted into per-thread scratch in their stored orientation, packed (leading
 * dimension = row length), so both paths read exactly the same rounded values: the emulated path as
 * floats with zero low halves, the oneDNN path as 16-bit words. An operand stored as bf16 words (BqMat.h)
 * is widened exactly for the emulated path and, when packed, handed to oneDNN as it is. The oneDNN primitives take fixed shapes
 * (runtime dimensions would lose the brgemm kernels) and are cached by shape, transposes and beta. */
#include "autograd/gemm.h"

#include <cblas.h>
#include <dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "autograd/fastmath.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(BQ_NO_CLONES)
#define GEMM_VEC __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define GEMM_VEC
#endif

/* Threads that may hold scratch or a stream at once (OpenMP thread numbers below this). */
#define MAX_THREADS 256
/* Cached bf16 matmul primitives; a full cache replaces its entries in turn. */
#define CACHE_MAX 128

typedef struct Scratch {
    void *a, *b, *c, *pad, *w;
    size_t na, nb, nc, npad, nw; /* bytes */
} Scratch;

/* A primitive's shape and beta; the destination is always dense (M,N) (see gemm_onednn). Keys are
 * compared with memcmp, so every byte is set (key_of), padding included. */
typedef struct Key {
    int64_t M, N, K;
    int32_t ta, tb, beta, zero;
} Key;

_Static_assert(sizeof(Key) == 3 * sizeof(int64_t) + 4 * sizeof(int32_t), "Key has no padding");

static Key key_of(int64_t M, int64_t N, int64_t K, int ta, int tb, int beta) {
    Key k;
    memset(&k, 0, sizeof k);
    k.M = M, k.N = N, k.K = K, k.ta = ta, k.tb = tb, k.beta = beta;
    return k;
}

typedef struct Entry {
    Key key;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t src_md, wei_md, dst_md, pad_md;
    size_t pad_bytes;
} Entry;

static Scratch g_scratch[MAX_THREADS];
static dnnl_engine_t g_engine;
static dnnl_stream_t g_streams[MAX_THREADS];
static Entry g_cache[CACHE_MAX];
static int g_cache_n, g_cache_next;
static int g_path = -1; /* BqBf16Path once decided */
static char g_impl[128];

/* ---- scratch and conversion ---- */

static void *scratch_get(void **p, size_t *n, size_t need) {
    if (*n < need) {
        *p = bq_realloc(*p, need);
        *n = need;
    }
    return *p;
}

/* dst (rows, cols) packed = the operand's (rows, cols) block with rows ld apart, as fp32 values rounded to
 * bf16 (bf16 words are widened exactly). */
static void round_f32(float *dst, BqMat src, int64_t rows, int64_t cols, int64_t ld) {
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && rows * cols > 65536)
    for (int64_t r = 0; r < rows; r++) {
        if (src.h)
            for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = bq_bf16_float(src.h[r * ld + c]);
        else
            for (int64_t c = 0; c < cols; c++) dst[r * cols + c] = bq_bf16_round(src.f[r * ld + c]);
    }
}

/* dst[i] = bq_bf16_bits(src[i]) for i < n, in the branch-free form that vectorizes, compiled for
 * baseline x86-64, AVX2 and AVX-512F (the same bits on each). */
GEMM_VEC static void words_run(uint16_t *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = bf16_bits(src[i]);
}

/* The same values as 16-bit bf16 words. */
static void round_bf16(uint16_t *dst, BqMat src, int64_t rows, int64_t cols, int64_t ld) {
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && rows * cols > 65536)
    for (int64_t r = 0; r < rows; r++) {
        if (src.h)
            memcpy(dst + r * cols, src.h + r * ld, (size_t)cols * sizeof(uint16_t));
        else
            words_run(dst + r * cols, src.f + r * ld, cols);
    }
}

static int thread_slot(void) {
    int t = omp_get_thread_num();
    BQ_CHECK(t >= 0 && t < MAX_THREADS);
    return t;
}

/* ---- oneDNN ---- */

static void dnnl_die(dnnl_status_t s, const char *what) {
    fprintf(stderr, "bertqat: oneDNN: %s failed (status %d)\n", what, (int)s);
    BQ_CHECK(s == dnnl_success);
}

/* Creates the bf16 matmul for key k: src (M,K) bf16, weights (K,N) bf16, both packed in their stored
 * orientation, dst (M,N) f32 dense, a sum post-op for beta 1. Returns the oneDNN status. */
static dnnl_status_t entry_create(Entry *e, const Key *k) {
    memset(e, 0, sizeof *e);
    e->key = *k;
    dnnl_dims_t ds = {k->M, k->K}, dw = {k->K, k->N}, dd = {k->M, k->N};
    dnnl_dims_t ss = {k->ta ? 1 : k->K, k->ta ? k->M : 1};
    dnnl_dims_t sw = {k->tb ? 1 : k->N, k->tb ? k->K : 1};
    dnnl_dims_t sd = {k->N, 1};
    dnnl_matmul_desc_t mm;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_status_t s;
    if ((s = dnnl_memory_desc_init_by_strides(&e->src_md, 2, ds, dnnl_bf16, ss)) != dnnl_success ||
        (s = dnnl_memory_desc_init_by_strides(&e->wei_md, 2, dw, dnnl_bf16, sw)) != dnnl_success ||
        (s = dnnl_memory_desc_init_by_strides(&e->dst_md, 2, dd, dnnl_f32, sd)) != dnnl_success ||
        (s = dnnl_matmul_desc_init(&mm, &e->src_md, &e->wei_md, NULL, &e->dst_md)) != dnnl_success)
        return s;
    if ((s = dnnl_primitive_attr_create(&attr)) != dnnl_success) return s;
    /* the caller's scratchpad: oneDNN's own is shared by all primitives, and the attention's products run
     * concurrently on the OpenMP threads */
    if ((s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user)) != dnnl_success) goto cleanup;
    if (k->beta) {
        if ((s = dnnl_post_ops_create(&po)) != dnnl_success || (s = dnnl_post_ops_append_sum(po, 1.0f)) != dnnl_success ||
            (s = dnnl_primitive_attr_set_post_ops(attr, po)) != dnnl_success)
            goto cleanup;
    }
    if ((s = dnnl_primitive_desc_create(&e->pd, &mm, attr, g_engine, NULL)) != dnnl_success) goto cleanup;
    e->pad_md = *dnnl_primitive_desc_query_md(e->pd, dnnl_query_scratchpad_md, 0);
    e->pad_bytes = dnnl_memory_desc_get_size(&e->pad_md);
    if ((s = dnnl_primitive_create(&e->prim, e->pd)) != dnnl_success) {
        dnnl_primitive_desc_destroy(e->pd);
        e->pd = NULL;
    }
cleanup:
    if (po) dnnl_post_ops_destroy(po);
    dnnl_primitive_attr_destroy(attr);
    return s;
}

static void entry_destroy(Entry *e) {
    if (e->prim) dnnl_primitive_destroy(e->prim);
    if (e->pd) dnnl_primitive_desc_destroy(e->pd);
    memset(e, 0, sizeof *e);
}

/* The cached primitive for k, created on first use. Thread-safe. A full cache replaces its entries in
 * turn, but only from the serial region: inside a parallel region another thread may be running the
 * entry that would go, so there a miss on a full cache creates the primitive in *tmp, returned for the
 * caller to destroy after its call. */
static Entry *entry_get(const Key *k, Entry *tmp) {
    Entry *e = NULL;
    const int in_parallel = omp_in_parallel();
#pragma omp critical(bq_gemm_cache)
    {
        for (int i = 0; i < g_cache_n && !e; i++)
            if (!memcmp(&g_cache[i].key, k, sizeof *k)) e = &g_cache[i];
        if (!e && (g_cache_n < CACHE_MAX || !in_parallel)) {
            int slot = g_cache_n < CACHE_MAX ? g_cache_n++ : g_cache_next++ % CACHE_MAX;
            entry_destroy(&g_cache[slot]);
            dnnl_status_t s = entry_create(&g_cache[slot], k);
            if (s != dnnl_success) dnnl_die(s, "bf16 matmul primitive");
            e = &g_cache[slot];
        }
    }
    if (!e) {
        dnnl_status_t s = entry_create(tmp, k);
        if (s != dnnl_success) dnnl_die(s, "bf16 matmul primitive");
        e = tmp;
    }
    return e;
}

static dnnl_stream_t stream_get(int t) {
    if (!g_streams[t]) {
        dnnl_status_t s = dnnl_stream_create(&g_streams[t], g_engine, dnnl_stream_default_flags);
        if (s != dnnl_success) dnnl_die(s, "stream creation");
    }
    return g_streams[t];
}

/* Decides the bf16 path once: oneDNN where the CPU has bf16 units and a bf16 matmul can be created. */
static void path_decide(void) {
    if (g_path >= 0) return;
#pragma omp critical(bq_gemm_cache)
    if (g_path < 0) {
        const BqCpuFeatures *f = bq_cpu_features();
        int path = BQ_BF16_EMULATED;
        if ((f->avx512_bf16 || f->amx_bf16) && dnnl_engine_create(&g_engine, dnnl_cpu, 0) == dnnl_success) {
            Entry probe;
            Key k = key_of(64, 64, 64, 0, 0, 0);
            if (entry_create(&probe, &k) == dnnl_success) {
                const char *impl = NULL;
                if (dnnl_primitive_desc_query(probe.pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
                    snprintf(g_impl, sizeof g_impl, "%s", impl);
                path = BQ_BF16_ONEDNN;
                entry_destroy(&probe);
            }
        }
        g_path = path;
    }
}

/* The bf16 words of an operand stored (rows, cols) with rows ld apart, packed: the operand itself when it
 * is bf16 words already packed, else a conversion into the scratch buffer *buf. */
static const uint16_t *words_packed(void **buf, size_t *nbuf, BqMat m, int64_t rows, int64_t cols, int64_t ld) {
    if (m.h && ld == cols) return m.h;
    uint16_t *w = scratch_get(buf, nbuf, (size_t)(rows * cols) * sizeof(uint16_t));
    round_bf16(w, m, rows, cols, ld);
    return w;
}

static void gemm_onednn(BqTrans ta, BqTrans tb, int64_t M, int64_t N, int64_t K, BqMat A, int64_t lda, BqMat B,
                        int64_t ldb, float beta, float *C, int64_t ldc) {
    const int t = thread_slot();
    Scratch *sc = &g_scratch[t];
    const double t0 = bq_section_start();
    const uint16_t *a = words_packed(&sc->a, &sc->na, A, ta ? K : M, ta ? M : K, lda);
    const uint16_t *b = words_packed(&sc->b, &sc->nb, B, tb ? N : K, tb ? K : N, ldb);
    bq_section_end(BQ_SEC_BF16_CONVERT, t0);
    /* oneDNN 2.6 runs its brgemm kernels (AMX, AVX512-BF16) only on a dense destination: a strided one
     * (the attention's per-head products, the query/key/value block of the fused forward) falls back to
     * gemm:jit, which took 2.5 times as long per head product on an AMX Xeon (ONEDNN_VERBOSE). So a
     * strided destination gets a dense per-thread one, then copied into C, or added for beta 1 (the
     * sum post-op adds the same fp32 values). */
    const int direct = ldc == N;
    float *d = direct ? C : scratch_get(&sc->c, &sc->nc, (size_t)(M * N) * sizeof(float));
    const Key k = key_of(M, N, K, ta, tb, direct && beta != 0.0f);
    Entry tmp, *e = entry_get(&k, &tmp);
    void *pad = e->pad_bytes ? scratch_get(&sc->pad, &sc->npad, e->pad_bytes) : NULL;
    dnnl_memory_t ms = NULL, mw = NULL, md = NULL, mp = NULL;
    dnnl_status_t s;
    /* oneDNN takes non-const handles; the source and weights are only read */
    if ((s = dnnl_memory_create(&ms, &e->src_md, g_engine, (void *)a)) != dnnl_success ||
        (s = dnnl_memory_create(&mw, &e->wei_md, g_engine, (void *)b)) != dnnl_success ||
        (s = dnnl_memory_create(&md, &e->dst_md, g_engine, d)) != dnnl_success ||
        (pad && (s = dnnl_memory_create(&mp, &e->pad_md, g_engine, pad)) != dnnl_success))
        dnnl_die(s, "memory creation");
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}, {DNNL_ARG_SCRATCHPAD, mp}};
    dnnl_stream_t st = stream_get(t);
    if ((s = dnnl_primitive_execute(e->prim, st, mp ? 4 : 3, args)) != dnnl_success) dnnl_die(s, "bf16 matmul");
    if ((s = dnnl_stream_wait(st)) != dnnl_success) dnnl_die(s, "stream wait");
    dnnl_memory_destroy(ms);
    dnnl_memory_destroy(mw);
    dnnl_memory_destroy(md);
    if (mp) dnnl_memory_destroy(mp);
    if (e == &tmp) entry_destroy(&tmp);
    if (direct) return;
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && M * N > 65536)
    for (int64_t r = 0; r < M; r++) {
        float *c = C + r * ldc;
        const float *p = d + r * N;
        if (beta != 0.0f)
            for (int64_t j = 0; j < N; j++) c[j] += p[j];
        else
            memcpy(c, p, (size_t)N * sizeof(float));
    }
}

/* ---- entry point ---- */

void bq_gemm_mat(BqPrecision prec, BqTrans ta, BqTrans tb, int64_t M, int64_t N, int64_t K, BqMat A, int64_t lda,
                 BqMat B, int64_t ldb, float beta, float *C, int64_t ldc) {
    BQ_CHECK(beta == 0.0f || beta == 1.0f);
    BQ_CHECK((!A.h && !B.h) || prec == BQ_PRECISION_BF16);
    if (M <= 0 || N <= 0) return;
    BQ_CHECK(!(A.f && A.h) && !(B.f && B.h));
    const float *af = A.f, *bf = B.f;
    const double t0 = bq_section_start();
    const int bf16 = prec == BQ_PRECISION_BF16 && K > 0;
    if (bf16) {
        path_decide();
        if (g_path == BQ_BF16_ONEDNN) {
            gemm_onednn(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
            bq_section_end(BQ_SEC_GEMM_BF16, t0);
            return;
        }
        Scratch *sc = &g_scratch[thread_slot()];
        float *a = scratch_get(&sc->a, &sc->na, (size_t)(M * K) * sizeof(float));
        float *b = scratch_get(&sc->b, &sc->nb, (size_t)(K * N) * sizeof(float));
        round_f32(a, A, ta ? K : M, ta ? M : K, lda);
        round_f32(b, B, tb ? N : K, tb ? K : N, ldb);
        bq_section_end(BQ_SEC_BF16_CONVERT, t0);
        af = a, lda = ta ? M : K;
        bf = b, ldb = tb ? K : N;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K,
                1.0f, af, (int)lda, bf, (int)ldb, beta, C, (int)ldc);
    bq_section_end(bf16 ? BQ_SEC_GEMM_BF16 : BQ_SEC_GEMM_F32, t0);
}

void bq_gemm(BqPrecision prec, BqTrans ta, BqTrans tb, int64_t M, int64_t N, int64_t K, const float *A,
             int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    bq_gemm_mat(prec, ta, tb, M, N, K, bq_mat_f32(A), lda, bq_mat_f32(B), ldb, beta, C, ldc);
}

void bq_bf16_words(uint16_t *dst, const float *src, int64_t n) {
    if (n <= 65536 || omp_in_parallel()) { /* no parallel region at all: callers convert rows inside theirs */
        words_run(dst, src, n);
        return;
    }
    const int64_t chunk = 16384, nc = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nc; c++) words_run(dst + c * chunk, src + c * chunk, c + 1 < nc ? chunk : n - c * chunk);
}

BqMat bq_gemm_words(const float *x, int64_t rows, int64_t cols) {
    Scratch *sc = &g_scratch[thread_slot()];
    const double t0 = bq_section_start();
    uint16_t *w = scratch_get(&sc->w, &sc->nw, (size_t)(rows * cols) * sizeof(uint16_t));
    bq_bf16_words(w, x, rows * cols);
    bq_section_end(BQ_SEC_BF16_CONVERT, t0);
    return (BqMat){.f = NULL, .h = w};
}

BqBf16Path bq_gemm_bf16_path(void) {
    path_decide();
    return (BqBf16Path)g_path;
}

int bq_gemm_bf16_force(BqBf16Path path) {
    path_decide();
    if (path == BQ_BF16_ONEDNN && !g_impl[0])
        return bq_err(BQ_EINVAL, "bf16 GEMMs: oneDNN cannot run a bf16 matmul on this CPU");
    g_path = path;
    return BQ_OK;
}

const char *bq_gemm_bf16_describe(void) {
    static char buf[256];
    path_decide();
    if (g_path == BQ_BF16_ONEDNN) {
        const dnnl_version_t *v = dnnl_version();
        snprintf(buf, sizeof buf, "bf16 GEMMs: oneDNN %d.%d.%d %s", v->major, v->minor, v->patch, g_impl);
    } else {
        const BqCpuFeatures *f = bq_cpu_features();
        snprintf(buf, sizeof buf, "bf16 GEMMs: emulated (operands rounded to bf16, OpenBLAS sgemm)%s",
                 f->avx512_bf16 || f->amx_bf16 ? g_impl[0] ? " by request" : ": oneDNN has no bf16 matmul here"
                                                 : ": this CPU has neither AVX512-BF16 nor AMX-BF16");
    }
    return buf;
}
