"""Training-speed benchmark: bertqat against PyTorch on the same model, batch and threads, in one
run (same process tree). For each model (all-MiniLM-L6-v2 and a random BERT-base-shaped model) it
times training steps (forward, backward, AdamW) of both in fp32, the QAT step of bertqat (ort scheme
by default, live observers) and of PyTorch eager QAT, PyTorch's bf16 autocast step where the CPU has
AVX512-BF16 or AMX-BF16 (elsewhere the row says why it is not applicable), and the evaluation forward
without a tape / autograd (examples/s); prints tokens/s, peak RSS, the ratios and the issue's targets.

  python3 bench/bench_train.py --torch-python /path/to/venv-with-torch/bin/python [--threads 2] [--steps 5]
The peer Python is --torch-python, else $BQ_TORCH_PYTHON, else this interpreter. Each side runs as a
child process (bertqat: build/bench_train_step; PyTorch: bench/peer_train_torch.py); peak RSS is that
child's ru_maxrss. It prints the CPU, its ISA flags, the precision bertqat resolved (--precision) and the
BLAS each side uses (bertqat: the OpenBLAS kernel it chose; PyTorch: torch.__config__ BLAS_INFO).
Each row gives the median wall time and the median process-CPU time of a step; the ratios are printed
for both. On a machine shared with other jobs the CPU-time ratios are the fairer ones at 1 thread (at
more threads CPU time also counts the threads' waits, so there the wall ratios on a quiet machine are
the ones to quote)."""
import argparse
import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The targets (docs/results.md): fp32 tokens/s vs PyTorch fp32, QAT step / fp32 step, peak RSS vs
# PyTorch fp32, evaluation examples/s vs PyTorch inference.
TARGET_FP32, TARGET_QAT, TARGET_RSS, TARGET_INFER = 1.3, 1.1, 0.6, 1.5


