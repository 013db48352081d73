/* runtime/cuda/cuda_optim.c — the device optimizer step; see cuda_optim.h. */
#include "cuda/cuda_optim.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/lossscale.h"
#include "train/optim.h"
#include "train/schedule.h"

/* The layouts the kernels assume (their static_asserts hold the same). */
_Static_assert(sizeof(CudaOptChunk) == 16, "opt_chunk layout");
_Static_assert(sizeof(CudaOptTensor) == 56, "opt_tensor layout");
_Static_assert(sizeof(CudaOptParams) == 120, "opt_params layout");
_Static_assert(sizeof(CudaOptState) == 64, "opt_state layout");
_Static_assert(sizeof(CudaOptFix) == 72, "opt_fix layout");
/* The kernels' numeric codes for these enums. */
_Static_assert(OPT_ADAMW == 0 && OPT_ADAM == 1 && OPT_SGD == 2 && OPT_LAMB == 3, "optimizer codes");
_Static_assert(SCHED_LINEAR == 1 && SCHED_COSINE == 2, "schedule codes");
_Static_assert(LOSS_SCALE_DYNAMIC == 0, "loss scaling codes");

/* ---- the chunk table and the launches (no executor) --------------------- */

int cuda_optim_chunks(const int64_t *numel, int count, CudaOptChunk *chunks, int *chunk_first)
{
    int n = 0;
    for (int k = 0; k < count; k++) {
        if (chunk_first) chunk_first[k] = n;
        for (int64_t b = 0; b < numel[k]; b += CUDA_OPTIM_CHUNK, n++) {
            int64_t len = numel[k] - b < CUDA_OPTIM_CHUNK ? numel[k] - b : CUDA_OPTIM_CHUNK;
            if (chunks) chunks[n] = (CudaOptChunk){.tensor = (uint32_t)k, .len = (uint32_t)len, .begin = (uint64_t)b};
        }
    }
    if (chunk_first) chunk_first[count] = n;
    return n;
}

int cuda_optim_check_blocks(int n_chunks)
{
    return (n_chunks + CUDA_OPTIM_CHECK_CHUNKS - 1) / CUDA_OPTIM_CHECK_CHUNKS;
}

double cuda_optim_step_bytes(const CudaOptTensor *t, int count, SpecOptimizer kind)
{
    double total = 0;
    for (int k = 0; k < count; k++) {
        /* check reads g; update reads g, p (+ m, v) and writes p (+ m, v, low);
         * LAMB's norm pass reads g, p, m, v and writes m, v once more. */
        double g = t[k].grad_dtype == CUDA_OPT_GRAD_F32 ? 4 : 2;
        double per = g + g + 8 + (t[k].m ? 8 : 0) + (t[k].v ? 8 : 0) + (t[k].low ? 2 : 0);
        if (kind == OPT_LAMB) per += 24;
        total += per * (double)t[k].n;
    }
    return total;
}

const char *const cuda_optim_kernel_names[7] = {"opt_check_norm", "opt_decide",     "opt_lamb_norms",
                                                "opt_lamb_ratio", "opt_update",     "opt_accumulate",
                                                "opt_mark_rows"};

HpcStatus cuda_optim_kernels(CUmodule module, CudaOptKernels *k, HpcError *err)
{
    CUfunction *dst[] = {&k->check,  &k->decide,     &k->lamb_norms, &k->lamb_ratio,
                         &k->update, &k->accumulate, &k->mark_rows};
    for (size_t i = 0; i < sizeof dst / sizeof dst[0]; i++) {
        CUresult r = cuda_driver()->cuModuleGetFunction(dst[i], module, cuda_optim_kernel_names[i]);
        if (r == CUDA_ERROR_NOT_FOUND)
            return hpc_fail(err, HPC_ERR_INPUT, "cuda optimizer: the step module has no kernel %s (a program "
                            "compiled by an hpc whose optimizer had its own module); recompile it with "
                            "`hpc compile MODEL`", cuda_optim_kernel_names[i]);
        HpcStatus st = CUDA_CHECK(err, r);
        if (st) return st;
    }
    return HPC_OK;
}

