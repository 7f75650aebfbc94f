"""Training-speed benchmark: bertqat against PyTorch on the same model, batch and threads, in one
run (same process tree). For each model (all-MiniLM-L6-v2 and a random BERT-base-shaped model) it
times, in each precision of --precisions (default fp32 and bf16): bertqat's training step (forward,
backward, AdamW), its QAT step (ort scheme by default, live observers) and its evaluation forward
without a tape; PyTorch's fp32 training step, eager QAT step and inference (torch.no_grad()), and, where
the CPU has AVX512-BF16 or AMX-BF16, its bf16 autocast training step and bf16 autocast inference
(elsewhere those rows say why they are not run). It prints tokens/s, examples/s, peak RSS, the ratios
and their targets.

  python3 bench/bench_train.py --torch-python /path/to/venv-with-torch/bin/python [--threads 2] [--steps 5]
The peer Python is --torch-python, else $BQ_TORCH_PYTHON, else this interpreter. Each side runs as a
child process (bertqat: build/bench_train_step; PyTorch: bench/peer_train_torch.py); peak RSS is that
child's ru_maxrss. It prints the CPU, its ISA flags, the path of bertqat's bf16 GEMMs (oneDNN and the
implementation it picked, or emulated) and the BLAS each side uses (bertqat: the OpenBLAS kernel it
chose; PyTorch: torch.__config__ BLAS_INFO). Each row gives the median wall time and the median
process-CPU time of a step; the ratios are printed for both. On a machine shared with other jobs the
CPU-time ratios are the fairer ones at 1 thread (at more threads CPU time also counts the threads'
waits, so there the wall ratios on a quiet machine are the ones to quote)."""
import argparse
import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Targets (docs/results.md#training-on-zen-3): fp32 tokens/s vs PyTorch fp32, QAT step / training step
# (same precision), peak RSS vs PyTorch in the same precision, evaluation examples/s vs PyTorch inference in the same precision; bf16 tokens/s vs
# PyTorch bf16 autocast and bf16 step vs our fp32 step, per model (MiniLM, BERT-base).
TARGET_FP32, TARGET_RSS, TARGET_INFER = 1.3, 0.6, 1.5
TARGET_QAT = {"fp32": 1.1, "bf16": 1.0}
TARGET_BF16_VS_TORCH = {"all-MiniLM-L6-v2": 1.8, "BERT-base shape (random)": 1.4}
TARGET_BF16_VS_FP32 = {"all-MiniLM-L6-v2": 1.8, "BERT-base shape (random)": 1.9}
TARGET_BF16_RSS = {"all-MiniLM-L6-v2": 0.5, "BERT-base shape (random)": 0.6}


def run(cmd, env=None):
    print("running:", " ".join(os.path.basename(c) if i < 2 else c for i, c in enumerate(cmd)), file=sys.stderr, flush=True)
    pid = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    out, err = pid.communicate()
    if pid.returncode != 0:
        sys.exit(f"benchmark child failed ({' '.join(cmd)}):\n{err[-2000:]}")
    lines = [l for l in out.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]), err


def cpu_info():
    """(model name, the ISA flags that matter here) from /proc/cpuinfo."""
    name, flags = None, []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and name is None:
                    name = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = line.split(":", 1)[1].split()
                    break
    except OSError:
        pass
    name = name or platform.processor() or "unknown CPU"
    wanted = ["avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8"]
    return name, [f for f in wanted if f in flags]


def verdict(ok):
    return "met" if ok else "NOT met"


