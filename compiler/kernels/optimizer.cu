// compiler/kernels/optimizer.cu — the fused multi-tensor optimizer step,
// no host round trip (runtime/train/optim.h and lossscale.h are the cpu
// references).  Every parameter tensor is cut into chunks of at most
// OPT_CHUNK elements (runtime/cuda/cuda_optim.h builds the table, in tensor
// order); a block works on whole chunks, so one launch covers every
// tensor, small ones included, with 16-byte accesses wherever the pointers
// are aligned (they are in the arena) and scalar code for the rest.
//   opt_check_norm  grid ceil(chunks / OPT_CHECK_CHUNKS), 256 threads: the
//                   sum of squares of grad * inv_scale (f64) and a
//                   non-finite flag of OPT_CHECK_CHUNKS consecutive chunks
//                   into part_sq[b], part_inf[b]; inv_scale = 1 / state->scale.
//                   A set *poison (test hook) first writes +inf into the first
//                   gradient element.
//   opt_decide      1 block of 1024: reduces the partials in a fixed order
//                   (deterministic), decides the step into *dec (skip, norm,
//                   clip coef = max_norm / (norm + 1e-6) when below 1, lr from
//                   the schedule at s = state->step, bias corrections, the
//                   scale the gradients carry), records found_inf, grad_norm,
//                   clip_coef, lr in the state, then applies the GradScaler
//                   update and the step counters, and clears *poison.
//   [LAMB only: opt_lamb_norms (grid chunks) updates the moments and sums
//                   ||p||^2, ||u||^2 per chunk; opt_lamb_ratio (grid tensors)
//                   the trust ratio of each tensor from its chunks]
//   opt_update      grid chunks, 256 threads: nothing on a skipped step;
//                   else AdamW / Adam / SGD(-momentum) / LAMB update master,
//                   m, v and the st_t copy in one pass.
//   opt_accumulate  grid chunks: the gradient accumulation buffers
//                   (tensor.grad) = (first ? 0 : acc) + src * mul.
// Bytes per parameter of a step (AdamW, 16-bit copy): 4 (check) + 16 read
// + 14 written = 34.  The structs below have the layout of KemitOptTensor,
// KemitOptParams and KemitOptState in compiler/emit_kernels.h and of
// CudaOptChunk in runtime/cuda/cuda_optim.h.

#define OPT_CHUNK 4096
#define OPT_CHECK_CHUNKS 4

struct opt_tensor {
    u64 master, grad, m, v, low; // float*, const float*, float*, float*, st_t* (0 = none)
    long long n;
    int decay, pad_;
};

struct opt_params {
    int kind, nesterov, sched_kind, ls_mode;
    double beta1, beta2, eps, weight_decay, momentum, max_grad_norm;
    double lr, min_lr_ratio;
    long long warmup_steps, total_steps;
    double ls_growth, ls_backoff;
    long long ls_interval;
};

struct opt_state {
    float scale;
    int growth_tracker;
    int found_inf, pad_;
    long long step, consecutive_skips, total_skips;
    double grad_norm, clip_coef, lr;
};

#define OPT_ADAMW 0
#define OPT_ADAM 1
#define OPT_SGD 2
#define OPT_LAMB 3
#define SCHED_CONSTANT 0
#define SCHED_LINEAR 1
#define SCHED_COSINE 2
#define LS_DYNAMIC 0

__device__ double opt_schedule_factor(const opt_params &p, long long s)
{
    long long w = p.warmup_steps, T = p.total_steps;
    if (s < w) return (double)s / (double)(w > 1 ? w : 1);
    double span = (double)(T - w > 1 ? T - w : 1);
    if (p.sched_kind == SCHED_LINEAR) return fmax(0.0, (double)(T - s) / span);
    if (p.sched_kind == SCHED_COSINE) {
        double f = 0.5 * (1.0 + cos(3.14159265358979323846 * ((double)(s - w) / span)));
        if (p.min_lr_ratio > 0) f = p.min_lr_ratio + (1.0 - p.min_lr_ratio) * f;
        return fmax(0.0, f);
    }
    return 1.0;
}

struct opt_chunk {
    u32 tensor, len;   // tensor index, elements (<= OPT_CHUNK)
    u64 begin;         // first element within the tensor
};

// The decision of one step, written by opt_decide, read by every block after.
struct opt_step {
    int bad;            // a non-finite gradient: the step is skipped
    int first;          // first applied step (SGD momentum buffer init)
    double lr, norm;
    float coef, inv, b1, b2, omb1, omb2, eps, bc1, bc2, flr, mom, pad_;
};
static_assert(sizeof(opt_step) <= 128, "runtime/cuda/cuda_optim.c allocates 128 bytes");

