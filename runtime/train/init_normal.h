/* runtime/train/init_normal.h — the init's normal draws, many at a time.
 *
 * Promise: init_normals(seed, salt, first, n, out) writes
 *   out[k] = (float)(INIT_STD * philox_normal(seed, first + k, salt))
 * for k in [0, n), bit for bit (tests/test_init_normal.c checks it against
 * the scalar definition in runtime/cpu/philox.c).
 *
 * Why: the scalar path spent over half its time in Philox-4x32-10, one draw
 * per call with the key schedule recomputed each time, and most of the rest
 * in libm's log and cos.  Here the draws of a block of consecutive indices
 * run sixteen at a time in AVX2 lanes where the cpu has them (checked once;
 * HPC_INIT_AVX2=0 keeps to SSE2, for tests and comparisons), else four at a
 * time in SSE2 (integer arithmetic, so exact either way).  Box-Muller runs
 * four doubles a lane-group in AVX2 (else one at a time): the radius from
 * an exponent split, a 256-row table and a short log1p series, the cosine
 * from a table and short series, then a rounding guard that proves the
 * float equal to philox_normal's libm expression or takes that expression
 * (about 2 values in 10^6).  The guard rests on two error bounds checked
 * for all 2^24 inputs of each (init_normal_guard.h).  One core of the 2-core
 * box (shared, so medians wander), cpu time per value, 2^22 values,
 * 31 runs, min / median: 19.1 / 20.7-24.5 ns before, 6.1 / 6.4-8.3 ns
 * with AVX2 (Philox about 2 of them); 18.8 ns min on the SSE2/scalar path
 * (22.6 before).
 */
#ifndef HPC_RUNTIME_INIT_NORMAL_H
#define HPC_RUNTIME_INIT_NORMAL_H

#include <stdint.h>

void init_normals(uint64_t seed, uint32_t salt, int64_t first, int64_t n, float *out);

#endif
