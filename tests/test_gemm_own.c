/* tests/test_gemm_own.c — HPC_GEMM_OWN's wiring, without a GPU: the
 * emitter appends hpc's own GEMM (compiler/kernels/gemm_wgmma_tma.cu and
 * gemm_wgmma_pp.cu) to the step module with its mark lines by default
 * where an f16 linear feeds a GELU (as HPC_GEMM_OWN=gelu), to no other
 * module unless HPC_GEMM_OWN=1 asks, and to none under HPC_GEMM_OWN=0;
 * refuses other values (of HPC_GEMM_OWN_STORE too, whose default is the
 * ping-pong kernels), and the module then compiles for sm_90a with the kernel in the
 * cubin; gemm_own_fits takes exactly the linear forwards the kernel
 * computes and gemm_own_fills the shapes big enough for it;
 * PlanOptions.write_early keeps a paired GELU output off its
 * LINEAR's input.  (The kernel's numbers: tests/gpu/gpu_gemm.c and gpu_step with
 * HPC_GEMM_OWN=1, on a GPU or through tools/cuemu.) */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/gemm_own.h"
#include "cuda/nvrtc_compile.h"
#include "program/plan.h"
#include "emit_ops.h"
#include "pipeline.h"
#include "compiler/spec_load.h"

/* bert_tiny's graph with `layers` layers (0: the model's) under prec. */
static void tiny_graph(Pipeline *p, int layers, SpecPrecision prec)
{
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/models/bert_tiny.model", root ? root : ".");
    ModelSpec spec;
    cr_assert_eq(spec_load(path, &spec, stderr), 0, "cannot load %s", path);
    if (layers) spec.stack.layers = layers;
    PipeOptions o = pipeline_defaults(prec);
    HpcError err = {0};
    cr_assert_eq(pipeline_build(&spec, &o, p, &err), HPC_OK, "%s", err.msg);
}

static void tiny_fp16(Pipeline *p, int layers) { tiny_graph(p, layers, PREC_FP16); }

/* bert_tiny under prec, one layer: the step module's source under
 * HPC_GEMM_OWN=value (NULL: unset). */
static HpcStatus module_of(SpecPrecision prec, const char *value, char **src, HpcError *err)
{
    Pipeline p;
    tiny_graph(&p, 1, prec);
    if (value) setenv("HPC_GEMM_OWN", value, 1);
    else unsetenv("HPC_GEMM_OWN");
    HpcStatus st = eop_module_source(&p.g, src, err);
    unsetenv("HPC_GEMM_OWN");
    pipeline_free(&p);
    return st;
}

static HpcStatus module_with(const char *value, char **src, HpcError *err)
{
    return module_of(PREC_FP16, value, src, err);
}

