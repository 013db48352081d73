/* runtime/train/spec_compile.c — see spec_compile.h. */
#include "train/spec_compile.h"

#include "compiler/step_program_build.h"

static long compiles;   /* atomically updated: the trainer may run on any thread */

HpcStatus train_spec_compile(const ModelSpec *spec, SpecPrecision policy, bool fuse, StepProgram *out,
                             HpcError *err)
{
    __atomic_add_fetch(&compiles, 1, __ATOMIC_RELAXED);
    return step_program_compile(spec, policy, fuse, out, err);
}

long train_spec_compiles(void) { return __atomic_load_n(&compiles, __ATOMIC_RELAXED); }
