/* cli/run_overrides.h — training settings given on the `hpc run` command
 * line, applied over the model file's train block.
 *
 * Every number of the loss scaler (and a few common training numbers) can be
 * set without editing the .model file:
 *   --loss-scale dynamic|none|N   (N: a static scale)
 *   --scale-init X  --scale-growth X  --scale-backoff X  --scale-interval N
 *   --max-skipped-steps N  --lr X  --batch N  --grad-accum N  --seed N
 *   --clip-grad-norm X  --epochs N
 * Values are checked with the same limits as the model language.
 */
#ifndef HPC_CLI_RUN_OVERRIDES_H
#define HPC_CLI_RUN_OVERRIDES_H

#include <stdbool.h>

#include "error.h"
#include "spec.h"

#define RUN_OVERRIDES_MAX 16

typedef struct {
    const char *option[RUN_OVERRIDES_MAX];
    const char *value[RUN_OVERRIDES_MAX];
    int n;
} RunOverrides;

/* The usage lines for these options. */
extern const char run_overrides_usage[];

/* True if `option` is one of these options (it then takes one value). */
bool run_override_known(const char *option);

/* Records option=value; HPC_ERR_USAGE when there are too many. */
HpcStatus run_override_add(RunOverrides *o, const char *option, const char *value, HpcError *err);

/* Applies the recorded settings to spec->train in order; a bad value is
 * HPC_ERR_USAGE with a message naming the option and the allowed range. */
HpcStatus run_overrides_apply(const RunOverrides *o, ModelSpec *spec, HpcError *err);

#endif
