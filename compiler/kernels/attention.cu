// compiler/kernels/attention.cu — fused multi-head self-attention, forward
// and backward, without the (B, NH, L, L) score tensor and without the head
// split/merge copies.  Three families with one contract: attn_simt_* (fp32
// FMA on the CUDA cores, every dtype, the whole forward and backward),
// attn_mma_* (tensor cores, fp16/bf16 with D % 16 == 0: fwd, bwd_dq and
// bwd_dkv; the delta pre-pass is attn_simt_bwd_dot for all) and attn_mma2_*
// (v2: the same on the tensor cores with cp.async double buffering and
// ldmatrix fragments; see attention_mma2.cu); and one more backward,
// attn_mma3_bwd (L <= 128, D <= 64: dQ, dK and dV in ONE pass over S, P and
// dP, delta computed inside; see attention_mma3.cu), with attn_head_bwd_dot
// (delta per (b, head) block).  The step calls one tensor-core family
// (HPC_ATTN_KERNELS, compiler/emit_ops_attention.c): by default (v4) v2's
// forward and attn_mma4_bwd (attention_mma4.cu), v2's dQ and dK/dV kernels
// for longer rows.
// Files, each building on the ones before (compiler/emit_attention.h's
// kemit_attn_parts): this one (the contract, the at_* helpers, the SIMT
// family), attention_mma.cu (v1, am_*), attention_mma2.cu (v2, a2_*),
// attention_mma3.cu (the one-pass backward) and attention_first.cu (query 0
// alone, the last layer under a first-token head).
//
// Specialised at generation time on the head size D = HPC_HEAD_DIM (<= 128)
// and the head count NH = HPC_HEADS; B and L are arguments.  The semantics
// are those of the unfused chain of the step (runtime/cpu/cpu_attention.h
// composes its cpu references):
//   S    = (Q K^T) / sqrt(D)                per (b, head), Q, K, V (L, D)
//   P    = softmax_k(S), keys k with mask[b * L + k] == 0 removed (probability
//          exactly 0; with HPC_CAUSAL also k > q); a row with every key
//          removed is all zeros, so its context is 0;
//   Z    = dropout(P), flat index ((b * NH + head) * L + q) * L + k, the index
//          the unfused softmax output (B, NH, L, L) has (philox.h contract);
//   ctx  = Z V, written (B, L, NH * D) with row stride HPC_HIDDEN;
//   lse  = max_k S + log(sum_k exp(S - max)) per (b, head, q), f32, or +inf
//          for a row with every key removed (so exp(S - lse) is 0 there).
// Q, K and V are read in place from the projection output: element d of
// head h at position t of batch row b is at q[(b * L + t) * ld + h * D + d]
// (the same for k and v), so one (B, L, 3H) QKV buffer is q = qkv,
// k = qkv + H, v = qkv + 2H, ld = 3H.  Gradients are written the same way.
// NaN in the visible scores or values stays NaN (never turns into 0).
//
// Backward (dropout mask regenerated from (seed, step, salt), nothing saved
// but lse):
//   delta = rowsum(dctx * ctx)                       attn_simt_bwd_dot (or inside attn_mma3_bwd)
//   dP_k  = keep_k / (1 - p) * (dctx . V_k)
//   dS_k  = P_k (dP_k - delta)                       (P_k = exp(S_k - lse))
//   dQ    = dS K / sqrt(D)                            attn_simt_bwd_dq
//   dK    = dS^T Q / sqrt(D),  dV = Z^T dctx          attn_simt_bwd_dkv
// Gradients are OVERWRITTEN (each is the only contribution to its slice of
// the QKV gradient).
//
// Layout of the work.  Forward and dQ: a block of 4 warps takes 16 query
// rows (4 per warp) of one (b, head) and walks the keys in tiles of 32 held
// in shared memory; lane j scores key j of the tile, the online softmax
// keeps (max, sum) per row, and lane j accumulates output elements
// j, j + 32, ... of the row.  dK/dV: a block of one warp owns 32 keys (one
// per lane, its dK and dV rows in registers) and walks the queries in chunks
// of 8.  Each lane draws Philox for its own key; in lockstep that costs one
// draw time per 32 elements, not 8 times the 8-per-draw minimum.

#if HPC_HEAD_DIM <= 128

