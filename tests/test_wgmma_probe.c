/* tests/test_wgmma_probe.c — the wgmma layout probe (tests/gpu/wgmma_probe_src.h,
 * run on a GPU by tests/gpu/gpu_wgmma.c) compiles with NVRTC without a
 * GPU: for sm_90a, where ptxas takes its wgmma.mma_async, fence and
 * commit/wait instructions (their syntax and operand counts are checked
 * here), and for plain sm_90, where the probe's guard leaves them out
 * (a smaller cubin; the kernels still exist); and hpc's own GEMM,
 * compiler/kernels/gemm_wgmma.cu, for sm_90a. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/nvrtc_compile.h"
#include "gpu/wgmma_probe_src.h"
#include "kernel_sources.h"
#include "program/activations.h"

static void compile_probe(const char *extra, void **cubin, size_t *size)
{
    const char *opts[1] = {extra};
    char *log = NULL;
    HpcError err = {0};
    HpcStatus st = nvrtc_compile(WGMMA_PROBE_SRC, "wgmma_probe", 90, opts, extra ? 1 : 0, cubin, size, &log, &err);
    cr_assert_eq(st, HPC_OK, "%s\n%s", err.msg, log ? log : "");
    free(log);
    cr_assert_gt(*size, 0);
    cr_expect(memmem(*cubin, *size, "wg_probe_kmajor", strlen("wg_probe_kmajor")) != NULL);
    cr_expect(memmem(*cubin, *size, "wg_probe_nmajor", strlen("wg_probe_nmajor")) != NULL);
    cr_expect(memmem(*cubin, *size, "wg_probe_areg", strlen("wg_probe_areg")) != NULL);
    cr_expect(memmem(*cubin, *size, "wg_probe_sw128", strlen("wg_probe_sw128")) != NULL);
    cr_expect(memmem(*cubin, *size, "wg_probe_sw128_nmajor", strlen("wg_probe_sw128_nmajor")) != NULL);
}

Test(wgmma_probe, compiles_for_sm90a_and_guards_sm90, .timeout = 120)
{
    void *a = NULL, *plain = NULL;
    size_t na = 0, np = 0;
    compile_probe("--gpu-architecture=sm_90a", &a, &na);
    compile_probe(NULL, &plain, &np);
    cr_expect_gt(na, np, "the sm_90a cubin (%zu bytes) carries the MMA code the sm_90 one (%zu) leaves out", na, np);
    free(a);
    free(plain);
}

/* hpc's own GEMM (compiler/kernels/gemm_wgmma.cu, run on a GPU by
 * tests/gpu/gpu_gemm.c): ptxas takes its m64n128k16 wgmma (64 accumulator
 * operands) and its cp.async ring for sm_90a. */
Test(wgmma_probe, own_gemm_compiles_for_sm90a, .timeout = 120)
{
    const char *kernel = kernel_source_find("gemm_wgmma.cu");
    cr_assert_not_null(kernel, "gemm_wgmma.cu is embedded");
    char *src = malloc(strlen(HPC_ACTIVATIONS_CUDA) + strlen(kernel) + 1);   /* act_gelu first */
    strcpy(src, HPC_ACTIVATIONS_CUDA);
    strcat(src, kernel);
    const char *opts[1] = {"--gpu-architecture=sm_90a"};
    void *cubin = NULL;
    size_t size = 0;
    char *log = NULL;
    HpcError err = {0};
    HpcStatus st = nvrtc_compile(src, "gemm_wgmma", 90, opts, 1, &cubin, &size, &log, &err);
    cr_assert_eq(st, HPC_OK, "%s\n%s", err.msg, log ? log : "");
    cr_expect(memmem(cubin, size, "gemm_wgmma_bias_f16", strlen("gemm_wgmma_bias_f16")) != NULL);
    cr_expect(memmem(cubin, size, "gemm_wgmma_bias_gelu_f16", strlen("gemm_wgmma_bias_gelu_f16")) != NULL);
    free(log);
    free(cubin);
    free(src);
}
