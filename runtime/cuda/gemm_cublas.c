/* runtime/cuda/gemm_cublas.c — see gemm_cublas.h.
 *
 * The row-major call C = op(A) op(B) is the column-major call
 * C^T = op(B)^T op(A)^T, and a row-major matrix with leading dimension ld is
 * its own transpose in column-major with the same ld.  So cuBLASLt sees
 * m' = N, n' = M, its "A" is our B and its "B" is our A, with the same
 * transpose flags, and bias vectors (length m' = N) run along our columns.
 */
#include "cuda/gemm_cublas.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gemm_internal.h"
#include "cuda/kernel_cache.h"
#include "cuda/cublaslt_calls.h"   /* last: cublasLt* through the loaded table */

_Static_assert(sizeof(cublasLtMatmulAlgo_t) == GEMM_TUNE_ALGO_BYTES, "gemm_tune.h stores the algorithm's bytes");


size_t gemm_dtype_size(GemmDtype t) { return t == GEMM_F32 ? 4 : 2; }

const char *gemm_dtype_name(GemmDtype t)
{
    return t == GEMM_F32 ? "f32" : t == GEMM_F16 ? "f16" : "bf16";
}

static cudaDataType_t cuda_type(GemmDtype t)
{
    return t == GEMM_F32 ? CUDA_R_32F : t == GEMM_F16 ? CUDA_R_16F : CUDA_R_16BF;
}

static cublasLtEpilogue_t lt_epilogue(GemmEpilogue e)
{
    switch (e) {
    case GEMM_EPI_NONE: return CUBLASLT_EPILOGUE_DEFAULT;
    case GEMM_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case GEMM_EPI_GELU_BIAS: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case GEMM_EPI_GELU_AUX_BIAS: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GEMM_EPI_DGELU_BGRAD: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
    case GEMM_EPI_BGRAD_A: return CUBLASLT_EPILOGUE_BGRADB;   /* our A is cuBLASLt's B */
    }
    return CUBLASLT_EPILOGUE_DEFAULT;
}

const char *gemm_epilogue_name(GemmEpilogue e)
{
    switch (e) {
    case GEMM_EPI_NONE: return "none";
    case GEMM_EPI_BIAS: return "bias";
    case GEMM_EPI_GELU_BIAS: return "gelu_bias";
    case GEMM_EPI_GELU_AUX_BIAS: return "gelu_aux_bias";
    case GEMM_EPI_DGELU_BGRAD: return "dgelu_bgrad";
    case GEMM_EPI_BGRAD_A: return "bgrad_a";
    }
    return "?";
}

static int uses_bias(GemmEpilogue e) { return e != GEMM_EPI_NONE; }
static CUdeviceptr out_ptr(const GemmDesc *d) { return d->D ? d->D : d->C; }
static int is_bgrad(GemmEpilogue e) { return e == GEMM_EPI_DGELU_BGRAD || e == GEMM_EPI_BGRAD_A; }
static int uses_aux(GemmEpilogue e)
{
    return e == GEMM_EPI_GELU_AUX_BIAS || e == GEMM_EPI_DGELU_BGRAD;
}

int gemm_alignment(CUdeviceptr p)
{
    int a = 256;
    while (a > 1 && p % (CUdeviceptr)a) a /= 2;
    return a;
}

/* ---- validation ---------------------------------------------------------- */

static HpcStatus bad(HpcError *err, const GemmDesc *d, const char *why)
{
    return hpc_fail(err, HPC_ERR_USAGE,
                    "gemm_run: %s (M=%lld N=%lld K=%lld batch=%lld %s->%s lda=%lld ldb=%lld "
                    "ldc=%lld); a bug in the caller", why, (long long)d->M, (long long)d->N,
                    (long long)d->K, (long long)d->batch, gemm_dtype_name(d->ab_type),
                    gemm_dtype_name(d->c_type), (long long)d->lda, (long long)d->ldb,
                    (long long)d->ldc);
}

