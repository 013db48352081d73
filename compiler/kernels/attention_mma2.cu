// compiler/kernels/attention_mma2.cu — fused attention, second tensor-core
// family (v2: attn_mma2_fwd, the step's forward, and attn_mma2_bwd_dq /
// attn_mma2_bwd_dkv, its backward above L 128 or head size 64) and the
// cp.async / ldmatrix helpers (a2_*) the one-pass backward shares; builds
// on attention.cu and attention_mma.cu.

#if HPC_HEAD_DIM <= 128 && HPC_DTYPE != 0 && HPC_HEAD_DIM % 16 == 0

// == Tensor-core kernels, second variant (HPC_ATTN_KERNELS=v2) ==
//
// attn_mma2_fwd, attn_mma2_bwd_dq, attn_mma2_bwd_dkv: the contract, the
// grids and the work split of attn_mma_* (attention_mma.cu), and the same
// dropout draws (am_bits8), with the staging rewritten:
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

// K, V and the mask of the key tile at t0 into one buffer (not committed).
__device__ __forceinline__ void a2_stage_kv(unsigned short *kb, unsigned short *vb, int *visb, const st_t *k,
                                            const st_t *v, const int *mask, int ld, int b, int h, int t0, int L)
{
    a2_stage(kb, k, ld, b, h, t0, AM_KT, L);
    a2_stage(vb, v, ld, b, h, t0, AM_KT, L);
    a2_stage_mask(visb, mask, b, t0, L);
}

// The key tile at t0 (tile it of ntiles) is in buffer buf once this returns
// and the caller's barrier follows: with two buffers it was prefetched (the
// previous call, or before the loop) and tile it + 1 is fetched now into
// the other; with one, it is fetched and waited for.
__device__ __forceinline__ void a2_fetch_kv(unsigned short (*ks)[AM_KT * AM_KS], unsigned short (*vs)[AM_KT * AM_KS],
                                            int (*vis)[AM_KT], const st_t *k, const st_t *v, const int *mask, int ld,
                                            int b, int h, int t0, int buf, int it, int ntiles, int L)
{
    if (A2_NBUF == 2) {
        if (it + 1 < ntiles)
            a2_stage_kv(ks[buf ^ 1], vs[buf ^ 1], vis[buf ^ 1], k, v, mask, ld, b, h, t0 + AM_KT, L);
        a2_commit();
        a2_wait1();
    } else {
        a2_stage_kv(ks[0], vs[0], vis[0], k, v, mask, ld, b, h, t0, L);
        a2_commit();
        a2_wait0();
    }
}

// Query tile c0 into one buffer of the dK/dV kernels: Q, dO, lse and, if
// with_delta, delta, by the block's first nthr threads (not committed).
// A flag, not a test of tdb: the test stayed in the compiled kernel.
__device__ __forceinline__ void a2_stage_q(unsigned short *qb, unsigned short *gb, float *tlb, float *tdb,
                                           const st_t *q, const st_t *dctx, const float *lse, const float *delta,
                                           int ld, int b, int h, i64 bh, int c0, int L, bool with_delta,
                                           int nthr = 128)
{
    a2_stage(qb, q, ld, b, h, c0, AM_QT, L, nthr);
    a2_stage(gb, dctx, HPC_HIDDEN, b, h, c0, AM_QT, L, nthr);
    if (threadIdx.x < AM_QT) {
        int row = c0 + threadIdx.x;
        bool in = row < L;
        a2_cp4(&tlb[threadIdx.x], lse + bh * L + (in ? row : 0), in);
        if (with_delta) a2_cp4(&tdb[threadIdx.x], delta + bh * L + (in ? row : 0), in);
    }
}

// S = A X^T and S2 = A2 X2^T for the warp's 16 rows against staged tiles
// of N rows (row-major, read without .trans): Q K^T and dO V^T of the dQ
// kernel (N = AM_KT), K Q^T and V dO^T of the dK/dV kernel (N = AM_QT).
template <int N>
__device__ __forceinline__ void a2_mma_nt2(float s[N / 8][4], float s2[N / 8][4], const u32 a[AT_D / 16][4],
                                           const u32 a2[AT_D / 16][4], const unsigned short *xb,
                                           const unsigned short *x2b, int lane)
{
#pragma unroll
    for (int nt = 0; nt < N / 8; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) s[nt][c] = s2[nt][c] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < AT_D / 16; kk++)
