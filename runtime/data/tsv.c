/* runtime/data/tsv.c — see tsv.h. */
#include "data/tsv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

void tsv_init(TsvReader *r, const char *data, size_t len, char delim, bool quoting)
{
    memset(r, 0, sizeof *r);
    r->data = data;
    r->len = len;
    r->delim = delim;
    r->quoting = quoting;
    r->next_line = 1;
    if (len >= 3 && memcmp(data, "\xEF\xBB\xBF", 3) == 0) r->pos = 3;
}

void tsv_free(TsvReader *r)
{
    free(r->buf);
    free(r->fields);
    free(r->offs);
    r->buf = NULL;
    r->fields = NULL;
    r->offs = NULL;
}

bool tsv_at_end(const TsvReader *r)
{
    for (size_t i = r->pos; i < r->len; i++)
        if (r->data[i] != '\n' && r->data[i] != '\r') return false;
    return true;
}

static bool buf_put(TsvReader *r, char c)
{
    if (r->blen == r->bcap) {
        size_t cap = r->bcap ? r->bcap * 2 : 1024;
        char *b = realloc(r->buf, cap);
        if (!b) return false;
        r->buf = b;
        r->bcap = cap;
    }
    r->buf[r->blen++] = c;
    return true;
}

/* Ends the current field (NUL) and opens the next one at the buffer's end. */
static bool field_end(TsvReader *r, bool open_next)
{
    if (!buf_put(r, '\0')) return false;
    if (!open_next) return true;
    if (r->nfields == r->fcap) {
        int cap = r->fcap ? r->fcap * 2 : 16;
        size_t *o = realloc(r->offs, (size_t)cap * sizeof *o);
        if (!o) return false;
        r->offs = o;
        r->fcap = cap;
    }
    r->offs[r->nfields++] = r->blen;
    return true;
}

/* A line end at data[i] ("\n", "\r\n" or a lone "\r", as Python's universal
 * newlines that the GLUE scripts read with): its length, else 0. */
static size_t line_end_at(const TsvReader *r, size_t i)
{
    if (r->data[i] == '\n') return 1;
    if (r->data[i] == '\r') return i + 1 < r->len && r->data[i + 1] == '\n' ? 2 : 1;
    return 0;
}

/* Skips to just past the end of the current line (recovery after an error). */
static void skip_line(TsvReader *r)
{
    while (r->pos < r->len && !line_end_at(r, r->pos)) r->pos++;
    if (r->pos < r->len) {
        r->pos += line_end_at(r, r->pos);
        r->next_line++;
    }
}

/* A quoted CSV field starting just after its opening quote. */
static TsvResult read_quoted(TsvReader *r, char *why, size_t why_len)
{
    for (;;) {
        if (r->pos >= r->len) {
            snprintf(why, why_len, "unterminated quoted field (opened on this line, runs to the end of the file)");
            return TSV_BAD;
        }
        char c = r->data[r->pos++];
        if (c == '"') {
            if (r->pos < r->len && r->data[r->pos] == '"') r->pos++;
            else return TSV_OK;
        }
        if (c == '\n') r->next_line++;
        if (c != '\0' && !buf_put(r, c)) return TSV_OOM;   /* NUL removed, the rest kept */
    }
}

/* Reads one record into buf/offs; stops after its line end. */
static TsvResult read_record(TsvReader *r, char *why, size_t why_len)
{
    if (!field_end(r, true)) return TSV_OOM;
    r->blen = 0;
    r->offs[0] = 0;
    for (;;) {
        size_t eol = r->pos < r->len ? line_end_at(r, r->pos) : 0;
        if (r->pos >= r->len || eol) {
            r->pos += eol;
            if (eol) r->next_line++;
            return field_end(r, false) ? TSV_OK : TSV_OOM;
        }
        char c = r->data[r->pos];
        bool field_start = r->blen == r->offs[r->nfields - 1];
        if (r->quoting && c == '"' && field_start) {
            r->pos++;
            TsvResult q = read_quoted(r, why, why_len);
            if (q != TSV_OK) return q;
            if (r->pos < r->len && r->data[r->pos] != r->delim && !line_end_at(r, r->pos)) {
                snprintf(why, why_len, "text after a closing quote; quote the whole field and double inner quotes");
                return TSV_BAD;
            }
            continue;
        }
        r->pos++;
        if (c == r->delim) {
            if (!field_end(r, true)) return TSV_OOM;
        } else if (c != '\0' && !buf_put(r, c)) {   /* NUL removed, the rest kept */
            return TSV_OOM;
        }
    }
}

/* Byte offset of malformed UTF-8 in s[0..n), or -1. */
static int64_t bad_utf8(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &c);
        if (k < 1) return (int64_t)i;
        i += (size_t)k;
    }
    return -1;
}

static TsvResult check_fields(TsvReader *r, char *why, size_t why_len)
{
    char **f = realloc(r->fields, (size_t)r->fcap * sizeof *f);
    if (!f) return TSV_OOM;
    r->fields = f;
    for (int i = 0; i < r->nfields; i++) {
        f[i] = r->buf + r->offs[i];
        int64_t bad = bad_utf8(f[i], strlen(f[i]));
        if (bad >= 0) {
            snprintf(why, why_len, "malformed UTF-8 in column %d at byte %lld of the field (byte 0x%02x); "
                     "convert the file to UTF-8", i + 1, (long long)bad, (unsigned char)f[i][bad]);
            return TSV_BAD;
        }
    }
    return TSV_OK;
}

TsvResult tsv_next(TsvReader *r, char *why, size_t why_len)
{
    if (r->pos >= r->len) return TSV_EOF;
    r->line = r->next_line;
    r->nfields = 0;
    TsvResult rc = read_record(r, why, why_len);
    if (rc == TSV_BAD) {
        skip_line(r);
        return rc;
    }
    if (rc != TSV_OK) return rc;
    return check_fields(r, why, why_len);
}
