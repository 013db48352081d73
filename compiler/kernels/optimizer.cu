// compiler/kernels/optimizer.cu — the fused multi-tensor optimizer step,
// no host round trip (runtime/train/optim.h and lossscale.h are the cpu
// references):
//   opt_check_norm  grid P (<= 1024), 256 threads: per block, the sum of
//                   squares of grad * inv_scale (f64) and a non-finite flag,
//                   over every tensor, into part_sq[P] and part_inf[P];
//                   inv_scale = 1 / state->scale.
//   [LAMB only: opt_lamb_norms, then opt_lamb_ratio: moments and the
//                   per-tensor trust ratios ||p|| / ||u||]
//   opt_update      any grid, 256 threads: every block reduces the P
//                   partials itself (a fixed order: deterministic); if any
//                   flag is set nothing is written; else the unscaled
//                   gradient is clipped (coef = max_norm / (norm + 1e-6) when
//                   below 1) and AdamW / Adam / SGD(-momentum) / LAMB update
//                   master, m, v and the st_t copy, with lr from the schedule
//                   at s = state->step (HF warmup + constant/linear/cosine).
//                   Block 0 records found_inf, grad_norm, clip_coef and lr.
//   opt_finish      one thread: the GradScaler update of state->scale
//                   (dynamic mode), the skip counters, and state->step += 1
//                   after an applied step.
// The structs below have the layout of KemitOptTensor, KemitOptParams and
// KemitOptState in compiler/emit_kernels.h.

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

extern "C" __global__ void __launch_bounds__(256)
KN(opt_check_norm)(double *part_sq, int *part_inf, const opt_tensor *tensors, int count,
                   const opt_state *state)
{
    __shared__ double red[32];
    __shared__ int any_bad;
    float inv = (float)(1.0 / (double)state->scale);
    double s = 0.0;
    int bad = 0;
    if (threadIdx.x == 0) any_bad = 0;
    for (int k = 0; k < count; k++) {
        const float *g = (const float *)tensors[k].grad;
        long long n = tensors[k].n;
        float ts = 0.0f;
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (long long)gridDim.x * blockDim.x) {
            float u = g[i] * inv;
            if (!isfinite(u)) bad = 1;
            else ts += u * u;
        }
        s += ts;
    }
    __syncthreads();
    if (bad) any_bad = 1;
    s = block_sum_d(s, red);
    if (threadIdx.x == 0) {
        part_sq[blockIdx.x] = s;
        part_inf[blockIdx.x] = any_bad;
    }
}

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

// What every block of the update kernels derives from the partials and the
// state: the same values in every block, reduced in the same order.
struct opt_step {
    bool bad;           // a non-finite gradient: the step is skipped
    double lr, norm;
    float coef, inv, b1, b2, omb1, omb2, eps, bc1, bc2, flr, mom;
    bool first;         // first applied step (SGD momentum buffer init)
};

__device__ opt_step opt_prologue(const opt_state *state, const double *part_sq, const int *part_inf,
                                 int parts, const opt_params &prm, double *red)
{
    double sq = 0.0, bad = 0.0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) {
        sq += part_sq[i];
        bad += part_inf[i] ? 1.0 : 0.0;
    }
    sq = block_sum_d(sq, red);
    bad = block_sum_d(bad, red);
    opt_step o;
    long long s = state->step;
    o.bad = bad > 0.0;
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
    o.first = s == 0;
    return o;
}

// LAMB, first pass (after opt_check_norm, before opt_lamb_ratio): updates
// m and v as Adam does and sums ||p||^2 and ||u||^2 per tensor, where
// u = mhat / (sqrt(vhat) + eps) + wd p, into part_pu (count, gridDim.x, 2)
// f64.  Writes nothing on a skipped step.  Any grid <= 1024, 256 threads.
extern "C" __global__ void __launch_bounds__(256)
KN(opt_lamb_norms)(double *part_pu, const opt_state *state, const opt_tensor *tensors, int count,
                   const double *part_sq, const int *part_inf, int parts, opt_params prm)
{
    __shared__ double red[32];
    opt_step o = opt_prologue(state, part_sq, part_inf, parts, prm, red);
    if (o.bad) return;
    for (int k = 0; k < count; k++) {
        opt_tensor ten = tensors[k];
        float *P = (float *)ten.master, *M = (float *)ten.m, *V = (float *)ten.v;
        const float *G = (const float *)ten.grad;
        float wd = ten.decay ? (float)prm.weight_decay : 0.0f;
        double pn = 0.0, un = 0.0;
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < ten.n;
             i += (long long)gridDim.x * blockDim.x) {
            float g = G[i] * o.inv * o.coef, p = P[i];
            float m = o.b1 * M[i] + o.omb1 * g;
            float v = o.b2 * V[i] + o.omb2 * g * g;
            M[i] = m;
            V[i] = v;
            float u = (m / o.bc1) / (sqrtf(v / o.bc2) + o.eps) + wd * p;
            pn += (double)p * p;
            un += (double)u * u;
        }
        pn = block_sum_d(pn, red);
        un = block_sum_d(un, red);
        if (threadIdx.x == 0) {
            part_pu[((i64)k * gridDim.x + blockIdx.x) * 2] = pn;
            part_pu[((i64)k * gridDim.x + blockIdx.x) * 2 + 1] = un;
        }
    }
}

