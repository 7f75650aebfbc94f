"""`cmake --install BUILD --prefix P` and the installed `bertqat`, run from a folder outside the checkout:
- the install holds bin/bertqat, the helper scripts it runs (share/bertqat/scripts: onnx_eval.py,
  onnx_eval_qa.py, onnx_bench.py and the imdb_select.py and ort_common.py they import) and the docs
  (share/doc/bertqat);
- `P/bin/bertqat pipeline` at the tiny budget of tests/python/test_faults.py (the 2-layer fixture model, 48
  training and 16 test reviews of an aclImdb folder made here, seq 16) with its Python from BQ_PYTHON runs
  every stage, the ONNX Runtime evaluations and the ONNX Runtime bench included, with the scripts under P;
- without --python, BQ_PYTHON and a venv (P has none, and P lies outside the checkout, so the checkout's
  .venv cannot be reached from it), pipeline and `bench --onnx` fail with a one-line error naming the
  flag, the variable and the venv paths looked for, before the run folder is made; a copy of the binary
  with no scripts next to it fails naming the folders it looked in."""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import BUILD, ROOT, THREADS

TINY = os.path.join(ROOT, "tests", "fixtures", "bert_tiny")
WORDS = ["great", "bad", "movie", "film", "awful", "fine", "good", "boring", "plot", "acting", "loved", "hated"]
VOCAB = 1100
SCRIPTS = ["onnx_eval.py", "onnx_eval_qa.py", "onnx_bench.py", "imdb_select.py", "ort_common.py"]