// Every kernel is a body attn_NAME_run(block x, y, z, args...) and, unless
// HPC_ATTN_NO_KERNELS, the kernel KN(attn_NAME)(args...) that calls it with
// blockIdx.  The step module (compiler/emit_ops_attention.c) takes the
// bodies only and calls them from its EopArgs wrappers, inlined: every
// layer's node launches the same kernel (the dropout salt is an argument),
// so no body is compiled twice, and inlining saves the call itself (the
// ABI's saved registers and stack frame; H200, 2026-12-02: the backward -4 %
// with the batched delta loads; until then AT_RUN was __noinline__ there).
#ifndef AT_RUN
#define AT_RUN __device__ __forceinline__
#endif

#define AT_D HPC_HEAD_DIM
#define AT_DPL ((AT_D + 31) / 32)   // row elements per lane
#define AT_ROWS 4                   // query rows per warp (fwd, dq)
#define AT_QB (4 * AT_ROWS)         // query rows per 128-thread block
#define AT_KT 32                    // keys per shared-memory tile
#define AT_QC 8                     // queries per chunk (dkv)

__device__ __forceinline__ float at_scale(void) { return (float)(1.0 / sqrt((double)AT_D)); }

__device__ __forceinline__ bool at_visible(const int *mask, int b, int q, int k, int L)
{
    if (k >= L) return false;
    if (mask && mask[(i64)b * L + k] == 0) return false;
    return !(HPC_CAUSAL && k > q);
}

// 1 / (1 - p) if element idx of the probabilities survives dropout, else 0.
__device__ __forceinline__ float at_keep(i64 idx, float p, float dscale, u64 seed, u32 step, u32 salt)
{
    if (p == 0.0f) return 1.0f;
    return philox_keep(seed, (u64)idx, step, salt, p) ? dscale : 0.0f;
}

// rows x D elements of one head into shared memory as f32 (times mul),
// zero past L; `stride` is the shared row stride.
__device__ __forceinline__ void at_load_tile(float *dst, int stride, const st_t *src, int ld, int b, int h,
                                             int t0, int rows, int L, float mul, int tid, int nthreads)
{
    for (int i = tid; i < rows * AT_D; i += nthreads) {
        int r = i / AT_D, d = i % AT_D, t = t0 + r;
        dst[r * stride + d] = t < L ? mul * ld_f(src[((i64)b * L + t) * ld + h * AT_D + d]) : 0.0f;
    }
}

