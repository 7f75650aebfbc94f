/* Integer GEMM on oneDNN 2.x matmul (u8 src × s8 weights → s32 dst) with an fp32 epilogue
 * (autograd/qgemm.h states the contract).
 *
 * Reference: oneDNN 2.6 C API (oneapi/dnnl/dnnl.h: dnnl_matmul_desc_init, dnnl_primitive_desc_create,
 * dnnl_reorder_primitive_desc_create, dnnl_get_effective_cpu_isa) and its documentation of int8
 * computations on CPUs without VNNI (vpmaddubsw's int16 saturation, hence 7-bit weights there).
 *
 * Primitives are created once per (M,N,K) and kept in a small cache; the weights of a Linear are
 * reordered once into the layout the primitive asks for (format_tag any), one copy per distinct
 * layout (oneDNN may choose another layout for another M). The zero-point correction and the scaling
 * run in our own epilogue, not in oneDNN's post-ops, so the fp32 result of an element is one
 * expression of its exact integer sum whatever kernel oneDNN picks for a given M.
 *
 * 8-bit weights on a CPU whose oneDNN ISA lacks VNNI and AMX (refilled weights only) do not go to
 * oneDNN: their sums are single-precision GEMMs (OpenBLAS) on the codes held as floats, in blocks of at
 * most 1024 inputs. Every product of two codes is an integer of magnitude at most 2^14, so every partial
 * sum of a block, in whatever order the GEMM adds, is an integer of magnitude at most 2^24 and exact in
 * fp32: the block sums are the exact integers, added in int32. That costs one sgemm, where the
 * alternative on such CPUs (two exact 7-bit u8×s8 GEMMs per product) measured about 15 % slower on AVX2 Zen 3. */
#include "autograd/qgemm.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The elementwise loops (codes, epilogue) are cloned per vector ISA as in autograd/kernels.c; the
 * clones differ only in width (no contraction under -std=c11), so they give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(BQ_NO_CLONES)
#define QG_VEC __attribute__((target_clones("default", "avx2", "avx512f")))
#else
#define QG_VEC
#endif

#define CACHE_MAX 64 /* (M,N,K) primitives kept; BERT uses 4 shapes per M */
#define PACK_MAX 4   /* weight layouts kept per Linear */

typedef struct CacheEntry {
    int64_t M, N, K;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t src_md, wei_md, dst_md;
    dnnl_memory_desc_t pad_md; /* its scratchpad, passed in (user mode) */
    size_t pad_bytes;
} CacheEntry;

/* One layout of a weight matrix; the reorder from the plain codes is kept so refilled codes
 * (bq_qgemm_weights_set) are packed again into the same memory without creating anything. Fixed
 * weights (bq_qgemm_weights_create) keep neither: their layouts are never made again. */
typedef struct Pack {
    dnnl_memory_desc_t md;
    dnnl_memory_t mem, src;
    dnnl_primitive_t reorder;
    int stale; /* the codes changed since this copy was made */
} Pack;

/* The codes of one GEMM and their packed copies, grown one at a time (a Pack is 0.7 KB of memory
 * descriptor, and fixed weights hold one layout; a fused layer's products in pieces are 9 weights). */
typedef struct Codes {
    int8_t *codes; /* (N,K) */
    Pack *packs;   /* npacks of them, at most PACK_MAX */
    int npacks;
} Codes;

struct BqQGemmWeights {
    int64_t N, K;
    int bits;
    int split;       /* 1: 8-bit codes without VNNI or AMX, summed by sgemm on fcodes (see above) */
    int fixed;       /* 1: made by bq_qgemm_weights_create, the codes never change */
    Codes h;         /* the codes and their oneDNN layouts (unused when split) */
    int8_t *codes;   /* (N,K) the codes themselves; NULL for fixed weights once a layout is made */
    float *fcodes;   /* split: (N,K) the codes as floats */
    int32_t *comp;   /* (N) 128·Σ_k qw[n,k] */
    float *sw;       /* (N) */
};

/* Split GEMMs: the activation codes as floats (M,K) and one block's sums (M,N), shared by all weights
 * (one caller at a time, qgemm.h) and grown on demand, so only the first call at a size allocates. */
