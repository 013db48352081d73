/* compiler/step_program_build.c — programs from graphs, specs and files;
 * see step_program_build.h. */
#include "step_program_build.h"

#include <stdlib.h>
#include <string.h>

#include "program/artifact.h"
#include "emit_ops.h"
#include "lower.h"
#include "pipeline.h"
#include "spec_load.h"

HpcStatus step_program_from_graph(const ModelSpec *spec, SpecPrecision policy, bool fused, const IrGraph *g,
                                  const ParamList *pl, StepProgram *out, HpcError *err)
{
    step_program_init(out);
    StepProgram view = {.g = *g, .pl = *pl};   /* borrowed, for the copy only */
    step_program_copy_graph(&view, &out->g, &out->pl);
    out->spec = *spec;
    out->policy = policy == PREC_DEFAULT ? PREC_FP32 : policy;
    out->fused = fused;
    snprintf(out->name, sizeof out->name, "%s", spec->name);
    /* A packed program (docs/packing.md) needs the fused attention's varlen
     * kernels, which exist in 16 bits only: under fp32 it gets no CUDA
     * kernels and runs on the cpu backend (the cuda backend says so). */
    if (ir_graph_packed(&out->g) && out->policy == PREC_FP32) return HPC_OK;
    HpcStatus st = eop_kernels_build(&out->g, &out->kernels, err);
    if (st) step_program_free(out);
    return st;
}

static HpcStatus compile_with(const ModelSpec *spec, SpecPrecision policy, bool fuse, bool first_token,
                              StepProgram *out, HpcError *err)
{
    if (policy == PREC_DEFAULT) policy = PREC_FP32;
    PipeOptions o = pipeline_defaults(policy);
    o.fuse = fuse;
    o.first_token_last_layer &= first_token;
    Pipeline p;
    HpcStatus st = pipeline_build(spec, &o, &p, err);
    if (!st) st = step_program_from_graph(spec, policy, p.fused, &p.g, &p.pl, out, err);
    else step_program_init(out);
    pipeline_free(&p);
    return st;
}

HpcStatus step_program_compile(const ModelSpec *spec, SpecPrecision policy, bool fuse, StepProgram *out,
                               HpcError *err)
{
    return compile_with(spec, policy, fuse, true, out, err);
}

HpcStatus step_program_compile_every_token(const ModelSpec *spec, SpecPrecision policy, bool fuse,
                                           StepProgram *out, HpcError *err)
{
    return compile_with(spec, policy, fuse, false, out, err);
}

static bool ends_with(const char *s, const char *tail)
{
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

HpcStatus step_program_load(const char *path, SpecPrecision policy, bool fuse, StepProgram *out, FILE *diag,
                            HpcError *err)
{
    step_program_init(out);
    if (ends_with(path, ARTIFACT_EXT)) {
        HpcStatus st = step_program_read_file(path, out, err);
        if (st) return st;
        bool same = (policy == PREC_DEFAULT || policy == out->policy) && fuse == out->fused;
        if (same) return HPC_OK;
        /* Another policy or fusion than compiled: the program's own model again. */
        ModelSpec spec = out->spec;
        SpecPrecision want = policy == PREC_DEFAULT ? out->policy : policy;
        step_program_free(out);
        return step_program_compile(&spec, want, fuse, out, err);
    }
    ModelSpec spec;
    int nerr = spec_load(path, &spec, diag);
    if (nerr < 0) return hpc_fail(err, HPC_ERR_IO, "cannot read %s", path);
    if (nerr > 0) return hpc_fail(err, HPC_ERR_INPUT, "%s has %d error(s) (above)", path, nerr);
    return step_program_compile(&spec, policy, fuse, out, err);
}

HpcStatus step_program_save(const char *path, const StepProgram *p, const char *plan_text, HpcError *err)
{
    Artifact a = {.policy = p->policy};
    snprintf(a.name, sizeof a.name, "%s", p->name);
    a.model_text = artifact_model_text(&p->spec);
    a.plan_text = (char *)plan_text;
    a.cuda_source = p->kernels.cuda_source;
    size_t len = 0;
    FILE *mem = open_memstream(&a.program_text, &len);
    if (!mem) hpc_panic(__FILE__, __LINE__, "out of host memory for the step program");
    step_program_write(p, mem);
    fclose(mem);
    HpcStatus st = artifact_write(path, &a, err);
    free(a.model_text);
    free(a.program_text);
    return st;
}

HpcStatus step_program_kernels_build(const IrGraph *g, StepKernels *k, HpcError *err)
{
    return eop_kernels_build(g, k, err);
}

HpcStatus step_program_params(const ModelSpec *spec, ParamList *pl, HpcError *err)
{
    IrGraph g;
    ir_init(&g);
    params_init(pl);
    HpcStatus st = lower_model(spec, &g, pl, err);
    ir_free(&g);
    return st;
}
