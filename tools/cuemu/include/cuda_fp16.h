/* tools/cuemu/include/cuda_fp16.h — the part of the toolkit's half type
 * that CUDA sources hpc compiles (its tests' kernels) use, for the CPU
 * emulator; emu_module.c puts this directory before the toolkit's.  The
 * conversions are emu_kernel.h's (round to nearest even). */
#ifndef HPC_TOOLS_CUEMU_CUDA_FP16_H
#define HPC_TOOLS_CUEMU_CUDA_FP16_H

struct __half { unsigned short x; };
static inline float __half2float(__half h) { return emu::half_to_float(h.x); }
static inline __half __float2half(float f) { return __half{emu::float_to_half_rn(f)}; }
static inline __half __float2half_rn(float f) { return __float2half(f); }
static inline unsigned short __half_as_ushort(__half h) { return h.x; }
static inline __half __ushort_as_half(unsigned short u) { return __half{u}; }

#endif
