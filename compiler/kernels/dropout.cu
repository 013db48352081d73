// compiler/kernels/dropout.cu — standalone dropout (classifier dropout and
// any dropout the fuser left alone): y[i] = keep(i) ? x[i] / (1 - p) : 0,
// i the flat index, keep() the philox.h contract.  A thread takes a group
// of 8 elements, the elements of one Philox draw (philox_mask8), with one
// 16-byte access per operand where the pointers allow it.  Grid-stride:
// any grid.

// The 8 elements of group q (fewer at the end of n) into v.
__device__ __forceinline__ void dropout_load8(const st_t *x, long long q, long long n, bool vec, float *v)
{
    long long i0 = 8 * q;
    if (vec && i0 + 8 <= n) {
        load_n<8>(x + i0, v);
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = i0 + j < n ? ld_f(x[i0 + j]) : 0.0f;
}

__device__ __forceinline__ void dropout_store8(st_t *y, long long q, long long n, bool vec, const float *v)
{
    long long i0 = 8 * q;
    if (vec && i0 + 8 <= n) {
        store_n<8>(y + i0, v);
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (i0 + j < n) y[i0 + j] = st_from(v[j]);
}

// 16-byte accesses need 8 st_t (16 or 32 bytes) at 16-byte aligned addresses.
__device__ __forceinline__ bool dropout_vec_ok(const void *a, const void *b)
{
    return (((unsigned long long)a | (unsigned long long)b) & 15) == 0;
}

extern "C" __global__ void KN(dropout_fwd)(st_t *y, const st_t *x, long long n, float p,
                                           u64 seed, u32 step, u32 salt)
{
    float s = dropout_scale(p);
    bool vec = dropout_vec_ok(y, x);
    long long groups = (n + 7) / 8;
    for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < groups;
         q += (long long)gridDim.x * blockDim.x) {
        float v[8];
        dropout_load8(x, q, n, vec, v);
        u32 keep = p == 0.0f ? 0xFFu : philox_mask8(seed, (u64)q, step, salt, p);
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = (keep >> j) & 1u ? v[j] * s : 0.0f;
        dropout_store8(y, q, n, vec, v);
    }
}

// dx = keep ? dy / (1 - p) : 0; with accumulate != 0, dx += that instead.
extern "C" __global__ void KN(dropout_bwd)(st_t *dx, const st_t *dy, long long n, float p,
                                           u64 seed, u32 step, u32 salt, int accumulate)
{
    float s = dropout_scale(p);
    bool vec = dropout_vec_ok(dx, dy);
    long long groups = (n + 7) / 8;
    for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < groups;
         q += (long long)gridDim.x * blockDim.x) {
        float g[8], acc[8];
        dropout_load8(dy, q, n, vec, g);
        if (accumulate) dropout_load8(dx, q, n, vec, acc);
        u32 keep = p == 0.0f ? 0xFFu : philox_mask8(seed, (u64)q, step, salt, p);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            g[j] = (keep >> j) & 1u ? g[j] * s : 0.0f;
            if (accumulate) g[j] += acc[j];
        }
        dropout_store8(dx, q, n, vec, g);
    }
}
