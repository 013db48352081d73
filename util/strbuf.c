/* util/strbuf.c — see strbuf.h. */
#include "strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"

void strbuf_addn(StrBuf *s, const char *text, size_t n)
{
    if (s->len + n + 1 > s->cap) {
        s->cap = (s->len + n + 1) * 2;
        s->p = xrealloc(s->p, s->cap);
    }
    memcpy(s->p + s->len, text, n);
    s->len += n;
    s->p[s->len] = 0;
}

void strbuf_add(StrBuf *s, const char *text) { strbuf_addn(s, text, strlen(text)); }

void strbuf_printf(StrBuf *s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    HPC_ASSERT(n >= 0);
    if (s->len + (size_t)n + 1 > s->cap) {
        s->cap = (s->len + (size_t)n + 1) * 2;
        s->p = xrealloc(s->p, s->cap);
    }
    va_start(ap, fmt);
    vsnprintf(s->p + s->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    s->len += (size_t)n;
}

void strbuf_free(StrBuf *s)
{
    free(s->p);
    memset(s, 0, sizeof *s);
}
