/* runtime/cuda/cuda_exec.c — the cuda backend; see cuda_exec.h. */
#include "cuda/cuda_exec.h"
#include "cuda/cuda_exec_internal.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_threads.h"
#include "cpu/half.h"
#include "cuda/host_stage.h"
#include "cuda/nvrtc_compile.h"
#include "cuda/gemm_own.h"
#include "program/param_pack.h"
#include "util/phase_clock.h"

#define NODE(id) (&ex->g->nodes[(id)])

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

CUdeviceptr cuda_exec_ptr(const CudaExec *ex, int v)
{
    if (ex->g->nodes[v].op == IR_OP_PARAM) return ex->param_dev[v];
    const PlanValue *pv = &ex->plan.v[v];
    /* a view (program/plan.h): inside its base, a parameter or an arena value */
    if (pv->kind == PLAN_VIEW) return cuda_exec_ptr(ex, pv->storage) + (CUdeviceptr)pv->view_off;
    HPC_ASSERT(pv->kind == PLAN_ARENA);
    return ex->arena.base + (CUdeviceptr)pv->offset;
}

CUdeviceptr cuda_exec_param_ptr(const CudaExec *ex, int p, DType dt)
{
    HPC_ASSERT(p >= 0 && p < ex->pl->n);
    if (dt == DT_F32) return ex->master[p];
    for (int i = 0; i < ex->g->n; i++)
        if (NODE(i)->op == IR_OP_PARAM && NODE(i)->attr.param.index == p && NODE(i)->dtype == dt)
            return ex->param_dev[i];
    return 0;
}

/* ---- binding: parameters, module ------------------------------------- */

/* One device buffer per (parameter, dtype) the graph reads, plus a master
 * for every parameter that owns storage: the masters in one allocation,
 * the 16-bit copies in another (no 2 MiB rounding per tensor), each laid
 * out by program/param_pack.h (a block's query, key and value weights, and
 * its three biases, back to back). */
_Static_assert(ARENA_ALIGN == PARAM_PACK_ALIGN, "program/param_pack.h packs for the arena's alignment");

static HpcStatus alloc_packed(CudaExec *ex, CUdeviceptr *ptrs, int n, const int *item_param, const int *item_tag,
                              const size_t *bytes, const char *what, HpcError *err)
{
    size_t *off = xcalloc((size_t)n + 1, sizeof *off);
    size_t total = param_pack_offsets(ex->pl, n, item_param, item_tag, bytes, ARENA_ALIGN, off);
    CUdeviceptr block = 0;
    HpcStatus st = arena_alloc(&ex->arena, &block, total, what, err);
    for (int i = 0; i < n; i++) ptrs[i] = !st && bytes[i] ? block + (CUdeviceptr)off[i] : 0;
    free(off);
    return st;
}

static HpcStatus alloc_params(CudaExec *ex, HpcError *err)
{
    const IrGraph *g = ex->g;
    ex->param_dev = xcalloc((size_t)g->n, sizeof *ex->param_dev);
    ex->master = xcalloc((size_t)(ex->pl->n > 0 ? ex->pl->n : 1), sizeof *ex->master);
    int most = g->n > ex->pl->n ? g->n : ex->pl->n;
    size_t *bytes = xcalloc((size_t)most + 1, sizeof *bytes);
    int *item_param = xcalloc((size_t)most + 1, sizeof *item_param);
    int *item_tag = xcalloc((size_t)g->n + 1, sizeof *item_tag);
    int *owner = xcalloc((size_t)g->n + 1, sizeof *owner);   /* node i shares node owner[i]'s copy */
    for (int q = 0; q < ex->pl->n; q++) {
        bytes[q] = ex->pl->p[q].tied_to >= 0 ? 0 : (size_t)params_numel(&ex->pl->p[q]) * 4;
        item_param[q] = q;
    }
    HpcStatus st = alloc_packed(ex, ex->master, ex->pl->n, item_param, NULL, bytes, "parameters (f32)", err);
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = &g->nodes[i];
        bytes[i] = 0;
        owner[i] = i;
        item_param[i] = n->op == IR_OP_PARAM ? n->attr.param.index : -1;
        item_tag[i] = (int)n->dtype;
        if (n->op != IR_OP_PARAM) continue;
        int q = n->attr.param.index;
        HPC_ASSERT(q >= 0 && q < ex->pl->n && ex->pl->p[q].tied_to < 0);
        if (n->dtype == DT_F32) continue;
        for (int j = 0; j < i && owner[i] == i; j++)   /* one copy per (index, dtype) */
            if (g->nodes[j].op == IR_OP_PARAM && g->nodes[j].attr.param.index == q &&
                g->nodes[j].dtype == n->dtype)
                owner[i] = j;
        if (owner[i] == i) bytes[i] = (size_t)ir_numel(n, 1, 1) * 2;
    }
    if (!st) st = alloc_packed(ex, ex->param_dev, g->n, item_param, item_tag, bytes, "parameters (low copies)", err);
    for (int i = 0; i < g->n && !st; i++) {
        const IrNode *n = &g->nodes[i];
        if (n->op != IR_OP_PARAM) continue;
        if (n->dtype == DT_F32) ex->param_dev[i] = ex->master[n->attr.param.index];
        else ex->param_dev[i] = ex->param_dev[owner[i]];
    }
    free(bytes);
    free(item_param);
    free(item_tag);
    free(owner);
    return st;
}

