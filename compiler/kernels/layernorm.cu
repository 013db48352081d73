// compiler/kernels/layernorm.cu — y = LN(residual + dropout(x + bias)), the
// end of every BERT sub-layer, and its backward.  The forward runs one
// block per row of H; each backward block walks a share of the rows and
// keeps the column sums for dgamma/dbeta/dbias in registers.
//
// Forward saves mean and rstd (f32, one per row) and, when asked, the
// pre-LN sum z (the residual stream of pre-LN stacks, and the input the
// backward reads).  The dropout mask is never stored: the backward
// regenerates it from (seed, step, salt) and the flat index row * H + col.

// Loads row `row` of x (+ bias), applies dropout and adds the residual:
// v holds z for this thread's chunks (0 past H).
__device__ __forceinline__ void ln_load_z(float (*v)[ROW_VEC], const st_t *x, const st_t *bias,
                                          const st_t *residual, i64 row, float p, float s,
                                          u64 seed, u32 step, u32 salt)
{
#pragma unroll
    for (int c = 0; c < ROW_NPT; c++) {
        int col = row_col(c);
#pragma unroll
        for (int k = 0; k < ROW_VEC; k++) v[c][k] = 0.0f;
        if (col >= HPC_HIDDEN) continue;
        load_n<ROW_VEC>(x + row * HPC_HIDDEN + col, v[c]);
        if (bias) {
            float b[ROW_VEC];
            load_n<ROW_VEC>(bias + col, b);
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++) v[c][k] += b[k];
        }
        if (p != 0.0f) {
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++) {
                bool keep = philox_keep(seed, (u64)(row * HPC_HIDDEN + col + k), step, salt, p);
                v[c][k] = keep ? v[c][k] * s : 0.0f;
            }
        }
        if (residual) {
            float r[ROW_VEC];
            load_n<ROW_VEC>(residual + row * HPC_HIDDEN + col, r);
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++) v[c][k] += r[k];
        }
    }
}

// Mean and rstd of the row held in v (two passes over registers), then
// y = dropout((v - mean) * rstd * gamma + beta) written to y (p = 0: no
// dropout; the embeddings drop after their LayerNorm, index row * H + col).
__device__ __forceinline__ void ln_normalize_store(float (*v)[ROW_VEC], st_t *y, float *mean_out,
                                                   float *rstd_out, const st_t *gamma,
                                                   const st_t *beta, i64 row, float *red, float p,
                                                   u64 seed, u32 step, u32 salt)
{
    float ds = dropout_scale(p);
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < ROW_NPT; c++)
#pragma unroll
        for (int k = 0; k < ROW_VEC; k++) s += v[c][k];
    float mean = block_sum(s, red) * (1.0f / HPC_HIDDEN);
    float q = 0.0f;
#pragma unroll
    for (int c = 0; c < ROW_NPT; c++) {
        if (row_col(c) >= HPC_HIDDEN) continue;
#pragma unroll
        for (int k = 0; k < ROW_VEC; k++) q += (v[c][k] - mean) * (v[c][k] - mean);
    }
    float var = block_sum(q, red) * (1.0f / HPC_HIDDEN);
    float rstd = rsqrtf(var + HPC_LN_EPS);
    if (threadIdx.x == 0) {
        if (mean_out) mean_out[row] = mean;
        if (rstd_out) rstd_out[row] = rstd;
    }
#pragma unroll
    for (int c = 0; c < ROW_NPT; c++) {
        int col = row_col(c);
        if (col >= HPC_HIDDEN) continue;
        float g[ROW_VEC], b[ROW_VEC], o[ROW_VEC];
        load_n<ROW_VEC>(gamma + col, g);
        load_n<ROW_VEC>(beta + col, b);
#pragma unroll
        for (int k = 0; k < ROW_VEC; k++) {
            o[k] = (v[c][k] - mean) * rstd * g[k] + b[k];
            if (p != 0.0f)
                o[k] = philox_keep(seed, (u64)(row * HPC_HIDDEN + col + k), step, salt, p) ? o[k] * ds : 0.0f;
        }
        store_n<ROW_VEC>(y + row * HPC_HIDDEN + col, o);
    }
}

