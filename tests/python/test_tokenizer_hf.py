"""bq tokenizer vs Hugging Face `tokenizers` (Tokenizer.from_file of bert-base-uncased tokenizer.json):
all 50,000 IMDB train+test reviews (pos/neg) plus hard strings, untruncated and at max length 512, must
give 100% identical ids. The C side is bench_tokenizer --dump (one process for the whole batch, texts
NUL-separated, so newlines inside texts are kept); the CLI `bertqat tokenize` is checked on the hard
strings. Prints the mismatch count and the first mismatches."""
import os
import subprocess
import tarfile
import tempfile

import pytest

from conftest import BIN, BUILD, DATA, IMDB, VOCAB

BENCH = os.path.join(BUILD, "bench_tokenizer")
TOKJSON = os.path.join(DATA, "vocab", "bert-base-uncased", "tokenizer.json")

HARD = [
    "Hello, World! It's a test.",
    "Crème brûlée, naïve café, résumé, Ångström, Øre, Łódź, Ærø",
    "Ελληνικά: Καλημέρα κόσμε! ΣΊΣΥΦΟΣ ΟΔΥΣΣΕΎΣ",
    "Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "中文字符测试，你好世界！日本語のテキスト。한국어 텍스트입니다",
    "Mixed漢字and英語words",
    "emoji 😀😃 👍🏽 family 👨‍👩‍👧‍👦 flag 🇩🇪 heart ❤️",
    "combining: e\u0301 a\u0308 o\u0302\u0323 n\u0303 ḍ̇",
    "control:\x01\x02\x07\x1b[0m\x7f\u0085\u200b\u200d\u2060\ufeff\u00ad end",
    "tabs\tand\nnewlines\r\nand\u00a0nbsp\u2003em\u3000ideo\u2028ls\u2029ps",
    "a" * 99 + " " + "b" * 100 + " " + "c" * 101 + " " + "é" * 101 + " " + "é" * 100,
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "This movie was great!<br /><br />I loved it.<br />10/10",
    "$1,234.56 3.14159 1e-10 +/-5% #1 @user 12:30pm 2nd-3rd (x) [y] {z} ~a^b_c|d`e\\f",
    "İstanbul ıi İ I Turkish; DİYARBAKIR",
    "Straße STRASSE ß ẞ ﬁ ﬂ ligatures",
    "full-width ＡＢＣ１２３！？ and half-width ｶﾀｶﾅ",
    "quotes “double” ‘single’ «guillemets» „low“ – en — em … ellipsis • bullet",
    "math ∑∫√∞≠≤≥ ± × ÷ ° ℃ № ™ © ®",
    "Hangul 한글 Jamo 가 Thai ภาษาไทย Hindi हिन्दी Arabic العربية Hebrew עברית",
    "[CLS] special [SEP] tokens [MASK] in [PAD] text [UNK] and [cls] lower",
    "private \ue000 use and unassigned \U000e0001 tag \U0001f3f4\U000e0067\U000e0062\U000e007f",
    "CJK ext 𠀀𠀁 compat 豈更 radicals ⼀⼆",
    "",
    "   ",
    "...!!!???",
    "don't won't can't I'm you're it's",
    "ǅ ǈ ǋ titlecase, Σ final σς, K Kelvin sign, Å angstrom sign",
]

# invalid UTF-8 (bytes): the C side gets the raw bytes, HF the lossy-decoded text
HARD_BYTES = [
    b"bad \xff byte",
    b"truncated \xe2\x82 euro",
    b"overlong \xc0\xaf slash \xe0\x80\xaf",
    b"surrogate \xed\xa0\x80 half",
    b"lone cont \x80\x81 bytes and \xf4\x90\x80\x80 too big",
    b"ok \xe2\x82\xac euro then \xf0\x9f\x98 cut",
    b"\xfe\xfe\xfe",
]


def imdb_texts():
    texts = []
    with tarfile.open(IMDB, "r:gz") as tf:
        for m in tf:
            if not m.isfile() or not m.name.endswith(".txt"):
                continue
            parts = m.name.split("/")
            if len(parts) < 3 or parts[-3] not in ("train", "test") or parts[-2] not in ("pos", "neg"):
                continue
            texts.append(tf.extractfile(m).read())
    return texts


def hf_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(TOKJSON)


