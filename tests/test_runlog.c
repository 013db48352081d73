/* tests/test_runlog.c — the run log: JSONL events and fields, plain lines
 * every N steps, the progress bar's in-place redraw, the summary. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "report/runlog.h"

/* A RunLog writing its console lines to memory (c->text: fclose c->out
 * before reading it) and its JSONL to jsonl (NULL: none). */
typedef struct {
    char *text;
    size_t len;
    FILE *out;
} Console;

static RunLog *open_console_log(const char *jsonl, bool bar, Console *c)
{
    c->text = NULL;
    c->len = 0;
    c->out = open_memstream(&c->text, &c->len);
    cr_assert_not_null(c->out);
    HpcError err;
    RunLog *log = runlog_open(jsonl, c->out, bar, &err);
    cr_assert_not_null(log, "%s", err.msg);
    return log;
}

/* Runs a short fake training into a JSONL file and a memory stream. */
static char *fake_run(const char *jsonl, bool bar, int64_t every)
{
    Console c;
    RunLog *log = open_console_log(jsonl, bar, &c);
    HpcError err;
    runlog_set_interval(log, every);
    runlog_message(log, "training %s", "cola");
    for (int64_t s = 1; s <= 10; s++) {
        RunLogStep st = {.step = s, .total_steps = 10, .epoch = (int)(s / 6), .loss = 1.0 / (double)s,
                         .lr = 1e-4 * (double)s, .loss_scale = 65536, .grad_norm = 0.5 * (double)s,
                         .skipped_total = s >= 4,
                         .tokens = 100 * s, .device_mem_bytes = 1e9 + 1e6 * (double)s,
                         .seconds = s == 1 ? 1.0 : 0.2};   /* a slow first step (start-up) */
        if (s == 4) {
            st.loss = NAN;
            st.grad_norm = INFINITY;   /* a skipped step's norm */
            runlog_skip(log, 4, 32768);
        }
        runlog_step(log, &st);
        if (s == 5) runlog_eval(log, 5, 0, "mcc", 0.41, 0.6);
        if (s == 10) runlog_eval(log, 10, 1, "mcc", 0.38, 0.55);
    }
    cr_assert_eq(runlog_close(log, 2.5e9, &err), HPC_OK, "%s", err.msg);
    fclose(c.out);
    return c.text;
}

static json_t *read_jsonl(const char *path, int *count)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f);
    json_t *all = json_array();
    char line[4096];
    *count = 0;
    while (fgets(line, sizeof line, f)) {
        json_error_t e;
        json_t *o = json_loads(line, 0, &e);
        cr_assert_not_null(o, "line %d is not JSON: %s", *count + 1, e.text);
        json_array_append_new(all, o);
        (*count)++;
    }
    fclose(f);
    return all;
}

static const char *ev(json_t *o) { return json_string_value(json_object_get(o, "event")); }

