/* runtime/cpu/cpu_kernels.h — the reference numerical kernels of hpc (cpu backend).
 *
 * Plain loops over plain pointers: no IR, no allocation visible to callers,
 * no threads.  The cpu executor (runtime/cpu/cpu_exec.c) calls these for every
 * op, and every CUDA kernel is checked against them, so their numerics ARE
 * the definition of each op.  Owner: engineer "kernels"; notes in
 * docs/kernels.md.
 *
 * Conventions (they hold for every function below unless its comment says
 * otherwise):
 *   - Every function exists as _f32 and _f64 with the same contract; the f64
 *     block at the end repeats the signatures only.
 *   - Buffers are contiguous and row-major; shapes are given as `(N, D)` in
 *     the comments, N rows of D elements.  Sizes are int64_t and may be 0.
 *   - Forward functions OVERWRITE their outputs.
 *   - Backward (_bwd, _grad) functions ACCUMULATE (+=) into every gradient
 *     buffer, so a value used twice just gets two calls; callers zero
 *     gradient buffers before the first contribution.  Gradient buffers
 *     must not alias any input of the same call.
 *   - Accumulation: f32 gemm accumulates dot products in float (speed);
 *     every other reduction (LayerNorm statistics, softmax sums, column sums,
 *     losses, ck_sum) accumulates in double in both precisions.
 *   - Errors: only functions that read ids or labels can fail; they return
 *     HpcStatus and fill *err (which may be NULL).  Everything else is void
 *     and checks its invariants with HPC_ASSERT.
 *
 * Example: a linear layer y = x @ W^T + b, x (N, in), W (out, in), b (out):
 *   ck_gemm_f32(false, true, N, out, in, 1.0f, x, W, 0.0f, y);
 *   ck_bias_add_f32(y, b, N, out);
 * and its backward (dW, db zeroed once per step, dx zeroed by the caller):
 *   ck_gemm_f32(false, false, N, in, out, 1.0f, dy, W, 1.0f, dx);  // dx += dy W
 *   ck_gemm_f32(true, false, out, in, N, 1.0f, dy, x, 1.0f, dW);   // dW += dy^T x
 *   ck_bias_grad_f32(db, dy, N, out);
 */
#ifndef HPC_RUNTIME_CPU_KERNELS_H
#define HPC_RUNTIME_CPU_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"

/* The label value cross-entropy skips (PyTorch's default ignore_index). */
#define CK_IGNORE_INDEX (-100)

/* ---- gemm ------------------------------------------------------------- */

/* C = alpha * op(A) @ op(B) + beta * C, all row-major and contiguous.
 *   op(A) is (M, K): A is stored (M, K), or (K, M) when transA.
 *   op(B) is (K, N): B is stored (K, N), or (N, K) when transB.
 *   C (M, N).  beta == 0 overwrites C without reading it (NaN in C ignored).
 * A linear layer y = x @ W^T + b with W stored (out, in) as PyTorch is
 *   ck_gemm_f32(false, true, rows, out, in, 1, x, W, 0, y) then ck_bias_add.
 * C must not overlap A or B.  A and B may be NULL when M, N or K is 0.
 * f32 accumulates dot products in float: each C element sums its products
 * in k order, in blocks of 256 k, each block's sum times alpha added to C. */
void ck_gemm_f32(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                 float alpha, const float *A, const float *B, float beta, float *C);

/* `batch` independent gemms: matrix i uses A + i*strideA, B + i*strideB,
 * C + i*strideC (strides in elements).  strideA or strideB may be 0 to
 * broadcast one matrix; the C matrices must not overlap each other. */
void ck_gemm_batched_f32(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                         float alpha, const float *A, int64_t strideA,
                         const float *B, int64_t strideB, float beta,
                         float *C, int64_t strideC, int64_t batch);

/* ---- bias ------------------------------------------------------------- */

/* y (N, D) += b (D) on every row.  In place. */
void ck_bias_add_f32(float *y, const float *b, int64_t N, int64_t D);
/* db (D) += column sums of dy (N, D).  Accumulates (double sums in f32). */
void ck_bias_grad_f32(float *db, const float *dy, int64_t N, int64_t D);

/* ---- layernorm (over the last dim D) ---------------------------------- */

/* y = (x - mean) * rstd * gamma + beta per row; x, y (N, D); gamma, beta (D).
 * Saves mean (N) and rstd = 1/sqrt(var + eps) (N), var biased (divide by D)
 * as PyTorch.  Statistics are computed in double.  y may alias x. */
void ck_layernorm_fwd_f32(float *y, float *mean, float *rstd, const float *x,
                          const float *gamma, const float *beta,
                          int64_t N, int64_t D, double eps);