static HpcStatus validate(const GemmDesc *d, HpcError *err)
{
    if (d->M <= 0 || d->N <= 0 || d->K <= 0 || d->batch <= 0) return bad(err, d, "empty shape");
    if (d->c_type != GEMM_F32 && d->c_type != d->ab_type)
        return bad(err, d, "output must be f32 or the input dtype");
    if (d->lda < (d->trans_a ? d->M : d->K)) return bad(err, d, "lda too small");
    if (d->ldb < (d->trans_b ? d->K : d->N)) return bad(err, d, "ldb too small");
    if (d->ldc < d->N) return bad(err, d, "ldc too small");
    if (d->epilogue != GEMM_EPI_NONE && d->batch != 1)
        return bad(err, d, "epilogues need batch == 1");
    if (uses_bias(d->epilogue) && !d->bias) return bad(err, d, "epilogue needs a bias pointer");
    if (uses_aux(d->epilogue) && (!d->aux || d->ld_aux < d->N || d->ld_aux % 8))
        return bad(err, d, "GELU aux needs a pointer and ld_aux >= N, a multiple of 8");
    if (!d->A || !d->B || !d->C) return bad(err, d, "null matrix pointer");
    if (d->pointer_array && (d->epilogue != GEMM_EPI_NONE || d->beta != 0.0f || (d->D && d->D != d->C) ||
                             d->pointer_align < 1))
        return bad(err, d, "a pointer-array batch writes in place, reads no C, has no epilogue and states "
                           "its matrices' alignment");
    return HPC_OK;
}

static void plan_key(PlanKey *k, const GemmContext *g, const GemmDesc *d, bool optional)
{
    memset(k, 0, sizeof *k);
    k->optional = optional;
    k->M = d->M; k->N = d->N; k->K = d->K; k->batch = d->batch;
    k->lda = d->lda; k->ldb = d->ldb; k->ldc = d->ldc;
    if (d->batch > 1) {
        k->stride_a = d->stride_a; k->stride_b = d->stride_b; k->stride_c = d->stride_c;
    }
    k->trans_a = d->trans_a; k->trans_b = d->trans_b;
    k->ab_type = d->ab_type; k->c_type = d->c_type;
    k->epilogue = d->epilogue;
    k->ld_aux = uses_aux(d->epilogue) ? d->ld_aux : 0;
    k->allow_tf32 = d->ab_type == GEMM_F32 && g->allow_tf32;
    k->reads_c = d->beta != 0.0f;
    k->align_a = gemm_alignment(d->A); k->align_b = gemm_alignment(d->B); k->align_c = gemm_alignment(d->C);
    k->align_d = gemm_alignment(out_ptr(d));
    k->pointer_array = d->pointer_array;
    if (d->pointer_array) k->align_a = k->align_b = k->align_c = k->align_d = d->pointer_align;
    k->align_bias = uses_bias(d->epilogue) ? gemm_alignment(d->bias) : 0;
    k->align_aux = uses_aux(d->epilogue) ? gemm_alignment(d->aux) : 0;
}

/* ---- plans ----------------------------------------------------------------- */

void gemm_plan_descriptors_free(GemmPlan *p)
{
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    p->la = p->lb = p->lc = NULL;
    p->op = NULL;
}

static void plan_destroy(GemmPlan *p)
{
    gemm_plan_descriptors_free(p);
    memset(p, 0, sizeof *p);
}

/* stride < 0: a batch of pointer arrays (GemmDesc.pointer_array). */
static HpcStatus layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols,
                        int64_t ld, int64_t batch, int64_t stride, HpcError *err)
{
    HpcStatus st = CUDA_CHECK(err, cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows,
                                                              (uint64_t)cols, ld));
    if (st || batch == 1) return st;
    int32_t count = (int32_t)batch;
    st = CUDA_CHECK(err, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                          &count, sizeof count));
    if (!st && stride < 0) {
        uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
        return CUDA_CHECK(err, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode,
                                                                sizeof mode));
    }
    if (!st)
        st = CUDA_CHECK(err, cublasLtMatrixLayoutSetAttribute(
                                 *l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                 sizeof stride));
    return st;
}

static HpcStatus plan_layouts(GemmPlan *p, const GemmDesc *d, HpcError *err)
{
    cudaDataType_t ab = cuda_type(d->ab_type), c = cuda_type(d->c_type);
    bool ptrs = d->pointer_array;
    HpcStatus st = layout(&p->la, ab, d->trans_b ? d->K : d->N, d->trans_b ? d->N : d->K,
                          d->ldb, d->batch, ptrs ? -1 : d->stride_b, err);
    if (!st)
        st = layout(&p->lb, ab, d->trans_a ? d->M : d->K, d->trans_a ? d->K : d->M, d->lda,
                    d->batch, ptrs ? -1 : d->stride_a, err);
    if (!st) st = layout(&p->lc, c, d->N, d->M, d->ldc, d->batch, ptrs ? -1 : d->stride_c, err);
    return st;
}

