/* --precision resolution (autograd/core.c bq_precision_resolve) for every kind of CPU, by passing feature
 * sets: CPUs without AVX512-BF16 and AMX-BF16 (auto → fp32, bf16 runs emulated and says so), a CPU with
 * AVX512-BF16 only, one with AMX-BF16 only and one with both (auto → bf16, naming AMX-BF16 where the CPU
 * has it; bf16 on the units), and a word that is no precision. Then the same on this CPU's own features,
 * printing which of those paths it took and the bf16 GEMM path, and the --version line. */
#include <stdio.h>
#include <string.h>

#include "autograd/bq.h"
#include "autograd/gemm.h"
#include "tests/test_util.h"

static void check(const char *value, const BqCpuFeatures *f, int want_rc, BqPrecision want, const char *want_msg) {
    BqPrecision p = (BqPrecision)-1;
    const char *why = NULL;
    bq_err_clear();
    int rc = bq_precision_resolve(value, f, &p, &why);
    EXPECT(rc == want_rc, "%s: rc %d, want %d (%s)", value ? value : "NULL", rc, want_rc, bq_errmsg());
    if (rc == BQ_OK) {
        EXPECT(p == want, "%s resolves to %s", value ? value : "NULL", bq_precision_name(p));
        EXPECT(why && *why, "a reason is given");
        /* bq_cpu_bf16_describe prints an auto reason without its first 6 characters */
        EXPECT(!why || (value && strcmp(value, "auto")) || !strncmp(why, "auto: ", 6), "auto reason '%s'", why);
        EXPECT(!want_msg || (why && strstr(why, want_msg)), "%s: reason '%s' lacks '%s'", value ? value : "NULL",
               why ? why : "", want_msg ? want_msg : "");
        printf("  %-5s -> %s (%s)\n", value ? value : "NULL", bq_precision_name(p), why ? why : "");
    } else {
        EXPECT(strstr(bq_errmsg(), want_msg) != NULL, "message '%s' lacks '%s'", bq_errmsg(), want_msg);
        EXPECT(strncmp(bq_errmsg(), "--precision", 11) == 0 && !strchr(bq_errmsg(), '\n'),
               "one line naming the flag: '%s'", bq_errmsg());
        printf("  %-5s -> error: %s\n", value, bq_errmsg());
    }
}

int main(void) {
    /* Each kind of CPU: what auto gives and why, and how bf16 runs there. */
    static const struct {
        const char *kind;
        BqCpuFeatures f;
        BqPrecision want_auto;
        const char *auto_why, *bf16_why;
    } CPUS[] = {
        {"CPU without bf16 (AVX2, FMA)", {.avx2 = 1, .fma = 1}, BQ_PRECISION_FP32,
         "auto: the CPU has neither AVX512-BF16 nor AMX-BF16", "emulated, slower than fp32"},
        {"CPU without any of the features", {0}, BQ_PRECISION_FP32,
         "auto: the CPU has neither AVX512-BF16 nor AMX-BF16", "emulated, slower than fp32"},
        {"CPU with AVX512-BF16 only", {.avx2 = 1, .fma = 1, .avx512f = 1, .avx512_bf16 = 1}, BQ_PRECISION_BF16,
         "auto: the CPU has AVX512-BF16", "flag; the CPU has bf16 units"},
        {"CPU with AMX-BF16 only", {.avx2 = 1, .fma = 1, .avx512f = 1, .amx_bf16 = 1}, BQ_PRECISION_BF16,
         "auto: the CPU has AMX-BF16", "flag; the CPU has bf16 units"},
        {"CPU with AVX512-BF16 and AMX-BF16", {.avx2 = 1, .fma = 1, .avx512f = 1, .avx512_bf16 = 1, .amx_bf16 = 1},
         BQ_PRECISION_BF16, "auto: the CPU has AMX-BF16", "flag; the CPU has bf16 units"},
    };
    for (size_t c = 0; c < sizeof CPUS / sizeof CPUS[0]; c++) {
        const BqCpuFeatures *f = &CPUS[c].f;
        printf("%s:\n", CPUS[c].kind);
        check("auto", f, BQ_OK, CPUS[c].want_auto, CPUS[c].auto_why);
        check(NULL, f, BQ_OK, CPUS[c].want_auto, CPUS[c].auto_why);
        check("fp32", f, BQ_OK, BQ_PRECISION_FP32, "flag");
        check("bf16", f, BQ_OK, BQ_PRECISION_BF16, CPUS[c].bf16_why);
        check("fp16", f, BQ_EINVAL, 0, "--precision: 'fp16' is not fp32, bf16 or auto");
        check("", f, BQ_EINVAL, 0, "--precision: '' is not fp32, bf16 or auto");
    }

    const BqCpuFeatures *me = bq_cpu_features();
    int has = me->avx512_bf16 || me->amx_bf16;
    printf("this CPU: avx2 %d fma %d avx512f %d avx512_bf16 %d amx_bf16 %d -> path exercised: %s\n", me->avx2, me->fma,
           me->avx512f, me->avx512_bf16, me->amx_bf16,
           has ? "bf16 CPU, bf16 on the units" : "CPU without bf16, bf16 emulated");
    check("auto", me, BQ_OK, has ? BQ_PRECISION_BF16 : BQ_PRECISION_FP32, NULL);
    check("bf16", me, BQ_OK, BQ_PRECISION_BF16, has ? "bf16 units" : "emulated");
    const char *g = bq_gemm_bf16_describe();
    printf("%s\n", g);
    EXPECT(has ? strstr(g, "oneDNN") != NULL : strstr(g, "emulated") != NULL, "bf16 GEMM path: '%s'", g);
    EXPECT(bq_gemm_bf16_path() == (has ? BQ_BF16_ONEDNN : BQ_BF16_EMULATED), "bf16 path %d", (int)bq_gemm_bf16_path());
    EXPECT(has || bq_gemm_bf16_force(BQ_BF16_ONEDNN) == BQ_EINVAL, "oneDNN bf16 refused without bf16 units");
    const char *line = bq_cpu_bf16_describe();
    printf("%s\n", line);
    const char *want_line = has ? "--precision auto runs bf16 (the CPU has "
                                : "--precision auto runs fp32 (the CPU has neither AVX512-BF16 nor AMX-BF16)";
    EXPECT(strstr(line, "CPU bf16: AVX512-BF16 ") && strstr(line, want_line), "'%s' lacks '%s'", line, want_line);
    printf("%s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}
