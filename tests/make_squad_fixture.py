#!/usr/bin/env python3
"""Makes tests/fixtures/squad/dev_windows.json, the reference that tests/test_squad.c compares
datasets/squad.c against: Hugging Face's windows, labels, offsets and post-processed answers for a
deterministic sample of the official SQuAD v1.1 dev questions.

Reference side: transformers' fast BERT tokenizer of all-MiniLM-L6-v2 (AutoTokenizer, tokenizer.json)
called as run_qa.py calls it, and transcriptions of run_qa.py's prepare_train_features (labels),
prepare_validation_features (context-only offsets) and utils_qa.py's postprocess_qa_predictions
(v1.1 branch) on deterministic pseudo-random logits that the C test regenerates bit for bit.

Two configurations: run_qa.py's defaults (384 / 128 / 64) and a small one (96 / 24 / 16) that makes
several windows per question and truncates questions. run_qa.py itself has no max_query_length; it is
emulated by cutting the question text at the end of its max_query_length-th piece, which tokenizes to
exactly those pieces. For every dev question the fixture holds its window count; for the sample
(every 60th question, and every 8th of the other questions with several windows, in the 384 configuration;
every 200th in the small one) it holds each window's ids, token types, labels and context byte
offsets (HF character offsets converted to UTF-8 bytes), and the post-processed answer.

Labels: run_qa.py's start loop can run past the window's last context piece when the answer starts in
it (its comment calls this an edge case) and then labels the last position of the window; the expected
label is the last context piece instead (datasets/squad.h), and hf_start keeps run_qa.py's value.

Usage: .venv/bin/python tests/make_squad_fixture.py [--data DIR] [--model DIR]"""
import argparse
import collections
import json
import os

import numpy as np
from transformers import AutoTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = [
    {"max_seq_len": 384, "doc_stride": 128, "max_query_length": 64, "every": 60, "multi_every": 8},
    {"max_seq_len": 96, "doc_stride": 24, "max_query_length": 16, "every": 200, "multi_every": 0},
]
N_BEST, MAX_ANSWER_LEN = 20, 30
START_SALT, END_SALT = 1, 2


def logit(ex, wl, t, salt):
    """Deterministic pseudo-random float32 in [-4, 4): the C test computes the same integer hash."""
    h = (ex * 1000003 + wl * 7919 + t * 104729 + salt * 15485863) & 0xFFFFFFFF
    h = (h * 2654435761) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 2246822519) & 0xFFFFFFFF
    h ^= h >> 16
    return np.float32(h / 4294967296.0 * 8.0 - 4.0)


def byte_of_char(text):
    out, b = [], 0
    for ch in text:
        out.append(b)
        b += len(ch.encode())
    out.append(b)
    return out


def cut_question(tok, q, mql):
    enc = tok(q, add_special_tokens=False, return_offsets_mapping=True)
    if len(enc["input_ids"]) <= mql:
        return q
    return q[:enc["offset_mapping"][mql - 1][1]]


def encode(tok, questions, contexts, cfg):
    """run_qa.py's tokenizer call (pad_on_right, pad_to_max_length)."""
    return tok([q.lstrip() for q in questions], contexts, truncation="only_second",
               max_length=cfg["max_seq_len"], stride=cfg["doc_stride"], return_overflowing_tokens=True,
               return_offsets_mapping=True, padding="max_length")


def train_labels(enc, i, answers, cls_id):
    """prepare_train_features, transcribed (first answer)."""
    input_ids = enc["input_ids"][i]
    offsets = enc["offset_mapping"][i]
    cls_index = input_ids.index(cls_id)
    seq = enc.sequence_ids(i)
    start_char = answers["answer_start"][0]
    end_char = start_char + len(answers["text"][0])
    ts = 0
    while seq[ts] != 1:
        ts += 1
    te = len(input_ids) - 1
    while seq[te] != 1:
        te -= 1
    if not (offsets[ts][0] <= start_char and offsets[te][1] >= end_char):
        return cls_index, cls_index, False
    last_ctx = te
    while ts < len(offsets) and offsets[ts][0] <= start_char:
        ts += 1
    hf_start = ts - 1
    while offsets[te][1] >= end_char:
        te -= 1
    return hf_start, te + 1, hf_start > last_ctx


