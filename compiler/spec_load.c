/* compiler/spec_load.c — the load entry points of spec_load.h: parse and
 * check a .model file (grammar/ and check.c). */
#include "spec_load.h"

#include "check.h"

int spec_load(const char *path, ModelSpec *out, FILE *diag)
{
    return check_load_file(path, out, diag);
}

int spec_load_string(const char *name, const char *text, size_t len,
                     const char *base_dir, ModelSpec *out, FILE *diag)
{
    return check_load_string(name, text, len, base_dir, out, diag);
}
