"""--precision fp32|bf16|auto on every command that runs the model (finetune, qat, eval, predict, pipeline,
bench). auto resolves to fp32 on every CPU; bf16 runs everywhere: on the bf16 units (oneDNN) where the CPU
has AVX512-BF16 or AMX-BF16, emulated elsewhere, and the run header says which, once. A word that is no
precision is exit 2 with a one-line error. A tiny fine-tune and QAT in bf16 record "bf16" in
training_state.h5, and --resume in another precision is refused in one line; eval and predict in bf16 give results close to fp32 but not identical (the GEMMs did run
in bf16); --version prints the CPU's bf16 line. Each test prints which path it exercised."""
import json
import os

import pytest

from conftest import IMDB, MODEL, run_bq


def cpu_has_bf16():
    with open("/proc/cpuinfo") as f:
        flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


PATH = "oneDNN on the bf16 units" if cpu_has_bf16() else "emulated (CPU without bf16 units)"
HEADER = "(flag; the CPU has bf16 units)" if cpu_has_bf16() else "(flag; emulated, slower than fp32"
GEMMS = "bf16 GEMMs: oneDNN " if cpu_has_bf16() else "bf16 GEMMs: emulated (operands rounded to bf16"
TINY = ["--max-steps", 1, "--train-samples", 32, "--val-fraction", 0, "--batch-size", 8, "--max-seq-len", 32,
        "--threads", 2, "--no-cache"]


def need_model():
    if not os.path.isdir(MODEL):
        pytest.skip(f"pretrained model not found at {MODEL}")


def cmd_args(cmd, tmp_path):
    if cmd in ("finetune", "qat"):
        return [cmd, "--model", MODEL, "--data", IMDB, "--out", tmp_path / "o"]
    if cmd == "eval":
        return [cmd, "--model", MODEL, "--data", IMDB]
    if cmd == "predict":
        return [cmd, "--model", MODEL, "A fine film."]
    if cmd == "pipeline":
        return [cmd, "--model", MODEL, "--data", IMDB, "--out", tmp_path / "run"]
    return [cmd, "--model", MODEL]  # bench


def header(stderr, cmd):
    lines = [l for l in stderr.splitlines() if l.startswith(f"[{cmd}] precision: ") or l.startswith(f"[{cmd}] bf16 GEMMs")]
    print("\n".join(lines))
    return lines


@pytest.mark.parametrize("cmd", ["finetune", "qat", "eval", "predict", "pipeline", "bench"])
def test_bad_word_refused(cmd, tmp_path, bin_path):
    need_model()
    p = run_bq(*cmd_args(cmd, tmp_path), "--precision", "fp16", check=False, timeout=300)
    err = p.stderr.strip().splitlines()[-1]
    print(f"{cmd} --precision fp16 -> exit {p.returncode}: {err}")
    assert p.returncode == 2 and err == f"bertqat {cmd}: --precision: 'fp16' is not fp32, bf16 or auto", p.stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "run").exists()


def test_auto_and_version(bin_path):
    need_model()
    for value in ("auto", "fp32"):
        p = run_bq("predict", "--model", MODEL, "--precision", value, "--threads", 1, "A fine film.")
        lines = header(p.stderr, "predict")
        assert len(lines) == 1 and lines[0].startswith("[predict] precision: fp32 ("), lines
    v = run_bq("--version").stdout
    print(v)
    assert "CPU bf16: AVX512-BF16 " in v and "--precision auto runs fp32" in v


def test_predict_and_eval_bf16(bin_path):
    """bf16 inference says its path once, and stays close to fp32 without being equal to it."""
    need_model()
    print(f"path exercised: {PATH}")
    out = {}
    for value in ("fp32", "bf16"):
        p = run_bq("predict", "--model", MODEL, "--precision", value, "--threads", 2, "--json",
                   "A fine film.", "A dull, overlong mess.")
        lines = header(p.stderr, "predict")
        if value == "bf16":
            assert len(lines) == 2 and HEADER in lines[0] and lines[1].startswith(f"[predict] {GEMMS}"), lines
        out[value] = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    assert len(out["fp32"]) == len(out["bf16"]) == 2
    def p1(r):
        return r["probability"] if r["label_id"] == 1 else 1 - r["probability"]

    d = [abs(p1(a) - p1(b)) for a, b in zip(out["fp32"], out["bf16"])]
    print(f"|p(fp32) - p(bf16)| per text: {d}")
    assert max(d) < 0.02 and max(d) > 0, d
    acc = {}
    for value in ("fp32", "bf16"):
        p = run_bq("eval", "--model", MODEL, "--data", IMDB, "--samples", 64, "--max-seq-len", 64, "--threads", 2,
                   "--precision", value, "--json", timeout=900)
        acc[value] = json.loads(p.stdout)
        if value == "bf16":
            assert any(GEMMS in l for l in p.stderr.splitlines()), p.stderr
    print(f"eval on 64 reviews: fp32 accuracy {acc['fp32']['accuracy']}, loss {acc['fp32']['loss']}; "
          f"bf16 accuracy {acc['bf16']['accuracy']}, loss {acc['bf16']['loss']}")
    assert abs(acc["fp32"]["accuracy"] - acc["bf16"]["accuracy"]) <= 2 / 64
    assert acc["fp32"]["loss"] != acc["bf16"]["loss"] and abs(acc["fp32"]["loss"] - acc["bf16"]["loss"]) < 0.02


@pytest.mark.parametrize("cmd", ["finetune", "qat"])
def test_training_records_precision(cmd, tmp_path, bin_path):
    need_model()
    h5py = pytest.importorskip("h5py")
    print(f"path exercised: {PATH}")
    rec = {}
    for value in ("auto", "bf16"):
        out = tmp_path / value
        p = run_bq(cmd, "--model", MODEL, "--data", IMDB, "--out", out, *TINY, "--precision", value, timeout=900)
        lines = header(p.stderr, cmd)
        if value == "bf16":
            assert len(lines) == 2 and HEADER in lines[0] and lines[1].startswith(f"[{cmd}] {GEMMS}"), lines
        else:
            assert len(lines) == 1 and lines[0].startswith(f"[{cmd}] precision: fp32 (auto: "), lines
        with h5py.File(out / "training_state.h5", "r") as f:
            r = f.attrs["precision"]
        rec[value] = r.decode() if isinstance(r, bytes) else str(r)
    print(f"training_state.h5 precision: auto -> {rec['auto']}, bf16 -> {rec['bf16']}")
    assert rec == {"auto": "fp32", "bf16": "bf16"}
    # a resume in another precision would not continue the run: refused in one line naming the flag
    p = run_bq(cmd, "--model", MODEL, "--data", IMDB, "--out", tmp_path / "bf16", *TINY, "--resume", check=False,
               timeout=900)
    err = p.stderr.strip().splitlines()[-1]
    print(f"--resume of the bf16 run under auto -> exit {p.returncode}: {err}")
    assert p.returncode == 2 and err == (f"bertqat {cmd}: --resume: {tmp_path / 'bf16'} was trained with --precision "
                                         "bf16; resume it with --precision bf16 (this run resolved to fp32)"), p.stderr
