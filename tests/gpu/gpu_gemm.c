/* tests/gpu/gpu_gemm.c — hpc's own GEMMs (compiler/kernels/gemm_wgmma.cu:
 * cp.async and 128 x 128 tiles; gemm_wgmma_tma.cu: TMA, a loading
 * warpgroup, 128 x 256 tiles; gemm_wgmma_pp.cu: 128 x 128 tiles, one a
 * multiplying warpgroup, taking turns; all wgmma on sm_90a) against a host
 * reference, then timed beside cuBLASLt (the GEMM the step runs today,
 * with its bias epilogue) at BERT-base's linear-layer shapes.
 *
 * Checks: C = A W^T + bias (f16 out, f32 accumulate) for shapes from one
 * 128 x 128 tile with one k tile to several tiles each way and more k
 * tiles than the ring has stages, by gemm_wgmma_bias_f16 and by
 * gemm_wgmma_bias_gelu_f16, which also writes G = gelu(C) (exact-erf GELU,
 * act_ref_gelu of program/activations.h in the reference); A, W, bias
 * random in [-1, 1] rounded to f16, C and G poisoned with NaN first;
 * likewise gemm_tma_dx_dgelu_f16 (dU = round(dY W) * gelu'(u), W
 * N-major, with gelu(u) and the 16-row column sums of dU beside it) on
 * two shapes.  The TMA kernels run with each way of storing a tile
 * (directly, staged for a TMA store: the _ts kernels, and the ping-pong
 * kernels), their persistent grid also on one to three blocks for more
 * tiles, so that a block's ring and its staging go on from tile to tile
 * (ping-pong: its two warpgroups' turns, odd counts too), and with M past
 * the last full tile (rows the TMA store must clip).  Error = ||got - ref||_2 / ||ref||_2 against a double
 * reference of the rounded inputs; limit 2e-3 (f16 output rounding is 2^-11
 * relative; f32 sums over K <= 1024 add far less); a NaN fails.
 *
 * Timing (on a GPU; HPC_GPU_TEST_NO_TIMING=1 skips it, as tools/cuemu/run.sh
 * does): median of 20 of each kernel alone, CUDA events, at M = 4096 and
 * 32768 tokens: TFLOP/s of ours (cp.async; TMA storing directly; TMA
 * with the TMA store; ping-pong) and of cuBLASLt's (its choice, bias
 * epilogue); for
 * the FFN's first GEMM also ours with GELU against
 * cuBLASLt's followed by a GELU pass (16-byte loads and stores, the bytes
 * of the step's gelu_fwd), and the dX GEMM with the GELU backward
 * (gemm_tma_dx_dgelu_f16 and the ping-pong one, writing dU and gelu(u))
 * against cuBLASLt's dX GEMM and a pass writing the same.
 * Printed, not checked: the numbers decide what comes next.  The passes
 * are simpler than the step's kernels and slower (the GELU pass 111 us
 * at 32768 rows against the step's gelu_fwd at 101, H200, 2026-12-05), so
 * a fused kernel's lead here overstates its gain in the step.
 *
 * Exit 0 when every check passes, 1 on a failure, 4 without an sm_90 GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/half.h"
#include "cuda/cuda_driver.h"
#include "cuda/gemm_cublas.h"
#include "cuda/gemm_own.h"
#include "gpu_check.h"
#include "kernel_sources.h"
#include "program/act_parts.h"
#include "program/activations.h"

enum { TILE = 128, KTILE = 64, THREADS = 256 };

static CudaDevice g_dev;
static CUfunction g_fn, g_fn_gelu, g_fn_act, g_fn_dact;
/* gemm_wgmma_tma.cu's and gemm_wgmma_pp.cu's kernels by GemmOwnStore:
 * storing directly, by the TMA (_ts), ping-pong */
static GemmOwnKernel g_tma[3], g_tma_gelu[3];
/* the dX GEMMs with the GELU backward: [0] gemm_wgmma_tma.cu's, [1] ping-pong */
static GemmOwnKernel g_dx[2];

/* The GELU pass cuBLASLt's GEMM needs after it, and the GELU backward's
 * after the dX GEMM (timing only). */
