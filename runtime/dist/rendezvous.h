/* runtime/dist/rendezvous.h — how the processes of one data-parallel run find
 * each other: which rank this process is, and the hand-over of a small blob
 * (NCCL's unique id) from rank 0 to every other rank.
 *
 * The environment names the rank, as torchrun and cluster schedulers set it:
 *   RANK, WORLD_SIZE        this process's rank and the number of processes
 *   LOCAL_RANK              the GPU on this host (default: RANK)
 *   HPC_RENDEZVOUS          file:PATH (a shared file system) or tcp:HOST:PORT;
 *                           default tcp:$MASTER_ADDR:$MASTER_PORT when those are set
 *   HPC_COLLECTIVE_TIMEOUT  seconds any rank waits for the others (default 300)
 * Without RANK and WORLD_SIZE the run is a single process (rank 0 of 1).
 *
 * dist_exchange: rank 0 publishes the blob (file: written atomically and
 * renamed into place; tcp: listening on PORT and sending it to each peer),
 * the others wait for it, at most the timeout.  Every failure names the
 * variable or the address and what to do.
 */
#ifndef HPC_RUNTIME_DIST_RENDEZVOUS_H
#define HPC_RUNTIME_DIST_RENDEZVOUS_H

#include <stddef.h>

#include "util/error.h"

typedef enum { RDV_NONE, RDV_FILE, RDV_TCP } RendezvousKind;

typedef struct {
    int rank, world, local_rank;
    RendezvousKind kind;
    char path[512];        /* RDV_FILE */
    char host[256];        /* RDV_TCP */
    int port;
    double timeout_s;
} DistEnv;

/* Reads the variables above through getenv_fn (getenv in the product; tests
 * pass their own).  HPC_ERR_USAGE naming the variable for a bad value. */
HpcStatus dist_env_read(DistEnv *env, const char *(*getenv_fn)(const char *name), HpcError *err);

/* Rank 0: publishes blob (n bytes); others: fill blob with rank 0's. */
HpcStatus dist_exchange(const DistEnv *env, void *blob, size_t n, HpcError *err);

/* The process's own environment (getenv); HPC_ERR_USAGE for a bad value. */
HpcStatus dist_env_from_process(DistEnv *env, HpcError *err);

/* The GPU this process trains on: LOCAL_RANK when WORLD_SIZE > 1, else 0
 * (also 0 when the variables are malformed: dist_env_from_process reports
 * those first). */
int dist_gpu_ordinal(void);

struct Collectives;
/* Joins env's NCCL world on the current CUDA context: rank 0 makes the id,
 * dist_exchange hands it to the others, then coll_nccl_open on stream (a
 * CUstream).  In join.c. */
HpcStatus dist_join_nccl(const DistEnv *env, void *stream, struct Collectives *out, HpcError *err);

#endif
