/* runtime/train/train_backend.h — where a training step runs: the one
 * interface between the cpu and cuda executors and their two users, the
 * shared training loop (runtime/train/trainer.c) and the C API
 * (runtime/api/api.c, include/hpc.h).
 *
 * A backend owns the compiled graph, the parameters and the optimizer
 * state of one model and does these things:
 *   micro    forward + backward of one micro-batch; gradients of the step's
 *            micro-batches add up (the first overwrites);
 *   step     the optimizer step with the loss scaler (a skipped step
 *            changes nothing), lr from the schedule at the applied-step
 *            count; `poison` (test hook) first writes +inf into one
 *            gradient element, so the step must be skipped;
 *   collect  the records of the steps since the last collect, in order
 *            (the cuda backend waits here for the device to finish them);
 *   poll     (cuda only; NULL on the cpu) the records of the steps the
 *            device has already finished, without waiting: each step ends
 *            with an event and a copy of its record into page-locked host
 *            memory, and poll asks the events (cuEventQuery), so progress
 *            reports what the GPU has done, not what the host has queued;
 *   forward  evaluation: the loss and the (B, C) f32 logits of a batch
 *            (dropout off);
 *   read_value  (cpu only; NULL on cuda, whose step plan may reuse a value's
 *            memory once its readers ran) any value of the last forward;
 *   set_weights  new f32 masters; the optimizer starts over (zero moments,
 *            step 0, a fresh loss scaler) while the dropout stream goes on.
 * Backends: cpu (runtime/train/train_cpu.c: runtime/cpu/cpu_exec.h +
 * optim.h + lossscale.h on the host) and cuda (runtime/train/train_cuda.c:
 * runtime/cuda/cuda_exec.h + cuda_optim.h, nothing waits per step).
 * Both start from the same parameters (runtime/train/init.h, seeded by
 * spec->train.seed) and draw the same dropout masks (seed, micro-step), so
 * they train the same function.
 *
 * Linking: train_backend_open_program (train_backend_program.c) refers to
 * the cuda backend, so every program that calls it links the CUDA code.
 * train_backend_open_with takes the cuda backend's open function in its
 * options instead; the C API passes a weak reference there, so an API
 * program links the cuda backend only when it asks to
 * (-Wl,--undefined=train_cuda_open, docs/embedding.md).
 *
 * Ownership: train_backend_open_* fill *b; train_backend_close frees
 * everything they allocated.  The program (and its spec) is borrowed and
 * must outlive b.
 *
 * Usage:
 *   TrainBackend b;
 *   if (train_backend_open_program(&b, TRAIN_DEVICE_AUTO, &prog, total, B, L, &err)) ...
 *   b.micro(&b, batch, 0, &err); b.step(&b, false, &err);
 *   TrainStepStat st[64]; int n; b.collect(&b, st, 64, &n, &err);
 *   train_backend_close(&b);
 */
#ifndef HPC_RUNTIME_TRAIN_BACKEND_H
#define HPC_RUNTIME_TRAIN_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/batch.h"
#include "train/checkpoint.h"
#include "util/error.h"
#include "train/init.h"
#include "program/step_program.h"

struct Collectives;   /* runtime/dist/collectives.h */

typedef enum { TRAIN_DEVICE_CPU, TRAIN_DEVICE_CUDA, TRAIN_DEVICE_AUTO } TrainDevice;

/* Steps a backend remembers between two collects. */
#define TRAIN_STAT_RING 256

typedef struct {
    int64_t step;              /* 1-based optimizer step */
    double loss;               /* mean over the step's micro-batches */
    double lr;                 /* learning rate the step used */
    double loss_scale;         /* the scale after the step */
    double grad_norm;          /* unscaled, before clipping; inf when skipped */
    bool skipped;
    int64_t total_skips, consecutive_skips;
    double seconds;            /* how long the step took: cuda, on the device's clock
                                  (from the previous step's end, or from the step's own
                                  start after anything else ran); 0 when the backend
                                  does not time steps (cpu: the trainer times them) */
} TrainStepStat;

