/* tests/test_phase_clock.c — the start-up phase record (util/phase_clock.h):
 * nothing is kept while off; marks print in order with their durations,
 * which add up to the time of the last mark; printing forgets them. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/phase_clock.h"

static char *printed(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    cr_assert_not_null(f);
    phase_clock_print(f);
    fclose(f);
    return text;
}

static void sleep_ms(int ms)
{
    struct timespec t = {.tv_sec = 0, .tv_nsec = ms * 1000000L};
    nanosleep(&t, NULL);
}

Test(phase_clock, off_records_nothing)
{
    phase_clock_enable(false);
    phase_mark("never");
    char *t = printed();
    cr_expect_str_eq(t, "");
    free(t);
}

Test(phase_clock, marks_print_in_order_and_add_up)
{
    phase_clock_enable(true);
    cr_expect(phase_clock_process_age() >= 0, "no /proc here?");
    phase_mark("first");
    sleep_ms(30);
    phase_markf("second (%d)", 2);
    char *t = printed();
    double first = -1, second = -1, total = -1;
    const char *a = strstr(t, "s  first\n"), *b = strstr(t, "s  second (2)\n"), *c = strstr(t, "in all");
    cr_assert(a && b && c && a < b && b < c, "%s", t);
    cr_assert_eq(sscanf(strstr(t, "phase") + 5, "%lf", &first), 1, "%s", t);
    cr_assert_eq(sscanf(strstr(strchr(t, '\n') + 1, "phase") + 5, "%lf", &second), 1, "%s", t);
    cr_assert_eq(sscanf(strstr(t, "phases") + 6, "%lf", &total), 1, "%s", t);
    cr_expect(first >= 0 && second >= 0.025 && second < 5, "first %g, second %g", first, second);
    cr_expect(total >= first + second - 0.0015 && total <= first + second + 0.0015, "%g != %g + %g", total, first,
              second);
    free(t);
    char *again = printed();   /* forgotten after printing */
    cr_expect_str_eq(again, "");
    free(again);
}

/* A span (work on another thread) prints its own length and closes no
 * phase: the phase after it still runs from the mark before it. */
Test(phase_clock, spans_close_no_phase)
{
    phase_clock_enable(true);
    phase_mark("before");
    double t0 = phase_clock_now();
    sleep_ms(20);
    phase_spanf(t0, phase_clock_now(), "beside (%s)", "x");
    sleep_ms(10);
    phase_mark("after");
    char *t = printed();
    const char *span = strstr(t, "start-up span"), *after = strstr(t, "s  after\n");
    cr_assert(span && after && span < after, "%s", t);
    double len = -1, phase = -1;
    cr_assert_eq(sscanf(span + strlen("start-up span"), "%lf", &len), 1, "%s", t);
    cr_assert(strstr(span, "s  beside (x) (beside the phases, "), "%s", t);
    cr_assert_eq(sscanf(strstr(span, "start-up phase") + strlen("start-up phase"), "%lf", &phase), 1, "%s", t);
    cr_expect(len >= 0.015 && len < 5, "span %g", len);
    cr_expect(phase >= 0.025 && phase < 5, "the phase after the span is %g s: it must count the span's time", phase);
    free(t);
}
