"""Writes tests/fixtures/quant/lsq.json: a PyTorch reference of learned step size quantization (LSQ,
Esser et al., "Learned Step Size Quantization", ICLR 2020) for tests/test_lsq_ref.c.

Run: /work/torchvenv/bin/python tests/make_lsq_fixture.py   (torch only for generation; CI reads the
committed JSON).

The reference is the paper's formulation with its two tricks, written in PyTorch autograd:
  grad_scale(s, g)   the value of s, the gradient times g      (paper: (s - s·g).detach() + s·g)
  round_pass(v)      round to nearest even, gradient passed     (paper: (round(v) - v).detach() + v)
both as autograd Functions so the values are exact in float32 (the one-liners can be an ulp off),
  y = clamp(round_pass(x / s), qmin, qmax) · s,     g = 1 / sqrt(N · qmax)
with the clamp applied to the ROUNDED value, as bertqat's fake quantization and
torch._fake_quantize_learnable_per_tensor_affine do (autograd/kernels.h): the straight-through mask
of dx is qmin <= round(x/s) <= qmax, and ds per element is round(x/s) - x/s inside, qmin / qmax
below / above. (The paper clamps x/s before rounding; the two differ only for x/s within half a step
outside the range.) The script also checks its reference against PyTorch's own learnable fake
quantization (per tensor and per channel) and stops if they disagree.

Cases (random tensors, values across both clamp edges, a random upstream gradient dy):
  per_tensor_signed   (4, 50), 8-bit [-128, 127]; N = all 200 elements
  per_tensor_unsigned (4, 50), [0, 255], values on both sides of 0
  per_channel_w7      (8, 40) weight, axis 0, 7-bit [-64, 63] (the cpu scheme's weights); N = 40
  per_channel_mid     (3, 4, 5), axis 1, 8-bit: the (outer, channel, inner) layout; N = 15
  per_channel_unsigned (6, 30), axis 0, [0, 255]
Each case stores shape, axis, qmin, qmax, g, x, scale, dy, y, dx and dscale (float32 values written
exactly as JSON doubles)."""
import json
import os

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "quant")


class GradScale(torch.autograd.Function):
    """The paper's grad_scale: the value of s, its gradient times g. Written as a Function because the
    paper's one-liner (s - s·g).detach() + s·g does not return s exactly in float32."""

    @staticmethod
    def forward(ctx, s, g):
        ctx.g = g
        return s.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.g, None


class RoundPass(torch.autograd.Function):
    """The paper's round_pass: round half to even forward, straight-through backward (as a Function:
    (round(v) - v).detach() + v can land one ulp off the integer, which moves the clamp's mask)."""

    @staticmethod
    def forward(ctx, v):
        return torch.round(v)

    @staticmethod
    def backward(ctx, grad):
        return grad


def grad_scale(s, g):
    return GradScale.apply(s, g)


def round_pass(v):
    return RoundPass.apply(v)


def lsq(x, s, qmin, qmax, g, axis):
    """The reference: returns y, dx, ds for upstream gradient dy (set by the caller via backward)."""
    sg = grad_scale(s, g)
    if axis >= 0:
        view = [1] * x.dim()
        view[axis] = -1
        sg = sg.view(view)
    vbar = round_pass(x / sg)
    # the clamp, written out: inside [qmin, qmax] (bounds included) the rounded value with its gradient,
    # outside the bound as a constant (torch.clamp's backward drops the gradient AT the bounds)
    inside = (vbar >= qmin) & (vbar <= qmax)
    return torch.where(inside, vbar, vbar.detach().clamp(qmin, qmax)) * sg


