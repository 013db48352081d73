/* tests/gpu/gpu_act.c — the step module's activation kernels (ACT forward,
 * the recomputed ACT, ACT_BWD_BGRAD: dx and the bias gradient;
 * compiler/emit_ops_act.c) against the C reference of
 * program/activations.h (the cpu backend's functions), on the kernels'
 * own inputs.
 *
 * Each case builds a one-layer BERT-shaped classifier (hidden 64) with a
 * given FFN activation and size under a policy (fp32, fp16, bf16), runs one
 * training step on the cuda executor with every value kept
 * (PlanOptions.keep_all) and the checked outputs poisoned with NaN first,
 * then reads each checked node's inputs back from the device and
 * recomputes in double:
 *   ACT            y = act(x), rounded to y's dtype;
 *   ACT_BWD_BGRAD  dx = dy * act'(x), rounded to dx's dtype, and
 *                  db = column sums of the device's stored dx (double).
 * Limits (rel L2; NaN positions must match, so an unwritten or a NaN value
 * never passes): y, dx: f32 1e-5, f16 1e-3, bf16 8e-3 (f32 gelu_cdf/expf vs
 * double, then at most one storage ulp apart); db 1e-5 (f32 partials of
 * max(16, R / 512) rows, summed in double).  The shapes cover the vector path
 * (FFN % 8 == 0) and the scalar one (FFN 333), few rows (a partial row
 * block) and 130 x 128 rows (512 row blocks, the cap: the four-row loop and
 * its remainder), and the FFN-sized BERT case (3072).  The recomputed GELU
 * (output 2 of ACT_BWD_BGRAD when merged, an ACT copy under
 * HPC_FUSE_ACT_BGRAD=nomerge) is checked as the forward.  A second run of one
 * case puts a NaN into FFN1's bias: the NaN column must reach dx and db
 * exactly where the reference has it.  The pooler's tanh ACT_BWD_BGRAD is
 * checked in every case.
 *
 * Exit 0 when every check passes, 1 on a failed check, 4 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program/activations.h"
#include "cpu/half.h"
#include "cuda/cuda_driver.h"
#include "cuda/cuda_exec.h"
#include "data/batch.h"
#include "program/ir.h"
#include "program/params.h"
#include "pipeline.h"
#include "program/spec.h"
#include "gpu_check.h"
#include "gpu_check_model.h"

static CudaDevice g_dev;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { return (uint32_t)(gpu_check_xorshift(&g_rng) >> 32); }
static float uniform(void) { return gpu_check_uniform24(rnd() >> 8); }

typedef double (*ActRef)(double);
#define ACT_FWD_(E, name, ffn, hf, ref, grad, cuda) ref,
#define ACT_GRAD_(E, name, ffn, hf, ref, grad, cuda) grad,
static const ActRef act_fwd_ref[] = {HPC_ACTIVATIONS(ACT_FWD_)};
static const ActRef act_grad_ref[] = {HPC_ACTIVATIONS(ACT_GRAD_)};

static void round_to(DType d, float *x, int64_t n)
{
    if (d == DT_F16) half_round_array(x, n);
    else if (d == DT_BF16) bf16_round_array(x, n);
}

static float *read_value(CudaExec *ex, int v, int64_t n, HpcError *err)
{
    float *x = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    if (cuda_exec_read(ex, v, x, err)) {
        free(x);
        return NULL;
    }
    return x;
}

static size_t dtype_bytes(DType d) { return d == DT_F32 ? 4 : 2; }

/* rel L2 with NaN positions compared: NaN where the other side has none fails. */
static double compare(const float *got, const float *ref, int64_t n, int *nan_mismatch, int *nans)
{
    double d = 0, r = 0;
    *nan_mismatch = *nans = 0;
    for (int64_t i = 0; i < n; i++) {
        bool gn = isnan(got[i]), rn = isnan(ref[i]);
        *nans += rn;
        if (gn != rn) (*nan_mismatch)++;
        if (gn || rn) continue;
        double e = (double)got[i] - ref[i];
        d += e * e;
        r += (double)ref[i] * ref[i];
    }
    return *nan_mismatch ? NAN : r > 0 ? sqrt(d / r) : sqrt(d);
}

