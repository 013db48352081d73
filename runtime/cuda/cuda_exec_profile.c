/* runtime/cuda/cuda_exec_profile.c — HPC_PROFILE: where a step's time goes,
 * node by node (cuda_exec_internal.h; tables in docs/perf.md).
 *
 * Two ways to time a node.  Eager (HPC_PROFILE=1): each node launched from
 * the host with a CUDA event after it; simple, but at small shapes the
 * host's launch latency shows through (BERT-base 32 x 32: 4.5 ms of rows
 * for a 3.3 ms step).  Graph (HPC_PROFILE=graph[:N]): the step's nodes in a
 * CUDA graph with an event record node after each, as the step runs in
 * training, replayed N times for medians; a second graph without the
 * events, replayed in turn, says what the events themselves cost. */
#include "cuda/cuda_exec_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NODE(id) (&ex->g->nodes[(id)])

HpcStatus cuda_exec_profile_mode(CudaProfileMode *mode, int *replays, HpcError *err)
{
    const char *e = getenv("HPC_PROFILE");
    *replays = CUDA_EXEC_PROFILE_REPLAYS;
    *mode = !e || !*e || strcmp(e, "0") == 0 ? CUDA_PROFILE_OFF : CUDA_PROFILE_EAGER;
    if (!e || strncmp(e, "graph", 5) != 0) return HPC_OK;
    *mode = CUDA_PROFILE_GRAPH;
    if (!e[5]) return HPC_OK;
    char *end = NULL;
    long n = e[5] == ':' ? strtol(e + 6, &end, 10) : 0;
    if (end && end != e + 6 && !*end && n >= 1 && n <= CUDA_EXEC_PROFILE_MAX_REPLAYS) {
        *replays = (int)n;
        return HPC_OK;
    }
    return hpc_fail(err, HPC_ERR_USAGE, "HPC_PROFILE=%s: expected 1 (eager), graph or graph:N with N replays "
                    "from 1 to %d, or 0", e, CUDA_EXEC_PROFILE_MAX_REPLAYS);
}

/* One row of the profile: the nodes that ran the same kernels (or the same
 * GEMM configuration). */
typedef struct {
    char key[200];             /* kernel names (no hash), or the GEMM's shape and dtypes */
    const char *op;            /* IR op kind */
    bool gemm;
    int calls;
    double ms, bytes, flops;
} ProfRow;

static const char *prof_dtype_name(GemmDtype d) { return d == GEMM_F16 ? "f16" : d == GEMM_BF16 ? "bf16" : "f32"; }

/* Bytes a node's kernels must move at least: every input and the output once. */
static double node_bytes(const CudaExec *ex, int id)
{
    const IrNode *n = NODE(id);
    double b = (double)ir_numel(n, ex->B, ex->L) * (double)plan_dtype_size(n->dtype);
    for (int k = 0; k < n->n_in; k++) {
        const IrNode *x = NODE(n->in[k]);
        b += (double)ir_numel(x, ex->B, ex->L) * (double)plan_dtype_size(x->dtype);
    }
    return b;
}

static void profile_key(const CudaExec *ex, int id, ProfRow *r)
{
    const IrNode *n = NODE(id);
    const EopNodeCode *c = &ex->code[id];
    r->op = ir_op_name(n->op);
    r->gemm = c->kind == EOP_GEMM;
    size_t used = 0;
    r->key[0] = 0;
    if (r->gemm) {
        GemmDesc d;
        cuda_exec_gemm_desc(ex, id, &d);
        /* a batched run of dW GEMMs starting here (cuda_exec_dw_batch.c) is one call of them all */
        int run = cuda_exec_dw_batch_len(ex, ex->plan.position[id], ex->plan.n_order);
        if (run > 1) d.batch = run;
        used = (size_t)snprintf(r->key, sizeof r->key, "gemm %s %s->%s M%lld N%lld K%lld x%lld%s%s%s%s",
                                r->op, prof_dtype_name(d.ab_type), prof_dtype_name(d.c_type), (long long)d.M,
                                (long long)d.N, (long long)d.K, (long long)d.batch, d.trans_a ? " tA" : "",
                                d.trans_b ? " tB" : "", run > 1 ? " ptrs" : "", c->bias_epilogue ? " +bias"
                                : d.epilogue == GEMM_EPI_BGRAD_A ? " +bgrad" : d.beta != 0 ? " +C" : "");
        r->flops = 2.0 * (double)d.M * (double)d.N * (double)d.K * (double)d.batch;
    } else {
        r->bytes = node_bytes(ex, id);
    }
    /* Kernels that differ only in a constant (a dropout salt) share a row:
     * the name without its six-digit hash. */
    for (int k = 0; k < c->n_phases && used < sizeof r->key; k++) {
        const char *name = c->phase[k].name;
        int len = (int)strlen(name);
        if (len > 7 && name[len - 7] == '_') len -= 7;
        used += (size_t)snprintf(r->key + used, sizeof r->key - used, "%s%.*s", used ? " + " : "", len, name);
    }
}

