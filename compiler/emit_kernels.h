/* compiler/emit_kernels.h — the CUDA source of one model's kernels.
 *
 * kemit_source() specialises the templates in compiler/kernels/ (the *.cu files) to a
 * KernelConfig: hidden, heads, head size, FFN, vocab, labels, LayerNorm eps,
 * the dtype and the causal flag are baked in as compile-time constants
 * (`#define HPC_HIDDEN 768`, ...); B and L stay kernel arguments.  The result
 * is one NUL-terminated CUDA C++ translation unit, with no #include, for
 * NVRTC (sm_80 or newer: bf16 conversions are sm_80 instructions).
 *
 * Naming.  Every kernel is `extern "C"` and named BASE + SUFFIX, where
 *   SUFFIX = "_" DTYPE "_h" HIDDEN "_" HASH6
 * DTYPE is f32, f16 or bf16, and HASH6 six hex digits of an FNV-1a hash of
 * the whole source apart from the suffix line (constants and templates), so
 * two configs, or two versions of a template, never share a name:
 *   ln_fwd_f16_h768_3fa9c1.   kemit_name() builds it.
 *
 * Conventions for every kernel below.  st_t is the config's storage type
 * (f32, or the 16 bits of fp16/bf16); compute and accumulation are f32
 * (double where noted).  R = rows.  Activation gradients (st_t) are
 * OVERWRITTEN unless an `accumulate` argument says otherwise; parameter
 * gradients (f32) are ACCUMULATED (+=), so micro-batches add up.  Dropout
 * follows runtime/cpu/philox.h exactly: the flat index named per kernel, the
 * step and salt given, p == 0 means no dropout (eval).  Pointers to (H)
 * vectors and row starts must be 16-byte aligned (cuMemAlloc gives 256).
 * H = hidden, NH = heads, ROW_THREADS = kemit_row_layout().threads.
 * docs/cuda_kernels.md has the reasoning, the checks and the timings.
 *
 * Kernel (grid x block)                  semantics
 * philox_test(u32 *out (4n), u64 base, i64 n, u64 seed, u32 step, u32 salt)
 *   (ceil(n/256) x 256)                  out[4i+k] = philox4x32_10({base+i lo, hi, step, salt}, seed).x[k]
 * dropout_fwd(st_t *y, const st_t *x, i64 n, float p, u64 seed, u32 step, u32 salt)
 *   (any x 256)                          y = keep(i) ? x / (1-p) : 0
 * dropout_bwd(st_t *dx, const st_t *dy, i64 n, float p, seed, step, salt, int accumulate)
 *   (any x 256)                          dx (+)= keep(i) ? dy / (1-p) : 0
 * ln_fwd(st_t *y, st_t *z_out|NULL, float *mean, float *rstd, const st_t *x,
 *        const st_t *bias|NULL, const st_t *residual|NULL, const st_t *gamma,
 *        const st_t *beta, int R, float p, seed, step, salt)
 *   (R x ROW_THREADS)                    z = residual + dropout(x + bias) (index r*H + c),
 *                                        y = LN(z) with HPC_LN_EPS; mean/rstd (R) f32 saved
 * ln_bwd(st_t *dx|NULL, st_t *dresid|NULL, float *partials, const st_t *dy, const st_t *z,
 *        const float *mean, const float *rstd, const st_t *gamma, int R, float p,
 *        seed, step, salt, int accumulate_dresid)
 *   (G x (ROW_THREADS, RPB)), G <= min(ceil(R/RPB), KEMIT_PARTS); 4 x SM count was
 *   fastest on an H200 (RPB = kemit_row_layout().rpb, 1 by default):
 *                                        dz = LN backward; dresid (+)= dz; dx = dropout_bwd(dz);
 *                                        partials (G, 3, H) f32: sums of dy*xhat, dy, dx
 * ln_grad_reduce(float *dgamma, float *dbeta, float *dbias|NULL, const float *partials, int parts)
 *   (ceil(H/256) x 256)                  dgamma += sum partials[.][0], dbeta += [1], dbias += [2]
 * emb_fwd(st_t *out, float *mean, float *rstd, const int *ids, const int *type_ids|NULL,
 *         const st_t *word, const st_t *pos, const st_t *type|NULL, const st_t *gamma,
 *         const st_t *beta, int B, int L, float p, seed, step, salt)
 *   (B*L x ROW_THREADS)                  x = word[id] + pos[t + position_offset] + type[tt];
 *                                        out = dropout(LN(x)) (or dropout(x) without embedding LN)
 * emb_bwd(float *dword, float *dpos, float *dtype|NULL, float *partials, float *type_partials,
 *         const st_t *dout, const int *ids, const int *type_ids|NULL, const st_t *word,
 *         const st_t *pos, const st_t *type|NULL, const float *mean, const float *rstd,
 *         const st_t *gamma, int B, int L, float p, seed, step, salt)
 *   (G x (ROW_THREADS, RPB)), G as ln_bwd: dword, dpos += by fp32 atomicAdd (order
 *                                        varies: last-bit non-determinism); with type_vocab
 *                                        <= 2 the type sums go to type_partials (G, T, H) for
 *                                        colsum_finish(dtype, type_partials, G, T*H), else
 *                                        atomicAdd into dtype; LN partials as ln_bwd (slot 2
 *                                        zero) for ln_grad_reduce
 * bias_ACT_fwd(st_t *y, const st_t *x, const st_t *bias|NULL, int R, int C)   ACT in
 *   gelu, gelu_tanh, relu, tanh; (any x 256): y = act(x + bias)
 * bias_ACT_bwd(st_t *dx, const st_t *dy, const st_t *x, const st_t *bias|NULL, int R, int C)
 *   (any x 256)                          dx = dy * act'(x + bias), x the forward input
 * colsum_partial(float *partials (P, C), const st_t *dy (R, C), int R, int C)
 *   ((ceil(C/32), P) x (32, 8))          partials[p] = column sums of a share of the rows
 * colsum_finish(float *out (C), const float *partials, int P, int C)
 *   (ceil(C/256) x 256)                  out += sum_p partials[p]  (bias gradients)
 * attn_softmax_fwd(st_t *out, st_t *probs|NULL, const st_t *scores, const int *mask|NULL,
 *                  u32 *mask_bits|NULL, float scale, int B, int Lq, int Lk, float p, seed, step, salt)
 *   (ceil(B*NH*Lq/4) x 128)              probs = masked softmax(scale*scores) (masked keys
 *                                        exactly 0: mask[b*Lk+k]==0, causal k > q+Lk-Lq),
 *                                        out = dropout(probs), index in (B, NH, Lq, Lk);
 *                                        mask_bits (B*NH*Lq, 4*ceil(Lk/128)) u32 saves the kept
 *                                        bits for the backward (layout private to the pair);
 *                                        Lk <= KernelConfig.max_positions rounded up to 128
 * attn_softmax_bwd(st_t *dscores, const st_t *dout, const st_t *probs, const u32 *mask_bits|NULL,
 *                  float scale, int B, int Lq, int Lk, float p, seed, step, salt)
 *   (ceil(B*NH*Lq/4) x 128)              dp = dropout_bwd(dout) (mask from mask_bits, or Philox
 *                                        when NULL); dscores = scale*probs*(dp - sum dp*probs)
 * xent_count(float *inv_count, const int *labels, int N)     (1 x 1024)   1/max(#labels != -100, 1)
 * xent_fwd_bwd[_f32](T *dlogits, float *row_loss, const T *logits, const int *labels,
 *        const float *inv_count, const float *dscale|NULL, int N, int C)
 *   (N x 256), T = st_t or float         row_loss = lse - logit[label] (0 ignored, NaN bad label);
 *                                        dlogits = (softmax - onehot) * inv_count * *dscale
 * xent_loss_reduce(float *loss, const float *row_loss, const float *inv_count, int N) (1 x 1024)
 * mse_fwd_bwd[_f32](T *dpred, float *loss, const T *pred, const float *target,
 *        const float *dscale|NULL, int N)  (1 x 1024)  loss = mean((pred-target)^2), dpred = 2(pred-target)/N * *dscale
 * The optimizer and the loss scaler are not here: they are part of the step
 * module (compiler/emit_optim.h).
 *
 * Usage:
 *   KernelConfig kc; kemit_config_from_spec(&kc, &spec, KEMIT_F16);
 *   char *src, suffix[KEMIT_SUFFIX_MAX];
 *   if (kemit_source(&kc, &src, suffix, &err)) return err.code;
 *   ... nvrtc_compile(src, ...); kemit_name(suffix, "ln_fwd", name, sizeof name);
 *   ... cuModuleGetFunction(&f, module, name); free(src);
 */
