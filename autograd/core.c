/* Core services: error messages, checked allocation, arenas, RNG (xoshiro256**, Blackman and
 * Vigna 2018; splitmix64 for seeding and counter hashing), runtime set-up (OpenBLAS core type and
 * threads), clocks and durable file replacement. Contracts are in bq.h. */
#include "autograd/bq.h"

#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* OpenBLAS extensions (declared in its cblas.h on Debian, repeated here for other layouts). */
extern void openblas_set_num_threads(int num_threads);
extern char *openblas_get_corename(void);
extern char *openblas_get_config(void);
extern int openblas_get_parallel(void);

static _Thread_local char g_errmsg[1024];

int bq_err(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_errmsg, sizeof g_errmsg, fmt, ap);
    va_end(ap);
    return status;
}

int bq_err_ctx(int status, const char *fmt, ...) {
    char prefix[512], old[sizeof g_errmsg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, g_errmsg, sizeof old);
    snprintf(g_errmsg, sizeof g_errmsg, "%.500s: %.500s", prefix, old);
    return status;
}

const char *bq_errmsg(void) { return g_errmsg[0] ? g_errmsg : "unknown error"; }
void bq_err_clear(void) { g_errmsg[0] = '\0'; }

_Noreturn void bq_fail(const char *file, int line, const char *expr) {
    fprintf(stderr, "bertqat: internal error at %s:%d: check failed: %s\n", file, line, expr);
    abort();
}

static _Noreturn void oom(size_t n) {
    fprintf(stderr, "bertqat: out of memory allocating %zu bytes\n", n);
    abort();
}

void *bq_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) oom(n);
    return p;
}

void *bq_calloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) oom(count * size);
    return p;
}

void *bq_realloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q) oom(n);
    return q;
}

char *bq_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = bq_malloc(n);
    memcpy(d, s, n);
    return d;
}

/* ---- arenas ---- */

int bq_arena_init(BqArena *a, size_t reserve_bytes, const char *name) {
    memset(a, 0, sizeof *a);
    size_t cap = (reserve_bytes + 4095) & ~(size_t)4095;
    void *p = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return bq_err(BQ_ENOMEM, "cannot reserve %zu MiB for arena '%s'", cap >> 20, name);
    /* Huge pages from BQ_ARENA_SMALL_PAGES on: fewer TLB misses on large activations (training's). The
     * first 16 MiB keep 4 KiB pages, so that an inference forward's activations (the BERT-base integer
     * engine: 2.4 MiB at batch 1, 8.3 at batch 8, 13 at batch 64) are resident by the page they use, not
     * rounded up to 2 MiB pages (1.9 MiB more at batch 8). Both advisory only. */
    const size_t small = cap < BQ_ARENA_SMALL_PAGES ? cap : BQ_ARENA_SMALL_PAGES;
    (void)madvise(p, small, MADV_NOHUGEPAGE);
    if (cap > small) (void)madvise((char *)p + small, cap - small, MADV_HUGEPAGE);
    a->base = p;
    a->cap = cap;
    a->name = name;
    return BQ_OK;
}

/* The next `bytes` of the arena from an address aligned to `align` (a power of two). */
static char *arena_bump(BqArena *a, size_t bytes, size_t align) {
    uintptr_t at = (uintptr_t)(a->base + a->used);
    size_t start = (size_t)(((at + align - 1) & ~(uintptr_t)(align - 1)) - (uintptr_t)a->base);
    if (start + bytes > a->cap) {
        fprintf(stderr, "bertqat: arena '%s' exhausted (%zu of %zu bytes used, %zu requested)\n", a->name,
                a->used, a->cap, bytes);
        BQ_CHECK(start + bytes <= a->cap);
    }
    a->used = start + bytes;
    if (a->used > a->peak) a->peak = a->used;
    return a->base + start;
}

void *bq_arena_alloc(BqArena *a, size_t bytes) { return arena_bump(a, bytes, 64); }

/* Large blocks are zeroed by all threads (gradient buffers of activations are most of a training
 * step's memory traffic outside the kernels). */
void *bq_arena_alloc_zero(BqArena *a, size_t bytes) {
    char *p = bq_arena_alloc(a, bytes);
    enum { CHUNK = 1 << 18 };
    if (bytes < 4 * (size_t)CHUNK || omp_in_parallel()) {
        memset(p, 0, bytes);
        return p;
    }
    int64_t nch = (int64_t)((bytes + CHUNK - 1) / CHUNK);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nch; c++) {
        size_t off = (size_t)c * CHUNK, len = off + CHUNK <= bytes ? CHUNK : bytes - off;
        memset(p + off, 0, len);
    }
    return p;
}

