// compiler/kernels/gemm_wgmma.cu — C = A W^T + bias on Hopper's warpgroup
// MMA (wgmma.mma_async), the first GEMM of hpc's own: the base on which the
// fused epilogues and prologues of NOTES.md "What the goals need" are to be
// built (GELU in the FFN GEMMs, the LayerNorm's apply, the residual add).
// Not used by the step yet: tests/gpu/gpu_gemm.c checks it against the cpu
// and times it beside cuBLASLt.
//
// A: M x K, W: N x K (both row-major, K contiguous: a linear layer's input
// and weight), bias: N, C: M x N, all f16; f32 accumulation.
// M and N multiples of 128, K of 64 (the caller checks).
// gemm_wgmma_bias_gelu_f16 also writes G = gelu(C) (the FFN's first GEMM
// and its activation in one pass: act_gelu of program/activations.h, which
// the caller puts before this text, as the step's GELU kernel computes it).
//
// A block of 256 threads (two warpgroups) computes a 128 x 128 tile of C,
// warpgroup g its rows 64g .. 64g + 63 with wgmma m64n128k16.  K goes in
// tiles of 64 through a ring of GW_STAGES shared-memory stages filled by
// cp.async (every thread copies 16-byte chunks), so the loads of the next
// tiles run while the current one multiplies.  A stage holds A's 128 rows
// and W's 128 rows, each row 64 k = 128 bytes in the 128-byte swizzle
// (16-byte chunk c of row r at chunk c ^ (r % 8); 1024-byte atoms of 8
// rows), the layout wgmma reads without bank conflicts; a k16 step moves
// the descriptors' start 32 bytes on (tests/gpu/gpu_wgmma.c checks that
// reading on the GPU).  One k tile's MMAs stay in flight while the next
// are issued (wgmma.wait_group 1), so a stage is refilled two tiles after
// its MMAs were issued: GW_STAGES - 2 tiles are loaded ahead.
//
// Launch: grid (N / 128, M / 128), 256 threads, GW_SMEM_BYTES of dynamic
// shared memory (over 48 KiB: cuFuncSetAttribute first).

#define GW_BM 128
#define GW_BN 128
#define GW_BK 64
#define GW_STAGES 4
#define GW_THREADS 256
#define GW_STAGE_BYTES ((GW_BM + GW_BN) * GW_BK * 2)
#define GW_SMEM_BYTES (GW_STAGES * GW_STAGE_BYTES + 1024)   // + room to align to 1024

__device__ __forceinline__ unsigned gw_shared(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ float gw_h2f(unsigned short h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// 16 bytes global -> shared without waiting (cp.async, L2 only)
__device__ __forceinline__ void gw_cp16(void *dst, const void *src)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(gw_shared(dst)), "l"(src), "r"(16)
                 : "memory");
}
__device__ __forceinline__ void gw_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// all but the newest GW_STAGES - 3 groups of copies have landed
__device__ __forceinline__ void gw_wait_stages(void) { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// The descriptor of a K-major operand in the 128-byte swizzle (mode 1):
// start >> 4, LBO unused (1), SBO 1024 (the next 8 rows).
__device__ __forceinline__ unsigned long long gw_desc(const void *smem)
{
    return (unsigned long long)((gw_shared(smem) >> 4) & 0x3FFFu) | (1ull << 16) | ((1024ull >> 4) << 32) |
           (1ull << 62);
}

// Tile kt of A (rows m0..) and W (rows n0..) into stage `st`: 2 x 1024
// chunks of 16 bytes, 8 a thread.
__device__ __forceinline__ void gw_load(unsigned char *stage, const unsigned short *a, const unsigned short *w,
                                        int m0, int n0, int k, int kt)
{
    unsigned short *as = (unsigned short *)stage, *ws = as + GW_BM * GW_BK;
    for (int c = threadIdx.x; c < GW_BM * 8; c += GW_THREADS) {
        int row = c >> 3, ch = c & 7, at = row * GW_BK + ((ch ^ (row & 7)) << 3);
        gw_cp16(as + at, a + (long long)(m0 + row) * k + kt * GW_BK + ch * 8);
        gw_cp16(ws + at, w + (long long)(n0 + row) * k + kt * GW_BK + ch * 8);
    }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GW_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])
// d (64 f32 a thread) += A (64 x 16, descriptor da) B (16 x 128, descriptor db)
#define GW_MMA(da, db)                                                                                     \
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "                                     \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                 \
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "        \
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "        \
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "       \
                 "%64, %65, 1, 1, 1, 0, 0;\n"                                                               \
                 : GW_D8(0), GW_D8(8), GW_D8(16), GW_D8(24), GW_D8(32), GW_D8(40), GW_D8(48), GW_D8(56)     \
                 : "l"(da), "l"(db))