Test(runlog, jsonl_events_and_fields)
{
    char path[] = "/tmp/hpc_runlog_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    free(fake_run(path, false, 3));
    int n;
    json_t *all = read_jsonl(path, &n);
    /* start, message, 10 steps, 1 skip, 2 evals, summary */
    cr_assert_eq(n, 16, "%d lines", n);
    cr_expect_str_eq(ev(json_array_get(all, 0)), "start");
    cr_expect_str_eq(ev(json_array_get(all, 1)), "message");
    cr_expect_str_eq(ev(json_array_get(all, n - 1)), "summary");
    int steps = 0;
    for (int i = 0; i < n; i++) {
        json_t *o = json_array_get(all, i);
        cr_expect(json_is_real(json_object_get(o, "elapsed_s")), "every event has elapsed_s");
        if (!strcmp(ev(o), "step")) {
            steps++;
            json_int_t s = json_integer_value(json_object_get(o, "step"));
            json_t *loss = json_object_get(o, "loss");
            if (s == 4) cr_expect(json_is_null(loss), "a NaN loss is written as null");
            else cr_expect_float_eq(json_real_value(loss), 1.0 / (double)s, 1e-12);
            cr_expect_float_eq(json_real_value(json_object_get(o, "lr")), 1e-4 * (double)s, 1e-15);
            cr_expect_eq(json_integer_value(json_object_get(o, "tokens")), 100 * s);
            cr_expect_float_eq(json_real_value(json_object_get(o, "loss_scale")), 65536.0, 0);
            json_t *gn = json_object_get(o, "grad_norm");
            if (s == 4) cr_expect(json_is_null(gn), "a skipped step's inf gradient norm is written as null");
            else cr_expect_float_eq(json_real_value(gn), 0.5 * (double)s, 1e-15);
        }
        if (!strcmp(ev(o), "skip")) {
            cr_expect_eq(json_integer_value(json_object_get(o, "step")), 4);
            cr_expect_float_eq(json_real_value(json_object_get(o, "new_scale")), 32768.0, 0);
        }
        if (!strcmp(ev(o), "eval")) {
            json_int_t s = json_integer_value(json_object_get(o, "step"));
            cr_expect_eq(json_is_true(json_object_get(o, "best")), s == 5, "best flag at step %d", (int)s);
            cr_expect_str_eq(json_string_value(json_object_get(o, "metric")), "mcc");
        }
    }
    cr_expect_eq(steps, 10);
    json_t *sum = json_array_get(all, n - 1);
    cr_expect_eq(json_integer_value(json_object_get(sum, "steps")), 10);
    cr_expect_eq(json_integer_value(json_object_get(sum, "tokens")), 5500);
    cr_expect_float_eq(json_real_value(json_object_get(sum, "best_value")), 0.41, 1e-12);
    cr_expect_eq(json_integer_value(json_object_get(sum, "best_step")), 5);
    cr_expect_float_eq(json_real_value(json_object_get(sum, "peak_mem_bytes")), 2.5e9, 0);
    /* training time = the steps' own times: 1.0 + 9 x 0.2 */
    cr_expect_float_eq(json_real_value(json_object_get(sum, "train_s")), 2.8, 1e-12);
    cr_expect_float_eq(json_real_value(json_object_get(sum, "tokens_per_s")), 5500 / 2.8, 1e-9);
    cr_expect_float_eq(json_real_value(json_object_get(sum, "steps_per_s")), 10 / 2.8, 1e-12);
    cr_expect_eq(json_integer_value(json_object_get(sum, "skipped_total")), 1);
    json_decref(all);
    remove(path);
}

Test(runlog, plain_lines_every_n)
{
    char *text = fake_run(NULL, false, 3);
    /* steps 1 (first), 3, 6, 9 and 10 (last) */
    cr_expect(strstr(text, "step 1/10") && strstr(text, "step 3/10") && strstr(text, "step 6/10") &&
              strstr(text, "step 9/10") && strstr(text, "step 10/10"), "%s", text);
    cr_expect(!strstr(text, "step 2/10") && !strstr(text, "step 5/10"), "%s", text);
    cr_expect(!strchr(text, '\r') && !strstr(text, "\033["), "no terminal codes in plain mode");
    cr_expect(strstr(text, "step 4: inf/NaN in the gradients, update skipped; loss scale now 32768"), "%s", text);
    cr_expect(strstr(text, "eval at step 5 (epoch 0): mcc 0.4100"), "%s", text);
    cr_expect(strstr(text, "best dev mcc 0.4100 at step 5"), "%s", text);
    cr_expect(strstr(text, "done: 10 steps (1 skipped) in 2.8s of training, 3.57 steps/s, 1964 tokens/s (whole run "),
              "%s", text);
    cr_expect(strstr(text, "peak device memory 2.3 GiB"), "%s", text);
    cr_expect(strstr(text, "training cola\n"), "%s", text);
    free(text);
}

/* Rate and ETA come from the steps' own times, never from when runlog_step
 * was called: the first step (start-up) is left out of the rate, the rest
 * take 0.2 s each, so 5 it/s and 4 steps left at step 6 = 0.8 s. */
Test(runlog, rate_and_eta_from_step_times)
{
    char *text = fake_run(NULL, false, 3);
    cr_expect(strstr(text, "step 1/10  epoch 0  0.00 it/s  ETA -  loss 1.0000"), "%s", text);
    cr_expect(strstr(text, "step 6/10  epoch 1  5.00 it/s  ETA 0.8s  loss 0.1667"), "%s", text);
    cr_expect(strstr(text, "step 10/10  epoch 1  5.00 it/s  ETA 0.0s"), "%s", text);
    free(text);
}

/* A slower stretch moves the smoothed rate by RUNLOG_RATE_ALPHA per step:
 * after 0.1 s steps, one 1.1 s step makes the smoothed step time
 * 0.9 x 0.1 + 0.1 x 1.1 = 0.2 s, 5 it/s. */
