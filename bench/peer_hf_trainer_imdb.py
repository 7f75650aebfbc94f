"""Accuracy-parity peer: fine-tunes a Hugging Face BERT checkpoint on IMDB with the Hugging Face Trainer
(PyTorch) using the recipe of `bertqat finetune` / `bertqat pipeline`, evaluates on the test split and
prints one JSON line (accuracy, precision, recall, F1, timings). Developer machines only (needs torch,
transformers, accelerate); CI never runs it.

Same examples as bertqat (scripts/imdb_select.py reproduces its selection): the training reviews are
permuted with bertqat's seeded generator, the last ceil(val_fraction * n) are held out for validation
and the rest are trained on; the first --eval-samples (0: all) of the permuted test reviews are
evaluated. So bertqat and the peer train and evaluate on exactly the same reviews; only the batch
order and the dropout masks differ (each side shuffles with its own generator from the same seed).

  python bench/peer_hf_trainer_imdb.py --model data/models/all-MiniLM-L6-v2 \\
      --max-seq-len 128 --batch-size 32 --lr 5e-5 --epochs 1            # the full recipe
For a machine without the data or network (a GPU box): tokenize here with --encode-to imdb128.npz,
copy the .npz and the model there, and run with --encoded imdb128.npz."""
import argparse
import json
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
from imdb_select import read_imdb, select  # noqa: E402  (bertqat's exact example selection)


def encode(args):
    """Tokenizes the selected reviews with the model's fast tokenizer: {split: (ids int32, labels)}."""
    from transformers import BertTokenizerFast
    tok = BertTokenizerFast.from_pretrained(args.model)
    out = {}
    reviews = read_imdb(args.data)
    for name in ("train", "val", "test"):
        rows = select(reviews, name, args.seed, args.eval_samples, args.train_samples, args.val_fraction)
        enc = tok([r[0] for r in rows], truncation=True, max_length=args.max_seq_len, padding="max_length")
        out[name + "_ids"] = np.asarray(enc["input_ids"], dtype=np.int32)
        out[name + "_labels"] = np.asarray([r[1] for r in rows], dtype=np.int8)
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
    ap.add_argument("--evals-per-epoch", type=int, default=5,
                    help="validation evaluations per epoch, best model kept (bertqat pipeline's recipe); 0: final model")
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
    from transformers import BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments
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
    steps_per_epoch = math.ceil(len(data["train_labels"]) / args.batch_size)
    steps = steps_per_epoch * args.epochs
    kw = dict(save_strategy="no")
    callbacks = []
    if args.evals_per_epoch > 0 and len(data["val_labels"]):
        # bertqat's --evals-per-epoch K with --save-best: evaluate every ceil(steps per epoch / K) steps and at
        # the last step, keep the parameters of the best validation accuracy (HF load_best_model_at_end;
        # ties keep the earlier, as bertqat does)
        every = math.ceil(steps_per_epoch / args.evals_per_epoch)
        kw = dict(eval_strategy="steps", eval_steps=every, save_strategy="steps", save_steps=every,
                  load_best_model_at_end=True, metric_for_best_model="accuracy", greater_is_better=True,
                  save_total_limit=2)

        class EvalAtEnd(TrainerCallback):
            def on_step_end(self, a, state, control, **_):
                if state.global_step == state.max_steps:
                    control.should_evaluate = control.should_save = True

        callbacks.append(EvalAtEnd())
    targs = TrainingArguments(
        output_dir=args.out, num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=128, learning_rate=args.lr, warmup_ratio=args.warmup_ratio,
        weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm, seed=args.seed, logging_steps=100,
        report_to=[], use_cpu=not use_cuda, dataloader_num_workers=0, **kw)
    trainer = Trainer(model=model, args=targs, train_dataset=Split("train"),
                      eval_dataset=Split("val") if callbacks else None, callbacks=callbacks,
                      compute_metrics=lambda p: metrics(np.argmax(p.predictions, -1), p.label_ids))
    print(f"{steps:.0f} optimizer steps" + (f", evaluation every {kw['eval_steps']} steps and at the end, best kept"
                                           if callbacks else ", final model evaluated"), flush=True)
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
        "evals_per_epoch": args.evals_per_epoch, "best_step": trainer.state.best_global_step
        if hasattr(trainer.state, "best_global_step") else None, "best_val_accuracy": trainer.state.best_metric,
        "val": res.get("val"), "test": res.get("test"),
        "encode_seconds": round(t_encode, 1), "train_seconds": round(t_train, 1), "eval_seconds": round(t_eval, 1)}))


if __name__ == "__main__":
    main()
