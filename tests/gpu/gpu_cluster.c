/* tests/gpu/gpu_cluster.c — thread block clusters (sm_90) in the forms a
 * GEMM with clusters of 2 and TMA multicast uses, checked on the GPU and
 * through the CPU emulator (tools/cuemu), whose cluster support this
 * checks before any kernel relies on it.
 *
 * The source compiles with NVRTC for sm_90a.  Checks:
 *   - rank and remote arrivals (cl_arrive, __cluster_dims__(2, 1, 1),
 *     grid 4 x 1): %cluster_ctarank is blockIdx.x % 2; a handshake of
 *     thread 0s: rank 0 arrives (mbarrier.arrive.release.cluster
 *     .shared::cluster, through mapa) on rank 1's barrier, rank 1 waits on
 *     its own and then arrives on rank 0's, which rank 0 waits on; no
 *     block arrives on its own barrier, so a mapa that missed the peer
 *     would hang (a deadlock on the emulator);
 *   - a multicast TMA load (cl_multicast, clusters of 2, grid 4 x 1): rank
 *     0 alone loads a box {64, 128} of a 2-D f16 tensor (the 128-byte
 *     swizzle) with mask 0b11; both blocks wait on their own barrier (each
 *     announced the bytes itself, perhaps after the peer's copy completed
 *     them) and copy their shared memory out; each copy must hold row r of
 *     the box at r * 128 bytes, its 16-byte chunk c at chunk c ^ (r % 8),
 *     and rank 1's must equal rank 0's;
 *   - the cluster barrier (cl_barrier, __cluster_dims__(1, 2, 1), grid
 *     2 x 4: the rank is blockIdx.y % 2): every thread adds 1 to its
 *     cluster's global counter, then barrier.cluster (one asm statement
 *     with arrive and wait, or the two as separate statements), then
 *     reads the counter, which must hold every thread's additions of the
 *     rounds so far; a second barrier keeps the next round's additions
 *     out of this round's reads.
 * Exit 0 when every check passes, 1 on a failure, 4 without an sm_90 GPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_driver.h"
#include "cuda/nvrtc_compile.h"
#include "gpu_check.h"

enum {
    THREADS = 128,
    BOX_X = 64, BOX_Y = 128,   /* elements: a box is 128 rows of 128 bytes */
    BOX_BYTES = BOX_X * BOX_Y * 2,
    TENSOR_X = 128, TENSOR_Y = 256,
    ROUNDS = 3,
};