static HpcStatus desc_set(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t a,
                          const void *v, size_t n, HpcError *err)
{
    return CUDA_CHECK(err, cublasLtMatmulDescSetAttribute(op, a, v, n));
}

/* The descriptor for d with p->epilogue (d's, or NONE when dropped). */
static HpcStatus plan_desc(GemmPlan *p, const GemmContext *g, const GemmDesc *d, HpcError *err)
{
    cublasComputeType_t compute = p->key.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                    : CUBLAS_COMPUTE_32F;
    HpcStatus st = CUDA_CHECK(err, cublasLtMatmulDescCreate(&p->op, compute, CUDA_R_32F));
    if (st) return st;
    int32_t ta = d->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, tb = d->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint32_t epi = lt_epilogue(p->epilogue);
    if ((st = desc_set(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta, err)) ||
        (st = desc_set(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb, err)) ||
        (st = desc_set(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi, err)))
        return st;
    if (is_bgrad(p->epilogue)) {
        /* The bias gradient in C's type (cuBLASLt's documented default,
         * stated so that an f32 dW always gets an f32 db). */
        int32_t bt = (int32_t)cuda_type(d->c_type);
        st = desc_set(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt, err);
        if (st) return st;
    }
    if (uses_aux(p->epilogue)) {
        int64_t ld = d->ld_aux;
        st = desc_set(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld, err);
    }
    return st;
}

/* Points the descriptor at this call's bias and aux (heuristics read them
 * for alignment, so this happens before the algorithm is chosen, too). */
HpcStatus gemm_plan_point(GemmPlan *p, const GemmDesc *d, HpcError *err)
{
    HpcStatus st = HPC_OK;
    if (uses_bias(p->epilogue)) {
        void *bias = (void *)(uintptr_t)d->bias;
        st = desc_set(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias, err);
    }
    if (!st && uses_aux(p->epilogue)) {
        void *aux = (void *)(uintptr_t)d->aux;
        st = desc_set(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux, err);
    }
    return st;
}

HpcStatus gemm_plan_descriptors(GemmPlan *p, const GemmContext *g, const GemmDesc *d, HpcError *err)
{
    HpcStatus st = plan_layouts(p, d, err);
    if (!st) st = plan_desc(p, g, d, err);
    return st ? st : gemm_plan_point(p, d, err);
}


static HpcStatus pref_set(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t a,
                          uint32_t v, HpcError *err)
{
    return CUDA_CHECK(err, cublasLtMatmulPreferenceSetAttribute(pref, a, &v, sizeof v));
}

/* The tuning key of a plan (gemm_tune.h): its shape and the epilogue it
 * really runs; and, where class_key is not NULL, its class's key. */
static void tune_keys(const GemmContext *g, const GemmPlan *p, char *buf, char *class_key, size_t size)
{
    const PlanKey *k = &p->key;
    bool bias = uses_bias(p->epilogue);
    char c_type[16];   /* "f32+c": a GEMM that reads C (beta != 0) is timed apart */
    snprintf(c_type, sizeof c_type, "%s%s", gemm_dtype_name((GemmDtype)k->c_type), k->reads_c ? "+c" : "");
    int align_c = k->align_c < k->align_d ? k->align_c : k->align_d;
    GemmTuneShape s = {
        .gpu = g->gpu, .lt_version = cublasLtGetVersion(), .M = k->M, .N = k->N, .K = k->K, .batch = k->batch,
        .lda = k->lda, .ldb = k->ldb, .ldc = k->ldc, .stride_a = k->stride_a, .stride_b = k->stride_b,
        .stride_c = k->stride_c, .ld_aux = uses_aux(p->epilogue) ? k->ld_aux : 0, .trans_a = k->trans_a,
        .trans_b = k->trans_b, .tf32 = k->allow_tf32, .ab_type = gemm_dtype_name((GemmDtype)k->ab_type),
        .c_type = c_type, .bias_type = bias ? gemm_dtype_name((GemmDtype)k->c_type) : "-",
        .epilogue = gemm_epilogue_name(p->epilogue), .align_a = k->align_a, .align_b = k->align_b,
        .align_c = align_c, .align_bias = bias ? k->align_bias : 0,
        .align_aux = uses_aux(p->epilogue) ? k->align_aux : 0, .workspace = g->workspace_bytes,
        .pointer_array = k->pointer_array};
    gemm_tune_key(&s, buf, size);
    if (class_key) gemm_tune_class_key(&s, class_key, size);
}

typedef struct {
    const GemmContext *g;
    const GemmPlan *p;
    const GemmDesc *d;
    const cublasLtMatmulHeuristicResult_t *res;
    CUevent e0, e1;
} TuneRun;

