// compiler/kernels/gemm_wgmma_pp.cu — C = A W^T + bias (and G = gelu(C))
// as gemm_wgmma_tma.cu's _ts kernels compute it, scheduled so that a
// tile's epilogue runs while the tensor cores multiply the next tile
// ("ping-pong").  In gemm_wgmma_tma.cu both multiplying warpgroups share
// one 128 x 256 tile, so the tensor cores wait for every epilogue: with
// the GELU's erf that made the fused FFN-up GEMM about 40 % slower than
// the plain one (gpu_gemm, H100, 2026-12-05).  Here each multiplying
// warpgroup owns whole 128 x 128 tiles, and the two take turns: one
// multiplies while the other adds the bias, computes the GELU and hands
// its tile to the TMA store.  Used by the step under HPC_GEMM_OWN with
// HPC_GEMM_OWN_STORE=pingpong (runtime/cuda/gemm_own.h); tests/gpu/gpu_gemm.c
// checks it and times it beside the others.
//
// gemm_pp_dx_dgelu_f16 computes the GELU backward's dU = round(dY W) *
// gelu'(u) in the same schedule, as gemm_wgmma_tma.cu's gemm_tma_dx_dgelu_f16
// does with a shared tile: W N-major (a linear's weight as stored, read as
// TMA boxes of 64 n by 64 k rows), u loaded by the TMA into the staging
// where dU is then written over it, and beside dU gelu(u) (for the FFN's
// second dW GEMM) and the column sums of the stored dU over each 16, 32
// or 64 rows (for the bias gradient: the partial sums of the step's
// ACT_BWD_BGRAD, program/act_parts.h).
//
// Needs gemm_wgmma_tma.cu's text before it (the gt_ helpers: mbarriers,
// TMA loads and stores, the swizzled descriptor, gt_pack, gt_h2f) and
// act_gelu.  N a multiple of 128, K of 64, M any (the TMA reads zeros past
// M and its stores clip there).  A, W, C and G (and u) come as tensor maps
// (cuTensorMapEncodeTiled: f16, the 128-byte swizzle; boxes {64, 128}
// for A and W, {64, 64} for C, G, u and W N-major), passed by value.
//
// A block of 384 threads: warpgroup 0 loads (one thread issues the TMA
// copies), warpgroups 1 and 2 multiply.  The block's tiles j = 0, 1, 2, ...
// (tile blockIdx.x + j gridDim.x, row-major over (M / 128, N / 128)) go to
// warpgroup 1 + j % 2.  The loader fills one ring of GP_STAGES stages in
// the order of j; a stage is released by the 128 threads of the warpgroup
// whose tile it holds.  `turn[w]` orders the multiplications: warpgroup w
// starts tile j's only after the other has issued all of tile j - 1's.
// Besides taking turns at the tensor cores, that keeps a warpgroup's waits
// on the ring within one phase of it (a parity wait cannot tell phase p
// from phase p + 2).
//
// The epilogue, in four rounds of 64 rows by 64 columns: each writes C's
// box (bias added, rounded to f16) and G's (gelu of the rounded values)
// into one half of the warpgroup's 32 KiB staging (the 128-byte swizzle,
// as gemm_wgmma_tma.cu stages them), after which one of its threads
// issues the TMA stores.  The halves alternate: a round first waits until
// the TMA has read the round's before last (`freed`), and the issuing
// thread until all 128 have written (`written`).  The dX kernel
// has the TMA load the tile's u into the staging before its MMAs
// (`uready`), writes dU over it and stores all 128 rows, then writes
// gelu(u) there and stores that.
//
// Launch: grid (min(tiles, SMs)), 384 threads, GP_SMEM_BYTES of dynamic
// shared memory (cuFuncSetAttribute first).

