"""bertqat data-stats on the real IMDB archive and on an extracted copy of it: 25,000 train and 25,000
test reviews, 12,500 per label per split, identical statistics and identical encoded batches (checksums
from --dump-batches), and a second run on the archive served from the encoded-set cache with the same
batches. Needs $BERTQAT_DATA/imdb/aclImdb_train_test.tar.gz and the bert-base-uncased vocabulary."""
import os
import re
import subprocess
import tarfile

import pytest

from conftest import BUILD, DATA
ARCHIVE = os.path.join(DATA, "imdb", "aclImdb_train_test.tar.gz")
VOCAB = os.path.join(DATA, "vocab", "bert-base-uncased", "vocab.txt")


def data_stats(path, cache_dir, *extra):
    exe = os.path.join(BUILD, "bertqat")
    assert os.path.exists(exe), f"{exe} not built"
    cmd = [exe, "data-stats", "--data", path, "--vocab", VOCAB, "--max-seq-len", "256", "--cache-dir", str(cache_dir),
           "--dump-batches", "12", "--batch-size", "16", "--bucket", "--seed", "7", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    return out.stdout


def counts(stdout):
    rows = {}
    for line in stdout.splitlines():
        m = re.match(r"^(train|val|test)\s+(\d+)\s+(\d+)\s+(\d+)\s+(.*=.*)$", line)
        if m:
            rows[m.group(1)] = (int(m.group(2)), dict(kv.split("=") for kv in m.group(5).split()))
    return rows


def body(stdout):
    """Everything but the lines naming the path, timing and cache file."""
    return [l for l in stdout.splitlines() if not l.startswith(("data:", "train:", "test:", "val:"))]


def test_archive_and_extracted_copy_agree(tmp_path):
    if not os.path.exists(ARCHIVE):
        pytest.fail(f"{ARCHIVE} missing (set BERTQAT_DATA)")
    cache = tmp_path / "cache"
    a = data_stats(ARCHIVE, cache)
    rows = counts(a)
    assert rows["train"] == (25000, {"neg": "12500", "pos": "12500"}), a
    assert rows["test"] == (25000, {"neg": "12500", "pos": "12500"}), a
    assert "batches 12 checksum" in a

    # second run: from the cache, same statistics and batches
    a2 = data_stats(ARCHIVE, cache)
    assert "train: loaded from cache" in a2 and "test: loaded from cache" in a2
    assert body(a2) == body(a)

    # extracted copy (folder): identical data
    ext = tmp_path / "extracted"
    with tarfile.open(ARCHIVE) as tf:
        members = [m for m in tf.getmembers() if "/train/" in m.name or "/test/" in m.name]
        tf.extractall(ext, members=members)
    root = ext / "aclImdb" if (ext / "aclImdb").is_dir() else ext
    e = data_stats(str(root), cache)
    assert "train: encoded" in e  # a different source identity: not served from the archive's cache
    assert body(e) == body(a)