enum { PAGE_BYTES = 4096 };

/* From 8 MiB up a page block is whole 2 MiB huge pages, so that no huge page of a neighbouring
 * allocation, once faulted in, makes part of it resident. */
static size_t pages_align(size_t bytes) { return bytes >= ((size_t)8 << 20) ? (size_t)2 << 20 : PAGE_BYTES; }

size_t bq_arena_pages_len(size_t bytes) {
    const size_t align = pages_align(bytes);
    return (bytes + align - 1) & ~(align - 1);
}

void *bq_arena_alloc_pages(BqArena *a, size_t bytes) {
    const size_t len = bq_arena_pages_len(bytes);
    char *p = arena_bump(a, len, pages_align(bytes));
    /* A private anonymous mapping reads as zeros after MADV_DONTNEED; should the call fail, zero by hand. */
    if (len && madvise(p, len, MADV_DONTNEED) != 0) memset(p, 0, len);
    return p;
}

void bq_arena_release(BqArena *a, void *block, size_t bytes) {
    char *p = block;
    const size_t len = bq_arena_pages_len(bytes);
    BQ_CHECK(p >= a->base && p + len <= a->base + a->cap && ((uintptr_t)p & (pages_align(bytes) - 1)) == 0);
    if (len && madvise(p, len, MADV_DONTNEED) != 0) memset(p, 0, len);
}

void bq_arena_rewind(BqArena *a, size_t mark) {
    BQ_CHECK(mark <= a->used);
    a->used = mark;
}

void bq_arena_free(BqArena *a) {
    if (a->base) munmap(a->base, a->cap);
    memset(a, 0, sizeof *a);
}

/* ---- RNG ---- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void bq_rng_seed(BqRng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t bq_rng_u64(BqRng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double bq_rng_uniform(BqRng *r) { return (double)(bq_rng_u64(r) >> 11) * (1.0 / 9007199254740992.0); }

float bq_rng_normal(BqRng *r) {
    double u1 = bq_rng_uniform(r), u2 = bq_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

uint64_t bq_rng_below(BqRng *r, uint64_t n) {
    BQ_CHECK(n > 0);
    uint64_t limit = UINT64_MAX - UINT64_MAX % n; /* rejection removes modulo bias */
    uint64_t x;
    do x = bq_rng_u64(r);
    while (x >= limit);
    return x % n;
}

void bq_rng_shuffle_i32(BqRng *r, int32_t *v, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)bq_rng_below(r, (uint64_t)i + 1);
        int32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

uint64_t bq_hash64(uint64_t key, uint64_t index) {
    uint64_t x = key ^ (index * 0xD1B54A32D192ED03ull);
    return splitmix64(&x);
}

/* ---- runtime ---- */

static int g_threads = 1;

/* CPUID leaf 7, EBX bit 16: AVX512F; also requires the OS to save ZMM state (XCR0 bits 5-7). */
static int cpu_has_avx512(void) {
#if defined(__x86_64__)
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    if (a < 7) return 0;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
    if (!(c & (1u << 27))) return 0; /* OSXSAVE */
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 0xE6) != 0xE6) return 0;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    return (b >> 16) & 1;
#else
    return 0;
#endif
}

/* ---- CPU features and precision ---- */

#if defined(__x86_64__)
static void cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
}
#endif

const BqCpuFeatures *bq_cpu_features(void) {
    static BqCpuFeatures f;
    static int done;
    if (done) return &f;
    done = 1;
#if defined(__x86_64__)
    unsigned r[4];
    cpuid(0, 0, r);
    unsigned max_leaf = r[0];
    if (max_leaf < 1) return &f;
    cpuid(1, 0, r);
    if (!(r[2] & (1u << 27))) return &f; /* OSXSAVE: without it XGETBV faults and no AVX state is saved */
    int fma = (r[2] >> 12) & 1;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    int ymm = (xlo & 0x6) == 0x6;           /* SSE and AVX state */
    int zmm = ymm && (xlo & 0xE0) == 0xE0;  /* opmask, ZMM0-15 upper halves, ZMM16-31 */
    int tiles = (xlo & 0x60000) == 0x60000; /* XTILECFG and XTILEDATA */
    f.fma = ymm && fma;
    if (max_leaf < 7) return &f;
    cpuid(7, 0, r);
    unsigned max_sub = r[0], ebx = r[1], ecx = r[2], edx = r[3];
    f.avx2 = ymm && ((ebx >> 5) & 1);
    f.avx512f = zmm && ((ebx >> 16) & 1);
    f.avx512_vnni = zmm && ((ecx >> 11) & 1);
    f.amx_bf16 = tiles && ((edx >> 22) & 1);
    f.amx_int8 = tiles && ((edx >> 25) & 1);
    if (max_sub >= 1) {
        cpuid(7, 1, r);
        f.avx_vnni = ymm && ((r[0] >> 4) & 1);
        f.avx512_bf16 = zmm && ((r[0] >> 5) & 1);
    }
#endif
    return &f;
}

