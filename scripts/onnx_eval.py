"""Evaluates an exported ONNX classifier (`bertqat export`) on IMDB with ONNX Runtime CPU, on exactly the
reviews `bertqat eval` evaluates with the same --split/--samples/--seed (scripts/imdb_select.py), so the
two accuracies compare like for like. Tokenizes with Hugging Face `tokenizers` from the checkpoint's
tokenizer files (tokenizer.json when present, else vocab.txt with tokenizer_config.json's
do_lower_case), head truncation at --max-seq-len; batches of reviews sorted by length, each padded to
its longest review rounded up to a multiple of 16 (as ONNX Runtime's BERT QAT example pads). Prints
accuracy, precision, recall, F1 (positive class 1) and examples/s of the ORT runs (tokenization
excluded), or with --json one object with the keys of `bertqat eval --json`.

  .venv/bin/python scripts/onnx_eval.py --onnx model.onnx --tokenizer CKPT \\
      --data $BERTQAT_DATA/imdb/aclImdb_train_test.tar.gz [--samples 2000] [--max-seq-len 128] [--json]
"""
import argparse
import json
import os
import sys

import numpy as np
import onnxruntime as ort

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from imdb_select import read_imdb, select  # noqa: E402
from ort_common import load_tokenizer, run_batch  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--onnx", "--model", dest="onnx", required=True, help="the .onnx file")
    ap.add_argument("--tokenizer", help="checkpoint directory with the tokenizer files")
    ap.add_argument("--vocab", help="vocab.txt of the checkpoint (its directory is --tokenizer)")
    ap.add_argument("--data", required=True, help="aclImdb archive or folder")
    ap.add_argument("--split", default="test", choices=("test", "val", "train"))
    ap.add_argument("--samples", type=int, default=0, help="test reviews, as bertqat eval --samples (0: all)")
    ap.add_argument("--train-samples", type=int, default=0)
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--max-seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0: ORT's default)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--graph-opt", choices=("all", "extended", "basic", "none"), default="all",
                    help="ORT graph optimization level (none: the plain Q/DQ graph, every op as written)")
    ap.add_argument("--session-config", action="append", default=[], metavar="KEY=VALUE",
                    help="ORT session config entry, e.g. session.x64quantprecision=1 (repeatable)")
    ap.add_argument("--predictions", help="write index, label, predicted label, its probability per review (TSV, "
                    "as bertqat eval --predictions)")
    a = ap.parse_args()
    ckpt = a.tokenizer or (os.path.dirname(a.vocab) if a.vocab else None)
    if not ckpt:
        ap.error("--tokenizer (or --vocab) is required")
    for p in (a.onnx, a.data):
        if not os.path.exists(p):
            sys.exit(f"onnx_eval.py: {p}: no such file or directory")
    data = select(read_imdb(a.data), a.split, a.seed, a.samples if a.split == "test" else 0, a.train_samples,
                  a.val_fraction)
    if a.split == "test" and a.samples:
        data = data[:a.samples]
    if not data:
        sys.exit(f"onnx_eval.py: {a.data}: no {a.split} reviews found")
    tok = load_tokenizer(ckpt)
    tok.enable_truncation(a.max_seq_len)
    enc = tok.encode_batch([t for t, _ in data])
    order = sorted(range(len(data)), key=lambda i: len(enc[i].ids))
    so = ort.SessionOptions()
    if a.threads:
        so.intra_op_num_threads = a.threads
    so.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                   "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[a.graph_opt]
    for kv in a.session_config:
        if "=" not in kv:
            ap.error(f"--session-config {kv}: expected KEY=VALUE")
        k, v = kv.split("=", 1)
        so.add_session_config_entry(k, v)
    sess = ort.InferenceSession(a.onnx, so, providers=["CPUExecutionProvider"])
    pred = np.zeros(len(data), np.int64)
    prob = np.zeros(len(data), np.float64)
    labels = np.array([l for _, l in data])
    secs = 0.0
    for s in range(0, len(order), a.batch_size):
        idx = order[s:s + a.batch_size]
        (logits, *_), dt = run_batch(sess, [enc[i].ids for i in idx], multiple=16)
        secs += dt
        pred[idx] = logits.argmax(1)
        z = np.exp(logits - logits.max(1, keepdims=True))
        prob[idx] = z.max(1) / z.sum(1)
    tp, fp, fn = (int(((pred == 1) & (labels == 1)).sum()), int(((pred == 1) & (labels == 0)).sum()),
                  int(((pred == 0) & (labels == 1)).sum()))
    tn = len(labels) - tp - fp - fn
    prec = tp / (tp + fp) if tp + fp else 0.0
    rec = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    acc = float((pred == labels).mean())
    res = {"model": a.onnx, "data": a.data, "split": a.split, "examples": len(labels), "accuracy": acc,
           "precision": prec, "recall": rec, "f1": f1, "average": "binary (positive class 1)", "seconds": secs,
           "examples_per_s": len(labels) / secs, "max_seq_len": a.max_seq_len, "batch_size": a.batch_size,
           "threads": a.threads or None, "runtime": f"onnxruntime {ort.__version__} CPUExecutionProvider",
           "labels": ["neg", "pos"], "confusion_matrix": [[tn, fp], [fn, tp]]}
    if a.predictions:
        with open(a.predictions + ".tmp", "w") as f:
            for i in range(len(labels)):
                f.write(f"{i}\t{labels[i]}\t{pred[i]}\t{prob[i]:.6f}\n")
        os.replace(a.predictions + ".tmp", a.predictions)
    if a.json:
        print(json.dumps(res))
    else:
        print(f"examples {len(labels)}  accuracy {acc:.4f}  precision {prec:.4f}  recall {rec:.4f}  f1 {f1:.4f}  "
              f"examples/s {res['examples_per_s']:.1f} (ORT run time {secs:.2f}s)")


if __name__ == "__main__":
    main()
