#!/bin/sh
# tools/cuemu/run.sh BIN... — runs GPU check programs on the CPU through the
# CUDA emulator (cuemu.h), one after another; exits non-zero if any fails.
# HPC_EMU_CACHE (default: a fresh directory under build/cuemu) keeps the
# modules g++ built; the kernel cache goes there too, apart from the GPU's.
set -u
root=${HPC_ROOT:-$(pwd)}
lib="$root/build/cuemu/libcuemu.so"
[ -f "$lib" ] || { echo "run.sh: $lib is missing: make build/cuemu/libcuemu.so" >&2; exit 2; }
cache=${HPC_EMU_CACHE:-$root/build/cuemu/cache}
mkdir -p "$cache"
fail=0
for bin in "$@"; do
    name=$(basename "$bin")
    start=$(date +%s)
    HPC_GPU_TEST_NO_TIMING=1 HPC_GEMM_AUTOTUNE=${HPC_GEMM_AUTOTUNE:-0} HPC_CUDA_DRIVER="$lib" HPC_CUBLASLT="$lib" HPC_CUDA_EMU=1 HPC_EMU_CACHE="$cache" \
        HPC_CACHE_DIR="$cache/kernels" HPC_ROOT="$root" "$bin"
    rc=$?
    echo "$name (emulated): rc=$rc in $(( $(date +%s) - start )) s"
    [ $rc -eq 0 ] || fail=1
done
exit $fail
