/* runtime/train/lossscale.h — the loss scaler: dynamic (PyTorch GradScaler
 * semantics), static, or none.
 *
 * The trainer multiplies the loss by ls->scale before the backward pass,
 * passes 1/scale to optim_step (which unscales, checks for inf/NaN and
 * reports found_inf), then calls ls_update(ls, found_inf).  ls_update
 * returns true when the step must be skipped (found_inf): the optimizer has
 * then changed nothing, and the schedule does not advance.
 *
 * Dynamic mode, exactly torch.amp.GradScaler.update (docs/precision.md):
 *   found_inf:  scale *= backoff; growth_tracker = 0; skip
 *   otherwise:  growth_tracker += 1;
 *               if growth_tracker == interval: scale *= growth; growth_tracker = 0
 * Defaults (SpecTraining defaults, PyTorch's): init 65536, growth 2,
 * backoff 0.5, interval 2000.
 * Static mode: the scale never changes; a non-finite step is still skipped.
 * None: scale is 1 and never changes; a non-finite step is still skipped.
 *
 * Giving up: if every step overflows, dynamic scaling would halve forever
 * (and static scaling skip forever).  ls_gave_up reports true once
 * consecutive_skips >= max_consecutive_skips (SpecTraining.max_skipped_steps,
 * or LS_DEFAULT_MAX_CONSECUTIVE_SKIPS when that is 0; a config value of 0
 * disables the count) or, in dynamic mode,
 * once scale < min_scale (default LS_DEFAULT_MIN_SCALE; 0 disables).  The
 * trainer then stops with HPC_ERR_NUMERIC; ls_describe_give_up writes the
 * message.  A LossScaler is a plain value: no allocation, no free.
 *
 * Usage:
 *   LossScaleConfig cfg; ls_config_from_spec(&cfg, &spec.train);
 *   LossScaler ls;       ls_init(&ls, &cfg);
 *   ... loss * ls.scale ... optim_step(..., (float)(1.0 / ls.scale), ...)
 *   bool skipped = ls_update(&ls, report.found_inf);
 *   if (ls_gave_up(&ls)) return hpc_fail(err, HPC_ERR_NUMERIC, ...);
 */
#ifndef HPC_RUNTIME_LOSSSCALE_H
#define HPC_RUNTIME_LOSSSCALE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "program/spec.h"

/* Used when SpecTraining.max_skipped_steps is 0 (unset). */
#define LS_DEFAULT_MAX_CONSECUTIVE_SKIPS 100   /* as spec_defaults */
/* 2^-24: the smallest fp16 subnormal.  A scale this small means the
 * gradients overflow even when the loss is multiplied by ~6e-8: no scale
 * can help, the model itself is producing inf/NaN. */
#define LS_DEFAULT_MIN_SCALE (1.0 / 16777216.0)

typedef struct { SpecLossScaling mode; double init, growth, backoff; int64_t interval;
                 int64_t max_consecutive_skips; double min_scale; } LossScaleConfig;
typedef struct { LossScaleConfig cfg; double scale; int64_t growth_tracker;
                 int64_t consecutive_skips, total_skips; } LossScaler;

/* PyTorch's defaults in dynamic mode (init 65536, growth 2, backoff 0.5,
 * interval 2000) and the give-up limits above. */
void ls_config_default(LossScaleConfig *cfg);
void ls_config_from_spec(LossScaleConfig *cfg, const SpecTraining *train);
void ls_init(LossScaler *ls, const LossScaleConfig *cfg);
bool ls_update(LossScaler *ls, bool found_inf);   /* returns true when this step must be skipped */
bool ls_gave_up(const LossScaler *ls);            /* too many consecutive skips, or scale under the floor */
/* Writes a one-line message saying why the scaler gave up and the likely
 * cause (for the trainer's HPC_ERR_NUMERIC error). */
void ls_describe_give_up(const LossScaler *ls, char *buf, size_t size);

#endif