extern "C" __global__ void __launch_bounds__(256)
KN(opt_check_norm)(double *part_sq, int *part_inf, const opt_tensor *tensors, const opt_chunk *chunks,
                   int n_chunks, const opt_state *state, const int *poison)
{
    __shared__ double red[32];
    __shared__ int any_bad;
    if (threadIdx.x == 0) {
        any_bad = 0;
        if (blockIdx.x == 0 && *poison) ((float *)tensors[chunks[0].tensor].grad)[chunks[0].begin] = HPC_INF;
    }
    __syncthreads();
    float inv = (float)(1.0 / (double)state->scale);
    double s = 0.0;
    int bad = 0;
    int c1 = min(n_chunks, (int)(blockIdx.x + 1) * OPT_CHECK_CHUNKS);
    for (int c = blockIdx.x * OPT_CHECK_CHUNKS; c < c1; c++) {
        opt_chunk ch = chunks[c];
        const float *g = (const float *)tensors[ch.tensor].grad + ch.begin;
        int n = (int)ch.len, i0 = 0;
        float ts = 0.0f;
        if (((u64)g & 15) == 0) {
            for (int i = 4 * threadIdx.x; i + 4 <= n; i += 4 * blockDim.x) {
                float4 q = *reinterpret_cast<const float4 *>(g + i);
                float u[4] = {q.x * inv, q.y * inv, q.z * inv, q.w * inv};
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    if (!isfinite(u[k])) bad = 1;
                    else ts += u[k] * u[k];
                }
            }
            i0 = n & ~3;
        }
        for (int i = i0 + threadIdx.x; i < n; i += blockDim.x) {
            float u = g[i] * inv;
            if (!isfinite(u)) bad = 1;
            else ts += u * u;
        }
        s += (double)ts;
    }
    if (bad) any_bad = 1;
    s = block_sum_d(s, red);   // its barriers also order the any_bad writes
    if (threadIdx.x == 0) {
        part_sq[blockIdx.x] = s;
        part_inf[blockIdx.x] = any_bad;
    }
}

// The loss scaler (lossscale.c): dynamic: found_inf -> scale *= backoff,
// tracker = 0; else tracker += 1 and at `interval` scale *= growth (never to
// inf), tracker = 0.  Static and none keep the scale.  Every mode skips a
// non-finite step; an applied step counts.
__device__ void opt_scaler_update(opt_state *state, const opt_params &prm, int found)
{
    if (prm.ls_mode == LS_DYNAMIC) {
        if (found) {
            state->scale = (float)((double)state->scale * prm.ls_backoff);
            state->growth_tracker = 0;
        } else if (++state->growth_tracker == prm.ls_interval) {
            float grown = (float)((double)state->scale * prm.ls_growth);
            if (isfinite(grown)) state->scale = grown;
            state->growth_tracker = 0;
        }
    }
    if (found) {
        state->consecutive_skips++;
        state->total_skips++;
    } else {
        state->consecutive_skips = 0;
        state->step++;
    }
}

extern "C" __global__ void __launch_bounds__(1024)
KN(opt_decide)(opt_step *dec, opt_state *state, const double *part_sq, const int *part_inf, int parts,
               opt_params prm, int *poison)
{
    __shared__ double red[32];
    double sq = 0.0, bad = 0.0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) {
        sq += part_sq[i];
        bad += part_inf[i] ? 1.0 : 0.0;
    }
    sq = block_sum_d(sq, red);
    bad = block_sum_d(bad, red);
    if (threadIdx.x != 0) return;
    opt_step o;
    long long s = state->step;
    o.bad = bad > 0.0;
    o.first = s == 0;
    o.lr = prm.lr * opt_schedule_factor(prm, s);
    o.norm = sqrt(sq);
    o.coef = 1.0f;
    if (prm.max_grad_norm > 0) {
        double raw = prm.max_grad_norm / (o.norm + 1e-6);
        if (raw < 1.0) o.coef = (float)raw;
    }
    double t = (double)(s + 1);
    o.inv = (float)(1.0 / (double)state->scale);
    // 1 - beta in double, rounded once: 1.0f - 0.999f is 1.3e-5 off 0.001.
    o.b1 = (float)prm.beta1;
    o.b2 = (float)prm.beta2;
    o.eps = (float)prm.eps;
    o.omb1 = (float)(1.0 - prm.beta1);
    o.omb2 = (float)(1.0 - prm.beta2);
    o.bc1 = (float)(1.0 - pow(prm.beta1, t));
    o.bc2 = (float)(1.0 - pow(prm.beta2, t));
    o.flr = (float)o.lr;
    o.mom = (float)prm.momentum;
    o.pad_ = 0.0f;
    *dec = o;
    state->found_inf = o.bad;
    state->grad_norm = o.bad ? HPC_INF : o.norm;
    state->clip_coef = o.bad ? 1.0 : o.coef;
    state->lr = o.lr;
    opt_scaler_update(state, prm, o.bad);
    *poison = 0;
}