static const char gelu_pass_src[] =
    "extern \"C\" __global__ void gelu_pass_f16(unsigned short *g, const unsigned short *c, long long n8)\n"
    "{\n"
    "    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n8; i += (long long)gridDim.x * blockDim.x) {\n"
    "        uint4 v = ((const uint4 *)c)[i];\n"
    "        unsigned *w = (unsigned *)&v;\n"
    "        for (int q = 0; q < 4; q++) {\n"
    "            float lo, hi;\n"
    "            asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(lo) : \"h\"((unsigned short)(w[q] & 0xffffu)));\n"
    "            asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(hi) : \"h\"((unsigned short)(w[q] >> 16)));\n"
    "            asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(w[q]) : \"f\"(act_gelu(hi)), \"f\"(act_gelu(lo)));\n"
    "        }\n"
    "        ((uint4 *)g)[i] = v;\n"
    "    }\n"
    "}\n"
    "/* and the GELU backward's after a dX GEMM: du = dg * gelu'(u), and\n"
    " * gelu(u) over dg (what the FFN's second dW GEMM reads) */\n"
    "extern \"C\" __global__ void dgelu_pass_f16(unsigned short *du, unsigned short *dg, const unsigned short *u,\n"
    "                                           long long n8)\n"
    "{\n"
    "    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n8; i += (long long)gridDim.x * blockDim.x) {\n"
    "        uint4 v = ((const uint4 *)dg)[i], x = ((const uint4 *)u)[i], y;\n"
    "        unsigned *w = (unsigned *)&v, *xs = (unsigned *)&x, *ys = (unsigned *)&y;\n"
    "        for (int q = 0; q < 4; q++) {\n"
    "            float lo, hi, ulo, uhi;\n"
    "            asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(lo) : \"h\"((unsigned short)(w[q] & 0xffffu)));\n"
    "            asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(hi) : \"h\"((unsigned short)(w[q] >> 16)));\n"
    "            asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(ulo) : \"h\"((unsigned short)(xs[q] & 0xffffu)));\n"
    "            asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(uhi) : \"h\"((unsigned short)(xs[q] >> 16)));\n"
    "            asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(w[q]) : \"f\"(hi * actg_gelu(uhi)), \"f\"(lo * actg_gelu(ulo)));\n"
    "            asm(\"cvt.rn.f16x2.f32 %0, %1, %2;\" : \"=r\"(ys[q]) : \"f\"(act_gelu(uhi)), \"f\"(act_gelu(ulo)));\n"
    "        }\n"
    "        ((uint4 *)du)[i] = v;\n"
    "        ((uint4 *)dg)[i] = y;\n"
    "    }\n"
    "}\n";
static int g_smem_bytes;

/* GW_SMEM_BYTES of the kernel source: stages x (128 + 128) x 64 x 2 + 1024. */
static int smem_bytes_of(const char *src)
{
    const char *p = strstr(src, "#define GW_STAGES ");
    int stages = p ? atoi(p + strlen("#define GW_STAGES ")) : 0;
    return stages * (TILE + TILE) * KTILE * 2 + 1024;
}

static void load_kernel(void)
{
    const char *src = kernel_source_find("gemm_wgmma.cu");
    if (!src) {
        printf("FAIL  gemm_wgmma.cu is not among the embedded kernel sources\n");
        exit(1);
    }
    /* the activations first: the GELU epilogue calls act_gelu */
    const char *tma = kernel_source_find("gemm_wgmma_tma.cu");
    if (!tma) {
        printf("FAIL  gemm_wgmma_tma.cu is not among the embedded kernel sources\n");
        exit(1);
    }
    const char *pp = kernel_source_find("gemm_wgmma_pp.cu");
    if (!pp) {
        printf("FAIL  gemm_wgmma_pp.cu is not among the embedded kernel sources\n");
        exit(1);
    }
    size_t len = strlen(HPC_ACTIVATIONS_CUDA) + strlen(src) + strlen(tma) + strlen(pp) + strlen(gelu_pass_src) + 1;
    char *full = malloc(len);
    snprintf(full, len, "%s%s%s%s%s", HPC_ACTIVATIONS_CUDA, src, tma, pp, gelu_pass_src);
    CUmodule mod = gpu_check_load_sm90a(full, "gemm_wgmma");
    free(full);
    DRV(cuda_driver()->cuModuleGetFunction(&g_fn, mod, "gemm_wgmma_bias_f16"));
    DRV(cuda_driver()->cuModuleGetFunction(&g_fn_gelu, mod, "gemm_wgmma_bias_gelu_f16"));
    DRV(cuda_driver()->cuModuleGetFunction(&g_fn_act, mod, "gelu_pass_f16"));
    DRV(cuda_driver()->cuModuleGetFunction(&g_fn_dact, mod, "dgelu_pass_f16"));
    g_smem_bytes = smem_bytes_of(src);
    DRV(cuda_driver()->cuFuncSetAttribute(g_fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, g_smem_bytes));
    DRV(cuda_driver()->cuFuncSetAttribute(g_fn_gelu, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, g_smem_bytes));
    HpcError err = {0};
    for (GemmOwnStore s = GEMM_OWN_DIRECT; s <= GEMM_OWN_PINGPONG; s++)
        if (gemm_own_kernel(mod, gemm_own_kernel_name(s, false), s, &g_tma[s], &err) ||
            gemm_own_kernel(mod, gemm_own_kernel_name(s, true), s, &g_tma_gelu[s], &err))
            gpu_check_die("gemm_own_kernel", &err);
    if (gemm_own_kernel(mod, GEMM_OWN_DX_DGELU_KERNEL, GEMM_OWN_DIRECT, &g_dx[0], &err) ||
        gemm_own_kernel(mod, GEMM_OWN_PP_DX_DGELU_KERNEL, GEMM_OWN_PINGPONG, &g_dx[1], &err))
        gpu_check_die("gemm_own_kernel", &err);
}

