#!/bin/sh
# scripts/sass-stats.sh — registers, spills and static SASS of the step
# module's kernels, without a GPU: for judging a kernel change by its
# instructions before spending device time on it (docs/perf.md, thirteenth
# session).
#
#   sh scripts/sass-stats.sh [MODEL] [POLICY] [REGEX]
#     MODEL   a .model file (default models/bert_base.model)
#     POLICY  --fp16 (default), --bf16 or --fp32
#     REGEX   kernels to list (default: attn; grep -E on the kernel names)
#
# It runs `bin/hpc compile --emit-cuda` (the module hpc's cuda backend
# compiles), compiles it for sm_90 with nvcc (ptxas -v gives registers and
# spills) and disassembles each matching kernel with cuobjdump, then
# scripts/sass_loops.py counts its instructions and its largest loop's
# opcodes.  Local nvcc and the GPU machine's NVRTC may differ in version:
# compare two sources here, not here against there.
#
# cuobjdump is not in every CUDA toolkit install; CUOBJDUMP=path overrides,
# and PyPI has it: `pip download --no-deps nvidia-cuda-cuobjdump`, unzip the
# wheel, `chmod +x` its bin/cuobjdump.
set -eu
cd "$(dirname "$0")/.."
MODEL=${1:-models/bert_base.model}
POLICY=${2:---fp16}
REGEX=${3:-attn}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
NVCC=${NVCC:-$CUDA_HOME/bin/nvcc}
CUOBJDUMP=${CUOBJDUMP:-$(command -v cuobjdump || echo "$CUDA_HOME/bin/cuobjdump")}
[ -x bin/hpc ] || { echo "sass-stats: bin/hpc is missing; run make first" >&2; exit 1; }
[ -x "$NVCC" ] || { echo "sass-stats: no nvcc at $NVCC (set NVCC or CUDA_HOME)" >&2; exit 1; }
[ -x "$CUOBJDUMP" ] || { echo "sass-stats: no cuobjdump (set CUOBJDUMP; see the header of $0)" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
bin/hpc compile "$MODEL" "$POLICY" --no-artifact --emit-cuda "$TMP" > "$TMP/compile.txt" 2>&1 ||
    { cat "$TMP/compile.txt" >&2; exit 1; }
name=$(basename "$MODEL" .model)
cp "$TMP/${name}_step.cuh" "$TMP/step.cu"
"$NVCC" -arch=sm_90 -cubin -O3 -std=c++17 -Xptxas -v -o "$TMP/step.cubin" "$TMP/step.cu" 2> "$TMP/ptxas.txt"
"$CUOBJDUMP" -sass "$TMP/step.cubin" | sed -n 's/.*Function : \([A-Za-z0-9_]*\).*/\1/p' | grep -E "$REGEX" | sort |
while read -r fn; do
    echo "$fn"
    # ptxas -v: the few lines after "Compiling entry function 'fn'" hold
    # its spills and registers
    grep -A4 "entry function '$fn'" "$TMP/ptxas.txt" | grep -E "spill|Used" |
        sed 's/^ptxas info *: */  /; s/^ */  /' || true
    "$CUOBJDUMP" -sass -fun "$fn" "$TMP/step.cubin" | python3 scripts/sass_loops.py
done