#define GP_BM 128
#define GP_BN 128
#define GP_BK 64
#define GP_STAGES 5
#define GP_THREADS 384
#define GP_A_BYTES (GP_BM * GP_BK * 2)
#define GP_W_BYTES (GP_BN * GP_BK * 2)
#define GP_STAGE_BYTES (GP_A_BYTES + GP_W_BYTES)
#define GP_HALF_BYTES (64 * GP_BN * 2)   // 64 rows of one output
#define GP_BOX_BYTES (64 * 64 * 2)       // 64 rows by 64 columns: a TMA box of C, G or u
#define GP_ROUND_BYTES (2 * GP_BOX_BYTES)   // a bias kernel's round: C's box and G's
#define GP_STAGING_BYTES (2 * GP_HALF_BYTES)
#define GP_SMEM_BYTES (GP_STAGES * GP_STAGE_BYTES + 2 * GP_STAGING_BYTES + 1024 + (2 * GP_STAGES + 10) * 8)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GP_D8(o) "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), \
                 "+f"(d[o + 6]), "+f"(d[o + 7])
// d[O..O + 63] (64 rows by 128 columns, 64 f32 a thread) += A (64 x 16,
// descriptor da) B (16 x 128, descriptor db; TRANS_B 0: K-major, 1: N-major)
#define GP_MMA(O, da, db, TRANS_B)                                                                           \
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "                                        \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                    \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "           \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "           \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "          \
                 "%64, %65, 1, 1, 1, 0, " #TRANS_B ";\n"                                                      \
                 : GP_D8(O), GP_D8(O + 8), GP_D8(O + 16), GP_D8(O + 24), GP_D8(O + 32), GP_D8(O + 40),       \
                   GP_D8(O + 48), GP_D8(O + 56)                                                               \
                 : "l"(da), "l"(db))
// The same with the descriptors given by their low words (the start and
// LBO fields: 32-bit arithmetic on them is all that changes from one MMA to
// the next) and GT_DESC_HI, the high word gt_desc and gt_desc_nmajor share.
#define GP_MMA_LO(O, alo, blo, TRANS_B)                                                                     \
    GP_MMA(O, ((unsigned long long)GT_DESC_HI << 32) | (unsigned long long)(alo),                            \
           ((unsigned long long)GT_DESC_HI << 32) | (unsigned long long)(blo), TRANS_B)
#else
#define GP_MMA(O, da, db, TRANS_B) (void)(da), (void)(db)
#define GP_MMA_LO(O, alo, blo, TRANS_B) (void)(alo), (void)(blo)
#endif

// What a kernel computes (as gemm_wgmma_tma.cu's GT_ kinds): C = A W^T +
// bias; that and G = gelu(C); or dU = round(A W, W N-major) * gelu'(u)
// with gelu(u) and dU's column sums beside it.
enum { GP_BIAS, GP_BIAS_GELU, GP_DX_DGELU };

// The tensor maps and pointers of an epilogue: tc stores C (dU), tg G
// (gelu(u); may be 0 for the dX kernel), tu loads u; part (may be 0) gets
// the column sums of the stored dU over each part_rows rows (row group
// r = row / part_rows at part[r * n + column], for r < ceil(m /
// part_rows)).
struct gp_out {
    const gt_tmap *tc, *tg, *tu;
    const unsigned short *bias;
    float *part;
    int part_rows;   // 16, 32 or 64
    int m, n;
};

// A staging round's start (`freed`, phase uses - 1): the last round's
// stores must have read the staging before it is written again, or with
// two_buffers the round's before last (the bias kernels' rounds
// alternate between two buffers).
__device__ __forceinline__ void gp_staging_free(unsigned long long *freed, unsigned uses, bool issuer,
                                                bool two_buffers)
{
    if (uses == 0) return;
    if (issuer) {
        if (two_buffers)
            gt_bulk_wait_read_but_last();
        else
            gt_bulk_wait_read();
        gt_arrive(gt_shared(freed));
    }
    gt_wait(gt_shared(freed), (uses - 1) & 1);
}

