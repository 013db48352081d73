/* compiler/diag.c — see diag.h. */
#include "diag.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

/* Echoed source lines are cut to this many bytes around the caret, so a
 * 10 MB line does not flood the terminal. */
enum { ECHO_WIDTH = 100 };

void diag_init(Diag *d, FILE *out)
{
    memset(d, 0, sizeof *d);
    d->out = out;
    d->max_errors = DIAG_MAX_ERRORS;
}

void diag_free(Diag *d)
{
    DiagSource *s = d->sources;
    while (s) {
        DiagSource *next = s->next;
        free(s->name);
        free(s->text);
        free(s);
        s = next;
    }
    d->sources = NULL;
}

DiagSource *diag_source_new(Diag *d, const char *name, const char *text, size_t len)
{
    DiagSource *s = xcalloc(1, sizeof *s);
    s->name = xstrdup(name);
    s->text = xmalloc(len + 1);
    memcpy(s->text, text, len);
    s->text[len] = '\0';
    s->len = len;
    s->next = d->sources;
    d->sources = s;
    return s;
}

bool diag_full(const Diag *d)
{
    return d->errors > d->max_errors;
}

/* Start of 1-based line `line` in src, or NULL. */
static const char *line_start(const DiagSource *src, int line)
{
    const char *p = src->text, *end = src->text + src->len;
    for (int l = 1; l < line; l++) {
        p = memchr(p, '\n', (size_t)(end - p));
        if (!p) return NULL;
        p++;
    }
    return p;
}

static void put_echo_char(FILE *out, char c)
{
    unsigned char u = (unsigned char)c;
    fputc(u == '\t' || (u >= 0x20 && u < 0x7f) ? u : '?', out);
}

/* Prints "  LINE | text" and "     |    ^" with tabs kept for alignment. */
static void echo_line(FILE *out, SrcLoc loc)
{
    const char *p = line_start(loc.src, loc.line);
    if (!p) return;
    const char *end = loc.src->text + loc.src->len;
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) eol = end;
    size_t len = (size_t)(eol - p), caret = loc.col > 0 ? (size_t)loc.col - 1 : 0;
    if (caret > len) caret = len;
    size_t from = caret > ECHO_WIDTH / 2 ? caret - ECHO_WIDTH / 2 : 0;
    size_t to = from + ECHO_WIDTH < len ? from + ECHO_WIDTH : len;
    int w = fprintf(out, "%5d | ", loc.line) - 2;
    if (from > 0) fputs("...", out);
    for (size_t i = from; i < to; i++) put_echo_char(out, p[i]);
    if (to < len) fputs("...", out);
    fprintf(out, "\n%*s| ", w, "");
    if (from > 0) fputs("   ", out);
    for (size_t i = from; i < caret; i++) fputc(p[i] == '\t' ? '\t' : ' ', out);
    fputs("^\n", out);
}

/* Counts the error; returns false if it must not be printed. */
static bool count_error(Diag *d, const char *name)
{
    d->errors++;
    if (d->errors <= d->max_errors) return d->out != NULL;
    if (!d->stopped && d->out) fprintf(d->out, "%s: error: too many errors, stopping\n", name);
    d->stopped = true;
    return false;
}

static void vreport(Diag *d, SrcLoc loc, const char *kind, const char *fmt, va_list ap)
{
    if (loc.src)
        fprintf(d->out, "%s:%d:%d: %s: ", loc.src->name, loc.line, loc.col, kind);
    else
        fprintf(d->out, "%s: ", kind);
    vfprintf(d->out, fmt, ap);
    fputc('\n', d->out);
    if (loc.src) echo_line(d->out, loc);
}

void diag_error(Diag *d, SrcLoc loc, const char *fmt, ...)
{
    if (!count_error(d, loc.src ? loc.src->name : "hpc")) return;
    va_list ap;
    va_start(ap, fmt);
    vreport(d, loc, "error", fmt, ap);
    va_end(ap);
}

void diag_error_file(Diag *d, const char *name, const char *fmt, ...)
{
    if (!count_error(d, name)) return;
    va_list ap;
    fprintf(d->out, "%s: error: ", name);
    va_start(ap, fmt);
    vfprintf(d->out, fmt, ap);
    va_end(ap);
    fputc('\n', d->out);
}

void diag_note(Diag *d, SrcLoc loc, const char *fmt, ...)
{
    if (!d->out || d->stopped || d->errors > d->max_errors) return;
    va_list ap;
    va_start(ap, fmt);
    vreport(d, loc, "note", fmt, ap);
    va_end(ap);
}
