"""Accuracy-parity peer: fine-tunes a Hugging Face BERT checkpoint on IMDB with the Hugging Face
Trainer (PyTorch) using the same recipe flags as `bertqat finetune`, evaluates on the test split and
prints one JSON line with the accuracy. Developer machines only (needs torch, transformers,
accelerate); CI never runs it.

  /opt/torchenv/bin/python bench/peer_hf_trainer_imdb.py --model data/models/all-MiniLM-L6-v2 \
      --max-seq-len 256 --batch-size 32 --lr 5e-5 --epochs 1            # the full recipe
Subsets (--train-samples/--eval-samples) are drawn by a seeded shuffle of each split, so a reduced
run compares like for like in size, not in the exact reviews bertqat draws."""
import argparse
import io
import json
import os
import random
import re
import tarfile
import time

import numpy as np
import torch
from transformers import (BertForSequenceClassification, BertTokenizerFast, Trainer, TrainingArguments)

NAME = re.compile(r"aclImdb/(train|test)/(pos|neg)/(\d+)_\d+\.txt$")


def read_imdb(path):
    splits = {"train": [], "test": []}
    with tarfile.open(path, "r:gz") as tf:
        for m in tf:
            g = NAME.search(m.name)
            if not g or not m.isfile():
                continue
            text = tf.extractfile(m).read().decode("utf-8", errors="replace")
            splits[g.group(1)].append((g.group(2), int(g.group(3)), text, 1 if g.group(2) == "pos" else 0))
    for k in splits:
        splits[k].sort(key=lambda r: (r[0], r[1]))
    return splits


class Encoded(torch.utils.data.Dataset):
    def __init__(self, enc, labels):
        self.enc, self.labels = enc, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        item = {k: torch.tensor(v[i]) for k, v in self.enc.items()}
        item["labels"] = torch.tensor(self.labels[i])
        return item


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", default=os.path.join(os.environ.get("BERTQAT_DATA", "../shared/data"),
                                                   "imdb/aclImdb_train_test.tar.gz"))
    ap.add_argument("--max-seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--warmup-ratio", type=float, default=0.0)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--train-samples", type=int, default=0)
    ap.add_argument("--eval-samples", type=int, default=0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--out", default="/tmp/peer_hf_trainer")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    splits = read_imdb(args.data)
    rng = random.Random(args.seed)
    train, test = splits["train"], splits["test"]
    rng.shuffle(train)
    rng.shuffle(test)
    if args.train_samples:
        train = train[: args.train_samples]
    if args.eval_samples:
        test = test[: args.eval_samples]
    tok = BertTokenizerFast.from_pretrained(args.model)
    def encode(rows):
        enc = tok([r[2] for r in rows], truncation=True, max_length=args.max_seq_len, padding="max_length")
        return Encoded({k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids")}, [r[3] for r in rows])
    model = BertForSequenceClassification.from_pretrained(args.model, num_labels=2)
    targs = TrainingArguments(
        output_dir=args.out, num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=64, learning_rate=args.lr, warmup_ratio=args.warmup_ratio,
        weight_decay=args.weight_decay, seed=args.seed, logging_steps=50, save_strategy="no",
        report_to=[], use_cpu=True, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=targs, train_dataset=encode(train),
                      compute_metrics=lambda p: {"accuracy": float((np.argmax(p.predictions, -1) == p.label_ids).mean())})
    t0 = time.time()
    trainer.train()
    train_s = time.time() - t0
    metrics = trainer.evaluate(encode(test))
    print(json.dumps({"peer": "transformers Trainer", "train_samples": len(train), "eval_samples": len(test),
                      "max_seq_len": args.max_seq_len, "accuracy": metrics["eval_accuracy"],
                      "train_seconds": train_s}))


if __name__ == "__main__":
    main()
