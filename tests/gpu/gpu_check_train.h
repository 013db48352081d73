/* tests/gpu/gpu_check_train.h — a device trainer (an executor with its
 * optimizer as the step's tail, as runtime/train/train_cuda.c runs them)
 * for the GPU tests that train one way against another (gpu_opt_fix,
 * gpu_opt_early).
 *
 * Promises:
 *   - gpu_train_model(file, spec, p, w, uniform): models/FILE loaded, its
 *     fp16 step graph built into *p and random parameters drawn into *w
 *     (gpu_check_random_params); false, after a failed check, when either
 *     fails;
 *   - gpu_train_open(t, dev, spec, g, pl, B, L, w, env, value): an executor
 *     over g (bounds B, L) with the weights w, and its optimizer opened
 *     with the environment variable env set to value (NULL: unset; env is
 *     put back unset after); a failed check naming env=value and the error
 *     when either fails;
 *   - gpu_train_step(t, micro, accum, micro_step, loss): one optimizer step
 *     over accum micro-batches in CUDA graphs, the optimizer's tails after
 *     the runs; the loss of the last micro-batch;
 *   - gpu_train_both(a, b, micro, steps, accum, tag): both train `steps`
 *     steps on micro[s][0 .. accum) (accum at most 2), a check that every
 *     step's losses agree (relative 1e-3, NaN fails); false when a step
 *     failed;
 *   - gpu_train_change_error(a, b, w0, n, bitwise): the relative L2
 *     distance of the changes a - w0 and b - w0 (NaN where a value is not
 *     finite), and whether a and b are equal bit for bit;
 *   - gpu_train_compare_masters(a, b, pl, w, steps, tag): every master
 *     weight of a's optimizer against b's (their changes from w): a check
 *     that the worst relative L2 is at most 1e-3 (NaN fails), and on the
 *     emulator (HPC_CUDA_EMU set: one thread, no float atomics racing) one
 *     that all are equal bit for bit; on a GPU how many are, printed;
 *   - gpu_train_close(t) frees what gpu_train_open made.
 * Static functions; include after gpu_check.h and gpu_check_model.h in a
 * test's .c. */
#ifndef HPC_TESTS_GPU_CHECK_TRAIN_H
#define HPC_TESTS_GPU_CHECK_TRAIN_H

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_exec.h"
#include "cuda/cuda_optim.h"
#include "data/batch.h"
#include "pipeline.h"
#include "program/ir.h"
#include "program/params.h"
#include "program/spec.h"

static inline bool gpu_train_model(const char *file, ModelSpec *spec, Pipeline *p, float ***w,
                                   float (*uniform)(void))
{
    HpcError err = {0};
    if (!gpu_check_load_model(file, spec)) return false;
    PipeOptions po = pipeline_defaults(PREC_FP16);
    if (pipeline_build(spec, &po, p, &err)) {
        result(0, "%s fp16: build the graph: %s", file, err.msg);
        return false;
    }
    *w = gpu_check_random_params(&p->pl, PREC_FP16, uniform);
    return true;
}

typedef struct {
    CudaExec ex;
    CudaOptim opt;
    bool open_ex, open_opt;
} GpuTrainer;

static inline bool gpu_train_open(GpuTrainer *t, CudaDevice *dev, const ModelSpec *spec, const IrGraph *g,
                                  const ParamList *pl, int64_t B, int64_t L, float **w, const char *env,
                                  const char *value)
{
    HpcError err = {0};
    memset(t, 0, sizeof *t);
    HpcStatus st = cuda_exec_init(&t->ex, dev, g, pl, B, L, &err);
    t->open_ex = !st;
    if (!st) st = cuda_exec_set_params(&t->ex, w, &err);
    if (value) setenv(env, value, 1);
    if (!st) st = cuda_optim_init(&t->opt, &t->ex, spec, PREC_FP16, 100, &err);
    unsetenv(env);
    t->open_opt = !st;
    if (st) result(0, "open with %s=%s: %s", env, value ? value : "(unset)", err.msg);
    return !st;
}

