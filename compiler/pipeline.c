/* compiler/pipeline.c — the compiler stages in order; see pipeline.h. */
#include "pipeline.h"

#include <string.h>

#include "autodiff.h"
#include "fuse_qkv.h"
#include "lower.h"
#include "ir_print.h"

static const char *const stage_names[PIPE_STAGE_COUNT] = {"lower", "autodiff", "precision", "fuse"};

const char *pipeline_stage_name(PipeStage s)
{
    return s >= 0 && s < PIPE_STAGE_COUNT ? stage_names[s] : "none";
}

PipeStage pipeline_stage_parse(const char *name)
{
    for (int s = 0; s < PIPE_STAGE_COUNT; s++)
        if (strcmp(name, stage_names[s]) == 0) return (PipeStage)s;
    return PIPE_NONE;
}

PipeOptions pipeline_defaults(SpecPrecision policy)
{
    return (PipeOptions){.policy = policy, .fuse = true, .stop_after = PIPE_FUSE, .dump = 0,
                         .dump_out = NULL, .attention = ATTN_FORM_AUTO, .fuse_qkv = fuse_qkv_requested(),
                         .first_token_last_layer = last_layer_first_requested()};
}

/* Replaces p->g by its precision plan. */
static HpcStatus stage_precision(Pipeline *p, const ModelSpec *spec, SpecPrecision policy, HpcError *err)
{
    IrGraph mixed;
    ir_init(&mixed);
    HpcStatus st = precision_plan(&p->g, spec, policy, &mixed, &p->prec, err);
    if (st) {
        ir_free(&mixed);
        return st;
    }
    ir_free(&p->g);
    p->g = mixed;
    return HPC_OK;
}

/* Replaces p->g and p->prec by their fused versions. */
static HpcStatus stage_fuse(Pipeline *p, HpcError *err)
{
    IrGraph fused;
    PrecisionPlan plan;
    ir_init(&fused);
    HpcStatus st = fuse_graph(&p->g, &p->prec, &fused, &plan, &p->fuse, err);
    if (st) {
        ir_free(&fused);
        return st;
    }
    ir_free(&p->g);
    precision_plan_free(&p->prec);
    p->g = fused;
    p->prec = plan;
    p->fused = true;
    return HPC_OK;
}

static HpcStatus run_stage(Pipeline *p, PipeStage s, const ModelSpec *spec, const PipeOptions *o,
                           HpcError *err)
{
    switch (s) {
    case PIPE_LOWER: {
        bool fused_attention;
        HpcStatus st = attention_form_choose(spec, o->policy, o->attention, &fused_attention, err);
        if (!st) st = lower_model_attention(spec, fused_attention, o->first_token_last_layer, &p->g, &p->pl, err);
        if (!st && o->fuse_qkv) st = fuse_qkv_graph(&p->g, &p->pl, &p->qkv_sites, err);
        return st;
    }
    case PIPE_AUTODIFF: return autodiff_build(&p->g, &p->pl, err);
    case PIPE_PRECISION: return stage_precision(p, spec, o->policy, err);
    case PIPE_FUSE: return o->fuse ? stage_fuse(p, err) : HPC_OK;
    case PIPE_NONE:
    case PIPE_STAGE_COUNT: break;
    }
    HPC_ASSERT(0);
    return HPC_ERR_INTERNAL;
}

HpcStatus pipeline_build(const ModelSpec *spec, const PipeOptions *opts, Pipeline *p, HpcError *err)
{
    memset(p, 0, sizeof *p);
    ir_init(&p->g);
    params_init(&p->pl);
    p->reached = PIPE_NONE;
    FILE *out = opts->dump_out ? opts->dump_out : stdout;
    for (int s = 0; s <= opts->stop_after && s < PIPE_STAGE_COUNT; s++) {
        HpcStatus st = run_stage(p, (PipeStage)s, spec, opts, err);
        if (st) return st;
        p->reached = (PipeStage)s;
        if (opts->dump & PIPE_BIT(s)) {
            fprintf(out, "# after %s%s\n", stage_names[s], s == PIPE_FUSE && !opts->fuse ? " (off)" : "");
            ir_print(&p->g, out);
        }
    }
    return HPC_OK;
}

void pipeline_free(Pipeline *p)
{
    if (p->reached >= PIPE_PRECISION) precision_plan_free(&p->prec);
    ir_free(&p->g);
    params_free(&p->pl);
    memset(p, 0, sizeof *p);
    p->reached = PIPE_NONE;
}
