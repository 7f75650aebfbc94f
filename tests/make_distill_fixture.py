"""Writes tests/fixtures/distill/distill.json: PyTorch reference values of the distillation loss of
`qat --teacher` (src/train.h BqDistill, src/train.c bq_train_distill_loss) and of its gradient with
respect to the student's logits and hidden states.

Run: /work/torchvenv/bin/python tests/make_distill_fixture.py   (torch only for generation; CI reads the
committed JSON through tests/test_distill_ref.c).

The loss, computed in float64 from float32 inputs:
    (1 - A) * F.cross_entropy(s, labels)
  + A * T**2 * F.kl_div(F.log_softmax(s / T, -1), F.log_softmax(t / T, -1), reduction="batchmean", log_target=True)
  + W * sum_l F.mse_loss(hs[l], ht[l])          (mean over every element of layer l's (B, T, H) output)
where kl_div(input, target, log_target=True) = sum target.exp() * (target - input), i.e. KL(p_t || p_s)
with p = softmax(z / T), divided by the batch size B ("batchmean"). s, hs: student logits (B, C) and
hidden states; t, ht: the teacher's (constants). Cases vary A, T and W (W = 0: no hidden term)."""
import json
import os

import numpy as np
import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "distill", "distill.json")
B, C, L, SEQ, H = 4, 3, 2, 3, 5


def case(rng, alpha, temp, hw):
    f32 = lambda *shape, sc=1.0: (rng.standard_normal(shape) * sc).astype(np.float32)
    s, t = f32(B, C, sc=2.0), f32(B, C, sc=2.0)
    hs, ht = f32(L, B, SEQ, H), f32(L, B, SEQ, H)
    labels = rng.integers(0, C, size=B)
    S = torch.tensor(s, dtype=torch.float64, requires_grad=True)
    HS = torch.tensor(hs, dtype=torch.float64, requires_grad=True)
    T_ = torch.tensor(t, dtype=torch.float64)
    HT = torch.tensor(ht, dtype=torch.float64)
    ce = F.cross_entropy(S, torch.tensor(labels))
    kl = F.kl_div(F.log_softmax(S / temp, -1), F.log_softmax(T_ / temp, -1), reduction="batchmean",
                  log_target=True) * temp * temp
    mse = sum(F.mse_loss(HS[l], HT[l]) for l in range(L))
    loss = (1 - alpha) * ce + alpha * kl + hw * mse
    loss.backward()
    flat = lambda a: [float(v) for v in np.asarray(a, dtype=np.float64).ravel()]
    return {"alpha": alpha, "temperature": temp, "hidden_weight": hw, "B": B, "C": C, "layers": L, "T": SEQ, "H": H,
            "labels": [int(v) for v in labels], "student": flat(s), "teacher": flat(t), "student_hidden": flat(hs),
            "teacher_hidden": flat(ht), "ce": ce.item(), "kl": kl.item(), "hidden": mse.item(), "loss": loss.item(),
            "dstudent": flat(S.grad.numpy()), "dstudent_hidden": flat(HS.grad.numpy())}


def main():
    rng = np.random.default_rng(16)
    cases = [case(rng, 0.5, 2.0, 0.0), case(rng, 0.5, 2.0, 1.0), case(rng, 0.9, 4.0, 0.25),
             case(rng, 0.0, 1.0, 2.0), case(rng, 1.0, 0.5, 0.0)]
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"torch": torch.__version__, "cases": cases}, f, indent=0)
    print(f"wrote {OUT} ({len(cases)} cases, torch {torch.__version__})")


if __name__ == "__main__":
    main()