static double tol_of(DType d) { return d == DT_F32 ? 1e-5 : d == DT_F16 ? 1e-3 : 8e-3; }

typedef struct { int checked_fwd, checked_bwd, checked_recompute, db_nans; } Seen;

static void check_act(CudaExec *ex, const IrGraph *g, int id, const IrGraph *gg, const char *tag, Seen *seen)
{
    (void)gg;
    const IrNode *n = &g->nodes[id];
    int64_t cnt = ir_numel(n, ex->B, ex->L);
    HpcError err = {0};
    float *x = read_value(ex, n->in[0], cnt, &err), *y = x ? read_value(ex, id, cnt, &err) : NULL;
    if (!y) {
        result(0, "%s: %s: read: %s", tag, n->name, err.msg);
        free(x);
        return;
    }
    float *ref = xmalloc((size_t)cnt * sizeof *ref);
    for (int64_t i = 0; i < cnt; i++) ref[i] = (float)act_fwd_ref[n->attr.act.kind](x[i]);
    round_to(n->dtype, ref, cnt);
    int mism, nans;
    double e = compare(y, ref, cnt, &mism, &nans);
    result(!isnan(e) && e <= tol_of(n->dtype), "%s: %s %s (%s, %lld values) rel %.3g <= %.0e, NaN mismatches %d",
           tag, ir_act_name(n->attr.act.kind), n->name, ir_dtype_name(n->dtype), (long long)cnt, e,
           tol_of(n->dtype), mism);
    seen->checked_fwd++;
    free(x);
    free(y);
    free(ref);
}

static void check_act_bwd_bgrad(CudaExec *ex, const IrGraph *g, int id, const char *tag, bool want_nan, Seen *seen)
{
    const IrNode *n = &g->nodes[id];
    int64_t cnt = ir_numel(n, ex->B, ex->L), C = n->dims[n->rank - 1], R = cnt / C;
    int dbv = ir_output(g, id, 1);
    HpcError err = {0};
    float *dy = read_value(ex, n->in[0], cnt, &err);
    float *x = dy ? read_value(ex, n->in[1], cnt, &err) : NULL;
    float *dx = x ? read_value(ex, id, cnt, &err) : NULL;
    float *db = dx && dbv >= 0 ? read_value(ex, dbv, C, &err) : NULL;
    if (!db) {
        result(0, "%s: %s: read: %s", tag, n->name, dbv < 0 ? "no db output" : err.msg);
        free(dy);
        free(x);
        free(dx);
        return;
    }
    ActRef gr = act_grad_ref[n->attr.act_bgrad.kind];
    float *ref = xmalloc((size_t)cnt * sizeof *ref), *dbr = xmalloc((size_t)C * sizeof *dbr);
    for (int64_t i = 0; i < cnt; i++) ref[i] = (float)((double)dy[i] * gr(x[i]));
    round_to(n->dtype, ref, cnt);
    for (int64_t c = 0; c < C; c++) {
        double s = 0;
        for (int64_t r = 0; r < R; r++) s += dx[r * C + c];   /* the device's stored dx */
        dbr[c] = (float)s;
    }
    round_to(g->nodes[dbv].dtype, dbr, C);
    int mism, nans, dmism, dnans;
    double e = compare(dx, ref, cnt, &mism, &nans), ed = compare(db, dbr, C, &dmism, &dnans);
    const char *a = ir_act_name(n->attr.act_bgrad.kind);
    result(!isnan(e) && e <= tol_of(n->dtype), "%s: %s_bwd_bgrad %s dx (%lld x %lld, %s) rel %.3g <= %.0e, NaN mismatches %d (%d NaN)",
           tag, a, n->name, (long long)R, (long long)C, ir_dtype_name(n->dtype), e, tol_of(n->dtype), mism, nans);
    result(!isnan(ed) && ed <= 1e-5, "%s: %s_bwd_bgrad %s db (%lld, %s) rel %.3g <= 1e-05, NaN mismatches %d (%d NaN)",
           tag, a, g->nodes[dbv].name, (long long)C, ir_dtype_name(g->nodes[dbv].dtype), ed, dmism, dnans);
    if (want_nan) seen->db_nans += dnans;
    seen->checked_bwd++;
    int yv = ir_output(g, id, 2);   /* the recomputed forward value, when merged (fuse_act.c) */
    if (yv >= 0) {
        DType yt = g->nodes[yv].dtype;
        float *y = read_value(ex, yv, cnt, &err);
        for (int64_t i = 0; i < cnt; i++) ref[i] = (float)act_fwd_ref[n->attr.act_bgrad.kind](x[i]);
        round_to(yt, ref, cnt);
        double ey = y ? compare(y, ref, cnt, &mism, &nans) : NAN;
        result(!isnan(ey) && ey <= tol_of(yt), "%s: %s_bwd_bgrad %s (recomputed act, %s) rel %.3g <= %.0e, NaN mismatches %d",
               tag, a, g->nodes[yv].name, ir_dtype_name(yt), ey, tol_of(yt), y ? mism : -1);
        seen->checked_recompute++;
        free(y);
    }
    free(dy);
    free(x);
    free(dx);
    free(db);
    free(ref);
    free(dbr);
}

