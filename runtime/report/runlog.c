/* runtime/report/runlog.c — see runlog.h. */
#include "report/runlog.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Bar redraws closer together than this are skipped: a fast run would
 * otherwise spend its time writing to the terminal. */
#define RUNLOG_REDRAW_S 0.1

struct RunLog {
    FILE *out;            /* borrowed, may be NULL */
    int jsonl_fd;         /* owned, -1 for none */
    char *jsonl_path;     /* owned copy, for messages */
    off_t jsonl_good;     /* bytes of complete lines in the file */
    int jsonl_errno;      /* the first failed write's errno; 0 while all is well */
    bool bar;             /* redraw a progress bar in place */
    bool bar_shown;       /* the bar is on screen (the cursor is on its line) */
    int64_t every;
    bool higher_is_better;
    double t_open, t_last_step, t_last_draw;
    double rate;          /* 1 / smoothed step time, 0 = unknown */
    double step_s;        /* smoothed step time (first step left out), 0 = none yet */
    double train_s;       /* sum of the step times */
    int64_t steps;        /* runlog_step calls */
    int64_t tokens;       /* sum of RunLogStep.tokens */
    double peak_mem;      /* largest device_mem_bytes seen */
    RunLogStep last;
    bool have_best;
    double best_value;
    int64_t best_step;
    char best_metric[32];
    bool failed;          /* runlog_set_failed: the run ends in an error */
};

double runlog_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* "1h02m", "2m12s", "45s", "-" for unknown. */
static void fmt_duration(char *buf, size_t n, double s)
{
    if (!isfinite(s) || s < 0) snprintf(buf, n, "-");
    else if (s >= 3600) snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else if (s >= 60) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(buf, n, s < 10 ? "%.1fs" : "%.0fs", s);
}

static void fmt_bytes(char *buf, size_t n, double b)
{
    if (b >= 1024.0 * 1024 * 1024) snprintf(buf, n, "%.1f GiB", b / (1024.0 * 1024 * 1024));
    else snprintf(buf, n, "%.0f MiB", b / (1024.0 * 1024));
}

/* ---- JSONL ---- */

/* JSON has no NaN or inf: a non-finite number is written as null. */
static json_t *json_num(double x)
{
    return isfinite(x) ? json_real(x) : json_null();
}

/* One whole line with one write(); a line the disk cannot take whole is cut
 * off again (ftruncate back to the last complete line), so the file never
 * ends in half a line that `hpc plot` would reject.  After the first
 * failure nothing more is written (runlog_status reports it). */
static void jsonl_put_line(RunLog *log, const char *text)
{
    size_t n = strlen(text);
    char *line = xmalloc(n + 2);
    memcpy(line, text, n);
    line[n++] = '\n';
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(log->jsonl_fd, line + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            log->jsonl_errno = w < 0 ? errno : EIO;
            if (done > 0) (void)!ftruncate(log->jsonl_fd, log->jsonl_good);
            break;
        }
        done += (size_t)w;
    }
    if (done == n) log->jsonl_good += (off_t)n;
    free(line);
}

static void jsonl_write(RunLog *log, json_t *obj)
{
    if (!obj) return;
    if (log->jsonl_fd >= 0 && !log->jsonl_errno) {
        json_object_set_new(obj, "elapsed_s", json_real(runlog_clock() - log->t_open));
        char *text = json_dumps(obj, JSON_COMPACT);
        if (text) jsonl_put_line(log, text);
        else log->jsonl_errno = ENOMEM;
        free(text);
    }
    json_decref(obj);
}

/* ---- console ---- */

static int terminal_width(FILE *out)
{
    struct winsize ws;
    if (ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20) return ws.ws_col;
    return 120;
}

/* Clears the bar's line so a normal line can be printed in its place. */
static void bar_clear(RunLog *log)
{
    if (log->bar_shown) fputs("\r\033[K", log->out);
    log->bar_shown = false;
}

/* The fields shared by the bar and the plain lines, after "step S/T". */
static void fmt_fields(const RunLog *log, char *buf, size_t n)
{
    const RunLogStep *s = &log->last;
    char eta[32], mem[32] = "";
    double left = (double)(s->total_steps - s->step);
    fmt_duration(eta, sizeof eta, log->rate > 0 ? left / log->rate : NAN);
    if (s->device_mem_bytes > 0) {
        char m[24];
        fmt_bytes(m, sizeof m, s->device_mem_bytes);
        snprintf(mem, sizeof mem, "  mem %s", m);
    }
    snprintf(buf, n, "%.2f it/s  ETA %s  loss %.4f  lr %.2e  scale %g  skipped %lld%s",
             log->rate, eta, s->loss, s->lr, s->loss_scale, (long long)s->skipped_total, mem);
}

