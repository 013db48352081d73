/* runtime/dist/dp_optim.h — the data-parallel half of a training step: the
 * gradients averaged over the ranks, the loss-scaler decision and the
 * gradient norm agreed by all ranks, and the optimizer step either replicated
 * (every rank updates every parameter) or ZeRO-1 sharded (every rank keeps m
 * and v for its slice only, updates that slice, then the slices are
 * all-gathered), so every rank skips the same steps and holds bit-identical
 * weights afterwards.
 *
 * This is the host-memory form the cpu backend and the tests use, over any
 * Collectives (runtime/dist/collectives.h).  The order of a step on each rank:
 *   local forward/backward -> dp_average_grads -> dp_optim_step -> ls_update
 * where dp_optim_step's report (found_inf agreed across ranks) feeds the
 * loss scaler exactly as optim_step's does in a single process.
 *
 * Ownership: dp_optim_init allocates the scratch and the ZeRO-1 state;
 * dp_optim_free frees them.  numel is borrowed and must outlive d.
 */
#ifndef HPC_RUNTIME_DIST_DP_OPTIM_H
#define HPC_RUNTIME_DIST_DP_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "dist/collectives.h"
#include "dist/shard.h"
#include "train/optim.h"
#include "util/error.h"

/* Gradients are reduced in buckets of about this many elements (4 MiB of f32). */
#define DP_BUCKET_ELEMS (1 << 20)
/* ZeRO-1 slices are a multiple of this many elements (vector loads on the GPU). */
#define DP_SLICE_ALIGN 64

typedef struct {
    Collectives *coll;         /* borrowed */
    int count;                 /* parameter tensors */
    const int64_t *numel;      /* (count) elements of each, ParamList order */
    int64_t total;             /* all elements */
    bool zero1;
    DistSlice slice;           /* zero1: this rank's part of the flat parameters */
    int64_t slice_len;         /* zero1: padded slice length, the same on every rank */
    float *m, *v;              /* zero1: (slice_len) state of the slice; NULL otherwise */
    DistBucket *buckets;
    int nbuckets;
    float *scratch;            /* max(bucket, world * slice_len) f32 */
    float *gathered;           /* zero1: (world * slice_len) f32 */
} DpOptim;

/* HPC_ERR_USAGE for ZeRO-1 with LAMB (its trust ratio is per whole tensor). */
HpcStatus dp_optim_init(DpOptim *d, Collectives *coll, const OptimConfig *cfg, const int64_t *numel,
                        int count, bool zero1, HpcError *err);
void dp_optim_free(DpOptim *d);

/* grads[p] (numel[p]) f32, this rank's local mean gradients -> the mean over
 * all ranks (sum / world), bucket by bucket from the last parameter. */
HpcStatus dp_average_grads(DpOptim *d, float *const *grads, HpcError *err);

/* found_inf on any rank -> true on every rank. */
HpcStatus dp_agree_found_inf(Collectives *coll, bool local, bool *global, HpcError *err);

/* The optimizer step on averaged gradients.  tensors (count): master, grad,
 * low as in optim_step; m and v full-size when replicated, ignored (NULL)
 * with ZeRO-1, whose state lives in d.  Skips on every rank or on none. */
HpcStatus dp_optim_step(DpOptim *d, const OptimConfig *cfg, OptimState *state, OptimTensor *tensors,
                        float inv_scale, double lr, OptimReport *report, HpcError *err);

/* Checkpoints hold the whole state, whatever the world: ZeRO-1's slices are
 * gathered into full (total) m and v on every rank before a save, and a
 * rank of any later world takes its slice from the full state on resume. */
HpcStatus dp_gather_state(DpOptim *d, float *full_m, float *full_v, HpcError *err);
void dp_take_state(DpOptim *d, const float *full_m, const float *full_v);

#endif