// A dX staging round's end: every thread's writes made visible to the TMA,
// then (one thread, once all 128 have written: `written`, phase uses;
// with all_wait every thread waits so) the staging's first half (two
// 64-column boxes) stored at (n0, row_a) of ta, and its second half at
// (n0, row_b) of tb unless tb is 0.
__device__ __forceinline__ void gp_staging_store(const gt_tmap *ta, int row_a, const gt_tmap *tb, int row_b,
                                                 const unsigned char *out, unsigned long long *written, unsigned uses,
                                                 bool issuer, bool all_wait, int n0)
{
    gt_fence_async_shared();
    gt_arrive(gt_shared(written));
    if (all_wait || issuer) gt_wait(gt_shared(written), uses & 1);
    if (!issuer) return;
#pragma unroll
    for (int box = 0; box < 2; box++) {
        gt_tma_store(ta, n0 + 64 * box, row_a, gt_shared(out + box * GP_BOX_BYTES));
        if (tb) gt_tma_store(tb, n0 + 64 * box, row_b, gt_shared(out + GP_HALF_BYTES + box * GP_BOX_BYTES));
    }
    gt_bulk_commit();
}

// Where the f16 pair of columns 8 j + 2 q of row r (of 64) lies in a
// staging half: 4 bytes at chunk j % 8 of box j / 8 in the 128-byte
// swizzle; r & 7 = lane / 4 spreads a warp's 32 stores over all 32 banks.
__device__ __forceinline__ unsigned gp_at(int r, int j, int q)
{
    return (unsigned)((j >> 3) * GP_BOX_BYTES + r * 128 + (((j & 7) ^ (r & 7)) << 4) + 4 * q);
}

// The 8 x 8 blocks of f16 pairs a thread holds of one staging half, four
// at a time: chunks j and j + 1 (16 bytes of a row each: columns 8 j ..
// 8 j + 15) of rows 16 w .. 16 w + 15 (w the thread's warp), in the order
// of the accumulator's pairs d[4 j + 2 h ..]: (j, h 0), (j, h 1), (j + 1,
// h 0), (j + 1, h 1).  ldmatrix / stmatrix move them in one instruction
// where 32-bit loads and stores take four; gp_x4_at is where this lane's
// row of its block lies (lanes 8 b .. 8 b + 7 give block b's rows).
__device__ __forceinline__ unsigned gp_x4_at(int j)
{
    const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
    return gp_at(16 * w + 8 * ((lane >> 3) & 1) + (lane & 7), j + (lane >> 4), 0);
}
__device__ __forceinline__ void gp_ldsm_x4(unsigned r[4], const unsigned char *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(gt_shared(p))
                 : "memory");
}
__device__ __forceinline__ void gp_stsm_x4(unsigned char *p, const unsigned r[4])
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 ::"r"(gt_shared(p)), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                 : "memory");
}

// The epilogue of one warpgroup's tile at (m0, n0) for the bias kernels:
// d (rows 0..63 in d[0..63], rows 64..127 in d[64..127]; d[64 r + 4 j +
// 2 h + e] is the tile's (64 r + r0 + 8 h, 8 j + 2 q + e)) + bias to C,
// and with GELU its gelu to G, in four rounds of 64 rows by 64 columns
// (half = round / 2, box = round % 2).  A round writes C's box and G's
// into one of the staging's two 16 KiB buffers, then one thread issues
// their TMA stores; the buffers alternate, so a round waits only until
// the TMA has read the round's before last, which had a whole round to
// go (with one 32 KiB round a half, that wait was 7 % of the GELU
// kernel's warp samples; now the rounds' waits, mostly for the issuing
// thread to finish the round before, are 5 %: ncu, H100, 2026-12-06).
// `uses` counts the staging's rounds so far (the same in all 128
// threads): its parity picks the buffer.
template <bool GELU>
__device__ __forceinline__ void gp_store_bias(const float *d, const gp_out &o, unsigned char *out,
                                              unsigned long long *written, unsigned long long *freed, unsigned &uses,
                                              int m0, int n0)
{
    const int t = threadIdx.x & 127, q = t & 3;
    const bool issuer = t == 0;
#pragma unroll   // the round must be known at compile time: d stays in registers
    for (int round = 0; round < 4; round++, uses++) {
        const int half = round >> 1, box = round & 1;
        unsigned char *buf = out + (uses & 1) * GP_ROUND_BYTES;   // C's box, then G's
        gp_staging_free(freed, uses, issuer, true);
#pragma unroll
        for (int jb = 0; jb < 8; jb += 2) {   // the box's 16-byte chunks jb, jb + 1: column pairs 8 j + 2 q
            unsigned c4[4], g4[4];            // in gp_x4_at's order
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int j = 8 * box + jb + (b >> 1), h = b & 1, i = 64 * half + 4 * j + 2 * h;
                const unsigned bb = *(const unsigned *)(o.bias + n0 + 8 * j + 2 * q);
                const float b0 = gt_h2f((unsigned short)(bb & 0xffffu)), b1 = gt_h2f((unsigned short)(bb >> 16));
                c4[b] = gt_pack(d[i] + b0, d[i + 1] + b1);
                if (GELU)   // of the stored (rounded) values, as gemm_wgmma.cu
                    g4[b] = gt_pack(act_gelu(gt_h2f((unsigned short)(c4[b] & 0xffffu))),
                                    act_gelu(gt_h2f((unsigned short)(c4[b] >> 16))));
            }
            gp_stsm_x4(buf + gp_x4_at(jb), c4);
            if (GELU) gp_stsm_x4(buf + GP_BOX_BYTES + gp_x4_at(jb), g4);
        }
        gt_fence_async_shared();
        gt_arrive(gt_shared(written));
        if (!issuer) continue;
        gt_wait(gt_shared(written), uses & 1);
        gt_tma_store(o.tc, n0 + 64 * box, m0 + 64 * half, gt_shared(buf));
        if (GELU) gt_tma_store(o.tg, n0 + 64 * box, m0 + 64 * half, gt_shared(buf + GP_BOX_BYTES));
        gt_bulk_commit();
    }
}

