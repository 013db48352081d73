#!/bin/sh
# bench/ab.sh — builds or settings of hpc's step timed side by side in one
# call on the GPU machine: the way every A/B in BENCHMARKS.md is measured
# (the lent machines differ by a few percent from call to call, so two
# variants are only comparable inside one call).
#
#   sh bench/ab.sh NAME=BIN[:VAR=VALUE,...] NAME=BIN[:...] ...
#
# Each variant is a name, a bench_hpc binary and optional environment
# settings, e.g.
#   sh bench/ab.sh base=build/lab/bench_hpc_base new=build/bench/bench_hpc
#   sh bench/ab.sh on=build/bench/bench_hpc off=build/bench/bench_hpc:HPC_FUSE_EMB=0
# The variants run in turn, ROUNDS times over (alternating, so a drift of
# the machine's clocks shows in every variant alike), each
# `bench_hpc --shapes SHAPES --policies fp16 --warmup WARMUP --iters ITERS`;
# then, with PROFILE=1, one `--profile` step of each at PSHAPES, the table
# rows matching PGREP (PROFILE=graph: `--profile-graph`, the rows timed
# inside the step's CUDA graph).  Settings (environment): SHAPES (32x128,32x32,
# 256x128), ROUNDS (2), WARMUP (5), ITERS (20), PROFILE, PSHAPES (256x128),
# PGREP (attention).  Output: one line per run (variant, round, shape,
# median ms, device MiB) on stdout; the JSON lines go to $OUT/ab_NAME.jsonl
# when OUT is set.  A parent commit's bench_hpc comes from building it
# here first (git stash; make build/bench/bench_hpc; copy it; git stash pop)
# and carrying it.
set -u
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: sh bench/ab.sh NAME=BIN[:VAR=VALUE,...] ..." >&2; exit 2; }
SHAPES=${SHAPES:-32x128,32x32,256x128}
ROUNDS=${ROUNDS:-2}
WARMUP=${WARMUP:-5}
ITERS=${ITERS:-20}
for v in "$@"; do
    name=${v%%=*}; rest=${v#*=}; bin=${rest%%:*}
    case $v in *=*) ;; *) echo "bench/ab.sh: $v: expected NAME=BIN[:VAR=VALUE,...]" >&2; exit 2 ;; esac
    [ -x "$bin" ] || { echo "bench/ab.sh: $name: $bin is not an executable" >&2; exit 2; }
done
# env settings of a variant, space separated for env(1)
settings() { case $1 in *:*) echo "${1#*:}" | tr ',' ' ' ;; esac; }
run=0
while [ $run -lt "$ROUNDS" ]; do
    run=$((run + 1))
    for v in "$@"; do
        name=${v%%=*}; rest=${v#*=}; bin=${rest%%:*}
        # shellcheck disable=SC2046
        env $(settings "$rest") "$bin" --shapes "$SHAPES" --policies fp16 --warmup "$WARMUP" --iters "$ITERS" \
            2>/dev/null | tee -a "${OUT:-/tmp}/ab_$name.jsonl" |
            sed -n "s/.*\"B\": \([0-9]*\), \"L\": \([0-9]*\), \"median_ms\": \([0-9.]*\),.*\"device_mib\": \([0-9.]*\).*/$name round $run \1x\2 \3 ms \4 MiB/p"
    done
done
if [ -n "${PROFILE:-}" ]; then
    popt=--profile
    [ "$PROFILE" = graph ] && popt=--profile-graph
    for v in "$@"; do
        name=${v%%=*}; rest=${v#*=}; bin=${rest%%:*}
        # shellcheck disable=SC2046
        env $(settings "$rest") "$bin" --shapes "${PSHAPES:-256x128}" --policies fp16 --warmup 2 --iters 3 \
            "$popt" 2>&1 >/dev/null | grep -E "${PGREP:-attention}" | grep -v "by op" | sed "s/^/$name /"
    done
fi
