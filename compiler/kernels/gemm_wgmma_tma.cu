// compiler/kernels/gemm_wgmma_tma.cu — C = A W^T + bias (and G = gelu(C)),
// as gemm_wgmma.cu computes it, in the form Hopper GEMMs reach their speed
// with: tiles loaded by the Tensor Memory Accelerator, a loading warpgroup
// beside the multiplying ones, 128 x 256 tiles, a persistent grid.  Used by
// the step under HPC_GEMM_OWN=1 (runtime/cuda/gemm_own.h); tests/gpu/gpu_gemm.c
// checks it and times it beside gemm_wgmma.cu and cuBLASLt.
//
// Operands, types and the GELU variant as gemm_wgmma.cu (act_gelu and
// actg_gelu must come before this text); gemm_tma_dx_dgelu_f16 computes a
// GELU backward's dU = (dY W) * gelu'(u) with W N-major (as a linear's
// weight is stored), its tiles as four TMA boxes of 64 n by 64 k rows.  Not
// used by the step yet.  N a multiple of 256, K of 64, M any (the last row
// tile reads zeros past M and stores nothing there).  A and W come as 2-D
// tensor maps (cuTensorMapEncodeTiled: f16, dims {K, rows}, boxes {64, 128}
// for A and {64, 256} for W, the 128-byte swizzle), passed by value
// (__grid_constant__).
//
// A block of 384 threads: warpgroup 0 loads (one thread issues the TMA
// copies; the group gives registers up with setmaxnreg), warpgroups 1 and
// 2 multiply rows 0..63 and 64..127 of the tile with wgmma m64n256k16
// (128 accumulators a thread).  GT_STAGES stages in shared memory, each with two
// mbarriers: `full` (the loader's arrival plus the TMA's bytes) and
// `empty` (the 256 multiplying threads, once their MMAs on it are done).
// One k tile's MMAs stay in flight while the next are issued; a stage is
// released when the MMAs after it have been waited for.
//
// Persistent: block b takes tiles b, b + gridDim.x, ... (row-major over the
// (M / 128, N / 256) tiles, so the blocks at work share A's rows and all of
// W in L2).  The ring's stage and parity count on across tiles, so the
// loader fills the next tile's stages while the multiplying warpgroups
// store the last one: only the first tile waits for its loads.
//
// Two ways to store a tile (four stages either way):
//  - direct (gemm_tma_bias_f16, _gelu_f16, the dX kernel): the four lanes
//    of a quad swap their accumulators (a 4 x 4 transpose of f16 pairs, two
//    shuffle rounds) so that each writes 16 contiguous bytes to global
//    memory, every store of the tile issued before the next tile's MMAs.
//  - through shared memory and a TMA store (the _ts kernels): each
//    multiplying warpgroup writes its 64 rows, half of the columns at a
//    time, into its 16 KiB of staging (two 64-column boxes in the 128-byte
//    swizzle, conflict-free 4-byte stores), and one of its threads hands
//    them to the TMA (cp.async.bulk.tensor ... bulk_group), which writes
//    them out while the warpgroup goes on (the second half, then the next
//    tile's MMAs).  The TMA clips rows past M.  Two mbarriers a warpgroup
//    order it: `written` (its 128 threads, after a proxy fence) before the
//    store is issued, `freed` (the issuing thread, once the TMA has read
//    the staging) before it is written again.  C comes as a third tensor
//    map (dims {N, M}, boxes {64, 64}, the 128-byte swizzle), and G as a
//    fourth.  Half a tile at a time leaves room for the fourth stage: a
//    whole tile's 64 KiB with three stages was 18 % slower at K = 3072.
//    On an H100 (2026-12-05): 4-9 % faster than the direct store at 32768
//    rows, about the same at 4096.
//
// Launch: grid (min(tiles, SMs)), 384 threads, GT_SMEM_BYTES or
// GT_TS_SMEM_BYTES of dynamic shared memory (cuFuncSetAttribute first).

