/* compiler/emit_ops_body_internal.h — private to the per-op kernel text
 * (emit_ops_body.c and the files it dispatches to: emit_ops_layernorm.c,
 * emit_ops_act.c, emit_ops_ln_site.c, emit_ops_embed_ln.c): what those
 * files share; not for other modules (emit_ops_body.h is emit_ops.c's door).
 * The eopb_ helpers below are defined in emit_ops_body_util.c, but for the
 * LayerNorm rows' (emit_ops_layernorm.c).
 *
 * The generators write a node's phases into an EopGen (emit_ops_body.h):
 * eopb_phase starts one, and its body reads the node's output as y, input
 * k as xk, the EopCtl as ctl and the scratch as sf (f32) or sd (f64). */
#ifndef HPC_COMPILER_EMIT_OPS_BODY_INTERNAL_H
#define HPC_COMPILER_EMIT_OPS_BODY_INTERNAL_H

#include "emit_ops_body.h"
#include "fuse.h"

/* The node being generated (in a function holding `gen`) and its input k. */
#define OUTN (&gen->g->nodes[gen->id])
#define INN(k) (&gen->g->nodes[OUTN->in[(k)]])

/* ---- C text of values ------------------------------------------------- */

/* The C type the kernels store dtype d in. */
static inline const char *ctype(DType d)
{
    switch (d) {
    case DT_F16:
    case DT_BF16: return "unsigned short";
    case DT_I32: return "int";
    default: return "float";
    }
}
/* The kernels' load (to f32) and store (from f32) of one element of dtype d. */
static inline const char *ldf(DType d) { return d == DT_F16 ? "ld_f16" : d == DT_BF16 ? "ld_bf16" : "ld_f32"; }
static inline const char *stf(DType d) { return d == DT_F16 ? "st_f16" : d == DT_BF16 ? "st_bf16" : "st_f32"; }

/* C expression of the product of dims [from, to) of v: "(a.B * a.L * 768LL)". */
void eopb_dims_expr(const IrNode *v, int from, int to, char *buf, size_t size);
/* ... of all of v's dims (its element count), of all but the last (its rows);
 * v's last dim (1 for a scalar). */
static inline void numel_expr(const IrNode *v, char *buf, size_t size) { eopb_dims_expr(v, 0, v->rank, buf, size); }
static inline void rows_expr(const IrNode *v, char *buf, size_t size) { eopb_dims_expr(v, 0, v->rank - 1, buf, size); }
static inline int64_t last_dim(const IrNode *v) { return v->rank ? v->dims[v->rank - 1] : 1; }

/* ---- sizes as functions of B, L (StepSize, step_program.h) ------------- */

/* The product of dims [from, to) of v. */
StepSize eopb_sz_dims(const IrNode *v, int from, int to);
/* v's element count, its rows, a constant. */
static inline StepSize sz_numel(const IrNode *v) { return eopb_sz_dims(v, 0, v->rank); }
static inline StepSize sz_rows(const IrNode *v) { return eopb_sz_dims(v, 0, v->rank - 1); }
static inline StepSize sz_const(int64_t c) { return (StepSize){.c0 = c, .c1 = 0, .div = 1}; }
/* ceil(s / k) of a plain product s. */
StepSize eopb_sz_ceil_div(StepSize s, int64_t k);
/* c0 + k * s of a plain product s. */
StepSize eopb_sz_affine(int64_t c0, int64_t k, StepSize s);

/* ---- phases ------------------------------------------------------------ */

/* v's shape as a kernel name's tag: "BxLx768" ("s" for a scalar). */
void eopb_shape_tag(const IrNode *v, char *buf, size_t size);
/* Threads of a block-per-row kernel over rows of D elements. */
static inline int row_threads(int64_t D) { return D >= 1024 ? 512 : D >= 256 ? 256 : 128; }
/* Starts a phase named BASE_DTYPE_TAG and writes the pointer declarations;
 * returns its body. */
StrBuf *eopb_phase(EopGen *gen, const char *base, const char *tag, EopLaunchType lt, StepSize count,
                   int threads);
/* A grid-stride phase over the elements of `over`: declares n, their count. */
StrBuf *eopb_elems_phase(EopGen *gen, const char *base, const IrNode *over);
/* Whether d is f32, f16 or bf16. */
static inline bool float_dtype(DType d) { return d == DT_F32 || d == DT_F16 || d == DT_BF16; }
/* Whether every input has the output's shape and all are float, so the op
 * may run 8 elements a thread. */
