"""`bertqat pipeline` end to end at a tiny budget (96 training and 64 test reviews at seq 32), started
from the session's fine-tuned all-MiniLM-L6-v2 (conftest.finetuned: a trained head, so that the
quantized models' probabilities are spread and a quantization error shows in them):
- every stage runs (fp32 fine-tune, PTQ, QAT from the PTQ model with fixed ranges distilling from the
  fp32 stage by default, the ONNX exports,
  the evaluations with ONNX Runtime through this Python), with the default scheme cpu; the report has
  a row per stage with the engine that scored it, names the runtime each export is for and lists the
  settings each stage ran with;
- PTQ and QAT are scored by the integer engine and once more as fake quant; the report's
  review-by-review rows equal scripts/compare_predictions.py's count on the same files, within
  ENGINE_BOUNDS; the bench stage (1 round, batch 1 and 2) fills "Speed on this machine";
- review by review (scripts/compare_predictions.py over `--predictions` of both evaluators): the fp32
  export predicts every review as the checkpoint does within 1e-4 in probability (ORT with and without
  its graph optimizations); the int8 exports of PTQ and QAT (CPU layout, ORT CPU's integer kernels)
  agree with their checkpoints within the bounds of QUANT_BOUNDS, and an export with one activation
  quantizer scale doubled fails them;
- the same command again skips every stage; with another --train-samples (and --scheme ort and
  --no-distill) every stage runs again, the log names the changed setting, QAT runs without a teacher,
  and the report shows the new settings and the
  ort scheme's rows (the default layout, for ONNX Runtime QOrdered on CUDA; PTQ and QAT scored by the
  integer engine, which runs the ort scheme's Linears on the grids their inputs lie on, and timed by
  the bench)."""
import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import numpy_helper

from conftest import IMDB, ROOT, THREADS, run_bq

STAGES = ["fp32", "ptq", "qat", "export-fp32", "export-qat-int8-cpu", "eval-fp32", "eval-ptq", "eval-ptq-fake-quant",
          "eval-qat", "eval-qat-fake-quant", "eval-onnx-fp32", "eval-onnx-int8-cpu", "bench"]
# the ort scheme: PTQ and QAT scored once (by the integer engine); the second, fake-quant evaluation is
# the cpu scheme's
ORT_STAGES = [s for s in STAGES if "fake-quant" not in s] + ["export-qat-int8", "eval-onnx-int8"]
COMMON = ["--data", IMDB, "--split", "test", "--samples", 64, "--max-seq-len", 32, "--seed", 42]
COMPARE = [sys.executable, os.path.join(ROOT, "scripts", "compare_predictions.py")]
# Bounds of the int8 exports (CPU layout) against their checkpoints, review by review. ORT computes the
# same rounding of x/s at every quantizer as bertqat's fake quantization, with exact integer sums; the
# two differ only where fp32 sums in another order put x/s on the other side of a rounding boundary,
# which moves one 8-bit value by one step. Such flips are rare events that touch a few reviews: the
# median |dp(pos)| stays near 0 (measured 1e-5 for PTQ and 1.3e-4 for QAT on these 64 reviews), while a
# few reviews move by up to 0.02 and one review close to p = 0.5 may change its label (PTQ: 63 of 64
# agree). A wrong scale is systematic and moves every review: one activation scale doubled (the
# amax/127 vs amax/255 kind of bug, WRONG below) gave a median of 2.6e-3 and the query weight scale of
# layer 0 doubled 8e-3, so the median bound 1e-3 sits 7x above the honest exports and 2.6x below the
# smallest wrong scale; a wrong weight layout scrambles the Linears and moves the median far more. The
# label and max bounds catch gross errors (a layout error puts agreement near 50%).
QUANT_BOUNDS = ["--min-agree", "95", "--max-dp", "0.1", "--max-median-dp", "1e-3"]
# Bounds of the integer engine against fake quant of the same checkpoint on these 64 reviews. The engine
# sums the same integer products exactly where fake quant sums them in fp32, so they differ only where
# that summation order puts a value on the other side of the next quantizer's rounding boundary: a rarer
# event than between ORT and bertqat (which also differ in GELU, softmax and LayerNorm), so the ORT
# bounds above hold a fortiori, and of 64 reviews at most one close to p = 0.5 may change its label
# (measured here: PTQ 63 of 64, QAT 64 of 64; tests/python/test_int8_engine.py: >= 99% on 200 reviews).
# Which reviews sit that close depends on the CPU's fp32 summation order, so the label bound leaves room
# for three (>= 61 of 64, the exports' 95%) and the accuracies may differ by at most 3/64. The median
# bound is what catches a systematic error (a wrong scale in the engine moves every review), as for the
# exports.
ENGINE_BOUNDS = ["--min-agree", "95", "--max-dp", "0.1", "--max-median-dp", "1e-3"]
WRONG = "bert.encoder.layer.0.attention.self.input_quantizer.scale_0"


