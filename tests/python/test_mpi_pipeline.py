"""`mpirun -np 2 bertqat pipeline` (docs/distributed.md "pipeline") against the 1-process
pipeline, all-MiniLM-L6-v2 on 54 IMDB training reviews at seq 32, 1 thread per rank:
- the 2-rank run is killed (one rank, SIGKILL) during its fp32 fine-tune: the job ends non-zero;
- the same command again resumes the fp32 stage (--resume), runs on, and fails in the ONNX Runtime
  stage (rank 0 alone runs it) on a Python that cannot score: one message, non-zero exit, no report;
- the same command with a working Python skips the stages done and finishes; then every checkpoint
  (weights, optimizer state, quantizer ranges), training log, ONNX file, evaluation and predictions file
  equals the 1-process pipeline's with --batch-size 8 --grad-accum 2 (for two ranks each step's gradient
  is one addition of two partial sums in both runs, so "equal" is bit for bit);
- a stage that fails on rank 1 only (its --data is a broken CSV) ends every rank with one message and
  leaves no checkpoint of that stage.
Under CI a missing mpirun or model fails instead of skipping."""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import BIN, IMDB, MODEL, run_bq
from test_mpi import MPIRUN, assert_same_tensors, kill_rank_when_saved, log_rows, mpirun_cmd, run_mpi

# 54 reviews: 6 held out for validation (10 %, rounded up) and 48 = 3 global batches of 16, so that no
# epoch ends in a smaller batch, which 2 ranks split 6 + 5 rows where 1 process with --grad-accum 2
# splits 8 + 3 (both correct, not the same sums).
PIPE = ["--data", IMDB, "--train-samples", 54, "--eval-samples", 32, "--max-seq-len", 32, "--calib-samples", 16,
        "--threads", 1, "--bench-rounds", 1, "--bench-batch-sizes", 1]
EVALS = ["fp32", "ptq", "ptq-fake-quant", "qat", "qat-fake-quant", "onnx-fp32", "onnx-int8-cpu"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, bin_path):
    for what, ok in (("mpirun (openmpi-bin)", MPIRUN), (f"pretrained model at {MODEL}", os.path.isdir(MODEL)),
                     (f"IMDB archive at {IMDB}", os.path.exists(IMDB))):
        if not ok:
            if os.environ.get("CI"):
                pytest.fail(f"{what} not found")
            pytest.skip(f"{what} not found")
    d = tmp_path_factory.mktemp("mpipipe")
    bad_python = d / "python-without-onnxruntime"
    bad_python.write_text("#!/bin/sh\necho 'this python cannot score ONNX' >&2\nexit 3\n")
    bad_python.chmod(0o755)
    one, two = d / "one", d / "two"
    r = {"one": one, "two": two}
    r["one_p"] = run_bq("pipeline", "--model", MODEL, "--out", one, *PIPE, "--batch-size", 8, "--grad-accum", 2,
                        "--python", sys.executable, timeout=1800)
    args = ["pipeline", "--model", MODEL, "--out", two, *PIPE, "--batch-size", 16]

    # A: kill rank 1 once the fp32 stage has saved a resumable state.
    p, _, t0 = kill_rank_when_saved([*args, "--python", bad_python], two / "fp32" / "training_state.h5", 60)
    r["kill_exit"], r["kill_wait"] = p.returncode, time.time() - t0

    # B: the same command resumes, then fails in the first ONNX Runtime stage (rank 0 alone).
    r["fail_p"] = run_mpi(2, *args, "--python", bad_python, check=False)
    r["report_after_fail"] = os.path.exists(two / "report.md")
    # C: with a Python that scores, the stages done are skipped and the rest run.
    r["two_p"] = run_mpi(2, *args, "--python", sys.executable)
    return r


def test_killed_rank_ends_pipeline_and_rerun_resumes(runs):
    print(f"job ended {runs['kill_wait']:.1f}s after the kill, exit {runs['kill_exit']}")
    assert runs["kill_exit"] != 0 and runs["kill_wait"] < 30
    err = runs["fail_p"].stderr
    line = [ln for ln in err.splitlines() if ln.startswith("[pipeline] fp32 (in process on each of 2 MPI ranks)")]
    assert len(line) == 1 and line[0].endswith("--resume"), err[-3000:]


def test_failing_rank0_stage_one_message(runs):
    p = runs["fail_p"]
    assert p.returncode == 1, p.stderr[-3000:]
    assert p.stderr.count("stage eval-onnx-fp32 failed") == 1, p.stderr[-3000:]
    assert p.stderr.count("this python cannot score ONNX") == 1, p.stderr[-3000:]
    assert not runs["report_after_fail"]
    assert os.path.exists(runs["two"] / ".done-eval-qat-fake-quant")


def test_two_ranks_equal_one_process(runs):
    one, two, err = runs["one"], runs["two"], runs["two_p"].stderr
    for stage in ("fp32", "ptq", "qat", "eval-qat"):
        assert f"[pipeline] {stage}: done already" in err, err[-3000:]
    assert err.count("(in process on each of 2 MPI ranks)") == 0  # every in-process stage was done
    for ck in ("fp32", "ptq", "qat"):
        assert_same_tensors(one / ck / "model.h5", two / ck / "model.h5")
    for ck in ("fp32", "qat"):
        assert_same_tensors(one / ck / "training_state.h5", two / ck / "training_state.h5")
        # the killed and resumed run logs the steps after its last checkpoint twice; the last row wins
        a = {(x["type"], x["step"]): x for x in log_rows(one / ck)}
        b = {(x["type"], x["step"]): x for x in log_rows(two / ck)}
        assert a == b, ck
    for f in ("fp32.onnx", "qat-int8-cpu.onnx"):
        assert (one / f).read_bytes() == (two / f).read_bytes(), f
    for name in EVALS:
        e1 = json.loads((one / f"eval-{name}.json").read_text())
        e2 = json.loads((two / f"eval-{name}.json").read_text())
        for k in ("examples", "accuracy", "f1", "confusion_matrix"):
            assert e1.get(k) == e2.get(k), (name, k)
        # eval sums the loss over the ranks' shards in another order than one process (onnx_eval.py has none)
        assert ("loss" in e1) == (not name.startswith("onnx")), name
        if "loss" in e1:
            assert abs(e1["loss"] - e2["loss"]) <= 1e-12 * max(1.0, abs(e1["loss"])), (name, e1["loss"], e2["loss"])
        assert (one / f"pred-{name}.tsv").read_text() == (two / f"pred-{name}.tsv").read_text(), name
    report = (two / "report.md").read_text()
    assert "2 MPI ranks" in report
    assert runs["two_p"].stdout.count("report:") == 1


def test_stage_failing_on_one_rank_stops_all(runs, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text('text,label\n"unterminated,1\n')
    out = tmp_path / "run"
    base = ["pipeline", "--model", MODEL, "--out", out, *PIPE, "--batch-size", 16, "--python", sys.executable]
    rank1 = [str(a) for a in base]
    rank1[rank1.index("--data") + 1] = str(bad)
    glob = mpirun_cmd(1)[:-2]  # mpirun and its global options, without -np
    cmd = [*glob, "-np", "1", BIN, *map(str, base), ":", "-np", "1", BIN, *rank1]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    print(p.stderr[-2000:])
    assert p.returncode != 0
    assert p.stderr.count("bad.csv:2") == 1, p.stderr[-3000:]
    assert "[MPI rank 1] stage fp32" in p.stderr
    assert not os.path.exists(out / "fp32" / "model.h5") and not os.path.exists(out / ".done-fp32")