#define GT_BM 128
#define GT_BN 256
#define GT_BK 64
#define GT_STAGES 4
#define GT_THREADS 384
#define GT_A_BYTES (GT_BM * GT_BK * 2)
#define GT_W_BYTES (GT_BN * GT_BK * 2)
#define GT_STAGE_BYTES (GT_A_BYTES + GT_W_BYTES)
#define GT_OUT_BYTES (GT_BM * GT_BN / 2 * 2)   // half a tile's columns staged for the TMA store
#define GT_SMEM_BYTES (GT_STAGES * GT_STAGE_BYTES + 1024 + 2 * GT_STAGES * 8)
#define GT_TS_SMEM_BYTES (GT_STAGES * GT_STAGE_BYTES + GT_OUT_BYTES + 1024 + (2 * GT_STAGES + 4) * 8)

struct alignas(64) gt_tmap { unsigned long long v[16]; };   // a CUtensorMap's 128 bytes

__device__ __forceinline__ unsigned gt_shared(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ float gt_h2f(unsigned short h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ void gt_mbar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void gt_arrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// an arrival that also announces the bytes the TMA will complete
__device__ __forceinline__ void gt_arrive_tx(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// until the barrier's phase of this parity has completed
__device__ __forceinline__ void gt_wait(unsigned bar, unsigned parity)
{
    unsigned done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
// the box at (inner x, outer y) of a tensor map into shared memory
__device__ __forceinline__ void gt_tma(unsigned dst, const gt_tmap *map, int x, int y, unsigned bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 ::"r"(dst), "l"((unsigned long long)map), "r"(x), "r"(y), "r"(bar)
                 : "memory");
}

// the box at (inner x, outer y) of a tensor map from shared memory, as a
// bulk async-group of this thread (committed by gt_bulk_commit)
__device__ __forceinline__ void gt_tma_store(const gt_tmap *map, int x, int y, unsigned src)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
                 ::"l"((unsigned long long)map), "r"(x), "r"(y), "r"(src)
                 : "memory");
}
__device__ __forceinline__ void gt_bulk_commit(void) { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// until this thread's bulk stores have read their shared memory (.read) or
// are done; gt_bulk_wait_read_but_last: all but the last committed group
__device__ __forceinline__ void gt_bulk_wait_read(void)
{
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ __forceinline__ void gt_bulk_wait_read_but_last(void)
{
    asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
}
__device__ __forceinline__ void gt_bulk_wait(void) { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// this thread's shared-memory writes made visible to the TMA (the async proxy)
__device__ __forceinline__ void gt_fence_async_shared(void)
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A K-major operand in the 128-byte swizzle: start >> 4, LBO unused, SBO 1024.
// The high word every descriptor here shares: SBO 1024 bytes (the next
// 8-row atom) and the 128-byte swizzle (bits 62-63 of the descriptor).
#define GT_DESC_HI ((1024u >> 4) | (1u << 30))
__device__ __forceinline__ unsigned long long gt_desc(const void *smem)
{
    return (unsigned long long)((gt_shared(smem) >> 4) & 0x3FFFu) | (1ull << 16) |
           ((unsigned long long)GT_DESC_HI << 32);
}

// An N-major operand in the 128-byte swizzle (W as stored, for dX = dY W):
// atoms of 8 k rows of 64 n (1024 bytes), the next atom along N 8192 bytes
// on (LBO: the TMA box of 64 n by 64 k rows) and along K 1024 (SBO).
__device__ __forceinline__ unsigned long long gt_desc_nmajor(const void *smem)
{
    return (unsigned long long)((gt_shared(smem) >> 4) & 0x3FFFu) | ((8192ull >> 4) << 16) |
           ((unsigned long long)GT_DESC_HI << 32);
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GT_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])
// d (128 f32 a thread) += A (64 x 16, descriptor da) B (16 x 256, descriptor db; TRANS_B 0: K-major,
// 1: N-major)
#define GT_MMA(da, db, TRANS_B)                                                                               \
    asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "                                        \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                    \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "           \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "           \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "           \
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "           \
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "           \
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, " \
                 "%128, %129, 1, 1, 1, 0, " #TRANS_B ";\n"                                                     \
                 : GT_D8(0), GT_D8(8), GT_D8(16), GT_D8(24), GT_D8(32), GT_D8(40), GT_D8(48), GT_D8(56),       \
                   GT_D8(64), GT_D8(72), GT_D8(80), GT_D8(88), GT_D8(96), GT_D8(104), GT_D8(112), GT_D8(120)   \
                 : "l"(da), "l"(db))
#define GT_FENCE() asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory")
#define GT_COMMIT_WAIT1() asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 1;\n" ::: "memory")
#define GT_WAIT_ALL() asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory")
#define GT_REGS_LOADER() asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n")
#define GT_REGS_MMA() asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n")
#else
#define GT_MMA(da, db, TRANS_B) (void)(da), (void)(db)
#define GT_FENCE() (void)0
#define GT_COMMIT_WAIT1() (void)0
#define GT_WAIT_ALL() (void)0
#define GT_REGS_LOADER() (void)0
#define GT_REGS_MMA() (void)0
#endif

__device__ __forceinline__ unsigned gt_pack(float lo, float hi)
{
    unsigned pk;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(pk) : "f"(hi), "f"(lo));
    return pk;
}

// p[jj] of lane q of a quad is the f16 pair of its row at column pair q of
// 8-column group jj; afterwards p[w] is the pair w of group q (a 4 x 4
// transpose across the quad: first the 2 x 2 blocks, then within them)
__device__ __forceinline__ void gt_quad_transpose(unsigned p[4], int q)
{
    const bool hi2 = q & 2, hi1 = q & 1;
    unsigned s0 = hi2 ? p[0] : p[2], s1 = hi2 ? p[1] : p[3];
    unsigned r0 = __shfl_xor_sync(0xffffffffu, s0, 2), r1 = __shfl_xor_sync(0xffffffffu, s1, 2);
    if (hi2) { p[0] = r0; p[1] = r1; } else { p[2] = r0; p[3] = r1; }
    s0 = hi1 ? p[0] : p[1];
    s1 = hi1 ? p[2] : p[3];
    r0 = __shfl_xor_sync(0xffffffffu, s0, 1);
    r1 = __shfl_xor_sync(0xffffffffu, s1, 1);
    if (hi1) { p[0] = r0; p[2] = r1; } else { p[1] = r0; p[3] = r1; }
}

// The loading thread's work (the ring of S stages of BM rows of A and
// BN rows of W by GT_BK): every k tile of the block's tiles (blockIdx.x,
// + gridDim.x, ..., row-major over (M / BM, N / BN)) in order, each stage
// once the multiplying threads have released it (`empty`), its bytes
// announced on `full`.  W K-major: one box of BN rows by GT_BK; N-major
// (NMAJOR, for dX = dY W): BN / 64 boxes of 64 n by GT_BK k rows.
template <int BM, int BN, int S, bool NMAJOR>
__device__ __forceinline__ void gt_load_ring(const gt_tmap *ta, const gt_tmap *tw, unsigned char *smem,
                                             unsigned long long *full, unsigned long long *empty, int tiles,
                                             int tiles_n, int kts)
{
    constexpr unsigned A_BYTES = BM * GT_BK * 2, STAGE_BYTES = (BM + BN) * GT_BK * 2;
    unsigned it = 0;   // k tiles loaded so far, over all of this block's tiles
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int m0 = (t / tiles_n) * BM, n0 = (t % tiles_n) * BN;
        for (int kt = 0; kt < kts; kt++, it++) {
            const unsigned s = it % S;
            gt_wait(gt_shared(&empty[s]), ((it / S) + 1) & 1);   // a fresh barrier passes parity 1
            gt_arrive_tx(gt_shared(&full[s]), STAGE_BYTES);
            unsigned char *stage = smem + s * STAGE_BYTES;
            gt_tma(gt_shared(stage), ta, kt * GT_BK, m0, gt_shared(&full[s]));
            if (NMAJOR) {
                for (int j = 0; j < BN / 64; j++)
                    gt_tma(gt_shared(stage + A_BYTES + j * 8192), tw, n0 + 64 * j, kt * GT_BK, gt_shared(&full[s]));
            } else {
                gt_tma(gt_shared(stage + A_BYTES), tw, kt * GT_BK, n0, gt_shared(&full[s]));
            }
        }
    }
}

// What a kernel computes: C = A W^T + bias; that and G = gelu(C); or
// C = (A W, W N-major) * gelu'(G), the GELU backward's dU from dY and the
// GELU's input u = G (the FFN's second linear's dX with the GELU behind it)
enum { GT_BIAS, GT_BIAS_GELU, GT_DX_DGELU };

// d (the accumulators of rows 64 cw.. of the tile at (m0, n0)) to C in
// 16-byte stores: + bias (and gelu of the stored values to G), or times
// gelu'(G) (of C rounded to f16 first, as the separate GEMM and GELU
// backward would round it), then with y gelu(G) to y, and with part the
// column sums of the stored dU over each warp's 16 rows (f32; row group
// r = row / 16 at part[r * n + column], for r < ceil(m / 16))
template <int KIND>
__device__ __forceinline__ void gt_store(const float *d, unsigned short *c, unsigned short *g,
                                         const unsigned short *bias, unsigned short *y, float *part, int m, int n,
                                         int m0, int n0, int cw)
{
    const bool GELU = KIND == GT_BIAS_GELU;
    const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, q = lane & 3;
    const int row0 = m0 + 64 * cw + 16 * warp + lane / 4, group = (m0 + 64 * cw + 16 * warp) / 16;
    // d[4j + 2h + e] is C's (row0 + 8 h, n0 + 8 j + 2 q + e)
#pragma unroll
    for (int jg = 0; jg < GT_BN / 32; jg++) {
        float cs[8];   // with part: this lane's 8 columns (after the transpose) summed over its rows
#pragma unroll
        for (int i = 0; i < 8; i++) cs[i] = 0.0f;
        float b[4][2];
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            unsigned bb = KIND == GT_DX_DGELU ? 0u : *(const unsigned *)(bias + n0 + 8 * (4 * jg + jj) + 2 * q);
            b[jj][0] = gt_h2f((unsigned short)(bb & 0xffffu));
            b[jj][1] = gt_h2f((unsigned short)(bb >> 16));
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            unsigned p[4], pg[4];
#pragma unroll
            for (int jj = 0; jj < 4; jj++) {
                const int j = 4 * jg + jj;
                p[jj] = gt_pack(d[4 * j + 2 * h] + b[jj][0], d[4 * j + 2 * h + 1] + b[jj][1]);
                if (GELU)   // of the stored (rounded) values, as gemm_wgmma.cu
                    pg[jj] = gt_pack(act_gelu(gt_h2f((unsigned short)(p[jj] & 0xffffu))),
                                     act_gelu(gt_h2f((unsigned short)(p[jj] >> 16))));
            }
            gt_quad_transpose(p, q);
            if (GELU) gt_quad_transpose(pg, q);
            const int row = row0 + 8 * h;
            if (row >= m) continue;   // the last row tile may pass M (the TMA read zeros there)
            const long long at = (long long)row * n + n0 + 8 * (4 * jg + q);
            if (KIND == GT_DX_DGELU) {   // p: dG rounded; G: u, 8 values on from at as p
                const uint4 u4 = *(const uint4 *)(g + at);
                const unsigned u[4] = {u4.x, u4.y, u4.z, u4.w};
#pragma unroll
                for (int w = 0; w < 4; w++) {
                    const float lo = gt_h2f((unsigned short)(p[w] & 0xffffu)), hi = gt_h2f((unsigned short)(p[w] >> 16));
                    const float ulo = gt_h2f((unsigned short)(u[w] & 0xffffu)), uhi = gt_h2f((unsigned short)(u[w] >> 16));
                    p[w] = gt_pack(lo * actg_gelu(ulo), hi * actg_gelu(uhi));
                    pg[w] = gt_pack(act_gelu(ulo), act_gelu(uhi));
                    cs[2 * w] += gt_h2f((unsigned short)(p[w] & 0xffffu));   // the stored dU, as BIAS_GRAD reads it
                    cs[2 * w + 1] += gt_h2f((unsigned short)(p[w] >> 16));
                }
                if (y) *(uint4 *)(y + at) = make_uint4(pg[0], pg[1], pg[2], pg[3]);
            }
            *(uint4 *)(c + at) = make_uint4(p[0], p[1], p[2], p[3]);
            if (GELU) *(uint4 *)(g + at) = make_uint4(pg[0], pg[1], pg[2], pg[3]);
        }
        if (KIND == GT_DX_DGELU && part) {   // the 8 lanes of a column hold the warp's 16 rows
#pragma unroll
            for (int i = 0; i < 8; i++) {
                cs[i] += __shfl_xor_sync(0xffffffffu, cs[i], 4);
                cs[i] += __shfl_xor_sync(0xffffffffu, cs[i], 8);
                cs[i] += __shfl_xor_sync(0xffffffffu, cs[i], 16);
            }
            if (lane < 4 && group < (m + 15) / 16) {
                float4 *at = (float4 *)(part + (long long)group * n + n0 + 8 * (4 * jg + q));
                at[0] = make_float4(cs[0], cs[1], cs[2], cs[3]);
                at[1] = make_float4(cs[4], cs[5], cs[6], cs[7]);
            }
        }
    }
}

