/* runtime/dist/collectives.h — the collectives data-parallel training needs,
 * behind one interface, so the rank-agreement logic is the same code whether
 * the ranks are NCCL processes on GPUs or threads of one test process.
 *
 * A Collectives is one rank's handle on a world of `world` ranks.  Every call
 * is collective: all ranks make the same calls in the same order with the same
 * sizes.  Results are identical on every rank, bit for bit (the local world
 * sums in rank order 0..world-1; NCCL's ring sums in one fixed order per call).
 * Buffers are host memory for the local world and device memory (on the
 * handle's CUDA stream) for NCCL.
 *
 * Failure never hangs: a call that waits longer than the handle's timeout
 * returns HPC_ERR_IO naming the call and the wait, and a rank that fails calls
 * abort(why), after which the other ranks' pending and later calls return
 * HPC_ERR_IO with "rank R stopped: why".
 *
 * Implementations:
 *   coll_local_*  (coll_local.c)  N ranks as threads of one process (tests,
 *                                 the cpu backend);
 *   coll_nccl_*   (coll_nccl.c)   NCCL loaded with dlopen, one process per GPU.
 */
#ifndef HPC_RUNTIME_DIST_COLLECTIVES_H
#define HPC_RUNTIME_DIST_COLLECTIVES_H

#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"

typedef struct Collectives Collectives;
struct Collectives {
    int rank, world;
    const char *kind;          /* "local" or "nccl" */
    double timeout_s;          /* longest wait for the other ranks */
    /* buf (n) f32: the element-wise sum over the ranks, in place. */
    HpcStatus (*allreduce_sum_f32)(Collectives *c, float *buf, int64_t n, HpcError *err);
    /* buf (n) f64: sum over the ranks, in place (norms, loss sums). */
    HpcStatus (*allreduce_sum_f64)(Collectives *c, double *buf, int64_t n, HpcError *err);
    /* buf (n) f64: max over the ranks, in place (found_inf as 0/1). */
    HpcStatus (*allreduce_max_f64)(Collectives *c, double *buf, int64_t n, HpcError *err);
    /* send (n) f32 of each rank -> recv (world * n) f32, rank r's at r * n. */
    HpcStatus (*allgather_f32)(Collectives *c, const float *send, int64_t n, float *recv, HpcError *err);
    /* bytes of root's buf copied into every rank's buf. */
    HpcStatus (*broadcast)(Collectives *c, void *buf, int64_t bytes, int root, HpcError *err);
    /* This rank failed with `why`: the other ranks' collectives stop with it. */
    void (*abort)(Collectives *c, const char *why);
    void (*close)(Collectives *c);
    void *impl;
};

/* ---- the local world: ranks are threads of this process ---- */
typedef struct CollLocalWorld CollLocalWorld;

/* A world of `world` ranks (1..64) whose calls wait at most timeout_s. */
HpcStatus coll_local_world_new(int world, double timeout_s, CollLocalWorld **out, HpcError *err);
/* Rank `rank`'s handle; call from that rank's thread.  close() leaves the world. */
void coll_local_join(CollLocalWorld *w, int rank, Collectives *out);
/* Frees the world after every rank has closed its handle. */
void coll_local_world_free(CollLocalWorld *w);

/* ---- NCCL (coll_nccl.c) ---- */
#define COLL_NCCL_ID_BYTES 128   /* sizeof(ncclUniqueId) */

/* Loads NCCL ($HPC_NCCL_LIBRARY, else libnccl.so.2) and resolves the calls
 * hpc uses; HPC_ERR_NO_GPU with the dlopen reason and a remedy when missing. */
HpcStatus coll_nccl_load(HpcError *err);
/* Rank 0 makes the world's id (then hands it to the others: rendezvous.h). */
HpcStatus coll_nccl_unique_id(unsigned char id[COLL_NCCL_ID_BYTES], HpcError *err);
/* Joins the world on the current CUDA context; stream is a CUstream (void *
 * here so this header needs no CUDA). */
HpcStatus coll_nccl_open(Collectives *out, int rank, int world,
                         const unsigned char id[COLL_NCCL_ID_BYTES], void *stream,
                         double timeout_s, HpcError *err);
/* buf (n) f32 on the device: the mean over the ranks, in place (ncclAvg;
 * the cuda backend's gradient average).  c must be an NCCL handle. */
HpcStatus coll_nccl_mean_f32(Collectives *c, float *buf, int64_t n, HpcError *err);
/* Waits for the handle's stream, at most its timeout; on a peer's failure or
 * the timeout the communicator is aborted, so no rank hangs. */
HpcStatus coll_nccl_wait(Collectives *c, HpcError *err);

#endif