static float *g_fx, *g_fy;
static int64_t g_fx_n, g_fy_n;

/* The matmuls' scratchpad, shared by all primitives (one caller at a time) and grown to the largest any
 * needs. In oneDNN's default (library) mode every execution allocated its own and freed it after (about
 * 95 blocks of 0.3-1.3 MiB in a 64-review BERT-base evaluation at batch 8 on AVX2). */
static void *g_pad;
static size_t g_pad_n;

static dnnl_engine_t g_engine;
static dnnl_stream_t g_stream;
static CacheEntry g_cache[CACHE_MAX];
static int g_cache_n, g_cache_next;
static int64_t g_created;

static int dnnl_fail(dnnl_status_t s, const char *what) {
    return bq_err(s == dnnl_out_of_memory ? BQ_ENOMEM : BQ_EINVAL, "oneDNN: %s failed (status %d)", what, (int)s);
}

static int ensure_engine(void) {
    if (g_engine) return BQ_OK;
    dnnl_status_t s = dnnl_engine_create(&g_engine, dnnl_cpu, 0);
    if (s != dnnl_success) {
        g_engine = NULL;
        return dnnl_fail(s, "engine creation");
    }
    s = dnnl_stream_create(&g_stream, g_engine, dnnl_stream_default_flags);
    if (s != dnnl_success) {
        dnnl_engine_destroy(g_engine);
        g_engine = NULL;
        return dnnl_fail(s, "stream creation");
    }
    return BQ_OK;
}

/* ---- CPU description ---- */

static const char *isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
    }
}

static int probe_8bit(void);

/* The ISA must have VNNI (the bit of avx512_core_vnni, 0x40, also set in bf16 and amx, or of avx2_vnni,
 * 0x400), and a probe must confirm it: products that saturate int16 pair sums (255·127 twice) come out
 * exact at three row counts, since oneDNN picks its kernel per shape and not every kernel of every
 * version uses VNNI on every VNNI ISA. Decided once per process. */
int bq_qgemm_exact_8bit(void) {
    static int decided = -1;
    if (decided < 0) {
        unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
        decided = ((isa & 0x40u) != 0 || (isa & 0x400u) != 0) && probe_8bit();
    }
    return decided;
}

const char *bq_dnnl_describe(void) {
    static char buf[256];
    const dnnl_version_t *v = dnnl_version();
    const BqCpuFeatures *f = bq_cpu_features();
    const int v512 = f->avx512_vnni, vavx = f->avx_vnni, amx = f->amx_int8;
    snprintf(buf, sizeof buf,
             "oneDNN %d.%d.%d (isa %s, int8 %s), CPU VNNI: %s (avx512-vnni %s, avx-vnni %s), AMX-INT8: %s",
             v->major, v->minor, v->patch, isa_name(dnnl_get_effective_cpu_isa()),
             bq_qgemm_exact_8bit() ? "8-bit weights exact" : "7-bit weights only (int16 pair sums)",
             v512 || vavx ? "yes" : "no", v512 ? "yes" : "no", vavx ? "yes" : "no", amx ? "yes" : "no");
    return buf;
}

/* ---- primitive cache ---- */

static void entry_destroy(CacheEntry *e) {
    if (e->prim) dnnl_primitive_destroy(e->prim);
    if (e->pd) dnnl_primitive_desc_destroy(e->pd);
    memset(e, 0, sizeof *e);
}

void bq_qgemm_cache_clear(void) {
    for (int i = 0; i < g_cache_n; i++) entry_destroy(&g_cache[i]);
    g_cache_n = g_cache_next = 0;
    free(g_fx);
    free(g_fy);
    free(g_pad);
    g_fx = g_fy = NULL;
    g_pad = NULL;
    g_fx_n = g_fy_n = 0;
    g_pad_n = 0;
}

int64_t bq_qgemm_primitives_created(void) { return g_created; }

/* The matmul for (M,N,K): src (M,K) u8 row-major, weights (K,N) s8 in the layout oneDNN prefers,
 * dst (M,N) s32 row-major. */
