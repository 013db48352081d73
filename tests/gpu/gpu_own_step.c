/* tests/gpu/gpu_own_step.c — a BERT-base fp16 training step with hpc's own
 * GEMMs in it (the default: HPC_GEMM_OWN and HPC_GEMM_OWN_STORE unset,
 * runtime/cuda/cuda_exec_own.c) against the same step on cuBLASLt
 * (HPC_GEMM_OWN=0), at
 * shapes where the own GEMMs fill an H100 or H200: the FFN's first linear
 * then writes its GELU too, and the second linear's dX GEMM the GELU
 * backward's dU, gelu(u) and the bias gradient's column partials.  The
 * cpu reference of gpu_step is too slow at these sizes (32768 tokens), so
 * the reference here is the GPU's cuBLASLt path; gpu_step checks the
 * default against the cpu at smaller shapes.
 *
 * One graph with random parameters, two executors planned for B=256 L=128
 * (one with the defaults, one with HPC_GEMM_OWN=0), the same batches and
 * dropout seed; at B x L = 32 x 128, 96 x 128 and 256 x 128 (4096, 12288
 * and 32768 rows: the column partials over 16, 32 and 64 rows each,
 * program/act_parts.h) the checks are below.  Through the CUDA emulator
 * (HPC_CUDA_EMU, tools/cuemu; `make test` runs it with HPC_EMU_SM_COUNT=1
 * so that small shapes take the own GEMMs) the model is bert_tiny
 * (hidden 128, FFN 512, 2 layers) at B=8 L=64 instead: the pairing and
 * the kernels' work in the step, at the partials over 16 rows only.
 * With HPC_GEMM_OWN_MIN_TILES set (192 or less) the GPU run also checks
 * B x L = 32 x 32, whose products have 192 tiles.
 * The checks:
 *   - the pairs were taken: the number of GELU nodes and of GELU-backward
 *     nodes whose work the own GEMM did at the last launch (at least one
 *     of each; the pruned last layer's rows are too few);
 *   - the loss: |own - cuBLASLt| / |cuBLASLt| <= 1e-3;
 *   - every parameter gradient: ||own - cuBLASLt||_2 / max(||cuBLASLt||_2,
 *     1e-3 of the largest) <= 1e-2 (the two GEMMs sum in other orders, so
 *     f16 roundings differ by an ulp here and there, 4.9e-4, and that
 *     propagates; a column partial lost or counted twice moves the FFN's
 *     bias gradient by several percent), NaN fails; the three worst and
 *     the FFN bias gradients' worst are printed.
 *
 * Exit 0 when every check passes, 1 on a failure, 4 without an sm_90 GPU
 * (the own GEMMs are Hopper's). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_exec.h"
#include "pipeline.h"
#include "precision.h"
#include "program/ir.h"
#include "program/params.h"
#include "compiler/spec_load.h"
#include "gpu_check.h"
#include "gpu_check_model.h"

static CudaDevice g_dev;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { return (uint32_t)(gpu_check_xorshift(&g_rng) >> 32); }
static float uniform(void) { return gpu_check_uniform24(rnd() >> 8); }

static int64_t g_max_B = 256, g_max_L = 128;

/* An executor for g built with HPC_GEMM_OWN and HPC_GEMM_OWN_STORE as
 * given (NULL: unset), the parameters w bound. */
static int open_exec(CudaExec *ex, const IrGraph *g, const ParamList *pl, float **w, const char *own,
                     const char *store)
{
    HpcError err = {0};
    if (own) setenv("HPC_GEMM_OWN", own, 1);
    else unsetenv("HPC_GEMM_OWN");
    if (store) setenv("HPC_GEMM_OWN_STORE", store, 1);
    else unsetenv("HPC_GEMM_OWN_STORE");
    HpcStatus st = cuda_exec_init(ex, &g_dev, g, pl, g_max_B, g_max_L, &err);
    unsetenv("HPC_GEMM_OWN");
    unsetenv("HPC_GEMM_OWN_STORE");
    if (!st) st = cuda_exec_set_params(ex, w, &err);
    if (st) {
        result(0, "executor with HPC_GEMM_OWN=%s: %s", own ? own : "(unset)", err.msg);
        return 0;
    }
    return 1;
}

/* Nodes of op whose work the own GEMM before them did at the last launch. */
static int computed_by_gemm(const CudaExec *ex, IrOpKind op)
{
    int n = 0;
    for (int i = 0; ex->computed_by_gemm && i < ex->g->n; i++) n += ex->g->nodes[i].op == op && ex->computed_by_gemm[i];
    return n;
}

static int run(CudaExec *ex, const Batch *b, const char *tag)
{
    HpcError err = {0};
    CudaRunOptions o = {.training = true, .backward = true, .seed = 5, .step = 3, .loss_scale = 128};
    if (!cuda_exec_run(ex, b, &o, &err)) return 1;
    result(0, "%s: run: %s", tag, err.msg);
    return 0;
}

