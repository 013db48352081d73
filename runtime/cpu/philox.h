/* runtime/cpu/philox.h — counter-based random numbers for dropout and init.
 *
 * Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as
 * 1, 2, 3", SC'11).  A draw is a pure function of (key, counter), so the cpu
 * backend and every CUDA kernel produce the same dropout mask for the same
 * seed, step and element, in any order and on any number of threads.
 *
 * The dropout contract, which every CUDA kernel copies exactly
 * (compiler/kernels/philox.cu): one draw decides 8 consecutive elements.
 *   g       = i >> 3                           (the element's group of 8)
 *   key     = { (uint32)seed, (uint32)(seed >> 32) }
 *   counter = { (uint32)g, (uint32)(g >> 32), (uint32)step, (uint32)salt }
 *   r       = philox4x32_10(counter, key)
 *   u       = (r.x[(i & 7) >> 1] >> (16 * (i & 1))) & 0xFFFF   (16 bits)
 *   t       = (uint32)(p * 65536.0f + 0.5f)    (float arithmetic)
 *   keep    = u >= t;   kept values are multiplied by 1 / (1 - p)
 * where i is the element's flat index in the dropout's output, step the
 * optimizer micro-step counter, and salt the dropout op's id in the graph.
 *
 * Why 8 decisions of 16 bits: one Philox-4x32-10 draw costs ~80 integer
 * instructions, so a draw per element made the dropout kernels
 * compute-bound (0.9-1.2 TB/s on the H200); a draw per 8 elements leaves
 * ~10 per element and the kernels run at memory speed.  16 bits keep the
 * probability exact to 2^-16: an element is dropped with probability
 * exactly t / 65536, p rounded to the nearest multiple of 2^-16 (at most
 * 7.7e-6 away; 0.1 becomes 6554 / 65536 = 0.1000061), where 8-bit slices
 * (16 per draw) would move p = 0.1 to 0.1016.  The scale stays 1 / (1 - p),
 * so E[y] / x is 1 within 2^-17 / (1 - p), far below fp16's resolution.
 */
#ifndef HPC_RUNTIME_PHILOX_H
#define HPC_RUNTIME_PHILOX_H

#include <stdbool.h>
#include <stdint.h>

typedef struct { uint32_t x[4]; } Philox4x32;
typedef struct { uint32_t k[2]; } PhiloxKey;

Philox4x32 philox4x32_10(Philox4x32 counter, PhiloxKey key);

/* Uniform in [0, 1) with 24 random bits: (x[0] of the draw at counter
 * {index, step, salt}) >> 8, times 2^-24.  For init, data and tests; dropout
 * uses the contract above. */
float philox_uniform(uint64_t seed, uint64_t index, uint32_t step, uint32_t salt);

/* The 16-bit drop threshold t of probability p in [0, 1]. */
uint32_t philox_dropout_threshold(float p);

/* The keep decisions of elements 8 g .. 8 g + 7: bit k is element 8 g + k. */
uint32_t philox_dropout_mask8(uint64_t seed, uint64_t g, uint32_t step, uint32_t salt, float p);

/* True if element `index` survives dropout with probability p of dropping. */
bool philox_dropout_keep(uint64_t seed, uint64_t index, uint32_t step, uint32_t salt, float p);

/* Standard normal from two uniforms of one draw (Box–Muller); for init. */
float philox_normal(uint64_t seed, uint64_t index, uint32_t salt);

#endif
