/* runtime/cpu/cpu_kernels_norm.c — kernels that reduce along rows or columns:
 * bias, LayerNorm, attention softmax, cross-entropy and MSE (contracts in
 * cpu_kernels.h).  Every reduction accumulates in double, in both
 * precisions, so the f32 versions are a tight reference for fp16/bf16/f32
 * CUDA kernels. */
#include <math.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_kernels_tmpl.h"

/* Column reductions walk the rows once per chunk of this many columns, with
 * double accumulators on the stack. */
#define CK_COL_CHUNK 256

/* Every label is CK_IGNORE_INDEX or in [0, C); else HPC_ERR_INPUT. */
static HpcStatus ck_check_labels(const int32_t *labels, int64_t N, int64_t C, HpcError *err)
{
    for (int64_t i = 0; i < N; i++)
        if (labels[i] != CK_IGNORE_INDEX && (labels[i] < 0 || labels[i] >= C))
            return hpc_fail(err, HPC_ERR_INPUT,
                            "cross-entropy: label %d in row %lld of the batch is outside [0, %lld) and is "
                            "not the ignore index %d; check num_labels in the model against "
                            "the labels in the data",
                            (int)labels[i], (long long)i, (long long)C, CK_IGNORE_INDEX);
    return HPC_OK;
}

static int64_t ck_count_labelled(const int32_t *labels, int64_t N)
{
    int64_t count = 0;
    for (int64_t i = 0; i < N; i++) count += labels[i] != CK_IGNORE_INDEX;
    return count;
}

/* Whether key k is visible to query q of batch row b (see the softmax contract). */
static bool ck_key_visible(const int32_t *mask, bool causal, int64_t b, int64_t q, int64_t k,
                           int64_t Lq, int64_t Lk)
{
    if (mask && mask[b * Lk + k] == 0) return false;
    return !causal || k <= q + (Lk - Lq);
}

#define REAL float
#define CK_SFX _f32
#include "cpu/cpu_kernels_norm.inc"
#undef REAL
#undef CK_SFX

#define REAL double
#define CK_SFX _f64
#include "cpu/cpu_kernels_norm.inc"
#undef REAL
#undef CK_SFX
