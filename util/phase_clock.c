/* util/phase_clock.c — see phase_clock.h. */
#include "phase_clock.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    char what[120];
    double at;      /* process age at the mark (a span: where it ended) */
    double began;   /* a span: where it began; < 0 for a mark */
} PhaseMark;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static PhaseMark marks[PHASE_CLOCK_MAX];
static int n_marks;
static int state = -1;            /* -1: not decided, 0 off, 1 on */
static double mono_at_first = -1; /* CLOCK_MONOTONIC at the first age read */
static double age_at_first;

static bool env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

bool phase_clock_on(void)
{
    if (state < 0) state = env_on("HPC_STARTUP") || env_on("HPC_PROFILE");
    return state == 1;
}

void phase_clock_enable(bool on) { state = on ? 1 : 0; }

double phase_clock_process_age(void)
{
    FILE *f = fopen("/proc/self/stat", "r");
    double up = -1;
    unsigned long long start = 0;
    if (!f) return -1;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');   /* the command name may hold spaces */
    for (int field = 2; p && field < 22; field++) p = strchr(p + 1, ' ');
    if (!p || sscanf(p + 1, "%llu", &start) != 1) return -1;
    f = fopen("/proc/uptime", "r");
    if (!f) return -1;
    if (fscanf(f, "%lf", &up) != 1) up = -1;
    fclose(f);
    long hz = sysconf(_SC_CLK_TCK);
    return up < 0 || hz <= 0 ? -1 : up - (double)start / (double)hz;
}

static double mono(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The process age now: /proc once (its resolution is 10 ms), then the
 * monotonic clock from there. */
static double age_now(void)
{
    if (mono_at_first < 0) {
        age_at_first = phase_clock_process_age();
        if (age_at_first < 0) age_at_first = 0;
        mono_at_first = mono();
    }
    return age_at_first + (mono() - mono_at_first);
}

static void add(const char *what, double began, double at)
{
    if (n_marks < PHASE_CLOCK_MAX) {
        snprintf(marks[n_marks].what, sizeof marks[n_marks].what, "%s", what);
        marks[n_marks].began = began;
        marks[n_marks++].at = at;
    }
}

static void add_mark(const char *what)
{
    pthread_mutex_lock(&lock);
    add(what, -1, age_now());
    pthread_mutex_unlock(&lock);
}

double phase_clock_now(void)
{
    pthread_mutex_lock(&lock);
    double at = age_now();
    pthread_mutex_unlock(&lock);
    return at;
}

void phase_spanf(double began, double ended, const char *fmt, ...)
{
    if (!phase_clock_on()) return;
    char buf[120];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&lock);
    add(buf, began < 0 ? 0 : began, ended);
    pthread_mutex_unlock(&lock);
}

void phase_mark(const char *what)
{
    if (phase_clock_on()) add_mark(what);
}

void phase_markf(const char *fmt, ...)
{
    if (!phase_clock_on()) return;
    char buf[120];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    add_mark(buf);
}

void phase_clock_print(FILE *f)
{
    pthread_mutex_lock(&lock);
    double prev = 0;
    for (int i = 0; i < n_marks; i++) {
        if (marks[i].began >= 0) {   /* a span beside the phases */
            fprintf(f, "hpc profile: start-up span  %7.3f s  %s (beside the phases, %.3f .. %.3f s)\n",
                    marks[i].at - marks[i].began, marks[i].what, marks[i].began, marks[i].at);
            continue;
        }
        fprintf(f, "hpc profile: start-up phase %7.3f s  %s\n", marks[i].at - prev, marks[i].what);
        prev = marks[i].at;
    }
    if (n_marks) fprintf(f, "hpc profile: start-up phases %7.3f s  in all (process start to the last mark)\n", prev);
    n_marks = 0;
    pthread_mutex_unlock(&lock);
}
