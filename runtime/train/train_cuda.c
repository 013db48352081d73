/* runtime/train/train_cuda.c — the cuda training backend: the step on the GPU
 * (runtime/cuda/cuda_exec.h), the optimizer and loss scaler on the GPU
 * (runtime/cuda/cuda_optim.h), per-step records kept on the device until
 * collect (train_backend.h).  The last micro-batch of a step is uploaded
 * by micro() and run by step(), with the optimizer captured into the same
 * CUDA graph (cuda_optim_step_tail).  A step queues work and returns: the loss
 * scale reaches the backward pass by a device copy, the learning rate is
 * computed on the device from the applied-step count, and each step's loss
 * and optimizer state are copied into device rings.
 *
 * Progress without stalling: each step ends with an async copy of its ring
 * slot into page-locked host memory and an event after it; poll asks the
 * events of the oldest unread steps (cuEventQuery, which never waits) and
 * hands out the records whose copies have landed, timed by the device's
 * own clock (cuEventElapsedTime).  Slots are reused round the ring
 * (slot = step % TRAIN_STAT_RING); at most TRAIN_STAT_RING - 1 steps are
 * unread, so the end event of the step before the oldest unread one is
 * still valid as its start time.
 *
 * Data parallel (set_dist, an NCCL Collectives): the last micro-batch runs
 * with its accumulation only, then every gradient is averaged over the ranks
 * on the backend's stream (ncclAvg, one call per tensor, after the whole
 * backward: no overlap yet), then the optimizer step runs as usual.  The
 * optimizer's own check agrees found_inf without another collective: an
 * inf or NaN in any rank's gradient stays non-finite in the average every
 * rank receives, so every rank skips the same step, and the gradient norm
 * for clipping is the norm of the same averaged gradient on every rank.
 * The poison hook therefore writes its inf before the reduction.
 *
 * For the C API (train_backend_open_with's options): the caller's stream
 * replaces the device's own for every launch and copy (CUDA graphs are then
 * off), and the caller's device allocator serves the executor's arena and
 * every buffer beside it; cuBLASLt's workspace (what its chosen algorithms
 * need, up to 32 MiB) and the loaded modules still come from the driver. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_threads.h"
#include "cuda/cuda_exec.h"
#include "cuda/cuda_optim.h"
#include "cuda/nvrtc_compile.h"
#include "data/batch.h"
#include "dist/collectives.h"
#include "dist/rendezvous.h"
#include "train/lossscale.h"
#include "train/train_backend.h"
#include "util/phase_clock.h"

typedef struct {
    CudaDevice dev;
    bool dev_open;
    CudaExec ex;
    bool ex_open;
    CudaOptim opt;
    bool opt_open;
    int64_t accum;             /* micro-batches per step (ring row width) */
    uint32_t micro;            /* micro-steps so far: the dropout step */
    int64_t steps;             /* optimizer steps queued (counting resumed ones) */
    int64_t read;              /* steps whose records were handed out */
    CUdeviceptr loss_ring;     /* (RING, accum) f32 micro-batch losses */
    CUdeviceptr state_ring;    /* (RING) CudaOptState after each step */
    float *host_loss;          /* (RING * accum) page-locked copy of loss_ring */
    CudaOptState *host_state; /* (RING) page-locked copy of state_ring */
    CUevent begin[TRAIN_STAT_RING]; /* per slot: before the step's first micro-batch */
    CUevent end[TRAIN_STAT_RING];   /* per slot: after the copy of the step's record */
    bool chained[TRAIN_STAT_RING];  /* only training ran since the previous step's end */
    bool chain_next;           /* the next step follows the last one directly */
    CudaRunOptions staged;     /* the last micro-batch, uploaded, run by step() */
    bool has_staged;
    float *logits;             /* eval: (B, C) f32 */
    size_t logits_cap;
    bool profile;              /* HPC_STARTUP or HPC_PROFILE: report the cold start after step 1 */
    Collectives *coll;         /* data parallel over NCCL (set_dist), else NULL */
    bool graphs;               /* steps captured as CUDA graphs (not on a caller's stream) */
    CUstream own_stream;       /* the device's stream, restored before close */
    TrainDeviceAllocator user_alloc; /* the caller's allocator (alloc NULL: none) */
    ArenaAllocator arena_alloc;      /* adapts it for runtime/cuda/device_arena.h */
} CudaTrain;

/* HPC_STARTUP=1 (or HPC_PROFILE=1, whose eager per-node timing slows step
 * 1): after the first optimizer step (waits for it). */
