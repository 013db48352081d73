/* cli/run_overrides.h — training settings given on the `hpc run` command
 * line, applied over the model file's train block.
 *
 * They are one section of `hpc run`'s option table (cli/options.h): every
 * number of the loss scaler and a few common training numbers can be set
 * without editing the .model file:
 *   --loss-scale dynamic|none|N   (N: a static scale)
 *   --scale-init X  --scale-growth X  --scale-backoff X  --scale-interval N
 *   --max-skipped-steps N  --lr X  --batch N  --grad-accum N  --seed N
 *   --clip-grad-norm X  --epochs N
 * Their ranges are those of the model language (compiler/check_keys.c,
 * docs/language.md); tests/test_cli_options.c checks that the two agree.
 */
#ifndef HPC_CLI_RUN_OVERRIDES_H
#define HPC_CLI_RUN_OVERRIDES_H

#include <stdbool.h>

#include "error.h"
#include "options.h"
#include "program/spec.h"

/* --loss-scale: dynamic, none or a static scale. */
typedef struct {
    SpecLossScaling mode;
    double scale;       /* LOSS_SCALE_STATIC */
} RunLossScale;

typedef struct {
    SpecTraining t;     /* the numbers given, each at its train-block field */
    RunLossScale loss;
} RunOverrides;

/* The excludes bit of --epochs, shared with --steps in cli/cmd_run.c (give one). */
#define RUN_EX_LENGTH 1u

/* The rows of the section (offsets into RunOverrides), ended by CLI_END. */
extern const CliOpt run_override_opts[];

/* Refuses settings that contradict each other (--loss-scale none with
 * --scale-growth, a static scale with --scale-init, ...); seen[i] tells
 * whether row i of run_override_opts was given. */
HpcStatus run_overrides_check(const RunOverrides *o, const bool *seen, HpcError *err);

/* Copies the given settings into spec->train. */
void run_overrides_apply(const RunOverrides *o, const bool *seen, ModelSpec *spec);

#endif
