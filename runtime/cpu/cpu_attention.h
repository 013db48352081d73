/* runtime/cpu/cpu_attention.h — the reference of fused self-attention
 * (compiler/kernels/attention.cu), composed from the unfused cpu kernels of
 * cpu_kernels.h, so fused and unfused attention can be compared on the cpu.
 *
 * Forward, per batch row b and head h (D = head size, NH heads, H = NH * D):
 *   Qh, Kh, Vh = ck_heads_split of the strided projections
 *   S   = ck_gemm_batched(Qh, Kh^T, alpha 1/sqrt(D))
 *   P   = ck_attn_softmax_fwd(S, mask, causal)     (masked keys exactly 0)
 *   Z   = ck_dropout_fwd(P, index in (B, NH, L, L))
 *   ctx = ck_heads_merge(ck_gemm_batched(Z, Vh))   (B, L, H)
 *   lse = max + log(sum exp(S - max)) over the visible keys of each
 *         (b, h, q) row (B, NH, L); +INFINITY for a row with none visible.
 * Backward: dVh = Z^T dOh, dZ = dOh Vh^T, dP = ck_dropout_bwd(dZ),
 * dS = ck_attn_softmax_bwd(P, dP, 1/sqrt(D)), dQh = dS Kh, dKh = dS^T Qh,
 * each merged back and ADDED into its strided gradient.
 *
 * Strided access (as the CUDA kernels): element d of head h at position t
 * of batch row b is x[(b * L + t) * ld + h * D + d]; one (B, L, 3H) QKV
 * buffer is q = qkv, k = qkv + H, v = qkv + 2H with ld = 3H.  mask (B, L)
 * int32 or NULL; p in [0, 1), p == 0 no dropout.  Double precision
 * throughout (the reference for fp16/bf16/f32 kernels).  Scratch is
 * allocated inside; allocation failure aborts (HPC_ASSERT). */
#ifndef HPC_RUNTIME_CPU_ATTENTION_H
#define HPC_RUNTIME_CPU_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    int64_t B, L, NH, D;     /* batch rows, length, heads, head size */
    bool causal;
    float p;                 /* attention-probability dropout */
    uint64_t seed;
    uint32_t step, salt;
} CkAttnShape;

/* ctx (B, L, NH*D) overwritten, row stride NH*D; lse (B, NH, L) overwritten
 * (may be NULL). */
void ck_attention_fwd_f64(double *ctx, double *lse, const double *q, const double *k,
                          const double *v, int64_t ld, const int32_t *mask, const CkAttnShape *s);

/* dq, dk, dv += the gradients from dctx (B, L, NH*D); gradients strided by
 * ldg like the inputs (dq = dqkv, dk = dqkv + H, dv = dqkv + 2H). */
void ck_attention_bwd_f64(double *dq, double *dk, double *dv, int64_t ldg, const double *dctx,
                          const double *q, const double *k, const double *v, int64_t ld,
                          const int32_t *mask, const CkAttnShape *s);

#endif