#ifndef HPC_COMPILER_EMIT_KERNELS_H
#define HPC_COMPILER_EMIT_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "program/spec.h"

typedef enum { KEMIT_F32, KEMIT_F16, KEMIT_BF16 } KemitDtype;

typedef struct {
    int64_t hidden, heads, head_dim, ffn, vocab, labels;
    int64_t max_positions, type_vocab, position_offset;
    double ln_eps, hidden_dropout, attention_dropout;
    KemitDtype dtype;           /* storage of activations and weight copies */
    SpecActivation activation;  /* the FFN's (all four act kernels are emitted) */
    bool causal;                /* attention softmax masks k > q */
    bool embedding_ln;          /* emb_fwd/bwd include the LayerNorm (BERT) */
    int row_rpb;                /* rows per block of ln_bwd/emb_bwd: 1..4, 0 = the emitter's choice */
} KernelConfig;

/* Largest max_positions the one-warp-per-row softmax holds in registers. */
#define KEMIT_MAX_POSITIONS 2048
/* Most blocks of ln_bwd / emb_bwd, so partials are at most (KEMIT_PARTS, 3, H). */
#define KEMIT_PARTS 1024
/* Room for a suffix such as "_bf16_h12345_abcdef" and its NUL. */
#define KEMIT_SUFFIX_MAX 48

