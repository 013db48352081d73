/* runtime/api/api_model.c — the C API's `.model` road (api_model.h): read
 * and check a model file or text, then compile it in-process.  The only
 * part of the C API that links the compiler's front end and passes. */
#include "api/api_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program/spec.h"
#include "compiler/step_program_build.h"

/* The spec of a model file or text; located diagnostics go into the
 * message. */
static HpcStatus read_spec(const char *path, const char *text, ModelSpec *spec, HpcError *err)
{
    char *diag = NULL;
    size_t diag_len = 0;
    FILE *d = open_memstream(&diag, &diag_len);
    if (!d) return hpc_fail(err, HPC_ERR_OOM, "hpc_model_open: open_memstream failed");
    HpcStatus st = HPC_OK;
    int rc = path ? spec_load(path, spec, d) : spec_load_string("<model_text>", text, strlen(text), NULL, spec, d);
    fflush(d);
    if (rc < 0) st = hpc_fail(err, HPC_ERR_IO, "hpc_model_open: cannot read %s: %s", path,
                              diag_len ? diag : "unknown error");
    else if (rc > 0) st = hpc_fail(err, HPC_ERR_INPUT, "hpc_model_open: %s has %d error(s):\n%s",
                                   path ? path : "options.model_text", rc, diag);
    fclose(d);
    free(diag);
    return st;
}

HpcStatus api_program_from_model(const char *path, const char *text, const ModelSpec *spec, SpecPrecision policy,
                                 StepProgram *out, HpcError *err)
{
    ModelSpec read;
    if (!spec) {
        HpcStatus st = read_spec(path, text, &read, err);
        if (st) return st;
        spec = &read;
    }
    /* every token: hpc_model_hidden reads the last layer's whole output */
    return step_program_compile_every_token(spec, policy, true, out, err);
}
