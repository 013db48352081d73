#!/usr/bin/env python3
"""PyTorch baselines for bench/: one BERT-base training step (HF
BertForSequenceClassification, 2 labels, dropout on, fused AdamW) per mode:

  amp      torch.autocast(fp16) + GradScaler, eager
  compile  the same with the model under torch.compile
  fp32     plain fp32 (TF32 off, as hpc --fp32)

Median step time from CUDA events after warm-up, and peak device memory.
Prints one JSON object per (mode, B, L) line, so bench/run.sh can join them
with hpc's numbers.  Random token ids (never zeros), random labels.
"""
import argparse
import json
import statistics
import sys

import torch
from transformers import BertConfig, BertForSequenceClassification


def one_config(mode, batch, seq_len, warmup, iters):
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = BertConfig(num_labels=2)  # bert-base-uncased sizes
    model = BertForSequenceClassification(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01, fused=True)
    scaler = torch.amp.GradScaler("cuda", enabled=(mode != "fp32"))
    ids = torch.randint(1000, cfg.vocab_size, (batch, seq_len), device="cuda")
    mask = torch.ones(batch, seq_len, dtype=torch.long, device="cuda")
    labels = torch.randint(0, 2, (batch,), device="cuda")

    forward = torch.compile(model) if mode == "compile" else model

    def step():
        with torch.autocast("cuda", dtype=torch.float16, enabled=(mode != "fp32")):
            loss = forward(input_ids=ids, attention_mask=mask, labels=labels).loss
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    peak = torch.cuda.max_memory_allocated()
    del model, opt
    torch.cuda.empty_cache()
    return {"impl": "pytorch-" + mode, "B": batch, "L": seq_len,
            "median_ms": statistics.median(times), "peak_mib": peak / 2**20,
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="amp,compile,fp32")
    ap.add_argument("--shapes", default="32x128,32x32,256x128", help="BxL,...")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    for shape in args.shapes.split(","):
        b, l = (int(x) for x in shape.split("x"))
        for mode in args.modes.split(","):
            print(json.dumps(one_config(mode, b, l, args.warmup, args.iters)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
