/* Core services shared by every module: status codes and the error message, invariant checks,
 * checked allocation, arenas, the explicit RNG, and process runtime set-up (BLAS kernel choice,
 * thread count).
 *
 * Error contract: a bug (violated invariant) aborts through BQ_CHECK with file:line. Anything caused
 * by input (files, flags, data) returns a non-zero BqStatus and sets a one-line message through
 * bq_err(); only src/cli/main.c prints it and exits. */
#ifndef BQ_H
#define BQ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifndef BQ_VERSION_STRING
#define BQ_VERSION_STRING "0.0.0"
#endif

typedef enum BqStatus {
    BQ_OK = 0,
    BQ_EIO = 1,      /* a file could not be opened, read or written */
    BQ_EFORMAT = 2,  /* a file's content is malformed, truncated or of the wrong shape */
    BQ_EINVAL = 3,   /* a flag or argument is invalid */
    BQ_ENOMEM = 4,   /* a size requested by the input cannot be allocated */
    BQ_ENUMERIC = 5, /* NaN/Inf loss or similar numeric failure */
    BQ_EINTR = 6,    /* interrupted by a signal; state was saved */
} BqStatus;

/* Sets the thread-local error message (printf format) and returns status, so call sites read
 * `return bq_err(BQ_EIO, "%s: cannot open", path);`. */
