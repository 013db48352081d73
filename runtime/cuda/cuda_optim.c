/* runtime/cuda/cuda_optim.c — the device optimizer step; see cuda_optim.h. */
#include "cuda/cuda_optim.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "train/lossscale.h"
#include "cuda/nvrtc_compile.h"
#include "train/optim.h"
#include "train/schedule.h"

/* acc (n) f32 = (first ? 0 : acc) + g * mul: one micro-batch's share of
 * the mean gradient.  Any grid, 256 threads. */
static const char acc_source[] =
    "extern \"C\" __global__ void hpc_grad_accumulate(float *acc, const float *g, long long n,\n"
    "                                                 float mul, int first)\n"
    "{\n"
    "    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;\n"
    "         i += (long long)gridDim.x * blockDim.x) {\n"
    "        float v = g[i] * mul;\n"
    "        acc[i] = first ? v : acc[i] + v;\n"
    "    }\n"
    "}\n";

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static KemitDtype kemit_dtype_of(SpecPrecision p)
{
    return p == PREC_FP16 ? KEMIT_F16 : p == PREC_BF16 ? KEMIT_BF16 : KEMIT_F32;
}

static HpcStatus load_module(CudaOptim *o, const char *src, const char *name, CUmodule *mod, HpcError *err)
{
    void *cubin = NULL;
    size_t size = 0;
    NvrtcCacheInfo info;
    HpcStatus st = nvrtc_compile_cached(src, name, o->ex->dev->arch, NULL, 0, &cubin, &size, &info, err);
    if (st) return st;
    st = CUDA_CHECK(err, cuda_driver()->cuModuleLoadData(mod, cubin));
    free(cubin);
    return st;
}

static HpcStatus get_fn(CUmodule m, const char *suffix, const char *base, CUfunction *f, HpcError *err)
{
    char name[128];
    if (suffix) kemit_name(suffix, base, name, sizeof name);
    else snprintf(name, sizeof name, "%s", base);
    return CUDA_CHECK(err, cuda_driver()->cuModuleGetFunction(f, m, name));
}

static HpcStatus compile_kernels(CudaOptim *o, const ModelSpec *spec, SpecPrecision policy, HpcError *err)
{
    KernelConfig kc;
    kemit_config_from_spec(&kc, spec, kemit_dtype_of(policy));
    char *src = NULL, suffix[KEMIT_SUFFIX_MAX];
    double t0 = now_seconds();
    HpcStatus st = kemit_source(&kc, &src, suffix, err);
    if (!st) st = load_module(o, src, "hpc_optimizer", &o->module, err);
    free(src);
    if (!st) st = load_module(o, acc_source, "hpc_grad_accumulate", &o->acc_module, err);
    if (!st) st = get_fn(o->module, suffix, "opt_check_norm", &o->check, err);
    if (!st) st = get_fn(o->module, suffix, "opt_lamb_norms", &o->lamb_norms, err);
    if (!st) st = get_fn(o->module, suffix, "opt_lamb_ratio", &o->lamb_ratio, err);
    if (!st) st = get_fn(o->module, suffix, "opt_update", &o->update, err);
    if (!st) st = get_fn(o->module, suffix, "opt_finish", &o->finish, err);
    if (!st) st = get_fn(o->acc_module, NULL, "hpc_grad_accumulate", &o->accumulate, err);
    o->compile_seconds = now_seconds() - t0;
    return st;
}

/* The schedule and scaler constants the kernels read by value. */
static void fill_params(CudaOptim *o, const SpecTraining *tr, int64_t total_steps, LossScaler *ls)
{
    ScheduleConfig sc;
    schedule_config_from_spec(&sc, tr, total_steps);
    LossScaleConfig lc;
    ls_config_from_spec(&lc, tr);
    ls_init(ls, &lc);
    o->prm = (KemitOptParams){
        .kind = tr->optimizer, .nesterov = tr->nesterov, .sched_kind = sc.kind, .ls_mode = lc.mode,
        .beta1 = tr->beta1, .beta2 = tr->beta2, .eps = tr->eps, .weight_decay = tr->weight_decay,
        .momentum = tr->momentum, .max_grad_norm = tr->max_grad_norm,
        .lr = sc.lr, .min_lr_ratio = sc.min_lr_ratio,
        .warmup_steps = sc.warmup_steps, .total_steps = sc.total_steps,
        .ls_growth = lc.growth, .ls_backoff = lc.backoff, .ls_interval = lc.interval,
    };
}

static HpcStatus zeroed(CudaOptim *o, CUdeviceptr *p, size_t bytes, const char *what, HpcError *err)
{
    HpcStatus st = arena_alloc(&o->ex->arena, p, bytes, what, err);
    return st ? st : CUDA_CHECK(err, cuda_driver()->cuMemsetD8Async(*p, 0, bytes, o->ex->dev->stream));
}

