/* tests/test_lossscale.c — loss-scale trajectories for scripted sequences of
 * finite/non-finite steps against the algorithm in docs/precision.md (hand
 * computed for short sequences, and an independent transcription of
 * GradScaler.update for long ones), and the give-up rule. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "train/lossscale.h"

static LossScaleConfig cfg_dynamic(double init, int64_t interval)
{
    LossScaleConfig c;
    ls_config_default(&c);
    c.init = init;
    c.interval = interval;
    return c;
}

Test(lossscale, pytorch_defaults)
{
    LossScaleConfig c;
    ls_config_default(&c);
    cr_expect_eq(c.mode, LOSS_SCALE_DYNAMIC);
    cr_expect_eq(c.init, 65536.0);
    cr_expect_eq(c.growth, 2.0);
    cr_expect_eq(c.backoff, 0.5);
    cr_expect_eq(c.interval, 2000);
    cr_expect_eq(c.max_consecutive_skips, 100);
    LossScaler ls;
    ls_init(&ls, &c);
    cr_expect_eq(ls.scale, 65536.0);
    cr_expect_eq(ls.growth_tracker, 0);
}

/* 'o' = finite step, 'x' = inf/NaN step; expected scale after each step,
 * worked out by hand from: inf -> scale/2, tracker 0; else tracker+1 and
 * at 3 -> scale*2, tracker 0. */
Test(lossscale, interval_3_hand_trajectory)
{
    const char *seq = "oooooo" "xooo" "xx" "oox" "ooo";
    const double want[] = {8, 8, 16, 16, 16, 32,  16, 16, 16, 32,  16, 8,  8, 8, 4,  4, 4, 8};
    const int64_t want_tracker[] = {1, 2, 0, 1, 2, 0,  0, 1, 2, 0,  0, 0,  1, 2, 0,  1, 2, 0};
    LossScaleConfig c = cfg_dynamic(8, 3);
    LossScaler ls;
    ls_init(&ls, &c);
    int64_t skips = 0;
    for (size_t i = 0; seq[i]; i++) {
        bool inf = seq[i] == 'x';
        bool skip = ls_update(&ls, inf);
        skips += inf;
        cr_expect_eq(skip, inf, "step %zu", i);
        cr_expect_eq(ls.scale, want[i], "step %zu: scale %g, want %g", i, ls.scale, want[i]);
        cr_expect_eq(ls.growth_tracker, want_tracker[i], "step %zu tracker", i);
    }
    cr_expect_eq(ls.total_skips, skips);
    cr_expect_eq(ls.consecutive_skips, 0);
    cr_expect(!ls_gave_up(&ls));
}

Test(lossscale, default_interval_2000)
{
    LossScaleConfig c;
    ls_config_default(&c);
    LossScaler ls;
    ls_init(&ls, &c);
    for (int i = 0; i < 1999; i++) ls_update(&ls, false);
    cr_expect_eq(ls.scale, 65536.0);
    cr_expect_eq(ls.growth_tracker, 1999);
    ls_update(&ls, false);
    cr_expect_eq(ls.scale, 131072.0);
    cr_expect_eq(ls.growth_tracker, 0);
    /* an overflow one step before growth resets the count */
    for (int i = 0; i < 1999; i++) ls_update(&ls, false);
    cr_expect(ls_update(&ls, true));
    cr_expect_eq(ls.scale, 65536.0);
    for (int i = 0; i < 1999; i++) ls_update(&ls, false);
    cr_expect_eq(ls.scale, 65536.0);
    ls_update(&ls, false);
    cr_expect_eq(ls.scale, 131072.0);
}

/* GradScaler.update transcribed independently: the scale is an f32 tensor,
 * factors are doubles. */
typedef struct { float scale; int tracker; } RefScaler;

static void ref_update(RefScaler *r, bool found_inf, double growth, double backoff, int interval)
{
    if (found_inf) {
        r->scale = (float)(r->scale * backoff);
        r->tracker = 0;
    } else if (r->tracker + 1 == interval) {
        float next = (float)(r->scale * growth);
        if (isfinite(next)) r->scale = next;
        r->tracker = 0;
    } else {
        r->tracker++;
    }
}

Test(lossscale, random_sequences_match_reference)
{
    const double growths[] = {2.0, 1.5, 3.0}, backoffs[] = {0.5, 0.3, 0.25};
    const int intervals[] = {1, 3, 7};
    uint64_t s = 2024;
    for (int k = 0; k < 3; k++) {
        LossScaleConfig c = cfg_dynamic(1000.0, intervals[k]);
        c.growth = growths[k];
        c.backoff = backoffs[k];
        c.max_consecutive_skips = 0;
        c.min_scale = 0;
        LossScaler ls;
        ls_init(&ls, &c);
        RefScaler ref = {1000.0f, 0};
        for (int i = 0; i < 5000; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            bool inf = (s >> 33) % 10 == 0;        /* 10% overflow steps */
            ls_update(&ls, inf);
            ref_update(&ref, inf, c.growth, c.backoff, intervals[k]);
            cr_assert_eq(ls.scale, (double)ref.scale, "config %d step %d: %.17g vs %.17g",
                         k, i, ls.scale, (double)ref.scale);
            cr_assert_eq(ls.growth_tracker, ref.tracker, "config %d step %d", k, i);
        }
    }
}

