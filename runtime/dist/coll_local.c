/* runtime/dist/coll_local.c — collectives among threads of one process: the
 * stand-in that lets CI run the data-parallel logic on the cpu backend.
 *
 * Each call is two timed barriers: ranks post their buffers, every rank then
 * computes the same result from all posted buffers in rank order (so results
 * are bitwise identical everywhere) into a private copy, and after the second
 * barrier, when nobody reads the posted buffers any more, writes it back. */
#include "dist/collectives.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LOCAL_MAX_RANKS 64

struct CollLocalWorld {
    int world;
    double timeout_s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    unsigned long generation;
    const void *posted[LOCAL_MAX_RANKS];
    bool aborted;
    char why[512];
};

typedef struct { CollLocalWorld *w; } LocalRank;

HpcStatus coll_local_world_new(int world, double timeout_s, CollLocalWorld **out, HpcError *err)
{
    if (world < 1 || world > LOCAL_MAX_RANKS)
        return hpc_fail(err, HPC_ERR_USAGE, "a local world has 1 to %d ranks, not %d", LOCAL_MAX_RANKS, world);
    CollLocalWorld *w = xcalloc(1, sizeof *w);
    w->world = world;
    w->timeout_s = timeout_s > 0 ? timeout_s : 60;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &attr);
    pthread_condattr_destroy(&attr);
    *out = w;
    return HPC_OK;
}

