/* compiler/diag.h — located diagnostics for .model files.
 *
 * A DiagSource is one loaded text (a file or a string given to
 * spec_load_string); every AST node points at its source through a SrcLoc.
 * diag_error prints, gcc-style,
 *
 *   bert.model:3:14: error: 'hidden' must be between 1 and 65536, got 0
 *       3 |     hidden = 0
 *         |              ^
 *
 * counts the error, and after `max_errors` errors prints one
 * "NAME: error: too many errors, stopping" line and stays silent.
 * A Diag with out == NULL counts but prints nothing.
 *
 * Ownership: diag_source_new copies name and text; diag_free frees every
 * source the Diag created, so SrcLocs stay valid until diag_free.
 */
#ifndef HPC_COMPILER_DIAG_H
#define HPC_COMPILER_DIAG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define DIAG_MAX_ERRORS 20

typedef struct DiagSource {
    char *name;              /* as printed: "models/bert.model" */
    char *text;              /* the bytes, NUL-terminated (may hold NULs) */
    size_t len;
    struct DiagSource *next; /* owned list in Diag */
} DiagSource;

typedef struct {
    const DiagSource *src;   /* NULL: no location known */
    int line, col;           /* 1-based; col counts bytes */
} SrcLoc;

typedef struct {
    FILE *out;
    int errors;
    int max_errors;
    bool stopped;            /* "too many errors" was printed */
    DiagSource *sources;
} Diag;

void diag_init(Diag *d, FILE *out);
void diag_free(Diag *d);

/* Copies name and text[0..len) into a new source owned by d. */
DiagSource *diag_source_new(Diag *d, const char *name, const char *text, size_t len);

/* An error at loc (file:line:col, the line, a caret). */
void diag_error(Diag *d, SrcLoc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An error about a whole file, no line: "NAME: error: ...". */
void diag_error_file(Diag *d, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A note attached to the previous error (printed only if that one was). */
void diag_note(Diag *d, SrcLoc loc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* True once an error past the limit was reported (and "too many errors"
 * printed): callers stop checking. */
bool diag_full(const Diag *d);

#endif
