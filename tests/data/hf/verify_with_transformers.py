# Checks `hpc import` and runtime/hf_names against the real transformers
# classes (not part of `make test`: it needs torch and transformers from
# PyPI).  For each supported family and head it
#   1. builds a tiny randomly initialised model and save_pretrained()s it
#      (model.safetensors + config.json),
#   2. runs `hpc import` on the folder,
#   3. runs HELPER (tests/data/hf/hf_roundtrip.c: load every parameter
#      with hf_names_load, write them back with hf_names_save),
#   4. loads that file into a fresh model of the same class and checks that
#      every tensor of the state dict is bit-identical to the original,
# and imports the bare base models (BertModel, ..., GPT2Model).
# Step 4 is a round trip: it proves every tensor is read and written back in
# place, while tests/test_hf_names.c pins which tensor is which (q/k/v order,
# Conv1D layout) against transformers' modeling code.
#
# With FORWARD (tests/data/hf/hf_forward.c) it also runs each imported model
# on hpc's cpu backend and compares the logits with transformers' forward.
#
# Usage (helpers built as the comment in hf_roundtrip.c says):
#   python3 tests/data/hf/verify_with_transformers.py bin/hpc build/hf_roundtrip /tmp/hfcheck [build/hf_forward]
import os
import subprocess
import sys

import torch
import transformers as T
from safetensors.torch import load_file

HPC, HELPER, WORK = sys.argv[1:4]
FORWARD = sys.argv[4] if len(sys.argv) > 4 else None   # tests/data/hf/hf_forward.c
IDS = [2, 5, 7, 9, 11, 13, 17, 4]   # no pad ids (0 for BERT, 1 for RoBERTa)

TINY = {
    "bert": lambda: T.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                 intermediate_size=37, max_position_embeddings=64, type_vocab_size=2),
    "roberta": lambda: T.RobertaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=37, max_position_embeddings=66, type_vocab_size=1,
                                       layer_norm_eps=1e-5),
    "distilbert": lambda: T.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                                             max_position_embeddings=64),
    "gpt2": lambda: T.GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64),
}
CASES = [
    ("bert", "BertForSequenceClassification", 3),
    ("bert", "BertForTokenClassification", 5),
    ("bert", "BertForMaskedLM", None),
    ("roberta", "RobertaForSequenceClassification", 3),
    ("roberta", "RobertaForTokenClassification", 4),
    ("roberta", "RobertaForMaskedLM", None),
    ("distilbert", "DistilBertForSequenceClassification", 2),
    ("distilbert", "DistilBertForTokenClassification", 3),
    ("distilbert", "DistilBertForMaskedLM", None),
    ("gpt2", "GPT2LMHeadModel", None),
    ("gpt2", "GPT2ForSequenceClassification", 3),
    ("gpt2", "GPT2ForTokenClassification", 3),
]

failures = 0
for family, arch, labels in CASES:
    torch.manual_seed(0)
    cfg = TINY[family]()
    if labels:
        cfg.num_labels = labels
    model = getattr(T, arch)(cfg).eval()
    with torch.no_grad():   # LayerNorm/bias start at 1/0: randomise them so a swap shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    if arch == "GPT2ForSequenceClassification":
        model.config.pad_token_id = 0
    src = os.path.join(WORK, arch)
    model.save_pretrained(src, safe_serialization=True)
    out = subprocess.run([HPC, "import", src, "-o", os.path.join(WORK, arch + ".model")],
                         capture_output=True, text=True)
    if out.returncode != 0:
        print(f"FAIL {arch}: hpc import: {out.stderr.strip()}")
        failures += 1
        continue
    back = os.path.join(WORK, arch + ".hpc.safetensors")
    out2 = subprocess.run([HELPER, family, os.path.join(WORK, arch + ".model"),
                           os.path.join(src, "model.safetensors"), back], capture_output=True, text=True)
    if out2.returncode != 0:
        print(f"FAIL {arch}: helper: {out2.stderr.strip()} {out2.stdout.strip()}")
        failures += 1
        continue
    fresh = getattr(T, arch)(cfg).eval()
    missing, unexpected = fresh.load_state_dict(load_file(back), strict=False)
    want = model.state_dict()
    got = fresh.state_dict()
    bad = [k for k in want if not torch.equal(want[k], got[k])]
    # Keys transformers itself re-derives: tied weights and buffers.
    real_missing = [k for k in missing if not (k.endswith("position_ids") or "decoder" in k or k.endswith("attn.bias") or
                                              k.startswith("lm_head.weight") or k.endswith("vocab_projector.weight"))]
    fwd = ""
    if FORWARD:
        out3 = subprocess.run([FORWARD, family, os.path.join(WORK, arch + ".model"),
                               os.path.join(src, "model.safetensors"), ",".join(map(str, IDS))],
                              capture_output=True, text=True)
        with torch.no_grad():
            ref = model(input_ids=torch.tensor([IDS])).logits.flatten().double()
        if out3.returncode != 0:
            bad.append("forward: " + out3.stderr.strip())
        else:
            got_logits = torch.tensor([float(x) for x in out3.stdout.split()], dtype=torch.float64)
            if got_logits.shape != ref.shape:
                bad.append(f"forward: {got_logits.shape[0]} logits, transformers {ref.shape[0]}")
            else:
                err = ((got_logits - ref).abs().max() / ref.abs().max()).item()
                fwd = f", forward rel. error {err:.1e}"
                if not err < 1e-5:
                    bad.append(f"forward: max relative error {err:.2e}")
    status = "ok  " if not bad and not unexpected and not real_missing else "FAIL"
    failures += status == "FAIL"
    print(f"{status} {arch}: {len(want)} tensors{fwd}, problems {bad[:4]}, missing {real_missing[:4]}, "
          f"unexpected {list(unexpected)[:4]}; import notes: {out.stderr.strip()[:200]}")
# Bare models (no task head): hpc import must accept them; the names lack
# the base prefix (as the Hub's gpt2 file), and a new head is announced.
for family, arch in [("bert", "BertModel"), ("roberta", "RobertaModel"), ("distilbert", "DistilBertModel"),
                     ("gpt2", "GPT2Model")]:
    torch.manual_seed(0)
    model = getattr(T, arch)(TINY[family]())
    src = os.path.join(WORK, arch)
    model.save_pretrained(src, safe_serialization=True)
    out = subprocess.run([HPC, "import", src, "-o", os.path.join(WORK, arch + ".model")],
                         capture_output=True, text=True)
    ok = out.returncode == 0 and (family == "gpt2" or "new parameters" in out.stderr)
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} {arch} (bare): rc {out.returncode}; {out.stderr.strip()[:300]}")
sys.exit(1 if failures else 0)
