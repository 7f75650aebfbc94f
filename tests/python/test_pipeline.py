"""`bertqat pipeline` end to end at a tiny budget (all-MiniLM-L6-v2, env BQ_MODEL_DIR; 96 training and
64 test reviews at seq 32): every stage runs (fp32 fine-tune, PTQ, QAT from the PTQ model with fixed
ranges, three ONNX exports, six evaluations with ONNX Runtime through this Python), the report has a
row per stage, the fp32 ONNX export scores exactly the checkpoint's accuracy and predicts every review
as it does (`--predictions` of both evaluators, ORT with and without its graph optimizations, compared
by scripts/compare_predictions.py), and a second run of the same command skips every
finished stage."""
import json
import os
import subprocess
import sys

import pytest

from conftest import IMDB, MODEL, ROOT, THREADS, run_bq

STAGES = ["fp32", "ptq", "qat", "export-fp32", "export-qat-int8-cpu", "export-qat-int8", "eval-fp32", "eval-ptq",
          "eval-qat", "eval-onnx-fp32", "eval-onnx-int8-cpu", "eval-onnx-int8"]


def test_pipeline_tiny(tmp_path, bin_path):
    if not os.path.isdir(MODEL):
        pytest.fail(f"pretrained model not found at {MODEL} (scripts/test.sh fetches it)")
    out = tmp_path / "run"
    args = ["pipeline", "--model", MODEL, "--data", IMDB, "--out", out, "--budget", "small", "--train-samples", 96,
            "--eval-samples", 64, "--max-seq-len", 32, "--batch-size", 16, "--calib-samples", 16, "--threads",
            THREADS, "--python", sys.executable]
    p = run_bq(*args, timeout=3600)
    log = p.stderr
    assert f"qat --model {out}/ptq" in log and "--ranges fixed" in log and "ranges: fixed" in log, log[-3000:]
    for stage in STAGES:
        assert (out / f".done-{stage}").exists(), stage
    for f in ("fp32.onnx", "qat-int8-cpu.onnx", "qat-int8.onnx", "report.md", "curves-loss.svg", "curves-eval.svg"):
        assert (out / f).stat().st_size > 0, f
    acc = {}
    for name in ("fp32", "ptq", "qat", "onnx-fp32", "onnx-int8-cpu", "onnx-int8"):
        r = json.loads((out / f"eval-{name}.json").read_text())
        assert r["examples"] == 64, (name, r)
        acc[name] = r["accuracy"]
    print(f"\naccuracy on 64 test reviews: {acc}")
    assert acc["onnx-fp32"] == acc["fp32"], acc
    report = (out / "report.md").read_text()
    for row in ("| fp32 |", "| PTQ (ort scheme", "| QAT (ort scheme)", "| ONNX fp32 (ORT CPU)",
                "| ONNX int8 QAT, CPU layout", "| ONNX int8 QAT, default layout"):
        assert row in report, (row, report)

    # per-review predictions: bertqat eval and scripts/onnx_eval.py list the same reviews in the same
    # positions; the fp32 export predicts every review as the checkpoint does
    def predictions(path):
        rows = [line.split("\t") for line in path.read_text().splitlines()]
        return {int(r[0]): (int(r[1]), int(r[2]), float(r[3])) for r in rows}

    common = ["--data", IMDB, "--split", "test", "--samples", 64, "--max-seq-len", 32, "--seed", 42]
    run_bq("eval", "--model", out / "fp32", "--threads", THREADS, "--predictions", tmp_path / "bq.tsv", *common)
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "onnx_eval.py"), "--onnx", out / "fp32.onnx", "--tokenizer", out / "fp32",
                    "--predictions", tmp_path / "ort.tsv", *map(str, common)], check=True, capture_output=True)
    bq, ort = predictions(tmp_path / "bq.tsv"), predictions(tmp_path / "ort.tsv")
    assert sorted(bq) == list(range(64)) and sorted(ort) == list(range(64))
    dp = max(abs(bq[i][2] - ort[i][2]) for i in bq)
    print(f"fp32 checkpoint vs ONNX fp32 on 64 reviews: max |probability difference| {dp:.2e}")
    assert all(bq[i][:2] == ort[i][:2] for i in bq) and dp < 1e-4, (bq, ort)

    # the same through ORT with its graph optimizations off, compared by scripts/compare_predictions.py;
    # one predicted label flipped must fail --min-agree 100, a file of other reviews must be refused
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "onnx_eval.py"), "--onnx", out / "fp32.onnx", "--tokenizer", out / "fp32",
                    "--graph-opt", "none", "--predictions", tmp_path / "none.tsv", *map(str, common)], check=True,
                   capture_output=True)
    cmp = [sys.executable, os.path.join(ROOT, "scripts", "compare_predictions.py")]
    c = subprocess.run(cmp + [tmp_path / "bq.tsv", tmp_path / "none.tsv", "--min-agree", "100"], capture_output=True, text=True)
    assert c.returncode == 0 and "labels agree 100.00% (0 differ" in c.stdout, c.stdout + c.stderr
    rows = (tmp_path / "none.tsv").read_text().splitlines()
    i, y, pr, pb = rows[0].split("\t")
    (tmp_path / "flip.tsv").write_text("\n".join([f"{i}\t{y}\t{1 - int(pr)}\t{pb}"] + rows[1:]) + "\n")
    c = subprocess.run(cmp + [tmp_path / "bq.tsv", tmp_path / "flip.tsv", "--min-agree", "100", "--list"],
                       capture_output=True, text=True)
    assert c.returncode == 1 and "1 differ" in c.stdout and c.stdout.splitlines()[1] == i, c.stdout + c.stderr
    (tmp_path / "short.tsv").write_text("\n".join(rows[1:]) + "\n")
    c = subprocess.run(cmp + [tmp_path / "bq.tsv", tmp_path / "short.tsv"], capture_output=True, text=True)
    assert c.returncode != 0 and "different reviews" in c.stderr, c.stdout + c.stderr

    # the same command again: every stage is done, only the report is written
    p = run_bq(*args, timeout=600)
    assert "qat: done already" in p.stderr, p.stderr[-3000:]
    for cmd in ("finetune --model", "qat --model", "calibrate --model", "export --model", "eval --model", "onnx_eval.py"):
        assert cmd not in p.stderr, (cmd, p.stderr[-3000:])
    assert (out / "report.md").exists()
