// compiler/kernels/philox.cu — Philox-4x32-10 on the device, bit for bit the
// function of runtime/cpu/philox.c, and the dropout draw of runtime/cpu/philox.h:
//   key = {seed lo, seed hi}, counter = {i lo, i hi, step, salt},
//   u = (x0 >> 8) * 2^-24, keep = u >= p, kept values scaled by 1/(1-p).

struct philox_out { u32 x[4]; };

__device__ __forceinline__ philox_out philox4x32_10(u32 c0, u32 c1, u32 c2, u32 c3, u32 k0, u32 k1)
{
#pragma unroll
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        // One 32x32->64 multiply each (IMAD.WIDE), not a mul.hi and a mul.lo.
        u64 p0 = (u64)0xD2511F53u * c0, p1 = (u64)0xCD9E8D57u * c2;
        u32 hi0 = (u32)(p0 >> 32), lo0 = (u32)p0;
        u32 hi1 = (u32)(p1 >> 32), lo1 = (u32)p1;
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

__device__ __forceinline__ bool philox_keep(u64 seed, u64 index, u32 step, u32 salt, float p)
{
    return philox_uniform(seed, index, step, salt) >= p;
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
