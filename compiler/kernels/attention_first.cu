// compiler/kernels/attention_first.cu — attention for query 0 alone
// (attn_first_fwd / attn_first_bwd: the last layer under a first-token
// head), every dtype; builds on attention.cu's AT_* helpers.

#if HPC_HEAD_DIM <= 128

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
