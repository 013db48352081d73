// compiler/kernels/attention.cu — fused multi-head self-attention, forward
// and backward, without the (B, NH, L, L) score tensor and without the head
// split/merge copies.  Three families with one contract: attn_simt_* (fp32
// FMA on the CUDA cores, every dtype, the whole forward and backward),
// attn_mma_* (tensor cores, fp16/bf16 with D % 16 == 0: fwd, bwd_dq and
// bwd_dkv; the delta pre-pass is attn_simt_bwd_dot for all) and attn_mma2_*
// (v2: the same on the tensor cores with cp.async double buffering and
// ldmatrix fragments; see "second variant" below); and one more backward,
// attn_mma3_bwd (L <= 128, D <= 64: dQ, dK and dV in ONE pass over S, P and
// dP, delta computed inside; see "one-pass" below), with attn_head_bwd_dot
// (delta per (b, head) block).  The step calls one tensor-core family
// (HPC_ATTN_KERNELS, compiler/emit_ops_attention.c): by default (v3) v2's
// forward and attn_mma3_bwd, v2's dQ and dK/dV kernels for longer rows.
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

// == Tensor-core forward (16-bit storage, D a multiple of 16) ==
//
// attn_mma_fwd: the contract of attn_simt_fwd, with the two products on the
// tensor cores (mma.sync m16n8k16, f32 accumulation).  Grid
// (ceil(L / 64), NH, B) x 128: each warp owns 16 query rows, the block walks
// the keys in tiles of 64 staged in shared memory (K row-major, V
// transposed so both B operands are pairs of adjacent 16-bit values).
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
// g = lane / 4 and t = lane % 4:
//   A (16 x 16, row):  reg 0 (g, 2t..2t+1), reg 1 (g+8, 2t..), reg 2 (g, 2t+8..),
//                      reg 3 (g+8, 2t+8..); the lower column in the low half;
//   B (16 x 8, col):   reg 0 (k 2t..2t+1, n g), reg 1 (k 2t+8.., n g);
//   C (16 x 8, f32):   c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1).
// The score accumulators of two adjacent 8-key tiles are exactly the A
// fragment of the 16-key chunk of P V, so P never leaves the registers; it
// is rounded to the storage dtype for that product (the unfused path rounds
// its probabilities too).  Dropout: the 4 lanes of a quad share their rows;
// lane t draws the keep bits of 8-key tiles t and t + 4 of both rows (one
// Philox draw per 8 elements when L % 8 == 0, two otherwise) and the quad
// exchanges them with shuffles.
// Requirements: q, k, v, ctx 16-byte aligned, ld a multiple of 8.

#if HPC_DTYPE != 0 && HPC_HEAD_DIM % 16 == 0

#define AM_KT 64                 // keys per tile
#define AM_QW 16                 // query rows per warp
#define AM_QB (4 * AM_QW)        // query rows per block
#define AM_KS (AT_D + 8)         // shared row stride of K (16-bit elements)
#define AM_VS (AM_KT + 8)        // shared row stride of V^T

__device__ __forceinline__ void am_mma(float c[4], const u32 a[4], u32 b0, u32 b1)
{
#if HPC_DTYPE == 2
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two f32 values as one register of two 16-bit values, lo in the low half.
__device__ __forceinline__ u32 am_pack(float lo, float hi)
{
    u32 r;
#if HPC_DTYPE == 2
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

// Keep bits of flat elements f0 .. f0 + 7 (bit j = element f0 + j).
__device__ __forceinline__ u32 am_bits8(i64 f0, float p, u64 seed, u32 step, u32 salt)
{
    u64 g0 = (u64)f0 >> 3;
    u32 sh = (u32)(f0 & 7);
    u32 w = philox_mask8(seed, g0, step, salt, p) >> sh;
    if (sh) w |= philox_mask8(seed, g0 + 1, step, salt, p) << (8 - sh);
    return w & 0xFFu;
}

AT_RUN void attn_mma_fwd_run(int at_bx, int at_by, int at_bz,
                                                 st_t *ctx, float *lse, const st_t *q, const st_t *k, const st_t *v, int ld,
                                                 const int *mask, int B, int L, float p, u64 seed, u32 step, u32 salt)
{
    __shared__ __align__(16) unsigned short ks[AM_KT * AM_KS];
    __shared__ __align__(16) unsigned short vt[AT_D * AM_VS];
    int b = at_bz, h = at_by;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int r0 = at_bx * AM_QB + warp * AM_QW;
    int rows[2] = {r0 + g, r0 + g + 8};
    float scale = at_scale(), dscale = dropout_scale(p);
    i64 flat[2];
    for (int rr = 0; rr < 2; rr++) flat[rr] = (((i64)b * HPC_HEADS + h) * L + rows[rr]) * L;

    u32 qa[AT_D / 16][4];
#pragma unroll
    for (int kk = 0; kk < AT_D / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = rows[i & 1], col = kk * 16 + 2 * t + (i >= 2 ? 8 : 0);
            qa[kk][i] = row < L ? *reinterpret_cast<const u32 *>(q + ((i64)b * L + row) * ld + h * AT_D + col) : 0u;
        }
    float o[AT_D / 8][4];
#pragma unroll
    for (int nd = 0; nd < AT_D / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    float m[2] = {HPC_NEG_INF, HPC_NEG_INF}, l[2] = {0.0f, 0.0f};

    for (int t0 = 0; t0 < L; t0 += AM_KT) {
        __syncthreads();
        for (int i = threadIdx.x; i < AM_KT * (AT_D / 8); i += 128) {
            int kr = i / (AT_D / 8), c8 = (i % (AT_D / 8)) * 8, key = t0 + kr;
            uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
            if (key < L) {
                kv = *reinterpret_cast<const uint4 *>(k + ((i64)b * L + key) * ld + h * AT_D + c8);
                vv = *reinterpret_cast<const uint4 *>(v + ((i64)b * L + key) * ld + h * AT_D + c8);
            }
            *reinterpret_cast<uint4 *>(ks + kr * AM_KS + c8) = kv;
            const unsigned short *ve = reinterpret_cast<const unsigned short *>(&vv);
#pragma unroll
            for (int e = 0; e < 8; e++) vt[(c8 + e) * AM_VS + kr] = ve[e];
        }
        __syncthreads();

        float s[AM_KT / 8][4];
#pragma unroll
        for (int nt = 0; nt < AM_KT / 8; nt++) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < AT_D / 16; kk++) {
                const unsigned short *kp = ks + (nt * 8 + g) * AM_KS + kk * 16 + 2 * t;
                am_mma(s[nt], qa[kk], *reinterpret_cast<const u32 *>(kp), *reinterpret_cast<const u32 *>(kp + 8));
            }
        }
        float mx[2] = {HPC_NEG_INF, HPC_NEG_INF};
#pragma unroll
        for (int nt = 0; nt < AM_KT / 8; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int rr = c >> 1, key = t0 + nt * 8 + 2 * t + (c & 1);
                float x = at_visible(mask, b, rows[rr], key, L) ? s[nt][c] * scale : HPC_NEG_INF;
                s[nt][c] = x;
                mx[rr] = fmaxf(mx[rr], x);
            }
        float corr[2];
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 1));
            mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 2));
            float mn = fmaxf(m[rr], mx[rr]);
            corr[rr] = m[rr] == HPC_NEG_INF ? 0.0f : expf(m[rr] - mn);
            m[rr] = mn;
            l[rr] *= corr[rr];
        }
