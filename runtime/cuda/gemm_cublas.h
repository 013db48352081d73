/* runtime/cuda/gemm_cublas.h — GEMMs through cuBLASLt, in row-major terms.
 *
 * Every matrix here is row-major (PyTorch layout); the module maps a call to
 * cuBLASLt's column-major view by swapping operands (C^T = B^T A^T).
 *
 *   D (M, N) = alpha * op(A) @ op(B) + beta * C        [+ epilogue]
 *   D is C (in place, the default: GemmDesc.D = 0) or another matrix of C's
 *   dtype and layout (ldc) that does not overlap it.
 *   op(A) (M, K): A stored (M, K), lda >= K; with trans_a stored (K, M), lda >= M
 *   op(B) (K, N): B stored (K, N), ldb >= N; with trans_b stored (N, K), ldb >= K
 *   C stored (M, N), ldc >= N.  batch > 1: matrix i starts at ptr + i*stride
 *   (strides in elements); or, with pointer_array, A, B and C are device
 *   arrays of `batch` pointers, one matrix each, anywhere (cuBLASLt's
 *   CUBLASLT_BATCH_MODE_POINTER_ARRAY; strides unused).  Such a call
 *   writes in place (D = 0), reads no C (beta 0), has no epilogue, and
 *   states in pointer_align the smallest alignment, in bytes, of the
 *   matrices the arrays point to (cuBLASLt cannot see them when it
 *   chooses an algorithm).  The executor runs the layers' dW GEMMs of one
 *   shape so (runtime/cuda/cuda_exec_dw_batch.c).
 *
 * Precision: A and B share ab_type (f32, f16, bf16); C has c_type (f32, or
 * equal to ab_type); accumulation is always fp32.  Accumulating into an f32
 * gradient, D = A B + C with 16-bit A, B and f32 C = D, beta = 1, is a
 * combination cuBLASLt lists (cuBLAS docs, cublasLtMatmul(): compute
 * CUBLAS_COMPUTE_32F, scale CUDA_R_32F, A/B CUDA_R_16F or CUDA_R_16BF, C
 * CUDA_R_32F; "supports both in-place matrix multiplication (C == D and
 * Cdesc == Ddesc) and out-of-place ... (C != D, same data type, rows,
 * columns, batch size and memory order)"); the LINEAR_DX_ACC nodes use it.  For f32 inputs TF32 is
 * off (exact fp32 products) unless GemmContext.allow_tf32 is set.
 *
 * Epilogues (fused by cuBLASLt; vectors are packed, ld 1):
 *   GEMM_EPI_BIAS           C = AB + bias[n]                bias (N) c_type
 *   GEMM_EPI_GELU_BIAS      C = gelu(AB + bias[n])
 *   GEMM_EPI_GELU_AUX_BIAS  as GELU_BIAS, and aux (M, N) = AB + bias (the
 *                           GELU input, for the backward pass)
 *   GEMM_EPI_DGELU_BGRAD    C = (AB) * gelu'(aux), and bias (N) receives the
 *                           column sums of C (the bias gradient)
 *   GEMM_EPI_BGRAD_A        bias (M) receives sum_k op(A)[m, k] (with
 *                           op(A) = dY^T this is the bias gradient of dW = dY^T X;
 *                           cuBLASLt's BGRADB, since our A is its B)
 * A bias gradient is written in c_type (an f32 dW gets an f32 db, also
 * from f16/bf16 inputs; CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE is set to it).
 * cuBLASLt may have no algorithm for an epilogue with a given layout,
 * dtype or alignment: gemm_run then fails, while gemm_run_optional (for
 * GEMM_EPI_BGRAD_A) runs the plain GEMM and says so, and the caller sums
 * the columns itself.  HPC_GEMM_BGRAD=0 drops the epilogue always (to test
 * that path and to compare).
 * cuBLASLt's GELU is the tanh approximation (gelu_tanh, GPT-2's
 * "gelu_new"), not the exact erf GELU of BERT; a model using exact GELU
 * must not use the GELU epilogues.  aux: c_type, row-major, ld_aux a
 * multiple of 8 and >= N; epilogues need batch == 1.
 *
 * The linear layer y = x @ W^T + b with W (out, in) is
 *   gemm_desc_linear(&d, GEMM_F16, GEMM_F16, tokens, out, in, x, W, b, y);
 *
 * A GemmContext owns the cuBLASLt handle, a workspace and a cache of
 * matmul descriptors and chosen algorithms per shape, so a training step
 * creates nothing.  It runs on one stream; all pointers are device pointers.
 *
 * Algorithm choice: on a shape's first use cuBLASLt's heuristic proposes up
 * to GEMM_TUNE_MAX_CANDIDATES algorithms; each is run and timed with CUDA
 * events (3 rounds of 1 warm-up + 5 timed runs on the call's own buffers;
 * a GEMM that reads C, beta != 0, has C saved and restored around it, so
 * an in-place accumulation is timed on its own input and leaves it as it
 * was; plans and tuned choices are kept apart for beta = 0 and beta != 0) and
 * the fastest kept (runtime/cuda/gemm_tune.h: the heuristic's first unless
 * another is more than 2% faster).  Choices are stored in
 * DIR/gemm_algos.txt beside the kernel cache (kernel_cache.h's DIR), keyed
 * by GPU name, cuBLASLt version, shape, dtypes, layout, alignments,
 * epilogue and workspace size, so later runs time nothing; a cached choice
 * is used only while the heuristic still proposes it.  A shape never timed
 * takes its class's choice (gemm_tune.h, "Shape classes": sizes less than
 * 19 % apart) untimed where the heuristic proposes it, so a packed batch's
 * new token count is not timed again.  New choices reach the file at
 * gemm_tune_flush (the executor calls it after each step; gemm_free too),
 * not one write and two fsyncs per shape.  HPC_GEMM_AUTOTUNE=0
 * takes the heuristic's first algorithm, as before; so does a first use
 * during stream capture (nothing can be timed there).
 *
 *   GemmContext g;
 *   if (gemm_init(&g, dev.stream, 0, &err)) return err.code;
 *   GemmDesc d; gemm_desc_linear(&d, ...);
 *   if (gemm_run(&g, &d, &err)) return err.code;
 *   gemm_free(&g);
 */
