/* compiler/spec_load.h — a .model file or text -> a checked ModelSpec
 * (program/spec.h): the front end's entry points (grammar/ parses,
 * compiler/check.c checks and fills every default).  Compiler side of the
 * boundary: the runtime reads a ModelSpec but never parses one, except on
 * the in-process compile roads, which reach these through
 * compiler/step_program_build.h.
 *
 * Usage:
 *   ModelSpec spec;
 *   if (spec_load("models/bert_base.model", &spec, stderr) != 0) return 1;
 */
#ifndef HPC_COMPILER_SPEC_LOAD_H
#define HPC_COMPILER_SPEC_LOAD_H

#include <stddef.h>
#include <stdio.h>

#include "program/spec.h"

/* Parses and checks a .model file.  Returns 0 and fills *out on success.
 * On failure prints located diagnostics (file:line:col, the line, a caret)
 * to diag and returns the number of errors (> 0), or -1 if the file could not
 * be read (the message names the file and the reason). */
int spec_load(const char *path, ModelSpec *out, FILE *diag);

/* Same, from memory; name is used in diagnostics.  `extends` clauses are
 * resolved relative to base_dir (may be NULL for the current directory). */
int spec_load_string(const char *name, const char *text, size_t len,
                     const char *base_dir, ModelSpec *out, FILE *diag);

#endif