/* A STACK planned as a view of its first parameter (program/plan.h) reads
 * the three in place: they must lie back to back in device memory, as
 * program/param_pack.h lays out a query/key/value group. */
static HpcStatus cuda_exec_check_views(const CudaExec *ex, HpcError *err)
{
    for (int i = 0; i < ex->g->n; i++) {
        const IrNode *n = NODE(i);
        if (n->op != IR_OP_STACK || ex->plan.v[i].kind != PLAN_VIEW) continue;
        CUdeviceptr first = cuda_exec_ptr(ex, n->in[0]);
        size_t part = (size_t)ir_numel(NODE(n->in[0]), 1, 1) * plan_dtype_size(n->dtype);
        for (int k = 1; k < 3; k++)
            if (cuda_exec_ptr(ex, n->in[k]) != first + (CUdeviceptr)(k * part))
                return hpc_fail(err, HPC_ERR_INPUT, "cuda_exec: node %d (%s) reads parameters %s, %s, %s as one "
                                "stacked tensor, but they do not lie back to back in device memory "
                                "(program/param_pack.h); compile with HPC_FUSE_QKV=0", i, n->name,
                                NODE(n->in[0])->name, NODE(n->in[1])->name, NODE(n->in[2])->name);
    }
    return HPC_OK;
}

/* The program's one module: compiled once per (program, arch) for every
 * (B, L), through the disk cache. */
static HpcStatus compile_module(CudaExec *ex, HpcError *err)
{
    const StepCubin *ahead = step_kernels_cubin(ex->kernels, ex->dev->arch);
    if (ahead) {   /* compiled by `hpc compile --arch`: no NVRTC at all */
        ex->cubin_from_program = ex->cache_hit = true;
        if (getenv("HPC_PROFILE"))
            fprintf(stderr, "hpc profile: step module for sm_%d: the program's own cubin\n", ex->dev->arch);
        return CUDA_CHECK(err, cuda_driver()->cuModuleLoadData(&ex->module, ahead->data));
    }
    const char *src = ex->kernels->cuda_source;
    if (!src)
        return hpc_fail(err, HPC_ERR_INPUT, "cuda_exec: the step program has no CUDA source; "
                        "recompile it with `hpc compile MODEL`");
    void *cubin = NULL;
    size_t size = 0;
    NvrtcCacheInfo info;
    double t0 = now_seconds();
    /* hpc's own GEMM needs the architecture-specific target (wgmma); elsewhere
     * it compiles to nothing, so it is not looked up (gemm_own.h).  The v5
     * attention backward asks for the target too (its mark) */
    bool own = gemm_own_in_source(src) && ex->dev->arch == 90;
    bool sm90a = ex->dev->arch == 90 && (own || strstr(src, STEP_SOURCE_SM90A_MARK) != NULL);
    const char *sm90a_opt[] = {"--gpu-architecture=sm_90a"};
    HpcStatus st = nvrtc_compile_cached(src, "hpc_ops", ex->dev->arch, sm90a ? sm90a_opt : NULL, sm90a ? 1 : 0,
                                        &cubin, &size, &info, err);
    if (st) return st;
    ex->compile_seconds = now_seconds() - t0;
    ex->cache_hit = info.result == KCACHE_HIT;
    if (getenv("HPC_PROFILE"))
        fprintf(stderr, "hpc profile: step module for sm_%d: %s in %.3f s\n", ex->dev->arch,
                ex->cache_hit ? "kernel cache hit" : "NVRTC compile", ex->compile_seconds);
    st = CUDA_CHECK(err, cuda_driver()->cuModuleLoadData(&ex->module, cubin));
    free(cubin);
    ex->module_sm90a = sm90a;
    if (!st && own) st = cuda_exec_own_kernels(ex, err);
    return st;
}

/* Launch shapes for B, L from the records (recomputed when a run's
 * binding changes; no code is generated or compiled). */