static int cache_get(int64_t M, int64_t N, int64_t K, CacheEntry **out) {
    for (int i = 0; i < g_cache_n; i++)
        if (g_cache[i].M == M && g_cache[i].N == N && g_cache[i].K == K) {
            *out = &g_cache[i];
            return BQ_OK;
        }
    int rc = ensure_engine();
    if (rc) return rc;
    CacheEntry e;
    memset(&e, 0, sizeof e);
    e.M = M, e.N = N, e.K = K;
    dnnl_dims_t ds = {M, K}, dw = {K, N}, dd = {M, N};
    dnnl_memory_desc_t wany;
    dnnl_matmul_desc_t mm;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_status_t s;
    if ((s = dnnl_memory_desc_init_by_tag(&e.src_md, 2, ds, dnnl_u8, dnnl_ab)) != dnnl_success ||
        (s = dnnl_memory_desc_init_by_tag(&wany, 2, dw, dnnl_s8, dnnl_format_tag_any)) != dnnl_success ||
        (s = dnnl_memory_desc_init_by_tag(&e.dst_md, 2, dd, dnnl_s32, dnnl_ab)) != dnnl_success ||
        (s = dnnl_matmul_desc_init(&mm, &e.src_md, &wany, NULL, &e.dst_md)) != dnnl_success)
        return dnnl_fail(s, "matmul descriptor");
    if ((s = dnnl_primitive_attr_create(&attr)) != dnnl_success) return dnnl_fail(s, "primitive attributes");
    if ((s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user)) == dnnl_success)
        s = dnnl_primitive_desc_create(&e.pd, &mm, attr, g_engine, NULL);
    dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) return dnnl_fail(s, "u8s8 matmul primitive descriptor");
    e.wei_md = *dnnl_primitive_desc_query_md(e.pd, dnnl_query_weights_md, 0);
    e.pad_md = *dnnl_primitive_desc_query_md(e.pd, dnnl_query_scratchpad_md, 0);
    e.pad_bytes = dnnl_memory_desc_get_size(&e.pad_md);
    if ((s = dnnl_primitive_create(&e.prim, e.pd)) != dnnl_success) {
        entry_destroy(&e);
        return dnnl_fail(s, "u8s8 matmul primitive");
    }
    /* the primitive keeps a descriptor of its own; this one was only queried (about 70 KiB a primitive) */
    dnnl_primitive_desc_destroy(e.pd);
    e.pd = NULL;
    g_created++;
    int slot;
    if (g_cache_n < CACHE_MAX) {
        slot = g_cache_n++;
    } else { /* oldest first; nothing holds an entry between calls */
        slot = g_cache_next;
        g_cache_next = (g_cache_next + 1) % CACHE_MAX;
        entry_destroy(&g_cache[slot]);
    }
    g_cache[slot] = e;
    *out = &g_cache[slot];
    return BQ_OK;
}

/* ---- weights ---- */

static BqQGemmWeights *weights_alloc(const int8_t *qw, const float *sw, int64_t nscale, int64_t N, int64_t K);
static int run_raw(BqQGemmWeights *w, const uint8_t *xu8, int64_t M, int32_t *acc);

/* u8 255 against weights 127 and -128 (alternating rows), K = 128, M = 1, 64 and 2048: every sum is
 * exact with 32-bit accumulation and wrong where pairs saturate in int16 (2·255·127 > 32767). */
static int probe_8bit(void) {
    enum { N = 16, K = 128, MMAX = 2048 };
    if (ensure_engine()) return 0;
    int8_t *qw = bq_malloc(N * K);
    uint8_t *x = bq_malloc((size_t)MMAX * K);
    int32_t *acc = bq_malloc(sizeof(int32_t) * (size_t)MMAX * N);
    float one = 1.0f;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) qw[n * K + k] = (int8_t)(n % 2 ? -128 : 127);
    memset(x, 255, (size_t)MMAX * K);
    BqQGemmWeights *w = weights_alloc(qw, &one, 1, N, K);
    static const int64_t ms[3] = {1, 64, MMAX};
    int ok = 1;
    for (int i = 0; i < 3 && ok; i++) {
        if (run_raw(w, x, ms[i], acc)) {
            ok = 0;
            break;
        }
        for (int64_t j = 0; j < ms[i] * N && ok; j++)
            ok = acc[j] == 255 * K * (j % 2 ? -128 : 127);
    }
    bq_qgemm_weights_free(w);
    free(qw);
    free(x);
    free(acc);
    bq_err_clear();
    return ok;
}