#pragma unroll
        for (int nd = 0; nd < AT_D / 8; nd++) {
            o[nd][0] *= corr[0];
            o[nd][1] *= corr[0];
            o[nd][2] *= corr[1];
            o[nd][3] *= corr[1];
        }
        // kb[rr][nt]: keep bits of this lane's keys 2t, 2t + 1 of 8-key tile nt.
        u32 kb[2][AM_KT / 8];
        if (p != 0.0f) {
            u32 mine[2][2];
#pragma unroll
            for (int rr = 0; rr < 2; rr++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    mine[rr][j] = am_bits8(flat[rr] + t0 + (t + 4 * j) * 8, p, seed, step, salt);
#pragma unroll
            for (int rr = 0; rr < 2; rr++)
#pragma unroll
                for (int nt = 0; nt < AM_KT / 8; nt++) {
                    u32 w = __shfl_sync(0xffffffffu, mine[rr][nt >> 2], (lane & ~3) | (nt & 3));
                    kb[rr][nt] = (w >> (2 * t)) & 3u;
                }
        } else {
#pragma unroll
            for (int nt = 0; nt < AM_KT / 8; nt++) kb[0][nt] = kb[1][nt] = 3u;
        }
#pragma unroll
        for (int nt = 0; nt < AM_KT / 8; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int rr = c >> 1;
                // A masked key (-inf) is 0 even when no key is visible yet;
                // a NaN score stays NaN (in l, so in the output).
                float pe = s[nt][c] == HPC_NEG_INF ? 0.0f : expf(s[nt][c] - m[rr]);
                l[rr] += pe;
                s[nt][c] = (kb[rr][nt] >> (c & 1)) & 1u ? pe * dscale : 0.0f;
            }
#pragma unroll
        for (int kc = 0; kc < AM_KT / 16; kc++) {
            u32 pa[4] = {am_pack(s[2 * kc][0], s[2 * kc][1]), am_pack(s[2 * kc][2], s[2 * kc][3]),
                         am_pack(s[2 * kc + 1][0], s[2 * kc + 1][1]), am_pack(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
            for (int nd = 0; nd < AT_D / 8; nd++) {
                const unsigned short *vp = vt + (nd * 8 + g) * AM_VS + kc * 16 + 2 * t;
                am_mma(o[nd], pa, *reinterpret_cast<const u32 *>(vp), *reinterpret_cast<const u32 *>(vp + 8));
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
        int row = rows[rr];
        if (row >= L) continue;
        float inv = l[rr] == 0.0f ? 0.0f : 1.0f / l[rr];
#pragma unroll
        for (int nd = 0; nd < AT_D / 8; nd++) {
            u32 w = am_pack(o[nd][2 * rr] * inv, o[nd][2 * rr + 1] * inv);
            *reinterpret_cast<u32 *>(ctx + ((i64)b * L + row) * HPC_HIDDEN + h * AT_D + nd * 8 + 2 * t) = w;
        }
        if (t == 0) lse[((i64)b * HPC_HEADS + h) * L + row] = l[rr] == 0.0f ? HPC_INF : m[rr] + logf(l[rr]);
    }
}
#ifndef HPC_ATTN_NO_KERNELS
extern "C" __global__ void __launch_bounds__(128)
KN(attn_mma_fwd)(st_t *ctx, float *lse, const st_t *q, const st_t *k, const st_t *v, int ld,
                     const int *mask, int B, int L, float p, u64 seed, u32 step, u32 salt)
{
    attn_mma_fwd_run(blockIdx.x, blockIdx.y, blockIdx.z, ctx, lse, q, k, v, ld, mask, B, L, p, seed, step, salt);
}
#endif

// attn_mma_bwd_dq: attn_simt_bwd_dq on the tensor cores, the layout of
// attn_mma_fwd: grid (ceil(L / 64), NH, B) x 128, a warp's 16 query rows
// against key tiles of 64.  S = Q K^T and dP = dO V^T take K and V
// row-major; dQ += dS K takes K transposed.  dS is rounded to the storage
// dtype for that product.
AT_RUN void attn_mma_bwd_dq_run(int at_bx, int at_by, int at_bz,
                                                    st_t *dq, int ldg, const st_t *dctx, const st_t *q, const st_t *k, const st_t *v, int ld,
                                                    const float *lse, const float *delta, const int *mask, int B, int L, float p, u64 seed,
                                                    u32 step, u32 salt)
{
    __shared__ __align__(16) unsigned short ks[AM_KT * AM_KS];
    __shared__ __align__(16) unsigned short vs[AM_KT * AM_KS];
    __shared__ __align__(16) unsigned short kt[AT_D * AM_VS];
    int b = at_bz, h = at_by;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int r0 = at_bx * AM_QB + warp * AM_QW;
    int rows[2] = {r0 + g, r0 + g + 8};
    float scale = at_scale(), dscale = dropout_scale(p);
    i64 flat[2];
    float rl[2], rd[2];
    for (int rr = 0; rr < 2; rr++) {
        flat[rr] = (((i64)b * HPC_HEADS + h) * L + rows[rr]) * L;
        int row = min(rows[rr], L - 1);
        rl[rr] = lse[((i64)b * HPC_HEADS + h) * L + row];
        rd[rr] = delta[((i64)b * HPC_HEADS + h) * L + row];
    }
    u32 qa[AT_D / 16][4], ga[AT_D / 16][4];
#pragma unroll
    for (int kk = 0; kk < AT_D / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = rows[i & 1], col = kk * 16 + 2 * t + (i >= 2 ? 8 : 0);
            bool in = row < L;
            qa[kk][i] = in ? *reinterpret_cast<const u32 *>(q + ((i64)b * L + row) * ld + h * AT_D + col) : 0u;
            ga[kk][i] = in ? *reinterpret_cast<const u32 *>(dctx + ((i64)b * L + row) * HPC_HIDDEN + h * AT_D + col) : 0u;
        }
    float acc[AT_D / 8][4];
#pragma unroll
    for (int nd = 0; nd < AT_D / 8; nd++) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;

    for (int t0 = 0; t0 < L; t0 += AM_KT) {
        __syncthreads();
        for (int i = threadIdx.x; i < AM_KT * (AT_D / 8); i += 128) {
            int kr = i / (AT_D / 8), c8 = (i % (AT_D / 8)) * 8, key = t0 + kr;
            uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
            if (key < L) {
                kv = *reinterpret_cast<const uint4 *>(k + ((i64)b * L + key) * ld + h * AT_D + c8);
                vv = *reinterpret_cast<const uint4 *>(v + ((i64)b * L + key) * ld + h * AT_D + c8);
            }
            *reinterpret_cast<uint4 *>(ks + kr * AM_KS + c8) = kv;
            *reinterpret_cast<uint4 *>(vs + kr * AM_KS + c8) = vv;
            const unsigned short *ke = reinterpret_cast<const unsigned short *>(&kv);
#pragma unroll
            for (int e = 0; e < 8; e++) kt[(c8 + e) * AM_VS + kr] = ke[e];
        }
        __syncthreads();

        float sc[AM_KT / 8][4], dp[AM_KT / 8][4];
#pragma unroll
        for (int nt = 0; nt < AM_KT / 8; nt++) {
#pragma unroll
            for (int c = 0; c < 4; c++) sc[nt][c] = dp[nt][c] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < AT_D / 16; kk++) {
                int off = (nt * 8 + g) * AM_KS + kk * 16 + 2 * t;
                am_mma(sc[nt], qa[kk], *reinterpret_cast<const u32 *>(ks + off), *reinterpret_cast<const u32 *>(ks + off + 8));
                am_mma(dp[nt], ga[kk], *reinterpret_cast<const u32 *>(vs + off), *reinterpret_cast<const u32 *>(vs + off + 8));
            }
        }
        u32 kb[2][AM_KT / 8];
        if (p != 0.0f) {
            u32 mine[2][2];
#pragma unroll
            for (int rr = 0; rr < 2; rr++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    mine[rr][j] = am_bits8(flat[rr] + t0 + (t + 4 * j) * 8, p, seed, step, salt);
#pragma unroll
            for (int rr = 0; rr < 2; rr++)
#pragma unroll
                for (int nt = 0; nt < AM_KT / 8; nt++) {
                    u32 w = __shfl_sync(0xffffffffu, mine[rr][nt >> 2], (lane & ~3) | (nt & 3));
                    kb[rr][nt] = (w >> (2 * t)) & 3u;
                }
        } else {
#pragma unroll
            for (int nt = 0; nt < AM_KT / 8; nt++) kb[0][nt] = kb[1][nt] = 3u;
        }
#pragma unroll
        for (int nt = 0; nt < AM_KT / 8; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int rr = c >> 1, key = t0 + nt * 8 + 2 * t + (c & 1);
                float ds = 0.0f;
                if (at_visible(mask, b, rows[rr], key, L)) {
                    float pe = expf(sc[nt][c] * scale - rl[rr]);
                    float kf = (kb[rr][nt] >> (c & 1)) & 1u ? dscale : 0.0f;
                    ds = pe * (dp[nt][c] * kf - rd[rr]);
                }
                sc[nt][c] = ds;
            }
#pragma unroll
        for (int kc = 0; kc < AM_KT / 16; kc++) {
            u32 pa[4] = {am_pack(sc[2 * kc][0], sc[2 * kc][1]), am_pack(sc[2 * kc][2], sc[2 * kc][3]),
                         am_pack(sc[2 * kc + 1][0], sc[2 * kc + 1][1]), am_pack(sc[2 * kc + 1][2], sc[2 * kc + 1][3])};
#pragma unroll
            for (int nd = 0; nd < AT_D / 8; nd++) {
                const unsigned short *kp = kt + (nd * 8 + g) * AM_VS + kc * 16 + 2 * t;
                am_mma(acc[nd], pa, *reinterpret_cast<const u32 *>(kp), *reinterpret_cast<const u32 *>(kp + 8));
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        int row = rows[rr];
        if (row >= L) continue;
#pragma unroll
        for (int nd = 0; nd < AT_D / 8; nd++) {
            u32 w = am_pack(acc[nd][2 * rr] * scale, acc[nd][2 * rr + 1] * scale);
            *reinterpret_cast<u32 *>(dq + ((i64)b * L + row) * ldg + h * AT_D + nd * 8 + 2 * t) = w;
        }
    }
}
// At D = 128 its tiles (ks, vs, kt: 52 KiB) pass the 48 KiB of static
// shared memory, so the kernel exists for D <= 64 only; attn_mma2_bwd_dq
// covers D = 128.
#if !defined(HPC_ATTN_NO_KERNELS) && AT_D <= 64
extern "C" __global__ void __launch_bounds__(128)
KN(attn_mma_bwd_dq)(st_t *dq, int ldg, const st_t *dctx, const st_t *q, const st_t *k, const st_t *v, int ld,
                        const float *lse, const float *delta, const int *mask, int B, int L, float p, u64 seed,
                        u32 step, u32 salt)
{
    attn_mma_bwd_dq_run(blockIdx.x, blockIdx.y, blockIdx.z, dq, ldg, dctx, q, k, v, ld, lse, delta, mask, B, L, p, seed, step, salt);
}
#endif

// attn_mma_bwd_dkv: attn_simt_bwd_dkv on the tensor cores.  Grid
// (ceil(L / 64), NH, B) x 128: each warp owns 16 keys (their K and V rows
// are A fragments in registers, their dK and dV rows accumulate in
// registers) and the block walks the queries in tiles of 32, staged in
// shared memory row-major (for S^T = K Q^T and dP^T = V dO^T) and
// transposed (for dV += Z^T dO and dK += dS^T Q, whose A operands are the
// S^T and dP^T accumulators, rounded to the storage dtype).  Dropout bits:
// one 8-key draw group per lane and 16 queries, exchanged by shuffles.
#define AM_QT 32                 // queries per tile (dkv)
#define AM_QTS (AM_QT + 8)       // shared row stride of Q^T, dO^T

AT_RUN void attn_mma_bwd_dkv_run(int at_bx, int at_by, int at_bz,
                                                     st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *q, const st_t *k, const st_t *v,
                                                     int ld, const float *lse, const float *delta, const int *mask, int B, int L, float p,
                                                     u64 seed, u32 step, u32 salt)
{
    __shared__ __align__(16) unsigned short qs[AM_QT * AM_KS];
    __shared__ __align__(16) unsigned short gs[AM_QT * AM_KS];
    __shared__ __align__(16) unsigned short qt[AT_D * AM_QTS];
    __shared__ __align__(16) unsigned short gt[AT_D * AM_QTS];
    __shared__ float tl[AM_QT], td[AM_QT];
    int b = at_bz, h = at_by;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int k0 = at_bx * AM_QB + warp * AM_QW;   // the warp's first key
    int keys[2] = {k0 + g, k0 + g + 8};
    float scale = at_scale(), dscale = dropout_scale(p);
    i64 bh = (i64)b * HPC_HEADS + h;

    u32 ka[AT_D / 16][4], va[AT_D / 16][4];
#pragma unroll
    for (int kk = 0; kk < AT_D / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int key = keys[i & 1], col = kk * 16 + 2 * t + (i >= 2 ? 8 : 0);
            bool in = key < L;
            ka[kk][i] = in ? *reinterpret_cast<const u32 *>(k + ((i64)b * L + key) * ld + h * AT_D + col) : 0u;
            va[kk][i] = in ? *reinterpret_cast<const u32 *>(v + ((i64)b * L + key) * ld + h * AT_D + col) : 0u;
        }
    float gk[AT_D / 8][4], gv[AT_D / 8][4];
#pragma unroll
    for (int nd = 0; nd < AT_D / 8; nd++)
#pragma unroll
        for (int c = 0; c < 4; c++) gk[nd][c] = gv[nd][c] = 0.0f;

    for (int c0 = 0; c0 < L; c0 += AM_QT) {
        __syncthreads();
        for (int i = threadIdx.x; i < AM_QT * (AT_D / 8); i += 128) {
            int qr = i / (AT_D / 8), c8 = (i % (AT_D / 8)) * 8, row = c0 + qr;
            uint4 qv = make_uint4(0u, 0u, 0u, 0u), gv4 = qv;
            if (row < L) {
                qv = *reinterpret_cast<const uint4 *>(q + ((i64)b * L + row) * ld + h * AT_D + c8);
                gv4 = *reinterpret_cast<const uint4 *>(dctx + ((i64)b * L + row) * HPC_HIDDEN + h * AT_D + c8);
            }
            *reinterpret_cast<uint4 *>(qs + qr * AM_KS + c8) = qv;
            *reinterpret_cast<uint4 *>(gs + qr * AM_KS + c8) = gv4;
            const unsigned short *qe = reinterpret_cast<const unsigned short *>(&qv);
            const unsigned short *ge = reinterpret_cast<const unsigned short *>(&gv4);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                qt[(c8 + e) * AM_QTS + qr] = qe[e];
                gt[(c8 + e) * AM_QTS + qr] = ge[e];
            }
        }
        if (threadIdx.x < AM_QT) {
            int row = c0 + threadIdx.x;
            tl[threadIdx.x] = row < L ? lse[bh * L + row] : HPC_INF;
            td[threadIdx.x] = row < L ? delta[bh * L + row] : 0.0f;
        }
        __syncthreads();

        // S^T (16 keys x 32 queries) and dP^T = V dO^T.
        float st[AM_QT / 8][4], dpt[AM_QT / 8][4];
#pragma unroll
        for (int nt = 0; nt < AM_QT / 8; nt++) {
#pragma unroll
            for (int c = 0; c < 4; c++) st[nt][c] = dpt[nt][c] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < AT_D / 16; kk++) {
                int off = (nt * 8 + g) * AM_KS + kk * 16 + 2 * t;
                am_mma(st[nt], ka[kk], *reinterpret_cast<const u32 *>(qs + off), *reinterpret_cast<const u32 *>(qs + off + 8));
                am_mma(dpt[nt], va[kk], *reinterpret_cast<const u32 *>(gs + off), *reinterpret_cast<const u32 *>(gs + off + 8));
            }
        }
        // Keep bits: lane draws the 8 keys k0 + 8 (lane & 1) .. + 7 of query
        // nt * 8 + ((lane & 15) >> 1), nt = 2 np + (lane >> 4).
        u32 mine[AM_QT / 16];
        if (p != 0.0f) {
#pragma unroll
            for (int np = 0; np < AM_QT / 16; np++) {
                int nt = 2 * np + (lane >> 4), row = c0 + nt * 8 + ((lane & 15) >> 1);
                mine[np] = am_bits8((bh * L + row) * L + k0 + 8 * (lane & 1), p, seed, step, salt);
            }
        }
#pragma unroll
        for (int nt = 0; nt < AM_QT / 8; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int qi = 2 * t + (c & 1), half = c >> 1, row = c0 + nt * 8 + qi, key = keys[half];
                u32 w = 0xFFu;
                if (p != 0.0f)
                    w = __shfl_sync(0xffffffffu, mine[nt >> 1], ((nt & 1) << 4) | (qi << 1) | half);
                float z = 0.0f, ds = 0.0f;
                if (row < L && at_visible(mask, b, row, key, L)) {
                    int r = nt * 8 + qi;
                    float pe = expf(st[nt][c] * scale - tl[r]);
                    float kf = (w >> g) & 1u ? dscale : 0.0f;
                    z = pe * kf;
                    ds = pe * (dpt[nt][c] * kf - td[r]);
                }
                st[nt][c] = z;
                dpt[nt][c] = ds;
            }
#pragma unroll
        for (int kc = 0; kc < AM_QT / 16; kc++) {
            u32 za[4] = {am_pack(st[2 * kc][0], st[2 * kc][1]), am_pack(st[2 * kc][2], st[2 * kc][3]),
                         am_pack(st[2 * kc + 1][0], st[2 * kc + 1][1]), am_pack(st[2 * kc + 1][2], st[2 * kc + 1][3])};
            u32 sa[4] = {am_pack(dpt[2 * kc][0], dpt[2 * kc][1]), am_pack(dpt[2 * kc][2], dpt[2 * kc][3]),
                         am_pack(dpt[2 * kc + 1][0], dpt[2 * kc + 1][1]),
                         am_pack(dpt[2 * kc + 1][2], dpt[2 * kc + 1][3])};
#pragma unroll
            for (int nd = 0; nd < AT_D / 8; nd++) {
                int off = (nd * 8 + g) * AM_QTS + kc * 16 + 2 * t;
                am_mma(gv[nd], za, *reinterpret_cast<const u32 *>(gt + off), *reinterpret_cast<const u32 *>(gt + off + 8));
                am_mma(gk[nd], sa, *reinterpret_cast<const u32 *>(qt + off), *reinterpret_cast<const u32 *>(qt + off + 8));
            }
        }
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int key = keys[half];
        if (key >= L) continue;
#pragma unroll
        for (int nd = 0; nd < AT_D / 8; nd++) {
            i64 at = ((i64)b * L + key) * ldg + h * AT_D + nd * 8 + 2 * t;
            *reinterpret_cast<u32 *>(dk + at) = am_pack(gk[nd][2 * half] * scale, gk[nd][2 * half + 1] * scale);
            *reinterpret_cast<u32 *>(dv + at) = am_pack(gv[nd][2 * half], gv[nd][2 * half + 1]);
        }
    }
}
#ifndef HPC_ATTN_NO_KERNELS
extern "C" __global__ void __launch_bounds__(128)
KN(attn_mma_bwd_dkv)(st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *q, const st_t *k, const st_t *v,
                         int ld, const float *lse, const float *delta, const int *mask, int B, int L, float p,
                         u64 seed, u32 step, u32 salt)
{
    attn_mma_bwd_dkv_run(blockIdx.x, blockIdx.y, blockIdx.z, dk, dv, ldg, dctx, q, k, v, ld, lse, delta, mask, B, L, p, seed, step, salt);
}
#endif


// == Tensor-core kernels, second variant (HPC_ATTN_KERNELS=v2) ==
//
// attn_mma2_fwd, attn_mma2_bwd_dq, attn_mma2_bwd_dkv: the contract, the
// grids and the work split of attn_mma_* above, and the same dropout draws
// (am_bits8), with the staging rewritten:
//  - every tile lands in shared memory ROW-MAJOR by cp.async (16 bytes a
//    thread, zero-filled past L), rows padded by 8 elements (16 bytes) so
//    the 8 row addresses of each ldmatrix phase fall in 8 different 16-byte
//    bank groups; no transposed copy is built with 2-byte stores any more;
//  - B fragments come from ldmatrix.x4 (one instruction feeds two mma):
//    without .trans where the product wants the stored rows as its n index
//    (K in Q K^T, V in dO V^T, Q and dO in K Q^T and V dO^T), with .trans
//    where it wants them as its k index (V in P V, K in dS K, dO in Z^T dO,
//    Q in dS^T Q);
//  - the next tile is fetched while the current one is computed (two
//    buffers; one for the forward and dQ at D = 128, where two would pass
//    48 KiB of static shared memory);
//  - the padding mask of a key tile is staged once per tile (not read from
//    global memory per score), and causal blocks skip the tiles they cannot
//    see.
// ldmatrix.x4 (PTX ISA, "warp-level matrix load"): lanes 8i .. 8i + 7 give
// the addresses of rows 0..7 of matrix i; register i of lane l then holds
// row l / 4, columns 2 (l % 4), +1 of matrix i, or with .trans rows
// 2 (l % 4), +1 of column l / 4, the lower index in the low half.  With
// g = l / 4, t = l % 4 that is the B fragment (k 2t..2t+1, n g) of
// mma.m16n8k16 when the matrix is (n rows x k columns) without .trans, or
// (k rows x n columns) with it.

#define A2_NBUF (AT_D <= 64 ? 2 : 1)   // K/V buffers of the forward and dQ
#define A2_LOG2E 1.4426950408889634f   // exponentials as 2^x (a2_exp2) of log2-scaled scores
#define A2_LN2 0.6931471805599453f
#define A2_QBUF 2                      // Q/dO buffers of dK/dV

__device__ __forceinline__ u32 a2_smem(const void *p) { return (u32)__cvta_generic_to_shared(p); }

// 2^x by the one MUFU instruction, subnormal results flushed to zero:
// exp2f's extra scaling for subnormal results (four more instructions an
// element) buys probabilities under 2^-126, which round to zero in the
// 16-bit products and sums anyway.  2^-inf = 0, NaN stays NaN.
__device__ __forceinline__ float a2_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// 16 bytes global -> shared, asynchronously; zeros when !in (src not read).
__device__ __forceinline__ void a2_cp16(void *dst, const void *src, bool in)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a2_smem(dst)), "l"(src), "r"(in ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void a2_cp4(void *dst, const void *src, bool in)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(a2_smem(dst)), "l"(src), "r"(in ? 4 : 0)
                 : "memory");
}

__device__ __forceinline__ void a2_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void a2_wait0(void) { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void a2_wait1(void) { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

__device__ __forceinline__ void a2_ldm4(u32 r[4], const unsigned short *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a2_smem(p)));
}

__device__ __forceinline__ void a2_ldm4t(u32 r[4], const unsigned short *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a2_smem(p)));
}

