#!/bin/sh
# tests/reliability/run.sh — the reliability suite (docs/reliability.md): runs every
# tests/reliability/*.sh case file with HPC, HPC_ROOT and a fresh WORK folder,
# prints each case, and fails when any case fails.  Run from the repository root
# after `make`:  sh tests/reliability/run.sh
root=$(pwd)
[ -x "$root/bin/hpc" ] || { echo "reliability: bin/hpc not built (run make)" >&2; exit 2; }
failed=""
for f in tests/reliability/*.sh; do
    case "$f" in */lib.sh|*/run.sh) continue ;; esac
    work=$(mktemp -d)
    if HPC="$root/bin/hpc" HPC_ROOT="$root" WORK="$work" sh "$f" >"$work.log" 2>&1; then
        echo "PASS  $f ($(grep -c '^ok' "$work.log") cases)"
    else
        echo "FAIL  $f:"; grep -v '^ok' "$work.log"; failed="$failed $f"
    fi
    rm -rf "$work" "$work.log"
done
[ -z "$failed" ] || { echo "reliability: failed:$failed"; exit 1; }