int bq_qgemm_weights_create(BqQGemmWeights **out, const int8_t *qw, const float *sw, int64_t nscale, int64_t N,
                            int64_t K, int bits, const char *name) {
    BQ_CHECK(out && qw && sw && N > 0 && K > 0 && (nscale == 1 || nscale == N));
    *out = NULL;
    if (bits < 2 || bits > 8) return bq_err(BQ_EINVAL, "%s: %d-bit weights are not supported (2..8)", name, bits);
    const int qmin = -(1 << (bits - 1)), qmax = (1 << (bits - 1)) - 1;
    const int exact8 = bq_qgemm_exact_8bit();
    if (bits > 7 && !exact8)
        return bq_err(BQ_EINVAL,
                      "%s: %d-bit weights need a CPU with VNNI or AMX (oneDNN ISA here: %s, whose u8*s8 pair "
                      "sums %s in int16 for |w| > 64); use 7-bit weights (--scheme cpu) or fake quant",
                      name, bits, isa_name(dnnl_get_effective_cpu_isa()),
                      (dnnl_get_effective_cpu_isa() & 0x440) ? "were found by a probe to saturate" : "saturate");
    for (int64_t i = 0; i < N * K; i++) {
        if (qw[i] < qmin || qw[i] > qmax)
            return bq_err(BQ_EINVAL, "%s: weight code %d at (%lld,%lld) is outside the %d-bit range [%d, %d]",
                          name, qw[i], (long long)(i / K), (long long)(i % K), bits, qmin, qmax);
        if (!exact8 && (qw[i] < -64 || qw[i] > 64))
            return bq_err(BQ_EINVAL, "%s: weight code %d exceeds |w| <= 64, the exact range without VNNI", name,
                          qw[i]);
    }
    if ((int64_t)K * 255 * 128 > INT32_MAX)
        return bq_err(BQ_EINVAL, "%s: K = %lld overflows the int32 accumulator", name, (long long)K);
    int rc = ensure_engine();
    if (rc) return rc;
    *out = weights_alloc(qw, sw, nscale, N, K);
    return BQ_OK;
}

/* The plain codes of fixed weights live in a mapping of their own: they are freed at the first GEMM,
 * once oneDNN's layout of them exists, and from the heap that left holes of 0.5-2.3 MiB beside the
 * layouts, kept by malloc (7 MiB of a BERT-base evaluation's peak); an unmapped block goes back at
 * once. */
static int8_t *codes_map(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "bertqat: out of memory mapping %zu bytes of weight codes\n", n);
        abort();
    }
    return p;
}

static BqQGemmWeights *weights_alloc(const int8_t *qw, const float *sw, int64_t nscale, int64_t N, int64_t K) {
    BqQGemmWeights *w = bq_calloc(1, sizeof *w);
    w->N = N, w->K = K;
    w->bits = 8;
    w->fixed = 1;
    w->codes = codes_map((size_t)(N * K));
    memcpy(w->codes, qw, (size_t)(N * K));
    w->h.codes = w->codes;
    w->comp = bq_malloc((size_t)N * sizeof(int32_t));
    w->sw = bq_malloc((size_t)N * sizeof(float));
    for (int64_t n = 0; n < N; n++) {
        int32_t s = 0;
        for (int64_t k = 0; k < K; k++) s += qw[n * K + k];
        w->comp[n] = 128 * s;
        w->sw[n] = sw[nscale == 1 ? 0 : n];
    }
    return w;
}

static void pack_destroy(Pack *p) {
    if (p->reorder) dnnl_primitive_destroy(p->reorder);
    if (p->src) dnnl_memory_destroy(p->src);
    if (p->mem) dnnl_memory_destroy(p->mem);
    memset(p, 0, sizeof *p);
}

int64_t bq_qgemm_weights_bytes(const BqQGemmWeights *w) {
    int64_t n = (int64_t)sizeof *w + 2 * w->N * 4; /* comp, sw */
    if (w->codes) n += w->N * w->K;
    if (w->fcodes) n += w->N * w->K * (int64_t)sizeof(float);
    for (int i = 0; i < w->h.npacks; i++) n += (int64_t)dnnl_memory_desc_get_size(&w->h.packs[i].md);
    return n;
}

