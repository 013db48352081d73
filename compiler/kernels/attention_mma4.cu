// compiler/kernels/attention_mma4.cu — the one-pass tensor-core backward
// with dS of every query in dynamic shared memory (attn_mma4_bwd: the
// step's backward up to L 128 and head size 64 under HPC_ATTN_KERNELS=v4,
// and under v5, the default, wherever attention_wgmma.cu's is not used:
// up to L 64, bf16, packed rows, modules not built for sm_90a); builds on
// attention_mma3.cu.

#if HPC_HEAD_DIM <= 64 && HPC_DTYPE != 0 && HPC_HEAD_DIM % 16 == 0

// == One-pass backward, whole dS (attn_mma4_bwd) ==
//
// attn_mma3_bwd's work in another order.  There the 48 KiB of static
// shared memory hold one query tile of dS^T at a time, so every tile ends
// with a barrier and a dQ pass of its own (16 products a warp in two
// chains), and Q and dO come through two buffers, a tile ahead.  Here a
// block of 256 asks for A4_SMEM_BYTES of dynamic shared memory (two blocks
// an SM still fit) and keeps K, Q and dO of all 128 rows and dS^T of every
// query:
//  - all four query tiles are requested at the start, one cp.async group
//    each (K and the keep bits ride with them as in attn_mma3_bwd), and the
//    loop waits for tile it's group alone: one barrier a tile, no buffer is
//    refilled;
//  - a tile's key work (S^T, dP^T, P, dS, dV += Z^T dO, dK += dS^T Q) is
//    attn_mma3_bwd's (a3_tile_keys), its dS^T stored into the tile's
//    columns of dss;
//  - after the loop dK and dV leave through the Q and dO rows (no longer
//    read), then each warp computes dQ for its 16 queries and all AT_D
//    columns in one pass over the keys (AT_D / 8 products a key chunk into
//    as many independent accumulators) and writes it the same way.
// dK and dV are the same bits as attn_mma3_bwd's; dQ sums the same
// products in another order (gpu_attention compares both with the cpu).

#define A4_QTILES (A3_KEYS / AM_QT)            // query tiles of the longest row it takes
#define A4_DSS (A3_KEYS + 8)                   // shared row stride of dS^T (every query)
#define A4_ROWS_BYTES (A3_KEYS * AM_KS * 2)    // K, Q or dO of every row
#define A4_DSS_BYTES (A3_KEYS * A4_DSS * 2)
#define A4_SMEM_BYTES (3 * A4_ROWS_BYTES + A4_DSS_BYTES + 2 * A3_KEYS * 4)
static_assert(A4_QTILES == 4, "a4_wait_tile waits for one of four groups");
#ifdef HPC_ATTN4_SMEM_BYTES
static_assert(A4_SMEM_BYTES == HPC_ATTN4_SMEM_BYTES, "the launch's dynamic shared memory is the kernel's layout "
                                                    "(kemit_attn4_smem_bytes, compiler/emit_attention.h)");
#endif

// Until query tile it (of the four groups committed at the start) has
// landed: cp.async.wait_group takes its count as an immediate.
__device__ __forceinline__ void a4_wait_tile(int it)
{
    switch (it) {
    case 0: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    default: a2_wait0(); break;
    }
}

// K (into ks) and the four query tiles (Q, dO, lse and the keep bits into
// qs, gs, tl) of (b, head): one cp.async group a tile, K with the first,
// empty groups past L.
__device__ __forceinline__ void a4_stage_head(unsigned short *ks, unsigned short *qs, unsigned short *gs, float *tl,
                                              const st_t *q, const st_t *k, const st_t *dctx, const float *lse,
                                              const unsigned char *keep, int ld, int b, int h, int L)
{
    i64 bh = (i64)b * HPC_HEADS + h;
    a2_stage(ks, k, ld, b, h, 0, A3_KEYS, L, 32 * A3_WARPS);
    for (int it = 0; it < A4_QTILES; it++) {   // one group a tile, empty past L
        int c0 = it * AM_QT;
        if (c0 < L) {
            a2_stage_q(qs + c0 * AM_KS, gs + c0 * AM_KS, tl + c0, nullptr, q, dctx, lse, nullptr, ld, b, h, bh, c0,
                       L, false, 32 * A3_WARPS);
            if (keep != nullptr) a3_stage_keep(qs + c0 * AM_KS, keep, bh, c0, L);
        }
        a2_commit();
    }
}

