// compiler/kernels/attention_mma.cu — fused attention, first tensor-core
// family (v1: attn_mma_fwd, attn_mma_bwd_dq, attn_mma_bwd_dkv) and the mma,
// packing and keep-bit helpers (am_*) the later families build on.  The
// contract, the layout of the arguments and AT_* are attention.cu's; the
// step concatenates the parts in the order of compiler/emit_attention.h.

#if HPC_HEAD_DIM <= 128 && HPC_DTYPE != 0 && HPC_HEAD_DIM % 16 == 0

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

// A fragments (16 x 16 chunk kk of D) of the warp's rows rows[0] = r0 + g
// and rows[1] = r0 + g + 8 of one head of x, zeros past L.
__device__ __forceinline__ void am_load_a(u32 a[AT_D / 16][4], const st_t *x, int ld, int b, int h, const int rows[2],
                                          int t, int L)
{
#pragma unroll
    for (int kk = 0; kk < AT_D / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = rows[i & 1], col = kk * 16 + 2 * t + (i >= 2 ? 8 : 0);
            a[kk][i] = row < L ? *reinterpret_cast<const u32 *>(x + ((i64)b * L + row) * ld + h * AT_D + col) : 0u;
        }
}

// am_load_a of two heads' rows at once (Q and dO, or K and V), loaded side
// by side in one loop.
__device__ __forceinline__ void am_load_a2(u32 a[AT_D / 16][4], const st_t *x, int ldx, u32 a2[AT_D / 16][4],
                                           const st_t *x2, int ldx2, int b, int h, const int rows[2], int t, int L)
{
#pragma unroll
    for (int kk = 0; kk < AT_D / 16; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int row = rows[i & 1], col = kk * 16 + 2 * t + (i >= 2 ? 8 : 0);
            bool in = row < L;
            a[kk][i] = in ? *reinterpret_cast<const u32 *>(x + ((i64)b * L + row) * ldx + h * AT_D + col) : 0u;
            a2[kk][i] = in ? *reinterpret_cast<const u32 *>(x2 + ((i64)b * L + row) * ldx2 + h * AT_D + col) : 0u;
        }
}

// The A fragment (16 rows x 16 columns) of two adjacent 8-column
// accumulator tiles s[0], s[1], rounded to the storage dtype: P, Z or dS
// go into the next product without leaving the registers.
__device__ __forceinline__ void am_frag_a(u32 a[4], const float s[2][4])
{
    a[0] = am_pack(s[0][0], s[0][1]);
    a[1] = am_pack(s[0][2], s[0][3]);
    a[2] = am_pack(s[1][0], s[1][1]);
    a[3] = am_pack(s[1][2], s[1][3]);
}

// o *= corr of its row (g or g + 8), the online softmax's rescaling.
__device__ __forceinline__ void am_rescale(float o[AT_D / 8][4], const float corr[2])
{
#pragma unroll
    for (int nd = 0; nd < AT_D / 8; nd++) {
        o[nd][0] *= corr[0];
        o[nd][1] *= corr[0];
        o[nd][2] *= corr[1];
        o[nd][3] *= corr[1];
    }
}

// Row rr (g, or g + 8 for rr = 1) of a warp's 16 x D accumulators, times
// mul, to row `row` of head h of out (row stride ld): the lane's pairs.
__device__ __forceinline__ void am_put_row(st_t *out, int ld, int b, int h, int row, int L,
                                           const float acc[AT_D / 8][4], int rr, float mul, int t)
{
#pragma unroll
    for (int nd = 0; nd < AT_D / 8; nd++) {
        u32 w = am_pack(acc[nd][2 * rr] * mul, acc[nd][2 * rr + 1] * mul);
        *reinterpret_cast<u32 *>(out + ((i64)b * L + row) * ld + h * AT_D + nd * 8 + 2 * t) = w;
    }
}

