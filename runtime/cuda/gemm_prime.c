/* runtime/cuda/gemm_prime.c — step 1's cuBLASLt first-use costs, paid
 * ahead and on several threads (see gemm_prime in gemm_cublas.h).
 *
 * Measured on the H200 (BERT-base fp16, warm caches, HPC_STARTUP=1): a
 * warm-up pass spent 0.25 s of host time inside cuBLASLt, not queueing
 * work but making its 17 plans (the first cuBLASLt query of a process pays
 * about 0.1 s of library set-up; each algorithm check and each kernel's
 * first launch a few ms more).  Plans with a cached algorithm do not
 * depend on each other, so workers make them (descriptors, algorithm
 * check) and run each one's first call at the same time, each worker on a
 * stream, cuBLASLt handle and workspace of its own.  cuBLASLt's own
 * documentation calls the library thread safe; the plans' descriptors are
 * only read by the other workers' calls.  gemm_library_warm_start moves
 * the one-time set-up earlier still, to the moment the context exists.
 */
#include "cuda/gemm_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cublaslt_load.h"
#include "util/phase_clock.h"
#include "cuda/cublaslt_calls.h"   /* last: cublasLt* through the loaded table */

typedef struct {
    GemmContext *g;
    CUcontext ctx;
    int index, stride;          /* this worker takes plans index, index + stride, ... */
    int made, calls;            /* deferred plans it made, first calls it ran */
    double setup, making, launching;   /* seconds: its stream, handle and workspace; plans; first calls */
    HpcStatus st;
    HpcError err;
} PrimeWorker;

/* A deferred plan made from its cached algorithm; false (descriptors
 * freed, still deferred) where the cache's choice does not check out, so
 * that the caller makes it the ordinary way. */
static bool make_deferred(GemmPlan *p, const GemmContext *g)
{
    HpcError ignore;
    if (!gemm_plan_descriptors(p, g, &p->first, &ignore) && gemm_plan_algo_cached(p, g)) {
        p->deferred = false;
        return true;
    }
    gemm_plan_descriptors_free(p);
    return false;
}

static void *prime_main(void *arg)
{
    PrimeWorker *w = arg;
    const CudaDriver *cu = cuda_driver();
    GemmContext mine = *w->g;   /* a copy: only the handle, stream and workspace differ */
    mine.lt = NULL;
    mine.stream = NULL;
    mine.workspace = 0;
    double t0 = phase_clock_now();
    w->st = CUDA_CHECK(&w->err, cu->cuCtxSetCurrent(w->ctx));
    if (!w->st) w->st = CUDA_CHECK(&w->err, cu->cuStreamCreate(&mine.stream, CU_STREAM_NON_BLOCKING));
    mine.workspace_held = mine.workspace_bytes;   /* its own, for any algorithm within the limit */
    mine.retired = NULL;
    mine.retired_bytes = 0;
    mine.n_retired = 0;
    if (!w->st) w->st = CUDA_CHECK(&w->err, cu->cuMemAlloc(&mine.workspace, mine.workspace_held));
    if (!w->st) w->st = CUDA_CHECK(&w->err, cublasLtCreate(&mine.lt));
    w->setup = phase_clock_now() - t0;
    for (int i = w->index; i < w->g->num_plans && !w->st; i += w->stride) {
        GemmPlan *p = &w->g->plans[i];
        if (!p->recorded || p->primed) continue;
        double t1 = phase_clock_now();
        if (p->deferred) {
            if (!make_deferred(p, w->g)) continue;   /* left to gemm_prime's caller */
            w->made++;
        } else {
            w->st = gemm_plan_point(p, &p->first, &w->err);   /* each plan is one worker's alone */
            if (w->st) break;
        }
        double t2 = phase_clock_now();
        w->st = CUDA_CHECK(&w->err, gemm_matmul_with(&mine, p, &p->first, &p->algo));
        p->primed = !w->st;
        w->calls++;
        w->making += t2 - t1;
        w->launching += phase_clock_now() - t2;
    }
    if (mine.stream && !w->st) w->st = CUDA_CHECK(&w->err, cu->cuStreamSynchronize(mine.stream));
    if (mine.workspace) cu->cuMemFree(mine.workspace);
    if (mine.lt) cublasLtDestroy(mine.lt);
    if (mine.stream) cu->cuStreamDestroy(mine.stream);
    return NULL;
}

