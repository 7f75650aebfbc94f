"""Evaluates an exported ONNX classifier (bertqat export) on the IMDB test split with ONNX Runtime CPU:
reads reviews from the aclImdb archive (or an extracted folder), tokenizes with HF `tokenizers`
(BertWordPieceTokenizer on the checkpoint's vocab.txt, lower-case, head truncation), pads each batch
to the longest sequence rounded up to a multiple of 16 (as ONNX Runtime's BERT example does), and
prints accuracy, F1 (positive class 1), and examples/s.

  .venv/bin/python scripts/onnx_eval.py --onnx model.onnx --vocab CKPT/vocab.txt \
      --data /work/shared/data/imdb/aclImdb_train_test.tar.gz [--samples 1000] [--max-seq-len 128]
"""
import argparse
import os
import random
import tarfile
import time

import numpy as np
import onnxruntime as ort
from tokenizers import BertWordPieceTokenizer


def read_imdb(path, split="test"):
    """[(text, label)] of one split; label 1 = pos."""
    out = []
    if os.path.isdir(path):
        for lab, name in ((0, "neg"), (1, "pos")):
            d = os.path.join(path, split, name)
            if not os.path.isdir(d):
                d = os.path.join(path, "aclImdb", split, name)
            for f in sorted(os.listdir(d)):
                with open(os.path.join(d, f), encoding="utf-8") as fh:
                    out.append((fh.read(), lab))
        return out
    with tarfile.open(path) as tf:
        for m in tf:
            if not m.isfile() or not m.name.endswith(".txt"):
                continue
            parts = m.name.split("/")
            if len(parts) < 3 or parts[-3] != split or parts[-2] not in ("pos", "neg"):
                continue
            out.append((tf.extractfile(m).read().decode("utf-8"), int(parts[-2] == "pos")))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--vocab", required=True, help="vocab.txt of the exported checkpoint")
    ap.add_argument("--data", required=True, help="aclImdb archive or folder")
    ap.add_argument("--split", default="test")
    ap.add_argument("--samples", type=int, default=0, help="random subset (0: all)")
    ap.add_argument("--max-seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    data = read_imdb(a.data, a.split)
    if not data:
        raise SystemExit(f"{a.data}: no {a.split} reviews found")
    if a.samples and a.samples < len(data):
        data = random.Random(a.seed).sample(data, a.samples)
    tok = BertWordPieceTokenizer(a.vocab, lowercase=True)
    tok.enable_truncation(a.max_seq_len)
    so = ort.SessionOptions()
    if a.threads:
        so.intra_op_num_threads = a.threads
    sess = ort.InferenceSession(a.onnx, so, providers=["CPUExecutionProvider"])
    inputs = {i.name: (np.int32 if i.type == "tensor(int32)" else np.int64) for i in sess.get_inputs()}
    preds, labels, secs = [], [], 0.0
    for s in range(0, len(data), a.batch_size):
        chunk = data[s:s + a.batch_size]
        enc = tok.encode_batch([t for t, _ in chunk])
        T = max(len(e.ids) for e in enc)
        T = min(((T + 15) // 16) * 16, max(a.max_seq_len, 16))
        ids = np.zeros((len(enc), T), np.int64)
        mask = np.zeros_like(ids)
        for r, e in enumerate(enc):
            n = min(len(e.ids), T)
            ids[r, :n] = e.ids[:n]
            mask[r, :n] = 1
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        feed = {k: v.astype(inputs[k]) for k, v in feed.items() if k in inputs}
        t = time.perf_counter()
        logits = sess.run(None, feed)[0]
        secs += time.perf_counter() - t
        preds.extend(logits.argmax(1).tolist())
        labels.extend(l for _, l in chunk)
    p, y = np.array(preds), np.array(labels)
    tp, fp, fn = int(((p == 1) & (y == 1)).sum()), int(((p == 1) & (y == 0)).sum()), int(((p == 0) & (y == 1)).sum())
    prec = tp / (tp + fp) if tp + fp else 0.0
    rec = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    print(f"examples {len(y)}  accuracy {(p == y).mean():.4f}  f1 {f1:.4f}  "
          f"examples/s {len(y) / secs:.1f} (ORT run time {secs:.2f}s)")


if __name__ == "__main__":
    main()
