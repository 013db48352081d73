/* compiler/pipeline.h — the compiler half in one function:
 *
 *   lower -> autodiff -> precision(policy) -> fuse (unless opts.fuse is off)
 *
 * (with opts.fuse_qkv, the default unless HPC_FUSE_QKV=0, the lower stage ends with the Q/K/V
 * rewrite of compiler/fuse_qkv.h, so its dump shows the rewritten graph)
 *
 * pipeline_build runs the stages in that order on a checked ModelSpec and
 * leaves the graph of the last stage that ran, the parameter list and the
 * precision plan (re-indexed for the fused graph) in a Pipeline.  Two hooks
 * serve `hpc compile --dump-STAGE` and `--stop-after STAGE`: opts.dump
 * (a bit per stage, PIPE_BIT(stage)) prints the graph listing (ir_print) to
 * opts.dump_out after each chosen stage, and opts.stop_after ends the run
 * after that stage (the result is then the graph of that stage).
 *
 * The precision stage always runs (policy PREC_FP32 leaves the graph as is
 * but still yields a plan), so pipeline.prec is valid whenever
 * pipeline.reached >= PIPE_PRECISION.
 *
 * Ownership: the Pipeline owns its graph, parameter list and plan;
 * pipeline_free releases them (also after a failed build).
 *
 * Usage:
 *   PipeOptions o = pipeline_defaults(PREC_FP16);
 *   Pipeline p;
 *   if (pipeline_build(&spec, &o, &p, &err)) { pipeline_free(&p); return err.code; }
 *   ... p.g, p.pl, p.prec ...
 *   pipeline_free(&p);
 */
#ifndef HPC_COMPILER_PIPELINE_H
#define HPC_COMPILER_PIPELINE_H

#include <stdbool.h>
#include <stdio.h>

#include "attention_form.h"
#include "error.h"
#include "fuse.h"
#include "program/ir.h"
#include "program/params.h"
#include "precision.h"
#include "program/spec.h"

typedef enum { PIPE_NONE = -1, PIPE_LOWER, PIPE_AUTODIFF, PIPE_PRECISION, PIPE_FUSE, PIPE_STAGE_COUNT } PipeStage;

#define PIPE_BIT(stage) (1u << (stage))

typedef struct {
    SpecPrecision policy;     /* PREC_FP32, PREC_FP16 or PREC_BF16 */
    bool fuse;                /* run the fuse pass (default true) */
    PipeStage stop_after;     /* last stage to run (default PIPE_FUSE) */
    unsigned dump;            /* PIPE_BIT(stage): print the graph after it */
    FILE *dump_out;           /* where dumps go (default stdout) */
    AttnForm attention;       /* fused or unfused attention (compiler/attention_form.h; default auto) */
    bool fuse_qkv;            /* Q, K, V as one GEMM right after lowering (compiler/fuse_qkv.h;
                               * default: fuse_qkv_requested(), on unless HPC_FUSE_QKV=0) */
    bool first_token_last_layer; /* the last layer for token 0 where compiler/lower.h allows it
                               * (default: last_layer_first_requested(), on unless HPC_LAST_LAYER=all) */
} PipeOptions;

typedef struct {
    IrGraph g;                /* the graph after the last stage that ran */
    ParamList pl;
    PrecisionPlan prec;       /* valid when reached >= PIPE_PRECISION */
    FuseStats fuse;           /* zero unless the fuse stage ran */
    int qkv_sites;            /* attention blocks made one QKV GEMM (PipeOptions.fuse_qkv) */
    PipeStage reached;        /* last stage that ran; PIPE_NONE before lower */
    bool fused;               /* the fuse stage ran */
} Pipeline;

PipeOptions pipeline_defaults(SpecPrecision policy);

/* Runs the stages (see the top of this file) into *p, which it initialises.
 * On failure p holds what the stages before the failing one produced. */
HpcStatus pipeline_build(const ModelSpec *spec, const PipeOptions *opts, Pipeline *p, HpcError *err);
void pipeline_free(Pipeline *p);

const char *pipeline_stage_name(PipeStage s);         /* "lower", "autodiff", "precision", "fuse" */
PipeStage pipeline_stage_parse(const char *name);     /* PIPE_NONE if unknown */

#endif
