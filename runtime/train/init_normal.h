/* runtime/train/init_normal.h — the init's normal draws, many at a time.
 *
 * Promise: init_normals(seed, salt, first, n, out) writes
 *   out[k] = (float)(INIT_STD * philox_normal(seed, first + k, salt))
 * for k in [0, n), bit for bit (tests/test_init_normal.c checks it against
 * the scalar definition in runtime/cpu/philox.c).
 *
 * Why: the scalar path spent over half its time in Philox-4x32-10, one draw
 * per call with the key schedule recomputed each time.  Here the draws of a
 * block of consecutive indices run eight at a time in AVX2 lanes where the
 * cpu has them (checked once; HPC_INIT_AVX2=0 keeps to SSE2, for tests and
 * comparisons), else four at a time in SSE2 (integer arithmetic, so exact
 * either way), and the Box-Muller maths stays the same double expression
 * as philox_normal's, so the values cannot move.  AVX2 took the draws from
 * 27-31 to 21-27 ns a value (one core of the 2-core box, cpu time).
 */
#ifndef HPC_RUNTIME_INIT_NORMAL_H
#define HPC_RUNTIME_INIT_NORMAL_H

#include <stdint.h>

void init_normals(uint64_t seed, uint32_t salt, int64_t first, int64_t n, float *out);

#endif
