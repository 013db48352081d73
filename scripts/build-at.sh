#!/bin/sh
# scripts/build-at.sh — build programs of another revision beside this tree,
# for A/B timing in one device call (bench/ab.sh base=... new=...): the
# baseline's bench_hpc without stashing or switching this checkout.
#
#   sh scripts/build-at.sh REV [TARGET ...]
#     REV     any git revision (main~1, a hash, a tag)
#     TARGET  make targets to build there (default: build/bench/bench_hpc)
#
# Builds in a temporary git worktree and copies each target to
# build/at/REV_SHORT/ (stripped of debug info, small enough to carry),
# then removes the worktree.  Prints the copied paths, e.g.
#   sh scripts/build-at.sh 542535c   ->   build/at/542535c/bench_hpc
# Needs what `make` needs here (flex, bison: build on this machine, not on
# the device machine).
set -eu
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: sh scripts/build-at.sh REV [TARGET ...]" >&2; exit 2; }
REV=$1
shift
SHORT=$(git rev-parse --short "$REV^{commit}") ||
    { echo "build-at: $REV is not a revision of this repository" >&2; exit 2; }
[ $# -ge 1 ] || set -- build/bench/bench_hpc
TREE=$(mktemp -d)
trap 'git worktree remove --force "$TREE" >/dev/null 2>&1 || rm -rf "$TREE"' EXIT
git worktree add --detach "$TREE" "$SHORT" >/dev/null
echo "build-at: building $* at $SHORT in $TREE" >&2
make -C "$TREE" -j"$(nproc)" "$@" >"$TREE/build-at.log" 2>&1 ||
    { tail -20 "$TREE/build-at.log" >&2; echo "build-at: make failed at $SHORT" >&2; exit 1; }
OUT=build/at/$SHORT
mkdir -p "$OUT"
for t in "$@"; do
    cp "$TREE/$t" "$OUT/"
    strip --strip-debug "$OUT/$(basename "$t")" 2>/dev/null || true
    echo "$OUT/$(basename "$t")"
done
