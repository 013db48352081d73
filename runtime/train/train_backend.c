/* runtime/train/train_backend.c — opens the backend that trains a step
 * program; see train_backend.h.  It refers to no CUDA code: the cuda
 * backend comes in the options (train_backend_program.c for the trainer, a
 * weak reference for the C API).  The spec road
 * (compile first) is in train_backend_model.c. */
#include "train/train_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/phase_clock.h"

const char *train_device_name(TrainDevice d)
{
    return d == TRAIN_DEVICE_CPU ? "cpu" : d == TRAIN_DEVICE_CUDA ? "cuda" : "auto";
}

bool train_device_parse(const char *s, TrainDevice *d)
{
    for (TrainDevice k = TRAIN_DEVICE_CPU; k <= TRAIN_DEVICE_AUTO; k++)
        if (strcmp(s, train_device_name(k)) == 0) {
            *d = k;
            return true;
        }
    return false;
}

HpcStatus train_backend_open_with(TrainBackend *b, TrainDevice dev, const StepProgram *prog, int64_t total_steps,
                                  int64_t max_B, int64_t max_L, const TrainBackendOptions *o, HpcError *err)
{
    memset(b, 0, sizeof *b);
    b->spec = &prog->spec;
    b->policy = prog->policy;
    b->kernels = &prog->kernels;
    step_program_copy_graph(prog, &b->g, &b->pl);
    HPC_ASSERT(dev != TRAIN_DEVICE_AUTO);   /* train_backend_open_program decides auto */
    b->device = dev;
    /* The cuda backend opens the GPU while the parameters are drawn and
     * waits for them before their upload (train_cuda.c); the cpu waits here. */
    HpcStatus st = init_store_start(&b->ps, &b->pl, b->spec->train.seed, err);
    if (dev != TRAIN_DEVICE_CUDA) {
        init_store_wait(&b->ps);
        phase_mark("parameter init (init_store)");
    }
    if (!st && dev == TRAIN_DEVICE_CUDA && !o->cuda_open)
        st = hpc_fail(err, HPC_ERR_NO_GPU, "this program was linked without hpc's cuda backend; link it with "
                      "-Wl,--undefined=train_cuda_open and the CUDA libraries (docs/embedding.md), or use the cpu");
    if (!st) st = dev == TRAIN_DEVICE_CUDA ? o->cuda_open(b, total_steps, max_B, max_L, o, err)
                                           : train_cpu_open(b, total_steps, err);
    if (st) train_backend_close(b);   /* stops draws still running */
    else init_store_wait(&b->ps);     /* whatever the backend did: the store is whole from here on */
    return st;
}

void train_backend_close(TrainBackend *b)
{
    if (b->close) b->close(b);
    if (b->ps.w) init_store_free(&b->ps);
    ir_free(&b->g);
    params_free(&b->pl);
    if (b->owned) {
        step_program_free(b->owned);
        free(b->owned);
    }
    memset(b, 0, sizeof *b);
}