// Rows t0 .. t0 + rows - 1 of one head (row stride ld) into dst (row stride
// AM_KS), zeros past L; nthr threads (the block's first nthr, a multiple of
// the AT_D / 8 pieces of a row).  A thread keeps one column piece and steps
// over the rows, so the loop has a fixed trip count (rows and nthr are
// constants where it is inlined) and no division, and a piece's address is
// one 32-bit row offset from row t0 (|r ld| < 2^31 for any L this runs):
// about 5 instructions a piece, where the flat-index form spent about 20 on
// signed division and 64-bit arithmetic.  The base is row t0's, not the
// head's, so that a caller's loop over tiles cannot hoist it and keep it in
// registers (the one-pass backward spilled when it did).
__device__ __forceinline__ void a2_stage(unsigned short *dst, const st_t *src, int ld, int b, int h, int t0,
                                         int rows, int L, int nthr = 128)
{
    constexpr unsigned PIECES = AT_D / 8;   // 16-byte pieces a row
    unsigned tid = threadIdx.x;
    if (tid >= (unsigned)nthr) return;
    const int rstep = nthr / (int)PIECES;   // rows one pass of the threads covers
    int c8 = (int)(tid % PIECES) * 8, r0 = (int)(tid / PIECES);
    const st_t *row_t0 = src + ((i64)b * L + t0) * ld + h * AT_D + c8;
#pragma unroll
    for (int i = 0; i < (rows + rstep - 1) / rstep; i++) {
        int r = r0 + i * rstep;
        if (rows % rstep != 0 && r >= rows) break;
        bool in = t0 + r < L;
        a2_cp16(dst + r * AM_KS + c8, row_t0 + (in ? r : -t0) * ld, in);   // past L: row 0, not read
    }
}

// vis[j] != 0 iff key t0 + j (j < AM_KT) is below L and not padding.
__device__ __forceinline__ void a2_stage_mask(int *vis, const int *mask, int b, int t0, int L)
{
    int j = threadIdx.x, key = t0 + j;
    if (j >= AM_KT) return;
    if (mask) a2_cp4(vis + j, mask + (i64)b * L + (key < L ? key : 0), key < L);
    else vis[j] = key < L;
}

// Shared address of lane's row in an ldmatrix.x4 whose matrices are (row
// block r0 + 8 (i >> 1), column block c0 + 8 (i & 1)): the B fragments of
// two n tiles (nt, nt + 1) at one k16 step, stored (n x k).  Read with
// .trans from a tile stored (k x m) it is the A fragment of the (m x k)
// product operand at (m0 = c0, k0 = r0) (attn_mma3_bwd's dS).
__device__ __forceinline__ const unsigned short *a2_nk(const unsigned short *base, int r0, int c0, int lane,
                                                       int stride = AM_KS)
{
    int i = lane >> 3;
    return base + (r0 + 8 * (i >> 1) + (lane & 7)) * stride + c0 + 8 * (i & 1);
}

// The same for matrices (row block r0 + 8 (i & 1), column block c0 + 8 (i >> 1))
// read with .trans: B fragments of two n tiles at one k16 step, stored (k x n).
__device__ __forceinline__ const unsigned short *a2_kn(const unsigned short *base, int r0, int c0, int lane)
{
    int i = lane >> 3;
    return base + (r0 + 8 * (i & 1) + (lane & 7)) * AM_KS + c0 + 8 * (i >> 1);
}

