/* Histogram calibrators for activation ranges: max, percentile, MSE and entropy (KL divergence).
 * The algorithms follow NVIDIA pytorch-quantization's HistogramCalibrator (calib/histogram.py):
 * a histogram of |x| with equal-width bins on [0, first batch max], grown with bins of the same width
 * when a later batch exceeds the range; amax candidates are bin edges (percentile, entropy) or bin
 * centres (MSE). tests/make_calib_fixture.py holds a NumPy implementation of the same math. */
#ifndef BQ_CALIB_H
#define BQ_CALIB_H

#include <stdint.h>

typedef struct BqHistogram {
    int64_t nbins;      /* current number of bins (0 until the first non-zero batch) */
    int64_t nbins0;     /* bins of the first batch (2048) */
    double width;       /* bin width, fixed by the first non-zero batch: max / nbins0 */
    double *count;      /* (nbins), bin i covers [i·width, (i+1)·width), the last bin is closed */
    int64_t pending_zeros; /* all-zero batches seen before the range was known (go to bin 0) */
    double maxv;        /* running max of |x| (the max calibrator needs only this) */
    int with_bins;      /* 0: track maxv only */
} BqHistogram;

void bq_hist_init(BqHistogram *h, int64_t nbins0, int with_bins);
void bq_hist_free(BqHistogram *h);
/* Adds |x[0..n)| to the histogram (and the running max). */
void bq_hist_collect(BqHistogram *h, const float *x, int64_t n);

/* amax = edge[idx], idx = first bin whose cumulative fraction >= percentile/100 (searchsorted). */
double bq_calib_amax_percentile(const BqHistogram *h, double percentile);
/* amax = centre c_i of bin i, for every i in [start_bin, nbins) (the last bin's centre included, as
 * pytorch-quantization's _compute_amax_mse searches), minimising mean_j count_j·(fq(c_j) − c_j)²
 * over all nbins bins, where fq quantizes to int8 with scale amax/127 (round half to even); the
 * first minimum. start_bin >= nbins leaves no candidate: the full range nbins·width is returned. */
double bq_calib_amax_mse(const BqHistogram *h, int64_t start_bin);
/* amax = edge[i], i in [start_bin, nbins], minimising KL(P‖Q) of the histogram clipped at i (tail
 * folded into the last bin) against its 128-level quantized version; the last minimum. */
double bq_calib_amax_entropy(const BqHistogram *h, int64_t start_bin, int nquant);

#endif
