/* runtime/train/init.c — see init.h. */
#include "train/init.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_threads.h"
#include "train/init_normal.h"
#include "util/phase_clock.h"

/* Elements [s, e) of one parameter: each value depends only on (seed, its
 * index, the parameter's index), so the split over threads never changes a bit. */
static void init_piece(ParamInit kind, int index, float *w, uint64_t seed, int64_t s, int64_t e)
{
    switch (kind) {
    case PARAM_INIT_NORMAL: /* == (float)(INIT_STD * philox_normal(seed, i, index)) */
        init_normals(seed, (uint32_t)index, s, e - s, w + s);
        break;
    case PARAM_INIT_ZEROS:
        for (int64_t i = s; i < e; i++) w[i] = 0.0f;
        break;
    case PARAM_INIT_ONES:
        for (int64_t i = s; i < e; i++) w[i] = 1.0f;
        break;
    }
}

typedef struct { const ParamInfo *p; int index; float *w; uint64_t seed; } OneJob;

static void one_range(void *ctx, int64_t s, int64_t e)
{
    const OneJob *j = ctx;
    init_piece(j->p->init, j->index, j->w, j->seed, s, e);
}

void init_param_f32(const ParamInfo *p, int index, float *w, uint64_t seed)
{
    OneJob j = {.p = p, .index = index, .w = w, .seed = seed};
    cpu_parallel_for(params_numel(p), 1 << 16, one_range, &j);
}

/* ---- the draws of a whole store -------------------------------------------- */

/* What to draw (each parameter's size, kind and tie, copied so that the
 * ParamList it came from may go), where, and the thread drawing it.  The
 * parameters that own storage are laid end to end in one element space
 * [0, total) (start[i]), which one parallel split covers: one wait for the
 * whole store, not one per tensor. */
struct InitDraws {
    int n;
    int64_t *numel;        /* (n); 0 for a tied parameter */
    ParamInit *kind;       /* (n) */
    int *tied_to;          /* (n) */
    int64_t *start;        /* (n + 1) element offsets; start[n] = total */
    uint64_t seed;
    float **w;             /* (n) the tensors (the store takes this array) */
    pthread_t thread;
    bool threaded;         /* drawn on `thread` (else in the caller) */
    atomic_bool done;      /* every value written */
    atomic_bool cancel;    /* nobody will read them: stop soon */
    bool ahead;            /* started by init_store_ahead */
};

static bool overlap_on(void)
{
    const char *v = getenv("HPC_START_OVERLAP");
    return !(v && strcmp(v, "0") == 0);
}

enum { CANCEL_EVERY = 1 << 16 };   /* elements between two looks at the cancel flag */

/* Elements [s, e) of the element space: the pieces of the parameters it covers. */
static void draws_range(void *ctx, int64_t s, int64_t e)
{
    const InitDraws *d = ctx;
    int lo = 0, hi = d->n;   /* the last parameter with start <= s */
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (d->start[mid] <= s) lo = mid;
        else hi = mid;
    }
    for (int i = lo; i < d->n && d->start[i] < e; i++) {
        if (d->numel[i] == 0) continue;
        int64_t a = s > d->start[i] ? s - d->start[i] : 0;
        int64_t b = (e < d->start[i + 1] ? e : d->start[i + 1]) - d->start[i];
        for (int64_t c = a; c < b; c += CANCEL_EVERY) {   /* a run that failed need not wait for all of it */
            if (atomic_load_explicit(&d->cancel, memory_order_relaxed)) return;
            init_piece(d->kind[i], i, d->w[i], d->seed, c, b - c < CANCEL_EVERY ? b : c + CANCEL_EVERY);
        }
    }
}

/* Piece k of `pieces` equal parts of the element space. */
typedef struct { InitDraws *d; int pieces; } PieceJob;