/* Accumulates: dx (N, D) +=, dgamma (D) +=, dbeta (D) += from dy (N, D),
 * the forward's x, mean, rstd, gamma.  dgamma/dbeta may be NULL (not
 * wanted).  No gradient buffer may alias an input. */
void ck_layernorm_bwd_f32(float *dx, float *dgamma, float *dbeta,
                          const float *dy, const float *x, const float *mean,
                          const float *rstd, const float *gamma, int64_t N, int64_t D);
/* ck_layernorm_bwd_f32 from the forward's xhat = (x - mean) * rstd (N, D),
 * its rows ldx >= D elements apart (D + IR_XHAT_ONES_PAD when the site
 * saved its ones column), and rstd (HPC_LN_SAVE=xhat: the sites that save
 * xhat, not x). */
void ck_layernorm_bwd_xhat_f32(float *dx, float *dgamma, float *dbeta, const float *dy, const float *xhat,
                               int64_t ldx, const float *rstd, const float *gamma, int64_t N, int64_t D);

/* ---- elementwise activations (n elements; y may alias x) -------------- */

/* Any activation of program/activations.h, given its reference (or its
 * derivative) in double: y = f(x), rounded once; dx += dy * fprime(x),
 * fprime of the forward INPUT x.  The named kernels below are these with
 * the table's functions. */
typedef double (*CkActFn)(double);
void ck_act_fwd_f32(CkActFn f, float *y, const float *x, int64_t n);
void ck_act_bwd_f32(CkActFn fprime, float *dx, const float *dy, const float *x, int64_t n);
void ck_act_fwd_f64(CkActFn f, double *y, const double *x, int64_t n);
void ck_act_bwd_f64(CkActFn fprime, double *dx, const double *dy, const double *x, int64_t n);

/* gelu(x) = 0.5 x (1 + erf(x / sqrt 2)), the exact form (HF "gelu"). */
void ck_gelu_fwd_f32(float *y, const float *x, int64_t n);
/* dx += dy * gelu'(x); takes the forward INPUT x. */
void ck_gelu_bwd_f32(float *dx, const float *dy, const float *x, int64_t n);
/* gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ("gelu_new"). */
void ck_gelu_tanh_fwd_f32(float *y, const float *x, int64_t n);
/* dx += dy * gelu_tanh'(x); takes the forward INPUT x. */
void ck_gelu_tanh_bwd_f32(float *dx, const float *dy, const float *x, int64_t n);
/* relu(x) = max(x, 0); relu(NaN) = NaN, as torch.relu. */
void ck_relu_fwd_f32(float *y, const float *x, int64_t n);
/* dx += dy where !(x <= 0); takes the forward INPUT x (derivative 0 at
 * x == 0; a NaN x passes dy, as torch's threshold_backward). */
void ck_relu_bwd_f32(float *dx, const float *dy, const float *x, int64_t n);
/* y = tanh(x). */
void ck_tanh_fwd_f32(float *y, const float *x, int64_t n);
/* dx += dy * (1 - y^2); takes the forward OUTPUT y. */
void ck_tanh_bwd_f32(float *dx, const float *dy, const float *y, int64_t n);

/* ---- attention softmax ------------------------------------------------ */

/* probs = softmax_k(scale * scores) per row, scores and probs (B, NH, Lq, Lk).
 * Masking REMOVES entries (their probability is exactly 0), it does not add
 * -10000 as HF BERT does (identical up to exp(-10000) == 0 in float):
 *   - mask (B, Lk) int32, NULL for none: key k of batch b is masked when
 *     mask[b*Lk + k] == 0;
 *   - causal: key k is masked for query q when k > q + (Lk - Lq).
 * A row with every key masked gives all-zero probs (finite, no NaN); a NaN
 * or +inf among a row's visible scores makes every visible prob NaN (as
 * PyTorch and the CUDA kernels), so corrupt numbers are never hidden.
 * Max, exp and sum in double.  probs may alias scores. */
void ck_attn_softmax_fwd_f32(float *probs, const float *scores, const int32_t *mask,
                             bool causal, double scale,
                             int64_t B, int64_t NH, int64_t Lq, int64_t Lk);
/* dscores (rows, Lk) += gradient w.r.t. the forward's `scores` input (the
 * factor `scale` is included): scale * p * (dp - sum_k dp*p).  Masked entries
 * (p == 0) get 0.  rows = B*NH*Lq.  dscores must not alias probs or dprobs. */
void ck_attn_softmax_bwd_f32(float *dscores, const float *probs, const float *dprobs,
                             double scale, int64_t rows, int64_t Lk);

/* ---- dropout (philox.h contract) -------------------------------------- */

/* y[i] = keep(i) ? x[i] / (1 - p) : 0 with keep(i) =
 * philox_dropout_keep(seed, i, step, salt, p), i the flat index 0..n-1.
 * p == 0 copies x; p must be in [0, 1).  No mask is saved: the bwd recomputes
 * it from the same (seed, step, salt).  y may alias x. */