/* The snaps' block for fixes[0..count) (2 cols floats for each with a
 * gamma) and each fix's snap in it; returns the block's bytes (0: none). */
static size_t snap_layout(CudaOptFix *fixes, int count, CUdeviceptr block)
{
    size_t bytes = 0;
    for (int k = 0; k < count; k++) {
        if (!fixes[k].raw || !fixes[k].gamma) continue;
        fixes[k].snap = block + bytes;
        bytes += ((size_t)fixes[k].cols * 8 + 255) & ~(size_t)255;
    }
    return bytes;
}

HpcStatus cuda_optim_plan_build(CudaOptPlan *p, const CudaOptTensor *t, const uint64_t *src_grads,
                                const CudaOptFix *fixes, int count, const CudaOptParams *prm,
                                const CudaOptState *init, CudaOptAlloc alloc, void *ctx, CUstream s,
                                HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    memset(p, 0, sizeof *p);
    p->count = count;
    p->prm = *prm;
    int64_t *numel = xcalloc((size_t)count + 1, sizeof *numel);
    for (int k = 0; k < count; k++) numel[k] = t[k].n;
    p->n_chunks = cuda_optim_chunks(numel, count, NULL, NULL);
    CudaOptChunk *chunks = xcalloc((size_t)p->n_chunks + 1, sizeof *chunks);
    int *first = xcalloc((size_t)count + 1, sizeof *first);
    cuda_optim_chunks(numel, count, chunks, first);
    p->parts = cuda_optim_check_blocks(p->n_chunks);
    size_t nt = (size_t)(count > 0 ? count : 1), nc = (size_t)(p->n_chunks > 0 ? p->n_chunks : 1);
    size_t np = (size_t)(p->parts > 0 ? p->parts : 1);
    HpcStatus st = alloc(ctx, &p->tensors, nt * sizeof *t, "optimizer table", err);
    if (!st && src_grads) st = alloc(ctx, &p->src_grads, nt * 8, "optimizer gradient table", err);
    if (!st) st = alloc(ctx, &p->chunks, nc * sizeof *chunks, "optimizer chunks", err);
    if (!st) st = alloc(ctx, &p->chunk_first, (nt + 1) * 4, "optimizer chunk index", err);
    if (!st) st = alloc(ctx, &p->state, sizeof *init, "optimizer state", err);
    if (!st) st = alloc(ctx, &p->decision, CUDA_OPTIM_DECISION_BYTES, "optimizer decision", err);
    if (!st) st = alloc(ctx, &p->part_sq, np * 8, "optimizer partials", err);
    if (!st) st = alloc(ctx, &p->part_inf, np * 4, "optimizer flags", err);
    if (!st) st = alloc(ctx, &p->poison, 4, "optimizer poison flag", err);
    if (!st && prm->kind == OPT_LAMB) {
        st = alloc(ctx, &p->part_pu, nc * 16, "LAMB partials", err);
        if (!st) st = alloc(ctx, &p->ratio, nt * 4, "LAMB ratios", err);
    }
    CudaOptFix *fx = fixes ? xmalloc(nt * sizeof *fx) : NULL;
    if (fx) memcpy(fx, fixes, (size_t)count * sizeof *fx);
    size_t snap_bytes = fx ? snap_layout(fx, count, 0) : 0;
    if (!st && fx) st = alloc(ctx, &p->fixes, nt * sizeof *fx, "optimizer fix table", err);
    if (!st && snap_bytes) st = alloc(ctx, &p->snaps, snap_bytes, "optimizer gamma and beta snaps", err);
    if (!st && fx) {
        snap_layout(fx, count, p->snaps);
        st = CUDA_CHECK(err, cu->cuMemcpyHtoDAsync(p->fixes, fx, (size_t)count * sizeof *fx, s));
    }
    if (!st && count) st = CUDA_CHECK(err, cu->cuMemcpyHtoDAsync(p->tensors, t, (size_t)count * sizeof *t, s));
    if (!st && count && src_grads)
        st = CUDA_CHECK(err, cu->cuMemcpyHtoDAsync(p->src_grads, src_grads, (size_t)count * 8, s));
    if (!st && p->n_chunks)
        st = CUDA_CHECK(err, cu->cuMemcpyHtoDAsync(p->chunks, chunks, (size_t)p->n_chunks * sizeof *chunks, s));
    if (!st) st = CUDA_CHECK(err, cu->cuMemcpyHtoDAsync(p->chunk_first, first, ((size_t)count + 1) * 4, s));
    if (!st) st = CUDA_CHECK(err, cu->cuMemcpyHtoDAsync(p->state, init, sizeof *init, s));
    if (!st) st = CUDA_CHECK(err, cu->cuMemsetD32Async(p->poison, 0, 1, s));
    if (!st) st = CUDA_CHECK(err, cu->cuStreamSynchronize(s));   /* the host tables are freed next */
    free(numel);
    free(chunks);
    free(first);
    free(fx);
    return st;
}

