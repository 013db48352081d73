/* compiler/artifact_spec.h — the model of NAME.hpc (program/artifact.h)
 * through the front end: the artifact's model section parsed and checked
 * into a ModelSpec.  Apart from artifact.h because it needs the parser; a
 * program that only runs artifacts reads the step program instead.
 *
 * Usage:
 *   ModelSpec s; SpecPrecision p;
 *   if (artifact_load_spec("bert_base.hpc", &s, &p, stderr, &err)) return err.code;
 */
#ifndef HPC_COMPILER_ARTIFACT_SPEC_H
#define HPC_COMPILER_ARTIFACT_SPEC_H

#include <stdio.h>

#include "error.h"
#include "program/artifact.h"

/* Reads the artifact and checks its model text into *spec; *policy gets
 * the compiled policy.  Diagnostics of a bad model text go to diag. */
HpcStatus artifact_load_spec(const char *path, ModelSpec *spec, SpecPrecision *policy, FILE *diag,
                             HpcError *err);

#endif
