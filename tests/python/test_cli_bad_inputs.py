"""Reliability table: every subcommand fed bad input must exit non-zero with exactly one
line on stderr naming the offending flag or file, never crash (no signal, no sanitizer report), and
leave no partial output file or directory behind."""
import os
import shutil
import subprocess

import pytest

from conftest import BIN, IMDB, MODEL, VOCAB


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "empty").mkdir()
    # model dir whose safetensors is truncated
    trunc = d / "trunc_model"
    trunc.mkdir()
    for f in ("config.json", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(os.path.join(MODEL, f), trunc / f)
    with open(os.path.join(MODEL, "model.safetensors"), "rb") as src:
        (trunc / "model.safetensors").write_bytes(src.read(100000))
    # config with a wrong shape: heads do not divide hidden
    wrong = d / "wrong_cfg"
    shutil.copytree(trunc, wrong)
    shutil.copy(os.path.join(MODEL, "model.safetensors"), wrong / "model.safetensors")
    cfg = (wrong / "config.json").read_text().replace('"num_attention_heads": 12', '"num_attention_heads": 7')
    (wrong / "config.json").write_text(cfg)
    # config with a different hidden size than the weights
    mis = d / "mismatch"
    shutil.copytree(wrong, mis)
    (mis / "config.json").write_text((trunc / "config.json").read_text().replace('"intermediate_size": 1536',
                                                                                 '"intermediate_size": 1500'))
    # vocab without [UNK]
    nounk = d / "nounk_vocab.txt"
    nounk.write_text("".join(l for l in open(VOCAB, encoding="utf-8") if l.strip() != "[UNK]"))
    # empty dataset files
    (d / "empty.csv").write_text("text,label\n")
    (d / "garbage.tar.gz").write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(200))
    (d / "bad.jsonl").write_text('{"text": "fine", "label": "pos"}\n{"text": \n')
    # a regular file used as a directory: unwritable even for root
    (d / "notadir").write_text("x")
    return d