const char *bq_precision_name(BqPrecision p) { return p == BQ_PRECISION_BF16 ? "bf16" : "fp32"; }

int bq_precision_resolve(const char *value, const BqCpuFeatures *f, BqPrecision *out, const char **why) {
    int cpu_bf16 = f->avx512_bf16 || f->amx_bf16;
    const char *reason;
    *out = BQ_PRECISION_FP32;
    if (!value || !strcmp(value, "auto")) {
        if (cpu_bf16) *out = BQ_PRECISION_BF16;
        reason = f->amx_bf16      ? "auto: the CPU has AMX-BF16"
                 : f->avx512_bf16 ? "auto: the CPU has AVX512-BF16"
                                  : "auto: the CPU has neither AVX512-BF16 nor AMX-BF16";
    } else if (!strcmp(value, "fp32")) {
        reason = "flag";
    } else if (!strcmp(value, "bf16")) {
        *out = BQ_PRECISION_BF16;
        reason = cpu_bf16 ? "flag; the CPU has bf16 units"
                          : "flag; emulated, slower than fp32: the CPU has neither AVX512-BF16 nor AMX-BF16";
    } else {
        return bq_err(BQ_EINVAL, "--precision: '%s' is not fp32, bf16 or auto", value);
    }
    if (why) *why = reason;
    return BQ_OK;
}

const char *bq_cpu_bf16_describe(void) {
    static char buf[256];
    const BqCpuFeatures *f = bq_cpu_features();
    BqPrecision p;
    const char *why = "";
    bq_precision_resolve("auto", f, &p, &why);
    snprintf(buf, sizeof buf, "CPU bf16: AVX512-BF16 %s, AMX-BF16 %s; --precision auto runs %s (%s)",
             f->avx512_bf16 ? "yes" : "no", f->amx_bf16 ? "yes" : "no", bq_precision_name(p), why + 6);
    return buf;
}

int bq_runtime_boot(int argc, char **argv) {
    (void)argc;
    if (!getenv("OPENBLAS_CORETYPE") && !getenv("BQ_NO_REEXEC") && cpu_has_avx512()) {
        setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
        setenv("BQ_NO_REEXEC", "1", 1); /* guards against a loop if exec keeps the old image */
        /* a caller without argv (a test's main(void)) is re-executed with its path as the only argument */
        char self[] = "/proc/self/exe", *self_argv[] = {self, NULL};
        execv("/proc/self/exe", argv ? argv : self_argv);
        return bq_err(BQ_EIO, "cannot re-execute with OPENBLAS_CORETYPE=SkylakeX: %s", strerror(errno));
    }
    bq_runtime_set_threads(0);
    return BQ_OK;
}

void bq_runtime_set_threads(int threads) {
    if (threads <= 0) {
        const char *env = getenv("BQ_THREADS");
        threads = env ? atoi(env) : 0;
    }
    if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (threads <= 0) threads = 1;
    g_threads = threads;
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
}

int bq_runtime_threads(void) { return g_threads; }

const char *bq_runtime_describe(void) {
    static char buf[256];
    const char *core = openblas_get_corename();
    const char *env = getenv("OPENBLAS_CORETYPE");
    int par = openblas_get_parallel();
    snprintf(buf, sizeof buf, "OpenBLAS kernel %s (%s), %s threading, %d thread%s", core ? core : "?",
             env ? (getenv("BQ_NO_REEXEC") ? "chosen by bertqat for AVX-512" : "set by OPENBLAS_CORETYPE")
                 : "auto-detected",
             par == 2 ? "OpenMP" : par == 1 ? "pthread" : "no", g_threads, g_threads == 1 ? "" : "s");
    return buf;
}

double bq_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int g_sec_on;
static double g_sec_s[BQ_SEC_COUNT];
static int64_t g_sec_n[BQ_SEC_COUNT];