// Key tiles a block of query rows q0 .. q0 + AM_QB - 1 can see.
__device__ __forceinline__ int a2_key_tiles(int q0, int L)
{
    int n = (L + AM_KT - 1) / AM_KT;
#if HPC_CAUSAL
    n = min(n, (q0 + AM_QB - 1) / AM_KT + 1);
#endif
    return n;
}

AT_RUN void attn_mma2_fwd_run(int at_bx, int at_by, int at_bz,
                              st_t *ctx, float *lse, const st_t *q, const st_t *k, const st_t *v, int ld,
                              const int *mask, int B, int L, float p, u64 seed, u32 step, u32 salt)
{
    __shared__ __align__(128) unsigned short ks[A2_NBUF][AM_KT * AM_KS];
    __shared__ __align__(128) unsigned short vs[A2_NBUF][AM_KT * AM_KS];
    __shared__ int vis[A2_NBUF][AM_KT];
    int b = at_bz, h = at_by;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int r0 = at_bx * AM_QB + warp * AM_QW;
    int rows[2] = {r0 + g, r0 + g + 8};
    float scale2 = at_scale() * A2_LOG2E, dscale = dropout_scale(p);
    i64 flat[2];
    for (int rr = 0; rr < 2; rr++) flat[rr] = (((i64)b * HPC_HEADS + h) * L + rows[rr]) * L;
    int ntiles = a2_key_tiles(at_bx * AM_QB, L);
    if (A2_NBUF == 2) {
        a2_stage(ks[0], k, ld, b, h, 0, AM_KT, L);
        a2_stage(vs[0], v, ld, b, h, 0, AM_KT, L);
        a2_stage_mask(vis[0], mask, b, 0, L);
        a2_commit();
    }

    u32 qa[AT_D / 16][4];
#pragma unroll
    for (int kk = 0; kk < AT_D / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = rows[i & 1], col = kk * 16 + 2 * t + (i >= 2 ? 8 : 0);
            qa[kk][i] = row < L ? *reinterpret_cast<const u32 *>(q + ((i64)b * L + row) * ld + h * AT_D + col) : 0u;
        }
    float o[AT_D / 8][4];
#pragma unroll
    for (int nd = 0; nd < AT_D / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    float m[2] = {HPC_NEG_INF, HPC_NEG_INF}, l[2] = {0.0f, 0.0f};

    for (int it = 0; it < ntiles; it++) {
        int t0 = it * AM_KT, buf = A2_NBUF == 2 ? (it & 1) : 0;
        if (A2_NBUF == 2) {
            if (it + 1 < ntiles) {
                a2_stage(ks[buf ^ 1], k, ld, b, h, t0 + AM_KT, AM_KT, L);
                a2_stage(vs[buf ^ 1], v, ld, b, h, t0 + AM_KT, AM_KT, L);
                a2_stage_mask(vis[buf ^ 1], mask, b, t0 + AM_KT, L);
            }
            a2_commit();
            a2_wait1();
        } else {
            a2_stage(ks[0], k, ld, b, h, t0, AM_KT, L);
            a2_stage(vs[0], v, ld, b, h, t0, AM_KT, L);
            a2_stage_mask(vis[0], mask, b, t0, L);
            a2_commit();
            a2_wait0();
        }
        // Thread j staged vis[buf][j] itself, so it may read it before the
        // barrier; the barrier's AND says whether every key of the tile is
        // visible to every row of the block (the common case: then the
        // scores need no per-element masking).
        bool see_mine = threadIdx.x >= AM_KT || vis[buf][threadIdx.x] != 0;
#if HPC_CAUSAL
        see_mine = see_mine && t0 + AM_KT - 1 <= at_bx * AM_QB;
#endif
        bool all_see = __syncthreads_and(see_mine) != 0;
        const unsigned short *kb = ks[buf], *vb = vs[buf];
        const int *vb_vis = vis[buf];

        float s[AM_KT / 8][4];
#pragma unroll
        for (int nt = 0; nt < AM_KT / 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < AT_D / 16; kk++)
#pragma unroll
            for (int np = 0; np < AM_KT / 16; np++) {
                u32 f[4];
                a2_ldm4(f, a2_nk(kb, 16 * np, 16 * kk, lane));
                am_mma(s[2 * np], qa[kk], f[0], f[1]);
                am_mma(s[2 * np + 1], qa[kk], f[2], f[3]);
            }
        // The row maxima in raw score units (scale2 > 0 keeps the order), so
        // each exponent is one FFMA: 2^(s scale2 - m scale2).
        float mx[2] = {HPC_NEG_INF, HPC_NEG_INF};
        if (all_see) {
#pragma unroll
            for (int nt = 0; nt < AM_KT / 8; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++) mx[c >> 1] = fmaxf(mx[c >> 1], s[nt][c]);
        } else {
#pragma unroll
            for (int nt = 0; nt < AM_KT / 8; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    int rr = c >> 1, j = nt * 8 + 2 * t + (c & 1);
                    bool see = vb_vis[j] != 0 && !(HPC_CAUSAL && t0 + j > rows[rr]);
                    float x = see ? s[nt][c] : HPC_NEG_INF;
                    s[nt][c] = x;
                    mx[rr] = fmaxf(mx[rr], x);
                }
        }
        float corr[2], mref[2];
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 1));
            mx[rr] = fmaxf(mx[rr], __shfl_xor_sync(0xffffffffu, mx[rr], 2));
            float mn = fmaxf(m[rr], mx[rr]);
            corr[rr] = m[rr] == HPC_NEG_INF ? 0.0f : a2_exp2((m[rr] - mn) * scale2);
            m[rr] = mn;
            // The exponent's reference (log2 units): 0 while every key so far
            // is masked, so a masked score (-inf) gives exactly 0 without a test.
            mref[rr] = mn == HPC_NEG_INF ? 0.0f : mn * scale2;
            l[rr] *= corr[rr];
        }
        if (it > 0) {   // before the first tile o is still 0
#pragma unroll
            for (int nd = 0; nd < AT_D / 8; nd++) {
                o[nd][0] *= corr[0];
                o[nd][1] *= corr[0];
                o[nd][2] *= corr[1];
                o[nd][3] *= corr[1];
            }
        }
        u32 kbits[2][AM_KT / 8];
        if (p != 0.0f) {
            u32 mine[2][2];
#pragma unroll
            for (int rr = 0; rr < 2; rr++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    mine[rr][j] = am_bits8(flat[rr] + t0 + (t + 4 * j) * 8, p, seed, step, salt);
#pragma unroll
            for (int rr = 0; rr < 2; rr++)
#pragma unroll
                for (int nt = 0; nt < AM_KT / 8; nt++) {
                    u32 w = __shfl_sync(0xffffffffu, mine[rr][nt >> 2], (lane & ~3) | (nt & 3));
                    kbits[rr][nt] = (w >> (2 * t)) & 3u;
                }
        } else {
#pragma unroll
            for (int nt = 0; nt < AM_KT / 8; nt++) kbits[0][nt] = kbits[1][nt] = 3u;
        }
#pragma unroll
        for (int nt = 0; nt < AM_KT / 8; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int rr = c >> 1;
                float pe = a2_exp2(fmaf(s[nt][c], scale2, -mref[rr]));
                l[rr] += pe;
                s[nt][c] = (kbits[rr][nt] >> (c & 1)) & 1u ? pe : 0.0f;   // 1/(1-p) with 1/l at the end
            }
#pragma unroll
        for (int kc = 0; kc < AM_KT / 16; kc++) {
            u32 pa[4] = {am_pack(s[2 * kc][0], s[2 * kc][1]), am_pack(s[2 * kc][2], s[2 * kc][3]),
                         am_pack(s[2 * kc + 1][0], s[2 * kc + 1][1]), am_pack(s[2 * kc + 1][2], s[2 * kc + 1][3])};
#pragma unroll
            for (int np = 0; np < AT_D / 16; np++) {
                u32 f[4];
                a2_ldm4t(f, a2_kn(vb, 16 * kc, 16 * np, lane));
                am_mma(o[2 * np], pa, f[0], f[1]);
                am_mma(o[2 * np + 1], pa, f[2], f[3]);
            }
        }
        __syncthreads();   // buffer buf is refilled by the next iteration's prefetch
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
        int row = rows[rr];
        if (row >= L) continue;
        float inv = l[rr] == 0.0f ? 0.0f : dscale / l[rr];
#pragma unroll
        for (int nd = 0; nd < AT_D / 8; nd++) {
            u32 w = am_pack(o[nd][2 * rr] * inv, o[nd][2 * rr + 1] * inv);
            *reinterpret_cast<u32 *>(ctx + ((i64)b * L + row) * HPC_HIDDEN + h * AT_D + nd * 8 + 2 * t) = w;
        }
        if (t == 0)
            lse[((i64)b * HPC_HEADS + h) * L + row] =
                l[rr] == 0.0f ? HPC_INF : (m[rr] * scale2 + log2f(l[rr])) * A2_LN2;
    }
}
#ifndef HPC_ATTN_NO_KERNELS
extern "C" __global__ void __launch_bounds__(128)
KN(attn_mma2_fwd)(st_t *ctx, float *lse, const st_t *q, const st_t *k, const st_t *v, int ld,
                  const int *mask, int B, int L, float p, u64 seed, u32 step, u32 salt)
{
    attn_mma2_fwd_run(blockIdx.x, blockIdx.y, blockIdx.z, ctx, lse, q, k, v, ld, mask, B, L, p, seed, step, salt);
}
#endif

