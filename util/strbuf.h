/* util/strbuf.h — a growing, NUL-terminated string for generated text
 * (CUDA source, listings).  Allocation failure panics: the texts are small
 * and built by the compiler, not sized by input.  A zeroed StrBuf is empty;
 * strbuf_free releases it (the caller may instead keep `p` and free() it).
 *
 *   StrBuf s = {0};
 *   strbuf_printf(&s, "#define HIDDEN %d\n", 768);
 *   strbuf_add(&s, body);
 *   use(s.p);
 *   strbuf_free(&s);
 */
#ifndef HPC_UTIL_STRBUF_H
#define HPC_UTIL_STRBUF_H

#include <stddef.h>

typedef struct {
    char *p;      /* NULL until something is added */
    size_t len;   /* bytes before the NUL */
    size_t cap;
} StrBuf;

void strbuf_addn(StrBuf *s, const char *text, size_t n);
void strbuf_add(StrBuf *s, const char *text);
void strbuf_printf(StrBuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void strbuf_free(StrBuf *s);

#endif
