/* compiler/emit_ops_body.c — the CUDA text of each op kind; see
 * emit_ops_body.h.  Each case mirrors the op's CPU reference in
 * runtime/cpu/cpu_exec_ops.inc. */
#include "emit_ops_body.h"
#include "emit_ops_attention.h"

#include "fuse.h"
#include "program/plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------- */

#define OUTN (&gen->g->nodes[gen->id])
#define INN(k) (&gen->g->nodes[OUTN->in[(k)]])

static const char *ctype(DType d)
{
    switch (d) {
    case DT_F16:
    case DT_BF16: return "unsigned short";
    case DT_I32: return "int";
    default: return "float";
    }
}

static const char *ldf(DType d) { return d == DT_F16 ? "ld_f16" : d == DT_BF16 ? "ld_bf16" : "ld_f32"; }
static const char *stf(DType d) { return d == DT_F16 ? "st_f16" : d == DT_BF16 ? "st_bf16" : "st_f32"; }

/* C expression of the product of dims [from, to) of v: "(a.B * a.L * 768LL)". */
static void dims_expr(const IrNode *v, int from, int to, char *buf, size_t size)
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

static void numel_expr(const IrNode *v, char *buf, size_t size) { dims_expr(v, 0, v->rank, buf, size); }
static void rows_expr(const IrNode *v, char *buf, size_t size) { dims_expr(v, 0, v->rank - 1, buf, size); }
static int64_t last_dim(const IrNode *v) { return v->rank ? v->dims[v->rank - 1] : 1; }

/* Sizes as functions of B, L (step_program.h): the product of dims
 * [from, to) of v, a constant, and the few transforms the kernels use. */
static StepSize sz_dims(const IrNode *v, int from, int to)
{
    StepSize s = {.c0 = 0, .c1 = 1, .pB = 0, .pL = 0, .div = 1, .cap = 0};
    for (int i = from; i < to; i++) {
        if (v->dims[i] == IR_DIM_B) s.pB++;
        else if (v->dims[i] == IR_DIM_L) s.pL++;
        else s.c1 *= v->dims[i];
    }
    return s;
}
static StepSize sz_numel(const IrNode *v) { return sz_dims(v, 0, v->rank); }
static StepSize sz_rows(const IrNode *v) { return sz_dims(v, 0, v->rank - 1); }
static StepSize sz_const(int64_t c) { return (StepSize){.c0 = c, .c1 = 0, .div = 1}; }
/* ceil(s / k) of a plain product s. */
static StepSize sz_ceil_div(StepSize s, int64_t k)
{
    HPC_ASSERT(s.c0 == 0 && s.div == 1 && s.cap == 0);
    s.c0 = k - 1;
    s.div = k;
    return s;
}
/* s / k, exact: k divides the constant factor. */
static StepSize sz_exact_div(StepSize s, int64_t k)
{
    HPC_ASSERT(s.c0 == 0 && s.div == 1 && s.c1 % k == 0);
    s.c1 /= k;
    return s;
}
/* numel / L: the rows of a value whose last dim is L (scores, probs). */
static StepSize rows_over_l(const IrNode *v)
{
    StepSize s = sz_numel(v);
    HPC_ASSERT(s.pL > 0);
    s.pL--;
    return s;
}
/* c0 + k * s of a plain product s. */
static StepSize sz_affine(int64_t c0, int64_t k, StepSize s)
{
    HPC_ASSERT(s.c0 == 0 && s.div == 1 && s.cap == 0);
    s.c0 = c0;
    s.c1 *= k;
    return s;
}

/* "BxLx768" */
static void shape_tag(const IrNode *v, char *buf, size_t size)
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

static int row_threads(int64_t D) { return D >= 1024 ? 512 : D >= 256 ? 256 : 128; }

