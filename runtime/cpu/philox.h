/* runtime/cpu/philox.h — counter-based random numbers for dropout and init.
 *
 * Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as
 * 1, 2, 3", SC'11).  A draw is a pure function of (key, counter), so the cpu
 * backend and every CUDA kernel produce the same dropout mask for the same
 * seed, step and element, in any order and on any number of threads.
 *
 * The dropout contract, which the CUDA emitter copies exactly:
 *   key     = { (uint32)seed, (uint32)(seed >> 32) }
 *   counter = { (uint32)i, (uint32)(i >> 32), (uint32)step, (uint32)salt }
 *   r       = philox4x32_10(counter, key).x[0]
 *   u       = (r >> 8) * 2^-24                 (uniform in [0, 1))
 *   keep    = u >= p;   kept values are multiplied by 1 / (1 - p)
 * where i is the element's flat index in the dropout's output, step the
 * optimizer micro-step counter, and salt the dropout op's id in the graph.
 */
#ifndef HPC_RUNTIME_PHILOX_H
#define HPC_RUNTIME_PHILOX_H

#include <stdbool.h>
#include <stdint.h>

typedef struct { uint32_t x[4]; } Philox4x32;
typedef struct { uint32_t k[2]; } PhiloxKey;

Philox4x32 philox4x32_10(Philox4x32 counter, PhiloxKey key);

/* Uniform in [0, 1) with 24 random bits, as described above. */
float philox_uniform(uint64_t seed, uint64_t index, uint32_t step, uint32_t salt);

/* True if element `index` survives dropout with probability p of dropping. */
bool philox_dropout_keep(uint64_t seed, uint64_t index, uint32_t step, uint32_t salt, float p);

/* Standard normal from two uniforms of one draw (Box–Muller); for init. */
float philox_normal(uint64_t seed, uint64_t index, uint32_t salt);

#endif