def run(cmd, env=None):
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
    ap.add_argument("--precision", default="auto", help="bertqat's --precision: fp32, bf16 or auto")
    ap.add_argument("--scheme", default="ort", help="bertqat's QAT scheme: ort, qdqbert or cpu")
    ap.add_argument("--skip-base", action="store_true", help="only all-MiniLM-L6-v2")
    ap.add_argument("--skip-torch-qat", action="store_true", help="no PyTorch eager QAT row (it is the slowest)")
    args = ap.parse_args()
    ours = os.path.join(args.build, "bench_train_step")
    peer = [args.torch_python, os.path.join(ROOT, "bench/peer_train_torch.py")]
    common = ["--batch", str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps),
              "--threads", str(args.threads)]
    cpu, isa = cpu_info()
    cpu_bf16 = "avx512_bf16" in isa or "amx_bf16" in isa
    print(f"CPU: {cpu}; ISA: {', '.join(isa) or 'none of avx2/fma/avx512'}")
    models = [("all-MiniLM-L6-v2", args.minilm)] + ([] if args.skip_base else [("BERT-base shape (random)", "")])
    for name, path in models:
        mflag = ["--model", path] if path else []
        ours_common = [ours] + mflag + common + ["--precision", args.precision]
        b_fp32, _ = run(ours_common)
        b_qat, _ = run(ours_common + ["--qat", "--scheme", args.scheme])
        b_inf, _ = run(ours_common + ["--infer"])
        t_fp32, _ = run(peer + mflag + common)
        t_qat = None if args.skip_torch_qat else run(peer + mflag + common + ["--qat"])[0]
        t_bf16 = run(peer + mflag + common + ["--bf16"])[0] if cpu_bf16 else None
        t_inf, _ = run(peer + mflag + common + ["--infer"])
        print(f"\n== {name}, batch {args.batch}, seq {args.seq}, {args.threads} threads")
        print(f"bertqat: precision {b_fp32.get('precision', '?')}; {b_fp32.get('runtime', '')}; "
              f"{b_fp32.get('cpu_bf16', '')}")
        print(f"PyTorch: {t_fp32.get('blas', '')}")
        print(f"{'training step':34s} {'tokens/s':>10s} {'ms/step':>10s} {'CPU ms/step':>12s} {'peak RSS MiB':>13s}")
        rows = [(f"bertqat {b_fp32.get('precision', 'fp32')}", b_fp32),
                (f"bertqat QAT ({args.scheme} scheme)", b_qat), (t_fp32["peer"] + " fp32", t_fp32)]
        if t_qat:
            rows.append((t_qat["peer"], t_qat))
        for label, r in rows:
            print(f"{label:34s} {r['tokens_per_s']:10.0f} {r['ms_per_step']:10.1f} {r['cpu_ms_per_step']:12.1f} "
                  f"{r['peak_rss_mib']:13.0f}")
        if t_bf16:
            print(f"{t_bf16['peer']:34s} {t_bf16['tokens_per_s']:10.0f} {t_bf16['ms_per_step']:10.1f} "
                  f"{t_bf16['cpu_ms_per_step']:12.1f} {t_bf16['peak_rss_mib']:13.0f}")
        else:
            print(f"{'PyTorch bf16 autocast':34s} not applicable: this CPU has neither AVX512-BF16 nor AMX-BF16 "
                  f"(PyTorch would emulate bf16 there; bertqat refuses bf16 on it)")
        print(f"{'evaluation forward (no tape)':34s} {'ex/s':>10s} {'ms/batch':>10s} {'CPU ms/batch':>12s} "
              f"{'peak RSS MiB':>13s}")
        for label, r in (("bertqat", b_inf), (t_inf["peer"] + " no_grad", t_inf)):
            print(f"{label:34s} {r['examples_per_s']:10.1f} {r['ms_per_step']:10.1f} {r['cpu_ms_per_step']:12.1f} "
                  f"{r['peak_rss_mib']:13.0f}")
        r_fp32 = b_fp32["tokens_per_s"] / t_fp32["tokens_per_s"]
        r_qat = b_qat["ms_per_step"] / b_fp32["ms_per_step"]
        r_rss = b_fp32["peak_rss_mib"] / t_fp32["peak_rss_mib"]
        r_inf = b_inf["examples_per_s"] / t_inf["examples_per_s"]
        c_fp32 = t_fp32["cpu_ms_per_step"] / b_fp32["cpu_ms_per_step"]
        c_inf = t_inf["cpu_ms_per_step"] / b_inf["cpu_ms_per_step"]
        print(f"ratio fp32 tokens/s, bertqat / PyTorch: {r_fp32:.2f}x wall, {c_fp32:.2f}x CPU time "
              f"(target >= {TARGET_FP32}x: {verdict(r_fp32 >= TARGET_FP32)} by wall, "
              f"{verdict(c_fp32 >= TARGET_FP32)} by CPU time)")
        if t_qat:
            print(f"ratio QAT tokens/s, bertqat / PyTorch eager QAT: {b_qat['tokens_per_s'] / t_qat['tokens_per_s']:.2f}x")
        print(f"bertqat QAT step / fp32 step: {r_qat:.2f}x (target <= {TARGET_QAT}x: {verdict(r_qat <= TARGET_QAT)})")
        print(f"peak RSS, bertqat / PyTorch (fp32): {r_rss:.2f}x (target <= {TARGET_RSS}x: {verdict(r_rss <= TARGET_RSS)}); "
              f"bertqat QAT {b_qat['peak_rss_mib'] / t_fp32['peak_rss_mib']:.2f}x")
        print(f"evaluation examples/s, bertqat / PyTorch inference: {r_inf:.2f}x wall, {c_inf:.2f}x CPU time "
              f"(target >= {TARGET_INFER}x: {verdict(r_inf >= TARGET_INFER)} by wall, "
              f"{verdict(c_inf >= TARGET_INFER)} by CPU time)")
        if t_bf16:
            print(f"ratio tokens/s, bertqat {b_fp32.get('precision')} / PyTorch bf16 autocast: "
                  f"{b_fp32['tokens_per_s'] / t_bf16['tokens_per_s']:.2f}x")


if __name__ == "__main__":
    main()
