"""Makes tests/fixtures/bert_tiny/: a small random Hugging Face BertForSequenceClassification and the
numbers the C implementation must reproduce (layers/bert.c forward/backward, src trainer's AdamW).

Reference: transformers 4.40.2 models/bert/modeling_bert.py (eager attention, additive mask
(1 - mask) * finfo(float32).min after the 1/sqrt(d) scaling), torch.optim.AdamW.

Run with /opt/torchenv/bin/python (torch 1.13, transformers 4.40.2); CI never runs it, the outputs are
committed:
  config.json         HF config (2 layers, hidden 32, 2 heads, intermediate 37, 3 labels, dropout 0)
  model.safetensors   the weights, HF state-dict names (save_pretrained)
  expected.safetensors
      input_ids (3,11) I32, attention_mask (3,11) F32, token_type_ids (3,11) I32, labels (3) I32
      logits (3,3), loss (1)                   forward of the initial weights
      grad.<param name>                        d(mean CE loss)/d(param) for EVERY parameter
      adamw_losses (5)                         loss on the same batch before AdamW step k = 0..4
                                               (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay
                                               0.01 except biases and LayerNorm weights, no clipping,
                                               constant lr); adamw_losses[0] == loss
      after5.<param name>                      parameters after the 5 AdamW steps
Padding (attention_mask 0) positions carry id 0 = pad_token_id; unmasked ids are never 0, so the
padding_idx row's gradient is 0 in both implementations (the masked positions receive no gradient).
"""
import json
import os

import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForSequenceClassification

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "bert_tiny")


def main():
    torch.manual_seed(1234)
    cfg = BertConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=64,
        type_vocab_size=2,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        classifier_dropout=None,
        layer_norm_eps=1e-12,
        initializer_range=0.02,
        pad_token_id=0,
        num_labels=3,
        id2label={0: "neg", 1: "neu", 2: "pos"},
        label2id={"neg": 0, "neu": 1, "pos": 2},
        attn_implementation="eager",
    )
    model = BertForSequenceClassification(cfg)
    # Bigger-than-init weights so the test sees non-trivial activations: HF init (std 0.02) makes
    # every layer nearly the identity. Biases and LayerNorm affine parameters get random values too,
    # so their gradients and their use are checked.
    with torch.no_grad():
        g = torch.Generator().manual_seed(99)
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias") or "LayerNorm" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
        model.bert.embeddings.word_embeddings.weight[cfg.pad_token_id].zero_()
    model.train()  # dropout probabilities are 0, so train mode == eval mode numerically

    B, T = 3, 11
    lengths = [11, 7, 4]
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(1, cfg.vocab_size, (B, T), generator=gen)
    mask = torch.zeros(B, T)
    types = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = cfg.pad_token_id
        types[b, n // 2:n] = 1  # second segment
    labels = torch.tensor([2, 0, 1])

    out = model(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    out.loss.backward()
    exp = {
        "input_ids": ids.to(torch.int32),
        "attention_mask": mask.float(),
        "token_type_ids": types.to(torch.int32),
        "labels": labels.to(torch.int32),
        "logits": out.logits.detach().clone(),
        "loss": out.loss.detach().reshape(1).clone(),
    }
    for name, p in model.named_parameters():
        exp["grad." + name] = p.grad.detach().clone()

    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)

    # AdamW steps on the same batch, decay groups as the C trainer's parameter table.
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith("bias") or "LayerNorm.weight" in name else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.999), eps=1e-8)
    losses = []
    for _ in range(5):
        opt.zero_grad()
        o = model(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
        losses.append(o.loss.item())
        o.loss.backward()
        opt.step()
    exp["adamw_losses"] = torch.tensor(losses, dtype=torch.float32)
    for name, p in model.named_parameters():
        exp["after5." + name] = p.detach().clone()

    save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT, "expected.safetensors"),
              metadata={"format": "pt", "made_by": "tests/make_bert_fixture.py",
                        "transformers": "4.40.2"})
    print(json.dumps({"loss": out.loss.item(), "adamw_losses": losses}))


if __name__ == "__main__":
    main()
