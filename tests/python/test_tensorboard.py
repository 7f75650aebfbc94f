"""TensorBoard logs: `finetune --logdir` writes standard event files that the `tensorboard`
Python package reads back (its record reader checks the masked CRC32C of every length and payload),
with the train loss, learning rate and tokens/s of every logged step and the eval accuracy of every
evaluation, equal to the JSONL training log's values."""
import glob
import json
import os

from conftest import IMDB, MODEL, run_bq


def test_tensorboard_event_files(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, logdir = tmp_path / "ft", tmp_path / "tb"
    run_bq("finetune", "--model", MODEL, "--data", IMDB, "--out", out, "--logdir", logdir,
           "--train-samples", 80, "--val-fraction", 0.2, "--max-steps", 4, "--eval-every", 2, "--log-every", 1,
           "--batch-size", 8, "--max-seq-len", 32, "--seed", 3, timeout=900)
    files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    assert len(files) == 1, files

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for t in ("train/loss", "train/learning_rate", "train/tokens_per_s", "eval/accuracy"):
        assert t in tags, (t, tags)

    log = [json.loads(l) for l in (out / "training_log.jsonl").read_text().splitlines()]
    train = {r["step"]: r for r in log if r["type"] == "train"}
    evals = {r["step"]: r for r in log if r["type"] == "eval"}
    loss = {e.step: e.value for e in acc.Scalars("train/loss")}
    lr = {e.step: e.value for e in acc.Scalars("train/learning_rate")}
    tps = {e.step: e.value for e in acc.Scalars("train/tokens_per_s")}
    ev = {e.step: e.value for e in acc.Scalars("eval/accuracy")}
    print(f"\nsteps {sorted(loss)}; loss {loss}; eval accuracy {ev}")
    assert sorted(loss) == sorted(train) == [1, 2, 3, 4]
    for s, r in train.items():
        assert abs(loss[s] - r["loss"]) <= 1e-6 * max(1.0, abs(r["loss"])), (s, loss[s], r["loss"])
        assert abs(lr[s] - r["lr"]) <= 1e-6 * max(1e-12, abs(r["lr"])) + 1e-12, (s, lr[s], r["lr"])
        assert tps[s] > 0
    assert sorted(ev) == sorted(evals) and len(ev) >= 2, (ev, evals)
    for s, r in evals.items():
        assert abs(ev[s] - r["accuracy"]) < 1e-6, (s, ev[s], r["accuracy"])