// The dX kernel's u for its tile at (m0, n0): once the staging is free,
// one thread has the TMA load all 128 rows into it (rows 0..63 in the
// first half, 64..127 in the second; `uready`, phase tiles), before the
// tile's MMAs, so that the loads land while the tensor cores work.
__device__ __forceinline__ void gp_dx_load_u(const gp_out &o, unsigned char *out, unsigned long long *freed,
                                             unsigned long long *uready, unsigned uses, int m0, int n0)
{
    const bool issuer = (threadIdx.x & 127) == 0;
    gp_staging_free(freed, uses, issuer, false);
    if (!issuer) return;
    gt_arrive_tx(gt_shared(uready), 2 * GP_HALF_BYTES);
    for (int half = 0; half < 2; half++)
        for (int box = 0; box < 2; box++)
            gt_tma(gt_shared(out + half * GP_HALF_BYTES + box * GP_BOX_BYTES), o.tu, n0 + 64 * box, m0 + 64 * half,
                   gt_shared(uready));
}

// The dX kernel's epilogue: dU = round(d) * gelu'(u) written over u in
// the staging and stored (all 128 rows); then, with part, each thread
// sums two columns of the stored dU in one half of the tile (reading the
// staging beside the TMA) per `part_rows` (16, 32 or 64) rows into part;
// then gelu(u), kept in registers meanwhile, written over the staging once
// the TMA and every thread have read it (`summed`), and stored.  Two
// staging uses (`uses`); `tiles` (this warpgroup's tiles so far) is
// uready's and summed's phase.  u is read and dU written in eight steps
// of four chunks (two ldmatrix, two stmatrix), the next step's u read
// before this step's dU is written: with one pair at a time the compiler
// could not move a read of u above the write before it (the same
// staging), and each pair waited for its read (ncu, H100, 2026-12-06).
__device__ __forceinline__ void gp_store_dx(const float *d, const gp_out &o, unsigned char *out,
                                            unsigned long long *written, unsigned long long *freed,
                                            unsigned long long *uready, unsigned long long *summed, unsigned &uses,
                                            unsigned tiles, int m0, int n0)
{
    const int t = threadIdx.x & 127;
    const bool issuer = t == 0;
    unsigned y[2][GP_BN / 8][2];   // gelu(u) of this thread's pairs: [half][j][h]
    gt_wait(gt_shared(uready), tiles & 1);
    unsigned u[2][4], next[2][4];   // a step's u: [its two ldmatrix][block]
#pragma unroll
    for (int c = 0; c < 2; c++) gp_ldsm_x4(u[c], out + gp_x4_at(2 * c));
#pragma unroll
    for (int step = 0; step < 8; step++) {   // half step / 4, chunks 4 (step % 4) .. + 3
        const int half = step >> 2, j0 = 4 * (step & 3);
        if (step < 7) {
            const int nhalf = (step + 1) >> 2, nj0 = 4 * ((step + 1) & 3);
#pragma unroll
            for (int c = 0; c < 2; c++) gp_ldsm_x4(next[c], out + nhalf * GP_HALF_BYTES + gp_x4_at(nj0 + 2 * c));
        }
        unsigned du[2][4];
#pragma unroll
        for (int c = 0; c < 2; c++)
#pragma unroll
            for (int b = 0; b < 4; b++) {
                const int j = j0 + 2 * c + (b >> 1), h = b & 1, i = 64 * half + 4 * j + 2 * h;
                const unsigned u2 = u[c][b], g2 = gt_pack(d[i], d[i + 1]);   // dG rounded, as stored
                const float ulo = gt_h2f((unsigned short)(u2 & 0xffffu)), uhi = gt_h2f((unsigned short)(u2 >> 16));
                du[c][b] = gt_pack(gt_h2f((unsigned short)(g2 & 0xffffu)) * actg_gelu(ulo),
                                   gt_h2f((unsigned short)(g2 >> 16)) * actg_gelu(uhi));
                y[half][j][h] = gt_pack(act_gelu(ulo), act_gelu(uhi));
            }
#pragma unroll
        for (int c = 0; c < 2; c++) gp_stsm_x4(out + half * GP_HALF_BYTES + gp_x4_at(j0 + 2 * c), du[c]);
        if (step < 7)
#pragma unroll
            for (int c = 0; c < 2; c++)
#pragma unroll
                for (int b = 0; b < 4; b++) u[c][b] = next[c][b];
    }
    // dU's 128 rows are the staging's two halves; every thread waits for
    // all writes, as the column sums read other threads' values
    gp_staging_store(o.tc, m0, o.tc, m0 + 64, out, written, uses, issuer, true, n0);
    uses++;
    if (o.part) {   // the stored dU (as BIAS_GRAD reads it) summed per part_rows rows
        // thread t: columns 2 (t % 64) and the next, the rows of half t / 64,
        // four sums of 16 rows each (independent chains), then combined
        const int cp = t & 63, half = t >> 6;
        float s[4][2];
#pragma unroll
        for (int g = 0; g < 4; g++) {
            s[g][0] = s[g][1] = 0.0f;
#pragma unroll
            for (int r = 16 * g; r < 16 * g + 16; r++) {
                const unsigned v = *(const unsigned *)(out + half * GP_HALF_BYTES + gp_at(r, cp >> 2, cp & 3));
                s[g][0] += gt_h2f((unsigned short)(v & 0xffffu));
                s[g][1] += gt_h2f((unsigned short)(v >> 16));
            }
        }
        const int per = o.part_rows / 16, groups = (o.m + o.part_rows - 1) / o.part_rows;   // 1, 2 or 4 sums a partial
#pragma unroll
        for (int e = 0; e < 2; e++) {   // pairs, then the pairs' sums (registers: indices known when compiled)
            if (per >= 2) {
                s[0][e] += s[1][e];
                s[2][e] += s[3][e];
            }
            if (per == 4) s[0][e] += s[2][e];
        }
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const int group = (m0 + 64 * half + 16 * g) / o.part_rows;
            if (g % per == 0 && group < groups)
                *(float2 *)(o.part + (long long)group * o.n + n0 + 2 * cp) = make_float2(s[g][0], s[g][1]);
        }
        gt_arrive(gt_shared(summed));
        gt_wait(gt_shared(summed), tiles & 1);
    }
    if (!o.tg) return;
    gp_staging_free(freed, uses, issuer, false);
