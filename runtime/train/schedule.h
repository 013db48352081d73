/* runtime/train/schedule.h — learning-rate schedules with warmup.
 *
 * The HF transformers semantics (get_constant_schedule_with_warmup,
 * get_linear_schedule_with_warmup, get_cosine_schedule_with_warmup), where
 * s is the number of APPLIED optimizer steps so far (skipped loss-scale
 * overflow steps do not count; the trainer passes OptimState.step) and
 * w = warmup_steps, T = total_steps:
 *   warmup (all kinds): s < w:  lr * s / w          (lr 0 at s = 0)
 *   constant:           lr
 *   linear:             lr * max(0, (T - s) / (T - w))
 *   cosine:             progress = (s - w) / (T - w)
 *                       lr * max(0, 0.5 * (1 + cos(pi * progress)))  with
 *                       min_lr_ratio r > 0: lr * (r + (1 - r) * that factor)
 * The lr used by the optimizer step that follows s applied steps is
 * schedule_lr(cfg, s): the first step of a warmup runs at lr 0, as with
 * torch LambdaLR.  The one departure from HF: past T the cosine progress is
 * clamped at 1 (HF's curve would rise again), so lr stays at the floor.
 * A ScheduleConfig is a plain value.
 */
#ifndef HPC_RUNTIME_SCHEDULE_H
#define HPC_RUNTIME_SCHEDULE_H

#include <stdint.h>

#include "program/spec.h"

typedef struct { SpecSchedule kind; double lr; int64_t warmup_steps, total_steps; double min_lr_ratio; } ScheduleConfig;
/* warmup_steps = train->warmup_steps, or ceil(warmup_ratio * total_steps)
 * when that is 0 (as HF TrainingArguments.get_warmup_steps does). */
void schedule_config_from_spec(ScheduleConfig *cfg, const SpecTraining *train, int64_t total_steps);
double schedule_lr(const ScheduleConfig *cfg, int64_t applied_step); /* HF get_linear/cosine_schedule_with_warmup semantics */

#endif