static int prof_cmp(const void *a, const void *b)
{
    double x = ((const ProfRow *)a)->ms, y = ((const ProfRow *)b)->ms;
    return (x < y) - (x > y);
}

/* Adds node time ms to its row (rows grow as needed; n_rows <= nodes). */
static void profile_add(ProfRow *rows, int *n_rows, const ProfRow *one, double ms)
{
    int i = 0;
    while (i < *n_rows && strcmp(rows[i].key, one->key) != 0) i++;
    if (i == *n_rows) {
        rows[i] = *one;
        rows[i].ms = rows[i].bytes = rows[i].flops = 0;
        rows[i].calls = 0;
        (*n_rows)++;
    }
    rows[i].calls++;
    rows[i].ms += ms;
    rows[i].bytes += one->bytes;
    rows[i].flops += one->flops;
}

static void profile_print(const CudaExec *ex, ProfRow *rows, int n_rows, double total, const char *how, FILE *f)
{
    qsort(rows, (size_t)n_rows, sizeof *rows, prof_cmp);
    fprintf(f, "hpc profile: B=%lld L=%lld, %.3f ms in %d kernel rows (%s; "
            "GB/s from each input and output read or written once)\n",
            (long long)ex->B, (long long)ex->L, total, n_rows, how);
    fprintf(f, "%9s %6s %6s %9s %10s  %-20s %s\n", "ms", "share", "calls", "us/call", "rate", "op", "kernels");
    for (int i = 0; i < n_rows; i++) {
        const ProfRow *r = &rows[i];
        char rate[32];
        if (r->gemm) snprintf(rate, sizeof rate, "%.1f TF/s", r->ms > 0 ? r->flops / (r->ms * 1e9) : 0.0);
        else snprintf(rate, sizeof rate, "%.0f GB/s", r->ms > 0 ? r->bytes / (r->ms * 1e6) : 0.0);
        fprintf(f, "%9.3f %5.1f%% %6d %9.1f %10s  %-20s %s\n", r->ms, total > 0 ? 100.0 * r->ms / total : 0.0,
                r->calls, 1000.0 * r->ms / r->calls, rate, r->op, r->key);
    }
}

/* By op kind: the same rows summed per IR op (GEMMs and kernels apart). */
static void profile_print_ops(const ProfRow *rows, int n_rows, double total, FILE *f)
{
    ProfRow *ops = xcalloc((size_t)(n_rows > 0 ? n_rows : 1), sizeof *ops);
    int n_ops = 0;
    for (int i = 0; i < n_rows; i++) {
        ProfRow one = rows[i];
        snprintf(one.key, sizeof one.key, "%s%s", rows[i].gemm ? "gemm " : "", rows[i].op);
        int j = 0;
        while (j < n_ops && strcmp(ops[j].key, one.key) != 0) j++;
        if (j == n_ops) {
            ops[j] = one;
            ops[j].calls = 0;
            ops[j].ms = ops[j].bytes = ops[j].flops = 0;
            n_ops++;
        }
        ops[j].calls += one.calls;
        ops[j].ms += one.ms;
        ops[j].bytes += one.bytes;
        ops[j].flops += one.flops;
    }
    qsort(ops, (size_t)n_ops, sizeof *ops, prof_cmp);
    fprintf(f, "hpc profile by op kind:\n%9s %6s %6s %10s  %s\n", "ms", "share", "calls", "rate", "op");
    for (int i = 0; i < n_ops; i++) {
        char rate[32];
        if (ops[i].gemm) snprintf(rate, sizeof rate, "%.1f TF/s", ops[i].ms > 0 ? ops[i].flops / (ops[i].ms * 1e9) : 0.0);
        else snprintf(rate, sizeof rate, "%.0f GB/s", ops[i].ms > 0 ? ops[i].bytes / (ops[i].ms * 1e6) : 0.0);
        fprintf(f, "%9.3f %5.1f%% %6d %10s  %s\n", ops[i].ms, total > 0 ? 100.0 * ops[i].ms / total : 0.0,
                ops[i].calls, rate, ops[i].key);
    }
    free(ops);
}

