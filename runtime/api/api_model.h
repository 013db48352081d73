/* runtime/api/api_model.h — the C API's `.model` road: a model file or
 * options.model_text (or an artifact's model at another policy) compiled
 * in-process into a step program (compiler/step_program_build.h).
 *
 * It lives in its own library member so that a program that opens only
 * NAME.hpc artifacts links no parser, checker or passes: api.c refers to
 * api_program_from_model weakly, and a static link pulls this member in
 * only when something references it.  A program that opens model files
 * (or model text) links it with -Wl,--undefined=api_program_from_model
 * before the libraries (docs/embedding.md), or references the symbol
 * itself; without it, hpc_model_open on a model file fails with
 * HPC_ERR_USAGE saying so.
 */
#ifndef HPC_RUNTIME_API_MODEL_H
#define HPC_RUNTIME_API_MODEL_H

#include "util/error.h"
#include "program/step_program.h"

/* With spec non-NULL: that checked spec compiled at `policy` (an artifact
 * asked for another policy).  Else the model file at path, or text when
 * path is NULL, checked (located diagnostics go into err's message) and
 * compiled at `policy` (PREC_DEFAULT: fp32).  Messages start with
 * "hpc_model_open". */
HpcStatus api_program_from_model(const char *path, const char *text, const ModelSpec *spec, SpecPrecision policy,
                                 StepProgram *out, HpcError *err);

#endif