/* Starts a phase named BASE_DTYPE_TAG and writes the pointer declarations. */
static StrBuf *phase(EopGen *gen, const char *base, const char *tag, EopLaunchType lt, StepSize count,
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

static StrBuf *elems_phase(EopGen *gen, const char *base, const IrNode *over)
{
    char tag[64], n[128];
    shape_tag(over, tag, sizeof tag);
    numel_expr(over, n, sizeof n);
    StrBuf *s = phase(gen, base, tag, EOP_LT_ELEMS, sz_numel(over), 256);
    strbuf_printf(s, "    const i64 n = %s;\n", n);
    return s;
}

static const char *act_name(IrActKind k) { return ir_act_name(k); }

static bool float_dtype(DType d) { return d == DT_F32 || d == DT_F16 || d == DT_BF16; }

static bool same_shape(const IrNode *a, const IrNode *b)
{
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

/* Whether every input of the node has the output's shape and all are float:
 * then the op may run 8 elements per thread (vec_elems). */
static bool vec_ok(const EopGen *gen)
{
    if (!float_dtype(OUTN->dtype)) return false;
    for (int k = 0; k < OUTN->n_in; k++)
        if (!float_dtype(INN(k)->dtype) || !same_shape(INN(k), OUTN)) return false;
    return true;
}

/* An elementwise phase over the output, 8 elements per thread through
 * 16-byte loads and stores (emit_ops.c's ld8_ / st8_), then a scalar tail.
 * `expr` is element i's f32 value from v0[j], v1[j], ... (input k's element
 * i as f32); `pre` declares constants.  The result is rounded once to the
 * output dtype, as in the scalar kernels. */
static void vec_elems(EopGen *gen, const char *base, const char *pre, const char *expr)
{
    const IrNode *n = OUTN;
    char tag[64], num[128];
    shape_tag(n, tag, sizeof tag);
    numel_expr(n, num, sizeof num);
    StrBuf *s = phase(gen, base, tag, EOP_LT_ELEMS, sz_ceil_div(sz_numel(n), 8), 256);
    strbuf_printf(s, "    const i64 n = %s, nv = n / 8;\n", num);
    strbuf_add(s, pre);
    strbuf_add(s, "    EOP_FOR(iv, nv) {\n        const i64 i0 = iv * 8;\n");
    for (int k = 0; k < n->n_in; k++)
        strbuf_printf(s, "        float v%d[8];\n        ld8_%s(x%d + i0, v%d);\n", k, ir_dtype_name(INN(k)->dtype), k, k);
    strbuf_add(s, "        float r[8];\n#pragma unroll\n        for (int j = 0; j < 8; j++) {\n"
                "            const i64 i = i0 + j;\n            (void)i;\n            r[j] = ");
    strbuf_add(s, expr);
    strbuf_printf(s, ";\n        }\n        st8_%s(y + i0, r);\n    }\n", ir_dtype_name(n->dtype));
    strbuf_add(s, "    for (i64 i = nv * 8 + (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; "
                "i += (i64)gridDim.x * blockDim.x) {\n        const int j = 0;\n");
    for (int k = 0; k < n->n_in; k++)
        strbuf_printf(s, "        float v%d[1];\n        v%d[0] = %s(x%d[i]);\n", k, k, ldf(INN(k)->dtype), k);
    strbuf_printf(s, "        y[i] = %s(", stf(n->dtype));
    strbuf_add(s, expr);
    strbuf_add(s, ");\n    }\n");
}

/* ---- forward ops ------------------------------------------------------ */

static void gen_loss_scale(EopGen *gen)
{
    StrBuf *s = elems_phase(gen, "loss_scale", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(ctl->loss_scale);\n", stf(OUTN->dtype));
}

static void gen_positions(EopGen *gen)
{
    StrBuf *s = elems_phase(gen, "positions", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = (int)(i %% a.L) + %lld;\n", (long long)OUTN->attr.pos.offset);
}

static void gen_embedding(EopGen *gen)
{
    int64_t V = INN(0)->dims[0], D = INN(0)->dims[1];
    StrBuf *s = elems_phase(gen, "embedding", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) {\n        int id = x1[i / %lldLL];\n"
                   "        y[i] = %s(id >= 0 && id < %lld ? %s(x0[(i64)id * %lldLL + i %% %lldLL]) : EOP_NAN);\n    }\n",
                (long long)D, stf(OUTN->dtype), (long long)V, ldf(INN(0)->dtype), (long long)D,
                (long long)D);
}

static void gen_add(EopGen *gen)
{
    if (vec_ok(gen)) {
        vec_elems(gen, "add", "", "v0[j] + v1[j]");
        return;
    }
    StrBuf *s = elems_phase(gen, "add", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(%s(x0[i]) + %s(x1[i]));\n", stf(OUTN->dtype),
                ldf(INN(0)->dtype), ldf(INN(1)->dtype));
}

static void gen_cast(EopGen *gen)
{
    if (vec_ok(gen)) {
        vec_elems(gen, "cast", "", "v0[j]");
        return;
    }
    StrBuf *s = elems_phase(gen, "cast", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(%s(x0[i]));\n", stf(OUTN->dtype), ldf(INN(0)->dtype));
}

void eopb_use_salt(EopGen *gen, uint32_t salt)
{
    HPC_ASSERT(!gen->has_salt || gen->salt == salt);
    gen->salt = salt;
    gen->has_salt = true;
}

static void gen_dropout(EopGen *gen)
{
    const IrDropoutAttr *d = &OUTN->attr.dropout;
    if (vec_ok(gen)) {
        char pre[256], expr[160];
        snprintf(pre, sizeof pre, "    const float p = (float)%.9g;\n    const float sc = (float)(1.0 / (1.0 - (double)p));\n"
                                  "    const bool on = ctl->training && p != 0.0f;\n", (double)(float)d->p);
        eopb_use_salt(gen, (uint32_t)d->salt);
        snprintf(expr, sizeof expr, "dropout_elem(philox_mask8(ctl->seed, (u64)(i - j) >> 3, ctl->step, (u32)a.salt, p), i, on, v0[j], sc)");
        vec_elems(gen, "dropout", pre, expr);
        return;
    }
    StrBuf *s = elems_phase(gen, "dropout", OUTN);
    strbuf_printf(s, "    const float p = (float)%.9g;\n    const float sc = (float)(1.0 / (1.0 - (double)p));\n"
                   "    const bool on = ctl->training && p != 0.0f;\n"
                   "    EOP_FOR(i, n) {\n        float v = %s(x0[i]);\n"
                   "        if (on) v = philox_keep(ctl->seed, (u64)i, ctl->step, (u32)a.salt, p) ? v * sc : 0.0f;\n"
                   "        y[i] = %s(v);\n    }\n",
                (double)(float)d->p, ldf(INN(0)->dtype), stf(OUTN->dtype));
    eopb_use_salt(gen, (uint32_t)d->salt);
}

/* The permutation as a copy of 16-byte chunks: each head's D elements are
 * contiguous on both sides, so chunk i (elements i*W ..) moves as a whole. */
static void heads_copy(EopGen *gen, bool split, long long NH, long long D, long long W)
{
    char tag[64], num[128];
    shape_tag(OUTN, tag, sizeof tag);
    numel_expr(OUTN, num, sizeof num);
    StrBuf *s = phase(gen, split ? "split_heads_v" : "merge_heads_v", tag, EOP_LT_ELEMS,
                    sz_exact_div(sz_numel(OUTN), W), 256);
    strbuf_printf(s, "    const i64 n = %s / %lldLL;\n    EOP_FOR(c, n) {\n        const i64 i = c * %lldLL;\n"
                   "        i64 dd = i %% %lldLL, r = i / %lldLL;\n",
                num, W, W, D, D);
    if (split)
        strbuf_printf(s, "        i64 l = r %% a.L; r /= a.L;\n        i64 hh = r %% %lldLL, b = r / %lldLL;\n"
                       "        const i64 src = ((b * a.L + l) * %lldLL + hh) * %lldLL + dd;\n",
                    NH, NH, NH, D);
    else
        strbuf_printf(s, "        i64 hh = r %% %lldLL; r /= %lldLL;\n        i64 l = r %% a.L, b = r / a.L;\n"
                       "        const i64 src = ((b * %lldLL + hh) * a.L + l) * %lldLL + dd;\n",
                    NH, NH, NH, D);
    strbuf_add(s, "        *(eop_v16 *)(y + i) = *(const eop_v16 *)(x0 + src);\n    }\n");
}

/* out (B, NH, L, D) from in (B, L, NH*D), or the reverse when merging. */
static void gen_heads(EopGen *gen, bool split)
{
    const IrNode *h = split ? OUTN : INN(0);   /* the (B, NH, L, D) side */
    long long NH = (long long)h->dims[1], D = (long long)h->dims[3];
    size_t es = OUTN->dtype == DT_F32 ? 4 : 2;
    long long W = (long long)(16 / es);   /* elements per 16-byte chunk */
    if (INN(0)->dtype == OUTN->dtype && float_dtype(OUTN->dtype) && D > 0 && D % W == 0) {
        heads_copy(gen, split, NH, D, W);
        return;
    }
    StrBuf *s = elems_phase(gen, split ? "split_heads" : "merge_heads", OUTN);
    if (split)
        strbuf_printf(s, "    EOP_FOR(i, n) {\n        i64 dd = i %% %lldLL, r = i / %lldLL;\n"
                       "        i64 l = r %% a.L; r /= a.L;\n        i64 hh = r %% %lldLL, b = r / %lldLL;\n"
                       "        y[i] = %s(%s(x0[((b * a.L + l) * %lldLL + hh) * %lldLL + dd]));\n    }\n",
                    D, D, NH, NH, stf(OUTN->dtype), ldf(INN(0)->dtype), NH, D);
    else
        strbuf_printf(s, "    EOP_FOR(i, n) {\n        i64 dd = i %% %lldLL, r = i / %lldLL;\n"
                       "        i64 hh = r %% %lldLL; r /= %lldLL;\n        i64 l = r %% a.L, b = r / a.L;\n"
                       "        y[i] = %s(%s(x0[((b * %lldLL + hh) * a.L + l) * %lldLL + dd]));\n    }\n",
                    D, D, NH, NH, stf(OUTN->dtype), ldf(INN(0)->dtype), NH, D);
}

/* Whether the planner stores value id inside another value (program/
 * plan.h: a STACK of adjacent parameters, an UNSTACK's parts): then no
 * kernel runs for it. */
static bool planned_view(const EopGen *gen)
{
    int base;
    int64_t off;
    return plan_view_of(gen->g, gen->id, &base, &off);
}

/* STACK (compiler/fuse_qkv.c): rows of x0, x1, x2 one after another.  Of
 * parameters (adjacent in the cuda executor's buffers, program/
 * param_pack.h) a view, no kernel; else a copy. */
static void gen_stack(EopGen *gen)
{
    if (planned_view(gen)) return;
    StrBuf *s = elems_phase(gen, "stack", OUTN);
    strbuf_printf(s, "    const i64 part = n / 3;\n"
                   "    EOP_FOR(i, n) {\n        const i64 k = i / part, j = i - k * part;\n"
                   "        y[i] = %s(k == 0 ? %s(x0[j]) : k == 1 ? %s(x1[j]) : %s(x2[j]));\n    }\n",
                stf(OUTN->dtype), ldf(INN(0)->dtype), ldf(INN(1)->dtype), ldf(INN(2)->dtype));
}

/* UNSTACK: the three row blocks of x0 into outputs 0, 1, 2 (a.yk[0, 1];
 * absent ones are 0); where the parts are views of x0 (the stacked dW and
 * bias gradients), no kernel. */
static void gen_unstack(EopGen *gen)
{
    if (planned_view(gen)) return;
    StrBuf *s = elems_phase(gen, "unstack", OUTN);
    const char *t = ctype(OUTN->dtype);
    strbuf_printf(s, "    %s *y1 = (%s *)a.yk[0], *y2 = (%s *)a.yk[1];\n"
                   "    EOP_FOR(i, n) {\n        y[i] = %s(%s(x0[i]));\n"
                   "        if (y1) y1[i] = %s(%s(x0[n + i]));\n        if (y2) y2[i] = %s(%s(x0[2 * n + i]));\n    }\n",
                t, t, t, stf(OUTN->dtype), ldf(INN(0)->dtype), stf(OUTN->dtype), ldf(INN(0)->dtype),
                stf(OUTN->dtype), ldf(INN(0)->dtype));
}

/* LN_DW_FIX (compiler/fuse_ln_dw.c): y = raw * gamma[col] + db[row] * beta[col]
 * over the (out, in) weight gradient; may write over raw (program/plan.c:
 * each thread reads and writes the same elements).  With in % 8 == 0 (every
 * hidden size hpc trains), 8 columns of one row a thread through 16-byte
 * loads and stores: the fix is a pass over the f32 gradient per LayerNorm
 * site, bound by its bytes.
 *
 * LN_DW_FIX_DB (HPC_LN_SAVE=xhat_ones, db_in_raw): raw is (out, in +
 * IR_XHAT_ONES_PAD) and its column `in` is db, which the thread of each
 * row's first columns also writes to output 1 (a.yk[0]).  Not in place:
 * raw's rows are longer than y's. */
static void gen_dw_fix(EopGen *gen, bool db_in_raw)
{
    long long in = (long long)OUTN->dims[1], ldr = (long long)last_dim(INN(0));
    const char *name = db_in_raw ? "ln_dw_fix_db" : "ln_dw_fix", *t = ctype(OUTN->dtype), *st = stf(OUTN->dtype);
    /* raw's element (o, c) for the scalar and the vector loop, db's source, and the db output */
    char elem[64], vec[64], db[96], decl[96] = "", put[96] = "";
    if (db_in_raw) {
        snprintf(elem, sizeof elem, "x0[o * %lldLL + c]", ldr);
        snprintf(vec, sizeof vec, "x0 + o * %lldLL + c", ldr);
        snprintf(db, sizeof db, "%s(x0[o * %lldLL + %lldLL])", ldf(INN(0)->dtype), ldr, in);
        snprintf(decl, sizeof decl, "    %s *o_db = (%s *)a.yk[0];\n", t, t);
        snprintf(put, sizeof put, "        if (c == 0 && o_db) o_db[o] = %s(db);\n", st);
    } else {
        snprintf(elem, sizeof elem, "x0[i]");
        snprintf(vec, sizeof vec, "x0 + i0");
        snprintf(db, sizeof db, "%s(x3[o])", ldf(INN(3)->dtype));
    }
    if (in % 8 != 0) {
        StrBuf *s = elems_phase(gen, name, OUTN);
        char dbl[128] = "";
        if (db_in_raw) snprintf(dbl, sizeof dbl, "        const float db = %s;\n", db);
        strbuf_printf(s, "%s    EOP_FOR(i, n) {\n        const i64 o = i / %lldLL, c = i - o * %lldLL;\n"
                       "%s        y[i] = %s(%s(%s) * %s(x1[c]) + %s * %s(x2[c]));\n%s    }\n",
                    decl, in, in, dbl, st, ldf(INN(0)->dtype), elem, ldf(INN(1)->dtype), db_in_raw ? "db" : db,
                    ldf(INN(2)->dtype), put);
        return;
    }
    char tag[64], num[128];
    shape_tag(OUTN, tag, sizeof tag);
    numel_expr(OUTN, num, sizeof num);
    StrBuf *s = phase(gen, name, tag, EOP_LT_ELEMS, sz_ceil_div(sz_numel(OUTN), 8), 256);
    strbuf_printf(s, "    const i64 n = %s;\n%s"
                   "    EOP_FOR(iv, n / 8) {\n        const i64 i0 = iv * 8, o = i0 / %lldLL, c = i0 - o * %lldLL;\n"
                   "        float r[8], gm[8], bt[8];\n"
                   "        ld8_%s(%s, r);\n        ld8_%s(x1 + c, gm);\n        ld8_%s(x2 + c, bt);\n"
                   "        const float db = %s;\n"
                   "#pragma unroll\n        for (int j = 0; j < 8; j++) r[j] = r[j] * gm[j] + db * bt[j];\n"
                   "        st8_%s(y + i0, r);\n%s    }\n",
                num, decl, in, in, ir_dtype_name(INN(0)->dtype), vec, ir_dtype_name(INN(1)->dtype),
                ir_dtype_name(INN(2)->dtype), db, ir_dtype_name(OUTN->dtype), put);
}

static void gen_ln_dw_fix(EopGen *gen) { gen_dw_fix(gen, false); }
static void gen_ln_dw_fix_db(EopGen *gen) { gen_dw_fix(gen, true); }

static void gen_slice_first(EopGen *gen)
{
    long long H = (long long)last_dim(OUTN);
    StrBuf *s = elems_phase(gen, "slice_first", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(%s(x0[(i / %lldLL) * a.L * %lldLL + i %% %lldLL]));\n",
                stf(OUTN->dtype), ldf(INN(0)->dtype), H, H, H);
}

/* Declares `tl`, the token SLICE_LAST reads in batch row `bexpr`: the last
 * t with mask x1[b, t] != 0, else 0 (cpu_exec_ops.inc's slice_last_pos). */
static void slice_last_pos_text(StrBuf *s, const char *bexpr)
{
    strbuf_printf(s, "        const int *mr = x1 + (%s) * a.L;\n        i64 tl = a.L - 1;\n"
                   "        while (tl > 0 && mr[tl] == 0) tl--;\n", bexpr);
}

static void gen_slice_last(EopGen *gen)
{
    long long H = (long long)last_dim(OUTN);
    StrBuf *s = elems_phase(gen, "slice_last", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) {\n        const i64 b = i / %lldLL, c = i %% %lldLL;\n", H, H);
    slice_last_pos_text(s, "b");
    strbuf_printf(s, "        y[i] = %s(%s(x0[(b * a.L + tl) * %lldLL + c]));\n    }\n", stf(OUTN->dtype),
                ldf(INN(0)->dtype), H);
}

static void gen_shift_labels(EopGen *gen)
{
    StrBuf *s = elems_phase(gen, "shift_labels", OUTN);
    strbuf_add(s, "    EOP_FOR(i, n) {\n        i64 t = i % a.L;\n"
                "        y[i] = t + 1 < a.L && x1[i + 1] ? x0[i + 1] : -100;\n    }\n");
}

/* Mean and rstd of row `row` of xr (D elements, dtype LD) into mean, rstd. */
static void ln_stats_text(StrBuf *s, const char *ld, long long D, double eps)
{
    strbuf_printf(s, "    float s1 = 0.0f;\n    for (int c = threadIdx.x; c < %lld; c += blockDim.x) s1 += %s(xr[c]);\n"
                   "    const float mean = block_sum(s1, sh) * (1.0f / %lld);\n"
                   "    float q = 0.0f;\n    for (int c = threadIdx.x; c < %lld; c += blockDim.x) {\n"
                   "        float d = %s(xr[c]) - mean;\n        q += d * d;\n    }\n"
                   "    const float rstd = 1.0f / sqrtf(block_sum(q, sh) * (1.0f / %lld) + (float)%.9g);\n",
                D, ld, D, D, ld, D, eps);
}

/* LayerNorm rows of D % 8 == 0 keep the row in registers: one block of
 * ln_threads(D) threads per row (a multiple of 32, at most 256), thread t
 * holding the 8-column chunks t + T u (u < NU), loaded and stored 16 bytes
 * at a time; one pass over global memory per input. */
static bool ln_vec_ok(long long D) { return D > 0 && D % 8 == 0 && D <= 8192; }
static int ln_threads(long long D)
{
    long long t = (D / 8 + 31) / 32 * 32;
    return t > 256 ? 256 : (int)t;
}
static int ln_nu(long long D) { return (int)((D / 8 + ln_threads(D) - 1) / ln_threads(D)); }

/* A block-per-row phase over the rows of `rows_of`: declares sh, R, row. */
static StrBuf *ln_row_phase(EopGen *gen, const char *base, const IrNode *rows_of, long long D)
{
    char rows[128], tag[32];
    rows_expr(rows_of, rows, sizeof rows);
    snprintf(tag, sizeof tag, "h%lld", D);
    StrBuf *s = phase(gen, base, tag, EOP_LT_ROWS, sz_rows(rows_of), ln_threads(D));
    strbuf_printf(s, "    __shared__ float sh[32];\n    const i64 R = %s;\n    const i64 row = blockIdx.x;\n"
                   "    if (row >= R) return;\n", rows);
    return s;
}

/* Loads row `row` of PTR (dtype dt, D columns) into NAME[NU][8] (zeros past D). */
static void ln_row_load(StrBuf *s, const char *name, const char *ptr, DType dt, long long D)
{
    int nu = ln_nu(D), T = ln_threads(D);
    strbuf_printf(s, "    float %s[%d][8];\n#pragma unroll\n    for (int u = 0; u < %d; u++) {\n"
                   "        const int cu = threadIdx.x + %d * u;\n"
                   "        if (cu < %lld) ld8_%s(%s + row * %lldLL + cu * 8, %s[u]);\n"
                   "        else for (int j = 0; j < 8; j++) %s[u][j] = 0.0f;\n    }\n",
                name, nu, nu, T, D / 8, ir_dtype_name(dt), ptr, D, name, name);
}

/* mean and rstd of the row in xv (two passes over the registers, f32). */
static void ln_row_stats(StrBuf *s, long long D, double eps)
{
    int nu = ln_nu(D), T = ln_threads(D);
    strbuf_printf(s, "    float s1 = 0.0f;\n#pragma unroll\n    for (int u = 0; u < %d; u++)\n"
                   "        for (int j = 0; j < 8; j++) s1 += xv[u][j];\n"
                   "    const float mean = block_sum(s1, sh) * (1.0f / %lld);\n    float q = 0.0f;\n"
                   "#pragma unroll\n    for (int u = 0; u < %d; u++)\n"
                   "        if (threadIdx.x + %d * u < %lld)\n"
                   "            for (int j = 0; j < 8; j++) {\n                float d = xv[u][j] - mean;\n                q += d * d;\n            }\n"
                   "    const float rstd = 1.0f / sqrtf(block_sum(q, sh) * (1.0f / %lld) + (float)%.9g);\n",
                nu, D, nu, T, D / 8, D, eps);
}

static bool ln_vec_dtypes(const EopGen *gen)
{
    if (!float_dtype(OUTN->dtype)) return false;
    for (int k = 0; k < OUTN->n_in; k++)
        if (!float_dtype(INN(k)->dtype)) return false;
    return true;
}

static void gen_layernorm_vec(EopGen *gen)
{
    const IrNode *n = OUTN;
    long long D = (long long)last_dim(n);
    int nu = ln_nu(D);
    StrBuf *s = ln_row_phase(gen, "ln_fwd", n, D);
    ln_row_load(s, "xv", "x0", INN(0)->dtype, D);
    ln_row_stats(s, D, (double)(float)n->attr.norm.eps);
    strbuf_printf(s, "#pragma unroll\n    for (int u = 0; u < %d; u++) {\n        const int cu = threadIdx.x + blockDim.x * u;\n"
                   "        if (cu >= %lld) break;\n        float g[8], bt[8], r[8];\n"
                   "        ld8_%s(x1 + cu * 8, g);\n        ld8_%s(x2 + cu * 8, bt);\n"
                   "        for (int j = 0; j < 8; j++) r[j] = (xv[u][j] - mean) * rstd * g[j] + bt[j];\n"
                   "        st8_%s(y + row * %lldLL + cu * 8, r);\n    }\n",
                nu, D / 8, ir_dtype_name(INN(1)->dtype), ir_dtype_name(INN(2)->dtype), ir_dtype_name(n->dtype), D);
}

static void gen_layernorm(EopGen *gen)
{
    const IrNode *n = OUTN;
    long long D = (long long)last_dim(n);
    if (ln_vec_ok(D) && ln_vec_dtypes(gen)) {
        gen_layernorm_vec(gen);
        return;
    }
    char rows[128], tag[32];
    rows_expr(n, rows, sizeof rows);
    snprintf(tag, sizeof tag, "h%lld", D);
    StrBuf *s = phase(gen, "ln_fwd", tag, EOP_LT_ROWS, sz_rows(n), row_threads(D));
    strbuf_printf(s, "    __shared__ float sh[32];\n    const i64 row = blockIdx.x;\n"
                   "    if (row >= %s) return;\n    const %s *xr = x0 + row * %lldLL;\n",
                rows, ctype(INN(0)->dtype), D);
    ln_stats_text(s, ldf(INN(0)->dtype), D, (double)(float)n->attr.norm.eps);
    strbuf_printf(s, "    for (int c = threadIdx.x; c < %lld; c += blockDim.x)\n"
                   "        y[row * %lldLL + c] = %s((%s(xr[c]) - mean) * rstd * %s(x1[c]) + %s(x2[c]));\n",
                D, D, stf(n->dtype), ldf(INN(0)->dtype), ldf(INN(1)->dtype), ldf(INN(2)->dtype));
}

/* One warp per row of L keys; rows = numel / L. */
static StrBuf *warp_rows_phase(EopGen *gen, const char *base)
{
    const IrNode *n = OUTN;
    char numel[128], tag[64];
    numel_expr(n, numel, sizeof numel);
    shape_tag(n, tag, sizeof tag);
    StrBuf *s = phase(gen, base, tag, EOP_LT_WARP_ROWS, rows_over_l(n), 128);
    strbuf_printf(s, "    const i64 rows = %s / a.L;\n"
                   "    const i64 row = (i64)blockIdx.x * 4 + (threadIdx.x >> 5);\n"
                   "    const int lane = threadIdx.x & 31;\n    if (row >= rows) return;\n", numel);
    return s;
}

static void gen_softmax(EopGen *gen)
{
    const IrNode *n = OUTN;
    StrBuf *s = warp_rows_phase(gen, n->attr.softmax.causal ? "softmax_causal_fwd" : "softmax_fwd");
    const char *ld = ldf(INN(0)->dtype);
    strbuf_printf(s, "    const i64 b = row / (%lldLL * a.L), q = row %% a.L;\n"
                   "    const int *mask = x1 + b * a.L;\n    const %s *sc = x0 + row * a.L;\n"
                   "#define VIS(k) (mask[k] != 0 && !(%d && (k) > q))\n"
                   "    float m = EOP_NEG_INF;\n"
                   "    for (i64 k = lane; k < a.L; k += 32) if (VIS(k)) m = fmaxf(m, %s(sc[k]));\n"
                   "    m = warp_max(m);\n    float sum = 0.0f;\n"
                   "    for (i64 k = lane; k < a.L; k += 32) if (VIS(k)) sum += expf(%s(sc[k]) - m);\n"
                   "    sum = warp_sum(sum);\n"
                   "    for (i64 k = lane; k < a.L; k += 32)\n"
                   "        y[row * a.L + k] = %s(VIS(k) && sum != 0.0f ? expf(%s(sc[k]) - m) / sum : 0.0f);\n"
                   "#undef VIS\n",
                (long long)n->dims[1], ctype(INN(0)->dtype), n->attr.softmax.causal ? 1 : 0, ld, ld,
                stf(n->dtype), ld);
}

/* Row losses into sf (N floats), then the mean over labelled rows. */
static void gen_cross_entropy(EopGen *gen)
{
    const IrNode *x = INN(0), *lab = INN(1);
    long long C = (long long)last_dim(x);
    char N[128], tag[32];
    numel_expr(lab, N, sizeof N);
    snprintf(tag, sizeof tag, "c%lld", C);
    StepSize rows = sz_numel(lab);
    const char *ld = ldf(x->dtype);
    StrBuf *s = phase(gen, "xent_rows", tag, EOP_LT_ROWS, rows, C >= 256 ? 256 : 128);
    strbuf_printf(s, "    __shared__ float sh[32];\n    const i64 row = blockIdx.x;\n    if (row >= %s) return;\n"
                   "    const %s *xr = x0 + row * %lldLL;\n    const int label = x1[row];\n"
                   "    float m = EOP_NEG_INF;\n"
                   "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) m = fmaxf(m, %s(xr[c]));\n"
                   "    m = block_max(m, sh);\n    float e = 0.0f;\n"
                   "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) e += expf(%s(xr[c]) - m);\n"
                   "    e = block_sum(e, sh);\n"
                   "    if (threadIdx.x == 0)\n        sf[row] = label == -100 ? 0.0f : label >= 0 && label < %lld"
                   " ? m + logf(e) - %s(xr[label]) : EOP_NAN;\n",
                N, ctype(x->dtype), C, C, ld, C, ld, C, ld);
    s = phase(gen, "xent_mean", tag, EOP_LT_ONE, sz_const(1), 1024);
    strbuf_printf(s, "    __shared__ double shd[32];\n    __shared__ float sh[32];\n"
                   "    double t = 0.0;\n    float cnt = 0.0f;\n"
                   "    for (i64 i = threadIdx.x; i < %s; i += blockDim.x) {\n"
                   "        t += sf[i];\n        cnt += x1[i] != -100 ? 1.0f : 0.0f;\n    }\n"
                   "    t = block_sum_d(t, shd);\n    cnt = block_sum(cnt, sh);\n"
                   "    if (threadIdx.x == 0) y[0] = %s(cnt > 0.0f ? (float)(t / cnt) : 0.0f);\n",
                N, stf(OUTN->dtype));
    gen->scratch = sz_affine(0, 4, rows);
}

static void gen_mse(EopGen *gen)
{
    char N[128];
    numel_expr(INN(1), N, sizeof N);
    StrBuf *s = phase(gen, "mse", "s", EOP_LT_ONE, sz_const(1), 1024);
    strbuf_printf(s, "    __shared__ double shd[32];\n    const i64 n = %s;\n    double t = 0.0;\n"
                   "    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {\n"
                   "        double d = (double)%s(x0[i]) - (double)%s(x1[i]);\n        t += d * d;\n    }\n"
                   "    t = block_sum_d(t, shd);\n"
                   "    if (threadIdx.x == 0) y[0] = %s(n ? (float)(t / (double)n) : 0.0f);\n",
                N, ldf(INN(0)->dtype), ldf(INN(1)->dtype), stf(OUTN->dtype));
}

/* ---- GEMMs ------------------------------------------------------------ */

static bool gemm_dtype(DType d) { return d == DT_F32 || d == DT_F16 || d == DT_BF16; }

static HpcStatus gen_gemm(EopGen *gen, HpcError *err)
{
    const IrNode *n = OUTN, *a = INN(0), *b = INN(1);
    gen->kind = EOP_GEMM;
    if (!gemm_dtype(a->dtype) || a->dtype != b->dtype || !gemm_dtype(n->dtype) ||
        (n->dtype != a->dtype && n->dtype != DT_F32))
        return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: %s node %d (%s) multiplies %s by %s into %s; "
                        "cuBLASLt needs equal operand dtypes and an output of that dtype or f32 (run "
                        "the precision pass, which inserts the casts)", ir_op_name(n->op), gen->id,
                        n->name, ir_dtype_name(a->dtype), ir_dtype_name(b->dtype), ir_dtype_name(n->dtype));
    if (n->op != IR_OP_LINEAR || n->n_in < 3) return HPC_OK;
    if (INN(2)->dtype == n->dtype) {
        gen->bias_epilogue = true;
        return HPC_OK;
    }
    long long C = (long long)last_dim(n);
    StrBuf *s = elems_phase(gen, "bias_add", n);
    gen->kind = EOP_GEMM;
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(%s(y[i]) + %s(x2[i %% %lldLL]));\n", stf(n->dtype),
                ldf(n->dtype), ldf(INN(2)->dtype), C);
    return HPC_OK;
}


/* Tables of at most this many floats (token types: 2 x 768) accumulate in
 * shared memory first: every token hits the same few rows, and global
 * atomics on them serialise (0.33 ms at B=256 L=128, docs/perf.md). */
#define EOP_EMB_SMEM_FLOATS 4096
#define EOP_EMB_SMEM_BLOCKS 1024

static void embedding_scatter_smem(EopGen *gen, const char *acc, long long V, long long D)
{
    const IrNode *dy = INN(0);
    char tag[64], num[128];
    shape_tag(dy, tag, sizeof tag);
    numel_expr(dy, num, sizeof num);
    StepSize count = sz_numel(dy);
    count.cap = (int64_t)EOP_EMB_SMEM_BLOCKS * 256;
    StrBuf *s = phase(gen, "embedding_scatter_smem", tag, EOP_LT_ELEMS, count, 256);
    strbuf_printf(s, "    __shared__ float tab[%lld];\n"
                   "    for (int k = threadIdx.x; k < %lld; k += blockDim.x) tab[k] = 0.0f;\n    __syncthreads();\n"
                   "    const i64 n = %s;\n    EOP_FOR(i, n) {\n        int id = x1[i / %lldLL];\n"
                   "        if (id >= 0 && id < %lld) atomicAdd(&tab[id * %lldLL + i %% %lldLL], %s(x0[i]));\n    }\n"
                   "    __syncthreads();\n"
                   "    for (int k = threadIdx.x; k < %lld; k += blockDim.x) atomicAdd(%s + k, tab[k]);\n",
                V * D, V * D, num, D, V, D, D, ldf(dy->dtype), V * D, acc);
}

static void gen_embedding_bwd(EopGen *gen)
{
    const IrNode *n = OUTN, *dy = INN(0);
    long long V = (long long)n->dims[0], D = (long long)n->dims[1];
    bool direct = n->dtype == DT_F32;
    const char *acc = direct ? "y" : "sf";
    StrBuf *s = elems_phase(gen, "zero", n);
    strbuf_printf(s, "    EOP_FOR(i, n) %s[i] = 0.0f;\n", acc);
    if (V * D <= EOP_EMB_SMEM_FLOATS) {
        embedding_scatter_smem(gen, acc, V, D);
    } else {
        s = elems_phase(gen, "embedding_scatter", dy);
        strbuf_printf(s, "    EOP_FOR(i, n) {\n        int id = x1[i / %lldLL];\n"
                       "        if (id >= 0 && id < %lld) atomicAdd(%s + (i64)id * %lldLL + i %% %lldLL, %s(x0[i]));\n    }\n",
                    D, V, acc, D, D, ldf(dy->dtype));
    }
    if (direct) return;
    s = elems_phase(gen, "embedding_grad_cast", n);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(sf[i]);\n", stf(n->dtype));
    gen->scratch = sz_const((int64_t)V * D * 4);
}

/* Column sums over rows of TERM(r, col) (a double expression) into y (C):
 * partials in sd[0 .. EOP_COL_PARTS * C), then one thread per column.
 * `n` is the value y holds (C = its last dim, rounded to its dtype): the
 * node's output, or LINEAR_DW_BGRAD's db. */
static void colsum_phases(EopGen *gen, const IrNode *n, const char *base, const IrNode *rows_of,
                          const char *term)
{
    long long C = (long long)last_dim(n);
    char rows[128], tag[32], b1[64], b2[64];
    rows_expr(rows_of, rows, sizeof rows);
    snprintf(tag, sizeof tag, "c%lld", C);
    snprintf(b1, sizeof b1, "%s_part", base);
    snprintf(b2, sizeof b2, "%s_sum", base);
    StrBuf *s = phase(gen, b1, tag, EOP_LT_COLPART, sz_const(C), 256);
    strbuf_printf(s, "    __shared__ double acc[8][33];\n    const i64 R = %s;\n"
                   "    const int col = blockIdx.x * 32 + threadIdx.x;\n    double t = 0.0;\n"
                   "    if (col < %lld)\n"
                   "        for (i64 r = blockIdx.y * 8 + threadIdx.y; r < R; r += (i64)gridDim.y * 8) t += %s;\n"
                   "    acc[threadIdx.y][threadIdx.x] = t;\n    __syncthreads();\n"
                   "    if (threadIdx.y == 0 && col < %lld) {\n        double u = 0.0;\n"
                   "        for (int k = 0; k < 8; k++) u += acc[k][threadIdx.x];\n"
                   "        sd[(i64)blockIdx.y * %lldLL + col] = u;\n    }\n",
                rows, C, term, C, C);
    s = phase(gen, b2, tag, EOP_LT_COLFIN, sz_const(C), 256);
    strbuf_printf(s, "    const int col = blockIdx.x * blockDim.x + threadIdx.x;\n    if (col >= %lld) return;\n"
                   "    double u = 0.0;\n    for (int p = 0; p < %d; p++) u += sd[(i64)p * %lldLL + col];\n"
                   "    y[col] = %s((float)u);\n",
                C, EOP_COL_PARTS, C, stf(n->dtype));
    gen->scratch = sz_const((int64_t)EOP_COL_PARTS * C * 8);
}

/* Column sums as colsum_phases, 8 columns per thread (C % 8 == 0): a block
 * of (32, 8) threads covers 256 columns of 8 rows at a time, each thread
 * loading 16 bytes per row (`load` fills va[8], vb[8] for row r, column c0);
 * `term` is column c0 + j's double term.  Partials go to sd as before. */
static void colsum8_phases(EopGen *gen, const IrNode *n, const char *base, const IrNode *rows_of,
                           const char *load, const char *term)
{
    long long C = (long long)last_dim(n);
    char rows[128], tag[32], b1[64], b2[64];
    rows_expr(rows_of, rows, sizeof rows);
    snprintf(tag, sizeof tag, "c%lld", C);
    snprintf(b1, sizeof b1, "%s_part8", base);
    snprintf(b2, sizeof b2, "%s_sum", base);
    StrBuf *s = phase(gen, b1, tag, EOP_LT_COLPART, sz_const(C / 8), 256);
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
    s = phase(gen, b2, tag, EOP_LT_COLFIN, sz_const(C), 256);
    strbuf_printf(s, "    const int col = blockIdx.x * blockDim.x + threadIdx.x;\n    if (col >= %lld) return;\n"
                   "    double u = 0.0;\n    for (int p = 0; p < %d; p++) u += sd[(i64)p * %lldLL + col];\n"
                   "    y[col] = %s((float)u);\n",
                C, EOP_COL_PARTS, C, stf(n->dtype));
    gen->scratch = sz_const((int64_t)EOP_COL_PARTS * C * 8);
}

/* The column sums of input 0 (dy) into y, which holds value n. */
static void bias_grad_phases(EopGen *gen, const IrNode *n)
{
    if (last_dim(n) > 0 && last_dim(n) % 8 == 0 && float_dtype(INN(0)->dtype)) {
        char load[128];
        snprintf(load, sizeof load, "            ld8_%s(x0 + r * %lldLL + c0, va);\n", ir_dtype_name(INN(0)->dtype),
                 (long long)last_dim(n));
        colsum8_phases(gen, n, "bias_grad", INN(0), load, "(double)va[j]");
        return;
    }
    char term[128];
    snprintf(term, sizeof term, "(double)%s(x0[r * %lldLL + col])", ldf(INN(0)->dtype),
             (long long)last_dim(n));
    colsum_phases(gen, n, "bias_grad", INN(0), term);
}

static void gen_bias_grad(EopGen *gen) { bias_grad_phases(gen, OUTN); }

/* LINEAR_DW_BGRAD: the dW GEMM (its BGRADB epilogue writes db), and as
 * the node's phases the column sums of dy into db, which the executor
 * launches (with a.y = db) only where cuBLASLt has no epilogue algorithm
 * (runtime/cuda/gemm_cublas.h, gemm_run_optional). */
static HpcStatus gen_linear_dw_bgrad(EopGen *gen, HpcError *err)
{
    HpcStatus st = gen_gemm(gen, err);
    if (st) return st;
    int db = ir_output(gen->g, gen->id, 1);
    if (db < 0 || gen->g->nodes[db].dtype != OUTN->dtype)
        return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: linear_dw_bgrad node %d (%s) needs its db output stored "
                        "as dW (%s); a bug in the fuse pass", gen->id, OUTN->name, ir_dtype_name(OUTN->dtype));
    bias_grad_phases(gen, &gen->g->nodes[db]);
    gen->kind = EOP_GEMM;
    return HPC_OK;
}

/* LINEAR_DX_ACC (compiler/fuse_accum.c): the dX GEMM with beta = 1 reading
 * acc as C (runtime/cuda/cuda_exec.c); no kernel of its own. */
static HpcStatus gen_linear_dx_acc(EopGen *gen, HpcError *err)
{
    HpcStatus st = gen_gemm(gen, err);
    if (st) return st;
    if (INN(2)->dtype != OUTN->dtype || OUTN->dtype != DT_F32)
        return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: linear_dx_acc node %d (%s) adds into %s and stores %s; "
                        "the GEMM accumulates into f32 only (a bug in the fuse pass)", gen->id, OUTN->name,
                        ir_dtype_name(INN(2)->dtype), ir_dtype_name(OUTN->dtype));
    return HPC_OK;
}

/* dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma, with
 * x and dy of the row in registers. */
static void gen_layernorm_dx_vec(EopGen *gen)
{
    const IrNode *n = OUTN;
    long long D = (long long)last_dim(n);
    int nu = ln_nu(D);
    StrBuf *s = ln_row_phase(gen, "ln_dx", n, D);
    ln_row_load(s, "xv", "x1", INN(1)->dtype, D);
    ln_row_stats(s, D, (double)(float)n->attr.norm.eps);
    ln_row_load(s, "dv", "x0", INN(0)->dtype, D);
    strbuf_printf(s, "    float a1 = 0.0f, b1 = 0.0f;\n#pragma unroll\n    for (int u = 0; u < %d; u++) {\n"
                   "        const int cu = threadIdx.x + blockDim.x * u;\n        if (cu >= %lld) break;\n        float gm[8];\n"
                   "        ld8_%s(x2 + cu * 8, gm);\n"
                   "        for (int j = 0; j < 8; j++) {\n            xv[u][j] = (xv[u][j] - mean) * rstd;\n"
                   "            dv[u][j] = dv[u][j] * gm[j];\n            a1 += dv[u][j];\n            b1 += dv[u][j] * xv[u][j];\n"
                   "        }\n    }\n"
                   "    a1 = block_sum(a1, sh) * (1.0f / %lld);\n    b1 = block_sum(b1, sh) * (1.0f / %lld);\n"
                   "#pragma unroll\n    for (int u = 0; u < %d; u++) {\n        const int cu = threadIdx.x + blockDim.x * u;\n"
                   "        if (cu >= %lld) break;\n        float r[8];\n"
                   "        for (int j = 0; j < 8; j++) r[j] = rstd * (dv[u][j] - a1 - xv[u][j] * b1);\n"
                   "        st8_%s(y + row * %lldLL + cu * 8, r);\n    }\n",
                nu, D / 8, ir_dtype_name(INN(2)->dtype), D, D, nu, D / 8, ir_dtype_name(n->dtype), D);
}

static void gen_layernorm_dx(EopGen *gen)
{
    const IrNode *n = OUTN, *x = INN(1);
    long long D = (long long)last_dim(n);
    if (ln_vec_ok(D) && ln_vec_dtypes(gen)) {
        gen_layernorm_dx_vec(gen);
        return;
    }
    char rows[128], tag[32];
    rows_expr(n, rows, sizeof rows);
    snprintf(tag, sizeof tag, "h%lld", D);
    StrBuf *s = phase(gen, "ln_dx", tag, EOP_LT_ROWS, sz_rows(n), row_threads(D));
    strbuf_printf(s, "    __shared__ float sh[32];\n    const i64 row = blockIdx.x;\n    if (row >= %s) return;\n"
                   "    const %s *xr = x1 + row * %lldLL;\n    const %s *dr = x0 + row * %lldLL;\n",
                rows, ctype(x->dtype), D, ctype(INN(0)->dtype), D);
    ln_stats_text(s, ldf(x->dtype), D, (double)(float)n->attr.norm.eps);
    const char *lx = ldf(x->dtype), *ldy = ldf(INN(0)->dtype), *lg = ldf(INN(2)->dtype);
    strbuf_printf(s, "    float a1 = 0.0f, b1 = 0.0f;\n"
                   "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) {\n"
                   "        float xh = (%s(xr[c]) - mean) * rstd, g = %s(dr[c]) * %s(x2[c]);\n"
                   "        a1 += g;\n        b1 += g * xh;\n    }\n"
                   "    a1 = block_sum(a1, sh) * (1.0f / %lld);\n    b1 = block_sum(b1, sh) * (1.0f / %lld);\n"
                   "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) {\n"
                   "        float xh = (%s(xr[c]) - mean) * rstd, g = %s(dr[c]) * %s(x2[c]);\n"
                   "        y[row * %lldLL + c] = %s(rstd * (g - a1 - xh * b1));\n    }\n",
                D, lx, ldy, lg, D, D, D, lx, ldy, lg, D, stf(n->dtype));
}

/* Row statistics into the scratch after the column partials, then the
 * column sums of dy * xhat. */
static void gen_layernorm_dgamma_vec(EopGen *gen)
{
    const IrNode *n = OUTN, *x = INN(1);
    long long D = (long long)last_dim(n);
    long long st_off = 2LL * EOP_COL_PARTS * D;   /* in floats, after the double partials */
    StepSize R = sz_rows(x);
    StrBuf *s = ln_row_phase(gen, "ln_stats", x, D);
    ln_row_load(s, "xv", "x1", x->dtype, D);
    ln_row_stats(s, D, (double)(float)n->attr.norm.eps);
    strbuf_printf(s, "    if (threadIdx.x == 0) {\n        sf[%lldLL + row] = mean;\n        sf[%lldLL + R + row] = rstd;\n    }\n",
                st_off, st_off);
    char load[256], term[160];
    snprintf(load, sizeof load, "            ld8_%s(x0 + r * %lldLL + c0, va);\n            ld8_%s(x1 + r * %lldLL + c0, vb);\n"
                                "            const float mu = sf[%lldLL + r], rs = sf[%lldLL + R + r];\n",
             ir_dtype_name(INN(0)->dtype), D, ir_dtype_name(x->dtype), D, st_off, st_off);
    snprintf(term, sizeof term, "(double)va[j] * (double)((vb[j] - mu) * rs)");
    colsum8_phases(gen, OUTN, "ln_dgamma", x, load, term);
    gen->scratch = sz_affine((int64_t)EOP_COL_PARTS * D * 8, 2 * 4, R);
}

static void gen_layernorm_dgamma(EopGen *gen)
{
    const IrNode *n = OUTN, *x = INN(1);
    long long D = (long long)last_dim(n);
    if (ln_vec_ok(D) && ln_vec_dtypes(gen)) {
        gen_layernorm_dgamma_vec(gen);
        return;
    }
    char rows[128], tag[32], term[256];
    rows_expr(x, rows, sizeof rows);
    snprintf(tag, sizeof tag, "h%lld", D);
    long long st_off = 2LL * EOP_COL_PARTS * D;   /* in floats, after the double partials */
    StepSize R = sz_rows(x);
    StrBuf *s = phase(gen, "ln_stats", tag, EOP_LT_ROWS, R, row_threads(D));
    strbuf_printf(s, "    __shared__ float sh[32];\n    const i64 row = blockIdx.x, R = %s;\n"
                   "    if (row >= R) return;\n    const %s *xr = x1 + row * %lldLL;\n",
                rows, ctype(x->dtype), D);
    ln_stats_text(s, ldf(x->dtype), D, (double)(float)n->attr.norm.eps);
    strbuf_printf(s, "    if (threadIdx.x == 0) {\n        sf[%lldLL + row] = mean;\n"
                   "        sf[%lldLL + R + row] = rstd;\n    }\n", st_off, st_off);
    snprintf(term, sizeof term,
             "(double)%s(x0[r * %lldLL + col]) * (double)((%s(x1[r * %lldLL + col]) - sf[%lldLL + r]) * sf[%lldLL + R + r])",
             ldf(INN(0)->dtype), D, ldf(x->dtype), D, st_off, st_off);
    colsum_phases(gen, OUTN, "ln_dgamma", x, term);
    gen->scratch = sz_affine((int64_t)EOP_COL_PARTS * D * 8, 2 * 4, R);
}

/* ---- activations: forward, backward, backward + bias gradient ----------
 * The FFN's activation moves B*L*ffn values per pass (BERT-base 256 x 128:
 * 201 MB each way in f16), so these kernels are written for bandwidth:
 * 16-byte loads and stores (8 values), four of them per input in flight
 * per thread before any math, f32 math (the exact GELU through gelu_cdf of
 * program/activations.h); the grid
 * strides, so any grid is correct.
 * ACT_BWD_BGRAD adds the bias gradient: each block sums the columns of
 * the stored dx over its rows into f32 partials, and a second kernel adds
 * the partials per column in a fixed order (double), so db has the same
 * bits every run. */

/* ACT_BWD_BGRAD's row blocks: ceil(R / ACT_PART_ROWS), at most ACT_PARTS. */
#define ACT_PARTS 512
#define ACT_PART_ROWS 16

/* 16-byte chunks of one 8-value vector of dtype d (f32: two). */
static int act_chunks(DType d) { return d == DT_F32 ? 2 : 1; }

/* Raw loads of vector `vi` (a C expression) of input k into q{k}[u][..]. */
static void act_raw_load(StrBuf *s, int k, DType d, const char *vi, const char *indent)
{
    strbuf_printf(s, "%sfor (int w = 0; w < %d; w++) q%d[u][w] = ((const eop_v16 *)x%d)[(%s) * %d + w];\n",
                  indent, act_chunks(d), k, k, vi, act_chunks(d));
}

/* Stores the 8 f32 values NAME[8] to PTR (dtype d): 16-bit types two at a
 * time with one packed conversion (cvt.rn.{f16,bf16}x2.f32: the same
 * round-to-nearest-even as st_f16 / st_bf16 per value, half the
 * conversion instructions, which these kernels are short of).  With ACC,
 * ACC[j] += the stored value as f32 (what a reader of PTR sees). */
static void act_store8(StrBuf *s, DType d, const char *name, const char *ptr, const char *acc, const char *ind)
{
    if (d == DT_F32) {
        if (acc) strbuf_printf(s, "%s#pragma unroll\n%sfor (int j = 0; j < 8; j++) %s[j] += %s[j];\n", ind, ind, acc, name);
        strbuf_printf(s, "%sst8_f32(%s, %s);\n", ind, ptr, name);
        return;
    }
    const char *t = d == DT_F16 ? "f16" : "bf16";
    strbuf_printf(s, "%s{\n%s    eop_v16 pk;\n#pragma unroll\n%s    for (int k = 0; k < 4; k++) {\n"
                     "%s        asm(\"cvt.rn.%sx2.f32 %%0, %%1, %%2;\" : \"=r\"(pk.w[k]) : \"f\"(%s[2 * k + 1]), \"f\"(%s[2 * k]));\n",
                  ind, ind, ind, ind, t, name, name);
    if (acc)
        strbuf_printf(s, "%s        %s[2 * k] += ld_%s((unsigned short)(pk.w[k] & 0xffffu));\n"
                         "%s        %s[2 * k + 1] += ld_%s((unsigned short)(pk.w[k] >> 16));\n",
                      ind, acc, t, ind, acc, t);
    strbuf_printf(s, "%s    }\n%s    *(eop_v16 *)(%s) = pk;\n%s}\n", ind, ind, ptr, ind);
}

/* Vector phase over the node's values: out = EXPR of v0[j], v1[j] (the
 * inputs' element as f32), 4 vectors of 8 per thread per step. */
static void act_vec_phase(EopGen *gen, const char *base, const char *expr)
{
    const IrNode *n = OUTN;
    char tag[64], num[128];
    shape_tag(n, tag, sizeof tag);
    numel_expr(n, num, sizeof num);
    /* One thread per 4 vectors of 8: many short blocks (BERT-base 256 x 128:
     * 12288 of 256, ~19 waves on an H200), so the last wave's tail is small. */
    StepSize cnt = sz_ceil_div(sz_numel(n), 32);
    StrBuf *s = phase(gen, base, tag, EOP_LT_ELEMS, cnt, 256);
    strbuf_printf(s, "    const i64 n = %s, nv = n / 8, T = (i64)gridDim.x * blockDim.x;\n"
                   "    for (i64 v = (i64)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += 4 * T) {\n", num);
    for (int k = 0; k < n->n_in; k++)
        strbuf_printf(s, "        eop_v16 q%d[4][%d];\n", k, act_chunks(INN(k)->dtype));
    strbuf_add(s, "#pragma unroll\n        for (int u = 0; u < 4; u++) {\n            if (v + u * T >= nv) break;\n");
    for (int k = 0; k < n->n_in; k++) act_raw_load(s, k, INN(k)->dtype, "v + u * T", "            ");
    strbuf_add(s, "        }\n#pragma unroll\n        for (int u = 0; u < 4; u++) {\n"
                "            if (v + u * T >= nv) break;\n");
    for (int k = 0; k < n->n_in; k++)
        strbuf_printf(s, "            float v%d[8];\n            ld8_%s((const %s *)q%d[u], v%d);\n", k,
                      ir_dtype_name(INN(k)->dtype), ctype(INN(k)->dtype), k, k);
    strbuf_add(s, "            float r[8];\n#pragma unroll\n            for (int j = 0; j < 8; j++) r[j] = ");
    strbuf_add(s, expr);
    strbuf_add(s, ";\n");
    act_store8(s, n->dtype, "r", "y + (v + u * T) * 8", NULL, "            ");
    strbuf_add(s, "        }\n    }\n");
    /* the last n % 8 values */
    strbuf_add(s, "    for (i64 i = nv * 8 + (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += T) {\n"
                "        const int j = 0;\n");
    for (int k = 0; k < n->n_in; k++)
        strbuf_printf(s, "        float v%d[1];\n        v%d[0] = %s(x%d[i]);\n", k, k, ldf(INN(k)->dtype), k);
    strbuf_printf(s, "        y[i] = %s(", stf(n->dtype));
    strbuf_add(s, expr);
    strbuf_add(s, ");\n    }\n");
}

static void gen_act(EopGen *gen)
{
    char base[32], expr[64];
    const char *a = act_name(OUTN->attr.act.kind);
    snprintf(base, sizeof base, "%s_fwd", a);
    if (vec_ok(gen)) {
        snprintf(expr, sizeof expr, "act_%s(v0[j])", a);
        act_vec_phase(gen, base, expr);
        return;
    }
    StrBuf *s = elems_phase(gen, base, OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(act_%s(%s(x0[i])));\n", stf(OUTN->dtype), a, ldf(INN(0)->dtype));
}

static void gen_act_bwd(EopGen *gen)
{
    char base[32], expr[64];
    const char *a = act_name(OUTN->attr.act.kind);
    snprintf(base, sizeof base, "%s_bwd", a);
    if (vec_ok(gen)) {
        snprintf(expr, sizeof expr, "v0[j] * actg_%s(v1[j])", a);
        act_vec_phase(gen, base, expr);
        return;
    }
    StrBuf *s = elems_phase(gen, base, OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s(%s(x0[i]) * actg_%s(%s(x1[i])));\n", stf(OUTN->dtype),
                ldf(INN(0)->dtype), a, ldf(INN(1)->dtype));
}

/* The row blocks of ACT_BWD_BGRAD for R rows: min(ACT_PARTS, ceil(R / ACT_PART_ROWS)),
 * as a StepSize (the launch) and as kernel text (both phases). */
static StepSize act_parts_size(const IrNode *n)
{
    StepSize s = sz_rows(n);
    s.c0 = ACT_PART_ROWS - 1;
    s.div = ACT_PART_ROWS;
    s.cap = ACT_PARTS;
    return s;
}

static void act_parts_text(StrBuf *s, const IrNode *n)
{
    char rows[128];
    rows_expr(n, rows, sizeof rows);
    strbuf_printf(s, "    const i64 R = %s;\n    const i64 P = min((i64)%d, (R + %d) / %d);\n", rows, ACT_PARTS,
                  ACT_PART_ROWS - 1, ACT_PART_ROWS);
}

/* Phase 1, vector form (C % 8 == 0): block b takes rows b, b + P, ...;
 * thread t columns 8t .. 8t + 7 (and t + blockDim.x ... when C / 8 is
 * larger), four rows in flight.  dx is rounded to its dtype and the
 * stored value summed, as BIAS_GRAD reads it; y (output 2) is act(x). */
static void act_bgrad_vec(EopGen *gen, StrBuf *s, const char *a, int y2)
{
    const IrNode *n = OUTN;
    long long C = (long long)last_dim(n);
    DType dd = INN(0)->dtype, dx = INN(1)->dtype, dt = n->dtype;
    strbuf_printf(s, "    const i64 b = blockIdx.x;\n    (void)P;\n"
                   "    for (int cu = threadIdx.x; cu < %lld; cu += blockDim.x) {\n"
                   "        float acc[8];\n#pragma unroll\n        for (int j = 0; j < 8; j++) acc[j] = 0.0f;\n",
                  C / 8);
    if (y2 >= 0)
        strbuf_printf(s, "        %s *y2 = (%s *)a.yk[1];\n", ctype(gen->g->nodes[y2].dtype), ctype(gen->g->nodes[y2].dtype));
    /* one row: q0 (dy) and q1 (x) chunks of row r at column block cu */
    strbuf_printf(s, "        auto row = [&](const eop_v16 *qd, const eop_v16 *qx, i64 r) {\n"
                   "            float d[8], x[8], o[8];\n"
                   "            ld8_%s((const %s *)qd, d);\n            ld8_%s((const %s *)qx, x);\n",
                  ir_dtype_name(dd), ctype(dd), ir_dtype_name(dx), ctype(dx));
    if (y2 >= 0 && OUTN->attr.act_bgrad.kind == IR_ACT_GELU)
        /* act_gelu and actg_gelu of program/activations.h in their order of
         * operations, with Phi(x) and phi(x) computed once for both */
        strbuf_add(s, "#pragma unroll\n            for (int j = 0; j < 8; j++) {\n"
                      "                float pdf;\n"
                      "                const float cdf = gelu_cdf(x[j], &pdf);\n"
                      "                o[j] = d[j] * (cdf + x[j] * pdf);\n"
                      "                x[j] = x[j] * cdf;\n            }\n");
    else if (y2 >= 0)
        strbuf_printf(s, "#pragma unroll\n            for (int j = 0; j < 8; j++) {\n"
                         "                o[j] = d[j] * actg_%s(x[j]);\n                x[j] = act_%s(x[j]);\n            }\n",
                      a, a);
    else
        strbuf_printf(s, "#pragma unroll\n            for (int j = 0; j < 8; j++) o[j] = d[j] * actg_%s(x[j]);\n", a);
    char ptr[64];
    snprintf(ptr, sizeof ptr, "y + r * %lldLL + cu * 8", C);
    act_store8(s, dt, "o", ptr, "acc", "            ");
    if (y2 >= 0) {
        snprintf(ptr, sizeof ptr, "y2 + r * %lldLL + cu * 8", C);
        act_store8(s, gen->g->nodes[y2].dtype, "x", ptr, NULL, "            ");
    }
    strbuf_printf(s, "        };\n        i64 r = b;\n"
                   "        for (; r + 3 * P < R; r += 4 * P) {\n"
                   "            eop_v16 q0[4][%d], q1[4][%d];\n"
                   "#pragma unroll\n            for (int u = 0; u < 4; u++) {\n"
                   "                const i64 vi = (r + u * P) * %lldLL + cu;\n",
                  act_chunks(dd), act_chunks(dx), C / 8);
    act_raw_load(s, 0, dd, "vi", "                ");
    act_raw_load(s, 1, dx, "vi", "                ");
    strbuf_printf(s, "            }\n#pragma unroll\n            for (int u = 0; u < 4; u++) row(q0[u], q1[u], r + u * P);\n"
                   "        }\n"
                   "        for (; r < R; r += P) {\n            eop_v16 q0[1][%d], q1[1][%d];\n"
                   "            const int u = 0;\n            const i64 vi = r * %lldLL + cu;\n",
                  act_chunks(dd), act_chunks(dx), C / 8);
    act_raw_load(s, 0, dd, "vi", "            ");
    act_raw_load(s, 1, dx, "vi", "            ");
    strbuf_printf(s, "            row(q0[0], q1[0], r);\n        }\n"
                   "        float4 *pp = (float4 *)(sf + b * %lldLL + cu * 8);\n"
                   "        pp[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);\n"
                   "        pp[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);\n    }\n",
                  C);
}

/* Phase 1, any C: one column per thread per row. */
static void act_bgrad_scalar(EopGen *gen, StrBuf *s, const char *a, int y2)
{
    const IrNode *n = OUTN;
    long long C = (long long)last_dim(n);
    strbuf_printf(s, "    const i64 b = blockIdx.x;\n    (void)P;\n");
    if (y2 >= 0)
        strbuf_printf(s, "    %s *y2 = (%s *)a.yk[1];\n", ctype(gen->g->nodes[y2].dtype), ctype(gen->g->nodes[y2].dtype));
    strbuf_printf(s, "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) {\n        float acc = 0.0f;\n"
                   "        for (i64 r = b; r < R; r += P) {\n            const i64 i = r * %lldLL + c;\n"
                   "            const float x = %s(x1[i]), o = %s(%s(%s(x0[i]) * actg_%s(x)));\n"
                   "            y[i] = %s(o);\n            acc += o;\n",
                  C, C, ldf(INN(1)->dtype), ldf(n->dtype), stf(n->dtype), ldf(INN(0)->dtype), a, stf(n->dtype));
    if (y2 >= 0) strbuf_printf(s, "            y2[i] = %s(act_%s(x));\n", stf(gen->g->nodes[y2].dtype), a);
    strbuf_printf(s, "        }\n        sf[b * %lldLL + c] = acc;\n    }\n", C);
}

/* ACT_BWD_BGRAD: phase 1 writes dx (and y) and the partials (P, C) f32 in
 * the scratch; phase 2, one block of 8 warps per 32 columns, adds them in
 * double in a fixed order into db (output 1). */
static void gen_act_bwd_bgrad(EopGen *gen)
{
    const IrNode *n = OUTN;
    const char *a = act_name(n->attr.act_bgrad.kind);
    long long C = (long long)last_dim(n);
    int db = ir_output(gen->g, gen->id, 1), y2 = ir_output(gen->g, gen->id, 2);
    bool vec = vec_ok(gen) && C % 8 == 0 && (y2 < 0 || float_dtype(gen->g->nodes[y2].dtype));
    char tag[64], base[48];
    shape_tag(n, tag, sizeof tag);
    snprintf(base, sizeof base, "%s_bwd_bgrad%s", a, vec ? "8" : "");
    long long work = vec ? C / 8 : C;
    int threads = work >= 512 ? 512 : work <= 64 ? 64 : (int)((work + 31) / 32 * 32);
    StrBuf *s = phase(gen, base, tag, EOP_LT_ROWS, act_parts_size(n), threads);
    act_parts_text(s, n);
    if (vec) act_bgrad_vec(gen, s, a, y2);
    else act_bgrad_scalar(gen, s, a, y2);
    snprintf(base, sizeof base, "%s_bgrad_sum", a);
    snprintf(tag, sizeof tag, "c%lld", C);
    s = phase(gen, base, tag, EOP_LT_ELEMS, sz_const((C + 31) / 32 * 256), 256);
    act_parts_text(s, n);
    DType dbt = db >= 0 ? gen->g->nodes[db].dtype : DT_F32;
    strbuf_printf(s, "    __shared__ double part[8][32];\n"
                   "    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;\n"
                   "    const i64 col = (i64)blockIdx.x * 32 + lane;\n    double t = 0.0;\n"
                   "    if (col < %lld)\n        for (i64 p = w; p < P; p += 8) t += (double)sf[p * %lldLL + col];\n"
                   "    part[w][lane] = t;\n    __syncthreads();\n"
                   "    %s *db = (%s *)a.yk[0];\n"
                   "    if (w != 0 || col >= %lld || !db) return;\n"
                   "    for (int k = 1; k < 8; k++) t += part[k][lane];\n"
                   "    db[col] = %s((float)t);\n",
                  C, C, ctype(dbt), ctype(dbt), C, stf(dbt));
    /* partials: (P, C) f32, P <= ceil(R / ACT_PART_ROWS) */
    StepSize sc = sz_rows(n);
    sc.c1 *= C * 4;
    sc.c0 = (int64_t)(ACT_PART_ROWS - 1) * C * 4;
    sc.div = ACT_PART_ROWS;
    sc.cap = (int64_t)ACT_PARTS * C * 4;
    gen->scratch = sc;
}

static void gen_softmax_bwd(EopGen *gen)
{
    StrBuf *s = warp_rows_phase(gen, "softmax_bwd");
    const char *ldy = ldf(INN(0)->dtype), *lp = ldf(INN(1)->dtype);
    strbuf_printf(s, "    const %s *dr = x0 + row * a.L;\n    const %s *pr = x1 + row * a.L;\n"
                   "    float dot = 0.0f;\n"
                   "    for (i64 k = lane; k < a.L; k += 32) dot += %s(dr[k]) * %s(pr[k]);\n"
                   "    dot = warp_sum(dot);\n"
                   "    for (i64 k = lane; k < a.L; k += 32)\n"
                   "        y[row * a.L + k] = %s(%s(pr[k]) * (%s(dr[k]) - dot));\n",
                ctype(INN(0)->dtype), ctype(INN(1)->dtype), ldy, lp, stf(OUTN->dtype), lp, ldy);
}

static void gen_slice_first_bwd(EopGen *gen)
{
    long long H = (long long)last_dim(OUTN);
    if (H % 8 == 0 && float_dtype(OUTN->dtype) && float_dtype(INN(0)->dtype)) {
        /* 8 elements a thread, 16-byte stores: the scalar form's 64-bit
         * divisions per element held it to 0.6-1.1 TB/s (H200, 2026-12-02) */
        char num[128], tag[64];
        numel_expr(OUTN, num, sizeof num);
        shape_tag(OUTN, tag, sizeof tag);
        StrBuf *s = phase(gen, "slice_first_bwd8", tag, EOP_LT_ELEMS, sz_ceil_div(sz_numel(OUTN), 8), 256);
        strbuf_printf(s, "    const i64 nv = (%s) / 8;\n    EOP_FOR(iv, nv) {\n"
                       "        const i64 r = iv / %lldLL, c = iv * 8 - r * %lldLL;\n        float v[8];\n"
                       "        if (r %% a.L == 0) ld8_%s(x0 + (r / a.L) * %lldLL + c, v);\n"
                       "        else for (int j = 0; j < 8; j++) v[j] = 0.0f;\n"
                       "        st8_%s(y + iv * 8, v);\n    }\n",
                    num, H / 8, H, ir_dtype_name(INN(0)->dtype), H, ir_dtype_name(OUTN->dtype));
        return;
    }
    StrBuf *s = elems_phase(gen, "slice_first_bwd", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) {\n        i64 c = i %% %lldLL, r = i / %lldLL;\n"
                   "        y[i] = %s(r %% a.L == 0 ? %s(x0[(r / a.L) * %lldLL + c]) : 0.0f);\n    }\n",
                H, H, stf(OUTN->dtype), ldf(INN(0)->dtype), H);
}

static void gen_slice_last_bwd(EopGen *gen)
{
    long long H = (long long)last_dim(OUTN);
    StrBuf *s = elems_phase(gen, "slice_last_bwd", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) {\n        const i64 c = i %% %lldLL, r = i / %lldLL, b = r / a.L;\n", H, H);
    slice_last_pos_text(s, "b");
    strbuf_printf(s, "        y[i] = %s(r %% a.L == tl ? %s(x0[b * %lldLL + c]) : 0.0f);\n    }\n",
                stf(OUTN->dtype), ldf(INN(0)->dtype), H);
}

static void gen_cross_entropy_bwd(EopGen *gen)
{
    const IrNode *x = INN(1), *lab = INN(2);
    long long C = (long long)last_dim(x);
    char N[128], tag[32];
    numel_expr(lab, N, sizeof N);
    snprintf(tag, sizeof tag, "c%lld", C);
    StrBuf *s = phase(gen, "xent_count", tag, EOP_LT_ONE, sz_const(1), 1024);
    strbuf_printf(s, "    __shared__ float sh[32];\n    float cnt = 0.0f;\n"
                   "    for (i64 i = threadIdx.x; i < %s; i += blockDim.x) cnt += x2[i] != -100 ? 1.0f : 0.0f;\n"
                   "    cnt = block_sum(cnt, sh);\n    if (threadIdx.x == 0) sf[0] = cnt;\n", N);
    const char *ld = ldf(x->dtype);
    s = phase(gen, "xent_bwd", tag, EOP_LT_ROWS, sz_numel(lab), C >= 256 ? 256 : 128);
    strbuf_printf(s, "    __shared__ float sh[32];\n    const i64 row = blockIdx.x;\n    if (row >= %s) return;\n"
                   "    const %s *xr = x1 + row * %lldLL;\n    %s *dx = y + row * %lldLL;\n"
                   "    const int label = x2[row];\n    const float cnt = sf[0];\n"
                   "    if (label == -100 || cnt == 0.0f) {\n"
                   "        for (int c = threadIdx.x; c < %lld; c += blockDim.x) dx[c] = %s(0.0f);\n"
                   "        return;\n    }\n    float m = EOP_NEG_INF;\n"
                   "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) m = fmaxf(m, %s(xr[c]));\n"
                   "    m = block_max(m, sh);\n    float e = 0.0f;\n"
                   "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) e += expf(%s(xr[c]) - m);\n"
                   "    const float lse = m + logf(block_sum(e, sh));\n"
                   "    const float g = %s(x0[0]) / cnt;\n"
                   "    for (int c = threadIdx.x; c < %lld; c += blockDim.x)\n"
                   "        dx[c] = %s(g * (expf(%s(xr[c]) - lse) - (c == label ? 1.0f : 0.0f)));\n",
                N, ctype(x->dtype), C, ctype(OUTN->dtype), C, C, stf(OUTN->dtype), C, ld, C, ld,
                ldf(INN(0)->dtype), C, stf(OUTN->dtype), ld);
    gen->scratch = sz_const(256);
}

static void gen_mse_bwd(EopGen *gen)
{
    StrBuf *s = elems_phase(gen, "mse_bwd", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) y[i] = %s((float)((double)%s(x0[0]) * 2.0 * ((double)%s(x1[i]) - "
                   "(double)%s(x2[i])) / (double)n));\n",
                stf(OUTN->dtype), ldf(INN(0)->dtype), ldf(INN(1)->dtype), ldf(INN(2)->dtype));
}

/* ---- fused ops (compiler/fuse.h) ------------------------------------- */

/* "ld_f16(st_f16(v))": v rounded to the storage dtype of a removed value. */
static void round_expr(DType mid, const char *v, char *buf, size_t size)
{
    if (mid == DT_F16 || mid == DT_BF16) snprintf(buf, size, "%s(%s(%s))", ldf(mid), stf(mid), v);
    else snprintf(buf, size, "(%s)", v);
}

/* Declares p, sc, on (dropout is live) and salt for a fused op's mask.  The
 * salt is the node's launch argument (a.salt), not a constant, so the
 * layers' kernels that differ only by it are one kernel in the module. */
static void dropout_consts(EopGen *gen, StrBuf *s, IrFusedAttr fa)
{
    eopb_use_salt(gen, (uint32_t)fa.salt);
    strbuf_printf(s, "    const float p = (float)%.9g;\n    const float dscale = (float)(1.0 / (1.0 - (double)p));\n"
                   "    const bool on = ctl->training && p != 0.0f;\n    const u32 salt = (u32)a.salt;\n",
                (double)fa.p);
}

/* Row max and sum of exp over the visible keys of scores `sc` (warp per row). */
static void softmax_stats_text(StrBuf *s, const char *ld, bool causal)
{
    strbuf_printf(s, "    float m = EOP_NEG_INF;\n"
                   "    for (i64 k = lane; k < a.L; k += 32) if (VIS(k)) m = fmaxf(m, %s(sc[k]));\n"
                   "    m = warp_max(m);\n    float sum = 0.0f;\n"
                   "    for (i64 k = lane; k < a.L; k += 32) if (VIS(k)) sum += expf(%s(sc[k]) - m);\n"
                   "    sum = warp_sum(sum);\n",
                ld, ld);
}

/* Rows of at most SM_KPL * 32 keys keep their keys in registers: the same
 * statistics as softmax_stats_text (same per-lane order, so the same bits),
 * with e[t] = expf(score - m) of key lane + 32 t computed once. */
#define SM_KPL 4
static void softmax_regs_text(StrBuf *s, const char *ld)
{
    strbuf_printf(s, "        float e[%d];\n        bool vis[%d];\n        float m = EOP_NEG_INF;\n"
                   "#pragma unroll\n        for (int t = 0; t < %d; t++) {\n"
                   "            const i64 k = lane + 32 * t;\n            vis[t] = k < a.L && VIS(k);\n"
                   "            e[t] = vis[t] ? %s(sc[k]) : 0.0f;\n            if (vis[t]) m = fmaxf(m, e[t]);\n        }\n"
                   "        m = warp_max(m);\n        float sum = 0.0f;\n"
                   "#pragma unroll\n        for (int t = 0; t < %d; t++)\n"
                   "            if (vis[t]) {\n                e[t] = expf(e[t] - m);\n                sum += e[t];\n            }\n"
                   "        sum = warp_sum(sum);\n",
                SM_KPL, SM_KPL, SM_KPL, ld, SM_KPL);
}

static void vis_define(StrBuf *s, bool causal)
{
    strbuf_printf(s, "#define VIS(k) (mask[k] != 0 && !(%d && (k) > q))\n", causal ? 1 : 0);
}

static void gen_softmax_dropout(EopGen *gen)
{
    const IrNode *n = OUTN;
    IrFusedAttr fa = fuse_attr_get(n);
    StrBuf *s = warp_rows_phase(gen, fa.causal ? "softmax_dropout_causal_fwd" : "softmax_dropout_fwd");
    const char *ld = ldf(INN(0)->dtype);
    char pr[96];
    round_expr((DType)fa.mid, "VIS(k) && sum != 0.0f ? expf(v - m) / sum : 0.0f", pr, sizeof pr);
    dropout_consts(gen, s, fa);
    strbuf_printf(s, "    const i64 b = row / (%lldLL * a.L), q = row %% a.L;\n"
                   "    const int *mask = x1 + b * a.L;\n    const %s *sc = x0 + row * a.L;\n",
                (long long)n->dims[1], ctype(INN(0)->dtype));
    vis_define(s, fa.causal);
    char rp[96];
    round_expr((DType)fa.mid, "vis[t] && sum != 0.0f ? e[t] / sum : 0.0f", rp, sizeof rp);
    strbuf_printf(s, "    if (a.L <= %d) {\n", 32 * SM_KPL);
    softmax_regs_text(s, ld);
    strbuf_printf(s, "#pragma unroll\n        for (int t = 0; t < %d; t++) {\n            const i64 k = lane + 32 * t;\n"
                   "            if (k >= a.L) break;\n            float pk = %s;\n"
                   "            if (on) pk = philox_keep(ctl->seed, (u64)(row * a.L + k), ctl->step, salt, p) ? pk * dscale : 0.0f;\n"
                   "            y[row * a.L + k] = %s(pk);\n        }\n        return;\n    }\n",
                SM_KPL, rp, stf(n->dtype));
    softmax_stats_text(s, ld, fa.causal);
    strbuf_printf(s, "    for (i64 k = lane; k < a.L; k += 32) {\n"
                   "        const float v = %s(sc[k]);\n        float pk = %s;\n"
                   "        if (on) pk = philox_keep(ctl->seed, (u64)(row * a.L + k), ctl->step, salt, p) ? pk * dscale : 0.0f;\n"
                   "        y[row * a.L + k] = %s(pk);\n    }\n#undef VIS\n",
                ld, pr, stf(n->dtype));
}

/* dscores from dy (x0) and the scores (x1): the probabilities and the
 * dropped gradient are recomputed per key, rounded where the unfused chain
 * stores them, in two passes (the dot product, then the result). */
static void gen_softmax_dropout_bwd(EopGen *gen)
{
    const IrNode *n = OUTN;
    IrFusedAttr fa = fuse_attr_get(n);
    StrBuf *s = warp_rows_phase(gen, fa.causal ? "softmax_dropout_causal_bwd" : "softmax_dropout_bwd");
    const char *ls = ldf(INN(1)->dtype), *ld = ldf(INN(0)->dtype);
    char pr[96], gr[64];
    round_expr((DType)fa.mid, "VIS(k) && sum != 0.0f ? expf(v - m) / sum : 0.0f", pr, sizeof pr);
    round_expr((DType)fa.mid2, "g", gr, sizeof gr);
    dropout_consts(gen, s, fa);
    strbuf_printf(s, "    const i64 b = row / (%lldLL * a.L), q = row %% a.L;\n"
                   "    const int *mask = x2 + b * a.L;\n    const %s *sc = x1 + row * a.L;\n"
                   "    const %s *dr = x0 + row * a.L;\n",
                (long long)n->dims[1], ctype(INN(1)->dtype), ctype(INN(0)->dtype));
    vis_define(s, fa.causal);
    char rp[96], rg[64];
    round_expr((DType)fa.mid, "vis[t] && sum != 0.0f ? e[t] / sum : 0.0f", rp, sizeof rp);
    round_expr((DType)fa.mid2, "g", rg, sizeof rg);
    strbuf_printf(s, "    if (a.L <= %d) {\n", 32 * SM_KPL);
    softmax_regs_text(s, ls);
    strbuf_printf(s, "        float pk[%d], gk[%d], dot = 0.0f;\n"
                   "#pragma unroll\n        for (int t = 0; t < %d; t++) {\n            const i64 k = lane + 32 * t;\n"
                   "            pk[t] = gk[t] = 0.0f;\n            if (k >= a.L) continue;\n"
                   "            pk[t] = %s;\n            float g = %s(dr[k]);\n"
                   "            if (on) g = philox_keep(ctl->seed, (u64)(row * a.L + k), ctl->step, salt, p) ? g * dscale : 0.0f;\n"
                   "            gk[t] = %s;\n            dot += gk[t] * pk[t];\n        }\n"
                   "        dot = warp_sum(dot);\n"
                   "#pragma unroll\n        for (int t = 0; t < %d; t++) {\n            const i64 k = lane + 32 * t;\n"
                   "            if (k < a.L) y[row * a.L + k] = %s(pk[t] * (gk[t] - dot));\n        }\n"
                   "        return;\n    }\n",
                SM_KPL, SM_KPL, SM_KPL, rp, ld, rg, SM_KPL, stf(n->dtype));
    softmax_stats_text(s, ls, fa.causal);
    strbuf_printf(s, "#define PG(k) const float v = %s(sc[k]); const float pk = %s; float g = %s(dr[k]); \\\n"
                   "    if (on) g = philox_keep(ctl->seed, (u64)(row * a.L + k), ctl->step, salt, p) ? g * dscale : 0.0f; \\\n"
                   "    const float gk = %s;\n"
                   "    float dot = 0.0f;\n"
                   "    for (i64 k = lane; k < a.L; k += 32) { PG(k) dot += gk * pk; }\n"
                   "    dot = warp_sum(dot);\n"
                   "    for (i64 k = lane; k < a.L; k += 32) { PG(k) y[row * a.L + k] = %s(pk * (gk - dot)); }\n"
                   "#undef PG\n#undef VIS\n",
                ls, pr, ld, gr, stf(n->dtype));
}

static void gen_dropout_add(EopGen *gen)
{
    IrFusedAttr fa = fuse_attr_get(OUTN);
    char vr[48];
    round_expr((DType)fa.mid, "v", vr, sizeof vr);
    if (vec_ok(gen)) {
        StrBuf pre = {0};
        char keep[160], expr[320];
        dropout_consts(gen, &pre, fa);
        snprintf(keep, sizeof keep, "dropout_elem(philox_mask8(ctl->seed, (u64)(i - j) >> 3, ctl->step, salt, p), i, on, v0[j], dscale)");
        round_expr((DType)fa.mid, keep, expr, sizeof expr);
        size_t len = strlen(expr);
        snprintf(expr + len, sizeof expr - len, " + v1[j]");
        vec_elems(gen, "dropout_add", pre.p, expr);
        strbuf_free(&pre);
        return;
    }
    StrBuf *s = elems_phase(gen, "dropout_add", OUTN);
    dropout_consts(gen, s, fa);
    strbuf_printf(s, "    EOP_FOR(i, n) {\n        float v = %s(x0[i]);\n"
                   "        if (on) v = philox_keep(ctl->seed, (u64)i, ctl->step, salt, p) ? v * dscale : 0.0f;\n"
                   "        y[i] = %s(%s + %s(x1[i]));\n    }\n",
                ldf(INN(0)->dtype), stf(OUTN->dtype), vr, ldf(INN(1)->dtype));
}

/* ---- fused LayerNorm sites (LN_RESIDUAL, LN_RESIDUAL_BWD) ------------- */

/* Rows of D % 8 == 0 (every BERT size): a block per row holds the row in
 * registers as the LayerNorm kernels above (ln_threads, ln_nu), one Philox
 * draw per 8 elements at the flat index row * D + column, as the cpu
 * reference and the unfused DROPOUT draw it.  The extra outputs come in
 * a.yk[k - 1] (0 when the graph has none). */
static HpcStatus ln_site_check(const EopGen *gen, long long D, HpcError *err)
{
    if (ln_vec_ok(D) && ln_vec_dtypes(gen)) return HPC_OK;
    return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s): the fused LayerNorm kernel needs a row size "
                    "that is a multiple of 8 (have %lld) and float values; compile with HPC_FUSE_LN=0 or run "
                    "on the cpu backend", gen->id, OUTN->name, D);
}

static HpcStatus cuda_ln_residual(EopGen *gen, HpcError *err)
{
    const IrNode *n = OUTN;
    long long D = (long long)last_dim(n);
    HpcStatus st = ln_site_check(gen, D, err);
    if (st) return st;
    IrLnFusedAttr la = fuse_ln_attr_get(n);
    IrFusedAttr fa = {la.p, (int32_t)la.salt, 0, (uint8_t)la.mid, 0, 0};
    int nu = ln_nu(D);
    char vm[64], va[64];
    round_expr((DType)la.mid, "dropout_elem(m8, j, on, xv8[j], dscale)", vm, sizeof vm);
    round_expr((DType)la.aux, "v + rv8[j]", va, sizeof va);
    StrBuf *s = ln_row_phase(gen, n->n_in == 5 ? "ln_residual_bias_fwd" : "ln_residual_fwd", n, D);
    dropout_consts(gen, s, fa);
    /* la.xhat: output 3 is xhat = (s - mean) * rstd in f16, written with y; s stays in registers */
    DType saved = la.xhat ? DT_F16 : (DType)la.aux;
    const char *aux = ir_dtype_name(saved), *low = ir_dtype_name((DType)la.low);
    strbuf_printf(s, "    float *o_mean = (float *)a.yk[0], *o_rstd = (float *)a.yk[1];\n"
                   "    %s *o_sum = (%s *)a.yk[2];\n    %s *o_low = (%s *)a.yk[3];\n"
                   "    float xv[%d][8];\n#pragma unroll\n    for (int u = 0; u < %d; u++) {\n"
                   "        const int cu = threadIdx.x + %d * u;\n"
                   "        for (int j = 0; j < 8; j++) xv[u][j] = 0.0f;\n        if (cu >= %lld) continue;\n"
                   "        const i64 e0 = row * %lldLL + cu * 8;\n        float xv8[8], rv8[8];\n"
                   "        ld8_%s(x0 + e0, xv8);\n        ld8_%s(x1 + e0, rv8);\n",
                ctype(saved), ctype(saved), ctype((DType)la.low), ctype((DType)la.low),
                nu, nu, ln_threads(D), D / 8, D, ir_dtype_name(INN(0)->dtype), ir_dtype_name(INN(1)->dtype));
    if (n->n_in == 5)
        strbuf_printf(s, "        float bv8[8];\n        ld8_%s(x4 + cu * 8, bv8);\n"
                       "        for (int j = 0; j < 8; j++) xv8[j] += bv8[j];\n", ir_dtype_name(INN(4)->dtype));
    strbuf_printf(s, "        const u32 m8 = philox_mask8(ctl->seed, (u64)e0 >> 3, ctl->step, salt, p);\n"
                   "#pragma unroll\n        for (int j = 0; j < 8; j++) {\n            const float v = %s;\n"
                   "            xv[u][j] = %s;\n        }\n",
                vm, va);
    if (!la.xhat) strbuf_printf(s, "        if (o_sum) st8_%s(o_sum + e0, xv[u]);\n", aux);
    strbuf_add(s, "    }\n");
    ln_row_stats(s, D, (double)(float)la.eps);
    strbuf_printf(s, "    if (threadIdx.x == 0) {\n        if (o_mean) o_mean[row] = mean;\n        if (o_rstd) o_rstd[row] = rstd;\n    }\n"
                   "#pragma unroll\n    for (int u = 0; u < %d; u++) {\n        const int cu = threadIdx.x + %d * u;\n"
                   "        if (cu >= %lld) break;\n        float g[8], bt[8], r[8]%s;\n"
                   "        ld8_%s(x2 + cu * 8, g);\n        ld8_%s(x3 + cu * 8, bt);\n"
                   "%s"
                   "        st8_%s(y + row * %lldLL + cu * 8, r);\n"
                   "        if (o_low) st8_%s(o_low + row * %lldLL + cu * 8, r);\n",
                nu, ln_threads(D), D / 8, la.xhat ? ", h[8]" : "", ir_dtype_name(INN(2)->dtype),
                ir_dtype_name(INN(3)->dtype),
                la.xhat ? "        for (int j = 0; j < 8; j++) {\n            h[j] = (xv[u][j] - mean) * rstd;\n"
                          "            r[j] = h[j] * g[j] + bt[j];\n        }\n"
                        : "        for (int j = 0; j < 8; j++) r[j] = (xv[u][j] - mean) * rstd * g[j] + bt[j];\n",
                ir_dtype_name(n->dtype), D, low, D);
    /* xhat's rows are XS apart: D, or D + IR_XHAT_ONES_PAD with its ones column (la.ones) */
    int xo = la.xhat ? ir_output(gen->g, gen->id, 3) : -1;
    long long XS = xo >= 0 ? (long long)last_dim(&gen->g->nodes[xo]) : D;
    if (la.xhat) strbuf_printf(s, "        if (o_sum) st8_%s(o_sum + row * %lldLL + cu * 8, h);\n", aux, XS);
    strbuf_add(s, "    }\n");
    if (la.xhat && XS > D) {
        HPC_ASSERT(XS == D + 8);
        strbuf_printf(s, "    if (o_sum && threadIdx.x == 0) {\n"
                       "        const float one[8] = {1.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};\n"
                       "        st8_%s(o_sum + row * %lldLL + %lldLL, one);\n    }\n",
                    aux, XS, D);
    }
    return HPC_OK;
}

/* ---- LN_RESIDUAL_BWD (the default, "v2") -------------------------------
 *
 * Phase 1: P blocks of G row groups; a group of ln_threads(D) threads (T)
 * owns one row at a time, thread t holding the 8-column chunks t + T u as
 * the forward does.  Group g of block b takes rows b G + g, then + P G, ...
 * (every group of a block makes the same number of passes, so the barrier
 * of the row sums is uniform); the next row's dy, s, mean and rstd are
 * loaded before the current row's sums are reduced (up to 2 chunks per
 * thread), so a warp keeps its loads in flight through the barrier.  Per
 * row: ds, dx = dropout(ds), and per-thread column sums of dy * xhat, dy
 * and the stored dx; at the end the G groups add theirs in order in shared
 * memory and the block writes one partial, 3 x D f32, to
 * sf[b * 3 D + q D + column] (q: dgamma, dbeta, dbias).
 *
 * P = min(cap, ceil(R / G)) depends on the run's rows only, so the sums
 * (hence every bit of dgamma, dbeta, dbias) are the same run to run: one
 * row per group when the rows are few (B32 L32: 256 blocks, partials
 * 2.4 MB), one wave of resident blocks when they are many (cap = 132 SMs
 * of an H100/H200 times the blocks per SM that __launch_bounds__ asks for:
 * 264 at D = 768, partials 2.4 MB).  The old design had 512 blocks of one
 * row group (4 per SM, 12 warps) and 4.7 MB of partials at every shape.
 *
 * Phase 2: one block of LNB_SUM_WARPS warps per 32 of the 3 D partial
 * columns (72 blocks at D = 768, not 24), lane = column so a warp's loads
 * are contiguous; warp w sums parts w, w + 16, ... in double, then warp 0
 * adds the warps' sums in order.
 *
 * HPC_LN_BWD (a hook for comparisons, read when the module is generated,
 * so part of the kernels' text and cache key): "v2,G,CAP[,M]" this design with G groups, at most CAP blocks and at
 * least M rows a group (P = min(CAP, ceil(R / (G M)))); "v3" and
 * "v3,G,CAP[,M[,AHEAD]]" the variant below.
 *
 * ---- LN_RESIDUAL_BWD v3 (opt-in: HPC_LN_BWD=v3) --------------------------
 *
 * Why: v2 runs at about 3.3 TB/s on the H200 (92 us a site at BERT-base
 * 256 x 128), the LayerNorm forward and GELU kernels at 4.0-4.2.  v2 has
 * one row's loads in flight while it reduces the current one (48 bytes a
 * thread: dy in f32, xhat in f16), so by Little's law an SM of 768 threads
 * has at most 36 KB in flight, and less on average: the loads issued at a
 * pass's start have arrived long before its end.
 *
 * What: the same blocks, groups, rows per group and order of every sum as
 * v2 (so the same bits of dgamma, dbeta, dbias run to run, and the same
 * dropout draws), but
 *  - AHEAD rows' loads in flight past the one reduced (2 by default),
 *    held raw as 16-byte vectors (eop_v16: 4 registers for 8 16-bit values,
 *    8 for f32 ones) in slots, and converted to f32 when their row is
 *    reduced; slot k is refilled with the row AHEAD passes on right after
 *    it is converted.  The row loop is unrolled AHEAD times so that each
 *    slot stays in the same registers: v2's copy of the next row into the
 *    current one at a pass's end would, with two rows, wait for the loads
 *    just issued and leave one row in flight.
 *  - the column sums ab (dbeta) and ac (dbias) in shared memory, thread i's
 *    8 at acc[.][i] as two float4 (4 LDS.128 and 4 STS.128 a row): the
 *    second slot of raw rows costs 12-13 registers that the column sums
 *    (24) give back.  ptxas, CUDA 13.0 for sm_90, BERT-base fp16 xhat:
 *    v3 with all three sums in registers wants 90 registers and under
 *    (384, 2)'s 80 spills 24 bytes; with ab and ac in shared memory 80, no
 *    spills (72 where dy is f16); with only ac there it spills 20 bytes.  A
 *    third block of 384 an SM (56 registers) spills 144-176 bytes (28 with
 *    one row ahead), so v3 asks for v2's 2 blocks: 768 threads, 72 KB in
 *    flight.
 *  - dx and a 16-bit y stored with one st.global.v4 a chunk: in v2's loop
 *    nvcc splits st8_f16's 16-byte store of dx into four 4-byte ones.
 * The default AHEAD is 2 where a row in flight takes at most 13 registers
 * (xhat in f16: dy f32 + xhat + rstd), else 1 (an f32 s and dy, or an f32 s
 * with a 16-bit dy and the mean: two rows of 14 spill 4-24 bytes); a
 * given AHEAD is taken as is.  Where the block's static 48 KB of shared
 * memory cannot hold acc with cs and red (at D = 768: GROUPS above 5) the
 * sums stay in registers.  v3 applies where a thread owns one chunk of a
 * row (D <= 2048); past that the module has v2's kernel.
 * Static SASS (scripts/sass-stats.sh, BERT-base fp16, the f32-dy kernel):
 * v2 355 instructions a row in its loop, v3 343 (686 for two rows). */
#define LNB_SUM_WARPS 16
#define LNB_SMS 132

typedef struct {
    int groups;       /* row groups a block */
    int per;          /* rows a block's pass needs before a second block: G x M */
    int cap;          /* blocks at most */
    int min_blocks;   /* blocks an SM that __launch_bounds__ asks for */
    bool prefetch;    /* the next row's loads in flight (one chunk a thread) */
    int ahead;        /* v3: rows whose loads are in flight past the one being reduced; 0: v2 */
    int acc_shared;   /* v3: bit q: column sum q (lnb_sums) in shared memory, not registers */
} LnBwdShape;

/* v3 holds the rows in flight as raw 16-byte vectors (eop_v16), converted
 * to f32 when their row is reduced: a chunk of 8 is 1 vector of 16-bit
 * values, 2 of f32 ones. */
static int lnb_raw_vectors(DType dt) { return dt == DT_F32 ? 2 : 1; }

static HpcStatus ln_bwd_shape(const EopGen *gen, long long D, LnBwdShape *sh, HpcError *err)
{
    int T = ln_threads(D), nu = ln_nu(D);
    /* registers a thread needs: 3 x 8 column sums and 16 of the row per
     * chunk, 16 more for the next row, about 24 besides: 80 at nu = 1
     * (ptxas: 80, no spills, at D = 768 under (384, 2)) */
    sh->prefetch = nu == 1;
    int regs = 24 + (sh->prefetch ? 56 : 40) * nu;
    sh->groups = T >= 384 ? 1 : 384 / T;
    /* v3's rows ahead unless AHEAD says: two where a row in flight takes at
     * most 13 registers a thread (4 a 16-byte vector of dy and of s or
     * xhat, rstd, the mean in the s form): xhat in f16 with an f32 or
     * 16-bit dy; else one (ptxas at (384, 2), D = 384 and 768: two rows of
     * 14 registers, an f32 s with a 16-bit dy, spill 4 to 24 bytes) */
    bool xhat = fuse_ln_attr_get(OUTN).xhat;
    int row_regs = 4 * (lnb_raw_vectors(INN(0)->dtype) + lnb_raw_vectors(INN(1)->dtype)) + (xhat ? 1 : 2);
    int g = 0, cap = 0, m = 1, ahead = row_regs <= 13 ? 2 : 1, got = 0, used = 0, version = 2;
    const char *e = getenv("HPC_LN_BWD");
    if (e && *e && strcmp(e, "v2") != 0) {
        bool plain_v3 = strcmp(e, "v3") == 0;
        if (plain_v3) version = 3;
        else got = sscanf(e, "v%d,%d,%d%n,%d%n,%d%n", &version, &g, &cap, &used, &m, &used, &ahead, &used);
        bool ok = plain_v3 || (got >= 3 && !e[used] && g >= 1 && g * T <= 1024 && cap >= 1 && m >= 1 &&
                               (version == 2 ? got <= 4 : version == 3 && ahead >= 1 && ahead <= 2));
        if (!ok)
            return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s): HPC_LN_BWD=%s is not a variant; set it "
                            "to v2, v3, v2,GROUPS,MAXBLOCKS[,ROWS] or v3,GROUPS,MAXBLOCKS[,ROWS[,AHEAD]] (GROUPS "
                            "x %d threads at most 1024, AHEAD 1 or 2), or leave it unset", gen->id, OUTN->name, e, T);
        if (got >= 3) sh->groups = g;
    }
    sh->per = sh->groups * m;
    int threads = sh->groups * T;
    /* v3 where a thread has one chunk (D <= 2048; past that v2's kernel):
     * AHEAD raw rows in flight, ab and ac in shared memory where the
     * block's static 48 KB hold them with cs and red (the v3 comment) */
    if (version == 3 && nu == 1) {
        sh->prefetch = false;
        sh->ahead = ahead;
        long long smem = 64LL * threads + 4LL * (sh->groups - 1) * D + 16LL * sh->groups * (T / 32);
        sh->acc_shared = smem <= 48 * 1024 ? 1 << 1 | 1 << 2 : 0;   /* ab, ac (lnb_sums) */
    }
    /* v2's blocks an SM for v3 too: its registers fit them (the v3 comment) */
    sh->min_blocks = 65536 / regs / threads;
    if (sh->min_blocks < 1) sh->min_blocks = 1;
    sh->cap = cap ? cap : LNB_SMS * sh->min_blocks;
    return HPC_OK;
}

/* Loads row ROW's s (x1) and dy (x0) chunks into SV, DV and its mean, rstd
 * into MN, RS; zeros past the rows and past D.  IN: the indent. */
static void lnb_load_row(StrBuf *s, const EopGen *gen, long long D, const char *in, const char *row,
                         const char *sv, const char *dv, const char *mn, const char *rs)
{
    int nu = ln_nu(D), T = ln_threads(D);
    /* xhat: x1 is xhat (f16) and x2 rstd; the mean stays 0 (unused).  x1's
     * rows are XS apart: D, or D + IR_XHAT_ONES_PAD where the site saved
     * xhat with its ones column (compiler/fuse_ln_dw.c) */
    bool xhat = fuse_ln_attr_get(OUTN).xhat;
    long long XS = (long long)last_dim(INN(1));
    const char *mn_src = xhat ? "0.0f" : "x2[", *mn_end = xhat ? "" : "]", *rs_src = xhat ? "x2[" : "x3[";
    strbuf_printf(s, "%sfloat %s[%d][8], %s[%d][8], %s = 0.0f, %s = 0.0f;\n"
                   "#pragma unroll\n%sfor (int u = 0; u < %d; u++) {\n"
                   "%s    const int cu = t + %d * u;\n"
                   "%s    if (%s < R && cu < %lld) {\n"
                   "%s        ld8_%s(x1 + %s * %lldLL + cu * 8, %s[u]);\n"
                   "%s        ld8_%s(x0 + %s * %lldLL + cu * 8, %s[u]);\n"
                   "%s    } else for (int j = 0; j < 8; j++) %s[u][j] = %s[u][j] = 0.0f;\n%s}\n"
                   "%sif (%s < R) {\n%s    %s = %s%s%s;\n%s    %s = %s%s];\n%s}\n",
                in, sv, nu, dv, nu, mn, rs, in, nu, in, T, in, row, D / 8, in, ir_dtype_name(INN(1)->dtype), row, XS,
                sv, in, ir_dtype_name(INN(0)->dtype), row, D, dv, in, sv, dv, in, in, row, in, mn, mn_src,
                xhat ? "" : row, mn_end, in, rs, rs_src, row, in);
}

/* v3's store of the 8 values ARR at PTR, after GUARD ("" or "if (o_dx) "):
 * 16-bit ones packed into one 16-byte st.global.v4 (nvcc makes st8_f16's
 * store of dx in this kernel four 4-byte stores, a warp's 16 bytes a lane
 * then written a quarter at a time: CUDA 13.0 for sm_90, v2's loop), f32
 * ones through st8_f32 (two 16-byte stores). */
static void lnb_store_text(StrBuf *s, const char *in, const char *guard, DType dt, const char *ptr, const char *arr)
{
    if (dt == DT_F32) {
        strbuf_printf(s, "%s%sst8_f32(%s, %s);\n", in, guard, ptr, arr);
        return;
    }
    const char *cvt = stf(dt);
    strbuf_printf(s, "%s%s{\n%s    u32 pk[4];\n"
                   "%s    for (int k = 0; k < 4; k++) pk[k] = (u32)%s(%s[2 * k]) | ((u32)%s(%s[2 * k + 1]) << 16);\n"
                   "%s    asm volatile(\"st.global.v4.b32 [%%0], {%%1, %%2, %%3, %%4};\" :: \"l\"(%s), \"r\"(pk[0]), "
                   "\"r\"(pk[1]), \"r\"(pk[2]), \"r\"(pk[3]));\n%s}\n",
                in, guard, in, in, cvt, arr, cvt, arr, in, ptr, in);
}

/* One row's work at the row loop's indent (8 spaces), from its chunks sv
 * (s or xhat), dv (dy), its mean and rstd: the row sums a1 and b1 (through
 * red[] and a barrier when a group has several warps), the column sums, and
 * dx = rstd (dy gamma - a1 - xhat b1) with its dropout, stored at row < R. */
static const char *const lnb_sums[3] = {"ag", "ab", "ac"};   /* dgamma, dbeta, dbias */

/* v3 with column sum q (lnb_sums) in shared memory (bit q of
 * LnBwdShape.acc_shared): copied from acc[] into a register array of its
 * name, or (OUT) back.  Thread i's 8 sums are acc[2 k][i] and acc[2 k +
 * 1][i] (k: the sum's place among the shared ones), float4s 16 bytes a lane
 * apart, so a warp's accesses have no bank conflicts. */
static void lnb_acc_text(StrBuf *s, const char *in, int shared, int q, bool out)
{
    if (!(shared & 1 << q)) return;
    int k = __builtin_popcount((unsigned)shared & ((1u << q) - 1));
    const char *arr = lnb_sums[q];
    if (out)
        strbuf_printf(s, "%sacc[%d][threadIdx.x] = make_float4(%s[0][0], %s[0][1], %s[0][2], %s[0][3]);\n"
                       "%sacc[%d][threadIdx.x] = make_float4(%s[0][4], %s[0][5], %s[0][6], %s[0][7]);\n",
                    in, 2 * k, arr, arr, arr, arr, in, 2 * k + 1, arr, arr, arr, arr);
    else
        strbuf_printf(s, "%sfloat %s[1][8];\n%s{\n%s    const float4 lo = acc[%d][threadIdx.x], hi = acc[%d][threadIdx.x];\n"
                       "%s    %s[0][0] = lo.x; %s[0][1] = lo.y; %s[0][2] = lo.z; %s[0][3] = lo.w;\n"
                       "%s    %s[0][4] = hi.x; %s[0][5] = hi.y; %s[0][6] = hi.z; %s[0][7] = hi.w;\n%s}\n",
                    in, arr, in, in, 2 * k, 2 * k + 1, in, arr, arr, arr, arr, in, arr, arr, arr, arr, in);
}

static void lnb_row_text(StrBuf *s, const EopGen *gen, long long D, const LnBwdShape *sh)
{
    const IrNode *n = OUTN;
    int acc_shared = sh->acc_shared;
    IrLnFusedAttr la = fuse_ln_attr_get(n);
    int nu = ln_nu(D), T = ln_threads(D), WG = T / 32;
    char rd[96], rx[96];
    round_expr(n->dtype, "rstd * (dv[u][j] - a1 - sv[u][j] * b1)", rd, sizeof rd);
    round_expr((DType)la.mid, "dropout_elem(m8, j, on, d, dscale)", rx, sizeof rx);
    /* sv becomes xhat in place (zeros past D stay zeros); la.xhat: it is xhat, loaded */
    strbuf_add(s, "        float a1 = 0.0f, b1 = 0.0f;\n");
    lnb_acc_text(s, "        ", acc_shared, 0, false);
    lnb_acc_text(s, "        ", acc_shared, 1, false);
    strbuf_printf(s, "#pragma unroll\n        for (int u = 0; u < %d; u++) {\n            const int cu = t + %d * u;\n"
                   "            if (cu >= %lld) continue;\n"
                   "            float gm[8];\n            ld8_%s(%s + cu * 8, gm);\n"
                   "            for (int j = 0; j < 8; j++) {\n%s"
                   "                ag[u][j] += dv[u][j] * sv[u][j];\n                ab[u][j] += dv[u][j];\n"
                   "                dv[u][j] *= gm[j];\n                a1 += dv[u][j];\n                b1 += dv[u][j] * sv[u][j];\n"
                   "            }\n        }\n",
                nu, T, D / 8, ir_dtype_name(INN(la.xhat ? 3 : 4)->dtype), la.xhat ? "x3" : "x4",
                la.xhat ? "" : "                sv[u][j] = (sv[u][j] - mean) * rstd;\n");
    lnb_acc_text(s, "        ", acc_shared, 0, true);
    lnb_acc_text(s, "        ", acc_shared, 1, true);
    strbuf_add(s, "        a1 = warp_sum(a1);\n        b1 = warp_sum(b1);\n");
    if (WG > 1)
        strbuf_printf(s, "        if (lane == 0) {\n            red[par][g][wq][0] = a1;\n            red[par][g][wq][1] = b1;\n        }\n"
                       "        __syncthreads();   // red[par] is written again two passes on, after the next barrier\n"
                       "        a1 = b1 = 0.0f;\n"
                       "        for (int w = 0; w < %d; w++) {\n            a1 += red[par][g][w][0];\n            b1 += red[par][g][w][1];\n        }\n"
                       "        par ^= 1;\n",
                    WG);
    strbuf_printf(s, "        a1 *= 1.0f / %lld;\n        b1 *= 1.0f / %lld;\n        if (row < R) {\n", D, D);
    lnb_acc_text(s, "          ", acc_shared, 2, false);
    strbuf_printf(s, "#pragma unroll\n          for (int u = 0; u < %d; u++) {\n"
                   "            const int cu = t + %d * u;\n            if (cu >= %lld) break;\n"
                   "            const i64 e0 = row * %lldLL + cu * 8;\n"
                   "            const u32 m8 = philox_mask8(ctl->seed, (u64)e0 >> 3, ctl->step, salt, p);\n"
                   "            float r[8], q[8];\n"
                   "            for (int j = 0; j < 8; j++) {\n                const float d = %s;\n"
                   "                r[j] = d;\n                q[j] = %s;\n                ac[u][j] += q[j];\n            }\n",
                nu, T, D / 8, D, rd, rx);
    if (sh->ahead) {
        lnb_store_text(s, "            ", "", n->dtype, "y + e0", "r");
        lnb_store_text(s, "            ", "if (o_dx) ", (DType)la.mid, "o_dx + e0", "q");
        strbuf_add(s, "        }\n");
    } else {
        strbuf_printf(s, "            st8_%s(y + e0, r);\n            if (o_dx) st8_%s(o_dx + e0, q);\n        }\n",
                      ir_dtype_name(n->dtype), ir_dtype_name((DType)la.mid));
    }
    lnb_acc_text(s, "          ", acc_shared, 2, true);
    strbuf_add(s, "        }\n");
}

/* Element j of the raw chunk RAW (eop_v16 RAW[lnb_raw_vectors(dt)]) in f32,
 * as ld8_<dt> converts it. */
static void lnb_raw_elem(DType dt, const char *raw, char *buf, size_t size)
{
    if (dt == DT_F32) snprintf(buf, size, "__uint_as_float(%s[j >> 2].w[j & 3])", raw);
    else snprintf(buf, size, "%s((unsigned short)(%s[0].w[j >> 1] >> (16 * (j & 1))))", ldf(dt), raw);
}

/* v3: issues row ROW's loads into slot K: its raw chunks of x1 (s or xhat)
 * in xrK and of x0 (dy) in drK, its rstd in rsK and (s form) mean in mnK;
 * zeros past the rows and past D, as lnb_load_row. */
static void lnb_v3_load(StrBuf *s, const EopGen *gen, long long D, const char *in, const char *row, int k)
{
    int nu = ln_nu(D), T = ln_threads(D);
    int w1 = lnb_raw_vectors(INN(1)->dtype), w0 = lnb_raw_vectors(INN(0)->dtype);
    bool xhat = fuse_ln_attr_get(OUTN).xhat;
    long long XS = (long long)last_dim(INN(1));   /* D, or D + IR_XHAT_ONES_PAD (lnb_load_row) */
    strbuf_printf(s, "#pragma unroll\n%sfor (int u = 0; u < %d; u++) {\n%s    const int cu = t + %d * u;\n"
                   "%s    if (%s < R && cu < %lld) {\n"
                   "%s        for (int w = 0; w < %d; w++) xr%d[u][w] = ((const eop_v16 *)(x1 + %s * %lldLL + cu * 8))[w];\n"
                   "%s        for (int w = 0; w < %d; w++) dr%d[u][w] = ((const eop_v16 *)(x0 + %s * %lldLL + cu * 8))[w];\n"
                   "%s    } else {\n"
                   "%s        for (int w = 0; w < %d; w++) xr%d[u][w] = eop_v16{};\n"
                   "%s        for (int w = 0; w < %d; w++) dr%d[u][w] = eop_v16{};\n%s    }\n%s}\n",
                in, nu, in, T, in, row, D / 8, in, w1, k, row, XS, in, w0, k, row, D, in, in, w1, k, in, w0, k, in, in);
    if (xhat) strbuf_printf(s, "%srs%d = %s < R ? x2[%s] : 0.0f;\n", in, k, row, row);
    else strbuf_printf(s, "%smn%d = %s < R ? x2[%s] : 0.0f;\n%srs%d = %s < R ? x3[%s] : 0.0f;\n", in, k, row, row, in, k,
                       row, row);
}

/* TEXT added to s with IN before each of its lines. */
static void add_indented(StrBuf *s, const char *text, const char *in)
{
    while (*text) {
        const char *nl = strchr(text, '\n');
        size_t len = nl ? (size_t)(nl - text) + 1 : strlen(text);
        if (*text != '#' && *text != '\n') strbuf_add(s, in);   /* preprocessor lines stay at column 0 */
        strbuf_addn(s, text, len);
        text += len;
    }
}

/* v3's row loop (sh->ahead slots, the loop unrolled as many times so that
 * slot k is always the same registers: a copy from slot to slot at the end
 * of a pass would wait for the loads just issued into the one copied). */
static void lnb_v3_rows(StrBuf *s, const EopGen *gen, long long D, const LnBwdShape *sh)
{
    int nu = ln_nu(D), A = sh->ahead, G = sh->groups;
    DType d1 = INN(1)->dtype, d0 = INN(0)->dtype;
    bool xhat = fuse_ln_attr_get(OUTN).xhat;
    char e1[96], e0[96], row[64], raw[16];
    HPC_ASSERT(!sh->acc_shared || nu == 1);   /* lnb_acc_text's one chunk */
    strbuf_printf(s, "    // v3: the loads of %d row%s past the one reduced in flight, as raw 16-byte vectors; %s\n", A,
                  A > 1 ? "s" : "", sh->acc_shared ? "the column sums ab and ac in shared memory" : "the column sums in registers");
    int n_shared = __builtin_popcount((unsigned)sh->acc_shared);
    if (n_shared)
        strbuf_printf(s, "    __shared__ float4 acc[%d][%d];\n"
                       "    for (int k = 0; k < %d; k++) acc[k][threadIdx.x] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);\n",
                      2 * n_shared, G * ln_threads(D), 2 * n_shared);
    for (int q = 0; q < 3; q++)
        if (!(sh->acc_shared & 1 << q))
            strbuf_printf(s, "    float %s[%d][8];\n    for (int u = 0; u < %d; u++) for (int j = 0; j < 8; j++) %s[u][j] = 0.0f;\n",
                          lnb_sums[q], nu, nu, lnb_sums[q]);
    for (int k = 0; k < A; k++) {
        strbuf_printf(s, "    eop_v16 xr%d[%d][%d], dr%d[%d][%d];\n    float rs%d", k, nu, lnb_raw_vectors(d1), k, nu,
                      lnb_raw_vectors(d0), k);
        if (!xhat) strbuf_printf(s, ", mn%d", k);
        strbuf_add(s, ";\n");
    }
    strbuf_printf(s, "    const i64 row0 = (i64)blockIdx.x * %d + g;\n", G);
    for (int k = 0; k < A; k++) {
        snprintf(row, sizeof row, k ? "(row0 + %d * stride)" : "row0", k);   /* a parenthesised operand */
        lnb_v3_load(s, gen, D, "    ", row, k);
    }
    StrBuf math = {0};
    lnb_row_text(&math, gen, D, sh);
    strbuf_printf(s, "    for (i64 base = (i64)blockIdx.x * %d; base < R; base += %d * stride) {\n", G, A);
    for (int k = 0; k < A; k++) {
        if (k) strbuf_printf(s, "        if (base + %d * stride >= R) break;\n", k);
        snprintf(row, sizeof row, k ? "base + %d * stride + g" : "base + g", k);
        strbuf_printf(s, "        {   // slot %d: its row's loads were issued %d pass%s ago; then it takes the row %d pass%s on\n"
                       "            const i64 row = %s;\n"
                       "            float sv[%d][8], dv[%d][8];\n            const float rstd = rs%d;\n",
                    k, A, A > 1 ? "es" : "", A, A > 1 ? "es" : "", row, nu, nu, k);
        if (!xhat) strbuf_printf(s, "            const float mean = mn%d;\n", k);
        snprintf(raw, sizeof raw, "xr%d[u]", k);
        lnb_raw_elem(d1, raw, e1, sizeof e1);
        snprintf(raw, sizeof raw, "dr%d[u]", k);
        lnb_raw_elem(d0, raw, e0, sizeof e0);
        strbuf_printf(s, "#pragma unroll\n            for (int u = 0; u < %d; u++)\n"
                       "                for (int j = 0; j < 8; j++) {\n                    sv[u][j] = %s;\n"
                       "                    dv[u][j] = %s;\n                }\n"
                       "            const i64 rowa = row + %d * stride;\n",
                    nu, e1, e0, A);
        lnb_v3_load(s, gen, D, "            ", "rowa", k);
        add_indented(s, math.p, "    ");
        strbuf_add(s, "        }\n");
    }
    strbuf_add(s, "    }\n");
    strbuf_free(&math);
    for (int q = 0; q < 3; q++) lnb_acc_text(s, "    ", sh->acc_shared, q, false);   /* for lnb_block_partial */
}

/* The parts expression of phase 1's grid, in the kernels' C. */
static void lnb_parts_text(StrBuf *s, const LnBwdShape *sh)
{
    strbuf_printf(s, "    const i64 P = (R + %d) / %d < %dLL ? (R + %d) / %d : %dLL;\n", sh->per - 1, sh->per,
                  sh->cap, sh->per - 1, sh->per, sh->cap);
}

/* Phase 1's end: the groups' column sums added in order, one partial per block. */
static void lnb_block_partial(StrBuf *s, long long D, const LnBwdShape *sh)
{
    int nu = ln_nu(D), T = ln_threads(D), G = sh->groups;
    static const char *const acc[3] = {"ag", "ab", "ac"};
    strbuf_printf(s, "    float *part = sf + (i64)blockIdx.x * %lldLL;\n", 3 * D);
    for (int q = 0; q < 3; q++) {
        if (G > 1)
            strbuf_printf(s, "    __syncthreads();\n"
                           "    if (g > 0) {\n#pragma unroll\n        for (int u = 0; u < %d; u++) {\n"
                           "            const int cu = t + %d * u;\n            if (cu >= %lld) break;\n"
                           "            float4 *c4 = (float4 *)&cs[g - 1][cu * 8];\n"
                           "            c4[0] = make_float4(%s[u][0], %s[u][1], %s[u][2], %s[u][3]);\n"
                           "            c4[1] = make_float4(%s[u][4], %s[u][5], %s[u][6], %s[u][7]);\n        }\n    }\n"
                           "    __syncthreads();\n",
                        nu, T, D / 8, acc[q], acc[q], acc[q], acc[q], acc[q], acc[q], acc[q], acc[q]);
        strbuf_printf(s, "    if (g == 0) {\n#pragma unroll\n        for (int u = 0; u < %d; u++) {\n"
                       "            const int cu = t + %d * u;\n            if (cu >= %lld) break;\n",
                    nu, T, D / 8);
        if (G > 1)
            strbuf_printf(s, "            for (int h = 0; h < %d; h++) {\n"
                           "                const float4 *c4 = (const float4 *)&cs[h][cu * 8];\n"
                           "                const float4 lo = c4[0], hi = c4[1];\n"
                           "                %s[u][0] += lo.x; %s[u][1] += lo.y; %s[u][2] += lo.z; %s[u][3] += lo.w;\n"
                           "                %s[u][4] += hi.x; %s[u][5] += hi.y; %s[u][6] += hi.z; %s[u][7] += hi.w;\n"
                           "            }\n",
                        G - 1, acc[q], acc[q], acc[q], acc[q], acc[q], acc[q], acc[q], acc[q]);
        strbuf_printf(s, "            st8_f32(part + %lldLL + cu * 8, %s[u]);\n        }\n    }\n", q * D, acc[q]);
    }
}

static HpcStatus lnb_sum_phase(EopGen *gen, long long D, const LnBwdShape *shp);

static HpcStatus cuda_ln_residual_bwd(EopGen *gen, HpcError *err)
{
    const IrNode *n = OUTN;
    long long D = (long long)last_dim(n);
    HpcStatus st = ln_site_check(gen, D, err);
    LnBwdShape sh = {0};
    if (!st) st = ln_bwd_shape(gen, D, &sh, err);
    if (st) return st;
    IrLnFusedAttr la = fuse_ln_attr_get(n);
    IrFusedAttr fa = {la.p, (int32_t)la.salt, 0, (uint8_t)la.mid, 0, 0};
    int nu = ln_nu(D), T = ln_threads(D), G = sh.groups, WG = T / 32;
    char rows[128], tag[32];
    rows_expr(n, rows, sizeof rows);
    snprintf(tag, sizeof tag, "h%lld", D);
    StepSize parts = sz_ceil_div(sz_rows(n), sh.per);
    parts.cap = sh.cap;
    StrBuf *s = phase(gen, "ln_residual_bwd", tag, EOP_LT_ROWS, parts, G * T);
    gen->ph[gen->n_phases - 1].min_blocks = sh.min_blocks;
    dropout_consts(gen, s, fa);
    strbuf_printf(s, "    // %d groups of %d threads, %d blocks an SM, at most %d blocks, %d rows a block's pass\n"
                   "    const i64 R = %s;\n    %s *o_dx = (%s *)a.yk[0];\n"
                   "    const int g = threadIdx.x / %d, t = threadIdx.x - g * %d;\n"
                   "    const int lane = threadIdx.x & 31, wq = t >> 5;\n    (void)lane; (void)wq;\n"
                   "    const i64 stride = (i64)gridDim.x * %d;\n",
                G, T, sh.min_blocks, sh.cap, sh.per, rows, ctype((DType)la.mid), ctype((DType)la.mid), T, T, G);
    if (WG > 1) strbuf_printf(s, "    __shared__ float red[2][%d][%d][2];\n    int par = 0;\n", G, WG);
    if (G > 1) strbuf_printf(s, "    __shared__ __align__(16) float cs[%d][%lld];\n", G - 1, D);
    if (!sh.ahead)
        strbuf_printf(s, "    float ag[%d][8], ab[%d][8], ac[%d][8];\n"
                       "    for (int u = 0; u < %d; u++) for (int j = 0; j < 8; j++) ag[u][j] = ab[u][j] = ac[u][j] = 0.0f;\n",
                    nu, nu, nu, nu);
    if (sh.ahead) {
        lnb_v3_rows(s, gen, D, &sh);
        lnb_block_partial(s, D, &sh);
        return lnb_sum_phase(gen, D, &sh);
    }
    if (sh.prefetch) {
        strbuf_printf(s, "    const i64 row0 = (i64)blockIdx.x * %d + g;\n", G);
        lnb_load_row(s, gen, D, "    ", "row0", "sv", "dv", "mean", "rstd");
    }
    strbuf_printf(s, "    for (i64 base = (i64)blockIdx.x * %d; base < R; base += stride) {\n"
                   "        const i64 row = base + g;\n", G);
    if (sh.prefetch) {
        strbuf_add(s, "        const i64 rown = row + stride;\n");
        lnb_load_row(s, gen, D, "        ", "rown", "sn", "dn", "mn", "rn");
    } else {
        lnb_load_row(s, gen, D, "        ", "row", "sv", "dv", "mean", "rstd");
    }
    lnb_row_text(s, gen, D, &sh);
    if (sh.prefetch)
        strbuf_printf(s, "#pragma unroll\n        for (int u = 0; u < %d; u++)\n"
                       "            for (int j = 0; j < 8; j++) {\n                sv[u][j] = sn[u][j];\n                dv[u][j] = dn[u][j];\n            }\n"
                       "        mean = mn;\n        rstd = rn;\n",
                    nu);
    strbuf_add(s, "    }\n");
    lnb_block_partial(s, D, &sh);
    return lnb_sum_phase(gen, D, &sh);
}

/* Phase 2: the blocks' partials added in order (double), and the scratch
 * phase 1's partials take. */
static HpcStatus lnb_sum_phase(EopGen *gen, long long D, const LnBwdShape *shp)
{
    const IrNode *n = OUTN;
    IrLnFusedAttr la = fuse_ln_attr_get(n);
    LnBwdShape sh = *shp;
    char rows[128], tag[32];
    rows_expr(n, rows, sizeof rows);
    snprintf(tag, sizeof tag, "h%lld", D);
    StrBuf *s = phase(gen, "ln_residual_bwd_sum", tag, EOP_LT_ROWS, sz_const((3 * D + 31) / 32), 32 * LNB_SUM_WARPS);
    const char *sa = stf((DType)la.aux), *ca = ctype((DType)la.aux);
    strbuf_printf(s, "    const i64 R = %s;\n", rows);
    lnb_parts_text(s, &sh);
    strbuf_printf(s, "    __shared__ double wsum[%d][32];\n"
                   "    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;\n"
                   "    const i64 f = (i64)blockIdx.x * 32 + lane;   // of the 3 x %lld partial columns\n"
                   "    double v = 0.0;\n"
                   "    if (f < %lldLL) {\n#pragma unroll 4\n"
                   "        for (i64 k = w; k < P; k += %d) v += (double)sf[k * %lldLL + f];\n    }\n"
                   "    wsum[w][lane] = v;\n    __syncthreads();\n"
                   "    if (w != 0 || f >= %lldLL) return;\n"
                   "    for (int k = 1; k < %d; k++) v += wsum[k][lane];\n"
                   "    const int q = (int)(f / %lldLL);\n    const i64 c = f - (i64)q * %lldLL;\n"
                   "    %s *o = (%s *)a.yk[1 + q];\n    if (o) o[c] = %s((float)v);\n",
                LNB_SUM_WARPS, D, 3 * D, LNB_SUM_WARPS, 3 * D, 3 * D, LNB_SUM_WARPS, D, D, ca, ca, sa);
    /* bytes: (R + per - 1) x 3 D x 4 / per bounds min(cap, ceil(R / per)) x 3 D x 4 */
    StepSize sc = sz_rows(n);
    int64_t row_bytes = 3 * (int64_t)D * 4;
    sc.c1 *= row_bytes;
    sc.c0 = (int64_t)(sh.per - 1) * row_bytes;
    sc.div = sh.per;
    sc.cap = (int64_t)sh.cap * row_bytes;
    gen->scratch = sc;
    return HPC_OK;
}

/* ---- EMBED_LN, EMBED_LN_BWD (compiler/fuse_embed.c) --------------------
 *
 * Forward: one block a row, as the LayerNorm kernels (ln_threads, ln_nu):
 * the lookups summed in registers in the fuse rule's order, the row's
 * statistics, y = dropout(LN(s)) with the unfused DROPOUT's draws (flat
 * index row * D + column), xhat in f16 and rstd for the backward, y in 16
 * bits for the first layer's GEMMs.  An id outside its table gives NaN, as
 * the unfused EMBEDDING kernel.
 *
 * Backward, three phases:
 *  1. zero the gradients that phase 2 adds into (16 bytes a thread);
 *  2. P blocks of EMB_GROUPS row groups of ln_threads(D) threads; group g of
 *     block b takes a contiguous run of rows in position-major order
 *     (rp = t B + b_row), so a position table's rows repeat within a run.
 *     Per row: d = dropout(dy), the LayerNorm backward at xhat and rstd,
 *     and ds into each table: a table of at most 2 rows (token types) sums
 *     in registers per id and leaves a per-block partial; a table whose ids
 *     come from POSITIONS / SPAN_POSITIONS sums a run of equal ids in
 *     registers and adds it once; others add every row (red8_f32).  dgamma
 *     and dbeta column sums leave per-block partials too;
 *  3. the partials added in a fixed order (double), so dgamma, dbeta and a
 *     small table's gradient are the same run to run; the scattered ones,
 *     float reductions, are not (as the unfused EMBEDDING_BWD's atomics). */
#define EMB_GROUPS 4
#define EMB_MIN_ROWS 4    /* rows a group at least, before the grid caps */
#define EMB_CAP (LNB_SMS * 2)

typedef enum { EMB_SMALL, EMB_RUN, EMB_EACH } EmbScatter;

static EmbScatter emb_scatter_kind(const IrGraph *g, int ids, int64_t rows)
{
    if (rows <= 2) return EMB_SMALL;
    IrOpKind op = g->nodes[ids].op;
    return op == IR_OP_POSITIONS || op == IR_OP_SPAN_POSITIONS ? EMB_RUN : EMB_EACH;
}

static HpcStatus emb_check(const EopGen *gen, long long D, HpcError *err)
{
    bool ok = ln_vec_ok(D);
    for (int k = 0; k < OUTN->n_in && ok; k++) ok = float_dtype(INN(k)->dtype) || INN(k)->dtype == DT_I32;
    if (ok) return HPC_OK;
    return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s): the fused embedding kernel needs a hidden size "
                    "that is a multiple of 8 (have %lld) and float tables; compile with HPC_FUSE_EMB=0 or run "
                    "on the cpu backend", gen->id, OUTN->name, D);
}

