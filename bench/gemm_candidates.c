/* bench/gemm_candidates.c — what cuBLASLt offers for BERT-base's GEMMs
 * beyond the algorithm hpc's autotune picks (runtime/cuda/gemm_cublas.c
 * times the heuristic's first GEMM_TUNE_MAX_CANDIDATES = 8 and keeps the
 * fastest).  For each linear of BERT-base (Q/K/V as one 2304 x 768 weight,
 * the attention output, FFN up and down), in each of its three GEMMs
 * (forward with the bias epilogue; dX, f32 and accumulating (beta 1) where
 * the step accumulates, 16-bit elsewhere; dW in f32, and the Q/K/V dW also with the BGRADB epilogue
 * that gives the bias gradient, and plain with 8 more rows of x, "dw+ones": the shape of the
 * bias gradient taken from a column of ones appended to x (NOTES.md), where C's row `in` is
 * colsum(dy)), at T = B x L tokens, it times:
 *   h0     the heuristic's first algorithm (cuBLAS's own choice);
 *   h8     the best of the heuristic's first 8 (hpc's choice);
 *   hall   the best of all it returns when asked for 64;
 *   split  the best split-K variant (2 .. 16 parts, each reduction scheme)
 *          of the first 8 that cuBLASLt accepts;
 * and prints one line per GEMM with each time (microseconds, the best of 3
 * rounds of 5 runs after one warm-up), the algorithm's id, tile, split-K
 * and reduction scheme, and how much the best of all beats h8.
 *
 * --search: also configurations cuBLASLt accepts beyond what its
 * heuristic returns: (1) each algorithm id (cublasLtMatmulAlgoGetIds) with
 * each of its tiles and stages, split-K 1-4 where supported, CTA swizzling
 * off and on, custom options up to 3; (2) the neighbours of the heuristic's
 * 8, each with its own stages but every tile of its algorithm, custom
 * options up to 15 and split-K 1-4.  Each accepted one is timed once
 * (three runs), the fastest SEARCH_FINALISTS again as the others are, and
 * a line per GEMM says how much the best beats h8 and with what
 * configuration.
 *
 * --cold: also each candidate of the first 8 with a cold L2, as in the step,
 * where a GEMM's weights were last read a whole step earlier and its
 * activations by another kernel: before each run a 256 MiB buffer is
 * written (the H200's L2 holds 50 MiB), and the run alone is timed.  A
 * second line per GEMM then says which of the 8 is fastest cold, and what
 * the warm choice (hpc's autotune times warm) costs cold: whether tuning
 * cold would choose differently, and what it would gain.
 *
 * Shapes in cuBLASLt's column-major terms, as hpc passes them (row-major
 * Y = X W^T is Y^T = W X^T there).  Inputs hold random multiples of 1/4000
 * in [-0.25, 0.25].  32 MiB of workspace, as hpc.
 *
 *   make build/bench/gemm_candidates
 *   build/bench/gemm_candidates              # T = 32768, 4096, 1024
 *   build/bench/gemm_candidates 4096         # one T
 *   build/bench/gemm_candidates --cold 1024  # and the 8 candidates cold
 *   build/bench/gemm_candidates --search 1024  # and beyond the heuristic
 *
 * Needs a GPU and libcublasLt; not part of `make test`. */
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOL_NAME "gemm_candidates"
#include "cuda_tool.h"

#define CHECK_LT(x)                                                                              \
    do {                                                                                         \
        cublasStatus_t s_ = (x);                                                                 \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                       \
            fprintf(stderr, "gemm_candidates: %s:%d: cuBLASLt status %d\n", __FILE__, __LINE__, (int)s_); \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

enum { HEURISTIC_ASK = 64, HPC_CANDIDATES = 8, ROUNDS = 3, RUNS = 5, SEARCH_IDS = 128, SEARCH_FINALISTS = 6 };
static const size_t WORKSPACE = 32u << 20;
static const size_t FLUSH_BYTES = 256u << 20;   /* written before each cold run: five times the L2 */

static cublasLtHandle_t lt;
static void *workspace, *flush;
static cudaStream_t stream;
static cudaEvent_t ev0, ev1;

/* One GEMM: C (m x n) = op(A) op(B) (+ beta C), column-major. */
typedef struct {
    char name[32];
    int m, n, k, trans_a, trans_b, lda, ldb, ldc;
    cudaDataType_t c_type;     /* C and D */
    float beta;
    cublasLtEpilogue_t epilogue;
} GemmShape;

typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    void *a, *b, *c, *bias;
    float alpha, beta;
} Problem;

