"""Makes tests/fixtures/qa_tiny/: a small random Hugging Face BertForQuestionAnswering and the numbers
the C implementation must reproduce (layers/bert.c's QA head and autograd's span cross-entropy).

Reference: transformers models/bert/modeling_bert.py BertForQuestionAnswering (BertModel without the
pooler, qa_outputs Linear(hidden, 2) on every token, logits.split into start and end, positions
clamped to [0, T] with T the ignored index of CrossEntropyLoss, loss = (start + end) / 2).

Run once with a Python that has torch and transformers (here /work/torchvenv/bin/python); CI never
runs it, the outputs are committed:
  config.json, model.safetensors   save_pretrained of the model (2 layers, hidden 32, 2 heads,
                                   intermediate 37, dropout 0)
  expected.safetensors
      input_ids (4,13) I32, attention_mask (4,13) F32, token_type_ids (4,13) I32
      start_positions (4) I32, end_positions (4) I32   (one end position beyond T: ignored)
      start_logits (4,13), end_logits (4,13), loss (1)
      grad.<param name>                                  d(loss)/d(param) for EVERY parameter
"""
import json
import os

import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForQuestionAnswering

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "qa_tiny")


def main():
    torch.manual_seed(4321)
    cfg = BertConfig(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=32,
        type_vocab_size=2,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-12,
        initializer_range=0.02,
        pad_token_id=0,
        attn_implementation="eager",
    )
    model = BertForQuestionAnswering(cfg)
    # Larger-than-init weights so every layer matters (see tests/make_bert_fixture.py).
    with torch.no_grad():
        g = torch.Generator().manual_seed(17)
        for name, p in model.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias") or "LayerNorm" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
        model.bert.embeddings.word_embeddings.weight[cfg.pad_token_id].zero_()
    model.train()  # dropout 0: train mode equals eval mode numerically

    B, T = 4, 13
    lengths = [13, 9, 6, 11]
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, cfg.vocab_size, (B, T), generator=gen)
    mask = torch.zeros(B, T)
    types = torch.zeros(B, T, dtype=torch.long)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        ids[b, n:] = cfg.pad_token_id
        types[b, n // 2:n] = 1
    start = torch.tensor([7, 0, 3, 5])
    end = torch.tensor([9, 0, 40, 6])  # 40 > T: clamped to T, ignored by the end loss

    out = model(input_ids=ids, attention_mask=mask, token_type_ids=types, start_positions=start,
                end_positions=end)
    out.loss.backward()
    exp = {
        "input_ids": ids.to(torch.int32),
        "attention_mask": mask.float(),
        "token_type_ids": types.to(torch.int32),
        "start_positions": start.to(torch.int32),
        "end_positions": end.to(torch.int32),
        "start_logits": out.start_logits.detach().clone(),
        "end_logits": out.end_logits.detach().clone(),
        "loss": out.loss.detach().reshape(1).clone(),
    }
    for name, p in model.named_parameters():
        exp["grad." + name] = p.grad.detach().clone()

    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    import transformers
    save_file({k: v.contiguous() for k, v in exp.items()}, os.path.join(OUT, "expected.safetensors"),
              metadata={"format": "pt", "made_by": "tests/make_qa_fixture.py",
                        "transformers": transformers.__version__, "torch": torch.__version__})
    print(json.dumps({"loss": out.loss.item(), "params": sorted(n for n, _ in model.named_parameters())[-4:]}))


if __name__ == "__main__":
    main()
