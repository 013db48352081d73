// compiler/kernels/embedding.cu — BERT's embedding layer in one pass:
//   x   = word[ids] + pos[t + HPC_POS_OFFSET] (+ type[type_ids])
//   out = dropout(LN(x))          (HPC_EMB_LN = 1, BERT)
//   out = dropout(x)              (HPC_EMB_LN = 0, GPT-2)
// one block per token row (R = B * L rows of H), and its backward, which
// scatter-adds into the f32 gradients of the three tables.  Dropout index:
// row * H + col of the (B, L, H) output.  Ids must be in range (the data
// loader checks them); an out-of-range id reads out of bounds.

__device__ __forceinline__ void emb_gather(float (*v)[ROW_VEC], const st_t *word, const st_t *pos,
                                           const st_t *type, int id, int pid, int tid)
{
#pragma unroll
    for (int c = 0; c < ROW_NPT; c++) {
        int col = row_col(c);
#pragma unroll
        for (int k = 0; k < ROW_VEC; k++) v[c][k] = 0.0f;
        if (col >= HPC_HIDDEN) continue;
        float w[ROW_VEC], q[ROW_VEC];
        load_n<ROW_VEC>(word + (i64)id * HPC_HIDDEN + col, w);
        load_n<ROW_VEC>(pos + (i64)pid * HPC_HIDDEN + col, q);
#pragma unroll
        for (int k = 0; k < ROW_VEC; k++) v[c][k] = w[k] + q[k];
        if (type) {
            float t[ROW_VEC];
            load_n<ROW_VEC>(type + (i64)tid * HPC_HIDDEN + col, t);
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++) v[c][k] += t[k];
        }
    }
}

extern "C" __global__ void __launch_bounds__(ROW_THREADS)
KN(emb_fwd)(st_t *out,               // (B, L, H) out
            float *mean, float *rstd, // (B * L) f32 out (unused without LN; may be NULL)
            const int *ids,          // (B, L) i32
            const int *type_ids,     // (B, L) i32, or NULL (all 0)
            const st_t *word,        // (V, H)
            const st_t *pos,         // (P, H)
            const st_t *type,        // (T, H), or NULL: no token type embedding
            const st_t *gamma, const st_t *beta, // (H)
            int B, int L, float p, u64 seed, u32 step, u32 salt)
{
    __shared__ float red[32];
    i64 row = blockIdx.x;
    if (row >= (i64)B * L) return;
    int t = (int)(row % L);
    float v[ROW_NPT][ROW_VEC];
    emb_gather(v, word, pos, type, ids[row], t + HPC_POS_OFFSET, type_ids ? type_ids[row] : 0);
#if HPC_EMB_LN
    ln_normalize_store(v, out, mean, rstd, gamma, beta, row, red, p, seed, step, salt);
#else
    float s = dropout_scale(p);
#pragma unroll
    for (int c = 0; c < ROW_NPT; c++) {
        int col = row_col(c);
        if (col >= HPC_HIDDEN) continue;
#pragma unroll
        for (int k = 0; k < ROW_VEC; k++)
            if (p != 0.0f && !philox_keep(seed, (u64)(row * HPC_HIDDEN + col + k), step, salt, p))
                v[c][k] = 0.0f;
            else
                v[c][k] *= s;
        store_n<ROW_VEC>(out + row * HPC_HIDDEN + col, v[c]);
    }
#endif
}