// The TMA-store epilogue of warpgroup cw (0 or 1): d + bias (and, with
// GELU, gelu of the rounded values) in rounds of half its columns: each
// round writes 64 rows by 128 columns into the group's 16 KiB staging
// `out` (two 64-column boxes of 8 KiB in the 128-byte swizzle: row r's
// 16-byte chunk c at r * 128 + ((c ^ (r & 7)) << 4)), then the TMA stores
// them at (n0 + 128 h, m0 + 64 cw).  `uses` counts the staging's rounds
// so far (the same in every thread of the group): the phase of `written`
// and `freed` each round takes.
template <bool GELU>
__device__ __forceinline__ void gt_store_staged(const float *d, const unsigned short *bias, unsigned char *out,
                                                const gt_tmap *tc, const gt_tmap *tg, unsigned long long *written,
                                                unsigned long long *freed, unsigned &uses, int m0, int n0, int cw)
{
    const int t = threadIdx.x & 127, q = t & 3;
    const int r0 = 16 * (t >> 5) + ((t & 31) >> 2);   // the thread's first row in the group's 64
    const bool issuer = t == 0;
#pragma unroll   // half must be known at compile time: d stays in registers
    for (int round = 0; round < (GELU ? 4 : 2); round++, uses++) {
        const int half = round & 1;   // columns 128 half ..; rounds 2 and 3: G
        if (uses > 0) {   // the last round's store must have read the staging
            if (issuer) {
                gt_bulk_wait_read();
                gt_arrive(gt_shared(freed));
            }
            gt_wait(gt_shared(freed), (uses - 1) & 1);
        }
        // d[4j + 2h + e] is C's (r0 + 8 h, n0 + 8 j + 2 q + e): 4 bytes at
        // chunk j % 8 of box j / 8 - 2 half; r0 & 7 = lane / 4 spreads a
        // warp's 32 stores over all 32 banks
#pragma unroll
        for (int jj = 0; jj < GT_BN / 16; jj++) {
            const int j = GT_BN / 16 * half + jj;
            const unsigned bb = *(const unsigned *)(bias + n0 + 8 * j + 2 * q);
            const float b0 = gt_h2f((unsigned short)(bb & 0xffffu)), b1 = gt_h2f((unsigned short)(bb >> 16));
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int r = r0 + 8 * h;
                unsigned v = gt_pack(d[4 * j + 2 * h] + b0, d[4 * j + 2 * h + 1] + b1);
                if (round >= 2)   // of the stored (rounded) values, as gemm_wgmma.cu
                    v = gt_pack(act_gelu(gt_h2f((unsigned short)(v & 0xffffu))), act_gelu(gt_h2f((unsigned short)(v >> 16))));
                const unsigned at = (unsigned)((jj >> 3) * 8192 + r * 128 + ((((jj & 7) ^ (r & 7))) << 4) + 4 * q);
                *(unsigned *)(out + at) = v;
            }
        }
        gt_fence_async_shared();
        gt_arrive(gt_shared(written));
        if (issuer) {
            gt_wait(gt_shared(written), uses & 1);
#pragma unroll
            for (int box = 0; box < 2; box++)
                gt_tma_store(round >= 2 ? tg : tc, n0 + 128 * half + 64 * box, m0 + 64 * cw, gt_shared(out + box * 8192));
            gt_bulk_commit();
        }
    }
}