HpcStatus cuda_optim_plan_rows(CudaOptPlan *p, const CudaOptTensor *t, const CudaOptRows *rows, int n,
                               CudaOptAlloc alloc, void *ctx, CUstream s, HpcError *err)
{
    HPC_ASSERT(n >= 0 && n <= CUDA_OPTIM_MAX_ROW_TABLES);
    if (n == 0 || p->n_chunks == 0) return HPC_OK;
    int64_t *numel = xcalloc((size_t)p->count + 1, sizeof *numel);
    int *first = xcalloc((size_t)p->count + 1, sizeof *first);
    for (int k = 0; k < p->count; k++) numel[k] = t[k].n;
    cuda_optim_chunks(numel, p->count, NULL, first);
    for (int i = 0; i < n; i++) {
        HPC_ASSERT(numel[rows[i].tensor] == rows[i].rows * rows[i].cols);
        p->rows[i] = rows[i];
        p->rows[i].first = first[rows[i].tensor];
        p->rows[i].n = first[rows[i].tensor + 1] - first[rows[i].tensor];
    }
    free(numel);
    free(first);
    HpcStatus st = alloc(ctx, &p->live, (size_t)p->n_chunks, "optimizer live chunks", err);
    if (!st) st = CUDA_CHECK(err, cuda_driver()->cuMemsetD8Async(p->live, 1, (size_t)p->n_chunks, s));
    if (!st) p->n_rows = n;
    return st;
}

static HpcStatus launch1(CUfunction f, unsigned grid, unsigned block, CUstream s, void **args, HpcError *err)
{
    return cuda_launch(f, (unsigned[3]){grid, 1, 1}, (unsigned[3]){block, 1, 1}, 0, s, args, err);
}

/* opt_mark_rows for each of p's row tables. */
static HpcStatus queue_marks(const CudaOptKernels *k, const CudaOptPlan *p, CUstream s, HpcError *err)
{
    HpcStatus st = HPC_OK;
    for (int i = 0; !st && i < p->n_rows; i++) {
        CudaOptRows r = p->rows[i];
        HPC_ASSERT(r.n_ids >= 0 && r.n_ids <= INT32_MAX);
        int n_ids = (int)r.n_ids;
        void *args[] = {(void *)&p->live, &r.first, &r.n, &r.ids, &n_ids, &r.rows, &r.cols};
        st = launch1(k->mark_rows, 1, 1024, s, args, err);
    }
    return st;
}

