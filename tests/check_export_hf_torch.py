#!/opt/torchenv/bin/python
"""Developer check (needs PyTorch + transformers, e.g. /opt/torchenv/bin/python; not run in CI):
`bertqat export-hf` output loads with transformers' BertForSequenceClassification.from_pretrained, and
its predictions equal `bertqat predict --json` on the native checkpoint (same label, probability within
--tol). Without --model, a native checkpoint is made first by fine-tuning the pretrained MiniLM for two
steps on a few made-up reviews, so the head is not the fresh initialisation.

  /opt/torchenv/bin/python tests/check_export_hf_torch.py [--model CKPT] [--bin build/bertqat]
Exit status 0 when every text agrees; prints the max probability and logit differences."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
from transformers import BertForSequenceClassification, BertTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = [
    "A wonderful, moving film with superb acting.",
    "Terrible plot, wooden dialogue and I fell asleep twice.",
    "It was fine. Nothing special, nothing awful.",
    "I loved the soundtrack but the ending made no sense at all!",
    "Worst movie of the year; avoid.",
    "An absolute masterpiece. " * 40,  # long: exercises truncation to 512 tokens
]


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return p


def make_checkpoint(binary, tmp):
    model = os.environ.get("BQ_MODEL_DIR", os.path.join(ROOT, "data", "models", "all-MiniLM-L6-v2"))
    data = os.path.join(tmp, "reviews.jsonl")
    with open(data, "w") as f:
        for i in range(64):
            lab = "pos" if i % 2 else "neg"
            f.write(json.dumps({"text": TEXTS[i % 5] + f" review {i}", "label": lab}) + "\n")
    out = os.path.join(tmp, "ckpt")
    run([binary, "finetune", "--model", model, "--data", data, "--out", out, "--max-steps", "2",
         "--batch-size", "8", "--max-seq-len", "64", "--lr", "1e-3", "--no-save-best"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", help="native checkpoint (default: make one from MiniLM)")
    ap.add_argument("--bin", default=os.path.join(os.environ.get("BQ_BUILD_DIR", os.path.join(ROOT, "build")),
                                                  "bertqat"))
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = a.model or make_checkpoint(a.bin, tmp)
        out = os.path.join(tmp, "hf")
        run([a.bin, "export-hf", "--model", ckpt, "--out", out])
        model = BertForSequenceClassification.from_pretrained(out).eval()
        tok = BertTokenizerFast(vocab_file=os.path.join(out, "vocab.txt"), do_lower_case=True)
        pred = run([a.bin, "predict", "--model", ckpt, "--json", "--threads", "1", *TEXTS])
        ours = [json.loads(l) for l in pred.stdout.splitlines() if l.strip()]
        assert len(ours) == len(TEXTS), pred.stdout
        bad, maxdp = 0, 0.0
        for text, o in zip(TEXTS, ours):
            enc = tok(text, truncation=True, max_length=512, return_tensors="pt")
            with torch.no_grad():
                logits = model(**enc).logits[0].double()
            p = torch.softmax(logits, -1).numpy()
            k = int(np.argmax(p))
            label = model.config.id2label[k]
            dp = abs(p[k] - o["probability"])
            maxdp = max(maxdp, dp)
            ok = k == o["label_id"] and label == o["label"] and dp <= a.tol
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} torch {label} {p[k]:.6f}  bertqat {o['label']} {o['probability']:.6f}"
                  f"  |dp| {dp:.2e}  {text[:40]!r}")
        print(f"check_export_hf_torch: {len(TEXTS) - bad}/{len(TEXTS)} agree, max |prob diff| {maxdp:.3e}")
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