static HpcStatus cuda_embed_ln(EopGen *gen, HpcError *err)
{
    const IrNode *n = OUTN;
    long long D = (long long)last_dim(n);
    HpcStatus st = emb_check(gen, D, err);
    if (st) return st;
    const IrEmbedLnAttr *ea = &n->attr.embed_ln;
    IrFusedAttr fa = {ea->p, (int32_t)ea->salt, 0, DT_F32, 0, 0};
    int nu = ln_nu(D), T = ln_threads(D);
    StrBuf *s = ln_row_phase(gen, "embed_ln_fwd", n, D);
    dropout_consts(gen, s, fa);
    strbuf_printf(s, "    unsigned short *o_xhat = (unsigned short *)a.yk[0];\n    float *o_rstd = (float *)a.yk[1];\n"
                   "    %s *o_low = (%s *)a.yk[2];\n", ctype((DType)ea->low), ctype((DType)ea->low));
    for (int k = 2; k < n->n_in; k += 2)
        strbuf_printf(s, "    const int id%d = x%d[row];\n    const bool ok%d = id%d >= 0 && id%d < %lld;\n", k / 2 - 1,
                      k + 1, k / 2 - 1, k / 2 - 1, k / 2 - 1, (long long)INN(k)->dims[0]);
    strbuf_printf(s, "    float xv[%d][8];\n#pragma unroll\n    for (int u = 0; u < %d; u++) {\n"
                   "        const int cu = threadIdx.x + %d * u;\n"
                   "        for (int j = 0; j < 8; j++) xv[u][j] = 0.0f;\n        if (cu >= %lld) continue;\n"
                   "        float t8[8];\n",
                nu, nu, T, D / 8);
    for (int k = 2; k < n->n_in; k += 2) {
        int t = k / 2 - 1;
        strbuf_printf(s, "        if (ok%d) ld8_%s(x%d + (i64)id%d * %lldLL + cu * 8, t8);\n"
                       "        else for (int j = 0; j < 8; j++) t8[j] = EOP_NAN;\n"
                       "        for (int j = 0; j < 8; j++) xv[u][j] %s t8[j];\n",
                    t, ir_dtype_name(INN(k)->dtype), k, t, D, k == 2 ? "=" : "+=");
    }
    strbuf_add(s, "    }\n");
    ln_row_stats(s, D, (double)(float)ea->eps);
    strbuf_printf(s, "    if (threadIdx.x == 0 && o_rstd) o_rstd[row] = rstd;\n"
                   "#pragma unroll\n    for (int u = 0; u < %d; u++) {\n        const int cu = threadIdx.x + %d * u;\n"
                   "        if (cu >= %lld) break;\n        float g[8], bt[8], h[8], r[8];\n"
                   "        ld8_%s(x0 + cu * 8, g);\n        ld8_%s(x1 + cu * 8, bt);\n"
                   "        const i64 e0 = row * %lldLL + cu * 8;\n"
                   "        const u32 m8 = philox_mask8(ctl->seed, (u64)e0 >> 3, ctl->step, salt, p);\n"
                   "        for (int j = 0; j < 8; j++) {\n            h[j] = (xv[u][j] - mean) * rstd;\n"
                   "            r[j] = dropout_elem(m8, j, on, h[j] * g[j] + bt[j], dscale);\n        }\n"
                   "        st8_%s(y + e0, r);\n        if (o_low) st8_%s(o_low + e0, r);\n"
                   "        if (o_xhat) st8_f16(o_xhat + e0, h);\n    }\n",
                nu, T, D / 8, ir_dtype_name(INN(0)->dtype), ir_dtype_name(INN(1)->dtype), D,
                ir_dtype_name(n->dtype), ir_dtype_name((DType)ea->low));
    return HPC_OK;
}

