/* tests/emu/cublaslt_ptr_array.c — the emulator's cuBLASLt pointer-array
 * batches (tools/cuemu/emu_cublaslt.c: CUBLASLT_MATRIX_LAYOUT_BATCH_MODE =
 * CUBLASLT_BATCH_MODE_POINTER_ARRAY, A/B/C/D device arrays of device
 * pointers).
 *
 * Checks: batches of 3 f16 x f16 -> f32 (and one -> f16) GEMMs, every
 * CUBLAS_OP_N / CUBLAS_OP_T pair, in place (C == D, beta 0 and beta 1)
 * and out of place (C != D, beta != 0), each matrix in an allocation of its
 * own, on random data, equal bit for bit to three plain calls of the same
 * shapes; the same batch captured in a graph behind the copy that writes
 * its pointer arrays, launched with two different tables (the arrays are
 * read when the GEMM runs, not at the call); the heuristic and
 * AlgoCheck with pointer-array layouts; failures: layouts of one matmul in
 * different modes (INVALID_VALUE, also from the heuristic), an unknown
 * mode and a wrongly sized attribute (INVALID_VALUE), an epilogue with
 * pointer arrays (NOT_SUPPORTED); in a child process each, what the
 * emulator kills (a matrix running past its allocation, a NULL entry, two
 * D matrices sharing bytes, C[i] overlapping another D).
 *
 * Not in the Makefile (a plain program; it links the emulator directly):
 *   make build/cuemu/libcuemu.so && mkdir -p build/tests/emu &&
 *   cc -std=gnu11 -O2 -Wall -Wextra -isystem /usr/local/cuda/include \
 *      -o build/tests/emu/cublaslt_ptr_array tests/emu/cublaslt_ptr_array.c \
 *      build/cuemu/libcuemu.so -Wl,-rpath,$PWD/build/cuemu &&
 *   build/tests/emu/cublaslt_ptr_array
 * Linked instead with -L/usr/local/cuda/lib64 -lcublasLt -lcuda it runs on
 * a GPU: the bit-for-bit comparisons, the statuses the emulator chose and
 * the child-process checks are then reported ("info"), not judged, since
 * they are the emulator's promises, not cuBLASLt's.
 * Exit status: 0 when every check passed, 1 otherwise. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cublasLt.h>
#pragma GCC diagnostic pop

static int g_checks, g_failures, g_emulated;

/* A check of the emulator's promises: judged under the emulator, reported on a GPU. */
static void result(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void result(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s  ", ok ? "ok  " : g_emulated ? "FAIL" : "info");
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
    fflush(stdout);
    g_checks++;
    g_failures += !ok && g_emulated;
}

#define DRV(call)                                                                                    \
    do {                                                                                             \
        CUresult r_ = (call);                                                                        \
        if (r_ != CUDA_SUCCESS) {                                                                    \
            printf("FAIL  %s: CUresult %d (line %d)\n", #call, (int)r_, __LINE__);                   \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)
#define LT(call)                                                                                     \
    do {                                                                                             \
        cublasStatus_t s_ = (call);                                                                  \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                           \
            printf("FAIL  %s: %s (line %d)\n", #call, cublasLtGetStatusName(s_), __LINE__);          \
            exit(1);                                                                                 \
        }                                                                                            \
    } while (0)

static cublasLtHandle_t g_lt;
static CUstream g_stream;
static uint64_t g_rng = 0x9e3779b97f4a7c15u;

static uint32_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}

/* A random f16 in +-[1/4, 2): no zeros, every mantissa bit in play. */
static uint16_t rnd_half(void)
{
    uint32_t r = rnd();
    return (uint16_t)((r & 0x8000u) | ((13u + r % 3u) << 10) | ((r >> 16) & 0x3ffu));
}

static float rnd_float(void) { return ((float)(rnd() >> 8) / 16777216.0f) * 4.0f - 2.0f; }

/* A device buffer of exactly `bytes` (so a span past it leaves the allocation). */
static CUdeviceptr dev_alloc(size_t bytes)
{
    CUdeviceptr p;
    DRV(cuMemAlloc(&p, bytes));
    return p;
}

/* A device buffer of random contents: f16 (two-byte elements) or f32. */
static CUdeviceptr dev_random(size_t elems, int half)
{
    size_t es = half ? 2 : 4;
    void *h = malloc(elems * es);
    for (size_t i = 0; i < elems; i++) {
        if (half)
            ((uint16_t *)h)[i] = rnd_half();
        else
            ((float *)h)[i] = rnd_float();
    }
    CUdeviceptr d = dev_alloc(elems * es);
    DRV(cuMemcpyHtoD(d, h, elems * es));
    free(h);
    return d;
}

static CUdeviceptr dev_copy(CUdeviceptr src, size_t bytes)
{
    CUdeviceptr d = dev_alloc(bytes);
    DRV(cuMemcpyDtoD(d, src, bytes));
    return d;
}

/* One GEMM shape, column-major as cuBLASLt: D (m x n) = alpha op(A) op(B) + beta C. */
typedef struct {
    const char *name;
    int ta, tb;                 /* 1: CUBLAS_OP_T */
    int64_t m, n, k, lda, ldb, ldc, ldd;
    cudaDataType_t cd;          /* C and D: CUDA_R_32F or CUDA_R_16F */
    float alpha, beta;
    int in_place;               /* C == D (the same arrays; ldc == ldd) */
} Shape;

static size_t cd_size(const Shape *s) { return s->cd == CUDA_R_32F ? 4 : 2; }
static size_t a_elems(const Shape *s) { return (size_t)(s->lda * ((s->ta ? s->m : s->k) - 1) + (s->ta ? s->k : s->m)); }
static size_t b_elems(const Shape *s) { return (size_t)(s->ldb * ((s->tb ? s->k : s->n) - 1) + (s->tb ? s->n : s->k)); }
static size_t c_elems(const Shape *s) { return (size_t)(s->ldc * (s->n - 1) + s->m); }
static size_t d_elems(const Shape *s) { return (size_t)(s->ldd * (s->n - 1) + s->m); }

/* mode < 0: the attribute left at its default. */
static cublasLtMatrixLayout_t layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int32_t batch, int mode)
{
    cublasLtMatrixLayout_t l;
    LT(cublasLtMatrixLayoutCreate(&l, t, (uint64_t)rows, (uint64_t)cols, ld));
    if (batch != 1) LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
    if (mode >= 0) {
        uint32_t m = (uint32_t)mode;
        LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &m, sizeof m));
    }
    return l;
}

typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c, d;
} Descs;

/* modes[4]: the batch mode of A, B, C, D (-1: default). */
static Descs descs(const Shape *s, int32_t batch, const int modes[4])
{
    Descs x;
    LT(cublasLtMatmulDescCreate(&x.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    int32_t ta = s->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = s->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    x.a = layout(CUDA_R_16F, s->ta ? s->k : s->m, s->ta ? s->m : s->k, s->lda, batch, modes[0]);
    x.b = layout(CUDA_R_16F, s->tb ? s->n : s->k, s->tb ? s->k : s->n, s->ldb, batch, modes[1]);
    x.c = layout(s->cd, s->m, s->n, s->ldc, batch, modes[2]);
    x.d = layout(s->cd, s->m, s->n, s->ldd, batch, modes[3]);
    return x;
}

static void descs_free(Descs *x)
{
    cublasLtMatrixLayoutDestroy(x->a);
    cublasLtMatrixLayoutDestroy(x->b);
    cublasLtMatrixLayoutDestroy(x->c);
    cublasLtMatrixLayoutDestroy(x->d);
    cublasLtMatmulDescDestroy(x->op);
}

/* The heuristic's first algorithm for x (status in *st); its workspace need in *ws. */
static cublasStatus_t first_algo(const Descs *x, cublasLtMatmulAlgo_t *algo, size_t *ws)
{
    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t max_ws = 32u << 20;
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof max_ws));
    cublasLtMatmulHeuristicResult_t r[4];
    int n = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(g_lt, x->op, x->a, x->b, x->c, x->d, pref, 4, r, &n);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && n < 1) st = CUBLAS_STATUS_NOT_SUPPORTED;
    if (st == CUBLAS_STATUS_SUCCESS) {
        *algo = r[0].algo;
        *ws = r[0].workspaceSize;
    }
    return st;
}