void bq_sections_enable(int on) { g_sec_on = on; }
void bq_sections_reset(void) {
    memset(g_sec_s, 0, sizeof g_sec_s);
    memset(g_sec_n, 0, sizeof g_sec_n);
}
double bq_section_start(void) { return g_sec_on && !omp_in_parallel() ? bq_now() : 0.0; }
void bq_section_end(BqSection s, double t0) {
    BQ_CHECK(s >= 0 && s < BQ_SEC_COUNT);
    if (t0 <= 0.0) return;
    g_sec_s[s] += bq_now() - t0;
    g_sec_n[s]++;
}
double bq_section_seconds(BqSection s) { return s >= 0 && s < BQ_SEC_COUNT ? g_sec_s[s] : 0.0; }
int64_t bq_section_calls(BqSection s) { return s >= 0 && s < BQ_SEC_COUNT ? g_sec_n[s] : 0; }
const char *bq_section_name(BqSection s) {
    static const char *const names[BQ_SEC_COUNT] = {
        [BQ_SEC_GEMM_F32] = "gemm fp32", [BQ_SEC_GEMM_BF16] = "gemm bf16", [BQ_SEC_BF16_CONVERT] = "  bf16 convert",
        [BQ_SEC_GEMM_INT8] = "gemm int8", [BQ_SEC_QUANTIZE] = "quantize", [BQ_SEC_ATTENTION] = "attention",
        [BQ_SEC_EPILOGUE] = "epilogue",
    };
    return s >= 0 && s < BQ_SEC_COUNT ? names[s] : "?";
}

size_t bq_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (size_t)ru.ru_maxrss * 1024;
}

/* ---- durable files ---- */

int bq_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return bq_err(BQ_EIO, "%s: cannot open for fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    if (rc != 0 && errno != EINVAL) return bq_err(BQ_EIO, "%s: fsync failed: %s", path, strerror(errno));
    return BQ_OK;
}

int bq_check_writable_parent(const char *path) {
    char *copy = bq_strdup(path);
    const char *dir = dirname(copy);
    struct stat sb;
    int st = BQ_OK;
    if (stat(dir, &sb) != 0) st = bq_err(BQ_EIO, "%s: cannot create: %s", path, strerror(errno));
    else if (!S_ISDIR(sb.st_mode)) st = bq_err(BQ_EIO, "%s: cannot create: %s", path, strerror(ENOTDIR));
    else if (access(dir, W_OK) != 0) st = bq_err(BQ_EIO, "%s: cannot create: %s", path, strerror(errno));
    free(copy);
    return st;
}

int bq_mkdir_p(const char *dir) {
    char *p = bq_strdup(dir);
    int st = BQ_OK;
    for (char *s = p + 1;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdir(p, 0777) != 0 && errno != EEXIST) {
                st = bq_err(BQ_EIO, "%s: cannot create directory: %s", p, strerror(errno));
                break;
            }
            *s = c;
            if (!c) break;
        }
    }
    free(p);
    return st;
}

int bq_rename_durable(const char *tmp_path, const char *final_path) {
    int st = bq_fsync_path(tmp_path);
    if (st) return st;
    if (rename(tmp_path, final_path) != 0)
        return bq_err(BQ_EIO, "%s: cannot rename to %s: %s", tmp_path, final_path, strerror(errno));
    char *copy = bq_strdup(final_path);
    st = bq_fsync_path(dirname(copy));
    free(copy);
    return st;
}

int bq_replace_dir(const char *tmp, const char *dir, const char *old, const char **leftover) {
    *leftover = NULL;
    struct stat sb;
    int had = stat(dir, &sb) == 0, st = BQ_OK;
    if (had && renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
        *leftover = tmp;
    } else {
        if (had && rename(dir, old) != 0)
            return bq_err(BQ_EIO, "%s: cannot move aside to %s: %s", dir, old, strerror(errno));
        if (rename(tmp, dir) != 0) {
            st = bq_err(BQ_EIO, "%s: cannot rename to %s: %s", tmp, dir, strerror(errno));
            if (had) rename(old, dir);
            return st;
        }
        if (had) *leftover = old;
    }
    /* The swap is done: a parent that cannot be fsynced leaves it less durable, not undone. */
    char *copy = bq_strdup(dir);
    bq_fsync_path(dirname(copy));
    free(copy);
    return BQ_OK;
}

int bq_is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

int bq_is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

int bq_copy_file(const char *from, const char *to) {
    int st = BQ_OK;
    FILE *in = fopen(from, "rb"), *out = NULL;
    if (!in) return bq_err(BQ_EIO, "%s: cannot open: %s", from, strerror(errno));
    out = fopen(to, "wb");
    if (!out) {
        st = bq_err(BQ_EIO, "%s: cannot create: %s", to, strerror(errno));
        goto cleanup;
    }
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) {
            st = bq_err(BQ_EIO, "%s: write failed: %s", to, strerror(errno));
            goto cleanup;
        }
    if (ferror(in)) st = bq_err(BQ_EIO, "%s: read failed", from);
