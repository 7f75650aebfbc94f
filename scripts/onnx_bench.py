"""Latency of an ONNX model in ONNX Runtime (CPU) at given batch sizes, for `bertqat bench --onnx`.

Feeds random input ids of shape (batch, seq) (attention mask all ones, token types zero, in the dtype
each input declares), runs one warm-up inference per batch size and then --rounds timed ones, and
prints one JSON object on stdout:
  {"onnxruntime": VERSION, "threads": N, "seq": T,
   "results": [{"batch": B, "median_ms": X, "times_ms": [...], "cpu_median_ms": Y}, ...]}
where cpu_median_ms is the median of the process CPU time per inference (time.process_time: all
threads, spin-waiting included; a load-independent measure at --threads 1 on a shared machine).
Errors go to stderr with exit status 1 (bad model), 2 (bad arguments) or 3 (onnxruntime missing)."""
import argparse
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--onnx", required=True, help="ONNX file")
    ap.add_argument("--batch-sizes", default="1,32", help="comma-separated batch sizes (default 1,32)")
    ap.add_argument("--seq", type=int, default=128, help="tokens per example (default 128)")
    ap.add_argument("--threads", type=int, default=0, help="intra_op_num_threads (0: ORT's default)")
    ap.add_argument("--rounds", type=int, default=10, help="timed inferences per batch size (default 10)")
    ap.add_argument("--vocab", type=int, default=30522, help="ids are drawn from [1000, vocab) (default 30522)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    try:
        batches = [int(x) for x in a.batch_sizes.split(",")]
    except ValueError:
        ap.error(f"--batch-sizes: '{a.batch_sizes}' is not a comma-separated list of integers")
    if not batches or min(batches) < 1 or a.seq < 1 or a.rounds < 1 or a.vocab <= 1000:
        ap.error("--batch-sizes, --seq and --rounds must be positive and --vocab above 1000")
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError as e:
        print(f"onnx_bench.py: {e} (install onnxruntime and numpy in this Python)", file=sys.stderr)
        return 3
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if a.threads > 0:
        so.intra_op_num_threads = a.threads
    try:
        sess = ort.InferenceSession(a.onnx, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT raises its own exception types for unreadable or invalid models
        print(f"onnx_bench.py: {a.onnx}: {e}", file=sys.stderr)
        return 1
    rng = np.random.default_rng(a.seed)
    results = []
    for b in batches:
        feed = {}
        for i in sess.get_inputs():
            dt = np.int32 if i.type == "tensor(int32)" else np.int64
            if i.name == "input_ids":
                ids = rng.integers(1000, a.vocab, size=(b, a.seq)).astype(dt)
                ids[:, 0] = 101
                feed[i.name] = ids
            elif i.name == "attention_mask":
                feed[i.name] = np.ones((b, a.seq), dt)
            else:
                feed[i.name] = np.zeros((b, a.seq), dt)
        sess.run(None, feed)
        times, cpu = [], []
        for _ in range(a.rounds):
            t0, c0 = time.perf_counter(), time.process_time()
            sess.run(None, feed)
            times.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
        results.append({"batch": b, "median_ms": float(np.median(times)), "times_ms": times,
                        "cpu_median_ms": float(np.median(cpu))})
    print(json.dumps({"onnxruntime": ort.__version__, "threads": a.threads, "seq": a.seq, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
