#!/bin/sh
# bench/ab.sh — builds or settings of hpc's step timed side by side in one
# call on the GPU machine: the way every A/B in BENCHMARKS.md is measured
# (the lent machines differ by a few percent from call to call, so two
# variants are only comparable inside one call).
#
#   sh bench/ab.sh NAME=BIN[:VAR=VALUE,...] NAME=BIN[:...] ...
#
# Each variant is a name, a bench_hpc binary and optional environment
# settings (a comma that does not start a NAME= setting belongs to the
# value before it, so HPC_LN_BWD=v2,4,264,2 is one setting), e.g.
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
# median ms, device MiB) on stdout, with what a run wrote to stderr (an
# error, say a setting the build refuses) as `NAME round R stderr: ...`
# lines beside it, then a summary: per shape and variant
# the mean over the rounds and its difference from the first variant's;
# the JSON lines go to $OUT/ab_NAME.jsonl when OUT is set.  A parent commit's bench_hpc comes from building it
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
# env settings of a variant, space separated for env(1): split at commas,
# except that a piece which does not start a new NAME= setting continues the
# value before it (HPC_LN_BWD=v2,4,264,2 stays one setting)
settings() {
    case $1 in *:*) echo "${1#*:}" | awk -F, '{
        out = ""
        for (i = 1; i <= NF; i++)
            if (out == "" || $i ~ /^[A-Za-z_][A-Za-z0-9_]*=/) out = out (out == "" ? "" : " ") $i
            else out = out "," $i
        print out }' ;;
    esac
}
run=0
lines=$(mktemp)
errs=$(mktemp)
while [ $run -lt "$ROUNDS" ]; do
    run=$((run + 1))
    for v in "$@"; do
        name=${v%%=*}; rest=${v#*=}; bin=${rest%%:*}
        # shellcheck disable=SC2046
        env $(settings "$rest") "$bin" --shapes "$SHAPES" --policies fp16 --warmup "$WARMUP" --iters "$ITERS" \
            2>"$errs" | tee -a "${OUT:-/tmp}/ab_$name.jsonl" |
            sed -n "s/.*\"B\": \([0-9]*\), \"L\": \([0-9]*\), \"median_ms\": \([0-9.]*\),.*\"device_mib\": \([0-9.]*\).*/$name round $run \1x\2 \3 ms \4 MiB/p" |
            tee -a "$lines"
        head -n 5 "$errs" | sed "s/^/$name round $run stderr: /"
    done
done
rm -f "$errs"
# The summary: per shape and variant the mean of the rounds (their range),
# and its difference from the first variant's mean.
[ -s "$lines" ] && awk -v first="${1%%=*}" '
    { k = $4 SUBSEP $1; n[k]++; sum[k] += $5; if (!(k in lo) || $5 < lo[k]) lo[k] = $5; if ($5 > hi[k]) hi[k] = $5
      if (!($4 in seen_shape)) { seen_shape[$4] = 1; shapes[++ns] = $4 }
      if (!($1 in seen_name)) { seen_name[$1] = 1; names[++nn] = $1 } }
    END {
      printf "summary: mean of the rounds (range), against %s\n", first
      for (i = 1; i <= ns; i++) for (j = 1; j <= nn; j++) {
        k = shapes[i] SUBSEP names[j]; if (!(k in n)) continue
        m = sum[k] / n[k]; b = shapes[i] SUBSEP first
        d = (b in n) && names[j] != first ? sprintf("%+.3f ms (%+.1f %%)", m - sum[b] / n[b], 100 * (m / (sum[b] / n[b]) - 1)) : ""
        printf "%-8s %-10s %8.3f ms (%.3f-%.3f)  %s\n", shapes[i], names[j], m, lo[k], hi[k], d
      } }' "$lines"
rm -f "$lines"
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