static cublasStatus_t run_once(const Problem *p, const cublasLtMatmulAlgo_t *algo)
{
    return cublasLtMatmul(lt, p->op, &p->alpha, p->a, p->la, p->b, p->lb, &p->beta, p->c, p->lc, p->c, p->lc, algo,
                          workspace, WORKSPACE, stream);
}

/* A problem and one algorithm, for tool_best_us. */
typedef struct { const Problem *p; const cublasLtMatmulAlgo_t *algo; } Run;

static int run_it(const void *ctx)
{
    const Run *r = ctx;
    return run_once(r->p, r->algo) == CUBLAS_STATUS_SUCCESS;
}

/* Microseconds per run of algo, or -1 if cuBLASLt refuses to run it. */
static double time_algo(const Problem *p, const cublasLtMatmulAlgo_t *algo)
{
    Run r = {p, algo};
    if (!run_it(&r)) return -1;
    return tool_best_us(run_it, &r, stream, ev0, ev1, ROUNDS, RUNS);
}

/* Microseconds of one run of algo with a cold L2: the mean over RUNS runs,
 * each after FLUSH_BYTES are written and timed alone, the best of ROUNDS;
 * -1 if cuBLASLt refuses it. */
static double time_algo_cold(const Problem *p, const cublasLtMatmulAlgo_t *algo)
{
    if (run_once(p, algo) != CUBLAS_STATUS_SUCCESS) return -1;
    double best = -1;
    for (int r = 0; r < ROUNDS; r++) {
        double sum = 0;
        for (int i = 0; i < RUNS; i++) {
            TOOL_CHECK_CUDA(cudaMemsetAsync(flush, r + i + 1, FLUSH_BYTES, stream));
            TOOL_CHECK_CUDA(cudaEventRecord(ev0, stream));
            if (run_once(p, algo) != CUBLAS_STATUS_SUCCESS) return -1;
            TOOL_CHECK_CUDA(cudaEventRecord(ev1, stream));
            TOOL_CHECK_CUDA(cudaEventSynchronize(ev1));
            float ms = 0;
            TOOL_CHECK_CUDA(cudaEventElapsedTime(&ms, ev0, ev1));
            sum += 1000.0 * ms;
        }
        if (best < 0 || sum / RUNS < best) best = sum / RUNS;
    }
    return best;
}

/* Whether cuBLASLt accepts algo for p within the workspace. */
static int accepted(const Problem *p, const cublasLtMatmulAlgo_t *algo)
{
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    return cublasLtMatmulAlgoCheck(lt, p->op, p->la, p->lb, p->lc, p->lc, algo, &r) == CUBLAS_STATUS_SUCCESS &&
           r.state == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= WORKSPACE;
}

static int config_int(const cublasLtMatmulAlgo_t *a, cublasLtMatmulAlgoConfigAttributes_t attr)
{
    int v = 0;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(a, attr, &v, sizeof v, &written);
    return v;
}

