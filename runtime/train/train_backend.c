/* runtime/train/train_backend.c — builds the model once and opens the backend
 * that trains it; see train_backend.h. */
#include "train/train_backend.h"

#include <stdio.h>
#include <string.h>

#include "cuda/cuda_driver.h"
#include "compiler/pipeline.h"
#include "compiler/precision.h"

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

/* lower -> autodiff -> precision -> fuse (compiler/pipeline.h), then the
 * initial parameters. */
static HpcStatus build_model(TrainBackend *b, bool fuse, HpcError *err)
{
    PipeOptions o = pipeline_defaults(b->policy);
    o.fuse = fuse;
    Pipeline p;
    HpcStatus st = pipeline_build(b->spec, &o, &p, err);
    ir_free(&b->g);
    params_free(&b->pl);
    b->g = p.g;          /* the backend takes the graph and the parameters */
    b->pl = p.pl;
    if (p.reached >= PIPE_PRECISION) precision_plan_free(&p.prec);
    if (!st) st = init_store(&b->ps, &b->pl, b->spec->train.seed, err);
    return st;
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

HpcStatus train_backend_open(TrainBackend *b, TrainDevice dev, const ModelSpec *spec, SpecPrecision policy,
                             bool fuse, int64_t total_steps, int64_t max_B, int64_t max_L, HpcError *err)
{
    memset(b, 0, sizeof *b);
    b->spec = spec;
    b->policy = policy == PREC_DEFAULT ? PREC_FP32 : policy;
    ir_init(&b->g);
    params_init(&b->pl);
    char why[256] = "";
    if (dev == TRAIN_DEVICE_AUTO) dev = gpu_usable(why, sizeof why) ? TRAIN_DEVICE_CUDA : TRAIN_DEVICE_CPU;
    b->device = dev;
    HpcStatus st = build_model(b, fuse, err);
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
    memset(b, 0, sizeof *b);
}
