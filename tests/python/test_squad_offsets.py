"""Tokenizer offsets (bq_tokenizer_tokenize_offsets through `bertqat tokenize --offsets`) against Hugging
Face `tokenizers` offset_mapping (Tokenizer.from_file of all-MiniLM-L6-v2's tokenizer.json, no special
tokens): every context and question of the official SQuAD v1.1 dev set plus hard strings must give
identical ids and identical spans. Our spans are byte offsets; HF's count code points, so ours are
converted through the byte -> character map of each text. Prints the mismatch count and the first ones."""
import json
import os
import subprocess

import pytest

from conftest import BIN, DATA, MODEL, run_bq

DEV = os.path.join(DATA, "squad", "dev-v1.1.json")

HARD = [
    "Crème brûlée, naïve café, İstanbul DİYARBAKIR, Straße ﬁ ligature",
    "combining: e\u0301 a\u0308 o\u0302\u0323 n\u0303 then\u200bzero\u2060width\u00adsoft hyphen",
    "中文字符测试，你好世界！Mixed漢字and英語words 𠀀𠀁 豈更",
    "emoji 😀😃 👍🏽 family 👨‍👩‍👧‍👦 flag 🇩🇪",
    "a" * 99 + " " + "b" * 100 + " " + "c" * 101 + " " + "é" * 101 + " x" + "é" * 100,
    "[CLS] special [SEP] tokens [MASK] in [PAD] text [UNK] and [cls] lower",
    "tabs\tand\nnewlines\r\nand\u00a0nbsp\u2003em\u3000ideo \x01\x7f\u0085control",
    "$1,234.56 (x) [y] {z} ~a^b_c|d`e\\f — “quoted” …",
    "ǅ titlecase Σ final σς K Kelvin Å angstrom ＡＢＣ１２３ ｶﾀｶﾅ",
    "",
]


def char_index(text):
    """byte offset -> character offset for every byte offset 0..len(bytes)."""
    b = text.encode()
    m, c = [], 0
    for i in range(len(b) + 1):
        m.append(c)
        if i < len(b) and (b[i] & 0xC0) != 0x80:
            c += 1
    # a byte offset inside a multi-byte char never occurs in valid output; map it to that char's start
    return m


def ours(texts, tmp_path):
    assert os.access(BIN, os.X_OK), f"{BIN} not built"
    inp = tmp_path / "texts.bin"
    assert not any("\0" in t for t in texts)
    inp.write_bytes(b"\0".join(t.encode() for t in texts) + b"\0")
    p = run_bq("tokenize", "--vocab", os.path.join(MODEL, "vocab.txt"), "--offsets", "--null-separated", inp,
               timeout=900)
    lines = p.stdout.split("\n")[:-1]
    assert len(lines) == len(texts), (len(lines), len(texts))
    out = []
    for t, line in zip(texts, lines):
        ids, offs = line.split("||")
        cm = char_index(t)
        spans = [tuple(cm[int(x)] for x in o.split(":")) for o in offs.split()]
        out.append((list(map(int, ids.split())), spans))
    return out


def theirs(texts):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return [(e.ids, [tuple(o) for o in e.offsets]) for e in tok.encode_batch(texts, add_special_tokens=False)]


def compare(name, texts, a, b):
    bad = [i for i in range(len(texts)) if a[i] != b[i]]
    print(f"{name}: {len(texts)} texts, {len(bad)} mismatches")
    for i in bad[:5]:
        (oi, oo), (ti, to) = a[i], b[i]
        k = next((j for j in range(min(len(oo), len(to))) if oi[j] != ti[j] or oo[j] != to[j]),
                 min(len(oo), len(to)))
        print(f"  #{i} ids equal {oi == ti}, first diff at piece {k}: ours {list(zip(oi, oo))[k:k + 4]} "
              f"hf {list(zip(ti, to))[k:k + 4]}")
        print(f"    text: {texts[i][:200]!r}")
    return len(bad)


def test_offsets_hard_strings(tmp_path):
    assert compare("hard", HARD, ours(HARD, tmp_path), theirs(HARD)) == 0


def test_offsets_all_dev_contexts_and_questions(tmp_path):
    if not os.path.exists(DEV):
        pytest.skip(f"{DEV} missing")
    with open(DEV, encoding="utf-8") as f:
        dev = json.load(f)
    contexts, questions = [], []
    for art in dev["data"]:
        for para in art["paragraphs"]:
            contexts.append(para["context"])
            questions += [qa["question"] for qa in para["qas"]]
    assert len(questions) == 10570, len(questions)
    texts = contexts + questions
    n = compare("dev contexts + questions", texts, ours(texts, tmp_path), theirs(texts))
    assert n == 0


def test_offsets_flag_refuses_encoded_forms():
    """--offsets prints plain pieces only: with --pair or --max-seq-len it stops with one line."""
    for extra in (["--pair"], ["--max-seq-len", "16"], ["--special"]):
        p = run_bq("tokenize", "--vocab", os.path.join(MODEL, "vocab.txt"), "--offsets", *extra, check=False,
                   input="a\tb\n")
        assert p.returncode != 0 and p.stdout == "", (extra, p.returncode, p.stdout)
        assert "--offsets" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