bool eopb_vec_ok(const EopGen *gen);
/* The scalar tail of an 8-wide elementwise phase: elements nv * 8 .. n - 1,
 * one a thread, `stride` apart; `expr` is as for the vector loop, with j 0. */
void eopb_vec_tail(EopGen *gen, StrBuf *s, const char *stride, const char *expr);

/* Column sums over rows of TERM(r, col) (a double expression) into y, which
 * holds value n: partial and sum phases (BIAS_GRAD, LAYERNORM_DGAMMA). */
void eopb_colsum_phases(EopGen *gen, const IrNode *n, const char *base, const IrNode *rows_of,
                        const char *term);
/* The same, 8 columns a thread (C % 8 == 0): `load` fills va[8], vb[8] of
 * row r at column c0, `term` is column c0 + j's double term. */
void eopb_colsum8_phases(EopGen *gen, const IrNode *n, const char *base, const IrNode *rows_of,
                         const char *load, const char *term);

/* ---- fused ops (compiler/fuse.h) -------------------------------------- */

/* "ld_f16(st_f16(v))": v rounded to the storage dtype of a removed value. */
void eopb_round_expr(DType mid, const char *v, char *buf, size_t size);
/* Declares p, dscale, on (dropout is live) and salt for a fused op's mask. */
void eopb_dropout_consts(EopGen *gen, StrBuf *s, IrFusedAttr fa);

/* ---- LayerNorm rows in registers (emit_ops_layernorm.c) ---------------- */

/* LayerNorm rows of D % 8 == 0 keep the row in registers: one block of
 * ln_threads(D) threads per row (a multiple of 32, at most 256), thread t
 * holding the 8-column chunks t + T u (u < NU), loaded and stored 16 bytes
 * at a time; one pass over global memory per input. */
static inline bool ln_vec_ok(long long D) { return D > 0 && D % 8 == 0 && D <= 8192; }
static inline int ln_threads(long long D)
{
    long long t = (D / 8 + 31) / 32 * 32;
    return t > 256 ? 256 : (int)t;
}
static inline int ln_nu(long long D) { return (int)((D / 8 + ln_threads(D) - 1) / ln_threads(D)); }
/* A block-per-row phase over the rows of `rows_of`: declares sh, R, row. */
StrBuf *eopb_ln_row_phase(EopGen *gen, const char *base, const IrNode *rows_of, long long D);
/* mean and rstd of the row in xv[NU][8] (two passes over the registers, f32). */
void eopb_ln_row_stats(StrBuf *s, long long D, double eps);
/* Whether the node's output and inputs are all float. */
bool eopb_ln_vec_dtypes(const EopGen *gen);

/* The row-group kernels' sum phase (LN_RESIDUAL_BWD, EMBED_LN_BWD): warps a
 * block, each block adding 32 partial columns. */
#define LNB_SUM_WARPS 16
/* SMs of an H100 or H200: the row-group kernels' blocks at most are this
 * times the blocks an SM (emit_ops_ln_site.c, "LN_RESIDUAL_BWD"). */
#define LNB_SMS 132

/* ---- the generators of the other files (emit_ops_body.c's op_cuda) ---- */

/* LAYERNORM, LAYERNORM_DX, LAYERNORM_DGAMMA (emit_ops_layernorm.c). */
void eopb_layernorm(EopGen *gen);
void eopb_layernorm_dx(EopGen *gen);
void eopb_layernorm_dgamma(EopGen *gen);
/* ACT, ACT_BWD, ACT_BWD_BGRAD (emit_ops_act.c). */
void eopb_act(EopGen *gen);
void eopb_act_bwd(EopGen *gen);
void eopb_act_bwd_bgrad(EopGen *gen);
/* LN_RESIDUAL, LN_RESIDUAL_BWD (emit_ops_ln_site.c). */
HpcStatus eopb_ln_residual(EopGen *gen, HpcError *err);
HpcStatus eopb_ln_residual_bwd(EopGen *gen, HpcError *err);
/* EMBED_LN, EMBED_LN_BWD (emit_ops_embed_ln.c). */
HpcStatus eopb_embed_ln(EopGen *gen, HpcError *err);
HpcStatus eopb_embed_ln_bwd(EopGen *gen, HpcError *err);

#endif
