/* The per-core peak of the instructions the integer engine's products run on, from register-only loops
 * of 12 independent accumulators (no loads, no dependency between iterations but each accumulator's own),
 * so a figure is the units' issue rate: `vpdpbusd` (u8·s8: each 32-bit lane adds 4 products, 8 integer
 * ops) on zmm (AVX512-VNNI) and ymm (AVX-VNNI), and `vfmadd231ps` (2 flops a lane) on zmm (AVX-512F) and
 * ymm (FMA). A kernel's rate against these says how near the units it runs: the engine's u8·s8 GEMMs
 * (bench_qgemm, one thread) and the `cpu` scheme's fp32 attention products (bench_passes). The loops run
 * on the calling thread only, so pin it (taskset -c 0); an instruction the CPU (or its OS) lacks is
 * skipped (bq_cpu_features).
 *
 * Usage: bench_peak [MILLIONS]   iterations of 12 instructions per measurement (default 100), best of 3. */
#include <stdio.h>
#include <stdlib.h>

#include "autograd/bq.h"

#if defined(__x86_64__) && defined(__GNUC__)
/* 12 copies of `op src1, src2, acc_i` on registers p0..p11, sources p12 and p13 (all zeroed first, so
 * the float loops never meet a denormal). */
#define PEAK_OPS(op, p)                                                                                       \
    op " %%" p "12, %%" p "13, %%" p "0\n\t" op " %%" p "12, %%" p "13, %%" p "1\n\t" op " %%" p "12, %%" p  \
       "13, %%" p "2\n\t" op " %%" p "12, %%" p "13, %%" p "3\n\t" op " %%" p "12, %%" p "13, %%" p "4\n\t" op \
       " %%" p "12, %%" p "13, %%" p "5\n\t" op " %%" p "12, %%" p "13, %%" p "6\n\t" op " %%" p "12, %%" p   \
       "13, %%" p "7\n\t" op " %%" p "12, %%" p "13, %%" p "8\n\t" op " %%" p "12, %%" p "13, %%" p "9\n\t" op \
       " %%" p "12, %%" p "13, %%" p "10\n\t" op " %%" p "12, %%" p "13, %%" p "11\n\t"
#define PEAK_ZERO(z, p)                                                                                      \
    z " %%" p "0, %%" p "0, %%" p "0\n\t" z " %%" p "1, %%" p "1, %%" p "1\n\t" z " %%" p "2, %%" p "2, %%" p \
      "2\n\t" z " %%" p "3, %%" p "3, %%" p "3\n\t" z " %%" p "4, %%" p "4, %%" p "4\n\t" z " %%" p "5, %%" p  \
      "5, %%" p "5\n\t" z " %%" p "6, %%" p "6, %%" p "6\n\t" z " %%" p "7, %%" p "7, %%" p "7\n\t" z " %%" p  \
      "8, %%" p "8, %%" p "8\n\t" z " %%" p "9, %%" p "9, %%" p "9\n\t" z " %%" p "10, %%" p "10, %%" p        \
      "10\n\t" z " %%" p "11, %%" p "11, %%" p "11\n\t" z " %%" p "12, %%" p "12, %%" p "12\n\t" z " %%" p    \
      "13, %%" p "13, %%" p "13\n\t"
#define PEAK_CLOBBERS                                                                                          \
    "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
        "xmm13", "cc"
#define PEAK_LOOP(name, isa, zero, op, p)                                          \
    __attribute__((target(isa), noinline)) static void name(long n) {              \
        __asm__ volatile(PEAK_ZERO(zero, p) "1:\n\t" PEAK_OPS(op, p) "dec %0\n\t"     \
                                                                    "jnz 1b\n\t"      \
                                                                    "vzeroupper\n\t"  \
                         : "+r"(n)                                                    \
                         :                                                            \
                         : PEAK_CLOBBERS);                                            \
    }

PEAK_LOOP(vnni_zmm, "avx512f,avx512vnni", "vpxord", "vpdpbusd", "zmm")
PEAK_LOOP(vnni_ymm, "avx2,avxvnni", "vpxor", "%{vex%} vpdpbusd", "ymm")
PEAK_LOOP(fma_zmm, "avx512f", "vpxord", "vfmadd231ps", "zmm")
PEAK_LOOP(fma_ymm, "avx2,fma", "vpxor", "vfmadd231ps", "ymm")

/* Instructions a second of the best of 3 runs of loop (n iterations of 12). */
static double best_rate(void (*loop)(long), long n) {
    double best = 0.0;
    for (int r = 0; r < 3; r++) {
        const double t0 = bq_now();
        loop(n);
        const double t = bq_now() - t0, rate = t > 0.0 ? 12.0 * (double)n / t : 0.0;
        if (rate > best) best = rate;
    }
    return best;
}
#endif

int main(int argc, char **argv) {
    long millions = 100;
    if (argc > 1) {
        char *end = NULL;
        millions = strtol(argv[1], &end, 10);
        if (!end || *end || millions < 1 || millions > 10000) {
            fprintf(stderr, "bench_peak: iterations '%s' is not an integer in [1, 10000] (millions)\n", argv[1]);
            return 2;
        }
    }
    char cpu[256];
    bq_cpu_model(cpu, sizeof cpu);
    printf("CPU: %s\none thread, %ld M iterations of 12 independent instructions, best of 3\n", cpu, millions);
#if defined(__x86_64__) && defined(__GNUC__)
    const BqCpuFeatures *f = bq_cpu_features();
    static const struct {
        const char *name, *unit;
        void (*loop)(long);
        double ops; /* operations an instruction counts */
    } rows[4] = {{"vpdpbusd zmm (AVX512-VNNI)", "GOP/s u8*s8", vnni_zmm, 128.0},
                 {"vpdpbusd ymm (AVX-VNNI)", "GOP/s u8*s8", vnni_ymm, 64.0},
                 {"vfmadd231ps zmm (AVX-512F)", "GFLOP/s fp32", fma_zmm, 32.0},
                 {"vfmadd231ps ymm (FMA)", "GFLOP/s fp32", fma_ymm, 16.0}};
    const int have[4] = {f->avx512f && f->avx512_vnni, f->avx2 && f->avx_vnni, f->avx512f, f->avx2 && f->fma};
    for (int i = 0; i < 4; i++) {
        if (!have[i]) {
            printf("%-28s not on this CPU\n", rows[i].name);
            continue;
        }
        const double r = best_rate(rows[i].loop, millions * 1000000L);
        printf("%-28s %6.2f G/s  %7.0f %s\n", rows[i].name, r * 1e-9, r * rows[i].ops * 1e-9, rows[i].unit);
    }
#else
    printf("bench_peak: x86-64 only\n");
#endif
    return 0;
}
