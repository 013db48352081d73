#!/bin/sh
# bench/run.sh — hpc against PyTorch on BERT-base training steps, one call.
#
# Runs bench_hpc (hpc's trainer step: fused graph, device optimizer, loss
# scaler; fp16 and fp32) and bench/pytorch_bert.py (HF BERT: AMP + fused
# AdamW, torch.compile, fp32) on the same shapes, then prints one table
# (bench/table.py) and writes it, with the raw JSON lines, to $OUT if set.
#
# Settings (environment): SHAPES (32x128,32x32,256x128), WARMUP (10),
# ITERS (30), COMPILE_TIMEOUT (seconds for the torch.compile mode, 240),
# POLICIES (hpc's, fp16,fp32), TORCH_MODES (PyTorch's eager modes, amp,fp32;
# the fp32 rows may be left out when device time is short), PYTHON (python3).  bench_hpc is built here when it is missing (the
# Makefile's flags); `rm build/bench/bench_hpc` after changing the sources.
set -u
cd "$(dirname "$0")/.."
SHAPES=${SHAPES:-32x128,32x32,256x128}
WARMUP=${WARMUP:-10}
ITERS=${ITERS:-30}
COMPILE_TIMEOUT=${COMPILE_TIMEOUT:-240}
PYTHON=${PYTHON:-python3}
POLICIES=${POLICIES:-fp16,fp32}
TORCH_MODES=${TORCH_MODES:-amp,fp32}
BIN=build/bench/bench_hpc
RAW=${OUT:+$OUT/bench_raw.jsonl}
RAW=${RAW:-build/bench/bench_raw.jsonl}
mkdir -p build/bench
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

# Built here only when missing (the GPU machine may lack the static libraries):
# into a temporary name, so a failed link never removes a working binary.
if [ ! -x "$BIN" ]; then
    echo "bench: building $BIN" >&2
    ${CC:-cc} -std=c11 -D_GNU_SOURCE -O2 -I. -Iutil -Igrammar -Icompiler -Iruntime -Ibuild/gen \
        -isystem "$CUDA_HOME/include" -o "$BIN.tmp" bench/bench_hpc.c build/libhpcrt.a build/libhpcc.a \
        -Wl,-Bstatic -ljansson -lutf8proc -Wl,-Bdynamic -L"$CUDA_HOME/lib64" -Wl,-rpath,"$CUDA_HOME/lib64" \
        -lnvrtc -lcublasLt -lcublas -ldl -lpthread -lm && mv "$BIN.tmp" "$BIN" || exit 1
fi

: > "$RAW"
echo "bench: hpc ($POLICIES) on $SHAPES" >&2
"$BIN" --shapes "$SHAPES" --policies "$POLICIES" --warmup "$WARMUP" --iters "$ITERS" | tee -a "$RAW"
hpc_rc=$?
echo "bench: PyTorch $TORCH_MODES" >&2
PYTHONUNBUFFERED=1 $PYTHON bench/pytorch_bert.py --modes "$TORCH_MODES" --shapes "$SHAPES" \
    --warmup "$WARMUP" --iters "$ITERS" | tee -a "$RAW"
echo "bench: torch.compile (limit ${COMPILE_TIMEOUT}s)" >&2
PYTHONUNBUFFERED=1 timeout "$COMPILE_TIMEOUT" $PYTHON bench/pytorch_bert.py --modes compile --shapes "$SHAPES" \
    --warmup "$WARMUP" --iters "$ITERS" | tee -a "$RAW"

TABLE=${OUT:+$OUT/bench_table.md}
TABLE=${TABLE:-build/bench/bench_table.md}
$PYTHON bench/table.py "$RAW" | tee "$TABLE"
exit $hpc_rc
