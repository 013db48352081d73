/* runtime/data/tsv.h — records of a TSV or CSV file held in memory.
 *
 * A TsvReader walks a buffer record by record and splits each into fields:
 *   TSV (quoting off): a record is one line, fields are split on the
 *     delimiter, quotes are ordinary characters (GLUE files hold raw `"`).
 *   CSV (quoting on, RFC 4180): a field may be double-quoted; inside quotes
 *     the delimiter and newlines are text and `""` is one `"`.
 * Lines end in LF, CRLF or a lone CR (as Python's universal newlines, which
 * the GLUE scripts of Hugging Face datasets read with); the last line may
 * lack its newline; a UTF-8 BOM at the start is skipped.  NUL bytes are
 * removed from fields and the text after them kept, as transformers'
 * tokenizers drop U+0000.  Every record remembers the line it starts on, so
 * messages can say FILE:LINE.  Fields are checked to be valid UTF-8.
 *
 * Ownership: the reader borrows the buffer (which must outlive it) and owns
 * the field copies of the current record, valid until the next call;
 * tsv_free releases them.
 *
 * Usage:
 *   TsvReader r;
 *   tsv_init(&r, data, len, '\t', false);
 *   char why[256];
 *   for (int rc; (rc = tsv_next(&r, why, sizeof why)) != TSV_EOF;)
 *       if (rc == TSV_OK) use(r.fields, r.nfields); else report(r.line, why);
 *   tsv_free(&r);
 */
#ifndef HPC_RUNTIME_TSV_H
#define HPC_RUNTIME_TSV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { TSV_OK, TSV_EOF, TSV_BAD, TSV_OOM } TsvResult;

typedef struct {
    const char *data;     /* borrowed input */
    size_t len, pos;
    char delim;
    bool quoting;         /* CSV rules */
    int64_t next_line;    /* line number where the next record starts (1-based) */
    int64_t line;         /* line number of the current record */
    char **fields;        /* (nfields) NUL-terminated copies, valid until the next call */
    int nfields, fcap;
    char *buf;            /* storage for the fields */
    size_t blen, bcap;
    size_t *offs;         /* (fcap) field offsets into buf */
} TsvReader;

void tsv_init(TsvReader *r, const char *data, size_t len, char delim, bool quoting);

/* Reads the next record.  TSV_BAD: the record is malformed (why says how:
 * an unterminated quote, text after a closing quote, bad UTF-8); the reader
 * has moved past it, so the caller may go on.  A record that is an empty
 * line has one empty field. */
TsvResult tsv_next(TsvReader *r, char *why, size_t why_len);

/* True when the rest of the buffer is only line ends (a file's tail). */
bool tsv_at_end(const TsvReader *r);

void tsv_free(TsvReader *r);

#endif
