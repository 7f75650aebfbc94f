"""Faults while writing (docs/training.md, "Output locks, full disks and kills"), on the committed tiny
BERT of tests/fixtures/bert_tiny (2 layers, hidden 32, a vocabulary written here), so that a run takes a
fraction of a second:
- full disk: a fine-tune saving over an earlier checkpoint under RLIMIT_FSIZE at 20 random byte limits
  (log-uniform below the size of the largest checkpoint file; SIGXFSZ keeps its default action, which
  bertqat ignores, so the write fails with EFBIG as on a full disk) exits 1 with one error line naming
  the file and the reason, and leaves the earlier checkpoint byte-identical and loadable, with no OUT.tmp
  and no lock file; calibrate, export and export-hf likewise at 3 limits each;
- two writers: while a fine-tune holds its output (stopped with SIGSTOP once it holds the lock), a
  second finetune, calibrate, qat and export-hf naming the same --out refuse at once with one line naming
  the output and the holder's pid, without touching it, and the first run then finishes intact; a lock
  held by another process refuses export, and the file it leaves behind blocks nothing;
- SIGKILL at 50 random moments, 10 each in finetune, qat, calibrate, export and the pipeline, each a
  fresh run over the output of the last (one moment drawn uniformly in each tenth of the measured length
  of an uninterrupted run; a moment after the run ended is drawn again): after each kill every output is
  absent, unchanged, or complete and loadable (a rewritten calibration or export equals that of an
  uninterrupted run); a killed fine-tune or QAT run resumes with --resume to a result bit-identical to the
  uninterrupted run's (training log included); the pipeline's running stage dies with the pipeline, and
  the rerun after the last kill completes with the uninterrupted run's checkpoints;
- a dying MPI rank: under mpirun -np 2 a rank SIGKILLed mid-run (rank 1, then rank 0 in the resumed job)
  ends the job with a non-zero exit and every rank gone within 30 s; the job resumed from the last
  checkpoint ends bit-identical to an uninterrupted 2-rank run.
Random choices come from BQ_FAULT_SEED (default 1127); each test prints the seed and its counts."""
import fcntl
import hashlib
import json
import math
import os
import random
import resource
import select
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

from conftest import BIN, ROOT, run_bq

h5py = pytest.importorskip("h5py")
np = pytest.importorskip("numpy")
onnx = pytest.importorskip("onnx")

SEED = int(os.environ.get("BQ_FAULT_SEED", "1127"))
TINY = os.path.join(ROOT, "tests", "fixtures", "bert_tiny")
WORDS = ["great", "bad", "movie", "film", "awful", "fine", "good", "boring", "plot", "acting", "loved", "hated"]
LIMITS = 20  # full-disk runs of the fine-tune
KILLS = 10   # SIGKILLs per command, 5 commands
MPIRUN = shutil.which("mpirun")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, bin_path):
    """The tiny model with a vocabulary, its data, and the reference runs every test starts from: an fp32
    fine-tune, its calibration and a QAT run, each with the seconds it took."""
    d = tmp_path_factory.mktemp("faults")
    model = d / "tiny_hf"
    model.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(TINY, f), model / f)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + list("abcdefghijklmnopqrstuvwxyz")
    vocab += [f"[unused{i}]" for i in range(128 - len(vocab))]
    (model / "vocab.txt").write_text("\n".join(vocab) + "\n")
    rng = random.Random(0)
    with open(d / "reviews.jsonl", "w") as f:
        for i in range(48):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(6)),
                                "label": ["neg", "neu", "pos"][i % 3]}) + "\n")
    t = {"dir": d, "model": model, "data": d / "reviews.jsonl"}
    t["ft"], t["ft_s"] = d / "ref_ft", timed(finetune_argv(t, d / "ref_ft", 2))
    t["ptq"], t["ptq_s"] = d / "ref_ptq", timed(calibrate_argv(t, d / "ref_ptq", 1))
    t["qat"], t["qat_s"] = d / "ref_qat", timed(qat_argv(t, d / "ref_qat", 2))
    return t


