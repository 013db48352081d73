#!/bin/sh
# bench/workload.sh — the real-workload row of issue 15: a 3-epoch GLUE
# CoLA fine-tune of the BERT-base shape at batch 32, hpc fp16 against
# PyTorch AMP in the HF-Trainer-style loop of bench/finetune_quality.py
# (dynamic padding, fused AdamW, clipping, GradScaler), both from the same
# random initial weights.  It reports training wall time, real tokens per
# second and the ratio; the dev MCC is printed too, but from random weights
# it says nothing about quality (bench/finetune_quality.sh measures that
# from a pretrained model).
#
# Needs a GPU, python3 with torch and transformers, and bin/hpc built on the
# build machine.  Settings (environment): SHAPE ("12 768 12 3072": layers,
# hidden, heads, FFN), TORCH (1: also run PyTorch), HPC_ARGS (more `hpc run`
# options, e.g. --pack), OUT (optional: where the JSON lines and the table
# are copied).  Time on one H200: about a minute.
set -u
cd "$(dirname "$0")/.."
SHAPE=${SHAPE:-12 768 12 3072}
TORCH=${TORCH:-1}
HPC_ARGS=${HPC_ARGS:-}
PYTHON=${PYTHON:-python3}
COPY_TO=${OUT:-}
WORK=build/workload
RAW=$WORK/workload.jsonl
mkdir -p "$WORK"
rm -f "$RAW"
for f in bin/hpc data/cola/train.tsv data/vocab/bert-base-uncased-vocab.txt; do
    [ -e "$f" ] || { echo "workload: missing $f (make bin/hpc on the build machine)" >&2; exit 1; }
done

# shellcheck disable=SC2086  # SHAPE is four words on purpose
"$PYTHON" bench/finetune_quality.py random-init "$WORK/init" data/vocab/bert-base-uncased-vocab.txt $SHAPE >&2 || exit 1
bin/hpc import "$WORK/init" -o "$WORK/model.model" >&2 || exit 1

echo "workload: hpc fp16" >&2
rm -f "$WORK/hpc.jsonl"
# shellcheck disable=SC2086  # HPC_ARGS is options, split on purpose
bin/hpc run "$WORK/model.model" --task cola --device cuda --lr 5e-5 --epochs 3 --batch 32 --fp16 \
    --init "$WORK/init" --seed 0 --log "$WORK/hpc.jsonl" $HPC_ARGS > "$WORK/hpc.out" 2>&1 ||
    { echo "workload: hpc run failed:" >&2; tail -5 "$WORK/hpc.out" >&2; exit 1; }
"$PYTHON" - "$WORK/hpc.jsonl" "$SHAPE" "$HPC_ARGS" >> "$RAW" <<'EOF' || exit 1
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
s = [e for e in ev if e.get("event") == "summary"][-1]
evals = [e for e in ev if e.get("event") == "eval"]
print(json.dumps({"kind": "workload", "impl": "hpc-fp16" + ("-pack" if "--pack" in sys.argv[3] else ""),
                  "shape": sys.argv[2], "train_s": s["train_s"],
                  "tokens": s["tokens"], "steps": s["steps"], "skipped": s["skipped_total"],
                  "peak_mib": s["peak_mem_bytes"] / 2**20, "mcc": evals[-1]["value"] if evals else None}))
EOF

if [ "$TORCH" = 1 ]; then
    echo "workload: PyTorch AMP" >&2
    "$PYTHON" bench/finetune_quality.py torch-finetune "$WORK/init" 0 data/cola 1 > "$WORK/torch.json" 2> "$WORK/torch.err" ||
        { echo "workload: PyTorch failed:" >&2; tail -5 "$WORK/torch.err" >&2; exit 1; }
    grep '^{' "$WORK/torch.json" | sed "s/^{\"kind\": \"finetune\"/{\"kind\": \"workload\", \"shape\": \"$SHAPE\"/" >> "$RAW"
fi

"$PYTHON" - "$RAW" <<'EOF' | tee "$WORK/workload.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| run | shape (layers hidden heads ffn) | steps | training s | real tokens/s | dev MCC |")
print("|---|---|---:|---:|---:|---:|")
for r in rows:
    print("| %s | %s | %d | %.2f | %.0f | %s |" % (r["impl"], r["shape"], r["steps"], r["train_s"],
          r["tokens"] / r["train_s"], "%.3f" % r["mcc"] if r.get("mcc") is not None else "-"))
by = {r["impl"]: r for r in rows}
if "hpc-fp16" in by and "pytorch-amp" in by:
    print()
    print("hpc fp16 is %.1fx faster than PyTorch AMP in training wall time (goal: 10x)"
          % (by["pytorch-amp"]["train_s"] / by["hpc-fp16"]["train_s"]))
EOF
if [ -n "$COPY_TO" ]; then mkdir -p "$COPY_TO" && cp "$RAW" "$WORK/workload.md" "$COPY_TO/"; fi