static void pieces_range(void *ctx, int64_t pb, int64_t pe)
{
    const PieceJob *j = ctx;
    int64_t total = j->d->start[j->d->n];
    for (int64_t k = pb; k < pe; k++) draws_range(j->d, total * k / j->pieces, total * (k + 1) / j->pieces);
}

static void draws_run(InitDraws *d)
{
    double t0 = phase_clock_now();
    /* Beside the GPU's opening (cuInit is busy on the cpu: 0.22 s alone,
     * 0.41 s with every core drawing, on the H200 host) two cores stay free. */
    int threads = cpu_threads_count(), pieces = d->threaded && threads >= 8 ? threads - 2 : threads;
    if (d->start[d->n] < (int64_t)pieces << 16) pieces = (int)(d->start[d->n] >> 16) > 1 ? (int)(d->start[d->n] >> 16) : 1;
    PieceJob job = {.d = d, .pieces = pieces};
    cpu_parallel_for(pieces, 1, pieces_range, &job);   /* one piece: in this thread */
    if (atomic_load(&d->cancel)) return;
    phase_spanf(t0, phase_clock_now(), "parameter init: %lld values on %d threads (%s)", (long long)d->start[d->n],
                pieces, !d->threaded ? "in the caller" : d->ahead ? "started ahead, at the start of the run"
                                                                 : "in the background");
    atomic_store(&d->done, true);
}

static void *draws_main(void *arg)
{
    draws_run(arg);
    return NULL;
}

static void draws_free(InitDraws *d, bool with_tensors)
{
    if (!d) return;
    if (with_tensors && d->w) {
        for (int i = 0; i < d->n; i++)
            if (d->tied_to[i] < 0) free(d->w[i]);
        free(d->w);
    }
    free(d->numel);
    free(d->kind);
    free(d->tied_to);
    free(d->start);
    free(d);
}

/* The job for pl, its tensors allocated; NULL (and *bad the parameter) when
 * one cannot be. */
static InitDraws *draws_new(const ParamList *pl, uint64_t seed, int *bad)
{
    InitDraws *d = xcalloc(1, sizeof *d);
    size_t n = (size_t)(pl->n > 0 ? pl->n : 1);
    d->n = pl->n;
    d->seed = seed;
    d->numel = xcalloc(n, sizeof *d->numel);
    d->kind = xcalloc(n, sizeof *d->kind);
    d->tied_to = xcalloc(n, sizeof *d->tied_to);
    d->start = xcalloc(n + 1, sizeof *d->start);
    d->w = xcalloc(n, sizeof *d->w);
    for (int i = 0; i < pl->n; i++) {
        const ParamInfo *p = &pl->p[i];
        d->kind[i] = p->init;
        d->tied_to[i] = p->tied_to;
        d->start[i + 1] = d->start[i];
        if (p->tied_to >= 0) continue;
        d->numel[i] = params_numel(p);
        d->start[i + 1] += d->numel[i];
        d->w[i] = malloc((size_t)d->numel[i] * sizeof(float) + 1);
        if (!d->w[i]) {
            *bad = i;
            draws_free(d, true);
            return NULL;
        }
    }
    for (int i = 0; i < pl->n; i++)
        if (pl->p[i].tied_to >= 0) d->w[i] = d->w[pl->p[i].tied_to];
    return d;
}

/* Draws on a thread of its own when it can, else here. */
static void draws_launch(InitDraws *d, bool background)
{
    d->threaded = background && pthread_create(&d->thread, NULL, draws_main, d) == 0;
    if (!d->threaded) draws_run(d);
}

static void draws_wait(InitDraws *d)
{
    if (d->threaded) pthread_join(d->thread, NULL);
    d->threaded = false;
}

/* Same values: the same seed and, parameter by parameter, the same size,
 * kind and tie (the names do not enter the values). */
static bool draws_match(const InitDraws *d, const ParamList *pl, uint64_t seed)
{
    if (d->seed != seed || d->n != pl->n) return false;
    for (int i = 0; i < pl->n; i++) {
        const ParamInfo *p = &pl->p[i];
        if (d->tied_to[i] != p->tied_to) return false;
        if (p->tied_to < 0 && (d->kind[i] != p->init || d->numel[i] != params_numel(p))) return false;
    }
    return true;
}

