#!/usr/bin/env python3
"""bench/finetune_quality.py: the Python half of bench/finetune_quality.sh.

Subcommands:

  seeds F16_DIR OUT N       one starting point per seed 0..N-1: OUT/seed-S/
                            holds model.safetensors (F32: the fp16 MiniLM
                            weights widened, names as
                            BertForSequenceClassification has them, and a
                            classifier 2 x hidden drawn from normal(0, 0.02)
                            with seed S, bias 0), config.json (architecture
                            BertForSequenceClassification, 2 labels),
                            vocab.txt and tokenizer_config.json.  Both hpc
                            (--init) and PyTorch (from_pretrained) read it.
                            Standard library only.
  torch-finetune DIR SEED [DATA [JOBS [STEPLOG]]] [--order hpc|torch]
                 [--precision amp|fp32]
                            fine-tunes DIR on CoLA (DATA, default data/cola)
                            with torch.autocast(fp16) and GradScaler in an
                            HF-Trainer-style loop (the recipe below) and
                            prints one JSON line: dev MCC, accuracy, dev
                            loss, skipped steps, seconds, real tokens
                            trained on; STEPLOG (optional): every step's
                            loss, lr, loss scale and gradient norm in the
                            fields of hpc's --log; and
                            JOBS (default 1): how many
                            such runs shared the GPU, so the table can leave
                            concurrent timings out (the numbers do not
                            depend on it: each run has its own process,
                            seed and generator).  Two controlled variants,
                            to tell what hpc's wider spread over seeds comes
                            from: --order hpc visits the rows in hpc's order
                            for SEED (hpc_order.py, the port of
                            runtime/data/loader.c's shuffle) instead of
                            torch.randperm's; --precision fp32 trains and
                            evaluates in plain f32 (no autocast, GradScaler
                            disabled: no scaling, no skipped steps).  The
                            line's impl names the variant: pytorch-amp,
                            pytorch-fp32, each with " (hpc order)".
  random-init OUT VOCAB [LAYERS HIDDEN HEADS FFN]
                            a BertForSequenceClassification of the given
                            shape (default BERT-base: 12 768 12 3072, 2
                            labels) with transformers' own random init
                            (torch seed 0), written to OUT with VOCAB as
                            vocab.txt (lower case): the shared starting
                            point of bench/workload.sh.  Needs torch and
                            transformers.
  torch-grad DIR BATCHES    one step on each batch of BATCHES (JSON lines
                            from grad_error --dump-batch), dropout off: the
                            relative error of AMP's and fp32's logits, loss
                            and gradients against fp64, averaged over the
                            batches, as grad_error measures hpc's; JSON lines.
  curves OUT [PLAN...]      the runs step by step: hpc's run logs
                            (OUT/hpc-PLAN-seedS.jsonl) beside PyTorch's step
                            logs (OUT/torch-steps-seedS.jsonl, written by
                            torch-finetune's STEPLOG) over the seeds both
                            have: per epoch the mean train loss, gradient
                            norm and share of clipped steps, the dev loss
                            and MCC (mean ± std over seeds), and whether the
                            two lr sequences are the same step for step.
  table RESULTS.jsonl       the markdown table for BENCHMARKS.md, with a
                            significance line per row against pytorch-amp
                            (hpc's rows, then PyTorch's variants): the
                            difference of the mean MCCs with its standard
                            error and the ratio of the stds; and the dev
                            loss after the last epoch (mean ± std) of every
                            run that recorded it (hpc's last eval,
                            PyTorch's dev_loss): a continuous measure of the
                            same spread.

The recipe, the same for both sides (hpc takes it from the imported model
file and the command line of finetune_quality.sh): AdamW lr 5e-5, betas
(0.9, 0.999), eps 1e-8, weight decay 0.01 except biases and LayerNorm
weights; linear schedule with warmup ceil(0.1 * steps); gradient clipping at
norm 1.0 (after unscaling); dynamic loss scale from 65536, halved on an
overflow (the step is skipped and the schedule does not advance, as
accelerate does under the HF Trainer), doubled after 2000 clean steps;
3 epochs of batch 32, reshuffled every epoch; dropout 0.1 (embeddings,
attention, hidden, classifier); rows truncated to 128 tokens, each batch
padded to its longest row; dev MCC after the last epoch.
"""
import json
import math
import os
import random
import shutil
import struct
import sys
import time