#pragma unroll
    for (int half = 0; half < 2; half++)
#pragma unroll
        for (int j = 0; j < GP_BN / 8; j += 2) {
            const unsigned four[4] = {y[half][j][0], y[half][j][1], y[half][j + 1][0], y[half][j + 1][1]};
            gp_stsm_x4(out + half * GP_HALF_BYTES + gp_x4_at(j), four);
        }
    gp_staging_store(o.tg, m0, o.tg, m0 + 64, out, written, uses, issuer, false, n0);
    uses++;
}

template <int KIND>
__device__ __forceinline__ void gp_gemm(const gt_tmap *ta, const gt_tmap *tw, const gp_out &o, int k)
{
    constexpr int S = GP_STAGES;
    extern __shared__ unsigned char gp_raw[];
    // the swizzle works on shared addresses: stages and staging at 1024-byte boundaries
    unsigned char *smem = gp_raw + ((1024 - (gt_shared(gp_raw) & 1023)) & 1023);
    unsigned char *staging = smem + S * GP_STAGE_BYTES;   // GP_STAGING_BYTES per multiplying warpgroup
    unsigned long long *full = (unsigned long long *)(staging + 2 * GP_STAGING_BYTES), *empty = full + S;
    unsigned long long *written = empty + S, *freed = written + 2, *turn = freed + 2;   // one of each a warpgroup
    unsigned long long *uready = turn + 2, *summed = uready + 2;                      // the dX kernel's
    const int wg = threadIdx.x >> 7, kts = k / GP_BK, tiles_n = o.n / GP_BN;
    const int tiles = tiles_n * ((o.m + GP_BM - 1) / GP_BM);
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            gt_mbar_init(gt_shared(&full[s]), 1);
            gt_mbar_init(gt_shared(&empty[s]), 128);
        }
        for (int w = 0; w < 2; w++) {
            gt_mbar_init(gt_shared(&written[w]), 128);
            gt_mbar_init(gt_shared(&freed[w]), 1);
            gt_mbar_init(gt_shared(&turn[w]), 128);
            gt_mbar_init(gt_shared(&uready[w]), 1);
            gt_mbar_init(gt_shared(&summed[w]), 128);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {   // the loader: every tile's k tiles in the order of j
        GT_REGS_LOADER();
        if (threadIdx.x == 0)
            gt_load_ring<GP_BM, GP_BN, S, KIND == GP_DX_DGELU>(ta, tw, smem, full, empty, tiles, tiles_n, kts);
        return;
    }

    GT_REGS_MMA();
    const int cw = wg - 1;
    // stage 0's descriptors of A's first 64 rows and of W (K-major, or
    // N-major for the dX kernel's W as stored), their low words: each MMA's
    // descriptors are these plus offsets, where gt_desc per MMA took about
    // 18 instructions an MMA in the loop (ncu, H100, thirty-third session)
    const unsigned desc_a = (unsigned)gt_desc(smem),
                   desc_w = (unsigned)(KIND == GP_DX_DGELU ? gt_desc_nmajor(smem + GP_A_BYTES) : gt_desc(smem + GP_A_BYTES));
    unsigned uses = 0;   // rounds of this warpgroup's staging so far
    float d[128];
    for (int j = cw; blockIdx.x + j * gridDim.x < tiles; j += 2) {
        const int t = blockIdx.x + j * gridDim.x;
        const int m0 = (t / tiles_n) * GP_BM, n0 = (t % tiles_n) * GP_BN;
        unsigned char *out = staging + cw * GP_STAGING_BYTES;
        if (KIND == GP_DX_DGELU) gp_dx_load_u(o, out, &freed[cw], &uready[cw], uses, m0, n0);
#pragma unroll
        for (int i = 0; i < 128; i++) d[i] = 0.0f;
        // tile j - 1 is the other warpgroup's ((j - 1) / 2)-th: its turn[cw] phase
        if (j > 0) gt_wait(gt_shared(&turn[cw]), ((j - 1) >> 1) & 1);
        unsigned it = (unsigned)j * kts;   // the ring's count at this tile, as the loader counts
        for (int kt = 0; kt < kts; kt++, it++) {
            const unsigned s = it % S;
            gt_wait(gt_shared(&full[s]), (it / S) & 1);
            // stage s's descriptors: the start field (address >> 4) moves by
            // the stage, then by each k16 step (never past its 14 bits: shared
            // addresses stay below 2^18)
            const unsigned at = s * (GP_STAGE_BYTES >> 4), a0 = desc_a + at, w0 = desc_w + at;
            GT_FENCE();
#pragma unroll
            for (int q = 0; q < GP_BK / 16; q++) {   // k16 step q
                const unsigned da = a0 + 2 * q, da_hi = da + ((64 * GP_BK * 2) >> 4);   // rows 0.., 64..
                if (KIND == GP_DX_DGELU) {   // 16 k rows of 128 bytes on
                    const unsigned db = w0 + ((1024 * 2) >> 4) * q;
                    GP_MMA_LO(0, da, db, 1);
                    GP_MMA_LO(64, da_hi, db, 1);
                } else {                     // 32 bytes on in each 128-byte row
                    const unsigned db = w0 + 2 * q;
                    GP_MMA_LO(0, da, db, 0);
                    GP_MMA_LO(64, da_hi, db, 0);
                }
            }
            GT_COMMIT_WAIT1();   // k tile kt - 1's MMAs are done: its stage goes back to the loader
            if (kt > 0) gt_arrive(gt_shared(&empty[(it - 1) % S]));
        }
        gt_arrive(gt_shared(&turn[1 - cw]));   // the other warpgroup's next tile may start
        GT_WAIT_ALL();
        gt_arrive(gt_shared(&empty[(it - 1) % S]));   // the tile's last stage
        if (KIND == GP_DX_DGELU)
            gp_store_dx(d, o, out, &written[cw], &freed[cw], &uready[cw], &summed[cw], uses, (unsigned)(j >> 1), m0,
                        n0);
        else
            gp_store_bias<KIND == GP_BIAS_GELU>(d, o, out, &written[cw], &freed[cw], uses, m0, n0);
    }
    if ((threadIdx.x & 127) == 0) gt_bulk_wait();   // the staging lives until the TMA is done with it
}

