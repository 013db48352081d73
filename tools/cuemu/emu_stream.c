/* tools/cuemu/emu_stream.c — streams, events, copies and CUDA graphs (cuemu.h).
 *
 * Work enqueued on a stream runs at once in the calling thread, so every
 * stream is always idle and the order of the calls is the order of the
 * work.  A stream being captured (cuStreamBeginCapture, or a stream that
 * waited on an event recorded in a capture) appends its work to the
 * capture's graph instead; cuGraphLaunch runs a graph's work in the order
 * it was captured, which is one valid order of the graph's dependencies.
 * Events keep the host time of their last record, so cuEventElapsedTime
 * times the emulation. */
#define _GNU_SOURCE
#include "cuemu.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EMU_API __attribute__((visibility("default")))

/* One piece of work: fn(arg), arg owned by the node. */
typedef struct {
    void (*fn)(void *);
    void *arg;
} Node;

struct CUgraph_st {
    Node *nodes;
    size_t n, cap;
    int refs;   /* the graph and each instantiation share the nodes */
};

struct CUgraphExec_st { struct CUgraph_st *g; };

struct CUstream_st {
    struct CUgraph_st *capture;   /* the graph this stream records into, or NULL */
    int origin;                   /* BeginCapture was called on this stream */
};

struct CUevent_st {
    unsigned flags;
    int recorded;
    double seconds;
    struct CUgraph_st *capture;   /* recorded while capturing into this graph */
};

static struct CUstream_st g_default_stream;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static struct CUstream_st *stream_of(CUstream s)
{
    if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return &g_default_stream;
    return s;
}

static void graph_release(struct CUgraph_st *g)
{
    if (!g || --g->refs > 0) return;
    for (size_t i = 0; i < g->n; i++) free(g->nodes[i].arg);
    free(g->nodes);
    free(g);
}

CUresult emu_stream_enqueue(CUstream stream, void (*fn)(void *arg), const void *arg, size_t size)
{
    struct CUstream_st *s = stream_of(stream);
    pthread_mutex_lock(&g_lock);
    struct CUgraph_st *g = s->capture;
    if (g) {
        if (g->n == g->cap) {
            g->cap = g->cap ? 2 * g->cap : 64;
            g->nodes = realloc(g->nodes, g->cap * sizeof *g->nodes);
            if (!g->nodes) emu_die("out of host memory for a captured graph");
        }
        void *copy = aligned_alloc(128, (size + 127) / 128 * 128 + 128);   /* as the caller's (a launch's blob) */
        if (!copy) emu_die("out of host memory for a captured graph");
        memcpy(copy, arg, size);
        g->nodes[g->n++] = (Node){fn, copy};
    }
    pthread_mutex_unlock(&g_lock);
    if (!g) fn((void *)arg);
    return CUDA_SUCCESS;
}

/* ---- copies and sets ------------------------------------------------------ */

typedef struct { void *dst; const void *src; size_t bytes; } Copy;
typedef struct { void *dst; unsigned value; size_t count; int width; } Set;

static void run_copy(void *arg)
{
    Copy *c = arg;
    memmove(c->dst, c->src, c->bytes);
}

static void run_set(void *arg)
{
    Set *s = arg;
    if (s->width == 1) {
        memset(s->dst, (int)(s->value & 0xff), s->count);
        return;
    }
    uint32_t *p = s->dst;
    for (size_t i = 0; i < s->count; i++) p[i] = s->value;
}

static void check_device(const char *call, const void *p, size_t bytes)
{
    if (bytes && !emu_mem_valid(p, bytes))
        emu_die("%s: %zu bytes at %p do not lie inside one cuMemAlloc allocation", call, bytes, p);
}

static CUresult copy(const char *call, CUstream s, void *dst, int dst_dev, const void *src, int src_dev,
                     size_t bytes)
{
    if (dst_dev) check_device(call, dst, bytes);
    if (src_dev) check_device(call, src, bytes);
    Copy c = {dst, src, bytes};
    return emu_stream_enqueue(s, run_copy, &c, sizeof c);
}

#define DEV(p) ((void *)(uintptr_t)(p))

EMU_API CUresult cuMemcpyHtoD(CUdeviceptr d, const void *h, size_t n) { return copy("cuMemcpyHtoD", NULL, DEV(d), 1, h, 0, n); }
EMU_API CUresult cuMemcpyDtoH(void *h, CUdeviceptr d, size_t n) { return copy("cuMemcpyDtoH", NULL, h, 0, DEV(d), 1, n); }
EMU_API CUresult cuMemcpyDtoD(CUdeviceptr d, CUdeviceptr s, size_t n) { return copy("cuMemcpyDtoD", NULL, DEV(d), 1, DEV(s), 1, n); }
EMU_API CUresult cuMemcpyHtoDAsync(CUdeviceptr d, const void *h, size_t n, CUstream s) { return copy("cuMemcpyHtoDAsync", s, DEV(d), 1, h, 0, n); }
EMU_API CUresult cuMemcpyDtoHAsync(void *h, CUdeviceptr d, size_t n, CUstream s) { return copy("cuMemcpyDtoHAsync", s, h, 0, DEV(d), 1, n); }
EMU_API CUresult cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr src, size_t n, CUstream s) { return copy("cuMemcpyDtoDAsync", s, DEV(d), 1, DEV(src), 1, n); }

static CUresult set(const char *call, CUstream s, CUdeviceptr d, unsigned v, size_t count, int width)
{
    check_device(call, DEV(d), count * (size_t)width);
    if (width == 4 && d % 4) return CUDA_ERROR_INVALID_VALUE;
    Set x = {DEV(d), v, count, width};
    return emu_stream_enqueue(s, run_set, &x, sizeof x);
}

