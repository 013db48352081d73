/* tests/gpu/gpu_wgmma.c — our reading of Hopper's warpgroup MMA layouts,
 * checked on the GPU (tests/gpu/wgmma_probe_src.h has the kernels and the
 * layouts they assume), before any kernel relies on one (hpc's own GEMMs,
 * compiler/kernels/gemm_wgmma*.cu, take the K-major swizzled form).
 *
 * The probe source compiles with NVRTC for sm_90a (the architecture-specific
 * target wgmma needs; a later --gpu-architecture option overrides the one
 * nvrtc_compile puts first).  A and B hold multiples of 1/8 in [-2, 2], so
 * every product and every sum over K = 64 is exact in f32 and the check is
 * equality with a host GEMM in double.  Checks:
 *   - K-major A and B (imm-trans-b 0) with LBO 128 and SBO 1024 bytes (the
 *     next core matrix along K, and along M or N): D equal, which also
 *     checks the accumulator layout the probe writes D through;
 *   - N-major B (imm-trans-b 1), the form P V of attention needs (V's rows
 *     are keys): D equal for the (LBO, SBO) pair that the PTX text's
 *     "offset from the first 8 columns to the next 8 columns" means; both
 *     readings are tried and the line says which one held (exactly one
 *     must);
 *   - A from registers (P V with P in registers), in the fragment layout
 *     of mma.sync's m16n8k16 A per warp, and K-major B: D equal;
 *   - K-major A and B in the 128-byte swizzle (a GEMM tile's layout): D
 *     equal;
 *   - N-major B in the 128-byte swizzle (W as stored, the operand of a dX
 *     GEMM), m64n128k16 so that B spans two atoms along N: D equal with
 *     LBO the step between atoms along N and SBO the one along K (the
 *     reading tools/cuemu takes), and not with the two swapped.
 * Under the CPU emulator (tools/cuemu) the same checks test the
 * emulator's reading of wgmma; on the GPU, the hardware's.
 * Exit 0 when every check passes, 1 on a failure, 4 without an sm_90 GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/half.h"
#include "cuda/cuda_driver.h"
#include "cuda/nvrtc_compile.h"
#include "gpu_check.h"
#include "wgmma_probe_src.h"

enum { N64 = 64 };

static CudaDevice g_dev;
static CUmodule g_mod;



/* Runs kernel `name` on a and b (64 x 64 f16 each) with the descriptors'
 * byte offsets; d: 64 x 64 f32. */
static void run_probe(const char *name, const uint16_t *a, const uint16_t *b, unsigned lbo_a, unsigned sbo_a,
                      unsigned lbo_b, unsigned sbo_b, float *d)
{
    const CudaDriver *cu = cuda_driver();
    CUfunction f;
    DRV(cu->cuModuleGetFunction(&f, g_mod, name));
    CUdeviceptr da, db, dd;
    DRV(cu->cuMemAlloc(&da, N64 * N64 * 2));
    DRV(cu->cuMemAlloc(&db, N64 * N64 * 2));
    DRV(cu->cuMemAlloc(&dd, N64 * N64 * 4));
    DRV(cu->cuMemcpyHtoD(da, a, N64 * N64 * 2));
    DRV(cu->cuMemcpyHtoD(db, b, N64 * N64 * 2));
    DRV(cu->cuMemsetD32Async(dd, 0x7fc00000u, N64 * N64, g_dev.stream));   /* NaN: a place never written fails */
    void *args[] = {&dd, &da, &db, &lbo_a, &sbo_a, &lbo_b, &sbo_b};
    HpcError err = {0};
    if (cuda_launch(f, (unsigned[3]){1, 1, 1}, (unsigned[3]){128, 1, 1}, 0, g_dev.stream, args, &err))
        gpu_check_die(name, &err);
    if (cu->cuStreamSynchronize(g_dev.stream) != CUDA_SUCCESS) {   /* a fault ends the context: say where */
        printf("FAIL  %s (lbo/sbo A %u/%u, B %u/%u) faulted\n", name, lbo_a, sbo_a, lbo_b, sbo_b);
        exit(1);
    }
    DRV(cu->cuMemcpyDtoH(d, dd, N64 * N64 * 4));
    cu->cuMemFree(da);
    cu->cuMemFree(db);
    cu->cuMemFree(dd);
}

