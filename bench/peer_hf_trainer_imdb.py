"""Accuracy-parity peer: fine-tunes a Hugging Face BERT checkpoint on IMDB with the Hugging Face Trainer
(PyTorch) using the recipe of `bertqat finetune` / `bertqat pipeline`, evaluates on the test split and
prints one JSON line (accuracy, precision, recall, F1, timings). Developer machines only (needs torch,
transformers, accelerate); CI never runs it.

Same examples as bertqat: the training reviews are permuted with bertqat's seeded generator
(splitmix64-seeded xoshiro256**, Fisher-Yates, as autograd/core.c and datasets/dataset.c do), the last
ceil(val_fraction * n) of them are held out for validation and the rest are trained on; the test
reviews are permuted the same way and the first --eval-samples (0: all) are evaluated. Reviews are
ordered by (label name, numeric id) before permuting, as bertqat's IMDB reader orders them. So bertqat
and the peer train and evaluate on exactly the same reviews; only the batch order and the dropout
masks differ (each side uses its own shuffling with the same seed).

  python bench/peer_hf_trainer_imdb.py --model data/models/all-MiniLM-L6-v2 \\
      --max-seq-len 128 --batch-size 32 --lr 5e-5 --epochs 1            # the full recipe
For a machine without the data or network (a GPU box): tokenize here with --encode-to imdb128.npz,
copy the .npz and the model there, and run with --encoded imdb128.npz."""
import argparse
import json
import math
import os
import re
import tarfile
import time

import numpy as np

NAME = re.compile(r"aclImdb/(train|test)/(pos|neg)/(\d+)_\d+\.txt$")
M64 = (1 << 64) - 1


class BqRng:
    """bertqat's bq_rng (autograd/core.c): xoshiro256** seeded by splitmix64."""

    def __init__(self, seed):
        x, self.s = seed & M64, []
        for _ in range(4):
            x = (x + 0x9E3779B97F4A7C15) & M64
            z = x
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
            self.s.append(z ^ (z >> 31))

    def u64(self):
        s = self.s
        rotl = lambda v, k: ((v << k) | (v >> (64 - k))) & M64
        r = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return r

    def below(self, n):
        limit = M64 - (M64 % n)
        while True:
            x = self.u64()
            if x < limit:
                return x % n


def permutation(n, seed):
    p, r = list(range(n)), BqRng(seed)
    for i in range(n - 1, 0, -1):
        j = r.below(i + 1)
        p[i], p[j] = p[j], p[i]
    return p


def read_imdb(path):
    splits = {"train": [], "test": []}
    with tarfile.open(path, "r:*") as tf:
        for m in tf:
            g = NAME.search(m.name)
            if not g or not m.isfile():
                continue
            text = tf.extractfile(m).read().decode("utf-8", errors="replace")
            splits[g.group(1)].append((g.group(2), int(g.group(3)), text, 1 if g.group(2) == "pos" else 0))
    for k in splits:
        splits[k].sort(key=lambda r: (r[0], r[1]))
    return splits


def select(args, splits):
    """bertqat's split recipe: (train rows, val rows, test rows)."""
    train, test = splits["train"], splits["test"]
    p = permutation(len(train), args.seed)
    if args.train_samples:
        p = p[: args.train_samples]
    nval = int(math.ceil(args.val_fraction * len(p) - 1e-9))
    tr = [train[i] for i in p[: len(p) - nval]]
    va = [train[i] for i in p[len(p) - nval:]]
    q = permutation(len(test), args.seed)
    if args.eval_samples:
        q = q[: args.eval_samples]
    te = [test[i] for i in q]
    return tr, va, te


def encode(args):
    """Tokenizes the selected reviews with the model's fast tokenizer: {split: (ids int32, labels)}."""
    from transformers import BertTokenizerFast
    tok = BertTokenizerFast.from_pretrained(args.model)
    out = {}
    for name, rows in zip(("train", "val", "test"), select(args, read_imdb(args.data))):
        enc = tok([r[2] for r in rows], truncation=True, max_length=args.max_seq_len, padding="max_length")
        out[name + "_ids"] = np.asarray(enc["input_ids"], dtype=np.int32)
        out[name + "_labels"] = np.asarray([r[3] for r in rows], dtype=np.int8)
    out["max_seq_len"] = np.int32(args.max_seq_len)
    return out


