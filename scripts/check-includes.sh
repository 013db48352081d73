#!/bin/sh
# scripts/check-includes.sh — the compile/run boundary in the include graph
# (docs/architecture.md, "The boundary"):
#   - program/ (the step program: what the compiler makes and the runtime
#     reads) includes nothing from compiler/ or runtime/;
#   - runtime/ includes nothing from compiler/, except that the files of the
#     in-process compile roads listed in ALLOWED below include the
#     compiler's one library door, compiler/step_program_build.h.
# An include counts however it is spelled: "compiler/X", a bare "X" that the
# include path (the including file's folder, then the Makefile's -I list)
# resolves to compiler/X, or a relative "../X".  Offenders are listed as
# file:line with the header; the exit status is 1 when there is any.
# Run by `make test`; run it alone from the repository root:
#   sh scripts/check-includes.sh
set -eu

# file  allowed compiler header   (why: the road it serves)
ALLOWED='
runtime/api/api_model.c            compiler/step_program_build.h   the C API opens a .model file or text
runtime/train/spec_compile.c       compiler/step_program_build.h   the trainer compiles a checked spec (counted)
runtime/train/checkpoint_spec.c    compiler/step_program_build.h   a checkpoint stores its model as .model text
runtime/formats/hf_import.c        compiler/step_program_build.h   the parameter table of an imported model
runtime/formats/hf_export.c        compiler/step_program_build.h   the parameter table of an exported model
runtime/cuda/cuda_exec_graph.c     compiler/step_program_build.h   launch records for a graph built in-process
'
# Where a bare #include "X" is looked for after the including file's folder
# (the Makefile's CFLAGS, in order).
SEARCH=". include util grammar compiler runtime build/gen"

[ -d runtime ] && [ -d compiler ] || { echo "check-includes.sh: run it from the repository root" >&2; exit 2; }

# Prints the repository-relative path an include resolves to, or nothing.
resolve() {   # $1 including file, $2 included name
    case $2 in
        compiler/*|program/*|runtime/*) echo "$2"; return ;;
    esac
    for d in "$(dirname "$1")" $SEARCH; do
        if [ -f "$d/$2" ]; then
            realpath -m --relative-to=. "$d/$2"
            return
        fi
    done
}

allowed() {   # $1 file, $2 compiler header
    echo "$ALLOWED" | awk -v f="$1" -v h="$2" '$1 == f && $2 == h { ok = 1 } END { exit !ok }'
}

bad=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for f in $(find runtime program -type f \( -name '*.c' -o -name '*.h' -o -name '*.inc' -o -name '*.def' \) | sort); do
    grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" | while IFS=: read -r line text; do
        name=$(printf '%s\n' "$text" | sed 's/^[^"]*"\([^"]*\)".*/\1/')
        target=$(resolve "$f" "$name")
        case $f:$target in
            program/*:compiler/*|program/*:runtime/*)
                echo "$f:$line: includes $target (program/ is the contract: it includes only program/ and util/)" ;;
            runtime/*:compiler/*)
                allowed "$f" "$target" ||
                    echo "$f:$line: includes $target (runtime/ includes only program/ headers;" \
                         "an in-process compile road includes compiler/step_program_build.h and is listed in scripts/check-includes.sh)" ;;
        esac
    done
done >"$out"
if [ -s "$out" ]; then
    cat "$out"
    echo "FAIL  the compile/run boundary: $(wc -l <"$out") include(s) above cross it (docs/architecture.md)"
    exit 1
fi
echo "PASS  the compile/run boundary: runtime/ and program/ include no compiler/ header but the listed door"