/* wg_probe_sw128_nmajor on a (64 x 64) and b (64 k x 128 n, row-major)
 * with B's descriptor offsets; d: 64 x 128 f32. */
static void run_probe_n128(const uint16_t *a, const uint16_t *b, unsigned lbo_b, unsigned sbo_b, float *d)
{
    const CudaDriver *cu = cuda_driver();
    CUfunction f;
    DRV(cu->cuModuleGetFunction(&f, g_mod, "wg_probe_sw128_nmajor"));
    CUdeviceptr da, db, dd;
    DRV(cu->cuMemAlloc(&da, N64 * N64 * 2));
    DRV(cu->cuMemAlloc(&db, N64 * 128 * 2));
    DRV(cu->cuMemAlloc(&dd, N64 * 128 * 4));
    DRV(cu->cuMemcpyHtoD(da, a, N64 * N64 * 2));
    DRV(cu->cuMemcpyHtoD(db, b, N64 * 128 * 2));
    DRV(cu->cuMemsetD32Async(dd, 0x7fc00000u, N64 * 128, g_dev.stream));
    unsigned unused = 0;
    void *args[] = {&dd, &da, &db, &unused, &unused, &lbo_b, &sbo_b};
    HpcError err = {0};
    if (cuda_launch(f, (unsigned[3]){1, 1, 1}, (unsigned[3]){128, 1, 1}, 0, g_dev.stream, args, &err))
        gpu_check_die("wg_probe_sw128_nmajor", &err);
    if (cu->cuStreamSynchronize(g_dev.stream) != CUDA_SUCCESS) {
        printf("FAIL  wg_probe_sw128_nmajor (lbo/sbo B %u/%u) faulted\n", lbo_b, sbo_b);
        exit(1);
    }
    DRV(cu->cuMemcpyDtoH(d, dd, N64 * 128 * 4));
    cu->cuMemFree(da);
    cu->cuMemFree(db);
    cu->cuMemFree(dd);
}

/* Elements of got that differ from ref (NaN counts). */
static int mismatches(const float *got, const double *ref)
{
    int bad = 0;
    for (int i = 0; i < N64 * N64; i++) bad += !((double)got[i] == ref[i]);
    return bad;
}

