/* bench/dw_batched.c — would BERT-base's weight-gradient GEMMs run faster
 * as one batched cuBLASLt call per weight shape than one call per layer?
 *
 * At small token counts (B x L = 1024) a dW GEMM such as 768 x 768 x 1024
 * has 36-48 output tiles for 132 SMs, so each call leaves most of the GPU
 * idle (hpc's 32 x 32 graph profile: 7-14 us a call).  No dW GEMM feeds
 * anything else in the backward pass, so the 12 layers' calls of one shape
 * could run as one batch of 12 at the step's end, if their inputs stay
 * alive until then.  This measures what that would save before the plan
 * and executor are changed for it.  For each weight shape (out, in) of a
 * BERT-base layer, at T tokens, with f16 dy (T, out) and x (T, in) and an
 * f32 dW (out, in) per layer, as the step's dW GEMMs:
 *   seq      12 plain calls, one per layer (each layer's own buffers);
 *   strided  one call of batch 12 over buffers 12 apart by a fixed stride;
 *   pointers one call of batch 12 with device arrays of the 12 layers'
 *            pointers (CUBLASLT_BATCH_MODE_POINTER_ARRAY: the layout the
 *            step's arena would need, its buffers anywhere);
 * each the best of the heuristic's first 8 algorithms (as hpc's autotune),
 * timed as the best of 3 rounds of 5 runs after a warm-up (microseconds).
 * A variant cuBLASLt refuses prints "-".
 *
 *   make build/bench/dw_batched && build/bench/dw_batched [TOKENS...]   (default 1024 4096)
 *
 * Needs a GPU and libcublasLt; not part of `make test`. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOL_NAME "dw_batched"
#include "cuda_tool.h"

enum { LAYERS = 12, CANDIDATES = 8, ROUNDS = 3, RUNS = 5 };
static const size_t WORKSPACE = 32u << 20;

static cublasLtHandle_t lt;
static void *workspace;
static cudaStream_t stream;
static cudaEvent_t ev0, ev1;

/* One dW call: C (in x out, column-major: dW row-major (out, in)) = x^T dy
 * in cuBLASLt's terms, batch `batch`; pointers to the operands, or to
 * device arrays of them in pointer-array mode. */
typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    const void *a, *b;
    void *c;
    cublasLtMatmulAlgo_t algo[CANDIDATES];
    int found;
} Call;

static int call_init(Call *k, int out, int in, int T, int batch, int pointer_array, const void *x, const void *dy,
                     void *dw)
{
    memset(k, 0, sizeof *k);
    if (!tool_dw_desc(&k->op, &k->la, &k->lb, &k->lc, out, in, T, batch, pointer_array)) return 0;
    k->a = x;
    k->b = dy;
    k->c = dw;
    cublasLtMatmulPreference_t pref;
    size_t ws = WORKSPACE;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulHeuristicResult_t res[CANDIDATES];
    if (cublasLtMatmulAlgoGetHeuristic(lt, k->op, k->la, k->lb, k->lc, k->lc, pref, CANDIDATES, res, &k->found) !=
        CUBLAS_STATUS_SUCCESS)
        k->found = 0;
    cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; i < k->found; i++) k->algo[i] = res[i].algo;
    return k->found > 0;
}

static void call_free(Call *k)
{
    if (k->la) cublasLtMatrixLayoutDestroy(k->la);
    if (k->lb) cublasLtMatrixLayoutDestroy(k->lb);
    if (k->lc) cublasLtMatrixLayoutDestroy(k->lc);
    if (k->op) cublasLtMatmulDescDestroy(k->op);
}

static int run(const Call *k, int i)
{
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(lt, k->op, &one, k->a, k->la, k->b, k->lb, &zero, k->c, k->lc, k->c, k->lc, &k->algo[i],
                          workspace, WORKSPACE, stream) == CUBLAS_STATUS_SUCCESS;
}

/* Microseconds of one pass over n calls with algorithm pick[c] each, the
 * best of ROUNDS rounds of RUNS passes; -1 if any call fails. */
typedef struct { const Call *k; const int *pick; int n; } Pass;

static int run_pass(const void *ctx)
{
    const Pass *p = ctx;
    for (int c = 0; c < p->n; c++)
        if (!run(&p->k[c], p->pick[c])) return 0;
    return 1;
}

static double time_calls(const Call *k, const int *pick, int n)
{
    Pass p = {k, pick, n};
    if (!run_pass(&p)) return -1;   /* the warm-up */
    return tool_best_us(run_pass, &p, stream, ev0, ev1, ROUNDS, RUNS);
}

