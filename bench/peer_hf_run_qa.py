"""Accuracy-parity peer for SQuAD v1.1: fine-tunes a Hugging Face BERT checkpoint
with a new `qa_outputs` head (transformers' AutoModelForQuestionAnswering, PyTorch) on the recipe of
`bertqat finetune --task qa`, evaluates it on the dev questions `bertqat eval --samples N` scores, and
prints one JSON line (exact match, F1, windows, steps, timings, versions). Developer machines only
(needs torch and transformers); CI never runs it.

The windows and labels are those of transformers' examples/pytorch/question-answering/run_qa.py
(`prepare_train_features` / `prepare_validation_features`): the question left-stripped, the tokenizer
called with truncation="only_second", max_length, stride=doc_stride, return_overflowing_tokens and
return_offsets_mapping; a window is labelled with the tokens of the first answer's first and last
characters when the answer lies wholly in its context slice, otherwise at [CLS] (0, 0). No
--max-query-length: no SQuAD v1.1 question reaches 64 pieces (docs/squad.md §2), so the windows are
bertqat's too.

Same questions as bertqat: the first --train-samples training questions in file order (datasets/squad.h
`max_examples`, docs/qa.md §2) and the first --eval-samples dev questions (`bertqat eval --samples`).
Only the batch order, the dropout masks and the initial `qa_outputs` differ (each side draws them from
the same seed with its own generator).

The recipe is bertqat's, whose defaults are the Hugging Face Trainer's (src/train.h, src/cli/cmd_common.h):
torch.optim.AdamW (betas 0.9/0.999, eps 1e-8, weight decay --weight-decay on every parameter but biases
and LayerNorm weights), linear decay to 0 after ceil(warmup_ratio * steps) linear warmup steps, global
gradient-norm clipping at --max-grad-norm, the config's dropout, batches shuffled each epoch and padded
to their longest window (run_qa.py without --pad_to_max_length; the loss spans the padding, as in
both). The loop is written out instead of using transformers.Trainer, which needs `accelerate`; it does
what the Trainer does with these arguments.

Post-processing is run_qa.py's `postprocess_qa_predictions` for v1.1: per window the --n-best highest
start and end logits, pairs of context tokens with end >= start and at most --max-answer-len tokens,
score start + end, the best over the question's windows, its text cut from the context through the
offsets ("empty" when no pair counts). As in `bertqat eval` (docs/qa.md §2) a window's padding
positions are left out of the ranking. Scoring is the official evaluate-v1.1.py: lowercase, drop ASCII
punctuation, drop the articles a/an/the, collapse whitespace; exact match and token F1, maximum over
the reference answers, averaged over questions, x100.

  python bench/peer_hf_run_qa.py --model data/models/all-MiniLM-L6-v2 --train-samples 4000 \\
      --max-seq-len 256 --doc-stride 94 --batch-size 16 --lr 5e-5 --epochs 1 --seed 42 \\
      --eval-samples 1000 --threads 2        # the fp32 stage of `bertqat pipeline --task qa --budget small`
"""
import argparse
import json
import math
import os
import platform
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
from onnx_eval_qa import read_squad, score  # noqa: E402  (bertqat's reading and official v1.1 scoring)


def tokenize(tok, examples, max_len, stride):
    return tok([e[1].lstrip() for e in examples], [e[2] for e in examples], truncation="only_second",
               max_length=max_len, stride=stride, return_overflowing_tokens=True,
               return_offsets_mapping=True, padding=False)


def train_features(tok, examples, max_len, stride):
    """run_qa.py prepare_train_features: (ids, types, start, end) per window."""
    enc = tokenize(tok, examples, max_len, stride)
    out = []
    for i, offsets in enumerate(enc["offset_mapping"]):
        ids = enc["input_ids"][i]
        seq = enc.sequence_ids(i)
        ans = examples[enc["overflow_to_sample_mapping"][i]][3][0]
        s_char = ans["answer_start"]
        e_char = s_char + len(ans["text"])
        ts = 0
        while seq[ts] != 1:
            ts += 1
        te = len(ids) - 1
        while seq[te] != 1:
            te -= 1
        if not (offsets[ts][0] <= s_char and offsets[te][1] >= e_char):
            start = end = 0
        else:
            while ts < len(offsets) and offsets[ts][0] <= s_char:
                ts += 1
            start = ts - 1
            while offsets[te][1] >= e_char:
                te -= 1
            end = te + 1
        out.append((ids, enc["token_type_ids"][i], start, end))
    return out


def eval_features(tok, examples, max_len, stride):
    """run_qa.py prepare_validation_features: (example index, ids, types, offsets or None) per window."""
    enc = tokenize(tok, examples, max_len, stride)
    out = []
    for i, offsets in enumerate(enc["offset_mapping"]):
        seq = enc.sequence_ids(i)
        offs = [o if seq[k] == 1 else None for k, o in enumerate(offsets)]
        out.append((enc["overflow_to_sample_mapping"][i], enc["input_ids"][i], enc["token_type_ids"][i], offs))
    return out


def batch_tensors(torch, rows):
    """Pads a batch of (ids, types) to its longest window: input_ids, token_type_ids, attention_mask."""
    n = max(len(r[0]) for r in rows)
    ids = torch.zeros(len(rows), n, dtype=torch.long)
    types = torch.zeros(len(rows), n, dtype=torch.long)
    mask = torch.zeros(len(rows), n, dtype=torch.long)
    for b, (i, t) in enumerate(rows):
        ids[b, :len(i)] = torch.tensor(i)
        types[b, :len(t)] = torch.tensor(t)
        mask[b, :len(i)] = 1
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


