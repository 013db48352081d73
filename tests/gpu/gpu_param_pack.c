/* tests/gpu/gpu_param_pack.c — the packed parameter layout on the device
 * (program/param_pack.h, runtime/cuda/cuda_exec.c alloc_params).
 *
 * A bert_tiny-shaped classifier (hidden 128, so the 16-bit biases are 256
 * bytes and group too; 2 layers) under fp32, fp16 and bf16: the cuda
 * executor's storage of each layer's query, key and value weights, and of
 * its three biases, is back to back in the f32 masters and in the 16-bit
 * copies (cuda_exec_param_ptr); after cuda_exec_set_params every master
 * reads back bit-equal to what was uploaded and every 16-bit copy equals
 * the host rounding of it (no tensor overwrote another); and the three
 * weights read in one copy from the query's pointer are Wq, Wk, Wv stacked
 * (3H, H), as one QKV GEMM will read them.  The training step itself is
 * checked against the cpu backend by gpu_step, gpu_accum and the others,
 * which run on this layout too.  Each case runs twice: the three
 * projections apart and as one GEMM (compiler/fuse_qkv.c, whatever
 * HPC_FUSE_QKV says); fused, the stacks are views of the parameters and
 * the unstacked gradients views of the stacked ones (check_views), and a
 * stack of parameters out of layout order is refused at bind time.  Under
 * fp32 the attention stays the unfused chain, so the rewrite finds nothing
 * and the check is that nothing is stacked.
 *
 * Exit 0 when every check passes, 1 on a failed check, 4 without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/half.h"
#include "cuda/cuda_driver.h"
#include "cuda/cuda_exec.h"
#include "data/batch.h"
#include "pipeline.h"
#include "program/ir.h"
#include "program/params.h"
#include "program/spec.h"
#include "gpu_check.h"
#include "gpu_check_model.h"

static CudaDevice g_dev;
static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) { return (uint32_t)(gpu_check_xorshift(&g_rng) >> 32); }
static float uniform(void) { return gpu_check_uniform24(rnd() >> 8); }

static void tiny_spec(ModelSpec *s)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "bert_tiny classifier");
    s->stack.hidden = 128;
    s->stack.layers = 2;
    s->stack.heads = 2;
    s->stack.ffn = 512;
}

static uint16_t low_bits(DType dt, float x) { return dt == DT_BF16 ? bf16_from_f32(x) : half_from_f32(x); }

/* Device bytes at p into a fresh host buffer (NULL on failure). */
static void *read_back(CUdeviceptr p, size_t bytes)
{
    void *h = xmalloc(bytes);
    if (!p || cuda_driver()->cuMemcpyDtoH(h, p, bytes) != CUDA_SUCCESS) {
        free(h);
        return NULL;
    }
    return h;
}

/* Layer i's query, key, value LEAF: adjacent in dtype dt, and (weights)
 * the stacked read equals the three tensors. */
static void check_layer(const CudaExec *ex, const ParamList *pl, float **w, DType dt, int layer, const char *leaf,
                        const char *tag)
{
    static const char *role[3] = {"query", "key", "value"};
    int q[3];
    CUdeviceptr p[3];
    for (int k = 0; k < 3; k++) {
        char name[PARAM_NAME_MAX];
        snprintf(name, sizeof name, "bert.encoder.layer.%d.attention.self.%s.%s", layer, role[k], leaf);
        q[k] = params_find(pl, name);
        p[k] = q[k] >= 0 ? cuda_exec_param_ptr(ex, q[k], dt) : 0;
        if (!p[k]) {
            result(0, "%s: %s has no %s storage", tag, name, ir_dtype_name(dt));
            return;
        }
    }
    size_t es = dt == DT_F32 ? 4 : 2, n = (size_t)params_numel(&pl->p[q[0]]);
    bool adjacent = p[1] == p[0] + n * es && p[2] == p[1] + n * es;
    result(adjacent, "%s: layer %d %s %s: query, key, value back to back", tag, layer, ir_dtype_name(dt), leaf);
    if (!adjacent) return;
    unsigned char *h = read_back(p[0], 3 * n * es);
    size_t bad = h ? 0 : 3 * n;
    for (int k = 0; k < 3 && h; k++)
        for (size_t i = 0; i < n; i++) {
            float x = w[q[k]][i];
            if (dt == DT_F32) bad += memcmp(h + (k * n + i) * 4, &x, 4) != 0;
            else {
                uint16_t got;
                memcpy(&got, h + (k * n + i) * 2, 2);
                bad += got != low_bits(dt, x);
            }
        }
    result(bad == 0, "%s: layer %d %s %s read as one (3 x %zu): %zu elements differ", tag, layer, ir_dtype_name(dt),
           leaf, n, bad);
    free(h);
}

/* Q, K and V from one GEMM (compiler/fuse_qkv.c): each STACK is a view
 * of its first parameter (no copy: the pointer is the query's) and each
 * UNSTACK part a view k parts into the stacked gradient (program/plan.h);
 * `sites` blocks were rewritten, so 2 stacks and 6 parts per site. */
