#!/bin/sh
# tests/emu/run-ci.sh [JOBS_FILE] — runs the emulator jobs of `make test`
# (tests/emu/ci.jobs: settings, then a program of build/tests/gpu) in
# HPC_EMU_JOBS parallel lanes (default: the machine's cores; the emulator
# runs a program on one core, so one lane leaves the others idle).  Prints
# one PASS line a job, in the file's order, once all have ended; if any
# failed, its whole log (build/emu-ci/N.log, N its line among the jobs)
# and a non-zero exit.  The programs share the emulator's module cache,
# which concurrent builds may fill (tools/cuemu/emu_module.c renames each
# build into place).
set -u
root=${HPC_ROOT:-$(pwd)}
jobs_file=${1:-$root/tests/emu/ci.jobs}
out=$root/build/emu-ci

if [ "${EMU_CI_ONE:-}" = 1 ]; then   # one job: N SETTING... PROGRAM (xargs calls this)
    n=$1; shift
    settings="" program=""
    for word in "$@"; do
        case $word in *=*) settings="$settings $word" ;; *) program=$word ;; esac
    done
    [ -n "$program" ] || { echo "run-ci.sh: job $n names no program" >"$out/$n.log"; exit 0; }
    start=$(date +%s)
    # shellcheck disable=SC2086   # the settings are words on purpose
    env $settings sh "$root/tools/cuemu/run.sh" "$root/build/tests/gpu/$program" >"$out/$n.log" 2>&1
    rc=$?
    echo "$rc $(( $(date +%s) - start ))" >"$out/$n.rc"
    exit 0   # the caller reads the .rc files: xargs must not stop the other lanes
fi

lanes=${HPC_EMU_JOBS:-$(nproc 2>/dev/null || echo 1)}
rm -rf "$out" && mkdir -p "$out" || exit 2
# the jobs without comments and blank lines, numbered, one space between
# words (a line ending in a blank would run on into the next under xargs -L)
sed -e 's/#.*//' "$jobs_file" | awk 'NF { $1 = $1; print ++n, $0 }' >"$out/jobs"
[ -s "$out/jobs" ] || { echo "run-ci.sh: no jobs in $jobs_file" >&2; exit 2; }
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
EMU_CI_ONE=1 HPC_ROOT="$root" xargs -P "$lanes" -L 1 sh "$self" <"$out/jobs"

failed=0
while read -r n rest; do
    label=$(echo "$rest" | awk '{ $NF = ""; sub(/ +$/, ""); print }')
    program=$(echo "$rest" | awk '{ print $NF }')
    if [ -f "$out/$n.rc" ] && read -r rc secs <"$out/$n.rc" && [ "$rc" = 0 ]; then
        echo "PASS  ${label:+$label }$program (emulated, $secs s)"
    else
        echo "FAIL  ${label:+$label }$program (emulated) — log follows:"
        cat "$out/$n.log" 2>/dev/null || echo "(it did not run)"
        failed=1
    fi
done <"$out/jobs"
exit $failed