/* The rows of events 1 .. n-1: node[k] (-1: the tail) took ms[k] (event
 * k - 1 to event k); both tables to stderr. */
static void profile_tables(const CudaExec *ex, const int *node, const double *ms, int n, const CudaExecTail *tail,
                           const char *how)
{
    ProfRow *rows = xcalloc((size_t)n + 1, sizeof *rows);
    int n_rows = 0;
    double total = 0;
    for (int k = 1; k < n; k++) {
        ProfRow one = {0};
        if (node[k] >= 0) profile_key(ex, node[k], &one);
        else {   /* the tail: the optimizer and loss scaler */
            snprintf(one.key, sizeof one.key, "%s", tail->label);
            one.op = "optimizer";
            one.bytes = tail->bytes;
        }
        profile_add(rows, &n_rows, &one, ms[k]);
        total += ms[k];
    }
    profile_print(ex, rows, n_rows, total, how, stderr);
    profile_print_ops(rows, n_rows, total, stderr);
    free(rows);
}

static bool launches(const CudaExec *ex, int id)
{
    return ex->code[id].kind == EOP_GEMM || ex->code[id].kind == EOP_KERNELS;
}

/* Events a profile needs: the start, one per launching node of [0, end),
 * one for the tail. */
static int profile_events(const CudaExec *ex, int end)
{
    int n = 2;
    for (int t = 0; t < end; t++) n += launches(ex, ex->plan.order[t]);
    return n;
}

static HpcStatus create_events(CUevent *ev, int n, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    HpcStatus st = HPC_OK;
    for (int t = 0; t < n && !st; t++) st = CUDA_CHECK(err, cu->cuEventCreate(&ev[t], CU_EVENT_DEFAULT));
    return st;
}

static void destroy_events(CUevent *ev, int n)
{
    for (int t = 0; t < n; t++)
        if (ev[t]) cuda_driver()->cuEventDestroy(ev[t]);
}

HpcStatus cuda_exec_profile_eager(CudaExec *ex, int end, const CudaExecTail *tail, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    int n_events = profile_events(ex, end);
    CUevent *ev = xcalloc((size_t)n_events, sizeof *ev);
    int *node = xcalloc((size_t)n_events, sizeof *node);
    double *ms = xcalloc((size_t)n_events, sizeof *ms);
    int n_ev = 0;
    HpcStatus st = create_events(ev, n_events, err);
    if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(ev[n_ev++], ex->dev->stream));
    for (int t = 0; t < end && !st; t++) {
        int id = ex->plan.order[t];
        if (!launches(ex, id)) continue;
        st = cuda_exec_launch_at(ex, &t, end, err);
        node[n_ev] = id;
        if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(ev[n_ev++], ex->dev->stream));
    }
    if (!st && tail) {
        st = tail->queue(tail->ctx, ex->dev->stream, err);
        node[n_ev] = -1;
        if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(ev[n_ev++], ex->dev->stream));
    }
    if (!st) st = CUDA_CHECK(err, cu->cuEventSynchronize(ev[n_ev - 1]));
    for (int k = 1; k < n_ev && !st; k++) {
        float f = 0;
        st = CUDA_CHECK(err, cu->cuEventElapsedTime(&f, ev[k - 1], ev[k]));
        ms[k] = f;
    }
    if (!st) profile_tables(ex, node, ms, n_ev, tail, "eager, one CUDA event per node");
    destroy_events(ev, n_events);
    free(ms);
    free(node);
    free(ev);
    return st;
}

