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
 * Ownership: the store owns its tensors; init_store_free releases them.
 */
#ifndef HPC_RUNTIME_INIT_H
#define HPC_RUNTIME_INIT_H

#include <stdint.h>

#include "util/error.h"
#include "program/params.h"

#define INIT_STD 0.02

typedef struct {
    const ParamList *pl;  /* borrowed */
    float **w;            /* (pl->n) tensors; w[i] == w[tied_to] for tied parameters */
} ParamStore;

/* Allocates and initialises every parameter (HPC_ERR_OOM on failure). */
HpcStatus init_store(ParamStore *ps, const ParamList *pl, uint64_t seed, HpcError *err);
void init_store_free(ParamStore *ps);

/* Fills w (numel of p) as described above for parameter `index`. */
void init_param_f32(const ParamInfo *p, int index, float *w, uint64_t seed);

#endif
