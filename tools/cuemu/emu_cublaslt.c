/* tools/cuemu/emu_cublaslt.c — the part of cuBLASLt that hpc uses, on the CPU.
 *
 * What it promises (see tools/cuemu/cuemu.h for the emulator as a whole):
 *
 * Exports, with <cublasLt.h>'s prototypes, exactly the functions that
 * runtime/cuda/cublaslt_load.h resolves: cublasLtCreate, Destroy,
 * GetVersion, GetStatusName, GetStatusString, MatmulDescCreate / Destroy /
 * SetAttribute, MatrixLayoutCreate / Destroy / SetAttribute,
 * MatmulPreferenceCreate / Destroy / SetAttribute, MatmulAlgoGetHeuristic,
 * MatmulAlgoCheck and Matmul.
 *
 * cublasLtMatmul computes, column-major as cuBLASLt defines it, for each
 * matrix of a batch (strided, or of pointer arrays: below),
 *     D = F(alpha * op(A) op(B) + beta * C)
 * where F is the epilogue (nvmath-python's statement of cuBLASLt's
 * semantics, "F(alpha a @ b + beta c), where F is the epilog":
 * https://docs.nvidia.com/cuda/nvmath-python/latest/linalg/generated/nvmath.linalg.advanced.matmul.html),
 * queued on the stream with emu_stream_enqueue: alpha and beta (host
 * pointers, CUBLASLT_POINTER_MODE_HOST, the only mode) and every pointer
 * and size are read at the call, so a captured graph replays the call.
 * C is not read when beta == 0.
 *
 * Batches: CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT matrices, by default
 * (CUBLASLT_BATCH_MODE_STRIDED) STRIDED_BATCH_OFFSET elements apart; with
 * CUBLASLT_MATRIX_LAYOUT_BATCH_MODE = CUBLASLT_BATCH_MODE_POINTER_ARRAY
 * (uint32_t; all four layouts of a call alike) A, B, C and D are device
 * arrays of batch-count device pointers, one matrix each, anywhere, and
 * the stride is ignored.  The arrays are read when the queued GEMM runs
 * (an earlier copy on the stream, or in the graph, may write them); each
 * matrix is computed exactly as one matrix of a strided batch.  C may be D
 * (the same array, Cdesc's ld equal to Ddesc's) or apart; matrix by matrix,
 * C[i] == D[i] is in place, any other overlap among the C and D matrices
 * dies (the GPU's result would depend on the order of its blocks).
 *
 * Numerics: the operands are converted to float exactly; each element of
 * op(A) op(B) is a float sum over k in increasing order of float products
 * (one rounding per product and per addition, as a straightforward loop;
 * compilers that contract into FMA round once per step instead).  Then
 * alpha, beta * C, the epilogue in float (GELU and gelu' evaluated in
 * double, rounded to float), one
 * rounding to D's type (round to nearest even, with overflow to inf,
 * subnormals and NaN kept).  The bias-gradient reductions are sums in
 * double, rounded once to the bias type.  The FAST_* compute types compute
 * the same full-float products (cuBLASLt may, but need not, use less).
 *
 * Types (compute CUBLAS_COMPUTE_32F, scale CUDA_R_32F; A and B of one type,
 * C and D of one type): A/B f16 -> C/D f16 or f32; bf16 -> bf16 or f32;
 * f32 -> f32 (also under CUBLAS_COMPUTE_32F_FAST_TF32 / _FAST_16F /
 * _FAST_16BF).  Anything else: CUBLAS_STATUS_NOT_SUPPORTED.
 *
 * Epilogues (the quotes are <cublasLt.h>'s comments on cublasLtEpilogue_t,
 * CUDA 13.1, worded as in the cuBLAS documentation's cublasLtEpilogue_t
 * table, https://docs.nvidia.com/cuda/cublas/; m = rows of D,
 * n = columns of D; bias and aux types default to D's type, as
 * CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE and _EPILOGUE_AUX_DATA_TYPE say):
 *   DEFAULT        D = v, with v = alpha op(A) op(B) + beta C
 *   BIAS           D = v + bias[i]      (bias: m elements, "broadcasted to all
 *                                        columns and added before applying final
 *                                        postprocessing")
 *   GELU, GELU_BIAS  D = gelu(v [+ bias[i]])
 *   GELU_AUX, GELU_AUX_BIAS  as GELU(_BIAS), and aux(i, j) = the GELU input
 *                  ("outputs GELU input as a separate matrix"); aux is
 *                  column-major m x n with CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD
 *                  (a multiple of 8, >= m, as documented)
 *   DGELU          D = v * gelu'(aux(i, j))  (aux is the forward GELU input)
 *   DGELU_BGRAD    as DGELU, and bias[i] = sum over j of D(i, j) before its
 *                  rounding ("Apply independently GELU and Bias gradient to
 *                  matmul output. Store GELU gradient in the output matrix, and
 *                  Bias gradient in the auxiliary output (see
 *                  CUBLASLT_MATMUL_DESC_BIAS_POINTER)": a bias broadcast along
 *                  the columns has the row sums as gradient; hpc's
 *                  tests/gpu/gpu_runtime.c checks the same)
 *   BGRADA         bias[i] = sum over k of op(A)(i, k), i < m ("The bias size
 *                  corresponds to the number of rows of the matrix D. The
 *                  reduction happens over the GEMM's k dimension")
 *   BGRADB         bias[j] = sum over k of op(B)(k, j), j < n ("... the number
 *                  of columns of the matrix D ... over the GEMM's k dimension")
 *   alpha and beta do not scale the BGRADA/BGRADB sums (hpc passes alpha 1).
 * GELU is cuBLASLt's tanh form, 0.5 x (1 + tanh(0.7978845608 (x + 0.044715 x^3))),
 * and gelu' its exact derivative.  Epilogues other than DEFAULT need a batch
 * count of 1 and the strided mode (no BIAS_BATCH_STRIDE / AUX_BATCH_STRIDE);
 * the RELU family is not emulated: CUBLAS_STATUS_NOT_SUPPORTED.
 *
 * The heuristic offers three algorithms (config IDs 0, 1, 2; no workspace;
 * one wave) that compute the same bits, so hpc's tuner has candidates to
 * time; their cublasLtMatmulAlgo_t bytes are deterministic (a tag, the ID,
 * zeros), so the tuning cache can memcmp them.  cublasLtMatmulAlgoCheck
 * accepts exactly those.
 *
 * Errors: what the real library reports by status is reported by status
 * (CUBLAS_STATUS_NOT_INITIALIZED for a NULL handle, INVALID_VALUE for NULL
 * descriptors, wrong attribute sizes, an unknown batch mode, inconsistent
 * shapes, batch counts or batch modes, missing epilogue pointers, C == D
 * with differing layouts, C and D overlapping without being the same
 * matrix (a byte-range test); NOT_SUPPORTED for types, epilogues and
 * attributes not emulated); with CUBLASLT_LOG_LEVEL >= 1 (the real
 * library's variable) each such status is explained on stderr.  What the
 * GPU would turn into a fault or silent corruption dies (emu_die): an
 * operand not inside one live allocation (checked at the call and again
 * when the queued GEMM runs, so a graph replayed after a free is caught;
 * a pointer array's entries only when it runs), overlapping matrices of a
 * pointer-array batch as above, a memory order other than column-major.
 *
 * Thread safety: no global state; handles, descriptors and calls on
 * different threads do not interact (gemm_prime's workers run concurrently).
 * Needs libm (tanh).
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuemu.h"
#include "cpu/half.h"

/* cublasLt.h declares one function without a prototype. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
/* the library is built with -fvisibility=hidden: these are its exports */
#pragma GCC visibility push(default)
#include <cublasLt.h>
#pragma GCC visibility pop
#pragma GCC diagnostic pop

