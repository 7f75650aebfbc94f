#!/usr/bin/env python3
"""The GEMM work of a `bertqat sensitivity` run and the time it needs at given GEMM ceilings.

Reads the run's sensitivity.json (its groups, examples and scheme) and the model's config.json, counts the
multiply-adds of every pass the way src/sensitivity.c runs them, and prints the time those products take at
the ceilings given (GFLOP/s for fp32 GEMMs, GOP/s for 8-bit GEMMs), with no other work. This is a floor:
what any exact implementation of the measurement needs on that CPU.

The passes (docs/quantization.md, "sensitivity"): per batch the fp32 and the all-quantized reference pass
(teacher, baselines and the per-batch caches at once), then each group's two passes ("only this group
quantized", "only this group in fp32") from the group's layer on. In the group's own layer the Linears its
quantizers cannot reach are reused (bq_bert_linear_reach in layers/bert.c; the table REACH below follows it
by module name); the attention products of that layer always run. The last layer of a classification model
computes key and value for every token and the query, its attention row and the rest for [CLS] only (a
question-answering model: every token). Linears of a quantized pass count as 8-bit GEMMs (integer kernels with VNNI or AMX;
on other CPUs they are exact sgemm on the codes, so give the fp32 ceiling twice); the attention products
count as fp32 (sgemm on codes; docs/results.md#sensitivity-analysis-time).

    python3 bench/sensitivity_floor.py RUN/sensitivity.json CKPT/config.json --seq 128 \\
        --ceiling "Zen 3, 2 cores at 2.45 GHz, fp32 FMA peak=156.5,156.5"
"""
import argparse
import json
import re
import sys

ALL = {"q", "k", "v", "ao", "i", "o"}
# module name suffix -> the Linears of its layer that its quantizers reach (layers/bert.c, bq_bert_linear_reach)
REACH = [
    (r"attention\.self$", ALL),  # the cpu scheme's QKV group: the shared input quantizer and the three weights
    (r"attention\.self\.query$", {"q", "ao", "i", "o"}),
    (r"attention\.self\.key$", {"k", "ao", "i", "o"}),
    (r"attention\.self\.value$", {"v", "ao", "i", "o"}),
    (r"attention\.self\.(softmax|matmul_qk|matmul_av)$", {"ao", "i", "o"}),
    (r"attention\.output\.dense$", {"ao", "i", "o"}),
    (r"attention\.output\.(residual_add|LayerNorm)$", {"i", "o"}),
    (r"intermediate\.dense$", {"i", "o"}),
    (r"intermediate\.intermediate_act_fn$", {"o"}),
    (r"layer\.\d+\.output\.dense$", {"o"}),
    (r"layer\.\d+\.output\.(residual_add|LayerNorm)$", set()),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sensitivity_json")
    ap.add_argument("config_json")
    ap.add_argument("--seq", type=int, default=128, help="tokens per example the run used")
    ap.add_argument("--ceiling", action="append", default=[],
                    help='"NAME=FP32_GFLOPS,INT8_GOPS" (repeatable)')
    a = ap.parse_args()
    try:
        sens = json.load(open(a.sensitivity_json))
        cfg = json.load(open(a.config_json))
        H, I, NL, T = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], a.seq
        groups, n = sens["groups"], sens["examples"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"sensitivity_floor.py: {e}")
    ceilings = []
    for c in a.ceiling:
        label, _, rates = c.rpartition("=")
        try:
            fp, it = (float(x) for x in rates.split(","))
        except ValueError:
            sys.exit(f'sensitivity_floor.py: --ceiling "{c}": expected NAME=FP32_GFLOPS,INT8_GOPS')
        ceilings.append((label, fp, it))
    # a question-answering model runs its last layer on every token; a classifier on [CLS] (design.md §5)
    cls_last = "BertForQuestionAnswering" not in cfg.get("architectures", [])
    macs = {"q": H * H, "k": H * H, "v": H * H, "ao": H * H, "i": H * I, "o": I * H}  # per token
    att = 2 * T * H  # Q·Kᵀ and P·V per query token

    def layer(reach, last):
        """(Linear MACs, attention MACs) of one layer for one example."""
        cls = last and cls_last
        lin = sum(macs[n] * (1 if cls and n in ("q", "ao", "i", "o") else T) for n in reach)
        return lin, att * (1 if cls else T)

    def from_layer(l0, reach0):
        lin, at = layer(reach0, l0 == NL - 1)
        for l in range(l0 + 1, NL):
            x, y = layer(ALL, l == NL - 1)
            lin += x
            at += y
        return lin, at

    full_lin, full_att = from_layer(0, ALL)
    f32 = full_lin + full_att + full_att  # the fp32 reference pass; the quantized one's attention
    i8 = full_lin                         # the quantized reference pass's Linears
    for g in groups:
        name = g["group"]
        m = re.search(r"encoder\.layer\.(\d+)\.", name)
        if not m:  # the embeddings: every layer
            lin, at = full_lin, full_att
        else:
            reach = next((r for pat, r in REACH if re.search(pat, name)), None)
            if reach is None:
                sys.exit(f"sensitivity_floor.py: {name}: no reach rule")
            lin, at = from_layer(int(m.group(1)), reach)
        f32 += lin + at  # only this group quantized: the rest runs fp32
        f32 += at        # only this group in fp32: the Linears quantized, the attention products on sgemm
        i8 += lin
    tf32, ti8 = 2 * f32 * n / 1e12, 2 * i8 * n / 1e12
    print(f"{sens.get('scheme')} scheme, {len(groups)} groups, {n} examples at {T} tokens "
          f"(H {H}, I {I}, {NL} layers): {2 * (f32 + i8) / 1e9:.1f} GFLOP per example; "
          f"{tf32:.1f} TFLOP fp32 + {ti8:.1f} TOP 8-bit = {tf32 + ti8:.1f} T in all")
    if "seconds" in sens:
        print(f"the run took {sens['seconds']:.0f} s ({sens['seconds'] / 60:.1f} min): "
              f"{(tf32 + ti8) * 1e3 / sens['seconds']:.1f} G operations/s (fp32 and 8-bit together) on average")
    for label, fp, it in ceilings:
        t = tf32 * 1e3 / fp + ti8 * 1e3 / it
        print(f"{label}: fp32 {fp:g} GFLOP/s, 8-bit {it:g} GOP/s -> {t:.1f} s ({t / 60:.1f} min) at the ceilings")


if __name__ == "__main__":
    main()
