/* runtime/cpu/cpu_kernels_tmpl.h — one kernel body for two precisions.
 *
 * Each runtime/cpu_kernels_FAMILY.c defines its bodies once, in
 * cpu_kernels_FAMILY.inc, written with REAL for the element type and
 * CK_FN(name) for the public name; the .c includes the .inc twice:
 *
 *   #define REAL float
 *   #define CK_SFX _f32
 *   #include "cpu/cpu_kernels_elem.inc"      // defines ck_gelu_fwd_f32, ...
 *   #undef REAL
 *   #undef CK_SFX
 *   ... and again with double / _f64.
 *
 * Private to the cpu kernels; nothing else includes it.
 */
#ifndef HPC_RUNTIME_CPU_KERNELS_TMPL_H
#define HPC_RUNTIME_CPU_KERNELS_TMPL_H

#define CK_CAT_(a, b) a##b
#define CK_CAT(a, b) CK_CAT_(a, b)
/* CK_FN(ck_gelu_fwd) -> ck_gelu_fwd_f32 while CK_SFX is _f32. */
#define CK_FN(name) CK_CAT(name, CK_SFX)

#endif
