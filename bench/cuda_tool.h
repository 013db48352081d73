/* bench/cuda_tool.h — what bench/'s stand-alone cuBLASLt tools
 * (gemm_candidates.c, dw_batched.c, dw_ptr_check.c) share.  Those link the CUDA runtime and
 * cuBLASLt directly, not hpc's libraries, so this is header-only:
 *   TOOL_CHECK_CUDA(x)   exits with TOOL_NAME, file, line and CUDA's message;
 *   tool_random_f16(n)   a device buffer of n random f16 multiples of 1/4000
 *                        in [-0.25, 0.25] (rand(): seed it for repeatable data);
 *   tool_setup(...)      device 0, a stream, two events and a workspace;
 *   tool_best_us(...)    run(ctx) `runs` times between two events, `rounds`
 *                        times over: the best round's microseconds a run, or
 *                        -1 when run fails (returns 0);
 *   tool_dw_desc(...)    hpc's dW GEMM as cuBLASLt sees it, batched or not
 *                        (dw_batched.c, dw_ptr_check.c).
 * Define TOOL_NAME (a string) before including it. */
#ifndef HPC_BENCH_CUDA_TOOL_H
#define HPC_BENCH_CUDA_TOOL_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define TOOL_CHECK_CUDA(x)                                                                         \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s: %s:%d: %s\n", TOOL_NAME, __FILE__, __LINE__, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static inline void *tool_random_f16(size_t n)
{
    _Float16 *h = malloc(n * sizeof *h);
    if (!h) exit(1);
    for (size_t i = 0; i < n; i++) h[i] = (_Float16)((float)(rand() % 2001 - 1000) / 4000.0f);
    void *d = NULL;
    TOOL_CHECK_CUDA(cudaMalloc(&d, n * sizeof *h));
    TOOL_CHECK_CUDA(cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static inline void tool_setup(cudaStream_t *stream, cudaEvent_t *e0, cudaEvent_t *e1, void **workspace,
                              size_t workspace_bytes)
{
    TOOL_CHECK_CUDA(cudaSetDevice(0));
    TOOL_CHECK_CUDA(cudaStreamCreate(stream));
    TOOL_CHECK_CUDA(cudaEventCreate(e0));
    TOOL_CHECK_CUDA(cudaEventCreate(e1));
    TOOL_CHECK_CUDA(cudaMalloc(workspace, workspace_bytes));
}

static inline double tool_best_us(int (*run)(const void *ctx), const void *ctx, cudaStream_t stream, cudaEvent_t e0,
                                  cudaEvent_t e1, int rounds, int runs)
{
    double best = -1;
    for (int r = 0; r < rounds; r++) {
        TOOL_CHECK_CUDA(cudaEventRecord(e0, stream));
        for (int i = 0; i < runs; i++)
            if (!run(ctx)) return -1;
        TOOL_CHECK_CUDA(cudaEventRecord(e1, stream));
        TOOL_CHECK_CUDA(cudaEventSynchronize(e1));
        float ms = 0;
        TOOL_CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        double us = 1000.0 * ms / runs;
        if (best < 0 || us < best) best = us;
    }
    return best;
}

/* One dW GEMM of a BERT layer as hpc's executor calls it (runtime/cuda/
 * gemm_cublas.c maps row-major dW (out, in) = dy^T x to this): C (in, out)
 * column-major = A (x as (in, T)) B^T (dy as (out, T)), f16 in, f32 out,
 * f32 compute; with batch > 1 each layout gets the batch count and either
 * cuBLASLt's pointer-array mode or strides of one matrix.  Returns 0 when
 * cuBLASLt refuses a step (what the tools report as "-"). */
static inline int tool_dw_desc(cublasLtMatmulDesc_t *op, cublasLtMatrixLayout_t *la, cublasLtMatrixLayout_t *lb,
                               cublasLtMatrixLayout_t *lc, int out, int in, int T, int batch, int pointer_array)
{
    cublasOperation_t tn = CUBLAS_OP_N, tt = CUBLAS_OP_T;
    if (cublasLtMatmulDescCreate(op, CUBLAS_COMPUTE_32F, CUDA_R_32F) != CUBLAS_STATUS_SUCCESS) return 0;
    cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSA, &tn, sizeof tn);
    cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSB, &tt, sizeof tt);
    cublasLtMatrixLayoutCreate(la, CUDA_R_16F, in, T, in);
    cublasLtMatrixLayoutCreate(lb, CUDA_R_16F, out, T, out);
    cublasLtMatrixLayoutCreate(lc, CUDA_R_32F, in, out, in);
    if (batch < 2) return 1;
    uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
    int32_t n = batch;
    cublasLtMatrixLayout_t l[3] = {*la, *lb, *lc};
    int64_t strides[3] = {(int64_t)in * T, (int64_t)out * T, (int64_t)in * out};
    for (int i = 0; i < 3; i++) {
        cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n);
        if (pointer_array &&
            cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode) !=
                CUBLAS_STATUS_SUCCESS)
            return 0;
        if (!pointer_array)
            cublasLtMatrixLayoutSetAttribute(l[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
                                             sizeof strides[i]);
    }
    return 1;
}

#endif
