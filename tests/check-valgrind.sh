#!/bin/sh
# Runs `hpc check` under valgrind over every shipped model and every bad
# input in tests/data/bad/, and fails on any memory error or leak
# (definitely or indirectly lost).
#
# Usage (from the repository root, after `make`):
#   sh tests/check-valgrind.sh            # lean `hpc check` (cmd_check.c, options.c + libhpcc.a), ~2 s a file
#   HPC=bin/hpc sh tests/check-valgrind.sh  # the full binary; ~1 min a file, as valgrind
#                                           # loads the CUDA libraries it links
command -v valgrind >/dev/null || { echo "check-valgrind: valgrind is not installed" >&2; exit 2; }
CC=${CC:-cc}
if [ -z "$HPC" ]; then
    [ -f build/libhpcc.a ] || { echo "check-valgrind: build/libhpcc.a not built (run make)" >&2; exit 2; }
    HPC=build/tests/check-valgrind-main
    mkdir -p build/tests
    $CC -std=c11 -D_GNU_SOURCE -g -I. -Iutil -Igrammar -Icompiler -Icli -o "$HPC" \
        tests/check-valgrind-main.c cli/cmd_check.c cli/options.c build/libhpcc.a -lm || exit 2
fi
[ -x "$HPC" ] || { echo "check-valgrind: $HPC not built (run make)" >&2; exit 2; }
VG="valgrind -q --error-exitcode=9 --leak-check=full --suppressions=tests/valgrind.supp"
failed=0
count=0
for f in models/*.model tests/data/bad/*.model /nonexistent.model; do
    case "$f" in
        models/*) want=0 ;;
        /nonexistent.model) want=3 ;;
        *) want=1 ;;
    esac
    [ -e "$f" ] || [ "$want" -eq 3 ] || continue
    count=$((count + 1))
    log=$(mktemp)
    $VG "$HPC" check --quiet "$f" >/dev/null 2>"$log"
    rc=$?
    if [ "$rc" -ne "$want" ]; then
        echo "FAIL  $f: exit $rc, expected $want"
        grep '^==' "$log" || tail -n 5 "$log"
        failed=$((failed + 1))
    fi
    rm -f "$log"
done
[ "$failed" -eq 0 ] || { echo "check-valgrind: $failed of $count inputs failed"; exit 1; }
echo "check-valgrind: $count inputs clean under valgrind"
