// examples/fused_layernorm.cu — a CUDA program that calls one of hpc's
// fused kernels directly: ln_fwd of bert_tiny, y = LayerNorm(residual +
// x + bias), checked against a double-precision reference on the host.
//
// The kernels come from `hpc compile models/bert_tiny.model --emit-cuda
// examples/kernels` (the `cuda` target of examples/Makefile does it), which
// writes kernels/bert_tiny_kernels.cuh: the model's sizes are compile-time
// constants (HPC_HIDDEN = 128 here) and HPC_KERNEL_ln_fwd names the kernel.
//
// Build and run (needs a GPU of sm_80 or newer to run; builds anywhere):
//   make -C examples cuda && examples/fused_layernorm
// Exits 0 when the kernel agrees with the reference, 1 otherwise.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/bert_tiny_kernels.cuh"

#if HPC_DTYPE != 0
#error "this example reads and writes f32 storage: emit the kernels with --fp32"
#endif

#define ROWS 1000  // R: e.g. batch 8 x length 125
#define H HPC_HIDDEN

#define STR2(x) #x
#define STR(x) STR2(x)  // the kernel's full name, hash included

#define CHECK(call)                                                                        \
    do {                                                                                   \
        cudaError_t e_ = (call);                                                           \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "fused_layernorm: %s failed: %s (%s:%d)\n", #call,             \
                    cudaGetErrorString(e_), __FILE__, __LINE__);                           \
            exit(2);                                                                       \
        }                                                                                  \
    } while (0)

// Deterministic values in [-1, 1) (a 64-bit LCG; quality is not the point).
static float next_uniform(unsigned long long *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

// y = LN(residual + x + bias) in double; returns the largest |y - ref|
// relative to the largest |ref|.
static double check(const float *y, const float *x, const float *res, const float *bias, const float *gamma,
                    const float *beta)
{
    double max_err = 0, max_ref = 0;
    for (int r = 0; r < ROWS; r++) {
        double z[H], mean = 0, var = 0;
        for (int c = 0; c < H; c++) mean += z[c] = (double)res[r * H + c] + x[r * H + c] + bias[c];
        mean /= H;
        for (int c = 0; c < H; c++) var += (z[c] - mean) * (z[c] - mean);
        double rstd = 1.0 / sqrt(var / H + (double)HPC_LN_EPS);
        for (int c = 0; c < H; c++) {
            double ref = (z[c] - mean) * rstd * gamma[c] + beta[c];
            double e = fabs(ref - y[r * H + c]);
            if (!(e <= max_err)) max_err = e;  // NaN propagates
            if (fabs(ref) > max_ref) max_ref = fabs(ref);
        }
    }
    return max_err / max_ref;
}

int main(void)
{
    size_t n = (size_t)ROWS * H;
    float *hx = (float *)malloc(n * sizeof(float)), *hres = (float *)malloc(n * sizeof(float));
    float *hy = (float *)malloc(n * sizeof(float));
    float hbias[H], hgamma[H], hbeta[H];
    unsigned long long seed = 42;
    for (size_t i = 0; i < n; i++) hx[i] = 3.0f * next_uniform(&seed), hres[i] = next_uniform(&seed);
    for (int c = 0; c < H; c++)
        hbias[c] = 0.1f * next_uniform(&seed), hgamma[c] = 1.0f + 0.2f * next_uniform(&seed),
        hbeta[c] = 0.1f * next_uniform(&seed);

    float *x, *res, *y, *bias, *gamma, *beta, *mean, *rstd;  // device
    CHECK(cudaMalloc(&x, n * sizeof(float)));                // (R, H)
    CHECK(cudaMalloc(&res, n * sizeof(float)));              // (R, H)
    CHECK(cudaMalloc(&y, n * sizeof(float)));                // (R, H)
    CHECK(cudaMalloc(&bias, H * sizeof(float)));             // (H)
    CHECK(cudaMalloc(&gamma, H * sizeof(float)));            // (H)
    CHECK(cudaMalloc(&beta, H * sizeof(float)));             // (H)
    CHECK(cudaMalloc(&mean, ROWS * sizeof(float)));          // (R)
    CHECK(cudaMalloc(&rstd, ROWS * sizeof(float)));          // (R)
    CHECK(cudaMemcpy(x, hx, n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(res, hres, n * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(bias, hbias, sizeof hbias, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(gamma, hgamma, sizeof hgamma, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(beta, hbeta, sizeof hbeta, cudaMemcpyHostToDevice));

    // One block of HPC_ROW_THREADS per row; p = 0: no dropout, no z_out.
    HPC_KERNEL_ln_fwd<<<ROWS, HPC_ROW_THREADS>>>(y, NULL, mean, rstd, x, bias, res, gamma, beta, ROWS, 0.0f,
                                                 0, 0, 0);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(hy, y, n * sizeof(float), cudaMemcpyDeviceToHost));

    double err = check(hy, hx, hres, hbias, hgamma, hbeta);
    int ok = err <= 1e-5;
    printf("ln_fwd (%s): %d rows x %d, max relative error %.3g vs double reference: %s\n",
           STR(HPC_KERNEL_ln_fwd), ROWS, H, err, ok ? "ok" : "FAIL");
    cudaFree(x), cudaFree(res), cudaFree(y), cudaFree(bias), cudaFree(gamma), cudaFree(beta);
    cudaFree(mean), cudaFree(rstd);
    free(hx), free(hres), free(hy);
    return ok ? 0 : 1;
}