cublasStatus_t gemm_matmul_with(const GemmContext *g, const GemmPlan *p, const GemmDesc *d,
                                const cublasLtMatmulAlgo_t *algo)
{
    void *a = (void *)(uintptr_t)d->A, *b = (void *)(uintptr_t)d->B;
    void *c = (void *)(uintptr_t)d->C, *out = (void *)(uintptr_t)out_ptr(d), *ws = (void *)(uintptr_t)g->workspace;
    /* cuBLASLt's A is our B, its B our A; C is the input (beta), D the output
     * (C itself unless d->D), both in C's layout. */
    return cublasLtMatmul(g->lt, p->op, &d->alpha, b, p->la, a, p->lb, &d->beta, c, p->lc, out, p->lc, algo, ws,
                          g->workspace_held, (cudaStream_t)g->stream);
}

/* Microseconds per run of candidate i (1 warm-up, 5 timed); < 0 on failure. */
static double tune_timer(void *ctx, int i)
{
    TuneRun *r = ctx;
    const CudaDriver *cu = cuda_driver();
    enum { TIMED = 5 };
    if (gemm_matmul_with(r->g, r->p, r->d, &r->res[i].algo) != CUBLAS_STATUS_SUCCESS) return -1;
    if (cu->cuEventRecord(r->e0, r->g->stream) != CUDA_SUCCESS) return -1;
    for (int k = 0; k < TIMED; k++)
        if (gemm_matmul_with(r->g, r->p, r->d, &r->res[i].algo) != CUBLAS_STATUS_SUCCESS) return -1;
    float ms = 0;
    if (cu->cuEventRecord(r->e1, r->g->stream) != CUDA_SUCCESS || cu->cuEventSynchronize(r->e1) != CUDA_SUCCESS ||
        cu->cuEventElapsedTime(&ms, r->e0, r->e1) != CUDA_SUCCESS)
        return -1;
    return 1000.0 * ms / TIMED;
}

/* Times the candidates on the call's buffers (C saved and restored when the
 * GEMM reads it); returns the chosen index, 0 when nothing can be timed. */
static int tune_time(const GemmContext *g, const GemmPlan *p, const GemmDesc *d,
                     const cublasLtMatmulHeuristicResult_t *res, int found, double *us)
{
    const CudaDriver *cu = cuda_driver();
    TuneRun r = {.g = g, .p = p, .d = d, .res = res};
    int64_t c_elems = (d->batch > 1 ? d->stride_c * (d->batch - 1) : 0) + (d->M - 1) * d->ldc + d->N;
    size_t c_bytes = (size_t)c_elems * gemm_dtype_size(d->c_type);
    CUdeviceptr saved = 0;
    *us = 0;
    if (d->beta != 0.0f && (cu->cuMemAlloc(&saved, c_bytes) != CUDA_SUCCESS ||
                            cu->cuMemcpyDtoDAsync(saved, d->C, c_bytes, g->stream) != CUDA_SUCCESS)) {
        if (saved) cu->cuMemFree(saved);
        return 0;
    }
    int pick = -1;
    if (cu->cuEventCreate(&r.e0, CU_EVENT_DEFAULT) == CUDA_SUCCESS &&
        cu->cuEventCreate(&r.e1, CU_EVENT_DEFAULT) == CUDA_SUCCESS)
        pick = gemm_tune_pick(found, 3, tune_timer, &r, us);
    if (r.e0) cu->cuEventDestroy(r.e0);
    if (r.e1) cu->cuEventDestroy(r.e1);
    if (saved) {
        cu->cuMemcpyDtoDAsync(d->C, saved, c_bytes, g->stream);
        cu->cuStreamSynchronize(g->stream);
        cu->cuMemFree(saved);
    }
    return pick < 0 ? 0 : pick;
}

