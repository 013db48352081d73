#!/bin/sh
# bench/finetune_curves.sh — hpc and PyTorch AMP step by step on the CoLA
# fine-tune of bench/finetune_quality.sh (issue 12: hpc fp16's spread of
# dev MCC over seeds is wider than AMP's, while the data, the batches, the
# schedule and one step's gradients match).  What a one-step check cannot
# see is the dynamics; this runs SEEDS seeds of hpc fp16 (the default plan)
# and of PyTorch AMP with their step logs, then hpc --fp32 on the same
# seeds, and prints `finetune_quality.py curves`: per epoch the mean train
# loss, gradient norm (before clipping) and share of clipped steps, the dev
# loss and MCC (mean ± std over the seeds), and whether the lr of every one
# of the 804 steps is the same on both sides; then each run's MCC by seed.
#
# Needs what finetune_quality.sh needs (bin/hpc, build/bench/grad_error,
# build/quality/minilm_f16/ from bench/make_f16_weights.py, a GPU, python3
# with torch and transformers).  Settings (environment): SEEDS (8), JOBS
# (PyTorch runs at once, default SEEDS), FP32 (1: also hpc --fp32; 0: not),
# FP32_LIMIT (60: seconds allowed for the fp32 runs), OUT (optional: where
# to copy steplogs.tar.gz and the JSON lines).  Starts over in
# build/quality/out.  About 2-2.5 minutes on one H200 for 8 seeds: hpc
# 8 x ~2.6 s (+ the first NVRTC compile), PyTorch 8 at once (~50 s), hpc
# fp32 8 x ~3 s (+ its compile).
set -u
cd "$(dirname "$0")/.."
SEEDS=${SEEDS:-8}
JOBS=${JOBS:-$SEEDS}
FP32=${FP32:-1}
FP32_LIMIT=${FP32_LIMIT:-60}
Q=build/quality/out
case "$SEEDS$JOBS$FP32$FP32_LIMIT" in *[!0-9]*) echo "finetune_curves: SEEDS, JOBS, FP32 and FP32_LIMIT must be numbers" >&2; exit 2;; esac
rm -rf "$Q"
mkdir -p build/quality
t0=$(date +%s)
SEEDS=$SEEDS JOBS=$JOBS PLANS=default PARTS="hpc torch" OUT= sh bench/finetune_quality.sh > /dev/null 2> build/quality/curves-1.err ||
    { echo "finetune_curves: finetune_quality.sh (hpc default, torch) failed:"; tail -5 build/quality/curves-1.err; }
echo "hpc fp16 and PyTorch AMP: $(( $(date +%s) - t0 )) s"
plans=default
if [ "$FP32" = 1 ]; then
    t1=$(date +%s)
    timeout "$FP32_LIMIT" env SEEDS="$SEEDS" PLANS=fp32 PARTS=hpc OUT= sh bench/finetune_quality.sh > /dev/null \
        2> build/quality/curves-2.err ||
        { echo "finetune_curves: the fp32 runs stopped or failed:"; tail -3 build/quality/curves-2.err; }
    echo "hpc fp32: $(( $(date +%s) - t1 )) s"
    plans="default fp32"
fi
grep -h "hpc run failed\|PyTorch seed .* failed" build/quality/curves-*.err 2>/dev/null | head -5
python3 bench/finetune_quality.py curves "$Q" $plans
python3 - "$Q/finetune_quality.jsonl" <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")] if os.path.exists(sys.argv[1]) else []
for impl in ("hpc-fp16 (default)", "hpc-fp32", "pytorch-amp"):
    r = sorted((x["seed"], x["mcc"]) for x in rows if x.get("impl") == impl)
    if r:
        print("%-19s MCC by seed: %s" % (impl, " ".join("%d:%.4f" % s for s in r)))
PY
(cd "$Q" && tar czf steplogs.tar.gz hpc-*-seed*.jsonl torch-steps-seed*.jsonl 2>/dev/null)
if [ -n "${OUT:-}" ]; then mkdir -p "$OUT" && cp "$Q/steplogs.tar.gz" "$Q/finetune_quality.jsonl" "$OUT/" 2>/dev/null; fi
echo "total: $(( $(date +%s) - t0 )) s"