AT_RUN void attn_simt_fwd_run(int at_bx, int at_by, int at_bz,
                                                  st_t *ctx,            // (B, L, HPC_HIDDEN) out
                                                  float *lse,           // (B, NH, L) out
                                                  const st_t *q, const st_t *k, const st_t *v, int ld,
                                                  const int *mask,      // (B, L) i32, or NULL
                                                  int B, int L, float p, u64 seed, u32 step, u32 salt)
{
    __shared__ float qs[AT_QB][AT_D];
    __shared__ float ks[AT_KT][AT_D + 1];
    __shared__ float vs[AT_KT][AT_D];
    int b = at_bz, h = at_by, q0 = at_bx * AT_QB;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float dscale = dropout_scale(p);
    at_load_tile(&qs[0][0], AT_D, q, ld, b, h, q0, AT_QB, L, at_scale(), threadIdx.x, 128);
    float m[AT_ROWS], l[AT_ROWS], o[AT_ROWS][AT_DPL];
#pragma unroll
    for (int i = 0; i < AT_ROWS; i++) {
        m[i] = HPC_NEG_INF;
        l[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < AT_DPL; e++) o[i][e] = 0.0f;
    }
    for (int t0 = 0; t0 < L; t0 += AT_KT) {
        __syncthreads();
        at_load_tile(&ks[0][0], AT_D + 1, k, ld, b, h, t0, AT_KT, L, 1.0f, threadIdx.x, 128);
        at_load_tile(&vs[0][0], AT_D, v, ld, b, h, t0, AT_KT, L, 1.0f, threadIdx.x, 128);
        __syncthreads();
        int key = t0 + lane, nk = min(AT_KT, L - t0);
#pragma unroll
        for (int i = 0; i < AT_ROWS; i++) {
            int r = warp * AT_ROWS + i, row = q0 + r;
            if (row >= L) break;   // uniform across the warp
            float s = 0.0f;
#pragma unroll 16
            for (int d = 0; d < AT_D; d++) s += qs[r][d] * ks[lane][d];
            s = at_visible(mask, b, row, key, L) ? s : HPC_NEG_INF;
            float mn = fmaxf(m[i], warp_max(s));
            bool nan = __any_sync(0xffffffffu, s != s);
            if (mn == HPC_NEG_INF && !nan) continue;   // nothing visible yet
            float pe = expf(s - mn), corr = expf(m[i] - mn);
            l[i] = l[i] * corr + warp_sum(pe);
            i64 idx = (((i64)b * HPC_HEADS + h) * L + row) * L + key;
            float pd = key < L ? pe * at_keep(idx, p, dscale, seed, step, salt) : 0.0f;
#pragma unroll
            for (int e = 0; e < AT_DPL; e++) o[i][e] *= corr;
            for (int j = 0; j < nk; j++) {
                float pj = __shfl_sync(0xffffffffu, pd, j);
#pragma unroll
                for (int e = 0; e < AT_DPL; e++) {
                    int d = lane + 32 * e;
                    if (d < AT_D) o[i][e] += pj * vs[j][d];
                }
            }
            m[i] = mn;
        }
    }
#pragma unroll
    for (int i = 0; i < AT_ROWS; i++) {
        int row = q0 + warp * AT_ROWS + i;
        if (row >= L) break;
        // l == 0: every key removed, the row is 0; NaN stays NaN.
        float inv = l[i] == 0.0f ? 0.0f : 1.0f / l[i];
#pragma unroll
        for (int e = 0; e < AT_DPL; e++) {
            int d = lane + 32 * e;
            if (d < AT_D) ctx[((i64)b * L + row) * HPC_HIDDEN + h * AT_D + d] = st_from(o[i][e] * inv);
        }
        if (lane == 0)
            lse[((i64)b * HPC_HEADS + h) * L + row] = l[i] == 0.0f ? HPC_INF : m[i] + logf(l[i]);
    }
}
#ifndef HPC_ATTN_NO_KERNELS
extern "C" __global__ void __launch_bounds__(128)
KN(attn_simt_fwd)(st_t *ctx,            // (B, L, HPC_HIDDEN) out
                      float *lse,           // (B, NH, L) out
                      const st_t *q, const st_t *k, const st_t *v, int ld,
                      const int *mask,      // (B, L) i32, or NULL
                      int B, int L, float p, u64 seed, u32 step, u32 salt)
{
    attn_simt_fwd_run(blockIdx.x, blockIdx.y, blockIdx.z, ctx, lse, q, k, v, ld, mask, B, L, p, seed, step, salt);
}
#endif

// delta[(b * NH + h) * L + t] = sum_d dctx * ctx over head h's D elements
// of position t: one warp per (b, t, h), (ceil(B * L * NH / 4) x 128).
AT_RUN void attn_simt_bwd_dot_run(int at_bx, int at_by, int at_bz,
                                                      float *delta, const st_t *dctx, const st_t *ctx, int B, int L)
{
    i64 w = (i64)at_bx * 4 + (threadIdx.x >> 5);
    if (w >= (i64)B * L * HPC_HEADS) return;
    int lane = threadIdx.x & 31, h = (int)(w % HPC_HEADS);
    i64 bt = w / HPC_HEADS;   // b * L + t
    const st_t *g = dctx + bt * HPC_HIDDEN + h * AT_D, *y = ctx + bt * HPC_HIDDEN + h * AT_D;
    float s = 0.0f;
    for (int d = lane; d < AT_D; d += 32) s += ld_f(g[d]) * ld_f(y[d]);
    s = warp_sum(s);
    i64 b = bt / L, t = bt % L;
    if (lane == 0) delta[(b * HPC_HEADS + h) * L + t] = s;
}
#ifndef HPC_ATTN_NO_KERNELS
extern "C" __global__ void __launch_bounds__(128)
KN(attn_simt_bwd_dot)(float *delta, const st_t *dctx, const st_t *ctx, int B, int L)
{
    attn_simt_bwd_dot_run(blockIdx.x, blockIdx.y, blockIdx.z, delta, dctx, ctx, B, L);
}
#endif