static void report_cold_start(CudaTrain *t)
{
    t->profile = false;
    if (cuda_driver()->cuStreamSynchronize(t->dev.stream) != CUDA_SUCCESS) return;
    phase_mark("step 1 on the device (the wait for its end)");
    phase_clock_print(stderr);   /* where the time below went, phase by phase */
    NvrtcStats s;
    nvrtc_compile_stats(&s);
    fprintf(stderr, "hpc profile: cold start %.2f s from process start to the end of step 1; "
            "NVRTC %ld compile(s) in %.2f s, %ld kernel cache hit(s); step module %s in %.3f s; "
            "GEMM autotune %d shape(s) timed, %d from the cache, %d from their class\n",
            phase_clock_process_age(), s.compiles, s.compile_seconds, s.cache_hits,
            t->ex.cubin_from_program ? "the program's cubin" : t->ex.cache_hit ? "from the cache" : "compiled",
            t->ex.compile_seconds, t->ex.gemm.tuned, t->ex.gemm.tune_hits, t->ex.gemm.tune_class_hits);
}

static CudaTrain *impl(TrainBackend *b) { return b->impl; }

static void cuda_close(TrainBackend *b)
{
    CudaTrain *t = impl(b);
    if (!t) return;
    /* queued copies may still target the page-locked records (an error path) */
    if (t->dev_open) cuda_driver()->cuStreamSynchronize(t->dev.stream);
    if (t->loss_ring) arena_release(&t->ex.arena, t->loss_ring);
    if (t->state_ring) arena_release(&t->ex.arena, t->state_ring);
    for (int i = 0; i < TRAIN_STAT_RING; i++) {
        if (t->begin[i]) cuda_driver()->cuEventDestroy(t->begin[i]);
        if (t->end[i]) cuda_driver()->cuEventDestroy(t->end[i]);
    }
    if (t->host_loss) cuda_driver()->cuMemFreeHost(t->host_loss);
    if (t->host_state) cuda_driver()->cuMemFreeHost(t->host_state);
    if (t->opt_open) cuda_optim_free(&t->opt);
    if (t->ex_open) cuda_exec_free(&t->ex);
    if (t->dev_open) {
        t->dev.stream = t->own_stream;
        cuda_device_close(&t->dev);
    }
    free(t->logits);
    free(t);
    b->impl = NULL;
}

/* The micro-batch's loss into its slot of this step's ring row. */
static HpcStatus copy_loss(TrainBackend *b, int64_t m, HpcError *err)
{
    CudaTrain *t = impl(b);
    int ring = (int)(t->steps % TRAIN_STAT_RING);
    CUdeviceptr slot = t->loss_ring + (CUdeviceptr)(((int64_t)ring * t->accum + m) * 4);
    return CUDA_CHECK(err, cuda_driver()->cuMemcpyDtoDAsync(slot, cuda_exec_ptr(&t->ex, b->g.loss), 4,
                                                            t->dev.stream));
}

/* Micro-batches before the last run now, each with its gradient
 * accumulation as the graph's tail; the last is only staged (uploaded) and
 * runs in cuda_step with the optimizer inside its graph. */
static HpcStatus cuda_micro(TrainBackend *b, const Batch *batch, int64_t m, HpcError *err)
{
    CudaTrain *t = impl(b);
    if (m >= t->accum)
        return hpc_fail(err, HPC_ERR_USAGE, "trainer: micro-batch %lld of a step with grad_accum %lld",
                        (long long)m, (long long)t->accum);
    int ring = (int)(t->steps % TRAIN_STAT_RING);
    HpcStatus st = HPC_OK;
    if (t->profile && t->steps == 0 && m == 0) phase_mark("trainer work before step 1 (data, batches)");
    if (m == 0) {
        t->chained[ring] = t->chain_next;
        st = CUDA_CHECK(err, cuda_driver()->cuEventRecord(t->begin[ring], t->dev.stream));
    }
    CudaRunOptions o = {.training = true, .backward = true, .seed = b->spec->train.seed,
                        .step = t->micro++, .loss_scale_dev = cuda_optim_scale_ptr(&t->opt),
                        .graph = t->graphs};
    if (st) return st;
    if (m == t->accum - 1) {   /* staged: runs in cuda_step with the optimizer in its graph */
        st = cuda_exec_stage(&t->ex, batch, &o, err);
        if (!st) {
            t->staged = o;
            t->has_staged = true;
        }
        return st;
    }
    o.tail = cuda_optim_accumulate_tail(&t->opt, m);
    st = cuda_exec_run(&t->ex, batch, &o, err);
    return st ? st : copy_loss(b, m, err);
}

/* Data parallel: the last micro-batch, the gradients (and the step's
 * losses) averaged over the ranks, then the optimizer (see the top). */
