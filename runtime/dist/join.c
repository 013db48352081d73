/* runtime/dist/join.c — one process's way into its data-parallel world:
 * the environment (rendezvous.h), the GPU it owns, and the NCCL communicator
 * made from rank 0's id. */
#include <stdlib.h>

#include "dist/collectives.h"
#include "dist/rendezvous.h"

static const char *process_getenv(const char *name) { return getenv(name); }

HpcStatus dist_env_from_process(DistEnv *env, HpcError *err)
{
    return dist_env_read(env, process_getenv, err);
}

int dist_gpu_ordinal(void)
{
    DistEnv env;
    HpcError ignore = {0};
    if (dist_env_from_process(&env, &ignore) || env.world <= 1) return 0;
    return env.local_rank;
}

HpcStatus dist_join_nccl(const DistEnv *env, void *stream, Collectives *out, HpcError *err)
{
    unsigned char id[COLL_NCCL_ID_BYTES] = {0};
    HpcStatus st = coll_nccl_load(err);
    if (!st && env->rank == 0) st = coll_nccl_unique_id(id, err);
    if (!st) st = dist_exchange(env, id, sizeof id, err);
    if (!st) st = coll_nccl_open(out, env->rank, env->world, id, stream, env->timeout_s, err);
    return st;
}
