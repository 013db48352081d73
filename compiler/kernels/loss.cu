// compiler/kernels/loss.cu — losses whose forward and backward run together
// (the loss is the last forward op and its gradient the first backward one).
//
// Cross-entropy over logits (N, C) and labels (N) i32, ignore_index -100,
// mean over the non-ignored rows (ck_xent_fwd/bwd):
//   1. xent_count       one block of 1024: *inv_count = 1 / max(count, 1)
//   2. xent_fwd_bwd     one block of 256 per row: row_loss[r] = lse - x[label]
//                       (0 for ignored rows, NaN for a label outside [0, C),
//                       so a bad label shows as a NaN loss), and
//                       dlogits = (softmax - onehot) * inv_count * dscale
//   3. xent_loss_reduce one block of 1024: *loss = sum(row_loss) * inv_count
// dscale points at the loss scale (the backward seed, read on the device so
// the host never waits), or is NULL for 1.  dlogits may alias logits (each
// element is read before it is written by the same thread).  The _f32 variant
// takes f32 logits and dlogits whatever the model's dtype.
//
// MSE (regression), one block of 1024: *loss = mean((pred - target)^2),
// dpred = 2 (pred - target) / N * dscale.

extern "C" __global__ void KN(xent_count)(float *inv_count, const int *labels, int N)
{
    __shared__ float red[32];
    float c = 0.0f;
    for (int i = threadIdx.x; i < N; i += blockDim.x) c += labels[i] != -100 ? 1.0f : 0.0f;
    c = block_sum(c, red);
    if (threadIdx.x == 0) *inv_count = 1.0f / fmaxf(c, 1.0f);
}

// Online softmax statistics: (m, s) with s = sum exp(x - m) so far.
__device__ __forceinline__ void xent_acc(float &m, float &s, const float *v, int n)
{
    float vm = v[0];
    for (int i = 1; i < n; i++) vm = fmaxf(vm, v[i]);
    if (vm > m) {
        s = m == HPC_NEG_INF ? 0.0f : s * expf(m - vm);
        m = vm;
    }
    for (int i = 0; i < n; i++) s += expf(v[i] - m);
}

// One row: a scalar head up to a 16-byte boundary, 16-byte vectors, a
// scalar tail (rows of C elements are rarely aligned: C = 30522).
template <typename T>
__device__ __forceinline__ void xent_row(T *dlogits, float *row_loss, const T *logits, const int *labels,
                                         const float *inv_count, const float *dscale, int C)
{
    constexpr int V = 16 / (int)sizeof(T);
    __shared__ float red[32];
    i64 row = blockIdx.x;
    const T *x = logits + row * C;
    T *dx = dlogits + row * C;
    int label = labels[row];
    bool valid = label >= 0 && label < C;
    // Read before any thread can overwrite it (dlogits may alias logits).
    float target = threadIdx.x == 0 && valid ? ld_f(x[label]) : 0.0f;
    int head = (int)(((16 - ((unsigned long long)x & 15)) & 15) / sizeof(T));
    if (head > C) head = C;
    int nvec = (C - head) / V, tail = head + nvec * V;
    float m = HPC_NEG_INF, s = 0.0f;
    for (int c = threadIdx.x; c < head; c += blockDim.x) {
        float v = ld_f(x[c]);
        xent_acc(m, s, &v, 1);
    }
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
        float v[V];
        load_t<V>(x + head + i * V, v);
        xent_acc(m, s, v, V);
    }
    for (int c = tail + threadIdx.x; c < C; c += blockDim.x) {
        float v = ld_f(x[c]);
        xent_acc(m, s, &v, 1);
    }
    float gm = block_max(m, red);
    s = m == HPC_NEG_INF ? 0.0f : s * expf(m - gm);
    s = block_sum(s, red);
    float lse = gm + logf(s);
    if (threadIdx.x == 0)
        row_loss[row] = label == -100 ? 0.0f : valid ? lse - target : __int_as_float(0x7fc00000);
    float g = label == -100 ? 0.0f : *inv_count * (dscale ? *dscale : 1.0f);
    // The vector path writes dx with x's alignment: only if they share it.
    if ((((unsigned long long)x ^ (unsigned long long)dx) & 15) != 0) {
        head = C;
        nvec = 0;
        tail = C;
    }
    for (int c = threadIdx.x; c < head; c += blockDim.x)
        put_f(dx + c, g * (expf(ld_f(x[c]) - lse) - (c == label ? 1.0f : 0.0f)));
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
        int c0 = head + i * V;
        float v[V];
        load_t<V>(x + c0, v);
#pragma unroll
        for (int k = 0; k < V; k++) v[k] = g * (expf(v[k] - lse) - (c0 + k == label ? 1.0f : 0.0f));
        store_t<V>(dx + c0, v);
    }
    for (int c = tail + threadIdx.x; c < C; c += blockDim.x)
        put_f(dx + c, g * (expf(ld_f(x[c]) - lse) - (c == label ? 1.0f : 0.0f)));
}

extern "C" __global__ void __launch_bounds__(256)
KN(xent_fwd_bwd)(st_t *dlogits,        // (N, C) out
                 float *row_loss,      // (N) f32 out
                 const st_t *logits,   // (N, C)
                 const int *labels,    // (N) i32
                 const float *inv_count, const float *dscale, int N, int C)
{
    if ((int)blockIdx.x < N) xent_row<st_t>(dlogits, row_loss, logits, labels, inv_count, dscale, C);
}

extern "C" __global__ void __launch_bounds__(256)
KN(xent_fwd_bwd_f32)(float *dlogits, float *row_loss, const float *logits, const int *labels,
                     const float *inv_count, const float *dscale, int N, int C)
{
    if ((int)blockIdx.x < N) xent_row<float>(dlogits, row_loss, logits, labels, inv_count, dscale, C);
}

extern "C" __global__ void KN(xent_loss_reduce)(float *loss, const float *row_loss,
                                                const float *inv_count, int N)
{
    __shared__ double red[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) s += row_loss[i];
    s = block_sum_d(s, red);
    if (threadIdx.x == 0) *loss = (float)(s * *inv_count);
}

template <typename T>
__device__ __forceinline__ void mse_block(T *dpred, float *loss, const T *pred, const float *target,
                                          const float *dscale, int N)
{
    __shared__ double red[32];
    double s = 0.0;
    float g = 2.0f / (float)(N > 0 ? N : 1) * (dscale ? *dscale : 1.0f);
    for (int i = threadIdx.x; i < N; i += blockDim.x) {
        float d = ld_f(pred[i]) - target[i];
        s += (double)d * d;
        put_f(dpred + i, g * d);
    }
    s = block_sum_d(s, red);
    if (threadIdx.x == 0) *loss = N > 0 ? (float)(s / N) : 0.0f;
}

// mse_fwd_bwd(dpred (N) out, loss (1) f32 out, pred (N), target (N) f32, dscale, N)
extern "C" __global__ void KN(mse_fwd_bwd)(st_t *dpred, float *loss, const st_t *pred,
                                           const float *target, const float *dscale, int N)
{
    mse_block<st_t>(dpred, loss, pred, target, dscale, N);
}

extern "C" __global__ void KN(mse_fwd_bwd_f32)(float *dpred, float *loss, const float *pred,
                                               const float *target, const float *dscale, int N)
{
    mse_block<float>(dpred, loss, pred, target, dscale, N);
}