/* ---- objects ---------------------------------------------------------------- */

/* Magic numbers tell a live object of the right kind from anything else. */
enum {
    HANDLE_MAGIC = 0x4c544831, /* "LTH1" */
    DESC_MAGIC = 0x4c544431,   /* "LTD1" */
    LAYOUT_MAGIC = 0x4c544c31, /* "LTL1" */
    PREF_MAGIC = 0x4c545031,   /* "LTP1" */
};

/* <cublasLt.h> declares the handle's struct and leaves it to the library. */
struct cublasLtContext {
    uint32_t magic;
};

typedef struct {
    uint32_t magic;
    int32_t compute;        /* cublasComputeType_t */
    int32_t scale;          /* cudaDataType_t of alpha and beta */
    int32_t trans_a, trans_b;
    uint32_t epilogue;      /* cublasLtEpilogue_t */
    void *bias;             /* bias (read) or bias gradient (written) */
    int32_t bias_type;      /* -1: D's type */
    void *aux;              /* GELU input: written by GELU_AUX*, read by DGELU* */
    int64_t aux_ld;
    int32_t aux_type;       /* -1: D's type */
} Desc;

typedef struct {
    uint32_t magic;
    int32_t type;           /* cudaDataType_t */
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    uint32_t mode;          /* cublasLtBatchMode_t: STRIDED (0, the default) or POINTER_ARRAY */
    int64_t stride;         /* elements between the matrices of a strided batch */
} Layout;

typedef struct {
    uint32_t magic;
    uint32_t search_mode;
    uint64_t max_workspace;
    uint32_t reduction_mask;
    uint32_t align[4];      /* minimum alignment of A, B, C, D in bytes */
    float max_waves;
    uint64_t impl_mask;
} Pref;

/* Our objects live in storage of the header's opaque size, so that a caller
 * that copies the opaque struct copies all of ours. */
_Static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t), "Desc fits the opaque descriptor");
_Static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t), "Layout fits the opaque layout");
_Static_assert(sizeof(Pref) <= sizeof(cublasLtMatmulPreferenceOpaque_t), "Pref fits the opaque preference");

static Desc *desc_of(cublasLtMatmulDesc_t d)
{
    Desc *p = (Desc *)(void *)d;
    return p && p->magic == DESC_MAGIC ? p : NULL;
}

static Layout *layout_of(cublasLtMatrixLayout_t l)
{
    Layout *p = (Layout *)(void *)l;
    return p && p->magic == LAYOUT_MAGIC ? p : NULL;
}

static Pref *pref_of(cublasLtMatmulPreference_t pr)
{
    Pref *p = (Pref *)(void *)pr;
    return p && p->magic == PREF_MAGIC ? p : NULL;
}

static int handle_ok(cublasLtHandle_t h) { return h && h->magic == HANDLE_MAGIC; }

/* ---- status reporting --------------------------------------------------------- */

/* Returns st; explains it on stderr when CUBLASLT_LOG_LEVEL >= 1 (the real
 * library's switch for its error log). */
__attribute__((format(printf, 3, 4)))
static cublasStatus_t fail(cublasStatus_t st, const char *fn, const char *fmt, ...)
{
    const char *lvl = getenv("CUBLASLT_LOG_LEVEL");
    if (lvl && atoi(lvl) >= 1) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "cuemu: [cublasLt][Error][%s] %s: ", fn, cublasLtGetStatusName(st));
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
    return st;
}

const char *CUBLASWINAPI cublasLtGetStatusName(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *CUBLASWINAPI cublasLtGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "an error was detected when checking the current licensing";
    }
    return "unknown error";
}

/* The header's version number (major * 10000 + minor * 100 + patch). */
size_t CUBLASWINAPI cublasLtGetVersion(void) { return CUBLAS_VERSION; }

/* ---- handle ------------------------------------------------------------------- */

cublasStatus_t CUBLASWINAPI cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (!lightHandle) return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "NULL handle pointer");
    struct cublasLtContext *h = calloc(1, sizeof *h);
    if (!h) return fail(CUBLAS_STATUS_ALLOC_FAILED, __func__, "out of memory");
    h->magic = HANDLE_MAGIC;
    *lightHandle = h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    if (!handle_ok(lightHandle)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, __func__, "not a live handle");
    lightHandle->magic = 0;
    free(lightHandle);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- attribute helpers ----------------------------------------------------------- */

/* Copies an attribute's value of exactly `want` bytes into dst. */
static cublasStatus_t take(void *dst, size_t want, const void *buf, size_t size, const char *fn, int attr)
{
    if (!buf || size != want)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "attribute %d takes %zu bytes, got %zu%s", attr, want, size,
                    buf ? "" : " (NULL buffer)");
    memcpy(dst, buf, want);
    return CUBLAS_STATUS_SUCCESS;
}

static int is_float_type(int32_t t) { return t == CUDA_R_16F || t == CUDA_R_16BF || t == CUDA_R_32F; }

static size_t type_size(int32_t t) { return t == CUDA_R_32F ? 4 : 2; }

/* ---- matmul descriptor -------------------------------------------------------------- */

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                                     cublasComputeType_t computeType,
                                                     cudaDataType_t scaleType)
{
    if (!matmulDesc) return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "NULL descriptor pointer");
    Desc *d = calloc(1, sizeof(cublasLtMatmulDescOpaque_t));
    if (!d) return fail(CUBLAS_STATUS_ALLOC_FAILED, __func__, "out of memory");
    d->magic = DESC_MAGIC;
    d->compute = (int32_t)computeType;
    d->scale = (int32_t)scaleType;
    d->trans_a = d->trans_b = CUBLAS_OP_N;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->bias_type = d->aux_type = -1;
    *matmulDesc = (cublasLtMatmulDesc_t)(void *)d;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    if (!matmulDesc) return CUBLAS_STATUS_SUCCESS;
    Desc *d = desc_of(matmulDesc);
    if (!d) return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "not a live matmul descriptor");
    d->magic = 0;
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t take_op(int32_t *dst, const void *buf, size_t size, const char *fn, int attr)
{
    int32_t v = 0;
    cublasStatus_t st = take(&v, sizeof v, buf, size, fn, attr);
    if (st) return st;
    if (v == CUBLAS_OP_C) v = CUBLAS_OP_T;   /* the conjugate of a real matrix is itself */
    if (v != CUBLAS_OP_N && v != CUBLAS_OP_T)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "transpose operation %d", (int)v);
    *dst = v;
    return CUBLAS_STATUS_SUCCESS;
}