def cases(d):
    m, data = MODEL, IMDB
    return [
        # (name, argv, words the message must contain, output path that must not exist)
        ("unknown command", ["frobnicate"], ["frobnicate"], None),
        ("finetune unknown flag", ["finetune", "--model", m, "--data", data, "--out", d / "o1", "--bogus"], ["--bogus"], d / "o1"),
        ("finetune negative lr", ["finetune", "--model", m, "--data", data, "--out", d / "o2", "--lr", "-1"], ["--lr"], d / "o2"),
        ("finetune bad number", ["finetune", "--model", m, "--data", data, "--out", d / "o3", "--epochs", "abc"], ["--epochs"], d / "o3"),
        ("finetune zero batch", ["finetune", "--model", m, "--data", data, "--out", d / "o4", "--batch-size", "0"], ["--batch-size"], d / "o4"),
        ("finetune missing model", ["finetune", "--model", d / "nope", "--data", data, "--out", d / "o5"], ["nope"], d / "o5"),
        ("finetune empty model dir", ["finetune", "--model", d / "empty", "--data", data, "--out", d / "o6"], ["config.json"], d / "o6"),
        ("finetune truncated weights", ["finetune", "--model", d / "trunc_model", "--data", data, "--out", d / "o7"], ["model.safetensors"], d / "o7"),
        ("finetune heads do not divide hidden", ["finetune", "--model", d / "wrong_cfg", "--data", data, "--out", d / "o8"], ["num_attention_heads"], d / "o8"),
        ("finetune shape mismatch", ["finetune", "--model", d / "mismatch", "--data", data, "--out", d / "o9"], ["intermediate"], d / "o9"),
        ("finetune missing data", ["finetune", "--model", m, "--data", d / "nodata.tar.gz", "--out", d / "o10"], ["nodata.tar.gz"], d / "o10"),
        ("finetune empty csv", ["finetune", "--model", m, "--data", d / "empty.csv", "--out", d / "o11"], ["empty.csv"], d / "o11"),
        ("finetune corrupt archive", ["finetune", "--model", m, "--data", d / "garbage.tar.gz", "--out", d / "o12"], ["garbage.tar.gz"], d / "o12"),
        ("finetune bad jsonl", ["finetune", "--model", m, "--data", d / "bad.jsonl", "--out", d / "o13"], ["bad.jsonl"], d / "o13"),
        ("finetune unwritable out", ["finetune", "--model", m, "--data", data, "--out", d / "notadir" / "x", "--train-samples", "64", "--eval-samples", "32"], ["notadir"], d / "notadir" / "x"),
        ("eval missing model", ["eval", "--model", d / "nope", "--data", data], ["nope"], None),
        ("eval bad split", ["eval", "--model", m, "--data", data, "--split", "dev"], ["--split"], None),
        ("eval predictions unwritable", ["eval", "--model", m, "--data", data, "--predictions", d / "notadir" / "p.tsv"], ["--predictions", "notadir"], d / "notadir" / "p.tsv"),
        ("predict missing model", ["predict", "--model", d / "nope", "hello"], ["nope"], None),
        ("calibrate bad calibrator", ["calibrate", "--model", m, "--data", data, "--out", d / "c1", "--calibrator", "magic"], ["--calibrator"], d / "c1"),
        ("calibrate bad percentile", ["calibrate", "--model", m, "--data", data, "--out", d / "c2", "--calibrator", "percentile", "--percentile", "120"], ["--percentile"], d / "c2"),
        ("calibrate unwritable", ["calibrate", "--model", m, "--data", data, "--out", d / "notadir" / "c3"], ["notadir"], d / "notadir" / "c3"),
        ("qat unwritable", ["qat", "--model", m, "--data", data, "--out", d / "notadir" / "q2"], ["notadir"], d / "notadir" / "q2"),
        ("export-hf unwritable", ["export-hf", "--model", m, "--out", d / "notadir" / "h2"], ["notadir"], d / "notadir" / "h2"),
        ("export dump unwritable", ["export", "--model", m, "--out", d / "e5.onnx", "--dump-logits", d / "notadir" / "l.json"], ["notadir"], d / "e5.onnx"),
        ("export bad dump engine", ["export", "--model", m, "--out", d / "e6.onnx", "--dump-logits", d / "l6.json", "--dump-engine", "fast"], ["--dump-engine", "fast"], d / "e6.onnx"),
        ("export dump engine alone", ["export", "--model", m, "--out", d / "e7.onnx", "--dump-engine", "int8"], ["--dump-engine", "--dump-logits"], d / "e7.onnx"),
        ("export dump engine int8 fp32", ["export", "--model", m, "--out", d / "e8.onnx", "--dump-logits", d / "l8.json", "--dump-engine", "int8"], ["--dump-engine int8", "fp32"], d / "e8.onnx"),
        ("qat bad scheme", ["qat", "--model", m, "--data", data, "--out", d / "q1", "--scheme", "fancy"], ["--scheme"], d / "q1"),
        ("calibrate exclude too long", ["calibrate", "--model", m, "--data", data, "--out", d / "c4", "--exclude", "x" * 1100], ["--exclude", "1023"], d / "c4"),
        ("qat clip-gelu beyond float", ["qat", "--model", m, "--data", data, "--out", d / "q3", "--clip-gelu", "1e39"], ["--clip-gelu"], d / "q3"),
        ("export missing model", ["export", "--model", d / "nope", "--out", d / "e1.onnx"], ["nope"], d / "e1.onnx"),
        ("export truncated model", ["export", "--model", d / "trunc_model", "--out", d / "e2.onnx"], ["model.safetensors"], d / "e2.onnx"),
        ("export unwritable", ["export", "--model", m, "--out", d / "notadir" / "e3.onnx"], ["notadir"], d / "notadir" / "e3.onnx"),
        ("export bad opset", ["export", "--model", m, "--out", d / "e4.onnx", "--opset", "7"], ["--opset"], d / "e4.onnx"),
        ("export-hf missing model", ["export-hf", "--model", d / "nope", "--out", d / "h1"], ["nope"], d / "h1"),
        ("info missing", ["info", d / "nope"], ["nope"], None),
        ("tokenize missing vocab", ["tokenize", "--vocab", d / "novocab.txt"], ["novocab.txt"], None),
        ("tokenize vocab without [UNK]", ["tokenize", "--vocab", d / "nounk_vocab.txt"], ["[UNK]"], None),
        ("data-stats missing data", ["data-stats", "--data", d / "nodata", "--vocab", VOCAB], ["nodata"], None),
        ("pipeline bad budget", ["pipeline", "--model", m, "--data", data, "--out", d / "p1", "--budget", "huge"], ["--budget"], None),
    ]