// The kernels' body.  TS: store through the staging and the TMA (tc, tg:
// C's and G's tensor maps) instead of directly (c, g).
template <int KIND, bool TS>
__device__ __forceinline__ void gt_gemm(const gt_tmap *ta, const gt_tmap *tw, const gt_tmap *tc, const gt_tmap *tg,
                                        unsigned short *c, unsigned short *g, const unsigned short *bias,
                                        unsigned short *y, float *part, int m, int n, int k)
{
    constexpr int S = GT_STAGES;
    extern __shared__ unsigned char gt_raw[];
    // the swizzle works on shared addresses: stages (and the staging) at 1024-byte boundaries
    unsigned char *smem = gt_raw + ((1024 - (gt_shared(gt_raw) & 1023)) & 1023);
    unsigned char *staging = smem + S * GT_STAGE_BYTES;   // TS only: 16 KiB per multiplying warpgroup
    unsigned long long *full = (unsigned long long *)(staging + (TS ? GT_OUT_BYTES : 0)), *empty = full + S;
    unsigned long long *written = empty + S, *freed = written + 2;   // TS only, one of each a warpgroup
    const int wg = threadIdx.x >> 7, kts = k / GT_BK, tiles_n = n / GT_BN;
    const int tiles = tiles_n * ((m + GT_BM - 1) / GT_BM);
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            gt_mbar_init(gt_shared(&full[s]), 1);
            gt_mbar_init(gt_shared(&empty[s]), 256);
        }
        if (TS)
            for (int w = 0; w < 2; w++) {
                gt_mbar_init(gt_shared(&written[w]), 128);
                gt_mbar_init(gt_shared(&freed[w]), 1);
            }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {   // the loader
        GT_REGS_LOADER();
        if (threadIdx.x == 0)
            gt_load_ring<GT_BM, GT_BN, S, KIND == GT_DX_DGELU>(ta, tw, smem, full, empty, tiles, tiles_n, kts);
        return;
    }

    GT_REGS_MMA();
    const int cw = wg - 1;
    unsigned it = 0;     // k tiles multiplied so far, counted as the loader counts
    unsigned uses = 0;   // TS: rounds of this warpgroup's staging so far
    float d[128];
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int m0 = (t / tiles_n) * GT_BM, n0 = (t % tiles_n) * GT_BN;
#pragma unroll
        for (int i = 0; i < 128; i++) d[i] = 0.0f;
        for (int kt = 0; kt < kts; kt++, it++) {
            const unsigned s = it % S;
            gt_wait(gt_shared(&full[s]), (it / S) & 1);
            const unsigned char *stage = smem + s * GT_STAGE_BYTES;
            const unsigned short *as = (const unsigned short *)stage + cw * 64 * GT_BK;
            const unsigned short *ws = (const unsigned short *)(stage + GT_A_BYTES);
            GT_FENCE();
#pragma unroll
            for (int q = 0; q < GT_BK / 16; q++) {
                const unsigned long long da = gt_desc(as + 16 * q);
                if (KIND == GT_DX_DGELU) {   // k16 step q: 16 k rows of 128 bytes on
                    GT_MMA(da, gt_desc_nmajor(ws + 1024 * q), 1);
                } else {
                    GT_MMA(da, gt_desc(ws + 16 * q), 0);
                }
            }
            GT_COMMIT_WAIT1();   // k tile kt - 1's MMAs are done: its stage goes back to the loader
            if (kt > 0) gt_arrive(gt_shared(&empty[(it - 1) % S]));
        }
        GT_WAIT_ALL();
        gt_arrive(gt_shared(&empty[(it - 1) % S]));   // the tile's last stage
        if (TS)
            gt_store_staged<KIND == GT_BIAS_GELU>(d, bias, staging + cw * (GT_OUT_BYTES / 2), tc, tg, &written[cw],
                                                  &freed[cw], uses, m0, n0, cw);
        else
            gt_store<KIND>(d, c, g, bias, y, part, m, n, m0, n0, cw);
    }
    if (TS && (threadIdx.x & 127) == 0) gt_bulk_wait();   // the staging lives until the TMA is done with it
}