void bq_qgemm_weights_free(BqQGemmWeights *w) {
    if (!w) return;
    for (int i = 0; i < w->h.npacks; i++) pack_destroy(&w->h.packs[i]);
    free(w->h.packs);
    if (w->fixed && w->codes) /* only bq_qgemm_weights_create's fixed weights still hold codes: mapped */
        munmap(w->codes, (size_t)(w->N * w->K));
    else
        free(w->codes);
    free(w->fcodes);
    free(w->comp);
    free(w->sw);
    free(w);
}

int64_t bq_qgemm_weights_n(const BqQGemmWeights *w) { return w->N; }
int64_t bq_qgemm_weights_k(const BqQGemmWeights *w) { return w->K; }

/* Codes h in layout md, reordered from the plain codes on first use and again after they change. The
 * codes (N,K) row-major are the (K,N) matrix with strides (1, K): format tag ba. Fixed weights free
 * their plain codes once the first layout is made (nothing reads them again: the GEMMs read a layout,
 * comp and sw are kept apart), and make any later layout by reordering one they hold; a reorder only
 * moves bytes, so every layout holds the same codes. */
static int weights_packed(BqQGemmWeights *w, Codes *h, const dnnl_memory_desc_t *md, dnnl_memory_t *mem) {
    Pack *p = NULL;
    for (int i = 0; i < h->npacks && !p; i++)
        if (dnnl_memory_desc_equal(&h->packs[i].md, md)) p = &h->packs[i];
    dnnl_status_t s;
    int rc = BQ_OK;
    if (!p) {
        if (h->npacks == PACK_MAX) { /* a fifth layout: drop the oldest */
            pack_destroy(&h->packs[0]);
            memmove(&h->packs[0], &h->packs[1], sizeof(Pack) * (PACK_MAX - 1));
            h->npacks--;
        } else {
            h->packs = bq_realloc(h->packs, sizeof(Pack) * (size_t)(h->npacks + 1));
        }
        p = &h->packs[h->npacks];
        memset(p, 0, sizeof *p);
        dnnl_memory_desc_t plain;
        dnnl_dims_t dw = {w->K, w->N};
        dnnl_primitive_desc_t rpd = NULL;
        void *from = h->codes;
        if (!from) { /* fixed weights without their plain codes: the first layout held */
            BQ_CHECK(w->fixed && h->npacks > 0);
            plain = h->packs[0].md;
            if ((s = dnnl_memory_get_data_handle(h->packs[0].mem, &from)) != dnnl_success)
                return dnnl_fail(s, "weight reorder");
        } else if ((s = dnnl_memory_desc_init_by_tag(&plain, 2, dw, dnnl_s8, dnnl_ba)) != dnnl_success) {
            return dnnl_fail(s, "weight reorder");
        }
        if ((s = dnnl_memory_create(&p->src, &plain, g_engine, from)) != dnnl_success ||
            (s = dnnl_memory_create(&p->mem, md, g_engine, DNNL_MEMORY_ALLOCATE)) != dnnl_success ||
            (s = dnnl_reorder_primitive_desc_create(&rpd, &plain, g_engine, md, g_engine, NULL)) != dnnl_success ||
            (s = dnnl_primitive_create(&p->reorder, rpd)) != dnnl_success) {
            if (rpd) dnnl_primitive_desc_destroy(rpd);
            pack_destroy(p);
            return dnnl_fail(s, "weight reorder");
        }
        dnnl_primitive_desc_destroy(rpd);
        p->md = *md;
        p->stale = 1;
        h->npacks++;
    }
    if (p->stale) {
        dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, p->src}, {DNNL_ARG_TO, p->mem}};
        if ((s = dnnl_primitive_execute(p->reorder, g_stream, 2, args)) != dnnl_success ||
            (s = dnnl_stream_wait(g_stream)) != dnnl_success)
            rc = dnnl_fail(s, "weight reorder");
        p->stale = rc != BQ_OK;
        if (!rc && w->fixed) {
            /* never stale again: the reorder and its source go, and with them the plain codes */
            dnnl_primitive_destroy(p->reorder);
            dnnl_memory_destroy(p->src);
            p->reorder = NULL, p->src = NULL;
            munmap(w->codes, (size_t)(w->N * w->K));
            w->codes = h->codes = NULL;
        }
    }
    *mem = p->mem;
    return rc;
}