/* The fastest of call k's candidates alone (its index into *pick); its time. */
static double best_alone(const Call *k, int *pick)
{
    double best = -1;
    *pick = 0;
    for (int i = 0; i < k->found; i++) {
        double us = time_calls(k, &i, 1);
        if (us >= 0 && (best < 0 || us < best)) {
            best = us;
            *pick = i;
        }
    }
    return best;
}

static void measure(int out, int in, int T)
{
    size_t nx = (size_t)T * in, ndy = (size_t)T * out, nw = (size_t)out * in;
    /* one block of 12 layers' operands, the layers nx (ndy, nw) elements apart */
    char *x = tool_random_f16(nx * LAYERS), *dy = tool_random_f16(ndy * LAYERS);
    float *dw = NULL;
    TOOL_CHECK_CUDA(cudaMalloc((void **)&dw, nw * LAYERS * sizeof *dw));
    Call seq[LAYERS], strided, pointers;
    int pick[LAYERS], ok = 1;
    for (int l = 0; l < LAYERS; l++)
        ok &= call_init(&seq[l], out, in, T, 1, 0, x + 2 * nx * l, dy + 2 * ndy * l, dw + nw * l);
    double t_seq = -1;
    if (ok) {
        best_alone(&seq[0], &pick[0]);
        for (int l = 1; l < LAYERS; l++) pick[l] = pick[0];   /* the same shape: the same choice */
        t_seq = time_calls(seq, pick, LAYERS);
    }
    int sp = 0, pp = 0;
    double t_strided = call_init(&strided, out, in, T, LAYERS, 0, x, dy, dw) ? best_alone(&strided, &sp) : -1;
    /* the pointer arrays: each layer's x, dy and dW, in device memory */
    const void *ha[LAYERS], *hb[LAYERS];
    void *hc[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        ha[l] = x + 2 * nx * l;
        hb[l] = dy + 2 * ndy * l;
        hc[l] = dw + nw * l;
    }
    void *da = NULL, *db = NULL, *dc = NULL;
    TOOL_CHECK_CUDA(cudaMalloc(&da, sizeof ha));
    TOOL_CHECK_CUDA(cudaMalloc(&db, sizeof hb));
    TOOL_CHECK_CUDA(cudaMalloc(&dc, sizeof hc));
    TOOL_CHECK_CUDA(cudaMemcpy(da, ha, sizeof ha, cudaMemcpyHostToDevice));
    TOOL_CHECK_CUDA(cudaMemcpy(db, hb, sizeof hb, cudaMemcpyHostToDevice));
    TOOL_CHECK_CUDA(cudaMemcpy(dc, hc, sizeof hc, cudaMemcpyHostToDevice));
    double t_pointers = call_init(&pointers, out, in, T, LAYERS, 1, da, db, dc) ? best_alone(&pointers, &pp) : -1;
    char s1[32] = "-", s2[32] = "-", s3[32] = "-";
    if (t_seq >= 0) snprintf(s1, sizeof s1, "%.1f", t_seq);
    if (t_strided >= 0) snprintf(s2, sizeof s2, "%.1f (%+.0f %%)", t_strided, 100.0 * (t_strided - t_seq) / t_seq);
    if (t_pointers >= 0) snprintf(s3, sizeof s3, "%.1f (%+.0f %%)", t_pointers, 100.0 * (t_pointers - t_seq) / t_seq);
    printf("T=%-6d dW %4dx%-4d  seq %10s us   strided %18s us   pointers %18s us\n", T, out, in, s1, s2, s3);
    fflush(stdout);
    for (int l = 0; l < LAYERS; l++) call_free(&seq[l]);
    call_free(&strided);
    call_free(&pointers);
    cudaFree(x);
    cudaFree(dy);
    cudaFree(dw);
    cudaFree(da);
    cudaFree(db);
    cudaFree(dc);
}

int main(int argc, char **argv)
{
    int tokens[8] = {1024, 4096}, n = 2;
    if (argc > 1) {
        n = 0;
        for (int i = 1; i < argc && n < 8; i++) {
            tokens[n] = atoi(argv[i]);
            if (tokens[n++] < 1) {
                fprintf(stderr, "usage: dw_batched [TOKENS...]   (B x L, default 1024 4096)\n");
                return 2;
            }
        }
    }
    tool_setup(&stream, &ev0, &ev1, &workspace, WORKSPACE);
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 1;
    static const int linears[4][2] = {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}};   /* (out, in) */
    for (int t = 0; t < n; t++)
        for (int l = 0; l < 4; l++) measure(linears[l][0], linears[l][1], tokens[t]);
    cublasLtDestroy(lt);
    cudaFree(workspace);
    return 0;
}