import hpc_order

LR, EPOCHS, BATCH, WARMUP, MAX_LEN, CLIP, WD = 5e-5, 3, 32, 0.1, 128, 1.0, 0.01
GROUPS = ("embeddings", "attn_qkv", "attn_out", "ffn_in", "ffn_out", "layernorm", "pooler", "classifier", "other")


def group_of(name):
    """The parameter groups of bench/grad_error.c, by Hugging Face name."""
    if "LayerNorm" in name or "layer_norm" in name or "ln_" in name:
        return "layernorm"
    for key, group in (("embeddings", "embeddings"), ("attention.self", "attn_qkv"),
                       ("attention.output", "attn_out"), ("intermediate", "ffn_in"),
                       ("output.dense", "ffn_out"), ("pooler", "pooler"), ("classifier", "classifier")):
        if key in name:
            return group
    return "other"


# ---- seeds: starting points (standard library only) ----------------------

def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return header, data


def f16_to_f32_bytes(raw):
    n = len(raw) // 2
    out = bytearray()
    chunk = 1 << 20
    for i in range(0, n, chunk):
        part = struct.unpack_from("<%de" % min(chunk, n - i), raw, 2 * i)
        out += struct.pack("<%df" % len(part), *part)
    return bytes(out)


def hf_name(name):
    """BertModel names -> BertForSequenceClassification names."""
    return name if name.startswith(("bert.", "classifier.")) else "bert." + name


def write_safetensors(path, tensors):
    """tensors: name -> (dtype, shape, bytes); written atomically."""
    header, offset = {}, 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in sorted(tensors):
            f.write(tensors[name][2])
    os.replace(path + ".tmp", path)


def cmd_seeds(f16_dir, out, n):
    header, data = read_safetensors(os.path.join(f16_dir, "model.safetensors"))
    base = {}
    for name, t in header.items():
        if name.endswith("position_ids"):   # a buffer some exports carry
            continue
        b, e = t["data_offsets"]
        raw = data[b:e]
        if t["dtype"] == "F16":
            raw = f16_to_f32_bytes(raw)
        elif t["dtype"] != "F32":
            sys.exit("seeds: %s is %s, want F16 or F32" % (name, t["dtype"]))
        base[hf_name(name)] = ("F32", t["shape"], raw)
    with open(os.path.join(f16_dir, "config.json")) as f:
        config = json.load(f)
    hidden = config["hidden_size"]
    config.update(architectures=["BertForSequenceClassification"], num_labels=2,
                  id2label={"0": "LABEL_0", "1": "LABEL_1"}, label2id={"LABEL_0": 0, "LABEL_1": 1})
    for s in range(n):
        d = os.path.join(out, "seed-%d" % s)
        os.makedirs(d, exist_ok=True)
        rng = random.Random(1000 + s)
        w = [rng.gauss(0.0, 0.02) for _ in range(2 * hidden)]
        tensors = dict(base)
        tensors["classifier.weight"] = ("F32", [2, hidden], struct.pack("<%df" % len(w), *w))
        tensors["classifier.bias"] = ("F32", [2], struct.pack("<2f", 0.0, 0.0))
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        for name in ("vocab.txt", "tokenizer_config.json"):
            shutil.copyfile(os.path.join(f16_dir, name), os.path.join(d, name))
    print("seeds: %d starting points in %s (classifier 2 x %d per seed)" % (n, out, hidden))


# ---- PyTorch ---------------------------------------------------------------