Test(runlog, rate_is_smoothed_step_time)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    HpcError err;
    RunLog *log = runlog_open(NULL, out, false, &err);
    cr_assert_not_null(log, "%s", err.msg);
    runlog_set_interval(log, 1);
    for (int64_t s = 1; s <= 4; s++)
        runlog_step(log, &(RunLogStep){.step = s, .total_steps = 100, .loss = 0.5, .tokens = 10,
                                       .seconds = s == 4 ? 1.1 : 0.1});
    cr_assert_eq(runlog_close(log, 0, &err), HPC_OK, "%s", err.msg);
    fclose(out);
    cr_expect(strstr(text, "step 3/100  epoch 0  10.00 it/s  ETA 9.7s"), "%s", text);
    cr_expect(strstr(text, "step 4/100  epoch 0  5.00 it/s  ETA 19s"), "%s", text);
    cr_expect(strstr(text, "done: 4 steps (0 skipped) in 1.4s of training, 2.86 steps/s, 29 tokens/s"), "%s", text);
    cr_expect(strstr(text, "peak device memory unknown (cpu)"), "%s", text);
    free(text);
}

Test(runlog, progress_bar_redraws_in_place)
{
    char *text = fake_run(NULL, true, 3);
    cr_expect(strstr(text, "\rstep 1/10 [") != NULL, "%s", text);
    cr_expect(strstr(text, "\rstep 10/10 [====================] 100%") != NULL, "%s", text);
    cr_expect(strstr(text, "\033[K") != NULL);
    /* an eval line clears the bar first, then prints on its own line */
    cr_expect(strstr(text, "\r\033[Keval at step 5") != NULL, "%s", text);
    cr_expect(strstr(text, "ETA") && strstr(text, "it/s") && strstr(text, "scale 65536") &&
              strstr(text, "mem ") && strstr(text, "lr "), "%s", text);
    free(text);
}

Test(runlog, open_failure_names_the_path)
{
    HpcError err = {0};
    RunLog *log = runlog_open("/nonexistent/dir/run.jsonl", NULL, false, &err);
    cr_expect_null(log);
    cr_expect_eq(err.code, HPC_ERR_IO);
    cr_expect(strstr(err.msg, "/nonexistent/dir/run.jsonl") != NULL, "%s", err.msg);
    runlog_step(NULL, &(RunLogStep){0});  /* NULL log: every call is a no-op */
    cr_expect_eq(runlog_close(NULL, 0, &err), HPC_OK);
}

/* The whole file as a string. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    char *text = NULL;
    size_t n = 0;
    FILE *mem = open_memstream(&text, &n);
    for (int c; (c = fgetc(f)) != EOF;) fputc(c, mem);
    fclose(f);
    fclose(mem);
    if (len) *len = n;
    return text;
}

/* Every line of text is a JSON object and the text ends with a newline. */
static int complete_json_lines(const char *text)
{
    int lines = 0;
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        cr_assert_not_null(nl, "the file ends in half a line: \"%s\"", p);
        json_error_t je;
        json_t *o = json_loadb(p, (size_t)(nl - p), 0, &je);
        cr_assert(json_is_object(o), "line %d is not JSON: %s", lines + 1, je.text);
        json_decref(o);
        lines++;
        p = nl + 1;
    }
    return lines;
}

Test(runlog, resume_appends_and_drops_a_partial_last_line)
{
    char path[] = "/tmp/hpc_runlog_append_XXXXXX";
    close(mkstemp(path));
    free(fake_run(path, false, 1));
    size_t before_len;
    char *before = slurp(path, &before_len);
    int before_lines = complete_json_lines(before);
    FILE *f = fopen(path, "a");
    fputs("{\"event\":\"step\",\"st", f);   /* a run killed in the middle of a line */
    fclose(f);
    HpcError err = {0};
    RunLog *log = runlog_open_append(path, NULL, false, &err);
    cr_assert_not_null(log, "%s", err.msg);
    runlog_step(log, &(RunLogStep){.step = 11, .total_steps = 12, .loss = 0.5, .lr = 1e-4});
    cr_assert_eq(runlog_close(log, 0, &err), HPC_OK, "%s", err.msg);
    char *after = slurp(path, NULL);
    cr_expect_eq(memcmp(before, after, before_len), 0, "the earlier log was changed");
    /* start, the message about the removed line, the step, the summary */
    cr_expect_eq(complete_json_lines(after), before_lines + 4);
    cr_expect(strstr(after + before_len, "removed an incomplete last line (19 bytes)") != NULL, "%s",
              after + before_len);
    cr_expect(strstr(after + before_len, "\"appended\":true") != NULL);
    free(before);
    free(after);
    unlink(path);
}