/* g: 0 for gemm_wgmma_bias_f16, else gemm_wgmma_bias_gelu_f16's G. */
static void launch(CUdeviceptr c, CUdeviceptr g, CUdeviceptr a, CUdeviceptr w, CUdeviceptr bias, int m, int n, int k)
{
    void *plain[] = {&c, &a, &w, &bias, &m, &n, &k}, *gelu[] = {&c, &g, &a, &w, &bias, &m, &n, &k};
    HpcError err = {0};
    if (cuda_launch(g ? g_fn_gelu : g_fn, (unsigned[3]){(unsigned)(n / TILE), (unsigned)(m / TILE), 1},
                    (unsigned[3]){THREADS, 1, 1}, (unsigned)g_smem_bytes, g_dev.stream, g ? gelu : plain, &err)) {
        printf("FAIL  launch gemm_wgmma_bias_f16 %d x %d x %d: %s\n", m, n, k, err.msg);
        exit(1);
    }
}

/* gemm_tma_bias_f16, or with g gemm_tma_bias_gelu_f16 (or their _ts or
 * ping-pong forms, as store says), launched as the step launches it
 * (runtime/cuda/gemm_own.h) on at most `blocks` blocks. */
static void launch_tma(GemmOwnStore store, CUdeviceptr c, CUdeviceptr g, CUdeviceptr a, CUdeviceptr w, CUdeviceptr bias, int m,
                       int n, int k, int blocks)
{
    GemmDesc d;
    gemm_desc_linear(&d, GEMM_F16, GEMM_F16, m, n, k, a, w, bias, c);
    HpcError err = {0};
    if (!gemm_own_fits(&d)) {
        printf("FAIL  gemm_own_fits refuses %d x %d x %d\n", m, n, k);
        exit(1);
    }
    if (gemm_own_run(g ? &g_tma_gelu[store] : &g_tma[store], &d, g, blocks, g_dev.stream, &err)) {
        printf("FAIL  gemm_own_run %d x %d x %d: %s\n", m, n, k, err.msg);
        exit(1);
    }
}

static float uniform(uint64_t *rng) { return gpu_check_uniform24((uint32_t)(gpu_check_xorshift(rng) >> 40)); }

/* ||got - ref|| / ||ref|| over n f16 values, NaNs counted into *nan. */
static double rel_err(const uint16_t *got, const double *ref, size_t n, int *nan)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double v = half_to_f32(got[i]);
        if (v != v) (*nan)++;
        num += (v - ref[i]) * (v - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}

/* tma: 0 for gemm_wgmma.cu's kernel, else gemm_wgmma_tma.cu's (or
 * gemm_wgmma_pp.cu's, as store says) on at most tma blocks (fewer than
 * tiles: each block takes several, its ring going on from one tile to the
 * next). */
