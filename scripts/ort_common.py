"""What the ONNX Runtime evaluation scripts (onnx_eval.py, onnx_eval_qa.py) share: the checkpoint's
tokenizer as Hugging Face `tokenizers` loads it, and one timed ORT run on a batch of token sequences. Imports no
onnxruntime itself, so that the scripts' reading and scoring import without it."""
import json
import os
import time

import numpy as np
from tokenizers import BertWordPieceTokenizer, Tokenizer


def load_tokenizer(ckpt):
    """The tokenizer of checkpoint folder `ckpt` (tokenizer.json when present, else vocab.txt with
    tokenizer_config.json's do_lower_case, default true), with no padding and no truncation."""
    tj = os.path.join(ckpt, "tokenizer.json")
    if os.path.exists(tj):
        tok = Tokenizer.from_file(tj)
    else:
        lower = True
        cfg = os.path.join(ckpt, "tokenizer_config.json")
        if os.path.exists(cfg):
            with open(cfg, encoding="utf-8") as f:
                lower = bool(json.load(f).get("do_lower_case", True))
        tok = BertWordPieceTokenizer(os.path.join(ckpt, "vocab.txt"), lowercase=lower)
    tok.no_truncation()
    tok.no_padding()
    return tok


def run_batch(sess, seqs, types=None, multiple=1):
    """Runs session `sess` on one batch: the token id sequences `seqs` (with their token types `types`, else
    zeros) padded with zeros to their longest length rounded up to a multiple of `multiple`, the attention
    mask 1 on the tokens; each input cast to the dtype the graph declares (int32 or int64) and left out
    when the graph has no such input. Returns (the outputs, the seconds of the run alone)."""
    T = (max(len(x) for x in seqs) + multiple - 1) // multiple * multiple
    ids = np.zeros((len(seqs), T), np.int64)
    mask = np.zeros_like(ids)
    tt = np.zeros_like(ids)
    for r, x in enumerate(seqs):
        ids[r, :len(x)] = x
        mask[r, :len(x)] = 1
        if types is not None:
            tt[r, :len(types[r])] = types[r]
    dtypes = {i.name: (np.int32 if i.type == "tensor(int32)" else np.int64) for i in sess.get_inputs()}
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}
    feed = {k: v.astype(dtypes[k]) for k, v in feed.items() if k in dtypes}
    t = time.perf_counter()
    out = sess.run(None, feed)
    return out, time.perf_counter() - t
