#!/bin/sh
# bench/pending.sh PART — the GPU checks and timings that sessions without a
# device left owed (NOTES.md, "First thing next session"), in the order
# they matter, each step under its own time limit, so that a few device
# calls do them without a typo costing a machine start.  Each PART fits one
# 600-second call on an H100 or H200.  The untimed variants: the attention
# forward's HPC_ATTN_FWD=wide and persist (checked on the emulator only)
# and narrow5 (narrow's code at five blocks an SM), and the persistent
# one-pass backward HPC_ATTN_KERNELS=v4p (on the emulator only).
#
#   part 1: gpu_attention (their kernels against the cpu, and the "mma2
#           wide fwd", "mma2 persist fwd" and "mma4 persist" timings beside
#           "mma2 fwd" and "mma4"), then bench/ab.sh base / wide / narrow5
#           / persist / v4p at three shapes, two rounds;
#   part 2: gpu_attention_step with each, and the graph profile of their
#           attention rows at 256 x 128;
#   part 3: HPC_GEMM_OWN=gelu's graph profile (owed since the
#           twenty-second session); gpu_kernels and gpu_runtime (the GEMM
#           shape classes and the launch change, checked on an H100 and the
#           emulator only).
#
# Run from the repository root on the device with bin/, build/bench and
# build/tests/gpu carried (NOTES.md, "Practical").  Everything goes to
# $OUT/pending-PART.txt (or /tmp) and the lines that matter to stdout.
set -u
cd "$(dirname "$0")/.."
part=${1:-}
log=${OUT:-/tmp}/pending-$part.txt
: >"$log"
export HPC_ROOT="$PWD"

# step NAME SECONDS COMMAND...: runs it under timeout, its output to the
# log, its rc and time to both.
step() {
    name=$1 limit=$2
    shift 2
    echo "### $name: $*" >>"$log"
    start=$(date +%s)
    timeout "$limit" "$@" >>"$log" 2>&1
    rc=$?
    echo "### $name rc=$rc $(($(date +%s) - start))s" | tee -a "$log"
}

# the lines of the log since the last "### NAME" header matching PATTERN
since() { awk -v h="### $1:" 'index($0, h) == 1 { keep = 1; next } /^### / { keep = 0 } keep' "$log" | grep -E "$2"; }

nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee -a "$log"
bench=build/bench/bench_hpc
case $part in
1)
    step gpu_attention 200 build/tests/gpu/gpu_attention
    since gpu_attention '^FAIL|checks, [0-9]+ failed|^timing .*(mma2 fwd|mma2 wide fwd|mma2 persist fwd|mma4)'
    step ab 360 env SHAPES=256x128,32x128,32x32 ROUNDS=2 sh bench/ab.sh base=$bench wide=$bench:HPC_ATTN_FWD=wide \
        narrow5=$bench:HPC_ATTN_FWD=narrow5 persist=$bench:HPC_ATTN_FWD=persist v4p=$bench:HPC_ATTN_KERNELS=v4p
    since ab '^summary|ms \(|stderr'
    ;;
2)
    for f in HPC_ATTN_FWD=wide HPC_ATTN_FWD=narrow5 HPC_ATTN_FWD=persist HPC_ATTN_KERNELS=v4p; do
        step "step_$f" 100 env "$f" build/tests/gpu/gpu_attention_step
        since "step_$f" '^FAIL|checks, [0-9]+ failed'
    done
    step profile 200 env PROFILE=graph PSHAPES=256x128 PGREP='attention |hpc profile' SHAPES=256x128 ROUNDS=1 \
        sh bench/ab.sh base=$bench wide=$bench:HPC_ATTN_FWD=wide narrow5=$bench:HPC_ATTN_FWD=narrow5 \
        persist=$bench:HPC_ATTN_FWD=persist v4p=$bench:HPC_ATTN_KERNELS=v4p
    since profile '^(base|wide|narrow5|persist|v4p) |^summary|ms \('
    ;;
3)
    step profile_gelu 150 env PROFILE=graph PSHAPES=256x128 PGREP='linear|gelu|act|hpc profile' SHAPES=256x128 ROUNDS=1 \
        sh bench/ab.sh base=$bench gelu=$bench:HPC_GEMM_OWN=gelu
    since profile_gelu '^(base|gelu) |^summary|ms \('
    step gpu_kernels 250 build/tests/gpu/gpu_kernels
    since gpu_kernels '^FAIL|checks, [0-9]+ failed|class'
    step gpu_runtime 60 build/tests/gpu/gpu_runtime
    since gpu_runtime '^FAIL|checks, [0-9]+ failed'
    ;;
*)
    echo "usage: sh bench/pending.sh 1|2|3" >&2
    exit 2
    ;;
esac
echo "log: $log"