// The key work of (b, head) once a4_stage_head's groups are in flight:
// the warp's start (delta into dl, its V fragments), then the query tiles
// as they land (dS^T into dss, dK and dV into gk and gv).  Ends after a
// barrier that follows the last read of qs, gs, tl and dl; dss is full.
__device__ __forceinline__ void a4_head_keys(float gk[AT_D / 8][4], float gv[AT_D / 8][4], const unsigned short *ks,
                                             const unsigned short *qs, const unsigned short *gs, unsigned short *dss,
                                             const float *tl, float *dl, const st_t *dctx, const st_t *ctx,
                                             const st_t *v, int ld, const int *mask, int b, int h, int L, float p,
                                             float scale2, float dscale, u64 seed, u32 step, u32 salt,
                                             const unsigned char *keep)
{
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int k0 = warp * AM_QW;   // the warp's first key, and its first query for dQ
    int keys[2] = {k0 + g, k0 + g + 8};
    bool owns = k0 < L;      // warp-uniform: the warp has keys below L
    i64 bh = (i64)b * HPC_HEADS + h;
    bool kvis[2];
    u32 va[AT_D / 16][4];
    a3_warp_start(kvis, va, gk, gv, dl, dss, A4_DSS, v, dctx, ctx, mask, ld, b, h, keys, k0, L, t, lane);

    for (int c0 = 0, it = 0; c0 < L; c0 += AM_QT, it++) {
        a4_wait_tile(it);
        __syncthreads();   // tile it of every thread's copies has landed
        const unsigned short *qb = qs + c0 * AM_KS, *gb = gs + c0 * AM_KS;
        const float *tlb = tl + c0, *tdb = dl + c0;
        if (owns)
            a3_tile_keys(gk, gv, ks, qb, gb, tlb, tdb, dss + c0, A4_DSS, va, kvis, keys, c0, k0, L, p, scale2,
                         dscale, seed, step, salt, bh, keep, lane, g, t);
    }
    a2_wait0();        // the empty groups past L
    __syncthreads();   // dss is full; Q and dO are no longer read
}

// dK (gk times scale) and dV (gv) of the warp's keys k0 .. out through its
// rows of qs and gs, once a4_head_keys has returned.
__device__ __forceinline__ void a4_put_dkv(unsigned short *qs, unsigned short *gs, st_t *dk, st_t *dv, int ldg,
                                           const float gk[AT_D / 8][4], const float gv[AT_D / 8][4], int b, int h,
                                           int k0, int L, float scale, int lane)
{
    a3_put_rows(qs + k0 * AM_KS, dk, ldg, b, h, k0, L, gk, scale, lane);
    a3_put_rows(gs + k0 * AM_KS, dv, ldg, b, h, k0, L, gv, 1.0f, lane);
}

// dQ = dS K for the warp's queries k0 .. k0 + 15, every column, from the
// full dss and ks: key chunks in pairs, both loaded before their products.
__device__ __forceinline__ void a4_dq(float acc[AT_D / 8][4], const unsigned short *dss, const unsigned short *ks,
                                      int k0, int L, int lane)
{
    int nkc = (L + 15) / 16;   // 16-key chunks of dQ's sum
#pragma unroll
    for (int nd = 0; nd < AT_D / 8; nd++)
#pragma unroll
        for (int c = 0; c < 4; c++) acc[nd][c] = 0.0f;
#pragma unroll
    for (int kc = 0; kc < A3_KEYS / 16; kc += 2) {
        if (kc >= nkc) break;
        u32 a[2][4], f[2][AT_D / 16][4];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            a2_ldm4t(a[i], a2_nk(dss, 16 * (kc + i), k0, lane, A4_DSS));
#pragma unroll
            for (int np = 0; np < AT_D / 16; np++) a2_ldm4t(f[i][np], a2_kn(ks, 16 * (kc + i), 16 * np, lane));
        }
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int np = 0; np < AT_D / 16; np++) {
                am_mma(acc[2 * np], a[i], f[i][np][0], f[i][np][1]);
                am_mma(acc[2 * np + 1], a[i], f[i][np][2], f[i][np][3]);
            }
    }
}

