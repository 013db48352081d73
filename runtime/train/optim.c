/* runtime/train/optim.c — the fused optimizer step on the CPU: one check pass,
 * one norm pass, one update pass over all tensors (LAMB adds a per-tensor
 * norm pass), as the CUDA multi-tensor kernel does. */
#include "train/optim.h"

#include <math.h>

#include "util/error.h"
#include "cpu/half.h"

/* Per-step constants shared by every element. */
typedef struct {
    double lr, wd, b1, b2, eps, bc1, bc2, mom;
    float inv_scale;         /* g = (grad * inv_scale) * coef */
    double coef;
    bool first;              /* first applied step (SGD momentum buffer init) */
} StepConsts;

void optim_config_from_spec(OptimConfig *cfg, const SpecTraining *train)
{
    *cfg = (OptimConfig){
        .kind = train->optimizer, .beta1 = train->beta1, .beta2 = train->beta2,
        .eps = train->eps, .weight_decay = train->weight_decay, .momentum = train->momentum,
        .nesterov = train->nesterov, .max_grad_norm = train->max_grad_norm,
        .low_dtype = PREC_FP16,
    };
}

bool optim_needs_m(const OptimConfig *cfg)
{
    return cfg->kind != OPT_SGD || cfg->momentum != 0;
}

bool optim_needs_v(const OptimConfig *cfg)
{
    return cfg->kind != OPT_SGD;
}

/* Pass 1: is any unscaled gradient inf/NaN?  (grad * inv_scale in f32, as
 * GradScaler.unscale_ checks: inv_scale > 1 can itself overflow.) */
static bool optim_found_inf(const OptimTensor *t, int count, float inv_scale)
{
    for (int k = 0; k < count; k++)
        for (int64_t i = 0; i < t[k].n; i++)
            if (!isfinite(t[k].grad[i] * inv_scale)) return true;
    return false;
}

/* Pass 2: sum of squares of the unscaled gradient, accumulated in f64 (the
 * global L2 norm is its square root). */
static double optim_grad_sumsq(const OptimTensor *t, int count, float inv_scale)
{
    double s = 0;
    for (int k = 0; k < count; k++)
        for (int64_t i = 0; i < t[k].n; i++) {
            double g = (double)(t[k].grad[i] * inv_scale);
            s += g * g;
        }
    return s;
}

static double optim_grad(const StepConsts *c, const OptimTensor *t, int64_t i)
{
    return (double)(t->grad[i] * c->inv_scale) * c->coef;
}

/* Adam-style moments; returns the bias-corrected direction mhat/(sqrt(vhat)+eps). */
static double optim_adam_dir(const StepConsts *c, OptimTensor *t, int64_t i, double g)
{
    double m = c->b1 * t->m[i] + (1 - c->b1) * g;
    double v = c->b2 * t->v[i] + (1 - c->b2) * g * g;
    t->m[i] = (float)m;
    t->v[i] = (float)v;
    return ((double)t->m[i] / c->bc1) / (sqrt((double)t->v[i] / c->bc2) + c->eps);
}

static void optim_update_adamw(const StepConsts *c, OptimTensor *t, double wd)
{
    for (int64_t i = 0; i < t->n; i++) {
        double p = t->master[i] * (1 - c->lr * wd);   /* decoupled decay first */
        double d = optim_adam_dir(c, t, i, optim_grad(c, t, i));
        t->master[i] = (float)(p - c->lr * d);
    }
}

static void optim_update_adam(const StepConsts *c, OptimTensor *t, double wd)
{
    for (int64_t i = 0; i < t->n; i++) {
        double p = t->master[i];
        double d = optim_adam_dir(c, t, i, optim_grad(c, t, i) + wd * p);   /* L2 decay */
        t->master[i] = (float)(p - c->lr * d);
    }
}

static void optim_update_sgd(const StepConsts *c, OptimTensor *t, double wd, bool nesterov)
{
    for (int64_t i = 0; i < t->n; i++) {
        double p = t->master[i];
        double d = optim_grad(c, t, i) + wd * p;
        if (c->mom != 0) {
            double buf = c->first ? d : c->mom * t->m[i] + d;
            t->m[i] = (float)buf;
            d = nesterov ? d + c->mom * t->m[i] : t->m[i];
        }
        t->master[i] = (float)(p - c->lr * d);
    }
}

