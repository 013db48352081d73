/* util/num_parse.h — numbers from text, parsed once and strictly.
 *
 * Every number hpc reads as text goes through these functions: the command
 * line (cli/options.c), .model literals (grammar/scanner.l), artifact
 * headers (program/artifact.c) and checkpoint state (runtime/train/).
 * They promise:
 *   - the whole text is the number: no leading spaces, no trailing junk,
 *     decimal only (no "0x10", "inf", "nan");
 *   - integers that do not fit 64 bits are NUM_OVERFLOW, never saturated;
 *   - reals that do not fit a double are NUM_OVERFLOW (1e999), and nonzero
 *     reals below the smallest normal double (2.2e-308) are NUM_UNDERFLOW,
 *     whether strtod rounds them to a subnormal (1e-320) or to 0 (1e-400);
 *   - a number outside the caller's range is NUM_RANGE (*out then holds it).
 * num_int_wanted / num_real_wanted write the range for messages, so every
 * message says what is allowed:
 *
 *   int64_t steps;
 *   if (num_int(text, 1, 1000, &steps)) {
 *       char want[96];
 *       fprintf(stderr, "--steps %s: expected %s\n", text, num_int_wanted(1, 1000, want, sizeof want));
 *   }
 *
 * -> "--steps 0: expected an integer in [1, 1000]".
 *
 * num_env_int does the same for an integer setting in the environment
 * (HPC_GEMM_OWN_MIN_TILES, HPC_OPT_ROWS_MIN_CHUNKS), with the usage error
 * that names it.
 */
#ifndef HPC_UTIL_NUM_PARSE_H
#define HPC_UTIL_NUM_PARSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"

typedef enum {
    NUM_OK = 0,
    NUM_SYNTAX,     /* not a number of the wanted form (empty, "12x", " 3", "1.5" for an integer) */
    NUM_OVERFLOW,   /* too large for int64 / uint64 / double */
    NUM_UNDERFLOW,  /* a nonzero real too close to 0 for a normal double */
    NUM_RANGE,      /* a valid number outside the caller's range */
} NumStatus;

/* A range of reals; an end is excluded when its flag says open. */
typedef struct {
    double lo, hi;
    bool lo_open, hi_open;
} NumRange;

/* Every finite double. */
extern const NumRange NUM_ANY_REAL;

/* [+-]?[0-9]+ in [lo, hi].  The _n form reads the n bytes at s (no NUL needed). */
NumStatus num_int(const char *s, int64_t lo, int64_t hi, int64_t *out);
NumStatus num_int_n(const char *s, size_t n, int64_t lo, int64_t hi, int64_t *out);

/* [0-9]+ in [0, hi] (no sign). */
NumStatus num_uint_n(const char *s, size_t n, uint64_t hi, uint64_t *out);
NumStatus num_uint(const char *s, uint64_t hi, uint64_t *out);

/* [+-]?(D+[.D*]|.D+)([eE][+-]?D+)? in r; -0 reads as 0. */
NumStatus num_real(const char *s, NumRange r, double *out);

bool num_in_range(double x, NumRange r);

/* "an integer in [1, 65536]" / "a number in (0, 10]"; returns buf. */
const char *num_int_wanted(int64_t lo, int64_t hi, char *buf, size_t cap);
const char *num_real_wanted(NumRange r, char *buf, size_t cap);

/* What a status means in a message, without the range: "" for NUM_SYNTAX
 * and NUM_RANGE (the range says it), else e.g. "too close to zero for a
 * double (the smallest is 2.2e-308)". */
const char *num_reason(NumStatus st);

/* The environment variable `name` as an integer in [lo, hi] into *out;
 * `unset` when it is unset or empty.  Anything else is HPC_ERR_USAGE:
 * "NAME=V: expected an integer in [lo, hi]: MEANING". */
HpcStatus num_env_int(const char *name, int64_t lo, int64_t hi, int64_t unset, const char *meaning, int64_t *out,
                      HpcError *err);

#endif
