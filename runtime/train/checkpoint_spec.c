/* runtime/train/checkpoint_spec.c — checkpoint_read_spec (checkpoint.h): a
 * checkpoint stores its model as .model text, so reading it back takes the
 * front end, through the compiler's one door.  Its own unit so that saving
 * and resuming (checkpoint.c) link no parser: only `hpc run --resume` and
 * `hpc export` of a checkpoint, which start from a spec, come here. */
#include "train/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/step_program_build.h"   /* spec_load_string */

static bool parse_policy(const char *name, SpecPrecision *out)
{
    for (SpecPrecision p = PREC_DEFAULT; p <= PREC_BF16; p++)
        if (strcmp(name, spec_precision_name(p)) == 0) {
            *out = p;
            return true;
        }
    return false;
}

HpcStatus checkpoint_read_spec(const char *dir, ModelSpec *spec, SpecPrecision *policy, HpcError *err)
{
    char *source = NULL, pol[64], name[4200];
    HpcStatus st = checkpoint_read_model_text(dir, &source, pol, sizeof pol, name, sizeof name, err);
    if (st) return st;
    char *diag = NULL;
    size_t dlen = 0;
    FILE *df = open_memstream(&diag, &dlen);
    int nerr = source && df ? spec_load_string(name, source, strlen(source), NULL, spec, df) : -1;
    if (df) fclose(df);
    if (nerr != 0)
        st = hpc_fail(err, HPC_ERR_INPUT, "checkpoint: %s holds no loadable model text: %.600s", name,
                      diag && *diag ? diag : "(missing)");
    if (!st && policy && !parse_policy(pol, policy)) *policy = PREC_DEFAULT;
    free(diag);
    free(source);
    return st;
}
