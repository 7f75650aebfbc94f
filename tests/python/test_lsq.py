"""`qat --ranges learn` (learned step sizes, LSQ; layers/quant.h, docs/quantization.md) end to end on the
tiny 2-layer BERT of tests/fixtures/bert_tiny (hidden 32, random weights, 3 labels; a vocabulary written
here) and a CSV of sentiment words made here, for the cpu and ort schemes:
- PTQ (calibrate), then `qat --ranges learn --range-lr 0.01` from it: it trains, says so, and every
  quantizer's scale in model.h5 differs from the PTQ checkpoint's (amax = scale·qmax follows);
- config.json records "ranges": "learn" and the range lr, `info` prints the range mode and marks each
  quantizer "learned"; training_state.h5 holds the scales' AdamW moments (/lsq/m, /lsq/v);
- the ONNX export's Q/DQ scale initializers equal the learned scales bit for bit (weights: <weight>_scale;
  activations: <quantizer>.scale_<k>), and ONNX Runtime runs it with bertqat's logits on the export's
  batch (--dump-logits; optimizations off, the Q/DQ semantics) within 1e-4;
- `qat --ranges fixed` from the learned checkpoint keeps its scales exactly (learning is off again);
- bad values: --range-lr 0, -0.5, 2, abc, --range-lr without --ranges learn, --ranges learn with
  --freeze-ranges-after, and `pipeline --qat-ranges sometimes` / `--qat-range-lr` without learn: one-line
  errors naming the flag, non-zero exit, no output directory."""
import csv
import json
import os
import random
import shutil

import pytest

from conftest import ROOT, THREADS, run_bq

h5py = pytest.importorskip("h5py")
np = pytest.importorskip("numpy")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
numpy_helper = pytest.importorskip("onnx.numpy_helper")

POS = "great wonderful superb lovely excellent fantastic moving".split()
NEG = "awful terrible boring dreadful poor horrible dull".split()
FILL = "the film was shown in a small town hall on rainy evening".split()
TINY = os.path.join(ROOT, "tests", "fixtures", "bert_tiny")