void ck_dropout_fwd_f32(float *y, const float *x, int64_t n, float p,
                        uint64_t seed, uint32_t step, uint32_t salt);
/* dx[i] += keep(i) ? dy[i] / (1 - p) : 0, the same mask as the fwd. */
void ck_dropout_bwd_f32(float *dx, const float *dy, int64_t n, float p,
                        uint64_t seed, uint32_t step, uint32_t salt);

/* ---- embedding -------------------------------------------------------- */

/* out (n, D) row i = table (V, D) row ids[i] (ids (n) int32).  All ids are
 * checked first: one outside [0, V) returns HPC_ERR_INPUT naming the position
 * and the id, and nothing is written. */
HpcStatus ck_embedding_fwd_f32(float *out, const float *table, const int32_t *ids,
                               int64_t n, int64_t V, int64_t D, HpcError *err);
/* dtable (V, D) row ids[i] += dout (n, D) row i (scatter-add; repeated ids
 * add up).  Checks ids as the fwd does; nothing is written on error. */
HpcStatus ck_embedding_bwd_f32(float *dtable, const float *dout, const int32_t *ids,
                               int64_t n, int64_t V, int64_t D, HpcError *err);

/* ---- losses (sums in double; the loss is returned as double) ---------- */

/* Mean cross-entropy of softmax(logits) (N, C) against labels (N) int32,
 * ignoring rows whose label is CK_IGNORE_INDEX (-100); the mean is over
 * non-ignored rows, and 0 such rows gives *loss = 0.  A label outside
 * [0, C) other than -100 returns HPC_ERR_INPUT naming the row and label.
 * Nothing is saved: the bwd recomputes the softmax from logits. */
HpcStatus ck_xent_fwd_f32(double *loss, const float *logits, const int32_t *labels,
                          int64_t N, int64_t C, HpcError *err);
/* dlogits (N, C) += dloss * (softmax(logits) - onehot(label)) / count, count
 * the non-ignored rows; ignored rows get nothing.  Labels must have passed
 * the fwd's check.  dlogits must not alias logits. */
void ck_xent_bwd_f32(float *dlogits, const float *logits, const int32_t *labels,
                     int64_t N, int64_t C, double dloss);
/* Mean squared error over n elements: mean((pred - target)^2); n == 0 gives 0. */
double ck_mse_fwd_f32(const float *pred, const float *target, int64_t n);
/* dpred (n) += dloss * 2 (pred - target) / n. */
void ck_mse_bwd_f32(float *dpred, const float *pred, const float *target,
                    int64_t n, double dloss);

/* ---- layout: heads and first token ------------------------------------ */

/* out (B, NH, L, D) = in (B, L, NH, D) transposed.  No aliasing. */
void ck_heads_split_f32(float *out, const float *in, int64_t B, int64_t L, int64_t NH, int64_t D);
/* dx (B, L, NH, D) += dy (B, NH, L, D) transposed back. */
void ck_heads_split_bwd_f32(float *dx, const float *dy, int64_t B, int64_t L, int64_t NH, int64_t D);
/* out (B, L, NH, D) = in (B, NH, L, D) transposed.  No aliasing. */
void ck_heads_merge_f32(float *out, const float *in, int64_t B, int64_t L, int64_t NH, int64_t D);
/* dx (B, NH, L, D) += dy (B, L, NH, D) transposed back. */
void ck_heads_merge_bwd_f32(float *dx, const float *dy, int64_t B, int64_t L, int64_t NH, int64_t D);
/* out (B, H) = in (B, L, H) at position 0 of each row ([CLS] pooling). */
void ck_first_token_f32(float *out, const float *in, int64_t B, int64_t L, int64_t H);
/* dx (B, L, H) += dy (B, H) at position 0; other positions untouched. */
void ck_first_token_bwd_f32(float *dx, const float *dy, int64_t B, int64_t L, int64_t H);

/* ---- array helpers (n elements) --------------------------------------- */

void ck_fill_f32(float *x, int64_t n, float value);
void ck_scale_f32(float *x, int64_t n, float alpha);            /* x *= alpha */
void ck_axpy_f32(float *y, float alpha, const float *x, int64_t n); /* y += alpha x; y may alias x */
double ck_sum_f32(const float *x, int64_t n);                  /* summed in double */
double ck_max_abs_f32(const float *x, int64_t n);              /* NaN if any NaN; 0 for n == 0 */
bool ck_any_nonfinite_f32(const float *x, int64_t n);          /* any inf or NaN */

/* Precision conversions (n elements; no aliasing).  f64 -> f32 rounds to nearest. */
void ck_copy_f32_to_f64(double *dst, const float *src, int64_t n);
void ck_copy_f64_to_f32(float *dst, const double *src, int64_t n);

