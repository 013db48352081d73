/* runtime/train/init.h — parameter storage and BERT-style initialisation.
 *
 * ParamStore holds one f32 master tensor per parameter that owns storage
 * (tied parameters point at the tensor they are tied to), laid out as the
 * parameter's dims.  Initialisation follows BERT (initializer_range 0.02):
 *   weights and embeddings: normal(0, 0.02) from philox_normal(seed, i,
 *     salt = parameter index), i the flat element index;
 *   biases: 0;  LayerNorm gamma: 1, beta: 0.
 * so a parameter's initial value depends only on (seed, its index, i) and
 * the cpu and CUDA backends start from the same bits.
 *
 * On every core, in the background.  The draws run on the cpu pool
 * (runtime/cpu/cpu_threads.h) as one split of all elements of all
 * parameters, so the thread count never changes a bit (tests/
 * test_init_threads.c checks 1, 2 and N threads against philox_normal).
 * init_store_start allocates every tensor (an allocation failure is its
 * error) and draws on a thread of its own; init_store_wait returns when the
 * values are there.  The cuda backend uses the time between for the GPU
 * (train_backend.c).  init_store_ahead starts the draws earlier still, at
 * the start of `hpc run` (cli/cmd_run.c), before the memory check: a later
 * init_store_start for the same parameter shapes, kinds and seed adopts
 * those draws instead of making its own, so the values are the same
 * whichever start made them.  HPC_START_OVERLAP=0 draws in the caller
 * (no thread, nothing ahead).
 *
 * Ownership: the store owns its tensors; init_store_free releases them
 * (stopping draws still running first: their values are never read).
 */
#ifndef HPC_RUNTIME_INIT_H
#define HPC_RUNTIME_INIT_H

#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"
#include "program/params.h"

#define INIT_STD 0.02

typedef struct InitDraws InitDraws;   /* private: draws in flight */

typedef struct {
    const ParamList *pl;  /* borrowed */
    float **w;            /* (pl->n) tensors; w[i] == w[tied_to] for tied parameters */
    InitDraws *pending;   /* draws still running (init_store_start), else NULL */
} ParamStore;

/* Allocates and initialises every parameter (HPC_ERR_OOM on failure):
 * init_store_start, then init_store_wait. */
HpcStatus init_store(ParamStore *ps, const ParamList *pl, uint64_t seed, HpcError *err);
/* Allocates every parameter and starts drawing them (see above); ps->w's
 * values are there after init_store_wait. */
HpcStatus init_store_start(ParamStore *ps, const ParamList *pl, uint64_t seed, HpcError *err);
void init_store_wait(ParamStore *ps);
/* Whether ps's values are all there (init_store_wait would not wait). */
bool init_store_ready(const ParamStore *ps);
void init_store_free(ParamStore *ps);

/* Starts drawing pl's parameters for seed now (see above; pl may be freed
 * once this returns).  Does nothing when a start is already waiting, or
 * when the memory cannot be had (the store's own start then reports). */
void init_store_ahead(const ParamList *pl, uint64_t seed);
/* Host bytes the draws started ahead hold, not adopted yet (0 if none):
 * the cpu memory check counts them as available, since the store it sizes
 * takes them over. */
int64_t init_store_ahead_bytes(void);

/* Fills w (numel of p) as described above for parameter `index`. */
void init_param_f32(const ParamInfo *p, int index, float *w, uint64_t seed);

#endif
