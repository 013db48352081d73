/* tests/gpu/gpu_attention_step.c — the fused ATTENTION node in the GPU
 * training step (compiler/emit_ops_attention.c wrapping
 * compiler/kernels/attention_mma*.cu's tensor-core kernels) against the cpu
 * backend (runtime/cpu/cpu_exec_attention.inc) on the same weights, batch,
 * dropout seed and step; then fused against unfused on the GPU.
 *
 * Checks (every graph is asserted to hold ATTENTION nodes first):
 *   - fused step vs cpu, dropout on (attention 0.1, same salt and step on
 *     both sides): loss, every parameter gradient, and per attention node
 *     ctx, lse (finite entries; +inf exactly where the cpu has +inf) and
 *     dq, dk, dv (with HPC_FUSE_QKV=1 every attention node is packed,
 *     asserted, and the backward's one (B, L, 3H) output is compared block
 *     by block: its dq, dk, dv columns); cases: bert_tiny fp16 B=3 L=77 (odd, padded rows, one
 *     row fully masked), bert_tiny bf16 B=4 L=128, bert_tiny fp16 B=2 L=200 (past
 *     the one-pass backward's 128 rows: the v2 dQ and dK/dV kernels), a tiny GPT-2 (causal)
 *     fp16 B=2 L=50 and L=100 (v5's kernel past 64 keys), a one-layer BERT-base fp16 B=2 L=128;
 *   - fused vs unfused, both on the GPU, dropout off (spec dropouts 0):
 *     loss and gradients, bert_tiny fp16 B=4 L=96;
 *   - CUDA graph replay of the fused step at another dropout step gives the
 *     eager loss (the kernels read seed and step on the device);
 *   - under v5 (the default), v5 against v4 on the GPU at 134 (b, head)
 *     pairs, more than v5's 132 persistent blocks, every third row without
 *     padding (v5's forward skips the hiding there): loss and gradients
 *     (check_v5_vs_v4).  v5's forward and backward both run from L 65 to
 *     128 at head size 64 in f16: bert_tiny L 77, GPT-2 L 100 (causal),
 *     BERT-base L 128 above check them against the cpu.
 * Tolerances (relative L2; gradients as tests/gpu/gpu_step.c, floor 1e-3 of
 * the largest gradient norm): fp16 1e-2, bf16 4e-2.  The kernel rounds the
 * probabilities to the storage dtype for P V on the tensor cores and sums
 * in another order than the cpu reference (which keeps f32 throughout);
 * fused vs unfused differ by the unfused chain's 16-bit scores/probs: 2e-2.
 * Timing (printed, not checked): BERT-base fp16 B=32 L=128 step, fused vs
 * unfused, CUDA graph replay, median of 20.
 *
 * HPC_ATTN_KERNELS=v1|v2|v3|v4|v5 picks the tensor-core family the step module
 * calls (compiler/emit_ops_attention.c; v5, the default, v4 and v3 have the
 * one-pass backward);
 * the checks are the same for all.
 * Usage: gpu_attention_step [check] [bench]   (default both).
 * Exit 0 when every check passes, 1 on a failure, 4 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_form.h"
#include "compiler/fuse_qkv.h"
#include "cpu/cpu_exec.h"
#include "cpu/half.h"
#include "cuda/cuda_driver.h"
#include "cuda/cuda_exec.h"
#include "data/batch.h"
#include "program/ir.h"
#include "program/params.h"
#include "pipeline.h"
#include "precision.h"
#include "program/spec.h"
#include "compiler/spec_load.h"
#include "gpu_check.h"
#include "gpu_check_model.h"

static CudaDevice g_dev;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { return (uint32_t)(gpu_check_xorshift(&g_rng) >> 16); }
static float uniform(void) { return gpu_check_uniform24(rnd() >> 8); }

typedef enum { M_TINY, M_GPT2_TINY, M_BASE_1L, M_BASE } Shape;

static int make_spec(ModelSpec *s, Shape shape, bool dropout)
{
    spec_defaults(s);
    if (shape != M_TINY) {
        const char *root = getenv("HPC_ROOT");
        char path[512];
        snprintf(path, sizeof path, "%s/models/%s", root ? root : ".",
                 shape == M_GPT2_TINY ? "gpt2_small.model" : "bert_base.model");
        if (spec_load(path, s, stderr) != 0) {
            result(0, "cannot load %s (run from the repository root or set HPC_ROOT)", path);
            return 0;
        }
    }
    if (shape == M_GPT2_TINY) {   /* a classifier pooling the last real token */
        s->head.kind = HEAD_SEQ_CLASSIFICATION;
        s->head.pooler = false;
        s->head.num_labels = 3;
    }
    if (shape == M_TINY || shape == M_GPT2_TINY) {
        s->stack.hidden = 128;
        s->stack.heads = 2;
        s->stack.ffn = 512;
        s->stack.layers = 2;
    }
    if (shape == M_BASE_1L) s->stack.layers = 1;
    static const char *const names[] = {"bert_tiny", "gpt2_tiny", "bert_base_1layer", "bert_base"};
    snprintf(s->name, sizeof s->name, "%s", names[shape]);
    if (!dropout) {
        s->stack.hidden_dropout = 0;
        s->stack.attention_dropout = 0;
        s->head.classifier_dropout = 0;
    }
    return 1;
}

