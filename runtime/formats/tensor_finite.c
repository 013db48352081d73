/* runtime/formats/tensor_finite.c — see tensor_finite.h. */
#include "formats/tensor_finite.h"

#include <math.h>
#include <string.h>

/* First element whose bits under `exp_mask` are all ones (inf or NaN in an
 * IEEE format of `size` bytes), or -1. */
static int64_t first_all_ones(const unsigned char *p, uint64_t numel, size_t size, uint64_t exp_mask)
{
    for (uint64_t i = 0; i < numel; i++, p += size) {
        uint64_t bits = 0;
        memcpy(&bits, p, size);   /* little-endian host: the low bytes are the value */
        if ((bits & exp_mask) == exp_mask) return (int64_t)i;
    }
    return -1;
}

/* F8_E4M3 (the "fn" variant): no inf, NaN is S.1111.111. */
static int64_t first_e4m3_nan(const unsigned char *p, uint64_t numel)
{
    for (uint64_t i = 0; i < numel; i++)
        if ((p[i] & 0x7f) == 0x7f) return (int64_t)i;
    return -1;
}

int64_t tensor_first_nonfinite(StDtype dtype, const void *data, uint64_t numel)
{
    const unsigned char *p = data;
    switch (dtype) {
    case ST_F64: return first_all_ones(p, numel, 8, 0x7ff0000000000000ull);
    case ST_F32: return first_all_ones(p, numel, 4, 0x7f800000u);
    case ST_F16: return first_all_ones(p, numel, 2, 0x7c00u);
    case ST_BF16: return first_all_ones(p, numel, 2, 0x7f80u);
    case ST_F8_E5M2: return first_all_ones(p, numel, 1, 0x7cu);
    case ST_F8_E4M3: return first_e4m3_nan(p, numel);
    default: return -1;   /* integers and booleans */
    }
}

/* The element's value as a double, for the message. */
static double element_value(StDtype dtype, const unsigned char *p)
{
    uint64_t bits = 0;
    memcpy(&bits, p, st_dtype_size(dtype));
    uint64_t mant;
    bool neg;
    switch (dtype) {
    case ST_F64: mant = bits & 0xfffffffffffffull; neg = bits >> 63; break;
    case ST_F32: mant = bits & 0x7fffffu; neg = (bits >> 31) & 1; break;
    case ST_F16: mant = bits & 0x3ffu; neg = (bits >> 15) & 1; break;
    case ST_BF16: mant = bits & 0x7fu; neg = (bits >> 15) & 1; break;
    case ST_F8_E5M2: mant = bits & 0x3u; neg = (bits >> 7) & 1; break;
    default: return NAN;   /* E4M3 has only NaN */
    }
    if (mant) return NAN;
    return neg ? -INFINITY : INFINITY;
}

HpcStatus tensor_check_finite(const char *file, const char *tensor, StDtype dtype, const void *data,
                              uint64_t numel, HpcError *err)
{
    int64_t bad = tensor_first_nonfinite(dtype, data, numel);
    if (bad < 0) return HPC_OK;
    double v = element_value(dtype, (const unsigned char *)data + (size_t)bad * st_dtype_size(dtype));
    return hpc_fail(err, HPC_ERR_INPUT,
                    "%.300s: tensor '%.200s' holds %s at element %lld (of %llu); the weights are corrupt or come from a "
                    "diverged run: use a checkpoint whose weights are finite",
                    file, tensor, isnan(v) ? "NaN" : v > 0 ? "inf" : "-inf", (long long)bad,
                    (unsigned long long)numel);
}
