/* tests/test_schedule.c — learning-rate schedules at chosen points against
 * values computed by hand from the HF formulas (docs/precision.md). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "train/schedule.h"

static ScheduleConfig sched(SpecSchedule kind, double lr, int64_t warmup, int64_t total, double floor_ratio)
{
    return (ScheduleConfig){ kind, lr, warmup, total, floor_ratio };
}

static void expect_lr(const ScheduleConfig *c, int64_t s, double want)
{
    double got = schedule_lr(c, s);
    cr_expect(fabs(got - want) <= 1e-12 * fmax(fabs(want), 1e-30) || (want == 0 && got == 0),
              "step %lld: lr %.17g, want %.17g", (long long)s, got, want);
}

Test(schedule, constant_with_warmup)
{
    ScheduleConfig c = sched(SCHED_CONSTANT, 1e-3, 10, 1000, 0);
    expect_lr(&c, 0, 0.0);
    expect_lr(&c, 5, 5e-4);
    expect_lr(&c, 9, 9e-4);
    expect_lr(&c, 10, 1e-3);
    expect_lr(&c, 5000, 1e-3);
    c.warmup_steps = 0;
    expect_lr(&c, 0, 1e-3);
}

Test(schedule, linear)
{
    ScheduleConfig c = sched(SCHED_LINEAR, 2e-5, 100, 1000, 0);
    expect_lr(&c, 0, 0.0);
    expect_lr(&c, 1, 2e-7);
    expect_lr(&c, 50, 1e-5);
    expect_lr(&c, 100, 2e-5);
    expect_lr(&c, 550, 1e-5);        /* 2e-5 * 450 / 900 */
    expect_lr(&c, 910, 2e-6);        /* 2e-5 * 90 / 900 */
    expect_lr(&c, 1000, 0.0);
    expect_lr(&c, 1200, 0.0);        /* never negative */
    c.warmup_steps = 0;
    expect_lr(&c, 0, 2e-5);
    expect_lr(&c, 250, 1.5e-5);
}

Test(schedule, cosine)
{
    ScheduleConfig c = sched(SCHED_COSINE, 1e-3, 100, 1100, 0);
    expect_lr(&c, 50, 5e-4);
    expect_lr(&c, 100, 1e-3);
    expect_lr(&c, 350, 8.5355339059327376e-4);   /* 0.5 (1 + cos(pi/4)) */
    expect_lr(&c, 600, 5e-4);                    /* 0.5 (1 + cos(pi/2)) */
    expect_lr(&c, 850, 1.4644660940672624e-4);   /* 0.5 (1 + cos(3pi/4)) */
    expect_lr(&c, 1100, 0.0);
    expect_lr(&c, 1500, 0.0);                    /* stays at the floor past the end */
}

Test(schedule, cosine_with_floor)
{
    ScheduleConfig c = sched(SCHED_COSINE, 1e-3, 100, 1100, 0.1);
    expect_lr(&c, 50, 5e-4);                     /* warmup ignores the floor */
    expect_lr(&c, 100, 1e-3);
    expect_lr(&c, 600, 5.5e-4);                  /* 0.1 + 0.9 * 0.5 */
    expect_lr(&c, 1100, 1e-4);
    expect_lr(&c, 3000, 1e-4);
}

Test(schedule, config_from_spec)
{
    SpecTraining t;
    memset(&t, 0, sizeof t);
    t.schedule = SCHED_LINEAR;
    t.lr = 3e-5;
    t.warmup_ratio = 0.06;
    ScheduleConfig c;
    schedule_config_from_spec(&c, &t, 1000);
    cr_expect_eq(c.warmup_steps, 60);
    cr_expect_eq(c.total_steps, 1000);
    cr_expect_eq(c.lr, 3e-5);
    schedule_config_from_spec(&c, &t, 33);
    cr_expect_eq(c.warmup_steps, 2, "ceil(0.06 * 33) = ceil(1.98) = 2");
    t.warmup_ratio = 0.1;
    schedule_config_from_spec(&c, &t, 33);
    cr_expect_eq(c.warmup_steps, 4, "ceil(3.3) = 4");
    t.warmup_steps = 7;                        /* explicit steps win over the ratio */
    schedule_config_from_spec(&c, &t, 33);
    cr_expect_eq(c.warmup_steps, 7);
}