static CUdeviceptr g_ws;   /* 32 MiB: the real library's algorithms may want some */

static cublasStatus_t matmul(const Descs *x, const Shape *s, CUdeviceptr A, CUdeviceptr B, CUdeviceptr C,
                             CUdeviceptr D, const cublasLtMatmulAlgo_t *algo, size_t ws, CUstream stream)
{
    return cublasLtMatmul(g_lt, x->op, &s->alpha, (const void *)A, x->a, (const void *)B, x->b, &s->beta,
                          (const void *)C, x->c, (void *)D, x->d, algo, (void *)g_ws, ws, (cudaStream_t)stream);
}

static const int STRIDED[4] = {-1, -1, -1, -1};
static const int PTRS[4] = {CUBLASLT_BATCH_MODE_POINTER_ARRAY, CUBLASLT_BATCH_MODE_POINTER_ARRAY,
                            CUBLASLT_BATCH_MODE_POINTER_ARRAY, CUBLASLT_BATCH_MODE_POINTER_ARRAY};

enum { NB = 3 };

/* The operands of a batch: each matrix its own allocation. */
typedef struct {
    CUdeviceptr A[NB], B[NB], C[NB], D[NB];   /* C[i] == D[i] in place */
    CUdeviceptr D0[NB];                       /* D's initial contents (for beta C when in place) */
} Operands;

static void operands_make(const Shape *s, Operands *o)
{
    for (int i = 0; i < NB; i++) {
        o->A[i] = dev_random(a_elems(s), 1);
        o->B[i] = dev_random(b_elems(s), 1);
        o->D0[i] = dev_random(d_elems(s), s->cd == CUDA_R_16F);
        o->D[i] = dev_copy(o->D0[i], d_elems(s) * cd_size(s));
        o->C[i] = s->in_place ? o->D[i] : dev_random(c_elems(s), s->cd == CUDA_R_16F);
    }
}

static void operands_free(Operands *o)
{
    for (int i = 0; i < NB; i++) {
        cuMemFree(o->A[i]);
        cuMemFree(o->B[i]);
        cuMemFree(o->D[i]);
        cuMemFree(o->D0[i]);
        if (o->C[i] != o->D[i]) cuMemFree(o->C[i]);
    }
}

/* An array of NB device pointers on the device. */
static CUdeviceptr ptr_array(const CUdeviceptr p[NB])
{
    uint64_t h[NB];
    for (int i = 0; i < NB; i++) h[i] = (uint64_t)p[i];
    CUdeviceptr d = dev_alloc(sizeof h);
    DRV(cuMemcpyHtoD(d, h, sizeof h));
    return d;
}

/* The expected D[i]: a plain call (batch count 1, default mode) on a fresh
 * copy of D's initial contents, with A[perm[i]] and B[perm[i]]. */
static void reference(const Shape *s, const Operands *o, const int perm[NB], void *out[NB])
{
    Descs x = descs(s, 1, STRIDED);
    cublasLtMatmulAlgo_t algo;
    size_t ws = 0;
    LT(first_algo(&x, &algo, &ws));
    size_t bytes = d_elems(s) * cd_size(s);
    for (int i = 0; i < NB; i++) {
        CUdeviceptr d = dev_copy(o->D0[i], bytes);
        CUdeviceptr c = s->in_place ? d : o->C[i];
        LT(matmul(&x, s, o->A[perm[i]], o->B[perm[i]], c, d, &algo, ws, g_stream));
        DRV(cuStreamSynchronize(g_stream));
        out[i] = malloc(bytes);
        DRV(cuMemcpyDtoH(out[i], d, bytes));
        cuMemFree(d);
    }
    descs_free(&x);
}