static HpcStatus reduced_step(TrainBackend *b, bool poison, int ring, HpcError *err)
{
    CudaTrain *t = impl(b);
    HpcStatus st = HPC_OK;
    if (t->has_staged) {
        CudaRunOptions o = t->staged;
        o.tail = cuda_optim_accumulate_tail(&t->opt, t->accum - 1);
        t->has_staged = false;
        st = cuda_exec_launch(&t->ex, &o, err);
        if (!st) st = copy_loss(b, t->accum - 1, err);
    }
    if (!st && poison && t->opt.count > 0)   /* +inf as f32 bits */
        st = CUDA_CHECK(err, cuda_driver()->cuMemsetD32Async(t->opt.host_t[0].grad, 0x7f800000u, 1, t->dev.stream));
    for (int i = 0; !st && i < t->opt.count; i++)
        st = coll_nccl_mean_f32(t->coll, (float *)(uintptr_t)t->opt.host_t[i].grad, t->opt.host_t[i].n, err);
    CUdeviceptr losses = t->loss_ring + (CUdeviceptr)((size_t)ring * (size_t)t->accum * 4);
    if (!st) st = coll_nccl_mean_f32(t->coll, (float *)(uintptr_t)losses, t->accum, err);
    if (!st) st = cuda_optim_step(&t->opt, err);
    return st;
}

static HpcStatus cuda_step(TrainBackend *b, bool poison, HpcError *err)
{
    CudaTrain *t = impl(b);
    const CudaDriver *cu = cuda_driver();
    if (t->steps - t->read >= TRAIN_STAT_RING - 1)
        return hpc_fail(err, HPC_ERR_INTERNAL, "trainer: %d steps without collect", TRAIN_STAT_RING - 1);
    int ring = (int)(t->steps % TRAIN_STAT_RING);
    HpcStatus st = t->coll ? reduced_step(b, poison, ring, err) : poison ? cuda_optim_poison(&t->opt, err) : HPC_OK;
    if (t->coll) {
        /* reduced_step ran the micro-batch, the reduction and the optimizer */
    } else if (!st && t->has_staged) {   /* the last micro-batch, then the optimizer, as one graph */
        CudaRunOptions o = t->staged;
        o.tail = cuda_optim_step_tail(&t->opt);
        t->has_staged = false;
        st = cuda_exec_launch(&t->ex, &o, err);
        if (!st) st = copy_loss(b, t->accum - 1, err);
    } else if (!st) {
        st = cuda_optim_step(&t->opt, err);
    }
    CUdeviceptr slot = t->state_ring + (CUdeviceptr)((size_t)ring * sizeof(CudaOptState));
    if (!st) st = CUDA_CHECK(err, cu->cuMemcpyDtoDAsync(slot, cuda_optim_state_ptr(&t->opt),
                                                        sizeof(CudaOptState), t->dev.stream));
    /* the record to the host now, so that reading it later needs no wait */
    size_t row = (size_t)t->accum * 4;
    if (!st) st = CUDA_CHECK(err, cu->cuMemcpyDtoHAsync(t->host_loss + (size_t)ring * (size_t)t->accum,
                                                        t->loss_ring + (CUdeviceptr)((size_t)ring * row), row,
                                                        t->dev.stream));
    if (!st) st = CUDA_CHECK(err, cu->cuMemcpyDtoHAsync(t->host_state + ring, slot, sizeof(CudaOptState),
                                                        t->dev.stream));
    if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(t->end[ring], t->dev.stream));
    if (t->profile && t->steps == 0) {
        long calls;
        double secs;
        cuda_launch_stats(&calls, &secs);
        phase_markf("step 1 queued by the host (eager; GEMM autotune %d timed / %d cached / %d by class; all our "
                    "launches so far: %ld in %.3f s)", t->ex.gemm.tuned, t->ex.gemm.tune_hits,
                    t->ex.gemm.tune_class_hits, calls, secs);
    }
    if (!st) {
        t->steps++;
        t->chain_next = true;
    }
    return st;
}

/* Step t->read + 1's record (its events have completed). */
static HpcStatus take_record(CudaTrain *t, TrainStepStat *out, HpcError *err)
{
    int ring = (int)(t->read % TRAIN_STAT_RING);
    bool chained = t->chained[ring] && t->read > 0;
    CUevent from = chained ? t->end[(ring + TRAIN_STAT_RING - 1) % TRAIN_STAT_RING] : t->begin[ring];
    float ms = 0;
    HpcStatus st = CUDA_CHECK(err, cuda_driver()->cuEventElapsedTime(&ms, from, t->end[ring]));
    if (st) return st;
    const CudaOptState *s = &t->host_state[ring];
    double sum = 0;
    for (int64_t m = 0; m < t->accum; m++) sum += t->host_loss[(int64_t)ring * t->accum + m];
    *out = (TrainStepStat){.step = ++t->read, .loss = sum / (double)t->accum, .lr = s->lr,
                           .loss_scale = s->scale, .grad_norm = s->grad_norm, .skipped = s->found_inf != 0,
                           .total_skips = s->total_skips, .consecutive_skips = s->consecutive_skips,
                           .seconds = 1e-3 * (double)ms};
    return HPC_OK;
}