static void bar_draw(RunLog *log)
{
    const RunLogStep *s = &log->last;
    double frac = s->total_steps > 0 ? (double)s->step / (double)s->total_steps : 0;
    if (frac > 1) frac = 1;
    enum { W = 20 };
    char bar[W + 1];
    int full = (int)(frac * W);
    for (int i = 0; i < W; i++) bar[i] = i < full ? '=' : i == full ? '>' : ' ';
    bar[W] = '\0';
    char fields[256], line[512];
    fmt_fields(log, fields, sizeof fields);
    int len = snprintf(line, sizeof line, "step %lld/%lld [%s] %3.0f%%  %s", (long long)s->step,
                       (long long)s->total_steps, bar, 100 * frac, fields);
    int width = terminal_width(log->out) - 1;
    if (len > width) line[width] = '\0';
    fprintf(log->out, "\r%s\033[K", line);
    fflush(log->out);
    log->bar_shown = true;
    log->t_last_draw = runlog_clock();
}

/* A whole line on the console; the bar (if any) is redrawn under it. */
static void console_line(RunLog *log, const char *text)
{
    if (!log->out) return;
    bar_clear(log);
    fprintf(log->out, "%s\n", text);
    if (log->bar && log->steps > 0) bar_draw(log);
    else fflush(log->out);
}

/* ---- the API ---- */

/* Appending after a run that was killed in the middle of a line: the
 * incomplete tail (after the last newline) is cut off so the next line
 * starts on its own; returns the bytes removed. */
static off_t drop_partial_line(int fd, off_t size)
{
    char buf[4096];
    off_t end = size;
    while (end > 0) {
        off_t from = end > (off_t)sizeof buf ? end - (off_t)sizeof buf : 0;
        ssize_t n = pread(fd, buf, (size_t)(end - from), from);
        if (n <= 0) return 0;   /* unreadable: leave it as it is */
        for (ssize_t i = n - 1; i >= 0; i--)
            if (buf[i] == '\n') {
                off_t keep = from + i + 1;
                return keep == size || ftruncate(fd, keep) != 0 ? 0 : size - keep;
            }
        end = from;
    }
    return ftruncate(fd, 0) == 0 ? size : 0;
}

static RunLog *open_log(const char *jsonl_path, bool append, FILE *out, bool progress_bar, HpcError *err)
{
    RunLog *log = calloc(1, sizeof *log);
    if (!log) {
        hpc_fail(err, HPC_ERR_OOM, "run log: out of host memory");
        return NULL;
    }
    log->jsonl_fd = -1;
    off_t dropped = 0;
    if (jsonl_path) {
        int flags = O_CREAT | O_CLOEXEC | (append ? O_RDWR | O_APPEND : O_WRONLY | O_TRUNC);   /* RDWR: to find a partial line */
        log->jsonl_fd = open(jsonl_path, flags, 0644);
        struct stat st;
        if (log->jsonl_fd < 0 || fstat(log->jsonl_fd, &st) != 0) {
            hpc_fail(err, HPC_ERR_IO, "--log %s: cannot open the run log: %s; check that the folder exists and "
                     "is writable", jsonl_path, strerror(errno));
            if (log->jsonl_fd >= 0) close(log->jsonl_fd);
            free(log);
            return NULL;
        }
        if (append && S_ISREG(st.st_mode)) dropped = drop_partial_line(log->jsonl_fd, st.st_size);
        log->jsonl_good = S_ISREG(st.st_mode) ? st.st_size - dropped : 0;
        log->jsonl_path = xstrdup(jsonl_path);
    }
    log->out = out;
    log->bar = progress_bar && out;
    log->every = 50;
    log->higher_is_better = true;
    log->t_open = log->t_last_step = runlog_clock();
    jsonl_write(log, json_pack("{s:s, s:i, s:I, s:b}", "event", "start", "version", 1, "unix_time",
                               (json_int_t)time(NULL), "appended", append));
    if (log->jsonl_errno) {   /* not even the first line fits: fail before any work */
        runlog_status(log, err);
        close(log->jsonl_fd);
        free(log->jsonl_path);
        free(log);
        return NULL;
    }
    if (dropped)
        runlog_message(log, "run log %s: removed an incomplete last line (%lld bytes) left by an interrupted run",
                       jsonl_path, (long long)dropped);
    return log;
}

