/* tests/test_num_parse.c — util/num_parse: the one strict number reader.
 * Every form it accepts and refuses, with the exact status, and the range
 * texts that messages quote. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "num_parse.h"

static NumStatus int_of(const char *s, int64_t lo, int64_t hi, int64_t *v) { return num_int(s, lo, hi, v); }

Test(num_int, accepts_plain_decimal_with_a_sign)
{
    int64_t v = 0;
    cr_expect_eq(int_of("0", INT64_MIN, INT64_MAX, &v), NUM_OK);
    cr_expect_eq(v, 0);
    cr_expect_eq(int_of("42", INT64_MIN, INT64_MAX, &v), NUM_OK);
    cr_expect_eq(v, 42);
    cr_expect_eq(int_of("-7", INT64_MIN, INT64_MAX, &v), NUM_OK);
    cr_expect_eq(v, -7);
    cr_expect_eq(int_of("+5", INT64_MIN, INT64_MAX, &v), NUM_OK);
    cr_expect_eq(v, 5);
    cr_expect_eq(int_of("007", INT64_MIN, INT64_MAX, &v), NUM_OK);
    cr_expect_eq(v, 7);
}

Test(num_int, the_ends_of_int64_fit_one_past_does_not)
{
    int64_t v = 0;
    cr_expect_eq(int_of("9223372036854775807", INT64_MIN, INT64_MAX, &v), NUM_OK);
    cr_expect_eq(v, INT64_MAX);
    cr_expect_eq(int_of("-9223372036854775808", INT64_MIN, INT64_MAX, &v), NUM_OK);
    cr_expect_eq(v, INT64_MIN);
    v = 123;
    cr_expect_eq(int_of("9223372036854775808", INT64_MIN, INT64_MAX, &v), NUM_OVERFLOW);
    cr_expect_eq(int_of("-9223372036854775809", INT64_MIN, INT64_MAX, &v), NUM_OVERFLOW);
    cr_expect_eq(int_of("99999999999999999999", INT64_MIN, INT64_MAX, &v), NUM_OVERFLOW);
    cr_expect_eq(int_of("18446744073709551617", INT64_MIN, INT64_MAX, &v), NUM_OVERFLOW);  /* 2^64 + 1: no wrap */
    cr_expect_eq(v, 123, "an overflow leaves *out alone, got %lld", (long long)v);
}

Test(num_int, refuses_anything_but_the_number)
{
    const char *bad[] = {"", " 1", "1 ", "1x", "0x10", "1.5", "1e3", "-", "+", "--1", "1,000", "١", "\t2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t v = 99;
        cr_expect_eq(int_of(bad[i], INT64_MIN, INT64_MAX, &v), NUM_SYNTAX, "'%s'", bad[i]);
        cr_expect_eq(v, 99, "'%s' wrote %lld", bad[i], (long long)v);
    }
}

Test(num_int, out_of_range_is_range_and_keeps_the_value)
{
    int64_t v = 0;
    cr_expect_eq(int_of("0", 1, 10, &v), NUM_RANGE);
    cr_expect_eq(v, 0);
    cr_expect_eq(int_of("11", 1, 10, &v), NUM_RANGE);
    cr_expect_eq(v, 11);
    cr_expect_eq(int_of("-1", 1, 10, &v), NUM_RANGE);
    cr_expect_eq(int_of("10", 1, 10, &v), NUM_OK);
    cr_expect_eq(int_of("1", 1, 10, &v), NUM_OK);
}

Test(num_int, the_n_form_reads_only_n_bytes)
{
    int64_t v = 0;
    cr_expect_eq(num_int_n("123abc", 3, 0, 1000, &v), NUM_OK);
    cr_expect_eq(v, 123);
    cr_expect_eq(num_int_n("123abc", 4, 0, 1000, &v), NUM_SYNTAX);
    cr_expect_eq(num_int_n("123", 0, 0, 1000, &v), NUM_SYNTAX);
}

Test(num_uint, all_64_bits_and_no_sign)
{
    uint64_t v = 0;
    cr_expect_eq(num_uint("18446744073709551615", UINT64_MAX, &v), NUM_OK);
    cr_expect_eq(v, UINT64_MAX);
    cr_expect_eq(num_uint("18446744073709551616", UINT64_MAX, &v), NUM_OVERFLOW);
    cr_expect_eq(num_uint("-1", UINT64_MAX, &v), NUM_SYNTAX);   /* strtoull would give 2^64 - 1 */
    cr_expect_eq(num_uint("+1", UINT64_MAX, &v), NUM_SYNTAX);
    cr_expect_eq(num_uint("9223372036854775808", INT64_MAX, &v), NUM_RANGE);
}

static NumStatus real_of(const char *s, double *v) { return num_real(s, NUM_ANY_REAL, v); }

Test(num_real, accepts_decimal_forms)
{
    struct { const char *text; double want; } ok[] = {
        {"3e-5", 3e-5}, {"3E-5", 3e-5}, {".5", 0.5}, {"5.", 5.0}, {"-2.5e+3", -2500.0}, {"+1", 1.0},
        {"0", 0.0}, {"0e-400", 0.0}, {"1.7976931348623157e308", DBL_MAX},
        {"2.2250738585072014e-308", DBL_MIN}, {"0.1", 0.1},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        double v = -1;
        cr_expect_eq(real_of(ok[i].text, &v), NUM_OK, "'%s'", ok[i].text);
        cr_expect(v == ok[i].want, "'%s' read as %.17g, want %.17g", ok[i].text, v, ok[i].want);
    }
}

