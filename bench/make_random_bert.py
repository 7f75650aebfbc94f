"""Writes a Hugging Face BERT directory with seeded random weights in a given shape, for speed and memory
measurements where only the shapes matter (time and memory do not depend on the values; accuracies are
chance level). The default shape is BERT-base (12 layers, hidden 768, 12 heads, intermediate 3072, the
shape bench/bench_train_step.c builds when it gets no --model); --shape minilm gives all-MiniLM-L6-v2's.

The directory holds config.json (BertModel, so bertqat draws the classifier from its seed as it does
for a pretrained encoder), model.safetensors with BertModel's tensor names (embeddings, encoder,
pooler) drawn as Hugging Face's _init_weights draws them (normal(0, 0.02) for Linear weights and
embeddings, LayerNorm weights 1, biases 0, the [PAD] row of the word embeddings 0), and the tokenizer
files copied from --tokenizer (default all-MiniLM-L6-v2, whose vocabulary is bert-base-uncased's 30,522
tokens). Every bertqat command takes it as --model, calibrate included:

  python3 bench/make_random_bert.py --out runs/bert-base-random [--shape base|minilm] [--seed 0]
  bertqat calibrate --model runs/bert-base-random --data $D --out runs/bert-base-ptq --scheme cpu --calib-samples 32
  bertqat eval --model runs/bert-base-ptq --data $D --samples 64 --engine int8

Needs numpy only."""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
    "minilm": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
}
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def config_for(shape, vocab_size):
    c = {"architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu",
         "attention_probs_dropout_prob": 0.1, "hidden_dropout_prob": 0.1, "initializer_range": 0.02,
         "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "pad_token_id": 0,
         "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": vocab_size}
    c.update(SHAPES[shape])
    return c


def tensor_shapes(c):
    """BertModel's state dict as (name, shape) pairs, in its order."""
    H, I, out = c["hidden_size"], c["intermediate_size"], []
    out += [("embeddings.word_embeddings.weight", (c["vocab_size"], H)),
            ("embeddings.position_embeddings.weight", (c["max_position_embeddings"], H)),
            ("embeddings.token_type_embeddings.weight", (c["type_vocab_size"], H)),
            ("embeddings.LayerNorm.weight", (H,)), ("embeddings.LayerNorm.bias", (H,))]
    for l in range(c["num_hidden_layers"]):
        p = f"encoder.layer.{l}."
        for name, n, k in (("attention.self.query", H, H), ("attention.self.key", H, H),
                           ("attention.self.value", H, H), ("attention.output.dense", H, H)):
            out += [(p + name + ".weight", (n, k)), (p + name + ".bias", (n,))]
        out += [(p + "attention.output.LayerNorm.weight", (H,)), (p + "attention.output.LayerNorm.bias", (H,)),
                (p + "intermediate.dense.weight", (I, H)), (p + "intermediate.dense.bias", (I,)),
                (p + "output.dense.weight", (H, I)), (p + "output.dense.bias", (H,)),
                (p + "output.LayerNorm.weight", (H,)), (p + "output.LayerNorm.bias", (H,))]
    out += [("pooler.dense.weight", (H, H)), ("pooler.dense.bias", (H,))]
    return out


def write_safetensors(path, c, seed):
    """Streams the tensors to path (a BERT-base model is 0.44 GB; one tensor is in memory at a time)."""
    rng = np.random.default_rng(seed)
    shapes = tensor_shapes(c)
    header, off = {}, 0
    for name, shape in shapes:
        n = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for name, shape in shapes:
            if "LayerNorm.weight" in name:
                a = np.ones(shape, np.float32)
            elif name.endswith("bias"):
                a = np.zeros(shape, np.float32)
            else:
                a = (rng.standard_normal(size=shape, dtype=np.float32) * np.float32(c["initializer_range"]))
                if name == "embeddings.word_embeddings.weight":
                    a[c["pad_token_id"]] = 0.0
            f.write(a.astype("<f4").tobytes())
    return len(shapes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory to write (created; its files are replaced)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="base")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", default=os.path.join(ROOT, "data/models/all-MiniLM-L6-v2"),
                    help="directory whose vocab.txt (and tokenizer files, where present) are copied")
    args = ap.parse_args()
    vocab = os.path.join(args.tokenizer, "vocab.txt")
    if not os.path.isfile(vocab):
        sys.exit(f"--tokenizer: {vocab} does not exist")
    with open(vocab, encoding="utf-8") as f:
        vocab_size = sum(1 for _ in f)
    os.makedirs(args.out, exist_ok=True)
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(args.tokenizer, name)):
            shutil.copyfile(os.path.join(args.tokenizer, name), os.path.join(args.out, name))
    c = config_for(args.shape, vocab_size)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    n = write_safetensors(os.path.join(args.out, "model.safetensors"), c, args.seed)
    params = sum(int(np.prod(s)) for _, s in tensor_shapes(c))
    print(f"wrote {args.out}: {args.shape} shape, {n} tensors, {params / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