static bool stream_capturing(CUstream s)
{
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    return cuda_driver()->cuStreamIsCapturing(s, &cs) != CUDA_SUCCESS || cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* The index of algo among the found candidates, or -1. */
static int found_index(const cublasLtMatmulHeuristicResult_t *res, int found, const uint8_t *algo)
{
    for (int i = 0; i < found; i++)
        if (memcmp(algo, &res[i].algo, GEMM_TUNE_ALGO_BYTES) == 0) return i;
    return -1;
}

/* Which of the found candidates to use: the cached choice if the heuristic
 * still proposes it, else its class's choice if the heuristic proposes that
 * (untimed; gemm_tune.h, "Shape classes"), else a timed one (then cached
 * under both keys, saved by gemm_tune_flush), else the first. */
static int choose_algo(GemmContext *g, const GemmPlan *p, const GemmDesc *d,
                       const cublasLtMatmulHeuristicResult_t *res, int found)
{
    if (!g->autotune || found < 1 || stream_capturing(g->stream)) return 0;
    char key[GEMM_TUNE_KEY_MAX], class_key[GEMM_TUNE_KEY_MAX];
    tune_keys(g, p, key, class_key, sizeof key);
    const GemmTuneEntry *e = gemm_tune_find(&g->tune, key);
    int i = e ? found_index(res, found, e->algo) : -1;
    if (i >= 0) {
        g->tune_hits++;
        return i;
    }
    e = gemm_tune_find(&g->tune, class_key);
    i = e ? found_index(res, found, e->algo) : -1;
    if (i >= 0) {   /* kept in memory only: the next run finds the class again */
        g->tune_class_hits++;
        return i;
    }
    /* the candidates may use the whole limit: a buffer of that size for them alone */
    double us = 0;
    int pick = 0;
    GemmContext wide = *g;
    wide.workspace_held = g->workspace_bytes;
    if (cuda_driver()->cuMemAlloc(&wide.workspace, wide.workspace_held) == CUDA_SUCCESS) {
        pick = tune_time(&wide, p, d, res, found, &us);
        cuda_driver()->cuMemFree(wide.workspace);
    }
    g->tuned++;
    HpcError err;
    if (us > 0 && !gemm_tune_put(&g->tune, key, &res[pick].algo, us, &err) &&
        !gemm_tune_put(&g->tune, class_key, &res[pick].algo, us, &err))
        g->tune_unsaved = true;
    return pick;
}

void gemm_tune_flush(GemmContext *g)
{
    if (!g->tune_unsaved) return;
    g->tune_unsaved = false;
    HpcError err;
    if (gemm_tune_save(&g->tune, &err))
        fprintf(stderr, "hpc: warning: %s (GEMM choices are kept for this run only)\n", err.msg);
}

/* A cache hit without the heuristic query: the cached algorithm, if
 * cuBLASLt accepts it for p (cublasLtMatmulAlgoCheck) within the workspace.
 * The choice is the one choose_algo makes: the entry was the heuristic's
 * candidate for this very key (GPU, cuBLASLt version, shape, alignments,
 * epilogue, workspace), and the heuristic is a function of those, so it
 * still proposes it.  Any doubt (no entry, a check that fails) goes the
 * old way, heuristic first.  Saves one cublasLtMatmulAlgoGetHeuristic of
 * GEMM_TUNE_MAX_CANDIDATES results per GEMM shape in step 1. */
bool gemm_plan_algo_cached(GemmPlan *p, const GemmContext *g)
{
    if (!g->autotune || stream_capturing(g->stream)) return false;
    char key[GEMM_TUNE_KEY_MAX];
    tune_keys(g, p, key, NULL, sizeof key);
    const GemmTuneEntry *e = gemm_tune_find(&g->tune, key);
    if (!e) return false;
    cublasLtMatmulAlgo_t algo;
    cublasLtMatmulHeuristicResult_t check;
    memcpy(&algo, e->algo, GEMM_TUNE_ALGO_BYTES);
    memset(&check, 0, sizeof check);
    if (cublasLtMatmulAlgoCheck(g->lt, p->op, p->la, p->lb, p->lc, p->lc, &algo, &check) != CUBLAS_STATUS_SUCCESS ||
        check.state != CUBLAS_STATUS_SUCCESS || check.workspaceSize > g->workspace_bytes)
        return false;
    p->algo = algo;
    p->ws_need = check.workspaceSize;
    return true;
}

/* Chooses p's algorithm; *found = 0 (with HPC_ERR_CUDA) when the heuristic
 * proposes none. */
static HpcStatus plan_algo(GemmPlan *p, GemmContext *g, const GemmDesc *d, int *found_out, HpcError *err)
{
    if (gemm_plan_algo_cached(p, g)) {
        g->tune_hits++;
        *found_out = 1;
        return HPC_OK;
    }
    cublasLtMatmulPreference_t pref;
    cublasLtMatmulHeuristicResult_t res[GEMM_TUNE_MAX_CANDIDATES];
    int found = 0;
    uint64_t ws = g->workspace_bytes;
    HpcStatus st = CUDA_CHECK(err, cublasLtMatmulPreferenceCreate(&pref));
    if (st) return st;
    st = CUDA_CHECK(err, cublasLtMatmulPreferenceSetAttribute(
                             pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    /* cuBLASLt's A is our B and vice versa. */
    if (!st) st = pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, (uint32_t)p->key.align_b, err);
    if (!st) st = pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, (uint32_t)p->key.align_a, err);
    if (!st) st = pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, (uint32_t)p->key.align_c, err);
    if (!st) st = pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, (uint32_t)p->key.align_d, err);
    int want = g->autotune ? GEMM_TUNE_MAX_CANDIDATES : 1;
    if (!st)
        st = CUDA_CHECK(err, cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->la, p->lb, p->lc,
                                                            p->lc, pref, want, res, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    *found_out = found;
    if (st) return st;
    if (found == 0)
        return hpc_fail(err, HPC_ERR_CUDA,
                        "cuBLASLt has no algorithm for a %lldx%lldx%lld %s->%s GEMM (batch %lld, "
                        "epilogue %s, trans %d%d, alignment %d/%d/%d bytes); a bug in hpc's GEMM "
                        "lowering: report it with the model file", (long long)d->M,
                        (long long)d->N, (long long)d->K, gemm_dtype_name(d->ab_type),
                        gemm_dtype_name(d->c_type), (long long)d->batch, gemm_epilogue_name(p->epilogue),
                        d->trans_a, d->trans_b, p->key.align_a, p->key.align_b, p->key.align_c);
    int pick = choose_algo(g, p, d, res, found);
    p->algo = res[pick].algo;
    p->ws_need = res[pick].workspaceSize;
    return HPC_OK;
}