AT_RUN void attn_simt_bwd_dq_run(int at_bx, int at_by, int at_bz,
                                                     st_t *dq, int ldg,          // out, as q
                                                     const st_t *dctx,           // (B, L, HPC_HIDDEN)
                                                     const st_t *q, const st_t *k, const st_t *v, int ld,
                                                     const float *lse, const float *delta, const int *mask,
                                                     int B, int L, float p, u64 seed, u32 step, u32 salt)
{
    __shared__ float qs[AT_QB][AT_D];
    __shared__ float gs[AT_QB][AT_D];
    __shared__ float ks[AT_KT][AT_D + 1];
    __shared__ float vs[AT_KT][AT_D + 1];
    int b = at_bz, h = at_by, q0 = at_bx * AT_QB;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float dscale = dropout_scale(p), scale = at_scale();
    at_load_tile(&qs[0][0], AT_D, q, ld, b, h, q0, AT_QB, L, scale, threadIdx.x, 128);
    at_load_tile(&gs[0][0], AT_D, dctx, HPC_HIDDEN, b, h, q0, AT_QB, L, 1.0f, threadIdx.x, 128);
    float acc[AT_ROWS][AT_DPL], rl[AT_ROWS], rd[AT_ROWS];
#pragma unroll
    for (int i = 0; i < AT_ROWS; i++) {
        int row = min(q0 + warp * AT_ROWS + i, L - 1);
        rl[i] = lse[((i64)b * HPC_HEADS + h) * L + row];
        rd[i] = delta[((i64)b * HPC_HEADS + h) * L + row];
#pragma unroll
        for (int e = 0; e < AT_DPL; e++) acc[i][e] = 0.0f;
    }
    for (int t0 = 0; t0 < L; t0 += AT_KT) {
        __syncthreads();
        at_load_tile(&ks[0][0], AT_D + 1, k, ld, b, h, t0, AT_KT, L, 1.0f, threadIdx.x, 128);
        at_load_tile(&vs[0][0], AT_D + 1, v, ld, b, h, t0, AT_KT, L, 1.0f, threadIdx.x, 128);
        __syncthreads();
        int key = t0 + lane, nk = min(AT_KT, L - t0);
#pragma unroll
        for (int i = 0; i < AT_ROWS; i++) {
            int r = warp * AT_ROWS + i, row = q0 + r;
            if (row >= L) break;
            float s = 0.0f, dpv = 0.0f;
#pragma unroll 16
            for (int d = 0; d < AT_D; d++) {
                s += qs[r][d] * ks[lane][d];
                dpv += gs[r][d] * vs[lane][d];
            }
            float ds = 0.0f;
            if (at_visible(mask, b, row, key, L)) {
                float pe = expf(s - rl[i]);
                i64 idx = (((i64)b * HPC_HEADS + h) * L + row) * L + key;
                ds = pe * (dpv * at_keep(idx, p, dscale, seed, step, salt) - rd[i]);
            }
            for (int j = 0; j < nk; j++) {
                float dj = __shfl_sync(0xffffffffu, ds, j);
#pragma unroll
                for (int e = 0; e < AT_DPL; e++) {
                    int d = lane + 32 * e;
                    if (d < AT_D) acc[i][e] += dj * ks[j][d];
                }
            }
        }
    }
#pragma unroll
    for (int i = 0; i < AT_ROWS; i++) {
        int row = q0 + warp * AT_ROWS + i;
        if (row >= L) break;
#pragma unroll
        for (int e = 0; e < AT_DPL; e++) {
            int d = lane + 32 * e;
            if (d < AT_D) dq[((i64)b * L + row) * ldg + h * AT_D + d] = st_from(acc[i][e] * scale);
        }
    }
}
// Its tiles pass 48 KiB of static shared memory at D = 128: D <= 64 only.
#if !defined(HPC_ATTN_NO_KERNELS) && AT_D <= 64
extern "C" __global__ void __launch_bounds__(128)
KN(attn_simt_bwd_dq)(st_t *dq, int ldg,          // out, as q
                         const st_t *dctx,           // (B, L, HPC_HIDDEN)
                         const st_t *q, const st_t *k, const st_t *v, int ld,
                         const float *lse, const float *delta, const int *mask,
                         int B, int L, float p, u64 seed, u32 step, u32 salt)
{
    attn_simt_bwd_dq_run(blockIdx.x, blockIdx.y, blockIdx.z, dq, ldg, dctx, q, k, v, ld, lse, delta, mask, B, L, p, seed, step, salt);
}
#endif

