/* tests/gpu/gpu_pack.c — a packed training step (docs/packing.md) on the
 * GPU against the cpu backend: the varlen attention phases of
 * compiler/emit_ops_attention.c, the span kernels of compiler/emit_ops_body.c
 * and the seq_spans upload, on the same weights, packed batch, dropout seed
 * and step (dropout on: hidden 0.1, attention 0.1).
 *
 * With HPC_FUSE_QKV=1
 * the attention nodes are packed QKV (the check is the same: loss, ctx,
 * gradients).  HPC_ATTN_KERNELS=v1|v2|v3|v4 picks the kernel family (v4 the default).
 *
 * Checks, per case (tiny BERT fp16 and bf16, a tiny causal stack fp16 with a
 * sequence head (last token), a one-layer BERT-base-shaped fp16 stack):
 *   - the loss; every parameter gradient (relative L2, floor 1e-3 of the
 *     largest gradient norm, as tests/gpu/gpu_attention_step.c);
 *   - per forward attention node: ctx (relative L2), its tail rows exactly 0,
 *     lse over the spans' blocks (the tail's entries are not written); the
 *     last layer of the sequence heads attends from each span's first slot
 *     alone (first_query: ctx (B, H) and lse (B, heads, 1) compared whole),
 *     so the tiny fp16 and the BERT-base-shaped cases run again with
 *     HPC_LAST_LAYER=all for that layer's full varlen attention;
 *   - span_positions exactly equal.
 * The packed batch has rows of lengths 1, 200 (above the one-pass
 * backward's 128: the dQ and dK/dV tiles run), a full batch's worth of
 * random ones, and a tail.  Tolerances: fp16 1e-2, bf16 4e-2.
 * Exit 0 when every check passes, 1 on a failure, 4 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_exec.h"
#include "cpu/half.h"
#include "cuda/cuda_driver.h"
#include "cuda/cuda_exec.h"
#include "data/batch.h"
#include "data/loader.h"
#include "program/ir.h"
#include "program/params.h"
#include "pipeline.h"
#include "precision.h"
#include "program/spec.h"
#include "gpu_check.h"
#include "gpu_check_model.h"

static CudaDevice g_dev;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { return (uint32_t)(gpu_check_xorshift(&g_rng) >> 16); }
static float uniform(void) { return gpu_check_uniform24(rnd() >> 8); }

typedef enum { C_TINY, C_CAUSAL, C_BASE_1L } Case;

static void make_spec(ModelSpec *s, Case c)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "%s", c == C_TINY ? "pack_tiny" : c == C_CAUSAL ? "pack_causal" : "pack_base1");
    s->stack.vocab_size = 500;
    s->stack.max_positions = 512;
    s->stack.hidden = c == C_BASE_1L ? 768 : 128;
    s->stack.heads = c == C_BASE_1L ? 12 : 2;
    s->stack.layers = c == C_BASE_1L ? 1 : 2;
    s->stack.ffn = 4 * s->stack.hidden;
    s->stack.hidden_dropout = 0.1;
    s->stack.attention_dropout = 0.1;
    if (c == C_CAUSAL) {
        s->stack.kind = STACK_DECODER;
        s->stack.attention = ATTN_CAUSAL;
        s->stack.norm = NORM_PRE;
        s->stack.embedding_ln = false;
        s->stack.final_ln = true;
        s->stack.type_vocab_size = 0;
        s->head.pooler = false;
    }
    s->head.num_labels = 3;
    s->train.batch_size = 8;
    s->train.max_seq_len = 256;
    s->train.pack = true;
}

/* Eight rows: lengths 1, 200, then random in [2, 60]; one packed batch. */
static Batch *packed_batch(const ModelSpec *s)
{
    Dataset d;
    dataset_init(&d, "gpu_pack");
    HpcError err = {0};
    g_rng = 0x5eed;
    for (int r = 0; r < 8; r++) {
        int32_t len = r == 0 ? 1 : r == 1 ? 200 : (int32_t)(2 + rnd() % 59), ids[256];
        for (int t = 0; t < len; t++) ids[t] = (int32_t)(1 + rnd() % (uint32_t)(s->stack.vocab_size - 1));
        dataset_add(&d, ids, NULL, len, (int32_t)(rnd() % 3), 0, &err);
    }
    Loader ld;
    Batch *b = NULL;
    if (!loader_init(&ld, &d, 8, 256, 1, false, false, &err)) {
        loader_set_pack(&ld, true);
        b = loader_next(&ld);
        loader_free(&ld);
    }
    dataset_free(&d);
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

/* every_token: HPC_LAST_LAYER=all, the last layer's full varlen attention
 * (by default a sequence head's last layer computes each span's first slot
 * alone: varlen first_query, attn_first_*_vl). */
static void check_case(Case c, SpecPrecision prec, double tol, bool every_token)
{
    ModelSpec s;
    make_spec(&s, c);
    if (every_token) setenv("HPC_LAST_LAYER", "all", 1);
    PipeOptions o = pipeline_defaults(prec);
    unsetenv("HPC_LAST_LAYER");
    Pipeline p;
    HpcError err = {0};
    if (pipeline_build(&s, &o, &p, &err)) {
        result(0, "%s: build: %s", s.name, err.msg);
        pipeline_free(&p);
        return;
    }
    char tag[128];
    snprintf(tag, sizeof tag, "%s %s%s", s.name, spec_precision_name(prec), every_token ? " every token" : "");
    result(ir_graph_packed(&p.g), "%s: the graph is packed", tag);
    g_rng = 0x9e3779b97f4a7c15ull;
    float **w = gpu_check_random_params(&p.pl, prec, uniform);
    Batch *b = packed_batch(&s);
    if (!b) {
        result(0, "%s: no packed batch", tag);
        pipeline_free(&p);
        return;
    }
    int64_t end = b->seq_spans[2 * (b->B - 1)] + b->seq_spans[2 * (b->B - 1) + 1];
    printf("      %s: packed batch %lld x %lld, %lld tokens, tail %lld slots\n", tag, (long long)b->B,
           (long long)b->L, (long long)end, (long long)(b->B * b->L - end));
    CpuExec cx;
    cpu_exec_init(&cx, &p.g, CPU_EXEC_F32);
    for (int q = 0; q < p.pl.n; q++)
        if (p.pl.p[q].tied_to < 0) cpu_exec_bind_param(&cx, q, w[q]);
    CudaExec ex;
    HpcStatus st = cuda_exec_init_with(&ex, &g_dev, &p.g, &p.pl, b->B, b->L, &(PlanOptions){.keep_all = true}, &err);
    bool inited = st == HPC_OK;
    if (!st) st = cuda_exec_set_params(&ex, w, &err);
    CpuRunOptions co = {.training = true, .backward = true, .seed = 99, .step = 7, .loss_scale = 128};
    CudaRunOptions go = {.training = true, .backward = true, .seed = 99, .step = 7, .loss_scale = 128};
    if (!st) st = cpu_exec_run(&cx, b, &co, &err);
    if (!st) st = cuda_exec_run(&ex, b, &go, &err);
    double gl = NAN;
    if (!st) st = cuda_exec_loss(&ex, &gl, &err);
    if (st) {
        result(0, "%s: %s", tag, err.msg);
    } else {
        double cl = cpu_exec_loss(&cx), le = fabs(gl - cl) / fabs(cl);
        result(le <= tol, "%s: loss gpu %.7f cpu %.7f rel %.3g <= %.0e", tag, gl, cl, le, tol);
        for (int id = 0; id < p.g.n; id++) {
            const IrNode *n = &p.g.nodes[id];
            if (n->op == IR_OP_SPAN_POSITIONS) {
                int64_t cnt = cpu_exec_numel(&cx, id), bad = 0;
                int32_t *gp = xmalloc((size_t)cnt * sizeof *gp);
                const CudaDriver *cu = cuda_driver();   /* an i32 value: cuda_exec_read takes floats only */
                if (cu->cuStreamSynchronize(g_dev.stream) != CUDA_SUCCESS ||
                    cu->cuMemcpyDtoH(gp, cuda_exec_ptr(&ex, id), (size_t)cnt * sizeof *gp) != CUDA_SUCCESS)
                    bad = cnt;
                const int32_t *cp = cpu_exec_value(&cx, id);
                for (int64_t i = 0; i < cnt && bad < cnt; i++) bad += gp[i] != cp[i];
                result(bad == 0, "%s: position ids, %lld of %lld differ", tag, (long long)bad, (long long)cnt);
                free(gp);
            }
            if (n->op != IR_OP_ATTENTION) continue;
            if (n->attr.attn.first_query) {   /* ctx (B, H), lse (B, heads, 1): every row a sequence's */
                int64_t cnt = cpu_exec_numel(&cx, id), nl = b->B * n->attr.attn.heads;
                float *g = read_gpu(&ex, id, cnt);
                double e = gpu_check_rel_l2(g, cpu_exec_value(&cx, id), cnt);
                result(e <= tol, "%s: %s (each span's first slot) rel %.3g <= %.0e", tag, n->name, e, tol);
                free(g);
                int lo = ir_output(&p.g, id, 1);
                g = read_gpu(&ex, lo, nl);
                e = gpu_check_rel_l2(g, cpu_exec_value(&cx, lo), nl);
                result(e <= 1e-3, "%s: %s lse rel %.3g <= 1e-3", tag, n->name, e);
                free(g);
                continue;
            }
            int64_t H = n->dims[2], NH = n->attr.attn.heads, cnt = cpu_exec_numel(&cx, id);
            float *g = read_gpu(&ex, id, cnt);
            const float *cc = cpu_exec_value(&cx, id);
            double e = gpu_check_rel_l2(g, cc, end * H);
            int64_t nonzero = 0;
            for (int64_t i = end * H; i < cnt; i++) nonzero += g[i] != 0.0f;
            result(e <= tol && nonzero == 0, "%s: %s rel %.3g <= %.0e, %lld nonzero tail values", tag, n->name, e,
                   tol, (long long)nonzero);
            free(g);
            int lo = ir_output(&p.g, id, 1);
            g = read_gpu(&ex, lo, cnt / H * NH);
            e = gpu_check_rel_l2(g, cpu_exec_value(&cx, lo), end * NH);
            result(e <= 1e-3, "%s: %s lse over the spans rel %.3g <= 1e-3", tag, n->name, e);
            free(g);
        }
        double rmax = gpu_check_max_grad_norm(&p.g, &cx), worst = 0;
        const char *wn = "-";
        for (int q = 0; q < p.pl.n; q++) {
            int v = p.g.param_grad[q];
            if (v < 0) continue;
            int64_t cnt = params_numel(&p.pl.p[q]);
            float *g = read_gpu(&ex, v, cnt);
            double e = gpu_check_rel_l2_floor(g, cpu_exec_value(&cx, v), cnt, 1e-3 * rmax);
            if (isnan(e) || e > worst) {
                worst = isnan(e) ? INFINITY : e;
                wn = p.pl.p[q].name;
            }
            free(g);
        }
        result(worst <= tol, "%s: parameter gradients, worst rel %.3g <= %.0e (%s)", tag, worst, tol, wn);
    }
    if (inited) cuda_exec_free(&ex);
    cpu_exec_free(&cx);
    batch_free(b);
    gpu_check_free_params(&p.pl, w);
    pipeline_free(&p);
}

int main(void)
{
    if (!gpu_check_open_device("gpu_pack", &g_dev)) return 4;
    printf("gpu_pack on %s (sm_%d)\n", g_dev.name, g_dev.arch);
    check_case(C_TINY, PREC_FP16, 1e-2, false);
    check_case(C_TINY, PREC_BF16, 4e-2, false);
    check_case(C_CAUSAL, PREC_FP16, 1e-2, false);
    check_case(C_BASE_1L, PREC_FP16, 1e-2, false);
    check_case(C_TINY, PREC_FP16, 1e-2, true);
    check_case(C_BASE_1L, PREC_FP16, 1e-2, true);
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