def c_encode(raw_texts, tmp, max_len=0):
    inp = os.path.join(tmp, "in.bin")
    out = os.path.join(tmp, "out.txt")
    with open(inp, "wb") as f:
        f.write(b"\0".join(t.replace(b"\0", b"") for t in raw_texts))
    subprocess.run([BENCH, "--vocab", VOCAB, "--input", inp, "--max-seq-len", str(max_len), "--repeat", "0",
                    "--dump", out], check=True, timeout=600)
    with open(out) as f:
        lines = f.read().split("\n")[:-1]
    assert len(lines) == len(raw_texts), (len(lines), len(raw_texts))
    return [list(map(int, l.split())) for l in lines]


def compare(name, texts, ours, theirs):
    bad = [i for i in range(len(texts)) if ours[i] != theirs[i]]
    print(f"{name}: {len(texts)} texts, {len(bad)} mismatches")
    for i in bad[:5]:
        o, t = ours[i], theirs[i]
        k = next((j for j in range(min(len(o), len(t))) if o[j] != t[j]), min(len(o), len(t)))
        print(f"  #{i} len ours {len(o)} hf {len(t)}, first diff at {k}: ours {o[k:k + 8]} hf {t[k:k + 8]}")
        print(f"    text: {texts[i][:300]!r}")
    return len(bad)


@pytest.fixture(scope="module")
def corpus():
    assert os.access(BENCH, os.X_OK), f"{BENCH} not built"
    assert os.path.exists(IMDB), f"{IMDB} missing"
    raw = imdb_texts()
    assert len(raw) == 50000, len(raw)
    raw += [s.encode() for s in HARD] + HARD_BYTES
    return raw


@pytest.mark.parametrize("max_len", [0, 512])
def test_ids_identical_to_hf(corpus, max_len, tmp_path):
    tok = hf_tokenizer()
    if max_len:
        tok.enable_truncation(max_length=max_len)
    else:
        tok.no_truncation()
    texts = [t.replace(b"\0", b"").decode("utf-8", "replace") for t in corpus]
    theirs = [e.ids for e in tok.encode_batch(texts)]
    ours = c_encode(corpus, str(tmp_path), max_len)
    nbad = compare(f"max_len {max_len}", texts, ours, theirs)
    assert nbad == 0


def test_pairs_identical_to_hf(corpus, tmp_path):
    """longest_first truncation and token types on pairs: HF pair encoding at a few lengths."""
    tok = hf_tokenizer()
    a = [t.decode("utf-8", "replace").replace("\t", " ") for t in corpus[:200]]
    b = [t.decode("utf-8", "replace").replace("\t", " ") for t in corpus[200:400]]
    recs = [(x + "\t" + y).encode() for x, y in zip(a, b)]
    for max_len in (0, 64, 129, 512):
        if max_len:
            tok.enable_truncation(max_length=max_len)
        else:
            tok.no_truncation()
        enc = tok.encode_batch(list(zip(a, b)))
        theirs = [e.ids + e.type_ids for e in enc]
        inp = os.path.join(str(tmp_path), "pairs.bin")
        out = os.path.join(str(tmp_path), "pairs.txt")
        with open(inp, "wb") as f:
            f.write(b"\0".join(recs))
        subprocess.run([BENCH, "--vocab", VOCAB, "--input", inp, "--max-seq-len", str(max_len), "--pair",
                        "--repeat", "0", "--dump", out], check=True, timeout=300)
        ours = []
        with open(out) as f:
            for line in f.read().split("\n")[:-1]:
                ids, types = line.split(" |")
                ours.append(list(map(int, ids.split())) + list(map(int, types.split())))
        assert compare(f"pairs max_len {max_len}", recs, ours, theirs) == 0


