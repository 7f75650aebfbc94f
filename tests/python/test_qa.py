"""Question answering through the CLI (src/cli/qa_setup.h, src/qa.h, layers/bert.h BQ_HEAD_QA) on a few hundred SQuAD v1.1
questions with a tiny random BERT (2 layers, hidden 32, the bert-base-uncased vocabulary), written here
as a Hugging Face directory whose config names no head (architectures BertModel):
- finetune --task qa keeps the encoder and creates qa_outputs; the checkpoint is a
  BertForQuestionAnswering (config architectures, qa_outputs tensors, no pooler/classifier); calibrate
  (ort and cpu schemes) and qat continue from it with the task taken from the head;
- ONNX export of the fp32, QAT (cpu scheme) and PTQ (ort scheme) checkpoints: outputs start_logits and
  end_logits (batch, sequence), equal to bertqat's forward on the same batch (--dump-logits): fp32 and
  the ort scheme's int8 layout (with session.x64quantprecision=1) within 1e-4, the cpu-scheme QAT export
  in ORT's integer kernels within test_onnx_export's rounding-flip bound (0.1 of the quantization noise);
  the fp32 export fuses as the classifier's does (EmbedLayerNormalization 1, Attention L,
  SkipLayerNormalization 2L, BiasGelu L) and the ort-scheme Q/DQ export into the QOrdered ops;
- `bertqat eval` EM/F1 (and its official predictions JSON) equal scripts/onnx_eval_qa.py's on the fp32
  export, which windows and post-processes independently with Hugging Face `tokenizers` offsets (the
  checkpoint's word embeddings read by rows from its file; a QAT checkpoint's engine packed while loading);
- predict answers --question/--context and JSONL;
- bad flags and data of the other task give one-line errors and write nothing."""
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

from conftest import DATA, ROOT, THREADS, VOCAB, run_bq

SQUAD_TRAIN = os.path.join(DATA, "squad", "train-v1.1-rebuilt.json")
SQUAD_DEV = os.path.join(DATA, "squad", "dev-v1.1.json")
IMDB = os.path.join(DATA, "imdb", "aclImdb_train_test.tar.gz")
L, H, NH, I = 2, 32, 4, 64
SEQ = ["--max-seq-len", 128, "--doc-stride", 32]
QUESTIONS = 200