// One element of AdamW / Adam / SGD: g unscaled and clipped; p, m, v in and
// out (m, v untouched where the optimizer keeps none).  The branches are
// uniform (the kind, the momentum).
__device__ __forceinline__ void opt_elem(const opt_step &o, const opt_params &prm, float wd, float decay_mul,
                                         float g, float &p, float &m, float &v)
{
    if (prm.kind == OPT_SGD) {
        float d = g + wd * p;
        if (o.mom != 0.0f) {
            float buf = o.first ? d : o.mom * m + d;
            m = buf;
            d = prm.nesterov ? d + o.mom * buf : buf;
        }
        p = p - o.flr * d;
        return;
    }
    if (prm.kind == OPT_ADAMW) p = p * decay_mul;
    else g = g + wd * p;
    m = o.b1 * m + o.omb1 * g;
    v = o.b2 * v + o.omb2 * g * g;
    p = p - o.flr * ((m / o.bc1) / (sqrtf(v / o.bc2) + o.eps));
}

// LAMB's u of one element (moments already updated).
__device__ __forceinline__ float opt_lamb_u(const opt_step &o, float m, float v, float wd, float p)
{
    return (m / o.bc1) / (sqrtf(v / o.bc2) + o.eps) + wd * p;
}

// The pointers of one chunk and whether they allow 16-byte accesses (8 for
// the 16-bit copy).
struct opt_view {
    float *P, *M, *V;
    const float *G;
    st_t *low;
    int n;
    bool vec;
};

__device__ __forceinline__ opt_view opt_view_of(const opt_tensor &t, const opt_chunk &c)
{
    opt_view w;
    w.P = (float *)t.master + c.begin;
    w.G = (const float *)t.grad + c.begin;
    w.M = t.m ? (float *)t.m + c.begin : 0;
    w.V = t.v ? (float *)t.v + c.begin : 0;
    w.low = t.low ? (st_t *)t.low + c.begin : 0;
    w.n = (int)c.len;
    u64 a = (u64)w.P | (u64)w.G | (u64)w.M | (u64)w.V;
    w.vec = (a & 15) == 0 && ((u64)w.low & (4 * sizeof(st_t) - 1)) == 0;
    return w;
}

__device__ __forceinline__ float4 ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ void st4(float *p, float a, float b, float c, float d)
{
    *reinterpret_cast<float4 *>(p) = make_float4(a, b, c, d);
}

// The 16-bit copy of 4 new masters.
__device__ __forceinline__ void st_low4(st_t *low, const float *p)
{
#if HPC_DTYPE != 0
    store_n<4>(low, p);
#endif
}

// LAMB, first pass (after opt_decide): updates m and v as Adam does and
// sums ||p||^2 and ||u||^2 of each chunk into part_pu[2 c], part_pu[2 c + 1]
// (f64).  Writes nothing on a skipped step.  Grid chunks, 256 threads.
extern "C" __global__ void __launch_bounds__(256)
KN(opt_lamb_norms)(double *part_pu, const opt_step *dec, const opt_tensor *tensors, const opt_chunk *chunks,
                   opt_params prm)
{
    __shared__ double red[32];
    const opt_step o = *dec;
    if (o.bad) return;
    opt_chunk c = chunks[blockIdx.x];
    opt_tensor ten = tensors[c.tensor];
    opt_view w = opt_view_of(ten, c);
    float wd = ten.decay ? (float)prm.weight_decay : 0.0f, gm = o.inv * o.coef;
    double pn = 0.0, un = 0.0;
    for (int i = threadIdx.x; i < w.n; i += blockDim.x) {
        float g = w.G[i] * gm, p = w.P[i];
        float m = o.b1 * w.M[i] + o.omb1 * g;
        float v = o.b2 * w.V[i] + o.omb2 * g * g;
        w.M[i] = m;
        w.V[i] = v;
        float u = opt_lamb_u(o, m, v, wd, p);
        pn += (double)p * p;
        un += (double)u * u;
    }
    pn = block_sum_d(pn, red);
    un = block_sum_d(un, red);
    if (threadIdx.x == 0) {
        part_pu[2 * (i64)blockIdx.x] = pn;
        part_pu[2 * (i64)blockIdx.x + 1] = un;
    }
}