/* NaN into the device buffers of every value the checks read as an output. */
static HpcStatus poison_outputs(CudaExec *ex, const IrGraph *g, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    for (int id = 0; id < g->n; id++) {
        const IrNode *n = &g->nodes[id];
        if (n->op != IR_OP_ACT && n->op != IR_OP_ACT_BWD_BGRAD) continue;
        for (int k = 0; k < ir_op_info(n->op)->n_outputs; k++) {
            int v = ir_output(g, id, k);
            if (v < 0) continue;
            size_t bytes = (size_t)ir_numel(&g->nodes[v], ex->B, ex->L) * dtype_bytes(g->nodes[v].dtype);
            if (CUDA_CHECK(err, cu->cuMemsetD8Async(cuda_exec_ptr(ex, v), 0xFF, bytes, g_dev.stream))) return err->code;
        }
    }
    return HPC_OK;
}

typedef struct {
    SpecActivation act;
    int64_t ffn, B, L;
    SpecPrecision prec;
    bool nan_bias;   /* a NaN in FFN1's bias */
    bool nomerge;    /* HPC_FUSE_ACT_BGRAD=nomerge: the recomputed ACT is its own kernel */
} Case;

static void run_case(Case c)
{
    ModelSpec s;
    spec_defaults(&s);
    snprintf(s.name, sizeof s.name, "act probe");
    s.stack.hidden = 64;
    s.stack.layers = 1;
    s.stack.heads = 2;
    s.stack.ffn = c.ffn;
    s.stack.activation = c.act;
    s.stack.hidden_dropout = 0.1;
    s.stack.attention_dropout = 0.1;
    char tag[160];
    snprintf(tag, sizeof tag, "%s ffn %lld %s B=%lld L=%lld%s%s", spec_activation_name(c.act), (long long)c.ffn,
             spec_precision_name(c.prec), (long long)c.B, (long long)c.L, c.nan_bias ? " NaN in FFN1's bias" : "",
             c.nomerge ? " nomerge" : "");
    PipeOptions po = pipeline_defaults(c.prec);
    Pipeline P;
    HpcError err = {0};
    if (c.nomerge) setenv("HPC_FUSE_ACT_BGRAD", "nomerge", 1);
    HpcStatus bst = pipeline_build(&s, &po, &P, &err);
    unsetenv("HPC_FUSE_ACT_BGRAD");
    if (bst) {
        result(0, "%s: pipeline_build: %s", tag, err.msg);
        return;
    }
    int n_fused = 0;
    for (int i = 0; i < P.g.n; i++) n_fused += P.g.nodes[i].op == IR_OP_ACT_BWD_BGRAD;
    result(n_fused == 2, "%s: %d act_bwd_bgrad nodes (FFN1 and the pooler: 2 expected)", tag, n_fused);
    float **w = gpu_check_random_params(&P.pl, c.prec, uniform);
    if (c.nan_bias)
        for (int q = 0; q < P.pl.n; q++)
            if (strstr(P.pl.p[q].name, "intermediate.dense.bias")) w[q][5] = NAN;
    Batch *b = gpu_check_random_batch(&s, c.B, c.L, true, rnd);
    CudaExec ex;
    /* keep_all: the checks read intermediate values */
    HpcStatus st = cuda_exec_init_with(&ex, &g_dev, &P.g, &P.pl, c.B, c.L, &(PlanOptions){.keep_all = true}, &err);
    bool inited = st == HPC_OK;
    if (!st) st = cuda_exec_set_params(&ex, w, &err);
    if (!st) st = poison_outputs(&ex, &P.g, &err);
    CudaRunOptions o = {.training = true, .backward = true, .seed = 5, .step = 2, .loss_scale = 64};
    if (!st) st = cuda_exec_run(&ex, b, &o, &err);
    if (!st) st = cuda_exec_sync(&ex, &err);
    if (st) {
        result(0, "%s: %s", tag, err.msg);
    } else {
        Seen seen = {0};
        for (int id = 0; id < P.g.n; id++) {
            if (P.g.nodes[id].op == IR_OP_ACT) check_act(&ex, &P.g, id, &P.g, tag, &seen);
            if (P.g.nodes[id].op == IR_OP_ACT_BWD_BGRAD) check_act_bwd_bgrad(&ex, &P.g, id, tag, c.nan_bias, &seen);
        }
        /* the FFN and pooler forward ACTs, the FFN's recompute (a copy, or merged) */
        result(seen.checked_fwd + seen.checked_recompute == 3 && seen.checked_bwd == 2 &&
                   seen.checked_recompute == !c.nomerge,
               "%s: %d act, %d act_bwd_bgrad nodes and %d merged recomputes checked", tag, seen.checked_fwd,
               seen.checked_bwd, seen.checked_recompute);
        if (c.nan_bias) result(seen.db_nans > 0, "%s: the NaN reached %d bias-gradient values", tag, seen.db_nans);
    }
    if (inited) cuda_exec_free(&ex);
    batch_free(b);
    gpu_check_free_params(&P.pl, w);
    pipeline_free(&P);
}

