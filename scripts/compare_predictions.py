#!/usr/bin/env python3
"""Compare two per-review prediction files review by review.

The files are the TSVs written by `bertqat eval --predictions` and `scripts/onnx_eval.py --predictions`
(index, true label, predicted label, probability of the predicted label), over the same reviews. Prints
how many predicted labels agree, each side's accuracy, and the spread of |p_A(pos) - p_B(pos)|; with
--list, the indices of the reviews whose labels differ. Exits 1 when the files do not list the same
reviews with the same true labels, when --min-agree is given and the agreement is below it, or when
--max-dp is given and some |p_A(pos) - p_B(pos)| is not below it, or when --max-median-dp is given and
the median of |p_A(pos) - p_B(pos)| is not below it (a systematic error, such as a wrong quantizer scale,
moves every review; rounding flips move a few).
"""
import argparse
import sys

import numpy as np


def load(path):
    rows = {}
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                parts = line.split()
                if len(parts) != 4:
                    sys.exit(f"compare_predictions.py: {path}:{n}: expected 4 tab-separated fields")
                i, y, pred, prob = int(parts[0]), int(parts[1]), int(parts[2]), float(parts[3])
                # probability of class 1, so both sides are compared on the same quantity
                rows[i] = (y, pred, prob if pred == 1 else 1.0 - prob)
    except OSError as e:
        sys.exit(f"compare_predictions.py: {path}: {e.strerror}")
    except ValueError:
        sys.exit(f"compare_predictions.py: {path}:{n}: not a number")
    if not rows:
        sys.exit(f"compare_predictions.py: {path}: no predictions")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="predictions TSV (e.g. bertqat eval --predictions)")
    ap.add_argument("b", help="predictions TSV (e.g. scripts/onnx_eval.py --predictions)")
    ap.add_argument("--list", action="store_true", help="print the indices of the reviews whose labels differ")
    ap.add_argument("--min-agree", type=float, default=None, metavar="PCT",
                    help="exit 1 unless at least PCT percent of the labels agree")
    ap.add_argument("--max-dp", type=float, default=None, metavar="X",
                    help="exit 1 unless every |p_A(pos) - p_B(pos)| is below X")
    ap.add_argument("--max-median-dp", type=float, default=None, metavar="X",
                    help="exit 1 unless the median of |p_A(pos) - p_B(pos)| is below X")
    a = ap.parse_args()
    A, B = load(a.a), load(a.b)
    if sorted(A) != sorted(B):
        sys.exit(f"compare_predictions.py: {a.a} and {a.b} list different reviews ({len(A)} vs {len(B)})")
    keys = np.array(sorted(A))
    y = np.array([A[k][0] for k in keys])
    if any(A[k][0] != B[k][0] for k in keys):
        sys.exit(f"compare_predictions.py: {a.a} and {a.b} disagree on true labels: not the same reviews")
    la, lb = np.array([A[k][1] for k in keys]), np.array([B[k][1] for k in keys])
    pa, pb = np.array([A[k][2] for k in keys]), np.array([B[k][2] for k in keys])
    d = np.abs(pa - pb)
    agree = 100.0 * float(np.mean(la == lb))
    print(f"reviews {len(keys)}  labels agree {agree:.2f}% ({int((la != lb).sum())} differ; A right on "
          f"{int(((la != lb) & (la == y)).sum())}, B on {int(((la != lb) & (lb == y)).sum())})  "
          f"accuracy A {np.mean(la == y):.4f} B {np.mean(lb == y):.4f}  |dp(pos)| median {np.median(d):.5f} "
          f"p99 {np.quantile(d, 0.99):.4f} max {d.max():.4f}")
    if a.list:
        print(" ".join(str(k) for k in keys[la != lb]))
    fails = []
    if a.min_agree is not None and agree < a.min_agree:
        fails.append(f"labels agree on {agree:.2f}% < {a.min_agree}%")
    if a.max_dp is not None and not d.max() < a.max_dp:
        fails.append(f"max |dp(pos)| {d.max():.3g} >= {a.max_dp}")
    if a.max_median_dp is not None and not np.median(d) < a.max_median_dp:
        fails.append(f"median |dp(pos)| {np.median(d):.3g} >= {a.max_median_dp}")
    if fails:
        print("FAIL: " + "; ".join(fails), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
