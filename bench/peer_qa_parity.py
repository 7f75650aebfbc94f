"""Deterministic training parity of `bertqat finetune --task qa` with PyTorch.

bench/peer_hf_run_qa.py compares whole fine-tunes, whose batch order, dropout masks and new `qa_outputs`
come from each side's own random generator, so their F1 differ by seed noise. This check takes the
randomness out: it builds one Hugging Face BertForQuestionAnswering directory (the pretrained encoder,
`qa_outputs` drawn by PyTorch from --seed, dropout set to 0 in config.json), trains it on both sides on
the first --train-samples SQuAD training questions with one batch holding every window (so the batch
order cannot differ) for --steps steps (one epoch each: AdamW, clipping at 1.0, linear decay), and
compares the loss and gradient norm of every step. Equal to a few units of fp32 rounding means the two
trainings are the same computation. Developer machines only (needs torch and transformers).

  python bench/peer_qa_parity.py --bertqat build/bertqat --model data/models/all-MiniLM-L6-v2 --work /tmp/qa-parity

Prints each step's values and the largest relative differences; exits 1 when a loss differs by more
than --tolerance (relative).
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys


def make_model(src, dst, seed):
    import transformers
    from transformers import AutoConfig, AutoModelForQuestionAnswering
    cfg = AutoConfig.from_pretrained(src)
    cfg.hidden_dropout_prob = 0.0
    cfg.attention_probs_dropout_prob = 0.0
    cfg.architectures = ["BertForQuestionAnswering"]
    transformers.set_seed(seed)
    model = AutoModelForQuestionAnswering.from_pretrained(src, config=cfg)
    model.save_pretrained(dst, safe_serialization=True)
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), dst)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--bertqat", default="build/bertqat")
    ap.add_argument("--model", default="data/models/all-MiniLM-L6-v2")
    ap.add_argument("--train", default=os.path.join(os.environ.get("BERTQAT_DATA", "../shared/data"), "squad",
                                                     "train-v1.1-rebuilt.json"))
    ap.add_argument("--work", required=True, help="scratch directory (replaced)")
    ap.add_argument("--train-samples", type=int, default=16)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--max-seq-len", type=int, default=256)
    ap.add_argument("--doc-stride", type=int, default=94)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    args = ap.parse_args()

    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    init = os.path.join(args.work, "init")
    make_model(args.model, init, args.seed)
    common = ["--train-samples", str(args.train_samples), "--max-seq-len", str(args.max_seq_len),
              "--doc-stride", str(args.doc_stride), "--batch-size", "4096", "--epochs", str(args.steps),
              "--lr", str(args.lr), "--seed", str(args.seed), "--threads", str(args.threads)]
    out = os.path.join(args.work, "bertqat")
    subprocess.run([args.bertqat, "finetune", "--task", "qa", "--model", init, "--data", args.train, "--out", out,
                    "--log-every", "1"] + common, stdout=subprocess.DEVNULL, check=True)
    ours = [json.loads(l) for l in open(os.path.join(out, "training_log.jsonl"), encoding="utf-8")]
    ours = [(r["loss"], r["grad_norm"]) for r in ours if r.get("type") == "train"]

    peer = subprocess.run([sys.executable, os.path.join(here, "peer_hf_run_qa.py"), "--model", init, "--train",
                           args.train, "--eval-samples", "1", "--log-every", "1"] + common, check=True, capture_output=True, text=True)
    theirs = [(float(m.group(1)), float(m.group(2)))
              for m in re.finditer(r"^step \d+/\d+ loss (\S+) grad_norm (\S+)", peer.stderr, re.M)]
    if len(ours) != args.steps or len(theirs) != args.steps:
        print(f"expected {args.steps} steps, got bertqat {len(ours)}, PyTorch {len(theirs)}", file=sys.stderr)
        return 1
    worst_loss = worst_norm = 0.0
    print("step  loss bertqat  loss PyTorch  grad norm bertqat  grad norm PyTorch")
    for s, ((lo, go), (lt, gt)) in enumerate(zip(ours, theirs), 1):
        print(f"{s:4d}  {lo:12.6f}  {lt:12.6f}  {go:17.5f}  {gt:17.5f}")
        worst_loss = max(worst_loss, abs(lo - lt) / abs(lt))
        worst_norm = max(worst_norm, abs(go - gt) / abs(gt))
    ok = worst_loss <= args.tolerance
    print(f"max relative difference: loss {worst_loss:.2e}, grad norm {worst_norm:.2e} "
          f"(tolerance on the loss {args.tolerance:g}): {'same training' if ok else 'DIFFERENT'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