/* One GEMM: acc = Σ (qx+128)·codes of h. */
static int run_onednn(BqQGemmWeights *w, Codes *h, CacheEntry *e, const uint8_t *xu8, int32_t *acc) {
    dnnl_memory_t wm;
    int rc = weights_packed(w, h, &e->wei_md, &wm);
    if (rc) return rc;
    if (e->pad_bytes > g_pad_n) {
        free(g_pad);
        g_pad_n = (e->pad_bytes + 63) & ~(size_t)63;
        g_pad = aligned_alloc(64, g_pad_n);
        if (!g_pad) {
            fprintf(stderr, "bertqat: out of memory allocating %zu bytes of GEMM scratchpad\n", g_pad_n);
            abort();
        }
    }
    dnnl_memory_t sm = NULL, dm = NULL, pm = NULL;
    dnnl_status_t s;
    if ((s = dnnl_memory_create(&sm, &e->src_md, g_engine, (void *)xu8)) != dnnl_success ||
        (s = dnnl_memory_create(&dm, &e->dst_md, g_engine, acc)) != dnnl_success ||
        (e->pad_bytes && (s = dnnl_memory_create(&pm, &e->pad_md, g_engine, g_pad)) != dnnl_success)) {
        rc = dnnl_fail(s, "memory creation");
        goto cleanup;
    }
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, sm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, dm}, {DNNL_ARG_SCRATCHPAD, pm}};
    if ((s = dnnl_primitive_execute(e->prim, g_stream, pm ? 4 : 3, args)) != dnnl_success ||
        (s = dnnl_stream_wait(g_stream)) != dnnl_success)
        rc = dnnl_fail(s, "u8s8 matmul execution");

cleanup:
    if (sm) dnnl_memory_destroy(sm);
    if (dm) dnnl_memory_destroy(dm);
    if (pm) dnnl_memory_destroy(pm);
    return rc;
}

static float *grow(float **buf, int64_t *cap, int64_t n) {
    if (*cap < n) {
        free(*buf);
        *buf = bq_malloc((size_t)n * sizeof(float));
        *cap = n;
    }
    return *buf;
}

/* The activation code clamp(rne(x/sx), -128, 127) as a float, with a true division (bq_qgemm_quantize_u8);
 * a NaN gives 0. (v + 1.5·2^23) − 1.5·2^23 rounds |v| < 2^22 to nearest even. */
static inline float code_of(float x, float sx) {
    const float magic = 12582912.0f;
    float v = x / sx;
    v = v < -128.0f ? -128.0f : v;
    v = v > 127.0f ? 127.0f : v;
    v = v == v ? v : 0.0f;
    return (v + magic) - magic;
}

#define SPLIT_KBLOCK 1024 /* 1024 · 2^14 = 2^24: the largest block whose sums stay exact in fp32 */

/* Split weights: acc = Σ_k qx·qw + comp (comp = 128·Σ_k qw, so acc = Σ_k (qx+128)·qw as oneDNN's sums)
 * from the activation codes as floats fx (M,K), by sgemm in blocks of SPLIT_KBLOCK inputs whose sums are
 * exact (see the top of this file), added in int32. */
QG_VEC static void split_sums(BqQGemmWeights *w, const float *fx, int64_t M, int32_t *acc) {
    const int64_t N = w->N, K = w->K;
    float *fy = grow(&g_fy, &g_fy_n, M * N);
    for (int64_t k0 = 0; k0 < K; k0 += SPLIT_KBLOCK) {
        const int64_t kb = K - k0 < SPLIT_KBLOCK ? K - k0 : SPLIT_KBLOCK;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)kb, 1.0f, fx + k0, (int)K,
                    w->fcodes + k0, (int)K, 0.0f, fy, (int)N);
        const int first = k0 == 0;
