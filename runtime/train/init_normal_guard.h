/* runtime/train/init_normal_guard.h — the pieces of init_normal.c's fast
 * Box-Muller path, exposed so the test can check every input exhaustively.
 *
 * b is the 24-bit uniform of a draw's angle (x[1] >> 8), cos = cos(2 pi b / 2^24).
 * init_normal_cos_exact is philox_normal's own expression (libm);
 * init_normal_cos_fast must stay within INIT_NORMAL_C_ERR of it for every b,
 * which is what makes the rounding guard in init_normal.c exact.
 */
#ifndef HPC_RUNTIME_INIT_NORMAL_GUARD_H
#define HPC_RUNTIME_INIT_NORMAL_GUARD_H

#include <stdint.h>

#define INIT_NORMAL_C_ERR 4e-15  /* max |cos_fast - cos_exact| */

double init_normal_cos_fast(uint32_t b);
double init_normal_cos_exact(uint32_t b);

#endif
