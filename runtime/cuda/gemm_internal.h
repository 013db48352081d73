/* runtime/cuda/gemm_internal.h — what gemm_cublas.c and gemm_prime.c share:
 * a plan (the cuBLASLt descriptors and algorithm of one GEMM shape) and the
 * steps that make and run one.  Not for use outside runtime/cuda/gemm_*.c.
 *
 * A plan recorded under GemmContext.record_only with a cached algorithm is
 * "deferred": key, epilogue and first call are set, the descriptors are
 * not; gemm_prime's workers make them (gemm_plan_descriptors, then
 * gemm_plan_algo_cached), and whatever they cannot make gemm_plan_complete
 * makes the ordinary way, heuristic and timing included, on the caller's
 * thread.
 */
#ifndef HPC_RUNTIME_CUDA_GEMM_INTERNAL_H
#define HPC_RUNTIME_CUDA_GEMM_INTERNAL_H

#include "cuda/gemm_cublas.h"

/* What decides descriptors and algorithm; pointers only by their alignment. */
typedef struct {
    int64_t M, N, K, batch, lda, ldb, ldc, stride_a, stride_b, stride_c, ld_aux;
    int trans_a, trans_b, ab_type, c_type, epilogue, allow_tf32;
    int optional;               /* gemm_run_optional: the epilogue may be dropped */
    int reads_c;                /* beta != 0: timed (and cached) apart from beta = 0 */
    int pointer_array;          /* A, B, C are arrays of matrix pointers (GemmDesc.pointer_array) */
    int align_a, align_b, align_c, align_d, align_bias, align_aux;
} PlanKey;

struct GemmPlan {
    PlanKey key;
    GemmEpilogue epilogue;               /* what it runs: key.epilogue, or NONE for an optional one cuBLASLt lacks */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;   /* cuBLASLt's A (our B), B (our A), C */
    cublasLtMatmulAlgo_t algo;
    size_t ws_need;                      /* workspace bytes algo needs (cublasLtMatmulAlgoCheck) */
    GemmDesc first;                      /* its first call while recording (gemm_prime runs it) */
    bool recorded;                       /* first is set */
    bool deferred;                       /* descriptors and algorithm not made yet (see above) */
    bool primed;                         /* gemm_prime has run first */
};

/* The layouts and matmul descriptor of p for d (p->key, p->epilogue set),
 * pointing at d's bias and aux.  Thread-safe for different plans. */
HpcStatus gemm_plan_descriptors(GemmPlan *p, const GemmContext *g, const GemmDesc *d, HpcError *err);
void gemm_plan_descriptors_free(GemmPlan *p);

/* Points p's descriptor at d's bias and aux (a plan made for one call and
 * run for another: the descriptor holds the last call's pointers). */
HpcStatus gemm_plan_point(GemmPlan *p, const GemmDesc *d, HpcError *err);

/* p's algorithm from the tuning cache if cuBLASLt accepts it for p's
 * descriptors (cublasLtMatmulAlgoCheck); false otherwise.  Reads g only. */
bool gemm_plan_algo_cached(GemmPlan *p, const GemmContext *g);

/* Makes a deferred plan (or one a worker gave up on) the ordinary way. */
HpcStatus gemm_plan_complete(GemmContext *g, GemmPlan *p, HpcError *err);

/* Grows g's workspace to hold at least `need` bytes (p->ws_need of a plan
 * about to run on g), and notes whether that call is being captured. */
HpcStatus gemm_workspace_reserve(GemmContext *g, size_t need, HpcError *err);

/* One cublasLtMatmul of d with p and algo, on g's handle, workspace and stream. */
cublasStatus_t gemm_matmul_with(const GemmContext *g, const GemmPlan *p, const GemmDesc *d,
                                const cublasLtMatmulAlgo_t *algo);

#endif
