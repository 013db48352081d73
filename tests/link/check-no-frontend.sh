#!/bin/sh
# tests/link/check-no-frontend.sh HPC BIN... — the step program is the one
# compile/run boundary: each BIN (tests/link/*, linked statically against
# libhpcrt.a and libhpcc.a) must contain none of the front end or the
# graph-building passes, and must train an artifact that HPC (bin/hpc)
# compiled.  Its link map (BIN.map, written by the Makefile's rule) must show
# that from libhpcc.a it pulled only members built from program/ and util/
# (the op table's names, arities and outputs are program/op_info.c; the shape
# and backward rules that build graphs, compiler/ops.c, stay out).  run_artifact trains through the trainer's backend interface;
# api_artifact and api_artifact_cuda through the C API (the latter with the
# cuda backend linked in: without a GPU it falls back to the cpu).  Run by
# `make test`.
set -eu
hpc=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$hpc" compile models/bert_tiny.model --fp16 -o "$dir/bert_tiny.hpc" >/dev/null 2>&1
# Members of libhpcc.a a program running NAME.hpc may pull in.
shared_members=$(for f in program/*.c util/*.c; do basename "$f" .c; done | sort -u)
for bin in "$@"; do
    if [ ! -f "$bin.map" ]; then
        echo "FAIL  $bin.map is missing (the Makefile links $bin with -Wl,-Map=$bin.map)"
        exit 1
    fi
    extra=$(grep -oE 'libhpcc\.a\([A-Za-z0-9_.-]+\.o\)' "$bin.map" | sed 's/.*(\(.*\)\.o)/\1/' | sort -u |
            grep -vxF "$shared_members" || true)
    if [ -n "$extra" ]; then
        echo "FAIL  $bin pulls compiler members from libhpcc.a (only program/ and util/ members may come):" $extra
        exit 1
    fi
    bad=$(nm "$bin" | awk '$2 ~ /^[TtDdBbRr]$/ {print $3}' | grep -E '^(yyparse|yylex|lower_model|autodiff_build|check_load_file|pipeline_build|eop_module_source|spec_load|step_program_compile)$' || true)
    if [ -n "$bad" ]; then
        echo "FAIL  $bin links the compiler front end or passes:" $bad
        exit 1
    fi
    case $(basename "$bin") in   # the cuda builds must hold the cuda executor
        run_artifact|*_cuda) nm "$bin" | grep -q ' T cuda_exec_init_kernels$' ||
            { echo "FAIL  $bin lacks the cuda backend (cuda_exec_init_kernels)"; exit 1; } ;;
        *) ! nm "$bin" | grep -q ' T cuda_' ||
            { echo "FAIL  $bin is cpu-only but links CUDA code:" $(nm "$bin" | grep ' T cuda_' | head -3); exit 1; } ;;
    esac
    case $(basename "$bin") in
        run_artifact) out=$("$bin" "$dir/bert_tiny.hpc") ;;
        api_artifact) out=$("$bin" "$dir/bert_tiny.hpc" models/bert_tiny.model cpu) ;;
        *) out=$("$bin" "$dir/bert_tiny.hpc" models/bert_tiny.model auto) ;;
    esac
    echo "PASS  $bin: no parser, checker or passes; ran bert_tiny.hpc ($out)"
done
