/* bench/graph_branch.c — what a branch costs a CUDA graph shaped like the
 * training step's: a chain of small kernels captured from one stream.
 *
 * The thirty-seventh session moved the optimizer's norm pass onto a second
 * stream beside the backward and the step became 0.19-0.24 ms slower at
 * 32 x 32 and 32 x 128 (H100), with 16 groups of it or a single one: more
 * than the pass it hid (BENCHMARKS.md).  This asks the graph alone, with
 * no hpc kernel: N launches of a small kernel (132 blocks of 128 threads,
 * a few microseconds each, as most of a small step's are) captured into a
 * graph, against the same chain with
 *   fork1     one small kernel on a second stream, forked from the chain
 *             after launch N / 2 and joined before its last launch;
 *   late1     the same forked after launch N - 8;
 *   fork16    16 such kernels, forked at 16 evenly spaced launches;
 *   empty1    one fork whose branch is a kernel of one thread;
 * each graph launched 5 times to warm up, then the median of 31 launches
 * timed with events on the chain's stream.
 *
 *   make build/bench/graph_branch && build/bench/graph_branch [N]   (N: 400)
 *
 * Prints one line per graph: microseconds a launch and the difference to
 * the chain.  Needs a GPU (runs on the CUDA emulator too, where the times
 * mean nothing); not part of `make test`.  Exit 0, 1 on an error, 4 without
 * a GPU. */
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuda_driver.h"
#include "cuda/nvrtc_compile.h"

static const char kernel_src[] =
    "extern \"C\" __global__ void tick(float *buf, int n)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n) buf[i] = buf[i] * 0.5f + 1.0f;\n"
    "}\n";

enum { BLOCKS = 132, THREADS = 128, WARM = 5, TIMED = 31 };

typedef struct {
    CUfunction tick;
    CUstream main, side;
    CUevent fork, join;
    CUdeviceptr buf, side_buf;
    int n;
} Probe;

static HpcStatus launch(const Probe *p, CUstream s, CUdeviceptr buf, unsigned blocks, HpcError *err)
{
    int n = (int)(blocks * THREADS);
    void *args[] = {&buf, &n};
    return cuda_launch(p->tick, (unsigned[3]){blocks, 1, 1}, (unsigned[3]){THREADS, 1, 1}, 0, s, args, err);
}

/* The chain of p->n launches with a branch after each launch in forks[]
 * (ascending, -1 ended): side kernels of side_blocks blocks; captured. */
static HpcStatus capture(const Probe *p, const int *forks, unsigned side_blocks, CUgraphExec *exec, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    CUgraph g = NULL;
    HpcStatus st = CUDA_CHECK(err, cu->cuStreamBeginCapture(p->main, CU_STREAM_CAPTURE_MODE_RELAXED));
    if (st) return st;
    int f = 0, forked = 0;
    for (int t = 0; t < p->n && !st; t++) {
        if (t == p->n - 1 && forked) {   /* the join, before the last launch (as opt_decide's) */
            st = CUDA_CHECK(err, cu->cuEventRecord(p->join, p->side));
            if (!st) st = CUDA_CHECK(err, cu->cuStreamWaitEvent(p->main, p->join, 0));
        }
        if (!st) st = launch(p, p->main, p->buf, BLOCKS, err);
        if (!st && forks[f] == t) {
            f++;
            forked = 1;
            st = CUDA_CHECK(err, cu->cuEventRecord(p->fork, p->main));
            if (!st) st = CUDA_CHECK(err, cu->cuStreamWaitEvent(p->side, p->fork, 0));
            if (!st) st = launch(p, p->side, p->side_buf, side_blocks, err);
        }
    }
    HpcStatus end = CUDA_CHECK(err, cu->cuStreamEndCapture(p->main, &g));
    if (!st) st = end;
    if (!st) st = CUDA_CHECK(err, cu->cuGraphInstantiate(exec, g, 0));
    if (g) cu->cuGraphDestroy(g);
    return st;
}

