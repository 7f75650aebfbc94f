"""Makes the checkpoint-I/O fixtures under tests/fixtures/ckptio/ (run with a Python that has numpy,
h5py and safetensors, e.g. .venv/bin/python; no torch or TensorFlow needed):

  minilm_config.json   copy of the all-MiniLM-L6-v2 config.json (when the model is present)
  tf_tiny/config.json  the tiny BERT fixture's config
  tf_tiny/tf_model.h5  the tiny BERT fixture's weights (tests/fixtures/bert_tiny/model.safetensors)
                       in the layout transformers' TFBertForSequenceClassification.save_pretrained
                       writes (Keras legacy HDF5 weights: root attribute layer_names, per-layer group
                       attribute weight_names with the full variable names, one dataset per weight,
                       Dense kernels stored [in, out], LayerNorm gamma/beta, position/token-type
                       embeddings named "embeddings", word embeddings "weight")

test_hf_load.c loads tf_tiny and requires the parameters to equal the safetensors ones bit for bit."""
import os
import re
import shutil

import h5py
import numpy as np
from safetensors.numpy import load_file

ROOT = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(ROOT, "fixtures", "ckptio")
TINY = os.path.join(ROOT, "fixtures", "bert_tiny")
MODEL_NAME = "tf_bert_for_sequence_classification"


def tf_name(pt):
    """HF PyTorch parameter name -> (TF variable name, is_kernel)."""
    parts = pt.split(".")
    leaf = parts.pop()
    path = "/".join(parts)
    path = re.sub(r"layer/(\d+)", r"layer_._\1", path)
    kernel = False
    if leaf == "weight":
        if "LayerNorm" in path:
            leaf = "gamma"
        elif path.endswith("word_embeddings"):
            leaf = "weight"
        elif path.endswith("_embeddings"):
            leaf = "embeddings"
        else:
            leaf, kernel = "kernel", True
    elif leaf == "bias" and "LayerNorm" in path:
        leaf = "beta"
    return f"{MODEL_NAME}/{path}/{leaf}:0", kernel


def write_attr(obj, name, strings):
    obj.attrs[name] = np.asarray([s.encode("utf8") for s in strings])  # fixed-length, as Keras does


def main():
    os.makedirs(os.path.join(OUT, "tf_tiny"), exist_ok=True)
    minilm = os.path.join(os.path.dirname(ROOT), "data", "models", "all-MiniLM-L6-v2", "config.json")
    if os.path.exists(minilm):
        shutil.copy(minilm, os.path.join(OUT, "minilm_config.json"))
    shutil.copy(os.path.join(TINY, "config.json"), os.path.join(OUT, "tf_tiny", "config.json"))
    sd = load_file(os.path.join(TINY, "model.safetensors"))
    layers = {"bert": [], "dropout_37": [], "classifier": []}
    for k in sorted(sd):
        layers["classifier" if k.startswith("classifier.") else "bert"].append(k)
    path = os.path.join(OUT, "tf_tiny", "tf_model.h5")
    with h5py.File(path, "w") as f:
        write_attr(f, "layer_names", list(layers))
        write_attr(f, "backend", ["tensorflow"])
        write_attr(f, "keras_version", ["2.15.0"])
        for layer, names in layers.items():
            g = f.create_group(layer)
            tf_names = []
            for k in names:
                n, kernel = tf_name(k)
                v = sd[k].T.copy() if kernel else sd[k]
                g.create_dataset(n, data=v.astype(np.float32))
                tf_names.append(n)
            write_attr(g, "weight_names", tf_names)
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