/* The unread records in order: all of them, waiting for the device (wait),
 * or those of the steps it has finished (never waits). */
static HpcStatus read_records(TrainBackend *b, TrainStepStat *out, int max, int *n, bool wait, HpcError *err)
{
    CudaTrain *t = impl(b);
    const CudaDriver *cu = cuda_driver();
    *n = 0;
    if (wait && max < t->steps - t->read)
        return hpc_fail(err, HPC_ERR_USAGE, "trainer: collect wants room for %lld steps",
                        (long long)(t->steps - t->read));
    HpcStatus st = HPC_OK;
    while (!st && t->read < t->steps && *n < max) {
        CUevent done = t->end[t->read % TRAIN_STAT_RING];
        if (wait) {
            st = CUDA_CHECK(err, cu->cuEventSynchronize(done));
        } else {
            CUresult r = cu->cuEventQuery(done);
            if (r == CUDA_ERROR_NOT_READY) break;
            st = CUDA_CHECK(err, r);
        }
        if (!st) st = take_record(t, &out[(*n)++], err);
    }
    if (!st && t->profile) report_cold_start(t);
    return st;
}

/* The one place the backend waits for the GPU during training. */
static HpcStatus cuda_collect(TrainBackend *b, TrainStepStat *out, int max, int *n, HpcError *err)
{
    CudaTrain *t = impl(b);
    /* data parallel: a bounded wait first, so a dead peer is an error, not a hang */
    HpcStatus st = t->coll ? coll_nccl_wait(t->coll, err) : HPC_OK;
    return st ? st : read_records(b, out, max, n, true, err);
}

static HpcStatus cuda_set_dist(TrainBackend *b, Collectives *coll, bool zero1, HpcError *err)
{
    if (strcmp(coll->kind, "nccl") != 0)
        return hpc_fail(err, HPC_ERR_USAGE, "trainer: the cuda backend reduces over NCCL, not %s collectives",
                        coll->kind);
    if (zero1)
        return hpc_fail(err, HPC_ERR_USAGE, "trainer: ZeRO-1 is not built for the cuda backend yet; train "
                        "with the optimizer state replicated");
    impl(b)->coll = coll;
    return HPC_OK;
}

static HpcStatus cuda_poll(TrainBackend *b, TrainStepStat *out, int max, int *n, HpcError *err)
{
    return read_records(b, out, max, n, false, err);
}

static HpcStatus cuda_forward(TrainBackend *b, const Batch *batch, double *loss, const float **logits,
                              HpcError *err)
{
    CudaTrain *t = impl(b);
    t->chain_next = false;   /* the next step's time starts at its own start */
    if (t->has_staged)
        return hpc_fail(err, HPC_ERR_USAGE, "trainer: evaluation between a step's last micro-batch and its "
                        "optimizer step; call step first");
    CudaRunOptions o = {.training = false, .backward = false, .loss_scale = 1.0};
    HpcStatus st = cuda_exec_run(&t->ex, batch, &o, err);
    if (!st) st = cuda_exec_loss(&t->ex, loss, err);
    if (st || !logits) return st;
    *logits = NULL;
    if (b->g.logits < 0) return HPC_OK;
    size_t need = (size_t)ir_numel(&b->g.nodes[b->g.logits], batch->B, batch->L) * sizeof(float);
    if (need > t->logits_cap) {
        free(t->logits);
        t->logits = xmalloc(need);
        t->logits_cap = need;
    }
    st = cuda_exec_read(&t->ex, b->g.logits, t->logits, err);
    if (!st) *logits = t->logits;
    return st;
}

static HpcStatus cuda_read_param(TrainBackend *b, int p, float *out, HpcError *err)
{
    int q = b->pl.p[p].tied_to >= 0 ? b->pl.p[p].tied_to : p;
    impl(b)->chain_next = false;
    return cuda_optim_read_master(&impl(b)->opt, q, out, err);
}

/* The arena's peak plus the cuBLASLt workspace the chosen algorithms hold
 * (outside the arena; runtime/cuda/gemm_cublas.h): what the memory check
 * predicts (train/memcheck.c).  On an H200 at BERT-base B32 L128 fp16
 * (bench/mem_probe.c, before the workspace was sized to the algorithms):
 * arena peak 2553.8 MiB + 32 MiB workspace, the device 2598 MiB above the
 * bare context. */