cleanup:
    if (in) fclose(in);
    if (out && st) fclose(out);
    else if (out) st = bq_fclose_written(out, to);
    if (!st) st = bq_fsync_path(to);
    return st;
}

int bq_fclose_written(FILE *f, const char *path) {
    int bad = ferror(f), err = bad ? errno : 0;
    if (fclose(f) != 0 && !bad) bad = 1, err = errno;
    if (!bad) return BQ_OK;
    return bq_err(BQ_EIO, "%s: write failed: %s", path, err ? strerror(err) : "I/O error");
}

/* ---- output locks ---- */

#define OUT_LOCKS_MAX 8

static struct {
    int fd;
    char *path;
} g_locks[OUT_LOCKS_MAX];
static int g_nlocks;

/* The "<pid> <command>" a holder wrote into its lock file, "" when it has not written it yet. */
static void lock_holder(int fd, char *buf, size_t n) {
    ssize_t k = pread(fd, buf, n - 1, 0);
    buf[k > 0 ? k : 0] = 0;
    buf[strcspn(buf, "\n")] = 0;
}

int bq_out_lock(const char *out, const char *flag, const char *cmd, int mkdir_parents) {
    BQ_CHECK(g_nlocks < OUT_LOCKS_MAX);
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') n--;
    char *path = bq_malloc(n + 6), *parent = NULL;
    snprintf(path, n + 6, "%.*s.lock", (int)n, out);
    parent = bq_strdup(path);
    int st = mkdir_parents ? bq_mkdir_p(dirname(parent)) : BQ_OK, fd = -1;
    if (st) {
        bq_err_ctx(st, "%s %s", flag, out);
        goto cleanup;
    }
    /* A holder removes its lock file before it unlocks it: whoever wins the lock on a file that is no
     * longer at `path` holds nothing and tries again with the file there now. */
    for (int tries = 0; tries < 100 && fd < 0 && !st; tries++) {
        fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            st = bq_err(BQ_EIO, "%s %s: cannot create the lock file %s: %s", flag, out, path, strerror(errno));
            break;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            char who[128];
            int err = errno;
            lock_holder(fd, who, sizeof who);
            char *sp = strchr(who, ' ');
            if (err != EWOULDBLOCK)
                st = bq_err(BQ_EIO, "%s %s: cannot lock %s: %s", flag, out, path, strerror(err));
            else if (sp && sp[1])
                st = bq_err(BQ_EIO, "%s %s: in use by another bertqat process (pid %.*s, %s), which holds %s; wait for "
                            "it to finish or choose another output", flag, out, (int)(sp - who), who, sp + 1, path);
            else
                st = bq_err(BQ_EIO, "%s %s: in use by another process, which holds %s; wait for it to finish or "
                            "choose another output", flag, out, path);
            break;
        }
        struct stat held, now;
        if (fstat(fd, &held) != 0 || stat(path, &now) != 0 || held.st_dev != now.st_dev || held.st_ino != now.st_ino) {
            close(fd);
            fd = -1;
        }
    }
    if (!st && fd < 0) st = bq_err(BQ_EIO, "%s %s: cannot lock %s: it keeps being replaced", flag, out, path);
    if (st) goto cleanup;
    /* The record is for the message of a refused process only: a write that fails (a full disk) is no
     * reason to refuse the command itself. */
    char rec[160];
    int len = snprintf(rec, sizeof rec, "%ld %s\n", (long)getpid(), cmd);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, rec, (size_t)len, 0) != (ssize_t)len) {
        /* no record: a refused process names the lock file only */
    }
    g_locks[g_nlocks].fd = fd;
    g_locks[g_nlocks].path = path;
    g_nlocks++;
    fd = -1;
    path = NULL;
cleanup:
    if (fd >= 0) close(fd);
    free(path);
    free(parent);
    return st;
}

int bq_out_lock_mark(void) { return g_nlocks; }

void bq_out_unlock_to(int mark) {
    while (g_nlocks > mark) {
        g_nlocks--;
        /* removed while still locked (see bq_out_lock) */
        unlink(g_locks[g_nlocks].path);
        close(g_locks[g_nlocks].fd);
        free(g_locks[g_nlocks].path);
    }
}

void bq_cpu_model(char *buf, size_t n) {
    snprintf(buf, n, "unknown CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10)) continue;
        char *c = strchr(line, ':');
        if (!c) break;
        c++;
        while (*c == ' ' || *c == '\t') c++;
        c[strcspn(c, "\n")] = 0;
        snprintf(buf, n, "%s", c);
        break;
    }
    fclose(f);
}
