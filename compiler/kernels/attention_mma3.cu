// compiler/kernels/attention_mma3.cu — the one-pass tensor-core backward
// (attn_mma3_bwd, the step's default up to L 128 and head size 64) and
// attn_head_bwd_dot (delta per (b, head) above that); builds on
// attention.cu, attention_mma.cu and attention_mma2.cu.

#if HPC_HEAD_DIM <= 128 && HPC_DTYPE != 0 && HPC_HEAD_DIM % 16 == 0

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
//  - K of all keys is staged once, with the first query tile; the saved
//    keep bits of a query tile ride in its Q rows' padding (a3_stage_keep).
//  - dK and dV leave through shared memory in 16-byte pieces (a3_put_rows).
// Two barriers a tile: after the tile lands (which also orders the last
// tile's dQ reads of dss before this tile's stores), and after dss is full
// (which also orders this tile's reads of buffer buf before the next
// prefetch overwrites it).

#define A3_WARPS 8
#define A3_KEYS (A3_WARPS * AM_QW)              // keys one block owns: the largest L it takes
#define A3_DQ_UNITS (2 * (AT_D / 16))          // (16 query x 16 column) pieces of a tile's dQ
#define A3_DSS AM_QTS                          // shared row stride of dS^T
static_assert(A3_KEYS == AT_KEEP_KEYS, "the saved keep bits cover every key of the one-pass backward");

// delta = rowsum(dO * O), for head h of batch row b, in 16-byte pieces:
// piece i is elements 8 (i % (AT_D / 8)) .. + 7 of row i / (AT_D / 8), and
// AT_D / 8 adjacent lanes hold a row.  a3_load_piece loads piece i of dO
// and O; a3_piece_row_sum multiplies a lane's piece and sums over the row's
// lanes, returning the row's sum in every one of them.  Whole warps only.
// A piece past L loads row 0's bytes (the caller zeroes or drops its sum),
// so the loads carry no condition (guarded, NVRTC issued a3_delta_rows's in
// four rounds, one DRAM latency each: 13 % of the one-pass backward's stall
// samples, ncu, H100; unguarded, three).
__device__ __forceinline__ void a3_load_piece(uint4 &gw, uint4 &yw, const st_t *dctx, const st_t *ctx, int b, int h,
                                              int i, int L)
{
    int row = i / (AT_D / 8), c8 = (i % (AT_D / 8)) * 8;
    i64 at = ((i64)b * L + (row < L ? row : 0)) * HPC_HIDDEN + h * AT_D + c8;
    gw = *reinterpret_cast<const uint4 *>(dctx + at);
    yw = *reinterpret_cast<const uint4 *>(ctx + at);
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
        if (i % (AT_D / 8) == 0) dl[i / (AT_D / 8)] = i / (AT_D / 8) < L ? s : 0.0f;
    }
}