def read_cola(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            cols = line.rstrip("\n").split("\t")
            if len(cols) >= 4:
                rows.append((cols[3], int(cols[1])))
    return rows


def encode(tok, rows):
    enc = tok([r[0] for r in rows], truncation=True, max_length=MAX_LEN)
    return [(ids, tt, r[1]) for ids, tt, r in zip(enc["input_ids"], enc["token_type_ids"], rows)]


def collate(torch, items, device):
    L = max(len(i[0]) for i in items)
    ids = torch.zeros(len(items), L, dtype=torch.long)
    tt = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for r, (a, t, _) in enumerate(items):
        ids[r, :len(a)] = torch.tensor(a)
        tt[r, :len(t)] = torch.tensor(t)
        mask[r, :len(a)] = 1
    labels = torch.tensor([i[2] for i in items])
    return {k: v.to(device) for k, v in dict(input_ids=ids, token_type_ids=tt, attention_mask=mask,
                                             labels=labels).items()}


def mcc(pred, gold):
    tp = sum(p == 1 and g == 1 for p, g in zip(pred, gold))
    tn = sum(p == 0 and g == 0 for p, g in zip(pred, gold))
    fp = sum(p == 1 and g == 0 for p, g in zip(pred, gold))
    fn = sum(p == 0 and g == 1 for p, g in zip(pred, gold))
    den = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / den if den else 0.0


def torch_impl(order, precision):
    """The impl name of a torch-finetune variant (the table's row)."""
    return "pytorch-%s%s" % (precision, " (hpc order)" if order == "hpc" else "")


def cmd_torch_finetune(init_dir, seed, data_dir, jobs=1, steplog=None, order="torch", precision="amp"):
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(seed)
    dev = torch.device("cuda")
    tok = AutoTokenizer.from_pretrained(init_dir)   # vocab.txt + tokenizer_config.json (lower case)
    train = encode(tok, read_cola(os.path.join(data_dir, "train.tsv")))
    dev_rows = encode(tok, read_cola(os.path.join(data_dir, "dev.tsv")))
    model = BertForSequenceClassification.from_pretrained(init_dir).to(dev).train()
    decay = [p for n, p in model.named_parameters() if not (n.endswith(".bias") or "LayerNorm" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith(".bias") or "LayerNorm" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.999), eps=1e-8, fused=True)
    steps_per_epoch = math.ceil(len(train) / BATCH)
    total = EPOCHS * steps_per_epoch
    warmup = math.ceil(WARMUP * total)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: s / max(1, warmup) if s < warmup else max(0.0, (total - s) / max(1, total - warmup)))
    amp = precision == "amp"
    # disabled (fp32), scale/unscale_/update are no-ops and step() is
    # opt.step(): clipping sees the true gradients, nothing is skipped
    scaler = torch.amp.GradScaler("cuda", init_scale=65536.0, growth_interval=2000, enabled=amp)
    gen = torch.Generator().manual_seed(seed)
    plan = None
    if order == "hpc":
        # hpc's batches for this seed, in hpc's order; randperm is not drawn,
        # so dropout (the global generator) is seeded as in the default run
        plan = hpc_order.batch_plan(len(train), BATCH, EPOCHS, seed)
        every_row = all(sorted(r for b in plan[e * steps_per_epoch:(e + 1) * steps_per_epoch] for r in b)
                        == list(range(len(train))) for e in range(EPOCHS))
        if len(plan) != total or not every_row:
            sys.exit("torch-finetune: hpc's order has %d steps for %d (%d x %d), or an epoch misses a row"
                     % (len(plan), total, steps_per_epoch, EPOCHS))
    skipped = tokens = 0
    # per step, for the step log: kept on the device and read once at the
    # end, so logging adds no synchronisation (get_scale() already syncs)
    losses, norms, lrs, scales, epochs_of, skips = [], [], [], [], [], []
    torch.cuda.synchronize()
    t0 = time.time()
    for epoch in range(EPOCHS):
        if plan is not None:
            batches = plan[epoch * steps_per_epoch:(epoch + 1) * steps_per_epoch]
        else:
            perm = torch.randperm(len(train), generator=gen).tolist()
            batches = [perm[b * BATCH:(b + 1) * BATCH] for b in range(steps_per_epoch)]
        for idx in batches:
            rows = [train[i] for i in idx]
            tokens += sum(len(r[0]) for r in rows)
            batch = collate(torch, rows, dev)
            with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                loss = model(**batch).loss
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            before = scaler.get_scale()
            lrs.append(opt.param_groups[0]["lr"])   # the lr this step applies
            scales.append(before)
            losses.append(loss.detach().float())
            norms.append(norm.detach().float())
            epochs_of.append(epoch)
            scaler.step(opt)
            scaler.update()
            skips.append(scaler.get_scale() < before)
            if skips[-1]:
                skipped += 1          # the step was skipped: the schedule waits too
            else:
                sched.step()
            opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    train_s = time.time() - t0
    model.eval()
    pred, dev_loss = [], 0.0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, enabled=amp):
        for b in range(0, len(dev_rows), 128):
            batch = collate(torch, dev_rows[b:b + 128], dev)
            labels = batch.pop("labels")
            logits = model(**batch).logits
            dev_loss += float(torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum"))
            pred += logits.argmax(-1).tolist()
    gold = [r[2] for r in dev_rows]
    acc = sum(p == g for p, g in zip(pred, gold)) / len(gold)
    dev_loss /= len(dev_rows)
    if steplog:
        write_steplog(steplog, torch.stack(losses).tolist(), torch.stack(norms).tolist(), lrs, scales, epochs_of,
                      skips, mcc(pred, gold), dev_loss, total)
    print(json.dumps({"kind": "finetune", "impl": torch_impl(order, precision), "seed": seed,
                      "mcc": mcc(pred, gold), "accuracy": acc, "dev_loss": dev_loss, "skipped": skipped,
                      "steps": total, "train_s": train_s, "tokens": tokens, "jobs": jobs}))


def write_steplog(path, losses, norms, lrs, scales, epochs_of, skips, dev_mcc, dev_loss, total):
    """The PyTorch run as JSON lines in the fields of hpc's --log (step:
    loss, lr, loss_scale, grad_norm before clipping, skipped_total; one eval
    after the last step), so `curves` reads both the same way."""
    lines, total_skips = [], 0
    for k in range(len(losses)):
        total_skips += bool(skips[k])
        lines.append(json.dumps({"event": "step", "step": k + 1, "total_steps": total, "epoch": epochs_of[k],
                                 "loss": losses[k], "lr": lrs[k], "loss_scale": scales[k],
                                 "grad_norm": norms[k] if math.isfinite(norms[k]) else None,
                                 "skipped_total": total_skips}))
    lines.append(json.dumps({"event": "eval", "step": len(losses), "metric": "mcc", "value": dev_mcc,
                             "loss": dev_loss}))
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)


