/* compiler/emit_ops_body_util.c — the helpers the per-op kernel files
 * share: C expressions and StepSizes of a value's dims, phases, the column
 * sums of BIAS_GRAD and LAYERNORM_DGAMMA, a fused op's rounding and dropout
 * constants; see emit_ops_body_internal.h. */
#include "emit_ops_body_internal.h"

#include <stdio.h>
#include <string.h>

/* C expression of the product of dims [from, to) of v: "(a.B * a.L * 768LL)". */
void eopb_dims_expr(const IrNode *v, int from, int to, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "(1LL");
    for (int i = from; i < to && used < size; i++) {
        int64_t d = v->dims[i];
        if (d == IR_DIM_B) used += (size_t)snprintf(buf + used, size - used, " * a.B");
        else if (d == IR_DIM_L) used += (size_t)snprintf(buf + used, size - used, " * a.L");
        else used += (size_t)snprintf(buf + used, size - used, " * %lldLL", (long long)d);
    }
    if (used < size) snprintf(buf + used, size - used, ")");
}

/* Sizes as functions of B, L (step_program.h): the product of dims
 * [from, to) of v, a constant, and the few transforms the kernels use. */
StepSize eopb_sz_dims(const IrNode *v, int from, int to)
{
    StepSize s = {.c0 = 0, .c1 = 1, .pB = 0, .pL = 0, .div = 1, .cap = 0};
    for (int i = from; i < to; i++) {
        if (v->dims[i] == IR_DIM_B) s.pB++;
        else if (v->dims[i] == IR_DIM_L) s.pL++;
        else s.c1 *= v->dims[i];
    }
    return s;
}
/* ceil(s / k) of a plain product s. */
StepSize eopb_sz_ceil_div(StepSize s, int64_t k)
{
    HPC_ASSERT(s.c0 == 0 && s.div == 1 && s.cap == 0);
    s.c0 = k - 1;
    s.div = k;
    return s;
}
/* c0 + k * s of a plain product s. */
StepSize eopb_sz_affine(int64_t c0, int64_t k, StepSize s)
{
    HPC_ASSERT(s.c0 == 0 && s.div == 1 && s.cap == 0);
    s.c0 = c0;
    s.c1 *= k;
    return s;
}

/* "BxLx768" */
void eopb_shape_tag(const IrNode *v, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = 0;
    if (v->rank == 0) snprintf(buf, size, "s");
    for (int i = 0; i < v->rank && used < size; i++) {
        const char *sep = i ? "x" : "";
        if (v->dims[i] == IR_DIM_B) used += (size_t)snprintf(buf + used, size - used, "%sB", sep);
        else if (v->dims[i] == IR_DIM_L) used += (size_t)snprintf(buf + used, size - used, "%sL", sep);
        else used += (size_t)snprintf(buf + used, size - used, "%s%lld", sep, (long long)v->dims[i]);
    }
}

/* Starts a phase named BASE_DTYPE_TAG and writes the pointer declarations. */
StrBuf *eopb_phase(EopGen *gen, const char *base, const char *tag, EopLaunchType lt, StepSize count,
                   int threads)
{
    HPC_ASSERT(gen->n_phases < EOP_MAX_PHASES);
    EopGenPhase *ph = &gen->ph[gen->n_phases++];
    const IrNode *n = OUTN;
    snprintf(ph->base, sizeof ph->base, "%s_%s_%s", base, ir_dtype_name(n->dtype), tag);
    ph->lt = lt;
    ph->count = count;
    ph->threads = threads;
    StrBuf *s = &ph->body;
    gen->kind = EOP_KERNELS;
    strbuf_printf(s, "    %s *y = (%s *)a.y;\n", ctype(n->dtype), ctype(n->dtype));
    for (int k = 0; k < n->n_in; k++)
        strbuf_printf(s, "    const %s *x%d = (const %s *)a.x[%d];\n", ctype(INN(k)->dtype), k,
                    ctype(INN(k)->dtype), k);
    strbuf_add(s, "    const EopCtl *ctl = (const EopCtl *)a.ctl;\n"
                "    float *sf = (float *)a.scratch;\n    double *sd = (double *)a.scratch;\n"
                "    (void)y; (void)ctl; (void)sf; (void)sd;\n");
    return s;
}

