"""Training-speed benchmark: bertqat against PyTorch on the same model, batch and threads, in one
run (same process tree). For each model (all-MiniLM-L6-v2 and a random BERT-base-shaped model) it
times fp32 training steps (forward, backward, AdamW) of both, the QAT step of bertqat (ort scheme,
live observers) and of PyTorch eager QAT, and prints tokens/s, peak RSS and the ratios.

  BQ_TORCH_PYTHON=/path/to/venv-with-torch/bin/python python3 bench/bench_train.py [--threads 2] [--steps 5]
Each side runs as a child process (bertqat: build/bench_train_step; PyTorch: bench/peer_train_torch.py);
peak RSS is that child's ru_maxrss. It prints the BLAS each side uses (bertqat: the OpenBLAS kernel it
chose; PyTorch: torch.__config__ BLAS_INFO)."""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env=None):
    pid = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    out, err = pid.communicate()
    if pid.returncode != 0:
        sys.exit(f"benchmark child failed ({' '.join(cmd)}):\n{err[-2000:]}")
    lines = [l for l in out.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]), err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--build", default=os.environ.get("BQ_BUILD_DIR", os.path.join(ROOT, "build")))
    ap.add_argument("--minilm", default=os.environ.get("BQ_MODEL_DIR", os.path.join(ROOT, "data/models/all-MiniLM-L6-v2")))
    ap.add_argument("--torch-python", default=os.environ.get("BQ_TORCH_PYTHON", sys.executable),
                    help="a Python with torch and transformers (env BQ_TORCH_PYTHON; default: this one)")
    ap.add_argument("--skip-base", action="store_true", help="only all-MiniLM-L6-v2")
    args = ap.parse_args()
    ours = os.path.join(args.build, "bench_train_step")
    common = ["--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
              "--threads", str(args.threads)]
    models = [("all-MiniLM-L6-v2", args.minilm)] + ([] if args.skip_base else [("BERT-base shape (random)", "")])
    for name, path in models:
        mflag = ["--model", path] if path else []
        b_fp32, info = run([ours] + mflag + common)
        b_qat, _ = run([ours] + mflag + common + ["--qat"])
        t_fp32, _ = run([args.torch_python, os.path.join(ROOT, "bench/peer_train_torch.py")] + mflag + common)
        t_qat, _ = run([args.torch_python, os.path.join(ROOT, "bench/peer_train_torch.py")] + mflag + common + ["--qat"])
        print(f"\n== {name}, batch {args.batch}, seq {args.seq}, {args.threads} threads")
        print(f"bertqat: {b_fp32.get('runtime', '')}; PyTorch: {t_fp32.get('blas', '')}")
        print(f"{'':28s} {'tokens/s':>10s} {'ms/step':>10s} {'peak RSS MiB':>13s}")
        for label, r in (("bertqat fp32", b_fp32), ("bertqat QAT (ort scheme)", b_qat),
                         (t_fp32["peer"] + " fp32", t_fp32), (t_qat["peer"], t_qat)):
            print(f"{label:28s} {r['tokens_per_s']:10.0f} {r['ms_per_step']:10.1f} {r['peak_rss_mib']:13.0f}")
        print(f"ratio fp32 tokens/s, bertqat / PyTorch: {b_fp32['tokens_per_s'] / t_fp32['tokens_per_s']:.2f}x")
        print(f"ratio QAT tokens/s, bertqat / PyTorch eager QAT: {b_qat['tokens_per_s'] / t_qat['tokens_per_s']:.2f}x")
        print(f"bertqat QAT step / fp32 step: {b_qat['ms_per_step'] / b_fp32['ms_per_step']:.2f}x")
        print(f"peak RSS, bertqat / PyTorch (fp32): {b_fp32['peak_rss_mib'] / t_fp32['peak_rss_mib']:.2f}x")


if __name__ == "__main__":
    main()
