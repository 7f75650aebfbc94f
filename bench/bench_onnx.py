"""ONNX Runtime CPU latency of bertqat exports, all in one run: the fp32 export, the fp32
export after onnxruntime.transformers.optimizer, and for each quantized checkpoint given its Q/DQ export
in the default int8 layout and in the CPU layout (--cpu-layout; a cpu-scheme checkpoint has only that
one), at batch 1 and 32, sequence 128.

Timing: every session is built once; then for each batch size the models run one inference each in
turn, round after round (the order reversed every other round), so a slow spell of a shared machine
hits all of them alike. Printed per model: median wall latency, ratio of the medians vs fp32 and vs the
optimized fp32, and the median of the per-round ratios ("paired"). With --no-spin (worker threads do
not spin) the process CPU time per inference is printed too; it is less sensitive to other load.

For each model it also saves the graph ORT's CPU session actually runs (optimized_model_filepath) and
prints its op types and how many encoder Linears run as integer kernels (MatMulIntegerToFloat or
QLinearMatMul, found by node name), and, for Q/DQ exports, the max |logit| difference between that
session and bertqat's own forward on a random batch (bertqat export --dump-logits).

--profile N adds, per batch size, N more interleaved rounds with SessionOptions.enable_profiling on and
prints per model the kernel time per op type (the median over rounds of each node, summed), their total,
and the median model_run time: the difference is time outside kernels (thread-pool hand-offs between
nodes, waiting for a core on a loaded machine).

  .venv/bin/python bench/bench_onnx.py --fp32 HF_OR_CKPT --qdq PTQ_ORT --qdq PTQ_QDQBERT --qdq PTQ_CPU
"""
import argparse
import collections
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINEARS = ("attention/self/query", "attention/self/key", "attention/self/value", "attention/output/dense",
           "intermediate/dense", "output/dense")


def bertqat():
    return os.path.join(os.environ.get("BQ_BUILD_DIR", os.path.join(ROOT, "build")), "bertqat")


def export(ckpt, out, extra=(), dump=None):
    args = [bertqat(), "export", "--model", ckpt, "--out", out, *extra]
    if dump:
        args += ["--dump-logits", dump, "--dump-batch", "4", "--dump-seq", "128"]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def scheme_of(ckpt):
    try:
        with open(os.path.join(ckpt, "config.json")) as f:
            return json.load(f).get("bertqat", {}).get("quant", {}).get("scheme")
    except (OSError, ValueError):
        return None


def session_options(a, dump=None):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.intra_op_num_threads = a.threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0" if a.no_spin else "1")
    if dump:
        so.optimized_model_filepath = dump
    return so


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


def integer_linears(g):
    ops = {n.name: n.op_type for n in g.node}
    layers = sorted({int(n.split("/layer.")[1].split("/")[0]) for n in ops if "/encoder/layer." in n})
    total = len(layers) * len(LINEARS)
    k = sum(ops.get(f"/bert/encoder/layer.{l}/{lin}/MatMul") in ("MatMulIntegerToFloat", "QLinearMatMul")
            for l in layers for lin in LINEARS)
    return k, total


