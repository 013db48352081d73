/* runtime/train/init_normal_guard.h — the pieces of init_normal.c's fast
 * Box-Muller path, exposed so the test can check every input exhaustively.
 *
 * a = x[0] >> 8 is the 24-bit uniform of a draw's radius, u1 = (a + 1) / (2^24 + 1),
 * r = sqrt(-2 log u1); b = x[1] >> 8 that of its angle, cos = cos(2 pi b / 2^24).
 * init_normal_radius_exact and init_normal_cos_exact are philox_normal's own
 * expressions (libm).  init_normal_fast_parts computes the fast r and cos of
 * n draws' words with the code the draws run (AVX2 lanes where
 * init_normal_uses_avx2, else scalar); the fast radius must stay within
 * INIT_NORMAL_R_ERR relative and the fast cosine within INIT_NORMAL_C_ERR
 * absolute of libm's for every a and every b, which is what makes the
 * rounding guard in init_normal.c exact.
 */
#ifndef HPC_RUNTIME_INIT_NORMAL_GUARD_H
#define HPC_RUNTIME_INIT_NORMAL_GUARD_H

#include <stdbool.h>
#include <stdint.h>

#define INIT_NORMAL_C_ERR 4e-15  /* max |cos_fast - cos_exact| */
#define INIT_NORMAL_R_ERR 4e-15  /* max |r_fast - r_exact| / r_exact (measured 2.1e-15, see init_normal.c) */

void init_normal_fast_parts(const uint32_t *x0, const uint32_t *x1, int n, double *r, double *c);
double init_normal_radius_exact(uint32_t a);
double init_normal_cos_exact(uint32_t b);
bool init_normal_uses_avx2(void);
/* Values so far (this process) whose guard failed and took libm's path. */
uint64_t init_normal_fallback_count(void);

#endif
