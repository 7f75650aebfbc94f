"""Writes tests/fixtures/calib/: activation batches and the amax that a NumPy implementation of the
pytorch-quantization HistogramCalibrator math (calib/histogram.py: collect with equal-width bins grown
on demand, _compute_amax_percentile/_mse/_entropy) computes for them. tests/test_calib.c checks the C
calibrators (layers/calib.c) against these numbers to 1e-6 relative. The MSE reference (amax_mse) is
written from the definition as whole-array NumPy, independently of the C loop; the "saturated" case
puts the MSE optimum at the last bin's centre, which a search stopping one bin short misses.

Run: .venv/bin/python tests/make_calib_fixture.py   (numpy only)

Files: data.bin (float32 little-endian, all batches of all cases back to back) and expected.json
({"nbins0": 2048, "cases": [{"name", "batches": [n0, n1, ...], "max", "percentile": {p: amax},
"mse", "entropy"}]})."""
import json
import os

import numpy as np

NBINS0 = 2048
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "calib")


class Hist:
    """|x| histogram: width fixed by the first non-zero batch (max/2048), grown by equal-width bins."""

    def __init__(self):
        self.count = None
        self.width = None
        self.maxv = 0.0
        self.zeros = 0

    def collect(self, x):
        a = np.abs(x.astype(np.float64))
        m = float(a.max()) if a.size else 0.0
        self.maxv = max(self.maxv, m)
        if self.count is None:
            if m <= 0.0:
                self.zeros += a.size
                return
            self.width = m / NBINS0
            self.count = np.zeros(NBINS0, dtype=np.float64)
            self.count[0] += self.zeros
        elif m > self.width * len(self.count):
            nb = max(int(np.ceil(m / self.width)), len(self.count))
            self.count = np.concatenate([self.count, np.zeros(nb - len(self.count))])
        idx = np.minimum((a / self.width).astype(np.int64), len(self.count) - 1)
        self.count += np.bincount(idx, minlength=len(self.count)).astype(np.float64)

    def edges(self):
        return np.arange(len(self.count) + 1, dtype=np.float64) * self.width


def amax_percentile(h, p):
    cdf = np.cumsum(h.count / h.count.sum())
    idx = int(np.searchsorted(cdf, p / 100.0))  # first bin with cdf >= p
    return idx * h.width


def amax_mse(h, start=128):
    """MSE calibration from its definition (pytorch-quantization _compute_amax_mse): the candidate
    ranges are the centres of bins start..last, the last bin included; each candidate amax
    fake-quantizes every bin centre to int8 (scale amax/127, round half to even, clamp to
    [-128, 127]); the error of a candidate is the count-weighted squared error averaged over all
    bins; the answer is the candidate of least error (the first on ties, as np.argmin).
    Written as whole-array NumPy, candidates × bins, without reference to layers/calib.c."""
    nb = len(h.count)
    centres = (np.arange(nb, dtype=np.float64) + 0.5) * h.width
    cand = centres[start:]
    errs = []
    for lo in range(0, len(cand), 256):  # 256 candidates at a time keeps the matrix small
        amax = cand[lo:lo + 256, None]
        scale = amax / 127.0
        fq = np.clip(np.round(centres[None, :] / scale), -128, 127) * scale
        errs.append(np.mean((fq - centres[None, :]) ** 2 * h.count[None, :], axis=1))
    errs = np.concatenate(errs)
    return float(cand[int(np.argmin(errs))])


def amax_entropy(h, start=128, nq=128):
    bins = h.count.copy()
    bins[0] = bins[1]
    best, arg = np.inf, None
    for i in range(start, len(bins) + 1):
        k = (np.arange(i) * nq) // i  # np.digitize(range(i), linspace(0, i, nq+1)) - 1
        nz = bins[:i] != 0
        qsum = np.bincount(k[nz], weights=bins[:i][nz], minlength=nq)
        qcnt = np.bincount(k[nz], minlength=nq)
        qd = np.where(nz, qsum[k] / np.maximum(qcnt[k], 1), 0.0)
        ref = bins[:i].copy()
        ref[-1] += bins[i:].sum()
        p, q = ref / ref.sum(), qd / qd.sum()
        m = p > 0
        kl = np.inf if np.any(q[m] <= 0) else float(np.sum(p[m] * np.log(p[m] / q[m])))
        if kl <= best:  # last minimum
            best, arg = kl, i
    return arg * h.width


def main():
    rng = np.random.default_rng(1234)
    cases = []
    # normal activations; heavy-tailed (Laplace + outliers, range grows in later batches); a
    # mostly-zero batch first then GELU-like positive data
    cases.append(("normal", [rng.normal(0, 1.0, 4000) for _ in range(3)]))
    cases.append(("laplace_growing", [rng.laplace(0, 0.5, 4000) * s for s in (1.0, 1.6, 2.5)]))
    g = rng.normal(0, 2.0, (2, 4000))
    gelu_like = [np.concatenate([np.zeros(3000), rng.normal(0, 0.8, 1000)])] + [
        np.maximum(x, -0.17) for x in g]
    cases.append(("zeros_then_gelu", gelu_like))
    # saturated activations (a clipped tensor): a spike of |x| = max in the last bin, so clipping
    # below the last bin's centre costs more than rounding and the MSE range is that last centre
    cases.append(("saturated", [np.clip(rng.normal(0, 2.0, 4000), -3.0, 3.0) for _ in range(3)]))
    os.makedirs(OUT, exist_ok=True)
    blobs, meta = [], []
    for name, batches in cases:
        batches = [b.astype(np.float32) for b in batches]
        h = Hist()
        for b in batches:
            h.collect(b)
            blobs.append(b)
        meta.append({
            "name": name,
            "batches": [int(b.size) for b in batches],
            "nbins": int(len(h.count)),
            "max": h.maxv,
            "percentile": {str(p): amax_percentile(h, p) for p in (99.0, 99.9, 99.99, 100.0)},
            "mse": float(amax_mse(h)),
            "entropy": float(amax_entropy(h)),
        })
    np.concatenate(blobs).astype("<f4").tofile(os.path.join(OUT, "data.bin"))
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump({"nbins0": NBINS0, "cases": meta}, f, indent=1)
    for m in meta:
        print(m["name"], m["nbins"], "max", m["max"], "p99.99", m["percentile"]["99.99"], "mse", m["mse"],
              "entropy", m["entropy"])


if __name__ == "__main__":
    main()