extern "C" __global__ void __launch_bounds__(GT_THREADS)
gemm_tma_bias_f16(const __grid_constant__ gt_tmap ta, const __grid_constant__ gt_tmap tw, unsigned short *c,
                  const unsigned short *bias, int m, int n, int k)
{
    gt_gemm<GT_BIAS, false>(&ta, &tw, 0, 0, c, 0, bias, 0, 0, m, n, k);
}

extern "C" __global__ void __launch_bounds__(GT_THREADS)
gemm_tma_bias_gelu_f16(const __grid_constant__ gt_tmap ta, const __grid_constant__ gt_tmap tw, unsigned short *c,
                       unsigned short *g, const unsigned short *bias, int m, int n, int k)
{
    gt_gemm<GT_BIAS_GELU, false>(&ta, &tw, 0, 0, c, g, bias, 0, 0, m, n, k);
}

// The same with the TMA-store epilogue: C (and G) as tensor maps tc (tg)
extern "C" __global__ void __launch_bounds__(GT_THREADS)
gemm_tma_bias_f16_ts(const __grid_constant__ gt_tmap ta, const __grid_constant__ gt_tmap tw,
                     const __grid_constant__ gt_tmap tc, const unsigned short *bias, int m, int n, int k)
{
    gt_gemm<GT_BIAS, true>(&ta, &tw, &tc, 0, 0, 0, bias, 0, 0, m, n, k);
}

