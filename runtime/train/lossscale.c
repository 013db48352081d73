/* runtime/train/lossscale.c — dynamic/static loss scaling with a give-up rule. */
#include "train/lossscale.h"

#include <float.h>
#include <math.h>
#include <stdio.h>

void ls_config_default(LossScaleConfig *cfg)
{
    /* torch.amp.GradScaler's defaults: 2^16 is large enough that fp16
     * gradients of a freshly initialised transformer rarely underflow, and
     * 2000 clean steps between doublings keeps the overflow (and skip) rate
     * near 1 in 2000 once the scale has settled. */
    *cfg = (LossScaleConfig){
        .mode = LOSS_SCALE_DYNAMIC, .init = 65536.0, .growth = 2.0, .backoff = 0.5,
        .interval = 2000, .max_consecutive_skips = LS_DEFAULT_MAX_CONSECUTIVE_SKIPS,
        .min_scale = LS_DEFAULT_MIN_SCALE,
    };
}

void ls_config_from_spec(LossScaleConfig *cfg, const SpecTraining *train)
{
    ls_config_default(cfg);
    cfg->mode = train->loss_scaling;
    if (train->scale_init > 0) cfg->init = train->scale_init;
    if (train->scale_growth > 0) cfg->growth = train->scale_growth;
    if (train->scale_backoff > 0) cfg->backoff = train->scale_backoff;
    if (train->scale_interval > 0) cfg->interval = train->scale_interval;
    if (train->max_skipped_steps > 0) cfg->max_consecutive_skips = train->max_skipped_steps;
    if (cfg->mode == LOSS_SCALE_NONE) cfg->init = 1.0;
}

void ls_init(LossScaler *ls, const LossScaleConfig *cfg)
{
    *ls = (LossScaler){ .cfg = *cfg, .scale = (double)(float)cfg->init };
}

/* GradScaler keeps its scale in an f32 tensor and multiplies by a double
 * factor; rounding each result to f32 reproduces its values bit for bit
 * even for factors that are not powers of two. */
static void ls_dynamic_update(LossScaler *ls, bool found_inf)
{
    if (found_inf) {
        ls->scale = (double)(float)(ls->scale * ls->cfg.backoff);
        ls->growth_tracker = 0;
        return;
    }
    ls->growth_tracker++;
    if (ls->growth_tracker == ls->cfg.interval) {
        float grown = (float)(ls->scale * ls->cfg.growth);
        if (isfinite(grown)) ls->scale = grown;   /* GradScaler never grows to inf */
        ls->growth_tracker = 0;
    }
}

bool ls_update(LossScaler *ls, bool found_inf)
{
    if (ls->cfg.mode == LOSS_SCALE_DYNAMIC) ls_dynamic_update(ls, found_inf);
    if (found_inf) {
        ls->consecutive_skips++;
        ls->total_skips++;
    } else {
        ls->consecutive_skips = 0;
    }
    return found_inf;
}

bool ls_gave_up(const LossScaler *ls)
{
    const LossScaleConfig *c = &ls->cfg;
    if (c->max_consecutive_skips > 0 && ls->consecutive_skips >= c->max_consecutive_skips) return true;
    return c->mode == LOSS_SCALE_DYNAMIC && c->min_scale > 0 && ls->scale < c->min_scale;
}

void ls_describe_give_up(const LossScaler *ls, char *buf, size_t size)
{
    const LossScaleConfig *c = &ls->cfg;
    const char *why = c->mode == LOSS_SCALE_DYNAMIC
        ? "the gradients are inf/NaN even at a tiny loss scale, so the model itself overflows: "
          "check the learning rate (too high?), the input data (NaN targets, out-of-range ids), "
          "and try --bf16 or --fp32 to see whether fp16 range is the cause"
        : "with a fixed loss scale the gradients overflow on every step: lower the static scale "
          "(scale_init), switch to dynamic loss scaling, or check the learning rate and the data";
    if (c->max_consecutive_skips > 0 && ls->consecutive_skips >= c->max_consecutive_skips)
        snprintf(buf, size, "loss scaling gave up after %lld consecutive skipped steps "
                 "(max_skipped_steps = %lld, loss scale now %g): %s",
                 (long long)ls->consecutive_skips, (long long)c->max_consecutive_skips, ls->scale, why);
    else
        snprintf(buf, size, "loss scaling gave up: the loss scale fell to %g, under the floor %g, "
                 "after %lld consecutive skipped steps: %s",
                 ls->scale, c->min_scale, (long long)ls->consecutive_skips, why);
}
