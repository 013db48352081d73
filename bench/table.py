#!/usr/bin/env python3
"""Joins bench JSON lines (bench_hpc, pytorch_bert.py) into one Markdown
table: per shape, hpc fp16 / fp32, PyTorch AMP / torch.compile / fp32 step
times (median ms), the speed-ups of hpc over each PyTorch mode, and peak
memory.  Missing runs show as '-'."""
import json
import sys


def main(path):
    rows = {}
    gpu = set()
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        rows.setdefault((r["B"], r["L"]), {})[r["impl"]] = r
        gpu.add(r.get("gpu", "?"))
    impls = [("hpc-fp16", "hpc fp16"), ("hpc-fp32", "hpc fp32"), ("pytorch-amp", "PyTorch AMP"),
             ("pytorch-compile", "torch.compile"), ("pytorch-fp32", "PyTorch fp32")]

    def ms(r, k):
        return "%.2f" % r[k]["median_ms"] if k in r else "-"

    def ratio(r, a, b):
        return "%.2fx" % (r[b]["median_ms"] / r[a]["median_ms"]) if a in r and b in r else "-"

    def mem(r, k):
        return "%.0f" % r[k]["peak_mib"] if k in r else "-"

    print("BERT-base training step (forward, backward, optimizer, loss scaler), median ms; GPU: %s"
          % ", ".join(sorted(gpu)))
    print()
    print("| B x L | " + " | ".join(n for _, n in impls)
          + " | AMP / hpc fp16 | compile / hpc fp16 | fp32 / hpc fp32 | peak MiB hpc fp16 / AMP / hpc fp32 / fp32 |")
    print("|---" * (len(impls) + 5) + "|")
    for (b, l) in sorted(rows, key=lambda k: (k[0] * k[1], k[0])):
        r = rows[(b, l)]
        cells = [ms(r, k) for k, _ in impls]
        cells += [ratio(r, "hpc-fp16", "pytorch-amp"), ratio(r, "hpc-fp16", "pytorch-compile"),
                  ratio(r, "hpc-fp32", "pytorch-fp32"),
                  " / ".join(mem(r, k) for k in ("hpc-fp16", "pytorch-amp", "hpc-fp32", "pytorch-fp32"))]
        print("| %d x %d | " % (b, l) + " | ".join(cells) + " |")
    skips = [(k, v["skipped"]) for r in rows.values() for k, v in r.items() if v.get("skipped")]
    if skips:
        print("\nhpc steps skipped by the loss scaler in the timed window: %s" % skips)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