extern "C" __global__ void __launch_bounds__(GT_THREADS)
gemm_tma_bias_gelu_f16_ts(const __grid_constant__ gt_tmap ta, const __grid_constant__ gt_tmap tw,
                          const __grid_constant__ gt_tmap tc, const __grid_constant__ gt_tmap tg,
                          const unsigned short *bias, int m, int n, int k)
{
    gt_gemm<GT_BIAS_GELU, true>(&ta, &tw, &tc, &tg, 0, 0, bias, 0, 0, m, n, k);
}

// dU = (dY W) * gelu'(u): dY (M x K) as A, W (K x N, N contiguous: a
// linear's weight (K = its outputs) read as stored), u and dU (M x N); y
// (may be 0) gets gelu(u), and part (may be 0) the column sums of the
// stored dU per 16 rows, ceil(M / 16) rows of N f32: what the step's
// ACT_BWD_BGRAD's first phase writes besides dU (compiler/emit_ops_body.c)
extern "C" __global__ void __launch_bounds__(GT_THREADS)
gemm_tma_dx_dgelu_f16(const __grid_constant__ gt_tmap tdy, const __grid_constant__ gt_tmap tw, unsigned short *du,
                      const unsigned short *u, unsigned short *y, float *part, int m, int n, int k)
{
    gt_gemm<GT_DX_DGELU, false>(&tdy, &tw, 0, 0, du, (unsigned short *)u, 0, y, part, m, n, k);
}