static HpcStatus refresh_code(CudaExec *ex, int64_t B, int64_t L, HpcError *err)
{
    if (ex->code_B == B && ex->code_L == L) return HPC_OK;
    for (int i = 0; i < ex->g->n; i++) step_node_launch(&ex->kernels->node[i], B, L, ex->module_sm90a, &ex->code[i]);
    ex->code_B = B;
    ex->code_L = L;
    return HPC_OK;
}

static HpcStatus lookup_kernels(CudaExec *ex, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    ex->fn = xcalloc((size_t)ex->g->n, sizeof *ex->fn);
    ex->code = xcalloc((size_t)ex->g->n, sizeof *ex->code);
    HpcStatus st = refresh_code(ex, ex->plan.B, ex->plan.L, err);
    for (int i = 0; i < ex->g->n && !st; i++)
        for (int k = 0; k < ex->code[i].n_phases && !st; k++) {
            st = CUDA_CHECK(err, cu->cuModuleGetFunction(&ex->fn[i][k], ex->module, ex->code[i].phase[k].name));
            if (!st) st = cuda_func_allow_shared(ex->fn[i][k], ex->code[i].phase[k].shared_bytes, err);
        }
    return st;
}

/* The plan for the bounds, each node's scratch from its record. */
static HpcStatus plan_step(CudaExec *ex, int64_t max_B, int64_t max_L, const PlanOptions *opt, HpcError *err)
{
    if (ex->kernels->n != ex->g->n)
        return hpc_fail(err, HPC_ERR_INPUT, "cuda_exec: %d launch records for a graph of %d nodes; "
                        "recompile the program with `hpc compile MODEL`", ex->kernels->n, ex->g->n);
    int64_t *scratch = xcalloc((size_t)(ex->g->n > 0 ? ex->g->n : 1), sizeof *scratch);
    step_kernels_scratch(ex->kernels, max_B, max_L, scratch);
    HpcStatus st = plan_build_scratch_with(ex->g, max_B, max_L, scratch, opt, &ex->plan, err);
    free(scratch);
    return st;
}

/* The first of the backward nodes that end g and are LN_DW_FIX(_DB)s,
 * UNSTACKs (the views of their values) and the OUTPUTs of both
 * (CudaExec.fix_from; g->n when g does not end so). */
static int trailing_fixes(const IrGraph *g)
{
    int t = g->n;
    while (t > g->n_forward) {
        const IrNode *n = &g->nodes[t - 1];
        IrOpKind op = n->op == IR_OP_OUTPUT ? g->nodes[n->in[0]].op : n->op;
        if (op != IR_OP_LN_DW_FIX && op != IR_OP_LN_DW_FIX_DB && op != IR_OP_UNSTACK) break;
        t--;
    }
    return t;
}

HpcStatus cuda_exec_init_kernels(CudaExec *ex, CudaDevice *dev, const IrGraph *g, const ParamList *pl,
                                 const StepKernels *kernels, int64_t max_B, int64_t max_L, HpcError *err)
{
    return cuda_exec_init_kernels_with(ex, dev, g, pl, kernels, max_B, max_L, NULL, err);
}

HpcStatus cuda_exec_init_kernels_with(CudaExec *ex, CudaDevice *dev, const IrGraph *g, const ParamList *pl,
                                      const StepKernels *kernels, int64_t max_B, int64_t max_L,
                                      const PlanOptions *plan, HpcError *err)
{
    memset(ex, 0, sizeof *ex);
    if (ir_graph_packed(g) && (!kernels || kernels->n == 0))
        return hpc_fail(err, HPC_ERR_USAGE, "cuda backend: this packed program (pack = true, hpc run --pack; "
                        "docs/packing.md) carries no CUDA kernels: packed batches need the fused attention, "
                        "which runs in 16 bits only; train with --fp16 or --bf16, use --device cpu, or train "
                        "without pack (an artifact compiled before 2026-12-02 also lacks them: compile it again)");
    ex->g = g;
    ex->pl = pl;
    ex->dev = dev;
    ex->kernels = kernels;
    PlanOptions po = plan ? *plan : (PlanOptions){0};
    bool *early = cuda_exec_own_written_early(ex);
    po.write_early = early;
    HpcStatus st = cuda_exec_dw_batch_setting(ex, err);   /* a usage error before any work */
    if (!st) st = plan_step(ex, max_B, max_L, &po, err);
    free(early);
    phase_mark("step plan for the run's bounds (arena offsets)");
    if (!st) st = arena_init_with(&ex->arena, dev->allocator, "activations and gradients",
                                  (size_t)ex->plan.arena_bytes, err);
    if (!st) st = alloc_params(ex, err);
    if (!st) st = cuda_exec_check_views(ex, err);
    if (!st) st = arena_alloc(&ex->arena, &ex->ctl, sizeof(EopCtl), "step control", err);
    phase_mark("arena allocation and parameter buffers");
    if (!st) st = gemm_init(&ex->gemm, dev->stream, 0, err);
    if (!st) ex->gemm_ready = true;
    phase_mark("cuBLASLt init, GEMM tune cache read");
    if (!st) st = compile_module(ex, err);
    if (!st) phase_markf("step module (and optimizer): %s %.3f s, then cuModuleLoadData",
                         ex->cubin_from_program ? "the program's cubin" : ex->cache_hit ? "kernel cache hit" : "NVRTC",
                         ex->compile_seconds);
    if (!st) st = lookup_kernels(ex, err);
    if (!st && ex->gemm_own.fn) cuda_exec_own_pair(ex);
    if (!st) ex->fix_from = trailing_fixes(g);
    if (!st) st = cuda_exec_dw_batch_init(ex, err);
    if (st) cuda_exec_free(ex);
    return st;
}