static void check_shape_way(int m, int n, int k, int tma, GemmOwnStore store, int gelu, uint64_t seed)
{
    const CudaDriver *cu = cuda_driver();
    uint16_t *a = malloc((size_t)m * k * 2), *w = malloc((size_t)n * k * 2), *c = malloc((size_t)m * n * 2);
    uint16_t *g = malloc((size_t)m * n * 2);
    double *gref = malloc((size_t)m * n * sizeof *gref);
    uint16_t *bias = malloc((size_t)n * 2);
    double *ref = malloc((size_t)m * n * sizeof *ref);
    uint64_t rng = seed;
    for (size_t i = 0; i < (size_t)m * k; i++) a[i] = half_from_f32(uniform(&rng));
    for (size_t i = 0; i < (size_t)n * k; i++) w[i] = half_from_f32(uniform(&rng));
    for (int i = 0; i < n; i++) bias[i] = half_from_f32(uniform(&rng));
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = half_to_f32(bias[j]);
            for (int q = 0; q < k; q++) s += (double)half_to_f32(a[(size_t)i * k + q]) * half_to_f32(w[(size_t)j * k + q]);
            ref[(size_t)i * n + j] = s;
            gref[(size_t)i * n + j] = act_ref_gelu(s);
        }
    CUdeviceptr da, dw, db, dc, dg;
    DRV(cu->cuMemAlloc(&da, (size_t)m * k * 2));
    DRV(cu->cuMemAlloc(&dw, (size_t)n * k * 2));
    DRV(cu->cuMemAlloc(&db, (size_t)n * 2));
    DRV(cu->cuMemAlloc(&dc, (size_t)m * n * 2));
    DRV(cu->cuMemAlloc(&dg, (size_t)m * n * 2));
    DRV(cu->cuMemcpyHtoD(da, a, (size_t)m * k * 2));
    DRV(cu->cuMemcpyHtoD(dw, w, (size_t)n * k * 2));
    DRV(cu->cuMemcpyHtoD(db, bias, (size_t)n * 2));
    DRV(cu->cuMemsetD8(dc, 0xFF, (size_t)m * n * 2));   /* NaN in f16 */
    DRV(cu->cuMemsetD8(dg, 0xFF, (size_t)m * n * 2));
    if (tma)
        launch_tma(store, dc, gelu ? dg : 0, da, dw, db, m, n, k, tma);
    else
        launch(dc, gelu ? dg : 0, da, dw, db, m, n, k);
    DRV(cu->cuStreamSynchronize(g_dev.stream));
    DRV(cu->cuMemcpyDtoH(c, dc, (size_t)m * n * 2));
    DRV(cu->cuMemcpyDtoH(g, dg, (size_t)m * n * 2));
    int nan = 0;
    double rel = rel_err(c, ref, (size_t)m * n, &nan);
    const char *name = !tma ? (gelu ? "gemm_wgmma_bias_gelu_f16" : "gemm_wgmma_bias_f16")
                            : gemm_own_kernel_name(store, gelu);
    char blocks[32] = "";
    if (tma) {   /* the grid gemm_own_run launches */
        GemmDesc d;
        gemm_desc_linear(&d, GEMM_F16, GEMM_F16, m, n, k, da, dw, db, dc);
        snprintf(blocks, sizeof blocks, " (%d tiles, %d blocks)", (int)gemm_own_tiles(store, &d),
                 gemm_own_grid(store, &d, tma < g_dev.sm_count ? tma : g_dev.sm_count));
    }
    result(nan == 0 && rel <= 2e-3, "%s M=%d N=%d K=%d%s: C rel L2 %.2e <= 2e-3, %d NaN", name, m, n, k, blocks, rel,
           nan);
    if (gelu) {
        nan = 0;
        rel = rel_err(g, gref, (size_t)m * n, &nan);
        result(nan == 0 && rel <= 2e-3, "%s M=%d N=%d K=%d%s: G = gelu(C) rel L2 %.2e <= 2e-3, %d NaN", name, m, n,
               k, blocks, rel, nan);
    }
    cu->cuMemFree(da);
    cu->cuMemFree(dw);
    cu->cuMemFree(db);
    cu->cuMemFree(dc);
    cu->cuMemFree(dg);
    free(a);
    free(w);
    free(c);
    free(g);
    free(gref);
    free(bias);
    free(ref);
}

/* gemm_wgmma.cu's kernel (tma 0), or the own GEMM's kernels each way. */
static void check_shape(int m, int n, int k, int tma, int gelu, uint64_t seed)
{
    if (!tma) {
        check_shape_way(m, n, k, 0, GEMM_OWN_DIRECT, gelu, seed);
        return;
    }
    for (GemmOwnStore s = GEMM_OWN_DIRECT; s <= GEMM_OWN_PINGPONG; s++) check_shape_way(m, n, k, tma, s, gelu, seed);
}

/* The dX kernel kern (gemm_tma_dx_dgelu_f16 or the ping-pong one) on at
 * most `blocks` blocks: dU = round(dY W) * gelu'(u) against a double
 * reference of the same (the GEMM's result rounded to f16 first, as the
 * step's separate GEMM and GELU backward round it); dY, W random in
 * [-1, 1], u in [-3, 3], dU poisoned first; the column sums of dU over
 * each `rows` rows. */
