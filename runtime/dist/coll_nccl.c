/* runtime/dist/coll_nccl.c — the collectives over NCCL, loaded with dlopen
 * like the CUDA driver, so bin/hpc runs where NCCL is absent and says so only
 * when several GPUs are asked for.
 *
 * Calls are enqueued on the handle's stream and return at once (no host wait
 * inside a step).  coll_nccl_wait, called where the trainer waits anyway,
 * polls the stream and NCCL's asynchronous error and aborts the communicator
 * after the timeout, so a dead peer ends in a message, never a hang.
 * NVLink multicast (NVLS) is switched off before the communicator is made
 * (NCCL_NVLS_ENABLE=0 unless the environment says otherwise). */
#include "dist/collectives.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <nccl.h>

#include "cuda/cuda_driver.h"

#define NCCL_FUNCTIONS(X) \
    X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclAllReduce) X(ncclAllGather) \
    X(ncclBroadcast) X(ncclCommAbort) X(ncclCommDestroy) X(ncclCommGetAsyncError) \
    X(ncclGetErrorString)

typedef struct {
#define NCCL_MEMBER(name) __typeof__(name) *name;
    NCCL_FUNCTIONS(NCCL_MEMBER)
#undef NCCL_MEMBER
} NcclTable;

static NcclTable nccl;
static bool nccl_loaded;

