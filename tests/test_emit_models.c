/* tests/test_emit_models.c — the CUDA module of the training step (the
 * fused graph of compiler/pipeline.h, emitted by compiler/emit_ops.h)
 * compiles with NVRTC for sm_80 and sm_90 for every shipped model under
 * every policy.  No GPU needed.
 *
 * Each model is compiled with one layer: every layer of a stack emits the
 * same kernels (same sizes, dtypes and attributes), so one layer covers the
 * kernel set of all of them at a fraction of the compile time. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emit_kernels.h"
#include "emit_lib_internal.h"
#include "emit_ops.h"
#include "cuda/nvrtc_compile.h"
#include "pipeline.h"
#include "program/spec.h"
#include "compiler/spec_load.h"

static void compile_model(const char *file)
{
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/models/%s", root ? root : ".", file);
    ModelSpec spec;
    cr_assert_eq(spec_load(path, &spec, stderr), 0, "cannot load %s", path);
    spec.stack.layers = 1;
    spec.train.freeze_layers = 0;
    const SpecPrecision policies[] = {PREC_FP32, PREC_FP16, PREC_BF16};
    for (int i = 0; i < 3; i++) {
        HpcError err = {0};
        PipeOptions o = pipeline_defaults(policies[i]);
        Pipeline p;
        cr_assert_eq(pipeline_build(&spec, &o, &p, &err), HPC_OK, "%s: %s", file, err.msg);
        char *src = NULL;
        cr_assert_eq(eop_module_source(&p.g, &src, &err), HPC_OK, "%s: %s", file, err.msg);
        for (int arch = 80; arch <= 90; arch += 10) {
            void *cubin = NULL;
            size_t size = 0;
            char *log = NULL;
            HpcStatus st = nvrtc_compile(src, "hpc_step", arch, NULL, 0, &cubin, &size, &log, &err);
            cr_expect_eq(st, HPC_OK, "%s %s sm_%d: %s", file, spec_precision_name(policies[i]), arch, err.msg);
            cr_expect_gt(size, 1000, "%s: empty cubin", file);
            free(cubin);
            free(log);
        }
        free(src);
        pipeline_free(&p);
    }
}

Test(emit_models, bert_base, .timeout = 600) { compile_model("bert_base.model"); }
Test(emit_models, bert_large, .timeout = 600) { compile_model("bert_large.model"); }
Test(emit_models, bert_tiny, .timeout = 600) { compile_model("bert_tiny.model"); }
Test(emit_models, bert_base_mlm, .timeout = 600) { compile_model("bert_base_mlm.model"); }
Test(emit_models, distilbert_base, .timeout = 600) { compile_model("distilbert_base.model"); }
Test(emit_models, minilm_l12_h384, .timeout = 600) { compile_model("minilm_l12_h384.model"); }
Test(emit_models, roberta_base, .timeout = 600) { compile_model("roberta_base.model"); }
Test(emit_models, gpt2_small, .timeout = 600) { compile_model("gpt2_small.model"); }

/* The layers of a stack differ only by their dropout salts, a launch
 * argument (EopArgs.salt): the module's kernels do not multiply with the
 * layer count, which is what keeps NVRTC's cold compile short. */
Test(emit_models, kernels_do_not_grow_with_layers)
{
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/models/bert_base.model", root ? root : ".");
    const SpecPrecision policies[] = {PREC_FP32, PREC_FP16, PREC_BF16};
    for (int i = 0; i < 3; i++) {
        int kernels[2];
        for (int k = 0; k < 2; k++) {
            ModelSpec spec;
            cr_assert_eq(spec_load(path, &spec, stderr), 0, "cannot load %s", path);
            spec.stack.layers = k == 0 ? 2 : 5;
            HpcError err = {0};
            PipeOptions o = pipeline_defaults(policies[i]);
            Pipeline p;
            cr_assert_eq(pipeline_build(&spec, &o, &p, &err), HPC_OK, "%s", err.msg);
            kernels[k] = eop_kernel_count(&p.g);
            pipeline_free(&p);
        }
        cr_expect_gt(kernels[0], 10, "policy %d: %d kernels", i, kernels[0]);
        cr_expect_eq(kernels[0], kernels[1], "policy %d: %d kernels with 2 layers, %d with 5", i, kernels[0],
                     kernels[1]);
    }
}

static int count_of(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

/* A SiLU FFN (program/activations.h): its act/act_bwd kernels compile. */
Test(emit_models, bert_tiny_silu, .timeout = 600)
{
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/models/bert_tiny.model", root ? root : ".");
    ModelSpec spec;
    cr_assert_eq(spec_load(path, &spec, stderr), 0, "cannot load %s", path);
    spec.stack.layers = 1;
    spec.stack.activation = ACT_SILU;
    for (int i = 0; i < 3; i++) {
        const SpecPrecision pol = i == 0 ? PREC_FP32 : i == 1 ? PREC_FP16 : PREC_BF16;
        HpcError err = {0};
        PipeOptions o = pipeline_defaults(pol);
        Pipeline p;
        cr_assert_eq(pipeline_build(&spec, &o, &p, &err), HPC_OK, "%s", err.msg);
        char *src = NULL;
        cr_assert_eq(eop_module_source(&p.g, &src, &err), HPC_OK, "%s", err.msg);
        /* The definitions, and a kernel calling each. */
        cr_expect_gt(count_of(src, "act_silu("), 1, "no kernel calls act_silu");
        cr_expect_gt(count_of(src, "actg_silu("), 1, "no kernel calls actg_silu");
        void *cubin = NULL;
        size_t size = 0;
        char *log = NULL;
        HpcStatus st = nvrtc_compile(src, "hpc_step", 90, NULL, 0, &cubin, &size, &log, &err);
        cr_expect_eq(st, HPC_OK, "silu %s sm_90: %s", spec_precision_name(pol), err.msg);
        cr_expect_gt(size, 1000, "empty cubin");
        free(cubin), free(log), free(src);
        pipeline_free(&p);
    }
    /* The templates with the model's config (the fused attention's unit
     * reads their constants) must not refuse SiLU (they once did, so a SiLU
     * model could not train on the GPU); only an export of them may. */
    KernelConfig kc;
    kemit_config_from_spec(&kc, &spec, KEMIT_F16);
    char *tsrc = NULL, suffix[KEMIT_SUFFIX_MAX];
    HpcError err = {0};
    cr_expect_eq(kemit_source(&kc, &tsrc, suffix, &err), HPC_OK, "templates: %s", err.msg);
    free(tsrc);
    char dir[] = "/tmp/hpc_silu_emit_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char suf[KEMIT_SUFFIX_MAX];
    cr_expect_eq(emitlib_write_cuh(&spec, PREC_FP16, dir, NULL, suf, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "have no silu kernels") != NULL, "%s", err.msg);
    rmdir(dir);
}
