"""PyTorch peer for the training-speed benchmark: times fp32 training steps (forward, backward,
AdamW) of Hugging Face BertForSequenceClassification on a fixed random batch, optionally with
fake quantization at the ORT scheme's activation points (--qat), in bf16 autocast (--bf16), or only the
evaluation forward without autograd (--infer), and prints one JSON line: the median wall and process-CPU
milliseconds per step (the CPU time is the fairer figure on a machine shared with other jobs).

Run by bench/bench_train.py in the same process tree as bertqat's side; needs PyTorch and
transformers (developer machines only, never CI): any Python with both (bench_train.py's --torch-python)."""
import argparse
import json
import resource
import time

import torch
from transformers import BertConfig, BertForSequenceClassification


def build(args):
    if args.model:
        cfg = BertConfig.from_pretrained(args.model, num_labels=2)
        model = BertForSequenceClassification.from_pretrained(args.model, config=cfg)
    else:  # BERT-base shape, random weights
        cfg = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                         intermediate_size=3072, num_labels=2)
        model = BertForSequenceClassification(cfg)
    return cfg, model


def blas_info():
    cfg = torch.__config__.show()
    blas = next((l.split("BLAS_INFO=")[1].split(",")[0] for l in cfg.splitlines() if "BLAS_INFO=" in l), "?")
    cap = next((l.split(":", 1)[1].strip() for l in cfg.splitlines() if "CPU capability usage" in l), "?")
    return f"torch {torch.__version__}, BLAS {blas}, CPU capability {cap}, oneDNN {torch.backends.mkldnn.is_available()}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="", help="HF model dir; empty: random BERT-base shape")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--qat", action="store_true", help="PyTorch eager QAT (torch.ao.quantization) on Linear layers")
    ap.add_argument("--bf16", action="store_true", help="mixed precision: forward under torch.autocast('cpu', bfloat16)")
    ap.add_argument("--infer", action="store_true", help="evaluation forward only (model.eval(), torch.no_grad())")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg, model = build(args)
    if args.qat:
        # Eager-mode QAT as ONNX Runtime's bert_imdb_finetune_qat example does it: fbgemm QAT qconfig
        # on the encoder, classifier and pooler left in fp32.
        model.qconfig = torch.ao.quantization.get_default_qat_qconfig("fbgemm")
        model.classifier.qconfig = None
        model.bert.pooler.qconfig = None
        model.bert.embeddings.qconfig = None
        model.train()  # from_pretrained returns eval mode; prepare_qat wants training mode
        torch.ao.quantization.prepare_qat(model, inplace=True)
    model.train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, cfg.vocab_size, (args.batch, args.seq), generator=g)
    mask = torch.ones(args.batch, args.seq, dtype=torch.long)
    labels = torch.randint(0, 2, (args.batch,), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    times, ctimes = [], []
    if args.infer:
        model.eval()
    for i in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            if args.infer:
                with torch.no_grad():
                    out = model(input_ids=ids, attention_mask=mask, labels=labels)
            else:
                out = model(input_ids=ids, attention_mask=mask, labels=labels)
        if not args.infer:
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        dt, cdt = time.perf_counter() - t0, time.process_time() - c0
        if i >= args.warmup:
            times.append(dt)
            ctimes.append(cdt)
    ms = 1000.0 * sorted(times)[len(times) // 2]
    print(json.dumps({
        "peer": "pytorch " + torch.__version__ + (" eager QAT" if args.qat else "") + (" bf16 autocast" if args.bf16 else ""),
        "batch": args.batch, "seq": args.seq, "threads": args.threads, "mode": "infer" if args.infer else "train",
        "ms_per_step": ms, "cpu_ms_per_step": 1000.0 * sorted(ctimes)[len(ctimes) // 2], "tokens_per_s": args.batch * args.seq / (ms / 1000.0),
        "examples_per_s": args.batch / (ms / 1000.0),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "loss": float(out.loss),
        "blas": blas_info(),
    }))


if __name__ == "__main__":
    main()
