/* compiler/check.h — the checker: AST -> ModelSpec, with located diagnostics.
 *
 * check_load_file / check_load_string parse a .model text (grammar/), resolve
 * `extends` bases, start from spec_defaults(), apply every setting, and
 * validate ranges.  They are the implementation of spec_load and
 * spec_load_string (spec.h), with the same return convention:
 *   0 on success, the number of errors (> 0) on a bad model, -1 if the file
 *   could not be read.  Diagnostics go to `diag` (may be NULL: silent).
 */
#ifndef HPC_COMPILER_CHECK_H
#define HPC_COMPILER_CHECK_H

#include <stddef.h>
#include <stdio.h>

#include "program/spec.h"

int check_load_file(const char *path, ModelSpec *out, FILE *diag);
int check_load_string(const char *name, const char *text, size_t len,
                      const char *base_dir, ModelSpec *out, FILE *diag);

#endif
