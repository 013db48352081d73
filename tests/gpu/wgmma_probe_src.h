/* tests/gpu/wgmma_probe_src.h — a probe of Hopper's warpgroup MMA
 * (wgmma.mma_async) as hpc would drive it from NVRTC: the CUDA source that
 * tests/gpu/gpu_wgmma.c runs and tests/test_wgmma_probe.c compiles (no GPU
 * needed) for sm_90a.  Not a kernel of the step: the first step towards
 * the GEMMs and attention of hpc's own that NOTES.md ("What the goals
 * need") names, checking our reading of the PTX layouts before anything
 * is built on them.
 *
 * wg_probe_kmajor / wg_probe_nmajor: one warpgroup (128 threads) computes
 * D (64 x 64, f32) = A (64 x 64) B over K = 64 in four k16 steps of
 * wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16, both operands from
 * shared memory through descriptors without swizzle:
 *   - A is K-major: row m of A (global, row-major 64 x 64) holds its 64 k
 *     contiguous;
 *   - B: kmajor takes bt (global 64 x 64, row n = column n of B, k
 *     contiguous) with imm-trans-b 0; nmajor takes b (global 64 x 64, row
 *     k of B, n contiguous) with imm-trans-b 1.
 * Shared memory holds each operand as 8 x 8 core matrices (8 rows of 16
 * bytes, 128 contiguous bytes): core (g, c) of A (rows 8g.., k 8c..) at
 * byte (g * 8 + c) * 128, row r of it at + r * 16; B likewise with n (kmajor)
 * or k (nmajor) as the row.  The descriptor's leading and stride byte
 * offsets (LBO, SBO) are the kernel's arguments, so the host can try both
 * readings of the PTX text for each major-ness: 128 (the next core along
 * the operand's second index) and 1024 (the next along its first).  Step s
 * starts at core column 2s (K-major) or core row 2s (N-major B).
 * wg_probe_areg: A from registers instead (the form attention's P V would
 * use, P in registers), in the fragment layout of mma.sync's m16n8k16 A
 * for each warp's 16 rows; B K-major from shared memory.
 * wg_probe_sw128: both operands K-major in the 128-byte swizzle, the
 * layout a GEMM's tiles want (no bank conflicts): row r of an operand
 * (64 k, 128 bytes) at r * 128 in 1024-byte atoms of 8 rows (SBO 1024),
 * its 16-byte chunk c (k 8c .. 8c + 7) at chunk c ^ (r % 8); step s's
 * descriptor starts 32 s bytes on, and the hardware applies the XOR to
 * the address it forms (so the arrays sit at 1024-byte boundaries).
 * D is written row-major through the accumulator layout we expect: warp w
 * holds rows 16w .. 16w + 15, and for n8 chunk j its registers 4j .. 4j+3
 * are (16w + lane/4, 8j + 2 (lane % 4) + {0, 1}) and the same 8 rows on. */
#ifndef HPC_TESTS_GPU_WGMMA_PROBE_SRC_H
#define HPC_TESTS_GPU_WGMMA_PROBE_SRC_H