// attn_mma2_bwd_dq: attn_mma_bwd_dq with the staging above; S = Q K^T and
// dP = dO V^T read K and V without .trans, dQ += dS K reads K with .trans
// (the copy kt of the first variant is gone).
AT_RUN void attn_mma2_bwd_dq_run(int at_bx, int at_by, int at_bz,
                                 st_t *dq, int ldg, const st_t *dctx, const st_t *q, const st_t *k, const st_t *v, int ld,
                                 const float *lse, const float *delta, const int *mask, int B, int L, float p, u64 seed,
                                 u32 step, u32 salt)
{
    __shared__ __align__(128) unsigned short ks[A2_NBUF][AM_KT * AM_KS];
    __shared__ __align__(128) unsigned short vs[A2_NBUF][AM_KT * AM_KS];
    __shared__ int vis[A2_NBUF][AM_KT];
    int b = at_bz, h = at_by;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int r0 = at_bx * AM_QB + warp * AM_QW;
    int rows[2] = {r0 + g, r0 + g + 8};
    float scale = at_scale(), scale2 = scale * A2_LOG2E, dscale = dropout_scale(p);
    int ntiles = a2_key_tiles(at_bx * AM_QB, L);
    if (A2_NBUF == 2) {
        a2_stage(ks[0], k, ld, b, h, 0, AM_KT, L);
        a2_stage(vs[0], v, ld, b, h, 0, AM_KT, L);
        a2_stage_mask(vis[0], mask, b, 0, L);
        a2_commit();
    }
    i64 flat[2];
    float rl[2], rd[2];
    for (int rr = 0; rr < 2; rr++) {
        flat[rr] = (((i64)b * HPC_HEADS + h) * L + rows[rr]) * L;
        int row = min(rows[rr], L - 1);
        rl[rr] = lse[((i64)b * HPC_HEADS + h) * L + row] * A2_LOG2E;   // +inf stays +inf
        rd[rr] = delta[((i64)b * HPC_HEADS + h) * L + row];
    }
    u32 qa[AT_D / 16][4], ga[AT_D / 16][4];
#pragma unroll
    for (int kk = 0; kk < AT_D / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = rows[i & 1], col = kk * 16 + 2 * t + (i >= 2 ? 8 : 0);
            bool in = row < L;
            qa[kk][i] = in ? *reinterpret_cast<const u32 *>(q + ((i64)b * L + row) * ld + h * AT_D + col) : 0u;
            ga[kk][i] = in ? *reinterpret_cast<const u32 *>(dctx + ((i64)b * L + row) * HPC_HIDDEN + h * AT_D + col) : 0u;
        }
    float acc[AT_D / 8][4];
#pragma unroll
    for (int nd = 0; nd < AT_D / 8; nd++) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
        int t0 = it * AM_KT, buf = A2_NBUF == 2 ? (it & 1) : 0;
        if (A2_NBUF == 2) {
            if (it + 1 < ntiles) {
                a2_stage(ks[buf ^ 1], k, ld, b, h, t0 + AM_KT, AM_KT, L);
                a2_stage(vs[buf ^ 1], v, ld, b, h, t0 + AM_KT, AM_KT, L);
                a2_stage_mask(vis[buf ^ 1], mask, b, t0 + AM_KT, L);
            }
            a2_commit();
            a2_wait1();
        } else {
            a2_stage(ks[0], k, ld, b, h, t0, AM_KT, L);
            a2_stage(vs[0], v, ld, b, h, t0, AM_KT, L);
            a2_stage_mask(vis[0], mask, b, t0, L);
            a2_commit();
            a2_wait0();
        }
        __syncthreads();
        const unsigned short *kb = ks[buf], *vb = vs[buf];
        const int *vb_vis = vis[buf];

        float sc[AM_KT / 8][4], dp[AM_KT / 8][4];
#pragma unroll
        for (int nt = 0; nt < AM_KT / 8; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) sc[nt][c] = dp[nt][c] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < AT_D / 16; kk++)
#pragma unroll
            for (int np = 0; np < AM_KT / 16; np++) {
                u32 f[4], e[4];
                a2_ldm4(f, a2_nk(kb, 16 * np, 16 * kk, lane));
                a2_ldm4(e, a2_nk(vb, 16 * np, 16 * kk, lane));
                am_mma(sc[2 * np], qa[kk], f[0], f[1]);
                am_mma(sc[2 * np + 1], qa[kk], f[2], f[3]);
                am_mma(dp[2 * np], ga[kk], e[0], e[1]);
                am_mma(dp[2 * np + 1], ga[kk], e[2], e[3]);
            }
        u32 kbits[2][AM_KT / 8];
        if (p != 0.0f) {
            u32 mine[2][2];
#pragma unroll
            for (int rr = 0; rr < 2; rr++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    mine[rr][j] = am_bits8(flat[rr] + t0 + (t + 4 * j) * 8, p, seed, step, salt);
#pragma unroll
            for (int rr = 0; rr < 2; rr++)
#pragma unroll
                for (int nt = 0; nt < AM_KT / 8; nt++) {
                    u32 w = __shfl_sync(0xffffffffu, mine[rr][nt >> 2], (lane & ~3) | (nt & 3));
                    kbits[rr][nt] = (w >> (2 * t)) & 3u;
                }
        } else {
#pragma unroll
            for (int nt = 0; nt < AM_KT / 8; nt++) kbits[0][nt] = kbits[1][nt] = 3u;
        }
#pragma unroll
        for (int nt = 0; nt < AM_KT / 8; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int rr = c >> 1, j = nt * 8 + 2 * t + (c & 1);
                float ds = 0.0f;
                if (vb_vis[j] != 0 && !(HPC_CAUSAL && t0 + j > rows[rr])) {
                    float pe = a2_exp2(sc[nt][c] * scale2 - rl[rr]);
                    float kf = (kbits[rr][nt] >> (c & 1)) & 1u ? dscale : 0.0f;
                    ds = pe * (dp[nt][c] * kf - rd[rr]);
                }
                sc[nt][c] = ds;
            }
#pragma unroll
        for (int kc = 0; kc < AM_KT / 16; kc++) {
            u32 pa[4] = {am_pack(sc[2 * kc][0], sc[2 * kc][1]), am_pack(sc[2 * kc][2], sc[2 * kc][3]),
                         am_pack(sc[2 * kc + 1][0], sc[2 * kc + 1][1]), am_pack(sc[2 * kc + 1][2], sc[2 * kc + 1][3])};
#pragma unroll
            for (int np = 0; np < AT_D / 16; np++) {
                u32 f[4];
                a2_ldm4t(f, a2_kn(kb, 16 * kc, 16 * np, lane));
                am_mma(acc[2 * np], pa, f[0], f[1]);
                am_mma(acc[2 * np + 1], pa, f[2], f[3]);
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        int row = rows[rr];
        if (row >= L) continue;
#pragma unroll
        for (int nd = 0; nd < AT_D / 8; nd++) {
            u32 w = am_pack(acc[nd][2 * rr] * scale, acc[nd][2 * rr + 1] * scale);
            *reinterpret_cast<u32 *>(dq + ((i64)b * L + row) * ldg + h * AT_D + nd * 8 + 2 * t) = w;
        }
    }
}
#ifndef HPC_ATTN_NO_KERNELS
extern "C" __global__ void __launch_bounds__(128)
KN(attn_mma2_bwd_dq)(st_t *dq, int ldg, const st_t *dctx, const st_t *q, const st_t *k, const st_t *v, int ld,
                     const float *lse, const float *delta, const int *mask, int B, int L, float p, u64 seed,
                     u32 step, u32 salt)
{
    attn_mma2_bwd_dq_run(blockIdx.x, blockIdx.y, blockIdx.z, dq, ldg, dctx, q, k, v, ld, lse, delta, mask, B, L, p, seed, step, salt);
}
#endif

// attn_mma2_bwd_dkv: attn_mma_bwd_dkv with the staging above.  The query
// tiles (Q and dO row-major, lse and delta) are double-buffered; S^T = K Q^T
// and dP^T = V dO^T read Q and dO without .trans, dV += Z^T dO and
// dK += dS^T Q read them with .trans (the copies qt and gt are gone).  The
// visibility of the warp's 16 keys is read once; causal blocks start at the
// first query tile that can see their keys.
AT_RUN void attn_mma2_bwd_dkv_run(int at_bx, int at_by, int at_bz,
                                  st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *q, const st_t *k, const st_t *v,
                                  int ld, const float *lse, const float *delta, const int *mask, int B, int L, float p,
                                  u64 seed, u32 step, u32 salt)
{
    __shared__ __align__(128) unsigned short qs[A2_QBUF][AM_QT * AM_KS];
    __shared__ __align__(128) unsigned short gs[A2_QBUF][AM_QT * AM_KS];
    __shared__ float tl[A2_QBUF][AM_QT], td[A2_QBUF][AM_QT];
    int b = at_bz, h = at_by;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int k0 = at_bx * AM_QB + warp * AM_QW;   // the warp's first key
    int keys[2] = {k0 + g, k0 + g + 8};
    float scale = at_scale(), scale2 = scale * A2_LOG2E, dscale = dropout_scale(p);
    i64 bh = (i64)b * HPC_HEADS + h;
    int c_first = 0, c_end = L;
#if HPC_CAUSAL
    c_first = (at_bx * AM_QB / AM_QT) * AM_QT;   // queries below the block's first key see none of it
#endif
    // One query tile (rows c0 ..) into buffer qb: Q, dO, lse, delta.
#define A2_STAGE_Q(qb, c0)                                                                            \
    do {                                                                                              \
        a2_stage(qs[qb], q, ld, b, h, (c0), AM_QT, L);                                                \
        a2_stage(gs[qb], dctx, HPC_HIDDEN, b, h, (c0), AM_QT, L);                                     \
        if (threadIdx.x < AM_QT) {                                                                    \
            int row_ = (c0) + threadIdx.x;                                                            \
            bool in_ = row_ < L;                                                                      \
            a2_cp4(&tl[qb][threadIdx.x], lse + bh * L + (in_ ? row_ : 0), in_);                       \
            a2_cp4(&td[qb][threadIdx.x], delta + bh * L + (in_ ? row_ : 0), in_);                     \
        }                                                                                             \
    } while (0)
    if (c_first < c_end) A2_STAGE_Q(0, c_first);
    a2_commit();

    bool kvis[2];
    u32 ka[AT_D / 16][4], va[AT_D / 16][4];
#pragma unroll
    for (int half = 0; half < 2; half++)
        kvis[half] = keys[half] < L && (!mask || mask[(i64)b * L + keys[half]] != 0);
#pragma unroll
    for (int kk = 0; kk < AT_D / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int key = keys[i & 1], col = kk * 16 + 2 * t + (i >= 2 ? 8 : 0);
            bool in = key < L;
            ka[kk][i] = in ? *reinterpret_cast<const u32 *>(k + ((i64)b * L + key) * ld + h * AT_D + col) : 0u;
            va[kk][i] = in ? *reinterpret_cast<const u32 *>(v + ((i64)b * L + key) * ld + h * AT_D + col) : 0u;
        }
    float gk[AT_D / 8][4], gv[AT_D / 8][4];
#pragma unroll
    for (int nd = 0; nd < AT_D / 8; nd++)
#pragma unroll
        for (int c = 0; c < 4; c++) gk[nd][c] = gv[nd][c] = 0.0f;

    for (int c0 = c_first, it = 0; c0 < c_end; c0 += AM_QT, it++) {
        int buf = it & 1;
        if (c0 + AM_QT < c_end) A2_STAGE_Q(buf ^ 1, c0 + AM_QT);
        a2_commit();
        a2_wait1();
        __syncthreads();
        const unsigned short *qb = qs[buf], *gb = gs[buf];
        const float *tlb = tl[buf], *tdb = td[buf];

        // S^T (16 keys x 32 queries) and dP^T = V dO^T.
        float st[AM_QT / 8][4], dpt[AM_QT / 8][4];
#pragma unroll
        for (int nt = 0; nt < AM_QT / 8; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) st[nt][c] = dpt[nt][c] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < AT_D / 16; kk++)
#pragma unroll
            for (int np = 0; np < AM_QT / 16; np++) {
                u32 f[4], e[4];
                a2_ldm4(f, a2_nk(qb, 16 * np, 16 * kk, lane));
                a2_ldm4(e, a2_nk(gb, 16 * np, 16 * kk, lane));
                am_mma(st[2 * np], ka[kk], f[0], f[1]);
                am_mma(st[2 * np + 1], ka[kk], f[2], f[3]);
                am_mma(dpt[2 * np], va[kk], e[0], e[1]);
                am_mma(dpt[2 * np + 1], va[kk], e[2], e[3]);
            }
        // Keep bits: lane draws the 8 keys k0 + 8 (lane & 1) .. + 7 of query
        // nt * 8 + ((lane & 15) >> 1), nt = 2 np + (lane >> 4).
        u32 mine[AM_QT / 16];
        if (p != 0.0f) {
#pragma unroll
            for (int np = 0; np < AM_QT / 16; np++) {
                int nt = 2 * np + (lane >> 4), row = c0 + nt * 8 + ((lane & 15) >> 1);
                mine[np] = am_bits8((bh * L + row) * L + k0 + 8 * (lane & 1), p, seed, step, salt);
            }
        }
#pragma unroll
        for (int nt = 0; nt < AM_QT / 8; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int qi = 2 * t + (c & 1), half = c >> 1, row = c0 + nt * 8 + qi;
                u32 w = 0xFFu;
                if (p != 0.0f)
                    w = __shfl_sync(0xffffffffu, mine[nt >> 1], ((nt & 1) << 4) | (qi << 1) | half);
                float z = 0.0f, ds = 0.0f;
                if (row < L && kvis[half] && !(HPC_CAUSAL && keys[half] > row)) {
                    int r = nt * 8 + qi;
                    float pe = a2_exp2(st[nt][c] * scale2 - tlb[r] * A2_LOG2E);
                    float kf = (w >> g) & 1u ? dscale : 0.0f;
                    z = pe * kf;
                    ds = pe * (dpt[nt][c] * kf - tdb[r]);
                }
                st[nt][c] = z;
                dpt[nt][c] = ds;
            }
#pragma unroll
        for (int kc = 0; kc < AM_QT / 16; kc++) {
            u32 za[4] = {am_pack(st[2 * kc][0], st[2 * kc][1]), am_pack(st[2 * kc][2], st[2 * kc][3]),
                         am_pack(st[2 * kc + 1][0], st[2 * kc + 1][1]), am_pack(st[2 * kc + 1][2], st[2 * kc + 1][3])};
            u32 sa[4] = {am_pack(dpt[2 * kc][0], dpt[2 * kc][1]), am_pack(dpt[2 * kc][2], dpt[2 * kc][3]),
                         am_pack(dpt[2 * kc + 1][0], dpt[2 * kc + 1][1]),
                         am_pack(dpt[2 * kc + 1][2], dpt[2 * kc + 1][3])};
#pragma unroll
            for (int np = 0; np < AT_D / 16; np++) {
                u32 f[4], e[4];
                a2_ldm4t(e, a2_kn(gb, 16 * kc, 16 * np, lane));
                a2_ldm4t(f, a2_kn(qb, 16 * kc, 16 * np, lane));
                am_mma(gv[2 * np], za, e[0], e[1]);
                am_mma(gv[2 * np + 1], za, e[2], e[3]);
                am_mma(gk[2 * np], sa, f[0], f[1]);
                am_mma(gk[2 * np + 1], sa, f[2], f[3]);
            }
        }
        __syncthreads();   // buffer buf is refilled by the next iteration's prefetch
    }
#undef A2_STAGE_Q
    a2_wait0();
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int key = keys[half];
        if (key >= L) continue;
#pragma unroll
        for (int nd = 0; nd < AT_D / 8; nd++) {
            i64 at = ((i64)b * L + key) * ldg + h * AT_D + nd * 8 + 2 * t;
            *reinterpret_cast<u32 *>(dk + at) = am_pack(gk[nd][2 * half] * scale, gk[nd][2 * half + 1] * scale);
            *reinterpret_cast<u32 *>(dv + at) = am_pack(gv[nd][2 * half], gv[nd][2 * half + 1]);
        }
    }
}
#ifndef HPC_ATTN_NO_KERNELS
extern "C" __global__ void __launch_bounds__(128)
KN(attn_mma2_bwd_dkv)(st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *q, const st_t *k, const st_t *v,
                      int ld, const float *lse, const float *delta, const int *mask, int B, int L, float p,
                      u64 seed, u32 step, u32 salt)
{
    attn_mma2_bwd_dkv_run(blockIdx.x, blockIdx.y, blockIdx.z, dk, dv, ldg, dctx, q, k, v, ld, lse, delta, mask, B, L, p, seed, step, salt);
}
#endif