@pytest.fixture(scope="module")
def env(tmp_path_factory, bin_path):
    d = tmp_path_factory.mktemp("lsq")
    model = d / "tiny"
    model.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(TINY, f), model / f)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + POS + NEG + FILL
    vocab += [f"w{i}" for i in range(128 - len(vocab))]
    (model / "vocab.txt").write_text("\n".join(vocab) + "\n")
    rng = random.Random(16)
    with open(d / "data.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "label"])
        for i in range(160):  # the fixture's three labels: negative, neutral (no sentiment word), positive
            lab = i % 3
            words = [rng.choice(FILL) for _ in range(rng.randint(3, 12))]
            for _ in range(rng.randint(1, 3) if lab != 1 else 0):
                words.insert(rng.randint(0, len(words)), rng.choice(POS if lab == 2 else NEG))
            w.writerow([" ".join(words), lab])
    common = ["--data", d / "data.csv", "--cache-dir", d / "cache", "--threads", THREADS, "--max-seq-len", 24]
    run_bq("finetune", "--model", model, "--out", d / "ft", "--max-steps", 10, "--batch-size", 16, "--lr", 3e-3,
           "--val-fraction", 0.2, *common)
    return {"dir": d, "ft": d / "ft", "common": common}


def scales(ckpt):
    with h5py.File(ckpt / "model.h5", "r") as f:
        return {k: (f["quant"][k]["scale"][...].astype(np.float32), f["quant"][k]["amax"][...].astype(np.float32),
                    int(f["quant"][k].attrs["bits"])) for k in f["quant"]}


@pytest.mark.parametrize("scheme", ["cpu", "ort"])
def test_learned_ranges(env, tmp_path, scheme):
    d, common = env["dir"], env["common"]
    ptq = tmp_path / "ptq"
    run_bq("calibrate", "--model", env["ft"], "--out", ptq, "--scheme", scheme, "--calib-samples", 32, *common)
    qat = tmp_path / "qat"
    p = run_bq("qat", "--model", ptq, "--out", qat, "--ranges", "learn", "--range-lr", 0.01, "--max-steps", 6,
               "--batch-size", 16, "--lr", 1e-3, "--val-fraction", 0.2, "--evals-per-epoch", 2, *common)
    assert "ranges: learned (LSQ)" in p.stderr and "range lr 0.01" in p.stderr, p.stderr
    assert "ranges learned" in p.stdout, p.stdout

    before, after = scales(ptq), scales(qat)
    assert before.keys() == after.keys() and len(after) > 0
    moved = 0
    for k, (s, a, bits) in after.items():
        s0 = before[k][0]
        assert s.shape == s0.shape and np.all(s > 0), k
        moved += int(np.any(s != s0))
        qmax = np.float32(2 ** (bits - 1) - 1)
        assert np.array_equal(a, s * qmax), k  # amax follows the learned scale
    print(f"{scheme}: {moved}/{len(after)} quantizers' scales moved")
    assert moved == len(after)

    cfg = json.loads((qat / "config.json").read_text())["bertqat"]["quant"]
    assert cfg["ranges"] == "learn" and abs(cfg["range_lr"] - 0.01) < 1e-9, cfg
    with h5py.File(qat / "training_state.h5", "r") as f:
        n = sum(v[0].size for v in after.values())
        assert f["lsq"]["m"].shape == (n,) and f["lsq"]["v"].shape == (n,)
        assert np.any(f["lsq"]["v"][...] > 0)
    info = run_bq("info", qat).stdout
    assert "ranges       learned (--ranges learn, LSQ), range lr 0.01" in info, info
    rows = [ln for ln in info.splitlines() if ln.startswith("bert.") and "_quantizer" in ln]
    assert len(rows) == len(after) and all(ln.rstrip().endswith("learned") for ln in rows), info

    # ONNX export: the Q/DQ scales are the learned ones, bit for bit; ORT runs it
    out = str(tmp_path / "qat.onnx")
    run_bq("export", "--model", qat, "--out", out, "--dump-logits", out + ".json", "--dump-batch", 4,
           "--dump-seq", 16)
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(out).graph.initializer}
    for k, (s, _, _) in after.items():
        if k.endswith(".weight_quantizer"):
            got = inits[k[: -len("_quantizer")] + "_scale"].astype(np.float32).reshape(-1)
            assert np.array_equal(got, s.reshape(-1)), k
        else:
            found = [v for name, v in inits.items() if name.startswith(k + ".scale_")]
            assert found and all(np.array_equal(v.astype(np.float32).reshape(-1), s.reshape(-1)) for v in found), k
    dump = json.load(open(out + ".json"))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(out, so, providers=["CPUExecutionProvider"])
    feed = {i.name: np.array(dump[i.name], dtype=np.int64) for i in sess.get_inputs()}
    logits = sess.run(None, feed)[0]
    err = float(np.abs(logits - np.array(dump["logits"], dtype=np.float32)).max())
    print(f"{scheme}: ONNX Runtime vs bertqat logits, max abs error {err:.3g}")
    assert err < 1e-4

    # --ranges fixed from the learned checkpoint: learning is off, the scales stay exactly
    fixed = tmp_path / "fixed"
    p = run_bq("qat", "--model", qat, "--out", fixed, "--ranges", "fixed", "--max-steps", 2, "--batch-size", 16,
               "--val-fraction", 0.2, *common)
    again = scales(fixed)
    assert all(np.array_equal(again[k][0], after[k][0]) for k in after)
    assert "ranges" not in json.loads((fixed / "config.json").read_text())["bertqat"]["quant"]


@pytest.mark.parametrize("extra,flag", [
    (["--ranges", "learn", "--range-lr", 0], "--range-lr"),
    (["--ranges", "learn", "--range-lr", -0.5], "--range-lr"),
    (["--ranges", "learn", "--range-lr", 2], "--range-lr"),
    (["--ranges", "learn", "--range-lr", "abc"], "--range-lr"),
    (["--ranges", "fixed", "--range-lr", 0.01], "--range-lr"),
    (["--range-lr", 0.01], "--range-lr"),
    (["--ranges", "learn", "--freeze-ranges-after", 3], "--freeze-ranges-after"),
    (["--ranges", "sometimes"], "--ranges"),
])
def test_bad_flags(env, tmp_path, extra, flag):
    out = tmp_path / "bad"
    p = run_bq("qat", "--model", env["ft"], "--out", out, "--max-steps", 1, *extra, *env["common"], check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0 and len(lines) == 1 and flag in lines[0], p.stderr
    assert not out.exists()


@pytest.mark.parametrize("extra,flag", [
    (["--qat-ranges", "sometimes"], "--qat-ranges"),
    (["--qat-range-lr", 0.01], "--qat-range-lr"),
    (["--qat-ranges", "learn", "--qat-range-lr", 0], "--qat-range-lr"),
])
def test_pipeline_bad_flags(env, tmp_path, extra, flag):
    out = tmp_path / "run"
    p = run_bq("pipeline", "--model", env["ft"], "--data", env["dir"] / "data.csv", "--out", out, *extra, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0 and len(lines) == 1 and flag in lines[0], p.stderr
    assert not out.exists()
