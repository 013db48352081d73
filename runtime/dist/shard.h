/* runtime/dist/shard.h — how data-parallel work is divided among ranks.
 *
 * Rows: every rank walks the same seeded permutation of an epoch; the global
 * batch (the rows one optimizer step uses, as a single process would take
 * them) is cut into `world` equal, consecutive parts and rank r takes part r.
 * The data position is therefore the global one (epoch, rows consumed), the
 * same whatever the number of ranks, which is what lets a checkpoint made on
 * N GPUs resume on M.
 *
 * Optimizer state (ZeRO-1): the parameters, flattened in ParamList order, are
 * cut into `world` slices of equal padded length (a multiple of `align`
 * elements); rank r keeps m and v for slice r only and updates that slice.
 *
 * Buckets: gradients are all-reduced in buckets of about `bucket_elems`
 * elements, formed from the last parameter backwards, because the backward
 * pass produces the last layers' gradients first: a bucket can be reduced as
 * soon as its parameters' gradients are final, while the backward continues.
 */
#ifndef HPC_RUNTIME_DIST_SHARD_H
#define HPC_RUNTIME_DIST_SHARD_H

#include <stdint.h>

#include "util/error.h"

/* Rank's rows of a global batch of `global_batch` rows: [offset, offset + count).
 * HPC_ERR_USAGE when global_batch does not divide by world. */
HpcStatus dist_rank_rows(int64_t global_batch, int rank, int world, int64_t *offset, int64_t *count,
                         HpcError *err);

typedef struct { int64_t begin, end; } DistSlice;   /* [begin, end) of the flat parameters */

/* The padded slice length for `total` elements over `world` ranks. */
int64_t dist_slice_len(int64_t total, int world, int64_t align);
/* Rank r's slice of the flat parameters (end - begin may be short, or 0, for the last ranks). */
DistSlice dist_slice(int64_t total, int world, int64_t align, int rank);

typedef struct { int first, last; int64_t elems; } DistBucket;   /* parameters first..last */

/* Buckets over count parameters of numel[] elements, from the last parameter
 * backwards; out must hold count entries; returns the number of buckets. */
int dist_buckets(const int64_t *numel, int count, int64_t bucket_elems, DistBucket *out);

#endif
