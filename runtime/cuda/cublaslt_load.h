/* runtime/cuda/cublaslt_load.h — cuBLASLt, loaded at run time.
 *
 * Why: a program linked against libcublasLt runs the library's static
 * initialisers before main() — 0.14 s and 210 MB of touched memory on
 * this project's 2-core box, for every start of bin/hpc, `hpc check`
 * included.  hpc links no cuBLAS: cublaslt_load() dlopens
 * "libcublasLt.so.<major>" (the toolkit's, found through the executable's
 * run path; or the path in $HPC_CUBLASLT) and resolves each function into a
 * table, like the driver (cuda/cuda_driver.h).  cublaslt_load_ahead()
 * starts that on a thread of its own; the GPU opened ahead
 * (cuda_device_open_ahead) calls it once libcuda is found (so a machine
 * without a driver never loads cuBLASLt): at the start of `hpc run` the
 * initialisers run while cuInit does, the artifact is read and the
 * parameters drawn.  The first cublaslt_load() waits for it.
 *
 * Callers: runtime/cuda/gemm_cublas.c includes cuda/cublaslt_calls.h, which
 * turns its cublasLt* calls into calls through the table, after gemm_init's
 * cublaslt_load; cuda_check_cublas names a status from the table when it is
 * loaded, else from a built-in list.
 *
 * Thread safety: cublaslt_load is idempotent and may be called from any
 * thread (the first result stays); the table is read-only afterwards.
 */
#ifndef HPC_RUNTIME_CUDA_CUBLASLT_LOAD_H
#define HPC_RUNTIME_CUDA_CUBLASLT_LOAD_H

#include "util/error.h"

/* cublasLt.h declares one function without a prototype; keep our strict
 * warnings for our own code. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

/* Every cuBLASLt function hpc uses, once. */
#define CUBLASLT_FUNCTIONS(X)                                                             \
    X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetVersion)                            \
    X(cublasLtGetStatusName) X(cublasLtGetStatusString) X(cublasLtMatmul)                 \
    X(cublasLtMatmulAlgoCheck) X(cublasLtMatmulAlgoGetHeuristic)                          \
    X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute) \
    X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)                  \
    X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatrixLayoutCreate)                 \
    X(cublasLtMatrixLayoutDestroy) X(cublasLtMatrixLayoutSetAttribute)

typedef struct {
#define CUBLASLT_MEMBER(name) __typeof__(name) *name;
    CUBLASLT_FUNCTIONS(CUBLASLT_MEMBER)
#undef CUBLASLT_MEMBER
    void *lib;            /* dlopen handle */
    char path[256];       /* what was opened */
} CublasLt;

/* Loads the library once (later calls return the first result).
 * HPC_ERR_NO_GPU when it or one of its functions is missing, naming what
 * and what to do. */
HpcStatus cublaslt_load(HpcError *err);

/* The loaded table, or NULL before a successful cublaslt_load. */
const CublasLt *cublaslt(void);

/* Starts cublaslt_load on a thread of its own (idempotent; HPC_START_OVERLAP=0
 * turns it off); its result is the one every later cublaslt_load returns. */
void cublaslt_load_ahead(void);
/* Waits for the thread cublaslt_load_ahead started, if any (before exit:
 * see cuda_ahead_join in cuda/cuda_driver.h). */
void cublaslt_load_join(void);

#endif
