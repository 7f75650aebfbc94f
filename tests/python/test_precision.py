"""--precision fp32|bf16|auto on every command that runs the model (finetune, qat, eval, predict, pipeline,
bench): bf16 on a CPU without AVX512-BF16/AMX-BF16 is a one-line error naming the missing ISA (exit 2),
on a bf16 CPU a one-line error saying this build has no bf16 GEMMs (exit 2); a word that is no precision
is exit 2; auto and fp32 run and print the resolved precision in the run header; a tiny fine-tune records
it in training_state.h5; --version prints the CPU's bf16 line. Each test prints which path it exercised."""
import os

import pytest

from conftest import IMDB, MODEL, run_bq


def cpu_has_bf16():
    with open("/proc/cpuinfo") as f:
        flags = next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


BF16_MSG = ("bf16 training is not implemented yet in this build" if cpu_has_bf16()
            else "this CPU has neither AVX512-BF16 nor AMX-BF16 (found")


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


@pytest.mark.parametrize("cmd", ["finetune", "qat", "eval", "predict", "pipeline", "bench"])
def test_bf16_refused(cmd, tmp_path, bin_path):
    if not os.path.isdir(MODEL):
        pytest.skip(f"pretrained model not found at {MODEL}")
    p = run_bq(*cmd_args(cmd, tmp_path), "--precision", "bf16", check=False, timeout=300)
    err = p.stderr.strip().splitlines()[-1]
    print(f"{cmd} --precision bf16 -> exit {p.returncode}: {err}"
          f" (path: {'bf16 CPU, not implemented' if cpu_has_bf16() else 'CPU without bf16'})")
    assert p.returncode == 2, p.stderr
    assert err.startswith(f"bertqat {cmd}: --precision bf16: ") and BF16_MSG in err, err
    assert not (tmp_path / "o").exists() and not (tmp_path / "run").exists()
    p = run_bq(*cmd_args(cmd, tmp_path), "--precision", "fp16", check=False, timeout=300)
    assert p.returncode == 2 and "--precision: 'fp16' is not fp32, bf16 or auto" in p.stderr, p.stderr


def test_predict_header_and_version(bin_path):
    if not os.path.isdir(MODEL):
        pytest.skip(f"pretrained model not found at {MODEL}")
    for value in ("auto", "fp32"):
        p = run_bq("predict", "--model", MODEL, "--precision", value, "--threads", 1, "A fine film.")
        line = next(l for l in p.stderr.splitlines() if l.startswith("[predict] precision: "))
        print(line)
        assert line.startswith("[predict] precision: fp32 ("), line
    v = run_bq("--version").stdout
    print(v)
    assert "CPU bf16: AVX512-BF16 " in v and "--precision auto runs fp32" in v


def test_finetune_records_precision(tmp_path, bin_path):
    if not os.path.isdir(MODEL):
        pytest.skip(f"pretrained model not found at {MODEL}")
    h5py = pytest.importorskip("h5py")
    out = tmp_path / "ft"
    p = run_bq("finetune", "--model", MODEL, "--data", IMDB, "--out", out, "--max-steps", 1, "--train-samples", 64,
               "--val-fraction", 0, "--batch-size", 8, "--max-seq-len", 32, "--threads", 2, "--no-cache",
               "--precision", "auto", timeout=900)
    assert "[finetune] precision: fp32 (auto: " in p.stderr, p.stderr
    with h5py.File(out / "training_state.h5", "r") as f:
        rec = f.attrs["precision"]
    rec = rec.decode() if isinstance(rec, bytes) else str(rec)
    print(f"training_state.h5 precision = {rec}")
    assert rec == "fp32"
