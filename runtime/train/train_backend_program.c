/* runtime/train/train_backend_program.c — train_backend_open_program: the
 * trainer's open, with the cuda backend linked in and TRAIN_DEVICE_AUTO
 * decided by opening GPU 0 (train_backend.h).  Apart
 * from train_backend.c so that the C API, which opens through
 * train_backend_open_with and refers to the cuda backend weakly, does not
 * link the CUDA code into a cpu-only program. */
#include "train/train_backend.h"
#include "util/phase_clock.h"

#include <stdio.h>
#include <string.h>

#include "cuda/cuda_driver.h"

/* Auto: is a GPU usable?  Opens and closes device 0 (cheap next to a run). */
static bool gpu_usable(char *why, size_t size)
{
    CudaDevice d;
    HpcError e = {0};
    if (cuda_device_open(&d, 0, &e)) {
        snprintf(why, size, "%.200s", e.msg);
        char *cut = strstr(why, " (");   /* the cause, without the details */
        if (cut) *cut = '\0';
        return false;
    }
    cuda_device_close(&d);
    return true;
}


HpcStatus train_backend_open_program(TrainBackend *b, TrainDevice dev, const StepProgram *prog,
                                     int64_t total_steps, int64_t max_B, int64_t max_L, HpcError *err)
{
    TrainBackendOptions o = {.gpu = -1, .cuda_open = train_cuda_open};
    char why[256] = "";
    phase_mark("trainer set-up to the backend (checks, memory check, batches)");
    if (dev == TRAIN_DEVICE_AUTO) {
        dev = gpu_usable(why, sizeof why) ? TRAIN_DEVICE_CUDA : TRAIN_DEVICE_CPU;
        phase_mark("--device auto: a GPU probe (opens and closes a context)");
    }
    HpcStatus st = train_backend_open_with(b, dev, prog, total_steps, max_B, max_L, &o, err);
    if (!st && why[0]) {
        size_t n = strlen(b->name);
        snprintf(b->name + n, sizeof b->name - n, " (no usable GPU: %.100s)", why);
    }
    return st;
}
