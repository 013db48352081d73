#!/bin/sh
# tests/link/check-no-frontend.sh BIN HPC — the step program is the one
# compile/run boundary: BIN (tests/link/run_artifact, linked statically
# against libhpcrt.a and libhpcc.a) must contain none of the front end or
# the graph-building passes, and must train an artifact that HPC (bin/hpc)
# compiled.  Run by `make test`.
set -eu
bin=$1
hpc=$2
bad=$(nm "$bin" | awk '$2 ~ /^[TtDdBbRr]$/ {print $3}' | grep -E '^(yyparse|yylex|lower_model|autodiff_build|check_load_file|pipeline_build|eop_module_source)$' || true)
if [ -n "$bad" ]; then
    echo "FAIL  $bin links the compiler front end or passes:" $bad
    exit 1
fi
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$hpc" compile models/bert_tiny.model --fp16 -o "$dir/bert_tiny.hpc" >/dev/null 2>&1
out=$("$bin" "$dir/bert_tiny.hpc")
echo "PASS  $bin: no yyparse/yylex/lower_model/autodiff_build; ran bert_tiny.hpc on the cpu ($out)"
