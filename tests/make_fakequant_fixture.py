"""Writes tests/fixtures/quant/fakequant.json: PyTorch 1.13 reference values for bertqat's fake
quantization (int8, zero point 0, quant_min -128, quant_max 127) and observers.

Run: /opt/torchenv/bin/python tests/make_fakequant_fixture.py   (torch only for generation; CI reads
the committed JSON).

Cases
  per_tensor_ties: power-of-two scale 2^-4 with exact ties (k+0.5)·s (round half to even), values at
      and beyond -128·s / 127·s, and in (127, 127.5]·s and [-128.5, -128)·s where the STE mask of
      torch.fake_quantize_per_tensor_affine (computed on the ROUNDED value) matters.
      Power-of-two scales make x·(1/s) (PyTorch) and x/s (bertqat) identical.
  per_channel: a (4, 8) weight, per-row power-of-two scales, torch.fake_quantize_per_channel_affine
      along axis 0, with ties and saturation.
  random: normal data with a non-power-of-two scale (ties have probability ~0).
  observer_act: 3 batches through torch.ao.quantization.MovingAverageMinMaxObserver (c = 0.01,
      qint8, per_tensor_symmetric): min_val/max_val after each batch; then the fake-quant of the last
      batch with bertqat's scale amax/127.
  observer_weight: 3 successive weights (6, 8) through MovingAveragePerChannelMinMaxObserver
      (ch_axis 0), per-channel min/max after each, and the per-channel fake-quant of the last weight.
Every float is a float32 value written exactly (JSON double)."""
import json
import os

import numpy as np
import torch
from torch.ao.quantization.observer import MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "quant")


def fq_tensor(x, scale):
    """Forward and STE mask (dx for dy = 1) of PyTorch's per-tensor fake quant."""
    x = x.clone().requires_grad_(True)
    y = torch.fake_quantize_per_tensor_affine(x, float(scale), 0, -128, 127)
    y.backward(torch.ones_like(y))
    return y.detach(), x.grad.detach()


def fq_channel(x, scales):
    x = x.clone().requires_grad_(True)
    y = torch.fake_quantize_per_channel_affine(x, scales, torch.zeros(len(scales), dtype=torch.int32), 0, -128, 127)
    y.backward(torch.ones_like(y))
    return y.detach(), x.grad.detach()


def lst(t):
    return [float(v) for v in np.asarray(t, dtype=np.float32).ravel()]


def main():
    torch.manual_seed(0)
    rng = np.random.default_rng(7)
    cases = {}

    s = 2.0 ** -4
    k = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -127.5, 127.0, -128.0, 127.25, 127.5, 127.75,
                  128.0, -128.25, -128.5, -128.75, -129.0, 300.0, -300.0, 0.0, 3.2, -7.9, 64.5, -64.5],
                 dtype=np.float64)
    x = torch.tensor(k * s, dtype=torch.float32)
    y, g = fq_tensor(x, s)
    cases["per_tensor_ties"] = {"shape": [len(k)], "scale": [s], "axis": -1, "x": lst(x), "y": lst(y), "mask": lst(g)}

    scales = torch.tensor([2.0 ** -4, 2.0 ** -6, 2.0 ** -3, 1.0], dtype=torch.float32)
    w = torch.tensor(rng.normal(0, 4, (4, 8)), dtype=torch.float32) * scales[:, None] * 8
    w[0, 0] = 2.5 * scales[0]
    w[1, 1] = -3.5 * scales[1]
    w[2, 2] = 127.5 * scales[2]
    w[3, 3] = -128.5 * scales[3]
    w[0, 4] = 200 * scales[0]
    y, g = fq_channel(w, scales)
    cases["per_channel"] = {"shape": [4, 8], "scale": lst(scales), "axis": 0, "x": lst(w), "y": lst(y), "mask": lst(g)}

    x = torch.tensor(rng.normal(0, 1.5, 200), dtype=torch.float32)
    sc = float(np.float32(3.0) / np.float32(127.0))
    y, g = fq_tensor(x, sc)
    cases["random"] = {"shape": [200], "scale": [sc], "axis": -1, "x": lst(x), "y": lst(y), "mask": lst(g)}

    obs = MovingAverageMinMaxObserver(averaging_constant=0.01, dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
    batches, mins, maxs = [], [], []
    for i in range(3):
        b = torch.tensor(rng.normal(0.3 * i, 1.0 + i, (2, 3, 5)), dtype=torch.float32)
        obs(b)
        batches.append(lst(b))
        mins.append(float(obs.min_val))
        maxs.append(float(obs.max_val))
    amax = np.float32(max(-min(mins[-1], 0.0), max(maxs[-1], 0.0)))
    sc = float(amax / np.float32(127.0))
    y, _ = fq_tensor(torch.tensor(batches[-1], dtype=torch.float32), sc)
    cases["observer_act"] = {"shape": [2, 3, 5], "batches": batches, "min": mins, "max": maxs, "scale": [sc],
                             "y_last": lst(y)}

    wobs = MovingAveragePerChannelMinMaxObserver(averaging_constant=0.01, ch_axis=0, dtype=torch.qint8,
                                                 qscheme=torch.per_channel_symmetric)
    ws, wmins, wmaxs = [], [], []
    w = torch.tensor(rng.normal(0, 0.05, (6, 8)), dtype=torch.float32)
    for i in range(3):
        w = w + torch.tensor(rng.normal(0, 0.01, (6, 8)), dtype=torch.float32)
        wobs(w)
        ws.append(lst(w))
        wmins.append(lst(wobs.min_val))
        wmaxs.append(lst(wobs.max_val))
    mn, mx = np.array(wmins[-1], np.float32), np.array(wmaxs[-1], np.float32)
    amax = np.maximum(-np.minimum(mn, 0), np.maximum(mx, 0)).astype(np.float32)
    scw = (amax / np.float32(127.0)).astype(np.float32)
    y, _ = fq_channel(torch.tensor(ws[-1], dtype=torch.float32).reshape(6, 8), torch.tensor(scw))
    cases["observer_weight"] = {"shape": [6, 8], "weights": ws, "min": wmins, "max": wmaxs, "scale": lst(scw),
                                "y_last": lst(y)}

    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "fakequant.json"), "w") as f:
        json.dump({"torch": torch.__version__, "cases": cases}, f)
    t = cases["per_tensor_ties"]
    for xi, yi, gi in zip(t["x"], t["y"], t["mask"]):
        print(f"x/s={xi / s:9.3f} y/s={yi / s:7.1f} mask={gi}")


if __name__ == "__main__":
    main()
