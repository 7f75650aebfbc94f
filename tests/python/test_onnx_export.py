"""ONNX export (bertqat export, export/onnx_bert.c) checked with onnx and ONNX Runtime (CPU):
- onnx.checker full_check on fp32 and Q/DQ exports (ort and qdqbert schemes), opsets 13 and 17;
- ORT logits vs bertqat's own forward on the same batch (bertqat export --dump-logits writes a random
  padded batch and the C logits): fp32 within 1e-4; Q/DQ within 1e-4 with ORT graph optimizations off
  (the ONNX Q/DQ semantics are exactly the fake-quant of training); with the default session
  (ORT_ENABLE_ALL: int8 kernels, QLinear* rewrites) identical labels and max |Δlogit| <= 0.5·max|logit|;
- onnxruntime.transformers.optimizer fusions: fp32 -> EmbedLayerNormalization 1, Attention L,
  SkipLayerNormalization 2L, BiasGelu L, and the optimized model gives the same logits (1e-4);
  ort-scheme Q/DQ -> QOrderedAttention L, QOrderedLayerNormalization 2L, QOrderedGelu L,
  QOrderedMatMul 3L (those are CUDA kernels, so the fused Q/DQ model is only counted, not run);
- the same for all-MiniLM-L6-v2 (6 layers) loaded as an HF directory (fresh classifier) and a PTQ
  checkpoint of it calibrated on the small IMDB fixture;
- input variants (--no-token-type-ids, --input-int32) and errors (corrupt checkpoint, unwritable
  output, --qdq on for an fp32 checkpoint): non-zero exit, message, no partial file.
The tiny checkpoints come from `test_onnx_export --write DIR` (random 2-layer BERT, hidden 32)."""
import collections
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from conftest import BUILD, MODEL, ROOT, run_bq

