#!/bin/sh
# scripts/move-contract.sh — moves the step program's contents (the data the
# runtime reads) from compiler/ to program/ and rewrites every include and
# every mention of the moved files.  Idempotent: it can run again on a tree
# with other people's new edits, new files and new includes, and it only
# touches what still names an old path.  Run from the repository root:
#
#   sh scripts/move-contract.sh      then: make && sh scripts/check-includes.sh
#
# What it does, in order:
#   1. `git mv compiler/X program/X` for each moved file still in compiler/
#      (history follows; a file already in program/ is left alone);
#   2. in every tracked or new source file (C, headers, .inc, .def, .y, .l,
#      .cu, shell, Python, Makefiles, docs/ and README.md; not NOTES.md or
#      BENCHMARKS.md, which record history):
#        #include "X" and #include "compiler/X"  ->  #include "program/X"
#        the text compiler/X in comments, docs and Makefiles -> program/X
#        include guards HPC_COMPILER_X_H -> HPC_PROGRAM_X_H;
#   3. the Makefile's compiler source list gains program/*.c (the moved
#      sources stay in libhpcc.a: see docs/architecture.md);
#   4. for each header split out of a moved one (compiler/spec_load.h,
#      plan_graph.h, artifact_spec.h, ir_print.h; only once they exist),
#      every file outside runtime/ and program/ that calls one of its
#      functions and does not yet include it gets the include after the
#      include of the header it came out of (else after the last #include
#      of a .h before the file's first line of code).  Runtime files reach those through
#      compiler/step_program_build.h and are never edited here.
set -eu

moved="step_program.h step_program.c ir.h ir.c ops.def activations.h params.h params.c
plan.h plan.c spec.h spec.c spec_write.c artifact.h artifact.c"

[ -d compiler ] && [ -f Makefile ] || { echo "move-contract.sh: run it from the repository root" >&2; exit 2; }
mkdir -p program

# 1. The moves.
for f in $moved; do
    if [ -e "compiler/$f" ]; then
        if [ -e "program/$f" ]; then
            echo "move-contract.sh: both compiler/$f and program/$f exist; merge them by hand" >&2
            exit 1
        fi
        git mv "compiler/$f" "program/$f"
    fi
done

# The files to rewrite: tracked and untracked-but-not-ignored, by type.
files=$(git ls-files -co --exclude-standard |
        grep -E '\.(c|h|inc|def|y|l|cu|cuh|sh|py|md|mk)$|(^|/)Makefile$' |
        grep -vE '^(NOTES\.md|BENCHMARKS\.md|scripts/move-contract\.sh|scripts/check-includes\.sh)$' |
        while read -r f; do [ -f "$f" ] && echo "$f"; done)

# 2. Includes, mentions and guards.  One sed program for all moved names.
prog=$(mktemp)
trap 'rm -f "$prog"' EXIT
for f in $moved; do
    re=$(printf '%s' "$f" | sed 's/\./\\./g')
    guard=$(printf '%s' "$f" | sed 's/\.h$//' | tr 'a-z' 'A-Z')
    case $f in
        *.h|*.def)
            printf "%s\n" "s|#include \"$re\"|#include \"program/$f\"|g" >>"$prog"
            printf "%s\n" "s|#include \"compiler/$re\"|#include \"program/$f\"|g" >>"$prog"
            ;;
    esac
    printf "%s\n" "s|compiler/$re\\b|program/$f|g" >>"$prog"
    case $f in *.h) printf "%s\n" "s|\\bHPC_COMPILER_${guard}_H\\b|HPC_PROGRAM_${guard}_H|g" >>"$prog" ;; esac
done
pattern=$(for f in $moved; do printf '%s\n' "$f"; done | sed 's/\./\\./g' | paste -sd'|')
echo "$files" | while read -r f; do
    [ -n "$f" ] || continue
    if grep -qE "compiler/($pattern)\\b|#include \"($pattern)\"|HPC_COMPILER_[A-Z_]+_H" "$f"; then
        sed -i -f "$prog" "$f"
    fi
done

# 3. The moved sources are built into libhpcc.a with the compiler's.
if ! grep -q 'program/\*\.c' Makefile; then
    sed -i 's|^COMPILER_SRC := \$(wildcard util/\*\.c grammar/\*\.c compiler/\*\.c)|COMPILER_SRC := $(wildcard util/*.c grammar/*.c program/*.c compiler/*.c)|' Makefile
    grep -q 'program/\*\.c' Makefile || { echo "move-contract.sh: could not add program/*.c to COMPILER_SRC" >&2; exit 1; }
fi

# 4. Includes of the headers split out of the moved ones, where called.
#    header|functions (a call is NAME followed by '(' outside a comment line)
#    |the moved header it came out of (the new include goes after that one's)
splits="spec_load.h|spec_load spec_load_string|spec.h
plan_graph.h|plan_build|plan.h
artifact_spec.h|artifact_load_spec|artifact.h
ir_print.h|ir_print ir_dot ir_attr_str|ir.h"
echo "$splits" | while IFS='|' read -r hdr fns parent; do
    [ -f "compiler/$hdr" ] || continue
    calls=$(printf '%s' "$fns" | sed 's/ /|/g')
    echo "$files" | grep -E '\.(c|h|inc)$' | grep -vE '^(runtime|program)/' | while read -r f; do
        [ "$f" = "compiler/$hdr" ] && continue
        grep -qP "^(?!\\s*(\\*|/\\*|//)).*\\b($calls)\\(" "$f" || continue
        case $f in compiler/*) inc="#include \"$hdr\"" ;; *) inc="#include \"compiler/$hdr\"" ;; esac
        grep -qE "#include \"(compiler/)?$hdr\"" "$f" && continue
        # In the includes before the first line of code (a line that starts
        # with a letter): after program/PARENT's, else after the last .h.
        last=$(awk -v p="#include \"program/$parent\"" '/^[A-Za-z_]/ { exit }
                   index($0, p) == 1 { at = NR } /^#include "[^"]*\.h"/ { h = NR }
                   END { print at ? at : h }' "$f")
        [ -n "$last" ] || { echo "move-contract.sh: $f calls $fns but has no #include line; add $inc" >&2; continue; }
        sed -i "${last}a\\
$inc" "$f"
    done
done
echo "move-contract.sh: done (now: make && sh scripts/check-includes.sh)"