/* Whether D[i] holds exactly ref[i], for every i; and that the GEMM changed it. */
static int compare(const Shape *s, const Operands *o, void *ref[NB], char *why, size_t why_size)
{
    size_t bytes = d_elems(s) * cd_size(s);
    void *got = malloc(bytes), *init = malloc(bytes);
    int ok = 1;
    why[0] = 0;
    for (int i = 0; i < NB && ok; i++) {
        DRV(cuMemcpyDtoH(got, o->D[i], bytes));
        DRV(cuMemcpyDtoH(init, o->D0[i], bytes));
        size_t diff = 0, first = bytes;
        for (size_t b = 0; b < bytes; b++)
            if (((unsigned char *)got)[b] != ((unsigned char *)ref[i])[b]) {
                diff++;
                if (first == bytes) first = b;
            }
        if (diff) {
            snprintf(why, why_size, ": D[%d] differs in %zu bytes, first at element %zu", i, diff,
                     first / cd_size(s));
            ok = 0;
        } else if (!memcmp(got, init, bytes)) {
            snprintf(why, why_size, ": D[%d] was not written", i);
            ok = 0;
        }
    }
    free(got);
    free(init);
    return ok;
}

static void check_batch(const Shape *s)
{
    static const int ident[NB] = {0, 1, 2};
    Operands o;
    operands_make(s, &o);
    void *ref[NB];
    reference(s, &o, ident, ref);

    Descs x = descs(s, NB, PTRS);
    cublasLtMatmulAlgo_t algo;
    size_t ws = 0;
    cublasStatus_t st = first_algo(&x, &algo, &ws);
    result(st == CUBLAS_STATUS_SUCCESS, "%s: the heuristic offers an algorithm for pointer arrays (%s)", s->name,
           cublasLtGetStatusName(st));
    if (st == CUBLAS_STATUS_SUCCESS) {
        cublasLtMatmulHeuristicResult_t chk;
        st = cublasLtMatmulAlgoCheck(g_lt, x.op, x.a, x.b, x.c, x.d, &algo, &chk);
        result(st == CUBLAS_STATUS_SUCCESS, "%s: AlgoCheck accepts it (%s)", s->name, cublasLtGetStatusName(st));
        CUdeviceptr pa = ptr_array(o.A), pb = ptr_array(o.B), pc = ptr_array(o.C), pd = ptr_array(o.D);
        st = matmul(&x, s, pa, pb, s->in_place ? pd : pc, pd, &algo, ws, g_stream);
        DRV(cuStreamSynchronize(g_stream));
        char why[128];
        int same = st == CUBLAS_STATUS_SUCCESS && compare(s, &o, ref, why, sizeof why);
        result(same, "%s: a pointer-array batch of %d equals %d plain calls bit for bit%s%s", s->name, NB, NB,
               st ? ": " : "", st ? cublasLtGetStatusName(st) : why);
        cuMemFree(pa);
        cuMemFree(pb);
        cuMemFree(pc);
        cuMemFree(pd);
    }
    descs_free(&x);
    for (int i = 0; i < NB; i++) free(ref[i]);
    operands_free(&o);
}

/* The batch captured behind the copy of its pointer arrays from pinned
 * memory: the arrays hold NULLs at the call and during capture, and each
 * launch must use the table of that launch. */