// == One-pass tensor-core backward (attn_mma3_bwd, the step's default) ==
//
// attn_mma3_bwd: dQ, dK and dV of one (b, head) in ONE pass over S, P and
// dP (the v2 backward computes them twice, once for dQ and once for dK/dV).
// Grid (1, NH, B) x 256, for L <= A3_KEYS (128) and D <= 64 (its tiles fill
// the 48 KiB of static shared memory at D = 64); the step keeps
// attn_mma2_bwd_dq/dkv for longer rows and larger heads.  Inputs as the
// other families: lse from the forward, delta = rowsum(dO * O) from
// attn_simt_bwd_dot.
//  - Warp w owns keys 16 w .. 16 w + 15 (warps at or past L only help with
//    dQ): their K and V rows are A fragments in registers and their dK, dV
//    rows accumulate in registers, as in attn_mma2_bwd_dkv, whose per-tile
//    work (S^T = K Q^T, dP^T = V dO^T, the same dropout draws, dV += Z^T dO,
//    dK += dS^T Q) is repeated here unchanged.
//  - The block walks the query tiles of AM_QT rows (Q, dO, lse, delta by
//    cp.async, double-buffered).  Each warp also stores its dS^T (16 keys x
//    AM_QT queries, rounded to the storage dtype as for dK) into the shared
//    tile dss (keys x queries); after a barrier the 8 warps share the tile's
//    dQ = dS K (AM_QT x D): warp w takes query rows 16 (w & 1) .. and
//    columns 16 (w >> 1) .., A = dS from dss by ldmatrix.trans (a2_nk),
//    B = K from the staged K rows by ldmatrix.trans (a2_kn), summing over
//    every key, and writes its piece of dQ directly: no atomics, no
//    workspace.  At D = 32 warps 4..7 have no dQ piece.
//  - K of all keys is staged once, with the first query tile.
// Two barriers a tile: after the tile lands (which also orders the last
// tile's dQ reads of dss before this tile's stores), and after dss is full
// (which also orders this tile's reads of buffer buf before the next
// prefetch overwrites it).

#define A3_WARPS 8
#define A3_KEYS (A3_WARPS * AM_QW)              // keys one block owns: the largest L it takes
#define A3_DQ_UNITS (2 * (AT_D / 16))          // (16 query x 16 column) pieces of a tile's dQ
#define A3_DSS AM_QTS                          // shared row stride of dS^T

// delta = rowsum(dO * O), for head h of batch row b, in 16-byte pieces:
// piece i is elements 8 (i % (AT_D / 8)) .. + 7 of row i / (AT_D / 8), and
// AT_D / 8 adjacent lanes hold a row.  a3_load_piece loads piece i of dO
// and O (zeros past L); a3_piece_row_sum multiplies a lane's piece and sums
// over the row's lanes, returning the row's sum in every one of them.
// Whole warps only.
__device__ __forceinline__ void a3_load_piece(uint4 &gw, uint4 &yw, const st_t *dctx, const st_t *ctx, int b, int h,
                                              int i, int L)
{
    int row = i / (AT_D / 8), c8 = (i % (AT_D / 8)) * 8;
    gw = yw = make_uint4(0u, 0u, 0u, 0u);
    if (row < L) {
        i64 at = ((i64)b * L + row) * HPC_HIDDEN + h * AT_D + c8;
        gw = *reinterpret_cast<const uint4 *>(dctx + at);
        yw = *reinterpret_cast<const uint4 *>(ctx + at);
    }
}

__device__ __forceinline__ float a3_piece_row_sum(uint4 gw, uint4 yw)
{
    const st_t *ge = reinterpret_cast<const st_t *>(&gw), *ye = reinterpret_cast<const st_t *>(&yw);
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; e++) s += ld_f(ge[e]) * ld_f(ye[e]);
#pragma unroll
    for (int o = 1; o < AT_D / 8; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    return s;
}

// delta[row] for rows 0 .. A3_KEYS - 1 (0 past L), by the whole block of
// 32 x A3_WARPS threads: every thread's pieces are loaded before the first
// sum, so their latencies overlap instead of adding up.
__device__ __forceinline__ void a3_delta_rows(float *dl, const st_t *dctx, const st_t *ctx, int b, int h, int L)
{
    constexpr int PER = A3_KEYS * (AT_D / 8) / (32 * A3_WARPS);   // pieces a thread
    uint4 gw[PER], yw[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) a3_load_piece(gw[k], yw[k], dctx, ctx, b, h, k * 32 * A3_WARPS + threadIdx.x, L);
#pragma unroll
    for (int k = 0; k < PER; k++) {
        float s = a3_piece_row_sum(gw[k], yw[k]);
        int i = k * 32 * A3_WARPS + threadIdx.x;
        if (i % (AT_D / 8) == 0) dl[i / (AT_D / 8)] = s;
    }
}

// attn_head_bwd_dot: attn_simt_bwd_dot for the rows of one (b, head), grid
// (1, NH, B) x nthr: the step's one-pass phase runs it instead of
// attn_mma3_bwd where L > A3_KEYS, for v2's dQ and dK/dV kernels.
AT_RUN void attn_head_bwd_dot_run(int at_bx, int at_by, int at_bz, float *delta, const st_t *dctx, const st_t *ctx,
                                  int B, int L, int nthr)
{
    int b = at_bz, h = at_by;
    i64 bh = (i64)b * HPC_HEADS + h;
    for (int i0 = 0; i0 < L * (AT_D / 8); i0 += nthr) {   // the same trip count in every thread
        int i = i0 + threadIdx.x, row = i / (AT_D / 8);
        uint4 gw, yw;
        a3_load_piece(gw, yw, dctx, ctx, b, h, i, L);
        float s = a3_piece_row_sum(gw, yw);
        if (i % (AT_D / 8) == 0 && row < L) delta[bh * L + row] = s;
    }
}

#ifndef HPC_ATTN_NO_KERNELS
extern "C" __global__ void __launch_bounds__(256)
KN(attn_head_bwd_dot)(float *delta, const st_t *dctx, const st_t *ctx, int B, int L)
{
    attn_head_bwd_dot_run(blockIdx.x, blockIdx.y, blockIdx.z, delta, dctx, ctx, B, L, 256);
}
#endif

