/* util/dtype.h — the precision names the compiler and the runtime share:
 * a storage or compute precision, or PREC_DEFAULT for "follow the run's
 * policy" (--fp16/--bf16/--fp32).  Apart from program/spec.h so that the
 * runtime's number code (runtime/cpu/half.h) needs no model description. */
#ifndef HPC_UTIL_DTYPE_H
#define HPC_UTIL_DTYPE_H

typedef enum { PREC_DEFAULT, PREC_FP32, PREC_FP16, PREC_BF16 } SpecPrecision;

#endif
