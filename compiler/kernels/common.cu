// compiler/kernels/common.cu — storage types, conversions, vector access and
// block reductions shared by every hpc kernel template.
//
// The emitter (compiler/emit_kernels.c) prepends the model's constants
// (HPC_DTYPE, HPC_HIDDEN, HPC_ROW_THREADS, ...) and the naming macro KN(base),
// then this file, philox.cu and the kernel templates.  No CUDA headers are
// included: fp16/bf16 conversions are single PTX instructions, so the source
// compiles with NVRTC alone on any machine.
//
// Storage vs compute: activations and weights are stored as st_t (f32, or
// the 16 raw bits of fp16/bf16) and every kernel computes and accumulates in
// fp32.  Parameter gradients and optimizer state are always f32.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// NVRTC has no <math.h>: the infinities by their bits.
#define HPC_INF __int_as_float(0x7f800000)
#define HPC_NEG_INF __int_as_float(0xff800000)

#if HPC_DTYPE == 0
typedef float st_t;
#else
typedef unsigned short st_t;
#endif

// Elements of st_t in one 16-byte load.
#define ST_VEC (16 / (int)sizeof(st_t))

__device__ __forceinline__ float h16_to_f(unsigned short h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short f_to_h16(float f)
{
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float b16_to_f(unsigned short b)
{
    return __uint_as_float(((u32)b) << 16);
}

__device__ __forceinline__ unsigned short f_to_b16(float f)
{
    unsigned short b;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
    return b;
}

__device__ __forceinline__ float ld_f(float x) { return x; }
__device__ __forceinline__ float ld_f(unsigned short x)
{
#if HPC_DTYPE == 2
    return b16_to_f(x);
#else
    return h16_to_f(x);
#endif
}

__device__ __forceinline__ st_t st_from(float x)
{
#if HPC_DTYPE == 0
    return x;
#elif HPC_DTYPE == 1
    return f_to_h16(x);
#else
    return f_to_b16(x);
#endif
}

// Stores an f32 value into a float or st_t element (loss kernels take both).
__device__ __forceinline__ void put_f(float *p, float v) { *p = v; }
#if HPC_DTYPE != 0
__device__ __forceinline__ void put_f(unsigned short *p, float v) { *p = st_from(v); }
#endif

// N consecutive elements of type T (float or st_t) at p into floats: one
// 16- or 8-byte access when N * sizeof(T) is 16 or 8 (p must then be
// aligned to it), else N scalar accesses.
template <int N, typename T>
__device__ __forceinline__ void load_t(const T *p, float *out)
{
    if (N * sizeof(T) == 16) {
        uint4 r = *reinterpret_cast<const uint4 *>(p);
        const T *e = reinterpret_cast<const T *>(&r);
#pragma unroll
        for (int i = 0; i < N; i++) out[i] = ld_f(e[i]);
    } else if (N * sizeof(T) == 8) {
        uint2 r = *reinterpret_cast<const uint2 *>(p);
        const T *e = reinterpret_cast<const T *>(&r);
#pragma unroll
        for (int i = 0; i < N; i++) out[i] = ld_f(e[i]);
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) out[i] = ld_f(p[i]);
    }
}

template <int N, typename T>
__device__ __forceinline__ void store_t(T *p, const float *in)
{
    if (N * sizeof(T) == 16) {
        uint4 r;
        T *e = reinterpret_cast<T *>(&r);
#pragma unroll
        for (int i = 0; i < N; i++) put_f(e + i, in[i]);
        *reinterpret_cast<uint4 *>(p) = r;
    } else if (N * sizeof(T) == 8) {
        uint2 r;
        T *e = reinterpret_cast<T *>(&r);
#pragma unroll
        for (int i = 0; i < N; i++) put_f(e + i, in[i]);
        *reinterpret_cast<uint2 *>(p) = r;
    } else {
#pragma unroll
        for (int i = 0; i < N; i++) put_f(p + i, in[i]);
    }
}

// The same for st_t, the common case.
template <int N>
__device__ __forceinline__ void load_n(const st_t *p, float *out) { load_t<N, st_t>(p, out); }
template <int N>
__device__ __forceinline__ void store_n(st_t *p, const float *in) { store_t<N, st_t>(p, in); }

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the result.  `scratch` holds 32 floats of shared memory
// and may be reused right after the call returns (the trailing barrier).
__device__ __forceinline__ float block_sum(float v, float *scratch)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : 0.0f;
    t = warp_sum(t);
    __syncthreads();
    return t;
}

__device__ __forceinline__ float block_max(float v, float *scratch)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int nwarps = blockDim.x >> 5;
    v = warp_max(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : HPC_NEG_INF;
    t = warp_max(t);
    __syncthreads();
    return t;
}

__device__ __forceinline__ double block_sum_d(double v, double *scratch)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int nwarps = blockDim.x >> 5;
    v = warp_sum_d(v);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    double t = lane < nwarps ? scratch[lane] : 0.0;
    t = warp_sum_d(t);
    __syncthreads();
    return t;
}

// 1/(1-p) rounded once to f32, as the cpu reference computes it.
__device__ __forceinline__ float dropout_scale(float p)
{
    return (float)(1.0 / (1.0 - (double)p));
}

// The row layout of every kernel that keeps one hidden-size row of H
// elements in registers (LayerNorm, embeddings): ROW_THREADS threads each
// hold ROW_NPT chunks of ROW_VEC consecutive elements; chunk c of thread t
// starts at column (t + c * ROW_THREADS) * ROW_VEC.  The emitter computes
// these from H and the dtype and the caller launches ROW_THREADS threads.
#define ROW_VEC HPC_ROW_VEC
#define ROW_THREADS HPC_ROW_THREADS
#define ROW_NPT HPC_ROW_NPT
// Backward row kernels run ROW_RPB rows at once: block (ROW_THREADS, ROW_RPB).
#define ROW_RPB HPC_ROW_RPB

__device__ __forceinline__ int row_col(int c)
{
    return ((int)threadIdx.x + c * ROW_THREADS) * ROW_VEC;
}

// Two sums at once over one thread row (one pair of barriers, not two).
__device__ __forceinline__ void row_sum2(float *a, float *b, float (*scratch)[2][32])
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float x = warp_sum(*a), y = warp_sum(*b);
    if (lane == 0) {
        scratch[threadIdx.y][0][warp] = x;
        scratch[threadIdx.y][1][warp] = y;
    }
    __syncthreads();
    x = lane < ROW_THREADS / 32 ? scratch[threadIdx.y][0][lane] : 0.0f;
    y = lane < ROW_THREADS / 32 ? scratch[threadIdx.y][1][lane] : 0.0f;
    *a = warp_sum(x);
    *b = warp_sum(y);
    __syncthreads();
}