HpcStatus cuda_optim_queue_step(const CudaOptKernels *k, const CudaOptPlan *p, bool fixed, CUstream s,
                                HpcError *err)
{
    if (p->n_chunks == 0) return HPC_OK;
    CudaOptPlan v = *p;   /* kernel arguments are read through pointers */
    CUdeviceptr ratio = p->prm.kind == OPT_LAMB ? p->ratio : 0, fixes = fixed ? p->fixes : 0;
    CUdeviceptr live = p->n_rows > 0 ? p->live : 0;
    void *check_args[] = {&v.part_sq, &v.part_inf, &v.tensors, &v.chunks, &v.n_chunks,
                          &v.state,   &v.poison,   &fixes,     &live};
    void *decide_args[] = {&v.decision, &v.state, &v.part_sq, &v.part_inf, &v.parts, &v.prm, &v.poison};
    void *update_args[] = {&v.decision, &v.tensors, &v.chunks, &ratio, &v.prm, &fixes, &live};
    HpcStatus st = queue_marks(k, p, s, err);
    if (!st) st = launch1(k->check, (unsigned)p->parts, 256, s, check_args, err);
    if (!st) st = launch1(k->decide, 1, 1024, s, decide_args, err);
    if (!st && p->prm.kind == OPT_LAMB) {
        void *norm_args[] = {&v.part_pu, &v.decision, &v.tensors, &v.chunks, &v.prm, &fixes, &live};
        void *ratio_args[] = {&v.ratio, &v.part_pu, &v.chunk_first, &v.decision};
        st = launch1(k->lamb_norms, (unsigned)p->n_chunks, 256, s, norm_args, err);
        if (!st) st = launch1(k->lamb_ratio, (unsigned)p->count, 256, s, ratio_args, err);
    }
    return st ? st : launch1(k->update, (unsigned)p->n_chunks, 256, s, update_args, err);
}

HpcStatus cuda_optim_queue_accumulate(const CudaOptKernels *k, const CudaOptPlan *p, float mul, int first,
                                      bool fixed, CUstream s, HpcError *err)
{
    if (p->n_chunks == 0) return HPC_OK;
    HPC_ASSERT(p->src_grads);
    CudaOptPlan v = *p;
    CUdeviceptr fixes = fixed ? p->fixes : 0;
    void *args[] = {&v.tensors, &v.src_grads, &v.chunks, &mul, &first, &fixes};
    return launch1(k->accumulate, (unsigned)p->n_chunks, 256, s, args, err);
}

/* ---- the trainer's optimizer over an executor --------------------------- */

/* The schedule and scaler constants the kernels read by value. */
static CudaOptParams params_of(const SpecTraining *tr, int64_t total_steps, LossScaler *ls)
{
    ScheduleConfig sc;
    schedule_config_from_spec(&sc, tr, total_steps);
    LossScaleConfig lc;
    ls_config_from_spec(&lc, tr);
    ls_init(ls, &lc);
    return (CudaOptParams){
        .kind = tr->optimizer, .nesterov = tr->nesterov, .sched_kind = sc.kind, .ls_mode = lc.mode,
        .beta1 = tr->beta1, .beta2 = tr->beta2, .eps = tr->eps, .weight_decay = tr->weight_decay,
        .momentum = tr->momentum, .max_grad_norm = tr->max_grad_norm,
        .lr = sc.lr, .min_lr_ratio = sc.min_lr_ratio,
        .warmup_steps = sc.warmup_steps, .total_steps = sc.total_steps,
        .ls_growth = lc.growth, .ls_backoff = lc.backoff, .ls_interval = lc.interval,
    };
}

/* One zeroed allocation holding a buffer of bytes[i] for each of the
 * count tensors (arena_alloc_packed); ptrs[i] the tensor's. */
static HpcStatus zeroed_packed(CudaOptim *o, CUdeviceptr *block, CUdeviceptr *ptrs, const size_t *bytes,
                               const char *what, HpcError *err)
{
    HpcStatus st = arena_alloc_packed(&o->ex->arena, block, ptrs, bytes, o->count, what, err);
    size_t total = 0;
    for (int i = 0; i < o->count; i++) total += arena_align(bytes[i]);
    return st || !*block ? st : CUDA_CHECK(err, cuda_driver()->cuMemsetD8Async(*block, 0, total, o->ex->dev->stream));
}

/* Parameter p's 16-bit copy, or 0: the step module's optimizer was
 * rendered for the graph's copy dtype (compiler/emit_optim.c), so the copy
 * is taken from the graph too, never assumed from the policy. */
static CUdeviceptr low_copy(const CudaExec *ex, int p)
{
    CUdeviceptr low = cuda_exec_param_ptr(ex, p, DT_F16);
    return low ? low : cuda_exec_param_ptr(ex, p, DT_BF16);
}

