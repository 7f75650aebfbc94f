#!/usr/bin/env python3
"""SQuAD v1.1 exact match and F1 of an exported question-answering ONNX model in ONNX Runtime (CPU).

A test tool that checks `bertqat eval` on a question-answering checkpoint from the outside: the
windows, post-processing and scoring are ported from datasets/squad.h (which follows Hugging Face
run_qa.py and the official evaluate-v1.1.py), with the word pieces and their character offsets from
Hugging Face `tokenizers` instead of bertqat's tokenizer:
- each question keeps its first --max-query-length pieces; a window is [CLS] question [SEP] context
  slice [SEP] with k = max_seq_len - q - 3 context pieces, windows start at context pieces 0, k - stride,
  2 (k - stride), ... until one reaches the end of the context;
- batches of windows padded to their longest window (the model's outputs `start_logits` and
  `end_logits`, (batch, sequence)); padding positions are left out of the n-best ranking, as
  `bertqat eval` does (src/qa.h);
- per window the --n-best highest start and end logits (ties: lower position first), pairs of context
  pieces with end >= start and at most --max-answer-len pieces, score start + end in float32; the best
  pair over a question's windows (first found wins ties) gives the answer text through the offsets,
  "empty" when none is valid;
- the official normalisation (lowercase, no ASCII punctuation, no a/an/the, single spaces), exact match
  and token F1, maximum over the reference answers, averaged over questions, x100.
Prints one JSON object with --json (keys as `bertqat eval --json`: exact_match, f1, examples, windows);
--predictions writes the official {id: answer} JSON.
"""
import argparse
import collections
import json
import os
import re
import string
import sys

import numpy as np

from ort_common import load_tokenizer, run_batch