static double cuda_peak_bytes(TrainBackend *b)
{
    ArenaStats s;
    arena_stats(&impl(b)->ex.arena, &s);
    return (double)s.peak_bytes + (double)gemm_workspace_held(&impl(b)->ex.gemm);
}

/* m and v of every optimized tensor, device <-> host (to_host picks). */
static HpcStatus copy_moments(CudaTrain *t, const TrainState *ts, bool to_host, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    CUstream s = t->dev.stream;
    HpcStatus st = HPC_OK;
    for (int i = 0; i < t->opt.count && !st; i++) {
        const CudaOptTensor *k = &t->opt.host_t[i];
        int p = t->opt.param[i];
        size_t bytes = (size_t)k->n * sizeof(float);   // (n) f32 each
        float *hm = ts->m ? ts->m[p] : NULL, *hv = ts->v ? ts->v[p] : NULL;
        if (k->m && hm && to_host) st = CUDA_CHECK(err, cu->cuMemcpyDtoHAsync(hm, k->m, bytes, s));
        if (k->m && hm && !to_host) st = CUDA_CHECK(err, cu->cuMemcpyHtoDAsync(k->m, hm, bytes, s));
        if (!st && k->v && hv && to_host) st = CUDA_CHECK(err, cu->cuMemcpyDtoHAsync(hv, k->v, bytes, s));
        if (!st && k->v && hv && !to_host) st = CUDA_CHECK(err, cu->cuMemcpyHtoDAsync(k->v, hv, bytes, s));
    }
    return st ? st : CUDA_CHECK(err, cu->cuStreamSynchronize(s));
}

static HpcStatus cuda_state_out(TrainBackend *b, TrainState *ts, HpcError *err)
{
    CudaTrain *t = impl(b);
    t->chain_next = false;
    HpcStatus st = HPC_OK;
    for (int p = 0; p < b->pl.n && !st; p++)
        if (b->pl.p[p].tied_to < 0 && ts->w[p]) st = cuda_optim_read_master(&t->opt, p, ts->w[p], err);
    if (!st) st = copy_moments(t, ts, true, err);
    CudaOptState s;
    if (!st) st = cuda_optim_read_state(&t->opt, &s, err);
    if (st) return st;
    ts->opt.step = s.step;
    ts->ls.scale = s.scale;
    ts->ls.growth_tracker = s.growth_tracker;
    ts->ls.consecutive_skips = s.consecutive_skips;
    ts->ls.total_skips = s.total_skips;
    ts->micro_step = t->micro;
    return HPC_OK;
}

/* Masters through cuda_exec_set_params (which also rewrites the 16-bit
 * copies), moments, then the device scaler state. */
static HpcStatus cuda_state_in(TrainBackend *b, const TrainState *ts, HpcError *err)
{
    CudaTrain *t = impl(b);
    if (ts->micro_step < 0 || ts->micro_step > (int64_t)UINT32_MAX)
        return hpc_fail(err, HPC_ERR_INPUT, "trainer: checkpoint micro-step %lld out of range",
                        (long long)ts->micro_step);
    HpcStatus st = cuda_exec_set_params(&t->ex, ts->w, err);
    if (!st) st = copy_moments(t, ts, false, err);
    CudaOptState s;
    if (!st) st = cuda_optim_read_state(&t->opt, &s, err);
    if (st) return st;
    s.step = ts->opt.step;
    s.scale = (float)ts->ls.scale;
    s.growth_tracker = (int32_t)ts->ls.growth_tracker;
    s.consecutive_skips = ts->ls.consecutive_skips;
    s.total_skips = ts->ls.total_skips;
    /* On the step's stream, then waited for: a plain cuMemcpyHtoD runs on the
     * legacy stream, which does not order against our non-blocking one, and
     * s lives on this stack frame. */
    st = CUDA_CHECK(err, cuda_driver()->cuMemcpyHtoDAsync(cuda_optim_state_ptr(&t->opt), &s, sizeof s, t->dev.stream));
    if (!st) st = CUDA_CHECK(err, cuda_driver()->cuStreamSynchronize(t->dev.stream));
    if (st) return st;
    t->micro = (uint32_t)ts->micro_step;
    t->steps = t->read = ts->step;   /* nothing unread: the trainer collected before */
    t->chain_next = false;
    return HPC_OK;
}

/* New masters (cuda_exec_set_params also rewrites the 16-bit copies), zero
 * moments and the optimizer state of a new run. */