/* The output pointer of table k's gradient, in the kernels' C. */
static void emb_table_out(char *buf, size_t size, int k)
{
    if (k == 0) snprintf(buf, size, "y");
    else snprintf(buf, size, "((float *)a.yk[%d])", k - 1);
}

static HpcStatus cuda_embed_ln_bwd(EopGen *gen, HpcError *err)
{
    const IrNode *n = OUTN, *dy = INN(0);
    long long D = (long long)last_dim(dy);
    HpcStatus st = emb_check(gen, D, err);
    if (st) return st;
    const IrEmbedLnBwdAttr *ea = &n->attr.embed_ln_bwd;
    IrFusedAttr fa = {ea->p, (int32_t)ea->salt, 0, DT_F32, 0, 0};
    int nu = ln_nu(D), T = ln_threads(D), G = EMB_GROUPS, WG = T / 32, tables = n->n_in - 4;
    int64_t rows[3] = {ea->rows0, ea->rows1, ea->rows2};
    EmbScatter kind[3];
    int nq = 2;   /* partial rows of D columns a block: dgamma, dbeta, then each small table's rows */
    int q0[3];
    for (int k = 0; k < tables; k++) {
        kind[k] = emb_scatter_kind(gen->g, n->in[4 + k], rows[k]);
        q0[k] = nq;
        if (kind[k] == EMB_SMALL) nq += (int)rows[k];
    }
    char rws[128], tag[32], out[40];
    rows_expr(dy, rws, sizeof rws);
    snprintf(tag, sizeof tag, "h%lld", D);

    /* 1: zero the scattered gradients (16 bytes a thread) */
    int64_t most = 0;
    for (int k = 0; k < tables; k++)
        if (kind[k] != EMB_SMALL && rows[k] * D > most) most = rows[k] * D;
    StrBuf *s = phase(gen, "embed_ln_bwd_zero", tag, EOP_LT_ELEMS, sz_const(most / 4 > 0 ? most / 4 : 1), 256);
    strbuf_add(s, "    const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);\n    EOP_FOR(i, ");
    strbuf_printf(s, "%lldLL) {\n", (long long)(most / 4));
    for (int k = 0; k < tables; k++) {
        if (kind[k] == EMB_SMALL) continue;
        emb_table_out(out, sizeof out, k);
        strbuf_printf(s, "        if (%s && i < %lldLL) ((float4 *)%s)[i] = z;\n", out, (long long)(rows[k] * D / 4), out);
    }
    strbuf_add(s, "    }\n");

    /* 2: the rows */
    StepSize parts = sz_ceil_div(sz_rows(dy), G * EMB_MIN_ROWS);
    parts.cap = EMB_CAP;
    s = phase(gen, "embed_ln_bwd", tag, EOP_LT_ROWS, parts, G * T);
    gen->ph[gen->n_phases - 1].min_blocks = 2;
    dropout_consts(gen, s, fa);
    strbuf_printf(s, "    const i64 R = %s, nb = a.B;\n"
                   "    const int g = threadIdx.x / %d, t = threadIdx.x - g * %d, lane = threadIdx.x & 31, wq = t >> 5;\n"
                   "    const i64 groups = (i64)gridDim.x * %d, per = (R + groups - 1) / groups;\n"
                   "    const i64 lo = ((i64)blockIdx.x * %d + g) * per;\n"
                   "    __shared__ float red[2][%d][%d][2];\n    int par = 0;\n"
                   "    float gm[%d][8], ag[%d][8], ab[%d][8];\n"
                   "#pragma unroll\n    for (int u = 0; u < %d; u++) {\n        const int cu = t + %d * u;\n"
                   "        for (int j = 0; j < 8; j++) gm[u][j] = ag[u][j] = ab[u][j] = 0.0f;\n"
                   "        if (cu < %lld) ld8_%s(x3 + cu * 8, gm[u]);\n    }\n",
                rws, T, T, G, G, G, WG, nu, nu, nu, nu, T, D / 8, ir_dtype_name(INN(3)->dtype));
    for (int k = 0; k < tables; k++) {
        emb_table_out(out, sizeof out, k);
        strbuf_printf(s, "    float *o%d = %s;\n", k, out);
        if (kind[k] == EMB_SMALL)
            strbuf_printf(s, "    float sm%d[%lld][%d][8];\n    for (int r = 0; r < %lld; r++) for (int u = 0; u < %d; u++) "
                           "for (int j = 0; j < 8; j++) sm%d[r][u][j] = 0.0f;\n",
                        k, (long long)rows[k], nu, (long long)rows[k], nu, k);
        if (kind[k] == EMB_RUN)
            strbuf_printf(s, "    float rn%d[%d][8];\n    int cur%d = -1;\n    for (int u = 0; u < %d; u++) "
                           "for (int j = 0; j < 8; j++) rn%d[u][j] = 0.0f;\n",
                        k, nu, k, nu, k);
    }
    strbuf_printf(s, "    for (i64 it = 0; it < per; it++) {\n        const i64 rp = lo + it;\n"
                   "        const bool valid = rp < R;\n        const i64 tt = valid ? rp / nb : 0;\n"
                   "        const i64 row = valid ? (rp - tt * nb) * a.L + tt : 0;\n"
                   "        float dv[%d][8], xh[%d][8];\n        float a1 = 0.0f, b1 = 0.0f;\n"
                   "        const float rs = valid ? x2[row] : 0.0f;\n"
                   "#pragma unroll\n        for (int u = 0; u < %d; u++) {\n            const int cu = t + %d * u;\n"
                   "            for (int j = 0; j < 8; j++) dv[u][j] = xh[u][j] = 0.0f;\n"
                   "            if (!valid || cu >= %lld) continue;\n"
                   "            const i64 e0 = row * %lldLL + cu * 8;\n"
                   "            ld8_%s(x0 + e0, dv[u]);\n            ld8_f16(x1 + e0, xh[u]);\n"
                   "            const u32 m8 = philox_mask8(ctl->seed, (u64)e0 >> 3, ctl->step, salt, p);\n"
                   "            for (int j = 0; j < 8; j++) {\n"
                   "                dv[u][j] = dropout_elem(m8, j, on, dv[u][j], dscale);\n"
                   "                ag[u][j] += dv[u][j] * xh[u][j];\n                ab[u][j] += dv[u][j];\n"
                   "                dv[u][j] *= gm[u][j];\n                a1 += dv[u][j];\n                b1 += dv[u][j] * xh[u][j];\n"
                   "            }\n        }\n        a1 = warp_sum(a1);\n        b1 = warp_sum(b1);\n",
                nu, nu, nu, T, D / 8, D, ir_dtype_name(dy->dtype));
    if (WG > 1)
        strbuf_printf(s, "        if (lane == 0) {\n            red[par][g][wq][0] = a1;\n            red[par][g][wq][1] = b1;\n        }\n"
                       "        __syncthreads();   // red[par] is written again two rows on, after the next barrier\n"
                       "        a1 = b1 = 0.0f;\n"
                       "        for (int w = 0; w < %d; w++) {\n            a1 += red[par][g][w][0];\n            b1 += red[par][g][w][1];\n        }\n"
                       "        par ^= 1;\n",
                    WG);
    else
        strbuf_add(s, "        (void)red; (void)par; (void)wq; (void)lane;\n");
    strbuf_printf(s, "        a1 *= 1.0f / %lld;\n        b1 *= 1.0f / %lld;\n"
                   "        if (!valid) continue;\n"
                   "#pragma unroll\n        for (int u = 0; u < %d; u++)\n"
                   "            for (int j = 0; j < 8; j++) dv[u][j] = rs * (dv[u][j] - a1 - xh[u][j] * b1);\n",
                D, D, nu);
    for (int k = 0; k < tables; k++) {
        strbuf_printf(s, "        {\n            const int id = x%d[row];\n", 4 + k);
        if (kind[k] == EMB_SMALL)
            strbuf_printf(s, "#pragma unroll\n            for (int r = 0; r < %lld; r++)\n"
                           "                for (int u = 0; u < %d; u++)\n"
                           "                    for (int j = 0; j < 8; j++) sm%d[r][u][j] += id == r ? dv[u][j] : 0.0f;\n",
                        (long long)rows[k], nu, k);
        else if (kind[k] == EMB_RUN)
            strbuf_printf(s, "            if (id != cur%d) {\n"
                           "                if (cur%d >= 0 && cur%d < %lld && o%d)\n"
                           "                    for (int u = 0; u < %d; u++)\n"
                           "                        if (t + %d * u < %lld) red8_f32(o%d + (i64)cur%d * %lldLL + (t + %d * u) * 8, rn%d[u]);\n"
                           "                for (int u = 0; u < %d; u++) for (int j = 0; j < 8; j++) rn%d[u][j] = 0.0f;\n"
                           "                cur%d = id;\n            }\n"
                           "            for (int u = 0; u < %d; u++) for (int j = 0; j < 8; j++) rn%d[u][j] += dv[u][j];\n",
                        k, k, k, (long long)rows[k], k, nu, T, D / 8, k, k, D, T, k, nu, k, k, nu, k);
        else
            strbuf_printf(s, "            if (id >= 0 && id < %lld && o%d)\n"
                           "                for (int u = 0; u < %d; u++)\n"
                           "                    if (t + %d * u < %lld) red8_f32(o%d + (i64)id * %lldLL + (t + %d * u) * 8, dv[u]);\n",
                        (long long)rows[k], k, nu, T, D / 8, k, D, T);
        strbuf_add(s, "        }\n");
    }
    strbuf_add(s, "    }\n");
    for (int k = 0; k < tables; k++)
        if (kind[k] == EMB_RUN)
            strbuf_printf(s, "    if (cur%d >= 0 && cur%d < %lld && o%d)\n        for (int u = 0; u < %d; u++)\n"
                           "            if (t + %d * u < %lld) red8_f32(o%d + (i64)cur%d * %lldLL + (t + %d * u) * 8, rn%d[u]);\n",
                        k, k, (long long)rows[k], k, nu, T, D / 8, k, k, D, T, k);
    /* the groups' column sums, added in order into one partial a block */
    strbuf_printf(s, "    __shared__ __align__(16) float cs[%d][%lld];\n"
                   "    float *part = sf + (i64)blockIdx.x * %lldLL;\n",
                G, D, (long long)nq * D);
    for (int q = 0; q < nq; q++) {
        char acc[48];
        if (q == 0) snprintf(acc, sizeof acc, "ag[u]");
        else if (q == 1) snprintf(acc, sizeof acc, "ab[u]");
        else
            for (int k = 0; k < tables; k++)
                if (kind[k] == EMB_SMALL && q >= q0[k] && q < q0[k] + rows[k])
                    snprintf(acc, sizeof acc, "sm%d[%d][u]", k, q - q0[k]);
        strbuf_printf(s, "    __syncthreads();\n"
                       "#pragma unroll\n    for (int u = 0; u < %d; u++) {\n        const int cu = t + %d * u;\n"
                       "        if (cu < %lld) for (int j = 0; j < 8; j++) cs[g][cu * 8 + j] = %s[j];\n    }\n"
                       "    __syncthreads();\n"
                       "    for (int c = threadIdx.x; c < %lld; c += blockDim.x) {\n        float v = 0.0f;\n"
                       "        for (int h = 0; h < %d; h++) v += cs[h][c];\n        part[%lldLL + c] = v;\n    }\n",
                    nu, T, D / 8, acc, D, G, (long long)q * D);
    }

    /* 3: the partials added in order */
    s = phase(gen, "embed_ln_bwd_sum", tag, EOP_LT_ROWS, sz_const(((int64_t)nq * D + 31) / 32), 32 * LNB_SUM_WARPS);
    strbuf_printf(s, "    const i64 R = %s;\n"
                   "    const i64 P = (R + %d) / %d < %dLL ? (R + %d) / %d : %dLL;\n"
                   "    __shared__ double wsum[%d][32];\n"
                   "    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;\n"
                   "    const i64 f = (i64)blockIdx.x * 32 + lane;\n    double v = 0.0;\n"
                   "    if (f < %lldLL) {\n#pragma unroll 4\n"
                   "        for (i64 k = w; k < P; k += %d) v += (double)sf[k * %lldLL + f];\n    }\n"
                   "    wsum[w][lane] = v;\n    __syncthreads();\n"
                   "    if (w != 0 || f >= %lldLL) return;\n"
                   "    for (int k = 1; k < %d; k++) v += wsum[k][lane];\n"
                   "    const int q = (int)(f / %lldLL);\n    const i64 c = f - (i64)q * %lldLL;\n"
                   "    float *o = 0;\n"
                   "    if (q == 0) o = (float *)a.yk[2];\n    else if (q == 1) o = (float *)a.yk[3];\n",
                rws, G * EMB_MIN_ROWS - 1, G * EMB_MIN_ROWS, EMB_CAP, G * EMB_MIN_ROWS - 1, G * EMB_MIN_ROWS, EMB_CAP,
                LNB_SUM_WARPS, (long long)nq * D, LNB_SUM_WARPS, (long long)nq * D, (long long)nq * D, LNB_SUM_WARPS,
                D, D);
    for (int k = 0; k < tables; k++)
        if (kind[k] == EMB_SMALL) {
            emb_table_out(out, sizeof out, k);
            strbuf_printf(s, "    else if (q >= %d && q < %lld && %s) o = %s + (i64)(q - %d) * %lldLL;\n", q0[k],
                          (long long)(q0[k] + rows[k]), out, out, q0[k], D);
        }
    strbuf_add(s, "    if (o) o[c] = (float)v;\n");
    /* scratch: P partials of nq x D f32, P = min(cap, ceil(R / (G x EMB_MIN_ROWS))) */
    StepSize sc = sz_rows(dy);
    int64_t row_bytes = (int64_t)nq * D * 4, per = G * EMB_MIN_ROWS;
    sc.c1 *= row_bytes;
    sc.c0 = (per - 1) * row_bytes;
    sc.div = per;
    sc.cap = (int64_t)EMB_CAP * row_bytes;
    gen->scratch = sc;
    return HPC_OK;
}