typedef struct TrainBackend TrainBackend;
struct TrainBackend {
    char name[160];            /* "cpu" or "cuda (NVIDIA H200, sm_90)" */
    TrainDevice device;        /* CPU or CUDA */
    const ModelSpec *spec;     /* borrowed */
    SpecPrecision policy;
    IrGraph g;                 /* the program's graph (the backend's own copy) */
    ParamList pl;
    const StepKernels *kernels;/* the program's launch records and CUDA (borrowed) */
    StepProgram *owned;        /* train_backend_open's compiled program, else NULL */
    ParamStore ps;             /* host parameters (initial values) */
    void *impl;                /* the backend's own state */
    void *cuda_stream;         /* cuda: the CUstream every step is queued on (for
                                  timing with events); NULL on the cpu */
    HpcStatus (*micro)(TrainBackend *b, const Batch *batch, int64_t m, HpcError *err);
    HpcStatus (*step)(TrainBackend *b, bool poison, HpcError *err);
    HpcStatus (*collect)(TrainBackend *b, TrainStepStat *out, int max, int *n, HpcError *err);
    HpcStatus (*poll)(TrainBackend *b, TrainStepStat *out, int max, int *n, HpcError *err);
    HpcStatus (*forward)(TrainBackend *b, const Batch *batch, double *loss, const float **logits,
                         HpcError *err);
    /* Parameter p's current f32 master, (numel) floats (waits). */
    HpcStatus (*read_param)(TrainBackend *b, int p, float *out, HpcError *err);
    /* Peak device bytes (0 on the cpu). */
    double (*peak_bytes)(TrainBackend *b);
    /* Checkpoints (runtime/train/checkpoint.h).  state_out copies the f32 masters,
     * m and v into ts->w/m/v (host (numel) f32 buffers in ParamList order;
     * NULL entries skipped) and fills ts->opt, ts->ls and ts->micro_step
     * (waits for the device); state_in sets all of that back (the scaler's
     * cfg stays the spec's; low-precision copies are rebuilt from the
     * masters) and makes ts->step the number of the last step taken.
     * NULL when the backend cannot checkpoint. */
    HpcStatus (*state_out)(TrainBackend *b, TrainState *ts, HpcError *err);
    HpcStatus (*state_in)(TrainBackend *b, const TrainState *ts, HpcError *err);
    /* Data parallel (runtime/dist/): from now on every step averages the
     * gradients over coll's ranks, agrees found_inf and the gradient norm,
     * and steps the optimizer replicated or, with zero1, ZeRO-1 sharded;
     * the step's logged loss is the mean over the ranks; state_out/state_in
     * stay whole-state (collective calls then: every rank makes them).
     * Call once, before the first step.  NULL when the backend has none. */
    HpcStatus (*set_dist)(TrainBackend *b, struct Collectives *coll, bool zero1, HpcError *err);
    /* Value v of the last forward, (numel at its B, L) f32 into out.  NULL
     * on cuda. */
    HpcStatus (*read_value)(TrainBackend *b, int v, float *out, HpcError *err);
    /* New masters from w ((pl.n) f32 buffers, tied entries ignored); zero
     * moments, optimizer step 0, the scaler at its initial scale, step
     * records counted from 0 again; the dropout stream continues.  Only
     * between steps (nothing uncollected), not after set_dist. */
    HpcStatus (*set_weights)(TrainBackend *b, float *const *w, HpcError *err);
    void (*close)(TrainBackend *b);
};

/* A caller's device memory, the shape of include/hpc.h's
 * HpcDeviceAllocator: alloc returns NULL when it cannot serve `bytes`;
 * every call gets the backend's CUstream. */
typedef struct {
    void *(*alloc)(void *user, size_t bytes, void *stream);
    void (*free)(void *user, void *ptr, void *stream);
    void *user;
} TrainDeviceAllocator;

typedef struct TrainBackendOptions TrainBackendOptions;
/* The cuda backend's open (train_cuda_open's type). */
typedef HpcStatus TrainCudaOpenFn(TrainBackend *b, int64_t total_steps, int64_t max_B, int64_t max_L,
                                  const TrainBackendOptions *o, HpcError *err);

/* How train_backend_open_with opens the cuda backend (zero = the trainer's
 * choices, except cuda_open). */
struct TrainBackendOptions {
    int gpu;                   /* device ordinal; -1: dist_gpu_ordinal() (0 unless one rank of several) */
    void *cuda_stream;         /* the caller's CUstream for every launch and copy (CUDA graphs are then
                                  off: it may be the legacy stream, which cannot be captured); NULL: the
                                  device's own */
    const TrainDeviceAllocator *allocator; /* serves the arena and every buffer beside it (parameters,
                                  optimizer state, step records); NULL: cuMemAlloc */
    TrainCudaOpenFn *cuda_open;/* the cuda backend; NULL when the program did not link it: cuda is then
                                  HPC_ERR_NO_GPU saying so, and auto takes the cpu */
};

/* Opens the backend on a step program (program/step_program.h; borrowed,
 * must outlive b; its spec is b->spec): initialises the parameters and
 * opens the backend for batches up to max_B x max_L.  Nothing is parsed,
 * lowered or generated: the cuda backend compiles the program's CUDA once
 * (or finds it in the kernel cache) for every B, L.  TRAIN_DEVICE_AUTO
 * takes GPU 0 when cuda_device_open succeeds, else the cpu; b->name says
 * which (and, with auto on the cpu, why not the GPU).  HPC_ERR_NO_GPU for
 * TRAIN_DEVICE_CUDA without a GPU. */
HpcStatus train_backend_open_program(TrainBackend *b, TrainDevice dev, const StepProgram *prog,
                                     int64_t total_steps, int64_t max_B, int64_t max_L, HpcError *err);

/* The same with the cuda backend's choices in o (the C API's road); dev is
 * TRAIN_DEVICE_CPU or TRAIN_DEVICE_CUDA (auto is the caller's to decide:
 * deciding needs the CUDA driver code). */
HpcStatus train_backend_open_with(TrainBackend *b, TrainDevice dev, const StepProgram *prog, int64_t total_steps,
                                  int64_t max_B, int64_t max_L, const TrainBackendOptions *o, HpcError *err);

/* The same from a checked spec: compiles it in-process first
 * (step_program_compile, compiler/step_program_build.h: lower -> autodiff
 * -> precision -> fuse, the fuse pass only when `fuse`); b owns that
 * program.  In train_backend_model.c, which links the compiler. */
HpcStatus train_backend_open(TrainBackend *b, TrainDevice dev, const ModelSpec *spec, SpecPrecision policy,
                             bool fuse, int64_t total_steps, int64_t max_B, int64_t max_L, HpcError *err);
void train_backend_close(TrainBackend *b);

/* "cpu", "cuda", "auto"; parse returns false for anything else. */
const char *train_device_name(TrainDevice d);
bool train_device_parse(const char *s, TrainDevice *d);

/* The backends' open functions (train_backend_open_with calls them after
 * the graph is copied and the parameters initialised). */
HpcStatus train_cpu_open(TrainBackend *b, int64_t total_steps, HpcError *err);
TrainCudaOpenFn train_cuda_open;

#endif