static void describe(const cublasLtMatmulAlgo_t *a, char *buf, size_t size)
{
    snprintf(buf, size, "id %d tile %d stages %d split %d red %d swz %d opt %d cl %d",
             config_int(a, CUBLASLT_ALGO_CONFIG_ID), config_int(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
             config_int(a, CUBLASLT_ALGO_CONFIG_STAGES_ID), config_int(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
             config_int(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), config_int(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
             config_int(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION), config_int(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
}

/* The best time so far and the algorithm that gave it. */
typedef struct { double us; char what[128]; int tried; } Best;

static void offer(Best *b, double us, const cublasLtMatmulAlgo_t *a)
{
    b->tried++;
    if (us < 0 || (b->us >= 0 && us >= b->us)) return;
    b->us = us;
    describe(a, b->what, sizeof b->what);
}

/* Microseconds of one quick timing (one warm-up, then three runs), or -1. */
static double time_quick(const Problem *p, const cublasLtMatmulAlgo_t *algo)
{
    Run r = {p, algo};
    if (!run_it(&r)) return -1;
    return tool_best_us(run_it, &r, stream, ev0, ev1, 1, 3);
}

/* An int array capability of algo (tile or stages ids) into v (at most
 * cap); returns how many. */
static int cap_ids(const cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoCapAttributes_t attr, int *v, int cap)
{
    size_t bytes = 0;
    if (cublasLtMatmulAlgoCapGetAttribute(algo, attr, NULL, 0, &bytes) != CUBLAS_STATUS_SUCCESS) return 0;
    int n = (int)(bytes / sizeof(int));
    if (n > cap) n = cap;
    if (n > 0 && cublasLtMatmulAlgoCapGetAttribute(algo, attr, v, (size_t)n * sizeof(int), &bytes) != CUBLAS_STATUS_SUCCESS)
        return 0;
    return n;
}

static int cap_int(const cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoCapAttributes_t attr)
{
    int v = 0;
    size_t written = 0;
    cublasLtMatmulAlgoCapGetAttribute(algo, attr, &v, sizeof v, &written);
    return v;
}

/* The search's fastest few so far. */
typedef struct {
    cublasLtMatmulAlgo_t algo[SEARCH_FINALISTS];
    double us[SEARCH_FINALISTS];
    int n, tried;
} Finalists;

/* base with tile, stages (< 0: base's own), split-K k, swizzle w and custom
 * option o: quick-timed if cuBLASLt accepts it, kept if among the fastest. */
static void try_config(const Problem *p, const cublasLtMatmulAlgo_t *base, int tile, int stages, int k, int w, int o,
                       Finalists *f)
{
    cublasLtMatmulAlgo_t a = *base;
    uint32_t red = k > 1 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile);
    if (stages >= 0) cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages);
    cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &k, sizeof k);
    cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof red);
    cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &w, sizeof w);
    cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, &o, sizeof o);
    if (!accepted(p, &a)) return;
    f->tried++;
    double us = time_quick(p, &a);
    if (us < 0) return;
    int slot = f->n < SEARCH_FINALISTS ? f->n++ : -1;
    if (slot < 0) {   /* replace the slowest finalist */
        int worst = 0;
        for (int i = 1; i < SEARCH_FINALISTS; i++)
            if (f->us[i] > f->us[worst]) worst = i;
        if (us >= f->us[worst]) return;
        slot = worst;
    }
    f->algo[slot] = a;
    f->us[slot] = us;
}

/* (1): every algorithm id with its tiles and stages. */
static void search_ids(const Problem *p, const GemmShape *s, Finalists *f)
{
    cudaDataType_t ab = CUDA_R_16F;
    int ids[SEARCH_IDS], n_ids = 0;
    if (cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, ab, ab, s->c_type, s->c_type, SEARCH_IDS, ids,
                                 &n_ids) != CUBLAS_STATUS_SUCCESS)
        return;
    for (int i = 0; i < n_ids; i++) {
        cublasLtMatmulAlgo_t base;
        if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_32F, CUDA_R_32F, ab, ab, s->c_type, s->c_type, ids[i], &base) !=
            CUBLAS_STATUS_SUCCESS)
            continue;
        int tiles[64], stages[64];
        int n_tiles = cap_ids(&base, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, 64);
        int n_stages = cap_ids(&base, CUBLASLT_ALGO_CAP_STAGES_IDS, stages, 64);
        if (n_tiles == 0) tiles[n_tiles++] = CUBLASLT_MATMUL_TILE_UNDEFINED;
        if (n_stages == 0) stages[n_stages++] = CUBLASLT_MATMUL_STAGES_UNDEFINED;
        int splits = cap_int(&base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) ? 4 : 1;
        int swizzles = cap_int(&base, CUBLASLT_ALGO_CAP_CTA_SWIZZLING_SUPPORT) ? 2 : 1;
        int options = cap_int(&base, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX);
        if (options > 3) options = 3;
        for (int t = 0; t < n_tiles; t++)
            for (int g = 0; g < n_stages; g++)
                for (int k = 1; k <= splits; k++)
                    for (int w = 0; w < swizzles; w++)
                        for (int o = 0; o <= options; o++) try_config(p, &base, tiles[t], stages[g], k, w, o, f);
    }
}