void cuda_exec_free(CudaExec *ex)
{
    const CudaDriver *cu = cuda_driver();
    if (!ex->g) return;
    for (int i = 0; i < ex->n_graphs; i++)
        if (ex->graphs[i].exec && cu) cu->cuGraphExecDestroy(ex->graphs[i].exec);
    if (ex->module && cu) cu->cuModuleUnload(ex->module);
    if (ex->gemm_ready) gemm_free(&ex->gemm);
    arena_free(&ex->arena);
    plan_free(&ex->plan);
    free(ex->fn);
    free(ex->code);
    free(ex->gelu_of);
    free(ex->dgelu_of);
    free(ex->computed_by_gemm);
    cuda_exec_dw_batch_free(ex);
    free(ex->param_dev);
    free(ex->master);
    if (ex->owned_kernels) {
        step_kernels_free(ex->owned_kernels);
        free(ex->owned_kernels);
    }
    memset(ex, 0, sizeof *ex);
}

/* Items of a 16-bit copy, converted on the cpu pool's threads straight
 * into the upload's page-locked buffer (BERT-base's 110M conversions took
 * about a third of a second on one thread). */
typedef struct { const float *src; bool bf16; } LowCopyJob;

static void low_copy_fill(void *ctx, int64_t first, int64_t count, void *out)
{
    const LowCopyJob *j = ctx;
    uint16_t *low = out;
    for (int64_t k = 0; k < count; k++)
        low[k] = j->bf16 ? bf16_from_f32(j->src[first + k]) : half_from_f32(j->src[first + k]);
}

/* Through page-locked staging buffers on the run's stream (runtime/cuda/
 * host_stage.h: non-blocking, so in order with its kernels, unlike the
 * legacy stream's copies); done when this returns.  A 16-bit copy that
 * several PARAM nodes share is uploaded once. */
HpcStatus cuda_exec_set_params(CudaExec *ex, float *const *w, HpcError *err)
{
    HostStage stage;
    HpcStatus st = host_stage_open(&stage, ex->dev->stream, err);
    for (int q = 0; q < ex->pl->n && !st; q++)
        if (ex->pl->p[q].tied_to < 0)
            st = host_stage_copy(&stage, ex->master[q], w[q], (size_t)params_numel(&ex->pl->p[q]) * 4, err);
    for (int i = 0; i < ex->g->n && !st; i++) {
        const IrNode *n = NODE(i);
        if (n->op != IR_OP_PARAM || n->dtype == DT_F32) continue;
        bool done = false;
        for (int j = 0; j < i && !done; j++) done = ex->param_dev[j] == ex->param_dev[i];
        if (done) continue;
        LowCopyJob job = {.src = w[n->attr.param.index], .bf16 = n->dtype == DT_BF16};
        st = host_stage_fill(&stage, ex->param_dev[i], ir_numel(n, 1, 1), 2, low_copy_fill, &job, err);
    }
    return host_stage_close(&stage, st, err);
}

/* ---- batch checks and uploads ------------------------------------------ */

static HpcStatus check_ids(const int32_t *ids, int64_t n, int64_t limit, const char *what, HpcError *err)
{
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= limit)
            return hpc_fail(err, HPC_ERR_INPUT, "cuda_exec: %s %d at position %lld is outside [0, %lld); "
                            "check the tokenizer's vocabulary against the model", what, ids[i],
                            (long long)i, (long long)limit);
    return HPC_OK;
}