#if AT_D <= 64
AT_RUN void attn_mma3_bwd_run(int at_bx, int at_by, int at_bz,
                              st_t *dq, st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *ctx, const st_t *q,
                              const st_t *k, const st_t *v, int ld, const float *lse, const int *mask, int B, int L,
                              float p, u64 seed, u32 step, u32 salt)
{
    __shared__ __align__(128) unsigned short ks[A3_KEYS * AM_KS];            // K of every key
    __shared__ __align__(128) unsigned short qs[A2_QBUF][AM_QT * AM_KS];
    __shared__ __align__(128) unsigned short gs[A2_QBUF][AM_QT * AM_KS];
    __shared__ __align__(128) unsigned short dss[A3_KEYS * A3_DSS];          // dS^T of the tile
    __shared__ float tl[A2_QBUF][AM_QT], dl[A3_KEYS];                        // lse of the tile, delta of every row
    (void)at_bx;
    int b = at_bz, h = at_by;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int k0 = warp * AM_QW;   // the warp's first key
    int keys[2] = {k0 + g, k0 + g + 8};
    bool owns = k0 < L;      // warp-uniform: the warp has keys below L
    int nkc = (L + 15) / 16; // 16-key chunks of dQ's sum
    float scale = at_scale(), scale2 = scale * A2_LOG2E, dscale = dropout_scale(p);
    i64 bh = (i64)b * HPC_HEADS + h;
#define A3_STAGE_Q(qb, c0)                                                                            \
    do {                                                                                              \
        a2_stage(qs[qb], q, ld, b, h, (c0), AM_QT, L, 32 * A3_WARPS);                                 \
        a2_stage(gs[qb], dctx, HPC_HIDDEN, b, h, (c0), AM_QT, L, 32 * A3_WARPS);                      \
        if (threadIdx.x < AM_QT) {                                                                    \
            int row_ = (c0) + threadIdx.x;                                                            \
            bool in_ = row_ < L;                                                                      \
            a2_cp4(&tl[qb][threadIdx.x], lse + bh * L + (in_ ? row_ : 0), in_);                       \
        }                                                                                             \
    } while (0)
    a2_stage(ks, k, ld, b, h, 0, A3_KEYS, L, 32 * A3_WARPS);
    A3_STAGE_Q(0, 0);
    a2_commit();

    // V of the warp's keys as A fragments (K's come from ks, by ldmatrix).
    bool kvis[2];
    u32 va[AT_D / 16][4];
#pragma unroll
    for (int half = 0; half < 2; half++)
        kvis[half] = keys[half] < L && (!mask || mask[(i64)b * L + keys[half]] != 0);
#pragma unroll
    for (int kk = 0; kk < AT_D / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int key = keys[i & 1], col = kk * 16 + 2 * t + (i >= 2 ? 8 : 0);
            va[kk][i] = key < L ? *reinterpret_cast<const u32 *>(v + ((i64)b * L + key) * ld + h * AT_D + col) : 0u;
        }
    // delta = rowsum(dO * O) of every row (attn_simt_bwd_dot's job, folded in).
    a3_delta_rows(dl, dctx, ctx, b, h, L);
    float gk[AT_D / 8][4], gv[AT_D / 8][4];
#pragma unroll
    for (int nd = 0; nd < AT_D / 8; nd++)
#pragma unroll
        for (int c = 0; c < 4; c++) gk[nd][c] = gv[nd][c] = 0.0f;

    for (int c0 = 0, it = 0; c0 < L; c0 += AM_QT, it++) {
        int buf = it & 1;
        if (c0 + AM_QT < L) A3_STAGE_Q(buf ^ 1, c0 + AM_QT);
        a2_commit();
        a2_wait1();
        __syncthreads();
        const unsigned short *qb = qs[buf], *gb = gs[buf];
        const float *tlb = tl[buf], *tdb = dl + c0;

        if (owns) {
            // Two halves of 16 queries (hq), so only 16 x 16 of S^T and dP^T
            // are live at a time: S^T = K Q^T and dP^T = V dO^T for the
            // half, P, Z and dS, then dV += Z^T dO and dK += dS^T Q over it.
#pragma unroll
            for (int hq = 0; hq < AM_QT / 16; hq++) {
                float st[2][4], dpt[2][4];
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int c = 0; c < 4; c++) st[j][c] = dpt[j][c] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < AT_D / 16; kk++) {
                    // A fragment of the warp's K rows (16 x 16 at column 16 kk):
                    // a2_kn's matrices (rows + 8 (i & 1), columns + 8 (i >> 1))
                    // without .trans are a0..a3.
                    u32 ka[4], f[4], e[4];
                    a2_ldm4(ka, a2_kn(ks, k0, 16 * kk, lane));
                    a2_ldm4(f, a2_nk(qb, 16 * hq, 16 * kk, lane));
                    a2_ldm4(e, a2_nk(gb, 16 * hq, 16 * kk, lane));
                    am_mma(st[0], ka, f[0], f[1]);
                    am_mma(st[1], ka, f[2], f[3]);
                    am_mma(dpt[0], va[kk], e[0], e[1]);
                    am_mma(dpt[1], va[kk], e[2], e[3]);
                }
                // Keep bits as attn_mma2_bwd_dkv: lane draws the 8 keys
                // k0 + 8 (lane & 1) .. + 7 of query nt * 8 + ((lane & 15) >> 1),
                // nt = 2 hq + (lane >> 4).
                u32 mine = 0xFFu;
                if (p != 0.0f) {
                    int row = c0 + (2 * hq + (lane >> 4)) * 8 + ((lane & 15) >> 1);
                    mine = am_bits8((bh * L + row) * L + k0 + 8 * (lane & 1), p, seed, step, salt);
                }
#pragma unroll
                for (int j = 0; j < 2; j++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        int nt = 2 * hq + j, qi = 2 * t + (c & 1), half = c >> 1, row = c0 + nt * 8 + qi;
                        u32 w = 0xFFu;
                        if (p != 0.0f) w = __shfl_sync(0xffffffffu, mine, (j << 4) | (qi << 1) | half);
                        // Branch-free: the exponential of a hidden element
                        // is computed and then replaced by 0 (a select, so
                        // a NaN there cannot leak).  Rows past L read the
                        // staged zeros and row 0's lse.
                        int r = nt * 8 + qi;
                        bool on = row < L && kvis[half] && !(HPC_CAUSAL && keys[half] > row);
                        float pe = a2_exp2(st[j][c] * scale2 - tlb[r] * A2_LOG2E);
                        pe = on ? pe : 0.0f;
                        float kf = (w >> g) & 1u ? dscale : 0.0f;
                        st[j][c] = pe * kf;
                        dpt[j][c] = pe * (dpt[j][c] * kf - tdb[r]);
                    }
                u32 za[4] = {am_pack(st[0][0], st[0][1]), am_pack(st[0][2], st[0][3]), am_pack(st[1][0], st[1][1]),
                             am_pack(st[1][2], st[1][3])};
                u32 sa[4] = {am_pack(dpt[0][0], dpt[0][1]), am_pack(dpt[0][2], dpt[0][3]),
                             am_pack(dpt[1][0], dpt[1][1]), am_pack(dpt[1][2], dpt[1][3])};
                // dS^T for dQ: sa[i] is keys k0 + g (+ 8 for i odd), queries 16 hq + 2t (+ 8 for i >= 2).
#pragma unroll
                for (int i = 0; i < 4; i++)
                    *reinterpret_cast<u32 *>(dss + (k0 + g + 8 * (i & 1)) * A3_DSS + 16 * hq + 8 * (i >> 1) + 2 * t) =
                        sa[i];
#pragma unroll
                for (int np = 0; np < AT_D / 16; np++) {
                    u32 f[4], e[4];
                    a2_ldm4t(e, a2_kn(gb, 16 * hq, 16 * np, lane));
                    a2_ldm4t(f, a2_kn(qb, 16 * hq, 16 * np, lane));
                    am_mma(gv[2 * np], za, e[0], e[1]);
                    am_mma(gv[2 * np + 1], za, e[2], e[3]);
                    am_mma(gk[2 * np], sa, f[0], f[1]);
                    am_mma(gk[2 * np + 1], sa, f[2], f[3]);
                }
            }
        }
        __syncthreads();   // dss is full; every read of buffer buf is done

        if (warp < A3_DQ_UNITS) {
            int mq = 16 * (warp & 1), nc = 16 * (warp >> 1);   // the warp's query rows and columns
            // Two accumulator sets (even and odd key chunks) halve the
            // chains of dependent mma.
            float acc[2][4], acc2[2][4];
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[j][c] = acc2[j][c] = 0.0f;
#pragma unroll
            for (int kc = 0; kc < A3_KEYS / 16; kc += 2) {
                if (kc >= nkc) break;
                u32 a[4], f[4];
                a2_ldm4t(a, a2_nk(dss, 16 * kc, mq, lane, A3_DSS));
                a2_ldm4t(f, a2_kn(ks, 16 * kc, nc, lane));
                am_mma(acc[0], a, f[0], f[1]);
                am_mma(acc[1], a, f[2], f[3]);
                if (kc + 1 >= nkc) break;
                a2_ldm4t(a, a2_nk(dss, 16 * (kc + 1), mq, lane, A3_DSS));
                a2_ldm4t(f, a2_kn(ks, 16 * (kc + 1), nc, lane));
                am_mma(acc2[0], a, f[0], f[1]);
                am_mma(acc2[1], a, f[2], f[3]);
            }
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int c = 0; c < 4; c++) acc[j][c] += acc2[j][c];
#pragma unroll
            for (int half = 0; half < 2; half++) {
                int row = c0 + mq + g + 8 * half;
                if (row >= L) continue;
#pragma unroll
                for (int j = 0; j < 2; j++) {
                    i64 at = ((i64)b * L + row) * ldg + h * AT_D + nc + 8 * j + 2 * t;
                    *reinterpret_cast<u32 *>(dq + at) = am_pack(acc[j][2 * half] * scale, acc[j][2 * half + 1] * scale);
                }
            }
        }
    }
#undef A3_STAGE_Q
    a2_wait0();
    if (!owns) return;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        int key = keys[half];
        if (key >= L) continue;
#pragma unroll
        for (int nd = 0; nd < AT_D / 8; nd++) {
            i64 at = ((i64)b * L + key) * ldg + h * AT_D + nd * 8 + 2 * t;
            *reinterpret_cast<u32 *>(dk + at) = am_pack(gk[nd][2 * half] * scale, gk[nd][2 * half + 1] * scale);
            *reinterpret_cast<u32 *>(dv + at) = am_pack(gv[nd][2 * half], gv[nd][2 * half + 1]);
        }
    }
}
#ifndef HPC_ATTN_NO_KERNELS
extern "C" __global__ void __launch_bounds__(256)
KN(attn_mma3_bwd)(st_t *dq, st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *ctx, const st_t *q,
                  const st_t *k, const st_t *v, int ld, const float *lse, const int *mask, int B, int L, float p,
                  u64 seed, u32 step, u32 salt)
{
    attn_mma3_bwd_run(blockIdx.x, blockIdx.y, blockIdx.z, dq, dk, dv, ldg, dctx, ctx, q, k, v, ld, lse, mask, B, L, p,
                      seed, step, salt);
}
// The same body held to 128 registers (two blocks an SM): timed beside it by
// tests/gpu/gpu_attention.c to choose the step's launch bounds.
extern "C" __global__ void __launch_bounds__(256, 2)
KN(attn_mma3_bwd_r128)(st_t *dq, st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *ctx, const st_t *q,
                       const st_t *k, const st_t *v, int ld, const float *lse, const int *mask, int B, int L, float p,
                       u64 seed, u32 step, u32 salt)
{
    attn_mma3_bwd_run(blockIdx.x, blockIdx.y, blockIdx.z, dq, dk, dv, ldg, dctx, ctx, q, k, v, ld, lse, mask, B, L, p,
                      seed, step, salt);
}
#endif
#endif // AT_D <= 64
#endif // 16-bit, D % 16 == 0

