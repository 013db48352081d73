/* runtime/cpu/cpu_fast_kernels.h — the f32 reference kernels of
 * cpu_kernels.h spread over every core (runtime/cpu/cpu_threads.h), for the
 * cpu executor's fast mode.
 *
 * Promise: each function has the contract of the ck_*_f32 kernel named in
 * its comment AND gives bitwise the same result, on any thread count.  Most
 * call that very kernel on slices (rows, batch entries or element ranges),
 * which works because each output element depends only on its own slice;
 * the column sums (bias and LayerNorm parameter gradients) are split by
 * column instead and repeat the reference's arithmetic in the same order;
 * dropout repeats ck_dropout_fwd_f32's formula with the element's global
 * index.  The fast-mode ops that are not bitwise are the gemm
 * (runtime/cpu/cpu_fast_gemm.h), the exact GELU (runtime/cpu/cpu_fast_gelu.h,
 * within 1 float ulp) and the optimizer's gradient norm
 * (runtime/cpu/cpu_fast_optim.h, f64 sums in another order). */
#ifndef HPC_RUNTIME_CPU_FAST_KERNELS_H
#define HPC_RUNTIME_CPU_FAST_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

/* An elementwise kernel y = f(x) (n elements), e.g. ck_gelu_fwd_f32. */
typedef void (*CkUnaryFn)(float *y, const float *x, int64_t n);
/* An elementwise kernel y op= f(a, b) (n elements), e.g. ck_gelu_bwd_f32. */
typedef void (*CkBinaryFn)(float *y, const float *a, const float *b, int64_t n);

void fast_unary(CkUnaryFn fn, float *y, const float *x, int64_t n);
void fast_binary(CkBinaryFn fn, float *y, const float *a, const float *b, int64_t n);
/* y = a + b (n elements), as the executor's ADD; y may alias a or b. */
void fast_add_f32(float *y, const float *a, const float *b, int64_t n);
/* x rounded in place to fp16 (half_round_array) or bf16 (bf16_round_array). */
void fast_round(float *x, int64_t n, bool bf16);
/* x = 0 over n floats. */
void fast_zero(float *x, int64_t n);

/* ck_dropout_fwd_f32. */
void fast_dropout_fwd(float *y, const float *x, int64_t n, float p, uint64_t seed, uint32_t step,
                      uint32_t salt);
/* ck_bias_add_f32 and ck_bias_grad_f32. */
void fast_bias_add(float *y, const float *b, int64_t N, int64_t D);
void fast_bias_grad(float *db, const float *dy, int64_t N, int64_t D);
/* ck_layernorm_fwd_f32. */
void fast_layernorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                        const float *beta, int64_t N, int64_t D, double eps);
/* ck_layernorm_bwd_f32; dgamma and dbeta may be NULL (not wanted). */
void fast_layernorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                        const float *mean, const float *rstd, const float *gamma, int64_t N,
                        int64_t D);
/* ck_attn_softmax_fwd_f32 and ck_attn_softmax_bwd_f32. */
void fast_softmax_fwd(float *probs, const float *scores, const int32_t *mask, bool causal,
                      double scale, int64_t B, int64_t NH, int64_t Lq, int64_t Lk);
void fast_softmax_bwd(float *dscores, const float *probs, const float *dprobs, double scale,
                      int64_t rows, int64_t Lk);
/* ck_heads_split_f32 and ck_heads_merge_f32. */
void fast_heads_split(float *out, const float *in, int64_t B, int64_t L, int64_t NH, int64_t D);
void fast_heads_merge(float *out, const float *in, int64_t B, int64_t L, int64_t NH, int64_t D);
/* ck_axpy_f32: y += alpha x. */
void fast_axpy(float *y, float alpha, const float *x, int64_t n);

#endif