def test_qat_on_calibrated_refuses_ignored_quant_flags(bad, bin_path):
    """qat keeps a calibrated input's quantizers and ranges, so a quantization flag asking for something
    else would be a silent no-op: it is an error (exit 2) naming the flag, before any training; a flag
    repeating the input's own setting is accepted."""
    d = bad
    data = d / "tiny.csv"
    data.write_text("text,label\n" + "".join(f"{'good fine great' if i % 2 else 'bad poor awful'} {i},{i % 2}\n"
                                             for i in range(16)))
    ptq = d / "ptq"
    p = subprocess.run([BIN, "calibrate", "--model", MODEL, "--data", str(data), "--out", str(ptq), "--calib-samples",
                        "8", "--batch-size", "8", "--max-seq-len", "16", "--threads", "2", "--no-cache"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    failures = []
    for args, flag in ((["--scheme", "qdqbert"], "--scheme"), (["--per-tensor"], "--per-tensor"),
                       (["--fuse-qkv"], "--fuse-qkv"), (["--exclude", "classifier"], "--exclude"),
                       (["--clip-gelu", "10"], "--clip-gelu"), (["--calibrator", "mse"], "--calibrator"),
                       (["--percentile", "99.9"], "--percentile"), (["--calib-samples", "4"], "--calib-samples")):
        out = d / "qat_ignored"
        p = subprocess.run([BIN, "qat", "--model", str(ptq), "--data", str(data), "--out", str(out), *args,
                            "--no-cache"], capture_output=True, text=True, timeout=600)
        lines = [l for l in p.stderr.splitlines() if l.strip() and not l.startswith("[")]
        ok = p.returncode == 2 and len(lines) == 1 and flag in lines[0] and "calibrated" in lines[0] \
            and not out.exists()
        print(f"{'ok  ' if ok else 'FAIL'} qat {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[-200:]}")
        if not ok:
            failures.append(f"{args}: exit {p.returncode}, stderr {p.stderr.strip()[-300:]!r}")
    # --scheme ort repeats the input's scheme (the pipeline passes it): accepted, one step trains.
    p = subprocess.run([BIN, "qat", "--model", str(ptq), "--data", str(data), "--out", str(d / "qat_same"),
                        "--scheme", "ort", "--max-steps", "1", "--batch-size", "8", "--threads", "2", "--no-cache"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        failures.append(f"--scheme ort on an ort checkpoint: exit {p.returncode}, {p.stderr.strip()[-300:]!r}")
    assert not failures, "\n".join(failures)


def test_bad_inputs(bad):
    failures = []
    for name, argv, words, out in cases(bad):
        p = subprocess.run([BIN, *map(str, argv)], capture_output=True, text=True, timeout=600, input="")
        lines = [l for l in p.stderr.splitlines() if l.strip() and not l.startswith("[")]
        problems = []
        if p.returncode <= 0:
            problems.append(f"exit {p.returncode}")
        if p.returncode >= 128 or "Sanitizer" in p.stderr or "internal error" in p.stderr:
            problems.append("crashed")
        if len(lines) != 1:
            problems.append(f"{len(lines)} error lines")
        if not all(w.lower() in p.stderr.lower() for w in words):
            problems.append(f"message lacks {words}")
        if out is not None and (os.path.exists(out) or os.path.exists(str(out) + ".tmp")):
            problems.append("left output behind")
        if problems:
            failures.append(f"{name}: {', '.join(problems)}; stderr: {p.stderr.strip()[-300:]!r}")
        print(f"{'FAIL' if problems else 'ok  '} {name}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''}")
    print(f"{len(failures)} of {len(cases(bad))} bad-input cases failed")
    assert not failures, "\n".join(failures)
