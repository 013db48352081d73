/* program/act_parts.h — how ACT_BWD_BGRAD (the activation backward with
 * its bias gradient, compiler/emit_ops_act.c) splits its R rows for the
 * column sums: P partial rows of f32, each the sum of a share of the rows,
 * which a second kernel adds up per column.  P = ceil(R / G) <= ACT_PARTS
 * for the group size G below.  Shared by the emitted kernels and by hpc's
 * own dX + GELU-backward GEMM (runtime/cuda/gemm_own.h), which writes the
 * partials when the executor runs it in that node's place.  The emitted
 * first phase sums rows r, r + P, r + 2 P, ... into partial r, the GEMM
 * rows r G .. r G + G - 1: any split into P shares will do. */
#ifndef HPC_PROGRAM_ACT_PARTS_H
#define HPC_PROGRAM_ACT_PARTS_H

#include <stdint.h>

#define ACT_PARTS 512     /* at most this many partial rows */
#define ACT_PART_ROWS 16  /* the smallest group */

/* G: ACT_PART_ROWS doubled until ACT_PARTS groups cover R rows. */
static inline int64_t act_part_group_rows(int64_t R)
{
    int64_t G = ACT_PART_ROWS;
    while (G * ACT_PARTS < R) G *= 2;
    return G;
}

/* The same as CUDA text, declaring G and P for R (a variable of the kernel). */
#define ACT_PARTS_CUDA_TEXT                                                                    \
    "    i64 G = " HPC_ACT_PARTS_STR(ACT_PART_ROWS) ";\n"                                      \
    "    while (G * " HPC_ACT_PARTS_STR(ACT_PARTS) " < R) G *= 2;\n"                            \
    "    const i64 P = (R + G - 1) / G;\n"
#define HPC_ACT_PARTS_STR_(x) #x
#define HPC_ACT_PARTS_STR(x) HPC_ACT_PARTS_STR_(x)

#endif