/* The gradients of the two executors' last runs, compared as the file's head says. */
static void compare_grads(const IrGraph *g, const ParamList *pl, CudaExec *own, CudaExec *ref, const char *tag)
{
    HpcError err = {0};
    int np = g->n_params, count = 0;
    double *dn = xcalloc((size_t)np, sizeof *dn), *rn = xcalloc((size_t)np, sizeof *rn), rmax = 0;
    for (int q = 0; q < np; q++) {
        int v = g->param_grad[q];
        if (v < 0) continue;
        int64_t n = ir_numel(&g->nodes[v], ref->B, ref->L);
        float *a = xmalloc((size_t)n * sizeof *a), *r = xmalloc((size_t)n * sizeof *r);
        dn[q] = NAN;
        if (!cuda_exec_read(own, v, a, &err) && !cuda_exec_read(ref, v, r, &err)) {
            dn[q] = rn[q] = 0;
            for (int64_t i = 0; i < n; i++) {
                dn[q] += ((double)a[i] - r[i]) * ((double)a[i] - r[i]);
                rn[q] += (double)r[i] * r[i];
            }
            dn[q] = sqrt(dn[q]);
            rn[q] = sqrt(rn[q]);
            rmax = fmax(rmax, rn[q]);
        } else {
            result(0, "%s: read gradient %s: %s", tag, pl->p[q].name, err.msg);
        }
        free(a);
        free(r);
        count++;
    }
    double worst = 0, worst_ffn = 0;
    int top[3] = {-1, -1, -1}, ffn = -1;
    for (int q = 0; q < np; q++) {
        if (g->param_grad[q] < 0) continue;
        double e = dn[q] / fmax(rn[q], 1e-3 * rmax);
        dn[q] = e;
        if (isnan(e)) worst = NAN;
        else if (!isnan(worst) && e > worst) worst = e;
        if (strstr(pl->p[q].name, "intermediate.dense.bias") && (ffn < 0 || isnan(e) || e > worst_ffn)) {
            worst_ffn = e;
            ffn = q;
        }
        for (int k = 0; k < 3; k++)
            if (top[k] < 0 || isnan(e) || e > dn[top[k]]) {
                for (int j = 2; j > k; j--) top[j] = top[j - 1];
                top[k] = q;
                break;
            }
    }
    result(worst <= 1e-2, "%s: %d parameter gradients, own GEMMs against cuBLASLt: worst rel L2 %.3g <= 1e-2", tag,
           count, worst);
    for (int k = 0; k < 3 && top[k] >= 0; k++) printf("        %.3g  %s\n", dn[top[k]], pl->p[top[k]].name);
    if (ffn >= 0) printf("        %.3g  %s (the FFN bias gradients' worst)\n", worst_ffn, pl->p[ffn].name);
    free(dn);
    free(rn);
}

static void check_shape(const ModelSpec *spec, const IrGraph *g, const ParamList *pl, CudaExec *own, CudaExec *ref,
                        int64_t B, int64_t L)
{
    char tag[96];
    snprintf(tag, sizeof tag, "%s fp16 B=%lld L=%lld", spec->name, (long long)B, (long long)L);
    Batch *b = gpu_check_random_batch(spec, B, L, true, rnd);
    if (run(ref, b, tag) && run(own, b, tag)) {
        int fwd = computed_by_gemm(own, IR_OP_ACT), bwd = computed_by_gemm(own, IR_OP_ACT_BWD_BGRAD);
        result(fwd > 0 && bwd > 0, "%s: the own GEMM did %d GELU nodes and %d GELU-backward nodes", tag, fwd, bwd);
        HpcError err = {0};
        double lo, lr;
        if (cuda_exec_loss(own, &lo, &err) || cuda_exec_loss(ref, &lr, &err)) {
            result(0, "%s: loss: %s", tag, err.msg);
        } else {
            double e = fabs(lo - lr) / fmax(fabs(lr), 1e-30);
            result(e <= 1e-3, "%s: loss own %.6f cuBLASLt %.6f rel error %.3g <= 1e-3", tag, lo, lr, e);
        }
        compare_grads(g, pl, own, ref, tag);
    }
    batch_free(b);
}

int main(void)
{
    gpu_check_flush = 1;
    if (!gpu_check_open_sm90("gpu_own_step", "hpc's own GEMMs (wgmma)", &g_dev)) return 4;
    ModelSpec spec;
    HpcError err = {0};
    if (!gpu_check_load_model("bert_base.model", &spec)) return gpu_check_summary();
    const bool emulated = getenv("HPC_CUDA_EMU") != NULL;
    snprintf(spec.name, sizeof spec.name, "bert_base");
    if (emulated) {   /* BERT-base at 32768 rows is hours on a CPU */
        snprintf(spec.name, sizeof spec.name, "bert_tiny");
        spec.stack.hidden = 128;
        spec.stack.layers = 2;
        spec.stack.heads = 2;
        spec.stack.ffn = 512;
        g_max_B = 8;
        g_max_L = 64;
    }
    PipeOptions po = pipeline_defaults(PREC_FP16);
    Pipeline p;
    if (pipeline_build(&spec, &po, &p, &err)) {
        result(0, "bert_base fp16: build the graph: %s", err.msg);
        return gpu_check_summary();
    }
    float **w = gpu_check_random_params(&p.pl, PREC_FP16, uniform);
    CudaExec own, ref;
    if (open_exec(&ref, &p.g, &p.pl, w, "0", NULL)) {
        if (open_exec(&own, &p.g, &p.pl, w, NULL, NULL)) {
            if (emulated) {
                check_shape(&spec, &p.g, &p.pl, &own, &ref, 8, 64);
            } else {
                check_shape(&spec, &p.g, &p.pl, &own, &ref, 32, 128);
                check_shape(&spec, &p.g, &p.pl, &own, &ref, 96, 128);
                check_shape(&spec, &p.g, &p.pl, &own, &ref, 256, 128);
                /* below a tile a warpgroup only where HPC_GEMM_OWN_MIN_TILES lets it (192 tiles) */
                if (getenv("HPC_GEMM_OWN_MIN_TILES")) check_shape(&spec, &p.g, &p.pl, &own, &ref, 32, 32);
            }
            cuda_exec_free(&own);
        }
        cuda_exec_free(&ref);
    }
    gpu_check_free_params(&p.pl, w);
    pipeline_free(&p);
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
