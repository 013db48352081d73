#!/bin/sh
# bench/pending.sh PART — the GPU checks and timings that sessions without a
# device left owed (NOTES.md, "First thing next session"), in the order
# they matter, each step under its own time limit, so one device call does
# them without a typo costing a machine start.  PART 1 fits one 600-second
# call on an H100 or H200, PART 2 another.
#
#   part 1: the attention forward's three untimed shapes (HPC_ATTN_FWD=wide
#           and persist, checked on the emulator only, and narrow5):
#           gpu_attention (their kernels against the cpu, and the "mma2
#           wide fwd" and "mma2 persist fwd" timings beside "mma2 fwd"),
#           gpu_attention_step with each, then bench/ab.sh base / wide /
#           narrow5 / persist at three shapes, two rounds;
#   part 2: the graph profile of the attention rows, base / wide /
#           narrow5 / persist, at 256 x 128; HPC_GEMM_OWN=gelu's graph profile (owed
#           since the twenty-second session); gpu_kernels and gpu_runtime
#           (the GEMM shape classes and the launch change, checked on an
#           H100 and the emulator only).
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
    since gpu_attention '^FAIL|checks, [0-9]+ failed|^timing .*(mma2 fwd|mma2 wide fwd|mma2 persist fwd)'
    step wide_step 150 env HPC_ATTN_FWD=wide build/tests/gpu/gpu_attention_step
    since wide_step '^FAIL|checks, [0-9]+ failed'
    for f in narrow5 persist; do
        step ${f}_step 100 env HPC_ATTN_FWD=$f build/tests/gpu/gpu_attention_step
        since ${f}_step '^FAIL|checks, [0-9]+ failed'
    done
    step ab 300 env SHAPES=256x128,32x128,32x32 ROUNDS=2 sh bench/ab.sh base=$bench wide=$bench:HPC_ATTN_FWD=wide \
        narrow5=$bench:HPC_ATTN_FWD=narrow5 persist=$bench:HPC_ATTN_FWD=persist
    since ab '^summary|ms \(|stderr'
    ;;
2)
    step profile_wide 150 env PROFILE=graph PSHAPES=256x128 PGREP='attention |hpc profile' SHAPES=256x128 ROUNDS=1 \
        sh bench/ab.sh base=$bench wide=$bench:HPC_ATTN_FWD=wide narrow5=$bench:HPC_ATTN_FWD=narrow5 \
        persist=$bench:HPC_ATTN_FWD=persist
    since profile_wide '^(base|wide|narrow5|persist) |^summary|ms \('
    step profile_gelu 120 env PROFILE=graph PSHAPES=256x128 PGREP='linear|gelu|act|hpc profile' SHAPES=256x128 ROUNDS=1 \
        sh bench/ab.sh base=$bench gelu=$bench:HPC_GEMM_OWN=gelu
    since profile_gelu '^(base|gelu) |^summary|ms \('
    step gpu_kernels 200 build/tests/gpu/gpu_kernels
    since gpu_kernels '^FAIL|checks, [0-9]+ failed|class'
    step gpu_runtime 60 build/tests/gpu/gpu_runtime
    since gpu_runtime '^FAIL|checks, [0-9]+ failed'
    ;;
*)
    echo "usage: sh bench/pending.sh 1|2" >&2
    exit 2
    ;;
esac
echo "log: $log"