static void check_dx_dgelu_with(const GemmOwnKernel *kern, int m, int n, int k, int blocks, int rows, uint64_t seed)
{
    const char *name = kern->store == GEMM_OWN_PINGPONG ? GEMM_OWN_PP_DX_DGELU_KERNEL : GEMM_OWN_DX_DGELU_KERNEL;
    const CudaDriver *cu = cuda_driver();
    uint16_t *dy = malloc((size_t)m * k * 2), *w = malloc((size_t)k * n * 2), *u = malloc((size_t)m * n * 2);
    uint16_t *du = malloc((size_t)m * n * 2);
    double *ref = malloc((size_t)m * n * sizeof *ref);
    uint64_t rng = seed;
    for (size_t i = 0; i < (size_t)m * k; i++) dy[i] = half_from_f32(uniform(&rng));
    for (size_t i = 0; i < (size_t)k * n; i++) w[i] = half_from_f32(uniform(&rng));
    for (size_t i = 0; i < (size_t)m * n; i++) u[i] = half_from_f32(3.0f * uniform(&rng));
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double g = 0;
            for (int q = 0; q < k; q++)
                g += (double)half_to_f32(dy[(size_t)i * k + q]) * half_to_f32(w[(size_t)q * n + j]);
            double g16 = half_to_f32(half_from_f32((float)g));   /* dG as the separate GEMM stores it */
            ref[(size_t)i * n + j] = g16 * act_grad_ref_gelu(half_to_f32(u[(size_t)i * n + j]));
        }
    CUdeviceptr ddy, dw, dup, ddu;
    DRV(cu->cuMemAlloc(&ddy, (size_t)m * k * 2));
    DRV(cu->cuMemAlloc(&dw, (size_t)k * n * 2));
    DRV(cu->cuMemAlloc(&dup, (size_t)m * n * 2));
    DRV(cu->cuMemAlloc(&ddu, (size_t)m * n * 2));
    DRV(cu->cuMemcpyHtoD(ddy, dy, (size_t)m * k * 2));
    DRV(cu->cuMemcpyHtoD(dw, w, (size_t)k * n * 2));
    DRV(cu->cuMemcpyHtoD(dup, u, (size_t)m * n * 2));
    DRV(cu->cuMemsetD8(ddu, 0xFF, (size_t)m * n * 2));   /* NaN in f16 */
    const int groups = (m + rows - 1) / rows;
    CUdeviceptr dy2, dpart;
    DRV(cu->cuMemAlloc(&dy2, (size_t)m * n * 2));
    DRV(cu->cuMemAlloc(&dpart, (size_t)groups * n * 4));
    DRV(cu->cuMemsetD8(dy2, 0xFF, (size_t)m * n * 2));
    DRV(cu->cuMemsetD32Async(dpart, 0x7fc00000u, (size_t)groups * n, g_dev.stream));   /* NaN in f32 */
    GemmOwnDxDgelu g = {.dy = ddy, .w = dw, .u = dup, .du = ddu, .y = dy2, .part = dpart, .M = m, .N = n, .K = k,
                        .part_rows = rows};
    HpcError err = {0};
    if (gemm_own_dx_dgelu_run(kern, &g, blocks < g_dev.sm_count ? blocks : g_dev.sm_count, g_dev.stream, &err))
        gpu_check_die("gemm_own_dx_dgelu_run", &err);
    DRV(cu->cuStreamSynchronize(g_dev.stream));
    DRV(cu->cuMemcpyDtoH(du, ddu, (size_t)m * n * 2));
    int nan = 0;
    double rel = rel_err(du, ref, (size_t)m * n, &nan);
    GemmDesc shape = {.M = m, .N = n, .K = k};
    result(nan == 0 && rel <= 2e-3, "%s M=%d N=%d K=%d (%d blocks): dU rel L2 %.2e <= 2e-3, %d NaN", name, m, n, k,
           gemm_own_grid(kern->store, &shape, blocks < g_dev.sm_count ? blocks : g_dev.sm_count), rel, nan);
    /* y = gelu(u); part: the stored dU's column sums over each 16 rows, against
     * the same sums of the dU it wrote, in double */
    uint16_t *y2 = malloc((size_t)m * n * 2);
    float *part = malloc((size_t)groups * n * 4);
    double *yref = malloc((size_t)m * n * sizeof *yref), num = 0, den = 0;
    DRV(cu->cuMemcpyDtoH(y2, dy2, (size_t)m * n * 2));
    DRV(cu->cuMemcpyDtoH(part, dpart, (size_t)groups * n * 4));
    for (size_t i = 0; i < (size_t)m * n; i++) yref[i] = act_ref_gelu(half_to_f32(u[i]));
    int nan_y = 0, nan_p = 0;
    double rel_y = rel_err(y2, yref, (size_t)m * n, &nan_y);
    for (int r = 0; r < groups; r++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int i = rows * r; i < rows * r + rows && i < m; i++) s += half_to_f32(du[(size_t)i * n + j]);
            double got = part[(size_t)r * n + j];
            nan_p += got != got;
            num += (got - s) * (got - s);
            den += s * s;
        }
    double rel_p = sqrt(num / den);
    result(nan_y == 0 && rel_y <= 2e-3 && nan_p == 0 && rel_p <= 1e-5,
           "%s M=%d N=%d K=%d: y = gelu(u) rel L2 %.2e <= 2e-3; %d column sums of dU over %d rows, rel L2 %.2e <= "
           "1e-5; %d NaN", name, m, n, k, rel_y, groups, rows, rel_p, nan_y + nan_p);
    free(y2);
    free(part);
    free(yref);
    cu->cuMemFree(dy2);
    cu->cuMemFree(dpart);
    cu->cuMemFree(ddy);
    cu->cuMemFree(dw);
    cu->cuMemFree(dup);
    cu->cuMemFree(ddu);
    free(dy);
    free(w);
    free(u);
    free(du);
    free(ref);
}

