/* runtime/train/train_backend.c — opens the backend that trains a step
 * program; see train_backend.h.  The spec road (compile first) is in
 * train_backend_model.c. */
#include "train/train_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_driver.h"
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
    memset(b, 0, sizeof *b);
    b->spec = &prog->spec;
    b->policy = prog->policy;
    b->kernels = &prog->kernels;
    step_program_copy_graph(prog, &b->g, &b->pl);
    char why[256] = "";
    phase_mark("process start to the backend: artifact read, graph/plan, data, checks");
    if (dev == TRAIN_DEVICE_AUTO) {
        dev = gpu_usable(why, sizeof why) ? TRAIN_DEVICE_CUDA : TRAIN_DEVICE_CPU;
        phase_mark("--device auto: a GPU probe (opens and closes a context)");
    }
    b->device = dev;
    HpcStatus st = init_store(&b->ps, &b->pl, b->spec->train.seed, err);
    phase_mark("parameter init (init_store)");
    if (!st) st = dev == TRAIN_DEVICE_CUDA ? train_cuda_open(b, total_steps, max_B, max_L, err)
                                           : train_cpu_open(b, total_steps, err);
    if (!st && why[0]) {
        size_t n = strlen(b->name);
        snprintf(b->name + n, sizeof b->name - n, " (no usable GPU: %.100s)", why);
    }
    if (st) train_backend_close(b);
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