/* The draws started ahead, until a store adopts them. */
static pthread_mutex_t ahead_lock = PTHREAD_MUTEX_INITIALIZER;
static InitDraws *ahead;
static bool ahead_exit_hook;

/* At exit: draws nobody adopted are waited for and freed. */
static void ahead_drop(void)
{
    pthread_mutex_lock(&ahead_lock);
    InitDraws *d = ahead;
    ahead = NULL;
    pthread_mutex_unlock(&ahead_lock);
    if (d) {
        atomic_store(&d->cancel, true);
        draws_wait(d);
        draws_free(d, true);
    }
}

void init_store_ahead(const ParamList *pl, uint64_t seed)
{
    if (!overlap_on()) return;
    pthread_mutex_lock(&ahead_lock);
    if (!ahead) {
        int bad;
        InitDraws *d = draws_new(pl, seed, &bad);
        if (d) {
            d->ahead = true;
            d->threaded = pthread_create(&d->thread, NULL, draws_main, d) == 0;
            if (d->threaded) ahead = d;
            else draws_free(d, true);   /* no thread: the store draws for itself later */
        }
        if (ahead && !ahead_exit_hook) ahead_exit_hook = atexit(ahead_drop) == 0;
    }
    pthread_mutex_unlock(&ahead_lock);
}

int64_t init_store_ahead_bytes(void)
{
    pthread_mutex_lock(&ahead_lock);
    int64_t bytes = ahead ? ahead->start[ahead->n] * (int64_t)sizeof(float) : 0;
    pthread_mutex_unlock(&ahead_lock);
    return bytes;
}

HpcStatus init_store_start(ParamStore *ps, const ParamList *pl, uint64_t seed, HpcError *err)
{
    memset(ps, 0, sizeof *ps);
    ps->pl = pl;
    pthread_mutex_lock(&ahead_lock);
    InitDraws *d = ahead;
    ahead = NULL;
    pthread_mutex_unlock(&ahead_lock);
    if (d && !draws_match(d, pl, seed)) {   /* drawn for another model or seed: not ours */
        atomic_store(&d->cancel, true);
        draws_wait(d);
        draws_free(d, true);
        d = NULL;
    }
    if (!d) {
        int bad = 0;
        d = draws_new(pl, seed, &bad);
        if (!d)
            return hpc_fail(err, HPC_ERR_OOM, "init: out of host memory for parameter %s (%lld elements); "
                            "free memory or train a smaller model", pl->p[bad].name,
                            (long long)params_numel(&pl->p[bad]));
        draws_launch(d, overlap_on());
    }
    ps->w = d->w;
    ps->pending = d;
    return HPC_OK;
}

void init_store_wait(ParamStore *ps)
{
    if (!ps->pending) return;
    draws_wait(ps->pending);
    ps->pending->w = NULL;   /* the store owns the tensors */
    draws_free(ps->pending, false);
    ps->pending = NULL;
}

bool init_store_ready(const ParamStore *ps)
{
    return !ps->pending || atomic_load(&ps->pending->done);
}

HpcStatus init_store(ParamStore *ps, const ParamList *pl, uint64_t seed, HpcError *err)
{
    HpcStatus st = init_store_start(ps, pl, seed, err);
    init_store_wait(ps);
    return st;
}

void init_store_free(ParamStore *ps)
{
    if (ps->pending) atomic_store(&ps->pending->cancel, true);   /* freed unread: stop the draws */
    init_store_wait(ps);
    if (ps->w && ps->pl)
        for (int i = 0; i < ps->pl->n; i++)
            if (ps->pl->p[i].tied_to < 0) free(ps->w[i]);
    free(ps->w);
    memset(ps, 0, sizeof *ps);
}