// LAMB trust ratios: ratio[k] = ||p|| / ||u|| of tensor k (1 if either is
// 0), from the P partials of opt_lamb_norms.  One block of 256 per tensor.
extern "C" __global__ void __launch_bounds__(256)
KN(opt_lamb_ratio)(float *ratio, const double *part_pu, int P)
{
    __shared__ double red[32];
    int k = blockIdx.x;
    double pn = 0.0, un = 0.0;
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        pn += part_pu[((i64)k * P + i) * 2];
        un += part_pu[((i64)k * P + i) * 2 + 1];
    }
    pn = block_sum_d(pn, red);
    un = block_sum_d(un, red);
    if (threadIdx.x == 0) ratio[k] = pn > 0.0 && un > 0.0 ? (float)(sqrt(pn) / sqrt(un)) : 1.0f;
}

// lamb_ratio: (count) f32 from opt_lamb_ratio when prm.kind is LAMB, else NULL.
extern "C" __global__ void __launch_bounds__(256)
KN(opt_update)(opt_state *state, const opt_tensor *tensors, int count, const double *part_sq,
               const int *part_inf, int parts, const float *lamb_ratio, opt_params prm)
{
    __shared__ double red[32];
    opt_step o = opt_prologue(state, part_sq, part_inf, parts, prm, red);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        state->found_inf = o.bad;
        state->grad_norm = o.bad ? HPC_INF : o.norm;
        state->clip_coef = o.bad ? 1.0 : o.coef;
        state->lr = o.lr;
    }
    if (o.bad) return;
    for (int k = 0; k < count; k++) {
        opt_tensor ten = tensors[k];
        float *P = (float *)ten.master, *M = (float *)ten.m, *V = (float *)ten.v;
        const float *G = (const float *)ten.grad;
#if HPC_DTYPE != 0
        st_t *low = (st_t *)ten.low;
#endif
        float wd = ten.decay ? (float)prm.weight_decay : 0.0f;
        if (prm.kind == OPT_LAMB) {
            // Moments were updated by opt_lamb_norms; u from the stored ones.
            float rlr = o.flr * lamb_ratio[k];
            for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < ten.n;
                 i += (long long)gridDim.x * blockDim.x) {
                float p = P[i];
                p = p - rlr * ((M[i] / o.bc1) / (sqrtf(V[i] / o.bc2) + o.eps) + wd * p);
                P[i] = p;
#if HPC_DTYPE != 0
                if (low) low[i] = st_from(p);
#endif
            }
            continue;
        }
        // Every load of an element is issued before the branch on the
        // optimizer kind (a uniform branch), so they are in flight together.
        float decay_mul = (float)(1.0 - o.lr * (ten.decay ? prm.weight_decay : 0.0));
        for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < ten.n;
             i += (long long)gridDim.x * blockDim.x) {
            float g = G[i] * o.inv * o.coef, p = P[i];
            if (prm.kind == OPT_SGD) {
                float d = g + wd * p;
                if (o.mom != 0.0f) {
                    float buf = o.first ? d : o.mom * M[i] + d;
                    M[i] = buf;
                    d = prm.nesterov ? d + o.mom * buf : buf;
                }
                p = p - o.flr * d;
            } else {
                if (prm.kind == OPT_ADAMW) p = p * decay_mul;
                else g = g + wd * p;
                float m = o.b1 * M[i] + o.omb1 * g;
                float v = o.b2 * V[i] + o.omb2 * g * g;
                M[i] = m;
                V[i] = v;
                p = p - o.flr * ((m / o.bc1) / (sqrtf(v / o.bc2) + o.eps));
            }
            P[i] = p;
#if HPC_DTYPE != 0
            if (low) low[i] = st_from(p);
#endif
        }
    }
}

// The loss scaler (lossscale.c): dynamic: found_inf -> scale *= backoff,
// tracker = 0; else tracker += 1 and at `interval` scale *= growth (never to
// inf), tracker = 0.  Static and none keep the scale.  Every mode skips a
// non-finite step.  One thread.
extern "C" __global__ void KN(opt_finish)(opt_state *state, opt_params prm)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int found = state->found_inf;
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