def row(label, r, unit="tokens_per_s"):
    print(f"{label:40s} {r[unit]:10.1f} {r['ms_per_step']:10.1f} {r['cpu_ms_per_step']:12.1f} "
          f"{r['peak_rss_mib']:13.0f}")


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
    ap.add_argument("--precisions", default="fp32,bf16", help="bertqat's precisions to time: fp32, bf16 or both")
    ap.add_argument("--scheme", default="ort", help="bertqat's QAT scheme: ort, qdqbert or cpu")
    ap.add_argument("--skip-base", action="store_true", help="only all-MiniLM-L6-v2")
    ap.add_argument("--skip-minilm", action="store_true", help="only the BERT-base shape")
    ap.add_argument("--skip-torch-qat", action="store_true", help="no PyTorch eager QAT row (it is the slowest)")
    args = ap.parse_args()
    precs = [p for p in args.precisions.split(",") if p]
    if not precs or any(p not in ("fp32", "bf16") for p in precs):
        sys.exit(f"--precisions: '{args.precisions}' is not a list of fp32 and bf16")
    ours = os.path.join(args.build, "bench_train_step")
    peer = [args.torch_python, os.path.join(ROOT, "bench/peer_train_torch.py")]
    common = ["--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
              "--threads", str(args.threads)]
    cpu, isa = cpu_info()
    cpu_bf16 = "avx512_bf16" in isa or "amx_bf16" in isa
    print(f"CPU: {cpu}; ISA: {', '.join(isa) or 'none of avx2/fma/avx512'}")
    models = (([] if args.skip_minilm else [("all-MiniLM-L6-v2", args.minilm)]) +
              ([] if args.skip_base else [("BERT-base shape (random)", "")]))
    for name, path in models:
        mflag = ["--model", path] if path else []
        b = {}
        for p in precs:
            base = [ours] + mflag + common + ["--precision", p]
            b[p] = {"train": run(base)[0], "qat": run(base + ["--qat", "--scheme", args.scheme])[0],
                    "infer": run(base + ["--infer"])[0]}
        t_fp32, _ = run(peer + mflag + common)
        t_qat = None if args.skip_torch_qat else run(peer + mflag + common + ["--qat"])[0]
        t_inf, _ = run(peer + mflag + common + ["--infer"])
        t_bf16 = run(peer + mflag + common + ["--bf16"])[0] if cpu_bf16 else None
        t_bf16_inf = run(peer + mflag + common + ["--bf16", "--infer"])[0] if cpu_bf16 else None
        first = b[precs[0]]["train"]
        print(f"\n== {name}, batch {args.batch}, seq {args.seq}, {args.threads} threads")
        print(f"bertqat: {first.get('runtime', '')}; {first.get('cpu_bf16', '')}")
        if "bf16" in b:
            print(f"bertqat: {b['bf16']['train'].get('bf16_gemms', '')}")
        print(f"PyTorch: {t_fp32.get('blas', '')}")
        print(f"{'training step':40s} {'tokens/s':>10s} {'ms/step':>10s} {'CPU ms/step':>12s} {'peak RSS MiB':>13s}")
        for p in precs:
            row(f"bertqat {p}", b[p]["train"])
            row(f"bertqat {p} QAT ({args.scheme} scheme)", b[p]["qat"])
        row(t_fp32["peer"] + " fp32", t_fp32)
        if t_qat:
            row(t_qat["peer"], t_qat)
        no_bf16 = "not run: this CPU has neither AVX512-BF16 nor AMX-BF16 (PyTorch would emulate bf16 there)"
        if t_bf16:
            row(t_bf16["peer"], t_bf16)
        else:
            print(f"{'PyTorch bf16 autocast':40s} {no_bf16}")
        print(f"{'evaluation forward (no tape)':40s} {'ex/s':>10s} {'ms/batch':>10s} {'CPU ms/batch':>12s} "
              f"{'peak RSS MiB':>13s}")
        for p in precs:
            row(f"bertqat {p}", b[p]["infer"], "examples_per_s")
        row(t_inf["peer"] + " no_grad", t_inf, "examples_per_s")
        if t_bf16_inf:
            row(t_bf16_inf["peer"] + " no_grad", t_bf16_inf, "examples_per_s")
        else:
            print(f"{'PyTorch bf16 autocast no_grad':40s} {no_bf16}")

        if "fp32" in b:
            f = b["fp32"]
            r_fp32 = f["train"]["tokens_per_s"] / t_fp32["tokens_per_s"]
            c_fp32 = t_fp32["cpu_ms_per_step"] / f["train"]["cpu_ms_per_step"]
            r_rss = f["train"]["peak_rss_mib"] / t_fp32["peak_rss_mib"]
            r_inf = f["infer"]["examples_per_s"] / t_inf["examples_per_s"]
            c_inf = t_inf["cpu_ms_per_step"] / f["infer"]["cpu_ms_per_step"]
            print(f"ratio fp32 tokens/s, bertqat / PyTorch: {r_fp32:.2f}x wall, {c_fp32:.2f}x CPU time "
                  f"(target >= {TARGET_FP32}x: {verdict(r_fp32 >= TARGET_FP32)} by wall, "
                  f"{verdict(c_fp32 >= TARGET_FP32)} by CPU time)")
            if t_qat:
                print(f"ratio QAT tokens/s, bertqat fp32 / PyTorch eager QAT: "
                      f"{f['qat']['tokens_per_s'] / t_qat['tokens_per_s']:.2f}x")
            print(f"peak RSS, bertqat fp32 / PyTorch fp32: {r_rss:.2f}x (target <= {TARGET_RSS}x: "
                  f"{verdict(r_rss <= TARGET_RSS)})")
            print(f"evaluation examples/s, bertqat fp32 / PyTorch inference: {r_inf:.2f}x wall, {c_inf:.2f}x CPU "
                  f"time (target >= {TARGET_INFER}x: {verdict(r_inf >= TARGET_INFER)} by wall)")
        for p in precs:
            r_qat = b[p]["qat"]["ms_per_step"] / b[p]["train"]["ms_per_step"]
            print(f"bertqat {p} QAT step / {p} training step: {r_qat:.2f}x (target <= {TARGET_QAT[p]}x: "
                  f"{verdict(r_qat <= TARGET_QAT[p])})")
        if "bf16" in b:
            h = b["bf16"]
            emulated = "emulated" in h["train"].get("bf16_gemms", "")
            note = " (bf16 emulated on this CPU: the bf16 targets apply to CPUs with bf16 units)" if emulated else ""
            if "fp32" in b:
                r = h["train"]["tokens_per_s"] / b["fp32"]["train"]["tokens_per_s"]
                tgt = TARGET_BF16_VS_FP32.get(name, 1.8)
                print(f"bertqat bf16 step / fp32 step, tokens/s: {r:.2f}x (target >= {tgt}x: {verdict(r >= tgt)}){note}")
            if t_bf16:
                r = h["train"]["tokens_per_s"] / t_bf16["tokens_per_s"]
                tgt = TARGET_BF16_VS_TORCH.get(name, 1.4)
                print(f"ratio bf16 tokens/s, bertqat / PyTorch bf16 autocast: {r:.2f}x (target >= {tgt}x: "
                      f"{verdict(r >= tgt)})")
                r = h["train"]["peak_rss_mib"] / t_bf16["peak_rss_mib"]
                tgt = TARGET_BF16_RSS.get(name, 0.6)
                print(f"peak RSS, bertqat bf16 / PyTorch bf16 autocast: {r:.2f}x (target <= {tgt}x: {verdict(r <= tgt)})")
            if t_bf16_inf:
                r = h["infer"]["examples_per_s"] / t_bf16_inf["examples_per_s"]
                print(f"evaluation examples/s, bertqat bf16 / PyTorch bf16 autocast inference: {r:.2f}x "
                      f"(target >= {TARGET_INFER}x: {verdict(r >= TARGET_INFER)})")
            if not t_bf16:
                print(f"bf16 ratios against PyTorch: {no_bf16}")


if __name__ == "__main__":
    main()
