/* util/error.c — see error.h. */
#include "error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

HpcStatus hpc_vfail(HpcError *err, HpcStatus code, const char *fmt, va_list ap)
{
    if (err) {
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    }
    return code;
}

HpcStatus hpc_fail(HpcError *err, HpcStatus code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    hpc_vfail(err, code, fmt, ap);
    va_end(ap);
    return code;
}

const char *hpc_status_name(HpcStatus code)
{
    switch (code) {
    case HPC_OK: return "ok";
    case HPC_ERR_INPUT: return "bad input";
    case HPC_ERR_USAGE: return "usage";
    case HPC_ERR_IO: return "i/o";
    case HPC_ERR_NO_GPU: return "no gpu";
    case HPC_ERR_CUDA: return "cuda";
    case HPC_ERR_OOM: return "out of memory";
    case HPC_ERR_NUMERIC: return "numeric";
    case HPC_ERR_INTERRUPTED: return "interrupted";
    case HPC_ERR_INTERNAL: return "internal";
    }
    return "unknown";
}

void hpc_panic(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "hpc: internal error at %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\nThis is a bug in hpc; please report it with the command that caused it.\n", stderr);
    abort();
}

static void *check_alloc(void *p, size_t n)
{
    if (!p && n) hpc_panic(__FILE__, __LINE__, "out of host memory allocating %zu bytes", n);
    return p;
}

void *xmalloc(size_t n) { return check_alloc(malloc(n), n); }
void *xcalloc(size_t count, size_t size) { return check_alloc(calloc(count, size), count * size); }
void *xrealloc(void *p, size_t n) { return check_alloc(realloc(p, n), n); }
char *xstrdup(const char *s) { return check_alloc(strdup(s), strlen(s) + 1); }