// Backward: dn = dropout_bwd(dout); with LN, dx = LN backward of dn (x is
// re-gathered from the tables, mean/rstd come from the forward), else
// dx = dn; then the three table gradients get dx:
//   dword[id]      fp32 atomicAdd per row (ids repeat: the summation order,
//                  and so the last bits, vary from run to run);
//   dpos[t + off]  rows are visited position-major (t * B + b), so a thread
//                  row sums its run of equal t in registers and adds once;
//   dtype[tt]      with HPC_TYPE_VOCAB <= 2: summed per block in registers
//                  and written to type_partials (gridDim.x, T, H), which
//                  colsum_finish(dtype, type_partials, gridDim.x, T * H) adds
//                  (deterministic); with more types, atomicAdd.
// dgamma/dbeta row sums go to partials (gridDim.x, 3, H) as in ln_bwd (slot
// 2 is 0); reduce them with ln_grad_reduce.  Block (ROW_THREADS, ROW_RPB).
#define EMB_TYPE_REGS (HPC_TYPE_VOCAB >= 1 && HPC_TYPE_VOCAB <= 2)

extern "C" __global__ void __launch_bounds__(ROW_THREADS * ROW_RPB)
KN(emb_bwd)(float *dword,            // (V, H) f32, accumulated
            float *dpos,             // (P, H) f32, accumulated
            float *dtype,            // (T, H) f32, accumulated (atomics only), or NULL
            float *partials,         // (gridDim.x, 3, H) f32 out (with LN; else may be NULL)
            float *type_partials,    // (gridDim.x, T, H) f32 out (T <= 2; else may be NULL)
            const st_t *dout,        // (B, L, H)
            const int *ids, const int *type_ids, // (B, L) i32 (type_ids may be NULL)
            const st_t *word, const st_t *pos, const st_t *type,
            const float *mean, const float *rstd, // (B * L)
            const st_t *gamma,       // (H)
            int B, int L, float p, u64 seed, u32 step, u32 salt)
{
    __shared__ float red[ROW_RPB][2][32];
    float s = dropout_scale(p);
    float dg[ROW_NPT][ROW_VEC], db[ROW_NPT][ROW_VEC], g[ROW_NPT][ROW_VEC], dp[ROW_NPT][ROW_VEC];
#if EMB_TYPE_REGS
    float dt0[ROW_NPT][ROW_VEC], dt1[ROW_NPT][ROW_VEC];   // per type id, in registers
#endif
#pragma unroll
    for (int c = 0; c < ROW_NPT; c++) {
#pragma unroll
        for (int k = 0; k < ROW_VEC; k++) {
            dg[c][k] = db[c][k] = g[c][k] = dp[c][k] = 0.0f;
#if EMB_TYPE_REGS
            dt0[c][k] = dt1[c][k] = 0.0f;
#endif
        }
#if HPC_EMB_LN
        if (row_col(c) < HPC_HIDDEN) load_n<ROW_VEC>(gamma + row_col(c), g[c]);
#endif
    }
    // This thread row's share: a contiguous run of position-major indices.
    i64 R = (i64)B * L, groups = (i64)gridDim.x * ROW_RPB;
    i64 per = (R + groups - 1) / groups, lo = ((i64)blockIdx.x * ROW_RPB + threadIdx.y) * per;
    int cur = -1;   // the position whose gradient dp holds
    for (i64 it = 0; it < per; it++) {
        i64 rp = lo + it;
        bool valid = rp < R;
        int t = valid ? (int)(rp / B) : 0, bb = valid ? (int)(rp % B) : 0;
        i64 row = (i64)bb * L + t;
        if (valid && t != cur) {
            if (cur >= 0) {
#pragma unroll
                for (int c = 0; c < ROW_NPT; c++)
#pragma unroll
                    for (int k = 0; k < ROW_VEC; k++) {
                        if (row_col(c) < HPC_HIDDEN)
                            atomicAdd(dpos + (i64)(cur + HPC_POS_OFFSET) * HPC_HIDDEN + row_col(c) + k, dp[c][k]);
                        dp[c][k] = 0.0f;
                    }
            }
            cur = t;
        }
        int id = valid ? ids[row] : 0, tid = valid && type_ids ? type_ids[row] : 0;
        float d[ROW_NPT][ROW_VEC];
#pragma unroll
        for (int c = 0; c < ROW_NPT; c++) {
            int col = row_col(c);
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++) d[c][k] = 0.0f;
            if (col >= HPC_HIDDEN || !valid) continue;
            load_n<ROW_VEC>(dout + row * HPC_HIDDEN + col, d[c]);
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++)
                if (p != 0.0f && !philox_keep(seed, (u64)(row * HPC_HIDDEN + col + k), step, salt, p))
                    d[c][k] = 0.0f;
                else
                    d[c][k] *= s;
        }