StrBuf *eopb_elems_phase(EopGen *gen, const char *base, const IrNode *over)
{
    char tag[64], n[128];
    eopb_shape_tag(over, tag, sizeof tag);
    numel_expr(over, n, sizeof n);
    StrBuf *s = eopb_phase(gen, base, tag, EOP_LT_ELEMS, sz_numel(over), 256);
    strbuf_printf(s, "    const i64 n = %s;\n", n);
    return s;
}

static bool same_shape(const IrNode *a, const IrNode *b)
{
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

/* Whether every input of the node has the output's shape and all are float:
 * then the op may run 8 elements per thread (vec_elems). */
bool eopb_vec_ok(const EopGen *gen)
{
    if (!float_dtype(OUTN->dtype)) return false;
    for (int k = 0; k < OUTN->n_in; k++)
        if (!float_dtype(INN(k)->dtype) || !same_shape(INN(k), OUTN)) return false;
    return true;
}

/* Column sums over rows of TERM(r, col) (a double expression) into y (C):
 * partials in sd[0 .. EOP_COL_PARTS * C), then one thread per column.
 * `n` is the value y holds (C = its last dim, rounded to its dtype): the
 * node's output, or LINEAR_DW_BGRAD's db. */
void eopb_colsum_phases(EopGen *gen, const IrNode *n, const char *base, const IrNode *rows_of,
                        const char *term)
{
    long long C = (long long)last_dim(n);
    char rows[128], tag[32], b1[64], b2[64];
    rows_expr(rows_of, rows, sizeof rows);
    snprintf(tag, sizeof tag, "c%lld", C);
    snprintf(b1, sizeof b1, "%s_part", base);
    snprintf(b2, sizeof b2, "%s_sum", base);
    StrBuf *s = eopb_phase(gen, b1, tag, EOP_LT_COLPART, sz_const(C), 256);
    strbuf_printf(s, "    __shared__ double acc[8][33];\n    const i64 R = %s;\n"
                   "    const int col = blockIdx.x * 32 + threadIdx.x;\n    double t = 0.0;\n"
                   "    if (col < %lld)\n"
                   "        for (i64 r = blockIdx.y * 8 + threadIdx.y; r < R; r += (i64)gridDim.y * 8) t += %s;\n"
                   "    acc[threadIdx.y][threadIdx.x] = t;\n    __syncthreads();\n"
                   "    if (threadIdx.y == 0 && col < %lld) {\n        double u = 0.0;\n"
                   "        for (int k = 0; k < 8; k++) u += acc[k][threadIdx.x];\n"
                   "        sd[(i64)blockIdx.y * %lldLL + col] = u;\n    }\n",
                rows, C, term, C, C);
    s = eopb_phase(gen, b2, tag, EOP_LT_COLFIN, sz_const(C), 256);
    strbuf_printf(s, "    const int col = blockIdx.x * blockDim.x + threadIdx.x;\n    if (col >= %lld) return;\n"
                   "    double u = 0.0;\n    for (int p = 0; p < %d; p++) u += sd[(i64)p * %lldLL + col];\n"
                   "    y[col] = %s((float)u);\n",
                C, EOP_COL_PARTS, C, stf(n->dtype));
    gen->scratch = sz_const((int64_t)EOP_COL_PARTS * C * 8);
}

/* Column sums as eopb_colsum_phases, 8 columns per thread (C % 8 == 0): a block
 * of (32, 8) threads covers 256 columns of 8 rows at a time, each thread
 * loading 16 bytes per row (`load` fills va[8], vb[8] for row r, column c0);
 * `term` is column c0 + j's double term.  Partials go to sd as before. */
void eopb_colsum8_phases(EopGen *gen, const IrNode *n, const char *base, const IrNode *rows_of,
                         const char *load, const char *term)
{
    long long C = (long long)last_dim(n);
    char rows[128], tag[32], b1[64], b2[64];
    rows_expr(rows_of, rows, sizeof rows);
    snprintf(tag, sizeof tag, "c%lld", C);
    snprintf(b1, sizeof b1, "%s_part8", base);
    snprintf(b2, sizeof b2, "%s_sum", base);
    StrBuf *s = eopb_phase(gen, b1, tag, EOP_LT_COLPART, sz_const(C / 8), 256);
    strbuf_printf(s, "    __shared__ double acc[8][257];\n    const i64 R = %s;\n"
                   "    const int c0 = (blockIdx.x * 32 + threadIdx.x) * 8;\n"
                   "    double t[8];\n#pragma unroll\n    for (int j = 0; j < 8; j++) t[j] = 0.0;\n"
                   "    if (c0 < %lld) {\n#pragma unroll 4\n"
                   "        for (i64 r = blockIdx.y * 8 + threadIdx.y; r < R; r += (i64)gridDim.y * 8) {\n"
                   "            float va[8], vb[8];\n            (void)vb;\n",
                rows, C);
    strbuf_add(s, load);
    strbuf_add(s, "#pragma unroll\n            for (int j = 0; j < 8; j++) t[j] += ");
    strbuf_add(s, term);
    strbuf_printf(s, ";\n        }\n    }\n"
                   "#pragma unroll\n    for (int j = 0; j < 8; j++) acc[threadIdx.y][threadIdx.x * 8 + j] = t[j];\n"
                   "    __syncthreads();\n"
                   "    const int col = blockIdx.x * 256 + threadIdx.y * 32 + threadIdx.x;\n"
                   "    if (col < %lld) {\n        double u = 0.0;\n"
                   "        for (int k = 0; k < 8; k++) u += acc[k][threadIdx.y * 32 + threadIdx.x];\n"
                   "        sd[(i64)blockIdx.y * %lldLL + col] = u;\n    }\n",
                C, C);
    s = eopb_phase(gen, b2, tag, EOP_LT_COLFIN, sz_const(C), 256);
    strbuf_printf(s, "    const int col = blockIdx.x * blockDim.x + threadIdx.x;\n    if (col >= %lld) return;\n"
                   "    double u = 0.0;\n    for (int p = 0; p < %d; p++) u += sd[(i64)p * %lldLL + col];\n"
                   "    y[col] = %s((float)u);\n",
                C, EOP_COL_PARTS, C, stf(n->dtype));
    gen->scratch = sz_const((int64_t)EOP_COL_PARTS * C * 8);
}

/* ---- fused ops (compiler/fuse.h) ------------------------------------- */

/* "ld_f16(st_f16(v))": v rounded to the storage dtype of a removed value. */
void eopb_round_expr(DType mid, const char *v, char *buf, size_t size)
{
    if (mid == DT_F16 || mid == DT_BF16) snprintf(buf, size, "%s(%s(%s))", ldf(mid), stf(mid), v);
    else snprintf(buf, size, "(%s)", v);
}

/* Declares p, sc, on (dropout is live) and salt for a fused op's mask.  The
 * salt is the node's launch argument (a.salt), not a constant, so the
 * layers' kernels that differ only by it are one kernel in the module. */
void eopb_dropout_consts(EopGen *gen, StrBuf *s, IrFusedAttr fa)
{
    eopb_use_salt(gen, (uint32_t)fa.salt);
    strbuf_printf(s, "    const float p = (float)%.9g;\n    const float dscale = (float)(1.0 / (1.0 - (double)p));\n"
                   "    const bool on = ctl->training && p != 0.0f;\n    const u32 salt = (u32)a.salt;\n",
                (double)fa.p);
}


void eopb_vec_tail(EopGen *gen, StrBuf *s, const char *stride, const char *expr)
{
    const IrNode *n = OUTN;
    strbuf_printf(s, "    for (i64 i = nv * 8 + (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += %s) {\n"
                     "        const int j = 0;\n", stride);
    for (int k = 0; k < n->n_in; k++)
        strbuf_printf(s, "        float v%d[1];\n        v%d[0] = %s(x%d[i]);\n", k, k, ldf(INN(k)->dtype), k);
    strbuf_printf(s, "        y[i] = %s(", stf(n->dtype));
    strbuf_add(s, expr);
    strbuf_add(s, ");\n    }\n");
}
