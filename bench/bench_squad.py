"""SQuAD window encoding speed: bq (bench/bench_squad.c: bq_squad_load without cache) against Hugging Face's
fast BERT tokenizer called as run_qa.py's prepare_validation_features does (batches of 1000 questions as
datasets.map(batched=True) gives them, question lstrip, truncation="only_second", stride,
return_overflowing_tokens, return_offsets_mapping, padding="max_length", then the loop that keeps the
context offsets and the example id), on the same file, same run. JSON reading is timed apart on both
sides (json.load against jansson) and is not part of "encode". Both sides at --threads (HF:
RAYON_NUM_THREADS; 1 also sets TOKENIZERS_PARALLELISM=false). Best of --repeat, wall and CPU seconds.

usage: BQ_BUILD_DIR=build .venv/bin/python bench/bench_squad.py [--file dev-v1.1.json] [--threads 1]
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BQ_BUILD_DIR", os.path.join(ROOT, "build"))
DATA = os.environ.get("BERTQAT_DATA", os.path.join(ROOT, "..", "shared", "data"))
MODEL = os.path.join(ROOT, "data", "models", "all-MiniLM-L6-v2")


def prepare_validation_features(tok, questions, contexts, ids, max_len, stride):
    """run_qa.py's prepare_validation_features for one batch (pad_on_right)."""
    enc = tok([q.lstrip() for q in questions], contexts, truncation="only_second", max_length=max_len, stride=stride,
              return_overflowing_tokens=True, return_offsets_mapping=True, padding="max_length")
    sample_mapping = enc.pop("overflow_to_sample_mapping")
    enc["example_id"] = []
    for i in range(len(enc["input_ids"])):
        seq = enc.sequence_ids(i)
        enc["example_id"].append(ids[sample_mapping[i]])
        enc["offset_mapping"][i] = [(o if seq[k] == 1 else None) for k, o in enumerate(enc["offset_mapping"][i])]
    return enc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default="dev-v1.1.json")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    if args.threads == 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from transformers import AutoTokenizer

    path = os.path.join(DATA, "squad", args.file)
    tok = AutoTokenizer.from_pretrained(MODEL, use_fast=True)
    best_read = best_enc = best_cpu = best_read_cpu = 1e30
    nwin = 0
    for _ in range(args.repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        with open(path, encoding="utf-8") as f:
            dev = json.load(f)
        q, c, ids = [], [], []
        for art in dev["data"]:
            for para in art["paragraphs"]:
                for qa in para["qas"]:
                    q.append(qa["question"])
                    c.append(para["context"])
                    ids.append(qa["id"])
        t1, c1 = time.perf_counter(), time.process_time()
        nwin = 0
        for b in range(0, len(q), 1000):
            enc = prepare_validation_features(tok, q[b:b + 1000], c[b:b + 1000], ids[b:b + 1000], 384, 128)
            nwin += len(enc["input_ids"])
        t2, c2 = time.perf_counter(), time.process_time()
        best_read = min(best_read, t1 - t0)
        best_enc = min(best_enc, t2 - t1)
        best_cpu = min(best_cpu, c2 - c1)
        best_read_cpu = min(best_read_cpu, c1 - c0)
    print(f"HF fast tokenizer + prepare_validation_features: {len(q)} questions, {nwin} windows; threads "
          f"{args.threads}: read {best_read:.3f} s, encode {best_enc:.3f} s (wall, best of {args.repeat}); cpu: read "
          f"{best_read_cpu:.3f} s, encode {best_cpu:.3f} s; {len(q) / best_enc:.0f} questions/s encode (wall)")
    p = subprocess.run([os.path.join(BUILD, "bench_squad"), "--vocab", os.path.join(MODEL, "vocab.txt"), "--data", path,
                        "--threads", str(args.threads), "--repeat", str(args.repeat)], capture_output=True, text=True)
    if p.returncode:
        sys.exit(p.stderr)
    print("bq: " + p.stdout.strip().replace("\n", "\nbq: "))
    bq_enc = float(p.stdout.split("encode ")[1].split(" s")[0])
    bq_cpu = float(p.stdout.split("encode ")[2].split(" s")[0])
    print(f"encode speed ratio bq / HF: wall {best_enc / bq_enc:.1f}x, cpu {best_cpu / bq_cpu:.1f}x")


if __name__ == "__main__":
    main()