/* How the tails read value v, a parameter's gradient: plain (0: it comes
 * before the executor's trailing fixes), through a fix (1, *f filled:
 * the gradient of an LN_DW_FIX or LN_DW_FIX_DB, its db output, or a view
 * of rows of either), or not at all (-1: another trailing value, or one
 * these kernels cannot read: then no tail applies the fixes). */
static int fix_of(const CudaExec *ex, int v, CudaOptFix *f)
{
    const IrGraph *g = ex->g;
    *f = (CudaOptFix){0};
    if (v < ex->fix_from) return 0;
    int b;
    int64_t off;
    if (!plan_view_of(g, v, &b, &off)) b = v, off = 0;
    const IrNode *n = &g->nodes[b];
    /* the bias gradient LN_DW_FIX_DB copies out of raw's ones column */
    bool bias = n->op == IR_OP_OUTPUT && n->attr.output.index == 1 && g->nodes[n->in[0]].op == IR_OP_LN_DW_FIX_DB;
    const IrNode *x = &g->nodes[bias ? n->in[0] : b];
    if (x->op != IR_OP_LN_DW_FIX && x->op != IR_OP_LN_DW_FIX_DB) return -1;
    const IrNode *raw = &g->nodes[x->in[0]];
    /* raw and the fixed gradient of one dtype (f32, or 16 bits: HPC_WEIGHT_GRAD=low),
     * gamma and beta f32, a separate db f32 or raw's */
    DType dt = raw->dtype;
    bool typed = (dt == DT_F32 || dt == DT_F16 || dt == DT_BF16) && x->dtype == dt && g->nodes[v].dtype == dt;
    for (int k = 1; k < 3 && k < x->n_in; k++) typed &= g->nodes[x->in[k]].dtype == DT_F32;
    DType db_dt = x->op == IR_OP_LN_DW_FIX ? g->nodes[x->in[3]].dtype : dt;
    typed &= db_dt == DT_F32 || db_dt == dt;
    int64_t es = dt == DT_F32 ? 4 : 2;
    int64_t cols = x->dims[1], ld = raw->dims[raw->rank - 1], e = off / es;   /* v's first element in b */
    if (!typed || off % es || (!bias && e % cols) || ir_numel(&g->nodes[v], 1, 1) >= INT32_MAX) return -1;
    int64_t row0 = bias ? e : e / cols;
    CUdeviceptr r = cuda_exec_ptr(ex, x->in[0]);
    if (bias) {
        *f = (CudaOptFix){.raw = r + (CUdeviceptr)((row0 * ld + cols) * es), .cols = 1, .ld = ld};
        return 1;
    }
    *f = (CudaOptFix){.raw = r + (CUdeviceptr)(row0 * ld * es), .gamma = cuda_exec_ptr(ex, x->in[1]),
                      .beta = cuda_exec_ptr(ex, x->in[2]), .cols = cols, .ld = ld};
    if (x->op == IR_OP_LN_DW_FIX)
        f->db = cuda_exec_ptr(ex, x->in[3]) + (CUdeviceptr)(row0 * (db_dt == DT_F32 ? 4 : 2)), f->db_ld = 1;
    else
        f->db = r + (CUdeviceptr)((row0 * ld + cols) * es), f->db_ld = ld;
    f->db_low = db_dt != DT_F32;
    return 1;
}

/* The kernels' code of a parameter gradient's dtype (the graph's: f32, or
 * f16 / bf16 where the precision plan stores it low). */
static uint8_t grad_dtype(DType dt)
{
    HPC_ASSERT(dt == DT_F32 || dt == DT_F16 || dt == DT_BF16);
    return dt == DT_F16 ? CUDA_OPT_GRAD_F16 : dt == DT_BF16 ? CUDA_OPT_GRAD_BF16 : CUDA_OPT_GRAD_F32;
}

/* Whether HPC_OPT_LN_FIX allows the tails to apply the fixes (unset or 1). */
static bool fixes_wanted(void)
{
    const char *e = getenv("HPC_OPT_LN_FIX");
    return !e || strcmp(e, "0") != 0;
}