/* The model's sizes from a checked spec, with the given storage dtype. */
void kemit_config_from_spec(KernelConfig *cfg, const ModelSpec *spec, KemitDtype dtype);

/* Generates the source (malloc'd, caller frees) and the names' suffix.
 * HPC_ERR_INPUT when the config is outside what the kernels support (the
 * message names the field and the limit); HPC_ERR_INTERNAL if a template is
 * missing from the build. */
HpcStatus kemit_source(const KernelConfig *cfg, char **source, char suffix[KEMIT_SUFFIX_MAX],
                       HpcError *err);

/* buf = base + suffix, e.g. "ln_fwd" + "_f16_h768_3fa9c1". */
void kemit_name(const char *suffix, const char *base, char *buf, size_t size);

/* "f32", "f16", "bf16". */
const char *kemit_dtype_name(KemitDtype dt);

/* The row layout of the per-row kernels (ln_*, emb_*): each of `threads`
 * threads (a multiple of 32, at most 1024) holds `npt` chunks of `vec`
 * elements of one row of H; vec divides H.  The backward kernels (ln_bwd,
 * emb_bwd) take `rpb` rows at once: block (threads, rpb). */
typedef struct { int vec, threads, npt, rpb; } KemitRowLayout;
KemitRowLayout kemit_row_layout(const KernelConfig *cfg);

/* The base names of every kernel in the source, for lookups and tests. */
extern const char *const kemit_kernel_bases[];
extern const int kemit_kernel_count;

#endif
