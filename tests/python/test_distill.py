"""`qat --teacher` (distillation, src/train.c bq_train_step_distill) on the committed tiny BERT fixture with a
made-up vocabulary and a 3-label JSONL set made here:
- a distilled QAT run logs its three loss terms (cross-entropy, T²·KL, hidden-state MSE) and records its
  settings in OUT/distill.json;
- --distill-alpha 0 with --distill-hidden 0 gives the same losses and parameters as QAT without a teacher, bit
  for bit (the teacher's forward must not disturb the student's dropout stream or arithmetic);
- bad flags and unfit teachers are one-line errors naming the flag, with exit status 2 and no OUT;
- an interrupted distilled run (SIGINT) resumes with the teacher reloaded from distill.json and ends with the
  parameters of the uninterrupted run; resuming with other distillation settings is refused.
"""
import json
import os
import random
import shutil
import signal
import subprocess

import pytest

from conftest import BIN, ROOT, run_bq

h5py = pytest.importorskip("h5py")
np = pytest.importorskip("numpy")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

TINY = os.path.join(ROOT, "tests", "fixtures", "bert_tiny")
WORDS = ["great", "bad", "movie", "film", "awful", "fine", "good", "boring", "plot", "acting", "loved", "hated"]


def make_model_dir(d, words=WORDS, layers=None):
    os.makedirs(d)
    shutil.copy(os.path.join(TINY, "config.json"), d)
    shutil.copy(os.path.join(TINY, "model.safetensors"), d)
    if layers is not None:  # keep the first `layers` encoder layers
        cfg = json.load(open(os.path.join(d, "config.json")))
        cfg["num_hidden_layers"] = layers
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
        t = safetensors_numpy.load_file(os.path.join(d, "model.safetensors"))
        t = {k: v for k, v in t.items() if not any(f"layer.{i}." in k for i in range(layers, 64))}
        safetensors_numpy.save_file(t, os.path.join(d, "model.safetensors"))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words + list("abcdefghijklmnopqrstuvwxyz")
    vocab += [f"[unused{i}]" for i in range(128 - len(vocab))]
    with open(os.path.join(d, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    return d


@pytest.fixture(scope="module")
def env(tmp_path_factory, bin_path):
    d = str(tmp_path_factory.mktemp("distill"))
    rng = random.Random(3)
    data = os.path.join(d, "data.jsonl")
    with open(data, "w") as f:
        for i in range(600):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(6)),
                                "label": ["neg", "neu", "pos"][i % 3]}) + "\n")
    common = ["--data", data, "--max-seq-len", 16, "--threads", 1, "--batch-size", 8,
              "--cache-dir", os.path.join(d, "cache")]
    model = make_model_dir(os.path.join(d, "tiny_hf"))
    ft = os.path.join(d, "ft")
    run_bq("finetune", "--model", model, "--out", ft, "--max-steps", 20, "--lr", 1e-3, *common, timeout=300)
    return {"dir": d, "ft": ft, "common": common}


def params(ckpt):
    with h5py.File(os.path.join(ckpt, "model.h5"), "r") as f:
        return {k: np.asarray(v) for k, v in f["params"].items()}


def losses(ckpt):
    return [r["loss"] for r in map(json.loads, open(os.path.join(ckpt, "training_log.jsonl"))) if r["type"] == "train"]


def qat(env, out, *extra, check=True):
    return run_bq("qat", "--model", env["ft"], "--out", out, "--max-steps", 12, "--log-every", 1, "--dropout", 0.1,
                  *env["common"], *extra, check=check, timeout=300)


def test_distill_logs_terms_and_records(env, tmp_path):
    out = str(tmp_path / "q")
    p = qat(env, out, "--teacher", env["ft"], "--distill-alpha", 0.7, "--distill-temperature", 3,
            "--distill-hidden", 0.5)
    terms = [ln for ln in p.stderr.splitlines() if "distill step" in ln]
    assert len(terms) == 12, p.stderr
    for ln in terms:
        w = ln.split()
        ce, kl, hid = float(w[w.index("ce") + 1]), float(w[w.index("kl") + 1]), float(w[w.index("hidden") + 1])
        assert ce > 0 and kl >= 0 and hid > 0, ln
    assert "teacher" in p.stderr and "alpha 0.7" in p.stderr
    rec = json.load(open(os.path.join(out, "distill.json")))
    assert rec == {"teacher": os.path.realpath(env["ft"]), "alpha": 0.7, "temperature": 3.0, "hidden_weight": 0.5}
    # the step loss is (1-A)·CE + A·KL + W·hidden of the same micro-batch (one micro-batch per step here)
    w = terms[0].split()
    ce, kl, hid = (float(w[w.index(k) + 1]) for k in ("ce", "kl", "hidden"))
    assert abs(losses(out)[0] - (0.3 * ce + 0.7 * kl + 0.5 * hid)) < 2e-4, (losses(out)[0], ce, kl, hid)