def timed(argv):
    t0 = time.time()
    run_bq(*argv)
    return time.time() - t0


def common(t):
    return ["--data", t["data"], "--max-seq-len", 16, "--threads", 1, "--no-cache"]


def finetune_argv(t, out, seed, steps=8):
    """8 steps, a checkpoint every 2 (4 saves, the last after the final evaluation)."""
    return ["finetune", "--model", t["model"], "--out", out, *common(t), "--batch-size", 8, "--max-steps", steps,
            "--eval-every", 2, "--seed", seed]


def calibrate_argv(t, out, seed):
    return ["calibrate", "--model", t["ft"], "--out", out, *common(t), "--calib-samples", 16, "--batch-size", 8,
            "--seed", seed]


def qat_argv(t, out, seed):
    return ["qat", "--model", t["ptq"], "--out", out, *common(t), "--batch-size", 8, "--max-steps", 8, "--eval-every",
            2, "--seed", seed]


def error_lines(stderr):
    """stderr without the progress lines ("[tag] ...")."""
    return [l for l in stderr.splitlines() if l.strip() and not l.startswith("[")]


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def ckpt_files(d):
    """{file: sha256} of the checkpoint in folder d, its live training log left out, or None when d holds
    no checkpoint (absent, or a training run's folder before its first save)."""
    d = str(d)
    if not os.path.isfile(os.path.join(d, "model.h5")):
        return None
    return {f: sha(os.path.join(d, f)) for f in sorted(os.listdir(d))
            if f != "training_log.jsonl" and os.path.isfile(os.path.join(d, f))}


def h5_all(path):
    """Every dataset of an HDF5 file read in full (HDF5 verifies each Fletcher-32 checksum) and the root
    attributes."""
    data = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: data.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
        attrs = {k: np.asarray(v) for k, v in f.attrs.items()}
    return data, attrs


def same_h5(a, b, what):
    (da, aa), (db, ab) = h5_all(a), h5_all(b)
    assert sorted(da) == sorted(db), f"{what}: datasets differ: {set(da) ^ set(db)}"
    bad = [n for n in da if not np.array_equal(da[n], db[n])]
    assert not bad, f"{what}: {len(bad)} of {len(da)} tensors differ, e.g. {bad[:3]}"
    for k in ("step", "epoch", "batch_cursor", "adam_step", "best_step", "best_accuracy", "rng"):
        if k in aa or k in ab:
            assert np.array_equal(aa.get(k), ab.get(k)), f"{what}: attribute {k} {aa.get(k)} != {ab.get(k)}"


def check_ckpt(d, training):
    """A complete checkpoint: its files are there, parse, every tensor passes its checksum, and bertqat
    loads it."""
    for f in ("config.json", "model.h5", "vocab.txt") + (("training_state.h5",) if training else ()):
        assert os.path.isfile(os.path.join(d, f)), f"{d}: {f} missing"
    json.load(open(os.path.join(d, "config.json")))
    h5_all(os.path.join(d, "model.h5"))
    if training:
        h5_all(os.path.join(d, "training_state.h5"))
    p = run_bq("info", d, check=False)
    assert p.returncode == 0, f"{d}: bertqat info failed: {p.stderr[-500:]}"


def state_of(d):
    """(seed, step, total_steps) of the training state in d, or None."""
    path = os.path.join(str(d), "training_state.h5")
    if not os.path.isfile(path):
        return None
    with h5py.File(path, "r") as f:
        return int(f.attrs["seed"][0]), int(f.attrs["step"][0]), int(f.attrs["total_steps"][0])


def log_rows(d):
    rows = []
    for line in open(os.path.join(str(d), "training_log.jsonl")):
        r = json.loads(line)
        rows.append(tuple(r.get(k) for k in ("type", "step", "loss", "lr", "grad_norm", "accuracy")))
    return rows


