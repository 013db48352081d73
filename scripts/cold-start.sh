#!/bin/sh
# Cold start of a training run on the GPU: seconds from `hpc run` to the end
# of the first step of BERT-base fp16, where they went, and how many NVRTC
# compiles it took (HPC_STARTUP=1 prints the phases and a summary line after
# step 1: util/phase_clock.h, runtime/train/train_cuda.c).
# Three starts, each with its own kernel cache directory:
#   cold   empty cache, artifact without cubins: NVRTC compiles the step
#          module (one module: the optimizer is part of it), with NVRTC's
#          own cache off (--no-cache: NVRTC 12.9+ caches on the machine, so
#          without it only the first process of a fresh machine is cold)
#   warm   the same cache again (twice: warm2): the step module and the GEMM choices are
#          cache hits
#   ahead  empty cache, artifact compiled with --arch 90: the step module is
#          the artifact's cubin, no NVRTC at all (GEMM autotune times again:
#          its cache is empty)
#   serial-nvrtc  as cold, with HPC_NVRTC_SPLIT=1 (NVRTC on one thread
#          instead of every core: runtime/cuda/nvrtc_compile.h)
#   serial as warm, with HPC_START_OVERLAP=0 HPC_WARMUP=0: the GPU opened,
#          cuBLASLt loaded and the parameters drawn one after the other,
#          no warm-up pass (what the overlap saves; docs/cuda.md)
# Work on other threads beside the phases prints as "span" lines.
# and one CoLA fine-tune over every padded length, counting NVRTC compiles.
# Run from the repository root on the GPU machine with the binaries built:
#   sh scripts/cold-start.sh
set -eu
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bin/hpc compile models/bert_base.model --fp16 -o "$tmp/bert_base.hpc" >/dev/null
bin/hpc compile models/bert_base.model --fp16 --arch 90 -o "$tmp/bert_base_sm90.hpc" >/dev/null
start() {   # $1 label, $2 artifact, $3 cache dir [, $4... VAR=value for the environment]
    label=$1 artifact=$2 cache=$3
    shift 3
    out=$(env "$@" HPC_STARTUP=1 HPC_CACHE_DIR="$cache" bin/hpc run "$artifact" --device cuda --steps 1 2>&1 || true)
    line=$(printf '%s\n' "$out" | grep 'hpc profile: cold start' || true)
    echo "$label: ${line:-no profile line (did the run fail?)}"
    if [ -z "$line" ]; then printf '%s\n' "$out" | tail -5; fi
    printf '%s\n' "$out" | grep -E 'hpc profile: start-up (phase|phases|span) ' | sed "s/^hpc profile: start-up /  $label /" || true
}
start cold "$tmp/bert_base.hpc" "$tmp/cache1" HPC_NVRTC_OPTIONS=--no-cache
# the same options as cold (they are part of the kernel cache's key)
start warm "$tmp/bert_base.hpc" "$tmp/cache1" HPC_NVRTC_OPTIONS=--no-cache
start warm2 "$tmp/bert_base.hpc" "$tmp/cache1" HPC_NVRTC_OPTIONS=--no-cache
start serial "$tmp/bert_base.hpc" "$tmp/cache1" HPC_NVRTC_OPTIONS=--no-cache HPC_START_OVERLAP=0 HPC_WARMUP=0
start ahead "$tmp/bert_base_sm90.hpc" "$tmp/cache2"
start serial-nvrtc "$tmp/bert_base.hpc" "$tmp/cache4" HPC_NVRTC_OPTIONS=--no-cache HPC_NVRTC_SPLIT=1
echo "CoLA fine-tune, every padded length (one compile per module wanted):"
HPC_NVRTC_OPTIONS=--no-cache HPC_STARTUP=1 HPC_CACHE_DIR="$tmp/cache3" bin/hpc run "$tmp/bert_base.hpc" --device cuda --task cola \
    --steps 200 2>&1 | grep -E 'hpc profile: cold start|backend cuda' | head -3
