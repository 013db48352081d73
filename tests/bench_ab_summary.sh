#!/bin/sh
# tests/bench_ab_summary.sh — bench/ab.sh's summary without a GPU: a stand-in
# for bench_hpc prints the JSON lines bench_hpc prints, with a step time set
# by the variant's settings, and the summary must give each variant's mean
# over the rounds and its difference from the first variant's; a variant
# whose run fails (FAKE_FAIL set: a message on stderr, exit 1) shows its
# message on a `NAME round R stderr:` line and no rows; a setting whose
# value holds commas (FAKE_LIST=v2,4,264,2, as HPC_LN_BWD takes) reaches
# the run whole.  (The A/B
# runs themselves need the GPU machine; this holds the arithmetic every
# BENCHMARKS.md comparison is read from.)
set -u
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# round r of a variant: FAKE_MS + r / 1000, so the two rounds' mean is FAKE_MS + 0.0015
cat > "$dir/bench" <<'EOF'
#!/bin/sh
[ -n "${FAKE_FAIL:-}" ] && { echo "bench_hpc: $FAKE_FAIL" >&2; exit 1; }
[ -n "${FAKE_LIST:-}" ] && [ "$FAKE_LIST" != v2,4,264,2 ] && { echo "bench_hpc: FAKE_LIST=$FAKE_LIST" >&2; exit 1; }
shapes=32x128
while [ $# -gt 0 ]; do case $1 in --shapes) shapes=$2; shift ;; esac; shift; done
r=$(($(cat "$FAKE_DIR/round_$FAKE_NAME" 2>/dev/null || echo 0) + 1))
echo $r > "$FAKE_DIR/round_$FAKE_NAME"
for s in $(echo "$shapes" | tr ',' ' '); do
    ms=$(awk -v b="$FAKE_MS" -v r="$r" -v s="$s" 'BEGIN { printf "%.4f", b + (s == "32x32" ? 0 : 2) + r / 1000 }')
    echo "{\"impl\": \"hpc-fp16\", \"B\": ${s%x*}, \"L\": ${s#*x}, \"median_ms\": $ms, \"peak_mib\": 1.0, \"device_mib\": 2178.0}"
done
EOF
chmod +x "$dir/bench"
out=$(OUT="$dir" SHAPES=32x32,32x128 ROUNDS=2 sh bench/ab.sh \
    base="$dir/bench:FAKE_DIR=$dir,FAKE_NAME=base,FAKE_MS=3.000" \
    fast="$dir/bench:FAKE_DIR=$dir,FAKE_NAME=fast,FAKE_MS=2.700" \
    slow="$dir/bench:FAKE_DIR=$dir,FAKE_NAME=slow,FAKE_MS=3.150" \
    listed="$dir/bench:FAKE_DIR=$dir,FAKE_LIST=v2,4,264,2,FAKE_NAME=listed,FAKE_MS=3.100" \
    broken="$dir/bench:FAKE_DIR=$dir,FAKE_NAME=broken,FAKE_FAIL=refused")
fail=0
expect() {
    if printf '%s\n' "$out" | grep -qE "$1"; then :; else
        echo "FAIL  tests/bench_ab_summary.sh: no line matching: $1"
        fail=1
    fi
}
expect '^base round 2 32x128 5\.0020 ms 2178\.0 MiB$'
expect '^summary: mean of the rounds \(range\), against base$'
expect '^32x32 +base +3\.002 ms \(3\.001-3\.002\) *$'
expect '^32x32 +fast +2\.702 ms \(2\.701-2\.702\) +-0\.300 ms \(-10\.0 %\)$'
expect '^32x128 +slow +5\.152 ms \(5\.151-5\.152\) +\+0\.150 ms \(\+3\.0 %\)$'
expect '^broken round 2 stderr: bench_hpc: refused$'
expect '^32x32 +listed +3\.10[12] ms \(3\.101-3\.102\) +\+0\.100 ms \(\+3\.3 %\)$'
[ "$(printf '%s\n' "$out" | grep -c '^base round 1 stderr')" = 0 ] || { echo "FAIL  tests/bench_ab_summary.sh: a stderr line for a clean run"; fail=1; }
[ "$(printf '%s\n' "$out" | grep -c ' ms (')" = 8 ] || { echo "FAIL  tests/bench_ab_summary.sh: not 8 summary rows"; fail=1; }
if [ $fail -ne 0 ]; then
    printf '%s\n' "$out"
    exit 1
fi
echo "PASS  tests/bench_ab_summary.sh (bench/ab.sh's summary)"