// kb[rr][nt]: keep bits of this lane's keys 2t, 2t + 1 of 8-key tile nt of
// the key tile at t0, for its rows rr (flat[rr]: the row's first element).
// Lane t draws 8-key tiles t and t + 4 of both rows into mine and the quad
// shares them by shuffles (one draw per 8 elements).  mine is the caller's,
// declared beside kb: as a local here it moved the kernels' registers.
__device__ __forceinline__ void am_keep_bits(u32 kb[2][AM_KT / 8], u32 mine[2][2], const i64 flat[2], int t0, int lane,
                                             int t, float p, u64 seed, u32 step, u32 salt)
{
    if (p != 0.0f) {
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
}

// The saved keep bits (compiler/fuse_attn_keep.c; program/ir.h's
// IR_ATTN_KEEP_KEYS): AT_KEEP_BYTES a query row of (b, head) bh, byte j the
// keys 8 j .. 8 j + 7, for rows of at most AT_KEEP_KEYS keys.
#define AT_KEEP_KEYS 128
#define AT_KEEP_BYTES (AT_KEEP_KEYS / 8)

// Stores the lane's draws of am_keep_bits (mine[rr][j]: keys t0 + 8 (t + 4 j)
// .. + 7 of row rows[rr]) as their bytes of the keep bits, rows below L.
__device__ __forceinline__ void am_store_keep(unsigned char *keep, const u32 mine[2][2], const int rows[2], i64 bh,
                                              int t0, int t, int L)
{
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        if (rows[rr] >= L) continue;
        unsigned char *row = keep + (bh * L + rows[rr]) * AT_KEEP_BYTES + (t0 >> 3);
#pragma unroll
        for (int j = 0; j < 2; j++) row[t + 4 * j] = (unsigned char)mine[rr][j];
    }
}

// acc += P X for the warp's 16 rows: P the score-shaped accumulators of a
// key tile (s[nt], 8-key tile nt), X^T the tile staged transposed (D rows
// of AM_KT keys, row stride AM_VS), so B's pairs are adjacent.
__device__ __forceinline__ void am_mma_pv(float acc[AT_D / 8][4], const float s[AM_KT / 8][4],
                                          const unsigned short *xt, int g, int t)
{
#pragma unroll
    for (int kc = 0; kc < AM_KT / 16; kc++) {
        u32 pa[4];
        am_frag_a(pa, s + 2 * kc);
#pragma unroll
        for (int nd = 0; nd < AT_D / 8; nd++) {
            const unsigned short *xp = xt + (nd * 8 + g) * AM_VS + kc * 16 + 2 * t;
            am_mma(acc[nd], pa, *reinterpret_cast<const u32 *>(xp), *reinterpret_cast<const u32 *>(xp + 8));
        }
    }
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
    am_load_a(qa, q, ld, b, h, rows, t, L);
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
        am_rescale(o, corr);
        u32 kb[2][AM_KT / 8], mine[2][2];
        am_keep_bits(kb, mine, flat, t0, lane, t, p, seed, step, salt);
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
        am_mma_pv(o, s, vt, g, t);
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
        int row = rows[rr];
        if (row >= L) continue;
        float inv = l[rr] == 0.0f ? 0.0f : 1.0f / l[rr];
        am_put_row(ctx, HPC_HIDDEN, b, h, row, L, o, rr, inv, t);
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
    am_load_a2(qa, q, ld, ga, dctx, HPC_HIDDEN, b, h, rows, t, L);
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
        u32 kb[2][AM_KT / 8], mine[2][2];
        am_keep_bits(kb, mine, flat, t0, lane, t, p, seed, step, salt);
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
        am_mma_pv(acc, sc, kt, g, t);
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        int row = rows[rr];
        if (row >= L) continue;
        am_put_row(dq, ldg, b, h, row, L, acc, rr, scale, t);
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

// The warp's dK (times scale) and dV rows, keys below L: the lane's pairs.
__device__ __forceinline__ void am_put_dkv(st_t *dk, st_t *dv, int ldg, int b, int h, const int keys[2], int L, int t,
                                           const float gk[AT_D / 8][4], const float gv[AT_D / 8][4], float scale)
{
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
    am_load_a2(ka, k, ld, va, v, ld, b, h, keys, t, L);
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
            u32 za[4], sa[4];
            am_frag_a(za, st + 2 * kc);
            am_frag_a(sa, dpt + 2 * kc);
#pragma unroll
            for (int nd = 0; nd < AT_D / 8; nd++) {
                int off = (nd * 8 + g) * AM_QTS + kc * 16 + 2 * t;
                am_mma(gv[nd], za, *reinterpret_cast<const u32 *>(gt + off), *reinterpret_cast<const u32 *>(gt + off + 8));
                am_mma(gk[nd], sa, *reinterpret_cast<const u32 *>(qt + off), *reinterpret_cast<const u32 *>(qt + off + 8));
            }
        }
    }
    am_put_dkv(dk, dv, ldg, b, h, keys, L, t, gk, gv, scale);
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

#endif // 16-bit storage, D a multiple of 16, D <= 128
