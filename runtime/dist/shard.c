/* runtime/dist/shard.c — row shards, optimizer-state slices and gradient buckets. */
#include "dist/shard.h"

HpcStatus dist_rank_rows(int64_t global_batch, int rank, int world, int64_t *offset, int64_t *count,
                         HpcError *err)
{
    HPC_ASSERT(world >= 1 && rank >= 0 && rank < world);
    if (global_batch < world || global_batch % world != 0)
        return hpc_fail(err, HPC_ERR_USAGE, "batch %lld does not divide among %d GPUs: use a multiple of %d "
                        "(each GPU takes batch / %d rows a step)", (long long)global_batch, world, world, world);
    *count = global_batch / world;
    *offset = (int64_t)rank * *count;
    return HPC_OK;
}

int64_t dist_slice_len(int64_t total, int world, int64_t align)
{
    HPC_ASSERT(world >= 1 && align >= 1 && total >= 0);
    int64_t per = (total + world - 1) / world;
    return (per + align - 1) / align * align;
}

DistSlice dist_slice(int64_t total, int world, int64_t align, int rank)
{
    int64_t per = dist_slice_len(total, world, align);
    int64_t b = (int64_t)rank * per, e = b + per;
    if (b > total) b = total;
    if (e > total) e = total;
    return (DistSlice){ b, e };
}

int dist_buckets(const int64_t *numel, int count, int64_t bucket_elems, DistBucket *out)
{
    int n = 0;
    for (int p = count - 1; p >= 0; p--) {
        if (n == 0 || out[n - 1].elems >= bucket_elems) out[n++] = (DistBucket){ p, p, 0 };
        out[n - 1].first = p;
        out[n - 1].elems += numel[p];
    }
    return n;
}