/* --search (the header comment): the configurations quick-timed, the
 * fastest SEARCH_FINALISTS timed as the others; into b. */
static void search(const Problem *p, const GemmShape *s, const cublasLtMatmulHeuristicResult_t *res, int found,
                   Best *b)
{
    Finalists f = {.n = 0, .tried = 0};
    for (int i = 0; i < found && i < HPC_CANDIDATES; i++) {   /* (2) the heuristic's neighbours */
        int tiles[64];
        int n_tiles = cap_ids(&res[i].algo, CUBLASLT_ALGO_CAP_TILE_IDS, tiles, 64);
        if (n_tiles == 0) tiles[n_tiles++] = config_int(&res[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID);
        int splits = cap_int(&res[i].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT) ? 4 : 1;
        int options = cap_int(&res[i].algo, CUBLASLT_ALGO_CAP_CUSTOM_OPTION_MAX);
        int w = config_int(&res[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING);
        if (options > 15) options = 15;
        for (int t = 0; t < n_tiles; t++)
            for (int k = 1; k <= splits; k++)
                for (int o = 0; o <= options; o++) try_config(p, &res[i].algo, tiles[t], -1, k, w, o, &f);
    }
    search_ids(p, s, &f);
    for (int i = 0; i < f.n; i++) offer(b, time_algo(p, &f.algo[i]), &f.algo[i]);
    b->tried = f.tried;   /* every configuration quick-timed, not the finalists offer() counted */
}

static void problem_init(Problem *p, const GemmShape *s)
{
    size_t a_rows = s->trans_a ? s->k : s->m, a_cols = s->trans_a ? s->m : s->k;
    size_t b_rows = s->trans_b ? s->n : s->k, b_cols = s->trans_b ? s->k : s->n;
    size_t c_size = s->c_type == CUDA_R_32F ? 4 : 2, bias_len = s->m > s->n ? s->m : s->n;
    p->alpha = 1.0f;
    p->beta = s->beta;
    p->a = tool_random_f16(a_rows * a_cols);
    p->b = tool_random_f16(b_rows * b_cols);
    TOOL_CHECK_CUDA(cudaMalloc(&p->c, (size_t)s->m * s->n * c_size));
    TOOL_CHECK_CUDA(cudaMemset(p->c, 0, (size_t)s->m * s->n * c_size));
    TOOL_CHECK_CUDA(cudaMalloc(&p->bias, bias_len * 4));
    TOOL_CHECK_CUDA(cudaMemset(p->bias, 0, bias_len * 4));
    CHECK_LT(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = s->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = s->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    CHECK_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CHECK_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (s->epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        /* the forward's bias in C's type; a bias gradient in f32 (C's type for dW) */
        cudaDataType_t bias_type = s->c_type;
        CHECK_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &s->epilogue, sizeof s->epilogue));
        CHECK_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p->bias, sizeof p->bias));
        CHECK_LT(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
    }
    CHECK_LT(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16F, a_rows, a_cols, s->lda));
    CHECK_LT(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16F, b_rows, b_cols, s->ldb));
    CHECK_LT(cublasLtMatrixLayoutCreate(&p->lc, s->c_type, s->m, s->n, s->ldc));
}