static inline void gpu_train_close(GpuTrainer *t)
{
    if (t->open_opt) cuda_optim_free(&t->opt);
    if (t->open_ex) cuda_exec_free(&t->ex);
}

static inline bool gpu_train_step(GpuTrainer *t, Batch *const *micro, int accum, uint32_t *micro_step, double *loss)
{
    HpcError err = {0};
    HpcStatus st = HPC_OK;
    for (int m = 0; m < accum && !st; m++) {
        CudaRunOptions o = {.training = true, .backward = true, .seed = 11, .step = (*micro_step)++,
                            .loss_scale_dev = cuda_optim_scale_ptr(&t->opt), .graph = true,
                            .tail = m == accum - 1 ? cuda_optim_step_tail(&t->opt)
                                                   : cuda_optim_accumulate_tail(&t->opt, m)};
        st = cuda_exec_run(&t->ex, micro[m], &o, &err);
    }
    if (!st) st = cuda_exec_loss(&t->ex, loss, &err);
    if (st) result(0, "train step: %s", err.msg);
    return !st;
}

static inline bool gpu_train_both(GpuTrainer *a, GpuTrainer *b, Batch *const micro[][2], int steps, int accum,
                                  const char *tag)
{
    uint32_t ms_a = 0, ms_b = 0;
    double worst = 0;
    for (int s = 0; s < steps; s++) {
        double la = 0, lb = 0;
        if (!gpu_train_step(a, micro[s], accum, &ms_a, &la) || !gpu_train_step(b, micro[s], accum, &ms_b, &lb))
            return false;
        double e = fabs(la - lb) / fmax(fabs(lb), 1e-30);
        worst = isnan(e) || e > worst ? e : worst;
    }
    result(worst <= 1e-3, "%s: %d steps' losses agree: worst rel %.3g <= 1e-3", tag, steps, worst);
    return true;
}

static inline double gpu_train_change_error(const float *a, const float *b, const float *w0, int64_t n,
                                            bool *bitwise)
{
    double d = 0, r = 0;
    *bitwise = memcmp(a, b, (size_t)n * sizeof *a) == 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return NAN;
        double da = (double)a[i] - w0[i], db = (double)b[i] - w0[i];
        d += (da - db) * (da - db);
        r += db * db;
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

static inline void gpu_train_compare_masters(GpuTrainer *a, GpuTrainer *b, const ParamList *pl, float **w,
                                             int steps, const char *tag)
{
    HpcError err = {0};
    double worst = 0;
    int worst_q = -1, same = 0, count = 0;
    for (int i = 0; i < a->opt.count; i++) {
        int q = a->opt.param[i];
        int64_t n = params_numel(&pl->p[q]);
        float *x = xmalloc((size_t)n * sizeof *x), *y = xmalloc((size_t)n * sizeof *y);
        if (cuda_optim_read_master(&a->opt, q, x, &err) || cuda_optim_read_master(&b->opt, q, y, &err)) {
            result(0, "%s: read %s: %s", tag, pl->p[q].name, err.msg);
        } else {
            bool bitwise;
            double e = gpu_train_change_error(x, y, w[q], n, &bitwise);
            same += bitwise;
            count++;
            if (isnan(e) || isnan(worst) || e > worst) {
                worst = isnan(worst) ? worst : e;
                worst_q = q;
            }
        }
        free(x);
        free(y);
    }
    result(worst <= 1e-3, "%s: %d masters after %d steps, the change's worst rel L2 %.3g <= 1e-3 (%s)", tag, count,
           steps, worst, worst_q >= 0 ? pl->p[worst_q].name : "-");
    if (getenv("HPC_CUDA_EMU")) result(same == count, "%s: %d of %d masters equal bit for bit (the emulator)", tag, same, count);
    else printf("       %d of %d masters equal bit for bit\n", same, count);
}

#endif