Test(runlog, full_disk_leaves_complete_lines_and_fails)
{
    /* A file-size limit stands in for a full disk: write() stops short at
     * the limit, then fails (EFBIG once SIGXFSZ is ignored). */
    char path[] = "/tmp/hpc_runlog_full_XXXXXX";
    close(mkstemp(path));
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {.rlim_cur = 1500, .rlim_max = RLIM_INFINITY};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    HpcError err = {0};
    RunLog *log = runlog_open(path, NULL, false, &err);
    cr_assert_not_null(log, "%s", err.msg);
    int64_t s = 1;
    for (; s <= 100 && runlog_status(log, &err) == HPC_OK; s++)
        runlog_step(log, &(RunLogStep){.step = s, .total_steps = 100, .loss = 1.0 / (double)s, .lr = 1e-4});
    cr_expect_lt(s, 100, "the limit was never reached");
    cr_expect_eq(runlog_status(log, &err), HPC_ERR_IO);
    cr_expect_eq(runlog_close(log, 0, &err), HPC_ERR_IO);
    cr_expect(strstr(err.msg, path) && strstr(err.msg, "File too large"), "%s", err.msg);
    rl.rlim_cur = RLIM_INFINITY;
    setrlimit(RLIMIT_FSIZE, &rl);
    size_t len;
    char *text = slurp(path, &len);
    cr_expect_leq(len, 1500);
    cr_expect_gt(complete_json_lines(text), 3);
    free(text);
    unlink(path);
}

Test(runlog, a_log_that_takes_nothing_fails_at_open)
{
    HpcError err = {0};
    RunLog *log = runlog_open("/dev/full", NULL, false, &err);
    cr_expect_null(log);
    cr_expect_eq(err.code, HPC_ERR_IO);
    cr_expect(strstr(err.msg, "--log /dev/full") && strstr(err.msg, "No space left on device"), "%s", err.msg);
}

#include "report/plot_svg.h"

static int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
    return n;
}

Test(plot, svg_of_a_run_log)
{
    char log[] = "/tmp/hpc_plotlog_XXXXXX", svg[] = "/tmp/hpc_plotsvg_XXXXXX";
    cr_assert(mkstemp(log) >= 0 && mkstemp(svg) >= 0);
    free(fake_run(log, false, 5));
    HpcError err;
    cr_assert_eq(plot_runlog(log, svg, &err), HPC_OK, "%s", err.msg);
    char *s = slurp(svg, NULL);
    cr_expect(!strncmp(s, "<?xml", 5) && strstr(s, "</svg>\n"), "a whole SVG document");
    cr_expect_eq(count_of(s, "<rect x="), 4, "four panel frames");
    cr_expect(strstr(s, ">training loss</text>") && strstr(s, ">learning rate</text>") &&
              strstr(s, ">dev mcc</text>"), "panel titles");
    cr_expect(strstr(s, ">2^15</text>") && strstr(s, ">2^16</text>"), "log2 ticks on the scale axis");
    cr_expect_eq(count_of(s, "stroke-dasharray"), 1, "one skipped step marked");
    cr_expect_eq(count_of(s, "<circle"), 2, "two evals");
    /* the NaN loss at step 4 splits the loss line: 2 polylines for loss, 1 each for lr, scale
     * and the line through the dev points */
    cr_expect_eq(count_of(s, "<polyline"), 5, "polylines: %d", count_of(s, "<polyline"));
    cr_expect(!strstr(s, "nan") && !strstr(s, "inf"), "no non-finite coordinates");
    free(s);
    remove(log);
    remove(svg);
}

Test(plot, bad_logs)
{
    char log[] = "/tmp/hpc_plotbad_XXXXXX";
    int fd = mkstemp(log);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"event\":\"start\"}\nnot json\n", f);
    fclose(f);
    HpcError err;
    cr_expect_eq(plot_runlog(log, "/tmp/hpc_plot_unused.svg", &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, ":2: not a JSON object") != NULL, "%s", err.msg);
    f = fopen(log, "w");
    fputs("{\"event\":\"start\"}\n", f);
    fclose(f);
    cr_expect_eq(plot_runlog(log, "/tmp/hpc_plot_unused.svg", &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "no \"step\" events") != NULL, "%s", err.msg);
    cr_expect_eq(plot_runlog("/nonexistent.jsonl", "/tmp/x.svg", &err), HPC_ERR_IO);
    remove(log);
}