typedef struct {
    ModelSpec spec;
    ParamList pl;
    IrGraph g;
    float **w;
} Model;

/* Weights as tests/gpu/gpu_step.c draws them, rounded to the policy's
 * format so the cpu's f32 masters equal the GPU's low copies; the same
 * stream for the same shape, so two forms of one model get equal weights. */
static int model_build(Model *m, Shape shape, bool dropout, SpecPrecision prec, AttnForm form)
{
    HpcError err = {0};
    if (!make_spec(&m->spec, shape, dropout)) return 0;
    PipeOptions o = pipeline_defaults(prec);
    o.attention = form;
    Pipeline p;
    if (pipeline_build(&m->spec, &o, &p, &err)) {
        result(0, "%s: build the graph: %s", m->spec.name, err.msg);
        pipeline_free(&p);
        return 0;
    }
    m->g = p.g;
    m->pl = p.pl;
    precision_plan_free(&p.prec);
    g_rng = 0x9e3779b97f4a7c15ull;
    m->w = gpu_check_random_params(&m->pl, prec, uniform);
    return 1;
}

static void model_free(Model *m)
{
    for (int q = 0; q < m->pl.n; q++)
        if (m->pl.p[q].tied_to < 0) free(m->w[q]);
    free(m->w);
    params_free(&m->pl);
    ir_free(&m->g);
}

static int count_packed(const IrGraph *g)
{
    int n = 0;
    for (int i = 0; i < g->n; i++)
        n += (g->nodes[i].op == IR_OP_ATTENTION || g->nodes[i].op == IR_OP_ATTENTION_BWD) && g->nodes[i].attr.attn.packed;
    return n;
}

/* Row r has a random length in [L/2, L]; row `empty` (if >= 0) is all padding. */
static Batch *make_batch(const ModelSpec *s, int64_t B, int64_t L, int64_t empty)
{
    g_rng = 0x1234567ull + (uint64_t)(B * 1000 + L);
    Batch *b = batch_new(B, L, 0);
    for (int64_t r = 0; r < B; r++) {
        int64_t len = r == empty ? 0 : L / 2 + (int64_t)(rnd() % (uint32_t)(L / 2 + 1));
        for (int64_t t = 0; t < L; t++) {
            int64_t i = r * L + t;
            bool real = t < len;
            b->input_ids[i] = real ? (int32_t)(1 + rnd() % (uint32_t)(s->stack.vocab_size - 1)) : 0;
            b->token_type_ids[i] = 0;
            b->attention_mask[i] = real;
        }
        b->labels[r] = (int32_t)(rnd() % (uint32_t)s->head.num_labels);
    }
    return b;
}

static float *read_gpu(CudaExec *ex, int v, int64_t n)
{
    HpcError err = {0};
    float *x = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    if (cuda_exec_read(ex, v, x, &err)) {
        result(0, "read value %d: %s", v, err.msg);
        for (int64_t i = 0; i < n; i++) x[i] = NAN;
    }
    return x;
}