// ---- query 0 alone (IrAttnAttr.first_query: the last layer under a
// first-token head, compiler/lower.h) ------------------------------------
// Query 0 of row b against all L keys: ctx (B, HPC_HIDDEN) and lse (B, NH),
// the full attention's row 0 (its dropout index ((b * NH + h) * L + 0) * L
// + k).  One block of AF_THREADS per (b, head); the keys go in chunks of
// AF_THREADS, one a thread, so a key's score (or, backward, its dZ) is one
// thread's dot product over D with the query in shared memory: no
// reduction across lanes per key.  Every dtype (SIMT, f32 accumulation).
// Forward, per chunk: the scores, their block max and sum of exp joining
// the running (max, sum) (online softmax), each thread's keep bit (its
// own draw: the 32 lanes draw side by side, one draw's time a chunk), then
// warp w adds z_k V_k over its 32 keys with the lanes over D (one coalesced
// row a key).  ctx = sum / l at the end; lse as the other families (+inf
// with no key visible; a NaN score or value stays NaN).
// Backward: delta = dctx . ctx; per key (a thread) dZ = dctx . V_k,
// dS = P (keep dZ - delta), its rows dV_k = P keep dctx and
// dK_k = dS q / sqrt(D) written by that thread; then dQ row 0 = sum_k dS K_k
// / sqrt(D) with the lanes over D as the forward's output; the other rows
// of dQ are 0 (written, since the gradients are overwritten).

#define AF_THREADS 128
#define AF_WARPS (AF_THREADS / 32)

// Rows of a head may be read and written 8 elements at a time when the
// head size allows it and every row starts 16-byte aligned (ld elements
// apart from an aligned base).
__device__ __forceinline__ bool af_vec_ok(const void *base, int ld)
{
    return AT_D % 8 == 0 && ((((unsigned long long)base) | ((unsigned long long)ld * sizeof(st_t))) & 15) == 0;
}

// xs . row over the head's D elements, xs in shared memory as f32.
__device__ __forceinline__ float af_dot(const float *xs, const st_t *row, bool vec)
{
    float s = 0.0f;
    if (vec) {
#pragma unroll
        for (int c = 0; c < AT_D / 8; c++) {
            float x[8];
            load_n<8>(row + 8 * c, x);
#pragma unroll
            for (int j = 0; j < 8; j++) s += xs[8 * c + j] * x[j];
        }
    } else {
        for (int d = 0; d < AT_D; d++) s += xs[d] * ld_f(row[d]);
    }
    return s;
}

// row[d] = a * xs[d] over the head's D elements.
__device__ __forceinline__ void af_put_row(st_t *row, float a, const float *xs, bool vec)
{
    if (vec) {
#pragma unroll
        for (int c = 0; c < AT_D / 8; c++) {
            float y[8];
#pragma unroll
            for (int j = 0; j < 8; j++) y[j] = a * xs[8 * c + j];
            store_n<8>(row + 8 * c, y);
        }
    } else {
        for (int d = 0; d < AT_D; d++) row[d] = st_from(a * xs[d]);
    }
}

// acc[u] += ws[j] row_j[lane + 32 u] over the calling warp's 32 keys c + j
// of the chunk at key c (j = 32 warp .. 32 warp + 31; ws in shared memory;
// row_j key c + j's row of x, rows ld apart from the head's column base),
// keys at or past L left out, and hidden keys too where skip_hidden.
__device__ __forceinline__ void af_add_rows(float acc[AT_DPL], const float *ws, const st_t *x, int ld, const int *mask,
                                            int b, int c, int L, bool skip_hidden)
{
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int j = warp * 32; j < warp * 32 + 32 && c + j < L; j++) {
        if (skip_hidden && !at_visible(mask, b, 0, c + j, L)) continue;
        float w = ws[j];
        const st_t *row = x + ((i64)b * L + c + j) * ld;
#pragma unroll
        for (int u = 0; u < AT_DPL; u++) {
            int d = lane + 32 * u;
            if (d < AT_D) acc[u] += w * ld_f(row[d]);
        }
    }
}

// out[d] = mul * sum of the AF_WARPS partial rows part[w][d].
__device__ __forceinline__ void af_sum_rows(st_t *out, float (*part)[AT_D + 1], float mul)
{
    __syncthreads();
    for (int d = threadIdx.x; d < AT_D; d += AF_THREADS) {
        float t = 0.0f;
        for (int w = 0; w < AF_WARPS; w++) t += part[w][d];
        out[d] = st_from(t * mul);
    }
}

AT_RUN void attn_first_fwd_run(int at_bx, int at_by, int at_bz, st_t *ctx, float *lse, const st_t *q,
                               const st_t *k, const st_t *v, int ld, const int *mask, int B, int L, float p, u64 seed,
                               u32 step, u32 salt)
{
    __shared__ float qs[AT_D];
    __shared__ float zs[AF_THREADS];
    __shared__ float red[32];
    __shared__ float part[AF_WARPS][AT_D + 1];
    int b = at_bz, h = at_by, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float dscale = dropout_scale(p);
    i64 bh = (i64)b * HPC_HEADS + h;
    for (int d = threadIdx.x; d < AT_D; d += AF_THREADS) qs[d] = at_scale() * ld_f(q[(i64)b * L * ld + h * AT_D + d]);
    bool vec = af_vec_ok(k, ld);
    float m = HPC_NEG_INF, l = 0.0f, o[AT_DPL];
#pragma unroll
    for (int e = 0; e < AT_DPL; e++) o[e] = 0.0f;
    __syncthreads();
    for (int c = 0; c < L; c += AF_THREADS) {
        int key = c + threadIdx.x;
        bool vis = at_visible(mask, b, 0, key, L);
        float s = vis ? af_dot(qs, k + ((i64)b * L + key) * ld + h * AT_D, vec) : HPC_NEG_INF;
        float mn = fmaxf(m, block_max(s, red));   // a NaN score is not the max; its exp makes l NaN
        float e = expf(s - (mn == HPC_NEG_INF ? 0.0f : mn));   // 0 for a hidden key
        float corr = m == HPC_NEG_INF ? 0.0f : expf(m - mn);
        l = l * corr + block_sum(e, red);   // its barriers also order zs's last reads before the store below
        m = mn;
        zs[threadIdx.x] = vis ? e * at_keep(bh * L * L + key, p, dscale, seed, step, salt) : 0.0f;
        __syncthreads();
#pragma unroll
        for (int u = 0; u < AT_DPL; u++) o[u] *= corr;
        af_add_rows(o, zs, v + h * AT_D, ld, mask, b, c, L, true);   // hidden values never count, NaN or not
    }
#pragma unroll
    for (int u = 0; u < AT_DPL; u++)
        if (lane + 32 * u < AT_D) part[warp][lane + 32 * u] = o[u];
    af_sum_rows(ctx + (i64)b * HPC_HIDDEN + h * AT_D, part, l == 0.0f ? 0.0f : 1.0f / l);
    if (threadIdx.x == 0) lse[bh] = l != l ? l : l == 0.0f ? HPC_INF : m + logf(l);
}

AT_RUN void attn_first_bwd_run(int at_bx, int at_by, int at_bz, st_t *dq, st_t *dk, st_t *dv, int ldg,
                               const st_t *dctx, const st_t *ctx, const st_t *q, const st_t *k, const st_t *v, int ld,
                               const float *lse, const int *mask, int B, int L, float p, u64 seed, u32 step,
                               u32 salt)
{
    __shared__ float qs[AT_D], gs[AT_D];
    __shared__ float dss[AF_THREADS];
    __shared__ float red[32];
    __shared__ float part[AF_WARPS][AT_D + 1];
    int b = at_bz, h = at_by, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float dscale = dropout_scale(p);
    i64 bh = (i64)b * HPC_HEADS + h;
    const st_t *g = dctx + (i64)b * HPC_HIDDEN + h * AT_D, *y = ctx + (i64)b * HPC_HIDDEN + h * AT_D;
    float dot = 0.0f;
    for (int d = threadIdx.x; d < AT_D; d += AF_THREADS) {
        qs[d] = at_scale() * ld_f(q[(i64)b * L * ld + h * AT_D + d]);
        gs[d] = ld_f(g[d]);
        dot += gs[d] * ld_f(y[d]);
    }
    float delta = block_sum(dot, red);   // its barriers publish qs and gs
    float ls = lse[bh];
    bool vec = af_vec_ok(k, ld) && af_vec_ok(v, ld), vec_out = af_vec_ok(dk, ldg) && af_vec_ok(dv, ldg);
    float acc[AT_DPL];
#pragma unroll
    for (int u = 0; u < AT_DPL; u++) acc[u] = 0.0f;
    for (int c = 0; c < L; c += AF_THREADS) {
        int key = c + threadIdx.x;
        float ds = 0.0f;
        if (key < L) {
            i64 row = ((i64)b * L + key) * ld + h * AT_D, grow = ((i64)b * L + key) * ldg + h * AT_D;
            bool vis = at_visible(mask, b, 0, key, L);
            float s = af_dot(qs, k + row, vec), dz = af_dot(gs, v + row, vec);
            float pe = vis ? expf(s - ls) : 0.0f;
            float keep = vis ? at_keep(bh * L * L + key, p, dscale, seed, step, salt) : 0.0f;
            ds = vis ? pe * (keep * dz - delta) : 0.0f;
            af_put_row(dv + grow, pe * keep, gs, vec_out);
            af_put_row(dk + grow, ds, qs, vec_out);
        }
        dss[threadIdx.x] = ds;
        __syncthreads();
        af_add_rows(acc, dss, k + h * AT_D, ld, mask, b, c, L, false);
        __syncthreads();   // dss is written again by the next chunk
    }
#pragma unroll
    for (int u = 0; u < AT_DPL; u++)
        if (lane + 32 * u < AT_D) part[warp][lane + 32 * u] = acc[u];
    af_sum_rows(dq + (i64)b * L * ldg + h * AT_D, part, at_scale());
    // rows 1 .. L - 1 of dQ: 0, 8 elements a store where aligned
    st_t *dq1 = dq + ((i64)b * L + 1) * ldg + h * AT_D;
    if (af_vec_ok(dq1, ldg)) {
        float zero[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        for (i64 i = threadIdx.x; i < (i64)(L - 1) * (AT_D / 8); i += AF_THREADS)
            store_n<8>(dq1 + (i / (AT_D / 8)) * ldg + (i % (AT_D / 8)) * 8, zero);
    } else {
        for (i64 i = threadIdx.x; i < (i64)(L - 1) * AT_D; i += AF_THREADS)
            dq1[(i / AT_D) * ldg + i % AT_D] = st_from(0.0f);
    }
}
#ifndef HPC_ATTN_NO_KERNELS
extern "C" __global__ void __launch_bounds__(128)
KN(attn_first_fwd)(st_t *ctx, float *lse, const st_t *q, const st_t *k, const st_t *v, int ld, const int *mask, int B,
                   int L, float p, u64 seed, u32 step, u32 salt)
{
    attn_first_fwd_run(blockIdx.x, blockIdx.y, blockIdx.z, ctx, lse, q, k, v, ld, mask, B, L, p, seed, step, salt);
}
extern "C" __global__ void __launch_bounds__(128)
KN(attn_first_bwd)(st_t *dq, st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *ctx, const st_t *q,
                   const st_t *k, const st_t *v, int ld, const float *lse, const int *mask, int B, int L, float p,
                   u64 seed, u32 step, u32 salt)
{
    attn_first_bwd_run(blockIdx.x, blockIdx.y, blockIdx.z, dq, dk, dv, ldg, dctx, ctx, q, k, v, ld, lse, mask, B, L, p,
                       seed, step, salt);
}
#endif

#endif // HPC_HEAD_DIM <= 128
