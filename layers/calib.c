/* Histogram calibrators (see calib.h). Reference: NVIDIA pytorch-quantization calib/histogram.py
 * (HistogramCalibrator.collect, _compute_amax_percentile/_mse/_entropy); TensorRT's entropy
 * calibration (Migacz, "8-bit Inference with TensorRT", 2017). All arithmetic in double so the NumPy
 * reference in tests/make_calib_fixture.py reproduces it to rounding. */
#include "layers/calib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"

void bq_hist_init(BqHistogram *h, int64_t nbins0, int with_bins) {
    memset(h, 0, sizeof *h);
    BQ_CHECK(nbins0 > 0);
    h->nbins0 = nbins0;
    h->with_bins = with_bins;
}

void bq_hist_free(BqHistogram *h) {
    free(h->count);
    memset(h, 0, sizeof *h);
}

void bq_hist_collect(BqHistogram *h, const float *x, int64_t n) {
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double a = fabs((double)x[i]);
        if (a > m) m = a;
    }
    if (m > h->maxv) h->maxv = m;
    if (!h->with_bins) return;
    if (h->nbins == 0) {
        if (m <= 0.0) { /* the range is unknown until a non-zero batch arrives */
            h->pending_zeros += n;
            return;
        }
        h->nbins = h->nbins0;
        h->width = m / (double)h->nbins0;
        h->count = bq_calloc((size_t)h->nbins, sizeof(double));
        h->count[0] += (double)h->pending_zeros;
        h->pending_zeros = 0;
    } else if (m > h->width * (double)h->nbins) {
        /* grow with bins of the same width until the new max is covered */
        int64_t nb = (int64_t)ceil(m / h->width);
        if (nb < h->nbins) nb = h->nbins;
        h->count = bq_realloc(h->count, (size_t)nb * sizeof(double));
        memset(h->count + h->nbins, 0, (size_t)(nb - h->nbins) * sizeof(double));
        h->nbins = nb;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t b = (int64_t)(fabs((double)x[i]) / h->width);
        if (b >= h->nbins) b = h->nbins - 1;
        h->count[b] += 1.0;
    }
}

double bq_calib_amax_percentile(const BqHistogram *h, double percentile) {
    if (h->nbins == 0) return 0.0;
    double total = 0.0;
    for (int64_t i = 0; i < h->nbins; i++) total += h->count[i];
    double target = percentile / 100.0, cdf = 0.0;
    int64_t idx = h->nbins;
    for (int64_t i = 0; i < h->nbins; i++) {
        cdf += h->count[i] / total;
        if (cdf >= target) {
            idx = i;
            break;
        }
    }
    return (double)idx * h->width;
}

double bq_calib_amax_mse(const BqHistogram *h, int64_t start_bin) {
    int64_t nb = h->nbins;
    if (nb == 0) return 0.0;
    if (start_bin >= nb) return (double)nb * h->width; /* no candidate centre: keep the full range */
    double best = INFINITY, best_amax = 0.0;
    for (int64_t i = start_bin; i < nb; i++) { /* every centre up to and including the last bin's */
        double amax = ((double)i * h->width + (double)(i + 1) * h->width) / 2.0;
        double scale = amax / 127.0, err = 0.0;
        for (int64_t j = 0; j < nb; j++) {
            if (h->count[j] == 0.0) continue; /* empty bins add nothing (keeps long grown tails cheap) */
            double c = ((double)j * h->width + (double)(j + 1) * h->width) / 2.0;
            double q = nearbyint(c / scale);
            if (q > 127.0) q = 127.0;
            if (q < -128.0) q = -128.0;
            double d = q * scale - c;
            err += d * d * h->count[j];
        }
        err /= (double)nb;
        if (err < best) {
            best = err;
            best_amax = amax;
        }
    }
    return best_amax;
}

double bq_calib_amax_entropy(const BqHistogram *h, int64_t start_bin, int nquant) {
    int64_t nb = h->nbins;
    if (nb == 0) return 0.0;
    BQ_CHECK(start_bin >= 1 && nquant > 0);
    if (start_bin > nb) return (double)nb * h->width;
    double *bins = bq_malloc((size_t)nb * sizeof(double));
    double *ref = bq_malloc((size_t)nb * sizeof(double));
    double *qd = bq_malloc((size_t)nb * sizeof(double));
    double *qsum = bq_malloc((size_t)nquant * sizeof(double));
    int64_t *qcnt = bq_malloc((size_t)nquant * sizeof(int64_t));
    memcpy(bins, h->count, (size_t)nb * sizeof(double));
    if (nb > 1) bins[0] = bins[1]; /* as pytorch-quantization: ignore the spike of exact zeros */
    /* suffix sums for the clipped tail */
    double *tail = bq_malloc((size_t)(nb + 1) * sizeof(double));
    tail[nb] = 0.0;
    for (int64_t j = nb - 1; j >= 0; j--) tail[j] = tail[j + 1] + bins[j];
    double best = INFINITY;
    int64_t best_i = nb;
    for (int64_t i = start_bin; i <= nb; i++) {
        for (int k = 0; k < nquant; k++) {
            qsum[k] = 0.0;
            qcnt[k] = 0;
        }
        /* source bin j (< i) belongs to quantized bin floor(j·nquant / i) (np.digitize on
         * linspace(0, i, nquant+1), exact since nquant is a power of two) */
        for (int64_t j = 0; j < i; j++) {
            if (bins[j] == 0.0) continue;
            int64_t k = (j * nquant) / i;
            qsum[k] += bins[j];
            qcnt[k]++;
        }
        double qtot = 0.0, rtot = 0.0;
        for (int64_t j = 0; j < i; j++) {
            qd[j] = 0.0;
            if (bins[j] != 0.0) {
                int64_t k = (j * nquant) / i;
                qd[j] = qsum[k] / (double)qcnt[k];
            }
            qtot += qd[j];
            ref[j] = bins[j];
        }
        ref[i - 1] += tail[i];
        for (int64_t j = 0; j < i; j++) rtot += ref[j];
        double kl = 0.0;
        if (qtot == 0.0 || rtot == 0.0) {
            kl = INFINITY;
        } else {
            for (int64_t j = 0; j < i; j++) {
                double p = ref[j] / rtot, q = qd[j] / qtot;
                if (p > 0.0) {
                    if (q <= 0.0) {
                        kl = INFINITY;
                        break;
                    }
                    kl += p * log(p / q);
                }
            }
        }
        if (kl <= best) { /* <=: the last minimum */
            best = kl;
            best_i = i;
        }
    }
    free(bins);
    free(ref);
    free(qd);
    free(qsum);
    free(qcnt);
    free(tail);
    return (double)best_i * h->width;
}
