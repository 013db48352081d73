/* runtime/train/schedule.c — HF-style warmup + constant/linear/cosine decay. */
#include "train/schedule.h"

#include <math.h>

void schedule_config_from_spec(ScheduleConfig *cfg, const SpecTraining *train, int64_t total_steps)
{
    int64_t warmup = train->warmup_steps;
    if (warmup == 0 && train->warmup_ratio > 0)
        warmup = (int64_t)ceil(train->warmup_ratio * (double)total_steps);
    *cfg = (ScheduleConfig){
        .kind = train->schedule, .lr = train->lr, .warmup_steps = warmup,
        .total_steps = total_steps, .min_lr_ratio = train->min_lr_ratio,
    };
}

/* The multiplier of lr after `s` applied steps (HF's lr_lambda). */
static double schedule_factor(const ScheduleConfig *cfg, int64_t s)
{
    int64_t w = cfg->warmup_steps, T = cfg->total_steps;
    if (s < w) return (double)s / (double)(w > 1 ? w : 1);
    double span = (double)(T - w > 1 ? T - w : 1);
    switch (cfg->kind) {
    case SCHED_CONSTANT:
        return 1.0;
    case SCHED_LINEAR:
        return fmax(0.0, (double)(T - s) / span);
    case SCHED_COSINE: {
        double progress = fmin(1.0, (double)(s - w) / span);   /* HF would rise again past T */
        double f = 0.5 * (1.0 + cos(M_PI * progress));
        if (cfg->min_lr_ratio > 0) f = cfg->min_lr_ratio + (1.0 - cfg->min_lr_ratio) * f;
        return fmax(0.0, f);
    }
    }
    return 1.0;
}

double schedule_lr(const ScheduleConfig *cfg, int64_t applied_step)
{
    return cfg->lr * schedule_factor(cfg, applied_step);
}
