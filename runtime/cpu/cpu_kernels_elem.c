/* runtime/cpu/cpu_kernels_elem.c — elementwise kernels, dropout, embedding,
 * layout copies and array helpers (contracts in cpu_kernels.h).
 *
 * Activations are evaluated in double and rounded once to the element type,
 * so the f32 versions are as close to the exact value as a float can be;
 * the CUDA kernels are held to these within their dtype's tolerance. */
#include <math.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_kernels_tmpl.h"
#include "cpu/philox.h"

#include "program/activations.h" /* the reference functions, in double */

/* Every id in [0, V), or HPC_ERR_INPUT naming the first one that is not. */
static HpcStatus ck_check_ids(const char *fn, const int32_t *ids, int64_t n, int64_t V,
                              HpcError *err)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return hpc_fail(err, HPC_ERR_INPUT,
                            "%s: token id %d at position %lld of the batch is outside the vocabulary "
                            "[0, %lld); check that the data was tokenized with a vocabulary "
                            "no larger than the model's vocab_size",
                            fn, (int)ids[i], (long long)i, (long long)V);
    return HPC_OK;
}

#define REAL float
#define CK_SFX _f32
#include "cpu/cpu_kernels_elem.inc"
#undef REAL
#undef CK_SFX

#define REAL double
#define CK_SFX _f64
#include "cpu/cpu_kernels_elem.inc"
#undef REAL
#undef CK_SFX

void ck_copy_f32_to_f64(double *dst, const float *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = src[i];
}

void ck_copy_f64_to_f32(float *dst, const double *src, int64_t n)
{
    for (int64_t i = 0; i < n; i++) dst[i] = (float)src[i];
}