/* A data type attribute: -1 (the default) or one of the emulated types. */
static cublasStatus_t take_type(int32_t *dst, const void *buf, size_t size, const char *fn, int attr)
{
    int32_t v = 0;
    cublasStatus_t st = take(&v, sizeof v, buf, size, fn, attr);
    if (st) return st;
    if (v != -1 && !is_float_type(v))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "data type %d (attribute %d) is not emulated", (int)v, attr);
    *dst = v;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                                           cublasLtMatmulDescAttributes_t attr,
                                                           const void *buf, size_t sizeInBytes)
{
    const char *fn = __func__;
    Desc *d = desc_of(matmulDesc);
    if (!d) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "not a live matmul descriptor");
    int a = (int)attr;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return take(&d->compute, sizeof d->compute, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return take(&d->scale, sizeof d->scale, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: {
        int32_t mode = 0;
        cublasStatus_t st = take(&mode, sizeof mode, buf, sizeInBytes, fn, a);
        if (!st && mode != CUBLASLT_POINTER_MODE_HOST)
            return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "pointer mode %d: only host pointers are emulated",
                        (int)mode);
        return st;
    }
    case CUBLASLT_MATMUL_DESC_TRANSA: return take_op(&d->trans_a, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_DESC_TRANSB: return take_op(&d->trans_b, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_DESC_TRANSC: {
        int32_t op = 0;
        cublasStatus_t st = take(&op, sizeof op, buf, sizeInBytes, fn, a);
        if (!st && op != CUBLAS_OP_N)
            return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "TRANSC %d: only CUBLAS_OP_N is supported", (int)op);
        return st;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE: return take(&d->epilogue, sizeof d->epilogue, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return take(&d->bias, sizeof d->bias, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return take_type(&d->bias_type, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: return take(&d->aux, sizeof d->aux, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: return take(&d->aux_ld, sizeof d->aux_ld, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: return take_type(&d->aux_type, buf, sizeInBytes, fn, a);
    default:
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "matmul descriptor attribute %d is not emulated", a);
    }
}

/* ---- matrix layout --------------------------------------------------------------------- */

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                                       uint64_t rows, uint64_t cols, int64_t ld)
{
    if (!matLayout) return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "NULL layout pointer");
    Layout *l = calloc(1, sizeof(cublasLtMatrixLayoutOpaque_t));
    if (!l) return fail(CUBLAS_STATUS_ALLOC_FAILED, __func__, "out of memory");
    l->magic = LAYOUT_MAGIC;
    l->type = (int32_t)type;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
    l->batch = 1;
    l->mode = CUBLASLT_BATCH_MODE_STRIDED;
    *matLayout = (cublasLtMatrixLayout_t)(void *)l;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    if (!matLayout) return CUBLAS_STATUS_SUCCESS;
    Layout *l = layout_of(matLayout);
    if (!l) return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "not a live matrix layout");
    l->magic = 0;
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t matLayout,
                                                             cublasLtMatrixLayoutAttribute_t attr,
                                                             const void *buf, size_t sizeInBytes)
{
    const char *fn = __func__;
    Layout *l = layout_of(matLayout);
    if (!l) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "not a live matrix layout");
    int a = (int)attr;
    switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE: return take(&l->type, sizeof l->type, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATRIX_LAYOUT_ROWS: return take(&l->rows, sizeof l->rows, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATRIX_LAYOUT_COLS: return take(&l->cols, sizeof l->cols, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATRIX_LAYOUT_LD: return take(&l->ld, sizeof l->ld, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET:
        return take(&l->stride, sizeof l->stride, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: {
        int32_t n = 0;
        cublasStatus_t st = take(&n, sizeof n, buf, sizeInBytes, fn, a);
        if (st) return st;
        if (n < 1) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "batch count %d", (int)n);
        l->batch = n;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATRIX_LAYOUT_BATCH_MODE: {
        uint32_t mode = 0;
        cublasStatus_t st = take(&mode, sizeof mode, buf, sizeInBytes, fn, a);
        if (st) return st;
        if (mode != CUBLASLT_BATCH_MODE_STRIDED && mode != CUBLASLT_BATCH_MODE_POINTER_ARRAY)
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "batch mode %u: not CUBLASLT_BATCH_MODE_STRIDED (%d) or "
                        "CUBLASLT_BATCH_MODE_POINTER_ARRAY (%d)", mode, (int)CUBLASLT_BATCH_MODE_STRIDED,
                        (int)CUBLASLT_BATCH_MODE_POINTER_ARRAY);
        l->mode = mode;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATRIX_LAYOUT_ORDER: {
        int32_t order = 0;
        cublasStatus_t st = take(&order, sizeof order, buf, sizeInBytes, fn, a);
        if (!st && order != CUBLASLT_ORDER_COL)
            emu_die("cublasLtMatrixLayoutSetAttribute: memory order %d is not emulated (only CUBLASLT_ORDER_COL)",
                    (int)order);
        return st;
    }
    default:
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "matrix layout attribute %d is not emulated", a);
    }
}

/* ---- heuristic preference ------------------------------------------------------------------ */

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref) return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "NULL preference pointer");
    Pref *p = calloc(1, sizeof(cublasLtMatmulPreferenceOpaque_t));
    if (!p) return fail(CUBLAS_STATUS_ALLOC_FAILED, __func__, "out of memory");
    p->magic = PREF_MAGIC;
    p->search_mode = CUBLASLT_SEARCH_BEST_FIT;
    p->reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    for (int i = 0; i < 4; i++) p->align[i] = 256;
    p->impl_mask = UINT64_MAX;
    *pref = (cublasLtMatmulPreference_t)(void *)p;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    if (!pref) return CUBLAS_STATUS_SUCCESS;
    Pref *p = pref_of(pref);
    if (!p) return fail(CUBLAS_STATUS_INVALID_VALUE, __func__, "not a live preference");
    p->magic = 0;
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}

/* Stored only: the emulated algorithms need no workspace and no alignment
 * beyond an element's, so every preference admits them. */
cublasStatus_t CUBLASWINAPI cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                                 cublasLtMatmulPreferenceAttributes_t attr,
                                                                 const void *buf, size_t sizeInBytes)
{
    const char *fn = __func__;
    Pref *p = pref_of(pref);
    if (!p) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "not a live preference");
    int a = (int)attr;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_SEARCH_MODE: return take(&p->search_mode, 4, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return take(&p->max_workspace, 8, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: return take(&p->reduction_mask, 4, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return take(&p->align[0], 4, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return take(&p->align[1], 4, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return take(&p->align[2], 4, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return take(&p->align[3], 4, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_PREF_MAX_WAVES_COUNT: return take(&p->max_waves, 4, buf, sizeInBytes, fn, a);
    case CUBLASLT_MATMUL_PREF_IMPL_MASK: return take(&p->impl_mask, 8, buf, sizeInBytes, fn, a);
    default:
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "preference attribute %d is not emulated", a);
    }
}

/* ---- the problem: checked descriptors ---------------------------------------------------------------- */

/* Epilogue flags, from cublasLtEpilogue_t's composition. */
enum {
    EPI_BIAS = 1,       /* add bias[i] */
    EPI_GELU = 2,       /* D = gelu(.) */
    EPI_AUX_OUT = 4,    /* aux = the GELU input */
    EPI_DGELU = 8,      /* D = . * gelu'(aux) */
    EPI_BGRAD_ROWS = 16, /* bias[i] = row sums of D (DGELU_BGRAD) */
    EPI_BGRAD_A = 32,   /* bias[i] = sum_k op(A)(i, k) */
    EPI_BGRAD_B = 64,   /* bias[j] = sum_k op(B)(k, j) */
};

/* The flags of an emulated epilogue; -1 for any other. */
static int epilogue_flags(uint32_t e)
{
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return 0;
    case CUBLASLT_EPILOGUE_BIAS: return EPI_BIAS;
    case CUBLASLT_EPILOGUE_GELU: return EPI_GELU;
    case CUBLASLT_EPILOGUE_GELU_BIAS: return EPI_BIAS | EPI_GELU;
    case CUBLASLT_EPILOGUE_GELU_AUX: return EPI_GELU | EPI_AUX_OUT;
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return EPI_BIAS | EPI_GELU | EPI_AUX_OUT;
    case CUBLASLT_EPILOGUE_DGELU: return EPI_DGELU;
    case CUBLASLT_EPILOGUE_DGELU_BGRAD: return EPI_DGELU | EPI_BGRAD_ROWS;
    case CUBLASLT_EPILOGUE_BGRADA: return EPI_BGRAD_A;
    case CUBLASLT_EPILOGUE_BGRADB: return EPI_BGRAD_B;
    }
    return -1;
}

static int uses_bias_pointer(int f) { return f & (EPI_BIAS | EPI_BGRAD_ROWS | EPI_BGRAD_A | EPI_BGRAD_B); }
static int uses_aux(int f) { return f & (EPI_AUX_OUT | EPI_DGELU); }

/* A GEMM described by its descriptors, in cuBLASLt's (column-major) terms. */
typedef struct {
    int64_t m, n, k, batch;
    int trans_a, trans_b;
    int32_t ab_type, cd_type, bias_type, aux_type;
    int flags;              /* EPI_* */
    int ptr_array;          /* CUBLASLT_BATCH_MODE_POINTER_ARRAY: A, B, C, D are arrays of matrix pointers */
    int64_t lda, ldb, ldc, ldd, aux_ld;
    int64_t stride_a, stride_b, stride_c, stride_d;   /* 0 with pointer arrays */
} Problem;

/* Whether the compute, scale and matrix types form an emulated combination. */
static int types_supported(const Desc *d, const Layout *a, const Layout *b, const Layout *c, const Layout *dd)
{
    if (d->scale != CUDA_R_32F || a->type != b->type || c->type != dd->type) return 0;
    int32_t ab = a->type, cd = c->type;
    switch (d->compute) {
    case CUBLAS_COMPUTE_32F:
        return (ab == CUDA_R_32F && cd == CUDA_R_32F) || (ab == CUDA_R_16F && (cd == CUDA_R_16F || cd == CUDA_R_32F)) ||
               (ab == CUDA_R_16BF && (cd == CUDA_R_16BF || cd == CUDA_R_32F));
    case CUBLAS_COMPUTE_32F_FAST_TF32:
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
        return ab == CUDA_R_32F && cd == CUDA_R_32F;
    default:
        return 0;
    }
}

/* Whether an operand of rows x cols with ld, batch matrices stride apart,
 * spans a number of bytes that int64 arithmetic can count (no overflow in
 * the offsets computed later). */
static int span_fits(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride)
{
    int64_t x, y, z;
    if (rows == 0 || cols == 0) return 1;
    return !__builtin_mul_overflow(batch - 1, stride, &x) && !__builtin_mul_overflow(cols - 1, ld, &y) &&
           !__builtin_add_overflow(x, y, &z) && !__builtin_add_overflow(z, rows, &z) && z <= INT64_MAX / 4;
}

/* A layout's dimensions as checked int64 values (the stride only where a
 * strided batch uses it: a pointer-array batch spans one matrix a pointer). */
static cublasStatus_t layout_dims(const Layout *l, const char *name, int64_t *rows, int64_t *cols, const char *fn)
{
    int strided = l->mode == CUBLASLT_BATCH_MODE_STRIDED;
    if (l->rows > INT32_MAX || l->cols > INT32_MAX)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "%s is %llu x %llu: more than int32 rows or columns", name,
                    (unsigned long long)l->rows, (unsigned long long)l->cols);
    *rows = (int64_t)l->rows;
    *cols = (int64_t)l->cols;
    if (l->ld < (*rows > 1 ? *rows : 1))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "%s has %lld rows but leading dimension %lld", name,
                    (long long)*rows, (long long)l->ld);
    if (strided && l->stride < 0)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "%s has a negative batch stride %lld", name,
                    (long long)l->stride);
    if (!span_fits(*rows, *cols, l->ld, strided ? l->batch : 1, strided ? l->stride : 0))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "%s (ld %lld, batch %d, stride %lld) spans more than 2^63 bytes",
                    name, (long long)l->ld, (int)l->batch, (long long)l->stride);
    return CUBLAS_STATUS_SUCCESS;
}