/* ---- dispatch --------------------------------------------------------- */

static HpcStatus check_dtypes(const EopGen *gen, HpcError *err)
{
    const IrNode *n = OUTN;
    if (n->n_in > EOP_MAX_INPUTS)
        return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s, %s) has %d inputs; a CUDA kernel takes at "
                        "most %d (EopArgs.x); run it on the cpu backend", gen->id, n->name, ir_op_name(n->op),
                        n->n_in, EOP_MAX_INPUTS);
    bool bad = n->dtype == DT_F64;
    for (int k = 0; k < n->n_in; k++) bad |= INN(k)->dtype == DT_F64;
    if (!bad) return HPC_OK;
    return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s, %s) reads or writes f64, which the GPU "
                    "path does not support; use the f32/f16/bf16 graph", gen->id, n->name,
                    ir_op_name(n->op));
}

/* The generators named by the `cuda` column of program/ops.def, in one
 * signature; those that cannot fail are wrapped. */
typedef HpcStatus (*EopGenFn)(EopGen *gen, HpcError *err);

static void gen_param(EopGen *gen) { (void)gen; } /* storage bound by the executor */

static void gen_input(EopGen *gen)
{
    if (OUTN->attr.input.kind == IR_IN_LOSS_SCALE) gen_loss_scale(gen);
    else gen->kind = EOP_UPLOAD;
}