/* The checks the cpu kernels make on ids and labels, done before the step. */
static HpcStatus check_batch(const CudaExec *ex, const Batch *b, HpcError *err)
{
    HpcStatus st = HPC_OK;
    /* packed: the kernels address each span's rows from its start and size
     * their launches by the program's bound (runtime/data/batch.h) */
    if (ir_graph_packed(ex->g))
        st = batch_spans_check(b->seq_spans, b->B, b->L, ir_span_max(ex->g), "cuda_exec", err);
    for (int i = 0; i < ex->g->n && !st; i++) {
        const IrNode *n = NODE(i);
        if (n->op == IR_OP_EMBEDDING) {
            const IrNode *ids = NODE(n->in[1]);
            int64_t V = NODE(n->in[0])->dims[0];
            if (ids->op == IR_OP_POSITIONS && ids->attr.pos.offset + b->L > V)
                st = hpc_fail(err, HPC_ERR_INPUT, "cuda_exec: length %lld needs %lld positions, the "
                              "model has %lld; truncate the batch", (long long)b->L,
                              (long long)(ids->attr.pos.offset + b->L), (long long)V);
            if (ids->op == IR_OP_INPUT && ids->attr.input.kind == IR_IN_INPUT_IDS)
                st = check_ids(b->input_ids, b->B * b->L, V, "token id", err);
            if (ids->op == IR_OP_INPUT && ids->attr.input.kind == IR_IN_TOKEN_TYPES)
                st = check_ids(b->token_type_ids, b->B * b->L, V, "token type id", err);
        }
        if (n->op == IR_OP_CROSS_ENTROPY && NODE(n->in[1])->op == IR_OP_INPUT) {
            int64_t C = NODE(n->in[0])->dims[NODE(n->in[0])->rank - 1];
            int64_t cnt = NODE(n->in[1])->attr.input.kind == IR_IN_LABELS ? b->B : b->B * b->L;
            for (int64_t r = 0; r < cnt && !st; r++)
                if (b->labels[r] != IR_IGNORE_INDEX && (b->labels[r] < 0 || b->labels[r] >= C))
                    st = hpc_fail(err, HPC_ERR_INPUT, "cuda_exec: label %d at row %lld is outside [0, %lld) "
                                  "and not -100", b->labels[r], (long long)r, (long long)C);
        }
    }
    return st;
}

static HpcStatus upload_input(CudaExec *ex, int id, const Batch *b, HpcError *err)
{
    const void *src = NULL;
    int64_t bl = b->B * b->L;
    size_t bytes = (size_t)bl * 4;
    switch (NODE(id)->attr.input.kind) {
    case IR_IN_INPUT_IDS: src = b->input_ids; break;
    case IR_IN_TOKEN_TYPES: src = b->token_type_ids; break;
    case IR_IN_ATTN_MASK: src = b->attention_mask; break;
    case IR_IN_LABELS: src = b->labels; bytes = (size_t)b->B * 4; break;
    case IR_IN_TOKEN_LABELS: src = b->labels; break;
    case IR_IN_TARGETS: src = b->targets; bytes = (size_t)b->B * 4; break;
    case IR_IN_SEQ_SPANS: src = b->seq_spans; bytes = (size_t)b->B * 2 * 4; break;   /* packed (docs/packing.md) */
    case IR_IN_LOSS_SCALE:
    case IR_IN_COUNT: return HPC_OK;
    }
    if (!src)
        return hpc_fail(err, HPC_ERR_INPUT, "cuda_exec: the graph reads the batch's %s, which this "
                        "batch does not have", ir_input_name(NODE(id)->attr.input.kind));
    /* From pageable memory the driver stages the bytes before returning, so
     * the batch may be freed or reused right away. */
    return CUDA_CHECK(err, cuda_driver()->cuMemcpyHtoDAsync(cuda_exec_ptr(ex, id), src, bytes, ex->dev->stream));
}

/* ---- launches ---------------------------------------------------------- */

static GemmDtype gemm_type(DType d) { return d == DT_F16 ? GEMM_F16 : d == DT_BF16 ? GEMM_BF16 : GEMM_F32; }