/* Checks what the heuristic, AlgoCheck and Matmul all need (no data
 * pointers) and fills *p. */
static cublasStatus_t problem_make(Problem *p, cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                                   cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, cublasLtMatrixLayout_t ld,
                                   const char *fn)
{
    if (!handle_ok(h)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "not a live cuBLASLt handle");
    const Desc *d = desc_of(desc);
    const Layout *a = layout_of(la), *b = layout_of(lb), *c = layout_of(lc), *dd = layout_of(ld);
    if (!d) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "not a live matmul descriptor");
    if (!a || !b || !c || !dd) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "a matrix layout is not a live layout");
    if (!types_supported(d, a, b, c, dd))
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn,
                    "compute %d scale %d A %d B %d C %d D %d is not an emulated type combination", (int)d->compute,
                    (int)d->scale, (int)a->type, (int)b->type, (int)c->type, (int)dd->type);
    int flags = epilogue_flags(d->epilogue);
    if (flags < 0) return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "epilogue %u is not emulated", d->epilogue);

    int64_t ar, ac, br, bc, cr, cc, dr, dc;
    cublasStatus_t st;
    if ((st = layout_dims(a, "A", &ar, &ac, fn)) || (st = layout_dims(b, "B", &br, &bc, fn)) ||
        (st = layout_dims(c, "C", &cr, &cc, fn)) || (st = layout_dims(dd, "D", &dr, &dc, fn)))
        return st;
    memset(p, 0, sizeof *p);
    p->trans_a = d->trans_a == CUBLAS_OP_T;
    p->trans_b = d->trans_b == CUBLAS_OP_T;
    p->m = dr;
    p->n = dc;
    p->k = p->trans_a ? ar : ac;
    int64_t a_m = p->trans_a ? ac : ar, b_k = p->trans_b ? bc : br, b_n = p->trans_b ? br : bc;
    if (cr != dr || cc != dc || a_m != p->m || b_k != p->k || b_n != p->n)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn,
                    "shapes disagree: op%s(A) %lld x %lld, op%s(B) %lld x %lld, C %lld x %lld, D %lld x %lld",
                    p->trans_a ? "T" : "N", (long long)a_m, (long long)p->k, p->trans_b ? "T" : "N", (long long)b_k,
                    (long long)b_n, (long long)cr, (long long)cc, (long long)dr, (long long)dc);
    if (a->batch != dd->batch || b->batch != dd->batch || c->batch != dd->batch)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "batch counts differ: A %d B %d C %d D %d", (int)a->batch,
                    (int)b->batch, (int)c->batch, (int)dd->batch);
    if (a->mode != dd->mode || b->mode != dd->mode || c->mode != dd->mode)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "batch modes differ: A %u B %u C %u D %u (0 strided, 1 pointer "
                    "array; the four layouts of one matmul need the same)", a->mode, b->mode, c->mode, dd->mode);
    p->batch = dd->batch;
    p->ptr_array = dd->mode == CUBLASLT_BATCH_MODE_POINTER_ARRAY;
    if (flags && p->batch != 1)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "epilogue %u with batch count %d: epilogues are emulated for "
                    "batch count 1 only", d->epilogue, (int)p->batch);
    if (flags && p->ptr_array)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "epilogue %u with CUBLASLT_BATCH_MODE_POINTER_ARRAY: epilogues "
                    "are emulated for strided batches only", d->epilogue);
    p->flags = flags;
    p->ab_type = a->type;
    p->cd_type = dd->type;
    p->bias_type = d->bias_type == -1 ? dd->type : d->bias_type;
    p->aux_type = d->aux_type == -1 ? dd->type : d->aux_type;
    if (uses_aux(flags)) {
        p->aux_ld = d->aux_ld;
        if (p->aux_ld < p->m || p->aux_ld % 8 != 0 || p->aux_ld < 1 || !span_fits(p->m, p->n, p->aux_ld, 1, 0))
            return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "EPILOGUE_AUX_LD %lld: must be a multiple of 8 and >= the "
                        "%lld rows of D", (long long)p->aux_ld, (long long)p->m);
    }
    p->lda = a->ld; p->ldb = b->ld; p->ldc = c->ld; p->ldd = dd->ld;
    if (!p->ptr_array) {   /* a pointer-array batch has no use for the strides */
        p->stride_a = a->stride; p->stride_b = b->stride; p->stride_c = c->stride; p->stride_d = dd->stride;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- algorithms ---------------------------------------------------------------------------------- */

/* An emulated algorithm's bytes: data[0] = ALGO_TAG, data[1] = its config
 * ID (0 .. ALGO_COUNT - 1), the rest zero. */
#define ALGO_TAG UINT64_C(0x744c756d65756300)   /* "\0cuemuLt" */
enum { ALGO_COUNT = 3 };

static int algo_ok(const cublasLtMatmulAlgo_t *algo)
{
    if (algo->data[0] != ALGO_TAG || algo->data[1] >= ALGO_COUNT) return 0;
    for (int i = 2; i < 8; i++)
        if (algo->data[i]) return 0;
    return 1;
}

static void result_fill(cublasLtMatmulHeuristicResult_t *r, int id)
{
    memset(r, 0, sizeof *r);
    r->algo.data[0] = ALGO_TAG;
    r->algo.data[1] = (uint64_t)id;
    r->workspaceSize = 0;
    r->state = CUBLAS_STATUS_SUCCESS;
    r->wavesCount = 1.0f;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                                           cublasLtMatmulDesc_t operationDesc,
                                                           cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                           cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                           cublasLtMatmulPreference_t preference,
                                                           int requestedAlgoCount,
                                                           cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                           int *returnAlgoCount)
{
    const char *fn = __func__;
    if (returnAlgoCount) *returnAlgoCount = 0;   /* hpc reads it also after a failure */
    if (!handle_ok(lightHandle)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "not a live cuBLASLt handle");
    if (requestedAlgoCount <= 0 || !heuristicResultsArray || !returnAlgoCount)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "requestedAlgoCount %d, results %p, count %p", requestedAlgoCount,
                    (void *)heuristicResultsArray, (void *)returnAlgoCount);
    const Pref *pref = pref_of(preference);
    if (!pref) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "not a live preference");
    if (pref->search_mode != CUBLASLT_SEARCH_BEST_FIT)
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, fn, "search mode %u is not emulated", pref->search_mode);
    Problem p;
    cublasStatus_t st = problem_make(&p, lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, fn);
    if (st) return st;
    int n = requestedAlgoCount < ALGO_COUNT ? requestedAlgoCount : ALGO_COUNT;
    for (int i = 0; i < n; i++) result_fill(&heuristicResultsArray[i], i);
    *returnAlgoCount = n;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmulAlgoCheck(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc,
                                                    cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                    cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                    const cublasLtMatmulAlgo_t *algo,
                                                    cublasLtMatmulHeuristicResult_t *result)
{
    const char *fn = __func__;
    if (!handle_ok(lightHandle)) return fail(CUBLAS_STATUS_NOT_INITIALIZED, fn, "not a live cuBLASLt handle");
    if (!algo || !result) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL algorithm or result");
    Problem p;
    cublasStatus_t st = problem_make(&p, lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, fn);
    if (st) return st;
    if (!algo_ok(algo)) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "not an algorithm of this library's heuristic");
    /* "algo field is never updated" (and algo may point to result->algo) */
    result->workspaceSize = 0;
    result->state = CUBLAS_STATUS_SUCCESS;
    result->wavesCount = 1.0f;
    memset(result->reserved, 0, sizeof result->reserved);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- number formats --------------------------------------------------------------------------------- */

