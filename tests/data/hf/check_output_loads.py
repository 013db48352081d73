# Checks a folder written by `hpc run ... --output DIR` against transformers
# (not part of `make test`: it needs torch and transformers; no network).
#
#   1. AutoModelForSequenceClassification.from_pretrained(DIR) and
#      AutoTokenizer.from_pretrained(DIR) load it, with the architecture,
#      num_labels and every tensor (no "newly initialized" weights);
#   2. for a few sentences, transformers' token ids equal `hpc tokenize`'s
#      (DIR/vocab.txt, DIR's casing);
#   3. transformers' logits (eval mode, f32) equal hpc's cpu forward pass on
#      the same ids (tests/data/hf/hf_forward.c over `hpc import DIR`) to a
#      relative error below 1e-4;
#   4. `hpc run --init DIR` (cpu, one step with lr 1e-30, so the weights
#      stay DIR's) predicts, through --predict, the same class as the
#      argmax of transformers' logits for every sentence.
# It prints one line per check and exits 1 if any fails.
#
# Usage (from the repository root, with bin/hpc and build/hf/hf_forward
# built: `make bin/hpc build/hf/hf_forward`):
#   python3 tests/data/hf/check_output_loads.py DIR [bin/hpc] [build/hf/hf_forward]
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers as T

OUT = sys.argv[1]
HPC = sys.argv[2] if len(sys.argv) > 2 else "bin/hpc"
FORWARD = sys.argv[3] if len(sys.argv) > 3 else "build/hf/hf_forward"
SENTENCES = [
    "The cat sat on the mat.",
    "Sat cat the mat on the.",
    "Who always drinks milk?",
    "John seems that Mary left.",
    "Héllo, wörld: ünïcode and punctuation!",
    "The more you read, the more you know.",
]

failures = 0


def check(ok, what):
    global failures
    print(("ok    " if ok else "FAIL  ") + what)
    failures += 0 if ok else 1


def rel_err(a, b):
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return float((a - b).norm() / max(b.norm(), 1e-30))


# 1. transformers loads it, with every tensor
model, info = T.AutoModelForSequenceClassification.from_pretrained(OUT, local_files_only=True,
                                                                   output_loading_info=True)
model.eval()
tok = T.AutoTokenizer.from_pretrained(OUT, local_files_only=True)
cfg = json.load(open(os.path.join(OUT, "config.json")))
check(type(model).__name__ == cfg["architectures"][0], f"loads as {type(model).__name__}")
check(model.config.num_labels == cfg["num_labels"], f"num_labels {model.config.num_labels}")
check(not info["missing_keys"], f"no missing tensors {sorted(info['missing_keys'])[:4]}")
check(not info["unexpected_keys"], f"no unexpected tensors {sorted(info['unexpected_keys'])[:4]}")
lower = bool(json.load(open(os.path.join(OUT, "tokenizer_config.json")))["do_lower_case"])

work = tempfile.mkdtemp(prefix="hpc-check-output-")
model_file = os.path.join(work, "out.model")
subprocess.run([HPC, "import", OUT, "-o", model_file], check=True, stdout=subprocess.DEVNULL)

torch_pred = []
for s in SENTENCES:
    enc = tok(s, return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    # 2. the same token ids
    args = [HPC, "tokenize", "--vocab", os.path.join(OUT, "vocab.txt"), "--ids", s] + ([] if lower else ["--cased"])
    hpc_ids = [int(x) for x in subprocess.run(args, check=True, capture_output=True, text=True).stdout.split()]
    check(hpc_ids == ids, f"token ids of {s!r}")
    # 3. the same logits
    with torch.no_grad():
        ref = model(**enc).logits[0].double().tolist()
    out = subprocess.run([FORWARD, cfg["model_type"], model_file, os.path.join(OUT, "model.safetensors"),
                          ",".join(map(str, ids))], check=True, capture_output=True, text=True).stdout
    got = [float(x) for x in out.split()]
    err = rel_err(got, ref)
    check(len(got) == len(ref) and err < 1e-4, f"logits of {s!r}: hpc {got} transformers {ref} rel err {err:.2e}")
    torch_pred.append(max(range(len(ref)), key=lambda c: ref[c]))

# 4. `hpc run --init DIR` predicts the same classes (CoLA layout: no header)
data = os.path.join(work, "data")
os.makedirs(data)
with open(os.path.join(data, "train.tsv"), "w") as f:
    for i, s in enumerate(SENTENCES):
        f.write(f"chk\t{i % 2}\t\t{s}\n")
with open(os.path.join(data, "dev.tsv"), "w") as f:
    for i, s in enumerate(SENTENCES):
        f.write(f"chk\t{i % 2}\t\t{s}\n")
with open(os.path.join(data, "test.tsv"), "w") as f:
    f.write("index\tsentence\n")
    for i, s in enumerate(SENTENCES):
        f.write(f"{i}\t{s}\n")
pred_file = os.path.join(work, "pred.tsv")
run = [HPC, "run", model_file, "--device", "cpu", "--task", "cola", "--data", data, "--init", OUT, "--steps", "1",
       "--lr", "1e-30", "--batch", str(len(SENTENCES)), "--predict", pred_file]
r = subprocess.run(run, capture_output=True, text=True)
check(r.returncode == 0, "hpc run --init DIR --predict" + ("" if r.returncode == 0 else ": " + r.stderr[-2000:]))
if r.returncode == 0:
    lines = open(pred_file).read().split("\n")[1:]
    hpc_pred = [int(l.split("\t")[1]) for l in lines if l]
    check(hpc_pred == torch_pred, f"predictions: hpc {hpc_pred} transformers {torch_pred}")

print(f"{failures} failures" if failures else "all checks passed")
sys.exit(1 if failures else 0)