Test(plot, long_series_is_thinned_but_keeps_spikes)
{
    PlotPanel p = {.title = "t", .xlabel = "step", .ylabel = "y"};
    for (int i = 0; i < 100000; i++) plot_series_push(&p.data, i, i == 54321 ? 1000.0 : sin(i * 0.01));
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    plot_svg_emit(f, "thin", &p, 1, 1);
    fclose(f);
    int points = count_of(text, ",") - 0;
    cr_expect_lt(points, PLOT_MAX_POINTS + 50, "%d points written", points);
    cr_expect(strstr(text, ">1000</text>") != NULL, "the spike sets the y range");
    free(text);
    plot_panel_free(&p);
}

Test(plot, output_onto_its_input_is_refused_and_a_failed_write_keeps_the_old_picture)
{
    char log[] = "/tmp/hpc_plotin_XXXXXX", svg[] = "/tmp/hpc_plotold_XXXXXX";
    close(mkstemp(log));
    close(mkstemp(svg));
    free(fake_run(log, false, 1));
    size_t log_len;
    char *log_text = slurp(log, &log_len);
    HpcError err = {0};
    cr_expect_eq(plot_runlog(log, log, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "the run log being drawn") != NULL, "%s", err.msg);
    char *same = slurp(log, NULL);
    cr_expect_str_eq(same, log_text, "the log was changed");
    FILE *f = fopen(svg, "w");
    fputs("<svg>old picture</svg>\n", f);
    fclose(f);
    signal(SIGXFSZ, SIG_IGN);   /* a full disk: the new picture does not fit */
    struct rlimit rl = {.rlim_cur = 4096, .rlim_max = RLIM_INFINITY};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    cr_expect_eq(plot_runlog(log, svg, &err), HPC_ERR_IO);
    rl.rlim_cur = RLIM_INFINITY;
    setrlimit(RLIMIT_FSIZE, &rl);
    char *old = slurp(svg, NULL);
    cr_expect_str_eq(old, "<svg>old picture</svg>\n");
    cr_expect(strstr(err.msg, "unchanged") != NULL, "%s", err.msg);
    cr_expect_eq(plot_runlog(log, svg, &err), HPC_OK, "%s", err.msg);
    free(log_text);
    free(same);
    free(old);
    unlink(log);
    unlink(svg);
}

/* A run that fails: no "done:" before the error, whether it trained or
 * not, and its JSONL summary says failed.  Returns the console text; *failed
 * is the summary's "failed" field. */
static char *failed_run(int64_t steps, bool *failed)
{
    char path[] = "/tmp/hpc_runlog_failed_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    Console c;
    RunLog *log = open_console_log(path, false, &c);
    for (int64_t s = 1; s <= steps; s++)
        runlog_step(log, &(RunLogStep){.step = s, .total_steps = 10, .loss = 0.5, .tokens = 7, .seconds = 0.25});
    runlog_set_failed(log);
    HpcError err;
    cr_assert_eq(runlog_close(log, 0, &err), HPC_OK, "%s", err.msg);
    fclose(c.out);
    int n;
    json_t *all = read_jsonl(path, &n);
    json_t *summary = json_array_get(all, (size_t)n - 1);
    cr_assert_str_eq(ev(summary), "summary");
    *failed = json_is_true(json_object_get(summary, "failed"));
    json_decref(all);
    unlink(path);
    return c.text;
}

Test(runlog, failed_run_says_stopped_not_done)
{
    bool failed = false;
    char *text = failed_run(0, &failed);
    cr_expect_null(strstr(text, "done:"), "%s", text);
    cr_expect_null(strstr(text, "stopped after"), "%s", text);
    cr_expect(failed);
    free(text);
    failed = false;
    text = failed_run(3, &failed);
    cr_expect_null(strstr(text, "done:"), "%s", text);
    cr_expect(strstr(text, "stopped after 3 steps (0 skipped) in 0.8s of training") != NULL, "%s", text);
    cr_expect(failed);
    free(text);
}

Test(runlog, finished_run_has_no_failed_field)
{
    char path[] = "/tmp/hpc_runlog_ok_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    char *text = fake_run(path, false, 5);
    int n;
    json_t *all = read_jsonl(path, &n);
    cr_expect_null(json_object_get(json_array_get(all, (size_t)n - 1), "failed"));
    json_decref(all);
    unlink(path);
    free(text);
}
