/* runtime/train/train_backend_model.c — train_backend_open: a checked spec
 * compiled in-process (train/spec_compile.h), then the program
 * road of train_backend.c.  Apart from it so that a program that trains an
 * artifact links no compiler. */
#include "train/train_backend.h"

#include <stdlib.h>
#include <string.h>

#include "train/spec_compile.h"

HpcStatus train_backend_open(TrainBackend *b, TrainDevice dev, const ModelSpec *spec, SpecPrecision policy,
                             bool fuse, int64_t total_steps, int64_t max_B, int64_t max_L, HpcError *err)
{
    memset(b, 0, sizeof *b);
    StepProgram *prog = xcalloc(1, sizeof *prog);
    HpcStatus st = train_spec_compile(spec, policy, fuse, prog, err);
    if (st) {
        step_program_free(prog);
        free(prog);
        return st;
    }
    st = train_backend_open_program(b, dev, prog, total_steps, max_B, max_L, err);
    if (st) {
        step_program_free(prog);
        free(prog);
        return st;
    }
    b->owned = prog;
    b->spec = spec;   /* the caller's, as before (the program holds an equal copy) */
    return HPC_OK;
}
