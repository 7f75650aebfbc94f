"""--precision fp32|bf16|auto on every command that runs the model (finetune, qat, eval, predict, pipeline,
bench). auto resolves to bf16 where the CPU has AVX512-BF16 or AMX-BF16 and to fp32 elsewhere (every kind
of CPU is checked with synthetic features by tests/test_precision.c; here only this CPU's answer); bf16
runs everywhere: on the bf16 units (oneDNN) where the CPU has them, emulated elsewhere, and the run header
says which, once. A word that is no precision is exit 2 with a one-line error. A tiny fine-tune and QAT
under auto and in the other precision record what each resolved to in training_state.h5, and --resume
under auto of the run in the other precision is refused in one line; eval and predict in bf16 give results
close to fp32 but not identical (the GEMMs did run in bf16); --version prints the CPU's bf16 line with what
auto runs. Without --precision a command takes $BQ_PRECISION, else auto. Each test prints which path it
exercised."""
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
AUTO = "bf16" if cpu_has_bf16() else "fp32"  # what --precision auto resolves to on this CPU
OTHER = "fp32" if cpu_has_bf16() else "bf16"  # the precision auto does not choose here
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


def auto_header_ok(lines, cmd):
    """The run header of --precision auto on this CPU: bf16 naming the CPU's bf16 ISA and then the bf16 GEMM
    path, or fp32 naming the ISAs the CPU lacks."""
    if AUTO == "bf16":
        return (len(lines) == 2 and lines[0].startswith(f"[{cmd}] precision: bf16 (auto: the CPU has ")
                and lines[1].startswith(f"[{cmd}] {GEMMS}"))
    return len(lines) == 1 and lines[0] == f"[{cmd}] precision: fp32 (auto: the CPU has neither AVX512-BF16 nor AMX-BF16)"


def test_auto_and_version(bin_path):
    need_model()
    print(f"auto on this CPU: {AUTO}")
    for value in ("auto", "fp32"):
        p = run_bq("predict", "--model", MODEL, "--precision", value, "--threads", 1, "A fine film.")
        lines = header(p.stderr, "predict")
        if value == "auto":
            assert auto_header_ok(lines, "predict"), lines
        else:
            assert lines == ["[predict] precision: fp32 (flag)"], lines
    v = run_bq("--version").stdout
    print(v)
    assert "CPU bf16: AVX512-BF16 " in v and f"--precision auto runs {AUTO} (the CPU has " in v


def test_precision_from_environment(bin_path):
    """Without --precision a command takes $BQ_PRECISION (conftest.py sets fp32 for the suite), else auto; the
    flag wins over the variable, and a variable that is no precision is refused in one line naming it."""
    need_model()
    base = {k: v for k, v in os.environ.items() if k != "BQ_PRECISION"}

    def run(env, *flag):
        p = run_bq("predict", "--model", MODEL, *flag, "--threads", 1, "A fine film.", env=env, check=False)
        return p, header(p.stderr, "predict")

    p, lines = run(base)
    assert p.returncode == 0 and auto_header_ok(lines, "predict"), lines
    p, lines = run({**base, "BQ_PRECISION": "fp32"})
    assert p.returncode == 0 and lines == ["[predict] precision: fp32 (BQ_PRECISION)"], lines
    p, lines = run({**base, "BQ_PRECISION": "bf16"})
    assert p.returncode == 0 and len(lines) == 2, lines
    assert lines[0].startswith("[predict] precision: bf16 (BQ_PRECISION" + HEADER[len("(flag"):]), lines
    p, lines = run({**base, "BQ_PRECISION": "bf16"}, "--precision", "fp32")
    assert p.returncode == 0 and lines == ["[predict] precision: fp32 (flag)"], lines
    p, lines = run({**base, "BQ_PRECISION": "fp16"})
    err = p.stderr.strip().splitlines()[-1]
    print(f"BQ_PRECISION=fp16 -> exit {p.returncode}: {err}")
    assert p.returncode == 2 and err == "bertqat predict: BQ_PRECISION: 'fp16' is not fp32, bf16 or auto", p.stderr


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
    for value in ("auto", OTHER):
        out = tmp_path / value
        p = run_bq(cmd, "--model", MODEL, "--data", IMDB, "--out", out, *TINY, "--precision", value, timeout=900)
        lines = header(p.stderr, cmd)
        if value == "auto":
            assert auto_header_ok(lines, cmd), lines
        elif value == "bf16":
            assert len(lines) == 2 and HEADER in lines[0] and lines[1].startswith(f"[{cmd}] {GEMMS}"), lines
        else:
            assert lines == [f"[{cmd}] precision: fp32 (flag)"], lines
        with h5py.File(out / "training_state.h5", "r") as f:
            r = f.attrs["precision"]
        rec[value] = r.decode() if isinstance(r, bytes) else str(r)
    print(f"training_state.h5 precision: auto -> {rec['auto']}, {OTHER} -> {rec[OTHER]}")
    # a run under auto records what auto resolved to, not the word auto
    assert rec == {"auto": AUTO, OTHER: OTHER}
    # a resume in another precision would not continue the run: refused in one line naming the flag
    # (--precision auto said: the suite's BQ_PRECISION=fp32 would otherwise resolve it, conftest.py)
    p = run_bq(cmd, "--model", MODEL, "--data", IMDB, "--out", tmp_path / OTHER, *TINY, "--resume",
               "--precision", "auto", check=False, timeout=900)
    err = p.stderr.strip().splitlines()[-1]
    print(f"--resume of the {OTHER} run under auto -> exit {p.returncode}: {err}")
    assert p.returncode == 2 and err == (f"bertqat {cmd}: --resume: {tmp_path / OTHER} was trained with --precision "
                                         f"{OTHER}; resume it with --precision {OTHER} (this run resolved to {AUTO})"), p.stderr