static void check_views(const CudaExec *ex, const IrGraph *g, int sites, const char *tag)
{
    int stacks = 0, parts = 0, bad = 0;
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = &g->nodes[i];
        if (n->op == IR_OP_STACK) {
            stacks++;
            bad += ex->plan.v[i].kind != PLAN_VIEW || cuda_exec_ptr(ex, i) != cuda_exec_ptr(ex, n->in[0]);
        }
        int u = n->op == IR_OP_OUTPUT ? n->in[0] : i;
        if (g->nodes[u].op != IR_OP_UNSTACK) continue;
        int k = n->op == IR_OP_OUTPUT ? n->attr.output.index : 0;
        size_t part = (size_t)ir_numel(n, 1, 1) * 4;
        parts++;
        bad += ex->plan.v[i].kind != PLAN_VIEW ||
               cuda_exec_ptr(ex, i) != cuda_exec_ptr(ex, g->nodes[u].in[0]) + (CUdeviceptr)(k * part);
    }
    result(stacks == 2 * sites && parts == 6 * sites && bad == 0, "%s: %d stacks read the parameters in place, "
           "%d gradient parts lie inside the stacked gradients (%d wrong; %d blocks rewritten)", tag, stacks, parts,
           bad, sites);
}

/* A STACK whose parameters are not in layout order (key before query)
 * is refused at bind time, not read across the wrong bytes. */
static void check_view_refused(Pipeline *P, const char *tag)
{
    IrGraph *g = &P->g;
    int stack = -1;
    for (int i = 0; i < g->n && stack < 0; i++)
        if (g->nodes[i].op == IR_OP_STACK) stack = i;
    if (stack < 0) {
        result(0, "%s: no STACK node to reorder", tag);
        return;
    }
    int *in = g->nodes[stack].in, t = in[0];
    in[0] = in[1];
    in[1] = t;
    CudaExec ex;
    HpcError err = {0};
    HpcStatus st = cuda_exec_init(&ex, &g_dev, g, &P->pl, 2, 16, &err);
    if (!st) cuda_exec_free(&ex);
    in[1] = in[0];
    in[0] = t;
    result(st && strstr(err.msg, "back to back"), "%s: a stack of key, query, value is refused at bind time (%s)",
           tag, st ? err.msg : "accepted");
}

static void run_case(SpecPrecision prec, bool fuse_qkv)
{
    ModelSpec s;
    tiny_spec(&s);
    char tag[48];
    snprintf(tag, sizeof tag, "%s%s", spec_precision_name(prec), fuse_qkv ? " qkv fused" : "");
    PipeOptions po = pipeline_defaults(prec);
    po.fuse_qkv = fuse_qkv;
    Pipeline P;
    HpcError err = {0};
    if (pipeline_build(&s, &po, &P, &err)) {
        result(0, "%s: pipeline_build: %s", tag, err.msg);
        return;
    }
    DType low = prec == PREC_BF16 ? DT_BF16 : DT_F16;
    float **w = gpu_check_random_params(&P.pl, prec, uniform);
    CudaExec ex;
    HpcStatus st = cuda_exec_init(&ex, &g_dev, &P.g, &P.pl, 2, 16, &err);
    if (!st) st = cuda_exec_set_params(&ex, w, &err);
    if (!st) {
        size_t bad_master = 0, bad_low = 0;
        for (int q = 0; q < P.pl.n; q++) {
            if (P.pl.p[q].tied_to >= 0) continue;
            size_t n = (size_t)params_numel(&P.pl.p[q]);
            float *m = read_back(cuda_exec_param_ptr(&ex, q, DT_F32), n * 4);
            bad_master += !m || memcmp(m, w[q], n * 4) != 0;
            free(m);
            CUdeviceptr lp = prec == PREC_FP32 ? 0 : cuda_exec_param_ptr(&ex, q, low);
            if (!lp) continue;
            uint16_t *l = read_back(lp, n * 2);
            for (size_t i = 0; l && i < n && bad_low == 0; i++) bad_low += l[i] != low_bits(low, w[q][i]);
            if (!l) bad_low++;
            free(l);
        }
        result(bad_master == 0, "%s: every master reads back as uploaded (%zu differ)", tag, bad_master);
        result(bad_low == 0, "%s: every 16-bit copy is the host rounding (%zu differ)", tag, bad_low);
        for (int layer = 0; layer < s.stack.layers; layer++)
            for (int f = 0; f < (prec == PREC_FP32 ? 1 : 2); f++) {
                check_layer(&ex, &P.pl, w, f ? low : DT_F32, layer, "weight", tag);
                check_layer(&ex, &P.pl, w, f ? low : DT_F32, layer, "bias", tag);
            }
        if (fuse_qkv) {
            /* fp32 keeps the unfused attention chain (compiler/attention_form.h):
             * no ATTENTION node, so nothing is stacked; 16-bit: every block */
            int want = prec == PREC_FP32 ? 0 : (int)s.stack.layers;
            result(P.qkv_sites == want, "%s: %d of %lld attention blocks as one QKV GEMM (want %d)", tag,
                   P.qkv_sites, (long long)s.stack.layers, want);
            check_views(&ex, &P.g, want, tag);
        }
        cuda_exec_free(&ex);
        if (fuse_qkv && prec != PREC_FP32) check_view_refused(&P, tag);
    }
    if (st) result(0, "%s: %s", tag, err.msg);
    gpu_check_free_params(&P.pl, w);
    pipeline_free(&P);
}

int main(void)
{
    if (!gpu_check_open_device("gpu_param_pack", &g_dev)) return 4;
    printf("gpu_param_pack on %s (sm_%d)\n", g_dev.name, g_dev.arch);
    for (int f = 0; f < 2; f++) {
        run_case(PREC_FP32, f);
        run_case(PREC_FP16, f);
        run_case(PREC_BF16, f);
    }
    return gpu_check_summary();
}