int bq_err(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prefixes the current message with "context: " (e.g. the file being parsed); returns status. */
int bq_err_ctx(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *bq_errmsg(void);
void bq_err_clear(void);

_Noreturn void bq_fail(const char *file, int line, const char *expr);
#define BQ_CHECK(cond)                                       \
    do {                                                     \
        if (!(cond)) bq_fail(__FILE__, __LINE__, #cond);     \
    } while (0)

/* Checked allocation: out of memory is treated as fatal (abort with a message). */
void *bq_malloc(size_t n);
void *bq_calloc(size_t count, size_t size);
void *bq_realloc(void *p, size_t n);
char *bq_strdup(const char *s);

/* Arena: a bump allocator over one large reserved mapping (MAP_NORESERVE), so capacity is virtual
 * and only touched pages cost memory. Every allocation is 64-byte aligned. Rewinding to a mark frees
 * everything allocated after it. A page-granular block (bq_arena_alloc_pages) can also give its pages
 * back early (bq_arena_release): its address range stays allocated and reads as zeros afterwards. */
typedef struct BqArena {
    char *base;
    size_t cap;
    size_t used;
    size_t peak;
    const char *name;
} BqArena;

/* The first BQ_ARENA_SMALL_PAGES bytes of an arena use 4 KiB pages, the rest transparent huge pages. */
#define BQ_ARENA_SMALL_PAGES ((size_t)16 << 20)
int bq_arena_init(BqArena *a, size_t reserve_bytes, const char *name);
void *bq_arena_alloc(BqArena *a, size_t bytes);             /* BQ_CHECKs capacity */
void *bq_arena_alloc_zero(BqArena *a, size_t bytes);
/* A zeroed block of whole pages (whole 2 MiB huge pages from 8 MiB up)
 * that is not made resident: its pages are dropped (MADV_DONTNEED) and come back as zero pages when
 * first touched. For large buffers written late, if at all (activation gradients). */
void *bq_arena_alloc_pages(BqArena *a, size_t bytes);
/* The arena bytes bq_arena_alloc_pages(a, bytes) takes, its alignment padding left out. */
size_t bq_arena_pages_len(size_t bytes);
/* Gives the pages of the block bq_arena_alloc_pages(a, bytes) returned back to the system; the block
 * reads as zeros from then on and costs memory again only where it is written. */
void bq_arena_release(BqArena *a, void *block, size_t bytes);
static inline size_t bq_arena_mark(const BqArena *a) { return a->used; }
void bq_arena_rewind(BqArena *a, size_t mark);
void bq_arena_free(BqArena *a);

/* RNG: xoshiro256** with an explicit state; never rand(). The state is plain data so checkpoints
 * can save and restore it. */
typedef struct BqRng {
    uint64_t s[4];
} BqRng;

void bq_rng_seed(BqRng *r, uint64_t seed);
uint64_t bq_rng_u64(BqRng *r);
double bq_rng_uniform(BqRng *r);            /* [0, 1) */
float bq_rng_normal(BqRng *r);              /* standard normal (Box-Muller) */
uint64_t bq_rng_below(BqRng *r, uint64_t n); /* uniform in [0, n) */
void bq_rng_shuffle_i32(BqRng *r, int32_t *v, int64_t n); /* Fisher-Yates */

/* Counter-based randomness: the value for element i does not depend on which thread computes it, so
 * dropout masks are identical for any thread count. bq_hash64 is splitmix64 of key and index (keys,
 * seeds). bq_hash_uniform is a uniform float in [0, 1) on a 2^-24 grid from two rounds of the 32-bit
 * MurmurHash3 finaliser over the index and the two halves of the key: 32-bit integer operations only,
 * so the dropout loop vectorizes. */
uint64_t bq_hash64(uint64_t key, uint64_t index);
static inline __attribute__((always_inline)) uint32_t bq_mix32(uint32_t h) {
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return h;
}
static inline __attribute__((always_inline)) float bq_hash_uniform(uint64_t key, uint64_t index) {
    uint32_t h = bq_mix32((uint32_t)index ^ (uint32_t)key);
    h = bq_mix32(h + ((uint32_t)(index >> 32) ^ (uint32_t)(key >> 32)));
    return (float)(int32_t)(h >> 8) * (1.0f / 16777216.0f);
}

/* Runtime set-up, called first thing in main() with argv.
 * If the CPU has AVX-512 and the user has not set OPENBLAS_CORETYPE, sets OPENBLAS_CORETYPE=SkylakeX
 * and re-executes the program (OpenBLAS reads the variable only when it initialises) so the fast
 * sgemm kernel is used (argv NULL: re-executed with no arguments). Returns BQ_OK, or an error if re-exec
 * failed. */
int bq_runtime_boot(int argc, char **argv);
/* Sets the thread count for OpenMP loops and OpenBLAS (threads <= 0: number of online CPUs). */
void bq_runtime_set_threads(int threads);
int bq_runtime_threads(void);
/* The CPU's name: the first "model name" of /proc/cpuinfo, else "unknown CPU". */
void bq_cpu_model(char *buf, size_t n);
/* One line naming the BLAS library, its kernel (core) and the thread count. */
const char *bq_runtime_describe(void);

/* CPU features that decide the training precision and describe the integer engine's units, read once
 * with CPUID and XGETBV: each flag is 1 only when the CPU has the instructions AND the OS saves their
 * register state (YMM for AVX2/FMA/AVX-VNNI; ZMM and opmask for AVX-512; the AMX tile state XCR0 bits
 * 17-18 for AMX). CPUID.(EAX=7,ECX=0): ECX bit 11 AVX512-VNNI, EDX bit 22 AMX-BF16, bit 25 AMX-INT8;
 * CPUID.(EAX=7,ECX=1) EAX: bit 4 AVX-VNNI, bit 5 AVX512-BF16. */
typedef struct BqCpuFeatures {
    int avx2, fma, avx512f, avx512_bf16, amx_bf16;
    int avx512_vnni, avx_vnni, amx_int8;
} BqCpuFeatures;
const BqCpuFeatures *bq_cpu_features(void);

/* Training and inference precision. bf16 means mixed precision as torch.autocast(dtype=torch.bfloat16):
 * bf16 GEMM inputs, fp32 accumulation and outputs, fp32 master weights, optimizer state, LayerNorm,
 * softmax and loss (autograd/gemm.h; docs/training.md, "Precision"). */
typedef enum BqPrecision { BQ_PRECISION_FP32 = 0, BQ_PRECISION_BF16 = 1 } BqPrecision;
/* Resolves the value of --precision (fp32, bf16 or auto; NULL means auto) against the features f
 * (bq_cpu_features() for this CPU; tests pass others). auto is bf16 where f has AVX512-BF16 or AMX-BF16
 * (the bf16 units run the GEMMs through oneDNN, which every build links) and fp32 elsewhere, where bf16
 * would be emulated and slower than fp32. bf16 runs on every CPU: on the bf16 units where f has them,
 * emulated (same values, slower) elsewhere. Any other word is BQ_EINVAL naming the flag. *why (may be
 * NULL) receives a short reason for the choice, for run headers: for auto "auto: the CPU has AMX-BF16"
 * (AMX named first where f has both), "auto: the CPU has AVX512-BF16" or "auto: the CPU has neither
 * AVX512-BF16 nor AMX-BF16". */
int bq_precision_resolve(const char *value, const BqCpuFeatures *f, BqPrecision *out, const char **why);
const char *bq_precision_name(BqPrecision p);
/* One line for --version: the CPU's bf16 ISAs and what `--precision auto` resolves to, e.g.
 * "CPU bf16: AVX512-BF16 no, AMX-BF16 no; --precision auto runs fp32 (the CPU has neither ...)" or
 * "CPU bf16: AVX512-BF16 yes, AMX-BF16 yes; --precision auto runs bf16 (the CPU has AMX-BF16)". */
const char *bq_cpu_bf16_describe(void);

/* Monotonic wall clock in seconds. */
double bq_now(void);

/* ---- wall-time sections, for benchmarks ----
 * The passes that record no ops (the fused and tape-free forwards, the integer engine) are timed by
 * section. While sections are on (bq_sections_enable), bq_section_end adds the wall time since t0 =
 * bq_section_start() to section s; a call made inside an OpenMP parallel region (the attention's
 * per-head products) is not counted, so the sums stay serial wall time. Sections nest: the bf16
 * conversion is part of the bf16 GEMM's time. */
typedef enum BqSection {
    BQ_SEC_GEMM_F32,     /* bq_gemm_mat in fp32 (OpenBLAS) */
    BQ_SEC_GEMM_BF16,    /* bq_gemm_mat in bf16, operand conversion included */
    BQ_SEC_BF16_CONVERT, /* of which: operands converted to packed bf16 words */
    BQ_SEC_GEMM_INT8,    /* integer GEMMs (autograd/qgemm.h) */
    BQ_SEC_QUANTIZE,     /* activations quantized to codes outside an epilogue */
    BQ_SEC_ATTENTION,    /* the fused attention kernels, fp32 and integer */
    BQ_SEC_EPILOGUE,     /* the fused epilogues: bias, GELU, residual, LayerNorm, requantization */
    BQ_SEC_COUNT
} BqSection;
void bq_sections_enable(int on);
void bq_sections_reset(void);
double bq_section_start(void); /* 0 while sections are off or inside a parallel region */
void bq_section_end(BqSection s, double t0);
double bq_section_seconds(BqSection s);
int64_t bq_section_calls(BqSection s);
const char *bq_section_name(BqSection s);
/* Peak resident set size of this process in bytes (0 if unknown). */
size_t bq_peak_rss(void);

/* Atomic file replacement: writes go to "<path>.tmp", then bq_rename_durable fsyncs and renames it
 * over path (and fsyncs the directory). Used for every checkpoint and export. */
int bq_fsync_path(const char *path);
int bq_rename_durable(const char *tmp_path, const char *final_path);
/* Puts the complete folder `tmp` (its files already fsynced) in the place of the folder `dir`, both in
 * the same parent folder, and fsyncs the parent. Where dir exists, the two are swapped in one atomic
 * step (renameat2 RENAME_EXCHANGE), so that dir is whole, old or new, at every instant (a process
 * killed at any point leaves one of the two), and the old contents are left at tmp. On a filesystem
 * that cannot swap, dir is moved to `old` first (and moved back if tmp cannot take its place), which
 * leaves an instant without dir. *leftover receives the folder now holding the old contents (tmp or
 * old) for the caller to remove, or NULL when dir did not exist. Errors (BQ_EIO) name the folder and the
 * reason; dir is then as it was. A parent that cannot be fsynced after the swap is not an error. */
int bq_replace_dir(const char *tmp, const char *dir, const char *old, const char **leftover);
/* Checks, before any work is done, that the folder that will hold path exists, is a folder and is
 * writable, so a command fails in its first second rather than after loading or training. The error
 * names path and the reason (e.g. "out/x.onnx: cannot create: Not a directory"). */
int bq_check_writable_parent(const char *path);
/* mkdir -p: creates dir and its missing parents; the error names the first folder that failed. */
int bq_mkdir_p(const char *dir);
/* 1 when path exists and is a folder (bq_is_dir) or a regular file (bq_is_file), following links. */
int bq_is_dir(const char *path);
int bq_is_file(const char *path);
/* Copies the bytes of `from` into a new file `to` and fsyncs it; errors name the file. */
int bq_copy_file(const char *from, const char *to);
/* Closes f, a stream opened for writing path: BQ_OK only when every write reached the file (no error
 * recorded on the stream, and the final flush and the close succeed), else BQ_EIO "<path>: write
 * failed: <reason>". A stream that failed a flush earlier has dropped that data, so fclose alone can
 * succeed on a file with a hole in it. f is closed in both cases. */
int bq_fclose_written(FILE *f, const char *path);

/* Output locks. A command that writes an output (a checkpoint folder, an ONNX file, a pipeline run
 * folder, a predictions file) holds an exclusive flock(2) on the file "<output>.lock" next to it from
 * the moment its flags are parsed until it returns, so a second process naming the same output
 * refuses at once instead of interleaving its writes with the first's. The lock file holds
 * "<pid> <command>" of the holder for the refusal message. The kernel drops a flock when its holder
 * dies, so the lock file a killed process leaves behind blocks nobody; a normal release removes it.
 * The descriptors are close-on-exec: a child process never holds its parent's locks. The held locks
 * form a stack per process.
 * bq_out_lock takes the lock of `out` (trailing slashes ignored) for the command `cmd`; `flag`
 * ("--out") names the output in messages. mkdir_parents: the command creates the output's missing
 * parent folders (finetune, pipeline), so they are created here; otherwise a missing parent folder is
 * the error, as it would be for the output. Errors (BQ_EIO): another process holds the lock ("--out ft:
 * in use by another bertqat process (pid 4242, finetune), which holds ft.lock; wait for it to finish or
 * choose another output"), or the lock file cannot be created or locked (the message names it and the
 * reason). */
int bq_out_lock(const char *out, const char *flag, const char *cmd, int mkdir_parents);
/* The number of locks held now; bq_out_unlock_to releases, newest first, every lock taken after that
 * mark was read (0: all of them). */
int bq_out_lock_mark(void);
void bq_out_unlock_to(int mark);

#endif
