/* tools/cuemu/include/cuda_bf16.h — the part of the toolkit's bfloat16
 * type that CUDA sources hpc compiles use, for the CPU emulator (see
 * cuda_fp16.h beside it). */
#ifndef HPC_TOOLS_CUEMU_CUDA_BF16_H
#define HPC_TOOLS_CUEMU_CUDA_BF16_H

struct __nv_bfloat16 { unsigned short x; };
static inline float __bfloat162float(__nv_bfloat16 h) { return emu::bf16_to_float(h.x); }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16{emu::float_to_bf16_rn(f)}; }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __float2bfloat16(f); }

#endif
