"""ONNX Runtime CPU latency of bertqat exports (issue #8): fp32, fp32 after
onnxruntime.transformers.optimizer, and the Q/DQ export of each quantized checkpoint given, at batch 1
and batch 32 (sequence 128 by default), all in one run. For each model it also saves the graph ORT's
CPU session actually runs (SessionOptions.optimized_model_filepath) and prints its op types, so one
sees which Q/DQ patterns became integer kernels (MatMulIntegerToFloat, QLinearMatMul, QLinearAdd,
DynamicQuantizeMatMul, ...).

  .venv/bin/python bench/bench_onnx.py --fp32 CKPT --qdq PTQ_ORT --qdq PTQ_QDQBERT [--threads 2]
"""
import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bertqat():
    return os.path.join(os.environ.get("BQ_BUILD_DIR", os.path.join(ROOT, "build")), "bertqat")


def export(ckpt, out, extra=()):
    subprocess.run([bertqat(), "export", "--model", ckpt, "--out", out, *extra], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def session(path, threads, dump=None):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    if dump:
        so.optimized_model_filepath = dump
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def feed(sess, batch, seq, vocab, rng):
    f = {}
    for i in sess.get_inputs():
        dt = np.int32 if i.type == "tensor(int32)" else np.int64
        if i.name == "input_ids":
            f[i.name] = rng.integers(1000, vocab, size=(batch, seq)).astype(dt)
        elif i.name == "attention_mask":
            f[i.name] = np.ones((batch, seq), dt)
        else:
            f[i.name] = np.zeros((batch, seq), dt)
    return f


def latency(sess, f, min_time, min_iters):
    sess.run(None, f)  # warm-up
    times, start = [], time.perf_counter()
    while len(times) < min_iters or time.perf_counter() - start < min_time:
        t = time.perf_counter()
        sess.run(None, f)
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > 10 * min_time:
            break
    return statistics.median(times) * 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fp32", required=True, help="fp32 checkpoint (native or HF directory)")
    ap.add_argument("--qdq", action="append", default=[], help="quantized checkpoint (repeatable)")
    ap.add_argument("--extra", action="append", default=[],
                    help="extra export flags for an additional Q/DQ variant of each --qdq, e.g. '--qdq cpu'")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--min-time", type=float, default=2.0, help="seconds per measurement")
    ap.add_argument("--out", default=None, help="folder for the .onnx files (default: a temp folder)")
    a = ap.parse_args()
    d = a.out or tempfile.mkdtemp(prefix="bench_onnx_")
    os.makedirs(d, exist_ok=True)
    models = []
    fp = os.path.join(d, "fp32.onnx")
    export(a.fp32, fp)
    models.append(("fp32", fp))
    opt = os.path.join(d, "fp32_opt.onnx")
    subprocess.run([sys.executable, "-m", "onnxruntime.transformers.optimizer", "--input", fp, "--output", opt,
                    "--model_type", "bert", "--num_heads", str(a.heads), "--hidden_size", str(a.hidden),
                    "--opt_level", "0"], check=True, capture_output=True)
    models.append(("fp32 optimized", opt))
    for ck in a.qdq:
        name = os.path.basename(os.path.normpath(ck))
        p = os.path.join(d, f"{name}_qdq.onnx")
        export(ck, p)
        models.append((f"Q/DQ {name}", p))
        for k, ex in enumerate(a.extra):
            p = os.path.join(d, f"{name}_qdq_{k}.onnx")
            export(ck, p, ex.split())
            models.append((f"Q/DQ {name} [{ex}]", p))
    batches = [int(b) for b in a.batches.split(",")]
    rng = np.random.default_rng(0)
    print(f"ONNX Runtime {ort.__version__} CPU, {a.threads} threads, sequence {a.seq}")
    res = {}
    for name, p in models:
        dump = p.replace(".onnx", ".ort_cpu.onnx")
        s = session(p, a.threads, dump)
        ops = collections.Counter(n.op_type for n in onnx.load(dump).graph.node)
        print(f"\n{name}: ORT CPU graph ops: " + ", ".join(f"{k} {v}" for k, v in ops.most_common()))
        for b in batches:
            ms = latency(s, feed(s, b, a.seq, a.vocab, rng), a.min_time, 3)
            res[(name, b)] = ms
            print(f"  batch {b:3d}: {ms:9.2f} ms  ({b / ms * 1000:8.1f} examples/s)")
    print("\nspeed-up vs fp32 (unoptimized export, same session options):")
    for name, _ in models:
        print(f"  {name:40s} " + "  ".join(f"b{b}: {res[('fp32', b)] / res[(name, b)]:.2f}x" for b in batches))


if __name__ == "__main__":
    main()