#if HPC_EMB_LN
        float x[ROW_NPT][ROW_VEC];
        if (valid) emb_gather(x, word, pos, type, id, t + HPC_POS_OFFSET, tid);
        float mu = valid ? mean[row] : 0.0f, rs = valid ? rstd[row] : 0.0f, a = 0.0f, b = 0.0f;
#pragma unroll
        for (int c = 0; c < ROW_NPT; c++) {
            if (row_col(c) >= HPC_HIDDEN || !valid) continue;
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++) {
                float xh = (x[c][k] - mu) * rs, gd = g[c][k] * d[c][k];
                dg[c][k] += d[c][k] * xh;
                db[c][k] += d[c][k];
                x[c][k] = xh;
                a += gd;
                b += gd * xh;
            }
        }
        row_sum2(&a, &b, red);
        a *= 1.0f / HPC_HIDDEN;
        b *= 1.0f / HPC_HIDDEN;
        if (!valid) continue;
#pragma unroll
        for (int c = 0; c < ROW_NPT; c++)
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++) d[c][k] = rs * (g[c][k] * d[c][k] - a - x[c][k] * b);
#endif
        if (!valid) continue;
#pragma unroll
        for (int c = 0; c < ROW_NPT; c++) {
            int col = row_col(c);
            if (col >= HPC_HIDDEN) continue;
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++) {
                atomicAdd(dword + (i64)id * HPC_HIDDEN + col + k, d[c][k]);
                dp[c][k] += d[c][k];
#if EMB_TYPE_REGS
                dt0[c][k] += tid == 0 ? d[c][k] : 0.0f;
                dt1[c][k] += tid == 0 ? 0.0f : d[c][k];
#else
                if (dtype) atomicAdd(dtype + (i64)tid * HPC_HIDDEN + col + k, d[c][k]);
#endif
            }
        }
    }
    if (cur >= 0) {
#pragma unroll
        for (int c = 0; c < ROW_NPT; c++)
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++)
                if (row_col(c) < HPC_HIDDEN)
                    atomicAdd(dpos + (i64)(cur + HPC_POS_OFFSET) * HPC_HIDDEN + row_col(c) + k, dp[c][k]);
    }
#if EMB_TYPE_REGS
    if (type_partials) {
        // One (T, H) partial per block, thread rows added in a fixed order.
        float *part = type_partials + (i64)blockIdx.x * HPC_TYPE_VOCAB * HPC_HIDDEN;
        for (int y = 0; y < ROW_RPB; y++) {
            if ((int)threadIdx.y == y) {
#pragma unroll
                for (int c = 0; c < ROW_NPT; c++) {
                    int col = row_col(c);
                    if (col >= HPC_HIDDEN) continue;
#pragma unroll
                    for (int k = 0; k < ROW_VEC; k++) {
                        float *o = part + col + k;
                        *o = (y ? *o : 0.0f) + dt0[c][k];
                        if (HPC_TYPE_VOCAB == 2) o[HPC_HIDDEN] = (y ? o[HPC_HIDDEN] : 0.0f) + dt1[c][k];
                    }
                }
            }
            __syncthreads();
        }
    }
#endif
#if HPC_EMB_LN
    float zero[ROW_NPT][ROW_VEC];
#pragma unroll
    for (int c = 0; c < ROW_NPT; c++)
#pragma unroll
        for (int k = 0; k < ROW_VEC; k++) zero[c][k] = 0.0f;
    row_partials_store(partials, dg, db, zero);
#endif
}