RunLog *runlog_open(const char *jsonl_path, FILE *out, bool progress_bar, HpcError *err)
{
    return open_log(jsonl_path, false, out, progress_bar, err);
}

RunLog *runlog_open_append(const char *jsonl_path, FILE *out, bool progress_bar, HpcError *err)
{
    return open_log(jsonl_path, true, out, progress_bar, err);
}

HpcStatus runlog_status(const RunLog *log, HpcError *err)
{
    if (!log || !log->jsonl_errno) return HPC_OK;
    return hpc_fail(err, HPC_ERR_IO, "--log %s: writing the run log failed: %s; it holds every complete line "
                    "up to there (%lld bytes); free space on its disk or give --log another path",
                    log->jsonl_path, strerror(log->jsonl_errno), (long long)log->jsonl_good);
}

void runlog_set_interval(RunLog *log, int64_t every)
{
    if (log) log->every = every < 1 ? 1 : every;
}

void runlog_set_higher_is_better(RunLog *log, bool higher)
{
    if (log) log->higher_is_better = higher;
}

/* The step's time into the training time and the smoothed step time;
 * returns the step time used. */
static double runlog_update_rate(RunLog *log, double seconds, double now)
{
    double dt = seconds > 0 ? seconds : now - log->t_last_step;
    log->t_last_step = now;
    if (!(dt > 0) || !isfinite(dt)) return 0;
    log->train_s += dt;
    if (log->steps == 1) return dt;  /* the first step includes start-up */
    log->step_s = log->step_s > 0 ? (1 - RUNLOG_RATE_ALPHA) * log->step_s + RUNLOG_RATE_ALPHA * dt : dt;
    log->rate = 1.0 / log->step_s;
    return dt;
}

void runlog_step(RunLog *log, const RunLogStep *s)
{
    if (!log) return;
    double now = runlog_clock();
    log->steps++;
    log->tokens += s->tokens;
    if (s->device_mem_bytes > log->peak_mem) log->peak_mem = s->device_mem_bytes;
    log->last = *s;
    double dt = runlog_update_rate(log, s->seconds, now);
    jsonl_write(log, json_pack("{s:s, s:I, s:I, s:i, s:o, s:o, s:o, s:o, s:I, s:I, s:o, s:o, s:o}", "event", "step",
                               "step", (json_int_t)s->step, "total_steps", (json_int_t)s->total_steps,
                               "epoch", s->epoch, "loss", json_num(s->loss), "lr", json_num(s->lr),
                               "loss_scale", json_num(s->loss_scale), "grad_norm", json_num(s->grad_norm),
                               "skipped_total", (json_int_t)s->skipped_total,
                               "tokens", (json_int_t)s->tokens, "step_s", json_num(dt), "it_per_s", json_num(log->rate),
                               "device_mem_bytes", json_num(s->device_mem_bytes)));
    if (!log->out) return;
    bool edge = log->steps == 1 || s->step == s->total_steps;
    if (log->bar) {
        if (edge || now - log->t_last_draw >= RUNLOG_REDRAW_S) bar_draw(log);
    } else if (edge || s->step % log->every == 0) {
        char fields[256];
        fmt_fields(log, fields, sizeof fields);
        fprintf(log->out, "step %lld/%lld  epoch %d  %s\n", (long long)s->step, (long long)s->total_steps,
                s->epoch, fields);
        fflush(log->out);
    }
}

void runlog_skip(RunLog *log, int64_t step, double new_scale)
{
    if (!log) return;
    jsonl_write(log, json_pack("{s:s, s:I, s:o}", "event", "skip", "step", (json_int_t)step,
                               "new_scale", json_num(new_scale)));
    char line[160];
    snprintf(line, sizeof line, "step %lld: inf/NaN in the gradients, update skipped; loss scale now %g",
             (long long)step, new_scale);
    console_line(log, line);
}