static HpcStatus cuda_set_weights(TrainBackend *b, float *const *w, HpcError *err)
{
    CudaTrain *t = impl(b);
    const CudaDriver *cu = cuda_driver();
    if (t->coll || t->has_staged || t->read != t->steps)
        return hpc_fail(err, HPC_ERR_USAGE, "trainer: new weights in the middle of a step, with records "
                        "uncollected, or under data parallel");
    HpcStatus st = cuda_exec_set_params(&t->ex, w, err);
    for (int i = 0; i < t->opt.count && !st; i++) {
        const CudaOptTensor *k = &t->opt.host_t[i];
        if (k->m) st = CUDA_CHECK(err, cu->cuMemsetD32Async(k->m, 0, (size_t)k->n, t->dev.stream));
        if (!st && k->v) st = CUDA_CHECK(err, cu->cuMemsetD32Async(k->v, 0, (size_t)k->n, t->dev.stream));
    }
    LossScaleConfig lc;
    LossScaler ls;
    ls_config_from_spec(&lc, &b->spec->train);
    ls_init(&ls, &lc);
    CudaOptState s = {.scale = (float)ls.scale};   /* what cuda_optim_init starts from */
    if (!st) st = CUDA_CHECK(err, cu->cuMemcpyHtoDAsync(cuda_optim_state_ptr(&t->opt), &s, sizeof s, t->dev.stream));
    if (!st) st = CUDA_CHECK(err, cu->cuStreamSynchronize(t->dev.stream));
    if (st) return st;
    t->steps = t->read = 0;
    t->chain_next = false;
    return HPC_OK;
}

/* The caller's TrainDeviceAllocator seen as an ArenaAllocator: device
 * pointers travel as void *, and every call gets the backend's stream. */
static CUdeviceptr user_alloc(void *user, size_t bytes)
{
    CudaTrain *t = user;
    return (CUdeviceptr)(uintptr_t)t->user_alloc.alloc(t->user_alloc.user, bytes, (void *)t->dev.stream);
}

static void user_free(void *user, CUdeviceptr ptr)
{
    CudaTrain *t = user;
    t->user_alloc.free(t->user_alloc.user, (void *)(uintptr_t)ptr, (void *)t->dev.stream);
}

static HpcStatus alloc_rings(CudaTrain *t, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    void *hl = NULL, *hs = NULL;
    HpcStatus st = CUDA_CHECK(err, cu->cuMemAllocHost(&hl, (size_t)(TRAIN_STAT_RING * t->accum) * 4));
    t->host_loss = hl;
    if (!st) st = CUDA_CHECK(err, cu->cuMemAllocHost(&hs, TRAIN_STAT_RING * sizeof(CudaOptState)));
    t->host_state = hs;
    for (int i = 0; i < TRAIN_STAT_RING && !st; i++) {
        st = CUDA_CHECK(err, cu->cuEventCreate(&t->begin[i], CU_EVENT_DEFAULT));
        if (!st) st = CUDA_CHECK(err, cu->cuEventCreate(&t->end[i], CU_EVENT_DEFAULT));
    }
    if (!st) st = arena_alloc(&t->ex.arena, &t->loss_ring, (size_t)(TRAIN_STAT_RING * t->accum) * 4,
                              "step losses", err);
    return st ? st : arena_alloc(&t->ex.arena, &t->state_ring, TRAIN_STAT_RING * sizeof(CudaOptState),
                                 "step records", err);
}

/* cuBLASLt's first-use costs of the warm-up pass, ahead of it and on
 * several threads (cuda/gemm_cublas.h, gemm_prime): a pass that records
 * the GEMM calls without queueing them (our kernels run as usual), then
 * the plans made and every GEMM kernel launched once, at the same time.
 * HPC_GEMM_PRIME_THREADS: how many threads (default: 8, or the cores if
 * fewer; 0: none, the warm-up pass pays the costs one GEMM after another).
 * On the H200 host, warm caches: the pass's 0.20-0.25 s in cuBLASLt became
 * 0.09-0.10 s of waiting, with the threads running beside
 * gemm_library_warm_start (0.10-0.16 s, almost all of it cuBLASLt's first
 * query). */
static HpcStatus prime_gemms(CudaTrain *t, const Batch *batch, const CudaRunOptions *o, HpcError *err)
{
    const char *env = getenv("HPC_GEMM_PRIME_THREADS");
    int cores = cpu_threads_count(), threads = env && *env ? atoi(env) : cores < 8 ? cores : 8;
    if (threads <= 0) return HPC_OK;
    t->ex.gemm.record_only = true;
    HpcStatus st = cuda_exec_run(&t->ex, batch, o, err);
    t->ex.gemm.record_only = false;
    phase_mark("GEMM calls of the warm-up pass recorded (plans with a cached algorithm left to the threads)");
    GemmPrimeStats ps;
    if (!st) st = gemm_prime(&t->ex.gemm, t->dev.ctx, threads, &ps, err);
    if (!st)
        phase_markf("GEMM plans and first calls ahead: %d first calls on %d thread(s), %d plans made there, "
                    "%d here; the slowest thread's set-up %.3f s, plans %.3f s, first calls %.3f s",
                    ps.calls, ps.threads, ps.made, ps.made_here, ps.setup, ps.making, ps.launching);
    return st;
}

