"""Data-parallel runs under Open MPI (docs/distributed.md), `mpirun -np 2` on localhost with
all-MiniLM-L6-v2 on a small CSV made here:
- finetune, 2 ranks x 1 thread with --batch-size 16 against 1 process with --batch-size 8 --grad-accum 2:
  the same losses, gradient norms and validation metrics at every step and bit-identical weights and
  optimizer state after 20 steps;
- calibrate (percentile histograms), eval (confusion matrix, predictions file) and sensitivity (its
  JSON) equal to 1 process; finetune --task qa bit-identical to 1 process with --grad-accum 2;
- a command that is not data-parallel (info, export) refuses mpirun with one line, exit 2;
- a bad input file fails every rank with one message and a non-zero exit, no output folder;
- a killed rank ends the job within seconds, the last checkpoint loads, and the run resumes (in one
  process, so with a different N).
Under CI a missing mpirun or model fails instead of skipping."""
import csv
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import BIN, DATA, MODEL, run_bq

h5py = pytest.importorskip("h5py")

MPIRUN = shutil.which("mpirun")


def mpirun_cmd(n):
    cmd = [MPIRUN, "--oversubscribe", "-np", str(n)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return cmd


def run_mpi(n, *args, check=True, timeout=1800):
    p = subprocess.run([*mpirun_cmd(n), BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"mpirun -np {n} bertqat {' '.join(map(str, args))} failed ({p.returncode}):\n"
                             f"{p.stderr[-3000:]}")
    return p


@pytest.fixture(scope="module")
def env(tmp_path_factory, bin_path):
    for what, ok in (("mpirun (openmpi-bin)", MPIRUN), (f"pretrained model at {MODEL}", os.path.isdir(MODEL))):
        if not ok:
            if os.environ.get("CI"):
                pytest.fail(f"{what} not found")
            pytest.skip(f"{what} not found")
    if "MPI: not in this build" in run_bq("--version").stdout:
        pytest.fail("bertqat was built without MPI although mpirun is installed (install libopenmpi-dev)")
    d = tmp_path_factory.mktemp("mpi")
    rng = random.Random(11)
    pos = "good great wonderful superb lovely fine excellent".split()
    neg = "bad awful terrible boring poor dull worst".split()
    with open(d / "data.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(200):
            lab = i % 2
            w.writerow([" ".join(rng.choice(pos if lab else neg) for _ in range(rng.randint(3, 40))), lab])
    return d


def common(env, out):
    return ["--model", MODEL, "--data", env / "data.csv", "--out", out, "--max-seq-len", 32, "--train-samples", 160,
            "--val-fraction", 0.2, "--lr", 1e-4, "--threads", 1, "--log-every", 1, "--cache-dir", env / "cache"]


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


def first_difference(name, x, y):
    """One line on how two same-shaped arrays differ: how many elements, the largest |difference| and the
    first differing pair, so a NaN against a number shows as such."""
    fx, fy = x.reshape(-1), y.reshape(-1)
    if x.dtype.kind == "f":
        differ = np.flatnonzero(fx.view(f"u{fx.itemsize}") != fy.view(f"u{fy.itemsize}"))
        d = np.abs(fx[differ].astype(np.float64) - fy[differ])
        worst = f"max |diff| {np.nanmax(d) if np.isfinite(d).any() else float('nan')}, "
    else:
        differ, worst = np.flatnonzero(fx != fy), ""
    i = int(differ[0])
    return f"{name}: {differ.size} of {fx.size} elements differ, {worst}first at {i}: {fx[i]!r} vs {fy[i]!r}"


def assert_same_tensors(a, b, prefix=""):
    """Every dataset under prefix holds the same bytes in both files. Bytes and not values: a float
    comparison passes a NaN against a finite number whenever the NaN enters a max() or a comparison
    that NaN makes false, and misses -0.0 against 0.0; ranks that compute the same thing write the
    same bits."""
    da, db = datasets(a), datasets(b)
    names = sorted(n for n in da if n.startswith(prefix))
    other = sorted(n for n in db if n.startswith(prefix))
    assert names and names == other, f"tensors only in {a}: {sorted(set(names) - set(other))}, only in {b}: " \
                                     f"{sorted(set(other) - set(names))}"
    bad = []
    for n in names:
        x, y = np.asarray(da[n]), np.asarray(db[n])
        assert x.dtype == y.dtype and x.shape == y.shape, f"{n}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}"
        if x.tobytes() != y.tobytes():
            bad.append(first_difference(n, x, y))
    print(f"{a} vs {b}: {len(names)} tensors, {len(bad)} differ")
    assert not bad, f"{len(bad)} of {len(names)} tensors differ:\n" + "\n".join(bad[:10])


def log_rows(folder):
    rows = []
    for line in open(os.path.join(folder, "training_log.jsonl")):
        r = json.loads(line)
        rows.append({k: r.get(k) for k in ("type", "step", "loss", "lr", "grad_norm", "accuracy", "f1")})
    return rows


@pytest.fixture(scope="module")
def finetuned(env):
    one, two = env / "ga2", env / "np2"
    steps = ["--max-steps", 20, "--eval-every", 10, "--no-save-best"]
    run_bq("finetune", *common(env, one), *steps, "--batch-size", 8, "--grad-accum", 2)
    p = run_mpi(2, "finetune", *common(env, two), *steps, "--batch-size", 16)
    return one, two, p


def test_finetune_two_ranks_bit_identical_to_grad_accum(finetuned):
    one, two, p = finetuned
    assert log_rows(one) == log_rows(two)
    assert len([r for r in log_rows(two) if r["type"] == "train"]) == 20
    assert_same_tensors(one / "model.h5", two / "model.h5")
    assert_same_tensors(one / "training_state.h5", two / "training_state.h5")
    # rank 0 alone prints: one summary line
    assert p.stdout.count("finetune: 20 steps") == 1, p.stdout


def test_batch_not_divisible_is_refused(env):
    p = run_mpi(2, "finetune", *common(env, env / "odd"), "--max-steps", 1, "--batch-size", 7, check=False)
    assert p.returncode == 2
    assert p.stderr.count("--batch-size 7") == 1, p.stderr
    assert not os.path.exists(env / "odd")


def test_calibrate_and_eval_equal_one_process(env, finetuned):
    one = finetuned[0]
    cal = ["--data", env / "data.csv", "--calib-samples", 72, "--batch-size", 8, "--threads", 1,
           "--cache-dir", env / "cache", "--calibrator", "percentile"]
    run_bq("calibrate", "--model", one, "--out", env / "cal1", *cal)
    run_mpi(2, "calibrate", "--model", one, "--out", env / "cal2", *cal)
    assert_same_tensors(env / "cal1" / "model.h5", env / "cal2" / "model.h5", prefix="quant")
    ev = ["--model", env / "cal1", "--data", env / "data.csv", "--split", "train", "--batch-size", 8,
          "--threads", 1, "--cache-dir", env / "cache", "--json", "--engine", "fake-quant"]
    e1 = json.loads(run_bq("eval", *ev, "--predictions", env / "p1.tsv").stdout)
    e2 = json.loads(run_mpi(2, "eval", *ev, "--predictions", env / "p2.tsv").stdout)
    for k in ("examples", "accuracy", "precision", "recall", "f1", "confusion_matrix"):
        assert e1[k] == e2[k], k
    print("eval loss 1 process", e1["loss"], "2 ranks", e2["loss"])
    assert abs(e1["loss"] - e2["loss"]) <= 1e-12 * max(1.0, abs(e1["loss"]))  # a sum in another order
    assert open(env / "p1.tsv").read() == open(env / "p2.tsv").read()
    assert e1["examples"] == len(open(env / "p2.tsv").readlines())


def test_bad_input_fails_all_ranks_once(env):
    (env / "bad.csv").write_text('text,label\n"unterminated,1\n')
    t0 = time.time()
    p = run_mpi(2, "finetune", "--model", MODEL, "--data", env / "bad.csv", "--out", env / "bad", "--threads", 1,
                "--batch-size", 8, "--max-steps", 2, "--cache-dir", env / "cache", check=False, timeout=300)
    print(p.stderr[-2000:], f"{time.time() - t0:.1f}s")
    assert p.returncode != 0
    assert p.stderr.count("bad.csv:2") == 1, p.stderr
    assert not os.path.exists(env / "bad")


def bertqat_pids(parent):
    """PIDs of the ranks: processes running BIN whose parent is mpirun (or its daemon)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            exe = os.readlink(f"/proc/{d}/exe")
            stat = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        if os.path.realpath(exe) == os.path.realpath(BIN) and int(stat.rsplit(")", 1)[1].split()[1]) == parent:
            out.append(int(d))
    return sorted(out)


def kill_rank_when_saved(argv, path, limit):
    """Starts `mpirun -np 2 bertqat ARGV`, SIGKILLs rank 1 once `path` exists and requires the job to end
    within `limit` seconds; returns the finished Popen, the pids of the ranks and the time of the kill."""
    p = subprocess.Popen([*mpirun_cmd(2), BIN, *map(str, argv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    deadline = time.time() + 900
    while time.time() < deadline and p.poll() is None and not os.path.exists(path):
        time.sleep(0.05)
    ranks = bertqat_pids(p.pid)
    assert p.poll() is None and len(ranks) == 2, f"ranks {ranks}, exit {p.poll()}"
    os.kill(ranks[-1], signal.SIGKILL)
    t0 = time.time()
    try:
        p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError(f"the job did not end within {limit} s of a killed rank")
    return p, ranks, t0


def saved_step(out):
    """The optimizer step of the training state in OUT, the step a --resume continues after."""
    with h5py.File(out / "training_state.h5", "r") as f:
        return int(f.attrs["step"][0])


def assert_resumed(stderr, tag, saved, total):
    """The steps a --resume run logged (--log-every 1, rank 0's "[TAG] step S/TOTAL" lines) continue
    the checkpoint: the first is saved + 1 and only the total - saved remaining ones ran. A run that
    ignored --resume and trained from scratch would also end at step TOTAL and print the same summary,
    but would log every step from 1."""
    ran = [int(m) for m in re.findall(rf"^\[{tag}\] step (\d+)/{total} ", stderr, re.M)]
    print(f"checkpoint at step {saved}; the resumed run logged steps {ran[:3]}...{ran[-1:]}")
    assert 0 < saved < total, f"the checkpoint holds step {saved} of {total}: nothing left to resume"
    assert ran == list(range(saved + 1, total + 1)), \
        f"the resumed run logged steps {ran}, expected {saved + 1}..{total} after the checkpoint's step {saved}"


def test_killed_rank_stops_all_and_resume_works(env):
    out = env / "kill"
    args = [*common(env, out), "--max-steps", 40, "--eval-every", 2, "--batch-size", 16]
    p, ranks, t0 = kill_rank_when_saved(["finetune", *args], out / "training_state.h5", 30)
    waited = time.time() - t0
    print(f"job ended {waited:.1f}s after the kill, exit {p.returncode}")
    assert p.returncode != 0
    assert waited < 15
    def alive():
        left = []
        for r in ranks:
            try:
                if open(f"/proc/{r}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX":
                    left.append(r)
            except OSError:
                pass
        return left
    while alive() and time.time() - t0 < 15:
        time.sleep(0.1)
    print(f"every rank gone {time.time() - t0:.1f}s after the kill")
    assert not alive(), f"ranks still running: {alive()}"
    info = run_bq("info", out)
    assert "param" in info.stdout.lower()
    # The same run resumes with another number of processes (the data order depends on the step only).
    saved = saved_step(out)
    r = run_bq("finetune", *args, "--resume")
    assert "40 steps" in r.stdout
    assert_resumed(r.stderr, "finetune", saved, 40)
    steps = [x["step"] for x in log_rows(out) if x["type"] == "train"]
    assert steps[-1] == 40


def test_qat_observers(env, finetuned):
    """QAT with live observers (a min/max allreduce inside every training forward, sharded validation)
    under 2 ranks: after one step the ranges equal those of one process whose forward sees the whole batch
    of 16, bit for bit. The batch min and max are exact, so the min over the ranks of their shard minima is
    the batch minimum itself, and the observer's moving average starts from the same calibrated range. The
    one-process run sees the same activations (the forward of a row does not depend on the rows batched
    with it) because the texts are longer than --max-seq-len (no row is padded, so a shard of 8 rows has
    the batch's length), dropout is off (its masks are drawn per
    micro-batch), and the first step's forward runs before any weight update (later steps would differ
    in the last bits of the weights, whose gradient sums run in another order). A rank that skipped the
    allreduce keeps the range of its own shard."""
    one = finetuned[0]
    cal = env / "cal_qat"
    run_bq("calibrate", "--model", one, "--out", cal, "--data", env / "data.csv", "--calib-samples", 32,
           "--batch-size", 8, "--threads", 1, "--cache-dir", env / "cache")
    rng = random.Random(5)
    words = "good great wonderful superb bad awful terrible boring film plot acting".split()
    with open(env / "long.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(40):
            w.writerow([" ".join(rng.choice(words) for _ in range(rng.randint(40, 60))), i % 2])
    args = ["--model", cal, "--data", env / "long.csv", "--max-seq-len", 32, "--train-samples", 40,
            "--val-fraction", 0.2, "--lr", 1e-4, "--threads", 1, "--log-every", 1, "--cache-dir", env / "cache",
            "--ranges", "observe", "--dropout", 0, "--max-steps", 1, "--eval-every", 1, "--batch-size", 16]
    p = run_mpi(2, "qat", *args, "--out", env / "qat2", timeout=900)
    assert p.stdout.count("qat: 1 steps") == 1, p.stdout
    run_bq("qat", *args, "--out", env / "qat1")
    # The step observed (activation ranges moved from the calibrated ones, else the comparison below
    # would hold without any allreduce), and both runs moved them alike.
    before, after = datasets(cal / "model.h5"), datasets(env / "qat2" / "model.h5")
    moved = [n for n in after if n.startswith("quant/") and n.endswith("/observer_max")
             and not np.array_equal(before[n], after[n])]
    print(f"{len(moved)} observer maxima moved in the step")
    assert moved, "no observer range moved in the training step"
    assert_same_tensors(env / "qat1" / "model.h5", env / "qat2" / "model.h5", prefix="quant")


def test_sigusr1_saves_and_resumes(env):
    """SIGUSR1 to mpirun reaches every rank (Ctrl-C would have mpirun kill them): the ranks stop at the
    same step, rank 0 saves, the job exits 6 with one message, and the same command plus --resume
    finishes under 2 ranks."""
    out = env / "usr1"
    args = [*common(env, out), "--max-steps", 8, "--eval-every", 4, "--batch-size", 16]
    p = subprocess.Popen([*mpirun_cmd(2), BIN, "finetune", *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    log = out / "training_log.jsonl"
    deadline = time.time() + 900
    while time.time() < deadline and p.poll() is None and not (log.exists() and log.stat().st_size > 0):
        time.sleep(0.05)
    assert p.poll() is None, f"finished before the signal (exit {p.returncode})"
    p.send_signal(signal.SIGUSR1)
    _, err = p.communicate(timeout=600)
    assert p.returncode == 6, f"exit {p.returncode}: {err[-2000:]}"
    assert err.count("state saved in") == 1, err[-2000:]
    assert not os.path.exists(str(out) + ".tmp")
    saved = saved_step(out)
    r = run_mpi(2, "finetune", *args, "--resume", timeout=900)
    assert "8 steps" in r.stdout
    assert_resumed(r.stderr, "finetune", saved, 8)
    assert [x["step"] for x in log_rows(out) if x["type"] == "train"][-1] == 8


def test_sensitivity_equals_one_process(env, finetuned):
    """sensitivity shards its batches over the ranks (rank r: batches k with k mod N = r) and sums the
    per-example KL terms into one array before adding them in example order: the JSON (accuracies, KL,
    group order, forward count) equals the single-process one bit for bit; rank 0 alone writes."""
    cal = env / "cal_sens"
    run_bq("calibrate", "--model", finetuned[0], "--out", cal, "--data", env / "data.csv", "--calib-samples", 16,
           "--batch-size", 8, "--threads", 1, "--cache-dir", env / "cache")
    s = ["--model", cal, "--data", env / "data.csv", "--split", "val", "--samples", 24, "--batch-size", 8,
         "--max-seq-len", 32, "--threads", 1, "--cache-dir", env / "cache"]
    run_bq("sensitivity", *s, "--out", env / "sens1")
    p = run_mpi(2, "sensitivity", *s, "--out", env / "sens2", timeout=900)
    assert p.stdout.count("wrote ") == 1, p.stdout
    a = json.loads((env / "sens1" / "sensitivity.json").read_text())
    b = json.loads((env / "sens2" / "sensitivity.json").read_text())
    for j in (a, b):
        j.pop("seconds")
    assert a["examples"] == 20 and len(a["groups"]) > 10  # 3 batches: rank 0 runs two, rank 1 one
    assert a == b


def test_single_process_commands_refuse_mpirun(env):
    """Commands that are not data-parallel refuse mpirun with one line and exit 2 (no MPI_Abort)."""
    for cmd in (["info", MODEL], ["export", "--model", MODEL, "--out", env / "refused.onnx"]):
        p = run_mpi(2, *cmd, check=False, timeout=300)
        assert p.returncode == 2, p.stderr
        assert p.stderr.count("runs in one process, not under mpirun") == 1, p.stderr
        assert "MPI_ABORT" not in p.stderr
    assert not os.path.exists(env / "refused.onnx")


def test_qa_finetune_two_ranks_bit_identical(env):
    """finetune --task qa: each rank's share of a batch of SQuAD windows keeps its answer positions;
    2 ranks with --batch-size 8 equal 1 process with --batch-size 4 --grad-accum 2 bit for bit."""
    squad = os.path.join(DATA, "squad", "train-v1.1-rebuilt.json")
    if not os.path.exists(squad):
        if os.environ.get("CI"):
            pytest.fail(f"{squad} not found")
        pytest.skip(f"{squad} not found")
    qa = ["--task", "qa", "--model", MODEL, "--data", squad, "--train-samples", 32, "--max-seq-len", 96,
          "--doc-stride", 14, "--threads", 1, "--max-steps", 3, "--log-every", 1]
    run_bq("finetune", *qa, "--out", env / "qa1", "--batch-size", 4, "--grad-accum", 2)
    run_mpi(2, "finetune", *qa, "--out", env / "qa2", "--batch-size", 8, timeout=900)
    assert log_rows(env / "qa1") == log_rows(env / "qa2")
    assert_same_tensors(env / "qa1" / "model.h5", env / "qa2" / "model.h5")