def run(x, s, dy, qmin, qmax, axis):
    n_per_scale = x.numel() // s.numel()
    g = 1.0 / np.sqrt(n_per_scale * qmax)
    xr = x.clone().requires_grad_(True)
    sr = s.clone().requires_grad_(True)
    y = lsq(xr, sr, qmin, qmax, g, axis)
    y.backward(dy)
    # PyTorch's own LSQ kernel, as a cross-check of the reference (it multiplies by 1/s where the
    # reference divides, so values agree to rounding, not bit for bit)
    xt = x.clone().requires_grad_(True)
    st = s.clone().requires_grad_(True)
    zp = torch.zeros(s.numel(), dtype=torch.float32)
    if axis < 0:
        yt = torch._fake_quantize_learnable_per_tensor_affine(xt, st, zp, qmin, qmax, g)
    else:
        yt = torch._fake_quantize_learnable_per_channel_affine(xt, st, zp, axis, qmin, qmax, g)
    yt.backward(dy)
    scale_err = float((st.grad - sr.grad).abs().max())
    scale_ref = float(sr.grad.abs().max()) + 1e-6
    # the reference's dx is dy·s/s in float (autograd through the product and the division), so it
    # equals PyTorch's dx = dy to rounding
    dd = (xt.grad - xr.grad).abs().reshape(-1)
    vv = (x / (s if axis < 0 else s.view([-1 if d == axis else 1 for d in range(x.dim())]))).reshape(-1)
    assert torch.allclose(xt.grad, xr.grad, rtol=1e-6, atol=1e-6), f"dx differs at x/s = {vv[dd > 1e-6].tolist()}"
    assert scale_err <= 1e-4 * scale_ref, f"dscale differs from PyTorch's learnable fake quant: {scale_err}"
    assert float((yt - y).detach().abs().max()) <= float(s.max()) * 1.0001, "forward differs by more than a step"
    return y.detach(), xr.grad.detach(), sr.grad.detach(), g, scale_err


def lst(t):
    return [float(v) for v in np.asarray(t, dtype=np.float32).ravel()]


def edges(x, s, axis, qmin, qmax, rng):
    """Places some elements exactly at and around both clamp edges (in units of their scale)."""
    flat = x.view(-1)
    shape = x.shape
    marks = [qmax, qmax + 0.25, qmax + 0.49, qmax + 0.75, qmax + 3.0, qmin, qmin - 0.25, qmin - 0.49,
             qmin - 0.75, qmin - 3.0, qmax - 0.3, qmin + 0.3]
    idx = rng.choice(flat.numel(), size=len(marks), replace=False)
    for k, m in zip(idx, marks):
        if axis < 0:
            sc = float(s[0])
        else:
            inner = int(np.prod(shape[axis + 1:])) if axis + 1 < len(shape) else 1
            sc = float(s[(int(k) // inner) % s.numel()])
        flat[int(k)] = float(np.float32(m) * np.float32(sc))


def case(rng, shape, axis, qmin, qmax, loc, std, amax):
    x = torch.tensor(rng.normal(loc, std, shape), dtype=torch.float32)
    ns = 1 if axis < 0 else shape[axis]
    a = np.asarray(amax, dtype=np.float32) * np.ones(ns, dtype=np.float32)
    s = torch.tensor(a / np.float32(qmax), dtype=torch.float32)
    edges(x, s, axis, qmin, qmax, rng)
    dy = torch.tensor(rng.normal(0, 1, shape), dtype=torch.float32)
    y, dx, ds, g, err = run(x, s, dy, qmin, qmax, axis)
    return {"shape": list(shape), "axis": axis, "qmin": qmin, "qmax": qmax, "g": float(np.float32(g)),
            "x": lst(x), "scale": lst(s), "dy": lst(dy), "y": lst(y), "dx": lst(dx), "dscale": lst(ds)}, err


def main():
    torch.manual_seed(0)
    rng = np.random.default_rng(16)
    cases = {}
    errs = {}
    cases["per_tensor_signed"], errs["per_tensor_signed"] = case(rng, (4, 50), -1, -128, 127, 0.0, 1.5, 2.5)
    cases["per_tensor_unsigned"], errs["per_tensor_unsigned"] = case(rng, (4, 50), -1, 0, 255, 1.0, 1.5, 3.0)
    cases["per_channel_w7"], errs["per_channel_w7"] = case(
        rng, (8, 40), 0, -64, 63, 0.0, 0.05, rng.uniform(0.05, 0.15, 8))
    cases["per_channel_mid"], errs["per_channel_mid"] = case(
        rng, (3, 4, 5), 1, -128, 127, 0.0, 1.0, rng.uniform(1.0, 3.0, 4))
    cases["per_channel_unsigned"], errs["per_channel_unsigned"] = case(
        rng, (6, 30), 0, 0, 255, 0.5, 1.0, rng.uniform(1.0, 3.0, 6))
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "lsq.json")
    with open(path, "w") as f:
        json.dump({"torch": torch.__version__, "cases": cases}, f)
    for k, v in cases.items():
        print(f"{k:22s} dscale {v['dscale'][:3]}... max |reference - torch learnable| {errs[k]:.3g}")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