void cuda_exec_gemm_desc(const CudaExec *ex, int id, GemmDesc *d)
{
    const IrNode *n = NODE(id), *a = NODE(n->in[0]), *b = NODE(n->in[1]);
    GemmDtype ab = gemm_type(a->dtype), c = gemm_type(n->dtype);
    CUdeviceptr A = cuda_exec_ptr(ex, n->in[0]), Bp = cuda_exec_ptr(ex, n->in[1]), C = cuda_exec_ptr(ex, id);
    int64_t rows = ir_rows(n, ex->B, ex->L);
    switch (n->op) {
    case IR_OP_LINEAR: /* y (rows, out) = x (rows, in) W^T (+ b) */
        gemm_desc_linear(d, ab, c, rows, b->dims[0], b->dims[1], A, Bp,
                         ex->code[id].bias_epilogue ? cuda_exec_ptr(ex, n->in[2]) : 0, C);
        break;
    case IR_OP_LINEAR_DX: /* dx (rows, in) = dy (rows, out) W (out, in) */
        gemm_desc_rm(d, ab, c, rows, b->dims[1], b->dims[0], A, Bp, C);
        break;
    case IR_OP_LINEAR_DX_ACC: /* y = acc + dy W: C = acc, beta 1; D = y, which the plan puts on acc (in place) */
        gemm_desc_rm(d, ab, c, rows, b->dims[1], b->dims[0], A, Bp, cuda_exec_ptr(ex, n->in[2]));
        d->D = C;
        d->beta = 1.0f;
        break;
    case IR_OP_LINEAR_DW: /* dW (out, in) = dy^T (out, R) x (R, in) */
    case IR_OP_LINEAR_DW_BGRAD: /* and db (out) = the column sums of dy, from the epilogue */
        gemm_desc_rm(d, ab, c, n->dims[0], n->dims[1], ir_rows(a, ex->B, ex->L), A, Bp, C);
        d->trans_a = true;
        d->lda = n->dims[0];
        if (n->op == IR_OP_LINEAR_DW_BGRAD) {
            d->epilogue = GEMM_EPI_BGRAD_A;
            d->bias = cuda_exec_ptr(ex, ir_output(ex->g, id, 1));
        }
        break;
    default: { /* MATMUL: batched (.., M, K) x (.., K, N), alpha */
        const IrMatmulAttr *m = &n->attr.matmul;
        int r = n->rank;
        int64_t M = ir_dim(n->dims[r - 2], ex->B, ex->L), N = ir_dim(n->dims[r - 1], ex->B, ex->L);
        int64_t K = ir_dim(m->trans_a ? a->dims[r - 2] : a->dims[r - 1], ex->B, ex->L);
        gemm_desc_rm(d, ab, c, M, N, K, A, Bp, C);
        d->trans_a = m->trans_a;
        d->trans_b = m->trans_b;
        d->lda = m->trans_a ? M : K;
        d->ldb = m->trans_b ? K : N;
        d->batch = ir_numel(n, ex->B, ex->L) / (M * N);
        d->stride_a = M * K;
        d->stride_b = K * N;
        d->stride_c = M * N;
        d->alpha = (float)m->alpha;
        break;
    }
    }
}

/* Node id's kernels from phase `first` on (0: all of them). */
static HpcStatus launch_phases(CudaExec *ex, int id, int first, HpcError *err)
{
    const IrNode *n = NODE(id);
    /* LINEAR_DW_BGRAD's phases (its fallback) write db, its output 1. */
    int y = n->op == IR_OP_LINEAR_DW_BGRAD ? ir_output(ex->g, id, 1) : id;
    EopArgs a = {.y = cuda_exec_ptr(ex, y), .ctl = ex->ctl, .B = ex->B, .L = ex->L, .salt = ex->kernels->node[id].salt};
    for (int k = 0; k < n->n_in; k++) a.x[k] = cuda_exec_ptr(ex, n->in[k]);
    for (int k = 1; k < ir_op_info(n->op)->n_outputs && k <= EOP_MAX_EXTRA_OUTPUTS; k++) {
        int o = ir_output(ex->g, id, k);   /* a multi-output node writes its OUTPUT values too */
        if (o >= 0) a.yk[k - 1] = cuda_exec_ptr(ex, o);
    }
    if (ex->plan.scratch_off[id] >= 0) a.scratch = ex->arena.base + (CUdeviceptr)ex->plan.scratch_off[id];
    void *args[] = {&a};
    HpcStatus st = HPC_OK;
    for (int k = first; k < ex->code[id].n_phases && !st; k++)
        if (ex->code[id].phase[k].grid[0] > 0)   /* 0: not at this shape (StepPhase.above_l) */
            st = cuda_launch(ex->fn[id][k], ex->code[id].phase[k].grid, ex->code[id].phase[k].block,
                             ex->code[id].phase[k].shared_bytes, ex->dev->stream, args, err);
    return st;
}

HpcStatus cuda_exec_launch_node(CudaExec *ex, int id, HpcError *err)
{
    HpcStatus st;
    GemmDesc d;
    switch (ex->code[id].kind) {
    case EOP_NONE:
    case EOP_UPLOAD: return HPC_OK;
    case EOP_GEMM:
        cuda_exec_gemm_desc(ex, id, &d);
        if (d.epilogue == GEMM_EPI_BGRAD_A) {   /* the column-sum kernels only where cuBLASLt has no epilogue */
            bool done = false;
            st = gemm_run_optional(&ex->gemm, &d, &done, err);
            return st || done ? st : launch_phases(ex, id, 0, err);
        }
        bool own = false;   /* hpc's own GEMM ran it (cuda_exec_own.c) */
        st = cuda_exec_own_launch(ex, id, &d, &own, err);
        if (!st && !own) st = gemm_run(&ex->gemm, &d, err);
        return st ? st : launch_phases(ex, id, 0, err);
    case EOP_KERNELS:   /* from the phase the GEMM before it has not done (cuda_exec_own.c) */
        return launch_phases(ex, id, cuda_exec_own_first_phase(ex, id), err);
    }
    return HPC_OK;
}

