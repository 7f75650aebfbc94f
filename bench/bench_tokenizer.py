"""Tokenizer throughput: bq (bench_tokenizer, single thread) vs HF `tokenizers` on the 25,000 IMDB test
reviews, same run, same texts, untruncated with [CLS]/[SEP]. HF runs single-threaded
(TOKENIZERS_PARALLELISM=false, RAYON_NUM_THREADS=1) both as encode_batch and as encode in a loop.
Prints reviews/s of each and the ratios.

usage: BQ_BUILD_DIR=build .venv/bin/python bench/bench_tokenizer.py [--repeat 3] [--limit N]
"""
import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["RAYON_RS_NUM_CPUS"] = "1"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BQ_BUILD_DIR", os.path.join(ROOT, "build"))
DATA = os.environ.get("BERTQAT_DATA", os.path.join(ROOT, "..", "shared", "data"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--limit", type=int, default=0, help="use only the first N reviews (0: all)")
    args = ap.parse_args()
    import tokenizers

    vocab = os.path.join(DATA, "vocab", "bert-base-uncased", "vocab.txt")
    tokjson = os.path.join(DATA, "vocab", "bert-base-uncased", "tokenizer.json")
    texts = []
    with tarfile.open(os.path.join(DATA, "imdb", "aclImdb_train_test.tar.gz"), "r:gz") as tf:
        for m in tf:
            p = m.name.split("/")
            if m.isfile() and len(p) >= 3 and p[-3] == "test" and p[-2] in ("pos", "neg") and p[-1].endswith(".txt"):
                texts.append(tf.extractfile(m).read().replace(b"\0", b""))
    if args.limit:
        texts = texts[:args.limit]
    print(f"{len(texts)} IMDB test reviews, {sum(map(len, texts)) / 1e6:.1f} MB")

    with tempfile.TemporaryDirectory() as tmp:
        inp = os.path.join(tmp, "reviews.bin")
        with open(inp, "wb") as f:
            f.write(b"\0".join(texts))
        out = subprocess.run([os.path.join(BUILD, "bench_tokenizer"), "--vocab", vocab, "--input", inp,
                              "--repeat", str(args.repeat)], check=True, capture_output=True, text=True).stdout
    print(out.strip())
    bq_rate = float(out.split(" reviews/s")[0].split(",")[-1])
    bq_cpu_rate = float(out.split(" reviews/cpu-s")[0].split(",")[-1])

    strs = [t.decode("utf-8", "replace") for t in texts]
    tok = tokenizers.Tokenizer.from_file(tokjson)
    tok.no_truncation()
    best = {"batch": [1e30, 1e30], "loop": [1e30, 1e30]}  # wall, cpu
    for _ in range(args.repeat):
        for kind in ("batch", "loop"):
            t0, c0 = time.perf_counter(), time.process_time()
            if kind == "batch":
                tok.encode_batch(strs)
            else:
                for s in strs:
                    tok.encode(s)
            best[kind][0] = min(best[kind][0], time.perf_counter() - t0)
            best[kind][1] = min(best[kind][1], time.process_time() - c0)
    n = len(strs)
    for kind, label in (("batch", "hf encode_batch (1 thread)"), ("loop", "hf encode loop            ")):
        w, c = best[kind]
        print(f"{label}: best of {args.repeat}: {w:.3f} s wall, {n / w:.1f} reviews/s; {c:.3f} s cpu, "
              f"{n / c:.1f} reviews/cpu-s")
    for kind in ("batch", "loop"):
        w, c = best[kind]
        print(f"ratio bq / hf encode_{kind}: {bq_rate / (n / w):.2f}x wall, {bq_cpu_rate / (n / c):.2f}x cpu")
    return 0


if __name__ == "__main__":
    sys.exit(main())