def postprocess(np, examples, feats, start, end, n_best, max_len):
    best = [None] * len(examples)  # (score, char begin, char end)
    for w, (e, ids, _, offs) in enumerate(feats):
        sl, el = start[w][:len(ids)], end[w][:len(ids)]
        si = np.argsort(-sl, kind="stable")[:n_best]
        ei = np.argsort(-el, kind="stable")[:n_best]
        for i in si:
            if offs[i] is None:
                continue
            for j in ei:
                if offs[j] is None or j < i or j - i + 1 > max_len:
                    continue
                score = float(sl[i]) + float(el[j])
                if best[e] is None or score > best[e][0]:
                    best[e] = (score, offs[i][0], offs[j][1])
    return ["empty" if b is None else examples[e][2][b[1]:b[2]] for e, b in enumerate(best)]


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    data_dir = os.path.join(os.environ.get("BERTQAT_DATA", "../shared/data"), "squad")
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="data/models/all-MiniLM-L6-v2")
    ap.add_argument("--train", default=os.path.join(data_dir, "train-v1.1-rebuilt.json"))
    ap.add_argument("--dev", default=os.path.join(data_dir, "dev-v1.1.json"))
    ap.add_argument("--train-samples", type=int, default=0, help="first N training questions (0: all)")
    ap.add_argument("--eval-samples", type=int, default=0, help="first N dev questions (0: all)")
    ap.add_argument("--max-seq-len", type=int, default=384)
    ap.add_argument("--doc-stride", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--eval-batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--warmup-ratio", type=float, default=0.0)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--max-grad-norm", type=float, default=1.0)
    ap.add_argument("--n-best", type=int, default=20)
    ap.add_argument("--max-answer-len", type=int, default=30)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--log-every", type=int, default=20, help="print the loss every N steps to stderr")
    ap.add_argument("--predictions", help="write the official {id: answer} JSON here")
    args = ap.parse_args()

    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model, use_fast=True)
    train_ex = read_squad(args.train, args.train_samples)
    dev_ex = read_squad(args.dev, args.eval_samples)
    tf = train_features(tok, train_ex, args.max_seq_len, args.doc_stride)
    ef = eval_features(tok, dev_ex, args.max_seq_len, args.doc_stride)

    # As run_qa.py: the seed is set before the model is built, so it draws the new qa_outputs.
    transformers.set_seed(args.seed)
    model = AutoModelForQuestionAnswering.from_pretrained(args.model)
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    steps_per_epoch = math.ceil(len(tf) / args.batch_size)
    total = steps_per_epoch * args.epochs
    warmup = math.ceil(args.warmup_ratio * total)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: s / max(1, warmup) if s < warmup else max(0.0, (total - s) / max(1, total - warmup)))
    gen = torch.Generator().manual_seed(args.seed)
    print(f"{len(tf)} training windows from {len(train_ex)} questions, {total} steps; "
          f"{len(ef)} dev windows from {len(dev_ex)} questions", file=sys.stderr, flush=True)

    model.train()
    t0, c0 = time.time(), time.process_time()
    step = 0
    for _ in range(args.epochs):
        order = torch.randperm(len(tf), generator=gen).tolist()
        for b in range(0, len(order), args.batch_size):
            rows = [tf[i] for i in order[b:b + args.batch_size]]
            batch = batch_tensors(torch, [(r[0], r[1]) for r in rows])
            out = model(**batch, start_positions=torch.tensor([r[2] for r in rows]),
                        end_positions=torch.tensor([r[3] for r in rows]))
            out.loss.backward()
            gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step % args.log_every == 0 or step == total:
                print(f"step {step}/{total} loss {out.loss.item():.6f} grad_norm {gnorm.item():.6f} "
                      f"{time.time() - t0:.0f} s",
                      file=sys.stderr, flush=True)
    t_train, c_train = time.time() - t0, time.process_time() - c0

    model.eval()
    t0 = time.time()
    start = [None] * len(ef)
    end = [None] * len(ef)
    by_len = sorted(range(len(ef)), key=lambda w: len(ef[w][1]))
    with torch.no_grad():
        for b in range(0, len(by_len), args.eval_batch_size):
            idx = by_len[b:b + args.eval_batch_size]
            out = model(**batch_tensors(torch, [(ef[w][1], ef[w][2]) for w in idx]))
            for k, w in enumerate(idx):
                start[w] = out.start_logits[k].numpy()
                end[w] = out.end_logits[k].numpy()
    preds = postprocess(np, dev_ex, ef, start, end, args.n_best, args.max_answer_len)
    t_eval = time.time() - t0
    em, f1 = score(dev_ex, preds)
    if args.predictions:
        with open(args.predictions, "w", encoding="utf-8") as f:
            json.dump({e[0]: p for e, p in zip(dev_ex, preds)}, f, ensure_ascii=False)
    print(json.dumps({
        "peer": f"transformers {transformers.__version__} AutoModelForQuestionAnswering, torch {torch.__version__}",
        "exact_match": em, "f1": f1, "questions": len(dev_ex), "dev_windows": len(ef),
        "train_questions": len(train_ex), "train_windows": len(tf), "steps": total,
        "train_seconds": t_train, "train_cpu_seconds": c_train, "eval_seconds": t_eval,
        "max_seq_len": args.max_seq_len, "doc_stride": args.doc_stride, "batch_size": args.batch_size,
        "lr": args.lr, "epochs": args.epochs, "seed": args.seed, "threads": args.threads,
        "cpu": cpu_model()}))


if __name__ == "__main__":
    main()
