"""bertqat's IMDB example selection in Python, for the tools that check bertqat against the peers
(scripts/onnx_eval.py, bench/peer_hf_trainer_imdb.py): the same reviews, in the same order, as
`bertqat eval/finetune --seed S --samples N --train-samples N --val-fraction F` select.

- Reviews of a split are ordered by (label folder name, numeric id), as datasets/source.c orders them,
  from the aclImdb archive (.tar.gz/.tgz/.tar) or an extracted folder (PATH/{split} or PATH/aclImdb/{split}).
- Selection (datasets/dataset.c): the split is permuted by Fisher-Yates driven by bertqat's bq_rng
  (xoshiro256** seeded through splitmix64, autograd/core.c), the first N kept (0: all); for train/val
  the last ceil(val_fraction * kept) of those are the validation examples.
Labels: neg = 0, pos = 1."""
import math
import os
import re
import tarfile

M64 = (1 << 64) - 1
NAME = re.compile(r"(?:^|/)(train|test)/(pos|neg)/(\d+)_\d+\.txt$")


class BqRng:
    """autograd/core.c bq_rng: xoshiro256** seeded by four splitmix64 outputs."""

    def __init__(self, seed):
        x, self.s = seed & M64, []
        for _ in range(4):
            x = (x + 0x9E3779B97F4A7C15) & M64
            z = x
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
            self.s.append(z ^ (z >> 31))

    def u64(self):
        s = self.s
        rotl = lambda v, k: ((v << k) | (v >> (64 - k))) & M64
        r = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return r

    def below(self, n):
        """Uniform in [0, n) with rejection of the modulo bias (bq_rng_below)."""
        limit = M64 - (M64 % n)
        while True:
            x = self.u64()
            if x < limit:
                return x % n


def permutation(n, seed):
    """bq_rng_shuffle_i32 of 0..n-1."""
    p, r = list(range(n)), BqRng(seed)
    for i in range(n - 1, 0, -1):
        j = r.below(i + 1)
        p[i], p[j] = p[j], p[i]
    return p


def read_imdb(path):
    """{"train": [(text, label)], "test": [...]} in bertqat's order."""
    rows = {"train": [], "test": []}
    if os.path.isdir(path):
        base = path if os.path.isdir(os.path.join(path, "train")) or os.path.isdir(os.path.join(path, "test")) \
            else os.path.join(path, "aclImdb")
        for split in rows:
            for lab in ("neg", "pos"):
                d = os.path.join(base, split, lab)
                if not os.path.isdir(d):
                    continue
                for f in os.listdir(d):
                    g = NAME.search(f"{split}/{lab}/{f}")
                    if g:
                        with open(os.path.join(d, f), "rb") as fh:
                            rows[split].append((lab, int(g.group(3)), fh.read()))
    else:
        with tarfile.open(path, "r:*") as tf:
            for m in tf:
                g = NAME.search(m.name)
                if g and m.isfile():
                    rows[g.group(1)].append((g.group(2), int(g.group(3)), tf.extractfile(m).read()))
    out = {}
    for split, r in rows.items():
        r.sort(key=lambda x: (x[0], x[1]))
        out[split] = [(b.decode("utf-8", errors="replace"), 1 if lab == "pos" else 0) for lab, _, b in r]
    return out


def select(reviews, split, seed=42, samples=0, train_samples=0, val_fraction=0.1):
    """The examples bertqat selects for split "train", "val" or "test", in its order."""
    if split == "test":
        src = reviews["test"]
        p = permutation(len(src), seed)
        return [src[i] for i in (p[:samples] if samples else p)]
    src = reviews["train"]
    p = permutation(len(src), seed)
    if train_samples:
        p = p[:train_samples]
    nval = min(len(p), int(math.ceil(val_fraction * len(p) - 1e-9)))
    chosen = p[len(p) - nval:] if split == "val" else p[:len(p) - nval]
    return [src[i] for i in chosen]