/* Both dX kernels, the column sums over 16 rows; the ping-pong one also
 * over `rows` (32 or 64) when not 16. */
static void check_dx_dgelu(int m, int n, int k, int blocks, int rows, uint64_t seed)
{
    check_dx_dgelu_with(&g_dx[0], m, n, k, blocks, 16, seed);
    check_dx_dgelu_with(&g_dx[1], m, n, k, blocks, 16, seed);
    if (rows != 16) check_dx_dgelu_with(&g_dx[1], m, n, k, blocks, rows, seed);
}

/* ---- timing ----------------------------------------------------------------- */

static int cmp_float(const void *x, const void *y)
{
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

enum {
    OURS, OURS_GELU, CUBLAS, CUBLAS_GELU, TMA, TMA_GELU, TS, TS_GELU, PP, PP_GELU, TMA_DX_DGELU, PP_DX_DGELU,
    CUBLAS_DX_DGELU
};

/* The ping-pong dX kernel's column partials while timing: (32768 / 16, 3072) f32. */
static CUdeviceptr g_part;

/* Median ms of 20 runs of one way of computing C (and G); the DX ways
 * take a as dY and as u, w as W (k x n), c as dG and then gelu(u), and
 * gout as dU; the ping-pong one also writes the column partials the
 * step's GELU backward writes (program/act_parts.h), which the pass
 * beside it leaves out. */
static float time_one(GemmContext *g, int way, int m, int n, int k, CUdeviceptr a, CUdeviceptr w,
                      CUdeviceptr b16, CUdeviceptr c, CUdeviceptr gout)
{
    const CudaDriver *cu = cuda_driver();
    GemmDesc desc;
    if (way == CUBLAS_DX_DGELU)
        gemm_desc_rm(&desc, GEMM_F16, GEMM_F16, m, n, k, a, w, c);
    else
        gemm_desc_linear(&desc, GEMM_F16, GEMM_F16, m, n, k, a, w, b16, c);
    GemmOwnDxDgelu dx = {.dy = a, .w = w, .u = a, .du = gout, .y = c, .M = m, .N = n, .K = k};
    if (way == PP_DX_DGELU) {   /* with the step's column partials (the other kernel sums 16 rows only) */
        dx.part = g_part;
        dx.part_rows = (int)act_part_group_rows(m);
    }
    CUevent e0, e1;
    DRV(cu->cuEventCreate(&e0, CU_EVENT_DEFAULT));
    DRV(cu->cuEventCreate(&e1, CU_EVENT_DEFAULT));
    float ms[20];
    for (int r = -3; r < 20; r++) {
        HpcError err = {0};
        DRV(cu->cuEventRecord(e0, g_dev.stream));
        if (way == TMA_DX_DGELU || way == PP_DX_DGELU) {
            if (gemm_own_dx_dgelu_run(&g_dx[way == PP_DX_DGELU], &dx, g_dev.sm_count, g_dev.stream, &err)) {
                printf("FAIL  gemm_own_dx_dgelu_run %d x %d x %d: %s\n", m, n, k, err.msg);
                return -1;
            }
        } else if (way == CUBLAS || way == CUBLAS_GELU || way == CUBLAS_DX_DGELU) {
            if (gemm_run(g, &desc, &err)) {
                printf("FAIL  cuBLASLt %d x %d x %d: %s\n", m, n, k, err.msg);
                return -1;
            }
        } else if (way >= TMA && way <= PP_GELU) {
            const GemmOwnStore store = way <= TMA_GELU ? GEMM_OWN_DIRECT : way <= TS_GELU ? GEMM_OWN_TMA_STORE
                                                                                            : GEMM_OWN_PINGPONG;
            launch_tma(store, c, way == TMA_GELU || way == TS_GELU || way == PP_GELU ? gout : 0, a, w, b16, m, n, k,
                       g_dev.sm_count);
        } else {
            launch(c, way == OURS_GELU ? gout : 0, a, w, b16, m, n, k);
        }
        if (way == CUBLAS_GELU) {
            long long n8 = (long long)m * n / 8;
            void *args[] = {&gout, &c, &n8};
            if (cuda_launch(g_fn_act, (unsigned[3]){(unsigned)(g_dev.sm_count * 8), 1, 1}, (unsigned[3]){256, 1, 1}, 0,
                            g_dev.stream, args, &err)) {
                printf("FAIL  gelu pass: %s\n", err.msg);
                return -1;
            }
        }
        if (way == CUBLAS_DX_DGELU) {
            long long n8 = (long long)m * n / 8;
            void *args[] = {&gout, &c, &a, &n8};
            if (cuda_launch(g_fn_dact, (unsigned[3]){(unsigned)(g_dev.sm_count * 8), 1, 1}, (unsigned[3]){256, 1, 1},
                            0, g_dev.stream, args, &err)) {
                printf("FAIL  dgelu pass: %s\n", err.msg);
                return -1;
            }
        }
        DRV(cu->cuEventRecord(e1, g_dev.stream));
        DRV(cu->cuEventSynchronize(e1));
        if (r >= 0) DRV(cu->cuEventElapsedTime(&ms[r], e0, e1));
    }
    cu->cuEventDestroy(e0);
    cu->cuEventDestroy(e1);
    qsort(ms, 20, sizeof ms[0], cmp_float);
    return 0.5f * (ms[9] + ms[10]);
}

/* count f16 values uniform in [-scale, scale] at d, drawn from seed: the
 * timing inputs, random because the L2 compresses a repeated value and
 * would flatter the kernels that move the most bytes. */
static void upload_random(CUdeviceptr d, size_t count, float scale, uint64_t seed)
{
    enum { CHUNK = 1 << 22 };
    uint16_t *h = malloc(CHUNK * sizeof *h);
    if (!h) {
        fprintf(stderr, "gpu_gemm: out of host memory\n");
        exit(1);
    }
    uint64_t rng = seed;
    for (size_t at = 0; at < count; at += CHUNK) {
        size_t n = count - at < CHUNK ? count - at : CHUNK;
        for (size_t i = 0; i < n; i++) h[i] = half_from_f32(scale * uniform(&rng));
        DRV(cuda_driver()->cuMemcpyHtoD(d + at * 2, h, n * 2));
    }
    free(h);
}

static void run_timing(void)
{
    static const int shapes[][3] = {
        {4096, 2304, 768}, {4096, 768, 768}, {4096, 3072, 768}, {4096, 768, 3072},        /* B32 L128 */
        {32768, 2304, 768}, {32768, 768, 768}, {32768, 3072, 768}, {32768, 768, 3072},    /* B256 L128 */
    };
    const CudaDriver *cu = cuda_driver();
    GemmContext g;
    HpcError err = {0};
    if (gemm_init(&g, g_dev.stream, 0, &err)) {
        printf("FAIL  gemm_init: %s\n", err.msg);
        return;
    }
    CUdeviceptr a, w, b16, c, gout;
    DRV(cu->cuMemAlloc(&a, (size_t)32768 * 3072 * 2));
    DRV(cu->cuMemAlloc(&w, (size_t)3072 * 3072 * 2));
    DRV(cu->cuMemAlloc(&b16, 3072 * 2));
    DRV(cu->cuMemAlloc(&c, (size_t)32768 * 3072 * 2));
    DRV(cu->cuMemAlloc(&gout, (size_t)32768 * 3072 * 2));
    DRV(cu->cuMemAlloc(&g_part, (size_t)32768 / 16 * 3072 * 4));
    upload_random(a, (size_t)32768 * 3072, 1.0f, 11);
    upload_random(w, (size_t)3072 * 3072, 0.05f, 12);   /* sums of 3072 products stay well inside f16 */
    upload_random(b16, 3072, 1.0f, 13);
    printf("      timing (median of 20, each kernel alone): M x N x K: cp.async ms (TFLOP/s) | TMA ms (TFLOP/s) | "
           "TMA + TMA store ms (TFLOP/s) | ping-pong ms (TFLOP/s) | cuBLASLt bias ms (TFLOP/s)\n");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int m = shapes[i][0], n = shapes[i][1], k = shapes[i][2];
        float ours = time_one(&g, OURS, m, n, k, a, w, b16, c, gout);
        float tma = time_one(&g, TMA, m, n, k, a, w, b16, c, gout);
        float ts = time_one(&g, TS, m, n, k, a, w, b16, c, gout);
        float pp = time_one(&g, PP, m, n, k, a, w, b16, c, gout);
        float lt = time_one(&g, CUBLAS, m, n, k, a, w, b16, c, gout);
        double flop = 2.0 * m * n * k;
        printf("      %5d x %4d x %4d: %7.3f ms (%5.0f) | %7.3f ms (%5.0f) | %7.3f ms (%5.0f) | %7.3f ms (%5.0f) | "
               "%7.3f ms (%5.0f)\n", m, n, k, ours, flop / (ours * 1e-3) / 1e12, tma, flop / (tma * 1e-3) / 1e12, ts,
               flop / (ts * 1e-3) / 1e12, pp, flop / (pp * 1e-3) / 1e12, lt, flop / (lt * 1e-3) / 1e12);
        if (n == 3072 && k == 768) {   /* the FFN's first GEMM and its GELU */
            float og = time_one(&g, OURS_GELU, m, n, k, a, w, b16, c, gout);
            float tg = time_one(&g, TMA_GELU, m, n, k, a, w, b16, c, gout);
            float sg = time_one(&g, TS_GELU, m, n, k, a, w, b16, c, gout);
            float pg = time_one(&g, PP_GELU, m, n, k, a, w, b16, c, gout);
            float lg = time_one(&g, CUBLAS_GELU, m, n, k, a, w, b16, c, gout);
            printf("      %5d x %4d x %4d + GELU: cp.async fused %7.3f ms | TMA fused %7.3f ms | TMA + TMA store fused "
                   "%7.3f ms | ping-pong fused %7.3f ms | cuBLASLt + GELU pass %7.3f ms\n", m, n, k, og, tg, sg, pg,
                   lg);
            /* the FFN's second GEMM's dX (K = 768 outputs, N = 3072) and the GELU backward */
            float td = time_one(&g, TMA_DX_DGELU, m, n, k, a, w, b16, c, gout);
            float pd = time_one(&g, PP_DX_DGELU, m, n, k, a, w, b16, c, gout);
            float ld = time_one(&g, CUBLAS_DX_DGELU, m, n, k, a, w, b16, c, gout);
            printf("      %5d x %4d x %4d dX + GELU backward: TMA fused %7.3f ms | ping-pong fused %7.3f ms | "
                   "cuBLASLt + dGELU pass %7.3f ms\n", m, n, k, td, pd, ld);
        }
    }
    cu->cuMemFree(a);
    cu->cuMemFree(w);
    cu->cuMemFree(b16);
    cu->cuMemFree(c);
    cu->cuMemFree(gout);
    cu->cuMemFree(g_part);
    gemm_free(&g);
}

