#!/usr/bin/env python3
"""Compare two SQuAD v1.1 prediction files question by question.

The files are the official {question id: answer text} JSON that `bertqat eval --predictions` and
`scripts/onnx_eval_qa.py --predictions` write for the same dev file. Each answer is scored against the
question's reference answers as the official v1.1 evaluation does (lower case, punctuation and the
articles a/an/the removed, whitespace collapsed; exact match, and F1 over the tokens; the maximum over the
references). Prints each side's exact match and F1 over the questions both files answer, the mean
per-question F1 difference B - A with its standard error, and how many answers are the same text.
Exits 1 when the files do not answer the same questions, or when --max-f1-diff is given and |mean F1
difference| exceeds it.

usage: compare_qa_predictions.py DEV.json A.json B.json [--max-f1-diff POINTS]
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from onnx_eval_qa import f1_score, normalize  # noqa: E402  (the official v1.1 scoring of the ONNX evaluation)


def score(pred, refs):
    """(exact match, F1) of one answer against its references, each the maximum over them."""
    em = max(float(normalize(pred) == normalize(r)) for r in refs)
    return em, max(f1_score(pred, r) for r in refs)


def references(dev_path):
    with open(dev_path) as f:
        dev = json.load(f)
    refs = {}
    for article in dev["data"]:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                refs[qa["id"]] = [a["text"] for a in qa["answers"]]
    return refs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dev", help="SQuAD v1.1 dev JSON (the references)")
    ap.add_argument("a", help="predictions JSON {id: answer}")
    ap.add_argument("b", help="predictions JSON {id: answer}")
    ap.add_argument("--max-f1-diff", type=float, help="fail when |mean F1 difference| exceeds this (points)")
    args = ap.parse_args()
    refs = references(args.dev)
    preds = []
    for path in (args.a, args.b):
        try:
            with open(path) as f:
                preds.append(json.load(f))
        except (OSError, ValueError) as e:
            sys.exit(f"compare_qa_predictions.py: {path}: {e}")
    a, b = preds
    if set(a) != set(b):
        sys.exit(f"compare_qa_predictions.py: {args.a} and {args.b} answer different questions "
                 f"({len(set(a) ^ set(b))} differ)")
    missing = [q for q in a if q not in refs]
    if missing:
        sys.exit(f"compare_qa_predictions.py: {len(missing)} answered questions are not in {args.dev} "
                 f"(first: {missing[0]})")
    ids = sorted(a)
    sa = [score(a[q], refs[q]) for q in ids]
    sb = [score(b[q], refs[q]) for q in ids]
    n = len(ids)
    d = [100.0 * (y[1] - x[1]) for x, y in zip(sa, sb)]
    mean = sum(d) / n
    var = sum((v - mean) ** 2 for v in d) / (n - 1) if n > 1 else 0.0
    same = sum(a[q] == b[q] for q in ids)
    print(f"questions {n}")
    print(f"A: exact match {100.0 * sum(x[0] for x in sa) / n:.2f}, F1 {100.0 * sum(x[1] for x in sa) / n:.2f}")
    print(f"B: exact match {100.0 * sum(x[0] for x in sb) / n:.2f}, F1 {100.0 * sum(x[1] for x in sb) / n:.2f}")
    print(f"F1 B - A: {mean:+.2f} (standard error {math.sqrt(var / n):.2f})")
    print(f"answers equal: {same} of {n} ({100.0 * same / n:.1f} %)")
    if args.max_f1_diff is not None and abs(mean) > args.max_f1_diff:
        print(f"FAIL: |F1 difference| {abs(mean):.2f} exceeds {args.max_f1_diff}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