/* hpc's own conversions (runtime/cpu/half.c, linked into the library):
 * round to nearest even, overflow to inf, subnormals exact, NaN kept. */
/* count elements base[start + q * step], q < count, of type t, as floats. */
static void load_floats(int32_t t, const void *base, int64_t start, int64_t step, int64_t count, float *out)
{
    if (t == CUDA_R_32F) {
        const float *s = (const float *)base + start;
        for (int64_t q = 0; q < count; q++) out[q] = s[q * step];
    } else if (t == CUDA_R_16F) {
        const uint16_t *s = (const uint16_t *)base + start;
        for (int64_t q = 0; q < count; q++) out[q] = half_to_f32(s[q * step]);
    } else {
        const uint16_t *s = (const uint16_t *)base + start;
        for (int64_t q = 0; q < count; q++) out[q] = bf16_to_f32(s[q * step]);
    }
}

static float load_one(int32_t t, const void *base, int64_t i)
{
    float v;
    load_floats(t, base, i, 1, 1, &v);
    return v;
}

static void store_one(int32_t t, void *base, int64_t i, float v)
{
    if (t == CUDA_R_32F)
        ((float *)base)[i] = v;
    else if (t == CUDA_R_16F)
        ((uint16_t *)base)[i] = half_from_f32(v);
    else
        ((uint16_t *)base)[i] = bf16_from_f32(v);
}

/* ---- GELU (tanh form) --------------------------------------------------------------------------------- */

static const double GELU_C = 0.7978845608028654;   /* sqrt(2 / pi) */
static const double GELU_A = 0.044715;

static float gelu(float xf)
{
    double x = xf, t = tanh(GELU_C * (x + GELU_A * x * x * x));
    return (float)(0.5 * x * (1.0 + t));
}

/* d/dx of gelu above. */
static float gelu_grad(float xf)
{
    double x = xf, t = tanh(GELU_C * (x + GELU_A * x * x * x));
    return (float)(0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * x * x));
}

/* ---- the queued work ------------------------------------------------------------------------------------- */

/* Everything a queued GEMM needs, by value (a captured graph keeps a copy). */
typedef struct {
    Problem p;
    float alpha, beta;
    const void *A, *B, *C;
    void *D, *bias, *aux;
} Job;

/* Elements an operand spans: rows x cols with ld, batch matrices stride apart. */
static int64_t span_elems(int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride)
{
    if (rows == 0 || cols == 0 || batch == 0) return 0;
    return (batch - 1) * stride + (cols - 1) * ld + rows;
}