#pragma omp parallel for if (M * N > 65536) schedule(static)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++)
                acc[m * N + n] = (first ? w->comp[n] : acc[m * N + n]) + (int32_t)fy[m * N + n];
    }
}

/* acc = Σ (qx+128)·qw, not yet corrected: one oneDNN GEMM, or split_sums. */
static int run_raw(BqQGemmWeights *w, const uint8_t *xu8, int64_t M, int32_t *acc) {
    BQ_CHECK(w && xu8 && acc && M > 0);
    const double t0 = bq_section_start();
    int rc = BQ_OK;
    if (w->split) {
        float *fx = grow(&g_fx, &g_fx_n, M * w->K);
#pragma omp parallel for if (M * w->K > 65536) schedule(static)
        for (int64_t i = 0; i < M * w->K; i++) fx[i] = (float)((int)xu8[i] - 128);
        split_sums(w, fx, M, acc);
    } else {
        CacheEntry *e;
        rc = cache_get(M, w->N, w->K, &e);
        if (!rc) rc = run_onednn(w, &w->h, e, xu8, acc);
    }
    bq_section_end(BQ_SEC_GEMM_INT8, t0);
    return rc;
}

int bq_qgemm_raw(BqQGemmWeights *w, const uint8_t *xu8, int64_t M, int32_t *acc) {
    return run_raw(w, xu8, M, acc);
}

const int32_t *bq_qgemm_weights_comp(const BqQGemmWeights *w) { return w->comp; }
const float *bq_qgemm_weights_scale(const BqQGemmWeights *w) { return w->sw; }

int bq_qgemm_s32(BqQGemmWeights *w, const uint8_t *xu8, int64_t M, int32_t *acc) {
    int rc = run_raw(w, xu8, M, acc);
    if (rc) return rc;
    const int64_t N = w->N;
#pragma omp parallel for if (M * N > 16384) schedule(static)
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) acc[m * N + n] -= w->comp[n];
    return BQ_OK;
}

/* y = fl(fl((float)(acc − comp[n])·fl(sx·sw[n])) + b[n]) into the nout column blocks. */
QG_VEC static void epilogue(float *const out[], int nout, const int32_t *scratch, const int32_t *comp,
                            const float *sw, const float *b, float sx, int64_t M, int64_t N) {
    const int64_t NB = N / nout;
#pragma omp parallel for if (M * N > 16384) schedule(static)
    for (int64_t m = 0; m < M; m++) {
        const int32_t *a = scratch + m * N;
        for (int j = 0; j < nout; j++) {
            float *y = out[j] + m * NB;
            const int64_t n0 = (int64_t)j * NB;
            if (b) {
                for (int64_t n = 0; n < NB; n++)
                    y[n] = (float)(a[n0 + n] - comp[n0 + n]) * (sx * sw[n0 + n]) + b[n0 + n];
            } else {
                for (int64_t n = 0; n < NB; n++) y[n] = (float)(a[n0 + n] - comp[n0 + n]) * (sx * sw[n0 + n]);
            }
        }
    }
}

int bq_qgemm_linear(BqQGemmWeights *w, const uint8_t *xu8, int64_t M, float sx, const float *b, int nout,
                    float *const out[], int32_t *scratch) {
    BQ_CHECK(nout >= 1 && w->N % nout == 0 && out && scratch);
    int rc = run_raw(w, xu8, M, scratch);
    if (rc) return rc;
    epilogue(out, nout, scratch, w->comp, w->sw, b, sx, M, w->N);
    return BQ_OK;
}

/* Split weights, fp32 in and out: the codes of x as floats, split_sums into scratch (M·N int32), then
 * the epilogue of bq_qgemm_linear: the same bits as the u8 path. */
QG_VEC static void linear_split(BqQGemmWeights *w, const float *x, int64_t M, float sx, const float *b, float *out,
                                int32_t *scratch) {
    const int64_t K = w->K;
    float *fx = grow(&g_fx, &g_fx_n, M * K);
#pragma omp parallel for if (M * K > 65536) schedule(static)
    for (int64_t i = 0; i < M * K; i++) fx[i] = code_of(x[i], sx);
    split_sums(w, fx, M, scratch);
    float *const dst[1] = {out};
    epilogue(dst, 1, scratch, w->comp, w->sw, b, sx, M, w->N);
}