static HpcStatus plan_make_with(GemmPlan *p, const PlanKey *key, GemmContext *g, const GemmDesc *d,
                                GemmEpilogue epi, int *found, HpcError *err)
{
    memset(p, 0, sizeof *p);
    p->key = *key;
    p->epilogue = epi;
    *found = -1;
    HpcStatus st = gemm_plan_descriptors(p, g, d, err);
    if (!st) st = plan_algo(p, g, d, found, err);
    if (st) plan_destroy(p);
    return st;
}

/* d's plan; an optional bias-gradient epilogue that is switched off
 * (HPC_GEMM_BGRAD=0) or that cuBLASLt has no algorithm for is dropped: the
 * plan then runs the plain GEMM and the caller computes the bias gradient. */
static HpcStatus plan_make(GemmPlan *p, GemmContext *g, const GemmDesc *d, bool optional, HpcError *err)
{
    int found;
    PlanKey key = p->key;   /* plan_destroy clears p */
    bool may_drop = optional && is_bgrad(d->epilogue) && !uses_aux(d->epilogue);
    if (may_drop && g->bgrad_off) return plan_make_with(p, &key, g, d, GEMM_EPI_NONE, &found, err);
    HpcStatus st = plan_make_with(p, &key, g, d, d->epilogue, &found, err);
    if (st && may_drop && found == 0) {
        g->bgrad_dropped++;
        st = plan_make_with(p, &key, g, d, GEMM_EPI_NONE, &found, err);
    }
    return st;
}

static bool plan_defer(const GemmContext *g, GemmPlan *p, const GemmDesc *d, bool optional);

static HpcStatus plan_find(GemmContext *g, const GemmDesc *d, bool optional, GemmPlan **out, HpcError *err)
{
    PlanKey key;
    plan_key(&key, g, d, optional);
    for (int i = 0; i < g->num_plans; i++) {
        GemmPlan *p = &g->plans[i];
        if (memcmp(&p->key, &key, sizeof key) != 0) continue;
        *out = p;
        if (p->deferred && !g->record_only) {   /* recorded, and gemm_prime never made it */
            HpcStatus st = gemm_plan_complete(g, p, err);
            if (st) return st;
        }
        return p->deferred ? HPC_OK : gemm_plan_point(p, d, err);
    }
    if (g->num_plans == g->cap_plans) {
        g->cap_plans = g->cap_plans ? 2 * g->cap_plans : 32;
        g->plans = xrealloc(g->plans, (size_t)g->cap_plans * sizeof *g->plans);
    }
    GemmPlan *p = &g->plans[g->num_plans];
    memset(p, 0, sizeof *p);
    p->key = key;
    if (g->record_only && plan_defer(g, p, d, optional)) {
        g->num_plans++;
        *out = p;
        return HPC_OK;
    }
    HpcStatus st = plan_make(p, g, d, optional, err);
    if (st) return st;
    g->num_plans++;
    *out = p;
    return HPC_OK;
}