def write_tiny(d):
    """A random BertModel-shaped HF directory (no task head) with the bert-base-uncased tokenizer."""
    from safetensors.numpy import save_file
    os.makedirs(d)
    vdir = os.path.dirname(VOCAB)
    for f in os.listdir(vdir):
        shutil.copy(os.path.join(vdir, f), d)
    cfg = {"architectures": ["BertModel"], "model_type": "bert", "vocab_size": 30522, "hidden_size": H,
           "num_hidden_layers": L, "num_attention_heads": NH, "intermediate_size": I, "max_position_embeddings": 512,
           "type_vocab_size": 2, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
           "attention_probs_dropout_prob": 0.1, "layer_norm_eps": 1e-12, "initializer_range": 0.02, "pad_token_id": 0}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    rng = np.random.default_rng(0)
    w = {}

    def normal(*shape):
        return rng.normal(0, 0.02, shape).astype(np.float32)

    def lin(n, o, i):
        w[n + ".weight"], w[n + ".bias"] = normal(o, i), np.zeros(o, np.float32)

    def ln(n):
        w[n + ".weight"], w[n + ".bias"] = np.ones(H, np.float32), np.zeros(H, np.float32)

    w["embeddings.word_embeddings.weight"] = normal(30522, H)
    w["embeddings.position_embeddings.weight"] = normal(512, H)
    w["embeddings.token_type_embeddings.weight"] = normal(2, H)
    ln("embeddings.LayerNorm")
    for layer in range(L):
        p = f"encoder.layer.{layer}."
        for q in ("query", "key", "value"):
            lin(p + "attention.self." + q, H, H)
        lin(p + "attention.output.dense", H, H)
        ln(p + "attention.output.LayerNorm")
        lin(p + "intermediate.dense", I, H)
        lin(p + "output.dense", H, I)
        ln(p + "output.LayerNorm")
    save_file(w, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    for p in (SQUAD_TRAIN, SQUAD_DEV, VOCAB):
        assert os.path.exists(p), f"missing {p}"
    r = tmp_path_factory.mktemp("qa")
    write_tiny(str(r / "tiny"))
    common = ["--threads", THREADS, "--cache-dir", r / "cache"]
    p = run_bq("finetune", "--model", r / "tiny", "--data", SQUAD_TRAIN, "--out", r / "fp32", "--task", "qa",
               "--train-samples", QUESTIONS, "--batch-size", 16, "--lr", 1e-3, *SEQ, *common)
    assert "qa_outputs newly initialized" in p.stderr
    run_bq("calibrate", "--model", r / "fp32", "--data", SQUAD_TRAIN, "--out", r / "ptq-cpu", "--scheme", "cpu",
           "--calib-samples", 64, "--doc-stride", 32, *common)
    run_bq("calibrate", "--model", r / "fp32", "--data", SQUAD_TRAIN, "--out", r / "ptq-ort", "--scheme", "ort",
           "--calib-samples", 64, "--doc-stride", 32, *common)
    run_bq("qat", "--model", r / "ptq-cpu", "--data", SQUAD_TRAIN, "--out", r / "qat", "--train-samples", 100,
           "--batch-size", 16, "--lr", 1e-4, "--ranges", "fixed", "--doc-stride", 32, *common)
    return r


def export(ckpt, out, *extra, seq=48):
    run_bq("export", "--model", ckpt, "--out", out, "--dump-logits", str(out) + ".json", "--dump-batch", 5,
           "--dump-seq", seq, *extra)
    with open(str(out) + ".json") as f:
        return json.load(f)


def ort_run(path, d, config=None):
    """start and end logits in ONNX Runtime CPU (default session; config: extra session entries)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    assert [o.name for o in s.get_outputs()] == ["start_logits", "end_logits"]
    feed = {i.name: np.array(d[i.name], dtype=np.int64) for i in s.get_inputs()}
    return s.run(None, feed)


def optimize(src, dst):
    p = subprocess.run([sys.executable, "-m", "onnxruntime.transformers.optimizer", "--input", str(src), "--output",
                        str(dst), "--model_type", "bert", "--num_heads", str(NH), "--hidden_size", str(H),
                        "--opt_level", "0"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and os.path.exists(dst), p.stdout[-2000:] + p.stderr[-3000:]
    return collections.Counter(n.op_type for n in onnx.load(str(dst)).graph.node)


def test_checkpoint_is_bert_for_question_answering(runs):
    cfg = json.load(open(runs / "fp32" / "config.json"))
    assert cfg["architectures"] == ["BertForQuestionAnswering"]
    info = run_bq("info", "--all", runs / "qat").stdout.splitlines()
    params = [l.split()[0] for l in info if l.startswith("  ") and not l.startswith("  parameter")]
    assert params[-2:] == ["qa_outputs.weight", "qa_outputs.bias"], params[-3:]
    assert not any("pooler" in n or "classifier" in n for n in params)
    # qa_outputs stays fp32: no quantizer names it
    assert not any("qa_outputs" in l for l in info if "_quantizer" in l)


@pytest.mark.parametrize("kind", ["fp32", "qat", "ptq-ort"])
def test_export_matches_checkpoint(runs, tmp_path, kind):
    out = tmp_path / f"{kind}.onnx"
    d = export(runs / kind, out)
    m = onnx.load(str(out))
    onnx.checker.check_model(m, full_check=True)
    assert [(o.name, [x.dim_param or x.dim_value for x in o.type.tensor_type.shape.dim]) for o in m.graph.output] == \
        [("start_logits", ["batch", "sequence"]), ("end_logits", ["batch", "sequence"])]
    # the ort scheme's default int8 layout is exact in ORT only with session.x64quantprecision=1 (its x86
    # U8S8 kernels without VNNI saturate 16-bit sums; tests/python/test_onnx_export.py check_qdq_vs_c)
    start, end = ort_run(out, d, {"session.x64quantprecision": "1"} if kind == "ptq-ort" else None)
    ref = np.stack([np.array(d["start_logits"]), np.array(d["end_logits"])])
    err = float(np.abs(np.stack([start, end]) - ref).max())
    bound = 1e-4
    if kind == "qat":
        # ORT's integer kernels and bertqat's fake quant round x/s alike except where their fp32 sums differ
        # in the last bits at a rounding boundary: one-step flips, a fraction of the quantization noise N
        # (test_onnx_export.py qdq_bound; the cpu scheme's measured 0.06 N, bound 0.1 N + 1e-4)
        f = export(runs / kind, tmp_path / "fp32_ref.onnx", "--qdq", "off")
        assert f["input_ids"] == d["input_ids"]
        noise = float(np.abs(ref - np.stack([np.array(f["start_logits"]), np.array(f["end_logits"])])).max())
        assert noise > 1e-4, f"quantization changed the logits by only {noise:.3g}: not a quantized forward"
        bound = 0.1 * noise + 1e-4
    print(f"{kind}: ORT vs bertqat start/end logits max err {err:.3g}, bound {bound:.3g}")
    assert start.shape == (5, 48) and err < bound


def test_fusions(runs, tmp_path):
    export(runs / "fp32", tmp_path / "fp32.onnx")
    ops = optimize(tmp_path / "fp32.onnx", tmp_path / "fp32_opt.onnx")
    print("optimized fp32 QA:", dict(ops))
    assert ops["EmbedLayerNormalization"] == 1 and ops["Attention"] == L
    assert ops["SkipLayerNormalization"] == 2 * L and ops["BiasGelu"] + ops["Gelu"] == L
    run_bq("export", "--model", runs / "ptq-ort", "--out", tmp_path / "ort.onnx")
    ops = optimize(tmp_path / "ort.onnx", tmp_path / "ort_opt.onnx")
    print("optimized ort Q/DQ QA:", dict(ops))
    assert ops["QOrderedAttention"] == L and ops["QOrderedLayerNormalization"] == 2 * L
    assert ops["QOrderedGelu"] == L and ops["QOrderedMatMul"] == 3 * L


def test_eval_equals_onnx_runtime(runs, tmp_path):
    out = tmp_path / "fp32.onnx"
    run_bq("export", "--model", runs / "fp32", "--out", out)
    n = 200
    p = run_bq("eval", "--model", runs / "fp32", "--data", SQUAD_DEV, "--samples", n, "--json", "--predictions",
               tmp_path / "c.json", "--threads", THREADS, "--cache-dir", runs / "cache", "--doc-stride", 32)
    c = json.loads(p.stdout)
    # a bertqat QA checkpoint is evaluated with its word embeddings read by rows from model.h5
    assert "word embeddings: rows read from" in p.stderr, p.stderr
    q = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "onnx_eval_qa.py"), "--onnx", str(out),
                        "--tokenizer", str(runs / "fp32"), "--data", SQUAD_DEV, "--samples", str(n),
                        "--max-seq-len", "128", "--doc-stride", "32", "--threads", THREADS, "--json",
                        "--predictions", str(tmp_path / "o.json")], capture_output=True, text=True, timeout=600)
    assert q.returncode == 0, q.stderr[-3000:]
    o = json.loads(q.stdout)
    print(f"bertqat eval: EM {c['exact_match']:.4f} F1 {c['f1']:.4f} ({c['windows']} windows); "
          f"ONNX Runtime: EM {o['exact_match']:.4f} F1 {o['f1']:.4f} ({o['windows']} windows)")
    assert c["examples"] == o["examples"] == n and c["windows"] == o["windows"]
    pc, po = json.load(open(tmp_path / "c.json")), json.load(open(tmp_path / "o.json"))
    assert list(pc) == list(po)
    diff = [k for k in pc if pc[k] != po[k]]
    assert not diff, f"{len(diff)} answers differ, e.g. {[(pc[k], po[k]) for k in diff[:3]]}"
    assert abs(c["exact_match"] - o["exact_match"]) < 1e-9 and abs(c["f1"] - o["f1"]) < 1e-9
    # batches pad to their longest window: the answers must not depend on the batch size
    run_bq("eval", "--model", runs / "fp32", "--data", SQUAD_DEV, "--samples", n, "--batch-size", 7, "--predictions",
           tmp_path / "c7.json", "--threads", THREADS, "--cache-dir", runs / "cache", "--doc-stride", 32)
    assert json.load(open(tmp_path / "c7.json")) == pc
    # the trained head beats chance on the questions it never saw only weakly; the text output prints both
    r = run_bq("eval", "--model", runs / "qat", "--data", SQUAD_DEV, "--samples", 50, "--doc-stride", 32,
               "--threads", THREADS, "--cache-dir", runs / "cache")
    t = r.stdout
    assert "exact match" in t and "f1" in t and "engine       int8" in t
    # the integer engine packs the QA checkpoint while it loads, as it does a classifier
    assert "packed while loading" in r.stderr, r.stderr


def test_compare_qa_predictions(runs, tmp_path):
    """scripts/compare_qa_predictions.py scores answers as bertqat eval does (the official v1.1 EM and F1),
    and reports the F1 difference and equal answers of a changed copy."""
    n = 200
    p = run_bq("eval", "--model", runs / "fp32", "--data", SQUAD_DEV, "--samples", n, "--json", "--predictions",
               tmp_path / "a.json", "--threads", THREADS, "--cache-dir", runs / "cache", "--doc-stride", 32)
    c = json.loads(p.stdout)
    a = json.load(open(tmp_path / "a.json"))
    refs = {}
    for art in json.load(open(SQUAD_DEV))["data"]:
        for para in art["paragraphs"]:
            for qa in para["qas"]:
                refs[qa["id"]] = qa["answers"][0]["text"]
    b = dict(a)
    changed = sorted(b)[:20]
    for k in changed:
        b[k] = refs[k]  # the first reference answer: exact match and F1 1 there
    json.dump(b, open(tmp_path / "b.json", "w"))
    script = os.path.join(ROOT, "scripts", "compare_qa_predictions.py")
    q = subprocess.run([sys.executable, script, SQUAD_DEV, str(tmp_path / "a.json"), str(tmp_path / "b.json")],
                       capture_output=True, text=True, timeout=120)
    print(q.stdout)
    assert q.returncode == 0, q.stderr
    lines = dict(line.split(": ", 1) for line in q.stdout.splitlines() if ": " in line)
    assert lines["A"] == f"exact match {c['exact_match']:.2f}, F1 {c['f1']:.2f}"
    same = sum(a[k] == b[k] for k in a)
    assert lines["answers equal"].startswith(f"{same} of {n} ")
    assert float(lines["F1 B - A"].split()[0]) > 0
    # the same questions are required, and --max-f1-diff fails a larger difference
    q = subprocess.run([sys.executable, script, SQUAD_DEV, str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                        "--max-f1-diff", "0"], capture_output=True, text=True, timeout=120)
    assert q.returncode == 1 and "FAIL" in q.stdout
    del b[changed[0]]
    json.dump(b, open(tmp_path / "b.json", "w"))
    q = subprocess.run([sys.executable, script, SQUAD_DEV, str(tmp_path / "a.json"), str(tmp_path / "b.json")],
                       capture_output=True, text=True, timeout=120)
    assert q.returncode == 1 and "answer different questions" in q.stderr


def on_word_boundaries(answer, context):
    """Whether answer occurs in context starting and ending at word boundaries (a letter or digit at
    either edge of the answer has no letter or digit next to it outside)."""
    i = context.find(answer)
    while answer and i >= 0:
        j = i + len(answer)
        if (i == 0 or not (context[i - 1].isalnum() and answer[0].isalnum())) and \
                (j == len(context) or not (context[j].isalnum() and answer[-1].isalnum())):
            return True
        i = context.find(answer, i + 1)
    return False


def test_predict(runs, tmp_path):
    """predict answers as eval does on the same questions written as SQuAD (one window each: the contexts
    are shorter than --max-seq-len): the same span, not merely some substring of the context. Every word of
    these contexts is a single entry of the vocabulary, so every token starts and ends at a word or
    punctuation boundary and so must the answer."""
    questions = [("1", "Who won the game?", "The Denver Broncos won the game against the Carolina Panthers."),
                 ("a", "Where?", "It opened in Paris, near the café."), ("2", "When?", "In 1999 it closed.")]
    p = run_bq("predict", "--model", runs / "fp32", "--question", questions[0][1], "--context", questions[0][2])
    idx, ans = p.stdout.rstrip("\n").split("\t")
    got = {idx: ans}
    f = tmp_path / "q.jsonl"
    # (the second line has no id: predict names it by its line number)
    f.write_text(json.dumps({"id": "a", "question": questions[1][1], "context": questions[1][2]}) + "\n" +
                 json.dumps({"question": questions[2][1], "context": questions[2][2]}) + "\n")
    lines = [json.loads(l) for l in run_bq("predict", "--model", runs / "fp32", "--data", f, "--json").stdout.splitlines()]
    assert [x["id"] for x in lines] == ["a", "2"]
    got.update((x["id"], x["answer"]) for x in lines)
    # The same questions through eval: a SQuAD file whose reference answers only have to exist.
    paras = [{"context": c, "qas": [{"id": i, "question": q, "answers": [{"text": c[:2], "answer_start": 0}]}]}
             for i, q, c in questions]
    (tmp_path / "q.json").write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paras}]}))
    run_bq("eval", "--model", runs / "fp32", "--data", tmp_path / "q.json", "--predictions", tmp_path / "eval.json",
           "--threads", THREADS, "--no-cache")
    want = json.load(open(tmp_path / "eval.json"))
    print(f"predict {got}, eval {want}")
    assert got == want, f"predict answered {got}, eval {want}"
    for i, _, c in questions:
        assert on_word_boundaries(got[i], c), f"{got[i]!r} is not a span of whole words of {c!r}"


def test_errors(runs, tmp_path):
    out = tmp_path / "out"
    cases = [
        (["eval", "--model", runs / "fp32", "--data", IMDB], "not a SQuAD v1.1 JSON file"),
        (["eval", "--model", runs / "tiny", "--data", SQUAD_DEV], "SQuAD question-answering data"),
        (["finetune", "--model", runs / "tiny", "--data", SQUAD_TRAIN, "--out", out, "--doc-stride", 64],
         "--doc-stride applies to question answering only"),
        (["finetune", "--model", runs / "fp32", "--data", SQUAD_TRAIN, "--out", out, "--task", "cls"],
         "is a question-answering model"),
        (["finetune", "--model", runs / "fp32", "--data", SQUAD_TRAIN, "--out", out, "--task", "ner"],
         "--task: 'ner' is not qa or cls"),
        (["finetune", "--model", runs / "fp32", "--data", SQUAD_TRAIN, "--out", out, "--truncation", "tail"],
         "--truncation applies to classification only"),
        (["eval", "--model", runs / "fp32", "--data", SQUAD_DEV, "--doc-stride", 100], "--doc-stride: 100 must be below"),
        (["eval", "--model", runs / "fp32", "--data", SQUAD_DEV, "--max-seq-len", 1000], "max_position_embeddings"),
        (["predict", "--model", runs / "fp32", "--question", "Who?"], "--question and --context"),
        (["predict", "--model", runs / "fp32", "some text"], "not TEXT"),
        (["calibrate", "--model", runs / "fp32", "--data", SQUAD_TRAIN, "--out", out, "--eval-samples", 10],
         "--eval-samples"),
    ]
    for args, msg in cases:
        p = run_bq(*args, check=False)
        lines = p.stderr.strip().splitlines()
        assert p.returncode != 0 and msg in lines[-1] and lines[-1].startswith("bertqat "), (args, p.stderr[-800:])
        assert not out.exists()


def test_export_hf(runs, tmp_path):
    """export-hf of a QA checkpoint: transformers reads the config as a BertForQuestionAnswering one, and the
    weights are that model's state dict (no pooler; qa_outputs (2, H)). Loading them into PyTorch is
    tests/check_export_hf_torch.py's job (PyTorch is not in the test environment)."""
    from safetensors.numpy import load_file
    from transformers import BertConfig
    out = tmp_path / "hf"
    run_bq("export-hf", "--model", runs / "fp32", "--out", out)
    cfg = BertConfig.from_pretrained(str(out))
    assert cfg.architectures == ["BertForQuestionAnswering"] and cfg.num_labels == 2
    w = load_file(str(out / "model.safetensors"))
    assert w["qa_outputs.weight"].shape == (2, H) and w["qa_outputs.bias"].shape == (2,)
    assert not [k for k in w if "pooler" in k or "classifier" in k]
    assert len(w) == 5 + 16 * L + 2


def test_pipeline_qa(runs, tmp_path):
    """`pipeline --task qa` on the tiny model: every stage runs with the QA flags, each stage's EM/F1 in
    the report equals its eval JSON, the answer-by-answer rows equal a count over the prediction files,
    the fp32 export answers every question as the checkpoint does, there is no validation chart (QA trains
    without validation passes), and a second run only rewrites the report."""
    out, n = tmp_path / "run", 60
    args = ["pipeline", "--task", "qa", "--model", runs / "tiny", "--data", os.path.join(DATA, "squad"), "--out",
            out, "--budget", "small", "--train-samples", 120, "--eval-samples", n, "--max-seq-len", 128,
            "--batch-size", 16, "--calib-samples", 32, "--lr", 1e-3, "--qat-lr", 1e-4, "--threads", THREADS,
            "--python", sys.executable]
    env = dict(os.environ, BERTQAT_CACHE=str(tmp_path / "cache"))
    p = run_bq(*args, env=env, timeout=1800)
    log = p.stderr
    for stage in ("fp32", "qat"):  # doc stride: half of the (128 - 67)-token context room
        line = [ln for ln in log.splitlines() if ln.startswith(f"[pipeline] {stage}: ")]
        assert line and "--task qa" in line[0] and "--doc-stride 30" in line[0], (stage, log[-3000:])
    assert "--teacher" not in log, log[-3000:]  # distillation is the classification pipeline's default only
    rows = {"fp32": "| fp32 | fp32 |", "ptq": "| PTQ (cpu scheme, percentile 99.99) | int8 |",
            "ptq-fake-quant": "| PTQ (cpu scheme, percentile 99.99) | fake-quant |",
            "qat": "| QAT (cpu scheme) | int8 |", "qat-fake-quant": "| QAT (cpu scheme) | fake-quant |",
            "onnx-fp32": "| ONNX fp32 (for ORT CPU) | onnxruntime", "onnx-int8-cpu": "| ONNX int8 QAT, CPU layout (for ORT CPU) | onnxruntime"}
    report = (out / "report.md").read_text()
    assert "| stage | engine | exact match | F1 | F1 vs fp32 | questions | model size | questions/s |" in report
    res, pred = {}, {}
    for name, row in rows.items():
        r = json.loads((out / f"eval-{name}.json").read_text())
        assert r["task"] == "qa" and r["examples"] == n and r["max_seq_len"] == 128 and r["doc_stride"] == 30, r
        res[name], pred[name] = r, json.loads((out / f"pred-{name}.json").read_text())
        assert len(pred[name]) == n, name
        line = [ln for ln in report.splitlines() if ln.startswith(row)]
        assert len(line) == 1, (row, report)
        cells = [x.strip() for x in line[0].strip("|").split("|")]
        assert cells[2] == f"{r['exact_match']:.2f}" and cells[3] == f"{r['f1']:.2f}" and cells[5] == str(n), cells
    print("\n" + "\n".join(f"{k}: EM {v['exact_match']:.2f} F1 {v['f1']:.2f}" for k, v in res.items()))
    # the fp32 export in ONNX Runtime answers exactly as the checkpoint (independent windows and post-processing)
    assert pred["onnx-fp32"] == pred["fp32"]
    assert abs(res["onnx-fp32"]["f1"] - res["fp32"]["f1"]) < 1e-9
    for label, a, b in (("PTQ (cpu scheme, percentile 99.99): int8 vs fake-quant", "ptq", "ptq-fake-quant"),
                        ("QAT (cpu scheme): int8 vs fake-quant", "qat", "qat-fake-quant"),
                        ("ONNX fp32 (for ORT CPU) vs fp32 (fp32)", "onnx-fp32", "fp32"),
                        ("ONNX int8 QAT, CPU layout (for ORT CPU) vs QAT (cpu scheme) (int8)", "onnx-int8-cpu", "qat")):
        differ = sum(pred[a][k] != pred[b][k] for k in pred[b])
        line = [ln for ln in report.splitlines() if ln.startswith(f"| {label} |")]
        assert len(line) == 1, (label, report)
        cells = [x.strip() for x in line[0].strip("|").split("|")]
        assert cells[1] == str(n) and cells[2] == f"{100 * (n - differ) / n:.2f}% ({differ} differ)", (cells, differ)
        assert cells[3] == f"{res[a]['f1'] - res[b]['f1']:+.2f}", cells
    assert not (out / "curves-eval.svg").exists() and (out / "curves-loss.svg").stat().st_size > 0
    assert "![validation accuracy]" not in report and "no validation curve" in report, report[-600:]
    assert "questions/s: inference only" in report and "## Speed on this machine" not in report
    # a second run: every stage done already, the same table
    p = run_bq(*args, env=env, timeout=600)
    assert "[pipeline] qat: done already" in p.stderr and "finetune --model" not in p.stderr, p.stderr[-2000:]
    again = (out / "report.md").read_text()
    table = lambda t: [ln for ln in t.splitlines() if ln.startswith("| ")]
    assert table(again) == table(report)