def read_squad(path, samples):
    """The first `samples` questions (0: all) in file order: (id, question, context, answers), answers as in
    the file ({"text", "answer_start"}; bench/peer_hf_run_qa.py trains on the starts)."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    out = []
    for art in doc["data"]:
        for par in art["paragraphs"]:
            for qa in par["qas"]:
                out.append((qa["id"], qa["question"], par["context"], qa["answers"]))
                if samples and len(out) == samples:
                    return out
    return out


def windows(tok, examples, L, stride, mql):
    """(example index, ids, types, offsets) per window; offsets None outside the context."""
    contexts = {}
    for _, _, c, _ in examples:
        if c not in contexts:
            contexts[c] = tok.encode(c, add_special_tokens=False)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    out = []
    for e, (_, q, c, _) in enumerate(examples):
        qids = tok.encode(q, add_special_tokens=False).ids[:mql]
        enc = contexts[c]
        nq, nc = len(qids), len(enc.ids)
        k = L - nq - 3
        cs = 0
        while True:
            w = min(nc - cs, k)
            ids = [cls] + qids + [sep] + enc.ids[cs:cs + w] + [sep]
            types = [0] * (nq + 2) + [1] * (w + 1)
            offs = [None] * (nq + 2) + list(enc.offsets[cs:cs + w]) + [None]
            out.append((e, ids, types, offs))
            if cs + w >= nc:
                break
            cs += k - stride
    return out


def top_n(x, n):
    return np.argsort(-x, kind="stable")[:n]


def answers(examples, wins, start, end, n_best, max_len):
    best = [None] * len(examples)  # (score, char begin, char end)
    for w, (e, ids, _, offs) in enumerate(wins):
        sl, el = start[w], end[w]
        for i in top_n(sl, n_best):
            if i >= len(ids) or offs[i] is None:
                continue
            for j in top_n(el, n_best):
                if j >= len(ids) or offs[j] is None or j < i or j - i + 1 > max_len:
                    continue
                score = np.float32(sl[i]) + np.float32(el[j])
                if best[e] is None or score > best[e][0]:
                    best[e] = (score, offs[i][0], offs[j][1])
    return ["empty" if b is None else examples[e][2][b[1]:max(b[1], b[2])] for e, b in enumerate(best)]


def normalize(s):
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def f1_score(pred, ref):
    p, r = normalize(pred).split(), normalize(ref).split()
    common = collections.Counter(p) & collections.Counter(r)
    same = sum(common.values())
    if same == 0:
        return 0.0
    prec, rec = same / len(p), same / len(r)
    return 2 * prec * rec / (prec + rec)


def score(examples, preds):
    """Official v1.1 exact match and F1 (x100): per question the maximum over its reference answers,
    averaged over questions."""
    em = f1 = 0.0
    for ex, p in zip(examples, preds):
        refs = [a["text"] for a in ex[3]]
        em += max(float(normalize(p) == normalize(r)) for r in refs)
        f1 += max(f1_score(p, r) for r in refs)
    return 100.0 * em / len(examples), 100.0 * f1 / len(examples)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--onnx", "--model", dest="onnx", required=True, help="the .onnx file")
    ap.add_argument("--tokenizer", required=True, help="checkpoint directory with the tokenizer files")
    ap.add_argument("--data", required=True, help="SQuAD v1.1 JSON (dev-v1.1.json)")
    ap.add_argument("--samples", type=int, default=0, help="first N questions, as bertqat eval --samples (0: all)")
    ap.add_argument("--max-seq-len", type=int, default=384)
    ap.add_argument("--doc-stride", type=int, default=128)
    ap.add_argument("--max-query-length", type=int, default=64)
    ap.add_argument("--n-best", type=int, default=20)
    ap.add_argument("--max-answer-len", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="ORT intra-op threads (0: ORT's default)")
    ap.add_argument("--graph-opt", choices=("all", "none"), default="all")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--predictions", help="write the official {id: answer} JSON here")
    ap.add_argument("--dump-logits", help="write the start and end logits of every window (npz) here")
    a = ap.parse_args()
    for p in (a.onnx, a.data, a.tokenizer):
        if not os.path.exists(p):
            sys.exit(f"onnx_eval_qa.py: {p}: no such file or directory")
    if a.doc_stride >= a.max_seq_len - a.max_query_length - 3:
        sys.exit(f"onnx_eval_qa.py: --doc-stride {a.doc_stride} must be below the context tokens of a window")
    examples = read_squad(a.data, a.samples)
    if not examples:
        sys.exit(f"onnx_eval_qa.py: {a.data}: no questions")
    tok = load_tokenizer(a.tokenizer)
    wins = windows(tok, examples, a.max_seq_len, a.doc_stride, a.max_query_length)
    import onnxruntime as ort  # here, so that the reading and scoring above import without it

    so = ort.SessionOptions()
    if a.threads:
        so.intra_op_num_threads = a.threads
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if a.graph_opt == "all"
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.log_severity_level = 3
    sess = ort.InferenceSession(a.onnx, so, providers=["CPUExecutionProvider"])
    outs = [o.name for o in sess.get_outputs()]
    if outs != ["start_logits", "end_logits"]:
        sys.exit(f"onnx_eval_qa.py: {a.onnx}: outputs {outs}, expected start_logits and end_logits")
    L = a.max_seq_len
    start = np.full((len(wins), L), -np.inf, np.float32)
    end = np.full((len(wins), L), -np.inf, np.float32)
    secs = 0.0
    for s in range(0, len(wins), a.batch_size):
        batch = wins[s:s + a.batch_size]
        (sl, el), dt = run_batch(sess, [w[1] for w in batch], [w[2] for w in batch])
        secs += dt
        for r, (_, wi, _, _) in enumerate(batch):
            start[s + r, :len(wi)] = sl[r, :len(wi)]
            end[s + r, :len(wi)] = el[r, :len(wi)]
    if a.dump_logits:
        np.savez(a.dump_logits, start=start, end=end)
    pred = answers(examples, wins, start, end, min(a.n_best, L), a.max_answer_len)
    em, f1 = score(examples, pred)
    if a.predictions:
        with open(a.predictions + ".tmp", "w", encoding="utf-8") as f:
            json.dump({ex[0]: p for ex, p in zip(examples, pred)}, f, ensure_ascii=False)
        os.replace(a.predictions + ".tmp", a.predictions)
    res = {"model": a.onnx, "data": a.data, "task": "qa", "examples": len(examples), "windows": len(wins),
           "exact_match": em, "f1": f1, "seconds": secs, "examples_per_s": len(examples) / max(secs, 1e-9),
           "max_seq_len": L, "doc_stride": a.doc_stride, "max_query_length": a.max_query_length,
           "n_best": a.n_best, "max_answer_len": a.max_answer_len, "batch_size": a.batch_size,
           "threads": a.threads or None, "runtime": f"onnxruntime {ort.__version__} CPUExecutionProvider"}
    if a.json:
        print(json.dumps(res))
    else:
        print(f"questions {len(examples)}  windows {len(wins)}  exact match {em:.2f}  f1 {f1:.2f}  "
              f"({secs:.2f}s in ONNX Runtime)")


if __name__ == "__main__":
    main()