#define GW_FENCE() asm volatile("fence.proxy.async.shared::cta;\nwgmma.fence.sync.aligned;\n" ::: "memory")
// the tile's MMAs committed as a group; all but that newest group done
#define GW_COMMIT_WAIT1() asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 1;\n" ::: "memory")
#define GW_WAIT_ALL() asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory")
#else
#define GW_MMA(da, db) (void)(da), (void)(db)
#define GW_FENCE() (void)0
#define GW_COMMIT_WAIT1() (void)0
#define GW_WAIT_ALL() (void)0
#endif

template <bool GELU>
__device__ __forceinline__ void gw_gemm(unsigned short *c, unsigned short *g, const unsigned short *a,
                                        const unsigned short *w, const unsigned short *bias, int n, int k)
{
    extern __shared__ unsigned char gw_raw[];
    // the swizzle works on shared addresses: stages at 1024-byte boundaries
    unsigned char *smem = gw_raw + ((1024 - (gw_shared(gw_raw) & 1023)) & 1023);
    const int m0 = blockIdx.y * GW_BM, n0 = blockIdx.x * GW_BN, kts = k / GW_BK;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; i++) d[i] = 0.0f;

    for (int s = 0; s < GW_STAGES - 2; s++) {   // the first tiles in flight
        if (s < kts) gw_load(smem + s * GW_STAGE_BYTES, a, w, m0, n0, k, s);
        gw_commit();
    }
    for (int kt = 0; kt < kts; kt++) {
        gw_wait_stages();   // tile kt has landed
        __syncthreads();    // ... for every thread; and every thread's MMAs of tile kt - 2 are done
        int next = kt + GW_STAGES - 2;
        if (next < kts) gw_load(smem + (next % GW_STAGES) * GW_STAGE_BYTES, a, w, m0, n0, k, next);
        gw_commit();
        const unsigned char *stage = smem + (kt % GW_STAGES) * GW_STAGE_BYTES;
        const unsigned short *as = (const unsigned short *)stage + wg * 64 * GW_BK;
        const unsigned short *ws = (const unsigned short *)stage + GW_BM * GW_BK;
        GW_FENCE();
#pragma unroll
        for (int s = 0; s < GW_BK / 16; s++) {
            unsigned long long da = gw_desc(as + 16 * s), db = gw_desc(ws + 16 * s);
            GW_MMA(da, db);
        }
        GW_COMMIT_WAIT1();
    }
    GW_WAIT_ALL();

    // d[4j + 2h + e] is C's (64 wg + 16 warp + lane / 4 + 8 h, 8 j + 2 (lane % 4) + e)
#pragma unroll
    for (int j = 0; j < GW_BN / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int row = m0 + 64 * wg + 16 * warp + lane / 4 + 8 * h, col = n0 + 8 * j + 2 * (lane & 3);
            float lo = d[4 * j + 2 * h] + gw_h2f(bias[col]), hi = d[4 * j + 2 * h + 1] + gw_h2f(bias[col + 1]);
            unsigned pk;
            asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(pk) : "f"(hi), "f"(lo));
            *(unsigned *)(c + (long long)row * n + col) = pk;
            if (GELU) {
                // the activation of the stored (rounded) values, as a separate kernel reading C would
                float rlo, rhi;
                asm("cvt.f32.f16 %0, %1;" : "=f"(rlo) : "h"((unsigned short)(pk & 0xffffu)));
                asm("cvt.f32.f16 %0, %1;" : "=f"(rhi) : "h"((unsigned short)(pk >> 16)));
                asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(pk) : "f"(act_gelu(rhi)), "f"(act_gelu(rlo)));
                *(unsigned *)(g + (long long)row * n + col) = pk;
            }
        }
}

extern "C" __global__ void __launch_bounds__(GW_THREADS)
gemm_wgmma_bias_f16(unsigned short *c, const unsigned short *a, const unsigned short *w, const unsigned short *bias, int m,
                    int n, int k)
{
    (void)m;
    gw_gemm<false>(c, 0, a, w, bias, n, k);
}

extern "C" __global__ void __launch_bounds__(GW_THREADS)
gemm_wgmma_bias_gelu_f16(unsigned short *c, unsigned short *g, const unsigned short *a, const unsigned short *w,
                         const unsigned short *bias, int m, int n, int k)
{
    (void)m;
    gw_gemm<true>(c, g, a, w, bias, n, k);
}