def test_teacher_equal_to_student_gives_zero_loss(env, tmp_path):
    """A student with no quantizer (every module excluded) and no dropout computes the fp32 model itself, so
    with that model as teacher (forward without a tape) the first step's KL and hidden-state MSE are zero up
    to fp32 rounding; the untrained model as teacher shows that the check can fail."""
    args = ["--max-steps", 1, "--dropout", 0, "--exclude", "bert,classifier", "--distill-alpha", 1,
            "--distill-temperature", 1, "--distill-hidden", 1]
    same, other = str(tmp_path / "same"), str(tmp_path / "other")
    p = qat(env, same, "--teacher", env["ft"], *args)
    assert "0 quantizers" in p.stderr, p.stderr
    untrained = make_model_dir(os.path.join(str(tmp_path), "untrained"))
    qat(env, other, "--teacher", untrained, *args)
    l_same, l_other = losses(same)[0], losses(other)[0]
    print(f"first-step KL + MSE: teacher = student {l_same:.3e}, untrained teacher {l_other:.3e}")
    assert l_same < 1e-9 and l_other > 1e-4, (l_same, l_other)


def test_alpha_zero_is_plain_qat(env, tmp_path):
    plain, a0 = str(tmp_path / "plain"), str(tmp_path / "a0")
    qat(env, plain)
    p = qat(env, a0, "--teacher", env["ft"], "--distill-alpha", 0)
    assert "distill step" in p.stderr
    assert losses(plain) == losses(a0) and len(losses(plain)) == 12
    pa, pb = params(plain), params(a0)
    diff = max(float(np.abs(pa[k] - pb[k]).max()) for k in pa)
    print(f"max parameter difference, alpha 0 vs no teacher: {diff}")
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)
    assert not os.path.exists(os.path.join(plain, "distill.json"))


@pytest.mark.parametrize("args,flag", [
    (["--distill-alpha", 1.5], "--distill-alpha"),
    (["--distill-alpha", -0.1], "--distill-alpha"),
    (["--distill-temperature", 0], "--distill-temperature"),
    (["--distill-hidden", -1], "--distill-hidden"),
])
def test_bad_flags(env, tmp_path, args, flag):
    out = str(tmp_path / "bad")
    p = qat(env, out, "--teacher", env["ft"], *args, check=False)
    assert p.returncode == 2 and flag in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not os.path.exists(out)


def test_flags_without_teacher_and_unfit_teachers(env, tmp_path):
    out = str(tmp_path / "bad")
    p = qat(env, out, "--distill-temperature", 4, check=False)
    assert p.returncode == 2 and "--distill-temperature" in p.stderr and "--teacher" in p.stderr, p.stderr
    other = make_model_dir(str(tmp_path / "other_vocab"), words=WORDS[::-1])
    p = qat(env, out, "--teacher", other, check=False)
    assert p.returncode == 2 and "--teacher" in p.stderr and "vocab.txt" in p.stderr, p.stderr
    one = make_model_dir(str(tmp_path / "one_layer"), layers=1)
    p = qat(env, out, "--teacher", one, "--distill-hidden", 1, check=False)
    assert p.returncode == 2 and "--distill-hidden" in p.stderr, p.stderr
    p = qat(env, out, "--teacher", str(tmp_path / "missing"), check=False)
    assert p.returncode != 0 and "--teacher" in p.stderr, p.stderr
    assert not os.path.exists(out)
    # without the hidden term a teacher of another depth is fine
    qat(env, out, "--teacher", one)


def test_resume_reloads_teacher(env, tmp_path):
    args = ["--teacher", env["ft"], "--distill-hidden", 0.2, "--max-steps", 200]
    ref = str(tmp_path / "ref")
    qat(env, ref, *args)
    out = str(tmp_path / "int")
    cmd = [BIN, "qat", "--model", env["ft"], "--out", out, "--log-every", 1, "--dropout", 0.1, *env["common"], *args]
    proc = subprocess.Popen([str(a) for a in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for ln in proc.stderr:
        if "step 3/" in ln:
            proc.send_signal(signal.SIGINT)
            break
    proc.communicate(timeout=300)
    assert proc.returncode == 6, "the run finished before SIGINT arrived; make it longer"
    assert json.load(open(os.path.join(out, "distill.json")))["hidden_weight"] == 0.2
    bad = run_bq("qat", "--model", env["ft"], "--out", out, "--resume", "--teacher", env["ft"], "--max-steps", 200,
                 "--log-every", 1, "--dropout", 0.1, *env["common"], check=False)
    assert bad.returncode == 2 and "distill.json" in bad.stderr, bad.stderr
    # resumed without the distillation flags: the record supplies them
    p = run_bq("qat", "--model", env["ft"], "--out", out, "--resume", "--max-steps", 200, "--log-every", 1,
               "--dropout", 0.1, *env["common"], timeout=300)
    assert "as recorded" in p.stderr and "distill step" in p.stderr
    pa, pb = params(ref), params(out)
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)


@pytest.mark.parametrize("args,flags", [
    (["--distill", "--no-distill"], ["--distill", "--no-distill"]),
    (["--no-distill", "--distill-alpha", 0.3], ["--distill-alpha", "--no-distill"]),
    (["--distill-temperature", 0], ["--distill-temperature"]),
    (["--task", "qa", "--distill"], ["--distill", "--task cls"]),
    (["--task", "qa", "--distill-hidden", 1], ["--distill-hidden"]),
])
def test_pipeline_distill_flags(env, tmp_path, args, flags):
    """pipeline distils by default for classification; contradictory or inapplicable distillation flags are
    one-line errors naming them, before any stage runs."""
    out = tmp_path / "run"
    p = run_bq("pipeline", "--model", env["ft"], "--data", os.path.join(env["dir"], "data.jsonl"), "--out", out,
               *args, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and all(f in lines[0] for f in flags), p.stderr
    assert not out.exists()
