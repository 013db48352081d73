// compiler/kernels/philox.cu — Philox-4x32-10 on the device, bit for bit the
// function of runtime/cpu/philox.c, and the dropout contract of
// runtime/cpu/philox.h: one draw decides 8 consecutive elements,
//   g = i >> 3, key = {seed lo, seed hi}, counter = {g lo, g hi, step, salt},
//   u = 16-bit slice (i & 7) of the draw (word (i & 7) >> 1, half i & 1),
//   t = (u32)(p * 65536 + 0.5), keep = u >= t, kept values scaled by 1/(1-p).

struct philox_out { u32 x[4]; };

// a * m as its low and high 32 bits, which ptxas fuses into one IMAD.WIDE.
// The 64-bit form ((u64)a * m, then >> 32) made it add a zero high word
// after each multiply: one more instruction a multiply, 20 a draw (SASS of
// the step module, CUDA 13).  Plain C, not PTX, so that the compiler still
// merges the identical draws of an unrolled 8-element loop (dropout_elem).
__device__ __forceinline__ void philox_mul(u32 a, u32 m, u32 &lo, u32 &hi)
{
    lo = m * a;
    hi = __umulhi(m, a);
}

__device__ __forceinline__ philox_out philox4x32_10(u32 c0, u32 c1, u32 c2, u32 c3, u32 k0, u32 k1)
{
#pragma unroll
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        u32 lo0, hi0, lo1, hi1;
        philox_mul(c0, 0xD2511F53u, lo0, hi0);
        philox_mul(c2, 0xCD9E8D57u, lo1, hi1);
        u32 n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    philox_out o;
    o.x[0] = c0;
    o.x[1] = c1;
    o.x[2] = c2;
    o.x[3] = c3;
    return o;
}

// Uniform in [0, 1) with 24 random bits: philox_uniform() of runtime/cpu/philox.c.
__device__ __forceinline__ float philox_uniform(u64 seed, u64 index, u32 step, u32 salt)
{
    philox_out r = philox4x32_10((u32)index, (u32)(index >> 32), step, salt, (u32)seed, (u32)(seed >> 32));
    return (float)(r.x[0] >> 8) * (1.0f / 16777216.0f);
}

// The 16-bit drop threshold of probability p: philox_dropout_threshold().
__device__ __forceinline__ u32 philox_threshold(float p) { return (u32)(p * 65536.0f + 0.5f); }

// Keep bits of elements 8 g .. 8 g + 7 (bit k = element 8 g + k):
// philox_dropout_mask8() of runtime/cpu/philox.c.
__device__ __forceinline__ u32 philox_mask8(u64 seed, u64 g, u32 step, u32 salt, float p)
{
    philox_out r = philox4x32_10((u32)g, (u32)(g >> 32), step, salt, (u32)seed, (u32)(seed >> 32));
    u32 t = philox_threshold(p), mask = 0;
    // Each slice compared in place against t in the high half: the high
    // slice as the whole word (x >= t << 16 iff x >> 16 >= t), the low one
    // shifted up; no extraction, and ptxas packs the 8 predicates at once.
    u32 t16 = t << 16;
#pragma unroll
    for (int w = 0; w < 4; w++) {
        mask |= (u32)((r.x[w] << 16) >= t16) << (2 * w);
        mask |= (u32)(r.x[w] >= t16) << (2 * w + 1);
    }
    return t > 0xFFFFu ? 0u : mask;   // p within 2^-17 of 1: no slice reaches t
}

// Element i's keep decision: a whole draw for one element, right for any
// access pattern.  A thread that handles all 8 elements of a group should
// take philox_mask8 once (or write dropout_elem below): NVRTC does not
// merge the 8 draws of philox_keep calls under a branch (the PTX shows 8).
__device__ __forceinline__ bool philox_keep(u64 seed, u64 index, u32 step, u32 salt, float p)
{
    return (philox_mask8(seed, index >> 3, step, salt, p) >> (u32)(index & 7)) & 1u;
}

// Dropout of element i = i0 + j of a vectorised loop (i0 a multiple of 8,
// or j == 0 in a scalar tail), as the step emitter writes it:
//   dropout_elem(philox_mask8(seed, (u64)(i - j) >> 3, step, salt, p), i, on, v, scale)
// The draw is an argument, computed whether or not `on`, with the same
// operands for every j: the compiler keeps one draw per 8 elements (the
// PTX of the step module shows it: tests/test_dropout_ptx.c).  Under a
// branch (`on ? philox_keep(...) : v`) it would compute all 8.
__device__ __forceinline__ float dropout_elem(u32 mask8, i64 i, bool on, float v, float scale)
{
    return on ? (((mask8 >> (u32)(i & 7)) & 1u) ? v * scale : 0.0f) : v;
}

// Test hook: out[i] = philox4x32_10({i + base, 0, step, salt}, seed).x[k]
// for k = 0..3 in out[4 i + k], so the host can compare every bit.
extern "C" __global__ void KN(philox_test)(u32 *out, u64 base, long long n, u64 seed, u32 step, u32 salt)
{
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 idx = base + (u64)i;
    philox_out r = philox4x32_10((u32)idx, (u32)(idx >> 32), step, salt, (u32)seed, (u32)(seed >> 32));
    for (int k = 0; k < 4; k++) out[4 * i + k] = r.x[k];
}
