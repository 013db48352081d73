/* bench/cuda_tool.h — what bench/'s stand-alone cuBLASLt tools
 * (gemm_candidates.c, dw_batched.c) share.  Those link the CUDA runtime and
 * cuBLASLt directly, not hpc's libraries, so this is header-only:
 *   TOOL_CHECK_CUDA(x)   exits with TOOL_NAME, file, line and CUDA's message;
 *   tool_random_f16(n)   a device buffer of n random f16 multiples of 1/4000
 *                        in [-0.25, 0.25] (rand(): seed it for repeatable data);
 *   tool_setup(...)      device 0, a stream, two events and a workspace;
 *   tool_best_us(...)    run(ctx) `runs` times between two events, `rounds`
 *                        times over: the best round's microseconds a run, or
 *                        -1 when run fails (returns 0).
 * Define TOOL_NAME (a string) before including it. */
#ifndef HPC_BENCH_CUDA_TOOL_H
#define HPC_BENCH_CUDA_TOOL_H

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

#endif
