"""`bertqat export-hf` output checked without torch: a tiny native checkpoint (2 fine-tuning steps of
the committed tiny BERT fixture with a made-up vocabulary) is exported; the safetensors file must be
readable by the `safetensors` numpy API with exactly the BertForSequenceClassification tensors of the
checkpoint's model.h5 (read independently with h5py), transformers.AutoConfig must load config.json as
a BertConfig with the data's id2label, the tokenizer files must be copied, and the directory write
must be atomic (no OUT.tmp, re-export replaces an earlier export, a foreign directory is refused).
Exporting an HF directory must reproduce its tensors."""
import json
import os
import shutil

import h5py
import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import ROOT, run_bq

TINY = os.path.join(ROOT, "tests", "fixtures", "bert_tiny")
WORDS = ["great", "bad", "movie", "film", "awful", "fine", "good", "boring", "plot", "acting", "loved", "hated"]


def tiny_model_dir(tmp):
    """The tiny fixture plus a 128-entry vocab.txt (its vocab_size) and tokenizer files."""
    d = os.path.join(tmp, "tiny_hf")
    os.makedirs(d)
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(TINY, f), d)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + list("abcdefghijklmnopqrstuvwxyz")
    vocab += [f"[unused{i}]" for i in range(128 - len(vocab))]
    with open(os.path.join(d, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer", "model_max_length": 64}, f)
    return d


def tiny_data(tmp):
    p = os.path.join(tmp, "reviews.jsonl")
    rng = np.random.default_rng(0)
    with open(p, "w") as f:
        for i in range(48):
            lab = ["neg", "neu", "pos"][i % 3]
            words = rng.choice(WORDS, size=6)
            f.write(json.dumps({"text": " ".join(words), "label": lab}) + "\n")
    return p


@pytest.fixture(scope="module")
def native_ckpt(tmp_path_factory, bin_path):
    tmp = str(tmp_path_factory.mktemp("exphf"))
    model = tiny_model_dir(tmp)
    out = os.path.join(tmp, "ckpt")
    run_bq("finetune", "--model", model, "--data", tiny_data(tmp), "--out", out, "--max-steps", 2,
           "--batch-size", 8, "--max-seq-len", 16, "--threads", 1, "--eval-every", 1, "--no-save-best",
           timeout=300)
    assert os.path.isfile(os.path.join(out, "model.h5"))
    return tmp, out


def h5_params(path):
    with h5py.File(path, "r") as f:
        return {k: np.asarray(v) for k, v in f["params"].items()}


def test_export_native_checkpoint(native_ckpt):
    tmp, ckpt = native_ckpt
    out = os.path.join(tmp, "hf_export")
    p = run_bq("export-hf", "--model", ckpt, "--out", out)
    assert "wrote" in p.stdout
    assert not os.path.exists(out + ".tmp")
    st = load_file(os.path.join(out, "model.safetensors"))
    ref = h5_params(os.path.join(ckpt, "model.h5"))
    hf_names = set(load_file(os.path.join(TINY, "model.safetensors")))
    assert set(st) == hf_names == set(ref), (set(st) ^ hf_names, set(st) ^ set(ref))
    maxdiff = 0.0
    for k, v in st.items():
        assert v.dtype == np.float32 and v.shape == ref[k].shape, k
        maxdiff = max(maxdiff, float(np.max(np.abs(v - ref[k]))))
        assert np.array_equal(v, ref[k]), k
    print("max |export - model.h5| =", maxdiff)
    # the checkpoint is fine-tuned: at least one tensor moved away from the fixture
    orig = load_file(os.path.join(TINY, "model.safetensors"))
    assert any(not np.array_equal(orig[k], st[k]) for k in st)

    from transformers import AutoConfig, BertConfig
    cfg = AutoConfig.from_pretrained(out)
    assert isinstance(cfg, BertConfig)
    assert cfg.architectures == ["BertForSequenceClassification"]
    assert cfg.id2label == {0: "neg", 1: "neu", 2: "pos"} and cfg.label2id == {"neg": 0, "neu": 1, "pos": 2}
    assert cfg.num_labels == 3 and cfg.hidden_size == 32 and cfg.intermediate_size == 37
    assert cfg.hidden_act == "gelu" and cfg.num_hidden_layers == 2
    with open(os.path.join(out, "config.json")) as f:
        assert "bertqat" in json.load(f)
    for f in ("vocab.txt", "tokenizer_config.json"):
        with open(os.path.join(ckpt, f), "rb") as a, open(os.path.join(out, f), "rb") as b:
            assert a.read() == b.read(), f
    # re-export replaces the earlier export atomically
    run_bq("export-hf", "--model", ckpt, "--out", out)
    assert not os.path.exists(out + ".tmp") and not os.path.exists(out + ".old")
    assert set(load_file(os.path.join(out, "model.safetensors"))) == hf_names


def test_export_refuses_foreign_dir(native_ckpt):
    tmp, ckpt = native_ckpt
    foreign = os.path.join(tmp, "foreign")
    os.makedirs(foreign)
    with open(os.path.join(foreign, "notes.txt"), "w") as f:
        f.write("keep me")
    p = run_bq("export-hf", "--model", ckpt, "--out", foreign, check=False)
    assert p.returncode != 0 and "refusing" in p.stderr
    assert os.listdir(foreign) == ["notes.txt"] and not os.path.exists(foreign + ".tmp")
    p = run_bq("export-hf", "--model", os.path.join(tmp, "missing"), "--out", os.path.join(tmp, "x"), check=False)
    assert p.returncode != 0 and "missing" in p.stderr and not os.path.exists(os.path.join(tmp, "x"))


def test_export_hf_directory_round_trip(tmp_path, bin_path):
    model = tiny_model_dir(str(tmp_path))
    out = str(tmp_path / "again")
    run_bq("export-hf", "--model", model, "--out", out)
    a = load_file(os.path.join(TINY, "model.safetensors"))
    b = load_file(os.path.join(out, "model.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    from transformers import AutoConfig
    assert AutoConfig.from_pretrained(out).id2label == {0: "neg", 1: "neu", 2: "pos"}