#pragma unroll
        for (int np = 0; np < N / 16; np++) {
            u32 f[4], e[4];
            a2_ldm4(f, a2_nk(xb, 16 * np, 16 * kk, lane));
            a2_ldm4(e, a2_nk(x2b, 16 * np, 16 * kk, lane));
            am_mma(s[2 * np], a[kk], f[0], f[1]);
            am_mma(s[2 * np + 1], a[kk], f[2], f[3]);
            am_mma(s2[2 * np], a2[kk], e[0], e[1]);
            am_mma(s2[2 * np + 1], a2[kk], e[2], e[3]);
        }
}

// acc += P X for the warp's 16 rows: P the score-shaped accumulators of a
// key tile (s[nt], 8-key tile nt), X the tile staged row-major (keys x D),
// read with .trans.
__device__ __forceinline__ void a2_mma_pv(float acc[AT_D / 8][4], const float s[AM_KT / 8][4],
                                          const unsigned short *xb, int lane)
{
#pragma unroll
    for (int kc = 0; kc < AM_KT / 16; kc++) {
        u32 pa[4];
        am_frag_a(pa, s + 2 * kc);
#pragma unroll
        for (int np = 0; np < AT_D / 16; np++) {
            u32 f[4];
            a2_ldm4t(f, a2_kn(xb, 16 * kc, 16 * np, lane));
            am_mma(acc[2 * np], pa, f[0], f[1]);
            am_mma(acc[2 * np + 1], pa, f[2], f[3]);
        }
    }
}

// dV += Z^T dO and dK += dS^T Q over 16 queries from row r0 of the staged
// Q and dO tiles (qb, gb), za and sa the A fragments of Z^T and dS^T.
__device__ __forceinline__ void a2_mma_dkv(float gk[AT_D / 8][4], float gv[AT_D / 8][4], const u32 za[4],
                                           const u32 sa[4], const unsigned short *qb, const unsigned short *gb, int r0,
                                           int lane)
{
#pragma unroll
    for (int np = 0; np < AT_D / 16; np++) {
        u32 f[4], e[4];
        a2_ldm4t(e, a2_kn(gb, r0, 16 * np, lane));
        a2_ldm4t(f, a2_kn(qb, r0, 16 * np, lane));
        am_mma(gv[2 * np], za, e[0], e[1]);
        am_mma(gv[2 * np + 1], za, e[2], e[3]);
        am_mma(gk[2 * np], sa, f[0], f[1]);
        am_mma(gk[2 * np + 1], sa, f[2], f[3]);
    }
}

// One key tile of the forward for the warp's 16 query rows (rows[2], flat
// their dropout draws' base): S = Q K^T from the staged tile kb, the
// online softmax's maxima m and sums l, P with the dropout applied, and
// o += P V from vb.  all_see: every key of the tile is visible to every row
// of the block (no masking); it: the tile's index (o is still 0 at 0).
// keep: as attn_mma2_fwd_run says.
__device__ __forceinline__ void a2_fwd_tile(float o[AT_D / 8][4], float m[2], float l[2], const u32 qa[AT_D / 16][4],
                                            const unsigned short *kb, const unsigned short *vb, const int *vb_vis,
                                            bool all_see, int it, int t0, const int rows[2], const i64 flat[2],
                                            int lane, int t, float scale2, float p, u64 seed, u32 step, u32 salt,
                                            unsigned char *keep, i64 bh, int L)
{
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
    if (it > 0) am_rescale(o, corr);   // before the first tile o is still 0
    u32 kbits[2][AM_KT / 8], mine[2][2];
    am_keep_bits(kbits, mine, flat, t0, lane, t, p, seed, step, salt);
    if (keep != nullptr && p != 0.0f && L <= AT_KEEP_KEYS) am_store_keep(keep, mine, rows, bh, t0, t, L);
#pragma unroll
    for (int nt = 0; nt < AM_KT / 8; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            int rr = c >> 1;
            float pe = a2_exp2(fmaf(s[nt][c], scale2, -mref[rr]));
            l[rr] += pe;
            s[nt][c] = (kbits[rr][nt] >> (c & 1)) & 1u ? pe : 0.0f;   // 1/(1-p) with 1/l at the end
        }
    a2_mma_pv(o, s, vb, lane);
}