/* One CudaOptTensor per parameter with a gradient, state zeroed (m, v and
 * the gradient sums in one allocation each, not one per tensor); src[]
 * gets the executor's gradient of each, host_fix how the tails read it
 * (all plain unless applies_fixes). */
static HpcStatus build_tensors(CudaOptim *o, const SpecTraining *tr, uint64_t *src, HpcError *err)
{
    const IrGraph *g = o->ex->g;
    const ParamList *pl = o->ex->pl;
    OptimConfig oc;
    optim_config_from_spec(&oc, tr);
    size_t *bytes = xcalloc((size_t)pl->n + 1, sizeof *bytes);
    CUdeviceptr *ptrs = xcalloc((size_t)pl->n + 1, sizeof *ptrs);
    int fixed = 0, unread = 0;
    bool wanted = fixes_wanted();
    for (int p = 0; p < pl->n; p++) {
        if (g->param_grad[p] < 0) continue;
        HPC_ASSERT(pl->p[p].tied_to < 0);
        int64_t n = params_numel(&pl->p[p]);
        CudaOptTensor *t = &o->host_t[o->count];
        src[o->count] = cuda_exec_ptr(o->ex, g->param_grad[p]);
        int how = wanted ? fix_of(o->ex, g->param_grad[p], &o->host_fix[o->count]) : 0;
        fixed += how > 0;
        unread += how < 0;
        uint8_t gdt = grad_dtype(g->nodes[g->param_grad[p]].dtype);
        *t = (CudaOptTensor){.master = cuda_exec_param_ptr(o->ex, p, DT_F32), .grad = src[o->count], .n = n,
                             .decay = pl->p[p].decay, .low = low_copy(o->ex, p), .grad_dtype = gdt,
                             .src_dtype = gdt};
        bytes[o->count] = (size_t)n * 4;
        o->param[o->count++] = p;
    }
    o->applies_fixes = fixed > 0 && unread == 0;
    if (!o->applies_fixes) memset(o->host_fix, 0, (size_t)(pl->n + 1) * sizeof *o->host_fix);
    HpcStatus st = HPC_OK;
    if (optim_needs_m(&oc) && !(st = zeroed_packed(o, &o->m_block, ptrs, bytes, "optimizer m", err)))
        for (int i = 0; i < o->count; i++) o->host_t[i].m = ptrs[i];
    if (!st && optim_needs_v(&oc) && !(st = zeroed_packed(o, &o->v_block, ptrs, bytes, "optimizer v", err)))
        for (int i = 0; i < o->count; i++) o->host_t[i].v = ptrs[i];
    if (!st && o->grad_accum > 1 &&
        !(st = arena_alloc_packed(&o->ex->arena, &o->acc_block, o->acc, bytes, o->count, "gradient sums", err)))
        for (int i = 0; i < o->count; i++) {   /* the sums are f32; opt_accumulate reads src_dtype */
            o->host_t[i].grad = o->acc[i];
            o->host_t[i].grad_dtype = CUDA_OPT_GRAD_F32;
        }
    free(bytes);
    free(ptrs);
    return st;
}

static HpcStatus arena_alloc_cb(void *ctx, CUdeviceptr *p, size_t bytes, const char *what, HpcError *err)
{
    return arena_alloc(ctx, p, bytes, what, err);
}

/* o's plan for a step: marking the row tables from the ids of the run just
 * queued (`rows`: a tail's, right after that run), or not at all. */
static CudaOptPlan step_plan(const CudaOptim *o, bool rows)
{
    CudaOptPlan v = o->plan;
    if (!rows) v.n_rows = 0;
    for (int i = 0; i < v.n_rows; i++)
        v.rows[i].n_ids = ir_numel(&o->ex->g->nodes[o->row_ids[i]], o->ex->B, o->ex->L);
    return v;
}

/* Work `what` (CudaOptTailCtx) of o; `tail`: queued right after the run
 * whose gradients it reads, which stopped before the executor's trailing
 * fixes when o applies them. */