extern "C" __global__ void __launch_bounds__(GP_THREADS)
gemm_pp_bias_f16(const __grid_constant__ gt_tmap ta, const __grid_constant__ gt_tmap tw,
                 const __grid_constant__ gt_tmap tc, const unsigned short *bias, int m, int n, int k)
{
    const gp_out o = {&tc, 0, 0, bias, 0, 16, m, n};
    gp_gemm<GP_BIAS>(&ta, &tw, o, k);
}

extern "C" __global__ void __launch_bounds__(GP_THREADS)
gemm_pp_bias_gelu_f16(const __grid_constant__ gt_tmap ta, const __grid_constant__ gt_tmap tw,
                      const __grid_constant__ gt_tmap tc, const __grid_constant__ gt_tmap tg,
                      const unsigned short *bias, int m, int n, int k)
{
    const gp_out o = {&tc, &tg, 0, bias, 0, 16, m, n};
    gp_gemm<GP_BIAS_GELU>(&ta, &tw, o, k);
}

// dU = round(dY W) * gelu'(u): dY (M x K) as A, W (K x N, N contiguous: a
// linear's weight, K its outputs, read as stored), u (tu) and dU (tdu)
// (M x N); with_y: gelu(u) to ty; part (may be 0): the column sums of the
// stored dU over each part_rows (16, 32 or 64) rows, ceil(M / part_rows)
// rows of N f32.  The maps of u, dU and y have boxes {64, 64},
// W's {64, 64} (64 n by 64 k rows).
extern "C" __global__ void __launch_bounds__(GP_THREADS)
gemm_pp_dx_dgelu_f16(const __grid_constant__ gt_tmap tdy, const __grid_constant__ gt_tmap tw,
                     const __grid_constant__ gt_tmap tu, const __grid_constant__ gt_tmap tdu,
                     const __grid_constant__ gt_tmap ty, int with_y, float *part, int part_rows, int m, int n, int k)
{
    const gp_out o = {&tdu, with_y ? &ty : 0, &tu, 0, part, part_rows, m, n};
    gp_gemm<GP_DX_DGELU>(&tdy, &tw, o, k);
}