static void gen_split_heads(EopGen *gen) { gen_heads(gen, true); }
static void gen_merge_heads(EopGen *gen) { gen_heads(gen, false); }

#define EOP_PLAIN(name) \
    static HpcStatus cuda_##name(EopGen *gen, HpcError *err) { (void)err; gen_##name(gen); return HPC_OK; }
EOP_PLAIN(param) EOP_PLAIN(input) EOP_PLAIN(positions) EOP_PLAIN(embedding) EOP_PLAIN(add)
EOP_PLAIN(layernorm) EOP_PLAIN(act) EOP_PLAIN(softmax) EOP_PLAIN(dropout) EOP_PLAIN(split_heads)
EOP_PLAIN(merge_heads) EOP_PLAIN(slice_first) EOP_PLAIN(slice_last) EOP_PLAIN(shift_labels)
EOP_PLAIN(cross_entropy) EOP_PLAIN(mse) EOP_PLAIN(cast) EOP_PLAIN(embedding_bwd) EOP_PLAIN(bias_grad)
EOP_PLAIN(layernorm_dx) EOP_PLAIN(layernorm_dgamma) EOP_PLAIN(act_bwd) EOP_PLAIN(softmax_bwd)
EOP_PLAIN(slice_first_bwd) EOP_PLAIN(slice_last_bwd) EOP_PLAIN(cross_entropy_bwd) EOP_PLAIN(mse_bwd)
EOP_PLAIN(softmax_dropout) EOP_PLAIN(softmax_dropout_bwd) EOP_PLAIN(dropout_add)
EOP_PLAIN(act_bwd_bgrad) EOP_PLAIN(stack) EOP_PLAIN(unstack) EOP_PLAIN(ln_dw_fix) EOP_PLAIN(ln_dw_fix_db)
#undef EOP_PLAIN
static HpcStatus cuda_gemm(EopGen *gen, HpcError *err) { return gen_gemm(gen, err); }
static HpcStatus cuda_linear_dw_bgrad(EopGen *gen, HpcError *err) { return gen_linear_dw_bgrad(gen, err); }
static HpcStatus cuda_linear_dx_acc(EopGen *gen, HpcError *err) { return gen_linear_dx_acc(gen, err); }
/* Fused attention: compiler/emit_ops_attention.c. */
static HpcStatus cuda_attention(EopGen *gen, HpcError *err) { return eopa_gen_attention(gen, err); }
static HpcStatus cuda_attention_bwd(EopGen *gen, HpcError *err) { return eopa_gen_attention_bwd(gen, err); }