static HpcStatus queue_work(CudaOptim *o, int what, bool tail, CUstream s, HpcError *err)
{
    float mul = (float)(1.0 / (double)o->grad_accum);
    bool fixed = tail && o->applies_fixes;
    HpcStatus st = HPC_OK;
    /* with gradient sums the fixes apply as the micro-batch's gradients are added */
    if (o->grad_accum > 1) st = cuda_optim_queue_accumulate(&o->k, &o->plan, mul, what == 0, fixed, s, err);
    if (st || what != 2) return st;
    CudaOptPlan v = step_plan(o, tail);
    return cuda_optim_queue_step(&o->k, &v, fixed && o->grad_accum == 1, s, err);
}

static HpcStatus tail_queue(void *ctx, CUstream s, HpcError *err)
{
    const CudaOptTailCtx *c = ctx;
    return queue_work(c->o, c->what, true, s, err);
}

/* The untouched-rows tables of o (cuda_optim_rows.h): only with grad_accum
 * 1, and not for a gradient read through a fix. */
static HpcStatus init_rows(CudaOptim *o, HpcError *err)
{
    int64_t min_chunks;
    HpcStatus st = cuda_optim_rows_min_chunks(&min_chunks, err);
    if (st || o->grad_accum > 1 || o->count == 0 || !cuda_optim_rows_wanted()) return st;
    CudaOptRowTable tab[CUDA_OPTIM_MAX_ROW_TABLES];
    CudaOptRows rows[CUDA_OPTIM_MAX_ROW_TABLES];
    int n_tab = cuda_optim_row_tables(o->ex->g, o->param, o->count, min_chunks, tab), n = 0;
    for (int i = 0; i < n_tab; i++) {
        if (o->host_fix[tab[i].tensor].raw) continue;
        o->row_ids[n] = tab[i].ids;
        rows[n++] = (CudaOptRows){.tensor = tab[i].tensor, .ids = cuda_exec_ptr(o->ex, tab[i].ids),
                                  .rows = tab[i].rows, .cols = tab[i].cols};
    }
    return cuda_optim_plan_rows(&o->plan, o->host_t, rows, n, arena_alloc_cb, &o->ex->arena, o->ex->dev->stream,
                                err);
}

/* Tail keys unique over every CudaOptim of the process (graphs of an
 * earlier optimizer hold its buffers, never this one's). */
static void init_tails(CudaOptim *o)
{
    static uint64_t next_key = 1;
    uint64_t base = __atomic_fetch_add(&next_key, 1, __ATOMIC_RELAXED) << 2;
    double bytes = cuda_optim_step_bytes(o->host_t, o->count, (SpecOptimizer)o->plan.prm.kind);
    for (int i = 0; i < 3; i++) {
        o->tail_ctx[i] = (CudaOptTailCtx){.o = o, .what = i};
        o->tails[i] = (CudaExecTail){.queue = tail_queue, .ctx = &o->tail_ctx[i], .key = base | (uint64_t)(i + 1),
                                     .label = i == 2 ? "optimizer + loss scaler (multi-tensor, in the step graph)"
                                                     : "gradient accumulation",
                                     .bytes = i == 2 ? bytes : 0, .applies_fixes = o->applies_fixes};
    }
}

