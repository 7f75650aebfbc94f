"""ONNX export (bertqat export, export/onnx_bert.c) checked with onnx and ONNX Runtime (CPU):
- onnx.checker full_check on fp32 and Q/DQ exports (ort, qdqbert and cpu schemes), opsets 13 and 17;
- ORT logits vs bertqat's own forward on the same batch (bertqat export --dump-logits writes a random
  padded batch and the C logits): fp32 within 1e-4; Q/DQ within 1e-4 with ORT graph optimizations off
  (the ONNX Q/DQ semantics are exactly the fake-quant of training); with the default session
  (ORT_ENABLE_ALL: integer kernels, QLinear* rewrites): the CPU layout (--cpu-layout, and every cpu-scheme
  export) within 1e-4 too; the default int8 layout within 1e-4 only with session.x64quantprecision=1, since
  without it ORT's x86 U8S8 kernels (no VNNI) saturate on 8-bit weights (its error is printed);
- the CPU layout in the graph ORT CPU runs (SessionOptions.optimized_model_filepath): every encoder Linear
  is an integer kernel (MatMulIntegerToFloat or QLinearMatMul, found by node name), no weight
  DequantizeLinear is left at run time; for MiniLM (cpu scheme) also the first Linear's output equals the
  unoptimized Q/DQ graph's to float rounding (the integer kernels are exact);
- onnxruntime.transformers.optimizer fusions: fp32 -> EmbedLayerNormalization 1, Attention L,
  SkipLayerNormalization 2L, BiasGelu L, and the optimized model gives the same logits (1e-4);
  ort-scheme Q/DQ -> QOrderedAttention L, QOrderedLayerNormalization 2L, QOrderedGelu L,
  QOrderedMatMul 3L (those are CUDA kernels, so the fused Q/DQ model is only counted, not run);
- the same for all-MiniLM-L6-v2 (6 layers) loaded as an HF directory (fresh classifier), and PTQ
  checkpoints (ort and cpu schemes) of the session's fine-tuned MiniLM (conftest.finetuned, a trained
  head) calibrated on the small IMDB fixture, whose Q/DQ logits must match bertqat's within a bound
  derived from the quantization noise of the same batch (qdq_bound);
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


def ort_logits(path, d, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL, config=None):
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.log_severity_level = 3
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
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


def check_qdq_vs_c(path, d, cpu_layout):
    """Q/DQ semantics (no ORT optimization) and the integer kernels ORT CPU picks both match bertqat. The
    default int8 layout is exact only with session.x64quantprecision=1 (ORT's x86 U8S8 kernels without
    VNNI add u8*s8 pairs into saturating int16); the CPU layout must be exact in the default session."""
    ref = np.array(d["logits"], dtype=np.float32)
    exact = ort_logits(path, d, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    err_exact = float(np.abs(exact - ref).max())
    full = ort_logits(path, d)
    err_full = float(np.abs(full - ref).max())
    prec = ort_logits(path, d, config={"session.x64quantprecision": "1"})
    err_prec = float(np.abs(prec - ref).max())
    print(f"{os.path.basename(path)}: Q/DQ max err {err_exact:.3g} (no ORT opt), {err_full:.3g} (ORT_ENABLE_ALL), "
          f"{err_prec:.3g} (ORT_ENABLE_ALL + session.x64quantprecision=1); max |logit| {np.abs(ref).max():.3g}")
    assert err_exact < 1e-4 and err_prec < 1e-4
    if cpu_layout:
        assert err_full < 1e-4
    # the default layout in the default session is only printed: on x86 CPUs without VNNI ORT's U8S8
    # kernel saturates 16-bit sums, an error that depends on the CPU; err_prec above is the exact check


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("kind", ["fp32", "ort", "qdqbert", "cpu"])
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
        assert {p.key: p.value for p in m.metadata_props}["qdq_layout"] == ("cpu" if kind == "cpu" else "default")
        check_qdq_vs_c(out, d, cpu_layout=kind == "cpu")


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


def calibrate_trained(finetuned, out, *extra):
    """PTQ checkpoint of the session's fine-tuned all-MiniLM-L6-v2 (conftest.finetuned: a trained head, so
    the logits are not near zero), calibrated on the small IMDB fixture."""
    run_bq("calibrate", "--model", finetuned[0], "--data",
           os.path.join(ROOT, "tests", "fixtures", "data", "imdb.tar.gz"), "--out", out, *extra, "--calib-samples", 8,
           "--batch-size", 8, "--max-seq-len", 64, "--calibrator", "max")
    return out


@pytest.fixture(scope="module")
def minilm_ptq(tmp_path_factory, finetuned):
    return calibrate_trained(finetuned, tmp_path_factory.mktemp("minilm") / "ptq")


def qdq_bound(ckpt, d, tmp_path, fraction):
    """The bound on |ORT - bertqat| for the logits of a Q/DQ export of ckpt on the --dump-logits batch d.

    Both sides round x/s at every quantizer the same way; they differ only where the two fp32 sums that
    produce x differ in their last bits and x/s lies that close to a rounding boundary, which moves one
    8-bit value by one step s. Quantization itself rounds every element of every quantized tensor by up
    to s/2; its effect on the logits, N = max|logits_q - logits_fp32| over the same batch (the fp32
    forward of the same checkpoint, from an --qdq off export), is the sum of ~10^5 such roundings per row.
    A handful of one-step flips moves the logits by a fraction of N: we require fraction * N (+1e-4 for
    float rounding). The fraction depends on the scheme: the cpu scheme quantizes only Linear inputs and
    weights, where one flip is one term of a 384- or 1536-term sum (measured 0.06 N: fraction 0.1); the
    ort scheme also quantizes inside the attention (query, key, softmax probabilities, value), where one
    flip moves a whole score row or output row, so flips move the logits more (measured 0.24 N:
    fraction 0.5). A wrong zero point or weight layout changes every element of a tensor, an error of
    the order of N or larger, and fails either bound. A single wrong scale is smaller: on the ort
    scheme's batch here one weight scale doubled measured 0.41 N and the embeddings' output scale doubled
    0.50 N, so the ort bound does not catch every single wrong scale; the exact checks (1e-4) of the tiny
    model above and the review-by-review median check of tests/python/test_pipeline.py do."""
    f = export(str(ckpt), str(tmp_path / "fp32_ref.onnx"), "--qdq", "off", batch=len(d["logits"]),
               seq=len(d["input_ids"][0]))
    assert f["input_ids"] == d["input_ids"], "the fp32 reference ran on another batch"
    noise = float(np.abs(np.array(d["logits"]) - np.array(f["logits"])).max())
    assert noise > 1e-3, f"quantization changed the logits by only {noise:.3g}: not a quantized forward"
    return fraction * noise + 1e-4, noise


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
    bound, noise = qdq_bound(minilm_ptq, d, tmp_path, 0.5)
    # the Q/DQ semantics (no ORT optimization) and ORT's integer kernels with exact 32-bit sums
    # (session.x64quantprecision=1); the default session is printed only (U8S8 saturation without VNNI)
    exact = ort_logits(out, d, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    prec = ort_logits(out, d, config={"session.x64quantprecision": "1"})
    full = ort_logits(out, d)
    e1, e2, e3 = (float(np.abs(x - ref).max()) for x in (exact, prec, full))
    print(f"MiniLM Q/DQ: max err {e1:.3g} (no ORT opt), {e2:.3g} (ORT_ENABLE_ALL + x64quantprecision), "
          f"{e3:.3g} (ORT_ENABLE_ALL); bound {bound:.3g} (quantization noise {noise:.3g}, "
          f"max |logit| {np.abs(ref).max():.3g})")
    assert e1 <= bound and e2 <= bound
    ops = optimize(out, str(tmp_path / "minilm_q_opt.onnx"), 12, 384)
    print("optimized MiniLM ort Q/DQ:", dict(ops))
    assert ops["QOrderedAttention"] == 6 and ops["QOrderedLayerNormalization"] == 12
    assert ops["QOrderedGelu"] == 6 and ops["QOrderedMatMul"] == 18


LINEARS = ("attention/self/query", "attention/self/key", "attention/self/value", "attention/output/dense",
           "intermediate/dense", "output/dense")


def ort_cpu_graph(path, out):
    """The graph ORT's CPU session runs (all optimizations), saved with optimized_model_filepath."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = out
    so.log_severity_level = 3
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return onnx.load(out).graph