void runlog_eval(RunLog *log, int64_t step, int epoch, const char *metric, double value, double loss)
{
    if (!log) return;
    bool better = isfinite(value) && (!log->have_best || (log->higher_is_better ? value > log->best_value
                                                                                 : value < log->best_value));
    if (better) {
        log->have_best = true;
        log->best_value = value;
        log->best_step = step;
        snprintf(log->best_metric, sizeof log->best_metric, "%s", metric);
    }
    jsonl_write(log, json_pack("{s:s, s:I, s:i, s:s, s:o, s:o, s:b}", "event", "eval", "step", (json_int_t)step,
                               "epoch", epoch, "metric", metric, "value", json_num(value), "loss", json_num(loss),
                               "best", better));
    char line[200];
    snprintf(line, sizeof line, "eval at step %lld (epoch %d): %s %.4f, loss %.4f%s", (long long)step, epoch,
             metric, value, loss, better ? "  (best so far)" : "");
    console_line(log, line);
}

void runlog_message(RunLog *log, const char *fmt, ...)
{
    if (!log) return;
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    jsonl_write(log, json_pack("{s:s, s:s}", "event", "message", "text", text));
    console_line(log, text);
}

/* x / seconds, 0 when no time was measured. */
static double per_second(double x, double seconds) { return seconds > 0 ? x / seconds : 0.0; }

void runlog_set_failed(RunLog *log)
{
    if (log) log->failed = true;
}

static void runlog_print_summary(RunLog *log, double wall, double peak)
{
    char train[32], whole[32], mem[32] = "unknown (cpu)";
    fmt_duration(train, sizeof train, log->train_s);
    fmt_duration(whole, sizeof whole, wall);
    if (peak > 0) fmt_bytes(mem, sizeof mem, peak);
    bar_clear(log);
    /* a failed run's error follows: no summary before its first step, and
     * "stopped after", never "done", once it had trained */
    if (log->failed && log->steps == 0) {
        fflush(log->out);
        return;
    }
    fprintf(log->out, "%s %lld steps (%lld skipped) in %s of training, %.2f steps/s, %.0f tokens/s "
            "(whole run %s)\n", log->failed ? "stopped after" : "done:", (long long)log->steps,
            (long long)log->last.skipped_total, train,
            per_second((double)log->steps, log->train_s), per_second((double)log->tokens, log->train_s), whole);
    fprintf(log->out, "peak device memory %s\n", mem);
    if (log->have_best)
        fprintf(log->out, "best dev %s %.4f at step %lld\n", log->best_metric, log->best_value,
                (long long)log->best_step);
    fflush(log->out);
}

HpcStatus runlog_close(RunLog *log, double peak_mem_bytes, HpcError *err)
{
    if (!log) return HPC_OK;
    double wall = runlog_clock() - log->t_open;
    double peak = peak_mem_bytes > log->peak_mem ? peak_mem_bytes : log->peak_mem;
    json_t *sum = json_pack("{s:s, s:o, s:o, s:I, s:o, s:I, s:o, s:o, s:I}", "event", "summary",
                            "wall_s", json_num(wall), "train_s", json_num(log->train_s),
                            "steps", (json_int_t)log->steps,
                            "steps_per_s", json_num(per_second((double)log->steps, log->train_s)),
                            "tokens", (json_int_t)log->tokens,
                            "tokens_per_s", json_num(per_second((double)log->tokens, log->train_s)),
                            "peak_mem_bytes", json_num(peak), "skipped_total", (json_int_t)log->last.skipped_total);
    if (sum && log->failed) json_object_set_new(sum, "failed", json_true());
    if (sum && log->have_best) {
        json_object_set_new(sum, "best_metric", json_string(log->best_metric));
        json_object_set_new(sum, "best_value", json_num(log->best_value));
        json_object_set_new(sum, "best_step", json_integer(log->best_step));
    }
    jsonl_write(log, sum);
    if (log->out) runlog_print_summary(log, wall, peak);
    if (log->jsonl_fd >= 0 && fsync(log->jsonl_fd) != 0 && errno != EINVAL && errno != EROFS && !log->jsonl_errno)
        log->jsonl_errno = errno;
    HpcStatus st = runlog_status(log, err);
    if (log->jsonl_fd >= 0 && close(log->jsonl_fd) != 0 && !st) {
        log->jsonl_errno = errno;
        st = runlog_status(log, err);
    }
    free(log->jsonl_path);
    free(log);
    return st;
}