/* Step 1's first-time costs (cuBLASLt's first calls and the loading of
 * its kernels, the GEMM plans and choices, the first launch of each of our
 * kernels) paid while the parameters are drawn and uploaded: one forward
 * and backward pass at the run's bounds, with dropout, on whatever the
 * buffers hold.  Its results are never read: it writes only the arena (no
 * parameter, optimizer state, counter or record changes), and it is
 * outside any CUDA graph (tail_key 0: step 1's own graph slot stays
 * untouched).  Skipped under HPC_PROFILE (its per-node table would print
 * for it) and with HPC_WARMUP=0. */
static HpcStatus warm_up(TrainBackend *b, CudaTrain *t, int64_t B, int64_t L, HpcError *err)
{
    const char *prof = getenv("HPC_PROFILE");
    if (prof && *prof && strcmp(prof, "0") != 0) return HPC_OK;
    long calls0;
    double secs0;
    cuda_launch_stats(&calls0, &secs0);
    bool packed = b->spec->train.pack;   /* a packed program reads seq_spans (docs/packing.md) */
    Batch *batch = packed ? batch_new_packed(B, L, 1) : batch_new(B, L, 1);
    if (!batch) return hpc_fail(err, HPC_ERR_OOM, "cuda backend: out of host memory for a %lld x %lld batch",
                                (long long)B, (long long)L);
    for (int64_t i = 0; i < B * L; i++) batch->attention_mask[i] = 1;   /* ids, types, labels: 0, valid */
    for (int64_t r = 0; packed && r < B; r++) {   /* every slot used: sequence r is slots [r L, r L + L) */
        batch->seq_spans[2 * r] = (int32_t)(r * L);
        batch->seq_spans[2 * r + 1] = (int32_t)L;
    }
    CudaRunOptions o = {.training = true, .backward = true, .seed = b->spec->train.seed, .step = 0,
                        .loss_scale = 1.0};
    HpcStatus st = prime_gemms(t, batch, &o, err);
    if (!st) st = cuda_exec_run(&t->ex, batch, &o, err);
    batch_free(batch);   /* its bytes reached the driver: uploads from pageable memory are staged */
    long calls;
    double secs;
    cuda_launch_stats(&calls, &secs);
    phase_markf("warm-up pass (%lld x %lld: GEMM autotune %d timed / %d cached / %d by class; %ld of our launches "
                "in %.3f s, the rest cuBLASLt)", (long long)B, (long long)L, t->ex.gemm.tuned, t->ex.gemm.tune_hits,
                t->ex.gemm.tune_class_hits, calls - calls0, secs - secs0);
    return st;
}

/* The upload on a thread of its own, beside the warm-up pass: it waits for
 * the draws, then fills the staging buffers and queues the copies on the
 * run's stream (the context made current on it first).  Both queue on the
 * same stream in whatever order they come; the warm-up may read parameters
 * half uploaded, which is harmless (its results are never read), and
 * step 1 is queued after the join, so after every copy. */
typedef struct {
    TrainBackend *b;
    CudaTrain *t;
    HpcStatus st;
    HpcError err;
} UploadJob;

static void *upload_main(void *arg)
{
    UploadJob *j = arg;
    j->st = CUDA_CHECK(&j->err, cuda_driver()->cuCtxSetCurrent(j->t->dev.ctx));
    init_store_wait(&j->b->ps);
    if (!j->st) j->st = cuda_exec_set_params(&j->t->ex, j->b->ps.w, &j->err);
    return NULL;
}

/* An environment switch set to "0" (HPC_WARMUP, HPC_START_OVERLAP). */
static bool switched_off(const char *name)
{
    const char *v = getenv(name);
    return v && strcmp(v, "0") == 0;
}