/* While recording (gemm_prime): a plan whose algorithm the tuning cache
 * holds is left to gemm_prime's workers, with the epilogue plan_make would
 * run (d's, or none under HPC_GEMM_BGRAD=0); anything else is made now,
 * here, since choosing an algorithm may time candidates on the stream. */
static bool plan_defer(const GemmContext *g, GemmPlan *p, const GemmDesc *d, bool optional)
{
    bool may_drop = optional && is_bgrad(d->epilogue) && !uses_aux(d->epilogue);
    p->epilogue = may_drop && g->bgrad_off ? GEMM_EPI_NONE : d->epilogue;
    if (!g->autotune || stream_capturing(g->stream)) return false;
    char key[GEMM_TUNE_KEY_MAX];
    tune_keys(g, p, key, NULL, sizeof key);
    if (!gemm_tune_find(&g->tune, key)) return false;
    p->deferred = true;
    return true;
}

HpcStatus gemm_plan_complete(GemmContext *g, GemmPlan *p, HpcError *err)
{
    GemmDesc first = p->first;
    bool recorded = p->recorded;
    gemm_plan_descriptors_free(p);   /* a worker's half-made descriptors, if any */
    p->deferred = false;
    HpcStatus st = plan_make(p, g, &first, p->key.optional, err);
    p->first = first;
    p->recorded = recorded;
    return st;
}

/* ---- public ------------------------------------------------------------------ */

/* HPC_GEMM_AUTOTUNE (default on), the device name and the choices on disk
 * (memory only when the cache directory cannot be made). */