/* ==== f64: the same contracts as the f32 functions above ==== */

void ck_gemm_f64(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                 double alpha, const double *A, const double *B, double beta, double *C);

void ck_gemm_batched_f64(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                         double alpha, const double *A, int64_t strideA,
                         const double *B, int64_t strideB, double beta,
                         double *C, int64_t strideC, int64_t batch);

void ck_bias_add_f64(double *y, const double *b, int64_t N, int64_t D);
void ck_bias_grad_f64(double *db, const double *dy, int64_t N, int64_t D);

void ck_layernorm_fwd_f64(double *y, double *mean, double *rstd, const double *x,
                          const double *gamma, const double *beta,
                          int64_t N, int64_t D, double eps);
void ck_layernorm_bwd_f64(double *dx, double *dgamma, double *dbeta,
                          const double *dy, const double *x, const double *mean,
                          const double *rstd, const double *gamma, int64_t N, int64_t D);
void ck_layernorm_bwd_xhat_f64(double *dx, double *dgamma, double *dbeta, const double *dy, const double *xhat,
                               int64_t ldx, const double *rstd, const double *gamma, int64_t N, int64_t D);

void ck_gelu_fwd_f64(double *y, const double *x, int64_t n);
void ck_gelu_bwd_f64(double *dx, const double *dy, const double *x, int64_t n);
void ck_gelu_tanh_fwd_f64(double *y, const double *x, int64_t n);
void ck_gelu_tanh_bwd_f64(double *dx, const double *dy, const double *x, int64_t n);
void ck_relu_fwd_f64(double *y, const double *x, int64_t n);
void ck_relu_bwd_f64(double *dx, const double *dy, const double *x, int64_t n);
void ck_tanh_fwd_f64(double *y, const double *x, int64_t n);
void ck_tanh_bwd_f64(double *dx, const double *dy, const double *y, int64_t n);

void ck_attn_softmax_fwd_f64(double *probs, const double *scores, const int32_t *mask,
                             bool causal, double scale,
                             int64_t B, int64_t NH, int64_t Lq, int64_t Lk);
void ck_attn_softmax_bwd_f64(double *dscores, const double *probs, const double *dprobs,
                             double scale, int64_t rows, int64_t Lk);

void ck_dropout_fwd_f64(double *y, const double *x, int64_t n, float p,
                        uint64_t seed, uint32_t step, uint32_t salt);
void ck_dropout_bwd_f64(double *dx, const double *dy, int64_t n, float p,
                        uint64_t seed, uint32_t step, uint32_t salt);

HpcStatus ck_embedding_fwd_f64(double *out, const double *table, const int32_t *ids,
                               int64_t n, int64_t V, int64_t D, HpcError *err);
HpcStatus ck_embedding_bwd_f64(double *dtable, const double *dout, const int32_t *ids,
                               int64_t n, int64_t V, int64_t D, HpcError *err);

HpcStatus ck_xent_fwd_f64(double *loss, const double *logits, const int32_t *labels,
                          int64_t N, int64_t C, HpcError *err);
void ck_xent_bwd_f64(double *dlogits, const double *logits, const int32_t *labels,
                     int64_t N, int64_t C, double dloss);
double ck_mse_fwd_f64(const double *pred, const double *target, int64_t n);
void ck_mse_bwd_f64(double *dpred, const double *pred, const double *target,
                    int64_t n, double dloss);

void ck_heads_split_f64(double *out, const double *in, int64_t B, int64_t L, int64_t NH, int64_t D);
void ck_heads_split_bwd_f64(double *dx, const double *dy, int64_t B, int64_t L, int64_t NH, int64_t D);
void ck_heads_merge_f64(double *out, const double *in, int64_t B, int64_t L, int64_t NH, int64_t D);
void ck_heads_merge_bwd_f64(double *dx, const double *dy, int64_t B, int64_t L, int64_t NH, int64_t D);
void ck_first_token_f64(double *out, const double *in, int64_t B, int64_t L, int64_t H);
void ck_first_token_bwd_f64(double *dx, const double *dy, int64_t B, int64_t L, int64_t H);

void ck_fill_f64(double *x, int64_t n, double value);
void ck_scale_f64(double *x, int64_t n, double alpha);            /* x *= alpha */
void ck_axpy_f64(double *y, double alpha, const double *x, int64_t n); /* y += alpha x; y may alias x */
double ck_sum_f64(const double *x, int64_t n);                  /* summed in double */
double ck_max_abs_f64(const double *x, int64_t n);              /* NaN if any NaN; 0 for n == 0 */
bool ck_any_nonfinite_f64(const double *x, int64_t n);          /* any inf or NaN */

#endif
