/* runtime/cuda/cublaslt_calls.h — turns the cublasLt* calls of the file that
 * includes it into calls through the loaded table (cuda/cublaslt_load.h),
 * so that code written against <cublasLt.h> needs no libcublasLt at link
 * time.  Include it after every other header, in .c files only, and call
 * cublaslt_load() (gemm_init does) before the first cuBLASLt call: the
 * table is NULL until then. */
#ifndef HPC_RUNTIME_CUDA_CUBLASLT_CALLS_H
#define HPC_RUNTIME_CUDA_CUBLASLT_CALLS_H

#include "cuda/cublaslt_load.h"

#define cublasLtCreate (cublaslt()->cublasLtCreate)
#define cublasLtDestroy (cublaslt()->cublasLtDestroy)
#define cublasLtGetVersion (cublaslt()->cublasLtGetVersion)
#define cublasLtGetStatusName (cublaslt()->cublasLtGetStatusName)
#define cublasLtGetStatusString (cublaslt()->cublasLtGetStatusString)
#define cublasLtMatmul (cublaslt()->cublasLtMatmul)
#define cublasLtMatmulAlgoCheck (cublaslt()->cublasLtMatmulAlgoCheck)
#define cublasLtMatmulAlgoGetHeuristic (cublaslt()->cublasLtMatmulAlgoGetHeuristic)
#define cublasLtMatmulDescCreate (cublaslt()->cublasLtMatmulDescCreate)
#define cublasLtMatmulDescDestroy (cublaslt()->cublasLtMatmulDescDestroy)
#define cublasLtMatmulDescSetAttribute (cublaslt()->cublasLtMatmulDescSetAttribute)
#define cublasLtMatmulPreferenceCreate (cublaslt()->cublasLtMatmulPreferenceCreate)
#define cublasLtMatmulPreferenceDestroy (cublaslt()->cublasLtMatmulPreferenceDestroy)
#define cublasLtMatmulPreferenceSetAttribute (cublaslt()->cublasLtMatmulPreferenceSetAttribute)
#define cublasLtMatrixLayoutCreate (cublaslt()->cublasLtMatrixLayoutCreate)
#define cublasLtMatrixLayoutDestroy (cublaslt()->cublasLtMatrixLayoutDestroy)
#define cublasLtMatrixLayoutSetAttribute (cublaslt()->cublasLtMatrixLayoutSetAttribute)

#endif
