/* cli/run_overrides.c — see run_overrides.h. */
#include "run_overrides.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* Ranges: as compiler/check_keys.c. */
static const NumRange SCALE_RANGE = {0, 1.8446744073709552e19, true, false};

/* --loss-scale dynamic|none|N */
static bool parse_loss_scale(const CliOpt *opt, const char *v, void *field, char *why, size_t cap)
{
    RunLossScale *ls = field;
    if (strcmp(v, "dynamic") == 0) ls->mode = LOSS_SCALE_DYNAMIC;
    else if (strcmp(v, "none") == 0) ls->mode = LOSS_SCALE_NONE;
    else if (num_real(v, SCALE_RANGE, &ls->scale) == NUM_OK) ls->mode = LOSS_SCALE_STATIC;
    else {
        snprintf(why, cap, "--loss-scale %.60s: expected dynamic, none or a static scale in (0, %g]", v,
                 SCALE_RANGE.hi);
        return false;
    }
    return true;
}

#define T(f) offsetof(RunOverrides, t.f)
/* The loss scaler's rows first: run_overrides_check relies on SCALE_ROWS. */
const CliOpt run_override_opts[] = {
    {.name = "loss-scale", .kind = CLI_FN, .off = offsetof(RunOverrides, loss), .meta = "S", .fn = parse_loss_scale,
     .help = "dynamic, none, or a number (a static scale)"},
    {.name = "scale-init", .kind = CLI_REAL, .off = T(scale_init), .meta = "X", .range = SCALE_RANGE,
     .help = "first dynamic scale (default 65536)"},
    {.name = "scale-growth", .kind = CLI_REAL, .off = T(scale_growth), .meta = "X", .range = {1, 16, true, false},
     .help = "growth factor after an interval of clean steps"},
    {.name = "scale-backoff", .kind = CLI_REAL, .off = T(scale_backoff), .meta = "X", .range = {0, 1, true, true},
     .help = "factor on an overflowing step"},
    {.name = "scale-interval", .kind = CLI_INT, .off = T(scale_interval), .meta = "N", .min = 1, .max = 1000000000,
     .help = "clean steps before the scale grows (default 2000)"},
    {.name = "max-skipped-steps", .kind = CLI_INT, .off = T(max_skipped_steps), .meta = "N", .min = 1,
     .max = 1000000000, .help = "consecutive skipped steps before hpc gives up (exit 7)"},
    {.name = "lr", .kind = CLI_REAL, .off = T(lr), .meta = "X", .range = {0, 10, true, false},
     .help = "peak learning rate"},
    {.name = "batch", .kind = CLI_INT, .off = T(batch_size), .meta = "N", .min = 1, .max = 65536,
     .help = "rows per micro-batch"},
    {.name = "grad-accum", .kind = CLI_INT, .off = T(grad_accum), .meta = "N", .min = 1, .max = 65536,
     .help = "micro-batches per optimizer step"},
    {.name = "seed", .kind = CLI_INT, .off = T(seed), .meta = "N", .min = 0, .max = INT64_MAX,
     .help = "seed of the initial weights, shuffling and dropout"},
    {.name = "clip-grad-norm", .kind = CLI_REAL, .off = T(max_grad_norm), .meta = "X", .range = {0, 1e6, false, false},
     .help = "clip the global gradient norm to X (0: off)"},
    {.name = "epochs", .kind = CLI_INT, .off = T(epochs), .meta = "N", .min = 1, .max = 1000000, .excludes = RUN_EX_LENGTH,
     .help = "passes over the training rows (instead of the model's steps)"},
    CLI_END,
};
#undef T

enum { ROW_LOSS_SCALE = 0, ROW_SCALE_INIT = 1, SCALE_ROWS = 4 };   /* scale-init .. scale-interval */

_Static_assert(sizeof(int64_t) == 8 && sizeof(uint64_t) == 8 && sizeof(double) == 8,
               "run_overrides_apply copies 8 bytes per number");

HpcStatus run_overrides_check(const RunOverrides *o, const bool *seen, HpcError *err)
{
    if (!seen[ROW_LOSS_SCALE] || o->loss.mode == LOSS_SCALE_DYNAMIC) return HPC_OK;
    bool none = o->loss.mode == LOSS_SCALE_NONE;
    char mode[40] = "none";
    if (!none) snprintf(mode, sizeof mode, "%g", o->loss.scale);
    for (int i = ROW_SCALE_INIT; i < ROW_SCALE_INIT + SCALE_ROWS; i++)
        if (seen[i])
            return hpc_fail(err, HPC_ERR_USAGE, "run: --loss-scale %s and --%s contradict each other (%s); give one "
                            "of them", mode, run_override_opts[i].name,
                            none ? "without loss scaling there is no scale to set"
                                 : i == ROW_SCALE_INIT ? "a static scale is its own initial value"
                                                       : "a static scale never changes");
    return HPC_OK;
}

void run_overrides_apply(const RunOverrides *o, const bool *seen, ModelSpec *spec)
{
    for (int i = 0; run_override_opts[i].name; i++) {
        const CliOpt *r = &run_override_opts[i];
        if (!seen[i] || (r->kind != CLI_INT && r->kind != CLI_REAL)) continue;
        /* the field sits at the same place in o->t and spec->train */
        size_t at = r->off - offsetof(RunOverrides, t);
        memcpy((char *)&spec->train + at, (const char *)&o->t + at, 8);
    }
    if (seen[ROW_LOSS_SCALE]) {
        spec->train.loss_scaling = o->loss.mode;
        if (o->loss.mode == LOSS_SCALE_STATIC) spec->train.scale_init = o->loss.scale;
    }
    if (o->t.epochs > 0) spec->train.steps = 0;   /* exactly one of epochs, steps */
}