def step_seconds(d):
    """Seconds per training step of the finished run in d: the slope of elapsed_s over step between its log's
    first and last rows (evaluations and training rows alike)."""
    pts = sorted((r["step"], r["elapsed_s"]) for r in map(json.loads, open(os.path.join(str(d), "training_log.jsonl")))
                 if "step" in r and "elapsed_s" in r)
    assert len(pts) >= 2 and pts[-1][0] > pts[0][0], pts
    return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def run_killed(argv, delay, before_kill=None):
    """Runs bertqat ARGV and SIGKILLs it `delay` seconds after the start unless it ended before. Returns
    (killed, exit status, stderr, what before_kill(pid) returned just before the kill, the seconds the
    run took when it ended by itself)."""
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([BIN, *map(str, argv)], stdout=subprocess.DEVNULL, stderr=err, text=True)
        t0 = time.monotonic()
        fd = os.pidfd_open(p.pid)  # readable once the process has ended
        try:
            ended = bool(select.select([fd], [], [], delay)[0])
        finally:
            os.close(fd)
        took = time.monotonic() - t0
        seen = None
        if not ended:
            seen = before_kill(p.pid) if before_kill else None
            p.send_signal(signal.SIGKILL)
        p.wait(timeout=600)
        err.seek(0)
        return p.returncode == -signal.SIGKILL, p.returncode, err.read(), seen, took


def kill_loop(label, rng, seconds, next_argv, check):
    """KILLS runs of next_argv(), each a fresh run of the whole command, killed at a moment drawn
    uniformly from one of KILLS equal parts of [0, seconds], every part once in a random order (so that the
    end of a run, where it writes, is hit as often as its start); check(before, what before_kill returned)
    runs after each kill, `before` being what next_argv() returned with the argv. A run that ends before
    its moment must succeed and does not count: `seconds` becomes the length of that run, and the next
    run draws again in the same part. Returns (runs, kill moments)."""
    parts = list(range(KILLS))
    rng.shuffle(parts)
    kills, runs, moments = 0, 0, []
    while kills < KILLS:
        runs += 1
        assert runs <= 3 * KILLS, f"{label}: only {kills} of {runs} runs could be killed"
        argv, before = next_argv()
        delay = seconds * (parts[kills] + rng.random()) / KILLS
        killed, rc, err, seen, took = run_killed(argv, delay, getattr(check, "before_kill", None))
        if not killed:
            assert rc == 0, f"{label}: {' '.join(map(str, argv))} exit {rc}: {err[-2000:]}"
            seconds = min(seconds, took)
            continue
        kills += 1
        moments.append(round(delay, 3))
        check(before, seen)
    return runs, moments


# ---------------------------------------------------------------- full disk

def limited(limit):
    """preexec_fn: a file size limit of `limit` bytes (SIGXFSZ left at its default action)."""
    def pre():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return pre


def draw_limits(rng, n, largest):
    """n byte limits, log-uniform in [0, largest): every file of the output, small or large, is hit."""
    return sorted(int(math.exp(rng.uniform(0, math.log(largest)))) - 1 for _ in range(n))


def full_disk_run(argv, limit):
    return subprocess.run([BIN, *map(str, argv)], capture_output=True, text=True, timeout=600,
                          preexec_fn=limited(limit))


def assert_clean_failure(p, what, limit, out):
    lines = error_lines(p.stderr)
    assert p.returncode == 1, f"{what} at limit {limit}: exit {p.returncode} (1 wanted): {p.stderr[-1500:]}"
    assert len(lines) == 1 and "File too large" in lines[0], f"{what} at limit {limit}: {lines}"
    assert "HDF5" not in p.stderr, p.stderr[-1500:]
    assert not os.path.exists(str(out) + ".lock"), f"{what} at limit {limit}: lock file left"
    return lines[0]