def ort_predictions(onnx_path, tokenizer, tsv, *extra):
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "onnx_eval.py"), "--onnx", onnx_path,
                        "--tokenizer", tokenizer, "--threads", THREADS, "--predictions", tsv, *extra,
                        *map(str, COMMON)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]


def compare(a, b, *bounds):
    return subprocess.run(COMPARE + [a, b, *bounds], capture_output=True, text=True)


def test_pipeline_tiny(tmp_path, bin_path, finetuned):
    out = tmp_path / "run"
    args = ["pipeline", "--model", finetuned[0], "--data", IMDB, "--out", out, "--budget", "small", "--train-samples",
            96, "--eval-samples", 64, "--max-seq-len", 32, "--batch-size", 16, "--calib-samples", 16, "--threads",
            THREADS, "--python", sys.executable, "--bench-rounds", 1, "--bench-batch-sizes", "1,2"]
    p = run_bq(*args, timeout=3600)
    log = p.stderr
    assert f"qat --model {out}/ptq" in log and "--ranges fixed" in log and "ranges: fixed" in log, log[-3000:]
    assert "--scheme cpu" in log, log[-3000:]
    # distillation is the classification pipeline's default: QAT's teacher is the fp32 stage
    assert f"--teacher {out}/fp32" in log and "[qat] distill step" in log, log[-3000:]
    for stage in STAGES:
        marker = json.loads((out / f".done-{stage}").read_text())
        assert marker["seconds"] >= 0 and marker["argv"][0] in (os.path.realpath(bin_path), sys.executable), marker
    assert json.loads((out / ".done-fp32").read_text())["settings"]["--train-samples"] == "96"
    assert not (out / ".done-export-qat-int8").exists()
    for f in ("fp32.onnx", "qat-int8-cpu.onnx", "report.md", "curves-loss.svg", "curves-eval.svg"):
        assert (out / f).stat().st_size > 0, f
    acc, engine = {}, {}
    for name in ("fp32", "ptq", "ptq-fake-quant", "qat", "qat-fake-quant", "onnx-fp32", "onnx-int8-cpu"):
        r = json.loads((out / f"eval-{name}.json").read_text())
        assert r["examples"] == 64, (name, r)
        acc[name], engine[name] = r["accuracy"], r.get("engine", r.get("runtime"))
    print(f"\naccuracy on 64 test reviews: {acc}")
    assert acc["onnx-fp32"] == acc["fp32"], acc
    # the cpu scheme: the pipeline's default engine for PTQ and QAT is the integer engine
    assert engine["fp32"] == "fp32" and engine["onnx-int8-cpu"].startswith("onnxruntime"), engine
    for ck in ("ptq", "qat"):
        assert engine[ck] == "int8" and engine[f"{ck}-fake-quant"] == "fake-quant", engine
    report = (out / "report.md").read_text()
    for row in ("| fp32 | fp32 |", "| PTQ (cpu scheme, percentile 99.99) | int8 |",
                "| PTQ (cpu scheme, percentile 99.99) | fake-quant |", "| QAT (cpu scheme) | int8 |",
                "| QAT (cpu scheme) | fake-quant |", "| ONNX fp32 (for ORT CPU) | onnxruntime",
                "| ONNX int8 QAT, CPU layout (for ORT CPU) | onnxruntime", "## Stages as run",
                "- qat (", "`qat --model ptq --out qat --data", "- eval-qat-fake-quant (", "--engine fake-quant",
                "- bench (", "`bench --model qat --onnx qat-int8-cpu.onnx",
                "- distillation (qat): teacher fp32, alpha 0.5, temperature 2"):
        assert row in report, (row, report)
    assert "default layout" not in report, report

    # int8 engine against fake quant, review by review: the report's agreement rows equal what
    # scripts/compare_predictions.py finds in the same prediction files, within ENGINE_BOUNDS
    for ck, label in (("ptq", "PTQ (cpu scheme, percentile 99.99)"), ("qat", "QAT (cpu scheme)")):
        c = compare(out / f"pred-{ck}.tsv", out / f"pred-{ck}-fake-quant.tsv", *ENGINE_BOUNDS)
        print(f"{ck}: int8 engine vs fake quant: {c.stdout.strip()}")
        assert c.returncode == 0, c.stdout + c.stderr
        differ = int(c.stdout.split("(")[1].split()[0])
        line = [l for l in report.splitlines() if l.startswith(f"| {label}: int8 vs fake-quant |")]
        assert len(line) == 1, report
        cells = [x.strip() for x in line[0].strip("|").split("|")]
        assert cells[1] == "64" and cells[2] == f"{100 * (64 - differ) / 64:.2f}% ({differ} differ)", (cells, c.stdout)
        assert abs(acc[ck] - acc[f"{ck}-fake-quant"]) <= 3 / 64 + 1e-9, acc
        assert cells[3] == f"{100 * (acc[ck] - acc[ck + '-fake-quant']):+.2f} pt", (cells, acc)

    # speed: the bench of the QAT checkpoint and its export, at the batch sizes asked for, in the report
    bench = json.loads((out / "bench.json").read_text())
    assert bench["int8_available"] and bench["rounds"] == 1 and bench["seq"] == 32, bench
    assert [r["batch"] for r in bench["results"]] == [1, 2], bench
    for r in bench["results"]:
        for k in ("fp32_ms", "fake-quant_ms", "int8_ms", "onnxruntime_ms"):
            assert r[k] > 0, (k, r)
    speed = report[report.index("## Speed on this machine"):report.index("## Stages as run")]
    print(speed)
    assert f"- CPU: {bench['cpu']}" in speed and "- ISA: oneDNN" in speed and bench["verdict"] in speed, speed
    assert "| ms per forward | batch 1 | batch 2 |" in speed, speed
    table = {}
    for line in speed.splitlines():
        if line.startswith("| ") and not line.startswith("| ms per forward"):
            cells = [x.strip() for x in line.strip("|").split("|")]
            table[cells[0]] = cells[1:]
    ort_label = f"ONNX Runtime {bench['onnxruntime']} (int8 export, CPU layout)"
    fl = bench["precision"]  # the float path is named after the precision auto chose: bf16 on a CPU with bf16 units
    for label in (fl, "fake quant", "int8 engine", ort_label, f"{fl} / int8 engine", "ONNX Runtime / int8 engine"):
        nums = [float(x.rstrip("x")) for x in table[label]]
        assert len(nums) == 2 and all(x > 0 for x in nums), (label, table)

    # fp32: the export predicts every one of the 64 reviews as the checkpoint does, p(positive) within
    # 1e-4, with ORT's graph optimizations on and off; one flipped label must fail, a file of other
    # reviews must be refused
    # the checkpoints' predictions are the pipeline's own (eval --predictions, default engine)
    tsv = {ck: out / f"pred-{ck}.tsv" for ck in ("fp32", "ptq", "qat")}
    assert sorted(int(l.split("\t")[0]) for l in tsv["fp32"].read_text().splitlines()) == list(range(64))
    for opt in ("all", "none"):
        t = tmp_path / f"ort-{opt}.tsv"
        ort_predictions(out / "fp32.onnx", out / "fp32", t, "--graph-opt", opt)
        c = compare(tsv["fp32"], t, "--min-agree", "100", "--max-dp", "1e-4")
        print(f"fp32 checkpoint vs ONNX fp32 (ORT graph-opt {opt}): {c.stdout.strip()}")
        assert c.returncode == 0 and "reviews 64  labels agree 100.00% (0 differ" in c.stdout, c.stdout + c.stderr
    rows = (tmp_path / "ort-none.tsv").read_text().splitlines()
    i, y, pr, pb = rows[0].split("\t")
    (tmp_path / "flip.tsv").write_text("\n".join([f"{i}\t{y}\t{1 - int(pr)}\t{pb}"] + rows[1:]) + "\n")
    c = compare(tsv["fp32"], tmp_path / "flip.tsv", "--min-agree", "100", "--max-dp", "1e-4", "--list")
    assert c.returncode == 1 and "1 differ" in c.stdout and c.stdout.splitlines()[1] == i, c.stdout + c.stderr
    assert "labels agree on 98.44% < 100.0%" in c.stderr and "max |dp(pos)|" in c.stderr, c.stderr
    (tmp_path / "short.tsv").write_text("\n".join(rows[1:]) + "\n")
    c = compare(tsv["fp32"], tmp_path / "short.tsv")
    assert c.returncode != 0 and "different reviews" in c.stderr, c.stdout + c.stderr

    # int8: PTQ (exported here, CPU layout) and QAT (the pipeline's export) in ORT CPU against their
    # checkpoints, within QUANT_BOUNDS
    run_bq("export", "--model", out / "ptq", "--out", tmp_path / "ptq-int8-cpu.onnx", "--cpu-layout")
    for ck, path in (("ptq", tmp_path / "ptq-int8-cpu.onnx"), ("qat", out / "qat-int8-cpu.onnx")):
        t = tmp_path / f"ort-{ck}.tsv"
        ort_predictions(path, out / "fp32", t)
        c = compare(tsv[ck], t, *QUANT_BOUNDS)
        print(f"{ck} checkpoint vs its int8 ONNX export (CPU layout, ORT CPU): {c.stdout.strip()}")
        assert c.returncode == 0, c.stdout + c.stderr
    # one activation scale doubled (layer 0's query/key/value input) must fail the same bounds
    m = onnx.load(str(out / "qat-int8-cpu.onnx"))
    edited = 0
    for init in m.graph.initializer:
        if init.name == WRONG:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(2), init.name))
            edited += 1
    assert edited == 1, [i.name for i in m.graph.initializer if "scale" in i.name][:10]
    onnx.save(m, str(tmp_path / "wrong.onnx"))
    ort_predictions(tmp_path / "wrong.onnx", out / "fp32", tmp_path / "ort-wrong.tsv")
    c = compare(tsv["qat"], tmp_path / "ort-wrong.tsv", *QUANT_BOUNDS)
    print(f"qat checkpoint vs its export with {WRONG} doubled: {c.stdout.strip()}")
    assert c.returncode == 1 and "FAIL" in c.stderr, c.stdout + c.stderr

    # the same command again: every stage is done, only the report is written
    p = run_bq(*args, timeout=600)
    assert "qat: done already" in p.stderr, p.stderr[-3000:]
    for cmd in ("finetune --model", "qat --model", "calibrate --model", "export --model", "eval --model", "onnx_eval.py",
                "bench --model"):
        assert cmd not in p.stderr, (cmd, p.stderr[-3000:])

    # another --train-samples (and the ort scheme): the fp32 stage names the change, every stage runs
    # again, and the report shows what ran
    args2 = args[:args.index("--train-samples")] + ["--train-samples", 80] + \
        args[args.index("--train-samples") + 2:] + ["--scheme", "ort", "--no-distill"]
    p = run_bq(*args2, timeout=3600)
    log = p.stderr
    assert "--teacher" not in log and "distill step" not in log, log[-3000:]
    assert not (out / "qat" / "distill.json").exists()
    assert "fp32: running again (--train-samples 96 -> 80)" in log, log[-3000:]
    assert "done already" not in log, log[-3000:]
    for stage in ORT_STAGES:
        assert f"[pipeline] {stage}: /" in log, (stage, log[-3000:])
    for stage in ("fp32", "qat"):
        assert json.loads((out / f".done-{stage}").read_text())["settings"]["--train-samples"] == "80"
    report = (out / "report.md").read_text()
    for row in ("| PTQ (ort scheme", "| QAT (ort scheme)", "| ONNX int8 QAT, CPU layout (for ORT CPU)",
                "| ONNX int8 QAT, default layout (for ONNX Runtime QOrdered (CUDA); ORT CPU here)",
                "--train-samples 80", "- eval-onnx-int8 (", "| QAT (ort scheme) | int8 |",
                "## Speed on this machine", "| int8 engine | ", "- distillation (qat): none"):
        assert row in report, (row, report)
    assert "refused" not in report and "int8 cannot run" not in report, report
    assert "--train-samples 96" not in report and "eval-qat-fake-quant" not in report, report