static const char WGMMA_PROBE_SRC[] =
    "typedef unsigned short u16;\n"
    "typedef unsigned int u32;\n"
    "typedef unsigned long long u64;\n"
    "\n"
    "__device__ __forceinline__ u64 wg_desc(const void *smem, u32 lbo, u32 sbo)\n"
    "{\n"
    "    u32 addr = (u32)__cvta_generic_to_shared(smem);\n"
    "    return (u64)((addr >> 4) & 0x3FFFu) | ((u64)((lbo >> 4) & 0x3FFFu) << 16) |\n"
    "           ((u64)((sbo >> 4) & 0x3FFFu) << 32);   // no swizzle, base offset 0\n"
    "}\n"
    "\n"
    "// element (row, col) of a 64 x 64 operand at its core-matrix place\n"
    "__device__ __forceinline__ int wg_core_at(int row, int col)\n"
    "{\n"
    "    return ((row >> 3) * 8 + (col >> 3)) * 64 + (row & 7) * 8 + (col & 7);\n"
    "}\n"
    "\n"
    "// D (64 x 64) row-major from the accumulators, in the layout the header gives\n"
    "__device__ __forceinline__ void wg_store_d(float *out, const float *d)\n"
    "{\n"
    "    int w = threadIdx.x / 32, l = threadIdx.x % 32;\n"
    "    for (int j = 0; j < 8; j++)\n"
    "        for (int h = 0; h < 2; h++) {\n"
    "            int row = 16 * w + l / 4 + 8 * h, col = 8 * j + 2 * (l % 4);\n"
    "            out[row * 64 + col] = d[4 * j + 2 * h];\n"
    "            out[row * 64 + col + 1] = d[4 * j + 2 * h + 1];\n"
    "        }\n"
    "}\n"
    "\n"
    "// the same for the 128-byte swizzle (mode 1 in bits 62-63); LBO unused\n"
    "__device__ __forceinline__ u64 wg_desc_sw128(const void *smem, u32 sbo)\n"
    "{\n"
    "    u32 addr = (u32)__cvta_generic_to_shared(smem);\n"
    "    return (u64)((addr >> 4) & 0x3FFFu) | ((u64)1 << 16) | ((u64)((sbo >> 4) & 0x3FFFu) << 32) |\n"
    "           ((u64)1 << 62);\n"
    "}\n"
    "\n"
    "// element (row, k) of a 64 x 64 K-major operand in the 128-byte swizzle\n"
    "__device__ __forceinline__ int wg_sw128_at(int row, int k)\n"
    "{\n"
    "    return row * 64 + (((k >> 3) ^ (row & 7)) << 3) + (k & 7);\n"
    "}\n"
    "\n"
    "// A, B and 16 KiB more: with the wrong one of the two LBO/SBO readings\n"
    "// a descriptor reaches up to 15 KiB past B's start, which must stay inside\n"
    "// the block's shared memory (past it the launch faults, and the check\n"
    "// meant to tell the readings apart never runs)\n"
    "#define WG_PROBE_SMEM_ELEMS (4 * 64 * 64)\n"
    "\n"
    "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n"
    "#define WG_MMA(TRANS_B)                                                                      \\\n"
    "    asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %34, 0;\\n\"                             \\\n"
    "                 \"wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 \"                        \\\n"
    "                 \"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, \"    \\\n"
    "                 \"%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, \" \\\n"
    "                 \"%32, %33, p, 1, 1, 0, \" #TRANS_B \";\\n}\\n\"                                 \\\n"
    "                 : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3]), \"+f\"(d[4]), \"+f\"(d[5]),  \\\n"
    "                   \"+f\"(d[6]), \"+f\"(d[7]), \"+f\"(d[8]), \"+f\"(d[9]), \"+f\"(d[10]), \"+f\"(d[11]), \\\n"
    "                   \"+f\"(d[12]), \"+f\"(d[13]), \"+f\"(d[14]), \"+f\"(d[15]), \"+f\"(d[16]), \"+f\"(d[17]), \\\n"
    "                   \"+f\"(d[18]), \"+f\"(d[19]), \"+f\"(d[20]), \"+f\"(d[21]), \"+f\"(d[22]), \"+f\"(d[23]), \\\n"
    "                   \"+f\"(d[24]), \"+f\"(d[25]), \"+f\"(d[26]), \"+f\"(d[27]), \"+f\"(d[28]), \"+f\"(d[29]), \\\n"
    "                   \"+f\"(d[30]), \"+f\"(d[31])                                                  \\\n"
    "                 : \"l\"(da), \"l\"(db), \"r\"(s > 0 ? 1 : 0))\n"
    "#else\n"
    "#define WG_MMA(TRANS_B) (void)da, (void)db, (void)s\n"
    "#endif\n"
    "\n"
    "// A, B operand: 64 x 64 f16 row-major in global; d: 64 x 64 f32 out\n"
    "#define WG_PROBE(NAME, TRANS_B)                                                              \\\n"
    "extern \"C\" __global__ void __launch_bounds__(128)                                          \\\n"
    "NAME(float *out, const u16 *a, const u16 *b, u32 lbo_a, u32 sbo_a, u32 lbo_b, u32 sbo_b)     \\\n"
    "{                                                                                           \\\n"
    "    /* one array, B then room: the reading that is wrong walks past B */                    \\\n"
    "    __shared__ __align__(128) u16 sm[WG_PROBE_SMEM_ELEMS];                                  \\\n"
    "    u16 *as = sm, *bs = sm + 64 * 64;                                                       \\\n"
    "    for (int i = threadIdx.x; i < 64 * 64; i += 128) {                                      \\\n"
    "        as[wg_core_at(i / 64, i % 64)] = a[i];                                              \\\n"
    "        bs[wg_core_at(i / 64, i % 64)] = b[i];                                              \\\n"
    "    }                                                                                       \\\n"
    "    __syncthreads();                                                                        \\\n"
    "    float d[32];                                                                            \\\n"
    "    for (int i = 0; i < 32; i++) d[i] = 0.0f;                                               \\\n"
    "    WG_FENCES_BEFORE();                                                                     \\\n"
    "    for (int s = 0; s < 4; s++) {                                                           \\\n"
    "        /* step s: core column 2s (K-major), core row 2s (N-major B) */                      \\\n"
    "        u64 da = wg_desc(as + 128 * s, lbo_a, sbo_a);                                       \\\n"
    "        u64 db = wg_desc(bs + (TRANS_B ? 1024 * s : 128 * s), lbo_b, sbo_b);                \\\n"
    "        WG_MMA(TRANS_B);                                                                    \\\n"
    "    }                                                                                       \\\n"
    "    WG_FENCES_AFTER();                                                                      \\\n"
    "    wg_store_d(out, d);                                                                     \\\n"
    "}\n"
    "\n"
    "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n"
    "// shared-memory writes (generic proxy) made visible to wgmma (async proxy),\n"
    "// then the accumulator registers fenced; after: all groups complete\n"
    "#define WG_FENCES_BEFORE()                                                                   \\\n"
    "    asm volatile(\"fence.proxy.async.shared::cta;\\nwgmma.fence.sync.aligned;\\n\" ::: \"memory\")\n"
    "#define WG_FENCES_AFTER()                                                                    \\\n"
    "    asm volatile(\"wgmma.commit_group.sync.aligned;\\nwgmma.wait_group.sync.aligned 0;\\n\" ::: \"memory\")\n"
    "#else\n"
    "#define WG_FENCES_BEFORE() (void)0\n"
    "#define WG_FENCES_AFTER() (void)0\n"
    "#endif\n"
    "\n"
    "WG_PROBE(wg_probe_kmajor, 0)\n"
    "WG_PROBE(wg_probe_nmajor, 1)\n"
    "\n"
    "// K-major A and B (bt) in the 128-byte swizzle; lbo_a etc. unused\n"
    "extern \"C\" __global__ void __launch_bounds__(128)\n"
    "wg_probe_sw128(float *out, const u16 *a, const u16 *b, u32 lbo_a, u32 sbo_a, u32 lbo_b, u32 sbo_b)\n"
    "{\n"
    "    __shared__ __align__(1024) u16 as[64 * 64];\n"
    "    __shared__ __align__(1024) u16 bs[64 * 64];\n"
    "    for (int i = threadIdx.x; i < 64 * 64; i += 128) {\n"
    "        as[wg_sw128_at(i / 64, i % 64)] = a[i];\n"
    "        bs[wg_sw128_at(i / 64, i % 64)] = b[i];\n"
    "    }\n"
    "    __syncthreads();\n"
    "    (void)lbo_a; (void)sbo_a; (void)lbo_b; (void)sbo_b;\n"
    "    float d[32];\n"
    "    for (int i = 0; i < 32; i++) d[i] = 0.0f;\n"
    "    WG_FENCES_BEFORE();\n"
    "    for (int s = 0; s < 4; s++) {\n"
    "        u64 da = wg_desc_sw128(as + 16 * s, 1024), db = wg_desc_sw128(bs + 16 * s, 1024);\n"
    "        WG_MMA(0);\n"
    "    }\n"
    "    WG_FENCES_AFTER();\n"
    "    wg_store_d(out, d);\n"
    "}\n"
    "\n"
    "// A from registers (as attention's P V would take P): per warp the 16 rows\n"
    "// 16w.., per k16 step four f16x2 registers, as mma.sync's m16n8k16 A:\n"
    "// (r, c), (r + 8, c), (r, c + 8), (r + 8, c + 8), r = 16w + lane/4, c = 2 (lane % 4)\n"
    "extern \"C\" __global__ void __launch_bounds__(128)\n"
    "wg_probe_areg(float *out, const u16 *a, const u16 *b, u32 lbo_a, u32 sbo_a, u32 lbo_b, u32 sbo_b)\n"
    "{\n"
    "    __shared__ __align__(128) u16 bs[64 * 64];\n"
    "    for (int i = threadIdx.x; i < 64 * 64; i += 128) bs[wg_core_at(i / 64, i % 64)] = b[i];\n"
    "    __syncthreads();\n"
    "    (void)lbo_a; (void)sbo_a;\n"
    "    int w = threadIdx.x / 32, l = threadIdx.x % 32, r = 16 * w + l / 4, c = 2 * (l % 4);\n"
    "    u32 ar[4][4];\n"
    "    for (int s = 0; s < 4; s++)\n"
    "        for (int q = 0; q < 4; q++) {\n"
    "            int row = r + 8 * (q & 1), col = 16 * s + c + 8 * (q >> 1);\n"
    "            ar[s][q] = (u32)a[row * 64 + col] | (u32)a[row * 64 + col + 1] << 16;\n"
    "        }\n"
    "    float d[32];\n"
    "    for (int i = 0; i < 32; i++) d[i] = 0.0f;\n"
    "    WG_FENCES_BEFORE();\n"
    "    for (int s = 0; s < 4; s++) {\n"
    "        u64 db = wg_desc(bs + 128 * s, lbo_b, sbo_b);\n"
    "#if defined(__CUDA_ARCH_FEAT_SM90_ALL)\n"
    "        asm volatile(\"{\\n.reg .pred p;\\nsetp.ne.b32 p, %37, 0;\\n\"\n"
    "                     \"wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 \"\n"
    "                     \"{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, \"\n"
    "                     \"%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, \"\n"
    "                     \"{%32, %33, %34, %35}, %36, p, 1, 1, 0;\\n}\\n\"\n"
    "                     : \"+f\"(d[0]), \"+f\"(d[1]), \"+f\"(d[2]), \"+f\"(d[3]), \"+f\"(d[4]), \"+f\"(d[5]),\n"
    "                       \"+f\"(d[6]), \"+f\"(d[7]), \"+f\"(d[8]), \"+f\"(d[9]), \"+f\"(d[10]), \"+f\"(d[11]),\n"
    "                       \"+f\"(d[12]), \"+f\"(d[13]), \"+f\"(d[14]), \"+f\"(d[15]), \"+f\"(d[16]), \"+f\"(d[17]),\n"
    "                       \"+f\"(d[18]), \"+f\"(d[19]), \"+f\"(d[20]), \"+f\"(d[21]), \"+f\"(d[22]), \"+f\"(d[23]),\n"
    "                       \"+f\"(d[24]), \"+f\"(d[25]), \"+f\"(d[26]), \"+f\"(d[27]), \"+f\"(d[28]), \"+f\"(d[29]),\n"
    "                       \"+f\"(d[30]), \"+f\"(d[31])\n"
    "                     : \"r\"(ar[s][0]), \"r\"(ar[s][1]), \"r\"(ar[s][2]), \"r\"(ar[s][3]), \"l\"(db), \"r\"(s > 0 ? 1 : 0));\n"
    "#else\n"
    "        (void)db; (void)ar;\n"
    "#endif\n"
    "    }\n"
    "    WG_FENCES_AFTER();\n"
    "    wg_store_d(out, d);\n"
    "}\n";

#endif
