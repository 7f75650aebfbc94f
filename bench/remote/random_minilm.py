"""Writes DIR/model.safetensors with the tensor names and shapes of SHAPES (written by pack.sh from
all-MiniLM-L6-v2) and seeded random weights: normal(0, 0.02), LayerNorm weights 1, biases 0. For timing
runs on a machine the real weights cannot reach (bench/remote/README.md); time does not depend on them.

usage: python3 random_minilm.py SHAPES DIR
"""
import json, struct, sys
import numpy as np

shapes = json.load(open(sys.argv[1]))
rng = np.random.default_rng(0)
header, blobs, off = {}, [], 0
for k, v in shapes.items():
    if v["dtype"] == "I64":  # position_ids
        a = np.arange(int(np.prod(v["shape"])), dtype=np.int64).reshape(v["shape"])
    elif "LayerNorm.weight" in k:
        a = np.ones(v["shape"], np.float32)
    elif k.endswith("bias"):
        a = np.zeros(v["shape"], np.float32)
    else:
        a = rng.normal(0.0, 0.02, size=v["shape"]).astype(np.float32)
    b = a.tobytes()
    header[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(sys.argv[2] + "/model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    for b in blobs:
        f.write(b)
print("wrote", len(header), "tensors")