int main(void)
{
    if (!gpu_check_open_sm90("gpu_wgmma", "wgmma", &g_dev)) return 4;
    g_mod = gpu_check_load_sm90a(WGMMA_PROBE_SRC, "wgmma_probe");

    /* a: A row-major (row m, k contiguous); b: B row-major (row k, n
     * contiguous); bt: B transposed (row n, k contiguous) */
    uint16_t *a = malloc(N64 * N64 * 2), *b = malloc(N64 * N64 * 2), *bt = malloc(N64 * N64 * 2);
    float *fa = malloc(N64 * N64 * 4), *fb = malloc(N64 * N64 * 4), *d = malloc(N64 * N64 * 4);
    double *ref = malloc(N64 * N64 * sizeof *ref);
    uint64_t rng = 0x3243f6a8885a308dull;
    for (int i = 0; i < N64 * N64; i++) {
        fa[i] = (float)((int)(gpu_check_xorshift(&rng) % 33) - 16) / 8.0f;
        fb[i] = (float)((int)(gpu_check_xorshift(&rng) % 33) - 16) / 8.0f;
        a[i] = half_from_f32(fa[i]);
        b[i] = half_from_f32(fb[i]);
    }
    for (int k = 0; k < N64; k++)
        for (int n = 0; n < N64; n++) bt[n * N64 + k] = b[k * N64 + n];
    for (int m = 0; m < N64; m++)
        for (int n = 0; n < N64; n++) {
            double s = 0;
            for (int k = 0; k < N64; k++) s += (double)fa[m * N64 + k] * fb[k * N64 + n];
            ref[m * N64 + n] = s;
        }

    run_probe("wg_probe_kmajor", a, bt, 128, 1024, 128, 1024, d);
    int bad = mismatches(d, ref);
    result(bad == 0, "K-major A and B, LBO 128 (next core along K), SBO 1024: %d of %d elements of D differ", bad,
           N64 * N64);
    if (bad) {   /* what the other reading gives, to say which part of ours is wrong */
        run_probe("wg_probe_kmajor", a, bt, 1024, 128, 1024, 128, d);
        printf("      with LBO and SBO swapped: %d of %d differ\n", mismatches(d, ref), N64 * N64);
    }

    run_probe("wg_probe_nmajor", a, b, 128, 1024, 128, 1024, d);
    int bad_n_lbo128 = mismatches(d, ref);
    run_probe("wg_probe_nmajor", a, b, 128, 1024, 1024, 128, d);
    int bad_n_lbo1024 = mismatches(d, ref);
    result((bad_n_lbo128 == 0) != (bad_n_lbo1024 == 0),
           "N-major B (trans-b 1): LBO 128 / SBO 1024 (the next core along N, then along K) %d differ; "
           "LBO 1024 / SBO 128 %d differ; exactly one reading must hold", bad_n_lbo128, bad_n_lbo1024);

    run_probe("wg_probe_areg", a, bt, 0, 0, 128, 1024, d);
    bad = mismatches(d, ref);
    result(bad == 0, "A from registers in mma.sync's m16n8k16 A layout, K-major B: %d of %d elements of D differ",
           bad, N64 * N64);

    run_probe("wg_probe_sw128", a, bt, 0, 0, 0, 0, d);
    bad = mismatches(d, ref);
    result(bad == 0, "K-major A and B in the 128-byte swizzle (SBO 1024, 32 bytes a k16 step): %d of %d elements "
           "of D differ", bad, N64 * N64);

    /* B 64 k x 128 n: b's columns, then the same again negated (another half, other values) */
    uint16_t *b128 = malloc(N64 * 128 * 2);
    float *d128 = malloc(N64 * 128 * 4);
    double *ref128 = malloc(N64 * 128 * sizeof *ref128);
    for (int k = 0; k < N64; k++)
        for (int n = 0; n < 128; n++)
            b128[k * 128 + n] = half_from_f32(n < N64 ? fb[k * N64 + n] : -fb[k * N64 + n - N64] / 2);
    for (int m = 0; m < N64; m++)
        for (int n = 0; n < 128; n++) {
            double s = 0;
            for (int k = 0; k < N64; k++) s += (double)fa[m * N64 + k] * half_to_f32(b128[k * 128 + n]);
            ref128[m * 128 + n] = s;
        }
    int bad_lbo_n = 0, bad_lbo_k = 0;
    run_probe_n128(a, b128, 8192, 1024, d128);
    for (int i = 0; i < N64 * 128; i++) bad_lbo_n += !((double)d128[i] == ref128[i]);
    run_probe_n128(a, b128, 1024, 8192, d128);
    for (int i = 0; i < N64 * 128; i++) bad_lbo_k += !((double)d128[i] == ref128[i]);
    result(bad_lbo_n == 0 && bad_lbo_k != 0,
           "N-major B in the 128-byte swizzle (m64n128k16, trans-b 1): LBO 8192 / SBO 1024 (the next atom along N, "
           "then along K) %d of %d differ, the reading the emulator takes; LBO 1024 / SBO 8192 %d differ",
           bad_lbo_n, N64 * 128, bad_lbo_k);
    free(b128);
    free(d128);
    free(ref128);

    free(a);
    free(b);
    free(bt);
    free(fa);
    free(fb);
    free(d);
    free(ref);
    cuda_driver()->cuModuleUnload(g_mod);
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