static const char CLUSTER_SRC[] =
    "typedef unsigned int u32;\n"
    "typedef unsigned long long u64;\n"
    "struct alignas(64) cl_tmap { u64 v[16]; };   // a CUtensorMap's 128 bytes\n"
    "\n"
    "__device__ __forceinline__ u32 cl_shared(const void *p) { return (u32)__cvta_generic_to_shared(p); }\n"
    "__device__ __forceinline__ u32 cl_rank(void)\n"
    "{\n"
    "    u32 r;\n"
    "    asm volatile(\"mov.u32 %0, %%cluster_ctarank;\" : \"=r\"(r));\n"
    "    return r;\n"
    "}\n"
    "__device__ __forceinline__ void cl_sync(void)\n"
    "{\n"
    "    asm volatile(\"barrier.cluster.arrive.release.aligned;\\nbarrier.cluster.wait.acquire.aligned;\\n\" ::: \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void cl_mbar_init(u32 bar, u32 count)\n"
    "{\n"
    "    asm volatile(\"mbarrier.init.shared::cta.b64 [%0], %1;\\n\" ::\"r\"(bar), \"r\"(count) : \"memory\");\n"
    "    asm volatile(\"fence.mbarrier_init.release.cluster;\\n\" ::: \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void cl_wait(u32 bar, u32 parity)\n"
    "{\n"
    "    u32 done;\n"
    "    do {\n"
    "        asm volatile(\"{\\n.reg .pred p;\\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\\nselp.u32 %0, 1, 0, p;\\n}\\n\"\n"
    "                     : \"=r\"(done) : \"r\"(bar), \"r\"(parity) : \"memory\");\n"
    "    } while (!done);\n"
    "}\n"
    "\n"
    "// out[4 block + 0..3]: rank, 1 once the own barrier's phase 0 completed, blockIdx.x, the peer's rank\n"
    "extern \"C\" __global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(128) cl_arrive(u32 *out)\n"
    "{\n"
    "    __shared__ __align__(8) u64 bar;\n"
    "    const u32 rank = cl_rank(), peer = rank ^ 1u;\n"
    "    if (threadIdx.x == 0) cl_mbar_init(cl_shared(&bar), 1);\n"
    "    cl_sync();   // the peer's barrier is initialised before we arrive on it\n"
    "    if (threadIdx.x == 0) {\n"
    "        u32 remote;\n"
    "        asm volatile(\"mapa.shared::cluster.u32 %0, %1, %2;\" : \"=r\"(remote) : \"r\"(cl_shared(&bar)), \"r\"(peer));\n"
    "        if (rank == 1) cl_wait(cl_shared(&bar), 0);   // rank 0 arrives first, then rank 1 answers\n"
    "        asm volatile(\"mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\" ::\"r\"(remote) : \"memory\");\n"
    "        if (rank == 0) cl_wait(cl_shared(&bar), 0);\n"
    "        out[4 * blockIdx.x + 0] = rank;\n"
    "        out[4 * blockIdx.x + 1] = 1;\n"
    "        out[4 * blockIdx.x + 2] = blockIdx.x;\n"
    "        out[4 * blockIdx.x + 3] = peer;\n"
    "    }\n"
    "    cl_sync();   // no block leaves while its peer may still arrive on its barrier\n"
    "}\n"
    "\n"
    "// cluster c = blockIdx.x / 2 loads the box at (64 (c % 2), 128 (c / 2)); out: each block's copy\n"
    "extern \"C\" __global__ void __launch_bounds__(128) __cluster_dims__(2, 1, 1)\n"
    "cl_multicast(const __grid_constant__ cl_tmap map, unsigned char *out)\n"
    "{\n"
    "    extern __shared__ unsigned char cl_raw[];\n"
    "    // the swizzle works on shared addresses: the box at a 1024-byte boundary\n"
    "    unsigned char *box = cl_raw + ((1024 - (cl_shared(cl_raw) & 1023)) & 1023);\n"
    "    u64 *bar = (u64 *)(box + 16384);\n"
    "    const u32 rank = cl_rank(), c = blockIdx.x / 2;\n"
    "    if (threadIdx.x == 0) cl_mbar_init(cl_shared(bar), 1);\n"
    "    cl_sync();   // both barriers initialised before the copy completes bytes on them\n"
    "    if (threadIdx.x == 0) {\n"
    "        asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n\" ::\"r\"(cl_shared(bar)), \"r\"(16384u) : \"memory\");\n"
    "        if (rank == 0) {\n"
    "            const unsigned short mask = 3;\n"
    "            asm volatile(\"cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster\"\n"
    "                         \" [%0], [%1, {%2, %3}], [%4], %5;\"\n"
    "                         ::\"r\"(cl_shared(box)), \"l\"((u64)&map), \"r\"(64 * (int)(c % 2)), \"r\"(128 * (int)(c / 2)),\n"
    "                           \"r\"(cl_shared(bar)), \"h\"(mask) : \"memory\");\n"
    "        }\n"
    "    }\n"
    "    cl_wait(cl_shared(bar), 0);\n"
    "    for (int i = threadIdx.x; i < 16384 / 16; i += blockDim.x)\n"
    "        ((uint4 *)(out + 16384 * blockIdx.x))[i] = ((const uint4 *)box)[i];\n"
    "    cl_sync();   // no block leaves while the multicast may still write its peer\n"
    "}\n"
    "\n"
    "// counts[c] for cluster c = (blockIdx.x, blockIdx.y / 2); out[t] for global thread t:\n"
    "// rank | 1 << 8 for each round whose count was whole after the barrier\n"
    "extern \"C\" __global__ void __cluster_dims__(1, 2, 1) __launch_bounds__(128) cl_barrier(u32 *counts, u32 *out)\n"
    "{\n"
    "    const u32 c = blockIdx.x + gridDim.x * (blockIdx.y / 2), n = 2 * blockDim.x;\n"
    "    u32 seen = cl_rank();\n"
    "    for (u32 round = 0; round < 3; round++) {\n"
    "        atomicAdd(&counts[c], 1u);\n"
    "        if (round == 1) {   // the two halves as separate statements\n"
    "            asm volatile(\"barrier.cluster.arrive.release.aligned;\" ::: \"memory\");\n"
    "            asm volatile(\"barrier.cluster.wait.acquire.aligned;\" ::: \"memory\");\n"
    "        } else {\n"
    "            cl_sync();\n"
    "        }\n"
    "        if (atomicAdd(&counts[c], 0u) == n * (round + 1)) seen += 1u << (8 + round);\n"
    "        cl_sync();\n"
    "    }\n"
    "    out[(blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x] = seen;\n"
    "}\n";