// The rows whose loads the one-pass backward's prologue waits for (dO and
// O for delta, V for its fragments) asked into L2 first thing, so that
// those loads, which NVRTC still issues in rounds (three at BERT-base's
// head size), wait for L2 instead of DRAM each round.  One line a thread
// and row (a row of one head is AT_D * 2 <= 128 bytes).
__device__ __forceinline__ void a3_prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
static_assert(32 * A3_WARPS == 2 * A3_KEYS, "two threads a row: one for dO and V, one for O");
__device__ __forceinline__ void a3_prefetch_rows(const st_t *dctx, const st_t *ctx, const st_t *v, int ld, int b,
                                                 int h, int L)
{
    int r = (int)threadIdx.x % A3_KEYS;
    if (r >= L) return;
    i64 row = (i64)b * L + r;
    if ((int)threadIdx.x < A3_KEYS) {
        a3_prefetch_l2(dctx + row * HPC_HIDDEN + h * AT_D);
        a3_prefetch_l2(v + row * ld + h * AT_D);
    } else {
        a3_prefetch_l2(ctx + row * HPC_HIDDEN + h * AT_D);
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
// The saved keep bits of query tile c0 (keep != nullptr) ride with its Q
// rows: row c0 + r's AT_KEEP_BYTES land by cp.async in the 16 bytes of
// padding that end Q row r in qb (qb + r * AM_KS + AT_D), which no
// ldmatrix reads, by the block's second warp; zeros past L.  Read from
// global memory inside the tile's work instead, their latency was 10 % of
// the kernel's stall samples (ncu, H100, BERT-base 256 x 128).
static_assert((AM_KS - AT_D) * 2 == AT_KEEP_BYTES, "a Q row's padding holds the row's keep bits");
__device__ __forceinline__ void a3_stage_keep(unsigned short *qb, const unsigned char *keep, i64 bh, int c0, int L)
{
    int r = (int)threadIdx.x - 32;
    if (r < 0 || r >= AM_QT) return;
    bool in = c0 + r < L;
    a2_cp16(qb + r * AM_KS + AT_D, keep + (bh * L + (in ? c0 + r : 0)) * AT_KEEP_BYTES, in);
}

// The keep bits of keys k0 .. k0 + 15 (k0 a multiple of 16) of tile row r,
// staged by a3_stage_keep: bit k - k0 is key k's.
__device__ __forceinline__ u32 a3_keep_bits16(const unsigned short *qb, int r, int k0)
{
    return qb[r * AM_KS + AT_D + (k0 >> 4)];
}

// The warp's 16 rows of dK (acc times scale) or dV (scale 1) out through
// shared memory: the lane's pairs into the warp's own rows of `stage` (the
// staged K rows k0 .., no longer read), then whole 16-byte pieces of each
// row to global memory, keys below L.  The lane's 4-byte pairs stored
// directly cost about 9 % of the kernel's stall samples (store throttle
// and the drain at exit; ncu, H100).
__device__ __forceinline__ void a3_put_rows(unsigned short *stage, st_t *dst, int ldg, int b, int h, int k0, int L,
                                            const float acc[AT_D / 8][4], float scale, int lane)
{
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; half++)
#pragma unroll
        for (int nd = 0; nd < AT_D / 8; nd++)
            *reinterpret_cast<u32 *>(stage + (g + 8 * half) * AM_KS + nd * 8 + 2 * t) =
                am_pack(acc[nd][2 * half] * scale, acc[nd][2 * half + 1] * scale);
    __syncwarp();
    constexpr int PIECES = AT_D / 8;   // 16-byte pieces a row
#pragma unroll
    for (int i = lane; i < AM_QW * PIECES; i += 32) {
        int r = i / PIECES, c8 = (i % PIECES) * 8;
        if (k0 + r < L)
            *reinterpret_cast<uint4 *>(dst + ((i64)b * L + k0 + r) * ldg + h * AT_D + c8) =
                *reinterpret_cast<const uint4 *>(stage + r * AM_KS + c8);
    }
    __syncwarp();   // the rows are read before the next call overwrites them
}

// The warp's part of the one-pass backward's start, once the first tiles
// are requested: its keys' visibility (kvis) and V rows as A fragments (va;
// K's come from the staged rows, by ldmatrix), delta = rowsum(dO * O) of
// every row into dl (attn_simt_bwd_dot's job, folded in), its dK and dV
// accumulators cleared, and, if it has no key below L, zeros in its rows
// of dS^T (row stride dss_ld): an owning warp writes zeros for its hidden
// keys each tile, so every dS^T row past L is zero and dQ's chunk pairs may
// run one chunk past the last (the K rows there are staged zeros).
__device__ __forceinline__ void a3_warp_start(bool kvis[2], u32 va[AT_D / 16][4], float gk[AT_D / 8][4],
                                              float gv[AT_D / 8][4], float *dl, unsigned short *dss, int dss_ld,
                                              const st_t *v, const st_t *dctx, const st_t *ctx, const int *mask,
                                              int ld, int b, int h, const int keys[2], int k0, int L, int t,
                                              int lane)
{
#pragma unroll
    for (int half = 0; half < 2; half++)
        kvis[half] = keys[half] < L && (!mask || mask[(i64)b * L + keys[half]] != 0);
    am_load_a(va, v, ld, b, h, keys, t, L);
    a3_delta_rows(dl, dctx, ctx, b, h, L);
    if (k0 >= L)
        for (int i = lane; i < AM_QW * dss_ld / 2; i += 32) reinterpret_cast<u32 *>(dss + k0 * dss_ld)[i] = 0u;
#pragma unroll
    for (int nd = 0; nd < AT_D / 8; nd++)
#pragma unroll
        for (int c = 0; c < 4; c++) gk[nd][c] = gv[nd][c] = 0.0f;
}

// One query tile's key work for the warp's 16 keys k0 .. (keys[]: the
// lane's two, k0 + g and + 8) and the tile at query c0 (Q rows qb, dO rows
// gb, lse tlb, delta tdb, AM_QT of each): S^T = K Q^T and dP^T = V dO^T, P,
// Z and dS, then dV += Z^T dO and dK += dS^T Q, in two halves of 16
// queries (hq), so only 16 x 16 of S^T and dP^T are live at a time; dS^T
// (rounded to the storage dtype, as the products use it) is stored at its
// keys' rows of dss (row stride dss_ld, the tile's first query at column 0
// of dss) for dQ.  attn_mma3_bwd and attn_mma4_bwd share it, so their dK
// and dV are the same bits.
__device__ __forceinline__ void a3_tile_keys(float gk[AT_D / 8][4], float gv[AT_D / 8][4], const unsigned short *ks,
                                             const unsigned short *qb, const unsigned short *gb, const float *tlb,
                                             const float *tdb, unsigned short *dss, int dss_ld,
                                             const u32 va[AT_D / 16][4], const bool kvis[2], const int keys[2],
                                             int c0, int k0, int L, float p, float scale2, float dscale, u64 seed,
                                             u32 step, u32 salt, i64 bh, const unsigned char *keep, int lane, int g,
                                             int t)
{
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
        // Keep bits.  Saved by the forward (keep: L is at most A3_KEYS =
        // AT_KEEP_KEYS here): the lane reads the 16 bits of the warp's
        // keys for each of its four query rows from the tile (rows past L
        // read zeros, hidden below).  Drawn, as attn_mma2_bwd_dkv: lane
        // draws the 8 keys k0 + 8 (lane & 1) .. + 7 of query nt * 8 +
        // ((lane & 15) >> 1), nt = 2 hq + (lane >> 4), and the lanes
        // exchange them by shuffles.
        u32 mine = 0xFFu, kw[2];   // kw[j]: rows nt * 8 + 2 t (low half) and + 1 (high half)
        if (p != 0.0f && keep != nullptr) {
#pragma unroll
            for (int j = 0; j < 2; j++) {
                int r = (2 * hq + j) * 8 + 2 * t;
                kw[j] = a3_keep_bits16(qb, r, k0) | a3_keep_bits16(qb, r + 1, k0) << 16;
            }
        } else if (p != 0.0f) {
            int r = (2 * hq + (lane >> 4)) * 8 + ((lane & 15) >> 1);
            mine = am_bits8((bh * L + c0 + r) * L + k0 + 8 * (lane & 1), p, seed, step, salt);
        }
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int nt = 2 * hq + j, qi = 2 * t + (c & 1), half = c >> 1, row = c0 + nt * 8 + qi;
                u32 w = 0xFFu;   // bit g: the element's keep bit
                if (p != 0.0f && keep != nullptr) w = kw[j] >> (16 * (c & 1) + 8 * half);
                else if (p != 0.0f) w = __shfl_sync(0xffffffffu, mine, (j << 4) | (qi << 1) | half);
                // Branch-free: the exponential of a hidden element is
                // computed and then replaced by 0 (a select, so a NaN there
                // cannot leak).  Rows past L read the staged zeros and row
                // 0's lse.
                int r = nt * 8 + qi;
                bool on = row < L && kvis[half] && !(HPC_CAUSAL && keys[half] > row);
                float pe = a2_exp2(st[j][c] * scale2 - tlb[r] * A2_LOG2E);
                pe = on ? pe : 0.0f;
                float kf = (w >> g) & 1u ? dscale : 0.0f;
                st[j][c] = pe * kf;
                dpt[j][c] = pe * (dpt[j][c] * kf - tdb[r]);
            }
        u32 za[4], sa[4];
        am_frag_a(za, st);
        am_frag_a(sa, dpt);
        // dS^T for dQ: sa[i] is keys k0 + g (+ 8 for i odd), queries 16 hq + 2t (+ 8 for i >= 2).
#pragma unroll
        for (int i = 0; i < 4; i++)
            *reinterpret_cast<u32 *>(dss + (k0 + g + 8 * (i & 1)) * dss_ld + 16 * hq + 8 * (i >> 1) + 2 * t) = sa[i];
        a2_mma_dkv(gk, gv, za, sa, qb, gb, 16 * hq, lane);
    }
}