@pytest.fixture(scope="module")
def installed():
    """(prefix, scratch folder) of a fresh install of the build tree, both outside the checkout."""
    cmake = shutil.which("cmake")
    if not cmake:
        pytest.skip("cmake not found")
    assert os.access(os.path.join(BUILD, "bertqat"), os.X_OK), f"{BUILD}/bertqat not built"
    top = tempfile.mkdtemp(prefix="bertqat-install-")
    try:
        root = os.path.realpath(ROOT) + os.sep
        assert not os.path.realpath(top).startswith(root), f"{top} is inside the checkout {ROOT}"
        prefix = os.path.join(top, "prefix")
        p = subprocess.run([cmake, "--install", BUILD, "--prefix", prefix], capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
        yield prefix, top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def tiny_weights(src, dst):
    """The fixture's safetensors file with the classifier cut to its first two labels (IMDB's neg, pos) and
    the word embeddings repeated to VOCAB rows (scripts/onnx_bench.py draws ids from [1000, vocab))."""
    with open(src, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    head, body = json.loads(raw[8:8 + n]), raw[8 + n:]
    out_head, parts, off = {}, [], 0
    for name, t in sorted((k, v) for k, v in head.items() if k != "__metadata__"):
        a, b = t["data_offsets"]
        data, shape = body[a:b], list(t["shape"])
        if name.startswith("classifier."):
            data, shape = data[:len(data) // shape[0] * 2], [2] + shape[1:]
        elif name == "bert.embeddings.word_embeddings.weight":
            row = len(data) // shape[0]
            data, shape = (data * (VOCAB // shape[0] + 1))[:VOCAB * row], [VOCAB] + shape[1:]
        out_head[name] = {"dtype": t["dtype"], "shape": shape, "data_offsets": [off, off + len(data)]}
        parts.append(data)
        off += len(data)
    h = json.dumps(out_head).encode()
    h += b" " * (-len(h) % 8)
    with open(dst, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(parts))


def tiny_inputs(top):
    """The fixture model with two labels and a vocabulary of VOCAB entries (the words of
    tests/python/test_faults.py's) and an aclImdb folder of 48 training and 16 test reviews."""
    model = os.path.join(top, "tiny_hf")
    os.makedirs(model)
    with open(os.path.join(TINY, "config.json")) as f:
        cfg = json.load(f)
    cfg["id2label"], cfg["label2id"], cfg["vocab_size"] = {"0": "neg", "1": "pos"}, {"neg": 0, "pos": 1}, VOCAB
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    tiny_weights(os.path.join(TINY, "model.safetensors"), os.path.join(model, "model.safetensors"))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + list("abcdefghijklmnopqrstuvwxyz")
    vocab += [f"[unused{i}]" for i in range(VOCAB - len(vocab))]
    with open(os.path.join(model, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    rng = random.Random(0)
    data = os.path.join(top, "aclImdb")
    for split, n in (("train", 48), ("test", 16)):
        for i in range(n):
            lab = ("neg", "pos")[i % 2]
            os.makedirs(os.path.join(data, split, lab), exist_ok=True)
            with open(os.path.join(data, split, lab, f"{i}_{8 if lab == 'pos' else 2}.txt"), "w") as f:
                f.write(" ".join(rng.choice(WORDS) for _ in range(6)))
    return model, data


def run(argv, cwd, env, timeout=600):
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_install_and_pipeline_from_elsewhere(installed):
    prefix, top = installed
    exe = os.path.join(prefix, "bin", "bertqat")
    assert os.access(exe, os.X_OK), exe
    for s in SCRIPTS:
        assert os.path.isfile(os.path.join(prefix, "share", "bertqat", "scripts", s)), s
    for d in ("README.md", "docs/design.md", "docs/quantization.md"):
        assert os.path.isfile(os.path.join(prefix, "share", "doc", "bertqat", d)), d
    for v in (os.path.join(prefix, ".venv"), os.path.join(prefix, "bin", ".venv")):
        assert not os.path.exists(v), v

    model, data = tiny_inputs(top)
    cwd = os.path.join(top, "elsewhere")  # a fresh folder with nothing of the checkout in it
    os.makedirs(cwd)
    out = os.path.join(top, "run")
    args = [exe, "pipeline", "--model", model, "--data", data, "--out", out, "--train-samples", 48,
            "--eval-samples", 16, "--max-seq-len", 16, "--batch-size", 8, "--calib-samples", 16, "--epochs", 1,
            "--qat-epochs", 1, "--bench-rounds", 1, "--bench-batch-sizes", 1, "--threads", THREADS]
    bare = {k: v for k, v in os.environ.items() if k not in ("BQ_PYTHON", "BQ_PIPELINE_PID")}

    # no --python, no BQ_PYTHON, no venv: one line naming all three, and no run folder
    p = run(args, cwd, bare, timeout=60)
    err = p.stderr.strip().splitlines()
    print(f"no Python: exit {p.returncode}: {err[-1] if err else ''}")
    assert p.returncode != 0 and err, p.stderr
    venvs = [os.path.join(prefix, "bin", ".venv", "bin", "python"), os.path.join(prefix, ".venv", "bin", "python")]
    assert err[-1].startswith("bertqat pipeline: ") and "--python" in err[-1] and "BQ_PYTHON" in err[-1], err
    assert all(v in err[-1] for v in venvs), err
    assert not any(ln.startswith("bertqat ") for ln in err[:-1]) and not os.path.exists(out), p.stderr

    # the binary without its scripts: one line naming the folders it looked in
    lone = os.path.join(top, "lone", "bin")
    os.makedirs(lone)
    shutil.copy(exe, lone)
    p = run([os.path.join(lone, "bertqat")] + args[1:], cwd, dict(bare, BQ_PYTHON=sys.executable), timeout=60)
    err = p.stderr.strip().splitlines()
    print(f"no scripts: exit {p.returncode}: {err[-1] if err else ''}")
    assert p.returncode != 0 and err and "onnx_eval.py" in err[-1], p.stderr
    for d in (lone, os.path.join(top, "lone")):
        assert os.path.join(d, "share", "bertqat", "scripts") in err[-1], (d, err[-1])
    assert not os.path.exists(out)

    # the whole pipeline with BQ_PYTHON, ONNX Runtime stages included, with the scripts under the prefix
    t0 = time.time()
    p = run(args, cwd, dict(bare, BQ_PYTHON=sys.executable))
    secs = time.time() - t0
    assert p.returncode == 0, p.stderr[-4000:]
    print(f"installed pipeline from {cwd}: {secs:.1f} s")
    log = p.stderr
    scripts = os.path.join(prefix, "share", "bertqat", "scripts")
    for stage in ("eval-onnx-fp32", "eval-onnx-int8-cpu"):
        assert f"[pipeline] {stage}: {sys.executable} {scripts}/onnx_eval.py --onnx {out}/" in log, (stage, log[-3000:])
        assert os.path.exists(os.path.join(out, f".done-{stage}")), stage
    assert f"[pipeline] bench: {exe} bench " in log and f"--python {sys.executable}" in log, log[-3000:]
    for name in ("onnx-fp32", "onnx-int8-cpu"):
        with open(os.path.join(out, f"eval-{name}.json")) as f:
            r = json.load(f)
        assert r["examples"] == 16 and r.get("engine", r.get("runtime", "")).startswith("onnxruntime"), (name, r)
    with open(os.path.join(out, "bench.json")) as f:
        bench = json.load(f)
    assert all(r["onnxruntime_ms"] > 0 for r in bench["results"]), bench
    with open(os.path.join(out, "report.md")) as f:
        report = f.read()
    assert "| ONNX fp32 (for ORT CPU) | onnxruntime" in report and "was skipped" not in report, report[:3000]
    assert os.listdir(cwd) == [], os.listdir(cwd)  # nothing was written where it ran

    # bench --onnx looks its Python up by the same rule
    p = run([exe, "bench", "--model", os.path.join(out, "qat"), "--onnx", os.path.join(out, "qat-int8-cpu.onnx"),
             "--rounds", 1, "--batch-sizes", 1], cwd, bare, timeout=60)
    err = p.stderr.strip().splitlines()
    print(f"bench --onnx without a Python: exit {p.returncode}: {err[-1] if err else ''}")
    assert p.returncode != 0 and len(err) == 1 and err[0].startswith("bertqat bench: "), p.stderr
    assert "--python" in err[0] and "BQ_PYTHON" in err[0] and all(v in err[0] for v in venvs), err
