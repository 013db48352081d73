/* runtime/formats/tensor_finite.h — refuse weights that hold NaN or inf.
 *
 * Every path that reads weights from a file (`--init`, `--resume`, the C
 * API's hpc_model_load_weights) passes each tensor it uses through
 * tensor_check_finite, so a corrupt or diverged checkpoint stops the run
 * with a message naming the file, the tensor and the first bad element,
 * instead of training on (or predicting from) numbers that are silently
 * wrong.  The scan reads the stored bits (exponent all ones means inf or
 * NaN), so it needs no alignment and no conversion, and it is cheap next to
 * reading the file: one pass, no allocation.
 *
 * Usage:
 *   HpcStatus st = tensor_check_finite("ckpt/model.safetensors", t->name,
 *                                      t->dtype, t->data, t->numel, &err);
 */
#ifndef HPC_RUNTIME_TENSOR_FINITE_H
#define HPC_RUNTIME_TENSOR_FINITE_H

#include <stdint.h>

#include "formats/safetensors.h"
#include "util/error.h"

/* Index of the first inf or NaN among numel elements of dtype stored at
 * data (any alignment), or -1 when all are finite.  Integer and boolean
 * dtypes are always finite; F8 types are checked by their own rules
 * (E4M3: only NaN exists, S.1111.111; E5M2: exponent 11111). */
int64_t tensor_first_nonfinite(StDtype dtype, const void *data, uint64_t numel);

/* HPC_OK when every element is finite; else HPC_ERR_INPUT with
 *   "FILE: tensor NAME holds NaN at element I (of N); ..."
 * naming what the bad value is and what to do.  file and tensor only
 * appear in the message. */
HpcStatus tensor_check_finite(const char *file, const char *tensor, StDtype dtype, const void *data,
                              uint64_t numel, HpcError *err);

#endif
