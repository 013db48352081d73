/* compiler/step_program_build.h — making a step program (program/step_program.h)
 * and the library calls around it that `hpc compile`, `hpc run` and the C
 * API share:
 *   step_program_from_graph   a finished graph -> a program (records, CUDA);
 *   step_program_compile      a checked ModelSpec -> a program, in-process
 *                             (lower -> autodiff -> precision -> fuse, then
 *                             the above): the one call a .model path takes;
 *   step_program_load         a NAME.hpc (read, no front end) or a .model
 *                             file (parse, check, compile) -> a program;
 *   step_program_save         a program -> NAME.hpc (the resolved model
 *                             text, the plan summary, the CUDA, the program);
 *   step_program_kernels_build  a graph's launch records and CUDA (the
 *                             emitter), for a graph built in-process;
 *   step_program_params       the parameter table a spec lowers to (HF
 *                             import and export name tensors by it);
 *   spec_load, spec_load_string  .model text -> a checked spec
 *                             (compiler/spec_load.h, included here).
 * These link the whole compiler; a program that only runs artifacts uses
 * step_program_read_file (program/step_program.h) instead.
 *
 * The boundary: this is the one compiler header that runtime/ may include,
 * and only in the files of an in-process compile road (a .model path, a
 * checkpoint's model text, HF import/export, a graph built by a test);
 * scripts/check-includes.sh lists them and fails on any other include.
 *
 * Usage:
 *   StepProgram p;
 *   if (step_program_load("bert_base.hpc", PREC_DEFAULT, true, &p, stderr, &err)) return err.code;
 *   ... train p ...
 *   step_program_free(&p);
 */
#ifndef HPC_COMPILER_STEP_PROGRAM_BUILD_H
#define HPC_COMPILER_STEP_PROGRAM_BUILD_H

#include <stdbool.h>
#include <stdio.h>

#include "error.h"
#include "program/params.h"
#include "program/spec.h"
#include "program/step_program.h"
#include "spec_load.h"

/* Copies g and pl into *out and generates the launch records and module
 * source (compiler/emit_ops.h).  HPC_ERR_INPUT for a graph the GPU path
 * cannot run (an f64 value). */
HpcStatus step_program_from_graph(const ModelSpec *spec, SpecPrecision policy, bool fused, const IrGraph *g,
                                  const ParamList *pl, StepProgram *out, HpcError *err);

/* The whole compiler on a checked spec (policy PREC_DEFAULT means fp32). */
HpcStatus step_program_compile(const ModelSpec *spec, SpecPrecision policy, bool fuse, StepProgram *out,
                               HpcError *err);

/* step_program_compile with every layer over every token (no last layer
 * for token 0, compiler/lower.h): for a program whose last hidden states
 * are read (the C API's hpc_model_hidden). */
HpcStatus step_program_compile_every_token(const ModelSpec *spec, SpecPrecision policy, bool fuse,
                                           StepProgram *out, HpcError *err);

/* path ending in .hpc: the artifact's program, compiled again from its
 * model only when `policy` (not PREC_DEFAULT) or `fuse` differs from what
 * it was compiled with; else a .model file, checked (diagnostics to diag)
 * and compiled with policy (PREC_DEFAULT: fp32). */
HpcStatus step_program_load(const char *path, SpecPrecision policy, bool fuse, StepProgram *out, FILE *diag,
                            HpcError *err);

/* Writes NAME.hpc atomically; plan_text may be NULL. */
HpcStatus step_program_save(const char *path, const StepProgram *p, const char *plan_text, HpcError *err);

/* Every node's launch record and the module source of g into *k
 * (compiler/emit_ops.h, eop_kernels_build); the caller frees *k with
 * step_kernels_free.  HPC_ERR_INPUT for a node the GPU path cannot run. */
HpcStatus step_program_kernels_build(const IrGraph *g, StepKernels *k, HpcError *err);

/* The parameter table of a checked spec (its names, shapes, initializers
 * and ties, as lowering makes them) into *pl, which it initialises; the
 * caller frees it with params_free (also after a failure). */
HpcStatus step_program_params(const ModelSpec *spec, ParamList *pl, HpcError *err);

#endif
