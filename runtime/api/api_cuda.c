/* runtime/api/api_cuda.c — the cuda backend of the C API (api_backend.h): the
 * graph on one GPU (runtime/cuda/cuda_exec.h), the optimizer and loss scaler on
 * the GPU (runtime/cuda/cuda_optim.h).  Unlike the trainer, every API call waits
 * for its results (the caller gets host arrays back), so a step costs one
 * synchronisation.
 *
 * The caller's stream replaces the device's own for every launch and copy
 * (CUDA graph capture is then off: the caller's stream may be the legacy
 * default stream, which cannot be captured).  A caller's device allocator
 * serves the executor's arena and every buffer beside it (parameters,
 * optimizer state), through runtime/cuda/device_arena.h; cuBLASLt's workspace
 * (32 MiB) and the loaded modules still come from the driver.
 * hpc_model_hidden is cpu-only: the step plan may reuse the hidden states'
 * arena slot once the head has read them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_backend.h"
#include "cuda/cuda_exec.h"
#include "cuda/cuda_optim.h"
#include "train/init.h"
#include "train/lossscale.h"

typedef struct {
    CudaDevice dev;
    CUstream own_stream;       /* the device's stream, restored before close */
    bool dev_open, ex_open, opt_open, graphs;
    CudaExec ex;
    CudaOptim opt;
    LossScaleConfig lc;        /* for the give-up limit */
    uint32_t micro;            /* training forwards so far: the dropout step */
    HpcDeviceAllocator user_alloc; /* the caller's allocator (alloc NULL: none) */
    ArenaAllocator arena_alloc;    /* adapts it for runtime/cuda/device_arena.h */
} ApiCuda;

static ApiCuda *cuda_of(HpcModel *m) { return m->impl; }

static void api_cuda_close(HpcModel *m)
{
    ApiCuda *c = cuda_of(m);
    if (!c) return;
    if (c->opt_open) cuda_optim_free(&c->opt);
    if (c->ex_open) cuda_exec_free(&c->ex);
    if (c->dev_open) {
        c->dev.stream = c->own_stream;
        cuda_device_close(&c->dev);
    }
    free(c);
    m->impl = NULL;
}

static HpcStatus api_cuda_forward(HpcModel *m, const Batch *b, double *loss, float *logits, float *hidden,
                                  HpcError *err)
{
    ApiCuda *c = cuda_of(m);
    if (hidden)
        return hpc_fail(err, HPC_ERR_USAGE, "hpc_model_hidden: not available on the cuda backend "
                        "(open the model with HPC_BACKEND_CPU for hidden states)");
    CudaRunOptions o = {.training = false, .backward = false, .loss_scale = 1.0, .graph = c->graphs};
    HpcStatus st = cuda_exec_run(&c->ex, b, &o, err);
    if (!st && loss) st = cuda_exec_loss(&c->ex, loss, err);
    if (!st && logits) st = cuda_exec_read(&c->ex, m->prog.g.logits, logits, err);
    return st;
}

static HpcStatus api_cuda_train(HpcModel *m, const Batch *b, HpcStepReport *rep, HpcError *err)
{
    ApiCuda *c = cuda_of(m);
    CudaRunOptions o = {.training = true, .backward = true, .seed = m->spec.train.seed, .step = c->micro,
                        .loss_scale_dev = cuda_optim_scale_ptr(&c->opt), .graph = c->graphs};
    HpcStatus st = cuda_exec_run(&c->ex, b, &o, err);
    double loss = 0;
    KemitOptState s;
    if (!st) st = cuda_optim_accumulate(&c->opt, 0, err);
    if (!st) st = cuda_optim_step(&c->opt, err);
    if (!st) st = cuda_exec_loss(&c->ex, &loss, err);
    if (!st) st = cuda_optim_read_state(&c->opt, &s, err);
    if (st) return st;
    c->micro++;
    m->steps = s.step;
    m->loss_scale = s.scale;
    *rep = (HpcStepReport){.loss = loss, .lr = s.lr, .loss_scale = s.scale, .grad_norm = s.grad_norm,
                           .skipped = s.found_inf != 0, .step = s.step};
    int64_t max_skips = c->lc.max_consecutive_skips;
    if (max_skips > 0 && s.consecutive_skips >= max_skips)
        return hpc_fail(err, HPC_ERR_NUMERIC, "hpc_model_train_step: %lld consecutive steps overflowed "
                        "(loss scale %g); the model produces inf/NaN gradients at any scale — lower the "
                        "learning rate or use fp32/bf16", (long long)s.consecutive_skips, (double)s.scale);
    return HPC_OK;
}