Test(gemm_own, appended_where_a_gelu_follows, .timeout = 120)
{
    HpcError err = {0};
    char *dflt = NULL, *gelu = NULL, *off = NULL, *own = NULL;
    cr_assert_eq(module_with(NULL, &dflt, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(module_with("gelu", &gelu, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(module_with("0", &off, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(module_with("1", &own, &err), HPC_OK, "%s", err.msg);
    cr_expect(gemm_own_in_source(dflt) && gemm_own_gelu_only(dflt), "unset: the kernels, marked for the GELU linears");
    cr_expect(strstr(dflt, GEMM_OWN_PP_GELU_KERNEL) != NULL);
    cr_expect_str_eq(dflt, gelu, "unset is HPC_GEMM_OWN=gelu, byte for byte");
    cr_expect(!gemm_own_in_source(off), "HPC_GEMM_OWN=0: cuBLASLt for every GEMM");
    cr_expect(strncmp(dflt, off, strlen(off)) == 0, "the module without them comes first, unchanged");
    cr_expect(gemm_own_in_source(own) && !gemm_own_gelu_only(own),
              "HPC_GEMM_OWN=1: every linear forward the kernel fits");
    cr_expect(strstr(own, GEMM_OWN_KERNEL) != NULL);
    free(dflt);
    free(gelu);
    free(off);
    free(own);
    char *bad = NULL;
    cr_expect_eq(module_with("yes", &bad, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "HPC_GEMM_OWN=yes") != NULL, "%s", err.msg);
    free(bad);
}

/* fp32 has no f16 linear: unset, its module is the one HPC_GEMM_OWN=0 gives. */
Test(gemm_own, not_appended_without_an_f16_linear_gelu, .timeout = 120)
{
    HpcError err = {0};
    char *dflt = NULL, *off = NULL;
    cr_assert_eq(module_of(PREC_FP32, NULL, &dflt, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(module_of(PREC_FP32, "0", &off, &err), HPC_OK, "%s", err.msg);
    cr_expect(!gemm_own_in_source(dflt));
    cr_expect_str_eq(dflt, off);
    free(dflt);
    free(off);
}

Test(gemm_own, module_compiles_for_sm90a, .timeout = 300)
{
    HpcError err = {0};
    char *own = NULL;
    cr_assert_eq(module_with("1", &own, &err), HPC_OK, "%s", err.msg);
    const char *opts[] = {"--gpu-architecture=sm_90a"};
    void *cubin = NULL;
    size_t size = 0;
    char *log = NULL;
    /* one thread: with --split-compile ptxas's notes go to stderr, not
     * the program's log, and the check below reads the log */
    setenv("HPC_NVRTC_SPLIT", "1", 1);
    HpcStatus st = nvrtc_compile(own, "hpc_step_own", 90, opts, 1, &cubin, &size, &log, &err);
    unsetenv("HPC_NVRTC_SPLIT");
    cr_assert_eq(st, HPC_OK, "%s\n%s", err.msg, log ? log : "");
    /* ptxas may run a kernel's wgmma one at a time, each waiting for the
     * last, and only says so in a note (C7515 and kin: "wgmma.mma_async
     * instructions are serialized due to ..."); the kernel is then still
     * right, only slow (the ping-pong GEMMs 14-47 % slower on an H100,
     * thirty-third session).  Local nvcc did not report what NVRTC did for
     * the same source, so the check is on NVRTC's log. */
    const char *serial = log ? strstr(log, "are serialized") : NULL, *line = serial;
    while (line && line > log && line[-1] != '\n') line--;   /* the note's whole line */
    cr_expect(serial == NULL, "NVRTC serializes wgmma in the step module: %.300s", line ? line : "");
    cr_expect(memmem(cubin, size, GEMM_OWN_KERNEL, strlen(GEMM_OWN_KERNEL)) != NULL);
    cr_expect(memmem(cubin, size, GEMM_OWN_TS_GELU_KERNEL, strlen(GEMM_OWN_TS_GELU_KERNEL)) != NULL);
    cr_expect(memmem(cubin, size, GEMM_OWN_PP_GELU_KERNEL, strlen(GEMM_OWN_PP_GELU_KERNEL)) != NULL);
    free(cubin);
    free(log);
    free(own);
}

/* HPC_GEMM_OWN_STORE: the ping-pong kernels unless `tma` or `direct`;
 * anything else refused.  Each way names its own kernels. */
Test(gemm_own, store_setting)
{
    HpcError err = {0};
    GemmOwnStore store = GEMM_OWN_DIRECT;
    unsetenv("HPC_GEMM_OWN_STORE");
    cr_expect_eq(gemm_own_store(&store, &err), HPC_OK);
    cr_expect_eq(store, GEMM_OWN_PINGPONG, "unset: the ping-pong kernels");
    setenv("HPC_GEMM_OWN_STORE", "direct", 1);
    cr_expect_eq(gemm_own_store(&store, &err), HPC_OK);
    cr_expect_eq(store, GEMM_OWN_DIRECT);
    setenv("HPC_GEMM_OWN_STORE", "tma", 1);
    cr_expect_eq(gemm_own_store(&store, &err), HPC_OK);
    cr_expect_eq(store, GEMM_OWN_TMA_STORE);
    setenv("HPC_GEMM_OWN_STORE", "pingpong", 1);
    cr_expect_eq(gemm_own_store(&store, &err), HPC_OK);
    cr_expect_eq(store, GEMM_OWN_PINGPONG);
    setenv("HPC_GEMM_OWN_STORE", "fast", 1);
    cr_expect_eq(gemm_own_store(&store, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "HPC_GEMM_OWN_STORE=fast") != NULL, "%s", err.msg);
    unsetenv("HPC_GEMM_OWN_STORE");
    cr_expect_str_eq(gemm_own_kernel_name(GEMM_OWN_DIRECT, true), GEMM_OWN_GELU_KERNEL);
    cr_expect_str_eq(gemm_own_kernel_name(GEMM_OWN_TMA_STORE, false), GEMM_OWN_TS_KERNEL);
    cr_expect_str_eq(gemm_own_kernel_name(GEMM_OWN_PINGPONG, false), GEMM_OWN_PP_KERNEL);
    cr_expect_str_eq(gemm_own_kernel_name(GEMM_OWN_PINGPONG, true), GEMM_OWN_PP_GELU_KERNEL);
}

Test(gemm_own, fits_the_linear_forwards_it_computes)
{
    GemmDesc d;
    CUdeviceptr x = 0x1000, w = 0x2000, b = 0x3000, y = 0x4000;
    gemm_desc_linear(&d, GEMM_F16, GEMM_F16, 4096, 3072, 768, x, w, b, y);
    cr_expect(gemm_own_fits(&d), "BERT-base's FFN-up");
    gemm_desc_linear(&d, GEMM_F16, GEMM_F16, 1000, 2304, 768, x, w, b, y);
    cr_expect(gemm_own_fits(&d), "any number of rows");
    gemm_desc_linear(&d, GEMM_F16, GEMM_F16, 32, 2, 768, x, w, b, y);
    cr_expect(!gemm_own_fits(&d), "a classifier's 2 outputs: not a multiple of 256");
    gemm_desc_linear(&d, GEMM_F16, GEMM_F16, 4096, 768, 100, x, w, b, y);
    cr_expect(!gemm_own_fits(&d), "K not a multiple of 64");
    gemm_desc_linear(&d, GEMM_F16, GEMM_F16, 4096, 768, 768, x, w, 0, y);
    cr_expect(!gemm_own_fits(&d), "no bias: the kernel always adds one");
    gemm_desc_linear(&d, GEMM_F32, GEMM_F32, 4096, 768, 768, x, w, b, y);
    cr_expect(!gemm_own_fits(&d), "f32");
    gemm_desc_linear(&d, GEMM_BF16, GEMM_BF16, 4096, 768, 768, x, w, b, y);
    cr_expect(!gemm_own_fits(&d), "bf16 (the kernel is f16)");
    gemm_desc_rm(&d, GEMM_F16, GEMM_F16, 4096, 768, 3072, x, w, y);
    cr_expect(!gemm_own_fits(&d), "a dX GEMM (W not transposed)");
}

/* The step takes the kernel only where its tiles fill the GPU once. */
Test(gemm_own, fills_only_with_a_tile_for_every_sm)
{
    GemmDesc d;
    CUdeviceptr x = 0x1000, w = 0x2000, b = 0x3000, y = 0x4000;
    const GemmOwnKernel wide = {NULL, GEMM_OWN_TMA_STORE, 0}, pingpong = {NULL, GEMM_OWN_PINGPONG, 0};
    gemm_desc_linear(&d, GEMM_F16, GEMM_F16, 4096, 3072, 768, x, w, b, y);   /* 32 x 12 tiles */
    cr_expect(gemm_own_fills(&wide, &d, 132), "384 tiles on 132 SMs");
    gemm_desc_linear(&d, GEMM_F16, GEMM_F16, 4096, 768, 768, x, w, b, y);    /* 32 x 3 */
    cr_expect(!gemm_own_fills(&wide, &d, 132), "96 tiles on 132 SMs");
    cr_expect(gemm_own_fills(&wide, &d, 96), "96 tiles on 96 SMs");
    cr_expect(!gemm_own_fills(&pingpong, &d, 132), "32 x 6 tiles of 128 x 128 on 132 SMs' 264 warpgroups");
    cr_expect(gemm_own_fills(&pingpong, &d, 96), "192 tiles on 96 SMs' 192 warpgroups");
    cr_expect_eq(gemm_own_grid(GEMM_OWN_PINGPONG, &d, 132), 132);
    cr_expect_eq(gemm_own_grid(GEMM_OWN_TMA_STORE, &d, 132), 96);
    gemm_desc_linear(&d, GEMM_F16, GEMM_F16, 1025, 3072, 768, x, w, b, y);   /* a part row tile counts */
    cr_expect(gemm_own_fills(&wide, &d, 108), "9 x 12 tiles on 108 SMs");
    cr_expect(!gemm_own_fills(&wide, &d, 109), "9 x 12 tiles on 109 SMs");
    cr_expect_eq(gemm_own_tiles(GEMM_OWN_PINGPONG, &d), 9 * 24);
}

/* HPC_GEMM_OWN_MIN_TILES sets the tiles a product needs in place of the
 * GPU's warpgroups (an A/B's knob), and refuses what is not a count. */
Test(gemm_own, min_tiles_from_the_environment)
{
    GemmDesc d;
    CUdeviceptr x = 0x1000, w = 0x2000, b = 0x3000, y = 0x4000;
    HpcError err = {0};
    int64_t n = -1;
    unsetenv("HPC_GEMM_OWN_MIN_TILES");
    cr_assert_eq(gemm_own_min_tiles(&n, &err), HPC_OK);
    cr_expect_eq(n, 0, "unset: the rule of gemm_own_fills");
    setenv("HPC_GEMM_OWN_MIN_TILES", "192", 1);
    cr_assert_eq(gemm_own_min_tiles(&n, &err), HPC_OK);
    cr_expect_eq(n, 192);
    GemmOwnKernel pingpong = {NULL, GEMM_OWN_PINGPONG, n};
    gemm_desc_linear(&d, GEMM_F16, GEMM_F16, 1024, 3072, 768, x, w, b, y);   /* 8 x 24 tiles */
    cr_expect(gemm_own_fills(&pingpong, &d, 132), "192 tiles where 192 are asked for");
    gemm_desc_linear(&d, GEMM_F16, GEMM_F16, 32, 3072, 768, x, w, b, y);     /* 1 x 24 */
    cr_expect(!gemm_own_fills(&pingpong, &d, 132), "24 tiles where 192 are asked for");
    pingpong.min_tiles = 0;
    gemm_desc_linear(&d, GEMM_F16, GEMM_F16, 1024, 3072, 768, x, w, b, y);
    cr_expect(!gemm_own_fills(&pingpong, &d, 132), "192 tiles on 132 SMs' 264 warpgroups");
    const char *bad[] = {"0", "-3", "12x", "many"};
    for (int i = 0; i < 4; i++) {
        setenv("HPC_GEMM_OWN_MIN_TILES", bad[i], 1);
        cr_expect_eq(gemm_own_min_tiles(&n, &err), HPC_ERR_USAGE, "%s refused", bad[i]);
        cr_expect(strstr(err.msg, "HPC_GEMM_OWN_MIN_TILES") != NULL, "the message names the setting: %s", err.msg);
    }
    unsetenv("HPC_GEMM_OWN_MIN_TILES");
}

/* PlanOptions.write_early (what the executor asks for each LINEAR + GELU
 * pair it launches as one): the GELU output's range starts at the LINEAR,
 * so it never shares bytes with the LINEAR's input, which dies there. */
Test(gemm_own, plan_starts_paired_gelu_outputs_at_the_linear, .timeout = 120)
{
    Pipeline p;
    HpcError err = {0};
    tiny_fp16(&p, 0);
    const IrGraph *g = &p.g;
    bool *early = calloc((size_t)g->n, sizeof *early);
    int pairs = 0;
    for (int i = 0; i + 1 < g->n; i++)
        if (g->nodes[i].op == IR_OP_LINEAR && g->nodes[i + 1].op == IR_OP_ACT && g->nodes[i + 1].in[0] == i) {
            early[i + 1] = true;
            pairs++;
        }
    cr_assert_gt(pairs, 0, "bert_tiny's FFNs: a LINEAR and its GELU");
    StepPlan plain, with;
    PlanOptions po = {.write_early = early};
    cr_assert_eq(plan_build_scratch_with(g, 8, 64, NULL, NULL, &plain, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build_scratch_with(g, 8, 64, NULL, &po, &with, &err), HPC_OK, "%s", err.msg);
    int shared_before = 0;
    for (int a = 0; a < g->n; a++) {
        if (!early[a]) continue;
        int x = g->nodes[a - 1].in[0];
        cr_expect_eq(with.v[a].def, a - 1, "%s starts at the LINEAR", g->nodes[a].name);
        cr_expect_eq(plain.v[a].def, a);
        const PlanValue *va = &with.v[a], *vx = &with.v[x];
        if (vx->kind == PLAN_ARENA)
            cr_expect(va->offset + va->bytes <= vx->offset || vx->offset + vx->bytes <= va->offset,
                      "%s shares bytes with the LINEAR's input %s", g->nodes[a].name, g->nodes[x].name);
        const PlanValue *pa = &plain.v[a], *px = &plain.v[x];
        shared_before += px->kind == PLAN_ARENA &&
                         !(pa->offset + pa->bytes <= px->offset || px->offset + px->bytes <= pa->offset);
    }
    cr_expect_gt(shared_before, 0, "without the option the plan does put a GELU output on its LINEAR's input "
                                   "(why the option exists)");
    plan_free(&plain);
    plan_free(&with);
    free(early);
    pipeline_free(&p);
}
