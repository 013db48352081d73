/* runtime/trainer.h — the training loop of the cpu backend.
 *
 * trainer_run compiles the model (lower + autodiff), initialises the
 * parameters like BERT (runtime/init.h, seeded by spec->train.seed), and
 * trains on `train` for the requested number of optimizer steps:
 *   per step, grad_accum micro-batches from the loader (runtime/loader.h,
 *   seeded shuffle, batches padded to a multiple of 8): forward, backward
 *   with d(loss) = loss scale, gradients summed over the micro-batches;
 *   then optim_step (runtime/optim.h) with inv_scale = 1 / (scale *
 *   grad_accum), i.e. the mean over micro-batches, the learning rate from
 *   schedule_lr (runtime/schedule.h) and the loss scaler's update
 *   (runtime/lossscale.h; a skipped step changes nothing).
 * With policy fp16/bf16 the graph goes through the precision pass
 * (compiler/precision.h) and the f32 executor rounds every low-precision
 * value, so the run shows what mixed precision does to training.
 * Dropout uses seed spec->train.seed and the micro-step counter as step.
 * Evaluation (forward only, dropout off) runs on `eval` every eval_every
 * steps and at the end: accuracy for classification heads, the mean loss
 * (MSE) for regression, the mean loss for LM heads.  Progress goes through
 * runtime/runlog.h.
 *
 * Everything the trainer allocates is freed before it returns.
 */
#ifndef HPC_RUNTIME_TRAINER_H
#define HPC_RUNTIME_TRAINER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "dataset.h"
#include "error.h"
#include "spec.h"

typedef struct {
    int64_t steps;        /* optimizer steps; 0 = spec->train.steps, else epochs over train */
    int64_t eval_every;   /* evaluate every N steps (0 = only at the end) */
    int64_t log_every;    /* plain log line interval (runlog_set_interval) */
    const char *jsonl;    /* JSONL log path, NULL for none */
    FILE *out;            /* console, NULL for silent */
    bool progress_bar;
    SpecPrecision policy; /* PREC_FP16/PREC_BF16: emulate mixed precision (the
                             precision pass's graph, values rounded to 16 bits);
                             PREC_FP32 or PREC_DEFAULT: all f32 */
} TrainOptions;

typedef struct {
    int64_t steps;        /* optimizer steps taken (applied + skipped) */
    int64_t skipped;      /* steps skipped for non-finite gradients */
    int64_t params;       /* parameter elements (tied counted once) */
    double first_loss;    /* mean loss of the first step */
    double last_loss;     /* mean loss of the last step */
    const char *metric;   /* "accuracy", "mse" or "loss" */
    double eval_metric;   /* final evaluation on `eval` */
    double eval_loss;
} TrainResult;

/* eval may be NULL (no evaluation).  Fails with the status of the failing
 * stage (HPC_ERR_INPUT for a dataset that does not fit the model,
 * HPC_ERR_NUMERIC when the loss scaler gives up, HPC_ERR_OOM, ...). */
HpcStatus trainer_run(const ModelSpec *spec, const Dataset *train, const Dataset *eval,
                      const TrainOptions *opts, TrainResult *res, HpcError *err);

#endif