#ifndef HPC_RUNTIME_GEMM_CUBLAS_H
#define HPC_RUNTIME_GEMM_CUBLAS_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda/cuda_driver.h"
#include "cuda/gemm_tune.h"

/* cublasLt.h declares one function without a prototype; keep our strict
 * warnings for our own code. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

typedef enum { GEMM_F32, GEMM_F16, GEMM_BF16 } GemmDtype;

typedef enum {
    GEMM_EPI_NONE,
    GEMM_EPI_BIAS,
    GEMM_EPI_GELU_BIAS,
    GEMM_EPI_GELU_AUX_BIAS,
    GEMM_EPI_DGELU_BGRAD,
    GEMM_EPI_BGRAD_A,
} GemmEpilogue;

typedef struct {
    int64_t M, N, K;
    int64_t batch;              /* 1 for a plain GEMM */
    bool pointer_array;         /* A, B, C are device arrays of batch pointers (see above) */
    int pointer_align;          /* pointer_array: the matrices' smallest alignment, bytes */
    bool trans_a, trans_b;
    GemmDtype ab_type, c_type;
    CUdeviceptr A; int64_t lda, stride_a;
    CUdeviceptr B; int64_t ldb, stride_b;
    CUdeviceptr C; int64_t ldc, stride_c;
    CUdeviceptr D;              /* the output when not C (0: in place, D = C); C's layout */
    float alpha, beta;          /* beta != 0 reads C */
    GemmEpilogue epilogue;
    CUdeviceptr bias;           /* see the epilogue table */
    CUdeviceptr aux;            /* (M, N) c_type, ld_aux */
    int64_t ld_aux;
} GemmDesc;

typedef struct GemmPlan GemmPlan;   /* private: descriptors + algorithm */

typedef struct {
    cublasLtHandle_t lt;
    CUstream stream;
    size_t workspace_bytes;     /* the most workspace an algorithm may use: the heuristic's limit, part
                                   of the tuning key (what cuBLASLt asks for on Hopper) */
    CUdeviceptr workspace;      /* what the chosen algorithms need, grown as plans are made (0 while none
                                   needs any) */
    size_t workspace_held;      /* its bytes */
    bool workspace_captured;    /* a call made during a stream capture used the workspace */
    CUdeviceptr *retired;       /* smaller workspaces it replaced that a captured CUDA graph may still
                                   use, so they live until gemm_free */
    size_t retired_bytes;
    int n_retired;
    bool allow_tf32;            /* f32 GEMMs may use TF32 (off by default) */
    GemmPlan *plans;
    int num_plans, cap_plans;
    bool autotune;              /* time the heuristic's candidates (HPC_GEMM_AUTOTUNE != 0) */
    char gpu[128];              /* device name, part of the tuning key */
    GemmTuneCache tune;         /* chosen algorithms, loaded at init, saved by gemm_tune_flush */
    bool tune_unsaved;          /* choices timed since the last save */
    int tuned, tune_hits;       /* shapes timed / found in the cache (for tests and logs) */
    int tune_class_hits;        /* shapes given their class's choice untimed (gemm_tune.h) */
    bool bgrad_off;             /* HPC_GEMM_BGRAD=0: gemm_run_optional never uses the epilogue */
    int bgrad_dropped;          /* optional epilogues cuBLASLt had no algorithm for (plans made) */
    bool record_only;           /* gemm_run records calls and queues nothing (gemm_prime) */
} GemmContext;

/* Default workspace limit: 32 MiB, what cuBLASLt asks for on Hopper. */
#define GEMM_DEFAULT_WORKSPACE ((size_t)32 << 20)

