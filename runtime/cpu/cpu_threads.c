/* runtime/cpu/cpu_threads.c — the worker pool of cpu_threads.h.
 *
 * One job at a time: the caller publishes (fn, ctx, n, ranges) under the
 * pool mutex, bumps a generation counter and wakes the workers; worker w
 * runs range w (the caller runs range 0), and the last one to finish wakes
 * the caller.  Ranges are fixed fractions of n, so results never depend on
 * which worker is fast. */
#include "cpu/cpu_threads.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "util/error.h"

typedef struct {
    pthread_mutex_t call_lock;   /* serialises cpu_parallel_for callers */
    pthread_mutex_t lock;        /* guards everything below */
    pthread_cond_t work_cv, done_cv;
    pthread_t worker[CPU_THREADS_MAX];
    int n_workers;               /* started workers (threads - 1) */
    int wanted;                  /* cpu_threads_set value, 0 = default */
    uint64_t generation;         /* bumped per job */
    bool shutdown;
    CpuRangeFn fn;
    void *ctx;
    int64_t n;
    int ranges;
    int pending;                 /* ranges not yet finished by workers */
    uint64_t born[CPU_THREADS_MAX]; /* generation when worker i+1 was created */
} Pool;

static Pool pool = {
    .call_lock = PTHREAD_MUTEX_INITIALIZER,
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .work_cv = PTHREAD_COND_INITIALIZER,
    .done_cv = PTHREAD_COND_INITIALIZER,
};

static _Thread_local bool inside_pool; /* nested calls run serially */

static int64_t range_start(int64_t n, int ranges, int r) { return (int64_t)((__int128)n * r / ranges); }

static void *worker_main(void *arg)
{
    int index = (int)(intptr_t)arg;  /* 1 .. n_workers */
    inside_pool = true;
    pthread_mutex_lock(&pool.lock);
    uint64_t seen = pool.born[index - 1]; /* a job published before this thread ran is still its */
    for (;;) {
        while (!pool.shutdown && pool.generation == seen) pthread_cond_wait(&pool.work_cv, &pool.lock);
        if (pool.shutdown) break;
        seen = pool.generation;
        if (index >= pool.ranges) continue;
        CpuRangeFn fn = pool.fn;
        void *ctx = pool.ctx;
        int64_t b = range_start(pool.n, pool.ranges, index), e = range_start(pool.n, pool.ranges, index + 1);
        pthread_mutex_unlock(&pool.lock);
        fn(ctx, b, e);
        pthread_mutex_lock(&pool.lock);
        if (--pool.pending == 0) pthread_cond_signal(&pool.done_cv);
    }
    pthread_mutex_unlock(&pool.lock);
    return NULL;
}

/* The cores a cgroup (v2) CPU quota allows, "QUOTA PERIOD" in cpu.max,
 * rounded up; 0 when unlimited or unknown. */
static long quota_cores(void)
{
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
    if (!f) return 0;
    long long quota = 0, period = 0;
    int got = fscanf(f, "%lld %lld", &quota, &period);   /* "max 100000" reads 0 fields */
    fclose(f);
    return got == 2 && quota > 0 && period > 0 ? (long)((quota + period - 1) / period) : 0;
}

static int default_threads(void)
{
    const char *env = getenv("HPC_CPU_THREADS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 1) return v > CPU_THREADS_MAX ? CPU_THREADS_MAX : (int)v;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    /* A container or taskset may let this process run on fewer: threads
     * beyond those only take turns (and every split waits for the last). */
    cpu_set_t mine;
    if (sched_getaffinity(0, sizeof mine, &mine) == 0 && CPU_COUNT(&mine) >= 1 && CPU_COUNT(&mine) < cores)
        cores = CPU_COUNT(&mine);
    long quota = quota_cores();
    if (quota >= 1 && quota < cores) cores = quota;
    if (cores < 1) cores = 1;
    return cores > CPU_THREADS_MAX ? CPU_THREADS_MAX : (int)cores;
}

int cpu_threads_count(void)
{
    pthread_mutex_lock(&pool.lock);
    int w = pool.wanted;
    pthread_mutex_unlock(&pool.lock);
    return w > 0 ? w : default_threads();
}

/* Stops the workers; called with call_lock held. */
static void stop_workers(void)
{
    pthread_mutex_lock(&pool.lock);
    pool.shutdown = true;
    pthread_cond_broadcast(&pool.work_cv);
    int n = pool.n_workers;
    pthread_mutex_unlock(&pool.lock);
    for (int i = 0; i < n; i++) pthread_join(pool.worker[i], NULL);
    pthread_mutex_lock(&pool.lock);
    pool.n_workers = 0;
    pool.shutdown = false;
    pthread_mutex_unlock(&pool.lock);
}

void cpu_threads_set(int n)
{
    HPC_ASSERT(n >= 0);
    pthread_mutex_lock(&pool.call_lock);
    stop_workers();
    pthread_mutex_lock(&pool.lock);
    pool.wanted = n > CPU_THREADS_MAX ? CPU_THREADS_MAX : n;
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.call_lock);
}

/* Starts workers up to threads - 1; fewer if the system refuses (the
 * remaining ranges then run in the caller).  Called with call_lock held. */
static void start_workers(int threads)
{
    while (pool.n_workers < threads - 1) {
        int index = pool.n_workers + 1;
        pool.born[index - 1] = pool.generation; /* no job is published while call_lock is held */
        if (pthread_create(&pool.worker[pool.n_workers], NULL, worker_main, (void *)(intptr_t)index))
            break;
        pthread_mutex_lock(&pool.lock);
        pool.n_workers++;
        pthread_mutex_unlock(&pool.lock);
    }
}

void cpu_parallel_for(int64_t n, int64_t grain, CpuRangeFn fn, void *ctx)
{
    HPC_ASSERT(n >= 0 && grain >= 1);
    if (n == 0) return;
    int threads = inside_pool ? 1 : cpu_threads_count();
    int64_t by_grain = n / grain;
    int ranges = by_grain < threads ? (int)(by_grain > 0 ? by_grain : 1) : threads;
    if (ranges <= 1) {
        fn(ctx, 0, n);
        return;
    }
    pthread_mutex_lock(&pool.call_lock);
    start_workers(threads);
    pthread_mutex_lock(&pool.lock);
    int helpers = pool.n_workers + 1 < ranges ? pool.n_workers : ranges - 1; /* workers that take a range */
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n = n;
    pool.ranges = ranges;
    pool.pending = helpers;
    pool.generation++;
    pthread_cond_broadcast(&pool.work_cv);
    pthread_mutex_unlock(&pool.lock);

    inside_pool = true;
    fn(ctx, range_start(n, ranges, 0), range_start(n, ranges, 1));
    /* Ranges no worker could take (thread creation failed) run here. */
    for (int r = helpers + 1; r < ranges; r++) fn(ctx, range_start(n, ranges, r), range_start(n, ranges, r + 1));
    inside_pool = false;

    pthread_mutex_lock(&pool.lock);
    while (pool.pending > 0) pthread_cond_wait(&pool.done_cv, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    pthread_mutex_unlock(&pool.call_lock);
}