/* Dies unless [ptr, ptr + elems of t) lies in one live allocation. */
static void check_memory(const char *when, const char *name, const void *ptr, int64_t elems, int32_t t)
{
    if (elems == 0) return;
    size_t bytes = (size_t)elems * type_size(t);
    if ((uintptr_t)ptr % type_size(t))   /* the GPU would fault on a misaligned access */
        emu_die("cublasLtMatmul (%s): %s at %p is not aligned to its %zu-byte elements", when, name, ptr, type_size(t));
    if (!emu_mem_valid(ptr, bytes))
        emu_die("cublasLtMatmul (%s): %s at %p, %zu bytes, is not inside one live device allocation", when, name, ptr,
                bytes);
}

/* Dies unless a pointer array, batch device pointers at ptr, lies in one
 * live allocation (before any entry of it is read). */
static void check_array(const char *when, const char *name, const void *ptr, int64_t batch)
{
    size_t bytes = (size_t)batch * sizeof(uint64_t);
    if ((uintptr_t)ptr % sizeof(uint64_t))
        emu_die("cublasLtMatmul (%s): the pointer array of %s at %p is not aligned to its 8-byte entries", when, name,
                ptr);
    if (!emu_mem_valid(ptr, bytes))
        emu_die("cublasLtMatmul (%s): the pointer array of %s at %p, %zu bytes (batch count %lld), is not inside one "
                "live device allocation", when, name, ptr, bytes, (long long)batch);
}

/* The operand extents of a job (shared by the call and the queued run;
 * neither calls it for an empty D, which reads and writes nothing). */
static void job_check_memory(const Job *j, const char *when)
{
    const Problem *p = &j->p;
    int64_t ar = p->trans_a ? p->k : p->m, ac = p->trans_a ? p->m : p->k;
    int64_t br = p->trans_b ? p->n : p->k, bc = p->trans_b ? p->k : p->n;
    if (p->ptr_array) {   /* the arrays here; the matrices they name when the GEMM runs (ptr_array_matrices) */
        if (span_elems(ar, ac, p->lda, 1, 0)) check_array(when, "A", j->A, p->batch);
        if (span_elems(br, bc, p->ldb, 1, 0)) check_array(when, "B", j->B, p->batch);
        if (j->beta != 0.0f) check_array(when, "C", j->C, p->batch);
        check_array(when, "D", j->D, p->batch);
        return;   /* no epilogue with pointer arrays (problem_make) */
    }
    check_memory(when, "A", j->A, span_elems(ar, ac, p->lda, p->batch, p->stride_a), p->ab_type);
    check_memory(when, "B", j->B, span_elems(br, bc, p->ldb, p->batch, p->stride_b), p->ab_type);
    if (j->beta != 0.0f)
        check_memory(when, "C", j->C, span_elems(p->m, p->n, p->ldc, p->batch, p->stride_c), p->cd_type);
    check_memory(when, "D", j->D, span_elems(p->m, p->n, p->ldd, p->batch, p->stride_d), p->cd_type);
    if (uses_bias_pointer(p->flags))
        check_memory(when, "the bias vector", j->bias, p->flags & EPI_BGRAD_B ? p->n : p->m, p->bias_type);
    if (uses_aux(p->flags))
        check_memory(when, "the epilogue aux matrix", j->aux, span_elems(p->m, p->n, p->aux_ld, 1, 0), p->aux_type);
}

/* Rows per panel of op(A): a compile-time trip count lets gcc -O2 (its
 * "very cheap" vectorizer) vectorize the inner loops with no remainder. */
enum { MB = 64, NJ = 4 };

/* Work buffers of one GEMM (op(A) in zero-padded MB-row panels, op(B) by
 * columns, zero-padded to a multiple of NJ columns). */
typedef struct {
    float *ap;      /* panel q, row r, column kk at ap[q * MB * k + kk * MB + r] */
    float *bp;      /* column j, row kk at bp[j * k + kk] */
    float *tmp;     /* one row or column of an operand */
    double *rowsum; /* DGELU_BGRAD's row sums */
    int64_t panels, n_pad;
} Work;

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) emu_die("cublasLtMatmul: out of host memory (%zu x %zu bytes)", n, size);
    return p;
}

static void work_alloc(Work *w, const Problem *p)
{
    w->panels = (p->m + MB - 1) / MB;
    w->n_pad = (p->n + NJ - 1) / NJ * NJ;
    w->ap = xcalloc((size_t)(w->panels * MB * p->k), sizeof(float));
    w->bp = xcalloc((size_t)(w->n_pad * p->k), sizeof(float));
    w->tmp = xcalloc((size_t)(p->k > p->n ? p->k : p->n) + (size_t)p->m, sizeof(float));
    w->rowsum = xcalloc((size_t)p->m, sizeof(double));
}

static void work_free(Work *w)
{
    free(w->ap);
    free(w->bp);
    free(w->tmp);
    free(w->rowsum);
}

/* op(A) (m x k) as floats in row panels; rows past m stay zero. */
static void pack_a(const Problem *p, const void *A, Work *w)
{
    for (int64_t i0 = 0; i0 < p->m; i0 += MB) {
        float *panel = w->ap + (i0 / MB) * MB * p->k;
        int64_t mb = p->m - i0 < MB ? p->m - i0 : MB;
        if (!p->trans_a)   /* A is m x k: op(A)(i, kk) = A[i + kk lda], a column is contiguous */
            for (int64_t kk = 0; kk < p->k; kk++) load_floats(p->ab_type, A, i0 + kk * p->lda, 1, mb, panel + kk * MB);
        else               /* A is k x m: op(A)(i, kk) = A[kk + i lda], a row of op(A) is contiguous */
            for (int64_t r = 0; r < mb; r++) {
                load_floats(p->ab_type, A, (i0 + r) * p->lda, 1, p->k, w->tmp);
                for (int64_t kk = 0; kk < p->k; kk++) panel[kk * MB + r] = w->tmp[kk];
            }
    }
}

/* op(B) (k x n) as floats by columns; columns past n stay zero. */
static void pack_b(const Problem *p, const void *B, Work *w)
{
    if (!p->trans_b)   /* B is k x n: a column of op(B) is contiguous */
        for (int64_t j = 0; j < p->n; j++) load_floats(p->ab_type, B, j * p->ldb, 1, p->k, w->bp + j * p->k);
    else               /* B is n x k: op(B)(kk, j) = B[j + kk ldb], a row of op(B) is contiguous */
        for (int64_t kk = 0; kk < p->k; kk++) {
            load_floats(p->ab_type, B, kk * p->ldb, 1, p->n, w->tmp);
            for (int64_t j = 0; j < p->n; j++) w->bp[j * p->k + kk] = w->tmp[j];
        }
}

/* c_q[r] = sum over kk (in order) of panel(r, kk) * b_q[kk], for NJ columns
 * q and the MB rows r of one panel. */
static void panel_times_4(const float *restrict panel, int64_t k, const float *restrict b0,
                          const float *restrict b1, const float *restrict b2, const float *restrict b3,
                          float *restrict c0, float *restrict c1, float *restrict c2, float *restrict c3)
{
    for (int r = 0; r < MB; r++) c0[r] = c1[r] = c2[r] = c3[r] = 0.0f;
    for (int64_t kk = 0; kk < k; kk++) {
        const float *restrict a = panel + kk * MB;
        const float x0 = b0[kk], x1 = b1[kk], x2 = b2[kk], x3 = b3[kk];
        for (int r = 0; r < MB; r++) {
            c0[r] += a[r] * x0;
            c1[r] += a[r] * x1;
            c2[r] += a[r] * x2;
            c3[r] += a[r] * x3;
        }
    }
}