void coll_local_world_free(CollLocalWorld *w)
{
    if (!w) return;
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

static HpcStatus local_stopped(CollLocalWorld *w, const char *what, HpcError *err)
{
    return hpc_fail(err, HPC_ERR_IO, "%s: %s", what, w->why);
}

/* Waits until every rank has arrived (posting `mine` first); fails when the
 * world was aborted or the wait outlasts the timeout (which aborts it). */
static HpcStatus local_barrier(Collectives *c, const void *mine, const char *what, HpcError *err)
{
    CollLocalWorld *w = ((LocalRank *)c->impl)->w;
    pthread_mutex_lock(&w->mu);
    if (w->aborted) {
        pthread_mutex_unlock(&w->mu);
        return local_stopped(w, what, err);
    }
    w->posted[c->rank] = mine;
    unsigned long gen = w->generation;
    if (++w->arrived == w->world) {
        w->arrived = 0;
        w->generation++;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        return HPC_OK;
    }
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += (time_t)w->timeout_s;
    deadline.tv_nsec += (long)((w->timeout_s - (double)(time_t)w->timeout_s) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) { deadline.tv_sec++; deadline.tv_nsec -= 1000000000L; }
    while (gen == w->generation && !w->aborted) {
        if (pthread_cond_timedwait(&w->cv, &w->mu, &deadline) == ETIMEDOUT && gen == w->generation) {
            w->aborted = true;
            snprintf(w->why, sizeof w->why, "rank %d waited %g s for the other ranks in %s; "
                     "a rank is stuck or has died", c->rank, w->timeout_s, what);
            pthread_cond_broadcast(&w->cv);
        }
    }
    bool ok = gen != w->generation;
    pthread_mutex_unlock(&w->mu);
    return ok ? HPC_OK : local_stopped(w, what, err);
}

static const void *local_posted(Collectives *c, int r)
{
    return ((LocalRank *)c->impl)->w->posted[r];
}

/* The reduction every rank computes identically: op over ranks 0..world-1. */
typedef enum { RED_SUM, RED_MAX } Reduction;

static HpcStatus local_allreduce_f64(Collectives *c, double *buf, int64_t n, Reduction op,
                                     const char *what, HpcError *err)
{
    HpcStatus st = local_barrier(c, buf, what, err);
    if (st) return st;
    double *acc = malloc((size_t)(n > 0 ? n : 1) * sizeof *acc);
    if (!acc) return hpc_fail(err, HPC_ERR_OOM, "%s: no memory for %lld values", what, (long long)n);
    memcpy(acc, local_posted(c, 0), (size_t)n * sizeof *acc);
    for (int r = 1; r < c->world; r++) {
        const double *x = local_posted(c, r);
        for (int64_t i = 0; i < n; i++)
            acc[i] = op == RED_SUM ? acc[i] + x[i] : (x[i] > acc[i] || x[i] != x[i] ? x[i] : acc[i]);
    }
    st = local_barrier(c, buf, what, err);
    if (!st) memcpy(buf, acc, (size_t)n * sizeof *acc);
    free(acc);
    return st;
}

static HpcStatus local_sum_f32(Collectives *c, float *buf, int64_t n, HpcError *err)
{
    HpcStatus st = local_barrier(c, buf, "all-reduce (sum, f32)", err);
    if (st) return st;
    float *acc = malloc((size_t)(n > 0 ? n : 1) * sizeof *acc);
    if (!acc) return hpc_fail(err, HPC_ERR_OOM, "all-reduce: no memory for %lld values", (long long)n);
    memcpy(acc, local_posted(c, 0), (size_t)n * sizeof *acc);
    for (int r = 1; r < c->world; r++) {
        const float *x = local_posted(c, r);
        for (int64_t i = 0; i < n; i++) acc[i] += x[i];
    }
    st = local_barrier(c, buf, "all-reduce (sum, f32)", err);
    if (!st) memcpy(buf, acc, (size_t)n * sizeof *acc);
    free(acc);
    return st;
}

static HpcStatus local_sum_f64(Collectives *c, double *buf, int64_t n, HpcError *err)
{
    return local_allreduce_f64(c, buf, n, RED_SUM, "all-reduce (sum, f64)", err);
}

static HpcStatus local_max_f64(Collectives *c, double *buf, int64_t n, HpcError *err)
{
    return local_allreduce_f64(c, buf, n, RED_MAX, "all-reduce (max)", err);
}

static HpcStatus local_allgather(Collectives *c, const float *send, int64_t n, float *recv, HpcError *err)
{
    HpcStatus st = local_barrier(c, send, "all-gather", err);
    if (st) return st;
    for (int r = 0; r < c->world; r++)
        memcpy(recv + (int64_t)r * n, local_posted(c, r), (size_t)n * sizeof *recv);
    return local_barrier(c, send, "all-gather", err);   /* sends stay valid until all copied */
}

static HpcStatus local_broadcast(Collectives *c, void *buf, int64_t bytes, int root, HpcError *err)
{
    if (root < 0 || root >= c->world)
        return hpc_fail(err, HPC_ERR_USAGE, "broadcast from rank %d in a world of %d", root, c->world);
    HpcStatus st = local_barrier(c, buf, "broadcast", err);
    if (st) return st;
    if (c->rank != root) memcpy(buf, local_posted(c, root), (size_t)bytes);
    return local_barrier(c, buf, "broadcast", err);
}

static void local_abort(Collectives *c, const char *why)
{
    CollLocalWorld *w = ((LocalRank *)c->impl)->w;
    pthread_mutex_lock(&w->mu);
    if (!w->aborted) {
        w->aborted = true;
        snprintf(w->why, sizeof w->why, "rank %d stopped: %s", c->rank, why);
    }
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void local_close(Collectives *c)
{
    free(c->impl);
    c->impl = NULL;
}

void coll_local_join(CollLocalWorld *w, int rank, Collectives *out)
{
    HPC_ASSERT(rank >= 0 && rank < w->world);
    LocalRank *lr = xmalloc(sizeof *lr);
    lr->w = w;
    *out = (Collectives){
        .rank = rank, .world = w->world, .kind = "local", .timeout_s = w->timeout_s,
        .allreduce_sum_f32 = local_sum_f32, .allreduce_sum_f64 = local_sum_f64,
        .allreduce_max_f64 = local_max_f64, .allgather_f32 = local_allgather,
        .broadcast = local_broadcast, .abort = local_abort, .close = local_close, .impl = lr,
    };
}
