/* tests/link/run_artifact.c — a program that runs a compiled artifact and
 * nothing else: it reads NAME.hpc's step program (program/step_program.h)
 * and trains it for a few steps on the cpu backend through the one backend
 * interface (runtime/train/train_backend.h).  It references no parser,
 * checker, lowering or autodiff, so a static link leaves them out;
 * tests/link/check-no-frontend.sh checks that with nm and runs it.
 *
 *   run_artifact NAME.hpc      prints "loss L0 -> L1" and exits 0 */
#include <math.h>
#include <stdio.h>

#include "program/step_program.h"
#include "data/batch.h"
#include "train/train_backend.h"

static void fill(Batch *b, const ModelSpec *s)
{
    uint32_t x = 7;
    for (int64_t i = 0; i < b->B * b->L; i++) {
        x = x * 1664525u + 1013904223u;
        b->input_ids[i] = (int32_t)(x % (uint32_t)s->stack.vocab_size);
        b->token_type_ids[i] = 0;
        b->attention_mask[i] = 1;
    }
    for (int64_t i = 0; i < b->B; i++) b->labels[i] = (int32_t)(i % 2);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: run_artifact NAME.hpc\n");
        return 2;
    }
    StepProgram prog;
    HpcError err = {0};
    if (step_program_read_file(argv[1], &prog, &err)) {
        fprintf(stderr, "run_artifact: %s\n", err.msg);
        return 1;
    }
    TrainBackend be;
    HpcStatus st = train_backend_open_program(&be, TRAIN_DEVICE_CPU, &prog, 4, 4, 16, &err);
    Batch *b = batch_new(4, 16, 0);
    fill(b, &prog.spec);
    double first = NAN, last = NAN;
    for (int step = 0; step < 3 && !st; step++) {
        TrainStepStat rec[4];
        int n = 0;
        st = be.micro(&be, b, 0, &err);
        if (!st) st = be.step(&be, false, &err);
        if (!st) st = be.collect(&be, rec, 4, &n, &err);
        if (!st && n == 1) {
            if (step == 0) first = rec[0].loss;
            last = rec[0].loss;
        }
    }
    batch_free(b);
    if (!st) train_backend_close(&be);
    step_program_free(&prog);
    if (st || !isfinite(first) || !(last < first)) {
        fprintf(stderr, "run_artifact: %s (loss %g -> %g)\n", st ? err.msg : "the loss did not fall", first, last);
        return 1;
    }
    printf("loss %.6f -> %.6f\n", first, last);
    return 0;
}