L_TINY, H_TINY, NH_TINY = 2, 32, 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("onnx_ckpts")
    exe = os.path.join(BUILD, "test_onnx_export")
    assert os.access(exe, os.X_OK), f"{exe} not built"
    p = subprocess.run([exe, "--write", str(d)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return d


def export(ckpt, out, *extra, dump=True, batch=6, seq=24):
    args = ["export", "--model", ckpt, "--out", out, *extra]
    if dump:
        args += ["--dump-logits", out + ".json", "--dump-batch", batch, "--dump-seq", seq]
    run_bq(*args)
    return json.load(open(out + ".json")) if dump else None


def ort_logits(path, d, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    feed = {}
    for i in s.get_inputs():
        dt = np.int32 if i.type == "tensor(int32)" else np.int64
        feed[i.name] = np.array(d[i.name], dtype=dt)
    return s.run(None, feed)[0]


def optimize(src, dst, heads, hidden):
    p = subprocess.run([sys.executable, "-m", "onnxruntime.transformers.optimizer", "--input", src, "--output", dst,
                        "--model_type", "bert", "--num_heads", str(heads), "--hidden_size", str(hidden),
                        "--opt_level", "0"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and os.path.exists(dst), p.stdout[-2000:] + p.stderr[-3000:]
    return collections.Counter(n.op_type for n in onnx.load(dst).graph.node)


def check_qdq_vs_c(path, d):
    ref = np.array(d["logits"], dtype=np.float32)
    exact = ort_logits(path, d, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    err_exact = float(np.abs(exact - ref).max())
    full = ort_logits(path, d)
    err_full = float(np.abs(full - ref).max())
    bound = 0.5 * float(np.abs(ref).max())
    print(f"{os.path.basename(path)}: Q/DQ max err {err_exact:.3g} (no ORT opt), {err_full:.3g} (ORT_ENABLE_ALL, "
          f"bound {bound:.3g})")
    assert err_exact < 1e-4
    assert err_full <= bound
    assert (full.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("kind", ["fp32", "ort", "qdqbert"])
def test_tiny_export_matches_bertqat(tiny, tmp_path, kind, opset):
    out = str(tmp_path / f"{kind}_{opset}.onnx")
    d = export(str(tiny / kind), out, "--opset", opset)
    m = onnx.load(out)
    onnx.checker.check_model(m, full_check=True)
    ops = collections.Counter(n.op_type for n in m.graph.node)
    assert m.opset_import[0].version == opset
    assert ops["LayerNormalization"] == (2 * L_TINY + 1 if opset >= 17 else 0)
    ref = np.array(d["logits"], dtype=np.float32)
    if kind == "fp32":
        assert ops["QuantizeLinear"] == 0
        err = float(np.abs(ort_logits(out, d) - ref).max())
        print(f"fp32 opset {opset}: max err {err:.3g}")
        assert err < 1e-4
    else:
        assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] == ops["QuantizeLinear"] + 6 * L_TINY
        check_qdq_vs_c(out, d)


def test_tiny_input_variants(tiny, tmp_path):
    out = str(tmp_path / "notypes.onnx")
    d = export(str(tiny / "fp32"), out, "--no-token-type-ids", "--input-int32")
    m = onnx.load(out)
    onnx.checker.check_model(m, full_check=True)
    assert [i.name for i in m.graph.input] == ["input_ids", "attention_mask"]
    assert m.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT32
    assert "token_type_ids" not in d
    err = float(np.abs(ort_logits(out, d) - np.array(d["logits"])).max())
    print(f"--no-token-type-ids --input-int32: max err {err:.3g}")
    assert err < 1e-4


def test_tiny_fp32_fusions(tiny, tmp_path):
    out = str(tmp_path / "fp32.onnx")
    d = export(str(tiny / "fp32"), out)
    ops = optimize(out, str(tmp_path / "fp32_opt.onnx"), NH_TINY, H_TINY)
    print("optimized fp32:", dict(ops))
    assert ops["EmbedLayerNormalization"] == 1
    assert ops["Attention"] == L_TINY
    assert ops["SkipLayerNormalization"] == 2 * L_TINY
    assert ops["BiasGelu"] + ops["Gelu"] == L_TINY
    err = float(np.abs(ort_logits(str(tmp_path / "fp32_opt.onnx"), d) - np.array(d["logits"])).max())
    print(f"optimized fp32: max err {err:.3g}")
    assert err < 1e-4


def test_tiny_qdq_fusions(tiny, tmp_path):
    out = str(tmp_path / "ort.onnx")
    export(str(tiny / "ort"), out, dump=False)
    ops = optimize(out, str(tmp_path / "ort_opt.onnx"), NH_TINY, H_TINY)
    print("optimized ort Q/DQ:", dict(ops))
    assert ops["QOrderedAttention"] == L_TINY
    assert ops["QOrderedLayerNormalization"] == 2 * L_TINY
    assert ops["QOrderedGelu"] == L_TINY
    assert ops["QOrderedMatMul"] == 3 * L_TINY
    assert ops["EmbedLayerNormalization"] == 0 and ops["LayerNormalization"] == 1


def test_errors_leave_no_file(tiny, tmp_path):
    bad = tmp_path / "corrupt"
    shutil.copytree(tiny / "fp32", bad)
    with open(bad / "model.h5", "r+b") as f:
        f.truncate(1000)
    out = tmp_path / "x.onnx"
    p = run_bq("export", "--model", bad, "--out", out, check=False)
    assert p.returncode != 0 and "model.h5" in p.stderr, p.stderr
    assert not out.exists() and not (tmp_path / "x.onnx.tmp").exists()
    p = run_bq("export", "--model", tiny / "fp32", "--out", tmp_path / "nodir" / "x.onnx", check=False)
    assert p.returncode != 0 and "nodir" in p.stderr, p.stderr
    assert not (tmp_path / "nodir").exists()
    p = run_bq("export", "--model", tiny / "fp32", "--out", out, "--qdq", "on", check=False)
    assert p.returncode != 0 and "--qdq" in p.stderr and not out.exists()
    p = run_bq("export", "--model", tiny / "fp32", "--out", out, "--opset", "12", check=False)
    assert p.returncode != 0 and "--opset" in p.stderr and not out.exists()


@pytest.fixture(scope="module")
def minilm_ptq(tmp_path_factory):
    if not os.path.exists(os.path.join(MODEL, "config.json")):
        pytest.skip(f"{MODEL} not present")
    d = tmp_path_factory.mktemp("minilm") / "ptq"
    run_bq("calibrate", "--model", MODEL, "--data", os.path.join(ROOT, "tests", "fixtures", "data", "imdb.tar.gz"),
           "--out", d, "--calib-samples", 8, "--batch-size", 8, "--max-seq-len", 64, "--calibrator", "max")
    return d


def test_minilm_fp32(tmp_path):
    if not os.path.exists(os.path.join(MODEL, "config.json")):
        pytest.skip(f"{MODEL} not present")
    out = str(tmp_path / "minilm.onnx")
    d = export(MODEL, out, batch=4, seq=64)
    onnx.checker.check_model(onnx.load(out), full_check=True)
    ref = np.array(d["logits"])
    err = float(np.abs(ort_logits(out, d) - ref).max())
    ops = optimize(out, str(tmp_path / "minilm_opt.onnx"), 12, 384)
    print("optimized MiniLM fp32:", dict(ops))
    assert ops["EmbedLayerNormalization"] == 1 and ops["Attention"] == 6
    assert ops["SkipLayerNormalization"] == 12 and ops["BiasGelu"] + ops["Gelu"] == 6
    err_opt = float(np.abs(ort_logits(str(tmp_path / "minilm_opt.onnx"), d) - ref).max())
    print(f"MiniLM fp32: max err {err:.3g}, optimized {err_opt:.3g} (max |logit| {np.abs(ref).max():.3g})")
    # the fresh classifier's logits are small: also require a relative agreement of 1e-3
    assert err < 1e-4 and err_opt < 1e-4
    assert err <= 1e-3 * np.abs(ref).max() and err_opt <= 1e-3 * np.abs(ref).max()


def test_minilm_qdq(minilm_ptq, tmp_path):
    out = str(tmp_path / "minilm_q.onnx")
    d = export(str(minilm_ptq), out, batch=4, seq=64)
    onnx.checker.check_model(onnx.load(out), full_check=True)
    ref = np.array(d["logits"])
    # row by row, a rounding flip (x/scale within float error of a .5 tie after a differently ordered fp32
    # sum) changes one int8 value; so the bound for a 6-layer model is looser than for the tiny one
    exact = ort_logits(out, d, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    full = ort_logits(out, d)
    scale = float(np.abs(ref).max())
    e1, e2 = float(np.abs(exact - ref).max()), float(np.abs(full - ref).max())
    print(f"MiniLM Q/DQ: max err {e1:.3g} (no ORT opt), {e2:.3g} (ORT_ENABLE_ALL), max |logit| {scale:.3g}")
    assert e1 <= 0.5 * scale and e2 <= 0.5 * scale
    ops = optimize(out, str(tmp_path / "minilm_q_opt.onnx"), 12, 384)
    print("optimized MiniLM ort Q/DQ:", dict(ops))
    assert ops["QOrderedAttention"] == 6 and ops["QOrderedLayerNormalization"] == 12
    assert ops["QOrderedGelu"] == 6 and ops["QOrderedMatMul"] == 18


def test_tiny_cpu_layout(tiny, tmp_path):
    """--cpu-layout (one Q/DQ per consumer) computes the same values as the shared layout."""
    out = str(tmp_path / "ort_cpu.onnx")
    d = export(str(tiny / "ort"), out, "--cpu-layout")
    m = onnx.load(out)
    onnx.checker.check_model(m, full_check=True)
    consumers = collections.Counter(i for n in m.graph.node for i in n.input)
    assert all(consumers[n.output[0]] == 1 for n in m.graph.node if n.op_type == "DequantizeLinear")
    check_qdq_vs_c(out, d)