/* An op the cpu backend runs but no kernel implements yet. */
static HpcStatus cuda_unsupported(EopGen *gen, HpcError *err)
{
    return hpc_fail(err, HPC_ERR_INPUT, "emit_ops: node %d (%s): op %s has no CUDA kernel yet; run the "
                    "graph on the cpu backend", gen->id, OUTN->name, ir_op_name(OUTN->op));
}

/* ---- packed batches (docs/packing.md; cpu references in
 * runtime/cpu/cpu_exec_packed.inc).  The spans are in order and apart, so
 * the sequence holding flat slot s is the last b with start_b <= s (binary
 * search), when s < start_b + len_b. */
static void span_find_text(StrBuf *s, const char *spans, const char *slot)
{
    strbuf_printf(s, "        i64 lo = 0, hi = (i64)a.B - 1, f = -1;\n"
                     "        while (lo <= hi) {\n            const i64 m = (lo + hi) / 2;\n"
                     "            if (%s[2 * m] <= %s) { f = m; lo = m + 1; } else hi = m - 1;\n        }\n"
                     "        const bool in = f >= 0 && %s < (i64)%s[2 * f] + %s[2 * f + 1];\n",
                  spans, slot, slot, spans, spans);
}

static HpcStatus cuda_span_positions(EopGen *gen, HpcError *err)
{
    (void)err;
    StrBuf *s = elems_phase(gen, "span_positions", OUTN);
    strbuf_add(s, "    EOP_FOR(i, n) {\n");
    span_find_text(s, "x0", "i");
    strbuf_printf(s, "        y[i] = (in ? (int)(i - x0[2 * f]) : 0) + %lld;\n    }\n", (long long)OUTN->attr.pos.offset);
    return HPC_OK;
}