static void tune_open(GemmContext *g)
{
    const char *env = getenv("HPC_GEMM_AUTOTUNE");
    g->autotune = !(env && strcmp(env, "0") == 0);
    env = getenv("HPC_GEMM_BGRAD");
    g->bgrad_off = env && strcmp(env, "0") == 0;
    const CudaDriver *cu = cuda_driver();
    CUdevice dev;
    snprintf(g->gpu, sizeof g->gpu, "unknown GPU");
    if (cu->cuCtxGetDevice(&dev) == CUDA_SUCCESS) cu->cuDeviceGetName(g->gpu, (int)sizeof g->gpu, dev);
    for (char *c = g->gpu; *c; c++)
        if (*c == '|' || *c == '\t' || (unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e) *c = '_';
    char dir[KCACHE_PATH_MAX], path[KCACHE_PATH_MAX + 32];
    HpcError err;
    path[0] = 0;
    if (g->autotune && !kcache_dir(dir, sizeof dir, &err)) snprintf(path, sizeof path, "%s/%s", dir, GEMM_TUNE_FILE);
    gemm_tune_load(&g->tune, g->autotune ? path : NULL, stderr);
}

HpcStatus gemm_init(GemmContext *g, CUstream stream, size_t workspace_bytes, HpcError *err)
{
    memset(g, 0, sizeof *g);
    const CudaDriver *cu = cuda_driver();
    if (!cu)
        return hpc_fail(err, HPC_ERR_NO_GPU, "gemm_init: the CUDA driver is not loaded "
                        "(open the device first)");
    g->stream = stream;
    g->workspace_bytes = workspace_bytes ? workspace_bytes : GEMM_DEFAULT_WORKSPACE;
    HpcStatus st = cublaslt_load(err);   /* dlopen'd (started ahead by `hpc run`): cuda/cublaslt_load.h */
    if (st) return st;
    tune_open(g);
    return CUDA_CHECK(err, cublasLtCreate(&g->lt));
}

size_t gemm_workspace_held(const GemmContext *g) { return g->workspace_held + g->retired_bytes; }

size_t gemm_workspace_needed(const GemmContext *g)
{
    size_t need = 0;
    for (int i = 0; i < g->num_plans; i++)
        if (g->plans[i].ws_need > need) need = g->plans[i].ws_need;
    return need;
}

/* A workspace of at least `need` bytes (in steps of 64 KiB), for a call
 * about to be queued on g's stream.  The buffer it replaces is freed when
 * no captured CUDA graph can hold it (no call used it during a capture),
 * after the stream's queued calls are done with it; otherwise it is kept
 * until gemm_free (see GemmContext.retired).  Until 2026-12-05 every
 * replaced buffer was kept, though the workspace grows while the first,
 * eager step makes its plans, before any capture. */
HpcStatus gemm_workspace_reserve(GemmContext *g, size_t need, HpcError *err)
{
    bool capturing = stream_capturing(g->stream);
    if (need > g->workspace_held) {
        size_t step = (size_t)64 << 10, bytes = (need + step - 1) / step * step;
        CUdeviceptr w;
        const CudaDriver *cu = cuda_driver();
        HpcStatus st = CUDA_CHECK(err, cu->cuMemAlloc(&w, bytes));
        if (st) return st;
        if (g->workspace && !g->workspace_captured && !capturing) {
            st = CUDA_CHECK(err, cu->cuStreamSynchronize(g->stream));
            if (!st) st = CUDA_CHECK(err, cu->cuMemFree(g->workspace));
            if (st) {
                cu->cuMemFree(w);
                return st;
            }
        } else if (g->workspace) {
            g->retired = xrealloc(g->retired, (size_t)(g->n_retired + 1) * sizeof *g->retired);
            g->retired[g->n_retired++] = g->workspace;
            g->retired_bytes += g->workspace_held;
        }
        g->workspace = w;
        g->workspace_held = bytes;
        g->workspace_captured = false;
    }
    if (capturing) g->workspace_captured = true;
    return HPC_OK;
}

void gemm_free(GemmContext *g)
{
    gemm_library_warm_join();   /* a set-up thread still running uses the context */
    gemm_tune_flush(g);
    if (getenv("HPC_GEMM_REPORT") && g->lt)
        fprintf(stderr, "hpc: cuBLASLt: %d plans; their algorithms need %zu bytes of workspace (limit %zu); "
                        "%zu bytes held\n", g->num_plans, gemm_workspace_needed(g), g->workspace_bytes,
                gemm_workspace_held(g));
    gemm_tune_free(&g->tune);
    for (int i = 0; i < g->num_plans; i++) plan_destroy(&g->plans[i]);
    free(g->plans);
    const CudaDriver *cu = cuda_driver();
    if (cu && g->workspace) cu->cuMemFree(g->workspace);
    for (int i = 0; cu && i < g->n_retired; i++) cu->cuMemFree(g->retired[i]);
    free(g->retired);
    if (g->lt) cublasLtDestroy(g->lt);
    memset(g, 0, sizeof *g);
}

/* Queues d with p, or (record_only) keeps d as p's first call for gemm_prime. */
static HpcStatus run_or_record(GemmContext *g, GemmPlan *p, const GemmDesc *d, HpcError *err)
{
    if (!g->record_only) {
        HpcStatus st = gemm_workspace_reserve(g, p->ws_need, err);
        return st ? st : CUDA_CHECK(err, gemm_matmul_with(g, p, d, &p->algo));
    }
    if (!p->recorded) {
        p->first = *d;
        p->recorded = true;
    }
    return HPC_OK;
}

HpcStatus gemm_run(GemmContext *g, const GemmDesc *d, HpcError *err)
{
    GemmPlan *p;
    HpcStatus st = validate(d, err);
    if (!st) st = plan_find(g, d, false, &p, err);
    return st ? st : run_or_record(g, p, d, err);
}

HpcStatus gemm_run_optional(GemmContext *g, const GemmDesc *d, bool *epilogue_done, HpcError *err)
{
    GemmPlan *p;
    *epilogue_done = false;
    HpcStatus st = validate(d, err);
    if (!st) st = plan_find(g, d, true, &p, err);
    if (st) return st;
    *epilogue_done = p->epilogue == d->epilogue;
    return run_or_record(g, p, d, err);
}

void gemm_desc_rm(GemmDesc *d, GemmDtype ab, GemmDtype c, int64_t M, int64_t N, int64_t K,
                  CUdeviceptr A, CUdeviceptr B, CUdeviceptr C)
{
    memset(d, 0, sizeof *d);
    d->M = M; d->N = N; d->K = K;
    d->batch = 1;
    d->ab_type = ab; d->c_type = c;
    d->A = A; d->lda = K;
    d->B = B; d->ldb = N;
    d->C = C; d->ldc = N;
    d->alpha = 1.0f;
}

void gemm_desc_linear(GemmDesc *d, GemmDtype ab, GemmDtype c, int64_t tokens, int64_t out,
                      int64_t in, CUdeviceptr x, CUdeviceptr W, CUdeviceptr bias, CUdeviceptr y)
{
    gemm_desc_rm(d, ab, c, tokens, out, in, x, W, y);
    d->trans_b = true;      /* W is stored (out, in) */
    d->ldb = in;
    d->bias = bias;
    d->epilogue = bias ? GEMM_EPI_BIAS : GEMM_EPI_NONE;
}
