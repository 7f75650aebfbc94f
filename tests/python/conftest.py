"""Shared helpers for the integration tests: paths to the built binary, the data and the pretrained
model (env BQ_BUILD_DIR, BERTQAT_DATA, BQ_MODEL_DIR), run_bq() to call the CLI, and the small-budget
fp32 fine-tune that several tests start from (made once per session). Under CI (the environment variable
CI set), a skipped test is reported as a failure: a test whose dependency is missing must fail there.

The tests compare bertqat against fp32 peers (PyTorch, ONNX Runtime, the Hugging Face Trainer) with fp32
bounds, and --precision auto is bf16 on a CPU with AVX512-BF16 or AMX-BF16; so every bertqat the tests
start runs in fp32 unless its command line says otherwise: BQ_PRECISION=fp32 in the environment, which
a command without --precision takes (export BQ_PRECISION=auto to run the suite under auto instead).
test_precision.py passes --precision wherever it checks a precision."""
import os
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BQ_BUILD_DIR", os.path.join(ROOT, "build"))
DATA = os.environ.get("BERTQAT_DATA", os.path.join(ROOT, "..", "shared", "data"))
BIN = os.path.join(BUILD, "bertqat")
MODEL = os.environ.get("BQ_MODEL_DIR", os.path.join(ROOT, "data", "models", "all-MiniLM-L6-v2"))
IMDB = os.path.join(DATA, "imdb", "aclImdb_train_test.tar.gz")
VOCAB = os.path.join(DATA, "vocab", "bert-base-uncased", "vocab.txt")
os.environ.setdefault("BQ_PRECISION", "fp32")  # the module docstring says why


def run_bq(*args, check=True, timeout=1800, input=None, env=None):
    """Runs the bertqat binary; returns CompletedProcess (text)."""
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout, input=input,
                       env=env)
    if check and p.returncode != 0:
        raise AssertionError(f"bertqat {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


@pytest.fixture(scope="session")
def bin_path():
    assert os.access(BIN, os.X_OK), f"{BIN} not built"
    return BIN


def _skip_fails_under_ci(rep):
    if os.environ.get("CI") and rep.skipped and not hasattr(rep, "wasxfail"):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"skipped under CI, which must not happen (a missing dependency fails there): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _skip_fails_under_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _skip_fails_under_ci(outcome.get_result())


THREADS = os.environ.get("BQ_TEST_THREADS", "2")
# The small-budget fine-tune (test_finetune_imdb's recipe; test_qat_imdb starts from its checkpoint).
FINETUNE_ARGS = ["--train-samples", 2000, "--val-fraction", 0.05, "--epochs", 1, "--lr", 1e-4,
                 "--warmup-ratio", 0.1, "--batch-size", 16, "--max-seq-len", 128, "--seed", 42,
                 "--threads", THREADS, "--log-every", 10, "--bucket"]


@pytest.fixture(scope="session")
def finetuned(tmp_path_factory, bin_path):
    """(checkpoint dir, CompletedProcess, seconds) of all-MiniLM-L6-v2 fine-tuned on 2000 IMDB reviews."""
    if not os.path.isdir(MODEL):
        pytest.skip(f"pretrained model not found at {MODEL}")
    assert os.path.exists(IMDB), f"IMDB archive missing: {IMDB}"
    out = tmp_path_factory.mktemp("finetuned") / "fp32"
    t0 = time.time()
    p = run_bq("finetune", "--model", MODEL, "--data", IMDB, "--out", out, *FINETUNE_ARGS, timeout=3600)
    return out, p, time.time() - t0