AT_RUN void attn_mma3_bwd_run(int at_bx, int at_by, int at_bz,
                              st_t *dq, st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *ctx, const st_t *q,
                              const st_t *k, const st_t *v, int ld, const float *lse, const int *mask, int B, int L,
                              float p, u64 seed, u32 step, u32 salt, const unsigned char *keep)
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
    a3_prefetch_rows(dctx, ctx, v, ld, b, h, L);
    a2_stage(ks, k, ld, b, h, 0, A3_KEYS, L, 32 * A3_WARPS);
    // no delta tile: a3_delta_rows computes every row's below
    a2_stage_q(qs[0], gs[0], tl[0], nullptr, q, dctx, lse, nullptr, ld, b, h, bh, 0, L, false, 32 * A3_WARPS);
    if (keep != nullptr) a3_stage_keep(qs[0], keep, bh, 0, L);
    a2_commit();

    bool kvis[2];
    u32 va[AT_D / 16][4];
    float gk[AT_D / 8][4], gv[AT_D / 8][4];
    a3_warp_start(kvis, va, gk, gv, dl, dss, A3_DSS, v, dctx, ctx, mask, ld, b, h, keys, k0, L, t, lane);

    for (int c0 = 0, it = 0; c0 < L; c0 += AM_QT, it++) {
        int buf = it & 1;
        if (c0 + AM_QT < L) {
            a2_stage_q(qs[buf ^ 1], gs[buf ^ 1], tl[buf ^ 1], nullptr, q, dctx, lse, nullptr, ld, b, h, bh,
                       c0 + AM_QT, L, false, 32 * A3_WARPS);
            if (keep != nullptr) a3_stage_keep(qs[buf ^ 1], keep, bh, c0 + AM_QT, L);
        }
        a2_commit();
        a2_wait1();
        __syncthreads();
        const unsigned short *qb = qs[buf], *gb = gs[buf];
        const float *tlb = tl[buf], *tdb = dl + c0;

        if (owns)
            a3_tile_keys(gk, gv, ks, qb, gb, tlb, tdb, dss, A3_DSS, va, kvis, keys, c0, k0, L, p, scale2, dscale,
                         seed, step, salt, bh, keep, lane, g, t);
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
                // Chunk pairs: both chunks' fragments are loaded before
                // their products (one exposed ldmatrix latency a pair, not
                // two); the odd chunk past nkc adds dS rows of zeros.
                if (kc >= nkc) break;
                u32 a[4], f[4], a1[4], f1[4];
                a2_ldm4t(a, a2_nk(dss, 16 * kc, mq, lane, A3_DSS));
                a2_ldm4t(f, a2_kn(ks, 16 * kc, nc, lane));
                a2_ldm4t(a1, a2_nk(dss, 16 * (kc + 1), mq, lane, A3_DSS));
                a2_ldm4t(f1, a2_kn(ks, 16 * (kc + 1), nc, lane));
                am_mma(acc[0], a, f[0], f[1]);
                am_mma(acc[1], a, f[2], f[3]);
                am_mma(acc2[0], a1, f1[0], f1[1]);
                am_mma(acc2[1], a1, f1[2], f1[3]);
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
    a2_wait0();
    __syncthreads();   // the last tile's dQ reads of ks are done: its rows stage dK and dV
    if (!owns) return;
    a3_put_rows(ks + k0 * AM_KS, dk, ldg, b, h, k0, L, gk, scale, lane);
    a3_put_rows(ks + k0 * AM_KS, dv, ldg, b, h, k0, L, gv, 1.0f, lane);
}
#ifndef HPC_ATTN_NO_KERNELS
extern "C" __global__ void __launch_bounds__(256)
KN(attn_mma3_bwd)(st_t *dq, st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *ctx, const st_t *q,
                  const st_t *k, const st_t *v, int ld, const float *lse, const int *mask, int B, int L, float p,
                  u64 seed, u32 step, u32 salt)
{
    attn_mma3_bwd_run(blockIdx.x, blockIdx.y, blockIdx.z, dq, dk, dv, ldg, dctx, ctx, q, k, v, ld, lse, mask, B, L, p,
                      seed, step, salt, nullptr);
}
// The same body held to 128 registers (two blocks an SM): timed beside it by
// tests/gpu/gpu_attention.c to choose the step's launch bounds.
extern "C" __global__ void __launch_bounds__(256, 2)
KN(attn_mma3_bwd_r128)(st_t *dq, st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *ctx, const st_t *q,
                       const st_t *k, const st_t *v, int ld, const float *lse, const int *mask, int B, int L, float p,
                       u64 seed, u32 step, u32 salt)
{
    attn_mma3_bwd_run(blockIdx.x, blockIdx.y, blockIdx.z, dq, dk, dv, ldg, dctx, ctx, q, k, v, ld, lse, mask, B, L, p,
                      seed, step, salt, nullptr);
}
// The step's phase under HPC_ATTN_KEEP=1: the keep bits attn_mma2_fwd_keep
// saved instead of the draws (never null, so the Philox code goes).
extern "C" __global__ void __launch_bounds__(256, 2)
KN(attn_mma3_bwd_keep)(st_t *dq, st_t *dk, st_t *dv, int ldg, const st_t *dctx, const st_t *ctx, const st_t *q,
                       const st_t *k, const st_t *v, int ld, const float *lse, const int *mask, int B, int L, float p,
                       u64 seed, u32 step, u32 salt, const unsigned char *keep)
{
    __builtin_assume(keep != nullptr);
    attn_mma3_bwd_run(blockIdx.x, blockIdx.y, blockIdx.z, dq, dk, dv, ldg, dctx, ctx, q, k, v, ld, lse, mask, B, L, p,
                      seed, step, salt, keep);
}
#endif
#endif // AT_D <= 64

#endif // 16-bit storage, D a multiple of 16, D <= 128