static CudaDevice g_dev;
static CUmodule g_mod;



static CUfunction function(const char *name)
{
    CUfunction f;
    DRV(cuda_driver()->cuModuleGetFunction(&f, g_mod, name));
    return f;
}

static void launch(const char *name, CUfunction f, unsigned gx, unsigned gy, unsigned smem, void **args)
{
    HpcError err = {0};
    if (cuda_launch(f, (unsigned[3]){gx, gy, 1}, (unsigned[3]){THREADS, 1, 1}, smem, g_dev.stream, args, &err))
        gpu_check_die(name, &err);
    if (cuda_driver()->cuStreamSynchronize(g_dev.stream) != CUDA_SUCCESS) {   /* a fault ends the context */
        printf("FAIL  %s faulted\n", name);
        exit(1);
    }
}

static void check_arrive(void)
{
    const CudaDriver *cu = cuda_driver();
    enum { BLOCKS = 4 };
    CUdeviceptr dout;
    DRV(cu->cuMemAlloc(&dout, BLOCKS * 4 * 4));
    DRV(cu->cuMemsetD32Async(dout, 0xffffffffu, BLOCKS * 4, g_dev.stream));
    void *args[] = {&dout};
    launch("cl_arrive", function("cl_arrive"), BLOCKS, 1, 0, args);
    uint32_t out[BLOCKS * 4];
    DRV(cu->cuMemcpyDtoH(out, dout, sizeof out));
    int bad = 0;
    for (unsigned b = 0; b < BLOCKS; b++)
        bad += out[4 * b] != b % 2 || out[4 * b + 1] != 1 || out[4 * b + 2] != b || out[4 * b + 3] != ((b % 2) ^ 1);
    result(bad == 0, "clusters of 2: %%cluster_ctarank is blockIdx.x %% 2, and each block's wait passes on its "
           "peer's arrival through mapa (%d of %d blocks wrong)", bad, BLOCKS);
    cu->cuMemFree(dout);
}

