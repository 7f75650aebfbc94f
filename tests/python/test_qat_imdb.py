"""PTQ and QAT floors on IMDB at a small budget (all-MiniLM-L6-v2, env BQ_MODEL_DIR):
1. the session's fp32 fine-tune on 2000 training reviews (seq 128, 1 epoch; conftest.finetuned);
2. `calibrate --calibrator percentile` (128 samples): PTQ accuracy on 1000 test reviews must stay
   within 5 points of the fp32 model's on the same reviews;
3. `qat` from the fp32 model (1000 reviews, 60 steps, ranges frozen after 40): trains without
   NaN/Inf and `eval` on 1000 test reviews reaches >= 0.78;
4. `info` lists the 18·L+1 ort quantizers with ranges;
5. `qat --ranges fixed` from the PTQ model (4 steps) leaves every range exactly as PTQ set it.
Prints accuracies and the QAT/fp32 seconds-per-step ratio (same batch size and sequence length)."""
import json
import re
import time

from conftest import IMDB, MODEL, THREADS, run_bq

COMMON = ["--max-seq-len", 128, "--threads", THREADS, "--seed", 42]


def steps_and_seconds(stdout, tag):
    m = re.search(tag + r": (\d+) steps in ([0-9.]+)s", stdout)
    assert m, stdout
    return int(m.group(1)), float(m.group(2))


def quantizer_ranges(info_stdout):
    """{quantizer name: (amax min, amax max)} from `bertqat info`."""
    return {m.group(1): (m.group(2), m.group(3))
            for m in re.finditer(r"^(bert\.\S+_quantizer)\s+\S+\s+\d+\s+\d+\s+(\S+)\s+(\S+)", info_stdout, flags=re.M)}


def test_ptq_and_qat_imdb(tmp_path, finetuned):
    fp32, p, _ = finetuned
    ft_steps, ft_secs = steps_and_seconds(p.stdout, "finetune")

    # PTQ, percentile calibrator
    ptq = tmp_path / "ptq"
    p = run_bq("calibrate", "--model", fp32, "--data", IMDB, "--out", ptq, "--calibrator", "percentile",
               "--percentile", 99.99, "--calib-samples", 128, "--eval-samples", 1000, "--batch-size", 32, *COMMON,
               timeout=3600)
    m = re.search(r"accuracy on (\d+) test examples: fp32 ([0-9.]+), ptq ([0-9.]+)", p.stdout)
    assert m, p.stdout
    acc_fp32, acc_ptq = float(m.group(2)), float(m.group(3))
    cfg = json.loads((ptq / "config.json").read_text())
    assert cfg["bertqat"]["quant"]["scheme"] == "ort"

    # QAT from the fp32 model (calibrates with max first), observers frozen after 40 steps
    qat = tmp_path / "qat"
    t0 = time.time()
    p = run_bq("qat", "--model", fp32, "--data", IMDB, "--out", qat, "--train-samples", 1000,
               "--val-fraction", 0.05, "--max-steps", 60, "--lr", 2e-5, "--batch-size", 16, "--log-every", 20,
               "--freeze-ranges-after", 40, "--bucket", *COMMON, timeout=3600)
    t_qat = time.time() - t0
    qat_steps, qat_secs = steps_and_seconds(p.stdout, "qat")
    assert qat_steps == 60 and "nan" not in p.stdout.lower(), p.stdout
    assert "frozen" in p.stdout, p.stdout

    p = run_bq("eval", "--model", qat, "--data", IMDB, "--split", "test", "--samples", 1000, "--json",
               "--max-seq-len", 128, "--threads", THREADS, timeout=3600)
    r = json.loads(p.stdout)
    acc_qat = r["accuracy"]

    p = run_bq("info", qat)
    layers = json.loads((qat / "config.json").read_text())["num_hidden_layers"]
    names = re.findall(r"^bert\.\S+_quantizer", p.stdout, flags=re.M)
    assert len(names) == 18 * layers + 1, p.stdout
    assert "no range" not in p.stdout, p.stdout

    # QAT from the PTQ model with --ranges fixed (the pipeline's recipe): the weights learn, every
    # range stays exactly the PTQ model's
    fixed = tmp_path / "qat_fixed"
    p = run_bq("qat", "--model", ptq, "--data", IMDB, "--out", fixed, "--ranges", "fixed", "--train-samples", 200,
               "--val-fraction", 0.1, "--max-steps", 4, "--lr", 2e-5, "--batch-size", 16, *COMMON, timeout=3600)
    assert "ranges: fixed" in p.stderr, p.stderr
    ranges_ptq = quantizer_ranges(run_bq("info", ptq).stdout)
    ranges_fixed = quantizer_ranges(run_bq("info", fixed).stdout)
    assert len(ranges_ptq) == 18 * layers + 1 and ranges_fixed == ranges_ptq
    p = run_bq("qat", "--model", ptq, "--data", IMDB, "--out", tmp_path / "bad", "--ranges", "sometimes", check=False)
    assert p.returncode != 0 and "--ranges" in p.stderr and not (tmp_path / "bad").exists(), p.stderr

    ratio = (qat_secs / qat_steps) / (ft_secs / ft_steps)
    print(f"\nfp32 {acc_fp32:.4f}  ptq(percentile 99.99) {acc_ptq:.4f}  qat {acc_qat:.4f} on 1000 test reviews; "
          f"qat {qat_secs / qat_steps:.3f}s/step vs fp32 {ft_secs / ft_steps:.3f}s/step (x{ratio:.2f}); "
          f"qat wall {t_qat:.0f}s")
    assert acc_ptq >= acc_fp32 - 0.05, (acc_fp32, acc_ptq)
    assert acc_qat >= 0.78, acc_qat


def test_quant_cli_errors(tmp_path, bin_path):
    """Bad quantization flags are one-line errors naming the flag, before any data is read."""
    for args, flag in ((["--calibrator", "kl"], "--calibrator"), (["--scheme", "tflite"], "--scheme")):
        p = run_bq("calibrate", "--model", MODEL, "--data", IMDB, "--out", tmp_path / "x", *args, check=False)
        assert p.returncode != 0 and flag in p.stderr, p.stderr
        assert not (tmp_path / "x").exists()
    p = run_bq("info", tmp_path / "does_not_exist", check=False)
    assert p.returncode != 0 and "does_not_exist" in p.stderr, p.stderr