/* ---- the graph profile (HPC_PROFILE=graph) ------------------------------ */

/* Captures the launching nodes of [0, end) into *exec: with `ev`, an event
 * record node (CU_EVENT_RECORD_EXTERNAL) before the first and after each
 * launch, node[k] the node launched before event k, *n_ev the events
 * recorded (a batched run of dW GEMMs is one launch, named by its first
 * member: fewer events than profile_events counted); with ev NULL, the
 * launches alone. */
static HpcStatus capture_nodes(CudaExec *ex, int end, const CUevent *ev, int *node, int *n_ev_out, CUgraphExec *exec,
                               HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    CUstream s = ex->dev->stream;
    CUgraph graph = NULL;
    HpcStatus st = CUDA_CHECK(err, cu->cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    if (st) return st;
    int n_ev = 0;
    HpcStatus run = HPC_OK;
    if (ev) run = CUDA_CHECK(err, cu->cuEventRecordWithFlags(ev[n_ev++], s, CU_EVENT_RECORD_EXTERNAL));
    for (int t = 0; t < end && !run; t++) {
        int id = ex->plan.order[t];
        if (!launches(ex, id)) continue;
        if (ev) node[n_ev] = id;
        run = cuda_exec_launch_at(ex, &t, end, err);
        if (!run && ev) run = CUDA_CHECK(err, cu->cuEventRecordWithFlags(ev[n_ev++], s, CU_EVENT_RECORD_EXTERNAL));
    }
    if (n_ev_out) *n_ev_out = n_ev;
    HpcError end_err = {0};   /* a failed launch's message is the one to keep */
    st = CUDA_CHECK(run ? &end_err : err, cu->cuStreamEndCapture(s, &graph));
    if (run) st = run;
    if (!st) st = CUDA_CHECK(err, cu->cuGraphInstantiate(exec, graph, 0));
    if (graph) cu->cuGraphDestroy(graph);
    return st;
}

/* The batch's values as staged, kept aside and put back before each
 * replay: later nodes of a step may reuse their bytes (the plan gives a
 * value's range away after its last reader), and a training step stages
 * them anew each time, but the profile's replays follow one another
 * without the host.  Measured on the H200 (2026-12-05): without this the
 * loss after HPC_PROFILE=graph:2 was 0.694 against a plain step's 0.687. */
typedef struct {
    CUdeviceptr saved;
    size_t bytes;
} StagedInputs;

/* Bytes of value i when it is a staged input (EOP_UPLOAD), else 0. */
static size_t staged_bytes(const CudaExec *ex, int i)
{
    if (ex->code[i].kind != EOP_UPLOAD) return 0;
    return (size_t)ir_numel(NODE(i), ex->B, ex->L) * plan_dtype_size(NODE(i)->dtype);
}

static HpcStatus inputs_save(CudaExec *ex, StagedInputs *in, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    in->saved = 0;
    in->bytes = 0;
    for (int i = 0; i < ex->g->n; i++) in->bytes += staged_bytes(ex, i);
    if (in->bytes == 0) return HPC_OK;
    HpcStatus st = CUDA_CHECK(err, cu->cuMemAlloc(&in->saved, in->bytes));
    size_t at = 0;
    for (int i = 0; i < ex->g->n && !st; i++) {
        size_t b = staged_bytes(ex, i);
        if (b) st = CUDA_CHECK(err, cu->cuMemcpyDtoDAsync(in->saved + at, cuda_exec_ptr(ex, i), b, ex->dev->stream));
        at += b;
    }
    return st;
}

static HpcStatus inputs_restore(CudaExec *ex, const StagedInputs *in, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    size_t at = 0;
    HpcStatus st = HPC_OK;
    for (int i = 0; i < ex->g->n && !st && in->saved; i++) {
        size_t b = staged_bytes(ex, i);
        if (b) st = CUDA_CHECK(err, cu->cuMemcpyDtoDAsync(cuda_exec_ptr(ex, i), in->saved + at, b, ex->dev->stream));
        at += b;
    }
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0], v[stride], .. (n values); reorders nothing. */
static double median_of(const double *v, int n, int stride)
{
    double *c = xcalloc((size_t)n, sizeof *c);
    for (int i = 0; i < n; i++) c[i] = v[(size_t)i * (size_t)stride];
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

HpcStatus cuda_exec_profile_graph(CudaExec *ex, int end, const CudaExecTail *tail, int replays, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    CUstream s = ex->dev->stream;
    int n_events = profile_events(ex, end), n_graph_ev = 0;   /* the timed graph's: the start, one a launch */
    CUevent *ev = xcalloc((size_t)n_events, sizeof *ev), mark[2] = {0};
    int *node = xcalloc((size_t)n_events, sizeof *node);
    double *gap = xcalloc((size_t)replays * (size_t)n_events, sizeof *gap);   /* [replay][event], n_graph_ev used */
    double *plain = xcalloc((size_t)replays, sizeof *plain);
    double *ms = xcalloc((size_t)n_events, sizeof *ms);
    CUgraphExec timed = NULL, bare = NULL;
    StagedInputs inputs = {0};
    HpcStatus st = inputs_save(ex, &inputs, err);
    if (!st) st = create_events(ev, n_events, err);
    if (!st) st = create_events(mark, 2, err);
    if (!st) st = capture_nodes(ex, end, ev, node, &n_graph_ev, &timed, err);
    if (!st) st = capture_nodes(ex, end, NULL, NULL, NULL, &bare, err);
    /* the two graphs in turn, so a drift of the clocks shows in both alike */
    for (int r = 0; r < replays && !st; r++) {
        float f = 0;
        st = inputs_restore(ex, &inputs, err);
        if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(mark[0], s));
        if (!st) st = CUDA_CHECK(err, cu->cuGraphLaunch(bare, s));
        if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(mark[1], s));
        if (!st) st = inputs_restore(ex, &inputs, err);
        if (!st) st = CUDA_CHECK(err, cu->cuGraphLaunch(timed, s));
        if (!st) st = CUDA_CHECK(err, cu->cuStreamSynchronize(s));
        if (!st) st = CUDA_CHECK(err, cu->cuEventElapsedTime(&f, mark[0], mark[1]));
        plain[r] = f;
        for (int k = 1; k < n_graph_ev && !st; k++) {
            st = CUDA_CHECK(err, cu->cuEventElapsedTime(&f, ev[k - 1], ev[k]));
            gap[(size_t)r * (size_t)n_events + (size_t)k] = f;
        }
    }
    /* the tail once, eagerly, after the last replay: the call is one step */
    double tail_ms = 0;
    if (!st && tail) {
        float f = 0;
        st = CUDA_CHECK(err, cu->cuEventRecord(mark[0], s));
        if (!st) st = tail->queue(tail->ctx, s, err);
        if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(mark[1], s));
        if (!st) st = CUDA_CHECK(err, cu->cuEventSynchronize(mark[1]));
        if (!st) st = CUDA_CHECK(err, cu->cuEventElapsedTime(&f, mark[0], mark[1]));
        tail_ms = f;
    }
    if (!st) {
        double with_events = 0;
        for (int k = 1; k < n_graph_ev; k++) {
            ms[k] = median_of(gap + k, replays, n_events);
            with_events += ms[k];
        }
        int n = n_graph_ev;
        if (tail) {
            node[n] = -1;
            ms[n++] = tail_ms;
        }
        char how[256];
        snprintf(how, sizeof how, "CUDA graph, median of %d replays: the nodes %.3f ms with an event record node "
                 "after each, %.3f ms without; the optimizer once, eager", replays, with_events,
                 median_of(plain, replays, 1));
        profile_tables(ex, node, ms, n, tail, how);
    }
    if (timed) cu->cuGraphExecDestroy(timed);
    if (bare) cu->cuGraphExecDestroy(bare);
    if (inputs.saved) {
        cu->cuStreamSynchronize(s);
        cu->cuMemFree(inputs.saved);
    }
    destroy_events(ev, n_events);
    destroy_events(mark, 2);
    free(ms);
    free(plain);
    free(gap);
    free(node);
    free(ev);
    return st;
}