def test_full_disk_leaves_previous_checkpoint(tiny):
    t0 = time.time()
    out = tiny["dir"] / "disk_ft"
    run_bq(*finetune_argv(tiny, out, 1, steps=4))
    old = ckpt_files(out)
    largest = max(os.path.getsize(out / f) for f in old)
    rng = random.Random(SEED)
    limits = draw_limits(rng, LIMITS, largest)
    files = {}
    for limit in limits:
        p = full_disk_run(finetune_argv(tiny, out, 2), limit)
        line = assert_clean_failure(p, "finetune", limit, out)
        assert f"{out}: not saved (the checkpoint there is unchanged)" in line, line
        assert ckpt_files(out) == old, f"limit {limit}: the earlier checkpoint changed: {line}"
        assert not os.path.exists(str(out) + ".tmp"), f"limit {limit}: {out}.tmp left behind"
        name = line.split(".tmp/")[-1].split(":")[0]
        files[name] = files.get(name, 0) + 1
    check_ckpt(out, training=True)
    ev = run_bq("eval", "--model", out, *common(tiny), "--samples", 8, "--json")
    assert '"accuracy"' in ev.stdout
    # without a limit the same save replaces the checkpoint: the limit alone made the runs fail
    run_bq(*finetune_argv(tiny, out, 2))
    assert ckpt_files(out) != old
    print(f"full disk: seed {SEED}, {len(limits)}/{LIMITS} runs failed with one line and left the earlier "
          f"checkpoint intact; limits {limits}; failing file {files}; {time.time() - t0:.1f}s")


def test_full_disk_other_writers(tiny):
    """calibrate over a PTQ checkpoint, export over an ONNX file and export-hf over an HF export: each
    fails with one line and leaves the earlier output byte-identical."""
    d, rng = tiny["dir"], random.Random(SEED + 1)
    hf = d / "disk_hf"
    run_bq("export-hf", "--model", tiny["ft"], "--out", hf)
    onnx_out = d / "disk.onnx"
    run_bq("export", "--model", tiny["qat"], "--out", onnx_out)
    ptq = d / "disk_ptq"
    run_bq(*calibrate_argv(tiny, ptq, 1))
    cases = [("calibrate", calibrate_argv(tiny, ptq, 2), ptq),
             ("export", ["export", "--model", tiny["qat"], "--out", onnx_out, "--cpu-layout"], onnx_out),
             ("export-hf", ["export-hf", "--model", tiny["qat"], "--out", hf], hf)]
    done = []
    for what, argv, out in cases:
        snap = (lambda: sha(out)) if os.path.isfile(out) else (lambda: ckpt_files(out) or {
            f: sha(out / f) for f in sorted(os.listdir(out))})
        old = snap()
        largest = os.path.getsize(out) if os.path.isfile(out) else max(os.path.getsize(out / f) for f in os.listdir(out))
        for limit in draw_limits(rng, 3, largest):
            p = full_disk_run(argv, limit)
            assert_clean_failure(p, what, limit, out)
            assert snap() == old, f"{what} at limit {limit}: the earlier output changed"
            assert not os.path.exists(str(out) + ".tmp"), f"{what} at limit {limit}: {out}.tmp left behind"
            done.append((what, limit))
    print(f"full disk, other writers: seed {SEED + 1}, {len(done)}/9 intact: {done}")


# ---------------------------------------------------------------- two writers