extern "C" __global__ void __launch_bounds__(ROW_THREADS)
KN(ln_fwd)(st_t *y,               // (R, H) out
           st_t *z_out,           // (R, H) out: residual + dropout(x + bias), or NULL
           float *mean, float *rstd, // (R) f32 out
           const st_t *x,         // (R, H)
           const st_t *bias,      // (H) or NULL
           const st_t *residual,  // (R, H) or NULL
           const st_t *gamma, const st_t *beta, // (H)
           int rows, float p, u64 seed, u32 step, u32 salt)
{
    __shared__ float red[32];
    i64 row = blockIdx.x;
    if (row >= rows) return;
    float v[ROW_NPT][ROW_VEC];
    ln_load_z(v, x, bias, residual, row, p, dropout_scale(p), seed, step, salt);
    if (z_out) {
#pragma unroll
        for (int c = 0; c < ROW_NPT; c++)
            if (row_col(c) < HPC_HIDDEN) store_n<ROW_VEC>(z_out + row * HPC_HIDDEN + row_col(c), v[c]);
    }
    ln_normalize_store(v, y, mean, rstd, gamma, beta, row, red, 0.0f, 0, 0, 0);
}

// The block's column sums into partials[blockIdx.x] = {a, b, c}, each (H):
// thread row 0 writes, the others add in turn (a fixed order).
__device__ __forceinline__ void row_partials_store(float *partials, float (*a)[ROW_VEC],
                                                   float (*b)[ROW_VEC], float (*c)[ROW_VEC])
{
    float *part = partials + (i64)blockIdx.x * 3 * HPC_HIDDEN;
    for (int y = 0; y < ROW_RPB; y++) {
        if ((int)threadIdx.y == y) {
#pragma unroll
            for (int i = 0; i < ROW_NPT; i++) {
                int col = row_col(i);
                if (col >= HPC_HIDDEN) continue;
#pragma unroll
                for (int k = 0; k < ROW_VEC; k++) {
                    float *o = part + col + k;
                    o[0] = (y ? o[0] : 0.0f) + a[i][k];
                    o[HPC_HIDDEN] = (y ? o[HPC_HIDDEN] : 0.0f) + b[i][k];
                    o[2 * HPC_HIDDEN] = (y ? o[2 * HPC_HIDDEN] : 0.0f) + c[i][k];
                }
            }
        }
        __syncthreads();
    }
}

// Row `row` of z and dy (zeros past H or past the last row) and its stats.
__device__ __forceinline__ void ln_bwd_load(float (*zz)[ROW_VEC], float (*d)[ROW_VEC], float *mu, float *rs,
                                            const st_t *z, const st_t *dy, const float *mean,
                                            const float *rstd, i64 row, int rows)
{
    bool valid = row < rows;
    *mu = valid ? mean[row] : 0.0f;
    *rs = valid ? rstd[row] : 0.0f;
#pragma unroll
    for (int c = 0; c < ROW_NPT; c++) {
        int col = row_col(c);
#pragma unroll
        for (int k = 0; k < ROW_VEC; k++) zz[c][k] = d[c][k] = 0.0f;
        if (col >= HPC_HIDDEN || !valid) continue;
        load_n<ROW_VEC>(z + row * HPC_HIDDEN + col, zz[c]);
        load_n<ROW_VEC>(dy + row * HPC_HIDDEN + col, d[c]);
    }
}

