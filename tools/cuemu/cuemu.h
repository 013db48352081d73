/* tools/cuemu/cuemu.h — what the files of the CUDA emulator share.
 *
 * The emulator is one shared library, build/cuemu/libcuemu.so, that stands
 * in for both libcuda.so.1 and libcublasLt.so on a machine without a GPU:
 * point HPC_CUDA_DRIVER and HPC_CUBLASLT at it and set HPC_CUDA_EMU=1 (so
 * that nvrtc_compile hands over the source instead of a cubin), and hpc's
 * cuda backend runs unchanged, on the CPU, slowly.  "Device" memory is host
 * memory (a CUdeviceptr is the address), every stream runs its work at once
 * in the calling thread, and a captured stream records its work into a
 * graph that cuGraphLaunch replays in the same order.  Kernels run as
 * fibers, one per CUDA thread (tools/cuemu/emu_kernel.h); GEMMs run as
 * plain loops in float (tools/cuemu/emu_cublaslt.c).
 *
 * It checks what the code does, not how fast: indexing, phases, launch
 * shapes, graphs, the arena.  It cannot say anything about races between
 * warps that the GPU would expose, nor about the hardware's reading of an
 * instruction the emulator implements from the PTX manual. */
#ifndef HPC_TOOLS_CUEMU_H
#define HPC_TOOLS_CUEMU_H

#include <cuda.h>
#include <stddef.h>

/* Runs fn(arg) in stream order: at once, or, while the stream is being
 * captured, when the captured graph is launched (then arg is copied now:
 * size bytes).  Returns CUDA_SUCCESS or the error of a bad stream. */
CUresult emu_stream_enqueue(CUstream stream, void (*fn)(void *arg), const void *arg, size_t size);

/* Whether p .. p+bytes lies inside one live allocation of cuMemAlloc
 * (the emulator's bounds check for copies and GEMM operands). */
int emu_mem_valid(const void *p, size_t bytes);

/* Prints "cuemu: ..." to stderr and aborts: a use of the API that the
 * real library would reject or that the emulator does not implement. */
void emu_die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

#endif
