# tests/reliability/lib.sh — helpers for the reliability cases (sourced by each
# tests/reliability/*.sh).  A case runs hpc on hostile input or under a fault and
# checks three things: the exit code, a one-line message naming the input, and
# that every file that existed before is unchanged.
#
#   expect CODE "substring of stderr" hpc ARGS...   runs bin/hpc with ARGS
#   snapshot FILE...      remember FILE's checksum;  unchanged  checks them all
#   ok NAME / notok NAME "why"   report one case
#
# Environment (set by run.sh): HPC (absolute path of bin/hpc), HPC_ROOT (the
# repository), WORK (an empty scratch folder for this file's cases).
FAILS=0
ok()    { echo "ok      $1"; }
notok() { echo "not ok  $1: $2"; FAILS=$((FAILS + 1)); }

# expect NAME CODE SUBSTRING ARGS... : run hpc ARGS, want exit CODE and SUBSTRING on stderr.
expect() {
    name=$1; want=$2; text=$3; shift 3
    "$HPC" "$@" >"$WORK/.out" 2>"$WORK/.err"
    rc=$?
    if [ "$rc" -ne "$want" ]; then
        notok "$name" "exit $rc, expected $want; stderr: $(head -c 300 "$WORK/.err")"
    elif ! grep -qF -- "$text" "$WORK/.err"; then
        notok "$name" "stderr lacks \"$text\": $(head -c 300 "$WORK/.err")"
    else
        ok "$name"
    fi
}

SNAPS=""
snapshot() { for f in "$@"; do SNAPS="$SNAPS $f:$(sha256sum < "$f" | cut -c1-64)"; done; }
# unchanged NAME : every snapshotted file still has its checksum.
unchanged() {
    bad=""
    for s in $SNAPS; do
        f=${s%:*}; h=${s##*:}
        [ -f "$f" ] && [ "$(sha256sum < "$f" | cut -c1-64)" = "$h" ] || bad="$bad $f"
    done
    SNAPS=""
    if [ -z "$bad" ]; then ok "$1"; else notok "$1" "changed or lost:$bad"; fi
}
finish() { [ "$FAILS" -eq 0 ]; }