AT_RUN void attn_mma4_bwd_run(int at_bx, int at_by, int at_bz,
                              st_t *dq, st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *ctx, const st_t *q,
                              const st_t *k, const st_t *v, int ld, const float *lse, const int *mask, int B, int L,
                              float p, u64 seed, u32 step, u32 salt, const unsigned char *keep)
{
    extern __shared__ __align__(128) unsigned char a4_smem[];
    unsigned short *ks = reinterpret_cast<unsigned short *>(a4_smem);   // K of every key
    unsigned short *qs = ks + A3_KEYS * AM_KS;                            // Q of every query (keep bits in the padding)
    unsigned short *gs = qs + A3_KEYS * AM_KS;                            // dO of every query
    unsigned short *dss = gs + A3_KEYS * AM_KS;                           // dS^T, keys x queries
    float *tl = reinterpret_cast<float *>(dss + A3_KEYS * A4_DSS);       // lse of every query
    float *dl = tl + A3_KEYS;                                             // delta of every query
    (void)at_bx;
    int b = at_bz, h = at_by;
    int lane = threadIdx.x & 31, k0 = (threadIdx.x >> 5) * AM_QW;
    float scale = at_scale(), scale2 = scale * A2_LOG2E, dscale = dropout_scale(p);
    a3_prefetch_rows(dctx, ctx, v, ld, b, h, L);
    a4_stage_head(ks, qs, gs, tl, q, k, dctx, lse, keep, ld, b, h, L);
    float gk[AT_D / 8][4], gv[AT_D / 8][4];
    a4_head_keys(gk, gv, ks, qs, gs, dss, tl, dl, dctx, ctx, v, ld, mask, b, h, L, p, scale2, dscale, seed, step,
                 salt, keep);
    if (k0 < L) a4_put_dkv(qs, gs, dk, dv, ldg, gk, gv, b, h, k0, L, scale, lane);
    if (k0 >= L) return;   // no query rows of this warp below L
    float acc[AT_D / 8][4];
    a4_dq(acc, dss, ks, k0, L, lane);
    a3_put_rows(qs + k0 * AM_KS, dq, ldg, b, h, k0, L, acc, scale, lane);
}

#ifndef HPC_ATTN_NO_KERNELS
extern "C" __global__ void __launch_bounds__(256, 2)
KN(attn_mma4_bwd_keep)(st_t *dq, st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *ctx, const st_t *q,
                       const st_t *k, const st_t *v, int ld, const float *lse, const int *mask, int B, int L, float p,
                       u64 seed, u32 step, u32 salt, const unsigned char *keep)
{
    __builtin_assume(keep != nullptr);
    attn_mma4_bwd_run(blockIdx.x, blockIdx.y, blockIdx.z, dq, dk, dv, ldg, dctx, ctx, q, k, v, ld, lse, mask, B, L, p,
                      seed, step, salt, keep);
}
extern "C" __global__ void __launch_bounds__(256, 2)
KN(attn_mma4_bwd)(st_t *dq, st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *ctx, const st_t *q,
                  const st_t *k, const st_t *v, int ld, const float *lse, const int *mask, int B, int L, float p,
                  u64 seed, u32 step, u32 salt)
{
    attn_mma4_bwd_run(blockIdx.x, blockIdx.y, blockIdx.z, dq, dk, dv, ldg, dctx, ctx, q, k, v, ld, lse, mask, B, L, p,
                      seed, step, salt, nullptr);
}
#endif

#endif // 16-bit storage, D a multiple of 16, D <= 64