int main(void)
{
    if (!gpu_check_open_sm90("gpu_gemm", "wgmma", &g_dev)) return 4;
    load_kernel();
    check_shape(128, 128, 64, 0, 0, 1);      /* one tile, one k tile */
    check_shape(128, 128, 320, 0, 0, 2);     /* more k tiles than stages */
    check_shape(256, 384, 192, 0, 0, 3);     /* tiles each way */
    check_shape(384, 768, 768, 0, 0, 4);     /* BERT-base's width */
    check_shape(128, 256, 128, 0, 1, 5);     /* with GELU */
    check_shape(256, 384, 768, 0, 1, 6);
    const int all = 1 << 20;   /* blocks: one an SM, as the step launches it */
    check_shape(128, 256, 64, all, 0, 7);      /* TMA: one tile, one k tile */
    check_shape(128, 256, 576, all, 0, 8);     /* stages reused twice */
    check_shape(384, 768, 768, all, 0, 9);
    check_shape(256, 512, 192, all, 1, 10);    /* TMA with GELU */
    check_shape(200, 256, 128, all, 0, 11);    /* TMA: M not a multiple of 128 */
    check_shape(384, 768, 576, 2, 0, 12);      /* 9 tiles on 2 blocks, 9 k tiles each: the ring across tiles */
    check_shape(328, 512, 320, 3, 1, 13);      /* 6 tiles on 3 blocks, GELU, a part row tile */
    check_shape(456, 512, 128, 1, 1, 16);      /* 8 tiles on 1 block, GELU: 16 rounds of each staging */
    check_dx_dgelu(256, 512, 192, all, 32, 14);   /* the dX GEMM with the GELU backward: W N-major */
    check_dx_dgelu(328, 768, 320, 2, 64, 15);     /* 9 tiles on 2 blocks, a part row tile */
    check_dx_dgelu(456, 512, 128, 1, 64, 17);     /* ping-pong: 16 tiles on 1 block, as many u loads */
    if (!getenv("HPC_GPU_TEST_NO_TIMING")) run_timing();
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