static int by_value(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median microseconds a launch of exec. */
static HpcStatus time_graph(const Probe *p, CUgraphExec exec, double *us, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    CUevent e0 = NULL, e1 = NULL;
    float ms[TIMED];
    HpcStatus st = CUDA_CHECK(err, cu->cuEventCreate(&e0, CU_EVENT_DEFAULT));
    if (!st) st = CUDA_CHECK(err, cu->cuEventCreate(&e1, CU_EVENT_DEFAULT));
    for (int i = 0; i < WARM && !st; i++) st = CUDA_CHECK(err, cu->cuGraphLaunch(exec, p->main));
    for (int i = 0; i < TIMED && !st; i++) {
        st = CUDA_CHECK(err, cu->cuEventRecord(e0, p->main));
        if (!st) st = CUDA_CHECK(err, cu->cuGraphLaunch(exec, p->main));
        if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(e1, p->main));
        if (!st) st = CUDA_CHECK(err, cu->cuEventSynchronize(e1));
        if (!st) st = CUDA_CHECK(err, cu->cuEventElapsedTime(&ms[i], e0, e1));
    }
    if (e0) cu->cuEventDestroy(e0);
    if (e1) cu->cuEventDestroy(e1);
    if (st) return st;
    qsort(ms, TIMED, sizeof *ms, by_value);
    *us = 1000.0 * ms[TIMED / 2];
    return HPC_OK;
}

static HpcStatus open_probe(Probe *p, const CudaDevice *dev, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    void *cubin = NULL;
    size_t size = 0;
    char *log = NULL;
    CUmodule mod = NULL;
    HpcStatus st = nvrtc_compile(kernel_src, "graph_branch", dev->arch, NULL, 0, &cubin, &size, &log, err);
    free(log);
    if (!st) st = CUDA_CHECK(err, cu->cuModuleLoadData(&mod, cubin));
    free(cubin);
    if (!st) st = CUDA_CHECK(err, cu->cuModuleGetFunction(&p->tick, mod, "tick"));
    p->main = dev->stream;
    if (!st) st = CUDA_CHECK(err, cu->cuStreamCreate(&p->side, CU_STREAM_NON_BLOCKING));
    if (!st) st = CUDA_CHECK(err, cu->cuEventCreate(&p->fork, CU_EVENT_DISABLE_TIMING));
    if (!st) st = CUDA_CHECK(err, cu->cuEventCreate(&p->join, CU_EVENT_DISABLE_TIMING));
    size_t bytes = (size_t)BLOCKS * THREADS * sizeof(float);
    if (!st) st = CUDA_CHECK(err, cu->cuMemAlloc(&p->buf, bytes));
    if (!st) st = CUDA_CHECK(err, cu->cuMemAlloc(&p->side_buf, bytes));
    if (!st) st = CUDA_CHECK(err, cu->cuMemsetD8Async(p->buf, 0, bytes, p->main));
    if (!st) st = CUDA_CHECK(err, cu->cuMemsetD8Async(p->side_buf, 0, bytes, p->main));
    return st;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 400;
    if (n < 32 || n > 100000) {
        fprintf(stderr, "usage: graph_branch [N]   (N: launches in the chain, 32 to 100000; default 400)\n");
        return 1;
    }
    HpcError err = {0};
    CudaDevice dev;
    if (cuda_driver_load(&err) || cuda_device_open(&dev, 0, &err)) {
        fprintf(stderr, "graph_branch: %s\n", err.msg);
        return err.code == HPC_ERR_NO_GPU ? 4 : 1;
    }
    Probe p = {.n = n};
    HpcStatus st = open_probe(&p, &dev, &err);
    int none[] = {-1}, mid[] = {n / 2, -1}, late[] = {n - 8, -1}, fork16[17];
    for (int k = 0; k < 16; k++) fork16[k] = (k + 1) * n / 17;
    fork16[16] = -1;
    const struct {
        const char *name, *what;
        const int *forks;   /* the launches a branch follows, -1 ended */
        unsigned side_blocks;
    } graphs[] = {
        {"chain", "the chain alone", none, 0},
        {"fork1", "one kernel on a second stream, forked after launch N / 2", mid, BLOCKS},
        {"late1", "the same forked after launch N - 8", late, BLOCKS},
        {"empty1", "one fork, its branch a kernel of one block", mid, 1},
        {"fork16", "16 forks, a kernel each", fork16, BLOCKS},
    };
    printf("graph_branch on %s: a chain of %d launches of %d x %d threads\n", dev.name, n, BLOCKS, THREADS);
    double base = 0;
    for (size_t i = 0; i < sizeof graphs / sizeof *graphs && !st; i++) {
        CUgraphExec exec = NULL;
        double us = 0;
        st = capture(&p, graphs[i].forks, graphs[i].side_blocks, &exec, &err);
        if (!st) st = time_graph(&p, exec, &us, &err);
        if (exec) cuda_driver()->cuGraphExecDestroy(exec);
        if (st) break;
        if (i == 0) base = us;
        printf("%-7s %9.1f us  %+8.1f us  %s\n", graphs[i].name, us, us - base, graphs[i].what);
    }
    if (st) fprintf(stderr, "graph_branch: %s\n", err.msg);
    cuda_device_close(&dev);
    return st ? 1 : 0;
}
