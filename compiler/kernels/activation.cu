// compiler/kernels/activation.cu — y = act(x + bias) for the FFN and the
// pooler, its backward, and the deterministic column sums that give bias
// gradients.  Activations (runtime/cpu/cpu_kernels.h):
//   gelu       0.5 x (1 + erf(x / sqrt 2))
//   gelu_tanh  0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   relu       max(x, 0)    (derivative 0 at 0)
//   tanh       tanh(x)
// The exact GELU takes Phi(x) and phi(x) from KN(gelu_cdf), the step
// module's gelu_cdf (program/activations.h: about 13 instructions where
// erff and expf took about 35), which compiler/emit_kernels.c emits just
// before this file.
// Elementwise kernels are grid-stride loops over (R, C) with 16-byte
// vectors when C allows: any grid works; 256 threads are expected.

#define ACT_GELU 0
#define ACT_GELU_TANH 1
#define ACT_RELU 2
#define ACT_TANH 3

template <int A>
__device__ __forceinline__ float act_fwd(float x)
{
    if (A == ACT_GELU) {
        float pdf;
        return x * KN(gelu_cdf)(x, &pdf);
    }
    if (A == ACT_GELU_TANH) {
        float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
        return 0.5f * x * (1.0f + tanhf(u));
    }
    if (A == ACT_RELU) return x > 0.0f || x != x ? x : 0.0f;   // NaN stays NaN
    return tanhf(x);
}

template <int A>
__device__ __forceinline__ float act_grad(float x)
{
    if (A == ACT_GELU) {
        float pdf, cdf = KN(gelu_cdf)(x, &pdf);
        return cdf + x * pdf;
    }
    if (A == ACT_GELU_TANH) {
        float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
        float t = tanhf(u);
        float du = 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * x * x);
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    }
    if (A == ACT_RELU) return x <= 0.0f ? 0.0f : 1.0f;         // NaN passes dy
    float t = tanhf(x);
    return 1.0f - t * t;
}

// y = act(x + bias): bwd == 0.  dx = dy * act'(x + bias): bwd == 1, where
// `in` is the forward's input x and `dy` the output gradient.
template <int A, int V>
__device__ __forceinline__ void act_apply(st_t *out, const st_t *in, const st_t *dy, const st_t *bias,
                                          i64 n, int cols, int bwd)
{
    i64 nv = n / V;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < nv; i += (i64)gridDim.x * blockDim.x) {
        i64 e = i * V;
        int col = (int)(e % cols);
        float x[V], b[V], d[V], o[V];
        load_n<V>(in + e, x);
        if (bias) load_n<V>(bias + col, b);
        else
#pragma unroll
            for (int k = 0; k < V; k++) b[k] = 0.0f;
        if (bwd) load_n<V>(dy + e, d);
#pragma unroll
        for (int k = 0; k < V; k++)
            o[k] = bwd ? d[k] * act_grad<A>(x[k] + b[k]) : act_fwd<A>(x[k] + b[k]);
        store_n<V>(out + e, o);
    }
}

template <int A>
__device__ __forceinline__ void act_launch(st_t *out, const st_t *in, const st_t *dy, const st_t *bias,
                                           int rows, int cols, int bwd)
{
    i64 n = (i64)rows * cols;
    if (cols % ST_VEC == 0) act_apply<A, ST_VEC>(out, in, dy, bias, n, cols, bwd);
    else act_apply<A, 1>(out, in, dy, bias, n, cols, bwd);
}

#define HPC_ACT_KERNELS(name, A)                                                              \
    extern "C" __global__ void KN(bias_##name##_fwd)(st_t *y, const st_t *x, const st_t *bias, \
                                                      int rows, int cols)                     \
    {                                                                                         \
        act_launch<A>(y, x, 0, bias, rows, cols, 0);                                          \
    }                                                                                         \
    extern "C" __global__ void KN(bias_##name##_bwd)(st_t *dx, const st_t *dy, const st_t *x,  \
                                                      const st_t *bias, int rows, int cols)   \
    {                                                                                         \
        act_launch<A>(dx, x, dy, bias, rows, cols, 1);                                        \
    }

// bias_gelu_fwd(y (R, C), x (R, C), bias (C) or NULL, rows, cols), and
// bias_gelu_bwd(dx (R, C) out, dy (R, C), x (R, C) fwd input, bias, rows, cols);
// likewise gelu_tanh, relu, tanh.  dx may alias dy.
HPC_ACT_KERNELS(gelu, ACT_GELU)
HPC_ACT_KERNELS(gelu_tanh, ACT_GELU_TANH)
HPC_ACT_KERNELS(relu, ACT_RELU)
HPC_ACT_KERNELS(tanh, ACT_TANH)

// Column sums of dy (R, C) in two deterministic steps, for bias gradients:
// colsum_partial with grid (ceil(C / 32), P) and block (32, 8) writes
// partials (P, C); colsum_finish with ceil(C / 256) blocks of 256 adds
// sum_p partials[p] to out (C) f32.
extern "C" __global__ void KN(colsum_partial)(float *partials, const st_t *dy, int rows, int cols)
{
    __shared__ float acc[8][33];
    int col = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (col < cols)
        for (int r = blockIdx.y * 8 + threadIdx.y; r < rows; r += gridDim.y * 8)
            s += ld_f(dy[(i64)r * cols + col]);
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float t = 0.0f;
        for (int k = 0; k < 8; k++) t += acc[k][threadIdx.x];
        partials[(i64)blockIdx.y * cols + col] = t;
    }
}

extern "C" __global__ void KN(colsum_finish)(float *out, const float *partials, int parts, int cols)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    float s = 0.0f;
    for (int p = 0; p < parts; p++) s += partials[(i64)p * cols + col];
    out[col] += s;
}
