/* compiler/artifact_spec.c — the model of NAME.hpc through the front end
 * (artifact_load_spec, artifact_spec.h).  Kept apart from artifact.c so that
 * a program reading only the step program links no parser. */
#include "artifact_spec.h"

#include "spec_load.h"

#include <string.h>

HpcStatus artifact_load_spec(const char *path, ModelSpec *spec, SpecPrecision *policy, FILE *diag,
                             HpcError *err)
{
    Artifact a;
    HpcStatus st = artifact_read(path, &a, err);
    if (st) return st;
    int nerr = spec_load_string(path, a.model_text, strlen(a.model_text), NULL, spec, diag);
    if (nerr)
        st = hpc_fail(err, HPC_ERR_INPUT, "artifact: the model text in %s does not check (%d errors above); "
                      "recompile it with `hpc compile MODEL`", path, nerr);
    if (!st && policy) *policy = a.policy;
    artifact_free(&a);
    return st;
}