/* One KemitOptTensor per parameter with a gradient, state zeroed. */
static HpcStatus build_tensors(CudaOptim *o, SpecPrecision policy, const SpecTraining *tr, HpcError *err)
{
    const IrGraph *g = o->ex->g;
    const ParamList *pl = o->ex->pl;
    OptimConfig oc;
    optim_config_from_spec(&oc, tr);
    DType low = policy == PREC_FP16 ? DT_F16 : policy == PREC_BF16 ? DT_BF16 : DT_F32;
    o->param = xcalloc((size_t)pl->n + 1, sizeof *o->param);
    o->host_t = xcalloc((size_t)pl->n + 1, sizeof *o->host_t);
    o->acc = xcalloc((size_t)pl->n + 1, sizeof *o->acc);
    HpcStatus st = HPC_OK;
    for (int p = 0; p < pl->n && !st; p++) {
        if (g->param_grad[p] < 0) continue;
        HPC_ASSERT(pl->p[p].tied_to < 0);
        int64_t n = params_numel(&pl->p[p]);
        KemitOptTensor *t = &o->host_t[o->count];
        *t = (KemitOptTensor){.master = cuda_exec_param_ptr(o->ex, p, DT_F32),
                              .grad = cuda_exec_ptr(o->ex, g->param_grad[p]), .n = n,
                              .decay = pl->p[p].decay,
                              .low = low == DT_F32 ? 0 : cuda_exec_param_ptr(o->ex, p, low)};
        if (optim_needs_m(&oc)) st = zeroed(o, (CUdeviceptr *)&t->m, (size_t)n * 4, "optimizer m", err);
        if (!st && optim_needs_v(&oc)) st = zeroed(o, (CUdeviceptr *)&t->v, (size_t)n * 4, "optimizer v", err);
        if (!st && o->grad_accum > 1) {
            st = arena_alloc(&o->ex->arena, &o->acc[o->count], (size_t)n * 4, "gradient sum", err);
            t->grad = o->acc[o->count];
        }
        o->param[o->count++] = p;
    }
    return st;
}

static HpcStatus upload_tables(CudaOptim *o, const LossScaler *ls, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    CUstream s = o->ex->dev->stream;
    KemitOptState init = {.scale = (float)ls->scale};
    size_t tb = (size_t)(o->count > 0 ? o->count : 1) * sizeof(KemitOptTensor);
    HpcStatus st = arena_alloc(&o->ex->arena, &o->tensors, tb, "optimizer table", err);
    if (!st) st = arena_alloc(&o->ex->arena, &o->state, sizeof init, "optimizer state", err);
    if (!st) st = arena_alloc(&o->ex->arena, &o->part_sq, CUDA_OPTIM_PARTS * 8, "optimizer partials", err);
    if (!st) st = arena_alloc(&o->ex->arena, &o->part_inf, CUDA_OPTIM_PARTS * 4, "optimizer flags", err);
    if (!st && o->prm.kind == OPT_LAMB) {
        st = arena_alloc(&o->ex->arena, &o->part_pu, (size_t)(o->count + 1) * CUDA_OPTIM_PARTS * 16,
                         "LAMB partials", err);
        if (!st) st = arena_alloc(&o->ex->arena, &o->ratio, (size_t)(o->count + 1) * 4, "LAMB ratios", err);
    }
    if (!st && o->count) st = CUDA_CHECK(err, cu->cuMemcpyHtoDAsync(o->tensors, o->host_t, tb, s));
    if (!st) st = CUDA_CHECK(err, cu->cuMemcpyHtoDAsync(o->state, &init, sizeof init, s));
    return st ? st : CUDA_CHECK(err, cu->cuStreamSynchronize(s));
}

HpcStatus cuda_optim_init(CudaOptim *o, CudaExec *ex, const ModelSpec *spec, SpecPrecision policy,
                          int64_t total_steps, HpcError *err)
{
    memset(o, 0, sizeof *o);
    o->ex = ex;
    o->grad_accum = spec->train.grad_accum > 1 ? spec->train.grad_accum : 1;
    LossScaler ls;
    fill_params(o, &spec->train, total_steps, &ls);
    HpcStatus st = compile_kernels(o, spec, policy, err);
    if (!st) st = build_tensors(o, policy, &spec->train, err);
    if (!st) st = upload_tables(o, &ls, err);
    if (st) cuda_optim_free(o);
    return st;
}

