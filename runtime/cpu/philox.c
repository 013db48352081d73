/* runtime/cpu/philox.c — see philox.h. */
#include "cpu/philox.h"

#include <math.h>

/* Round and key-schedule constants from the Philox paper. */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

static Philox4x32 philox_round(Philox4x32 c, PhiloxKey k)
{
    uint64_t p0 = (uint64_t)PHILOX_M0 * c.x[0];
    uint64_t p1 = (uint64_t)PHILOX_M1 * c.x[2];
    Philox4x32 r;
    r.x[0] = (uint32_t)(p1 >> 32) ^ c.x[1] ^ k.k[0];
    r.x[1] = (uint32_t)p1;
    r.x[2] = (uint32_t)(p0 >> 32) ^ c.x[3] ^ k.k[1];
    r.x[3] = (uint32_t)p0;
    return r;
}

Philox4x32 philox4x32_10(Philox4x32 counter, PhiloxKey key)
{
    for (int i = 0; i < 10; i++) {
        if (i > 0) {
            key.k[0] += PHILOX_W0;
            key.k[1] += PHILOX_W1;
        }
        counter = philox_round(counter, key);
    }
    return counter;
}

static Philox4x32 draw(uint64_t seed, uint64_t index, uint32_t step, uint32_t salt)
{
    Philox4x32 c = {{(uint32_t)index, (uint32_t)(index >> 32), step, salt}};
    PhiloxKey k = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
    return philox4x32_10(c, k);
}

float philox_uniform(uint64_t seed, uint64_t index, uint32_t step, uint32_t salt)
{
    return (float)(draw(seed, index, step, salt).x[0] >> 8) * (1.0f / 16777216.0f);
}

uint32_t philox_dropout_threshold(float p)
{
    return (uint32_t)(p * 65536.0f + 0.5f);
}

uint32_t philox_dropout_mask8(uint64_t seed, uint64_t g, uint32_t step, uint32_t salt, float p)
{
    Philox4x32 r = draw(seed, g, step, salt);
    uint32_t t = philox_dropout_threshold(p), mask = 0;
    for (int k = 0; k < 8; k++) {
        uint32_t u = (r.x[k >> 1] >> (16 * (k & 1))) & 0xFFFFu;
        mask |= (uint32_t)(u >= t) << k;
    }
    return mask;
}

bool philox_dropout_keep(uint64_t seed, uint64_t index, uint32_t step, uint32_t salt, float p)
{
    return philox_dropout_mask8(seed, index >> 3, step, salt, p) >> (index & 7) & 1u;
}

float philox_normal(uint64_t seed, uint64_t index, uint32_t salt)
{
    /* Step 0xFFFFFFFF is reserved for init so it never collides with dropout. */
    Philox4x32 r = draw(seed, index, 0xFFFFFFFFu, salt);
    double u1 = ((r.x[0] >> 8) + 1.0) / 16777217.0; /* (0, 1]: log is finite */
    double u2 = (r.x[1] >> 8) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}
