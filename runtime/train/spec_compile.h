/* runtime/train/spec_compile.h — the trainer's in-process compile of a
 * checked spec into a step program, counted.
 *
 * Every road of `hpc run` and the trainer that compiles a model in this
 * process (cli/cmd_run.c for a .model file or a checkpoint's model,
 * train/memcheck.c and train/train_backend.h's train_backend_open when they
 * are handed a spec rather than a program) calls train_spec_compile, which is
 * step_program_compile (compiler/step_program_build.h) plus a process-wide
 * count.  The count is how tests/test_run_compiles.c holds `hpc run X.model`
 * to one compile (the memory check and the backend share that program).
 *
 *   StepProgram p;
 *   if (train_spec_compile(&spec, PREC_FP16, true, &p, &err)) return err.code;
 *   ... memcheck_run(&spec, &p, ...); train_backend_open_program(&be, dev, &p, ...) ...
 *   step_program_free(&p);
 */
#ifndef HPC_RUNTIME_SPEC_COMPILE_H
#define HPC_RUNTIME_SPEC_COMPILE_H

#include <stdbool.h>

#include "program/spec.h"
#include "program/step_program.h"
#include "util/error.h"

/* step_program_compile(spec, policy, fuse, out, err), counted (also when it
 * fails); policy PREC_DEFAULT means fp32. */
HpcStatus train_spec_compile(const ModelSpec *spec, SpecPrecision policy, bool fuse, StepProgram *out,
                             HpcError *err);

/* Calls of train_spec_compile in this process so far (any thread). */
long train_spec_compiles(void);

#endif
