"""The data flags (--text-column, --text-pair-column, --label-column, --cache-dir, --no-cache) reach
every command that reads data, and checkpoints remember how they were trained (config.json
bertqat.data) so that eval, predict and export default to it. Runs on a tiny CSV made here whose
columns have names the loader would not guess (body, extra, y), so a flag that were ignored makes the
command fail or change its numbers; training is a few steps of all-MiniLM-L6-v2 at 32 tokens."""
import csv
import json
import os
import random

import pytest

from conftest import MODEL, run_bq

THREADS = os.environ.get("BQ_TEST_THREADS", "2")
POS = "great wonderful superb lovely excellent fantastic moving".split()
NEG = "awful terrible boring dreadful poor horrible dull".split()
# Longer than 32 tokens, with the sentiment words at the end: head and tail truncation at 32 tokens
# and no truncation give three different inputs.
LONG = " ".join(["the film was shown in the town hall on a tuesday evening"] * 6 + ["wonderful superb lovely"] * 3)


@pytest.fixture(scope="module")
def env(tmp_path_factory, bin_path):
    if not os.path.isdir(MODEL):
        if os.environ.get("CI"):
            pytest.fail(f"pretrained model not found at {MODEL}")
        pytest.skip(f"pretrained model not found at {MODEL}")
    d = tmp_path_factory.mktemp("flags")
    rng = random.Random(7)
    rows = []
    for i in range(48):
        lab = i % 2
        words = [rng.choice(POS if lab else NEG) for _ in range(rng.randint(4, 50))]
        rows.append((" ".join(words), f"it was shown on day {i} in a small cinema", "pos" if lab else "neg"))
    with open(d / "data.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["body", "extra", "y"])
        w.writerows(rows)
    # Every run that does not name a cache folder would write here: it must stay empty.
    (d / "default_cache").mkdir()
    saved = os.environ.get("BERTQAT_CACHE")
    os.environ["BERTQAT_CACHE"] = str(d / "default_cache")
    ft = d / "ft"
    run_bq("finetune", "--model", MODEL, "--data", d / "data.csv", "--out", ft, "--text-column", "body",
           "--label-column", "y", "--max-seq-len", 32, "--truncation", "tail", "--max-steps", 2, "--batch-size", 8,
           "--train-samples", 32, "--val-fraction", 0.25, "--threads", THREADS, "--cache-dir", d / "ft_cache")
    yield {"dir": d, "csv": d / "data.csv", "rows": rows, "ft": ft}
    if saved is None:
        del os.environ["BERTQAT_CACHE"]
    else:
        os.environ["BERTQAT_CACHE"] = saved


def bertqat_data(ckpt):
    return json.loads((ckpt / "config.json").read_text())["bertqat"]["data"]


def cache_files(folder):
    return sorted(p for p in os.listdir(folder) if p.endswith(".bqds")) if os.path.isdir(folder) else []


def test_finetune_records_data_and_uses_cache_dir(env):
    d = env["dir"]
    assert bertqat_data(env["ft"]) == {"max_seq_len": 32, "truncation": "tail", "text_column": "body",
                                       "text_pair_column": None, "label_column": "y"}
    assert len(cache_files(d / "ft_cache")) >= 1, cache_files(d / "ft_cache")
    info = run_bq("info", env["ft"]).stdout
    assert "max_seq_len 32, truncation tail, text column body, pair column none, label column y" in info, info
    # Without --text-column the loader finds no text column: the flag is what made the run work.
    p = run_bq("finetune", "--model", MODEL, "--data", env["csv"], "--out", d / "nocol", "--max-steps", 1,
               "--no-cache", check=False)
    assert p.returncode != 0 and "--text-column" in p.stderr and not (d / "nocol").exists(), p.stderr


def test_eval_defaults_to_checkpoint_and_honours_flags(env):
    d, ft, csv_path = env["dir"], env["ft"], env["csv"]
    p = run_bq("eval", "--model", ft, "--data", csv_path, "--json", "--threads", THREADS, "--no-cache")
    assert ("encoding: max_seq_len 32 (checkpoint), truncation tail (checkpoint), text column body (checkpoint), "
            "pair column none (checkpoint), label column y (checkpoint)") in p.stderr, p.stderr
    base = json.loads(p.stdout)
    assert base["examples"] == 48 and base["max_seq_len"] == 32 and base["truncation"] == "tail", base
    # --text-pair-column changes what the model reads, so the loss changes.
    p = run_bq("eval", "--model", ft, "--data", csv_path, "--json", "--threads", THREADS, "--text-pair-column",
               "extra", "--cache-dir", d / "eval_cache")
    pair = json.loads(p.stdout)
    assert "pair column extra (flag)" in p.stderr and abs(pair["loss"] - base["loss"]) > 1e-4, (base, pair)
    assert len(cache_files(d / "eval_cache")) == 1
    # --label-column extra: 48 distinct labels, more than the model's 2 classes.
    p = run_bq("eval", "--model", ft, "--data", csv_path, "--label-column", "extra", "--no-cache", check=False)
    assert p.returncode != 0 and "labels" in p.stderr, p.stderr
    # --text-column names a column that is not there.
    p = run_bq("eval", "--model", ft, "--data", csv_path, "--text-column", "nope", "--no-cache", check=False)
    assert p.returncode != 0 and "nope" in p.stderr, p.stderr
    # --no-cache wins over --cache-dir: nothing is written.
    run_bq("eval", "--model", ft, "--data", csv_path, "--cache-dir", d / "nocache", "--no-cache", "--threads", THREADS)
    assert cache_files(d / "nocache") == []


def predict_prob(ckpt, *args, text=LONG):
    p = run_bq("predict", "--model", ckpt, "--json", "--threads", THREADS, *args, input=text + "\n")
    out = [json.loads(l) for l in p.stdout.splitlines()]
    assert len(out) == 1, p.stdout
    return out[0], p.stderr


def test_predict_uses_trained_length(env):
    ft = env["ft"]
    default, err = predict_prob(ft)
    assert "encoding: max_seq_len 32 (checkpoint), truncation tail (checkpoint)" in err, err
    same, _ = predict_prob(ft, "--max-seq-len", 32, "--truncation", "tail")
    head, _ = predict_prob(ft, "--max-seq-len", 32, "--truncation", "head")
    full, _ = predict_prob(ft, "--max-seq-len", 512)
    print(f"tail-32 {default['probability']:.6f} head-32 {head['probability']:.6f} 512 {full['probability']:.6f}")
    assert default == same
    assert abs(default["probability"] - head["probability"]) > 1e-5
    assert abs(default["probability"] - full["probability"]) > 1e-5


def test_predict_data_columns_and_cache(env):
    d, ft, rows = env["dir"], env["ft"], env["rows"]
    p = run_bq("predict", "--model", ft, "--data", env["csv"], "--json", "--threads", THREADS, "--cache-dir",
               d / "pred_cache")
    out = [json.loads(l) for l in p.stdout.splitlines()]
    assert [o["index"] for o in out] == list(range(48))
    assert [o["true_label"] for o in out] == [r[2] for r in rows]  # label column y, from the checkpoint
    assert len(cache_files(d / "pred_cache")) == 1
    # predict --data and predict on stdin encode the same text the same way
    first, _ = predict_prob(ft, text=rows[0][0])
    assert abs(first["probability"] - out[0]["probability"]) < 1e-5, (first, out[0])
    p = run_bq("predict", "--model", ft, "--data", env["csv"], "--json", "--threads", THREADS, "--label-column",
               "extra", "--no-cache")
    assert [json.loads(l)["true_label"] for l in p.stdout.splitlines()] == [r[1] for r in rows]
    assert cache_files(d / "default_cache") == []


def test_pairs_calibrate_qat_predict(env):
    d, ft, rows = env["dir"], env["ft"], env["rows"]
    ptq = d / "ptq_pair"
    run_bq("calibrate", "--model", ft, "--data", env["csv"], "--out", ptq, "--text-pair-column", "extra",
           "--calib-samples", 8, "--batch-size", 8, "--threads", THREADS, "--cache-dir", d / "cal_cache")
    assert bertqat_data(ptq) == {"max_seq_len": 32, "truncation": "tail", "text_column": "body",
                                 "text_pair_column": "extra", "label_column": "y"}
    assert len(cache_files(d / "cal_cache")) == 1
    qat = d / "qat_pair"
    run_bq("qat", "--model", ptq, "--data", env["csv"], "--out", qat, "--max-seq-len", 24, "--max-steps", 1,
           "--batch-size", 8, "--train-samples", 16, "--val-fraction", 0.25, "--ranges", "fixed", "--threads",
           THREADS, "--no-cache")
    assert bertqat_data(qat) == {"max_seq_len": 24, "truncation": "tail", "text_column": "body",
                                 "text_pair_column": "extra", "label_column": "y"}
    # A pair model reads stdin lines as text<TAB>pair; the pair changes the probability and the result
    # is the one predict --data gives for the same row.
    pair, err = predict_prob(qat, text=rows[0][0] + "\t" + rows[0][1])
    assert "pair column extra (checkpoint)" in err and pair["text_pair"] == rows[0][1], err
    p = run_bq("predict", "--model", qat, "--data", env["csv"], "--json", "--threads", THREADS, "--no-cache")
    by_data = json.loads(p.stdout.splitlines()[0])
    assert abs(pair["probability"] - by_data["probability"]) < 1e-5, (pair, by_data)
    other, _ = predict_prob(qat, text=rows[0][0] + "\tsomething else entirely")
    assert abs(other["probability"] - pair["probability"]) > 1e-6
    p = run_bq("predict", "--model", qat, check=False, input=rows[0][0] + "\n")
    assert p.returncode != 0 and "TAB" in p.stderr, p.stderr
    assert cache_files(d / "default_cache") == []


def test_export_dump_defaults_to_trained_length(env):
    d = env["dir"]
    p = run_bq("export", "--model", env["ft"], "--out", d / "m.onnx", "--dump-logits", d / "l.json")
    assert "4 x 32 tokens (sequence length: the checkpoint's training length)" in p.stderr, p.stderr
    dump = json.loads((d / "l.json").read_text())
    assert len(dump["input_ids"][0]) == 32