int main(void)
{
    if (!gpu_check_open_device("gpu_act", &g_dev)) return 4;
    printf("gpu_act on %s (sm_%d)\n", g_dev.name, g_dev.arch);
    const SpecPrecision precs[] = {PREC_FP16, PREC_BF16, PREC_FP32};
    for (int p = 0; p < 3; p++) {
        run_case((Case){ACT_GELU, 3072, 4, 37, precs[p], false, false});    /* BERT's FFN; 148 rows: 10 row blocks */
        run_case((Case){ACT_GELU, 333, 5, 29, precs[p], false, false});     /* FFN % 8 != 0: the scalar kernels */
        run_case((Case){ACT_GELU, 264, 130, 128, precs[p], false, false});  /* 16640 rows: 512 row blocks */
    }
    run_case((Case){ACT_GELU_TANH, 1000, 3, 41, PREC_FP16, false, false});
    run_case((Case){ACT_RELU, 1000, 3, 41, PREC_BF16, false, false});
    run_case((Case){ACT_SILU, 1000, 3, 41, PREC_FP16, false, false});
    run_case((Case){ACT_SILU, 77, 3, 41, PREC_FP32, false, false});
    run_case((Case){ACT_GELU, 3072, 4, 37, PREC_FP16, true, false});
    run_case((Case){ACT_GELU, 3072, 4, 37, PREC_FP16, false, true});
    run_case((Case){ACT_GELU, 333, 5, 29, PREC_BF16, false, true});
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