static void check_multicast(void)
{
    const CudaDriver *cu = cuda_driver();
    enum { BLOCKS = 4 };
    /* element (x, y) holds the bits y * 256 + x: each one different */
    uint16_t *tensor = malloc(TENSOR_X * TENSOR_Y * 2);
    for (int y = 0; y < TENSOR_Y; y++)
        for (int x = 0; x < TENSOR_X; x++) tensor[y * TENSOR_X + x] = (uint16_t)(y * 256 + x);
    CUdeviceptr dt, dout;
    DRV(cu->cuMemAlloc(&dt, TENSOR_X * TENSOR_Y * 2));
    DRV(cu->cuMemAlloc(&dout, BLOCKS * BOX_BYTES));
    DRV(cu->cuMemcpyHtoD(dt, tensor, TENSOR_X * TENSOR_Y * 2));
    DRV(cu->cuMemsetD32Async(dout, 0xffffffffu, BLOCKS * BOX_BYTES / 4, g_dev.stream));
    CUtensorMap map;
    cuuint64_t dim[2] = {TENSOR_X, TENSOR_Y}, stride[1] = {TENSOR_X * 2};
    cuuint32_t box[2] = {BOX_X, BOX_Y}, estride[2] = {1, 1};
    DRV(cu->cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, (void *)(uintptr_t)dt, dim, stride, box,
                                   estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    unsigned smem = BOX_BYTES + 1024 + 64;   /* the box at a 1024-byte boundary, then the barrier */
    CUfunction f = function("cl_multicast");
    DRV(cu->cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem));
    void *args[] = {&map, &dout};
    launch("cl_multicast", f, BLOCKS, 1, smem, args);
    uint16_t *out = malloc(BLOCKS * BOX_BYTES);
    DRV(cu->cuMemcpyDtoH(out, dout, BLOCKS * BOX_BYTES));
    int bad_place = 0, bad_same = 0;
    for (int b = 0; b < BLOCKS; b++) {
        int c = b / 2, x0 = BOX_X * (c % 2), y0 = BOX_Y * (c / 2);
        const uint16_t *got = out + (size_t)b * BOX_BYTES / 2;
        for (int r = 0; r < BOX_Y; r++)
            for (int x = 0; x < BOX_X; x++) {
                int chunk = x / 8, at = r * 64 + (chunk ^ (r % 8)) * 8 + x % 8;   /* in elements */
                bad_place += got[at] != tensor[(y0 + r) * TENSOR_X + x0 + x];
            }
        if (b % 2) bad_same += memcmp(got, got - BOX_BYTES / 2, BOX_BYTES) != 0;
    }
    result(bad_place == 0, "multicast TMA (mask 0b11, issued by rank 0): the 128-byte-swizzled box in both blocks "
           "of each cluster (%d of %d elements misplaced)", bad_place, BLOCKS * BOX_X * BOX_Y);
    result(bad_same == 0, "multicast TMA: rank 1's copy equals rank 0's (%d of %d clusters differ)", bad_same,
           BLOCKS / 2);
    free(tensor);
    free(out);
    cu->cuMemFree(dt);
    cu->cuMemFree(dout);
}

static void check_barrier(void)
{
    const CudaDriver *cu = cuda_driver();
    enum { GX = 2, GY = 4, CLUSTERS = GX * GY / 2, ALL = GX * GY * THREADS };
    CUdeviceptr dcounts, dout;
    DRV(cu->cuMemAlloc(&dcounts, CLUSTERS * 4));
    DRV(cu->cuMemAlloc(&dout, ALL * 4));
    DRV(cu->cuMemsetD32Async(dcounts, 0, CLUSTERS, g_dev.stream));
    DRV(cu->cuMemsetD32Async(dout, 0xffffffffu, ALL, g_dev.stream));
    void *args[] = {&dcounts, &dout};
    launch("cl_barrier", function("cl_barrier"), GX, GY, 0, args);
    uint32_t *out = malloc(ALL * 4), counts[CLUSTERS];
    DRV(cu->cuMemcpyDtoH(out, dout, ALL * 4));
    DRV(cu->cuMemcpyDtoH(counts, dcounts, sizeof counts));
    int bad_rank = 0, bad_round = 0, bad_count = 0;
    for (int t = 0; t < ALL; t++) {
        unsigned by = (unsigned)t / THREADS / GX;
        bad_rank += (out[t] & 0xffu) != by % 2;
        bad_round += (out[t] >> 8) != (1u << ROUNDS) - 1;
    }
    for (int c = 0; c < CLUSTERS; c++) bad_count += counts[c] != 2u * THREADS * ROUNDS;
    result(bad_rank == 0, "clusters of (1, 2, 1): %%cluster_ctarank is blockIdx.y %% 2 (%d of %d threads wrong)",
           bad_rank, ALL);
    result(bad_round == 0 && bad_count == 0, "barrier.cluster (arrive and wait in one statement, and apart): every "
           "thread of the cluster had added before any passed, %d rounds (%d of %d threads saw a count short; "
           "%d of %d final counts wrong)", ROUNDS, bad_round, ALL, bad_count, CLUSTERS);
    free(out);
    cu->cuMemFree(dcounts);
    cu->cuMemFree(dout);
}

int main(void)
{
    if (!gpu_check_open_sm90("gpu_cluster", "thread block clusters", &g_dev)) return 4;
    g_mod = gpu_check_load_sm90a(CLUSTER_SRC, "gpu_cluster");

    check_arrive();
    check_multicast();
    check_barrier();

    cuda_driver()->cuModuleUnload(g_mod);
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