def check_integer_linears(g, layers):
    """Every encoder Linear runs as an integer kernel; no weight is dequantized at run time."""
    by_name = {n.name: n.op_type for n in g.node}
    kinds = collections.Counter()
    for l in range(layers):
        for lin in LINEARS:
            op = by_name.get(f"/bert/encoder/layer.{l}/{lin}/MatMul")
            assert op in ("MatMulIntegerToFloat", "QLinearMatMul"), f"layer {l} {lin}: {op}"
            kinds[op] += 1
    inits = {i.name for i in g.initializer}
    weight_dq = [n.name for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    assert not weight_dq, weight_dq
    ops = collections.Counter(n.op_type for n in g.node)
    return kinds, ops


@pytest.mark.parametrize("kind", ["ort", "qdqbert", "cpu"])
def test_tiny_cpu_layout(tiny, tmp_path, kind):
    """The CPU layout (uint8 activations, 8-bit weights as uint8): ORT CPU runs every encoder Linear as an
    integer kernel and its logits equal bertqat's, those of fake quant and those of the integer engine
    (--dump-engine int8, which `eval` runs by default); the cpu scheme gets this layout without the flag."""
    out = str(tmp_path / f"{kind}_cpu.onnx")
    flags = [] if kind == "cpu" else ["--cpu-layout"]
    d = export(str(tiny / kind), out, *flags)
    assert d["engine"] == "fake-quant"
    out8 = str(tmp_path / f"{kind}_cpu_int8.onnx")
    # every scheme runs on the integer engine (ort: its Linears on the grids their inputs lie on)
    d8 = export(str(tiny / kind), out8, *flags, "--dump-engine", "int8")
    assert d8["engine"] == "int8" and d8["input_ids"] == d["input_ids"]
    m = onnx.load(out)
    onnx.checker.check_model(m, full_check=True)
    assert {p.key: p.value for p in m.metadata_props}["qdq_layout"] == "cpu"
    inits = {i.name: i for i in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear":
            assert inits[n.input[2]].data_type == onnx.TensorProto.UINT8
    g = ort_cpu_graph(out, str(tmp_path / f"{kind}_cpu.ort.onnx"))
    kinds, ops = check_integer_linears(g, L_TINY)
    print(f"{kind} CPU layout, ORT CPU graph: {dict(kinds)}; {dict(ops)}")
    check_qdq_vs_c(out, d, cpu_layout=True)
    if d8:
        check_qdq_vs_c(out8, d8, cpu_layout=True)


def test_minilm_cpu_scheme(tmp_path, finetuned):
    """all-MiniLM-L6-v2 fine-tuned (conftest.finetuned) with the cpu scheme (calibrated on the small IMDB
    fixture): 36 integer Linears in the graph ORT CPU runs, the first Linear's output exact, logits within
    the bound of qdq_bound of bertqat's."""
    ck = calibrate_trained(finetuned, tmp_path / "ptq_cpu", "--scheme", "cpu")
    out = str(tmp_path / "minilm_cpu.onnx")
    d = export(str(ck), out, batch=4, seq=64)
    g = ort_cpu_graph(out, str(tmp_path / "minilm_cpu.ort.onnx"))
    kinds, ops = check_integer_linears(g, 6)
    print("MiniLM cpu scheme, ORT CPU graph:", dict(ops))
    assert kinds["MatMulIntegerToFloat"] == 36
    # the first Linear (layer 0 query) with ORT's integer kernel vs the unoptimized Q/DQ graph
    m = onnx.load(out)
    name = "/bert/encoder/layer.0/attention/self/query/Add_output_0"
    m.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    probe = str(tmp_path / "probe.onnx")
    onnx.save(m, probe)
    feed = {k: np.array(d[k], dtype=np.int64) for k in ("input_ids", "attention_mask", "token_type_ids")}
    outs = []
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.log_severity_level = 3
        outs.append(ort.InferenceSession(probe, so, providers=["CPUExecutionProvider"]).run([name], feed)[0])
    rel = float(np.abs(outs[0] - outs[1]).max() / np.abs(outs[0]).max())
    ref = np.array(d["logits"])
    full = ort_logits(out, d)
    err = float(np.abs(full - ref).max())
    print(f"MiniLM cpu scheme: layer-0 query, ORT integer kernel vs Q/DQ reference: max rel diff {rel:.2g}; "
          f"logits vs bertqat max err {err:.3g} (max |logit| {np.abs(ref).max():.3g})")
    assert rel < 1e-5
    # further down, a float-order difference moves an x/scale across a rounding boundary now and then and
    # the flip propagates: the bound of qdq_bound
    bound, noise = qdq_bound(ck, d, tmp_path, 0.1)
    print(f"MiniLM cpu scheme: bound {bound:.3g} (quantization noise {noise:.3g})")
    assert err <= bound
