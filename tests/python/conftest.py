"""Shared helpers for the integration tests: paths to the built binary, the data and the pretrained
model (env BQ_BUILD_DIR, BERTQAT_DATA, BQ_MODEL_DIR), and run_bq() to call the CLI."""
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("BQ_BUILD_DIR", os.path.join(ROOT, "build"))
DATA = os.environ.get("BERTQAT_DATA", os.path.join(ROOT, "..", "shared", "data"))
BIN = os.path.join(BUILD, "bertqat")
MODEL = os.environ.get("BQ_MODEL_DIR", os.path.join(ROOT, "data", "models", "all-MiniLM-L6-v2"))
IMDB = os.path.join(DATA, "imdb", "aclImdb_train_test.tar.gz")
VOCAB = os.path.join(DATA, "vocab", "bert-base-uncased", "vocab.txt")


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