/* Needs a current context (cuda_device_open).  workspace_bytes 0 = default.
 * The heuristic may propose algorithms that use up to workspace_bytes, but
 * the context holds only what its chosen algorithms need (BERT-base at
 * 32 x 128 on the H200: 0.2 MB of the 32 MiB), in a buffer that grows when
 * a new plan needs more; candidates are timed in a full-size buffer that
 * lives only while they run. */
HpcStatus gemm_init(GemmContext *g, CUstream stream, size_t workspace_bytes, HpcError *err);
/* Saves the choices timed since the last save (gemm_algos.txt); a failure
 * is a warning on stderr (they are kept for this run only). */
void gemm_tune_flush(GemmContext *g);
/* Flushes, then frees.  HPC_GEMM_REPORT set: says on stderr how many plans
 * there were and how much workspace they hold. */
void gemm_free(GemmContext *g);

/* Device bytes of workspace the context holds (the current buffer and the
 * ones it replaced). */
size_t gemm_workspace_held(const GemmContext *g);

/* The most workspace any of the context's chosen algorithms needs. */
size_t gemm_workspace_needed(const GemmContext *g);

/* Queues one (batched) GEMM on g->stream. */
HpcStatus gemm_run(GemmContext *g, const GemmDesc *d, HpcError *err);

/* As gemm_run, for a GEMM whose bias-gradient epilogue (GEMM_EPI_BGRAD_A)
 * may be left out: *epilogue_done says whether d->bias was written.  The
 * choice is made once per shape (with the plan), so every later call of
 * that shape, captured or not, does the same. */
HpcStatus gemm_run_optional(GemmContext *g, const GemmDesc *d, bool *epilogue_done, HpcError *err);

/* First calls ahead (runtime/cuda/gemm_prime.c).  cuBLASLt pays a large
 * host cost the first time a process queries it (about 0.1 s on the H200
 * host) and a few ms more for each plan's algorithm check and each
 * kernel's first launch, which step 1 would otherwise pay one GEMM after
 * another.  With g->record_only set, gemm_run and gemm_run_optional queue
 * nothing: they record each plan's first call, and a plan whose algorithm
 * the tuning cache holds is not made yet.  gemm_prime then makes those
 * plans and runs every recorded call once, spread over `threads` host
 * threads (1..16), each with its own stream, cuBLASLt handle and
 * workspace, and waits for them; what a worker cannot make (a cached
 * choice cuBLASLt no longer accepts) it makes on the calling thread the
 * ordinary way.  The calls run on the recorded buffers at once: only for a
 * warm-up whose results are never read.
 *
 * gemm_library_warm_start(ctx) pays the one-time set-up earlier still, on
 * a thread of its own, with one small GEMM of its own buffers (call it as
 * soon as the context exists); gemm_prime's threads run beside it (the
 * library orders its own set-up) and gemm_prime waits for it before it
 * returns, as gemm_library_warm_join does. */
typedef struct {
    int threads;
    int made;                   /* plans the workers made from the tuning cache */
    int made_here;              /* plans made on the calling thread */
    int calls;                  /* first calls run */
    double seconds;             /* wall time of gemm_prime */
    double setup, making, launching;   /* the slowest thread's seconds in each: its stream, handle and
                                          workspace; making plans; first calls */
} GemmPrimeStats;

HpcStatus gemm_prime(GemmContext *g, CUcontext ctx, int threads, GemmPrimeStats *stats, HpcError *err);
void gemm_library_warm_start(CUcontext ctx);
void gemm_library_warm_join(void);

/* Fills d for C (M, N) = A (M, K) @ B (K, N), packed, batch 1, alpha 1, beta 0. */
void gemm_desc_rm(GemmDesc *d, GemmDtype ab, GemmDtype c, int64_t M, int64_t N, int64_t K,
                  CUdeviceptr A, CUdeviceptr B, CUdeviceptr C);

/* Fills d for y (tokens, out) = x (tokens, in) @ W^T + b, W (out, in).
 * bias 0 means no bias (GEMM_EPI_NONE), else GEMM_EPI_BIAS. */
void gemm_desc_linear(GemmDesc *d, GemmDtype ab, GemmDtype c, int64_t tokens, int64_t out,
                      int64_t in, CUdeviceptr x, CUdeviceptr W, CUdeviceptr bias, CUdeviceptr y);

/* The largest power of two (<= 256) dividing the address: cuBLASLt picks
 * kernels assuming 256-byte alignment unless told otherwise (a plan's
 * key; GemmDesc.pointer_align of a pointer-array batch). */
int gemm_alignment(CUdeviceptr p);

/* Bytes of one element. */
size_t gemm_dtype_size(GemmDtype t);
const char *gemm_dtype_name(GemmDtype t);
const char *gemm_epilogue_name(GemmEpilogue e);   /* "none", "bias", "bgrad_a", ... */

#endif