static void problem_free(Problem *p)
{
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->op);
    cudaFree(p->a);
    cudaFree(p->b);
    cudaFree(p->c);
    cudaFree(p->bias);
}

static void measure(const GemmShape *s, int tokens, int cold, int searching)
{
    Problem p;
    problem_init(&p, s);
    cublasLtMatmulPreference_t pref;
    size_t ws = WORKSPACE;
    CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    cublasLtMatmulHeuristicResult_t res[HEURISTIC_ASK];
    int found = 0;
    CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.la, p.lb, p.lc, p.lc, pref, HEURISTIC_ASK, res, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    Best h0 = {-1, "-", 0}, h8 = {-1, "-", 0}, all = {-1, "-", 0}, split = {-1, "-", 0};
    double warm[HPC_CANDIDATES];
    for (int i = 0; i < found; i++) {
        double us = time_algo(&p, &res[i].algo);
        if (i == 0) offer(&h0, us, &res[i].algo);
        if (i < HPC_CANDIDATES) {
            offer(&h8, us, &res[i].algo);
            warm[i] = us;
        }
        offer(&all, us, &res[i].algo);
    }
    static const int parts[] = {2, 3, 4, 6, 8, 12, 16};
    static const uint32_t schemes[] = {CUBLASLT_REDUCTION_SCHEME_INPLACE, CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE,
                                       CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE};
    for (int i = 0; i < found && i < HPC_CANDIDATES; i++) {
        int supported = 0;
        size_t written = 0;
        cublasLtMatmulAlgoCapGetAttribute(&res[i].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &supported,
                                          sizeof supported, &written);
        for (int j = 0; supported && j < (int)(sizeof parts / sizeof parts[0]); j++)
            for (int r = 0; r < 3; r++) {
                cublasLtMatmulAlgo_t a = res[i].algo;
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &parts[j], sizeof parts[j]);
                cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &schemes[r],
                                                     sizeof schemes[r]);
                if (accepted(&p, &a)) offer(&split, time_algo(&p, &a), &a);
            }
    }
    double tflop = 2.0 * s->m * s->n * s->k / 1e6;   /* divided by us: TFLOP/s */
    double best = all.us;
    if (split.us >= 0 && (best < 0 || split.us < best)) best = split.us;
    printf("%-12s T=%-6d m %-6d n %-6d k %-6d | h0 %7.1f us %4.0f TF/s [%s] | h8 %7.1f [%s] | hall(%d) %7.1f [%s] "
           "| split(%d) %7.1f [%s] | best %4.0f TF/s, %+.1f%% against h8\n",
           s->name, tokens, s->m, s->n, s->k, h0.us, h0.us > 0 ? tflop / h0.us : 0, h0.what, h8.us, h8.what, found,
           all.us, all.what, split.tried, split.us, split.what, best > 0 ? tflop / best : 0,
           h8.us > 0 && best > 0 ? 100.0 * (best - h8.us) / h8.us : 0);
    if (searching) {
        Best sb = {-1, "-", 0};
        search(&p, s, res, found, &sb);
        printf("%-12s T=%-6d search | h8 %7.1f us | searched(%d) %7.1f us %4.0f TF/s [%s] | %+.1f%% against h8\n", s->name,
               tokens, h8.us, sb.tried, sb.us, sb.us > 0 ? tflop / sb.us : 0, sb.what,
               h8.us > 0 && sb.us > 0 ? 100.0 * (sb.us - h8.us) / h8.us : 0);
    }
    if (cold) {
        /* the warm choice (hpc's: the fastest warm of the first 8) against the fastest cold */
        int n = found < HPC_CANDIDATES ? found : HPC_CANDIDATES, warm_pick = -1;
        for (int i = 0; i < n; i++)
            if (warm[i] >= 0 && (warm_pick < 0 || warm[i] < warm[warm_pick])) warm_pick = i;
        Best c8 = {-1, "-", 0};
        double warm_pick_cold = -1;
        for (int i = 0; i < n; i++) {
            double us = time_algo_cold(&p, &res[i].algo);
            if (i == warm_pick) warm_pick_cold = us;
            offer(&c8, us, &res[i].algo);
        }
        printf("%-12s T=%-6d cold | warm pick %7.1f us cold [%s] | cold pick %7.1f us [%s] | %+.1f%%\n", s->name,
               tokens, warm_pick_cold, h8.what, c8.us, c8.what,
               warm_pick_cold > 0 && c8.us > 0 ? 100.0 * (c8.us - warm_pick_cold) / warm_pick_cold : 0);
    }
    fflush(stdout);
    problem_free(&p);
}

