#!/bin/sh
# Runs each test binary given, prints one line per binary (PASS or FAIL, its
# wall seconds, the last line of its log), fails if any failed.  A failed
# binary's whole log follows its line; every log stays in BINARY.log.
failed=""
for t in "$@"; do
    start=$(date +%s)
    if "$t" >"$t.log" 2>&1; then
        echo "PASS  $t ($(( $(date +%s) - start )) s; $(tail -n 1 "$t.log"))"
    else
        echo "FAIL  $t ($(( $(date +%s) - start )) s) — log follows:"; cat "$t.log"; failed="$failed $t"
    fi
done
[ -z "$failed" ] || { echo "failed:$failed"; exit 1; }
echo "all $# test binaries passed"