/* Scales, adds beta C, applies the epilogue to rows i0 .. i0 + mb of column
 * j (acc = op(A) op(B) there) and stores D. */
static void finish_column(const Job *jb, const void *C, void *D, int64_t j, int64_t i0, int64_t mb,
                          const float *acc, double *rowsum)
{
    const Problem *p = &jb->p;
    for (int64_t r = 0; r < mb; r++) {
        int64_t i = i0 + r;
        float v = jb->alpha * acc[r];
        if (jb->beta != 0.0f) v += jb->beta * load_one(p->cd_type, C, i + j * p->ldc);   /* before D(i, j) is written */
        if (p->flags & EPI_BIAS) v += load_one(p->bias_type, jb->bias, i);
        if (p->flags & EPI_AUX_OUT) store_one(p->aux_type, jb->aux, i + j * p->aux_ld, v);
        if (p->flags & EPI_GELU) v = gelu(v);
        if (p->flags & EPI_DGELU) v *= gelu_grad(load_one(p->aux_type, jb->aux, i + j * p->aux_ld));
        if (p->flags & EPI_BGRAD_ROWS) rowsum[i] += v;
        store_one(p->cd_type, D, i + j * p->ldd, v);
    }
}

/* BGRADA / BGRADB: sums over k of op(A)'s rows or op(B)'s columns (no alpha). */
static void bias_grad_operand(const Job *jb, const Work *w)
{
    const Problem *p = &jb->p;
    if (p->flags & EPI_BGRAD_A)
        for (int64_t i = 0; i < p->m; i++) {
            const float *panel = w->ap + (i / MB) * MB * p->k;
            double s = 0;
            for (int64_t kk = 0; kk < p->k; kk++) s += panel[kk * MB + i % MB];
            store_one(p->bias_type, jb->bias, i, (float)s);
        }
    if (p->flags & EPI_BGRAD_B)
        for (int64_t j = 0; j < p->n; j++) {
            double s = 0;
            for (int64_t kk = 0; kk < p->k; kk++) s += w->bp[j * p->k + kk];
            store_one(p->bias_type, jb->bias, j, (float)s);
        }
}

/* One matrix of the batch. */
static void gemm_one(const Job *jb, const void *A, const void *B, const void *C, void *D, Work *w)
{
    const Problem *p = &jb->p;
    float acc[NJ][MB];
    if (p->k > 0) {   /* with k == 0, op(A) op(B) = 0 and A, B may be NULL */
        pack_a(p, A, w);
        pack_b(p, B, w);
    }
    if (p->flags & EPI_BGRAD_ROWS) memset(w->rowsum, 0, (size_t)p->m * sizeof *w->rowsum);
    for (int64_t q = 0; q < w->panels; q++) {
        const float *panel = w->ap + q * MB * p->k;
        int64_t i0 = q * MB, mb = p->m - i0 < MB ? p->m - i0 : MB;
        for (int64_t j0 = 0; j0 < p->n; j0 += NJ) {
            const float *b = w->bp + j0 * p->k;
            panel_times_4(panel, p->k, b, b + p->k, b + 2 * p->k, b + 3 * p->k, acc[0], acc[1], acc[2], acc[3]);
            for (int64_t c = 0; c < NJ && j0 + c < p->n; c++)
                finish_column(jb, C, D, j0 + c, i0, mb, acc[c], w->rowsum);
        }
    }
    if (p->flags & EPI_BGRAD_ROWS)
        for (int64_t i = 0; i < p->m; i++) store_one(p->bias_type, jb->bias, i, (float)w->rowsum[i]);
    bias_grad_operand(jb, w);
}

/* ---- pointer-array batches ------------------------------------------------------------------------------- */

/* The operands of one matrix of a pointer-array batch. */
typedef struct {
    const void *A, *B, *C;
    void *D;
} Mats;

/* Entry b of a device array of device pointers. */
static void *array_entry(const void *array, int64_t b)
{
    uint64_t v;
    memcpy(&v, (const char *)array + (size_t)b * sizeof v, sizeof v);
    return (void *)(uintptr_t)v;
}

/* A byte range of a C or D matrix, for the overlap sweep. */
typedef struct {
    uintptr_t lo, hi;   /* [lo, hi) */
    int64_t b;          /* its index in the batch */
    int is_d;           /* written (D[b], or C[b] == D[b] in place) */
} Span;

static int span_cmp(const void *x, const void *y)
{
    const Span *a = x, *b = y;
    return a->lo < b->lo ? -1 : a->lo > b->lo;
}

/* Dies where the GPU's result would depend on the order of its blocks: a D
 * matrix sharing a byte with another D, with any A or B matrix, or with a
 * C that is not its own in-place C (A, B and C matrices may share bytes:
 * they are only read; a D over another matrix's input is what hpc's first
 * batched dW GEMMs did, runtime/cuda/cuda_exec_dw_batch.c).  One sweep
 * by start address: a range meets an earlier one iff it starts below the
 * largest end so far (of the D ranges, for a C). */
static void check_overlaps(const Job *jb, const Mats *x, const char *when)
{
    const Problem *p = &jb->p;
    size_t cd = type_size(p->cd_type);
    size_t c_bytes = (size_t)span_elems(p->m, p->n, p->ldc, 1, 0) * cd;
    size_t d_bytes = (size_t)span_elems(p->m, p->n, p->ldd, 1, 0) * cd;
    size_t ab = type_size(p->ab_type);
    size_t a_bytes = (size_t)span_elems(p->trans_a ? p->k : p->m, p->trans_a ? p->m : p->k, p->lda, 1, 0) * ab;
    size_t b_bytes = (size_t)span_elems(p->trans_b ? p->n : p->k, p->trans_b ? p->k : p->n, p->ldb, 1, 0) * ab;
    Span *s = xcalloc((size_t)(4 * p->batch), sizeof *s);
    size_t n = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        s[n++] = (Span){(uintptr_t)x[b].D, (uintptr_t)x[b].D + d_bytes, b, 1};
        if (x[b].A) s[n++] = (Span){(uintptr_t)x[b].A, (uintptr_t)x[b].A + a_bytes, b, 0};
        if (x[b].B) s[n++] = (Span){(uintptr_t)x[b].B, (uintptr_t)x[b].B + b_bytes, b, 0};
        if (jb->beta == 0.0f) continue;   /* C is not read */
        if (x[b].C == x[b].D) {
            if (p->ldc != p->ldd)
                emu_die("cublasLtMatmul (%s): C[%lld] == D[%lld] in place, but C's ld %lld differs from D's %lld",
                        when, (long long)b, (long long)b, (long long)p->ldc, (long long)p->ldd);
            continue;   /* in place: D's range stands for both */
        }
        s[n++] = (Span){(uintptr_t)x[b].C, (uintptr_t)x[b].C + c_bytes, b, 0};
    }
    qsort(s, n, sizeof *s, span_cmp);
    const Span *far_any = NULL, *far_d = NULL;   /* the ranges reaching furthest so far */
    for (size_t i = 0; i < n; i++) {
        const Span *hit = s[i].is_d ? far_any : far_d;
        if (hit && s[i].lo < hit->hi)
            emu_die("cublasLtMatmul (%s): pointer-array batch: %s[%lld] at %p and %s[%lld] at %p overlap (D matrices "
                    "must not share bytes with another matrix of the batch: A, B, C or D)", when,
                    hit->is_d ? "D" : "an input", (long long)hit->b, (void *)hit->lo, s[i].is_d ? "D" : "an input",
                    (long long)s[i].b, (void *)s[i].lo);
        if (!far_any || s[i].hi > far_any->hi) far_any = &s[i];
        if (s[i].is_d && (!far_d || s[i].hi > far_d->hi)) far_d = &s[i];
    }
    free(s);
}

