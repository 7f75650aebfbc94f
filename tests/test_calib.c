/* Histogram calibrators (layers/calib.c) against the NumPy implementation of the same
 * pytorch-quantization math in tests/make_calib_fixture.py: max, percentile (99, 99.9, 99.99, 100),
 * MSE and entropy amax on four fixed activation sets, to 1e-6 relative. The MSE reference is written
 * from the definition, independently of the C code; in two sets ("zeros_then_gelu", "saturated") its
 * answer is the last bin's centre, so a search that stops one bin short fails here. Also checks the
 * histogram grew to the same number of bins. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "autograd/bq.h"
#include "layers/calib.h"

static double max_rel = 0.0;
static int failures = 0;

static void check(const char *cse, const char *what, double got, double want) {
    double rel = fabs(got - want) / fmax(fabs(want), 1e-12);
    if (rel > max_rel) max_rel = rel;
    if (!(rel <= 1e-6)) {
        printf("FAIL %s %s: got %.9g want %.9g (rel %.3g)\n", cse, what, got, want, rel);
        failures++;
    }
}

int main(void) {
    const char *dir = getenv("BQ_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/calib/expected.json", dir ? dir : ".");
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        printf("FAIL cannot read %s: %s\n", path, jerr.text);
        return 1;
    }
    snprintf(path, sizeof path, "%s/tests/fixtures/calib/data.bin", dir ? dir : ".");
    FILE *f = fopen(path, "rb");
    if (!f) {
        printf("FAIL cannot open %s\n", path);
        return 1;
    }
    int nbins0 = (int)json_integer_value(json_object_get(root, "nbins0"));
    json_t *cases = json_object_get(root, "cases");
    size_t ci;
    json_t *c;
    int ncases = 0;
    json_array_foreach(cases, ci, c) {
        const char *name = json_string_value(json_object_get(c, "name"));
        BqHistogram hist, hmax;
        bq_hist_init(&hist, nbins0, 1);
        bq_hist_init(&hmax, nbins0, 0);
        size_t bi;
        json_t *b;
        json_array_foreach(json_object_get(c, "batches"), bi, b) {
            int64_t n = json_integer_value(b);
            float *x = bq_malloc((size_t)n * sizeof(float));
            if (fread(x, sizeof(float), (size_t)n, f) != (size_t)n) {
                printf("FAIL %s: data.bin truncated\n", name);
                return 1;
            }
            bq_hist_collect(&hist, x, n);
            bq_hist_collect(&hmax, x, n);
            free(x);
        }
        int64_t nb = json_integer_value(json_object_get(c, "nbins"));
        if (hist.nbins != nb) {
            printf("FAIL %s: %lld bins, want %lld\n", name, (long long)hist.nbins, (long long)nb);
            failures++;
        }
        check(name, "max", hmax.maxv, json_real_value(json_object_get(c, "max")));
        const char *pk;
        json_t *pv;
        json_object_foreach(json_object_get(c, "percentile"), pk, pv) {
            char what[64];
            snprintf(what, sizeof what, "percentile %s", pk);
            check(name, what, bq_calib_amax_percentile(&hist, atof(pk)), json_real_value(pv));
        }
        check(name, "mse", bq_calib_amax_mse(&hist, 128), json_real_value(json_object_get(c, "mse")));
        check(name, "entropy", bq_calib_amax_entropy(&hist, 128, 128),
              json_real_value(json_object_get(c, "entropy")));
        bq_hist_free(&hist);
        bq_hist_free(&hmax);
        ncases++;
    }
    fclose(f);
    json_decref(root);
    printf("test_calib: %d cases, max relative error %.3g\n", ncases, max_rel);
    if (ncases != 4) {
        printf("FAIL %d cases, want 4\n", ncases);
        failures++;
    }
    return failures ? 1 : 0;
}
