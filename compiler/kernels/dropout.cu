// compiler/kernels/dropout.cu — standalone dropout (classifier dropout and
// any dropout the fuser left alone): y[i] = keep(i) ? x[i] / (1 - p) : 0,
// i the flat index, keep() the philox.h contract.  Grid-stride: any grid.

extern "C" __global__ void KN(dropout_fwd)(st_t *y, const st_t *x, long long n, float p,
                                           u64 seed, u32 step, u32 salt)
{
    float s = dropout_scale(p);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = ld_f(x[i]);
        bool keep = p == 0.0f || philox_keep(seed, (u64)i, step, salt, p);
        y[i] = st_from(keep ? v * s : 0.0f);
    }
}

// dx = keep ? dy / (1 - p) : 0; with accumulate != 0, dx += that instead.
extern "C" __global__ void KN(dropout_bwd)(st_t *dx, const st_t *dy, long long n, float p,
                                           u64 seed, u32 step, u32 salt, int accumulate)
{
    float s = dropout_scale(p);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        bool keep = p == 0.0f || philox_keep(seed, (u64)i, step, salt, p);
        float g = keep ? ld_f(dy[i]) * s : 0.0f;
        if (accumulate) g += ld_f(dx[i]);
        dx[i] = st_from(g);
    }
}