Test(num_real, minus_zero_reads_as_zero)
{
    double v = 1;
    cr_expect_eq(real_of("-0", &v), NUM_OK);
    cr_expect(v == 0 && !signbit(v), "-0 read as %g (sign %d)", v, signbit(v) != 0);
}

Test(num_real, too_large_overflows)
{
    double v = 7;
    cr_expect_eq(real_of("1e999", &v), NUM_OVERFLOW);
    cr_expect_eq(real_of("-1e999", &v), NUM_OVERFLOW);
    cr_expect_eq(real_of("1.8e308", &v), NUM_OVERFLOW);
    cr_expect(v == 7, "an overflow leaves *out alone, got %g", v);
}

/* 1e-320 rounds to a subnormal and 1e-400 to 0: both are refused alike. */
Test(num_real, too_close_to_zero_underflows_whatever_strtod_rounds_to)
{
    const char *tiny[] = {"1e-320", "1e-400", "-1e-400", "4.9e-324", "2.2e-308", "0.0000001e-305"};
    for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
        double v = 7;
        cr_expect_eq(real_of(tiny[i], &v), NUM_UNDERFLOW, "'%s'", tiny[i]);
        cr_expect(v == 7, "'%s' wrote %g", tiny[i], v);
    }
    cr_expect_str_eq(num_reason(NUM_UNDERFLOW), "too close to zero for a double (the smallest is 2.2e-308)");
    cr_expect_str_eq(num_reason(NUM_RANGE), "");
    cr_expect_str_eq(num_reason(NUM_SYNTAX), "");
}

Test(num_real, refuses_anything_but_the_number)
{
    const char *bad[] = {"", "nan", "NaN", "inf", "-inf", "infinity", "0x1p3", " 1", "1 ", "1e", "e5", ".",
                         "1.2.3", "1e+", "--1", "1f", "1,5", "+-1", "1e5.0"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        double v = 7;
        cr_expect_eq(real_of(bad[i], &v), NUM_SYNTAX, "'%s'", bad[i]);
        cr_expect(v == 7, "'%s' wrote %g", bad[i], v);
    }
}

Test(num_real, open_and_closed_ends)
{
    double v;
    NumRange open01 = {0, 1, true, true}, half = {0, 1, true, false}, closed = {0, 1e6, false, false};
    cr_expect_eq(num_real("0", open01, &v), NUM_RANGE);
    cr_expect_eq(num_real("1", open01, &v), NUM_RANGE);
    cr_expect_eq(num_real("0.5", open01, &v), NUM_OK);
    cr_expect_eq(num_real("1", half, &v), NUM_OK);
    cr_expect_eq(num_real("0", closed, &v), NUM_OK);
    cr_expect_eq(num_real("1e6", closed, &v), NUM_OK);
    cr_expect_eq(num_real("1000000.0001", closed, &v), NUM_RANGE);
    cr_expect(v == 1000000.0001, "the value out of range is kept: %.17g", v);
    cr_expect(num_in_range(0.5, open01) && !num_in_range(NAN, closed), "NaN is in no range");
}

Test(num_text, ranges_for_messages)
{
    char buf[96];
    cr_expect_str_eq(num_int_wanted(1, 65536, buf, sizeof buf), "an integer in [1, 65536]");
    cr_expect_str_eq(num_int_wanted(0, INT64_MAX, buf, sizeof buf), "an integer in [0, 9223372036854775807]");
    cr_expect_str_eq(num_real_wanted((NumRange){0, 1, true, true}, buf, sizeof buf), "a number in (0, 1)");
    cr_expect_str_eq(num_real_wanted((NumRange){0, 10, true, false}, buf, sizeof buf), "a number in (0, 10]");
    cr_expect_str_eq(num_real_wanted((NumRange){0, 1e6, false, false}, buf, sizeof buf), "a number in [0, 1e+06]");
}

/* An integer setting from the environment: the default when unset or
 * empty, the value when it is an integer in range, a usage error naming
 * the variable, its text, the range and the meaning otherwise. */
Test(num_env, integer_settings)
{
    HpcError err = {0};
    int64_t v = 0;
    unsetenv("HPC_TEST_SETTING");
    cr_expect_eq(num_env_int("HPC_TEST_SETTING", 1, 1000, 7, "what it is", &v, &err), HPC_OK);
    cr_expect_eq(v, 7);
    setenv("HPC_TEST_SETTING", "", 1);
    cr_expect_eq(num_env_int("HPC_TEST_SETTING", 1, 1000, 7, "what it is", &v, &err), HPC_OK);
    cr_expect_eq(v, 7);
    setenv("HPC_TEST_SETTING", "192", 1);
    cr_expect_eq(num_env_int("HPC_TEST_SETTING", 1, 1000, 7, "what it is", &v, &err), HPC_OK);
    cr_expect_eq(v, 192);
    const char *bad[] = {"0", "1001", "-3", "12abc", " 5", "x", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("HPC_TEST_SETTING", bad[i], 1);
        err = (HpcError){0};
        cr_expect_eq(num_env_int("HPC_TEST_SETTING", 1, 1000, 7, "what it is", &v, &err), HPC_ERR_USAGE, "%s", bad[i]);
        char want[160];
        snprintf(want, sizeof want, "HPC_TEST_SETTING=%s: expected an integer in [1, 1000]", bad[i]);
        cr_expect(strstr(err.msg, want) && strstr(err.msg, "what it is"), "%s", err.msg);
    }
    unsetenv("HPC_TEST_SETTING");
}