HpcStatus coll_nccl_load(HpcError *err)
{
    if (nccl_loaded) return HPC_OK;
    const char *path = getenv("HPC_NCCL_LIBRARY");
    if (!path || !*path) path = "libnccl.so.2";
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return hpc_fail(err, HPC_ERR_NO_GPU, "cannot load NCCL (%s): %s; training on several GPUs "
                        "needs NCCL 2 (install it, or set HPC_NCCL_LIBRARY to its path)", path, dlerror());
#define NCCL_RESOLVE(name)                                                                  \
    if (!(nccl.name = (__typeof__(name) *)dlsym(h, #name))) {                               \
        dlclose(h);                                                                         \
        return hpc_fail(err, HPC_ERR_NO_GPU, "NCCL at %s lacks %s: it is too old (hpc needs " \
                        "NCCL 2.12 or later)", path, #name);                                \
    }
    NCCL_FUNCTIONS(NCCL_RESOLVE)
#undef NCCL_RESOLVE
    nccl_loaded = true;
    return HPC_OK;
}

static HpcStatus nccl_check(ncclResult_t r, const char *call, HpcError *err)
{
    if (r == ncclSuccess) return HPC_OK;
    return hpc_fail(err, HPC_ERR_CUDA, "%s failed: %s (NCCL error %d); set NCCL_DEBUG=WARN for NCCL's "
                    "own account", call, nccl.ncclGetErrorString(r), (int)r);
}

HpcStatus coll_nccl_unique_id(unsigned char id[COLL_NCCL_ID_BYTES], HpcError *err)
{
    _Static_assert(sizeof(ncclUniqueId) == COLL_NCCL_ID_BYTES, "NCCL's id size changed");
    HpcStatus st = coll_nccl_load(err);
    if (st) return st;
    ncclUniqueId u;
    st = nccl_check(nccl.ncclGetUniqueId(&u), "ncclGetUniqueId", err);
    if (!st) memcpy(id, &u, sizeof u);
    return st;
}

typedef struct { ncclComm_t comm; CUstream stream; } NcclRank;

static HpcStatus nccl_sum_f32(Collectives *c, float *buf, int64_t n, HpcError *err)
{
    NcclRank *r = c->impl;
    return nccl_check(nccl.ncclAllReduce(buf, buf, (size_t)n, ncclFloat32, ncclSum, r->comm, r->stream),
                      "ncclAllReduce (sum, f32)", err);
}

HpcStatus coll_nccl_mean_f32(Collectives *c, float *buf, int64_t n, HpcError *err)
{
    HPC_ASSERT(strcmp(c->kind, "nccl") == 0);
    NcclRank *r = c->impl;
    return nccl_check(nccl.ncclAllReduce(buf, buf, (size_t)n, ncclFloat32, ncclAvg, r->comm, r->stream),
                      "ncclAllReduce (mean, f32)", err);
}

static HpcStatus nccl_sum_f64(Collectives *c, double *buf, int64_t n, HpcError *err)
{
    NcclRank *r = c->impl;
    return nccl_check(nccl.ncclAllReduce(buf, buf, (size_t)n, ncclFloat64, ncclSum, r->comm, r->stream),
                      "ncclAllReduce (sum, f64)", err);
}

static HpcStatus nccl_max_f64(Collectives *c, double *buf, int64_t n, HpcError *err)
{
    NcclRank *r = c->impl;
    return nccl_check(nccl.ncclAllReduce(buf, buf, (size_t)n, ncclFloat64, ncclMax, r->comm, r->stream),
                      "ncclAllReduce (max)", err);
}

static HpcStatus nccl_allgather(Collectives *c, const float *send, int64_t n, float *recv, HpcError *err)
{
    NcclRank *r = c->impl;
    return nccl_check(nccl.ncclAllGather(send, recv, (size_t)n, ncclFloat32, r->comm, r->stream),
                      "ncclAllGather", err);
}

static HpcStatus nccl_broadcast(Collectives *c, void *buf, int64_t bytes, int root, HpcError *err)
{
    NcclRank *r = c->impl;
    return nccl_check(nccl.ncclBroadcast(buf, buf, (size_t)bytes, ncclUint8, root, r->comm, r->stream),
                      "ncclBroadcast", err);
}

static void nccl_abort(Collectives *c, const char *why)
{
    NcclRank *r = c->impl;
    (void)why;   /* the peers see the communicator fail and report their own wait */
    if (r && r->comm) {
        nccl.ncclCommAbort(r->comm);
        r->comm = NULL;
    }
}

static void nccl_close(Collectives *c)
{
    NcclRank *r = c->impl;
    if (!r) return;
    if (r->comm) nccl.ncclCommDestroy(r->comm);
    free(r);
    c->impl = NULL;
}

HpcStatus coll_nccl_open(Collectives *out, int rank, int world, const unsigned char id[COLL_NCCL_ID_BYTES],
                         void *stream, double timeout_s, HpcError *err)
{
    HpcStatus st = coll_nccl_load(err);
    if (st) return st;
    if (world < 1 || rank < 0 || rank >= world)
        return hpc_fail(err, HPC_ERR_USAGE, "rank %d is outside a world of %d", rank, world);
    setenv("NCCL_NVLS_ENABLE", "0", 0);   /* multicast off unless the user insists */
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    NcclRank *r = xcalloc(1, sizeof *r);
    r->stream = stream;
    st = nccl_check(nccl.ncclCommInitRank(&r->comm, world, u, rank), "ncclCommInitRank", err);
    if (st) {
        free(r);
        return st;
    }
    *out = (Collectives){
        .rank = rank, .world = world, .kind = "nccl", .timeout_s = timeout_s > 0 ? timeout_s : 300,
        .allreduce_sum_f32 = nccl_sum_f32, .allreduce_sum_f64 = nccl_sum_f64,
        .allreduce_max_f64 = nccl_max_f64, .allgather_f32 = nccl_allgather,
        .broadcast = nccl_broadcast, .abort = nccl_abort, .close = nccl_close, .impl = r,
    };
    return HPC_OK;
}

HpcStatus coll_nccl_wait(Collectives *c, HpcError *err)
{
    NcclRank *r = c->impl;
    const CudaDriver *cu = cuda_driver();
    if (!r || !r->comm || !cu) return hpc_fail(err, HPC_ERR_IO, "the NCCL communicator was aborted");
    struct timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        CUresult q = cu->cuStreamQuery(r->stream);
        if (q == CUDA_SUCCESS) return HPC_OK;
        if (q != CUDA_ERROR_NOT_READY) return CUDA_CHECK(err, q);
        ncclResult_t async = ncclSuccess;
        nccl.ncclCommGetAsyncError(r->comm, &async);
        clock_gettime(CLOCK_MONOTONIC, &now);
        double waited = (double)(now.tv_sec - t0.tv_sec) + 1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
        if (async != ncclSuccess && async != ncclInProgress) {
            nccl_abort(c, "peer failed");
            return hpc_fail(err, HPC_ERR_IO, "rank %d: a collective failed (%s): another rank has "
                            "stopped; its own message says why", c->rank, nccl.ncclGetErrorString(async));
        }
        if (waited > c->timeout_s) {
            nccl_abort(c, "timeout");
            return hpc_fail(err, HPC_ERR_IO, "rank %d waited %g s for a collective; a rank is stuck "
                            "or has died (raise the limit with HPC_COLLECTIVE_TIMEOUT=SECONDS)", c->rank, c->timeout_s);
        }
        struct timespec nap = { 0, 200000 };
        nanosleep(&nap, NULL);
    }
}
