/* cli/run_overrides.c — see run_overrides.h. */
#include "run_overrides.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char run_overrides_usage[] =
    "training settings (override the model's train block):\n"
    "  --loss-scale S        dynamic, none, or a number (a static scale)\n"
    "  --scale-init X        first dynamic scale (default 65536)\n"
    "  --scale-growth X      growth factor after an interval of clean steps (> 1)\n"
    "  --scale-backoff X     factor on an overflowing step (0 < X < 1)\n"
    "  --scale-interval N    clean steps before the scale grows (default 2000)\n"
    "  --max-skipped-steps N consecutive skipped steps before hpc gives up (exit 7)\n"
    "  --lr X  --batch N  --grad-accum N  --seed N  --clip-grad-norm X (0: off)\n"
    "  --epochs N\n";

static const char *const known[] = {
    "--loss-scale", "--scale-init", "--scale-growth", "--scale-backoff", "--scale-interval",
    "--max-skipped-steps", "--lr", "--batch", "--grad-accum", "--seed", "--clip-grad-norm", "--epochs",
};

bool run_override_known(const char *option)
{
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(option, known[i]) == 0) return true;
    return false;
}

HpcStatus run_override_add(RunOverrides *o, const char *option, const char *value, HpcError *err)
{
    if (o->n == RUN_OVERRIDES_MAX)
        return hpc_fail(err, HPC_ERR_USAGE, "run: more than %d training settings on the command line",
                        RUN_OVERRIDES_MAX);
    o->option[o->n] = option;
    o->value[o->n] = value;
    o->n++;
    return HPC_OK;
}

/* A finite number in [lo, hi] (open ends when the flags say so). */
static HpcStatus number(const char *opt, const char *text, double lo, double hi, bool open_lo, bool open_hi,
                        double *out, HpcError *err)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    bool ok = *text && !*end && errno == 0 && isfinite(v) && (open_lo ? v > lo : v >= lo) &&
              (open_hi ? v < hi : v <= hi);
    if (!ok)
        return hpc_fail(err, HPC_ERR_USAGE, "run: %s %s: expected a number in %c%g, %g%c", opt, text,
                        open_lo ? '(' : '[', lo, hi, open_hi ? ')' : ']');
    *out = v;
    return HPC_OK;
}

static HpcStatus count(const char *opt, const char *text, double lo, double hi, int64_t *out, HpcError *err)
{
    double v;
    HpcStatus st = number(opt, text, lo, hi, false, false, &v, err);
    if (!st && v != floor(v)) st = hpc_fail(err, HPC_ERR_USAGE, "run: %s %s: expected a whole number", opt, text);
    if (!st) *out = (int64_t)v;
    return st;
}

static HpcStatus loss_scale(const char *text, SpecTraining *t, HpcError *err)
{
    if (strcmp(text, "dynamic") == 0) t->loss_scaling = LOSS_SCALE_DYNAMIC;
    else if (strcmp(text, "none") == 0) t->loss_scaling = LOSS_SCALE_NONE;
    else {
        HpcStatus st = number("--loss-scale", text, 0, 1e30, true, false, &t->scale_init, err);
        if (st) return hpc_fail(err, HPC_ERR_USAGE, "run: --loss-scale %s: expected dynamic, none or a "
                                "positive number", text);
        t->loss_scaling = LOSS_SCALE_STATIC;
    }
    return HPC_OK;
}

static HpcStatus apply_one(const char *opt, const char *v, SpecTraining *t, HpcError *err)
{
    if (strcmp(opt, "--loss-scale") == 0) return loss_scale(v, t, err);
    if (strcmp(opt, "--scale-init") == 0) return number(opt, v, 0, 1e30, true, false, &t->scale_init, err);
    if (strcmp(opt, "--scale-growth") == 0) return number(opt, v, 1, 1e6, true, false, &t->scale_growth, err);
    if (strcmp(opt, "--scale-backoff") == 0) return number(opt, v, 0, 1, true, true, &t->scale_backoff, err);
    if (strcmp(opt, "--scale-interval") == 0) return count(opt, v, 1, 1e9, &t->scale_interval, err);
    if (strcmp(opt, "--max-skipped-steps") == 0) return count(opt, v, 1, 1e9, &t->max_skipped_steps, err);
    if (strcmp(opt, "--lr") == 0) return number(opt, v, 0, 10, true, false, &t->lr, err);
    if (strcmp(opt, "--batch") == 0) return count(opt, v, 1, 65536, &t->batch_size, err);
    if (strcmp(opt, "--grad-accum") == 0) return count(opt, v, 1, 65536, &t->grad_accum, err);
    if (strcmp(opt, "--clip-grad-norm") == 0) return number(opt, v, 0, 1e9, false, false, &t->max_grad_norm, err);
    if (strcmp(opt, "--seed") == 0) {
        int64_t s;
        HpcStatus st = count(opt, v, 0, 9.0e15, &s, err);
        if (!st) t->seed = (uint64_t)s;
        return st;
    }
    if (strcmp(opt, "--epochs") == 0) {
        HpcStatus st = count(opt, v, 1, 1e6, &t->epochs, err);
        if (!st) t->steps = 0; /* exactly one of epochs, steps */
        return st;
    }
    return hpc_fail(err, HPC_ERR_INTERNAL, "run: unhandled setting %s", opt);
}

HpcStatus run_overrides_apply(const RunOverrides *o, ModelSpec *spec, HpcError *err)
{
    for (int i = 0; i < o->n; i++) {
        HpcStatus st = apply_one(o->option[i], o->value[i], &spec->train, err);
        if (st) return st;
    }
    return HPC_OK;
}