// (ceil(L / 32), NH, B) x 32: lane j owns key 32 blockIdx.x + j.
AT_RUN void attn_simt_bwd_dkv_run(int at_bx, int at_by, int at_bz,
                                                      st_t *dk, st_t *dv, int ldg,   // out, as k and v
                                                      const st_t *dctx,
                                                      const st_t *q, const st_t *k, const st_t *v, int ld,
                                                      const float *lse, const float *delta, const int *mask,
                                                      int B, int L, float p, u64 seed, u32 step, u32 salt)
{
    __shared__ float ks[AT_KT][AT_D + 1];
    __shared__ float vs[AT_KT][AT_D + 1];
    __shared__ float qs[AT_QC][AT_D];
    __shared__ float gs[AT_QC][AT_D];
    __shared__ float cl[AT_QC], cd[AT_QC];
    int b = at_bz, h = at_by, k0 = at_bx * AT_KT, lane = threadIdx.x;
    int key = k0 + lane;
    float dscale = dropout_scale(p), scale = at_scale();
    at_load_tile(&ks[0][0], AT_D + 1, k, ld, b, h, k0, AT_KT, L, 1.0f, lane, 32);
    at_load_tile(&vs[0][0], AT_D + 1, v, ld, b, h, k0, AT_KT, L, 1.0f, lane, 32);
    float gk[AT_D], gv[AT_D];
#pragma unroll
    for (int d = 0; d < AT_D; d++) gk[d] = gv[d] = 0.0f;
    for (int c0 = 0; c0 < L; c0 += AT_QC) {
        __syncwarp();
        at_load_tile(&qs[0][0], AT_D, q, ld, b, h, c0, AT_QC, L, scale, lane, 32);
        at_load_tile(&gs[0][0], AT_D, dctx, HPC_HIDDEN, b, h, c0, AT_QC, L, 1.0f, lane, 32);
        if (lane < AT_QC && c0 + lane < L) {
            cl[lane] = lse[((i64)b * HPC_HEADS + h) * L + c0 + lane];
            cd[lane] = delta[((i64)b * HPC_HEADS + h) * L + c0 + lane];
        }
        __syncwarp();
        int nq = min(AT_QC, L - c0);
        for (int j = 0; j < nq; j++) {
            int row = c0 + j;
            if (!at_visible(mask, b, row, key, L)) continue;
            float s = 0.0f, dpv = 0.0f;
#pragma unroll
            for (int d = 0; d < AT_D; d++) {
                s += qs[j][d] * ks[lane][d];
                dpv += gs[j][d] * vs[lane][d];
            }
            float pe = expf(s - cl[j]);
            i64 idx = (((i64)b * HPC_HEADS + h) * L + row) * L + key;
            float kf = at_keep(idx, p, dscale, seed, step, salt), z = pe * kf;
            float ds = pe * (dpv * kf - cd[j]);
#pragma unroll
            for (int d = 0; d < AT_D; d++) {
                gv[d] += z * gs[j][d];
                gk[d] += ds * qs[j][d];
            }
        }
    }
    if (key >= L) return;
#pragma unroll
    for (int d = 0; d < AT_D; d++) {
        dk[((i64)b * L + key) * ldg + h * AT_D + d] = st_from(gk[d]);
        dv[((i64)b * L + key) * ldg + h * AT_D + d] = st_from(gv[d]);
    }
}
#ifndef HPC_ATTN_NO_KERNELS
extern "C" __global__ void __launch_bounds__(32)
KN(attn_simt_bwd_dkv)(st_t *dk, st_t *dv, int ldg,   // out, as k and v
                          const st_t *dctx,
                          const st_t *q, const st_t *k, const st_t *v, int ld,
                          const float *lse, const float *delta, const int *mask,
                          int B, int L, float p, u64 seed, u32 step, u32 salt)
{
    attn_simt_bwd_dkv_run(blockIdx.x, blockIdx.y, blockIdx.z, dk, dv, ldg, dctx, q, k, v, ld, lse, delta, mask, B, L, p, seed, step, salt);
}
#endif

#endif // HPC_HEAD_DIM <= 128