static void check_graph(const Shape *s)
{
    static const int ident[NB] = {0, 1, 2}, rot[NB] = {1, 2, 0};
    Operands o;
    operands_make(s, &o);
    void *ref1[NB], *ref2[NB];
    reference(s, &o, ident, ref1);
    reference(s, &o, rot, ref2);

    Descs x = descs(s, NB, PTRS);
    cublasLtMatmulAlgo_t algo;
    size_t ws = 0;
    LT(first_algo(&x, &algo, &ws));
    /* one allocation for the four arrays, as an executor would build them */
    CUdeviceptr arrays = dev_alloc(4 * NB * sizeof(uint64_t));
    DRV(cuMemsetD8(arrays, 0, 4 * NB * sizeof(uint64_t)));
    uint64_t *table;
    DRV(cuMemAllocHost((void **)&table, 4 * NB * sizeof(uint64_t)));
    CUdeviceptr pa = arrays, pb = pa + NB * 8, pc = pb + NB * 8, pd = pc + NB * 8;

    CUgraph graph;
    CUgraphExec exec;
    DRV(cuStreamBeginCapture(g_stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    DRV(cuMemcpyHtoDAsync(arrays, table, 4 * NB * sizeof(uint64_t), g_stream));
    cublasStatus_t st = matmul(&x, s, pa, pb, s->in_place ? pd : pc, pd, &algo, ws, g_stream);
    DRV(cuStreamEndCapture(g_stream, &graph));
    DRV(cuGraphInstantiate(&exec, graph, 0));
    result(st == CUBLAS_STATUS_SUCCESS, "%s: captured with NULL entries in its arrays (%s)", s->name,
           cublasLtGetStatusName(st));

    for (int launch = 0; launch < 2 && st == CUBLAS_STATUS_SUCCESS; launch++) {
        const int *perm = launch ? rot : ident;
        for (int i = 0; i < NB; i++) {
            table[i] = o.A[perm[i]];
            table[NB + i] = o.B[perm[i]];
            table[2 * NB + i] = o.C[i];
            table[3 * NB + i] = o.D[i];
            DRV(cuMemcpyDtoD(o.D[i], o.D0[i], d_elems(s) * cd_size(s)));
        }
        DRV(cuGraphLaunch(exec, g_stream));
        DRV(cuStreamSynchronize(g_stream));
        char why[128];
        int same = compare(s, &o, launch ? ref2 : ref1, why, sizeof why);
        result(same, "%s: graph launch %d reads the pointer arrays its copy wrote%s", s->name, launch + 1, why);
    }
    cuGraphExecDestroy(exec);
    cuGraphDestroy(graph);
    cuMemFreeHost(table);
    cuMemFree(arrays);
    descs_free(&x);
    for (int i = 0; i < NB; i++) {
        free(ref1[i]);
        free(ref2[i]);
    }
    operands_free(&o);
}

/* Statuses: mixed modes, bad attribute values, an epilogue. */
static void check_refusals(const Shape *s)
{
    Operands o;
    operands_make(s, &o);
    CUdeviceptr pa = ptr_array(o.A), pb = ptr_array(o.B), pd = ptr_array(o.D);
    static const int mixes[4][4] = {
        {CUBLASLT_BATCH_MODE_POINTER_ARRAY, -1, -1, -1},
        {-1, -1, -1, CUBLASLT_BATCH_MODE_POINTER_ARRAY},
        {CUBLASLT_BATCH_MODE_POINTER_ARRAY, CUBLASLT_BATCH_MODE_POINTER_ARRAY, CUBLASLT_BATCH_MODE_STRIDED,
         CUBLASLT_BATCH_MODE_POINTER_ARRAY},
        {CUBLASLT_BATCH_MODE_POINTER_ARRAY, CUBLASLT_BATCH_MODE_POINTER_ARRAY, CUBLASLT_BATCH_MODE_POINTER_ARRAY,
         CUBLASLT_BATCH_MODE_STRIDED},
    };
    size_t bytes = d_elems(s) * cd_size(s);
    void *before = malloc(bytes), *after = malloc(bytes);
    for (int q = 0; q < 4; q++) {
        Descs x = descs(s, NB, mixes[q]);
        cublasLtMatmulAlgo_t algo;
        size_t ws = 0;
        cublasStatus_t hs = first_algo(&x, &algo, &ws);
        result(hs == CUBLAS_STATUS_INVALID_VALUE, "mixed modes A %d B %d C %d D %d: the heuristic refuses (%s)",
               mixes[q][0], mixes[q][1], mixes[q][2], mixes[q][3], cublasLtGetStatusName(hs));
        DRV(cuMemcpyDtoH(before, o.D[0], bytes));
        /* each pointer as its layout reads it, so a wrongly accepted call stays in bounds */
        CUdeviceptr A = mixes[q][0] == 1 ? pa : o.A[0], B = mixes[q][1] == 1 ? pb : o.B[0];
        CUdeviceptr D = mixes[q][3] == 1 ? pd : o.D[0];
        Shape one = *s;
        one.beta = 0.0f;   /* C is not read */
        cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
        if (g_emulated)    /* on a GPU a strided batch of 3 would run past these single matrices */
            st = matmul(&x, &one, A, B, D, D, NULL, 0, g_stream);
        DRV(cuStreamSynchronize(g_stream));
        DRV(cuMemcpyDtoH(after, o.D[0], bytes));
        result(st == CUBLAS_STATUS_INVALID_VALUE && !memcmp(before, after, bytes),
               "mixed modes A %d B %d C %d D %d: cublasLtMatmul refuses and writes nothing (%s)", mixes[q][0],
               mixes[q][1], mixes[q][2], mixes[q][3], cublasLtGetStatusName(st));
        descs_free(&x);
    }
    free(before);
    free(after);

    cublasLtMatrixLayout_t l;
    LT(cublasLtMatrixLayoutCreate(&l, CUDA_R_16F, 8, 8, 8));
    uint32_t bad = 7;
    cublasStatus_t st = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &bad, sizeof bad);
    result(st == CUBLAS_STATUS_INVALID_VALUE, "batch mode 7 is refused (%s)", cublasLtGetStatusName(st));
    uint64_t wide = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
    st = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &wide, sizeof wide);
    result(st == CUBLAS_STATUS_INVALID_VALUE, "batch mode in 8 bytes is refused (%s)", cublasLtGetStatusName(st));
    st = cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, NULL, sizeof(uint32_t));
    result(st == CUBLAS_STATUS_INVALID_VALUE, "batch mode from NULL is refused (%s)", cublasLtGetStatusName(st));
    cublasLtMatrixLayoutDestroy(l);

    Descs x = descs(s, NB, PTRS);
    uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    CUdeviceptr bias = dev_random((size_t)s->m, s->cd == CUDA_R_16F);
    LT(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    LT(cublasLtMatmulDescSetAttribute(x.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    cublasLtMatmulAlgo_t algo;
    size_t ws = 0;
    st = first_algo(&x, &algo, &ws);
    result(st == CUBLAS_STATUS_NOT_SUPPORTED, "the BIAS epilogue with pointer arrays: the heuristic says %s",
           cublasLtGetStatusName(st));
    if (g_emulated) {
        Shape one = *s;
        one.beta = 0.0f;
        st = matmul(&x, &one, pa, pb, pd, pd, NULL, 0, g_stream);
        result(st == CUBLAS_STATUS_NOT_SUPPORTED, "the BIAS epilogue with pointer arrays: cublasLtMatmul says %s",
               cublasLtGetStatusName(st));
    }
    descs_free(&x);
    cuMemFree(bias);
    cuMemFree(pa);
    cuMemFree(pb);
    cuMemFree(pd);
    operands_free(&o);
}

/* Runs a pointer-array batch whose arrays hold the given entries, in a
 * child process; whether the child died of SIGABRT (emu_die). */
static int dies(const Shape *s, const CUdeviceptr A[NB], const CUdeviceptr B[NB], const CUdeviceptr C[NB],
                const CUdeviceptr D[NB])
{
    CUdeviceptr pa = ptr_array(A), pb = ptr_array(B), pc = ptr_array(C), pd = ptr_array(D);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        Descs x = descs(s, NB, PTRS);
        cublasStatus_t st = matmul(&x, s, pa, pb, pc, pd, NULL, 0, g_stream);
        cuStreamSynchronize(g_stream);
        _exit(st == CUBLAS_STATUS_SUCCESS ? 0 : 3);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    cuMemFree(pa);
    cuMemFree(pb);
    cuMemFree(pc);
    cuMemFree(pd);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
}

/* What the GPU would fault on or race on: the emulator dies (emulator only). */
static void check_deaths(const Shape *s)
{
    Operands o;
    operands_make(s, &o);
    CUdeviceptr A[NB], B[NB], C[NB], D[NB];
    memcpy(A, o.A, sizeof A);
    memcpy(B, o.B, sizeof B);
    memcpy(C, o.C, sizeof C);
    memcpy(D, o.D, sizeof D);
    printf("      (each child below prints the emulator's message)\n");
    A[1] = o.A[1] + 2;   /* one element past the end of its allocation */
    result(dies(s, A, B, C, D), "A[1] running past its allocation dies");
    A[1] = o.A[1];
    B[2] = 0;
    result(dies(s, A, B, C, D), "a NULL entry B[2] dies");
    B[2] = o.B[2];
    CUdeviceptr big = dev_alloc(d_elems(s) * cd_size(s) * 2);
    D[0] = big;        /* both inside one allocation: only the overlap is wrong */
    D[2] = big + 16;
    result(dies(s, A, B, C, D), "D[0] and D[2] sharing bytes dies");
    D[0] = o.D[0];
    D[2] = o.D[2];
    if (s->beta != 0.0f && !s->in_place) {
        C[1] = D[0];
        result(dies(s, A, B, C, D), "C[1] == D[0] (another matrix's D) dies");
        C[1] = D[1];   /* in place, but ldc != ldd */
        result(s->ldc == s->ldd || dies(s, A, B, C, D), "C[1] == D[1] with ldc %lld != ldd %lld dies",
               (long long)s->ldc, (long long)s->ldd);
        C[1] = o.C[1];
    }
    result(!dies(s, A, B, C, D), "the same batch with its own entries runs");
    cuMemFree(big);
    operands_free(&o);
}

int main(void)
{
    DRV(cuInit(0));
    CUdevice dev;
    CUcontext ctx;
    DRV(cuDeviceGet(&dev, 0));
    DRV(cuDevicePrimaryCtxRetain(&ctx, dev));
    DRV(cuCtxSetCurrent(ctx));
    char name[128] = "";
    DRV(cuDeviceGetName(name, sizeof name, dev));
    g_emulated = strstr(name, "cuemu") != NULL;
    printf("cublaslt_ptr_array on %s (%s)\n", name, g_emulated ? "emulated: every check judged" : "a GPU: info only");
    DRV(cuStreamCreate(&g_stream, CU_STREAM_NON_BLOCKING));
    LT(cublasLtCreate(&g_lt));
    g_ws = dev_alloc(32u << 20);

    /* name, ta, tb, m, n, k, lda, ldb, ldc, ldd, cd, alpha, beta, in_place: m = 70 crosses the
     * emulator's 64-row panels, n = 11 its 4-column groups; lds padded. */
    const Shape shapes[] = {
        {"NN f32 beta 0 in place", 0, 0, 37, 11, 19, 40, 19, 37, 37, CUDA_R_32F, 1.0f, 0.0f, 1},
        {"NT f32 beta 0 in place (dW)", 0, 1, 70, 11, 19, 72, 13, 70, 70, CUDA_R_32F, 1.0f, 0.0f, 1},
        {"TN f32 beta 1 in place (accumulate)", 1, 0, 37, 11, 23, 24, 23, 40, 40, CUDA_R_32F, 1.0f, 1.0f, 1},
        {"TT f32 alpha .75 beta -.5 out of place", 1, 1, 70, 9, 19, 19, 9, 70, 72, CUDA_R_32F, 0.75f, -0.5f, 0},
        {"NT f16 beta .5 out of place", 0, 1, 37, 11, 19, 37, 11, 37, 40, CUDA_R_16F, 1.0f, 0.5f, 0},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_batch(&shapes[i]);
    check_graph(&shapes[1]);
    check_graph(&shapes[3]);
    check_refusals(&shapes[1]);
    if (g_emulated) check_deaths(&shapes[3]);

    cuMemFree(g_ws);
    cublasLtDestroy(g_lt);
    cuStreamDestroy(g_stream);
    printf("%d checks, %d failed\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