EMU_API CUresult cuMemsetD8(CUdeviceptr d, unsigned char v, size_t n) { return set("cuMemsetD8", NULL, d, v, n, 1); }
EMU_API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) { return set("cuMemsetD8Async", s, d, v, n, 1); }
EMU_API CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, CUstream s) { return set("cuMemsetD32Async", s, d, v, n, 4); }

/* ---- streams ---------------------------------------------------------------- */

EMU_API CUresult cuStreamCreate(CUstream *s, unsigned flags)
{
    (void)flags;
    *s = calloc(1, sizeof **s);
    return *s ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EMU_API CUresult cuStreamCreateWithPriority(CUstream *s, unsigned flags, int priority)
{
    (void)priority;
    return cuStreamCreate(s, flags);
}

EMU_API CUresult cuStreamDestroy(CUstream s)
{
    if (!s || s->capture) return CUDA_ERROR_INVALID_HANDLE;
    free(s);
    return CUDA_SUCCESS;
}

EMU_API CUresult cuStreamSynchronize(CUstream s)
{
    return stream_of(s)->capture ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

EMU_API CUresult cuStreamQuery(CUstream s)
{
    return stream_of(s)->capture ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

EMU_API CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status)
{
    *status = stream_of(s)->capture ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuStreamBeginCapture(CUstream stream, CUstreamCaptureMode mode)
{
    (void)mode;
    struct CUstream_st *s = stream_of(stream);
    if (s == &g_default_stream) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (s->capture) return CUDA_ERROR_ILLEGAL_STATE;
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
    g->refs = 1;
    pthread_mutex_lock(&g_lock);
    s->capture = g;
    s->origin = 1;
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

/* Streams that joined a capture leave it with its origin (the real driver
 * requires them to have joined back first; the emulator does not check). */
static struct CUstream_st *g_joined[64];
static int g_n_joined;

EMU_API CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph)
{
    struct CUstream_st *s = stream_of(stream);
    if (!s->capture || !s->origin) return CUDA_ERROR_ILLEGAL_STATE;
    pthread_mutex_lock(&g_lock);
    struct CUgraph_st *g = s->capture;
    for (int i = 0; i < g_n_joined; i++)
        if (g_joined[i]->capture == g) g_joined[i]->capture = NULL;
    s->capture = NULL;
    s->origin = 0;
    pthread_mutex_unlock(&g_lock);
    *graph = g;
    return CUDA_SUCCESS;
}

/* ---- events ------------------------------------------------------------------ */

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

EMU_API CUresult cuEventCreate(CUevent *e, unsigned flags)
{
    *e = calloc(1, sizeof **e);
    if (!*e) return CUDA_ERROR_OUT_OF_MEMORY;
    (*e)->flags = flags;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuEventDestroy(CUevent e)
{
    free(e);
    return CUDA_SUCCESS;
}

static void run_record(void *arg)
{
    CUevent e = *(CUevent *)arg;
    e->recorded = 1;
    e->seconds = now_seconds();
}

EMU_API CUresult cuEventRecord(CUevent e, CUstream stream)
{
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    struct CUstream_st *s = stream_of(stream);
    pthread_mutex_lock(&g_lock);
    e->capture = s->capture;
    pthread_mutex_unlock(&g_lock);
    return emu_stream_enqueue(stream, run_record, &e, sizeof e);
}

EMU_API CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned flags)
{
    (void)flags;
    return cuEventRecord(e, s);
}

EMU_API CUresult cuStreamWaitEvent(CUstream stream, CUevent e, unsigned flags)
{
    if (!e || flags) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s = stream_of(stream);
    pthread_mutex_lock(&g_lock);
    if (e->capture && !s->capture) {   /* the stream joins the event's capture */
        if (g_n_joined == 64) emu_die("more than 64 streams joined captures");
        s->capture = e->capture;
        g_joined[g_n_joined++] = s;
    }
    pthread_mutex_unlock(&g_lock);
    return CUDA_SUCCESS;
}

EMU_API CUresult cuEventSynchronize(CUevent e) { return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }
EMU_API CUresult cuEventQuery(CUevent e) { return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

EMU_API CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    if (!a || !b) return CUDA_ERROR_INVALID_HANDLE;
    if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
    if (!a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
    *ms = (float)(1e3 * (b->seconds - a->seconds));
    return CUDA_SUCCESS;
}

/* ---- graphs ------------------------------------------------------------------- */

EMU_API CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph g, unsigned long long flags)
{
    (void)flags;
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    *exec = malloc(sizeof **exec);
    if (!*exec) return CUDA_ERROR_OUT_OF_MEMORY;
    g->refs++;
    (*exec)->g = g;
    return CUDA_SUCCESS;
}

static void run_graph(void *arg)
{
    struct CUgraph_st *g = *(struct CUgraph_st **)arg;
    for (size_t i = 0; i < g->n; i++) g->nodes[i].fn(g->nodes[i].arg);
}

EMU_API CUresult cuGraphLaunch(CUgraphExec exec, CUstream s)
{
    if (!exec) return CUDA_ERROR_INVALID_HANDLE;
    if (stream_of(s)->capture) emu_die("cuGraphLaunch into a capture is not emulated");
    return emu_stream_enqueue(s, run_graph, &exec->g, sizeof exec->g);
}

EMU_API CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    if (!exec) return CUDA_ERROR_INVALID_HANDLE;
    graph_release(exec->g);
    free(exec);
    return CUDA_SUCCESS;
}

EMU_API CUresult cuGraphDestroy(CUgraph g)
{
    if (!g) return CUDA_ERROR_INVALID_HANDLE;
    graph_release(g);
    return CUDA_SUCCESS;
}