/* Every matrix's operands, read from the pointer arrays as the queued GEMM
 * runs (an earlier copy on the stream or in the graph may have written
 * them), each checked as one matrix of a strided batch is; an operand not
 * read (A and B with k == 0, C with beta == 0) stays NULL.  Free the result. */
static Mats *ptr_array_matrices(const Job *jb, const char *when)
{
    const Problem *p = &jb->p;
    int64_t ar = p->trans_a ? p->k : p->m, ac = p->trans_a ? p->m : p->k;
    int64_t br = p->trans_b ? p->n : p->k, bc = p->trans_b ? p->k : p->n;
    int64_t a_elems = span_elems(ar, ac, p->lda, 1, 0), b_elems = span_elems(br, bc, p->ldb, 1, 0);
    int64_t c_elems = jb->beta != 0.0f ? span_elems(p->m, p->n, p->ldc, 1, 0) : 0;
    int64_t d_elems = span_elems(p->m, p->n, p->ldd, 1, 0);
    Mats *x = xcalloc((size_t)p->batch, sizeof *x);
    char name[32];
    for (int64_t b = 0; b < p->batch; b++) {
        if (a_elems) {
            x[b].A = array_entry(jb->A, b);
            snprintf(name, sizeof name, "A[%lld]", (long long)b);
            check_memory(when, name, x[b].A, a_elems, p->ab_type);
        }
        if (b_elems) {
            x[b].B = array_entry(jb->B, b);
            snprintf(name, sizeof name, "B[%lld]", (long long)b);
            check_memory(when, name, x[b].B, b_elems, p->ab_type);
        }
        if (c_elems) {
            x[b].C = array_entry(jb->C, b);
            snprintf(name, sizeof name, "C[%lld]", (long long)b);
            check_memory(when, name, x[b].C, c_elems, p->cd_type);
        }
        x[b].D = array_entry(jb->D, b);
        snprintf(name, sizeof name, "D[%lld]", (long long)b);
        check_memory(when, name, x[b].D, d_elems, p->cd_type);
    }
    check_overlaps(jb, x, when);
    return x;
}

/* The stream's work item: every matrix of the batch, in order. */
static void run_matmul(void *arg)
{
    const Job *jb = arg;
    const Problem *p = &jb->p;
    if (p->m == 0 || p->n == 0) return;   /* nothing to read or write (the call checked nothing either) */
    const char *when = "when the queued GEMM ran";
    job_check_memory(jb, when);
    Mats *x = p->ptr_array ? ptr_array_matrices(jb, when) : NULL;
    Work w;
    work_alloc(&w, p);
    size_t ab = type_size(p->ab_type), cd = type_size(p->cd_type);
    for (int64_t b = 0; b < p->batch; b++) {
        if (x) {   /* the same arithmetic, matrix by matrix, as a strided batch */
            gemm_one(jb, x[b].A, x[b].B, x[b].C, x[b].D, &w);
            continue;
        }
        const char *A = (const char *)jb->A + (size_t)(b * p->stride_a) * ab;
        const char *B = (const char *)jb->B + (size_t)(b * p->stride_b) * ab;
        const char *C = jb->beta != 0.0f ? (const char *)jb->C + (size_t)(b * p->stride_c) * cd : NULL;
        char *D = (char *)jb->D + (size_t)(b * p->stride_d) * cd;
        gemm_one(jb, A, B, C, D, &w);
    }
    free(x);
    work_free(&w);
}

/* ---- cublasLtMatmul ------------------------------------------------------------------------------------------ */

/* Whether [a, a + na) and [b, b + nb) (bytes) share a byte. */
static int overlaps(const void *a, size_t na, const void *b, size_t nb)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

cublasStatus_t CUBLASWINAPI cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                           const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                                           const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                                           const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                                           cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                                           void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream)
{
    const char *fn = __func__;
    Job jb;
    memset(&jb, 0, sizeof jb);
    cublasStatus_t st = problem_make(&jb.p, lightHandle, computeDesc, Adesc, Bdesc, Cdesc, Ddesc, fn);
    if (st) return st;
    if (algo && !algo_ok(algo)) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "not an algorithm of this library");
    if (!alpha || !beta) return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL alpha or beta");
    (void)workspace;   /* the emulated algorithms need none */
    (void)workspaceSizeInBytes;
    const Problem *p = &jb.p;
    const Desc *d = desc_of(computeDesc);
    memcpy(&jb.alpha, alpha, sizeof jb.alpha);   /* host pointer mode: read now */
    memcpy(&jb.beta, beta, sizeof jb.beta);
    jb.A = A; jb.B = B; jb.C = C; jb.D = D;
    jb.bias = d->bias;
    jb.aux = d->aux;
    int empty = p->m == 0 || p->n == 0;
    if (!empty && (!D || (p->k && (!A || !B)) || (jb.beta != 0.0f && !C)))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "NULL matrix: A %p B %p C %p D %p (beta %g)", A, B, C, (void *)D,
                    (double)jb.beta);
    if (!empty && uses_bias_pointer(p->flags) && !jb.bias)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "epilogue %u needs CUBLASLT_MATMUL_DESC_BIAS_POINTER",
                    d->epilogue);
    if (!empty && uses_aux(p->flags) && !jb.aux)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "epilogue %u needs CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER",
                    d->epilogue);
    /* "in-place (C == D and Cdesc == Ddesc)" or out-of-place, apart */
    int same_layout = p->ldc == p->ldd && (p->batch == 1 || p->ptr_array || p->stride_c == p->stride_d);
    if (C == D && !same_layout)
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "C == D in place, but C (ld %lld, stride %lld) and D (ld %lld, "
                    "stride %lld) differ in layout", (long long)p->ldc, (long long)p->stride_c, (long long)p->ldd,
                    (long long)p->stride_d);
    size_t c_bytes = (size_t)span_elems(p->m, p->n, p->ldc, p->batch, p->stride_c) * type_size(p->cd_type);
    size_t d_bytes = (size_t)span_elems(p->m, p->n, p->ldd, p->batch, p->stride_d) * type_size(p->cd_type);
    /* (pointer arrays: their matrices are checked when the GEMM runs, check_overlaps) */
    if (!p->ptr_array && jb.beta != 0.0f && C != D && overlaps(C, c_bytes, D, d_bytes))
        return fail(CUBLAS_STATUS_INVALID_VALUE, fn, "C %p and D %p overlap without being the same matrix", C,
                    (void *)D);
    if (!empty) job_check_memory(&jb, "at the call");
    CUresult r = emu_stream_enqueue((CUstream)stream, run_matmul, &jb, sizeof jb);
    if (r != CUDA_SUCCESS)
        return fail(CUBLAS_STATUS_EXECUTION_FAILED, fn, "the stream refused the GEMM (CUresult %d)", (int)r);
    return CUBLAS_STATUS_SUCCESS;
}