// Backward of ln_fwd given z (the forward's z_out), mean, rstd:
//   dz = rstd * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat)),  xhat = (z - mean) * rstd
//   dresid = dz (or += dz when accumulate_dresid), dx = keep ? dz / (1-p) : 0
// dx is also the gradient of the bias input.  Block (ROW_THREADS, ROW_RPB):
// the ROW_RPB thread rows take ROW_RPB rows at a time, blocks stride by
// gridDim.x * ROW_RPB rows.  Block b writes its column sums to
// partials[b] = { sum dy*xhat (dgamma), sum dy (dbeta), sum dx (dbias) },
// each (H) f32; ln_grad_reduce adds them to the parameter gradients.
extern "C" __global__ void __launch_bounds__(ROW_THREADS * ROW_RPB)
KN(ln_bwd)(st_t *dx,              // (R, H) out, or NULL
           st_t *dresid,          // (R, H) out (see accumulate_dresid), or NULL
           float *partials,       // (gridDim.x, 3, H) f32 out
           const st_t *dy,        // (R, H)
           const st_t *z,         // (R, H)
           const float *mean, const float *rstd, // (R)
           const st_t *gamma,     // (H)
           int rows, float p, u64 seed, u32 step, u32 salt, int accumulate_dresid)
{
    __shared__ float red[ROW_RPB][2][32];
    float s = dropout_scale(p);
    float dg[ROW_NPT][ROW_VEC], db[ROW_NPT][ROW_VEC], dbias[ROW_NPT][ROW_VEC], g[ROW_NPT][ROW_VEC];
#pragma unroll
    for (int c = 0; c < ROW_NPT; c++) {
#pragma unroll
        for (int k = 0; k < ROW_VEC; k++) dg[c][k] = db[c][k] = dbias[c][k] = g[c][k] = 0.0f;
        if (row_col(c) < HPC_HIDDEN) load_n<ROW_VEC>(gamma + row_col(c), g[c]);
    }
    // The next row's z, dy, mean and rstd are loaded while this row reduces
    // (software pipelining: a block walks its rows one after another).
    i64 stride = (i64)gridDim.x * ROW_RPB;
    float zn[ROW_NPT][ROW_VEC], dn[ROW_NPT][ROW_VEC], mun = 0.0f, rsn = 0.0f;
    ln_bwd_load(zn, dn, &mun, &rsn, z, dy, mean, rstd, (i64)blockIdx.x * ROW_RPB + threadIdx.y, rows);
    for (i64 base = (i64)blockIdx.x * ROW_RPB; base < rows; base += stride) {
        i64 row = base + threadIdx.y;
        bool valid = row < rows;
        float zz[ROW_NPT][ROW_VEC], d[ROW_NPT][ROW_VEC];
#pragma unroll
        for (int c = 0; c < ROW_NPT; c++)
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++) zz[c][k] = zn[c][k], d[c][k] = dn[c][k];
        float mu = mun, rs = rsn;
        ln_bwd_load(zn, dn, &mun, &rsn, z, dy, mean, rstd, row + stride, rows);
        float xh[ROW_NPT][ROW_VEC], gd[ROW_NPT][ROW_VEC];
        float a = 0.0f, b = 0.0f;
#pragma unroll
        for (int c = 0; c < ROW_NPT; c++) {
            int col = row_col(c);
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++) xh[c][k] = gd[c][k] = 0.0f;
            if (col >= HPC_HIDDEN || !valid) continue;
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++) {
                xh[c][k] = (zz[c][k] - mu) * rs;
                gd[c][k] = g[c][k] * d[c][k];
                dg[c][k] += d[c][k] * xh[c][k];
                db[c][k] += d[c][k];
                a += gd[c][k];
                b += gd[c][k] * xh[c][k];
            }
        }
        row_sum2(&a, &b, red);
        a *= 1.0f / HPC_HIDDEN;
        b *= 1.0f / HPC_HIDDEN;
        if (!valid) continue;
#pragma unroll
        for (int c = 0; c < ROW_NPT; c++) {
            int col = row_col(c);
            if (col >= HPC_HIDDEN) continue;
            float dz[ROW_VEC], o[ROW_VEC];
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++) dz[k] = rs * (gd[c][k] - a - xh[c][k] * b);
            if (dresid) {
                if (accumulate_dresid) {
                    float r[ROW_VEC];
                    load_n<ROW_VEC>(dresid + row * HPC_HIDDEN + col, r);
#pragma unroll
                    for (int k = 0; k < ROW_VEC; k++) o[k] = r[k] + dz[k];
                    store_n<ROW_VEC>(dresid + row * HPC_HIDDEN + col, o);
                } else {
                    store_n<ROW_VEC>(dresid + row * HPC_HIDDEN + col, dz);
                }
            }
#pragma unroll
            for (int k = 0; k < ROW_VEC; k++) {
                bool keep = p == 0.0f || philox_keep(seed, (u64)(row * HPC_HIDDEN + col + k), step, salt, p);
                o[k] = keep ? dz[k] * s : 0.0f;
                dbias[c][k] += o[k];
            }
            if (dx) store_n<ROW_VEC>(dx + row * HPC_HIDDEN + col, o);
        }
    }
    row_partials_store(partials, dg, db, dbias);
}


// dgamma += sum_b partials[b][0], dbeta += ..[1], dbias += ..[2] (each (H)
// f32; dbias may be NULL).  A fixed order over b: deterministic.
// Launch ceil(H / 256) blocks of 256 threads.
extern "C" __global__ void KN(ln_grad_reduce)(float *dgamma, float *dbeta, float *dbias,
                                              const float *partials, int parts)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= HPC_HIDDEN) return;
    float a = 0.0f, b = 0.0f, c = 0.0f;
    for (int i = 0; i < parts; i++) {
        const float *part = partials + (i64)i * 3 * HPC_HIDDEN;
        a += part[col];
        b += part[HPC_HIDDEN + col];
        c += part[2 * HPC_HIDDEN + col];
    }
    if (dgamma) dgamma[col] += a;
    if (dbeta) dbeta[col] += b;
    if (dbias) dbias[col] += c;
}