// LAMB trust ratios: ratio[k] = ||p|| / ||u|| of tensor k (1 if either is
// 0) from the partials of its chunks chunk_first[k] .. chunk_first[k+1]-1.
// Grid tensors, 256 threads.
extern "C" __global__ void __launch_bounds__(256)
KN(opt_lamb_ratio)(float *ratio, const double *part_pu, const int *chunk_first, const opt_step *dec)
{
    __shared__ double red[32];
    if (dec->bad) return;
    int k = blockIdx.x;
    double pn = 0.0, un = 0.0;
    for (int c = chunk_first[k] + threadIdx.x; c < chunk_first[k + 1]; c += blockDim.x) {
        pn += part_pu[2 * (i64)c];
        un += part_pu[2 * (i64)c + 1];
    }
    pn = block_sum_d(pn, red);
    un = block_sum_d(un, red);
    if (threadIdx.x == 0) ratio[k] = pn > 0.0 && un > 0.0 ? (float)(sqrt(pn) / sqrt(un)) : 1.0f;
}

// lamb_ratio: (tensors) f32 from opt_lamb_ratio when prm.kind is LAMB, else NULL.
extern "C" __global__ void __launch_bounds__(256)
KN(opt_update)(const opt_step *dec, const opt_tensor *tensors, const opt_chunk *chunks, const float *lamb_ratio,
               opt_params prm)
{
    const opt_step o = *dec;
    if (o.bad) return;
    opt_chunk c = chunks[blockIdx.x];
    opt_tensor ten = tensors[c.tensor];
    opt_view w = opt_view_of(ten, c);
    float wd = ten.decay ? (float)prm.weight_decay : 0.0f, gm = o.inv * o.coef;
    if (prm.kind == OPT_LAMB) {
        // Moments were updated by opt_lamb_norms; u from the stored ones.
        float rlr = o.flr * lamb_ratio[c.tensor];
        for (int i = threadIdx.x; i < w.n; i += blockDim.x) {
            float p = w.P[i];
            p = p - rlr * opt_lamb_u(o, w.M[i], w.V[i], wd, p);
            w.P[i] = p;
#if HPC_DTYPE != 0
            if (w.low) w.low[i] = st_from(p);
#endif
        }
        return;
    }
    float decay_mul = (float)(1.0 - o.lr * (ten.decay ? prm.weight_decay : 0.0));
    int i0 = 0;
    if (w.vec) {
        // Every load of 4 elements is issued before any arithmetic.
        for (int i = 4 * threadIdx.x; i + 4 <= w.n; i += 4 * blockDim.x) {
            float4 g4 = ld4(w.G + i), p4 = ld4(w.P + i);
            float4 m4 = w.M ? ld4(w.M + i) : make_float4(0, 0, 0, 0);
            float4 v4 = w.V ? ld4(w.V + i) : make_float4(0, 0, 0, 0);
            float g[4] = {g4.x, g4.y, g4.z, g4.w}, p[4] = {p4.x, p4.y, p4.z, p4.w};
            float m[4] = {m4.x, m4.y, m4.z, m4.w}, v[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
            for (int k = 0; k < 4; k++) opt_elem(o, prm, wd, decay_mul, g[k] * gm, p[k], m[k], v[k]);
            st4(w.P + i, p[0], p[1], p[2], p[3]);
            if (w.M) st4(w.M + i, m[0], m[1], m[2], m[3]);
            if (w.V) st4(w.V + i, v[0], v[1], v[2], v[3]);
            if (w.low) st_low4(w.low + i, p);
        }
        i0 = w.n & ~3;
    }
    for (int i = i0 + threadIdx.x; i < w.n; i += blockDim.x) {
        float p = w.P[i], m = w.M ? w.M[i] : 0.0f, v = w.V ? w.V[i] : 0.0f;
        opt_elem(o, prm, wd, decay_mul, w.G[i] * gm, p, m, v);
        w.P[i] = p;
        if (w.M) w.M[i] = m;
        if (w.V) w.V[i] = v;
#if HPC_DTYPE != 0
        if (w.low) w.low[i] = st_from(p);
#endif
    }
}

// acc = (first ? 0 : acc) + src * mul over each chunk, acc = tensor.grad,
// src[k] the executor's gradient of tensor k.  Grid chunks, 256 threads.
extern "C" __global__ void __launch_bounds__(256)
KN(opt_accumulate)(const opt_tensor *tensors, const u64 *src, const opt_chunk *chunks, float mul, int first)
{
    opt_chunk c = chunks[blockIdx.x];
    float *acc = (float *)tensors[c.tensor].grad + c.begin;
    const float *g = (const float *)src[c.tensor] + c.begin;
    for (int i = threadIdx.x; i < (int)c.len; i += blockDim.x) {
        float v = g[i] * mul;
        acc[i] = first ? v : acc[i] + v;
    }
}
