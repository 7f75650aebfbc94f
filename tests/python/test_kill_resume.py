"""Kill test: SIGKILL a fine-tune while it is writing a checkpoint (OUT.tmp exists), then
require that the previous checkpoint in OUT still loads and evaluates, and that `--resume` finishes
the run. Also SIGINT: the trainer saves a resumable checkpoint, exits non-zero and says how to
resume; the resumed run completes."""
import os
import signal
import subprocess
import time

from conftest import BIN, IMDB, MODEL, run_bq

ARGS = ["--data", IMDB, "--train-samples", "320", "--eval-samples", "16", "--val-fraction", "0.1",
        "--max-seq-len", "32", "--batch-size", "8", "--eval-every", "3", "--log-every", "1", "--seed", "7"]


def finetune(out, *extra):
    return subprocess.Popen([BIN, "finetune", "--model", MODEL, "--out", out, *ARGS, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigkill_during_checkpoint_write(tmp_path):
    out = str(tmp_path / "ft")
    p = finetune(out)
    killed_at = None
    deadline = time.time() + 900
    # Wait for a first complete checkpoint, then for the next checkpoint write to begin.
    while time.time() < deadline and p.poll() is None:
        if os.path.exists(os.path.join(out, "model.h5")) and os.path.exists(out + ".tmp"):
            p.send_signal(signal.SIGKILL)
            killed_at = time.time()
            break
        time.sleep(0.002)
    p.wait()
    assert killed_at is not None, f"never caught a checkpoint write in progress (exit {p.returncode}): {p.stderr.read()[-2000:]}"
    assert p.returncode == -signal.SIGKILL
    # The previous checkpoint is intact and usable.
    info = run_bq("info", out)
    assert "params" in info.stdout.lower() or "parameters" in info.stdout.lower()
    ev = run_bq("eval", "--model", out, "--data", IMDB, "--split", "test", "--samples", "16", "--max-seq-len", "32", "--json")
    assert '"accuracy"' in ev.stdout
    # Resume finishes the run.
    r = finetune(out, "--resume")
    _, err = r.communicate(timeout=1800)
    assert r.returncode == 0, err[-3000:]
    assert not os.path.exists(out + ".tmp")


def test_sigint_saves_and_resumes(tmp_path):
    out = str(tmp_path / "ft")
    p = finetune(out)
    deadline = time.time() + 900
    while time.time() < deadline and p.poll() is None:  # interrupt once training has logged a step
        if os.path.exists(os.path.join(out, "training_log.jsonl")) and os.path.getsize(os.path.join(out, "training_log.jsonl")) > 0:
            p.send_signal(signal.SIGINT)
            break
        time.sleep(0.01)
    _, err = p.communicate(timeout=900)
    assert p.returncode == 6, f"exit {p.returncode} (want 6: interrupted, state saved): {err[-2000:]}"
    assert "--resume" in err, err[-2000:]
    assert os.path.exists(os.path.join(out, "training_state.h5"))
    r = finetune(out, "--resume")
    _, err = r.communicate(timeout=1800)
    assert r.returncode == 0, err[-3000:]
