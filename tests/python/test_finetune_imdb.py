"""Learning floor of `bertqat finetune` + `bertqat eval` on IMDB at a small budget: all-MiniLM-L6-v2
(env BQ_MODEL_DIR) fine-tuned on 2000 training reviews (seq 128, 1 epoch) must reach accuracy >= 0.80
on 2000 seeded test reviews. Also checks the checkpoint layout, the JSONL training log, `predict` on
two obvious reviews, and that `--resume` of a finished run is a no-op (every dataset and attribute of
model.h5 and training_state.h5 and the bytes of every other file unchanged). Prints the timings."""
import hashlib
import json
import time

import h5py
import numpy as np

from conftest import FINETUNE_ARGS, IMDB, MODEL, THREADS, run_bq


def test_finetune_imdb(finetuned):
    out, _, t_train = finetuned
    for f in ("config.json", "vocab.txt", "model.h5", "training_state.h5", "training_log.jsonl"):
        assert (out / f).exists(), f"{f} missing from the checkpoint"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["bertqat"]["num_labels"] == 2 and cfg["id2label"]["1"] == "pos"
    lines = [json.loads(l) for l in (out / "training_log.jsonl").read_text().splitlines()]
    assert any(l["type"] == "train" for l in lines) and any(l["type"] == "eval" for l in lines)

    t0 = time.time()
    p = run_bq("eval", "--model", out, "--data", IMDB, "--split", "test", "--samples", 2000,
               "--max-seq-len", 128, "--threads", THREADS, "--json", timeout=3600)
    t_eval = time.time() - t0
    r = json.loads(p.stdout)
    print(f"\nfinetune {t_train:.1f}s, eval {t_eval:.1f}s ({r['examples_per_s']:.1f} ex/s), "
          f"accuracy {r['accuracy']:.4f} f1 {r['f1']:.4f}")
    assert r["examples"] == 2000
    assert sum(map(sum, r["confusion_matrix"])) == 2000
    assert r["accuracy"] >= 0.80, r

    p = run_bq("predict", "--model", out, "--threads", THREADS,
               input="This movie was wonderful, a true masterpiece with brilliant acting.\n"
                     "Terrible film. Boring, badly acted and a complete waste of time.\n")
    rows = [l.split("\t") for l in p.stdout.strip().splitlines()]
    assert [r[0] for r in rows] == ["pos", "neg"], p.stdout

    # a finished run resumes to a no-op: the weights, the optimizer state, the log and every other file
    # keep their content (HDF5 files are compared by content, since a rewrite with equal data may still
    # change bytes such as object timestamps)
    before = checkpoint_contents(out)
    assert any(k.startswith("model.h5:") and "weight" in k for k in before), sorted(before)[:10]
    run_bq("finetune", "--model", MODEL, "--data", IMDB, "--out", out, *FINETUNE_ARGS, "--resume", timeout=3600)
    after = checkpoint_contents(out)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    print(f"resume of the finished run: {len(before)} datasets/attributes/files compared, {len(changed)} differ")
    assert not changed, changed[:20]


def digest(value):
    """sha256 of an HDF5 value's dtype, shape and bytes."""
    a = np.asarray(value)
    if a.dtype.kind == "O":
        a = np.array([x.decode() if isinstance(x, bytes) else str(x) for x in a.ravel()], dtype=str)
    return hashlib.sha256(f"{a.dtype.str}{a.shape}".encode() + a.tobytes()).hexdigest()


def checkpoint_contents(d):
    """{"file:object[@attribute]": sha256} over every dataset and attribute of the .h5 files in d, and
    {"file": sha256 of its bytes} for the other files."""
    out = {}
    for f in sorted(d.iterdir()):
        if not f.is_file():
            continue
        if f.suffix != ".h5":
            out[f.name] = hashlib.sha256(f.read_bytes()).hexdigest()
            continue
        with h5py.File(f, "r") as h:
            def visit(name, obj):
                if isinstance(obj, h5py.Dataset):
                    out[f"{f.name}:{name}"] = digest(obj[()])
                for k, v in obj.attrs.items():
                    out[f"{f.name}:{name}@{k}"] = digest(v)
            visit("/", h)
            h.visititems(visit)
    return out