int bq_qgemm_linear_f32(BqQGemmWeights *w, const float *x, int64_t M, float sx, const float *b, float *out,
                        uint8_t *codes, int32_t *scratch) {
    BQ_CHECK(w && x && out && M > 0 && scratch);
    if (w->split) {
        linear_split(w, x, M, sx, b, out, scratch);
        return BQ_OK;
    }
    BQ_CHECK(codes);
    bq_qgemm_quantize_u8(codes, x, M * w->K, sx);
    float *const dst[1] = {out};
    return bq_qgemm_linear(w, codes, M, sx, b, 1, dst, scratch);
}

QG_VEC void bq_qgemm_quantize_u8(uint8_t *out, const float *x, int64_t n, float sx) {
    const double t0 = bq_section_start();
#pragma omp parallel for if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++) out[i] = (uint8_t)((int)code_of(x[i], sx) + 128);
    bq_section_end(BQ_SEC_QUANTIZE, t0);
}

/* ---- weights refilled every step (the QAT forward) ---- */

int bq_qgemm_weights_create_empty(BqQGemmWeights **out, int64_t N, int64_t K, int bits, const char *name) {
    BQ_CHECK(out && N > 0 && K > 0);
    *out = NULL;
    if (bits < 2 || bits > 8) return bq_err(BQ_EINVAL, "%s: %d-bit weights are not supported (2..8)", name, bits);
    if ((int64_t)K * 255 * 128 > INT32_MAX)
        return bq_err(BQ_EINVAL, "%s: K = %lld overflows the int32 accumulator", name, (long long)K);
    int rc = ensure_engine();
    if (rc) return rc;
    BqQGemmWeights *w = bq_calloc(1, sizeof *w);
    w->N = N, w->K = K, w->bits = bits;
    w->split = bits > 7 && !bq_qgemm_exact_8bit();
    w->codes = bq_calloc((size_t)(N * K), 1);
    w->h.codes = w->codes;
    if (w->split) w->fcodes = bq_calloc((size_t)(N * K), sizeof(float));
    w->comp = bq_calloc((size_t)N, sizeof(int32_t));
    w->sw = bq_calloc((size_t)N, sizeof(float));
    *out = w;
    return BQ_OK;
}

int bq_qgemm_weights_split(const BqQGemmWeights *w) { return w->split; }

void bq_qgemm_weights_freeze(BqQGemmWeights *w) {
    BQ_CHECK(w->split && !w->fixed);
    free(w->codes); /* the sums read fcodes; only a refill compares against the codes */
    w->codes = w->h.codes = NULL;
    w->fixed = 1;
}

QG_VEC int bq_qgemm_weights_set(BqQGemmWeights *w, const float *wf, const float *sw, int64_t nscale) {
    const int64_t N = w->N, K = w->K;
    BQ_CHECK(wf && sw && (nscale == 1 || nscale == N) && !w->fixed);
    const float lo = (float)-(1 << (w->bits - 1)), hi = (float)((1 << (w->bits - 1)) - 1);
    const float magic = 12582912.0f; /* 1.5·2^23: (v + magic) − magic rounds |v| < 2^22 to nearest even */
    int changed = 0;
    for (int64_t n = 0; n < N; n++) {
        const float s = sw[nscale == 1 ? 0 : n];
        changed |= s != w->sw[n];
        w->sw[n] = s;
    }
    int8_t *c = w->codes;
    float *fc = w->fcodes;
    const int split = w->split;
#pragma omp parallel for reduction(| : changed) if (N * K > 65536) schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const float s = w->sw[n];
        int32_t sum = 0;
        int ch = 0;
        for (int64_t k = 0; k < K; k++) {
            float v = wf[n * K + k] / s;
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
            v = v == v ? v : 0.0f;
            const int q = (int)((v + magic) - magic);
            ch |= c[n * K + k] != q;
            c[n * K + k] = (int8_t)q;
            sum += q;
            if (split) fc[n * K + k] = (float)q;
        }
        w->comp[n] = 128 * sum;
        changed |= ch;
    }
    if (changed)
        for (int i = 0; i < w->h.npacks; i++) w->h.packs[i].stale = 1;
    return changed;
}
