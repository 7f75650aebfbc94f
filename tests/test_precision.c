/* --precision resolution (autograd/core.c bq_precision_resolve) for every kind of CPU, by passing feature
 * sets: a CPU without AVX512-BF16 and AMX-BF16 (auto → fp32, bf16 refused naming the missing ISAs and
 * the ones found), CPUs with AVX512-BF16 or AMX-BF16 (this build has no bf16 GEMMs, so auto → fp32 and
 * bf16 refused as not implemented), and a word that is no precision. Then the same on this CPU's own
 * features, printing which of those paths it took, and the --version line. */
#include <stdio.h>
#include <string.h>

#include "autograd/bq.h"
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
    } else {
        EXPECT(strstr(bq_errmsg(), want_msg) != NULL, "message '%s' lacks '%s'", bq_errmsg(), want_msg);
        EXPECT(strncmp(bq_errmsg(), "--precision", 11) == 0 && !strchr(bq_errmsg(), '\n'),
               "one line naming the flag: '%s'", bq_errmsg());
        printf("  %-5s -> error: %s\n", value, bq_errmsg());
    }
}

int main(void) {
    const BqCpuFeatures zen3 = {.avx2 = 1, .fma = 1};
    const BqCpuFeatures zen4 = {.avx2 = 1, .fma = 1, .avx512f = 1, .avx512_bf16 = 1};
    const BqCpuFeatures spr = {.avx2 = 1, .fma = 1, .avx512f = 1, .avx512_bf16 = 1, .amx_bf16 = 1};
    const BqCpuFeatures bare = {0};
    EXPECT(BQ_BF16_GEMMS == 0, "this test is written for a build without bf16 GEMMs");

    printf("CPU without bf16 (AVX2, FMA):\n");
    check("auto", &zen3, BQ_OK, BQ_PRECISION_FP32, NULL);
    check(NULL, &zen3, BQ_OK, BQ_PRECISION_FP32, NULL);
    check("fp32", &zen3, BQ_OK, BQ_PRECISION_FP32, NULL);
    check("bf16", &zen3, BQ_EINVAL, 0,
          "--precision bf16: this CPU has neither AVX512-BF16 nor AMX-BF16 (found AVX2, FMA)");
    check("bf16", &bare, BQ_EINVAL, 0, "neither AVX512-BF16 nor AMX-BF16 (found no AVX2)");
    check("fp16", &zen3, BQ_EINVAL, 0, "--precision: 'fp16' is not fp32, bf16 or auto");
    printf("CPU with AVX512-BF16 (no bf16 GEMMs in this build):\n");
    check("auto", &zen4, BQ_OK, BQ_PRECISION_FP32, NULL);
    check("bf16", &zen4, BQ_EINVAL, 0, "bf16 training is not implemented yet in this build (the CPU has AVX2, FMA, "
          "AVX-512F, AVX512-BF16)");
    printf("CPU with AMX-BF16:\n");
    check("auto", &spr, BQ_OK, BQ_PRECISION_FP32, NULL);
    check("bf16", &spr, BQ_EINVAL, 0, "bf16 training is not implemented yet in this build");

    const BqCpuFeatures *me = bq_cpu_features();
    int has = me->avx512_bf16 || me->amx_bf16;
    printf("this CPU: avx2 %d fma %d avx512f %d avx512_bf16 %d amx_bf16 %d -> path exercised: %s\n", me->avx2, me->fma,
           me->avx512f, me->avx512_bf16, me->amx_bf16,
           has ? "bf16 CPU, bf16 refused as not implemented (no bf16 GEMMs in this build)"
               : "CPU without bf16, bf16 refused naming the missing ISA");
    check("auto", me, BQ_OK, BQ_PRECISION_FP32, NULL);
    check("bf16", me, BQ_EINVAL, 0, has ? "not implemented yet" : "neither AVX512-BF16 nor AMX-BF16");
    const char *line = bq_cpu_bf16_describe();
    printf("%s\n", line);
    EXPECT(strstr(line, "CPU bf16: AVX512-BF16 ") && strstr(line, "--precision auto runs fp32"), "'%s'", line);
    printf("%s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}
