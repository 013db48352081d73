/* util/num_parse.c — see num_parse.h. */
#include "num_parse.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const NumRange NUM_ANY_REAL = {-DBL_MAX, DBL_MAX, false, false};

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* The magnitude of the n digits at s, or false when it passes max. */
static bool digits_value(const char *s, size_t n, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (max - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

static bool all_digits(const char *s, size_t n)
{
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++)
        if (!is_digit(s[i])) return false;
    return true;
}

NumStatus num_uint_n(const char *s, size_t n, uint64_t hi, uint64_t *out)
{
    uint64_t v;
    if (!all_digits(s, n)) return NUM_SYNTAX;
    if (!digits_value(s, n, UINT64_MAX, &v)) return NUM_OVERFLOW;
    *out = v;
    return v <= hi ? NUM_OK : NUM_RANGE;
}

NumStatus num_uint(const char *s, uint64_t hi, uint64_t *out)
{
    return num_uint_n(s, strlen(s), hi, out);
}

NumStatus num_int_n(const char *s, size_t n, int64_t lo, int64_t hi, int64_t *out)
{
    bool neg = n > 0 && s[0] == '-';
    size_t skip = n > 0 && (s[0] == '-' || s[0] == '+');
    uint64_t mag;
    if (!all_digits(s + skip, n - skip)) return NUM_SYNTAX;
    /* -2^63 is the one magnitude that fits only when negative. */
    if (!digits_value(s + skip, n - skip, neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, &mag))
        return NUM_OVERFLOW;
    int64_t v = neg ? (mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
    *out = v;
    return v >= lo && v <= hi ? NUM_OK : NUM_RANGE;
}

NumStatus num_int(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    return num_int_n(s, strlen(s), lo, hi, out);
}

/* Checks the decimal form; *nonzero tells whether a mantissa digit is not 0. */
static bool real_syntax(const char *s, bool *nonzero)
{
    size_t i = 0, int_digits = 0, frac_digits = 0;
    *nonzero = false;
    if (s[i] == '+' || s[i] == '-') i++;
    for (; is_digit(s[i]); i++, int_digits++) *nonzero |= s[i] != '0';
    if (s[i] == '.')
        for (i++; is_digit(s[i]); i++, frac_digits++) *nonzero |= s[i] != '0';
    if (int_digits + frac_digits == 0) return false;
    if (s[i] == 'e' || s[i] == 'E') {
        i++;
        if (s[i] == '+' || s[i] == '-') i++;
        if (!is_digit(s[i])) return false;
        while (is_digit(s[i])) i++;
    }
    return s[i] == '\0';
}

bool num_in_range(double x, NumRange r)
{
    bool lo_ok = r.lo_open ? x > r.lo : x >= r.lo;
    bool hi_ok = r.hi_open ? x < r.hi : x <= r.hi;
    return lo_ok && hi_ok;
}

NumStatus num_real(const char *s, NumRange r, double *out)
{
    bool nonzero;
    if (!real_syntax(s, &nonzero)) return NUM_SYNTAX;
    double v = strtod(s, NULL);   /* the syntax check leaves nothing for strtod to stop at */
    if (isinf(v)) return NUM_OVERFLOW;
    if (nonzero && fabs(v) < DBL_MIN) return NUM_UNDERFLOW;
    if (v == 0) v = 0;            /* -0 -> 0 */
    *out = v;
    return num_in_range(v, r) ? NUM_OK : NUM_RANGE;
}

const char *num_int_wanted(int64_t lo, int64_t hi, char *buf, size_t cap)
{
    snprintf(buf, cap, "an integer in [%lld, %lld]", (long long)lo, (long long)hi);
    return buf;
}

const char *num_real_wanted(NumRange r, char *buf, size_t cap)
{
    snprintf(buf, cap, "a number in %c%g, %g%c", r.lo_open ? '(' : '[', r.lo, r.hi, r.hi_open ? ')' : ']');
    return buf;
}

const char *num_reason(NumStatus st)
{
    return st == NUM_UNDERFLOW ? "too close to zero for a double (the smallest is 2.2e-308)" : "";
}

HpcStatus num_env_int(const char *name, int64_t lo, int64_t hi, int64_t unset, const char *meaning, int64_t *out,
                      HpcError *err)
{
    const char *v = getenv(name);
    *out = unset;
    if (!v || !*v) return HPC_OK;
    int64_t n;
    NumStatus st = num_int(v, lo, hi, &n);
    if (st) {
        char want[96];
        return hpc_fail(err, HPC_ERR_USAGE, "%s=%s: expected %s%s%s: %s", name, v,
                        num_int_wanted(lo, hi, want, sizeof want), *num_reason(st) ? ", " : "", num_reason(st),
                        meaning);
    }
    *out = n;
    return HPC_OK;
}