// The forward's end for the warp's rows: ctx = o / l (with the dropout's
// 1/(1-p)), and lse (+inf for a row that sees no key).
__device__ __forceinline__ void a2_fwd_finish(st_t *ctx, float *lse, float o[AT_D / 8][4], float m[2], float l[2],
                                              const int rows[2], int b, int h, int t, int L, float scale2, float dscale)
{
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
        l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
        int row = rows[rr];
        if (row >= L) continue;
        float inv = l[rr] == 0.0f ? 0.0f : dscale / l[rr];
        am_put_row(ctx, HPC_HIDDEN, b, h, row, L, o, rr, inv, t);
        if (t == 0)
            lse[((i64)b * HPC_HEADS + h) * L + row] =
                l[rr] == 0.0f ? HPC_INF : (m[rr] * scale2 + log2f(l[rr])) * A2_LN2;
    }
}

// keep (nullptr: none): the dropout's keep bits for the backward, AT_KEEP_BYTES
// a query row (bit k % 8 of byte k / 8: key k), written where L is at most
// AT_KEEP_KEYS (compiler/fuse_attn_keep.c); attn_mma3_bwd reads them.
AT_RUN void attn_mma2_fwd_run(int at_bx, int at_by, int at_bz,
                              st_t *ctx, float *lse, const st_t *q, const st_t *k, const st_t *v, int ld,
                              const int *mask, int B, int L, float p, u64 seed, u32 step, u32 salt,
                              unsigned char *keep)
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
        a2_stage_kv(ks[0], vs[0], vis[0], k, v, mask, ld, b, h, 0, L);
        a2_commit();
    }

    u32 qa[AT_D / 16][4];
    am_load_a(qa, q, ld, b, h, rows, t, L);
    float o[AT_D / 8][4];
#pragma unroll
    for (int nd = 0; nd < AT_D / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    float m[2] = {HPC_NEG_INF, HPC_NEG_INF}, l[2] = {0.0f, 0.0f};

    for (int it = 0; it < ntiles; it++) {
        int t0 = it * AM_KT, buf = A2_NBUF == 2 ? (it & 1) : 0;
        a2_fetch_kv(ks, vs, vis, k, v, mask, ld, b, h, t0, buf, it, ntiles, L);
        // Thread j staged vis[buf][j] itself, so it may read it before the
        // barrier; the barrier's AND says whether every key of the tile is
        // visible to every row of the block (the common case: then the
        // scores need no per-element masking).
        bool see_mine = threadIdx.x >= AM_KT || vis[buf][threadIdx.x] != 0;
#if HPC_CAUSAL
        see_mine = see_mine && t0 + AM_KT - 1 <= at_bx * AM_QB;
#endif
        bool all_see = __syncthreads_and(see_mine) != 0;
        a2_fwd_tile(o, m, l, qa, ks[buf], vs[buf], vis[buf], all_see, it, t0, rows, flat, lane, t, scale2, p, seed,
                    step, salt, keep, (i64)b * HPC_HEADS + h, L);
        __syncthreads();   // buffer buf is refilled by the next iteration's prefetch
    }
    a2_fwd_finish(ctx, lse, o, m, l, rows, b, h, t, L, scale2, dscale);
}

