/* bench/dw_ptr_check.c — does cuBLASLt's pointer-array batch compute BERT's
 * dW GEMMs as one call per layer does, for every algorithm its heuristic
 * proposes, within the workspace it says it needs?
 *
 * hpc's batched dW GEMMs (runtime/cuda/cuda_exec_dw_batch.c) gave
 * non-finite gradients on an H100 (tests/gpu/gpu_dw_batch.c, 2026-12-07)
 * where the same GEMMs one by one did not.  This takes cuBLASLt alone: for
 * each weight shape (out, in) of a BERT-base layer (the Q/K/V's with its
 * ones column: in 776), T tokens and a batch of n layers, with f16 dy
 * (T, out) and x (T, in) and an f32 dW (out, in) per layer, each in its
 * own allocation followed by a canary, as hpc calls it: the reference is
 * one plain call a layer (the heuristic's first algorithm); then each of
 * the heuristic's candidates (up to 8) for the pointer-array call runs once
 * with a workspace of exactly the size it reported, also followed by a
 * canary, over outputs filled with NaN.  A line per candidate: its index,
 * workspace, the largest difference from the reference relative to the
 * reference's largest magnitude (NaN: an output not written), and whether
 * a canary changed.
 *
 *   make build/bench/dw_ptr_check && build/bench/dw_ptr_check [TOKENS...]   (default 1024 4096)
 *
 * Needs a GPU and libcublasLt; not part of `make test`. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOL_NAME "dw_ptr_check"
#include "cuda_tool.h"

enum { MAX_LAYERS = 11, CANDIDATES = 8 };
static const size_t CANARY = 1u << 16;   /* bytes after each output and after the workspace */

static cublasLtHandle_t lt;
static cudaStream_t stream;

typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
} Desc;

/* hpc's dW call, pointer arrays when batched (cuda_tool.h). */
static void desc_make(Desc *k, int out, int in, int T, int batch)
{
    if (!tool_dw_desc(&k->op, &k->la, &k->lb, &k->lc, out, in, T, batch, 1)) {
        fprintf(stderr, "dw_ptr_check: cuBLASLt refused the descriptors of dW %dx%d batch %d\n", out, in, batch);
        exit(1);
    }
}

static void desc_free(Desc *k)
{
    cublasLtMatrixLayoutDestroy(k->la);
    cublasLtMatrixLayoutDestroy(k->lb);
    cublasLtMatrixLayoutDestroy(k->lc);
    cublasLtMatmulDescDestroy(k->op);
}

static int heuristic(const Desc *k, cublasLtMatmulHeuristicResult_t *res, int want)
{
    cublasLtMatmulPreference_t pref;
    size_t ws = 32u << 20;
    uint32_t align = 256;
    cublasLtMatmulPreferenceCreate(&pref);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    cublasLtMatmulPreferenceAttributes_t al[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) cublasLtMatmulPreferenceSetAttribute(pref, al[i], &align, sizeof align);
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt, k->op, k->la, k->lb, k->lc, k->lc, pref, want, res, &found) !=
        CUBLAS_STATUS_SUCCESS)
        found = 0;
    cublasLtMatmulPreferenceDestroy(pref);
    return found;
}

/* A device buffer of `bytes` followed by a canary of CANARY bytes of 0xA5. */
static void *guarded(size_t bytes)
{
    void *p = NULL;
    TOOL_CHECK_CUDA(cudaMalloc(&p, bytes + CANARY));
    TOOL_CHECK_CUDA(cudaMemset((char *)p + bytes, 0xA5, CANARY));
    return p;
}

static int canary_intact(const void *p, size_t bytes)
{
    unsigned char *h = malloc(CANARY);
    TOOL_CHECK_CUDA(cudaMemcpy(h, (const char *)p + bytes, CANARY, cudaMemcpyDeviceToHost));
    int ok = 1;
    for (size_t i = 0; i < CANARY && ok; i++) ok = h[i] == 0xA5;
    free(h);
    return ok;
}

