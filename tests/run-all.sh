#!/bin/sh
# Runs each test binary given, prints one line per binary, fails if any failed.
failed=""
for t in "$@"; do
    if "$t" >"$t.log" 2>&1; then
        echo "PASS  $t ($(tail -n 1 "$t.log"))"
    else
        echo "FAIL  $t — log follows:"; cat "$t.log"; failed="$failed $t"
    fi
done
[ -z "$failed" ] || { echo "failed:$failed"; exit 1; }
echo "all $# test binaries passed"