void cuda_optim_free(CudaOptim *o)
{
    const CudaDriver *cu = cuda_driver();
    if (!o->ex) return;
    DeviceArena *a = &o->ex->arena;
    for (int i = 0; i < o->count; i++) {
        if (o->host_t[i].m) arena_release(a, o->host_t[i].m);
        if (o->host_t[i].v) arena_release(a, o->host_t[i].v);
        if (o->acc[i]) arena_release(a, o->acc[i]);
    }
    CUdeviceptr bufs[] = {o->tensors, o->state, o->part_sq, o->part_inf, o->part_pu, o->ratio};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) arena_release(a, bufs[i]);
    if (o->module && cu) cu->cuModuleUnload(o->module);
    if (o->acc_module && cu) cu->cuModuleUnload(o->acc_module);
    free(o->param);
    free(o->host_t);
    free(o->acc);
    memset(o, 0, sizeof *o);
}

HpcStatus cuda_optim_accumulate(CudaOptim *o, int64_t micro, HpcError *err)
{
    if (o->grad_accum <= 1) return HPC_OK;
    const IrGraph *g = o->ex->g;
    float mul = (float)(1.0 / (double)o->grad_accum);
    int first = micro == 0;
    HpcStatus st = HPC_OK;
    for (int i = 0; i < o->count && !st; i++) {
        CUdeviceptr grad = cuda_exec_ptr(o->ex, g->param_grad[o->param[i]]);
        long long n = o->host_t[i].n;
        unsigned blocks = (unsigned)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024);
        void *args[] = {&o->acc[i], &grad, &n, &mul, &first};
        st = cuda_launch(o->accumulate, (unsigned[3]){blocks, 1, 1}, (unsigned[3]){256, 1, 1}, 0,
                         o->ex->dev->stream, args, err);
    }
    return st;
}

HpcStatus cuda_optim_step(CudaOptim *o, HpcError *err)
{
    CUstream s = o->ex->dev->stream;
    const unsigned blk[3] = {256, 1, 1}, one[3] = {1, 1, 1};
    int parts = CUDA_OPTIM_PARTS;
    CUdeviceptr ratio = o->prm.kind == OPT_LAMB ? o->ratio : 0;
    void *check_args[] = {&o->part_sq, &o->part_inf, &o->tensors, &o->count, &o->state};
    HpcStatus st = cuda_launch(o->check, (unsigned[3]){CUDA_OPTIM_PARTS, 1, 1}, blk, 0, s, check_args, err);
    if (!st && o->prm.kind == OPT_LAMB) {
        void *norm_args[] = {&o->part_pu, &o->state, &o->tensors, &o->count, &o->part_sq,
                             &o->part_inf, &parts, &o->prm};
        void *ratio_args[] = {&o->ratio, &o->part_pu, &parts};
        st = cuda_launch(o->lamb_norms, (unsigned[3]){CUDA_OPTIM_PARTS, 1, 1}, blk, 0, s, norm_args, err);
        if (!st) st = cuda_launch(o->lamb_ratio, (unsigned[3]){(unsigned)o->count, 1, 1}, blk, 0, s,
                                  ratio_args, err);
    }
    void *upd_args[] = {&o->state, &o->tensors, &o->count, &o->part_sq, &o->part_inf, &parts,
                        &ratio, &o->prm};
    void *fin_args[] = {&o->state, &o->prm};
    if (!st) st = cuda_launch(o->update, (unsigned[3]){CUDA_OPTIM_UPDATE_BLOCKS, 1, 1}, blk, 0, s,
                              upd_args, err);
    if (!st) st = cuda_launch(o->finish, one, one, 0, s, fin_args, err);
    return st;
}

HpcStatus cuda_optim_poison(CudaOptim *o, HpcError *err)
{
    if (o->count == 0) return HPC_OK;
    return CUDA_CHECK(err, cuda_driver()->cuMemsetD32Async(o->host_t[0].grad, 0x7f800000u, 1,
                                                           o->ex->dev->stream));
}

CUdeviceptr cuda_optim_scale_ptr(const CudaOptim *o) { return o->state + offsetof(KemitOptState, scale); }
CUdeviceptr cuda_optim_state_ptr(const CudaOptim *o) { return o->state; }

HpcStatus cuda_optim_read_state(CudaOptim *o, KemitOptState *s, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    HpcStatus st = CUDA_CHECK(err, cu->cuMemcpyDtoHAsync(s, o->state, sizeof *s, o->ex->dev->stream));
    return st ? st : CUDA_CHECK(err, cu->cuStreamSynchronize(o->ex->dev->stream));
}

HpcStatus cuda_optim_read_master(CudaOptim *o, int p, float *out, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    size_t bytes = (size_t)params_numel(&o->ex->pl->p[p]) * 4;
    HpcStatus st = CUDA_CHECK(err, cu->cuMemcpyDtoHAsync(out, cuda_exec_param_ptr(o->ex, p, DT_F32), bytes,
                                                         o->ex->dev->stream));
    return st ? st : CUDA_CHECK(err, cu->cuStreamSynchronize(o->ex->dev->stream));
}