static void check(int out, int in, int T, int n)
{
    size_t nx = (size_t)T * in, ndy = (size_t)T * out, nw = (size_t)out * in;
    void *x[MAX_LAYERS], *dy[MAX_LAYERS];
    float *ref[MAX_LAYERS], *got[MAX_LAYERS];
    const float one = 1.0f, zero = 0.0f;
    Desc single, batch;
    desc_make(&single, out, in, T, 1);
    desc_make(&batch, out, in, T, n);
    cublasLtMatmulHeuristicResult_t res[CANDIDATES];
    void *ws0 = NULL;
    TOOL_CHECK_CUDA(cudaMalloc(&ws0, 32u << 20));
    if (heuristic(&single, res, 1) < 1) {
        printf("T=%d dW %dx%d: no algorithm for the plain call\n", T, out, in);
        return;
    }
    for (int l = 0; l < n; l++) {
        x[l] = tool_random_f16(nx);
        dy[l] = tool_random_f16(ndy);
        TOOL_CHECK_CUDA(cudaMalloc((void **)&ref[l], nw * sizeof(float)));
        got[l] = guarded(nw * sizeof(float));
        if (cublasLtMatmul(lt, single.op, &one, x[l], single.la, dy[l], single.lb, &zero, ref[l], single.lc, ref[l],
                           single.lc, &res[0].algo, ws0, 32u << 20, stream) != CUBLAS_STATUS_SUCCESS)
            printf("T=%d dW %dx%d: the plain call failed\n", T, out, in);
    }
    void *tables = NULL;
    TOOL_CHECK_CUDA(cudaMalloc(&tables, 3 * MAX_LAYERS * sizeof(void *)));
    void *h[3 * MAX_LAYERS];
    for (int l = 0; l < n; l++) {
        h[l] = x[l];
        h[n + l] = dy[l];
        h[2 * n + l] = got[l];
    }
    TOOL_CHECK_CUDA(cudaMemcpy(tables, h, 3 * n * sizeof(void *), cudaMemcpyHostToDevice));
    void **tx = (void **)tables, **tdy = tx + n, **tw = tx + 2 * n;
    float *href = malloc(nw * sizeof(float)), *hgot = malloc(nw * sizeof(float));
    int found = heuristic(&batch, res, CANDIDATES);
    for (int c = 0; c < found; c++) {
        void *ws = guarded(res[c].workspaceSize);
        for (int l = 0; l < n; l++) TOOL_CHECK_CUDA(cudaMemset(got[l], 0xFF, nw * sizeof(float)));
        cublasStatus_t st = cublasLtMatmul(lt, batch.op, &one, tx, batch.la, tdy, batch.lb, &zero, tw, batch.lc, tw,
                                           batch.lc, &res[c].algo, ws, res[c].workspaceSize, stream);
        cudaError_t e = cudaStreamSynchronize(stream);
        double worst = 0;
        int canaries = canary_intact(ws, res[c].workspaceSize);
        for (int l = 0; l < n && st == CUBLAS_STATUS_SUCCESS && e == cudaSuccess; l++) {
            TOOL_CHECK_CUDA(cudaMemcpy(href, ref[l], nw * sizeof(float), cudaMemcpyDeviceToHost));
            TOOL_CHECK_CUDA(cudaMemcpy(hgot, got[l], nw * sizeof(float), cudaMemcpyDeviceToHost));
            double mag = 0, diff = 0;
            for (size_t i = 0; i < nw; i++) {
                mag = fmax(mag, fabs(href[i]));
                double d = fabs((double)hgot[i] - href[i]);
                diff = isnan(d) || d > diff ? d : diff;
            }
            double r = diff / (mag > 0 ? mag : 1);
            worst = isnan(r) || r > worst ? r : worst;
            canaries &= canary_intact(got[l], nw * sizeof(float));
        }
        int32_t id = -1, tile = -1, splitk = -1, stages = -1;
        cublasLtMatmulAlgoConfigGetAttribute(&res[c].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, NULL);
        cublasLtMatmulAlgoConfigGetAttribute(&res[c].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, NULL);
        cublasLtMatmulAlgoConfigGetAttribute(&res[c].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk,
                                             NULL);
        cublasLtMatmulAlgoConfigGetAttribute(&res[c].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages,
                                             NULL);
        printf("T=%-5d dW %4dx%-4d batch %2d  cand %d (id %d tile %d stages %d splitk %d) ws %8zu: %s rel %.3g, "
               "canaries %s\n", T, out, in, n, c, id, tile, stages, splitk, res[c].workspaceSize,
               st != CUBLAS_STATUS_SUCCESS ? "call failed" : e != cudaSuccess ? cudaGetErrorString(e) : "ran",
               worst, canaries ? "intact" : "OVERWRITTEN");
        fflush(stdout);
        if (e != cudaSuccess) exit(1);
        cudaFree(ws);
    }
    free(href);
    free(hgot);
    for (int l = 0; l < n; l++) {
        cudaFree(x[l]);
        cudaFree(dy[l]);
        cudaFree(ref[l]);
        cudaFree(got[l]);
    }
    cudaFree(tables);
    cudaFree(ws0);
    desc_free(&single);
    desc_free(&batch);
}

int main(int argc, char **argv)
{
    int tokens[8] = {1024, 4096}, n_tokens = 2;
    if (argc > 1) {
        n_tokens = 0;
        for (int i = 1; i < argc && n_tokens < 8; i++)
            if ((tokens[n_tokens++] = atoi(argv[i])) < 1) {
                fprintf(stderr, "usage: dw_ptr_check [TOKENS...]   (B x L, default 1024 4096)\n");
                return 2;
            }
    }
    cudaEvent_t e0, e1;
    void *unused;
    tool_setup(&stream, &e0, &e1, &unused, 256);
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 1;
    static const int linears[4][2] = {{2304, 776}, {768, 768}, {3072, 768}, {768, 3072}};   /* (out, in) */
    static const int batches[3] = {11, 4, 3};
    for (int t = 0; t < n_tokens; t++)
        for (int b = 0; b < 3; b++)
            for (int l = 0; l < 4; l++) check(linears[l][0], linears[l][1], tokens[t], batches[b]);
    cublasLtDestroy(lt);
    return 0;
}