def test_cli_tokenize_matches_hf(tmp_path):
    """`bertqat tokenize` (lines, --max-seq-len, --tokens, --null-separated) on the hard strings."""
    assert os.access(BIN, os.X_OK), f"{BIN} not built"
    tok = hf_tokenizer()
    tok.no_truncation()
    lines = [s.replace("\n", " ").replace("\r", " ").replace("\u2028", " ").replace("\u2029", " ").replace(
        "\u0085", " ") for s in HARD]
    inp = tmp_path / "lines.txt"
    inp.write_bytes(("\n".join(lines) + "\n").encode())
    p = subprocess.run([BIN, "tokenize", "--vocab", VOCAB, "--max-seq-len", "0", "--special", str(inp)],
                       capture_output=True, text=True, check=True)
    ours = [list(map(int, l.split())) for l in p.stdout.split("\n")[:-1]]
    theirs = [e.ids for e in tok.encode_batch(lines)]
    assert compare("cli lines", lines, ours, theirs) == 0
    # plain pieces without specials, and tokens
    p = subprocess.run([BIN, "tokenize", "--vocab", VOCAB, "--tokens", str(inp)], capture_output=True, text=True,
                       check=True)
    toks = [l.split() for l in p.stdout.split("\n")[:-1]]
    hf_toks = [e.tokens[1:-1] for e in tok.encode_batch(lines)]
    assert compare("cli tokens", lines, toks, hf_toks) == 0
    # NUL-separated keeps newlines; truncation at 16
    tok.enable_truncation(max_length=16)
    nul = tmp_path / "nul.bin"
    assert not any("\0" in s for s in HARD)  # NUL is the separator here (NUL cleaning: test_tokenizer.c)
    nul.write_bytes(b"\0".join(s.encode() for s in HARD))
    p = subprocess.run([BIN, "tokenize", "--vocab", VOCAB, "--null-separated", "--max-seq-len", "16", str(nul)],
                       capture_output=True, text=True, check=True)
    ours = [list(map(int, l.split())) for l in p.stdout.split("\n")[:-1]]
    theirs = [e.ids for e in tok.encode_batch(HARD)]
    assert compare("cli nul 16", HARD, ours, theirs) == 0


@pytest.mark.parametrize("variant", [
    {"lowercase": False, "strip_accents": None},          # cased: no lowercase, no accent stripping
    {"lowercase": True, "strip_accents": False},          # lowercase only (Rust to_lowercase, no NFD)
    {"lowercase": False, "strip_accents": True},          # NFD + drop Mn without lowercase
    {"lowercase": True, "strip_accents": None, "handle_chinese_chars": False},
])
def test_normalizer_variants_identical_to_hf(corpus, variant, tmp_path):
    """tokenizer.json next to vocab.txt is honoured: each BertNormalizer variant against HF with the same
    file, on 5,000 reviews and the hard strings."""
    import json
    import shutil
    tokenizers = pytest.importorskip("tokenizers")
    d = tmp_path / "vocab"
    d.mkdir()
    shutil.copy(VOCAB, d / "vocab.txt")
    with open(TOKJSON) as f:
        cfg = json.load(f)
    cfg["normalizer"].update(variant)
    (d / "tokenizer.json").write_text(json.dumps(cfg))
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.no_truncation()
    raw = corpus[:5000] + corpus[50000:]
    texts = [t.replace(b"\0", b"").decode("utf-8", "replace") for t in raw]
    theirs = [e.ids for e in tok.encode_batch(texts)]
    inp = os.path.join(str(tmp_path), "in.bin")
    out = os.path.join(str(tmp_path), "out.txt")
    with open(inp, "wb") as f:
        f.write(b"\0".join(t.replace(b"\0", b"") for t in raw))
    subprocess.run([BENCH, "--vocab", str(d / "vocab.txt"), "--input", inp, "--repeat", "0", "--dump", out],
                   check=True, timeout=300)
    with open(out) as f:
        ours = [list(map(int, l.split())) for l in f.read().split("\n")[:-1]]
    assert compare(f"variant {variant}", texts, ours, theirs) == 0


def test_every_code_point_identical_to_hf(tmp_path):
    """Each Unicode scalar value c (but NUL) as "a" + c + "b", and random strings of random code points:
    catches the character classes (cleaning, punctuation, Mn, CJK, case) where utf8proc and HF differ."""
    import random
    assert os.access(BENCH, os.X_OK), f"{BENCH} not built"
    tok = hf_tokenizer()
    tok.no_truncation()
    cps = [c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
    texts = ["a" + chr(c) + "b" for c in cps]
    rng = random.Random(7)
    for _ in range(20000):
        s = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            c = rng.randint(0x20, 0x7E) if r < 0.3 else rng.randint(0x80, 0xFFFF) if r < 0.8 else \
                rng.randint(0x10000, 0x10FFFF)
            s.append(0x41 if 0xD800 <= c <= 0xDFFF else c)
        texts.append("".join(map(chr, s)))
    raw = [t.encode() for t in texts]
    theirs = [e.ids for e in tok.encode_batch(texts)]
    ours = c_encode(raw, str(tmp_path), 0)
    assert compare("every code point + random", texts, ours, theirs) == 0
