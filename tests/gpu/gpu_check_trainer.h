/* tests/gpu/gpu_check_trainer.h — an executor with its optimizer, trained
 * as runtime/train/train_cuda.c trains (the optimizer as the tail of the
 * step's CUDA graph), for the tests that train two of them apart in one
 * setting and compare the weights (gpu_opt_fix, gpu_opt_rows).
 *
 * Promises:
 *   - gpu_trainer_open(t, dev, spec, g, pl, w, B, L, var, value): an
 *     executor over g for batches up to B x L with the weights w and its
 *     optimizer, the environment variable var set to value while both
 *     are set up (value NULL: unset); false after a failed check
 *     naming the setting;
 *   - gpu_trainer_close(t): frees what opened;
 *   - gpu_trainer_step(t, micro, accum, micro_step, loss): one optimizer
 *     step over accum micro-batches (dropout seed 11, the micro-step
 *     counter *micro_step), the loss of the last; false after a failed
 *     check;
 *   - gpu_trainer_change_error(a, b, w0, n, bitwise): the relative L2 of
 *     a's change from w0 against b's, NaN when either is not finite;
 *     *bitwise whether a and b are equal bit for bit;
 *   - gpu_trainer_bert_tiny(spec, p, w, uniform): models/bert_tiny.model
 *     into *spec, its fp16 graph into *p (pipeline_build) and random
 *     parameters into *w (gpu_check_random_params with uniform); false
 *     after a failed check (then nothing is left to free);
 *   - gpu_trainer_masters_error(a, b, pl, w0, apart, &d): every master of
 *     a against b's change error, no check: the worst of those whose name
 *     does not end in `apart` (NULL: none), the worst of those that do,
 *     how many are equal bit for bit; false after a failed read (a failed
 *     check);
 *   - gpu_trainer_compare_masters(a, b, pl, w0, tag, bound, apart): the
 *     same, and one check that the worst change error is at most bound
 *     (the `apart` masters' worst is printed); on the emulator
 *     (HPC_CUDA_EMU: one thread, no float atomics racing) one more that
 *     every master is equal bit for bit, on a GPU a line saying how many
 *     are.  Returns the worst.
 * Static functions; include after gpu_check.h and gpu_check_model.h in a
 * test's .c. */
#ifndef HPC_TESTS_GPU_CHECK_TRAINER_H
#define HPC_TESTS_GPU_CHECK_TRAINER_H

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_exec.h"
#include "cuda/cuda_optim.h"
#include "pipeline.h"
#include "program/params.h"

typedef struct {
    CudaExec ex;
    CudaOptim opt;
    bool open_ex, open_opt;
} GpuTrainer;

static inline bool gpu_trainer_open(GpuTrainer *t, CudaDevice *dev, const ModelSpec *spec, const IrGraph *g,
                                    const ParamList *pl, float **w, int64_t B, int64_t L, const char *var,
                                    const char *value)
{
    HpcError err = {0};
    memset(t, 0, sizeof *t);
    if (value) setenv(var, value, 1);
    HpcStatus st = cuda_exec_init(&t->ex, dev, g, pl, B, L, &err);
    t->open_ex = !st;
    if (!st) st = cuda_exec_set_params(&t->ex, w, &err);
    if (!st) st = cuda_optim_init(&t->opt, &t->ex, spec, PREC_FP16, 100, &err);
    if (value) unsetenv(var);
    t->open_opt = !st;
    if (st) result(0, "open with %s=%s: %s", var, value ? value : "(unset)", err.msg);
    return !st;
}

static inline void gpu_trainer_close(GpuTrainer *t)
{
    if (t->open_opt) cuda_optim_free(&t->opt);
    if (t->open_ex) cuda_exec_free(&t->ex);
}

static inline bool gpu_trainer_step(GpuTrainer *t, Batch *const *micro, int accum, uint32_t *micro_step,
                                    double *loss)
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

static inline bool gpu_trainer_bert_tiny(ModelSpec *spec, Pipeline *p, float ***w, float (*uniform)(void))
{
    HpcError err = {0};
    if (!gpu_check_load_model("bert_tiny.model", spec)) return false;
    PipeOptions po = pipeline_defaults(PREC_FP16);
    if (pipeline_build(spec, &po, p, &err)) {
        result(0, "bert_tiny fp16: build the graph: %s", err.msg);
        pipeline_free(p);
        return false;
    }
    *w = gpu_check_random_params(&p->pl, PREC_FP16, uniform);
    return true;
}

static inline double gpu_trainer_change_error(const float *a, const float *b, const float *w0, int64_t n,
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

static inline bool gpu_trainer_name_ends(const char *name, const char *suffix)
{
    size_t n = strlen(name), k = strlen(suffix);
    return n >= k && strcmp(name + n - k, suffix) == 0;
}

typedef struct {
    double worst, worst_apart;   /* NaN when a master is not finite */
    int worst_q;                 /* the parameter of `worst`; -1: none */
    int count, n_apart, same;    /* masters compared, of them `apart`, equal bit for bit */
} GpuMastersDiff;

static inline bool gpu_trainer_masters_error(GpuTrainer *a, GpuTrainer *b, const ParamList *pl, float **w0,
                                             const char *apart, GpuMastersDiff *d)
{
    HpcError err = {0};
    bool read = true;
    *d = (GpuMastersDiff){.worst_q = -1};
    for (int i = 0; i < a->opt.count; i++) {
        int q = a->opt.param[i];
        int64_t n = params_numel(&pl->p[q]);
        float *x = xmalloc((size_t)n * sizeof *x), *y = xmalloc((size_t)n * sizeof *y);
        if (cuda_optim_read_master(&a->opt, q, x, &err) || cuda_optim_read_master(&b->opt, q, y, &err)) {
            result(0, "read the master of %s: %s", pl->p[q].name, err.msg);
            read = false;
        } else {
            bool bitwise;
            double e = gpu_trainer_change_error(x, y, w0[q], n, &bitwise);
            d->same += bitwise;
            d->count++;
            if (apart && gpu_trainer_name_ends(pl->p[q].name, apart)) {
                d->n_apart++;
                d->worst_apart = isnan(e) || e > d->worst_apart ? e : d->worst_apart;
            } else if (isnan(e) || isnan(d->worst) || e > d->worst) {
                d->worst = isnan(d->worst) ? d->worst : e;
                d->worst_q = q;
            }
        }
        free(x);
        free(y);
    }
    return read;
}

static inline double gpu_trainer_compare_masters(GpuTrainer *a, GpuTrainer *b, const ParamList *pl, float **w0,
                                                 const char *tag, double bound, const char *apart)
{
    GpuMastersDiff d;
    if (!gpu_trainer_masters_error(a, b, pl, w0, apart, &d)) return NAN;
    result(d.worst <= bound, "%s: %d masters, the change's worst rel L2 %.3g <= %.3g (%s)", tag, d.count - d.n_apart,
           d.worst, bound, d.worst_q >= 0 ? pl->p[d.worst_q].name : "-");
    if (d.n_apart)
        printf("       %d masters *%s apart: the change's worst rel L2 %.3g\n", d.n_apart, apart, d.worst_apart);
    if (getenv("HPC_CUDA_EMU")) result(d.same == d.count, "%s: %d of %d masters equal bit for bit (the emulator)", tag,
                                       d.same, d.count);
    else printf("       %d of %d masters equal bit for bit\n", d.same, d.count);
    return d.worst;
}

#endif