/* LAMB needs ||p|| and ||u|| before it can move p: a first pass updates
 * the moments and measures both norms, a second recomputes u from the
 * stored moments (no scratch buffer) and applies it. */
static void optim_update_lamb(const StepConsts *c, OptimTensor *t, double wd)
{
    double pn = 0, un = 0;
    for (int64_t i = 0; i < t->n; i++) {
        double p = t->master[i];
        double u = optim_adam_dir(c, t, i, optim_grad(c, t, i)) + wd * p;
        pn += p * p;
        un += u * u;
    }
    double ratio = (pn > 0 && un > 0) ? sqrt(pn) / sqrt(un) : 1.0;
    for (int64_t i = 0; i < t->n; i++) {
        double p = t->master[i];
        double u = ((double)t->m[i] / c->bc1) / (sqrt((double)t->v[i] / c->bc2) + c->eps) + wd * p;
        t->master[i] = (float)(p - c->lr * ratio * u);
    }
}

static void optim_update_tensor(const OptimConfig *cfg, const StepConsts *c, OptimTensor *t)
{
    double wd = t->decay ? c->wd : 0.0;
    HPC_ASSERT(!optim_needs_m(cfg) || t->m != NULL);
    HPC_ASSERT(!optim_needs_v(cfg) || t->v != NULL);
    switch (cfg->kind) {
    case OPT_ADAMW: optim_update_adamw(c, t, wd); break;
    case OPT_ADAM:  optim_update_adam(c, t, wd); break;
    case OPT_SGD:   optim_update_sgd(c, t, wd, cfg->nesterov); break;
    case OPT_LAMB:  optim_update_lamb(c, t, wd); break;
    }
    if (t->low) {
        HPC_ASSERT(cfg->low_dtype == PREC_FP16 || cfg->low_dtype == PREC_BF16);
        for (int64_t i = 0; i < t->n; i++) t->low[i] = prec_from_f32(cfg->low_dtype, t->master[i]);
    }
}

void optim_scan(const OptimTensor *tensors, int count, float inv_scale, bool *found_inf, double *sumsq)
{
    *found_inf = optim_found_inf(tensors, count, inv_scale);
    *sumsq = *found_inf ? 0 : optim_grad_sumsq(tensors, count, inv_scale);
}

void optim_apply(const OptimConfig *cfg, OptimState *state, OptimTensor *tensors, int count,
                 float inv_scale, double lr, double grad_norm, OptimReport *report)
{
    *report = (OptimReport){ .found_inf = false, .grad_norm = grad_norm, .clip_coef = 1.0 };
    double coef = 1.0;
    if (cfg->max_grad_norm > 0) {
        double raw = cfg->max_grad_norm / (grad_norm + 1e-6);
        if (raw < 1.0) coef = raw;   /* torch clamps the coefficient at 1 */
    }
    report->clip_coef = coef;
    int64_t t = ++state->step;
    StepConsts c = {
        .lr = lr, .wd = cfg->weight_decay, .b1 = cfg->beta1, .b2 = cfg->beta2, .eps = cfg->eps,
        .bc1 = 1 - pow(cfg->beta1, (double)t), .bc2 = 1 - pow(cfg->beta2, (double)t),
        .mom = cfg->momentum, .inv_scale = inv_scale, .coef = coef, .first = t == 1,
    };
    for (int k = 0; k < count; k++) optim_update_tensor(cfg, &c, &tensors[k]);
}

void optim_step(const OptimConfig *cfg, OptimState *state, OptimTensor *tensors, int count,
                float inv_scale, double lr, OptimReport *report)
{
    *report = (OptimReport){ .found_inf = true, .grad_norm = INFINITY, .clip_coef = 1.0 };
    if (optim_found_inf(tensors, count, inv_scale)) return;
    optim_apply(cfg, state, tensors, count, inv_scale, lr, sqrt(optim_grad_sumsq(tensors, count, inv_scale)), report);
}