static HpcStatus cuda_span_token(EopGen *gen, HpcError *err)
{
    (void)err;
    long long H = (long long)last_dim(OUTN);
    StrBuf *s = elems_phase(gen, OUTN->attr.span.last ? "span_last" : "span_first", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) {\n        const i64 b = i / %lldLL, c = i %% %lldLL, len = x1[2 * b + 1];\n"
                     "        const i64 t = x1[2 * b] + %s;\n"
                     "        y[i] = %s(len < 1 ? 0.0f : %s(x0[t * %lldLL + c]));\n    }\n",
                  H, H, OUTN->attr.span.last ? "len - 1" : "0", stf(OUTN->dtype), ldf(INN(0)->dtype), H);
    return HPC_OK;
}

static HpcStatus cuda_span_token_bwd(EopGen *gen, HpcError *err)
{
    (void)err;
    long long H = (long long)last_dim(OUTN);
    StrBuf *s = elems_phase(gen, OUTN->attr.span.last ? "span_last_bwd" : "span_first_bwd", OUTN);
    strbuf_printf(s, "    EOP_FOR(i, n) {\n        const i64 slot = i / %lldLL, c = i %% %lldLL;\n", H, H);
    span_find_text(s, "x1", "slot");
    strbuf_printf(s, "        const bool tok = in && slot == (i64)x1[2 * f] + %s;\n"
                     "        y[i] = %s(tok ? %s(x0[f * %lldLL + c]) : 0.0f);\n    }\n",
                  OUTN->attr.span.last ? "x1[2 * f + 1] - 1" : "0", stf(OUTN->dtype), ldf(INN(0)->dtype), H);
    return HPC_OK;
}

/* A projection is written by the multi-output node it reads. */
static HpcStatus cuda_output(EopGen *gen, HpcError *err)
{
    (void)err;
    gen->kind = EOP_NONE;
    return HPC_OK;
}

static const EopGenFn op_cuda[] = {
#define IR_OP(E, name, nmin, nmax, nout, prec, grad, cuda) cuda_##cuda,
#include "program/ops.def"
#undef IR_OP
};
_Static_assert(sizeof op_cuda / sizeof op_cuda[0] == IR_OP_COUNT, "ops.def and the CUDA table disagree");

HpcStatus eopb_node(EopGen *gen, HpcError *err)
{
    HpcStatus st = check_dtypes(gen, err);
    if (st) return st;
    HPC_ASSERT(OUTN->op >= 0 && OUTN->op < IR_OP_COUNT);
    gen->kind = EOP_NONE;
    return op_cuda[OUTN->op](gen, err);
}

void eopb_free(EopGen *gen)
{
    for (int i = 0; i < gen->n_phases; i++) strbuf_free(&gen->ph[i].body);
    gen->n_phases = 0;
}