def test_second_writer_is_refused(tiny):
    d = tiny["dir"]
    out = d / "busy"
    lock = str(out) + ".lock"
    a = subprocess.Popen([BIN, *map(str, finetune_argv(tiny, out, 5, steps=24))], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and a.poll() is None:
        try:
            if open(lock).read().startswith(f"{a.pid} "):
                break
        except OSError:
            pass
        time.sleep(0.001)
    os.kill(a.pid, signal.SIGSTOP)
    refused = []
    try:
        assert a.poll() is None, f"the first writer ended before it was caught holding {lock}"
        snapshot = {f: sha(out / f) for f in os.listdir(out)} if os.path.isdir(out) else None
        for argv in (finetune_argv(tiny, out, 6), finetune_argv(tiny, str(out) + "/", 6),
                     calibrate_argv(tiny, out, 1), qat_argv(tiny, out, 1),
                     ["export-hf", "--model", tiny["ft"], "--out", out]):
            t0 = time.time()
            p = subprocess.run([BIN, *map(str, argv)], capture_output=True, text=True, timeout=30)
            lines = error_lines(p.stderr)
            assert p.returncode == 1 and len(lines) == 1, f"{argv[0]}: exit {p.returncode}: {p.stderr[-1500:]}"
            assert str(out) in lines[0] and f"pid {a.pid}, finetune" in lines[0] and "in use" in lines[0], lines[0]
            refused.append((argv[0], round(time.time() - t0, 2)))
        now = {f: sha(out / f) for f in os.listdir(out)} if os.path.isdir(out) else None
        assert now == snapshot, "a refused writer touched the output"
    finally:
        os.kill(a.pid, signal.SIGCONT)
    _, err = a.communicate(timeout=600)
    assert a.returncode == 0, err[-2000:]
    check_ckpt(out, training=True)
    assert state_of(out)[1:] == (24, 24)
    assert not os.path.exists(lock)
    print(f"two writers: {len(refused)} refused while the first held {out}: {refused}; the first finished intact")

    # a lock held by any other process refuses export; the file left after it is released blocks nothing
    onnx_out = d / "held.onnx"
    with open(str(onnx_out) + ".lock", "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        f.truncate(0)
        f.write(f"{os.getpid()} pytest\n")
        f.flush()
        p = run_bq("export", "--model", tiny["qat"], "--out", onnx_out, check=False)
        lines = error_lines(p.stderr)
        assert p.returncode == 1 and len(lines) == 1 and f"pid {os.getpid()}, pytest" in lines[0], p.stderr
        assert not os.path.exists(onnx_out)
    assert os.path.exists(str(onnx_out) + ".lock")  # left behind, its holder gone
    run_bq("export", "--model", tiny["qat"], "--out", onnx_out)
    onnx.load(str(onnx_out))
    assert not os.path.exists(str(onnx_out) + ".lock")


# ---------------------------------------------------------------- SIGKILL

def train_kills(label, argv_of, out, ref, seconds, rng):
    """Fresh runs of a training command (seed 2) over `out`, each killed: afterwards `out` holds the old
    checkpoint or a complete new one, and when that is a checkpoint of this run, `--resume` finishes it
    and the result equals the uninterrupted run `ref` bit for bit, log included (the log of an old
    checkpoint is the one the killed run started, so it is compared only after a new save or a resume)."""
    count = {"old": 0, "new": 0, "resumed": 0}

    def next_argv():
        return argv_of(out), ckpt_files(out)

    def check(before, _):
        after = ckpt_files(out)
        if after == before:
            count["old"] += 1
        else:
            check_ckpt(out, training=True)
            count["new"] += 1
        st = state_of(out)
        if st is None or st[0] != 2:
            return  # nothing of this run to resume
        resumed = st[1] < st[2]
        if resumed:
            run_bq(*argv_of(out), "--resume")
            count["resumed"] += 1
        same_h5(out / "model.h5", ref / "model.h5", f"{label} model")
        same_h5(out / "training_state.h5", ref / "training_state.h5", f"{label} training state")
        if resumed or after != before:
            assert log_rows(out) == log_rows(ref), f"{label}: the log differs from the uninterrupted run's"

    runs, moments = kill_loop(label, rng, seconds, next_argv, check)
    print(f"SIGKILL {label}: seed {SEED}, {KILLS}/{KILLS} killed runs left the old ({count['old']}) or a complete "
          f"new ({count['new']}) checkpoint, {runs} runs; moments (s) {moments}; {count['resumed']} resumed to "
          f"the uninterrupted run's result bit for bit")
    return count


def test_sigkill_finetune(tiny):
    out = tiny["dir"] / "kill_ft"
    run_bq(*finetune_argv(tiny, out, 1, steps=4))  # an earlier checkpoint the first runs start over
    train_kills("finetune", lambda o: finetune_argv(tiny, o, 2), out, tiny["ft"], tiny["ft_s"],
                random.Random(SEED + 10))


def test_sigkill_qat(tiny):
    train_kills("qat", lambda o: qat_argv(tiny, o, 2), tiny["dir"] / "kill_qat", tiny["qat"], tiny["qat_s"],
                random.Random(SEED + 11))


def test_sigkill_calibrate(tiny):
    """Runs alternate between two seeds, so each replaces a different calibration; a changed output must
    equal the uninterrupted calibration of the seed that wrote it."""
    d, rng = tiny["dir"], random.Random(SEED + 12)
    ref2 = d / "ref_ptq2"
    run_bq(*calibrate_argv(tiny, ref2, 2))
    refs = {1: tiny["ptq"], 2: ref2}
    out, turn, count = d / "kill_ptq", [0], {"absent": 0, "old": 0, "new": 0}
    shutil.copytree(refs[1], out)  # the first run (seed 2) replaces seed 1's calibration

    def next_argv():
        turn[0] += 1
        return calibrate_argv(tiny, out, 1 + turn[0] % 2), ckpt_files(out)

    def check(before, _):
        after = ckpt_files(out)
        if after == before:
            count["absent" if after is None else "old"] += 1
            return
        check_ckpt(out, training=False)
        same_h5(out / "model.h5", refs[1 + turn[0] % 2] / "model.h5", "calibrate")
        count["new"] += 1

    runs, moments = kill_loop("calibrate", rng, tiny["ptq_s"], next_argv, check)
    print(f"SIGKILL calibrate: seed {SEED + 12}, {KILLS}/{KILLS} killed runs left no output ({count['absent']}), the "
          f"old one ({count['old']}) or the complete new one ({count['new']}); {runs} runs; moments (s) {moments}")


def test_sigkill_export(tiny):
    """Runs alternate between the default and the CPU layout; the file is always absent, the previous
    one, or byte for byte the uninterrupted export of the run that wrote it."""
    d, rng = tiny["dir"], random.Random(SEED + 13)
    variants = [[], ["--cpu-layout"]]
    refs, seconds = [], 0.0
    for i, v in enumerate(variants):
        path = d / f"ref_export{i}.onnx"
        seconds = max(seconds, timed(["export", "--model", tiny["qat"], "--out", path, *v]))
        refs.append(sha(path))
    assert refs[0] != refs[1]
    out, turn, count = d / "kill.onnx", [0], {"absent": 0, "old": 0, "new": 0}
    shutil.copy(d / "ref_export0.onnx", out)  # the first run (CPU layout) replaces the default layout

    def next_argv():
        turn[0] += 1
        return ["export", "--model", tiny["qat"], "--out", out, *variants[turn[0] % 2]], \
            sha(out) if os.path.exists(out) else None

    def check(before, _):
        after = sha(out) if os.path.exists(out) else None
        if after == before:
            count["absent" if after is None else "old"] += 1
            return
        assert after == refs[turn[0] % 2], "a killed export left a file that is neither the old nor the new one"
        onnx.checker.check_model(onnx.load(str(out)))
        count["new"] += 1

    runs, moments = kill_loop("export", rng, seconds, next_argv, check)
    print(f"SIGKILL export: seed {SEED + 13}, {KILLS}/{KILLS} killed runs left no file ({count['absent']}), the old "
          f"one ({count['old']}) or the complete new one ({count['new']}); {runs} runs; moments (s) {moments}")


def pipeline_argv(tiny, out, force=False):
    return ["pipeline", "--model", tiny["model"], "--data", tiny["data"], "--out", out, "--train-samples", 48,
            "--eval-samples", 16, "--max-seq-len", 16, "--batch-size", 8, "--calib-samples", 16, "--epochs", 1,
            "--qat-epochs", 1, "--bench-rounds", 1, "--bench-batch-sizes", 1, "--threads", 1,
            "--python", "/nonexistent"] + (["--force"] if force else [])


def children(pid):
    try:
        return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []


def alive(pids):
    left = []
    for p in pids:
        try:
            if open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX":
                left.append(p)
        except OSError:
            pass
    return left


def run_dir_state(run):
    """What the pipeline has written: checkpoint folders by their files, everything else by its bytes."""
    state = {}
    for stage in ("fp32", "ptq", "qat"):
        state[stage] = ckpt_files(run / stage)
    if os.path.isdir(run):
        for f in os.listdir(run):
            if os.path.isfile(run / f) and not f.endswith((".tmp", ".lock")):
                state[f] = sha(run / f)
    return state


def check_run_dir(run, before):
    """Every output of the run folder is absent, unchanged or complete."""
    after = run_dir_state(run)
    for stage in ("fp32", "ptq", "qat"):
        if after[stage] is not None and after[stage] != before.get(stage):
            check_ckpt(run / stage, training=stage != "ptq")
    for f, h in after.items():
        if f in ("fp32", "ptq", "qat") or h == before.get(f):
            continue
        path = run / f
        if f.endswith(".onnx"):
            onnx.checker.check_model(onnx.load(str(path)))
        elif f.endswith(".json") or f.startswith(".done-"):
            json.load(open(path))
        elif f.endswith(".tsv"):
            lines = open(path).read().splitlines()
            assert lines and all(len(l.split()) == 4 for l in lines), f"{path}: a line is cut short"
        elif f == "report.md":
            assert "## Training curves" in open(path).read(), f"{path} is cut short"


def test_sigkill_pipeline(tiny):
    """Each run redoes every stage (--force) over the outputs of the last, so a kill can leave old and new
    outputs side by side, but each whole; the rerun after the last kill resumes and completes."""
    d, rng = tiny["dir"], random.Random(SEED + 14)
    ref = d / "ref_run"
    seconds = timed(pipeline_argv(tiny, ref))
    run, with_stage = d / "kill_run", []

    def next_argv():
        return pipeline_argv(tiny, run, force=True), run_dir_state(run)

    def check(before, stages):
        # the stage running when the pipeline was killed dies with it
        deadline = time.time() + 10
        while alive(stages or []) and time.time() < deadline:
            time.sleep(0.01)
        assert not alive(stages or []), f"stages {alive(stages)} outlived the killed pipeline"
        with_stage.extend(stages[:1] if stages else [])
        check_run_dir(run, before)

    check.before_kill = children
    runs, moments = kill_loop("pipeline", rng, seconds, next_argv, check)
    assert with_stage, "no kill found a stage running"
    run_bq(*pipeline_argv(tiny, run))
    assert os.path.isfile(run / "report.md")
    for stage, training in (("fp32", True), ("ptq", False), ("qat", True)):
        same_h5(run / stage / "model.h5", ref / stage / "model.h5", f"pipeline {stage}")
        if training:
            assert log_rows(run / stage) == log_rows(ref / stage), f"pipeline {stage}: the log differs"
    assert sorted(f for f in os.listdir(run) if f.startswith(".done-")) == \
        sorted(f for f in os.listdir(ref) if f.startswith(".done-"))
    print(f"SIGKILL pipeline: seed {SEED + 14}, {KILLS}/{KILLS} killed runs left every output absent, unchanged or "
          f"complete; {len(with_stage)} kills found a stage running and none outlived its pipeline; {runs} runs of an uninterrupted {seconds:.1f}s; moments (s) "
          f"{moments}; the rerun completes with the uninterrupted run's checkpoints")


# ---------------------------------------------------------------- a dying MPI rank

def mpirun_cmd(n):
    cmd = [MPIRUN, "--oversubscribe", "-np", str(n)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return cmd


def ranks_of(mpirun_pid):
    """{MPI rank: pid} of the bertqat processes mpirun started."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            if os.path.realpath(os.readlink(f"/proc/{d}/exe")) != os.path.realpath(BIN):
                continue
            if int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1]) != mpirun_pid:
                continue
            env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        for e in env:
            if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                out[int(e.split(b"=", 1)[1])] = int(d)
    return out


def mpi_kill(argv, rank, ready, delay, limit=30):
    """Starts mpirun -np 2 bertqat ARGV; once ready() holds, waits `delay` seconds and SIGKILLs `rank`.
    Requires mpirun to exit non-zero and both ranks to be gone within `limit` seconds of the kill;
    returns those seconds."""
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([*mpirun_cmd(2), BIN, *map(str, argv)], stdout=subprocess.DEVNULL, stderr=err, text=True)
        deadline = time.time() + 300
        ranks = {}
        while time.time() < deadline and p.poll() is None and not (len(ranks) == 2 and ready()):
            ranks = ranks_of(p.pid)
            time.sleep(0.01)
        time.sleep(delay)
        assert p.poll() is None and len(ranks) == 2, f"ranks {ranks}, mpirun ended ({p.returncode}) before the kill"
        os.kill(ranks[rank], signal.SIGKILL)
        t0 = time.time()
        try:
            p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            p.kill()
            raise AssertionError(f"the job did not end within {limit} s of killing rank {rank}")
        while alive(ranks.values()) and time.time() - t0 < limit:
            time.sleep(0.05)
        took = time.time() - t0
        err.seek(0)
        assert p.returncode != 0, f"mpirun exit 0 after rank {rank} was killed: {err.read()[-1500:]}"
        assert not alive(ranks.values()), f"ranks {alive(ranks.values())} still running {limit} s after the kill"
        return took


def test_dying_rank_ends_job_and_resumes_bit_identical(tiny):
    if not MPIRUN:
        pytest.fail("mpirun (openmpi-bin) not found") if os.environ.get("CI") else pytest.skip("mpirun not found")
    if "MPI: not in this build" in run_bq("--version").stdout:
        pytest.fail("bertqat was built without MPI although mpirun is installed (install libopenmpi-dev)")
    d, rng = tiny["dir"], random.Random(SEED + 20)
    ref, out = d / "mpi_ref", d / "mpi_kill"
    # a step of the tiny model takes milliseconds, as long as the killer's poll of the checkpoint: 90 steps
    # leave the resumed job room to be killed before its last checkpoint
    steps = 90

    def argv(o):
        return ["finetune", "--model", tiny["model"], "--out", o, *common(tiny), "--batch-size", 8, "--max-steps",
                steps, "--eval-every", 3, "--seed", 3]

    t0 = time.time()
    p = subprocess.run([*mpirun_cmd(2), BIN, *map(str, argv(ref))], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    seconds, step = time.time() - t0, step_seconds(ref)
    # rank 1 dies within 12 steps of the first checkpoint (step 3), rank 0 within 1.5 steps of the resumed job's
    # next checkpoint (delays in the reference's step time: its whole time, MPI start-up included, varies more
    # from run to run than its steps do)
    took1 = mpi_kill(argv(out), 1, lambda: state_of(out) is not None, rng.uniform(0, 12 * step))
    first = state_of(out)
    assert first is not None and first[1] < steps, first
    check_ckpt(out, training=True)
    took2 = mpi_kill(argv(out) + ["--resume"], 0, lambda: (state_of(out) or (0, 0))[1] > first[1],
                     rng.uniform(0, 1.5 * step))
    second = state_of(out)
    assert second[1] < steps, f"the resumed job finished before rank 0 was killed ({second})"
    check_ckpt(out, training=True)
    p = subprocess.run([*mpirun_cmd(2), BIN, *map(str, argv(out) + ["--resume"])], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    same_h5(out / "model.h5", ref / "model.h5", "2-rank model")
    same_h5(out / "training_state.h5", ref / "training_state.h5", "2-rank training state")
    assert log_rows(out) == log_rows(ref)
    print(f"dying rank: seed {SEED + 20}, rank 1 killed at step {first[1]}: job ended in {took1:.1f}s; rank 0 "
          f"killed at step {second[1]}: job ended in {took2:.1f}s; resumed to {steps} steps bit-identical to the "
          f"uninterrupted 2-rank run ({seconds:.1f}s, {step:.3f}s a step)")