static HpcStatus warm_up_and_upload(TrainBackend *b, CudaTrain *t, int64_t B, int64_t L, HpcError *err)
{
    UploadJob job = {.b = b, .t = t};
    pthread_t thread;
    bool apart = !switched_off("HPC_START_OVERLAP") && pthread_create(&thread, NULL, upload_main, &job) == 0;
    HpcStatus st = warm_up(b, t, B, L, err);
    if (apart) {
        pthread_join(thread, NULL);
    } else {   /* HPC_START_OVERLAP=0, or no thread to be had: one after the other */
        init_store_wait(&b->ps);
        if (!st) job.st = cuda_exec_set_params(&t->ex, b->ps.w, &job.err);
    }
    phase_mark("parameter init waited for and uploaded beside the warm-up pass (the upload's span above)");
    if (!st && job.st) {
        *err = job.err;
        st = job.st;
    }
    return st;
}

HpcStatus train_cuda_open(TrainBackend *b, int64_t total_steps, int64_t max_B, int64_t max_L,
                          const TrainBackendOptions *o, HpcError *err)
{
    CudaTrain *t = xcalloc(1, sizeof *t);
    b->impl = t;
    b->micro = cuda_micro;
    b->step = cuda_step;
    b->collect = cuda_collect;
    b->poll = cuda_poll;
    b->forward = cuda_forward;
    b->read_param = cuda_read_param;
    b->peak_bytes = cuda_peak_bytes;
    b->state_out = cuda_state_out;
    b->state_in = cuda_state_in;
    b->set_dist = cuda_set_dist;
    b->set_weights = cuda_set_weights;
    b->close = cuda_close;
    t->accum = b->spec->train.grad_accum > 1 ? b->spec->train.grad_accum : 1;
    const char *su = getenv("HPC_STARTUP"), *pr = getenv("HPC_PROFILE");
    t->profile = (su && *su && strcmp(su, "0") != 0) || (pr && *pr && strcmp(pr, "0") != 0);
    if (b->g.loss < 0 || b->g.nodes[b->g.loss].dtype != DT_F32)
        return hpc_fail(err, HPC_ERR_INTERNAL, "trainer: the graph's loss is not an f32 scalar");
    HpcStatus st = cuda_device_open(&t->dev, o->gpu >= 0 ? o->gpu : dist_gpu_ordinal(), err);
    if (st) return st;
    t->dev_open = true;
    cuda_kept_context_release();   /* the memory check's retain: this backend holds its own now */
    bool warm_up_pass = !switched_off("HPC_WARMUP");
    if (warm_up_pass && !switched_off("HPC_START_OVERLAP"))
        gemm_library_warm_start(t->dev.ctx);   /* beside the arena, module and optimizer set-up */
    phase_mark("CUDA driver, context and stream (cuda_device_open)");
    t->own_stream = t->dev.stream;
    t->graphs = o->cuda_stream == NULL;
    if (o->cuda_stream) t->dev.stream = (CUstream)o->cuda_stream;
    if (o->allocator) {
        t->user_alloc = *o->allocator;
        t->arena_alloc = (ArenaAllocator){.alloc = user_alloc, .free = user_free, .user = t};
        t->dev.allocator = &t->arena_alloc;
    }
    st = cuda_exec_init_kernels(&t->ex, &t->dev, &b->g, &b->pl, b->kernels, max_B, max_L, err);
    if (st) return st;
    t->ex_open = true;
    phase_mark("kernel lookups");
    st = cuda_optim_init(&t->opt, &t->ex, b->spec, b->policy, total_steps, err);
    if (st) return st;
    t->opt_open = true;
    phase_mark("optimizer: tables uploaded, m and v zeroed");
    NvrtcStats ns;
    nvrtc_compile_stats(&ns);   /* the step's module (the optimizer is part of it) */
    snprintf(b->name, sizeof b->name, "cuda (%.60s, sm_%d; kernels: %ld NVRTC compile(s) in %.1f s, %ld cached%s)",
             t->dev.name, t->dev.arch, ns.compiles, ns.compile_seconds, ns.cache_hits,
             t->ex.cubin_from_program ? ", step cubin from the artifact" : "");
    b->cuda_stream = t->dev.stream;
    st = alloc_rings(t, err);
    phase_mark("record rings and events");
    /* The warm-up pass with the upload beside it: step 1's first-call
     * costs (0.19-0.26 s of host time on the H200) and the wait for the
     * draws plus the upload (0.08 s) overlap, whether or not the draws are
     * still running.  HPC_WARMUP=0: neither, one after the other. */
    if (!st && warm_up_pass) return warm_up_and_upload(b, t, max_B, max_L, err);
    if (!st) phase_mark("no warm-up pass (HPC_WARMUP=0)");
    init_store_wait(&b->ps);   /* drawn on other threads meanwhile (train_backend.c) */
    phase_mark("parameter init: the wait for the draws");
    if (!st) st = cuda_exec_set_params(&t->ex, b->ps.w, err);
    phase_mark("parameter upload (f32 masters, 16-bit copies converted on the host; page-locked staging)");
    return st;
}