HpcStatus gemm_prime(GemmContext *g, CUcontext ctx, int threads, GemmPrimeStats *stats, HpcError *err)
{
    enum { MAX_THREADS = 16 };
    memset(stats, 0, sizeof *stats);
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    double t0 = phase_clock_now();
    PrimeWorker w[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int k = 0; k < threads; k++) {
        w[k] = (PrimeWorker){.g = g, .ctx = ctx, .index = k, .stride = threads};
        started[k] = threads > 1 && pthread_create(&tid[k], NULL, prime_main, &w[k]) == 0;
    }
    for (int k = 0; k < threads; k++)
        if (!started[k]) prime_main(&w[k]);   /* one thread, or none to be had: here, after the others started */
    HpcStatus st = HPC_OK;
    for (int k = 0; k < threads; k++) {
        if (started[k]) pthread_join(tid[k], NULL);
        stats->made += w[k].made;
        stats->calls += w[k].calls;
        if (w[k].setup > stats->setup) stats->setup = w[k].setup;
        if (w[k].making > stats->making) stats->making = w[k].making;
        if (w[k].launching > stats->launching) stats->launching = w[k].launching;
        if (w[k].st && !st) {
            *err = w[k].err;
            st = w[k].st;
        }
    }
    g->tune_hits += stats->made;
    gemm_library_warm_join();   /* the workers ran beside it: cuBLASLt's own locks order the set-up */
    /* What the workers could not make (a cached choice that no longer
     * checks out) is made here, the ordinary way, and run once. */
    for (int i = 0; i < g->num_plans && !st; i++) {
        GemmPlan *p = &g->plans[i];
        if (!p->recorded || p->primed) continue;
        if (p->deferred) {
            st = gemm_plan_complete(g, p, err);
            stats->made_here++;
        } else {
            st = gemm_plan_point(p, &p->first, err);
        }
        if (!st) st = gemm_workspace_reserve(g, p->ws_need, err);
        if (!st) st = CUDA_CHECK(err, gemm_matmul_with(g, p, &p->first, &p->algo));
        p->primed = !st;
        stats->calls++;
    }
    stats->threads = threads;
    stats->seconds = phase_clock_now() - t0;
    return st;
}

/* ---- the library's one-time set-up, at the moment the context exists --- */

static pthread_t warm_thread;
static bool warm_running;
static pthread_mutex_t warm_lock = PTHREAD_MUTEX_INITIALIZER;

/* One tiny f16 GEMM through the heuristic on a handle of its own: the
 * first query and the first launch of a process pay cuBLASLt's set-up. */
static void *warm_main(void *arg)
{
    CUcontext ctx = arg;
    const CudaDriver *cu = cuda_driver();
    enum { N = 64 };
    HpcError ignore;
    double began = phase_clock_now(), queried = 0, launched = 0;
    if (cu->cuCtxSetCurrent(ctx) != CUDA_SUCCESS || cublaslt_load(&ignore)) return NULL;
    cublasLtHandle_t lt = NULL;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t l = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    CUstream stream = NULL;
    CUdeviceptr buf = 0;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    float one = 1.0f, zero = 0.0f;
    if (cu->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS &&
        cu->cuMemAlloc(&buf, 3 * N * N * 2) == CUDA_SUCCESS &&
        cu->cuMemsetD8Async(buf, 0, 3 * N * N * 2, stream) == CUDA_SUCCESS &&
        cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatrixLayoutCreate(&l, CUDA_R_16F, N, N, N) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
        cublasLtMatmulAlgoGetHeuristic(lt, op, l, l, l, l, pref, 1, &res, &found) == CUBLAS_STATUS_SUCCESS &&
        found > 0) {
        queried = phase_clock_now();
        void *a = (void *)(uintptr_t)buf, *b = (void *)(uintptr_t)(buf + N * N * 2),
             *c = (void *)(uintptr_t)(buf + 2 * N * N * 2);
        if (cublasLtMatmul(lt, op, &one, a, l, b, l, &zero, c, l, c, l, &res.algo, NULL, 0,
                           (cudaStream_t)stream) == CUBLAS_STATUS_SUCCESS &&
            cu->cuStreamSynchronize(stream) == CUDA_SUCCESS)
            launched = phase_clock_now();
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (l) cublasLtMatrixLayoutDestroy(l);
    if (op) cublasLtMatmulDescDestroy(op);
    if (lt) cublasLtDestroy(lt);
    if (stream) {
        cu->cuStreamSynchronize(stream);
        cu->cuStreamDestroy(stream);
    }
    if (buf) cu->cuMemFree(buf);
    if (launched > 0)
        phase_spanf(began, phase_clock_now(), "cuBLASLt set-up ahead, one 64 x 64 GEMM on a thread of its own "
                    "(to its first query %.3f s, its first launch %.3f s)", queried - began, launched - queried);
    return NULL;
}

void gemm_library_warm_start(CUcontext ctx)
{
    pthread_mutex_lock(&warm_lock);
    if (!warm_running) warm_running = pthread_create(&warm_thread, NULL, warm_main, ctx) == 0;
    pthread_mutex_unlock(&warm_lock);
}

void gemm_library_warm_join(void)
{
    pthread_mutex_lock(&warm_lock);
    if (warm_running) {
        pthread_join(warm_thread, NULL);
        warm_running = false;
    }
    pthread_mutex_unlock(&warm_lock);
}