static HpcStatus api_cuda_get_param(HpcModel *m, int p, float *out, HpcError *err)
{
    return cuda_optim_read_master(&cuda_of(m)->opt, p, out, err);
}

/* New weights: upload, then a fresh optimizer (zero moments, step 0, the
 * initial loss scale). */
static HpcStatus api_cuda_set_params(HpcModel *m, float *const *w, HpcError *err)
{
    ApiCuda *c = cuda_of(m);
    HpcStatus st = cuda_exec_set_params(&c->ex, w, err);
    if (st) return st;
    cuda_optim_free(&c->opt);
    c->opt_open = false;
    st = cuda_optim_init(&c->opt, &c->ex, &m->spec, m->policy, m->total_steps, err);
    if (st) return st;
    c->opt_open = true;
    m->steps = 0;
    m->loss_scale = c->lc.mode == LOSS_SCALE_NONE ? 1.0 : c->lc.init;
    return HPC_OK;
}

static const ApiBackendOps api_cuda_ops = {
    .name = "cuda",
    .forward = api_cuda_forward,
    .train = api_cuda_train,
    .get_param = api_cuda_get_param,
    .set_params = api_cuda_set_params,
    .close = api_cuda_close,
};

/* The initial weights (runtime/train/init.h, the spec's seed), uploaded. */
static HpcStatus upload_initial(HpcModel *m, ApiCuda *c, HpcError *err)
{
    ParamStore ps;
    HpcStatus st = init_store(&ps, &m->prog.pl, m->spec.train.seed, err);
    if (st) return st;
    st = api_cuda_set_params(m, ps.w, err);
    init_store_free(&ps);
    return st;
}

/* The caller's HpcDeviceAllocator seen as an ArenaAllocator: device
 * pointers travel as void *, and every call gets the model's stream. */
static CUdeviceptr user_alloc(void *user, size_t bytes)
{
    ApiCuda *c = user;
    return (CUdeviceptr)(uintptr_t)c->user_alloc.alloc(c->user_alloc.user, bytes, (void *)c->dev.stream);
}

static void user_free(void *user, CUdeviceptr ptr)
{
    ApiCuda *c = user;
    c->user_alloc.free(c->user_alloc.user, (void *)(uintptr_t)ptr, (void *)c->dev.stream);
}

HpcStatus api_cuda_open(HpcModel *m, const HpcModelOptions *o, HpcError *err)
{
    if (o->allocator && (!o->allocator->alloc || !o->allocator->free))
        return hpc_fail(err, HPC_ERR_USAGE, "hpc_model_open: options.allocator needs both alloc and free");
    ApiCuda *c = xcalloc(1, sizeof *c);
    m->impl = c;
    m->ops = &api_cuda_ops;
    ls_config_from_spec(&c->lc, &m->spec.train);
    HpcStatus st = cuda_device_open(&c->dev, o->device, err);
    if (st) return st;
    c->dev_open = true;
    c->own_stream = c->dev.stream;
    c->graphs = o->cuda_stream == NULL;
    if (o->cuda_stream) c->dev.stream = (CUstream)o->cuda_stream;
    if (o->allocator) {
        c->user_alloc = *o->allocator;
        c->arena_alloc = (ArenaAllocator){.alloc = user_alloc, .free = user_free, .user = c};
        c->dev.allocator = &c->arena_alloc;
    }
    st = cuda_exec_init_kernels(&c->ex, &c->dev, &m->prog.g, &m->prog.pl, &m->prog.kernels, m->max_B,
                                m->max_L, err);
    if (st) return st;
    c->ex_open = true;
    st = cuda_optim_init(&c->opt, &c->ex, &m->spec, m->policy, m->total_steps, err);
    if (st) return st;
    c->opt_open = true;
    snprintf(m->backend_name, sizeof m->backend_name, "cuda (%.100s, sm_%d)", c->dev.name, c->dev.arch);
    return upload_initial(m, c, err);
}