HpcStatus cuda_exec_launch_at(CudaExec *ex, int *t, int end, HpcError *err)
{
    int batch = cuda_exec_dw_batch_len(ex, *t, end);
    if (batch < 2) return cuda_exec_launch_node(ex, ex->plan.order[*t], err);
    HpcStatus st = cuda_exec_dw_batch_launch(ex, *t, err);
    *t += batch - 1;
    return st;
}

static HpcStatus launch_all(CudaExec *ex, int end, HpcError *err)
{
    HpcStatus st = HPC_OK;
    for (int t = 0; t < end && !st; t++) {
        st = cuda_exec_launch_at(ex, &t, end, err);
        if (st) {
            size_t len = strlen(err->msg);
            snprintf(err->msg + len, sizeof err->msg - len, " (node %d, %s)", ex->plan.order[t],
                     NODE(ex->plan.order[t])->name);
        }
    }
    return st;
}

static CudaExecGraph *graph_slot(CudaExec *ex, bool backward, uint64_t tail_key)
{
    for (int i = 0; i < ex->n_graphs; i++) {
        CudaExecGraph *s = &ex->graphs[i];
        if (s->B == ex->B && s->L == ex->L && s->backward == backward && s->tail_key == tail_key) return s;
    }
    if (ex->n_graphs == CUDA_EXEC_MAX_GRAPHS) return NULL;
    CudaExecGraph *s = &ex->graphs[ex->n_graphs++];
    *s = (CudaExecGraph){.B = ex->B, .L = ex->L, .backward = backward, .tail_key = tail_key};
    return s;
}

/* The step's nodes, then the tail (the optimizer) on the same stream. */
HpcStatus cuda_exec_launch_step(CudaExec *ex, int end, const CudaExecTail *tail, HpcError *err)
{
    HpcStatus st = launch_all(ex, end, err);
    return st || !tail ? st : tail->queue(tail->ctx, ex->dev->stream, err);
}

/* The first run of a shape is eager (cuBLASLt picks its algorithms outside
 * a capture); the second is captured and launched; later ones replay. */
static HpcStatus run_graph(CudaExec *ex, int end, bool backward, const CudaExecTail *tail, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    CudaExecGraph *s = graph_slot(ex, backward, tail ? tail->key : 0);
    if (!s || (!s->exec && s->runs++ == 0)) return cuda_exec_launch_step(ex, end, tail, err);
    if (!s->exec) {
        CUgraph graph = NULL;
        HpcStatus st = CUDA_CHECK(err, cu->cuStreamBeginCapture(ex->dev->stream, CU_STREAM_CAPTURE_MODE_RELAXED));
        if (st) return st;
        HpcStatus run = cuda_exec_launch_step(ex, end, tail, err);
        st = CUDA_CHECK(err, cu->cuStreamEndCapture(ex->dev->stream, &graph));
        if (run) st = run;
        if (!st) st = CUDA_CHECK(err, cu->cuGraphInstantiate(&s->exec, graph, 0));
        if (graph) cu->cuGraphDestroy(graph);
        if (st) return st;
    }
    return CUDA_CHECK(err, cu->cuGraphLaunch(s->exec, ex->dev->stream));
}

HpcStatus cuda_exec_stage(CudaExec *ex, const Batch *batch, const CudaRunOptions *opts, HpcError *err)
{
    /* a packed batch (docs/packing.md) is bounded by its slots: every value
     * of a packed graph grows with B x L or B, none with L alone */
    bool packed = ir_graph_packed(ex->g);
    bool outside = packed ? batch->B * batch->L > ex->plan.B * ex->plan.L : batch->L > ex->plan.L;
    if (batch->B < 1 || batch->L < 1 || batch->B > ex->plan.B || outside)
        return hpc_fail(err, HPC_ERR_USAGE, "cuda_exec: batch %lld x %lld outside the planned bounds "
                        "%lld x %lld; plan with the largest batch and length", (long long)batch->B,
                        (long long)batch->L, (long long)ex->plan.B, (long long)ex->plan.L);
    HpcStatus st = check_batch(ex, batch, err);
    if (!st) st = refresh_code(ex, batch->B, batch->L, err);
    if (st) return st;
    ex->B = batch->B;
    ex->L = batch->L;
    ex->ctl_host = (EopCtl){.seed = opts->seed, .step = opts->step, .training = opts->training,
                            .loss_scale = (float)opts->loss_scale};
    const CudaDriver *cu = cuda_driver();
    st = CUDA_CHECK(err, cu->cuMemcpyHtoDAsync(ex->ctl, &ex->ctl_host, sizeof ex->ctl_host, ex->dev->stream));
    if (!st && opts->loss_scale_dev)   /* the scaler's value, in stream order: no host wait */
        st = CUDA_CHECK(err, cu->cuMemcpyDtoDAsync(ex->ctl + offsetof(EopCtl, loss_scale), opts->loss_scale_dev,
                                                   sizeof(float), ex->dev->stream));
    for (int i = 0; i < ex->g->n && !st; i++)
        if (ex->code[i].kind == EOP_UPLOAD) st = upload_input(ex, i, batch, err);
    return st;
}