#ifndef HPC_ATTN_NO_KERNELS
extern "C" __global__ void __launch_bounds__(128)
KN(attn_mma2_fwd)(st_t *ctx, float *lse, const st_t *q, const st_t *k, const st_t *v, int ld,
                  const int *mask, int B, int L, float p, u64 seed, u32 step, u32 salt)
{
    attn_mma2_fwd_run(blockIdx.x, blockIdx.y, blockIdx.z, ctx, lse, q, k, v, ld, mask, B, L, p, seed, step, salt,
                      nullptr);
}
// The same, saving the dropout's keep bits (B x NH x L rows of
// AT_KEEP_BYTES) for attn_mma3_bwd_keep: HPC_ATTN_KEEP=1 in the step.
extern "C" __global__ void __launch_bounds__(128)
KN(attn_mma2_fwd_keep)(st_t *ctx, float *lse, const st_t *q, const st_t *k, const st_t *v, int ld,
                       const int *mask, int B, int L, float p, u64 seed, u32 step, u32 salt, unsigned char *keep)
{
    attn_mma2_fwd_run(blockIdx.x, blockIdx.y, blockIdx.z, ctx, lse, q, k, v, ld, mask, B, L, p, seed, step, salt, keep);
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
        a2_stage_kv(ks[0], vs[0], vis[0], k, v, mask, ld, b, h, 0, L);
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
    am_load_a2(qa, q, ld, ga, dctx, HPC_HIDDEN, b, h, rows, t, L);
    float acc[AT_D / 8][4];
#pragma unroll
    for (int nd = 0; nd < AT_D / 8; nd++) acc[nd][0] = acc[nd][1] = acc[nd][2] = acc[nd][3] = 0.0f;

    for (int it = 0; it < ntiles; it++) {
        int t0 = it * AM_KT, buf = A2_NBUF == 2 ? (it & 1) : 0;
        a2_fetch_kv(ks, vs, vis, k, v, mask, ld, b, h, t0, buf, it, ntiles, L);
        __syncthreads();
        const unsigned short *kb = ks[buf], *vb = vs[buf];
        const int *vb_vis = vis[buf];

        float sc[AM_KT / 8][4], dp[AM_KT / 8][4];
        a2_mma_nt2<AM_KT>(sc, dp, qa, ga, kb, vb, lane);
        u32 kbits[2][AM_KT / 8], mine[2][2];
        am_keep_bits(kbits, mine, flat, t0, lane, t, p, seed, step, salt);
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
        a2_mma_pv(acc, sc, kb, lane);
        __syncthreads();
    }
#pragma unroll
    for (int rr = 0; rr < 2; rr++) {
        int row = rows[rr];
        if (row >= L) continue;
        am_put_row(dq, ldg, b, h, row, L, acc, rr, scale, t);
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
    if (c_first < c_end)
        a2_stage_q(qs[0], gs[0], tl[0], td[0], q, dctx, lse, delta, ld, b, h, bh, c_first, L, true);
    a2_commit();

    bool kvis[2];
    u32 ka[AT_D / 16][4], va[AT_D / 16][4];
#pragma unroll
    for (int half = 0; half < 2; half++)
        kvis[half] = keys[half] < L && (!mask || mask[(i64)b * L + keys[half]] != 0);
    am_load_a2(ka, k, ld, va, v, ld, b, h, keys, t, L);
    float gk[AT_D / 8][4], gv[AT_D / 8][4];
#pragma unroll
    for (int nd = 0; nd < AT_D / 8; nd++)
#pragma unroll
        for (int c = 0; c < 4; c++) gk[nd][c] = gv[nd][c] = 0.0f;

    for (int c0 = c_first, it = 0; c0 < c_end; c0 += AM_QT, it++) {
        int buf = it & 1;
        if (c0 + AM_QT < c_end)
            a2_stage_q(qs[buf ^ 1], gs[buf ^ 1], tl[buf ^ 1], td[buf ^ 1], q, dctx, lse, delta, ld, b, h, bh,
                       c0 + AM_QT, L, true);
        a2_commit();
        a2_wait1();
        __syncthreads();
        const unsigned short *qb = qs[buf], *gb = gs[buf];
        const float *tlb = tl[buf], *tdb = td[buf];

        // S^T (16 keys x 32 queries) and dP^T = V dO^T.
        float st[AM_QT / 8][4], dpt[AM_QT / 8][4];
        a2_mma_nt2<AM_QT>(st, dpt, ka, va, qb, gb, lane);
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
            u32 za[4], sa[4];
            am_frag_a(za, st + 2 * kc);
            am_frag_a(sa, dpt + 2 * kc);
            a2_mma_dkv(gk, gv, za, sa, qb, gb, 16 * kc, lane);
        }
        __syncthreads();   // buffer buf is refilled by the next iteration's prefetch
    }
    a2_wait0();
    am_put_dkv(dk, dv, ldg, b, h, keys, L, t, gk, gv, scale);
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

#endif // 16-bit storage, D a multiple of 16, D <= 128