Test(lossscale, never_grows_to_inf)
{
    LossScaleConfig c = cfg_dynamic(0x1p127, 1);
    LossScaler ls;
    ls_init(&ls, &c);
    ls_update(&ls, false);
    cr_expect_eq(ls.scale, 0x1p127, "2^128 is inf in f32, so the scale stays");
    cr_expect_eq(ls.growth_tracker, 0);
}

Test(lossscale, gives_up_after_consecutive_skips)
{
    LossScaleConfig c = cfg_dynamic(65536, 2000);
    c.min_scale = 0;                 /* only the skip count */
    c.max_consecutive_skips = 5;
    LossScaler ls;
    ls_init(&ls, &c);
    for (int i = 0; i < 4; i++) ls_update(&ls, true);
    cr_expect(!ls_gave_up(&ls));
    ls_update(&ls, false);           /* a clean step resets the run */
    cr_expect_eq(ls.consecutive_skips, 0);
    for (int i = 0; i < 4; i++) ls_update(&ls, true);
    cr_expect(!ls_gave_up(&ls));
    ls_update(&ls, true);
    cr_expect(ls_gave_up(&ls));
    cr_expect_eq(ls.total_skips, 9);
    char msg[512];
    ls_describe_give_up(&ls, msg, sizeof msg);
    cr_expect(strstr(msg, "5 consecutive skipped steps") != NULL, "%s", msg);
    cr_expect(strstr(msg, "learning rate") != NULL, "%s", msg);
}

Test(lossscale, gives_up_under_the_floor)
{
    LossScaleConfig c;
    ls_config_default(&c);          /* floor 2^-24, 100 skips */
    LossScaler ls;
    ls_init(&ls, &c);
    int steps = 0;
    while (!ls_gave_up(&ls) && steps < 1000) {
        ls_update(&ls, true);
        steps++;
    }
    /* 65536 = 2^16 halved 41 times is 2^-25, the first scale under 2^-24 */
    cr_expect_eq(steps, 41);
    cr_expect_eq(ls.scale, 0x1p-25);
    char msg[512];
    ls_describe_give_up(&ls, msg, sizeof msg);
    cr_expect(strstr(msg, "under the floor") != NULL, "%s", msg);
}

Test(lossscale, static_and_none)
{
    LossScaleConfig c;
    ls_config_default(&c);
    c.mode = LOSS_SCALE_STATIC;
    c.init = 128;
    c.max_consecutive_skips = 3;
    LossScaler ls;
    ls_init(&ls, &c);
    cr_expect(ls_update(&ls, true));
    cr_expect(!ls_update(&ls, false));
    for (int i = 0; i < 2000; i++) ls_update(&ls, false);
    cr_expect_eq(ls.scale, 128.0, "a static scale never changes");
    ls_update(&ls, true);
    ls_update(&ls, true);
    cr_expect(!ls_gave_up(&ls));
    ls_update(&ls, true);
    cr_expect(ls_gave_up(&ls), "static scaling gives up after 3 overflowing steps in a row");
    cr_expect_eq(ls.scale, 128.0);

    SpecTraining t;
    memset(&t, 0, sizeof t);
    t.loss_scaling = LOSS_SCALE_NONE;
    t.scale_init = 65536;
    ls_config_from_spec(&c, &t);
    ls_init(&ls, &c);
    cr_expect_eq(ls.scale, 1.0);
    cr_expect(ls_update(&ls, true));
    cr_expect_eq(ls.scale, 1.0);
}

Test(lossscale, config_from_spec)
{
    SpecTraining t;
    memset(&t, 0, sizeof t);
    t.loss_scaling = LOSS_SCALE_DYNAMIC;
    t.scale_init = 1024;
    t.scale_growth = 4;
    t.scale_backoff = 0.25;
    t.scale_interval = 10;
    t.max_skipped_steps = 7;
    LossScaleConfig c;
    ls_config_from_spec(&c, &t);
    cr_expect_eq(c.init, 1024.0);
    cr_expect_eq(c.growth, 4.0);
    cr_expect_eq(c.backoff, 0.25);
    cr_expect_eq(c.interval, 10);
    cr_expect_eq(c.max_consecutive_skips, 7);
    t.max_skipped_steps = 0;        /* unset: the documented default */
    ls_config_from_spec(&c, &t);
    cr_expect_eq(c.max_consecutive_skips, LS_DEFAULT_MAX_CONSECUTIVE_SKIPS);
}