int main(int argc, char **argv)
{
    int tokens[3] = {32768, 4096, 1024}, n_tokens = 3, cold = 0, searching = 0;
    int arg = 1;
    for (; arg < argc && (strcmp(argv[arg], "--cold") == 0 || strcmp(argv[arg], "--search") == 0); arg++) {
        if (argv[arg][2] == 'c') cold = 1;
        else searching = 1;
    }
    if (arg < argc) {
        tokens[0] = atoi(argv[arg]);
        n_tokens = 1;
        if (tokens[0] < 1 || arg + 1 < argc) {
            fprintf(stderr, "usage: gemm_candidates [--cold] [--search] [TOKENS]   (B x L, default 32768, 4096 and 1024)\n");
            return 2;
        }
    }
    tool_setup(&stream, &ev0, &ev1, &workspace, WORKSPACE);
    if (cold) TOOL_CHECK_CUDA(cudaMalloc(&flush, FLUSH_BYTES));
    CHECK_LT(cublasLtCreate(&lt));
    /* (out, in) of BERT-base's linears */
    static const int linears[4][2] = {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}};
    for (int t = 0; t < n_tokens; t++) {
        int T = tokens[t];
        for (int l = 0; l < 4; l++) {
            int out = linears[l][0], in = linears[l][1];
            /* the step accumulates dX into the f32 residual gradient where the
             * linear reads the residual stream: Q/K/V and FFN up */
            int accumulates = in == 768 && out > 768;
            GemmShape fwd = {"", out, T, in, 1, 0, in, in, out, CUDA_R_16F, 0.0f, CUBLASLT_EPILOGUE_BIAS};
            GemmShape dx = {"", in, T, out, 0, 0, in, out, in, accumulates ? CUDA_R_32F : CUDA_R_16F,
                            accumulates ? 1.0f : 0.0f, CUBLASLT_EPILOGUE_DEFAULT};
            GemmShape dw = {"", in, out, T, 0, 1, in, out, in, CUDA_R_32F, 0.0f, CUBLASLT_EPILOGUE_DEFAULT};
            snprintf(fwd.name, sizeof fwd.name, "fwd %dx%d", out, in);
            snprintf(dx.name, sizeof dx.name, "dx %dx%d", out, in);
            snprintf(dw.name, sizeof dw.name, "dw %dx%d", out, in);
            measure(&fwd, T, cold, searching);
            measure(&dx, T, cold, searching);
            measure(&dw, T, cold, searching);
            if (out == 2304) {
                GemmShape bgrad = dw;
                bgrad.epilogue = CUBLASLT_EPILOGUE_BGRADB;
                snprintf(bgrad.name, sizeof bgrad.name, "dw+bgrad %d", out);
                measure(&bgrad, T, cold, searching);
                /* x as (T, in + 8) with a column of ones (and 7 of zeros):
                 * the plain GEMM's row `in` of C is the bias gradient */
                GemmShape ones = dw;
                ones.m = ones.lda = ones.ldc = in + 8;
                snprintf(ones.name, sizeof ones.name, "dw+ones %d", out);
                measure(&ones, T, cold, searching);
            }
        }
    }
    cublasLtDestroy(lt);
    cudaFree(workspace);
    cudaFree(flush);
    cudaEventDestroy(ev0);
    cudaEventDestroy(ev1);
    cudaStreamDestroy(stream);
    return 0;
}
