"""`bertqat pipeline` end to end at a tiny budget (all-MiniLM-L6-v2, env BQ_MODEL_DIR; 96 training and
64 test reviews at seq 32): every stage runs (fp32 fine-tune, PTQ, QAT from the PTQ model with fixed
ranges, three ONNX exports, six evaluations with ONNX Runtime through this Python), the report has a
row per stage, the fp32 ONNX export scores exactly the checkpoint's accuracy and predicts every review
as it does within 1e-4 in probability (`--predictions` of both evaluators, ORT with and without its
graph optimizations, compared by scripts/compare_predictions.py), and a second run of the same command skips every
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

    # per-review predictions (bertqat eval, scripts/onnx_eval.py with ORT's graph optimizations on and
    # off) compared by scripts/compare_predictions.py: the fp32 export predicts every one of the 64
    # reviews as the checkpoint does, p(positive) within 1e-4; one flipped label must fail, a file of
    # other reviews must be refused
    common = ["--data", IMDB, "--split", "test", "--samples", 64, "--max-seq-len", 32, "--seed", 42]
    run_bq("eval", "--model", out / "fp32", "--threads", THREADS, "--predictions", tmp_path / "bq.tsv", *common)
    assert sorted(int(l.split("\t")[0]) for l in (tmp_path / "bq.tsv").read_text().splitlines()) == list(range(64))
    cmp = [sys.executable, os.path.join(ROOT, "scripts", "compare_predictions.py"), tmp_path / "bq.tsv"]
    for opt in ("all", "none"):
        tsv = tmp_path / f"ort-{opt}.tsv"
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "onnx_eval.py"), "--onnx", out / "fp32.onnx",
                        "--tokenizer", out / "fp32", "--graph-opt", opt, "--predictions", tsv, *map(str, common)],
                       check=True, capture_output=True)
        c = subprocess.run(cmp + [tsv, "--min-agree", "100", "--max-dp", "1e-4"], capture_output=True, text=True)
        print(f"fp32 checkpoint vs ONNX fp32 (ORT graph-opt {opt}): {c.stdout.strip()}")
        assert c.returncode == 0 and "reviews 64  labels agree 100.00% (0 differ" in c.stdout, c.stdout + c.stderr
    rows = (tmp_path / "ort-none.tsv").read_text().splitlines()
    i, y, pr, pb = rows[0].split("\t")
    (tmp_path / "flip.tsv").write_text("\n".join([f"{i}\t{y}\t{1 - int(pr)}\t{pb}"] + rows[1:]) + "\n")
    c = subprocess.run(cmp + [tmp_path / "flip.tsv", "--min-agree", "100", "--max-dp", "1e-4", "--list"],
                       capture_output=True, text=True)
    assert c.returncode == 1 and "1 differ" in c.stdout and c.stdout.splitlines()[1] == i, c.stdout + c.stderr
    assert "labels agree on 98.44% < 100.0%" in c.stderr and "max |dp(pos)|" in c.stderr, c.stderr
    (tmp_path / "short.tsv").write_text("\n".join(rows[1:]) + "\n")
    c = subprocess.run(cmp + [tmp_path / "short.tsv"], capture_output=True, text=True)
    assert c.returncode != 0 and "different reviews" in c.stderr, c.stdout + c.stderr

    # the same command again: every stage is done, only the report is written
    p = run_bq(*args, timeout=600)
    assert "qat: done already" in p.stderr, p.stderr[-3000:]
    for cmd in ("finetune --model", "qat --model", "calibrate --model", "export --model", "eval --model", "onnx_eval.py"):
        assert cmd not in p.stderr, (cmd, p.stderr[-3000:])
    assert (out / "report.md").exists()