def cmd_random_init(out, vocab, shape):
    import torch
    from transformers import BertConfig, BertForSequenceClassification
    layers, hidden, heads, ffn = shape
    torch.manual_seed(0)
    config = BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                        intermediate_size=ffn, num_labels=2)
    model = BertForSequenceClassification(config)
    model.save_pretrained(out, safe_serialization=True)
    shutil.copyfile(vocab, os.path.join(out, "vocab.txt"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}, f)
    n = sum(p.numel() for p in model.parameters())
    print("random-init: %d-layer BERT, hidden %d, %d parameters, in %s" % (layers, hidden, n, out))


def rel(x, r):
    return float((x.double() - r).norm() / r.norm())


def one_step(torch, model, batch, amp, scale):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
        out = model(**batch)
    (out.loss.double() * scale).backward()
    grads = {n: p.grad.double() / scale for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach().double(), float(out.loss), grads


def cmd_torch_grad(init_dir, batches_path, scale):
    import torch
    from transformers import BertForSequenceClassification
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    batches = []
    with open(batches_path) as f:
        for line in f:
            b = json.loads(line)
            batches.append({k: torch.tensor(v, device=dev) for k, v in b.items()})
    m64 = BertForSequenceClassification.from_pretrained(init_dir).to(dev, dtype=torch.float64).eval()
    m32 = BertForSequenceClassification.from_pretrained(init_dir).to(dev, dtype=torch.float32).eval()
    sums = {"pytorch-amp": None, "pytorch-fp32": None}
    ref_losses = []
    for batch in batches:
        lg64, loss64, g64 = one_step(torch, m64, batch, False, 1.0)
        ref_losses.append(loss64)
        for impl, amp, s in (("pytorch-amp", True, scale), ("pytorch-fp32", False, 1.0)):
            lg, loss, g = one_step(torch, m32, batch, amp, s)
            num = {k: 0.0 for k in GROUPS}
            den = {k: 0.0 for k in GROUPS}
            for n, ref in g64.items():
                k = group_of(n)
                num[k] += float((g[n] - ref).pow(2).sum())
                den[k] += float(ref.pow(2).sum())
            e = {"logits": rel(lg, lg64), "loss": abs(loss - loss64) / abs(loss64),
                 "grad": math.sqrt(sum(num.values()) / sum(den.values())),
                 "groups": {k: math.sqrt(num[k] / den[k]) for k in GROUPS if den[k] > 0}}
            acc = sums[impl]
            if acc is None:
                sums[impl] = e
            else:
                for k in ("logits", "loss", "grad"):
                    acc[k] += e[k]
                for k, v in e["groups"].items():
                    acc["groups"][k] += v
    n = len(batches)
    for impl, e in sums.items():
        out = {"kind": "grad", "impl": impl, "device": "cuda", "batches": n,
               "loss_scale": scale if impl == "pytorch-amp" else 1.0,
               "logits": e["logits"] / n, "loss": e["loss"] / n, "grad": e["grad"] / n,
               "groups": {k: v / n for k, v in e["groups"].items()},
               "ref_loss": ref_losses[0]}
        print(json.dumps(out))


# ---- curves: the runs step by step ------------------------------------------

def read_runlog(path):
    """Steps and evals of one run log (hpc --log, or write_steplog)."""
    steps, evals = [], []
    with open(path) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            e = json.loads(line)
            if e.get("event") == "step":
                steps.append(e)
            elif e.get("event") == "eval":
                evals.append(e)
    return steps, evals


def run_curves(steps, evals):
    """Per epoch: the mean train loss and grad norm of its applied steps and
    the share of steps that clip (norm above CLIP); the run's lr sequence;
    the last eval's MCC and dev loss."""
    out = {"epochs": {}, "lr": [s["lr"] for s in steps], "skipped": steps[-1]["skipped_total"] if steps else 0,
           "steps": len(steps), "first50": None}
    prev = 0
    for e in sorted({s["epoch"] for s in steps}):
        es = []
        for s in steps:
            if s["epoch"] == e:
                skipped = s["skipped_total"] > prev
                prev = s["skipped_total"]
                if not skipped and s.get("grad_norm") is not None:
                    es.append(s)
        if es:
            out["epochs"][e] = (sum(s["loss"] for s in es) / len(es), sum(s["grad_norm"] for s in es) / len(es),
                                sum(s["grad_norm"] > CLIP for s in es) / len(es))
    head = [s["loss"] for s in steps[:50]]
    out["first50"] = sum(head) / len(head) if head else None
    if evals:
        out["mcc"], out["dev_loss"] = evals[-1]["value"], evals[-1].get("loss")
    return out


def lr_agreement(a, b):
    """Largest relative difference of two lr sequences (None if lengths differ)."""
    if len(a) != len(b):
        return None
    worst = 0.0
    for x, y in zip(a, b):
        d = abs(x - y)
        if d:
            worst = max(worst, d / max(abs(x), abs(y)))
    return worst


def cmd_curves(out_dir, plans):
    """The markdown table of `curves OUT [PLAN...]`: hpc's runs (OUT/hpc-PLAN-
    seedS.jsonl, PLAN default "default") beside PyTorch's (OUT/torch-steps-
    seedS.jsonl) over the seeds both have."""
    import glob
    import re
    plans = plans or ["default"]
    impls = [("hpc " + p, os.path.join(out_dir, "hpc-%s-seed*.jsonl" % p)) for p in plans]
    impls.append(("pytorch-amp", os.path.join(out_dir, "torch-steps-seed*.jsonl")))
    runs = {}
    for name, pattern in impls:
        for path in glob.glob(pattern):
            seed = int(re.search(r"seed(\d+)\.jsonl$", path).group(1))
            steps, evals = read_runlog(path)
            if steps:
                runs.setdefault(name, {})[seed] = run_curves(steps, evals)
    if not runs:
        sys.exit("curves: no run logs in %s" % out_dir)
    seeds = sorted(set.intersection(*(set(r) for r in runs.values())))
    print("Step by step, %d seeds both sides ran (%s): per epoch the mean over its applied steps, then "
          "mean ± std over the seeds; clip = share of steps whose gradient norm (before clipping) is above %g."
          % (len(seeds), ", ".join(map(str, seeds)) or "none", CLIP))
    print()
    print("| run | steps | skipped | loss steps 1-50 | epoch | train loss | grad norm | clip | dev loss | dev MCC |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def ms(xs, fmt="%.4f ± %.4f"):
        xs = [x for x in xs if x is not None]
        if not xs:
            return "-"
        m, s = mean_std(xs)
        return fmt % ((m, s) if fmt.count("%") == 2 else m)
    for name, by_seed in runs.items():
        rs = [by_seed[s] for s in seeds]
        if not rs:
            continue
        for e in sorted(rs[0]["epochs"]):
            first = e == min(rs[0]["epochs"])
            cells = [ms([r["epochs"][e][k] for r in rs if e in r["epochs"]]) for k in range(3)]
            print("| %s | %s | %s | %s | %d | %s | %s | %s | %s | %s |"
                  % (name if first else "", ms([r["steps"] for r in rs], "%.0f") if first else "",
                     ms([r["skipped"] for r in rs], "%.2f") if first else "",
                     ms([r["first50"] for r in rs]) if first else "",
                     e, cells[0], cells[1], cells[2], ms([r.get("dev_loss") for r in rs]) if first else "",
                     ms([r.get("mcc") for r in rs]) if first else ""))
    torch_runs = runs.get("pytorch-amp", {})
    for name, by_seed in runs.items():
        if name == "pytorch-amp" or not torch_runs:
            continue
        worst = [lr_agreement(by_seed[s]["lr"], torch_runs[s]["lr"]) for s in seeds
                 if by_seed[s]["skipped"] == 0 and torch_runs[s]["skipped"] == 0]
        if worst and all(w is not None for w in worst):
            print()
            print("lr of every step, %s against pytorch-amp (%d seeds without skipped steps): largest relative "
                  "difference %.2e (%s)" % (name, len(worst), max(worst),
                                            "the same schedule" if max(worst) < 1e-6 else "SCHEDULES DIFFER"))
        elif worst:
            print()
            print("lr of every step, %s against pytorch-amp: the step counts differ" % name)


# ---- the table ---------------------------------------------------------------

def mean_std(xs):
    m = sum(xs) / len(xs)
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, s


def run_seconds(rs):
    """Mean seconds per run over the runs that had the GPU to themselves
    (jobs 1); when every run shared it, the concurrent mean, marked."""
    alone = [r["train_s"] for r in rs if r.get("train_s") is not None and r.get("jobs", 1) == 1]
    if alone:
        return "%.1f" % (sum(alone) / len(alone))
    shared = [(r["train_s"], r["jobs"]) for r in rs if r.get("train_s") is not None]
    if not shared:
        return "-"
    return "(%.1f, %s at once)" % (sum(t for t, _ in shared) / len(shared),
                                   "/".join(sorted({str(j) for _, j in shared})))


def std_ratio(xs, ref):
    """std(xs) / std(ref) with its standard error by the delta method: the
    relative errors s / sqrt(2 (n - 1)) of the two stds add in quadrature."""
    s, sa = mean_std(xs)[1], mean_std(ref)[1]
    if sa == 0:
        return "-"
    r = s / sa
    return "%.2f ± %.2f" % (r, r * math.sqrt(1 / (2 * (len(xs) - 1)) + 1 / (2 * (len(ref) - 1))))


def significance(impl, xs, ref):
    """The bar (mean within 1 point, spread no wider) and whether the
    difference of means stands out of the seed noise: its standard error
    sqrt(s1^2/n1 + s2^2/n2) and the ratio; each std with its own standard
    error s / sqrt(2 (n - 1)) (normal approximation), and their ratio, so a
    "wider" spread can be told from noise too."""
    m, s = mean_std(xs)
    ma, sa = mean_std(ref)
    d = m - ma
    se = math.sqrt(s * s / len(xs) + sa * sa / len(ref))
    z = abs(d) / se if se > 0 else float("inf")
    word = "within 2 standard errors: not distinguishable from seed noise" if z < 2 else \
        "%.1f standard errors: more than seed noise" % z
    sse, sase = s / math.sqrt(2 * (len(xs) - 1)), sa / math.sqrt(2 * (len(ref) - 1))
    return ("%s against pytorch-amp: mean MCC %+.3f ± %.3f (difference ± its standard error; %.1f SE, %s); "
            "within 1 point: %s; std %.3f ± %.3f vs %.3f ± %.3f (no wider: %s; ratio %s)"
            % (impl, d, se, z, word, "yes" if abs(d) <= 0.01 else "no", s, sse, sa, sase,
               "yes" if s <= sa else "no", std_ratio(xs, ref)))


def cmd_table(path):
    rows = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
    fine, grads, speed = {}, [], []
    by_seed, timed = {}, {}   # a seed run twice (files merged) counts once, its last line; every time counts
    for r in rows:
        if r.get("kind") == "finetune":
            by_seed.setdefault(r["impl"], {})[r["seed"]] = r
            timed.setdefault(r["impl"], []).append(r)
        elif r.get("kind") == "speed":
            speed.append(r)
        elif r.get("kind") == "grad" or "grad" in r:
            grads.append(r)
    dropped = sum(len(timed[i]) - len(by_seed[i]) for i in by_seed)
    fine = {impl: [d[k] for k in sorted(d)] for impl, d in by_seed.items()}
    print("| run | seeds | CoLA dev MCC (mean ± std) | min .. max | skipped steps (mean) | s per run (mean) |")
    print("|---|---:|---:|---:|---:|---:|")
    for impl, rs in fine.items():
        m, s = mean_std([r["mcc"] for r in rs])
        lo, hi = min(r["mcc"] for r in rs), max(r["mcc"] for r in rs)
        sk = sum(r.get("skipped", 0) for r in rs) / len(rs)
        print("| %s | %d | %.3f ± %.3f | %.3f .. %.3f | %.1f | %s |"
              % (impl, len(rs), m, s, lo, hi, sk, run_seconds(timed[impl])))
    amp = fine.get("pytorch-amp")
    if fine:
        print()
        print("s per run: hpc the whole `hpc run` (NVRTC or cache, 3 dev evaluations, training); PyTorch the "
              "training loop only, from runs that had the GPU to themselves (JOBS=1; in parentheses: the mean "
              "of runs that shared it, which says nothing about speed).")
        if dropped:
            print("(%d lines repeated a run's seed: the MCC columns count each seed once, its last line)" % dropped)
    # hpc's rows, then PyTorch's controlled variants (hpc's order, fp32):
    # what each changes of PyTorch AMP's mean and spread
    others = [i for i in fine if i != "pytorch-amp"]
    others = [i for i in others if not i.startswith("pytorch-")] + [i for i in others if i.startswith("pytorch-")]
    for impl in others:
        rs = fine[impl]
        if amp and len(rs) > 1 and len(amp) > 1:
            print(significance(impl, [r["mcc"] for r in rs], [r["mcc"] for r in amp]))
    # the dev loss after the last epoch, a continuous measure of the same
    # spread (lines from before it was recorded have none)
    losses = {impl: [r["dev_loss"] for r in rs if r.get("dev_loss") is not None] for impl, rs in fine.items()}
    ref = losses.get("pytorch-amp", [])
    if any(losses.values()):
        print()
        for impl, v in losses.items():
            if not v:
                continue
            m, s = mean_std(v)
            ratio = "; std ratio to pytorch-amp's %s" % std_ratio(v, ref) \
                if impl != "pytorch-amp" and len(v) > 1 and len(ref) > 1 else ""
            print("dev loss after the last epoch, %s: %.4f ± %.4f over %d seed%s%s"
                  % (impl, m, s, len(v), "s" if len(v) > 1 else "", ratio))
    if grads:
        print()
        print("| one step vs fp64 (dropout off) | batches | logits | loss | gradient | embeddings | attn qkv "
              "| ffn | layernorm | classifier | fp64 loss |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for g in grads:
            name = g["impl"]
            if name == "hpc":
                name = "hpc %s %s (%s)" % (g.get("device"), g.get("policy"), g.get("keep"))
            gr = g.get("groups", {})
            ffn = gr.get("ffn_in", float("nan")), gr.get("ffn_out", float("nan"))
            print("| %s | %s | %.2e | %.2e | %.2e | %.2e | %.2e | %.2e / %.2e | %.2e | %.2e | %s |"
                  % (name, g.get("batches", "-"), g["logits"], g["loss"], g["grad"],
                     gr.get("embeddings", float("nan")), gr.get("attn_qkv", float("nan")), ffn[0], ffn[1],
                     gr.get("layernorm", float("nan")), gr.get("classifier", float("nan")),
                     "%.9f" % g["ref_loss"] if "ref_loss" in g else "-"))


def print_speed(speed):
    print()
    print("| BERT-base fp16 step (bench_hpc) | B x L | median ms | peak MiB |")
    print("|---|---|---:|---:|")
    for r in speed:
        print("| hpc fp16 (%s) | %s x %s | %.2f | %.0f |" % (r["plan"], r["B"], r["L"], r["median_ms"], r["peak_mib"]))


def take_flags(a, choices):
    """Removes `--NAME VALUE` pairs (or --NAME=VALUE) from a, wherever they
    stand, so the positional arguments keep their places; name -> value."""
    out, rest = {}, []
    it = iter(a)
    for w in it:
        name, eq, value = w.partition("=")
        if name[2:] in choices and name.startswith("--"):
            value = value if eq else next(it, None)
            if value not in choices[name[2:]]:
                sys.exit("%s: expected one of %s, got %s" % (name, "|".join(choices[name[2:]]), value))
            out[name[2:]] = value
        else:
            rest.append(w)
    return out, rest


def main():
    a = sys.argv[1:]
    flags = {}
    if a[:1] == ["torch-finetune"]:
        flags, a = take_flags(a, {"order": ("hpc", "torch"), "precision": ("amp", "fp32")})
    if a[:1] == ["seeds"] and len(a) == 4:
        cmd_seeds(a[1], a[2], int(a[3]))
    elif a[:1] == ["torch-finetune"] and len(a) in (3, 4, 5, 6):
        cmd_torch_finetune(a[1], int(a[2]), a[3] if len(a) >= 4 else "data/cola", int(a[4]) if len(a) >= 5 else 1,
                           a[5] if len(a) == 6 else None, **flags)
    elif a[:1] == ["curves"] and len(a) >= 2:
        cmd_curves(a[1], a[2:])
    elif a[:1] == ["random-init"] and len(a) in (3, 7):
        cmd_random_init(a[1], a[2], [int(x) for x in a[3:7]] if len(a) == 7 else [12, 768, 12, 3072])
    elif a[:1] == ["torch-grad"] and len(a) in (3, 4):
        cmd_torch_grad(a[1], a[2], float(a[3]) if len(a) == 4 else 65536.0)
    elif a[:1] == ["table"] and len(a) == 2:
        cmd_table(a[1])
        speed = [json.loads(l) for l in open(a[1]) if '"kind": "speed"' in l]
        if speed:
            print_speed(speed)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
