#!/bin/sh
# tests/fuzz/run.sh NAME — runs one libFuzzer harness (build/fuzz/fuzz_NAME),
# called by `make fuzz` once per harness, one after another.
#   FUZZ_RUNS=N     run N executions (-runs=N); else
#   FUZZ_SECONDS=S  run for S seconds (default 60).
# Inputs: the growing corpus build/fuzz/corpus/NAME (kept between runs), the
# seeds tests/fuzz/seeds/NAME and the crashes already found,
# tests/data/fuzz-regress/NAME (replayed by `make test` too).  The parser
# harness also starts from every shipped model and every bad-input case.
# A crash, leak, hang (over 10 s) or 2 GB of memory stops it with the input
# saved as build/fuzz/crash/NAME-*: move that file into
# tests/data/fuzz-regress/NAME/ once it is fixed.  Last line printed:
#   fuzz NAME: RUNS executions in SECONDS s, exit CODE
set -u
name=$1
build=${BUILD:-build}
bin=$build/fuzz/fuzz_$name
corpus=$build/fuzz/corpus/$name
mkdir -p "$corpus" "$build/fuzz/crash"
seeds=""
for d in tests/fuzz/seeds/$name tests/data/fuzz-regress/$name; do
  [ -d "$d" ] && seeds="$seeds $d"
done
[ "$name" = parser ] && seeds="$seeds models tests/data/bad"
case "$name" in
  safetensors|artifact) max_len=65536 ;;
  parser) max_len=65536 ;;
  *) max_len=16384 ;;
esac
if [ -n "${FUZZ_RUNS:-}" ]; then limit="-runs=$FUZZ_RUNS"; else limit="-max_total_time=${FUZZ_SECONDS:-60}"; fi
log=$build/fuzz/$name.log
start=$(date +%s)
# shellcheck disable=SC2086
HPC_ROOT=${HPC_ROOT:-$(pwd)} "$bin" $limit -max_len=$max_len -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$build/fuzz/crash/$name-" "$corpus" $seeds >"$log" 2>&1
rc=$?
end=$(date +%s)
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
[ $rc -ne 0 ] && tail -40 "$log"
echo "fuzz $name: ${runs:-?} executions in $((end - start)) s, exit $rc (log $log)"
exit $rc