HpcStatus cuda_optim_init(CudaOptim *o, CudaExec *ex, const ModelSpec *spec, SpecPrecision policy,
                          int64_t total_steps, HpcError *err)
{
    memset(o, 0, sizeof *o);
    o->ex = ex;
    o->grad_accum = spec->train.grad_accum > 1 ? spec->train.grad_accum : 1;
    LossScaler ls;
    CudaOptParams prm = params_of(&spec->train, total_steps, &ls);
    int np = ex->pl->n + 1;
    o->param = xcalloc((size_t)np, sizeof *o->param);
    o->host_t = xcalloc((size_t)np, sizeof *o->host_t);
    o->acc = xcalloc((size_t)np, sizeof *o->acc);
    o->host_fix = xcalloc((size_t)np, sizeof *o->host_fix);
    uint64_t *src = xcalloc((size_t)np, sizeof *src);
    (void)policy;   /* the copies' dtype is the graph's (low_copy) */
    HpcStatus st = build_tensors(o, &spec->train, src, err);
    /* A graph that trains nothing has no optimizer block (compiler/emit_optim.c)
     * and nothing to launch: its plan has no chunks. */
    if (!st && o->count > 0) st = cuda_optim_kernels(ex->module, &o->k, err);
    CudaOptState init = {.scale = (float)ls.scale};
    if (!st)
        st = cuda_optim_plan_build(&o->plan, o->host_t, o->grad_accum > 1 ? src : NULL,
                                   o->applies_fixes ? o->host_fix : NULL, o->count, &prm, &init, arena_alloc_cb,
                                   &ex->arena, ex->dev->stream, err);
    free(src);
    if (!st) st = init_rows(o, err);
    if (!st) init_tails(o);
    if (st) cuda_optim_free(o);
    return st;
}

void cuda_optim_free(CudaOptim *o)
{
    if (!o->ex) return;
    DeviceArena *a = &o->ex->arena;
    if (o->m_block) arena_release(a, o->m_block);
    if (o->v_block) arena_release(a, o->v_block);
    if (o->acc_block) arena_release(a, o->acc_block);
    const CudaOptPlan *p = &o->plan;
    CUdeviceptr bufs[] = {p->tensors, p->src_grads, p->chunks, p->chunk_first, p->state, p->decision,
                          p->part_sq, p->part_inf, p->part_pu, p->ratio, p->poison, p->fixes, p->snaps,
                          p->live};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) arena_release(a, bufs[i]);
    free(o->param);
    free(o->host_t);
    free(o->acc);
    free(o->host_fix);
    memset(o, 0, sizeof *o);
}

HpcStatus cuda_optim_accumulate(CudaOptim *o, int64_t micro, HpcError *err)
{
    if (o->grad_accum <= 1) return HPC_OK;
    return queue_work(o, micro == 0 ? 0 : 1, false, o->ex->dev->stream, err);
}

HpcStatus cuda_optim_step(CudaOptim *o, HpcError *err)
{
    /* dense: its gradients may have been summed over ranks (cuda_optim_rows.h) */
    CudaOptPlan v = step_plan(o, false);
    return cuda_optim_queue_step(&o->k, &v, false, o->ex->dev->stream, err);
}

const CudaExecTail *cuda_optim_accumulate_tail(CudaOptim *o, int64_t micro)
{
    return o->grad_accum > 1 ? &o->tails[micro == 0 ? 0 : 1] : NULL;
}

const CudaExecTail *cuda_optim_step_tail(CudaOptim *o) { return &o->tails[2]; }

HpcStatus cuda_optim_poison(CudaOptim *o, HpcError *err)
{
    return CUDA_CHECK(err, cuda_driver()->cuMemsetD32Async(o->plan.poison, 1, 1, o->ex->dev->stream));
}

CUdeviceptr cuda_optim_scale_ptr(const CudaOptim *o) { return o->plan.state + offsetof(CudaOptState, scale); }
CUdeviceptr cuda_optim_state_ptr(const CudaOptim *o) { return o->plan.state; }

HpcStatus cuda_optim_read_state(CudaOptim *o, CudaOptState *s, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    HpcStatus st = CUDA_CHECK(err, cu->cuMemcpyDtoHAsync(s, o->plan.state, sizeof *s, o->ex->dev->stream));
    return st ? st : CUDA_CHECK(err, cu->cuStreamSynchronize(o->ex->dev->stream));
}

HpcStatus cuda_optim_read_master(CudaOptim *o, int p, float *out, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    size_t bytes = (size_t)params_numel(&o->ex->pl->p[p]) * 4;
    HpcStatus st = CUDA_CHECK(err, cu->cuMemcpyDtoHAsync(out, cuda_exec_param_ptr(o->ex, p, DT_F32), bytes,
                                                         o->ex->dev->stream));
    return st ? st : CUDA_CHECK(err, cu->cuStreamSynchronize(o->ex->dev->stream));
}
