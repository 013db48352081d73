/* util/error.h — status codes, error messages and invariant checks.
 *
 * Three regimes, never mixed (see STYLE.md):
 *   - user input in .model files: located diagnostics (compiler/diag.h);
 *   - system and runtime failures: functions return an HpcStatus and fill an
 *     HpcError with a one-line message naming the failing call and a remedy;
 *     library code never calls exit();
 *   - broken internal invariants: HPC_ASSERT, which names file:line and aborts.
 *
 * The status values double as the exit codes of `hpc` (documented in
 * `hpc --help` and the README).
 */
#ifndef HPC_UTIL_ERROR_H
#define HPC_UTIL_ERROR_H

#include <stdarg.h>
#include <stddef.h>

typedef enum {
    HPC_OK = 0,
    HPC_ERR_INPUT = 1,     /* bad model file, data file, checkpoint */
    HPC_ERR_USAGE = 2,     /* bad command line or API misuse */
    HPC_ERR_IO = 3,        /* file system: open, read, write, rename */
    HPC_ERR_NO_GPU = 4,    /* no driver or no usable device */
    HPC_ERR_CUDA = 5,      /* a CUDA, NVRTC or cuBLAS call failed */
    HPC_ERR_OOM = 6,       /* host or device memory exhausted */
    HPC_ERR_NUMERIC = 7,   /* training diverged (e.g. loss scale collapsed) */
    HPC_ERR_INTERRUPTED = 8, /* stopped by a signal, state saved */
    HPC_ERR_INTERNAL = 70, /* a bug in hpc */
} HpcStatus;

typedef struct {
    HpcStatus code;
    char msg[1024];
} HpcError;

/* Fills *err (if not NULL) and returns code, so callers write
 *   return hpc_fail(err, HPC_ERR_IO, "open %s: %s", path, strerror(errno)); */
HpcStatus hpc_fail(HpcError *err, HpcStatus code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
HpcStatus hpc_vfail(HpcError *err, HpcStatus code, const char *fmt, va_list ap);

/* A short lower-case name for a status ("input", "cuda", ...). */
const char *hpc_status_name(HpcStatus code);

/* Aborts with file:line and the message; for broken invariants only. */
_Noreturn void hpc_panic(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define HPC_ASSERT(cond)                                                     \
    do {                                                                     \
        if (!(cond)) hpc_panic(__FILE__, __LINE__, "assertion failed: %s", #cond); \
    } while (0)

/* malloc/calloc/realloc that panic on failure; for small bookkeeping only.
 * Large buffers whose size comes from input use plain malloc and report OOM. */
void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);

#endif