def metrics(pred, labels):
    tp = int(((pred == 1) & (labels == 1)).sum())
    fp = int(((pred == 1) & (labels == 0)).sum())
    fn = int(((pred == 0) & (labels == 1)).sum())
    prec = tp / (tp + fp) if tp + fp else 0.0
    rec = tp / (tp + fn) if tp + fn else 0.0
    return {"accuracy": float((pred == labels).mean()), "precision": prec, "recall": rec,
            "f1": 2 * prec * rec / (prec + rec) if prec + rec else 0.0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", default=os.path.join(os.environ.get("BERTQAT_DATA", "../shared/data"),
                                                   "imdb/aclImdb_train_test.tar.gz"))
    ap.add_argument("--max-seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--warmup-ratio", type=float, default=0.0)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--train-samples", type=int, default=0)
    ap.add_argument("--eval-samples", type=int, default=0)
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ap.add_argument("--encode-to", help="only tokenize the selection into this .npz and exit")
    ap.add_argument("--encoded", help="read the tokenized selection from this .npz (made by --encode-to)")
    ap.add_argument("--out", default="/tmp/peer_hf_trainer")
    args = ap.parse_args()

    if args.encode_to:
        np.savez_compressed(args.encode_to, **encode(args))
        print(json.dumps({"encoded": args.encode_to}))
        return
    import torch
    import transformers
    from transformers import BertForSequenceClassification, Trainer, TrainingArguments
    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 arithmetic, as bertqat
    torch.backends.cudnn.allow_tf32 = False
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    t0 = time.time()
    data = dict(np.load(args.encoded)) if args.encoded else encode(args)
    if int(data["max_seq_len"]) != args.max_seq_len:
        raise SystemExit(f"{args.encoded}: encoded at max_seq_len {int(data['max_seq_len'])}, not {args.max_seq_len}")
    t_encode = time.time() - t0

    class Split(torch.utils.data.Dataset):
        def __init__(self, name):
            self.ids = torch.from_numpy(data[name + "_ids"].astype(np.int64))
            self.labels = torch.from_numpy(data[name + "_labels"].astype(np.int64))

        def __len__(self):
            return len(self.labels)

        def __getitem__(self, i):
            ids = self.ids[i]
            return {"input_ids": ids, "attention_mask": (ids != 0).long(),
                    "token_type_ids": torch.zeros_like(ids), "labels": self.labels[i]}

    model = BertForSequenceClassification.from_pretrained(args.model, num_labels=2)
    targs = TrainingArguments(
        output_dir=args.out, num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=128, learning_rate=args.lr, warmup_ratio=args.warmup_ratio,
        weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm, seed=args.seed, logging_steps=100,
        save_strategy="no", report_to=[], use_cpu=not use_cuda, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=targs, train_dataset=Split("train"))
    t0 = time.time()
    trainer.train()
    t_train = time.time() - t0
    t0 = time.time()
    res = {}
    for name in ("val", "test"):
        if len(data[name + "_labels"]):
            p = trainer.predict(Split(name))
            res[name] = metrics(np.argmax(p.predictions, -1), p.label_ids)
    t_eval = time.time() - t0
    print(json.dumps({
        "peer": f"transformers {transformers.__version__} Trainer, torch {torch.__version__}",
        "device": torch.cuda.get_device_name() if use_cuda else f"cpu, {args.threads} threads",
        "train_examples": int(len(data["train_labels"])), "val_examples": int(len(data["val_labels"])),
        "test_examples": int(len(data["test_labels"])), "max_seq_len": args.max_seq_len,
        "batch_size": args.batch_size, "lr": args.lr, "epochs": args.epochs, "seed": args.seed,
        "val": res.get("val"), "test": res.get("test"),
        "encode_seconds": round(t_encode, 1), "train_seconds": round(t_train, 1), "eval_seconds": round(t_eval, 1)}))


if __name__ == "__main__":
    main()