static HpcStatus launch_run(CudaExec *ex, const CudaRunOptions *opts, HpcError *err)
{
    int end = opts->backward ? ex->plan.n_order : ex->plan.n_forward;
    if (opts->backward && opts->tail && opts->tail->applies_fixes) end = ex->fix_from;
    ex->fixes_pending = end < ex->plan.n_order && opts->backward;
    CudaProfileMode mode;
    int replays;
    HpcStatus st = cuda_exec_profile_mode(&mode, &replays, err);
    if (st) return st;
    if (mode == CUDA_PROFILE_EAGER) return cuda_exec_profile_eager(ex, end, opts->tail, err);
    if (mode == CUDA_PROFILE_GRAPH) {
        /* as run_graph: a shape's first run is eager, so cuBLASLt chooses
         * its algorithms outside a capture */
        CudaExecGraph *s = graph_slot(ex, opts->backward, opts->tail ? opts->tail->key : 0);
        if (!s || (!s->exec && s->runs++ == 0)) return cuda_exec_launch_step(ex, end, opts->tail, err);
        return cuda_exec_profile_graph(ex, end, opts->tail, replays, err);
    }
    return opts->graph ? run_graph(ex, end, opts->backward, opts->tail, err)
                       : cuda_exec_launch_step(ex, end, opts->tail, err);
}

HpcStatus cuda_exec_launch(CudaExec *ex, const CudaRunOptions *opts, HpcError *err)
{
    HpcStatus st = launch_run(ex, opts, err);
    gemm_tune_flush(&ex->gemm);   /* this run's new GEMM choices, one file write */
    return st;
}

HpcStatus cuda_exec_run(CudaExec *ex, const Batch *batch, const CudaRunOptions *opts, HpcError *err)
{
    HpcStatus st = cuda_exec_stage(ex, batch, opts, err);
    return st ? st : cuda_exec_launch(ex, opts, err);
}

HpcStatus cuda_exec_sync(CudaExec *ex, HpcError *err)
{
    return CUDA_CHECK(err, cuda_driver()->cuStreamSynchronize(ex->dev->stream));
}

HpcStatus cuda_exec_read(CudaExec *ex, int v, float *out, HpcError *err)
{
    if (v < 0 || v >= ex->g->n)
        return hpc_fail(err, HPC_ERR_USAGE, "cuda_exec_read: no value %d (the graph has %d)", v, ex->g->n);
    if (ex->fixes_pending && v >= ex->fix_from)   /* the schedule is the node order (program/plan.h) */
        return hpc_fail(err, HPC_ERR_USAGE, "cuda_exec_read: %s was not written: the last run's tail (the "
                        "optimizer) applied its LayerNorm fix itself; read it after a run without the tail",
                        NODE(v)->name);
    const IrNode *n = NODE(v);
    if (!ir_dtype_is_float(n->dtype))
        return hpc_fail(err, HPC_ERR_USAGE, "cuda_exec_read: value %d (%s) is an integer value", v, n->name);
    int64_t numel = ir_numel(n, ex->B, ex->L);
    size_t es = plan_dtype_size(n->dtype);
    void *dst = out;
    uint16_t *tmp = NULL;
    if (n->dtype != DT_F32 && !(dst = tmp = malloc((size_t)numel * 2 + 1)))
        return hpc_fail(err, HPC_ERR_OOM, "cuda_exec_read: out of host memory");
    HpcStatus st = CUDA_CHECK(err, cuda_driver()->cuMemcpyDtoHAsync(dst, cuda_exec_ptr(ex, v),
                                                                    (size_t)numel * es, ex->dev->stream));
    if (!st) st = cuda_exec_sync(ex, err);
    for (int64_t i = 0; tmp && i < numel && !st; i++)
        out[i] = n->dtype == DT_F16 ? half_to_f32(tmp[i]) : bf16_to_f32(tmp[i]);
    free(tmp);
    return st;
}

HpcStatus cuda_exec_loss(CudaExec *ex, double *loss, HpcError *err)
{
    float l = 0;
    HpcStatus st = cuda_exec_read(ex, ex->g->loss, &l, err);
    *loss = l;
    return st;
}