def postprocess(contexts, windows):
    """utils_qa.postprocess_qa_predictions (v1.1) for one example; windows: (start, end, offsets|None)."""
    prelim = []
    for start_logits, end_logits, offset_mapping in windows:
        start_indexes = np.argsort(start_logits, kind="stable")[::-1][:N_BEST].tolist()
        end_indexes = np.argsort(end_logits, kind="stable")[::-1][:N_BEST].tolist()
        # argsort (stable) reversed puts the higher index first among ties where the C side keeps the
        # lower one; main() asserts that the hashed logits of a window have no ties.
        for s in start_indexes:
            for e in end_indexes:
                if (s >= len(offset_mapping) or e >= len(offset_mapping) or offset_mapping[s] is None
                        or len(offset_mapping[s]) < 2 or offset_mapping[e] is None or len(offset_mapping[e]) < 2):
                    continue
                if e < s or e - s + 1 > MAX_ANSWER_LEN:
                    continue
                prelim.append({"offsets": (offset_mapping[s][0], offset_mapping[e][1]),
                               "score": start_logits[s] + end_logits[e]})
    preds = sorted(prelim, key=lambda x: x["score"], reverse=True)[:N_BEST]
    for p in preds:
        o = p.pop("offsets")
        p["text"] = contexts[o[0]:o[1]]
    if len(preds) == 0 or (len(preds) == 1 and preds[0]["text"] == ""):
        preds.insert(0, {"text": "empty", "score": 0.0})
    return preds[0]["text"]



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("BERTQAT_DATA", os.path.join(ROOT, "..", "shared", "data")))
    ap.add_argument("--model", default=os.path.join(ROOT, "data", "models", "all-MiniLM-L6-v2"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "squad", "dev_windows.json"))
    args = ap.parse_args()
    tok = AutoTokenizer.from_pretrained(args.model, use_fast=True)
    assert tok.is_fast and tok.padding_side == "right"
    with open(os.path.join(args.data, "squad", "dev-v1.1.json"), encoding="utf-8") as f:
        dev = json.load(f)
    exs = []
    for art in dev["data"]:
        for para in art["paragraphs"]:
            for qa in para["qas"]:
                exs.append({"id": qa["id"], "question": qa["question"], "context": para["context"],
                            "answers": {"text": [a["text"] for a in qa["answers"]],
                                        "answer_start": [a["answer_start"] for a in qa["answers"]]}})
    out = {"source": "dev-v1.1.json", "n_examples": len(exs), "n_best": N_BEST, "max_answer_len": MAX_ANSWER_LEN,
           "start_salt": START_SALT, "end_salt": END_SALT, "configs": []}
    for cfg in CONFIGS:
        qs = [cut_question(tok, e["question"], cfg["max_query_length"]) for e in exs]
        enc = encode(tok, qs, [e["context"] for e in exs], cfg)
        mapping = enc["overflow_to_sample_mapping"]
        per_ex = collections.defaultdict(list)
        for i, m in enumerate(mapping):
            per_ex[m].append(i)
        counts = [len(per_ex[i]) for i in range(len(exs))]
        sample = [i for i in range(len(exs)) if i % cfg["every"] == 0]
        if cfg["multi_every"]:
            multi = [i for i in range(len(exs)) if counts[i] > 1 and i % cfg["every"]]
            sample = sorted(sample + multi[::cfg["multi_every"]])
        c = {k: cfg[k] for k in ("max_seq_len", "doc_stride", "max_query_length")}
        c["window_counts"] = counts
        c["examples"] = []
        edge = 0
        for ex in sample:
            e = exs[ex]
            b_of = byte_of_char(e["context"])
            wins, pp = [], []
            for wl, i in enumerate(per_ex[ex]):
                ids = enc["input_ids"][i]
                n = sum(enc["attention_mask"][i])
                seq = enc.sequence_ids(i)
                start, end, hit_edge = train_labels(enc, i, e["answers"], tok.cls_token_id)
                hf_start = start
                if hit_edge:  # see the docstring: the expected label stops at the last context piece
                    edge += 1
                    start = max(k for k in range(len(seq)) if seq[k] == 1)
                offs = []
                for k in range(len(ids)):
                    if seq[k] == 1:
                        a, b = enc["offset_mapping"][i][k]
                        offs += [b_of[a], b_of[b]]
                wins.append({"input_ids": ids[:n], "token_type_ids": "".join(map(str, enc["token_type_ids"][i][:n])),
                             "start": start, "end": end, "hf_start": hf_start, "context_offsets": offs})
                sl = np.array([logit(ex, wl, t, START_SALT) for t in range(cfg["max_seq_len"])], dtype=np.float32)
                el = np.array([logit(ex, wl, t, END_SALT) for t in range(cfg["max_seq_len"])], dtype=np.float32)
                assert len(set(sl.tolist())) == len(sl) and len(set(el.tolist())) == len(el), "tied logits"
                om = [o if seq[k] == 1 else None for k, o in enumerate(enc["offset_mapping"][i])]
                pp.append((sl, el, om))
            c["examples"].append({"index": ex, "id": e["id"], "windows": wins, "prediction": postprocess(e["context"], pp)})
        c["edge_cases"] = edge
        print(f"config {cfg['max_seq_len']}/{cfg['doc_stride']}/{cfg['max_query_length']}: {sum(counts)} windows, "
              f"{len(sample)} sampled questions, {sum(len(x['windows']) for x in c['examples'])} sampled windows, "
              f"{edge} run_qa start-label edge cases")
        out["configs"].append(c)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