def logit_error(sess, dump):
    with open(dump) as f:
        d = json.load(f)
    fd = {i.name: np.array(d[i.name], dtype=np.int32 if i.type == "tensor(int32)" else np.int64)
          for i in sess.get_inputs()}
    ref = np.array(d["logits"], dtype=np.float32)
    return float(np.abs(sess.run(None, fd)[0] - ref).max()), float(np.abs(ref).max())


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            txt = f.read()
        name = next((l.split(":", 1)[1].strip() for l in txt.splitlines() if l.startswith("model name")), "?")
        flags = set(next((l.split(":", 1)[1].split() for l in txt.splitlines() if l.startswith("flags")), []))
        isa = [x for x in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if x in flags]
        return f"{name}, {os.cpu_count()} CPUs, {' '.join(isa)}"
    except OSError:
        return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fp32", required=True, help="fp32 checkpoint (native or HF directory)")
    ap.add_argument("--qdq", action="append", default=[], help="quantized checkpoint (repeatable)")
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--vocab", type=int, default=30522)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    ap.add_argument("--rounds", default="40,6", help="timed rounds per batch size, in --batches order")
    ap.add_argument("--no-spin", action="store_true",
                    help="session.intra_op.allow_spinning=0 (and print CPU time per inference)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="N profiled rounds per batch size: kernel time per op type (0: off)")
    ap.add_argument("--out", default=None, help="folder for the .onnx files (default: a temp folder)")
    a = ap.parse_args()
    d = a.out or tempfile.mkdtemp(prefix="bench_onnx_")
    os.makedirs(d, exist_ok=True)
    batches = [int(b) for b in a.batches.split(",")]
    rounds = [int(r) for r in a.rounds.split(",")]
    rounds += [rounds[-1]] * (len(batches) - len(rounds))

    models = []  # (label, path, dump json or None)
    fp = os.path.join(d, "fp32.onnx")
    export(a.fp32, fp)
    models.append(("fp32", fp, None))
    opt = os.path.join(d, "fp32_opt.onnx")
    subprocess.run([sys.executable, "-m", "onnxruntime.transformers.optimizer", "--input", fp, "--output", opt,
                    "--model_type", "bert", "--num_heads", str(a.heads), "--hidden_size", str(a.hidden),
                    "--opt_level", "0"], check=True, capture_output=True)
    models.append(("fp32 optimized", opt, None))
    for ck in a.qdq:
        name = os.path.basename(os.path.normpath(ck))
        scheme = scheme_of(ck) or "?"
        layouts = [("cpu", ["--cpu-layout"])] if scheme == "cpu" else [("default", []), ("cpu", ["--cpu-layout"])]
        for lay, flags in layouts:
            p = os.path.join(d, f"{name}_{lay}.onnx")
            export(ck, p, flags, dump=p + ".json")
            models.append((f"{name} ({scheme}) {lay} layout", p, p + ".json"))

    with open("/proc/loadavg") as f:
        load0 = f.read().split()[:3]
    print(f"ONNX Runtime {ort.__version__}, CPUExecutionProvider, ORT_ENABLE_ALL, ORT_SEQUENTIAL, "
          f"intra_op_num_threads {a.threads}, inter_op_num_threads 1, allow_spinning {0 if a.no_spin else 1}, "
          f"session.x64quantprecision unset (default); sequence {a.seq}, random token ids, no padding")
    print(f"CPU: {cpu_name()}; load average at start {' '.join(load0)}")
    vers = subprocess.run([bertqat(), "--version"], capture_output=True, text=True).stdout.strip().replace("\n", "; ")
    blas_env = " ".join(f"{k}={os.environ[k]}" for k in ("OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS",
                                                          "OMP_NUM_THREADS", "BQ_THREADS") if k in os.environ)
    print(f"exports and reference logits by {vers} {blas_env or '(no BLAS/OpenMP environment overrides)'}; "
          "ONNX Runtime uses its own MLAS kernels, not OpenBLAS")

    rng = np.random.default_rng(0)
    sess = {}
    print()
    for label, p, dump in models:
        g_path = p.replace(".onnx", ".ort_cpu.onnx")
        s = ort.InferenceSession(p, session_options(a, g_path), providers=["CPUExecutionProvider"])
        sess[label] = s
        g = onnx.load(g_path).graph
        ops = collections.Counter(n.op_type for n in g.node)
        k, total = integer_linears(g)
        line = f"{label}: encoder Linears as integer kernels {k}/{total}"
        if dump:
            err, mx = logit_error(s, dump)
            line += f"; max |logit - bertqat| {err:.3g} (max |logit| {mx:.3g})"
        print(line)
        print("  ORT CPU graph: " + ", ".join(f"{o} {c}" for o, c in ops.most_common()))

    labels = [m[0] for m in models]
    wall = collections.defaultdict(list)
    cpu = collections.defaultdict(list)
    pair = collections.defaultdict(list)
    pair_opt = collections.defaultdict(list)
    for b, nr in zip(batches, rounds):
        feeds = {lab: feed(sess[lab], b, a.seq, a.vocab, rng) for lab in labels}
        for lab in labels:  # warm-up
            sess[lab].run(None, feeds[lab])
        for r in range(nr):
            w, c = {}, {}
            for lab in (labels if r % 2 == 0 else labels[::-1]):
                t0, c0 = time.perf_counter(), time.process_time()
                sess[lab].run(None, feeds[lab])
                w[lab], c[lab] = (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3
            for lab in labels:
                wall[(lab, b)].append(w[lab])
                cpu[(lab, b)].append(c[lab])
                pair[(lab, b)].append(w["fp32"] / w[lab])
                pair_opt[(lab, b)].append(w["fp32 optimized"] / w[lab])
    with open("/proc/loadavg") as f:
        load1 = f.read().split()[:3]

    md = statistics.median
    width = max(len(lab) for lab in labels)
    for b, nr in zip(batches, rounds):
        print(f"\nbatch {b}, sequence {a.seq}: {nr} interleaved rounds; latency = median wall ms per inference")
        hdr = f"  {'model':{width}s} {'latency':>9s} {'vs fp32':>8s} {'paired':>7s} {'vs opt':>7s} {'paired':>7s}"
        if a.no_spin:
            hdr += f" {'cpu ms':>8s} {'vs fp32':>8s}"
        print(hdr)
        for lab in labels:
            m = md(wall[(lab, b)])
            row = (f"  {lab:{width}s} {m:9.2f} {md(wall[('fp32', b)]) / m:7.2f}x {md(pair[(lab, b)]):6.2f}x "
                   f"{md(wall[('fp32 optimized', b)]) / m:6.2f}x {md(pair_opt[(lab, b)]):6.2f}x")
            if a.no_spin:
                cm = md(cpu[(lab, b)])
                row += f" {cm:8.2f} {md(cpu[('fp32', b)]) / cm:7.2f}x"
            print(row)
    if a.profile:
        profile(a, models, batches, d)
    print(f"\nload average at end {' '.join(load1)}")


def profile(a, models, batches, d):
    """Per-op-type kernel times from ORT's profiler, interleaved like the timing rounds."""
    rng = np.random.default_rng(1)
    for b in batches:
        sess = {}
        for label, p, _ in models:
            so = session_options(a)
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(d, f"profile_b{b}_" + os.path.basename(p).replace(".onnx", ""))
            sess[label] = ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])
        labels = [m[0] for m in models]
        feeds = {lab: feed(sess[lab], b, a.seq, a.vocab, rng) for lab in labels}
        for r in range(a.profile + 1):  # round 0 is a warm-up, dropped below
            for lab in (labels if r % 2 == 0 else labels[::-1]):
                sess[lab].run(None, feeds[lab])
        print(f"\nprofile, batch {b}: kernel ms per op type (median per node over {a.profile} rounds, summed)")
        for lab in labels:
            with open(sess[lab].end_profiling()) as f:
                ev = json.load(f)
            per, typ = collections.defaultdict(list), {}
            for e in ev:
                if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                    per[e["name"]].append(e["dur"] / 1e3)
                    typ[e["name"]] = e["args"]["op_name"]
            tot = collections.Counter()
            for k, v in per.items():
                tot[typ[k]] += statistics.median(v[1:] or v)
            runs = [e["dur"] / 1e3 for e in ev if e.get("name") == "model_run"][1:]
            ks = sum(tot.values())
            mr = statistics.median(runs) if runs else float("nan")
            print(f"  {lab}: kernels {ks:.2f} ms, model_run {mr:.2f} ms (outside kernels {mr - ks:.2f} ms): " +
                  ", ".join(f"{o} {t:.2f}" for o, t in tot.most_common(10)))


if __name__ == "__main__":
    main()