/* lse: finite entries by relative L2, +inf at the same places. */
static double lse_err(const float *gpu, const float *cpu, int64_t n, int *inf_mismatch, int *n_inf)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        bool ci = isinf(cpu[i]) && cpu[i] > 0, gi = isinf(gpu[i]) && gpu[i] > 0;
        *n_inf += ci;
        if (ci || gi) {
            *inf_mismatch += ci != gi;
            continue;
        }
        double e = (double)gpu[i] - cpu[i];
        d += e * e;
        r += (double)cpu[i] * cpu[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* Gradients of every parameter: worst ||a - b|| / max(||b||, 1e-3 max ||b||). */
static double worst_grad(const Model *m, float *const *ga, float *const *gb, int *worst_q)
{
    double rmax = 0, worst = 0;
    for (int q = 0; q < m->pl.n; q++) {
        if (!gb[q]) continue;
        double r = 0;
        for (int64_t i = 0; i < params_numel(&m->pl.p[q]); i++) r += (double)gb[q][i] * gb[q][i];
        rmax = fmax(rmax, sqrt(r));
    }
    for (int q = 0; q < m->pl.n; q++) {
        if (!ga[q] || !gb[q]) continue;
        int64_t n = params_numel(&m->pl.p[q]);
        double d = 0, r = 0;
        for (int64_t i = 0; i < n; i++) {
            double e = (double)ga[q][i] - gb[q][i];
            d += e * e;
            r += (double)gb[q][i] * gb[q][i];
        }
        double e = sqrt(d) / fmax(sqrt(r), 1e-3 * rmax);
        if (isnan(e) || e > worst) {
            worst = isnan(e) ? NAN : e;
            *worst_q = q;
            if (isnan(e)) break;
        }
    }
    return worst;
}

/* A packed ATTENTION_BWD (compiler/fuse_qkv.c, HPC_FUSE_QKV=1): it has no
 * dk, dv OUTPUT nodes, and its one output is the (B, L, 3H) gradient of
 * the QKV GEMM; each of its column blocks dq, dk, dv is compared with the
 * cpu's on its own (a block of small norm could hide in the whole). */
static void check_packed_bwd(const IrGraph *g, int id, CpuExec *cx, CudaExec *ex, const char *tag, double tol)
{
    const IrNode *n = &g->nodes[id];
    const IrNode *dctx = &g->nodes[n->in[0]];   /* (B, L, H), or (B, H) for query 0 alone */
    int64_t H = dctx->dims[dctx->rank - 1];
    bool no_extra = ir_output(g, id, 1) < 0 && ir_output(g, id, 2) < 0;
    result(no_extra && n->dims[2] == 3 * H, "%s: %s is packed: one (B, L, %lld) output, no dk/dv outputs", tag,
           n->name, (long long)(3 * H));
    int64_t cnt = cpu_exec_numel(cx, id), rows = cnt / (3 * H);
    float *gg = read_gpu(ex, id, cnt);
    const float *c = cpu_exec_value(cx, id);
    float *a = xmalloc((size_t)(rows * H > 0 ? rows * H : 1) * sizeof *a);
    float *b = xmalloc((size_t)(rows * H > 0 ? rows * H : 1) * sizeof *b);
    static const char *const part[3] = {"dq", "dk", "dv"};
    for (int k = 0; k < 3; k++) {
        for (int64_t r = 0; r < rows; r++) {
            memcpy(a + r * H, gg + r * 3 * H + k * H, (size_t)H * sizeof *a);
            memcpy(b + r * H, c + r * 3 * H + k * H, (size_t)H * sizeof *b);
        }
        double e = gpu_check_rel_l2(a, b, rows * H);
        result(e <= tol, "%s: %s columns %s rel %.3g <= %.0e", tag, n->name, part[k], e, tol);
    }
    free(a);
    free(b);
    free(gg);
}

/* The fused step on the GPU against the cpu backend. */
static void check_vs_cpu(Shape shape, SpecPrecision prec, int64_t B, int64_t L, int64_t empty, double tol)
{
    Model m;
    HpcError err = {0};
    if (!model_build(&m, shape, true, prec, ATTN_FORM_FUSED)) return;
    char tag[160];
    snprintf(tag, sizeof tag, "%s %s B=%lld L=%lld%s", m.spec.name, spec_precision_name(prec), (long long)B,
             (long long)L, empty >= 0 ? " (one row fully masked)" : "");
    int n_attn = ir_count_op(&m.g, IR_OP_ATTENTION, 0);
    result(n_attn == m.spec.stack.layers && ir_count_op(&m.g, IR_OP_ATTENTION_BWD, 0) == n_attn,
           "%s: the graph has %d fused attention nodes (forward and backward)", tag, n_attn);
    /* HPC_FUSE_QKV on: every block of these shapes (H a multiple of 128)
     * is rewritten, so all attention nodes are packed; off: none is */
    int n_packed = count_packed(&m.g), want = fuse_qkv_requested() ? 2 * n_attn : 0;
    result(n_packed == want, "%s: %d of %d attention nodes packed (Q, K, V from one GEMM: %s)", tag, n_packed,
           2 * n_attn, want ? "on" : "off");
    Batch *b = make_batch(&m.spec, B, L, empty);
    CpuExec cx;
    cpu_exec_init(&cx, &m.g, CPU_EXEC_F32);
    for (int q = 0; q < m.pl.n; q++)
        if (m.pl.p[q].tied_to < 0) cpu_exec_bind_param(&cx, q, m.w[q]);
    CudaExec ex;
    /* Every value kept to the end of the step: the per-node checks below
     * read values whose memory the arena would otherwise hand on. */
    HpcStatus st = cuda_exec_init_with(&ex, &g_dev, &m.g, &m.pl, B + 1, L + 5, &(PlanOptions){.keep_all = true},
                                       &err);
    bool inited = st == HPC_OK;
    if (!st) st = cuda_exec_set_params(&ex, m.w, &err);
    if (st) {
        result(0, "%s: init: %s", tag, err.msg);
        if (inited) cuda_exec_free(&ex);
        cpu_exec_free(&cx);
        batch_free(b);
        model_free(&m);
        return;
    }
    CpuRunOptions co = {.training = true, .backward = true, .seed = 99, .step = 7, .loss_scale = 128};
    CudaRunOptions go = {.training = true, .backward = true, .seed = 99, .step = 7, .loss_scale = 128};
    st = cpu_exec_run(&cx, b, &co, &err);
    if (!st) st = cuda_exec_run(&ex, b, &go, &err);
    double gl = NAN;
    if (!st) st = cuda_exec_loss(&ex, &gl, &err);
    if (st) {
        result(0, "%s: run: %s", tag, err.msg);
    } else {
        double cl = cpu_exec_loss(&cx), le = fabs(gl - cl) / fabs(cl);
        result(le <= tol, "%s: loss gpu %.7f cpu %.7f rel %.3g <= %.0e", tag, gl, cl, le, tol);
        for (int id = 0; id < m.g.n; id++) {
            const IrNode *n = &m.g.nodes[id];
            if (n->op != IR_OP_ATTENTION && n->op != IR_OP_ATTENTION_BWD) continue;
            if (n->op == IR_OP_ATTENTION_BWD && n->attr.attn.packed) {
                check_packed_bwd(&m.g, id, &cx, &ex, tag, tol);
                continue;
            }
            for (int k = 0; k < ir_op_info(n->op)->n_outputs; k++) {
                int v = ir_output(&m.g, id, k);
                /* an output the graph does not have (the keep bits where
                 * nothing saves them), or the keep bits themselves, which
                 * are integers and compared with the cpu's by gpu_step */
                if (v < 0 || !ir_dtype_is_float(m.g.nodes[v].dtype)) continue;
                int64_t cnt = cpu_exec_numel(&cx, v);
                float *g = read_gpu(&ex, v, cnt);
                const float *c = cpu_exec_value(&cx, v);
                if (n->op == IR_OP_ATTENTION && k == 1) {
                    int mism = 0, ninf = 0;
                    double e = lse_err(g, c, cnt, &mism, &ninf);
                    result(e <= 1e-3 && mism == 0, "%s: %s rel %.3g <= 1e-3, %d +inf rows, %d mismatched", tag,
                           m.g.nodes[v].name, e, ninf, mism);
                } else {
                    double e = gpu_check_rel_l2(g, c, cnt);
                    result(e <= tol, "%s: %s rel %.3g <= %.0e", tag, m.g.nodes[v].name, e, tol);
                }
                free(g);
            }
        }
        float **ga = xcalloc((size_t)m.pl.n, sizeof *ga), **gb = xcalloc((size_t)m.pl.n, sizeof *gb);
        for (int q = 0; q < m.pl.n; q++) {
            int v = m.g.param_grad[q];
            if (v < 0) continue;
            ga[q] = read_gpu(&ex, v, params_numel(&m.pl.p[q]));
            gb[q] = xmalloc((size_t)params_numel(&m.pl.p[q]) * sizeof(float));
            memcpy(gb[q], cpu_exec_value(&cx, v), (size_t)params_numel(&m.pl.p[q]) * sizeof(float));
        }
        int wq = -1;
        double w = worst_grad(&m, ga, gb, &wq);
        result(w <= tol, "%s: parameter gradients, worst rel %.3g <= %.0e (%s)", tag, w, tol,
               wq >= 0 ? m.pl.p[wq].name : "-");
        for (int q = 0; q < m.pl.n; q++) {
            free(ga[q]);
            free(gb[q]);
        }
        free(ga);
        free(gb);
        /* graph replay at another step: the device reads seed and step */
        double eager = NAN, replay = NAN;
        go.step = 8;
        st = cuda_exec_run(&ex, b, &go, &err);
        if (!st) st = cuda_exec_loss(&ex, &eager, &err);
        go.graph = true;
        for (int i = 0; i < 3 && !st; i++) {
            go.step = i == 2 ? 8 : 5;
            st = cuda_exec_run(&ex, b, &go, &err);
        }
        if (!st) st = cuda_exec_loss(&ex, &replay, &err);
        result(!st && fabs(replay - eager) <= 1e-6 * fabs(eager), "%s: CUDA graph replay at step 8: loss %.7f, "
               "eager %.7f%s%s", tag, replay, eager, st ? ": " : "", st ? err.msg : "");
    }
    cuda_exec_free(&ex);
    cpu_exec_free(&cx);
    batch_free(b);
    model_free(&m);
}

/* Loss and parameter gradients of one GPU step (dropout off); NULL on failure. */
static float **gpu_step(const Model *m, const Batch *b, double *loss)
{
    HpcError err = {0};
    CudaExec ex;
    HpcStatus st = cuda_exec_init(&ex, &g_dev, &m->g, &m->pl, b->B, b->L, &err);
    bool inited = st == HPC_OK;
    if (!st) st = cuda_exec_set_params(&ex, m->w, &err);
    CudaRunOptions o = {.training = false, .backward = true, .seed = 1, .step = 0, .loss_scale = 128};
    if (!st) st = cuda_exec_run(&ex, b, &o, &err);
    if (!st) st = cuda_exec_loss(&ex, loss, &err);
    if (st) {
        result(0, "%s: %s", m->spec.name, err.msg);
        if (inited) cuda_exec_free(&ex);
        return NULL;
    }
    float **g = xcalloc((size_t)m->pl.n, sizeof *g);
    for (int q = 0; q < m->pl.n; q++)
        if (m->g.param_grad[q] >= 0) g[q] = read_gpu(&ex, m->g.param_grad[q], params_numel(&m->pl.p[q]));
    cuda_exec_free(&ex);
    return g;
}

/* Every parameter gradient of ga against gb (two GPU steps of m): the
 * worst relative error within tol, named by `what`. */
static void expect_grads_close(const Model *m, float **ga, float **gb, double tol, const char *what)
{
    int wq = -1;
    double w = worst_grad(m, ga, gb, &wq);
    result(w <= tol, "%s: gradients worst rel %.3g <= %.0e (%s)", what, w, tol, wq >= 0 ? m->pl.p[wq].name : "-");
}

/* gpu_step's gradients (NULL: nothing) freed. */
static void free_grads(const Model *m, float **g)
{
    if (!g) return;
    for (int q = 0; q < m->pl.n; q++) free(g[q]);
    free(g);
}

static void check_fused_vs_unfused(void)
{
    Model fu, un;
    if (!model_build(&fu, M_TINY, false, PREC_FP16, ATTN_FORM_FUSED)) return;
    if (!model_build(&un, M_TINY, false, PREC_FP16, ATTN_FORM_UNFUSED)) {
        model_free(&fu);
        return;
    }
    result(ir_count_op(&fu.g, IR_OP_ATTENTION, 0) == 2 && ir_count_op(&un.g, IR_OP_ATTENTION, 0) == 0,
           "bert_tiny fp16: fused graph has the node, unfused has none");
    Batch *b = make_batch(&fu.spec, 4, 96, -1);
    double lf = NAN, lu = NAN;
    float **gf = gpu_step(&fu, b, &lf), **gu = gpu_step(&un, b, &lu);
    if (gf && gu) {
        double le = fabs(lf - lu) / fabs(lu);
        result(le <= 2e-2, "bert_tiny fp16 B=4 L=96 on the GPU: loss fused %.7f unfused %.7f rel %.3g <= 2e-2", lf,
               lu, le);
        expect_grads_close(&fu, gf, gu, 2e-2, "bert_tiny fp16 B=4 L=96 on the GPU, fused vs unfused");
    }
    free_grads(&fu, gf);
    free_grads(&fu, gu);
    batch_free(b);
    model_free(&fu);
    model_free(&un);
}

/* v5's persistent blocks against v4 on the GPU (v4 is held to the cpu
 * above): bert_tiny fp16 B=67 L=128, 134 (b, head) pairs, so two of the
 * 132 blocks take a second pair from their second buffer.  Against the cpu
 * this many rows of up to 128 keys fail dK at 1e-2 with v4 as with v5
 * (2.1e-2 at L=120 on the emulator: the f16 inputs' error, not the
 * kernels'), while the two kernels, the same products summed in another
 * order, agree far closer. */
static void check_v5_vs_v4(void)
{
    Model m;
    if (!model_build(&m, M_TINY, false, PREC_FP16, ATTN_FORM_FUSED)) return;
    Batch *b = make_batch(&m.spec, 67, 128, -1);
    /* every third row without padding: v5's forward takes its path for
     * blocks that see every key there, the masked path elsewhere */
    for (int64_t r = 0; r < 67; r += 3)
        for (int64_t t = 0; t < 128; t++) {
            b->attention_mask[r * 128 + t] = 1;
            if (b->input_ids[r * 128 + t] == 0)
                b->input_ids[r * 128 + t] = (int32_t)(1 + rnd() % (uint32_t)(m.spec.stack.vocab_size - 1));
        }
    double l5 = NAN, l4 = NAN;
    float **g5 = gpu_step(&m, b, &l5);   /* v5: the caller's setting (unset or v5) */
    const char *was = getenv("HPC_ATTN_KERNELS");
    char *saved = was ? xstrdup(was) : NULL;
    setenv("HPC_ATTN_KERNELS", "v4", 1);
    float **g4 = gpu_step(&m, b, &l4);
    if (saved) setenv("HPC_ATTN_KERNELS", saved, 1);
    else unsetenv("HPC_ATTN_KERNELS");
    free(saved);
    if (g5 && g4) {
        double le = fabs(l5 - l4) / fmax(fabs(l4), 1e-30);
        /* v4's forward (v2's) rounds P to f16 against the running maximum
         * of each 64-key tile, v5's against the row's: the key weights'
         * small gradients differ by 1.5e-3 (emulator, 2026-12-06); the
         * backwards alone agreed to 1e-7 */
        result(le <= 1e-4, "bert_tiny fp16 B=67 L=128 (134 pairs) on the GPU: loss v5 %.7f v4 %.7f rel %.3g <= 1e-4",
               l5, l4, le);
        expect_grads_close(&m, g5, g4, 5e-3, "bert_tiny fp16 B=67 L=128 (134 pairs) on the GPU, v5 vs v4");
    }
    free_grads(&m, g5);
    free_grads(&m, g4);
    batch_free(b);
    model_free(&m);
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* BERT-base fp16 B=32 L=128: median CUDA-graph step time (ms), or -1. */
static double bench_form(AttnForm form, double *arena_mib)
{
    Model m;
    HpcError err = {0};
    const CudaDriver *cu = cuda_driver();
    double med = -1;
    if (!model_build(&m, M_BASE, true, PREC_FP16, form)) return -1;
    Batch *b = make_batch(&m.spec, 32, 128, -1);
    for (int64_t i = 0; i < 32 * 128; i++) b->attention_mask[i] = 1;   /* full rows */
    CudaExec ex;
    HpcStatus st = cuda_exec_init(&ex, &g_dev, &m.g, &m.pl, 32, 128, &err);
    bool inited = st == HPC_OK;
    if (!st) st = cuda_exec_set_params(&ex, m.w, &err);
    if (!st) {
        *arena_mib = ex.plan.arena_bytes / 1048576.0;
        CudaRunOptions ro = {.training = true, .backward = true, .seed = 5, .loss_scale = 1024, .graph = true};
        CUevent e0 = NULL, e1 = NULL;
        float ms[20];
        st = CUDA_CHECK(&err, cu->cuEventCreate(&e0, CU_EVENT_DEFAULT));
        if (!st) st = CUDA_CHECK(&err, cu->cuEventCreate(&e1, CU_EVENT_DEFAULT));
        for (int i = 0; i < 4 && !st; i++) {
            ro.step = (uint32_t)i;
            st = cuda_exec_run(&ex, b, &ro, &err);
        }
        for (int i = 0; i < 20 && !st; i++) {
            ro.step = (uint32_t)(10 + i);
            st = CUDA_CHECK(&err, cu->cuEventRecord(e0, ex.dev->stream));
            if (!st) st = cuda_exec_run(&ex, b, &ro, &err);
            if (!st) st = CUDA_CHECK(&err, cu->cuEventRecord(e1, ex.dev->stream));
            if (!st) st = CUDA_CHECK(&err, cu->cuEventSynchronize(e1));
            if (!st) st = CUDA_CHECK(&err, cu->cuEventElapsedTime(&ms[i], e0, e1));
        }
        if (!st) {
            qsort(ms, 20, sizeof ms[0], cmp_float);
            med = ms[10];
        }
        if (e0) cu->cuEventDestroy(e0);
        if (e1) cu->cuEventDestroy(e1);
    }
    if (inited) cuda_exec_free(&ex);
    if (st) result(0, "bench %s: %s", attention_form_name(form), err.msg);
    batch_free(b);
    model_free(&m);
    return med;
}

int main(int argc, char **argv)
{
    bool check = argc < 2, bench = argc < 2 && !getenv("HPC_GPU_TEST_NO_TIMING");
    for (int i = 1; i < argc; i++) {
        check |= strcmp(argv[i], "check") == 0;
        bench |= strcmp(argv[i], "bench") == 0;
    }
    if (!gpu_check_open_device("gpu_attention_step", &g_dev)) return 4;
    const char *variant = getenv("HPC_ATTN_KERNELS");
    printf("gpu_attention_step on %s (sm_%d), attention kernels %s (HPC_ATTN_KERNELS)\n", g_dev.name, g_dev.arch,
           variant && *variant ? variant : "v5 (default)");
    if (check) {
        check_vs_cpu(M_TINY, PREC_FP16, 3, 77, 2, 1e-2);
        check_vs_cpu(M_TINY, PREC_BF16, 4, 128, -1, 4e-2);
        check_vs_cpu(M_TINY, PREC_FP16, 2, 200, -1, 1e-2);   /* past the one-pass backward's 128 rows: the v2 kernels */
        check_vs_cpu(M_GPT2_TINY, PREC_FP16, 2, 50, -1, 1e-2);
        check_vs_cpu(M_GPT2_TINY, PREC_FP16, 2, 100, -1, 1e-2);   /* causal past 64 keys: v5's kernel */
        check_vs_cpu(M_BASE_1L, PREC_FP16, 2, 128, -1, 1e-2);
        check_fused_vs_unfused();
        if (!variant || !*variant || strcmp(variant, "v5") == 0) check_v5_vs_v4();
    }
    if (bench) {
        double af = 0, au = 0;
        double tf = bench_form(ATTN_FORM_FUSED, &af), tu = bench_form(ATTN_FORM_UNFUSED, &au);
        printf("      BERT-base fp16 B=32 L=128 step (CUDA graph, median of 20): fused %.2f ms (arena %.0f MiB), "
               "unfused %.2f ms (arena %.0f MiB)\n", tf, af, tu, au);
        result(tf > 0 && tu > 0, "BERT-base fp16 fused and unfused steps timed");
    }
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
